//! The multi-node scenarios (docs/failures.md), each on a given engine: T1 runs them on the
//! file engine (`tests/cluster/tests/t1_cluster.rs`), T3 on SPDK (`tests/cluster/tests/t3_cluster.rs`).

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use liteio_api::pool::PoolStatus;
use liteio_api::{StoragePool, keys};
use liteio_local::Engine;
use liteio_local::cluster::{Cluster, ClusterOptions, Election, Liveness, Place, Role};
use liteio_local::netns;

use super::*;

/// `--nodes 3` brings up three nodes, each in its own namespace with its own address, agent
/// (pool + heartbeat), CSI node plugin and host NQN; a volume pinned to each node is ready
/// on that node.
pub fn three_nodes_each_with_its_own_namespace_pool_and_nqn(engine: Engine) {
    if skip("three nodes") {
        return;
    }
    let dir = scratch("three");
    with_cluster(
        &dir,
        ClusterOptions::new(3, engine),
        Duration::from_secs(240),
        |c| {
            Box::pin(async move {
                let client = c.kube().await.map_err(err("client"))?;
                let pools: Api<StoragePool> = Api::namespaced(client, keys::DEFAULT_NAMESPACE);
                let mut nqns = Vec::new();
                for k in 1..=3 {
                    let name = c.node_name(k);
                    let p = pools.get(&name).await.map_err(err("pool"))?;
                    let ip = c.node_address(k).map_err(err("address"))?.to_string();
                    if p.spec.node_info.ip != ip {
                        return Err(format!(
                            "pool {name} has ip {:?}, not {ip}",
                            p.spec.node_info.ip
                        ));
                    }
                    let nqn = std::fs::read_to_string(c.node_dir(k).join("hostnqn"))
                        .map_err(err("hostnqn"))?;
                    nqns.push(nqn.trim().to_string());
                    // Each agent really runs inside its own namespace: its metrics answer on the
                    // node's address only.
                    let addr = c.agent_metrics_addr(k).map_err(err("addr"))?.to_string();
                    if liteio_local::cluster::http_get(&addr, "/metrics")
                        .await
                        .is_none()
                    {
                        return Err(format!("{name}'s agent metrics do not answer on {addr}"));
                    }
                }
                nqns.sort();
                nqns.dedup();
                if nqns.len() != 3 {
                    return Err(format!("host NQNs are not distinct: {nqns:?}"));
                }
                let creates: Vec<_> = (1..=3)
                    .map(|k| create_volume(c, &format!("pvc-n{k}"), Some(c.node_name(k))))
                    .collect();
                for (i, h) in creates.into_iter().enumerate() {
                    h.await.map_err(err("join"))??;
                    let k = i + 1;
                    let name = format!("pvc-n{k}");
                    let node = c.node_name(k);
                    eventually(
                        c,
                        &format!("{name} ready on {node}"),
                        60,
                        Role::Agent(k),
                        || async {
                            volume(c, &name).await.is_some_and(|v| {
                                is_ready(&v) && v.target_node() == Some(node.as_str())
                            })
                        },
                    )
                    .await?;
                }
                Ok(())
            })
        },
    );
}

fn liveness_fast() -> Liveness {
    Liveness {
        unknown_after: Duration::from_secs(3),
        offline_after: Duration::from_secs(6),
        tick: Duration::from_millis(500),
    }
}

