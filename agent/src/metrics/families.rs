//! The per-volume I/O families rendered at scrape time.
//!
//! Always, by Prometheus' conventions (node_exporter's `node_disk_*` names, base units,
//! `_total` on counters), one set of names whatever the engine, labelled `volume` (the
//! AntstorVolume, named after its PV), `uuid` and the device the counters come from: `dev`
//! (`loop3`, `dm-2`) for kernel block devices, `lvol` (`lvs/name`) for SPDK lvols. Kernel
//! devices add what `/sys/block/<dev>/stat` has beyond SPDK's counters (merges, requests in
//! flight, busy and weighted time).
//!
//! With `metrics.liteioCompatNames` also the names, units and `pvc` label of LiteIO's Go
//! agent (`blk_*`, `spdk_lvol_*`), for dashboards written against it; `promtool check
//! metrics` flags those (they break its naming rules), which is why they are off by default.

use prometheus::proto::MetricFamily;
use prometheus::{CounterVec, GaugeVec, Opts, Registry};

use super::{MetricsError, reg};
use crate::engine::blkstat::{BlockStat, SECTOR};
use crate::engine::{BdevIo, VolumeIo};

/// Whether a family counts up or goes both ways.
#[derive(Clone, Copy)]
enum Type {
    Counter,
    Gauge,
}

/// Reads one value out of a volume's stat.
type Value<S> = fn(&S) -> f64;

/// One family: name, help, type and where its value comes from.
struct Def<S: 'static> {
    name: &'static str,
    help: &'static str,
    ty: Type,
    value: Value<S>,
}

const fn counter<S>(name: &'static str, help: &'static str, value: Value<S>) -> Def<S> {
    Def {
        name,
        help,
        ty: Type::Counter,
        value,
    }
}

fn ms(v: u64) -> f64 {
    v as f64 / 1e3
}

fn us(v: u64) -> f64 {
    v as f64 / 1e6
}

fn sectors(v: u64) -> f64 {
    v.saturating_mul(SECTOR) as f64
}

/// Kernel block devices, Prometheus names.
static BLOCK: [Def<BlockStat>; 15] = [
    counter(
        "liteio_volume_reads_completed_total",
        "Reads completed",
        |s| s.read_ios as f64,
    ),
    counter(
        "liteio_volume_reads_merged_total",
        "Reads merged with an adjacent one before they were issued",
        |s| s.read_merges as f64,
    ),
    counter("liteio_volume_read_bytes_total", "Bytes read", |s| {
        sectors(s.read_sectors)
    }),
    counter(
        "liteio_volume_read_time_seconds_total",
        "Time spent by reads, summed over every read (divide its rate by the reads' for the mean latency)",
        |s| ms(s.read_ticks_ms),
    ),
    counter(
        "liteio_volume_writes_completed_total",
        "Writes completed",
        |s| s.write_ios as f64,
    ),
    counter(
        "liteio_volume_writes_merged_total",
        "Writes merged with an adjacent one before they were issued",
        |s| s.write_merges as f64,
    ),
    counter("liteio_volume_written_bytes_total", "Bytes written", |s| {
        sectors(s.write_sectors)
    }),
    counter(
        "liteio_volume_write_time_seconds_total",
        "Time spent by writes, summed over every write",
        |s| ms(s.write_ticks_ms),
    ),
    counter(
        "liteio_volume_discards_completed_total",
        "Discards (unmaps) completed",
        |s| s.discard_ios as f64,
    ),
    counter(
        "liteio_volume_discards_merged_total",
        "Discards merged with an adjacent one before they were issued",
        |s| s.discard_merges as f64,
    ),
    counter(
        "liteio_volume_discarded_bytes_total",
        "Bytes discarded",
        |s| sectors(s.discard_sectors),
    ),
    counter(
        "liteio_volume_discard_time_seconds_total",
        "Time spent by discards, summed over every discard",
        |s| ms(s.discard_ticks_ms),
    ),
    Def {
        name: "liteio_volume_io_now",
        help: "Requests in flight on the device now",
        ty: Type::Gauge,
        value: |s| s.in_flight as f64,
    },
    counter(
        "liteio_volume_io_time_seconds_total",
        "Time the device had requests in flight (its rate is the device's busy share)",
        |s| ms(s.io_ticks_ms),
    ),
    counter(
        "liteio_volume_io_time_weighted_seconds_total",
        "Time the device had requests in flight, weighted by their number (its rate is the mean queue depth)",
        |s| ms(s.time_in_queue_ms),
    ),
];

