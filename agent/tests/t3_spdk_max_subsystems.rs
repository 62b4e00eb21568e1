//! T3: `max_subsystems` reaches SPDK's NVMe-oF target through the start-up config, and a full
//! target says so. SPDK's default (1,024 slots) once capped a node at 1,023 volumes with an
//! error that blamed the NQN.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use liteio_agent::spdk::nvmf::{self, SubsystemSpec, TcpTransportOptions};
use liteio_agent::spdk::{Spdk, SpdkOptions, bdev};
use liteio_api::naming;

const MIB: u64 = 1 << 20;
/// Slots: the discovery subsystem takes one, so three volumes fit.
const SLOTS: u32 = 4;

#[test]
fn the_target_holds_as_many_subsystems_as_configured() {
    let spdk = Spdk::start(&SpdkOptions {
        name: "t3-max-subsystems".into(),
        max_subsystems: SLOTS,
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
}

async fn scenario() {
    nvmf::ensure_tcp_transport(&TcpTransportOptions::default())
        .await
        .unwrap();
    let spec = |i: u32| {
        let uuid = format!("7a0e1c2d-3b4f-4a5e-8d6c-{i:012}");
        SubsystemSpec {
            nqn: naming::subsys_nqn(&uuid),
            serial: naming::serial_number(&uuid),
            model: uuid.clone(),
            bdev: format!("m{i}"),
            ns_uuid: uuid,
            address: "127.0.0.1".into(),
            port: common::free_port(),
            hosts: Vec::new(),
            keys: Default::default(),
            secure_channel: false,
            keyless_hosts: Vec::new(),
            multipath: None,
        }
    };
    for i in 0..SLOTS {
        bdev::create_malloc(&format!("m{i}"), 4 * MIB, 512)
            .await
            .unwrap();
    }
    for i in 0..SLOTS - 1 {
        nvmf::create_subsystem(spec(i))
            .await
            .unwrap_or_else(|e| panic!("subsystem {i} of {}: {e}", SLOTS - 1));
    }
    // SPDK's default would take a fourth volume; the configured target is full.
    let e = nvmf::create_subsystem(spec(SLOTS - 1)).await.unwrap_err();
    let msg = e.to_string();
    println!("a full target: {msg}");
    assert!(msg.contains("raise spdk.maxSubsystems"), "{msg}");
    // The discovery subsystem counts too.
    assert!(msg.contains("4 subsystems"), "{msg}");
}