/// Node 1's link is cut for longer than its Lease: its pool goes offline, its volume gets a
/// PoolNotReady event and is kept, a new volume goes elsewhere and one pinned to node 1
/// waits; the link restored, the pool is ready, the old volume is as it was and the waiting
/// one is placed on node 1.
pub fn a_cut_node_goes_offline_keeps_its_volumes_and_comes_back(engine: Engine) {
    if skip("cut node") {
        return;
    }
    let dir = scratch("cut");
    let mut opts = ClusterOptions::new(2, engine);
    opts.liveness = Some(liveness_fast());
    opts.heartbeat = Some((Duration::from_secs(1), Duration::from_secs(3)));
    with_cluster(&dir, opts, Duration::from_secs(240), |c| {
        Box::pin(async move {
            let a = c.node_name(1);
            create_volume(c, "pvc-on-a", Some(a.clone()))
                .await
                .map_err(err("join"))??;
            eventually(c, "pvc-on-a ready", 60, Role::Agent(1), || async {
                volume(c, "pvc-on-a").await.is_some_and(|v| is_ready(&v))
            })
            .await?;
            let before = volume(c, "pvc-on-a").await.ok_or("pvc-on-a is gone")?;

            c.set_link(1, false).await.map_err(err("link down"))?;
            eventually(
                c,
                "node-1's pool offline",
                60,
                Role::Controller(0),
                || async { pool_status(c, &a).await == Some(PoolStatus::Offline) },
            )
            .await?;
            // The agent itself keeps running, cut off.
            if !c.is_running(Role::Agent(1)) {
                return Err("node-1's agent exited while cut off".into());
            }
            // Its volume is told, and kept.
            let client = c.kube().await.map_err(err("client"))?;
            let events: Api<Event> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
            eventually(
                c,
                "a PoolNotReady event on pvc-on-a",
                30,
                Role::Controller(0),
                || async {
                    events.list(&Default::default()).await.is_ok_and(|l| {
                        l.items.iter().any(|e| {
                            e.reason.as_deref() == Some("PoolNotReady")
                                && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                                    == Some("pvc-on-a")
                        })
                    })
                },
            )
            .await?;
            // New volumes avoid it: one free to go anywhere lands on node 2, one pinned to
            // node 1 waits with the reason in its status.
            let free = create_volume(c, "pvc-free", None);
            let pinned = create_volume(c, "pvc-pinned", Some(a.clone()));
            free.await.map_err(err("join"))??;
            let v = volume(c, "pvc-free").await.ok_or("pvc-free is missing")?;
            if v.target_node() != Some(c.node_name(2).as_str()) {
                return Err(format!(
                    "pvc-free went to {:?}, not node-2",
                    v.target_node()
                ));
            }
            eventually(
                c,
                "pvc-pinned unplaced with a reason",
                30,
                Role::Controller(0),
                || async {
                    volume(c, "pvc-pinned").await.is_some_and(|v| {
                        v.target_node().is_none()
                            && v.status.as_ref().is_some_and(|s| !s.message.is_empty())
                    })
                },
            )
            .await?;
            let now = volume(c, "pvc-on-a").await.ok_or("pvc-on-a was deleted")?;
            if now.metadata.deletion_timestamp.is_some() || now.spec != before.spec {
                return Err(format!(
                    "pvc-on-a changed while node-1 was offline: {:?}",
                    now.spec
                ));
            }

            c.set_link(1, true).await.map_err(err("link up"))?;
            eventually(
                c,
                "node-1's pool ready again",
                60,
                Role::Agent(1),
                || async { pool_status(c, &a).await == Some(PoolStatus::Ready) },
            )
            .await?;
            eventually(
                c,
                "pvc-pinned placed on node-1",
                60,
                Role::Controller(0),
                || async {
                    volume(c, "pvc-pinned")
                        .await
                        .is_some_and(|v| v.target_node() == Some(a.as_str()) && is_ready(&v))
                },
            )
            .await?;
            pinned.abort();
            let after = volume(c, "pvc-on-a").await.ok_or("pvc-on-a is gone")?;
            if after.spec != before.spec || !is_ready(&after) {
                return Err(format!("pvc-on-a is not as before: {:?}", after));
            }
            Ok(())
        })
    });
}

/// A controller's JSON log: (time, message) of each line.
fn log_messages(path: &Path) -> Vec<(Timestamp, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            let t: Timestamp = v.get("timestamp")?.as_str()?.parse().ok()?;
            let m = v.get("fields")?.get("message")?.as_str()?.to_string();
            Some((t, m))
        })
        .collect()
}

/// Leadership terms of a controller from its log: [became leader, stopped) intervals (an
/// open term ends at `end`).
fn terms(path: &Path, end: Timestamp) -> Vec<(Timestamp, Timestamp)> {
    let mut out = Vec::new();
    let mut open = None;
    for (t, m) in log_messages(path) {
        if m == "became leader" {
            open = Some(t);
        } else if (m.starts_with("stopped reconciling") || m == "controller stopped")
            && let Some(s) = open.take()
        {
            out.push((s, t));
        }
    }
    if let Some(s) = open {
        out.push((s, end));
    }
    out
}

