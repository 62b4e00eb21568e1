//! The source node's part of a hot migration (`docs/migration.md`, "Object flow"): the
//! VolumeMigrations labelled `migrate.obnvmf/source-node-id=<this node>`.
//!
//! One pass does what the migration's phase asks of this node:
//! - `SetupPipe`, `Syncing` (before the switch-over): connect the destination's pipe
//!   listener with this node's NVMe/TCP initiator (the volume's keys, this node's host NQN),
//!   record `migrationInfo.migrationPipe` and the finalizer `obnvmf/migrate-pipe-connected`;
//!   in `Syncing` start the copy on the source's gate and report `jobProgress` every pass
//!   (a second while it runs). A copy that failed is reported (`jobProgress.status: Failed`),
//!   torn down, and started again on a later pass (after an agent restart, the copy starts
//!   from the beginning: the mirror lived in the process).
//! - Once the copy is in step: `autoSwitch.enabled`, then the switch-over:
//!   1. fence the source's export (its I/O waits in the target);
//!   2. **commit**: annotate the source volume `migrate.obnvmf/ana-state: inaccessible`
//!      (from here the migration only goes forward: a restarted agent exports the source
//!      inaccessible, so no write can land on it unmirrored);
//!   3. annotate the destination volume `…/ana-state: optimized`; its agent promotes the
//!      destination's listener and acknowledges in `…/ana-applied`;
//!   4. demote the source's listener to inaccessible, which ends the fence: the held I/O
//!      fails with an ANA path error and the host retries it on the destination;
//!   5. `autoSwitch.status: Success` once the destination acknowledged.
//!
//!   The fenced part is bounded ([`FENCE_LIMIT`]): a host resets a controller whose
//!   keep-alives go unanswered for its keep-alive timeout (5 s for the kernel). When the
//!   commit did not happen in time the fence is lifted and the copy stays in step (writes are
//!   still mirrored); when it did, the source is demoted anyway and a later pass waits for
//!   the destination's acknowledgement.
//! - `Cleaning`, or deleted after the switch-over: detach the mirror, disconnect the pipe,
//!   `migrationPipe.status: Disconnected`, drop the finalizer.
//! - Deleted before the commit (cancelled): stop the copy, lift any fence, disconnect the
//!   pipe, drop the finalizer. The source serves on, untouched.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use liteio_api::keys::{annotations, finalizers};
use liteio_api::migration::{
    ConnectStatus, MigrationPhase, PAGE_BYTES, ResultStatus, VolumeMigration,
};
use liteio_api::{AntstorVolume, SpdkTarget};
use serde_json::json;
use tracing::{info, instrument, warn};

use super::{annotation, has_finalizer, patch_guarded, remove_finalizers, with_finalizer};
use crate::context::Ctx;
use crate::error::{AgentError, Result};
use crate::exporter::{CopyPhase, CopyStatus, ExportError, Migrator, PathState, PipeRequest};

/// Resource name in metrics.
pub const RESOURCE: &str = "volumemigration";

/// Longest time the source's export stays fenced during a switch-over.
pub const FENCE_LIMIT: Duration = Duration::from_secs(3);

/// Between the destination's promotion and the source's demotion (see `switch_over`).
const PROMOTION_GRACE: Duration = Duration::from_millis(100);

/// How often a running copy's progress is reported.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Pause before a failed copy is started again.
const RETRY_COPY: Duration = Duration::from_secs(5);

fn export_err(op: &'static str, volume: &str, source: ExportError) -> AgentError {
    AgentError::Export {
        op,
        volume: volume.to_string(),
        source,
    }
}

fn invalid(m: &VolumeMigration, reason: impl Into<String>) -> AgentError {
    AgentError::InvalidObject {
        what: format!("VolumeMigration {}", m.name_any()),
        reason: reason.into(),
    }
}

/// The name of the pipe's NVMe controller on this node.
fn pipe_controller(m: &VolumeMigration) -> String {
    format!("pipe-{}", m.metadata.uid.as_deref().unwrap_or("none"))
}

