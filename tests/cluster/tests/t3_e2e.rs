//! T3 end to end on the SPDK engine: every component as its own process (test API server,
//! node-disk-controller, disk-agent with its embedded SPDK, CSI driver) through the CSI API:
//! create → scheduled → ready and exported → data → expand → snapshot → clone → delete all
//! → no lvol, subsystem or Kubernetes object left. Each component, the API server included,
//! is killed (SIGKILL) and restarted once.
//!
//! The data path is the consumer's: NVMe/TCP to the agent's target as the node's host NQN.
//! With the kernel's `nvme_tcp` module the CSI node stages and mounts it; without it (this
//! machine) that step prints a NOTE line and the data goes through SPDK's own NVMe/TCP
//! initiator in this process (polling on core 1; the agent runs in interrupt mode on core 0).
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};
use liteio_agent::spdk::{Spdk, SpdkOptions, bdev, initiator, io};
use liteio_api::keys::{self, annotations};
use liteio_api::{AntstorSnapshot, AntstorVolume, StoragePool, VolumeStatus, naming};
use liteio_cluster_tests::{bin_dir, require_binaries};
use liteio_csi::csi::volume_content_source::{SnapshotSource, Type as SourceType};
use liteio_csi::csi::{
    CapacityRange, ControllerExpandVolumeRequest, CreateSnapshotRequest, CreateVolumeRequest,
    DeleteSnapshotRequest, DeleteVolumeRequest, NodePublishVolumeRequest, NodeStageVolumeRequest,
    NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, Topology, TopologyRequirement,
    VolumeContentSource,
};
use liteio_local::demo::mount_capability;
use liteio_local::{ApiSource, Component, Engine, Local};
use liteio_tests::spdk_rpc::rpc;
use serde_json::{Value, json};

const MIB: i64 = 1 << 20;
const NODE: &str = "e2e-spdk";
const LVS: &str = "local-lvs";

