//! T3: the embedded SPDK engine against real SPDK (no hugepages, interrupt mode).
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use liteio_agent::spdk::{ErrorKind, Spdk, bdev, lvol, raid};

fn spdk() -> &'static Spdk {
    static SPDK: OnceLock<Spdk> = OnceLock::new();
    SPDK.get_or_init(|| Spdk::start(&common::spdk::small("t3-engine")).expect("SPDK starts"))
}

fn run<F: std::future::Future<Output = ()>>(f: F) {
    spdk();
    common::spdk::block_on(Duration::from_secs(60), f);
}

const MIB: u64 = 1 << 20;

#[test]
fn malloc_lvstore_lvol_lifecycle() {
    run(async {
        let b = bdev::create_malloc("t3m0", 64 * MIB, 512).await.unwrap();
        assert_eq!(b.size_bytes(), 64 * MIB);
        // Idempotent; another size is a conflict.
        assert_eq!(
            bdev::create_malloc("t3m0", 64 * MIB, 512)
                .await
                .unwrap()
                .name,
            "t3m0"
        );
        let e = bdev::create_malloc("t3m0", 32 * MIB, 512)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");

        let lvs = lvol::create_lvstore("t3m0", "lvs0", 1 << 20).await.unwrap();
        assert_eq!(lvs.cluster_size, MIB);
        assert!(
            lvs.total_data_clusters > 50 && lvs.total_data_clusters <= 64,
            "{lvs:?}"
        );
        assert_eq!(lvs.free_clusters, lvs.total_data_clusters);
        assert_eq!(
            lvol::create_lvstore("t3m0", "lvs0", 1 << 20)
                .await
                .unwrap()
                .uuid,
            lvs.uuid
        );

        let thick = lvol::create_lvol(
            "lvs0",
            "vol1",
            10 * MIB + 1,
            false,
            lvol::Clear::WriteZeroes,
        )
        .await
        .unwrap();
        assert_eq!(thick.size_bytes, 11 * MIB, "rounded up to whole clusters");
        assert!(!thick.thin);
        let thin = lvol::create_lvol("lvs0", "vol2", 20 * MIB, true, lvol::Clear::WriteZeroes)
            .await
            .unwrap();
        assert!(thin.thin);
        let after = lvol::lvstore("lvs0").await.unwrap().unwrap();
        assert_eq!(
            after.free_clusters,
            lvs.free_clusters - 11,
            "thick allocates, thin does not"
        );
        // Idempotent create; different size conflicts.
        lvol::create_lvol("lvs0", "vol1", 11 * MIB, false, lvol::Clear::WriteZeroes)
            .await
            .unwrap();
        assert_eq!(
            lvol::create_lvol("lvs0", "vol1", 12 * MIB, false, lvol::Clear::WriteZeroes)
                .await
                .unwrap_err()
                .kind(),
            ErrorKind::AlreadyExists
        );
        // Too big for a thick lvol.
        assert_eq!(
            lvol::create_lvol("lvs0", "huge", 1 << 40, false, lvol::Clear::WriteZeroes)
                .await
                .unwrap_err()
                .kind(),
            ErrorKind::NoSpace
        );

        let snap = lvol::snapshot("lvs0", "vol1", "vol1_snap").await.unwrap();
        assert!(snap.snapshot);
        let clone = lvol::clone("lvs0", "vol1_snap", "vol1_clone")
            .await
            .unwrap();
        assert!(clone.clone && clone.parent == "vol1_snap", "{clone:?}");
        let grown = lvol::resize_lvol("lvs0", "vol1", 15 * MIB).await.unwrap();
        assert_eq!(grown.size_bytes, 15 * MIB);
        assert_eq!(
            lvol::resize_lvol("lvs0", "vol1", MIB)
                .await
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidArgument
        );
        let inflated = lvol::inflate("lvs0", "vol1_clone").await.unwrap();
        assert!(
            !inflated.clone && inflated.parent.is_empty(),
            "{inflated:?}"
        );

        let all = lvol::lvols().await.unwrap();
        let names: Vec<_> = all
            .iter()
            .filter(|l| l.lvs_name == "lvs0")
            .map(|l| l.name.as_str())
            .collect();
        for n in ["vol1", "vol2", "vol1_snap", "vol1_clone"] {
            assert!(names.contains(&n), "{n} in {names:?}");
        }
        // vol1 still depends on its snapshot: the snapshot cannot go first.
        assert_eq!(
            lvol::delete_lvol("lvs0", "vol1_snap")
                .await
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidArgument
        );
        for n in ["vol1_clone", "vol1", "vol1_snap", "vol2"] {
            lvol::delete_lvol("lvs0", n).await.unwrap();
        }
        lvol::delete_lvol("lvs0", "vol2").await.unwrap();
        assert_eq!(
            lvol::lvstore("lvs0").await.unwrap().unwrap().free_clusters,
            lvs.free_clusters
        );
        lvol::destroy_lvstore("lvs0").await.unwrap();
        assert!(lvol::lvstore("lvs0").await.unwrap().is_none());
        bdev::delete_malloc("t3m0").await.unwrap();
        bdev::delete_malloc("t3m0").await.unwrap();
        assert!(bdev::get("t3m0").await.unwrap().is_none());
    });
}