/// Reconciles one migration whose source is on this node.
#[instrument(skip_all, fields(migration = %m.name_any(), node = %ctx.node))]
pub async fn reconcile(m: Arc<VolumeMigration>, ctx: Arc<Ctx>) -> Result<Action> {
    let Some(mig) = ctx.exporter.migrator() else {
        return Ok(Action::await_change());
    };
    let m = m.as_ref();
    let api: Api<VolumeMigration> = Api::namespaced(
        ctx.client.clone(),
        &m.namespace()
            .unwrap_or_else(|| liteio_api::keys::DEFAULT_NAMESPACE.into()),
    );
    let phase = m.phase();
    if phase == MigrationPhase::Finished
        && !has_finalizer(&m.metadata, finalizers::MIGRATE_PIPE_CONNECTED)
    {
        return Ok(Action::await_change());
    }
    let vols: Api<AntstorVolume> = Api::namespaced(ctx.client.clone(), &m.source_namespace());
    let src_name = &m.spec.source_volume.name;
    let source = if src_name.is_empty() {
        None
    } else {
        ctx.timed(
            "get",
            format!("AntstorVolume {src_name}"),
            vols.get_opt(src_name),
        )
        .await?
    };
    let switched = m.spec.migration_info.auto_switch.status == Some(ResultStatus::Success);
    let committed = source.as_ref().is_some_and(AntstorVolume::switch_committed);
    let lvol = source
        .as_ref()
        .and_then(|s| s.spec.spdk_lvol.as_ref())
        .map(liteio_api::SpdkLvol::full_name);
    let deleting = m.metadata.deletion_timestamp.is_some();
    if deleting && !switched && !committed {
        return cancel(&ctx, mig, &api, m, source.as_ref(), lvol.as_deref()).await;
    }
    if switched {
        return clean_up(&ctx, mig, &api, m, lvol.as_deref()).await;
    }
    if matches!(phase, MigrationPhase::Cleaning | MigrationPhase::Finished) {
        // Cleaning without a recorded success cannot come from the controller; wait.
        return Ok(Action::await_change());
    }
    if !matches!(phase, MigrationPhase::SetupPipe | MigrationPhase::Syncing) && !committed {
        return Ok(Action::await_change());
    }
    let Some(source) = source else {
        return Err(invalid(m, format!("source volume {src_name} is not there")));
    };
    let Some(lvol) = lvol else {
        return Err(invalid(
            m,
            format!("source volume {src_name} has no spec.spdkLvol"),
        ));
    };
    let dst_ns = if m.spec.dest_volume.namespace.is_empty() {
        m.source_namespace()
    } else {
        m.spec.dest_volume.namespace.clone()
    };
    let dvols: Api<AntstorVolume> = Api::namespaced(ctx.client.clone(), &dst_ns);
    let dst_name = &m.spec.dest_volume.name;
    let Some(dest) = ctx
        .timed(
            "get",
            format!("AntstorVolume {dst_name}"),
            dvols.get_opt(dst_name),
        )
        .await?
    else {
        return Err(invalid(
            m,
            format!("destination volume {dst_ns}/{dst_name} is not there"),
        ));
    };
    if committed {
        // Past the point of no return (an earlier pass or run): finish the switch-over.
        return switch_over(&ctx, mig, &api, m, &vols, &source, &dvols, &dest).await;
    }
    // The pipe.
    let Some(pipe) = connect(&ctx, mig, m, &source, &dest).await? else {
        return Ok(Action::requeue(PROGRESS_EVERY));
    };
    let m = record_pipe(&ctx, &api, m, &pipe).await?;
    if m.phase() != MigrationPhase::Syncing {
        return Ok(Action::await_change());
    }
    // The copy.
    let st = mig
        .copy_status(&lvol)
        .await
        .map_err(|e| export_err("read the copy of", &source.name_any(), e))?;
    let reported = m.spec.migration_info.job_progress.status.as_str();
    let key = m.metadata.uid.clone().unwrap_or_default();
    let st = match st.state {
        CopyPhase::Failed if reported != CopyPhase::Failed.as_str() => {
            warn!(status = st.status, "the copy failed; the source serves on");
            ctx.copy_failures.failed(&key);
            report(&ctx, &api, &m, &lvol, &pipe, &st, false).await?;
            teardown(mig, &m, &lvol).await?;
            return Ok(Action::requeue(RETRY_COPY));
        }
        CopyPhase::Idle | CopyPhase::Cancelled | CopyPhase::Failed | CopyPhase::Finished => {
            if let Some(left) = ctx.copy_failures.wait_left(&key, RETRY_COPY) {
                return Ok(Action::requeue(left));
            }
            ctx.copy_failures.forget(&key);
            let st = mig
                .start_copy(&lvol, &pipe)
                .await
                .map_err(|e| export_err("start the copy of", &source.name_any(), e))?;
            info!(bytes = st.size_bytes, mirror = %pipe, "copy started");
            st
        }
        _ => st,
    };
    if st.state != CopyPhase::InStep {
        report(&ctx, &api, &m, &lvol, &pipe, &st, false).await?;
        return Ok(Action::requeue(PROGRESS_EVERY));
    }
    info!(
        copied = st.copied_bytes,
        ms = st.elapsed.as_millis() as u64,
        mirrored = st.mirrored_writes,
        "the destination is in step; switching over"
    );
    let m = report(&ctx, &api, &m, &lvol, &pipe, &st, true).await?;
    switch_over(&ctx, mig, &api, &m, &vols, &source, &dvols, &dest).await
}

