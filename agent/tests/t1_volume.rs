//! T1: volumes scheduled to the node are provisioned, finalized, made ready, expanded,
//! exported when remote, deleted with the right finalizers stripped, and survive a restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use liteio_agent::engine::PoolEngine;
use liteio_agent::exporter::{
    ExportFuture, ExportRequest, Exporter, ExporterHealth, UnexportRequest,
};
use liteio_api::keys::{self, annotations, finalizers, labels};
use liteio_api::{AntstorVolume, SpdkTarget, StoragePool, VolumeStatus, VolumeType, naming};
use serde_json::json;

fn volume(name: &str, size: u64) -> AntstorVolume {
    scheduled_volume(
        name,
        &format!("0b9d1f3c-6a2e-4c1d-9f0a-{:0>12}", name.len()),
        size,
    )
}

fn vols(env: &Env) -> Api<AntstorVolume> {
    Api::namespaced(env.client.clone(), keys::DEFAULT_NAMESPACE)
}

async fn wait_ready(api: &Api<AntstorVolume>, name: &str) -> AntstorVolume {
    volume_ready(api, name, "volume ready", Duration::from_secs(5)).await
}

/// An agent exporting through `fake`, and the volumes' API.
async fn start_with(
    fake: FakeExporter,
) -> (
    Env,
    Arc<FakeExporter>,
    liteio_agent::agent::Agent,
    Api<AntstorVolume>,
) {
    let env = Env::new().await;
    let fake = Arc::new(fake);
    let agent = env.start_agent_with(fake.clone(), |_| {}).await;
    let api = vols(&env);
    (env, fake, agent, api)
}

/// A [`FakeExporter`] whose exports need keys.
fn authenticating() -> FakeExporter {
    FakeExporter {
        auth: true,
        ..FakeExporter::default()
    }
}

/// Waits until `/readyz` answers with `code`.
async fn wait_readyz(addr: std::net::SocketAddr, what: &str, code: &str) {
    eventually(what, Duration::from_secs(5), || async {
        let (status, _) = http_get(addr, "/readyz").await;
        status.contains(code).then_some(())
    })
    .await;
}

/// Waits until `/metrics` shows `needle`.
async fn wait_metrics(addr: std::net::SocketAddr, what: &str, needle: &str) {
    eventually(what, Duration::from_secs(3), || async {
        let (_, m) = http_get(addr, "/metrics").await;
        m.contains(needle).then_some(())
    })
    .await;
}

/// Waits until volume `name`'s `status.message` says `needle`; returns the volume.
async fn wait_message(
    api: &Api<AntstorVolume>,
    what: &str,
    name: &str,
    needle: &str,
) -> AntstorVolume {
    eventually(what, Duration::from_secs(3), || async {
        let v = api.get(name).await.unwrap();
        v.status
            .as_ref()
            .is_some_and(|s| s.message.contains(needle))
            .then_some(v)
    })
    .await
}

/// Waits until volume `name` lists `want` as its hosts without authentication.
async fn wait_hosts_without_auth(
    api: &Api<AntstorVolume>,
    name: &str,
    want: Option<&str>,
) -> AntstorVolume {
    eventually(
        &format!("hosts-without-auth of {name} to be {want:?}"),
        Duration::from_secs(5),
        || async {
            let v = api.get(name).await.unwrap();
            (v.annotations()
                .get(annotations::HOSTS_WITHOUT_AUTH)
                .map(String::as_str)
                == want)
                .then_some(v)
        },
    )
    .await
}

fn lists_hosts_without_auth(v: &AntstorVolume) -> bool {
    v.annotations()
        .contains_key(annotations::HOSTS_WITHOUT_AUTH)
}

fn has_target_finalizer(v: &AntstorVolume) -> bool {
    v.finalizers()
        .contains(&finalizers::SPDK_TARGET.to_string())
}

