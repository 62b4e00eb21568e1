//! Prometheus metrics and the health endpoints.
//!
//! A private registry per agent (so several agents can run in one test process) with the
//! constant label `node` (the StoragePool is named after it). Labels are bounded: volume
//! names and error *kinds*, never error text. [`serve`] answers `GET /metrics` (Prometheus
//! text), `GET /healthz` (the process serves requests) and `GET /readyz` (the pool is
//! registered and the node's exports are restored). Every family, its type, unit and labels:
//! `docs/metrics.md`; `promtool check metrics` finds nothing to say about the output unless
//! `metrics.liteioCompatNames` adds LiteIO's names.
//!
//! **Collected at scrape time.** Besides the metrics the control loop sets, each scrape asks
//! the registered [`ScrapeSource`]s (the pool engine's per-volume I/O counters, the SPDK
//! runtime's thread and reactor times) for fresh samples on the blocking pool, bounded by
//! [`COLLECT_TIMEOUT`], and renders them into a registry built for that scrape only: a
//! volume that is gone (or no longer attached) simply has no series in the next scrape. The
//! heartbeat age is computed the same way from the last successful renewal.
//!
//! Per-volume I/O (labels `volume`, `uuid` as in `liteio_volume_size_bytes`, plus the device,
//! `dev` or `lvol`): node_exporter's `node_disk_*` names under `liteio_volume_`, in bytes and
//! seconds, from `/sys/block/<dev>/stat` for kernel engines and the bdev's device stat for
//! SPDK; LiteIO's `blk_*` and `spdk_lvol_*` as well with `metrics.liteioCompatNames` (see
//! [`families`]).
//!
//! SPDK runtime: `liteio_spdk_thread_{busy,idle}_seconds_total{thread}` (SPDK's own
//! accounting, which only advances in poll mode) and
//! `liteio_spdk_reactor_cpu_seconds_total{reactor}` (the reactor threads' CPU time, which is
//! their busy time in interrupt mode and 100 % in poll mode), `liteio_spdk_request_timeouts_total`
//! (requests to SPDK that got no answer within their deadline: a stuck reactor or a lost
//! completion; each one is also logged with the code that sent it),
//! `liteio_spdk_stuck_requests` (those of them still unanswered now; the pool's `Spdk`
//! condition names the oldest), `liteio_spdk_oldest_stuck_request_seconds` (how long the
//! oldest of them has waited) and `liteio_spdk_caught_panics_total` (panics caught on SPDK
//! threads; each failed its request).
//!
//! Process: `liteio_panics_total` (panics in this process; counted once the binary installed
//! [`liteio_node::panics::count`]), `liteio_auth_refusals_total{reason}` (the API server
//! refused this node's identity a volume's keys).
//!
//! QoS (limits in force and time held back by them, per volume): see [`qos`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus::proto::MetricFamily;
use prometheus::{
    CounterVec, Encoder, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use kube::ResourceExt;
use liteio_api::AntstorVolume;
use liteio_api::keys::labels;

use crate::engine::{PoolEngine, VolumeIo};

pub mod families;
mod http;
mod proc;
pub mod qos;

use families::{IoFamilies, Owner};
pub use http::{bind, serve};
pub use proc::{parse_task_stat, thread_cpu_seconds};

/// Why the metrics could not be set up or served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// A metric could not be registered (a programming error: duplicate name).
    #[error("cannot register metric {name}")]
    Register {
        /// Metric name.
        name: &'static str,
        /// Prometheus' error.
        #[source]
        source: prometheus::Error,
    },
    /// The listener could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// Address.
        addr: std::net::SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl MetricsError {
    /// Bounded classification.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Register { .. } => "register",
            Self::Bind { .. } => "bind",
        }
    }
}

/// Longest a scrape waits for its sources; past it the scrape answers without their
/// samples and counts the timeout in `liteio_metrics_collect_errors_total{source="all"}`.
pub const COLLECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Samples taken at scrape time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scrape {
    /// I/O counters by engine volume name.
    pub volumes: Vec<(String, VolumeIo)>,
    /// SPDK threads' own time accounting.
    pub spdk_threads: Vec<SpdkThreadTime>,
    /// CPU seconds of each reactor thread (`reactor_0`, …).
    pub reactor_cpu: Vec<(String, f64)>,
    /// Faults of the SPDK runtime since the process started; `None` without SPDK.
    pub spdk_faults: Option<SpdkFaults>,
}

/// Faults the SPDK runtime survived, since the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpdkFaults {
    /// Requests that got no answer within their deadline.
    pub request_timeouts: u64,
    /// Panics caught on SPDK threads.
    pub caught_panics: u64,
    /// Requests past their deadline and still unanswered right now.
    pub stuck_requests: u64,
    /// Seconds the oldest of them has waited (0 when none).
    pub oldest_stuck_seconds: f64,
}

/// How an SPDK thread spent its time, in seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpdkThreadTime {
    /// SPDK's thread name.
    pub thread: String,
    /// Seconds doing work.
    pub busy_seconds: f64,
    /// Seconds polling without work.
    pub idle_seconds: f64,
}

/// Why a source could not give its samples (logged, counted by source; never a label).
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// Something asked for samples at every scrape. Runs on the blocking pool; must be cheap.
pub trait ScrapeSource: Send + Sync + std::fmt::Debug {
    /// A short, fixed name for logs and the error counter's `source` label.
    fn name(&self) -> &'static str;

