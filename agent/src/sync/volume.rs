//! Volume sync: provision, export, expand and delete the AntstorVolumes scheduled to this
//! node.
//!
//! **Expected flow** (LiteIO §2.1–2.3, one pass does every step that is due; each write is
//! guarded by the object's resourceVersion):
//! 1. Deleting (`deletionTimestamp`): remove the export (when `spdk-tgt` or `spec.spdkTarget`
//!    is present) and drop `spdk-tgt`; delete the engine volume and drop `logic-volume` and
//!    the legacy `lvm` / `spdk-lvol`. The controller's `in-state` is never touched.
//! 2. Wait for the controller's `in-state` finalizer and `spec.targetNodeId == node`.
//! 3. Refuse bad objects with a permanent error (size below the minimum, a type this pool
//!    cannot serve).
//! 4. Add `logic-volume` **before** touching the engine. From then on the controller waits
//!    for this agent before it releases a deleted object, so an engine volume can never
//!    outlive its object, even when the agent is killed right after creating it.
//! 5. Provision when no engine volume is recorded (`spec.kernelLvol` / `spec.spdkLvol`):
//!    create the volume (or clone it from the snapshot named by
//!    `obnvmf/volume-source-snap-name/ns`; both idempotent, so a create the agent was killed
//!    after is found again), then record `spec.type`, `spec.kernelLvol` / `spec.spdkLvol` and
//!    `obnvmf/allocated-bytes` (only when the rounded size differs from `spec.sizeByte`).
//! 6. With the engine volume recorded it must exist: a missing one is reported and **never
//!    recreated** (that would hand out an empty disk as if it held data).
//! 7. Expansion (label `obnvmf/expansion-original-size`, or `sizeByte` above the recorded
//!    allocated size): resize, tell the exporter, update `allocated-bytes`, drop the label.
//! 8. Export when the volume is an SPDK lvol (except a member of a multi-disk volume that
//!    is assembled on this node, see [`assembled_locally`]) or its consumer runs on another
//!    node: the
//!    exporter re-asserts it on every pass (so exports come back after a restart and follow a
//!    change of host); `spec.spdkTarget` and `spdk-tgt` are written when they differ.
//!    The consumer's entry has no DH-HMAC-CHAP keys where `spec.hostAuth` and its Node's
//!    `liteio.io/nvme-host-auth` say so (read on every pass; a change of that annotation
//!    reconciles the volumes consumed there at once, see [`super::node_auth`]).
//!    A hot migration's destination (labels `migrate.obnvmf/migration-name` and
//!    `…/source-volume-name`) also admits the source node's host NQN, starts with its
//!    listener ANA-inaccessible and gets a second, optimized listener for the source
//!    node's copy (the pipe, port in `migrate.obnvmf/pipe-svc-id`). The ANA state follows
//!    `migrate.obnvmf/ana-state` when set (the switch-over writes it), and the state applied
//!    is acknowledged in `migrate.obnvmf/ana-applied`.
//! 9. `status.status = ready`, `status.msg` cleared.
//!
//! **Guarantees.** Idempotent: a second pass writes nothing. Every engine change notifies
//! the pool reporter. **Errors** are returned to the controller and, except conflicts, shown
//! in `status.msg` when it differs, with `status.permanent` when retrying cannot heal them
//! (step 3's refusals, an engine that cannot do it, an export this agent cannot make): those
//! wait for a change of the object or the pool, the others are retried with back-off.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::Resource as _;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, ResourceExt};
use liteio_api::host_auth::{self, HostAuthCapability, HostAuthPolicy};
use liteio_api::keys::{annotations, finalizers, labels};
use liteio_api::snapshot::SnapshotStatusName;
use liteio_api::{AntstorSnapshot, AntstorVolume, SpdkTarget, VolumeStatus, VolumeType, keys};
use serde_json::{Value, json};
use tracing::{debug, info, instrument, warn};

use super::names::{node_host_nqn, snapshot_engine_name, volume_engine_name};
use super::{
    annotation, describe, has_finalizer, label, object_key, patch_guarded, patch_status,
    remove_finalizers, with_finalizer,
};
use crate::context::Ctx;
use crate::crash::{self, CrashPoint};
use crate::engine::{EngineKind, LvLayout, VolumeInfo, VolumeOptions};
use crate::error::{AgentError, ErrorKind, Result};
use crate::exporter::{ExportRequest, PathState, UnexportRequest};
use crate::state::provision::{self, Pass, Step};

/// The `resource` label of this reconciler's errors (as `run_controller` is given).
pub(crate) const RESOURCE: &str = "antstorvolume";

/// The finalizers that mean "the engine volume exists" (current and legacy).
const LOGIC_FINALIZERS: [&str; 3] = [
    finalizers::LOGIC_VOLUME,
    finalizers::KERNEL_LVOL,
    finalizers::SPDK_LVOL,
];

/// The volume type this engine serves.
pub fn engine_volume_type(kind: EngineKind) -> VolumeType {
    match kind {
        EngineKind::SpdkLvs => VolumeType::SpdkLVol,
        _ => VolumeType::KernelLVol,
    }
}

/// Whether the volume needs an NVMe-oF export: for SPDK lvols always but when they are
/// [`assembled_locally`], otherwise when the consumer is known and runs on another node.
pub fn needs_export(vol: &AntstorVolume, kind: EngineKind) -> bool {
    if kind == EngineKind::SpdkLvs {
        return !assembled_locally(vol);
    }
    vol.spec
        .host_node
        .as_ref()
        .is_some_and(|h| !h.id.is_empty() && h.id != vol.spec.target_node_id)
}

