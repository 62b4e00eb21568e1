//! Shared helpers of the agent's integration tests (one place per concept, so that a test
//! file holds only what it proves):
//!
//! - the cluster: a test API server with the `obnvmf` namespace and a Node (`Env`,
//!   `test_cluster`), objects as the controller leaves them (`scheduled_volume`,
//!   `remote_volume`, `hosted_by`, `host_pool`, `consumer_pool`), `create`, `ns_api`;
//! - the agent: over a file-engine pool in a temp dir (`Env::start_agent*`) or over SPDK
//!   (`start_spdk_agent*`), with test timings (`test_options`); a fake exporter's `healthy`
//!   and `aio_target`;
//! - waiting: `eventually` / `poll` (never a bare sleep), `volume_ready`, `create_exported`,
//!   `gone`, `delete_and_release`, `expand`;
//! - observing: `scrape`, `metric_value`, `volume_io` / `io_series`, `http_get`,
//!   `events_about`, `allocated_bytes`;
//! - ports: `free_port`, `free_port_on`, `free_range`.
//!
//! Rooms of their own: `binary` (the `disk-agent` binary as a child process, for the crash
//! tests), `host` (host commands and the skip reasons of tests that need root or loop
//! devices), `spdk` (what the tests that drive SPDK in this process share).
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

pub mod binary;
pub mod host;
#[cfg(feature = "spdk")]
pub mod spdk;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, NodeAddress, NodeStatus};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use liteio_agent::agent::{Agent, AgentOptions};
use liteio_agent::config::Config;
use liteio_agent::engine::{FileEngine, PoolEngine};
use liteio_agent::exporter::{Exporter, NoExporter};
use liteio_agent::heartbeat::HeartbeatOptions;
use liteio_api::keys;
use liteio_test_apiserver::TestApiServer;

pub const NODE: &str = "node-1";
pub const NODE_IP: &str = "10.0.0.11";
pub const MIB: u64 = 1 << 20;
pub const POOL_CAP: u64 = 1 << 30;

/// A volume as the controller leaves it once scheduled to [`NODE`]: `spec.targetNodeId`, the
/// `obnvmf/target-node-id` label and the `in-state` finalizer.
pub fn scheduled_volume(name: &str, uuid: &str, size: u64) -> liteio_api::AntstorVolume {
    use liteio_api::keys::{finalizers, labels};
    let mut v = liteio_api::AntstorVolume::new(
        name,
        liteio_api::AntstorVolumeSpec {
            uuid: uuid.into(),
            size_byte: size,
            target_node_id: NODE.into(),
            ..liteio_api::AntstorVolumeSpec::default()
        },
    );
    v.metadata = ObjectMeta {
        name: Some(name.into()),
        namespace: Some(keys::DEFAULT_NAMESPACE.into()),
        labels: Some(BTreeMap::from([(
            labels::TARGET_NODE_ID.to_string(),
            NODE.to_string(),
        )])),
        finalizers: Some(vec![finalizers::IN_STATE.to_string()]),
        ..ObjectMeta::default()
    };
    v
}

/// A TCP port of 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    free_port_on("127.0.0.1")
}

