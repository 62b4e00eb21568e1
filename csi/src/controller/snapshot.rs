//! CreateSnapshot, DeleteSnapshot and ListSnapshots: one AntstorSnapshot per CSI snapshot,
//! cut by the storage node's agent. CreateSnapshot waits a little for the cut
//! ([`ControllerService::snapshot_outcome`]) and deletes a snapshot that failed for good.

use std::collections::{BTreeMap, HashMap};

use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use liteio_api::keys::{annotations, labels};
use liteio_api::meta::annotation;
use liteio_api::snapshot::SnapshotVolType;
use liteio_api::{AntstorSnapshot, AntstorSnapshotSpec, VolumeType};
use tracing::{info, warn};

use super::ControllerService;
use super::answer::{csi_snapshot, i64_of, snapshot_ready};
use super::checks;
use crate::csi::{
    CreateSnapshotRequest, DeleteSnapshotRequest, ListSnapshotsRequest, ListSnapshotsResponse,
    Snapshot, list_snapshots_response,
};
use crate::error::{CsiError, Result};
use crate::k8s::{self, Waited};
use crate::params;

impl ControllerService {
    pub(super) async fn create_snapshot_inner(
        &self,
        req: &CreateSnapshotRequest,
    ) -> Result<Snapshot> {
        let (csi_name, src) = checks::create_snapshot(req)?;
        let _guard = self.inflight.claim(&format!("snapshot {csi_name}"))?;
        let obj_name = params::object_name(csi_name);
        let name = obj_name.as_str();
        let api = self.snapshots();
        if let Some(s) = k8s::get_opt(&api, "AntstorSnapshot", name).await? {
            let origin = s.spec.origin_vol_name.clone();
            let vol = self.by_uuid.volume(&self.volumes(), src).await?;
            if vol.as_ref().map(ResourceExt::name_any) != Some(origin.clone()) {
                return Err(CsiError::AlreadyExists(format!(
                    "snapshot {name} exists for volume {origin}, not for volume {src}"
                )));
            }
            return self.snapshot_outcome(s, src).await;
        }
        let vol = self.find_volume(src).await?;
        let vname = vol.name_any();
        let Some(target) = vol.target_node().map(str::to_string) else {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {vname} is not scheduled yet; it cannot be snapshotted"
            )));
        };
        let reserve = annotation(&vol.metadata, annotations::SNAPSHOT_RESERVED_BYTES)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|v| *v > 0);
        // The controller accepts a snapshot only when its size fits the origin's reserve.
        let snap_size = reserve.unwrap_or(vol.spec.size_byte);
        let uuid = uuid::Uuid::new_v4().to_string();
        let s = AntstorSnapshot {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.cfg.namespace.clone()),
                labels: Some(BTreeMap::from([
                    (labels::SNAP_UUID.to_string(), uuid.clone()),
                    (labels::ORIGIN_VOLUME_NAME.to_string(), vname.clone()),
                    (
                        labels::ORIGIN_VOLUME_NAMESPACE.to_string(),
                        vol.namespace().unwrap_or_default(),
                    ),
                    (labels::TARGET_NODE_ID.to_string(), target.clone()),
                ])),
                annotations: (name != csi_name).then(|| {
                    BTreeMap::from([(params::ANNO_CSI_NAME.to_string(), csi_name.to_string())])
                }),
                ..ObjectMeta::default()
            },
            spec: AntstorSnapshotSpec {
                uuid,
                vol_type: match vol.spec.type_ {
                    Some(VolumeType::KernelLVol) => SnapshotVolType::KernelLVol,
                    _ => SnapshotVolType::SpdkLVol,
                },
                size: i64_of(snap_size),
                origin_vol_name: vname.clone(),
                origin_vol_namespace: vol.namespace().unwrap_or_default(),
                origin_vol_target_node_id: target,
                ..AntstorSnapshotSpec::default()
            },
            status: None,
        };
        let created = match api.create(&PostParams::default(), &s).await {
            Ok(c) => c,
            Err(kube::Error::Api(st)) if st.code == 409 => {
                return Err(CsiError::Busy(format!(
                    "snapshot {name} was created concurrently; retry"
                )));
            }
            Err(e) => return Err(CsiError::kube(format!("create AntstorSnapshot {name}"), e)),
        };
        info!(snapshot = name, volume = %vname, "AntstorSnapshot created");
        self.snapshot_outcome(created, src).await
    }

    /// The answer to CreateSnapshot for `s`: ready, or still being cut after a short wait
    /// ([`DriverConfig::snapshot_wait`]; `ready_to_use = false`, the CO polls again), or
    /// FAILED_PRECONDITION with the storage node's reason when it failed for good (the pool
    /// cannot take snapshots): then the AntstorSnapshot is deleted, so that nothing is left
    /// of a snapshot the CO never got an id for.
    async fn snapshot_outcome(&self, s: AntstorSnapshot, src: &str) -> Result<Snapshot> {
        let settled = |s: &AntstorSnapshot| snapshot_ready(s) || s.permanent_failure().is_some();
        let name = s.name_any();
        let s = if settled(&s) {
            s
        } else {
            match k8s::wait_for(
                self.snapshots(),
                "AntstorSnapshot",
                &name,
                self.cfg.snapshot_wait,
                settled,
            )
            .await?
            {
                Waited::Done(now) => now,
                Waited::Gone => {
                    return Err(CsiError::Busy(format!(
                        "snapshot {name} was deleted while it was being cut; retry"
                    )));
                }
                Waited::TimedOut => return Ok(csi_snapshot(&s, src)),
            }
        };
        let Some(msg) = s.permanent_failure() else {
            return Ok(csi_snapshot(&s, src));
        };
        let err = CsiError::FailedPrecondition(format!(
            "snapshot {name} of volume {} cannot be cut: {msg}",
            s.spec.origin_vol_name
        ));
        match self
            .snapshots()
            .delete(&name, &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(st)) if st.code == 404 => {}
            Err(e) => {
                warn!(snapshot = %name, error = %e, "cannot delete the failed AntstorSnapshot")
            }
        }
        Err(err)
    }

    pub(super) async fn delete_snapshot_inner(&self, req: &DeleteSnapshotRequest) -> Result<()> {
        let id = checks::snapshot_id(&req.snapshot_id)?;
        let _guard = self.inflight.claim(&format!("snapshot {id}"))?;
        let Some(s) = k8s::snapshot_by_uuid(&self.snapshots(), id).await? else {
            return Ok(());
        };
        let name = s.name_any();
        k8s::delete_opt(&self.snapshots(), "AntstorSnapshot", &name).await?;
        Ok(())
    }

    async fn uuid_by_volume_name(&self) -> Result<HashMap<String, String>> {
        let vols = self
            .volumes()
            .list(&ListParams::default())
            .await
            .map_err(|e| CsiError::kube("list AntstorVolume", e))?;
        Ok(vols
            .items
            .into_iter()
            .map(|v| (v.name_any(), v.spec.uuid))
            .collect())
    }

    pub(super) async fn list_snapshots_inner(
        &self,
        req: &ListSnapshotsRequest,
    ) -> Result<ListSnapshotsResponse> {
        let list = self
            .snapshots()
            .list(&ListParams::default())
            .await
            .map_err(|e| CsiError::kube("list AntstorSnapshot", e))?;
        let uuids = self.uuid_by_volume_name().await?;
        let mut snaps: Vec<Snapshot> = list
            .items
            .iter()
            .filter(|s| !s.spec.uuid.is_empty() && s.metadata.deletion_timestamp.is_none())
            .map(|s| {
                let src = uuids
                    .get(&s.spec.origin_vol_name)
                    .cloned()
                    .unwrap_or_default();
                csi_snapshot(s, &src)
            })
            .filter(|s| req.snapshot_id.is_empty() || s.snapshot_id == req.snapshot_id)
            .filter(|s| {
                req.source_volume_id.is_empty() || s.source_volume_id == req.source_volume_id
            })
            .collect();
        snaps.sort_by(|a, b| a.snapshot_id.cmp(&b.snapshot_id));
        let start = params::page_offset(&req.starting_token, snaps.len())?;
        let (start, end, next_token) = params::page(start, req.max_entries, snaps.len())?;
        Ok(ListSnapshotsResponse {
            entries: snaps[start..end]
                .iter()
                .map(|s| list_snapshots_response::Entry {
                    snapshot: Some(s.clone()),
                })
                .collect(),
            next_token,
        })
    }
}
