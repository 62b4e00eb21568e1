//! T1: the file engine on real filesystems: XFS with reflink in a loop-mounted image for
//! snapshot/clone/restore, tmpfs for the refusal, loop devices for local attach.
//! Needs root, `mkfs.xfs` and loop devices; otherwise prints one skip line per test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use common::host::{no_loop_devices, not_root, run};
use liteio_agent::engine::{ErrorKind, FileEngine, PoolEngine, VolumeOptions};

const MIB: u64 = 1 << 20;

fn skip_reason() -> Option<String> {
    if let Some(r) = not_root() {
        return Some(r);
    }
    if run("mkfs.xfs", &["-V"]).is_err() {
        return Some("mkfs.xfs not installed (xfsprogs)".into());
    }
    if let Some(r) = no_loop_devices() {
        return Some(r);
    }
    None
}

/// The tests of this file run one at a time: `losetup` scans open every loop device for a
/// moment, and a detach racing with another test's scan completes only when the scan closes
/// the device, which would make "detached" assertions flaky.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

macro_rules! require_env {
    ($test:literal) => {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = skip_reason() {
            println!("SKIP {}: {why}", $test);
            return;
        }
    };
}

/// A mounted scratch filesystem; unmounts and frees its loop device on drop, even when the
/// test panics.
struct ScratchFs {
    _dir: tempfile::TempDir,
    mount: PathBuf,
    mounted: bool,
    loop_dev: Option<String>,
}

impl ScratchFs {
    fn empty() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        Self {
            _dir: dir,
            mount,
            mounted: false,
            loop_dev: None,
        }
    }

    /// XFS with reflink=1 on a 300 MiB sparse image.
    fn xfs() -> Self {
        let mut fs = Self::empty();
        let img = fs._dir.path().join("xfs.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(300 * MIB)
            .unwrap();
        let img_s = img.to_string_lossy().into_owned();
        run("mkfs.xfs", &["-q", "-m", "reflink=1", &img_s]).unwrap();
        let dev = run("losetup", &["--find", "--show", &img_s]).unwrap();
        fs.loop_dev = Some(dev.clone());
        run("mount", &[&dev, &fs.mount.to_string_lossy()]).unwrap();
        fs.mounted = true;
        fs
    }

    fn tmpfs() -> Self {
        let mut fs = Self::empty();
        run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                "size=64m",
                "tmpfs",
                &fs.mount.to_string_lossy(),
            ],
        )
        .unwrap();
        fs.mounted = true;
        fs
    }

    fn pool_dir(&self) -> PathBuf {
        self.mount.join("pool")
    }
}

impl Drop for ScratchFs {
    fn drop(&mut self) {
        if self.mounted {
            // Volumes a failed test left attached would keep the filesystem busy.
            if let Ok(out) = run("losetup", &["-a"]) {
                let m = self.mount.to_string_lossy().into_owned();
                for line in out.lines().filter(|l| l.contains(&m)) {
                    if let Some((dev, _)) = line.split_once(':') {
                        let _ = run("losetup", &["-d", dev]);
                    }
                }
            }
            let m = self.mount.to_string_lossy().into_owned();
            if let Err(e) = run("umount", &[&m]) {
                // Busy (a loop device still closing): detach lazily, the kernel finishes.
                eprintln!("cleanup: {e}; lazy unmount");
                if let Err(e) = run("umount", &["-l", &m]) {
                    eprintln!("cleanup: {e}");
                }
            }
        }
        if let Some(dev) = &self.loop_dev
            && let Err(e) = run("losetup", &["-d", dev])
        {
            eprintln!("cleanup: {e}");
        }
    }
}

fn write_at(path: &Path, offset: u64, data: &[u8]) {
    let mut f = OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

fn read_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut f = std::fs::File::open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut buf = vec![0; len];
    f.read_exact(&mut buf).unwrap();
    buf
}

fn pattern(byte: u8) -> Vec<u8> {
    (0..64 * 1024).map(|i| byte ^ (i % 251) as u8).collect()
}