/// A TCP port of `address` that was free a moment ago.
pub fn free_port_on(address: &str) -> u16 {
    std::net::TcpListener::bind((address, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `extra` + 1 consecutive ports starting at one that was free a moment ago (the start kept
/// low enough that the range stays below 65535).
pub fn free_range(extra: u16) -> std::ops::RangeInclusive<u16> {
    let p = free_port().min(65_535 - extra);
    p..=p + extra
}

/// Host NQN of `node-b`, the consuming node of [`remote_volume`].
pub const HOST_B: &str = "nqn.2021-03.com.alipay.host:uuid:node-b";

/// [`scheduled_volume`] consumed by `node-b`: the agent exports it for [`HOST_B`].
pub fn remote_volume(name: &str, uuid: &str, size: u64) -> liteio_api::AntstorVolume {
    hosted_by(scheduled_volume(name, uuid, size), "node-b")
}

/// The consuming node's StoragePool, which publishes its host NQN ([`HOST_B`]) for the
/// exports' allow-lists.
pub async fn consumer_pool(client: &Client) {
    host_pool(client, "node-b", HOST_B).await;
}

/// The StoragePool of some consuming `node` publishing its host NQN `nqn`.
pub async fn host_pool(client: &Client, node: &str, nqn: &str) {
    use liteio_api::keys::annotations;
    let mut host = liteio_api::StoragePool::new(node, Default::default());
    host.metadata.annotations = Some(BTreeMap::from([(
        annotations::HOST_NQN.to_string(),
        nqn.to_string(),
    )]));
    host.spec.node_info.id = node.into();
    host.spec.kernel_lvm.name = "vg".into();
    ns_api::<liteio_api::StoragePool>(client)
        .create(&PostParams::default(), &host)
        .await
        .unwrap();
}

/// The API of kind `K` in the `obnvmf` namespace.
pub fn ns_api<K>(client: &Client) -> Api<K>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE)
}

/// `v` consumed by node `host` (`spec.hostNode`).
pub fn hosted_by(mut v: liteio_api::AntstorVolume, host: &str) -> liteio_api::AntstorVolume {
    v.spec.host_node = Some(liteio_api::NodeInfo {
        id: host.into(),
        ..liteio_api::NodeInfo::default()
    });
    v
}

/// A test API server with the `obnvmf` namespace and the Node ([`prepare_cluster`]), a
/// client of it and a scratch directory; the test's log lines at `log` level and above.
pub async fn test_cluster(log: &str) -> (TestApiServer, Client, tempfile::TempDir) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(log)
        .with_test_writer()
        .try_init();
    let server = TestApiServer::start().await.unwrap();
    let client = server.client().await.unwrap();
    prepare_cluster(&client).await;
    (server, client, tempfile::tempdir().unwrap())
}

/// Creates `v` and waits up to `within` until the agent has it ready and exported; returns
/// the volume as the agent left it.
pub async fn create_exported(
    client: &Client,
    v: &liteio_api::AntstorVolume,
    within: Duration,
) -> liteio_api::AntstorVolume {
    use kube::ResourceExt;
    let vols: Api<liteio_api::AntstorVolume> =
        Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    vols.create(&PostParams::default(), v).await.unwrap();
    let name = v.name_any();
    eventually(&format!("{name} ready and exported"), within, || async {
        let v = vols.get_opt(&name).await.unwrap()?;
        (v.phase() == liteio_api::VolumeStatus::Ready && v.spec.spdk_target.is_some()).then_some(v)
    })
    .await
}

#[cfg(feature = "spdk")]
#[allow(unused_imports)]
pub use liteio_tests::spdk::{with_spdk, with_spdk_opts};

/// Polls `f` every 20 ms until it returns `Some`, or panics after `within`.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll(within, f)
        .await
        .unwrap_or_else(|| panic!("timed out after {within:?} waiting for {what}"))
}

/// Polls `f` every 20 ms until it returns `Some`; `None` once `within` has passed.
pub async fn poll<T, F, Fut>(within: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asks for volume `name` to grow from `from` to `to` bytes, as the CSI controller does (the
/// original size in a label, the new one in the spec).
pub async fn expand(api: &kube::Api<liteio_api::AntstorVolume>, name: &str, from: u64, to: u64) {
    use liteio_api::keys::labels;
    let patch = serde_json::json!({
        "metadata": {"labels": {labels::EXPANSION_ORIGINAL_SIZE: from.to_string()}},
        "spec": {"sizeByte": to},
    });
    api.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
}

/// Waits (up to `within`) until volume `name` is ready; returns it.
pub async fn volume_ready(
    api: &Api<liteio_api::AntstorVolume>,
    name: &str,
    what: &str,
    within: Duration,
) -> liteio_api::AntstorVolume {
    eventually(what, within, || async {
        let v = api.get_opt(name).await.unwrap()?;
        (v.phase() == liteio_api::VolumeStatus::Ready).then_some(v)
    })
    .await
}

/// The `allocated-bytes` annotation of `v`: the size the engine rounded it to, when it did.
pub fn allocated_bytes(v: &liteio_api::AntstorVolume) -> Option<&str> {
    use kube::ResourceExt;
    v.annotations()
        .get(keys::annotations::ALLOCATED_BYTES)
        .map(String::as_str)
}

/// The target a fake exporter hands out for a file volume `uuid`: its aio bdev, LiteIO's
/// NQN and serial, [`NODE_IP`]:4510.
pub fn aio_target(uuid: &str) -> liteio_api::SpdkTarget {
    use liteio_api::naming;
    liteio_api::SpdkTarget {
        bdev_name: naming::aio_bdev_name(uuid),
        subsys_nqn: naming::subsys_nqn(uuid),
        svc_id: "4510".into(),
        sn: naming::serial_number(uuid),
        trans_type: naming::TRANS_TYPE_TCP.into(),
        ns_uuid: uuid.into(),
        address: NODE_IP.into(),
        addr_fam: naming::ADDR_FAM_IPV4.into(),
    }
}

/// Creates `obj` through `api`; returns it as stored.
pub async fn create<K>(api: &Api<K>, obj: &K) -> K
where
    K: Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.create(&PostParams::default(), obj).await.unwrap()
}

/// Waits (up to `within`) until object `name` of `api` is gone.
pub async fn gone<K>(api: &Api<K>, name: &str, what: &str, within: Duration)
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually(what, within, || async {
        api.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
}

/// The Events about object `name` with `reason`.
pub async fn events_about(
    client: &Client,
    name: &str,
    reason: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    ns_api::<k8s_openapi::api::events::v1::Event>(client)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
        })
        .collect()
}

