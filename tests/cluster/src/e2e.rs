//! The end-to-end scenario shared by T1 (test API server) and T2 (a real kube-apiserver):
//! every component as its own process, on the file engine over a reflink-capable XFS:
//! create through CSI → scheduled → ready → staged and published → data → expand → snapshot
//! → clone → unpublish/unstage → delete everything → nothing left (objects, files, mounts,
//! loop devices). Each component is killed (SIGKILL) and restarted once during the run; the
//! API server too when it is ours (the test API server keeps its state in a file, as
//! kube-apiserver does in etcd).

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::Api;
use kube::api::ListParams;
use liteio_api::{AntstorSnapshot, AntstorVolume, StoragePool, keys, naming};
use liteio_csi::csi::volume_content_source::{SnapshotSource, Type as SourceType};
use liteio_csi::csi::{
    CapacityRange, ControllerExpandVolumeRequest, CreateSnapshotRequest, CreateVolumeRequest,
    DeleteSnapshotRequest, DeleteVolumeRequest, NodeExpandVolumeRequest, NodePublishVolumeRequest,
    NodeStageVolumeRequest, NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, Topology,
    TopologyRequirement, VolumeContentSource,
};
use liteio_local::demo::mount_capability;
use liteio_local::poolfs::XfsImage;
use liteio_local::{ApiSource, Component, Engine, Local};

use crate::bin_dir;

const MIB: i64 = 1 << 20;

fn write_synced(path: &Path, data: &[u8]) -> Result<(), String> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| e.to_string())?;
    f.write_all(data)
        .and_then(|()| f.sync_all())
        .map_err(|e| e.to_string())
}

fn leftovers(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let d = dir.display().to_string();
    if let Ok(m) = std::fs::read_to_string("/proc/self/mountinfo") {
        out.extend(
            m.lines()
                .filter(|l| l.contains(&format!("{d}/")))
                .map(|l| format!("mount: {l}")),
        );
    }
    if let Ok(o) = Command::new("losetup").arg("-a").output() {
        out.extend(
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.contains(&d))
                .map(|l| format!("loop: {l}")),
        );
    }
    for sub in ["pool/volumes", "pool/snapshots"] {
        if let Ok(rd) = std::fs::read_dir(dir.join(sub)) {
            out.extend(
                rd.flatten()
                    .map(|e| format!("file: {}", e.path().display())),
            );
        }
    }
    out
}

/// The volume's Secret as kubelet hands it to NodeStageVolume (a string map); its keys are
/// added to `seen`.
async fn stage_secrets(
    client: &kube::Client,
    csi_name: &str,
    seen: &mut Vec<String>,
) -> Result<HashMap<String, String>, String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let name = naming::auth_secret(csi_name);
    let s = secrets
        .get(&name)
        .await
        .map_err(|x| format!("the CSI controller made no Secret {name}: {x}"))?;
    let map: HashMap<String, String> = s
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect();
    let keys = liteio_api::auth::VolumeKeys::from_string_map(&map).map_err(|x| x.to_string())?;
    seen.push(keys.host.expose().to_string());
    seen.push(keys.ctrl.expose().to_string());
    Ok(map)
}

/// One end-to-end run against `api`, as node `node`; `tag` makes the names of this run's
/// objects unique (a real cluster keeps what earlier runs left).
pub fn run_e2e(api: ApiSource, node: &str, tag: &str) {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"));
    let xfs = Command::new("mkfs.xfs")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !root || !xfs {
        println!("SKIP e2e: needs root and mkfs.xfs (loop devices, mounts)");
        return;
    }
    for b in ["node-disk-controller", "disk-agent", "csi-driver"] {
        assert!(
            bin_dir().join(b).exists(),
            "{b} is not built in {}; run cargo build --workspace first",
            bin_dir().display()
        );
    }
    let base = std::env::temp_dir().join(format!("liteio-e2e-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&base).unwrap();
    let mount = XfsImage::scratch(&base, 3 << 30).expect("cannot make the XFS pool filesystem");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let result = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(300),
            scenario(&mount.dir, api, node, tag),
        )
        .await
        .expect("e2e timed out")
    });
    let left = leftovers(&mount.dir);
    if result.is_err() {
        println!("{}", liteio_local::log_tails(&mount.dir, 40));
    }
    drop(mount);
    let _ = std::fs::remove_dir_all(&base);
    result.unwrap();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

async fn scenario(dir: &Path, api: ApiSource, node: &str, tag: &str) -> Result<(), String> {
    if api == ApiSource::Test && !bin_dir().join("test-apiserver").exists() {
        return Err(format!(
            "test-apiserver is not built in {}",
            bin_dir().display()
        ));
    }
    let mut local = Local::start_with(dir, &bin_dir(), node, Engine::File, api)
        .await
        .map_err(|e| format!("{e}"))?;
    let out = steps(&mut local, dir, tag).await;
    // Our API server goes with everything in it. A real one keeps the node's objects: they
    // are deleted while the controller still runs (it releases the pool's finalizer).
    let forgotten = if local.api == ApiSource::Test {
        Ok(())
    } else {
        local.stop_component(Component::Csi).await;
        local.stop_component(Component::Agent).await;
        forget_node(&local).await
    };
    local.stop().await;
    out.and(forgotten)
}

