//! T1: the Node service on a file-engine volume (a sparse file behind a real loop device),
//! with real mkfs and mounts, and the driver's `/metrics` (usage of a published volume,
//! authentication refusals) as `promtool check metrics` sees it. Needs root; prints `SKIP ...` otherwise. The NVMe/TCP path runs
//! against real kernels in the T4 tests (`tests/cluster/tests/t4_kernel_host.rs`: connect with keys,
//! ext4 and xfs, raw block, online grow, key rotation, refusals); the NVMe tests here give
//! the node a fake fabrics device and sysfs for what those kernels cannot show on cue.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{NODE, NS, bounded, start};
use kube::api::{Api, Patch, PatchParams, PostParams};
use liteio_api::auth::VolumeKeys;
use liteio_api::keys::labels;
use liteio_api::{AntstorVolume, AntstorVolumeSpec, KernelLvol, SpdkTarget, VolumeType, naming};
use liteio_csi::csi::volume_capability::access_mode::Mode;
use liteio_csi::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use liteio_csi::csi::*;
use serde_json::json;
use tonic::Code;

const UUID: &str = "6f1c1f0e-8a53-4c3e-9d0b-1e2f3a4b5c6d";

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn mount_cap(fs: &str) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })),
    }
}

fn block_cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

/// What the file engine would have made: a sparse file and a ready volume pointing at it.
async fn file_volume(
    api: &Api<AntstorVolume>,
    dir: &Path,
    name: &str,
    uuid: &str,
    size: u64,
    fs: &str,
) -> PathBuf {
    let file = dir.join("pool/volumes").join(format!("{name}.img"));
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::File::create(&file).unwrap().set_len(size).unwrap();
    let mut v = AntstorVolume::new(name, AntstorVolumeSpec::default());
    v.metadata.namespace = Some(NS.into());
    v.metadata.labels = Some(BTreeMap::from([
        (labels::VOL_UUID.to_string(), uuid.to_string()),
        (labels::FS_TYPE.to_string(), fs.to_string()),
        (labels::PVC_NAME.to_string(), "data".to_string()),
        (labels::PVC_NAMESPACE.to_string(), "app".to_string()),
    ]));
    v.spec.uuid = uuid.into();
    v.spec.size_byte = size;
    v.spec.type_ = Some(VolumeType::KernelLVol);
    v.spec.target_node_id = NODE.into();
    v.spec.kernel_lvol = Some(KernelLvol {
        name: name.into(),
        dev_path: file.display().to_string(),
    });
    api.create(&PostParams::default(), &v).await.unwrap();
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"status": "ready"}})),
    )
    .await
    .unwrap();
    file
}

fn mounted(p: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    liteio_csi::mount::mount_at(&liteio_csi::mount::parse_mountinfo(&text), p).is_some()
}

fn loops(file: &Path) -> String {
    let out = std::process::Command::new("losetup")
        .arg("-j")
        .arg(file)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn stage_req(id: &str, staging: &Path, cap: VolumeCapability) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

fn publish_req(
    id: &str,
    staging: &Path,
    target: &Path,
    cap: VolumeCapability,
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap),
        volume_context: [(
            "csi.storage.k8s.io/pod.name".to_string(),
            "web-0".to_string(),
        )]
        .into(),
        ..Default::default()
    }
}

fn bytes_total(r: &NodeGetVolumeStatsResponse) -> i64 {
    r.usage
        .iter()
        .find(|u| u.unit() == volume_usage::Unit::Bytes)
        .unwrap()
        .total
}

/// CAP_SYS_RESOURCE, which ext4's online resize needs (some sandboxes drop it).
fn has_sys_resource() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("CapEff:"))
                .map(|l| l[7..].trim().to_string())
        })
        .and_then(|h| u64::from_str_radix(&h, 16).ok())
        .is_some_and(|c| c & (1 << 24) != 0)
}

