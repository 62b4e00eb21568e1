//! Pool engines: the data side of the agent behind one trait.
//!
//! An engine owns one pool on this node (an LVM volume group, an SPDK lvstore, or a directory
//! of sparse files) and carves volumes and snapshots out of it. Every mutation is idempotent:
//! creating what already exists with the same shape succeeds and returns it; deleting what is
//! missing succeeds. Sizes are rounded up to the engine's allocation unit and the rounded size
//! is what comes back, so callers store the real size (LiteIO stored the requested one).
//!
//! The trait is synchronous: engines run external commands or block on the filesystem, so an
//! async caller runs them through `tokio::task::spawn_blocking`. Engines are `Send + Sync` and
//! serialise their own mutations.
//!
//! External commands go through [`CommandRunner`] as argv vectors (never a shell string), so
//! tests can feed recorded output and assert the exact argv.

pub mod blkstat;
pub mod file;
pub mod lvm;
#[cfg(feature = "spdk")]
pub mod spdk;

use std::fmt;
use std::io;
use std::path::PathBuf;

use liteio_api::size::format_bytes;

pub use file::FileEngine;
pub use lvm::LvmEngine;

/// Which engine a pool uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EngineKind {
    /// A directory of sparse files.
    File,
    /// A kernel LVM volume group.
    KernelLvm,
    /// An SPDK logical volume store.
    SpdkLvs,
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::File => "File",
            Self::KernelLvm => "KernelLVM",
            Self::SpdkLvs => "SpdkLVStore",
        })
    }
}

/// How an LVM volume is laid out over the PVs (annotation `obnvmf/lv-layout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LvLayout {
    /// Concatenated extents.
    Linear,
    /// Striped over every PV (128 KiB stripes).
    Striped,
}

impl LvLayout {
    /// The annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Linear => "linear",
            Self::Striped => "striped",
        }
    }

    /// Parses the annotation value; anything else is `None` (engine default).
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "linear" => Some(Self::Linear),
            "striped" => Some(Self::Striped),
            _ => None,
        }
    }
}

impl fmt::Display for LvLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Options of [`PoolEngine::create_volume`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeOptions {
    /// Allocate on write where the engine supports it.
    pub thin: bool,
    /// LVM layout; `None` = the engine's default.
    pub layout: Option<LvLayout>,
}

/// A pool as the engine sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolInfo {
    /// VG / lvstore / pool name.
    pub name: String,
    /// VG or lvstore UUID; the file engine's pool id.
    pub uuid: String,
    /// Capacity in bytes.
    pub total_bytes: u64,
    /// Bytes still available for volumes.
    pub free_bytes: u64,
    /// Allocation unit: LVM extent, lvstore cluster, file engine rounding.
    pub allocation_unit: u64,
    /// Number of physical volumes (LVM), 0 elsewhere.
    pub pv_count: u32,
    /// Volumes present in the pool that are not ours to schedule (`reserved-*` LVs).
    pub reserved: Vec<VolumeInfo>,
}

/// A volume or snapshot in the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeInfo {
    /// Name in the pool.
    pub name: String,
    /// Engine UUID where there is one.
    pub uuid: Option<String>,
    /// Size of the device or file in bytes (the rounded size).
    pub size_bytes: u64,
    /// Space it takes from the pool (LVM snapshot: its COW reserve).
    pub allocated_bytes: u64,
    /// Local device or file path.
    pub path: PathBuf,
    /// For a snapshot, the volume it was taken from.
    pub snapshot_of: Option<String>,
    /// LVM layout, when known.
    pub layout: Option<LvLayout>,
    /// Allocated on write.
    pub thin: bool,
}

impl VolumeInfo {
    /// Whether this is a snapshot.
    pub fn is_snapshot(&self) -> bool {
        self.snapshot_of.is_some()
    }
}

/// Cumulative I/O counters of an SPDK bdev (`spdk_bdev_get_device_stat`), latencies summed
/// over every I/O and converted from ticks to microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BdevIo {
    /// Read operations.
    pub read_ops: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Sum of read latencies, µs.
    pub read_latency_us: u64,
    /// Write operations.
    pub write_ops: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Sum of write latencies, µs.
    pub write_latency_us: u64,
    /// Unmap (discard) operations.
    pub unmap_ops: u64,
    /// Bytes unmapped.
    pub bytes_unmapped: u64,
    /// Sum of unmap latencies, µs.
    pub unmap_latency_us: u64,
}

