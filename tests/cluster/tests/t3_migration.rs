//! T3 hot migration end to end: the real controller, disk-agents (each with its embedded
//! SPDK, in its own network namespace) and CSI drivers of a one-machine cluster move a
//! volume to another node while a consumer writes to it, through a VolumeMigration made by
//! `kubectl liteio migrate`.
//!
//! The consumer is `nvmf-check --verify-writes` (SPDK's userspace NVMe/TCP initiator with
//! multipath) in the consumer node's namespace: this kernel has no `nvme_tcp`, so the CSI
//! node cannot connect the second path with the kernel; the test does the host's part
//! instead (attach the destination as a second path, report `hostConnectStatus`, drop the
//! old path after the switch-over), which is what the CSI node does on a host with
//! `nvme_tcp` (its logic is tested on recorded output in the csi crate).
//!
//! Needs root and network namespaces; elsewhere each test prints one `SKIP` line.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kube::api::ListParams;
use kube::{Api, ResourceExt};
use liteio_api::common::SpdkTarget;
use liteio_api::keys::{self, labels};
use liteio_api::migration::{MigrationPhase, ResultStatus};
use liteio_api::{AntstorVolume, VolumeMigration};
use liteio_cluster_tests::*;
use liteio_local::Engine;
use liteio_local::cluster::{Cluster, ClusterOptions, Role};
use liteio_local::datapath::{self};
use serde_json::Value;

const GIB: i64 = 1 << 30;

/// Three nodes; node 2 consumes. The storage nodes (1 and 3, where the volume and its
/// destination go) run SPDK with polling reactors: SPDK's NVMe/TCP initiator, which the
/// source's copy uses, has no interrupt mode.
fn spdk_cluster() -> ClusterOptions {
    let mut o = ClusterOptions::new(3, Engine::Spdk);
    o.pool_bytes = 3 << 30;
    o.spdk_polling = vec![1, 3];
    o
}

const CONSUMER: usize = 2;

/// A migration under way: the consumer writing through its first path and the second one,
/// the migration made by `kubectl liteio migrate`, the host's part reported.
struct Started {
    host: Host,
    name: String,
    uuid: String,
    src_node: String,
    /// The source's export.
    t: SpdkTarget,
    /// The destination's export.
    d: SpdkTarget,
    client: kube::Client,
    copy_from: Instant,
    thin: bool,
}

