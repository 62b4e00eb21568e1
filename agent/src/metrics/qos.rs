//! Per-volume QoS metrics: the limits in force on each export and how long a volume ran
//! against them.
//!
//! - `liteio_volume_qos_iops_limit{volume,uuid}` and
//!   `liteio_volume_qos_limit_bytes_per_second{volume,uuid,direction="total|read|write"}`:
//!   the limits the agent applied to the volume's export (no series: unlimited, or not
//!   applied; the volume's `liteio.io/qos-in-force` annotation says the same).
//! - `liteio_volume_qos_limited_seconds_total{volume,uuid}`: seconds in which the volume's
//!   rate reached [`AT_LIMIT`] of one of its limits, sampled every [`SAMPLE_EVERY`] from the
//!   lvol's own counters. SPDK's public API does not say how many I/Os its rate limiter
//!   queued, so this counts time at the limit instead: a volume whose counter grows at close
//!   to 1 s/s is held back by its limit; one that stays flat is not.
//!
//! Only limited volumes are sampled: one counter read per limited volume and second.

use std::sync::Arc;
use std::time::{Duration, Instant};

use liteio_api::qos::VolumeQos;
use tokio::sync::watch;
use tracing::debug;

use super::Metrics;
use crate::engine::{BdevIo, PoolEngine, VolumeIo};

/// How often limited volumes' counters are read.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// The share of a limit from which a volume counts as held back by it (SPDK admits I/O in
/// 1 ms timeslices, so a volume held back runs at its limit to within a few per mille).
pub const AT_LIMIT: f64 = 0.95;

const MIB: f64 = (1u64 << 20) as f64;

/// A limited volume as the sampler tracks it.
#[derive(Debug, Clone)]
pub(super) struct Limited {
    /// The engine volume whose counters are read.
    pub engine_name: String,
    /// The limits in force.
    pub qos: VolumeQos,
    /// The last sample.
    pub last: Option<(Instant, BdevIo)>,
}

/// Whether the I/O between `before` and `now` (`secs` apart) ran at [`AT_LIMIT`] of one of
/// `qos`'s limits. IOPS count reads, writes and unmaps (SPDK limits them together);
/// bandwidth counts bytes read and written.
pub fn at_limit(qos: &VolumeQos, before: &BdevIo, now: &BdevIo, secs: f64) -> bool {
    if secs <= 0.0 {
        return false;
    }
    let rate = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
    let read = rate(before.bytes_read, now.bytes_read);
    let write = rate(before.bytes_written, now.bytes_written);
    let ops = rate(before.read_ops, now.read_ops)
        + rate(before.write_ops, now.write_ops)
        + rate(before.unmap_ops, now.unmap_ops);
    let hit = |limit: u64, got: f64, unit: f64| limit > 0 && got >= AT_LIMIT * limit as f64 * unit;
    hit(qos.iops, ops, 1.0)
        || hit(qos.mbps, read + write, MIB)
        || hit(qos.read_mbps, read, MIB)
        || hit(qos.write_mbps, write, MIB)
}

/// Reads the counters of the limited volumes every [`SAMPLE_EVERY`] and adds the time at
/// their limits, until `shutdown`. Runs the engine's counter reads on the blocking pool.
pub async fn sample(
    metrics: Arc<Metrics>,
    engine: Arc<dyn PoolEngine>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
        let names = metrics.limited_engine_volumes();
        if names.is_empty() {
            continue;
        }
        let e = Arc::clone(&engine);
        match tokio::task::spawn_blocking(move || e.io_stats(&names)).await {
            Ok(Ok(stats)) => metrics.sample_qos(&stats, Instant::now()),
            // A missed sample only delays the count; the next one covers the interval.
            Ok(Err(e)) => debug!(error = %e, "QoS sample: cannot read volume counters"),
            Err(e) => debug!(error = %e, "QoS sample: the counter read did not finish"),
        }
    }
}

