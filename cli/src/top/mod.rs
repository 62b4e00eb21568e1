//! `kubectl liteio top`: the busiest volumes and the pools, from the disk-agents' `/metrics`.
//!
//! Each refresh scrapes every agent once; a volume's rates are the difference of its
//! counters between two scrapes of its agent divided by the time between them (a counter
//! that went down, as after an agent restart, counts from zero, as Prometheus' `rate()`
//! does). What is read (docs/metrics.md):
//!
//! - per volume: `liteio_volume_{reads,writes}_completed_total` (IOPS),
//!   `liteio_volume_{read,written}_bytes_total` (MiB/s),
//!   `liteio_volume_{read,write}_time_seconds_total` (mean latency: time over requests),
//!   `liteio_volume_size_bytes`;
//! - per pool: `liteio_pool_capacity_bytes`, `liteio_pool_free_bytes`, `liteio_pool_volumes`.
//!
//! Where the agents are: every StoragePool's node address (`spec.nodeInfo.ip`, which the
//! agent reports) at `--metrics-port` (the agents' `metrics.listenAddress` port, 9810 in
//! deploy/), or the `--metrics-url`s given. This module computes and lays out the frames
//! without I/O; [`http`] fetches and [`screen`] draws them.

pub mod http;
pub mod screen;
pub mod text;

use std::collections::BTreeMap;

use liteio_api::size::format_bytes;
use serde::Serialize;

use crate::table::Table;
use crate::view::NONE;
use text::Sample;

/// What one scrape of one agent gave.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentReading {
    /// The URL scraped.
    pub url: String,
    /// When the answer came, in seconds on a monotonic clock.
    pub at: f64,
    /// Counters of each volume by `(node, volume)`.
    pub volumes: BTreeMap<(String, String), VolumeCounters>,
    /// Gauges of each pool by node.
    pub pools: BTreeMap<String, PoolGauges>,
}

/// A volume's counters as one scrape read them (summed over its series).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct VolumeCounters {
    /// Reads completed.
    pub reads: f64,
    /// Writes completed.
    pub writes: f64,
    /// Bytes read.
    pub read_bytes: f64,
    /// Bytes written.
    pub written_bytes: f64,
    /// Seconds spent on reads.
    pub read_seconds: f64,
    /// Seconds spent on writes.
    pub write_seconds: f64,
    /// Allocated size, when the agent reports it.
    pub size_bytes: Option<f64>,
}

/// A pool's gauges as one scrape read them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PoolGauges {
    /// Capacity in bytes.
    pub capacity_bytes: f64,
    /// Free bytes.
    pub free_bytes: f64,
    /// Volumes provisioned in the pool.
    pub volumes: f64,
}

impl AgentReading {
    /// The reading of `samples` scraped from `url` at `at`.
    pub fn new(url: &str, at: f64, samples: &[Sample]) -> Self {
        let mut volumes: BTreeMap<(String, String), VolumeCounters> = BTreeMap::new();
        let mut pools: BTreeMap<String, PoolGauges> = BTreeMap::new();
        for s in samples {
            let node = s.label("node").to_string();
            if let Some(field) = s.name.strip_prefix("liteio_volume_") {
                let v = volumes
                    .entry((node, s.label("volume").to_string()))
                    .or_default();
                match field {
                    "reads_completed_total" => v.reads += s.value,
                    "writes_completed_total" => v.writes += s.value,
                    "read_bytes_total" => v.read_bytes += s.value,
                    "written_bytes_total" => v.written_bytes += s.value,
                    "read_time_seconds_total" => v.read_seconds += s.value,
                    "write_time_seconds_total" => v.write_seconds += s.value,
                    "size_bytes" => v.size_bytes = Some(s.value),
                    _ => {}
                }
            } else if let Some(field) = s.name.strip_prefix("liteio_pool_") {
                let p = pools.entry(node).or_default();
                match field {
                    "capacity_bytes" => p.capacity_bytes = s.value,
                    "free_bytes" => p.free_bytes = s.value,
                    "volumes" => p.volumes = s.value,
                    _ => {}
                }
            }
        }
        // Series of other families under the same prefixes (QoS limits) made no volume.
        volumes.retain(|(_, name), _| !name.is_empty());
        Self {
            url: url.to_string(),
            at,
            volumes,
            pools,
        }
    }
}

/// One volume's line of a frame.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeRate {
    /// The volume (AntstorVolume / PV name).
    pub volume: String,
    /// The node that stores it.
    pub node: String,
    /// Reads per second (`None` on the first scrape).
    pub read_iops: Option<f64>,
    /// Writes per second.
    pub write_iops: Option<f64>,
    /// Bytes read per second.
    pub read_bytes_per_second: Option<f64>,
    /// Bytes written per second.
    pub write_bytes_per_second: Option<f64>,
    /// Mean time of a request (reads and writes) in seconds, over the interval; `None`
    /// without requests.
    pub latency_seconds: Option<f64>,
    /// Allocated size.
    pub size_bytes: Option<u64>,
}