    /// Adds samples to `out`. `volumes` are the engine names of the volumes the agent serves
    /// right now.
    fn scrape(&self, volumes: &[String], out: &mut Scrape) -> Result<(), SourceError>;
}

/// The pool engine's per-volume I/O counters ([`PoolEngine::io_stats`]).
#[derive(Debug)]
pub struct EngineSource(pub Arc<dyn PoolEngine>);

impl ScrapeSource for EngineSource {
    fn name(&self) -> &'static str {
        "engine"
    }

    fn scrape(&self, volumes: &[String], out: &mut Scrape) -> Result<(), SourceError> {
        out.volumes.extend(self.0.io_stats(volumes)?);
        Ok(())
    }
}

/// Clears the in-flight flag when a collection ends, however it ends.
struct InFlight(Arc<AtomicBool>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// A volume the agent serves, as its series name it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct KnownVolume {
    /// The engine volume its counters are read from.
    engine_name: String,
    /// LiteIO's `pvc` label: `<PVC namespace>/<PV name>`.
    liteio_pvc: String,
}

/// LiteIO's `pvc` label of a volume: its PVC's namespace and its PV's name (the labels
/// `csi.storage.k8s.io/pvc-namespace` and `obnvmf/pv-name`; the volume's own name, which is
/// the PV's, when the latter is missing), as LiteIO's agent forms it.
pub fn liteio_pvc(vol: &AntstorVolume) -> String {
    let l = vol.labels();
    let ns = l.get(labels::PVC_NAMESPACE).map_or("", String::as_str);
    let pv = l
        .get(labels::PV_NAME)
        .cloned()
        .unwrap_or_else(|| vol.name_any());
    format!("{ns}/{pv}")
}

/// The agent's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pool_capacity: IntGauge,
    pool_free: IntGauge,
    volumes: IntGauge,
    volume_size: IntGaugeVec,
    heartbeat_last_success: Gauge,
    heartbeat_failures: IntCounter,
    reconcile_errors: IntCounterVec,
    orphans: IntGaugeVec,
    collect_errors: IntCounterVec,
    provision: HistogramVec,
    auth_refusals: IntCounterVec,
    /// (volume, uuid) → where its counters come from.
    known_volumes: Mutex<BTreeMap<(String, String), KnownVolume>>,
    qos_iops_limit: IntGaugeVec,
    qos_bytes_limit: IntGaugeVec,
    qos_limited: CounterVec,
    /// (volume, uuid) → the limits in force and the last counter sample (see [`qos`]).
    limited: Mutex<BTreeMap<(String, String), qos::Limited>>,
    sources: Mutex<Vec<Arc<dyn ScrapeSource>>>,
    collecting: Arc<AtomicBool>,
    node: String,
    /// Serve LiteIO's per-volume names too (`metrics.liteioCompatNames`).
    liteio_names: bool,
    started: SystemTime,
    ready: AtomicBool,
    /// Every export this node had when the agent started is listening again (see
    /// `crate::restore`).
    restored: AtomicBool,
}

fn reg<T: prometheus::core::Collector + Clone + 'static>(
    r: &Registry,
    name: &'static str,
    m: Result<T, prometheus::Error>,
) -> Result<T, MetricsError> {
    let m = m.map_err(|source| MetricsError::Register { name, source })?;
    r.register(Box::new(m.clone()))
        .map_err(|source| MetricsError::Register { name, source })?;
    Ok(m)
}

impl Metrics {
    /// A registry for `node` with every metric registered, Prometheus names only.
    pub fn new(node: &str) -> Result<Self, MetricsError> {
        Self::with_liteio_names(node, false)
    }

