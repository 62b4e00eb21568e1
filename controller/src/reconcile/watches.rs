//! The watches: what each event of each watched kind does to the [`State`], the caches and the
//! work queues. One table ([`WATCHES`]) lists the kinds; one loop ([`watch_loop`]) runs every
//! watch the same way (managedFields dropped, the watcher's default back-off, a failed watch
//! logged and retried, stopped by `shutdown`); each kind says only its own part
//! ([`Watched`]): where its objects come from, what a full list, an update and a deletion do.
//!
//! The triggers, kind by kind:
//! - **StoragePool**: its own reconcile; the volumes on its node being deleted or preset to
//!   it; when its room changed, the volumes that did not fit, the groups not yet placed (or
//!   waiting for room for a replacement) and the groups with a member on its node; on
//!   deletion, every volume and group on its node.
//! - **AntstorVolume**: its own reconcile, its snapshots, the migrations it is the source or
//!   destination of, its group, the key access of the node it left and of the node it
//!   reached; when it is being deleted or gone, the volumes that did not fit; when gone, its
//!   pool.
//! - **AntstorSnapshot**: the other snapshots of its origin; when new, the clones waiting for
//!   it; when gone, itself and the volumes that did not fit.
//! - **VolumeMigration**: its own reconcile; when gone, the other migrations of its volume.
//! - **AntstorVolumeGroup**: its own reconcile (not when gone) and its data control's.
//! - **AntstorDataControl**: its own reconcile; its groups when it is deleted, being deleted or
//!   replicated.
//! - **Lease** (a pool's heartbeat) and **Node** (labels and taints): the pool of that name.
//!
//! A full list (the first, or after the watch restarted) replaces what the state (or a cache)
//! holds of the kind and queues what its updates would; pools, volumes and snapshots also
//! start the plug-ins' sweep for vanished objects. Then the kind counts as synced: the
//! workers start once every kind but Node is.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Resource, ResourceExt};
use liteio_api::keys::finalizers;
use liteio_api::{
    AntstorDataControl, AntstorSnapshot, AntstorVolume, AntstorVolumeGroup, StoragePool,
    VolumeMigration,
};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::warn;

use super::{Context, members, migration, replicated};
use crate::plugin::Kind;
use crate::state::{NodeFacts, ObjectKey, State};

/// One watched kind: where its objects come from and what its events do.
pub(super) trait Watched:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static
{
    /// What a full list keeps of each object until the list is complete.
    type Listed: Send + 'static;

    /// The objects to watch.
    fn api(ctx: &Context) -> Api<Self>;

    /// The watch's parameters (all objects unless a kind says otherwise).
    fn params(_ctx: &Context) -> watcher::Config {
        watcher::Config::default()
    }

    /// An object of a full list, as kept until the list is complete.
    fn listed(self) -> Self::Listed;

    /// A full list is complete: `all` is every object there is.
    fn relisted(ctx: &Arc<Context>, all: Vec<Self::Listed>);

    /// An object was created or changed.
    fn applied(ctx: &Arc<Context>, obj: Self);

    /// An object is gone.
    fn deleted(ctx: &Arc<Context>, obj: Self);
}

/// Starts one kind's watch.
type Spawn = fn(&mut JoinSet<()>, &Arc<Context>, &watch::Receiver<bool>);

fn spawn<K: Watched>(
    tasks: &mut JoinSet<()>,
    ctx: &Arc<Context>,
    shutdown: &watch::Receiver<bool>,
) {
    tasks.spawn(watch_loop::<K>(Arc::clone(ctx), shutdown.clone()));
}

/// Every watched kind, in the order the watches start.
pub(super) const WATCHES: [Spawn; 8] = [
    spawn::<StoragePool>,
    spawn::<AntstorVolume>,
    spawn::<AntstorSnapshot>,
    spawn::<VolumeMigration>,
    spawn::<AntstorVolumeGroup>,
    spawn::<AntstorDataControl>,
    spawn::<Lease>,
    spawn::<Node>,
];

