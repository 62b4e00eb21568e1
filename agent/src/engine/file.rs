//! File engine: a pool is a directory, a volume a sparse file.
//!
//! Layout under the pool directory:
//!
//! ```text
//! <dir>/pool-id                     the pool's UUID, written once
//! <dir>/volumes/<name>.img          a volume: a sparse file of the volume's size
//! <dir>/snapshots/<snap>@<origin>.img   a snapshot of <origin>: a reflink copy
//! <dir>/{volumes,snapshots}/.*.tmp  work files; removed by ensure_pool
//! ```
//!
//! Nothing else is persisted: listing scans the directories, so a restarted agent sees
//! exactly what exists. Every object appears by one `rename` of a finished work file, so an
//! interrupted create leaves at most a `.tmp` file and never a half-made volume.
//!
//! **Space accounting is thick**: capacity is the filesystem size (statvfs), capped by the
//! configured size; free = capacity − Σ(size of every volume and snapshot file), and never
//! more than the filesystem's real free space. Files stay sparse, so the accounting is a
//! promise the engine keeps, not what the disk shows. `thin` is accepted and ignored.
//!
//! Snapshots, clones and restores use reflinks (`FICLONE`): XFS with `reflink=1` and btrfs
//! support them; elsewhere (ext4, tmpfs) they fail with [`ErrorKind::Unsupported`](super::ErrorKind).
//! A local consumer gets a block device from [`FileEngine::attach_loop`].

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use liteio_api::size::VOLUME_UNIT;
use rustix::io::Errno;

use super::{
    CommandRunner, EngineError, EngineKind, PoolEngine, PoolInfo, SystemRunner, VolumeInfo,
    VolumeIo, VolumeOptions, argv, attach_loop_file, blkstat, check_name, loop_devices_for,
    round_size, run_ok,
};

const VOLUMES: &str = "volumes";
const SNAPSHOTS: &str = "snapshots";
const IMG: &str = ".img";
const TMP: &str = ".tmp";
const POOL_ID: &str = "pool-id";

/// A pool of sparse files in a directory.
#[derive(Debug)]
pub struct FileEngine {
    name: String,
    dir: PathBuf,
    cap: u64,
    runner: Arc<dyn CommandRunner>,
    /// Serialises mutations; holds the bytes the pool's volumes and snapshots take, counted
    /// once by a scan (`None` until then) and kept up to date by every mutation, so that a
    /// create checks its space without a walk over every file of the pool.
    lock: Mutex<Option<u64>>,
}

impl FileEngine {
    /// A pool `name` in `dir`, capped at `cap` bytes (0 = the filesystem's size).
    pub fn new(name: impl Into<String>, dir: impl Into<PathBuf>, cap: u64) -> Self {
        Self::with_runner(name, dir, cap, Arc::new(SystemRunner::new()))
    }

    /// Like [`FileEngine::new`] with a command runner for `losetup`.
    pub fn with_runner(
        name: impl Into<String>,
        dir: impl Into<PathBuf>,
        cap: u64,
        runner: Arc<dyn CommandRunner>,
    ) -> Self {
        Self {
            name: name.into(),
            dir: dir.into(),
            cap,
            runner,
            lock: Mutex::new(None),
        }
    }

    /// The pool directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn guard(&self) -> MutexGuard<'_, Option<u64>> {
        // A panic elsewhere leaves no half state here (renames are atomic), so go on.
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn volumes_dir(&self) -> PathBuf {
        self.dir.join(VOLUMES)
    }

    fn snapshots_dir(&self) -> PathBuf {
        self.dir.join(SNAPSHOTS)
    }

    fn volume_file(&self, name: &str) -> PathBuf {
        self.volumes_dir().join(format!("{name}{IMG}"))
    }

    fn snapshot_file(&self, snap: &str, origin: &str) -> PathBuf {
        self.snapshots_dir().join(format!("{snap}@{origin}{IMG}"))
    }

