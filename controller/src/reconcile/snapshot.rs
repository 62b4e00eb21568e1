//! The AntstorSnapshot reconciler (reference §2.4): validation, reserve check, binding to the
//! origin's node, merge state, and release on deletion.

use std::sync::Arc;

use liteio_api::keys::{finalizers, labels};
use liteio_api::size::{self, MIN_VOLUME_SIZE, VOLUME_UNIT};
use liteio_api::snapshot::{SnapshotStatusName, SnapshotVolType};
use liteio_api::{AntstorSnapshot, validate};
use serde_json::json;
use tracing::{info, instrument};

use super::{Action, Context};
use crate::error::Result;
use crate::plugin::{Kind, PluginObject};
use crate::state::{self, ObjectKey, State};

fn label<'a>(s: &'a AntstorSnapshot, k: &str) -> Option<&'a str> {
    liteio_api::meta::label(&s.metadata, k)
}

fn store(ctx: &Context, snap: AntstorSnapshot) -> Arc<AntstorSnapshot> {
    let s = Arc::new(snap);
    ctx.state().upsert_snapshot(Arc::clone(&s));
    s
}

/// Reconciles one AntstorSnapshot.
///
/// Flow: a snapshot gone from the cluster is forgotten by the plug-ins. Deleting: when it
/// was merged, or its origin's pool no longer exists, the agent's `snapshot` finalizer is
/// removed (nothing else). Otherwise: add the origin labels when missing; validate (uuid,
/// size ≥ 4 MiB, origin named) — a Warning event `SnapshotCreateFailure` and no retry
/// until the object changes; refuse a second unmerged snapshot of the same origin (the
/// older one wins); wait until the origin exists and is scheduled (its watch event
/// re-queues this snapshot); require `size` (rounded down to 4 MiB) ≤ the origin's
/// `obnvmf/snapshot-reserved-bytes`; then bind: `spec.originVolTargetNodeId`, the rounded
/// `spec.size` and the label `obnvmf/target-node-id`, and `status.status=creating`. A
/// bound snapshot with the `obnmvf/merge-start-timestamp` label moves to `merging` (LVM
/// only; SPDK gets a `SnapshotMergeFailure` event).
///
/// Guarantees: idempotent; events are published once per distinct message.
///
/// Errors: API failures (retried with back-off).
#[instrument(skip(ctx), fields(snapshot = %key))]
pub async fn reconcile(ctx: &Context, key: &ObjectKey) -> Result<Action> {
    let Some(snap) = ctx.state().snapshot(key).cloned() else {
        ctx.clear_warning(key);
        ctx.run_plugin_forget(Kind::Snapshot, key).await?;
        return Ok(Action::Done);
    };
    if snap.metadata.deletion_timestamp.is_some() {
        handle_deletion(ctx, key, &snap).await?;
        ctx.run_plugin_deletions(PluginObject::Snapshot(&snap))
            .await?;
        return Ok(Action::Done);
    }
    let origin = State::origin_of(&snap);
    let snap = if label(&snap, labels::ORIGIN_VOLUME_NAME).is_none()
        || label(&snap, labels::ORIGIN_VOLUME_NAMESPACE).is_none()
    {
        let body = json!({ "metadata": { "labels": {
            labels::ORIGIN_VOLUME_NAME: origin.name,
            labels::ORIGIN_VOLUME_NAMESPACE: origin.namespace,
        }}});
        let out: AntstorSnapshot = ctx.patch(&key.namespace, &key.name, &body, false).await?;
        store(ctx, out)
    } else {
        snap
    };
    if let Err(e) = validate::snapshot(&snap) {
        ctx.warn_once(snap.as_ref(), "SnapshotCreateFailure", e.to_string())
            .await;
        return Ok(Action::Done);
    }
    let requested = u64::try_from(snap.spec.size).unwrap_or(0);
    if requested < MIN_VOLUME_SIZE {
        ctx.warn_once(
            snap.as_ref(),
            "SnapshotCreateFailure",
            format!(
                "spec.size {requested} is below the minimum of {}",
                size::format_bytes(MIN_VOLUME_SIZE)
            ),
        )
        .await;
        return Ok(Action::Done);
    }
    let rounded = size::round_down(requested, VOLUME_UNIT).unwrap_or(requested);
    let bound = !snap.spec.origin_vol_target_node_id.is_empty();
    let snap = if bound {
        snap
    } else {
        match bind(ctx, key, &snap, &origin, rounded).await? {
            Some(s) => s,
            None => return Ok(Action::Done),
        }
    };
    let phase = snap.status.as_ref().map(|s| s.status);
    if label(&snap, labels::MERGE_START_TIMESTAMP).is_some()
        && !matches!(
            phase,
            Some(SnapshotStatusName::Merging | SnapshotStatusName::Merged)
        )
    {
        if snap.spec.vol_type == SnapshotVolType::SpdkLVol {
            ctx.warn_once(
                snap.as_ref(),
                "SnapshotMergeFailure",
                "SPDK lvol snapshots cannot be merged into their origin".to_string(),
            )
            .await;
        } else {
            let out: AntstorSnapshot = ctx
                .patch(
                    &key.namespace,
                    &key.name,
                    &json!({ "status": { "status": "merging" } }),
                    true,
                )
                .await?;
            info!("snapshot merge requested");
            store(ctx, out);
            return Ok(Action::Done);
        }
    }
    ctx.run_plugins(PluginObject::Snapshot(&snap)).await?;
    Ok(Action::Done)
}

