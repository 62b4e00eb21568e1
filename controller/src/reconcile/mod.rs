//! The reconcile runtime: watches feed the [`State`] and per-kind work queues; each kind's
//! workers (`workers:` in the config) drain its queue, never two on one key at once; the
//! liveness clock re-queues pools (and volumes being deleted on
//! pools that are not ready) every `liveness.tick`. Nothing else runs on a timer: a volume
//! that did not fit is retried when a pool changes or space is freed, a clone waiting for
//! its source snapshot when that snapshot appears, a snapshot waiting for its origin when
//! the origin changes, a migration when its source or destination volume changes (or
//! another migration of its volume goes away).
//!
//! Workers start only after the first full list of pools, volumes, snapshots, migrations
//! and Leases, so the scheduler never decides on a partial view (a restarted controller
//! places nothing twice). Failed reconciles are retried with per-key exponential back-off.
//!
//! Parallel workers and placement: a volume (or group) is placed by deciding and charging
//! its pool in the [`State`] under one lock, before its binding is written; so a worker
//! placing the next volume sees the space taken even while the first one's patch is in
//! flight, and no two volumes are placed on the same free space.

pub mod group;
pub mod keys;
pub mod members;
pub mod migration;
pub mod pool;
pub mod replicated;
pub mod snapshot;
pub mod volume;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use liteio_api::keys::{finalizers, managers};
use liteio_api::{
    AntstorDataControl, AntstorSnapshot, AntstorVolume, AntstorVolumeGroup, StoragePool,
    VolumeMigration,
};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, watch};
use tracing::{debug, warn};

use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::metrics::Metrics;
use crate::plugin::{Kind, Plugin, PluginObject};
use crate::scheduler::Scheduler;
use crate::state::{NodeFacts, ObjectKey, State};

/// What a reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing until the next watch event.
    Done,
    /// Run again after this long (grace periods of the liveness clock).
    RequeueAfter(Duration),
}

#[derive(Debug, Default)]
struct QueueInner {
    queue: VecDeque<ObjectKey>,
    queued: HashSet<ObjectKey>,
    running: HashSet<ObjectKey>,
    dirty: HashSet<ObjectKey>,
    failures: HashMap<ObjectKey, u32>,
}

/// A de-duplicating work queue: a key is queued at most once and never processed by two
/// workers at the same time; a key added while running is processed again afterwards.
#[derive(Debug, Default)]
pub struct WorkQueue {
    inner: Mutex<QueueInner>,
    notify: Notify,
}

impl WorkQueue {
    fn lock(&self) -> MutexGuard<'_, QueueInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `key`.
    pub fn add(&self, key: ObjectKey) {
        let mut g = self.lock();
        if g.running.contains(&key) {
            g.dirty.insert(key);
            return;
        }
        if g.queued.insert(key.clone()) {
            g.queue.push_back(key);
            drop(g);
            self.notify.notify_one();
        }
    }

    /// Queues `key` after `delay`.
    pub fn add_after(self: &Arc<Self>, key: ObjectKey, delay: Duration) {
        let q = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            q.add(key);
        });
    }

    async fn pop(&self) -> ObjectKey {
        loop {
            let notified = self.notify.notified();
            {
                let mut g = self.lock();
                if let Some(k) = g.queue.pop_front() {
                    g.queued.remove(&k);
                    g.running.insert(k.clone());
                    return k;
                }
            }
            notified.await;
        }
    }

    fn done(&self, key: &ObjectKey) {
        let mut g = self.lock();
        g.running.remove(key);
        if g.dirty.remove(key) && g.queued.insert(key.clone()) {
            g.queue.push_back(key.clone());
            drop(g);
            self.notify.notify_one();
        }
    }

    fn failed(&self, key: &ObjectKey) -> u32 {
        let mut g = self.lock();
        let n = g.failures.entry(key.clone()).or_default();
        *n = n.saturating_add(1);
        *n
    }

    fn succeeded(&self, key: &ObjectKey) {
        self.lock().failures.remove(key);
    }

    /// Keys waiting (not running).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Back-off before retrying a failed reconcile: 10 ms doubling to 1 s for conflicts,
/// 50 ms doubling to 30 s otherwise.
pub fn backoff(failures: u32, kind: ErrorKind) -> Duration {
    let (base, cap) = match kind {
        ErrorKind::Conflict => (10u64, 1_000u64),
        _ => (50, 30_000),
    };
    let exp = failures.saturating_sub(1).min(16);
    Duration::from_millis(base.saturating_mul(1 << exp).min(cap))
}

#[derive(Debug, Default)]
struct Synced {
    pools: AtomicBool,
    volumes: AtomicBool,
    snapshots: AtomicBool,
    leases: AtomicBool,
    migrations: AtomicBool,
    groups: AtomicBool,
    data_controls: AtomicBool,
    nodes: AtomicBool,
}

/// Everything a reconciler needs.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Namespace of LiteIO's objects and the pools' Leases.
    pub namespace: String,
    /// The validated configuration.
    pub config: Config,
    /// The scheduler.
    pub scheduler: Scheduler,
    /// Source of "now" for liveness.
    pub clock: Arc<dyn Clock>,
    /// Plug-in steps.
    pub plugins: Vec<Arc<dyn Plugin>>,
    /// Metrics.
    pub metrics: Metrics,
    state: Mutex<State>,
    volumes: Arc<WorkQueue>,
    pools: Arc<WorkQueue>,
    snapshots: Arc<WorkQueue>,
    migration_queue: Arc<WorkQueue>,
    /// Storage nodes whose key access ([`keys`]) may be out of date.
    key_access: Arc<WorkQueue>,
    /// The node each volume's object names (`spec.targetNodeId`), as key access last saw it.
    key_nodes: Mutex<HashMap<ObjectKey, String>>,
    /// The VolumeMigrations, as last seen (watch events and this controller's writes).
    migration_cache: Mutex<HashMap<ObjectKey, Arc<VolumeMigration>>>,
    group_queue: Arc<WorkQueue>,
    data_control_queue: Arc<WorkQueue>,
    /// The AntstorVolumeGroups and AntstorDataControls, as last seen.
    group_cache: Mutex<HashMap<ObjectKey, Arc<AntstorVolumeGroup>>>,
    data_control_cache: Mutex<HashMap<ObjectKey, Arc<AntstorDataControl>>>,
    synced: Synced,
    synced_tx: watch::Sender<bool>,
    recorder: Recorder,
    warned: Mutex<HashMap<ObjectKey, String>>,
    /// Plug-in sweeps running beside the reconcilers: stopped with them, so that an
    /// instance that lost leadership writes nothing more (see [`Context::stop_background`]).
    background: Mutex<tokio::task::JoinSet<()>>,
    background_stopped: AtomicBool,
    /// What the replicated-volume reconcilers remember between passes (first sightings of
    /// lost replicas, the ones reported, the metric series they set).
    pub(crate) replica_memory: replicated::Memory,
}

