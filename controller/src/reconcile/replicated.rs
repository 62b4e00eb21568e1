//! Replicated volumes (raid1 data controls), the controller's half: replacing lost replicas
//! (from the group reconciler), moving the assembly off a lost node and reporting health
//! (from the data-control reconciler). The decisions are pure ([`crate::replicas`]); this
//! carries them out so that a controller restart between any two steps repeats nothing that
//! was done and loses nothing that was not. Called by [`super::group`] only; what it needs of a
//! group (members, data control, owner, status writer) comes from [`super::members`], never
//! from the group reconciler back.
//!
//! **Replacement** ([`replace_members`], on a fully placed replicated group):
//! 1. [`replicas::decide`] picks a lost replica (pool down: at once; failed or missing past
//!    `replicaReplaceGrace`; never the last online one; none while one is being replaced).
//! 2. The intent first: the group's annotation `liteio.io/replacing: <member>` (guarded by
//!    the resourceVersion). From here on the replacement goes on after a restart.
//! 3. A new member of the same size is placed on a node holding no replica (the spread key
//!    respected), charged to its pool under the state lock and created; after a restart the
//!    member created before it (labelled with the group, not in `spec.volumes`, not replaced)
//!    is adopted instead of placing another.
//! 4. The old member is marked `liteio.io/replaced-by: <new member>`, then the group's
//!    `spec.volumes` has the new member in the old one's place (same position, so the raid
//!    keeps its order). Event `ReplicaReplaced`.
//! 5. Once the data control's `status.replicas` no longer lists the old member (the
//!    assembling agent took it out of the raid), it is deleted; once its deletion is
//!    requested the intent annotation goes, and another replica may be replaced.
//!
//! **Assembly move** ([`move_assembly`]): when the node assembling the raid1
//! (`spec.targetNodeId`) has its pool down and another replica is online on a live node:
//! first every member admits only that node (`spec.hostNode`: the fence, so that the old
//! node's initiator is refused by every member's export), then the status says the assembly
//! is moving, then `liteio.io/assembly-moving-to`, `spec.targetNodeId` and the label name the
//! new node. Event `AssemblyMoved`. The annotation goes once the data control is ready again.
//!
//! **Health** ([`report_health`]): `status.health` and the `Degraded` condition from the
//! replicas (written only when they change), events `ReplicaLost` (once per loss) and
//! `Degraded` (when the condition turns true), the metrics `replicated_volume_health` and
//! `replica_rebuilt_bytes`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::events::EventType;
use liteio_api::common::{NodeInfo, PoolMode, VolumeStatus};
use liteio_api::group::{AntstorVolumeGroup, VolumeMeta};
use liteio_api::keys::labels;
use liteio_api::replica::{
    self, ANNO_ASSEMBLY_MOVING_TO, ANNO_REPLACED, ANNO_REPLACING, CONDITION_DEGRADED,
    ReplicaHealth, ReplicaState,
};
use liteio_api::{AntstorDataControl, AntstorVolume};
use serde_json::json;
use tracing::{info, warn};

use super::Context;
use super::members::{
    create_member, data_control_key, group_status, member_key, member_type, unrecorded_members,
};
use crate::error::{Error, Result};
use crate::group_scheduler;
use crate::replicas::{self, ReplicaView};
use crate::state::ObjectKey;

#[derive(Debug, Default)]
struct MemoryInner {
    /// When a reported state without `since` was first seen: (data control, member) →
    /// (state, time).
    seen: HashMap<(ObjectKey, String), (ReplicaState, Timestamp)>,
    /// Lost replicas already reported with a `ReplicaLost` event.
    lost: HashSet<(ObjectKey, String)>,
    /// The PV and members each data control has metric series for.
    series: HashMap<ObjectKey, (String, BTreeSet<String>)>,
}

/// What the replicated-volume reconcilers remember between passes. Lost with a restart,
/// which costs at most a repeated event and a grace that starts again for a replica whose
/// report has no `since`.
#[derive(Debug, Default)]
pub struct Memory(Mutex<MemoryInner>);

impl Memory {
    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryInner> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn first_seen(&self, dc: &ObjectKey, vol: &str, st: ReplicaState, now: Timestamp) -> Timestamp {
        let mut m = self.lock();
        let e = m
            .seen
            .entry((dc.clone(), vol.to_string()))
            .or_insert((st, now));
        if e.0 != st {
            *e = (st, now);
        }
        e.1
    }

