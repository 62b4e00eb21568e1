//! What the T3 tests that drive SPDK in this process share (feature `spdk`): SPDK's small
//! test shape and a scenario run on a current-thread runtime beside it, export and
//! subsystem requests with the usual defaults, the hosts they admit, and the check that an
//! assembly left nothing in SPDK. (A scenario on a two-thread runtime: `with_spdk`, from
//! `liteio_tests`.)

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use liteio_agent::exporter::{ExportRequest, Exporter, UnassembleRequest};
use liteio_agent::spdk::exporter::SpdkExporter;
use liteio_agent::spdk::nvmf::{self, SubsystemSpec};
use liteio_agent::spdk::{Spdk, SpdkOptions, bdev, raid};
use liteio_api::{SpdkLvol, naming};

/// Host NQN of node-1.
pub const H1: &str = "nqn.2021-03.com.alipay.host:uuid:node-1";
/// Host NQN of node-2.
pub const H2: &str = "nqn.2021-03.com.alipay.host:uuid:node-2";

/// SPDK's small test shape (no hugepages, interrupt mode), named `name`.
pub fn small(name: &str) -> SpdkOptions {
    SpdkOptions {
        name: name.into(),
        ..SpdkOptions::small()
    }
}

/// Runs `f` within `limit` on a current-thread runtime; panics on the timeout.
pub fn block_on<F: Future>(limit: Duration, f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(limit, f)
            .await
            .unwrap_or_else(|_| panic!("timed out after {limit:?}"))
    })
}

/// Starts SPDK from `opts`, runs `scenario` within `limit` on a current-thread runtime
/// ([`block_on`]) and stops SPDK.
pub fn beside_spdk<F: Future<Output = ()>>(opts: &SpdkOptions, limit: Duration, scenario: F) {
    let spdk = Spdk::start(opts).expect("SPDK starts");
    block_on(limit, scenario);
    spdk.stop();
}

/// Lvol `name` of lvstore `lvs`, thick.
pub fn lvol(lvs: &str, name: &str) -> SpdkLvol {
    SpdkLvol {
        name: name.into(),
        lvs_name: lvs.into(),
        thin: false,
    }
}

/// The export of `lvol` as volume `volume` (`uuid`, `size` bytes) for `hosts`: no keys,
/// default path state and QoS, not a group member.
pub fn lvol_export(
    volume: &str,
    uuid: &str,
    lvol: SpdkLvol,
    size: u64,
    hosts: &[&str],
) -> ExportRequest {
    ExportRequest {
        volume: volume.into(),
        uuid: uuid.into(),
        device: None,
        lvol: Some(lvol),
        size_bytes: size,
        allowed_hosts: hosts.iter().map(|h| h.to_string()).collect(),
        keyless_hosts: Vec::new(),
        preset: None,
        keys: None,
        path_state: Default::default(),
        qos: Default::default(),
        group_member: false,
    }
}

/// [`lvol_export`] of a file volume (`device`) instead of an lvol.
pub fn file_export(
    volume: &str,
    uuid: &str,
    device: PathBuf,
    size: u64,
    hosts: &[&str],
) -> ExportRequest {
    ExportRequest {
        device: Some(device),
        lvol: None,
        ..lvol_export(volume, uuid, lvol("", ""), size, hosts)
    }
}

/// A subsystem exporting `bdev` on 127.0.0.1:`port` to `hosts`, without keys, a secure
/// channel or multipath.
pub fn local_subsystem(
    nqn: &str,
    serial: &str,
    model: &str,
    bdev: &str,
    ns_uuid: &str,
    port: u16,
    hosts: Vec<String>,
) -> SubsystemSpec {
    SubsystemSpec {
        nqn: nqn.into(),
        serial: serial.into(),
        model: model.into(),
        bdev: bdev.into(),
        ns_uuid: ns_uuid.into(),
        address: "127.0.0.1".into(),
        port,
        hosts,
        keys: Default::default(),
        secure_channel: false,
        keyless_hosts: Vec::new(),
        multipath: None,
    }
}

/// Nothing of assembly `dc` (data control `dc_uuid`) is in SPDK: no raid, subsystem or
/// member controller.
pub async fn assembly_gone(dc: &str, dc_uuid: &str) {
    assert_eq!(raid::raid_info(dc).await.unwrap(), None, "raid bdev left");
    assert!(
        nvmf::find_subsystem(&naming::subsys_nqn(dc_uuid))
            .await
            .unwrap()
            .is_none(),
        "subsystem left"
    );
    let prefix = naming::assembly_controller_prefix(dc);
    let left: Vec<String> = bdev::list()
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "member controllers left: {left:?}");
}

/// Attaches to `nqn` on 127.0.0.1:`port` as `host` with `keys` and expects the target to
/// refuse after authenticating (not before); prints and returns what the host saw.
pub async fn refused_attach(
    ctrlr: &str,
    port: u16,
    nqn: &str,
    host: &str,
    keys: &nvmf::HostKeys,
    case: &str,
) -> String {
    let e = liteio_agent::spdk::initiator::attach_tcp_auth(
        ctrlr,
        "127.0.0.1",
        port,
        nqn,
        host,
        None,
        keys,
    )
    .await
    .expect_err(case)
    .to_string();
    assert!(
        !e.contains("File exists"),
        "{case}: refused before authenticating: {e}"
    );
    println!("refused: {case}: {e}");
    e
}

/// Removes assembly `dc` (data control `dc_uuid`, served as `target` over `members`
/// members) through `exp`; returns the request, to remove it again.
pub async fn unassemble(
    exp: &SpdkExporter,
    dc: &str,
    dc_uuid: &str,
    target: liteio_api::SpdkTarget,
    members: usize,
) -> UnassembleRequest {
    let un = UnassembleRequest {
        name: dc.into(),
        uuid: dc_uuid.into(),
        target: Some(target),
        members,
    };
    exp.remove_assembly(&un).await.unwrap();
    un
}

/// Attaches to `nqn` on 127.0.0.1:`port` as controller `ctrlr` of `host` with `keys`,
/// reads `data` back at 1 MiB and detaches.
pub async fn reads_back(
    ctrlr: &str,
    port: u16,
    nqn: &str,
    host: &str,
    keys: &nvmf::HostKeys,
    data: &[u8],
) {
    use liteio_agent::spdk::{initiator, io};
    let names = initiator::attach_tcp_auth(ctrlr, "127.0.0.1", port, nqn, host, None, keys)
        .await
        .unwrap();
    assert_eq!(
        io::read_at(&names[0], super::MIB, data.len())
            .await
            .unwrap(),
        data
    );
    initiator::detach(ctrlr).await.unwrap();
}
