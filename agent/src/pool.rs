//! The StoragePool object of this node: spec, status, annotations and labels.
//!
//! **Expected flow.** [`PoolReporter::register`] runs once at start-up (retried until it
//! succeeds): it server-side-applies metadata and spec with field manager
//! `liteio_api::keys::managers::AGENT` (label `obnvmf/node-sn`, annotations `obnvmf/hostnqn`
//! and, when the agent has an NVMe-oF target, `obnvmf/tgt-version`; spec from the engine, the
//! node's addresses and node info). [`PoolReporter::run`] then keeps the status current: it
//! wakes on every notification of the pool-change [`Notify`] (the volume and snapshot syncs
//! notify after every engine operation), on a slow resync timer (safety net), and retries
//! failed writes after a short backoff. Status changes therefore reach the API server within
//! a fraction of a second, not on LiteIO's 2-minute timer.
//!
//! **Guarantees.** The spec and metadata are written by server-side apply, so labels and
//! annotations of other managers (`obnvmf/pool-scheduling-status=locked`) are kept. The status
//! goes through the status subresource as a merge patch guarded by the object's
//! `resourceVersion`; it writes `capacity.storage`, `vgFreeSize`, the `Spdk` and `Lvm`
//! conditions, keeps the controller's `KubeNode` condition (adding one only when none
//! exists: OK when the Node object exists), and sets `status: ready` only when no status was
//! ever written (the controller owns ready / unknown / offline / locked afterwards). Nothing
//! is written when nothing changed.
//!
//! **The file engine** is represented as `spec.kernelLvm` (name = pool name, vgUUID = the pool
//! id, bytes = capacity, extendSize = allocation unit, extendCount = bytes / unit, pvCount 0).
//! LiteIO has no third engine; the file engine behaves like an LVM pool to everyone else — a
//! volume is a local object with a device path (`spec.kernelLvol`), exported remotely through
//! an aio bdev exactly like a remote LVM volume — so the controller's scheduler (which checks
//! `kernelLvm.vgUUID` for `KernelLVol` volumes) and the CSI node treat it correctly without any
//! field LiteIO lacks.
//!
//! **Errors.** API failures are returned as [`AgentError`]; the run loop logs them and
//! retries. An engine failure while reading capacity turns the `Lvm` condition to `Error`
//! with the engine's message instead of failing the write.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeAddress};
use kube::Api;
use kube::api::{Patch, PatchParams};
use liteio_api::keys::{self, annotations, labels, managers};
use liteio_api::pool::{
    ConditionStatus, KernelLvm, PoolCondition, PoolConditionType, PoolStatus, ReservedLvol,
    SpdkLvStore,
};
use liteio_api::{NodeInfo, StoragePool, StoragePoolSpec, StoragePoolStatus, size};
pub use liteio_node::hostnqn::HostNqnError;
use serde_json::json;
use tokio::sync::{Notify, watch};
use tracing::{debug, info, instrument, warn};

use crate::config::{Config, NodeInfoKeys};
use crate::context::Ctx;
use crate::engine::{EngineError, EngineKind, PoolInfo};
use crate::error::{AgentError, Result, error_chain};
use crate::exporter::ExporterHealth;

/// Default path of the node's NVMe host NQN.
pub const DEFAULT_HOST_NQN_PATH: &str = liteio_node::hostnqn::DEFAULT_PATH;

/// The node's host NQN (see [`liteio_node::hostnqn::load`]): the first line of `path`, or
/// `nqn.2021-03.com.alipay.host:uuid:<node>` written there when the file is missing or blank
/// (as LiteIO does). A file that cannot be read or holds no NQN is an error, left untouched.
pub fn load_host_nqn(path: &Path, node: &str) -> Result<String, HostNqnError> {
    liteio_node::hostnqn::load(path, node)
}

