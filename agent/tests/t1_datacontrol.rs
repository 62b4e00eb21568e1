//! T1: the data-control sync's decisions for multi-disk volumes of engine SpdkLVStore,
//! against the test API server with a fake exporter that records the assemblies it is asked
//! for: it waits for the groups and members, asks for the right assembly (members in order,
//! remote and local, this node's host NQN, the host's NQN, the PV's keys), records the
//! export, the status and the finalizer, follows a change of host, tears down on delete,
//! reports and retries a failed assembly, re-asserts after a restart, refuses without SPDK
//! and leaves KernelLVM data controls alone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use liteio_agent::exporter::{
    AssemblyLevel, AssemblyRequest, ExportError, ExportFuture, ExportRequest, Exporter,
    ExporterHealth, MemberSource, ServedAssembly, UnassembleRequest, UnexportRequest,
};
use liteio_api::common::{PoolMode, VolumeStatus};
use liteio_api::datacontrol::{AntstorDataControlSpec, Raid, RaidLevel};
use liteio_api::group::{AntstorVolumeGroupSpec, EntityIdentity, VolumeMeta};
use liteio_api::keys::{self, annotations, finalizers, labels};
use liteio_api::{
    AntstorDataControl, AntstorVolume, AntstorVolumeGroup, NodeInfo, SpdkLvol, SpdkTarget,
    StoragePool, VolumeType, naming,
};
use serde_json::json;

const PV: &str = "pvc-multi";
const UUID: &str = "7e1c2a90-3b4d-4f5e-8a6b-1c2d3e4f5a6b";
const GIB: u64 = 1 << 30;
/// Members: (name, node, size); the second is on this agent's node.
const MEMBERS: [(&str, &str, u64); 3] = [
    ("pvc-multi-aaaaaaaaaa", "node-x", GIB),
    ("pvc-multi-bbbbbbbbbb", NODE, 2 * GIB),
    ("pvc-multi-cccccccccc", "node-y", GIB),
];

/// Records the assemblies asked for; hands out a target named after the request.
#[derive(Debug, Default)]
struct FakeAssembler {
    assemblies: Mutex<Vec<AssemblyRequest>>,
    removed: Mutex<Vec<UnassembleRequest>>,
    /// Fail this many calls of `ensure_assembly` before succeeding.
    fail: AtomicUsize,
    /// The subsystems of the assemblies made and not removed.
    serving: Mutex<std::collections::BTreeSet<String>>,
    /// The data-control UUIDs whose I/O is held (`fence_assembly`), and every call.
    fenced: Mutex<std::collections::BTreeSet<String>>,
    fence_calls: Mutex<Vec<(bool, String)>>,
}

fn target_of(req: &AssemblyRequest) -> SpdkTarget {
    SpdkTarget {
        bdev_name: naming::assembly_bdev(&req.name),
        subsys_nqn: naming::subsys_nqn(&req.uuid),
        svc_id: "4520".into(),
        sn: naming::serial_number(&req.uuid),
        trans_type: naming::TRANS_TYPE_TCP.into(),
        ns_uuid: naming::assembly_ns_uuid(&req.uuid),
        address: NODE_IP.into(),
        addr_fam: naming::ADDR_FAM_IPV4.into(),
    }
}

