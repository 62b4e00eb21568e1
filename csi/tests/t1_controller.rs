//! T1: the Controller and Identity services over the real gRPC socket against the test API
//! server, with a fake scheduler in place of the node-disk-controller.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{NODE, bounded, pool, start};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use liteio_api::keys::annotations;
use liteio_api::keys::labels;
use liteio_api::size::MIB;
use liteio_api::{AntstorSnapshot, StoragePool};
use liteio_csi::csi::volume_capability::access_mode::Mode;
use liteio_csi::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use liteio_csi::csi::*;
use liteio_test_apiserver::Verb;
use serde_json::json;
use tonic::Code;

fn cap(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

fn create_req(name: &str, bytes: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap(Mode::SingleNodeWriter)],
        parameters: HashMap::from([("fsType".to_string(), "ext4".to_string())]),
        ..Default::default()
    }
}

const MIB_I: i64 = 1 << 20;

#[tokio::test]
async fn identity_reports_name_and_capabilities() {
    bounded(async {
        let mut env = start(true, false, |_| {}).await;
        let info = env
            .csi
            .identity
            .get_plugin_info(GetPluginInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.name, "antstor.csi.alipay.com");
        assert_eq!(info.vendor_version, "test");
        let caps = env
            .csi
            .identity
            .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(caps.capabilities.len(), 3);
        let probe = env
            .csi
            .identity
            .probe(ProbeRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(probe.ready, Some(true));
        let c = env
            .csi
            .controller
            .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(c.capabilities.len(), 8);
        let modify = controller_service_capability::rpc::Type::ModifyVolume as i32;
        assert!(
            c.capabilities.iter().any(|c| matches!(
                &c.r#type,
                Some(controller_service_capability::Type::Rpc(r)) if r.r#type == modify
            )),
            "MODIFY_VOLUME is advertised: {c:?}"
        );
        // The node service is not served in controller mode.
        let e = env
            .csi
            .node
            .node_get_info(NodeGetInfoRequest {})
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unimplemented);
        env.stop().await;
    })
    .await;
}

#[tokio::test]
async fn create_volume_stores_the_rounded_size_and_is_idempotent() {
    bounded(async {
        let mut env = start(true, false, |_| {}).await;
        env.start_scheduler(1 << 40);
        let req = create_req("pvc-a", 5 * MIB_I + 1);
        let v = env
            .csi
            .controller
            .create_volume(req.clone())
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        assert_eq!(v.capacity_bytes, 8 * MIB_I);
        assert_eq!(
            v.volume_context
                .get("obnvmf/target-node-id")
                .map(String::as_str),
            Some(NODE)
        );
        assert_eq!(
            v.volume_context.get("fsType").map(String::as_str),
            Some("ext4")
        );
        let obj = env.volumes().get("pvc-a").await.unwrap();
        assert_eq!(
            obj.spec.size_byte,
            8 * MIB,
            "the stored size is the rounded size"
        );
        assert_eq!(obj.spec.uuid, v.volume_id);
        assert!(uuid::Uuid::parse_str(&v.volume_id).is_ok());
        assert_eq!(obj.labels().get(labels::VOL_UUID), Some(&v.volume_id));
        assert_eq!(
            obj.labels().get(labels::FS_TYPE).map(String::as_str),
            Some("ext4")
        );

        // Same request again: the same volume.
        let again = env
            .csi
            .controller
            .create_volume(req.clone())
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        assert_eq!(again.volume_id, v.volume_id);
        // Same name, other size: ALREADY_EXISTS naming the field.
        let e = env
            .csi
            .controller
            .create_volume(create_req("pvc-a", 64 * MIB_I))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists);
        assert!(e.message().contains("spec.sizeByte"), "{}", e.message());

        // Delete is idempotent.
        let del = DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            secrets: HashMap::new(),
        };
        env.csi.controller.delete_volume(del.clone()).await.unwrap();
        env.csi.controller.delete_volume(del).await.unwrap();
        assert!(env.volumes().get_opt("pvc-a").await.unwrap().is_none());
        env.stop().await;
    })
    .await;
}

