//! Prometheus metrics of the controller, in a private registry. Labels are bounded: kinds,
//! results, reasons and pool states, never an error's text.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

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
}

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
        registry.register(Box::new(group_members.clone()))?;
        registry.register(Box::new(reconciles.clone()))?;
        registry.register(Box::new(schedule_seconds.clone()))?;
        registry.register(Box::new(schedule_failures.clone()))?;
        registry.register(Box::new(pools.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        registry.register(Box::new(migrations.clone()))?;
        registry.register(Box::new(migration_switch_seconds.clone()))?;
        registry.register(Box::new(migration_seconds.clone()))?;
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
        })
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}
