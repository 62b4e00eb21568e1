//! T3: the agent's SPDK on real 2 MiB hugepages, as production nodes run it. The test
//! reserves hugepages on top of what the kernel holds, mounts a hugetlbfs limited to them,
//! starts SPDK in a child process from an agent config with `noHuge: false`, `memSizeMiB`
//! and `hugeDir`, and checks that SPDK's memory came from that mount (its `rtemap` files in
//! `/proc/self/maps`, the kernel's free count down by as much) and that a bdev's I/O runs on
//! it. The kernel's count is put back exactly, also when the test fails. Needs root;
//! elsewhere, or when the kernel cannot find the pages, it prints one `SKIP` line.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use futures::executor::block_on;
use liteio_agent::config::Config;
use liteio_agent::spdk::setup::runtime_options;
use liteio_agent::spdk::{Spdk, SpdkOptions, bdev, io};
use liteio_node::hugepages::{self, HugepageError, HugetlbfsMount, Reservation};

const MIB: u64 = 1 << 20;
/// SPDK's memory (`spdk.memSizeMiB`), preallocated from the hugepages at start. SPDK's
/// default pools (bdev_io, iobuf) take about 370 MiB: 256 does not start.
const MEM_MIB: u64 = 448;
/// Pages reserved and the mount's limit: the memory plus room for what SPDK allocates beyond.
const PAGES: u64 = MEM_MIB / 2 + 32;
/// The child half runs SPDK with the hugetlbfs mount named here.
const HUGE_DIR: &str = "LITEIO_T3_HUGE_DIR";
const TEST: &str = "spdk_runs_on_hugepages";

fn skip(why: &str) {
    println!("SKIP {TEST}: {why}");
}

/// The parent reserves the pages and mounts the hugetlbfs, runs SPDK in a child process (this
/// test binary again), and puts everything back after the child exited: DPDK releases its
/// hugepages only at process exit, from a destructor that still needs the mount.
#[test]
fn spdk_runs_on_hugepages() {
    if let Ok(dir) = std::env::var(HUGE_DIR) {
        return on_hugepages(Path::new(&dir));
    }
    let before = match hugepages::counts() {
        Ok(c) => c,
        Err(e) => return skip(&e.to_string()),
    };
    let reservation = match Reservation::reserve(PAGES, None) {
        Ok(r) => r,
        Err(e @ (HugepageError::NotRoot(_) | HugepageError::Short { .. })) => {
            return skip(&e.to_string());
        }
        Err(e) => panic!("{e}"),
    };
    let dir = tempfile::tempdir().unwrap();
    // Declared after the reservation: unmounted first, also when the test fails.
    let mount = HugetlbfsMount::mount(&dir.path().join("hugepages"), PAGES).unwrap();
    let reserved = hugepages::counts().unwrap();
    assert_eq!(reserved.persistent(), before.persistent() + PAGES);
    assert!(reserved.free >= PAGES, "{reserved:?}");

    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--nocapture"])
        .env(HUGE_DIR, mount.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("SPDK on hugepages did not finish within 120 s (child {pid} killed)");
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("CHILD OK"),
        "the SPDK child failed: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for line in stdout
        .lines()
        .filter(|l| l.starts_with("SPDK on hugepages"))
    {
        println!("{line}");
    }

    // The child's exit gave every page back to the pool.
    assert_eq!(hugepages::counts().unwrap().free, reserved.free);
    mount.unmount().unwrap();
    reservation.restore().unwrap();
    let after = hugepages::counts().unwrap();
    assert_eq!(
        (after.persistent(), after.surplus),
        (before.persistent(), before.surplus),
        "the kernel's count is back to what it was"
    );
}

/// The child: starts SPDK from an agent config on the hugetlbfs at `huge_dir` and checks
/// where its memory came from.
fn on_hugepages(huge_dir: &Path) {
    let free_before = hugepages::counts().unwrap().free;
    let yaml = format!(
        "storage:\n  pooling: {{name: p, mode: File}}\n  file: {{path: /nonexistent}}\n\
         spdk: {{coreMask: \"0x1\", interruptMode: true, noHuge: false, memSizeMiB: {MEM_MIB}, hugeDir: {}}}\n",
        huge_dir.display()
    );
    let cfg = Config::from_yaml(&yaml).unwrap();
    let opts = SpdkOptions {
        name: "t3-hugepages".into(),
        // Test binaries share the cores of a small machine.
        lock_cores: false,
        ..runtime_options(&cfg)
    };
    assert!(!opts.no_huge);
    assert_eq!(opts.huge_dir.as_deref(), Some(huge_dir));
    let started = Instant::now();
    let spdk = Spdk::start(&opts).expect("SPDK starts on hugepages");
    println!("SPDK on hugepages: started in {:?}", started.elapsed());

    let mapped = hugepages::mapped_bytes(std::process::id(), huge_dir).unwrap();
    let free = hugepages::counts().unwrap().free;
    println!(
        "SPDK on hugepages: {} MiB mapped from {}; free 2 MiB pages {free_before} -> {free}",
        mapped / MIB,
        huge_dir.display()
    );
    assert!(
        mapped >= MEM_MIB * MIB,
        "SPDK maps {} MiB from {}, expected at least memSizeMiB = {MEM_MIB}:\n{}",
        mapped / MIB,
        huge_dir.display(),
        maps_of(huge_dir)
    );
    assert!(
        free_before - free >= MEM_MIB / 2,
        "the kernel's free hugepages went only from {free_before} to {free}"
    );

    // A bdev's buffer and I/O run on that memory.
    block_on(async {
        bdev::create_malloc("huge0", 32 * MIB, 512).await.unwrap();
        let data: Vec<u8> = (0..MIB as usize).map(|i| (i % 251) as u8).collect();
        io::write_at("huge0", 4 * MIB, data.clone()).await.unwrap();
        assert_eq!(
            io::read_at("huge0", 4 * MIB, data.len()).await.unwrap(),
            data
        );
        bdev::delete_malloc("huge0").await.unwrap();
    });
    spdk.stop();
    println!("CHILD OK");
}

fn maps_of(huge_dir: &Path) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let hits: Vec<&str> = maps.lines().filter(|l| l.contains("huge")).collect();
    format!("{} lines mention huge (under {:?})", hits.len(), huge_dir)
        + &hits
            .iter()
            .take(5)
            .map(|l| format!("\n  {l}"))
            .collect::<String>()
}

#[test]
fn hugepage_options_that_cannot_work_are_refused() {
    let e = Spdk::start(&SpdkOptions {
        huge_dir: Some(PathBuf::from("/dev/hugepages")),
        ..SpdkOptions::small()
    })
    .unwrap_err();
    assert!(e.to_string().contains("huge_dir"), "{e}");
}