/// Deletes volume `name` and waits until the agent has released it: only the controller's
/// `in-state` finalizer left (no controller runs in these tests).
pub async fn delete_and_release(
    vols: &Api<liteio_api::AntstorVolume>,
    name: &str,
    within: Duration,
) {
    use kube::ResourceExt;
    vols.delete(name, &kube::api::DeleteParams::default())
        .await
        .unwrap();
    eventually(
        &format!("the agent's finalizers on {name} gone"),
        within,
        || async {
            let v = vols.get(name).await.unwrap();
            (v.finalizers() == [keys::finalizers::IN_STATE.to_string()]).then_some(())
        },
    )
    .await;
}

pub async fn prepare_cluster(client: &Client) {
    let ns: Api<Namespace> = Api::all(client.clone());
    let _ = ns
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(keys::DEFAULT_NAMESPACE.into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await;
    let nodes: Api<Node> = Api::all(client.clone());
    let labels = BTreeMap::from([
        (keys::labels::NODE_IP.to_string(), NODE_IP.to_string()),
        (keys::labels::NODE_RACK.to_string(), "rack-7".to_string()),
        (
            keys::labels::KUBE_HOSTNAME.to_string(),
            "host-1".to_string(),
        ),
    ]);
    let _ = nodes
        .create(
            &PostParams::default(),
            &Node {
                metadata: ObjectMeta {
                    name: Some(NODE.into()),
                    labels: Some(labels),
                    ..ObjectMeta::default()
                },
                status: Some(NodeStatus {
                    addresses: Some(vec![NodeAddress {
                        type_: "InternalIP".into(),
                        address: "192.168.9.9".into(),
                    }]),
                    ..NodeStatus::default()
                }),
                ..Node::default()
            },
        )
        .await;
}

/// Test timings: 100 ms heartbeat ticks, fast retries, a long resync (so that everything
/// observed is event-driven).
pub fn test_options(config: Config, state_dir: &Path) -> AgentOptions {
    let mut o = AgentOptions::from_config(NODE, config);
    o.host_nqn_path = state_dir.join("hostnqn");
    o.heartbeat =
        HeartbeatOptions::with_interval(Duration::from_millis(100), Duration::from_secs(1));
    o.resync = Duration::from_secs(600);
    o.retry = Duration::from_millis(100);
    o.request_timeout = Duration::from_secs(5);
    o.metrics_addr = Some("127.0.0.1:0".parse().unwrap());
    o
}

pub struct Env {
    pub server: TestApiServer,
    pub client: Client,
    pub dir: tempfile::TempDir,
}

impl Env {
    pub async fn new() -> Self {
        Self::with_pool_dir(None).await
    }

    /// `pool_root`: a directory to create the pool in (an XFS mount for snapshots).
    pub async fn with_pool_dir(pool_root: Option<&Path>) -> Self {
        let _ = tracing_subscriber_init();
        let server = TestApiServer::start().await.unwrap();
        let client = server.client().await.unwrap();
        prepare_cluster(&client).await;
        let dir = match pool_root {
            Some(p) => tempfile::tempdir_in(p).unwrap(),
            None => tempfile::tempdir().unwrap(),
        };
        Self {
            server,
            client,
            dir,
        }
    }

    pub fn pool_dir(&self) -> PathBuf {
        self.dir.path().join("pool")
    }

    /// A file pool capped at 1 GiB, so free space is exact (not the host filesystem's).
    pub fn config(&self) -> Config {
        let mut c = Config::file_pool("dev-pool", self.pool_dir());
        if let Some(f) = c.storage.file.as_mut() {
            f.size = POOL_CAP;
        }
        c
    }

    pub fn engine(&self) -> Arc<FileEngine> {
        Arc::new(FileEngine::new("dev-pool", self.pool_dir(), POOL_CAP))
    }

    pub async fn start_agent(&self) -> Agent {
        self.start_agent_with(Arc::new(NoExporter), |_| {}).await
    }

    pub async fn start_agent_with(
        &self,
        exporter: Arc<dyn Exporter>,
        tweak: impl FnOnce(&mut AgentOptions),
    ) -> Agent {
        let mut opts = test_options(self.config(), self.dir.path());
        tweak(&mut opts);
        let engine: Arc<dyn PoolEngine> = self.engine();
        Agent::start(self.client.clone(), engine, exporter, opts)
            .await
            .unwrap()
    }
}

fn tracing_subscriber_init() -> Result<(), ()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init()
        .map_err(|_| ())
}