/// Whether the volume is a member of a multi-disk volume of engine SpdkLVStore (label
/// `obnvmf/vol-group-name`, annotation `obnvmf/volume-type: SpdkLVol`) that is assembled on
/// its own node (`spec.hostNode` is `spec.targetNodeId`): the raid bdev of this node's SPDK
/// opens its lvol directly, without a network hop. It is not exported: an export's gate would
/// claim the lvol, and a raid cannot claim a bdev that is claimed already. (A KernelLVM
/// member is read by the host's kernel, which needs an export even on the same node.)
pub fn assembled_locally(vol: &AntstorVolume) -> bool {
    label(&vol.metadata, labels::VOL_GROUP_NAME).is_some()
        && annotation(&vol.metadata, annotations::VOLUME_TYPE)
            == Some(VolumeType::SpdkLVol.to_string().as_str())
        && vol
            .spec
            .host_node
            .as_ref()
            .is_some_and(|h| !h.id.is_empty() && h.id == vol.spec.target_node_id)
}

/// Whether the engine volume was created and recorded (`spec.kernelLvol` / `spec.spdkLvol`
/// with a name). Only then is a missing engine volume a lost one.
pub fn recorded(vol: &AntstorVolume) -> bool {
    vol.spec
        .kernel_lvol
        .as_ref()
        .is_some_and(|l| !l.name.is_empty())
        || vol
            .spec
            .spdk_lvol
            .as_ref()
            .is_some_and(|l| !l.name.is_empty())
}

/// The allocated size recorded on the volume (annotation), if any.
fn recorded_allocated(vol: &AntstorVolume) -> Option<u64> {
    annotation(&vol.metadata, annotations::ALLOCATED_BYTES).and_then(|v| v.trim().parse().ok())
}

/// Whether an expansion is due.
pub fn needs_expansion(vol: &AntstorVolume) -> bool {
    label(&vol.metadata, labels::EXPANSION_ORIGINAL_SIZE).is_some()
        || recorded_allocated(vol).is_some_and(|a| vol.spec.size_byte > a)
}

fn allocated_annotation(vol: &AntstorVolume, real: u64) -> Value {
    if real == vol.spec.size_byte {
        Value::Null
    } else {
        json!(real.to_string())
    }
}

fn api(ctx: &Ctx, vol: &AntstorVolume) -> Api<AntstorVolume> {
    Api::namespaced(
        ctx.client.clone(),
        &vol.namespace()
            .unwrap_or_else(|| keys::DEFAULT_NAMESPACE.to_string()),
    )
}

/// Writes `status.msg` and `status.permanent` (whether retrying can heal it, see
/// [`crate::error::Retry`]) when they differ (best effort: a failure is logged).
async fn set_message(ctx: &Ctx, vol: &AntstorVolume, msg: &str, permanent: bool) {
    if vol
        .status
        .as_ref()
        .is_some_and(|s| s.message == msg && s.permanent == permanent)
    {
        return;
    }
    let permanent = if permanent { json!(true) } else { Value::Null };
    let status = json!({"status": vol.phase(), "msg": msg, "permanent": permanent});
    if let Err(e) = patch_status(ctx, &api(ctx, vol), vol, status).await {
        ctx.metrics.reconcile_error(RESOURCE, e.kind().as_str());
        warn!(volume = %vol.name_any(), error = %e.chain(), "cannot write the volume's status message");
    }
}

/// Reconciles one AntstorVolume. See the module documentation for the flow, guarantees and
/// errors.
#[instrument(skip_all, fields(volume = %vol.name_any(), node = %ctx.node))]
pub async fn reconcile(vol: Arc<AntstorVolume>, ctx: Arc<Ctx>) -> Result<Action> {
    match reconcile_inner(&vol, &ctx).await {
        Ok(a) => Ok(a),
        Err(e) => {
            if !matches!(e.kind(), ErrorKind::Conflict | ErrorKind::NotFound)
                && vol.metadata.deletion_timestamp.is_none()
            {
                set_message(&ctx, &vol, &e.chain(), e.is_permanent()).await;
            }
            Err(e)
        }
    }
}

