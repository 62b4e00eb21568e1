//! The AntstorVolumeGroup and AntstorDataControl reconcilers: multi-disk volumes (reference
//! §2.6), the controller's half. Level-triggered and idempotent like the volume reconciler;
//! a controller restart between any two steps repeats nothing that was done and loses
//! nothing that was not.
//!
//! **Volume group** ([`reconcile_group`]):
//! 1. Deleted: waits until no data control uses the group (the assembly is torn down first),
//!    deletes the members, waits until they are gone, then drops the `volumes` finalizer.
//! 2. Invalid (`validate::volume_group`): the reason in `status.message`, nothing else.
//! 3. Not fully placed: [`crate::group_scheduler::plan`] under the state lock, the new
//!    members charged to their pools in the state at once (so no volume scheduled meanwhile
//!    takes their space), then recorded in `spec.volumes` with the finalizer in one patch
//!    guarded by the resourceVersion. Nothing fits: the reason in `status.message` (and a
//!    Warning event); the group is tried again when a pool changes.
//! 4. Creates each recorded member that does not exist (its node preset, label
//!    `obnvmf/vol-group-name`, owned by the group).
//! 5. Mirrors each member's status and export into `status.volumeStatus`; `ready` when
//!    every member is.
//!
//! A replicated volume's group (its data control is raid1) also has its lost replicas
//! replaced between 3 and 4 ([`super::replicated::replace_members`]).
//!
//! **Data control** ([`reconcile_data_control`]):
//! 1. Deleted: nothing here; the agent that assembled it drops its finalizer after the
//!    teardown, the CSI driver deletes the group with it.
//! 2. Checks the engine and the raid level (linear, raid0 and raid1; raid0 and raid1 need
//!    Symmetric groups, raid1 the SpdkLVStore engine; raid5 and raid6 are refused with a
//!    message, never ignored as LiteIO did).
//! 3. Waits for its groups to be ready (a replicated volume only before its first
//!    assembly: afterwards a replacement being created must not hold back the volume that
//!    serves). A replicated volume whose assembling node's pool is down moves its assembly
//!    to another online replica's node, the fence first
//!    ([`super::replicated::move_assembly`]).
//! 4. Chooses where the assembly runs (`spec.targetNodeId`, label `obnvmf/target-node-id`):
//!    KernelLVM on the host (`spec.hostNode`), SpdkLVStore on the node of its largest
//!    member (most of its data then stays local).
//! 5. Pushes that node into every member's `spec.hostNode`, so each member's agent admits
//!    only it.
//! 6. KernelLVM: `ready` once every member is ready and admits the host (the CSI node
//!    assembles the LV when it stages the volume). SpdkLVStore: the assembling agent
//!    writes `status.spdkTarget` and `ready`.
//! 7. A replicated volume: `status.health`, the `Degraded` condition, events and metrics
//!    ([`super::replicated::report_health`]).

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use liteio_api::common::{NodeInfo, PoolMode, VolumeStatus};
use liteio_api::datacontrol::RaidLevel;
use liteio_api::group::{AntstorVolumeGroup, VolumeMeta, VolumeTargetStatus};
use liteio_api::keys::{finalizers, labels};
use liteio_api::{AntstorDataControl, AntstorVolume, validate};
use serde_json::json;
use tracing::{info, instrument};

use super::members::{
    create_member, data_control_key, group_status, is_ready, member_key, member_type, members,
    unrecorded_members,
};
use super::{Action, Context, replicated};
use crate::error::{Error, Result};
use crate::group_scheduler;
use crate::state::ObjectKey;

