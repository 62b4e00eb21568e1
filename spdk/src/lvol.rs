//! Logical volume stores and logical volumes (SPDK's lvol module).

use super::bdev::bdev_by_name;
use super::error::{Result, SpdkError};
use super::runtime::{
    Reactor, cstr, errno_cb, errno_ctx, exec_on, from_c_array, handle_cb, handle_ctx,
    on_reactor_with,
};
use spdk_sys::{spdk_lvol, spdk_lvol_store};

/// An lvstore as SPDK reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LvsInfo {
    /// Name.
    pub name: String,
    /// UUID.
    pub uuid: String,
    /// Base bdev.
    pub base_bdev: String,
    /// Cluster size in bytes.
    pub cluster_size: u64,
    /// Data clusters.
    pub total_data_clusters: u64,
    /// Free clusters.
    pub free_clusters: u64,
    /// Block (io unit) size in bytes.
    pub block_size: u64,
}

impl LvsInfo {
    /// Capacity in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.cluster_size.saturating_mul(self.total_data_clusters)
    }
    /// Free bytes.
    pub fn free_bytes(&self) -> u64 {
        self.cluster_size.saturating_mul(self.free_clusters)
    }
}

/// An lvol as SPDK reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LvolInfo {
    /// Name inside its lvstore.
    pub name: String,
    /// Its lvstore.
    pub lvs_name: String,
    /// UUID (also the bdev name).
    pub uuid: String,
    /// Bdev name.
    pub bdev_name: String,
    /// Snapshot it is a clone of (empty when none).
    pub parent: String,
    /// Size in bytes (a whole number of clusters).
    pub size_bytes: u64,
    /// Allocated bytes.
    pub allocated_bytes: u64,
    /// Blobstore id; grows with creation order (a snapshot's origin keeps its older id, so
    /// among the clones of a snapshot the origin is the one with a smaller id).
    pub blob_id: u64,
    /// Thin provisioned.
    pub thin: bool,
    /// Is a snapshot.
    pub snapshot: bool,
    /// Is a clone.
    pub clone: bool,
}

impl LvolInfo {
    /// `lvs/name`.
    pub fn alias(&self) -> String {
        format!("{}/{}", self.lvs_name, self.name)
    }
}

/// What SPDK reports of `lvs`.
///
/// # Safety
/// `lvs` must be a live lvstore and the call must run on an SPDK thread.
unsafe fn lvs_info(lvs: *mut spdk_lvol_store) -> LvsInfo {
    // SAFETY: a zeroed info struct is valid.
    let mut i: spdk_sys::liteio_lvs_info = unsafe { std::mem::zeroed() };
    // SAFETY: the caller's contract: `lvs` is a live lvstore; `i` is writable.
    unsafe { spdk_sys::liteio_lvs_get_info(lvs, &mut i) };
    LvsInfo {
        name: from_c_array(&i.name),
        uuid: from_c_array(&i.uuid),
        base_bdev: from_c_array(&i.base_bdev),
        cluster_size: i.cluster_size,
        total_data_clusters: i.total_data_clusters,
        free_clusters: i.free_clusters,
        block_size: i.block_size,
    }
}

/// What SPDK reports of `lvol`.
///
/// # Safety
/// `lvol` must be a live lvol and the call must run on an SPDK thread.
unsafe fn lvol_info(lvol: *mut spdk_lvol) -> LvolInfo {
    // SAFETY: a zeroed info struct is valid.
    let mut i: spdk_sys::liteio_lvol_info = unsafe { std::mem::zeroed() };
    // SAFETY: the caller's contract: `lvol` is a live lvol; `i` is writable.
    unsafe { spdk_sys::liteio_lvol_get_info(lvol, &mut i) };
    LvolInfo {
        name: from_c_array(&i.name),
        lvs_name: from_c_array(&i.lvs_name),
        uuid: from_c_array(&i.uuid),
        bdev_name: from_c_array(&i.bdev_name),
        parent: from_c_array(&i.parent),
        size_bytes: i.size_bytes,
        allocated_bytes: i.allocated_bytes,
        blob_id: i.blob_id,
        thin: i.thin,
        snapshot: i.snapshot,
        clone: i.clone,
    }
}

