//! T3: the SPDK exporter's assembly of a multi-disk volume in one SPDK process: a "remote"
//! member exported by this same target (over 127.0.0.1, with DH-HMAC-CHAP) and a local lvol,
//! a concat over them exported to a host; idempotent re-assertion, a live change of host,
//! removal; and the failures (a member that cannot be attached, an assembly too small, SPDK
//! in interrupt mode) leave no raid bdev, initiator controller, subsystem or key behind.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use liteio_agent::exporter::{
    AssemblyLevel, AssemblyMember, AssemblyRequest, ExportError, ExportRequest, Exporter,
    MemberSource,
};
use liteio_agent::spdk::exporter::SpdkExporter;
use liteio_agent::spdk::nvmf::{self, TcpTransportOptions};
use liteio_agent::spdk::{bdev, keyring, lvol, raid};
use liteio_api::auth::VolumeKeys;
use liteio_api::{SpdkLvol, SpdkTarget, naming};

const MIB: u64 = 1 << 20;
/// The assembling node's host NQN (its members' exports admit it).
const ME: &str = "nqn.2021-03.com.alipay.host:uuid:node-1";
const HOST: &str = "nqn.2021-03.com.alipay.host:uuid:node-2";
const HOST2: &str = "nqn.2021-03.com.alipay.host:uuid:node-3";
const DC: &str = "pvc-asm";
const DC_UUID: &str = "dc-5a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";

fn lvol(name: &str) -> SpdkLvol {
    common::spdk::lvol("alvs", name)
}

/// Nothing of the assembly is in SPDK: no raid, subsystem, member controller or key.
async fn nothing_left() {
    common::spdk::assembly_gone(DC, DC_UUID).await;
    for k in ["host", "ctrl"] {
        assert!(
            !keyring::has_key(&format!("liteio-{DC_UUID}-{k}"))
                .await
                .unwrap(),
            "key {k} left"
        );
    }
}

