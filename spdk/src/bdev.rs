//! Block devices: malloc (tests), null (benchmarks), aio over a file or block device,
//! listing, I/O statistics and QoS limits. Raid bdevs (concat, raid0, raid1) are in
//! [`super::raid`], which stands on this module (it imports bdev lookups; nothing here
//! imports it back).

use std::ffi::c_void;
use std::path::{Path, PathBuf};

use super::error::{Result, SpdkError, libc_errno};
use super::runtime::{
    Reactor, cstr, drop_errno_ctx, errno_cb, errno_ctx, exec_on, from_c, no_unwind, on_reactor_with,
};

/// What SPDK knows about a bdev.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BdevInfo {
    /// Name.
    pub name: String,
    /// Product name (`Malloc disk`, `AIO disk`, `Logical Volume`, `NVMe disk`, …).
    pub product: String,
    /// Block size in bytes.
    pub block_size: u32,
    /// Number of blocks.
    pub num_blocks: u64,
    /// UUID.
    pub uuid: String,
    /// Aliases (`lvs/lvol` for lvols).
    pub aliases: Vec<String>,
}

impl BdevInfo {
    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.num_blocks.saturating_mul(u64::from(self.block_size))
    }
}

/// Cumulative I/O statistics of a bdev.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoStats {
    /// Bytes read.
    pub bytes_read: u64,
    /// Read operations.
    pub read_ops: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Write operations.
    pub write_ops: u64,
    /// Sum of read latencies, in microseconds.
    pub read_latency_us: u64,
    /// Sum of write latencies, in microseconds.
    pub write_latency_us: u64,
    /// Bytes unmapped.
    pub bytes_unmapped: u64,
    /// Unmap operations.
    pub unmap_ops: u64,
    /// Sum of unmap latencies, in microseconds.
    pub unmap_latency_us: u64,
}

/// The bdev `name`, looked up on the reactor.
pub(crate) fn bdev_by_name(_r: &Reactor, name: &str) -> Result<*mut spdk_sys::spdk_bdev> {
    let c = cstr("bdev", name)?;
    // SAFETY: on an SPDK thread (the `Reactor` token); `c` is a valid C string for the call.
    let bdev = unsafe { spdk_sys::spdk_bdev_get_by_name(c.as_ptr()) };
    if bdev.is_null() {
        Err(SpdkError::NotFound {
            kind: "bdev",
            name: name.into(),
        })
    } else {
        Ok(bdev)
    }
}

/// What SPDK knows about the bdev `name`, looked up now.
pub(crate) fn info_by_name(r: &Reactor, name: &str) -> Result<BdevInfo> {
    let b = bdev_by_name(r, name)?;
    // SAFETY: `b` was just returned by SPDK's lookup on this thread and nothing ran since.
    Ok(unsafe { bdev_info(b) })
}

/// What SPDK knows about `bdev`.
///
/// # Safety
/// `bdev` must be a live bdev and the call must run on an SPDK thread (nothing may free the
/// bdev meanwhile).
pub(crate) unsafe fn bdev_info(bdev: *mut spdk_sys::spdk_bdev) -> BdevInfo {
    // SAFETY: the caller's contract: `bdev` is live for this call; the getters only read it.
    unsafe {
        let mut uuid = [0 as std::ffi::c_char; 64];
        spdk_sys::spdk_uuid_fmt_lower(
            uuid.as_mut_ptr(),
            uuid.len(),
            spdk_sys::spdk_bdev_get_uuid(bdev),
        );
        let mut aliases = Vec::new();
        let head = spdk_sys::spdk_bdev_get_aliases(bdev);
        let mut a = if head.is_null() {
            std::ptr::null_mut()
        } else {
            (*head).tqh_first
        };
        while !a.is_null() {
            aliases.push(from_c((*a).alias.name));
            a = (*a).tailq.tqe_next;
        }
        BdevInfo {
            name: from_c(spdk_sys::spdk_bdev_get_name(bdev)),
            product: from_c(spdk_sys::spdk_bdev_get_product_name(bdev)),
            block_size: spdk_sys::spdk_bdev_get_block_size(bdev),
            num_blocks: spdk_sys::spdk_bdev_get_num_blocks(bdev),
            uuid: super::runtime::from_c_array(&uuid),
            aliases,
        }
    }
}

pub(crate) fn check_name(field: &'static str, name: &str) -> Result<()> {
    if name.is_empty() || name.len() > 63 || name.contains(['/', '\0', ' ']) {
        return Err(SpdkError::InvalidArgument {
            field,
            reason: format!("{name:?} must be 1-63 characters without '/', spaces or NUL"),
        });
    }
    Ok(())
}

