//! T3 multi-disk volumes of engine SpdkLVStore end to end: the real controller, CSI driver
//! and disk-agents (each with its embedded SPDK, in its own network namespace) of a
//! one-machine cluster. CreateVolume makes a volume larger than any one node's free space;
//! the controller places its members on several nodes; the agent of the node with the
//! largest member attaches the remote members with SPDK's NVMe/TCP initiator, opens its own
//! directly, builds a concat (linear) or raid0 bdev and exports it to the host. The host is
//! `nvmf-check --verify-writes` (SPDK's userspace initiator) in the consumer node's
//! namespace, with the PV's keys: this kernel has no `nvme_tcp`. DeleteVolume then leaves
//! nothing on any node.
//!
//! Needs root and network namespaces; elsewhere each test prints one `SKIP` line.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kube::api::ListParams;
use kube::{Api, ResourceExt};
use liteio_api::common::{SpdkTarget, VolumeStatus};
use liteio_api::keys::{self, labels};
use liteio_api::{AntstorDataControl, AntstorVolume, AntstorVolumeGroup, naming};
use liteio_cluster_tests::*;
use liteio_csi::csi::DeleteVolumeRequest;
use liteio_local::Engine;
use liteio_local::cluster::{Cluster, ClusterOptions, Role};
use liteio_local::datapath::{self};
use serde_json::{Value, json};

const MIB: u64 = 1 << 20;
/// The consumer (host) node.
const HOST: usize = 2;

/// Three nodes with 1 GiB pools. Every node polls: the node that assembles (the node of
/// the largest member, known only once placed) attaches the others with SPDK's NVMe/TCP
/// initiator, which has no interrupt mode.
fn cluster() -> ClusterOptions {
    let mut o = ClusterOptions::new(3, Engine::Spdk);
    o.pool_bytes = 1 << 30;
    o.spdk_polling = vec![1, 2, 3];
    o
}

/// StorageClass parameters of a multi-disk volume assembled in SPDK at `level`.
fn params(level: &str) -> HashMap<String, String> {
    HashMap::from([
        ("obnvmf/pv-type".to_string(), "VolumeGroup".to_string()),
        (
            "datacontrol/engine-type".to_string(),
            "SpdkLVStore".to_string(),
        ),
        ("datacontrol/raid-level".to_string(), level.to_string()),
        // Members smaller than the 1 GiB default (the pools hold 1 GiB each).
        ("volgroup/min-size".to_string(), "256Mi".to_string()),
    ])
}

