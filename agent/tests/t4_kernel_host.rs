//! T4: the Linux kernel's own NVMe/TCP host against the agent's embedded SPDK target. A
//! one-machine cluster with one storage node (network namespace, SPDK engine) and a compute
//! node that is a microVM with Debian 12's backports kernel (6.12, DH-HMAC-CHAP), its CSI node
//! plugin driven as kubelet drives it:
//!
//! - NodeStageVolume connects with the kernel through `/dev/nvme-fabrics` and the
//!   node-stage secret's keys (no key on a command line), formats ext4 and mounts it;
//!   NodePublishVolume bind-mounts it; data written, unstaged, staged again, read back.
//! - ControllerExpandVolume + NodeExpandVolume grow the mounted ext4 online.
//! - NodeGetVolumeStats answers for the mounted volume.
//! - A wrong key and no key are refused with a clear CSI error, and leave nothing behind.
//! - The storage node's agent SIGKILLed and restarted under fio (verified random writes on
//!   the mounted ext4): the kernel reconnects, fio sees no error; the stall is printed.
//! - NodeUnpublish/NodeUnstage leave no controller, no mount, no `/dev/nvme*`.
//!
//! Needs SPDK (the agent's `spdk` feature), root, network namespaces and a bootable VM;
//! elsewhere it prints one `SKIP` line.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../local/tests/cluster_common/mod.rs"]
mod cluster_common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use cluster_common::*;
use liteio_csi::csi::*;
use liteio_local::Engine;
use liteio_local::cluster::{ClusterOptions, Role};
use liteio_local::demo::mount_capability;
use liteio_local::vm::Kernel;
use liteio_local::vm_node::VmNode;
use tonic::Code;

const STEP: Duration = Duration::from_secs(120);

/// What of the volume is left on the guest: NVMe controllers, nvme devices, mounts of `path`.
async fn leftovers(node: &mut VmNode, paths: &[&str]) -> String {
    let mut script =
        String::from("ls /sys/class/nvme 2>/dev/null; ls /dev | grep -E '^nvme[0-9]';");
    for p in paths {
        script.push_str(&format!(" grep -F ' {p} ' /proc/mounts;"));
    }
    script.push_str(" true");
    node.vm
        .sh(&script, STEP)
        .await
        .unwrap()
        .output
        .trim()
        .to_string()
}

/// The size of the file system mounted at `path` in the guest, in bytes.
async fn fs_size(node: &mut VmNode, path: &str) -> Result<u64, String> {
    let out = node
        .vm
        .sh_ok(&format!("df --output=size -B1 {path} | tail -n 1"), STEP)
        .await
        .map_err(|e| e.to_string())?;
    out.trim()
        .parse()
        .map_err(|e| format!("df said {out:?}: {e}"))
}

