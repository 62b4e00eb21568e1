//! Mounts, filesystems and loop devices: argv builders, parsers and the blocking helpers the
//! node service uses, and a mounted filesystem's usage ([`usage`], statvfs), which both
//! NodeGetVolumeStats and the metrics read. Nothing here formats a device that already
//! carries a filesystem.

use std::path::{Path, PathBuf};

use crate::cmd::{self, CommandRunner, argv};
use crate::csi::{VolumeUsage, volume_usage};
use crate::error::{CsiError, Result};

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Root of the mount within its filesystem (`/` for a whole device).
    pub root: String,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Per-mount options (`rw,relatime`).
    pub options: String,
    /// Filesystem type.
    pub fs_type: String,
    /// Mount source (`/dev/loop0`, or `udev` for a devtmpfs bind).
    pub source: String,
}

/// Undoes the octal escapes of mountinfo (`\040` = space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        // `\ooo` with a value that fits a byte (`\000`..`\377`); anything else is literal.
        if b[i] == b'\\'
            && i + 3 < b.len()
            && (b'0'..=b'3').contains(&b[i + 1])
            && b[i + 2..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses `/proc/self/mountinfo`; malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            if l.len() < 6 || r.len() < 2 {
                return None;
            }
            Some(MountEntry {
                root: unescape(l[3]),
                mount_point: PathBuf::from(unescape(l[4])),
                options: l[5].to_string(),
                fs_type: r[0].to_string(),
                source: unescape(r[1]),
            })
        })
        .collect()
}

/// The mount table read from `path`.
pub fn read_mounts(path: &Path) -> Result<Vec<MountEntry>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CsiError::io(format!("read {}", path.display()), e))?;
    Ok(parse_mountinfo(&text))
}

/// The last (top-most) mount at `target`, if any.
pub fn mount_at(mounts: &[MountEntry], target: &Path) -> Option<MountEntry> {
    let canon = std::fs::canonicalize(target).unwrap_or_else(|_| target.to_path_buf());
    mounts
        .iter()
        .rev()
        .find(|m| m.mount_point == canon || m.mount_point == target)
        .cloned()
}

/// Mount options for a staged filesystem: the requested flags (deduplicated, without
/// `ro`/`rw`, which [`mount_options`] decides), `nouuid` for an XFS clone (it carries its
/// origin's UUID), and `ro` when asked.
pub fn mount_options(requested: &[String], fs: &str, clone: bool, readonly: bool) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for f in requested.iter().flat_map(|f| f.split(',')) {
        let f = f.trim();
        if f.is_empty() || f == "ro" || f == "rw" || out.iter().any(|o| o == f) {
            continue;
        }
        out.push(f.to_string());
    }
    if fs == "xfs" && clone && !out.iter().any(|o| o == "nouuid") {
        out.push("nouuid".into());
    }
    if readonly {
        out.push("ro".into());
    }
    out
}

/// `mount -t <fs> [-o opts] <source> <target>`.
pub fn mount_argv(source: &Path, target: &Path, fs: &str, options: &[String]) -> Vec<String> {
    let mut a = argv(&["mount", "-t", fs]);
    if !options.is_empty() {
        a.push("-o".into());
        a.push(options.join(","));
    }
    a.push(source.display().to_string());
    a.push(target.display().to_string());
    a
}

/// `mount --bind <source> <target>`.
pub fn bind_argv(source: &Path, target: &Path) -> Vec<String> {
    argv(&[
        "mount",
        "--bind",
        &source.display().to_string(),
        &target.display().to_string(),
    ])
}

/// `mount -o remount,bind,ro <target>`: makes a bind mount read-only.
pub fn remount_ro_argv(target: &Path) -> Vec<String> {
    argv(&[
        "mount",
        "-o",
        "remount,bind,ro",
        &target.display().to_string(),
    ])
}

/// `umount <target>`.
pub fn umount_argv(target: &Path) -> Vec<String> {
    argv(&["umount", &target.display().to_string()])
}

/// `blkid -p -o value -s TYPE <dev>` (probe the device itself, not the cache).
pub fn blkid_argv(dev: &Path) -> Vec<String> {
    argv(&[
        "blkid",
        "-p",
        "-o",
        "value",
        "-s",
        "TYPE",
        &dev.display().to_string(),
    ])
}