/// What one node's SPDK holds that an assembly or its members could have left: raid bdevs,
/// NVMe controllers, subsystems (`nqn`, or any but discovery) and bdevs with an alias that
/// contains `needle` (the members' lvols).
async fn leftovers(c: &Cluster, k: usize, needle: &str, nqn: &str) -> Result<Vec<String>, String> {
    let mut left = Vec::new();
    let raids = rpc(c, k, "bdev_raid_get_bdevs", json!({"category": "all"})).await?;
    left.extend(
        names(&raids, "name")
            .into_iter()
            .map(|n| format!("raid {n}")),
    );
    let ctrls = rpc(c, k, "bdev_nvme_get_controllers", Value::Null).await?;
    left.extend(
        names(&ctrls, "name")
            .into_iter()
            .map(|n| format!("NVMe controller {n}")),
    );
    // Only this test's volumes were ever exported: any subsystem but discovery is left over.
    let subs = rpc(c, k, "nvmf_get_subsystems", Value::Null).await?;
    left.extend(
        names(&subs, "nqn")
            .into_iter()
            .filter(|n| n == nqn || !n.contains("discovery"))
            .map(|n| format!("subsystem {n}")),
    );
    let bdevs = rpc(c, k, "bdev_get_bdevs", Value::Null).await?;
    for b in bdevs.as_array().into_iter().flatten() {
        let aliases: Vec<&str> = b["aliases"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if aliases.iter().any(|a| a.contains(needle)) {
            left.push(format!("bdev {} ({})", b["name"], aliases.join(",")));
        }
    }
    Ok(left)
}

/// The data control of `name` once ready with its export.
async fn ready_data_control(c: &Cluster, name: &str) -> Result<AntstorDataControl, String> {
    let dcs: Api<AntstorDataControl> = Api::namespaced(
        c.kube().await.map_err(err("kube"))?,
        keys::DEFAULT_NAMESPACE,
    );
    eventually(
        c,
        &format!("multi-disk volume {name} assembled"),
        240,
        Role::Controller(0),
        || async {
            dcs.get_opt(name).await.ok().flatten().is_some_and(|d| {
                d.status.as_ref().is_some_and(|s| {
                    s.status == Some(VolumeStatus::Ready) && s.spdk_target.is_some()
                })
            })
        },
    )
    .await?;
    dcs.get(name).await.map_err(err("get data control"))
}

/// Writes for a few seconds through the host's initiator with a verifying pattern, then
/// reads every written block back; returns the result.
async fn write_and_verify(
    c: &Cluster,
    t: &SpdkTarget,
    keys: &datapath::KeysFile,
) -> Result<Value, String> {
    let mut host = Host::verifying(c, HOST, HOST, t, keys, &[])?;
    // Three seconds of writes (one tick a second).
    for _ in 0..3 {
        host.wait_for("tick ", 120).await?;
    }
    let r = host.finish_verified().await?;
    println!("host: {r}");
    Ok(r)
}

/// Write operations the lvol `lvs/name` on node `k` has served.
async fn lvol_writes(c: &Cluster, k: usize, alias: &str) -> Result<u64, String> {
    let s = rpc(c, k, "bdev_get_iostat", json!({"names": [alias]})).await?;
    s["bdevs"][0]["num_write_ops"]
        .as_u64()
        .ok_or_else(|| format!("no write count for {alias} on node {k}: {s}"))
}

/// Creates multi-disk volume `name` of `bytes` at `level` through CSI for the host node,
/// checks the assembly, writes it end to end and verifies, deletes it through CSI and checks
/// that nothing is left on any node. Returns the number of members.
async fn round_trip(c: &Cluster, name: &str, level: &str, bytes: u64) -> Result<usize, String> {
    let client = c.kube().await.map_err(err("kube"))?;
    let free0 = free_bytes(c).await?;
    if free0.iter().all(|f| *f < bytes) {
        println!("free pool bytes {free0:?}: {name} ({bytes} bytes) fits on no single node");
    } else {
        return Err(format!(
            "a node has room for all of {name} ({bytes} bytes; free {free0:?}): not a multi-disk case"
        ));
    }
    let started = Instant::now();
    let id = create_volume_sized(
        c,
        name,
        Some(c.node_name(HOST)),
        params(level),
        i64::try_from(bytes).unwrap(),
    )
    .await
    .map_err(err("join"))??;
    if !id.starts_with(naming::DATA_CONTROL_UUID_PREFIX) {
        return Err(format!("CreateVolume returned {id}, not a dc- id"));
    }
    let dc = ready_data_control(c, name).await?;
    println!(
        "{name} ({level}, {} MiB) assembled {:.1} s after CreateVolume",
        bytes / MIB,
        started.elapsed().as_secs_f64()
    );
    let t = dc
        .status
        .as_ref()
        .and_then(|s| s.spdk_target.clone())
        .ok_or("no status.spdkTarget")?;
    let asm = node_index(c, &dc.spec.target_node_id)?;
    let groups: Api<AntstorVolumeGroup> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let g = groups.get(name).await.map_err(err("get group"))?;
    let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let mut members = Vec::new();
    for m in &g.spec.volumes {
        let v = vols.get(&m.vol_id.name).await.map_err(err("get member"))?;
        println!(
            "  member {} on {} ({} MiB){}",
            m.vol_id.name,
            m.target_node_name,
            m.size as u64 / MIB,
            if v.spec.target_node_id == dc.spec.target_node_id {
                ", local to the assembly"
            } else {
                ""
            }
        );
        members.push(v);
    }
    if members.len() < 2 {
        return Err(format!("{name} has {} member(s)", members.len()));
    }
    let mut nodes: Vec<&str> = members
        .iter()
        .map(|v| v.spec.target_node_id.as_str())
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    if nodes.len() != members.len() {
        return Err(format!("members share nodes: {nodes:?}"));
    }
    // The assembly's node holds a member, read without a network hop: not exported.
    let local = members
        .iter()
        .find(|v| v.spec.target_node_id == dc.spec.target_node_id)
        .ok_or("no member on the assembling node")?;
    if local.spec.spdk_target.is_some() {
        return Err(format!(
            "the local member {} is still exported",
            local.name_any()
        ));
    }
    let addr = c.node_address(asm).map_err(err("address"))?.to_string();
    if t.address != addr {
        return Err(format!("exported on {}, not on {addr}", t.address));
    }
    // SPDK on the assembling node: the raid of the level asked for, over every member.
    let raids = rpc(c, asm, "bdev_raid_get_bdevs", json!({"category": "all"})).await?;
    let raid = raids
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["name"] == name)
        .ok_or_else(|| format!("no raid bdev {name} on {}: {raids}", dc.spec.target_node_id))?;
    let want = if level == "linear" { "concat" } else { "raid0" };
    if raid["raid_level"] != want
        || raid["strip_size_kb"] != 64
        || raid["num_base_bdevs"] != members.len()
        || raid["state"] != "online"
    {
        return Err(format!(
            "raid bdev {name} is not a {want} of the members: {raid}"
        ));
    }
    let size = rpc(c, asm, "bdev_get_bdevs", json!({"name": name})).await?;
    let raid_bytes =
        size[0]["num_blocks"].as_u64().unwrap_or(0) * size[0]["block_size"].as_u64().unwrap_or(0);
    if raid_bytes < bytes {
        return Err(format!(
            "the raid holds {raid_bytes} bytes, less than {bytes}"
        ));
    }
    // The host writes through its initiator, with the PV's keys, and reads back.
    let keys = datapath::keys_file(&client, &members[0].name_any(), &c.node_dir(HOST))
        .await
        .map_err(err("keys"))?
        .ok_or("no Secret for the PV")?;
    let r = write_and_verify(c, &t, &keys).await?;
    if r["size_bytes"].as_u64().unwrap_or(0) < bytes {
        return Err(format!(
            "the host sees {} bytes, less than {bytes}",
            r["size_bytes"]
        ));
    }
    // Every member got some of the data (on its own node's lvol).
    for v in &members {
        let k = node_index(c, &v.spec.target_node_id)?;
        let l = v.spec.spdk_lvol.as_ref().ok_or("member without an lvol")?;
        let n = lvol_writes(c, k, &l.full_name()).await?;
        println!(
            "  member {} on {}: {n} writes",
            v.name_any(),
            v.spec.target_node_id
        );
        if n == 0 {
            return Err(format!("member {} got no writes", v.name_any()));
        }
    }
    drop(keys);
    // DeleteVolume: nothing left anywhere.
    let mut csi = liteio_csi::client::connect(&c.csi_controller_endpoint())
        .await
        .map_err(err("csi"))?;
    csi.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        })
        .await
        .map_err(|s| format!("DeleteVolume: {}", s.message()))?;
    let dcs: Api<AntstorDataControl> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let lp = ListParams::default().labels(&format!("{}={name}", labels::VOL_GROUP_NAME));
    eventually(
        c,
        &format!("{name}'s objects gone"),
        180,
        Role::Controller(0),
        || async {
            dcs.get_opt(name).await.is_ok_and(|d| d.is_none())
                && groups.get_opt(name).await.is_ok_and(|g| g.is_none())
                && vols.list(&lp).await.is_ok_and(|l| l.items.is_empty())
        },
    )
    .await?;
    eventually(
        c,
        "every pool's free space back",
        120,
        Role::Agent(asm),
        || async { free_bytes(c).await.is_ok_and(|f| f == free0) },
    )
    .await?;
    for k in 1..=c.opts.nodes {
        let left = leftovers(c, k, name, &t.subsys_nqn).await?;
        if !left.is_empty() {
            return Err(format!("left on {}: {left:?}", c.node_name(k)));
        }
    }
    println!("{name} deleted: nothing left on any node, free pool bytes back to {free0:?}");
    Ok(members.len())
}

