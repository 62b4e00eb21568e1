//! The controller's configuration file (LiteIO's controller config YAML, extended).
//!
//! ```yaml
//! scheduler:
//!   filters: [Basic, Affinity, MinLocalStorage]
//!   priorities: [LeastResource, PositionAdvice]
//!   maxRemoteVolumeCount: 3
//!   remoteIgnoreAnnoSelector: {obnvmf/regard-as-remote: "true"}
//!   lockSchedConfig:
//!     nodeSelector: [{key: maintenance, operator: Exists}]
//!     taints: [{key: node.kubernetes.io/unschedulable, operator: Exists}]
//!   minLocalStoragePct: 20
//!   nodeReservations: [{id: sys, size: 10Gi}]
//!   seed: 0
//!   thinOvercommitRatio: 1.0
//!   poolOvercommitRatios: {node-1: 2.0}
//! liveness: {unknownAfter: 3m, offlineAfter: 24h, tick: 15s}
//! leaderElection: {leaseName: node-disk-controller, leaseDuration: 15s, renewDeadline: 10s, retryPeriod: 2s}
//! metaSync: {sqlitePath: /var/lib/liteio/meta.db, cluster: prod}
//! # or, in production, PostgreSQL over TLS with the password in a Secret of the
//! # controller's namespace (or passwordEnv: VAR, or passwordFile: /path; at most one, and
//! # then no password in the URL):
//! # metaSync:
//! #   postgresUrl: "postgres://liteio@db:5432/liteio?sslmode=verify-full"
//! #   passwordSecret: {name: liteio-metasync, key: password}
//! #   caFile: /etc/liteio/pg-ca.pem
//! #   cluster: prod
//! pluginConfigs: {}
//! reconcileTimeout: 60s
//! # Keep a Role per storage node that lets the node's own identity (system:node:<node>)
//! # read the key Secrets of the volumes stored on it, and no others (docs/auth.md).
//! nodeKeyAccess: true
//! # A replica of a replicated volume that its assembling agent reports failed or missing
//! # for this long is replaced (at once when its node's pool is offline or unknown).
//! replicaReplaceGrace: 20s
//! # Reconciles run at once per kind, never two of one object (defaults shown).
//! workers: {volume: 16, snapshot: 8, pool: 4, migration: 4, keyAccess: 4, group: 4, dataControl: 4}
//! ```
//!
//! Every section and field is optional; an absent `pluginConfigs` is never fatal (LiteIO's
//! ant plug-in factory exited on it). Errors name the field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Toleration};
use serde::{Deserialize, Deserializer, Serialize};

use crate::error::{Error, Result};
use crate::redact::redact_url_passwords;

// The `metaSync:` section is the mirror's own (its checks need the PostgreSQL URL's rules).
pub use crate::metasync::settings::{MetaSyncConfig, MetaSyncTarget};

/// Names of the scheduler's filters.
pub const FILTERS: [&str; 3] = ["Basic", "Affinity", "MinLocalStorage"];
/// Names of the scheduler's priorities.
pub const PRIORITIES: [&str; 2] = ["LeastResource", "PositionAdvice"];

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct Config {
    /// Scheduler settings.
    pub scheduler: SchedulerConfig,
    /// Pool liveness timings.
    pub liveness: LivenessConfig,
    /// Leader election timings.
    pub leader_election: LeaderElectionConfig,
    /// The SQL metadata mirror; disabled when absent.
    pub meta_sync: Option<MetaSyncConfig>,
    /// Free-form settings of registered plug-ins (accepted and kept; unused by the built-ins).
    pub plugin_configs: Option<serde_json::Value>,
    /// Bound of one reconcile of one object (default 60s): past it the reconcile is
    /// abandoned and the object retried with back-off, so that one hung API request does not
    /// stop the other objects of its kind.
    #[serde(deserialize_with = "de_duration")]
    pub reconcile_timeout: Duration,
    /// Keep, for each storage node, the Role `liteio-keys-<node>` and its RoleBinding to
    /// `system:node:<node>`, which let that node get, patch and delete the authentication
    /// Secrets of the volumes stored on it and no others (default true). Off: the disk-agents
    /// read keys with their own ServiceAccount.
    pub node_key_access: bool,
    /// How long a replica of a replicated volume may be reported `failed` or `missing` by
    /// its assembling agent before the controller replaces it (default 20s). A replica whose
    /// node's pool is `offline` or `unknown` is replaced at once.
    #[serde(deserialize_with = "de_duration")]
    pub replica_replace_grace: Duration,
    /// Reconcile workers per kind (`workers:`).
    pub workers: Workers,
}