/// A consuming node's Node; `can`: what its kernel says it can authenticate with.
async fn host_node(env: &Env, node: &str, can: Option<&str>) {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
    let mut n = k8s_openapi::api::core::v1::Node::default();
    n.metadata.name = Some(node.into());
    n.metadata.annotations = can.map(|can| {
        BTreeMap::from([
            (annotations::NODE_HOST_AUTH.to_string(), can.to_string()),
            (
                annotations::NODE_KERNEL_RELEASE.to_string(),
                "6.1.0-57-amd64".to_string(),
            ),
        ])
    });
    create(&nodes, &n).await;
}

async fn free_bytes(env: &Env) -> u64 {
    let pools: Api<StoragePool> = ns_api(&env.client);
    pools
        .get_opt(NODE)
        .await
        .unwrap()
        .map_or(0, |p| p.reported_free_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_lifecycle_provision_expand_delete() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let env = Env::new().await;
        let agent = env.start_agent().await;
        let api = vols(&env);
        eventually("pool", Duration::from_secs(2), || async { (free_bytes(&env).await > 0).then_some(()) }).await;
        let free0 = free_bytes(&env).await;

        // 10 MiB + 1 byte: the file engine rounds to 12 MiB and says so.
        create(&api, &volume("pvc-a", 10 * MIB + 1)).await;
        let v = wait_ready(&api, "pvc-a").await;
        assert_eq!(v.spec.type_, Some(VolumeType::KernelLVol));
        assert_eq!(v.finalizers(), &[finalizers::IN_STATE.to_string(), finalizers::LOGIC_VOLUME.to_string()]);
        let lvol = v.spec.kernel_lvol.clone().unwrap();
        assert_eq!(lvol.name, "pvc-a");
        assert_eq!(std::fs::metadata(&lvol.dev_path).unwrap().len(), 12 * MIB);
        assert_eq!(common::allocated_bytes(&v), Some("12582912"));
        assert!(v.spec.spdk_target.is_none(), "a local volume is not exported");
        // The pool status follows within 2 s (event-driven, the resync is 10 min here).
        eventually("free space to drop", Duration::from_secs(2), || async {
            (free_bytes(&env).await == free0 - 12 * MIB).then_some(())
        })
        .await;

        // Expansion as the CSI controller asks for it.
        let patch = json!({"metadata": {"labels": {labels::EXPANSION_ORIGINAL_SIZE: (10 * MIB + 1).to_string()}},
                           "spec": {"sizeByte": 20 * MIB}});
        api.patch("pvc-a", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        let v = eventually("expansion done", Duration::from_secs(5), || async {
            let v = api.get("pvc-a").await.unwrap();
            (!v.labels().contains_key(labels::EXPANSION_ORIGINAL_SIZE)).then_some(v)
        })
        .await;
        assert_eq!(std::fs::metadata(&lvol.dev_path).unwrap().len(), 20 * MIB);
        assert!(!v.annotations().contains_key(annotations::ALLOCATED_BYTES), "20 MiB needs no rounding");
        eventually("free space after expansion", Duration::from_secs(2), || async {
            (free_bytes(&env).await == free0 - 20 * MIB).then_some(())
        })
        .await;
        let (_, metrics) = http_get(agent.metrics_addr().unwrap(), "/metrics").await;
        assert!(metrics.contains("liteio_pool_volumes{node=\"node-1\"} 1"), "{metrics}");

        // Deletion: the agent removes its finalizers only; in-state stays for the controller.
        api.delete("pvc-a", &DeleteParams::default()).await.unwrap();
        let v = eventually("agent finalizers gone", Duration::from_secs(5), || async {
            let v = api.get("pvc-a").await.unwrap();
            (v.finalizers() == [finalizers::IN_STATE.to_string()]).then_some(v)
        })
        .await;
        assert!(v.metadata.deletion_timestamp.is_some());
        assert!(!std::path::Path::new(&lvol.dev_path).exists());
        eventually("free space back", Duration::from_secs(2), || async {
            (free_bytes(&env).await == free0).then_some(())
        })
        .await;
        // The controller's part.
        api.patch("pvc-a", &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": null}})))
            .await
            .unwrap();
        gone(&api, "pvc-a", "volume gone", Duration::from_secs(2)).await;
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_in_state_and_refuses_bad_objects() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let env = Env::new().await;
        let agent = env.start_agent().await;
        let api = vols(&env);
        let mut v = volume("pvc-wait", 8 * MIB);
        v.metadata.finalizers = None;
        create(&api, &v).await;
        let mut bad = volume("pvc-tiny", 1000);
        bad.spec.uuid = "tiny".into();
        create(&api, &bad).await;
        let mut wrong = volume("pvc-spdk", 8 * MIB);
        wrong.spec.type_ = Some(VolumeType::SpdkLVol);
        create(&api, &wrong).await;
        let msg = |name: &'static str, needle: &'static str| {
            let api = api.clone();
            async move {
                eventually("status message", Duration::from_secs(3), || async {
                    let v = api.get(name).await.unwrap();
                    let m = v.status.map(|s| s.message).unwrap_or_default();
                    m.contains(needle).then_some(m)
                })
                .await
            }
        };
        msg("pvc-tiny", "spec.sizeByte").await;
        msg("pvc-spdk", "SpdkLVol cannot be served").await;
        // Without the controller's in-state nothing happens; with it, the volume is made.
        assert!(!env.pool_dir().join("volumes/pvc-wait.img").exists());
        assert!(!env.pool_dir().join("volumes/pvc-tiny.img").exists());
        api.patch(
            "pvc-wait",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": [finalizers::IN_STATE]}})),
        )
        .await
        .unwrap();
        wait_ready(&api, "pvc-wait").await;
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

/// Records calls; hands out a fixed target.
#[derive(Debug, Default)]
struct FakeExporter {
    exports: Mutex<Vec<ExportRequest>>,
    removed: Mutex<Vec<UnexportRequest>>,
    /// Exports need keys (the SPDK target's `nvmf.auth: dhchap`).
    auth: bool,
    /// Recorded exports do not listen (a target that is still coming back after a restart).
    closed: AtomicBool,
}

impl FakeExporter {
    /// The last export asked for volume `name`.
    fn last_export_of(&self, name: &str) -> ExportRequest {
        self.exports
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|r| r.volume == name)
            .cloned()
            .unwrap()
    }
}

impl Exporter for FakeExporter {
    fn health(&self) -> ExportFuture<'_, ExporterHealth> {
        healthy("v24.01")
    }
    fn ensure_export<'a>(&'a self, req: &'a ExportRequest) -> ExportFuture<'a, SpdkTarget> {
        Box::pin(async move {
            self.exports.lock().unwrap().push(req.clone());
            Ok(aio_target(&req.uuid))
        })
    }
    fn remove_export<'a>(&'a self, req: &'a UnexportRequest) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            self.removed.lock().unwrap().push(req.clone());
            Ok(())
        })
    }
    fn authenticates(&self) -> bool {
        self.auth
    }
    fn is_listening<'a>(&'a self, _target: &'a SpdkTarget) -> ExportFuture<'a, bool> {
        Box::pin(async move { Ok(!self.closed.load(Ordering::SeqCst)) })
    }
}