#[test]
fn bad_input_is_refused_cleanly() {
    run(async {
        let e = bdev::create_malloc("bad/name", MIB, 512).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("name"), "{e}");
        let e = bdev::create_aio(
            "aio-missing",
            std::path::Path::new("/nonexistent/file"),
            512,
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/file"), "{e}");
        let dir = tempdir();
        let small = dir.join("small.img");
        std::fs::write(&small, vec![0u8; 4096]).unwrap();
        let e = bdev::create_aio("aio-small", &small, 512)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("at least"), "{e}");
        let e = lvol::create_lvstore("no-such-bdev", "lvsx", 0)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        let e = lvol::create_lvol("no-such-lvs", "v", MIB, false, lvol::Clear::WriteZeroes)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        assert!(
            bdev::list()
                .await
                .unwrap()
                .iter()
                .all(|b| !b.name.starts_with("aio-")),
            "nothing half-created"
        );
        let _ = std::fs::remove_dir_all(dir);
    });
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "liteio-t3-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[test]
fn aio_file_lvstore_and_rescan() {
    run(async {
        let dir = tempdir();
        let file = dir.join("pool.img");
        let f = std::fs::File::create(&file).unwrap();
        f.set_len(64 * MIB).unwrap();
        let b = bdev::create_aio("t3aio", &file, 512).await.unwrap();
        assert_eq!(b.size_bytes(), 64 * MIB);
        let lvs = lvol::create_lvstore("t3aio", "aiolvs", 0).await.unwrap();
        assert_eq!(lvs.base_bdev, "t3aio");
        lvol::create_lvol("aiolvs", "v", 8 * MIB, false, lvol::Clear::WriteZeroes)
            .await
            .unwrap();
        f.set_len(128 * MIB).unwrap();
        let grown = bdev::rescan_aio("t3aio").await.unwrap();
        assert_eq!(grown.size_bytes(), 128 * MIB);
        lvol::destroy_lvstore("aiolvs").await.unwrap();
        bdev::delete_aio("t3aio").await.unwrap();
        let _ = std::fs::remove_dir_all(dir);
    });
}

#[test]
fn raid0_over_two_bdevs_and_pci_address_checks() {
    run(async {
        bdev::create_malloc("r0a", 32 * MIB, 512).await.unwrap();
        bdev::create_malloc("r0b", 32 * MIB, 512).await.unwrap();
        let raid = raid::create_raid0("r0", &["r0a".to_string(), "r0b".to_string()], 128)
            .await
            .unwrap();
        assert_eq!(raid.size_bytes(), 64 * MIB);
        assert_eq!(
            raid::create_raid0("r0", &["r0a".to_string(), "r0b".to_string()], 128)
                .await
                .unwrap()
                .name,
            "r0",
            "idempotent"
        );
        let e = raid::create_raid0("r1", &["r0a".to_string()], 128)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        lvol::create_lvstore("r0", "raidlvs", 1 << 20)
            .await
            .unwrap();
        lvol::destroy_lvstore("raidlvs").await.unwrap();
        raid::delete_raid("r0").await.unwrap();
        raid::delete_raid("r0").await.unwrap();
        bdev::delete_malloc("r0a").await.unwrap();
        bdev::delete_malloc("r0b").await.unwrap();
        let e = liteio_agent::spdk::initiator::attach_pcie("nv", "01:00.0")
            .await
            .unwrap_err();
        assert!(e.to_string().contains("pci_address"), "{e}");
    });
}