/// How many objects of each kind are reconciled at once (`workers:`). Each kind has its own
/// queue and workers, so a burst of one kind never delays another; within a kind the queue
/// hands a key to one worker at a time (a key changed while it runs is reconciled again
/// afterwards), in the order the changes came.
///
/// The defaults keep the controller's requests in flight (one per worker at most: 44) well
/// under a sixth of the seats the API server's Priority and Fairness gives service accounts
/// by default (`workload-low`: 100 of 245 shares of 600 seats, about 245), since kube-rs
/// has no client-side rate limit of its own.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct Workers {
    /// AntstorVolumes (default 16): scheduling and binding, release on deletion.
    pub volume: u32,
    /// AntstorSnapshots (default 8).
    pub snapshot: u32,
    /// StoragePools (default 4): liveness and status.
    pub pool: u32,
    /// VolumeMigrations (default 4).
    pub migration: u32,
    /// Storage nodes' key access (default 4).
    pub key_access: u32,
    /// AntstorVolumeGroups (default 4).
    pub group: u32,
    /// AntstorDataControls (default 4).
    pub data_control: u32,
}

/// Most workers of one kind.
pub const MAX_WORKERS: u32 = 256;

impl Default for Workers {
    fn default() -> Self {
        Self {
            volume: 16,
            snapshot: 8,
            pool: 4,
            migration: 4,
            key_access: 4,
            group: 4,
            data_control: 4,
        }
    }
}

impl Workers {
    /// Every kind with its field name and count.
    pub fn fields(&self) -> [(&'static str, u32); 7] {
        [
            ("volume", self.volume),
            ("snapshot", self.snapshot),
            ("pool", self.pool),
            ("migration", self.migration),
            ("keyAccess", self.key_access),
            ("group", self.group),
            ("dataControl", self.data_control),
        ]
    }

    /// The same count for every kind (tests, benchmarks).
    pub fn all(n: u32) -> Self {
        Self {
            volume: n,
            snapshot: n,
            pool: n,
            migration: n,
            key_access: n,
            group: n,
            data_control: n,
        }
    }
}

/// Default of [`Config::replica_replace_grace`]: long enough for an agent restart or a short
/// link flap (the raid's initiator reconnects for a minute), short enough that a lost replica
/// is rebuilt soon.
pub const DEFAULT_REPLICA_REPLACE_GRACE: Duration = Duration::from_secs(20);

/// Default of [`Config::reconcile_timeout`].
pub const DEFAULT_RECONCILE_TIMEOUT: Duration = Duration::from_secs(60);

impl Default for Config {
    fn default() -> Self {
        Self {
            scheduler: SchedulerConfig::default(),
            liveness: LivenessConfig::default(),
            leader_election: LeaderElectionConfig::default(),
            meta_sync: None,
            plugin_configs: None,
            reconcile_timeout: DEFAULT_RECONCILE_TIMEOUT,
            node_key_access: true,
            replica_replace_grace: DEFAULT_REPLICA_REPLACE_GRACE,
            workers: Workers::default(),
        }
    }
}

/// Scheduler settings (`scheduler:`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct SchedulerConfig {
    /// Filters, in order; a pool must pass all.
    pub filters: Vec<String>,
    /// Priorities; the pool with the highest sum wins.
    pub priorities: Vec<String>,
    /// Most remote volumes one pool serves.
    pub max_remote_volume_count: u32,
    /// Volumes carrying any of these annotation=value pairs do not count as remote.
    pub remote_ignore_anno_selector: BTreeMap<String, String>,
    /// Pools whose node matches are locked.
    pub lock_sched_config: LockSchedConfig,
    /// Floor of local storage a remote volume must leave free, in percent of the pool.
    pub min_local_storage_pct: u32,
    /// Reservations added to every pool.
    pub node_reservations: Vec<NodeReservation>,
    /// Label filter of the Node watch (LiteIO's `nodeCacheSelector`).
    pub node_cache_selector: BTreeMap<String, String>,
    /// Seed of the deterministic tie break.
    pub seed: u64,
    /// Bound of Σ virtual sizes of thin volumes, as a multiple of the pool's available bytes.
    pub thin_overcommit_ratio: f64,
    /// Per-pool overrides of [`SchedulerConfig::thin_overcommit_ratio`].
    pub pool_overcommit_ratios: BTreeMap<String, f64>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            filters: vec!["Basic".into(), "Affinity".into()],
            priorities: vec!["LeastResource".into(), "PositionAdvice".into()],
            max_remote_volume_count: 3,
            remote_ignore_anno_selector: BTreeMap::new(),
            lock_sched_config: LockSchedConfig::default(),
            min_local_storage_pct: 0,
            node_reservations: Vec::new(),
            node_cache_selector: BTreeMap::new(),
            seed: 0,
            thin_overcommit_ratio: 1.0,
            pool_overcommit_ratios: BTreeMap::new(),
        }
    }
}

