//! T4: the LVM engine under the whole stack. A storage node that is a microVM with Debian
//! 12's stock kernel (6.1: device-mapper, which this machine's kernel lacks) runs the
//! disk-agent with LiteIO's KernelLVM pool (a VG on two loop-backed PVs, from LiteIO's
//! agent config) and the CSI node plugin; the API server, controller and CSI controller
//! run on the host. Through CSI, as kubelet and the external provisioner drive it:
//!
//! - a volume placed on the VM (`positionAdvice: MustLocal`) becomes a logical volume,
//!   staged from its device (no NVMe-oF), formatted ext4 and mounted;
//! - a snapshot (a copy-on-write LV), writes after it, then a merge-restore (LiteIO's
//!   `obnmvf/merge-start-timestamp` label) brings back what the snapshot held;
//! - ControllerExpand + NodeExpand grow the mounted ext4 online (lvextend, resize2fs);
//! - the agent SIGKILLed and started again: the pool comes back, the mounted volume is
//!   untouched and still served;
//! - unstage, delete: no LV, no mount left.
//!
//! Prints `SKIP …` where no VM can boot or no network namespace can be made.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams};
use liteio_api::AntstorSnapshot;
use liteio_api::keys::{self, labels};
use liteio_api::snapshot::SnapshotStatusName;
use liteio_cluster_tests::*;
use liteio_csi::csi::*;
use liteio_local::Engine;
use liteio_local::cluster::{ClusterOptions, Role};
use liteio_local::demo::mount_capability;
use liteio_local::vm::Kernel;
use liteio_local::vm_node::{LVM_VG, VmNode};
use serde_json::json;

const STEP: Duration = Duration::from_secs(120);

/// Runs `script` in the guest; LVM's tools are told not to warn about the command
/// channel's descriptors they inherit.
async fn guest(node: &mut VmNode, script: &str) -> Result<String, String> {
    node.vm
        .sh_ok(
            &format!("export LVM_SUPPRESS_FD_WARNINGS=1; {script}"),
            STEP,
        )
        .await
        .map_err(|e| e.to_string())
}

async fn snapshot_status(
    c: &liteio_local::cluster::Cluster,
    name: &str,
) -> Option<SnapshotStatusName> {
    let api: Api<AntstorSnapshot> = Api::namespaced(c.kube().await.ok()?, keys::DEFAULT_NAMESPACE);
    api.get_opt(name)
        .await
        .ok()
        .flatten()?
        .status
        .map(|s| s.status)
}

