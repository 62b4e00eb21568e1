//! Scheduler benchmark (issue 6): 5,000 pools and 100,000 existing volumes in the state, then
//! 10,000 new volumes placed one by one (each bound before the next, as the controller does).
//! Existing volumes are local to their pool; each new volume's consumer runs on some node.
//! Prints p50/p99/max per decision, the time to rebuild the state from the objects, and the
//! process's resident memory.
//!
//! `cargo run --release -p liteio-controller --example bench_scheduler [-- POOLS VOLUMES NEW]`

use std::sync::Arc;
use std::time::Instant;

use liteio_controller::config::SchedulerConfig;
use liteio_controller::scheduler::Scheduler;
use liteio_controller::state::{ObjectKey, State};
use liteio_controller::testing::{pool, volume};

const GIB: u64 = 1 << 30;

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

fn pct(sorted: &[u128], p: f64) -> u128 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(0)
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (n_pools, n_vols, n_new) = (
        args.first().copied().unwrap_or(5_000),
        args.get(1).copied().unwrap_or(100_000),
        args.get(2).copied().unwrap_or(10_000),
    );
    let cfg = SchedulerConfig::default();
    let rss0 = rss_mib();

    let pools: Vec<_> = (0..n_pools)
        .map(|i| pool(&format!("node-{i:05}"), 100 * 1024 * GIB).arc())
        .collect();
    let vols: Vec<_> = (0..n_vols)
        .map(|i| {
            Arc::new(
                volume(&format!("pvc-{i:06}"), 10 * GIB)
                    .scheduled_to(&format!("node-{:05}", i % n_pools))
                    .build(),
            )
        })
        .collect();

    let t = Instant::now();
    let mut state = State::new(&cfg);
    state.replace_pools(pools);
    state.replace_volumes(vols);
    let rebuild = t.elapsed();
    let rss_state = rss_mib();

    let scheduler = Scheduler::new(&cfg);
    let mut lat = Vec::with_capacity(n_new);
    let mut failed = 0usize;
    for i in 0..n_new {
        // The consumer runs on some node, as the CSI controller records from the topology.
        let host = format!("node-{:05}", (i * 7919) % n_pools);
        let v = Arc::new(volume(&format!("new-{i:06}"), 20 * GIB).host(&host).build());
        let key = ObjectKey::of(v.as_ref());
        state.upsert_volume(v.clone());
        let t = Instant::now();
        let placed = scheduler.schedule(&state, &v);
        lat.push(t.elapsed().as_nanos());
        match placed {
            Ok(p) => {
                if state.bind(&key, &p.node).is_err() {
                    failed += 1;
                }
            }
            Err(e) => {
                if failed == 0 {
                    eprintln!("first placement failure: {e}");
                }
                failed += 1;
            }
        }
    }
    lat.sort_unstable();
    let us = |ns: u128| ns as f64 / 1000.0;
    println!(
        "pools {n_pools}, existing volumes {n_vols}, new volumes {n_new} ({failed} not placed)"
    );
    println!(
        "state rebuild from {} objects: {:.1} ms",
        n_pools + n_vols,
        rebuild.as_secs_f64() * 1000.0
    );
    println!(
        "per decision: p50 {:.1} us, p99 {:.1} us, max {:.1} us",
        us(pct(&lat, 0.50)),
        us(pct(&lat, 0.99)),
        us(*lat.last().unwrap_or(&0))
    );
    println!(
        "resident memory: {rss0:.0} MiB at start, {rss_state:.0} MiB with the state built, {:.0} MiB at the end",
        rss_mib()
    );
}
