//! T1: the source node's part of a hot migration (`agent/src/sync/migration.rs`), against
//! the test API server, with a recording migrator in place of the SPDK target (the T3 test
//! `t3_migration` runs the real one). The test plays the controller (phases) and the
//! destination's agent (acknowledging its promotion).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use liteio_agent::exporter::{
    CopyPhase, CopyStatus, ExportFuture, ExportRequest, Exporter, ExporterHealth, Migrator,
    PathState, PipeRequest, UnexportRequest,
};
use liteio_api::keys::{self, annotations, finalizers, labels};
use liteio_api::migration::{
    ConnectStatus, MigrationPhase, ResultStatus, VolumeInfo, VolumeMigration, VolumeMigrationSpec,
};
use liteio_api::{AntstorVolume, SpdkLvol, SpdkTarget};
use serde_json::json;

const UUID: &str = "7a0c2f1e-5b3d-4e6f-8a9b-0c1d2e3f4a5b";
const NQN: &str = "nqn.2021-03.com.alipay.ob:uuid:7a0c2f1e-5b3d-4e6f-8a9b-0c1d2e3f4a5b";

/// Records every call, in order; the copy's state is set by the test.
#[derive(Debug)]
struct Recorder {
    calls: Mutex<Vec<String>>,
    copy: Mutex<CopyPhase>,
}

impl Recorder {
    fn new() -> Self {
        Self {
            calls: Mutex::new(Vec::new()),
            copy: Mutex::new(CopyPhase::Idle),
        }
    }
    fn log(&self, s: String) {
        self.calls.lock().unwrap().push(s);
    }
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
    fn set_copy(&self, p: CopyPhase) {
        *self.copy.lock().unwrap() = p;
    }
    fn status(&self) -> CopyStatus {
        CopyStatus {
            state: *self.copy.lock().unwrap(),
            size_bytes: 64 * MIB,
            copied_bytes: 8 * MIB,
            elapsed: Duration::from_millis(40),
            ..CopyStatus::default()
        }
    }
}

impl Exporter for Recorder {
    fn health(&self) -> ExportFuture<'_, ExporterHealth> {
        healthy("v26.05")
    }
    fn ensure_export<'a>(&'a self, _req: &'a ExportRequest) -> ExportFuture<'a, SpdkTarget> {
        Box::pin(async {
            Err(liteio_agent::exporter::ExportError::InvalidRequest(
                "no".into(),
            ))
        })
    }
    fn remove_export<'a>(&'a self, _req: &'a UnexportRequest) -> ExportFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }
    fn migrator(&self) -> Option<&dyn Migrator> {
        Some(self)
    }
}

impl Migrator for Recorder {
    fn connect_pipe<'a>(&'a self, req: &'a PipeRequest) -> ExportFuture<'a, String> {
        Box::pin(async move {
            self.log(format!(
                "connect {} {}:{} {} as {} keys of {}",
                req.controller, req.address, req.port, req.subnqn, req.hostnqn, req.uuid
            ));
            Ok(format!("{}n1", req.controller))
        })
    }
    fn disconnect_pipe<'a>(&'a self, controller: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            self.log(format!("disconnect {controller}"));
            Ok(())
        })
    }
    fn start_copy<'a>(&'a self, lvol: &'a str, mirror: &'a str) -> ExportFuture<'a, CopyStatus> {
        Box::pin(async move {
            self.log(format!("start_copy {lvol} -> {mirror}"));
            self.set_copy(CopyPhase::Copying);
            Ok(self.status())
        })
    }
    fn copy_status<'a>(&'a self, _lvol: &'a str) -> ExportFuture<'a, CopyStatus> {
        Box::pin(async move { Ok(self.status()) })
    }
    fn cancel_copy<'a>(&'a self, lvol: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            self.log(format!("cancel_copy {lvol}"));
            self.set_copy(CopyPhase::Cancelled);
            Ok(())
        })
    }
    fn finish_copy<'a>(&'a self, lvol: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            self.log(format!("finish_copy {lvol}"));
            self.set_copy(CopyPhase::Finished);
            Ok(())
        })
    }
    fn fence<'a>(&'a self, nqn: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            self.log(format!("fence {nqn}"));
            Ok(())
        })
    }
    fn unfence<'a>(&'a self, nqn: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            self.log(format!("unfence {nqn}"));
            Ok(())
        })
    }
    fn set_path_state<'a>(
        &'a self,
        nqn: &'a str,
        address: &'a str,
        port: u16,
        state: PathState,
    ) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            self.log(format!("ana {nqn} {address}:{port} {}", state.as_str()));
            Ok(())
        })
    }
}