    /// Records that `vol` is lost; true the first time.
    fn newly_lost(&self, dc: &ObjectKey, vol: &str) -> bool {
        self.lock().lost.insert((dc.clone(), vol.to_string()))
    }

    /// Forgets losses of `dc`'s replicas that are no longer lost.
    fn keep_lost(&self, dc: &ObjectKey, lost: &BTreeSet<String>) {
        self.lock()
            .lost
            .retain(|(d, v)| d != dc || lost.contains(v));
    }
}

/// The data control of `g` when it is a replicated volume's.
pub fn data_control_of(ctx: &Context, g: &AntstorVolumeGroup) -> Option<Arc<AntstorDataControl>> {
    ctx.data_control(&data_control_key(g))
        .filter(|dc| dc.is_replicated() && dc.metadata.deletion_timestamp.is_none())
}

/// The replicas of `dc` over the members of its groups, in the raid's order.
fn replica_views(
    ctx: &Context,
    dc: &AntstorDataControl,
    members: &[VolumeMeta],
) -> Vec<ReplicaView> {
    let key = ObjectKey::of(dc);
    let now = ctx.clock.now();
    let state = ctx.state();
    replicas::views(&state, dc, members, |v, st| {
        ctx.replica_memory.first_seen(&key, v, st, now)
    })
}

/// What the group reconciler does next after [`replace_members`].
#[derive(Debug)]
pub enum Step {
    /// Go on with the (possibly updated) group; look again after this long, if set.
    Continue(Arc<AntstorVolumeGroup>, Option<Duration>),
    /// Stop this pass here; look again after this long.
    Stop(Duration),
}

async fn set_replacing(
    ctx: &Context,
    key: &ObjectKey,
    g: &AntstorVolumeGroup,
    value: Option<&str>,
) -> Result<Arc<AntstorVolumeGroup>> {
    let body = json!({
        "metadata": {
            "resourceVersion": g.metadata.resource_version,
            "annotations": { ANNO_REPLACING: value },
        }
    });
    let out: AntstorVolumeGroup = ctx.patch(&key.namespace, &key.name, &body, false).await?;
    let out = Arc::new(out);
    ctx.upsert_group(Arc::clone(&out));
    Ok(out)
}

/// The replacement created before a restart: a member of `g` that exists, is labelled with
/// it, is neither in `spec.volumes` nor replaced nor being deleted.
fn created_replacement(ctx: &Context, g: &AntstorVolumeGroup) -> Option<VolumeMeta> {
    let ns = g.namespace().unwrap_or_default();
    let mut found: Vec<Arc<AntstorVolume>> = unrecorded_members(ctx, g)
        .into_iter()
        .filter(|v| {
            v.metadata.deletion_timestamp.is_none()
                && liteio_api::meta::annotation(&v.metadata, ANNO_REPLACED).is_none()
        })
        .collect();
    found.sort_by_key(|v| v.name_any());
    found.first().map(|v| VolumeMeta {
        vol_id: liteio_api::group::EntityIdentity {
            namespace: ns.clone(),
            name: v.name_any(),
            uuid: v.spec.uuid.clone(),
        },
        target_node_name: v.spec.target_node_id.clone(),
        size: i64::try_from(v.spec.size_byte).unwrap_or(i64::MAX),
    })
}

/// Replaces lost replicas of the replicated group `g` (fully placed, finalizer set) whose
/// data control is `dc`, one step per pass (see the module documentation).
///
/// Guarantees: at most one replacement per volume is under way (the intent annotation is
/// written before anything else and removed last); a pass repeated after a restart or a
/// conflict creates nothing twice. Assumes the caller holds no state lock. Errors: API
/// failures and conflicts (the group is retried with back-off; nothing half-done is lost).
/// `Step::Stop` when the replacement has no place yet (the reason is on the group).
pub async fn replace_members(
    ctx: &Context,
    key: &ObjectKey,
    g: Arc<AntstorVolumeGroup>,
    dc: &AntstorDataControl,
) -> Result<Step> {
    let mut g = g;
    let mut recheck = None;
    if liteio_api::meta::annotation(&g.metadata, ANNO_REPLACING).is_none() {
        let views = replica_views(ctx, dc, &g.spec.volumes);
        let verdict = replicas::decide(
            &views,
            replicas::any_report(dc),
            None,
            ctx.clock.now(),
            ctx.config.replica_replace_grace,
        );
        recheck = verdict.recheck_after;
        report_lost(ctx, dc, &views, &verdict.lost).await;
        let Some(rep) = verdict.replace else {
            return Ok(Step::Continue(g, recheck));
        };
        // The intent first: from here on a restarted controller goes on with it.
        g = set_replacing(ctx, key, &g, Some(&rep.volume)).await?;
        info!(member = %rep.volume, reason = %rep.reason, "replacing a lost replica");
    }
    let Some(old_name) =
        liteio_api::meta::annotation(&g.metadata, ANNO_REPLACING).map(str::to_string)
    else {
        return Ok(Step::Continue(g, recheck));
    };
    match g
        .spec
        .volumes
        .iter()
        .position(|m| m.vol_id.name == old_name)
    {
        Some(pos) => swap_in_replacement(ctx, key, g, dc, pos).await,
        None => retire_replaced(ctx, key, g, dc, &old_name).await,
    }
}