    /// [`Metrics::new`]; `liteio_names` also serves the per-volume families under LiteIO's
    /// names (`metrics.liteioCompatNames`).
    pub fn with_liteio_names(node: &str, liteio_names: bool) -> Result<Self, MetricsError> {
        let mut labels = HashMap::new();
        labels.insert("node".to_string(), node.to_string());
        let r =
            Registry::new_custom(None, Some(labels)).map_err(|source| MetricsError::Register {
                name: "registry",
                source,
            })?;
        Ok(Self {
            pool_capacity: reg(
                &r,
                "liteio_pool_capacity_bytes",
                IntGauge::new("liteio_pool_capacity_bytes", "Pool capacity in bytes"),
            )?,
            pool_free: reg(
                &r,
                "liteio_pool_free_bytes",
                IntGauge::new("liteio_pool_free_bytes", "Pool free bytes"),
            )?,
            volumes: reg(
                &r,
                "liteio_pool_volumes",
                IntGauge::new("liteio_pool_volumes", "Volumes provisioned in the pool"),
            )?,
            volume_size: reg(
                &r,
                "liteio_volume_size_bytes",
                IntGaugeVec::new(
                    Opts::new("liteio_volume_size_bytes", "Allocated size of a volume"),
                    &["volume", "uuid"],
                ),
            )?,
            heartbeat_last_success: reg(
                &r,
                "liteio_heartbeat_last_success_timestamp_seconds",
                Gauge::new(
                    "liteio_heartbeat_last_success_timestamp_seconds",
                    "Unix time of the last successful Lease renewal",
                ),
            )?,
            heartbeat_failures: reg(
                &r,
                "liteio_heartbeat_failures_total",
                IntCounter::new(
                    "liteio_heartbeat_failures_total",
                    "Failed Lease renewal attempts",
                ),
            )?,
            reconcile_errors: reg(
                &r,
                "liteio_reconcile_errors_total",
                IntCounterVec::new(
                    Opts::new("liteio_reconcile_errors_total", "Failed reconciles by kind"),
                    &["resource", "kind"],
                ),
            )?,
            orphans: reg(
                &r,
                "liteio_orphan_objects",
                IntGaugeVec::new(
                    Opts::new(
                        "liteio_orphan_objects",
                        "Engine objects no AntstorVolume/AntstorSnapshot owns",
                    ),
                    &["kind"],
                ),
            )?,
            collect_errors: reg(
                &r,
                "liteio_metrics_collect_errors_total",
                IntCounterVec::new(
                    Opts::new(
                        "liteio_metrics_collect_errors_total",
                        "Scrapes that went without a source's samples (error, timeout, busy)",
                    ),
                    &["source"],
                ),
            )?,
            provision: reg(
                &r,
                "liteio_provision_seconds",
                HistogramVec::new(
                    HistogramOpts::new(
                        "liteio_provision_seconds",
                        "Time from the first reconcile of a new volume to ready, in total and per step (engine, export, api, waiting between passes)",
                    )
                    .buckets(vec![
                        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    ]),
                    &["step"],
                ),
            )?,
            qos_iops_limit: reg(
                &r,
                "liteio_volume_qos_iops_limit",
                IntGaugeVec::new(
                    Opts::new(
                        "liteio_volume_qos_iops_limit",
                        "I/O per second (reads, writes and unmaps together) the volume's export admits",
                    ),
                    &["volume", "uuid"],
                ),
            )?,
            qos_bytes_limit: reg(
                &r,
                "liteio_volume_qos_limit_bytes_per_second",
                IntGaugeVec::new(
                    Opts::new(
                        "liteio_volume_qos_limit_bytes_per_second",
                        "Bytes per second the volume's export admits (direction total, read or write)",
                    ),
                    &["volume", "uuid", "direction"],
                ),
            )?,
            qos_limited: reg(
                &r,
                "liteio_volume_qos_limited_seconds_total",
                CounterVec::new(
                    Opts::new(
                        "liteio_volume_qos_limited_seconds_total",
                        "Seconds in which the volume ran at 95 % or more of one of its QoS limits (held back by it)",
                    ),
                    &["volume", "uuid"],
                ),
            )?,
            auth_refusals: reg(
                &r,
                "liteio_auth_refusals_total",
                IntCounterVec::new(
                    Opts::new(
                        "liteio_auth_refusals_total",
                        "Requests refused for want of authentication or authorization, by reason (keys_forbidden: the API server refused this node's identity a volume's keys Secret)",
                    ),
                    &["reason"],
                ),
            )?,
            limited: Mutex::new(BTreeMap::new()),
            registry: r,
            known_volumes: Mutex::new(BTreeMap::new()),
            sources: Mutex::new(Vec::new()),
            collecting: Arc::new(AtomicBool::new(false)),
            node: node.to_string(),
            liteio_names,
            started: SystemTime::now(),
            ready: AtomicBool::new(false),
            restored: AtomicBool::new(false),
        })
    }

    /// Asks `source` for samples at every scrape from now on.
    pub fn add_source(&self, source: Arc<dyn ScrapeSource>) {
        self.sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(source);
    }

    /// Pool capacity and free space.
    pub fn set_pool(&self, total: u64, free: u64) {
        self.pool_capacity.set(clamp(total));
        self.pool_free.set(clamp(free));
    }

    /// Volume `vol` is served from engine volume `engine_name` with `size` bytes; its I/O
    /// counters are reported from the next scrape on.
    pub fn set_volume(&self, vol: &AntstorVolume, engine_name: &str, size: u64) {
        let (name, uuid) = (vol.name_any(), vol.spec.uuid.clone());
        self.volume_size
            .with_label_values(&[&name, &uuid])
            .set(clamp(size));
        let mut known = self.known_volumes.lock().unwrap_or_else(|p| p.into_inner());
        known.insert(
            (name, uuid),
            KnownVolume {
                engine_name: engine_name.to_string(),
                liteio_pvc: liteio_pvc(vol),
            },
        );
        self.volumes.set(clamp(known.len() as u64));
    }

    /// A volume is gone: its series disappear.
    pub fn remove_volume(&self, name: &str, uuid: &str) {
        let _ = self.volume_size.remove_label_values(&[name, uuid]);
        self.remove_qos(name, uuid);
        let mut known = self.known_volumes.lock().unwrap_or_else(|p| p.into_inner());
        known.remove(&(name.to_string(), uuid.to_string()));
        self.volumes.set(clamp(known.len() as u64));
    }

    /// A renewal succeeded at `unix_secs`.
    pub fn heartbeat_ok(&self, unix_secs: f64) {
        self.heartbeat_last_success.set(unix_secs);
    }

    /// A renewal attempt failed.
    pub fn heartbeat_failed(&self) {
        self.heartbeat_failures.inc();
    }

    /// Failed renewal attempts so far.
    pub fn heartbeat_failures(&self) -> u64 {
        self.heartbeat_failures.get()
    }

    /// A request was refused for want of authentication or authorization (`reason`: a
    /// fixed word, see `liteio_auth_refusals_total`).
    pub fn auth_refused(&self, reason: &'static str) {
        self.auth_refusals.with_label_values(&[reason]).inc();
    }

    /// A reconcile of `resource` failed with `kind`.
    pub fn reconcile_error(&self, resource: &'static str, kind: &'static str) {
        self.reconcile_errors
            .with_label_values(&[resource, kind])
            .inc();
    }