#[test]
fn the_lvm_engine_under_the_whole_stack() {
    if skip_vm("t4 lvm node", &Kernel::Stock) {
        return;
    }
    let dir = scratch("t4-lvm-node");
    with_cluster(
        &dir,
        ClusterOptions::new(1, Engine::File),
        Duration::from_secs(1200),
        |c| {
            Box::pin(async move {
                let mut node = c
                    .add_vm_storage_node(1, Kernel::Stock, 256 << 20)
                    .await
                    .map_err(|e| e.to_string())?;
                println!(
                    "storage VM {} at {} (boot {:.1}s)",
                    node.name,
                    node.address,
                    node.vm.booted_in().as_secs_f64()
                );
                let pvs = guest(&mut node, "pvs --noheadings -o pv_name,vg_name").await?;
                println!("PVs: {}", pvs.trim());
                assert!(pvs.contains(LVM_VG) && pvs.contains("/dev/loop"), "{pvs}");
                let mut csi = liteio_csi::client::connect(&node.csi_endpoint())
                    .await
                    .map_err(|e| e.to_string())?;
                let mut ctl = liteio_csi::client::connect(&c.csi_controller_endpoint())
                    .await
                    .map_err(|e| e.to_string())?;

                // A volume on the VM's VG, staged from the LV's device.
                let params =
                    HashMap::from([("positionAdvice".to_string(), "MustLocal".to_string())]);
                let id =
                    create_volume_sized(c, "pvc-l", Some(node.name.clone()), params, 128 * MIB)
                        .await
                        .map_err(err("join"))??;
                eventually(c, "pvc-l ready", 120, Role::Controller(0), || async {
                    volume(c, "pvc-l").await.is_some_and(|v| is_ready(&v))
                })
                .await?;
                let v = volume(c, "pvc-l").await.ok_or("pvc-l gone")?;
                assert_eq!(v.spec.target_node_id, node.name);
                let lv = v
                    .spec
                    .kernel_lvol
                    .clone()
                    .ok_or("the volume has no LV (spec.kernelLvol)")?;
                println!("pvc-l is LV {} at {}", lv.name, lv.dev_path);
                let lvs = guest(
                    &mut node,
                    "lvs --noheadings -o lv_name,vg_name,lv_size --units b",
                )
                .await?;
                assert!(lvs.contains(&lv.name) && lvs.contains(LVM_VG), "{lvs}");

                let (staging, target) = ("/tmp/stage/pvc-l", "/tmp/pods/p1/pvc-l");
                let stage = NodeStageVolumeRequest {
                    volume_id: id.clone(),
                    staging_target_path: staging.into(),
                    volume_capability: Some(mount_capability("ext4")),
                    ..Default::default()
                };
                let publish = NodePublishVolumeRequest {
                    volume_id: id.clone(),
                    staging_target_path: staging.into(),
                    target_path: target.into(),
                    volume_capability: Some(mount_capability("ext4")),
                    ..Default::default()
                };
                let unpublish = NodeUnpublishVolumeRequest {
                    volume_id: id.clone(),
                    target_path: target.into(),
                };
                let unstage = NodeUnstageVolumeRequest {
                    volume_id: id.clone(),
                    staging_target_path: staging.into(),
                };
                csi.node
                    .node_stage_volume(stage.clone())
                    .await
                    .map_err(|e| format!("stage: {}", e.message()))?;
                csi.node
                    .node_publish_volume(publish.clone())
                    .await
                    .map_err(|e| format!("publish: {}", e.message()))?;
                let src = guest(&mut node, &format!("findmnt -no FSTYPE,SOURCE {staging}")).await?;
                println!("staged: {}", src.trim());
                assert!(src.contains("ext4") && !src.contains("nvme"), "{src}");
                guest(
                    &mut node,
                    &format!("head -c 4M /dev/urandom > /tmp/a && cp /tmp/a {target}/a && sync"),
                )
                .await?;

                // Snapshot, writes after it, merge-restore with the volume unstaged.
                let snap = ctl
                    .controller
                    .create_snapshot(CreateSnapshotRequest {
                        source_volume_id: id.clone(),
                        name: "snap-l".into(),
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| format!("CreateSnapshot: {}", e.message()))?
                    .into_inner()
                    .snapshot
                    .ok_or("CreateSnapshot returned no snapshot")?;
                eventually(c, "snap-l ready", 60, Role::Controller(0), || async {
                    snapshot_status(c, "snap-l").await == Some(SnapshotStatusName::Ready)
                })
                .await?;
                let lvs = guest(&mut node, "lvs --noheadings -o lv_name,lv_attr,origin").await?;
                println!("LVs with the snapshot:\n{lvs}");
                let is_snapshot_of_lv = |l: &str| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.len() == 3 && f[1].starts_with('s') && f[2] == lv.name
                };
                assert!(
                    lvs.lines().any(is_snapshot_of_lv),
                    "no snapshot LV of {}: {lvs}",
                    lv.name
                );
                guest(
                    &mut node,
                    &format!(
                        "head -c 4M /dev/urandom > {target}/a && echo after > {target}/b && sync"
                    ),
                )
                .await?;
                csi.node
                    .node_unpublish_volume(unpublish.clone())
                    .await
                    .map_err(|e| e.message().to_string())?;
                csi.node
                    .node_unstage_volume(unstage.clone())
                    .await
                    .map_err(|e| e.message().to_string())?;
                let snaps: Api<AntstorSnapshot> = Api::namespaced(
                    c.kube().await.map_err(err("kube"))?,
                    keys::DEFAULT_NAMESPACE,
                );
                snaps
                    .patch(
                        "snap-l",
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"labels": {
                            labels::MERGE_START_TIMESTAMP: k8s_openapi::jiff::Timestamp::now().as_second().to_string()
                        }}})),
                    )
                    .await
                    .map_err(err("label the snapshot for a merge"))?;
                eventually(c, "snap-l merged", 120, Role::Controller(0), || async {
                    snapshot_status(c, "snap-l").await == Some(SnapshotStatusName::Merged)
                })
                .await?;
                csi.node
                    .node_stage_volume(stage.clone())
                    .await
                    .map_err(|e| format!("stage after the merge: {}", e.message()))?;
                csi.node
                    .node_publish_volume(publish.clone())
                    .await
                    .map_err(|e| format!("publish after the merge: {}", e.message()))?;
                guest(
                    &mut node,
                    &format!("cmp /tmp/a {target}/a && test ! -e {target}/b"),
                )
                .await
                .map_err(|e| format!("the merge did not bring back the snapshot's data: {e}"))?;
                println!("merge-restore: the snapshot's data is back, the later write gone");

                // Online growth of the mounted ext4.
                let (before, after, _) = grow_online(
                    &mut node,
                    &mut ctl,
                    &mut csi,
                    &id,
                    staging,
                    target,
                    "ext4",
                    256 * MIB,
                )
                .await?;
                println!("ext4 on the LV grown online {before} → {after} bytes");
                assert!(after > before + 100 * MIB as u64, "{before} → {after}");

                // The agent crashes and comes back: the pool and the mounted volume are as
                // they were.
                node.restart_agent(c).await.map_err(|e| e.to_string())?;
                eventually(
                    c,
                    "pvc-l ready after the agent's restart",
                    60,
                    Role::Controller(0),
                    || async { volume(c, "pvc-l").await.is_some_and(|v| is_ready(&v)) },
                )
                .await?;
                guest(
                    &mut node,
                    &format!(
                        "cmp /tmp/a {target}/a && echo again > {target}/c && sync && cat {target}/c"
                    ),
                )
                .await
                .map_err(|e| format!("the volume after the agent's restart: {e}"))?;

                // Gone without a trace.
                csi.node
                    .node_unpublish_volume(unpublish)
                    .await
                    .map_err(|e| e.message().to_string())?;
                csi.node
                    .node_unstage_volume(unstage)
                    .await
                    .map_err(|e| e.message().to_string())?;
                ctl.controller
                    .delete_snapshot(DeleteSnapshotRequest {
                        snapshot_id: snap.snapshot_id,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| format!("DeleteSnapshot: {}", e.message()))?;
                ctl.controller
                    .delete_volume(DeleteVolumeRequest {
                        volume_id: id.clone(),
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| format!("DeleteVolume: {}", e.message()))?;
                eventually(c, "pvc-l gone", 60, Role::Controller(0), || async {
                    volume(c, "pvc-l").await.is_none()
                })
                .await?;
                let left = guest(
                    &mut node,
                    &format!("lvs --noheadings -o lv_name {LVM_VG}; grep -E ' {staging} | {target} ' /proc/mounts; true"),
                )
                .await?;
                assert!(left.trim().is_empty(), "left behind: {left}");
                node.vm.shutdown().await;
                Ok(())
            })
        },
    )
}