#[test]
fn reflink_snapshot_clone_restore_keep_content() {
    require_env!("reflink_snapshot_clone_restore_keep_content");
    let fs = ScratchFs::xfs();
    let e = FileEngine::new("xfs-pool", fs.pool_dir(), 0);
    let pool = e.ensure_pool().unwrap();
    assert!(e.supports_reflink().unwrap());
    assert!(pool.total_bytes > 200 * MIB && pool.total_bytes <= 300 * MIB);

    let vol = e
        .create_volume("vol", 8 * MIB, &VolumeOptions::default())
        .unwrap();
    let (a, b) = (pattern(0xA5), pattern(0x3C));
    write_at(&vol.path, 0, &a);
    write_at(&vol.path, 5 * MIB, &a);

    let snap = e.create_snapshot("vol", "vol_snap", 0).unwrap();
    assert_eq!(snap.snapshot_of.as_deref(), Some("vol"));
    assert_eq!(snap.size_bytes, 8 * MIB);
    // Idempotent with the same origin.
    assert_eq!(e.create_snapshot("vol", "vol_snap", 0).unwrap(), snap);

    write_at(&vol.path, 0, &b);
    write_at(&vol.path, 5 * MIB, &b);
    assert_eq!(read_at(&vol.path, 0, b.len()), b);
    assert_eq!(
        read_at(&snap.path, 0, a.len()),
        a,
        "snapshot changed with its origin"
    );
    assert_eq!(read_at(&snap.path, 5 * MIB, a.len()), a);

    let clone = e.clone_from_snapshot("vol_snap", "vol-clone").unwrap();
    assert_eq!(clone.size_bytes, 8 * MIB);
    assert_eq!(read_at(&clone.path, 5 * MIB, a.len()), a);
    assert_eq!(
        e.clone_from_snapshot("vol_snap", "vol-clone").unwrap(),
        clone
    );

    e.restore_snapshot("vol_snap").unwrap();
    assert_eq!(read_at(&vol.path, 0, a.len()), a);
    assert_eq!(read_at(&vol.path, 5 * MIB, a.len()), a);

    let names: Vec<(String, Option<String>)> = e
        .list_volumes()
        .unwrap()
        .into_iter()
        .map(|v| (v.name, v.snapshot_of))
        .collect();
    assert_eq!(
        names,
        [
            ("vol".to_string(), None),
            ("vol-clone".to_string(), None),
            ("vol_snap".to_string(), Some("vol".to_string())),
        ]
    );
    // Thick accounting: three 8 MiB objects.
    let info = e.info().unwrap();
    assert!(info.free_bytes <= info.total_bytes - 24 * MIB, "{info:?}");

    let err = e.create_snapshot("other", "vol_snap", 0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExistsDifferent);
    // Deleting a volume named like a snapshot (or the reverse) deletes nothing and is done,
    // so that an object whose creation was refused never blocks its own deletion.
    e.delete_volume("vol_snap").unwrap();
    e.delete_snapshot("vol").unwrap();
    let left: Vec<(String, Option<String>)> = e
        .list_volumes()
        .unwrap()
        .into_iter()
        .map(|v| (v.name, v.snapshot_of))
        .collect();
    assert!(left.contains(&("vol".to_string(), None)), "{left:?}");
    assert!(
        left.contains(&("vol_snap".to_string(), Some("vol".to_string()))),
        "{left:?}"
    );
    e.delete_snapshot("vol_snap").unwrap();
    e.delete_snapshot("vol_snap").unwrap();
    assert_eq!(
        e.clone_from_snapshot("vol_snap", "x").unwrap_err().kind(),
        ErrorKind::NotFound
    );
    // The clone is independent of the deleted snapshot.
    assert_eq!(read_at(&clone.path, 0, a.len()), a);
}

