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

use std::path::{Path, PathBuf};

use kube::ResourceExt;
use kube::api::Api;
use liteio_api::auth::VolumeKeys;
use liteio_api::host_auth::{self, HostAuthDecision, HostAuthPolicy};
use liteio_api::keys::{self, annotations, labels};
use liteio_api::{
    AntstorDataControl, AntstorVolume, AntstorVolumeGroup, PoolMode, SpdkTarget, VolumeStatus,
};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::{
    Attach, Host, NodeService, attach_plan, blocking, check_host, publish_bind, stage_keys,
};
use crate::cmd;
use crate::error::{CsiError, Result};
use crate::k8s::{self, Waited};
use crate::lvm::{self, Layout, MemberDevice, Names, VgPlan};
use crate::mount;
use crate::nvme;
use crate::params::{self, Access};

/// The record of a staged multi-disk volume, in its staging directory.
pub const RECORD_FILE: &str = ".liteio-multi-disk.json";

/// One member (or, for SpdkLVStore, the assembled export) as staged.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct StagedMember {
    /// The member AntstorVolume (the data control for SpdkLVStore).
    pub volume: String,
    /// Its NVMe-oF export, when connected over NVMe/TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvme: Option<SpdkTarget>,
    /// Its local device or file, when it is on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<PathBuf>,
}

impl StagedMember {
    fn of(volume: &str, plan: &Attach) -> Self {
        match plan {
            Attach::Nvme(t) => StagedMember {
                volume: volume.to_string(),
                nvme: Some(t.clone()),
                local: None,
            },
            Attach::Local(p) => StagedMember {
                volume: volume.to_string(),
                nvme: None,
                local: Some(p.clone()),
            },
        }
    }

    /// How it was attached.
    pub fn plan(&self) -> Option<Attach> {
        match (&self.nvme, &self.local) {
            (Some(t), _) => Some(Attach::Nvme(t.clone())),
            (None, Some(p)) => Some(Attach::Local(p.clone())),
            (None, None) => None,
        }
    }
}

/// What NodeStageVolume of a multi-disk volume connected and assembled. Holds no secret.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    /// Volume id (`dc-<uuid>`).
    pub id: String,
    /// The data control.
    pub data_control: String,
    /// Where the members are put together.
    pub engine: PoolMode,
    /// KernelLVM: the volume group.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vg: String,
    /// KernelLVM: the logical volume.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub lv: String,
    /// What was connected, in member order.
    pub members: Vec<StagedMember>,
}

impl Staged {
    /// The LVM names, for KernelLVM.
    pub fn names(&self) -> Option<Names> {
        (self.engine == PoolMode::KernelLVM && !self.vg.is_empty()).then(|| Names {
            vg: self.vg.clone(),
            lv: self.lv.clone(),
            tag: format!("{}{}", lvm::TAG_PREFIX, self.id),
        })
    }

    fn path(staging: &Path) -> PathBuf {
        staging.join(RECORD_FILE)
    }

    /// The record in `staging`, `None` when there is none. Only meaningful while nothing is
    /// mounted at `staging` (a mount hides it).
    pub fn read(staging: &Path) -> Result<Option<Self>> {
        let p = Self::path(staging);
        match std::fs::read_to_string(&p) {
            Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| {
                CsiError::Internal(format!(
                    "{}: not a record of a staged multi-disk volume: {e}",
                    p.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(CsiError::io(format!("read {}", p.display()), e)),
        }
    }

    /// Writes the record into `staging` (created), atomically.
    pub fn write(&self, staging: &Path) -> Result<()> {
        std::fs::create_dir_all(staging).map_err(|e| {
            CsiError::io(
                format!("create staging_target_path {}", staging.display()),
                e,
            )
        })?;
        let p = Self::path(staging);
        let tmp = staging.join(format!("{RECORD_FILE}.tmp"));
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| CsiError::Internal(format!("serialize the stage record: {e}")))?;
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &p))
            .map_err(|e| CsiError::io(format!("write {}", p.display()), e))
    }

    /// Removes the record from `staging` (kubelet removes the directory after
    /// NodeUnstageVolume, which fails while a file is left in it). Idempotent.
    pub fn remove(staging: &Path) -> Result<()> {
        let p = Self::path(staging);
        match std::fs::remove_file(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(CsiError::io(format!("remove {}", p.display()), e)),
        }
    }
}

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

/// One member to connect.
#[derive(Debug, Clone)]
struct MemberConnect {
    volume: String,
    plan: Attach,
    keys: Option<VolumeKeys>,
}

/// Everything the blocking part of NodeStageVolume needs.
#[derive(Debug, Clone)]
struct GroupStage {
    record: Staged,
    /// KernelLVM: names and layout; `None`: the one member is the device.
    lvm: Option<(Names, Layout)>,
    members: Vec<MemberConnect>,
    staging: PathBuf,
    access: Access,
    fs: String,
    mkfs: String,
    total_size: u64,
}

/// Everything the blocking part of NodeExpandVolume needs.
#[derive(Debug, Clone)]
struct GroupExpand {
    data_control: String,
    lvm: (Names, Layout),
    members: Vec<MemberConnect>,
    staging: PathBuf,
    /// Raw block: no file system to grow.
    block: bool,
}

/// What [`Host::assemble_lvm`] did, for undoing it when a later step fails.
#[derive(Debug, Clone)]
pub struct Assembled {
    /// The LV's device.
    pub device: PathBuf,
    names: Names,
    devs: Vec<String>,
    /// PVs made by this call (removed again with the VG it made).
    created_pvs: Vec<String>,
    /// This call made the VG.
    created_vg: bool,
    /// This call activated it.
    activated: bool,
}

/// The name of the device-mapper device `dm_name` in sysfs (`dm-3`), when it exists.
pub fn dm_device(sysfs: &Path, dm_name: &str) -> Option<String> {
    let dir = std::fs::read_dir(sysfs.join("block")).ok()?;
    dir.filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("dm-"))
        .find(|n| {
            std::fs::read_to_string(sysfs.join("block").join(n).join("dm/name"))
                .is_ok_and(|s| s.trim() == dm_name)
        })
}

/// The device-mapper device (`dm-3`) a mount source is: `/dev/dm-3`, or a name LVM made
/// without udev (`/dev/mapper/<vg>-<lv>` is then a device node of its own, and
/// `/dev/<vg>/<lv>` a link to it), found by its device-mapper name.
pub fn dm_of(sysfs: &Path, source: &Path) -> Option<String> {
    let real = std::fs::canonicalize(source).ok()?;
    let name = real.file_name()?.to_string_lossy().into_owned();
    if name.starts_with("dm-") {
        return Some(name);
    }
    dm_device(sysfs, &name)
}

