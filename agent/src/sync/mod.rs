//! Volume and snapshot sync: kube-runtime controllers over the AntstorVolumes and
//! AntstorSnapshots labelled `obnvmf/target-node-id=<node>` in namespace `obnvmf`.

pub mod snapshot;
pub mod volume;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use liteio_api::keys::{self, labels, managers};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::context::Ctx;
use crate::error::{AgentError, ErrorKind, Result, is_not_found};

/// Patch parameters naming the agent as field manager.
pub(crate) fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(managers::AGENT.to_string()),
        ..PatchParams::default()
    }
}

pub(crate) use liteio_api::meta::{annotation, has_finalizer, label};

/// `Kind ns/name` for messages.
pub(crate) fn describe<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!(
        "{} {}/{}",
        K::kind(&()),
        obj.namespace().unwrap_or_default(),
        obj.name_any()
    )
}

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

/// Requeue delay after a failed reconcile.
pub(crate) fn retry_after(kind: ErrorKind, retry: Duration) -> Action {
    match kind {
        ErrorKind::Conflict => Action::requeue(Duration::from_millis(20)),
        _ => Action::requeue(retry),
    }
}

/// Runs a controller for `K` with the agent's label selector until `shutdown`.
pub(crate) async fn run_controller<K, F, Fut>(
    ctx: Arc<Ctx>,
    resource: &'static str,
    reconcile: F,
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
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), keys::DEFAULT_NAMESPACE);
    let wc = watcher::Config::default().labels(&format!("{}={}", labels::TARGET_NODE_ID, ctx.node));
    if *shutdown.borrow() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut drain = shutdown.clone();
    tokio::spawn(async move {
        let _ = shutdown.wait_for(|s| *s).await;
        let _ = stop_tx.send(());
    });
    let retry = ctx.retry;
    let controller = Controller::new(api, wc)
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
                } else {
                    warn!(object = %describe(obj.as_ref()), kind = %kind, error = %err.chain(), "reconcile failed");
                }
                retry_after(kind, retry)
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

/// How long running reconciles may take to finish after shutdown.
const DRAIN: Duration = Duration::from_secs(2);