impl Exporter for FakeAssembler {
    fn health(&self) -> ExportFuture<'_, ExporterHealth> {
        healthy("v24.01")
    }
    fn ensure_export<'a>(&'a self, req: &'a ExportRequest) -> ExportFuture<'a, SpdkTarget> {
        Box::pin(async move {
            Err(ExportError::InvalidRequest(format!(
                "no volume is exported in this test ({})",
                req.volume
            )))
        })
    }
    fn remove_export<'a>(&'a self, _req: &'a UnexportRequest) -> ExportFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }
    fn authenticates(&self) -> bool {
        true
    }
    fn assembles(&self) -> bool {
        true
    }
    fn serves(&self, nqn: &str) -> bool {
        self.serving.lock().unwrap().contains(nqn)
    }
    fn assemblies(&self) -> Vec<ServedAssembly> {
        // The test's assemblies are all of data control PV.
        let dc_uuid = format!("dc-{UUID}");
        if self.serves(&naming::subsys_nqn(&dc_uuid)) {
            vec![ServedAssembly {
                name: PV.to_string(),
                uuid: dc_uuid,
                mirror: self
                    .last()
                    .is_some_and(|r| r.level == AssemblyLevel::Mirror),
            }]
        } else {
            Vec::new()
        }
    }
    fn fence_assembly<'a>(&'a self, uuid: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            self.fenced.lock().unwrap().insert(uuid.to_string());
            self.fence_calls
                .lock()
                .unwrap()
                .push((true, uuid.to_string()));
            Ok(())
        })
    }
    fn unfence_assembly<'a>(&'a self, uuid: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            self.fenced.lock().unwrap().remove(uuid);
            self.fence_calls
                .lock()
                .unwrap()
                .push((false, uuid.to_string()));
            Ok(())
        })
    }
    fn ensure_assembly<'a>(&'a self, req: &'a AssemblyRequest) -> ExportFuture<'a, SpdkTarget> {
        Box::pin(async move {
            self.assemblies.lock().unwrap().push(req.clone());
            if self
                .fail
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(ExportError::Target {
                    message: "attach NVMe controller pvc-multi_m0: connection refused".into(),
                    source: None,
                });
            }
            let t = target_of(req);
            self.serving.lock().unwrap().insert(t.subsys_nqn.clone());
            Ok(t)
        })
    }
    fn remove_assembly<'a>(&'a self, req: &'a UnassembleRequest) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            self.removed.lock().unwrap().push(req.clone());
            self.serving
                .lock()
                .unwrap()
                .remove(&naming::subsys_nqn(&req.uuid));
            Ok(())
        })
    }
}

impl FakeAssembler {
    fn calls(&self) -> usize {
        self.assemblies.lock().unwrap().len()
    }
    fn last(&self) -> Option<AssemblyRequest> {
        self.assemblies.lock().unwrap().last().cloned()
    }
}

fn dcs(env: &Env) -> Api<AntstorDataControl> {
    Api::namespaced(env.client.clone(), keys::DEFAULT_NAMESPACE)
}

fn vols(env: &Env) -> Api<AntstorVolume> {
    Api::namespaced(env.client.clone(), keys::DEFAULT_NAMESPACE)
}

/// The data control as the controller leaves it for this node: SpdkLVStore, assigned here,
/// consumed by node-b.
fn data_control(name: &str, engine: PoolMode, level: RaidLevel) -> AntstorDataControl {
    let mut dc = AntstorDataControl::new(
        name,
        AntstorDataControlSpec {
            uuid: format!("dc-{UUID}"),
            total_size: i64::try_from(4 * GIB).unwrap(),
            engine_type: engine,
            raid: Raid { level },
            host_node: NodeInfo {
                id: "node-b".into(),
                ..NodeInfo::default()
            },
            target_node_id: NODE.into(),
            volume_groups: vec![EntityIdentity {
                namespace: keys::DEFAULT_NAMESPACE.into(),
                name: PV.into(),
                uuid: UUID.into(),
            }],
            ..AntstorDataControlSpec::default()
        },
    );
    dc.metadata.namespace = Some(keys::DEFAULT_NAMESPACE.into());
    dc.metadata.labels = Some(BTreeMap::from([
        (labels::TARGET_NODE_ID.to_string(), NODE.to_string()),
        (labels::PV_NAME.to_string(), PV.to_string()),
    ]));
    dc
}

/// The group, fully placed with [`MEMBERS`].
fn group() -> AntstorVolumeGroup {
    let mut g = AntstorVolumeGroup::new(
        PV,
        AntstorVolumeGroupSpec {
            uuid: UUID.into(),
            total_size: i64::try_from(4 * GIB).unwrap(),
            volumes: MEMBERS
                .iter()
                .enumerate()
                .map(|(i, (name, node, size))| VolumeMeta {
                    vol_id: EntityIdentity {
                        namespace: keys::DEFAULT_NAMESPACE.into(),
                        name: (*name).into(),
                        uuid: format!("0000000{i}-3b4d-4f5e-8a6b-1c2d3e4f5a6b"),
                    },
                    target_node_name: (*node).into(),
                    size: i64::try_from(*size).unwrap(),
                })
                .collect(),
            ..AntstorVolumeGroupSpec::default()
        },
    );
    g.metadata.namespace = Some(keys::DEFAULT_NAMESPACE.into());
    g
}

