//! T3: SPDK's bdev rate limits, set and changed live under a load heavier than the limit
//! (no hugepages, interrupt mode): the limit holds within ±5 % over 10 s, raising it lifts
//! the rate, lifting it restores the unlimited rate; a bandwidth limit holds too; bad
//! limits are refused, not rounded.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use liteio_agent::spdk::bdev::{self, QosLimits};
use liteio_agent::spdk::{ErrorKind, io};

const MIB: u64 = 1 << 20;

fn run<F: std::future::Future<Output = ()>>(f: F) {
    common::with_spdk("t3-qos", false, Duration::from_secs(120), f);
}

/// Writes of `size` bytes from `depth` writers for `secs`: (I/O per second, MiB per second).
async fn load(bdev: &str, size: usize, depth: usize, secs: f64) -> (f64, f64) {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for w in 0..depth {
        let (done, bdev) = (Arc::clone(&done), bdev.to_string());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < until {
                let off = ((w as u64 * 7919 + i) % 256) * size as u64;
                io::write_at(&bdev, off, vec![0xa5; size]).await.unwrap();
                done.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let n = done.load(Ordering::Relaxed) as f64;
    let s = start.elapsed().as_secs_f64();
    (n / s, n * size as f64 / MIB as f64 / s)
}

fn within(what: &str, got: f64, want: f64, tolerance: f64) {
    let off = (got - want).abs() / want;
    assert!(
        off <= tolerance,
        "{what}: {got:.0} against a limit of {want:.0} ({:.1} % off, at most {:.0} % allowed)",
        off * 100.0,
        tolerance * 100.0
    );
}

#[test]
fn limits_hold_change_live_and_lift() {
    run(async {
        bdev::create_null("qos0", 256 * MIB, 4096).await.unwrap();
        // A consumer that keeps its channel, as the NVMe-oF target's poll group does: SPDK
        // binds a bdev's QoS to a channel, and one opened and closed per I/O would start a
        // fresh quota with every I/O (the limit then does not hold at a low queue depth).
        let held = io::hold_channel("qos0").await.unwrap();
        let (free, _) = load("qos0", 4096, 32, 2.0).await;
        println!("unlimited: {free:.0} IOPS");
        // The limit must be well below what the load reaches, or it proves nothing.
        let limit = ((free / 4.0 / 1000.0).floor() as u64 * 1000).clamp(1000, 20_000);
        assert!(
            free > 2.0 * limit as f64,
            "the load ({free:.0} IOPS) is not heavier than the limit ({limit})"
        );

        let l = QosLimits {
            rw_iops: limit,
            ..Default::default()
        };
        bdev::set_qos_limits("qos0", l).await.unwrap();
        assert_eq!(bdev::qos_limits("qos0").await.unwrap(), l);
        // Never above the limit at a low queue depth either (where each I/O finds the
        // quota of a new timeslice).
        for depth in [1, 4] {
            let (got, _) = load("qos0", 4096, depth, 2.0).await;
            println!("limited to {limit}, {depth} writers: {got:.0} IOPS");
            assert!(
                got <= limit as f64 * 1.05,
                "{depth} writers ran {got:.0} IOPS past a limit of {limit}"
            );
        }
        let (got, _) = load("qos0", 4096, 32, 10.0).await;
        println!("limited to {limit}: {got:.0} IOPS over 10 s");
        within("IOPS under the limit", got, limit as f64, 0.05);

        // Raised live: the rate follows.
        let raised = QosLimits {
            rw_iops: 2 * limit,
            ..Default::default()
        };
        bdev::set_qos_limits("qos0", raised).await.unwrap();
        let (got, _) = load("qos0", 4096, 32, 3.0).await;
        println!("raised to {}: {got:.0} IOPS", 2 * limit);
        within("IOPS under the raised limit", got, (2 * limit) as f64, 0.05);

        // Lifted: back to the unlimited rate (this machine's rate varies: half of it at least,
        // and well above the raised limit).
        bdev::set_qos_limits("qos0", QosLimits::default())
            .await
            .unwrap();
        assert_eq!(
            bdev::qos_limits("qos0").await.unwrap(),
            QosLimits::default()
        );
        let (got, _) = load("qos0", 4096, 32, 2.0).await;
        println!("lifted: {got:.0} IOPS");
        assert!(
            got > free * 0.5 && got > 3.0 * limit as f64,
            "lifting the limit did not restore the rate: {got:.0} IOPS (unlimited {free:.0})"
        );

        // Bandwidth: writes of 64 KiB limited to 20 MiB/s.
        let bw = QosLimits {
            write_mibps: 20,
            ..Default::default()
        };
        bdev::set_qos_limits("qos0", bw).await.unwrap();
        let (_, mibps) = load("qos0", 64 << 10, 16, 5.0).await;
        println!("write limit 20 MiB/s: {mibps:.1} MiB/s");
        within("write MiB/s under the limit", mibps, 20.0, 0.05);
        bdev::set_qos_limits("qos0", QosLimits::default())
            .await
            .unwrap();

        // Refused, not rounded; a missing bdev is NotFound.
        let e = bdev::set_qos_limits(
            "qos0",
            QosLimits {
                rw_iops: 1500,
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains("multiple of 1000"), "{e}");
        assert_eq!(
            bdev::qos_limits("qos0").await.unwrap(),
            QosLimits::default()
        );
        let e = bdev::set_qos_limits("no-such-bdev", l).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        drop(held);
        bdev::delete_null("qos0").await.unwrap();
    });
}
