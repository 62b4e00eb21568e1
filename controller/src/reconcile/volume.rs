//! The AntstorVolume reconciler: schedule, bind, report why nothing fits, and release
//! volumes being deleted.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::ResourceExt;
use liteio_api::common::NodeInfo;
use liteio_api::keys::{annotations, finalizers, labels};
use liteio_api::pool::PoolStatus;
use liteio_api::{AntstorVolume, validate};
use serde_json::json;
use tracing::{info, instrument};

use super::{Action, Context};
use crate::clock::elapsed;
use crate::error::Result;
use crate::plugin::{Kind, PluginObject};
use crate::scheduler::{self, ScheduleError};
use crate::state::{self, ObjectKey};

/// Prefix of messages this reconciler writes to `status.msg` (cleared once bound).
const MSG_PREFIXES: [&str; 3] = [
    "NoStoragePoolAvailable",
    "invalid volume",
    SOURCE_SNAPSHOT_NOT_FOUND,
];

/// Prefix of the message on a clone whose source snapshot does not exist.
const SOURCE_SNAPSHOT_NOT_FOUND: &str = "SourceSnapshotNotFound";

/// Reconciles one AntstorVolume.
///
/// Flow: a volume gone from the cluster is forgotten by the plug-ins. A volume with
/// `spec.stopReconcile` is left alone. A volume being deleted goes to [`handle_deletion`].
/// Otherwise the volume is validated (uuid, size, annotations, selectors, affinity terms);
/// an invalid one gets the reason in `status.msg` and waits for a change. An unscheduled
/// clone whose source snapshot does not exist gets `SourceSnapshotNotFound` in `status.msg`
/// and waits for the snapshot to appear. A volume without a target is scheduled ([`crate::scheduler`]) and bound in the state at once; when nothing
/// fits, the per-reason counts go to `status.msg` and the volume waits until a pool changes
/// or space is freed. A bound volume gets `spec.targetNodeId`, the label
/// `obnvmf/target-node-id` and the finalizer `antstor.alipay.com/in-state` in one merge
/// patch guarded by its resourceVersion (with, on first binding, `spec.hostNode` and
/// `obnvmf/local-only` for a volume without a requested topology that is usable only on
/// its node: see [`crate::scheduler`]); a message of this reconciler's is then cleared from
/// `status.msg`. A volume without a status is `creating`; its agent writes `ready`.
/// Plug-ins run last.
///
/// Guarantees: idempotent (a second run writes nothing); a volume is never bound to two
/// pools (the in-state binding survives a lost or stale patch); only the volume's own
/// fields named above are written.
///
/// Errors: API failures and conflicts (retried with back-off by the runtime).
#[instrument(skip(ctx), fields(volume = %key))]
pub async fn reconcile(ctx: &Context, key: &ObjectKey) -> Result<Action> {
    let Some(vol) = ctx.state().volume(key).cloned() else {
        ctx.run_plugin_forget(Kind::Volume, key).await?;
        return Ok(Action::Done);
    };
    if vol.spec.stop_reconcile {
        return Ok(Action::Done);
    }
    if vol.metadata.deletion_timestamp.is_some() {
        let action = handle_deletion(ctx, key, &vol).await?;
        ctx.run_plugin_deletions(PluginObject::Volume(&vol)).await?;
        return Ok(action);
    }
    if let Err(msg) = check(ctx, key, &vol) {
        ctx.warn_once(vol.as_ref(), "InvalidVolume", msg.clone())
            .await;
        // Permanent: nothing but a change of the volume heals it (the CSI node answers at
        // once instead of waiting for readiness).
        set_message(ctx, &vol, &msg, true).await?;
        return Ok(Action::Done);
    }
    let bound = vol
        .target_node()
        .map(str::to_string)
        .or_else(|| ctx.state().binding(key).map(str::to_string));
    if bound.is_none()
        && let Some(msg) = missing_source(ctx, key, &vol)
    {
        set_message(ctx, &vol, &msg, false).await?;
        return Ok(Action::Done);
    }
    let node = match bound {
        Some(n) => n,
        None => match schedule(ctx, key, &vol) {
            Ok(n) => n,
            Err(e) => {
                set_message(ctx, &vol, &e.to_string(), false).await?;
                ctx.run_plugins(PluginObject::Volume(&vol)).await?;
                return Ok(Action::Done);
            }
        },
    };
    let vol = ensure_bound(ctx, key, vol, &node).await?;
    let vol = ensure_status(ctx, key, vol).await?;
    ctx.run_plugins(PluginObject::Volume(&vol)).await?;
    Ok(Action::Done)
}

