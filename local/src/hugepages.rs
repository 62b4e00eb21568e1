//! `liteio-local --hugepages N`: the agent's SPDK on 2 MiB hugepages, as production nodes run
//! it, reserved for the run and given back at its end.
//!
//! The run raises the kernel's 2 MiB pool by N pages (never taking pages others reserved),
//! mounts a hugetlbfs of its own at `<dir>/hugepages` limited to those N pages, and configures
//! the agent with `noHuge: false`, `memSizeMiB: 2·N` (all of it taken at SPDK's start, so a
//! shortfall fails the start instead of a later request) and `hugeDir` on that mount. At exit
//! (also after an error or Ctrl-C) the mount goes and the previous `nr_hugepages` is written
//! back; the count before is also kept in `<dir>/hugepages-reserved`, from which the next run
//! in the same directory restores it when this one was killed.
//!
//! When the kernel finds fewer free pages than asked for, the run gives back what it got and
//! stops with a message saying how many it found: an operator who asked for hugepages gets
//! them or a clear failure, never a silent fallback to the development mode.

use std::path::{Path, PathBuf};

use liteio_node::hugepages::{self, HugetlbfsMount, PAGE_BYTES, Reservation};

use crate::LocalError;

/// The record of the count before the run, in the run directory.
pub const RECORD: &str = "hugepages-reserved";
/// The run's hugetlbfs mount, in the run directory.
pub const MOUNT: &str = "hugepages";
/// Fewest pages accepted: SPDK's default buffer pools and the NVMe/TCP transport need about
/// 400 MiB.
pub const MIN_PAGES: u64 = 256;

/// How the agent's SPDK gets its memory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SpdkMemory {
    /// Ordinary memory (`noHuge: true`), for development: no root, nothing reserved.
    #[default]
    NoHuge,
    /// 2 MiB hugepages from the hugetlbfs mounted at `dir`, `mem_mib` taken at start.
    Hugepages {
        /// The hugetlbfs mount (`spdk.hugeDir`).
        dir: PathBuf,
        /// `spdk.memSizeMiB`.
        mem_mib: u32,
    },
}

/// The hugepages one run holds. Dropping it unmounts and gives the pages back; prefer
/// [`RunHugepages::release`], which says what it did.
#[derive(Debug)]
pub struct RunHugepages {
    // Field order is drop order: the mount goes before the pages are given back.
    mount: HugetlbfsMount,
    reservation: Reservation,
}

impl RunHugepages {
    /// Reserves `pages` 2 MiB pages for a run in `dir` (which exists) and mounts them.
    pub fn reserve(dir: &Path, pages: u64) -> Result<Self, LocalError> {
        if pages < MIN_PAGES {
            return Err(LocalError::Hugepages(format!(
                "{pages} pages ({} MiB) are too few: the agent's SPDK needs about 400 MiB; use at least {MIN_PAGES}",
                pages.saturating_mul(PAGE_BYTES) >> 20
            )));
        }
        let reservation = Reservation::reserve(pages, Some(&dir.join(RECORD)))
            .map_err(|e| LocalError::Hugepages(e.to_string()))?;
        let mount = HugetlbfsMount::mount(&dir.join(MOUNT), pages)
            .map_err(|e| LocalError::Hugepages(format!("{e}: {}", error_source(&e))))?;
        Ok(Self { mount, reservation })
    }

    /// Pages reserved on top of the kernel's count before the run.
    pub fn pages(&self) -> u64 {
        self.reservation.pages()
    }

    /// The kernel's count before the run.
    pub fn previous(&self) -> u64 {
        self.reservation.previous()
    }

    /// The agent's memory settings on these pages.
    pub fn memory(&self) -> SpdkMemory {
        SpdkMemory::Hugepages {
            dir: self.mount.path().to_path_buf(),
            mem_mib: u32::try_from(self.pages().saturating_mul(PAGE_BYTES) >> 20)
                .unwrap_or(u32::MAX),
        }
    }

    /// The hugetlbfs mount.
    pub fn mount_path(&self) -> &Path {
        self.mount.path()
    }

    /// Unmounts and gives the pages back (call it after the agent stopped); returns what it
    /// did, for the run's output.
    pub fn release(self) -> Result<String, LocalError> {
        let Self { mount, reservation } = self;
        let (pages, previous) = (reservation.pages(), reservation.previous());
        let path = mount.path().to_path_buf();
        mount.unmount().map_err(|e| {
            LocalError::Hugepages(format!("cannot unmount {}: {e}", path.display()))
        })?;
        reservation
            .restore()
            .map_err(|e| LocalError::Hugepages(e.to_string()))?;
        Ok(format!(
            "gave back {pages} hugepages: nr_hugepages is {previous} again"
        ))
    }
}

fn error_source(e: &dyn std::error::Error) -> String {
    e.source().map(ToString::to_string).unwrap_or_default()
}

/// After a run in `dir` that was killed: puts back the kernel's count it recorded. Call it
/// after its mounts were removed ([`crate::netns::cleanup`]). Returns what it did.
pub fn restore_after_crash(dir: &Path) -> Option<String> {
    match hugepages::restore_recorded(&dir.join(RECORD)) {
        Ok(Some(n)) => Some(format!("nr_hugepages back to {n}")),
        Ok(None) => None,
        Err(e) => Some(format!("hugepages not given back: {e}")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn too_few_pages_are_refused_before_anything_is_reserved() {
        let d = tempfile::tempdir().unwrap();
        let e = RunHugepages::reserve(d.path(), MIN_PAGES - 1).unwrap_err();
        assert!(e.to_string().contains("use at least 256"), "{e}");
        assert!(!d.path().join(RECORD).exists() && !d.path().join(MOUNT).exists());
    }

    #[test]
    fn nothing_recorded_means_nothing_to_restore() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(restore_after_crash(d.path()), None);
    }
}