/// A linear and then a raid0 multi-disk volume, each larger than any node's free space:
/// assembled on the node of the largest member, written end to end by the host through the
/// assembled export with verification, and gone without a trace after DeleteVolume.
#[test]
fn a_multi_disk_volume_is_assembled_in_spdk_written_end_to_end_and_leaves_nothing() {
    if skip("SpdkLVStore multi-disk volume") {
        return;
    }
    let dir = scratch("t3-multidisk");
    with_cluster(&dir, cluster(), Duration::from_secs(900), |c| {
        Box::pin(async move {
            let n = round_trip(c, "pvc-linear", "linear", 1536 * MIB).await?;
            println!("linear: {n} members");
            let n = round_trip(c, "pvc-raid0", "raid0", 2304 * MIB).await?;
            if n != 3 {
                return Err(format!(
                    "raid0 of 2.25 GiB over 1 GiB pools has {n} members, not 3"
                ));
            }
            Ok(())
        })
    });
}

/// The host writes numbered blocks one after another through the assembled export
/// (reconnecting for up to 90 s), while the agent of node `k` is killed (SIGKILL) and
/// started again; returns the tool's result once every block is verified.
async fn writes_across_a_kill(
    c: &mut Cluster,
    t: &SpdkTarget,
    keys: &datapath::KeysFile,
    k: usize,
) -> Result<Value, String> {
    // Under way once 64 blocks are written (with 64 KiB strips: on every member).
    let host = Host::sequential(c, HOST, HOST, t, Some(keys), 30, 90).await?;
    c.kill(Role::Agent(k)).await.map_err(err("kill"))?;
    c.launch(Role::Agent(k)).await.map_err(err("restart"))?;
    let r = host.end(Duration::from_secs(300)).await?;
    if !r.status.success() || r.result["blocks_after_stall"].as_u64().unwrap_or(0) == 0 {
        return Err(format!(
            "the host's writes did not ride out the kill of {}'s agent ({}): {}",
            c.node_name(k),
            r.status,
            r.result
        ));
    }
    Ok(r.result)
}