impl Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context; `clock` defaults to the system clock, `metrics` to a fresh registry.
    pub fn new(
        client: Client,
        namespace: &str,
        config: Config,
        clock: Option<Arc<dyn Clock>>,
        plugins: Vec<Arc<dyn Plugin>>,
        metrics: Metrics,
    ) -> Arc<Self> {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: managers::CONTROLLER.into(),
                instance: None,
            },
        );
        Arc::new(Self {
            scheduler: Scheduler::new(&config.scheduler),
            state: Mutex::new(State::new(&config.scheduler)),
            client,
            namespace: namespace.to_string(),
            config,
            clock: clock.unwrap_or_else(|| Arc::new(SystemClock)),
            plugins,
            metrics,
            volumes: Arc::default(),
            pools: Arc::default(),
            snapshots: Arc::default(),
            migration_queue: Arc::default(),
            key_access: Arc::default(),
            key_nodes: Mutex::default(),
            migration_cache: Mutex::default(),
            group_queue: Arc::default(),
            data_control_queue: Arc::default(),
            group_cache: Mutex::default(),
            data_control_cache: Mutex::default(),
            synced: Synced::default(),
            synced_tx: watch::channel(false).0,
            recorder,
            warned: Mutex::default(),
            background: Mutex::default(),
            background_stopped: AtomicBool::new(false),
            replica_memory: replicated::Memory::default(),
        })
    }

    /// Abort the plug-in sweeps still running (after the reconcilers stopped: leadership
    /// lost or shutdown) and wait until they are gone; none starts afterwards.
    pub async fn stop_background(&self) {
        self.background_stopped.store(true, Ordering::SeqCst);
        let mut set = std::mem::take(
            &mut *self
                .background
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        set.abort_all();
        while set.join_next().await.is_some() {}
    }

    /// The state, locked. Never hold the guard across an `.await`.
    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The VolumeMigration `key` as last seen.
    pub fn migration(&self, key: &ObjectKey) -> Option<Arc<VolumeMigration>> {
        self.migration_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    /// Every VolumeMigration as last seen.
    pub fn migrations(&self) -> Vec<Arc<VolumeMigration>> {
        self.migration_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// Records the latest version of a VolumeMigration (and refreshes the by-phase gauge).
    pub fn upsert_migration(&self, mig: Arc<VolumeMigration>) {
        let key = ObjectKey::of(mig.as_ref());
        self.migration_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, mig);
        self.count_migrations();
    }

    /// Forgets a VolumeMigration.
    pub fn remove_migration(&self, key: &ObjectKey) {
        self.migration_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
        self.count_migrations();
    }

    fn count_migrations(&self) {
        let mut counts: HashMap<(&'static str, &'static str), i64> = HashMap::new();
        let migrations = self.migrations();
        let under_way: Vec<crate::metrics::MigrationSample> = {
            let state = self.state();
            migrations
                .iter()
                .filter(|m| m.status_name() != liteio_api::migration::STATUS_FINISHED)
                .map(|m| {
                    let src = &m.spec.source_volume;
                    let key = ObjectKey::new(m.source_namespace(), src.name.clone());
                    crate::metrics::MigrationSample {
                        migration: m.name_any(),
                        volume: src.name.clone(),
                        source_node: src.target_node_id.clone(),
                        dest_node: m.spec.dest_volume.target_node_id.clone(),
                        phase: m.phase().as_str(),
                        copied_bytes: m.bytes_copied(),
                        size_bytes: state.volume(&key).map(|v| v.spec.size_byte),
                    }
                })
                .collect()
        };
        self.metrics
            .observe_migrations(&under_way, unix_seconds(self.clock.now()));
        for m in migrations {
            let status = match m.status_name() {
                liteio_api::migration::STATUS_WORKING => liteio_api::migration::STATUS_WORKING,
                liteio_api::migration::STATUS_ERROR => liteio_api::migration::STATUS_ERROR,
                liteio_api::migration::STATUS_FINISHED => liteio_api::migration::STATUS_FINISHED,
                _ => "none",
            };
            *counts.entry((m.phase().as_str(), status)).or_default() += 1;
        }
        for phase in liteio_api::migration::MigrationPhase::ALL {
            for status in [
                liteio_api::migration::STATUS_WORKING,
                liteio_api::migration::STATUS_ERROR,
                liteio_api::migration::STATUS_FINISHED,
                "none",
            ] {
                self.metrics
                    .migrations
                    .with_label_values(&[phase.as_str(), status])
                    .set(counts.get(&(phase.as_str(), status)).copied().unwrap_or(0));
            }
        }
    }

    /// The AntstorVolumeGroup `key` as last seen.
    pub fn group(&self, key: &ObjectKey) -> Option<Arc<AntstorVolumeGroup>> {
        self.group_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    /// Records the latest version of an AntstorVolumeGroup.
    pub fn upsert_group(&self, g: Arc<AntstorVolumeGroup>) {
        self.group_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(ObjectKey::of(g.as_ref()), g);
    }

    /// The AntstorDataControl `key` as last seen.
    pub fn data_control(&self, key: &ObjectKey) -> Option<Arc<AntstorDataControl>> {
        self.data_control_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    /// Records the latest version of an AntstorDataControl.
    pub fn upsert_data_control(&self, dc: Arc<AntstorDataControl>) {
        self.data_control_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(ObjectKey::of(dc.as_ref()), dc);
    }

    /// Queues the data control `key`.
    pub fn enqueue_data_control(&self, key: ObjectKey) {
        self.data_control_queue.add(key);
    }

    /// Queues the groups that do not hold their total yet, and those that wait for room for
    /// a replica's replacement (after a pool changed).
    fn enqueue_unplaced_groups(&self) {
        let keys: Vec<ObjectKey> = self
            .group_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(_, g)| {
                (!g.fully_placed()
                    || liteio_api::meta::annotation(
                        &g.metadata,
                        liteio_api::replica::ANNO_REPLACING,
                    )
                    .is_some())
                    && g.metadata.deletion_timestamp.is_none()
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            self.group_queue.add(k);
        }
    }

    /// Queues the groups with a member on `node` (after its pool changed: a replicated
    /// volume's replica there may be lost, or its assembly may have to move).
    pub fn enqueue_groups_on(&self, node: &str) {
        let vols: Vec<Arc<AntstorVolume>> = {
            let s = self.state();
            s.volumes_on(node)
                .iter()
                .filter_map(|k| s.volume(k).cloned())
                .collect()
        };
        for v in vols {
            self.enqueue_group_of(&v);
        }
    }

    /// Queues the AntstorVolumeGroup `key`.
    pub fn enqueue_group(&self, key: ObjectKey) {
        self.group_queue.add(key);
    }

    /// Publishes an event of `type_` about `obj` (no de-duplication: for transitions the
    /// caller detects).
    pub async fn publish<K>(&self, obj: &K, type_: EventType, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        let ev = KubeEvent {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: reason.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            warn!(error = %e, reason, "cannot publish event");
        }
    }

    /// Queues the group the volume `v` is a member of, if any.
    fn enqueue_group_of(&self, v: &AntstorVolume) {
        if let Some(g) =
            liteio_api::meta::label(&v.metadata, liteio_api::keys::labels::VOL_GROUP_NAME)
        {
            self.group_queue
                .add(ObjectKey::new(v.namespace().unwrap_or_default(), g));
        }
    }

    /// Queues the migrations whose source or destination is the volume `key`.
    fn enqueue_migrations_of(&self, key: &ObjectKey) {
        for m in self.migrations() {
            let dest = migration::dest_key(&m);
            if migration::source_key(&m) == *key || dest.as_ref() == Some(key) {
                self.migration_queue.add(ObjectKey::of(m.as_ref()));
            }
        }
    }

    /// True once pools, volumes, snapshots, migrations and Leases were listed.
    pub fn is_synced(&self) -> bool {
        *self.synced_tx.borrow()
    }

    /// A receiver that turns true once pools, volumes, snapshots and Leases were listed.
    pub fn synced_receiver(&self) -> watch::Receiver<bool> {
        self.synced_tx.subscribe()
    }

    /// True once Kubernetes Nodes were listed (vanished-node cleanup needs it).
    pub fn nodes_synced(&self) -> bool {
        self.synced.nodes.load(Ordering::SeqCst)
    }

    fn mark_synced(&self, kind: &AtomicBool) {
        kind.store(true, Ordering::SeqCst);
        let all = [
            &self.synced.pools,
            &self.synced.volumes,
            &self.synced.snapshots,
            &self.synced.leases,
            &self.synced.migrations,
            &self.synced.groups,
            &self.synced.data_controls,
        ]
        .iter()
        .all(|f| f.load(Ordering::SeqCst));
        if all {
            self.synced_tx.send_replace(true);
        }
    }

    fn enqueue_volumes(&self, keys: impl IntoIterator<Item = ObjectKey>) {
        for k in keys {
            self.volumes.add(k);
        }
    }

    fn enqueue_pool(&self, name: &str) {
        self.pools.add(ObjectKey::new(self.namespace.clone(), name));
    }

    /// Notes that the volume `key` is now bound to `node` (`None`: unbound or gone) as its
    /// object says, and queues the key access of the node it left and the node it reached.
    /// A settled volume's updates queue nothing.
    fn key_access_moved(&self, key: &ObjectKey, node: Option<String>) {
        let old = {
            let mut m = self
                .key_nodes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match &node {
                Some(n) => m.insert(key.clone(), n.clone()),
                None => m.remove(key),
            }
        };
        if old != node {
            for n in old.iter().chain(node.iter()) {
                self.enqueue_key_access(n);
            }
        }
    }

    /// After a full list of volumes: queues every node whose set of volumes may have changed
    /// while the watch was down (all of them, once).
    fn key_access_relist(&self, nodes: HashMap<ObjectKey, String>) {
        let old = std::mem::replace(
            &mut *self
                .key_nodes
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            nodes.clone(),
        );
        let all: BTreeSet<&String> = old.values().chain(nodes.values()).collect();
        for n in all {
            self.enqueue_key_access(n);
        }
    }

    /// Queues the key access of `node` (when the controller keeps it).
    fn enqueue_key_access(&self, node: &str) {
        if self.config.node_key_access {
            self.key_access
                .add(ObjectKey::new(self.namespace.clone(), node));
        }
    }

    fn enqueue_snapshots(&self, keys: impl IntoIterator<Item = ObjectKey>) {
        for k in keys {
            self.snapshots.add(k);
        }
    }

    /// Merge-patches an object (or its status) under the controller's field manager and
    /// returns the result.
    pub async fn patch<K>(
        &self,
        ns: &str,
        name: &str,
        body: &serde_json::Value,
        status: bool,
    ) -> Result<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Debug,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), ns);
        let pp = PatchParams {
            field_manager: Some(managers::CONTROLLER.into()),
            ..PatchParams::default()
        };
        let patch = Patch::Merge(body);
        let r = if status {
            api.patch_status(name, &pp, &patch).await
        } else {
            api.patch(name, &pp, &patch).await
        };
        r.map(|mut o| {
            // Stored in the state as the watch's copies are: without managedFields.
            o.meta_mut().managed_fields = None;
            o
        })
        .map_err(|e| {
            Error::kube(
                format!(
                    "patch {}{} {ns}/{name}",
                    K::kind(&()),
                    if status { " status" } else { "" }
                ),
                e,
            )
        })
    }

    /// Publishes a Warning event about `obj` once per distinct message.
    pub async fn warn_once<K>(&self, obj: &K, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        let key = ObjectKey::new(obj.namespace().unwrap_or_default(), obj.name_any());
        {
            let mut w = self.warned.lock().unwrap_or_else(PoisonError::into_inner);
            if w.get(&key) == Some(&note) {
                return;
            }
            w.insert(key, note.clone());
        }
        let ev = KubeEvent {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: reason.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            warn!(error = %e, reason, "cannot publish event");
        }
    }

    /// Forgets the last warning about `key`.
    pub fn clear_warning(&self, key: &ObjectKey) {
        self.warned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }

    /// Runs every plug-in's step for a live object.
    pub async fn run_plugins(&self, obj: PluginObject<'_>) -> Result<()> {
        for p in &self.plugins {
            p.reconcile(obj).await?;
        }
        Ok(())
    }

    /// Runs every plug-in's deletion step.
    pub async fn run_plugin_deletions(&self, obj: PluginObject<'_>) -> Result<()> {
        for p in &self.plugins {
            p.handle_deletion(obj).await?;
        }
        Ok(())
    }

    /// Tells every plug-in an object is gone.
    pub async fn run_plugin_forget(&self, kind: Kind, key: &ObjectKey) -> Result<()> {
        for p in &self.plugins {
            p.forget(kind, key).await?;
        }
        Ok(())
    }

    fn sweep(self: &Arc<Self>, kind: Kind, live: Vec<ObjectKey>) {
        if self.plugins.is_empty() {
            return;
        }
        let ctx = Arc::clone(self);
        let mut set = self
            .background
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.background_stopped.load(Ordering::SeqCst) {
            return;
        }
        while set.try_join_next().is_some() {}
        set.spawn(async move {
            for p in &ctx.plugins {
                if let Err(e) = p.sweep(kind, live.clone()).await {
                    warn!(plugin = p.name(), kind = kind.as_str(), error = %e.chain(), "sweep failed");
                }
            }
        });
    }
}

