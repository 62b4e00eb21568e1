//! T1: multi-disk volumes (`obnvmf/pv-type: VolumeGroup`) through the Controller service over
//! the real gRPC socket against the test API server. The placement is the controller's
//! (tested in the controller crate); here a stand-in records one member when the group
//! appears (as many as it asks for when it gives a count, as a replicated volume's does), or
//! refuses it, as the controller does. Replicated volumes (raid1): the objects CreateVolume
//! makes and the keys it refuses.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;

use common::{NODE, bounded, start};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use liteio_api::PoolMode;
use liteio_api::datacontrol::RaidLevel;
use liteio_api::group::ANNO_MEMBER_RESERVE;
use liteio_api::keys::labels;
use liteio_api::replica;
use liteio_api::{AntstorDataControl, AntstorVolumeGroup};
use liteio_csi::csi::volume_capability::access_mode::Mode;
use liteio_csi::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use liteio_csi::csi::*;
use serde_json::json;
use tonic::Code;

const GIB: i64 = 1 << 30;

fn cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

fn req(name: &str, bytes: i64, params: &[(&str, &str)]) -> CreateVolumeRequest {
    let mut parameters: HashMap<String, String> = params
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    parameters.insert("fsType".into(), "ext4".into());
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap()],
        parameters,
        ..Default::default()
    }
}

/// Groups larger than this do not fit in the stand-in's pools.
const ROOM: i64 = 6 * GIB;

/// Stands in for the controller: a group gets one more member for what its placed members
/// do not hold yet (a new group one member holding its total, a grown one a member for the
/// difference), except groups named `*-full` and groups larger than [`ROOM`], which get the
/// controller's NoStoragePoolAvailable message instead.
fn place_groups(client: &kube::Client) -> tokio::task::JoinHandle<()> {
    let api: Api<AntstorVolumeGroup> = Api::namespaced(client.clone(), "obnvmf");
    tokio::spawn(async move {
        let mut s = watcher(api.clone(), watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(g)) = s.next().await {
            let refused = g
                .status
                .as_ref()
                .is_some_and(|s| s.message.starts_with("NoStoragePoolAvailable"));
            if g.fully_placed() || refused {
                continue;
            }
            let name = g.name_any();
            let pp = PatchParams::default();
            if name.ends_with("-full") || g.spec.total_size > ROOM {
                let _ = api
                    .patch_status(
                        &name,
                        &pp,
                        &Patch::Merge(json!({"status": {"status": "creating",
                            "message": "NoStoragePoolAvailable: 1073741824 of the group's 1073741824 bytes have no place"}})),
                    )
                    .await;
                continue;
            }
            let mut volumes = serde_json::to_value(&g.spec.volumes).unwrap();
            let desired = g.spec.desired_volume_spec.desired_count;
            // A group with a member count (a replicated volume's) gets that many equal
            // members; another one member for what is missing.
            let (count, size) = if desired > 0 {
                (
                    desired as usize - g.spec.volumes.len(),
                    g.spec.total_size / desired + g.member_reserve() as i64,
                )
            } else {
                (
                    1,
                    g.spec.total_size - g.scheduled_bytes() as i64 + g.member_reserve() as i64,
                )
            };
            for _ in 0..count {
                let i = volumes.as_array().unwrap().len();
                volumes.as_array_mut().unwrap().push(json!({
                    "volId": {"namespace": "obnvmf", "name": format!("{name}-m{i}"), "uuid": format!("m{i}")},
                    "targetNodeName": format!("node-{i}"), "size": size}));
            }
            let _ = api
                .patch(
                    &name,
                    &pp,
                    &Patch::Merge(
                        json!({"metadata": {"resourceVersion": g.metadata.resource_version},
                        "spec": {"volumes": volumes}}),
                    ),
                )
                .await;
        }
    })
}

