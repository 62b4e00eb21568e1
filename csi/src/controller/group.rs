//! The Controller service's half of multi-disk volumes (volume ids `dc-<uuid>`, see
//! [`crate::group`] for what such a volume is): CreateVolume makes the AntstorVolumeGroup
//! and the AntstorDataControl and waits until the node-disk-controller placed every member;
//! DeleteVolume deletes them (the controller deletes the members); ControllerExpandVolume
//! grows a KernelLVM group; ControllerPublishVolume makes the consuming node its host.
//! Requests reach these handlers checked ([`super::checks`]).

use std::collections::{BTreeMap, HashMap};

use kube::ResourceExt;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use liteio_api::keys::{self, labels};
use liteio_api::size;
use liteio_api::{AntstorDataControl, AntstorVolumeGroup, NodeInfo, PoolMode};
use tracing::{info, warn};

use super::ControllerService;
use crate::csi::Volume;
use crate::error::{CsiError, Result};
use crate::group::{
    GroupRequest, cannot_grow_replicated, cannot_grow_spdk, differences, objects, placement_outcome,
};
use crate::k8s::{self, Waited};

impl ControllerService {
    /// The data control of multi-disk volume `id` (`dc-<uuid>`).
    pub(crate) async fn data_control_by_id(&self, id: &str) -> Result<Option<AntstorDataControl>> {
        let lp = ListParams::default().labels(&format!("{}={id}", labels::VOL_UUID));
        let list = self
            .data_controls()
            .list(&lp)
            .await
            .map_err(|e| CsiError::kube(format!("list AntstorDataControls of {id}"), e))?;
        Ok(list.items.into_iter().find(|d| d.spec.uuid == id))
    }

