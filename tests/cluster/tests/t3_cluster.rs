//! T3 multi-node: storage nodes in network namespaces, each agent with its embedded SPDK
//! (an lvstore on an aio file), and volumes consumed across the namespace boundary with
//! SPDK's userspace NVMe/TCP initiator (`nvmf-check`, run inside the consumer's namespace;
//! this kernel has no `nvme_tcp`). Needs root and network namespaces; elsewhere each test
//! prints one `SKIP` line.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use liteio_api::common::SpdkTarget;
use liteio_cluster_tests::*;
use liteio_local::Engine;
use liteio_local::cluster::{Cluster, ClusterOptions, Role};
use liteio_local::datapath::{self, HostNqn};

/// Runs `nvmf-check` in node `k`'s network namespace against `t`, as `hostnqn` (a file
/// path or an NQN), to its end; returns its exit status and its JSON result.
async fn run_check(
    c: &Cluster,
    k: usize,
    t: &SpdkTarget,
    hostnqn: &str,
    keys: Option<&datapath::KeysFile>,
    extra: &[&str],
) -> Result<(i32, serde_json::Value), String> {
    let nqn = if Path::new(hostnqn).is_absolute() {
        HostNqn::File(Path::new(hostnqn))
    } else {
        HostNqn::Nqn(hostnqn)
    };
    let out = datapath::run_check(
        nvmf_check(c, k, t, nqn, keys, extra)?,
        Duration::from_secs(120),
    )
    .await
    .map_err(err("nvmf-check"))?;
    println!(
        "nvmf-check in {} as {hostnqn} {} keys (exit {}):\n{}\n{}",
        c.node_name(k),
        if keys.is_some() { "with" } else { "without" },
        out.code,
        out.lines.join("\n"),
        out.result
    );
    Ok((out.code, out.result))
}

/// Node `k`'s host NQN file, as [`run_check`]'s `hostnqn`.
fn hostnqn_arg(c: &Cluster, k: usize) -> String {
    hostnqn_file(c, k).display().to_string()
}

/// Creates `name` for consumer node `consumer` with positionAdvice MustRemote and waits
/// until it is ready; returns the storage node's index and the export.
async fn remote_volume(
    c: &Cluster,
    name: &str,
    consumer: usize,
) -> Result<(usize, SpdkTarget), String> {
    let params = HashMap::from([("positionAdvice".to_string(), "MustRemote".to_string())]);
    create_volume_with(c, name, Some(c.node_name(consumer)), params)
        .await
        .map_err(err("join"))??;
    eventually(c, &format!("{name} ready"), 120, Role::Agent(1), || async {
        volume(c, name).await.is_some_and(|v| is_ready(&v))
    })
    .await?;
    let v = volume(c, name).await.ok_or("volume gone")?;
    let on = v.target_node().ok_or("no target node")?.to_string();
    let k = (1..=c.opts.nodes)
        .find(|&k| c.node_name(k) == on)
        .ok_or_else(|| format!("{name} is on {on}, not a node of this run"))?;
    if k == consumer {
        return Err(format!("{name} is on its consumer {on}: not remote"));
    }
    let t = v.spec.spdk_target.clone().ok_or("no spdkTarget")?;
    let addr = c.node_address(k).map_err(err("address"))?.to_string();
    if t.address != addr {
        return Err(format!(
            "{name} is exported on {}, not on its node's address {addr}",
            t.address
        ));
    }
    Ok((k, t))
}

fn spdk_cluster(nodes: usize) -> ClusterOptions {
    let mut o = ClusterOptions::new(nodes, Engine::Spdk);
    o.pool_bytes = 2 << 30;
    o
}

