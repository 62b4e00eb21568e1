//! T4: the LVM engine (LiteIO's KernelLVM pool) for real, on device-mapper in a microVM with
//! Debian's 6.12 kernel: loop-backed PVs made from LiteIO's agent config (`filePath`,
//! `createIfNotExist`), linear and striped LVs, a copy-on-write snapshot and its merge back
//! into the origin, an online extend under a mounted ext4, deletion, and recovery after the
//! node restarts (loop devices gone, VG inactive).
//!
//! One test, two roles: on the host it boots the VM and runs this same test binary inside
//! (`LITEIO_T4_GUEST=1`), where the body runs against the guest's kernel. Prints `SKIP …`
//! where no VM can boot.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use liteio_agent::config::LvmPv;
use liteio_agent::engine::{LvLayout, LvmEngine, PoolEngine, VolumeOptions};

const GUEST: &str = "LITEIO_T4_GUEST";
const MIB: u64 = 1 << 20;
const VG: &str = "t4vg";

fn sh(script: &str) -> String {
    let out = Command::new("bash").arg("-c").arg(script).output().unwrap();
    assert!(
        out.status.success(),
        "`{script}` failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn pattern(byte: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| byte ^ (i % 251) as u8).collect()
}

fn write_at(dev: &Path, offset: u64, data: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(dev).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

fn read_at(dev: &Path, offset: u64, len: usize) -> Vec<u8> {
    // Through a fresh open: no page cache of another device node in the way.
    sh(&format!("blockdev --flushbufs {}", dev.display()));
    let mut f = std::fs::File::open(dev).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut buf = vec![0; len];
    f.read_exact(&mut buf).unwrap();
    buf
}

fn size_of(dev: &Path) -> u64 {
    sh(&format!("blockdev --getsize64 {}", dev.display()))
        .parse()
        .unwrap()
}

/// The engine as the agent builds it from LiteIO's config: two loop-backed PVs.
fn engine(dir: &Path) -> LvmEngine {
    let pv = |i: u32| LvmPv {
        device_path: String::new(),
        size: 256 * MIB,
        file_path: dir.join(format!("pv{i}.img")).display().to_string(),
        create_if_not_exist: true,
    };
    LvmEngine::new(VG, vec![pv(0), pv(1)])
}

/// The body, inside the guest.
fn in_guest() {
    sh("modprobe loop && modprobe dm-mod && modprobe dm-snapshot");
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let e = engine(dir.path());
    let pool = e.ensure_pool().unwrap();
    assert_eq!(pool.pv_count, 2, "{pool:?}");
    assert!(
        pool.total_bytes >= 500 * MIB && pool.total_bytes <= 512 * MIB,
        "{pool:?}"
    );
    assert_eq!(
        e.ensure_pool().unwrap().uuid,
        pool.uuid,
        "a second start reuses the VG"
    );

    // Linear and striped.
    let opts = |layout| VolumeOptions {
        thin: false,
        layout: Some(layout),
    };
    let lin = e
        .create_volume("lin", 40 * MIB, &opts(LvLayout::Linear))
        .unwrap();
    let str_ = e
        .create_volume("str", 64 * MIB, &opts(LvLayout::Striped))
        .unwrap();
    assert_eq!(lin.layout, Some(LvLayout::Linear), "{lin:?}");
    assert_eq!(str_.layout, Some(LvLayout::Striped), "{str_:?}");
    assert_eq!(
        sh(&format!("lvs --noheadings -o stripes {VG}/str")).trim(),
        "2"
    );
    assert_eq!(size_of(&lin.path), lin.size_bytes);
    assert_eq!(
        e.create_volume("lin", 40 * MIB, &opts(LvLayout::Linear))
            .unwrap(),
        lin,
        "idempotent"
    );

    // Snapshot, then the origin changes, then a merge brings the snapshot's content back.
    let a = pattern(0xa5, 1 << 20);
    let b = pattern(0x3c, 1 << 20);
    write_at(&lin.path, 4 * MIB, &a);
    let snap = e.create_snapshot("lin", "lin_snap", 16 * MIB).unwrap();
    assert_eq!(snap.snapshot_of.as_deref(), Some("lin"));
    write_at(&lin.path, 4 * MIB, &b);
    assert_eq!(
        read_at(&snap.path, 4 * MIB, a.len()),
        a,
        "the snapshot kept the old data"
    );
    assert_eq!(read_at(&lin.path, 4 * MIB, b.len()), b);
    e.restore_snapshot("lin_snap").unwrap();
    // The merge runs in the background; the snapshot disappears when it is done.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while e
        .list_volumes()
        .unwrap()
        .iter()
        .any(|v| v.name == "lin_snap")
    {
        assert!(std::time::Instant::now() < deadline, "merge did not finish");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(read_at(&lin.path, 4 * MIB, a.len()), a, "merged back");
    e.restore_snapshot("lin_snap").unwrap_err();

    // Online extend under a mounted ext4.
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    sh(&format!(
        "mkfs.ext4 -q {} && mount {} {}",
        str_.path.display(),
        str_.path.display(),
        mnt.display()
    ));
    std::fs::write(mnt.join("kept"), b"across the extend").unwrap();
    let before: u64 = sh(&format!(
        "df --output=size -B1 {} | tail -n 1",
        mnt.display()
    ))
    .parse()
    .unwrap();
    let grown = e.resize_volume("str", 128 * MIB).unwrap();
    assert_eq!(grown.size_bytes, 128 * MIB);
    assert_eq!(size_of(&str_.path), 128 * MIB);
    sh(&format!("resize2fs {}", str_.path.display()));
    let after: u64 = sh(&format!(
        "df --output=size -B1 {} | tail -n 1",
        mnt.display()
    ))
    .parse()
    .unwrap();
    assert!(
        after > before + 50 * MIB,
        "ext4 grew online: {before} → {after}"
    );
    assert_eq!(
        std::fs::read(mnt.join("kept")).unwrap(),
        b"across the extend"
    );
    assert!(e.resize_volume("str", 64 * MIB).is_err(), "never shrinks");
    sh(&format!("umount {}", mnt.display()));

    // Delete, twice.
    e.delete_volume("str").unwrap();
    e.delete_volume("str").unwrap();
    assert!(!e.list_volumes().unwrap().iter().any(|v| v.name == "str"));
    assert!(!str_.path.exists());

    // The node restarts: its loop devices are gone and the VG is inactive. A new engine over
    // the same config finds the VG again and serves the volume with its data.
    drop(e);
    sh(&format!("vgchange -an {VG} >/dev/null && losetup -D"));
    assert!(!lin.path.exists());
    let e = engine(dir.path());
    let again = e.ensure_pool().unwrap();
    assert_eq!(again.uuid, pool.uuid, "the same VG");
    let found = e.list_volumes().unwrap();
    assert!(found.iter().any(|v| v.name == "lin"), "{found:?}");
    assert_eq!(e.device_path("lin").unwrap(), lin.path);
    assert!(
        lin.path.exists(),
        "the volume is active again after the restart"
    );
    assert_eq!(
        read_at(&lin.path, 4 * MIB, a.len()),
        a,
        "data kept across the restart"
    );

    e.delete_volume("lin").unwrap();
    sh(&format!("vgremove -y {VG} >/dev/null && losetup -D"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_engine_on_a_real_kernel() {
    if std::env::var_os(GUEST).is_some() {
        in_guest();
        return;
    }
    use liteio_local::vm::{self, Kernel, Vm, VmOptions};
    if let Some(why) = vm::unavailable(&Kernel::Backports) {
        println!("SKIP LVM engine in a VM: {why}");
        return;
    }
    tokio::time::timeout(Duration::from_secs(900), async {
        let dir = tempfile::tempdir().unwrap();
        let opts = VmOptions::new("t4-lvm", dir.path());
        let mut vm = Vm::boot(&opts).await.unwrap_or_else(|e| {
            panic!("{e}\n{}", std::fs::read_to_string(dir.path().join("t4-lvm.console.log")).unwrap_or_default())
        });
        println!("VM booted in {:.1}s", vm.booted_in().as_secs_f64());
        let exe = std::env::current_exe().unwrap();
        let out = vm
            .sh(
                &format!(
                    "LVM_SUPPRESS_FD_WARNINGS=1 {GUEST}=1 RUST_BACKTRACE=1 {} --exact lvm_engine_on_a_real_kernel --nocapture --test-threads=1",
                    exe.display()
                ),
                Duration::from_secs(600),
            )
            .await
            .unwrap();
        vm.shutdown().await;
        // Indented: the guest's own `test result:` line must not count as a host test.
        for l in out.output.lines() {
            println!("  guest| {l}");
        }
        assert!(out.success(), "the LVM engine failed in the guest (exit {})", out.status);
        assert!(out.output.contains("1 passed"), "the guest ran no test");
    })
    .await
    .expect("T4 LVM test timed out");
}