async fn reconcile_inner(vol: &AntstorVolume, ctx: &Ctx) -> Result<Action> {
    let key = object_key(vol);
    if ctx
        .own_writes
        .is_superseded(&key, vol.metadata.resource_version.as_deref())
    {
        debug!("a copy this agent superseded; waiting for its own last write");
        return Ok(Action::await_change());
    }
    if vol.metadata.deletion_timestamp.is_some() {
        return delete(vol, ctx).await;
    }
    if !has_finalizer(&vol.metadata, finalizers::IN_STATE) || vol.spec.target_node_id != ctx.node {
        ctx.provisioning.forget(&key);
        return Ok(Action::await_change());
    }
    if let Err(errs) = liteio_api::validate::volume(vol) {
        return Err(AgentError::InvalidObject {
            what: describe(vol),
            reason: errs.to_string(),
        });
    }
    let kind = ctx.engine.kind();
    let want = engine_volume_type(kind);
    if let Some(t) = vol.spec.type_
        && t != VolumeType::Flexible
        && t != want
    {
        return Err(AgentError::InvalidObject {
            what: describe(vol),
            reason: format!(
                "volume type {t} cannot be served by the {kind} pool {} on node {}",
                ctx.pool_name, ctx.node
            ),
        });
    }
    let api = api(ctx, vol);
    // Time the passes of a volume that is not ready yet (see `provision`).
    let mut pass = ctx
        .provisioning
        .begin(key.clone(), vol.phase() != VolumeStatus::Ready);
    let mut vol = vol.clone();
    // The versions this pass goes through (see `OwnWrites`).
    let mut rvs: Vec<String> = vol.metadata.resource_version.iter().cloned().collect();
    let mut wrote = |v: &AntstorVolume| rvs.extend(v.metadata.resource_version.iter().cloned());
    let ename = volume_engine_name(&vol);
    // The record of an engine volume created in this pass, when it goes with the export.
    let mut pending_record: Option<(Value, VolumeInfo)> = None;
    if !LOGIC_FINALIZERS
        .iter()
        .any(|f| has_finalizer(&vol.metadata, f))
    {
        let body = json!({"metadata": {
            "finalizers": with_finalizer(&vol.metadata, finalizers::LOGIC_VOLUME),
        }});
        vol = pass
            .time(Step::Api, patch_guarded(ctx, &api, &vol, body))
            .await?;
        wrote(&vol);
        crash::reached(CrashPoint::AfterFinalizer, &vol.name_any());
    }
    if !recorded(&vol) {
        let Some(info) = pass
            .time(Step::Engine, provision(ctx, &vol, &ename))
            .await?
        else {
            return Ok(Action::requeue(ctx.retry));
        };
        crash::reached(CrashPoint::AfterCreate, &vol.name_any());
        let with_export = needs_export(&vol, kind) && !needs_expansion(&vol);
        let record = record(ctx, &mut vol, &info, want);
        if with_export {
            // Written with the export's patch: one write fewer per volume. Until then this
            // pass sees the volume as recorded; a pass cut short before that write creates
            // (idempotent) and exports again.
            pending_record = Some((record, info));
        } else {
            vol = pass
                .time(Step::Api, patch_guarded(ctx, &api, &vol, record))
                .await?;
            wrote(&vol);
            crash::reached(CrashPoint::AfterRecord, &vol.name_any());
            ctx.pool_changed();
            info!(size = info.size_bytes, path = %info.path.display(), "volume provisioned");
        }
    } else {
        let n = ename.clone();
        match pass
            .time(
                Step::Engine,
                ctx.engine_call("find", &ename, move |e| e.device_path(&n)),
            )
            .await
        {
            Ok(_) => {}
            Err(AgentError::Engine { source, .. })
                if source.kind() == crate::engine::ErrorKind::NotFound =>
            {
                let msg = format!(
                    "volume {ename} is missing from pool {} on node {} although it was provisioned; not recreating it",
                    ctx.pool_name, ctx.node
                );
                warn!("{msg}");
                ctx.metrics.reconcile_error(
                    RESOURCE,
                    ErrorKind::Engine(crate::engine::ErrorKind::NotFound).as_str(),
                );
                // Only a repaired pool can heal it: no retry on a timer but the resync.
                set_message(ctx, &vol, &msg, true).await;
                ctx.warnings
                    .publish(&vol, "AntstorVolumeFailed", &msg)
                    .await;
                return Ok(Action::requeue(ctx.resync));
            }
            Err(e) => return Err(e),
        }
    }
    let mut real_size = recorded_allocated(&vol).unwrap_or(vol.spec.size_byte);
    if needs_expansion(&vol) {
        let (n, size) = (ename.clone(), vol.spec.size_byte);
        let info = ctx
            .engine_call("resize", &ename, move |e| e.resize_volume(&n, size))
            .await?;
        ctx.pool_changed();
        crash::reached(CrashPoint::AfterResize, &vol.name_any());
        if vol.spec.spdk_target.is_some() {
            let req = export_request(ctx, &vol, &info, Vec::new(), None).await;
            ctx.exporter
                .resize_export(&req)
                .await
                .map_err(|source| AgentError::Export {
                    op: "resize",
                    volume: vol.name_any(),
                    source,
                })?;
        }
        let body = json!({"metadata": {
            "labels": {labels::EXPANSION_ORIGINAL_SIZE: Value::Null},
            "annotations": {annotations::ALLOCATED_BYTES: allocated_annotation(&vol, info.size_bytes)},
        }});
        vol = patch_guarded(ctx, &api, &vol, body).await?;
        wrote(&vol);
        real_size = info.size_bytes;
        info!(size = info.size_bytes, "volume expanded");
    }
    let exported = needs_export(&vol, kind);
    if let Some(q) = vol.spec.qos.filter(|q| !q.is_unlimited())
        && !(exported && ctx.exporter.enforces_qos())
    {
        // Never a limit that looks applied and is not: say so on the volume.
        let msg = format!(
            "QoS limits ({}) are not enforced: only an SPDK export enforces them, and volume {} on pool {} is {}",
            q.summary(),
            vol.name_any(),
            ctx.pool_name,
            if exported {
                "exported by a target without SPDK"
            } else {
                "used on this node without an export"
            }
        );
        warn!("{msg}");
        set_message(ctx, &vol, &msg, true).await;
    }
    if exported {
        let record = pending_record.as_ref().map(|(r, _)| r);
        vol = ensure_export(ctx, &api, &vol, &ename, real_size, record, &mut pass).await?;
        wrote(&vol);
        if let Some((_, info)) = pending_record.take() {
            crash::reached(CrashPoint::AfterRecord, &vol.name_any());
            ctx.pool_changed();
            info!(size = info.size_bytes, path = %info.path.display(), "volume provisioned");
        }
    } else if is_exported(&vol) {
        vol = withdraw_export(ctx, &api, &vol).await?;
        wrote(&vol);
    }
    let st = vol.status.as_ref();
    if vol.phase() != VolumeStatus::Ready
        || st.is_some_and(|s| !s.message.is_empty() || s.permanent)
    {
        crash::reached(CrashPoint::BeforeReady, &vol.name_any());
        vol = pass
            .time(
                Step::Api,
                patch_status(
                    ctx,
                    &api,
                    &vol,
                    json!({"status": VolumeStatus::Ready, "msg": "", "permanent": null}),
                ),
            )
            .await?;
        wrote(&vol);
        match pass.finish() {
            Some(report) => {
                provision::log(&key, &report);
                ctx.metrics.provisioned(&report);
            }
            None => info!("volume ready"),
        }
    }
    ctx.own_writes.record(key, rvs);
    ctx.metrics.set_volume(&vol, &ename, real_size);
    Ok(Action::requeue(ctx.resync))
}