/// Runs the watch of `K` until `shutdown` (or the end of its stream).
async fn watch_loop<K: Watched>(ctx: Arc<Context>, mut shutdown: watch::Receiver<bool>) {
    let kind = K::kind(&()).to_string();
    // managedFields (who wrote which field: often the largest part of an object) are never
    // read here; the state keeps every object, so they go before it does.
    let mut stream = watcher(K::api(&ctx), K::params(&ctx))
        .modify(|o: &mut K| o.meta_mut().managed_fields = None)
        .default_backoff()
        .boxed();
    let mut buf: Vec<K::Listed> = Vec::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            item = stream.next() => match item {
                None => return,
                Some(Ok(ev)) => match ev {
                    Event::Init => buf.clear(),
                    Event::InitApply(o) => buf.push(o.listed()),
                    Event::InitDone => K::relisted(&ctx, std::mem::take(&mut buf)),
                    Event::Apply(o) => K::applied(&ctx, o),
                    Event::Delete(o) => K::deleted(&ctx, o),
                },
                Some(Err(e)) => warn!(kind, error = %e, "watch failed; retrying"),
            }
        }
    }
}

/// `K` in LiteIO's namespace.
fn namespaced<K>(ctx: &Context) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    Api::namespaced(ctx.client.clone(), &ctx.namespace)
}

impl Watched for StoragePool {
    type Listed = Arc<Self>;

    fn api(ctx: &Context) -> Api<Self> {
        namespaced(ctx)
    }

    fn listed(self) -> Arc<Self> {
        Arc::new(self)
    }

