//! The Node service's half of multi-disk volumes (volume ids `dc-<uuid>`, see
//! [`crate::group`] and `docs/multi-disk.md`).
//!
//! **NodeStageVolume** finds the AntstorDataControl by label `obnvmf/vol-uuid=<id>` and waits
//! (up to `ready_timeout`, then DEADLINE_EXCEEDED: retry) until it is ready; it must be
//! assembled for this node (`spec.hostNode`). Then, by engine:
//! - **KernelLVM**: every member AntstorVolume of its groups (`spec.volumes`, in order) is
//!   connected as a plain volume is (its `spec.spdkTarget`, the stage Secret's keys, which
//!   are the PV's and so every member's), then [`Host::assemble_lvm`] finds or makes the
//!   volume group over the member devices ([`crate::lvm`]: names, safety, stripe size) and
//!   activates it, and the LV is formatted and mounted as a plain volume's device is.
//! - **SpdkLVStore**: the assembled export (`status.spdkTarget`) is connected and mounted
//!   exactly as a plain remote volume.
//!
//! What was connected and assembled is recorded before anything is connected, in
//! [`RECORD_FILE`] inside the staging directory (read and written only while nothing is
//! mounted there), so that NodeUnstageVolume knows what to tear down even when the data
//! control is gone. A failed stage undoes what it did itself: the connections it made, a
//! volume group it created (with its new PVs), an activation; what existed before stays.
//!
//! **NodeUnstageVolume** unmounts, deactivates the volume group (`vgchange -an`; `dmsetup
//! remove` of the LV when LVM no longer sees its members), disconnects every member and
//! removes the record. When the data control is gone (the volume was deleted under its
//! mount), the members' controllers are deleted first, found from the LV's device-mapper
//! slaves, so that the unmount is not held for `ctrl-loss-tmo` by targets that will not
//! come back. Idempotent.
//!
//! This file holds what the data control says (ready, failed, its host, file system,
//! layout) and the service's calls; beside it: `group/record.rs` (the record of what was
//! staged), `group/assembly.rs` (the host's blocking work: connect, assemble, grow, tear
//! down), `group/tests.rs`. Both rooms import nothing of this file, which re-exports their
//! public items.

use std::path::PathBuf;

use kube::ResourceExt;
use kube::api::Api;
use liteio_api::auth::VolumeKeys;
use liteio_api::host_auth::{self, HostAuthDecision, HostAuthPolicy};
use liteio_api::keys::{self, annotations, labels};
use liteio_api::{AntstorDataControl, AntstorVolume, AntstorVolumeGroup, PoolMode, VolumeStatus};
use tracing::{info, warn};

use super::auth::stage_keys;
use super::host::{Attach, Host, attach_plan, check_host, publish_bind};
use super::{NodeService, blocking};
use crate::error::{CsiError, Result};
use crate::k8s::{self, Waited};
use crate::lvm::{self, Layout};
use crate::params::{self, Access};

mod assembly;
mod record;
#[cfg(test)]
mod tests;

pub use assembly::{Assembled, dm_device, dm_of, slave_nqns};
use assembly::{GroupExpand, GroupStage, MemberConnect};
pub use record::{RECORD_FILE, Staged, StagedMember};

/// Whether the data control is ready.
fn dc_ready(dc: &AntstorDataControl) -> bool {
    dc.status.as_ref().and_then(|s| s.status) == Some(VolumeStatus::Ready)
}

/// The controller's reason when the data control can never be assembled as it is
/// (`invalid data control: …`): waiting would not help.
fn dc_failure(dc: &AntstorDataControl) -> Option<String> {
    dc.status
        .as_ref()
        .map(|s| s.message.trim())
        .filter(|m| m.starts_with("invalid"))
        .map(str::to_string)
}

fn dc_failed(dc: &AntstorDataControl) -> Result<()> {
    match dc_failure(dc) {
        Some(msg) => Err(CsiError::FailedPrecondition(format!(
            "multi-disk volume {} cannot be assembled: {msg}",
            dc.name_any()
        ))),
        None => Ok(()),
    }
}

