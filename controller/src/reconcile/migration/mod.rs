//! The VolumeMigration reconciler: the controller's half of hot migration (reference §2.5,
//! issue 15). It validates the source, places and creates the destination volume, follows
//! what the source agent and the host's CSI node report on the migration object, and at the
//! end makes the destination *the* volume and deletes the source through the normal volume
//! deletion path. The agents' half and the contract between the two are in
//! `docs/migration.md`, section "Object flow".
//!
//! The decisions are pure functions in [`plan`] ([`validate_source`], [`dest_volume`],
//! [`agent_error`], [`next`], ...; re-exported here) so that they are unit-tested without an
//! API server; [`reconcile`] (this file) applies them.

pub mod plan;

// The decisions under the reconciler's name too (`reconcile::migration::source_key`).
pub use plan::{
    Next, agent_error, cntlid_clash, dest_key, dest_volume, migration_of_dest, next, source_key,
    switched, validate_source,
};

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams, PropagationPolicy};
use liteio_api::keys::{annotations, finalizers, labels, managers};
use liteio_api::migration::{MigrationPhase, STATUS_ERROR, STATUS_FINISHED, STATUS_WORKING};
use liteio_api::{AntstorVolume, VolumeMigration, VolumeStatus};
use serde_json::json;
use tracing::{info, instrument, warn};

use super::{Action, Context};
use crate::clock::elapsed;
use crate::error::{Error, Result};
use crate::scheduler::ScheduleError;
use crate::state::{ObjectKey, State};
use plan::has_finalizer;

fn store(ctx: &Context, mig: VolumeMigration) -> Arc<VolumeMigration> {
    let m = Arc::new(mig);
    ctx.upsert_migration(Arc::clone(&m));
    m
}

fn store_volume(ctx: &Context, vol: AntstorVolume) -> Arc<AntstorVolume> {
    let v = Arc::new(vol);
    ctx.state().upsert_volume(Arc::clone(&v));
    v
}

/// Writes `status` (phase, status, message) when it differs.
async fn set_status(
    ctx: &Context,
    mig: &Arc<VolumeMigration>,
    phase: MigrationPhase,
    status: &str,
    message: &str,
) -> Result<Arc<VolumeMigration>> {
    let cur = mig.status.as_ref();
    if cur.is_some_and(|s| s.phase == Some(phase) && s.status == status && s.message == message) {
        return Ok(Arc::clone(mig));
    }
    let key = ObjectKey::of(mig.as_ref());
    let body = json!({ "status": {
        "phase": phase,
        "status": status,
        "message": if message.is_empty() { serde_json::Value::Null } else { json!(message) },
    }});
    let out: VolumeMigration = ctx.patch(&key.namespace, &key.name, &body, true).await?;
    if status == STATUS_ERROR {
        ctx.warn_once(&out, "MigrationFailed", message.to_string())
            .await;
        warn!(phase = phase.as_str(), message, "migration step failed");
    } else {
        ctx.clear_warning(&key);
        info!(phase = phase.as_str(), status, "migration phase");
    }
    Ok(store(ctx, out))
}

async fn fail(ctx: &Context, mig: &Arc<VolumeMigration>, msg: &str) -> Result<Action> {
    set_status(ctx, mig, mig.phase(), STATUS_ERROR, msg).await?;
    Ok(Action::Done)
}

fn rfc3339(t: Timestamp) -> String {
    t.to_string()
}

fn annotation_time(mig: &VolumeMigration, key: &str) -> Option<Timestamp> {
    liteio_api::meta::annotation(&mig.metadata, key).and_then(|s| s.parse().ok())
}

