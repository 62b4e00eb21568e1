//! Kernel LVM engine: a volume group, LVs as volumes, LVM snapshots.
//!
//! - **Pool**: the VG `storage.pooling.name`. File-backed PVs (`storage.pvs[i].filePath`) are
//!   fallocated when missing and bound to a loop device; the device used is the one
//!   `losetup -j` shows bound to *that file* (LiteIO only checked that `/dev/loop<i>`
//!   existed). Loop devices are attached before looking for the VG, so a rebooted node finds
//!   its VG again instead of re-creating it. Missing VG + PVs configured → `pvcreate` +
//!   `vgcreate`.
//! - **Layout** (LiteIO's rule): explicit `obnvmf/lv-layout`, else linear if any linear LV
//!   exists, else striped over every PV (`-i <pvCount> -I 128k`). A single-PV VG is always
//!   linear. Striped sizes are a multiple of pvCount × extent. Unlike LiteIO, which rounded
//!   striped sizes *down*, sizes are rounded *up* so a volume is never smaller than asked
//!   and the idempotency check compares like with like.
//! - `reserved-*` LVs are not volumes: they are reported in [`PoolInfo::reserved`].
//! - **Clone** (LiteIO had none): a new linear LV of the origin's size, tagged
//!   `liteio.clone-incomplete` while `dd` copies the snapshot into it; a retry finding the tag
//!   copies again.
//! - **Restore**: `lvconvert --merge`; with the origin open LVM defers the merge to the
//!   next activation and the snapshot disappears when it is done.
//! - `thin` is not supported without a thin pool: volumes are thick and reported `thin: false`.
//! - **Reads**: an operation on named LVs reads only them (`lvs --select 'lv_name="…"'`), and
//!   the layout rule reads only the LVs that start linear, and only when it decides; only
//!   pool accounting ([`PoolEngine::info`], [`PoolEngine::ensure_pool`]) and
//!   [`PoolEngine::list_volumes`] list the whole VG. LVM itself still reads the VG's metadata
//!   on every command.

pub mod cmd;
pub mod report;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::config::LvmPv;

use super::{
    CommandRunner, EngineError, EngineKind, LvLayout, PoolEngine, PoolInfo, SystemRunner,
    VolumeInfo, VolumeIo, VolumeOptions, attach_loop_file, blkstat, check_name, command_failed,
    round_size, run_ok, run_raw,
};
use report::{Lv, Vg};

/// What LVM prints when a PV of the VG is gone.
pub const PV_LOST_STDERR: &str = "Couldn't find device";
/// Prefix of LVs that are not ours to schedule.
pub const RESERVED_PREFIX: &str = "reserved-";

/// A kernel LVM volume group.
#[derive(Debug)]
pub struct LvmEngine {
    vg: String,
    pvs: Vec<LvmPv>,
    runner: Arc<dyn CommandRunner>,
    lock: Mutex<()>,
}

impl LvmEngine {
    /// VG `vg` built from `pvs` when missing, running real commands.
    pub fn new(vg: impl Into<String>, pvs: Vec<LvmPv>) -> Self {
        Self::with_runner(vg, pvs, Arc::new(SystemRunner::new()))
    }

    /// Like [`LvmEngine::new`] with another command runner (tests).
    pub fn with_runner(
        vg: impl Into<String>,
        pvs: Vec<LvmPv>,
        runner: Arc<dyn CommandRunner>,
    ) -> Self {
        Self {
            vg: vg.into(),
            pvs,
            runner,
            lock: Mutex::new(()),
        }
    }

    /// The VG name.
    pub fn vg_name(&self) -> &str {
        &self.vg
    }

