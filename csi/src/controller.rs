//! The CSI Controller service: AntstorVolume and AntstorSnapshot objects on behalf of the
//! external provisioner, resizer and snapshotter.
//!
//! The driver never schedules or provisions: CreateVolume writes an AntstorVolume and waits,
//! bounded by [`DriverConfig::schedule_timeout`], for the node-disk-controller to set
//! `spec.targetNodeId` (or to explain in `status.msg` why it cannot). Every call is idempotent
//! and a call that cannot finish yet returns a retryable code instead of hanging.
//!
//! This file holds the service (its API handles, the node look-ups) and the gRPC trait,
//! which hands each call to its room; every request is checked first, in one place:
//! - `checks.rs`: what each call must carry and may not ask for, before any API read;
//! - `volume.rs`: CreateVolume and DeleteVolume of plain volumes, the authentication Secret;
//! - `publish.rs`: ControllerPublishVolume and ControllerUnpublishVolume;
//! - `change.rs`: ControllerExpandVolume and ControllerModifyVolume (QoS limits);
//! - `snapshot.rs`: CreateSnapshot, DeleteSnapshot, ListSnapshots;
//! - `query.rs`: ListVolumes, GetCapacity, ValidateVolumeCapabilities;
//! - `group.rs`: the same calls for multi-disk volumes (ids `dc-<uuid>`, [`crate::group`]);
//! - `answer.rs`: the CSI form of volumes and snapshots (re-exported here).
//!
//! The rooms take the service from here and call each other's methods; this file names
//! none of their items but the re-exported answers, so the imports run one way.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::Api;
use kube::{Client, ResourceExt};
use liteio_api::keys::labels;
use liteio_api::{
    AntstorDataControl, AntstorSnapshot, AntstorVolume, AntstorVolumeGroup, NodeInfo, StoragePool,
};
use tonic::{Request, Response, Status};
use tracing::instrument;

use crate::config::DriverConfig;
use crate::csi::controller_server::Controller;
use crate::csi::controller_service_capability::rpc::Type as RpcType;
use crate::csi::*;
use crate::error::{CsiError, Result, answer};
use crate::k8s::{self, Inflight};

mod answer;
mod change;
mod checks;
mod group;
mod publish;
mod query;
mod snapshot;
mod volume;

pub use answer::{ANNO_SOURCE_SNAP_ID, csi_snapshot, csi_volume, hostname_topology, volume_fs};

/// Capabilities the controller advertises.
pub const CONTROLLER_CAPABILITIES: [RpcType; 8] = [
    RpcType::CreateDeleteVolume,
    RpcType::PublishUnpublishVolume,
    RpcType::ExpandVolume,
    RpcType::CreateDeleteSnapshot,
    RpcType::ListSnapshots,
    RpcType::ListVolumes,
    RpcType::GetCapacity,
    RpcType::ModifyVolume,
];

/// Prefix of the controller's message when no pool fits (RESOURCE_EXHAUSTED).
pub const MSG_NO_POOL: &str = "NoStoragePoolAvailable";
/// Prefix of the controller's message when the volume is invalid (INVALID_ARGUMENT).
pub const MSG_INVALID: &str = "invalid volume";

/// The Controller service.
#[derive(Clone)]
pub struct ControllerService {
    pub(crate) client: Client,
    pub(crate) cfg: Arc<DriverConfig>,
    pub(crate) inflight: Inflight,
    /// Volume names by uuid, for the calls that name a volume by its id.
    pub(crate) by_uuid: crate::uuid_index::UuidIndex,
}

impl ControllerService {
    /// A controller service using `client`.
    pub fn new(client: Client, cfg: Arc<DriverConfig>) -> Self {
        ControllerService {
            client,
            cfg,
            inflight: Inflight::default(),
            by_uuid: crate::uuid_index::UuidIndex::default(),
        }
    }

    fn volumes(&self) -> Api<AntstorVolume> {
        Api::namespaced(self.client.clone(), &self.cfg.namespace)
    }

    fn snapshots(&self) -> Api<AntstorSnapshot> {
        Api::namespaced(self.client.clone(), &self.cfg.namespace)
    }

