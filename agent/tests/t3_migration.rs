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

#[path = "../../local/tests/cluster_common/mod.rs"]
mod cluster_common;

use std::collections::HashMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use cluster_common::*;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use liteio_api::common::SpdkTarget;
use liteio_api::keys::{self, finalizers, labels};
use liteio_api::migration::{ConnectStatus, MigrationPhase, ResultStatus};
use liteio_api::{AntstorVolume, VolumeMigration};
use liteio_local::Engine;
use liteio_local::cluster::{Cluster, ClusterOptions, Role};
use liteio_local::datapath::{self, HostNqn};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

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

/// The consumer: `nvmf-check --verify-writes` with its stdin and its output lines.
struct Consumer {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: mpsc::UnboundedReceiver<(Instant, String)>,
    seen: Vec<String>,
    /// When each line arrived, in the order of `seen`.
    at: Vec<Instant>,
}

impl Consumer {
    async fn start(
        c: &Cluster,
        k: usize,
        t: &SpdkTarget,
        keys: &datapath::KeysFile,
    ) -> Result<Self, String> {
        let hostnqn = c.node_dir(k).join("hostnqn");
        let mut cmd = datapath::check_command(
            &c.bin_dir,
            &c.net.exec_prefix(k).unwrap(),
            t,
            HostNqn::File(&hostnqn),
            Some(keys),
            &["--verify-writes", "--queue-depth", "8"],
        );
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(err("spawn nvmf-check"))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let mut out = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(l)) = out.next_line().await {
                if tx.send((Instant::now(), l)).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            stdin,
            lines,
            seen: Vec::new(),
            at: Vec::new(),
        })
    }

    /// The next line that starts with `prefix` (within `secs`); every line is kept.
    async fn wait_for(&mut self, prefix: &str, secs: u64) -> Result<String, String> {
        let until = Instant::now() + Duration::from_secs(secs);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let (at, line) = tokio::time::timeout(left, self.lines.recv())
                .await
                .map_err(|_| format!("no line {prefix:?} from nvmf-check within {secs} s"))?
                .ok_or_else(|| {
                    format!(
                        "nvmf-check ended before {prefix:?}: {}",
                        self.seen.join("\n")
                    )
                })?;
            self.seen.push(line.clone());
            self.at.push(at);
            if line.starts_with(prefix) {
                return Ok(line);
            }
            if line.starts_with("error") {
                return Err(format!("nvmf-check: {line}"));
            }
        }
    }

    async fn send(&mut self, cmd: &str) -> Result<(), String> {
        self.stdin
            .write_all(format!("{cmd}\n").as_bytes())
            .await
            .map_err(err("write to nvmf-check"))
    }

    /// `stop`, then the final JSON result, the exit status and the ticks with the time
    /// each arrived.
    async fn finish(mut self) -> Result<(i32, Value, Vec<(Instant, Value)>), String> {
        self.send("stop").await?;
        while let Some((at, l)) = tokio::time::timeout(Duration::from_secs(600), self.lines.recv())
            .await
            .map_err(|_| "nvmf-check did not verify within 600 s".to_string())?
        {
            self.seen.push(l);
            self.at.push(at);
        }
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .map_err(|_| "nvmf-check did not exit".to_string())?
            .map_err(err("wait"))?;
        let r = self
            .seen
            .iter()
            .rev()
            .find_map(|l| {
                serde_json::from_str::<Value>(l)
                    .ok()
                    .filter(Value::is_object)
            })
            .ok_or("no JSON result")?;
        let ticks = self
            .at
            .iter()
            .zip(&self.seen)
            .filter_map(|(at, l)| Some((*at, serde_json::from_str(l.strip_prefix("tick ")?).ok()?)))
            .collect();
        Ok((status.code().unwrap_or(-1), r, ticks))
    }
}

async fn migration(c: &Cluster, name: &str) -> Option<VolumeMigration> {
    let api: Api<VolumeMigration> = Api::namespaced(c.kube().await.ok()?, keys::DEFAULT_NAMESPACE);
    api.get_opt(name).await.ok().flatten()
}

async fn only_migration(c: &Cluster) -> Option<VolumeMigration> {
    let api: Api<VolumeMigration> = Api::namespaced(c.kube().await.ok()?, keys::DEFAULT_NAMESPACE);
    let l = api.list(&ListParams::default()).await.ok()?;
    l.items.into_iter().next()
}

