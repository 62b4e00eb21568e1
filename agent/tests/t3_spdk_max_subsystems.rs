//! T3: `max_subsystems` reaches SPDK's NVMe-oF target through the start-up config, and a full
//! target says so. SPDK's default (1,024 slots) once capped a node at 1,023 volumes with an
//! error that blamed the NQN.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use liteio_agent::spdk::nvmf::{self, TcpTransportOptions};
use liteio_agent::spdk::{SpdkOptions, bdev};
use liteio_api::naming;

const MIB: u64 = 1 << 20;
/// Slots: the discovery subsystem takes one, so three volumes fit.
const SLOTS: u32 = 4;

#[test]
fn the_target_holds_as_many_subsystems_as_configured() {
    let opts = SpdkOptions {
        max_subsystems: SLOTS,
        ..common::spdk::small("t3-max-subsystems")
    };
    common::spdk::beside_spdk(&opts, Duration::from_secs(60), scenario());
}

async fn scenario() {
    nvmf::ensure_tcp_transport(&TcpTransportOptions::default())
        .await
        .unwrap();
    let spec = |i: u32| {
        let uuid = format!("7a0e1c2d-3b4f-4a5e-8d6c-{i:012}");
        common::spdk::local_subsystem(
            &naming::subsys_nqn(&uuid),
            &naming::serial_number(&uuid),
            &uuid,
            &format!("m{i}"),
            &uuid,
            common::free_port(),
            Vec::new(),
        )
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
