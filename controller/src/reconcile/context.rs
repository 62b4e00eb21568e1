//! What every reconciler, watch and worker shares: the [`Context`] (the API client, the
//! configuration, the scheduler, the [`State`] under its lock, the per-kind work queues, the
//! caches of migrations, groups and data controls, events, plug-in steps and their
//! background sweeps) and the small operations on it that several of them need (queue a
//! kind, patch an object, warn once, run the plug-ins). What an event or a pass *decides*
//! is elsewhere: the watches in `watches.rs`, the workers in `workers.rs`.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
use liteio_api::keys::managers;
use liteio_api::{AntstorDataControl, AntstorVolume, AntstorVolumeGroup, VolumeMigration};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tracing::warn;

use super::queue::WorkQueue;
use super::{migration, replicated};
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::plugin::{Kind, Plugin, PluginObject};
use crate::scheduler::Scheduler;
use crate::state::{ObjectKey, State};

#[derive(Debug, Default)]
pub(super) struct Synced {
    pub(super) pools: AtomicBool,
    pub(super) volumes: AtomicBool,
    pub(super) snapshots: AtomicBool,
    pub(super) leases: AtomicBool,
    pub(super) migrations: AtomicBool,
    pub(super) groups: AtomicBool,
    pub(super) data_controls: AtomicBool,
    pub(super) nodes: AtomicBool,
}

/// Objects of one kind as last seen (watch events and this controller's writes), by key.
#[derive(Debug)]
pub(super) struct Cache<T>(Mutex<HashMap<ObjectKey, Arc<T>>>);

impl<T> Default for Cache<T> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

impl<T: Resource> Cache<T> {
    fn lock(&self) -> MutexGuard<'_, HashMap<ObjectKey, Arc<T>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The object `key`.
    pub(super) fn get(&self, key: &ObjectKey) -> Option<Arc<T>> {
        self.lock().get(key).cloned()
    }

    /// Every object.
    pub(super) fn all(&self) -> Vec<Arc<T>> {
        self.lock().values().cloned().collect()
    }

    /// The keys of the objects that `keep` holds for.
    pub(super) fn keys_where(&self, keep: impl Fn(&T) -> bool) -> Vec<ObjectKey> {
        self.lock()
            .iter()
            .filter(|(_, o)| keep(o))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Records the latest version of an object.
    pub(super) fn upsert(&self, o: Arc<T>) {
        self.lock().insert(ObjectKey::of(o.as_ref()), o);
    }

    /// Forgets an object.
    pub(super) fn remove(&self, key: &ObjectKey) {
        self.lock().remove(key);
    }

    /// Every object there is, after a full list: the keys of the objects, in the list's order.
    pub(super) fn replace(&self, all: Vec<Arc<T>>) -> Vec<ObjectKey> {
        let keys: Vec<ObjectKey> = all.iter().map(|o| ObjectKey::of(o.as_ref())).collect();
        *self.lock() = keys.iter().cloned().zip(all).collect();
        keys
    }
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
    pub(super) volumes: Arc<WorkQueue>,
    pub(super) pools: Arc<WorkQueue>,
    pub(super) snapshots: Arc<WorkQueue>,
    pub(super) migration_queue: Arc<WorkQueue>,
    /// Storage nodes whose key access ([`keys`]) may be out of date.
    pub(super) key_access: Arc<WorkQueue>,
    /// The node each volume's object names (`spec.targetNodeId`), as key access last saw it.
    key_nodes: Mutex<HashMap<ObjectKey, String>>,
    /// The VolumeMigrations, as last seen (watch events and this controller's writes).
    pub(super) migration_cache: Cache<VolumeMigration>,
    pub(super) group_queue: Arc<WorkQueue>,
    pub(super) data_control_queue: Arc<WorkQueue>,
    /// The AntstorVolumeGroups and AntstorDataControls, as last seen.
    pub(super) group_cache: Cache<AntstorVolumeGroup>,
    pub(super) data_control_cache: Cache<AntstorDataControl>,
    pub(super) synced: Synced,
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
            migration_cache: Cache::default(),
            group_queue: Arc::default(),
            data_control_queue: Arc::default(),
            group_cache: Cache::default(),
            data_control_cache: Cache::default(),
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
        self.migration_cache.get(key)
    }

    /// Every VolumeMigration as last seen.
    pub fn migrations(&self) -> Vec<Arc<VolumeMigration>> {
        self.migration_cache.all()
    }