    fn pools(&self) -> Api<StoragePool> {
        Api::namespaced(self.client.clone(), &self.cfg.namespace)
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.cfg.namespace)
    }

    fn groups(&self) -> Api<AntstorVolumeGroup> {
        Api::namespaced(self.client.clone(), &self.cfg.namespace)
    }

    fn data_controls(&self) -> Api<AntstorDataControl> {
        Api::namespaced(self.client.clone(), &self.cfg.namespace)
    }

    async fn find_volume(&self, id: &str) -> Result<AntstorVolume> {
        self.by_uuid
            .volume(&self.volumes(), id)
            .await?
            .ok_or_else(|| CsiError::NotFound(format!("volume {id} does not exist")))
    }

    pub(crate) async fn node_info(&self, node: &str) -> Result<NodeInfo> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let n = k8s::get_opt(&nodes, "Node", node).await?;
        let mut info = NodeInfo {
            id: node.to_string(),
            hostname: node.to_string(),
            ..NodeInfo::default()
        };
        if let Some(n) = n {
            if let Some(h) = n.labels().get(labels::KUBE_HOSTNAME) {
                info.hostname = h.clone();
            }
            if let Some(ip) = n
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
            {
                info.ip = ip.address.clone();
            }
        }
        Ok(info)
    }

    /// NOT_FOUND unless Node `node` exists.
    async fn require_node(&self, node: &str) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        if k8s::get_opt(&nodes, "Node", node).await?.is_none() {
            return Err(CsiError::NotFound(format!("node {node} does not exist")));
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl Controller for ControllerService {
    #[instrument(skip_all, fields(name = %request.get_ref().name))]
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        answer("CreateVolume", async {
            let volume = self.create_volume_inner(request.get_ref()).await?;
            Ok(CreateVolumeResponse {
                volume: Some(volume),
            })
        })
        .await
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        answer("DeleteVolume", async {
            self.delete_volume_inner(request.get_ref()).await?;
            Ok(DeleteVolumeResponse {})
        })
        .await
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id, node = %request.get_ref().node_id))]
    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        answer(
            "ControllerPublishVolume",
            self.publish_inner(request.get_ref()),
        )
        .await
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id, node = %request.get_ref().node_id))]
    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        answer(
            "ControllerUnpublishVolume",
            self.unpublish_inner(request.get_ref()),
        )
        .await
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        answer(
            "ValidateVolumeCapabilities",
            self.validate_inner(request.get_ref()),
        )
        .await
    }

    #[instrument(skip_all)]
    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        answer("ListVolumes", self.list_volumes_inner(request.get_ref())).await
    }

    #[instrument(skip_all)]
    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        answer("GetCapacity", self.get_capacity_inner(request.get_ref())).await
    }

    #[instrument(skip_all)]
    async fn controller_get_capabilities(
        &self,
        _request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: CONTROLLER_CAPABILITIES
                .iter()
                .map(|t| ControllerServiceCapability {
                    r#type: Some(controller_service_capability::Type::Rpc(
                        controller_service_capability::Rpc { r#type: *t as i32 },
                    )),
                })
                .collect(),
        }))
    }

    #[instrument(skip_all, fields(name = %request.get_ref().name, volume = %request.get_ref().source_volume_id))]
    async fn create_snapshot(
        &self,
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        answer("CreateSnapshot", async {
            let snapshot = self.create_snapshot_inner(request.get_ref()).await?;
            Ok(CreateSnapshotResponse {
                snapshot: Some(snapshot),
            })
        })
        .await
    }

    #[instrument(skip_all, fields(snapshot = %request.get_ref().snapshot_id))]
    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        answer("DeleteSnapshot", async {
            self.delete_snapshot_inner(request.get_ref()).await?;
            Ok(DeleteSnapshotResponse {})
        })
        .await
    }

    #[instrument(skip_all)]
    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        answer(
            "ListSnapshots",
            self.list_snapshots_inner(request.get_ref()),
        )
        .await
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        answer(
            "ControllerExpandVolume",
            self.expand_inner(request.get_ref()),
        )
        .await
    }

    async fn controller_get_volume(
        &self,
        _request: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "ControllerGetVolume: GET_VOLUME is not advertised",
        ))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn controller_modify_volume(
        &self,
        request: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        answer(
            "ControllerModifyVolume",
            self.modify_inner(request.get_ref()),
        )
        .await
    }
}
