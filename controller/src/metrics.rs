//! Prometheus metrics of the controller, in a private registry. Labels are bounded: kinds,
//! results, reasons, pool states and the names of the objects the controller watches (one
//! series per pool, per volume not ready and per migration under way), never an error's
//! text. Every family, its type, unit and labels: `docs/metrics.md`.
//!
//! The per-object series describe the cluster as the leader sees it: an instance that stops
//! leading drops them ([`Metrics::forget_cluster`]), so that a standby never reports a stale
//! view (the alerting rules need not pick the leader's series).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Every pool status, as the `status` label of `liteio_controller_pool_status`.
pub const POOL_STATUSES: [&str; 4] = ["ready", "unknown", "offline", "locked"];

/// One pool on a liveness tick.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSample {
    /// The StoragePool's name (its node's).
    pub pool: String,
    /// Its status (one of [`POOL_STATUSES`]).
    pub status: &'static str,
    /// Seconds since its Lease was last renewed (since the pool's creation without one);
    /// `None` when neither is known.
    pub lease_age_seconds: Option<f64>,
}

/// A volume that is not ready (and not being deleted) on a liveness tick.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeSample {
    /// The AntstorVolume's name (its PV's).
    pub volume: String,
    /// The node it is scheduled to (empty while unscheduled).
    pub node: String,
    /// Its PVC's namespace and name (empty when it has none).
    pub pvc_namespace: String,
    /// See `pvc_namespace`.
    pub pvc: String,
    /// Unix time of its creation.
    pub created: f64,
}

/// A VolumeMigration that is not finished.
#[derive(Debug, Clone, PartialEq)]
pub struct MigrationSample {
    /// The VolumeMigration's name.
    pub migration: String,
    /// The volume it moves (its PV's name).
    pub volume: String,
    /// Where the volume is now and where it goes.
    pub source_node: String,
    /// See `source_node`.
    pub dest_node: String,
    /// Its phase.
    pub phase: &'static str,
    /// Bytes copied so far as the source agent reported them.
    pub copied_bytes: u64,
    /// Size of the volume, when known.
    pub size_bytes: Option<u64>,
}

/// What a migration showed when it last moved on.
#[derive(Debug, Clone, PartialEq)]
struct Progress {
    phase: &'static str,
    copied_bytes: u64,
    at: f64,
}

/// The controller's metrics.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// Reconciles by kind and result (`ok` or an error kind).
    pub reconciles: IntCounterVec,
    /// Duration of scheduling decisions, by outcome (`placed`, `unplaceable`, `invalid`).
    pub schedule_seconds: HistogramVec,
    /// Pools rejected per reason in failed decisions.
    pub schedule_failures: IntCounterVec,
    /// Pools by state.
    pub pools: IntGaugeVec,
    /// 1 while this instance leads.
    pub leader: IntGauge,
    /// VolumeMigrations by phase and status (`Working`, `Error`, `Finished`, `none`).
    pub migrations: IntGaugeVec,
    /// Time from the source agent enabling the switch-over to its success, as the
    /// controller saw them (annotations `migrate.obnvmf/switch-enabled-at` and
    /// `migrate.obnvmf/switched-at`).
    pub migration_switch_seconds: Histogram,
    /// Time from a VolumeMigration's creation to `Finished`.
    pub migration_seconds: Histogram,
    /// 1 per member volume of a multi-disk volume: `pv` (the PV), `group`, `volume` (the
    /// member AntstorVolume, as the agents' per-volume series name it) and `node`; joins the
    /// members' I/O series with their PV.
    pub group_members: IntGaugeVec,
    pool_status: IntGaugeVec,
    pool_lease_age: GaugeVec,
    volume_not_ready: GaugeVec,
    migration_copied: IntGaugeVec,
    migration_size: IntGaugeVec,
    migration_progress: GaugeVec,
    /// Migrations under way: when each last moved on.
    progress: Arc<Mutex<BTreeMap<String, Progress>>>,
    /// The per-object series set on the last observation, to drop the ones gone since.
    pools_shown: Shown,
    volumes_shown: Shown,
    migrations_shown: Shown,
    /// Replicated volumes: 1 for each PV's current health (`healthy`, `rebuilding`,
    /// `degraded`, `failed`), 0 for the others.
    pub replicated_health: IntGaugeVec,
    /// Replicated volumes: bytes rebuilt onto each replica, as its assembling agent reports
    /// them (`status.replicas[].rebuiltBytes`), by PV and member volume.
    pub replica_rebuilt_bytes: IntGaugeVec,
}