/// Where a volume's I/O counters come from, and the counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeIo {
    /// A kernel block device (`loop3`, `dm-2`): `/sys/block/<dev>/stat`.
    Block {
        /// Kernel device name.
        dev: String,
        /// Its counters.
        stat: blkstat::BlockStat,
    },
    /// An SPDK lvol bdev.
    Lvol {
        /// `lvs/lvol` alias.
        lvol: String,
        /// Its counters.
        stat: BdevIo,
    },
}

/// Small, stable classification of [`EngineError`]s: drives CSI codes, conditions and
/// metric labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The volume, snapshot or pool does not exist.
    NotFound,
    /// It exists with another size or origin.
    AlreadyExistsDifferent,
    /// The pool has too little free space.
    NoSpace,
    /// The engine or its filesystem cannot do this.
    Unsupported,
    /// A bad name, size or request (shrink, snapshot passed as volume, …).
    InvalidArgument,
    /// The object is in use (attached, merging).
    Busy,
    /// The pool cannot be used right now (a PV is lost).
    PoolUnavailable,
    /// A filesystem operation failed.
    Io,
    /// An external command failed or printed something we could not read.
    CommandFailed,
}

impl ErrorKind {
    /// A short label for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::AlreadyExistsDifferent => "already_exists_different",
            Self::NoSpace => "no_space",
            Self::Unsupported => "unsupported",
            Self::InvalidArgument => "invalid_argument",
            Self::Busy => "busy",
            Self::PoolUnavailable => "pool_unavailable",
            Self::Io => "io",
            Self::CommandFailed => "command_failed",
        }
    }
}

