//! T3: the target offers DH-HMAC-CHAP only the DH groups it is configured with, and what each
//! group costs a connecting queue pair. SPDK's own initiator in this process plays the host
//! and offers one group at a time; a group the target does not allow must be refused, and an
//! allowed one must connect and carry I/O.
//!
//! Every read through `io::read_at` opens an I/O channel, so with the NVMe bdev it connects
//! (and authenticates) a new I/O queue pair: the time of a read is mostly that handshake. The
//! test prints the median of several per group (`--nocapture`).
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use liteio_agent::spdk::nvmf::{self, DhGroup, HostKeys, SubsystemSpec, TcpTransportOptions};
use liteio_agent::spdk::{SpdkOptions, bdev, initiator, io, keyring};
use liteio_api::auth::DhchapSecret;

const MIB: u64 = 1 << 20;
const HOST: &str = "nqn.2021-03.com.alipay.host:uuid:dh-host";
const NQN: &str = "nqn.2021-03.com.alipay.ob:uuid:dh-groups";
const UUID: &str = "0d0d0d0d-1111-4222-8333-444455556666";
/// What the agent allows by default (`nvmf.dhchapDhgroups`).
const ALLOWED: [DhGroup; 2] = [DhGroup::Null, DhGroup::Ffdhe2048];
const READS: usize = 5;

#[test]
fn the_target_allows_only_its_configured_dh_groups() {
    // SPDK 26.05's NVMe/TCP initiator refuses interrupt mode, so this test polls.
    let opts = SpdkOptions {
        name: "t3-dhgroups".into(),
        interrupt_mode: false,
        dhchap_dhgroups: ALLOWED.to_vec(),
        ..SpdkOptions::small()
    };
    common::with_spdk_opts(&opts, Duration::from_secs(240), scenario());
}

async fn scenario() {
    bdev::create_malloc("dh0", 16 * MIB, 512).await.unwrap();
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    io::write_at("dh0", 0, pattern.clone()).await.unwrap();
    nvmf::ensure_tcp_transport(&TcpTransportOptions::default())
        .await
        .unwrap();
    let (host_key, ctrl_key) = (
        DhchapSecret::generate().unwrap(),
        DhchapSecret::generate().unwrap(),
    );
    keyring::add_key("dh-host", host_key.expose())
        .await
        .unwrap();
    keyring::add_key("dh-ctrl", ctrl_key.expose())
        .await
        .unwrap();
    let keys = HostKeys {
        dhchap_key: Some("dh-host".into()),
        dhchap_ctrlr_key: Some("dh-ctrl".into()),
        psk: None,
    };
    let port = common::free_port();
    nvmf::create_subsystem(SubsystemSpec {
        keys: keys.clone(),
        ..common::spdk::local_subsystem(
            NQN,
            "DH0000000000001",
            "dhgroups",
            "dh0",
            UUID,
            port,
            vec![HOST.into()],
        )
    })
    .await
    .unwrap();

    let mut figures = Vec::new();
    for group in DhGroup::ALL {
        // Only while no controller is attached (each case detaches its own).
        initiator::set_dhchap_dhgroups(&[group]).await.unwrap();
        let ctrlr = format!("dh_{}", group.name());
        let started = Instant::now();
        let r = initiator::attach_tcp_auth(&ctrlr, "127.0.0.1", port, NQN, HOST, None, &keys).await;
        let connect = started.elapsed();
        if !ALLOWED.contains(&group) {
            let e = r.expect_err(&format!(
                "the host offered only {group}, which the target does not allow, and got in"
            ));
            assert!(
                bdev::get(&format!("{ctrlr}n1")).await.unwrap().is_none(),
                "a refused attach left a bdev"
            );
            eprintln!("refused: host offering only {group}: {e}");
            continue;
        }
        let names = r.unwrap_or_else(|e| panic!("{group} is allowed but the attach failed: {e}"));
        assert_eq!(names, vec![format!("{ctrlr}n1")]);
        let mut reads = Vec::new();
        for _ in 0..READS {
            let t = Instant::now();
            let got = io::read_at(&names[0], 0, 4096).await.unwrap();
            reads.push(t.elapsed());
            assert_eq!(got, pattern, "{group}: read back other data");
        }
        reads.sort();
        figures.push((group, connect, reads[READS / 2]));
        initiator::detach(&ctrlr).await.unwrap();
    }
    initiator::set_dhchap_dhgroups(&DhGroup::ALL).await.unwrap();
    assert_eq!(
        figures.len(),
        ALLOWED.len(),
        "every allowed group must have connected"
    );
    eprintln!("DH-HMAC-CHAP cost per queue pair (target and host in one process, one core):");
    eprintln!("  group      admin connect   new I/O qpair + 4 KiB read (median of {READS})");
    for (g, c, r) in figures {
        eprintln!(
            "  {:<10} {:>10.1} ms   {:>10.1} ms",
            g.name(),
            c.as_secs_f64() * 1e3,
            r.as_secs_f64() * 1e3
        );
    }
    nvmf::delete_subsystem(NQN).await.unwrap();
}