/// Steps 3 and 4: the replacement of member `pos` placed (or adopted), created, the old
/// member marked, and `spec.volumes` updated.
async fn swap_in_replacement(
    ctx: &Context,
    key: &ObjectKey,
    g: Arc<AntstorVolumeGroup>,
    dc: &AntstorDataControl,
    pos: usize,
) -> Result<Step> {
    let old = g.spec.volumes[pos].clone();
    let mtype = member_type(&g);
    let (new, placed_now) = match created_replacement(ctx, &g) {
        Some(m) => (m, false),
        None => {
            let planned = {
                let mut state = ctx.state();
                let res = group_scheduler::place_replacement(
                    &ctx.scheduler,
                    &state,
                    &g,
                    &old,
                    mtype,
                    || uuid::Uuid::new_v4().to_string(),
                );
                if let Ok(m) = &res {
                    state.upsert_volume(Arc::new(group_scheduler::member_volume(&g, m, mtype)));
                }
                res
            };
            match planned {
                Ok(m) => (m, true),
                Err(e) => {
                    let msg = format!("replica {} is not replaced yet: {e}", old.vol_id.name);
                    info!(reason = %msg, "replacement not placed");
                    ctx.warn_once(g.as_ref(), replica::EVENT_REPLICA_NOT_REPLACED, msg.clone())
                        .await;
                    let status = g
                        .status
                        .as_ref()
                        .and_then(|s| s.status)
                        .unwrap_or(VolumeStatus::Creating);
                    group_status(ctx, &g, status, &msg, None).await?;
                    // Retried when a pool changes, and meanwhile now and then.
                    return Ok(Step::Stop(
                        ctx.config.replica_replace_grace.max(Duration::from_secs(1)),
                    ));
                }
            }
        }
    };
    let ns = key.namespace.clone();
    let api: Api<AntstorVolume> = Api::namespaced(ctx.client.clone(), &ns);
    if placed_now
        && let Err(e) =
            create_member(ctx, &api, &g, &new, mtype, "replacement member created").await
    {
        // The room charged to its pool when it was placed is given back.
        ctx.state().remove_volume(&member_key(&new, &ns));
        return Err(e);
    }
    // The old member is marked before the swap, so that after it no pass takes the old
    // member for a replacement still to be adopted.
    let mark = json!({ "metadata": { "annotations": { ANNO_REPLACED: new.vol_id.name } } });
    match ctx
        .patch::<AntstorVolume>(&ns, &old.vol_id.name, &mark, false)
        .await
    {
        Ok(out) => ctx.state().upsert_volume(Arc::new(out)),
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e),
    }
    let mut volumes = g.spec.volumes.clone();
    volumes[pos] = new.clone();
    let body = json!({
        "metadata": { "resourceVersion": g.metadata.resource_version },
        "spec": { "volumes": volumes },
    });
    let out: AntstorVolumeGroup = ctx.patch(&ns, &key.name, &body, false).await?;
    let out = Arc::new(out);
    ctx.upsert_group(Arc::clone(&out));
    ctx.clear_warning(key);
    // The replaced member no longer joins the PV's series.
    let pv = liteio_api::meta::label(&g.metadata, labels::PV_NAME)
        .map_or_else(|| g.name_any(), str::to_string);
    let _ = ctx.metrics.group_members.remove_label_values(&[
        &pv,
        &g.name_any(),
        &old.vol_id.name,
        &old.target_node_name,
    ]);
    let note = format!(
        "replica {} on node {} is replaced by {} on node {} (rebuilt by the assembling agent)",
        old.vol_id.name, old.target_node_name, new.vol_id.name, new.target_node_name
    );
    info!(old = %old.vol_id.name, new = %new.vol_id.name, node = %new.target_node_name, "replica replaced in the group");
    ctx.publish(dc, EventType::Normal, replica::EVENT_REPLICA_REPLACED, note)
        .await;
    Ok(Step::Continue(out, None))
}

