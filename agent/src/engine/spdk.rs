//! The SPDK lvstore engine: a pool is an lvstore on a base bdev (aio over a file or block
//! device, RAM for tests, NVMe controllers over VFIO striped as raid0), a volume is an lvol.
//!
//! The [`PoolEngine`] trait is synchronous; this engine blocks on the embedded runtime's
//! async calls (`futures::executor::block_on`: the futures only wait on SPDK's reply
//! channels, so they need no particular executor). Call it from a blocking context.

use std::path::PathBuf;
use std::sync::RwLock;

use futures::executor::block_on;

use super::{
    BdevIo, EngineError, EngineKind, PoolEngine, PoolInfo, VolumeInfo, VolumeIo, VolumeOptions,
    check_name,
};
use crate::spdk::{ErrorKind as SpdkKind, SpdkError, bdev, initiator, lvol, raid};

/// What the lvstore sits on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BaseBdev {
    /// Linux AIO over a file (created with `size` bytes when missing and `create` is set) or a
    /// block device.
    Aio {
        /// Bdev name.
        name: String,
        /// File or device.
        path: PathBuf,
        /// Size of a file to create.
        size: u64,
        /// Create the file when missing.
        create: bool,
    },
    /// RAM (tests): `size` bytes.
    Malloc {
        /// Bdev name.
        name: String,
        /// Size in bytes.
        size: u64,
    },
    /// Namespace 1 of an NVMe controller taken over from the kernel (VFIO or UIO).
    Nvme {
        /// Namespace bdev name, `<ctrlr>n1` (SPDK's naming).
        name: String,
        /// Controller name.
        ctrlr: String,
        /// PCI address, `0000:01:00.0`.
        pci_address: String,
    },
    /// RAID0 striped over `members` (a `raidBdev` pool's NVMe devices).
    Raid0 {
        /// Raid bdev name.
        name: String,
        /// The striped bdevs, created first.
        members: Vec<BaseBdev>,
        /// Strip size in KiB.
        strip_kb: u32,
    },
}

/// How much of a new pool file is written with zeroes: the head, where the blobstore keeps
/// its metadata (one 4 KiB page per cluster by default, 1/1024 of the size with the agent's
/// 4 MiB clusters), plus 16 MiB for its super block and masks.
pub fn pool_file_head(size: u64) -> u64 {
    (size / 1024 + (16 << 20)).min(size)
}

/// Creates the file of an aio pool: `size` bytes, the first [`pool_file_head`] of them
/// written with zeroes and the rest sparse. A hole costs the file system an allocation when
/// it is first written, and SPDK submits its I/O on the reactor: on ext4, a metadata write
/// into a hole blocked the reactor for seconds (issue 17), stalling every volume of the
/// node. A file left half-written (no space) is removed.
pub fn create_pool_file(path: &std::path::Path, size: u64) -> Result<(), EngineError> {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(path)
        .map_err(|e| EngineError::io("create", path, e))?;
    // From here on the file is ours: on failure it is removed.
    let mut write = || -> std::io::Result<()> {
        // The size first: one the file system cannot hold fails here, before any writing.
        f.set_len(size)?;
        let head = pool_file_head(size);
        let zeroes = vec![0u8; 1 << 20];
        let mut done = 0;
        while done < head {
            let n = usize::try_from((head - done).min(1 << 20)).unwrap_or(1 << 20);
            f.write_all(&zeroes[..n])?;
            done += n as u64;
        }
        f.sync_all()
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(path);
        EngineError::io("create", path, e)
    })
}

impl BaseBdev {
    /// The bdev the lvstore sits on.
    pub fn name(&self) -> &str {
        match self {
            Self::Aio { name, .. }
            | Self::Malloc { name, .. }
            | Self::Nvme { name, .. }
            | Self::Raid0 { name, .. } => name,
        }
    }

    /// Whether this is an aio bdev over a regular file (not a block device). A file that does
    /// not exist yet is one the engine creates.
    fn is_file(&self) -> bool {
        match self {
            Self::Aio { path, .. } => std::fs::metadata(path).map_or(true, |m| m.is_file()),
            Self::Raid0 { members, .. } => members.iter().all(Self::is_file),
            _ => false,
        }
    }

