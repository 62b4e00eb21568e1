//! T4: a hot migration as the Linux kernel's native NVMe multipath sees it. Two storage
//! nodes (network namespaces, SPDK with polling reactors: the source's copy runs SPDK's
//! initiator) and a compute node that is a microVM with Debian 12's 6.12 kernel. The volume
//! is staged and mounted (ext4) by the VM's CSI node plugin; fio writes 4 KiB random blocks
//! at queue depth 8 with verification while `kubectl liteio migrate` moves the volume. The
//! CSI node does the host's part itself (second path with the first path's keys, report,
//! old path dropped). Afterwards: no I/O error, verify passes, the kernel's subsystem has
//! the destination's path live and the source's gone; the longest write is printed.
//! Before that, under the same fio, a first migration's destination agent is SIGKILLed
//! mid-copy: the migration ends in `Error`, the source serves on, deleting the migration
//! drops the kernel's path to the destination, and the destination's volume goes once its
//! agent is back.
//!
//! Needs SPDK, root, network namespaces and a bootable VM; elsewhere one `SKIP` line.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use kube::Api;
use kube::ResourceExt;
use liteio_api::VolumeMigration;
use liteio_api::keys;
use liteio_api::migration::MigrationPhase;
use liteio_cluster_tests::*;
use liteio_local::Engine;
use liteio_local::cluster::{Cluster, ClusterOptions, Role};
use liteio_local::vm::Kernel;
use liteio_local::vm_node::VmNode;

const STEP: Duration = Duration::from_secs(120);

/// The guest's NVMe controllers: `<address> <state>` per line.
async fn kernel_paths(node: &mut VmNode) -> Result<String, String> {
    node.vm
        .sh_ok("for c in /sys/class/nvme/nvme*; do echo \"$(cat $c/address) $(cat $c/state)\"; done; true", STEP)
        .await
        .map_err(|e| e.to_string())
}

/// A migration whose destination's agent is SIGKILLed while the copy runs: it ends in
/// `Error`, the source serves on (fio, writing all along, sees no error), the operator
/// deletes the migration, the CSI node drops the path to the destination, and once the
/// destination's agent is back its half-made volume goes; one volume of the uuid is left.
async fn destination_killed_mid_copy(
    c: &mut Cluster,
    node: &mut VmNode,
    vol: &str,
) -> Result<(), String> {
    println!("{}", kubectl_migrate(c, vol).await?);
    let m = migration_of(c, vol).await.ok_or("no migration")?;
    let name = m.name_any();
    copy_under_way(c, &name, 300).await?;
    let k = kill_destination(c, &name).await?;
    let m = migration_of(c, vol).await.ok_or("migration gone")?;
    println!(
        "destination killed mid-copy: {} {:?}; kernel paths:\n{}",
        m.status.as_ref().map_or("", |st| st.message.as_str()),
        m.spec.migration_info.job_progress,
        kernel_paths(node).await?
    );
    if !fio_running(node).await? {
        return Err("fio ended while the destination was down".into());
    }
    let client = c.kube().await.map_err(err("kube"))?;
    Api::<VolumeMigration>::namespaced(client.clone(), keys::DEFAULT_NAMESPACE)
        .delete(&name, &Default::default())
        .await
        .map_err(err("delete the migration"))?;
    let src = volume(c, vol).await.ok_or("the source is gone")?;
    let src_target = src.spec.spdk_target.clone().ok_or("no export")?;
    let src_path = format!(
        "traddr={},trsvcid={}",
        src_target.address, src_target.svc_id
    );
    // The CSI node drops the path to the destination; the source's stays live.
    let t = std::time::Instant::now();
    loop {
        let paths = kernel_paths(node).await?;
        if paths.lines().count() == 1 && paths.contains(&src_path) && paths.contains("live") {
            break;
        }
        if t.elapsed() > Duration::from_secs(120) {
            return Err(format!(
                "the path to the destination is still there: {paths}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    c.launch(Role::Agent(k)).await.map_err(err("restart"))?;
    yield_to_the_vm(c, k)?;
    eventually(
        c,
        "the migration and its volume gone",
        180,
        Role::Controller(0),
        || async {
            let vols = Api::<liteio_api::AntstorVolume>::namespaced(
                client.clone(),
                keys::DEFAULT_NAMESPACE,
            );
            migration_of(c, vol).await.is_none()
                && vols
                    .list(&kube::api::ListParams::default())
                    .await
                    .is_ok_and(|l| !l.items.iter().any(|v| v.name_any().starts_with("mig-")))
        },
    )
    .await?;
    let src = volume(c, vol).await.ok_or("the source volume is gone")?;
    if !is_ready(&src)
        || src
            .annotations()
            .contains_key(keys::annotations::MIGRATE_ANA_STATE)
    {
        return Err(format!(
            "the source is not serving as before: {:?}",
            src.metadata.annotations
        ));
    }
    if !fio_running(node).await? {
        return Err("fio ended during the cancelled migration".into());
    }
    Ok(())
}

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
            for k in 1..=2 {
                yield_to_the_vm(c, k)?;
            }
            let mut node = vm_node(c, 1, Kernel::Backports).await?;
            let mut csi = liteio_csi::client::connect(&node.csi_endpoint())
                .await
                .map_err(|e| e.to_string())?;
            // 1 GiB: the copy runs for a while, for the destination to be killed during it.
            let id = remote_volume_for(c, "pvc-m", &node.name, 1024 * MIB).await?;
            let v = volume(c, "pvc-m").await.ok_or("pvc-m gone")?;
            let source = v.spec.spdk_target.clone().ok_or("no export")?;
            let secrets = stage_secrets(c, "pvc-m").await?;
            let (staging, target) = ("/tmp/stage/pvc-m", "/tmp/pods/p1/pvc-m");
            stage_and_publish(&mut csi, &id, staging, target, "ext4", secrets).await?;

            // fio with verification, long enough to span both migrations.
            start_fio(&mut node, &format!("{target}/fio.dat"), 1200).await?;

            destination_killed_mid_copy(c, &mut node, "pvc-m").await?;

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