/// A raidBdev pool: the config maps NVMe PCI addresses to controllers striped as RAID0 (one
/// device: its namespace directly); the engine builds the stripe and the lvstore on it, and
/// does so again idempotently at the next start. Malloc members stand in for NVMe devices,
/// which this machine lacks; a device that is not there fails naming its address.
#[test]
fn raid_bdev_pool_over_striped_members() {
    use liteio_agent::config::Config;
    use liteio_agent::engine::spdk::{BaseBdev, SpdkLvsEngine};
    use liteio_agent::engine::{PoolEngine, VolumeOptions};
    use liteio_agent::spdk::setup;

    spdk();
    let yaml = |addrs: &str| {
        format!(
            "storage:\n  pooling: {{name: rlvs, mode: SpdkLVStore}}\n  bdev: {{type: raidBdev, name: antstor_raid0}}\nspdk: {{nvmePciAddresses: [{addrs}]}}\n"
        )
    };
    let two = Config::from_yaml(&yaml("'0000:01:00.0', '0000:02:00.0'")).unwrap();
    assert_eq!(
        setup::base_bdev(&two).unwrap(),
        Some(BaseBdev::Raid0 {
            name: "antstor_raid0".into(),
            members: vec![
                BaseBdev::nvme("nvme0", "0000:01:00.0"),
                BaseBdev::nvme("nvme1", "0000:02:00.0"),
            ],
            strip_kb: setup::RAID0_STRIP_KB,
        })
    );
    assert!(setup::engine(&two).unwrap().is_some());
    let one = Config::from_yaml(&yaml("'0000:01:00.0'")).unwrap();
    let single = setup::base_bdev(&one).unwrap().unwrap();
    assert_eq!(single, BaseBdev::nvme("nvme0", "0000:01:00.0"));
    // No such device here: the error names the controller's address.
    let e = SpdkLvsEngine::new("rlvs", single, 0)
        .ensure_pool()
        .unwrap_err()
        .to_string();
    assert!(e.contains("0000:01:00.0"), "{e}");

    let members = vec![
        BaseBdev::Malloc {
            name: "rm0".into(),
            size: 32 * MIB,
        },
        BaseBdev::Malloc {
            name: "rm1".into(),
            size: 32 * MIB,
        },
    ];
    let base = BaseBdev::Raid0 {
        name: "rraid".into(),
        members,
        strip_kb: 128,
    };
    let engine = SpdkLvsEngine::new("rlvs2", base.clone(), 1 << 20);
    let info = engine.ensure_pool().unwrap();
    assert!(
        info.total_bytes > 40 * MIB,
        "striped over both members: {info:?}"
    );
    let v = engine
        .create_volume("pvc-r", 8 * MIB, &VolumeOptions::default())
        .unwrap();
    assert_eq!(v.size_bytes, 8 * MIB);
    // The next start finds the stripe and the lvstore with the volume in it.
    let again = SpdkLvsEngine::new("rlvs2", base, 1 << 20);
    assert_eq!(again.ensure_pool().unwrap().uuid, info.uuid);
    assert_eq!(again.list_volumes().unwrap().len(), 1);
    again.delete_volume("pvc-r").unwrap();
    run(async {
        lvol::destroy_lvstore("rlvs2").await.unwrap();
        raid::delete_raid("rraid").await.unwrap();
        bdev::delete_malloc("rm0").await.unwrap();
        bdev::delete_malloc("rm1").await.unwrap();
    });
}

/// SPDK keeps no trace buffer in /dev/shm unless asked (`spdk.traceEntries`): it costs RAM
/// and outlives a killed agent.
#[test]
fn no_trace_buffer_in_shared_memory_by_default() {
    spdk();
    let shm = format!("/dev/shm/t3-engine_trace.pid{}", std::process::id());
    assert!(!std::path::Path::new(&shm).exists(), "{shm} exists");
}