/// Reconciles one VolumeMigration.
///
/// Flow (phases `Pending → CreatingVolume → SetupPipe → Syncing → Cleaning → Finished`,
/// status `Working | Error | Finished`; the agents' part is in `docs/migration.md`):
/// - The controller's `in-state` finalizer goes on first, so nothing it creates can outlive
///   the migration unnoticed. A migration being deleted goes to [`handle_deletion`].
/// - `Pending`: [`validate_source`]; then `spec.sourceVolume` gets the source's node, host
///   and export, the migration the labels `migrate.obnvmf/source-node-id` and
///   `migrate.obnvmf/host-node-id`; the destination node is chosen (the user's
///   `spec.destVolume.targetNodeId`, checked by the scheduler's filters, else the
///   scheduler's choice among every pool but the source's) and the destination volume
///   [`dest_volume`] `mig-<uid>` is created bound to it, charged in the state at once;
///   `spec.destVolume` names it. → `CreatingVolume`.
/// - `CreatingVolume`: once the destination is ready and exported, `spec.destVolume.spdk`
///   records its export. → `SetupPipe`.
/// - `SetupPipe`, `Syncing`, `Cleaning`: [`next`] over what the agents report; the time the
///   switch-over was enabled and when it succeeded are recorded as annotations.
/// - End of `Cleaning`: the source volume loses its `obnvmf/vol-uuid` label (so CSI finds
///   only the destination) and is deleted through the normal path (its agent removes the
///   export and the lvol; the Secret it owns is orphaned, not deleted); once it is gone the
///   destination loses its migration labels and is the volume. → `Finished`.
///
/// Guarantees: idempotent; the destination's name is derived from the migration's uid, so a
/// retried step finds it instead of creating a second one. Errors the user or an agent must
/// fix set status `Error` with a message naming the field or the report, keep the phase and
/// are re-evaluated on every change (a source that becomes ready lets `Pending` go on).
///
/// Errors: API failures and conflicts (retried with back-off by the runtime).
#[instrument(skip(ctx), fields(migration = %key))]
pub async fn reconcile(ctx: &Context, key: &ObjectKey) -> Result<Action> {
    let Some(mig) = ctx.migration(key) else {
        ctx.clear_warning(key);
        return Ok(Action::Done);
    };
    if mig.metadata.deletion_timestamp.is_some() {
        return handle_deletion(ctx, key, mig).await;
    }
    let mig = ensure_finalizer(ctx, key, mig).await?;
    match mig.phase() {
        MigrationPhase::Pending => pending(ctx, key, mig).await,
        MigrationPhase::CreatingVolume => creating_volume(ctx, mig).await,
        MigrationPhase::SetupPipe | MigrationPhase::Syncing | MigrationPhase::Cleaning => {
            follow_agents(ctx, mig).await
        }
        MigrationPhase::Finished => {
            set_status(ctx, &mig, MigrationPhase::Finished, STATUS_FINISHED, "").await?;
            Ok(Action::Done)
        }
    }
}

async fn ensure_finalizer(
    ctx: &Context,
    key: &ObjectKey,
    mig: Arc<VolumeMigration>,
) -> Result<Arc<VolumeMigration>> {
    if has_finalizer(&mig, finalizers::IN_STATE) {
        return Ok(mig);
    }
    let mut fins = mig.finalizers().to_vec();
    fins.push(finalizers::IN_STATE.into());
    let body = json!({ "metadata": {
        "resourceVersion": mig.metadata.resource_version,
        "finalizers": fins,
    }});
    let out: VolumeMigration = ctx.patch(&key.namespace, &key.name, &body, false).await?;
    Ok(store(ctx, out))
}

/// Another unfinished migration of the same source, older than `mig`.
fn other_migration(ctx: &Context, mig: &VolumeMigration) -> Option<ObjectKey> {
    let src = source_key(mig);
    let mine = (
        mig.metadata.creation_timestamp.as_ref().map(|t| t.0),
        ObjectKey::of(mig),
    );
    ctx.migrations()
        .into_iter()
        .filter(|m| {
            let theirs = (
                m.metadata.creation_timestamp.as_ref().map(|t| t.0),
                ObjectKey::of(m.as_ref()),
            );
            theirs < mine
                && source_key(m) == src
                && m.phase() != MigrationPhase::Finished
                && m.metadata.deletion_timestamp.is_none()
        })
        .map(|m| ObjectKey::of(m.as_ref()))
        .min()
}

