//! T3 replicated volumes end to end: the real controller, CSI driver and disk-agents (each
//! with its embedded SPDK, in its own network namespace) of a three-node cluster. A volume
//! with two replicas (`liteio.io/replicas: "2"`) is assembled as SPDK's raid1 in the agent
//! of one replica's node; the host (`nvmf-check --verify-writes`, SPDK's userspace
//! initiator with the PV's keys: this kernel has no `nvme_tcp`) writes a verifying pattern
//! at queue depth 8 the whole time while
//! 1. the other replica's node is cut off (its link down): the raid fails that replica and
//!    serves degraded, the controller places a replacement on the third node, the
//!    assembling agent adds it in the lost one's slot and SPDK rebuilds it; the link back,
//!    the replaced replica is deleted;
//! 2. the new replica's agent is killed (SIGKILL, not started again until replaced): the
//!    same, the replacement going to the first case's node.
//!
//! No write of the host fails, every block it wrote reads back, and once the agents are
//! stopped each replica's lvol is read directly from a copy of its node's pool (in this
//! process's own SPDK) and the replicas compared byte for byte.
//!
//! Needs root and network namespaces; elsewhere each test prints one `SKIP` line.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::Api;
use liteio_api::common::{SpdkTarget, VolumeStatus};
use liteio_api::keys;
use liteio_api::replica::{ReplicaHealth, ReplicaState};
use liteio_api::{AntstorDataControl, AntstorVolume};
use liteio_cluster_tests::*;
use liteio_local::Engine;
use liteio_local::cluster::{Cluster, ClusterOptions, Liveness, Role};
use liteio_local::datapath::{self};
use serde_json::{Value, json};

const MIB: u64 = 1 << 20;
/// The volume's size.
const SIZE: u64 = 64 * MIB;
/// The node the volume is created for (its host NQN is the one the export admits).
const HOST: usize = 2;
const NAME: &str = "pvc-rep";

/// Three nodes, every one polling (the assembling node, known only once placed, attaches
/// the remote replica with SPDK's NVMe/TCP initiator, which has no interrupt mode); pools
/// go offline 15 s after their agent's last heartbeat.
fn cluster() -> ClusterOptions {
    let mut o = ClusterOptions::new(3, Engine::Spdk);
    o.pool_bytes = 1 << 30;
    o.spdk_polling = vec![1, 2, 3];
    o.liveness = Some(Liveness {
        unknown_after: Duration::from_secs(6),
        offline_after: Duration::from_secs(15),
        tick: Duration::from_millis(500),
    });
    o.heartbeat = Some((Duration::from_secs(1), Duration::from_secs(6)));
    o
}

fn params() -> HashMap<String, String> {
    HashMap::from([("liteio.io/replicas".to_string(), "2".to_string())])
}

async fn data_control(c: &Cluster) -> Result<AntstorDataControl, String> {
    get(c, NAME).await
}

/// The replicas' states as the assembling agent reports them: (member, node, state).
fn replica_states(dc: &AntstorDataControl) -> Vec<(String, String, ReplicaState)> {
    dc.status
        .as_ref()
        .map(|s| {
            s.replicas
                .iter()
                .map(|r| (r.volume.clone(), r.node.clone(), r.state))
                .collect()
        })
        .unwrap_or_default()
}

fn health(dc: &AntstorDataControl) -> Option<ReplicaHealth> {
    dc.status.as_ref().and_then(|s| s.health)
}

/// The group's members in the raid's order: (member, node).
async fn members(c: &Cluster) -> Result<Vec<(String, String)>, String> {
    group_members(c, NAME).await
}

/// Waits until the data control is ready, healthy, with every replica online and exactly
/// `want` (member, node) as its replicas; returns it.
async fn healthy_over(
    c: &Cluster,
    want: &[(String, String)],
    secs: u64,
) -> Result<AntstorDataControl, String> {
    let mut want: Vec<(String, String, &str)> = want
        .iter()
        .map(|(v, n)| (v.clone(), n.clone(), ReplicaState::Online.as_str()))
        .collect();
    want.sort();
    eventually(
        c,
        &format!("{NAME} healthy over {want:?}"),
        secs,
        Role::Controller(0),
        || async {
            data_control(c).await.is_ok_and(|dc| {
                let mut got: Vec<(String, String, &str)> = replica_states(&dc)
                    .into_iter()
                    .map(|(v, n, s)| (v, n, s.as_str()))
                    .collect();
                got.sort();
                dc.status.as_ref().is_some_and(|s| {
                    s.status == Some(VolumeStatus::Ready) && s.spdk_target.is_some()
                }) && health(&dc) == Some(ReplicaHealth::Healthy)
                    && got == want
            })
        },
    )
    .await?;
    data_control(c).await
}

