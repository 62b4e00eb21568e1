//! The controller's in-memory view of the cluster, built from watches: pools, volumes,
//! snapshots, Kubernetes nodes and pool heartbeats. Pure: no I/O, no clocks.
//!
//! Free space per pool is kept exact and incrementally:
//!
//! ```text
//! free = available (capacity − reserved LVs)
//!      − Σ charge(volume bound to the pool)
//!      − Σ reservations not yet matched by a bound volume
//! charge(volume) = base + max(snapshot-reserved-bytes, Σ sizes of its bound snapshots)
//! base = thin ? allocated-bytes : max(sizeByte, allocated-bytes)
//! ```
//!
//! A volume that is being deleted and no longer carries an agent finalizer is charged
//! nothing (its space is gone on the node). Every `upsert_*` first takes back what the
//! previous version of the object charged, so calling it twice changes nothing, a grown
//! volume is charged its new size at once (LiteIO kept the old size: gap 11), and a
//! removed one gives everything back.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::jiff::Timestamp;
use liteio_api::keys::{annotations, finalizers, labels};
use liteio_api::{AntstorSnapshot, AntstorVolume, StoragePool};

use crate::config::SchedulerConfig;

/// `namespace/name` of a namespaced object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectKey {
    /// A key.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of an object (empty parts when the metadata lacks them).
    pub fn of<K: kube::Resource>(obj: &K) -> Self {
        Self::new(
            obj.meta().namespace.clone().unwrap_or_default(),
            obj.meta().name.clone().unwrap_or_default(),
        )
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Errors of state operations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// The volume is not in the state.
    #[error("volume {0} is not in the state")]
    UnknownVolume(ObjectKey),
    /// The pool is not in the state.
    #[error("pool {0} is not in the state")]
    UnknownPool(String),
    /// The volume is already bound elsewhere.
    #[error("volume {key} is bound to {bound}, not {wanted}")]
    AlreadyBound {
        /// The volume.
        key: ObjectKey,
        /// Its pool.
        bound: String,
        /// The pool asked for.
        wanted: String,
    },
}

/// What one volume takes from its pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Charge {
    bytes: u64,
    thin_virtual: u64,
    remote_counted: bool,
    remote_bytes: u64,
    reservation: Option<String>,
}

#[derive(Debug, Clone)]
struct VolumeEntry {
    vol: Arc<AntstorVolume>,
    node: Option<String>,
    charge: Charge,
}

#[derive(Debug, Clone)]
struct SnapshotEntry {
    snap: Arc<AntstorSnapshot>,
    origin: ObjectKey,
    /// Bytes counted against the origin's reserve (0 unless bound and not merged).
    counted: u64,
}

/// One pool as the state sees it.
#[derive(Debug, Clone, Default)]
pub struct PoolEntry {
    pool: Option<Arc<StoragePool>>,
    available: u64,
    charged: u64,
    thin_virtual: u64,
    remote_count: u32,
    remote_bytes: u64,
    volumes: BTreeSet<ObjectKey>,
    reservations: BTreeMap<String, u64>,
    matched: HashMap<String, u32>,
}

impl PoolEntry {
    fn apply(&mut self, c: &Charge, key: &ObjectKey, add: bool) {
        if add {
            self.volumes.insert(key.clone());
            self.charged = self.charged.saturating_add(c.bytes);
            self.thin_virtual = self.thin_virtual.saturating_add(c.thin_virtual);
            self.remote_bytes = self.remote_bytes.saturating_add(c.remote_bytes);
            if c.remote_counted {
                self.remote_count += 1;
            }
            if let Some(r) = &c.reservation {
                *self.matched.entry(r.clone()).or_default() += 1;
            }
        } else {
            self.volumes.remove(key);
            self.charged = self.charged.saturating_sub(c.bytes);
            self.thin_virtual = self.thin_virtual.saturating_sub(c.thin_virtual);
            self.remote_bytes = self.remote_bytes.saturating_sub(c.remote_bytes);
            if c.remote_counted {
                self.remote_count = self.remote_count.saturating_sub(1);
            }
            if let Some(r) = &c.reservation
                && let Some(n) = self.matched.get_mut(r)
            {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.matched.remove(r);
                }
            }
        }
    }

    fn unmatched_reservations(&self) -> u64 {
        self.reservations
            .iter()
            .filter(|(id, _)| !self.matched.contains_key(*id))
            .fold(0u64, |sum, (_, s)| sum.saturating_add(*s))
    }
}