fn target(address: &str, port: &str) -> SpdkTarget {
    SpdkTarget {
        subsys_nqn: NQN.into(),
        svc_id: port.into(),
        address: address.into(),
        ns_uuid: UUID.into(),
        ..SpdkTarget::default()
    }
}

/// A volume object as the test needs it; labelled for another node than the agent's, so its
/// volume sync leaves it alone (the source's own export is not what this test is about).
fn vol(name: &str, node: &str, t: SpdkTarget, annos: &[(&str, &str)]) -> AntstorVolume {
    let mut v = AntstorVolume::new(name, Default::default());
    v.metadata = ObjectMeta {
        name: Some(name.into()),
        namespace: Some(keys::DEFAULT_NAMESPACE.into()),
        labels: Some(BTreeMap::from([(
            labels::TARGET_NODE_ID.to_string(),
            format!("{node}-elsewhere"),
        )])),
        annotations: Some(
            annos
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
        ),
        ..ObjectMeta::default()
    };
    v.spec.uuid = UUID.into();
    v.spec.size_byte = 64 * MIB;
    v.spec.target_node_id = node.into();
    v.spec.spdk_lvol = Some(SpdkLvol {
        lvs_name: "lvs".into(),
        name: name.into(),
        ..SpdkLvol::default()
    });
    v.spec.spdk_target = Some(t);
    v
}

struct Setup {
    env: Env,
    rec: Arc<Recorder>,
    migs: Api<VolumeMigration>,
    vols: Api<AntstorVolume>,
    agent: liteio_agent::agent::Agent,
}

async fn setup() -> Setup {
    let env = Env::new().await;
    let rec = Arc::new(Recorder::new());
    let agent = env.start_agent_with(rec.clone(), |_| {}).await;
    let vols: Api<AntstorVolume> = ns_api(&env.client);
    let migs: Api<VolumeMigration> = ns_api(&env.client);
    let pp = PostParams::default();
    vols.create(&pp, &vol("pvc-s", NODE, target("10.0.0.11", "4420"), &[]))
        .await
        .unwrap();
    vols.create(
        &pp,
        &vol(
            "mig-1",
            "node-d",
            target("10.0.0.12", "4421"),
            &[(annotations::MIGRATE_PIPE_SVC_ID, "4422")],
        ),
    )
    .await
    .unwrap();
    let mut m = VolumeMigration::new(
        "m1",
        VolumeMigrationSpec {
            source_volume: VolumeInfo {
                namespace: keys::DEFAULT_NAMESPACE.into(),
                name: "pvc-s".into(),
                target_node_id: NODE.into(),
                ..VolumeInfo::default()
            },
            dest_volume: VolumeInfo {
                namespace: keys::DEFAULT_NAMESPACE.into(),
                name: "mig-1".into(),
                target_node_id: "node-d".into(),
                spdk: target("10.0.0.12", "4421"),
                ..VolumeInfo::default()
            },
            ..VolumeMigrationSpec::default()
        },
    );
    m.metadata.namespace = Some(keys::DEFAULT_NAMESPACE.into());
    m.metadata.labels = Some(BTreeMap::from([(
        labels::MIGRATE_SOURCE_NODE_ID.to_string(),
        NODE.to_string(),
    )]));
    // The controller's finalizer, so that a deleted migration stays until the test says.
    m.metadata.finalizers = Some(vec![finalizers::IN_STATE.to_string()]);
    migs.create(&pp, &m).await.unwrap();
    Setup {
        env,
        rec,
        migs,
        vols,
        agent,
    }
}