// ---- watch handlers -------------------------------------------------------------------

fn on_pool(ctx: &Arc<Context>, ev: Event<StoragePool>, buf: &mut Vec<Arc<StoragePool>>) {
    match ev {
        Event::Init => buf.clear(),
        Event::InitApply(p) => buf.push(Arc::new(p)),
        Event::InitDone => {
            let pools = std::mem::take(buf);
            let names: Vec<ObjectKey> = pools.iter().map(|p| ObjectKey::of(p.as_ref())).collect();
            let unscheduled = {
                let mut s = ctx.state();
                s.replace_pools(pools);
                s.unscheduled_volumes()
            };
            for k in &names {
                ctx.pools.add(k.clone());
            }
            ctx.enqueue_volumes(unscheduled);
            ctx.enqueue_unplaced_groups();
            ctx.sweep(Kind::Pool, names);
            ctx.mark_synced(&ctx.synced.pools);
        }
        Event::Apply(p) => {
            let name = p.name_any();
            let (unscheduled, deleting, changed_pool_room) = {
                let mut s = ctx.state();
                let changed = s.upsert_pool(Arc::new(p));
                let unscheduled = if changed {
                    s.unscheduled_volumes()
                } else {
                    Vec::new()
                };
                // Volumes on this node being deleted, and those preset to it
                // (spec.targetNodeId) that waited for its pool to appear.
                let deleting: Vec<ObjectKey> = s
                    .volumes_on(&name)
                    .into_iter()
                    .filter(|k| {
                        s.volume(k).is_some_and(|v| {
                            v.metadata.deletion_timestamp.is_some()
                                || !v.finalizers().iter().any(|f| f == finalizers::IN_STATE)
                        })
                    })
                    .collect();
                (unscheduled, deleting, changed)
            };
            ctx.enqueue_pool(&name);
            ctx.enqueue_volumes(unscheduled);
            ctx.enqueue_volumes(deleting);
            if changed_pool_room {
                ctx.enqueue_unplaced_groups();
                ctx.enqueue_groups_on(&name);
            }
        }
        Event::Delete(p) => {
            let name = p.name_any();
            let vols = {
                let mut s = ctx.state();
                s.remove_pool(&name);
                s.volumes_on(&name)
            };
            ctx.enqueue_pool(&name);
            ctx.enqueue_volumes(vols);
            ctx.enqueue_groups_on(&name);
        }
    }
}