async fn pending(ctx: &Context, key: &ObjectKey, mig: Arc<VolumeMigration>) -> Result<Action> {
    let src_key = source_key(&mig);
    let other = other_migration(ctx, &mig);
    let (src, snaps) = {
        let s = ctx.state();
        (s.volume(&src_key).cloned(), s.snapshots_of(&src_key))
    };
    if let Err(msg) = validate_source(&src_key, src.as_deref(), &snaps, other.as_ref()) {
        return fail(ctx, &mig, &msg).await;
    }
    let Some(src) = src else {
        return Ok(Action::Done);
    };
    let Some(dest_name) = mig.dest_volume_name() else {
        return fail(
            ctx,
            &mig,
            "metadata.uid is empty; cannot name the destination volume",
        )
        .await;
    };
    let src_node = src.spec.target_node_id.clone();
    let host = src
        .spec
        .host_node
        .as_ref()
        .map(|h| h.id.clone())
        .unwrap_or_default();
    let dest_key = ObjectKey::new(src_key.namespace.clone(), dest_name.clone());
    // The destination may exist already (a step retried after its create succeeded).
    let existing = ctx.state().volume(&dest_key).cloned();
    let dest = match existing {
        Some(d) => {
            if liteio_api::meta::label(&d.metadata, labels::MIGRATE_MIGRATION_NAME)
                != Some(key.name.as_str())
            {
                return fail(
                    ctx,
                    &mig,
                    &format!(
                        "AntstorVolume {dest_key} exists and is not this migration's destination"
                    ),
                )
                .await;
            }
            d
        }
        None => {
            let node = match choose_node(ctx, &mig, &src, &src_node, &dest_name) {
                Ok(n) => n,
                Err(msg) => return fail(ctx, &mig, &msg).await,
            };
            create_dest(ctx, &mig, &src, &dest_key, &node).await?
        }
    };
    let source_info = json!({
        "namespace": src_key.namespace,
        "name": src_key.name,
        "targetNodeId": src_node,
        "hostNodeId": host,
        "spdk": src.spec.spdk_target.clone().unwrap_or_default(),
    });
    let mut body = json!({
        "metadata": { "labels": {
            labels::MIGRATE_SOURCE_NODE_ID: src_node,
            labels::MIGRATE_HOST_NODE_ID: host,
        }},
        "spec": {
            "sourceVolume": source_info,
            "destVolume": {
                "namespace": dest_key.namespace,
                "name": dest_key.name,
                "targetNodeId": dest.spec.target_node_id,
                "hostNodeId": host,
            },
        },
    });
    if mig.spec.migration_info.start_ts == 0 {
        body["spec"]["migrationInfo"] = json!({ "startTs": ctx.clock.now().as_second() });
    }
    let out: VolumeMigration = ctx.patch(&key.namespace, &key.name, &body, false).await?;
    let mig = store(ctx, out);
    info!(source = %src_key, source_node = %src_node, dest = %dest_key, dest_node = %dest.spec.target_node_id, "migration destination created");
    set_status(
        ctx,
        &mig,
        MigrationPhase::CreatingVolume,
        STATUS_WORKING,
        "",
    )
    .await?;
    Ok(Action::Done)
}