/// Creates (or clones) the engine volume. `None` = cannot yet (source snapshot not ready;
/// the message is on the object).
async fn provision(ctx: &Ctx, vol: &AntstorVolume, ename: &str) -> Result<Option<VolumeInfo>> {
    let size = vol.spec.size_byte;
    if let Some((snap_ns, snap_name)) = liteio_api::meta::source_snapshot(&vol.metadata) {
        let snaps: Api<AntstorSnapshot> = Api::namespaced(ctx.client.clone(), snap_ns);
        let what = format!("AntstorSnapshot {snap_ns}/{snap_name}");
        let snap = ctx
            .timed("get", what.clone(), snaps.get_opt(snap_name))
            .await?;
        let ready = snap.as_ref().is_some_and(|s| {
            has_finalizer(&s.metadata, finalizers::SNAPSHOT)
                && s.status
                    .as_ref()
                    .is_some_and(|st| st.status == SnapshotStatusName::Ready)
        });
        let Some(snap) = snap.filter(|_| ready) else {
            set_message(
                ctx,
                vol,
                &format!("waiting for the source snapshot {what} to be ready"),
                false,
            )
            .await;
            return Ok(None);
        };
        let sname = snapshot_engine_name(&snap);
        let (s, n) = (sname.clone(), ename.to_string());
        let mut info = ctx
            .engine_call("clone", ename, move |e| e.clone_from_snapshot(&s, &n))
            .await?;
        if info.size_bytes < size {
            let n = ename.to_string();
            info = ctx
                .engine_call("resize", ename, move |e| e.resize_volume(&n, size))
                .await?;
        }
        return Ok(Some(info));
    }
    let opts = VolumeOptions {
        thin: vol.spec.is_thin,
        layout: annotation(&vol.metadata, annotations::LV_LAYOUT).and_then(LvLayout::parse),
    };
    let n = ename.to_string();
    let info = ctx
        .engine_call("create", ename, move |e| {
            match e.create_volume(&n, size, &opts) {
                Err(err) if err.kind() == crate::engine::ErrorKind::AlreadyExistsDifferent => {
                    // Made at the old size before an expansion raised spec.sizeByte, and not
                    // recorded yet (it is not recorded, or we would not create it): grow it.
                    // Never shrink, never touch a snapshot or a volume of another kind.
                    let ours = e
                        .list_volumes()?
                        .into_iter()
                        .find(|v| v.name == n && !v.is_snapshot());
                    match ours {
                        Some(v) if v.size_bytes < size => e.resize_volume(&n, size),
                        _ => Err(err),
                    }
                }
                r => r,
            }
        })
        .await?;
    Ok(Some(info))
}

/// Records the engine volume `info` (type, engine volume, allocated size) on this pass's
/// copy of `vol`, and returns the same record as a merge patch.
fn record(ctx: &Ctx, vol: &mut AntstorVolume, info: &VolumeInfo, want: VolumeType) -> Value {
    vol.spec.type_ = Some(want);
    let lvol = match want {
        VolumeType::SpdkLVol => {
            let l = liteio_api::SpdkLvol {
                name: info.name.clone(),
                lvs_name: ctx.pool_name.clone(),
                thin: info.thin,
            };
            let body = json!({"spdkLvol": l});
            vol.spec.spdk_lvol = Some(l);
            body
        }
        _ => {
            let l = liteio_api::KernelLvol {
                name: info.name.clone(),
                dev_path: info.path.display().to_string(),
            };
            let body = json!({"kernelLvol": l});
            vol.spec.kernel_lvol = Some(l);
            body
        }
    };
    let allocated = allocated_annotation(vol, info.size_bytes);
    let notes = vol
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    match allocated.as_str() {
        Some(a) => notes.insert(annotations::ALLOCATED_BYTES.to_string(), a.to_string()),
        None => notes.remove(annotations::ALLOCATED_BYTES),
    };
    let mut spec = json!({"type": want});
    if let (Some(s), Some(l)) = (spec.as_object_mut(), lvol.as_object()) {
        s.extend(l.clone());
    }
    json!({
        "metadata": {"annotations": {annotations::ALLOCATED_BYTES: allocated}},
        "spec": spec,
    })
}

async fn allowed_hosts(ctx: &Ctx, vol: &AntstorVolume) -> Result<AllowedHosts> {
    let Some(host) = vol.spec.host_node.as_ref().filter(|h| !h.id.is_empty()) else {
        return Ok(AllowedHosts::default());
    };
    let consumer = node_host_nqn(ctx, &host.id).await?;
    let mut hosts = vec![consumer.clone()];
    // The consumer's entry follows the volume's policy and what its kernel can do. The
    // source node of a migration connects with SPDK's initiator, which always
    // authenticates: its entry always has the keys.
    let mut keyless = Vec::new();
    let mut capability = None;
    if ctx.exporter.authenticates() {
        let policy = HostAuthPolicy::of(vol);
        capability = host_capability(ctx, &host.id).await?;
        if host_auth::export_without_keys(
            policy,
            is_tls(vol),
            capability.as_ref().map(|c| c.dhchap),
        ) {
            keyless.push(consumer);
        }
    }
    if let Some(source) = migration_source_node(ctx, vol).await? {
        let pipe = node_host_nqn(ctx, &source).await?;
        // One entry per NQN: a pipe host that is also the consumer keeps the keys.
        keyless.retain(|h| *h != pipe);
        hosts.push(pipe);
    }
    hosts.dedup();
    Ok(AllowedHosts {
        hosts,
        keyless,
        consumer: host.id.clone(),
        capability,
    })
}