/// Member `i` as its agent leaves it once it admits this node: remote ones exported to it,
/// the local one with its lvol and (`exported`) still its own export. No `in-state`
/// finalizer and no node label: this agent's volume sync leaves them alone.
fn member(i: usize, exported: bool) -> AntstorVolume {
    let (name, node, size) = MEMBERS[i];
    let uuid = format!("0000000{i}-3b4d-4f5e-8a6b-1c2d3e4f5a6b");
    let mut v = AntstorVolume::new(
        name,
        liteio_api::AntstorVolumeSpec {
            uuid: uuid.clone(),
            size_byte: size,
            type_: Some(VolumeType::SpdkLVol),
            target_node_id: node.into(),
            host_node: Some(NodeInfo {
                id: NODE.into(),
                ..NodeInfo::default()
            }),
            spdk_lvol: Some(SpdkLvol {
                name: name.into(),
                lvs_name: format!("lvs-{node}"),
                thin: false,
            }),
            spdk_target: exported.then(|| SpdkTarget {
                subsys_nqn: naming::subsys_nqn(&uuid),
                svc_id: format!("{}", 4420 + i),
                address: format!("10.0.0.{}", 20 + i),
                ..SpdkTarget::default()
            }),
            ..liteio_api::AntstorVolumeSpec::default()
        },
    );
    v.metadata.namespace = Some(keys::DEFAULT_NAMESPACE.into());
    v.metadata.labels = Some(BTreeMap::from([
        (labels::VOL_GROUP_NAME.to_string(), PV.to_string()),
        (labels::PV_NAME.to_string(), PV.to_string()),
    ]));
    v.metadata.annotations = Some(BTreeMap::from([
        (annotations::VOLUME_TYPE.to_string(), "SpdkLVol".to_string()),
        (annotations::EXPORTED_TO.to_string(), NODE.to_string()),
    ]));
    v
}

async fn set_ready(api: &Api<AntstorVolume>, name: &str) {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"status": "ready"}})),
    )
    .await
    .unwrap();
}

async fn status_message(api: &Api<AntstorDataControl>, name: &str) -> String {
    api.get(name)
        .await
        .unwrap()
        .status
        .map(|s| s.message)
        .unwrap_or_default()
}

async fn wait_message(api: &Api<AntstorDataControl>, name: &str, needle: &str) -> String {
    eventually(
        &format!("status.message of {name} saying {needle:?}"),
        Duration::from_secs(10),
        || async {
            let m = status_message(api, name).await;
            m.contains(needle).then_some(m)
        },
    )
    .await
}

/// The host NQN this agent published on its StoragePool.
async fn own_nqn(env: &Env) -> String {
    let pools: Api<StoragePool> = ns_api(&env.client);
    eventually("this node's host NQN", Duration::from_secs(5), || async {
        pools
            .get_opt(NODE)
            .await
            .unwrap()?
            .host_nqn()
            .map(str::to_string)
    })
    .await
}

/// An agent whose exporter is `fake`, and the data-control API.
async fn start_with(
    fake: FakeAssembler,
) -> (
    Env,
    Arc<FakeAssembler>,
    liteio_agent::agent::Agent,
    Api<AntstorDataControl>,
) {
    let env = Env::new().await;
    let fake = Arc::new(fake);
    let agent = env.start_agent_with(fake.clone(), |_| {}).await;
    let dapi = dcs(&env);
    (env, fake, agent, dapi)
}

