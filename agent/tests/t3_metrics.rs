//! T3: `/metrics` of the agent on the embedded SPDK engine: writes through the NVMe/TCP
//! export of a volume grow its `spdk_lvol_*` counters, the SPDK runtime reports its threads'
//! busy/idle time and its reactors' CPU time, and a deleted volume's series disappear.
//!
//! SPDK 26.05's NVMe/TCP initiator refuses interrupt mode, so SPDK polls here (one core, a
//! few seconds), which is also the mode in which SPDK's own busy/idle accounting advances.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{
    HOST_B, MIB, NODE, consumer_pool, create_exported, delete_and_release, eventually,
    metric_value, remote_volume, scrape, start_spdk_agent, with_spdk,
};
use kube::Api;
use liteio_agent::spdk::stats::RuntimeSource;
use liteio_agent::spdk::{bdev, initiator, io};
use liteio_api::{AntstorVolume, keys};

const UUID: &str = "7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";

#[test]
fn lvol_io_and_reactor_metrics() {
    with_spdk("t3-metrics", true, Duration::from_secs(90), scenario());
}

async fn scenario() {
    let (_server, client, dir) = common::test_cluster("warn").await;
    let agent = start_spdk_agent(&client, dir.path()).await;
    agent.ctx().metrics.add_source(Arc::new(RuntimeSource));

    // The consuming host publishes its NQN on its own pool object.
    consumer_pool(&client).await;

    let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let v = create_exported(
        &client,
        &remote_volume("pvc-m", UUID, 16 * MIB),
        Duration::from_secs(10),
    )
    .await;
    let t = v.spec.spdk_target.clone().unwrap();

    let lv = [
        ("node", NODE),
        ("volume", "pvc-m"),
        ("uuid", UUID),
        ("lvol", "lvs0/pvc-m"),
    ];
    let before = eventually(
        "spdk_lvol_* series of the volume",
        Duration::from_secs(5),
        || async {
            let text = scrape(&agent).await;
            Some((
                metric_value(&text, "spdk_lvol_write_reqs_total", &lv)?,
                metric_value(&text, "spdk_lvol_write_bytes_total", &lv)?,
                metric_value(&text, "spdk_lvol_read_reqs_total", &lv)?,
            ))
        },
    )
    .await;

    // 256 KiB written and read back through the export, by SPDK's NVMe/TCP initiator.
    let names = initiator::attach_tcp(
        "m0",
        "127.0.0.1",
        t.svc_id.parse().unwrap(),
        &t.subsys_nqn,
        HOST_B,
    )
    .await
    .unwrap();
    assert_eq!(names, vec!["m0n1".to_string()]);
    let data: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
    for chunk in 0..4u64 {
        let off = chunk * 64 * 1024;
        let part = data[off as usize..off as usize + 64 * 1024].to_vec();
        io::write_at("m0n1", MIB + off, part).await.unwrap();
    }
    assert_eq!(io::read_at("m0n1", MIB, data.len()).await.unwrap(), data);

    let text = eventually(
        "the lvol's write counters to grow",
        Duration::from_secs(5),
        || async {
            let text = scrape(&agent).await;
            let w = metric_value(&text, "spdk_lvol_write_reqs_total", &lv)?;
            let b = metric_value(&text, "spdk_lvol_write_bytes_total", &lv)?;
            let r = metric_value(&text, "spdk_lvol_read_reqs_total", &lv)?;
            (w >= before.0 + 4.0 && b >= before.1 + (256 * 1024) as f64 && r > before.2)
                .then_some(text)
        },
    )
    .await;
    for l in text.lines().filter(|l| {
        l.contains("pvc-m") || l.contains("liteio_spdk_") || l.contains("heartbeat_age")
    }) {
        println!("{l}");
    }
    assert!(
        metric_value(&text, "spdk_lvol_write_lat_microseconds", &lv).is_some_and(|v| v > 0.0),
        "{text}"
    );

    // Reactor utilisation: the reactor thread's CPU time and SPDK's own accounting, which
    // advances in poll mode.
    let cpu = metric_value(
        &text,
        "liteio_spdk_reactor_cpu_seconds_total",
        &[("node", NODE), ("reactor", "reactor_0")],
    );
    assert!(cpu.is_some_and(|c| c > 0.0), "reactor CPU {cpu:?}: {text}");
    let app = [("node", NODE), ("thread", "app_thread")];
    let busy = metric_value(&text, "liteio_spdk_thread_busy_seconds_total", &app).unwrap();
    let idle = metric_value(&text, "liteio_spdk_thread_idle_seconds_total", &app).unwrap();
    assert!(busy > 0.0 && idle > 0.0, "busy {busy} idle {idle}");
    let age = metric_value(&text, "liteio_heartbeat_age_seconds", &[("node", NODE)]).unwrap();
    assert!((0.0..5.0).contains(&age), "heartbeat age {age}");

    initiator::detach("m0").await.unwrap();
    eventually(
        "the initiator's bdev to go",
        Duration::from_secs(10),
        || async { bdev::get("m0n1").await.unwrap().is_none().then_some(()) },
    )
    .await;
    delete_and_release(&vols, "pvc-m", Duration::from_secs(10)).await;
    let text = scrape(&agent).await;
    assert!(!text.contains("pvc-m"), "{text}");
    assert!(text.contains("liteio_spdk_reactor_cpu_seconds_total"));
    // Fault counters of the SPDK runtime (no fault in this test).
    assert!(
        text.contains("liteio_spdk_request_timeouts_total"),
        "{text}"
    );
    assert!(text.contains("liteio_spdk_caught_panics_total"), "{text}");
    agent.shutdown(Duration::from_secs(5)).await;
}