/// mkfs for `fs` with the extra arguments of `obnvmf/mkfsParams`.
pub fn mkfs_argv(fs: &str, dev: &Path, extra: &str) -> Result<Vec<String>> {
    let mut a = match fs {
        "xfs" => argv(&["mkfs.xfs", "-f", "-m", "reflink=0"]),
        "ext4" => argv(&["mkfs.ext4", "-F", "-m0"]),
        other => {
            return Err(CsiError::FailedPrecondition(format!(
                "cannot create filesystem {other:?}"
            )));
        }
    };
    a.extend(extra.split_whitespace().map(str::to_string));
    a.push(dev.display().to_string());
    Ok(a)
}

/// The command that grows a mounted filesystem to its device's size.
pub fn grow_argv(fs: &str, dev: &Path, mount_point: &Path) -> Result<Vec<String>> {
    match fs {
        "xfs" => Ok(argv(&["xfs_growfs", &mount_point.display().to_string()])),
        "ext4" | "ext3" | "ext2" => Ok(argv(&["resize2fs", &dev.display().to_string()])),
        other => Err(CsiError::FailedPrecondition(format!(
            "cannot grow filesystem {other:?}"
        ))),
    }
}

/// The filesystem on `dev`, `None` when blkid finds none (exit code 2). Any other failure is
/// an error: not knowing must never lead to formatting.
pub fn probe_fs(runner: &dyn CommandRunner, dev: &Path) -> Result<Option<String>> {
    let out = cmd::run(runner, &blkid_argv(dev))?;
    match out.code {
        Some(0) => {
            let t = out.stdout.trim();
            Ok(if t.is_empty() {
                None
            } else {
                Some(t.to_string())
            })
        }
        Some(2) => Ok(None),
        _ => Err(CsiError::Command {
            command: blkid_argv(dev).join(" "),
            status: format!("{:?}", out.code),
            stderr: out.stderr.trim().to_string(),
        }),
    }
}

pub use liteio_node::losetup::parse_losetup_j;

/// Loop devices currently bound to `file`.
pub fn loops_for(runner: &dyn CommandRunner, file: &Path) -> Result<Vec<PathBuf>> {
    Ok(liteio_node::losetup::loops_for(runner, file)?)
}

/// The loop device of `file`, attaching one when none exists.
pub fn attach_loop(runner: &dyn CommandRunner, file: &Path) -> Result<PathBuf> {
    Ok(liteio_node::losetup::attach(runner, file)?)
}

/// Size in bytes of a block device (or a regular file).
pub fn device_size(dev: &Path) -> Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut f =
        std::fs::File::open(dev).map_err(|e| CsiError::io(format!("open {}", dev.display()), e))?;
    f.seek(SeekFrom::End(0))
        .map_err(|e| CsiError::io(format!("size of {}", dev.display()), e))
}