/// stage → publish → write → unpublish → unstage → stage again (data kept, no reformat) →
/// grow the file → NodeExpandVolume → stats show the new size.
async fn lifecycle(fs: &str, size: u64, grow_to: u64) {
    if !is_root() {
        println!("SKIP file_volume_lifecycle {fs}: needs root for loop devices and mounts");
        return;
    }
    let grow = fs != "ext4" || has_sys_resource();
    bounded(async {
        let env = start(false, true, |_| {}).await;
        let dir = env.dir.path().to_path_buf();
        let file = file_volume(&env.volumes(), &dir, "pvc-n", UUID, size, fs).await;
        let staging = dir.join("staging/pvc-n");
        let target = dir.join("pods/p1/volumes/pvc-n");
        let vols = env.volumes();
        let mut node = env.csi.node.clone();
        let n = &mut node;

        n.node_stage_volume(stage_req(UUID, &staging, mount_cap("")))
            .await
            .unwrap();
        assert!(mounted(&staging));
        assert!(
            loops(&file).contains("/dev/loop"),
            "a loop device backs the file"
        );
        // Stage is idempotent.
        n.node_stage_volume(stage_req(UUID, &staging, mount_cap("")))
            .await
            .unwrap();

        n.node_publish_volume(publish_req(UUID, &staging, &target, mount_cap("")))
            .await
            .unwrap();
        std::fs::write(target.join("hello.txt"), b"kept across restages").unwrap();
        let vol = vols.get("pvc-n").await.unwrap();
        let pubp = vol.status.unwrap().csi_node_pub_params.unwrap();
        assert_eq!(pubp.target_path, target.display().to_string());
        assert_eq!(
            pubp.volume_context
                .get("csi.storage.k8s.io/pod.name")
                .map(String::as_str),
            Some("web-0")
        );

        let st = n
            .node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: UUID.into(),
                volume_path: target.display().to_string(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let before = bytes_total(&st);
        assert!(
            before > 0 && before <= i64::try_from(size).unwrap(),
            "{before}"
        );
        assert!(!st.volume_condition.unwrap().abnormal);

        // The published volume's usage on the driver's /metrics, joined with its PV and PVC;
        // promtool has nothing to say about it.
        let text = env.scrape().await;
        let capacity = text
            .lines()
            .find(|l| {
                l.starts_with("liteio_csi_volume_capacity_bytes{")
                    && l.contains(r#"pv="pvc-n""#)
                    && l.contains(&format!(r#"volume="{UUID}""#))
                    && l.contains(r#"pvc="data""#)
                    && l.contains(r#"node="node-1""#)
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
        assert!(capacity.is_some_and(|c| c > 0.0), "{text}");
        match liteio_tests::promtool::check_metrics(&text) {
            Ok(said) => assert_eq!(said, "", "promtool check metrics:\n{said}\n{text}"),
            Err(why) => println!("SKIP promtool check metrics: {why}"),
        }

        n.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: UUID.into(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
        assert!(!target.exists());
        n.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: UUID.into(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
        let unstage = NodeUnstageVolumeRequest {
            volume_id: UUID.into(),
            staging_target_path: staging.display().to_string(),
        };
        n.node_unstage_volume(unstage.clone()).await.unwrap();
        assert!(!mounted(&staging));
        // NodeUnstage returns once the kernel has let the loop device go.
        assert_eq!(loops(&file), "", "the loop device is detached");
        n.node_unstage_volume(unstage.clone()).await.unwrap();

        // Stage again: the filesystem is reused, not reformatted.
        n.node_stage_volume(stage_req(UUID, &staging, mount_cap("")))
            .await
            .unwrap();
        assert_eq!(
            std::fs::read(staging.join("hello.txt")).unwrap(),
            b"kept across restages"
        );
        n.node_publish_volume(publish_req(UUID, &staging, &target, mount_cap("")))
            .await
            .unwrap();

        // The agent grew the file; the node grows the filesystem.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(grow_to)
            .unwrap();
        if grow {
            let r = n
                .node_expand_volume(NodeExpandVolumeRequest {
                    volume_id: UUID.into(),
                    volume_path: target.display().to_string(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(r.capacity_bytes, i64::try_from(grow_to).unwrap());
            let st = n
                .node_get_volume_stats(NodeGetVolumeStatsRequest {
                    volume_id: UUID.into(),
                    volume_path: target.display().to_string(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            let growth = i64::try_from(grow_to - size).unwrap();
            assert!(
                bytes_total(&st) > before + growth * 3 / 4,
                "stats show the new size: {} vs {before}",
                bytes_total(&st)
            );
        } else {
            println!(
                "SKIP ext4 online grow: this process lacks CAP_SYS_RESOURCE (resize2fs needs it)"
            );
        }
        assert_eq!(
            std::fs::read(target.join("hello.txt")).unwrap(),
            b"kept across restages"
        );

        n.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: UUID.into(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
        // An existing but unmounted path is reported as abnormal.
        std::fs::create_dir_all(&target).unwrap();
        let st = n
            .node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: UUID.into(),
                volume_path: target.display().to_string(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(st.volume_condition.unwrap().abnormal);
        n.node_unstage_volume(unstage).await.unwrap();
        assert_eq!(loops(&file), "");
        env.stop().await;
    })
    .await;
}

#[tokio::test]
async fn file_volume_lifecycle_ext4() {
    lifecycle("ext4", 64 << 20, 128 << 20).await;
}

#[tokio::test]
async fn file_volume_lifecycle_xfs() {
    // mkfs.xfs refuses filesystems below 300 MiB; the file stays sparse.
    lifecycle("xfs", 512 << 20, 768 << 20).await;
}

#[tokio::test]
async fn raw_block_volume_is_bind_mounted_onto_a_file() {
    if !is_root() {
        println!("SKIP raw_block_volume: needs root for loop devices and mounts");
        return;
    }
    bounded(async {
        let mut env = start(false, true, |_| {}).await;
        let dir = env.dir.path().to_path_buf();
        let id = "7a1c1f0e-8a53-4c3e-9d0b-1e2f3a4b5c6d";
        let file = file_volume(&env.volumes(), &dir, "pvc-b", id, 16 << 20, "xfs").await;
        let staging = dir.join("staging/pvc-b");
        let target = dir.join("pods/p2/dev/pvc-b");
        let n = &mut env.csi.node;
        n.node_stage_volume(stage_req(id, &staging, block_cap()))
            .await
            .unwrap();
        assert!(!mounted(&staging), "block staging mounts nothing");
        n.node_publish_volume(publish_req(id, &staging, &target, block_cap()))
            .await
            .unwrap();
        use std::os::unix::fs::FileTypeExt;
        assert!(
            std::fs::metadata(&target)
                .unwrap()
                .file_type()
                .is_block_device()
        );
        let st = n
            .node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: id.into(),
                volume_path: target.display().to_string(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(bytes_total(&st), 16 << 20);
        n.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
        assert!(!target.exists());
        n.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .unwrap();
        assert_eq!(loops(&file), "");
        env.stop().await;
    })
    .await;
}

#[tokio::test]
async fn node_bad_requests_and_info() {
    bounded(async {
        let mut env = start(false, true, |c| {
            c.ready_timeout = std::time::Duration::from_millis(300)
        })
        .await;
        let dir = env.dir.path().to_path_buf();
        let n = &mut env.csi.node;
        let info = n
            .node_get_info(NodeGetInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.node_id, NODE);
        assert_eq!(
            info.accessible_topology
                .unwrap()
                .segments
                .get("kubernetes.io/hostname")
                .map(String::as_str),
            Some(NODE)
        );
        let caps = n
            .node_get_capabilities(NodeGetCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(caps.capabilities.len(), 4);

        let e = n
            .node_stage_volume(stage_req("", &dir, mount_cap("")))
            .await
            .unwrap_err();
        assert_eq!(
            (e.code(), e.message()),
            (Code::InvalidArgument, "volume_id: is required")
        );
        let mut r = stage_req(UUID, &dir, mount_cap(""));
        r.staging_target_path.clear();
        let e = n.node_stage_volume(r).await.unwrap_err();
        assert_eq!(
            (e.code(), e.message()),
            (Code::InvalidArgument, "staging_target_path: is required")
        );
        let mut r = stage_req(UUID, &dir, mount_cap(""));
        r.volume_capability = None;
        assert_eq!(
            n.node_stage_volume(r).await.unwrap_err().code(),
            Code::InvalidArgument
        );
        let e = n
            .node_stage_volume(stage_req(UUID, &dir, mount_cap("btrfs")))
            .await
            .unwrap_err();
        assert!(
            e.message().starts_with("volume_capability.mount.fs_type"),
            "{}",
            e.message()
        );
        let e = n
            .node_stage_volume(stage_req(UUID, &dir, mount_cap("")))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        let e = n
            .node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: UUID.into(),
                volume_path: "/nonexistent/x".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        let e = n
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: UUID.into(),
                target_path: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);

        // A volume that never becomes ready: a retryable code, not a hang.
        let api = env.volumes();
        let mut v = AntstorVolume::new("pvc-w", AntstorVolumeSpec::default());
        v.metadata.namespace = Some(NS.into());
        v.metadata.labels = Some(BTreeMap::from([(
            labels::VOL_UUID.to_string(),
            "w-1".to_string(),
        )]));
        v.spec.uuid = "w-1".into();
        v.spec.size_byte = 4 << 20;
        api.create(&PostParams::default(), &v).await.unwrap();
        let e = env
            .csi
            .node
            .node_stage_volume(stage_req("w-1", &dir.join("st"), mount_cap("")))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::DeadlineExceeded, "{}", e.message());
        // Publishing an unstaged volume is a precondition failure.
        api.patch_status(
            "pvc-w",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"status": "ready"}})),
        )
        .await
        .unwrap();
        let e = env
            .csi
            .node
            .node_publish_volume(publish_req(
                "w-1",
                &dir.join("st"),
                &dir.join("t"),
                mount_cap(""),
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
        env.stop().await;
    })
    .await;
}

/// A volume exported over NVMe/TCP by node-2, as the agent leaves it.
async fn nvme_volume(api: &Api<AntstorVolume>, name: &str, uuid: &str) -> SpdkTarget {
    let t = SpdkTarget {
        subsys_nqn: naming::subsys_nqn(uuid),
        svc_id: "4421".into(),
        sn: naming::serial_number(uuid),
        trans_type: "TCP".into(),
        address: "10.0.0.9".into(),
        ..SpdkTarget::default()
    };
    let mut v = AntstorVolume::new(name, AntstorVolumeSpec::default());
    v.metadata.namespace = Some(NS.into());
    v.metadata.labels = Some(BTreeMap::from([(
        labels::VOL_UUID.to_string(),
        uuid.to_string(),
    )]));
    v.spec.uuid = uuid.into();
    v.spec.size_byte = 64 << 20;
    v.spec.target_node_id = "node-2".into();
    v.spec.spdk_target = Some(t.clone());
    api.create(&PostParams::default(), &v).await.unwrap();
    t
}

fn secrets(k: &VolumeKeys) -> std::collections::HashMap<String, String> {
    k.to_secret_data()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
        .collect()
}

/// kubelet's periodic republish (requiresRepublish) of a mounted NVMe/TCP volume with the
/// node-publish Secret: rotated keys reach the controller's sysfs attributes once, an
/// unchanged Secret writes nothing, and neither a bad Secret nor an old kernel fails the
/// publish. The kernel is a fake sysfs tree and the mounts a fake mount table, so this
/// runs without root.
#[tokio::test]
async fn republish_gives_rotated_keys_to_the_connected_controller() {
    bounded(async {
        let mut env = start(false, true, |c| {
            c.mountinfo_path = c.sysfs_root.with_file_name("mountinfo");
        })
        .await;
        let dir = env.dir.path().to_path_buf();
        let t = nvme_volume(&env.volumes(), "pvc-r", "r-1").await;
        let local_file = file_volume(&env.volumes(), &dir, "pvc-l", UUID, 4 << 20, "xfs").await;
        let staging = dir.join("staging/pvc-r");
        let target = dir.join("pods/p1/volumes/pvc-r");
        let local_target = dir.join("pods/p2/volumes/pvc-l");
        std::fs::write(
            dir.join("mountinfo"),
            format!(
                "100 1 259:3 / {} rw,relatime - xfs /dev/nvme3n1 rw\n\
                 101 1 7:0 / {} rw,relatime - xfs /dev/loop0 rw\n",
                target.display(),
                local_target.display()
            ),
        )
        .unwrap();
        // The controller NodeStageVolume connected with k1.
        let k1 = VolumeKeys::generate(false).unwrap();
        let c = dir.join("sys/class/nvme/nvme3");
        std::fs::create_dir_all(c.join("nvme3n1")).unwrap();
        std::fs::write(c.join("serial"), format!("{}    \n", t.sn)).unwrap();
        let host_attr = c.join("dhchap_secret");
        let ctrl_attr = c.join("dhchap_ctrl_secret");
        std::fs::write(&host_attr, format!("{}\n", k1.host.expose())).unwrap();
        std::fs::write(&ctrl_attr, format!("{}\n", k1.ctrl.expose())).unwrap();
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        let age = || {
            for p in [&host_attr, &ctrl_attr] {
                std::fs::File::options()
                    .write(true)
                    .open(p)
                    .unwrap()
                    .set_modified(old)
                    .unwrap();
            }
        };
        let mtime = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
        let republish = |keys: &std::collections::HashMap<String, String>| {
            let mut r = publish_req("r-1", &staging, &target, mount_cap(""));
            r.secrets = keys.clone();
            r
        };
        let n = &mut env.csi.node;

        // The Secret as staged: nothing to write.
        age();
        n.node_publish_volume(republish(&secrets(&k1)))
            .await
            .unwrap();
        assert_eq!(mtime(&host_attr), old);
        assert_eq!(mtime(&ctrl_attr), old);
        // kubectl liteio rotate-keys: the next republish hands k2 to the controller.
        let k2 = VolumeKeys::generate(false).unwrap();
        n.node_publish_volume(republish(&secrets(&k2)))
            .await
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(&host_attr).unwrap(),
            k2.host.expose()
        );
        assert_eq!(
            std::fs::read_to_string(&ctrl_attr).unwrap(),
            k2.ctrl.expose()
        );
        // And the one after writes nothing.
        age();
        n.node_publish_volume(republish(&secrets(&k2)))
            .await
            .unwrap();
        assert_eq!(mtime(&host_attr), old);
        assert_eq!(mtime(&ctrl_attr), old);
        // No Secret (a class without node-publish parameters): nothing written.
        n.node_publish_volume(republish(&Default::default()))
            .await
            .unwrap();
        assert_eq!(mtime(&host_attr), old);
        // A broken Secret is a warning, not a failed publish, and changes nothing.
        let mut bad = secrets(&k1);
        bad.remove("dhchapKey");
        n.node_publish_volume(republish(&bad)).await.unwrap();
        assert_eq!(mtime(&host_attr), old);
        // An old kernel (no dhchap attributes): still published.
        std::fs::remove_file(&host_attr).unwrap();
        std::fs::remove_file(&ctrl_attr).unwrap();
        n.node_publish_volume(republish(&secrets(&k1)))
            .await
            .unwrap();
        assert!(!host_attr.exists() && !ctrl_attr.exists());
        // A local volume has no controller: its keys are not written anywhere.
        let mut r = publish_req(
            UUID,
            &dir.join("staging/pvc-l"),
            &local_target,
            mount_cap(""),
        );
        r.secrets = secrets(&k2);
        n.node_publish_volume(r).await.unwrap();
        assert!(!host_attr.exists());
        assert!(local_file.exists());
        env.stop().await;
    })
    .await;
}

/// A node whose kernel cannot authenticate NVMe/TCP connections (Debian 12's 6.1) is told so
/// at once, naming the kernel, the option it lacks and the way out, instead of the kernel's
/// bare EIO after a connect attempt. The kernel's answers are given (`host_capabilities`);
/// `local/tests/t4_kernel.rs` shows the real 6.1 and 6.12 give them.
#[tokio::test]
async fn a_host_that_cannot_authenticate_is_told_why_at_once() {
    bounded(async {
        let mut env = start(false, true, |c| {
            c.host_capabilities = Some(liteio_csi::nvme::HostCapabilities {
                kernel: "6.1.0-57-amd64".into(),
                dhchap: false,
                tls: false,
                dhchap_evidence: "built without CONFIG_NVME_AUTH (/boot/config-6.1.0-57-amd64)"
                    .into(),
            });
        })
        .await;
        let api = env.volumes();
        nvme_volume(&api, "pvc-a", "a-1").await;
        api.patch_status(
            "pvc-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"status": "ready"}})),
        )
        .await
        .unwrap();
        let staging = env.dir.path().join("staging/pvc-a");
        let mut r = stage_req("a-1", &staging, mount_cap("xfs"));
        r.secrets = secrets(&VolumeKeys::generate(false).unwrap());
        let started = std::time::Instant::now();
        let e = env.csi.node.node_stage_volume(r).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
        for part in [
            "pvc-a",
            "6.1.0-57-amd64",
            "CONFIG_NVME_AUTH",
            "CONFIG_NVME_HOST_AUTH",
            // The StorageClass parameter that would let this host in, and the policy now.
            "liteio.io/host-auth: required",
            "liteio.io/host-auth: preferred",
            "nvmf.auth: none",
        ] {
            assert!(
                e.message().contains(part),
                "{part} missing: {}",
                e.message()
            );
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        // A Warning event on the volume says the same, and holds no key.
        let evs = warnings(&env.client, "pvc-a", "HostCannotAuthenticate").await;
        assert_eq!(evs.len(), 1, "{evs:?}");
        let note = evs[0].note.clone().unwrap_or_default();
        assert!(
            note.contains("6.1.0-57-amd64") && note.contains("liteio.io/host-auth"),
            "{note}"
        );
        assert!(
            !staging.exists() || std::fs::read_dir(&staging).unwrap().next().is_none(),
            "nothing staged"
        );
        // Counted, by reason, on the driver's /metrics; promtool has nothing to say.
        let text = env.scrape().await;
        assert!(
            text.lines()
                .any(|l| l.starts_with("liteio_auth_refusals_total{")
                    && l.contains(r#"node="node-1""#)
                    && l.contains(r#"reason="host_cannot_authenticate""#)
                    && l.ends_with("} 1")),
            "{text}"
        );
        match liteio_tests::promtool::check_metrics(&text) {
            Ok(said) => assert_eq!(said, "", "promtool check metrics:\n{said}\n{text}"),
            Err(why) => println!("SKIP promtool check metrics: {why}"),
        }
        env.stop().await;
    })
    .await;
}

/// Warning events about object `name` with `reason`.
async fn warnings(
    client: &kube::Client,
    name: &str,
    reason: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), NS);
    events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
                && e.type_.as_deref() == Some("Warning")
        })
        .collect()
}

fn kernel_without_auth() -> liteio_csi::nvme::HostCapabilities {
    liteio_csi::nvme::HostCapabilities {
        kernel: "6.1.0-57-amd64".into(),
        dhchap: false,
        tls: false,
        dhchap_evidence: "built without CONFIG_NVME_AUTH (/boot/config-6.1.0-57-amd64)".into(),
    }
}

/// The CSI node tells the control plane what its kernel can do, on its Node, once.
#[tokio::test]
async fn the_kernel_capability_is_published_on_the_node_once() {
    bounded(async {
        let env = start(false, true, |_| {}).await;
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
        let mut n = k8s_openapi::api::core::v1::Node::default();
        n.metadata.name = Some("node-cap".into());
        nodes.create(&PostParams::default(), &n).await.unwrap();
        let caps = kernel_without_auth();
        let wrote = liteio_csi::node::publish_capabilities(&env.client, "node-cap", &caps)
            .await
            .unwrap();
        assert!(wrote);
        let a = nodes
            .get("node-cap")
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap();
        assert_eq!(a["liteio.io/nvme-host-auth"], "none");
        assert_eq!(a["liteio.io/kernel-release"], "6.1.0-57-amd64");
        let again = liteio_csi::node::publish_capabilities(&env.client, "node-cap", &caps)
            .await
            .unwrap();
        assert!(!again, "nothing to write the second time");
        let mut better = caps.clone();
        better.kernel = "6.12.9-amd64".into();
        better.dhchap = true;
        better.tls = true;
        assert!(
            liteio_csi::node::publish_capabilities(&env.client, "node-cap", &better)
                .await
                .unwrap()
        );
        let a = nodes
            .get("node-cap")
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap();
        assert_eq!(a["liteio.io/nvme-host-auth"], "dhchap,tls");
        // A Node that does not exist is an error naming it (the caller logs it).
        let e = liteio_csi::node::publish_capabilities(&env.client, "no-such-node", &caps)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no-such-node"), "{e}");
        env.stop().await;
    })
    .await;
}

/// `liteio.io/host-auth: preferred` on a kernel without DH-HMAC-CHAP: NodeStage is not
/// refused; it waits until the agent's export admits this host by its NQN alone
/// (`obnvmf/hosts-without-auth`), then connects without keys. Meanwhile it has published
/// the Node's annotation the agent decides from.
#[tokio::test]
async fn a_preferred_volume_is_connected_without_keys_once_the_export_admits_the_host() {
    bounded(async {
        let mut env = start(false, true, |c| {
            c.host_capabilities = Some(kernel_without_auth());
            c.ready_timeout = std::time::Duration::from_millis(500);
        })
        .await;
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
        let mut n = k8s_openapi::api::core::v1::Node::default();
        n.metadata.name = Some(NODE.into());
        nodes.create(&PostParams::default(), &n).await.unwrap();
        let api = env.volumes();
        nvme_volume(&api, "pvc-p", "p-1").await;
        api.patch(
            "pvc-p",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hostAuth": "preferred"}})),
        )
        .await
        .unwrap();
        api.patch_status(
            "pvc-p",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"status": "ready"}})),
        )
        .await
        .unwrap();
        let staging = env.dir.path().join("staging/pvc-p");
        let keys = VolumeKeys::generate(false).unwrap();
        let mut r = stage_req("p-1", &staging, mount_cap("xfs"));
        r.secrets = secrets(&keys);
        let e = env.csi.node.node_stage_volume(r.clone()).await.unwrap_err();
        assert_eq!(e.code(), Code::DeadlineExceeded, "{}", e.message());
        for part in [
            "pvc-p",
            "obnvmf/hosts-without-auth",
            "liteio.io/nvme-host-auth",
            "6.1.0-57-amd64",
        ] {
            assert!(
                e.message().contains(part),
                "{part} missing: {}",
                e.message()
            );
        }
        assert!(
            warnings(&env.client, "pvc-p", "HostCannotAuthenticate")
                .await
                .is_empty()
        );
        // The Node says what this kernel can do (published again at NodeStage: the Node did
        // not exist when the driver started).
        let a = nodes.get(NODE).await.unwrap().metadata.annotations.unwrap();
        assert_eq!(a["liteio.io/nvme-host-auth"], "none");
        // The agent admits this host without keys: the stage goes on to connect, without keys.
        let hostnqn = liteio_csi::nvme::host_nqn(&env.dir.path().join("hostnqn"), NODE).unwrap();
        api.patch(
            "pvc-p",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"obnvmf/hosts-without-auth": hostnqn}}}),
            ),
        )
        .await
        .unwrap();
        let e = env.csi.node.node_stage_volume(r).await.unwrap_err();
        // This machine has no NVMe/TCP host: the plain `nvme connect` (no keys, no
        // /dev/nvme-fabrics write) is what fails, not a refusal.
        assert_ne!(e.code(), Code::FailedPrecondition, "{}", e.message());
        assert!(e.message().contains("nvme connect"), "{}", e.message());
        for key in [keys.host.expose(), keys.ctrl.expose()] {
            assert!(!e.message().contains(key));
        }
        env.stop().await;
    })
    .await;
}