/// The leading controller's node is cut off: it stops reconciling, the controller on
/// another node takes over and schedules a new volume; their terms never overlap.
pub fn a_controller_on_a_lost_node_is_replaced_by_one_on_another_node(engine: Engine) {
    if skip("controller node lost") {
        return;
    }
    let dir = scratch("leader");
    let mut opts = ClusterOptions::new(3, engine);
    opts.controllers = vec![Place::Node(1), Place::Node(2)];
    opts.election = Some(Election {
        lease: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry: Duration::from_millis(500),
    });
    with_cluster(&dir, opts, Duration::from_secs(240), |c| {
        Box::pin(async move {
            let client = c.kube().await.map_err(err("client"))?;
            let leases: Api<Lease> = Api::namespaced(client, keys::DEFAULT_NAMESPACE);
            let holder = || async {
                leases
                    .get_opt("node-disk-controller")
                    .await
                    .ok()
                    .flatten()
                    .and_then(|l| l.spec?.holder_identity)
            };
            eventually(c, "a leader", 30, Role::Controller(0), || async {
                holder().await.is_some()
            })
            .await?;
            let first = holder().await.unwrap_or_default();
            let (lost, lost_node, other) = if first == "controller-0" {
                (Role::Controller(0), 1, Role::Controller(1))
            } else {
                (Role::Controller(1), 2, Role::Controller(0))
            };
            let successor = if first == "controller-0" {
                "controller-1"
            } else {
                "controller-0"
            };
            c.set_link(lost_node, false)
                .await
                .map_err(err("link down"))?;
            eventually(c, "the other controller leading", 60, other, || async {
                holder().await.as_deref() == Some(successor)
            })
            .await?;
            // The new leader reconciles: a new volume is scheduled (to the third node, the
            // only one still reachable besides the new leader's own).
            create_volume(c, "pvc-after-failover", None)
                .await
                .map_err(err("join"))??;
            let v = volume(c, "pvc-after-failover")
                .await
                .ok_or("volume missing")?;
            if v.target_node().is_none() {
                return Err("pvc-after-failover was not scheduled".into());
            }
            let scheduled_by_new = log_messages(&c.log(other))
                .iter()
                .any(|(_, m)| m == "volume scheduled");
            if !scheduled_by_new {
                return Err("the new leader's log shows no scheduling".into());
            }
            // The cut-off one stepped down on its own (it cannot hear from anyone).
            eventually(
                c,
                "the cut-off controller stepping down",
                30,
                lost,
                || async {
                    log_messages(&c.log(lost))
                        .iter()
                        .any(|(_, m)| m.starts_with("stopped reconciling"))
                },
            )
            .await?;
            c.set_link(lost_node, true).await.map_err(err("link up"))?;
            // Never two at once: every term of one ends before any later term of the other.
            let now = Timestamp::now();
            let a = terms(&c.log(Role::Controller(0)), now);
            let b = terms(&c.log(Role::Controller(1)), now);
            for x in &a {
                for y in &b {
                    if x.0 < y.1 && y.0 < x.1 {
                        return Err(format!("leadership terms overlap: {x:?} and {y:?}"));
                    }
                }
            }
            if a.is_empty() || b.is_empty() {
                return Err(format!("expected a term for each controller: {a:?} {b:?}"));
            }
            Ok(())
        })
    });
}

/// How long a node is cut off from the API server (LITEIO_T1_OUTAGE_SECS, default 10 s;
/// docs/failures.md describes 30 s).
fn outage() -> Duration {
    Duration::from_secs(
        std::env::var("LITEIO_T1_OUTAGE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10),
    )
}

/// Retry delays of the agent's failed Lease renewals, from its JSON log.
fn heartbeat_retries(path: &Path) -> Vec<u64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            let f = v.get("fields")?;
            (f.get("message")?.as_str()? == "Lease renewal failed; re-fetching and retrying")
                .then(|| f.get("retry_in_ms")?.as_u64())?
        })
        .collect()
}