    fn guard(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn run(&self, argv: &[String]) -> Result<super::CmdOutput, EngineError> {
        run_ok(self.runner.as_ref(), argv)
    }

    /// The VG, `None` if it does not exist. A lost PV is an error.
    pub fn query_vg(&self) -> Result<Option<Vg>, EngineError> {
        let argv = cmd::vgs();
        let out = run_raw(self.runner.as_ref(), &argv)?;
        if out.stderr.contains(PV_LOST_STDERR) {
            return Err(EngineError::PvLost {
                vg: self.vg.clone(),
                stderr: out.stderr.trim().to_string(),
            });
        }
        if !out.success() {
            return Err(command_failed(&argv, &out));
        }
        let vgs = report::parse_vgs(&out.stdout).map_err(|message| EngineError::BadOutput {
            argv: argv.join(" "),
            message,
        })?;
        Ok(vgs.into_iter().find(|v| v.name == self.vg))
    }

    fn require_vg(&self) -> Result<Vg, EngineError> {
        self.query_vg()?.ok_or_else(|| EngineError::NotFound {
            what: "volume group",
            name: self.vg.clone(),
        })
    }

    /// Every LV of the VG, reserved ones included (pool accounting and listing only: an
    /// operation on named LVs reads them with [`LvmEngine::find_lvs`]).
    pub fn query_lvs(&self) -> Result<Vec<Lv>, EngineError> {
        self.lvs_report(&cmd::lvs(&self.vg))
    }

    fn lvs_report(&self, argv: &[String]) -> Result<Vec<Lv>, EngineError> {
        let out = self.run(argv)?;
        let lvs = report::parse_lvs(&out.stdout).map_err(|message| EngineError::BadOutput {
            argv: argv.join(" "),
            message,
        })?;
        Ok(lvs.into_iter().filter(|l| l.vg_name == self.vg).collect())
    }

    /// The LVs of the VG among `names`, read with one `lvs` that selects them: the output
    /// does not grow with the VG. Missing names are simply absent.
    pub fn find_lvs(&self, names: &[&str]) -> Result<Vec<Lv>, EngineError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        // The names go into an LVM selection (see `cmd::lvs_named`): checked here as well as
        // by each caller, so no name that could end its quotes ever reaches it.
        for name in names {
            check_name(name)?;
        }
        let lvs = self.lvs_report(&cmd::lvs_named(&self.vg, names))?;
        Ok(lvs
            .into_iter()
            .filter(|l| names.contains(&l.name.as_str()))
            .collect())
    }

    fn find_lv(&self, name: &str) -> Result<Option<Lv>, EngineError> {
        Ok(self.find_lvs(&[name])?.into_iter().next())
    }

    /// Whether an LV of the VG starts with a linear segment, read with one `lvs` that
    /// selects only such LVs (see [`cmd::lvs_linear`]).
    fn any_linear_lv(&self) -> Result<bool, EngineError> {
        let argv = cmd::lvs_linear(&self.vg);
        let out = self.run(&argv)?;
        let rows =
            report::parse_lv_segtypes(&out.stdout).map_err(|message| EngineError::BadOutput {
                argv: argv.join(" "),
                message,
            })?;
        Ok(rows
            .iter()
            .any(|r| r.vg_name == self.vg && r.segtype == "linear"))
    }

    fn lv_path(&self, lv: &Lv) -> PathBuf {
        if lv.path.is_empty() {
            PathBuf::from(format!("/dev/{}/{}", self.vg, lv.name))
        } else {
            PathBuf::from(&lv.path)
        }
    }

    fn to_info(&self, lv: &Lv) -> VolumeInfo {
        VolumeInfo {
            name: lv.name.clone(),
            uuid: Some(lv.uuid.clone()).filter(|u| !u.is_empty()),
            size_bytes: if lv.is_snapshot() {
                lv.origin_size.unwrap_or(lv.size)
            } else {
                lv.size
            },
            allocated_bytes: lv.size,
            path: self.lv_path(lv),
            snapshot_of: lv.origin.clone(),
            layout: match lv.segtype.as_str() {
                "striped" if lv.stripes > 1 => Some(LvLayout::Striped),
                "linear" | "striped" => Some(LvLayout::Linear),
                _ => None,
            },
            thin: lv.segtype == "thin",
        }
    }

    fn pool_info(&self, vg: &Vg, lvs: &[Lv]) -> PoolInfo {
        PoolInfo {
            name: vg.name.clone(),
            uuid: vg.uuid.clone(),
            total_bytes: vg.size,
            free_bytes: vg.free,
            allocation_unit: vg.extent_size,
            pv_count: vg.pv_count,
            reserved: lvs
                .iter()
                .filter(|l| l.name.starts_with(RESERVED_PREFIX))
                .map(|l| self.to_info(l))
                .collect(),
        }
    }

    /// The layout a new volume gets. `any_linear` (whether an LV of the VG starts with a
    /// linear segment) is called only when it decides: more than one PV and no layout asked.
    pub fn choose_layout(
        vg: &Vg,
        asked: Option<LvLayout>,
        any_linear: impl FnOnce() -> Result<bool, EngineError>,
    ) -> Result<LvLayout, EngineError> {
        if vg.pv_count <= 1 {
            return Ok(LvLayout::Linear);
        }
        if let Some(layout) = asked {
            return Ok(layout);
        }
        Ok(if any_linear()? {
            LvLayout::Linear
        } else {
            LvLayout::Striped
        })
    }