/// Label values of the series of one kind set on the last observation.
#[derive(Debug, Clone, Default)]
struct Shown(Arc<Mutex<BTreeSet<Vec<String>>>>);

impl Shown {
    /// `now` is what is shown from here on; `remove` is called with each label-value list
    /// shown before and not any more.
    fn replace(&self, now: BTreeSet<Vec<String>>, remove: impl Fn(&[&str])) {
        let mut shown = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for gone in shown.difference(&now) {
            let l: Vec<&str> = gone.iter().map(String::as_str).collect();
            remove(&l);
        }
        *shown = now;
    }

    fn clear(&self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

fn register<T: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    m: T,
) -> Result<T, prometheus::Error> {
    registry.register(Box::new(m.clone()))?;
    Ok(m)
}

const MIGRATION_LABELS: [&str; 4] = ["migration", "volume", "source_node", "dest_node"];

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("liteio_controller".into()), None)?;
        let reconciles = IntCounterVec::new(
            Opts::new("reconciles_total", "Reconciles by kind and result"),
            &["kind", "result"],
        )?;
        let schedule_seconds = HistogramVec::new(
            HistogramOpts::new(
                "schedule_duration_seconds",
                "Duration of one scheduling decision",
            )
            .buckets(vec![
                0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.05,
            ]),
            &["outcome"],
        )?;
        let schedule_failures = IntCounterVec::new(
            Opts::new(
                "schedule_rejections_total",
                "Pools rejected per reason in decisions that placed nothing",
            ),
            &["reason"],
        )?;
        let pools = IntGaugeVec::new(Opts::new("pools", "Pools by state"), &["state"])?;
        let leader = IntGauge::new("leader", "1 while this instance is the leader")?;
        let migrations = IntGaugeVec::new(
            Opts::new("migrations", "VolumeMigrations by phase and status"),
            &["phase", "status"],
        )?;
        let migration_switch_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "migration_switch_duration_seconds",
                "Time from the switch-over being enabled to its success",
            )
            .buckets(vec![0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0]),
        )?;
        let migration_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "migration_duration_seconds",
                "Time from a VolumeMigration's creation to Finished",
            )
            .buckets(vec![
                1.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0, 86400.0,
            ]),
        )?;
        let group_members = IntGaugeVec::new(
            Opts::new(
                "volume_group_member_info",
                "1 per member volume of a multi-disk volume (joins the agents' per-volume series with the PV)",
            ),
            &["pv", "group", "volume", "node"],
        )?;
        let replicated_health = IntGaugeVec::new(
            Opts::new(
                "replicated_volume_health",
                "1 for the current health of each replicated volume (healthy, rebuilding, degraded, failed), 0 for the others",
            ),
            &["pv", "health"],
        )?;
        let replica_rebuilt_bytes = IntGaugeVec::new(
            Opts::new(
                "replica_rebuilt_bytes",
                "Bytes rebuilt onto a replica of a replicated volume, as its assembling agent reports them",
            ),
            &["pv", "volume"],
        )?;
        registry.register(Box::new(replicated_health.clone()))?;
        registry.register(Box::new(replica_rebuilt_bytes.clone()))?;
        registry.register(Box::new(group_members.clone()))?;
        registry.register(Box::new(reconciles.clone()))?;
        registry.register(Box::new(schedule_seconds.clone()))?;
        registry.register(Box::new(schedule_failures.clone()))?;
        registry.register(Box::new(pools.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        registry.register(Box::new(migrations.clone()))?;
        registry.register(Box::new(migration_switch_seconds.clone()))?;
        registry.register(Box::new(migration_seconds.clone()))?;
        let pool_status = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "pool_status",
                    "1 for the status a pool has (ready, unknown, offline, locked), 0 for the others",
                ),
                &["pool", "status"],
            )?,
        )?;
        let pool_lease_age = register(
            &registry,
            GaugeVec::new(
                Opts::new(
                    "pool_lease_age_seconds",
                    "Seconds since the pool's agent last renewed its Lease (since the pool's creation when it never did)",
                ),
                &["pool"],
            )?,
        )?;
        let volume_not_ready = register(
            &registry,
            GaugeVec::new(
                Opts::new(
                    "volume_not_ready_since_timestamp_seconds",
                    "Creation time (Unix seconds) of a volume that is not ready yet and not being deleted; no series once it is ready",
                ),
                &["volume", "node", "pvc_namespace", "pvc"],
            )?,
        )?;
        let migration_copied = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "migration_copied_bytes",
                    "Bytes a migration under way has copied, as its source agent reported them",
                ),
                &MIGRATION_LABELS,
            )?,
        )?;
        let migration_size = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "migration_volume_size_bytes",
                    "Size of the volume a migration under way moves",
                ),
                &MIGRATION_LABELS,
            )?,
        )?;
        let migration_progress = register(
            &registry,
            GaugeVec::new(
                Opts::new(
                    "migration_last_progress_timestamp_seconds",
                    "Unix time at which a migration under way last moved on (started, changed phase or copied more), as this controller saw it",
                ),
                &MIGRATION_LABELS,
            )?,
        )?;
        Ok(Self {
            registry,
            reconciles,
            schedule_seconds,
            schedule_failures,
            pools,
            leader,
            migrations,
            migration_switch_seconds,
            migration_seconds,
            group_members,
            pool_status,
            pool_lease_age,
            volume_not_ready,
            migration_copied,
            migration_size,
            migration_progress,
            progress: Arc::default(),
            pools_shown: Shown::default(),
            volumes_shown: Shown::default(),
            migrations_shown: Shown::default(),
            replicated_health,
            replica_rebuilt_bytes,
        })
    }

    /// The pools as of a liveness tick: their status and Lease age; pools that are gone lose
    /// their series.
    pub fn observe_pools(&self, pools: &[PoolSample]) {
        for p in pools {
            for st in POOL_STATUSES {
                self.pool_status
                    .with_label_values(&[p.pool.as_str(), st])
                    .set(i64::from(st == p.status));
            }
            match p.lease_age_seconds {
                Some(age) => self
                    .pool_lease_age
                    .with_label_values(&[p.pool.as_str()])
                    .set(age.max(0.0)),
                None => {
                    let _ = self.pool_lease_age.remove_label_values(&[p.pool.as_str()]);
                }
            }
        }
        let now = pools.iter().map(|p| vec![p.pool.clone()]).collect();
        self.pools_shown.replace(now, |l| {
            for st in POOL_STATUSES {
                let _ = self.pool_status.remove_label_values(&[l[0], st]);
            }
            let _ = self.pool_lease_age.remove_label_values(l);
        });
    }

    /// The volumes that are not ready as of a liveness tick; the others lose their series.
    pub fn observe_volumes(&self, not_ready: &[VolumeSample]) {
        let mut now = BTreeSet::new();
        for v in not_ready {
            let l = [
                v.volume.as_str(),
                v.node.as_str(),
                v.pvc_namespace.as_str(),
                v.pvc.as_str(),
            ];
            self.volume_not_ready.with_label_values(&l).set(v.created);
            now.insert(l.map(str::to_string).to_vec());
        }
        self.volumes_shown.replace(now, |l| {
            let _ = self.volume_not_ready.remove_label_values(l);
        });
    }

    /// The migrations that are not finished, at Unix time `now`: bytes copied, volume size
    /// and when each last moved on (a migration seen for the first time moves on now). The
    /// others lose their series.
    pub fn observe_migrations(&self, migrations: &[MigrationSample], now: f64) {
        let mut progress = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
        let mut seen = BTreeMap::new();
        let mut shown = BTreeSet::new();
        for m in migrations {
            let p = match progress.remove(&m.migration) {
                Some(p) if p.phase == m.phase && p.copied_bytes >= m.copied_bytes => p,
                _ => Progress {
                    phase: m.phase,
                    copied_bytes: m.copied_bytes,
                    at: now,
                },
            };
            let l = [
                m.migration.as_str(),
                m.volume.as_str(),
                m.source_node.as_str(),
                m.dest_node.as_str(),
            ];
            self.migration_copied
                .with_label_values(&l)
                .set(i64::try_from(m.copied_bytes).unwrap_or(i64::MAX));
            match m.size_bytes {
                Some(size) => self
                    .migration_size
                    .with_label_values(&l)
                    .set(i64::try_from(size).unwrap_or(i64::MAX)),
                None => {
                    let _ = self.migration_size.remove_label_values(&l);
                }
            }
            self.migration_progress.with_label_values(&l).set(p.at);
            seen.insert(m.migration.clone(), p);
            shown.insert(l.map(str::to_string).to_vec());
        }
        *progress = seen;
        self.migrations_shown.replace(shown, |l| {
            let _ = self.migration_copied.remove_label_values(l);
            let _ = self.migration_size.remove_label_values(l);
            let _ = self.migration_progress.remove_label_values(l);
        });
    }

    /// This instance stopped leading: the per-object series describe what it no longer
    /// watches, so they go (the next leader reports them).
    pub fn forget_cluster(&self) {
        self.pool_status.reset();
        self.pool_lease_age.reset();
        self.volume_not_ready.reset();
        self.migration_copied.reset();
        self.migration_size.reset();
        self.migration_progress.reset();
        self.pools.reset();
        self.migrations.reset();
        self.replicated_health.reset();
        self.replica_rebuilt_bytes.reset();
        self.progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.pools_shown.clear();
        self.volumes_shown.clear();
        self.migrations_shown.clear();
    }

    /// The text exposition of every metric, and the process's `liteio_panics_total` (the
    /// same name in every component, hence outside the `liteio_controller_` registry).
    pub fn render(&self) -> String {
        let mut families = self.registry.gather();
        if let Ok(panics) = IntCounter::new("liteio_panics_total", liteio_node::panics::HELP) {
            panics.inc_by(liteio_node::panics::count());
            families.extend(prometheus::core::Collector::collect(&panics));
        }
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut buf = Vec::new();
        if TextEncoder::new().encode(&families, &mut buf).is_err() {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pool(name: &str, status: &'static str, age: Option<f64>) -> PoolSample {
        PoolSample {
            pool: name.into(),
            status,
            lease_age_seconds: age,
        }
    }

    fn migration(name: &str, phase: &'static str, copied: u64) -> MigrationSample {
        MigrationSample {
            migration: name.into(),
            volume: "pvc-m".into(),
            source_node: "n1".into(),
            dest_node: "n2".into(),
            phase,
            copied_bytes: copied,
            size_bytes: Some(1 << 30),
        }
    }

    /// The value of the line that starts with `series ` (name and labels as rendered).
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn pools_have_one_status_set_and_lose_their_series_when_gone() {
        let m = Metrics::new().unwrap();
        m.observe_pools(&[pool("n1", "ready", Some(3.5)), pool("n2", "offline", None)]);
        let t = m.render();
        let st = |p: &str, s: &str| {
            value(
                &t,
                &format!(r#"liteio_controller_pool_status{{pool="{p}",status="{s}"}}"#),
            )
        };
        assert_eq!(st("n1", "ready"), Some(1.0), "{t}");
        assert_eq!(st("n1", "offline"), Some(0.0), "{t}");
        assert_eq!(st("n2", "offline"), Some(1.0), "{t}");
        assert_eq!(st("n2", "ready"), Some(0.0), "{t}");
        assert_eq!(
            value(&t, r#"liteio_controller_pool_lease_age_seconds{pool="n1"}"#),
            Some(3.5)
        );
        assert!(!t.contains(r#"lease_age_seconds{pool="n2"}"#), "{t}");
        m.observe_pools(&[pool("n2", "ready", Some(1.0))]);
        let t = m.render();
        assert!(!t.contains(r#"pool="n1""#), "{t}");
        assert!(
            t.contains(r#"pool_status{pool="n2",status="ready"} 1"#),
            "{t}"
        );
    }

    #[test]
    fn volumes_not_ready_until_they_are() {
        let m = Metrics::new().unwrap();
        let v = |name: &str| VolumeSample {
            volume: name.into(),
            node: "n1".into(),
            pvc_namespace: "app".into(),
            pvc: "data".into(),
            created: 1_700_000_000.0,
        };
        m.observe_volumes(&[v("pvc-a"), v("pvc-b")]);
        let t = m.render();
        assert_eq!(
            value(
                &t,
                r#"liteio_controller_volume_not_ready_since_timestamp_seconds{node="n1",pvc="data",pvc_namespace="app",volume="pvc-a"}"#
            ),
            Some(1_700_000_000.0),
            "{t}"
        );
        m.observe_volumes(&[v("pvc-b")]);
        let t = m.render();
        assert!(!t.contains("pvc-a"), "{t}");
        assert!(t.contains("pvc-b"), "{t}");
    }

    #[test]
    fn a_migration_moves_on_when_its_phase_or_copy_does() {
        let m = Metrics::new().unwrap();
        let at = |m: &Metrics| {
            value(
                &m.render(),
                r#"liteio_controller_migration_last_progress_timestamp_seconds{dest_node="n2",migration="m1",source_node="n1",volume="pvc-m"}"#,
            )
        };
        m.observe_migrations(&[migration("m1", "Syncing", 0)], 100.0);
        assert_eq!(at(&m), Some(100.0));
        // Nothing new: the time stays.
        m.observe_migrations(&[migration("m1", "Syncing", 0)], 200.0);
        assert_eq!(at(&m), Some(100.0));
        // More copied.
        m.observe_migrations(&[migration("m1", "Syncing", 4096)], 300.0);
        assert_eq!(at(&m), Some(300.0));
        // Another phase.
        m.observe_migrations(&[migration("m1", "Cleaning", 4096)], 400.0);
        assert_eq!(at(&m), Some(400.0));
        let t = m.render();
        assert!(
            t.contains(r#"liteio_controller_migration_copied_bytes{dest_node="n2",migration="m1",source_node="n1",volume="pvc-m"} 4096"#),
            "{t}"
        );
        assert!(
            t.contains("liteio_controller_migration_volume_size_bytes{"),
            "{t}"
        );
        // Finished (no longer passed): its series go.
        m.observe_migrations(&[], 500.0);
        assert!(!m.render().contains("m1"), "{}", m.render());
    }

    #[test]
    fn a_standby_forgets_the_cluster() {
        let m = Metrics::new().unwrap();
        m.leader.set(1);
        m.observe_pools(&[pool("n1", "ready", Some(1.0))]);
        m.observe_migrations(&[migration("m1", "Syncing", 0)], 1.0);
        m.pools.with_label_values(&["ready"]).set(1);
        m.forget_cluster();
        m.leader.set(0);
        let t = m.render();
        for gone in ["pool=", "migration=", "liteio_controller_pools{"] {
            assert!(!t.contains(gone), "{gone}: {t}");
        }
        assert!(t.contains("liteio_controller_leader 0"), "{t}");
        // The same names come back when it leads again.
        m.observe_pools(&[pool("n1", "ready", Some(1.0))]);
        assert!(m.render().contains(r#"pool="n1""#));
    }

    #[test]
    fn panics_are_rendered_under_the_name_every_component_uses() {
        let t = Metrics::new().unwrap().render();
        assert!(t.contains("# TYPE liteio_panics_total counter"), "{t}");
        assert!(!t.contains("liteio_controller_panics"), "{t}");
    }
}