/// DeleteVolume finds the volume through the driver's uuid index (one GET), not a list by
/// label per call: an API server filters a label selector over every object, so a burst of
/// deletions was O(n²). The index's own relist and the first calls before it synced may
/// list; the rest of the burst must not.
#[tokio::test]
async fn a_burst_of_deletions_reads_each_volume_without_a_list() {
    bounded(async {
        let mut env = start(true, false, |_| {}).await;
        env.start_scheduler(1 << 40);
        const N: usize = 40;
        let mut ids = Vec::new();
        for i in 0..N {
            let v = env
                .csi
                .controller
                .create_volume(create_req(&format!("pvc-d{i}"), MIB_I))
                .await
                .unwrap()
                .into_inner()
                .volume
                .unwrap();
            ids.push(v.volume_id);
        }
        let faults = env.server.faults();
        let before = faults.requests(Verb::List, "antstorvolumes");
        for id in &ids {
            env.csi
                .controller
                .delete_volume(DeleteVolumeRequest {
                    volume_id: id.clone(),
                    secrets: HashMap::new(),
                })
                .await
                .unwrap();
        }
        let lists = faults.requests(Verb::List, "antstorvolumes") - before;
        assert!(
            lists <= 10,
            "{N} deletions listed AntstorVolumes {lists} times (one list per call is O(n²))"
        );
        for i in 0..N {
            let gone = env
                .volumes()
                .get_opt(&format!("pvc-d{i}"))
                .await
                .unwrap()
                .is_none_or(|v| v.metadata.deletion_timestamp.is_some());
            assert!(gone, "pvc-d{i} was not deleted");
        }
        env.stop().await;
    })
    .await;
}

#[tokio::test]
async fn nothing_fits_is_resource_exhausted_with_the_message() {
    bounded(async {
        let mut env = start(true, false, |_| {}).await;
        env.start_scheduler(16 * MIB);
        let e = env
            .csi
            .controller
            .create_volume(create_req("pvc-big", 1 << 30))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
        assert!(
            e.message()
                .contains("NoStoragePoolAvailable: PoolFreeSize: 1"),
            "{}",
            e.message()
        );
        env.stop().await;
    })
    .await;
}

#[tokio::test]
async fn unscheduled_volume_is_a_retryable_timeout() {
    bounded(async {
        let mut env = start(true, false, |c| {
            c.schedule_timeout = Duration::from_millis(500)
        })
        .await;
        let e = env
            .csi
            .controller
            .create_volume(create_req("pvc-wait", MIB_I))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::DeadlineExceeded, "{}", e.message());
        assert!(e.message().contains("not scheduled"), "{}", e.message());
        // Once the controller catches up, the retry succeeds.
        env.start_scheduler(1 << 40);
        let v = env
            .csi
            .controller
            .create_volume(create_req("pvc-wait", MIB_I))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(v.volume.unwrap().capacity_bytes, 4 * MIB_I);
        env.stop().await;
    })
    .await;
}

#[tokio::test]
async fn bad_requests_get_invalid_argument_naming_the_field() {
    bounded(async {
        let mut env = start(true, false, |_| {}).await;
        let c = &mut env.csi.controller;
        let mut r = create_req("", MIB_I);
        let e = c.create_volume(r.clone()).await.unwrap_err();
        assert_eq!(
            (e.code(), e.message()),
            (Code::InvalidArgument, "name: is required")
        );
        r.name = "x".into();
        r.volume_capabilities.clear();
        let e = c.create_volume(r.clone()).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().starts_with("volume_capabilities"));
        r.volume_capabilities = vec![cap(Mode::MultiNodeMultiWriter)];
        let e = c.create_volume(r.clone()).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(
            e.message().contains("MULTI_NODE_MULTI_WRITER"),
            "{}",
            e.message()
        );
        let mut r = create_req("x", -5);
        let e = c.create_volume(r.clone()).await.unwrap_err();
        assert_eq!(
            e.message(),
            "capacity_range.required_bytes: -5 must not be negative"
        );
        r.capacity_range = Some(CapacityRange {
            required_bytes: 5 * MIB_I,
            limit_bytes: 6 * MIB_I,
        });
        assert_eq!(
            c.create_volume(r).await.unwrap_err().code(),
            Code::OutOfRange
        );
        let e = c
            .delete_volume(DeleteVolumeRequest::default())
            .await
            .unwrap_err();
        assert_eq!(
            (e.code(), e.message()),
            (Code::InvalidArgument, "volume_id: is required")
        );
        let e = c
            .controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: "nope".into(),
                capacity_range: Some(CapacityRange {
                    required_bytes: MIB_I,
                    limit_bytes: 0,
                }),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        let e = c
            .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
                volume_id: "nope".into(),
                volume_capabilities: vec![cap(Mode::SingleNodeWriter)],
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        let e = c
            .list_volumes(ListVolumesRequest {
                max_entries: 1,
                starting_token: "bogus".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Aborted);
        env.stop().await;
    })
    .await;
}