#[tokio::test]
async fn a_multi_disk_volume_is_created_published_and_deleted() {
    bounded(async {
        let mut env = start(true, false, |_| {}).await;
        let placer = place_groups(&env.client);
        let r = req(
            "pvc-md",
            3 * GIB,
            &[
                ("obnvmf/pv-type", "VolumeGroup"),
                ("datacontrol/raid-level", "raid0"),
                ("volgroup/max-volumes", "3"),
            ],
        );
        let v = env
            .csi
            .controller
            .create_volume(r.clone())
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        assert!(v.volume_id.starts_with("dc-"), "{}", v.volume_id);
        assert_eq!(v.capacity_bytes, 3 * GIB);
        let groups: Api<AntstorVolumeGroup> = Api::namespaced(env.client.clone(), "obnvmf");
        let dcs: Api<AntstorDataControl> = Api::namespaced(env.client.clone(), "obnvmf");
        let g = groups.get("pvc-md").await.unwrap();
        let d = &g.spec.desired_volume_spec;
        assert!(
            d.size_symmetry.is_symmetric(),
            "raid0 defaults to Symmetric"
        );
        assert_eq!((d.count_range.min, d.count_range.max), (2, 3));
        assert_eq!(
            g.annotations().get(ANNO_MEMBER_RESERVE).map(String::as_str),
            Some("4194304"),
            "KernelLVM (the default) reserves an extent per member"
        );
        assert_eq!(
            d.labels.get(labels::PV_NAME).map(String::as_str),
            Some("pvc-md")
        );
        let dc = dcs.get("pvc-md").await.unwrap();
        assert_eq!(dc.spec.uuid, v.volume_id);
        assert_eq!(dc.spec.engine_type, PoolMode::KernelLVM);
        assert_eq!(dc.spec.raid.level, RaidLevel::Raid0);
        assert_eq!(dc.spec.volume_groups[0].name, "pvc-md");
        // One key Secret for the PV, owned by the data control.
        let secrets: Api<Secret> = Api::namespaced(env.client.clone(), "obnvmf");
        let s = secrets.get("liteio-auth-pvc-md").await.unwrap();
        assert_eq!(s.owner_references()[0].kind, "AntstorDataControl");

        // Idempotent; another size is another volume.
        let again = env
            .csi
            .controller
            .create_volume(r.clone())
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        assert_eq!(again.volume_id, v.volume_id);
        let mut bigger = r.clone();
        bigger.capacity_range.as_mut().unwrap().required_bytes = 4 * GIB;
        let e = env.csi.controller.create_volume(bigger).await.unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");

        // Published to the node: it becomes the host.
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
        let mut node = k8s_openapi::api::core::v1::Node::default();
        node.metadata.name = Some(NODE.into());
        nodes
            .create(&kube::api::PostParams::default(), &node)
            .await
            .unwrap();
        env.csi
            .controller
            .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
                volume_id: v.volume_id.clone(),
                volume_capabilities: vec![cap()],
                ..Default::default()
            })
            .await
            .unwrap();
        env.csi
            .controller
            .controller_publish_volume(ControllerPublishVolumeRequest {
                volume_id: v.volume_id.clone(),
                node_id: NODE.into(),
                volume_capability: Some(cap()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(dcs.get("pvc-md").await.unwrap().spec.host_node.id, NODE);

        // Expanded: the group grows (a member for the difference is placed), then the data
        // control; the host grows the LV at NodeExpandVolume.
        let expand = |bytes: i64| ControllerExpandVolumeRequest {
            volume_id: v.volume_id.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: bytes,
                limit_bytes: 0,
            }),
            ..Default::default()
        };
        let grown = env
            .csi
            .controller
            .controller_expand_volume(expand(4 * GIB + 1))
            .await
            .unwrap()
            .into_inner();
        let four_and_a_bit = 4 * GIB + (4 << 20);
        assert_eq!(grown.capacity_bytes, four_and_a_bit, "rounded up to 4 MiB");
        assert!(grown.node_expansion_required);
        let g = groups.get("pvc-md").await.unwrap();
        assert_eq!(g.spec.total_size, four_and_a_bit);
        assert_eq!(g.spec.volumes.len(), 2, "{:?}", g.spec.volumes);
        assert!(g.fully_placed());
        assert_eq!(
            dcs.get("pvc-md").await.unwrap().spec.total_size,
            four_and_a_bit
        );
        // Again, or smaller: the current size, nothing placed.
        for bytes in [4 * GIB + 1, 2 * GIB] {
            let again = env
                .csi
                .controller
                .controller_expand_volume(expand(bytes))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(again.capacity_bytes, four_and_a_bit);
        }
        assert_eq!(groups.get("pvc-md").await.unwrap().spec.volumes.len(), 2);
        // More than the pools hold: OUT_OF_RANGE with the controller's reason, and the group's
        // size is put back so that nothing keeps trying to place it.
        let e = env
            .csi
            .controller
            .controller_expand_volume(expand(8 * GIB))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
        assert!(e.message().contains("NoStoragePoolAvailable"), "{e:?}");
        let g = groups.get("pvc-md").await.unwrap();
        assert_eq!(g.spec.total_size, four_and_a_bit);
        assert_eq!(g.spec.volumes.len(), 2);
        assert_eq!(
            dcs.get("pvc-md").await.unwrap().spec.total_size,
            four_and_a_bit
        );
        // A volume that does not exist.
        let e = env
            .csi
            .controller
            .controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: "dc-00000000-0000-0000-0000-000000000000".into(),
                ..expand(5 * GIB)
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
        // An SpdkLVStore volume cannot grow (its raid bdev takes no new member): refused by
        // name before anything changes.
        let spdk = env
            .csi
            .controller
            .create_volume(req(
                "pvc-md-spdk",
                2 * GIB,
                &[
                    ("obnvmf/pv-type", "VolumeGroup"),
                    ("datacontrol/engine-type", "SpdkLVStore"),
                ],
            ))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        let e = env
            .csi
            .controller
            .controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: spdk.volume_id.clone(),
                ..expand(3 * GIB)
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("SpdkLVStore"), "{e:?}");
        assert_eq!(
            groups.get("pvc-md-spdk").await.unwrap().spec.total_size,
            2 * GIB
        );
        env.csi
            .controller
            .delete_volume(DeleteVolumeRequest {
                volume_id: spdk.volume_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap();

        // What groups cannot do yet is refused by name.
        let e = env
            .csi
            .controller
            .create_snapshot(CreateSnapshotRequest {
                name: "snap-md".into(),
                source_volume_id: v.volume_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");

        // Deleted: data control, group and keys; twice is fine.
        for _ in 0..2 {
            env.csi
                .controller
                .delete_volume(DeleteVolumeRequest {
                    volume_id: v.volume_id.clone(),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        assert!(dcs.get_opt("pvc-md").await.unwrap().is_none());
        assert!(groups.get_opt("pvc-md").await.unwrap().is_none());
        assert!(
            secrets
                .get_opt("liteio-auth-pvc-md")
                .await
                .unwrap()
                .is_none()
        );
        placer.abort();
        env.stop().await;
    })
    .await;
}

#[tokio::test]
async fn bad_parameters_and_unplaceable_groups_are_refused() {
    bounded(async {
        let mut env = start(true, false, |_| {}).await;
        let placer = place_groups(&env.client);
        let vg = ("obnvmf/pv-type", "VolumeGroup");
        for (params, field) in [
            (
                vec![vg, ("datacontrol/raid-level", "raid5")],
                "datacontrol/raid-level",
            ),
            (vec![vg, ("volgroup/max-size", "")], ""),
            (vec![vg, ("volgroup/min-size", "x")], "volgroup/min-size"),
            (
                vec![vg, ("volgroup/max-volumes", "100")],
                "volgroup/max-volumes",
            ),
            (
                vec![vg, ("liteio.io/qos-iops", "1000")],
                "liteio.io/qos-iops",
            ),
            (vec![vg, ("nvmfTls", "true")], "nvmfTls"),
        ] {
            let r = req("pvc-bad", GIB, &params);
            let res = env.csi.controller.create_volume(r).await;
            if field.is_empty() {
                // An empty value is the default (LiteIO panicked on it): not an error.
                assert!(res.is_ok(), "{params:?}: {res:?}");
                continue;
            }
            let e = res.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{params:?}: {e:?}");
            assert!(e.message().contains(field), "{params:?}: {}", e.message());
        }
        // Nothing fits: RESOURCE_EXHAUSTED with the controller's reason.
        let e = env
            .csi
            .controller
            .create_volume(req("pvc-full", GIB, &[vg]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(
            e.message().contains("NoStoragePoolAvailable"),
            "{}",
            e.message()
        );
        placer.abort();
        env.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_replicated_volume_is_one_group_of_whole_copies_and_bad_values_name_their_key() {
    bounded(async {
        let mut env = start(true, false, |_| {}).await;
        let placer = place_groups(&env.client);
        let groups: Api<AntstorVolumeGroup> = Api::namespaced(env.client.clone(), "obnvmf");
        let dcs: Api<AntstorDataControl> = Api::namespaced(env.client.clone(), "obnvmf");
        let mib4 = (4i64 << 20).to_string();

        // LiteIO's spelling: raid1 alone is two replicas, assembled in SPDK.
        let r = req("pvc-r1", 2 * GIB, &[("datacontrol/raid-level", "raid1")]);
        let v = env
            .csi
            .controller
            .create_volume(r.clone())
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        assert!(v.volume_id.starts_with("dc-"), "{}", v.volume_id);
        assert_eq!(
            v.capacity_bytes,
            2 * GIB,
            "the volume's size, not its copies'"
        );
        let dc = dcs.get("pvc-r1").await.unwrap();
        assert!(dc.is_replicated());
        assert_eq!(dc.spec.raid.level, RaidLevel::Raid1);
        assert_eq!(dc.spec.engine_type, PoolMode::SpdkLVStore);
        assert_eq!(dc.spec.total_size, 2 * GIB);
        let g = groups.get("pvc-r1").await.unwrap();
        let d = &g.spec.desired_volume_spec;
        assert_eq!(g.spec.total_size, 4 * GIB, "two copies of 2 GiB");
        assert!(d.size_symmetry.is_symmetric());
        assert_eq!(d.desired_count, 2);
        assert_eq!((d.count_range.min, d.count_range.max), (2, 2));
        let whole = Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
            (2 * GIB).to_string(),
        ));
        assert_eq!((&d.size_range.min, &d.size_range.max), (&whole, &whole));
        assert_eq!(
            d.annotations.get("obnvmf/volume-type").map(String::as_str),
            Some("SpdkLVol")
        );
        assert_eq!(
            g.annotations().get(ANNO_MEMBER_RESERVE),
            Some(&mib4),
            "the raid superblock's reserve"
        );
        assert!(!g.annotations().contains_key(replica::ANNO_SPREAD_KEY));
        // Placed as two whole copies (the stand-in places what the group asks for).
        assert_eq!(g.spec.volumes.len(), 2);
        assert!(g.spec.volumes.iter().all(|m| m.size == 2 * GIB + (4 << 20)));

        // The count alone makes a raid1 of that many, with the spread key on the group.
        let r3 = req(
            "pvc-r3",
            GIB,
            &[
                ("liteio.io/replicas", "3"),
                (
                    "liteio.io/replica-spread-key",
                    "topology.kubernetes.io/zone",
                ),
            ],
        );
        let v3 = env
            .csi
            .controller
            .create_volume(r3.clone())
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        assert_eq!(v3.capacity_bytes, GIB);
        assert_eq!(
            dcs.get("pvc-r3").await.unwrap().spec.raid.level,
            RaidLevel::Raid1
        );
        let g3 = groups.get("pvc-r3").await.unwrap();
        assert_eq!(g3.spec.total_size, 3 * GIB);
        assert_eq!(g3.spec.desired_volume_spec.desired_count, 3);
        assert_eq!(
            g3.annotations()
                .get(replica::ANNO_SPREAD_KEY)
                .map(String::as_str),
            Some("topology.kubernetes.io/zone")
        );
        // A retry is the same volume; another replica count or spread key is not.
        let again = env
            .csi
            .controller
            .create_volume(r3.clone())
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        assert_eq!(again.volume_id, v3.volume_id);
        for other in [
            vec![("liteio.io/replicas", "2")],
            vec![("liteio.io/replicas", "3")],
        ] {
            let e = env
                .csi
                .controller
                .create_volume(req("pvc-r3", GIB, &other))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::AlreadyExists, "{other:?}: {e:?}");
        }
        // Not grown (the raid1 over live replicas is not grown yet): refused by name.
        let e = env
            .csi
            .controller
            .controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: v.volume_id.clone(),
                capacity_range: Some(CapacityRange {
                    required_bytes: 3 * GIB,
                    limit_bytes: 0,
                }),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("replicated"), "{}", e.message());
        assert_eq!(groups.get("pvc-r1").await.unwrap().spec.total_size, 4 * GIB);

        // Bad values: INVALID_ARGUMENT naming the key, nothing created.
        for (params, key) in [
            (vec![("liteio.io/replicas", "1")], "liteio.io/replicas"),
            (vec![("liteio.io/replicas", "6")], "liteio.io/replicas"),
            (vec![("liteio.io/replicas", "x")], "liteio.io/replicas"),
            (
                vec![
                    ("liteio.io/replicas", "2"),
                    ("datacontrol/raid-level", "raid0"),
                ],
                "liteio.io/replicas",
            ),
            (
                vec![
                    ("obnvmf/pv-type", "VolumeGroup"),
                    ("liteio.io/replicas", "2"),
                    ("datacontrol/raid-level", "linear"),
                ],
                "liteio.io/replicas",
            ),
            (
                vec![
                    ("datacontrol/raid-level", "raid1"),
                    ("datacontrol/engine-type", "KernelLVM"),
                ],
                "datacontrol/engine-type",
            ),
            (
                vec![
                    ("liteio.io/replicas", "2"),
                    ("liteio.io/replica-spread-key", "no key"),
                ],
                "liteio.io/replica-spread-key",
            ),
        ] {
            let e = env
                .csi
                .controller
                .create_volume(req("pvc-rbad", GIB, &params))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{params:?}: {e:?}");
            assert!(
                e.message().contains(&format!("parameters.{key}")),
                "{params:?}: {}",
                e.message()
            );
        }
        assert!(dcs.get_opt("pvc-rbad").await.unwrap().is_none());
        assert!(groups.get_opt("pvc-rbad").await.unwrap().is_none());

        for id in [&v.volume_id, &v3.volume_id] {
            env.csi
                .controller
                .delete_volume(DeleteVolumeRequest {
                    volume_id: id.clone(),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        assert!(dcs.get_opt("pvc-r1").await.unwrap().is_none());
        assert!(groups.get_opt("pvc-r3").await.unwrap().is_none());
        placer.abort();
        env.stop().await;
    })
    .await;
}