    /// How the lvstore's lvols clear the clusters they give back, so that no new volume
    /// reads a deleted one's data: a punched hole over files (zeroes, and the file stays
    /// sparse; the aio bdev is created with `fallocate` for it), write-zeroes elsewhere.
    pub fn clear(&self) -> lvol::Clear {
        if self.is_file() {
            lvol::Clear::Unmap
        } else {
            lvol::Clear::WriteZeroes
        }
    }

    /// The controller at `pci_address` named `ctrlr`; its namespace 1 is the bdev.
    pub fn nvme(ctrlr: &str, pci_address: &str) -> Self {
        Self::Nvme {
            name: format!("{ctrlr}n1"),
            ctrlr: ctrlr.into(),
            pci_address: pci_address.into(),
        }
    }

    /// Create (or find) this bdev and what it is built on. Idempotent.
    fn ensure(&self) -> Result<(), EngineError> {
        match self {
            Self::Aio {
                name,
                path,
                size,
                create,
            } => {
                if !path.exists() && *create {
                    create_pool_file(path, *size)?;
                }
                // With fallocate over a file, so that its unmaps punch holes (see `clear`);
                // a block device keeps SPDK's own write-zeroes.
                let file = std::fs::metadata(path).is_ok_and(|m| m.is_file());
                block_on(bdev::create_aio_with(name, path, 512, file)).map_err(map)?;
            }
            Self::Malloc { name, size } => {
                block_on(bdev::create_malloc(name, *size, 512)).map_err(map)?;
            }
            Self::Nvme {
                name,
                ctrlr,
                pci_address,
            } => {
                if block_on(bdev::get(name)).map_err(map)?.is_none() {
                    let got = block_on(initiator::attach_pcie(ctrlr, pci_address)).map_err(map)?;
                    if !got.iter().any(|b| b == name) {
                        return Err(EngineError::NotFound {
                            what: "NVMe namespace 1",
                            name: format!(
                                "{name} (controller {ctrlr} at {pci_address} has {got:?})"
                            ),
                        });
                    }
                }
            }
            Self::Raid0 {
                name,
                members,
                strip_kb,
            } => {
                for m in members {
                    m.ensure()?;
                }
                let names: Vec<String> = members.iter().map(|m| m.name().to_string()).collect();
                block_on(raid::create_raid0(name, &names, *strip_kb)).map_err(map)?;
            }
        }
        Ok(())
    }
}

/// An SPDK lvstore pool.
#[derive(Debug)]
pub struct SpdkLvsEngine {
    lvs: String,
    base: BaseBdev,
    cluster_size: u32,
    /// Creating and resizing a volume touch only that volume and run side by side (SPDK
    /// refuses a second lvol with a name still being created); the pool set-up, snapshots,
    /// clones and deletions, which involve other lvols, run alone.
    lock: RwLock<()>,
}

fn map(e: SpdkError) -> EngineError {
    match (e.kind(), &e) {
        (SpdkKind::NotFound, SpdkError::NotFound { kind, name }) => EngineError::NotFound {
            what: kind,
            name: name.clone(),
        },
        (SpdkKind::AlreadyExists, SpdkError::AlreadyExists { kind, name, detail }) => {
            EngineError::Conflict {
                what: kind,
                name: name.clone(),
                detail: detail.clone(),
            }
        }
        _ => EngineError::Spdk(e),
    }
}

impl SpdkLvsEngine {
    /// An engine for lvstore `lvs` on `base`, with a cluster size in bytes (0 = SPDK's 4 MiB).
    /// Needs a running [`crate::spdk::Spdk`] runtime.
    pub fn new(lvs: impl Into<String>, base: BaseBdev, cluster_size: u32) -> Self {
        Self {
            lvs: lvs.into(),
            base,
            cluster_size,
            lock: RwLock::new(()),
        }
    }

    /// What the lvstore sits on.
    pub fn base(&self) -> &BaseBdev {
        &self.base
    }

    /// The lvstore name.
    pub fn lvs_name(&self) -> &str {
        &self.lvs
    }

