//! The CSI Node service: attach (NVMe/TCP or a local device), format, mount, publish and the
//! reverse, expansion and statistics.
//!
//! How a volume is attached on this node:
//! - **local**: the volume is scheduled to this node (`spec.targetNodeId`) and has
//!   `spec.kernelLvol.devPath`. A block device (an LVM LV) is used as is; a regular file (a
//!   file-engine volume, `<pool>/volumes/<name>.img`) gets a loop device
//!   (`losetup --find --show`, reused when `losetup -j` shows one).
//! - **NVMe/TCP**: otherwise, when the agent exported it (`spec.spdkTarget`): `nvme connect`
//!   as this node's host NQN, then the namespace is found by serial number in sysfs. When
//!   kubelet passes the volume's Secret (`NodeStageVolumeRequest.secrets`, from the
//!   StorageClass's `csi.storage.k8s.io/node-stage-secret-*` parameters), the connection uses
//!   DH-HMAC-CHAP in both directions and is made through `/dev/nvme-fabrics`, so that no
//!   secret is ever on a command line (see [`crate::nvme`]). Keys rotated later reach the
//!   connected controller at NodePublishVolume: the CSIDriver's `requiresRepublish` makes
//!   kubelet call it about every minute with the current node-publish Secret, and changed
//!   keys are written to the controller's sysfs attributes ([`Host::refresh_keys`]).
//!
//! Blocking work (commands, sysfs polling) runs on tokio's blocking pool.
//!
//! This file holds the service (its API handle, the metrics, the shared helpers) and the
//! gRPC trait, which hands each call to its room:
//! - `host.rs`: how this node reaches a volume and the blocking host work ([`Host`]);
//! - `auth.rs`: the keys a request carries and this kernel's authentication support;
//! - `stage.rs`: NodeStageVolume and NodeUnstageVolume;
//! - `publish.rs`: NodePublishVolume and NodeUnpublishVolume;
//! - `stats.rs`: NodeGetVolumeStats and NodeExpandVolume;
//! - `group.rs`: the same calls for multi-disk volumes.
//!
//! The rooms take the service from here; what other crates name (the host and
//! authentication items) is re-exported here from rooms that import nothing of this file,
//! so the imports run one way.

use std::sync::Arc;

use kube::Client;
use kube::ResourceExt;
use kube::api::Api;
use liteio_api::AntstorVolume;
use tonic::{Request, Response, Status};
use tracing::{info, instrument, warn};

use crate::cmd::CommandRunner;
use crate::config::DriverConfig;
use crate::controller::hostname_topology;
use crate::csi::node_server::Node;
use crate::csi::node_service_capability::rpc::Type as RpcType;
use crate::csi::*;
use crate::error::{CsiError, Result, answer};
use crate::k8s::{self, Inflight};
use crate::metrics::VolumeMetrics;
use crate::nvme;

mod auth;
pub mod group;
mod host;
mod publish;
mod stage;
mod stats;
#[cfg(test)]
mod tests;

pub use auth::{
    KeyRefresh, capability, publish_capabilities, publish_keys, report_key_refresh, stage_keys,
};
pub use host::{Attach, Host, attach_plan, check_host, volume_nqn};

/// Capabilities the node advertises.
pub const NODE_CAPABILITIES: [RpcType; 4] = [
    RpcType::StageUnstageVolume,
    RpcType::ExpandVolume,
    RpcType::GetVolumeStats,
    RpcType::VolumeCondition,
];

/// The Node service.
#[derive(Clone)]
pub struct NodeService {
    client: Client,
    cfg: Arc<DriverConfig>,
    /// What this host's kernel can do for NVMe-oF connections (found once, at start).
    caps: nvme::HostCapabilities,
    host: Host,
    inflight: Inflight,
    metrics: Option<Arc<VolumeMetrics>>,
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CsiError::Internal(format!("blocking task failed: {e}")))?
}

/// FAILED_PRECONDITION with the storage node's reason when the volume failed for good (the
/// pool cannot do what it needs, the object is invalid): waiting would not help.
fn permanent_failure(v: &AntstorVolume) -> Result<()> {
    match v.permanent_failure() {
        Some(msg) => Err(CsiError::FailedPrecondition(format!(
            "volume {} cannot be served: {msg}",
            v.name_any()
        ))),
        None => Ok(()),
    }
}

