//! Volume, snapshot, data-control and migration sync: kube-runtime controllers over the
//! AntstorVolumes, AntstorSnapshots and AntstorDataControls labelled
//! `obnvmf/target-node-id=<node>` and the VolumeMigrations labelled
//! `migrate.obnvmf/source-node-id=<node>`, in namespace `obnvmf`.
//!
//! A failed object is retried with per-object exponential back-off and jitter
//! ([`backoff`]); a change of the object, or of the pool while some object waits for a
//! retry, reconciles at once (freed space, a repaired disk), whatever the back-off says; so
//! does, for a volume, a change of what its consumer's kernel can do ([`node_auth`]). A
//! permanent failure ([`crate::error::Retry::OnChange`]: the pool cannot do it, the object is
//! invalid) is written to the object's status by its reconcile and told once by a Warning
//! event `<Kind>Failed`; it is never retried on a timer, only on such a change.

pub mod auth;
pub mod backoff;
pub mod datacontrol;
pub mod migration;
pub mod names;
pub mod node_auth;
pub mod snapshot;
pub mod volume;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use liteio_api::keys::{self, managers};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::context::Ctx;
use crate::error::{AgentError, ErrorKind, Result, Retry, is_not_found};
use crate::sync::backoff::{RandomJitter, Retries, Schedule};

/// Patch parameters naming the agent as field manager.
pub(crate) fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(managers::AGENT.to_string()),
        ..PatchParams::default()
    }
}

pub(crate) use crate::state::{describe, object_key};
pub(crate) use liteio_api::meta::{annotation, has_finalizer, label};

/// Merge-patches `body` into the object, guarded by its resourceVersion (a concurrent
/// change is a 409 and the reconcile retries with a fresh copy).
pub(crate) async fn patch_guarded<K>(ctx: &Ctx, api: &Api<K>, obj: &K, mut body: Value) -> Result<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    if let Some(m) = body.as_object_mut() {
        let meta = m.entry("metadata").or_insert_with(|| json!({}));
        if let Some(meta) = meta.as_object_mut() {
            meta.insert(
                "resourceVersion".into(),
                json!(obj.meta().resource_version.clone()),
            );
        }
    }
    ctx.timed(
        "patch",
        describe(obj),
        api.patch(&obj.name_any(), &patch_params(), &Patch::Merge(&body)),
    )
    .await
}

/// Merge-patches the status subresource.
pub(crate) async fn patch_status<K>(ctx: &Ctx, api: &Api<K>, obj: &K, status: Value) -> Result<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    ctx.timed(
        "patch status of",
        describe(obj),
        api.patch_status(
            &obj.name_any(),
            &patch_params(),
            &Patch::Merge(&json!({ "status": status })),
        ),
    )
    .await
}