impl Metrics {
    /// The limits now in force on volume `name`'s export (`uuid`, engine volume
    /// `engine_name`); unlimited removes its QoS series.
    pub fn set_volume_qos(&self, name: &str, uuid: &str, engine_name: &str, qos: VolumeQos) {
        let key = (name.to_string(), uuid.to_string());
        let mut limited = self.limited.lock().unwrap_or_else(|p| p.into_inner());
        if qos.is_unlimited() {
            if limited.remove(&key).is_some() {
                self.remove_qos_series(name, uuid);
            }
            return;
        }
        let labels = [name, uuid];
        let set = |g: &prometheus::IntGaugeVec, extra: Option<&str>, v: u64| {
            let mut l: Vec<&str> = labels.to_vec();
            l.extend(extra);
            if v == 0 {
                let _ = g.remove_label_values(&l);
            } else {
                g.with_label_values(&l).set(super::clamp(v));
            }
        };
        set(&self.qos_iops_limit, None, qos.iops);
        set(&self.qos_bytes_limit, Some("total"), qos.mbps << 20);
        set(&self.qos_bytes_limit, Some("read"), qos.read_mbps << 20);
        set(&self.qos_bytes_limit, Some("write"), qos.write_mbps << 20);
        // Present from the first limit on, so that a rate() over it has a start.
        let _ = self.qos_limited.with_label_values(&labels);
        let entry = limited.entry(key).or_insert_with(|| Limited {
            engine_name: engine_name.to_string(),
            qos,
            last: None,
        });
        entry.engine_name = engine_name.to_string();
        entry.qos = qos;
    }