/// A raid0 multi-disk volume under the host's writes: a remote member's agent is killed
/// (the assembling node's initiator reconnects to its export when it is back, the raid's I/O
/// to it waits meanwhile), then the assembling agent itself (it assembles again from the
/// objects, with the same NQN, port and namespace, and the host reconnects). Every block the
/// host wrote reads back, and DeleteVolume still leaves nothing.
#[test]
fn an_assembly_rides_out_the_kill_of_a_member_node_and_of_its_own_agent() {
    if skip("SpdkLVStore assembly across agent kills") {
        return;
    }
    let dir = scratch("t3-multidisk-kill");
    with_cluster(&dir, cluster(), Duration::from_secs(900), |c| {
        Box::pin(async move {
            let client = c.kube().await.map_err(err("kube"))?;
            let free0 = free_bytes(c).await?;
            let id = create_volume_sized(
                c,
                "pvc-kill",
                Some(c.node_name(HOST)),
                params("raid0"),
                2304 << 20,
            )
            .await
            .map_err(err("join"))??;
            let dc = ready_data_control(c, "pvc-kill").await?;
            let before = dc.status.and_then(|s| s.spdk_target).ok_or("no export")?;
            let asm = node_index(c, &dc.spec.target_node_id)?;
            let remote = (1..=c.opts.nodes)
                .find(|&k| k != asm)
                .ok_or("no other node")?;
            let groups: Api<AntstorVolumeGroup> =
                Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
            let g = groups.get("pvc-kill").await.map_err(err("group"))?;
            let keys =
                datapath::keys_file(&client, &g.spec.volumes[0].vol_id.name, &c.node_dir(HOST))
                    .await
                    .map_err(err("keys"))?
                    .ok_or("no Secret")?;
            for (who, k) in [
                ("a remote member's node", remote),
                ("the assembling node", asm),
            ] {
                let r = writes_across_a_kill(c, &before, &keys, k).await?;
                println!(
                    "agent of {who} ({}) killed and restarted: the host's writes stalled {} ms, {} blocks after, all {} verified",
                    c.node_name(k),
                    r["longest_stall_ms"],
                    r["blocks_after_stall"],
                    r["written_blocks"]
                );
                let now = ready_data_control(c, "pvc-kill")
                    .await?
                    .status
                    .and_then(|s| s.spdk_target)
                    .ok_or("no export after the restart")?;
                if (&now.subsys_nqn, &now.svc_id, &now.ns_uuid, &now.address)
                    != (
                        &before.subsys_nqn,
                        &before.svc_id,
                        &before.ns_uuid,
                        &before.address,
                    )
                {
                    return Err(format!("the export changed: {before:?} -> {now:?}"));
                }
            }
            drop(keys);
            let mut csi = liteio_csi::client::connect(&c.csi_controller_endpoint())
                .await
                .map_err(err("csi"))?;
            csi.controller
                .delete_volume(DeleteVolumeRequest {
                    volume_id: id,
                    ..Default::default()
                })
                .await
                .map_err(|s| format!("DeleteVolume: {}", s.message()))?;
            eventually(
                c,
                "every pool's free space back",
                180,
                Role::Agent(asm),
                || async { free_bytes(c).await.is_ok_and(|f| f == free0) },
            )
            .await?;
            for k in 1..=c.opts.nodes {
                let left = leftovers(c, k, "pvc-kill", &before.subsys_nqn).await?;
                if !left.is_empty() {
                    return Err(format!("left on {}: {left:?}", c.node_name(k)));
                }
            }
            Ok(())
        })
    });
}