/// Creates volume `vol` (1 GiB, on node 1 or 3, consumed by node 2), starts the consumer
/// with `extra` arguments, lets it write for two seconds, migrates the volume and plays the
/// host's part up to `hostConnectStatus: Connected`. `thin`: a thin lvol (made as an
/// AntstorVolume directly: the CSI driver has no thin parameter).
async fn begin(c: &Cluster, vol: &str, thin: bool, extra: &[&str]) -> Result<Started, String> {
    let client = c.kube().await.map_err(err("kube"))?;
    if thin {
        let uuid = format!("5d1b7e3a-0c4f-4a2b-9e8d-{:012x}", std::process::id());
        let mut v = AntstorVolume::new(
            vol,
            liteio_api::AntstorVolumeSpec {
                uuid: uuid.clone(),
                type_: Some(liteio_api::common::VolumeType::SpdkLVol),
                size_byte: GIB as u64,
                is_thin: true,
                position_advice: liteio_api::common::VolumePosition::MustRemote,
                host_node: Some(liteio_api::common::NodeInfo {
                    id: c.node_name(CONSUMER),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        v.metadata.namespace = Some(keys::DEFAULT_NAMESPACE.into());
        v.metadata.labels = Some(std::collections::BTreeMap::from([
            (labels::VOL_UUID.to_string(), uuid),
            (labels::PV_NAME.to_string(), vol.to_string()),
        ]));
        let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
        vols.create(&Default::default(), &v)
            .await
            .map_err(err("create the thin volume"))?;
    } else {
        let params = HashMap::from([("positionAdvice".to_string(), "MustRemote".to_string())]);
        create_volume_sized(c, vol, Some(c.node_name(CONSUMER)), params, GIB)
            .await
            .map_err(err("join"))??;
    }
    eventually(c, &format!("{vol} ready"), 180, Role::Agent(1), || async {
        volume(c, vol).await.is_some_and(|v| is_ready(&v))
    })
    .await?;
    let src = volume(c, vol).await.ok_or("volume gone")?;
    let uuid = src.spec.uuid.clone();
    let src_node = src.target_node().ok_or("no target node")?.to_string();
    let t = src.spec.spdk_target.clone().ok_or("no spdkTarget")?;
    let keys = datapath::keys_file(&client, vol, &c.node_dir(CONSUMER))
        .await
        .map_err(err("keys"))?
        .ok_or_else(|| format!("the agent made no Secret for {vol}"))?;
    let mut host = Host::verifying(c, CONSUMER, CONSUMER, &t, &keys, extra)?;
    // Writes are under way once two seconds of them were counted.
    host.wait_for("tick ", 120).await?;
    host.wait_for("tick ", 30).await?;
    let copy_from = Instant::now();
    println!("{}", kubectl_migrate(c, vol).await?);
    let name = migration_of(c, vol)
        .await
        .ok_or("kubectl liteio migrate made no VolumeMigration")?
        .name_any();
    // The host's part: a second path once the destination is exported.
    let exported = |m: &VolumeMigration| {
        let d = m.spec.dest_volume.spdk.clone();
        (m.phase() == MigrationPhase::SetupPipe && !d.svc_id.is_empty()).then_some(d)
    };
    eventually(
        c,
        "the destination exported",
        180,
        Role::Controller(0),
        || async {
            get_opt::<VolumeMigration>(c, &name)
                .await
                .as_ref()
                .and_then(exported)
                .is_some()
        },
    )
    .await?;
    let d = get_opt::<VolumeMigration>(c, &name)
        .await
        .as_ref()
        .and_then(exported)
        .ok_or("no destination")?;
    host.send(&format!("path {} {}", d.address, d.svc_id))
        .await?;
    host.wait_for("path attached", 60).await?;
    host_reports(c, &name, true).await?;
    Ok(Started {
        host,
        name,
        uuid,
        src_node,
        t,
        d,
        client,
        copy_from,
        thin,
    })
}

/// The consumer's end: every write verified, no I/O error.
async fn verified(host: Host) -> Result<(Value, Vec<(Instant, Value)>), String> {
    let HostResult {
        code,
        result: r,
        ticks,
        ..
    } = host.finish().await?;
    println!("consumer: {r}");
    if code != 0 || r["errors"] != 0 || r["mismatches"] != 0 {
        return Err(format!(
            "the consumer saw errors or lost writes ({code}): {r}"
        ));
    }
    let verified = r["verified_blocks"].as_u64().unwrap_or(0);
    if verified == 0 || Some(verified) != r["written_blocks"].as_u64() {
        return Err(format!("not every written block was verified: {r}"));
    }
    Ok((r, ticks))
}

/// The names of the AntstorVolumes labelled with `uuid`.
async fn volumes_of(client: &kube::Client, uuid: &str) -> Result<Vec<AntstorVolume>, String> {
    let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    Ok(vols
        .list(&ListParams::default().labels(&format!("{}={uuid}", labels::VOL_UUID)))
        .await
        .map_err(err("list"))?
        .items)
}

/// After a cancel: the migration object gone, the destination volume gone, the source
/// ready, never committed, the only volume of its uuid.
async fn cancelled(c: &Cluster, s: &Started, vol: &str) -> Result<(), String> {
    eventually(
        c,
        "the migration gone",
        180,
        Role::Controller(0),
        || async { get_opt::<VolumeMigration>(c, &s.name).await.is_none() },
    )
    .await?;
    let vols: Api<AntstorVolume> = Api::namespaced(s.client.clone(), keys::DEFAULT_NAMESPACE);
    eventually(
        c,
        "the destination volume gone",
        180,
        Role::Controller(0),
        || async {
            vols.list(&ListParams::default())
                .await
                .is_ok_and(|l| !l.items.iter().any(|v| v.name_any().starts_with("mig-")))
        },
    )
    .await?;
    let src = volume(c, vol).await.ok_or("the source volume is gone")?;
    if !is_ready(&src)
        || src
            .annotations()
            .contains_key(liteio_api::keys::annotations::MIGRATE_ANA_STATE)
    {
        return Err(format!(
            "the source is not serving as before: {:?}",
            src.metadata.annotations
        ));
    }
    let same = volumes_of(&s.client, &s.uuid).await?;
    if same.len() != 1 {
        return Err(format!("{} volumes for {}", same.len(), s.uuid));
    }
    Ok(())
}

/// A 1 GiB volume on one node, consumed from another through SPDK's initiator with 4 KiB
/// random writes at queue depth 8, is migrated to a third node. Asserted: no I/O error, every
/// block reads back its last write from the destination after the switch-over, the source
/// volume (lvol and export) is gone, one AntstorVolume remains for the uuid, on the
/// destination's node.
#[test]
fn a_volume_moves_to_another_node_under_writes_and_nothing_is_lost() {
    if skip("migration under writes") {
        return;
    }
    let dir = scratch("t3-mig");
    with_cluster(&dir, spdk_cluster(), Duration::from_secs(900), |c| {
        Box::pin(async move {
            let s = begin(c, "pvc-mig", false, &[]).await?;
            finish(c, s, "pvc-mig").await.map(drop)
        })
    });
}

/// What one migration under writes measured.
#[derive(Debug, Clone, Copy)]
struct Figures {
    /// Copy throughput, MiB/s.
    copy_mib_s: f64,
    /// The consumer's writes per second before the migration and during the copy.
    iops_before: f64,
    iops_during: f64,
    /// The longest write completion in the seconds around the switch-over, µs.
    longest_at_switch_us: u64,
}

/// Completes a migration that is under way (the switch-over, the host's part of
/// `Cleaning`), checks the outcome and returns what it measured.
async fn finish(c: &Cluster, s: Started, vol: &str) -> Result<Figures, String> {
    let Started {
        mut host,
        name,
        uuid,
        src_node,
        t,
        d: _,
        client,
        copy_from,
        thin,
    } = s;
    // The copy runs, then the source agent switches over.
    eventually(c, "the switch-over", 300, Role::Agent(1), || async {
        get_opt::<VolumeMigration>(c, &name).await.is_some_and(|m| {
            m.spec.migration_info.auto_switch.status == Some(ResultStatus::Success)
        })
    })
    .await?;
    let switched_at = Instant::now();
    let m = get_opt::<VolumeMigration>(c, &name)
        .await
        .ok_or("migration gone")?;
    let job = &m.spec.migration_info.job_progress;
    // A thin source copies what it holds, not its size.
    let copied = m.bytes_copied();
    if copied == 0 || (thin && copied > 256 << 20) {
        return Err(format!(
            "copied {copied} bytes of a {} 1 GiB volume",
            if thin { "thin" } else { "thick" }
        ));
    }
    println!(
        "at the switch-over: {}",
        serde_json::to_string(job).unwrap()
    );
    // The old path goes, as the CSI node drops it in Cleaning.
    host.send(&format!("detach {} {}", t.address, t.svc_id))
        .await?;
    host.wait_for("path detached", 60).await?;
    host_reports(c, &name, false).await?;
    eventually(
        c,
        "the migration finished",
        300,
        Role::Controller(0),
        || async {
            get_opt::<VolumeMigration>(c, &name)
                .await
                .is_some_and(|m| m.phase() == MigrationPhase::Finished)
        },
    )
    .await?;
    // A few more seconds of writes on the destination alone.
    host.wait_for("tick ", 30).await?;
    host.wait_for("tick ", 30).await?;
    let (r, ticks) = verified(host).await?;
    for (at, t) in &ticks {
        let when = if *at < copy_from {
            "before"
        } else if *at < switched_at {
            "migrating"
        } else {
            "after"
        };
        println!("tick {when}: {t}");
    }
    // One volume for the uuid: the destination, on another node, ready.
    let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let same = vols
        .list(&ListParams::default().labels(&format!("{}={uuid}", labels::VOL_UUID)))
        .await
        .map_err(err("list"))?;
    let names: Vec<String> = same.items.iter().map(ResourceExt::name_any).collect();
    if same.items.len() != 1 || names[0] == vol {
        return Err(format!(
            "expected the destination alone for {uuid}: {names:?}"
        ));
    }
    let dest = &same.items[0];
    let dest_node = dest.target_node().unwrap_or_default().to_string();
    if dest_node == src_node || !is_ready(dest) {
        return Err(format!(
            "the destination is on {dest_node} (source {src_node}), ready: {}",
            is_ready(dest)
        ));
    }
    if vols.get_opt(vol).await.map_err(err("get"))?.is_some() {
        return Err("the source volume object is still there".into());
    }
    // Figures: IOPS before the copy, during it, and the longest I/O around the switch.
    let writes = |from: Instant, to: Instant| -> Vec<f64> {
        ticks
            .iter()
            .filter(|(at, _)| *at >= from && *at < to)
            .filter_map(|(_, t)| t["writes"].as_f64())
            .collect()
    };
    let start = ticks.first().map_or(copy_from, |t| t.0);
    let before = writes(start, copy_from);
    // The copy ran for `ms_elapsed` up to the moment it was in step.
    let copy_start = switched_at
        .checked_sub(Duration::from_millis(
            u64::try_from(job.ms_elapsed).unwrap_or(0),
        ))
        .unwrap_or(copy_from)
        .max(copy_from);
    let during = writes(copy_start, switched_at);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / (v.len().max(1) as f64);
    let ms = job.ms_elapsed.max(1) as f64;
    let mib = job.total_write_pages as f64 * 4096.0 / f64::from(1u32 << 20);
    // The ticks that arrived within two seconds of the moment the test saw the switch.
    let near = |at: &Instant| {
        at.saturating_duration_since(switched_at) < Duration::from_secs(2)
            && switched_at.saturating_duration_since(*at) < Duration::from_secs(2)
    };
    let longest_at_switch_us = ticks
        .iter()
        .filter(|(at, _)| near(at))
        .filter_map(|(_, t)| t["max_us"].as_u64())
        .max()
        .unwrap_or(0);
    let f = Figures {
        copy_mib_s: mib / (ms / 1000.0),
        iops_before: mean(&before),
        iops_during: mean(&during),
        longest_at_switch_us,
    };
    println!(
        "migrated 1 GiB from {src_node} to {dest_node}: copy {mib:.0} MiB in {ms:.0} ms = {:.0} MiB/s under load; consumer {:.0} IOPS before, {:.0} during the copy ({:.0} %); longest I/O {} us overall, {longest_at_switch_us} us around the switch; {} ticks",
        f.copy_mib_s,
        f.iops_before,
        f.iops_during,
        100.0 * f.iops_during / f.iops_before.max(1.0),
        r["longest_io_us"],
        ticks.len()
    );
    Ok(f)
}

/// Benchmark (not run by the test script; `cargo build --release --workspace`, then `cargo
/// test --release -p liteio-cluster-tests --features spdk --test t3_migration bench -- --ignored
/// --nocapture`, `LITEIO_BENCH_RUNS` runs, 3 by default; the cluster runs the binaries of
/// the profile the test is built with):
/// per run, a 1 GiB thick volume migrated with no writes (the idle copy) and one migrated
/// under the consumer's 4 KiB random writes at queue depth 8. Prints each run and the worst
/// of each figure. The storage nodes poll (production mode) and share this machine's cores
/// with each other and with the consumer, which polls too.
#[test]
#[ignore = "benchmark: run with --ignored"]
fn bench_migration() {
    if skip("migration benchmark") {
        return;
    }
    let runs: usize = std::env::var("LITEIO_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let dir = scratch("t3-mig-bench");
    with_cluster(&dir, spdk_cluster(), Duration::from_secs(3600), |c| {
        Box::pin(async move {
            let (mut idle, mut loaded) = (Vec::new(), Vec::new());
            for i in 0..runs {
                idle.push(idle_copy(c, &format!("pvc-idle-{i}")).await?);
                let s = begin(c, &format!("pvc-load-{i}"), false, &[]).await?;
                loaded.push(finish(c, s, &format!("pvc-load-{i}")).await?);
                println!(
                    "run {i}: idle copy {:.0} MiB/s; under writes {:?}",
                    idle[i], loaded[i]
                );
                // Room for the next run: the pools hold three volumes each.
                remove_all_volumes(c).await?;
            }
            let min = |v: &mut dyn Iterator<Item = f64>| v.fold(f64::INFINITY, f64::min);
            println!(
                "worst of {runs}: idle copy {:.0} MiB/s (goal >= 200); copy under writes {:.0} MiB/s; consumer IOPS during the copy {:.0} % of before (goal >= 50 %); longest write around the switch-over {} ms (goal <= 1000)",
                min(&mut idle.iter().copied()),
                min(&mut loaded.iter().map(|f| f.copy_mib_s)),
                100.0
                    * min(&mut loaded
                        .iter()
                        .map(|f| f.iops_during / f.iops_before.max(1.0))),
                loaded
                    .iter()
                    .map(|f| f.longest_at_switch_us)
                    .max()
                    .unwrap_or(0)
                    / 1000
            );
            Ok(())
        })
    });
}

/// Deletes every AntstorVolume and waits until they are gone (their agents removed them).
async fn remove_all_volumes(c: &Cluster) -> Result<(), String> {
    let vols: Api<AntstorVolume> = Api::namespaced(
        c.kube().await.map_err(err("kube"))?,
        keys::DEFAULT_NAMESPACE,
    );
    vols.delete_collection(&Default::default(), &ListParams::default())
        .await
        .map_err(err("delete volumes"))?;
    eventually(c, "every volume gone", 180, Role::Controller(0), || async {
        vols.list(&ListParams::default())
            .await
            .is_ok_and(|l| l.items.is_empty())
    })
    .await
}

/// Migrates `vol` (1 GiB, thick, freshly made, nobody writing) and returns the copy's MiB/s.
async fn idle_copy(c: &Cluster, vol: &str) -> Result<f64, String> {
    idle_copy_with(c, vol, &[]).await.map(|(mib_s, _)| mib_s)
}

/// [`idle_copy`] of a volume made with the StorageClass parameters `extra` too; also returns
/// the volume's uuid.
async fn idle_copy_with(
    c: &Cluster,
    vol: &str,
    extra: &[(&str, &str)],
) -> Result<(f64, String), String> {
    let mut params = HashMap::from([("positionAdvice".to_string(), "MustRemote".to_string())]);
    params.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    create_volume_sized(c, vol, Some(c.node_name(CONSUMER)), params, GIB)
        .await
        .map_err(err("join"))??;
    eventually(c, &format!("{vol} ready"), 180, Role::Agent(1), || async {
        volume(c, vol).await.is_some_and(|v| is_ready(&v))
    })
    .await?;
    let uuid = volume(c, vol).await.ok_or("volume gone")?.spec.uuid;
    kubectl_migrate(c, vol).await?;
    eventually(
        c,
        "the destination exported",
        180,
        Role::Controller(0),
        || async {
            migration_of(c, vol).await.is_some_and(|m| {
                m.phase() == MigrationPhase::SetupPipe && !m.spec.dest_volume.spdk.svc_id.is_empty()
            })
        },
    )
    .await?;
    let name = migration_of(c, vol)
        .await
        .ok_or("migration gone")?
        .name_any();
    // Nobody consumes it: the host's part is only its report.
    host_reports(c, &name, true).await?;
    eventually(c, "the switch-over", 300, Role::Agent(1), || async {
        get_opt::<VolumeMigration>(c, &name).await.is_some_and(|m| {
            m.spec.migration_info.auto_switch.status == Some(ResultStatus::Success)
        })
    })
    .await?;
    let m = get_opt::<VolumeMigration>(c, &name)
        .await
        .ok_or("migration gone")?;
    let job = &m.spec.migration_info.job_progress;
    let mib_s =
        m.bytes_copied() as f64 / f64::from(1u32 << 20) / (job.ms_elapsed.max(1) as f64 / 1000.0);
    host_reports(c, &name, false).await?;
    eventually(
        c,
        "the migration finished",
        300,
        Role::Controller(0),
        || async {
            get_opt::<VolumeMigration>(c, &name)
                .await
                .is_some_and(|m| m.phase() == MigrationPhase::Finished)
        },
    )
    .await?;
    Ok((mib_s, uuid))
}

/// A volume limited to 4 MiB/s of writes and 1,000 IOPS moves with its limits: the
/// destination enforces them once promoted (its annotation, and its agent's metrics, say
/// so), and the copy is not held to them on the way (1 GiB at 4 MiB/s would take over
/// four minutes; the copy runs at the node's speed). The destination's agent restarted
/// applies them again.
#[test]
fn a_limited_volume_moves_with_its_limits_and_its_copy_is_not_held_to_them() {
    if skip("migration of a limited volume") {
        return;
    }
    let dir = scratch("t3-mig-qos");
    with_cluster(&dir, spdk_cluster(), Duration::from_secs(900), |c| {
        Box::pin(async move {
            let want = liteio_api::qos::VolumeQos {
                iops: 1000,
                write_mbps: 4,
                ..Default::default()
            };
            let (mib_s, uuid) = idle_copy_with(
                c,
                "pvc-qos",
                &[
                    (liteio_api::qos::PARAM_IOPS, "1000"),
                    (liteio_api::qos::PARAM_WRITE_MBPS, "4"),
                ],
            )
            .await?;
            println!("copy of a volume limited to 4 MiB/s of writes: {mib_s:.0} MiB/s");
            if mib_s < 20.0 {
                return Err(format!(
                    "the copy ran at {mib_s:.1} MiB/s: held to the volume's own limit"
                ));
            }
            let client = c.kube().await.map_err(err("kube"))?;
            let vols = volumes_of(&client, &uuid).await?;
            if vols.len() != 1 || vols[0].name_any() == "pvc-qos" {
                return Err(format!(
                    "expected the destination alone for {uuid}: {:?}",
                    vols.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
                ));
            }
            let d = &vols[0];
            if d.spec.qos != Some(want) {
                return Err(format!("the destination's spec.qos is {:?}", d.spec.qos));
            }
            let in_force = d
                .annotations()
                .get(keys::annotations::QOS_IN_FORCE)
                .cloned();
            if in_force.as_deref() != Some(want.to_annotation().as_str()) {
                return Err(format!(
                    "the destination's limits in force: {in_force:?}, want {}",
                    want.to_annotation()
                ));
            }
            // Its agent reports them.
            let node = d.target_node().ok_or("no target node")?.to_string();
            let k: usize = node
                .trim_start_matches("node-")
                .parse()
                .map_err(err("node index"))?;
            let addr = c
                .agent_metrics_addr(k)
                .map_err(err("metrics address"))?
                .to_string();
            let name = d.name_any();
            let u = uuid.clone();
            let reported = || async {
                liteio_local::cluster::http_get(&addr, "/metrics")
                    .await
                    .is_some_and(|t| {
                        t.lines().any(|l| {
                            l.starts_with("liteio_volume_qos_limit_bytes_per_second{")
                                && l.contains(&format!("volume=\"{name}\""))
                                && l.contains(&format!("uuid=\"{u}\""))
                                && l.contains("direction=\"write\"")
                                && l.ends_with(" 4194304")
                        }) && t.lines().any(|l| {
                            l.starts_with("liteio_volume_qos_iops_limit{")
                                && l.contains(&format!("volume=\"{name}\""))
                                && l.ends_with(" 1000")
                        })
                    })
            };
            let what = "the limits in the destination agent's metrics";
            eventually(c, what, 30, Role::Agent(k), reported).await?;
            // The destination's agent restarts: the new process applies them again before
            // its export listens (its metrics start empty).
            c.stop(Role::Agent(k))
                .await
                .map_err(err("stop the agent"))?;
            c.launch(Role::Agent(k))
                .await
                .map_err(err("start the agent"))?;
            let what = "the limits applied again after the restart";
            eventually(c, what, 120, Role::Agent(k), reported).await
        })
    });
}

/// The operator deletes migration `s` before it finished: the host drops its path to the
/// destination, as the CSI node does on a cancel, and reports itself disconnected.
async fn withdraw(c: &Cluster, s: &mut Started) -> Result<(), String> {
    Api::<VolumeMigration>::namespaced(s.client.clone(), keys::DEFAULT_NAMESPACE)
        .delete(&s.name, &Default::default())
        .await
        .map_err(err("delete the migration"))?;
    s.host
        .send(&format!("detach {} {}", s.d.address, s.d.svc_id))
        .await?;
    s.host.wait_for("path detached", 60).await?;
    host_reports(c, &s.name, false).await
}

/// Deleting the migration while the copy runs cancels it: the copy stops, the destination
/// volume goes, the source serves on as before and nothing written is lost.
#[test]
fn a_migration_deleted_mid_copy_is_cancelled_and_the_source_serves_on() {
    if skip("migration deleted mid-copy") {
        return;
    }
    let dir = scratch("t3-mig-del");
    with_cluster(&dir, spdk_cluster(), Duration::from_secs(900), |c| {
        Box::pin(async move {
            let mut s = begin(c, "pvc-del", false, &[]).await?;
            copy_under_way(c, &s.name, 120).await?;
            withdraw(c, &mut s).await?;
            cancelled(c, &s, "pvc-del").await?;
            s.host.wait_for("tick ", 30).await?;
            s.host.wait_for("tick ", 30).await?;
            verified(s.host).await?;
            Ok(())
        })
    });
}

/// The destination's agent is SIGKILLed while the copy runs: the mirror breaks, the
/// migration ends in `Error`, the consumer sees no error and the source serves on. Deleting
/// the migration then removes the destination once its agent is back.
#[test]
fn a_destination_killed_mid_copy_ends_in_error_and_the_source_serves_on() {
    if skip("destination killed mid-copy") {
        return;
    }
    let dir = scratch("t3-mig-dkill");
    with_cluster(&dir, spdk_cluster(), Duration::from_secs(900), |c| {
        Box::pin(async move {
            let mut s = begin(c, "pvc-dkill", false, &[]).await?;
            copy_under_way(c, &s.name, 120).await?;
            let k = kill_destination(c, &s.name).await?;
            let m = get_opt::<VolumeMigration>(c, &s.name)
                .await
                .ok_or("migration gone")?;
            println!(
                "after the kill: {} {:?}",
                m.status.as_ref().map_or("", |st| st.message.as_str()),
                m.spec.migration_info.job_progress
            );
            // The source never stopped serving.
            s.host.wait_for("tick ", 30).await?;
            withdraw(c, &mut s).await?;
            c.launch(Role::Agent(k)).await.map_err(err("restart"))?;
            cancelled(c, &s, "pvc-dkill").await?;
            s.host.wait_for("tick ", 30).await?;
            verified(s.host).await?;
            Ok(())
        })
    });
}

/// The source's agent is SIGKILLed while the copy runs (a thin source, so that only what it
/// holds is copied): the consumer's writes wait while the agent is down, the restarted agent
/// starts the copy again, the migration finishes and every write reads back from the
/// destination.
#[test]
fn a_source_killed_mid_copy_starts_the_copy_again_and_the_thin_volume_moves() {
    if skip("source killed mid-copy") {
        return;
    }
    let dir = scratch("t3-mig-skill");
    with_cluster(&dir, spdk_cluster(), Duration::from_secs(900), |c| {
        Box::pin(async move {
            // 192 MiB of the thin 1 GiB volume get written; the rest stays unallocated.
            let s = begin(
                c,
                "pvc-skill",
                true,
                &[
                    "--span-bytes",
                    "201326592",
                    "--expect-zeroes",
                    "--reconnect-seconds",
                    "120",
                ],
            )
            .await?;
            // Fill part of the span before the copy so the copy has something to do.
            copy_under_way(c, &s.name, 120).await?;
            let k = (1..=3)
                .find(|&k| c.node_name(k) == s.src_node)
                .ok_or("source node not in the run")?;
            c.kill(Role::Agent(k)).await.map_err(err("kill"))?;
            c.launch(Role::Agent(k)).await.map_err(err("restart"))?;
            finish(c, s, "pvc-skill").await.map(drop)
        })
    });
}

/// The destination's agent is SIGKILLed while the copy runs and started again: the migration
/// goes to `Error`, then the source agent starts the copy again once the destination is back,
/// and the migration finishes with every write in place.
#[test]
fn a_destination_restarted_mid_copy_gets_the_copy_again_and_the_migration_finishes() {
    if skip("destination restarted mid-copy") {
        return;
    }
    let dir = scratch("t3-mig-drest");
    with_cluster(&dir, spdk_cluster(), Duration::from_secs(900), |c| {
        Box::pin(async move {
            // The consumer's path to the destination reconnects once it is back.
            let s = begin(c, "pvc-drest", false, &["--reconnect-seconds", "120"]).await?;
            copy_under_way(c, &s.name, 120).await?;
            let k = kill_destination(c, &s.name).await?;
            c.launch(Role::Agent(k)).await.map_err(err("restart"))?;
            eventually(c, "the copy started again", 180, Role::Agent(1), || async {
                get_opt::<VolumeMigration>(c, &s.name)
                    .await
                    .is_some_and(|m| m.status_name() == liteio_api::migration::STATUS_WORKING)
            })
            .await?;
            finish(c, s, "pvc-drest").await.map(drop)
        })
    });
}
