//! T1 property tests: bad CSI requests through the driver's gRPC socket against the test
//! API server (issue 16, item 5).
//!
//! CreateVolume with arbitrary names (unicode, empty, long), capacities (any i64),
//! StorageClass parameters and capabilities; DeleteVolume, ControllerExpandVolume,
//! ValidateVolumeCapabilities, ListVolumes and NodeStage/NodePublish with arbitrary ids,
//! paths and tokens. Each request gets a status, never a broken connection (a panic in a
//! handler); an `INVALID_ARGUMENT` names the request field; a refused CreateVolume leaves no
//! AntstorVolume behind, an accepted one is deleted again. No volume ever exists that a
//! random node request could find, so NodeStage/NodePublish never reach mount or nvme.
//! (NodeUnstage/NodeUnpublish are left out: they unmount the given path even when the volume
//! is unknown, which on this machine would be the real mount table.)
//!
//! Cases per property: 128, or `PROPTEST_CASES`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::result_large_err)]

mod common;

use std::collections::HashMap;

use common::{NS, bounded, pool, start};
use kube::api::{Api, ListParams};
use liteio_api::AntstorVolume;
use liteio_csi::csi::volume_capability::access_mode::Mode;
use liteio_csi::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use liteio_csi::csi::*;
use liteio_tests::prop::{cases, runner};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tonic::Code;

const CASES: u32 = 128;

fn nasty_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just(" ".to_string()),
        Just("-1".to_string()),
        Just("ext4".to_string()),
        Just("ünïcödé-名前-🦀".to_string()),
        Just("../../etc".to_string()),
        Just("a".repeat(300)),
        "\\PC{0,30}",
        "[a-z0-9-]{1,20}",
    ]
}

fn capability() -> impl Strategy<Value = VolumeCapability> {
    let access_type = prop_oneof![
        Just(None),
        Just(Some(AccessType::Block(BlockVolume {}))),
        nasty_string().prop_map(|fs| Some(AccessType::Mount(MountVolume {
            fs_type: fs,
            ..MountVolume::default()
        }))),
    ];
    let mode = prop_oneof![
        Just(Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32
        })),
        any::<i32>().prop_map(|m| Some(AccessMode { mode: m })),
        Just(None),
    ];
    (access_type, mode).prop_map(|(access_type, access_mode)| VolumeCapability {
        access_type,
        access_mode,
    })
}

fn bytes() -> impl Strategy<Value = i64> {
    prop_oneof![
        any::<i64>(),
        Just(i64::MAX),
        Just(-1i64),
        Just(0i64),
        (1i64..64).prop_map(|m| m << 20),
    ]
}

#[derive(Debug, Clone)]
enum Request {
    Create(CreateVolumeRequest),
    Delete(String),
    Expand(String, i64, i64),
    Validate(String, Vec<VolumeCapability>),
    List(i32, String),
    Stage(String, String, Option<VolumeCapability>),
    Publish(String, String, String, Option<VolumeCapability>),
}

fn request() -> impl Strategy<Value = Request> {
    let params = prop::collection::hash_map(
        prop_oneof![
            Just("fsType".to_string()),
            Just("volumeType".to_string()),
            Just("positionAdvice".to_string()),
            Just("obnvmf/pv-type".to_string()),
            nasty_string(),
        ],
        nasty_string(),
        0..4,
    );
    let create = (
        nasty_string(),
        prop::option::of((bytes(), bytes())),
        prop::collection::vec(capability(), 0..3),
        params,
    )
        .prop_map(|(name, range, caps, parameters)| {
            Request::Create(CreateVolumeRequest {
                name,
                capacity_range: range.map(|(r, l)| CapacityRange {
                    required_bytes: r,
                    limit_bytes: l,
                }),
                volume_capabilities: caps,
                parameters: parameters.into_iter().collect::<HashMap<_, _>>(),
                ..Default::default()
            })
        });
    // Mostly valid: each part valid three times in four, so that some get through.
    let good_cap = VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    };
    let mostly_valid = (
        prop_oneof![3 => "[a-z][a-z0-9-]{0,20}", 1 => nasty_string()],
        prop_oneof![
            3 => (1i64..64).prop_map(|m| Some((m << 20, 0))),
            1 => prop::option::of((bytes(), bytes())),
        ],
        prop_oneof![
            3 => Just(vec![good_cap]),
            1 => prop::collection::vec(capability(), 0..3),
        ],
        prop_oneof![
            3 => Just(HashMap::from([("fsType".to_string(), "ext4".to_string())])),
            1 => prop::collection::hash_map(nasty_string(), nasty_string(), 0..3),
        ],
    )
        .prop_map(|(name, range, caps, parameters)| {
            Request::Create(CreateVolumeRequest {
                name,
                capacity_range: range.map(|(r, l)| CapacityRange {
                    required_bytes: r,
                    limit_bytes: l,
                }),
                volume_capabilities: caps,
                parameters,
                ..Default::default()
            })
        });
    prop_oneof![
        2 => create,
        3 => mostly_valid,
        1 => nasty_string().prop_map(Request::Delete),
        1 => (nasty_string(), bytes(), bytes()).prop_map(|(i, r, l)| Request::Expand(i, r, l)),
        1 => (nasty_string(), prop::collection::vec(capability(), 0..3))
            .prop_map(|(i, c)| Request::Validate(i, c)),
        1 => (any::<i32>(), nasty_string()).prop_map(|(m, t)| Request::List(m, t)),
        1 => (nasty_string(), nasty_string(), prop::option::of(capability()))
            .prop_map(|(i, p, c)| Request::Stage(i, p, c)),
        1 => (nasty_string(), nasty_string(), nasty_string(), prop::option::of(capability()))
            .prop_map(|(i, t, s, c)| Request::Publish(i, t, s, c)),
    ]
}