    fn tmp_file(dir: &Path, name: &str) -> PathBuf {
        dir.join(format!(".{name}{TMP}"))
    }

    /// Size of a file, `None` when missing.
    fn file_size(path: &Path) -> Result<Option<u64>, EngineError> {
        match fs::metadata(path) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(EngineError::io("stat", path, e)),
        }
    }

    fn volume_info(&self, name: &str, size: u64) -> VolumeInfo {
        VolumeInfo {
            name: name.to_string(),
            uuid: None,
            size_bytes: size,
            allocated_bytes: size,
            path: self.volume_file(name),
            snapshot_of: None,
            layout: None,
            thin: false,
        }
    }

    /// Finds snapshot `snap`: its origin and file.
    fn find_snapshot(&self, snap: &str) -> Result<Option<VolumeInfo>, EngineError> {
        Ok(self.scan_snapshots()?.into_iter().find(|s| s.name == snap))
    }

    fn scan_snapshots(&self) -> Result<Vec<VolumeInfo>, EngineError> {
        let mut out = Vec::new();
        for (stem, path, size) in scan_images(&self.snapshots_dir())? {
            if let Some((snap, origin)) = stem.split_once('@') {
                out.push(VolumeInfo {
                    name: snap.to_string(),
                    uuid: None,
                    size_bytes: size,
                    allocated_bytes: size,
                    path,
                    snapshot_of: Some(origin.to_string()),
                    layout: None,
                    thin: false,
                });
            }
        }
        Ok(out)
    }

    fn scan_volumes(&self) -> Result<Vec<VolumeInfo>, EngineError> {
        Ok(scan_images(&self.volumes_dir())?
            .into_iter()
            .map(|(name, _, size)| self.volume_info(&name, size))
            .collect())
    }

    fn pool_id(&self) -> Result<String, EngineError> {
        let path = self.dir.join(POOL_ID);
        match fs::read_to_string(&path) {
            Ok(s) if !s.trim().is_empty() => Ok(s.trim().to_string()),
            Ok(_) => Err(EngineError::InvalidArgument(format!(
                "pool id file {} is empty",
                path.display()
            ))),
            Err(e) => Err(EngineError::io("read", path, e)),
        }
    }

    /// The bytes taken (see `lock`), scanned when not counted yet.
    fn used(&self, counted: &mut Option<u64>) -> Result<u64, EngineError> {
        if let Some(u) = *counted {
            return Ok(u);
        }
        let used = self
            .scan_volumes()?
            .iter()
            .chain(self.scan_snapshots()?.iter())
            .map(|v| v.allocated_bytes)
            .sum();
        *counted = Some(used);
        Ok(used)
    }

    /// `bytes` more are taken.
    fn charge(counted: &mut Option<u64>, bytes: u64) {
        if let Some(u) = counted.as_mut() {
            *u = u.saturating_add(bytes);
        }
    }

    /// `bytes` were given back.
    fn refund(counted: &mut Option<u64>, bytes: u64) {
        if let Some(u) = counted.as_mut() {
            *u = u.saturating_sub(bytes);
        }
    }

    fn compute_info(&self, used: u64) -> Result<PoolInfo, EngineError> {
        let uuid = self.pool_id()?;
        let st = rustix::fs::statvfs(&self.dir)
            .map_err(|e| EngineError::io("statvfs", &self.dir, e.into()))?;
        let fs_total = st.f_blocks.saturating_mul(st.f_frsize);
        let fs_avail = st.f_bavail.saturating_mul(st.f_frsize);
        let total = if self.cap > 0 {
            fs_total.min(self.cap)
        } else {
            fs_total
        };
        Ok(PoolInfo {
            name: self.name.clone(),
            uuid,
            total_bytes: total,
            free_bytes: total.saturating_sub(used).min(fs_avail),
            allocation_unit: VOLUME_UNIT,
            pv_count: 0,
            reserved: Vec::new(),
        })
    }

    fn check_space(
        &self,
        counted: &mut Option<u64>,
        name: &str,
        needed: u64,
    ) -> Result<(), EngineError> {
        let used = self.used(counted)?;
        let info = self.compute_info(used)?;
        if needed > info.free_bytes {
            return Err(EngineError::NoSpace {
                pool: self.name.clone(),
                name: name.to_string(),
                free: info.free_bytes,
                needed,
            });
        }
        Ok(())
    }

    /// Reflinks `src` into a fresh work file `tmp`, then renames it to `dst`.
    fn reflink_to(
        &self,
        op: &'static str,
        src: &Path,
        tmp: &Path,
        dst: &Path,
    ) -> Result<(), EngineError> {
        let source = File::open(src).map_err(|e| EngineError::io("open", src, e))?;
        let target = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(tmp)
            .map_err(|e| EngineError::io("create", tmp, e))?;
        if let Err(errno) = rustix::fs::ioctl_ficlone(&target, &source) {
            drop(target);
            let _ = fs::remove_file(tmp);
            return Err(self.reflink_error(op, src, errno));
        }
        drop(target);
        fs::rename(tmp, dst).map_err(|e| EngineError::io("rename", tmp, e))
    }

    fn reflink_error(&self, op: &'static str, src: &Path, errno: Errno) -> EngineError {
        if [
            Errno::OPNOTSUPP,
            Errno::NOTTY,
            Errno::INVAL,
            Errno::XDEV,
            Errno::NOSYS,
        ]
        .contains(&errno)
        {
            EngineError::Unsupported {
                op,
                pool: self.name.clone(),
                reason: format!(
                    "the filesystem of {} does not support reflinks (FICLONE: {errno}); use XFS with reflink=1 or btrfs",
                    self.dir.display()
                ),
            }
        } else {
            EngineError::io("reflink", src, errno.into())
        }
    }

    /// Whether the pool's filesystem supports reflinks (probes with two work files).
    pub fn supports_reflink(&self) -> Result<bool, EngineError> {
        dir_supports_reflink(&self.volumes_dir())
    }

    /// Loop devices currently bound to volume `name`.
    pub fn loop_devices(&self, name: &str) -> Result<Vec<PathBuf>, EngineError> {
        check_name(name)?;
        loop_devices_for(self.runner.as_ref(), &self.volume_file(name))
    }

    /// Binds volume `name` to a loop device and returns it; returns the bound one if any.
    pub fn attach_loop(&self, name: &str) -> Result<PathBuf, EngineError> {
        check_name(name)?;
        let _g = self.guard();
        let file = self.volume_file(name);
        if Self::file_size(&file)?.is_none() {
            return Err(EngineError::NotFound {
                what: "volume",
                name: name.to_string(),
            });
        }
        attach_loop_file(self.runner.as_ref(), &file)
    }

    /// Unbinds every loop device of volume `name`; none bound is success.
    pub fn detach_loop(&self, name: &str) -> Result<(), EngineError> {
        check_name(name)?;
        let _g = self.guard();
        self.detach_all(&self.volume_file(name))
    }

    fn detach_all(&self, file: &Path) -> Result<(), EngineError> {
        for dev in loop_devices_for(self.runner.as_ref(), file)? {
            if let Err(e) = run_ok(
                self.runner.as_ref(),
                &argv(&["losetup", "-d", &dev.to_string_lossy()]),
            ) {
                // Another detach (or the kernel's deferred autoclear) may have won the race.
                if loop_devices_for(self.runner.as_ref(), file)?.contains(&dev) {
                    return Err(e);
                }
            }
        }
        // The kernel finishes a detach when the last opener closes the device (a concurrent
        // `losetup` scan can hold it for a moment), so the device may stay listed briefly.
        Ok(())
    }

    fn not_found(what: &'static str, name: &str) -> EngineError {
        EngineError::NotFound {
            what,
            name: name.to_string(),
        }
    }
}