/// Sets the phase, as the controller does.
async fn phase(migs: &Api<VolumeMigration>, p: MigrationPhase) {
    migs.patch_status(
        "m1",
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"phase": p, "status": "Working"}})),
    )
    .await
    .unwrap();
}

async fn pipe_connected(s: &Setup) -> VolumeMigration {
    phase(&s.migs, MigrationPhase::SetupPipe).await;
    eventually("pipe connected", Duration::from_secs(10), || async {
        let m = s.migs.get("m1").await.unwrap();
        (m.spec.migration_info.migration_pipe.status == Some(ConnectStatus::Connected)
            && m.finalizers()
                .contains(&finalizers::MIGRATE_PIPE_CONNECTED.to_string()))
        .then_some(m)
    })
    .await
}

/// Through `SetupPipe` into `Syncing`, until the agent started the copy.
async fn copy_started(s: &Setup) {
    pipe_connected(s).await;
    phase(&s.migs, MigrationPhase::Syncing).await;
    eventually("copy started", Duration::from_secs(10), || async {
        s.rec
            .calls()
            .iter()
            .any(|c| c.starts_with("start_copy"))
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_source_agent_connects_copies_switches_over_and_cleans_up() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let s = setup().await;
        let m = pipe_connected(&s).await;
        let bdev = format!("pipe-{}n1", m.uid().unwrap());
        assert_eq!(m.spec.migration_info.migration_pipe.dest_bdev_name, bdev);
        let calls = s.rec.calls();
        assert!(
            !calls.is_empty() && calls.iter().all(|c| c == &calls[0]),
            "only the pipe is connected: {calls:?}"
        );
        // The destination's pipe listener, with the volume's keys, as this node's host NQN.
        assert!(
            calls[0].contains("10.0.0.12:4422")
                && calls[0].contains(NQN)
                && calls[0].ends_with(UUID),
            "{calls:?}"
        );
        assert!(!calls[0].contains(" as  "), "no host NQN: {calls:?}");

        phase(&s.migs, MigrationPhase::Syncing).await;
        eventually("copy reported", Duration::from_secs(10), || async {
            let m = s.migs.get("m1").await.unwrap();
            (m.spec.migration_info.job_progress.status == "Copying").then_some(())
        })
        .await;
        assert!(
            s.rec
                .calls()
                .iter()
                .any(|c| c == &format!("start_copy lvs/pvc-s -> {bdev}"))
        );
        assert!(
            !s.rec.calls().iter().any(|c| c.starts_with("fence")),
            "no switch while copying"
        );

        // In step: the agent fences, commits on the source, promotes the destination and
        // waits for its agent's acknowledgement (this test plays it).
        s.rec.set_copy(CopyPhase::InStep);
        let dest = eventually("destination promoted", Duration::from_secs(10), || async {
            let d = s.vols.get("mig-1").await.unwrap();
            (d.annotations()
                .get(annotations::MIGRATE_ANA_STATE)
                .map(String::as_str)
                == Some("optimized"))
            .then_some(d)
        })
        .await;
        let src = s.vols.get("pvc-s").await.unwrap();
        assert_eq!(
            src.annotations()
                .get(annotations::MIGRATE_ANA_STATE)
                .map(String::as_str),
            Some("inaccessible"),
            "the commit is on the source before the destination is promoted"
        );
        let calls = s.rec.calls();
        assert_eq!(
            calls.last().map(String::as_str),
            Some(format!("fence {NQN}").as_str())
        );
        let m = s.migs.get("m1").await.unwrap();
        assert!(m.spec.migration_info.auto_switch.enabled);
        assert_ne!(
            m.spec.migration_info.auto_switch.status,
            Some(ResultStatus::Success)
        );
        s.vols
            .patch(
                "mig-1",
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {
                    "resourceVersion": dest.resource_version(),
                    "annotations": {annotations::MIGRATE_ANA_APPLIED: "optimized"}}})),
            )
            .await
            .unwrap();
        eventually("switched", Duration::from_secs(10), || async {
            let m = s.migs.get("m1").await.unwrap();
            (m.spec.migration_info.auto_switch.status == Some(ResultStatus::Success)).then_some(())
        })
        .await;
        let calls = s.rec.calls();
        let fence = calls.iter().position(|c| c.starts_with("fence")).unwrap();
        let demote = calls
            .iter()
            .position(|c| c == &format!("ana {NQN} 10.0.0.11:4420 inaccessible"))
            .expect("the source was demoted");
        assert!(fence < demote, "{calls:?}");
        assert!(!calls.iter().any(|c| c.starts_with("unfence")), "{calls:?}");
        let m = s.migs.get("m1").await.unwrap();
        assert_eq!(m.spec.migration_info.job_progress.status, "InStep");
        assert_eq!(m.spec.migration_info.job_progress.total_write_pages, 2048);

        // Cleaning: the mirror and the pipe go, then the finalizer.
        phase(&s.migs, MigrationPhase::Cleaning).await;
        eventually("pipe released", Duration::from_secs(10), || async {
            let m = s.migs.get("m1").await.unwrap();
            (m.spec.migration_info.migration_pipe.status == Some(ConnectStatus::Disconnected)
                && !m
                    .finalizers()
                    .contains(&finalizers::MIGRATE_PIPE_CONNECTED.to_string()))
            .then_some(())
        })
        .await;
        let calls = s.rec.calls();
        let finish = calls
            .iter()
            .position(|c| c == "finish_copy lvs/pvc-s")
            .unwrap();
        let disconnect = calls
            .iter()
            .rposition(|c| c.starts_with("disconnect"))
            .unwrap();
        assert!(demote < finish && finish < disconnect, "{calls:?}");
        s.agent.shutdown(Duration::from_secs(5)).await;
        drop(s.env);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_deleted_before_the_switch_stops_the_copy_and_leaves_the_source_alone() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let s = setup().await;
        copy_started(&s).await;
        s.migs.delete("m1", &DeleteParams::default()).await.unwrap();
        eventually("pipe finalizer gone", Duration::from_secs(10), || async {
            let m = s.migs.get("m1").await.unwrap();
            (!m.finalizers()
                .contains(&finalizers::MIGRATE_PIPE_CONNECTED.to_string()))
            .then_some(())
        })
        .await;
        let calls = s.rec.calls();
        for want in ["cancel_copy lvs/pvc-s", &format!("unfence {NQN}")] {
            assert!(calls.iter().any(|c| c == want), "{want}: {calls:?}");
        }
        assert!(
            calls.iter().any(|c| c.starts_with("disconnect pipe-")),
            "{calls:?}"
        );
        assert!(
            !calls
                .iter()
                .any(|c| c.starts_with("fence") || c.starts_with("ana ")),
            "{calls:?}"
        );
        let src = s.vols.get("pvc-s").await.unwrap();
        assert!(
            src.annotations()
                .get(annotations::MIGRATE_ANA_STATE)
                .is_none()
        );
        s.agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_copy_is_reported_torn_down_and_started_again() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let s = setup().await;
        copy_started(&s).await;
        s.rec.set_copy(CopyPhase::Failed);
        eventually("failure reported", Duration::from_secs(10), || async {
            let m = s.migs.get("m1").await.unwrap();
            (m.spec.migration_info.job_progress.status == "Failed").then_some(())
        })
        .await;
        // The failure is reported first, then the copy is torn down.
        eventually("copy torn down", Duration::from_secs(10), || async {
            s.rec
                .calls()
                .iter()
                .any(|c| c.starts_with("cancel_copy"))
                .then_some(())
        })
        .await;
        // Started again after the pause (the destination may be back).
        eventually("copy restarted", Duration::from_secs(20), || async {
            let starts = s
                .rec
                .calls()
                .iter()
                .filter(|c| c.starts_with("start_copy"))
                .count();
            (starts == 2).then_some(())
        })
        .await;
        eventually("restart reported", Duration::from_secs(10), || async {
            let m = s.migs.get("m1").await.unwrap();
            (m.spec.migration_info.job_progress.status == "Copying").then_some(())
        })
        .await;
        assert!(!s.rec.calls().iter().any(|c| c.starts_with("fence")));
        s.agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}
