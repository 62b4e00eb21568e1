//! T3: data through the real NVMe/TCP path. SPDK's own initiator (bdev_nvme, in the same
//! process) connects to the agent's target over 127.0.0.1: data, snapshots, clones, resize,
//! the host allow-list, and I/O statistics.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use liteio_agent::spdk::nvmf::{self, SubsystemSpec, TcpTransportOptions};
use liteio_agent::spdk::{ErrorKind, bdev, initiator, io, lvol};
use liteio_api::naming;

const MIB: u64 = 1 << 20;
const GOOD_HOST: &str = "nqn.2021-03.com.alipay.host:uuid:node-good";
const BAD_HOST: &str = "nqn.2021-03.com.alipay.host:uuid:node-bad";

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Poll `check` until it holds or `limit` passes.
async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn nvme_tcp_data_path_snapshots_resize_and_allow_list() {
    // SPDK 26.05's NVMe/TCP initiator refuses interrupt mode ("only supported with PCIe
    // transport"), so this one test polls: one reactor on one core for a few seconds. The
    // target itself runs in interrupt mode in every other test and in the agent.
    common::with_spdk("t3-nvmf", true, Duration::from_secs(120), scenario());
}

async fn scenario() {
    let uuid = "6f1d2c3b-4a59-4e8f-9d0c-1b2a3c4d5e6f";
    bdev::create_malloc("m0", 128 * MIB, 512).await.unwrap();
    lvol::create_lvstore("m0", "lvs0", 1 << 20).await.unwrap();
    let vol = lvol::create_lvol("lvs0", "pvc-1", 16 * MIB, false, lvol::Clear::WriteZeroes)
        .await
        .unwrap();
    nvmf::ensure_tcp_transport(&TcpTransportOptions {
        in_capsule_data_size: Some(4096),
        ..Default::default()
    })
    .await
    .unwrap();
    nvmf::ensure_tcp_transport(&TcpTransportOptions::default())
        .await
        .unwrap();

    let port = common::free_port();
    let spec = common::spdk::local_subsystem(
        &naming::subsys_nqn(uuid),
        &naming::serial_number(uuid),
        uuid,
        &vol.alias(),
        uuid,
        port,
        vec![GOOD_HOST.into()],
    );
    let ss = nvmf::create_subsystem(spec.clone()).await.unwrap();
    assert_eq!(ss.serial, naming::serial_number(uuid));
    assert_eq!(ss.listeners, vec![("127.0.0.1".to_string(), port)]);
    assert_eq!(ss.hosts, vec![GOOD_HOST.to_string()]);
    // Idempotent; another bdev under the same NQN is a conflict.
    nvmf::create_subsystem(spec.clone()).await.unwrap();
    let other = SubsystemSpec {
        bdev: "m0".into(),
        ..spec.clone()
    };
    assert_eq!(
        nvmf::create_subsystem(other).await.unwrap_err().kind(),
        ErrorKind::AlreadyExists
    );

    // A host outside the allow-list cannot connect.
    let e = initiator::attach_tcp("bad", "127.0.0.1", port, &spec.nqn, BAD_HOST)
        .await
        .unwrap_err();
    assert!(!e.to_string().is_empty());
    assert!(bdev::get("badn1").await.unwrap().is_none());

    let names = initiator::attach_tcp("c0", "127.0.0.1", port, &spec.nqn, GOOD_HOST)
        .await
        .unwrap();
    assert_eq!(names, vec!["c0n1".to_string()]);
    let remote = bdev::get("c0n1").await.unwrap().unwrap();
    assert_eq!(remote.size_bytes(), 16 * MIB);
    assert_eq!(remote.uuid, uuid, "namespace UUID is the volume UUID");

    // Data written through NVMe/TCP lands in the lvol, and reads back.
    let a = pattern(1, 64 * 1024);
    io::write_at("c0n1", MIB, a.clone()).await.unwrap();
    assert_eq!(
        io::read_at(&vol.alias(), MIB, a.len()).await.unwrap(),
        a,
        "target side sees the data"
    );
    assert_eq!(
        io::read_at("c0n1", MIB, a.len()).await.unwrap(),
        a,
        "initiator reads it back"
    );

    // A snapshot keeps its content after the origin is overwritten; a clone reads it.
    lvol::snapshot("lvs0", "pvc-1", "pvc-1_snap").await.unwrap();
    let b = pattern(7, 64 * 1024);
    io::write_at("c0n1", MIB, b.clone()).await.unwrap();
    assert_eq!(io::read_at("c0n1", MIB, b.len()).await.unwrap(), b);
    assert_eq!(
        io::read_at("lvs0/pvc-1_snap", MIB, a.len()).await.unwrap(),
        a,
        "snapshot unchanged"
    );
    lvol::clone("lvs0", "pvc-1_snap", "pvc-2").await.unwrap();
    assert_eq!(
        io::read_at("lvs0/pvc-2", MIB, a.len()).await.unwrap(),
        a,
        "clone reads the snapshot's data"
    );

    // A resize is visible to the initiator when it connects again. (A live namespace-change
    // notice cannot be tested in one process: SPDK's initiator handles it with a blocking
    // admin command on the same reactor that serves the target, so this test resizes while
    // disconnected.)
    initiator::detach("c0").await.unwrap();
    eventually(Duration::from_secs(10), "the controller to go", || async {
        bdev::get("c0n1").await.unwrap().is_none()
    })
    .await;
    lvol::resize_lvol("lvs0", "pvc-1", 32 * MIB).await.unwrap();
    initiator::attach_tcp("c0", "127.0.0.1", port, &spec.nqn, GOOD_HOST)
        .await
        .unwrap();
    assert_eq!(
        bdev::get("c0n1").await.unwrap().unwrap().size_bytes(),
        32 * MIB
    );
    assert_eq!(
        io::read_at("c0n1", MIB, b.len()).await.unwrap(),
        b,
        "data survives the resize"
    );

    // Per-bdev statistics count the I/O.
    let stats = bdev::io_stats(&vol.alias()).await.unwrap();
    assert!(
        stats.write_ops >= 2 && stats.bytes_written >= 128 * 1024,
        "{stats:?}"
    );
    assert!(stats.read_ops >= 1, "{stats:?}");

    // Removing the host blocks new connections; adding it back allows them.
    initiator::detach("c0").await.unwrap();
    nvmf::set_hosts(&spec.nqn, &[], &Default::default())
        .await
        .unwrap();
    assert!(
        initiator::attach_tcp("c1", "127.0.0.1", port, &spec.nqn, GOOD_HOST)
            .await
            .is_err()
    );
    let ss = nvmf::set_hosts(&spec.nqn, &[GOOD_HOST.to_string()], &Default::default())
        .await
        .unwrap();
    assert_eq!(ss.hosts, vec![GOOD_HOST.to_string()]);
    assert_eq!(
        initiator::attach_tcp("c2", "127.0.0.1", port, &spec.nqn, GOOD_HOST)
            .await
            .unwrap(),
        vec!["c2n1".to_string()]
    );
    initiator::detach("c2").await.unwrap();

    // A port that is taken fails the create and leaves nothing behind.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = held.local_addr().unwrap().port();
    let nqn2 = naming::subsys_nqn("busy-port");
    let e = nvmf::create_subsystem(SubsystemSpec {
        nqn: nqn2.clone(),
        bdev: "lvs0/pvc-2".into(),
        port: busy,
        ..spec.clone()
    })
    .await
    .unwrap_err();
    assert!(e.to_string().contains(&busy.to_string()), "{e}");
    assert!(
        nvmf::subsystems()
            .await
            .unwrap()
            .iter()
            .all(|s| s.nqn != nqn2),
        "no half-created subsystem"
    );
    drop(held);

    nvmf::delete_subsystem(&spec.nqn).await.unwrap();
    nvmf::delete_subsystem(&spec.nqn).await.unwrap();
    assert!(nvmf::subsystems().await.unwrap().is_empty());
    for n in ["pvc-2", "pvc-1", "pvc-1_snap"] {
        lvol::delete_lvol("lvs0", n).await.unwrap();
    }
}