/// Reconciles one AntstorVolumeGroup (see the module documentation).
#[instrument(skip(ctx), fields(group = %key))]
pub async fn reconcile_group(ctx: &Context, key: &ObjectKey) -> Result<Action> {
    let Some(g) = ctx.group(key) else {
        return Ok(Action::Done);
    };
    if g.metadata.deletion_timestamp.is_some() {
        return delete_group(ctx, key, &g).await;
    }
    if let Err(e) = validate::volume_group(&g) {
        let msg = format!("invalid volume group: {e}");
        ctx.warn_once(g.as_ref(), "InvalidVolumeGroup", msg.clone())
            .await;
        group_status(ctx, &g, VolumeStatus::Creating, &msg, None).await?;
        return Ok(Action::Done);
    }
    let g = if g.fully_placed() {
        g
    } else {
        match place(ctx, key, &g).await? {
            Some(g) => g,
            None => return Ok(Action::Done),
        }
    };
    let g = ensure_finalizer(ctx, key, g).await?;
    // A replicated volume's lost replicas are replaced.
    let mut recheck = None;
    let dc_key = data_control_key(&g);
    let g = match replicated::data_control_of(ctx, &g) {
        Some(dc) => match replicated::replace_members(ctx, key, g, &dc).await? {
            replicated::Step::Continue(g, after) => {
                recheck = after;
                g
            }
            replicated::Step::Stop(after) => {
                ctx.enqueue_data_control(dc_key);
                return Ok(Action::RequeueAfter(after));
            }
        },
        None => g,
    };
    // The members: created where missing, their state mirrored.
    let api: Api<AntstorVolume> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let mut statuses = Vec::new();
    let mut all_ready = true;
    let pv = liteio_api::meta::label(&g.metadata, labels::PV_NAME)
        .map_or_else(|| g.name_any(), str::to_string);
    for m in &g.spec.volumes {
        ctx.metrics
            .group_members
            .with_label_values(&[&pv, &g.name_any(), &m.vol_id.name, &m.target_node_name])
            .set(1);
    }
    for (m, v) in members(ctx, &g) {
        match v {
            Some(v) => {
                all_ready &= is_ready(&v);
                statuses.push(VolumeTargetStatus {
                    uuid: m.vol_id.uuid.clone(),
                    spdk_target: v.spec.spdk_target.clone(),
                    status: v.status.as_ref().map(|s| s.status),
                    message: v
                        .status
                        .as_ref()
                        .map(|s| s.message.clone())
                        .unwrap_or_default(),
                });
            }
            None => {
                all_ready = false;
                create_member(ctx, &api, &g, &m, member_type(&g), "member volume created").await?;
                statuses.push(VolumeTargetStatus {
                    uuid: m.vol_id.uuid.clone(),
                    status: Some(VolumeStatus::Creating),
                    ..Default::default()
                });
            }
        }
    }
    let status = if all_ready && g.fully_placed() {
        VolumeStatus::Ready
    } else {
        VolumeStatus::Creating
    };
    group_status(ctx, &g, status, "", Some(statuses)).await?;
    // The data control waits for its groups.
    ctx.enqueue_data_control(data_control_key(&g));
    Ok(recheck.map_or(Action::Done, Action::RequeueAfter))
}

/// Places the members the group still needs; `None` when they do not fit (the reason is
/// on the group).
async fn place(
    ctx: &Context,
    key: &ObjectKey,
    g: &Arc<AntstorVolumeGroup>,
) -> Result<Option<Arc<AntstorVolumeGroup>>> {
    let mtype = member_type(g);
    // Decided and charged under one lock: no other placement sees this space as free.
    let planned = {
        let mut state = ctx.state();
        let res = group_scheduler::plan(&ctx.scheduler, &state, g, mtype, || {
            uuid::Uuid::new_v4().to_string()
        });
        if let Ok(new) = &res {
            for m in new {
                state.upsert_volume(Arc::new(group_scheduler::member_volume(g, m, mtype)));
            }
        }
        res
    };
    let new = match planned {
        Ok(new) => new,
        Err(e) => {
            let msg = e.to_string();
            info!(reason = %msg, "volume group not placed");
            ctx.warn_once(g.as_ref(), "VolumeGroupNotPlaced", msg.clone())
                .await;
            group_status(ctx, g, VolumeStatus::Creating, &msg, None).await?;
            return Ok(None);
        }
    };
    let mut volumes: Vec<VolumeMeta> = g.placed().cloned().collect();
    volumes.extend(new.iter().cloned());
    let mut fins = g.metadata.finalizers.clone().unwrap_or_default();
    if !fins.iter().any(|f| f == finalizers::VOLUMES) {
        fins.push(finalizers::VOLUMES.to_string());
    }
    let body = json!({
        "metadata": {
            "resourceVersion": g.metadata.resource_version,
            "finalizers": fins,
        },
        "spec": { "volumes": volumes },
    });
    match ctx
        .patch::<AntstorVolumeGroup>(&key.namespace, &key.name, &body, false)
        .await
    {
        Ok(out) => {
            info!(
                members = new.len(),
                nodes = ?new.iter().map(|m| m.target_node_name.as_str()).collect::<Vec<_>>(),
                "volume group placed"
            );
            ctx.clear_warning(key);
            let out = Arc::new(out);
            ctx.upsert_group(Arc::clone(&out));
            Ok(Some(out))
        }
        Err(e) => {
            // Not recorded: give the space back.
            let mut state = ctx.state();
            for m in &new {
                state.remove_volume(&member_key(m, &key.namespace));
            }
            Err(e)
        }
    }
}