fn on_volume(ctx: &Arc<Context>, ev: Event<AntstorVolume>, buf: &mut Vec<Arc<AntstorVolume>>) {
    match ev {
        Event::Init => buf.clear(),
        Event::InitApply(v) => buf.push(Arc::new(v)),
        Event::InitDone => {
            let vols = std::mem::take(buf);
            let keys: Vec<ObjectKey> = vols.iter().map(|v| ObjectKey::of(v.as_ref())).collect();
            let nodes: HashMap<ObjectKey, String> = vols
                .iter()
                .filter_map(|v| Some((ObjectKey::of(v.as_ref()), v.target_node()?.to_string())))
                .collect();
            for v in &vols {
                ctx.enqueue_group_of(v);
            }
            ctx.state().replace_volumes(vols);
            ctx.key_access_relist(nodes);
            ctx.enqueue_volumes(keys.clone());
            ctx.sweep(Kind::Volume, keys);
            ctx.mark_synced(&ctx.synced.volumes);
        }
        Event::Apply(v) => {
            let key = ObjectKey::of(&v);
            let deleting = v.metadata.deletion_timestamp.is_some();
            let new_node = v.target_node().map(str::to_string);
            let (snaps, unscheduled) = {
                let mut s = ctx.state();
                s.upsert_volume(Arc::new(v));
                let unscheduled = if deleting {
                    s.unscheduled_volumes()
                } else {
                    Vec::new()
                };
                (s.snapshots_of(&key), unscheduled)
            };
            ctx.key_access_moved(&key, new_node);
            ctx.enqueue_migrations_of(&key);
            if let Some(v) = ctx.state().volume(&key).cloned() {
                ctx.enqueue_group_of(&v);
            }
            ctx.volumes.add(key);
            ctx.enqueue_snapshots(snaps);
            ctx.enqueue_volumes(unscheduled);
        }
        Event::Delete(v) => {
            let key = ObjectKey::of(&v);
            let (snaps, unscheduled) = {
                let mut s = ctx.state();
                s.remove_volume(&key);
                (s.snapshots_of(&key), s.unscheduled_volumes())
            };
            if let Some(n) = v.target_node() {
                ctx.enqueue_pool(n);
            }
            ctx.key_access_moved(&key, None);
            ctx.enqueue_migrations_of(&key);
            ctx.enqueue_group_of(&v);
            ctx.volumes.add(key);
            ctx.enqueue_snapshots(snaps);
            ctx.enqueue_volumes(unscheduled);
        }
    }
}