/// A fake exporter's `health`: a target of SPDK `version`.
pub fn healthy(
    version: &'static str,
) -> liteio_agent::exporter::ExportFuture<'static, liteio_agent::exporter::ExporterHealth> {
    Box::pin(async move {
        Ok(liteio_agent::exporter::ExporterHealth::Ok {
            version: version.into(),
        })
    })
}

/// GET `path` from the agent's metrics server; returns (status line, body).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// The value of sample `name` in a Prometheus text exposition whose labels are exactly
/// `labels` (in any order); `None` when there is no such series.
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    want.sort();
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        let (head, v) = rest.rsplit_once(' ')?;
        let inner = head.strip_prefix('{')?.strip_suffix('}')?;
        let mut got: Vec<String> = inner.split(',').map(str::to_string).collect();
        got.sort();
        if got == want { v.parse().ok() } else { None }
    })
}

/// A volume's I/O counters in a scrape, for the series with `labels`: (writes completed,
/// bytes written, reads completed).
pub fn volume_io(text: &str, labels: &[(&str, &str)]) -> Option<(f64, f64, f64)> {
    Some((
        metric_value(text, "liteio_volume_writes_completed_total", labels)?,
        metric_value(text, "liteio_volume_written_bytes_total", labels)?,
        metric_value(text, "liteio_volume_reads_completed_total", labels)?,
    ))
}

/// Waits until the agent's `/metrics` has the I/O counters of the series with `labels`
/// ([`volume_io`]); returns them.
pub async fn io_series(agent: &Agent, labels: &[(&str, &str)], what: &str) -> (f64, f64, f64) {
    eventually(what, Duration::from_secs(5), || async {
        volume_io(&scrape(agent).await, labels)
    })
    .await
}

/// Scrapes the agent's `/metrics`.
pub async fn scrape(agent: &Agent) -> String {
    http_get(agent.metrics_addr().unwrap(), "/metrics").await.1
}

#[allow(unused_imports)]
pub use liteio_tests::spdk_rpc::rpc;

/// An agent over the SPDK lvstore `lvs0` on a 128 MiB malloc bdev (`mem0`), exporting on free
/// ports of 127.0.0.1, against `client`, without host authentication. Needs a running SPDK
/// runtime in this process.
#[cfg(feature = "spdk")]
pub async fn start_spdk_agent(client: &Client, state_dir: &Path) -> Agent {
    start_spdk_agent_with(client, state_dir, false).await
}

/// [`start_spdk_agent`]; `auth`: hosts must authenticate with each volume's keys (the
/// agent's default, `nvmf.auth: dhchap`).
#[cfg(feature = "spdk")]
pub async fn start_spdk_agent_with(client: &Client, state_dir: &Path, auth: bool) -> Agent {
    use liteio_agent::engine::spdk::{BaseBdev, SpdkLvsEngine};
    use liteio_agent::spdk::exporter::SpdkExporter;
    use liteio_agent::spdk::nvmf::TcpTransportOptions;
    let config = Config::from_yaml(
        "storage: {pooling: {name: lvs0, mode: SpdkLVStore}, bdev: {type: memBdev, name: mem0, size: 134217728}}",
    )
    .unwrap();
    let engine: Arc<dyn PoolEngine> = Arc::new(SpdkLvsEngine::new(
        "lvs0",
        BaseBdev::Malloc {
            name: "mem0".into(),
            size: 128 * MIB,
        },
        0,
    ));
    let port = free_port();
    let exporter = Arc::new(
        SpdkExporter::new(
            "127.0.0.1",
            port..=port.saturating_add(5),
            TcpTransportOptions::default(),
        )
        .with_auth(auth),
    );
    Agent::start(
        client.clone(),
        engine,
        exporter,
        test_options(config, state_dir),
    )
    .await
    .unwrap()
}

#[cfg(feature = "spdk")]
#[allow(unused_imports)]
pub use liteio_tests::spdk::{consumer_keys, consumer_keys_and_secrets};