/// Connects the pipe; `None` while the destination has no pipe listener yet.
async fn connect(
    ctx: &Ctx,
    mig: &dyn Migrator,
    m: &VolumeMigration,
    source: &AntstorVolume,
    dest: &AntstorVolume,
) -> Result<Option<String>> {
    let Some(port) = annotation(&dest.metadata, annotations::MIGRATE_PIPE_SVC_ID)
        .and_then(|p| p.parse::<u16>().ok())
    else {
        return Ok(None);
    };
    let Some(t) = dest
        .spec
        .spdk_target
        .as_ref()
        .filter(|t| !t.address.is_empty())
    else {
        return Ok(None);
    };
    let req = PipeRequest {
        controller: pipe_controller(m),
        address: t.address.clone(),
        port,
        subnqn: t.subsys_nqn.clone(),
        hostnqn: super::names::node_host_nqn(ctx, &ctx.node).await?,
        uuid: source.spec.uuid.clone(),
        tls: annotation(&source.metadata, annotations::NVMF_TLS) == Some("true"),
    };
    mig.connect_pipe(&req)
        .await
        .map(Some)
        .map_err(|e| export_err("connect the migration pipe to", &dest.name_any(), e))
}

async fn record_pipe(
    ctx: &Ctx,
    api: &Api<VolumeMigration>,
    m: &VolumeMigration,
    bdev: &str,
) -> Result<VolumeMigration> {
    let p = &m.spec.migration_info.migration_pipe;
    if p.status == Some(ConnectStatus::Connected)
        && p.dest_bdev_name == bdev
        && has_finalizer(&m.metadata, finalizers::MIGRATE_PIPE_CONNECTED)
    {
        return Ok(m.clone());
    }
    let body = json!({
        "metadata": {"finalizers": with_finalizer(&m.metadata, finalizers::MIGRATE_PIPE_CONNECTED)},
        "spec": {"migrationInfo": {"migrationPipe": {"destBdevName": bdev, "status": ConnectStatus::Connected}}},
    });
    let m = patch_guarded(ctx, api, m, body).await?;
    info!(bdev, "migration pipe connected");
    Ok(m)
}

/// Writes `jobProgress` (and `autoSwitch.enabled` when `enable`) when it changed.
async fn report(
    ctx: &Ctx,
    api: &Api<VolumeMigration>,
    m: &VolumeMigration,
    lvol: &str,
    pipe: &str,
    st: &CopyStatus,
    enable: bool,
) -> Result<VolumeMigration> {
    let pages = i64::try_from(st.copied_bytes / PAGE_BYTES).unwrap_or(i64::MAX);
    let in_step = st.state == CopyPhase::InStep;
    let job = json!({
        "srcBdev": lvol,
        "dstBdev": pipe,
        "status": st.state.as_str(),
        "total_write_pages": pages,
        "total_read_pages": pages,
        "roundPassed": i64::from(in_step),
        "ms_elapsed": i64::try_from(st.elapsed.as_millis()).unwrap_or(i64::MAX),
        "is_last_round": if in_step { "true" } else { "" },
    });
    // Every field is written (an empty one clears what an earlier pass wrote); the patch is
    // skipped when the object already says the same.
    let same = serde_json::from_value::<liteio_api::migration::JobProgress>(job.clone())
        .is_ok_and(|j| j == m.spec.migration_info.job_progress);
    let enable = enable && !m.spec.migration_info.auto_switch.enabled;
    if same && !enable {
        return Ok(m.clone());
    }
    let mut info = json!({"jobProgress": job});
    if enable {
        info["autoSwitch"] = json!({"enabled": true, "status": ResultStatus::Unknown});
    }
    patch_guarded(ctx, api, m, json!({"spec": {"migrationInfo": info}})).await
}