/// Node info and addresses from the Node object.
///
/// ip = the `ipLabelKey` label, else the InternalIP address; hostname = the
/// `hostnameLabelKey` label, else `kubernetes.io/hostname`, else the node name; labels = the
/// Node's labels (LiteIO copies them all; affinity rules match on them). Fields given in the
/// config's `nodeInfo` win. Without a Node object only the config and the name are used.
pub fn node_facts(
    node_id: &str,
    node: Option<&Node>,
    keys: &NodeInfoKeys,
    configured: Option<&NodeInfo>,
) -> (NodeInfo, Vec<NodeAddress>) {
    let node_labels: BTreeMap<String, String> = node
        .and_then(|n| n.metadata.labels.clone())
        .unwrap_or_default();
    let internal_ip = node
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
        .map(|a| a.address.clone());
    let mut info = NodeInfo {
        id: node_id.to_string(),
        ip: node_labels
            .get(&keys.ip_label_key)
            .cloned()
            .or(internal_ip)
            .unwrap_or_default(),
        hostname: node_labels
            .get(&keys.hostname_label_key)
            .or_else(|| node_labels.get(labels::KUBE_HOSTNAME))
            .cloned()
            .unwrap_or_else(|| node_id.to_string()),
        labels: node_labels,
    };
    if let Some(c) = configured {
        if !c.ip.is_empty() {
            info.ip.clone_from(&c.ip);
        }
        if !c.hostname.is_empty() {
            info.hostname.clone_from(&c.hostname);
        }
        for (k, v) in &c.labels {
            info.labels.insert(k.clone(), v.clone());
        }
    }
    let addresses = if info.ip.is_empty() {
        Vec::new()
    } else {
        vec![NodeAddress {
            type_: "InternalIP".to_string(),
            address: info.ip.clone(),
        }]
    };
    (info, addresses)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The pool spec for an engine's pool. See the module doc for the file engine's mapping.
pub fn pool_spec(
    kind: EngineKind,
    pool: &PoolInfo,
    config: &Config,
    node_info: NodeInfo,
    addresses: Vec<NodeAddress>,
) -> StoragePoolSpec {
    let unit = pool.allocation_unit.max(1);
    let mut spec = StoragePoolSpec {
        addresses,
        node_info,
        ..StoragePoolSpec::default()
    };
    match kind {
        EngineKind::SpdkLvs => {
            spec.spdk_lv_store = SpdkLvStore {
                name: pool.name.clone(),
                uuid: pool.uuid.clone(),
                base_bdev: config
                    .storage
                    .bdev
                    .as_ref()
                    .map(|b| b.name.clone())
                    .unwrap_or_default(),
                bytes: pool.total_bytes,
                cluster_size: to_i64(unit),
                total_data_clusters: to_i64(pool.total_bytes / unit),
                block_size: 0,
            };
        }
        _ => {
            spec.kernel_lvm = KernelLvm {
                name: pool.name.clone(),
                vg_uuid: pool.uuid.clone(),
                bytes: pool.total_bytes,
                extend_size: unit,
                extend_count: to_i64(pool.total_bytes / unit),
                pv_count: i64::from(pool.pv_count),
                reserved_lvol: pool
                    .reserved
                    .iter()
                    .map(|r| ReservedLvol {
                        name: r.name.clone(),
                        vg_name: pool.name.clone(),
                        dev_path: r.path.display().to_string(),
                        size_byte: r.size_bytes,
                        lv_layout: r.layout.map(|l| l.to_string()).unwrap_or_default(),
                    })
                    .collect(),
            };
        }
    }
    spec
}

fn condition(type_: PoolConditionType, ok: bool, message: String) -> PoolCondition {
    PoolCondition {
        type_,
        status: if ok {
            ConditionStatus::Ok
        } else {
            ConditionStatus::Error
        },
        message,
    }
}

/// The desired status from the current one, the engine's view and the target's health.
/// Pure: see the module doc for what is kept from `current`.
pub fn desired_status(
    current: Option<&StoragePoolStatus>,
    kind: EngineKind,
    pool: std::result::Result<&PoolInfo, &EngineError>,
    health: &ExporterHealth,
    node_exists: bool,
) -> StoragePoolStatus {
    let mut st = current.cloned().unwrap_or_default();
    if let Ok(p) = pool {
        st.capacity.insert(
            keys::RESOURCE_STORAGE.to_string(),
            size::quantity(p.total_bytes),
        );
        st.vg_free_size = Some(size::quantity(p.free_bytes));
    }
    let health_msg = match health {
        ExporterHealth::Ok { .. } => None,
        ExporterHealth::Absent => {
            Some("this agent has no NVMe-oF target (built without the spdk feature)".to_string())
        }
        ExporterHealth::Error { message } => Some(message.clone()),
    };
    let mut conditions = Vec::new();
    match (kind, pool) {
        // An SPDK pool: the lvstore lives in the target, so both feed the Spdk condition.
        (EngineKind::SpdkLvs, Err(e)) => {
            conditions.push(condition(PoolConditionType::Spdk, false, error_chain(e)));
        }
        (EngineKind::SpdkLvs, Ok(_)) => conditions.push(condition(
            PoolConditionType::Spdk,
            health_msg.is_none(),
            health_msg.unwrap_or_default(),
        )),
        (_, pool) => {
            conditions.push(condition(
                PoolConditionType::Spdk,
                health_msg.is_none(),
                health_msg.unwrap_or_default(),
            ));
            conditions.push(match pool {
                Ok(_) => condition(PoolConditionType::Lvm, true, String::new()),
                Err(e) => condition(PoolConditionType::Lvm, false, error_chain(e)),
            });
        }
    }
    let kube_node = st
        .conditions
        .iter()
        .find(|c| c.type_ == PoolConditionType::KubeNode)
        .cloned()
        .unwrap_or_else(|| {
            if node_exists {
                condition(PoolConditionType::KubeNode, true, String::new())
            } else {
                condition(
                    PoolConditionType::KubeNode,
                    false,
                    "the Node object does not exist".to_string(),
                )
            }
        });
    conditions.push(kube_node);
    st.conditions = conditions;
    if st.status.is_none() {
        st.status = Some(PoolStatus::Ready);
    }
    st
}

/// Options of the pool reporter.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// The whole agent config (node info keys, bdev name).
    pub config: Config,
    /// The host NQN to publish.
    pub host_nqn: String,
    /// Safety-net resync period.
    pub resync: Duration,
    /// Retry delay after a failed write.
    pub retry: Duration,
}

