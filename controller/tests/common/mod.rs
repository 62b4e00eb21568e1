//! The T1 harness shared by the controller's T1 test files: the controller running
//! against the in-process test API server, with an injectable liveness clock.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use liteio_api::keys::{finalizers, labels};
use liteio_api::pool::PoolStatus;
use liteio_api::{AntstorSnapshot, AntstorVolume, StoragePool};
use liteio_controller::clock::{Clock, ManualClock};
use liteio_controller::config::Config;
use liteio_controller::http::Health;
use liteio_controller::metrics::Metrics;
use liteio_controller::plugin::Plugin;
use liteio_controller::reconcile::Context;
use liteio_controller::run::{self, Options};
use liteio_controller::testing::*;
use liteio_test_apiserver::TestApiServer;
use tokio::sync::{oneshot, watch};
use tokio::time::timeout;

pub const NS: &str = "obnvmf";
pub const LIMIT: Duration = Duration::from_secs(30);

/// Polls `f` until it holds; panics after 15 s.
pub async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if f().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub struct Harness {
    pub _server: TestApiServer,
    pub server_faults: liteio_test_apiserver::Faults,
    pub client: Client,
    pub ctx: Arc<Context>,
    pub clock: ManualClock,
    pub stop: watch::Sender<bool>,
    pub task: tokio::task::JoinHandle<liteio_controller::Result<()>>,
}

pub fn test_config() -> Config {
    let mut c = Config::default();
    c.liveness.tick = Duration::from_millis(50);
    c
}

pub async fn ensure_ns(client: &Client) {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(NS.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

/// Starts the controller with no plug-ins.
pub async fn start(config: Config) -> Harness {
    start_with(config, Vec::new()).await
}

/// Starts the controller with `plugins`.
pub async fn start_with(config: Config, plugins: Vec<Arc<dyn Plugin>>) -> Harness {
    let server = TestApiServer::start().await.unwrap();
    let client = server.client().await.unwrap();
    ensure_ns(&client).await;
    let clock = ManualClock::new();
    let (stop, rx) = watch::channel(false);
    let (tx, ctx_rx) = oneshot::channel();
    let opts = Options {
        config,
        namespace: NS.into(),
        leader_elect: false,
        identity: "t1".into(),
        health: Health::default(),
        metrics: Metrics::new().unwrap(),
        clock: Some(Arc::new(clock.clone())),
    };
    let task = tokio::spawn(run::run(client.clone(), opts, plugins, rx, Some(tx)));
    let ctx = ctx_rx.await.unwrap();
    Harness {
        server_faults: server.faults(),
        _server: server,
        client,
        ctx,
        clock,
        stop,
        task,
    }
}

/// A second controller (no leader election, the system clock) on the server `client`
/// talks to, as `identity`: its stop switch, its task and its context once it reconciles.
pub async fn another_controller(
    client: &Client,
    identity: &str,
) -> (
    watch::Sender<bool>,
    tokio::task::JoinHandle<liteio_controller::error::Result<()>>,
    Arc<Context>,
) {
    let (stop, rx) = watch::channel(false);
    let (tx, ctx_rx) = oneshot::channel();
    let opts = Options {
        config: test_config(),
        namespace: NS.into(),
        leader_elect: false,
        identity: identity.into(),
        health: Health::default(),
        metrics: Metrics::new().unwrap(),
        clock: None,
    };
    let task = tokio::spawn(run::run(client.clone(), opts, Vec::new(), rx, Some(tx)));
    let ctx = ctx_rx.await.unwrap();
    (stop, task, ctx)
}

impl Harness {
    pub fn pools(&self) -> Api<StoragePool> {
        Api::namespaced(self.client.clone(), NS)
    }
    pub fn volumes(&self) -> Api<AntstorVolume> {
        Api::namespaced(self.client.clone(), NS)
    }
    pub fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), NS)
    }
    pub fn snapshots(&self) -> Api<AntstorSnapshot> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub async fn add_snapshot(&self, s: SnapshotFixture) {
        self.snapshots()
            .create(&PostParams::default(), &s.build())
            .await
            .unwrap();
    }

    pub async fn snapshot(&self, name: &str) -> AntstorSnapshot {
        self.snapshots().get(name).await.unwrap()
    }

    pub async fn add_pool(&self, p: PoolFixture) {
        create_pool(&self.client, p, self.clock.now()).await;
    }

    pub async fn renew(&self, node: &str, at: Timestamp) {
        renew_lease(&self.client, node, at).await;
    }

    pub async fn add_volume(&self, v: VolumeFixture) {
        self.volumes()
            .create(&PostParams::default(), &v.build())
            .await
            .unwrap();
    }

    pub async fn volume(&self, name: &str) -> AntstorVolume {
        self.volumes().get(name).await.unwrap()
    }

    pub async fn wait_bound(&self, name: &str, node: &str) {
        wait_bound(&self.client, name, node).await;
    }

    pub async fn pool_status(&self, name: &str) -> Option<PoolStatus> {
        self.pools()
            .get(name)
            .await
            .unwrap()
            .status
            .and_then(|s| s.status)
    }

    pub async fn stop(self) {
        self.stop.send_replace(true);
        let r = timeout(LIMIT, self.task).await.unwrap().unwrap();
        assert!(r.is_ok(), "{r:?}");
    }
}

/// Polls `f` until it returns `Ok`; panics after 15 s with the last `Err`.
pub async fn eventually_ok<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let last = match f().await {
            Ok(()) => return,
            Err(e) => e,
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {last}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Creates a pool with its status and a fresh heartbeat Lease renewed `at`.
pub async fn create_pool(client: &Client, p: PoolFixture, at: Timestamp) {
    let pools: Api<StoragePool> = Api::namespaced(client.clone(), NS);
    let p = p.build();
    let name = p.metadata.name.clone().unwrap();
    let status = p.status.clone();
    pools.create(&PostParams::default(), &p).await.unwrap();
    pools
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": status })),
        )
        .await
        .unwrap();
    renew_lease(client, &name, at).await;
}

/// Creates or renews the heartbeat Lease of pool `node`.
pub async fn renew_lease(client: &Client, node: &str, at: Timestamp) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(node.into()),
            namespace: Some(NS.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.into()),
            renew_time: Some(MicroTime(at)),
            lease_duration_seconds: Some(40),
            ..LeaseSpec::default()
        }),
    };
    match leases.get_opt(node).await.unwrap() {
        None => {
            leases.create(&PostParams::default(), &lease).await.unwrap();
        }
        Some(_) => {
            leases
                .patch(
                    node,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({ "spec": lease.spec })),
                )
                .await
                .unwrap();
        }
    }
}

/// Waits until volume `name` is bound to `node` (spec, label and finalizer).
pub async fn wait_bound(client: &Client, name: &str, node: &str) {
    let volumes: Api<AntstorVolume> = Api::namespaced(client.clone(), NS);
    eventually(&format!("{name} bound to {node}"), || async {
        let v = volumes.get(name).await.unwrap();
        v.spec.target_node_id == node
            && v.labels().get(labels::TARGET_NODE_ID).map(String::as_str) == Some(node)
            && v.finalizers().iter().any(|f| f == finalizers::IN_STATE)
    })
    .await;
}

/// The notes of the Warning events with `reason` about the `kind` object `name`.
pub async fn warnings_about(h: &Harness, kind: &str, name: &str, reason: &str) -> Vec<String> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(h.client.clone(), NS)
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some(kind)
        })
        .filter_map(|e| e.note)
        .collect()
}
