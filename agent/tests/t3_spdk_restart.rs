//! T3: the SPDK runtime stops and starts again, in the same process and in a new process,
//! and lvstores and lvols come back with their data; the optional JSON-RPC socket answers
//! SPDK's own protocol.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use liteio_agent::spdk::{Spdk, SpdkOptions, bdev, io, lvol};

const MIB: u64 = 1 << 20;
const PHASE: &str = "LITEIO_T3_RESTART_PHASE";
const FILE: &str = "LITEIO_T3_RESTART_FILE";

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    common::spdk::block_on(Duration::from_secs(60), f)
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..64 * 1024)
        .map(|i: usize| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

fn opts(name: &str) -> SpdkOptions {
    common::spdk::small(name)
}

/// Create the pool and a volume with data on `file`.
async fn populate(file: &Path) {
    bdev::create_aio("rbase", file, 512).await.unwrap();
    lvol::create_lvstore("rbase", "rlvs", 1 << 20)
        .await
        .unwrap();
    lvol::create_lvol("rlvs", "keep", 8 * MIB, false, lvol::Clear::WriteZeroes)
        .await
        .unwrap();
    lvol::create_lvol("rlvs", "thin", 8 * MIB, true, lvol::Clear::WriteZeroes)
        .await
        .unwrap();
    io::write_at("rlvs/keep", 0, pattern(3)).await.unwrap();
    lvol::snapshot("rlvs", "keep", "keep_snap").await.unwrap();
}

/// Open the pool again and check everything came back.
async fn check(file: &Path) {
    bdev::create_aio("rbase", file, 512).await.unwrap();
    bdev::wait_for_examine().await.unwrap();
    let lvs = lvol::lvstore("rlvs")
        .await
        .unwrap()
        .expect("the lvstore is loaded again");
    assert_eq!(lvs.base_bdev, "rbase");
    let names: Vec<String> = lvol::lvols()
        .await
        .unwrap()
        .into_iter()
        .filter(|l| l.lvs_name == "rlvs")
        .map(|l| l.name)
        .collect();
    for n in ["keep", "thin", "keep_snap"] {
        assert!(names.contains(&n.to_string()), "{n} missing from {names:?}");
    }
    let keep = lvol::lvol("rlvs", "keep").await.unwrap().unwrap();
    assert_eq!(keep.parent, "keep_snap");
    assert!(lvol::lvol("rlvs", "thin").await.unwrap().unwrap().thin);
    assert_eq!(
        io::read_at("rlvs/keep", 0, 64 * 1024).await.unwrap(),
        pattern(3),
        "data survived"
    );
}

fn pool_file(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("liteio-t3-restart-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pool.img");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(64 * MIB)
        .unwrap();
    file
}

#[test]
fn restart_in_the_same_process_and_in_a_new_one() {
    // The child half of the new-process case.
    if std::env::var(PHASE).as_deref() == Ok("child") {
        let file = PathBuf::from(std::env::var(FILE).unwrap());
        let spdk = Spdk::start(&opts("t3-restart-child")).unwrap();
        block_on(check(&file));
        spdk.stop();
        return;
    }

    let file = pool_file("a");
    let rpc = file.with_file_name("spdk.sock");
    let first = Spdk::start(&SpdkOptions {
        rpc_socket: Some(rpc.clone()),
        ..opts("t3-restart")
    })
    .unwrap();
    block_on(populate(&file));
    let again = Spdk::start(&opts("t3-restart")).unwrap_err();
    assert!(again.to_string().contains("already running"), "{again}");
    // The JSON-RPC socket serves SPDK's own protocol for operators' tools.
    let mut s = std::os::unix::net::UnixStream::connect(&rpc).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(br#"{"jsonrpc":"2.0","method":"spdk_get_version","id":1}"#)
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    let reply = String::from_utf8_lossy(&buf[..n]);
    assert!(
        reply.contains("\"version\"") && reply.contains("26.05"),
        "{reply}"
    );
    drop(s);
    first.stop();
    first.stop(); // idempotent
    assert!(!rpc.exists(), "the RPC socket is removed on stop");

    // Same process: start again.
    let second = Spdk::start(&opts("t3-restart")).unwrap();
    block_on(check(&file));
    second.stop();

    // New process: this test binary again, in child mode.
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "restart_in_the_same_process_and_in_a_new_one",
            "--nocapture",
        ])
        .env(PHASE, "child")
        .env(FILE, &file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child process check failed: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(file.parent().unwrap());
}

#[test]
fn bad_options_are_refused() {
    if std::env::var(PHASE).is_ok() {
        return;
    }
    let e = Spdk::start(&SpdkOptions {
        core_mask: "zz".into(),
        ..opts("t3-bad")
    })
    .unwrap_err();
    assert!(e.to_string().contains("core_mask"), "{e}");
    let e = Spdk::start(&SpdkOptions {
        mem_size_mb: 16,
        ..opts("t3-bad")
    })
    .unwrap_err();
    assert!(e.to_string().contains("mem_size_mb"), "{e}");
}