/// The host: `nvmf-check --verify-writes` in node `ns`'s namespace with [`HOST`]'s NQN
/// against `t`, once two ticks with writes are in.
async fn writer(
    c: &Cluster,
    ns: usize,
    t: &SpdkTarget,
    keys: &datapath::KeysFile,
) -> Result<Host, String> {
    let mut w = Host::verifying(c, ns, HOST, t, keys, &[])?;
    w.wait_writing(2, 120).await?;
    Ok(w)
}

/// One replica's loss while the host writes: `lose` takes node `victim` away; then the
/// volume must turn degraded, get a replacement on `spare`, and be healthy over the
/// survivor and the replacement, with writes going on and none failing. Returns the new
/// members in the raid's order.
async fn lose_and_rebuild(
    c: &mut Cluster,
    w: &Host,
    victim: usize,
    spare: usize,
    how: &str,
) -> Result<Vec<(String, String)>, String> {
    let before = members(c).await?;
    let lost = before
        .iter()
        .find(|(_, n)| *n == c.node_name(victim))
        .cloned()
        .ok_or_else(|| format!("no replica on {}: {before:?}", c.node_name(victim)))?;
    let writes0 = w.check()?;
    let tick0 = w.ticks().len();
    let t0 = Instant::now();
    match how {
        "link" => c.set_link(victim, false).await.map_err(err("link down"))?,
        _ => c.kill(Role::Agent(victim)).await.map_err(err("kill"))?,
    }
    println!(
        "{how}: replica {} on {} lost ({writes0} host writes so far)",
        lost.0, lost.1
    );
    // Degraded (or already rebuilding its replacement); the timeline says what was seen.
    let seen = Timeline::record(c).await?;
    let got = eventually(
        c,
        "the volume degraded",
        120,
        Role::Controller(0),
        || async {
            seen.saw(|h, _| matches!(h, Some(ReplicaHealth::Degraded | ReplicaHealth::Rebuilding)))
        },
    )
    .await;
    w.check()?;
    got.map_err(|e| format!("{e}; seen: {}", seen.show()))?;
    let degraded = t0.elapsed();
    // The replacement: in the lost one's slot, on the spare node.
    eventually(
        c,
        "a replacement placed",
        180,
        Role::Controller(0),
        || async {
            members(c).await.is_ok_and(|m| {
                m.len() == before.len()
                    && !m.contains(&lost)
                    && m.iter().any(|(_, n)| *n == c.node_name(spare))
            })
        },
    )
    .await?;
    let placed = t0.elapsed();
    let after = members(c).await?;
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        if (b == &lost) == (b == a) {
            return Err(format!(
                "slot {i}: {b:?} became {a:?}; only the lost replica's slot may change"
            ));
        }
    }
    let dc = healthy_over(c, &after, 300)
        .await
        .map_err(|e| format!("{e}; seen: {}", seen.show()))?;
    let rebuilt = t0.elapsed();
    println!("{how}: seen {}", seen.show());
    seen.stop();
    let writes1 = w.check()?;
    if writes1 <= writes0 {
        return Err(format!(
            "the host wrote nothing while the replica was replaced ({writes0} → {writes1})"
        ));
    }
    let cond = dc
        .status
        .as_ref()
        .and_then(|s| liteio_api::replica::condition(&s.conditions, "Degraded"))
        .map(|c| format!("{:?}", c.status));
    println!(
        "{how}: degraded after {:.1} s, replacement placed after {:.1} s, rebuilt and healthy after {:.1} s; \
         {} host writes meanwhile, none failed, longest I/O {:.0} ms; Degraded condition now {cond:?}",
        degraded.as_secs_f64(),
        placed.as_secs_f64(),
        rebuilt.as_secs_f64(),
        writes1 - writes0,
        w.longest_ms(tick0)
    );
    Ok(after)
}

/// When (seconds), the health, the replicas.
type Seen = (f64, Option<ReplicaHealth>, String);

