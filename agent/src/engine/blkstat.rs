//! I/O counters of kernel block devices, for the engines whose volumes are kernel devices
//! (file engine volumes bound to loop devices, LVM logical volumes).
//!
//! Everything is read from sysfs at scrape time: `/sys/block/<dev>/stat` (one line of
//! counters, `Documentation/ABI/stable/sysfs-block`) and, to find the loop devices of a file,
//! `/sys/block/loop*/loop/backing_file`. No commands run; a scrape costs a few small reads.

use std::fs;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// Where the kernel lists block devices.
pub const SYS_BLOCK: &str = "/sys/block";

/// The counters of `/sys/block/<dev>/stat`. Sectors are 512 bytes whatever the device's
/// block size; times are milliseconds. Fields a kernel does not print (discard before 4.18,
/// flush before 5.5) are 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockStat {
    /// Reads completed.
    pub read_ios: u64,
    /// Reads merged.
    pub read_merges: u64,
    /// Sectors read.
    pub read_sectors: u64,
    /// Milliseconds spent reading.
    pub read_ticks_ms: u64,
    /// Writes completed.
    pub write_ios: u64,
    /// Writes merged.
    pub write_merges: u64,
    /// Sectors written.
    pub write_sectors: u64,
    /// Milliseconds spent writing.
    pub write_ticks_ms: u64,
    /// I/Os in flight now (a gauge).
    pub in_flight: u64,
    /// Milliseconds the device had I/O in flight.
    pub io_ticks_ms: u64,
    /// Weighted milliseconds of I/O (time × queue depth).
    pub time_in_queue_ms: u64,
    /// Discards completed.
    pub discard_ios: u64,
    /// Discards merged.
    pub discard_merges: u64,
    /// Sectors discarded.
    pub discard_sectors: u64,
    /// Milliseconds spent discarding.
    pub discard_ticks_ms: u64,
}

/// Bytes per sector in `stat`.
pub const SECTOR: u64 = 512;

/// Parses the content of `/sys/block/<dev>/stat`: at least 11 whitespace-separated numbers
/// (older kernels), 15 with discards, 17 with flushes. `None` when it is not that.
pub fn parse_stat(text: &str) -> Option<BlockStat> {
    let v: Vec<u64> = text
        .split_ascii_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    if v.len() < 11 {
        return None;
    }
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    Some(BlockStat {
        read_ios: at(0),
        read_merges: at(1),
        read_sectors: at(2),
        read_ticks_ms: at(3),
        write_ios: at(4),
        write_merges: at(5),
        write_sectors: at(6),
        write_ticks_ms: at(7),
        in_flight: at(8),
        io_ticks_ms: at(9),
        time_in_queue_ms: at(10),
        discard_ios: at(11),
        discard_merges: at(12),
        discard_sectors: at(13),
        discard_ticks_ms: at(14),
    })
}

/// Reads `<sys_block>/<dev>/stat`; `None` when the device is gone or the file unreadable.
pub fn read_stat(sys_block: &Path, dev: &str) -> Option<BlockStat> {
    let text = fs::read_to_string(sys_block.join(dev).join("stat")).ok()?;
    parse_stat(&text)
}

/// Every bound loop device (`loop3`, …) with its backing file, sorted by device. A backing
/// file the kernel marks ` (deleted)` is listed with that suffix, so it matches no volume.
pub fn loop_backing_files(sys_block: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = fs::read_dir(sys_block) else {
        return Vec::new();
    };
    let mut out: Vec<(String, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| name.starts_with("loop"))
        .filter_map(|name| {
            let mut b = fs::read(sys_block.join(&name).join("loop").join("backing_file")).ok()?;
            if b.last() == Some(&b'\n') {
                b.pop();
            }
            let path = PathBuf::from(std::ffi::OsString::from_vec(b));
            Some((name, path))
        })
        .collect();
    out.sort();
    out
}

/// Loop devices whose backing file is `file`, sorted. `file` should be canonical (the
/// kernel records the resolved path).
pub fn loop_devices_backed_by(sys_block: &Path, file: &Path) -> Vec<String> {
    loop_backing_files(sys_block)
        .into_iter()
        .filter(|(_, b)| b == file)
        .map(|(dev, _)| dev)
        .collect()
}