/// An agent with a fresh [`FakeAssembler`], the members in place and data control [`PV`]
/// of `level` assembled (ready).
async fn assembled(
    level: RaidLevel,
) -> (
    Env,
    Arc<FakeAssembler>,
    liteio_agent::agent::Agent,
    Api<AntstorDataControl>,
    AntstorDataControl,
) {
    let (env, fake, agent, dapi) = start_with(FakeAssembler::default()).await;
    members_in_place(&env).await;
    create_dc(&dapi, PV, PoolMode::SpdkLVStore, level).await;
    let dc = wait_dc_ready(&dapi, "ready", Duration::from_secs(10)).await;
    (env, fake, agent, dapi, dc)
}

/// Creates data control `name` of `engine` at `level`.
async fn create_dc(api: &Api<AntstorDataControl>, name: &str, engine: PoolMode, level: RaidLevel) {
    create(api, &data_control(name, engine, level)).await;
}

/// Waits (up to `within`) until data control [`PV`] is ready; returns it.
async fn wait_dc_ready(
    api: &Api<AntstorDataControl>,
    what: &str,
    within: Duration,
) -> AntstorDataControl {
    eventually(what, within, || async {
        let dc = api.get(PV).await.unwrap();
        (dc.status.as_ref().and_then(|s| s.status) == Some(VolumeStatus::Ready)).then_some(dc)
    })
    .await
}

fn has_assembly_finalizer(dc: &AntstorDataControl) -> bool {
    dc.finalizers().contains(&finalizers::ASSEMBLY.to_string())
}

/// Moves data control [`PV`] to `node` as the controller does: the label and the spec.
async fn move_to(api: &Api<AntstorDataControl>, node: &str) {
    api.patch(
        PV,
        &PatchParams::default(),
        &Patch::Merge(json!({
            "metadata": {"labels": {labels::TARGET_NODE_ID: node}},
            "spec": {"targetNodeId": node},
        })),
    )
    .await
    .unwrap();
}

/// The node's Lease updates fail from now on (until the faults are cleared).
fn fail_lease_updates(env: &Env) -> liteio_test_apiserver::Faults {
    let faults = env.server.faults();
    faults.fail_next(
        1_000_000,
        liteio_test_apiserver::Matcher::new(liteio_test_apiserver::Verb::Update, "leases"),
        500,
        "InternalError",
    );
    faults
}

/// Waits until the assembly of data control `uuid` is fenced.
async fn wait_fenced(fake: &FakeAssembler, uuid: &str, what: &str) {
    eventually(what, Duration::from_secs(20), || async {
        fake.fenced.lock().unwrap().contains(uuid).then_some(())
    })
    .await;
}

/// Waits (up to 20 s) for the first assembly removed.
async fn first_removed(fake: &FakeAssembler, what: &str) -> UnassembleRequest {
    eventually(what, Duration::from_secs(20), || async {
        fake.removed.lock().unwrap().first().cloned()
    })
    .await
}

