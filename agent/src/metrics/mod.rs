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
//!
//! Where each part is: the registry and its families set by the control loop, the scrape and
//! the rendering are here; the samples a scrape collects and their sources in `scrape.rs`;
//! the per-volume I/O families in [`families`]; QoS in [`qos`]; the thread CPU times read
//! from `/proc` in `proc.rs`; the HTTP endpoints in `http.rs`; the unit tests in `tests.rs`.

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

pub mod families;
mod http;
mod proc;
pub mod qos;
mod scrape;

use families::{IoFamilies, Owner};
pub use http::{bind, serve};
pub use proc::{parse_task_stat, thread_cpu_seconds};
pub use scrape::{EngineSource, Scrape, ScrapeSource, SourceError, SpdkFaults, SpdkThreadTime};

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
mod tests;
