//! T3: the SPDK exporter's mirror (a replicated volume: raid1 with a superblock) in one SPDK
//! process: a "remote" replica exported by this same target over 127.0.0.1 with
//! DH-HMAC-CHAP and a local lvol; the host's writes through the assembled export go on
//! while the remote replica's export disappears (the raid fails it and degrades, no error
//! to the host); a replacement replica put in its slot is attached, added and rebuilt while
//! the host reads; afterwards both replicas hold the host's data block for block. A new
//! mirror with a replica missing is refused and leaves nothing.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use liteio_agent::exporter::{
    AssemblyLevel, AssemblyMember, AssemblyRequest, ExportError, ExportRequest, Exporter,
    MemberSource, UnexportRequest,
};
use liteio_agent::spdk::exporter::SpdkExporter;
use liteio_agent::spdk::nvmf::{HostKeys, TcpTransportOptions};
use liteio_agent::spdk::{bdev, initiator, io, lvol, raid};
use liteio_api::auth::VolumeKeys;
use liteio_api::replica::{ReplicaState, ReplicaStatus};
use liteio_api::{SpdkLvol, SpdkTarget};

const MIB: u64 = 1 << 20;
/// The assembling node's host NQN (the replicas' exports admit it).
const ME: &str = "nqn.2021-03.com.alipay.host:uuid:node-1";
/// The volume's host.
const HOST: &str = "nqn.2021-03.com.alipay.host:uuid:node-9";
const DC: &str = "pvc-mir";
const DC_UUID: &str = "dc-6b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e";
/// The volume's size; each replica holds it and the raid's superblock (4 MiB: one cluster).
const SIZE: u64 = 16 * MIB;
const REPLICA: u64 = SIZE + 4 * MIB;
/// What the host writes and compares.
const DATA: usize = 8 << 20;

fn lvol(name: &str) -> SpdkLvol {
    common::spdk::lvol("mlvs", name)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u64)
                .wrapping_mul(2_654_435_761)
                .rotate_left(u32::from(seed)) as u8
                ^ seed
        })
        .collect()
}

/// Exports replica lvol `name` as its own node's agent does: to the assembling node.
async fn export_replica(
    exp: &SpdkExporter,
    name: &str,
    uuid: &str,
    keys: &VolumeKeys,
) -> SpdkTarget {
    exp.ensure_export(&ExportRequest {
        keys: Some(keys.clone()),
        ..common::spdk::lvol_export(&format!("{DC}-{name}"), uuid, lvol(name), REPLICA, &[ME])
    })
    .await
    .unwrap()
}

async fn states(exp: &SpdkExporter, req: &AssemblyRequest) -> Vec<ReplicaStatus> {
    exp.replicas(req).await.unwrap()
}

fn words(st: &[ReplicaStatus]) -> Vec<(String, ReplicaState)> {
    st.iter().map(|s| (s.volume.clone(), s.state)).collect()
}

/// Nothing of the assembly is in SPDK: no raid, subsystem or member controller.
async fn nothing_left() {
    common::spdk::assembly_gone(DC, DC_UUID).await;
}

