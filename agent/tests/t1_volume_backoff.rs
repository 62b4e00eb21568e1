//! T1: a volume that keeps failing is retried with growing gaps (per-object exponential
//! back-off with jitter), and is provisioned promptly once its cause is fixed (space freed
//! on the pool), not only when its back-off runs out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use kube::Api;
use kube::api::DeleteParams;
use liteio_api::{AntstorVolume, StoragePool};

fn volume(name: &str, size: u64) -> AntstorVolume {
    scheduled_volume(
        name,
        &format!("5c1e2d3f-4a5b-4c6d-8e7f-{:0>12}", name.len()),
        size,
    )
}

/// Failed volume reconciles for lack of space, from the agent's metrics.
async fn no_space_failures(agent: &liteio_agent::agent::Agent) -> f64 {
    metric_value(
        &scrape(agent).await,
        "liteio_reconcile_errors_total",
        &[
            ("resource", "antstorvolume"),
            ("kind", "engine_no_space"),
            ("node", NODE),
        ],
    )
    .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_volume_backs_off_and_recovers_promptly() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let env = Env::new().await;
        // First retry after 100 ms, doubling up to 10 s.
        let agent = env
            .start_agent_with(
                std::sync::Arc::new(liteio_agent::exporter::NoExporter),
                |o| {
                    o.retry = Duration::from_millis(100);
                    o.retry_max = Duration::from_secs(10);
                },
            )
            .await;
        let api: Api<AntstorVolume> = ns_api(&env.client);
        let pools: Api<StoragePool> = ns_api(&env.client);
        eventually("pool", Duration::from_secs(5), || async {
            pools.get_opt(NODE).await.unwrap().map(|_| ())
        })
        .await;
        create(&api, &volume("filler", 700 * MIB)).await;
        volume_ready(&api, "filler", "filler ready", Duration::from_secs(5)).await;

        // 600 MiB do not fit beside the filler in the 1 GiB pool: every attempt fails.
        create(&api, &volume("big", 600 * MIB)).await;
        // Observe the failures until six were seen (every 100 ms this would take 0.6 s;
        // with back-off 0.1 + 0.2 + 0.4 + 0.8 + 1.6 ≈ 3 s).
        let mut seen: Vec<(f64, Instant)> = Vec::new();
        let started = Instant::now();
        loop {
            let n = no_space_failures(&agent).await;
            if seen.last().is_none_or(|(last, _)| n > *last) {
                seen.push((n, Instant::now()));
            }
            if n >= 6.0 {
                break;
            }
            if started.elapsed() > Duration::from_secs(20) {
                let v = api.get("big").await.unwrap();
                let text = scrape(&agent).await;
                let errs: Vec<&str> = text.lines().filter(|l| l.contains("errors")).collect();
                panic!("only {n} failures: {seen:?}\n{:?}\n{errs:#?}", v.status);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let took = started.elapsed();
        let gaps: Vec<Duration> = seen.windows(2).map(|w| w[1].1 - w[0].1).collect();
        assert!(
            took >= Duration::from_millis(2000),
            "six failures within {took:?}: no back-off ({gaps:?})"
        );
        // The last gaps double (±20 % jitter, 5 ms polling).
        let n = gaps.len();
        assert!(n >= 3, "{gaps:?}");
        assert!(
            gaps[n - 1] >= gaps[n - 2].mul_f64(1.25) && gaps[n - 2] >= gaps[n - 3].mul_f64(1.25),
            "gaps do not grow: {gaps:?}"
        );
        assert!(gaps[n - 1] >= Duration::from_millis(1000), "{gaps:?}");
        // Right after the sixth failure the next retry is ≥ 3.2 s · 0.8 away.

        // Fix the cause: free the space. The pool change reconciles `big` at once.
        let fixed = Instant::now();
        api.delete("filler", &DeleteParams::default())
            .await
            .unwrap();
        volume_ready(&api, "big", "big ready", Duration::from_secs(10)).await;
        let recovered = fixed.elapsed();
        assert!(
            recovered < Duration::from_millis(2000),
            "big was provisioned {recovered:?} after space was freed; it waited for its back-off"
        );
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .expect("timed out");
}
