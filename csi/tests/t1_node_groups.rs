//! T1: the Node service on multi-disk volumes (ids `dc-<uuid>`) against the test API server:
//! what it answers before any device is touched. Staging for real (NVMe/TCP members, LVM,
//! mkfs, mount) runs in a VM in `tests/cluster/tests/t4_lvm_group.rs`; the host steps are T0 tests
//! in `csi/src/node/group.rs` and `csi/src/lvm.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{NODE, NS, bounded, start};
use kube::api::{Api, Patch, PatchParams, PostParams};
use liteio_api::datacontrol::{AntstorDataControlSpec, Raid, RaidLevel};
use liteio_api::group::{AntstorVolumeGroupSpec, EntityIdentity, VolumeMeta};
use liteio_api::keys::labels;
use liteio_api::{AntstorDataControl, AntstorVolumeGroup, NodeInfo, PoolMode};
use liteio_csi::csi::volume_capability::access_mode::Mode;
use liteio_csi::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use liteio_csi::csi::*;
use serde_json::json;
use tonic::Code;

fn cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })),
    }
}

/// A data control `name` for `host` with one group `name` whose one member is `<name>-m0`
/// (which does not exist), as the CSI controller and the controller leave them.
async fn data_control(client: &kube::Client, name: &str, engine: PoolMode, host: &str) -> String {
    let id = format!("dc-{name}-0000");
    let groups: Api<AntstorVolumeGroup> = Api::namespaced(client.clone(), NS);
    let mut g = AntstorVolumeGroup::new(
        name,
        AntstorVolumeGroupSpec {
            uuid: format!("{name}-0000"),
            total_size: 1 << 30,
            volumes: vec![VolumeMeta {
                vol_id: EntityIdentity {
                    namespace: NS.into(),
                    name: format!("{name}-m0"),
                    uuid: "m0".into(),
                },
                target_node_name: "node-2".into(),
                size: (1 << 30) + (4 << 20),
            }],
            ..Default::default()
        },
    );
    g.metadata.namespace = Some(NS.into());
    groups.create(&PostParams::default(), &g).await.unwrap();
    let dcs: Api<AntstorDataControl> = Api::namespaced(client.clone(), NS);
    let mut dc = AntstorDataControl::new(
        name,
        AntstorDataControlSpec {
            uuid: id.clone(),
            total_size: 1 << 30,
            engine_type: engine,
            raid: Raid {
                level: RaidLevel::Linear,
            },
            host_node: NodeInfo {
                id: host.into(),
                ..Default::default()
            },
            volume_groups: vec![EntityIdentity {
                namespace: NS.into(),
                name: name.into(),
                uuid: format!("{name}-0000"),
            }],
            ..Default::default()
        },
    );
    dc.metadata.namespace = Some(NS.into());
    dc.metadata.labels = Some(BTreeMap::from([(labels::VOL_UUID.to_string(), id.clone())]));
    dcs.create(&PostParams::default(), &dc).await.unwrap();
    id
}

async fn set_status(client: &kube::Client, name: &str, status: serde_json::Value) {
    let dcs: Api<AntstorDataControl> = Api::namespaced(client.clone(), NS);
    dcs.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .unwrap();
}

fn stage_req(id: &str, staging: &std::path::Path) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap()),
        ..Default::default()
    }
}