#[test]
fn a_mirror_serves_through_the_loss_of_a_replica_and_rebuilds_its_replacement() {
    // Polling: SPDK's NVMe/TCP initiator does not run in interrupt mode.
    common::with_spdk("t3-mirror", true, Duration::from_secs(240), async {
        let range = common::free_range(8);
        let exp = SpdkExporter::new("127.0.0.1", range.clone(), TcpTransportOptions::default())
            .with_auth(true);
        bdev::create_malloc("mm", 96 * MIB, 512).await.unwrap();
        lvol::create_lvstore("mm", "mlvs", 4 << 20).await.unwrap();
        for n in ["r0", "r1", "r2"] {
            lvol::create_lvol("mlvs", n, REPLICA, false, lvol::Clear::WriteZeroes)
                .await
                .unwrap();
        }
        let keys = VolumeKeys::generate(false).unwrap();
        let r0 = export_replica(&exp, "r0", "0c9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a00", &keys).await;
        let r2 = export_replica(&exp, "r2", "0c9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a02", &keys).await;
        let req = AssemblyRequest {
            name: DC.into(),
            uuid: DC_UUID.into(),
            level: AssemblyLevel::Mirror,
            strip_kb: 0,
            members: vec![
                AssemblyMember {
                    volume: "pvc-mir-r0".into(),
                    node: "node-2".into(),
                    source: MemberSource::Remote { target: r0.clone() },
                },
                AssemblyMember {
                    volume: "pvc-mir-r1".into(),
                    node: "node-1".into(),
                    source: MemberSource::Local { lvol: lvol("r1") },
                },
            ],
            size_bytes: SIZE,
            hostnqn: ME.into(),
            allowed_hosts: vec![HOST.into()],
            keys: Some(keys.clone()),
            preset: None,
            new_mirror: true,
        };

        // A new mirror is made over every replica: one missing is refused, nothing made.
        let mut short = req.clone();
        short.members[0].source = MemberSource::Absent {
            reason: "node node-2 is down".into(),
        };
        let e = exp.ensure_assembly(&short).await.unwrap_err();
        assert!(
            matches!(&e, ExportError::InvalidRequest(m) if m.contains("1 of 2 are reachable") && m.contains("node node-2 is down")),
            "{e}"
        );
        nothing_left().await;

        // Made: a raid1 with a superblock over both, exported to the host.
        let t = exp.ensure_assembly(&req).await.unwrap();
        let r = raid::raid_info(DC).await.unwrap().unwrap();
        assert_eq!(
            (r.level, r.state, r.superblock, r.bases.len()),
            (raid::RaidLevel::Raid1, raid::RaidState::Online, true, 2)
        );
        assert!(
            r.bases.iter().all(|b| b.configured && !b.rebuilding),
            "{r:?}"
        );
        assert!(bdev::get(DC).await.unwrap().unwrap().size_bytes() >= SIZE);
        assert_eq!(
            words(&states(&exp, &req).await),
            [
                ("pvc-mir-r0".to_string(), ReplicaState::Online),
                ("pvc-mir-r1".to_string(), ReplicaState::Online)
            ]
        );
        // Re-asserted as a running volume (every pass of the sync): unchanged.
        let running = AssemblyRequest {
            new_mirror: false,
            preset: Some(t.clone()),
            ..req.clone()
        };
        assert_eq!(exp.ensure_assembly(&running).await.unwrap(), t);
        assert_eq!(raid::raid_info(DC).await.unwrap().unwrap().uuid, r.uuid);

        // The host connects to the assembled export with the PV's keys (the exporter loaded
        // them under the volume's key names) and writes.
        let port: u16 = t.svc_id.parse().unwrap();
        let host_keys = HostKeys {
            dhchap_key: Some(format!("liteio-{DC_UUID}-host")),
            dhchap_ctrlr_key: Some(format!("liteio-{DC_UUID}-ctrl")),
            psk: None,
        };
        let names = initiator::attach_tcp_auth(
            "hostc",
            "127.0.0.1",
            port,
            &t.subsys_nqn,
            HOST,
            None,
            &host_keys,
        )
        .await
        .unwrap();
        let dev = names[0].clone();
        let mut want = pattern(1, DATA);
        io::write_at(&dev, 0, want.clone()).await.unwrap();
        assert_eq!(io::read_at(&dev, 0, DATA).await.unwrap(), want);

        // Replica r0's export disappears (its node is gone): the host's writes go on without
        // an error; the raid fails r0 (its controller fails I/O after 2 s) and degrades.
        exp.remove_export(&UnexportRequest {
            volume: "pvc-mir-r0".into(),
            uuid: "0c9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a00".into(),
            target: Some(r0.clone()),
        })
        .await
        .unwrap();
        let lost = Instant::now();
        let second = pattern(2, 2 * MIB as usize);
        io::write_at(&dev, MIB, second.clone()).await.unwrap();
        want[MIB as usize..3 * MIB as usize].copy_from_slice(&second);
        println!(
            "a write after the replica's loss completed in {:.2}s",
            lost.elapsed().as_secs_f64()
        );
        let st = common::eventually("the mirror degraded", Duration::from_secs(30), || async {
            let i = raid::raid_info(DC).await.unwrap()?;
            i.is_degraded().then_some(i)
        })
        .await;
        println!(
            "degraded {:.2}s after the loss: {st:?}",
            lost.elapsed().as_secs_f64()
        );
        let now = states(&exp, &running).await;
        assert_ne!(now[0].state, ReplicaState::Online, "{now:?}");
        assert_eq!(now[1].state, ReplicaState::Online, "{now:?}");
        assert_eq!(io::read_at(&dev, 0, DATA).await.unwrap(), want);

        // The replacement replica r2 takes r0's slot: attached, added, rebuilt while the
        // host goes on writing; a second pass while it rebuilds adds nothing more.
        let mut replaced = running.clone();
        replaced.members[0] = AssemblyMember {
            volume: "pvc-mir-r2".into(),
            node: "node-3".into(),
            source: MemberSource::Remote { target: r2.clone() },
        };
        assert_eq!(exp.ensure_assembly(&replaced).await.unwrap(), t);
        let third = pattern(3, MIB as usize);
        io::write_at(&dev, 4 * MIB, third.clone()).await.unwrap();
        want[4 * MIB as usize..5 * MIB as usize].copy_from_slice(&third);
        exp.ensure_assembly(&replaced).await.unwrap();
        let rebuilt = common::eventually("r2 rebuilt", Duration::from_secs(120), || async {
            let st = states(&exp, &replaced).await;
            (st.iter().all(|s| s.state == ReplicaState::Online)).then_some(st)
        })
        .await;
        assert_eq!(
            words(&rebuilt),
            [
                ("pvc-mir-r2".to_string(), ReplicaState::Online),
                ("pvc-mir-r1".to_string(), ReplicaState::Online)
            ]
        );
        let r = raid::raid_info(DC).await.unwrap().unwrap();
        assert!(!r.is_degraded(), "{r:?}");
        println!(
            "replacement rebuilt {:.2}s after the loss",
            lost.elapsed().as_secs_f64()
        );

        // Both replicas hold what the host wrote, block for block, after the superblock.
        assert_eq!(io::read_at(&dev, 0, DATA).await.unwrap(), want);
        // Each slot has its own data offset (the local lvol's next cluster, the remote
        // namespace's 1 MiB).
        for (slot, n) in [(0, "r2"), (1, "r1")] {
            let off = r.bases[slot].data_offset_blocks * u64::from(r.block_size);
            assert!(off > 0, "{r:?}");
            let uuid = bdev::get(&lvol(n).full_name()).await.unwrap().unwrap().name;
            let got = io::read_at(&uuid, off, DATA).await.unwrap();
            assert!(
                got == want,
                "replica {n} differs from what the host wrote (data at {off})"
            );
            println!("replica {n}: {DATA} bytes at {off} equal the host's");
        }

        // Removed (the host first): nothing of the assembly is left; the replicas stay.
        initiator::detach("hostc").await.unwrap();
        let un = common::spdk::unassemble(&exp, DC, DC_UUID, t.clone(), 2).await;
        nothing_left().await;
        exp.remove_assembly(&un).await.unwrap();
        assert!(lvol::lvol("mlvs", "r1").await.unwrap().is_some());
    });
}