/// Why the volume cannot be scheduled or kept as it is, if it cannot: an invalid field, a
/// `spec.uuid` another volume already has, or a preset `spec.targetNodeId` that names no pool.
fn check(ctx: &Context, key: &ObjectKey, vol: &AntstorVolume) -> std::result::Result<(), String> {
    if let Err(e) = validate::volume(vol) {
        return Err(format!("invalid volume: {e}"));
    }
    ctx.scheduler
        .validate_volume(vol)
        .map_err(|e| e.to_string())?;
    let state = ctx.state();
    if let Some(owner) = state.uuid_owner(key)
        && !is_migration_dest_of(vol, key, &owner)
    {
        return Err(format!(
            "invalid volume: spec.uuid: {} is already used by AntstorVolume {owner}; \
             a volume is found by its uuid, so this one is not scheduled",
            vol.spec.uuid
        ));
    }
    // Preset by whoever created it (the controller has not taken it in yet).
    let taken_in = vol.finalizers().iter().any(|f| f == finalizers::IN_STATE);
    if let Some(node) = vol.target_node()
        && !taken_in
        && state.pool(node).is_none()
    {
        return Err(format!(
            "invalid volume: spec.targetNodeId: node {node} has no StoragePool; \
             set it to a pool's node or leave it empty for the scheduler"
        ));
    }
    Ok(())
}

/// True when `vol` is the destination of a migration of `owner` (label
/// `migrate.obnvmf/source-volume-name`): it shares the source's uuid until the migration
/// retires the source (see [`super::migration`]).
fn is_migration_dest_of(vol: &AntstorVolume, key: &ObjectKey, owner: &ObjectKey) -> bool {
    owner.namespace == key.namespace
        && liteio_api::meta::label(&vol.metadata, labels::MIGRATE_MIGRATION_NAME).is_some()
        && liteio_api::meta::label(&vol.metadata, labels::MIGRATE_SOURCE_VOLUME_NAME)
            == Some(owner.name.as_str())
}

/// The message for a clone whose source snapshot is not in the cluster (the agent could
/// never create it), if that is the case. A snapshot in a namespace this controller does
/// not watch is not checked.
fn missing_source(ctx: &Context, key: &ObjectKey, vol: &AntstorVolume) -> Option<String> {
    let snap = state::source_snapshot(vol, &key.namespace)?;
    if snap.namespace != ctx.namespace || ctx.state().snapshot(&snap).is_some() {
        return None;
    }
    Some(format!(
        "{SOURCE_SNAPSHOT_NOT_FOUND}: AntstorSnapshot {snap} does not exist; \
         the volume is scheduled once it does"
    ))
}

fn schedule(
    ctx: &Context,
    key: &ObjectKey,
    vol: &AntstorVolume,
) -> std::result::Result<String, ScheduleError> {
    let started = std::time::Instant::now();
    let mut state = ctx.state();
    let res = ctx.scheduler.schedule(&state, vol);
    let outcome = match &res {
        Ok(p) => {
            // The pool exists (the scheduler just saw it) and the volume is unbound.
            if let Err(e) = state.bind(key, &p.node) {
                tracing::warn!(error = %e, "cannot bind in state");
            }
            "placed"
        }
        Err(ScheduleError::NoStoragePoolAvailable(r)) => {
            for (reason, n) in &r.0 {
                ctx.metrics
                    .schedule_failures
                    .with_label_values(&[reason.as_str()])
                    .inc_by(u64::from(*n));
            }
            "unplaceable"
        }
        Err(ScheduleError::InvalidVolume { .. }) => "invalid",
    };
    drop(state);
    ctx.metrics
        .schedule_seconds
        .with_label_values(&[outcome])
        .observe(started.elapsed().as_secs_f64());
    match res {
        Ok(p) => {
            info!(node = %p.node, score = p.score, "volume scheduled");
            Ok(p.node)
        }
        Err(e) => {
            info!(reason = %e, "volume not scheduled");
            Err(e)
        }
    }
}

