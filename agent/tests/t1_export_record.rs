//! T1: the node's own record of its exports (`nvmf.exportRecordDir`). A restarted agent
//! serves the recorded exports again before it reaches the API server (here: with no API
//! server at all), with the same target, hosts and keys; an export of a volume deleted
//! meanwhile is removed once the API server answers; members of replicated volumes and
//! exports a migration works on are never served from it. The exporter is a fake that
//! records calls (the SPDK target's side is T3, `t3_cluster`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use liteio_agent::exporter::{
    CopyStatus, ExportFuture, ExportRequest, Exporter, ExporterHealth, Migrator, PathState,
    PipeRequest, UnexportRequest,
};
use liteio_agent::record::{ExportRecord, RecordingExporter};
use liteio_api::auth::VolumeKeys;
use liteio_api::keys;
use liteio_api::{AntstorVolume, SpdkTarget};
use serde_json::json;

/// Records calls; hands out a target derived from the request (its preset when given).
#[derive(Debug, Default)]
struct Fake {
    exports: Mutex<Vec<ExportRequest>>,
    removed: Mutex<Vec<UnexportRequest>>,
}

fn target_of(req: &ExportRequest) -> SpdkTarget {
    req.preset.clone().unwrap_or_else(|| aio_target(&req.uuid))
}

impl Exporter for Fake {
    fn health(&self) -> ExportFuture<'_, ExporterHealth> {
        healthy("v26.05")
    }
    fn ensure_export<'a>(&'a self, req: &'a ExportRequest) -> ExportFuture<'a, SpdkTarget> {
        Box::pin(async move {
            self.exports.lock().unwrap().push(req.clone());
            Ok(target_of(req))
        })
    }
    fn remove_export<'a>(&'a self, req: &'a UnexportRequest) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            self.removed.lock().unwrap().push(req.clone());
            Ok(())
        })
    }
    fn authenticates(&self) -> bool {
        true
    }
    fn migrator(&self) -> Option<&dyn Migrator> {
        Some(self)
    }
}

impl Migrator for Fake {
    fn connect_pipe<'a>(&'a self, _: &'a PipeRequest) -> ExportFuture<'a, String> {
        Box::pin(async { Ok("pipe".into()) })
    }
    fn disconnect_pipe<'a>(&'a self, _: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }
    fn start_copy<'a>(&'a self, _: &'a str, _: &'a str) -> ExportFuture<'a, CopyStatus> {
        Box::pin(async { Ok(CopyStatus::default()) })
    }
    fn copy_status<'a>(&'a self, _: &'a str) -> ExportFuture<'a, CopyStatus> {
        Box::pin(async { Ok(CopyStatus::default()) })
    }
    fn cancel_copy<'a>(&'a self, _: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }
    fn finish_copy<'a>(&'a self, _: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }
    fn fence<'a>(&'a self, _: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }
    fn unfence<'a>(&'a self, _: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }
    fn set_path_state<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
        _: u16,
        _: PathState,
    ) -> ExportFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }
}

fn vols(client: &kube::Client) -> Api<AntstorVolume> {
    Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE)
}

fn record_dir(env: &Env) -> PathBuf {
    env.dir.path().join("state/exports")
}

/// A client of an API server that is not there (nothing listens on the port).
fn unreachable_client() -> kube::Client {
    let url = format!("http://127.0.0.1:{}", free_port());
    let mut cfg = kube::Config::new(url.parse().unwrap());
    cfg.connect_timeout = Some(Duration::from_millis(200));
    kube::Client::try_from(cfg).unwrap()
}