    /// Exclusive: nothing else changes the lvstore meanwhile.
    fn guard(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        self.lock
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Shared with other single-volume changes.
    fn shared(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.lock
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn volume(&self, l: &lvol::LvolInfo) -> VolumeInfo {
        VolumeInfo {
            name: l.name.clone(),
            uuid: Some(l.uuid.clone()),
            size_bytes: l.size_bytes,
            allocated_bytes: if l.thin {
                l.allocated_bytes
            } else {
                l.size_bytes
            },
            path: PathBuf::from(l.alias()),
            snapshot_of: None,
            layout: None,
            thin: l.thin,
        }
    }

    fn ensure_base(&self) -> Result<(), EngineError> {
        self.base.ensure()
    }
}

impl PoolEngine for SpdkLvsEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::SpdkLvs
    }

    /// Create the base bdev if needed, let SPDK examine it (an existing lvstore loads), and
    /// create the lvstore when there is none. Idempotent.
    fn ensure_pool(&self) -> Result<PoolInfo, EngineError> {
        let _g = self.guard();
        self.ensure_base()?;
        block_on(bdev::wait_for_examine()).map_err(map)?;
        match block_on(lvol::lvstore(&self.lvs)).map_err(map)? {
            Some(l) if l.base_bdev != self.base.name() => {
                return Err(EngineError::Conflict {
                    what: "lvstore",
                    name: self.lvs.clone(),
                    detail: format!(
                        "on bdev {}, configured on {}",
                        l.base_bdev,
                        self.base.name()
                    ),
                });
            }
            Some(_) => {}
            None => {
                block_on(lvol::create_lvstore(
                    self.base.name(),
                    &self.lvs,
                    self.cluster_size,
                ))
                .map_err(map)?;
            }
        }
        drop(_g);
        self.info()
    }

    fn info(&self) -> Result<PoolInfo, EngineError> {
        let l = block_on(lvol::lvstore(&self.lvs))
            .map_err(map)?
            .ok_or_else(|| EngineError::NotFound {
                what: "lvstore",
                name: self.lvs.clone(),
            })?;
        Ok(PoolInfo {
            name: l.name.clone(),
            uuid: l.uuid.clone(),
            total_bytes: l.total_bytes(),
            free_bytes: l.free_bytes(),
            allocation_unit: l.cluster_size,
            pv_count: 0,
            reserved: Vec::new(),
        })
    }

    fn create_volume(
        &self,
        name: &str,
        size: u64,
        opts: &VolumeOptions,
    ) -> Result<VolumeInfo, EngineError> {
        check_name(name)?;
        let _g = self.shared();
        let l = block_on(lvol::create_lvol(
            &self.lvs,
            name,
            size,
            opts.thin,
            self.base.clear(),
        ))
        .map_err(|e| match e.kind() {
            SpdkKind::NoSpace => {
                let free = self.info().map(|i| i.free_bytes).unwrap_or(0);
                if free < size {
                    return EngineError::NoSpace {
                        pool: self.lvs.clone(),
                        name: name.into(),
                        free,
                        needed: size,
                    };
                }
                // The clusters are there: what ran out is the blobstore's metadata (its
                // pages, or its requests in flight). Retried like a full pool, but never
                // told as one.
                EngineError::Busy {
                    what: "pool",
                    name: self.lvs.clone(),
                    reason: format!(
                        "SPDK could not create volume {name} with {} free: the lvstore's metadata pages or its metadata requests ran out ({e})",
                        liteio_api::size::format_bytes(free)
                    ),
                }
            }
            _ => map(e),
        })?;
        Ok(self.volume(&l))
    }

    fn delete_volume(&self, name: &str) -> Result<(), EngineError> {
        let _g = self.guard();
        block_on(lvol::delete_lvol(&self.lvs, name)).map_err(map)
    }

    fn resize_volume(&self, name: &str, new_size: u64) -> Result<VolumeInfo, EngineError> {
        let _g = self.shared();
        let cur = block_on(lvol::lvol(&self.lvs, name))
            .map_err(map)?
            .ok_or_else(|| EngineError::NotFound {
                what: "volume",
                name: name.into(),
            })?;
        // SPDK rounds up to whole clusters: compare the rounded size, so asking again for a
        // size this volume was already grown to (an agent killed before it recorded the
        // expansion) is success, not a shrink.
        let cluster = block_on(lvol::lvstore(&self.lvs))
            .map_err(map)?
            .map_or(1, |l| l.cluster_size.max(1));
        let want = new_size.div_ceil(cluster).saturating_mul(cluster);
        if want < cur.size_bytes {
            return Err(EngineError::Shrink {
                name: name.into(),
                current: cur.size_bytes,
                requested: new_size,
            });
        }
        if want == cur.size_bytes {
            return Ok(self.volume(&cur));
        }
        let l = block_on(lvol::resize_lvol(&self.lvs, name, want)).map_err(map)?;
        Ok(self.volume(&l))
    }