/// The data control's health and replica states as they changed, polled every 100 ms by a
/// task: (seconds since the start, health, replicas).
struct Timeline {
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Timeline {
    async fn record(c: &Cluster) -> Result<Self, String> {
        let api: Api<AntstorDataControl> = Api::namespaced(
            c.kube().await.map_err(err("kube"))?,
            keys::DEFAULT_NAMESPACE,
        );
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let out = seen.clone();
        let t0 = Instant::now();
        let task = tokio::spawn(async move {
            loop {
                if let Ok(dc) = api.get(NAME).await {
                    let reps = replica_states(&dc)
                        .iter()
                        .map(|(v, n, s)| format!("{v}@{n}:{}", s.as_str()))
                        .collect::<Vec<_>>()
                        .join(",");
                    let h = health(&dc);
                    let mut l = out.lock().unwrap();
                    if l.last().is_none_or(|(_, lh, lr)| *lh != h || *lr != reps) {
                        l.push((t0.elapsed().as_secs_f64(), h, reps));
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Ok(Self { seen, task })
    }

    fn saw(&self, f: impl Fn(Option<ReplicaHealth>, &str) -> bool) -> bool {
        self.seen.lock().unwrap().iter().any(|(_, h, r)| f(*h, r))
    }

    fn show(&self) -> String {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(t, h, r)| format!("[{t:.1}s {} {r}]", h.map_or("-", ReplicaHealth::as_str)))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The assembling node `asm` cut off while a host on the free node writes in sequence
/// through its export: the controller fences the replicas and moves the assembly to the
/// other replica's node, whose agent assembles the mirror from its replica's superblock
/// (degraded); the lost node's replica is replaced and rebuilt. What the host sees is
/// printed: its connection is to the old node's address. The moved export serves a new
/// host session; the old node, its link back, tears its assembly down and serves nothing.
/// Returns the new assembling node.
async fn lose_the_assembling_node(
    c: &mut Cluster,
    keys: &datapath::KeysFile,
    asm: usize,
) -> Result<usize, String> {
    let before = members(c).await?;
    let holders: Vec<usize> = before
        .iter()
        .map(|(_, n)| node_index(c, n))
        .collect::<Result<_, _>>()?;
    let free = (1..=3)
        .find(|k| !holders.contains(k))
        .ok_or("no free node")?;
    let dc = data_control(c).await?;
    let old_t = dc
        .status
        .as_ref()
        .and_then(|s| s.spdk_target.clone())
        .ok_or("no export")?;
    let mut host = Host::sequential(c, free, HOST, &old_t, Some(keys), 120, 20).await?;
    let t0 = Instant::now();
    c.set_link(asm, false).await.map_err(err("link down"))?;
    println!(
        "assembling node {} cut off; a host on {} was writing through {}:{}",
        c.node_name(asm),
        c.node_name(free),
        old_t.address,
        old_t.svc_id
    );
    // The host's session, watched for 40 s: its connection is to the old address.
    let host = tokio::spawn(async move {
        let st = match host.exited_within(Duration::from_secs(40)).await {
            Ok(Some(st)) => format!("it ended ({st})"),
            _ => {
                host.kill().await;
                "its writes were still waiting (no error), then it was stopped".to_string()
            }
        };
        (host.lines(), st, t0.elapsed())
    });
    // Moved: another replica's node serves the same NQN on its own address.
    let old_name = c.node_name(asm);
    eventually(
        c,
        "the assembly moved",
        240,
        Role::Controller(0),
        || async {
            data_control(c).await.is_ok_and(|dc| {
                dc.spec.target_node_id != old_name
                    && dc.status.as_ref().is_some_and(|s| {
                        s.status == Some(VolumeStatus::Ready)
                            && s.spdk_target
                                .as_ref()
                                .is_some_and(|t| t.address != old_t.address)
                    })
            })
        },
    )
    .await?;
    let moved = t0.elapsed();
    let dc = data_control(c).await?;
    let new_asm = node_index(c, &dc.spec.target_node_id)?;
    let new_t = dc
        .status
        .as_ref()
        .and_then(|s| s.spdk_target.clone())
        .ok_or("no export")?;
    if new_t.subsys_nqn != old_t.subsys_nqn || new_t.ns_uuid != old_t.ns_uuid {
        return Err(format!(
            "the moved export is another subsystem: {old_t:?} -> {new_t:?}"
        ));
    }
    let ev = events(c, NAME, "AssemblyMoved").await?;
    if ev.is_empty() {
        return Err("no AssemblyMoved event".into());
    }
    println!(
        "assembly moved to {} ({}:{}) {:.1} s after the cut: {ev:?}",
        dc.spec.target_node_id,
        new_t.address,
        new_t.svc_id,
        moved.as_secs_f64()
    );
    let (host_lines, st, ended) = host.await.map_err(err("join"))?;
    let r = host_lines.iter().rev().find_map(|l| {
        serde_json::from_str::<Value>(l)
            .ok()
            .filter(Value::is_object)
    });
    println!(
        "the host on the old address, {:.1} s after the cut: {st}; last: {}",
        ended.as_secs_f64(),
        r.map_or_else(
            || host_lines.last().cloned().unwrap_or_default(),
            |r| r.to_string()
        )
    );
    // A new session on the moved export writes and reads back.
    let w = writer(c, free, &new_t, keys).await?;
    let r = w.finish_verified().await?;
    println!(
        "a new host session on the moved export: {} blocks verified",
        r["verified_blocks"]
    );
    // The lost node's replica replaced and rebuilt.
    let lost = before
        .iter()
        .find(|(_, n)| *n == c.node_name(asm))
        .cloned()
        .ok_or("the old node held no replica")?;
    eventually(
        c,
        "the old node's replica replaced",
        240,
        Role::Controller(0),
        || async { members(c).await.is_ok_and(|m| !m.contains(&lost)) },
    )
    .await?;
    let after = members(c).await?;
    healthy_over(c, &after, 300).await?;
    println!(
        "healthy again over {after:?} {:.1} s after the cut",
        t0.elapsed().as_secs_f64()
    );
    // The split: the old node back. Its agent tears down its assembly; it serves nothing
    // of the volume, and no replica's export has its initiator connected.
    c.set_link(asm, true).await.map_err(err("link up"))?;
    let nqn = old_t.subsys_nqn.clone();
    eventually(
        c,
        "the old node's assembly torn down",
        120,
        Role::Agent(asm),
        || async {
            let raid = rpc(c, asm, "bdev_raid_get_bdevs", json!({"category": "all"}))
                .await
                .is_ok_and(|r| {
                    !r.as_array()
                        .into_iter()
                        .flatten()
                        .any(|x| x["name"] == NAME)
                });
            let sub = rpc(c, asm, "nvmf_get_subsystems", Value::Null)
                .await
                .is_ok_and(|r| {
                    !r.as_array()
                        .into_iter()
                        .flatten()
                        .any(|x| x["nqn"] == nqn.as_str())
                });
            raid && sub
        },
    )
    .await?;
    let old_host = std::fs::read_to_string(c.node_dir(asm).join("hostnqn"))
        .map_err(err("hostnqn"))?
        .trim()
        .to_string();
    for (_, n) in &after {
        let k = node_index(c, n)?;
        let subs = rpc(c, k, "nvmf_get_subsystems", Value::Null).await?;
        for sub in subs.as_array().into_iter().flatten() {
            let Some(q) = sub["nqn"].as_str().filter(|q| !q.contains("discovery")) else {
                continue;
            };
            let ctrls = rpc(c, k, "nvmf_subsystem_get_controllers", json!({"nqn": q})).await?;
            if ctrls
                .as_array()
                .into_iter()
                .flatten()
                .any(|x| x["hostnqn"] == old_host.as_str())
            {
                return Err(format!(
                    "the old assembling node is still connected to {q} on {n}: {ctrls}"
                ));
            }
        }
    }
    println!(
        "the old node {} is back: its assembly is gone and no replica admits it",
        c.node_name(asm)
    );
    vols_gone(c, &lost.0).await?;
    Ok(new_asm)
}

/// Waits until member `name` is deleted (its node's agent released it).
async fn vols_gone(c: &Cluster, name: &str) -> Result<(), String> {
    let vols: Api<AntstorVolume> = Api::namespaced(
        c.kube().await.map_err(err("kube"))?,
        keys::DEFAULT_NAMESPACE,
    );
    eventually(
        c,
        &format!("{name} deleted"),
        180,
        Role::Controller(0),
        || async { vols.get_opt(name).await.is_ok_and(|v| v.is_none()) },
    )
    .await
}

/// The raid's slots on the assembling node `asm`: (base bdev, data offset in bytes, data
/// bytes).
async fn slots(c: &Cluster, asm: usize) -> Result<Vec<(String, u64, u64)>, String> {
    let raids = rpc(c, asm, "bdev_raid_get_bdevs", json!({"category": "all"})).await?;
    let r = raids
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["name"] == NAME)
        .ok_or_else(|| format!("no raid {NAME} on node {asm}: {raids}"))?;
    if r["raid_level"] != "raid1" || r["state"] != "online" || r["superblock"] != true {
        return Err(format!("not an online raid1 with a superblock: {r}"));
    }
    let b = rpc(c, asm, "bdev_get_bdevs", json!({"name": NAME})).await?;
    let bs = b[0]["block_size"].as_u64().ok_or("no block size")?;
    r["base_bdevs_list"]
        .as_array()
        .ok_or("no base bdevs")?
        .iter()
        .map(|s| {
            Ok((
                s["name"].as_str().unwrap_or_default().to_string(),
                s["data_offset"].as_u64().ok_or("no data_offset")? * bs,
                s["data_size"].as_u64().ok_or("no data_size")? * bs,
            ))
        })
        .collect()
}

/// Where to read a replica after the run: a copy of its node's pool, its lvol, and where
/// its data is.
#[derive(Debug, Clone)]
struct ReplicaCopy {
    member: String,
    pool: PathBuf,
    lvol: String,
    offset: u64,
    bytes: u64,
}

/// Reads each replica from its pool copy in this process's SPDK (auto-examine off: the raid
/// module must not assemble the raid from the superblocks) and compares them.
fn compare_replicas(copies: &[ReplicaCopy]) {
    let opts = liteio_agent::spdk::SpdkOptions {
        name: "t3-replicas-read".into(),
        auto_examine: false,
        ..liteio_agent::spdk::SpdkOptions::small()
    };
    let copies = copies.to_vec();
    liteio_tests::spdk::with_spdk_opts(&opts, Duration::from_secs(300), async move {
        use liteio_agent::spdk::{bdev, io, lvol};
        let mut digests = Vec::new();
        for (i, r) in copies.iter().enumerate() {
            let aio = format!("copy{i}");
            bdev::create_aio(&aio, &r.pool, 512).await.unwrap();
            bdev::examine(&aio).await.unwrap();
            bdev::wait_for_examine().await.unwrap();
            let lvs = r.lvol.split('/').next().unwrap().to_string();
            let mut chunks = Vec::new();
            let mut written = 0;
            let mut off = 0;
            while off < r.bytes {
                let len = (4 * MIB).min(r.bytes - off);
                let data = io::read_at(&r.lvol, r.offset + off, len as usize)
                    .await
                    .unwrap_or_else(|e| panic!("read {} at {}: {e}", r.lvol, r.offset + off));
                if data.iter().any(|b| *b != 0) {
                    written += 1;
                }
                chunks.push(data);
                off += len;
            }
            println!(
                "replica {} ({} in {}): {} bytes at {}, {written} of {} 4 MiB chunks hold data",
                r.member,
                r.lvol,
                r.pool.display(),
                r.bytes,
                r.offset,
                chunks.len()
            );
            assert!(written > 0, "replica {} holds no data", r.member);
            digests.push(chunks);
            lvol::unload_lvstore(&lvs).await.unwrap();
            bdev::delete_aio(&aio).await.unwrap();
        }
        let first = &digests[0];
        for (i, d) in digests.iter().enumerate().skip(1) {
            assert_eq!(first.len(), d.len());
            for (k, (a, b)) in first.iter().zip(d).enumerate() {
                assert!(
                    a == b,
                    "replicas {} and {} differ in chunk {k} (bytes {}..{})",
                    copies[0].member,
                    copies[i].member,
                    k as u64 * 4 * MIB,
                    (k as u64 + 1) * 4 * MIB
                );
            }
        }
        println!("every replica holds the same {} bytes", copies[0].bytes);
    });
}

/// A two-replica volume keeps serving the host's verified writes through the loss of a
/// replica's link and then of a replica's agent; each loss is replaced on the free node and
/// rebuilt online; afterwards the replicas are equal block for block.
#[test]
fn a_replicated_volume_rides_out_a_cut_link_and_a_killed_agent_and_rebuilds() {
    if skip("replicated volume") {
        return;
    }
    let dir = scratch("t3-replicas");
    let copies_dir =
        std::env::temp_dir().join(format!("liteio-t3-replicas-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&copies_dir);
    std::fs::create_dir_all(&copies_dir).unwrap();
    let copies: Arc<Mutex<Vec<ReplicaCopy>>> = Arc::default();
    let out = copies.clone();
    let cd = copies_dir.clone();
    with_cluster(&dir, cluster(), Duration::from_secs(1500), move |c| {
        Box::pin(async move {
            let client = c.kube().await.map_err(err("kube"))?;
            let started = Instant::now();
            create_volume_sized(
                c,
                NAME,
                Some(c.node_name(HOST)),
                params(),
                i64::try_from(SIZE).unwrap(),
            )
            .await
            .map_err(err("join"))??;
            // Healthy: both replicas online (the members are placed by then).
            eventually(
                c,
                "the volume healthy",
                240,
                Role::Controller(0),
                || async {
                    data_control(c).await.is_ok_and(|dc| {
                        health(&dc) == Some(ReplicaHealth::Healthy)
                            && replica_states(&dc).len() == 2
                    })
                },
            )
            .await?;
            let first = members(c).await?;
            let dc = healthy_over(c, &first, 60).await?;
            println!(
                "{NAME}: 2 replicas {first:?}, assembled on {}, healthy {:.1} s after CreateVolume",
                dc.spec.target_node_id,
                started.elapsed().as_secs_f64()
            );
            let t = dc
                .status
                .as_ref()
                .and_then(|s| s.spdk_target.clone())
                .ok_or("no export")?;
            let asm = node_index(c, &dc.spec.target_node_id)?;
            let mut nodes: Vec<usize> = first
                .iter()
                .map(|(_, n)| node_index(c, n))
                .collect::<Result<_, _>>()?;
            nodes.sort_unstable();
            nodes.dedup();
            if nodes.len() != 2 || !nodes.contains(&asm) {
                return Err(format!(
                    "replicas not on two nodes, one assembling: {first:?}"
                ));
            }
            let other = nodes
                .iter()
                .copied()
                .find(|&k| k != asm)
                .ok_or("no other")?;
            let spare = (1..=3).find(|k| !nodes.contains(k)).ok_or("no spare")?;
            let keys = datapath::keys_file(&client, &first[0].0, &c.node_dir(HOST))
                .await
                .map_err(err("keys"))?
                .ok_or("no Secret for the PV")?;
            // The host runs in the assembling node's namespace: never cut off here.
            let w = writer(c, asm, &t, &keys).await?;

            // 1. The other replica's node cut off.
            let second = lose_and_rebuild(c, &w, other, spare, "link").await?;
            let lost = events(c, NAME, "ReplicaLost").await?;
            if !lost.iter().any(|(ty, _)| ty == "Warning") {
                return Err(format!("no Warning event ReplicaLost: {lost:?}"));
            }
            c.set_link(other, true).await.map_err(err("link up"))?;
            let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
            let gone = first
                .iter()
                .find(|m| !second.contains(m))
                .cloned()
                .ok_or("nothing replaced")?;
            eventually(
                c,
                "the replaced replica deleted",
                180,
                Role::Agent(other),
                || async { vols.get_opt(&gone.0).await.is_ok_and(|v| v.is_none()) },
            )
            .await?;
            println!(
                "the replaced replica {} is deleted once its node is back",
                gone.0
            );

            // 2. The new replica's agent killed; the replacement goes to the first victim.
            let second_remote = node_index(
                c,
                &second
                    .iter()
                    .find(|(_, n)| *n != dc.spec.target_node_id)
                    .ok_or("no remote replica")?
                    .1,
            )?;
            let third = lose_and_rebuild(c, &w, second_remote, other, "SIGKILL").await?;
            c.launch(Role::Agent(second_remote))
                .await
                .map_err(err("restart agent"))?;
            let gone = second
                .iter()
                .find(|m| !third.contains(m))
                .cloned()
                .ok_or("nothing replaced")?;
            eventually(
                c,
                "the killed node's replica deleted",
                180,
                Role::Agent(second_remote),
                || async { vols.get_opt(&gone.0).await.is_ok_and(|v| v.is_none()) },
            )
            .await?;

            let r = w.finish_verified().await?;
            println!(
                "host: {} writes, {} blocks verified, {} errors, {} mismatches",
                r["writes"], r["verified_blocks"], r["errors"], r["mismatches"]
            );

            // 3. The assembling node cut off: the assembly moves to the other replica's node.
            let asm = lose_the_assembling_node(c, &keys, asm).await?;
            let third = members(c).await?;
            drop(keys);

            // Where each replica's data is, then every agent stopped at once (nothing torn
            // down) and the pools of the replicas' nodes copied.
            let slots = slots(c, asm).await?;
            if slots.len() != third.len() {
                return Err(format!(
                    "{} slots for {} replicas",
                    slots.len(),
                    third.len()
                ));
            }
            let mut found = Vec::new();
            for ((member, node), (_, offset, bytes)) in third.iter().zip(&slots) {
                let v = vols.get(member).await.map_err(err("member"))?;
                let l = v.spec.spdk_lvol.as_ref().ok_or("member without an lvol")?;
                found.push((
                    member.clone(),
                    node_index(c, node)?,
                    l.full_name(),
                    *offset,
                    *bytes,
                ));
            }
            for k in 1..=3 {
                c.kill(Role::Agent(k)).await.map_err(err("kill"))?;
            }
            let mut list = Vec::new();
            for (member, k, lvol, offset, bytes) in found {
                let pool = cd.join(format!("pool-{k}.img"));
                let st = tokio::process::Command::new("cp")
                    .arg("--sparse=always")
                    .arg(c.node_dir(k).join("pool/aio-lvs.img"))
                    .arg(&pool)
                    .status()
                    .await
                    .map_err(err("cp"))?;
                if !st.success() {
                    return Err(format!("copying node {k}'s pool: {st}"));
                }
                list.push(ReplicaCopy {
                    member,
                    pool,
                    lvol,
                    offset,
                    bytes,
                });
            }
            *out.lock().unwrap() = list;
            Ok(())
        })
    });
    let copies = copies.lock().unwrap().clone();
    assert_eq!(copies.len(), 2, "{copies:?}");
    compare_replicas(&copies);
    let _ = std::fs::remove_dir_all(&copies_dir);
}

/// One `nvmf-check` run of `secs` seconds of 4 KiB random writes at queue depth `qd` from
/// node `ns`'s namespace as `host`'s host NQN against `t`: (IOPS, p99 in µs).
async fn random_writes(
    c: &Cluster,
    ns: usize,
    host: usize,
    t: &SpdkTarget,
    keys: &datapath::KeysFile,
    secs: u64,
    qd: u32,
) -> Result<(f64, f64), String> {
    let io = RandomIo {
        secs,
        read_percent: 0,
        queue_depth: qd,
    };
    let out = random_io(c, ns, host, t, keys, io).await?;
    Ok((
        figure(&out.result, "random_iops")?,
        figure(&out.result, "random_p99_us")?,
    ))
}

/// Benchmark, run by hand (`cargo test -p liteio-cluster-tests --features spdk --test t3_replicas
/// -- --ignored --nocapture bench_replicas`; figures depend on the machine and on the
/// profile the test is built with). Side by side in each run, from the namespace of the node
/// that holds neither volume: 4 KiB random writes at queue depth 32 to a two-replica volume
/// and to a plain volume on the replicated volume's assembling node (IOPS and p99; the
/// worst of `LITEIO_BENCH_RUNS` (3) runs of `LITEIO_BENCH_SECONDS` (5) s). Then the
/// rebuild: the remote replica's agent killed, a QD 8 writer running from the loss until
/// the replacement is rebuilt; the rebuild rate (the replica's bytes over the time from
/// `rebuilding` to `healthy`) and the writer's p99 then, against its p99 on the healthy
/// volume. Every node polls (the assembling node is known only once placed).
#[test]
#[ignore = "benchmark: run with --ignored"]
fn bench_replicas() {
    if skip("replicas benchmark") {
        return;
    }
    let (runs, secs) = (
        bench_setting("LITEIO_BENCH_RUNS", 3),
        bench_setting("LITEIO_BENCH_SECONDS", 5),
    );
    let size: u64 = 512 * MIB;
    let mut opts = cluster();
    opts.pool_bytes = 2 << 30;
    let dir = scratch("t3-replicas-bench");
    with_cluster(&dir, opts, Duration::from_secs(3600), move |c| {
        Box::pin(async move {
            let client = c.kube().await.map_err(err("kube"))?;
            create_volume_sized(
                c,
                NAME,
                Some(c.node_name(HOST)),
                params(),
                i64::try_from(size).unwrap(),
            )
            .await
            .map_err(err("join"))??;
            eventually(
                c,
                "the volume healthy",
                240,
                Role::Controller(0),
                || async {
                    data_control(c).await.is_ok_and(|dc| {
                        health(&dc) == Some(ReplicaHealth::Healthy)
                            && replica_states(&dc).len() == 2
                    })
                },
            )
            .await?;
            let reps = members(c).await?;
            let dc = healthy_over(c, &reps, 60).await?;
            let rep_t = dc
                .status
                .as_ref()
                .and_then(|s| s.spdk_target.clone())
                .ok_or("no export")?;
            let asm = node_index(c, &dc.spec.target_node_id)?;
            let holders: Vec<usize> = reps
                .iter()
                .map(|(_, n)| node_index(c, n))
                .collect::<Result<_, _>>()?;
            let other = *holders.iter().find(|&&k| k != asm).ok_or("no other")?;
            let free = (1..=3)
                .find(|k| !holders.contains(k))
                .ok_or("no free node")?;
            let rep_keys = datapath::keys_file(&client, &reps[0].0, &c.node_dir(HOST))
                .await
                .map_err(err("keys"))?
                .ok_or("no Secret")?;
            // The plain volume on the assembling node (consumed by that node: pinned there).
            let plain_id = create_volume_sized(
                c,
                "pvc-plain",
                Some(c.node_name(asm)),
                HashMap::from([("positionAdvice".to_string(), "MustLocal".to_string())]),
                i64::try_from(size).unwrap(),
            )
            .await
            .map_err(err("join"))??;
            eventually(c, "pvc-plain ready", 180, Role::Agent(asm), || async {
                volume(c, &plain_id)
                    .await
                    .or(volume(c, "pvc-plain").await)
                    .is_some_and(|v| is_ready(&v) && v.spec.spdk_target.is_some())
            })
            .await?;
            let pv = volume(c, &plain_id)
                .await
                .or(volume(c, "pvc-plain").await)
                .ok_or("no plain volume")?;
            let plain_t = pv.spec.spdk_target.clone().ok_or("no export")?;
            let plain_name = pv.metadata.name.clone().unwrap_or_default();
            let plain_keys = datapath::keys_file(&client, &plain_name, &c.node_dir(asm))
                .await
                .map_err(err("keys"))?
                .ok_or("no Secret")?;
            println!(
                "replicated: assembled on {}, replicas on {:?}; plain on {}; host in {}'s namespace; {runs} runs × {secs} s, 4 KiB random writes, QD 32",
                c.node_name(asm),
                reps,
                c.node_name(asm),
                c.node_name(free)
            );
            let (mut worst_p, mut worst_r) = ((f64::MAX, 0.0_f64), (f64::MAX, 0.0_f64));
            for run in 1..=runs {
                let p = random_writes(c, free, asm, &plain_t, &plain_keys, secs, 32).await?;
                let r = random_writes(c, free, HOST, &rep_t, &rep_keys, secs, 32).await?;
                println!(
                    "run {run}: plain {:.0} IOPS p99 {:.0} µs; 2 replicas {:.0} IOPS p99 {:.0} µs",
                    p.0, p.1, r.0, r.1
                );
                worst_p = (worst_p.0.min(p.0), worst_p.1.max(p.1));
                worst_r = (worst_r.0.min(r.0), worst_r.1.max(r.1));
            }
            println!(
                "| 4 KiB random write, QD 32 | plain | 2 replicas | replicated / plain |\n|---|---|---|---|\n| IOPS (worst of {runs}) | {:.0} | {:.0} | {:.2} |\n| p99 µs (worst of {runs}) | {:.0} | {:.0} | {:.2} |",
                worst_p.0,
                worst_r.0,
                worst_r.0 / worst_p.0,
                worst_p.1,
                worst_r.1,
                worst_r.1 / worst_p.1
            );
            // The writer's p99 on the healthy volume at QD 8, then across a rebuild.
            let base = random_writes(c, free, HOST, &rep_t, &rep_keys, secs, 8).await?;
            let seen = Timeline::record(c).await?;
            let t0 = Instant::now();
            c.kill(Role::Agent(other)).await.map_err(err("kill"))?;
            let io = RandomIo {
                secs: 40,
                read_percent: 0,
                queue_depth: 8,
            };
            let cmd = random_io_command(c, free, HOST, &rep_t, &rep_keys, io)?;
            let spare = free;
            let wait = async {
                eventually(
                    c,
                    "a replacement rebuilt",
                    300,
                    Role::Controller(0),
                    || async {
                        members(c)
                            .await
                            .is_ok_and(|m| m.iter().any(|(_, n)| *n == c.node_name(spare)))
                            && seen.saw(|h, r| {
                                h == Some(ReplicaHealth::Healthy) && r.contains(&c.node_name(spare))
                            })
                    },
                )
                .await
                .map(|()| t0.elapsed())
            };
            let (out, waited) =
                tokio::join!(datapath::run_check(cmd, Duration::from_secs(600)), wait);
            let out = out.map_err(err("writer"))?;
            let healthy_at = waited?;
            let timeline = seen.show();
            let rebuilding_from = seen
                .seen
                .lock()
                .unwrap()
                .iter()
                .find(|(_, _, r)| r.contains("rebuilding"))
                .map(|(t, _, _)| *t)
                .ok_or_else(|| format!("no rebuild seen: {timeline}"))?;
            let healthy_t = seen
                .seen
                .lock()
                .unwrap()
                .iter()
                .rev()
                .find(|(_, h, _)| *h == Some(ReplicaHealth::Healthy))
                .map(|(t, _, _)| *t)
                .ok_or("never healthy")?;
            seen.stop();
            let w_p99 = out.result["random_p99_us"].as_f64().unwrap_or(f64::NAN);
            let w_iops = out.result["random_iops"].as_f64().unwrap_or(f64::NAN);
            let rebuild_s = (healthy_t - rebuilding_from).max(0.001);
            println!("rebuild timeline: {timeline}");
            println!(
                "| rebuild of a {} MiB replica, QD 8 writer running | |\n|---|---|\n| loss → healthy | {:.1} s |\n| rebuild (rebuilding → healthy, 100 ms polls) | {rebuild_s:.1} s |\n| rebuild rate | {:.0} MiB/s |\n| writer p99, healthy volume | {:.0} µs ({:.0} IOPS) |\n| writer p99, 40 s from the loss (degraded, rebuild, healthy) | {w_p99:.0} µs ({w_iops:.0} IOPS, exit {}) |",
                size / MIB,
                healthy_at.as_secs_f64(),
                (size / MIB) as f64 / rebuild_s,
                base.1,
                base.0,
                out.code
            );
            c.launch(Role::Agent(other)).await.map_err(err("restart"))?;
            Ok(())
        })
    });
}
