//! T4: a hot migration as the Linux kernel's native NVMe multipath sees it. Two storage
//! nodes (network namespaces, SPDK with polling reactors: the source's copy runs SPDK's
//! initiator) and a compute node that is a microVM with Debian 12's 6.12 kernel. The volume
//! is staged and mounted (ext4) by the VM's CSI node plugin; fio writes 4 KiB random blocks
//! at queue depth 8 with verification while `kubectl liteio migrate` moves the volume. The
//! CSI node does the host's part itself (second path with the first path's keys, report,
//! old path dropped). Afterwards: no I/O error, verify passes, the kernel's subsystem has
//! the destination's path live and the source's gone; the longest write is printed.
//!
//! Needs SPDK, root, network namespaces and a bootable VM; elsewhere one `SKIP` line.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../local/tests/cluster_common/mod.rs"]
mod cluster_common;

use std::time::{Duration, Instant};

use cluster_common::*;
use kube::Api;
use liteio_api::keys;
use liteio_api::migration::MigrationPhase;
use liteio_csi::csi::*;
use liteio_local::Engine;
use liteio_local::cluster::{ClusterOptions, Role};
use liteio_local::demo::mount_capability;
use liteio_local::vm::Kernel;

const STEP: Duration = Duration::from_secs(120);

#[test]
fn a_hot_migration_seen_by_the_kernels_multipath() {
    if skip_vm("t4 kernel migration", &Kernel::Backports) {
        return;
    }
    let dir = scratch("t4-kernel-migration");
    let mut opts = ClusterOptions::new(2, Engine::Spdk);
    opts.pool_bytes = 2 << 30;
    opts.spdk_polling = vec![1, 2];
    with_cluster(&dir, opts, Duration::from_secs(1500), |c| {
        Box::pin(async move {
            // Two busy-polling reactors take both cores of this machine and starve the VM's
            // emulated CPU: the agents' threads yield to it (a test-bench setting; a storage
            // node's reactor polls a core of its own).
            for k in 1..=2 {
                let pid = c.pid(Role::Agent(k)).ok_or("no agent pid")?;
                for task in std::fs::read_dir(format!("/proc/{pid}/task")).map_err(err("tasks"))? {
                    let tid = task
                        .map_err(err("task"))?
                        .file_name()
                        .to_string_lossy()
                        .into_owned();
                    let _ = std::process::Command::new("renice")
                        .args(["-n", "15", "-p", &tid])
                        .output();
                }
            }
            let mut node = c
                .add_vm_node(1, Kernel::Backports)
                .await
                .map_err(|e| e.to_string())?;
            println!(
                "VM node {} at {} (boot {:.1}s)",
                node.name,
                node.address,
                node.vm.booted_in().as_secs_f64()
            );
            let mut csi = liteio_csi::client::connect(&node.csi_endpoint())
                .await
                .map_err(|e| e.to_string())?;
            let id = remote_volume_for(c, "pvc-m", &node.name, 256 * MIB).await?;
            let v = volume(c, "pvc-m").await.ok_or("pvc-m gone")?;
            let source = v.spec.spdk_target.clone().ok_or("no export")?;
            let secrets = stage_secrets(c, "pvc-m").await?;
            let (staging, target) = ("/tmp/stage/pvc-m", "/tmp/pods/p1/pvc-m");
            csi.node
                .node_stage_volume(NodeStageVolumeRequest {
                    volume_id: id.clone(),
                    staging_target_path: staging.into(),
                    volume_capability: Some(mount_capability("ext4")),
                    secrets: secrets.clone(),
                    ..Default::default()
                })
                .await
                .map_err(|e| format!("stage: {}", e.message()))?;
            csi.node
                .node_publish_volume(NodePublishVolumeRequest {
                    volume_id: id.clone(),
                    staging_target_path: staging.into(),
                    target_path: target.into(),
                    volume_capability: Some(mount_capability("ext4")),
                    secrets,
                    ..Default::default()
                })
                .await
                .map_err(|e| format!("publish: {}", e.message()))?;

            // fio with verification, long enough to span the whole migration.
            start_fio(&mut node, &format!("{target}/fio.dat"), 600).await?;

            let t = Instant::now();
            println!("{}", kubectl_migrate(c, "pvc-m").await?);
            eventually(
                c,
                "the migration finished",
                900,
                Role::Controller(0),
                || async {
                    migration_of(c, "pvc-m")
                        .await
                        .is_some_and(|m| m.phase() == MigrationPhase::Finished)
                },
            )
            .await?;
            println!("migration finished after {:.1}s", t.elapsed().as_secs_f64());
            // fio stops (SIGINT ends its write phase; the verify phase then reads everything).
            node.vm
                .sh_ok("pkill -INT -x fio; true", STEP)
                .await
                .map_err(|e| e.to_string())?;
            let fio = fio_result(&mut node, Duration::from_secs(300)).await?;
            let paths = node
                .vm
                .sh_ok("for c in /sys/class/nvme/nvme*; do echo \"$(cat $c/address) $(cat $c/state)\"; done; cat /sys/block/nvme0n1/queue/ana* 2>/dev/null; true", STEP)
                .await
                .map_err(|e| e.to_string())?;
            println!(
                "fio across the migration: error {}, {} writes, longest write {:.0} ms\nkernel paths:\n{paths}\nguest:\n{}",
                fio.error, fio.writes, fio.max_write_ms, fio.log
            );
            assert_eq!(fio.error, 0, "fio saw an I/O error: {}", fio.log);
            assert!(
                !fio.log.contains("verify: bad")
                    && !fio.log.contains("verify failed")
                    && !fio.log.contains("I/O error"),
                "{}",
                fio.log
            );
            // The destination's path is live, the source's gone.
            let client = c.kube().await.map_err(err("kube"))?;
            let same =
                Api::<liteio_api::AntstorVolume>::namespaced(client, keys::DEFAULT_NAMESPACE)
                    .list(&kube::api::ListParams::default().labels(&format!(
                        "{}={}",
                        keys::labels::VOL_UUID,
                        v.spec.uuid
                    )))
                    .await
                    .map_err(err("list"))?;
            let [moved] = same.items.as_slice() else {
                return Err(format!(
                    "{} volumes with the uuid after the migration",
                    same.items.len()
                ));
            };
            let dest = moved
                .spec
                .spdk_target
                .clone()
                .ok_or("the destination has no export")?;
            assert_ne!(dest.address, source.address, "the volume did not move");
            assert!(
                paths.contains(&format!("traddr={},trsvcid={}", dest.address, dest.svc_id))
                    && paths.contains("live"),
                "{paths}"
            );
            assert!(
                !paths.contains(&format!(
                    "traddr={},trsvcid={}",
                    source.address, source.svc_id
                )),
                "the source's path is still there: {paths}"
            );
            node.vm.shutdown().await;
            Ok(())
        })
    });
}