async fn bind(
    ctx: &Context,
    key: &ObjectKey,
    snap: &Arc<AntstorSnapshot>,
    origin: &ObjectKey,
    rounded: u64,
) -> Result<Option<Arc<AntstorSnapshot>>> {
    let (older, vol, node) = {
        let s = ctx.state();
        let mine = (
            snap.metadata.creation_timestamp.as_ref().map(|t| t.0),
            key.clone(),
        );
        let older = s.snapshots_of(origin).into_iter().find(|k| {
            k != key
                && s.snapshot(k).is_some_and(|o| {
                    let merged = o
                        .status
                        .as_ref()
                        .is_some_and(|st| st.status == SnapshotStatusName::Merged);
                    let theirs = (
                        o.metadata.creation_timestamp.as_ref().map(|t| t.0),
                        k.clone(),
                    );
                    !merged && o.metadata.deletion_timestamp.is_none() && theirs < mine
                })
        });
        (
            older,
            s.volume(origin).cloned(),
            s.binding(origin).map(str::to_string),
        )
    };
    if let Some(o) = older {
        ctx.warn_once(
            snap.as_ref(),
            "SnapshotCreateFailure",
            format!("volume {origin} already has the unmerged snapshot {o}"),
        )
        .await;
        return Ok(None);
    }
    let (Some(vol), Some(node)) = (vol, node) else {
        // The origin's watch event re-queues this snapshot.
        return Ok(None);
    };
    let reserve = state::snapshot_reserve(&vol);
    if rounded > reserve {
        ctx.warn_once(
            snap.as_ref(),
            "SnapshotCreateFailure",
            format!(
                "snapshot needs {}, volume {origin} reserves {} (annotation obnvmf/snapshot-reserved-bytes)",
                size::format_bytes(rounded),
                size::format_bytes(reserve)
            ),
        )
        .await;
        return Ok(None);
    }
    let body = json!({
        "metadata": {
            "resourceVersion": snap.metadata.resource_version,
            "labels": { labels::TARGET_NODE_ID: node },
        },
        "spec": {
            "originVolTargetNodeId": node,
            "size": rounded,
        }
    });
    let out: AntstorSnapshot = ctx.patch(&key.namespace, &key.name, &body, false).await?;
    let out = if out.status.is_none() {
        ctx.patch(
            &key.namespace,
            &key.name,
            &json!({ "status": { "status": "creating" } }),
            true,
        )
        .await?
    } else {
        out
    };
    ctx.clear_warning(key);
    info!(node, "snapshot bound to its origin's node");
    Ok(Some(store(ctx, out)))
}

async fn handle_deletion(ctx: &Context, key: &ObjectKey, snap: &AntstorSnapshot) -> Result<()> {
    let fins = snap.metadata.finalizers.clone().unwrap_or_default();
    if !fins.iter().any(|f| f == finalizers::SNAPSHOT) {
        return Ok(());
    }
    let merged = snap
        .status
        .as_ref()
        .is_some_and(|s| s.status == SnapshotStatusName::Merged);
    let node = &snap.spec.origin_vol_target_node_id;
    let pool_gone = !node.is_empty() && ctx.state().pool(node).is_none();
    if !(merged || pool_gone) {
        return Ok(());
    }
    let keep: Vec<String> = fins
        .into_iter()
        .filter(|f| f != finalizers::SNAPSHOT)
        .collect();
    let body = json!({
        "metadata": { "resourceVersion": snap.metadata.resource_version, "finalizers": keep }
    });
    let _: AntstorSnapshot = ctx.patch(&key.namespace, &key.name, &body, false).await?;
    info!(merged, pool_gone, "snapshot released");
    Ok(())
}