    /// Records the latest version of a VolumeMigration (and refreshes the by-phase gauge).
    pub fn upsert_migration(&self, mig: Arc<VolumeMigration>) {
        self.migration_cache.upsert(mig);
        self.count_migrations();
    }

    /// Forgets a VolumeMigration.
    pub fn remove_migration(&self, key: &ObjectKey) {
        self.migration_cache.remove(key);
        self.count_migrations();
    }

    pub(super) fn count_migrations(&self) {
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
            .observe_migrations(&under_way, crate::clock::unix_seconds(self.clock.now()));
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
        self.group_cache.get(key)
    }

    /// Records the latest version of an AntstorVolumeGroup.
    pub fn upsert_group(&self, g: Arc<AntstorVolumeGroup>) {
        self.group_cache.upsert(g);
    }

    /// The AntstorDataControl `key` as last seen.
    pub fn data_control(&self, key: &ObjectKey) -> Option<Arc<AntstorDataControl>> {
        self.data_control_cache.get(key)
    }

    /// Records the latest version of an AntstorDataControl.
    pub fn upsert_data_control(&self, dc: Arc<AntstorDataControl>) {
        self.data_control_cache.upsert(dc);
    }

    /// Queues the data control `key`.
    pub fn enqueue_data_control(&self, key: ObjectKey) {
        self.data_control_queue.add(key);
    }

    /// Queues the groups that do not hold their total yet, and those that wait for room for
    /// a replica's replacement (after a pool changed).
    pub(super) fn enqueue_unplaced_groups(&self) {
        let keys = self.group_cache.keys_where(|g| {
            (!g.fully_placed()
                || liteio_api::meta::annotation(&g.metadata, liteio_api::replica::ANNO_REPLACING)
                    .is_some())
                && g.metadata.deletion_timestamp.is_none()
        });
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
    pub(super) fn enqueue_group_of(&self, v: &AntstorVolume) {
        if let Some(g) =
            liteio_api::meta::label(&v.metadata, liteio_api::keys::labels::VOL_GROUP_NAME)
        {
            self.group_queue
                .add(ObjectKey::new(v.namespace().unwrap_or_default(), g));
        }
    }

    /// Queues the migrations whose source or destination is the volume `key`.
    pub(super) fn enqueue_migrations_of(&self, key: &ObjectKey) {
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

    /// Waits until pools, volumes, snapshots, migrations and Leases were listed; false when
    /// `shutdown` (or the end of the context) comes first.
    pub(super) async fn wait_synced(&self, shutdown: &mut watch::Receiver<bool>) -> bool {
        let mut synced = self.synced_tx.subscribe();
        while !*synced.borrow() {
            tokio::select! {
                _ = shutdown.changed() => return false,
                r = synced.changed() => if r.is_err() { return false },
            }
        }
        true
    }

    /// True once Kubernetes Nodes were listed (vanished-node cleanup needs it).
    pub fn nodes_synced(&self) -> bool {
        self.synced.nodes.load(Ordering::SeqCst)
    }

    pub(super) fn mark_synced(&self, kind: &AtomicBool) {
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

    pub(super) fn enqueue_volumes(&self, keys: impl IntoIterator<Item = ObjectKey>) {
        for k in keys {
            self.volumes.add(k);
        }
    }

    pub(super) fn enqueue_pool(&self, name: &str) {
        self.pools.add(ObjectKey::new(self.namespace.clone(), name));
    }

    /// Notes that the volume `key` is now bound to `node` (`None`: unbound or gone) as its
    /// object says, and queues the key access of the node it left and the node it reached.
    /// A settled volume's updates queue nothing.
    pub(super) fn key_access_moved(&self, key: &ObjectKey, node: Option<String>) {
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
    pub(super) fn key_access_relist(&self, nodes: HashMap<ObjectKey, String>) {
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
    pub(super) fn enqueue_key_access(&self, node: &str) {
        if self.config.node_key_access {
            self.key_access
                .add(ObjectKey::new(self.namespace.clone(), node));
        }
    }

    pub(super) fn enqueue_snapshots(&self, keys: impl IntoIterator<Item = ObjectKey>) {
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
        self.publish(obj, EventType::Warning, reason, note).await;
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

    pub(super) fn sweep(self: &Arc<Self>, kind: Kind, live: Vec<ObjectKey>) {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use futures::future::BoxFuture;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;
    use tokio::sync::Notify;

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