/// After the run on a real cluster: the node's StoragePool, Lease and Node go too.
async fn forget_node(local: &Local) -> Result<(), String> {
    let client = local.kube().await.map_err(|x| x.to_string())?;
    let dp = kube::api::DeleteParams::default();
    let pools: Api<StoragePool> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let leases: Api<Lease> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let nodes: Api<Node> = Api::all(client);
    let gone = |r: Result<(), kube::Error>| match r {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.to_string()),
    };
    gone(pools.delete(&local.node, &dp).await.map(drop))?;
    gone(leases.delete(&local.node, &dp).await.map(drop))?;
    gone(nodes.delete(&local.node, &dp).await.map(drop))?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while pools
        .get_opt(&local.node)
        .await
        .map_err(|x| x.to_string())?
        .is_some()
    {
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "StoragePool {} is still there after 30 s",
                local.node
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

async fn steps(local: &mut Local, dir: &Path, tag: &str) -> Result<(), String> {
    let e = |what: &'static str| {
        move |err: tonic::Status| format!("{what}: {} ({:?})", err.message(), err.code())
    };
    let mut csi = liteio_csi::client::connect(&local.csi_endpoint())
        .await
        .map_err(|x| x.to_string())?;
    let topo = Topology {
        segments: HashMap::from([(keys::labels::KUBE_HOSTNAME.to_string(), local.node.clone())]),
    };
    let req = TopologyRequirement {
        requisite: vec![topo.clone()],
        preferred: vec![topo],
    };
    let vol = csi
        .controller
        .create_volume(CreateVolumeRequest {
            name: format!("pvc-e2e-a-{tag}"),
            capacity_range: Some(CapacityRange {
                required_bytes: 512 * MIB,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![mount_capability("xfs")],
            accessibility_requirements: Some(req.clone()),
            ..Default::default()
        })
        .await
        .map_err(e("CreateVolume a"))?
        .into_inner()
        .volume
        .ok_or("no volume")?;

    // The controller crashes and comes back; nothing changes for the volume.
    local
        .crash_and_restart(Component::Controller)
        .await
        .map_err(|x| x.to_string())?;

    let stage_a = dir.join("staging/a");
    let pub_a = dir.join("mnt/a");
    std::fs::create_dir_all(&stage_a).map_err(|x| x.to_string())?;
    std::fs::create_dir_all(dir.join("mnt")).map_err(|x| x.to_string())?;
    // kubelet hands the CSI node the volume's Secret (the StorageClass's node-stage
    // secret), which the CSI controller made at CreateVolume.
    let client = local.kube().await.map_err(|x| x.to_string())?;
    let mut seen_keys = Vec::new();
    let secrets_a = stage_secrets(&client, &format!("pvc-e2e-a-{tag}"), &mut seen_keys).await?;
    let stage = |id: &str,
                 ctx: &HashMap<String, String>,
                 s: &Path,
                 secrets: &HashMap<String, String>| NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: s.display().to_string(),
        volume_capability: Some(mount_capability("xfs")),
        volume_context: ctx.clone(),
        secrets: secrets.clone(),
        ..Default::default()
    };
    let publish =
        |id: &str, ctx: &HashMap<String, String>, s: &Path, t: &Path| NodePublishVolumeRequest {
            volume_id: id.into(),
            staging_target_path: s.display().to_string(),
            target_path: t.display().to_string(),
            volume_capability: Some(mount_capability("xfs")),
            volume_context: ctx.clone(),
            ..Default::default()
        };
    csi.node
        .node_stage_volume(stage(
            &vol.volume_id,
            &vol.volume_context,
            &stage_a,
            &secrets_a,
        ))
        .await
        .map_err(e("stage a"))?;
    csi.node
        .node_publish_volume(publish(
            &vol.volume_id,
            &vol.volume_context,
            &stage_a,
            &pub_a,
        ))
        .await
        .map_err(e("publish a"))?;
    // A snapshot is crash-consistent: what the application has synced is in it.
    write_synced(&pub_a.join("data.txt"), b"written before the snapshot\n")?;

    // The agent crashes and comes back.
    local
        .crash_and_restart(Component::Agent)
        .await
        .map_err(|x| x.to_string())?;

    // Expand online.
    let grown = csi
        .controller
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: vol.volume_id.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: 768 * MIB,
                limit_bytes: 0,
            }),
            volume_capability: Some(mount_capability("xfs")),
            ..Default::default()
        })
        .await
        .map_err(e("ControllerExpandVolume"))?
        .into_inner();
    if grown.node_expansion_required {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let r = csi
                .node
                .node_expand_volume(NodeExpandVolumeRequest {
                    volume_id: vol.volume_id.clone(),
                    volume_path: pub_a.display().to_string(),
                    capacity_range: Some(CapacityRange {
                        required_bytes: 768 * MIB,
                        limit_bytes: 0,
                    }),
                    staging_target_path: stage_a.display().to_string(),
                    volume_capability: Some(mount_capability("xfs")),
                    ..Default::default()
                })
                .await;
            match r {
                Ok(r) if r.get_ref().capacity_bytes >= 768 * MIB => break,
                _ if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                other => return Err(format!("NodeExpandVolume did not reach 768 MiB: {other:?}")),
            }
        }
    }

    // Snapshot, then the CSI driver crashes and comes back, then a clone from the snapshot.
    let snap = csi
        .controller
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: vol.volume_id.clone(),
            name: format!("snap-e2e-{tag}"),
            ..Default::default()
        })
        .await
        .map_err(e("CreateSnapshot"))?
        .into_inner()
        .snapshot
        .ok_or("no snapshot")?;
    local
        .crash_and_restart(Component::Csi)
        .await
        .map_err(|x| x.to_string())?;
    let mut csi = liteio_csi::client::connect(&local.csi_endpoint())
        .await
        .map_err(|x| x.to_string())?;
    std::fs::write(pub_a.join("data.txt"), b"overwritten after the snapshot\n")
        .map_err(|x| x.to_string())?;
    let clone = csi
        .controller
        .create_volume(CreateVolumeRequest {
            name: format!("pvc-e2e-b-{tag}"),
            capacity_range: Some(CapacityRange {
                required_bytes: 768 * MIB,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![mount_capability("xfs")],
            accessibility_requirements: Some(req),
            volume_content_source: Some(VolumeContentSource {
                r#type: Some(SourceType::Snapshot(SnapshotSource {
                    snapshot_id: snap.snapshot_id.clone(),
                })),
            }),
            ..Default::default()
        })
        .await
        .map_err(e("CreateVolume b from the snapshot"))?
        .into_inner()
        .volume
        .ok_or("no clone")?;
    let stage_b = dir.join("staging/b");
    let pub_b = dir.join("mnt/b");
    std::fs::create_dir_all(&stage_b).map_err(|x| x.to_string())?;
    let secrets_b = stage_secrets(&client, &format!("pvc-e2e-b-{tag}"), &mut seen_keys).await?;
    csi.node
        .node_stage_volume(stage(
            &clone.volume_id,
            &clone.volume_context,
            &stage_b,
            &secrets_b,
        ))
        .await
        .map_err(e("stage b"))?;
    csi.node
        .node_publish_volume(publish(
            &clone.volume_id,
            &clone.volume_context,
            &stage_b,
            &pub_b,
        ))
        .await
        .map_err(e("publish b"))?;
    let b = std::fs::read_to_string(pub_b.join("data.txt")).map_err(|x| x.to_string())?;
    if b != "written before the snapshot\n" {
        return Err(format!("the clone reads {b:?}, not the snapshot's data"));
    }

    // No key shows in a log line, an event, an object or a metric of the run.
    let places = liteio_local::leaks::no_key_in_sight(local, &client, &seen_keys)
        .await
        .map_err(|x| x.to_string())?;
    println!(
        "no key of the {} kubelet would hand out shows in {places} places (log files, events, objects, metrics)",
        seen_keys.len()
    );

    // The API server crashes and comes back with what it held (when it is ours); every
    // component's watches list again and the teardown below goes through.
    if local.api == ApiSource::Test {
        local
            .crash_and_restart(Component::ApiServer)
            .await
            .map_err(|x| x.to_string())?;
    }

    // Tear everything down through CSI.
    for (id, s, t) in [
        (&clone.volume_id, &stage_b, &pub_b),
        (&vol.volume_id, &stage_a, &pub_a),
    ] {
        csi.node
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: id.clone(),
                target_path: t.display().to_string(),
            })
            .await
            .map_err(e("unpublish"))?;
        csi.node
            .node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: s.display().to_string(),
            })
            .await
            .map_err(e("unstage"))?;
    }
    csi.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: clone.volume_id.clone(),
            ..Default::default()
        })
        .await
        .map_err(e("delete b"))?;
    csi.controller
        .delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .map_err(e("delete snapshot"))?;
    csi.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: vol.volume_id.clone(),
            ..Default::default()
        })
        .await
        .map_err(e("delete a"))?;

    // No Kubernetes object of this run left once every finalizer is done.
    let mine =
        ListParams::default().labels(&format!("{}={}", keys::labels::TARGET_NODE_ID, local.node));
    let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let snaps: Api<AntstorSnapshot> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let secrets: Api<Secret> = Api::namespaced(client, keys::DEFAULT_NAMESPACE);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let v = vols
            .list(&mine)
            .await
            .map_err(|x| x.to_string())?
            .items
            .len();
        let s = snaps
            .list(&mine)
            .await
            .map_err(|x| x.to_string())?
            .items
            .len();
        let mut k = Vec::new();
        for name in [format!("pvc-e2e-a-{tag}"), format!("pvc-e2e-b-{tag}")] {
            let secret = naming::auth_secret(&name);
            if secrets
                .get_opt(&secret)
                .await
                .map_err(|x| x.to_string())?
                .is_some()
            {
                k.push(secret);
            }
        }
        if v == 0 && s == 0 && k.is_empty() {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "{v} volumes, {s} snapshots and the key Secrets {k:?} still exist"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