/// The hosts of a volume's export, and those of them admitted without keys.
#[derive(Debug, Default)]
struct AllowedHosts {
    hosts: Vec<String>,
    keyless: Vec<String>,
    /// The consumer's node, for messages.
    consumer: String,
    /// What its kernel can do, as its Node says (`None`: unknown).
    capability: Option<HostAuthCapability>,
}

/// Whether the volume is exported over TLS only.
fn is_tls(vol: &AntstorVolume) -> bool {
    annotation(&vol.metadata, annotations::NVMF_TLS) == Some("true")
}

/// What the kernel of `node` can do for NVMe/TCP authentication, from the annotations its
/// CSI node writes on the Node (`None`: no Node, or it says nothing).
async fn host_capability(ctx: &Ctx, node: &str) -> Result<Option<HostAuthCapability>> {
    // The Node watch's copy once it has listed the Nodes (it also reconciles the volumes of a
    // Node whose capability changes), else the Node itself.
    if let Some(known) = ctx.capabilities.get(node) {
        return Ok(known);
    }
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let found = ctx
        .timed("get", format!("Node {node}"), nodes.get_metadata_opt(node))
        .await?;
    Ok(found.and_then(|n| HostAuthCapability::from_annotations(n.metadata.annotations.as_ref())))
}

/// Tells that the volume is now served to `allowed.keyless` without authentication (log and
/// event: Warning under `preferred`, a downgrade; Normal under `none`, which asked for it).
async fn tell_keyless(ctx: &Ctx, vol: &AntstorVolume, allowed: &AllowedHosts) {
    let policy = HostAuthPolicy::of(vol);
    let kernel = allowed
        .capability
        .as_ref()
        .map(|c| c.kernel.as_str())
        .filter(|k| !k.is_empty())
        .unwrap_or("unknown");
    let note = match policy {
        HostAuthPolicy::None => format!(
            "volume {} is served to host {} (node {}) without authentication: its StorageClass sets {}: none",
            vol.name_any(),
            allowed.keyless.join(", "),
            allowed.consumer,
            keys::SC_PARAM_HOST_AUTH
        ),
        _ => format!(
            "volume {} is served to host {} (node {}) without authentication because its kernel {kernel} cannot authenticate (Node annotation {}), and its StorageClass sets {}: {policy}",
            vol.name_any(),
            allowed.keyless.join(", "),
            allowed.consumer,
            annotations::NODE_HOST_AUTH,
            keys::SC_PARAM_HOST_AUTH
        ),
    };
    warn!(hosts = %allowed.keyless.join(","), node = %allowed.consumer, policy = %policy, kernel, "{note}");
    let type_ = if policy == HostAuthPolicy::None {
        EventType::Normal
    } else {
        EventType::Warning
    };
    let recorder = Recorder::new(
        ctx.client.clone(),
        Reporter {
            controller: keys::managers::AGENT.into(),
            instance: Some(ctx.node.clone()),
        },
    );
    let ev = Event {
        type_,
        reason: host_auth::EVENT_SERVED_WITHOUT_AUTH.into(),
        note: Some(note),
        action: "Export".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, &vol.object_ref(&())).await {
        warn!(error = %e, "cannot publish the event that the volume is served without authentication");
    }
}

/// Whether `vol` is the destination of a hot migration that is not finished.
pub fn is_migration_destination(vol: &AntstorVolume) -> bool {
    label(&vol.metadata, labels::MIGRATE_MIGRATION_NAME).is_some()
        && label(&vol.metadata, labels::MIGRATE_SOURCE_VOLUME_NAME).is_some()
}

/// The ANA state the volume's export must show: `migrate.obnvmf/ana-state` when set, else
/// inaccessible for a migration destination (until the switch-over), optimized otherwise.
pub fn desired_path_state(vol: &AntstorVolume) -> PathState {
    annotation(&vol.metadata, annotations::MIGRATE_ANA_STATE)
        .and_then(PathState::parse)
        .unwrap_or(if is_migration_destination(vol) {
            PathState::Inaccessible
        } else {
            PathState::Optimized
        })
}

/// The limits the volume's export enforces: `spec.qos`, except on a migration destination
/// before its promotion. Its export then serves the source's copy and mirrored writes only,
/// which the source's own limits already hold to the volume's rate; limiting them again would
/// slow the copy to the volume's limit and, with the host writing at that limit, leave the
/// copy no share of it at all. The promotion (ANA optimized) applies them before the export
/// turns optimized, so the host's I/O never reaches the destination unlimited.
pub fn export_qos(vol: &AntstorVolume) -> liteio_api::qos::VolumeQos {
    if is_migration_destination(vol) && desired_path_state(vol) != PathState::Optimized {
        return Default::default();
    }
    vol.spec.qos.unwrap_or_default()
}

