//! Volume placement: pure functions over the [`State`].
//!
//! A pool must pass every configured filter (`Basic`, `Affinity`, `MinLocalStorage`); among
//! the survivors the highest sum of priority scores (`LeastResource`, `PositionAdvice`) wins,
//! and ties are broken by a hash of (seed, pool name), so a decision is reproducible. When no
//! pool fits, the error counts the pools rejected per reason:
//! `NoStoragePoolAvailable: PoolFreeSize: 2, PositionAdvice: 1`.
//!
//! ## Where the consumer is
//!
//! A volume is *remote* on a pool when its consumer runs on another node; then the pool's SPDK
//! target must export it (a broken one rejects the pool: `SpdkUnhealthy`), it counts against
//! `maxRemoteVolumeCount` and `minLocalStoragePct`, and `MustLocal` rejects the pool.
//! - With `spec.hostNode` (the CO's requested topology, or the PVC's selected node), the
//!   volume is local on the host's own pool and remote on every other.
//! - **Without a requested topology** (no `spec.hostNode`: a CO that sent no accessibility
//!   requirement) the volume is placed where it can be used: it is local on every pool, and
//!   when the controller binds it, the chosen pool's node becomes its `spec.hostNode`. The
//!   only exception is `MustRemote`, which stays host-less and remote on pools that can export
//!   it (and is rejected by the others).
//! - A volume bound local without a requested topology, or placed on a pool that cannot
//!   export ([`can_export`]: a file or LVM pool whose agent has no working SPDK target; its
//!   `Spdk` condition is `Error`), can be used only on that node: the controller sets
//!   `obnvmf/local-only: "true"` when it binds it, and the CSI controller returns the node as
//!   the volume's `accessible_topology`, so that the CO puts the consumer there (a PV's node
//!   affinity). The data of such a volume does not move by itself when a consumer appears
//!   elsewhere.
//!
//! Differences from LiteIO (its gaps 17 and 19): the free-space check includes the incoming
//! volume's snapshot reserve, `LeastResource` uses the state's exact free space, ties are
//! deterministic, a volume without a host node is remote everywhere instead of a nil
//! dereference, malformed selector annotations reject the volume with a message instead
//! of being ignored, and thin volumes are bounded by a per-pool overcommit ratio.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::NodeAffinity;
use liteio_api::common::{PoolMode, VolumePosition, VolumeType};
use liteio_api::keys::annotations;
use liteio_api::{AntstorVolume, StoragePool};

use crate::config::SchedulerConfig;
use crate::selector::{Requirement, Selector};
use crate::state::{self, PoolView, State};

/// Why a pool was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Reason {
    /// Not ready, locked or being deleted.
    PoolUnschedulable,
    /// Not enough free space.
    PoolFreeSize,
    /// The volume's reservation on this pool is smaller than the volume.
    ReservationTooSmall,
    /// The pool holds no reservation with the volume's id.
    ReservationNotMatch,
    /// Thin volumes would exceed the pool's overcommit bound.
    ThinOvercommit,
    /// The SPDK data engine is unhealthy.
    SpdkUnhealthy,
    /// The pool already serves `maxRemoteVolumeCount` remote volumes.
    RemoteVolMaxCount,
    /// `MustLocal` / `MustRemote` not satisfied.
    PositionAdvice,
    /// The volume type needs another engine.
    VolTypeNotMatch,
    /// Node affinity or `obnvmf/node-label-selector` not satisfied.
    NodeAffinity,
    /// Pool affinity or `obnvmf/pool-label-selector` not satisfied.
    PoolAffinity,
    /// A remote volume would leave less local storage than `minLocalStoragePct`.
    LocalStorageTooLow,
    /// `obnvmf/selected-tgt-node` names a pool that does not exist.
    SelectedNodeNotFound,
    /// The volume has QoS limits (`spec.qos`) and the pool's engine cannot enforce them
    /// (only SPDK's can). Not in LiteIO.
    QosNotEnforced,
    /// A volume group's member and the pool holds no volume while the group does not allow
    /// empty nodes (`stragety.allowEmptyNode`).
    EmptyNode,
}