/// The destination node: the user's `spec.destVolume.targetNodeId` when set (checked by the
/// scheduler's filters), else the scheduler's choice among the pools other than the
/// source's.
fn choose_node(
    ctx: &Context,
    mig: &VolumeMigration,
    src: &AntstorVolume,
    src_node: &str,
    dest_name: &str,
) -> std::result::Result<String, String> {
    let probe = dest_volume(mig, src, dest_name, "");
    let wanted = mig.spec.dest_volume.target_node_id.as_str();
    let started = std::time::Instant::now();
    let state = ctx.state();
    let src_addr = src
        .spec
        .spdk_target
        .as_ref()
        .map_or("", |t| t.address.as_str());
    let res = if wanted.is_empty() {
        choose_any(ctx, &state, &probe, src_node, src_addr)
    } else if wanted == src_node {
        Err(format!(
            "spec.destVolume.targetNodeId: {wanted} is the source volume's node; name another node or leave it empty"
        ))
    } else if state
        .pool(wanted)
        .is_some_and(|p| cntlid_clash(p.pool, src_addr))
    {
        Err(format!(
            "spec.destVolume.targetNodeId: node {wanted} hands out the same NVMe controller IDs as the source's node (both addresses hash to one slot), so a host could not hold a path to each; name another node"
        ))
    } else {
        match ctx.scheduler.check_pool(&state, wanted, &probe) {
            Ok(Ok(())) => Ok(wanted.to_string()),
            Ok(Err(reason)) => Err(format!(
                "spec.destVolume.targetNodeId: node {wanted} cannot take volume {}: {}",
                src.name_any(),
                reason.as_str()
            )),
            Err(e) => Err(format!("destination volume: {e}")),
        }
    };
    drop(state);
    ctx.metrics
        .schedule_seconds
        .with_label_values(&[if res.is_ok() { "placed" } else { "unplaceable" }])
        .observe(started.elapsed().as_secs_f64());
    res
}

fn choose_any(
    ctx: &Context,
    state: &State,
    probe: &AntstorVolume,
    src_node: &str,
    src_addr: &str,
) -> std::result::Result<String, String> {
    let mut without_source = state.clone();
    without_source.remove_pool(src_node);
    let clashing: Vec<String> = without_source
        .pools()
        .filter(|p| cntlid_clash(p.pool, src_addr))
        .map(|p| p.name.to_string())
        .collect();
    for name in &clashing {
        without_source.remove_pool(name);
    }
    match ctx.scheduler.schedule(&without_source, probe) {
        Ok(p) => Ok(p.node),
        Err(e @ ScheduleError::NoStoragePoolAvailable(_)) => Err(format!(
            "no node other than the source's ({src_node}) can take volume {}: {e}",
            probe
                .labels()
                .get(labels::MIGRATE_SOURCE_VOLUME_NAME)
                .map_or("", String::as_str)
        )),
        Err(e) => Err(format!("destination volume: {e}")),
    }
}

async fn create_dest(
    ctx: &Context,
    mig: &VolumeMigration,
    src: &AntstorVolume,
    key: &ObjectKey,
    node: &str,
) -> Result<Arc<AntstorVolume>> {
    let vol = dest_volume(mig, src, &key.name, node);
    let api: Api<AntstorVolume> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let pp = PostParams {
        field_manager: Some(managers::CONTROLLER.into()),
        ..PostParams::default()
    };
    let out = match api.create(&pp, &vol).await {
        Ok(v) => v,
        Err(kube::Error::Api(s)) if s.code == 409 => api
            .get(&key.name)
            .await
            .map_err(|e| Error::kube(format!("get AntstorVolume {key}"), e))?,
        Err(e) => return Err(Error::kube(format!("create AntstorVolume {key}"), e)),
    };
    info!(volume = %key, node, "destination volume created");
    Ok(store_volume(ctx, out))
}