impl VolumeRate {
    /// Reads and writes per second.
    pub fn iops(&self) -> Option<f64> {
        Some(self.read_iops? + self.write_iops?)
    }

    /// Bytes read and written per second.
    pub fn bytes_per_second(&self) -> Option<f64> {
        Some(self.read_bytes_per_second? + self.write_bytes_per_second?)
    }
}

/// One pool's line of a frame.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRate {
    /// The pool (= node) name.
    pub node: String,
    /// Capacity.
    pub capacity_bytes: u64,
    /// Free space.
    pub free_bytes: u64,
    /// Volumes in the pool.
    pub volumes: u64,
    /// I/O per second of its volumes together (`None` on the first scrape).
    pub iops: Option<f64>,
    /// Bytes per second of its volumes together.
    pub bytes_per_second: Option<f64>,
}

/// An agent that did not answer, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unreachable {
    /// The URL.
    pub url: String,
    /// What went wrong.
    pub error: String,
}

/// What one refresh shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Frame {
    /// Volumes, the busiest first.
    pub volumes: Vec<VolumeRate>,
    /// Pools, the busiest first.
    pub pools: Vec<PoolRate>,
    /// Agents that did not answer this time.
    pub unreachable: Vec<Unreachable>,
}

/// Growth of a counter from `prev` to `cur`; a counter that went down was reset and counts
/// from zero.
fn increase(prev: f64, cur: f64) -> f64 {
    if cur >= prev { cur - prev } else { cur }
}

/// Bytes as a whole number for display (negative and non-finite values as 0).
fn whole(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 {
        // Precision loss is fine: sizes are far below 2^53.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = v.round() as u64;
        n
    } else {
        0
    }
}

/// Rates of one volume between two readings `dt` seconds apart.
fn volume_rate(
    key: &(String, String),
    prev: Option<&VolumeCounters>,
    cur: &VolumeCounters,
    dt: Option<f64>,
) -> VolumeRate {
    let d = |f: fn(&VolumeCounters) -> f64| -> Option<f64> {
        let (p, dt) = (prev?, dt?);
        Some(increase(f(p), f(cur)) / dt)
    };
    let ops = d(|c| c.reads).zip(d(|c| c.writes)).map(|(r, w)| r + w);
    let secs = d(|c| c.read_seconds)
        .zip(d(|c| c.write_seconds))
        .map(|(r, w)| r + w);
    VolumeRate {
        volume: key.1.clone(),
        node: key.0.clone(),
        read_iops: d(|c| c.reads),
        write_iops: d(|c| c.writes),
        read_bytes_per_second: d(|c| c.read_bytes),
        write_bytes_per_second: d(|c| c.written_bytes),
        latency_seconds: ops.zip(secs).and_then(|(o, s)| (o > 0.0).then(|| s / o)),
        size_bytes: cur.size_bytes.map(whole),
    }
}

/// Busiest first (no rate counts as none), then by name.
fn by_rate(a: Option<f64>, b: Option<f64>) -> std::cmp::Ordering {
    b.unwrap_or(-1.0).total_cmp(&a.unwrap_or(-1.0))
}

/// The frame of `cur`, with rates against `prev` (the previous refresh's readings; an
/// agent scraped for the first time has no rates yet). `unreachable`: the agents that did
/// not answer this time.
pub fn frame(prev: &[AgentReading], cur: &[AgentReading], unreachable: Vec<Unreachable>) -> Frame {
    let mut volumes = Vec::new();
    let mut pools = Vec::new();
    for r in cur {
        let before = prev.iter().find(|p| p.url == r.url);
        let dt = before.map(|p| r.at - p.at).filter(|dt| *dt > 0.0);
        let mut per_node: BTreeMap<&str, (Option<f64>, Option<f64>)> = BTreeMap::new();
        for (key, c) in &r.volumes {
            let v = volume_rate(key, before.and_then(|p| p.volumes.get(key)), c, dt);
            let e = per_node
                .entry(key.0.as_str())
                .or_insert((Some(0.0), Some(0.0)));
            e.0 = e.0.zip(v.iops()).map(|(a, b)| a + b);
            e.1 = e.1.zip(v.bytes_per_second()).map(|(a, b)| a + b);
            volumes.push(v);
        }
        for (node, g) in &r.pools {
            let (iops, bps) = match (dt, per_node.get(node.as_str())) {
                (Some(_), Some(&(i, b))) => (i, b),
                (Some(_), None) => (Some(0.0), Some(0.0)),
                (None, _) => (None, None),
            };
            pools.push(PoolRate {
                node: node.clone(),
                capacity_bytes: whole(g.capacity_bytes),
                free_bytes: whole(g.free_bytes),
                volumes: whole(g.volumes),
                iops,
                bytes_per_second: bps,
            });
        }
    }
    volumes.sort_by(|a, b| {
        by_rate(a.iops(), b.iops())
            .then_with(|| a.volume.cmp(&b.volume))
            .then_with(|| a.node.cmp(&b.node))
    });
    pools.sort_by(|a, b| by_rate(a.iops, b.iops).then_with(|| a.node.cmp(&b.node)));
    Frame {
        volumes,
        pools,
        unreachable,
    }
}