/// The API server is unreachable from node 1 for a while (shorter than the pool's
/// `unknownAfter`): the agent keeps running, retries its heartbeat with growing delays, and
/// afterwards renews its Lease and provisions the volume scheduled to it meanwhile.
pub fn an_agent_cut_from_the_api_server_retries_and_catches_up(engine: Engine) {
    if skip("api server unreachable") {
        return;
    }
    let dir = scratch("apicut");
    let mut opts = ClusterOptions::new(2, engine);
    opts.heartbeat = Some((Duration::from_secs(1), Duration::from_secs(3)));
    let cut = outage();
    with_cluster(&dir, opts, Duration::from_secs(240) + cut, move |c| {
        Box::pin(async move {
            let a = c.node_name(1);
            let client = c.kube().await.map_err(err("client"))?;
            let leases: Api<Lease> = Api::namespaced(client, keys::DEFAULT_NAMESPACE);
            c.set_link(1, false).await.map_err(err("link down"))?;
            let cut_at = Timestamp::now();
            // Scheduled to node 1 while its agent cannot hear about it (the pool is still
            // ready: the outage is shorter than unknownAfter).
            create_volume(c, "pvc-during-outage", Some(a.clone()))
                .await
                .map_err(err("join"))??;
            let log = c.log(Role::Agent(1));
            let deadline = tokio::time::Instant::now() + cut;
            while tokio::time::Instant::now() < deadline {
                if !c.is_running(Role::Agent(1)) {
                    return Err("node-1's agent exited during the outage".into());
                }
                if volume(c, "pvc-during-outage")
                    .await
                    .is_some_and(|v| is_ready(&v))
                {
                    return Err("the volume became ready while its agent was cut off".into());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let retries = heartbeat_retries(&log);
            c.set_link(1, true).await.map_err(err("link up"))?;
            if retries.len() < 2 {
                return Err(format!(
                    "expected at least 2 failed renewals, saw {retries:?}"
                ));
            }
            if retries.windows(2).any(|w| w[1] < w[0]) || retries.last() <= retries.first() {
                return Err(format!("the retry delays do not back off: {retries:?}"));
            }
            eventually(
                c,
                "node-1's Lease renewed after the outage",
                60,
                Role::Agent(1),
                || async {
                    liteio_local::cluster::lease_renewed(&leases, &a)
                        .await
                        .is_some_and(|t| {
                            t > cut_at
                                + k8s_openapi::jiff::SignedDuration::from_secs(cut.as_secs() as i64)
                        })
                },
            )
            .await?;
            eventually(
                c,
                "pvc-during-outage ready after the outage",
                120,
                Role::Agent(1),
                || async {
                    volume(c, "pvc-during-outage")
                        .await
                        .is_some_and(|v| is_ready(&v))
                },
            )
            .await?;
            Ok(())
        })
    });
}

/// A harness killed mid-run leaves namespaces, links and processes; cleanup from the record
/// in the run directory removes them all.
pub fn cleanup_after_a_killed_run_removes_everything(engine: Engine) {
    if skip("crash cleanup") {
        return;
    }
    let dir = scratch("crash");
    let rt = runtime();
    let record = rt.block_on(async {
        let c = Cluster::start(&dir, &bin_dir(), ClusterOptions::new(2, engine))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "the cluster did not start: {e}\n{}",
                    liteio_local::cluster::log_tails(&dir, 25)
                )
            });
        let record = c.record().clone();
        // As if the harness were SIGKILLed: nothing is stopped.
        c.abandon();
        record
    });
    drop(rt);
    let before = netns::leftovers(&record);
    assert!(
        before.iter().filter(|l| l.starts_with("namespace")).count() == 2
            && before.iter().any(|l| l.contains("Agent"))
            && before.iter().any(|l| l.contains("ApiServer")),
        "the abandoned run should still be there: {before:?}"
    );
    let undone = netns::cleanup(&dir);
    let left = netns::leftovers(&record);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        left.is_empty(),
        "left behind: {left:?} (cleanup did {undone:?})"
    );
    assert!(!dir.join(netns::STATE_FILE).exists());
}