/// Keeps this node's StoragePool in step with the engine.
#[derive(Debug)]
pub struct PoolReporter {
    ctx: Arc<Ctx>,
    opts: PoolOptions,
    last_spec: Mutex<Option<StoragePoolSpec>>,
}

impl PoolReporter {
    /// A reporter for the agent context.
    pub fn new(ctx: Arc<Ctx>, opts: PoolOptions) -> Self {
        Self {
            ctx,
            opts,
            last_spec: Mutex::new(None),
        }
    }

    fn api(&self) -> Api<StoragePool> {
        Api::namespaced(self.ctx.client.clone(), keys::DEFAULT_NAMESPACE)
    }

    async fn node(&self) -> Result<Option<Node>> {
        let api: Api<Node> = Api::all(self.ctx.client.clone());
        self.ctx
            .timed(
                "get",
                format!("Node {}", self.ctx.node),
                api.get_opt(&self.ctx.node),
            )
            .await
    }

    async fn health(&self) -> ExporterHealth {
        match self.ctx.exporter.health().await {
            Ok(h) => h,
            Err(e) => ExporterHealth::Error {
                message: error_chain(&e),
            },
        }
    }

    /// Creates or updates the StoragePool's metadata and spec (server-side apply), then
    /// writes its status. Idempotent.
    ///
    /// Errors: the API request failed, or the engine cannot report the pool.
    #[instrument(skip(self), fields(node = %self.ctx.node))]
    pub async fn register(&self) -> Result<StoragePool> {
        let info = self.ctx.engine_info().await?;
        let node = self.node().await?;
        let pool = self.apply_spec(&info, node.as_ref()).await?;
        self.push_status_with(Some(&pool), Ok(&info), node.is_some())
            .await?;
        self.ctx.metrics.set_ready(true);
        info!(pool = %info.name, total = info.total_bytes, free = info.free_bytes, "StoragePool registered");
        self.api()
            .get(&self.ctx.node)
            .await
            .map_err(|e| AgentError::kube("get", self.what(), e))
    }

    fn what(&self) -> String {
        format!("StoragePool {}/{}", keys::DEFAULT_NAMESPACE, self.ctx.node)
    }

    async fn apply_spec(&self, info: &PoolInfo, node: Option<&Node>) -> Result<StoragePool> {
        let cfg = &self.opts.config;
        let (node_info, addresses) = node_facts(
            &self.ctx.node,
            node,
            &cfg.node_info_keys,
            cfg.node_info.as_ref(),
        );
        let spec = pool_spec(self.ctx.engine.kind(), info, cfg, node_info, addresses);
        let mut annos = serde_json::Map::new();
        annos.insert(annotations::HOST_NQN.into(), json!(self.opts.host_nqn));
        annos.insert(
            annotations::POOLING_MODE.into(),
            json!(cfg.storage.pooling.mode.to_string()),
        );
        if let ExporterHealth::Ok { version } = self.health().await {
            annos.insert(annotations::TGT_VERSION.into(), json!(version));
        }
        let body = json!({
            "apiVersion": keys::API_VERSION,
            "kind": "StoragePool",
            "metadata": {
                "name": self.ctx.node,
                "namespace": keys::DEFAULT_NAMESPACE,
                "labels": { labels::NODE_SN: self.ctx.node },
                "annotations": annos,
            },
            "spec": spec,
        });
        let pp = PatchParams::apply(managers::AGENT).force();
        let pool = self
            .ctx
            .timed(
                "apply",
                self.what(),
                self.api().patch(&self.ctx.node, &pp, &Patch::Apply(&body)),
            )
            .await?;
        *self.last_spec.lock().unwrap_or_else(|p| p.into_inner()) = Some(spec);
        Ok(pool)
    }

