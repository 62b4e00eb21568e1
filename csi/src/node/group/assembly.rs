//! The host's blocking work for multi-disk volumes ([`Host`]'s methods): connect the
//! members, find or make and activate the volume group over them and its LV
//! ([`Host::assemble_lvm`], undone by [`Host::undo_assembly`] when a later step fails), grow
//! it over new members, and tear it down ([`Host::deactivate_lvm`], with device-mapper's
//! view in sysfs, [`dm_of`] and [`slave_nqns`], when LVM no longer sees the members). What
//! the stage, expansion and unstage are told to do is [`GroupStage`] and [`GroupExpand`].

use std::path::{Path, PathBuf};

use liteio_api::auth::VolumeKeys;
use tracing::{info, warn};

use crate::cmd;
use crate::error::{CsiError, Result};
use crate::lvm::{self, Layout, MemberDevice, Names, VgPlan};
use crate::mount;
use crate::nvme;
use crate::params::Access;

use super::record::{Staged, StagedMember};
use crate::node::host::{Attach, Host};

/// One member to connect.
#[derive(Debug, Clone)]
pub(super) struct MemberConnect {
    pub(super) volume: String,
    pub(super) plan: Attach,
    pub(super) keys: Option<VolumeKeys>,
}

/// Everything the blocking part of NodeStageVolume needs.
#[derive(Debug, Clone)]
pub(super) struct GroupStage {
    pub(super) record: Staged,
    /// KernelLVM: names and layout; `None`: the one member is the device.
    pub(super) lvm: Option<(Names, Layout)>,
    pub(super) members: Vec<MemberConnect>,
    pub(super) staging: PathBuf,
    pub(super) access: Access,
    pub(super) fs: String,
    pub(super) mkfs: String,
    pub(super) total_size: u64,
}

/// Everything the blocking part of NodeExpandVolume needs.
#[derive(Debug, Clone)]
pub(super) struct GroupExpand {
    pub(super) data_control: String,
    pub(super) lvm: (Names, Layout),
    pub(super) members: Vec<MemberConnect>,
    pub(super) staging: PathBuf,
    /// Raw block: no file system to grow.
    pub(super) block: bool,
}

/// What [`Host::assemble_lvm`] did, for undoing it when a later step fails.
#[derive(Debug, Clone)]
pub struct Assembled {
    /// The LV's device.
    pub device: PathBuf,
    pub(super) names: Names,
    pub(super) devs: Vec<String>,
    /// PVs made by this call (removed again with the VG it made).
    pub(super) created_pvs: Vec<String>,
    /// This call made the VG.
    pub(super) created_vg: bool,
    /// This call activated it.
    pub(super) activated: bool,
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
    pub(super) fn run_lvm(&self, argv: &[String]) -> Result<cmd::Output> {
        cmd::run_ok(self.runner.as_ref(), argv)
    }

    /// What `blkid -p` finds on `dev` ([`lvm::parse_signature`]).
    pub(super) fn signature(&self, dev: &str) -> Result<Option<String>> {
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
    pub(super) fn manual_activation(&self) -> bool {
        let v = self.lvm_version.get_or_init(|| {
            let v = cmd::run_ok(self.runner.as_ref(), &lvm::version_argv())
                .ok()
                .and_then(|o| lvm::parse_version(&o.stdout));
            info!(version = ?v, "this host's LVM");
            v
        });
        v.is_some_and(|v| v >= lvm::SETAUTOACTIVATION_SINCE)
    }

    pub(super) fn lvs(&self, devs: &[String], vg: &str) -> Result<Vec<lvm::Lv>> {
        lvm::parse_lvs(&self.run_lvm(&lvm::lvs_argv(devs, vg)?)?.stdout)
    }

    /// Free extents of the members' PVs in VG `vg`, in member order.
    pub(super) fn free_extents(&self, devs: &[String], vg: &str) -> Result<Vec<u64>> {
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
    pub(super) fn create_lv(&self, n: &Names, layout: Layout, devs: &[String]) -> Result<()> {
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
    pub(super) fn extend_vg(
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
    pub(super) fn grow_lv(&self, n: &Names, layout: Layout, devs: &[String]) -> Result<bool> {
        let pvs = lvm::parse_pvs(&self.run_lvm(&lvm::pvs_argv(devs)?)?.stdout)?;
        let Some(grow) = lvm::plan_grow(layout, &n.vg, devs, &pvs) else {
            return Ok(false);
        };
        self.run_lvm(&lvm::lvextend_argv(devs, n, &grow)?)?;
        info!(vg = %n.vg, lv = %n.lv, extents = grow.extents, stripes = ?grow.stripes, on = %grow.on.join(","), "logical volume extended over the members added to the volume");
        Ok(true)
    }

    /// The LV's device once it is active, after checking its layout.
    pub(super) fn lv_device(
        &self,
        n: &Names,
        layout: Layout,
        devs: &[String],
    ) -> Result<(PathBuf, u64)> {
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
    pub(super) fn stage_group(&self, g: &GroupStage) -> Result<()> {
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

    pub(super) fn stage_group_steps(
        &self,
        g: &GroupStage,
        connected: &mut Vec<Attach>,
    ) -> Result<()> {
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
    pub(super) fn expand_group(&self, g: &GroupExpand) -> Result<u64> {
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
    pub(super) fn unstage_group(
        &self,
        staging: &Path,
        known: Option<Staged>,
        gone: bool,
    ) -> Result<()> {
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
    pub(super) fn group_device(&self, s: &Staged) -> Result<Option<PathBuf>> {
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