/// Step 5: the replaced member goes once the assembly no longer lists it; then the intent.
async fn retire_replaced(
    ctx: &Context,
    key: &ObjectKey,
    g: Arc<AntstorVolumeGroup>,
    dc: &AntstorDataControl,
    old_name: &str,
) -> Result<Step> {
    let ns = key.namespace.clone();
    let old = ctx
        .state()
        .volume(&ObjectKey::new(ns.clone(), old_name))
        .filter(|v| v.metadata.resource_version.is_some())
        .cloned();
    if let Some(v) = &old
        && v.metadata.deletion_timestamp.is_none()
    {
        let listed = dc
            .status
            .as_ref()
            .is_some_and(|s| s.replicas.iter().any(|r| r.volume == old_name));
        if listed {
            // The data control's next status queues this group again.
            return Ok(Step::Continue(g, None));
        }
        let api: Api<AntstorVolume> = Api::namespaced(ctx.client.clone(), &ns);
        match api.delete(old_name, &DeleteParams::default()).await {
            Ok(_) => info!(member = %old_name, "replaced member deletion requested"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(Error::kube(
                    format!("delete replaced AntstorVolume {old_name}"),
                    e,
                ));
            }
        }
    }
    let out = set_replacing(ctx, key, &g, None).await?;
    info!(member = %old_name, "replacement finished");
    Ok(Step::Continue(out, None))
}

/// Whether `dc` was assembled at least once (its agent reported an export, readiness or
/// replicas): from then on its replicas are watched and a group that is not ready (a
/// replacement being created) does not hold it back.
pub fn assembled_once(dc: &AntstorDataControl) -> bool {
    dc.status.as_ref().is_some_and(|s| {
        s.spdk_target.is_some() || s.status == Some(VolumeStatus::Ready) || !s.replicas.is_empty()
    })
}

/// Moves the assembly of replicated `dc` off its node when that node's pool is down (see
/// the module documentation); returns the data control as it is afterwards.
///
/// Guarantees: `spec.targetNodeId` changes only after every member (and the one being
/// replaced) admits only the new node; repeated after a restart it fences the same members
/// again (a no-op) and moves to the same node while the same replicas are online. Errors:
/// API failures and conflicts, before the target changes (retried with back-off).
pub async fn move_assembly(
    ctx: &Context,
    key: &ObjectKey,
    dc: Arc<AntstorDataControl>,
    groups: &[Arc<AntstorVolumeGroup>],
) -> Result<Arc<AntstorDataControl>> {
    let current = dc.spec.target_node_id.clone();
    if dc.spec.engine_type != PoolMode::SpdkLVStore || current.is_empty() {
        return Ok(dc);
    }
    let members: Vec<VolumeMeta> = groups
        .iter()
        .flat_map(|g| g.spec.volumes.iter().cloned())
        .collect();
    let views = replica_views(ctx, &dc, &members);
    let down = replicas::pool_down(&ctx.state(), &current);
    let Some(to) = replicas::assembly_target(&views, replicas::any_report(&dc), &current, down)
    else {
        return Ok(dc);
    };
    // The fence first: every member admits only the new node, so the old node's initiator
    // is refused by every member's export before anything assembles elsewhere; the member
    // being replaced too (it may still be in the raid).
    let reader = NodeInfo {
        id: to.clone(),
        hostname: to.clone(),
        ..NodeInfo::default()
    };
    let mut fenced: Vec<String> = members.iter().map(|m| m.vol_id.name.clone()).collect();
    for g in groups {
        if let Some(n) = liteio_api::meta::annotation(&g.metadata, ANNO_REPLACING)
            && !fenced.iter().any(|f| f == n)
        {
            fenced.push(n.to_string());
        }
    }
    for name in &fenced {
        let v = ctx
            .state()
            .volume(&ObjectKey::new(key.namespace.clone(), name.clone()))
            .filter(|v| {
                v.metadata.resource_version.is_some() && v.metadata.deletion_timestamp.is_none()
            })
            .cloned();
        let Some(v) = v else { continue };
        if v.spec.host_node.as_ref().map(|h| h.id.as_str()) == Some(to.as_str()) {
            continue;
        }
        let body = json!({
            "metadata": { "resourceVersion": v.metadata.resource_version },
            "spec": { "hostNode": reader },
        });
        let out: AntstorVolume = ctx.patch(&key.namespace, name, &body, false).await?;
        info!(member = %name, host = %to, "member fenced: admits only the new assembling node");
        ctx.state().upsert_volume(Arc::new(out));
    }
    let msg = format!(
        "the assembly moves from node {current} (its StoragePool is down) to node {to}, which holds an online replica"
    );
    let status: AntstorDataControl = ctx
        .patch(
            &key.namespace,
            &key.name,
            &json!({ "status": { "status": VolumeStatus::Creating, "message": msg } }),
            true,
        )
        .await?;
    let body = json!({
        "metadata": {
            "resourceVersion": status.metadata.resource_version,
            "labels": { labels::TARGET_NODE_ID: to },
            "annotations": { ANNO_ASSEMBLY_MOVING_TO: to },
        },
        "spec": { "targetNodeId": to },
    });
    let out: AntstorDataControl = ctx.patch(&key.namespace, &key.name, &body, false).await?;
    warn!(from = %current, to = %to, "assembly of a replicated volume moved off a node that is down");
    ctx.publish(&out, EventType::Normal, replica::EVENT_ASSEMBLY_MOVED, msg)
        .await;
    let out = Arc::new(out);
    ctx.upsert_data_control(Arc::clone(&out));
    Ok(out)
}