/// After a restart the agent is not ready until every export the node had listens again,
/// so that a DaemonSet rollout does not go on to the next storage node too early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_only_once_the_nodes_exports_listen_again() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (env, fake, agent, api) = start_with(FakeExporter::default()).await;
        let v = hosted_by(volume("pvc-gate", 8 * MIB), "node-b");
        create(&api, &v).await;
        let v = wait_ready(&api, "pvc-gate").await;
        assert!(has_target_finalizer(&v));
        let addr = agent.metrics_addr().unwrap();
        wait_readyz(addr, "ready with the export listening", "200").await;
        agent.shutdown(Duration::from_secs(5)).await;

        // The target comes back without the export: registered, but not ready.
        fake.closed.store(true, Ordering::SeqCst);
        let seen = fake.exports.lock().unwrap().len();
        let agent = env.start_agent_with(fake.clone(), |_| {}).await;
        let addr = agent.metrics_addr().unwrap();
        eventually("pool registered again", Duration::from_secs(5), || async {
            let (status, body) = http_get(addr, "/readyz").await;
            (status.contains("503") && body.contains("restoring this node's NVMe-oF exports"))
                .then_some(())
        })
        .await;
        // Still not ready once the reconciler has exported again (the export does not listen).
        eventually(
            "the reconciler to export again",
            Duration::from_secs(5),
            || async { (fake.exports.lock().unwrap().len() > seen).then_some(()) },
        )
        .await;
        let (status, _) = http_get(addr, "/readyz").await;
        assert!(
            status.contains("503"),
            "ready before its export listens: {status}"
        );

        fake.closed.store(false, Ordering::SeqCst);
        wait_readyz(addr, "ready once the export listens", "200").await;
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_volume_is_exported_to_the_host_only() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let (env, fake, agent, api) = start_with(FakeExporter::default()).await;
        // The consuming host's pool publishes its host NQN.
        host_pool(&env.client, "node-b", "nqn.host-b").await;
        let pools: Api<StoragePool> = ns_api(&env.client);
        eventually("tgt-version annotation", Duration::from_secs(2), || async {
            let p = pools.get_opt(NODE).await.unwrap()?;
            p.annotations().get(annotations::TGT_VERSION).cloned()
        })
        .await;

        let v = hosted_by(volume("pvc-r", 8 * MIB), "node-b");
        create(&api, &v).await;
        let v = wait_ready(&api, "pvc-r").await;
        assert!(has_target_finalizer(&v));
        let t = v.spec.spdk_target.clone().unwrap();
        assert_eq!(t.subsys_nqn, naming::subsys_nqn(&v.spec.uuid));
        let req = fake.exports.lock().unwrap().last().cloned().unwrap();
        assert_eq!(req.allowed_hosts, vec!["nqn.host-b".to_string()]);
        assert!(req.device.as_ref().unwrap().ends_with("volumes/pvc-r.img"));

        delete_and_release(&api, "pvc-r", Duration::from_secs(5)).await;
        // Idempotent removal may run more than once; it is only ever for this volume.
        let removed = fake.removed.lock().unwrap().clone();
        assert!(!removed.is_empty());
        assert!(
            removed
                .iter()
                .all(|r| r.volume == "pvc-r" && r.target.as_ref() == Some(&t))
        );
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_volume_without_a_target_says_so() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let env = Env::new().await;
        let agent = env.start_agent().await;
        let api = vols(&env);
        let v = hosted_by(volume("pvc-nt", 8 * MIB), "node-b");
        create(&api, &v).await;
        let v = wait_message(&api, "message", "pvc-nt", "no target").await;
        assert_eq!(v.phase(), VolumeStatus::Creating);
        assert!(!has_target_finalizer(&v));
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_recreates_nothing_and_loses_nothing() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let env = Env::new().await;
        let agent = env.start_agent().await;
        let api = vols(&env);
        create(&api, &volume("pvc-k", 8 * MIB)).await;
        let v = wait_ready(&api, "pvc-k").await;
        let path = v.spec.kernel_lvol.as_ref().unwrap().dev_path.clone();
        agent.shutdown(Duration::from_secs(5)).await;

        // Data written while the agent is down, and an engine object nobody owns.
        std::fs::write(&path, b"precious").unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(8 * MIB)
            .unwrap();
        let orphan = env.pool_dir().join("volumes/pvc-orphan.img");
        std::fs::File::create(&orphan)
            .unwrap()
            .set_len(4 * MIB)
            .unwrap();
        let rv = api.get("pvc-k").await.unwrap().resource_version();

        let agent = env.start_agent().await;
        let addr = agent.metrics_addr().unwrap();
        wait_metrics(
            addr,
            "orphan reported",
            "liteio_orphan_objects{kind=\"volume\",node=\"node-1\"} 1",
        )
        .await;
        wait_metrics(
            addr,
            "volume counted again",
            "liteio_pool_volumes{node=\"node-1\"} 1",
        )
        .await;
        let v = api.get("pvc-k").await.unwrap();
        assert_eq!(
            v.resource_version(),
            rv,
            "a ready volume is not rewritten after a restart"
        );
        assert_eq!(&std::fs::read(&path).unwrap()[..8], b"precious");
        assert!(orphan.exists(), "orphans are never deleted by default");

        // An object whose engine volume vanished is reported, never recreated empty.
        agent.shutdown(Duration::from_secs(5)).await;
        std::fs::remove_file(&path).unwrap();
        let agent = env.start_agent().await;
        wait_message(&api, "missing-volume message", "pvc-k", "not recreating").await;
        assert!(!std::path::Path::new(&path).exists());
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_collected_only_when_enabled_after_the_grace_period() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let env = Env::new().await;
        std::fs::create_dir_all(env.pool_dir().join("volumes")).unwrap();
        let orphan = env.pool_dir().join("volumes/pvc-orphan.img");
        std::fs::File::create(&orphan)
            .unwrap()
            .set_len(4 * MIB)
            .unwrap();
        let agent = env
            .start_agent_with(Arc::new(liteio_agent::exporter::NoExporter), |o| {
                o.config.recovery.collect_orphans = true;
                o.config.recovery.orphan_grace_period = Duration::from_millis(200);
                o.resync = Duration::from_millis(100);
            })
            .await;
        eventually("orphan collected", Duration::from_secs(5), || async {
            (!orphan.exists()).then_some(())
        })
        .await;
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

