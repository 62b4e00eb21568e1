//! T4: the CSI node plugin on a compute node that is a microVM with Debian 12's stock 6.1
//! kernel, joined to a one-machine cluster (one storage node in a network namespace, file
//! engine) through a tap on the cluster's bridge. What the kernel itself answers:
//!
//! - NodeGetInfo names the VM's node; its kernel is found unable to authenticate.
//! - An authenticated volume is refused at once, naming the kernel and what it lacks.
//! - A target nobody serves (a port without a listener, an address without a host) fails
//!   NodeStageVolume with the kernel's reason, and leaves no NVMe controller, no mount and
//!   no device behind.
//!
//! The volumes here are exported by no storage node (no SPDK target runs in this tier
//! without SPDK): their objects are written as a storage node would leave them, pointing
//! at addresses on the bridge where nothing listens. Prints `SKIP …` where no VM can boot
//! or no network namespace can be made.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use liteio_api::auth::VolumeKeys;
use liteio_api::keys::{self, labels};
use liteio_api::{AntstorVolume, AntstorVolumeSpec, SpdkTarget, naming};
use liteio_cluster_tests::{scratch, skip_vm, with_cluster};
use liteio_csi::csi::*;
use liteio_local::Engine;
use liteio_local::cluster::ClusterOptions;
use liteio_local::vm::Kernel;
use serde_json::json;
use tonic::Code;

const STEP: Duration = Duration::from_secs(60);

/// The StoragePool of a storage node that is not part of this run, as its agent registered
/// it: the controller keeps the hand-written volumes below on it.
async fn elsewhere_pool(client: &kube::Client) {
    use liteio_api::{StoragePool, StoragePoolSpec};
    let api: Api<StoragePool> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let mut p = StoragePool::new("storage-elsewhere", StoragePoolSpec::default());
    p.spec.node_info.id = "storage-elsewhere".into();
    p.spec.node_info.hostname = "storage-elsewhere".into();
    p.metadata.namespace = Some(keys::DEFAULT_NAMESPACE.into());
    api.create(&PostParams::default(), &p).await.unwrap();
}

/// A Ready volume exported (as its storage node would say) at `address:port`.
async fn exported_volume(
    api: &Api<AntstorVolume>,
    name: &str,
    uuid: &str,
    address: &str,
    port: u16,
) {
    let mut v = AntstorVolume::new(name, AntstorVolumeSpec::default());
    v.metadata.namespace = Some(keys::DEFAULT_NAMESPACE.into());
    v.metadata.labels = Some(BTreeMap::from([(
        labels::VOL_UUID.to_string(),
        uuid.to_string(),
    )]));
    v.spec.uuid = uuid.into();
    v.spec.size_byte = 64 << 20;
    // A storage node that is not part of this run: no agent touches the object. Exported
    // to the VM node, as the volume of a pod there would be.
    v.spec.target_node_id = "storage-elsewhere".into();
    v.spec.host_node = Some(liteio_api::NodeInfo {
        id: "vm-1".into(),
        ..Default::default()
    });
    v.spec.spdk_target = Some(SpdkTarget {
        subsys_nqn: naming::subsys_nqn(uuid),
        svc_id: port.to_string(),
        sn: naming::serial_number(uuid),
        trans_type: "TCP".into(),
        address: address.into(),
        ..SpdkTarget::default()
    });
    api.create(&PostParams::default(), &v).await.unwrap();
    // Once the controller has taken it in (its finalizer, written with the binding; it
    // writes no status), the storage node's part: ready.
    let taken_in = |v: &AntstorVolume| {
        v.finalizers()
            .iter()
            .any(|f| f == keys::finalizers::IN_STATE)
    };
    liteio_local::wait_until(
        "the controller to take the volume in",
        30,
        std::path::Path::new("/dev/null"),
        || async { api.get(name).await.is_ok_and(|v| taken_in(&v)) },
    )
    .await
    .unwrap();
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"status": "ready"}})),
    )
    .await
    .unwrap();
}

fn stage(id: &str, staging: &str) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.into(),
        volume_capability: Some(liteio_local::demo::mount_capability("ext4")),
        ..Default::default()
    }
}