impl Reason {
    /// Stable name (also a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PoolUnschedulable => "PoolUnschedulable",
            Self::PoolFreeSize => "PoolFreeSize",
            Self::ReservationTooSmall => "ReservationTooSmall",
            Self::ReservationNotMatch => "ReservationNotMatch",
            Self::ThinOvercommit => "ThinOvercommit",
            Self::SpdkUnhealthy => "SpdkUnhealthy",
            Self::RemoteVolMaxCount => "RemoteVolMaxCount",
            Self::PositionAdvice => "PositionAdvice",
            Self::VolTypeNotMatch => "VolTypeNotMatch",
            Self::NodeAffinity => "NodeAffinity",
            Self::PoolAffinity => "PoolAffinity",
            Self::LocalStorageTooLow => "LocalStorageTooLow",
            Self::SelectedNodeNotFound => "SelectedNodeNotFound",
            Self::QosNotEnforced => "QosNotEnforced",
            Self::EmptyNode => "EmptyNode",
        }
    }
}

/// Rejected pools counted per reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rejections(pub BTreeMap<Reason, u32>);

impl fmt::Display for Rejections {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("NoStoragePoolAvailable: no storage pool exists");
        }
        let mut v: Vec<(Reason, u32)> = self.0.iter().map(|(r, n)| (*r, *n)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.as_str().cmp(b.0.as_str())));
        let parts: Vec<String> = v
            .iter()
            .map(|(r, n)| format!("{}: {n}", r.as_str()))
            .collect();
        write!(f, "NoStoragePoolAvailable: {}", parts.join(", "))
    }
}

/// Why a volume cannot be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// No pool passed the filters.
    #[error("{0}")]
    NoStoragePoolAvailable(Rejections),
    /// The volume itself is invalid (a malformed selector, a bad affinity term).
    #[error("invalid volume: {field}: {reason}")]
    InvalidVolume {
        /// The offending field.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

/// Where a volume goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The chosen pool (= node).
    pub node: String,
    /// Its total priority score.
    pub score: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Filter {
    Basic,
    Affinity,
    MinLocalStorage,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Priority {
    LeastResource,
    PositionAdvice,
}

/// A configured scheduler; cheap to clone, holds no state of its own.
#[derive(Debug, Clone)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    filters: Vec<Filter>,
    priorities: Vec<Priority>,
}

type Terms = Vec<(Vec<Requirement>, Vec<Requirement>)>;

/// The parts of a volume the filters read, parsed once per decision.
#[derive(Debug)]
struct Prepared<'a> {
    vol: &'a AntstorVolume,
    need: u64,
    thin_virtual: u64,
    host: Option<&'a str>,
    ignored_as_remote: bool,
    node_terms: Option<Terms>,
    pool_terms: Option<Terms>,
    node_selector: Option<Selector>,
    pool_selector: Option<Selector>,
    reservation: Option<String>,
}

fn invalid(field: &str, reason: impl fmt::Display) -> ScheduleError {
    ScheduleError::InvalidVolume {
        field: field.to_string(),
        reason: reason.to_string(),
    }
}

fn parse_terms(a: &Option<NodeAffinity>, field: &str) -> Result<Option<Terms>, ScheduleError> {
    let Some(sel) = a.as_ref().and_then(|a| {
        a.required_during_scheduling_ignored_during_execution
            .as_ref()
    }) else {
        return Ok(None);
    };
    let mut out = Vec::new();
    for (i, t) in sel.node_selector_terms.iter().enumerate() {
        let conv = |list: &Option<Vec<_>>, what: &str| -> Result<Vec<Requirement>, ScheduleError> {
            list.as_deref()
                .unwrap_or_default()
                .iter()
                .enumerate()
                .map(|(j, r)| {
                    Requirement::from_node_selector(r).map_err(|e| {
                        invalid(
                            &format!("{field}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}].{what}[{j}]"),
                            e,
                        )
                    })
                })
                .collect()
        };
        out.push((
            conv(&t.match_expressions, "matchExpressions")?,
            conv(&t.match_fields, "matchFields")?,
        ));
    }
    Ok(Some(out))
}