/// The consuming host moves: node-b → node-c (the allow-list follows, same export), then onto
/// the volume's own node (the export is withdrawn: node-c loses access, the finalizer and
/// `spec.spdkTarget` go), then back to node-b (exported anew, for node-b only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_host_changes_move_the_export() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let (env, fake, agent, api) = start_with(FakeExporter::default()).await;
        for host in ["node-b", "node-c"] {
            host_pool(&env.client, host, &format!("nqn.{host}")).await;
        }
        let set_host = |host: &'static str| {
            let api = api.clone();
            async move {
                let body = json!({"spec": {"hostNode": {"id": host}}});
                api.patch("pvc-m", &PatchParams::default(), &Patch::Merge(&body))
                    .await
                    .unwrap();
            }
        };
        let last_allowed = || {
            fake.exports
                .lock()
                .unwrap()
                .last()
                .map(|r| r.allowed_hosts.clone())
        };

        let v = hosted_by(volume("pvc-m", 8 * MIB), "node-b");
        create(&api, &v).await;
        let v = wait_ready(&api, "pvc-m").await;
        let target = v.spec.spdk_target.clone().unwrap();
        assert_eq!(last_allowed(), Some(vec!["nqn.node-b".to_string()]));

        set_host("node-c").await;
        eventually("allow-list for node-c", Duration::from_secs(5), || async {
            (last_allowed() == Some(vec!["nqn.node-c".to_string()])).then_some(())
        })
        .await;
        assert_eq!(
            api.get("pvc-m").await.unwrap().spec.spdk_target,
            Some(target.clone())
        );
        assert!(
            fake.removed.lock().unwrap().is_empty(),
            "a host change must not unexport"
        );

        set_host(NODE).await;
        let v = eventually("export withdrawn", Duration::from_secs(5), || async {
            let v = api.get("pvc-m").await.unwrap();
            (v.spec.spdk_target.is_none() && !has_target_finalizer(&v)).then_some(v)
        })
        .await;
        assert_eq!(v.phase(), VolumeStatus::Ready);
        let removed = fake.removed.lock().unwrap().clone();
        assert!(!removed.is_empty() && removed.iter().all(|r| r.target.as_ref() == Some(&target)));
        assert!(v.spec.kernel_lvol.is_some(), "the volume itself stays");

        let exports_before = fake.exports.lock().unwrap().len();
        set_host("node-b").await;
        let v = eventually("exported again", Duration::from_secs(5), || async {
            let v = api.get("pvc-m").await.unwrap();
            has_target_finalizer(&v).then_some(v)
        })
        .await;
        assert!(fake.exports.lock().unwrap().len() > exports_before);
        assert_eq!(last_allowed(), Some(vec!["nqn.node-b".to_string()]));
        assert_eq!(
            v.spec.spdk_target.as_ref().map(|t| &t.subsys_nqn),
            Some(&target.subsys_nqn)
        );
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

