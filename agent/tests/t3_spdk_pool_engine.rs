//! T3: the SPDK lvstore pool engine behind the `PoolEngine` trait, on an aio file.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use liteio_agent::engine::spdk::{BaseBdev, SpdkLvsEngine};
use liteio_agent::engine::{ErrorKind, PoolEngine, VolumeOptions};
use liteio_agent::spdk::Spdk;

const MIB: u64 = 1 << 20;

/// The names of the engine's volumes, sorted.
fn names(engine: &SpdkLvsEngine) -> Vec<String> {
    let mut names: Vec<String> = engine
        .list_volumes()
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .collect();
    names.sort();
    names
}

#[test]
fn lvstore_engine_lifecycle_on_an_aio_file() {
    let spdk = Spdk::start(&common::spdk::small("t3-engine-trait")).unwrap();
    let dir = std::env::temp_dir().join(format!("liteio-t3-pe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = BaseBdev::Aio {
        name: "pe-aio".into(),
        path: dir.join("pool.img"),
        size: 128 * MIB,
        create: true,
    };
    let engine = SpdkLvsEngine::new("pe-lvs", base.clone(), 4 << 20);

    let pool = engine.ensure_pool().unwrap();
    assert_eq!(pool.allocation_unit, 4 * MIB);
    assert!(
        pool.total_bytes > 100 * MIB && pool.total_bytes <= 128 * MIB,
        "{pool:?}"
    );
    assert_eq!(engine.ensure_pool().unwrap().uuid, pool.uuid, "idempotent");

    let v = engine
        .create_volume("pvc-a", 10 * MIB, &VolumeOptions::default())
        .unwrap();
    assert_eq!(v.size_bytes, 12 * MIB, "rounded up to the 4 MiB cluster");
    assert_eq!(
        engine.info().unwrap().free_bytes,
        pool.free_bytes - 12 * MIB
    );
    let e = engine
        .create_volume("pvc-a", 20 * MIB, &VolumeOptions::default())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExistsDifferent, "{e}");
    let e = engine
        .create_volume("pvc-huge", 1 << 40, &VolumeOptions::default())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    assert!(e.to_string().contains("pvc-huge"), "{e}");
    let thin = engine
        .create_volume(
            "pvc-thin",
            40 * MIB,
            &VolumeOptions {
                thin: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert!(thin.thin && thin.allocated_bytes < thin.size_bytes);

    assert_eq!(
        engine.resize_volume("pvc-a", 16 * MIB).unwrap().size_bytes,
        16 * MIB
    );
    // Sizes are compared after rounding: asking again for 14 MiB + 1 (grown to 16 MiB
    // already, as after an agent was killed mid-expansion) is success, not a shrink.
    assert_eq!(
        engine
            .resize_volume("pvc-a", 14 * MIB + 1)
            .unwrap()
            .size_bytes,
        16 * MIB
    );
    assert_eq!(
        engine.resize_volume("pvc-a", 4 * MIB).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let s = engine.create_snapshot("pvc-a", "pvc-a_snap", 0).unwrap();
    assert_eq!(s.snapshot_of.as_deref(), Some("pvc-a"));
    engine.clone_from_snapshot("pvc-a_snap", "pvc-b").unwrap();
    assert_eq!(
        engine.restore_snapshot("pvc-a_snap").unwrap_err().kind(),
        ErrorKind::Unsupported
    );
    assert_eq!(
        engine.device_path("pvc-a").unwrap(),
        std::path::PathBuf::from("pe-lvs/pvc-a")
    );
    assert_eq!(
        engine.device_path("nope").unwrap_err().kind(),
        ErrorKind::NotFound
    );

    assert_eq!(names(&engine), ["pvc-a", "pvc-a_snap", "pvc-b", "pvc-thin"]);
    let snap = engine
        .list_volumes()
        .unwrap()
        .into_iter()
        .find(|v| v.name == "pvc-a_snap")
        .unwrap();
    assert_eq!(
        snap.snapshot_of.as_deref(),
        Some("pvc-a"),
        "listing finds the origin"
    );

    engine.delete_volume("pvc-b").unwrap();
    engine.delete_volume("pvc-thin").unwrap();
    engine.delete_volume("pvc-thin").unwrap();

    // A new engine over the same file after a restart sees the same pool and volumes.
    // (Deleting the last lvol of an lvstore after an in-process restart is not tested: SPDK
    // 26.05's lvol module keeps its shutdown flag across restarts and would unload the
    // lvstore; the agent restarts SPDK only by restarting the process.)
    let free_before = engine.info().unwrap().free_bytes;
    spdk.stop();
    let spdk = Spdk::start(&common::spdk::small("t3-engine-trait")).unwrap();
    let again = SpdkLvsEngine::new("pe-lvs", base, 4 << 20);
    assert_eq!(again.ensure_pool().unwrap().uuid, pool.uuid);
    assert_eq!(names(&again), ["pvc-a", "pvc-a_snap"]);
    assert_eq!(again.info().unwrap().free_bytes, free_before);
    spdk.stop();
    let _ = std::fs::remove_dir_all(dir);
}

/// A new pool file has its head (the blobstore's metadata) written, not a hole, and the rest
/// sparse; an existing path is refused, and a file that cannot be written is not left behind.
#[test]
fn a_new_pool_file_has_its_metadata_head_written() {
    use liteio_agent::engine::spdk::{create_pool_file, pool_file_head};
    use std::os::unix::fs::MetadataExt as _;
    let dir = std::env::temp_dir().join(format!("liteio-t3-head-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("pool.img");
    let size = 4096 * MIB;
    create_pool_file(&path, size).unwrap();
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!(m.len(), size);
    let head = pool_file_head(size);
    assert_eq!(head, 20 * MIB, "4 GiB: 4 MiB of metadata pages plus 16 MiB");
    let allocated = m.blocks() * 512;
    assert!(
        allocated >= head,
        "only {allocated} bytes allocated: the head of {head} bytes has holes"
    );
    assert!(
        allocated < size / 2,
        "{allocated} bytes allocated: the rest of the file should stay sparse"
    );
    // Idempotence is the caller's (it creates only a missing file): an existing one is refused.
    let e = create_pool_file(&path, size).unwrap_err().to_string();
    assert!(e.contains("pool.img"), "{e}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
    // A small file is written whole.
    let small = dir.join("small.img");
    create_pool_file(&small, 8 * MIB).unwrap();
    assert!(std::fs::metadata(&small).unwrap().blocks() * 512 >= 8 * MIB);
    // A file the file system cannot hold (ext4 and XFS stop far below 2^62 bytes) is refused
    // before anything is written, and removed.
    let huge = dir.join("huge.img");
    assert!(create_pool_file(&huge, 1 << 62).is_err());
    assert!(!huge.exists(), "a failed create left {}", huge.display());
    std::fs::remove_dir_all(&dir).unwrap();
}