async fn creating_volume(ctx: &Context, mig: Arc<VolumeMigration>) -> Result<Action> {
    let Some(dkey) = dest_key(&mig) else {
        return fail(
            ctx,
            &mig,
            "metadata.uid is empty; cannot name the destination volume",
        )
        .await;
    };
    let Some(dest) = ctx.state().volume(&dkey).cloned() else {
        return fail(
            ctx,
            &mig,
            &format!(
                "destination volume {dkey} disappeared; delete this migration and start another"
            ),
        )
        .await;
    };
    let exported = dest
        .spec
        .spdk_target
        .as_ref()
        .filter(|t| !t.subsys_nqn.is_empty() && !t.svc_id.is_empty())
        .cloned();
    let (VolumeStatus::Ready, Some(target)) = (dest.phase(), exported) else {
        let why = dest
            .status
            .as_ref()
            .map(|s| s.message.as_str())
            .filter(|m| !m.is_empty())
            .map(|m| format!("waiting for destination volume {dkey}: {m}"))
            .unwrap_or_default();
        set_status(
            ctx,
            &mig,
            MigrationPhase::CreatingVolume,
            STATUS_WORKING,
            &why,
        )
        .await?;
        return Ok(Action::Done);
    };
    let key = ObjectKey::of(mig.as_ref());
    let body = json!({ "spec": { "destVolume": {
        "namespace": dkey.namespace,
        "name": dkey.name,
        "targetNodeId": dest.spec.target_node_id,
        "hostNodeId": mig.spec.source_volume.host_node_id,
        "spdk": target,
    }}});
    let out: VolumeMigration = ctx.patch(&key.namespace, &key.name, &body, false).await?;
    let mig = store(ctx, out);
    set_status(ctx, &mig, MigrationPhase::SetupPipe, STATUS_WORKING, "").await?;
    Ok(Action::Done)
}

/// Records a timestamp annotation once; returns the migration as stored.
async fn mark_time(
    ctx: &Context,
    mig: Arc<VolumeMigration>,
    annotation: &str,
    at: Timestamp,
) -> Result<Arc<VolumeMigration>> {
    if liteio_api::meta::annotation(&mig.metadata, annotation).is_some() {
        return Ok(mig);
    }
    let key = ObjectKey::of(mig.as_ref());
    let body = json!({ "metadata": { "annotations": { annotation: rfc3339(at) } } });
    let out: VolumeMigration = ctx.patch(&key.namespace, &key.name, &body, false).await?;
    Ok(store(ctx, out))
}

async fn follow_agents(ctx: &Context, mig: Arc<VolumeMigration>) -> Result<Action> {
    let phase = mig.phase();
    // Before the switch the destination must be there.
    if matches!(phase, MigrationPhase::SetupPipe | MigrationPhase::Syncing)
        && let Some(dkey) = dest_key(&mig)
        && ctx.state().volume(&dkey).is_none()
    {
        return fail(
            ctx,
            &mig,
            &format!("destination volume {dkey} disappeared; the source volume keeps serving"),
        )
        .await;
    }
    let now = ctx.clock.now();
    let mut mig = mig;
    if mig.spec.migration_info.auto_switch.enabled {
        mig = mark_time(ctx, mig, annotations::MIGRATE_SWITCH_ENABLED_AT, now).await?;
    }
    match next(&mig) {
        Next::Wait => {
            set_status(ctx, &mig, phase, STATUS_WORKING, "").await?;
        }
        Next::Fail(msg) => {
            set_status(ctx, &mig, phase, STATUS_ERROR, &msg).await?;
        }
        Next::Advance(p) => {
            if p == MigrationPhase::Cleaning {
                let first = annotation_time(&mig, annotations::MIGRATE_SWITCHED_AT).is_none();
                mig = mark_time(ctx, mig, annotations::MIGRATE_SWITCHED_AT, now).await?;
                if first
                    && let Some(from) =
                        annotation_time(&mig, annotations::MIGRATE_SWITCH_ENABLED_AT)
                {
                    ctx.metrics
                        .migration_switch_seconds
                        .observe(elapsed(now, from).as_secs_f64());
                }
            }
            set_status(ctx, &mig, p, STATUS_WORKING, "").await?;
        }
        Next::RetireSource => return retire_source(ctx, mig).await,
    }
    Ok(Action::Done)
}