impl SchedulerConfig {
    /// The thin overcommit ratio of `pool`.
    pub fn overcommit_ratio(&self, pool: &str) -> f64 {
        self.pool_overcommit_ratios
            .get(pool)
            .copied()
            .unwrap_or(self.thin_overcommit_ratio)
    }
}

/// Which nodes lock their pool (`scheduler.lockSchedConfig`).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct LockSchedConfig {
    /// A node matching any requirement is locked.
    pub node_selector: Vec<NodeSelectorRequirement>,
    /// A node with a taint that any of these tolerates is locked.
    #[serde(alias = "nodeTaints")]
    pub taints: Vec<Toleration>,
}

/// A capacity reservation held on every pool until a volume with its id is bound there.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct NodeReservation {
    /// Reservation id (matches `obnvmf/reservation-id` or `pvcNamespace/pvcName`).
    pub id: String,
    /// Bytes (an integer or a quantity such as `10Gi`).
    #[serde(deserialize_with = "de_bytes")]
    pub size: u64,
}

/// Pool liveness timings (`liveness:`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct LivenessConfig {
    /// A pool whose Lease was not renewed for this long becomes `unknown` (LiteIO: 3 min).
    #[serde(deserialize_with = "de_duration")]
    pub unknown_after: Duration,
    /// … and `offline` after this long (LiteIO: 24 h).
    #[serde(deserialize_with = "de_duration")]
    pub offline_after: Duration,
    /// Period of the liveness clock.
    #[serde(deserialize_with = "de_duration")]
    pub tick: Duration,
    /// A deleted volume on a pool that is not ready loses its agent finalizers after this.
    #[serde(deserialize_with = "de_duration")]
    pub dead_pool_deletion_grace: Duration,
    /// The pool of a vanished node is deleted after it is this old (and empty, not ready).
    #[serde(deserialize_with = "de_duration")]
    pub vanished_pool_grace: Duration,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        Self {
            unknown_after: Duration::from_secs(180),
            offline_after: Duration::from_secs(24 * 3600),
            tick: Duration::from_secs(15),
            dead_pool_deletion_grace: Duration::from_secs(20 * 60),
            vanished_pool_grace: Duration::from_secs(10 * 60),
        }
    }
}