/// I/O per second for display: whole numbers from 100, one decimal below.
pub fn format_rate(v: Option<f64>) -> String {
    match v {
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.1}"),
        None => NONE.to_string(),
    }
}

/// Bytes per second as MiB/s with one decimal.
pub fn format_mib_s(v: Option<f64>) -> String {
    v.map_or_else(
        || NONE.to_string(),
        |v| format!("{:.1}", v / f64::from(1u32 << 20)),
    )
}

/// A latency in µs below a millisecond, ms below a second, else s.
pub fn format_latency(v: Option<f64>) -> String {
    match v {
        Some(s) if s < 1e-3 => format!("{:.0}µs", s * 1e6),
        Some(s) if s < 1.0 => format!("{:.2}ms", s * 1e3),
        Some(s) => format!("{s:.2}s"),
        None => NONE.to_string(),
    }
}

/// The volumes table: at most `limit` rows, the busiest first.
pub fn volumes_table(rows: &[VolumeRate], limit: usize) -> Table {
    let mut t = Table::new(&[
        "VOLUME", "NODE", "IOPS", "READ/S", "WRITE/S", "MIB/S", "LATENCY", "SIZE",
    ]);
    for r in rows.iter().take(limit) {
        t.row(vec![
            r.volume.clone(),
            r.node.clone(),
            format_rate(r.iops()),
            format_rate(r.read_iops),
            format_rate(r.write_iops),
            format_mib_s(r.bytes_per_second()),
            format_latency(r.latency_seconds),
            r.size_bytes.map_or_else(|| NONE.to_string(), format_bytes),
        ]);
    }
    t
}

/// The pools table.
pub fn pools_table(rows: &[PoolRate]) -> Table {
    let mut t = Table::new(&["POOL", "TOTAL", "FREE", "USED", "VOLUMES", "IOPS", "MIB/S"]);
    for r in rows {
        let used = if r.capacity_bytes > 0 {
            // Display only.
            #[allow(clippy::cast_precision_loss)]
            let share = 1.0 - r.free_bytes as f64 / r.capacity_bytes as f64;
            format!("{:.0}%", share * 100.0)
        } else {
            NONE.to_string()
        };
        t.row(vec![
            r.node.clone(),
            format_bytes(r.capacity_bytes),
            format_bytes(r.free_bytes),
            used,
            r.volumes.to_string(),
            format_rate(r.iops),
            format_mib_s(r.bytes_per_second),
        ]);
    }
    t
}

/// The frame as text: a title line, the volumes (at most `limit`), the pools, and the
/// agents that did not answer.
pub fn render(f: &Frame, title: &str, limit: usize) -> String {
    let mut out = format!("{title}\n\n");
    if f.volumes.is_empty() {
        out.push_str("No volumes.\n");
    } else {
        out.push_str(&volumes_table(&f.volumes, limit).render());
        if f.volumes.len() > limit {
            out.push_str(&format!(
                "… and {} quieter volumes\n",
                f.volumes.len() - limit
            ));
        }
    }
    out.push('\n');
    if f.pools.is_empty() {
        out.push_str("No pools.\n");
    } else {
        out.push_str(&pools_table(&f.pools).render());
    }
    for u in &f.unreachable {
        out.push_str(&format!("\nno answer from {}: {}", u.url, u.error));
    }
    if !f.unreachable.is_empty() {
        out.push('\n');
    }
    out
}