/// Waits (up to `within`) until more than `before` assemblies were asked for.
async fn more_calls_than(fake: &FakeAssembler, before: usize, what: &str, within: Duration) {
    eventually(what, within, || async {
        (fake.calls() > before).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assembles_the_members_in_order_for_the_host_and_tears_down_on_delete() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (env, fake, agent, dapi) = start_with(FakeAssembler::default()).await;
        consumer_pool(&env.client).await;
        let vapi = vols(&env);

        // The data control before its group: it waits and says for what.
        create_dc(&dapi, PV, PoolMode::SpdkLVStore, RaidLevel::Linear).await;
        wait_message(&dapi, PV, "waiting for AntstorVolumeGroup pvc-multi").await;
        create_group(&env).await;
        wait_message(
            &dapi,
            PV,
            "waiting for member AntstorVolume pvc-multi-aaaaaaaaaa",
        )
        .await;

        // The members appear (each change reconciles the data control at once): not ready,
        // then ready, the local one still exported by its own agent.
        for i in 0..3 {
            create(&vapi, &member(i, true)).await;
        }
        wait_message(
            &dapi,
            PV,
            "waiting for member pvc-multi-aaaaaaaaaa to be ready",
        )
        .await;
        for (name, _, _) in MEMBERS {
            set_ready(&vapi, name).await;
        }
        wait_message(
            &dapi,
            PV,
            "waiting for member pvc-multi-bbbbbbbbbb to be unexported",
        )
        .await;
        assert_eq!(
            fake.calls(),
            0,
            "nothing is assembled before every member is in place"
        );
        assert!(!has_assembly_finalizer(&dapi.get(PV).await.unwrap()));

        // Its agent withdraws the export: assembled.
        vapi.patch(
            MEMBERS[1].0,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"spdkTarget": null}})),
        )
        .await
        .unwrap();
        let dc = wait_dc_ready(&dapi, "the data control ready", Duration::from_secs(10)).await;
        // The first assembly (the pass that follows the agent's own last write re-asserts it).
        let req = fake.assemblies.lock().unwrap()[0].clone();
        assert_eq!(req.name, PV);
        assert_eq!(req.uuid, format!("dc-{UUID}"));
        assert_eq!(req.level, AssemblyLevel::Concat, "linear is a concat");
        assert_eq!(req.strip_kb, 64);
        assert_eq!(req.size_bytes, 4 * GIB);
        // In the group's order; the remote members through their exports, the local one
        // by its lvol.
        let got: Vec<(&str, &str)> = req
            .members
            .iter()
            .map(|m| (m.volume.as_str(), m.node.as_str()))
            .collect();
        assert_eq!(got, MEMBERS.map(|(n, node, _)| (n, node)));
        for (i, m) in req.members.iter().enumerate() {
            match (&m.source, i) {
                (MemberSource::Local { lvol }, 1) => {
                    assert_eq!(lvol.full_name(), format!("lvs-{NODE}/{}", MEMBERS[1].0))
                }
                (MemberSource::Remote { target }, 0 | 2) => {
                    assert_eq!(target.address, format!("10.0.0.{}", 20 + i));
                    assert_eq!(target.svc_id, format!("{}", 4420 + i));
                }
                other => panic!("member {i} is {other:?}"),
            }
        }
        assert_eq!(
            req.hostnqn,
            own_nqn(&env).await,
            "the members admit this node's NQN"
        );
        assert_eq!(
            req.allowed_hosts,
            [HOST_B.to_string()],
            "the export admits the host only"
        );
        assert!(req.preset.is_none());
        // The PV's keys, from its Secret (made here: no CSI in this test).
        let keys = req.keys.clone().expect("keys");
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = ns_api(&env.client);
        let s = secrets.get(&naming::auth_secret(PV)).await.unwrap();
        let stored =
            liteio_api::auth::VolumeKeys::from_secret_data(s.data.as_ref().unwrap()).unwrap();
        assert_eq!(stored.host.expose(), keys.host.expose());
        // Status, finalizer, whom it admits; never a key in the object.
        let st = dc.status.clone().unwrap();
        assert_eq!(st.spdk_target, Some(target_of(&req)));
        assert!(st.message.is_empty(), "{}", st.message);
        assert!(has_assembly_finalizer(&dc));
        assert_eq!(
            dc.annotations()
                .get(annotations::EXPORTED_TO)
                .map(String::as_str),
            Some("node-b")
        );
        let text = serde_json::to_string(&dc).unwrap();
        assert!(!text.contains(keys.host.expose()) && !text.contains(keys.ctrl.expose()));

        // A pass over a ready data control writes nothing (idempotent): a label's change
        // brings one, which re-asserts the assembly.
        let before = fake.calls();
        let touched = dapi
            .patch(
                PV,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"touch": "1"}}})),
            )
            .await
            .unwrap();
        more_calls_than(
            &fake,
            before,
            "the pass after the touch",
            Duration::from_secs(5),
        )
        .await;
        let after = dapi.get(PV).await.unwrap();
        assert_eq!(
            after.resource_version(),
            touched.resource_version(),
            "the agent wrote again"
        );
        assert_eq!(
            fake.last().unwrap().preset,
            Some(target_of(&req)),
            "the recorded target is kept"
        );

        // A new host: the export admits it instead.
        host_pool(&env.client, "node-c", "nqn.test:host-c").await;
        dapi.patch(
            PV,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hostNode": {"id": "node-c"}}})),
        )
        .await
        .unwrap();
        eventually(
            "the export admits node-c",
            Duration::from_secs(10),
            || async {
                let dc = dapi.get(PV).await.unwrap();
                (fake.last().unwrap().allowed_hosts == ["nqn.test:host-c".to_string()]
                    && dc
                        .annotations()
                        .get(annotations::EXPORTED_TO)
                        .map(String::as_str)
                        == Some("node-c"))
                .then_some(())
            },
        )
        .await;

        // Deleted: torn down, then released.
        dapi.delete(PV, &DeleteParams::default()).await.unwrap();
        gone(&dapi, PV, "the data control gone", Duration::from_secs(10)).await;
        let removed = fake.removed.lock().unwrap().clone();
        assert_eq!(removed.len(), 1, "{removed:?}");
        assert_eq!(removed[0].name, PV);
        assert_eq!(removed[0].uuid, format!("dc-{UUID}"));
        assert_eq!(removed[0].target, Some(target_of(&req)));
        assert_eq!(removed[0].members, 3);
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