/// A read-only view of one real (not placeholder) pool.
#[derive(Debug, Clone, Copy)]
pub struct PoolView<'a> {
    /// Pool name (= node name).
    pub name: &'a str,
    /// The pool object.
    pub pool: &'a StoragePool,
    entry: &'a PoolEntry,
}

impl PoolView<'_> {
    /// Exact free bytes; negative when the pool is over-committed.
    pub fn free(&self) -> i128 {
        i128::from(self.entry.available)
            - i128::from(self.entry.charged)
            - i128::from(self.entry.unmatched_reservations())
    }
    /// Capacity minus reserved LVs.
    pub fn available(&self) -> u64 {
        self.entry.available
    }
    /// Total capacity.
    pub fn total(&self) -> u64 {
        self.pool.total_bytes()
    }
    /// Remote volumes counted against `maxRemoteVolumeCount`.
    pub fn remote_count(&self) -> u32 {
        self.entry.remote_count
    }
    /// Bytes charged by remote volumes.
    pub fn remote_bytes(&self) -> u64 {
        self.entry.remote_bytes
    }
    /// Σ virtual sizes of thin volumes.
    pub fn thin_virtual(&self) -> u64 {
        self.entry.thin_virtual
    }
    /// Size of reservation `id` on this pool, if present (matched or not).
    pub fn reservation(&self, id: &str) -> Option<u64> {
        self.entry.reservations.get(id).copied()
    }
    /// True when reservation `id` exists here and no bound volume consumed it yet.
    pub fn reservation_held(&self, id: &str) -> bool {
        self.entry.reservations.contains_key(id) && !self.entry.matched.contains_key(id)
    }
    /// Volumes bound to this pool.
    pub fn volumes(&self) -> impl Iterator<Item = &ObjectKey> {
        self.entry.volumes.iter()
    }
    /// Labels of the pool object.
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.pool.metadata.labels.clone().unwrap_or_default()
    }
    /// True when the pool is ready, not locked and not being deleted.
    pub fn schedulable(&self) -> bool {
        self.pool.is_schedulable() && self.pool.metadata.deletion_timestamp.is_none()
    }
}

/// Labels and taints of a Kubernetes Node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeFacts {
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Taints.
    pub taints: Vec<Taint>,
}

/// The cluster state.
#[derive(Debug, Clone, Default)]
pub struct State {
    pools: BTreeMap<String, PoolEntry>,
    volumes: HashMap<ObjectKey, VolumeEntry>,
    /// Volumes by `spec.uuid` (several when users created duplicates).
    by_uuid: HashMap<String, BTreeSet<ObjectKey>>,
    snapshots: HashMap<ObjectKey, SnapshotEntry>,
    snap_sum: HashMap<ObjectKey, u64>,
    nodes: HashMap<String, NodeFacts>,
    heartbeats: HashMap<String, Timestamp>,
    remote_ignore: BTreeMap<String, String>,
    reservations: BTreeMap<String, u64>,
}

fn annotation_u64(vol: &AntstorVolume, key: &str) -> u64 {
    vol.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0)
}

/// The reservation id a volume consumes: `obnvmf/reservation-id`, else `pvcNs/pvcName`.
pub fn reservation_id(vol: &AntstorVolume) -> Option<String> {
    if let Some(id) = vol
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::RESERVATION_ID))
        .filter(|s| !s.is_empty())
    {
        return Some(id.clone());
    }
    let l = vol.metadata.labels.as_ref()?;
    match (l.get(labels::PVC_NAMESPACE), l.get(labels::PVC_NAME)) {
        (Some(ns), Some(n)) if !ns.is_empty() && !n.is_empty() => Some(format!("{ns}/{n}")),
        _ => None,
    }
}

/// True when the volume's data is (or will be) on a node other than its consumer's; a
/// volume without a host node is remote everywhere.
pub fn is_remote_on(vol: &AntstorVolume, node: &str) -> bool {
    vol.spec
        .host_node
        .as_ref()
        .is_none_or(|h| h.id.is_empty() || h.id != node)
}

/// Bytes a volume takes from a pool before snapshot reserves.
pub fn base_bytes(vol: &AntstorVolume) -> u64 {
    let allocated = annotation_u64(vol, annotations::ALLOCATED_BYTES);
    if vol.spec.is_thin {
        allocated
    } else {
        // Engines allocate whole 4 MiB units; an unaligned request takes the rounded size.
        let rounded = liteio_api::size::round_up(vol.spec.size_byte, liteio_api::size::VOLUME_UNIT)
            .unwrap_or(u64::MAX);
        rounded.max(allocated)
    }
}