/// Why an engine operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// Missing object.
    #[error("{what} {name} not found")]
    NotFound {
        /// `volume`, `snapshot`, `pool`, …
        what: &'static str,
        /// Its name.
        name: String,
    },
    /// Same name, another size.
    #[error("{what} {name} exists with {}, asked {}", format_bytes(*existing), format_bytes(*requested))]
    SizeMismatch {
        /// `volume` or `snapshot`.
        what: &'static str,
        /// Its name.
        name: String,
        /// Size it has.
        existing: u64,
        /// Size asked (rounded).
        requested: u64,
    },
    /// Same name, another shape (origin, kind).
    #[error("{what} {name} already exists {detail}")]
    Conflict {
        /// `volume` or `snapshot`.
        what: &'static str,
        /// Its name.
        name: String,
        /// How it differs.
        detail: String,
    },
    /// Not enough space.
    #[error("pool {pool} has {} free, {name} needs {}", format_bytes(*free), format_bytes(*needed))]
    NoSpace {
        /// Pool name.
        pool: String,
        /// Object being created.
        name: String,
        /// Free bytes.
        free: u64,
        /// Bytes needed.
        needed: u64,
    },
    /// The engine cannot do it here.
    #[error("{op} is not supported on pool {pool}: {reason}")]
    Unsupported {
        /// Operation.
        op: &'static str,
        /// Pool name.
        pool: String,
        /// Why.
        reason: String,
    },
    /// Shrinking was asked.
    #[error("volume {name} has {}, cannot shrink to {}", format_bytes(*current), format_bytes(*requested))]
    Shrink {
        /// Volume.
        name: String,
        /// Current size.
        current: u64,
        /// Requested size.
        requested: u64,
    },
    /// A bad argument.
    #[error("{0}")]
    InvalidArgument(String),
    /// The embedded SPDK engine failed.
    #[cfg(feature = "spdk")]
    #[error(transparent)]
    Spdk(#[from] crate::spdk::SpdkError),
    /// In use.
    #[error("{what} {name} is busy: {reason}")]
    Busy {
        /// `volume` or `snapshot`.
        what: &'static str,
        /// Its name.
        name: String,
        /// Why.
        reason: String,
    },
    /// LVM reports a missing PV.
    #[error("volume group {vg} lost a physical volume: {stderr}")]
    PvLost {
        /// VG name.
        vg: String,
        /// LVM's message.
        stderr: String,
    },
    /// A filesystem call failed.
    #[error("cannot {op} {}", path.display())]
    Io {
        /// What was attempted.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A command could not be started.
    #[error("cannot run {program}")]
    Spawn {
        /// Program name.
        program: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A command exited non-zero.
    #[error("`{argv}` exited with {status}: {stderr}")]
    CommandFailed {
        /// The command line, space-joined for display.
        argv: String,
        /// Exit code or signal.
        status: String,
        /// Trimmed stderr.
        stderr: String,
    },
    /// A command's output could not be read.
    #[error("cannot read the output of `{argv}`: {message}")]
    BadOutput {
        /// The command line.
        argv: String,
        /// What was wrong.
        message: String,
    },
}

impl EngineError {
    /// The classification.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::SizeMismatch { .. } | Self::Conflict { .. } => ErrorKind::AlreadyExistsDifferent,
            Self::NoSpace { .. } => ErrorKind::NoSpace,
            Self::Unsupported { .. } => ErrorKind::Unsupported,
            Self::Shrink { .. } | Self::InvalidArgument(_) => ErrorKind::InvalidArgument,
            Self::Busy { .. } => ErrorKind::Busy,
            Self::PvLost { .. } => ErrorKind::PoolUnavailable,
            Self::Io { .. } => ErrorKind::Io,
            #[cfg(feature = "spdk")]
            Self::Spdk(e) => match e.kind() {
                crate::spdk::ErrorKind::NotFound => ErrorKind::NotFound,
                crate::spdk::ErrorKind::AlreadyExists => ErrorKind::AlreadyExistsDifferent,
                crate::spdk::ErrorKind::NoSpace => ErrorKind::NoSpace,
                crate::spdk::ErrorKind::InvalidArgument => ErrorKind::InvalidArgument,
                crate::spdk::ErrorKind::NotRunning | crate::spdk::ErrorKind::Timeout => {
                    ErrorKind::PoolUnavailable
                }
                _ => ErrorKind::CommandFailed,
            },
            Self::Spawn { .. } | Self::CommandFailed { .. } | Self::BadOutput { .. } => {
                ErrorKind::CommandFailed
            }
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// One pool on this node.
///
/// Every method may block (commands, filesystem): call from a blocking context.
pub trait PoolEngine: Send + Sync + fmt::Debug {
    /// Which engine this is.
    fn kind(&self) -> EngineKind;

    /// Creates the pool or loads the existing one; idempotent. Cleans up leftovers of
    /// interrupted operations that never became visible.
    fn ensure_pool(&self) -> Result<PoolInfo, EngineError>;

    /// Current capacity and free space of an existing pool.
    fn info(&self) -> Result<PoolInfo, EngineError>;

    /// Creates a volume of at least `size` bytes (rounded up to the allocation unit).
    /// Exists with the same rounded size: returns it. Another size: [`ErrorKind::AlreadyExistsDifferent`].
    fn create_volume(
        &self,
        name: &str,
        size: u64,
        opts: &VolumeOptions,
    ) -> Result<VolumeInfo, EngineError>;

    /// Deletes a volume; missing is success. Refuses a snapshot name.
    fn delete_volume(&self, name: &str) -> Result<(), EngineError>;

    /// Grows a volume to at least `new_size` (rounded). Same size: no-op. Smaller: error.
    fn resize_volume(&self, name: &str, new_size: u64) -> Result<VolumeInfo, EngineError>;

    /// Takes a snapshot `snap` of `origin`. `reserve_size` is the copy-on-write space for
    /// engines that need one (LVM); others ignore it. Exists with the same origin: returns it.
    fn create_snapshot(
        &self,
        origin: &str,
        snap: &str,
        reserve_size: u64,
    ) -> Result<VolumeInfo, EngineError>;

    /// Deletes a snapshot; missing is success. Refuses a volume name.
    fn delete_snapshot(&self, snap: &str) -> Result<(), EngineError>;

    /// Creates volume `new_name` with the content of `snap`. Exists: returns it.
    fn clone_from_snapshot(&self, snap: &str, new_name: &str) -> Result<VolumeInfo, EngineError>;

    /// Merges `snap` back into its origin (the origin gets the snapshot's content; the
    /// snapshot is consumed where the engine does so, as LVM does).
    fn restore_snapshot(&self, snap: &str) -> Result<(), EngineError>;

    /// Volumes and snapshots, reserved objects excluded.
    fn list_volumes(&self) -> Result<Vec<VolumeInfo>, EngineError>;

    /// Local path of a volume (LVM device, file engine image file).
    fn device_path(&self, name: &str) -> Result<PathBuf, EngineError>;

    /// Cumulative I/O counters of volumes `names`, for metrics; called at every scrape, so
    /// it must be cheap (no external commands). A volume without counters right now (not
    /// attached, gone) is left out; a volume with several devices appears once per device.
    /// The default has none.
    fn io_stats(&self, names: &[String]) -> Result<Vec<(String, VolumeIo)>, EngineError> {
        let _ = names;
        Ok(Vec::new())
    }
}

/// Longest volume or snapshot name accepted.
pub const MAX_NAME_LEN: usize = 127;

/// Checks a volume or snapshot name: 1–127 of `[A-Za-z0-9+_.-]`, not starting with `-` or
/// `.`. This is LVM's charset, and keeps names safe as file names.
pub fn check_name(name: &str) -> Result<(), EngineError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with(['-', '.'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+_.-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(EngineError::InvalidArgument(format!(
            "name {name:?} must be 1-{MAX_NAME_LEN} of [A-Za-z0-9+_.-], not starting with - or ."
        )))
    }
}

/// Rounds `size` up to `unit`, refusing zero and overflow.
pub fn round_size(name: &str, size: u64, unit: u64) -> Result<u64, EngineError> {
    if size == 0 {
        return Err(EngineError::InvalidArgument(format!(
            "size of {name} must be positive"
        )));
    }
    liteio_api::size::round_up(size, unit)
        .map_err(|e| EngineError::InvalidArgument(format!("size of {name}: {e}")))
}

pub use liteio_node::cmd::{CommandRunner, Output as CmdOutput, SystemRunner, argv};
pub use liteio_node::losetup::parse_losetup_j;

/// Runs `argv`; a spawn failure becomes [`EngineError::Spawn`]. Non-zero exits are returned
/// as outputs for the caller to interpret.
pub(crate) fn run_raw(
    runner: &dyn CommandRunner,
    argv: &[String],
) -> Result<CmdOutput, EngineError> {
    runner.run(argv).map_err(|source| EngineError::Spawn {
        program: argv.first().cloned().unwrap_or_default(),
        source,
    })
}

/// Runs `argv` and turns a non-zero exit into [`EngineError::CommandFailed`].
pub(crate) fn run_ok(
    runner: &dyn CommandRunner,
    argv: &[String],
) -> Result<CmdOutput, EngineError> {
    let out = run_raw(runner, argv)?;
    if out.success() {
        Ok(out)
    } else {
        Err(command_failed(argv, &out))
    }
}

pub(crate) fn command_failed(argv: &[String], out: &CmdOutput) -> EngineError {
    EngineError::CommandFailed {
        argv: liteio_node::cmd::argv_line(argv),
        status: out
            .code
            .map_or_else(|| "a signal".to_string(), |c| c.to_string()),
        stderr: out.stderr.trim().to_string(),
    }
}

impl From<liteio_node::losetup::LoopError> for EngineError {
    fn from(e: liteio_node::losetup::LoopError) -> Self {
        use liteio_node::losetup::LoopError;
        match e {
            LoopError::Run { argv, source } => EngineError::Spawn {
                program: argv,
                source,
            },
            LoopError::Failed {
                argv,
                status,
                stderr,
            } => EngineError::CommandFailed {
                argv,
                status,
                stderr,
            },
            LoopError::BadOutput { argv, printed } => EngineError::BadOutput {
                argv,
                message: format!("expected a /dev path, got {printed:?}"),
            },
        }
    }
}

/// Loop devices bound to `file` (`losetup -j`).
pub(crate) fn loop_devices_for(
    runner: &dyn CommandRunner,
    file: &std::path::Path,
) -> Result<Vec<PathBuf>, EngineError> {
    Ok(liteio_node::losetup::loops_for(runner, file)?)
}

/// Binds `file` to a loop device, or returns the one already bound (idempotent).
pub(crate) fn attach_loop_file(
    runner: &dyn CommandRunner,
    file: &std::path::Path,
) -> Result<PathBuf, EngineError> {
    Ok(liteio_node::losetup::attach(runner, file)?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn names() {
        for ok in ["pvc-1", "a", "vol_snap", "x.y+z"] {
            check_name(ok).unwrap();
        }
        for bad in ["", "-a", ".a", "a/b", "a b", "a@b", &"x".repeat(128)] {
            assert_eq!(
                check_name(bad).unwrap_err().kind(),
                ErrorKind::InvalidArgument,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn error_messages_show_fields() {
        let e = EngineError::SizeMismatch {
            what: "volume",
            name: "pvc-1".into(),
            existing: 2 << 30,
            requested: 4 << 30,
        };
        assert_eq!(
            e.to_string(),
            "volume pvc-1 exists with 2.0 GiB, asked 4.0 GiB"
        );
        assert_eq!(e.kind(), ErrorKind::AlreadyExistsDifferent);
        let e = EngineError::NoSpace {
            pool: "node-3".into(),
            name: "pvc-2".into(),
            free: 2 << 30,
            needed: 10 << 30,
        };
        assert_eq!(
            e.to_string(),
            "pool node-3 has 2.0 GiB free, pvc-2 needs 10.0 GiB"
        );
    }
}