/// Stops the copy and drops the pipe (the source serves on).
async fn teardown(mig: &dyn Migrator, m: &VolumeMigration, lvol: &str) -> Result<()> {
    mig.cancel_copy(lvol)
        .await
        .map_err(|e| export_err("cancel the copy of", lvol, e))?;
    mig.disconnect_pipe(&pipe_controller(m))
        .await
        .map_err(|e| export_err("disconnect the migration pipe of", lvol, e))
}

/// Marks the pipe disconnected and drops the finalizer.
async fn release(ctx: &Ctx, api: &Api<VolumeMigration>, m: &VolumeMigration) -> Result<Action> {
    ctx.copy_failures
        .forget(m.metadata.uid.as_deref().unwrap_or_default());
    let p = &m.spec.migration_info.migration_pipe;
    let mut m = m.clone();
    if p.status == Some(ConnectStatus::Connected) {
        let body = json!({"spec": {"migrationInfo": {"migrationPipe": {"status": ConnectStatus::Disconnected}}}});
        m = patch_guarded(ctx, api, &m, body).await?;
    }
    remove_finalizers(ctx, api, &m, &[finalizers::MIGRATE_PIPE_CONNECTED]).await?;
    Ok(Action::await_change())
}

/// Deleted before the switch-over: the copy stops, the source serves on.
async fn cancel(
    ctx: &Ctx,
    mig: &dyn Migrator,
    api: &Api<VolumeMigration>,
    m: &VolumeMigration,
    source: Option<&AntstorVolume>,
    lvol: Option<&str>,
) -> Result<Action> {
    if let Some(lvol) = lvol {
        teardown(mig, m, lvol).await?;
    } else {
        mig.disconnect_pipe(&pipe_controller(m))
            .await
            .map_err(|e| export_err("disconnect the migration pipe of", &m.name_any(), e))?;
    }
    // A switch-over interrupted before its commit may have left the export fenced.
    if let Some(t) = source.and_then(|s| s.spec.spdk_target.as_ref()) {
        mig.unfence(&t.subsys_nqn)
            .await
            .map_err(|e| export_err("lift the fence of", &t.subsys_nqn, e))?;
    }
    if has_finalizer(&m.metadata, finalizers::MIGRATE_PIPE_CONNECTED) {
        info!("migration cancelled; the source serves on");
    }
    release(ctx, api, m).await
}

/// After the switch-over: the mirror and the pipe go.
async fn clean_up(
    ctx: &Ctx,
    mig: &dyn Migrator,
    api: &Api<VolumeMigration>,
    m: &VolumeMigration,
    lvol: Option<&str>,
) -> Result<Action> {
    if !has_finalizer(&m.metadata, finalizers::MIGRATE_PIPE_CONNECTED)
        && m.spec.migration_info.migration_pipe.status != Some(ConnectStatus::Connected)
    {
        return Ok(Action::await_change());
    }
    if let Some(lvol) = lvol
        && let Err(e) = mig.finish_copy(lvol).await
    {
        // Not in step any more (a mirrored write failed after the switch): the source
        // takes no I/O now, so stopping the mirror loses nothing.
        warn!(error = %e, "the mirror was not in step at the end; stopping it");
        mig.cancel_copy(lvol)
            .await
            .map_err(|e| export_err("stop the mirror of", lvol, e))?;
    }
    mig.disconnect_pipe(&pipe_controller(m))
        .await
        .map_err(|e| export_err("disconnect the migration pipe of", &m.name_any(), e))?;
    info!("migration pipe disconnected");
    release(ctx, api, m).await
}

fn target_of<'a>(v: &'a AntstorVolume, m: &VolumeMigration) -> Result<&'a SpdkTarget> {
    v.spec
        .spdk_target
        .as_ref()
        .filter(|t| !t.subsys_nqn.is_empty())
        .ok_or_else(|| invalid(m, format!("volume {} has no spec.spdkTarget", v.name_any())))
}

/// Patches annotation `key` of `v` to `value` (when it differs).
async fn annotate(
    ctx: &Ctx,
    api: &Api<AntstorVolume>,
    v: &AntstorVolume,
    key: &str,
    value: &str,
) -> Result<AntstorVolume> {
    if annotation(&v.metadata, key) == Some(value) {
        return Ok(v.clone());
    }
    patch_guarded(
        ctx,
        api,
        v,
        json!({"metadata": {"annotations": {key: value}}}),
    )
    .await
}