/// The snapshot a volume is cloned from (labels `obnvmf/volume-source-snap-name` and
/// `obnvmf/volume-source-snap-ns`; the namespace defaults to `default_ns`).
pub fn source_snapshot(vol: &AntstorVolume, default_ns: &str) -> Option<ObjectKey> {
    let l = vol.metadata.labels.as_ref()?;
    let name = l
        .get(labels::VOLUME_SOURCE_SNAP_NAME)
        .filter(|n| !n.is_empty())?;
    let ns = l
        .get(labels::VOLUME_SOURCE_SNAP_NS)
        .filter(|n| !n.is_empty())
        .map_or(default_ns, String::as_str);
    Some(ObjectKey::new(ns, name.as_str()))
}

/// The snapshot reserve a volume asks for.
pub fn snapshot_reserve(vol: &AntstorVolume) -> u64 {
    annotation_u64(vol, annotations::SNAPSHOT_RESERVED_BYTES)
}

/// True when the volume still holds space on its node: not deleted, or deleted while an
/// agent finalizer shows the LV / lvol may still exist.
pub fn holds_space(vol: &AntstorVolume) -> bool {
    if vol.metadata.deletion_timestamp.is_none() {
        return true;
    }
    vol.metadata
        .finalizers
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|f| finalizers::AGENT_VOLUME.contains(&f.as_str()))
}

impl State {
    /// An empty state using the scheduler settings that affect accounting
    /// (`remoteIgnoreAnnoSelector`, `nodeReservations`).
    pub fn new(cfg: &SchedulerConfig) -> Self {
        Self {
            remote_ignore: cfg.remote_ignore_anno_selector.clone(),
            reservations: cfg
                .node_reservations
                .iter()
                .map(|r| (r.id.clone(), r.size))
                .collect(),
            ..Self::default()
        }
    }

    fn ignored_as_remote(&self, vol: &AntstorVolume) -> bool {
        let Some(a) = vol.metadata.annotations.as_ref() else {
            return false;
        };
        self.remote_ignore
            .iter()
            .any(|(k, v)| a.get(k).is_some_and(|x| x == v))
    }

    fn charge_of(&self, key: &ObjectKey, vol: &AntstorVolume, node: &str) -> Charge {
        if !holds_space(vol) {
            return Charge::default();
        }
        let reserve = snapshot_reserve(vol).max(self.snap_sum.get(key).copied().unwrap_or(0));
        let bytes = base_bytes(vol).saturating_add(reserve);
        let remote = is_remote_on(vol, node);
        Charge {
            bytes,
            thin_virtual: if vol.spec.is_thin {
                vol.spec.size_byte
            } else {
                0
            },
            remote_counted: remote && !self.ignored_as_remote(vol),
            remote_bytes: if remote { bytes } else { 0 },
            reservation: reservation_id(vol),
        }
    }

    fn pool_entry(&mut self, node: &str) -> &mut PoolEntry {
        self.pools.entry(node.to_string()).or_default()
    }

    fn detach(&mut self, key: &ObjectKey) {
        let Some(e) = self.volumes.get(key) else {
            return;
        };
        let Some(node) = e.node.clone() else {
            return;
        };
        let charge = e.charge.clone();
        let drop_placeholder = {
            let p = self.pool_entry(&node);
            p.apply(&charge, key, false);
            p.pool.is_none() && p.volumes.is_empty()
        };
        if drop_placeholder {
            self.pools.remove(&node);
        }
        if let Some(e) = self.volumes.get_mut(key) {
            e.charge = Charge::default();
        }
    }

    fn attach(&mut self, key: &ObjectKey) {
        let Some(e) = self.volumes.get(key) else {
            return;
        };
        let Some(node) = e.node.clone() else {
            return;
        };
        let charge = self.charge_of(key, &e.vol, &node);
        self.pool_entry(&node).apply(&charge, key, true);
        if let Some(e) = self.volumes.get_mut(key) {
            e.charge = charge;
        }
    }

    // ---- pools -------------------------------------------------------------------------

    /// Adds or replaces a pool; returns true when something the scheduler sees changed.
    pub fn upsert_pool(&mut self, pool: Arc<StoragePool>) -> bool {
        let Some(name) = pool.metadata.name.clone() else {
            return false;
        };
        let reservations = self.reservations.clone();
        let e = self.pool_entry(&name);
        let changed = e.pool.as_deref() != Some(pool.as_ref());
        e.available = pool.available_bytes();
        e.reservations = reservations;
        e.pool = Some(pool);
        changed
    }