fn store(ctx: &Context, vol: AntstorVolume) -> Arc<AntstorVolume> {
    let v = Arc::new(vol);
    ctx.state().upsert_volume(Arc::clone(&v));
    v
}

async fn ensure_bound(
    ctx: &Context,
    key: &ObjectKey,
    vol: Arc<AntstorVolume>,
    node: &str,
) -> Result<Arc<AntstorVolume>> {
    let label_ok = vol
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::TARGET_NODE_ID))
        .is_some_and(|v| v == node);
    let mut fins = vol.metadata.finalizers.clone().unwrap_or_default();
    let fin_ok = fins.iter().any(|f| f == finalizers::IN_STATE);
    let spec_ok = vol.spec.target_node_id == node;
    if label_ok && fin_ok && spec_ok {
        return Ok(vol);
    }
    if !fin_ok {
        fins.push(finalizers::IN_STATE.to_string());
    }
    let mut body = json!({
        "metadata": {
            "resourceVersion": vol.metadata.resource_version,
            "labels": { labels::TARGET_NODE_ID: node },
            "finalizers": fins,
        },
        "spec": { "targetNodeId": node },
    });
    if !fin_ok {
        // First binding (the controller takes the volume in): record where a volume without a requested topology is usable
        // (the rule is in the scheduler's module documentation).
        let pool = ctx.state().pool(node).map(|p| p.pool.clone());
        if let Some(pool) = pool {
            let hostless = vol.spec.host_node.as_ref().is_none_or(|h| h.id.is_empty());
            let bind_local = hostless && !scheduler::is_remote(&vol, &pool, node);
            if bind_local {
                let info = &pool.spec.node_info;
                body["spec"]["hostNode"] = json!(NodeInfo {
                    id: node.to_string(),
                    ip: info.ip.clone(),
                    hostname: info.hostname.clone(),
                    labels: BTreeMap::new(),
                });
            }
            if bind_local || !scheduler::can_export(&pool) {
                body["metadata"]["annotations"] = json!({ annotations::LOCAL_ONLY: "true" });
            }
        }
    }
    let out: AntstorVolume = ctx.patch(&key.namespace, &key.name, &body, false).await?;
    info!(node, "volume bound");
    Ok(store(ctx, out))
}

async fn ensure_status(
    ctx: &Context,
    key: &ObjectKey,
    vol: Arc<AntstorVolume>,
) -> Result<Arc<AntstorVolume>> {
    let stale_msg = vol
        .status
        .as_ref()
        .is_some_and(|s| MSG_PREFIXES.iter().any(|p| s.message.starts_with(p)));
    // A volume without a status is `creating` (`AntstorVolume::phase`), and its first status
    // write is the agent's `ready`: the controller writes the status only to clear a
    // message of its own, so a volume's status is written once on the way to ready.
    if !stale_msg {
        return Ok(vol);
    }
    let status = json!({ "msg": null, "permanent": null });
    let out: AntstorVolume = ctx
        .patch(
            &key.namespace,
            &key.name,
            &json!({ "status": status }),
            true,
        )
        .await?;
    Ok(store(ctx, out))
}