/// Leader election timings (`leaderElection:`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct LeaderElectionConfig {
    /// Name of the Lease in the controller's namespace.
    pub lease_name: String,
    /// How long a holder's claim lasts without renewal.
    #[serde(deserialize_with = "de_duration")]
    pub lease_duration: Duration,
    /// The leader steps down when no renewal succeeded for this long (counted from when the
    /// last successful one was sent); also the bound on every election request. Shorter than
    /// `leaseDuration`: the difference is the margin that keeps an old and a new leader apart.
    #[serde(deserialize_with = "de_duration")]
    pub renew_deadline: Duration,
    /// Period of acquire / renew attempts.
    #[serde(deserialize_with = "de_duration")]
    pub retry_period: Duration,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        Self {
            lease_name: "node-disk-controller".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl Config {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ConfigRead {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            Error::ConfigParse { field, message, .. } => Error::ConfigParse {
                path: path.to_path_buf(),
                field,
                message,
            },
            other => other,
        })
    }

    /// Parses and validates YAML text. An empty text is the default config.
    pub fn parse(text: &str) -> Result<Self> {
        let config = if text.trim().is_empty() {
            Config::default()
        } else {
            let de = serde_yaml::Deserializer::from_str(text);
            serde_path_to_error::deserialize::<_, Config>(de).map_err(|e| {
                let field = redact_url_passwords(&e.path().to_string());
                Error::ConfigParse {
                    path: PathBuf::from("<text>"),
                    field: if field == "." { "(root)".into() } else { field },
                    message: redact_url_passwords(&e.into_inner().to_string()),
                }
            })?
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges and consistency; the error names the first bad field.
    pub fn validate(&self) -> Result<()> {
        let s = &self.scheduler;
        for (i, f) in s.filters.iter().enumerate() {
            if !FILTERS.contains(&f.as_str()) {
                return Err(Error::config(
                    format!("scheduler.filters[{i}]"),
                    format!("{f:?} is not one of {}", FILTERS.join(", ")),
                ));
            }
        }
        for (i, p) in s.priorities.iter().enumerate() {
            if !PRIORITIES.contains(&p.as_str()) {
                return Err(Error::config(
                    format!("scheduler.priorities[{i}]"),
                    format!("{p:?} is not one of {}", PRIORITIES.join(", ")),
                ));
            }
        }
        if s.min_local_storage_pct > 100 {
            return Err(Error::config(
                "scheduler.minLocalStoragePct",
                format!("{} is above 100", s.min_local_storage_pct),
            ));
        }
        let mut ids = std::collections::BTreeSet::new();
        for (i, r) in s.node_reservations.iter().enumerate() {
            if r.id.trim().is_empty() {
                return Err(Error::config(
                    format!("scheduler.nodeReservations[{i}].id"),
                    "must not be empty",
                ));
            }
            if r.size == 0 {
                return Err(Error::config(
                    format!("scheduler.nodeReservations[{i}].size"),
                    "must be positive",
                ));
            }
            if !ids.insert(r.id.as_str()) {
                return Err(Error::config(
                    format!("scheduler.nodeReservations[{i}].id"),
                    format!("{:?} appears twice", r.id),
                ));
            }
        }
        for (i, req) in s.lock_sched_config.node_selector.iter().enumerate() {
            if let Err(e) = crate::selector::Requirement::from_node_selector(req) {
                return Err(Error::config(
                    format!("scheduler.lockSchedConfig.nodeSelector[{i}]"),
                    e.to_string(),
                ));
            }
        }
        for (i, t) in s.lock_sched_config.taints.iter().enumerate() {
            match t.operator.as_deref() {
                None | Some("Equal") | Some("Exists") => {}
                Some(op) => {
                    return Err(Error::config(
                        format!("scheduler.lockSchedConfig.taints[{i}].operator"),
                        format!("{op:?} is not one of \"Equal\", \"Exists\""),
                    ));
                }
            }
        }
        check_ratio("scheduler.thinOvercommitRatio", s.thin_overcommit_ratio)?;
        for (pool, r) in &s.pool_overcommit_ratios {
            check_ratio(&format!("scheduler.poolOvercommitRatios[{pool}]"), *r)?;
        }
        if self.reconcile_timeout.is_zero() {
            return Err(Error::config("reconcileTimeout", "must be positive"));
        }
        for (field, n) in self.workers.fields() {
            if n == 0 || n > MAX_WORKERS {
                return Err(Error::config(
                    format!("workers.{field}"),
                    format!("{n} is not between 1 and {MAX_WORKERS}"),
                ));
            }
        }
        let l = &self.liveness;
        for (field, d) in [
            ("liveness.unknownAfter", l.unknown_after),
            ("liveness.offlineAfter", l.offline_after),
            ("liveness.tick", l.tick),
        ] {
            if d.is_zero() {
                return Err(Error::config(field, "must be positive"));
            }
        }
        if l.offline_after <= l.unknown_after {
            return Err(Error::config(
                "liveness.offlineAfter",
                format!(
                    "{:?} must be longer than liveness.unknownAfter ({:?})",
                    l.offline_after, l.unknown_after
                ),
            ));
        }
        let e = &self.leader_election;
        if e.lease_name.is_empty() {
            return Err(Error::config(
                "leaderElection.leaseName",
                "must not be empty",
            ));
        }
        if e.retry_period.is_zero() {
            return Err(Error::config(
                "leaderElection.retryPeriod",
                "must be positive",
            ));
        }
        if e.renew_deadline >= e.lease_duration {
            return Err(Error::config(
                "leaderElection.renewDeadline",
                format!(
                    "{:?} must be shorter than leaderElection.leaseDuration ({:?})",
                    e.renew_deadline, e.lease_duration
                ),
            ));
        }
        if e.retry_period >= e.renew_deadline {
            return Err(Error::config(
                "leaderElection.retryPeriod",
                format!(
                    "{:?} must be shorter than leaderElection.renewDeadline ({:?})",
                    e.retry_period, e.renew_deadline
                ),
            ));
        }
        if let Some(m) = &self.meta_sync {
            m.target()?;
        }
        Ok(())
    }
}

fn check_ratio(field: &str, r: f64) -> Result<()> {
    if !r.is_finite() || r < 1.0 {
        return Err(Error::config(
            field,
            format!("{r} must be a finite number of at least 1.0"),
        ));
    }
    Ok(())
}

/// Parses `500ms`, `90s`, `3m`, `24h`, `1h30m` or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(|| format!("{s:?} lacks a unit (ms, s, m, h)"))?;
        if digits == 0 {
            return Err(format!("{s:?} is not a duration such as 90s, 3m or 24h"));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("{s:?} has a number out of range"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let d = match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.saturating_mul(60)),
            "h" => Duration::from_secs(n.saturating_mul(3600)),
            _ => return Err(format!("{s:?} has unknown unit {unit:?} (ms, s, m, h)")),
        };
        total = total.saturating_add(d);
    }
    Ok(total)
}