async fn ensure_finalizer(
    ctx: &Context,
    key: &ObjectKey,
    g: Arc<AntstorVolumeGroup>,
) -> Result<Arc<AntstorVolumeGroup>> {
    if g.finalizers().iter().any(|f| f == finalizers::VOLUMES) {
        return Ok(g);
    }
    let mut fins = g.metadata.finalizers.clone().unwrap_or_default();
    fins.push(finalizers::VOLUMES.to_string());
    let body = json!({
        "metadata": { "resourceVersion": g.metadata.resource_version, "finalizers": fins }
    });
    let out: AntstorVolumeGroup = ctx.patch(&key.namespace, &key.name, &body, false).await?;
    let out = Arc::new(out);
    ctx.upsert_group(Arc::clone(&out));
    Ok(out)
}

async fn delete_group(
    ctx: &Context,
    key: &ObjectKey,
    g: &Arc<AntstorVolumeGroup>,
) -> Result<Action> {
    if !g.finalizers().iter().any(|f| f == finalizers::VOLUMES) {
        return Ok(Action::Done);
    }
    // The assembly goes first: its data control's deletion queues this group again.
    let dc = data_control_key(g);
    if ctx.data_control(&dc).is_some() {
        group_status(
            ctx,
            g,
            g.status
                .as_ref()
                .and_then(|s| s.status)
                .unwrap_or(VolumeStatus::Creating),
            &format!("deleting: waiting for AntstorDataControl {dc} to go first"),
            None,
        )
        .await?;
        return Ok(Action::Done);
    }
    let api: Api<AntstorVolume> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let mut left = 0;
    // The recorded members, and those labelled with the group but not recorded (a
    // replicated volume's replaced member, a replacement not swapped in yet).
    let mut doomed: Vec<Arc<AntstorVolume>> =
        members(ctx, g).into_iter().filter_map(|(_, v)| v).collect();
    doomed.extend(unrecorded_members(ctx, g));
    for v in doomed {
        let name = v.name_any();
        left += 1;
        if v.metadata.deletion_timestamp.is_some() {
            continue;
        }
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => info!(member = %name, "member volume deletion requested"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(Error::kube(
                    format!("delete member AntstorVolume {name}"),
                    e,
                ));
            }
        }
    }
    if left > 0 {
        // Each member's deletion event queues the group again.
        return Ok(Action::Done);
    }
    let keep: Vec<String> = g
        .finalizers()
        .iter()
        .filter(|f| f.as_str() != finalizers::VOLUMES)
        .cloned()
        .collect();
    let body = json!({
        "metadata": { "resourceVersion": g.metadata.resource_version, "finalizers": keep }
    });
    let _: AntstorVolumeGroup = ctx.patch(&key.namespace, &key.name, &body, false).await?;
    let pv = liteio_api::meta::label(&g.metadata, labels::PV_NAME)
        .map_or_else(|| g.name_any(), str::to_string);
    for m in &g.spec.volumes {
        let _ = ctx.metrics.group_members.remove_label_values(&[
            &pv,
            &g.name_any(),
            &m.vol_id.name,
            &m.target_node_name,
        ]);
    }
    info!("volume group released: every member is gone");
    Ok(Action::Done)
}

async fn dc_status(
    ctx: &Context,
    dc: &AntstorDataControl,
    status: VolumeStatus,
    message: &str,
) -> Result<()> {
    let cur = dc.status.clone().unwrap_or_default();
    if cur.status == Some(status) && cur.message == message {
        return Ok(());
    }
    let key = ObjectKey::of(dc);
    let out: AntstorDataControl = ctx
        .patch(
            &key.namespace,
            &key.name,
            &json!({ "status": { "status": status, "message": message } }),
            true,
        )
        .await?;
    ctx.upsert_data_control(Arc::new(out));
    Ok(())
}