fn on_snapshot(
    ctx: &Arc<Context>,
    ev: Event<AntstorSnapshot>,
    buf: &mut Vec<Arc<AntstorSnapshot>>,
) {
    match ev {
        Event::Init => buf.clear(),
        Event::InitApply(s) => buf.push(Arc::new(s)),
        Event::InitDone => {
            let snaps = std::mem::take(buf);
            let keys: Vec<ObjectKey> = snaps.iter().map(|s| ObjectKey::of(s.as_ref())).collect();
            ctx.state().replace_snapshots(snaps);
            ctx.enqueue_snapshots(keys.clone());
            ctx.sweep(Kind::Snapshot, keys);
            ctx.mark_synced(&ctx.synced.snapshots);
        }
        Event::Apply(snap) => {
            let origin = State::origin_of(&snap);
            let key = ObjectKey::of(&snap);
            let (siblings, clones) = {
                let mut s = ctx.state();
                let new = s.snapshot(&key).is_none();
                s.upsert_snapshot(Arc::new(snap));
                // Clones that waited for this snapshot to exist.
                let clones = if new {
                    s.clones_waiting_for(&key)
                } else {
                    Vec::new()
                };
                (s.snapshots_of(&origin), clones)
            };
            ctx.enqueue_snapshots(siblings);
            ctx.enqueue_volumes(clones);
        }
        Event::Delete(snap) => {
            let origin = State::origin_of(&snap);
            let key = ObjectKey::of(&snap);
            let (siblings, unscheduled) = {
                let mut s = ctx.state();
                s.remove_snapshot(&key);
                (s.snapshots_of(&origin), s.unscheduled_volumes())
            };
            ctx.snapshots.add(key);
            ctx.enqueue_snapshots(siblings);
            ctx.enqueue_volumes(unscheduled);
        }
    }
}

fn on_migration(
    ctx: &Arc<Context>,
    ev: Event<VolumeMigration>,
    buf: &mut Vec<Arc<VolumeMigration>>,
) {
    match ev {
        Event::Init => buf.clear(),
        Event::InitApply(m) => buf.push(Arc::new(m)),
        Event::InitDone => {
            let migs = std::mem::take(buf);
            let keys: Vec<ObjectKey> = migs.iter().map(|m| ObjectKey::of(m.as_ref())).collect();
            {
                let mut cache = ctx
                    .migration_cache
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                cache.clear();
                for (k, m) in keys.iter().zip(migs) {
                    cache.insert(k.clone(), m);
                }
            }
            ctx.count_migrations();
            for k in keys {
                ctx.migration_queue.add(k);
            }
            ctx.mark_synced(&ctx.synced.migrations);
        }
        Event::Apply(m) => {
            let key = ObjectKey::of(&m);
            ctx.upsert_migration(Arc::new(m));
            ctx.migration_queue.add(key);
        }
        Event::Delete(m) => {
            let key = ObjectKey::of(&m);
            ctx.remove_migration(&key);
            ctx.migration_queue.add(key);
            // Another migration of the same volume may have waited for this one.
            let src = migration::source_key(&m);
            for other in ctx.migrations() {
                if migration::source_key(&other) == src {
                    ctx.migration_queue.add(ObjectKey::of(other.as_ref()));
                }
            }
        }
    }
}

fn on_group(
    ctx: &Arc<Context>,
    ev: Event<AntstorVolumeGroup>,
    buf: &mut Vec<Arc<AntstorVolumeGroup>>,
) {
    match ev {
        Event::Init => buf.clear(),
        Event::InitApply(g) => buf.push(Arc::new(g)),
        Event::InitDone => {
            let groups = std::mem::take(buf);
            let mut cache = HashMap::new();
            for g in groups {
                cache.insert(ObjectKey::of(g.as_ref()), g);
            }
            let keys: Vec<ObjectKey> = cache.keys().cloned().collect();
            let dcs: Vec<ObjectKey> = cache
                .values()
                .map(|g| members::data_control_key(g))
                .collect();
            *ctx.group_cache
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = cache;
            for k in keys {
                ctx.group_queue.add(k);
            }
            for k in dcs {
                ctx.data_control_queue.add(k);
            }
            ctx.mark_synced(&ctx.synced.groups);
        }
        Event::Apply(g) => {
            let key = ObjectKey::of(&g);
            let dc = members::data_control_key(&g);
            ctx.upsert_group(Arc::new(g));
            ctx.group_queue.add(key);
            ctx.data_control_queue.add(dc);
        }
        Event::Delete(g) => {
            let key = ObjectKey::of(&g);
            ctx.group_cache
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&key);
            ctx.data_control_queue.add(members::data_control_key(&g));
        }
    }
}

fn groups_of(dc: &AntstorDataControl) -> Vec<ObjectKey> {
    let ns = dc.namespace().unwrap_or_default();
    dc.spec
        .volume_groups
        .iter()
        .map(|g| {
            ObjectKey::new(
                if g.namespace.is_empty() {
                    ns.clone()
                } else {
                    g.namespace.clone()
                },
                g.name.clone(),
            )
        })
        .collect()
}

fn on_data_control(
    ctx: &Arc<Context>,
    ev: Event<AntstorDataControl>,
    buf: &mut Vec<Arc<AntstorDataControl>>,
) {
    match ev {
        Event::Init => buf.clear(),
        Event::InitApply(d) => buf.push(Arc::new(d)),
        Event::InitDone => {
            let dcs = std::mem::take(buf);
            let mut cache = HashMap::new();
            for d in dcs {
                cache.insert(ObjectKey::of(d.as_ref()), d);
            }
            let keys: Vec<ObjectKey> = cache.keys().cloned().collect();
            *ctx.data_control_cache
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = cache;
            for k in keys {
                ctx.data_control_queue.add(k);
            }
            ctx.mark_synced(&ctx.synced.data_controls);
        }
        Event::Apply(d) => {
            let key = ObjectKey::of(&d);
            let deleting = d.metadata.deletion_timestamp.is_some();
            let groups = groups_of(&d);
            // A replicated volume's groups act on its replicas' reports.
            let replicated = d.is_replicated();
            ctx.upsert_data_control(Arc::new(d));
            ctx.data_control_queue.add(key);
            if deleting || replicated {
                for g in groups {
                    ctx.group_queue.add(g);
                }
            }
        }
        Event::Delete(d) => {
            let key = ObjectKey::of(&d);
            ctx.data_control_cache
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&key);
            replicated::forget(ctx, &key);
            // Its groups may wait for it to go before they delete their members.
            for g in groups_of(&d) {
                ctx.group_queue.add(g);
            }
        }
    }
}

fn lease_time(l: &Lease) -> Option<k8s_openapi::jiff::Timestamp> {
    let spec = l.spec.as_ref()?;
    spec.renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0)
}