#[test]
fn csi_node_on_debian_61_in_a_vm() {
    if skip_vm("t4 CSI node", &Kernel::Stock) {
        return;
    }
    let dir = scratch("t4-csi-node");
    with_cluster(
        &dir,
        ClusterOptions::new(1, Engine::File),
        Duration::from_secs(900),
        |c| {
            Box::pin(async move {
                let mut node = liteio_cluster_tests::vm_node(c, 1, Kernel::Stock).await?;
                let mut csi = liteio_csi::client::connect(&node.csi_endpoint())
                    .await
                    .map_err(|e| e.to_string())?;
                let info = csi
                    .node
                    .node_get_info(NodeGetInfoRequest {})
                    .await
                    .map_err(|e| e.to_string())?
                    .into_inner();
                assert_eq!(info.node_id, node.name);
                let log = node.csi_log(200).await;
                assert!(
                    log.contains("NVMe-oF host capabilities")
                        && log.contains("built without CONFIG_NVME_AUTH"),
                    "{log}"
                );

                let client = c.kube().await.map_err(|e| e.to_string())?;
                elsewhere_pool(&client).await;
                let api: Api<AntstorVolume> = Api::namespaced(client, keys::DEFAULT_NAMESPACE);
                let bridge = c.net.bridge_address().to_string();

                // Authenticated: refused before any connect, with the reason.
                exported_volume(
                    &api,
                    "pvc-auth",
                    "a0000000-0000-4000-8000-000000000001",
                    &bridge,
                    4420,
                )
                .await;
                let mut r = stage("a0000000-0000-4000-8000-000000000001", "/tmp/stage/auth");
                r.secrets = VolumeKeys::generate(false)
                    .unwrap()
                    .to_secret_data()
                    .into_iter()
                    .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
                    .collect();
                let t = std::time::Instant::now();
                let e = csi.node.node_stage_volume(r).await.unwrap_err();
                println!(
                    "authenticated volume on 6.1: {:?} after {:.2}s: {}",
                    e.code(),
                    t.elapsed().as_secs_f64(),
                    e.message()
                );
                assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
                assert!(
                    e.message().contains("6.1.") && e.message().contains("CONFIG_NVME_AUTH"),
                    "{}",
                    e.message()
                );

                // A port without a listener, then an address without a host: the kernel's reason,
                // nothing left behind.
                for (name, uuid, address, port) in [
                    (
                        "pvc-port",
                        "a0000000-0000-4000-8000-000000000002",
                        bridge.clone(),
                        4999u16,
                    ),
                    (
                        "pvc-host",
                        "a0000000-0000-4000-8000-000000000003",
                        {
                            let o = c.net.bridge_address().octets();
                            std::net::Ipv4Addr::new(o[0], o[1], o[2], 250).to_string()
                        },
                        4420,
                    ),
                ] {
                    exported_volume(&api, name, uuid, &address, port).await;
                    let staging = format!("/tmp/stage/{name}");
                    let t = std::time::Instant::now();
                    let e = csi
                        .node
                        .node_stage_volume(stage(uuid, &staging))
                        .await
                        .unwrap_err();
                    println!(
                        "{name} ({address}:{port}): {:?} after {:.2}s: {}",
                        e.code(),
                        t.elapsed().as_secs_f64(),
                        e.message()
                    );
                    // UNAVAILABLE: the CO retries; the message names the target, and keys
                    // are not blamed for a target that is not there.
                    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
                    assert!(
                        e.message().contains(&format!("{address}:{port}")),
                        "{}",
                        e.message()
                    );
                    assert!(!e.message().contains("authentication"), "{}", e.message());
                    let left = node
                    .vm
                    .sh(&format!("ls /sys/class/nvme 2>/dev/null; ls /dev | grep -E '^nvme[0-9]'; grep -F '{staging}' /proc/mounts; true"), STEP)
                    .await
                    .map_err(|e| e.to_string())?;
                    assert!(
                        left.output.trim().is_empty(),
                        "{name}: left behind: {}",
                        left.output
                    );
                }
                node.vm.shutdown().await;
                Ok(())
            })
        },
    );
}