/// Why a data control cannot be assembled as it is, if it cannot (engine, raid level,
/// symmetry of its groups).
pub fn check_data_control(
    dc: &AntstorDataControl,
    groups: &[Arc<AntstorVolumeGroup>],
) -> std::result::Result<(), String> {
    if dc.spec.uuid.is_empty() {
        return Err("invalid data control: spec.uuid: is required".into());
    }
    if dc.spec.volume_groups.is_empty() {
        return Err("invalid data control: spec.volumeGroups: names no volume group".into());
    }
    match dc.spec.raid.level {
        RaidLevel::Linear => Ok(()),
        RaidLevel::Raid0 => match groups
            .iter()
            .find(|g| !g.spec.desired_volume_spec.size_symmetry.is_symmetric())
        {
            Some(g) => Err(format!(
                "invalid data control: spec.raid.level: raid0 stripes over equal members; AntstorVolumeGroup {} is not Symmetric",
                g.name_any()
            )),
            None => Ok(()),
        },
        RaidLevel::Raid1 if dc.spec.engine_type != PoolMode::SpdkLVStore => Err(format!(
            "invalid data control: spec.raid.level: raid1 (a replicated volume) is assembled in SPDK only; spec.engineType is {}",
            dc.spec.engine_type
        )),
        RaidLevel::Raid1 => match groups
            .iter()
            .find(|g| !g.spec.desired_volume_spec.size_symmetry.is_symmetric())
        {
            Some(g) => Err(format!(
                "invalid data control: spec.raid.level: raid1 mirrors whole copies; AntstorVolumeGroup {} is not Symmetric",
                g.name_any()
            )),
            None => Ok(()),
        },
        other => Err(format!(
            "invalid data control: spec.raid.level: {} is not supported (linear, raid0 and raid1 are); LiteIO stored it and built a linear volume instead",
            serde_json::to_value(other)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        )),
    }
}

/// The node that assembles `dc`: KernelLVM its host, SpdkLVStore the node of its largest
/// member (then by name); `None` while unknown.
pub fn assembly_node(
    dc: &AntstorDataControl,
    groups: &[Arc<AntstorVolumeGroup>],
) -> Option<String> {
    if !dc.spec.target_node_id.is_empty() {
        return Some(dc.spec.target_node_id.clone());
    }
    match dc.spec.engine_type {
        PoolMode::KernelLVM => Some(dc.spec.host_node.id.clone()).filter(|n| !n.is_empty()),
        PoolMode::SpdkLVStore => groups
            .iter()
            .flat_map(|g| g.placed())
            .max_by(|a, b| {
                a.size
                    .cmp(&b.size)
                    .then(b.target_node_name.cmp(&a.target_node_name))
            })
            .map(|m| m.target_node_name.clone()),
    }
}