/// statvfs of `path` as CSI usage.
pub fn usage(path: &Path) -> std::io::Result<Vec<VolumeUsage>> {
    let s = rustix::fs::statvfs(path).map_err(std::io::Error::from)?;
    let frsize = s.f_frsize.max(1);
    let b = |n: u64| i64::try_from(n.saturating_mul(frsize)).unwrap_or(i64::MAX);
    let n = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    Ok(vec![
        VolumeUsage {
            available: b(s.f_bavail),
            total: b(s.f_blocks),
            used: b(s.f_blocks.saturating_sub(s.f_bfree)),
            unit: volume_usage::Unit::Bytes as i32,
        },
        VolumeUsage {
            available: n(s.f_ffree),
            total: n(s.f_files),
            used: n(s.f_files.saturating_sub(s.f_ffree)),
            unit: volume_usage::Unit::Inodes as i32,
        },
    ])
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
100 22 7:0 / /var/lib/kubelet/plugins/staging/pv\\0401 rw,relatime shared:50 - xfs /dev/loop0 rw,attr2
101 22 7:0 / /var/lib/kubelet/pods/p/volumes/v ro,relatime shared:50 - xfs /dev/loop0 rw,attr2
102 22 0:5 /loop0 /var/lib/kubelet/pods/p/dev/v rw,nosuid shared:2 - devtmpfs udev rw,size=1k
garbage line
";

    /// Found by the issue 16 sweep: `\\4xx`..`\\7xx` overflowed a byte (a panic in debug
    /// builds); such a sequence is not an escape the kernel writes, so it stays literal.
    #[test]
    fn escapes_past_a_byte_stay_literal() {
        assert_eq!(unescape("a\\040b"), "a b");
        assert_eq!(unescape("a\\777b"), "a\\777b");
        assert_eq!(unescape("\\377"), "\u{FFFD}");
        assert_eq!(unescape("end\\04"), "end\\04");
    }

    #[test]
    fn mountinfo_parsing() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.len(), 4);
        assert_eq!(
            m[1].mount_point,
            Path::new("/var/lib/kubelet/plugins/staging/pv 1")
        );
        assert_eq!(m[1].source, "/dev/loop0");
        assert_eq!(m[1].fs_type, "xfs");
        assert_eq!(m[2].options, "ro,relatime");
        assert_eq!(m[3].root, "/loop0");
        let at = mount_at(&m, Path::new("/var/lib/kubelet/pods/p/volumes/v")).unwrap();
        assert_eq!(at.source, "/dev/loop0");
        assert!(mount_at(&m, Path::new("/nope")).is_none());
    }

    #[test]
    fn options() {
        let req = vec!["noatime,discard".to_string(), "noatime".into(), "rw".into()];
        assert_eq!(
            mount_options(&req, "xfs", true, false),
            ["noatime", "discard", "nouuid"]
        );
        assert_eq!(
            mount_options(&req, "ext4", true, true),
            ["noatime", "discard", "ro"]
        );
        assert_eq!(
            mount_options(&[], "xfs", false, false),
            Vec::<String>::new()
        );
        assert_eq!(
            mount_argv(
                Path::new("/dev/loop0"),
                Path::new("/s"),
                "xfs",
                &["nouuid".into()]
            )
            .join(" "),
            "mount -t xfs -o nouuid /dev/loop0 /s"
        );
        assert_eq!(
            mount_argv(Path::new("/d"), Path::new("/s"), "ext4", &[]).join(" "),
            "mount -t ext4 /d /s"
        );
        assert_eq!(
            bind_argv(Path::new("/a"), Path::new("/b")).join(" "),
            "mount --bind /a /b"
        );
        assert_eq!(
            remount_ro_argv(Path::new("/b")).join(" "),
            "mount -o remount,bind,ro /b"
        );
    }

    #[test]
    fn filesystem_commands() {
        assert_eq!(
            mkfs_argv("xfs", Path::new("/dev/x"), "-b size=4096")
                .unwrap()
                .join(" "),
            "mkfs.xfs -f -m reflink=0 -b size=4096 /dev/x"
        );
        assert_eq!(
            mkfs_argv("ext4", Path::new("/dev/x"), "")
                .unwrap()
                .join(" "),
            "mkfs.ext4 -F -m0 /dev/x"
        );
        assert!(mkfs_argv("zfs", Path::new("/dev/x"), "").is_err());
        assert_eq!(
            grow_argv("xfs", Path::new("/dev/x"), Path::new("/m"))
                .unwrap()
                .join(" "),
            "xfs_growfs /m"
        );
        assert_eq!(
            grow_argv("ext4", Path::new("/dev/x"), Path::new("/m"))
                .unwrap()
                .join(" "),
            "resize2fs /dev/x"
        );
        assert_eq!(
            blkid_argv(Path::new("/dev/x")).join(" "),
            "blkid -p -o value -s TYPE /dev/x"
        );
    }

    #[test]
    fn probing_never_guesses() {
        let r = crate::cmd::ScriptedRunner::new();
        r.once(&["blkid"], crate::cmd::Output::ok("xfs\n"))
            .once(&["blkid"], crate::cmd::Output::fail(2, ""))
            .once(&["blkid"], crate::cmd::Output::fail(4, "I/O error"));
        let d = Path::new("/dev/x");
        assert_eq!(probe_fs(&r, d).unwrap().as_deref(), Some("xfs"));
        assert_eq!(probe_fs(&r, d).unwrap(), None);
        assert!(probe_fs(&r, d).is_err());
    }

    #[test]
    fn losetup_output() {
        assert_eq!(
            parse_losetup_j(
                "/dev/loop3: []: (/pool/volumes/pvc-1.img)\n/dev/loop7: [2049]:12 (/x)\n"
            ),
            vec![PathBuf::from("/dev/loop3"), PathBuf::from("/dev/loop7")]
        );
        assert!(parse_losetup_j("").is_empty());
        let r = crate::cmd::ScriptedRunner::new();
        r.once(&["losetup", "-j"], crate::cmd::Output::ok("")).once(
            &["losetup", "--find"],
            crate::cmd::Output::ok("/dev/loop5\n"),
        );
        assert_eq!(
            attach_loop(&r, Path::new("/f.img")).unwrap(),
            PathBuf::from("/dev/loop5")
        );
        assert_eq!(
            r.lines(),
            ["losetup -j /f.img", "losetup --find --show /f.img"]
        );
    }
}