/// `kubectl liteio migrate <volume>` with the cluster's kubeconfig.
async fn kubectl_migrate(c: &Cluster, volume: &str) -> Result<String, String> {
    let out = tokio::process::Command::new(bin_dir().join("kubectl-liteio"))
        .arg("--kubeconfig")
        .arg(c.kubeconfig())
        .args(["migrate", volume])
        .output()
        .await
        .map_err(err("run kubectl-liteio"))?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if !out.status.success() {
        return Err(format!(
            "kubectl liteio migrate failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(text)
}

/// Patches `hostConnectStatus` and the host's finalizer, as the CSI node does.
async fn host_reports(c: &Cluster, name: &str, connected: bool) -> Result<(), String> {
    let api: Api<VolumeMigration> = Api::namespaced(
        c.kube().await.map_err(err("kube"))?,
        keys::DEFAULT_NAMESPACE,
    );
    let m = api.get(name).await.map_err(err("get migration"))?;
    let mut fins: Vec<String> = m.finalizers().to_vec();
    fins.retain(|f| f != finalizers::MIGRATE_HOST_CONNECTED);
    if connected {
        fins.push(finalizers::MIGRATE_HOST_CONNECTED.into());
    }
    let status = if connected {
        ConnectStatus::Connected
    } else {
        ConnectStatus::Disconnected
    };
    let body = json!({
        "metadata": {"finalizers": fins, "resourceVersion": m.resource_version()},
        "spec": {"migrationInfo": {"hostConnectStatus": status}},
    });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map_err(err("patch migration"))?;
    Ok(())
}

/// Retries `host_reports` over conflicts with the agents' and controller's writes.
async fn host_reports_retrying(c: &Cluster, name: &str, connected: bool) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..50 {
        match host_reports(c, name, connected).await {
            Ok(()) => return Ok(()),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// A 1 GiB volume on one node, consumed from another through SPDK's initiator with 4 KiB
/// random writes at queue depth 8, is migrated to a third node. Asserted: no I/O error, every
/// block reads back its last write from the destination after the switch-over, the source
/// volume (lvol and export) is gone, one AntstorVolume remains for the uuid, on the
/// destination's node, and the pools' free space follows.
#[test]
fn a_volume_moves_to_another_node_under_writes_and_nothing_is_lost() {
    if skip("migration under writes") {
        return;
    }
    assert!(
        bin_dir().join("kubectl-liteio").exists(),
        "kubectl-liteio is not built; run cargo build --workspace first"
    );
    let dir = scratch("t3-mig");
    with_cluster(&dir, spdk_cluster(), Duration::from_secs(900), |c| {
        Box::pin(async move {
            let consumer = 2;
            let params = HashMap::from([("positionAdvice".to_string(), "MustRemote".to_string())]);
            create_volume_sized(c, "pvc-mig", Some(c.node_name(consumer)), params, GIB)
                .await
                .map_err(err("join"))??;
            eventually(c, "pvc-mig ready", 180, Role::Agent(1), || async {
                volume(c, "pvc-mig").await.is_some_and(|v| is_ready(&v))
            })
            .await?;
            let src = volume(c, "pvc-mig").await.ok_or("volume gone")?;
            let uuid = src.spec.uuid.clone();
            let src_node = src.target_node().ok_or("no target node")?.to_string();
            let t = src.spec.spdk_target.clone().ok_or("no spdkTarget")?;
            let client = c.kube().await.map_err(err("kube"))?;
            let keys = datapath::keys_file(&client, "pvc-mig", &c.node_dir(consumer))
                .await
                .map_err(err("keys"))?
                .ok_or("the agent made no Secret for pvc-mig")?;
            let mut host = Consumer::start(c, consumer, &t, &keys).await?;
            // Writes are under way once two seconds of them were counted.
            host.wait_for("tick ", 120).await?;
            host.wait_for("tick ", 30).await?;
            let copy_from = Instant::now();
            println!("{}", kubectl_migrate(c, "pvc-mig").await?);
            let name = only_migration(c)
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
                    migration(c, &name)
                        .await
                        .as_ref()
                        .and_then(exported)
                        .is_some()
                },
            )
            .await?;
            let d = migration(c, &name)
                .await
                .as_ref()
                .and_then(exported)
                .ok_or("no destination")?;
            host.send(&format!("path {} {}", d.address, d.svc_id))
                .await?;
            host.wait_for("path attached", 60).await?;
            host_reports_retrying(c, &name, true).await?;
            // The copy runs, then the source agent switches over.
            eventually(c, "the switch-over", 300, Role::Agent(1), || async {
                migration(c, &name).await.is_some_and(|m| {
                    m.spec.migration_info.auto_switch.status == Some(ResultStatus::Success)
                })
            })
            .await?;
            let switched_at = Instant::now();
            let m = migration(c, &name).await.ok_or("migration gone")?;
            let job = &m.spec.migration_info.job_progress;
            println!(
                "at the switch-over: {}",
                serde_json::to_string(job).unwrap()
            );
            // The old path goes, as the CSI node drops it in Cleaning.
            host.send(&format!("detach {} {}", t.address, t.svc_id))
                .await?;
            host.wait_for("path detached", 60).await?;
            host_reports_retrying(c, &name, false).await?;
            eventually(
                c,
                "the migration finished",
                300,
                Role::Controller(0),
                || async {
                    migration(c, &name)
                        .await
                        .is_some_and(|m| m.phase() == MigrationPhase::Finished)
                },
            )
            .await?;
            // A few more seconds of writes on the destination alone.
            host.wait_for("tick ", 30).await?;
            host.wait_for("tick ", 30).await?;
            let (code, r, ticks) = host.finish().await?;
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
            // One volume for the uuid: the destination, on another node, ready.
            let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
            let same = vols
                .list(&ListParams::default().labels(&format!("{}={uuid}", labels::VOL_UUID)))
                .await
                .map_err(err("list"))?;
            let names: Vec<String> = same.items.iter().map(ResourceExt::name_any).collect();
            if same.items.len() != 1 || names[0] == "pvc-mig" {
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
            if vols.get_opt("pvc-mig").await.map_err(err("get"))?.is_some() {
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
            println!(
                "migrated 1 GiB from {src_node} to {dest_node}: copy {mib:.0} MiB in {ms:.0} ms = {:.0} MiB/s under load; consumer {:.0} IOPS before, {:.0} during the copy ({:.0} %); longest I/O {} us; {} ticks",
                mib / (ms / 1000.0),
                mean(&before),
                mean(&during),
                100.0 * mean(&during) / mean(&before).max(1.0),
                r["longest_io_us"],
                ticks.len()
            );
            Ok(())
        })
    });
}