    /// A volume became ready: where its provisioning spent its time.
    pub fn provisioned(&self, report: &crate::state::provision::Report) {
        for (step, d) in [
            ("engine", report.steps.engine),
            ("export", report.steps.export),
            ("api", report.steps.api),
            ("waiting", report.waiting()),
            ("total", report.total),
        ] {
            self.provision
                .with_label_values(&[step])
                .observe(d.as_secs_f64());
        }
    }

    /// Orphans currently seen, by kind (`volume`, `snapshot`).
    pub fn set_orphans(&self, kind: &'static str, n: usize) {
        self.orphans.with_label_values(&[kind]).set(clamp(n as u64));
    }

    /// Marks the agent ready (pool registered) or not.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Marks the exports this node had at start as listening again.
    pub fn set_restored(&self) {
        self.restored.store(true, Ordering::Relaxed);
    }

    /// Why the agent is not ready (`None`: ready): its pool is registered and every export
    /// the node had when the agent started listens again. A DaemonSet rollout waits for
    /// this before it restarts the next node's agent.
    pub fn not_ready(&self) -> Option<&'static str> {
        if !self.ready.load(Ordering::Relaxed) {
            Some("pool not registered yet")
        } else if !self.restored.load(Ordering::Relaxed) {
            Some("restoring this node's NVMe-oF exports")
        } else {
            None
        }
    }

    /// Whether the agent is ready (see [`Metrics::not_ready`]).
    pub fn is_ready(&self) -> bool {
        self.not_ready().is_none()
    }

    /// Asks every source for samples, in this thread (blocking).
    pub fn collect(&self) -> Scrape {
        let volumes: Vec<String> = {
            let known = self.known_volumes.lock().unwrap_or_else(|p| p.into_inner());
            let mut v: Vec<String> = known.values().map(|k| k.engine_name.clone()).collect();
            v.sort();
            v.dedup();
            v
        };
        let sources = self
            .sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut out = Scrape::default();
        for src in sources {
            if let Err(e) = src.scrape(&volumes, &mut out) {
                tracing::warn!(source = src.name(), error = %e, "metrics source failed");
                self.collect_errors.with_label_values(&[src.name()]).inc();
            }
        }
        out
    }

    /// Collects on the blocking pool (at most [`COLLECT_TIMEOUT`]; one collection at a time,
    /// so a stuck source cannot pile up threads) and renders everything.
    pub async fn scrape(self: &Arc<Self>) -> String {
        let scrape = if self.collecting.swap(true, Ordering::AcqRel) {
            self.collect_errors.with_label_values(&["all"]).inc();
            Scrape::default()
        } else {
            let guard = InFlight(Arc::clone(&self.collecting));
            let me = Arc::clone(self);
            let job = tokio::task::spawn_blocking(move || {
                let _guard = guard;
                me.collect()
            });
            match tokio::time::timeout(COLLECT_TIMEOUT, job).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "metrics collection did not complete");
                    self.collect_errors.with_label_values(&["all"]).inc();
                    Scrape::default()
                }
                Err(_) => {
                    tracing::warn!(
                        after_ms = COLLECT_TIMEOUT.as_millis() as u64,
                        "metrics collection timed out; answering without it"
                    );
                    self.collect_errors.with_label_values(&["all"]).inc();
                    Scrape::default()
                }
            }
        };
        self.render_with(&scrape, SystemTime::now())
    }

    /// The Prometheus text exposition of the metrics the control loop sets and the heartbeat
    /// age (no sources asked).
    pub fn render(&self) -> String {
        self.render_with(&Scrape::default(), SystemTime::now())
    }

    /// The Prometheus text exposition with `scrape`'s samples, as of `now`.
    pub fn render_with(&self, scrape: &Scrape, now: SystemTime) -> String {
        let mut families = self.registry.gather();
        match self.scrape_families(scrape, now) {
            Ok(f) => families.extend(f),
            Err(e) => tracing::error!(error = %e, "cannot build the scrape-time metrics"),
        }
        let families = families::merge(families);
        let mut buf = Vec::new();
        // Encoding into a Vec only fails for invalid metric families, which we never build.
        if let Err(e) = TextEncoder::new().encode(&families, &mut buf) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// Seconds since the last successful heartbeat; since the agent started when there was
    /// none yet (so an agent that never renewed shows a growing age, not nothing).
    pub fn heartbeat_age(&self, now: SystemTime) -> f64 {
        let last = self.heartbeat_last_success.get();
        let since = if last > 0.0 {
            UNIX_EPOCH + Duration::from_secs_f64(last)
        } else {
            self.started
        };
        now.duration_since(since).map_or(0.0, |d| d.as_secs_f64())
    }

    /// The families of one scrape, in a registry of their own: series of volumes that are
    /// gone are simply not there.
    fn scrape_families(
        &self,
        scrape: &Scrape,
        now: SystemTime,
    ) -> Result<Vec<MetricFamily>, MetricsError> {
        let mut labels = HashMap::new();
        labels.insert("node".to_string(), self.node.clone());
        let r =
            Registry::new_custom(None, Some(labels)).map_err(|source| MetricsError::Register {
                name: "scrape registry",
                source,
            })?;
        let age = reg(
            &r,
            "liteio_heartbeat_age_seconds",
            Gauge::new(
                "liteio_heartbeat_age_seconds",
                "Seconds since the last successful Lease renewal (since start when none)",
            ),
        )?;
        age.set(self.heartbeat_age(now));
        reg(
            &r,
            "liteio_panics_total",
            IntCounter::new("liteio_panics_total", liteio_node::panics::HELP),
        )?
        .inc_by(liteio_node::panics::count());

        // engine name → the volumes served from it.
        let mut owners: HashMap<String, Vec<(String, String, String)>> = HashMap::new();
        for ((name, uuid), k) in self
            .known_volumes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            owners.entry(k.engine_name.clone()).or_default().push((
                name.clone(),
                uuid.clone(),
                k.liteio_pvc.clone(),
            ));
        }
        let mut io = IoFamilies::new(&self.node, self.liteio_names)?;
        for (ename, sample) in &scrape.volumes {
            for (name, uuid, liteio_pvc) in owners.get(ename).into_iter().flatten() {
                let owner = Owner {
                    name,
                    uuid,
                    liteio_pvc,
                };
                io.add(&owner, sample);
            }
        }

        if !scrape.spdk_threads.is_empty() {
            let busy = reg(
                &r,
                "liteio_spdk_thread_busy_seconds_total",
                CounterVec::new(
                    Opts::new(
                        "liteio_spdk_thread_busy_seconds_total",
                        "Time an SPDK thread spent doing work (advances in poll mode only)",
                    ),
                    &["thread"],
                ),
            )?;
            let idle = reg(
                &r,
                "liteio_spdk_thread_idle_seconds_total",
                CounterVec::new(
                    Opts::new(
                        "liteio_spdk_thread_idle_seconds_total",
                        "Time an SPDK thread spent polling without work (poll mode only)",
                    ),
                    &["thread"],
                ),
            )?;
            for t in &scrape.spdk_threads {
                busy.with_label_values(&[&t.thread])
                    .inc_by(t.busy_seconds.max(0.0));
                idle.with_label_values(&[&t.thread])
                    .inc_by(t.idle_seconds.max(0.0));
            }
        }
        if !scrape.reactor_cpu.is_empty() {
            let cpu = reg(
                &r,
                "liteio_spdk_reactor_cpu_seconds_total",
                CounterVec::new(
                    Opts::new(
                        "liteio_spdk_reactor_cpu_seconds_total",
                        "CPU time of an SPDK reactor thread (user + system)",
                    ),
                    &["reactor"],
                ),
            )?;
            for (reactor, secs) in &scrape.reactor_cpu {
                cpu.with_label_values(&[reactor]).inc_by(secs.max(0.0));
            }
        }
        if let Some(f) = scrape.spdk_faults {
            reg(
                &r,
                "liteio_spdk_request_timeouts_total",
                IntCounter::new(
                    "liteio_spdk_request_timeouts_total",
                    "Requests to SPDK that got no answer within their deadline (a stuck reactor or a lost completion)",
                ),
            )?
            .inc_by(f.request_timeouts);
            reg(
                &r,
                "liteio_spdk_caught_panics_total",
                IntCounter::new(
                    "liteio_spdk_caught_panics_total",
                    "Panics caught on SPDK threads (each failed its request; SPDK went on)",
                ),
            )?
            .inc_by(f.caught_panics);
            reg(
                &r,
                "liteio_spdk_stuck_requests",
                IntGauge::new(
                    "liteio_spdk_stuck_requests",
                    "Requests to SPDK past their deadline and still unanswered (non-zero: a reactor may be stuck; the pool's Spdk condition says which)",
                ),
            )?
            .set(clamp(f.stuck_requests));
            reg(
                &r,
                "liteio_spdk_oldest_stuck_request_seconds",
                Gauge::new(
                    "liteio_spdk_oldest_stuck_request_seconds",
                    "How long the oldest request to SPDK still unanswered past its deadline has waited (0: none)",
                ),
            )?
            .set(f.oldest_stuck_seconds.max(0.0));
        }
        let mut families = r.gather();
        families.extend(io.gather());
        Ok(families)
    }
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::engine::BdevIo;
    use crate::engine::blkstat::BlockStat;
    use liteio_api::AntstorVolumeSpec;

    fn block(dev: &str, read_ios: u64, write_sectors: u64, in_flight: u64) -> VolumeIo {
        VolumeIo::Block {
            dev: dev.into(),
            stat: BlockStat {
                read_ios,
                read_ticks_ms: 1500,
                write_ios: write_sectors / 8,
                write_sectors,
                in_flight,
                time_in_queue_ms: 7,
                ..BlockStat::default()
            },
        }
    }

    /// An AntstorVolume `name` with `uuid`, made for PVC `app/data`.
    fn vol(name: &str, uuid: &str) -> AntstorVolume {
        let mut v = AntstorVolume::new(
            name,
            AntstorVolumeSpec {
                uuid: uuid.into(),
                ..Default::default()
            },
        );
        v.labels_mut()
            .insert(labels::PVC_NAMESPACE.into(), "app".into());
        v.labels_mut()
            .insert(labels::PVC_NAME.into(), "data".into());
        v.labels_mut().insert(labels::PV_NAME.into(), name.into());
        v
    }

    /// Sample lines of `text` that start with `name{`.
    fn samples<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .collect()
    }

    /// The value of the sample `name` whose labels are exactly `labels` (any order).
    fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        want.sort();
        samples(text, name).into_iter().find_map(|l| {
            let (head, v) = l.rsplit_once(' ')?;
            let inner = head
                .strip_prefix(name)?
                .strip_prefix('{')?
                .strip_suffix('}')?;
            let mut got: Vec<String> = inner.split(',').map(str::to_string).collect();
            got.sort();
            if got == want { v.parse().ok() } else { None }
        })
    }

    /// Every family name of the exposition (its `# TYPE` lines).
    fn family_names(text: &str) -> Vec<&str> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
            .collect()
    }

    #[test]
    fn block_counters_in_base_units_labelled_by_volume_uuid_and_dev() {
        let m = Metrics::new("node-1").unwrap();
        m.set_volume(&vol("pvc-a", "u-a"), "pvc-a", 1 << 20);
        m.set_volume(&vol("pvc-b", "u-b"), "eng-b", 1 << 20);
        let scrape = Scrape {
            volumes: vec![
                ("pvc-a".into(), block("loop3", 12, 4096, 1)),
                ("eng-b".into(), block("dm-2", 5, 0, 0)),
                // An engine volume no AntstorVolume maps to is not reported.
                ("stray".into(), block("loop9", 1, 1, 0)),
            ],
            ..Scrape::default()
        };
        let text = m.render_with(&scrape, SystemTime::now());
        let a = [
            ("node", "node-1"),
            ("volume", "pvc-a"),
            ("uuid", "u-a"),
            ("dev", "loop3"),
        ];
        let b = [
            ("node", "node-1"),
            ("volume", "pvc-b"),
            ("uuid", "u-b"),
            ("dev", "dm-2"),
        ];
        let v = |name, l: &[(&str, &str)]| value(&text, name, l);
        assert_eq!(
            v("liteio_volume_reads_completed_total", &a),
            Some(12.0),
            "{text}"
        );
        assert_eq!(v("liteio_volume_reads_completed_total", &b), Some(5.0));
        assert!(text.contains("# TYPE liteio_volume_written_bytes_total counter"));
        // Sectors become bytes, milliseconds seconds.
        assert_eq!(
            v("liteio_volume_written_bytes_total", &a),
            Some(4096.0 * 512.0)
        );
        assert_eq!(v("liteio_volume_read_time_seconds_total", &a), Some(1.5));
        assert_eq!(v("liteio_volume_writes_completed_total", &a), Some(512.0));
        assert!(text.contains("# TYPE liteio_volume_io_now gauge"));
        assert_eq!(v("liteio_volume_io_now", &a), Some(1.0));
        assert_eq!(
            v("liteio_volume_io_time_weighted_seconds_total", &a),
            Some(0.007)
        );
        for name in [
            "liteio_volume_reads_merged_total",
            "liteio_volume_read_bytes_total",
            "liteio_volume_writes_merged_total",
            "liteio_volume_write_time_seconds_total",
            "liteio_volume_discards_completed_total",
            "liteio_volume_discards_merged_total",
            "liteio_volume_discarded_bytes_total",
            "liteio_volume_discard_time_seconds_total",
            "liteio_volume_io_time_seconds_total",
        ] {
            assert_eq!(samples(&text, name).len(), 2, "{name}: {text}");
        }
        assert!(!text.contains("loop9"));
        assert!(!text.contains("lvol="), "no lvol, no lvol series");
        // LiteIO's names only when asked for.
        assert!(!text.contains("blk_"), "{text}");
    }

    #[test]
    fn every_family_follows_the_naming_conventions() {
        // What `promtool check metrics` asks of names (the T1 tests run promtool itself on
        // a live agent): counters end in `_total`, nothing else does, base units only.
        let m = Metrics::new("n").unwrap();
        m.set_volume(&vol("pvc-a", "u-a"), "pvc-a", 1);
        m.set_volume(&vol("pvc-s", "u-s"), "pvc-s", 1);
        m.set_volume_qos(
            "pvc-s",
            "u-s",
            "pvc-s",
            liteio_api::qos::VolumeQos {
                iops: 10,
                mbps: 1,
                ..Default::default()
            },
        );
        m.auth_refused("keys_forbidden");
        m.reconcile_error("antstorvolume", "api");
        m.set_orphans("volume", 1);
        let scrape = Scrape {
            volumes: vec![
                ("pvc-a".into(), block("loop3", 1, 8, 0)),
                (
                    "pvc-s".into(),
                    VolumeIo::Lvol {
                        lvol: "lvs/pvc-s".into(),
                        stat: BdevIo::default(),
                    },
                ),
            ],
            spdk_threads: vec![SpdkThreadTime::default()],
            reactor_cpu: vec![("reactor_0".into(), 1.0)],
            spdk_faults: Some(SpdkFaults::default()),
        };
        let text = m.render_with(&scrape, SystemTime::now());
        let names = family_names(&text);
        assert!(names.len() > 30, "{text}");
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let mut f = line.split(' ').skip(2);
            let (name, ty) = (f.next().unwrap(), f.next().unwrap());
            assert!(name.starts_with("liteio_"), "{name}: not LiteIO's prefix");
            assert_eq!(
                ty == "counter",
                name.ends_with("_total"),
                "{name} is a {ty}"
            );
            for unit in ["milli", "micro", "nano", "msec", "sectors", "_ms", "_us"] {
                assert!(!name.contains(unit), "{name}: not a base unit");
            }
        }
        // One family per name, even where kernel devices and lvols both report.
        let mut sorted = names.clone();
        sorted.dedup();
        assert_eq!(sorted, names, "a family rendered twice");
        assert_eq!(
            samples(&text, "liteio_volume_reads_completed_total").len(),
            2
        );
    }

    #[test]
    fn liteio_names_are_served_beside_when_asked_for() {
        let m = Metrics::with_liteio_names("node-1", true).unwrap();
        m.set_volume(&vol("pvc-a", "u-a"), "pvc-a", 1 << 20);
        m.set_volume(&vol("pvc-s", "u-s"), "pvc-s", 1 << 20);
        let scrape = Scrape {
            volumes: vec![
                ("pvc-a".into(), block("loop3", 12, 4096, 1)),
                (
                    "pvc-s".into(),
                    VolumeIo::Lvol {
                        lvol: "lvs0/pvc-s".into(),
                        stat: BdevIo {
                            read_ops: 3,
                            read_latency_us: 90,
                            ..Default::default()
                        },
                    },
                ),
            ],
            ..Scrape::default()
        };
        let text = m.render_with(&scrape, SystemTime::now());
        // LiteIO's units and labels (its `pvc` is `<PVC namespace>/<PV name>`).
        let a = [
            ("node", "node-1"),
            ("volume", "pvc-a"),
            ("uuid", "u-a"),
            ("dev", "loop3"),
            ("pvc", "app/pvc-a"),
        ];
        assert_eq!(value(&text, "blk_read_req", &a), Some(12.0), "{text}");
        assert_eq!(value(&text, "blk_write_sectors", &a), Some(4096.0));
        assert_eq!(value(&text, "blk_msec_read", &a), Some(1500.0));
        assert!(text.contains("# TYPE blk_io_inflight gauge"));
        let s = [
            ("node", "node-1"),
            ("volume", "pvc-s"),
            ("uuid", "u-s"),
            ("lvol", "lvs0/pvc-s"),
            ("pvc", "app/pvc-s"),
        ];
        assert_eq!(value(&text, "spdk_lvol_read_reqs_total", &s), Some(3.0));
        assert_eq!(
            value(&text, "spdk_lvol_read_lat_microseconds", &s),
            Some(90.0)
        );
        // Every LiteIO name of a kind that reports is there, once.
        for name in families::liteio_names() {
            assert_eq!(samples(&text, name).len(), 1, "{name}: {text}");
        }
        // And the Prometheus names beside them.
        let sp = [
            ("node", "node-1"),
            ("volume", "pvc-s"),
            ("uuid", "u-s"),
            ("lvol", "lvs0/pvc-s"),
        ];
        assert_eq!(
            value(&text, "liteio_volume_read_time_seconds_total", &sp),
            Some(0.00009)
        );
        assert_eq!(
            value(&text, "liteio_volume_reads_completed_total", &sp),
            Some(3.0)
        );
    }

    #[test]
    fn removed_volumes_disappear_from_the_next_scrape() {
        let m = Metrics::with_liteio_names("n", true).unwrap();
        m.set_volume(&vol("pvc-a", "u-a"), "pvc-a", 1);
        let scrape = Scrape {
            volumes: vec![("pvc-a".into(), block("loop0", 1, 8, 0))],
            ..Scrape::default()
        };
        let text = m.render_with(&scrape, SystemTime::now());
        assert!(text.contains("liteio_volume_reads_completed_total{"));
        assert!(text.contains("blk_read_req{"));
        m.remove_volume("pvc-a", "u-a");
        let text = m.render_with(&scrape, SystemTime::now());
        assert!(!text.contains("pvc-a"), "{text}");
        assert!(!text.contains("reads_completed"), "{text}");
        assert!(!text.contains("blk_read_req"), "{text}");
    }

    #[test]
    fn lvol_counters_in_base_units() {
        let m = Metrics::new("n").unwrap();
        m.set_volume(&vol("pvc-s", "u-s"), "pvc-s", 1);
        let stat = BdevIo {
            read_ops: 3,
            bytes_read: 12288,
            read_latency_us: 90,
            write_ops: 4,
            bytes_written: 16384,
            write_latency_us: 120,
            unmap_ops: 1,
            bytes_unmapped: 4096,
            unmap_latency_us: 5,
        };
        let scrape = Scrape {
            volumes: vec![(
                "pvc-s".into(),
                VolumeIo::Lvol {
                    lvol: "lvs0/pvc-s".into(),
                    stat,
                },
            )],
            ..Scrape::default()
        };
        let text = m.render_with(&scrape, SystemTime::now());
        let l = [
            ("node", "n"),
            ("volume", "pvc-s"),
            ("uuid", "u-s"),
            ("lvol", "lvs0/pvc-s"),
        ];
        for (name, v) in [
            ("liteio_volume_reads_completed_total", 3.0),
            ("liteio_volume_read_bytes_total", 12288.0),
            ("liteio_volume_read_time_seconds_total", 0.00009),
            ("liteio_volume_writes_completed_total", 4.0),
            ("liteio_volume_written_bytes_total", 16384.0),
            ("liteio_volume_write_time_seconds_total", 0.00012),
            ("liteio_volume_discards_completed_total", 1.0),
            ("liteio_volume_discarded_bytes_total", 4096.0),
            ("liteio_volume_discard_time_seconds_total", 0.000005),
        ] {
            assert_eq!(value(&text, name, &l), Some(v), "{name}: {text}");
            assert!(text.contains(&format!("# TYPE {name} counter")), "{name}");
        }
        // What only kernel devices count is not made up for lvols.
        assert!(!text.contains("merged"), "{text}");
        assert!(!text.contains("liteio_volume_io_"), "{text}");
        assert!(!text.contains("spdk_lvol_"), "{text}");
    }

    #[test]
    fn reactor_and_thread_times() {
        let m = Metrics::new("n").unwrap();
        let scrape = Scrape {
            spdk_threads: vec![SpdkThreadTime {
                thread: "app_thread".into(),
                busy_seconds: 0.5,
                idle_seconds: 2.25,
            }],
            reactor_cpu: vec![("reactor_0".into(), 1.5)],
            spdk_faults: Some(SpdkFaults {
                request_timeouts: 3,
                caught_panics: 1,
                stuck_requests: 2,
                oldest_stuck_seconds: 41.5,
            }),
            ..Scrape::default()
        };
        let text = m.render_with(&scrape, SystemTime::now());
        let n = [("node", "n")];
        assert_eq!(
            value(&text, "liteio_spdk_request_timeouts_total", &n),
            Some(3.0),
            "{text}"
        );
        assert_eq!(
            value(&text, "liteio_spdk_caught_panics_total", &n),
            Some(1.0)
        );
        assert_eq!(value(&text, "liteio_spdk_stuck_requests", &n), Some(2.0));
        assert_eq!(
            value(&text, "liteio_spdk_oldest_stuck_request_seconds", &n),
            Some(41.5)
        );
        let th = [("node", "n"), ("thread", "app_thread")];
        assert_eq!(
            value(&text, "liteio_spdk_thread_busy_seconds_total", &th),
            Some(0.5)
        );
        assert_eq!(
            value(&text, "liteio_spdk_thread_idle_seconds_total", &th),
            Some(2.25)
        );
        let r = [("node", "n"), ("reactor", "reactor_0")];
        assert_eq!(
            value(&text, "liteio_spdk_reactor_cpu_seconds_total", &r),
            Some(1.5),
            "{text}"
        );
        assert!(
            !m.render().contains("liteio_spdk_"),
            "no SPDK, no SPDK families"
        );
    }

    #[test]
    fn auth_refusals_and_panics_are_counted() {
        let m = Metrics::new("n").unwrap();
        m.auth_refused("keys_forbidden");
        m.auth_refused("keys_forbidden");
        let text = m.render();
        assert_eq!(
            value(
                &text,
                "liteio_auth_refusals_total",
                &[("node", "n"), ("reason", "keys_forbidden")]
            ),
            Some(2.0),
            "{text}"
        );
        // The process-wide count, whatever it is in this test binary.
        let panics = value(&text, "liteio_panics_total", &[("node", "n")]).unwrap();
        assert_eq!(panics, liteio_node::panics::count() as f64, "{text}");
    }

    #[test]
    fn liteio_pvc_is_the_pvc_namespace_and_the_pv_name() {
        assert_eq!(liteio_pvc(&vol("pvc-1", "u")), "app/pvc-1");
        // Without the labels: the volume's own name (which is the PV's).
        let bare = AntstorVolume::new("pvc-2", AntstorVolumeSpec::default());
        assert_eq!(liteio_pvc(&bare), "/pvc-2");
    }

    #[test]
    fn heartbeat_age_from_the_last_success_or_from_start() {
        let m = Metrics::new("n").unwrap();
        let later = m.started + Duration::from_secs(7);
        assert!((m.heartbeat_age(later) - 7.0).abs() < 1e-6);
        m.heartbeat_ok(1_000_000.0);
        let now = UNIX_EPOCH + Duration::from_secs_f64(1_000_002.5);
        assert!((m.heartbeat_age(now) - 2.5).abs() < 1e-6);
        let text = m.render_with(&Scrape::default(), now);
        assert!(
            text.contains("liteio_heartbeat_age_seconds{node=\"n\"} 2.5\n"),
            "{text}"
        );
        // A clock that went back shows 0, not a negative age.
        assert_eq!(m.heartbeat_age(UNIX_EPOCH), 0.0);
    }

    #[derive(Debug)]
    struct Fixed(Result<VolumeIo, &'static str>);

    impl ScrapeSource for Fixed {
        fn name(&self) -> &'static str {
            "fixed"
        }
        fn scrape(&self, volumes: &[String], out: &mut Scrape) -> Result<(), SourceError> {
            let io = self.0.clone()?;
            out.volumes
                .extend(volumes.iter().map(|v| (v.clone(), io.clone())));
            Ok(())
        }
    }

    #[tokio::test]
    async fn sources_are_asked_at_scrape_time_and_failures_counted() {
        tokio::time::timeout(Duration::from_secs(10), async {
            let m = Arc::new(Metrics::new("n").unwrap());
            m.set_volume(&vol("pvc-a", "u"), "e-a", 1);
            m.add_source(Arc::new(Fixed(Ok(block("loop1", 4, 8, 0)))));
            m.add_source(Arc::new(Fixed(Err("boom"))));
            let text = m.scrape().await;
            let l = [
                ("node", "n"),
                ("volume", "pvc-a"),
                ("uuid", "u"),
                ("dev", "loop1"),
            ];
            assert_eq!(
                value(&text, "liteio_volume_reads_completed_total", &l),
                Some(4.0),
                "{text}"
            );
            let e = [("node", "n"), ("source", "fixed")];
            assert_eq!(
                value(&text, "liteio_metrics_collect_errors_total", &e),
                Some(1.0),
                "{text}"
            );
            assert!(
                !m.collecting.load(Ordering::Acquire),
                "in-flight flag cleared"
            );
        })
        .await
        .unwrap();
    }
}