fn pattern(seed: u8) -> Vec<u8> {
    (0..64 * 1024)
        .map(|i: usize| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn every_component_as_a_process_on_the_spdk_engine() {
    require_binaries();
    // The initiator's SPDK polls (26.05's NVMe/TCP initiator refuses interrupt mode): core 1.
    let spdk = Spdk::start(&SpdkOptions {
        name: "t3-e2e".into(),
        core_mask: "0x2".into(),
        interrupt_mode: false,
        mem_size_mb: 512,
        ..SpdkOptions::small()
    })
    .unwrap();
    let base = std::env::temp_dir().join(format!("liteio-t3-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let result = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(300), scenario(&base))
            .await
            .expect("e2e timed out")
    });
    if result.is_err() {
        println!("{}", liteio_local::log_tails(&base, 40));
    }
    drop(rt);
    spdk.stop();
    let _ = std::fs::remove_dir_all(&base);
    result.unwrap();
}

async fn scenario(dir: &Path) -> Result<(), String> {
    // The agent serves /metrics, so that the run can show no key gets into them.
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?;
    let tuning = liteio_local::AgentTuning {
        metrics: Some(metrics),
        ..Default::default()
    };
    let mut local = Local::start_tuned(
        dir,
        &bin_dir(),
        NODE,
        Engine::Spdk,
        ApiSource::Test,
        liteio_local::DEFAULT_POOL_BYTES,
        tuning,
    )
    .await
    .map_err(|e| e.to_string())?;
    let out = steps(&mut local, dir).await;
    local.stop().await;
    out
}

/// The consumer: the kernel through CSI when it can, else SPDK's initiator.
struct Consumer {
    client: kube::Client,
    host_nqn: String,
    kernel: bool,
    ctrlrs: u32,
    /// Every key the consumer was given (kubelet's part: read from the volume's Secret), to
    /// look for them where they must not be.
    seen_keys: Vec<String>,
}

impl Consumer {
    /// Connects to `v`'s export as this node; returns the controller and namespace bdev.
    async fn attach(&mut self, v: &AntstorVolume) -> Result<(String, String), String> {
        let t = v.spec.spdk_target.clone().ok_or("no spdkTarget")?;
        self.ctrlrs += 1;
        let ctrlr = format!("e2e{}", self.ctrlrs);
        let port = t.svc_id.parse().map_err(|_| "bad svcID")?;
        // The volume's keys, as kubelet hands them to the CSI node (the agent requires them).
        let (keys, secret) = liteio_tests::spdk::consumer_keys_and_secrets(&self.client, v).await;
        for k in [secret.host.expose(), secret.ctrl.expose()] {
            if !self.seen_keys.iter().any(|s| s == k) {
                self.seen_keys.push(k.to_string());
            }
        }
        // Like the kernel's `nvme connect`, retried while a restarted agent re-exports.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let names = loop {
            match initiator::attach_tcp_auth(
                &ctrlr,
                &t.address,
                port,
                &t.subsys_nqn,
                &self.host_nqn,
                None,
                &keys,
            )
            .await
            {
                Ok(n) => break n,
                Err(e) if tokio::time::Instant::now() > deadline => return Err(e.to_string()),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let ns = names.first().cloned().ok_or("no namespace")?;
        Ok((ctrlr, ns))
    }

    async fn detach(&self, ctrlr: &str, ns: &str) -> Result<(), String> {
        initiator::detach(ctrlr).await.map_err(|e| e.to_string())?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while bdev::get(ns).await.map_err(|e| e.to_string())?.is_some() {
            if tokio::time::Instant::now() > deadline {
                return Err(format!("{ns} stays after detach"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Writes `data` at 1 MiB; returns the namespace size seen.
    async fn write(&mut self, v: &AntstorVolume, data: Vec<u8>) -> Result<u64, String> {
        let (c, ns) = self.attach(v).await?;
        let r = io::write_at(&ns, MIB as u64, data)
            .await
            .map_err(|e| e.to_string());
        let size = bdev::get(&ns).await.ok().flatten().map(|b| b.size_bytes());
        self.detach(&c, &ns).await?;
        r?;
        size.ok_or_else(|| "namespace vanished".into())
    }

    /// Reads 64 KiB at 1 MiB and the namespace size.
    async fn read(&mut self, v: &AntstorVolume) -> Result<(Vec<u8>, u64), String> {
        let (c, ns) = self.attach(v).await?;
        let r = io::read_at(&ns, MIB as u64, 64 * 1024)
            .await
            .map_err(|e| e.to_string());
        let size = bdev::get(&ns).await.ok().flatten().map(|b| b.size_bytes());
        self.detach(&c, &ns).await?;
        Ok((r?, size.ok_or("namespace vanished")?))
    }
}

async fn wait_volume<F>(
    api: &Api<AntstorVolume>,
    name: &str,
    what: &str,
    ok: F,
) -> Result<AntstorVolume, String>
where
    F: Fn(&AntstorVolume) -> bool,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = api.get_opt(name).await.map_err(|e| e.to_string())?
            && ok(&v)
        {
            return Ok(v);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("volume {name}: {what} not reached in 60 s"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn ready_and_exported(v: &AntstorVolume) -> bool {
    v.phase() == VolumeStatus::Ready && v.spec.spdk_target.is_some()
}

async fn steps(local: &mut Local, dir: &Path) -> Result<(), String> {
    let e = |what: &'static str| {
        move |err: tonic::Status| format!("{what}: {} ({:?})", err.message(), err.code())
    };
    let client = local.kube().await.map_err(|x| x.to_string())?;
    let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let snaps: Api<AntstorSnapshot> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let pools: Api<StoragePool> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let host_nqn = pools
        .get(NODE)
        .await
        .map_err(|x| x.to_string())?
        .annotations()
        .get(annotations::HOST_NQN)
        .cloned()
        .ok_or("the pool has no host NQN annotation")?;
    let kernel = Path::new("/sys/module/nvme_tcp").exists();
    if !kernel {
        println!(
            "NOTE t3 e2e: kernel staging not run (no nvme_tcp module); data checked through SPDK's NVMe/TCP initiator"
        );
    }
    let mut consumer = Consumer {
        client: client.clone(),
        host_nqn,
        kernel,
        ctrlrs: 0,
        seen_keys: Vec::new(),
    };
    let mut csi = liteio_csi::client::connect(&local.csi_endpoint())
        .await
        .map_err(|x| x.to_string())?;
    let topo = Topology {
        segments: HashMap::from([(keys::labels::KUBE_HOSTNAME.to_string(), NODE.to_string())]),
    };
    let req = TopologyRequirement {
        requisite: vec![topo.clone()],
        preferred: vec![topo],
    };
    let create = |name: &str, size: i64, source: Option<VolumeContentSource>| CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: size,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_capability("xfs")],
        accessibility_requirements: Some(req.clone()),
        volume_content_source: source,
        ..Default::default()
    };
    let a = csi
        .controller
        .create_volume(create("pvc-spdk-a", 512 * MIB, None))
        .await
        .map_err(e("CreateVolume a"))?
        .into_inner()
        .volume
        .ok_or("no volume")?;
    let name_a = vols_name(&vols, &a.volume_id).await?;

    // The controller crashes and comes back; the volume is still placed once and exported.
    local
        .crash_and_restart(Component::Controller)
        .await
        .map_err(|x| x.to_string())?;
    let va = wait_volume(&vols, &name_a, "ready and exported", ready_and_exported).await?;
    if va.spec.spdk_lvol.is_none() {
        return Err("an SPDK-engine volume without spec.spdkLvol".into());
    }
    if consumer.kernel {
        // kubelet's node-stage secret: the volume's Secret as a string map.
        let secret = secrets
            .get(&naming::auth_secret(&va.csi_name()))
            .await
            .map_err(|x| x.to_string())?;
        let stage_secrets: HashMap<String, String> = secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect();
        stage_publish_roundtrip(
            &mut csi,
            dir,
            &a.volume_id,
            &a.volume_context,
            &stage_secrets,
        )
        .await?;
    }
    consumer.write(&va, pattern(1)).await?;

    // The agent (and its SPDK) crashes and comes back: the volume is exported again and the
    // data is there.
    local
        .crash_and_restart(Component::Agent)
        .await
        .map_err(|x| x.to_string())?;
    let va = wait_volume(&vols, &name_a, "re-exported", ready_and_exported).await?;
    let (data, size) = consumer.read(&va).await?;
    if data != pattern(1) {
        return Err("data written before the agent's crash is not there after it".into());
    }
    if size != 512 * MIB as u64 {
        return Err(format!("namespace of {size} bytes, expected 512 MiB"));
    }

    // Expand online: the namespace grows.
    csi.controller
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: a.volume_id.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: 768 * MIB,
                limit_bytes: 0,
            }),
            volume_capability: Some(mount_capability("xfs")),
            ..Default::default()
        })
        .await
        .map_err(e("ControllerExpandVolume"))?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let va = wait_volume(&vols, &name_a, "ready", ready_and_exported).await?;
        let (_, size) = consumer.read(&va).await?;
        if size >= 768 * MIB as u64 {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("namespace still {size} bytes after the expansion"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Snapshot; the CSI driver crashes and comes back; the origin changes; a clone from the
    // snapshot reads the snapshot's data.
    let snap = csi
        .controller
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: a.volume_id.clone(),
            name: "snap-spdk".into(),
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
    let va = wait_volume(&vols, &name_a, "ready", ready_and_exported).await?;
    consumer.write(&va, pattern(2)).await?;
    let source = VolumeContentSource {
        r#type: Some(SourceType::Snapshot(SnapshotSource {
            snapshot_id: snap.snapshot_id.clone(),
        })),
    };
    let b = csi
        .controller
        .create_volume(create("pvc-spdk-b", 768 * MIB, Some(source)))
        .await
        .map_err(e("CreateVolume b from the snapshot"))?
        .into_inner()
        .volume
        .ok_or("no clone")?;
    let name_b = vols_name(&vols, &b.volume_id).await?;
    let vb = wait_volume(&vols, &name_b, "ready and exported", ready_and_exported).await?;
    if consumer.read(&vb).await?.0 != pattern(1) {
        return Err("the clone does not read the snapshot's data".into());
    }
    if consumer.read(&va).await?.0 != pattern(2) {
        return Err("the origin lost what was written after the snapshot".into());
    }

    // No key the consumer was given shows in a log, an event, an object or a metric.
    let places = liteio_local::leaks::no_key_in_sight(local, &client, &consumer.seen_keys)
        .await
        .map_err(|x| x.to_string())?;
    println!(
        "no key of the {} the consumer was given shows in {places} places (log files, events, objects, metrics)",
        consumer.seen_keys.len()
    );

    // The API server crashes and comes back with its state; the teardown goes through.
    local
        .crash_and_restart(Component::ApiServer)
        .await
        .map_err(|x| x.to_string())?;

    for (what, id) in [("delete b", &b.volume_id), ("delete a", &a.volume_id)] {
        if what == "delete a" {
            csi.controller
                .delete_snapshot(DeleteSnapshotRequest {
                    snapshot_id: snap.snapshot_id.clone(),
                    ..Default::default()
                })
                .await
                .map_err(e("delete snapshot"))?;
        }
        csi.controller
            .delete_volume(DeleteVolumeRequest {
                volume_id: id.clone(),
                ..Default::default()
            })
            .await
            .map_err(e(what))?;
    }

    // Nothing left: no object, no lvol, no subsystem.
    let sock = local.spdk_rpc_socket();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let v = vols
            .list(&Default::default())
            .await
            .map_err(|x| x.to_string())?
            .items
            .len();
        let s = snaps
            .list(&Default::default())
            .await
            .map_err(|x| x.to_string())?
            .items
            .len();
        let lvols = rpc(&sock, "bdev_lvol_get_lvols", json!({"lvs_name": LVS}))?;
        let subsystems: Vec<String> = rpc(&sock, "nvmf_get_subsystems", Value::Null)?
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s["nqn"].as_str().map(str::to_string))
                    .filter(|n| !n.contains("discovery"))
                    .collect()
            })
            .unwrap_or_default();
        let n_lvols = lvols.as_array().map_or(0, Vec::len);
        let keys: Vec<String> = secrets
            .list(&Default::default())
            .await
            .map_err(|x| x.to_string())?
            .items
            .iter()
            .map(ResourceExt::name_any)
            .filter(|n| n.starts_with(naming::AUTH_SECRET_PREFIX))
            .collect();
        if v == 0 && s == 0 && n_lvols == 0 && subsystems.is_empty() && keys.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "left: {v} volumes, {s} snapshots, lvols {lvols}, subsystems {subsystems:?}, key Secrets {keys:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The AntstorVolume behind a CSI volume id.