fn terms_match(terms: &Terms, name: &str, labels: &BTreeMap<String, String>) -> bool {
    let fields = BTreeMap::from([("metadata.name".to_string(), name.to_string())]);
    terms.iter().any(|(exprs, flds)| {
        !(exprs.is_empty() && flds.is_empty())
            && exprs.iter().all(|r| r.matches(labels))
            && flds.iter().all(|r| r.matches(&fields))
    })
}

fn annotation<'a>(vol: &'a AntstorVolume, key: &str) -> Option<&'a str> {
    liteio_api::meta::annotation(&vol.metadata, key)
}

fn parse_selector(vol: &AntstorVolume, key: &str) -> Result<Option<Selector>, ScheduleError> {
    match annotation(vol, key) {
        None => Ok(None),
        Some(s) => Selector::parse(s)
            .map(Some)
            .map_err(|e| invalid(&format!("metadata.annotations[{key}]"), e)),
    }
}

/// Whether a pool can serve volumes to other nodes ([`StoragePool::can_export`]).
pub fn can_export(pool: &StoragePool) -> bool {
    pool.can_export()
}

/// Whether `vol` would be remote on `pool` (see the module documentation).
pub fn is_remote(vol: &AntstorVolume, pool: &StoragePool, pool_name: &str) -> bool {
    match vol
        .spec
        .host_node
        .as_ref()
        .map(|h| h.id.as_str())
        .filter(|s| !s.is_empty())
    {
        Some(host) => host != pool_name,
        None => vol.spec.position_advice == VolumePosition::MustRemote && can_export(pool),
    }
}