fn lvs_by_name(_r: &Reactor, name: &str) -> Result<*mut spdk_lvol_store> {
    let c = cstr("lvs", name)?;
    // SAFETY: on the reactor.
    let lvs = unsafe { spdk_sys::vbdev_get_lvol_store_by_name(c.as_ptr()) };
    if lvs.is_null() {
        Err(SpdkError::NotFound {
            kind: "lvstore",
            name: name.into(),
        })
    } else {
        Ok(lvs)
    }
}

fn lvol_by_names(_r: &Reactor, lvs: &str, name: &str) -> Result<*mut spdk_lvol> {
    let (l, n) = (cstr("lvs", lvs)?, cstr("name", name)?);
    // SAFETY: on the reactor.
    let lvol = unsafe { spdk_sys::spdk_lvol_get_by_names(l.as_ptr(), n.as_ptr()) };
    if lvol.is_null() {
        Err(SpdkError::NotFound {
            kind: "lvol",
            name: format!("{lvs}/{name}"),
        })
    } else {
        Ok(lvol)
    }
}

/// The lvstore `name` as SPDK reports it now.
fn lvs_info_by_name(r: &Reactor, name: &str) -> Result<LvsInfo> {
    let lvs = lvs_by_name(r, name)?;
    // SAFETY: `lvs` was just returned by SPDK's lookup on this thread.
    Ok(unsafe { lvs_info(lvs) })
}

/// The lvol `lvs/name` as SPDK reports it now: how completions that come later report their
/// lvol, instead of trusting a pointer taken before the operation (SPDK's own JSON-RPC may
/// have deleted it meanwhile).
fn lvol_info_by_names(r: &Reactor, lvs: &str, name: &str) -> Result<LvolInfo> {
    let lvol = lvol_by_names(r, lvs, name)?;
    // SAFETY: `lvol` was just returned by SPDK's lookup on this thread.
    Ok(unsafe { lvol_info(lvol) })
}

fn check_lvol_name(field: &'static str, name: &str) -> Result<()> {
    if name.is_empty() || name.len() > 63 || name.contains(['/', '\0']) {
        return Err(SpdkError::InvalidArgument {
            field,
            reason: format!("{name:?} must be 1-63 characters without '/' or NUL"),
        });
    }
    Ok(())
}

/// Lvol metadata changes (create, delete, resize, snapshot, clone, inflate) in flight at once.
///
/// Each one takes request sets from the blobstore's metadata channel, which has a fixed
/// number of them (`max_channel_ops`, 512 for an lvstore); when they run out the blobstore
/// fails the change with ENOMEM, the same errno as a full metadata area. A burst of
/// thousands of creations (every reconcile sends its own) did exactly that. Changes past
/// this bound wait here, in order, for a slot; the reactor runs them one after another
/// anyway, so 64 keep it busy.
pub const MAX_METADATA_CHANGES: usize = 64;

static METADATA_CHANGES: tokio::sync::Semaphore =
    tokio::sync::Semaphore::const_new(MAX_METADATA_CHANGES);

/// A slot for one lvol metadata change (see [`MAX_METADATA_CHANGES`]), held until its answer.
async fn metadata_slot() -> Result<tokio::sync::SemaphorePermit<'static>> {
    // Never closed: an error cannot happen, and would only mean the runtime is going away.
    METADATA_CHANGES
        .acquire()
        .await
        .map_err(|_| SpdkError::NotRunning)
}

/// Slots of [`MAX_METADATA_CHANGES`] free now (tests).
pub fn free_metadata_slots() -> usize {
    METADATA_CHANGES.available_permits()
}

/// Every lvstore.
pub async fn lvstores() -> Result<Vec<LvsInfo>> {
    on_reactor_with(|_r| {
        let mut out = Vec::new();
        // SAFETY: iteration of the lvol module's list on the reactor.
        let mut lvs = unsafe { spdk_sys::liteio_lvs_first() };
        while !lvs.is_null() {
            // SAFETY: `lvs` is live: returned by the iteration on this thread.
            out.push(unsafe { lvs_info(lvs) });
            // SAFETY: `lvs` is live.
            lvs = unsafe { spdk_sys::liteio_lvs_next(lvs) };
        }
        Ok(out)
    })
    .await
}

