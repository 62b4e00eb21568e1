//! T3: `/metrics` of the agent on the embedded SPDK engine: writes through the NVMe/TCP
//! export of a volume grow its `liteio_volume_*` counters, the SPDK runtime reports its threads'
//! busy/idle time and its reactors' CPU time, `promtool check metrics` has nothing to say
//! about any of it, the volume's QoS limit is reported and a load held back by it counts as
//! time at the limit, and a deleted volume's series disappear.
//!
//! SPDK 26.05's NVMe/TCP initiator refuses interrupt mode, so SPDK polls here (one core, a
//! few seconds), which is also the mode in which SPDK's own busy/idle accounting advances.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{
    HOST_B, MIB, NODE, consumer_pool, create_exported, delete_and_release, eventually, io_series,
    metric_value, remote_volume, scrape, start_spdk_agent, volume_io, with_spdk,
};
use kube::Api;
use liteio_agent::spdk::stats::RuntimeSource;
use liteio_agent::spdk::{bdev, initiator, io};
use liteio_api::qos::VolumeQos;
use liteio_api::{AntstorVolume, keys};

const UUID: &str = "7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";

#[test]
fn lvol_io_and_reactor_metrics() {
    with_spdk("t3-metrics", true, Duration::from_secs(120), scenario());
}

async fn scenario() {
    let (_server, client, dir) = common::test_cluster("warn").await;
    let agent = start_spdk_agent(&client, dir.path()).await;
    agent.ctx().metrics.add_source(Arc::new(RuntimeSource));

    // The consuming host publishes its NQN on its own pool object.
    consumer_pool(&client).await;

    let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    // Limited to 1,000 I/O per second.
    let mut v = remote_volume("pvc-m", UUID, 16 * MIB);
    v.spec.qos = Some(VolumeQos {
        iops: 1000,
        ..Default::default()
    });
    let v = create_exported(&client, &v, Duration::from_secs(10)).await;
    let t = v.spec.spdk_target.clone().unwrap();

    let lv = [
        ("node", NODE),
        ("volume", "pvc-m"),
        ("uuid", UUID),
        ("lvol", "lvs0/pvc-m"),
    ];
    let before = io_series(&agent, &lv, "I/O series of the volume").await;

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
            let (w, b, r) = volume_io(&text, &lv)?;
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
        metric_value(&text, "liteio_volume_write_time_seconds_total", &lv).is_some_and(|v| v > 0.0),
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
    // Prometheus' linter on everything an agent with SPDK serves.
    match liteio_tests::promtool::check_metrics(&text) {
        Ok(said) => assert_eq!(said, "", "promtool check metrics:\n{said}\n{text}"),
        Err(why) => println!("SKIP promtool check metrics: {why}"),
    }

    // The limit in force, and a load past it (16 writers of 4 KiB for 3 s) held back by it:
    // the sampler counts the seconds at the limit.
    let vq = [("node", NODE), ("volume", "pvc-m"), ("uuid", UUID)];
    assert_eq!(
        metric_value(&text, "liteio_volume_qos_iops_limit", &vq),
        Some(1000.0),
        "{text}"
    );
    let held_before =
        metric_value(&text, "liteio_volume_qos_limited_seconds_total", &vq).unwrap_or(0.0);
    let iops = load("m0n1", 16, Duration::from_secs(3)).await;
    println!("16 writers against a limit of 1000 IOPS: {iops:.0} IOPS");
    assert!(
        (950.0..=1050.0).contains(&iops),
        "the load ran {iops:.0} IOPS against a limit of 1000"
    );
    let held = eventually(
        "time at the limit counted",
        Duration::from_secs(5),
        || async {
            let text = scrape(&agent).await;
            let held = metric_value(&text, "liteio_volume_qos_limited_seconds_total", &vq)?;
            (held >= held_before + 1.5).then_some(held)
        },
    )
    .await;
    println!("liteio_volume_qos_limited_seconds_total: {held_before:.1} -> {held:.1}");

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

/// 4 KiB writes from `writers` writers to `bdev` for `secs`; returns the writes per second.
async fn load(bdev: &str, writers: u64, secs: Duration) -> f64 {
    let start = std::time::Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let bdev = bdev.to_string();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while start.elapsed() < secs {
                let off = MIB + ((w * 61 + n) % 1024) * 4096;
                io::write_at(&bdev, off, vec![0x5a; 4096]).await.unwrap();
                n += 1;
            }
            n
        }));
    }
    let mut n = 0;
    for t in tasks {
        n += t.await.unwrap();
    }
    n as f64 / start.elapsed().as_secs_f64()
}