    /// Allocation unit of a layout: the extent, or pvCount × extent for striped.
    fn unit(vg: &Vg, layout: LvLayout, stripes: u32) -> u64 {
        match layout {
            LvLayout::Linear => vg.extent_size,
            LvLayout::Striped => vg.extent_size.saturating_mul(u64::from(stripes.max(1))),
        }
    }

    fn check_free(&self, vg: &Vg, name: &str, needed: u64) -> Result<(), EngineError> {
        if needed > vg.free {
            return Err(EngineError::NoSpace {
                pool: self.vg.clone(),
                name: name.to_string(),
                free: vg.free,
                needed,
            });
        }
        Ok(())
    }

    /// Runs an `lvcreate`; "already exists" is left for the caller's re-check, free-space
    /// refusals become [`EngineError::NoSpace`].
    fn lvcreate(
        &self,
        argv: &[String],
        vg: &Vg,
        name: &str,
        needed: u64,
    ) -> Result<(), EngineError> {
        let out = run_raw(self.runner.as_ref(), argv)?;
        if out.success() || out.stderr.contains("already exists") {
            return Ok(());
        }
        if out.stderr.contains("Insufficient free space") || out.stderr.contains("insufficient") {
            return Err(EngineError::NoSpace {
                pool: self.vg.clone(),
                name: name.to_string(),
                free: vg.free,
                needed,
            });
        }
        Err(command_failed(argv, &out))
    }

    fn created(&self, name: &str) -> Result<Lv, EngineError> {
        self.find_lv(name)?.ok_or_else(|| EngineError::NotFound {
            what: "volume",
            name: name.to_string(),
        })
    }

    fn check_same_size(name: &str, lv: &Lv, size: u64) -> Result<(), EngineError> {
        if lv.is_snapshot() {
            return Err(EngineError::Conflict {
                what: "volume",
                name: name.to_string(),
                detail: format!("as a snapshot of {}", lv.origin.clone().unwrap_or_default()),
            });
        }
        if lv.size != size {
            return Err(EngineError::SizeMismatch {
                what: "volume",
                name: name.to_string(),
                existing: lv.size,
                requested: size,
            });
        }
        Ok(())
    }

    /// Ensures the loop device of every file-backed PV; returns every PV device path.
    fn ensure_pv_devices(&self) -> Result<Vec<String>, EngineError> {
        let mut devs = Vec::with_capacity(self.pvs.len());
        for pv in &self.pvs {
            if !pv.device_path.is_empty() {
                devs.push(pv.device_path.clone());
                continue;
            }
            let file = Path::new(&pv.file_path);
            match std::fs::metadata(file) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if let Some(parent) = file.parent().filter(|p| !p.as_os_str().is_empty()) {
                        std::fs::create_dir_all(parent)
                            .map_err(|e| EngineError::io("create directory", parent, e))?;
                    }
                    self.run(&cmd::fallocate(file, pv.size))?;
                }
                Err(e) => return Err(EngineError::io("stat", file, e)),
            }
            let dev = attach_loop_file(self.runner.as_ref(), file)?;
            devs.push(dev.to_string_lossy().into_owned());
        }
        Ok(devs)
    }
}

