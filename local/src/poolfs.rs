//! A file system with reflinks for the file engine's pool.
//!
//! The file engine cuts snapshots and clones with reflinks (`FICLONE`): XFS with
//! `reflink=1` and btrfs have them, ext4 (Debian's default, also for `/var/tmp`) and tmpfs
//! do not. Where the run directory's file system has none, the pool goes on an XFS image with
//! `reflink=1` in a sparse file beside it, loop-mounted at the pool directory. XFS rather than
//! btrfs: `xfsprogs` is what the run already installs for the demo's file system, and the
//! file engine's tests run on XFS. The image is sparse: it takes on disk what the volumes
//! hold, not its size.

use std::path::{Path, PathBuf};
use std::time::Duration;

use liteio_node::cmd::{CommandRunner, SystemRunner, argv};

/// Room for XFS's own log and metadata on top of the pool's capacity.
pub const XFS_OVERHEAD: u64 = 1 << 30;

/// An XFS file system with reflink in a sparse image file, loop-mounted at `dir`; on drop,
/// whatever volumes left mounted or loop-attached inside it is undone, then it is unmounted
/// and the image removed.
#[derive(Debug)]
pub struct XfsImage {
    /// Where it is mounted.
    pub dir: PathBuf,
    image: PathBuf,
}

/// `cmd args…` with a timeout; its stderr (or how it failed) when it did not succeed.
fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    let mut a = vec![cmd];
    a.extend_from_slice(args);
    match SystemRunner::with_timeout(Duration::from_secs(120)).run(&argv(&a)) {
        Ok(o) if o.success() => Ok(()),
        Ok(o) => Err(format!("{cmd} failed: {}", o.stderr.trim())),
        Err(e) => Err(format!("cannot run {cmd}: {e}")),
    }
}

impl XfsImage {
    /// Makes a `size`-byte sparse image at `image`, formats it XFS with `reflink=1` and
    /// mounts it at `dir` (created when missing). On failure nothing is left: the reason.
    pub fn create(image: &Path, dir: &Path, size: u64) -> Result<Self, String> {
        let fail = |e: String| {
            let _ = std::fs::remove_file(image);
            e
        };
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let f = std::fs::File::create(image)
            .map_err(|e| format!("cannot create {}: {e}", image.display()))?;
        f.set_len(size)
            .map_err(|e| fail(format!("cannot size {}: {e}", image.display())))?;
        drop(f);
        let (img, mnt) = (image.to_string_lossy(), dir.to_string_lossy());
        run("mkfs.xfs", &["-q", "-f", "-m", "reflink=1", &img]).map_err(fail)?;
        run("mount", &["-o", "loop", &img, &mnt]).map_err(fail)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            image: image.to_path_buf(),
        })
    }

    /// A scratch file system for a test: the image `base/pool.xfs` mounted at `base/state`.
    pub fn scratch(base: &Path, size: u64) -> Result<Self, String> {
        Self::create(&base.join("pool.xfs"), &base.join("state"), size)
    }

    /// The image file.
    pub fn image(&self) -> &Path {
        &self.image
    }
}

impl Drop for XfsImage {
    fn drop(&mut self) {
        crate::release_host_resources(&self.dir);
        let d = self.dir.to_string_lossy().into_owned();
        if run("umount", &[&d]).is_err() {
            let _ = run("umount", &["-l", &d]);
        }
        let _ = std::fs::remove_file(&self.image);
    }
}

/// What [`reflink_pool`] did.
#[derive(Debug)]
pub enum PoolFs {
    /// The directory's own file system has reflinks.
    Native,
    /// The pool is on an XFS image made for it.
    Image(XfsImage),
    /// No reflinks and no image could be made: the pool stays, snapshots will be refused.
    Without(String),
}

/// Gives the file engine's pool directory `pool` a file system with reflinks: the
/// directory's own when it has them, else an XFS image `image` of `bytes` plus
/// [`XFS_OVERHEAD`] mounted there. Where neither works (not root, no `mkfs.xfs`, no loop
/// devices) the pool stays where it is and the answer says why.
pub fn reflink_pool(pool: &Path, image: &Path, bytes: u64) -> PoolFs {
    if let Err(e) = std::fs::create_dir_all(pool) {
        return PoolFs::Without(format!("cannot create {}: {e}", pool.display()));
    }
    match liteio_agent::engine::file::dir_supports_reflink(pool) {
        Ok(true) => return PoolFs::Native,
        Ok(false) => {}
        Err(e) => return PoolFs::Without(format!("cannot probe for reflinks: {e}")),
    }
    match XfsImage::create(image, pool, bytes.saturating_add(XFS_OVERHEAD)) {
        Ok(fs) => PoolFs::Image(fs),
        Err(e) => PoolFs::Without(e),
    }
}