fn on_lease(ctx: &Arc<Context>, ev: Event<Lease>, buf: &mut Vec<Lease>) {
    match ev {
        Event::Init => buf.clear(),
        Event::InitApply(l) => buf.push(l),
        Event::InitDone => {
            let beats: Vec<(String, k8s_openapi::jiff::Timestamp)> = std::mem::take(buf)
                .iter()
                .filter_map(|l| Some((l.name_any(), lease_time(l)?)))
                .collect();
            let names: Vec<String> = ctx.state().pools().map(|p| p.name.to_string()).collect();
            ctx.state().replace_heartbeats(beats);
            for n in names {
                ctx.enqueue_pool(&n);
            }
            ctx.mark_synced(&ctx.synced.leases);
        }
        Event::Apply(l) => {
            let name = l.name_any();
            ctx.state().set_heartbeat(&name, lease_time(&l));
            ctx.enqueue_pool(&name);
        }
        Event::Delete(l) => {
            let name = l.name_any();
            ctx.state().set_heartbeat(&name, None);
            ctx.enqueue_pool(&name);
        }
    }
}

fn node_facts(n: &Node) -> NodeFacts {
    NodeFacts {
        labels: n.metadata.labels.clone().unwrap_or_default(),
        taints: n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default(),
    }
}

fn on_node(ctx: &Arc<Context>, ev: Event<Node>, buf: &mut Vec<(String, NodeFacts)>) {
    match ev {
        Event::Init => buf.clear(),
        Event::InitApply(n) => buf.push((n.name_any(), node_facts(&n))),
        Event::InitDone => {
            ctx.state().replace_nodes(std::mem::take(buf));
            ctx.synced.nodes.store(true, Ordering::SeqCst);
            let names: Vec<String> = ctx.state().pools().map(|p| p.name.to_string()).collect();
            for n in names {
                ctx.enqueue_pool(&n);
            }
        }
        Event::Apply(n) => {
            let name = n.name_any();
            ctx.state().upsert_node(&name, node_facts(&n));
            ctx.enqueue_pool(&name);
        }
        Event::Delete(n) => {
            let name = n.name_any();
            ctx.state().remove_node(&name);
            ctx.enqueue_pool(&name);
        }
    }
}

async fn watch_loop<K, B>(
    ctx: Arc<Context>,
    api: Api<K>,
    cfg: watcher::Config,
    mut handler: impl FnMut(&Arc<Context>, Event<K>, &mut B),
    mut buf: B,
    mut shutdown: watch::Receiver<bool>,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).to_string();
    // managedFields (who wrote which field: often the largest part of an object) are never
    // read here; the state keeps every object, so they go before it does.
    let mut stream = watcher(api, cfg)
        .modify(|o: &mut K| o.meta_mut().managed_fields = None)
        .default_backoff()
        .boxed();
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            item = stream.next() => match item {
                None => return,
                Some(Ok(ev)) => handler(&ctx, ev, &mut buf),
                Some(Err(e)) => warn!(kind, error = %e, "watch failed; retrying"),
            }
        }
    }
}

use kube::runtime::watcher::watcher;

/// The kinds the workers reconcile (one queue and `workers.<kind>` workers each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WorkKind {
    Volume,
    Pool,
    Snapshot,
    Migration,
    KeyAccess,
    Group,
    DataControl,
}

impl WorkKind {
    /// This kind's worker count.
    fn workers(self, w: &crate::config::Workers) -> u32 {
        match self {
            Self::Volume => w.volume,
            Self::Pool => w.pool,
            Self::Snapshot => w.snapshot,
            Self::Migration => w.migration,
            Self::KeyAccess => w.key_access,
            Self::Group => w.group,
            Self::DataControl => w.data_control,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Volume => Kind::Volume.as_str(),
            Self::Pool => Kind::Pool.as_str(),
            Self::Snapshot => Kind::Snapshot.as_str(),
            Self::Migration => "migration",
            Self::KeyAccess => "key_access",
            Self::Group => "volume_group",
            Self::DataControl => "data_control",
        }
    }
}

async fn worker(ctx: Arc<Context>, kind: WorkKind, mut shutdown: watch::Receiver<bool>) {
    let mut synced = ctx.synced_tx.subscribe();
    loop {
        if *synced.borrow() {
            break;
        }
        tokio::select! {
            _ = shutdown.changed() => return,
            r = synced.changed() => if r.is_err() { return },
        }
    }
    let queue = match kind {
        WorkKind::Volume => Arc::clone(&ctx.volumes),
        WorkKind::Pool => Arc::clone(&ctx.pools),
        WorkKind::Snapshot => Arc::clone(&ctx.snapshots),
        WorkKind::Migration => Arc::clone(&ctx.migration_queue),
        WorkKind::KeyAccess => Arc::clone(&ctx.key_access),
        WorkKind::Group => Arc::clone(&ctx.group_queue),
        WorkKind::DataControl => Arc::clone(&ctx.data_control_queue),
    };
    loop {
        let key = tokio::select! {
            _ = shutdown.changed() => return,
            k = queue.pop() => k,
        };
        let one = async {
            match kind {
                WorkKind::Volume => volume::reconcile(&ctx, &key).await,
                WorkKind::Pool => pool::reconcile(&ctx, &key).await,
                WorkKind::Snapshot => snapshot::reconcile(&ctx, &key).await,
                WorkKind::Migration => migration::reconcile(&ctx, &key).await,
                WorkKind::KeyAccess => keys::reconcile(&ctx, &key).await,
                WorkKind::Group => group::reconcile_group(&ctx, &key).await,
                WorkKind::DataControl => group::reconcile_data_control(&ctx, &key).await,
            }
        };
        // A request that hangs would hold this worker (and, once every worker of the kind is
        // held, every object of the kind): past `reconcileTimeout` the reconcile is
        // abandoned (reconciles are idempotent: the next one starts from what the API
        // server has) and retried.
        let limit = ctx.config.reconcile_timeout;
        let res = tokio::time::timeout(limit, one).await.unwrap_or_else(|_| {
            Err(Error::ReconcileTimeout {
                object: format!("{} {key}", kind.as_str()),
                after: limit,
            })
        });
        match res {
            Ok(action) => {
                ctx.metrics
                    .reconciles
                    .with_label_values(&[kind.as_str(), "ok"])
                    .inc();
                queue.succeeded(&key);
                if let Action::RequeueAfter(d) = action {
                    queue.add_after(key.clone(), d);
                }
            }
            Err(e) => {
                let ek = e.kind();
                ctx.metrics
                    .reconciles
                    .with_label_values(&[kind.as_str(), ek.as_str()])
                    .inc();
                let n = queue.failed(&key);
                let delay = backoff(n, ek);
                if ek == ErrorKind::Conflict {
                    debug!(kind = kind.as_str(), object = %key, error = %e, "conflict; retrying");
                } else {
                    warn!(kind = kind.as_str(), object = %key, error = %e.chain(), attempt = n, ?delay, "reconcile failed; retrying");
                }
                queue.add_after(key.clone(), delay);
            }
        }
        queue.done(&key);
    }
}

