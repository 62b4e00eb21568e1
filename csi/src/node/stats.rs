//! NodeGetVolumeStats (the mounted filesystem's usage, or a raw block device's size, with
//! the volume's condition) and NodeExpandVolume (wait until the storage node grew the
//! volume, then grow the filesystem, or for a multi-disk volume the LV, see
//! [`super::group`]).

use std::path::{Path, PathBuf};

use kube::ResourceExt;
use liteio_api::AntstorVolume;
use liteio_api::keys::labels;
use tracing::info;

use super::host::attach_plan;
use super::{NodeService, blocking, permanent_failure};
use crate::cmd::{self, argv};
use crate::csi::{
    NodeExpandVolumeRequest, NodeExpandVolumeResponse, NodeGetVolumeStatsRequest,
    NodeGetVolumeStatsResponse, VolumeCondition, VolumeUsage, volume_usage,
};
use crate::error::{CsiError, Result};
use crate::k8s::{self, Waited};
use crate::mount;
use crate::params::{self, Access, require};

/// Whether the storage node has yet to grow the volume (ControllerExpandVolume's label).
fn growing(v: &AntstorVolume) -> bool {
    v.labels().contains_key(labels::EXPANSION_ORIGINAL_SIZE)
}

impl NodeService {
    pub(super) async fn stats(
        &self,
        req: &NodeGetVolumeStatsRequest,
    ) -> Result<NodeGetVolumeStatsResponse> {
        require("volume_id", &req.volume_id)?;
        let path = PathBuf::from(require("volume_path", &req.volume_path)?);
        let host = self.host.clone();
        let metrics = self.metrics.clone();
        let id = req.volume_id.clone();
        blocking(move || {
            let meta = std::fs::metadata(&path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    CsiError::NotFound(format!("volume_path: {} does not exist", path.display()))
                } else {
                    CsiError::io(format!("stat volume_path {}", path.display()), e)
                }
            })?;
            let abnormal = |message: String| NodeGetVolumeStatsResponse {
                usage: Vec::new(),
                volume_condition: Some(VolumeCondition {
                    abnormal: true,
                    message,
                }),
            };
            let Some(m) = host.mounted(&path)? else {
                return Ok(abnormal(format!("{} is not mounted", path.display())));
            };
            if m.source.starts_with("/dev/") && !Path::new(&m.source).exists() {
                return Ok(abnormal(format!("device {} is gone", m.source)));
            }
            if !meta.is_dir() {
                // Raw block: the bind-mounted device file.
                let total = mount::device_size(&path)
                    .map(|b| i64::try_from(b).unwrap_or(i64::MAX))
                    .map_err(|e| CsiError::Internal(e.chain()));
                return Ok(match total {
                    Ok(total) => NodeGetVolumeStatsResponse {
                        usage: vec![VolumeUsage {
                            available: 0,
                            total,
                            used: 0,
                            unit: volume_usage::Unit::Bytes as i32,
                        }],
                        volume_condition: Some(VolumeCondition {
                            abnormal: false,
                            message: "block device present".into(),
                        }),
                    },
                    Err(e) => abnormal(format!("cannot read the block device: {e}")),
                });
            }
            match mount::usage(&path) {
                Ok(u) => {
                    if let Some(mx) = &metrics {
                        mx.observe(&id, &u);
                    }
                    Ok(NodeGetVolumeStatsResponse {
                        usage: u,
                        volume_condition: Some(VolumeCondition {
                            abnormal: false,
                            message: "mounted".into(),
                        }),
                    })
                }
                Err(e) => Ok(abnormal(format!("statvfs {} failed: {e}", path.display()))),
            }
        })
        .await
    }

    pub(super) async fn expand(
        &self,
        req: &NodeExpandVolumeRequest,
    ) -> Result<NodeExpandVolumeResponse> {
        let id = require("volume_id", &req.volume_id)?;
        let path = PathBuf::from(require("volume_path", &req.volume_path)?);
        if crate::group::is_group_id(id) {
            let size = self.expand_group(req, id).await?;
            return Ok(NodeExpandVolumeResponse {
                capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
            });
        }
        let mut vol = self.find_volume(id).await?;
        if growing(&vol) {
            // The storage node removes the label once the LV/file has grown; wait for it,
            // bounded like NodeStageVolume's wait for readiness.
            let name = vol.name_any();
            permanent_failure(&vol)?;
            vol = match k8s::wait_for(
                self.volumes(),
                "AntstorVolume",
                &name,
                self.cfg.ready_timeout,
                |v: &AntstorVolume| !growing(v) || v.permanent_failure().is_some(),
            )
            .await?
            {
                Waited::Done(v) => {
                    permanent_failure(&v)?;
                    v
                }
                Waited::Gone => {
                    return Err(CsiError::NotFound(format!("volume {name} was deleted")));
                }
                Waited::TimedOut => {
                    return Err(CsiError::Pending(format!(
                        "volume {name} is still being grown by its storage node after {}s; retry",
                        self.cfg.ready_timeout.as_secs()
                    )));
                }
            };
        }
        let _g = self.inflight.claim(&format!("volume {id}"))?;
        let plan = attach_plan(&vol, &self.cfg.node_id)?;
        let host = self.host.clone();
        let block_cap = matches!(
            req.volume_capability
                .as_ref()
                .map(|c| params::check_capability("volume_capability", c)),
            Some(Ok(Access::Block))
        );
        let vid = id.to_string();
        let size = blocking(move || {
            if !path.exists() {
                return Err(CsiError::NotFound(format!(
                    "volume_path: {} does not exist",
                    path.display()
                )));
            }
            let dev = host.find_device(&plan)?.ok_or_else(|| {
                CsiError::FailedPrecondition(format!("volume {vid} is not attached on this node"))
            })?;
            if dev.starts_with("/dev/loop") || dev.to_string_lossy().starts_with("/dev/loop") {
                // The file grew: make the loop device see it.
                cmd::run_ok(
                    host.runner.as_ref(),
                    &argv(&["losetup", "-c", &dev.display().to_string()]),
                )?;
            }
            if !block_cap && path.is_dir() {
                let m = host.mounted(&path)?.ok_or_else(|| {
                    CsiError::NotFound(format!("volume_path: {} is not mounted", path.display()))
                })?;
                cmd::run_ok(
                    host.runner.as_ref(),
                    &mount::grow_argv(&m.fs_type, &dev, &path)?,
                )?;
            }
            mount::device_size(&dev)
        })
        .await?;
        info!(volume = id, size, "filesystem expanded");
        Ok(NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
        })
    }
}
