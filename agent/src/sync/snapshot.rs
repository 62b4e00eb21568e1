//! Snapshot sync: create, delete and merge-restore the AntstorSnapshots of this node.
//!
//! **Expected flow** (LiteIO §2.4):
//! 1. Deleting: delete the engine snapshot (missing is success: a merged LVM snapshot is
//!    consumed), then drop `antstor.alipay.com/snapshot`.
//! 2. Without the finalizer (and not merged): take the snapshot of the origin volume's engine
//!    object, named `spec.kernelLvol.name` / `spec.spdkLvol.name` when set, else
//!    `<originVolName>_snap`, with `spec.size` as the copy-on-write reserve; record
//!    `spec.kernelLvol` (LVM and file engines) or `spec.spdkLvol`; add the finalizer.
//! 3. Merge-restore when label `obnmvf/merge-start-timestamp` is set: status `merging`,
//!    merge (skipped when `obnmvf/merge-finish-timestamp` is already set), add the finish
//!    label, status `merged`.
//! 4. Otherwise `creating` → `ready`.
//!
//! **Guarantees.** Idempotent; every engine change notifies the pool reporter. **Errors**
//! are returned to the controller and, except conflicts, shown in `status.msg` (our own
//! field), with `status.permanent` when retrying cannot heal them (a pool without
//! reflinks): those wait for a change of the snapshot or the pool, the others are retried
//! with back-off. The next state written clears both.

use std::sync::Arc;

use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use liteio_api::keys::{finalizers, labels};
use liteio_api::snapshot::SnapshotStatusName;
use liteio_api::{AntstorSnapshot, AntstorVolume, keys};
use serde_json::{Value, json};
use tracing::{info, instrument, warn};

use super::names::{snapshot_engine_name, volume_engine_name};
use super::{has_finalizer, label, patch_guarded, patch_status, remove_finalizers, with_finalizer};
use crate::context::Ctx;
use crate::engine::EngineKind;
use crate::error::{AgentError, ErrorKind, Result};

/// The status of a snapshot in `phase`, clearing an earlier failure's message.
fn state(phase: SnapshotStatusName) -> Value {
    json!({"status": phase, "msg": "", "permanent": null})
}

fn phase(snap: &AntstorSnapshot) -> SnapshotStatusName {
    snap.status.as_ref().map(|s| s.status).unwrap_or_default()
}

fn api(ctx: &Ctx, snap: &AntstorSnapshot) -> Api<AntstorSnapshot> {
    let ns = snap
        .namespace()
        .unwrap_or_else(|| keys::DEFAULT_NAMESPACE.to_string());
    Api::namespaced(ctx.client.clone(), &ns)
}

/// Reconciles one AntstorSnapshot. See the module documentation.
#[instrument(skip_all, fields(snapshot = %snap.name_any(), node = %ctx.node))]
pub async fn reconcile(snap: Arc<AntstorSnapshot>, ctx: Arc<Ctx>) -> Result<Action> {
    let res = reconcile_inner(&snap, &ctx).await;
    match &res {
        Err(e)
            if !matches!(e.kind(), ErrorKind::Conflict | ErrorKind::NotFound)
                && snap.metadata.deletion_timestamp.is_none() =>
        {
            set_message(&ctx, &snap, &e.chain(), e.is_permanent()).await;
        }
        _ => {}
    }
    res
}

/// Writes `status.msg` and `status.permanent` when they differ (best effort: a failure is
/// logged); an empty `msg` clears both.
async fn set_message(ctx: &Ctx, snap: &AntstorSnapshot, msg: &str, permanent: bool) {
    let cur = snap.status.as_ref();
    if cur.map_or(("", false), |s| (s.message.as_str(), s.permanent)) == (msg, permanent) {
        return;
    }
    let status = json!({
        "status": phase(snap),
        "msg": msg,
        "permanent": if permanent { json!(true) } else { Value::Null },
    });
    if let Err(e) = patch_status(ctx, &api(ctx, snap), snap, status).await {
        warn!(snapshot = %snap.name_any(), error = %e.chain(), "cannot write the snapshot's status message");
    }
}