/// One `nvmf-check` run of `secs` seconds of 4 KiB random I/O at queue depth 32 from the host
/// node against `t`, with `read_percent` % reads; its IOPS.
async fn random_iops(
    c: &Cluster,
    t: &SpdkTarget,
    keys: &datapath::KeysFile,
    secs: u64,
    read_percent: u8,
) -> Result<f64, String> {
    let io = RandomIo {
        secs,
        read_percent,
        queue_depth: 32,
    };
    figure(
        &random_io(c, HOST, HOST, t, keys, io).await?.result,
        "random_iops",
    )
}

/// Benchmark, run by hand (`cargo test -p liteio-cluster-tests --features spdk --test t3_multidisk
/// -- --ignored --nocapture bench_multi_disk`; figures depend on the machine and on the
/// profile the test is built with): 4 KiB random read and write IOPS, queue depth 32, from
/// the host node's SPDK initiator, of a raid0 multi-disk volume over three nodes (assembled
/// on node 1, members on nodes 1, 2 and 3) against a plain volume on node 1, side by side in
/// each run; prints each run and the worst of `LITEIO_BENCH_RUNS` (3) runs. Only node 1
/// polls (its initiator needs it): on a small machine every polling reactor takes a core
/// from the others, and the plain volume's path (host, node 1) then has the same pollers as
/// the multi-disk one's (host, node 1; nodes 2 and 3 serve their members in interrupt
/// mode). Both are measured over the same 256 MiB at the start of the volume.
#[test]
#[ignore = "benchmark: run with --ignored"]
fn bench_multi_disk() {
    if skip("multi-disk benchmark") {
        return;
    }
    let (runs, secs) = (
        bench_setting("LITEIO_BENCH_RUNS", 3),
        bench_setting("LITEIO_BENCH_SECONDS", 5),
    );
    let mut opts = ClusterOptions::new(3, Engine::Spdk);
    // Three members of 864 MiB each (two would not fit), and room for the plain volume.
    opts.pool_bytes = 1280 << 20;
    opts.spdk_polling = vec![1];
    let dir = scratch("t3-multidisk-bench");
    with_cluster(&dir, opts, Duration::from_secs(3600), |c| {
        Box::pin(async move {
            let client = c.kube().await.map_err(err("kube"))?;
            // The raid0 volume through CSI.
            create_volume_sized(
                c,
                "pvc-striped",
                Some(c.node_name(HOST)),
                params("raid0"),
                2592 << 20,
            )
            .await
            .map_err(err("join"))??;
            let dc = ready_data_control(c, "pvc-striped").await?;
            if dc.spec.target_node_id != c.node_name(1) {
                return Err(format!(
                    "pvc-striped is assembled on {}, not on node-1 (the only polling node)",
                    dc.spec.target_node_id
                ));
            }
            let groups: Api<AntstorVolumeGroup> =
                Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
            let g = groups.get("pvc-striped").await.map_err(err("group"))?;
            if g.spec.volumes.len() != 3 {
                return Err(format!(
                    "pvc-striped has {} members, not 3",
                    g.spec.volumes.len()
                ));
            }
            let striped = dc.status.and_then(|s| s.spdk_target).ok_or("no export")?;
            let striped_keys =
                datapath::keys_file(&client, &g.spec.volumes[0].vol_id.name, &c.node_dir(HOST))
                    .await
                    .map_err(err("keys"))?
                    .ok_or("no Secret")?;
            // The plain volume on node 1, consumed by the host node, made as an object with
            // its node preset (CSI would choose the node).
            let uuid = format!("6c0ffee0-0c4f-4a2b-9e8d-{:012x}", std::process::id());
            let mut v = AntstorVolume::new(
                "pvc-plain",
                liteio_api::AntstorVolumeSpec {
                    uuid: uuid.clone(),
                    type_: Some(liteio_api::common::VolumeType::SpdkLVol),
                    size_byte: 256 << 20,
                    position_advice: liteio_api::common::VolumePosition::MustRemote,
                    target_node_id: c.node_name(1),
                    host_node: Some(liteio_api::common::NodeInfo {
                        id: c.node_name(HOST),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            );
            v.metadata.namespace = Some(keys::DEFAULT_NAMESPACE.into());
            v.metadata.labels = Some(std::collections::BTreeMap::from([
                (labels::VOL_UUID.to_string(), uuid),
                (labels::PV_NAME.to_string(), "pvc-plain".to_string()),
            ]));
            let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
            vols.create(&Default::default(), &v)
                .await
                .map_err(err("create the plain volume"))?;
            eventually(c, "pvc-plain ready", 180, Role::Agent(1), || async {
                volume(c, "pvc-plain")
                    .await
                    .is_some_and(|v| is_ready(&v) && v.spec.spdk_target.is_some())
            })
            .await?;
            let plain = volume(c, "pvc-plain")
                .await
                .and_then(|v| v.spec.spdk_target)
                .ok_or("no export")?;
            let plain_keys = datapath::keys_file(&client, "pvc-plain", &c.node_dir(HOST))
                .await
                .map_err(err("keys"))?
                .ok_or("no Secret")?;
            // [plain write, plain read, striped write, striped read] per run.
            let mut figures: Vec<[f64; 4]> = Vec::new();
            for i in 0..runs {
                let f = [
                    random_iops(c, &plain, &plain_keys, secs, 0).await?,
                    random_iops(c, &plain, &plain_keys, secs, 100).await?,
                    random_iops(c, &striped, &striped_keys, secs, 0).await?,
                    random_iops(c, &striped, &striped_keys, secs, 100).await?,
                ];
                println!(
                    "run {i}: plain write {:.0} read {:.0} IOPS; raid0 over 3 nodes write {:.0} read {:.0} IOPS",
                    f[0], f[1], f[2], f[3]
                );
                figures.push(f);
            }
            let worst = |j: usize| figures.iter().map(|f| f[j]).fold(f64::INFINITY, f64::min);
            println!(
                "worst of {runs} runs ({secs} s each, 4 KiB random, queue depth 32, host on node-{HOST}):"
            );
            println!(
                "| 4 KiB random | plain volume (node-1) | raid0, 3 nodes (assembled on node-1) | raid0 / plain |"
            );
            println!("|---|---|---|---|");
            for (name, p, s) in [("write IOPS", 0, 2), ("read IOPS", 1, 3)] {
                println!(
                    "| {name} | {:.0} | {:.0} | {:.2} |",
                    worst(p),
                    worst(s),
                    worst(s) / worst(p).max(1.0)
                );
            }
            Ok(())
        })
    });
}