/// Every bdev.
pub async fn list() -> Result<Vec<BdevInfo>> {
    on_reactor_with(|_r| {
        let mut out = Vec::new();
        // SAFETY: iteration of SPDK's bdev list on the reactor.
        let mut b = unsafe { spdk_sys::spdk_bdev_first() };
        while !b.is_null() {
            // SAFETY: `b` is a live bdev returned by the iteration on this thread.
            out.push(unsafe { bdev_info(b) });
            // SAFETY: `b` is a live bdev returned by the iteration.
            b = unsafe { spdk_sys::spdk_bdev_next(b) };
        }
        Ok(out)
    })
    .await
}

/// One bdev, or `None`.
pub async fn get(name: &str) -> Result<Option<BdevInfo>> {
    let name = name.to_string();
    on_reactor_with(move |r| match info_by_name(r, &name) {
        Ok(b) => Ok(Some(b)),
        Err(SpdkError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    })
    .await
}

fn same_or_conflict(
    existing: &BdevInfo,
    product: &str,
    size: Option<u64>,
    name: &str,
) -> Result<()> {
    if existing.product != product || size.is_some_and(|s| s != existing.size_bytes()) {
        return Err(SpdkError::AlreadyExists {
            kind: "bdev",
            name: name.into(),
            detail: format!(
                "as a {} of {} bytes",
                existing.product,
                existing.size_bytes()
            ),
        });
    }
    Ok(())
}

/// Create a RAM-backed bdev of `size` bytes (tests). Idempotent.
pub async fn create_malloc(name: &str, size: u64, block_size: u32) -> Result<BdevInfo> {
    check_name("name", name)?;
    if block_size == 0
        || !block_size.is_power_of_two()
        || size == 0
        || !size.is_multiple_of(u64::from(block_size))
    {
        return Err(SpdkError::InvalidArgument {
            field: "size",
            reason: format!(
                "{size} bytes is not a positive multiple of the block size {block_size}"
            ),
        });
    }
    let name = name.to_string();
    on_reactor_with(move |r| {
        if let Ok(info) = info_by_name(r, &name) {
            same_or_conflict(&info, "Malloc disk", Some(size), &name)?;
            return Ok(info);
        }
        let c = cstr("name", &name)?;
        // SAFETY: on the reactor; `c` outlives the call, which copies the name.
        let rc = unsafe {
            spdk_sys::liteio_malloc_create(
                c.as_ptr(),
                size / u64::from(block_size),
                block_size,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(SpdkError::errno("create malloc bdev", name, rc));
        }
        info_by_name(r, &name)
    })
    .await
}

/// Create a null bdev (discards writes, reads zeroes) for benchmarks. Idempotent.
pub async fn create_null(name: &str, size: u64, block_size: u32) -> Result<BdevInfo> {
    check_name("name", name)?;
    if block_size == 0 || size == 0 || !size.is_multiple_of(u64::from(block_size)) {
        return Err(SpdkError::InvalidArgument {
            field: "size",
            reason: format!("{size} is not a multiple of {block_size}"),
        });
    }
    let name = name.to_string();
    on_reactor_with(move |r| {
        if let Ok(info) = info_by_name(r, &name) {
            same_or_conflict(&info, "Null disk", Some(size), &name)?;
            return Ok(info);
        }
        let c = cstr("name", &name)?;
        // SAFETY: on the reactor; the module copies the name.
        let rc = unsafe {
            spdk_sys::liteio_null_create(c.as_ptr(), size / u64::from(block_size), block_size)
        };
        if rc != 0 {
            return Err(SpdkError::errno("create null bdev", name, rc));
        }
        info_by_name(r, &name)
    })
    .await
}

/// Which module deletes a bdev.
#[derive(Debug, Clone, Copy)]
enum Module {
    Malloc,
    Null,
    Aio,
}

async fn delete_with(module: Module, name: &str) -> Result<()> {
    let name = name.to_string();
    exec_on(move |r, reply| {
        if bdev_by_name(r, &name).is_err() {
            return reply.send(Ok(()));
        }
        let c = match cstr("name", &name) {
            Ok(c) => c,
            Err(e) => return reply.send(Err(e)),
        };
        let n = name.clone();
        let ctx = errno_ctx(move |_r, rc| {
            reply.send(if rc == 0 || rc == -libc_errno::ENODEV {
                Ok(())
            } else {
                Err(SpdkError::errno("delete bdev", n, rc))
            })
        });
        // SAFETY: on the reactor; `ctx` is owned by SPDK until `errno_cb` runs once.
        unsafe {
            match module {
                Module::Malloc => spdk_sys::liteio_malloc_delete(c.as_ptr(), Some(errno_cb), ctx),
                Module::Null => spdk_sys::liteio_null_delete(c.as_ptr(), Some(errno_cb), ctx),
                Module::Aio => spdk_sys::bdev_aio_delete(c.as_ptr(), Some(errno_cb), ctx),
            }
        }
    })
    .await
}

/// Delete a malloc bdev; missing = success.
pub async fn delete_malloc(name: &str) -> Result<()> {
    delete_with(Module::Malloc, name).await
}

/// Delete a null bdev; missing = success.
pub async fn delete_null(name: &str) -> Result<()> {
    delete_with(Module::Null, name).await
}

/// Smallest backing file an aio bdev accepts.
pub const MIN_AIO_SIZE: u64 = 1 << 20;

/// Create an aio bdev over a file or block device. Idempotent by name (an aio bdev of that
/// name is taken as the same one).
pub async fn create_aio(name: &str, path: &Path, block_size: u32) -> Result<BdevInfo> {
    create_aio_with(name, path, block_size, false).await
}

/// [`create_aio`], with `fallocate`: the bdev then does unmaps and write-zeroes with
/// `fallocate(2)` (a punched hole, a zeroed range) where without it it has neither, so an
/// lvstore on it can clear the clusters its lvols give back (see [`super::lvol::Clear`]).
/// The file system under a file must punch holes (xfs, ext4, btrfs, tmpfs do).
pub async fn create_aio_with(
    name: &str,
    path: &Path,
    block_size: u32,
    fallocate: bool,
) -> Result<BdevInfo> {
    check_name("name", name)?;
    let meta = std::fs::metadata(path).map_err(|e| SpdkError::InvalidArgument {
        field: "filename",
        reason: format!("{}: {e}", path.display()),
    })?;
    if meta.is_file() && meta.len() < MIN_AIO_SIZE {
        return Err(SpdkError::InvalidArgument {
            field: "filename",
            reason: format!(
                "{} has {} bytes; an aio bdev needs at least {MIN_AIO_SIZE}",
                path.display(),
                meta.len()
            ),
        });
    }
    if meta.is_dir() {
        return Err(SpdkError::InvalidArgument {
            field: "filename",
            reason: format!("{} is a directory", path.display()),
        });
    }
    let (name, path): (String, PathBuf) = (name.to_string(), path.to_path_buf());
    on_reactor_with(move |r| {
        if let Ok(info) = info_by_name(r, &name) {
            same_or_conflict(&info, "AIO disk", None, &name)?;
            return Ok(info);
        }
        let c = cstr("name", &name)?;
        let f = cstr("filename", &path.to_string_lossy())?;
        // SAFETY: on the reactor; the module copies both strings.
        let rc = unsafe {
            spdk_sys::create_aio_bdev(
                c.as_ptr(),
                f.as_ptr(),
                block_size,
                false,
                fallocate,
                std::ptr::null(),
                false,
            )
        };
        if rc != 0 {
            return Err(SpdkError::errno(
                "create aio bdev",
                format!("{name} on {}", path.display()),
                rc,
            ));
        }
        info_by_name(r, &name)
    })
    .await
}

/// Pick up a grown backing file or device of an aio bdev.
pub async fn rescan_aio(name: &str) -> Result<BdevInfo> {
    let name = name.to_string();
    on_reactor_with(move |r| {
        let c = cstr("name", &name)?;
        // SAFETY: on the reactor.
        let rc = unsafe { spdk_sys::bdev_aio_rescan(c.as_ptr()) };
        if rc != 0 {
            return Err(if rc == -libc_errno::ENODEV {
                SpdkError::NotFound { kind: "bdev", name }
            } else {
                SpdkError::errno("rescan aio bdev", name, rc)
            });
        }
        info_by_name(r, &name)
    })
    .await
}

/// Delete an aio bdev; missing = success.
pub async fn delete_aio(name: &str) -> Result<()> {
    delete_with(Module::Aio, name).await
}

/// Have SPDK's bdev modules examine the bdev `name` (an lvstore on it loads, a raid member's
/// superblock is read and its raid assembled), then wait until they are done. For a runtime
/// started with [`SpdkOptions::auto_examine`](super::SpdkOptions::auto_examine) off, where
/// SPDK examines only the bdevs named this way; also a name whose bdev does not exist yet:
/// SPDK examines it when it appears. With auto-examine on, every bdev was examined when it
/// appeared and this only waits.
///
/// SPDK examines a bdev once: a second call for the same name (or a bdev that reappears
/// under it) does not examine again. To assemble a raid from its members' superblocks again,
/// use [`super::raid::assemble_from_superblock`], which has the raid module examine them.
pub async fn examine(name: &str) -> Result<()> {
    let c = cstr("name", name)?;
    let name = name.to_string();
    on_reactor_with(move |_r| {
        // SAFETY: a zeroed options struct is a valid buffer for the getter, which fills it.
        let mut o: spdk_sys::spdk_bdev_opts = unsafe { std::mem::zeroed() };
        // SAFETY: `o` is writable and of the size passed.
        unsafe { spdk_sys::spdk_bdev_get_opts(&mut o, std::mem::size_of_val(&o)) };
        if o.bdev_auto_examine {
            // Examined when it appeared (SPDK would log an error for asking).
            return Ok(());
        }
        // SAFETY: on the app thread (SPDK asserts it); `c` outlives the call (SPDK copies it).
        let rc = unsafe { spdk_sys::spdk_bdev_examine(c.as_ptr()) };
        match rc {
            // -EINVAL: auto-examine is on (already examined); -EEXIST: named before.
            0 => Ok(()),
            rc if rc == -libc_errno::EINVAL || rc == -libc_errno::EEXIST => Ok(()),
            rc => Err(SpdkError::errno("examine bdev", name, rc)),
        }
    })
    .await?;
    wait_for_examine().await
}

/// Wait until every bdev module finished examining new bdevs (lvstores loaded).
pub async fn wait_for_examine() -> Result<()> {
    exec_on(|_r, reply| {
        let ctx = errno_ctx(move |_r, _| reply.send(Ok(())));
        extern "C" fn done(arg: *mut c_void) {
            no_unwind("wait_for_examine", || {
                // SAFETY: `arg` is the `errno_ctx` SPDK was given; it calls `done` once.
                unsafe { errno_cb(arg, 0) };
            });
        }
        // SAFETY: on the reactor; `ctx` is owned by SPDK until `done` runs once.
        let rc = unsafe { spdk_sys::spdk_bdev_wait_for_examine(Some(done), ctx) };
        if rc != 0 {
            // SAFETY: SPDK refused the call and never took `ctx`; reclaimed once here.
            unsafe { drop_errno_ctx(ctx) };
        }
    })
    .await
}

/// Cumulative I/O statistics of a bdev.
pub async fn io_stats(name: &str) -> Result<IoStats> {
    let name = name.to_string();
    exec_on(move |r, reply| {
        let bdev = match bdev_by_name(r, &name) {
            Ok(b) => b,
            Err(e) => return reply.send(Err(e)),
        };
        // SAFETY: a zeroed stat struct is valid; SPDK fills it.
        let stat: Box<spdk_sys::spdk_bdev_io_stat> = Box::new(unsafe { std::mem::zeroed() });
        let stat = Box::into_raw(stat);
        let ctx = errno_ctx(move |_r, rc| {
            // SAFETY: SPDK is done with `stat` when the callback runs; reclaim it once.
            let s = unsafe { Box::from_raw(stat) };
            if rc != 0 {
                return reply.send(Err(SpdkError::errno("bdev io stat", name, rc)));
            }
            // Not `s.ticks_rate`: spdk_bdev_get_device_stat copies it from the bdev's own stat,
            // which SPDK 26.05 mallocs without ever setting that field (only channel stats set
            // it), so it holds heap garbage. The tick rate is the same process-wide.
            // SAFETY: a pure read of the TSC rate SPDK measured at start.
            let rate = unsafe { spdk_sys::spdk_get_ticks_hz() }.max(1);
            let us = |ticks: u64| {
                u64::try_from(u128::from(ticks) * 1_000_000 / u128::from(rate)).unwrap_or(u64::MAX)
            };
            reply.send(Ok(IoStats {
                bytes_read: s.bytes_read,
                read_ops: s.num_read_ops,
                bytes_written: s.bytes_written,
                write_ops: s.num_write_ops,
                read_latency_us: us(s.read_latency_ticks),
                write_latency_us: us(s.write_latency_ticks),
                bytes_unmapped: s.bytes_unmapped,
                unmap_ops: s.num_unmap_ops,
                unmap_latency_us: us(s.unmap_latency_ticks),
            }))
        });
        extern "C" fn done(
            _bdev: *mut spdk_sys::spdk_bdev,
            _stat: *mut spdk_sys::spdk_bdev_io_stat,
            arg: *mut c_void,
            rc: i32,
        ) {
            no_unwind("io_stats", || {
                // SAFETY: `arg` is the `errno_ctx` SPDK was given; it calls `done` once.
                unsafe { errno_cb(arg, rc) };
            });
        }
        // SAFETY: on the reactor; `stat` and `ctx` stay valid until `done` runs once.
        unsafe {
            spdk_sys::spdk_bdev_get_device_stat(
                bdev,
                stat,
                spdk_sys::SPDK_BDEV_RESET_STAT_NONE,
                Some(done),
                ctx,
            )
        };
    })
    .await
}

/// A bdev's rate limits (SPDK's bdev QoS), each 0 for none: read and write I/O per second
/// together (SPDK accepts multiples of 1000), and MiB per second for reads and writes
/// together, reads, writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct QosLimits {
    /// Read and write I/O per second together.
    pub rw_iops: u64,
    /// Read and write MiB/s together.
    pub rw_mibps: u64,
    /// Read MiB/s.
    pub read_mibps: u64,
    /// Write MiB/s.
    pub write_mibps: u64,
}

impl QosLimits {
    /// In the order of `spdk_bdev_qos_rate_limit_type`.
    fn to_array(self) -> [u64; 4] {
        [
            self.rw_iops,
            self.rw_mibps,
            self.read_mibps,
            self.write_mibps,
        ]
    }

    fn check(&self) -> Result<()> {
        if !self.rw_iops.is_multiple_of(1000) {
            return Err(SpdkError::InvalidArgument {
                field: "rw_iops",
                reason: format!(
                    "{} is not a multiple of 1000 (SPDK would round it up)",
                    self.rw_iops
                ),
            });
        }
        // SPDK turns MiB/s into bytes/s in a u64.
        let max = u64::MAX / (1024 * 1024);
        for (field, v) in [
            ("rw_mibps", self.rw_mibps),
            ("read_mibps", self.read_mibps),
            ("write_mibps", self.write_mibps),
        ] {
            if v >= max {
                return Err(SpdkError::InvalidArgument {
                    field,
                    reason: format!("{v} MiB/s overflows SPDK's byte counter"),
                });
            }
        }
        Ok(())
    }
}

/// The rate limits in force on a bdev (all 0: none).
pub async fn qos_limits(name: &str) -> Result<QosLimits> {
    let name = name.to_string();
    on_reactor_with(move |r| {
        let bdev = bdev_by_name(r, &name)?;
        let mut l = [0u64; 4];
        // SAFETY: on the reactor; `bdev` is a live bdev and `l` holds the
        // SPDK_BDEV_QOS_NUM_RATE_LIMIT_TYPES (4) values SPDK writes.
        unsafe { spdk_sys::spdk_bdev_get_qos_rate_limits(bdev, l.as_mut_ptr()) };
        Ok(QosLimits {
            rw_iops: l[0],
            rw_mibps: l[1],
            read_mibps: l[2],
            write_mibps: l[3],
        })
    })
    .await
}

/// Sets every rate limit of a bdev at once (0 lifts a limit), live: I/O in flight goes on
/// under the new limits. Idempotent. SPDK refuses a change while another is under way
/// (`EAGAIN`): retried here for up to a second.
pub async fn set_qos_limits(name: &str, limits: QosLimits) -> Result<()> {
    limits.check()?;
    let mut delay = std::time::Duration::from_millis(5);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        match set_qos_once(name, limits).await {
            Err(SpdkError::Errno { ref source, .. })
                if source.raw_os_error() == Some(libc_errno::EAGAIN)
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

async fn set_qos_once(name: &str, limits: QosLimits) -> Result<()> {
    let name = name.to_string();
    exec_on(move |r, reply| {
        let bdev = match bdev_by_name(r, &name) {
            Ok(b) => b,
            Err(e) => return reply.send(Err(e)),
        };
        let ctx = errno_ctx(move |_r, rc| {
            reply.send(if rc == 0 {
                Ok(())
            } else {
                Err(SpdkError::errno("set bdev QoS limits", name, rc))
            })
        });
        extern "C" fn done(arg: *mut c_void, rc: i32) {
            no_unwind("set_qos_limits", || {
                // SAFETY: `arg` is the `errno_ctx` SPDK was given; it calls `done` once.
                unsafe { errno_cb(arg, rc) };
            });
        }
        let mut l = limits.to_array();
        // SAFETY: on the reactor; `bdev` is live; SPDK reads (and converts in place) the 4
        // values of `l` before it returns, and calls `done` exactly once with `ctx`, also
        // when it refuses the change.
        unsafe { spdk_sys::spdk_bdev_set_qos_rate_limits(bdev, l.as_mut_ptr(), Some(done), ctx) };
    })
    .await
}