/// The metrics URL of an agent on `address` (an IPv4 or IPv6 address, or a host name) at
/// `port`.
pub fn agent_url(address: &str, port: u16) -> String {
    if address.contains(':') {
        format!("http://[{address}]:{port}/metrics")
    } else {
        format!("http://{address}:{port}/metrics")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn counters(reads: f64, writes: f64) -> VolumeCounters {
        VolumeCounters {
            reads,
            writes,
            read_bytes: reads * 4096.0,
            written_bytes: writes * 4096.0,
            read_seconds: reads * 1e-4,
            write_seconds: writes * 3e-4,
            size_bytes: Some(1073741824.0),
        }
    }

    fn reading(url: &str, at: f64, vols: &[(&str, &str, VolumeCounters)]) -> AgentReading {
        let mut r = AgentReading {
            url: url.into(),
            at,
            volumes: BTreeMap::new(),
            pools: BTreeMap::new(),
        };
        for (node, vol, c) in vols {
            r.volumes.insert((node.to_string(), vol.to_string()), *c);
            r.pools.insert(
                node.to_string(),
                PoolGauges {
                    capacity_bytes: 4.0 * 1073741824.0,
                    free_bytes: 1073741824.0,
                    volumes: 1.0,
                },
            );
        }
        r
    }

    #[test]
    fn rates_latency_reset_and_order() {
        let prev = [
            reading("a", 10.0, &[("n1", "pvc-a", counters(100.0, 100.0))]),
            reading("b", 10.0, &[("n2", "pvc-b", counters(1000.0, 0.0))]),
        ];
        let cur = [
            // 400 reads and 200 writes in 2 s.
            reading("a", 12.0, &[("n1", "pvc-a", counters(500.0, 300.0))]),
            // Reset: counts from zero (50 reads in 2 s).
            reading("b", 12.0, &[("n2", "pvc-b", counters(50.0, 0.0))]),
        ];
        let f = frame(&prev, &cur, Vec::new());
        assert_eq!(f.volumes[0].volume, "pvc-a");
        let a = &f.volumes[0];
        assert_eq!(a.read_iops, Some(200.0));
        assert_eq!(a.write_iops, Some(100.0));
        assert_eq!(a.iops(), Some(300.0));
        assert_eq!(a.bytes_per_second(), Some(300.0 * 4096.0));
        // (400 × 0.1 ms + 200 × 0.3 ms) / 600 requests.
        let lat = a.latency_seconds.unwrap();
        assert!((lat - (0.04 + 0.06) / 600.0).abs() < 1e-12, "{lat}");
        assert_eq!(f.volumes[1].iops(), Some(25.0));
        assert_eq!(f.pools[0].node, "n1");
        assert_eq!(f.pools[0].iops, Some(300.0));
        assert_eq!(f.pools[1].iops, Some(25.0));
    }

    #[test]
    fn the_first_scrape_has_no_rates_and_no_requests_no_latency() {
        let cur = [reading("a", 1.0, &[("n1", "pvc-a", counters(5.0, 5.0))])];
        let f = frame(&[], &cur, Vec::new());
        assert_eq!(f.volumes[0].iops(), None);
        assert_eq!(f.pools[0].iops, None);
        let text = render(&f, "t", 10);
        let row = text.lines().find(|l| l.starts_with("pvc-a")).unwrap();
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["pvc-a", "n1", "-", "-", "-", "-", "-", "1.0", "GiB"]
        );
        let f = frame(&cur, &cur, Vec::new());
        // Same time twice: no interval, no rate.
        assert_eq!(f.volumes[0].iops(), None);
        let later = [reading("a", 2.0, &[("n1", "pvc-a", counters(5.0, 5.0))])];
        let f = frame(&cur, &later, Vec::new());
        assert_eq!(f.volumes[0].iops(), Some(0.0));
        assert_eq!(f.volumes[0].latency_seconds, None);
    }

    #[test]
    fn formats() {
        assert_eq!(format_rate(Some(14733.4)), "14733");
        assert_eq!(format_rate(Some(0.25)), "0.2");
        assert_eq!(format_latency(Some(0.000_423)), "423µs");
        assert_eq!(format_latency(Some(0.009_226)), "9.23ms");
        assert_eq!(format_latency(Some(1.5)), "1.50s");
        assert_eq!(format_mib_s(Some(3.0 * 1048576.0)), "3.0");
        assert_eq!(agent_url("10.0.0.5", 9810), "http://10.0.0.5:9810/metrics");
        assert_eq!(agent_url("fd00::5", 9810), "http://[fd00::5]:9810/metrics");
    }

    #[test]
    fn the_volume_list_is_cut_at_the_limit_and_unreachable_agents_are_named() {
        let prev = [reading(
            "a",
            0.0,
            &[
                ("n1", "pvc-a", counters(0.0, 0.0)),
                ("n1", "pvc-b", counters(0.0, 0.0)),
            ],
        )];
        let cur = [reading(
            "a",
            1.0,
            &[
                ("n1", "pvc-a", counters(1.0, 0.0)),
                ("n1", "pvc-b", counters(9.0, 0.0)),
            ],
        )];
        let f = frame(
            &prev,
            &cur,
            vec![Unreachable {
                url: "http://x:1/metrics".into(),
                error: "connection refused".into(),
            }],
        );
        let text = render(&f, "title", 1);
        assert!(text.contains("pvc-b"), "{text}");
        assert!(!text.contains("pvc-a"), "{text}");
        assert!(text.contains("… and 1 quieter volumes"), "{text}");
        assert!(
            text.contains("no answer from http://x:1/metrics: connection refused"),
            "{text}"
        );
    }
}