/// Whether `node` may stage the multi-disk volume: its members (KernelLVM) or its assembled
/// export (SpdkLVStore) admit only the host NQN of `spec.hostNode`.
pub fn check_dc_host(dc: &AntstorDataControl, node: &str) -> Result<()> {
    let host = dc.spec.host_node.id.as_str();
    if !host.is_empty() && host != node {
        return Err(CsiError::FailedPrecondition(format!(
            "multi-disk volume {} is assembled for node {host} (spec.hostNode), not for this node {node}: its exports admit only that node's host NQN (ControllerPublishVolume moves it)",
            dc.name_any()
        )));
    }
    Ok(())
}

/// The assembled export of an SpdkLVStore data control.
pub fn assembled_target(dc: &AntstorDataControl) -> Result<Attach> {
    let t = dc
        .status
        .as_ref()
        .and_then(|s| s.spdk_target.as_ref())
        .filter(|t| !t.subsys_nqn.is_empty())
        .ok_or_else(|| {
            CsiError::FailedPrecondition(format!(
                "multi-disk volume {} (SpdkLVStore) is ready but has no export (status.spdkTarget); the disk-agent of {} writes it when it has assembled the members",
                dc.name_any(),
                if dc.spec.target_node_id.is_empty() {
                    "its assembling node"
                } else {
                    dc.spec.target_node_id.as_str()
                }
            ))
        })?;
    Ok(Attach::Nvme(t.clone()))
}