/// Fields an INVALID_ARGUMENT may be about.
const FIELDS: &[&str] = &[
    "name",
    "volume_id",
    "volume_capabilities",
    "volume_capability",
    "capacity_range",
    "parameters.",
    "max_entries",
    "starting_token",
    "staging_target_path",
    "target_path",
];

fn a_status(s: &tonic::Status) -> Result<(), TestCaseError> {
    // A handler that panicked shows up as a broken stream, not as a status it chose.
    prop_assert!(
        s.code() != Code::Unknown && !s.message().contains("h2 protocol error"),
        "not an answer: {s:?}"
    );
    if s.code() == Code::InvalidArgument {
        prop_assert!(
            FIELDS.iter().any(|f| s.message().starts_with(f)),
            "INVALID_ARGUMENT names no field: {:?}",
            s.message()
        );
    }
    Ok(())
}

async fn volumes_named(api: &Api<AntstorVolume>, csi_name: &str) -> usize {
    let obj = liteio_csi::params::object_name(csi_name);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|v| v.metadata.name.as_deref() == Some(obj.as_str()))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_a_status_naming_the_field_and_leave_nothing_behind() {
    bounded(async {
        let mut env = start(true, true, |c| {
            c.schedule_timeout = std::time::Duration::from_secs(2);
            c.ready_timeout = std::time::Duration::from_secs(1);
        })
        .await;
        pool(&env.client, common::NODE, 1 << 30).await;
        env.start_scheduler(1 << 30);
        let csi = env.csi.clone();
        let vols: Api<AntstorVolume> = Api::namespaced(env.client.clone(), NS);
        let handle = tokio::runtime::Handle::current();
        let ran = std::sync::atomic::AtomicU32::new(0);
        let created = std::sync::atomic::AtomicU32::new(0);
        let result = tokio::task::block_in_place(|| {
            runner(cases(CASES)).run(&request(), |req| {
                ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut c = csi.clone();
                handle.block_on(async {
                    match req {
                        Request::Create(r) => {
                            let name = r.name.clone();
                            // An earlier case may have made (and be deleting) this name.
                            let before = if name.is_empty() {
                                0
                            } else {
                                volumes_named(&vols, &name).await
                            };
                            match c.controller.create_volume(r).await {
                                Ok(ok) => {
                                    created.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    let id = ok.into_inner().volume.unwrap().volume_id;
                                    c.controller
                                        .delete_volume(DeleteVolumeRequest {
                                            volume_id: id,
                                            ..Default::default()
                                        })
                                        .await
                                        .map_err(|e| {
                                            TestCaseError::fail(format!("delete: {e:?}"))
                                        })?;
                                }
                                Err(s) => {
                                    a_status(&s)?;
                                    if matches!(s.code(), Code::InvalidArgument | Code::OutOfRange)
                                        && !name.is_empty()
                                    {
                                        let after = volumes_named(&vols, &name).await;
                                        prop_assert!(
                                            after <= before,
                                            "a refused CreateVolume left a volume"
                                        );
                                    }
                                }
                            }
                        }
                        Request::Delete(id) => {
                            if let Err(s) = c
                                .controller
                                .delete_volume(DeleteVolumeRequest {
                                    volume_id: id,
                                    ..Default::default()
                                })
                                .await
                            {
                                a_status(&s)?;
                            }
                        }
                        Request::Expand(id, r, l) => {
                            let req = ControllerExpandVolumeRequest {
                                volume_id: id,
                                capacity_range: Some(CapacityRange {
                                    required_bytes: r,
                                    limit_bytes: l,
                                }),
                                ..Default::default()
                            };
                            if let Err(s) = c.controller.controller_expand_volume(req).await {
                                a_status(&s)?;
                            }
                        }
                        Request::Validate(id, caps) => {
                            let req = ValidateVolumeCapabilitiesRequest {
                                volume_id: id,
                                volume_capabilities: caps,
                                ..Default::default()
                            };
                            if let Err(s) = c.controller.validate_volume_capabilities(req).await {
                                a_status(&s)?;
                            }
                        }
                        Request::List(max, token) => {
                            let req = ListVolumesRequest {
                                max_entries: max,
                                starting_token: token,
                            };
                            if let Err(s) = c.controller.list_volumes(req).await {
                                a_status(&s)?;
                            }
                        }
                        Request::Stage(id, path, cap) => {
                            let req = NodeStageVolumeRequest {
                                volume_id: id,
                                staging_target_path: path,
                                volume_capability: cap,
                                ..Default::default()
                            };
                            match c.node.node_stage_volume(req).await {
                                Ok(_) => prop_assert!(false, "staged a volume that does not exist"),
                                Err(s) => a_status(&s)?,
                            }
                        }
                        Request::Publish(id, target, staging, cap) => {
                            let req = NodePublishVolumeRequest {
                                volume_id: id,
                                target_path: target,
                                staging_target_path: staging,
                                volume_capability: cap,
                                ..Default::default()
                            };
                            match c.node.node_publish_volume(req).await {
                                Ok(_) => {
                                    prop_assert!(false, "published a volume that does not exist")
                                }
                                Err(s) => a_status(&s)?,
                            }
                        }
                    }
                    Ok(())
                })
            })
        });
        println!(
            "property CSI requests over gRPC: {} cases, {} volumes created and deleted",
            ran.load(std::sync::atomic::Ordering::Relaxed),
            created.load(std::sync::atomic::Ordering::Relaxed)
        );
        if let Err(e) = result {
            panic!("property CSI requests over gRPC failed: {e}");
        }
        env.stop().await;
    })
    .await;
}