/// Kernel block devices, LiteIO's names and units (`blk_*`).
static BLOCK_LITEIO: [Def<BlockStat>; 15] = [
    counter("blk_read_req", "Reads completed (LiteIO's name)", |s| {
        s.read_ios as f64
    }),
    counter("blk_read_merged", "Reads merged (LiteIO's name)", |s| {
        s.read_merges as f64
    }),
    counter(
        "blk_read_sectors",
        "512-byte sectors read (LiteIO's name)",
        |s| s.read_sectors as f64,
    ),
    counter(
        "blk_msec_read",
        "Milliseconds spent reading (LiteIO's name)",
        |s| s.read_ticks_ms as f64,
    ),
    counter("blk_write_req", "Writes completed (LiteIO's name)", |s| {
        s.write_ios as f64
    }),
    counter("blk_write_merged", "Writes merged (LiteIO's name)", |s| {
        s.write_merges as f64
    }),
    counter(
        "blk_write_sectors",
        "512-byte sectors written (LiteIO's name)",
        |s| s.write_sectors as f64,
    ),
    counter(
        "blk_msec_write",
        "Milliseconds spent writing (LiteIO's name)",
        |s| s.write_ticks_ms as f64,
    ),
    counter(
        "blk_discard_req",
        "Discards completed (LiteIO's name)",
        |s| s.discard_ios as f64,
    ),
    counter(
        "blk_discard_merged",
        "Discards merged (LiteIO's name)",
        |s| s.discard_merges as f64,
    ),
    counter(
        "blk_discard_sectors",
        "512-byte sectors discarded (LiteIO's name)",
        |s| s.discard_sectors as f64,
    ),
    counter(
        "blk_msec_discard",
        "Milliseconds spent discarding (LiteIO's name)",
        |s| s.discard_ticks_ms as f64,
    ),
    Def {
        name: "blk_io_inflight",
        help: "I/Os in flight (LiteIO's name)",
        ty: Type::Gauge,
        value: |s| s.in_flight as f64,
    },
    counter(
        "blk_msec_total",
        "Milliseconds the device had I/O in flight (LiteIO's name)",
        |s| s.io_ticks_ms as f64,
    ),
    counter(
        "blk_msec_weighted_total",
        "Weighted milliseconds of I/O, time x queue depth (LiteIO's name)",
        |s| s.time_in_queue_ms as f64,
    ),
];

/// SPDK lvols, Prometheus names (the same as the kernel's where SPDK counts the same).
static LVOL: [Def<BdevIo>; 9] = [
    counter(
        "liteio_volume_reads_completed_total",
        "Reads completed",
        |s| s.read_ops as f64,
    ),
    counter("liteio_volume_read_bytes_total", "Bytes read", |s| {
        s.bytes_read as f64
    }),
    counter(
        "liteio_volume_read_time_seconds_total",
        "Time spent by reads, summed over every read (divide its rate by the reads' for the mean latency)",
        |s| us(s.read_latency_us),
    ),
    counter(
        "liteio_volume_writes_completed_total",
        "Writes completed",
        |s| s.write_ops as f64,
    ),
    counter("liteio_volume_written_bytes_total", "Bytes written", |s| {
        s.bytes_written as f64
    }),
    counter(
        "liteio_volume_write_time_seconds_total",
        "Time spent by writes, summed over every write",
        |s| us(s.write_latency_us),
    ),
    counter(
        "liteio_volume_discards_completed_total",
        "Discards (unmaps) completed",
        |s| s.unmap_ops as f64,
    ),
    counter(
        "liteio_volume_discarded_bytes_total",
        "Bytes discarded",
        |s| s.bytes_unmapped as f64,
    ),
    counter(
        "liteio_volume_discard_time_seconds_total",
        "Time spent by discards, summed over every discard",
        |s| us(s.unmap_latency_us),
    ),
];

/// SPDK lvols, LiteIO's names and units (`spdk_lvol_*`).
static LVOL_LITEIO: [Def<BdevIo>; 9] = [
    counter(
        "spdk_lvol_read_bytes_total",
        "Bytes read (LiteIO's name)",
        |s| s.bytes_read as f64,
    ),
    counter(
        "spdk_lvol_read_reqs_total",
        "Reads completed (LiteIO's name)",
        |s| s.read_ops as f64,
    ),
    counter(
        "spdk_lvol_read_lat_microseconds",
        "Sum of read latencies in microseconds (LiteIO's name)",
        |s| s.read_latency_us as f64,
    ),
    counter(
        "spdk_lvol_write_bytes_total",
        "Bytes written (LiteIO's name)",
        |s| s.bytes_written as f64,
    ),
    counter(
        "spdk_lvol_write_reqs_total",
        "Writes completed (LiteIO's name)",
        |s| s.write_ops as f64,
    ),
    counter(
        "spdk_lvol_write_lat_microseconds",
        "Sum of write latencies in microseconds (LiteIO's name)",
        |s| s.write_latency_us as f64,
    ),
    counter(
        "spdk_lvol_discard_bytes_total",
        "Bytes unmapped (LiteIO's name)",
        |s| s.bytes_unmapped as f64,
    ),
    counter(
        "spdk_lvol_discard_reqs_total",
        "Unmaps completed (LiteIO's name)",
        |s| s.unmap_ops as f64,
    ),
    counter(
        "spdk_lvol_discard_lat_microseconds",
        "Sum of unmap latencies in microseconds (LiteIO's name)",
        |s| s.unmap_latency_us as f64,
    ),
];

/// The LiteIO names of the per-volume families (what `metrics.liteioCompatNames` adds).
pub fn liteio_names() -> impl Iterator<Item = &'static str> {
    BLOCK_LITEIO
        .iter()
        .map(|d| d.name)
        .chain(LVOL_LITEIO.iter().map(|d| d.name))
}

