//! The per-volume families rendered at scrape time: `blk_*` for kernel devices, `spdk_lvol_*`
//! for SPDK lvols.

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

use super::{MetricsError, Scrape, clamp, reg};
use crate::engine::{VolumeIo, blkstat};

/// Reads one counter out of a block device's stat.
type BlkField = fn(&blkstat::BlockStat) -> u64;
/// Reads one counter out of an lvol's stat.
type LvolField = fn(&crate::engine::BdevIo) -> u64;

/// `blk_*`: LiteIO's names for `/sys/block/<dev>/stat`.
pub(super) struct BlkFamilies {
    counters: Vec<(IntCounterVec, BlkField)>,
    inflight: IntGaugeVec,
}

impl BlkFamilies {
    const LABELS: [&'static str; 3] = ["volume", "uuid", "dev"];

    pub(super) fn new(r: &Registry, scrape: &Scrape) -> Result<Option<Self>, MetricsError> {
        if !scrape
            .volumes
            .iter()
            .any(|(_, io)| matches!(io, VolumeIo::Block { .. }))
        {
            return Ok(None);
        }
        let defs: [(&'static str, &'static str, BlkField); 14] = [
            ("blk_read_req", "Reads completed", |s| s.read_ios),
            ("blk_read_merged", "Reads merged", |s| s.read_merges),
            ("blk_read_sectors", "512-byte sectors read", |s| {
                s.read_sectors
            }),
            ("blk_msec_read", "Milliseconds spent reading", |s| {
                s.read_ticks_ms
            }),
            ("blk_write_req", "Writes completed", |s| s.write_ios),
            ("blk_write_merged", "Writes merged", |s| s.write_merges),
            ("blk_write_sectors", "512-byte sectors written", |s| {
                s.write_sectors
            }),
            ("blk_msec_write", "Milliseconds spent writing", |s| {
                s.write_ticks_ms
            }),
            ("blk_discard_req", "Discards completed", |s| s.discard_ios),
            ("blk_discard_merged", "Discards merged", |s| {
                s.discard_merges
            }),
            ("blk_discard_sectors", "512-byte sectors discarded", |s| {
                s.discard_sectors
            }),
            ("blk_msec_discard", "Milliseconds spent discarding", |s| {
                s.discard_ticks_ms
            }),
            (
                "blk_msec_total",
                "Milliseconds the device had I/O in flight",
                |s| s.io_ticks_ms,
            ),
            (
                "blk_msec_weighted_total",
                "Weighted milliseconds of I/O (time x queue depth)",
                |s| s.time_in_queue_ms,
            ),
        ];
        let mut counters = Vec::with_capacity(defs.len());
        for (name, help, field) in defs {
            let c = reg(
                r,
                name,
                IntCounterVec::new(Opts::new(name, help), &Self::LABELS),
            )?;
            counters.push((c, field));
        }
        let inflight = reg(
            r,
            "blk_io_inflight",
            IntGaugeVec::new(
                Opts::new("blk_io_inflight", "I/Os in flight"),
                &Self::LABELS,
            ),
        )?;
        Ok(Some(Self { counters, inflight }))
    }

    pub(super) fn add(&self, labels: &[&str], stat: &blkstat::BlockStat) {
        for (c, field) in &self.counters {
            c.with_label_values(labels).inc_by(field(stat));
        }
        self.inflight
            .with_label_values(labels)
            .add(clamp(stat.in_flight));
    }
}

/// `spdk_lvol_*`: LiteIO's names for an lvol bdev's counters.
pub(super) struct LvolFamilies {
    counters: Vec<(IntCounterVec, LvolField)>,
}

impl LvolFamilies {
    pub(super) fn new(r: &Registry, scrape: &Scrape) -> Result<Option<Self>, MetricsError> {
        if !scrape
            .volumes
            .iter()
            .any(|(_, io)| matches!(io, VolumeIo::Lvol { .. }))
        {
            return Ok(None);
        }
        let defs: [(&'static str, &'static str, LvolField); 9] = [
            ("spdk_lvol_read_bytes_total", "Bytes read", |s| s.bytes_read),
            ("spdk_lvol_read_reqs_total", "Reads completed", |s| {
                s.read_ops
            }),
            (
                "spdk_lvol_read_lat_microseconds",
                "Sum of read latencies in microseconds",
                |s| s.read_latency_us,
            ),
            ("spdk_lvol_write_bytes_total", "Bytes written", |s| {
                s.bytes_written
            }),
            ("spdk_lvol_write_reqs_total", "Writes completed", |s| {
                s.write_ops
            }),
            (
                "spdk_lvol_write_lat_microseconds",
                "Sum of write latencies in microseconds",
                |s| s.write_latency_us,
            ),
            ("spdk_lvol_discard_bytes_total", "Bytes unmapped", |s| {
                s.bytes_unmapped
            }),
            ("spdk_lvol_discard_reqs_total", "Unmaps completed", |s| {
                s.unmap_ops
            }),
            (
                "spdk_lvol_discard_lat_microseconds",
                "Sum of unmap latencies in microseconds",
                |s| s.unmap_latency_us,
            ),
        ];
        let mut counters = Vec::with_capacity(defs.len());
        for (name, help, field) in defs {
            let c = reg(
                r,
                name,
                IntCounterVec::new(Opts::new(name, help), &["volume", "uuid", "lvol"]),
            )?;
            counters.push((c, field));
        }
        Ok(Some(Self { counters }))
    }

    pub(super) fn add(&self, labels: &[&str], stat: &crate::engine::BdevIo) {
        for (c, field) in &self.counters {
            c.with_label_values(labels).inc_by(field(stat));
        }
    }
}
