//! 2 MiB hugepages for SPDK: reserving them from the kernel and giving back exactly what was
//! there before, a hugetlbfs mount that holds SPDK to the reserved number, and how much of a
//! process's memory is mapped from such a mount.
//!
//! The kernel's pool of 2 MiB pages is global (`/sys/kernel/mm/hugepages/hugepages-2048kB`).
//! [`Reservation::reserve`] raises it by the pages asked for (it never takes pages other users
//! reserved) and lowers it back to the previous count when dropped; the previous count is
//! also written to a record file, so that a later run can restore it after a crash
//! ([`restore_recorded`]). Pages still mapped when the count is lowered become "surplus"
//! pages, which the kernel frees as soon as their last user unmaps them.

use std::ffi::CString;
use std::path::{Path, PathBuf};

/// Size of one hugepage handled here.
pub const PAGE_BYTES: u64 = 2 << 20;

/// The kernel's 2 MiB hugepage pool, whatever the default hugepage size.
pub const SYSFS_2M: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

/// Why hugepages could not be reserved, mounted or given back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HugepageError {
    /// Reserving needs root (writing the kernel's count, mounting hugetlbfs).
    #[error("reserving hugepages needs root (it writes {0}/nr_hugepages and mounts hugetlbfs)")]
    NotRoot(String),
    /// This kernel has no 2 MiB hugepages.
    #[error("this kernel has no 2 MiB hugepages ({0} is missing)")]
    Unsupported(String),
    /// A count file could not be read or held no number.
    #[error("cannot read {path}: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The kernel refused the new count.
    #[error("cannot set {path} to {count}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The count written.
        count: u64,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The kernel found fewer free 2 MiB pages than asked for; the count was put back.
    #[error(
        "the kernel could reserve only {got} of {wanted} 2 MiB hugepages (too little free or too fragmented memory); nothing was kept"
    )]
    Short {
        /// Pages asked for.
        wanted: u64,
        /// Pages the kernel found.
        got: u64,
    },
    /// The hugetlbfs mount failed.
    #[error("cannot mount hugetlbfs on {path}")]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// The 2 MiB pool's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Pages in the pool (sysfs `nr_hugepages`), surplus pages included.
    pub total: u64,
    /// Pages in the pool and not in use (`free_hugepages`).
    pub free: u64,
    /// Pages beyond the persistent count, freed when their user unmaps them
    /// (`surplus_hugepages`): those of a reservation given back while still in use.
    pub surplus: u64,
}

impl Counts {
    /// The persistent count, what `/proc/sys/vm/nr_hugepages` shows and a write sets.
    pub fn persistent(&self) -> u64 {
        self.total.saturating_sub(self.surplus)
    }
}

fn read_count(path: &Path) -> Result<u64, HugepageError> {
    let text = std::fs::read_to_string(path).map_err(|e| HugepageError::Read {
        path: path.into(),
        reason: e.to_string(),
    })?;
    text.trim().parse().map_err(|_| HugepageError::Read {
        path: path.into(),
        reason: format!("{:?} is not a number", text.trim()),
    })
}

fn write_count(path: &Path, count: u64) -> Result<(), HugepageError> {
    std::fs::write(path, format!("{count}\n")).map_err(|source| HugepageError::Write {
        path: path.into(),
        count,
        source,
    })
}

/// The counts of the pool in `sysfs` (normally [`SYSFS_2M`]).
pub fn counts_in(sysfs: &Path) -> Result<Counts, HugepageError> {
    if !sysfs.is_dir() {
        return Err(HugepageError::Unsupported(sysfs.display().to_string()));
    }
    Ok(Counts {
        total: read_count(&sysfs.join("nr_hugepages"))?,
        free: read_count(&sysfs.join("free_hugepages"))?,
        // Absent in the fakes of unit tests; the kernel always has it.
        surplus: match sysfs.join("surplus_hugepages") {
            p if p.exists() => read_count(&p)?,
            _ => 0,
        },
    })
}

/// The counts of the kernel's 2 MiB pool.
pub fn counts() -> Result<Counts, HugepageError> {
    counts_in(Path::new(SYSFS_2M))
}

/// Extra 2 MiB hugepages held from the kernel; dropping it gives them back (see
/// [`Reservation::restore`]).
#[derive(Debug)]
pub struct Reservation {
    sysfs: PathBuf,
    record: Option<PathBuf>,
    previous: u64,
    pages: u64,
    restored: bool,
}

impl Reservation {
    /// Raises the kernel's 2 MiB pool by `pages` (as root). When `record` is given the count
    /// before is written there first, for [`restore_recorded`] after a crash. Fails with
    /// [`HugepageError::Short`], the count put back, when the kernel finds fewer pages.
    pub fn reserve(pages: u64, record: Option<&Path>) -> Result<Self, HugepageError> {
        if !rustix::process::geteuid().is_root() {
            return Err(HugepageError::NotRoot(SYSFS_2M.into()));
        }
        Self::reserve_in(Path::new(SYSFS_2M), pages, record)
    }