/// The engine volume was made at the old size, then an expansion raised `spec.sizeByte`
/// before the agent recorded it (a race csi-sanity hits under load): the agent grows it and
/// the volume becomes ready at the new size instead of failing forever with "exists with
/// 8 MiB, asked 12 MiB".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_expanded_before_it_was_recorded_is_grown_not_stuck() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let env = Env::new().await;
        // What the first attempt left: the file at the size asked then, nothing recorded.
        env.engine().ensure_pool().unwrap();
        env.engine()
            .create_volume("pvc-race", 8 * MIB, &Default::default())
            .unwrap();
        let agent = env.start_agent().await;
        let api = vols(&env);
        create(&api, &volume("pvc-race", 12 * MIB)).await;
        let v = wait_ready(&api, "pvc-race").await;
        let info = env
            .engine()
            .list_volumes()
            .unwrap()
            .into_iter()
            .find(|v| v.name == "pvc-race")
            .unwrap();
        assert_eq!(info.size_bytes, 12 * MIB);
        assert!(
            v.status.as_ref().is_none_or(|s| s.message.is_empty()),
            "{v:?}"
        );
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

/// `liteio.io/host-auth` at the export: under `preferred` the consumer whose Node says its
/// kernel cannot authenticate is admitted by its NQN alone (only its entry), which is
/// recorded on the volume, logged and evented; under `required` (the default) the same host
/// keeps the keys; a host that can authenticate keeps them under `preferred`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_admits_only_the_host_that_cannot_authenticate_without_keys() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (env, fake, agent, api) = start_with(authenticating()).await;
        for (node, nqn, can) in [
            ("node-old", "nqn.host-old", "none"),
            ("node-new", "nqn.host-new", "dhchap,tls"),
        ] {
            host_pool(&env.client, node, nqn).await;
            host_node(&env, node, Some(can)).await;
        }
        let export_of = |name: &'static str| {
            let fake = fake.clone();
            move || fake.last_export_of(name)
        };
        let make = |name: &'static str, node: &str, policy: Option<&str>| {
            let mut v = hosted_by(volume(name, 8 * MIB), node);
            v.spec.host_auth =
                policy.map(|p| liteio_api::host_auth::HostAuthPolicy::parse("test", p).unwrap());
            v
        };
        // preferred, a host that cannot: NQN-only for it, recorded and evented.
        api.create(
            &PostParams::default(),
            &make("pvc-pref-old", "node-old", Some("preferred")),
        )
        .await
        .unwrap();
        let v = wait_ready(&api, "pvc-pref-old").await;
        let v = eventually("hosts-without-auth", Duration::from_secs(5), || {
            let api = api.clone();
            let v = v.clone();
            async move {
                let v = api.get(&v.name_any()).await.unwrap();
                v.annotations()
                    .contains_key(annotations::HOSTS_WITHOUT_AUTH)
                    .then_some(v)
            }
        })
        .await;
        assert_eq!(
            v.annotations()[annotations::HOSTS_WITHOUT_AUTH],
            "nqn.host-old"
        );
        let req = export_of("pvc-pref-old")();
        assert_eq!(req.allowed_hosts, vec!["nqn.host-old".to_string()]);
        assert_eq!(req.keyless_hosts, vec!["nqn.host-old".to_string()]);
        assert!(req.keys.is_some(), "the volume's keys are still loaded");
        let ev = eventually(
            "ServedWithoutAuthentication event",
            Duration::from_secs(5),
            || async {
                events_about(&env.client, "pvc-pref-old", "ServedWithoutAuthentication")
                    .await
                    .into_iter()
                    .next()
            },
        )
        .await;
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
        let note = ev.note.unwrap_or_default();
        for part in [
            "pvc-pref-old",
            "nqn.host-old",
            "node-old",
            "6.1.0-57-amd64",
            "liteio.io/host-auth: preferred",
        ] {
            assert!(note.contains(part), "{part} missing: {note}");
        }
        // required (absent), the same host: keys.
        api.create(
            &PostParams::default(),
            &make("pvc-req-old", "node-old", None),
        )
        .await
        .unwrap();
        let v = wait_ready(&api, "pvc-req-old").await;
        assert!(!lists_hosts_without_auth(&v));
        let req = export_of("pvc-req-old")();
        assert!(req.keyless_hosts.is_empty() && req.keys.is_some());
        // From here on the agent's Node watch has listed the Nodes: the exports read the
        // hosts' capability from it, not from a GET of the Node on every pass.
        let node_gets = || {
            env.server
                .faults()
                .requests_for(liteio_test_apiserver::Verb::Get, "nodes", "node-new")
        };
        let gets_before = node_gets();
        // preferred, a host that can: keys.
        api.create(
            &PostParams::default(),
            &make("pvc-pref-new", "node-new", Some("preferred")),
        )
        .await
        .unwrap();
        let v = wait_ready(&api, "pvc-pref-new").await;
        assert!(!lists_hosts_without_auth(&v));
        assert!(export_of("pvc-pref-new")().keyless_hosts.is_empty());
        // none, a host that can: NQN-only, with a Normal event.
        api.create(
            &PostParams::default(),
            &make("pvc-none-new", "node-new", Some("none")),
        )
        .await
        .unwrap();
        wait_ready(&api, "pvc-none-new").await;
        wait_hosts_without_auth(&api, "pvc-none-new", Some("nqn.host-new")).await;
        assert_eq!(
            export_of("pvc-none-new")().keyless_hosts,
            vec!["nqn.host-new".to_string()]
        );
        assert_eq!(
            node_gets() - gets_before,
            0,
            "two volumes exported to node-new read its Node through the watch's copy"
        );
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