    async fn push_status_with(
        &self,
        pool: Option<&StoragePool>,
        info: std::result::Result<&PoolInfo, &EngineError>,
        node_exists: bool,
    ) -> Result<bool> {
        let fetched;
        let pool = match pool {
            Some(p) => p,
            None => {
                fetched = self
                    .ctx
                    .timed("get", self.what(), self.api().get_opt(&self.ctx.node))
                    .await?
                    .ok_or_else(|| AgentError::NotFound { what: self.what() })?;
                &fetched
            }
        };
        let health = self.health().await;
        let desired = desired_status(
            pool.status.as_ref(),
            self.ctx.engine.kind(),
            info,
            &health,
            node_exists,
        );
        if let Ok(i) = info {
            self.ctx.metrics.set_pool(i.total_bytes, i.free_bytes);
        }
        if pool.status.as_ref() == Some(&desired) {
            return Ok(false);
        }
        let body = json!({
            "metadata": { "resourceVersion": pool.metadata.resource_version },
            "status": desired,
        });
        let pp = PatchParams {
            field_manager: Some(managers::AGENT.to_string()),
            ..PatchParams::default()
        };
        self.ctx
            .timed(
                "patch status of",
                self.what(),
                self.api()
                    .patch_status(&self.ctx.node, &pp, &Patch::Merge(&body)),
            )
            .await?;
        debug!(node = %self.ctx.node, "pool status written");
        Ok(true)
    }

    /// One pass: re-applies the spec if the engine's view changed, then writes the status
    /// if it changed. Returns whether the status was written.
    pub async fn sync_once(&self) -> Result<bool> {
        let info = self.ctx.engine_info().await;
        let node = self.node().await?;
        let mut pool = None;
        if let Ok(i) = &info {
            let cfg = &self.opts.config;
            let (ni, addrs) = node_facts(
                &self.ctx.node,
                node.as_ref(),
                &cfg.node_info_keys,
                cfg.node_info.as_ref(),
            );
            let spec = pool_spec(self.ctx.engine.kind(), i, cfg, ni, addrs);
            let changed = self
                .last_spec
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                != Some(&spec);
            if changed {
                pool = Some(self.apply_spec(i, node.as_ref()).await?);
            }
        }
        let engine_err;
        let info_ref = match &info {
            Ok(i) => Ok(i),
            Err(AgentError::Engine { source, .. }) => Err(source),
            Err(other) => {
                engine_err = EngineError::InvalidArgument(other.chain());
                Err(&engine_err)
            }
        };
        self.push_status_with(pool.as_ref(), info_ref, node.is_some())
            .await
    }

    /// Runs until `shutdown` turns true; see the module doc. Ends with a final status write.
    pub async fn run(self: Arc<Self>, changed: Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
        let mut retry = false;
        loop {
            let wait = if retry {
                self.opts.retry
            } else {
                self.opts.resync
            };
            tokio::select! {
                _ = changed.notified() => {}
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.wait_for(|s| *s) => break,
            }
            match self.sync_once().await {
                Ok(_) => retry = false,
                Err(e) => {
                    warn!(node = %self.ctx.node, kind = %e.kind(), error = %e.chain(), "pool status sync failed; retrying");
                    self.ctx
                        .metrics
                        .reconcile_error("storagepool", e.kind().as_str());
                    retry = true;
                }
            }
        }
        if let Err(e) = self.sync_once().await {
            self.ctx
                .metrics
                .reconcile_error("storagepool", e.kind().as_str());
            warn!(node = %self.ctx.node, error = %e.chain(), "final pool status write failed");
        }
    }
}

/// Where the host NQN is read from when the options name none.
pub fn default_host_nqn_path() -> PathBuf {
    PathBuf::from(DEFAULT_HOST_NQN_PATH)
}