#[tokio::test]
async fn multi_disk_volumes_are_refused_with_reasons_before_anything_is_connected() {
    bounded(async {
        let env = start(false, true, |c| {
            c.ready_timeout = Duration::from_secs(2);
        })
        .await;
        let client = env.client.clone();
        let dir = env.dir.path().to_path_buf();
        let staging = dir.join("staging");
        let mut csi = liteio_csi::client::connect(&env.endpoint).await.unwrap();
        let n = &mut csi.node;

        // No such volume.
        let e = n
            .node_stage_volume(stage_req("dc-nothing", &staging))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{}", e.message());

        // Not ready: DEADLINE_EXCEEDED after the bound, with the controller's message.
        let id = data_control(&client, "pvc-wait", PoolMode::KernelLVM, NODE).await;
        set_status(
            &client,
            "pvc-wait",
            json!({"status": "creating", "message": "waiting for the members"}),
        )
        .await;
        let t = Instant::now();
        let e = n
            .node_stage_volume(stage_req(&id, &staging))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::DeadlineExceeded, "{}", e.message());
        assert!(t.elapsed() >= Duration::from_secs(2));
        assert!(
            e.message()
                .contains("pvc-wait is not ready after 2s (waiting for the members); retry"),
            "{}",
            e.message()
        );

        // Ready while the stage waits (or just before it looks): it goes on at once, to
        // its member, which does not exist yet.
        let endpoint = env.endpoint.clone();
        let req = stage_req(&id, &staging);
        let t = Instant::now();
        let staged = tokio::spawn(async move {
            let mut c = liteio_csi::client::connect(&endpoint).await.unwrap();
            c.node.node_stage_volume(req).await
        });
        set_status(&client, "pvc-wait", json!({"status": "ready", "message": ""})).await;
        let e = staged.await.unwrap().unwrap_err();
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "the stage did not see the data control become ready"
        );
        assert_eq!(e.code(), Code::DeadlineExceeded, "{}", e.message());
        assert!(
            e.message()
                .contains("member pvc-wait-m0 of multi-disk volume pvc-wait does not exist yet"),
            "{}",
            e.message()
        );

        // Refused by the controller: an answer at once.
        let id = data_control(&client, "pvc-bad", PoolMode::KernelLVM, NODE).await;
        set_status(
            &client,
            "pvc-bad",
            json!({"status": "creating", "message": "invalid data control: spec.raid.level: raid5 is not supported (linear and raid0 are)"}),
        )
        .await;
        let t = Instant::now();
        let e = n
            .node_stage_volume(stage_req(&id, &staging))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
        assert!(e.message().contains("raid5"), "{}", e.message());
        assert!(t.elapsed() < Duration::from_secs(2));

        // Assembled for another node.
        let id = data_control(&client, "pvc-other", PoolMode::KernelLVM, "node-9").await;
        set_status(&client, "pvc-other", json!({"status": "ready"})).await;
        let e = n
            .node_stage_volume(stage_req(&id, &staging))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
        assert!(
            e.message().contains("node-9") && e.message().contains(NODE),
            "{}",
            e.message()
        );

        // SpdkLVStore, ready but without its export.
        let id = data_control(&client, "pvc-spdk", PoolMode::SpdkLVStore, NODE).await;
        set_status(&client, "pvc-spdk", json!({"status": "ready"})).await;
        let e = n
            .node_stage_volume(stage_req(&id, &staging))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
        assert!(e.message().contains("status.spdkTarget"), "{}", e.message());

        // None of the refusals left anything in the staging directory.
        assert!(
            !staging.exists() || std::fs::read_dir(&staging).unwrap().next().is_none(),
            "a refused stage left files"
        );

        // Not staged: publish says so; an SpdkLVStore volume cannot grow; unstage has
        // nothing to do.
        let e = n
            .node_publish_volume(NodePublishVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: staging.display().to_string(),
                target_path: dir.join("target").display().to_string(),
                volume_capability: Some(cap()),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
        assert!(e.message().contains("is not staged"), "{}", e.message());
        let e = n
            .node_expand_volume(NodeExpandVolumeRequest {
                volume_id: id.clone(),
                volume_path: dir.display().to_string(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
        assert!(e.message().contains("SpdkLVStore) cannot grow"), "{}", e.message());
        // A KernelLVM volume grows where it is staged: the staging path is required.
        let lvm_id = data_control(&client, "pvc-lvm-grow", PoolMode::KernelLVM, NODE).await;
        let e = n
            .node_expand_volume(NodeExpandVolumeRequest {
                volume_id: lvm_id.clone(),
                volume_path: dir.display().to_string(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
        assert!(e.message().contains("staging_target_path"), "{}", e.message());
        for id in [id.as_str(), "dc-gone"] {
            for _ in 0..2 {
                n.node_unstage_volume(NodeUnstageVolumeRequest {
                    volume_id: id.into(),
                    staging_target_path: staging.display().to_string(),
                })
                .await
                .unwrap();
            }
        }
        env.stop().await;
    })
    .await;
}