/// The subsystem NQNs of the NVMe namespaces under device-mapper device `dm` (`dm-3`):
/// `<sysfs>/block/dm-3/slaves/nvmeXnY`, whose `device/subsysnqn` names the subsystem
/// (the controller's, or the multipath subsystem's).
pub fn slave_nqns(sysfs: &Path, dm: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(sysfs.join("block").join(dm).join("slaves")) else {
        return Vec::new();
    };
    let mut out: Vec<String> = dir
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("nvme"))
        .filter_map(|n| {
            std::fs::read_to_string(sysfs.join("block").join(&n).join("device/subsysnqn"))
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

impl Host {
    fn run_lvm(&self, argv: &[String]) -> Result<cmd::Output> {
        cmd::run_ok(self.runner.as_ref(), argv)
    }

    /// What `blkid -p` finds on `dev` ([`lvm::parse_signature`]).
    fn signature(&self, dev: &str) -> Result<Option<String>> {
        let argv = lvm::signature_argv(dev);
        let out = cmd::run(self.runner.as_ref(), &argv)?;
        match out.code {
            Some(0) => Ok(lvm::parse_signature(&out.stdout)),
            Some(2) => Ok(None),
            _ => Err(CsiError::Command {
                command: cmd::argv_line(&argv),
                status: out.status(),
                stderr: out.stderr.trim().to_string(),
            }),
        }
    }

    /// Whether this host's LVM can make a VG that only the CSI node activates
    /// ([`lvm::vgcreate_argv`]); asked once (`lvm version`), no on any failure.
    fn manual_activation(&self) -> bool {
        let v = self.lvm_version.get_or_init(|| {
            let v = cmd::run_ok(self.runner.as_ref(), &lvm::version_argv())
                .ok()
                .and_then(|o| lvm::parse_version(&o.stdout));
            info!(version = ?v, "this host's LVM");
            v
        });
        v.is_some_and(|v| v >= lvm::SETAUTOACTIVATION_SINCE)
    }

    fn lvs(&self, devs: &[String], vg: &str) -> Result<Vec<lvm::Lv>> {
        lvm::parse_lvs(&self.run_lvm(&lvm::lvs_argv(devs, vg)?)?.stdout)
    }

    /// Free extents of the members' PVs in VG `vg`, in member order.
    fn free_extents(&self, devs: &[String], vg: &str) -> Result<Vec<u64>> {
        let pvs = lvm::parse_pvs(&self.run_lvm(&lvm::pvs_argv(devs)?)?.stdout)?;
        devs.iter()
            .map(|d| {
                pvs.iter()
                    .find(|p| &p.name == d && p.vg == vg)
                    .map(|p| p.pe_count.saturating_sub(p.pe_alloc_count))
                    .ok_or_else(|| {
                        CsiError::Internal(format!(
                            "{d} is not a physical volume of {vg} after it was added to it"
                        ))
                    })
            })
            .collect()
    }

    /// Creates the LV over every member and checks its layout; returns its device.
    fn create_lv(&self, n: &Names, layout: Layout, devs: &[String]) -> Result<()> {
        let pe = self.free_extents(devs, &n.vg)?;
        let extents = lvm::extents(layout, &pe)?;
        self.run_lvm(&lvm::lvcreate_argv(devs, n, layout, extents)?)?;
        info!(vg = %n.vg, lv = %n.lv, extents, members = devs.len(), layout = ?layout, "logical volume created over the members");
        Ok(())
    }

    /// Adds members of an expanded volume to its VG: `pvcreate` of the blank ones, then
    /// `vgextend` by all of them. PVs made here are removed again when the `vgextend` fails;
    /// once it succeeded the members are the VG's (a later failure is continued by the
    /// next attempt, never undone: the VG is then exactly the members).
    fn extend_vg(
        &self,
        n: &Names,
        devs: &[String],
        pvcreate: &[String],
        add: &[String],
    ) -> Result<()> {
        if !pvcreate.is_empty() {
            self.run_lvm(&lvm::pvcreate_argv(devs, pvcreate)?)?;
        }
        if let Err(e) = self.run_lvm(&lvm::vgextend_argv(devs, &n.vg, add)?) {
            if !pvcreate.is_empty()
                && let Err(u) = lvm::pvremove_argv(devs, pvcreate).and_then(|a| self.run_lvm(&a))
            {
                warn!(vg = %n.vg, error = %u.chain(), "cannot remove the physical volumes made for a failed vgextend");
            }
            return Err(e);
        }
        info!(vg = %n.vg, added = %add.join(","), "volume group extended by the members added to the volume");
        Ok(())
    }

    /// Extends the LV over the members it does not use yet ([`lvm::plan_grow`]); whether it
    /// did.
    fn grow_lv(&self, n: &Names, layout: Layout, devs: &[String]) -> Result<bool> {
        let pvs = lvm::parse_pvs(&self.run_lvm(&lvm::pvs_argv(devs)?)?.stdout)?;
        let Some(grow) = lvm::plan_grow(layout, &n.vg, devs, &pvs) else {
            return Ok(false);
        };
        self.run_lvm(&lvm::lvextend_argv(devs, n, &grow)?)?;
        info!(vg = %n.vg, lv = %n.lv, extents = grow.extents, stripes = ?grow.stripes, on = %grow.on.join(","), "logical volume extended over the members added to the volume");
        Ok(true)
    }

    /// The LV's device once it is active, after checking its layout.
    fn lv_device(&self, n: &Names, layout: Layout, devs: &[String]) -> Result<(PathBuf, u64)> {
        let lvs = self.lvs(devs, &n.vg)?;
        lvm::check_layout(n, layout, devs.len(), &lvs)?;
        let lv = lvs.iter().find(|l| l.name == n.lv).ok_or_else(|| {
            CsiError::Internal(format!("logical volume {}/{} vanished", n.vg, n.lv))
        })?;
        let dev = [lv.dm_path.clone(), lv.path.clone(), n.lv_path()]
            .into_iter()
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .find(|p| p.exists())
            .ok_or_else(|| {
                CsiError::Pending(format!(
                    "logical volume {}/{} is active but neither {} nor {} exists; retry",
                    n.vg,
                    n.lv,
                    lv.dm_path,
                    n.lv_path()
                ))
            })?;
        Ok((dev, lv.size))
    }

    /// Finds or makes the volume group of a multi-disk volume over its member devices
    /// (`members`: member volume and device, in member order) and activates its LV (see
    /// [`lvm::plan_vg`] for what is refused). On failure, what this call created or
    /// activated is undone.
    pub fn assemble_lvm(
        &self,
        n: &Names,
        layout: Layout,
        members: &[(String, PathBuf)],
    ) -> Result<Assembled> {
        let devs: Vec<String> = members
            .iter()
            .map(|(_, d)| d.display().to_string())
            .collect();
        let pvs = lvm::parse_pvs(&self.run_lvm(&lvm::pvs_argv(&devs)?)?.stdout)?;
        let vgs = lvm::parse_vgs(&self.run_lvm(&lvm::vgs_argv(&devs)?)?.stdout)?;
        let mut found = Vec::new();
        for ((volume, _), dev) in members.iter().zip(&devs) {
            found.push(MemberDevice {
                volume: volume.clone(),
                dev: dev.clone(),
                signature: self.signature(dev)?,
            });
        }
        let mut a = Assembled {
            device: PathBuf::new(),
            names: n.clone(),
            devs: devs.clone(),
            created_pvs: Vec::new(),
            created_vg: false,
            activated: false,
        };
        let built = match lvm::plan_vg(n, &found, &pvs, &vgs)? {
            VgPlan::Create { pvcreate } => {
                if !pvcreate.is_empty() {
                    a.created_pvs = pvcreate.clone();
                    if let Err(e) = self.run_lvm(&lvm::pvcreate_argv(&devs, &pvcreate)?) {
                        self.undo_assembly(&a);
                        return Err(e);
                    }
                }
                let manual = self.manual_activation();
                if let Err(e) = self.run_lvm(&lvm::vgcreate_argv(&devs, n, manual)?) {
                    self.undo_assembly(&a);
                    return Err(e);
                }
                a.created_vg = true;
                info!(vg = %n.vg, devices = %devs.join(","), "volume group created over the members");
                self.create_lv(n, layout, &devs)
            }
            plan @ (VgPlan::Existing | VgPlan::Extend { .. }) => (|| {
                if let VgPlan::Extend { pvcreate, add } = &plan {
                    self.extend_vg(n, &devs, pvcreate, add)?;
                }
                let mut lvs = self.lvs(&devs, &n.vg)?;
                if lvm::plan_lv(n, &lvs)? {
                    self.create_lv(n, layout, &devs)?;
                    // lvcreate activates it: a failure from here deactivates it again.
                    a.activated = true;
                    lvs = self.lvs(&devs, &n.vg)?;
                } else if self.grow_lv(n, layout, &devs)? {
                    lvs = self.lvs(&devs, &n.vg)?;
                }
                if !lvs.iter().any(|l| l.name == n.lv && l.active()) {
                    self.run_lvm(&lvm::vgchange_argv(&devs, &n.vg, true)?)?;
                    a.activated = true;
                    info!(vg = %n.vg, "volume group activated");
                }
                Ok(())
            })(),
        };
        let device = built.and_then(|()| self.lv_device(n, layout, &devs));
        match device {
            Ok((dev, size)) => {
                a.device = dev;
                info!(vg = %n.vg, lv = %n.lv, device = %a.device.display(), bytes = size, "multi-disk volume assembled");
                Ok(a)
            }
            Err(e) => {
                self.undo_assembly(&a);
                Err(e)
            }
        }
    }

    /// Undoes what [`Host::assemble_lvm`] did (best effort, logged): removes a VG it made
    /// and the PVs it made for it, or deactivates a VG it activated.
    pub fn undo_assembly(&self, a: &Assembled) {
        let n = &a.names;
        let mut steps: Vec<Vec<String>> = Vec::new();
        if a.created_vg {
            if let Ok(argv) = lvm::vgremove_argv(&a.devs, &n.vg) {
                steps.push(argv);
            }
        } else if a.activated
            && let Ok(argv) = lvm::vgchange_argv(&a.devs, &n.vg, false)
        {
            steps.push(argv);
        }
        if !a.created_pvs.is_empty()
            && let Ok(argv) = lvm::pvremove_argv(&a.devs, &a.created_pvs)
        {
            steps.push(argv);
        }
        for argv in steps {
            match self.run_lvm(&argv) {
                Ok(_) => {
                    info!(vg = %n.vg, command = %argv[0], "undid the assembly of a failed stage")
                }
                Err(e) => {
                    warn!(vg = %n.vg, error = %e, "cannot undo the assembly of a failed stage")
                }
            }
        }
    }

    /// Deactivates the multi-disk volume's LV: `vgchange -an` over the member devices still
    /// present, and `dmsetup remove` of its device when LVM cannot (its members are gone).
    /// Nothing to do when the LV is not active. An LV still open (mounted elsewhere) is an
    /// error, and the members stay connected.
    pub fn deactivate_lvm(&self, n: &Names, members: &[StagedMember]) -> Result<()> {
        let dm = n.dm_name();
        if dm_device(&self.cfg.sysfs_root, &dm).is_none() {
            return Ok(());
        }
        let mut devs = Vec::new();
        for m in members {
            if let Some(plan) = m.plan()
                && let Some(d) = self.find_device(&plan)?
            {
                devs.push(d.display().to_string());
            }
        }
        let mut failure = None;
        if !devs.is_empty() {
            match self.run_lvm(&lvm::vgchange_argv(&devs, &n.vg, false)?) {
                Ok(_) => {}
                Err(e) => failure = Some(e),
            }
        }
        if dm_device(&self.cfg.sysfs_root, &dm).is_some() {
            if let Err(e) = self.run_lvm(&lvm::dmsetup_remove_argv(&dm)) {
                return Err(failure.unwrap_or(e));
            }
            info!(device = %dm, "logical volume's device removed (LVM no longer sees its members)");
        } else {
            info!(vg = %n.vg, "volume group deactivated");
        }
        Ok(())
    }

    /// The blocking part of NodeStageVolume of a multi-disk volume (see the module
    /// documentation); undoes its own work when it fails.
    fn stage_group(&self, g: &GroupStage) -> Result<()> {
        if self.mounted(&g.staging)?.is_some() {
            // Staged already (a retry after a lost answer): the record is under the mount.
            return Ok(());
        }
        let had_record = Staged::read(&g.staging)?.is_some();
        g.record.write(&g.staging)?;
        let mut connected = Vec::new();
        let out = self.stage_group_steps(g, &mut connected);
        if out.is_err() {
            for plan in connected.iter().rev() {
                if let Err(e) = self.detach(plan) {
                    warn!(volume = %g.record.data_control, error = %e, "cannot disconnect a member after a failed stage");
                }
            }
            if !had_record && let Err(e) = Staged::remove(&g.staging) {
                warn!(volume = %g.record.data_control, error = %e, "cannot remove the stage record after a failed stage");
            }
        }
        out
    }

    fn stage_group_steps(&self, g: &GroupStage, connected: &mut Vec<Attach>) -> Result<()> {
        let name = &g.record.data_control;
        let mut devices = Vec::new();
        for m in &g.members {
            let before = self.find_device(&m.plan)?;
            let dev = self.attach(&m.plan, m.keys.as_ref())?;
            if before.is_none() {
                connected.push(m.plan.clone());
            }
            devices.push((m.volume.clone(), dev));
        }
        let assembled = match &g.lvm {
            Some((n, layout)) => Some(self.assemble_lvm(n, *layout, &devices)?),
            None => None,
        };
        let dev = match (&assembled, devices.first()) {
            (Some(a), _) => a.device.clone(),
            (None, Some((_, d))) => d.clone(),
            (None, None) => {
                return Err(CsiError::Internal(format!(
                    "multi-disk volume {name} has nothing to stage"
                )));
            }
        };
        if assembled.is_some() {
            let size = mount::device_size(&dev).unwrap_or(0);
            if size < g.total_size {
                warn!(volume = %name, device = %dev.display(), bytes = size, requested = g.total_size, "the assembled volume is smaller than requested");
            }
        }
        let Access::Mount { flags, .. } = &g.access else {
            info!(volume = %name, device = %dev.display(), "multi-disk volume staged for block access");
            return Ok(());
        };
        let opts = mount::mount_options(flags, &g.fs, false, false);
        match self.format_and_mount(&dev, &g.staging, &g.fs, &g.mkfs, &opts) {
            Ok(used) => {
                info!(volume = %name, device = %dev.display(), fs = %used, staging = %g.staging.display(), "multi-disk volume staged");
                Ok(())
            }
            Err(e) => {
                if let Some(a) = &assembled {
                    self.undo_assembly(a);
                }
                Err(e)
            }
        }
    }

    /// The blocking part of NodeExpandVolume of a KernelLVM multi-disk volume: every member
    /// connected (the ones an expansion added are new here), the VG extended by the new
    /// members and the LV over them ([`Host::assemble_lvm`]), then the mounted file system
    /// grown. Returns the LV's size. Members connected here and not yet in the stage record
    /// (hidden under the mount) are found from the API at NodeUnstageVolume.
    fn expand_group(&self, g: &GroupExpand) -> Result<u64> {
        let name = &g.data_control;
        let mounted = if g.block {
            None
        } else {
            Some(self.mounted(&g.staging)?.ok_or_else(|| {
                CsiError::FailedPrecondition(format!(
                    "multi-disk volume {name} is not staged at {}: NodeExpandVolume grows a staged volume",
                    g.staging.display()
                ))
            })?)
        };
        let (n, layout) = &g.lvm;
        let mut devices = Vec::new();
        for m in &g.members {
            let new = self.find_device(&m.plan)?.is_none();
            let dev = self.attach(&m.plan, m.keys.as_ref()).map_err(|e| {
                if new && m.keys.is_none() {
                    CsiError::FailedPrecondition(format!(
                        "member {} added by the expansion could not be connected and NodeExpandVolume got no keys (the StorageClass names no node-expand Secret: set csi.storage.k8s.io/node-expand-secret-name and -namespace as for node-stage): {}",
                        m.volume,
                        e.chain()
                    ))
                } else {
                    e
                }
            })?;
            if new {
                info!(volume = %name, member = %m.volume, device = %dev.display(), "member added by an expansion connected");
            }
            devices.push((m.volume.clone(), dev));
        }
        let a = self.assemble_lvm(n, *layout, &devices)?;
        if let Some(m) = mounted {
            cmd::run_ok(
                self.runner.as_ref(),
                &mount::grow_argv(&m.fs_type, &a.device, &g.staging)?,
            )?;
        }
        let size = mount::device_size(&a.device)?;
        info!(volume = %name, device = %a.device.display(), bytes = size, "multi-disk volume grown");
        Ok(size)
    }

    /// The blocking part of NodeUnstageVolume of a multi-disk volume. `known` is what the
    /// API says was staged (the data control's members), used when the staging directory
    /// holds no record; `gone`: the data control no longer exists.
    fn unstage_group(&self, staging: &Path, known: Option<Staged>, gone: bool) -> Result<()> {
        if gone
            && let Some(m) = self.mounted(staging)?
            && let Some(dm) = dm_of(&self.cfg.sysfs_root, Path::new(&m.source))
        {
            // The volume was deleted under its mount: its members' targets will not come
            // back, and the kernel would hold the unmount's writes until ctrl-loss-tmo.
            for nqn in slave_nqns(&self.cfg.sysfs_root, &dm) {
                let deleted = nvme::delete_controllers(&self.cfg.sysfs_root, &nqn)?;
                if !deleted.is_empty() {
                    info!(nqn = %nqn, controllers = ?deleted, "the multi-disk volume is gone: deleted its member's NVMe controllers before unmounting");
                }
            }
        }
        self.unmount(staging)?;
        let staged = match (Staged::read(staging)?, known) {
            // Members an expansion added while the volume was mounted are not in the record
            // (it is under the mount): the API's members are torn down too.
            (Some(mut rec), Some(known)) if rec.id == known.id => {
                for m in known.members {
                    if !rec.members.contains(&m) {
                        rec.members.push(m);
                    }
                }
                Some(rec)
            }
            (rec, known) => rec.or(known),
        };
        if let Some(s) = &staged {
            if let Some(n) = s.names() {
                self.deactivate_lvm(&n, &s.members)?;
            }
            for m in &s.members {
                if let Some(plan) = m.plan() {
                    self.detach(&plan)?;
                }
            }
        }
        Staged::remove(staging)?;
        info!(staging = %staging.display(), volume = ?staged.as_ref().map(|s| s.data_control.as_str()), "multi-disk volume unstaged");
        Ok(())
    }

    /// The device of a staged multi-disk volume for a raw-block publish.
    fn group_device(&self, s: &Staged) -> Result<Option<PathBuf>> {
        if let Some(n) = s.names() {
            let p = PathBuf::from(n.lv_path());
            return Ok(p.exists().then_some(p));
        }
        match s.members.first().and_then(StagedMember::plan) {
            Some(plan) => self.find_device(&plan),
            None => Ok(None),
        }
    }
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
        let keys = super::request_keys(&req.secrets, "node-expand")?;
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::cmd::{Output, ScriptedRunner};
    use crate::config::DriverConfig;
    use liteio_api::datacontrol::{AntstorDataControlSpec, RaidLevel};
    use std::collections::HashMap;
    use std::fs;
    use std::sync::Arc;
    use std::time::Duration;

    const ID: &str = "dc-0b9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a11";

    fn cfg(dir: &Path) -> Arc<DriverConfig> {
        let mut c = DriverConfig::new("node-1");
        c.sysfs_root = dir.join("sys");
        c.hostnqn_path = dir.join("etc/nvme/hostnqn");
        c.mountinfo_path = dir.join("mountinfo");
        fs::write(&c.mountinfo_path, "").unwrap();
        c.device_timeout = Duration::from_millis(300);
        Arc::new(c)
    }

    fn names() -> Names {
        lvm::names("pvc-1", ID)
    }

    fn members() -> Vec<(String, PathBuf)> {
        vec![
            ("pvc-1-aaaa".into(), PathBuf::from("/dev/nvme1n1")),
            ("pvc-1-bbbb".into(), PathBuf::from("/dev/nvme2n1")),
        ]
    }

    fn report(kind: &str, rows: &[String]) -> String {
        format!(
            "  {{\n      \"report\": [\n          {{\n              \"{kind}\": [\n{}\n              ]\n          }}\n      ]\n  }}\n",
            rows.join(",\n")
        )
    }

    fn pvs(rows: &[(&str, &str, u64)]) -> Output {
        Output::ok(report(
            "pv",
            &rows
                .iter()
                .map(|(d, vg, pe)| format!("{{\"pv_name\":\"{d}\", \"pv_uuid\":\"u-{d}\", \"vg_name\":\"{vg}\", \"pv_pe_count\":\"{pe}\", \"pv_pe_alloc_count\":\"0\", \"dev_size\":\"67108864\"}}"))
                .collect::<Vec<_>>(),
        ))
    }

    /// PVs whose extents the LV uses, all of them.
    fn pvs_used(rows: &[(&str, &str, u64)]) -> Output {
        Output::ok(report(
            "pv",
            &rows
                .iter()
                .map(|(d, vg, pe)| format!("{{\"pv_name\":\"{d}\", \"pv_uuid\":\"u-{d}\", \"vg_name\":\"{vg}\", \"pv_pe_count\":\"{pe}\", \"pv_pe_alloc_count\":\"{pe}\", \"dev_size\":\"67108864\"}}"))
                .collect::<Vec<_>>(),
        ))
    }

    fn vgs(tag: &str) -> Output {
        Output::ok(report(
            "vg",
            &[format!(
                "{{\"vg_name\":\"pvc-1\", \"vg_uuid\":\"v\", \"vg_tags\":\"{tag}\", \"pv_count\":\"2\", \"vg_missing_pv_count\":\"0\", \"lv_count\":\"1\", \"vg_extent_size\":\"4194304\", \"vg_extent_count\":\"30\", \"vg_free_count\":\"0\"}}"
            )],
        ))
    }

    fn lvs(segtype: &str, stripes: u32, active: bool, dm_path: &Path) -> Output {
        let attr = if active { "-wi-a-----" } else { "-wi-------" };
        Output::ok(report(
            "lv",
            &[format!(
                "{{\"lv_name\":\"pvc-1\", \"vg_name\":\"pvc-1\", \"lv_uuid\":\"l\", \"lv_size\":\"125829120\", \"lv_path\":\"/dev/pvc-1/pvc-1\", \"lv_dm_path\":\"{}\", \"lv_attr\":\"{attr}\", \"segtype\":\"{segtype}\", \"stripes\":\"{stripes}\", \"stripe_size\":\"65536\"}}",
                dm_path.display()
            )],
        ))
    }

    fn empty(kind: &str) -> Output {
        Output::ok(report(kind, &[]))
    }

    /// The command names run, in order.
    fn commands(r: &ScriptedRunner) -> Vec<String> {
        r.calls().iter().map(|c| c[0].clone()).collect()
    }

    #[test]
    fn a_fresh_group_is_made_over_blank_members() {
        let d = tempfile::tempdir().unwrap();
        let dm = d.path().join("dm-node");
        fs::write(&dm, "").unwrap();
        let r = Arc::new(ScriptedRunner::new());
        r.on(
            &["lvm", "version"],
            Output::ok("  LVM version:     2.03.16(2) (2022-05-18)\n"),
        )
        .once(&["pvs"], empty("pv"))
        .on(
            &["pvs"],
            pvs(&[("/dev/nvme1n1", "pvc-1", 15), ("/dev/nvme2n1", "pvc-1", 16)]),
        )
        .on(&["vgs"], empty("vg"))
        .on(&["blkid"], Output::fail(2, ""))
        .on(&["pvcreate"], Output::ok(""))
        .on(&["vgcreate"], Output::ok(""))
        .on(&["lvcreate"], Output::ok(""))
        .on(&["lvs"], lvs("striped", 2, true, &dm));
        let host = Host::new(cfg(d.path()), r.clone());
        let a = host
            .assemble_lvm(&names(), Layout::Striped, &members())
            .unwrap();
        assert_eq!(a.device, dm);
        assert!(a.created_vg && !a.activated);
        assert_eq!(
            commands(&r),
            [
                "pvs", "vgs", "blkid", "blkid", "pvcreate", "lvm", "vgcreate", "pvs", "lvcreate",
                "lvs"
            ]
        );
        let lines = r.lines();
        assert!(
            lines[4].ends_with(" /dev/nvme1n1 /dev/nvme2n1"),
            "{}",
            lines[4]
        );
        // LVM 2.03.16: a VG only the CSI node activates.
        assert!(
            lines[6].ends_with(&format!(
                "--physicalextentsize 4m --addtag liteio.volume.{ID} --setautoactivation n pvc-1 /dev/nvme1n1 /dev/nvme2n1"
            )),
            "{}",
            lines[6]
        );
        // Equal stripes: twice the smaller member's 15 extents.
        assert!(
            lines[8].ends_with("-y -l 30 -i 2 -I 64k -n pvc-1 pvc-1 /dev/nvme1n1 /dev/nvme2n1"),
            "{}",
            lines[8]
        );
        // Every LVM command is confined to the two members.
        for c in r
            .calls()
            .iter()
            .filter(|c| c[0] != "blkid" && c[0] != "lvm")
        {
            assert_eq!(c[1], "--config");
            assert!(
                c[2].starts_with(
                    "devices { filter = [ \"a|^/dev/nvme1n1$|\", \"a|^/dev/nvme2n1$|\", \"r|.*|\" ]"
                ),
                "{}",
                c[2]
            );
        }
    }

    #[test]
    fn a_member_with_foreign_data_is_refused_before_anything_is_written() {
        let d = tempfile::tempdir().unwrap();
        let r = Arc::new(ScriptedRunner::new());
        r.on(&["pvs"], empty("pv"))
            .on(&["vgs"], empty("vg"))
            .on(
                &["blkid", "-p", "-o", "export", "/dev/nvme2n1"],
                Output::ok("DEVNAME=/dev/nvme2n1\nUUID=f3\nBLOCK_SIZE=4096\nTYPE=xfs\n"),
            )
            .on(&["blkid"], Output::fail(2, ""));
        let host = Host::new(cfg(d.path()), r.clone());
        let e = host
            .assemble_lvm(&names(), Layout::Linear, &members())
            .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::FailedPrecondition);
        assert!(
            e.to_string().starts_with(
                "member device /dev/nvme2n1 (volume pvc-1-bbbb) carries a xfs signature"
            ),
            "{e}"
        );
        assert_eq!(commands(&r), ["pvs", "vgs", "blkid", "blkid"]);
        // blkid failing otherwise is an error of its own, not "no signature".
        let r = Arc::new(ScriptedRunner::new());
        r.on(&["pvs"], empty("pv")).on(&["vgs"], empty("vg")).on(
            &["blkid"],
            Output::fail(4, "blkid: error: /dev/nvme1n1: Input/output error"),
        );
        let host = Host::new(cfg(d.path()), r.clone());
        let e = host
            .assemble_lvm(&names(), Layout::Linear, &members())
            .unwrap_err();
        assert!(e.to_string().contains("Input/output error"), "{e}");
        assert!(r.calls_to(&["pvcreate"]).is_empty());
    }

    #[test]
    fn an_existing_group_is_only_activated() {
        let d = tempfile::tempdir().unwrap();
        let dm = d.path().join("dm-node");
        fs::write(&dm, "").unwrap();
        let tag = format!("liteio.volume.{ID}");
        let r = Arc::new(ScriptedRunner::new());
        // Another host made it; on this one the devices have other names.
        r.on(
            &["pvs"],
            pvs_used(&[("/dev/nvme1n1", "pvc-1", 15), ("/dev/nvme2n1", "pvc-1", 15)]),
        )
        .on(&["vgs"], vgs(&tag))
        .on(&["blkid"], Output::ok("TYPE=LVM2_member\n"))
        .once(&["lvs"], lvs("linear", 1, false, &dm))
        .on(&["vgchange"], Output::ok(""))
        .on(&["lvs"], lvs("linear", 1, true, &dm));
        let host = Host::new(cfg(d.path()), r.clone());
        let a = host
            .assemble_lvm(&names(), Layout::Linear, &members())
            .unwrap();
        assert!(a.activated && !a.created_vg && a.created_pvs.is_empty());
        assert_eq!(
            commands(&r),
            [
                "pvs", "vgs", "blkid", "blkid", "lvs", "pvs", "vgchange", "lvs"
            ]
        );
        assert!(r.lines()[6].ends_with("-a y pvc-1"), "{}", r.lines()[6]);
        // Active already (a restage): nothing changes.
        let r = Arc::new(ScriptedRunner::new());
        r.on(
            &["pvs"],
            pvs_used(&[("/dev/nvme1n1", "pvc-1", 15), ("/dev/nvme2n1", "pvc-1", 15)]),
        )
        .on(&["vgs"], vgs(&tag))
        .on(&["blkid"], Output::ok("TYPE=LVM2_member\n"))
        .on(&["lvs"], lvs("linear", 1, true, &dm));
        let host = Host::new(cfg(d.path()), r.clone());
        let a = host
            .assemble_lvm(&names(), Layout::Linear, &members())
            .unwrap();
        assert!(!a.activated);
        assert!(r.calls_to(&["vgchange"]).is_empty());
        // Made as linear, asked as raid0: refused, and the activation is undone.
        let r = Arc::new(ScriptedRunner::new());
        r.on(
            &["pvs"],
            pvs_used(&[("/dev/nvme1n1", "pvc-1", 15), ("/dev/nvme2n1", "pvc-1", 15)]),
        )
        .on(&["vgs"], vgs(&tag))
        .on(&["blkid"], Output::ok("TYPE=LVM2_member\n"))
        .once(&["lvs"], lvs("linear", 1, false, &dm))
        .on(&["vgchange"], Output::ok(""))
        .on(&["lvs"], lvs("linear", 1, true, &dm));
        let host = Host::new(cfg(d.path()), r.clone());
        let e = host
            .assemble_lvm(&names(), Layout::Striped, &members())
            .unwrap_err();
        assert!(
            e.to_string().contains("striped (raid0) over 2 members"),
            "{e}"
        );
        let changes: Vec<String> = r
            .calls_to(&["vgchange"])
            .iter()
            .map(|c| c[3..].join(" "))
            .collect();
        assert_eq!(changes, ["-a y pvc-1", "-a n pvc-1"]);
    }

    #[test]
    fn members_added_by_an_expansion_extend_the_group_and_its_lv() {
        let d = tempfile::tempdir().unwrap();
        let dm = d.path().join("dm-node");
        fs::write(&dm, "").unwrap();
        let tag = format!("liteio.volume.{ID}");
        let mut three = members();
        three.push(("pvc-1-cccc".into(), PathBuf::from("/dev/nvme3n1")));
        let r = Arc::new(ScriptedRunner::new());
        // The VG holds the first two members; the third one is blank. After the vgextend the
        // third is a PV of it without an extent used: the LV grows over it.
        r.once(
            &["pvs"],
            pvs_used(&[("/dev/nvme1n1", "pvc-1", 15), ("/dev/nvme2n1", "pvc-1", 15)]),
        )
        .on(&["vgs"], vgs(&tag))
        .on(
            &["blkid", "-p", "-o", "export", "/dev/nvme3n1"],
            Output::fail(2, ""),
        )
        .on(&["blkid"], Output::ok("TYPE=LVM2_member\n"))
        .on(&["pvcreate"], Output::ok(""))
        .on(&["vgextend"], Output::ok(""))
        .once(&["lvs"], lvs("linear", 1, true, &dm))
        .once(
            &["pvs"],
            Output::ok(report(
                "pv",
                &[
                    "{\"pv_name\":\"/dev/nvme1n1\", \"vg_name\":\"pvc-1\", \"pv_pe_count\":\"15\", \"pv_pe_alloc_count\":\"15\"}".into(),
                    "{\"pv_name\":\"/dev/nvme2n1\", \"vg_name\":\"pvc-1\", \"pv_pe_count\":\"15\", \"pv_pe_alloc_count\":\"15\"}".into(),
                    "{\"pv_name\":\"/dev/nvme3n1\", \"vg_name\":\"pvc-1\", \"pv_pe_count\":\"9\", \"pv_pe_alloc_count\":\"0\"}".into(),
                ],
            )),
        )
        .on(&["lvextend"], Output::ok(""))
        .on(&["lvs"], lvs("linear", 1, true, &dm));
        let host = Host::new(cfg(d.path()), r.clone());
        let a = host.assemble_lvm(&names(), Layout::Linear, &three).unwrap();
        assert!(!a.activated && !a.created_vg);
        assert_eq!(
            commands(&r),
            [
                "pvs", "vgs", "blkid", "blkid", "blkid", "pvcreate", "vgextend", "lvs", "pvs",
                "lvextend", "lvs", "lvs"
            ]
        );
        let line = |cmd: &str| {
            r.calls_to(&[cmd])
                .first()
                .map(|c| c[3..].join(" "))
                .unwrap_or_default()
        };
        assert_eq!(line("pvcreate"), "/dev/nvme3n1");
        assert_eq!(line("vgextend"), "pvc-1 /dev/nvme3n1");
        assert_eq!(line("lvextend"), "-l +9 pvc-1/pvc-1 /dev/nvme3n1");
        // Every command is still confined to the members, the new one included.
        for c in r.calls_to(&["vgextend"]) {
            assert!(c[2].contains("\"a|^/dev/nvme3n1$|\""), "{}", c[2]);
        }

        // A vgextend that fails removes the PV it made, and nothing is extended.
        let r = Arc::new(ScriptedRunner::new());
        r.on(
            &["pvs"],
            pvs_used(&[("/dev/nvme1n1", "pvc-1", 15), ("/dev/nvme2n1", "pvc-1", 15)]),
        )
        .on(&["vgs"], vgs(&tag))
        .on(
            &["blkid", "-p", "-o", "export", "/dev/nvme3n1"],
            Output::fail(2, ""),
        )
        .on(&["blkid"], Output::ok("TYPE=LVM2_member\n"))
        .on(&["pvcreate"], Output::ok(""))
        .on(
            &["vgextend"],
            Output::fail(5, "  Cannot add physical volume"),
        )
        .on(&["pvremove"], Output::ok(""));
        let host = Host::new(cfg(d.path()), r.clone());
        let e = host
            .assemble_lvm(&names(), Layout::Linear, &three)
            .unwrap_err();
        assert!(e.to_string().contains("Cannot add physical volume"), "{e}");
        assert_eq!(
            commands(&r),
            [
                "pvs", "vgs", "blkid", "blkid", "blkid", "pvcreate", "vgextend", "pvremove"
            ]
        );
    }

    #[test]
    fn a_failed_lvcreate_removes_the_group_it_made() {
        let d = tempfile::tempdir().unwrap();
        let r = Arc::new(ScriptedRunner::new());
        // The first member is an orphan PV of an earlier attempt: kept, not removed.
        r.once(&["pvs"], pvs(&[("/dev/nvme1n1", "", 0)]))
            .on(
                &["pvs"],
                pvs(&[("/dev/nvme1n1", "pvc-1", 15), ("/dev/nvme2n1", "pvc-1", 15)]),
            )
            .on(&["vgs"], empty("vg"))
            .on(
                &["blkid", "-p", "-o", "export", "/dev/nvme1n1"],
                Output::ok("TYPE=LVM2_member\n"),
            )
            .on(&["blkid"], Output::fail(2, ""))
            .on(&["pvcreate"], Output::ok(""))
            .on(&["vgcreate"], Output::ok(""))
            .on(
                &["lvcreate"],
                Output::fail(5, "  Volume group \"pvc-1\" has insufficient free space"),
            )
            .on(&["vgremove"], Output::ok(""))
            .on(&["pvremove"], Output::ok(""));
        let host = Host::new(cfg(d.path()), r.clone());
        let e = host
            .assemble_lvm(&names(), Layout::Linear, &members())
            .unwrap_err();
        assert!(e.to_string().contains("insufficient free space"), "{e}");
        assert_eq!(
            commands(&r),
            [
                "pvs", "vgs", "blkid", "blkid", "pvcreate", "lvm", "vgcreate", "pvs", "lvcreate",
                "vgremove", "pvremove"
            ]
        );
        let calls = r.calls();
        assert_eq!(calls[4][3..], ["/dev/nvme2n1"], "only the blank one");
        // LVM's version unknown: a VG without --setautoactivation, which older LVM refuses.
        assert!(
            !calls[6].iter().any(|a| a == "--setautoactivation"),
            "{:?}",
            calls[6]
        );
        assert_eq!(calls[9][3..], ["-y", "-f", "pvc-1"]);
        assert_eq!(
            calls[10][3..],
            ["/dev/nvme2n1"],
            "the orphan PV it found stays"
        );
    }

    /// A fake sysfs with the LV's device-mapper device `dm-3` and, when `members`, the two
    /// member controllers.
    fn sysfs_with(dir: &Path, dm_name: &str, members: bool) {
        let sys = dir.join("sys");
        let dm = sys.join("block/dm-3");
        fs::create_dir_all(dm.join("dm")).unwrap();
        fs::write(dm.join("dm/name"), format!("{dm_name}\n")).unwrap();
        for (i, sn) in [(1, "SN1"), (2, "SN2")] {
            fs::create_dir_all(dm.join("slaves").join(format!("nvme{i}n1"))).unwrap();
            let dev = sys.join(format!("block/nvme{i}n1/device"));
            fs::create_dir_all(&dev).unwrap();
            fs::write(dev.join("subsysnqn"), format!("nqn.m{i}\n")).unwrap();
            if members {
                let c = sys.join(format!("class/nvme/nvme{i}"));
                fs::create_dir_all(c.join(format!("nvme{i}n1"))).unwrap();
                fs::write(c.join("serial"), format!("{sn}\n")).unwrap();
                fs::write(c.join("subsysnqn"), format!("nqn.m{i}\n")).unwrap();
            }
        }
    }

    fn staged_members() -> Vec<StagedMember> {
        (1..=2)
            .map(|i| StagedMember {
                volume: format!("pvc-1-m{i}"),
                nvme: Some(SpdkTarget {
                    subsys_nqn: format!("nqn.m{i}"),
                    sn: format!("SN{i}"),
                    svc_id: "4420".into(),
                    address: "127.0.0.1".into(),
                    trans_type: "TCP".into(),
                    ..SpdkTarget::default()
                }),
                local: None,
            })
            .collect()
    }

    #[test]
    fn deactivation_uses_lvm_and_falls_back_to_device_mapper() {
        let n = names();
        assert_eq!(n.dm_name(), "pvc--1-pvc--1");
        // Not active: nothing runs.
        let d = tempfile::tempdir().unwrap();
        let r = Arc::new(ScriptedRunner::new());
        let host = Host::new(cfg(d.path()), r.clone());
        host.deactivate_lvm(&n, &staged_members()).unwrap();
        assert!(r.calls().is_empty());
        // Active with its members: vgchange -an over them.
        sysfs_with(d.path(), &n.dm_name(), true);
        assert_eq!(
            dm_device(&d.path().join("sys"), &n.dm_name()).as_deref(),
            Some("dm-3")
        );
        assert_eq!(
            slave_nqns(&d.path().join("sys"), "dm-3"),
            ["nqn.m1", "nqn.m2"]
        );
        // The mount source LVM made without udev: a node named after the LV, found by name.
        let node = d.path().join("pvc--1-pvc--1");
        fs::write(&node, "").unwrap();
        assert_eq!(dm_of(&d.path().join("sys"), &node).as_deref(), Some("dm-3"));
        let other = d.path().join("sda1");
        fs::write(&other, "").unwrap();
        assert_eq!(dm_of(&d.path().join("sys"), &other), None);
        assert_eq!(
            dm_of(&d.path().join("sys"), &d.path().join("missing")),
            None
        );
        let gone = d.path().join("sys/block/dm-3");
        let r = Arc::new(ScriptedRunner::new());
        r.on_with(&["vgchange"], Output::ok(""), move |_| {
            let _ = fs::remove_dir_all(&gone);
        });
        let host = Host::new(cfg(d.path()), r.clone());
        host.deactivate_lvm(&n, &staged_members()).unwrap();
        assert_eq!(commands(&r), ["vgchange"]);
        assert!(r.lines()[0].ends_with("-a n pvc-1"));
        assert!(r.lines()[0].contains("a|^/dev/nvme1n1$|"));
        // Its members are gone: LVM cannot see the VG; the LV's device is removed directly.
        let d = tempfile::tempdir().unwrap();
        sysfs_with(d.path(), &n.dm_name(), false);
        let r = Arc::new(ScriptedRunner::new());
        r.on(&["dmsetup"], Output::ok(""));
        let host = Host::new(cfg(d.path()), r.clone());
        host.deactivate_lvm(&n, &staged_members()).unwrap();
        assert_eq!(r.lines(), ["dmsetup remove pvc--1-pvc--1"]);
        // Still open: the error says so, and is returned.
        let r = Arc::new(ScriptedRunner::new());
        r.on(
            &["dmsetup"],
            Output::fail(
                1,
                "device-mapper: remove ioctl on pvc--1-pvc--1  failed: Device or resource busy",
            ),
        );
        let host = Host::new(cfg(d.path()), r.clone());
        let e = host.deactivate_lvm(&n, &staged_members()).unwrap_err();
        assert!(e.to_string().contains("busy"), "{e}");
    }

    #[test]
    fn the_record_holds_what_was_connected_and_no_secret() {
        let d = tempfile::tempdir().unwrap();
        let st = d.path().join("staging");
        assert_eq!(Staged::read(&st).unwrap(), None);
        let s = Staged {
            id: ID.into(),
            data_control: "pvc-1".into(),
            engine: PoolMode::KernelLVM,
            vg: "pvc-1".into(),
            lv: "pvc-1".into(),
            members: staged_members(),
        };
        s.write(&st).unwrap();
        assert_eq!(Staged::read(&st).unwrap().as_ref(), Some(&s));
        assert_eq!(s.names().unwrap(), names());
        let text = fs::read_to_string(st.join(RECORD_FILE)).unwrap();
        assert!(!text.contains("DHHC") && !text.contains("dhchap"), "{text}");
        assert_eq!(
            fs::read_dir(&st).unwrap().count(),
            1,
            "no temporary file left"
        );
        Staged::remove(&st).unwrap();
        Staged::remove(&st).unwrap();
        assert_eq!(fs::read_dir(&st).unwrap().count(), 0);
        fs::write(st.join(RECORD_FILE), "{").unwrap();
        let e = Staged::read(&st).unwrap_err();
        assert!(e.to_string().contains(RECORD_FILE), "{e}");
        // SpdkLVStore: no LVM names.
        let a = Staged {
            engine: PoolMode::SpdkLVStore,
            vg: String::new(),
            lv: String::new(),
            ..s
        };
        assert_eq!(a.names(), None);
    }

    #[test]
    fn a_failed_stage_disconnects_what_it_connected_and_leaves_no_record() {
        let d = tempfile::tempdir().unwrap();
        let cfg = cfg(d.path());
        let sys = cfg.sysfs_root.clone();
        let r = Arc::new(ScriptedRunner::new());
        // The first member connects, the second's target refuses.
        r.on_with(
            &[
                "nvme",
                "connect",
                "-t",
                "tcp",
                "-a",
                "127.0.0.1",
                "-s",
                "4420",
                "-n",
                "nqn.m1",
            ],
            Output::ok(""),
            move |_| {
                let c = sys.join("class/nvme/nvme1");
                fs::create_dir_all(c.join("nvme1n1")).unwrap();
                fs::write(c.join("serial"), "SN1\n").unwrap();
                fs::write(c.join("subsysnqn"), "nqn.m1\n").unwrap();
            },
        )
        .on(
            &["nvme", "connect"],
            Output::fail(
                1,
                "Failed to write to /dev/nvme-fabrics: Connection refused",
            ),
        )
        .on(&["nvme", "disconnect"], Output::ok(""));
        let host = Host::new(Arc::clone(&cfg), r.clone());
        let staging = d.path().join("staging");
        let plans: Vec<Attach> = staged_members()
            .iter()
            .filter_map(StagedMember::plan)
            .collect();
        let g = GroupStage {
            record: Staged {
                id: ID.into(),
                data_control: "pvc-1".into(),
                engine: PoolMode::KernelLVM,
                vg: "pvc-1".into(),
                lv: "pvc-1".into(),
                members: staged_members(),
            },
            lvm: Some((names(), Layout::Linear)),
            members: plans
                .into_iter()
                .enumerate()
                .map(|(i, plan)| MemberConnect {
                    volume: format!("pvc-1-m{}", i + 1),
                    plan,
                    keys: None,
                })
                .collect(),
            staging: staging.clone(),
            access: Access::Block,
            fs: "ext4".into(),
            mkfs: String::new(),
            total_size: 1 << 30,
        };
        let e = host.stage_group(&g).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Unavailable, "{e}");
        assert_eq!(
            r.calls_to(&["nvme", "disconnect"]),
            [crate::cmd::argv(&["nvme", "disconnect", "-n", "nqn.m1"])]
        );
        assert!(
            r.calls_to(&["pvs"]).is_empty(),
            "no LVM before every member is there"
        );
        assert_eq!(Staged::read(&staging).unwrap(), None);
    }

    #[test]
    fn an_assembled_export_is_staged_and_unstaged_as_a_plain_remote_volume() {
        // SpdkLVStore: one connection to status.spdkTarget, no LVM; a raw-block stage.
        let d = tempfile::tempdir().unwrap();
        let cfg = cfg(d.path());
        let sys = cfg.sysfs_root.clone();
        let r = Arc::new(ScriptedRunner::new());
        r.on_with(&["nvme", "connect"], Output::ok(""), move |_| {
            let c = sys.join("class/nvme/nvme4");
            fs::create_dir_all(c.join("nvme4n1")).unwrap();
            fs::write(c.join("serial"), "SNDC\n").unwrap();
            fs::write(c.join("subsysnqn"), "nqn.dc\n").unwrap();
        })
        .on(&["nvme", "disconnect"], Output::ok(""));
        let host = Host::new(Arc::clone(&cfg), r.clone());
        let mut dc = dc(PoolMode::SpdkLVStore, "node-1");
        dc.status = Some(liteio_api::datacontrol::AntstorDataControlStatus {
            status: Some(VolumeStatus::Ready),
            spdk_target: Some(SpdkTarget {
                subsys_nqn: "nqn.dc".into(),
                sn: "SNDC".into(),
                address: "127.10.0.2".into(),
                svc_id: "4430".into(),
                trans_type: "TCP".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        let plan = assembled_target(&dc).unwrap();
        let staging = d.path().join("staging");
        let record = Staged {
            id: ID.into(),
            data_control: "pvc-1".into(),
            engine: PoolMode::SpdkLVStore,
            vg: String::new(),
            lv: String::new(),
            members: vec![StagedMember::of("pvc-1", &plan)],
        };
        let g = GroupStage {
            record: record.clone(),
            lvm: None,
            members: vec![MemberConnect {
                volume: "pvc-1".into(),
                plan,
                keys: None,
            }],
            staging: staging.clone(),
            access: Access::Block,
            fs: "ext4".into(),
            mkfs: String::new(),
            total_size: 1 << 30,
        };
        host.stage_group(&g).unwrap();
        assert_eq!(
            r.lines(),
            [
                "nvme connect -t tcp -a 127.10.0.2 -s 4430 -n nqn.dc --hostnqn nqn.2021-03.com.alipay.host:uuid:node-1 --reconnect-delay 1 --ctrl-loss-tmo 600"
            ]
        );
        assert_eq!(Staged::read(&staging).unwrap(), Some(record.clone()));
        assert_eq!(
            host.group_device(&record).unwrap(),
            Some(PathBuf::from("/dev/nvme4n1"))
        );
        // Staged again: connected already, nothing more runs.
        host.stage_group(&g).unwrap();
        assert_eq!(r.calls().len(), 1);
        // Unstaged from the record (the data control may be gone): disconnected, no LVM.
        host.unstage_group(&staging, None, true).unwrap();
        assert_eq!(r.lines()[1..], ["nvme disconnect -n nqn.dc"]);
        assert_eq!(Staged::read(&staging).unwrap(), None);
        // Twice: nothing left to do.
        host.unstage_group(&staging, None, true).unwrap();
        assert_eq!(r.calls().len(), 2);
    }

    fn dc(engine: PoolMode, host: &str) -> AntstorDataControl {
        let mut dc = AntstorDataControl::new(
            "pvc-1",
            AntstorDataControlSpec {
                uuid: ID.into(),
                engine_type: engine,
                raid: liteio_api::datacontrol::Raid {
                    level: RaidLevel::Raid0,
                },
                ..Default::default()
            },
        );
        dc.spec.host_node.id = host.into();
        dc
    }

    #[test]
    fn data_control_checks() {
        let mut d = dc(PoolMode::SpdkLVStore, "vm-1");
        check_dc_host(&d, "vm-1").unwrap();
        let e = check_dc_host(&d, "vm-2").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::FailedPrecondition);
        assert!(
            e.to_string()
                .contains("for node vm-1 (spec.hostNode), not for this node vm-2"),
            "{e}"
        );
        // Ready without an export yet: says who writes it.
        d.spec.target_node_id = "node-2".into();
        let e = assembled_target(&d).unwrap_err();
        assert!(
            e.to_string().contains("status.spdkTarget") && e.to_string().contains("node-2"),
            "{e}"
        );
        let t = SpdkTarget {
            subsys_nqn: "nqn.dc".into(),
            sn: "SNDC".into(),
            address: "127.10.0.2".into(),
            svc_id: "4430".into(),
            trans_type: "TCP".into(),
            ..Default::default()
        };
        d.status = Some(liteio_api::datacontrol::AntstorDataControlStatus {
            status: Some(VolumeStatus::Ready),
            spdk_target: Some(t.clone()),
            ..Default::default()
        });
        assert_eq!(assembled_target(&d).unwrap(), Attach::Nvme(t));
        assert!(dc_ready(&d));
        // The controller refused it: an answer at once, with its reason.
        d.status = Some(liteio_api::datacontrol::AntstorDataControlStatus {
            status: Some(VolumeStatus::Creating),
            message: "invalid data control: spec.raid.level: raid5 is not supported".into(),
            ..Default::default()
        });
        let e = dc_failed(&d).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::FailedPrecondition);
        assert!(e.to_string().contains("raid5"), "{e}");
        d.status.as_mut().unwrap().message = "waiting for the members".into();
        dc_failed(&d).unwrap();
        assert!(!dc_ready(&d));
    }

    #[test]
    fn file_system_and_mkfs_come_from_the_request_then_the_data_control() {
        let mut d = dc(PoolMode::KernelLVM, "vm-1");
        let mount = |fs: &str| Access::Mount {
            fs_type: fs.into(),
            flags: Vec::new(),
        };
        let mut ctx = HashMap::new();
        assert_eq!(group_fs(&d, &mount(""), &ctx), params::DEFAULT_FS);
        d.metadata.labels = Some([(labels::FS_TYPE.to_string(), "ext4".to_string())].into());
        assert_eq!(group_fs(&d, &mount(""), &ctx), "ext4");
        ctx.insert(keys::SC_PARAM_FS_TYPE.to_string(), "xfs".to_string());
        assert_eq!(group_fs(&d, &mount(""), &ctx), "xfs");
        assert_eq!(group_fs(&d, &mount("ext3"), &ctx), "ext3");
        assert_eq!(group_mkfs(&d, &ctx), "");
        d.metadata.annotations = Some(
            [(
                keys::SC_PARAM_MKFS_PARAMS.to_string(),
                "-E nodiscard".to_string(),
            )]
            .into(),
        );
        assert_eq!(group_mkfs(&d, &ctx), "-E nodiscard");
        ctx.insert(keys::SC_PARAM_MKFS_PARAMS.to_string(), "-K".to_string());
        assert_eq!(group_mkfs(&d, &ctx), "-K");
    }
}