/// Unix seconds of a timestamp.
fn unix_seconds(t: k8s_openapi::jiff::Timestamp) -> f64 {
    t.as_millisecond() as f64 / 1e3
}

/// The per-object gauges of pools and volumes as of `now`: each pool's status and Lease age,
/// and the volumes that are not ready (nor being deleted) with their creation time.
fn observe(ctx: &Context, s: &State, now: k8s_openapi::jiff::Timestamp) {
    let pools: Vec<crate::metrics::PoolSample> = s
        .pools()
        .map(|p| {
            let st = p
                .pool
                .status
                .as_ref()
                .and_then(|s| s.status)
                .unwrap_or_default();
            let seen = s
                .heartbeat(p.name)
                .or_else(|| p.pool.metadata.creation_timestamp.as_ref().map(|t| t.0));
            crate::metrics::PoolSample {
                pool: p.name.to_string(),
                status: pool::status_name(st),
                lease_age_seconds: seen.map(|t| crate::clock::elapsed(now, t).as_secs_f64()),
            }
        })
        .collect();
    ctx.metrics.observe_pools(&pools);
    let volumes: Vec<crate::metrics::VolumeSample> = s
        .volume_keys()
        .iter()
        .filter_map(|k| s.volume(k))
        .filter(|v| {
            v.phase() != liteio_api::VolumeStatus::Ready && v.metadata.deletion_timestamp.is_none()
        })
        .map(|v| {
            let label = |k: &str| v.labels().get(k).cloned().unwrap_or_default();
            crate::metrics::VolumeSample {
                volume: v.name_any(),
                node: v.spec.target_node_id.clone(),
                pvc_namespace: label(liteio_api::keys::labels::PVC_NAMESPACE),
                pvc: label(liteio_api::keys::labels::PVC_NAME),
                created: v
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map_or_else(|| unix_seconds(now), |t| unix_seconds(t.0)),
            }
        })
        .collect();
    ctx.metrics.observe_volumes(&volumes);
}

/// The liveness clock: re-queues every pool and every volume being deleted, and refreshes
/// the pools-by-state gauge and the per-pool and per-volume ones.
async fn liveness_clock(ctx: Arc<Context>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(ctx.config.liveness.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        let (pools, deleting, counts) = {
            let s = ctx.state();
            let mut counts: HashMap<&'static str, i64> = HashMap::new();
            let pools: Vec<String> = s
                .pools()
                .map(|p| {
                    let st = p
                        .pool
                        .status
                        .as_ref()
                        .and_then(|s| s.status)
                        .unwrap_or_default();
                    *counts.entry(pool::status_name(st)).or_default() += 1;
                    p.name.to_string()
                })
                .collect();
            observe(&ctx, &s, ctx.clock.now());
            (pools, s.deleting_volumes(), counts)
        };
        for st in crate::metrics::POOL_STATUSES {
            ctx.metrics
                .pools
                .with_label_values(&[st])
                .set(counts.get(st).copied().unwrap_or(0));
        }
        for p in pools {
            ctx.enqueue_pool(&p);
        }
        ctx.enqueue_volumes(deleting);
    }
}