#[test]
fn an_assembly_is_made_kept_changed_and_removed_and_a_failed_one_leaves_nothing() {
    common::with_spdk("t3-assembly", true, Duration::from_secs(120), async {
        let range = common::free_range(8);
        let exp = SpdkExporter::new("127.0.0.1", range.clone(), TcpTransportOptions::default())
            .with_auth(true);
        assert!(exp.assembles());
        bdev::create_malloc("am", 64 * MIB, 512).await.unwrap();
        lvol::create_lvstore("am", "alvs", 1 << 20).await.unwrap();
        for n in ["m0", "m1"] {
            lvol::create_lvol("alvs", n, 16 * MIB, false, lvol::Clear::WriteZeroes)
                .await
                .unwrap();
        }
        let keys = VolumeKeys::generate(false).unwrap();
        // Member m0 as its own node exports it: to the assembling node, with the PV's keys.
        let m0 = exp
            .ensure_export(&ExportRequest {
                keys: Some(keys.clone()),
                ..common::spdk::lvol_export(
                    "pvc-asm-m0",
                    "0b9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a00",
                    lvol("m0"),
                    16 * MIB,
                    &[ME],
                )
            })
            .await
            .unwrap();
        let req = AssemblyRequest {
            name: DC.into(),
            uuid: DC_UUID.into(),
            level: AssemblyLevel::Concat,
            strip_kb: 64,
            members: vec![
                AssemblyMember {
                    volume: "pvc-asm-m0".into(),
                    node: "node-2".into(),
                    source: MemberSource::Remote { target: m0.clone() },
                },
                AssemblyMember {
                    volume: "pvc-asm-m1".into(),
                    node: "node-1".into(),
                    source: MemberSource::Local { lvol: lvol("m1") },
                },
            ],
            size_bytes: 32 * MIB,
            hostnqn: ME.into(),
            allowed_hosts: vec![HOST.into()],
            keys: Some(keys.clone()),
            preset: None,
            new_mirror: false,
        };

        // A member that cannot be attached (nothing listens there): nothing is left, and
        // the local lvol is free again.
        let unreachable = SpdkTarget {
            svc_id: range.end().to_string(),
            ..m0.clone()
        };
        let mut bad = req.clone();
        bad.members.swap(0, 1);
        bad.members[1].source = MemberSource::Remote {
            target: unreachable,
        };
        let e = exp.ensure_assembly(&bad).await.unwrap_err();
        assert!(
            e.to_string()
                .contains("multi-disk volume pvc-asm: cannot attach member pvc-asm-m0"),
            "{e}"
        );
        nothing_left().await;
        // Too small for its totalSize: the raid and the member's controller made for it go.
        let e = exp
            .ensure_assembly(&AssemblyRequest {
                size_bytes: 64 * MIB,
                ..req.clone()
            })
            .await
            .unwrap_err();
        assert!(
            matches!(&e, ExportError::InvalidRequest(m) if m.contains("holds 33554432 bytes, less than its spec.totalSize 67108864")),
            "{e}"
        );
        nothing_left().await;
        // SPDK in interrupt mode has no NVMe/TCP initiator: refused by name, nothing made.
        let quiet = SpdkExporter::new("127.0.0.1", range.clone(), TcpTransportOptions::default())
            .with_auth(true)
            .with_interrupt_mode(true);
        let e = quiet.ensure_assembly(&req).await.unwrap_err();
        assert!(
            matches!(&e, ExportError::Unsupported(m) if m.contains("spdk.interruptMode: false")),
            "{e}"
        );
        nothing_left().await;

        // Made: a concat of both, exported to the host.
        let t = exp.ensure_assembly(&req).await.unwrap();
        assert_eq!(t.subsys_nqn, naming::subsys_nqn(DC_UUID));
        assert_eq!(t.ns_uuid, naming::assembly_ns_uuid(DC_UUID));
        assert_eq!(t.bdev_name, DC);
        let r = raid::raid_info(DC).await.unwrap().unwrap();
        assert_eq!(
            (r.level, r.state, r.strip_kb, r.bases.len()),
            (raid::RaidLevel::Concat, raid::RaidState::Online, 64, 2)
        );
        assert_eq!(bdev::get(DC).await.unwrap().unwrap().size_bytes(), 32 * MIB);
        let ss = nvmf::find_subsystem(&t.subsys_nqn).await.unwrap().unwrap();
        assert_eq!(ss.hosts, [HOST.to_string()]);
        assert_eq!(ss.bdevs, [DC.to_string()]);
        assert!(exp.is_listening(&t).await.unwrap());
        // (The data path through the export is the cluster test's, t3_multidisk: the
        // subsystem holds the raid's write claim here.)
        // Re-asserted (every pass of the sync): the same, nothing made again.
        let again = AssemblyRequest {
            preset: Some(t.clone()),
            ..req.clone()
        };
        assert_eq!(exp.ensure_assembly(&again).await.unwrap(), t);
        assert_eq!(raid::raid_info(DC).await.unwrap().unwrap().uuid, r.uuid);
        // A new host replaces the old one live.
        let moved = AssemblyRequest {
            allowed_hosts: vec![HOST2.into()],
            ..again.clone()
        };
        assert_eq!(exp.ensure_assembly(&moved).await.unwrap(), t);
        let ss = nvmf::find_subsystem(&t.subsys_nqn).await.unwrap().unwrap();
        assert_eq!(ss.hosts, [HOST2.to_string()]);

        // Removed, twice (idempotent); the members are untouched.
        let un = common::spdk::unassemble(&exp, DC, DC_UUID, t.clone(), 2).await;
        nothing_left().await;
        exp.remove_assembly(&un).await.unwrap();
        assert!(
            nvmf::find_subsystem(&m0.subsys_nqn)
                .await
                .unwrap()
                .is_some(),
            "the member's own export stays"
        );
        assert!(lvol::lvol("alvs", "m1").await.unwrap().is_some());
    });
}