    /// CreateVolume of a multi-disk volume: the group and the data control (created once,
    /// compared on a retry), then waits until the controller placed every member.
    pub(crate) async fn create_group(&self, name: &str, want: GroupRequest) -> Result<Volume> {
        let _guard = self.inflight.claim(&format!("volume {name}"))?;
        let dcs = self.data_controls();
        let groups = self.groups();
        let existing = k8s::get_opt(&dcs, "AntstorDataControl", name).await?;
        let dc = match existing {
            Some(dc) if dc.metadata.deletion_timestamp.is_some() => {
                return Err(CsiError::Busy(format!(
                    "multi-disk volume {name} (id {}) is still being deleted; a new one of that name is created once it is gone",
                    dc.spec.uuid
                )));
            }
            Some(dc) => {
                let g = k8s::get_opt(&groups, "AntstorVolumeGroup", name).await?;
                let diff = differences(&dc, g.as_ref(), &want);
                if !diff.is_empty() {
                    return Err(CsiError::AlreadyExists(format!(
                        "multi-disk volume {name} exists with other parameters: {}",
                        diff.join("; ")
                    )));
                }
                dc
            }
            None => {
                let uuid = uuid::Uuid::new_v4().to_string();
                let host = match &want.host {
                    Some(n) => self.node_info(n).await?,
                    None => NodeInfo::default(),
                };
                let (g, dc) = objects(name, &self.cfg.namespace, &uuid, &want, host);
                // The group first: a data control alone would wait for it, a group alone
                // is removed with its data control by DeleteVolume all the same.
                match groups.create(&PostParams::default(), &g).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => {
                        return Err(CsiError::kube(
                            format!("create AntstorVolumeGroup {name}"),
                            e,
                        ));
                    }
                }
                match dcs.create(&PostParams::default(), &dc).await {
                    Ok(created) => {
                        info!(volume = name, id = %created.spec.uuid, size = want.size, raid = ?want.params.raid, engine = ?want.params.engine, "multi-disk volume created");
                        created
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        return Err(CsiError::Busy(format!(
                            "multi-disk volume {name} was created concurrently; retry"
                        )));
                    }
                    Err(e) => {
                        return Err(CsiError::kube(
                            format!("create AntstorDataControl {name}"),
                            e,
                        ));
                    }
                }
            }
        };
        self.ensure_group_keys(&dc, &want.pv_name).await?;
        let g = k8s::get_opt(&groups, "AntstorVolumeGroup", name)
            .await?
            .ok_or_else(|| CsiError::Busy(format!("the volume group of {name} is gone; retry")))?;
        match placement_outcome(&g) {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(e),
            None => match k8s::wait_for(
                groups,
                "AntstorVolumeGroup",
                name,
                self.cfg.schedule_timeout,
                |g: &AntstorVolumeGroup| placement_outcome(g).is_some(),
            )
            .await?
            {
                Waited::Done(g) => {
                    if let Some(Err(e)) = placement_outcome(&g) {
                        return Err(e);
                    }
                }
                Waited::Gone => {
                    return Err(CsiError::Busy(format!(
                        "multi-disk volume {name} was deleted while being placed; retry"
                    )));
                }
                Waited::TimedOut => {
                    return Err(CsiError::Pending(format!(
                        "multi-disk volume {name} is not placed after {}s; the controller may still be working on it, retry",
                        self.cfg.schedule_timeout.as_secs()
                    )));
                }
            },
        }
        let mut ctx = crate::params::volume_context(&HashMap::new(), &dc.spec.uuid, "", &want.fs);
        if !want.mkfs_params.is_empty() {
            ctx.insert(keys::SC_PARAM_MKFS_PARAMS.into(), want.mkfs_params.clone());
        }
        Ok(Volume {
            capacity_bytes: dc.spec.total_size,
            volume_id: dc.spec.uuid.clone(),
            volume_context: ctx,
            content_source: None,
            accessible_topology: Vec::new(),
        })
    }

    /// The PV's authentication Secret (`liteio-auth-<pv>`), made now when missing and owned
    /// by the data control: every member's export, the assembled export and the host's
    /// NodeStageVolume use its keys.
    async fn ensure_group_keys(&self, dc: &AntstorDataControl, pv_name: &str) -> Result<()> {
        use kube::Resource as _;
        // The Secret as a volume of that PV would have it.
        let mut as_volume = liteio_api::AntstorVolume::new(&dc.name_any(), Default::default());
        as_volume.metadata.namespace = Some(self.cfg.namespace.clone());
        as_volume.metadata.labels = Some(BTreeMap::from([(
            labels::PV_NAME.to_string(),
            pv_name.to_string(),
        )]));
        as_volume.spec.uuid = dc.spec.uuid.clone();
        let owner = dc.controller_owner_ref(&()).map(|mut o| {
            o.controller = None;
            o.block_owner_deletion = None;
            o
        });
        self.ensure_keys_owned(&as_volume, owner).await
    }

    /// DeleteVolume of a multi-disk volume: the data control and its groups (the controller
    /// deletes the members once the assembly is gone). Idempotent.
    pub(crate) async fn delete_group(&self, id: &str) -> Result<()> {
        let _guard = self.inflight.claim(&format!("volume {id}"))?;
        let Some(dc) = self.data_control_by_id(id).await? else {
            return Ok(());
        };
        let name = dc.name_any();
        if k8s::delete_opt(&self.data_controls(), "AntstorDataControl", &name).await? {
            info!(volume = %name, id, "AntstorDataControl deletion requested");
        }
        // The keys go with it (owned by the data control, for the garbage collector; this
        // is for API servers without one).
        let pv = dc
            .labels()
            .get(labels::PV_NAME)
            .cloned()
            .unwrap_or_else(|| name.clone());
        let secret = liteio_api::naming::auth_secret(&pv);
        k8s::delete_opt(&self.secrets(), "Secret", &secret).await?;
        for g in &dc.spec.volume_groups {
            if k8s::delete_opt(&self.groups(), "AntstorVolumeGroup", &g.name).await? {
                info!(group = %g.name, "AntstorVolumeGroup deletion requested");
            }
        }
        Ok(())
    }

    /// ControllerExpandVolume of a multi-disk volume (KernelLVM): the group's `totalSize`
    /// raised, so that the controller places members for the difference as it placed the
    /// first ones (same share for a Symmetric group, new members on nodes holding none of
    /// it, the count range); waits until they are placed, then the data control's
    /// `totalSize`. Members that cannot be placed: the group's size is put back and the
    /// answer is OUT_OF_RANGE with the controller's reason. Growth only, idempotent: a size
    /// at or below the current one answers the current one. The host grows the LV over the
    /// new members at NodeExpandVolume.
    pub(crate) async fn expand_group(&self, id: &str, new_size: u64) -> Result<u64> {
        let _guard = self.inflight.claim(&format!("volume {id}"))?;
        let dc = self
            .data_control_by_id(id)
            .await?
            .ok_or_else(|| CsiError::NotFound(format!("volume {id} does not exist")))?;
        if dc.is_replicated() {
            return Err(cannot_grow_replicated(id));
        }
        if dc.spec.engine_type == PoolMode::SpdkLVStore {
            return Err(cannot_grow_spdk(id));
        }
        let name = dc.name_any();
        let current = u64::try_from(dc.spec.total_size).unwrap_or(0);
        let new_size = size::round_up(new_size, size::VOLUME_UNIT)
            .map_err(|e| CsiError::invalid("capacity_range", e.to_string()))?;
        if new_size <= current {
            return Ok(current);
        }
        let want = i64::try_from(new_size)
            .map_err(|_| CsiError::invalid("capacity_range", "is too large"))?;
        let groups = self.groups();
        let gname = dc
            .spec
            .volume_groups
            .first()
            .map_or_else(|| name.clone(), |g| g.name.clone());
        // The group first (the controller places members for it), guarded by its
        // resourceVersion: the controller writes the same object.
        let mut before = None;
        for attempt in 0..5 {
            let g = k8s::get_opt(&groups, "AntstorVolumeGroup", &gname)
                .await?
                .ok_or_else(|| {
                    CsiError::FailedPrecondition(format!(
                        "the volume group {gname} of multi-disk volume {id} does not exist"
                    ))
                })?;
            if g.spec.total_size >= want {
                break;
            }
            let body = serde_json::json!({
                "metadata": { "resourceVersion": g.metadata.resource_version },
                "spec": { "totalSize": want },
            });
            match groups
                .patch(&gname, &PatchParams::default(), &Patch::Merge(&body))
                .await
            {
                Ok(_) => {
                    before = Some(g.spec.total_size);
                    break;
                }
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < 4 => continue,
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    return Err(CsiError::Busy(format!(
                        "volume group {gname} kept changing while expanding; retry"
                    )));
                }
                Err(e) => {
                    return Err(CsiError::kube(
                        format!("patch AntstorVolumeGroup {gname}"),
                        e,
                    ));
                }
            }
        }
        let placed = match k8s::wait_for(
            groups.clone(),
            "AntstorVolumeGroup",
            &gname,
            self.cfg.schedule_timeout,
            move |g: &AntstorVolumeGroup| {
                g.spec.total_size < want || placement_outcome(g).is_some()
            },
        )
        .await?
        {
            Waited::Done(g) if g.spec.total_size < want => Err(CsiError::Busy(format!(
                "volume group {gname} was set back to {} while expanding; retry",
                g.spec.total_size
            ))),
            Waited::Done(g) => match placement_outcome(&g) {
                Some(Err(e)) => Err(CsiError::OutOfRange(format!(
                    "capacity_range: {}",
                    e.to_string()
                        .replace("cannot be placed", "cannot grow to the requested size")
                ))),
                _ => Ok(()),
            },
            Waited::Gone => Err(CsiError::NotFound(format!(
                "multi-disk volume {id} was deleted while expanding"
            ))),
            Waited::TimedOut => {
                return Err(CsiError::Pending(format!(
                    "the members of multi-disk volume {id} for {} are not placed after {}s; the controller may still be working on it, retry",
                    size::format_bytes(new_size),
                    self.cfg.schedule_timeout.as_secs()
                )));
            }
        };
        if let Err(e) = placed {
            // Nothing was placed (a plan is all or nothing): the group's size goes back, so
            // that the controller does not keep trying to grow a volume nobody asked for.
            if let Some(old) = before {
                self.set_back_group(&gname, want, old).await;
            }
            return Err(e);
        }
        // Then the data control: the volume's size, which a retry compares against.
        let body = serde_json::json!({ "spec": { "totalSize": want } });
        self.data_controls()
            .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map_err(|e| CsiError::kube(format!("patch AntstorDataControl {name}"), e))?;
        info!(volume = %name, id, from = current, to = new_size, "multi-disk volume expansion placed");
        Ok(new_size)
    }

    /// Puts a group's `totalSize` back from `want` to `old` after an expansion that could not
    /// be placed, unless something else changed it meanwhile (best effort, logged).
    async fn set_back_group(&self, gname: &str, want: i64, old: i64) {
        let groups = self.groups();
        for _ in 0..5 {
            let g = match k8s::get_opt(&groups, "AntstorVolumeGroup", gname).await {
                Ok(Some(g)) => g,
                Ok(None) => return,
                Err(e) => {
                    warn!(group = gname, error = %e.chain(), "cannot read the volume group to set its size back");
                    return;
                }
            };
            if g.spec.total_size != want || g.fully_placed() {
                return;
            }
            let body = serde_json::json!({
                "metadata": { "resourceVersion": g.metadata.resource_version },
                "spec": { "totalSize": old },
            });
            match groups
                .patch(gname, &PatchParams::default(), &Patch::Merge(&body))
                .await
            {
                Ok(_) => {
                    info!(
                        group = gname,
                        size = old,
                        "volume group size set back after an expansion that could not be placed"
                    );
                    return;
                }
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => {
                    warn!(group = gname, error = %e, "cannot set the volume group's size back");
                    return;
                }
            }
        }
    }

    /// ControllerPublishVolume of a multi-disk volume: `node` becomes its host (the
    /// controller then lets every member, or the assembled export, admit it).
    pub(crate) async fn publish_group(&self, id: &str, node: &str) -> Result<()> {
        let _guard = self.inflight.claim(&format!("volume {id}"))?;
        // Guarded by the resourceVersion; the controller writes the same object (status,
        // target node), so a conflict is read again and retried, as for volumes.
        for attempt in 0..5 {
            let dc = self
                .data_control_by_id(id)
                .await?
                .ok_or_else(|| CsiError::NotFound(format!("volume {id} does not exist")))?;
            if dc.spec.host_node.id == node {
                return Ok(());
            }
            let host = self.node_info(node).await?;
            let name = dc.name_any();
            let body = serde_json::json!({
                "metadata": { "resourceVersion": dc.metadata.resource_version },
                "spec": { "hostNode": host },
            });
            match self
                .data_controls()
                .patch(
                    &name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&body),
                )
                .await
            {
                Ok(_) => {
                    info!(volume = %name, id, node, "multi-disk volume published to its host");
                    return Ok(());
                }
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < 4 => continue,
                Err(e) => {
                    return Err(CsiError::kube(
                        format!("patch AntstorDataControl {name}"),
                        e,
                    ));
                }
            }
        }
        Err(CsiError::Busy(format!(
            "volume {id} changed under every attempt to publish it; retry"
        )))
    }
}