/// A volume on node A for consumer B is exported on A's address for B's host NQN only: B
/// reaches it from its own namespace (data written and read back, 4 KiB random I/O); C,
/// with its own NQN, is refused, and so is B's namespace presenting C's NQN.
#[test]
fn a_remote_volume_is_served_across_the_boundary_only_to_its_consumer() {
    if skip("remote volume") {
        return;
    }
    let dir = scratch("t3-remote");
    with_cluster(&dir, spdk_cluster(3), Duration::from_secs(420), |c| {
        Box::pin(async move {
            let (a, t) = remote_volume(c, "pvc-remote", 2).await?;
            let other = (1..=3).find(|&k| k != a && k != 2).ok_or("no third node")?;
            println!(
                "pvc-remote is on {} at {}:{}, consumed by {}; {} is the outsider",
                c.node_name(a),
                t.address,
                t.svc_id,
                c.node_name(2),
                c.node_name(other)
            );
            // The keys kubelet hands the consumer's CSI node (the volume's Secret).
            let client = c.kube().await.map_err(err("kube"))?;
            let keys = datapath::keys_file(&client, "pvc-remote", &c.node_dir(2))
                .await
                .map_err(err("keys"))?
                .ok_or("the agent made no Secret for pvc-remote (nvmf.auth is on by default)")?;
            let (code, r) = run_check(
                c,
                2,
                &t,
                &hostnqn_arg(c, 2),
                Some(&keys),
                &["--check-bytes", "1048576", "--random-seconds", "2"],
            )
            .await?;
            if code != 0
                || r["checked_bytes"] != 1_048_576
                || r["random_ios"].as_u64().unwrap_or(0) == 0
            {
                return Err(format!("the consumer's check failed ({code}): {r}"));
            }
            // The consumer's own NQN without the keys: refused (the NQN alone is not enough).
            let (code, r) = run_check(c, 2, &t, &hostnqn_arg(c, 2), None, &[]).await?;
            if code != 3 {
                return Err(format!(
                    "the consumer without keys was not refused ({code}): {r}"
                ));
            }
            // The outsider, even holding the volume's keys, is not on the allow-list.
            let (code, r) =
                run_check(c, other, &t, &hostnqn_arg(c, other), Some(&keys), &[]).await?;
            if code != 3 {
                return Err(format!("the outsider was not refused ({code}): {r}"));
            }
            let outsider_nqn =
                std::fs::read_to_string(hostnqn_file(c, other)).map_err(err("nqn"))?;
            let (code, r) = run_check(c, 2, &t, outsider_nqn.trim(), Some(&keys), &[]).await?;
            if code != 3 {
                return Err(format!(
                    "the consumer's namespace with the outsider's NQN was not refused ({code}): {r}"
                ));
            }
            Ok(())
        })
    });
}