/// The agent follows a Node's capability, not only the volume: a `preferred` volume exported
/// while its host's Node says nothing keeps the keys (unknown never downgrades); then the
/// CSI node writes `none` on its Node and, with nothing else changing (the resync is 10 min
/// here), the export's entry for that host goes keyless and the volume lists the host; a
/// kernel that can authenticate (`dhchap`) gets the keys back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_capability_change_reaches_the_export_without_a_volume_change() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (env, fake, agent, api) = start_with(authenticating()).await;
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
        host_pool(&env.client, "node-late", "nqn.host-late").await;
        // The host's Node, before its CSI node has said anything.
        host_node(&env, "node-late", None).await;
        let last_export = || fake.last_export_of("pvc-late");

        let mut v = hosted_by(volume("pvc-late", 8 * MIB), "node-late");
        v.spec.host_auth = Some(liteio_api::host_auth::HostAuthPolicy::Preferred);
        create(&api, &v).await;
        let v = wait_ready(&api, "pvc-late").await;
        assert!(!lists_hosts_without_auth(&v));
        let req = last_export();
        assert_eq!(req.allowed_hosts, vec!["nqn.host-late".to_string()]);
        assert!(req.keyless_hosts.is_empty() && req.keys.is_some());
        let spec_before = serde_json::to_value(&v.spec).unwrap();

        let set_capability = |can: &'static str| {
            let nodes = nodes.clone();
            async move {
                let body = json!({"metadata": {"annotations": {
                    annotations::NODE_HOST_AUTH: can,
                    annotations::NODE_KERNEL_RELEASE: "6.1.0-57-amd64",
                }}});
                nodes
                    .patch("node-late", &PatchParams::default(), &Patch::Merge(&body))
                    .await
                    .unwrap();
            }
        };
        let listed = |want: Option<&'static str>| wait_hosts_without_auth(&api, "pvc-late", want);

        // The kernel cannot authenticate: only the Node changed.
        set_capability("none").await;
        let v = listed(Some("nqn.host-late")).await;
        let req = last_export();
        assert_eq!(req.allowed_hosts, vec!["nqn.host-late".to_string()]);
        assert_eq!(req.keyless_hosts, vec!["nqn.host-late".to_string()]);
        assert!(req.keys.is_some(), "the volume's keys are still loaded");
        assert_eq!(serde_json::to_value(&v.spec).unwrap(), spec_before);

        // Rebooted into a kernel that can: keys again.
        set_capability("dhchap").await;
        listed(None).await;
        let req = last_export();
        assert!(req.keyless_hosts.is_empty() && req.keys.is_some());
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}