/// Creates the group and three ready members that admit this node (the local one
/// unexported).
async fn members_in_place(env: &Env) {
    consumer_pool(&env.client).await;
    create_group(env).await;
    let vapi = vols(env);
    for i in 0..MEMBERS.len() {
        create_ready_member(&vapi, member(i, i != 1)).await;
    }
}

async fn create_group(env: &Env) {
    let groups: Api<AntstorVolumeGroup> = ns_api(&env.client);
    create(&groups, &group()).await;
}

async fn create_ready_member(vapi: &Api<AntstorVolume>, m: AntstorVolume) {
    create(vapi, &m).await;
    set_ready(vapi, &m.name_any()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_assembly_is_reported_and_retried_and_a_restart_reasserts_it() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (env, fake, agent, dapi) = start_with(FakeAssembler {
            fail: AtomicUsize::new(2),
            ..FakeAssembler::default()
        })
        .await;
        members_in_place(&env).await;
        create_dc(&dapi, PV, PoolMode::SpdkLVStore, RaidLevel::Raid0).await;
        // The object as it was when the failure was reported (a later read may find it
        // ready already: the third attempt follows within a fraction of a second).
        let dc = eventually(
            "status.message of pvc-multi saying \"connection refused\"",
            Duration::from_secs(10),
            || async {
                let dc = dapi.get(PV).await.unwrap();
                dc.status
                    .as_ref()
                    .is_some_and(|s| s.message.contains("connection refused"))
                    .then_some(dc)
            },
        )
        .await;
        let msg = &dc.status.as_ref().unwrap().message;
        assert!(
            msg.starts_with("cannot assemble multi-disk volume pvc-multi"),
            "{msg}"
        );
        assert_eq!(
            dc.status.as_ref().and_then(|s| s.status),
            Some(VolumeStatus::Creating)
        );
        // The finalizer comes before anything is built: a half-made assembly is torn down on
        // deletion even after a crash.
        assert!(has_assembly_finalizer(&dc));
        // Retried with back-off until it succeeds.
        let dc = wait_dc_ready(&dapi, "ready after the retries", Duration::from_secs(10)).await;
        assert!(fake.calls() >= 3, "two failures, then success");
        assert_eq!(fake.last().unwrap().level, AssemblyLevel::Raid0);
        assert!(dc.status.as_ref().unwrap().message.is_empty());
        let target = dc.status.unwrap().spdk_target.unwrap();
        agent.shutdown(Duration::from_secs(5)).await;

        // A restarted agent (its SPDK empty) assembles again from the objects, keeping the
        // recorded target.
        let before = fake.calls();
        let agent = env.start_agent_with(fake.clone(), |_| {}).await;
        more_calls_than(
            &fake,
            before,
            "the assembly re-asserted",
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(fake.last().unwrap().preset, Some(target));
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

/// The controller moved the assembly to another node (`spec.targetNodeId` and the label)
/// while this one still serves it: this node tears its assembly down (its subsystem would still admit the
/// host, and its raid holds the local replica open), once, and leaves the data control's
/// finalizer to the new node's assembly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assembly_that_moved_to_another_node_is_torn_down_here() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (_env, fake, agent, dapi, dc) = assembled(RaidLevel::Raid0).await;
        assert!(fake.removed.lock().unwrap().is_empty());
        // As the controller moves it: the label too, so it leaves this agent's watch (which
        // then reconciles nothing): the sweep of served assemblies finds it.
        move_to(&dapi, "node-y").await;
        let removed = first_removed(&fake, "torn down here").await;
        assert_eq!(removed.name, PV);
        assert_eq!(removed.uuid, dc.spec.uuid);
        assert_eq!(removed.members, MEMBERS.len());
        assert!(!fake.serves(&naming::subsys_nqn(&dc.spec.uuid)));
        assert!(has_assembly_finalizer(&dapi.get(PV).await.unwrap()));
        // Moved back: assembled here again, and nothing more was removed meanwhile.
        let calls = fake.calls();
        move_to(&dapi, NODE).await;
        more_calls_than(
            &fake,
            calls,
            "assembled here again",
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(fake.removed.lock().unwrap().len(), 1);
        assert!(fake.serves(&naming::subsys_nqn(&dc.spec.uuid)));
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

/// A replicated volume whose assembly the controller moved to this node (annotation
/// `liteio.io/assembly-moving-to`, status `creating`) is assembled from the replicas it can
/// reach, as an existing mirror (from their superblocks), not waited on like a new one: the
/// old node's replica is likely lost with the old node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_moved_here_is_assembled_without_the_replicas_it_cannot_reach() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (env, fake, agent, dapi) = start_with(FakeAssembler::default()).await;
        consumer_pool(&env.client).await;
        create_group(&env).await;
        // Member 0 (on node-x, the old assembling node) is not exported to this node.
        let vapi = vols(&env);
        for i in 1..MEMBERS.len() {
            create_ready_member(&vapi, member(i, i != 1)).await;
        }
        let mut lone = member(0, true);
        lone.metadata.annotations.as_mut().unwrap().insert(
            annotations::EXPORTED_TO.to_string(),
            "node-x".to_string(),
        );
        create_ready_member(&vapi, lone).await;
        // Not moved: a new mirror waits for every replica.
        create_dc(&dapi, PV, PoolMode::SpdkLVStore, RaidLevel::Raid1).await;
        let msg = wait_message(&dapi, PV, MEMBERS[0].0).await;
        assert!(msg.contains("to be exported to this node"), "{msg}");
        assert_eq!(fake.calls(), 0);
        // Moved here by the controller: assembled over the two it reaches.
        dapi.patch(
            PV,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                liteio_api::replica::ANNO_ASSEMBLY_MOVING_TO: NODE,
            }}})),
        )
        .await
        .unwrap();
        let req = eventually("assembled", Duration::from_secs(10), || async {
            fake.last()
        })
        .await;
        assert_eq!(req.level, AssemblyLevel::Mirror);
        assert!(!req.new_mirror, "assembled as a new mirror: {req:?}");
        assert!(
            matches!(&req.members[0].source, MemberSource::Absent { reason } if reason.contains("exported to this node")),
            "{:?}",
            req.members[0]
        );
        assert!(matches!(&req.members[1].source, MemberSource::Local { .. }));
        assert!(matches!(&req.members[2].source, MemberSource::Remote { .. }));
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

