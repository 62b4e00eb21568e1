//! T3: only the right host reaches a volume. The agent's target (SPDK in this process)
//! exports subsystems whose hosts must authenticate with DH-HMAC-CHAP (bidirectional) or
//! connect over TLS with a PSK; SPDK's own NVMe/TCP initiator, in the same process on
//! 127.0.0.1, plays the host. Every refused case prints the error the host saw (run with
//! `--nocapture` to read them).
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use liteio_agent::spdk::nvmf::{self, HostKeys, SubsystemSpec, TcpTransportOptions};
use liteio_agent::spdk::{bdev, initiator, io, keyring};
use liteio_api::auth::{DhchapSecret, TlsPsk};

const MIB: u64 = 1 << 20;
const HOST_A: &str = "nqn.2021-03.com.alipay.host:uuid:node-a";
const HOST_B: &str = "nqn.2021-03.com.alipay.host:uuid:node-b";
const NQN_A: &str = "nqn.2021-03.com.alipay.ob:uuid:auth-a";
const NQN_B: &str = "nqn.2021-03.com.alipay.ob:uuid:auth-b";
const NQN_TLS: &str = "nqn.2021-03.com.alipay.ob:uuid:auth-tls";

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// Loads each secret into the keyring under its name.
async fn add_keys(keys: &[(&str, &DhchapSecret)]) {
    for (name, s) in keys {
        keyring::add_key(name, s.expose()).await.unwrap();
    }
}

fn keys(host: &str, ctrl: Option<&str>) -> HostKeys {
    HostKeys {
        dhchap_key: Some(host.into()),
        dhchap_ctrlr_key: ctrl.map(Into::into),
        psk: None,
    }
}

fn spec(nqn: &str, bdev: &str, uuid: &str, port: u16, host: &str, keys: HostKeys) -> SubsystemSpec {
    let serial: String = uuid.replace('-', "").chars().take(20).collect();
    SubsystemSpec {
        secure_channel: keys.psk.is_some(),
        keys,
        ..common::spdk::local_subsystem(nqn, &serial, "auth", bdev, uuid, port, vec![host.into()])
    }
}

/// Attach as `host` with `keys` and expect a refusal; returns what the host saw.
async fn refused(
    case: &str,
    ctrlr: &str,
    port: u16,
    nqn: &str,
    host: &str,
    keys: &HostKeys,
) -> String {
    let r = initiator::attach_tcp_auth(ctrlr, "127.0.0.1", port, nqn, host, None, keys).await;
    let e = match r {
        Ok(names) => panic!("{case}: the host connected ({names:?}) but must be refused"),
        Err(e) => e.to_string(),
    };
    assert!(
        bdev::get(&format!("{ctrlr}n1")).await.unwrap().is_none(),
        "{case}: a refused attach left a bdev"
    );
    // Not the initiator's "one controller per path" refusal: the target (or the host's
    // check of the target) must be what said no.
    assert!(
        !e.contains("File exists"),
        "{case}: refused before authenticating: {e}"
    );
    eprintln!("refused: {case}: {e}");
    e
}

#[test]
fn dhchap_and_tls_admit_only_the_right_host() {
    // SPDK 26.05's NVMe/TCP initiator refuses interrupt mode, so this test polls (one
    // reactor, one core, a few seconds).
    common::with_spdk("t3-auth", true, Duration::from_secs(180), scenario());
}