/// The node of the source volume of the migration `vol` is the destination of (the source
/// agent connects to the destination's export as a host); `None` when `vol` is none or the
/// source is gone.
async fn migration_source_node(ctx: &Ctx, vol: &AntstorVolume) -> Result<Option<String>> {
    if !is_migration_destination(vol) {
        return Ok(None);
    }
    let Some(source) = label(&vol.metadata, labels::MIGRATE_SOURCE_VOLUME_NAME) else {
        return Ok(None);
    };
    let found = ctx
        .timed(
            "get",
            format!("AntstorVolume {source}"),
            api(ctx, vol).get_opt(source),
        )
        .await?;
    Ok(found
        .map(|s| s.spec.target_node_id)
        .filter(|n| !n.is_empty() && n != &ctx.node))
}

async fn export_request(
    ctx: &Ctx,
    vol: &AntstorVolume,
    info: &VolumeInfo,
    hosts: Vec<String>,
    keys: Option<liteio_api::auth::VolumeKeys>,
) -> ExportRequest {
    let spdk = ctx.engine.kind() == EngineKind::SpdkLvs;
    ExportRequest {
        volume: vol.name_any(),
        uuid: vol.spec.uuid.clone(),
        device: (!spdk).then(|| info.path.clone()),
        lvol: if spdk {
            vol.spec.spdk_lvol.clone()
        } else {
            None
        },
        size_bytes: info.size_bytes,
        allowed_hosts: hosts,
        keyless_hosts: Vec::new(),
        preset: vol.spec.spdk_target.clone(),
        keys,
        path_state: desired_path_state(vol),
        qos: export_qos(vol),
        group_member: label(&vol.metadata, labels::VOL_GROUP_NAME).is_some(),
    }
}

async fn ensure_export(
    ctx: &Ctx,
    api: &Api<AntstorVolume>,
    vol: &AntstorVolume,
    ename: &str,
    size: u64,
    record: Option<&Value>,
    pass: &mut Pass<'_>,
) -> Result<AntstorVolume> {
    let n = ename.to_string();
    let path = pass
        .time(
            Step::Engine,
            ctx.engine_call("find", ename, move |e| e.device_path(&n)),
        )
        .await?;
    let allowed = pass.time(Step::Api, allowed_hosts(ctx, vol)).await?;
    let info = VolumeInfo {
        name: ename.to_string(),
        uuid: None,
        size_bytes: size,
        allocated_bytes: size,
        path,
        snapshot_of: None,
        layout: None,
        thin: vol.spec.is_thin,
    };
    let keys = if ctx.exporter.authenticates() {
        let tls = vol
            .annotations()
            .get(annotations::NVMF_TLS)
            .is_some_and(|v| v == "true");
        Some(
            pass.time(Step::Api, super::auth::volume_keys(ctx, vol, tls))
                .await?,
        )
    } else {
        None
    };
    let mut req = export_request(ctx, vol, &info, allowed.hosts.clone(), keys).await;
    req.keyless_hosts = allowed.keyless.clone();
    let target: SpdkTarget = pass
        .time(Step::Export, ctx.exporter.ensure_export(&req))
        .await
        .map_err(|source| AgentError::Export {
            op: "create",
            volume: vol.name_any(),
            source,
        })?;
    // A migration destination's pipe listener (removed once the migration is over), and the
    // ANA state applied, for the source node's agent to see.
    let mut notes = serde_json::Map::new();
    let recorded_pipe = annotation(&vol.metadata, annotations::MIGRATE_PIPE_SVC_ID);
    let want_pipe = is_migration_destination(vol);
    if want_pipe || recorded_pipe.is_some() {
        let pipe = pass
            .time(Step::Export, ctx.exporter.ensure_pipe(&req, want_pipe))
            .await
            .map_err(|source| AgentError::Export {
                op: "create the migration pipe listener of",
                volume: vol.name_any(),
                source,
            })?;
        let pipe = pipe.map(|p| p.to_string());
        if pipe.as_deref() != recorded_pipe {
            notes.insert(annotations::MIGRATE_PIPE_SVC_ID.into(), json!(pipe));
        }
    }
    // (A promotion only: a live source is demoted by the migration sync, not here.)
    if let Some(want) = annotation(&vol.metadata, annotations::MIGRATE_ANA_STATE)
        && req.path_state == PathState::Optimized
        && annotation(&vol.metadata, annotations::MIGRATE_ANA_APPLIED) != Some(want)
    {
        notes.insert(
            annotations::MIGRATE_ANA_APPLIED.into(),
            json!(req.path_state.as_str()),
        );
    }
    // Who the export admits without keys, for the CSI node (which waits for its host here
    // before it connects without keys) and for people.
    let recorded: Vec<String> = host_auth::hosts_without_auth(vol);
    if recorded != req.keyless_hosts {
        notes.insert(
            annotations::HOSTS_WITHOUT_AUTH.into(),
            if req.keyless_hosts.is_empty() {
                Value::Null
            } else {
                json!(req.keyless_hosts.join(","))
            },
        );
    }
    // Whose host NQN the export admits now, for ControllerPublishVolume and NodeStageVolume
    // (which wait for it after the consumer moved to another node).
    let exported_to = Some(allowed.consumer.as_str()).filter(|c| !c.is_empty());
    if annotation(&vol.metadata, annotations::EXPORTED_TO) != exported_to {
        notes.insert(annotations::EXPORTED_TO.into(), json!(exported_to));
    }
    // The limits in force on the export, for `kubectl liteio volumes` and the CSI
    // controller to compare with `spec.qos` (absent: none).
    let enforced = ctx.exporter.enforces_qos() && !req.qos.is_unlimited();
    ctx.metrics.set_volume_qos(
        &vol.name_any(),
        &vol.spec.uuid,
        ename,
        if enforced {
            req.qos
        } else {
            Default::default()
        },
    );
    let in_force = enforced.then(|| req.qos.to_annotation());
    if annotation(&vol.metadata, annotations::QOS_IN_FORCE) != in_force.as_deref() {
        notes.insert(annotations::QOS_IN_FORCE.into(), json!(in_force));
    }
    // Rotated keys are in the subsystem now: acknowledge the rotation.
    if req.keys.is_some()
        && let Some(at) = annotation(&vol.metadata, annotations::KEYS_ROTATED_AT)
        && annotation(&vol.metadata, annotations::KEYS_APPLIED_AT) != Some(at)
    {
        notes.insert(annotations::KEYS_APPLIED_AT.into(), json!(at));
        info!(rotated_at = at, "rotated keys applied to the export");
    }
    if vol.spec.spdk_target.as_ref() == Some(&target)
        && has_finalizer(&vol.metadata, finalizers::SPDK_TARGET)
        && notes.is_empty()
        && record.is_none()
    {
        return Ok(vol.clone());
    }
    crash::reached(CrashPoint::AfterExport, &vol.name_any());
    let mut spec = serde_json::Map::new();
    if let Some(r) = record {
        if let Some(a) = r["metadata"]["annotations"].as_object() {
            notes.extend(a.clone());
        }
        if let Some(s) = r["spec"].as_object() {
            spec.extend(s.clone());
        }
    }
    spec.insert("spdkTarget".into(), json!(target));
    let body = json!({
        "metadata": {
            "finalizers": with_finalizer(&vol.metadata, finalizers::SPDK_TARGET),
            "annotations": notes,
        },
        "spec": spec,
    });
    let v = pass
        .time(Step::Api, patch_guarded(ctx, api, vol, body))
        .await?;
    if recorded != req.keyless_hosts {
        if req.keyless_hosts.is_empty() {
            info!(hosts = %recorded.join(","), "hosts that were admitted without keys now authenticate");
        } else {
            tell_keyless(ctx, &v, &allowed).await;
        }
    }
    info!(nqn = %target.subsys_nqn, port = %target.svc_id, "volume exported");
    Ok(v)
}