#[test]
fn tmpfs_refuses_reflink_operations_clearly() {
    require_env!("tmpfs_refuses_reflink_operations_clearly");
    let fs = ScratchFs::tmpfs();
    let e = FileEngine::new("tmp-pool", fs.pool_dir(), 0);
    e.ensure_pool().unwrap();
    assert!(!e.supports_reflink().unwrap());
    e.create_volume("v", MIB, &VolumeOptions::default())
        .unwrap();
    let err = e.create_snapshot("v", "v_snap", 0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    let msg = err.to_string();
    assert!(
        msg.starts_with("snapshot is not supported on pool tmp-pool: the filesystem of"),
        "{msg}"
    );
    assert!(msg.contains("reflink"), "{msg}");
    // Nothing half-made stays behind.
    assert_eq!(e.list_volumes().unwrap().len(), 1);
    let leftovers: Vec<_> = std::fs::read_dir(fs.pool_dir().join("snapshots"))
        .unwrap()
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn create_resize_delete_are_idempotent_and_rounded() {
    require_env!("create_resize_delete_are_idempotent_and_rounded");
    let fs = ScratchFs::tmpfs();
    let e = FileEngine::new("small", fs.pool_dir(), 32 * MIB);
    let info = e.ensure_pool().unwrap();
    assert_eq!(info.total_bytes, 32 * MIB);
    assert_eq!(info.free_bytes, 32 * MIB);
    assert_eq!(info.allocation_unit, 4 * MIB);

    let v = e
        .create_volume("pvc-1", 5 * MIB, &VolumeOptions::default())
        .unwrap();
    assert_eq!(v.size_bytes, 8 * MIB);
    assert_eq!(std::fs::metadata(&v.path).unwrap().len(), 8 * MIB);
    assert_eq!(
        e.create_volume("pvc-1", 8 * MIB, &VolumeOptions::default())
            .unwrap(),
        v
    );
    let err = e
        .create_volume("pvc-1", 16 * MIB, &VolumeOptions::default())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExistsDifferent);
    assert_eq!(
        err.to_string(),
        "volume pvc-1 exists with 8.0 MiB, asked 16.0 MiB"
    );
    assert_eq!(e.info().unwrap().free_bytes, 24 * MIB);

    let err = e
        .create_volume("pvc-2", 28 * MIB, &VolumeOptions::default())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoSpace);
    assert_eq!(
        err.to_string(),
        "pool small has 24.0 MiB free, pvc-2 needs 28.0 MiB"
    );

    // Rounded up to the 4 MiB unit; the same size again changes nothing.
    for (ask, want) in [(10 * MIB, 12 * MIB), (12 * MIB, 12 * MIB)] {
        assert_eq!(
            e.resize_volume("pvc-1", ask).unwrap().size_bytes,
            want,
            "{ask}"
        );
    }
    let err = e.resize_volume("pvc-1", 4 * MIB).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(
        e.resize_volume("nope", 4 * MIB).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        e.create_volume("pvc-0", 0, &VolumeOptions::default())
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );

    assert_eq!(e.device_path("pvc-1").unwrap(), v.path);
    e.delete_volume("pvc-1").unwrap();
    e.delete_volume("pvc-1").unwrap();
    assert_eq!(
        e.device_path("pvc-1").unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert!(e.list_volumes().unwrap().is_empty());
}

#[test]
fn restart_sees_the_same_pool_and_drops_work_files() {
    require_env!("restart_sees_the_same_pool_and_drops_work_files");
    let fs = ScratchFs::tmpfs();
    let first = FileEngine::new("p", fs.pool_dir(), 0);
    let id = first.ensure_pool().unwrap().uuid;
    first
        .create_volume("keep", MIB, &VolumeOptions::default())
        .unwrap();
    // An interrupted create leaves only a work file.
    std::fs::write(fs.pool_dir().join("volumes/.half.tmp"), b"x").unwrap();
    drop(first);

    let second = FileEngine::new("p", fs.pool_dir(), 0);
    assert_eq!(second.ensure_pool().unwrap().uuid, id);
    let names: Vec<String> = second
        .list_volumes()
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert_eq!(names, ["keep"]);
    assert!(!fs.pool_dir().join("volumes/.half.tmp").exists());
}

#[test]
fn loop_attach_detach_resize_and_busy_restore() {
    require_env!("loop_attach_detach_resize_and_busy_restore");
    let fs = ScratchFs::xfs();
    let e = FileEngine::new("loops", fs.pool_dir(), 0);
    e.ensure_pool().unwrap();
    e.create_volume("v", 8 * MIB, &VolumeOptions::default())
        .unwrap();
    e.create_snapshot("v", "v_snap", 0).unwrap();

    let dev = e.attach_loop("v").unwrap();
    assert!(
        dev.to_string_lossy().starts_with("/dev/loop"),
        "{}",
        dev.display()
    );
    assert_eq!(e.attach_loop("v").unwrap(), dev);
    assert_eq!(e.loop_devices("v").unwrap(), std::slice::from_ref(&dev));
    let dev_s = dev.to_string_lossy().into_owned();
    assert_eq!(
        run("blockdev", &["--getsize64", &dev_s]).unwrap(),
        (8 * MIB).to_string()
    );

    // Data written through the device lands in the volume file.
    let data = pattern(0x77);
    write_at(&dev, MIB, &data);
    assert_eq!(read_at(&e.device_path("v").unwrap(), MIB, data.len()), data);

    // Online growth reaches the loop device.
    e.resize_volume("v", 16 * MIB).unwrap();
    assert_eq!(
        run("blockdev", &["--getsize64", &dev_s]).unwrap(),
        (16 * MIB).to_string()
    );

    let err = e.restore_snapshot("v_snap").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy);
    assert!(err.to_string().contains(&dev_s), "{err}");

    e.detach_loop("v").unwrap();
    e.detach_loop("v").unwrap();
    assert!(e.loop_devices("v").unwrap().is_empty());
    e.restore_snapshot("v_snap").unwrap();
    assert_eq!(
        std::fs::metadata(e.device_path("v").unwrap())
            .unwrap()
            .len(),
        8 * MIB
    );

    // Deleting an attached volume detaches it first.
    e.attach_loop("v").unwrap();
    e.delete_volume("v").unwrap();
    assert!(e.loop_devices("v").unwrap().is_empty());
    assert_eq!(e.attach_loop("v").unwrap_err().kind(), ErrorKind::NotFound);
}
