//! T3: the SPDK exporter (the agent's `Exporter` over the embedded target): LiteIO's NQN and
//! serial scheme, ports from the range, host allow-lists changed live, aio export of a file
//! volume, idempotency, removal.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::spdk::{H1, H2, beside_spdk, file_export, lvol, lvol_export, small};
use liteio_agent::exporter::{ExportRequest, Exporter, ExporterHealth, PathState, UnexportRequest};
use liteio_agent::spdk::exporter::SpdkExporter;
use liteio_agent::spdk::nvmf::{self, AnaState, TcpTransportOptions};
use liteio_agent::spdk::{bdev, gate, io, lvol};
use liteio_api::qos::VolumeQos;
use liteio_api::{SpdkTarget, naming};

const MIB: u64 = 1 << 20;

#[test]
fn exports_follow_liteio_naming_ports_and_allow_lists() {
    beside_spdk(&small("t3-exporter"), Duration::from_secs(60), async {
        let range = common::free_range(3);
        let exp = SpdkExporter::new("127.0.0.1", range.clone(), TcpTransportOptions::default());
        assert!(
            matches!(exp.health().await.unwrap(), ExporterHealth::Ok { version } if version.starts_with("v26.05"))
        );

        bdev::create_malloc("xm", 64 * MIB, 512).await.unwrap();
        lvol::create_lvstore("xm", "xlvs", 1 << 20).await.unwrap();
        let lv = lvol::create_lvol("xlvs", "pvc-1", 8 * MIB, false, lvol::Clear::WriteZeroes)
            .await
            .unwrap();
        let uuid = "0b9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a11";
        let mut req = lvol_export("pvc-1", uuid, lvol("xlvs", "pvc-1"), 8 * MIB, &[H1]);
        let t = exp.ensure_export(&req).await.unwrap();
        assert_eq!(t.subsys_nqn, naming::subsys_nqn(uuid));
        assert_eq!(t.sn, naming::serial_number(uuid));
        assert_eq!(t.ns_uuid, uuid);
        assert_eq!(
            (
                t.trans_type.as_str(),
                t.addr_fam.as_str(),
                t.address.as_str()
            ),
            ("TCP", "IPv4", "127.0.0.1")
        );
        // Exported through the lvol's gate.
        assert_eq!(t.bdev_name, gate::gate_name(&lv.bdev_name));
        assert_eq!(
            bdev::get(&t.bdev_name).await.unwrap().unwrap().product,
            gate::GATE_PRODUCT
        );
        assert_eq!(
            gate::gate_of("xlvs/pvc-1").await.unwrap(),
            Some(t.bdev_name.clone())
        );
        // The gated lvol still grows (the gate follows, and the export with it) and
        // takes snapshots.
        lvol::resize_lvol("xlvs", "pvc-1", 12 * MIB).await.unwrap();
        exp.resize_export(&ExportRequest {
            size_bytes: 12 * MIB,
            ..req.clone()
        })
        .await
        .unwrap();
        assert_eq!(
            bdev::get(&t.bdev_name).await.unwrap().unwrap().size_bytes(),
            12 * MIB
        );
        let snap = lvol::snapshot("xlvs", "pvc-1", "pvc-1_snap").await.unwrap();
        assert!(snap.snapshot);
        // (The target holds the gate's write claim; reads go through.)
        assert_eq!(
            io::read_at(&t.bdev_name, 8 * MIB, 4096).await.unwrap(),
            vec![0; 4096],
            "the gate serves after the snapshot"
        );
        let port: u16 = t.svc_id.parse().unwrap();
        assert!(range.contains(&port));
        // What readiness after a restart waits for: the recorded target listens; one on
        // another port, or of a subsystem that does not exist, does not.
        assert!(exp.is_listening(&t).await.unwrap());
        let elsewhere = SpdkTarget {
            svc_id: (port + 1).to_string(),
            ..t.clone()
        };
        assert!(!exp.is_listening(&elsewhere).await.unwrap());
        let gone = SpdkTarget {
            subsys_nqn: naming::subsys_nqn("00000000-0000-4000-8000-00000000dead"),
            ..t.clone()
        };
        assert!(!exp.is_listening(&gone).await.unwrap());

        // QoS limits go on the exported bdev (the gate), follow the request live, and
        // are lifted by an unlimited request.
        assert!(exp.enforces_qos());
        assert_eq!(
            bdev::qos_limits(&t.bdev_name).await.unwrap(),
            bdev::QosLimits::default()
        );
        let limited = ExportRequest {
            qos: VolumeQos {
                iops: 3000,
                write_mbps: 20,
                ..Default::default()
            },
            preset: Some(t.clone()),
            ..req.clone()
        };
        assert_eq!(exp.ensure_export(&limited).await.unwrap(), t);
        let want = bdev::QosLimits {
            rw_iops: 3000,
            write_mibps: 20,
            ..Default::default()
        };
        assert_eq!(bdev::qos_limits(&t.bdev_name).await.unwrap(), want);
        let raised = ExportRequest {
            qos: VolumeQos {
                iops: 6000,
                ..Default::default()
            },
            ..limited.clone()
        };
        exp.ensure_export(&raised).await.unwrap();
        assert_eq!(
            bdev::qos_limits(&t.bdev_name).await.unwrap(),
            bdev::QosLimits {
                rw_iops: 6000,
                ..Default::default()
            }
        );
        exp.ensure_export(&ExportRequest {
            qos: VolumeQos::default(),
            ..limited.clone()
        })
        .await
        .unwrap();
        assert_eq!(
            bdev::qos_limits(&t.bdev_name).await.unwrap(),
            bdev::QosLimits::default()
        );

        // Idempotent, same port; the allow-list follows the request live.
        req.allowed_hosts = vec![H2.into()];
        req.preset = Some(t.clone());
        assert_eq!(exp.ensure_export(&req).await.unwrap(), t);
        let ss = nvmf::subsystems().await.unwrap();
        assert_eq!(ss[0].hosts, vec![H2.to_string()]);
        // Every export can be one path of a hot migration: ANA reporting on, controller
        // IDs from the node's slot.
        assert!(ss[0].ana_reporting);
        assert_eq!(ss[0].cntlid_range, naming::cntlid_range("127.0.0.1"));
        // A live export is promoted by a request, never demoted by one: the source of a
        // migration is demoted by the migration's switch-over alone (after the
        // destination's promotion reached the hosts), not by the pass that sees the
        // commit annotation first.
        let state = || nvmf::ana_state(&t.subsys_nqn, "127.0.0.1", port, 1);
        let inaccessible = ExportRequest {
            path_state: PathState::Inaccessible,
            ..req.clone()
        };
        exp.ensure_export(&inaccessible).await.unwrap();
        assert_eq!(
            state().await.unwrap(),
            AnaState::Optimized,
            "a request demoted a live export"
        );
        let mig = exp.migrator().unwrap();
        mig.set_path_state(&t.subsys_nqn, "127.0.0.1", port, PathState::Inaccessible)
            .await
            .unwrap();
        assert_eq!(state().await.unwrap(), AnaState::Inaccessible);
        exp.ensure_export(&inaccessible).await.unwrap();
        assert_eq!(state().await.unwrap(), AnaState::Inaccessible);
        exp.ensure_export(&req).await.unwrap();
        assert_eq!(
            state().await.unwrap(),
            AnaState::Optimized,
            "a request did not promote"
        );

        // A migration destination: a host listener (inaccessible until the switch-over)
        // and the pipe's (always optimized). Before its first export is recorded, a pass
        // must still tell the two apart (SPDK lists the newer listener first).
        lvol::create_lvol("xlvs", "pvc-3", 4 * MIB, false, lvol::Clear::WriteZeroes)
            .await
            .unwrap();
        let dest = ExportRequest {
            volume: "pvc-3".into(),
            uuid: "4c2a9e1b-7d3f-4a5e-8b6c-1f0e2d3c4b5a".into(),
            lvol: Some(lvol("xlvs", "pvc-3")),
            size_bytes: 4 * MIB,
            path_state: PathState::Inaccessible,
            preset: None,
            ..req.clone()
        };
        let d = exp.ensure_export(&dest).await.unwrap();
        let pipe = exp.ensure_pipe(&dest, true).await.unwrap().unwrap();
        assert_ne!(d.svc_id, pipe.to_string());
        let again = exp.ensure_export(&dest).await.unwrap();
        assert_eq!(
            again.svc_id, d.svc_id,
            "the pipe's listener taken for the host's"
        );
        assert_eq!(exp.ensure_pipe(&dest, true).await.unwrap(), Some(pipe));
        let dport: u16 = d.svc_id.parse().unwrap();
        assert_eq!(
            nvmf::ana_state(&d.subsys_nqn, "127.0.0.1", dport, 1)
                .await
                .unwrap(),
            AnaState::Inaccessible
        );
        assert_eq!(
            nvmf::ana_state(&d.subsys_nqn, "127.0.0.1", pipe, 1)
                .await
                .unwrap(),
            AnaState::Optimized
        );
        // The pipe goes (the migration finished) and comes back on another port: its old
        // port is the last of the range to be handed out again.
        assert_eq!(exp.ensure_pipe(&dest, false).await.unwrap(), None);
        let listeners = nvmf::find_subsystem(&d.subsys_nqn)
            .await
            .unwrap()
            .unwrap()
            .listeners;
        assert_eq!(
            listeners,
            vec![("127.0.0.1".to_string(), dport)],
            "only the host listener is left"
        );
        let pipe2 = exp.ensure_pipe(&dest, true).await.unwrap().unwrap();
        assert!(range.contains(&pipe2) && pipe2 != pipe && pipe2 != dport && pipe2 != port);
        assert_eq!(exp.ensure_export(&dest).await.unwrap().svc_id, d.svc_id);
        // An exporter that finds the target serving already (in the agent, the target
        // starts with it; here, a second exporter over the same target) takes the ports
        // over from SPDK's listeners: the host's stays the host's, and none of them is
        // handed to a new volume.
        let exp2 = SpdkExporter::new("127.0.0.1", range.clone(), TcpTransportOptions::default());
        assert_eq!(
            exp2.ensure_export(&dest).await.unwrap().svc_id,
            d.svc_id,
            "the pipe's listener taken for the host's"
        );
        assert_eq!(exp2.ensure_pipe(&dest, true).await.unwrap(), Some(pipe2));
        lvol::create_lvol("xlvs", "pvc-4", 4 * MIB, false, lvol::Clear::WriteZeroes)
            .await
            .unwrap();
        let other = ExportRequest {
            volume: "pvc-4".into(),
            uuid: "9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b".into(),
            lvol: Some(lvol("xlvs", "pvc-4")),
            preset: None,
            ..req.clone()
        };
        let o = exp2.ensure_export(&other).await.unwrap();
        let oport: u16 = o.svc_id.parse().unwrap();
        assert!(
            ![port, dport, pipe2].contains(&oport),
            "port {oport} of a served subsystem handed out again"
        );
        exp2.remove_export(&UnexportRequest {
            volume: "pvc-4".into(),
            uuid: other.uuid.clone(),
            target: Some(o),
        })
        .await
        .unwrap();
        exp.remove_export(&UnexportRequest {
            volume: "pvc-3".into(),
            uuid: dest.uuid.clone(),
            target: Some(again.clone()),
        })
        .await
        .unwrap();
        assert!(
            !exp.is_listening(&again).await.unwrap(),
            "removed: not listening"
        );

        // An LVM / file volume is exported through an aio bdev named after its serial, on
        // another port of the range.
        let dir = std::env::temp_dir().join(format!("liteio-t3-exp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pvc-2.img");
        std::fs::File::create(&file)
            .unwrap()
            .set_len(16 * MIB)
            .unwrap();
        let uuid2 = "7d1e0f2a-3b4c-4d5e-8f6a-7b8c9d0e1f2a";
        let req2 = file_export("pvc-2", uuid2, file.clone(), 16 * MIB, &[H1]);
        let t2 = exp.ensure_export(&req2).await.unwrap();
        assert_eq!(t2.bdev_name, naming::aio_bdev_name(uuid2));
        assert_ne!(t2.svc_id, t.svc_id, "one port per volume");
        // The file grew: a resize makes the export see it.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(32 * MIB)
            .unwrap();
        exp.resize_export(&ExportRequest {
            size_bytes: 32 * MIB,
            ..req2.clone()
        })
        .await
        .unwrap();
        assert_eq!(
            bdev::get(&t2.bdev_name)
                .await
                .unwrap()
                .unwrap()
                .size_bytes(),
            32 * MIB
        );

        // A request with nothing to export is refused clearly.
        let bad = ExportRequest {
            device: None,
            lvol: None,
            ..req2.clone()
        };
        assert!(
            exp.ensure_export(&bad)
                .await
                .unwrap_err()
                .to_string()
                .contains("neither an lvol nor a device")
        );

        // Removal is idempotent and takes the aio bdev with it.
        let un2 = UnexportRequest {
            volume: "pvc-2".into(),
            uuid: uuid2.into(),
            target: Some(t2.clone()),
        };
        exp.remove_export(&un2).await.unwrap();
        exp.remove_export(&un2).await.unwrap();
        assert!(bdev::get(&t2.bdev_name).await.unwrap().is_none());
        exp.remove_export(&UnexportRequest {
            volume: "pvc-1".into(),
            uuid: uuid.into(),
            target: None,
        })
        .await
        .unwrap();
        assert!(nvmf::subsystems().await.unwrap().is_empty());
        assert!(
            lvol::lvol("xlvs", "pvc-1").await.unwrap().is_some(),
            "unexport keeps the data"
        );
        assert!(
            bdev::get(&t.bdev_name).await.unwrap().is_none(),
            "unexport removes the gate"
        );
        let _ = std::fs::remove_dir_all(dir);
    });
}