/// Whether the volume has (or may have) an export: the finalizer or a recorded target.
fn is_exported(vol: &AntstorVolume) -> bool {
    has_finalizer(&vol.metadata, finalizers::SPDK_TARGET) || vol.spec.spdk_target.is_some()
}

/// Removes the volume's export (idempotent).
async fn unexport(ctx: &Ctx, vol: &AntstorVolume) -> Result<()> {
    let req = UnexportRequest {
        volume: vol.name_any(),
        uuid: vol.spec.uuid.clone(),
        target: vol.spec.spdk_target.clone(),
    };
    ctx.exporter
        .remove_export(&req)
        .await
        .map_err(|source| AgentError::Export {
            op: "remove",
            volume: vol.name_any(),
            source,
        })
}

/// The consumer moved to this node (an LVM or file volume is then used directly): remove
/// the export, so that the previous remote host loses access, then the `spdk-tgt` finalizer
/// and `spec.spdkTarget`. Moving away again exports it anew.
async fn withdraw_export(
    ctx: &Ctx,
    api: &Api<AntstorVolume>,
    vol: &AntstorVolume,
) -> Result<AntstorVolume> {
    unexport(ctx, vol).await?;
    let keep: Vec<&String> = vol
        .finalizers()
        .iter()
        .filter(|f| f.as_str() != finalizers::SPDK_TARGET)
        .collect();
    let body = json!({
        "metadata": {"finalizers": keep},
        "spec": {"spdkTarget": Value::Null},
    });
    let v = patch_guarded(ctx, api, vol, body).await?;
    if assembled_locally(&v) {
        info!("export withdrawn: this node's multi-disk assembly opens the volume directly");
    } else {
        info!("export withdrawn: the consumer is on this node");
    }
    Ok(v)
}

/// Whether another object uses `vol`'s Secret: the data control of a group member (see
/// below), or the other end of a hot migration (both ends of a migration
/// export with the volume's one Secret): a cancelled destination leaves it to its source, a
/// retired source to the destination that took over (labelled as the destination, or, once
/// the controller finished the migration, with the volume's uuid).
async fn shares_keys(ctx: &Ctx, vol: &AntstorVolume) -> Result<bool> {
    // A member of a multi-disk or replicated volume uses the PV's Secret, which its data
    // control owns: a replica replaced while the volume lives must leave it.
    if label(&vol.metadata, labels::VOL_GROUP_NAME).is_some() {
        return Ok(true);
    }
    let api = api(ctx, vol);
    if is_migration_destination(vol)
        && let Some(source) = label(&vol.metadata, labels::MIGRATE_SOURCE_VOLUME_NAME)
        && ctx
            .timed(
                "get",
                format!("AntstorVolume {source}"),
                api.get_opt(source),
            )
            .await?
            .is_some()
    {
        return Ok(true);
    }
    let lp = kube::api::ListParams::default().labels(&format!(
        "{}={}",
        labels::MIGRATE_SOURCE_VOLUME_NAME,
        vol.name_any()
    ));
    let dests = ctx
        .timed(
            "list",
            "AntstorVolumes migrated from it",
            api.list_metadata(&lp),
        )
        .await?;
    if dests
        .items
        .iter()
        .any(|d| d.metadata.deletion_timestamp.is_none())
    {
        return Ok(true);
    }
    // A finished migration's destination has lost those labels and carries the volume's
    // uuid label instead: the controller may get there before this source is gone.
    let lp =
        kube::api::ListParams::default().labels(&format!("{}={}", labels::VOL_UUID, vol.spec.uuid));
    let same = ctx
        .timed(
            "list",
            "AntstorVolumes with its uuid",
            api.list_metadata(&lp),
        )
        .await?;
    Ok(same.items.iter().any(|o| {
        o.metadata.name.as_deref() != Some(vol.name_any().as_str())
            && o.metadata.deletion_timestamp.is_none()
    }))
}