/// The file system of a multi-disk volume: the request's, the StorageClass's (volume
/// context), the data control's (label or annotation `obnvmf/fs-type`), else the default.
pub fn group_fs(
    dc: &AntstorDataControl,
    access: &Access,
    ctx: &std::collections::HashMap<String, String>,
) -> String {
    if let Access::Mount { fs_type, .. } = access
        && !fs_type.is_empty()
    {
        return fs_type.clone();
    }
    ctx.get(keys::SC_PARAM_FS_TYPE)
        .filter(|s| !s.is_empty())
        .cloned()
        .or_else(|| {
            liteio_api::meta::label(&dc.metadata, labels::FS_TYPE)
                .or_else(|| liteio_api::meta::annotation(&dc.metadata, annotations::FS_TYPE))
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| params::DEFAULT_FS.to_string())
}

/// The mkfs arguments of a multi-disk volume: the volume context's, else the data
/// control's annotation.
pub fn group_mkfs(
    dc: &AntstorDataControl,
    ctx: &std::collections::HashMap<String, String>,
) -> String {
    ctx.get(keys::SC_PARAM_MKFS_PARAMS)
        .cloned()
        .or_else(|| {
            liteio_api::meta::annotation(&dc.metadata, keys::SC_PARAM_MKFS_PARAMS)
                .map(str::to_string)
        })
        .unwrap_or_default()
}

/// The LV layout of KernelLVM volume `dc`.
fn lvm_layout(dc: &AntstorDataControl) -> Result<Layout> {
    Layout::of(dc.spec.raid.level).ok_or_else(|| {
        CsiError::FailedPrecondition(format!(
            "multi-disk volume {}: spec.raid.level {:?} cannot be assembled (linear and raid0 can)",
            dc.name_any(),
            dc.spec.raid.level
        ))
    })
}

impl NodeService {
    fn data_controls(&self) -> Api<AntstorDataControl> {
        Api::namespaced(self.client.clone(), &self.cfg.namespace)
    }

    fn groups(&self) -> Api<AntstorVolumeGroup> {
        Api::namespaced(self.client.clone(), &self.cfg.namespace)
    }

    async fn find_data_control(&self, id: &str) -> Result<Option<AntstorDataControl>> {
        k8s::data_control_by_uuid(&self.data_controls(), id).await
    }

    /// The data control once ready; one the controller refused answers at once.
    async fn wait_data_control(&self, dc: AntstorDataControl) -> Result<AntstorDataControl> {
        if dc_ready(&dc) {
            return Ok(dc);
        }
        dc_failed(&dc)?;
        let name = dc.name_any();
        match k8s::wait_for(
            self.data_controls(),
            "AntstorDataControl",
            &name,
            self.cfg.ready_timeout,
            |d: &AntstorDataControl| dc_ready(d) || dc_failure(d).is_some(),
        )
        .await?
        {
            Waited::Done(d) => {
                dc_failed(&d)?;
                Ok(d)
            }
            Waited::Gone => Err(CsiError::NotFound(format!(
                "multi-disk volume {name} was deleted"
            ))),
            Waited::TimedOut => {
                let msg = dc
                    .status
                    .as_ref()
                    .map(|s| s.message.trim().to_string())
                    .filter(|m| !m.is_empty())
                    .map(|m| format!(" ({m})"))
                    .unwrap_or_default();
                Err(CsiError::Pending(format!(
                    "multi-disk volume {name} is not ready after {}s{msg}; retry",
                    self.cfg.ready_timeout.as_secs()
                )))
            }
        }
    }

    /// The member AntstorVolumes of the data control's groups, in the groups' order.
    async fn group_members(&self, dc: &AntstorDataControl) -> Result<Vec<AntstorVolume>> {
        let name = dc.name_any();
        let mut out = Vec::new();
        for gid in &dc.spec.volume_groups {
            let ns = if gid.namespace.is_empty() {
                self.cfg.namespace.clone()
            } else {
                gid.namespace.clone()
            };
            let groups: Api<AntstorVolumeGroup> = if ns == self.cfg.namespace {
                self.groups()
            } else {
                Api::namespaced(self.client.clone(), &ns)
            };
            let g = k8s::get_opt(&groups, "AntstorVolumeGroup", &gid.name)
                .await?
                .ok_or_else(|| {
                    CsiError::FailedPrecondition(format!(
                        "AntstorVolumeGroup {ns}/{} of multi-disk volume {name} does not exist",
                        gid.name
                    ))
                })?;
            let vols: Api<AntstorVolume> = Api::namespaced(self.client.clone(), &ns);
            for m in &g.spec.volumes {
                let v = k8s::get_opt(&vols, "AntstorVolume", &m.vol_id.name)
                    .await?
                    .ok_or_else(|| {
                        CsiError::Pending(format!(
                            "member {} of multi-disk volume {name} does not exist yet; retry",
                            m.vol_id.name
                        ))
                    })?;
                out.push(v);
            }
        }
        if out.is_empty() {
            return Err(CsiError::FailedPrecondition(format!(
                "multi-disk volume {name} has no member volumes (its groups' spec.volumes are empty)"
            )));
        }
        Ok(out)
    }

    /// The keys of the stage Secret for the data control's assembled export (SpdkLVStore):
    /// required, as every multi-disk volume's export is made with the PV's keys.
    fn assembled_keys(
        &self,
        dc: &AntstorDataControl,
        keys: VolumeKeys,
    ) -> Result<Option<VolumeKeys>> {
        let tls = keys.tls_psk.is_some();
        match host_auth::decide(HostAuthPolicy::Required, tls, Some(self.caps.dhchap)) {
            HostAuthDecision::Keys => Ok(Some(keys)),
            HostAuthDecision::NqnOnly => Ok(None),
            HostAuthDecision::Refuse => {
                let why = self.caps.auth_refusal().unwrap_or_else(|| {
                    format!(
                        "this node's kernel {} cannot do what the volume needs",
                        self.caps.kernel
                    )
                });
                Err(CsiError::FailedPrecondition(host_auth::refusal(
                    &dc.name_any(),
                    HostAuthPolicy::Required,
                    tls,
                    &why,
                )))
            }
        }
    }

    /// What the API says a stage of `dc` on this node connects: for unstaging without a
    /// record, and for the key refresh at publish.
    async fn expected(&self, dc: &AntstorDataControl) -> Result<Staged> {
        let id = dc.spec.uuid.clone();
        let name = dc.name_any();
        match dc.spec.engine_type {
            PoolMode::SpdkLVStore => Ok(Staged {
                id,
                engine: PoolMode::SpdkLVStore,
                vg: String::new(),
                lv: String::new(),
                members: assembled_target(dc)
                    .map(|p| vec![StagedMember::of(&name, &p)])
                    .unwrap_or_default(),
                data_control: name,
            }),
            PoolMode::KernelLVM => {
                let n = lvm::names(&name, &id);
                let mut members = Vec::new();
                for m in self.group_members(dc).await? {
                    if let Ok(plan) = attach_plan(&m, &self.cfg.node_id) {
                        members.push(StagedMember::of(&m.name_any(), &plan));
                    }
                }
                Ok(Staged {
                    id,
                    data_control: name,
                    engine: PoolMode::KernelLVM,
                    vg: n.vg,
                    lv: n.lv,
                    members,
                })
            }
        }
    }

    /// The members of KernelLVM volume `dc` to connect on this node, in order: each ready,
    /// admitting this node, exported here, with `keys` where the member's export needs them.
    async fn lvm_members(
        &self,
        dc: &AntstorDataControl,
        keys: Option<VolumeKeys>,
    ) -> Result<Vec<MemberConnect>> {
        let node = self.cfg.node_id.clone();
        let mut members = Vec::new();
        for m in self.group_members(dc).await? {
            let m = self.wait_ready(m).await?;
            check_host(&m, &node)?;
            let plan = attach_plan(&m, &node)?;
            let (m, keys) = match &plan {
                Attach::Nvme(_) => {
                    let m = self.wait_exported_here(m).await?;
                    match keys.clone() {
                        Some(k) => self.host_auth(m, k).await?,
                        None => (m, None),
                    }
                }
                Attach::Local(_) => (m, None),
            };
            members.push(MemberConnect {
                volume: m.name_any(),
                plan,
                keys,
            });
        }
        Ok(members)
    }

    /// NodeExpandVolume of a multi-disk volume: KernelLVM volumes grow on the host over the
    /// members ControllerExpandVolume added ([`Host::expand_group`]); an SpdkLVStore volume
    /// cannot grow (its ControllerExpandVolume refuses first). Returns the new size.
    pub(super) async fn expand_group(
        &self,
        req: &crate::csi::NodeExpandVolumeRequest,
        id: &str,
    ) -> Result<u64> {
        let dc = self
            .find_data_control(id)
            .await?
            .ok_or_else(|| CsiError::NotFound(format!("volume {id} does not exist")))?;
        if dc.is_replicated() {
            return Err(crate::group::cannot_grow_replicated(id));
        }
        if dc.spec.engine_type == PoolMode::SpdkLVStore {
            return Err(crate::group::cannot_grow_spdk(id));
        }
        if req.staging_target_path.is_empty() {
            return Err(CsiError::invalid(
                "staging_target_path",
                "is required for a multi-disk volume: its logical volume is grown where it is staged",
            ));
        }
        let staging = PathBuf::from(&req.staging_target_path);
        let layout = lvm_layout(&dc)?;
        let _g = self.inflight.claim(&format!("volume {id}"))?;
        let dc = self.wait_data_control(dc).await?;
        check_dc_host(&dc, &self.cfg.node_id)?;
        let keys = crate::node::auth::request_keys(&req.secrets, "node-expand")?;
        let members = self.lvm_members(&dc, keys).await?;
        let block = matches!(
            req.volume_capability
                .as_ref()
                .map(|c| params::check_capability("volume_capability", c)),
            Some(Ok(Access::Block))
        );
        let name = dc.name_any();
        let g = GroupExpand {
            lvm: (lvm::names(&name, id), layout),
            data_control: name,
            members,
            staging,
            block,
        };
        let host = self.host.clone();
        blocking(move || host.expand_group(&g)).await
    }

    /// NodeStageVolume of a multi-disk volume (see the module documentation).
    pub(super) async fn stage_group(
        &self,
        req: &crate::csi::NodeStageVolumeRequest,
        id: &str,
        staging: PathBuf,
        access: Access,
    ) -> Result<()> {
        let dc = self
            .find_data_control(id)
            .await?
            .ok_or_else(|| CsiError::NotFound(format!("volume {id} does not exist")))?;
        let dc = self.wait_data_control(dc).await?;
        let node = self.cfg.node_id.clone();
        check_dc_host(&dc, &node)?;
        let name = dc.name_any();
        let fs = group_fs(&dc, &access, &req.volume_context);
        let mkfs = group_mkfs(&dc, &req.volume_context);
        let keys = stage_keys(&req.secrets)?;
        let (members, lvm) = match dc.spec.engine_type {
            PoolMode::SpdkLVStore => {
                let plan = assembled_target(&dc)?;
                let keys = match keys {
                    Some(k) => self.assembled_keys(&dc, k)?,
                    None => None,
                };
                (
                    vec![MemberConnect {
                        volume: name.clone(),
                        plan,
                        keys,
                    }],
                    None,
                )
            }
            PoolMode::KernelLVM => {
                let layout = lvm_layout(&dc)?;
                let members = self.lvm_members(&dc, keys).await?;
                (members, Some((lvm::names(&name, id), layout)))
            }
        };
        let record = Staged {
            id: id.to_string(),
            data_control: name.clone(),
            engine: dc.spec.engine_type,
            vg: lvm.as_ref().map(|(n, _)| n.vg.clone()).unwrap_or_default(),
            lv: lvm.as_ref().map(|(n, _)| n.lv.clone()).unwrap_or_default(),
            members: members
                .iter()
                .map(|m| StagedMember::of(&m.volume, &m.plan))
                .collect(),
        };
        let g = GroupStage {
            record,
            lvm,
            members,
            staging,
            access,
            fs,
            mkfs,
            total_size: u64::try_from(dc.spec.total_size).unwrap_or(0),
        };
        let host = self.host.clone();
        blocking(move || host.stage_group(&g)).await
    }

    /// NodeUnstageVolume of a multi-disk volume (see the module documentation).
    pub(super) async fn unstage_group(&self, id: &str, staging: PathBuf) -> Result<()> {
        let dc = self.find_data_control(id).await?;
        let known = match &dc {
            Some(dc) => match self.expected(dc).await {
                Ok(s) => Some(s),
                Err(e) => {
                    warn!(volume = id, error = %e.chain(), "cannot tell the members of the multi-disk volume from the API; relying on the stage record");
                    None
                }
            },
            None => None,
        };
        let gone = dc.is_none();
        let host = self.host.clone();
        blocking(move || host.unstage_group(&staging, known, gone)).await
    }

    /// NodePublishVolume's source for a multi-disk volume: the staging mount, or for raw
    /// block the LV's (or assembled export's) device. Gives the keys of the node-publish
    /// Secret to every member's controller when they changed (see
    /// [`NodeService::refresh_keys`]).
    pub(super) async fn publish_group(
        &self,
        req: &crate::csi::NodePublishVolumeRequest,
        id: &str,
        target: PathBuf,
        staging: PathBuf,
        access: Access,
    ) -> Result<()> {
        let dc = self
            .find_data_control(id)
            .await?
            .ok_or_else(|| CsiError::NotFound(format!("volume {id} does not exist")))?;
        // What the API says this host connected (for the key refresh and, without a
        // record, the device): a failure to tell is a warning, not a failed publish.
        let expected = match self.expected(&dc).await {
            Ok(s) => s,
            Err(e) => {
                warn!(volume = %dc.name_any(), error = %e.chain(), "cannot tell the members of the multi-disk volume; their keys are not refreshed at this publish");
                let n = lvm::names(&dc.name_any(), id);
                Staged {
                    id: id.to_string(),
                    data_control: dc.name_any(),
                    engine: dc.spec.engine_type,
                    vg: n.vg,
                    lv: n.lv,
                    members: Vec::new(),
                }
            }
        };
        let holder = {
            let mut v = AntstorVolume::new(&dc.name_any(), Default::default());
            v.metadata.labels = dc.metadata.labels.clone();
            v
        };
        for m in &expected.members {
            if let Some(plan) = m.plan() {
                self.refresh_keys(&holder, &plan, req).await;
            }
        }
        let host = self.host.clone();
        let readonly = req.readonly;
        let t = target.clone();
        blocking(move || {
            let st = staging.clone();
            publish_bind(
                &host,
                access,
                &staging,
                &t,
                readonly,
                |h: &Host| match Staged::read(&st)? {
                    Some(s) => h.group_device(&s),
                    None => h.group_device(&expected),
                },
            )
        })
        .await?;
        info!(volume = %dc.name_any(), target = %target.display(), readonly = req.readonly, "multi-disk volume published");
        if let Some(m) = &self.metrics {
            m.register(id, &holder, &target);
        }
        Ok(())
    }
}