/// Writes `status.msg`, and `status.permanent` when only a change of the volume can heal it.
async fn set_message(ctx: &Context, vol: &AntstorVolume, msg: &str, permanent: bool) -> Result<()> {
    if vol
        .status
        .as_ref()
        .is_some_and(|s| s.message == msg && s.permanent == permanent)
    {
        return Ok(());
    }
    let key = ObjectKey::of(vol);
    let permanent = if permanent { json!(true) } else { json!(null) };
    let mut status = json!({ "msg": msg, "permanent": permanent });
    if vol.status.is_none() {
        status["status"] = json!("creating");
    }
    let out: AntstorVolume = ctx
        .patch(
            &key.namespace,
            &key.name,
            &json!({ "status": status }),
            true,
        )
        .await?;
    store(ctx, out);
    Ok(())
}

/// Releases a volume being deleted.
///
/// Flow: nothing to do unless the `in-state` finalizer is present. While an agent finalizer
/// (`logic-volume`, `spdk-tgt`, legacy `lvm`, `spdk-lvol`) remains, the agent owns the
/// deletion and this waits for its watch event — unless the agent cannot act: the pool
/// object is gone, the pool is `offline`, or it has been `unknown` for longer than
/// `liveness.deadPoolDeletionGrace` since the deletion started. Then every agent finalizer
/// is stripped (LiteIO forgot `logic-volume`: gap 13) together with `in-state`; any other
/// component's finalizers are kept. Without agent finalizers only `in-state` is removed.
///
/// Errors: API failures (retried).
#[instrument(skip(ctx, vol), fields(volume = %key))]
pub async fn handle_deletion(
    ctx: &Context,
    key: &ObjectKey,
    vol: &AntstorVolume,
) -> Result<Action> {
    let fins = vol.metadata.finalizers.clone().unwrap_or_default();
    if !fins.iter().any(|f| f == finalizers::IN_STATE) {
        return Ok(Action::Done);
    }
    let agent_left = fins
        .iter()
        .any(|f| finalizers::AGENT_VOLUME.contains(&f.as_str()));
    let mut strip_agent = false;
    if agent_left {
        let node = vol
            .target_node()
            .map(str::to_string)
            .or_else(|| ctx.state().binding(key).map(str::to_string));
        let pool_status = node.as_deref().map(|n| {
            ctx.state().pool(n).map(|p| {
                p.pool
                    .status
                    .as_ref()
                    .and_then(|s| s.status)
                    .unwrap_or_default()
            })
        });
        match pool_status {
            None | Some(None) => strip_agent = true,
            Some(Some(PoolStatus::Offline)) => strip_agent = true,
            Some(Some(PoolStatus::Unknown)) => {
                let since = vol
                    .metadata
                    .deletion_timestamp
                    .as_ref()
                    .map(|t| elapsed(ctx.clock.now(), t.0))
                    .unwrap_or_default();
                let grace = ctx.config.liveness.dead_pool_deletion_grace;
                if since >= grace {
                    strip_agent = true;
                } else {
                    return Ok(Action::RequeueAfter(grace - since));
                }
            }
            Some(Some(_)) => return Ok(Action::Done),
        }
    }
    let keep: Vec<String> = fins
        .iter()
        .filter(|f| {
            f.as_str() != finalizers::IN_STATE
                && !(strip_agent && finalizers::AGENT_VOLUME.contains(&f.as_str()))
        })
        .cloned()
        .collect();
    let body = json!({
        "metadata": {
            "resourceVersion": vol.metadata.resource_version,
            "finalizers": keep,
        }
    });
    let out: AntstorVolume = ctx.patch(&key.namespace, &key.name, &body, false).await?;
    info!(
        strip_agent,
        left = ?out.metadata.finalizers,
        "volume released"
    );
    if out.metadata.finalizers.as_ref().is_none_or(Vec::is_empty) {
        // The API server deleted it with this write. Its DELETE event may already have been
        // handled: storing `out` would bring back a volume that no longer exists, and its
        // pool would wait forever for it to leave.
        ctx.state().remove_volume(key);
        if let Some(node) = out.target_node() {
            ctx.enqueue_pool(node);
        }
    } else {
        store(ctx, out);
    }
    Ok(Action::Done)
}