impl PoolEngine for LvmEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::KernelLvm
    }

    fn ensure_pool(&self) -> Result<PoolInfo, EngineError> {
        let _g = self.guard();
        let devs = self.ensure_pv_devices()?;
        let vg = match self.query_vg()? {
            Some(vg) => vg,
            None if devs.is_empty() => {
                return Err(EngineError::NotFound {
                    what: "volume group",
                    name: self.vg.clone(),
                });
            }
            None => {
                self.run(&cmd::pvcreate(&devs))?;
                self.run(&cmd::vgcreate(&self.vg, &devs))?;
                self.require_vg()?
            }
        };
        let lvs = self.query_lvs()?;
        Ok(self.pool_info(&vg, &lvs))
    }

    fn info(&self) -> Result<PoolInfo, EngineError> {
        let vg = self.require_vg()?;
        let lvs = self.query_lvs()?;
        Ok(self.pool_info(&vg, &lvs))
    }

    fn create_volume(
        &self,
        name: &str,
        size: u64,
        opts: &VolumeOptions,
    ) -> Result<VolumeInfo, EngineError> {
        check_name(name)?;
        let _g = self.guard();
        let vg = self.require_vg()?;
        let layout = Self::choose_layout(&vg, opts.layout, || self.any_linear_lv())?;
        let size = round_size(name, size, Self::unit(&vg, layout, vg.pv_count))?;
        if let Some(lv) = self.find_lv(name)? {
            Self::check_same_size(name, &lv, size)?;
            return Ok(self.to_info(&lv));
        }
        self.check_free(&vg, name, size)?;
        let stripes = (layout == LvLayout::Striped).then_some(vg.pv_count);
        self.lvcreate(
            &cmd::lvcreate(&self.vg, name, size, stripes, None),
            &vg,
            name,
            size,
        )?;
        let lv = self.created(name)?;
        Self::check_same_size(name, &lv, size)?;
        Ok(self.to_info(&lv))
    }

    fn delete_volume(&self, name: &str) -> Result<(), EngineError> {
        check_name(name)?;
        let _g = self.guard();
        let Some(lv) = self.find_lv(name)? else {
            return Ok(());
        };
        if lv.is_snapshot() {
            return Err(EngineError::InvalidArgument(format!(
                "{name} is a snapshot; delete it with delete_snapshot"
            )));
        }
        self.run(&cmd::lvremove(&self.vg, name))?;
        Ok(())
    }

    fn resize_volume(&self, name: &str, new_size: u64) -> Result<VolumeInfo, EngineError> {
        check_name(name)?;
        let _g = self.guard();
        let vg = self.require_vg()?;
        let lv = self.find_lv(name)?.ok_or_else(|| EngineError::NotFound {
            what: "volume",
            name: name.to_string(),
        })?;
        if lv.is_snapshot() {
            return Err(EngineError::InvalidArgument(format!(
                "{name} is a snapshot; only volumes are resized"
            )));
        }
        let layout = if lv.segtype == "striped" && lv.stripes > 1 {
            LvLayout::Striped
        } else {
            LvLayout::Linear
        };
        let size = round_size(name, new_size, Self::unit(&vg, layout, lv.stripes))?;
        if size == lv.size {
            return Ok(self.to_info(&lv));
        }
        if size < lv.size {
            return Err(EngineError::Shrink {
                name: name.to_string(),
                current: lv.size,
                requested: size,
            });
        }
        self.check_free(&vg, name, size - lv.size)?;
        self.run(&cmd::lvextend(&self.vg, name, size))?;
        Ok(self.to_info(&self.created(name)?))
    }

    fn create_snapshot(
        &self,
        origin: &str,
        snap: &str,
        reserve_size: u64,
    ) -> Result<VolumeInfo, EngineError> {
        check_name(origin)?;
        check_name(snap)?;
        let _g = self.guard();
        let vg = self.require_vg()?;
        let lvs = self.find_lvs(&[snap, origin])?;
        if let Some(existing) = lvs.iter().find(|l| l.name == snap) {
            if existing.origin.as_deref() == Some(origin) {
                return Ok(self.to_info(existing));
            }
            return Err(EngineError::Conflict {
                what: "snapshot",
                name: snap.to_string(),
                detail: match &existing.origin {
                    Some(o) => format!("of {o}, asked of {origin}"),
                    None => "as a volume".to_string(),
                },
            });
        }
        let Some(orig) = lvs.iter().find(|l| l.name == origin) else {
            return Err(EngineError::NotFound {
                what: "volume",
                name: origin.to_string(),
            });
        };
        if orig.is_snapshot() {
            return Err(EngineError::InvalidArgument(format!(
                "{origin} is a snapshot; snapshots of snapshots are not supported"
            )));
        }
        let reserve = round_size(snap, reserve_size, vg.extent_size)?;
        self.check_free(&vg, snap, reserve)?;
        self.lvcreate(
            &cmd::lvcreate_snapshot(&self.vg, origin, snap, reserve),
            &vg,
            snap,
            reserve,
        )?;
        let lv = self.created(snap)?;
        if lv.origin.as_deref() != Some(origin) {
            return Err(EngineError::Conflict {
                what: "snapshot",
                name: snap.to_string(),
                detail: format!("of {:?}, asked of {origin}", lv.origin),
            });
        }
        Ok(self.to_info(&lv))
    }

    fn delete_snapshot(&self, snap: &str) -> Result<(), EngineError> {
        check_name(snap)?;
        let _g = self.guard();
        let Some(lv) = self.find_lv(snap)? else {
            return Ok(());
        };
        if !lv.is_snapshot() {
            return Err(EngineError::InvalidArgument(format!(
                "{snap} is a volume, not a snapshot"
            )));
        }
        self.run(&cmd::lvremove(&self.vg, snap))?;
        Ok(())
    }

    fn clone_from_snapshot(&self, snap: &str, new_name: &str) -> Result<VolumeInfo, EngineError> {
        check_name(snap)?;
        check_name(new_name)?;
        let _g = self.guard();
        let vg = self.require_vg()?;
        let lvs = self.find_lvs(&[new_name, snap])?;
        let existing = lvs.iter().find(|l| l.name == new_name);
        if let Some(lv) = existing
            && !lv.tags.iter().any(|t| t == cmd::CLONE_INCOMPLETE_TAG)
        {
            if lv.is_snapshot() {
                return Err(EngineError::Conflict {
                    what: "volume",
                    name: new_name.to_string(),
                    detail: "as a snapshot".to_string(),
                });
            }
            return Ok(self.to_info(lv));
        }
        let Some(src) = lvs.iter().find(|l| l.name == snap) else {
            return Err(EngineError::NotFound {
                what: "snapshot",
                name: snap.to_string(),
            });
        };
        if !src.is_snapshot() {
            return Err(EngineError::InvalidArgument(format!(
                "{snap} is a volume, not a snapshot"
            )));
        }
        let size = round_size(
            new_name,
            src.origin_size.unwrap_or(src.size),
            vg.extent_size,
        )?;
        if existing.is_none() {
            self.check_free(&vg, new_name, size)?;
            self.lvcreate(
                &cmd::lvcreate(
                    &self.vg,
                    new_name,
                    size,
                    None,
                    Some(cmd::CLONE_INCOMPLETE_TAG),
                ),
                &vg,
                new_name,
                size,
            )?;
        }
        let dst = self.created(new_name)?;
        self.run(&cmd::dd(&self.lv_path(src), &self.lv_path(&dst)))?;
        self.run(&cmd::lvchange_deltag(
            &self.vg,
            new_name,
            cmd::CLONE_INCOMPLETE_TAG,
        ))?;
        Ok(self.to_info(&self.created(new_name)?))
    }

    fn restore_snapshot(&self, snap: &str) -> Result<(), EngineError> {
        check_name(snap)?;
        let _g = self.guard();
        let lv = self.find_lv(snap)?.ok_or_else(|| EngineError::NotFound {
            what: "snapshot",
            name: snap.to_string(),
        })?;
        if !lv.is_snapshot() {
            return Err(EngineError::InvalidArgument(format!(
                "{snap} is a volume, not a snapshot"
            )));
        }
        if lv.is_merging() {
            return Ok(());
        }
        self.run(&cmd::lvconvert_merge(&self.vg, snap))?;
        Ok(())
    }

    fn list_volumes(&self) -> Result<Vec<VolumeInfo>, EngineError> {
        Ok(self
            .query_lvs()?
            .iter()
            .filter(|l| !l.name.starts_with(RESERVED_PREFIX))
            .map(|l| self.to_info(l))
            .collect())
    }

    fn device_path(&self, name: &str) -> Result<PathBuf, EngineError> {
        check_name(name)?;
        let lv = self.find_lv(name)?.ok_or_else(|| EngineError::NotFound {
            what: "volume",
            name: name.to_string(),
        })?;
        Ok(self.lv_path(&lv))
    }

    /// The counters of each LV's device-mapper device, found through the `/dev/<vg>/<lv>`
    /// link udev makes (no LVM command runs). An inactive or missing LV has none.
    fn io_stats(&self, names: &[String]) -> Result<Vec<(String, VolumeIo)>, EngineError> {
        let sys = Path::new(blkstat::SYS_BLOCK);
        Ok(names
            .iter()
            .filter(|n| check_name(n).is_ok())
            .filter_map(|n| {
                let dev = blkstat::kernel_name(&Path::new("/dev").join(&self.vg).join(n))?;
                let stat = blkstat::read_stat(sys, &dev)?;
                Some((n.clone(), VolumeIo::Block { dev, stat }))
            })
            .collect())
    }
}