    /// [`Reservation::reserve`] on the pool in `sysfs`, without the root check (tests).
    pub fn reserve_in(
        sysfs: &Path,
        pages: u64,
        record: Option<&Path>,
    ) -> Result<Self, HugepageError> {
        let previous = counts_in(sysfs)?.persistent();
        let wanted = previous.saturating_add(pages);
        if let Some(r) = record {
            std::fs::write(r, format!("{previous}\n")).map_err(|source| HugepageError::Write {
                path: r.into(),
                count: previous,
                source,
            })?;
        }
        // From here on, dropping `me` puts the count back (and removes the record).
        let me = Self {
            sysfs: sysfs.into(),
            record: record.map(Path::to_path_buf),
            previous,
            pages,
            restored: false,
        };
        write_count(&sysfs.join("nr_hugepages"), wanted)?;
        let got = counts_in(sysfs)?.persistent();
        if got < wanted {
            return Err(HugepageError::Short {
                wanted: pages,
                got: got.saturating_sub(previous),
            });
        }
        tracing::info!(pages, previous, "reserved 2 MiB hugepages");
        Ok(me)
    }

    /// The pages reserved on top of the count before.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// The count before, which [`Reservation::restore`] puts back.
    pub fn previous(&self) -> u64 {
        self.previous
    }

    /// Sets the pool back to the count before and removes the record. Pages still in use
    /// are freed by the kernel when their user unmaps them (they become surplus pages).
    pub fn restore(mut self) -> Result<(), HugepageError> {
        self.put_back()
    }

    fn put_back(&mut self) -> Result<(), HugepageError> {
        if self.restored {
            return Ok(());
        }
        write_count(&self.sysfs.join("nr_hugepages"), self.previous)?;
        self.restored = true;
        if let Some(r) = &self.record {
            let _ = std::fs::remove_file(r);
        }
        tracing::info!(previous = self.previous, "gave back the 2 MiB hugepages");
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Err(e) = self.put_back() {
            tracing::error!(error = %e, "hugepages not given back");
        }
    }
}

/// Puts back the 2 MiB hugepage count a crashed run wrote to `record` and removes the record.
/// Returns the count restored, or `None` when there was no record.
pub fn restore_recorded(record: &Path) -> Result<Option<u64>, HugepageError> {
    restore_recorded_in(Path::new(SYSFS_2M), record)
}

/// [`restore_recorded`] on the pool in `sysfs` (tests).
pub fn restore_recorded_in(sysfs: &Path, record: &Path) -> Result<Option<u64>, HugepageError> {
    if !record.exists() {
        return Ok(None);
    }
    let previous = read_count(record)?;
    write_count(&sysfs.join("nr_hugepages"), previous)?;
    let _ = std::fs::remove_file(record);
    Ok(Some(previous))
}

/// A hugetlbfs mount of 2 MiB pages limited to a number of pages, so that what uses it (SPDK
/// with `--huge-dir`) cannot take more than was reserved for it. Dropping it unmounts (lazily
/// when pages are still mapped: the mount goes once they are unmapped).
#[derive(Debug)]
pub struct HugetlbfsMount {
    path: PathBuf,
    mounted: bool,
}

impl HugetlbfsMount {
    /// Creates `path` if needed and mounts hugetlbfs there, at most `pages` pages.
    pub fn mount(path: &Path, pages: u64) -> Result<Self, HugepageError> {
        let fail = |source: std::io::Error| HugepageError::Mount {
            path: path.into(),
            source,
        };
        std::fs::create_dir_all(path).map_err(fail)?;
        let size = pages.saturating_mul(PAGE_BYTES);
        let data = CString::new(format!("pagesize=2M,size={size}"))
            .map_err(|e| fail(std::io::Error::other(e)))?;
        rustix::mount::mount(
            "nodev",
            path,
            "hugetlbfs",
            rustix::mount::MountFlags::NODEV | rustix::mount::MountFlags::NOSUID,
            data.as_c_str(),
        )
        .map_err(|e| fail(e.into()))?;
        Ok(Self {
            path: path.into(),
            mounted: true,
        })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Unmounts now (lazily when pages are still mapped).
    pub fn unmount(mut self) -> std::io::Result<()> {
        self.release()
    }

    fn release(&mut self) -> std::io::Result<()> {
        if !self.mounted {
            return Ok(());
        }
        use rustix::mount::{UnmountFlags, unmount};
        unmount(&self.path, UnmountFlags::empty())
            .or_else(|_| unmount(&self.path, UnmountFlags::DETACH))?;
        self.mounted = false;
        Ok(())
    }
}

impl Drop for HugetlbfsMount {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            tracing::error!(path = %self.path.display(), error = %e, "hugetlbfs not unmounted");
        }
    }
}

/// Bytes of process `pid`'s memory mapped from files below `mount` (DPDK's `rtemap_*` files,
/// shown as deleted once DPDK unlinked them), from `/proc/<pid>/maps`.
pub fn mapped_bytes(pid: u32, mount: &Path) -> std::io::Result<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(mapped_bytes_in(&maps, mount))
}