    fn create_snapshot(
        &self,
        origin: &str,
        snap: &str,
        _reserve_size: u64,
    ) -> Result<VolumeInfo, EngineError> {
        check_name(snap)?;
        let _g = self.guard();
        let l = block_on(lvol::snapshot(&self.lvs, origin, snap)).map_err(map)?;
        Ok(VolumeInfo {
            snapshot_of: Some(origin.to_string()),
            ..self.volume(&l)
        })
    }

    fn delete_snapshot(&self, snap: &str) -> Result<(), EngineError> {
        let _g = self.guard();
        block_on(lvol::delete_lvol(&self.lvs, snap)).map_err(map)
    }

    fn clone_from_snapshot(&self, snap: &str, new_name: &str) -> Result<VolumeInfo, EngineError> {
        check_name(new_name)?;
        let _g = self.guard();
        let l = block_on(lvol::clone(&self.lvs, snap, new_name)).map_err(map)?;
        Ok(self.volume(&l))
    }

    fn restore_snapshot(&self, snap: &str) -> Result<(), EngineError> {
        Err(EngineError::Unsupported {
            op: "restore snapshot",
            pool: self.lvs.clone(),
            reason: format!(
                "SPDK lvstores cannot merge {snap} back into its origin; clone it instead"
            ),
        })
    }

    fn list_volumes(&self) -> Result<Vec<VolumeInfo>, EngineError> {
        let all = block_on(lvol::lvols()).map_err(map)?;
        let in_pool: Vec<_> = all.into_iter().filter(|l| l.lvs_name == self.lvs).collect();
        Ok(in_pool
            .iter()
            .map(|l| {
                let mut v = self.volume(l);
                if l.snapshot {
                    // The origin is the clone of this snapshot that is older than it.
                    v.snapshot_of = in_pool
                        .iter()
                        .find(|o| o.parent == l.name && o.blob_id < l.blob_id)
                        .map(|o| o.name.clone())
                        .or(Some(String::new()));
                }
                v
            })
            .collect())
    }

    /// SPDK volumes have no kernel device (they are reached over NVMe/TCP): the "path" is the
    /// lvol's alias `lvs/name`, which is also how the exporter names the bdev. NotFound when
    /// the lvol does not exist.
    fn device_path(&self, name: &str) -> Result<PathBuf, EngineError> {
        match block_on(lvol::lvol(&self.lvs, name)).map_err(map)? {
            Some(l) => Ok(PathBuf::from(l.alias())),
            None => Err(EngineError::NotFound {
                what: "volume",
                name: name.into(),
            }),
        }
    }

    /// The lvol bdevs' own counters (`spdk_bdev_get_device_stat`, summed over channels by
    /// SPDK); one reactor round trip per volume.
    fn io_stats(&self, names: &[String]) -> Result<Vec<(String, VolumeIo)>, EngineError> {
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let alias = format!("{}/{name}", self.lvs);
            let s = match block_on(bdev::io_stats(&alias)) {
                Ok(s) => s,
                Err(e) if e.kind() == SpdkKind::NotFound => continue,
                Err(e) => return Err(map(e)),
            };
            let stat = BdevIo {
                read_ops: s.read_ops,
                bytes_read: s.bytes_read,
                read_latency_us: s.read_latency_us,
                write_ops: s.write_ops,
                bytes_written: s.bytes_written,
                write_latency_us: s.write_latency_us,
                unmap_ops: s.unmap_ops,
                bytes_unmapped: s.bytes_unmapped,
                unmap_latency_us: s.unmap_latency_us,
            };
            out.push((name.clone(), VolumeIo::Lvol { lvol: alias, stat }));
        }
        Ok(out)
    }
}