/// The kernel name (`dm-3`, `loop0`, `sda`) of block device node `dev`, following symlinks
/// (`/dev/vg/lv` → `/dev/dm-3`). `None` when it does not exist.
pub fn kernel_name(dev: &Path) -> Option<String> {
    let real: PathBuf = fs::canonicalize(dev).ok()?;
    real.file_name()?.to_str().map(str::to_string)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn parses_a_5_x_stat_line() {
        // Kernel 5.5+: 17 fields, right-aligned with runs of spaces.
        let line = "     120       3     9600      44      250       7    20480      310        2      400      360        5        0      128        1       9        2\n";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.read_ios, 120);
        assert_eq!(s.read_merges, 3);
        assert_eq!(s.read_sectors, 9600);
        assert_eq!(s.read_ticks_ms, 44);
        assert_eq!(s.write_ios, 250);
        assert_eq!(s.write_merges, 7);
        assert_eq!(s.write_sectors, 20480);
        assert_eq!(s.write_ticks_ms, 310);
        assert_eq!(s.in_flight, 2);
        assert_eq!(s.io_ticks_ms, 400);
        assert_eq!(s.time_in_queue_ms, 360);
        assert_eq!(s.discard_ios, 5);
        assert_eq!(s.discard_merges, 0);
        assert_eq!(s.discard_sectors, 128);
        assert_eq!(s.discard_ticks_ms, 1);
    }

    #[test]
    fn old_kernels_have_no_discard_fields() {
        let s = parse_stat("1 2 3 4 5 6 7 8 0 10 11").unwrap();
        assert_eq!((s.read_ios, s.time_in_queue_ms, s.discard_ios), (1, 11, 0));
    }

    #[test]
    fn refuses_what_is_not_a_stat_line() {
        assert_eq!(parse_stat(""), None);
        assert_eq!(parse_stat("1 2 3"), None);
        assert_eq!(parse_stat("1 2 3 4 5 6 7 8 9 10 x"), None);
        assert_eq!(parse_stat("1 2 3 4 5 6 7 8 9 10 -1"), None);
    }

    fn fake_loop(sys: &Path, dev: &str, backing: Option<&str>, stat: &str) {
        let d = sys.join(dev);
        std::fs::create_dir_all(d.join("loop")).unwrap();
        std::fs::write(d.join("stat"), stat).unwrap();
        if let Some(b) = backing {
            std::fs::write(d.join("loop").join("backing_file"), format!("{b}\n")).unwrap();
        }
    }

    #[test]
    fn finds_the_loop_devices_of_a_file() {
        let sys = tempfile::tempdir().unwrap();
        let s = sys.path();
        fake_loop(
            s,
            "loop0",
            Some("/pool/volumes/a.img"),
            "1 0 8 0 0 0 0 0 0 0 0",
        );
        fake_loop(s, "loop1", None, "0 0 0 0 0 0 0 0 0 0 0");
        fake_loop(
            s,
            "loop2",
            Some("/pool/volumes/b.img"),
            "0 0 0 0 0 0 0 0 0 0 0",
        );
        fake_loop(
            s,
            "loop7",
            Some("/pool/volumes/a.img"),
            "0 0 0 0 3 0 24 1 0 1 1",
        );
        fake_loop(
            s,
            "loop9",
            Some("/pool/volumes/a.img (deleted)"),
            "0 0 0 0 0 0 0 0 0 0 0",
        );
        std::fs::create_dir_all(s.join("sda")).unwrap();
        let a = Path::new("/pool/volumes/a.img");
        assert_eq!(loop_devices_backed_by(s, a), vec!["loop0", "loop7"]);
        assert_eq!(read_stat(s, "loop7").unwrap().write_sectors, 24);
        assert_eq!(read_stat(s, "loop8"), None);
        assert!(loop_devices_backed_by(s, Path::new("/pool/volumes/c.img")).is_empty());
        assert!(loop_devices_backed_by(&s.join("missing"), a).is_empty());
    }

    #[test]
    fn kernel_name_follows_symlinks() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("dm-3"), "").unwrap();
        std::fs::create_dir(d.path().join("vg")).unwrap();
        std::os::unix::fs::symlink("../dm-3", d.path().join("vg").join("lv")).unwrap();
        assert_eq!(
            kernel_name(&d.path().join("vg/lv")).as_deref(),
            Some("dm-3")
        );
        assert_eq!(kernel_name(&d.path().join("vg/none")), None);
    }
}
