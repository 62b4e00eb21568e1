//! T3: volumes created and exported side by side, as a burst of new AntstorVolumes makes the
//! agent do: every lvol is created once with its own name, every export gets its own port of
//! the range, repeated exports keep their port, and everything is removed cleanly.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use liteio_agent::engine::spdk::{BaseBdev, SpdkLvsEngine};
use liteio_agent::engine::{PoolEngine, VolumeOptions};
use liteio_agent::exporter::{ExportRequest, Exporter, UnexportRequest};
use liteio_agent::spdk::exporter::SpdkExporter;
use liteio_agent::spdk::nvmf::{self, TcpTransportOptions};

const MIB: u64 = 1 << 20;
const N: usize = 24;
const HOST: &str = "nqn.2021-03.com.alipay.host:uuid:node-1";

fn uuid(i: usize) -> String {
    format!("5a0c3e1d-0000-4000-8000-{i:012}")
}

/// The export of the 4 MiB lvol `name` of lvstore `clvs`, volume `uuid(i)`, for [`HOST`].
fn request(name: &str, i: usize) -> ExportRequest {
    common::spdk::lvol_export(
        name,
        &uuid(i),
        common::spdk::lvol("clvs", name),
        4 * MIB,
        &[HOST],
    )
}

#[test]
fn a_burst_of_volumes_is_created_and_exported_side_by_side() {
    let engine = Arc::new(SpdkLvsEngine::new(
        "clvs",
        BaseBdev::Malloc {
            name: "cmalloc".into(),
            size: 256 * MIB,
        },
        1 << 20,
    ));
    let range = common::free_range(N as u16 + 8);
    let exp = Arc::new(SpdkExporter::new(
        "127.0.0.1",
        range.clone(),
        TcpTransportOptions::default(),
    ));
    common::with_spdk("t3-concurrent", false, Duration::from_secs(120), async {
        let e = Arc::clone(&engine);
        tokio::task::spawn_blocking(move || e.ensure_pool())
            .await
            .unwrap()
            .unwrap();
        // Creation and export of every volume at once, each on its own task.
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..N {
            let (engine, exp) = (Arc::clone(&engine), Arc::clone(&exp));
            tasks.spawn(async move {
                let name = format!("pvc-{i}");
                let n = name.clone();
                let info = tokio::task::spawn_blocking(move || {
                    engine.create_volume(&n, 4 * MIB, &VolumeOptions::default())
                })
                .await
                .unwrap()
                .unwrap();
                assert_eq!(info.size_bytes, 4 * MIB);
                let req = request(&name, i);
                let first = exp.ensure_export(&req).await.unwrap();
                // Reconciles repeat the export: same target, no new port.
                let again = exp.ensure_export(&req).await.unwrap();
                assert_eq!(first, again, "{name}: a repeated export changed the target");
                (i, first)
            });
        }
        let mut ports = HashSet::new();
        let mut done = 0;
        while let Some(r) = tasks.join_next().await {
            let (i, t) = r.unwrap();
            let port: u16 = t.svc_id.parse().unwrap();
            assert!(
                range.contains(&port),
                "pvc-{i}: port {port} outside {range:?}"
            );
            assert!(ports.insert(port), "pvc-{i}: port {port} handed out twice");
            done += 1;
        }
        assert_eq!(done, N);
        let subsystems = nvmf::subsystems().await.unwrap();
        assert_eq!(subsystems.len(), N, "one subsystem per volume");
        let volumes = engine.list_volumes().unwrap();
        assert_eq!(volumes.len(), N, "one lvol per volume: {volumes:?}");

        // Removal side by side too.
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..N {
            let (engine, exp) = (Arc::clone(&engine), Arc::clone(&exp));
            tasks.spawn(async move {
                exp.remove_export(&UnexportRequest {
                    volume: format!("pvc-{i}"),
                    uuid: uuid(i),
                    target: None,
                })
                .await
                .unwrap();
                tokio::task::spawn_blocking(move || engine.delete_volume(&format!("pvc-{i}")))
                    .await
                    .unwrap()
                    .unwrap();
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
        assert!(nvmf::subsystems().await.unwrap().is_empty());
        assert!(engine.list_volumes().unwrap().is_empty());

        // A range of 4 ports and 5 exports at once: 4 get distinct ports, the fifth is
        // refused with a message that says what to do, and leaves no subsystem.
        let small = common::free_range(3);
        let exp = Arc::new(SpdkExporter::new(
            "127.0.0.1",
            small.clone(),
            TcpTransportOptions::default(),
        ));
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..5 {
            let (engine, exp) = (Arc::clone(&engine), Arc::clone(&exp));
            tasks.spawn(async move {
                let name = format!("few-{i}");
                let n = name.clone();
                tokio::task::spawn_blocking(move || {
                    engine.create_volume(&n, 4 * MIB, &VolumeOptions::default())
                })
                .await
                .unwrap()
                .unwrap();
                (i, exp.ensure_export(&request(&name, 100 + i)).await)
            });
        }
        let (mut ports, mut refused) = (HashSet::new(), Vec::new());
        while let Some(r) = tasks.join_next().await {
            match r.unwrap() {
                (_, Ok(t)) => {
                    let port: u16 = t.svc_id.parse().unwrap();
                    assert!(small.contains(&port), "port {port} outside {small:?}");
                    assert!(ports.insert(port), "port {port} handed out twice");
                }
                (i, Err(e)) => refused.push((i, e.to_string())),
            }
        }
        assert_eq!(ports.len(), 4, "every port of the range used once");
        assert_eq!(refused.len(), 1, "exactly one export refused: {refused:?}");
        assert!(
            refused[0].1.contains("widen the listen port range"),
            "{refused:?}"
        );
        assert_eq!(nvmf::subsystems().await.unwrap().len(), 4);
    });
}
