//! NodePublishVolume and NodeUnpublishVolume: bind-mount the staged volume (or its device,
//! for raw block) at the pod's target path and back; record the publish parameters on the
//! volume and register it with the metrics; at each republish, hand the node-publish
//! Secret's current keys to the connected NVMe controller.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use liteio_api::keys::managers;
use liteio_api::{AntstorVolume, CsiNodePubParams};
use serde_json::json;
use tracing::{info, warn};

use super::auth::{publish_keys, report_key_refresh};
use super::host::{Attach, Host, attach_plan, publish_bind};
use super::{NodeService, blocking};
use crate::csi::{NodePublishVolumeRequest, NodeUnpublishVolumeRequest};
use crate::error::{CsiError, Result};
use crate::params::{self, require};

impl NodeService {
    async fn record_publish(&self, vol: &AntstorVolume, req: &NodePublishVolumeRequest) {
        if req
            .volume_context
            .get(params::CTX_SKIP_SAVE)
            .map(String::as_str)
            == Some("true")
        {
            return;
        }
        let ctx: BTreeMap<String, String> = req
            .volume_context
            .iter()
            .filter(|(k, _)| k.starts_with("csi.storage.k8s.io/pod."))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let params = CsiNodePubParams {
            staging_target_path: req.staging_target_path.clone(),
            target_path: req.target_path.clone(),
            volume_context: ctx,
        };
        let body = json!({"status": {"csiNodePubParams": params}});
        let pp = PatchParams {
            field_manager: Some(managers::CSI.to_string()),
            ..PatchParams::default()
        };
        if let Err(e) = self
            .volumes()
            .patch_status(&vol.name_any(), &pp, &Patch::Merge(&body))
            .await
        {
            warn!(volume = %vol.name_any(), error = %e, "cannot record the publish parameters on the volume");
        }
    }

    /// Gives the keys of the node-publish Secret to the volume's NVMe/TCP controller when
    /// they changed (a rotation since NodeStageVolume). Never fails the publish: a failure
    /// is logged as a warning and retried at kubelet's next republish, because the volume is
    /// mounted and working and a failed NodePublishVolume would report the pod's volume as
    /// failing for a problem that only matters at the next reconnect.
    pub(super) async fn refresh_keys(
        &self,
        vol: &AntstorVolume,
        plan: &Attach,
        req: &NodePublishVolumeRequest,
    ) {
        if !matches!(plan, Attach::Nvme(_)) || req.secrets.is_empty() {
            return;
        }
        let name = vol.name_any();
        let keys = match publish_keys(&req.secrets) {
            Ok(Some(keys)) => keys,
            Ok(None) => return,
            Err(e) => {
                report_key_refresh(&name, &Err(e));
                return;
            }
        };
        let host = self.host.clone();
        let plan = plan.clone();
        let outcome = blocking(move || host.refresh_keys(&plan, &keys)).await;
        report_key_refresh(&name, &outcome);
    }

    pub(super) async fn publish(&self, req: &NodePublishVolumeRequest) -> Result<()> {
        let id = require("volume_id", &req.volume_id)?;
        let target = PathBuf::from(require("target_path", &req.target_path)?);
        let staging = PathBuf::from(require("staging_target_path", &req.staging_target_path)?);
        let access = params::require_capability(req.volume_capability.as_ref())?;
        let _g = self.inflight.claim(&format!("volume {id}"))?;
        if crate::group::is_group_id(id) {
            return self.publish_group(req, id, target, staging, access).await;
        }
        let vol = self.find_volume(id).await?;
        let plan = attach_plan(&vol, &self.cfg.node_id)?;
        self.refresh_keys(&vol, &plan, req).await;
        let host = self.host.clone();
        let readonly = req.readonly;
        let t = target.clone();
        blocking(move || {
            publish_bind(&host, access, &staging, &t, readonly, |h: &Host| {
                h.find_device(&plan)
            })
        })
        .await?;
        info!(volume = %vol.name_any(), target = %target.display(), readonly, "volume published");
        self.record_publish(&vol, req).await;
        if let Some(m) = &self.metrics {
            m.register(id, &vol, &target);
        }
        Ok(())
    }

    pub(super) async fn unpublish(&self, req: &NodeUnpublishVolumeRequest) -> Result<()> {
        let id = require("volume_id", &req.volume_id)?;
        let target = PathBuf::from(require("target_path", &req.target_path)?);
        let _g = self.inflight.claim(&format!("volume {id}"))?;
        let host = self.host.clone();
        let t = target.clone();
        blocking(move || {
            host.unmount(&t)?;
            match std::fs::symlink_metadata(&t) {
                Ok(m) if m.is_dir() => std::fs::remove_dir(&t),
                Ok(_) => std::fs::remove_file(&t),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
            }
            .map_err(|e| CsiError::io(format!("remove target_path {}", t.display()), e))
        })
        .await?;
        if let Some(m) = &self.metrics {
            m.unregister(&target);
        }
        info!(volume = id, target = %target.display(), "volume unpublished");
        Ok(())
    }
}