    fn relisted(ctx: &Arc<Context>, pools: Vec<Arc<Self>>) {
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

    fn applied(ctx: &Arc<Context>, p: Self) {
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

    fn deleted(ctx: &Arc<Context>, p: Self) {
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

impl Watched for AntstorVolume {
    type Listed = Arc<Self>;

    fn api(ctx: &Context) -> Api<Self> {
        namespaced(ctx)
    }

    fn listed(self) -> Arc<Self> {
        Arc::new(self)
    }

    fn relisted(ctx: &Arc<Context>, vols: Vec<Arc<Self>>) {
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

    fn applied(ctx: &Arc<Context>, v: Self) {
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

    fn deleted(ctx: &Arc<Context>, v: Self) {
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

impl Watched for AntstorSnapshot {
    type Listed = Arc<Self>;

    fn api(ctx: &Context) -> Api<Self> {
        namespaced(ctx)
    }

    fn listed(self) -> Arc<Self> {
        Arc::new(self)
    }

    fn relisted(ctx: &Arc<Context>, snaps: Vec<Arc<Self>>) {
        let keys: Vec<ObjectKey> = snaps.iter().map(|s| ObjectKey::of(s.as_ref())).collect();
        ctx.state().replace_snapshots(snaps);
        ctx.enqueue_snapshots(keys.clone());
        ctx.sweep(Kind::Snapshot, keys);
        ctx.mark_synced(&ctx.synced.snapshots);
    }

    fn applied(ctx: &Arc<Context>, snap: Self) {
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

    fn deleted(ctx: &Arc<Context>, snap: Self) {
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

impl Watched for VolumeMigration {
    type Listed = Arc<Self>;

    fn api(ctx: &Context) -> Api<Self> {
        namespaced(ctx)
    }

    fn listed(self) -> Arc<Self> {
        Arc::new(self)
    }

    fn relisted(ctx: &Arc<Context>, migs: Vec<Arc<Self>>) {
        let keys = ctx.migration_cache.replace(migs);
        ctx.count_migrations();
        for k in keys {
            ctx.migration_queue.add(k);
        }
        ctx.mark_synced(&ctx.synced.migrations);
    }

    fn applied(ctx: &Arc<Context>, m: Self) {
        let key = ObjectKey::of(&m);
        ctx.upsert_migration(Arc::new(m));
        ctx.migration_queue.add(key);
    }

    fn deleted(ctx: &Arc<Context>, m: Self) {
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

impl Watched for AntstorVolumeGroup {
    type Listed = Arc<Self>;

    fn api(ctx: &Context) -> Api<Self> {
        namespaced(ctx)
    }

    fn listed(self) -> Arc<Self> {
        Arc::new(self)
    }

    fn relisted(ctx: &Arc<Context>, groups: Vec<Arc<Self>>) {
        let dcs: Vec<ObjectKey> = groups
            .iter()
            .map(|g| members::data_control_key(g))
            .collect();
        let keys = ctx.group_cache.replace(groups);
        for k in keys {
            ctx.group_queue.add(k);
        }
        for k in dcs {
            ctx.data_control_queue.add(k);
        }
        ctx.mark_synced(&ctx.synced.groups);
    }

    fn applied(ctx: &Arc<Context>, g: Self) {
        let key = ObjectKey::of(&g);
        let dc = members::data_control_key(&g);
        ctx.upsert_group(Arc::new(g));
        ctx.group_queue.add(key);
        ctx.data_control_queue.add(dc);
    }

    fn deleted(ctx: &Arc<Context>, g: Self) {
        let key = ObjectKey::of(&g);
        ctx.group_cache.remove(&key);
        ctx.data_control_queue.add(members::data_control_key(&g));
    }
}

/// The groups a data control names (its own namespace when a group names none).
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

impl Watched for AntstorDataControl {
    type Listed = Arc<Self>;

    fn api(ctx: &Context) -> Api<Self> {
        namespaced(ctx)
    }

    fn listed(self) -> Arc<Self> {
        Arc::new(self)
    }

    fn relisted(ctx: &Arc<Context>, dcs: Vec<Arc<Self>>) {
        let keys = ctx.data_control_cache.replace(dcs);
        for k in keys {
            ctx.data_control_queue.add(k);
        }
        ctx.mark_synced(&ctx.synced.data_controls);
    }

    fn applied(ctx: &Arc<Context>, d: Self) {
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

    fn deleted(ctx: &Arc<Context>, d: Self) {
        let key = ObjectKey::of(&d);
        ctx.data_control_cache.remove(&key);
        replicated::forget(ctx, &key);
        // Its groups may wait for it to go before they delete their members.
        for g in groups_of(&d) {
            ctx.group_queue.add(g);
        }
    }
}

/// When a pool's agent last renewed (or acquired) its Lease.
fn lease_time(l: &Lease) -> Option<k8s_openapi::jiff::Timestamp> {
    let spec = l.spec.as_ref()?;
    spec.renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0)
}

impl Watched for Lease {
    type Listed = Self;

    fn api(ctx: &Context) -> Api<Self> {
        namespaced(ctx)
    }

    fn listed(self) -> Self {
        self
    }

    fn relisted(ctx: &Arc<Context>, leases: Vec<Self>) {
        let beats: Vec<(String, k8s_openapi::jiff::Timestamp)> = leases
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

    fn applied(ctx: &Arc<Context>, l: Self) {
        let name = l.name_any();
        ctx.state().set_heartbeat(&name, lease_time(&l));
        ctx.enqueue_pool(&name);
    }

    fn deleted(ctx: &Arc<Context>, l: Self) {
        let name = l.name_any();
        ctx.state().set_heartbeat(&name, None);
        ctx.enqueue_pool(&name);
    }
}

/// What the scheduler reads of a Node: its labels and taints.
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

impl Watched for Node {
    type Listed = (String, NodeFacts);

    /// Every Node of the cluster (Nodes have no namespace).
    fn api(ctx: &Context) -> Api<Self> {
        Api::all(ctx.client.clone())
    }

    /// Only the Nodes `scheduler.nodeCacheSelector` selects, when it is set.
    fn params(ctx: &Context) -> watcher::Config {
        let sel = &ctx.config.scheduler.node_cache_selector;
        let mut node_cfg = watcher::Config::default();
        if !sel.is_empty() {
            let s: Vec<String> = sel.iter().map(|(k, v)| format!("{k}={v}")).collect();
            node_cfg = node_cfg.labels(&s.join(","));
        }
        node_cfg
    }

    fn listed(self) -> (String, NodeFacts) {
        (self.name_any(), node_facts(&self))
    }

    fn relisted(ctx: &Arc<Context>, nodes: Vec<(String, NodeFacts)>) {
        ctx.state().replace_nodes(nodes);
        ctx.synced.nodes.store(true, Ordering::SeqCst);
        let names: Vec<String> = ctx.state().pools().map(|p| p.name.to_string()).collect();
        for n in names {
            ctx.enqueue_pool(&n);
        }
    }

    fn applied(ctx: &Arc<Context>, n: Self) {
        let name = n.name_any();
        ctx.state().upsert_node(&name, node_facts(&n));
        ctx.enqueue_pool(&name);
    }

    fn deleted(ctx: &Arc<Context>, n: Self) {
        let name = n.name_any();
        ctx.state().remove_node(&name);
        ctx.enqueue_pool(&name);
    }
}