/// [`mapped_bytes`] of the text of a `maps` file.
pub fn mapped_bytes_in(maps: &str, mount: &Path) -> u64 {
    let prefix = format!("{}/", mount.display().to_string().trim_end_matches('/'));
    maps.lines()
        .filter_map(|line| {
            // address perms offset dev inode path; the path is the rest after five fields.
            let mut rest = line;
            let mut fields = Vec::with_capacity(5);
            for _ in 0..5 {
                rest = rest.trim_start();
                let end = rest.find(' ')?;
                fields.push(&rest[..end]);
                rest = &rest[end..];
            }
            if !rest.trim_start().starts_with(&prefix) {
                return None;
            }
            let (start, end) = fields[0].split_once('-')?;
            let start = u64::from_str_radix(start, 16).ok()?;
            let end = u64::from_str_radix(end, 16).ok()?;
            end.checked_sub(start)
        })
        // Saturating: the text is parsed as given; a malformed one must not panic.
        .fold(0u64, |sum, n| sum.saturating_add(n))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Found by the issue 16 sweep: ranges that add past u64 overflowed (a panic in debug
    /// builds). The kernel's ranges are disjoint and cannot, but the function takes any text.
    #[test]
    fn huge_ranges_saturate() {
        let maps = "0-ffffffffffffffff rw-s 0 00:2f 1 /dev/hugepages/rtemap_0\n\
                    0-ffffffffffffffff rw-s 0 00:2f 2 /dev/hugepages/rtemap_1\n";
        assert_eq!(mapped_bytes_in(maps, Path::new("/dev/hugepages")), u64::MAX);
    }

    fn fake_pool(total: u64, free: u64) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("nr_hugepages"), format!("{total}\n")).unwrap();
        std::fs::write(d.path().join("free_hugepages"), format!("{free}\n")).unwrap();
        d
    }

    fn total(d: &tempfile::TempDir) -> u64 {
        counts_in(d.path()).unwrap().total
    }

    #[test]
    fn a_reservation_adds_to_the_count_and_puts_it_back_when_dropped() {
        let d = fake_pool(6, 6);
        let record = d.path().join("record");
        let r = Reservation::reserve_in(d.path(), 128, Some(&record)).unwrap();
        assert_eq!((r.pages(), r.previous()), (128, 6));
        assert_eq!(total(&d), 134);
        assert_eq!(std::fs::read_to_string(&record).unwrap(), "6\n");
        drop(r);
        assert_eq!(total(&d), 6);
        assert!(!record.exists(), "the record goes with the reservation");
    }

    #[test]
    fn surplus_pages_are_not_persistent() {
        let d = fake_pool(10, 0);
        std::fs::write(d.path().join("surplus_hugepages"), "4\n").unwrap();
        let c = counts_in(d.path()).unwrap();
        assert_eq!((c.total, c.surplus, c.persistent()), (10, 4, 6));
    }

    #[test]
    fn a_crashed_runs_count_is_restored_from_its_record() {
        let d = fake_pool(3, 3);
        let record = d.path().join("record");
        let r = Reservation::reserve_in(d.path(), 10, Some(&record)).unwrap();
        std::mem::forget(r); // a crash: nothing put back
        assert_eq!(total(&d), 13);
        assert_eq!(restore_recorded_in(d.path(), &record).unwrap(), Some(3));
        assert_eq!(total(&d), 3);
        assert_eq!(restore_recorded_in(d.path(), &record).unwrap(), None);
    }

    #[test]
    fn a_missing_pool_or_a_bad_count_is_named() {
        let e = counts_in(Path::new("/nonexistent/hugepages-2048kB")).unwrap_err();
        assert!(e.to_string().contains("no 2 MiB hugepages"), "{e}");
        let d = fake_pool(0, 0);
        std::fs::write(d.path().join("nr_hugepages"), "many\n").unwrap();
        let e = Reservation::reserve_in(d.path(), 1, None).unwrap_err();
        assert!(e.to_string().contains("\"many\" is not a number"), "{e}");
    }

    #[test]
    fn hugetlbfs_mappings_are_summed() {
        let maps = "\
200000000000-200000400000 rw-s 00000000 00:2f 1234      /run/x/hugepages/spdk_pid9map_0 (deleted)
200000400000-200000600000 rw-s 00000000 00:2f 1235      /run/x/hugepages/spdk_pid9map_1 (deleted)
7f0000000000-7f0000001000 r--p 00000000 fd:01 99        /run/x/hugepages-other/lib.so
7f0000001000-7f0000002000 rw-p 00000000 00:00 0 
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0          [stack]
";
        assert_eq!(
            mapped_bytes_in(maps, Path::new("/run/x/hugepages/")),
            6 << 20
        );
        assert_eq!(mapped_bytes_in(maps, Path::new("/elsewhere")), 0);
    }
}
