//! T3: no deprecated SPDK call. Exercises what the agent does with subsystems (create
//! through the exporter and directly, the idempotent re-create, lookups by NQN, listings,
//! host changes, resize, delete) and lvols, then reads SPDK's deprecation counters: any hit
//! fails the test, except the ones SPDK's own modules make for features we cannot avoid,
//! named below.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::spdk::{H1, H2, beside_spdk, local_subsystem, lvol, lvol_export, small};
use liteio_agent::exporter::{ExportRequest, Exporter, UnexportRequest};
use liteio_agent::spdk::exporter::SpdkExporter;
use liteio_agent::spdk::nvmf::{self, TcpTransportOptions};
use liteio_agent::spdk::{bdev, deprecation, lvol};

const MIB: u64 = 1 << 20;

/// Deprecations hit inside SPDK 26.05 by features the agent needs, with no option to avoid
/// them; each must be gone when SPDK removes the deprecated path.
///
/// - `spdk_sock_group_add_sock_callbacks`: the NVMe/TCP transport (lib/nvmf/tcp.c) adds
///   every listen socket and every accepted connection to its sock group with a per-socket
///   callback, the only way SPDK 26.05 offers (the group-level receive callback that replaces
///   it is "upcoming"). One hit per listener and per connection.
/// - `bdev_get_memory_domains`: registering an lvol bdev whose base reports no memory-domain
///   types (aio, malloc: every pool here) makes bdev.c fall back to the lvol module's
///   `get_memory_domains`, which asks its base bdev with the deprecated
///   `spdk_bdev_get_memory_domains` (module/bdev/lvol/vbdev_lvol.c); raid0 does the same for
///   its members (module/bdev/raid/bdev_raid.c). One hit per lvol registered.
const INSIDE_SPDK: &[&str] = &[
    "spdk_sock_group_add_sock_callbacks",
    "bdev_get_memory_domains",
];

#[test]
fn agent_calls_hit_no_spdk_deprecation() {
    beside_spdk(
        &small("t3-deprecations"),
        Duration::from_secs(60),
        scenario(),
    );

    // SPDK has stopped: the counts are final.
    let all = deprecation::deprecations();
    assert!(
        all.iter().any(|d| d.tag == "spdk_nvmf_subsystem_create"),
        "SPDK's deprecation list is readable: {all:?}"
    );
    let hits = deprecation::deprecation_hits();
    for d in &hits {
        eprintln!(
            "SPDK deprecation hit: {} ({}; removed in {}): {} time(s)",
            d.tag, d.description, d.remove_release, d.hits
        );
    }
    let ours: Vec<_> = hits
        .iter()
        .filter(|d| !INSIDE_SPDK.contains(&d.tag.as_str()))
        .collect();
    assert!(ours.is_empty(), "deprecated SPDK features used: {ours:#?}");
}

async fn scenario() {
    let range = common::free_range(3);
    let port = *range.start();
    let exp = SpdkExporter::new("127.0.0.1", range, TcpTransportOptions::default());
    bdev::create_malloc("dm", 64 * MIB, 512).await.unwrap();
    lvol::create_lvstore("dm", "dlvs", 1 << 20).await.unwrap();
    lvol::create_lvol("dlvs", "pvc-1", 8 * MIB, false, lvol::Clear::WriteZeroes)
        .await
        .unwrap();
    let uuid = "3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b9a";
    let mut req = lvol_export("pvc-1", uuid, lvol("dlvs", "pvc-1"), 8 * MIB, &[H1]);
    let t = exp.ensure_export(&req).await.unwrap();
    // The re-create path (lookup by NQN, host reconciliation) and a live host change.
    req.allowed_hosts = vec![H2.into()];
    req.preset = Some(t.clone());
    assert_eq!(exp.ensure_export(&req).await.unwrap(), t);
    let found = nvmf::find_subsystem(&t.subsys_nqn).await.unwrap().unwrap();
    assert_eq!(found.serial, t.sn, "the serial reads back");
    assert_eq!(nvmf::subsystems().await.unwrap(), vec![found.clone()]);
    assert!(
        nvmf::listener_ports()
            .await
            .unwrap()
            .contains(&t.svc_id.parse().unwrap())
    );
    lvol::resize_lvol("dlvs", "pvc-1", 16 * MIB).await.unwrap();
    exp.resize_export(&ExportRequest {
        size_bytes: 16 * MIB,
        ..req.clone()
    })
    .await
    .unwrap();

    // A subsystem made directly, with a model number, on the same port.
    bdev::create_null("dn", 16 * MIB, 512).await.unwrap();
    let spec = local_subsystem(
        "nqn.2021-03.com.alipay.test:deprecations",
        "DEPRECATIONS0001",
        "LiteIO test",
        "dn",
        "5e4d3c2b-1a09-4f8e-8d7c-6b5a4f3e2d1c",
        port,
        vec![H1.into()],
    );
    let made = nvmf::create_subsystem(spec.clone()).await.unwrap();
    assert_eq!(made.serial, spec.serial);
    assert_eq!(nvmf::create_subsystem(spec.clone()).await.unwrap(), made);
    assert_eq!(
        nvmf::set_hosts(&spec.nqn, &[], &Default::default())
            .await
            .unwrap()
            .hosts,
        Vec::<String>::new()
    );
    nvmf::delete_subsystem(&spec.nqn).await.unwrap();
    assert!(nvmf::find_subsystem(&spec.nqn).await.unwrap().is_none());

    exp.remove_export(&UnexportRequest {
        volume: "pvc-1".into(),
        uuid: uuid.into(),
        target: Some(t),
    })
    .await
    .unwrap();
    assert!(nvmf::subsystems().await.unwrap().is_empty());
    lvol::delete_lvol("dlvs", "pvc-1").await.unwrap();
}