enum Family {
    Counter(CounterVec),
    Gauge(GaugeVec),
}

/// The families of one table, registered in one registry.
struct Table<S: 'static> {
    families: Vec<(Family, Value<S>)>,
}

impl<S> Table<S> {
    fn new(r: &Registry, defs: &'static [Def<S>], labels: &[&str]) -> Result<Self, MetricsError> {
        let mut families = Vec::with_capacity(defs.len());
        for d in defs {
            let opts = Opts::new(d.name, d.help);
            let f = match d.ty {
                Type::Counter => Family::Counter(reg(r, d.name, CounterVec::new(opts, labels))?),
                Type::Gauge => Family::Gauge(reg(r, d.name, GaugeVec::new(opts, labels))?),
            };
            families.push((f, d.value));
        }
        Ok(Self { families })
    }

    fn add(&self, labels: &[&str], stat: &S) {
        for (f, value) in &self.families {
            let v = value(stat).max(0.0);
            match f {
                Family::Counter(c) => c.with_label_values(labels).inc_by(v),
                Family::Gauge(g) => g.with_label_values(labels).add(v),
            }
        }
    }
}

/// Who a volume's series are about: its AntstorVolume's name and uuid, and LiteIO's `pvc`
/// label (`<PVC namespace>/<PV name>`, LiteIO's own meaning of it).
pub(super) struct Owner<'a> {
    pub name: &'a str,
    pub uuid: &'a str,
    pub liteio_pvc: &'a str,
}

/// The per-volume families of one scrape. Kernel devices and lvols share the Prometheus
/// names but not the device label, so each kind has its own registry and [`IoFamilies::
/// gather`] merges them.
pub(super) struct IoFamilies {
    block: (Registry, Table<BlockStat>, Option<Table<BlockStat>>),
    lvol: (Registry, Table<BdevIo>, Option<Table<BdevIo>>),
    any_block: bool,
    any_lvol: bool,
}

impl IoFamilies {
    /// Empty families; `liteio_names` adds LiteIO's.
    pub(super) fn new(node: &str, liteio_names: bool) -> Result<Self, MetricsError> {
        let registry = || {
            let labels = std::collections::HashMap::from([("node".to_string(), node.to_string())]);
            Registry::new_custom(None, Some(labels)).map_err(|source| MetricsError::Register {
                name: "volume I/O registry",
                source,
            })
        };
        let rb = registry()?;
        let block = Table::new(&rb, &BLOCK, &["volume", "uuid", "dev"])?;
        let block_liteio = liteio_names
            .then(|| Table::new(&rb, &BLOCK_LITEIO, &["volume", "uuid", "dev", "pvc"]))
            .transpose()?;
        let rl = registry()?;
        let lvol = Table::new(&rl, &LVOL, &["volume", "uuid", "lvol"])?;
        let lvol_liteio = liteio_names
            .then(|| Table::new(&rl, &LVOL_LITEIO, &["volume", "uuid", "lvol", "pvc"]))
            .transpose()?;
        Ok(Self {
            block: (rb, block, block_liteio),
            lvol: (rl, lvol, lvol_liteio),
            any_block: false,
            any_lvol: false,
        })
    }

    /// Adds `io` as the counters of volume `owner`.
    pub(super) fn add(&mut self, owner: &Owner<'_>, io: &VolumeIo) {
        match io {
            VolumeIo::Block { dev, stat } => {
                self.any_block = true;
                let (_, t, liteio) = &self.block;
                t.add(&[owner.name, owner.uuid, dev], stat);
                if let Some(l) = liteio {
                    l.add(&[owner.name, owner.uuid, dev, owner.liteio_pvc], stat);
                }
            }
            VolumeIo::Lvol { lvol, stat } => {
                self.any_lvol = true;
                let (_, t, liteio) = &self.lvol;
                t.add(&[owner.name, owner.uuid, lvol], stat);
                if let Some(l) = liteio {
                    l.add(&[owner.name, owner.uuid, lvol, owner.liteio_pvc], stat);
                }
            }
        }
    }

    /// The families with at least one series (none of a kind no volume has).
    pub(super) fn gather(self) -> Vec<MetricFamily> {
        let mut out = Vec::new();
        if self.any_block {
            out.extend(self.block.0.gather());
        }
        if self.any_lvol {
            out.extend(self.lvol.0.gather());
        }
        merge(out)
    }
}

/// Families of the same name (the same metric from different sources) made one, sorted by
/// name; the first one's help and type stay.
pub(super) fn merge(mut families: Vec<MetricFamily>) -> Vec<MetricFamily> {
    families.sort_by(|a, b| a.name().cmp(b.name()));
    let mut out: Vec<MetricFamily> = Vec::with_capacity(families.len());
    for mut f in families {
        match out.last_mut() {
            Some(last) if last.name() == f.name() => {
                let more = f.take_metric();
                last.mut_metric().extend(more);
            }
            _ => out.push(f),
        }
    }
    out
}