#[test]
fn the_kernel_nvme_tcp_host_stages_an_spdk_volume() {
    if skip_vm("t4 kernel host", &Kernel::Backports) {
        return;
    }
    let dir = scratch("t4-kernel-host");
    let mut opts = ClusterOptions::new(1, Engine::Spdk);
    opts.pool_bytes = 2 << 30;
    with_cluster(&dir, opts, Duration::from_secs(1200), |c| {
        Box::pin(async move {
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
            let mut ctl = liteio_csi::client::connect(&c.csi_controller_endpoint())
                .await
                .map_err(|e| e.to_string())?;

            // A volume for vm-1, stored on node-1.
            let id = remote_volume_for(c, "pvc-k", &node.name, 256 * MIB).await?;
            let secrets = stage_secrets(c, "pvc-k").await?;
            assert!(
                secrets
                    .keys()
                    .any(|k| k.contains("dhchap") || k.contains("key")),
                "{:?}",
                secrets.keys()
            );
            let (staging, target) = ("/tmp/stage/pvc-k", "/tmp/pods/p1/pvc-k");
            let stage_req = |secrets: HashMap<String, String>| NodeStageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: staging.into(),
                volume_capability: Some(mount_capability("ext4")),
                secrets,
                ..Default::default()
            };

            // Refused: no key, a wrong key. Nothing is left of the attempts.
            let e = csi
                .node
                .node_stage_volume(stage_req(HashMap::new()))
                .await
                .unwrap_err();
            println!("no key: {:?}: {}", e.code(), e.message());
            assert_ne!(e.code(), Code::Ok);
            let mut wrong = secrets.clone();
            let other = liteio_api::auth::VolumeKeys::generate(false)
                .unwrap()
                .to_secret_data();
            for (k, v) in other {
                wrong.insert(k, String::from_utf8(v.0).unwrap());
            }
            let e = csi
                .node
                .node_stage_volume(stage_req(wrong))
                .await
                .unwrap_err();
            println!("wrong key: {:?}: {}", e.code(), e.message());
            assert_ne!(e.code(), Code::Ok);
            let left = leftovers(&mut node, &[staging]).await;
            assert!(left.is_empty(), "refused attempts left: {left}");

            // Staged with the kernel and the right keys, published, written.
            let t = Instant::now();
            csi.node
                .node_stage_volume(stage_req(secrets.clone()))
                .await
                .map_err(|e| format!("stage: {}", e.message()))?;
            println!(
                "staged (kernel connect with DH-HMAC-CHAP, mkfs.ext4, mount) in {:.2}s",
                t.elapsed().as_secs_f64()
            );
            let publish = NodePublishVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: staging.into(),
                target_path: target.into(),
                volume_capability: Some(mount_capability("ext4")),
                secrets: secrets.clone(),
                ..Default::default()
            };
            csi.node
                .node_publish_volume(publish.clone())
                .await
                .map_err(|e| format!("publish: {}", e.message()))?;
            let subsys = node
                .vm
                .sh_ok("cat /sys/class/nvme/nvme*/subsysnqn; cat /sys/class/nvme/nvme*/dhchap_secret 2>/dev/null | cut -c1-10; findmnt -no FSTYPE,SOURCE /tmp/pods/p1/pvc-k", STEP)
                .await
                .map_err(|e| e.to_string())?;
            println!("guest: {subsys}");
            assert!(
                subsys.contains("ext4") && subsys.contains("/dev/nvme"),
                "{subsys}"
            );
            assert!(
                subsys.contains("DHHC-1:"),
                "the controller authenticated: {subsys}"
            );
            node.vm
                .sh_ok(&format!("head -c 8M /dev/urandom > /tmp/data && cp /tmp/data {target}/data && sync && sha256sum < /tmp/data > /tmp/data.sum"), STEP)
                .await
                .map_err(|e| e.to_string())?;

            // Unpublish, unstage: nothing left; stage and publish again: the data is there.
            let unpublish = NodeUnpublishVolumeRequest {
                volume_id: id.clone(),
                target_path: target.into(),
            };
            let unstage = NodeUnstageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: staging.into(),
            };
            csi.node
                .node_unpublish_volume(unpublish.clone())
                .await
                .map_err(|e| e.message().to_string())?;
            csi.node
                .node_unstage_volume(unstage.clone())
                .await
                .map_err(|e| e.message().to_string())?;
            let left = leftovers(&mut node, &[staging, target]).await;
            assert!(left.is_empty(), "unstage left: {left}");
            csi.node
                .node_stage_volume(stage_req(secrets.clone()))
                .await
                .map_err(|e| format!("restage: {}", e.message()))?;
            csi.node
                .node_publish_volume(publish.clone())
                .await
                .map_err(|e| format!("republish: {}", e.message()))?;
            node.vm
                .sh_ok(
                    &format!("sha256sum < {target}/data | cmp - /tmp/data.sum"),
                    STEP,
                )
                .await
                .map_err(|e| format!("data after restaging: {e}"))?;

            // Online growth: the controller's expand, the storage node grows the lvol, the
            // kernel sees the namespace grow, resize2fs grows the mounted ext4.
            let before = fs_size(&mut node, target).await?;
            ctl.controller
                .controller_expand_volume(ControllerExpandVolumeRequest {
                    volume_id: id.clone(),
                    capacity_range: Some(CapacityRange {
                        required_bytes: 512 * MIB,
                        limit_bytes: 0,
                    }),
                    ..Default::default()
                })
                .await
                .map_err(|e| format!("controller expand: {}", e.message()))?;
            let t = Instant::now();
            csi.node
                .node_expand_volume(NodeExpandVolumeRequest {
                    volume_id: id.clone(),
                    volume_path: target.into(),
                    staging_target_path: staging.into(),
                    capacity_range: Some(CapacityRange {
                        required_bytes: 512 * MIB,
                        limit_bytes: 0,
                    }),
                    volume_capability: Some(mount_capability("ext4")),
                    ..Default::default()
                })
                .await
                .map_err(|e| format!("node expand: {}", e.message()))?;
            let after = fs_size(&mut node, target).await?;
            println!(
                "ext4 grown online {before} → {after} bytes in {:.2}s",
                t.elapsed().as_secs_f64()
            );
            assert!(after > before + 200 * MIB as u64, "{before} → {after}");
            node.vm
                .sh_ok(
                    &format!("sha256sum < {target}/data | cmp - /tmp/data.sum"),
                    STEP,
                )
                .await
                .map_err(|e| format!("data after growing: {e}"))?;

            let stats = csi
                .node
                .node_get_volume_stats(NodeGetVolumeStatsRequest {
                    volume_id: id.clone(),
                    volume_path: target.into(),
                    staging_target_path: staging.into(),
                })
                .await
                .map_err(|e| format!("stats: {}", e.message()))?
                .into_inner();
            let total = stats
                .usage
                .iter()
                .find(|u| u.unit == volume_usage::Unit::Bytes as i32)
                .map_or(0, |u| u.total);
            assert!(total as u64 > 400 * MIB as u64, "{stats:?}");

            // The storage node's agent (and its NVMe/TCP target) SIGKILLed and started again
            // under fio writing with verification on the mounted ext4: the kernel reconnects
            // (reconnect-delay 2 s, ctrl-loss-tmo 10 s), fio sees no error, verify passes.
            start_fio(&mut node, &format!("{target}/fio.dat"), 25).await?;
            // Still writing when the agent goes.
            assert!(
                fio_running(&mut node).await?,
                "fio ended before the agent was killed"
            );
            c.kill(Role::Agent(1)).await.map_err(|e| e.to_string())?;
            let t = Instant::now();
            c.launch(Role::Agent(1)).await.map_err(|e| e.to_string())?;
            println!(
                "agent killed and ready again after {:.2}s",
                t.elapsed().as_secs_f64()
            );
            // Seen once in five runs: fio did not finish (the error says what the kernel did).
            let fio = fio_result(&mut node, Duration::from_secs(180)).await?;
            println!(
                "fio across the agent restart: error {}, {} writes, longest write {:.0} ms; guest:\n{}",
                fio.error, fio.writes, fio.max_write_ms, fio.log
            );
            assert_eq!(
                fio.error, 0,
                "fio saw an I/O error across the restart: {}",
                fio.log
            );
            assert!(fio.writes > 0);
            assert!(
                !fio.log.contains("verify: bad") && !fio.log.contains("verify failed"),
                "{}",
                fio.log
            );

            csi.node
                .node_unpublish_volume(unpublish)
                .await
                .map_err(|e| e.message().to_string())?;
            csi.node
                .node_unstage_volume(unstage)
                .await
                .map_err(|e| e.message().to_string())?;
            let left = leftovers(&mut node, &[staging, target]).await;
            assert!(left.is_empty(), "the final unstage left: {left}");
            ctl.controller
                .delete_volume(DeleteVolumeRequest {
                    volume_id: id.clone(),
                    ..Default::default()
                })
                .await
                .map_err(|e| e.message().to_string())?;
            node.vm.shutdown().await;
            Ok(())
        })
    });
}