async fn reconcile_inner(snap: &AntstorSnapshot, ctx: &Arc<Ctx>) -> Result<Action> {
    let api = api(ctx, snap);
    let ctx = Arc::clone(ctx);
    let mut snap = snap.clone();
    let ename = snapshot_engine_name(&snap);
    if snap.metadata.deletion_timestamp.is_some() {
        if has_finalizer(&snap.metadata, finalizers::SNAPSHOT) {
            let n = ename.clone();
            ctx.engine_call("delete snapshot", &ename, move |e| e.delete_snapshot(&n))
                .await?;
            ctx.pool_changed();
            remove_finalizers(&ctx, &api, &snap, &[finalizers::SNAPSHOT]).await?;
            info!("snapshot deleted from the pool");
        }
        return Ok(Action::await_change());
    }
    let merge_requested = label(&snap.metadata, labels::MERGE_START_TIMESTAMP).is_some();
    if !has_finalizer(&snap.metadata, finalizers::SNAPSHOT) {
        if phase(&snap) == SnapshotStatusName::Merged {
            return Ok(Action::await_change());
        }
        let origin_ns = Some(snap.spec.origin_vol_namespace.as_str())
            .filter(|s| !s.is_empty())
            .unwrap_or(keys::DEFAULT_NAMESPACE)
            .to_string();
        let vols: Api<AntstorVolume> = Api::namespaced(ctx.client.clone(), &origin_ns);
        let what = format!("AntstorVolume {origin_ns}/{}", snap.spec.origin_vol_name);
        let origin = ctx
            .timed(
                "get",
                what.clone(),
                vols.get_opt(&snap.spec.origin_vol_name),
            )
            .await?
            .ok_or(AgentError::NotFound { what })?;
        let origin_name = volume_engine_name(&origin);
        let reserve = u64::try_from(snap.spec.size).unwrap_or(0);
        let (o, n) = (origin_name.clone(), ename.clone());
        let info = ctx
            .engine_call("snapshot", &ename, move |e| {
                e.create_snapshot(&o, &n, reserve)
            })
            .await?;
        ctx.pool_changed();
        let spec = if ctx.engine.kind() == EngineKind::SpdkLvs {
            json!({"spdkLvol": {"name": info.name, "lvsName": ctx.pool_name}})
        } else {
            json!({"kernelLvol": {"name": info.name, "devPath": info.path.display().to_string()}})
        };
        let body = json!({
            "metadata": {"finalizers": with_finalizer(&snap.metadata, finalizers::SNAPSHOT)},
            "spec": spec,
        });
        snap = patch_guarded(&ctx, &api, &snap, body).await?;
        info!(origin = %origin_name, "snapshot created");
    }
    if merge_requested {
        if phase(&snap) == SnapshotStatusName::Merged {
            return Ok(Action::await_change());
        }
        if phase(&snap) != SnapshotStatusName::Merging {
            snap = patch_status(&ctx, &api, &snap, state(SnapshotStatusName::Merging)).await?;
        }
        if label(&snap.metadata, labels::MERGE_FINISH_TIMESTAMP).is_none() {
            let n = ename.clone();
            ctx.engine_call("restore snapshot", &ename, move |e| e.restore_snapshot(&n))
                .await?;
            ctx.pool_changed();
            let now = k8s_openapi::jiff::Timestamp::now().as_second().to_string();
            snap = patch_guarded(
                &ctx,
                &api,
                &snap,
                json!({"metadata": {"labels": {labels::MERGE_FINISH_TIMESTAMP: now}}}),
            )
            .await?;
            info!("snapshot merged into its origin");
        }
        patch_status(&ctx, &api, &snap, state(SnapshotStatusName::Merged)).await?;
        return Ok(Action::await_change());
    }
    if phase(&snap) == SnapshotStatusName::Creating {
        patch_status(&ctx, &api, &snap, state(SnapshotStatusName::Ready)).await?;
        info!("snapshot ready");
    } else if snap.status.as_ref().is_some_and(|s| !s.message.is_empty()) {
        set_message(&ctx, &snap, "", false).await;
    }
    Ok(Action::requeue(ctx.resync))
}