/// Removes `remove` from the finalizers (never anything else). Returns `None` when the
/// object is gone.
pub(crate) async fn remove_finalizers<K>(
    ctx: &Ctx,
    api: &Api<K>,
    obj: &K,
    remove: &[&str],
) -> Result<Option<K>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let current = obj.finalizers();
    if !current.iter().any(|f| remove.contains(&f.as_str())) {
        return Ok(Some(obj.clone()));
    }
    let keep: Vec<&String> = current
        .iter()
        .filter(|f| !remove.contains(&f.as_str()))
        .collect();
    match patch_guarded(ctx, api, obj, json!({"metadata": {"finalizers": keep}})).await {
        Ok(o) => Ok(Some(o)),
        Err(AgentError::Kube { source, .. }) if is_not_found(&source) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The finalizer list with `add` appended (once).
pub(crate) fn with_finalizer(meta: &ObjectMeta, add: &str) -> Vec<String> {
    let mut v = meta.finalizers.clone().unwrap_or_default();
    if !v.iter().any(|f| f == add) {
        v.push(add.to_string());
    }
    v
}

/// Requeue delay after a conflict: a fresh copy heals it, so it is neither counted nor
/// backed off.
const CONFLICT_RETRY: Duration = Duration::from_millis(20);

/// The reference of the object under `key` (see [`object_key`]).
fn object_ref<K: Resource<DynamicType = ()>>(key: &str) -> ObjectRef<K> {
    let (ns, name) = key.split_once('/').unwrap_or(("", key));
    ObjectRef::new(name).within(ns)
}

/// Runs a controller for `K` over the objects whose label `node_label` names this node,
/// until `shutdown`. `triggers`, given the controller's cache, returns the objects to
/// reconcile because something other than themselves or the pool changed (see
/// [`node_auth`]); [`no_triggers`] for none.
pub(crate) async fn run_controller<K, F, Fut, T>(
    ctx: Arc<Ctx>,
    resource: &'static str,
    node_label: &'static str,
    reconcile: F,
    triggers: T,
    mut shutdown: watch::Receiver<bool>,
) where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    F: FnMut(Arc<K>, Arc<Ctx>) -> Fut,
    Fut: std::future::Future<Output = Result<Action>> + Send + 'static,
    T: FnOnce(Store<K>) -> BoxStream<'static, ObjectRef<K>>,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), keys::DEFAULT_NAMESPACE);
    let wc = watcher::Config::default().labels(&format!("{node_label}={}", ctx.node));
    if *shutdown.borrow() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut drain = shutdown.clone();
    tokio::spawn(async move {
        let _ = shutdown.wait_for(|s| *s).await;
        let _ = stop_tx.send(());
    });
    let retries = Arc::new(Retries::new(
        Schedule::new(ctx.retry, ctx.retry_max),
        Arc::new(RandomJitter::new()),
    ));
    let mut reconcile = reconcile;
    let on_ok = Arc::clone(&retries);
    // A permanent failure is told once with a Warning event (`<Kind>Failed`); the object's
    // own reconcile writes it to the status.
    let reason = format!("{}Failed", K::kind(&()));
    let reconcile = move |obj: Arc<K>, ctx: Arc<Ctx>| {
        let key = object_key(obj.as_ref());
        let fut = reconcile(Arc::clone(&obj), Arc::clone(&ctx));
        let retries = Arc::clone(&on_ok);
        let reason = reason.clone();
        async move {
            let res = fut.await;
            match &res {
                Ok(_) => {
                    retries.succeeded(&key);
                    ctx.warnings.forget(obj.as_ref());
                }
                Err(e) if e.is_permanent() && obj.meta().deletion_timestamp.is_none() => {
                    let note = format!(
                        "{} (not retried until the object or the pool changes)",
                        e.chain()
                    );
                    ctx.warnings.publish(obj.as_ref(), &reason, &note).await;
                }
                Err(_) => {}
            }
            res
        }
    };
    // The reflector keeps a copy of every object of this node; managedFields (who wrote which
    // field, often the largest part of an object) are never read here, so they are dropped
    // before the copy is stored.
    let (reader, writer) = kube::runtime::reflector::store::<K>();
    let objects = kube::runtime::reflector(
        writer,
        watcher(api, wc).modify(|o: &mut K| o.meta_mut().managed_fields = None),
    )
    .applied_objects();
    let controller = Controller::for_stream(objects, reader);
    // A pool change may be what a failing object waited for (freed space, a repaired disk):
    // reconcile those objects then, whatever their back-off says. Only those: with thousands
    // of settled objects, reconciling all of them on every pool change (each new volume is
    // one) flooded the engine and the target. Failures of objects gone from this node's
    // cache (deleted, or moved to another node) are forgotten first: they wait for nothing
    // any more.
    let store = controller.store();
    let triggers = triggers(store.clone());
    let waiting = Arc::clone(&retries);
    let warned = Arc::clone(&ctx);
    let pool_changes = futures::stream::unfold(ctx.pool_epoch.subscribe(), move |mut rx| {
        let (waiting, store, warned) = (Arc::clone(&waiting), store.clone(), Arc::clone(&warned));
        async move {
            loop {
                rx.changed().await.ok()?;
                waiting.retain(|key| store.get(&object_ref::<K>(key)).is_some());
                warned
                    .warnings
                    .retain::<K>(|key| store.get(&object_ref::<K>(key)).is_some());
                let refs: Vec<ObjectRef<K>> =
                    waiting.failing().iter().map(|k| object_ref(k)).collect();
                if !refs.is_empty() {
                    return Some((futures::stream::iter(refs), rx));
                }
            }
        }
    })
    .flatten();
    let controller = controller
        .reconcile_on(pool_changes)
        .reconcile_on(triggers)
        .graceful_shutdown_on(async move {
            let _ = stop_rx.await;
        })
        .run(
            reconcile,
            move |obj: Arc<K>, err: &AgentError, ctx: Arc<Ctx>| {
                let kind = err.kind();
                ctx.metrics.reconcile_error(resource, kind.as_str());
                if kind == ErrorKind::Conflict {
                    debug!(object = %describe(obj.as_ref()), "conflict; retrying with a fresh copy");
                    return Action::requeue(CONFLICT_RETRY);
                }
                // Counted either way: the failing objects are those a pool change retries.
                let (attempt, delay) = retries.failed(&object_key(obj.as_ref()));
                match err.retry() {
                    Retry::Backoff => {
                        warn!(object = %describe(obj.as_ref()), kind = %kind, attempt, ?delay, error = %err.chain(), "reconcile failed; retrying");
                        Action::requeue(delay)
                    }
                    Retry::OnChange => {
                        warn!(object = %describe(obj.as_ref()), kind = %kind, attempt, error = %err.chain(), "reconcile failed for good; retried when the object or the pool changes");
                        Action::await_change()
                    }
                }
            },
            ctx,
        )
        .for_each(|res| async move {
            if let Err(e) = res {
                debug!(error = %e, "controller event");
            }
        });
    // After shutdown, running reconciles get a bounded time to finish.
    tokio::select! {
        () = controller => {}
        () = async {
            let _ = drain.wait_for(|s| *s).await;
            tokio::time::sleep(DRAIN).await;
        } => debug!(resource, "controller did not drain in time; dropping it"),
    }
}

/// No triggers besides the objects' own changes and the pool's (see [`run_controller`]).
pub(crate) fn no_triggers<K>(_: Store<K>) -> BoxStream<'static, ObjectRef<K>>
where
    K: Resource + 'static,
    K::DynamicType: std::hash::Hash + Eq,
{
    futures::stream::empty().boxed()
}

/// How long running reconciles may take to finish after shutdown.
const DRAIN: Duration = Duration::from_secs(2);