/// The self-fence: while the node's Lease goes unrenewed (its updates fail) for longer
/// than three quarters of its duration, the mirror assembled here holds its I/O
/// (`fence_assembly`); renewed again, the fence is released — unless the data control moved
/// to another node meanwhile: then the assembly is torn down, never released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_lease_fences_the_mirrors_assembled_here_until_it_is_renewed() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (env, fake, agent, dapi, dc) = assembled(RaidLevel::Raid1).await;
        assert!(fake.fence_calls.lock().unwrap().is_empty());
        // The Lease's updates fail from now on.
        let faults = fail_lease_updates(&env);
        wait_fenced(&fake, &dc.spec.uuid, "fenced").await;
        assert!(agent.heartbeat().borrow().consecutive_failures > 0);
        // Renewed again: released.
        faults.clear();
        eventually("released", Duration::from_secs(20), || async {
            fake.fenced.lock().unwrap().is_empty().then_some(())
        })
        .await;
        // Fence, release, in turn (one pair; more only if the Lease went stale again).
        let calls = fake.fence_calls.lock().unwrap().clone();
        assert!(calls.len() >= 2 && calls.len() % 2 == 0, "{calls:?}");
        for (i, (fence, uuid)) in calls.iter().enumerate() {
            assert_eq!(*fence, i % 2 == 0, "{calls:?}");
            assert_eq!(uuid, &dc.spec.uuid);
        }
        // Stale again, and the controller moves the assembly meanwhile: once the Lease is
        // renewed the fenced assembly is torn down, never released.
        let faults = fail_lease_updates(&env);
        wait_fenced(&fake, &dc.spec.uuid, "fenced again").await;
        move_to(&dapi, "node-y").await;
        faults.clear();
        let removed = first_removed(&fake, "torn down").await;
        assert_eq!(removed.uuid, dc.spec.uuid);
        let calls = fake.fence_calls.lock().unwrap().clone();
        assert_eq!(
            calls.last(),
            Some(&(true, dc.spec.uuid.clone())),
            "released: {calls:?}"
        );
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