async fn vols_name(vols: &Api<AntstorVolume>, id: &str) -> Result<String, String> {
    let all = vols
        .list(&Default::default())
        .await
        .map_err(|x| x.to_string())?;
    all.items
        .iter()
        .find(|v| v.spec.uuid == id || v.name_any() == id)
        .map(ResourceExt::name_any)
        .ok_or_else(|| format!("no AntstorVolume for CSI volume {id}"))
}

/// With the kernel's NVMe/TCP initiator: stage, publish, write and read a file, unpublish and
/// unstage through the CSI node service.
async fn stage_publish_roundtrip(
    csi: &mut liteio_csi::client::CsiClient,
    dir: &Path,
    id: &str,
    ctx: &HashMap<String, String>,
    secrets: &HashMap<String, String>,
) -> Result<(), String> {
    let e = |what: &'static str| {
        move |err: tonic::Status| format!("{what}: {} ({:?})", err.message(), err.code())
    };
    let staging = dir.join("staging/a");
    let target = dir.join("mnt/a");
    std::fs::create_dir_all(&staging).map_err(|x| x.to_string())?;
    std::fs::create_dir_all(dir.join("mnt")).map_err(|x| x.to_string())?;
    csi.node
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(mount_capability("xfs")),
            volume_context: ctx.clone(),
            secrets: secrets.clone(),
            ..Default::default()
        })
        .await
        .map_err(e("stage"))?;
    csi.node
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(mount_capability("xfs")),
            volume_context: ctx.clone(),
            ..Default::default()
        })
        .await
        .map_err(e("publish"))?;
    std::fs::write(target.join("hello.txt"), b"over NVMe/TCP\n").map_err(|x| x.to_string())?;
    let back = std::fs::read(target.join("hello.txt")).map_err(|x| x.to_string())?;
    csi.node
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.display().to_string(),
        })
        .await
        .map_err(e("unpublish"))?;
    csi.node
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .map_err(e("unstage"))?;
    if back != b"over NVMe/TCP\n" {
        return Err("the file read back differs".into());
    }
    Ok(())
}