/// Reconciles one AntstorDataControl (see the module documentation).
#[instrument(skip(ctx), fields(data_control = %key))]
pub async fn reconcile_data_control(ctx: &Context, key: &ObjectKey) -> Result<Action> {
    let Some(dc) = ctx.data_control(key) else {
        replicated::forget(ctx, key);
        return Ok(Action::Done);
    };
    if dc.metadata.deletion_timestamp.is_some() {
        replicated::forget(ctx, key);
        return Ok(Action::Done);
    }
    let mut groups = Vec::new();
    for id in &dc.spec.volume_groups {
        let ns = if id.namespace.is_empty() {
            key.namespace.clone()
        } else {
            id.namespace.clone()
        };
        match ctx.group(&ObjectKey::new(ns, id.name.clone())) {
            Some(g) => groups.push(g),
            None => {
                dc_status(
                    ctx,
                    &dc,
                    VolumeStatus::Creating,
                    &format!("waiting for AntstorVolumeGroup {}", id.name),
                )
                .await?;
                return Ok(Action::Done);
            }
        }
    }
    if let Err(msg) = check_data_control(&dc, &groups) {
        ctx.warn_once(dc.as_ref(), "InvalidDataControl", msg.clone())
            .await;
        dc_status(ctx, &dc, VolumeStatus::Creating, &msg).await?;
        return Ok(Action::Done);
    }
    // A replicated volume that serves is not held back by a replacement being created.
    let serving = dc.is_replicated() && replicated::assembled_once(&dc);
    if serving && let Some(g) = groups.iter().find(|g| !g.fully_placed()) {
        dc_status(
            ctx,
            &dc,
            dc.status
                .as_ref()
                .and_then(|s| s.status)
                .unwrap_or(VolumeStatus::Creating),
            &format!(
                "waiting for AntstorVolumeGroup {} to be placed",
                g.name_any()
            ),
        )
        .await?;
        return Ok(Action::Done);
    }
    if let Some(g) = groups.iter().find(|g| {
        !serving
            && g.status
                .as_ref()
                .and_then(|s| s.status)
                .is_none_or(|s| s != VolumeStatus::Ready)
    }) {
        let why = g
            .status
            .as_ref()
            .map(|s| s.message.clone())
            .filter(|m| !m.is_empty())
            .map_or_else(String::new, |m| format!(": {m}"));
        dc_status(
            ctx,
            &dc,
            VolumeStatus::Creating,
            &format!(
                "waiting for AntstorVolumeGroup {} to be ready{why}",
                g.name_any()
            ),
        )
        .await?;
        return Ok(Action::Done);
    }
    let dc = if dc.is_replicated() {
        let dc = replicated::move_assembly(ctx, key, dc, &groups).await?;
        replicated::finish_move(ctx, key, dc).await?
    } else {
        dc
    };
    let Some(node) = assembly_node(&dc, &groups) else {
        dc_status(
            ctx,
            &dc,
            VolumeStatus::Creating,
            "waiting for a host node (spec.hostNode): the KernelLVM assembly runs on it",
        )
        .await?;
        return Ok(Action::Done);
    };
    let dc = if dc.spec.target_node_id != node
        || liteio_api::meta::label(&dc.metadata, labels::TARGET_NODE_ID) != Some(node.as_str())
    {
        let body = json!({
            "metadata": {
                "resourceVersion": dc.metadata.resource_version,
                "labels": { labels::TARGET_NODE_ID: node },
            },
            "spec": { "targetNodeId": node },
        });
        let out: AntstorDataControl = ctx.patch(&key.namespace, &key.name, &body, false).await?;
        info!(node = %node, engine = ?out.spec.engine_type, "data control assigned to its node");
        let out = Arc::new(out);
        ctx.upsert_data_control(Arc::clone(&out));
        out
    } else {
        dc
    };
    // Every member admits the node that reads it: the host (KernelLVM) or the assembling
    // node (SpdkLVStore).
    let reader = match dc.spec.engine_type {
        PoolMode::KernelLVM => dc.spec.host_node.clone(),
        PoolMode::SpdkLVStore => NodeInfo {
            id: node.clone(),
            hostname: node.clone(),
            ..NodeInfo::default()
        },
    };
    let mut all_ready = true;
    for g in &groups {
        for (m, v) in members(ctx, g) {
            let Some(v) = v else {
                all_ready = false;
                continue;
            };
            all_ready &= is_ready(&v);
            if v.spec.host_node.as_ref().map(|h| h.id.as_str()) != Some(reader.id.as_str()) {
                all_ready = false;
                let body = json!({
                    "metadata": { "resourceVersion": v.metadata.resource_version },
                    "spec": { "hostNode": reader },
                });
                let out: AntstorVolume = ctx
                    .patch(&key.namespace, &m.vol_id.name, &body, false)
                    .await?;
                info!(member = %m.vol_id.name, host = %reader.id, "member admits the assembling node");
                ctx.state().upsert_volume(Arc::new(out));
            }
        }
    }
    match dc.spec.engine_type {
        PoolMode::KernelLVM if all_ready => {
            dc_status(ctx, &dc, VolumeStatus::Ready, "").await?;
        }
        PoolMode::KernelLVM => {
            dc_status(ctx, &dc, VolumeStatus::Creating, "waiting for the members").await?;
        }
        PoolMode::SpdkLVStore => {
            // The assembling agent reports the export.
            if dc.status.as_ref().and_then(|s| s.status).is_none() {
                dc_status(ctx, &dc, VolumeStatus::Creating, "").await?;
            }
        }
    }
    if dc.is_replicated() {
        let dc = ctx.data_control(key).unwrap_or(dc);
        replicated::report_health(ctx, key, &dc, &groups).await?;
    }
    Ok(Action::Done)
}