/// Drops `liteio.io/assembly-moving-to` once the moved assembly is ready.
pub async fn finish_move(
    ctx: &Context,
    key: &ObjectKey,
    dc: Arc<AntstorDataControl>,
) -> Result<Arc<AntstorDataControl>> {
    let moving = liteio_api::meta::annotation(&dc.metadata, ANNO_ASSEMBLY_MOVING_TO);
    let ready = dc
        .status
        .as_ref()
        .is_some_and(|s| s.status == Some(VolumeStatus::Ready));
    if moving.is_none() || moving != Some(dc.spec.target_node_id.as_str()) || !ready {
        return Ok(dc);
    }
    let body = json!({
        "metadata": {
            "resourceVersion": dc.metadata.resource_version,
            "annotations": { ANNO_ASSEMBLY_MOVING_TO: null },
        }
    });
    let out: AntstorDataControl = ctx.patch(&key.namespace, &key.name, &body, false).await?;
    info!(node = %out.spec.target_node_id, "moved assembly ready");
    let out = Arc::new(out);
    ctx.upsert_data_control(Arc::clone(&out));
    Ok(out)
}

/// Publishes `ReplicaLost` for each of `lost` not reported yet (the group reconciler, which
/// may replace a replica before the data control's next pass, and the data control's
/// reconciler both call it; each loss is reported once).
async fn report_lost(
    ctx: &Context,
    dc: &AntstorDataControl,
    views: &[ReplicaView],
    lost: &[(String, String)],
) {
    let key = ObjectKey::of(dc);
    for (vol, why) in lost {
        if ctx.replica_memory.newly_lost(&key, vol) {
            let node = views
                .iter()
                .find(|r| &r.volume == vol)
                .map(|r| r.node.as_str())
                .unwrap_or_default();
            warn!(member = %vol, node, reason = %why, "replica lost");
            ctx.publish(
                dc,
                EventType::Warning,
                replica::EVENT_REPLICA_LOST,
                format!("replica {vol} on node {node} is lost: {why}"),
            )
            .await;
        }
    }
}

/// The PV a data control belongs to (label `obnvmf/pv-name`, else its name).
fn pv_of(dc: &AntstorDataControl) -> String {
    liteio_api::meta::label(&dc.metadata, labels::PV_NAME)
        .map_or_else(|| dc.name_any(), str::to_string)
}

