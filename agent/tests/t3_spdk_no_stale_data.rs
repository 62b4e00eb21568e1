//! T3: a new volume never reads what a deleted volume wrote. A thick lvol reads whatever
//! its clusters hold; the SPDK pool engine clears the clusters an lvol gives back (a punched
//! hole over a pool file, write-zeroes over a block device or RAM), so the next volume on
//! them reads zeroes. Found by csi-sanity in a VM: a new 512 MiB volume carried the XFS
//! superblock of the 768 MiB volume deleted just before it, and mounting it failed.
//!
//! Each pool is filled by one volume, so the second volume gets the first one's clusters.
//! Needs root for the loop device; without it the block-device case is skipped (one line).
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use liteio_agent::engine::spdk::{BaseBdev, SpdkLvsEngine};
use liteio_agent::engine::{PoolEngine, VolumeOptions};
use liteio_agent::spdk::{Spdk, bdev, io, lvol};

const MIB: u64 = 1 << 20;
const CHUNK: usize = 64 * 1024;

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    common::spdk::block_on(Duration::from_secs(60), f)
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..CHUNK)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

/// Fills the pool with one thick volume, writes it at its start, middle and end, deletes
/// it, fills the pool again and reads the same places: all zeroes.
fn no_stale_data(what: &str, lvs: &str, base: BaseBdev) {
    let engine = SpdkLvsEngine::new(lvs, base.clone(), 4 << 20);
    engine.ensure_pool().unwrap();
    let free = engine.info().unwrap().free_bytes;
    assert!(free >= 16 * MIB, "{what}: pool too small: {free}");
    let a = engine
        .create_volume("old", free, &VolumeOptions::default())
        .unwrap();
    let bdev_a = a.path.to_string_lossy().to_string();
    let offsets = [
        0,
        (a.size_bytes / 2) & !(MIB - 1),
        a.size_bytes - CHUNK as u64,
    ];
    for (i, off) in offsets.iter().enumerate() {
        block_on(io::write_at(&bdev_a, *off, pattern(i as u8))).unwrap();
        // Written for real: the pattern reads back.
        assert_eq!(
            block_on(io::read_at(&bdev_a, *off, CHUNK)).unwrap(),
            pattern(i as u8)
        );
    }
    engine.delete_volume("old").unwrap();
    let b = engine
        .create_volume("new", free, &VolumeOptions::default())
        .unwrap();
    let bdev_b = b.path.to_string_lossy().to_string();
    for off in offsets {
        let got = block_on(io::read_at(&bdev_b, off, CHUNK)).unwrap();
        let stale = got.iter().filter(|b| **b != 0).count();
        assert_eq!(
            stale, 0,
            "{what}: the new volume reads {stale} non-zero bytes of the deleted volume at offset {off}"
        );
    }
    engine.delete_volume("new").unwrap();
    block_on(lvol::destroy_lvstore(lvs)).unwrap();
    println!(
        "{what}: a deleted volume's clusters read zeroes in the next volume (clear: {:?})",
        base.clear()
    );
}

fn losetup(file: &Path) -> Option<PathBuf> {
    let out = std::process::Command::new("losetup")
        .args(["--find", "--show"])
        .arg(file)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

#[test]
fn a_new_volume_never_reads_a_deleted_ones_data() {
    let spdk = Spdk::start(&common::spdk::small("t3-no-stale")).unwrap();
    let dir = std::env::temp_dir().join(format!("liteio-t3-stale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // A pool file (the engine creates it, sparse): cleared by punching holes.
    let file_base = BaseBdev::Aio {
        name: "stale-file".into(),
        path: dir.join("pool.img"),
        size: 64 * MIB,
        create: true,
    };
    assert_eq!(file_base.clear(), lvol::Clear::Unmap);
    no_stale_data("pool file", "stale-file-lvs", file_base);
    block_on(bdev::delete_aio("stale-file")).unwrap();

    // RAM: write-zeroes.
    let ram = BaseBdev::Malloc {
        name: "stale-ram".into(),
        size: 64 * MIB,
    };
    assert_eq!(ram.clear(), lvol::Clear::WriteZeroes);
    no_stale_data("malloc", "stale-ram-lvs", ram);
    block_on(bdev::delete_malloc("stale-ram")).unwrap();

    // A block device (a loop device over a file the test fills with a non-zero pattern
    // first, as a used disk would be): write-zeroes, done by SPDK as zero writes.
    let backing = dir.join("disk.img");
    std::fs::write(&backing, vec![0xa5u8; 64 * MIB as usize]).unwrap();
    match losetup(&backing) {
        Some(dev) => {
            let blk = BaseBdev::Aio {
                name: "stale-blk".into(),
                path: dev.clone(),
                size: 0,
                create: false,
            };
            assert_eq!(blk.clear(), lvol::Clear::WriteZeroes);
            no_stale_data("block device", "stale-blk-lvs", blk);
            block_on(bdev::delete_aio("stale-blk")).unwrap();
            let _ = std::process::Command::new("losetup")
                .arg("-d")
                .arg(&dev)
                .status();
        }
        None => println!("SKIP block-device case: no loop device (needs root and losetup)"),
    }
    spdk.stop();
    let _ = std::fs::remove_dir_all(dir);
}