async fn scenario() {
    let (uuid_a, uuid_b, uuid_t) = (
        "0a0a0a0a-1111-4222-8333-444455556666",
        "0b0b0b0b-1111-4222-8333-444455556666",
        "0c0c0c0c-1111-4222-8333-444455556666",
    );
    for b in ["ma", "mb", "mt"] {
        bdev::create_malloc(b, 16 * MIB, 512).await.unwrap();
    }
    nvmf::ensure_tcp_transport(&TcpTransportOptions::default())
        .await
        .unwrap();

    // Target side: volume A's keys, volume B's keys (another host's), in the keyring.
    let (a_host, a_ctrl) = (
        DhchapSecret::generate().unwrap(),
        DhchapSecret::generate().unwrap(),
    );
    let (b_host, b_ctrl) = (
        DhchapSecret::generate().unwrap(),
        DhchapSecret::generate().unwrap(),
    );
    add_keys(&[
        ("tgt-a-host", &a_host),
        ("tgt-a-ctrl", &a_ctrl),
        ("tgt-b-host", &b_host),
        ("tgt-b-ctrl", &b_ctrl),
    ])
    .await;
    // Adding the same secret again is success; a bad name is refused naming the field.
    keyring::add_key("tgt-a-host", a_host.expose())
        .await
        .unwrap();
    let e = keyring::add_key("bad:name", a_host.expose())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("name"), "{e}");
    assert!(
        !e.to_string().contains(a_host.expose()),
        "an error shows a secret: {e}"
    );

    let (port_a, port_b) = (common::free_port(), common::free_port());
    nvmf::create_subsystem(spec(
        NQN_A,
        "ma",
        uuid_a,
        port_a,
        HOST_A,
        keys("tgt-a-host", Some("tgt-a-ctrl")),
    ))
    .await
    .unwrap();
    nvmf::create_subsystem(spec(
        NQN_B,
        "mb",
        uuid_b,
        port_b,
        HOST_B,
        keys("tgt-b-host", Some("tgt-b-ctrl")),
    ))
    .await
    .unwrap();

    // Host side: its own key names (the same secrets where the host holds the right ones).
    let wrong = DhchapSecret::generate().unwrap();
    add_keys(&[
        ("ini-a-host", &a_host),
        ("ini-a-ctrl", &a_ctrl),
        ("ini-b-host", &b_host),
        ("ini-wrong", &wrong),
    ])
    .await;

    refused("no key", "r0", port_a, NQN_A, HOST_A, &HostKeys::default()).await;
    refused(
        "wrong host key",
        "r1",
        port_a,
        NQN_A,
        HOST_A,
        &keys("ini-wrong", None),
    )
    .await;
    refused(
        "the right NQN with another host's key",
        "r2",
        port_a,
        NQN_A,
        HOST_A,
        &keys("ini-b-host", None),
    )
    .await;
    refused(
        "another host's NQN with its own right key",
        "r3",
        port_a,
        NQN_A,
        HOST_B,
        &keys("ini-b-host", None),
    )
    .await;
    refused(
        "target proves the wrong controller key (bidirectional check by the host)",
        "r4",
        port_a,
        NQN_A,
        HOST_A,
        &keys("ini-a-host", Some("ini-wrong")),
    )
    .await;

    // Host-side authentication only (no controller key) is also accepted. (SPDK's
    // initiator takes one controller per path, so this one goes before the next.)
    let one_way = initiator::attach_tcp_auth(
        "oneway",
        "127.0.0.1",
        port_a,
        NQN_A,
        HOST_A,
        None,
        &keys("ini-a-host", None),
    )
    .await
    .unwrap();
    assert_eq!(one_way, vec!["onewayn1".to_string()]);
    initiator::detach("oneway").await.unwrap();

    // The right keys: connects, and data goes both ways.
    let right = keys("ini-a-host", Some("ini-a-ctrl"));
    let names = initiator::attach_tcp_auth("ok", "127.0.0.1", port_a, NQN_A, HOST_A, None, &right)
        .await
        .unwrap();
    assert_eq!(names, vec!["okn1".to_string()]);
    let d1 = pattern(1, 64 * 1024);
    io::write_at("okn1", MIB, d1.clone()).await.unwrap();
    assert_eq!(
        io::read_at("ma", MIB, d1.len()).await.unwrap(),
        d1,
        "target side sees the data"
    );
    assert_eq!(io::read_at("okn1", MIB, d1.len()).await.unwrap(), d1);

    // Rotation: new keys on the live subsystem. The connected host stays connected; it then
    // takes the new keys itself and re-authenticates its live connection with them (SPDK's
    // initiator also opens I/O queues lazily, and those need the new keys). A new connection
    // with the old (stale) keys is refused; with the new ones it reads what was written
    // before and after the rotation.
    let (a_host2, a_ctrl2) = (
        DhchapSecret::generate().unwrap(),
        DhchapSecret::generate().unwrap(),
    );
    keyring::add_key("tgt-a-host-2", a_host2.expose())
        .await
        .unwrap();
    keyring::add_key("tgt-a-ctrl-2", a_ctrl2.expose())
        .await
        .unwrap();
    let ss = nvmf::set_hosts(
        NQN_A,
        &[HOST_A.to_string()],
        &keys("tgt-a-host-2", Some("tgt-a-ctrl-2")),
    )
    .await
    .unwrap();
    assert_eq!(ss.hosts, vec![HOST_A.to_string()]);
    assert!(
        bdev::get("okn1").await.unwrap().is_some(),
        "the connected host was dropped by the rotation"
    );
    keyring::add_key("ini-a-host-2", a_host2.expose())
        .await
        .unwrap();
    keyring::add_key("ini-a-ctrl-2", a_ctrl2.expose())
        .await
        .unwrap();
    // Re-authenticating the live connection with the new keys succeeds: same connection.
    let rotated = keys("ini-a-host-2", Some("ini-a-ctrl-2"));
    initiator::set_keys("ok", &rotated).await.unwrap();
    let d2 = pattern(2, 64 * 1024);
    io::write_at("okn1", 2 * MIB, d2.clone()).await.unwrap();
    assert_eq!(
        io::read_at("okn1", MIB, d1.len()).await.unwrap(),
        d1,
        "connection survived rotation"
    );
    // SPDK's initiator takes one controller per path: the next attaches need this one gone.
    initiator::detach("ok").await.unwrap();
    refused(
        "stale key after rotation",
        "r5",
        port_a,
        NQN_A,
        HOST_A,
        &right,
    )
    .await;
    // The old host key with the new controller key, and the reverse, are refused too.
    refused(
        "old host key with the new controller key",
        "r6",
        port_a,
        NQN_A,
        HOST_A,
        &keys("ini-a-host", Some("ini-a-ctrl-2")),
    )
    .await;
    refused(
        "new host key, target checked against the old controller key",
        "r7",
        port_a,
        NQN_A,
        HOST_A,
        &keys("ini-a-host-2", Some("ini-a-ctrl")),
    )
    .await;
    let names =
        initiator::attach_tcp_auth("new", "127.0.0.1", port_a, NQN_A, HOST_A, None, &rotated)
            .await
            .unwrap();
    assert_eq!(io::read_at(&names[0], 2 * MIB, d2.len()).await.unwrap(), d2);
    assert_eq!(io::read_at(&names[0], MIB, d1.len()).await.unwrap(), d1);
    // Re-authenticating a live connection with the stale keys is refused (and the target
    // drops that connection).
    let e = initiator::set_keys("new", &right).await.unwrap_err();
    eprintln!("refused: re-authentication of a live connection with the stale keys: {e}");
    initiator::detach("new").await.unwrap();

    // TLS: a secure-channel listener refuses a plain connection and a wrong PSK; the right
    // PSK (with DH-HMAC-CHAP on top) connects.
    let (psk, wrong_psk) = (TlsPsk::generate().unwrap(), TlsPsk::generate().unwrap());
    keyring::add_key("tgt-t-psk", psk.expose()).await.unwrap();
    keyring::add_key("ini-t-psk", psk.expose()).await.unwrap();
    keyring::add_key("ini-t-wrong-psk", wrong_psk.expose())
        .await
        .unwrap();
    let port_t = common::free_port();
    let tls_keys = HostKeys {
        psk: Some("tgt-t-psk".into()),
        ..keys("tgt-a-host-2", None)
    };
    nvmf::create_subsystem(spec(NQN_TLS, "mt", uuid_t, port_t, HOST_A, tls_keys))
        .await
        .unwrap();
    let plain = keys("ini-a-host-2", None);
    refused(
        "plain connection to a TLS listener",
        "r8",
        port_t,
        NQN_TLS,
        HOST_A,
        &plain,
    )
    .await;
    let bad_tls = HostKeys {
        psk: Some("ini-t-wrong-psk".into()),
        ..plain.clone()
    };
    refused("wrong TLS PSK", "r9", port_t, NQN_TLS, HOST_A, &bad_tls).await;
    let good_tls = HostKeys {
        psk: Some("ini-t-psk".into()),
        ..plain.clone()
    };
    let names =
        initiator::attach_tcp_auth("tls", "127.0.0.1", port_t, NQN_TLS, HOST_A, None, &good_tls)
            .await
            .unwrap();
    let d3 = pattern(3, 32 * 1024);
    io::write_at(&names[0], 0, d3.clone()).await.unwrap();
    assert_eq!(io::read_at("mt", 0, d3.len()).await.unwrap(), d3);
    initiator::detach("tls").await.unwrap();

    // Keys leave the keyring; removing twice is success.
    keyring::remove_key("ini-wrong").await.unwrap();
    keyring::remove_key("ini-wrong").await.unwrap();
    assert!(!keyring::has_key("ini-wrong").await.unwrap());
    for nqn in [NQN_A, NQN_B, NQN_TLS] {
        nvmf::delete_subsystem(nqn).await.unwrap();
    }
}