/// One lvstore, or `None`.
pub async fn lvstore(name: &str) -> Result<Option<LvsInfo>> {
    let name = name.to_string();
    on_reactor_with(move |r| match lvs_info_by_name(r, &name) {
        Ok(l) => Ok(Some(l)),
        Err(SpdkError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    })
    .await
}

/// Create an lvstore on `base_bdev` with a cluster size in bytes (0 = SPDK's 4 MiB).
/// Idempotent: an lvstore of that name on the same base bdev is success.
pub async fn create_lvstore(base_bdev: &str, name: &str, cluster_size: u32) -> Result<LvsInfo> {
    check_lvol_name("name", name)?;
    if cluster_size != 0 && (!cluster_size.is_power_of_two() || cluster_size < 8192) {
        return Err(SpdkError::InvalidArgument {
            field: "cluster_size",
            reason: format!("{cluster_size} must be a power of two of at least 8 KiB"),
        });
    }
    let (base, name) = (base_bdev.to_string(), name.to_string());
    exec_on(move |r, reply| {
        if let Ok(info) = lvs_info_by_name(r, &name) {
            return reply.send(if info.base_bdev == base {
                Ok(info)
            } else {
                Err(SpdkError::AlreadyExists {
                    kind: "lvstore",
                    name,
                    detail: format!("on bdev {}", info.base_bdev),
                })
            });
        }
        if let Err(e) = bdev_by_name(r, &base) {
            return reply.send(Err(e));
        }
        let (b, n) = match (cstr("base_bdev", &base), cstr("name", &name)) {
            (Ok(b), Ok(n)) => (b, n),
            (Err(e), _) | (_, Err(e)) => return reply.send(Err(e)),
        };
        let name2 = name.clone();
        let ctx = handle_ctx::<spdk_lvol_store>(move |_r, lvs, rc| {
            reply.send(if rc == 0 && !lvs.is_null() {
                // SAFETY: SPDK hands the new lvstore to this callback on its thread.
                Ok(unsafe { lvs_info(lvs) })
            } else {
                Err(SpdkError::errno("create lvstore", name2, rc))
            })
        });
        // SAFETY: on the reactor; strings are copied; `ctx` is owned by SPDK when rc == 0.
        let rc = unsafe {
            spdk_sys::vbdev_lvs_create(
                b.as_ptr(),
                n.as_ptr(),
                cluster_size,
                spdk_sys::LVS_CLEAR_WITH_UNMAP,
                0,
                Some(handle_cb::<spdk_lvol_store>),
                ctx,
            )
        };
        if rc != 0 {
            // SAFETY: SPDK refused the call and never took `ctx`: answered here, once.
            unsafe { handle_cb::<spdk_lvol_store>(ctx, std::ptr::null_mut(), rc) };
        }
    })
    .await
}

async fn lvs_op(name: &str, destroy: bool) -> Result<()> {
    let name = name.to_string();
    exec_on(move |r, reply| {
        let lvs = match lvs_by_name(r, &name) {
            Ok(l) => l,
            Err(SpdkError::NotFound { .. }) => return reply.send(Ok(())),
            Err(e) => return reply.send(Err(e)),
        };
        let op = if destroy {
            "destroy lvstore"
        } else {
            "unload lvstore"
        };
        let ctx = errno_ctx(move |_r, rc| {
            reply.send(if rc == 0 {
                Ok(())
            } else {
                Err(SpdkError::errno(op, name, rc))
            })
        });
        // SAFETY: on the reactor; `ctx` is owned by SPDK until the callback runs once.
        unsafe {
            if destroy {
                spdk_sys::vbdev_lvs_destruct(lvs, Some(errno_cb), ctx);
            } else {
                spdk_sys::vbdev_lvs_unload(lvs, Some(errno_cb), ctx);
            }
        }
    })
    .await
}

/// Unload an lvstore (data kept; it loads again when its base bdev reappears).
pub async fn unload_lvstore(name: &str) -> Result<()> {
    lvs_op(name, false).await
}

/// Destroy an lvstore and every lvol in it; missing = success.
pub async fn destroy_lvstore(name: &str) -> Result<()> {
    lvs_op(name, true).await
}

/// Every lvol of every lvstore (snapshots included).
pub async fn lvols() -> Result<Vec<LvolInfo>> {
    on_reactor_with(|_r| {
        let mut out = Vec::new();
        // SAFETY: iteration of SPDK's bdev list on the reactor.
        let mut b = unsafe { spdk_sys::spdk_bdev_first() };
        while !b.is_null() {
            // SAFETY: a zeroed info struct is valid; `b` is live.
            let mut i: spdk_sys::liteio_lvol_info = unsafe { std::mem::zeroed() };
            // SAFETY: `b` is live; `i` writable.
            if unsafe { spdk_sys::liteio_bdev_lvol_info(b, &mut i) } {
                // SAFETY: `b` is an lvol bdev.
                let lvol = unsafe { spdk_sys::vbdev_lvol_get_from_bdev(b) };
                if !lvol.is_null() {
                    // SAFETY: `lvol` belongs to the live bdev `b`, on this thread.
                    out.push(unsafe { lvol_info(lvol) });
                }
            }
            // SAFETY: `b` is live.
            b = unsafe { spdk_sys::spdk_bdev_next(b) };
        }
        Ok(out)
    })
    .await
}

/// One lvol, or `None`.
pub async fn lvol(lvs: &str, name: &str) -> Result<Option<LvolInfo>> {
    let (lvs, name) = (lvs.to_string(), name.to_string());
    on_reactor_with(move |r| match lvol_info_by_names(r, &lvs, &name) {
        Ok(l) => Ok(Some(l)),
        Err(SpdkError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    })
    .await
}

fn lvol_reply(
    op: &'static str,
    name: String,
    reply: super::runtime::Reply<LvolInfo>,
) -> *mut std::ffi::c_void {
    handle_ctx::<spdk_lvol>(move |_r, lvol, rc| {
        reply.send(if rc == 0 && !lvol.is_null() {
            // SAFETY: SPDK hands the new lvol to this callback on its thread.
            Ok(unsafe { lvol_info(lvol) })
        } else {
            Err(SpdkError::errno(op, name, rc))
        })
    })
}

/// How the clusters an lvol gives back (deleted, shrunk) are cleared before another lvol can
/// get them. A thick lvol reads whatever its clusters hold, so a cluster given back must
/// read zeroes afterwards, or a new volume shows a deleted volume's data (seen: a new 512 MiB
/// volume carried the XFS superblock of the 768 MiB volume deleted just before it). SPDK's
/// default is an unmap, which the blobstore does not require to zero anything: a no-op on an
/// aio bdev without `fallocate`, a deallocate that may read stale data on some NVMe drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clear {
    /// Unmap: only where the base zeroes what it unmaps (an aio bdev over a regular file
    /// with `fallocate`: a punched hole reads zeroes and keeps a sparse file sparse).
    Unmap,
    /// Write zeroes: the device's own command where it has one (NVMe Write Zeroes, malloc),
    /// else SPDK writes zero buffers (time and writes in proportion to the lvol's size).
    WriteZeroes,
}

impl Clear {
    fn method(self) -> spdk_sys::lvol_clear_method {
        match self {
            Clear::Unmap => spdk_sys::LVOL_CLEAR_WITH_UNMAP,
            Clear::WriteZeroes => spdk_sys::LVOL_CLEAR_WITH_WRITE_ZEROES,
        }
    }
}

/// Create an lvol of at least `size` bytes (rounded up to whole clusters by SPDK), whose
/// clusters are cleared with `clear` when it gives them back.
/// Idempotent: an lvol of that name with the same rounded size and provisioning is success.
pub async fn create_lvol(
    lvs: &str,
    name: &str,
    size: u64,
    thin: bool,
    clear: Clear,
) -> Result<LvolInfo> {
    check_lvol_name("name", name)?;
    if size == 0 {
        return Err(SpdkError::InvalidArgument {
            field: "size",
            reason: "must be positive".into(),
        });
    }
    let (lvs_name, name) = (lvs.to_string(), name.to_string());
    let _slot = metadata_slot().await?;
    exec_on(move |r, reply| {
        let lvs = match lvs_by_name(r, &lvs_name) {
            Ok(l) => l,
            Err(e) => return reply.send(Err(e)),
        };
        // SAFETY: `lvs` was just returned by the lookup on this thread.
        let info = unsafe { lvs_info(lvs) };
        if let Ok(e) = lvol_info_by_names(r, &lvs_name, &name) {
            let cluster = info.cluster_size.max(1);
            let Some(want) = size.div_ceil(cluster).checked_mul(cluster) else {
                return reply.send(Err(SpdkError::InvalidArgument {
                    field: "sizeByte",
                    reason: format!(
                        "{size} bytes rounded up to whole {cluster}-byte clusters overflows"
                    ),
                }));
            };
            return reply.send(if e.size_bytes == want && e.thin == thin && !e.snapshot {
                Ok(e)
            } else {
                Err(SpdkError::AlreadyExists {
                    kind: "lvol",
                    name: e.alias(),
                    detail: format!(
                        "with {} bytes (thin: {}), asked {want} (thin: {thin})",
                        e.size_bytes, e.thin
                    ),
                })
            });
        }
        if !thin && size > info.free_bytes() {
            return reply.send(Err(SpdkError::Errno {
                op: "create lvol",
                name: format!(
                    "{lvs_name}/{name}: {} free, {size} asked",
                    info.free_bytes()
                ),
                source: std::io::Error::from_raw_os_error(super::error::libc_errno::ENOSPC),
            }));
        }
        let c = match cstr("name", &name) {
            Ok(c) => c,
            Err(e) => return reply.send(Err(e)),
        };
        let ctx = lvol_reply("create lvol", format!("{lvs_name}/{name}"), reply);
        // SAFETY: on the reactor; the name is copied; `ctx` is owned by SPDK when rc == 0.
        let rc = unsafe {
            spdk_sys::vbdev_lvol_create(
                lvs,
                c.as_ptr(),
                size,
                thin,
                clear.method(),
                Some(handle_cb::<spdk_lvol>),
                ctx,
            )
        };
        if rc != 0 {
            // SAFETY: SPDK refused the call and never took `ctx`: answered here, once.
            unsafe { handle_cb::<spdk_lvol>(ctx, std::ptr::null_mut(), rc) };
        }
    })
    .await
}

/// Delete an lvol (or a snapshot without clones); missing = success.
pub async fn delete_lvol(lvs: &str, name: &str) -> Result<()> {
    let (lvs, name) = (lvs.to_string(), name.to_string());
    let _slot = metadata_slot().await?;
    exec_on(move |r, reply| {
        let lvol = match lvol_by_names(r, &lvs, &name) {
            Ok(l) => l,
            Err(SpdkError::NotFound { .. }) => return reply.send(Ok(())),
            Err(e) => return reply.send(Err(e)),
        };
        // SAFETY: `lvol` is live.
        if !unsafe { spdk_sys::spdk_lvol_deletable(lvol) } {
            return reply.send(Err(SpdkError::InvalidArgument {
                field: "name",
                reason: format!("{lvs}/{name} has clones; delete or inflate them first"),
            }));
        }
        let full = format!("{lvs}/{name}");
        let ctx = errno_ctx(move |_r, rc| {
            reply.send(if rc == 0 {
                Ok(())
            } else {
                Err(SpdkError::errno("delete lvol", full, rc))
            })
        });
        // SAFETY: on the reactor; `ctx` owned by SPDK until the callback.
        unsafe { spdk_sys::vbdev_lvol_destroy(lvol, Some(errno_cb), ctx) };
    })
    .await
}

/// Grow an lvol to at least `size` bytes. Shrinking is refused.
pub async fn resize_lvol(lvs: &str, name: &str, size: u64) -> Result<LvolInfo> {
    let (lvs, name) = (lvs.to_string(), name.to_string());
    let _slot = metadata_slot().await?;
    exec_on(move |r, reply| {
        let lvol = match lvol_by_names(r, &lvs, &name) {
            Ok(l) => l,
            Err(e) => return reply.send(Err(e)),
        };
        // SAFETY: `lvol` was just returned by the lookup on this thread.
        let cur = unsafe { lvol_info(lvol) };
        if size < cur.size_bytes {
            return reply.send(Err(SpdkError::InvalidArgument {
                field: "size",
                reason: format!(
                    "{size} bytes is below the current {} bytes of {}; volumes only grow",
                    cur.size_bytes,
                    cur.alias()
                ),
            }));
        }
        if size == cur.size_bytes {
            return reply.send(Ok(cur));
        }
        let full = cur.alias();
        let ctx = errno_ctx(move |r, rc| {
            reply.send(if rc == 0 {
                // Looked up again: the lvol may be gone by now.
                lvol_info_by_names(r, &lvs, &name)
            } else {
                Err(SpdkError::errno("resize lvol", full, rc))
            })
        });
        // SAFETY: on the reactor; `lvol` is live (looked up in this message); `ctx` is owned
        // by SPDK until the callback, which does not use `lvol`.
        unsafe { spdk_sys::vbdev_lvol_resize(lvol, size, Some(errno_cb), ctx) };
    })
    .await
}

/// Snapshot `lvs/name` as `lvs/snapshot`. Idempotent when that snapshot exists.
pub async fn snapshot(lvs: &str, name: &str, snapshot: &str) -> Result<LvolInfo> {
    check_lvol_name("snapshot", snapshot)?;
    let (lvs, name, snap) = (lvs.to_string(), name.to_string(), snapshot.to_string());
    let _slot = metadata_slot().await?;
    exec_on(move |r, reply| {
        if let Ok(info) = lvol_info_by_names(r, &lvs, &snap) {
            return reply.send(if info.snapshot {
                Ok(info)
            } else {
                Err(SpdkError::AlreadyExists {
                    kind: "lvol",
                    name: info.alias(),
                    detail: "and is not a snapshot".into(),
                })
            });
        }
        let (lvol, c) = match (lvol_by_names(r, &lvs, &name), cstr("snapshot", &snap)) {
            (Ok(l), Ok(c)) => (l, c),
            (Err(e), _) | (_, Err(e)) => return reply.send(Err(e)),
        };
        let ctx = lvol_reply("snapshot lvol", format!("{lvs}/{snap}"), reply);
        // SAFETY: on the reactor; name copied; `ctx` owned by SPDK until the callback.
        unsafe {
            spdk_sys::vbdev_lvol_create_snapshot(
                lvol,
                c.as_ptr(),
                Some(handle_cb::<spdk_lvol>),
                ctx,
            )
        };
    })
    .await
}

/// Clone snapshot `lvs/snapshot` as `lvs/clone`. Idempotent when that clone of it exists.
pub async fn clone(lvs: &str, snapshot: &str, clone: &str) -> Result<LvolInfo> {
    check_lvol_name("clone", clone)?;
    let (lvs, snap, clone) = (lvs.to_string(), snapshot.to_string(), clone.to_string());
    let _slot = metadata_slot().await?;
    exec_on(move |r, reply| {
        if let Ok(info) = lvol_info_by_names(r, &lvs, &clone) {
            return reply.send(if info.parent == snap {
                Ok(info)
            } else {
                Err(SpdkError::AlreadyExists {
                    kind: "lvol",
                    name: info.alias(),
                    detail: format!("with parent {:?}", info.parent),
                })
            });
        }
        let (s, c) = match (lvol_by_names(r, &lvs, &snap), cstr("clone", &clone)) {
            (Ok(s), Ok(c)) => (s, c),
            (Err(e), _) | (_, Err(e)) => return reply.send(Err(e)),
        };
        // SAFETY: `s` was just returned by the lookup on this thread.
        if !unsafe { lvol_info(s) }.snapshot {
            return reply.send(Err(SpdkError::InvalidArgument {
                field: "snapshot",
                reason: format!("{lvs}/{snap} is not a snapshot"),
            }));
        }
        let ctx = lvol_reply("clone lvol", format!("{lvs}/{clone}"), reply);
        // SAFETY: on the reactor; name copied; `ctx` owned by SPDK until the callback.
        unsafe {
            spdk_sys::vbdev_lvol_create_clone(s, c.as_ptr(), Some(handle_cb::<spdk_lvol>), ctx)
        };
    })
    .await
}

/// Allocate every cluster of a thin lvol or clone and cut it from its parent snapshot.
pub async fn inflate(lvs: &str, name: &str) -> Result<LvolInfo> {
    let (lvs, name) = (lvs.to_string(), name.to_string());
    let _slot = metadata_slot().await?;
    exec_on(move |r, reply| {
        let lvol = match lvol_by_names(r, &lvs, &name) {
            Ok(l) => l,
            Err(e) => return reply.send(Err(e)),
        };
        let full = format!("{lvs}/{name}");
        let ctx = errno_ctx(move |r, rc| {
            reply.send(if rc == 0 {
                // Looked up again: the lvol may be gone by now.
                lvol_info_by_names(r, &lvs, &name)
            } else {
                Err(SpdkError::errno("inflate lvol", full, rc))
            })
        });
        // SAFETY: on the reactor; `lvol` is live (looked up in this message); `ctx` is owned
        // by SPDK until the callback, which does not use `lvol`.
        unsafe { spdk_sys::spdk_lvol_inflate(lvol, Some(errno_cb), ctx) };
    })
    .await
}