#[tokio::test]
async fn expand_checks_the_pool_and_records_the_original_size() {
    bounded(async {
        let mut env = start(true, false, |_| {}).await;
        env.start_scheduler(1 << 40);
        pool(&env.client, NODE, 100 * MIB).await;
        let v = env
            .csi
            .controller
            .create_volume(create_req("pvc-x", 8 * MIB_I))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        let expand = |bytes: i64| ControllerExpandVolumeRequest {
            volume_id: v.volume_id.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: bytes,
                limit_bytes: 0,
            }),
            ..Default::default()
        };
        let r = env
            .csi
            .controller
            .controller_expand_volume(expand(30 * MIB_I + 1))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.capacity_bytes, 32 * MIB_I);
        assert!(r.node_expansion_required);
        let obj = env.volumes().get("pvc-x").await.unwrap();
        assert_eq!(obj.spec.size_byte, 32 * MIB);
        assert_eq!(
            obj.labels()
                .get(labels::EXPANSION_ORIGINAL_SIZE)
                .map(String::as_str),
            Some("8388608")
        );
        // Same size again: success without change.
        let r = env
            .csi
            .controller
            .controller_expand_volume(expand(32 * MIB_I))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.capacity_bytes, 32 * MIB_I);
        // A smaller request never shrinks the volume.
        let r = env
            .csi
            .controller
            .controller_expand_volume(expand(16 * MIB_I + 1))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.capacity_bytes, 32 * MIB_I);
        assert_eq!(
            env.volumes().get("pvc-x").await.unwrap().spec.size_byte,
            32 * MIB
        );
        // More than the pool has.
        let e = env
            .csi
            .controller
            .controller_expand_volume(expand(1 << 30))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::OutOfRange);
        assert!(
            e.message().contains("pool node-1 has 100.0 MiB free"),
            "{}",
            e.message()
        );

        // Capacity: the pool's free space, per topology too.
        let cap_all = env
            .csi
            .controller
            .get_capacity(GetCapacityRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(cap_all.available_capacity, 100 * MIB_I);
        let cap_other = env
            .csi
            .controller
            .get_capacity(GetCapacityRequest {
                accessible_topology: Some(Topology {
                    segments: HashMap::from([(
                        "kubernetes.io/hostname".to_string(),
                        "node-9".to_string(),
                    )]),
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(cap_other.available_capacity, 0);
        env.stop().await;
    })
    .await;
}

#[tokio::test]
async fn snapshots_and_clones() {
    bounded(async {
        let mut env = start(true, false, |_| {}).await;
        env.start_scheduler(1 << 40);
        let v = env.csi.controller.create_volume(create_req("pvc-s", 8 * MIB_I)).await.unwrap().into_inner().volume.unwrap();
        // The origin reserves 4 MiB for snapshots: the snapshot asks for the reserve.
        env.volumes()
            .patch(
                "pvc-s",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"obnvmf/snapshot-reserved-bytes": "4194304"}}})),
            )
            .await
            .unwrap();
        let req = CreateSnapshotRequest { source_volume_id: v.volume_id.clone(), name: "snap-1".into(), ..Default::default() };
        let s = env.csi.controller.create_snapshot(req.clone()).await.unwrap().into_inner().snapshot.unwrap();
        assert_eq!(s.size_bytes, 4 * MIB_I);
        assert_eq!(s.source_volume_id, v.volume_id);
        assert!(!s.ready_to_use);
        let again = env.csi.controller.create_snapshot(req).await.unwrap().into_inner().snapshot.unwrap();
        assert_eq!(again.snapshot_id, s.snapshot_id);
        let snaps: kube::Api<AntstorSnapshot> = kube::Api::namespaced(env.client.clone(), "obnvmf");
        let obj = snaps.get("snap-1").await.unwrap();
        assert_eq!(obj.spec.origin_vol_target_node_id, NODE);
        assert_eq!(obj.labels().get(labels::ORIGIN_VOLUME_NAME).map(String::as_str), Some("pvc-s"));

        // Another volume cannot take the name.
        let v2 = env.csi.controller.create_volume(create_req("pvc-t", 8 * MIB_I)).await.unwrap().into_inner().volume.unwrap();
        let e = env
            .csi
            .controller
            .create_snapshot(CreateSnapshotRequest { source_volume_id: v2.volume_id.clone(), name: "snap-1".into(), ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists);

        // Listing with filters.
        let l = env.csi.controller.list_snapshots(ListSnapshotsRequest { source_volume_id: v.volume_id.clone(), ..Default::default() }).await.unwrap().into_inner();
        assert_eq!(l.entries.len(), 1);
        let l = env.csi.controller.list_snapshots(ListSnapshotsRequest { snapshot_id: "nope".into(), ..Default::default() }).await.unwrap().into_inner();
        assert!(l.entries.is_empty());

        // A clone needs a ready snapshot, then is pinned to the snapshot's node.
        let mut clone = create_req("pvc-clone", 8 * MIB_I);
        clone.volume_content_source = Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Snapshot(volume_content_source::SnapshotSource { snapshot_id: s.snapshot_id.clone() })),
        });
        let e = env.csi.controller.create_volume(clone.clone()).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        snaps
            .patch_status("snap-1", &PatchParams::default(), &Patch::Merge(json!({"status": {"status": "ready"}})))
            .await
            .unwrap();
        let cv = env.csi.controller.create_volume(clone).await.unwrap().into_inner().volume.unwrap();
        assert!(cv.content_source.is_some());
        let cobj = env.volumes().get("pvc-clone").await.unwrap();
        assert_eq!(cobj.labels().get(labels::VOLUME_SOURCE_SNAP_NAME).map(String::as_str), Some("snap-1"));
        assert_eq!(
            cobj.annotations().get("obnvmf/pool-label-selector").map(String::as_str),
            Some("obnvmf/node-sn=node-1")
        );

        // Delete twice.
        let d = DeleteSnapshotRequest { snapshot_id: s.snapshot_id.clone(), secrets: HashMap::new() };
        env.csi.controller.delete_snapshot(d.clone()).await.unwrap();
        env.csi.controller.delete_snapshot(d).await.unwrap();
        env.stop().await;
    })
    .await;
}