#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrString {
    Num(u64),
    Str(String),
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Duration, D::Error> {
    match NumOrString::deserialize(d)? {
        NumOrString::Num(n) => Ok(Duration::from_secs(n)),
        NumOrString::Str(s) => parse_duration(&s).map_err(serde::de::Error::custom),
    }
}

fn de_bytes<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    match NumOrString::deserialize(d)? {
        NumOrString::Num(n) => Ok(n),
        NumOrString::Str(s) => {
            liteio_api::size::parse_quantity_str(&s).map_err(serde::de::Error::custom)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn defaults_match_liteio() {
        let c = Config::parse("").unwrap();
        assert_eq!(c.scheduler.filters, ["Basic", "Affinity"]);
        assert_eq!(c.scheduler.priorities, ["LeastResource", "PositionAdvice"]);
        assert_eq!(c.scheduler.max_remote_volume_count, 3);
        assert_eq!(c.liveness.unknown_after, Duration::from_secs(180));
        assert_eq!(c.liveness.offline_after, Duration::from_secs(86_400));
        assert!(c.plugin_configs.is_none());
        assert!(c.meta_sync.is_none());
    }

    #[test]
    fn full_liteio_file_parses() {
        let c = Config::parse(
            r#"
scheduler:
  maxRemoteVolumeCount: 5
  remoteIgnoreAnnoSelector:
    obnvmf/regard-as-remote: "true"
  filters: [Basic, Affinity, MinLocalStorage]
  priorities: [LeastResource]
  lockSchedConfig:
    nodeSelector:
    - key: maintenance
      operator: In
      values: ["yes"]
    nodeTaints:
    - key: node.kubernetes.io/unschedulable
      operator: Exists
  minLocalStoragePct: 20
  nodeReservations:
  - id: sys
    size: 10Gi
  - id: other
    size: 4096
  poolOvercommitRatios:
    node-1: 2.5
liveness:
  unknownAfter: 90s
  offlineAfter: 1h30m
pluginConfigs:
  defaultLocalSpaceRules: []
  autoAdjustLocal: true
"#,
        )
        .unwrap();
        assert_eq!(c.scheduler.max_remote_volume_count, 5);
        assert_eq!(c.scheduler.lock_sched_config.taints.len(), 1);
        assert_eq!(c.scheduler.node_reservations[0].size, 10 << 30);
        assert_eq!(c.scheduler.node_reservations[1].size, 4096);
        assert_eq!(c.scheduler.overcommit_ratio("node-1"), 2.5);
        assert_eq!(c.scheduler.overcommit_ratio("node-2"), 1.0);
        assert_eq!(c.liveness.unknown_after, Duration::from_secs(90));
        assert_eq!(c.liveness.offline_after, Duration::from_secs(5400));
        assert!(c.plugin_configs.is_some());
        assert_eq!(
            c.replica_replace_grace,
            Duration::from_secs(20),
            "the default"
        );
        let c = Config::parse("replicaReplaceGrace: 45s\n").unwrap();
        assert_eq!(c.replica_replace_grace, Duration::from_secs(45));
        assert_eq!(c.workers, Workers::default(), "the default");
        let c = Config::parse("workers: {volume: 32, keyAccess: 1}\n").unwrap();
        assert_eq!((c.workers.volume, c.workers.key_access), (32, 1));
        assert_eq!(
            c.workers.pool,
            Workers::default().pool,
            "unset keeps the default"
        );
    }

    #[test]
    fn errors_name_the_field() {
        let cases: &[(&str, &str)] = &[
            (
                "scheduler:\n  filters: [Basic, Nope]\n",
                "scheduler.filters[1]",
            ),
            (
                "scheduler:\n  priorities: [Most]\n",
                "scheduler.priorities[0]",
            ),
            (
                "scheduler:\n  minLocalStoragePct: 101\n",
                "scheduler.minLocalStoragePct",
            ),
            (
                "scheduler:\n  maxRemoteVolumeCount: many\n",
                "scheduler.maxRemoteVolumeCount",
            ),
            (
                "scheduler:\n  nodeReservations: [{id: a, size: 0}]\n",
                "scheduler.nodeReservations[0].size",
            ),
            (
                "scheduler:\n  nodeReservations: [{id: a, size: 1}, {id: a, size: 2}]\n",
                "scheduler.nodeReservations[1].id",
            ),
            (
                "scheduler:\n  nodeReservations: [{id: a, size: 1Zi}]\n",
                "scheduler.nodeReservations[0].size",
            ),
            (
                "scheduler:\n  lockSchedConfig:\n    nodeSelector: [{key: a, operator: Near}]\n",
                "scheduler.lockSchedConfig.nodeSelector[0]",
            ),
            (
                "scheduler:\n  thinOvercommitRatio: 0.5\n",
                "scheduler.thinOvercommitRatio",
            ),
            (
                "liveness:\n  unknownAfter: 2h\n  offlineAfter: 1h\n",
                "liveness.offlineAfter",
            ),
            ("liveness:\n  tick: 5 parsecs\n", "liveness.tick"),
            ("reconcileTimeout: 0s\n", "reconcileTimeout"),
            ("reconcileTimeout: soon\n", "reconcileTimeout"),
            ("workers: {volume: 0}\n", "workers.volume"),
            ("workers: {dataControl: 257}\n", "workers.dataControl"),
            ("workers: {volumes: 4}\n", "workers"),
            ("workers: {keyAccess: -1}\n", "workers.keyAccess"),
            ("replicaReplaceGrace: a while\n", "replicaReplaceGrace"),
            (
                "leaderElection:\n  leaseDuration: 5s\n  renewDeadline: 10s\n",
                "leaderElection.renewDeadline",
            ),
            ("metaSync: {cluster: c}\n", "metaSync: set sqlitePath"),
            (
                "metaSync: {sqlitePath: /m.db, postgresUrl: \"postgres://h/db\"}\n",
                "metaSync: set exactly one of sqlitePath and postgresUrl",
            ),
            ("metaSync: {sqlitePath: \"\"}\n", "metaSync.sqlitePath"),
            (
                "metaSync: {postgresUrl: \"mysql://h/db\"}\n",
                "metaSync.postgresUrl: must be a URL starting with postgres://",
            ),
            (
                "metaSync: {postgresUrl: \"postgres://u:pw@h:port/db\"}\n",
                "metaSync.postgresUrl: is not a valid PostgreSQL URL",
            ),
            ("metaSync: {postgresUrl: 5}\n", "metaSync.postgresUrl"),
            (
                "metaSync: {postgresUrl: \"postgres://u:pw@h/db\", passwordEnv: PGPW}\n",
                "metaSync.postgresUrl: holds a password and metaSync.passwordEnv is set too",
            ),
            (
                "metaSync: {postgresUrl: \"postgres://u@h/db\", passwordEnv: A, passwordFile: /p}\n",
                "metaSync: set at most one of passwordSecret, passwordEnv and passwordFile, \
                 not passwordEnv and passwordFile",
            ),
            (
                "metaSync: {sqlitePath: /m.db, passwordFile: /p}\n",
                "metaSync.passwordFile: is for postgresUrl",
            ),
            (
                "metaSync: {postgresUrl: \"postgres://u@h/db?sslmode=verify-full\"}\n",
                "metaSync.caFile: sslmode=verify-full needs the CA",
            ),
            (
                "metaSync: {postgresUrl: \"postgres://u@h/db?sslmode=disable\", caFile: /ca.pem}\n",
                "metaSync.caFile: a CA is set but sslmode=disable",
            ),
            (
                "metaSync: {postgresUrl: \"postgres://u@h/db?sslmode=require&sslrootcert=/a.pem\", caFile: /ca.pem}\n",
                "metaSync.caFile: set, and the URL sets sslrootcert too",
            ),
            (
                "metaSync: {postgresUrl: \"postgres://u@h/db\", passwordSecret: {name: \"\", key: k}}\n",
                "metaSync.passwordSecret.name: must not be empty",
            ),
            (
                "metaSync: {postgresUrl: \"postgres://u@h/db\", passwordSecret: {name: s}}\n",
                "metaSync.passwordSecret",
            ),
            (
                "metaSync: {postgresUrl: \"postgres://u@h/db\", passwordEnv: \"\"}\n",
                "metaSync.passwordEnv: must be the name",
            ),
        ];
        for (text, field) in cases {
            let err = Config::parse(text).expect_err(text).to_string();
            assert!(err.contains(field), "{text:?} gave {err:?}, wanted {field}");
        }
    }

    #[test]
    fn meta_sync_targets() {
        let c = Config::parse("metaSync: {sqlitePath: /var/lib/liteio/meta.db, cluster: prod}")
            .unwrap();
        let m = c.meta_sync.unwrap();
        assert_eq!(
            m.target().unwrap(),
            MetaSyncTarget::Sqlite("/var/lib/liteio/meta.db".into())
        );
        assert_eq!(m.cluster, "prod");
        let url = "postgres://liteio:s3cret@db:5432/liteio?sslmode=disable";
        let c = Config::parse(&format!("metaSync: {{postgresUrl: \"{url}\"}}")).unwrap();
        let m = c.meta_sync.unwrap();
        assert_eq!(m.target().unwrap(), MetaSyncTarget::Postgres(url.into()));
        let debug = format!("{m:?}");
        assert!(
            debug.contains("postgres://liteio@db:5432/liteio"),
            "{debug}"
        );
        assert!(!debug.contains("s3cret"), "{debug}");
        let c = Config::parse(
            "metaSync: {postgresUrl: \"postgres://liteio@db/m?sslmode=verify-full\", \
             passwordSecret: {name: pg, key: password}, caFile: /etc/ca.pem}",
        )
        .unwrap();
        let m = c.meta_sync.unwrap();
        let debug = format!("{m:?}");
        assert!(
            debug.contains("name: \"pg\"") && debug.contains("/etc/ca.pem"),
            "{debug}"
        );
        let err = Config::parse("metaSync: {postgresUrl: \"postgres://u:s3cret@h:x/db\"}")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("s3cret"), "{err}");
    }

    /// Found by the issue 16 sweep: a URL with a password written where the config
    /// expects another type was quoted, password and all, in the parse error.
    #[test]
    fn parse_errors_do_not_quote_url_passwords() {
        let err = Config::parse("metaSync: \"postgres://u:s3cret@db:5432/m\"\n")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("s3cret"), "{err}");
        assert!(err.contains("postgres://u:<redacted>@db:5432/m"), "{err}");
        assert_eq!(
            redact_url_passwords("a postgres://u:p@w:rd@h/x?y b http://h:1/ c postgres://u@h"),
            "a postgres://u:<redacted>@h/x?y b http://h:1/ c postgres://u@h"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("3m"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("42"), Ok(Duration::from_secs(42)));
        assert!(parse_duration("3 weeks").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("10").is_ok());
        assert!(parse_duration("10x").is_err());
    }
}