    pub(super) fn remove_qos(&self, name: &str, uuid: &str) {
        let key = (name.to_string(), uuid.to_string());
        if self
            .limited
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key)
            .is_some()
        {
            self.remove_qos_series(name, uuid);
        }
    }

    fn remove_qos_series(&self, name: &str, uuid: &str) {
        let _ = self.qos_iops_limit.remove_label_values(&[name, uuid]);
        for d in ["total", "read", "write"] {
            let _ = self.qos_bytes_limit.remove_label_values(&[name, uuid, d]);
        }
        let _ = self.qos_limited.remove_label_values(&[name, uuid]);
    }

    /// The engine volumes of the limited volumes (what [`sample`] reads).
    pub fn limited_engine_volumes(&self) -> Vec<String> {
        let limited = self.limited.lock().unwrap_or_else(|p| p.into_inner());
        let mut names: Vec<String> = limited.values().map(|l| l.engine_name.clone()).collect();
        names.sort();
        names.dedup();
        names
    }

    /// Takes one sample of the limited volumes' counters (`stats`, by engine volume name)
    /// taken at `at`, and adds the time since each one's previous sample when it ran at its
    /// limit.
    pub fn sample_qos(&self, stats: &[(String, VolumeIo)], at: Instant) {
        let mut limited = self.limited.lock().unwrap_or_else(|p| p.into_inner());
        for ((name, uuid), l) in limited.iter_mut() {
            let Some(now) = stats.iter().find_map(|(e, io)| match io {
                VolumeIo::Lvol { stat, .. } if *e == l.engine_name => Some(*stat),
                _ => None,
            }) else {
                continue;
            };
            if let Some((then, before)) = l.last {
                let secs = at.saturating_duration_since(then).as_secs_f64();
                if at_limit(&l.qos, &before, &now, secs) {
                    self.qos_limited
                        .with_label_values(&[name, uuid])
                        .inc_by(secs);
                }
            }
            l.last = Some((at, now));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn io(ops: u64, read: u64, written: u64) -> BdevIo {
        BdevIo {
            read_ops: ops / 2,
            write_ops: ops - ops / 2,
            bytes_read: read,
            bytes_written: written,
            ..Default::default()
        }
    }

    #[test]
    fn at_the_limit_from_95_percent_of_any_limit() {
        let q = VolumeQos {
            iops: 2000,
            write_mbps: 10,
            ..Default::default()
        };
        let zero = io(0, 0, 0);
        // 1,900 IOPS over 2 s: at the IOPS limit; 1,800: not.
        assert!(at_limit(&q, &zero, &io(3800, 0, 0), 2.0));
        assert!(!at_limit(&q, &zero, &io(3600, 0, 0), 2.0));
        // 9.6 MiB/s of writes: at the write limit, whatever the IOPS.
        let w = (9.6 * MIB) as u64;
        assert!(at_limit(&q, &zero, &io(10, 0, w), 1.0));
        // Reads do not count against a write limit.
        assert!(!at_limit(&q, &zero, &io(10, w, 0), 1.0));
        // No time, no rate; unlimited, never.
        assert!(!at_limit(&q, &zero, &io(3800, 0, 0), 0.0));
        assert!(!at_limit(
            &VolumeQos::default(),
            &zero,
            &io(u64::MAX / 4, 0, 0),
            1.0
        ));
    }

    fn lvol(name: &str, stat: BdevIo) -> (String, VolumeIo) {
        (
            name.to_string(),
            VolumeIo::Lvol {
                lvol: format!("lvs/{name}"),
                stat,
            },
        )
    }

    /// The value of the sample of `name` with every label of `labels`.
    fn value(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .find(|l| labels.iter().all(|p| l.contains(p)))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }

    #[test]
    fn limited_seconds_count_only_intervals_at_the_limit() {
        let m = Metrics::new("n1").unwrap();
        let q = VolumeQos {
            iops: 1000,
            ..Default::default()
        };
        m.set_volume_qos("pvc-a", "u-a", "e-a", q);
        m.set_volume_qos("pvc-b", "u-b", "e-b", VolumeQos::default());
        assert_eq!(m.limited_engine_volumes(), vec!["e-a".to_string()]);
        let t0 = Instant::now();
        m.sample_qos(&[lvol("e-a", io(0, 0, 0))], t0);
        // 1 s at 1,000 IOPS, then 2 s at 100.
        m.sample_qos(&[lvol("e-a", io(1000, 0, 0))], t0 + Duration::from_secs(1));
        m.sample_qos(&[lvol("e-a", io(1200, 0, 0))], t0 + Duration::from_secs(3));
        let text = m.render();
        let a = [r#"volume="pvc-a""#, r#"uuid="u-a""#];
        assert_eq!(
            value(&text, "liteio_volume_qos_limited_seconds_total", &a),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            value(&text, "liteio_volume_qos_iops_limit", &a),
            Some(1000.0),
            "{text}"
        );
        assert!(!text.contains("pvc-b"), "{text}");
        // Raised to a bandwidth limit: the IOPS series goes, the bytes one comes.
        m.set_volume_qos(
            "pvc-a",
            "u-a",
            "e-a",
            VolumeQos {
                read_mbps: 5,
                ..Default::default()
            },
        );
        let text = m.render();
        assert!(!text.contains("liteio_volume_qos_iops_limit{"), "{text}");
        assert_eq!(
            value(
                &text,
                "liteio_volume_qos_limit_bytes_per_second",
                &[a[0], a[1], r#"direction="read""#]
            ),
            Some(5_242_880.0),
            "{text}"
        );
        // The time counted so far stays (a counter).
        assert_eq!(
            value(&text, "liteio_volume_qos_limited_seconds_total", &a),
            Some(1.0),
            "{text}"
        );
        // Lifted, or the volume gone: no series.
        m.set_volume_qos("pvc-a", "u-a", "e-a", VolumeQos::default());
        assert!(m.limited_engine_volumes().is_empty());
        assert!(!m.render().contains("pvc-a"));
        m.set_volume_qos("pvc-a", "u-a", "e-a", q);
        m.remove_volume("pvc-a", "u-a");
        assert!(!m.render().contains("qos"), "{}", m.render());
    }
}