/// A snapshot the storage node cannot cut (its pool has no reflinks) is answered with
/// FAILED_PRECONDITION as soon as the node says so, not after the CO's deadline, and the
/// AntstorSnapshot is gone: the CO never got an id to delete it by. The test writes the
/// status as the agent does (`agent/tests/t1_permanent_errors.rs` shows the agent's side).
#[tokio::test]
async fn a_snapshot_that_cannot_be_cut_fails_at_once_and_leaves_nothing() {
    bounded(async {
        // A long wait: the answer must come from the failure, not from the wait's end.
        let mut env = start(true, false, |c| c.snapshot_wait = Duration::from_secs(20)).await;
        env.start_scheduler(1 << 40);
        let v = env.csi.controller.create_volume(create_req("pvc-f", 8 * MIB_I)).await.unwrap().into_inner().volume.unwrap();
        let snaps: kube::Api<AntstorSnapshot> = kube::Api::namespaced(env.client.clone(), "obnvmf");
        let agent = {
            let snaps = snaps.clone();
            tokio::spawn(async move {
                loop {
                    if snaps.get_opt("snap-f").await.unwrap().is_some() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let status = json!({"status": {"status": "creating", "msg": "cannot snapshot snap-f in the pool: snapshot is not supported on pool p: no reflinks", "permanent": true}});
                snaps.patch_status("snap-f", &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
            })
        };
        let req = CreateSnapshotRequest { source_volume_id: v.volume_id.clone(), name: "snap-f".into(), ..Default::default() };
        let started = std::time::Instant::now();
        let e = env.csi.controller.create_snapshot(req.clone()).await.unwrap_err();
        let took = started.elapsed();
        agent.await.unwrap();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("no reflinks"), "{}", e.message());
        assert!(took < Duration::from_secs(10), "answered after {took:?}");
        assert!(snaps.get_opt("snap-f").await.unwrap().is_none(), "the failed AntstorSnapshot is left");
        env.stop().await;
    })
    .await;
}

#[tokio::test]
async fn list_volumes_pages() {
    bounded(async {
        let mut env = start(true, false, |_| {}).await;
        env.start_scheduler(1 << 40);
        let mut ids = Vec::new();
        for i in 0..5 {
            let v = env
                .csi
                .controller
                .create_volume(create_req(&format!("pvc-{i}"), MIB_I))
                .await
                .unwrap()
                .into_inner();
            ids.push(v.volume.unwrap().volume_id);
        }
        let mut seen = Vec::new();
        let mut token = String::new();
        let mut pages = 0;
        loop {
            let r = env
                .csi
                .controller
                .list_volumes(ListVolumesRequest {
                    max_entries: 2,
                    starting_token: token.clone(),
                })
                .await
                .unwrap()
                .into_inner();
            pages += 1;
            assert!(r.entries.len() <= 2);
            seen.extend(r.entries.into_iter().map(|e| e.volume.unwrap().volume_id));
            if r.next_token.is_empty() {
                break;
            }
            token = r.next_token;
        }
        assert_eq!(pages, 3);
        seen.sort();
        ids.sort();
        assert_eq!(seen, ids);
        // Validate: supported capability confirmed, unsupported one explained.
        let ok = env
            .csi
            .controller
            .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
                volume_id: ids[0].clone(),
                volume_capabilities: vec![cap(Mode::SingleNodeWriter)],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(ok.confirmed.is_some());
        let no = env
            .csi
            .controller
            .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
                volume_id: ids[0].clone(),
                volume_capabilities: vec![cap(Mode::MultiNodeReaderOnly)],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(no.confirmed.is_none());
        assert!(!no.message.is_empty());
        let _: Option<StoragePool> = None;
        env.stop().await;
    })
    .await;
}

/// Found by the bad-input sweep (issue 16): the free sizes of pools come from the API
/// server, and two huge ones made GetCapacity's sum overflow (a panic in debug builds).
#[tokio::test]
async fn capacity_of_huge_pools_saturates() {
    bounded(async {
        let mut env = start(true, false, |_| {}).await;
        pool(&env.client, "big-1", u64::MAX).await;
        pool(&env.client, "big-2", u64::MAX).await;
        let cap = env
            .csi
            .controller
            .get_capacity(GetCapacityRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(cap.available_capacity, i64::MAX);
        env.stop().await;
    })
    .await;
}

fn publish_req(volume_id: &str, node: &str) -> ControllerPublishVolumeRequest {
    ControllerPublishVolumeRequest {
        volume_id: volume_id.into(),
        node_id: node.into(),
        volume_capability: Some(cap(Mode::SingleNodeWriter)),
        ..Default::default()
    }
}

fn unpublish_req(volume_id: &str, node: &str) -> ControllerUnpublishVolumeRequest {
    ControllerUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        node_id: node.into(),
        ..Default::default()
    }
}

/// ControllerPublishVolume records the one node a volume is published to and moves the
/// volume's consumer there when the volume can be reached from it; Unpublish clears the
/// record. The storage node's part (its export admitting the new node, which the publish
/// waits for) is played here by the test writing the agent's annotation, as the file engine
/// has no NVMe-oF export; the real agent does it in the T4 csi-sanity run.
#[tokio::test]
async fn publish_moves_the_consumer_and_admits_one_node() {
    bounded(async {
        let mut env = start(true, false, |_| {}).await;
        env.start_scheduler(1 << 40);
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
        for n in [NODE, "node-2"] {
            let mut node = k8s_openapi::api::core::v1::Node::default();
            node.metadata.name = Some(n.into());
            nodes.create(&PostParams::default(), &node).await.unwrap();
        }
        let id = env
            .csi
            .controller
            .create_volume(create_req("pvc-p", 8 * MIB_I))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
            .volume_id;
        let c = &mut env.csi.controller;

        // Bad requests name the field; unknown volumes and nodes are NOT_FOUND.
        for (req, field) in [
            (publish_req("", NODE), "volume_id"),
            (publish_req(&id, ""), "node_id"),
            (
                ControllerPublishVolumeRequest {
                    volume_capability: None,
                    ..publish_req(&id, NODE)
                },
                "volume_capability",
            ),
        ] {
            let e = c.controller_publish_volume(req).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
            assert!(e.message().contains(field), "{}", e.message());
        }
        let e = c
            .controller_publish_volume(publish_req("no-such-volume", NODE))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{}", e.message());
        let e = c
            .controller_publish_volume(publish_req(&id, "no-such-node"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{}", e.message());
        assert!(e.message().contains("no-such-node"), "{}", e.message());

        // On the node the volume lives on: its consumer, recorded; twice is the same.
        for _ in 0..2 {
            c.controller_publish_volume(publish_req(&id, NODE))
                .await
                .unwrap();
        }
        let v = env.volumes().get("pvc-p").await.unwrap();
        assert_eq!(v.spec.host_node.as_ref().map(|h| h.id.as_str()), Some(NODE));
        assert_eq!(
            v.annotations().get(annotations::PUBLISHED_NODE).map(String::as_str),
            Some(NODE)
        );
        // One node at a time.
        let c = &mut env.csi.controller;
        let e = c
            .controller_publish_volume(publish_req(&id, "node-2"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
        assert!(e.message().contains("published to node node-1"), "{}", e.message());
        // Unpublished (twice: idempotent), then the file volume, which no node but its own
        // can reach, is still refused elsewhere, for that reason.
        for _ in 0..2 {
            c.controller_unpublish_volume(unpublish_req(&id, NODE))
                .await
                .unwrap();
        }
        let e = c
            .controller_publish_volume(publish_req(&id, "node-2"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
        assert!(e.message().contains("cannot export it"), "{}", e.message());
        let v = env.volumes().get("pvc-p").await.unwrap();
        assert!(!v.annotations().contains_key(annotations::PUBLISHED_NODE));
        assert_eq!(v.spec.host_node.as_ref().map(|h| h.id.as_str()), Some(NODE));

        // Exported over NVMe-oF (as an SPDK agent records it): the consumer moves to node-2,
        // and the publish returns once the export admits node-2.
        env.volumes()
            .patch(
                "pvc-p",
                &PatchParams::default(),
                &Patch::Merge(json!({
                    "metadata": {"annotations": {
                        annotations::EXPORTED_TO: NODE,
                        annotations::LOCAL_ONLY: "true",
                    }},
                    "spec": {"spdkTarget": {"subsysNqn": "nqn.2021-03.com.alipay.ob:uuid:x", "svcID": "4420", "transType": "TCP", "nsUuid": id, "sn": "s"}},
                })),
            )
            .await
            .unwrap();
        let mut c2 = env.csi.controller.clone();
        let id2 = id.clone();
        let publish = tokio::spawn(async move {
            c2.controller_publish_volume(publish_req(&id2, "node-2"))
                .await
        });
        let moved = kube::runtime::wait::await_condition(
            env.volumes(),
            "pvc-p",
            |v: Option<&liteio_api::AntstorVolume>| {
                v.and_then(|v| v.spec.host_node.as_ref())
                    .is_some_and(|h| h.id == "node-2")
            },
        )
        .await
        .unwrap()
        .unwrap();
        assert!(!publish.is_finished(), "the publish waits for the export");
        assert!(!moved.annotations().contains_key(annotations::LOCAL_ONLY));
        env.volumes()
            .patch(
                "pvc-p",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {annotations::EXPORTED_TO: "node-2"}}})),
            )
            .await
            .unwrap();
        publish.await.unwrap().unwrap();
        let v = env.volumes().get("pvc-p").await.unwrap();
        assert_eq!(
            v.annotations().get(annotations::PUBLISHED_NODE).map(String::as_str),
            Some("node-2")
        );

        // Unpublishing a volume that does not exist is done already.
        env.csi
            .controller
            .controller_unpublish_volume(unpublish_req("no-such-volume", NODE))
            .await
            .unwrap();
        env.stop().await;
    })
    .await;
}

fn modify_req(volume_id: &str, kv: &[(&str, &str)]) -> ControllerModifyVolumeRequest {
    ControllerModifyVolumeRequest {
        volume_id: volume_id.into(),
        secrets: HashMap::new(),
        mutable_parameters: kv
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// QoS limits from the StorageClass and the VolumeAttributesClass (CreateVolume's and
/// ControllerModifyVolume's mutable parameters) land in `spec.qos`; bad keys and values are
/// INVALID_ARGUMENT naming them; a volume whose engine cannot enforce a limit refuses it.
#[tokio::test]
async fn qos_limits_from_the_class_and_modify_volume() {
    use liteio_api::qos::{PARAM_IOPS, PARAM_READ_MBPS, PARAM_WRITE_MBPS, VolumeQos};
    bounded(async {
        let mut env = start(true, false, |_| {}).await;
        // The node's pool is an SPDK lvstore: it enforces limits.
        pool(&env.client, NODE, 1 << 40).await;
        Api::<StoragePool>::namespaced(env.client.clone(), "obnvmf")
            .patch(
                NODE,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"spec": {"spdkLVStore": {"name": "lvs", "bytes": 1u64 << 40}}}),
                ),
            )
            .await
            .unwrap();
        env.start_scheduler(1 << 40);
        let mut req = create_req("pvc-q", 8 * MIB_I);
        req.parameters.insert(PARAM_IOPS.into(), "2000".into());
        req.mutable_parameters
            .insert(PARAM_WRITE_MBPS.into(), "50".into());
        let v = env
            .csi
            .controller
            .create_volume(req.clone())
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        let id = v.volume_id.clone();
        let want = VolumeQos {
            iops: 2000,
            write_mbps: 50,
            ..Default::default()
        };
        assert_eq!(
            env.volumes().get("pvc-q").await.unwrap().spec.qos,
            Some(want)
        );
        // The same request is the same volume; other limits are another volume.
        env.csi.controller.create_volume(req.clone()).await.unwrap();
        let mut other = req.clone();
        other.parameters.insert(PARAM_IOPS.into(), "3000".into());
        let e = env.csi.controller.create_volume(other).await.unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists);
        assert!(e.message().contains("spec.qos"), "{}", e.message());
        // A bad value in the class names its parameter.
        let mut bad = create_req("pvc-q2", 8 * MIB_I);
        bad.parameters.insert(PARAM_IOPS.into(), "1500".into());
        let e = env.csi.controller.create_volume(bad).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(
            e.message().contains("parameters.liteio.io/qos-iops"),
            "{}",
            e.message()
        );
        assert!(env.volumes().get_opt("pvc-q2").await.unwrap().is_none());

        // ModifyVolume changes what it names and keeps the rest; again is a no-op.
        let m = modify_req(&id, &[(PARAM_READ_MBPS, "100"), (PARAM_IOPS, "4000")]);
        env.csi
            .controller
            .controller_modify_volume(m.clone())
            .await
            .unwrap();
        let rv = env.volumes().get("pvc-q").await.unwrap();
        assert_eq!(
            rv.spec.qos,
            Some(VolumeQos {
                iops: 4000,
                read_mbps: 100,
                write_mbps: 50,
                mbps: 0
            })
        );
        env.csi
            .controller
            .controller_modify_volume(m)
            .await
            .unwrap();
        assert_eq!(
            env.volumes().get("pvc-q").await.unwrap().resource_version(),
            rv.resource_version(),
            "an unchanged limit writes nothing"
        );
        // Bad requests name the key; a missing volume is NOT_FOUND.
        for (kv, key) in [
            (
                ("liteio.io/qos-burst", "1"),
                "mutable_parameters.liteio.io/qos-burst",
            ),
            ((PARAM_IOPS, "12x"), "mutable_parameters.liteio.io/qos-iops"),
            ((PARAM_IOPS, "999"), "mutable_parameters.liteio.io/qos-iops"),
        ] {
            let e = env
                .csi
                .controller
                .controller_modify_volume(modify_req(&id, &[kv]))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{kv:?}: {}", e.message());
            assert!(e.message().contains(key), "{kv:?}: {}", e.message());
        }
        let e = env
            .csi
            .controller
            .controller_modify_volume(modify_req("no-such-volume", &[(PARAM_IOPS, "1000")]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        let e = env
            .csi
            .controller
            .controller_modify_volume(modify_req("", &[(PARAM_IOPS, "1000")]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);

        // 0 everywhere lifts the limits: no spec.qos at all.
        env.csi
            .controller
            .controller_modify_volume(modify_req(
                &id,
                &[
                    (PARAM_IOPS, "0"),
                    (PARAM_READ_MBPS, "0"),
                    (PARAM_WRITE_MBPS, "0"),
                ],
            ))
            .await
            .unwrap();
        assert_eq!(env.volumes().get("pvc-q").await.unwrap().spec.qos, None);

        // A volume of the LVM or file engine cannot enforce a limit: refused, not recorded.
        env.volumes()
            .patch(
                "pvc-q",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"type": "KernelLVol"}})),
            )
            .await
            .unwrap();
        let e = env
            .csi
            .controller
            .controller_modify_volume(modify_req(&id, &[(PARAM_IOPS, "1000")]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
        assert!(
            e.message().contains("only the SPDK engine"),
            "{}",
            e.message()
        );
        assert_eq!(env.volumes().get("pvc-q").await.unwrap().spec.qos, None);
        env.stop().await;
    })
    .await;
}
