//! ControllerExpandVolume and ControllerModifyVolume: the changes a live volume takes. An
//! expansion raises `spec.sizeByte` when the volume's pool has the room (growth only; the
//! agent grows the volume, the node its filesystem); a modification writes the QoS limits
//! of a VolumeAttributesClass to `spec.qos`, accepted only where they are enforced. A
//! multi-disk volume grows in [`super::group`].

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::api::PostParams;
use liteio_api::keys::labels;
use liteio_api::{AntstorVolume, VolumeType, size};
use tracing::info;

use super::ControllerService;
use super::answer::i64_of;
use super::checks;
use crate::csi::{
    ControllerExpandVolumeRequest, ControllerExpandVolumeResponse, ControllerModifyVolumeRequest,
    ControllerModifyVolumeResponse,
};
use crate::error::{CsiError, Result};
use crate::group;
use crate::k8s;
use crate::params;

impl ControllerService {
    pub(super) async fn expand_inner(
        &self,
        req: &ControllerExpandVolumeRequest,
    ) -> Result<ControllerExpandVolumeResponse> {
        let (id, new_size) = checks::expand(req)?;
        if group::is_group_id(id) {
            let size = self.expand_group(id, new_size).await?;
            return Ok(ControllerExpandVolumeResponse {
                capacity_bytes: i64_of(size),
                node_expansion_required: true,
            });
        }
        let _guard = self.inflight.claim(&format!("volume {id}"))?;
        let (name, old) = 'retry: {
            for attempt in 0..5 {
                let mut v = self.find_volume(id).await?;
                let name = v.name_any();
                let old = v.spec.size_byte;
                if new_size <= old {
                    // Growth only: a volume at or above the request is left alone (a retried or
                    // smaller request succeeds with the current size; nothing is ever shrunk).
                    return Ok(ControllerExpandVolumeResponse {
                        capacity_bytes: i64_of(old),
                        node_expansion_required: true,
                    });
                }
                let Some(target) = v.target_node().map(str::to_string) else {
                    return Err(CsiError::FailedPrecondition(format!(
                        "volume {name} is not scheduled yet; it cannot be expanded"
                    )));
                };
                let pool = k8s::get_opt(&self.pools(), "StoragePool", &target)
                    .await?
                    .ok_or_else(|| {
                        CsiError::FailedPrecondition(format!(
                            "StoragePool {target} holding volume {name} does not exist"
                        ))
                    })?;
                let delta = new_size - old;
                let free = pool.reported_free_bytes();
                if free < delta {
                    return Err(CsiError::OutOfRange(format!(
                        "capacity_range.required_bytes: pool {target} has {} free, volume {name} needs {} more",
                        size::format_bytes(free),
                        size::format_bytes(delta)
                    )));
                }
                let labels_map = v.metadata.labels.get_or_insert_with(BTreeMap::new);
                labels_map
                    .entry(labels::EXPANSION_ORIGINAL_SIZE.to_string())
                    .or_insert_with(|| old.to_string());
                v.spec.size_byte = new_size;
                match self
                    .volumes()
                    .replace(&name, &PostParams::default(), &v)
                    .await
                {
                    Ok(_) => break 'retry (name, old),
                    // Another writer (the agent, the controller) updated the volume between our
                    // read and write: read it again, a few times, before asking the CO to retry.
                    Err(kube::Error::Api(s)) if s.code == 409 && attempt < 4 => continue,
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        return Err(CsiError::Busy(format!(
                            "volume {name} changed while expanding; retry"
                        )));
                    }
                    Err(e) => {
                        return Err(CsiError::kube(format!("update AntstorVolume {name}"), e));
                    }
                }
            }
            return Err(CsiError::Busy(format!(
                "volume {id} kept changing while expanding; retry"
            )));
        };
        info!(volume = %name, from = old, to = new_size, "volume expansion requested");
        Ok(ControllerExpandVolumeResponse {
            capacity_bytes: i64_of(new_size),
            node_expansion_required: true,
        })
    }

    /// ControllerModifyVolume: the QoS limits of a VolumeAttributesClass's
    /// `mutable_parameters`, written to the volume's `spec.qos` (what a parameter does not
    /// name stays); the agent applies them to the live export. Idempotent.
    pub(super) async fn modify_inner(
        &self,
        req: &ControllerModifyVolumeRequest,
    ) -> Result<ControllerModifyVolumeResponse> {
        let id = checks::modify(req)?;
        let _guard = self.inflight.claim(&format!("volume {id}"))?;
        for attempt in 0..5 {
            let mut v = self.find_volume(id).await?;
            let name = v.name_any();
            let old = v.spec.qos.unwrap_or_default();
            let Some(new) = params::mutable_qos(&req.mutable_parameters, old)? else {
                return Ok(ControllerModifyVolumeResponse {});
            };
            if new == old {
                return Ok(ControllerModifyVolumeResponse {});
            }
            if !new.is_unlimited() {
                self.check_qos_enforced(&v).await?;
            }
            // A migration copies the limits when it starts; a change now would miss the
            // destination.
            if let Some(m) = self.migration_of(&v).await? {
                return Err(CsiError::Busy(format!(
                    "volume {name} is being migrated ({m}); change its limits when the migration ends"
                )));
            }
            v.spec.qos = (!new.is_unlimited()).then_some(new);
            match self
                .volumes()
                .replace(&name, &PostParams::default(), &v)
                .await
            {
                Ok(_) => {
                    info!(volume = %name, from = %old.summary(), to = %new.summary(), "volume QoS limits changed");
                    return Ok(ControllerModifyVolumeResponse {});
                }
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < 4 => {}
                Err(kube::Error::Api(s)) if s.code == 409 => break,
                Err(e) => return Err(CsiError::kube(format!("update AntstorVolume {name}"), e)),
            }
        }
        Err(CsiError::Busy(format!(
            "volume {id} kept changing while its limits were set; retry"
        )))
    }

    /// A limit is accepted only where it is enforced: a volume on an SPDK lvstore (or not
    /// placed yet: the scheduler puts a limited volume on one).
    async fn check_qos_enforced(&self, v: &AntstorVolume) -> Result<()> {
        let name = v.name_any();
        let engine = match (v.spec.type_, v.target_node()) {
            (Some(VolumeType::SpdkLVol), _) | (_, None) => return Ok(()),
            (Some(VolumeType::KernelLVol), Some(t)) => format!("an LVM or file volume on node {t}"),
            (_, Some(t)) => match k8s::get_opt(&self.pools(), "StoragePool", t).await? {
                Some(p) if p.mode() == Some(liteio_api::PoolMode::SpdkLVStore) => return Ok(()),
                Some(_) => format!("on node {t}, whose pool is not an SPDK lvstore"),
                None => format!("on node {t}, which has no StoragePool"),
            },
        };
        Err(CsiError::FailedPrecondition(format!(
            "volume {name} is {engine}: only the SPDK engine enforces QoS limits, and a limit that is not enforced is not accepted"
        )))
    }
}