/// Writes `status.health` and the `Degraded` condition of replicated `dc` when they change,
/// publishes `ReplicaLost` and `Degraded`, and sets the metrics (see the module
/// documentation). Nothing before the first assembly. Writes nothing when nothing changed;
/// errors: API failures of the status patch (retried with back-off).
pub async fn report_health(
    ctx: &Context,
    key: &ObjectKey,
    dc: &AntstorDataControl,
    groups: &[Arc<AntstorVolumeGroup>],
) -> Result<()> {
    if !assembled_once(dc) {
        return Ok(());
    }
    let members: Vec<VolumeMeta> = groups
        .iter()
        .flat_map(|g| g.spec.volumes.iter().cloned())
        .collect();
    let any = replicas::any_report(dc);
    let views = replica_views(ctx, dc, &members);
    let replacing = groups
        .iter()
        .find_map(|g| liteio_api::meta::annotation(&g.metadata, ANNO_REPLACING));
    let verdict = replicas::decide(
        &views,
        any,
        replacing,
        ctx.clock.now(),
        ctx.config.replica_replace_grace,
    );
    let health = replicas::health(&views, any);
    let cur = dc.status.clone().unwrap_or_default();
    let prev = replica::condition(&cur.conditions, CONDITION_DEGRADED);
    let cond = replicas::degraded_condition(
        health,
        &views,
        any,
        &cur.replicas,
        &verdict.kept,
        prev,
        ctx.clock.now(),
    );
    // Events: each loss once (a replica back online may be reported again when it is lost
    // again), and the turn to degraded.
    let lost: BTreeSet<String> = verdict.lost.iter().map(|(v, _)| v.clone()).collect();
    ctx.replica_memory.keep_lost(key, &lost);
    report_lost(ctx, dc, &views, &verdict.lost).await;
    let was_true = prev.is_some_and(|p| p.status == replica::ConditionState::True);
    let is_true = cond.status == replica::ConditionState::True;
    let mut conditions: Vec<replica::Condition> = cur
        .conditions
        .iter()
        .filter(|c| c.type_ != CONDITION_DEGRADED)
        .cloned()
        .collect();
    conditions.push(cond.clone());
    if cur.health != Some(health) || prev != Some(&cond) {
        let out: AntstorDataControl = ctx
            .patch(
                &key.namespace,
                &key.name,
                &json!({ "status": { "health": health, "conditions": conditions } }),
                true,
            )
            .await?;
        if cur.health != Some(health) {
            info!(from = ?cur.health, to = %health, "replicated volume health changed");
        }
        ctx.upsert_data_control(Arc::new(out));
    }
    if is_true && !was_true {
        ctx.publish(
            dc,
            EventType::Warning,
            replica::EVENT_DEGRADED,
            format!("volume is {health}: {}", cond.message),
        )
        .await;
    }
    set_metrics(ctx, key, dc, health);
    Ok(())
}

fn set_metrics(ctx: &Context, key: &ObjectKey, dc: &AntstorDataControl, health: ReplicaHealth) {
    let pv = pv_of(dc);
    for h in ReplicaHealth::ALL {
        ctx.metrics
            .replicated_health
            .with_label_values(&[pv.as_str(), h.as_str()])
            .set(i64::from(h == health));
    }
    let reports = dc
        .status
        .as_ref()
        .map(|s| s.replicas.clone())
        .unwrap_or_default();
    let now: BTreeSet<String> = reports
        .iter()
        .filter(|r| r.rebuilt_bytes.is_some())
        .map(|r| r.volume.clone())
        .collect();
    for r in &reports {
        if let Some(b) = r.rebuilt_bytes {
            ctx.metrics
                .replica_rebuilt_bytes
                .with_label_values(&[pv.as_str(), r.volume.as_str()])
                .set(i64::try_from(b).unwrap_or(i64::MAX));
        }
    }
    let old = ctx
        .replica_memory
        .lock()
        .series
        .insert(key.clone(), (pv.clone(), now.clone()));
    if let Some((old_pv, old_vols)) = old {
        if old_pv != pv {
            for h in ReplicaHealth::ALL {
                let _ = ctx
                    .metrics
                    .replicated_health
                    .remove_label_values(&[old_pv.as_str(), h.as_str()]);
            }
        }
        for v in old_vols
            .iter()
            .filter(|v| old_pv != pv || !now.contains(*v))
        {
            let _ = ctx
                .metrics
                .replica_rebuilt_bytes
                .remove_label_values(&[old_pv.as_str(), v.as_str()]);
        }
    }
}

/// Forgets a replicated data control that is being deleted or gone: its metric series
/// (by the PV they were set for) and what was remembered of its replicas.
pub fn forget(ctx: &Context, key: &ObjectKey) {
    let mut m = ctx.replica_memory.lock();
    if let Some((pv, vols)) = m.series.remove(key) {
        for h in ReplicaHealth::ALL {
            let _ = ctx
                .metrics
                .replicated_health
                .remove_label_values(&[pv.as_str(), h.as_str()]);
        }
        for v in vols {
            let _ = ctx
                .metrics
                .replica_rebuilt_bytes
                .remove_label_values(&[pv.as_str(), v.as_str()]);
        }
    }
    m.seen.retain(|(d, _), _| d != key);
    m.lost.retain(|(d, _)| d != key);
}
