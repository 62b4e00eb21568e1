//! The calls that only read: ListVolumes, GetCapacity (the free space of the schedulable
//! pools, all or those of one node) and ValidateVolumeCapabilities.

use std::collections::HashMap;

use kube::ResourceExt;
use kube::api::ListParams;
use liteio_api::keys::labels;
use liteio_api::{AntstorVolume, StoragePool, size};

use super::ControllerService;
use super::answer::{csi_volume, i64_of};
use super::checks;
use crate::csi::{
    GetCapacityRequest, GetCapacityResponse, ListVolumesRequest, ListVolumesResponse,
    ValidateVolumeCapabilitiesRequest, ValidateVolumeCapabilitiesResponse, list_volumes_response,
    validate_volume_capabilities_response,
};
use crate::error::{CsiError, Result};
use crate::group;
use crate::params;

impl ControllerService {
    pub(super) async fn list_volumes_inner(
        &self,
        req: &ListVolumesRequest,
    ) -> Result<ListVolumesResponse> {
        let list = self
            .volumes()
            .list(&ListParams::default())
            .await
            .map_err(|e| CsiError::kube("list AntstorVolume", e))?;
        let mut vols: Vec<&AntstorVolume> = list
            .items
            .iter()
            // A volume being deleted is gone for the CO (DeleteVolume returned); only the
            // agent's clean-up is left.
            .filter(|v| !v.spec.uuid.is_empty() && v.metadata.deletion_timestamp.is_none())
            .collect();
        vols.sort_by(|a, b| a.spec.uuid.cmp(&b.spec.uuid));
        let start = params::page_offset(&req.starting_token, vols.len())?;
        let (start, end, next_token) = params::page(start, req.max_entries, vols.len())?;
        Ok(ListVolumesResponse {
            entries: vols[start..end]
                .iter()
                .map(|v| list_volumes_response::Entry {
                    volume: Some(csi_volume(v, &HashMap::new())),
                    status: None,
                })
                .collect(),
            next_token,
        })
    }

    pub(super) async fn get_capacity_inner(
        &self,
        req: &GetCapacityRequest,
    ) -> Result<GetCapacityResponse> {
        checks::get_capacity(req)?;
        let node = req
            .accessible_topology
            .as_ref()
            .and_then(|t| t.segments.get(labels::KUBE_HOSTNAME));
        let pools = self
            .pools()
            .list(&ListParams::default())
            .await
            .map_err(|e| CsiError::kube("list StoragePool", e))?;
        let free: Vec<u64> = pools
            .items
            .iter()
            .filter(|p| p.is_schedulable())
            .filter(|p| {
                node.is_none_or(|n| {
                    p.name_any() == *n
                        || p.spec.node_info.hostname == *n
                        || p.spec.node_info.id == *n
                })
            })
            .map(StoragePool::reported_free_bytes)
            .collect();
        // Saturating: the free sizes come from the API server (vgFreeSize).
        let total = free.iter().fold(0u64, |sum, f| sum.saturating_add(*f));
        let largest = free.iter().copied().max().unwrap_or(0);
        Ok(GetCapacityResponse {
            available_capacity: i64_of(total),
            // One volume lives in one pool: the largest free space bounds a single volume.
            maximum_volume_size: Some(i64_of(
                size::round_down(largest, size::VOLUME_UNIT).unwrap_or(0),
            )),
            minimum_volume_size: Some(i64_of(size::MIN_VOLUME_SIZE)),
        })
    }

    pub(super) async fn validate_inner(
        &self,
        req: &ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse> {
        let id = checks::validate(req)?;
        if group::is_group_id(id) {
            self.data_control_by_id(id)
                .await?
                .ok_or_else(|| CsiError::NotFound(format!("volume {id} does not exist")))?;
        } else {
            self.find_volume(id).await?;
        }
        match params::check_capabilities("volume_capabilities", &req.volume_capabilities) {
            Ok(_) => Ok(ValidateVolumeCapabilitiesResponse {
                confirmed: Some(validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context.clone(),
                    volume_capabilities: req.volume_capabilities.clone(),
                    parameters: req.parameters.clone(),
                    mutable_parameters: HashMap::new(),
                }),
                message: String::new(),
            }),
            Err(e) => Ok(ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: e.to_string(),
            }),
        }
    }
}