/// The agent on the storage node is stopped (SIGTERM), then SIGKILLed, then stopped and
/// started cut off from the API server, while the consumer writes: the consumer's writes
/// stall, resume once the agent is back (the export returns with the same NQN, port and
/// namespace; the third time from the node's own record alone), and every block written
/// before and after reads back.
#[test]
fn a_consumer_rides_out_an_agent_stop_and_kill_on_the_storage_node() {
    if skip("agent kill under I/O") {
        return;
    }
    let dir = scratch("t3-kill");
    with_cluster(&dir, spdk_cluster(2), Duration::from_secs(420), |c| {
        Box::pin(async move {
            let (a, before) = remote_volume(c, "pvc-kill", 2).await?;
            let client = c.kube().await.map_err(err("kube"))?;
            let keys = datapath::keys_file(&client, "pvc-kill", &c.node_dir(2))
                .await
                .map_err(err("keys"))?
                .ok_or("the agent made no Secret for pvc-kill")?;
            // A planned restart (SIGTERM, as a DaemonSet rollout stops the pod), a crash
            // (SIGKILL) and a planned restart while the API server is out of the agent's
            // reach, each under writes.
            let own_kubeconfig = c.node_dir(a).join("kubeconfig");
            for (kill, cut_off) in [(false, false), (true, false), (false, true)] {
                let how = if kill { "SIGKILL" } else { "SIGTERM" };
                let whence = if cut_off {
                    " without the API server"
                } else {
                    ""
                };
                // The restarted agent must export with the same keys (read back from the Secret),
                // or the consumer's reconnect is refused.
                // Writes are under way once the tool reports 64 of them.
                let host = Host::sequential(c, 2, 2, &before, Some(&keys), 30, 90).await?;
                if kill {
                    c.kill(Role::Agent(a)).await.map_err(err("kill"))?;
                } else {
                    c.stop(Role::Agent(a)).await.map_err(err("stop"))?;
                }
                let launched = if cut_off {
                    // The agent's own kubeconfig names an API server that is not there (in
                    // its namespace nothing listens on port 1); the node's link stays up.
                    let mut kc = kube::config::Kubeconfig::read_from(c.kubeconfig())
                        .map_err(err("kubeconfig"))?;
                    for named in &mut kc.clusters {
                        if let Some(cl) = named.cluster.as_mut() {
                            cl.server = Some("https://127.0.0.1:1".into());
                        }
                    }
                    let text = serde_yaml::to_string(&kc).map_err(err("kubeconfig"))?;
                    std::fs::write(&own_kubeconfig, text).map_err(err("kubeconfig"))?;
                    c.launch_unwaited(Role::Agent(a)).map_err(err("restart"))?
                } else {
                    c.launch(Role::Agent(a)).await.map_err(err("restart"))?;
                    k8s_openapi::jiff::Timestamp::now()
                };
                if cut_off {
                    // The writes went on while the agent had not once reached the API
                    // server: its Lease was last renewed by the agent before the restart.
                    let client = c.kube().await.map_err(err("kube"))?;
                    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
                        kube::Api::namespaced(client, liteio_api::keys::DEFAULT_NAMESPACE);
                    let renewed = leases
                        .get(&c.node_name(a))
                        .await
                        .map_err(err("lease"))?
                        .spec
                        .and_then(|s| s.renew_time)
                        .map(|t| t.0);
                    if renewed.is_none_or(|t| t >= launched) {
                        return Err(format!(
                            "the cut-off agent renewed its Lease ({renewed:?}, started {launched})"
                        ));
                    }
                }
                let HostResult {
                    status, result: r, ..
                } = host.end(Duration::from_secs(300)).await?;
                println!("the consumer: {r}");
                if !status.success() {
                    return Err(format!(
                        "the consumer's writes failed across {how}{whence} ({status}): {r}"
                    ));
                }
                let stall = r["longest_stall_ms"].as_u64().unwrap_or(0);
                let after = r["blocks_after_stall"].as_u64().unwrap_or(0);
                let median_us = r["median_write_us"].as_u64().ok_or("no median_write_us")?;
                // The restart, not the usual pace (each write of the tool opens a queue pair
                // and authenticates it), must be what stalled the writes.
                if stall < 500 || stall * 1000 < 20 * median_us || after == 0 {
                    return Err(format!(
                        "expected a stall during the restart, far above a write's usual {median_us} us, and writes after it: {r}"
                    ));
                }
                let v = volume(c, "pvc-kill").await.ok_or("volume gone")?;
                let now = v
                    .spec
                    .spdk_target
                    .ok_or("no spdkTarget after the restart")?;
                if (
                    now.subsys_nqn.as_str(),
                    now.svc_id.as_str(),
                    now.ns_uuid.as_str(),
                ) != (
                    before.subsys_nqn.as_str(),
                    before.svc_id.as_str(),
                    before.ns_uuid.as_str(),
                ) {
                    return Err(format!("the export changed: {before:?} → {now:?}"));
                }
                println!(
                    "agent on {} stopped with {how} and restarted{whence}: writes stalled {stall} ms (a write takes {median_us} us), {after} blocks written after, all {} verified",
                    c.node_name(a),
                    r["written_blocks"]
                );
                if cut_off {
                    // Back in reach: registers and reconciles the export it served.
                    std::fs::remove_file(&own_kubeconfig).map_err(err("kubeconfig"))?;
                    c.stop(Role::Agent(a)).await.map_err(err("stop"))?;
                    c.launch(Role::Agent(a)).await.map_err(err("restart"))?;
                }
            }
            Ok(())
        })
    });
}

// The failure scenarios of docs/failures.md, on SPDK agents (T1 runs them on the file engine).

#[test]
fn three_nodes_each_with_its_own_namespace_pool_and_nqn_on_spdk() {
    liteio_cluster_tests::scenarios::three_nodes_each_with_its_own_namespace_pool_and_nqn(
        Engine::Spdk,
    );
}

#[test]
fn a_cut_node_goes_offline_keeps_its_volumes_and_comes_back_on_spdk() {
    liteio_cluster_tests::scenarios::a_cut_node_goes_offline_keeps_its_volumes_and_comes_back(
        Engine::Spdk,
    );
}

#[test]
fn a_controller_on_a_lost_node_is_replaced_by_one_on_another_node_on_spdk() {
    liteio_cluster_tests::scenarios::a_controller_on_a_lost_node_is_replaced_by_one_on_another_node(
        Engine::Spdk,
    );
}

#[test]
fn an_agent_cut_from_the_api_server_retries_and_catches_up_on_spdk() {
    liteio_cluster_tests::scenarios::an_agent_cut_from_the_api_server_retries_and_catches_up(
        Engine::Spdk,
    );
}