/// A stable 64-bit hash of (seed, name) for tie breaks (FNV-1a, then a SplitMix64 finaliser).
pub fn tie_hash(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in seed.to_le_bytes().iter().chain(name.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

impl Scheduler {
    /// A scheduler for a validated config (unknown names were rejected by validation and
    /// are skipped here).
    pub fn new(cfg: &SchedulerConfig) -> Self {
        let filters = cfg
            .filters
            .iter()
            .filter_map(|f| match f.as_str() {
                "Basic" => Some(Filter::Basic),
                "Affinity" => Some(Filter::Affinity),
                "MinLocalStorage" => Some(Filter::MinLocalStorage),
                _ => None,
            })
            .collect();
        let priorities = cfg
            .priorities
            .iter()
            .filter_map(|p| match p.as_str() {
                "LeastResource" => Some(Priority::LeastResource),
                "PositionAdvice" => Some(Priority::PositionAdvice),
                _ => None,
            })
            .collect();
        Self {
            cfg: cfg.clone(),
            filters,
            priorities,
        }
    }

    /// The settings in use.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    fn prepare<'a>(&self, vol: &'a AntstorVolume) -> Result<Prepared<'a>, ScheduleError> {
        let base = state::base_bytes(vol);
        let need = base.saturating_add(state::snapshot_reserve(vol));
        let ignored_as_remote = vol.metadata.annotations.as_ref().is_some_and(|a| {
            self.cfg
                .remote_ignore_anno_selector
                .iter()
                .any(|(k, v)| a.get(k).is_some_and(|x| x == v))
        });
        Ok(Prepared {
            vol,
            need,
            thin_virtual: if vol.spec.is_thin {
                vol.spec.size_byte
            } else {
                0
            },
            host: vol
                .spec
                .host_node
                .as_ref()
                .map(|h| h.id.as_str())
                .filter(|s| !s.is_empty()),
            ignored_as_remote,
            node_terms: parse_terms(&vol.spec.node_affinity, "spec.nodeAffinity")?,
            pool_terms: parse_terms(&vol.spec.pool_affinity, "spec.poolAffinity")?,
            node_selector: parse_selector(vol, annotations::NODE_LABEL_SELECTOR)?,
            pool_selector: parse_selector(vol, annotations::POOL_LABEL_SELECTOR)?,
            reservation: annotation(vol, annotations::RESERVATION_ID)
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        })
    }

    /// Checks a volume's scheduling inputs (selectors, affinity terms) without placing it.
    pub fn validate_volume(&self, vol: &AntstorVolume) -> Result<(), ScheduleError> {
        self.prepare(vol).map(|_| ())
    }

    fn basic(&self, p: &PoolView<'_>, v: &Prepared<'_>) -> Result<(), Reason> {
        if !p.schedulable() {
            return Err(Reason::PoolUnschedulable);
        }
        let free = p.free();
        let mut capacity_ok = false;
        if let Some(id) = &v.reservation {
            if free < 0 {
                return Err(Reason::PoolFreeSize);
            }
            match p.reservation(id) {
                Some(size) if size >= v.need => capacity_ok = p.reservation_held(id),
                Some(_) => return Err(Reason::ReservationTooSmall),
                None => return Err(Reason::ReservationNotMatch),
            }
        }
        if !capacity_ok && free < i128::from(v.need) {
            return Err(Reason::PoolFreeSize);
        }
        if v.thin_virtual > 0 {
            let ratio = self.cfg.overcommit_ratio(p.name);
            // Ratio ≥ 1 and finite (validated); the product is bounded by 2^64 × ratio.
            #[allow(
                clippy::cast_precision_loss,
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss
            )]
            let bound = (p.available() as f64 * ratio).floor() as u128;
            let wanted = u128::from(p.thin_virtual()) + u128::from(v.thin_virtual);
            if wanted > bound {
                return Err(Reason::ThinOvercommit);
            }
        }
        let remote = is_remote(v.vol, p.pool, p.name);
        let spdk = p.pool.mode() == Some(PoolMode::SpdkLVStore);
        if (spdk || remote) && !p.pool.can_export() {
            return Err(Reason::SpdkUnhealthy);
        }
        if remote && !v.ignored_as_remote && p.remote_count() >= self.cfg.max_remote_volume_count {
            return Err(Reason::RemoteVolMaxCount);
        }
        match v.vol.spec.position_advice {
            VolumePosition::MustLocal if remote => return Err(Reason::PositionAdvice),
            VolumePosition::MustRemote if !remote => return Err(Reason::PositionAdvice),
            _ => {}
        }
        // A limit is placed only where it is enforced: on an SPDK lvstore.
        if v.vol.spec.qos.is_some_and(|q| !q.is_unlimited()) && !spdk {
            return Err(Reason::QosNotEnforced);
        }
        match (v.vol.spec.type_, p.pool.mode()) {
            (Some(VolumeType::SpdkLVol), m) if m != Some(PoolMode::SpdkLVStore) => {
                Err(Reason::VolTypeNotMatch)
            }
            (Some(VolumeType::KernelLVol), m) if m != Some(PoolMode::KernelLVM) => {
                Err(Reason::VolTypeNotMatch)
            }
            _ => Ok(()),
        }
    }

    fn affinity(p: &PoolView<'_>, v: &Prepared<'_>) -> Result<(), Reason> {
        let info = &p.pool.spec.node_info;
        let node_name = if info.id.is_empty() { p.name } else { &info.id };
        if let Some(t) = &v.node_terms
            && !terms_match(t, node_name, &info.labels)
        {
            return Err(Reason::NodeAffinity);
        }
        if let Some(s) = &v.node_selector
            && !s.matches(&info.labels)
        {
            return Err(Reason::NodeAffinity);
        }
        let labels = p.labels();
        if let Some(t) = &v.pool_terms
            && !terms_match(t, p.name, &labels)
        {
            return Err(Reason::PoolAffinity);
        }
        if let Some(s) = &v.pool_selector
            && !s.matches(&labels)
        {
            return Err(Reason::PoolAffinity);
        }
        Ok(())
    }

    fn min_local_storage(&self, p: &PoolView<'_>, v: &Prepared<'_>) -> Result<(), Reason> {
        if !is_remote(v.vol, p.pool, p.name) {
            return Ok(());
        }
        let avail = i128::from(p.available());
        if avail <= 0 {
            return Err(Reason::LocalStorageTooLow);
        }
        let left = avail - i128::from(p.remote_bytes()) - i128::from(v.need);
        if left * 100 < i128::from(self.cfg.min_local_storage_pct) * avail {
            return Err(Reason::LocalStorageTooLow);
        }
        Ok(())
    }

    fn check(&self, p: &PoolView<'_>, v: &Prepared<'_>) -> Result<(), Reason> {
        for f in &self.filters {
            match f {
                Filter::Basic => self.basic(p, v)?,
                Filter::Affinity => Self::affinity(p, v)?,
                Filter::MinLocalStorage => self.min_local_storage(p, v)?,
            }
        }
        Ok(())
    }

    fn score(&self, p: &PoolView<'_>, v: &Prepared<'_>) -> i64 {
        let mut total = 0i64;
        for pr in &self.priorities {
            total += match pr {
                Priority::LeastResource => {
                    let avail = i128::from(p.available());
                    if avail <= 0 {
                        0
                    } else {
                        let used = (avail - p.free()).clamp(0, avail);
                        i64::try_from(used * 100 / avail).unwrap_or(0)
                    }
                }
                Priority::PositionAdvice => {
                    let local = v.host.is_some_and(|h| h == p.name);
                    match v.vol.spec.position_advice {
                        VolumePosition::PreferLocal if local => 20,
                        VolumePosition::PreferRemote if !local => 20,
                        _ => 0,
                    }
                }
            };
        }
        total
    }

    /// Why one pool would reject the volume, if it would (for diagnostics and tests).
    pub fn check_pool(
        &self,
        state: &State,
        pool: &str,
        vol: &AntstorVolume,
    ) -> Result<Result<(), Reason>, ScheduleError> {
        let v = self.prepare(vol)?;
        Ok(match state.pool(pool) {
            Some(p) => self.check(&p, &v),
            None => Err(Reason::SelectedNodeNotFound),
        })
    }

    /// Chooses a pool for `vol`. Pure: the caller binds the result into the state.
    pub fn schedule(&self, state: &State, vol: &AntstorVolume) -> Result<Placement, ScheduleError> {
        let v = self.prepare(vol)?;
        if let Some(node) =
            annotation(vol, annotations::SELECTED_TGT_NODE).filter(|s| !s.is_empty())
        {
            return match state.pool(node) {
                Some(p) => Ok(Placement {
                    node: node.to_string(),
                    score: self.score(&p, &v),
                }),
                None => Err(ScheduleError::NoStoragePoolAvailable(Rejections(
                    BTreeMap::from([(Reason::SelectedNodeNotFound, 1)]),
                ))),
            };
        }
        let mut rejected = Rejections::default();
        let mut best: Option<(i64, u64, &str)> = None;
        for p in state.pools() {
            match self.check(&p, &v) {
                Err(r) => *rejected.0.entry(r).or_default() += 1,
                Ok(()) => {
                    let cand = (self.score(&p, &v), tie_hash(self.cfg.seed, p.name), p.name);
                    let better = match &best {
                        None => true,
                        Some(b) => cand.0 > b.0 || (cand.0 == b.0 && (cand.1, cand.2) < (b.1, b.2)),
                    };
                    if better {
                        best = Some(cand);
                    }
                }
            }
        }
        match best {
            Some((score, _, node)) => Ok(Placement {
                node: node.to_string(),
                score,
            }),
            None => Err(ScheduleError::NoStoragePoolAvailable(rejected)),
        }
    }
}