/// End of `Cleaning`: the source volume is deleted through the normal path, then the
/// destination becomes the volume.
async fn retire_source(ctx: &Context, mig: Arc<VolumeMigration>) -> Result<Action> {
    let src_key = source_key(&mig);
    let src = ctx.state().volume(&src_key).cloned();
    if let Some(src) = src {
        let is_source = src.spec.target_node_id == mig.spec.source_volume.target_node_id
            && liteio_api::meta::label(&src.metadata, labels::MIGRATE_MIGRATION_NAME).is_none();
        if !is_source {
            // The name was reused for another volume after the source went: not ours.
            return finish(ctx, mig).await;
        }
        if src.metadata.deletion_timestamp.is_none() {
            adopt_publish_record(ctx, &mig, &src).await?;
            if src.labels().contains_key(labels::VOL_UUID) {
                let body = json!({ "metadata": {
                    "resourceVersion": src.metadata.resource_version,
                    "labels": { labels::VOL_UUID: null },
                }});
                let out: AntstorVolume = ctx
                    .patch(&src_key.namespace, &src_key.name, &body, false)
                    .await?;
                store_volume(ctx, out);
            }
            let api: Api<AntstorVolume> = Api::namespaced(ctx.client.clone(), &src_key.namespace);
            // Orphan: the authentication Secret the source owns stays for the destination
            // (CSI DeleteVolume deletes it when the volume goes for good).
            let dp = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Orphan),
                ..DeleteParams::default()
            };
            match api.delete(&src_key.name, &dp).await {
                Ok(_) => {
                    info!(source = %src_key, "source volume deleted; its agent removes the export and the lvol")
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(Error::kube(format!("delete AntstorVolume {src_key}"), e)),
            }
        }
        set_status(
            ctx,
            &mig,
            MigrationPhase::Cleaning,
            STATUS_WORKING,
            &format!("waiting for source volume {src_key} to be deleted"),
        )
        .await?;
        // Its DELETE event re-queues this migration.
        return Ok(Action::Done);
    }
    finish(ctx, mig).await
}

/// The destination takes over the source's record of the CSI node publish
/// (`status.csiNodePubParams`) when it has none: it is the volume from now on.
async fn adopt_publish_record(
    ctx: &Context,
    mig: &VolumeMigration,
    src: &AntstorVolume,
) -> Result<()> {
    let Some(params) = src
        .status
        .as_ref()
        .and_then(|s| s.csi_node_pub_params.clone())
    else {
        return Ok(());
    };
    let dest = dest_key(mig).and_then(|k| {
        let d = ctx.state().volume(&k).cloned();
        d.map(|d| (k, d))
    });
    let Some((dkey, dest)) = dest else {
        return Ok(());
    };
    if dest
        .status
        .as_ref()
        .is_some_and(|s| s.csi_node_pub_params.is_some())
    {
        return Ok(());
    }
    let body = json!({ "status": { "csiNodePubParams": params } });
    let out: AntstorVolume = ctx.patch(&dkey.namespace, &dkey.name, &body, true).await?;
    store_volume(ctx, out);
    Ok(())
}