    /// Forgets a pool object; bound volumes keep a placeholder until they go.
    pub fn remove_pool(&mut self, name: &str) {
        if let Some(e) = self.pools.get_mut(name) {
            if e.volumes.is_empty() {
                self.pools.remove(name);
            } else {
                e.pool = None;
                e.available = 0;
            }
        }
    }

    /// Replaces every pool after a (re)list.
    pub fn replace_pools(&mut self, pools: Vec<Arc<StoragePool>>) {
        let keep: BTreeSet<String> = pools
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        let gone: Vec<String> = self
            .pools
            .iter()
            .filter(|(n, e)| e.pool.is_some() && !keep.contains(*n))
            .map(|(n, _)| n.clone())
            .collect();
        for n in gone {
            self.remove_pool(&n);
        }
        for p in pools {
            self.upsert_pool(p);
        }
    }

    /// A real pool by name.
    pub fn pool(&self, name: &str) -> Option<PoolView<'_>> {
        let (name, entry) = self.pools.get_key_value(name)?;
        Some(PoolView {
            name,
            pool: entry.pool.as_deref()?,
            entry,
        })
    }

    /// Every real pool, by name.
    pub fn pools(&self) -> impl Iterator<Item = PoolView<'_>> {
        self.pools.iter().filter_map(|(name, entry)| {
            Some(PoolView {
                name,
                pool: entry.pool.as_deref()?,
                entry,
            })
        })
    }

    /// Number of real pools.
    pub fn pool_count(&self) -> usize {
        self.pools.values().filter(|e| e.pool.is_some()).count()
    }

    /// Exact free bytes of a real pool.
    pub fn free_bytes(&self, name: &str) -> Option<i128> {
        self.pool(name).map(|p| p.free())
    }

    /// Volumes bound to `node` (also for a pool object that is gone).
    pub fn volumes_on(&self, node: &str) -> Vec<ObjectKey> {
        self.pools
            .get(node)
            .map(|e| e.volumes.iter().cloned().collect())
            .unwrap_or_default()
    }

    // ---- volumes -----------------------------------------------------------------------

    /// Adds or replaces a volume. A volume with `spec.targetNodeId` is bound there; one
    /// without keeps a binding made by [`State::bind`] (its patch may not be visible yet).
    pub fn upsert_volume(&mut self, vol: Arc<AntstorVolume>) {
        let key = ObjectKey::of(vol.as_ref());
        self.detach(&key);
        self.forget_uuid(&key);
        self.by_uuid
            .entry(vol.spec.uuid.clone())
            .or_default()
            .insert(key.clone());
        let node = match vol.target_node() {
            Some(n) => Some(n.to_string()),
            None => self.volumes.get(&key).and_then(|e| e.node.clone()),
        };
        self.volumes.insert(
            key.clone(),
            VolumeEntry {
                vol,
                node,
                charge: Charge::default(),
            },
        );
        self.attach(&key);
    }

    /// Forgets a volume and gives back what it took.
    pub fn remove_volume(&mut self, key: &ObjectKey) {
        self.detach(key);
        self.forget_uuid(key);
        self.volumes.remove(key);
    }

    fn forget_uuid(&mut self, key: &ObjectKey) {
        let Some(uuid) = self.volumes.get(key).map(|e| e.vol.spec.uuid.clone()) else {
            return;
        };
        if let Some(set) = self.by_uuid.get_mut(&uuid) {
            set.remove(key);
            if set.is_empty() {
                self.by_uuid.remove(&uuid);
            }
        }
    }

    /// The volume that owns the `spec.uuid` that `key` shares with other volumes, when that
    /// is another one. CSI, the kubectl plug-in and the NQN all resolve a volume by its uuid,
    /// so only one volume may have it: the one bound to a pool (the first bound, if several
    /// already are), else the oldest (creation time, then namespace/name).
    pub fn uuid_owner(&self, key: &ObjectKey) -> Option<ObjectKey> {
        let uuid = &self.volumes.get(key)?.vol.spec.uuid;
        let set = self.by_uuid.get(uuid)?;
        if set.len() < 2 {
            return None;
        }
        let rank = |k: &ObjectKey| {
            let e = self.volumes.get(k);
            let bound = e.is_some_and(|e| e.node.is_some());
            let created = e.and_then(|e| e.vol.metadata.creation_timestamp.clone());
            (!bound, created.map(|t| t.0), k.clone())
        };
        set.iter()
            .min_by(|a, b| rank(a).cmp(&rank(b)))
            .filter(|owner| *owner != key)
            .cloned()
    }

    /// Replaces every volume after a (re)list; bindings made by [`State::bind`] survive
    /// for volumes that still exist.
    pub fn replace_volumes(&mut self, vols: Vec<Arc<AntstorVolume>>) {
        let keep: BTreeSet<ObjectKey> = vols.iter().map(|v| ObjectKey::of(v.as_ref())).collect();
        let gone: Vec<ObjectKey> = self
            .volumes
            .keys()
            .filter(|k| !keep.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            self.remove_volume(&k);
        }
        for v in vols {
            self.upsert_volume(v);
        }
    }

    /// Binds a known volume to a known pool (the scheduler's decision), charging the pool
    /// at once. Binding again to the same pool is a no-op.
    pub fn bind(&mut self, key: &ObjectKey, node: &str) -> Result<(), StateError> {
        let e = self
            .volumes
            .get(key)
            .ok_or_else(|| StateError::UnknownVolume(key.clone()))?;
        if self.pool(node).is_none() {
            return Err(StateError::UnknownPool(node.to_string()));
        }
        match &e.node {
            Some(n) if n == node => return Ok(()),
            Some(n) => {
                return Err(StateError::AlreadyBound {
                    key: key.clone(),
                    bound: n.clone(),
                    wanted: node.to_string(),
                });
            }
            None => {}
        }
        if let Some(e) = self.volumes.get_mut(key) {
            e.node = Some(node.to_string());
        }
        self.attach(key);
        Ok(())
    }

    /// The latest version of a volume.
    pub fn volume(&self, key: &ObjectKey) -> Option<&Arc<AntstorVolume>> {
        self.volumes.get(key).map(|e| &e.vol)
    }

    /// The pool a volume is bound to (from its spec or from [`State::bind`]).
    pub fn binding(&self, key: &ObjectKey) -> Option<&str> {
        self.volumes.get(key).and_then(|e| e.node.as_deref())
    }

    /// Bytes a volume is charged now.
    pub fn charge(&self, key: &ObjectKey) -> Option<u64> {
        self.volumes.get(key).map(|e| e.charge.bytes)
    }

    /// Volumes not bound anywhere and not being deleted.
    pub fn unscheduled_volumes(&self) -> Vec<ObjectKey> {
        let mut v: Vec<ObjectKey> = self
            .volumes
            .iter()
            .filter(|(_, e)| e.node.is_none() && e.vol.metadata.deletion_timestamp.is_none())
            .map(|(k, _)| k.clone())
            .collect();
        v.sort();
        v
    }

    /// Unscheduled volumes cloned from the snapshot `snap` (labels
    /// `obnvmf/volume-source-snap-name` and `-ns`, the namespace defaulting to the volume's).
    pub fn clones_waiting_for(&self, snap: &ObjectKey) -> Vec<ObjectKey> {
        let mut v: Vec<ObjectKey> = self
            .volumes
            .iter()
            .filter(|(k, e)| {
                e.node.is_none() && source_snapshot(&e.vol, &k.namespace).as_ref() == Some(snap)
            })
            .map(|(k, _)| k.clone())
            .collect();
        v.sort();
        v
    }

    /// Volumes being deleted.
    pub fn deleting_volumes(&self) -> Vec<ObjectKey> {
        self.volumes
            .iter()
            .filter(|(_, e)| e.vol.metadata.deletion_timestamp.is_some())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Every volume key.
    pub fn volume_keys(&self) -> Vec<ObjectKey> {
        self.volumes.keys().cloned().collect()
    }

    // ---- snapshots ---------------------------------------------------------------------

    fn snapshot_counted(s: &AntstorSnapshot) -> u64 {
        let merged = s
            .status
            .as_ref()
            .is_some_and(|st| st.status == liteio_api::snapshot::SnapshotStatusName::Merged);
        if merged || s.spec.origin_vol_target_node_id.is_empty() {
            0
        } else {
            u64::try_from(s.spec.size).unwrap_or(0)
        }
    }

    fn set_snap_sum(&mut self, origin: &ObjectKey, delta_add: u64, delta_sub: u64) {
        let cur = self.snap_sum.get(origin).copied().unwrap_or(0);
        let new = cur.saturating_add(delta_add).saturating_sub(delta_sub);
        if new == cur {
            return;
        }
        if new == 0 {
            self.snap_sum.remove(origin);
        } else {
            self.snap_sum.insert(origin.clone(), new);
        }
        self.detach(origin);
        self.attach(origin);
    }

    /// The origin volume of a snapshot, from its spec.
    pub fn origin_of(s: &AntstorSnapshot) -> ObjectKey {
        let ns = if s.spec.origin_vol_namespace.is_empty() {
            s.metadata.namespace.clone().unwrap_or_default()
        } else {
            s.spec.origin_vol_namespace.clone()
        };
        ObjectKey::new(ns, s.spec.origin_vol_name.clone())
    }

    /// Adds or replaces a snapshot; a bound, unmerged snapshot counts against its origin's
    /// reserve.
    pub fn upsert_snapshot(&mut self, snap: Arc<AntstorSnapshot>) {
        let key = ObjectKey::of(snap.as_ref());
        self.remove_snapshot(&key);
        let origin = Self::origin_of(&snap);
        let counted = Self::snapshot_counted(&snap);
        self.snapshots.insert(
            key,
            SnapshotEntry {
                snap,
                origin: origin.clone(),
                counted,
            },
        );
        self.set_snap_sum(&origin, counted, 0);
    }

    /// Forgets a snapshot.
    pub fn remove_snapshot(&mut self, key: &ObjectKey) {
        if let Some(old) = self.snapshots.remove(key) {
            self.set_snap_sum(&old.origin, 0, old.counted);
        }
    }

    /// Replaces every snapshot after a (re)list.
    pub fn replace_snapshots(&mut self, snaps: Vec<Arc<AntstorSnapshot>>) {
        let keep: BTreeSet<ObjectKey> = snaps.iter().map(|s| ObjectKey::of(s.as_ref())).collect();
        let gone: Vec<ObjectKey> = self
            .snapshots
            .keys()
            .filter(|k| !keep.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            self.remove_snapshot(&k);
        }
        for s in snaps {
            self.upsert_snapshot(s);
        }
    }

    /// The latest version of a snapshot.
    pub fn snapshot(&self, key: &ObjectKey) -> Option<&Arc<AntstorSnapshot>> {
        self.snapshots.get(key).map(|e| &e.snap)
    }

    /// Snapshots of an origin volume, sorted by key.
    pub fn snapshots_of(&self, origin: &ObjectKey) -> Vec<ObjectKey> {
        let mut v: Vec<ObjectKey> = self
            .snapshots
            .iter()
            .filter(|(_, e)| &e.origin == origin)
            .map(|(k, _)| k.clone())
            .collect();
        v.sort();
        v
    }

    // ---- nodes and heartbeats ----------------------------------------------------------

    /// Records a Kubernetes Node.
    pub fn upsert_node(&mut self, name: &str, facts: NodeFacts) {
        self.nodes.insert(name.to_string(), facts);
    }

    /// Forgets a Kubernetes Node.
    pub fn remove_node(&mut self, name: &str) {
        self.nodes.remove(name);
    }

    /// Replaces every Node after a (re)list.
    pub fn replace_nodes(&mut self, nodes: Vec<(String, NodeFacts)>) {
        self.nodes = nodes.into_iter().collect();
    }

    /// A Kubernetes Node.
    pub fn node(&self, name: &str) -> Option<&NodeFacts> {
        self.nodes.get(name)
    }

    /// Records the last renewal of a pool's Lease.
    pub fn set_heartbeat(&mut self, node: &str, at: Option<Timestamp>) {
        match at {
            Some(t) => {
                self.heartbeats.insert(node.to_string(), t);
            }
            None => {
                self.heartbeats.remove(node);
            }
        }
    }

    /// Replaces every heartbeat after a (re)list.
    pub fn replace_heartbeats(&mut self, beats: Vec<(String, Timestamp)>) {
        self.heartbeats = beats.into_iter().collect();
    }

    /// The last renewal of a pool's Lease.
    pub fn heartbeat(&self, node: &str) -> Option<Timestamp> {
        self.heartbeats.get(node).copied()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::testing::*;
    use liteio_api::size::GIB;

    fn state() -> State {
        State::new(&SchedulerConfig::default())
    }

    #[test]
    fn free_space_through_create_expand_delete() {
        let mut s = state();
        s.upsert_pool(pool("n1", 100 * GIB).arc());
        assert_eq!(s.free_bytes("n1"), Some(i128::from(100 * GIB)));
        let v = volume("v1", 10 * GIB).scheduled_to("n1");
        s.upsert_volume(v.clone().arc());
        assert_eq!(s.free_bytes("n1"), Some(i128::from(90 * GIB)));
        // Idempotent.
        s.upsert_volume(v.clone().arc());
        assert_eq!(s.free_bytes("n1"), Some(i128::from(90 * GIB)));
        // Expansion is charged at once.
        s.upsert_volume(v.clone().size(30 * GIB).arc());
        assert_eq!(s.free_bytes("n1"), Some(i128::from(70 * GIB)));
        // Allocated bytes larger than the size count.
        s.upsert_volume(
            v.clone()
                .size(30 * GIB)
                .annotate(annotations::ALLOCATED_BYTES, &(31 * GIB).to_string())
                .arc(),
        );
        assert_eq!(s.free_bytes("n1"), Some(i128::from(69 * GIB)));
        // Snapshot reserve counts.
        s.upsert_volume(
            v.clone()
                .size(30 * GIB)
                .annotate(annotations::SNAPSHOT_RESERVED_BYTES, &(5 * GIB).to_string())
                .arc(),
        );
        assert_eq!(s.free_bytes("n1"), Some(i128::from(65 * GIB)));
        // Deleting with agent finalizers still holds space; without, it is free.
        s.upsert_volume(
            v.clone()
                .size(30 * GIB)
                .finalizer(finalizers::LOGIC_VOLUME)
                .deleting()
                .arc(),
        );
        assert_eq!(s.free_bytes("n1"), Some(i128::from(70 * GIB)));
        s.upsert_volume(v.clone().size(30 * GIB).deleting().arc());
        assert_eq!(s.free_bytes("n1"), Some(i128::from(100 * GIB)));
        s.upsert_volume(v.clone().size(30 * GIB).arc());
        s.remove_volume(&ObjectKey::new("obnvmf", "v1"));
        assert_eq!(s.free_bytes("n1"), Some(i128::from(100 * GIB)));
        s.remove_volume(&ObjectKey::new("obnvmf", "v1"));
        assert_eq!(s.free_bytes("n1"), Some(i128::from(100 * GIB)));
    }

    #[test]
    fn reserved_lvs_and_reservations() {
        let mut cfg = SchedulerConfig::default();
        cfg.node_reservations.push(crate::config::NodeReservation {
            id: "ns/pvc-a".into(),
            size: 20 * GIB,
        });
        let mut s = State::new(&cfg);
        s.upsert_pool(pool("n1", 100 * GIB).reserved_lv(10 * GIB).arc());
        assert_eq!(s.free_bytes("n1"), Some(i128::from(70 * GIB)));
        // A volume of that PVC matches the reservation: the reservation no longer counts.
        s.upsert_volume(
            volume("v1", 15 * GIB)
                .label(labels::PVC_NAMESPACE, "ns")
                .label(labels::PVC_NAME, "pvc-a")
                .scheduled_to("n1")
                .arc(),
        );
        assert_eq!(s.free_bytes("n1"), Some(i128::from(75 * GIB)));
        s.remove_volume(&ObjectKey::new("obnvmf", "v1"));
        assert_eq!(s.free_bytes("n1"), Some(i128::from(70 * GIB)));
    }

    /// Found by the bad-input sweep (issue 16): reservation sizes come from the config
    /// file; two that add past u64 overflowed (a panic in debug builds).
    #[test]
    fn huge_reservations_saturate() {
        let mut cfg = SchedulerConfig::default();
        for id in ["a", "b"] {
            cfg.node_reservations.push(crate::config::NodeReservation {
                id: id.into(),
                size: u64::MAX,
            });
        }
        let mut s = State::new(&cfg);
        s.upsert_pool(pool("n1", 100 * GIB).arc());
        assert_eq!(
            s.free_bytes("n1"),
            Some(i128::from(100 * GIB) - i128::from(u64::MAX))
        );
    }

    #[test]
    fn thin_volumes_count_allocated_and_virtual() {
        let mut s = state();
        s.upsert_pool(pool("n1", 100 * GIB).arc());
        let v = volume("t1", 50 * GIB).thin().scheduled_to("n1");
        s.upsert_volume(v.clone().arc());
        assert_eq!(s.free_bytes("n1"), Some(i128::from(100 * GIB)));
        assert_eq!(s.pool("n1").unwrap().thin_virtual(), 50 * GIB);
        s.upsert_volume(
            v.annotate(annotations::ALLOCATED_BYTES, &(8 * GIB).to_string())
                .arc(),
        );
        assert_eq!(s.free_bytes("n1"), Some(i128::from(92 * GIB)));
        assert_eq!(s.pool("n1").unwrap().thin_virtual(), 50 * GIB);
    }

    #[test]
    fn snapshots_count_beyond_the_reserve() {
        let mut s = state();
        s.upsert_pool(pool("n1", 100 * GIB).arc());
        s.upsert_volume(
            volume("v1", 10 * GIB)
                .annotate(annotations::SNAPSHOT_RESERVED_BYTES, &(4 * GIB).to_string())
                .scheduled_to("n1")
                .arc(),
        );
        assert_eq!(s.free_bytes("n1"), Some(i128::from(86 * GIB)));
        // Within the reserve: nothing more.
        let snap = snapshot("s1", "v1", 3 * GIB).bound_to("n1");
        s.upsert_snapshot(snap.clone().arc());
        assert_eq!(s.free_bytes("n1"), Some(i128::from(86 * GIB)));
        // Beyond it (only reachable by hand): the larger counts.
        s.upsert_snapshot(snapshot("s1", "v1", 6 * GIB).bound_to("n1").arc());
        assert_eq!(s.free_bytes("n1"), Some(i128::from(84 * GIB)));
        s.remove_snapshot(&ObjectKey::new("obnvmf", "s1"));
        assert_eq!(s.free_bytes("n1"), Some(i128::from(86 * GIB)));
        // Unbound snapshots count nothing.
        s.upsert_snapshot(snapshot("s2", "v1", 60 * GIB).arc());
        assert_eq!(s.free_bytes("n1"), Some(i128::from(86 * GIB)));
    }

    #[test]
    fn bind_survives_a_stale_event_and_placeholders() {
        let mut s = state();
        s.upsert_pool(pool("n1", 100 * GIB).arc());
        let v = volume("v1", 10 * GIB);
        s.upsert_volume(v.clone().arc());
        assert_eq!(s.unscheduled_volumes().len(), 1);
        let key = ObjectKey::new("obnvmf", "v1");
        s.bind(&key, "n1").unwrap();
        s.bind(&key, "n1").unwrap();
        assert!(matches!(
            s.bind(&key, "n2"),
            Err(StateError::UnknownPool(_))
        ));
        assert_eq!(s.free_bytes("n1"), Some(i128::from(90 * GIB)));
        // An event without targetNodeId (sent before our patch) keeps the binding.
        s.upsert_volume(v.clone().arc());
        assert_eq!(s.binding(&key), Some("n1"));
        assert_eq!(s.free_bytes("n1"), Some(i128::from(90 * GIB)));
        // Volume on an unknown pool: placeholder, not a real pool.
        s.upsert_volume(volume("v2", GIB).scheduled_to("n9").arc());
        assert!(s.pool("n9").is_none());
        assert_eq!(s.volumes_on("n9").len(), 1);
        s.upsert_pool(pool("n9", 10 * GIB).arc());
        assert_eq!(s.free_bytes("n9"), Some(i128::from(9 * GIB)));
        s.remove_pool("n9");
        assert!(s.pool("n9").is_none());
        assert_eq!(s.volumes_on("n9").len(), 1);
        s.remove_volume(&ObjectKey::new("obnvmf", "v2"));
        assert!(s.volumes_on("n9").is_empty());
    }

    #[test]
    fn relist_replaces() {
        let mut s = state();
        s.replace_pools(vec![pool("n1", 10 * GIB).arc(), pool("n2", 10 * GIB).arc()]);
        s.replace_volumes(vec![volume("v1", GIB).scheduled_to("n1").arc()]);
        assert_eq!(s.pool_count(), 2);
        s.replace_pools(vec![pool("n2", 10 * GIB).arc()]);
        assert_eq!(s.pool_count(), 1);
        assert_eq!(s.volumes_on("n1").len(), 1);
        s.replace_volumes(vec![]);
        assert!(s.volumes_on("n1").is_empty());
        assert_eq!(s.free_bytes("n2"), Some(i128::from(10 * GIB)));
    }

    #[test]
    fn remote_counting_respects_ignore_selector() {
        let mut cfg = SchedulerConfig::default();
        cfg.remote_ignore_anno_selector
            .insert(annotations::REGARD_AS_REMOTE.into(), "true".into());
        let mut s = State::new(&cfg);
        s.upsert_pool(pool("n1", 100 * GIB).arc());
        s.upsert_volume(volume("local", GIB).host("n1").scheduled_to("n1").arc());
        s.upsert_volume(volume("remote", GIB).host("h2").scheduled_to("n1").arc());
        s.upsert_volume(
            volume("ignored", GIB)
                .host("h3")
                .annotate(annotations::REGARD_AS_REMOTE, "true")
                .scheduled_to("n1")
                .arc(),
        );
        let p = s.pool("n1").unwrap();
        assert_eq!(p.remote_count(), 1);
        assert_eq!(p.remote_bytes(), 2 * GIB);
    }
}