/// Once the caches are synced, queues every node that holds key access now, so that a node
/// whose last volume went while no controller ran loses it (the volume watch queues the
/// nodes that have volumes). Retried with back-off until the list succeeds.
async fn stale_key_access(ctx: Arc<Context>, mut shutdown: watch::Receiver<bool>) {
    let mut synced = ctx.synced_tx.subscribe();
    while !*synced.borrow() {
        tokio::select! {
            _ = shutdown.changed() => return,
            r = synced.changed() => if r.is_err() { return },
        }
    }
    let mut failures = 0;
    loop {
        match keys::nodes_with_access(&ctx).await {
            Ok(nodes) => {
                for n in nodes {
                    ctx.enqueue_key_access(&n);
                }
                return;
            }
            Err(e) => {
                failures += 1;
                let delay = backoff(failures, e.kind());
                warn!(error = %e.chain(), ?delay, "cannot list the nodes' key access; retrying");
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Runs the watches, the workers and the liveness clock until `shutdown` turns true.
pub async fn run(ctx: Arc<Context>, shutdown: watch::Receiver<bool>) {
    let ns = ctx.namespace.clone();
    let client = ctx.client.clone();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(watch_loop(
        Arc::clone(&ctx),
        Api::<StoragePool>::namespaced(client.clone(), &ns),
        watcher::Config::default(),
        on_pool,
        Vec::new(),
        shutdown.clone(),
    ));
    tasks.spawn(watch_loop(
        Arc::clone(&ctx),
        Api::<AntstorVolume>::namespaced(client.clone(), &ns),
        watcher::Config::default(),
        on_volume,
        Vec::new(),
        shutdown.clone(),
    ));
    tasks.spawn(watch_loop(
        Arc::clone(&ctx),
        Api::<AntstorSnapshot>::namespaced(client.clone(), &ns),
        watcher::Config::default(),
        on_snapshot,
        Vec::new(),
        shutdown.clone(),
    ));
    tasks.spawn(watch_loop(
        Arc::clone(&ctx),
        Api::<VolumeMigration>::namespaced(client.clone(), &ns),
        watcher::Config::default(),
        on_migration,
        Vec::new(),
        shutdown.clone(),
    ));
    tasks.spawn(watch_loop(
        Arc::clone(&ctx),
        Api::<AntstorVolumeGroup>::namespaced(client.clone(), &ns),
        watcher::Config::default(),
        on_group,
        Vec::new(),
        shutdown.clone(),
    ));
    tasks.spawn(watch_loop(
        Arc::clone(&ctx),
        Api::<AntstorDataControl>::namespaced(client.clone(), &ns),
        watcher::Config::default(),
        on_data_control,
        Vec::new(),
        shutdown.clone(),
    ));
    tasks.spawn(watch_loop(
        Arc::clone(&ctx),
        Api::<Lease>::namespaced(client.clone(), &ns),
        watcher::Config::default(),
        on_lease,
        Vec::new(),
        shutdown.clone(),
    ));
    let sel = &ctx.config.scheduler.node_cache_selector;
    let mut node_cfg = watcher::Config::default();
    if !sel.is_empty() {
        let s: Vec<String> = sel.iter().map(|(k, v)| format!("{k}={v}")).collect();
        node_cfg = node_cfg.labels(&s.join(","));
    }
    tasks.spawn(watch_loop(
        Arc::clone(&ctx),
        Api::<Node>::all(client),
        node_cfg,
        on_node,
        Vec::new(),
        shutdown.clone(),
    ));
    for kind in [
        WorkKind::Volume,
        WorkKind::Pool,
        WorkKind::Snapshot,
        WorkKind::Migration,
        WorkKind::KeyAccess,
        WorkKind::Group,
        WorkKind::DataControl,
    ] {
        for _ in 0..kind.workers(&ctx.config.workers) {
            tasks.spawn(worker(Arc::clone(&ctx), kind, shutdown.clone()));
        }
    }
    if ctx.config.node_key_access {
        tasks.spawn(stale_key_access(Arc::clone(&ctx), shutdown.clone()));
    }
    tasks.spawn(liveness_clock(Arc::clone(&ctx), shutdown.clone()));
    while tasks.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use futures::future::BoxFuture;
    use std::sync::atomic::AtomicUsize;

    /// A plug-in whose sweeps wait until released, then count as a write.
    #[derive(Debug, Default)]
    struct SlowSweep {
        started: Notify,
        release: Notify,
        writes: AtomicUsize,
    }

    impl Plugin for SlowSweep {
        fn name(&self) -> &'static str {
            "SlowSweep"
        }
        fn reconcile<'a>(&'a self, _: PluginObject<'a>) -> BoxFuture<'a, Result<()>> {
            Box::pin(async { Ok(()) })
        }
        fn handle_deletion<'a>(&'a self, _: PluginObject<'a>) -> BoxFuture<'a, Result<()>> {
            Box::pin(async { Ok(()) })
        }
        fn sweep<'a>(&'a self, _: Kind, _: Vec<ObjectKey>) -> BoxFuture<'a, Result<()>> {
            Box::pin(async move {
                self.started.notify_one();
                self.release.notified().await;
                self.writes.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
        }
    }

    fn context(plugin: Arc<SlowSweep>) -> Arc<Context> {
        // Never contacted: the sweep under test talks only to the plug-in.
        let url = "http://127.0.0.1:9".parse().unwrap();
        let client = Client::try_from(kube::Config::new(url)).unwrap();
        Context::new(
            client,
            "obnvmf",
            Config::default(),
            None,
            vec![plugin],
            Metrics::new().unwrap(),
        )
    }

    /// Many workers on one queue while keys are added again and again: a key is never held
    /// by two workers at once, a key added while it runs is processed again afterwards, and
    /// different keys do run at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_key_is_never_held_by_two_workers() {
        tokio::time::timeout(Duration::from_secs(30), async {
            const KEYS: usize = 20;
            const WORKERS: usize = 8;
            let queue = Arc::new(WorkQueue::default());
            let key = |i: usize| ObjectKey::new("ns", format!("k{i}"));
            // Per key: held now, times added, adds seen by a run that started after them.
            let held = Arc::new(Mutex::new(HashSet::<ObjectKey>::new()));
            let added = Arc::new(Mutex::new(HashMap::<ObjectKey, usize>::new()));
            let covered = Arc::new(Mutex::new(HashMap::<ObjectKey, usize>::new()));
            let overlaps = Arc::new(AtomicUsize::new(0));
            let peak = Arc::new(AtomicUsize::new(0));
            let mut workers = tokio::task::JoinSet::new();
            for _ in 0..WORKERS {
                let (queue, held, added, covered, overlaps, peak) = (
                    Arc::clone(&queue),
                    Arc::clone(&held),
                    Arc::clone(&added),
                    Arc::clone(&covered),
                    Arc::clone(&overlaps),
                    Arc::clone(&peak),
                );
                workers.spawn(async move {
                    loop {
                        let k = queue.pop().await;
                        {
                            let mut h = held.lock().unwrap();
                            if !h.insert(k.clone()) {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            peak.fetch_max(h.len(), Ordering::SeqCst);
                            let n = added.lock().unwrap().get(&k).copied().unwrap_or(0);
                            covered.lock().unwrap().insert(k.clone(), n);
                        }
                        for _ in 0..3 {
                            tokio::task::yield_now().await;
                        }
                        held.lock().unwrap().remove(&k);
                        queue.done(&k);
                    }
                });
            }
            for round in 0..200 {
                for i in 0..KEYS {
                    let k = key((i + round) % KEYS);
                    *added.lock().unwrap().entry(k.clone()).or_default() += 1;
                    queue.add(k);
                }
                tokio::task::yield_now().await;
            }
            // Drained: every key's last add was seen by a run that started after it.
            loop {
                let idle = queue.is_empty() && held.lock().unwrap().is_empty();
                let caught_up = {
                    let a = added.lock().unwrap();
                    let c = covered.lock().unwrap();
                    a.iter().all(|(k, n)| c.get(k) == Some(n))
                };
                if idle && caught_up {
                    break;
                }
                tokio::task::yield_now().await;
            }
            workers.abort_all();
            assert_eq!(overlaps.load(Ordering::SeqCst), 0, "a key held twice");
            assert!(
                peak.load(Ordering::SeqCst) >= 2,
                "the workers never held two keys at once"
            );
        })
        .await
        .expect("timed out: an added key was never processed again");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn no_plugin_sweep_writes_after_the_reconcilers_stopped() {
        tokio::time::timeout(Duration::from_secs(10), async {
            let plugin = Arc::new(SlowSweep::default());
            let ctx = context(Arc::clone(&plugin));
            ctx.sweep(Kind::Volume, Vec::new());
            plugin.started.notified().await;
            ctx.stop_background().await;
            // Released after the stop: the aborted sweep must not write.
            plugin.release.notify_waiters();
            ctx.sweep(Kind::Volume, Vec::new());
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            assert_eq!(plugin.writes.load(Ordering::SeqCst), 0);
            assert!(
                ctx.background.lock().unwrap().is_empty(),
                "no sweep after the stop"
            );
        })
        .await
        .expect("timed out");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_sweep_runs_to_its_end_while_leading() {
        tokio::time::timeout(Duration::from_secs(10), async {
            let plugin = Arc::new(SlowSweep::default());
            let ctx = context(Arc::clone(&plugin));
            ctx.sweep(Kind::Pool, Vec::new());
            plugin.started.notified().await;
            plugin.release.notify_one();
            let mut set = std::mem::take(&mut *ctx.background.lock().unwrap());
            while set.join_next().await.is_some() {}
            assert_eq!(plugin.writes.load(Ordering::SeqCst), 1);
        })
        .await
        .expect("timed out");
    }
}
