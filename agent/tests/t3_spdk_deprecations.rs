//! T3: no deprecated SPDK call. Exercises what the agent does with subsystems (create
//! through the exporter and directly, the idempotent re-create, lookups by NQN, listings,
//! host changes, resize, delete) and lvols, then reads SPDK's deprecation counters: any hit
//! fails the test, except the ones SPDK's own modules make for features we cannot avoid,
//! named below.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use liteio_agent::exporter::{ExportRequest, Exporter, UnexportRequest};
use liteio_agent::spdk::exporter::SpdkExporter;
use liteio_agent::spdk::nvmf::{self, SubsystemSpec, TcpTransportOptions};
use liteio_agent::spdk::{Spdk, SpdkOptions, bdev, deprecation, lvol};
use liteio_api::SpdkLvol;

const MIB: u64 = 1 << 20;
const H1: &str = "nqn.2021-03.com.alipay.host:uuid:node-1";
const H2: &str = "nqn.2021-03.com.alipay.host:uuid:node-2";

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
    let spdk = Spdk::start(&SpdkOptions {
        name: "t3-deprecations".into(),
        ..SpdkOptions::small()
    })
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), scenario())
            .await
            .expect("scenario timed out");
    });
    spdk.stop();

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
    let mut req = ExportRequest {
        volume: "pvc-1".into(),
        uuid: uuid.into(),
        device: None,
        lvol: Some(SpdkLvol {
            name: "pvc-1".into(),
            lvs_name: "dlvs".into(),
            thin: false,
        }),
        size_bytes: 8 * MIB,
        allowed_hosts: vec![H1.into()],
        keyless_hosts: Vec::new(),
        preset: None,
        keys: None,
        path_state: Default::default(),
        qos: Default::default(),
        group_member: false,
    };
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
    let spec = SubsystemSpec {
        nqn: "nqn.2021-03.com.alipay.test:deprecations".into(),
        serial: "DEPRECATIONS0001".into(),
        model: "LiteIO test".into(),
        bdev: "dn".into(),
        ns_uuid: "5e4d3c2b-1a09-4f8e-8d7c-6b5a4f3e2d1c".into(),
        address: "127.0.0.1".into(),
        port,
        hosts: vec![H1.into()],
        keys: Default::default(),
        secure_channel: false,
        keyless_hosts: Vec::new(),
        multipath: None,
    };
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