/// `(stem, path, size)` of every `*.img` in `dir` (work files and others skipped).
fn scan_images(dir: &Path) -> Result<Vec<(String, PathBuf, u64)>, EngineError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(EngineError::io("list", dir, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| EngineError::io("list", dir, e))?;
        let fname = entry.file_name();
        let Some(fname) = fname.to_str() else {
            continue;
        };
        if fname.starts_with('.') {
            continue;
        }
        let Some(stem) = fname.strip_suffix(IMG) else {
            continue;
        };
        let path = entry.path();
        match entry.metadata() {
            Ok(m) if m.is_file() => out.push((stem.to_string(), path, m.len())),
            Ok(_) => {}
            // Deleted between readdir and stat.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(EngineError::io("stat", path, e)),
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

impl PoolEngine for FileEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::File
    }

    fn ensure_pool(&self) -> Result<PoolInfo, EngineError> {
        let mut g = self.guard();
        // Count again: the files may have changed while the pool was not ours.
        *g = None;
        for d in [self.volumes_dir(), self.snapshots_dir()] {
            fs::create_dir_all(&d).map_err(|e| EngineError::io("create directory", &d, e))?;
            // Work files of interrupted operations never became objects.
            let entries = fs::read_dir(&d).map_err(|e| EngineError::io("list", &d, e))?;
            for entry in entries.flatten() {
                let n = entry.file_name();
                if n.to_str()
                    .is_some_and(|n| n.starts_with('.') && n.ends_with(TMP))
                {
                    let p = entry.path();
                    fs::remove_file(&p).map_err(|e| EngineError::io("remove", &p, e))?;
                }
            }
        }
        let id_path = self.dir.join(POOL_ID);
        if Self::file_size(&id_path)?.is_none() {
            let tmp = self.dir.join(format!(".{POOL_ID}{TMP}"));
            fs::write(&tmp, format!("{}\n", uuid::Uuid::new_v4()))
                .map_err(|e| EngineError::io("write", &tmp, e))?;
            fs::rename(&tmp, &id_path).map_err(|e| EngineError::io("rename", &tmp, e))?;
        }
        let used = self.used(&mut g)?;
        self.compute_info(used)
    }

    fn info(&self) -> Result<PoolInfo, EngineError> {
        let used = self.used(&mut self.guard())?;
        self.compute_info(used)
    }

    fn create_volume(
        &self,
        name: &str,
        size: u64,
        _opts: &VolumeOptions,
    ) -> Result<VolumeInfo, EngineError> {
        check_name(name)?;
        let size = round_size(name, size, VOLUME_UNIT)?;
        let mut g = self.guard();
        let file = self.volume_file(name);
        if let Some(existing) = Self::file_size(&file)? {
            if existing == size {
                return Ok(self.volume_info(name, size));
            }
            return Err(EngineError::SizeMismatch {
                what: "volume",
                name: name.to_string(),
                existing,
                requested: size,
            });
        }
        self.check_space(&mut g, name, size)?;
        let tmp = Self::tmp_file(&self.volumes_dir(), name);
        let f = File::create(&tmp).map_err(|e| EngineError::io("create", &tmp, e))?;
        f.set_len(size)
            .map_err(|e| EngineError::io("truncate", &tmp, e))?;
        drop(f);
        fs::rename(&tmp, &file).map_err(|e| EngineError::io("rename", &tmp, e))?;
        Self::charge(&mut g, size);
        Ok(self.volume_info(name, size))
    }

    fn delete_volume(&self, name: &str) -> Result<(), EngineError> {
        check_name(name)?;
        let mut g = self.guard();
        let file = self.volume_file(name);
        let Some(size) = Self::file_size(&file)? else {
            // Volumes and snapshots live in separate directories: a snapshot that has this
            // name is another object and stays; deleting a volume that is not there is done.
            return Ok(());
        };
        self.detach_all(&file)?;
        match fs::remove_file(&file) {
            Ok(()) => {
                Self::refund(&mut g, size);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(EngineError::io("remove", file, e)),
        }
    }

    fn resize_volume(&self, name: &str, new_size: u64) -> Result<VolumeInfo, EngineError> {
        check_name(name)?;
        let size = round_size(name, new_size, VOLUME_UNIT)?;
        let mut g = self.guard();
        let file = self.volume_file(name);
        let current = Self::file_size(&file)?.ok_or_else(|| Self::not_found("volume", name))?;
        if size == current {
            return Ok(self.volume_info(name, size));
        }
        if size < current {
            return Err(EngineError::Shrink {
                name: name.to_string(),
                current,
                requested: size,
            });
        }
        self.check_space(&mut g, name, size - current)?;
        let f = OpenOptions::new()
            .write(true)
            .open(&file)
            .map_err(|e| EngineError::io("open", &file, e))?;
        f.set_len(size)
            .map_err(|e| EngineError::io("truncate", &file, e))?;
        drop(f);
        Self::charge(&mut g, size - current);
        // Attached loop devices learn the new size.
        for dev in loop_devices_for(self.runner.as_ref(), &file)? {
            run_ok(
                self.runner.as_ref(),
                &argv(&["losetup", "-c", &dev.to_string_lossy()]),
            )?;
        }
        Ok(self.volume_info(name, size))
    }

    fn create_snapshot(
        &self,
        origin: &str,
        snap: &str,
        _reserve_size: u64,
    ) -> Result<VolumeInfo, EngineError> {
        check_name(origin)?;
        check_name(snap)?;
        let mut g = self.guard();
        if let Some(existing) = self.find_snapshot(snap)? {
            if existing.snapshot_of.as_deref() == Some(origin) {
                return Ok(existing);
            }
            return Err(EngineError::Conflict {
                what: "snapshot",
                name: snap.to_string(),
                detail: format!(
                    "of {}, asked of {origin}",
                    existing.snapshot_of.unwrap_or_default()
                ),
            });
        }
        if Self::file_size(&self.volume_file(snap))?.is_some() {
            return Err(EngineError::Conflict {
                what: "volume",
                name: snap.to_string(),
                detail: "with that name; a snapshot cannot take it".to_string(),
            });
        }
        let src = self.volume_file(origin);
        let size = Self::file_size(&src)?.ok_or_else(|| Self::not_found("volume", origin))?;
        self.check_space(&mut g, snap, size)?;
        let dst = self.snapshot_file(snap, origin);
        let tmp = Self::tmp_file(&self.snapshots_dir(), snap);
        self.reflink_to("snapshot", &src, &tmp, &dst)?;
        Self::charge(&mut g, size);
        Ok(VolumeInfo {
            name: snap.to_string(),
            uuid: None,
            size_bytes: size,
            allocated_bytes: size,
            path: dst,
            snapshot_of: Some(origin.to_string()),
            layout: None,
            thin: false,
        })
    }

    fn delete_snapshot(&self, snap: &str) -> Result<(), EngineError> {
        check_name(snap)?;
        let mut g = self.guard();
        let Some(found) = self.find_snapshot(snap)? else {
            // Not there (a volume with this name is another object and stays): done. A
            // snapshot whose creation was refused must not block its own deletion.
            return Ok(());
        };
        match fs::remove_file(&found.path) {
            Ok(()) => {
                Self::refund(&mut g, found.allocated_bytes);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(EngineError::io("remove", found.path, e)),
        }
    }

    fn clone_from_snapshot(&self, snap: &str, new_name: &str) -> Result<VolumeInfo, EngineError> {
        check_name(snap)?;
        check_name(new_name)?;
        let mut g = self.guard();
        let dst = self.volume_file(new_name);
        if let Some(size) = Self::file_size(&dst)? {
            return Ok(self.volume_info(new_name, size));
        }
        let found = self
            .find_snapshot(snap)?
            .ok_or_else(|| Self::not_found("snapshot", snap))?;
        self.check_space(&mut g, new_name, found.size_bytes)?;
        let tmp = Self::tmp_file(&self.volumes_dir(), new_name);
        self.reflink_to("clone", &found.path, &tmp, &dst)?;
        Self::charge(&mut g, found.size_bytes);
        Ok(self.volume_info(new_name, found.size_bytes))
    }

    fn restore_snapshot(&self, snap: &str) -> Result<(), EngineError> {
        check_name(snap)?;
        let mut g = self.guard();
        let found = self
            .find_snapshot(snap)?
            .ok_or_else(|| Self::not_found("snapshot", snap))?;
        let origin = found.snapshot_of.unwrap_or_default();
        let dst = self.volume_file(&origin);
        if Self::file_size(&dst)?.is_none() {
            return Err(Self::not_found("volume", &origin));
        }
        // A loop device keeps the old inode after the rename: refuse rather than lie.
        let devs = loop_devices_for(self.runner.as_ref(), &dst)?;
        if !devs.is_empty() {
            return Err(EngineError::Busy {
                what: "volume",
                name: origin,
                reason: format!(
                    "attached to {}; detach it before restoring {snap}",
                    devs[0].display()
                ),
            });
        }
        let tmp = Self::tmp_file(&self.volumes_dir(), &origin);
        // The origin takes the snapshot's size: count again on the next check.
        *g = None;
        // Unlike LVM's merge the snapshot is kept: restoring twice gives the same result.
        self.reflink_to("restore", &found.path, &tmp, &dst)
    }

    fn list_volumes(&self) -> Result<Vec<VolumeInfo>, EngineError> {
        let mut all = self.scan_volumes()?;
        all.extend(self.scan_snapshots()?);
        Ok(all)
    }

    fn device_path(&self, name: &str) -> Result<PathBuf, EngineError> {
        check_name(name)?;
        let file = self.volume_file(name);
        match Self::file_size(&file)? {
            Some(_) => Ok(file),
            None => Err(Self::not_found("volume", name)),
        }
    }

    /// The counters of every loop device bound to a volume's file (sysfs only, no
    /// `losetup`; one scan of the loop devices per call). A volume that is not attached has
    /// none.
    fn io_stats(&self, names: &[String]) -> Result<Vec<(String, VolumeIo)>, EngineError> {
        let sys = Path::new(blkstat::SYS_BLOCK);
        let loops = blkstat::loop_backing_files(sys);
        let mut out = Vec::new();
        if loops.is_empty() {
            return Ok(out);
        }
        for name in names {
            // The kernel records the resolved path of the backing file.
            let Ok(file) = fs::canonicalize(self.volume_file(name)) else {
                continue;
            };
            for (dev, _) in loops.iter().filter(|(_, b)| *b == file) {
                if let Some(stat) = blkstat::read_stat(sys, dev) {
                    out.push((
                        name.clone(),
                        VolumeIo::Block {
                            dev: dev.clone(),
                            stat,
                        },
                    ));
                }
            }
        }
        Ok(out)
    }
}

/// Whether the file system of `dir` (an existing, writable directory) supports reflinks:
/// probes with two work files there, removed afterwards.
pub fn dir_supports_reflink(dir: &Path) -> Result<bool, EngineError> {
    let a = FileEngine::tmp_file(dir, "reflink-probe-a");
    let b = FileEngine::tmp_file(dir, "reflink-probe-b");
    let result = (|| {
        // FICLONE reads the source: open it read-write, not write-only.
        let src = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&a)
            .map_err(|e| EngineError::io("create", &a, e))?;
        src.set_len(VOLUME_UNIT)
            .map_err(|e| EngineError::io("truncate", &a, e))?;
        let dst = File::create(&b).map_err(|e| EngineError::io("create", &b, e))?;
        Ok(rustix::fs::ioctl_ficlone(&dst, &src).is_ok())
    })();
    let _ = fs::remove_file(&a);
    let _ = fs::remove_file(&b);
    result
}