impl NodeService {
    /// A node service for `cfg.node_id`.
    pub fn new(
        client: Client,
        cfg: Arc<DriverConfig>,
        runner: Arc<dyn CommandRunner>,
        metrics: Option<Arc<VolumeMetrics>>,
    ) -> Self {
        let caps = cfg
            .host_capabilities
            .clone()
            .unwrap_or_else(nvme::this_host_capabilities);
        info!(kernel = %caps.kernel, dhchap = caps.dhchap, tls = caps.tls, evidence = %caps.dhchap_evidence, "NVMe-oF host capabilities");
        NodeService {
            client,
            caps,
            host: Host::new(Arc::clone(&cfg), runner),
            cfg,
            inflight: Inflight::default(),
            metrics,
        }
    }

    fn volumes(&self) -> Api<AntstorVolume> {
        Api::namespaced(self.client.clone(), &self.cfg.namespace)
    }

    /// Counts a stage refused for want of authentication (when metrics are served).
    fn auth_refused(&self, reason: &'static str) {
        if let Some(m) = &self.metrics {
            m.auth_refused(reason);
        }
    }

    async fn find_volume(&self, id: &str) -> Result<AntstorVolume> {
        k8s::volume_by_uuid(&self.volumes(), id)
            .await?
            .ok_or_else(|| CsiError::NotFound(format!("volume {id} does not exist")))
    }

    /// Writes what this kernel can do onto this node's Node object
    /// (`liteio.io/nvme-host-auth`, `liteio.io/kernel-release`), where the disk-agents read
    /// it to decide which hosts a `preferred` volume admits without keys. Idempotent (nothing
    /// is written when the annotations say so already); a failure is logged, not fatal: a
    /// host that needs the annotation tries again at NodeStageVolume.
    pub async fn publish_capabilities(&self) {
        let node = &self.cfg.node_id;
        match publish_capabilities(&self.client, node, &self.caps).await {
            Ok(true) => {
                info!(node = %node, host_auth = %capability(&self.caps).annotation(), kernel = %self.caps.kernel, "published this kernel's NVMe/TCP authentication support on the Node")
            }
            Ok(false) => {}
            Err(e) => {
                warn!(node = %node, error = %e.chain(), "cannot publish this kernel's NVMe/TCP authentication support on the Node; volumes with liteio.io/host-auth: preferred keep their keys for this host until it is published")
            }
        }
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        answer("NodeStageVolume", async {
            self.stage(request.get_ref()).await.inspect_err(|e| {
                if let CsiError::Unauthenticated { reason, .. } = e {
                    self.auth_refused(reason);
                }
            })?;
            Ok(NodeStageVolumeResponse {})
        })
        .await
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        answer("NodeUnstageVolume", async {
            self.unstage(request.get_ref()).await?;
            Ok(NodeUnstageVolumeResponse {})
        })
        .await
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        answer("NodePublishVolume", async {
            self.publish(request.get_ref()).await?;
            Ok(NodePublishVolumeResponse {})
        })
        .await
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        answer("NodeUnpublishVolume", async {
            self.unpublish(request.get_ref()).await?;
            Ok(NodeUnpublishVolumeResponse {})
        })
        .await
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        answer("NodeGetVolumeStats", self.stats(request.get_ref())).await
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        answer("NodeExpandVolume", self.expand(request.get_ref())).await
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: NODE_CAPABILITIES
                .iter()
                .map(|t| NodeServiceCapability {
                    r#type: Some(node_service_capability::Type::Rpc(
                        node_service_capability::Rpc { r#type: *t as i32 },
                    )),
                })
                .collect(),
        }))
    }

    #[instrument(skip_all)]
    async fn node_get_info(
        &self,
        _request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.cfg.node_id.clone(),
            max_volumes_per_node: self.cfg.max_volumes_per_node,
            accessible_topology: Some(hostname_topology(&self.cfg.node_id)),
        }))
    }
}