/// Whether the destination's agent has applied `optimized`, waiting for it up to `limit`.
async fn promoted(api: &Api<AntstorVolume>, dest: &str, limit: Duration) -> bool {
    let applied = |v: Option<&AntstorVolume>| {
        v.is_some_and(|v| {
            annotation(&v.metadata, annotations::MIGRATE_ANA_APPLIED)
                == Some(PathState::Optimized.as_str())
        })
    };
    tokio::time::timeout(
        limit,
        kube::runtime::wait::await_condition(api.clone(), dest, applied),
    )
    .await
    .is_ok_and(|r| r.is_ok_and(|v| applied(v.as_ref())))
}

/// The switch-over (see the module documentation).
#[allow(clippy::too_many_arguments)]
async fn switch_over(
    ctx: &Ctx,
    mig: &dyn Migrator,
    api: &Api<VolumeMigration>,
    m: &VolumeMigration,
    vols: &Api<AntstorVolume>,
    source: &AntstorVolume,
    dvols: &Api<AntstorVolume>,
    dest: &AntstorVolume,
) -> Result<Action> {
    let t = target_of(source, m)?;
    let port: u16 = t
        .svc_id
        .parse()
        .map_err(|_| invalid(m, format!("source svcID {:?} is not a port", t.svc_id)))?;
    let started = std::time::Instant::now();
    let already = source.switch_committed();
    if !already {
        mig.fence(&t.subsys_nqn)
            .await
            .map_err(|e| export_err("fence", &source.name_any(), e))?;
    }
    let fenced = async {
        if !already {
            annotate(
                ctx,
                vols,
                source,
                annotations::MIGRATE_ANA_STATE,
                PathState::Inaccessible.as_str(),
            )
            .await?;
        }
        // Committed: from here on only forward.
        annotate(
            ctx,
            dvols,
            dest,
            annotations::MIGRATE_ANA_STATE,
            PathState::Optimized.as_str(),
        )
        .await?;
        let acked = promoted(dvols, &dest.name_any(), FENCE_LIMIT).await;
        if acked {
            // The destination has told its hosts (an ANA change event); give them a moment
            // to read the new state before the source turns them away: a host that finds no
            // usable path may wait a while before it looks again (SPDK's initiator: 1 s).
            // Their I/O waits in the fence meanwhile.
            tokio::time::sleep(PROMOTION_GRACE).await;
        }
        Ok::<bool, AgentError>(acked)
    };
    let outcome = tokio::time::timeout(FENCE_LIMIT, fenced).await;
    let committed = already
        || match &outcome {
            Ok(Ok(_)) => true,
            // Did the commit land? Read it back.
            _ => ctx
                .timed(
                    "get",
                    format!("AntstorVolume {}", source.name_any()),
                    vols.get_opt(&source.name_any()),
                )
                .await
                .ok()
                .flatten()
                .is_some_and(|s| s.switch_committed()),
        };
    if !committed {
        // Not switched: the copy stays in step (writes are still mirrored); try again.
        mig.unfence(&t.subsys_nqn)
            .await
            .map_err(|e| export_err("lift the fence of", &source.name_any(), e))?;
        warn!("the switch-over could not commit in time; the source serves on");
        return match outcome {
            Ok(Err(e)) => Err(e),
            _ => Ok(Action::requeue(PROGRESS_EVERY)),
        };
    }
    // Demote the source: this also ends the fence.
    mig.set_path_state(&t.subsys_nqn, &t.address, port, PathState::Inaccessible)
        .await
        .map_err(|e| export_err("demote the export of", &source.name_any(), e))?;
    let fenced_ms = started.elapsed().as_millis() as u64;
    if !matches!(outcome, Ok(Ok(true))) {
        warn!(
            fenced_ms,
            "the destination has not acknowledged its promotion yet; waiting for it"
        );
        return Ok(Action::requeue(PROGRESS_EVERY));
    }
    let body = json!({"spec": {"migrationInfo": {"autoSwitch": {"enabled": true, "status": ResultStatus::Success}}}});
    patch_guarded(ctx, api, m, body).await?;
    info!(fenced_ms, "switched over to the destination");
    Ok(Action::await_change())
}