/// The source is gone: the destination drops its migration labels; the migration is
/// `Finished`.
async fn finish(ctx: &Context, mig: Arc<VolumeMigration>) -> Result<Action> {
    let dest = dest_key(&mig).and_then(|k| {
        let d = ctx.state().volume(&k).cloned();
        d.map(|d| (k, d))
    });
    if let Some((dkey, dest)) = dest
        && (dest.labels().contains_key(labels::MIGRATE_MIGRATION_NAME)
            || dest
                .labels()
                .contains_key(labels::MIGRATE_SOURCE_VOLUME_NAME))
    {
        let body = json!({ "metadata": {
            "resourceVersion": dest.metadata.resource_version,
            "labels": {
                labels::MIGRATE_MIGRATION_NAME: null,
                labels::MIGRATE_SOURCE_VOLUME_NAME: null,
                labels::VOL_UUID: dest.spec.uuid,
            },
        }});
        let out: AntstorVolume = ctx.patch(&dkey.namespace, &dkey.name, &body, false).await?;
        store_volume(ctx, out);
        info!(volume = %dkey, "destination volume is now the volume");
    }
    let now = ctx.clock.now();
    let first = annotation_time(&mig, annotations::MIGRATE_FINISHED_AT).is_none();
    let mig = mark_time(ctx, mig, annotations::MIGRATE_FINISHED_AT, now).await?;
    if first && let Some(created) = mig.metadata.creation_timestamp.as_ref() {
        ctx.metrics
            .migration_seconds
            .observe(elapsed(now, created.0).as_secs_f64());
    }
    set_status(ctx, &mig, MigrationPhase::Finished, STATUS_FINISHED, "").await?;
    Ok(Action::Done)
}

/// A migration being deleted.
///
/// Flow: before the switch-over the migration is cancelled: the destination volume (by its
/// uid-derived name, so also one whose name never reached `spec.destVolume`) is deleted
/// through the normal path, the source is not touched. After the switch-over (the host
/// already uses the destination) the flow is finished first, as if the migration had not
/// been deleted. Then the controller's `in-state` finalizer is removed; the agents remove
/// theirs (`obnvmf/migrate-pipe-connected`, `obnvmf/migrate-host-connected`) once they have
/// torn down the pipe and the second path.
///
/// Errors: API failures (retried).
#[instrument(skip(ctx, mig), fields(migration = %key))]
pub async fn handle_deletion(
    ctx: &Context,
    key: &ObjectKey,
    mig: Arc<VolumeMigration>,
) -> Result<Action> {
    if !has_finalizer(&mig, finalizers::IN_STATE) {
        return Ok(Action::Done);
    }
    let committed = ctx
        .state()
        .volume(&source_key(&mig))
        .is_some_and(|v| v.switch_committed());
    if (switched(&mig) || committed) && mig.phase() != MigrationPhase::Finished {
        // Not cancellable any more (the source agent committed the switch-over when it
        // marked the source inaccessible): finish, then release.
        let action = follow_agents(ctx, Arc::clone(&mig)).await?;
        if ctx
            .migration(key)
            .is_none_or(|m| m.phase() != MigrationPhase::Finished)
        {
            return Ok(action);
        }
    } else if mig.phase() != MigrationPhase::Finished
        && let Some(dkey) = dest_key(&mig)
    {
        let dest = ctx.state().volume(&dkey).cloned();
        if let Some(dest) = dest
            && dest.metadata.deletion_timestamp.is_none()
            && liteio_api::meta::label(&dest.metadata, labels::MIGRATE_MIGRATION_NAME)
                == Some(key.name.as_str())
        {
            let api: Api<AntstorVolume> = Api::namespaced(ctx.client.clone(), &dkey.namespace);
            match api.delete(&dkey.name, &DeleteParams::default()).await {
                Ok(_) => info!(dest = %dkey, "migration cancelled; destination volume deleted"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(Error::kube(format!("delete AntstorVolume {dkey}"), e)),
            }
        }
    }
    let mig = ctx.migration(key).unwrap_or(mig);
    let keep: Vec<String> = mig
        .finalizers()
        .iter()
        .filter(|f| f.as_str() != finalizers::IN_STATE)
        .cloned()
        .collect();
    let body = json!({ "metadata": {
        "resourceVersion": mig.metadata.resource_version,
        "finalizers": keep,
    }});
    let out: VolumeMigration = ctx.patch(&key.namespace, &key.name, &body, false).await?;
    if out.finalizers().is_empty() {
        ctx.remove_migration(key);
    } else {
        store(ctx, out);
    }
    info!("migration released");
    Ok(Action::Done)
}