/// The self-fence leaves assemblies that are not replicated alone: their assembly never
/// moves, so a stale Lease cannot make a split of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_lease_leaves_a_raid0_assembly_serving() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (env, fake, agent, _dapi, _dc) = assembled(RaidLevel::Raid0).await;
        let faults = fail_lease_updates(&env);
        // Stale for well past the bound (the Lease lasts seconds here): the heartbeat says so.
        let mut hb = agent.heartbeat();
        hb.wait_for(|s| s.consecutive_failures >= 5).await.unwrap();
        let stale_since = hb.borrow().renewed_at.unwrap();
        eventually(
            "stale for three Lease durations",
            Duration::from_secs(30),
            || async { (stale_since.elapsed() > Duration::from_secs(3)).then_some(()) },
        )
        .await;
        assert!(fake.fence_calls.lock().unwrap().is_empty());
        faults.clear();
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_spdk_it_refuses_with_a_message_and_kernel_lvm_is_left_to_the_host() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let env = Env::new().await;
        // The file engine's agent without an NVMe-oF target.
        let agent = env.start_agent().await;
        members_in_place(&env).await;
        let dapi = dcs(&env);
        create_dc(&dapi, "pvc-lvm", PoolMode::KernelLVM, RaidLevel::Linear).await;
        create_dc(&dapi, PV, PoolMode::SpdkLVStore, RaidLevel::Linear).await;
        let msg = wait_message(&dapi, PV, "has no SPDK").await;
        assert!(
            msg.contains("multi-disk volume pvc-multi (engine SpdkLVStore) is assembled in SPDK"),
            "{msg}"
        );
        let dc = dapi.get(PV).await.unwrap();
        assert!(!has_assembly_finalizer(&dc), "nothing was built");
        // The KernelLVM data control of this node (its host) got nothing from the agent.
        let lvm = dapi.get("pvc-lvm").await.unwrap();
        assert!(lvm.status.is_none(), "{:?}", lvm.status);
        assert!(lvm.finalizers().is_empty());
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raid_level_that_is_not_assembled_is_refused_by_name() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (env, fake, agent, dapi) = start_with(FakeAssembler::default()).await;
        members_in_place(&env).await;
        create_dc(&dapi, PV, PoolMode::SpdkLVStore, RaidLevel::Raid5).await;
        let msg = wait_message(&dapi, PV, "spec.raid.level").await;
        assert!(
            msg.contains("raid5 is not assembled (linear, raid0 and raid1 are)"),
            "{msg}"
        );
        assert_eq!(fake.calls(), 0);
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}