/// An agent over `env` with a fresh [`Fake`] exporter, keeping its export record in `dir`.
async fn start_recording(env: &Env, dir: &Path) -> (liteio_agent::agent::Agent, Arc<Fake>) {
    let fake = Arc::new(Fake::default());
    let d = dir.to_path_buf();
    let agent = env
        .start_agent_with(fake.clone(), move |o| {
            o.config.nvmf.export_record_dir = Some(d);
        })
        .await;
    (agent, fake)
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

async fn secret_keys(client: &kube::Client, v: &AntstorVolume) -> VolumeKeys {
    let secrets: Api<Secret> = ns_api(client);
    let s = secrets.get(&v.auth_secret_name()).await.unwrap();
    VolumeKeys::from_secret_data(s.data.as_ref().unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_the_api_server_serves_the_recorded_exports() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let env = Env::new().await;
        consumer_pool(&env.client).await;
        let dir = record_dir(&env);
        let (agent, _) = start_recording(&env, &dir).await;
        let v = create_exported(
            &env.client,
            &remote_volume("pvc-rec", "5a1c0e2e-7d3b-4f0a-9c1e-000000000001", 8 * MIB),
            Duration::from_secs(10),
        )
        .await;
        let target = v.spec.spdk_target.clone().unwrap();
        let keys = secret_keys(&env.client, &v).await;
        // Readable by root alone: it holds the volume's keys.
        let file = dir.join("pvc-rec.json");
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&file), 0o600);
        agent.shutdown(Duration::from_secs(5)).await;

        // Restarted with no API server: the export is served again from the record alone,
        // as it was (target, allowed host, keys).
        let again = Arc::new(Fake::default());
        let mut opts = test_options(env.config(), env.dir.path());
        opts.config.nvmf.export_record_dir = Some(dir.clone());
        let agent = liteio_agent::agent::Agent::start(
            unreachable_client(),
            env.engine(),
            again.clone(),
            opts,
        )
        .await
        .unwrap();
        let req = eventually(
            "the recorded export served again",
            Duration::from_secs(5),
            || async { again.exports.lock().unwrap().first().cloned() },
        )
        .await;
        assert_eq!(req.volume, "pvc-rec");
        assert_eq!(req.uuid, v.spec.uuid);
        assert_eq!(req.preset.as_ref(), Some(&target));
        assert_eq!(req.allowed_hosts, vec![HOST_B.to_string()]);
        assert_eq!(req.keys.as_ref(), Some(&keys));
        assert_eq!(req.path_state, PathState::Optimized);
        assert!(
            req.device
                .as_ref()
                .unwrap()
                .ends_with("volumes/pvc-rec.img")
        );
        assert_eq!(req.size_bytes, 8 * MIB);
        assert!(again.removed.lock().unwrap().is_empty());
        agent.shutdown(Duration::from_secs(5)).await;
        assert!(
            file.exists(),
            "the record outlives a restart without the API server"
        );

        // Back with the API server: the reconciler re-asserts the same export; the record
        // stays. Deleted through the agent: export removed, record gone.
        let (agent, fake) = start_recording(&env, &dir).await;
        eventually(
            "re-asserted by the reconciler",
            Duration::from_secs(5),
            || async { (fake.exports.lock().unwrap().len() >= 2).then_some(()) },
        )
        .await;
        delete_and_release(&vols(&env.client), "pvc-rec", Duration::from_secs(5)).await;
        assert!(!file.exists(), "the record of a removed export is gone");
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_export_of_a_volume_deleted_meanwhile_is_removed() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let env = Env::new().await;
        consumer_pool(&env.client).await;
        let dir = record_dir(&env);
        let (agent, _) = start_recording(&env, &dir).await;
        for (name, uuid) in [
            ("pvc-keep", "5a1c0e2e-7d3b-4f0a-9c1e-000000000002"),
            ("pvc-gone", "5a1c0e2e-7d3b-4f0a-9c1e-000000000003"),
        ] {
            create_exported(
                &env.client,
                &remote_volume(name, uuid, 8 * MIB),
                Duration::from_secs(10),
            )
            .await;
        }
        agent.shutdown(Duration::from_secs(5)).await;
        // Deleted while the agent is down (the controller released a dead node's finalizers).
        let api = vols(&env.client);
        api.patch(
            "pvc-gone",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
        api.delete("pvc-gone", &DeleteParams::default())
            .await
            .unwrap();
        // A file that is not a record is reported and left alone.
        std::fs::write(dir.join("junk.json"), b"{not json").unwrap();

        let (agent, fake) = start_recording(&env, &dir).await;
        let removed = eventually(
            "the gone volume's export removed",
            Duration::from_secs(5),
            || async { fake.removed.lock().unwrap().first().cloned() },
        )
        .await;
        assert_eq!(removed.volume, "pvc-gone");
        assert!(!dir.join("pvc-gone.json").exists());
        assert!(dir.join("pvc-keep.json").exists());
        assert!(dir.join("junk.json").exists());
        let served: Vec<String> = fake
            .exports
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.volume.clone())
            .collect();
        assert!(served.contains(&"pvc-keep".to_string()), "{served:?}");
        assert_eq!(
            fake.removed.lock().unwrap().len(),
            1,
            "only the gone volume's export is removed"
        );
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

fn request(volume: &str, uuid: &str) -> ExportRequest {
    ExportRequest {
        volume: volume.into(),
        uuid: uuid.into(),
        device: Some(PathBuf::from("/dev/null")),
        lvol: None,
        size_bytes: 8 * MIB,
        allowed_hosts: vec![HOST_B.into()],
        keyless_hosts: Vec::new(),
        preset: None,
        keys: Some(VolumeKeys::generate(false).unwrap()),
        path_state: PathState::Optimized,
        qos: Default::default(),
        group_member: false,
    }
}

/// Replica exports (their allow-list fences a replica off a lost assembling node), exports
/// that are not optimized (a migration destination) and exports a migration fenced or
/// demoted are left to the reconcilers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_plain_optimized_exports_outside_a_migration_are_recorded() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("exports");
        let record = Arc::new(ExportRecord::open(&dir).unwrap());
        let fake = Arc::new(Fake::default());
        let rec = RecordingExporter::new(fake.clone(), Arc::clone(&record));
        let names = |r: &ExportRecord| -> Vec<String> {
            let (list, bad) = r.list();
            assert!(bad.is_empty(), "{bad:?}");
            list.into_iter().map(|e| e.volume).collect()
        };

        let plain = request("pvc-plain", "5a1c0e2e-7d3b-4f0a-9c1e-000000000004");
        let t = rec.ensure_export(&plain).await.unwrap();
        let mut member = request("pvc-member", "5a1c0e2e-7d3b-4f0a-9c1e-000000000005");
        member.group_member = true;
        rec.ensure_export(&member).await.unwrap();
        let mut dest = request("pvc-dest", "5a1c0e2e-7d3b-4f0a-9c1e-000000000006");
        dest.path_state = PathState::Inaccessible;
        rec.ensure_export(&dest).await.unwrap();
        assert_eq!(names(&record), ["pvc-plain"]);

        // Promoted: recorded from then on.
        dest.path_state = PathState::Optimized;
        rec.ensure_export(&dest).await.unwrap();
        assert_eq!(names(&record), ["pvc-dest", "pvc-plain"]);

        // A migration fences the plain one's export: out of the record, and a re-assertion
        // does not put it back while this process runs.
        rec.migrator().unwrap().fence(&t.subsys_nqn).await.unwrap();
        assert_eq!(names(&record), ["pvc-dest"]);
        rec.ensure_export(&plain).await.unwrap();
        assert_eq!(names(&record), ["pvc-dest"]);

        // Removed: forgotten; removing again is fine.
        let un = UnexportRequest {
            volume: "pvc-dest".into(),
            uuid: dest.uuid.clone(),
            target: None,
        };
        rec.remove_export(&un).await.unwrap();
        rec.remove_export(&un).await.unwrap();
        assert!(names(&record).is_empty());
        assert_eq!(fake.removed.lock().unwrap().len(), 2);

        // A directory that cannot be made is an error (the agent refuses to start).
        let blocked = tmp.path().join("file");
        std::fs::write(&blocked, b"").unwrap();
        assert!(ExportRecord::open(blocked.join("exports")).is_err());
    })
    .await
    .unwrap();
}