async fn delete(vol: &AntstorVolume, ctx: &Ctx) -> Result<Action> {
    ctx.provisioning.forget(&object_key(vol));
    let api = api(ctx, vol);
    let ours = finalizers::AGENT_VOLUME
        .iter()
        .any(|f| has_finalizer(&vol.metadata, f));
    // The volume's keys go first (idempotent; also when a crash came between making the
    // Secret and the export).
    if ours && ctx.exporter.authenticates() && !shares_keys(ctx, vol).await? {
        super::auth::delete_keys(ctx, vol).await?;
    }
    // The export's and the engine's finalizers go in one write once both are gone: each
    // step is idempotent, so a pass cut short between them redoes both.
    let mut done: Vec<&str> = Vec::new();
    if ours && is_exported(vol) {
        unexport(ctx, vol).await?;
        crash::reached(CrashPoint::AfterUnexport, &vol.name_any());
        done.push(finalizers::SPDK_TARGET);
    }
    let logic = LOGIC_FINALIZERS
        .iter()
        .any(|f| has_finalizer(&vol.metadata, f));
    if logic {
        let ename = volume_engine_name(vol);
        let n = ename.clone();
        ctx.engine_call("delete", &ename, move |e| e.delete_volume(&n))
            .await?;
        crash::reached(CrashPoint::AfterDelete, &vol.name_any());
        ctx.pool_changed();
        ctx.metrics.remove_volume(&vol.name_any(), &vol.spec.uuid);
        done.extend(LOGIC_FINALIZERS);
    }
    if !done.is_empty() {
        remove_finalizers(ctx, &api, vol, &done).await?;
    }
    if logic {
        info!(volume = %describe(vol), "volume deleted from the pool");
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use liteio_api::qos::VolumeQos;

    use super::*;

    fn limited(dest: bool, ana: Option<&str>) -> AntstorVolume {
        let mut v = AntstorVolume::new(
            "pvc-q",
            liteio_api::AntstorVolumeSpec {
                uuid: "u-q".into(),
                qos: Some(VolumeQos {
                    iops: 2000,
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        if dest {
            v.metadata.labels = Some(BTreeMap::from([
                (labels::MIGRATE_MIGRATION_NAME.to_string(), "mig-1".into()),
                (
                    labels::MIGRATE_SOURCE_VOLUME_NAME.to_string(),
                    "pvc-src".into(),
                ),
            ]));
        }
        if let Some(a) = ana {
            v.metadata.annotations = Some(BTreeMap::from([(
                annotations::MIGRATE_ANA_STATE.to_string(),
                a.to_string(),
            )]));
        }
        v
    }

    fn member(annotation: &str, host: &str) -> AntstorVolume {
        let mut v = AntstorVolume::new(
            "pvc-g-0123456789",
            liteio_api::AntstorVolumeSpec {
                uuid: "u-m".into(),
                target_node_id: "n1".into(),
                host_node: Some(liteio_api::NodeInfo {
                    id: host.into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        v.metadata.labels = Some(BTreeMap::from([(
            labels::VOL_GROUP_NAME.to_string(),
            "pvc-g".to_string(),
        )]));
        v.metadata.annotations = Some(BTreeMap::from([(
            annotations::VOLUME_TYPE.to_string(),
            annotation.to_string(),
        )]));
        v
    }

    #[test]
    fn an_spdk_member_assembled_on_its_own_node_is_not_exported() {
        // Assembled here: the raid opens the lvol.
        assert!(assembled_locally(&member("SpdkLVol", "n1")));
        assert!(!needs_export(
            &member("SpdkLVol", "n1"),
            EngineKind::SpdkLvs
        ));
        // Assembled on another node: exported to it.
        assert!(needs_export(&member("SpdkLVol", "n2"), EngineKind::SpdkLvs));
        // Not yet told where it is assembled: exported (to nobody) meanwhile.
        assert!(needs_export(&member("SpdkLVol", ""), EngineKind::SpdkLvs));
        // A KernelLVM member read by the host's kernel on the same node needs its export.
        assert!(!assembled_locally(&member("Flexible", "n1")));
        assert!(needs_export(&member("Flexible", "n1"), EngineKind::SpdkLvs));
        // A plain SPDK volume consumed on its own node is exported as ever.
        let mut plain = member("SpdkLVol", "n1");
        plain.metadata.labels = None;
        assert!(needs_export(&plain, EngineKind::SpdkLvs));
    }

    #[test]
    fn a_destination_enforces_its_limits_from_its_promotion_on() {
        let spec = VolumeQos {
            iops: 2000,
            ..Default::default()
        };
        // A plain volume, and a source being demoted, enforce their limits.
        assert_eq!(export_qos(&limited(false, None)), spec);
        assert_eq!(export_qos(&limited(false, Some("inaccessible"))), spec);
        // A destination: unlimited while it takes the copy, limited once promoted.
        assert_eq!(export_qos(&limited(true, None)), VolumeQos::default());
        assert_eq!(
            export_qos(&limited(true, Some("inaccessible"))),
            VolumeQos::default()
        );
        assert_eq!(export_qos(&limited(true, Some("optimized"))), spec);
    }
}
