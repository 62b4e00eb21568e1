//! Data-control sync: the SpdkLVStore assembly of the multi-disk volumes whose
//! AntstorDataControl names this node (`spec.targetNodeId`, label `obnvmf/target-node-id`).
//! Engine KernelLVM data controls are assembled by the CSI node on the host: ignored here.
//! A data control that names another node is ignored too, unless this node still serves its
//! assembly (the controller moved a replicated volume's assembly off this node while it was
//! cut off): that assembly is torn down here ([`remove_moved`]), so that this node neither
//! serves the host nor holds its replica open.
//!
//! **Expected flow** (one pass does every step that is due; writes are guarded by the
//! object's resourceVersion):
//! 1. Deleting (`deletionTimestamp`) with the `antstor.alipay.com/lvm` finalizer
//!    ([`finalizers::ASSEMBLY`]): remove the assembly (subsystem, raid bdev, initiator
//!    controllers, keys; idempotent), then drop the finalizer. The controller deletes the
//!    members only once the data control is gone.
//! 2. Refuse what cannot be assembled: a target without SPDK, a raid level other than
//!    linear, raid0 and raid1 (permanent errors, in `status.message`).
//! 3. Wait (`status.message` says for what) until every group is fully placed and every
//!    member, in the groups' `spec.volumes` order, is ready and admits this node
//!    (`spec.hostNode`): a remote member exported to this node (`spec.spdkTarget`,
//!    annotation `liteio.io/exported-to`), a local one with its lvol recorded and no export
//!    (its own agent withdraws it: this node's raid opens the lvol, which an export's gate
//!    would hold). The members' changes reconcile the data control at once ([`triggers`]).
//! 4. Add the finalizer **before** building anything, so that an agent killed in the middle
//!    still tears down on deletion.
//! 5. [`Exporter::ensure_assembly`](crate::exporter::Exporter::ensure_assembly): remote
//!    members attached as this node's host NQN with the PV's keys, a concat (linear),
//!    raid0 (with [`STRIP_KB`] strips) or raid1 (a mirror with a superblock; once served,
//!    a lost replica is [`MemberSource::Absent`] and the mirror serves degraded, see
//!    [`mirror_members`]) bdev named after the data control, one subsystem
//!    admitting exactly the host of `spec.hostNode` with the same keys. Every pass re-asserts
//!    it: after a restart the assembly comes back from the objects, and a new `hostNode`
//!    replaces the allowed host.
//! 6. Record `status.spdkTarget`, `status.status: ready` and the annotation
//!    `liteio.io/exported-to` (the host the export admits) when they differ.
//!
//! **Guarantees.** Idempotent: a second pass writes nothing and changes nothing in SPDK. A
//! failed assembly leaves nothing of what it made (the exporter's contract). A data control
//! that was ready stays ready while a member looks unready for a moment (its assembly keeps
//! serving; the initiator rides out a member's restart). **Errors** go to `status.message`
//! (except conflicts) and are retried with back-off, or wait for a change when permanent.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::api::PartialObjectMeta;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use liteio_api::common::{PoolMode, VolumeStatus};
use liteio_api::datacontrol::RaidLevel;
use liteio_api::group::VolumeMeta;
use liteio_api::keys::{self, annotations, finalizers, labels};
use liteio_api::{AntstorDataControl, AntstorVolume, AntstorVolumeGroup, SpdkTarget, naming};
use serde_json::json;
use tracing::{debug, info, instrument, warn};

use super::{annotation, has_finalizer, label, patch_guarded, patch_status, remove_finalizers};
use crate::context::Ctx;
use crate::error::{AgentError, ErrorKind, Result};
use crate::exporter::{
    AssemblyLevel, AssemblyMember, AssemblyRequest, MemberSource, UnassembleRequest,
};

/// The `resource` label of this reconciler's errors.
pub(crate) const RESOURCE: &str = "antstordatacontrol";

/// Strip size of the assembled raids, in KiB. raid0: 64 KiB is what the KernelLVM assembly
/// stripes with (LVM's default stripe size), so both engines lay a volume out alike; a 4 KiB
/// I/O touches one member, and a 1 MiB one is spread over 16 strips (all members). It is
/// below the 128 KiB a member's NVMe/TCP controller takes in one command, so a strip never
/// splits on the wire. Concat: only rounds each member down to whole strips, and members are
/// whole multiples of 4 MiB.
pub const STRIP_KB: u32 = 64;

/// The key of a data control in [`Ctx::own_writes`] (a volume may have the same name).
fn own_key(dc: &AntstorDataControl) -> String {
    format!("AntstorDataControl/{}", super::object_key(dc))
}

fn namespace(dc: &AntstorDataControl) -> String {
    dc.namespace()
        .unwrap_or_else(|| keys::DEFAULT_NAMESPACE.to_string())
}

/// The assembly's level for `spec.raid.level`; the reason when it has none.
pub fn level_of(dc: &AntstorDataControl) -> std::result::Result<AssemblyLevel, String> {
    match dc.spec.raid.level {
        RaidLevel::Linear => Ok(AssemblyLevel::Concat),
        RaidLevel::Raid0 => Ok(AssemblyLevel::Raid0),
        RaidLevel::Raid1 => Ok(AssemblyLevel::Mirror),
        other => Err(format!(
            "spec.raid.level: {} is not assembled (linear, raid0 and raid1 are)",
            serde_json::to_value(other)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        )),
    }
}

/// The members of `groups` (in their `spec.volumes` order) as this node assembles them, from
/// the member volumes `vols` (by name); `Err` says what to wait for.
///
/// A member must exist, be ready and admit `node` (`spec.hostNode`). One on another node must
/// be exported to `node` (`spec.spdkTarget` and `liteio.io/exported-to: <node>`); one on
/// `node` must have its lvol recorded and no export (see `volume::assembled_locally`).
pub fn assembly_members(
    node: &str,
    groups: &[AntstorVolumeGroup],
    vols: &BTreeMap<String, AntstorVolume>,
) -> std::result::Result<Vec<AssemblyMember>, String> {
    members_of(node, groups, vols, |_, why| Err(why))
}

/// The replicas of a replicated volume that is served already, as this node assembles them:
/// a replica [`assembly_members`] would wait for is [`MemberSource::Absent`] with that
/// reason instead (the mirror serves without it). `Err` when a group is not placed.
pub fn mirror_members(
    node: &str,
    groups: &[AntstorVolumeGroup],
    vols: &BTreeMap<String, AntstorVolume>,
) -> std::result::Result<Vec<AssemblyMember>, String> {
    members_of(node, groups, vols, |m, reason| {
        Ok(AssemblyMember {
            volume: m.vol_id.name.clone(),
            node: m.target_node_name.clone(),
            source: MemberSource::Absent { reason },
        })
    })
}

/// The members of `groups` in order; `unmet` decides what a member that is not in place
/// becomes (an error to wait on, or an absent member).
fn members_of(
    node: &str,
    groups: &[AntstorVolumeGroup],
    vols: &BTreeMap<String, AntstorVolume>,
    unmet: impl Fn(&VolumeMeta, String) -> std::result::Result<AssemblyMember, String>,
) -> std::result::Result<Vec<AssemblyMember>, String> {
    let mut out = Vec::new();
    for g in groups {
        if !g.fully_placed() {
            return Err(format!(
                "waiting for AntstorVolumeGroup {} to be placed",
                g.name_any()
            ));
        }
        for m in &g.spec.volumes {
            out.push(match member(node, m, vols) {
                Ok(a) => a,
                Err(why) => unmet(m, why)?,
            });
        }
    }
    if out.is_empty() {
        return Err("its volume groups have no members".into());
    }
    Ok(out)
}

/// Member `m` as `node` assembles it; `Err` says what it waits for.
fn member(
    node: &str,
    m: &VolumeMeta,
    vols: &BTreeMap<String, AntstorVolume>,
) -> std::result::Result<AssemblyMember, String> {
    let name = &m.vol_id.name;
    let Some(v) = vols.get(name) else {
        return Err(format!("waiting for member AntstorVolume {name}"));
    };
    if v.metadata.deletion_timestamp.is_some() {
        return Err(format!("member AntstorVolume {name} is being deleted"));
    }
    if v.phase() != VolumeStatus::Ready {
        return Err(format!("waiting for member {name} to be ready"));
    }
    if v.spec.host_node.as_ref().map(|h| h.id.as_str()) != Some(node) {
        return Err(format!(
            "waiting for member {name} to admit this node (spec.hostNode)"
        ));
    }
    let on = v.spec.target_node_id.as_str();
    let source = if on == node {
        let Some(lvol) = v.spec.spdk_lvol.clone().filter(|l| !l.name.is_empty()) else {
            return Err(format!(
                "member {name} on this node has no spec.spdkLvol: the SpdkLVStore assembly needs SPDK lvols"
            ));
        };
        if v.spec.spdk_target.is_some() || has_finalizer(&v.metadata, finalizers::SPDK_TARGET) {
            return Err(format!(
                "waiting for member {name} to be unexported (this node's raid opens its lvol directly)"
            ));
        }
        MemberSource::Local { lvol }
    } else {
        let exported = v
            .spec
            .spdk_target
            .clone()
            .filter(|t| !t.subsys_nqn.is_empty() && !t.address.is_empty());
        let Some(target) =
            exported.filter(|_| annotation(&v.metadata, annotations::EXPORTED_TO) == Some(node))
        else {
            return Err(format!(
                "waiting for member {name} on node {on} to be exported to this node"
            ));
        };
        MemberSource::Remote { target }
    };
    Ok(AssemblyMember {
        volume: name.clone(),
        node: on.to_string(),
        source,
    })
}

/// Reconciles one AntstorDataControl. See the module documentation for the flow, guarantees
/// and errors.
#[instrument(skip_all, fields(data_control = %dc.name_any(), node = %ctx.node))]
pub async fn reconcile(dc: Arc<AntstorDataControl>, ctx: Arc<Ctx>) -> Result<Action> {
    match reconcile_inner(&dc, &ctx).await {
        Ok(a) => Ok(a),
        Err(e) => {
            if !matches!(e.kind(), ErrorKind::Conflict | ErrorKind::NotFound)
                && dc.metadata.deletion_timestamp.is_none()
                && dc.spec.engine_type == PoolMode::SpdkLVStore
            {
                set_message(&ctx, &dc, &e.chain()).await;
            }
            Err(e)
        }
    }
}

/// Writes `status.message` (keeping the status; `creating` when there is none) when it
/// differs (best effort: a failure is logged).
async fn set_message(ctx: &Ctx, dc: &AntstorDataControl, msg: &str) {
    let st = dc.status.clone().unwrap_or_default();
    if st.message == msg && st.status.is_some() {
        return;
    }
    let status = json!({"status": st.status.unwrap_or(VolumeStatus::Creating), "message": msg});
    if let Err(e) = patch_status(ctx, &api(ctx, dc), dc, status).await {
        ctx.metrics.reconcile_error(RESOURCE, e.kind().as_str());
        warn!(error = %e.chain(), "cannot write the data control's status message");
    }
}

fn api(ctx: &Ctx, dc: &AntstorDataControl) -> Api<AntstorDataControl> {
    Api::namespaced(ctx.client.clone(), &namespace(dc))
}

fn is_ready(dc: &AntstorDataControl) -> bool {
    dc.status
        .as_ref()
        .is_some_and(|s| s.status == Some(VolumeStatus::Ready) && s.spdk_target.is_some())
}

async fn reconcile_inner(dc: &AntstorDataControl, ctx: &Ctx) -> Result<Action> {
    let key = own_key(dc);
    if ctx
        .own_writes
        .is_superseded(&key, dc.metadata.resource_version.as_deref())
    {
        debug!("a copy this agent superseded; waiting for its own last write");
        return Ok(Action::await_change());
    }
    if dc.metadata.deletion_timestamp.is_some() {
        return tear_down(ctx, dc).await;
    }
    // KernelLVM: the CSI node assembles it on the host.
    if dc.spec.engine_type != PoolMode::SpdkLVStore {
        return Ok(Action::await_change());
    }
    if dc.spec.target_node_id != ctx.node {
        return remove_moved(ctx, dc).await;
    }
    let what = format!("AntstorDataControl {}/{}", namespace(dc), dc.name_any());
    if !ctx.exporter.assembles() {
        return Err(AgentError::Assembly {
            op: "assemble",
            data_control: dc.name_any(),
            source: crate::exporter::no_assembly(&dc.name_any()),
        });
    }
    if dc.spec.uuid.is_empty() {
        return Err(AgentError::InvalidObject {
            what,
            reason: "spec.uuid: is required".into(),
        });
    }
    let level = level_of(dc).map_err(|reason| AgentError::InvalidObject {
        what: what.clone(),
        reason,
    })?;
    let (groups, vols) = match read_members(ctx, dc).await? {
        Ok(x) => x,
        Err(why) => return wait(ctx, dc, &why).await,
    };
    // A replicated volume that was served once goes on without the replicas it cannot
    // reach, also on the node the controller moved its assembly to (from the replicas'
    // superblocks: the old node's replica may be lost with it); a new one (and every other
    // level) waits for all of its members.
    let serving_mirror = level == AssemblyLevel::Mirror
        && (is_ready(dc)
            || annotation(&dc.metadata, liteio_api::replica::ANNO_ASSEMBLY_MOVING_TO)
                == Some(ctx.node.as_str()));
    let members = if serving_mirror {
        mirror_members(&ctx.node, &groups, &vols)
    } else {
        assembly_members(&ctx.node, &groups, &vols)
    };
    let members = match members {
        Ok(m) => m,
        Err(why) => return wait(ctx, dc, &why).await,
    };
    let api = api(ctx, dc);
    let mut dc = dc.clone();
    let mut rvs: Vec<String> = dc.metadata.resource_version.iter().cloned().collect();
    if !has_finalizer(&dc.metadata, finalizers::ASSEMBLY) {
        let body = json!({"metadata": {
            "finalizers": super::with_finalizer(&dc.metadata, finalizers::ASSEMBLY),
        }});
        dc = patch_guarded(ctx, &api, &dc, body).await?;
        rvs.extend(dc.metadata.resource_version.iter().cloned());
    }
    // Every member carries the PV's name: its Secret holds the PV's keys, which the remote
    // members' exports, this export and the host all use. The first local member's, which
    // this node's identity may read.
    let keys = if ctx.exporter.authenticates() {
        let holder = members
            .iter()
            .find(|m| matches!(m.source, MemberSource::Local { .. }))
            .or(members.first())
            .and_then(|m| vols.get(&m.volume));
        match holder {
            Some(v) => Some(super::auth::volume_keys(ctx, v, false).await?),
            None => None,
        }
    } else {
        None
    };
    let hostnqn = super::names::node_host_nqn(ctx, &ctx.node).await?;
    let host = dc.spec.host_node.id.clone();
    let allowed_hosts = if host.is_empty() {
        Vec::new()
    } else {
        vec![super::names::node_host_nqn(ctx, &host).await?]
    };
    let req = AssemblyRequest {
        name: dc.name_any(),
        uuid: dc.spec.uuid.clone(),
        level,
        strip_kb: STRIP_KB,
        members,
        size_bytes: u64::try_from(dc.spec.total_size).unwrap_or(0),
        hostnqn,
        allowed_hosts,
        keys,
        preset: dc.status.as_ref().and_then(|s| s.spdk_target.clone()),
        new_mirror: level == AssemblyLevel::Mirror && !serving_mirror,
    };
    let target: SpdkTarget =
        ctx.exporter
            .ensure_assembly(&req)
            .await
            .map_err(|source| AgentError::Assembly {
                op: "assemble",
                data_control: dc.name_any(),
                source,
            })?;
    // Whose host NQN the export admits now (as on volumes: the CSI node waits for its node
    // here after the consumer moved).
    let exported_to = Some(host.as_str()).filter(|h| !h.is_empty());
    if annotation(&dc.metadata, annotations::EXPORTED_TO) != exported_to {
        let body = json!({"metadata": {"annotations": {annotations::EXPORTED_TO: exported_to}}});
        dc = patch_guarded(ctx, &api, &dc, body).await?;
        rvs.extend(dc.metadata.resource_version.iter().cloned());
        info!(host = %host, "assembled export admits its host");
    }
    let st = dc.status.clone().unwrap_or_default();
    if st.status != Some(VolumeStatus::Ready)
        || st.spdk_target.as_ref() != Some(&target)
        || !st.message.is_empty()
    {
        let status = json!({"status": VolumeStatus::Ready, "spdkTarget": target, "message": ""});
        dc = patch_status(ctx, &api, &dc, status).await?;
        rvs.extend(dc.metadata.resource_version.iter().cloned());
        info!(nqn = %target.subsys_nqn, address = %target.address, port = %target.svc_id, members = req.members.len(), level = req.level.as_str(), "multi-disk volume assembled and exported");
    }
    if req.level == AssemblyLevel::Mirror {
        let replicas =
            ctx.exporter
                .replicas(&req)
                .await
                .map_err(|source| AgentError::Assembly {
                    op: "report the replicas of",
                    data_control: dc.name_any(),
                    source,
                })?;
        let now = dc
            .status
            .as_ref()
            .map(|s| s.replicas.clone())
            .unwrap_or_default();
        if replicas_changed(&now, &replicas) {
            let replicas = with_since(&now, replicas);
            dc = patch_status(ctx, &api, &dc, json!({"replicas": replicas})).await?;
            rvs.extend(dc.metadata.resource_version.iter().cloned());
            info!(replicas = %summary(&replicas), "replicas reported");
        }
        ctx.own_writes.record(key, rvs);
        // A replica's failure and a rebuild's progress are read from SPDK: soon again.
        return Ok(Action::requeue(MIRROR_RESYNC.min(ctx.resync)));
    }
    ctx.own_writes.record(key, rvs);
    Ok(Action::requeue(ctx.resync))
}

/// How often a replicated volume's replicas are read from SPDK and reported.
pub const MIRROR_RESYNC: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether the replicas' report differs from the recorded one in anything but `since`, and
/// in rebuild progress by at least a percent.
fn replicas_changed(
    now: &[liteio_api::replica::ReplicaStatus],
    new: &[liteio_api::replica::ReplicaStatus],
) -> bool {
    now.len() != new.len()
        || now.iter().zip(new).any(|(a, b)| {
            a.volume != b.volume
                || a.node != b.node
                || a.state != b.state
                || a.rebuild_percent != b.rebuild_percent
                || a.message != b.message
        })
}

/// `new` with each replica's `since`: kept from `now` while its state is the same, else the
/// current time.
fn with_since(
    now: &[liteio_api::replica::ReplicaStatus],
    new: Vec<liteio_api::replica::ReplicaStatus>,
) -> Vec<liteio_api::replica::ReplicaStatus> {
    let stamp = k8s_openapi::jiff::Timestamp::now().to_string();
    new.into_iter()
        .map(|mut r| {
            r.since = now
                .iter()
                .find(|o| o.volume == r.volume && o.state == r.state)
                .and_then(|o| o.since.clone())
                .or_else(|| Some(stamp.clone()));
            r
        })
        .collect()
}

fn summary(r: &[liteio_api::replica::ReplicaStatus]) -> String {
    r.iter()
        .map(|r| format!("{}@{}:{}", r.volume, r.node, r.state.as_str()))
        .collect::<Vec<_>>()
        .join(",")
}

/// The data control's groups and their member volumes (by name); `Err` says what to wait
/// for.
async fn read_members(
    ctx: &Ctx,
    dc: &AntstorDataControl,
) -> Result<std::result::Result<(Vec<AntstorVolumeGroup>, BTreeMap<String, AntstorVolume>), String>>
{
    let ns = namespace(dc);
    let mut groups = Vec::new();
    let mut vols = BTreeMap::new();
    for id in &dc.spec.volume_groups {
        let gns = if id.namespace.is_empty() {
            ns.clone()
        } else {
            id.namespace.clone()
        };
        let gapi: Api<AntstorVolumeGroup> = Api::namespaced(ctx.client.clone(), &gns);
        let Some(g) = ctx
            .timed(
                "get",
                format!("AntstorVolumeGroup {gns}/{}", id.name),
                gapi.get_opt(&id.name),
            )
            .await?
        else {
            return Ok(Err(format!("waiting for AntstorVolumeGroup {}", id.name)));
        };
        for m in &g.spec.volumes {
            let vns = if m.vol_id.namespace.is_empty() {
                gns.clone()
            } else {
                m.vol_id.namespace.clone()
            };
            let vapi: Api<AntstorVolume> = Api::namespaced(ctx.client.clone(), &vns);
            let name = &m.vol_id.name;
            if let Some(v) = ctx
                .timed(
                    "get",
                    format!("AntstorVolume {vns}/{name}"),
                    vapi.get_opt(name),
                )
                .await?
            {
                vols.insert(name.clone(), v);
            }
        }
        groups.push(g);
    }
    Ok(Ok((groups, vols)))
}

/// Not assembled yet: say what for (a data control that is ready keeps serving and keeps its
/// status). The members' and groups' changes reconcile it again ([`triggers`]).
async fn wait(ctx: &Ctx, dc: &AntstorDataControl, why: &str) -> Result<Action> {
    if is_ready(dc) {
        debug!(
            reason = why,
            "assembled; a member is not as expected, the assembly keeps serving"
        );
        return Ok(Action::requeue(ctx.resync));
    }
    debug!(reason = why, "not assembled yet");
    let st = dc.status.clone().unwrap_or_default();
    if st.message != why || st.status != Some(VolumeStatus::Creating) {
        patch_status(
            ctx,
            &api(ctx, dc),
            dc,
            json!({"status": VolumeStatus::Creating, "message": why}),
        )
        .await?;
    }
    Ok(Action::requeue(ctx.resync))
}

/// Deleted: the assembly goes, then the finalizer (idempotent; nothing to do without it).
/// An assembly this node still serves after `spec.targetNodeId` moved to another node (the
/// controller moved it while this node was cut off, or this agent missed the change): torn
/// down here, so that this node neither serves the host nor holds its local replica open
/// (which the new assembling node needs exported). The data control's finalizer stays: the
/// new node's assembly keeps it.
async fn remove_moved(ctx: &Ctx, dc: &AntstorDataControl) -> Result<Action> {
    if !ctx.exporter.serves(&naming::subsys_nqn(&dc.spec.uuid)) || dc.spec.uuid.is_empty() {
        return Ok(Action::await_change());
    }
    let members = member_count(ctx, dc).await?;
    unassemble(
        ctx,
        "tear down the moved",
        &dc.name_any(),
        &dc.spec.uuid,
        None,
        members,
    )
    .await?;
    warn!(to = %dc.spec.target_node_id, "the assembly moved to another node: removed here");
    Ok(Action::await_change())
}

/// The members of `dc`'s groups (0 when they cannot be read): the groups outlive the data
/// control (the controller deletes them after it), and their count bounds the initiator
/// controllers to detach (the exporter finds them by name too).
async fn member_count(ctx: &Ctx, dc: &AntstorDataControl) -> Result<usize> {
    Ok(match read_members(ctx, dc).await? {
        Ok((groups, _)) => groups.iter().map(|g| g.spec.volumes.len()).sum(),
        Err(_) => 0,
    })
}

/// [`Exporter::remove_assembly`](crate::exporter::Exporter::remove_assembly) of assembly
/// `name` (`uuid`), its error saying `op`.
async fn unassemble(
    ctx: &Ctx,
    op: &'static str,
    name: &str,
    uuid: &str,
    target: Option<SpdkTarget>,
    members: usize,
) -> Result<()> {
    let req = UnassembleRequest {
        name: name.to_string(),
        uuid: uuid.to_string(),
        target,
        members,
    };
    ctx.exporter
        .remove_assembly(&req)
        .await
        .map_err(|source| AgentError::Assembly {
            op,
            data_control: name.to_string(),
            source,
        })
}

/// Data control `name` read from the API server within the request timeout; `None` when
/// that failed (logged, saying what waits for it).
async fn read_data_control(
    ctx: &Ctx,
    name: &str,
    waiting: &str,
) -> Option<Option<AntstorDataControl>> {
    let api: Api<AntstorDataControl> = Api::namespaced(ctx.client.clone(), keys::DEFAULT_NAMESPACE);
    match tokio::time::timeout(ctx.request_timeout, api.get_opt(name)).await {
        Ok(Ok(dc)) => Some(dc),
        Ok(Err(e)) => {
            debug!(data_control = %name, error = %e, "cannot read the data control; {waiting}");
            None
        }
        Err(_) => {
            debug!(data_control = %name, "no answer reading the data control; {waiting}");
            None
        }
    }
}

/// Removes assembly `name` (`uuid`), whose data control is gone.
async fn remove_orphan(ctx: &Ctx, name: &str, uuid: &str) -> Result<()> {
    unassemble(ctx, "tear down the orphaned", name, uuid, None, 0).await?;
    warn!(data_control = %name, "the data control of an assembly served here is gone: removed");
    Ok(())
}

async fn tear_down(ctx: &Ctx, dc: &AntstorDataControl) -> Result<Action> {
    if !has_finalizer(&dc.metadata, finalizers::ASSEMBLY) {
        return Ok(Action::await_change());
    }
    let members = member_count(ctx, dc).await?;
    let target = dc.status.as_ref().and_then(|s| s.spdk_target.clone());
    unassemble(
        ctx,
        "tear down",
        &dc.name_any(),
        &dc.spec.uuid,
        target,
        members,
    )
    .await?;
    remove_finalizers(ctx, &api(ctx, dc), dc, &[finalizers::ASSEMBLY]).await?;
    info!("assembly removed");
    Ok(Action::await_change())
}

/// The data controls (in the controller's cache `store`) that use group `group` of namespace
/// `ns`.
pub fn using_group(
    store: &Store<AntstorDataControl>,
    ns: &str,
    group: &str,
) -> Vec<ObjectRef<AntstorDataControl>> {
    store
        .state_filter(|dc| {
            let dns = namespace(dc);
            dc.spec.volume_groups.iter().any(|g| {
                g.name == group
                    && if g.namespace.is_empty() {
                        dns == ns
                    } else {
                        g.namespace == ns
                    }
            })
        })
        .iter()
        .map(|dc| ObjectRef::from_obj(dc.as_ref()))
        .collect()
}

/// The data controls to reconcile because one of their groups or members changed: watches
/// of the volume groups and of the member volumes (label `obnvmf/vol-group-name`), metadata
/// only, mapped through the data-control controller's cache `store`. Empty when the exporter
/// does not assemble.
pub(crate) fn triggers(
    ctx: &Arc<Ctx>,
    store: Store<AntstorDataControl>,
) -> BoxStream<'static, ObjectRef<AntstorDataControl>> {
    if !ctx.exporter.assembles() {
        return futures::stream::empty().boxed();
    }
    let vols: Api<PartialObjectMeta<AntstorVolume>> =
        Api::namespaced(ctx.client.clone(), keys::DEFAULT_NAMESPACE);
    let groups: Api<PartialObjectMeta<AntstorVolumeGroup>> =
        Api::namespaced(ctx.client.clone(), keys::DEFAULT_NAMESPACE);
    let s = store.clone();
    let swept = store.clone();
    let members = watcher(
        vols,
        watcher::Config::default().labels(labels::VOL_GROUP_NAME),
    )
    .default_backoff()
    .applied_objects()
    .map(move |r| match r {
        Ok(v) => match label(&v.metadata, labels::VOL_GROUP_NAME) {
            Some(g) => using_group(&s, &v.namespace().unwrap_or_default(), g),
            None => Vec::new(),
        },
        Err(e) => {
            warn!(error = %e, "cannot watch the member volumes of multi-disk volumes; retrying");
            Vec::new()
        }
    });
    let groups = watcher(groups, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .map(move |r| match r {
            Ok(g) => using_group(&store, &g.namespace().unwrap_or_default(), &g.name_any()),
            Err(e) => {
                warn!(error = %e, "cannot watch the volume groups; retrying");
                Vec::new()
            }
        });
    // Assemblies whose data control left this node's watch (its label names another node
    // now: the watch drops it without a reconcile) or is gone: swept here.
    let sweep = {
        let ctx = Arc::clone(ctx);
        futures::stream::unfold(swept, move |s| {
            let ctx = Arc::clone(&ctx);
            async move {
                tokio::time::sleep(SWEEP_EVERY).await;
                sweep_moved(&ctx, &s).await;
                Some((Vec::new(), s))
            }
        })
    };
    futures::stream::select(futures::stream::select(members, groups), sweep)
        .flat_map(futures::stream::iter)
        .boxed()
}

/// How long the Lease may go unrenewed before this node fences its replicated volumes:
/// three quarters of the Lease's duration (`heartbeat.duration`), so that the node holds its
/// mirrors' I/O before the controller, which counts the pool down once the Lease is older
/// than `liveness.unknownAfter` (at least the Lease's duration), moves them elsewhere.
pub fn self_fence_after(lease_duration: std::time::Duration) -> std::time::Duration {
    lease_duration * 3 / 4
}

/// The self-fence of replicated volumes: while this node's Lease has gone unrenewed for
/// longer than `after` (or was never renewed, `after` from the start), the exports of the
/// mirrors it assembles hold their I/O in the target ([`Exporter::fence_assembly`]): a node
/// cut off from the API server, whose assembly the controller may move to another replica's
/// node, acknowledges nothing more to its host on its local replica alone. Renewed again,
/// the fence is released (the held I/O runs) if the data control still names this node, and
/// an assembly that moved (or whose data control is gone) is torn down instead, which fails
/// the held I/O. Checked every 250 ms until `shutdown`.
///
/// [`Exporter::fence_assembly`]: crate::exporter::Exporter::fence_assembly
pub async fn self_fence(
    ctx: Arc<Ctx>,
    heartbeat: tokio::sync::watch::Receiver<crate::heartbeat::HeartbeatState>,
    after: std::time::Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let started = std::time::Instant::now();
    // The UUIDs of the mirrors fenced.
    let mut fenced: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_millis(250)) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        let age = heartbeat
            .borrow()
            .renewed_at
            .map_or_else(|| started.elapsed(), |t| t.elapsed());
        let stale = age > after;
        let mirrors: Vec<(String, String)> = ctx
            .exporter
            .assemblies()
            .into_iter()
            .filter(|a| a.mirror)
            .map(|a| (a.uuid, a.name))
            .collect();
        if stale {
            let new: Vec<&(String, String)> = mirrors
                .iter()
                .filter(|(u, _)| !fenced.contains(u))
                .collect();
            for (uuid, name) in new {
                match ctx.exporter.fence_assembly(uuid).await {
                    Ok(()) => {
                        warn!(data_control = %name, lease_age_ms = age.as_millis() as u64, "Lease not renewed: the replicated volume assembled here holds its I/O until it is");
                        fenced.insert(uuid.clone());
                    }
                    Err(e) => {
                        warn!(data_control = %name, error = %e, "cannot fence a replicated volume assembled here; retrying");
                    }
                }
            }
        } else {
            let held: Vec<&(String, String)> =
                mirrors.iter().filter(|(u, _)| fenced.contains(u)).collect();
            for (uuid, name) in held {
                if release(&ctx, uuid, name).await {
                    fenced.remove(uuid);
                }
            }
        }
        // Assemblies removed meanwhile need no release.
        fenced.retain(|u| mirrors.iter().any(|(m, _)| m == u));
    }
}

/// Ends the self-fence of mirror `name` (`uuid`) once the Lease is renewed: released if its
/// data control still names this node; torn down if it moved (the controller may have moved
/// it meanwhile: released first, it would serve the host its local replica alone until the
/// sweep saw the move) or is gone. False when that cannot be told yet (the API server not
/// answering): it stays fenced.
async fn release(ctx: &Arc<Ctx>, uuid: &str, name: &str) -> bool {
    let Some(dc) = read_data_control(ctx, name, "still fenced").await else {
        return false;
    };
    let res = match dc {
        Some(dc) if dc.spec.target_node_id == ctx.node && dc.spec.uuid == uuid => {
            match ctx.exporter.unfence_assembly(uuid).await {
                Ok(()) => {
                    info!(data_control = %name, "Lease renewed: the replicated volume's I/O runs again");
                    Ok(())
                }
                Err(source) => Err(AgentError::Assembly {
                    op: "release the fence of",
                    data_control: name.to_string(),
                    source,
                }),
            }
        }
        Some(dc) => remove_moved(ctx, &dc).await.map(|_| ()),
        None => remove_orphan(ctx, name, uuid).await,
    };
    match res {
        Ok(()) => true,
        Err(e) => {
            warn!(data_control = %name, error = %e.chain(), "cannot end the fence of a replicated volume; retrying");
            false
        }
    }
}

/// How often the assemblies this node serves are checked against their data controls.
pub const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Removes each assembly this node serves whose data control is not in this node's watch
/// (`store`) and, read from the API server, names another node (moved) or is gone.
/// Best effort: an API error leaves it for the next sweep.
async fn sweep_moved(ctx: &Ctx, store: &Store<AntstorDataControl>) {
    let served = ctx.exporter.assemblies();
    if served.is_empty() {
        return;
    }
    let here: std::collections::BTreeSet<String> = store
        .state()
        .iter()
        .filter(|dc| dc.spec.target_node_id == ctx.node)
        .map(|dc| dc.name_any())
        .collect();
    for a in served.into_iter().filter(|a| !here.contains(&a.name)) {
        let res = match read_data_control(ctx, &a.name, "next sweep").await {
            None => continue,
            Some(Some(dc)) if dc.spec.target_node_id == ctx.node => continue,
            Some(Some(dc)) => remove_moved(ctx, &dc).await.map(|_| ()),
            Some(None) => remove_orphan(ctx, &a.name, &a.uuid).await,
        };
        if let Err(e) = res {
            warn!(data_control = %a.name, error = %e.chain(), "cannot remove an assembly served here for another node; next sweep");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use liteio_api::group::{AntstorVolumeGroupSpec, EntityIdentity, VolumeMeta};
    use liteio_api::{NodeInfo, SpdkLvol};

    use super::*;

    const GIB: i64 = 1 << 30;

    fn group(name: &str, members: &[(&str, &str)]) -> AntstorVolumeGroup {
        AntstorVolumeGroup::new(
            name,
            AntstorVolumeGroupSpec {
                total_size: GIB * members.len() as i64,
                volumes: members
                    .iter()
                    .map(|(m, node)| VolumeMeta {
                        vol_id: EntityIdentity {
                            name: (*m).into(),
                            ..Default::default()
                        },
                        target_node_name: (*node).into(),
                        size: GIB,
                    })
                    .collect(),
                ..Default::default()
            },
        )
    }

    /// A ready member on `node` that admits `host`; exported to `host` when `exported`.
    fn member(name: &str, node: &str, host: &str, exported: bool) -> AntstorVolume {
        let mut v = AntstorVolume::new(
            name,
            liteio_api::AntstorVolumeSpec {
                target_node_id: node.into(),
                host_node: Some(NodeInfo {
                    id: host.into(),
                    ..Default::default()
                }),
                spdk_lvol: Some(SpdkLvol {
                    name: name.into(),
                    lvs_name: "lvs".into(),
                    thin: false,
                }),
                spdk_target: exported.then(|| SpdkTarget {
                    subsys_nqn: format!("nqn.{name}"),
                    address: "10.0.0.9".into(),
                    svc_id: "4420".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        v.status = Some(liteio_api::AntstorVolumeStatus {
            status: VolumeStatus::Ready,
            ..Default::default()
        });
        if exported {
            v.metadata.annotations = Some(BTreeMap::from([(
                annotations::EXPORTED_TO.to_string(),
                host.to_string(),
            )]));
        }
        v
    }

    fn by_name(vols: Vec<AntstorVolume>) -> BTreeMap<String, AntstorVolume> {
        vols.into_iter().map(|v| (v.name_any(), v)).collect()
    }

    #[test]
    fn members_come_in_the_groups_order_local_by_lvol_remote_by_export() {
        let groups = [
            group("g1", &[("a", "n2"), ("b", "n1")]),
            group("g2", &[("c", "n3")]),
        ];
        let vols = by_name(vec![
            member("a", "n2", "n1", true),
            member("b", "n1", "n1", false),
            member("c", "n3", "n1", true),
        ]);
        let m = assembly_members("n1", &groups, &vols).unwrap();
        let names: Vec<&str> = m.iter().map(|m| m.volume.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(
            matches!(&m[0].source, MemberSource::Remote { target } if target.subsys_nqn == "nqn.a")
        );
        assert!(
            matches!(&m[1].source, MemberSource::Local { lvol } if lvol.full_name() == "lvs/b")
        );
        assert_eq!(m[2].node, "n3");
    }

    #[test]
    fn each_missing_condition_is_what_it_waits_for() {
        let groups = [group("g", &[("a", "n2"), ("b", "n1")])];
        let wait =
            |vols: Vec<AntstorVolume>| assembly_members("n1", &groups, &by_name(vols)).unwrap_err();
        let local = || member("b", "n1", "n1", false);
        assert!(wait(vec![local()]).contains("waiting for member AntstorVolume a"));
        let mut unready = member("a", "n2", "n1", true);
        unready.status = None;
        assert!(wait(vec![unready, local()]).contains("member a to be ready"));
        assert!(
            wait(vec![member("a", "n2", "n9", true), local()])
                .contains("member a to admit this node")
        );
        // Exported, but to someone else still (its agent has not caught up).
        let mut elsewhere = member("a", "n2", "n1", true);
        elsewhere.metadata.annotations = None;
        assert!(
            wait(vec![elsewhere, local()])
                .contains("member a on node n2 to be exported to this node")
        );
        // The local member still has its own export.
        assert!(
            wait(vec![
                member("a", "n2", "n1", true),
                member("b", "n1", "n1", true)
            ])
            .contains("member b to be unexported")
        );
        let mut no_lvol = local();
        no_lvol.spec.spdk_lvol = None;
        assert!(wait(vec![member("a", "n2", "n1", true), no_lvol]).contains("needs SPDK lvols"));
        // Not fully placed.
        let mut g = group("g", &[("a", "n2")]);
        g.spec.total_size = 2 * GIB;
        assert!(
            assembly_members("n1", &[g], &BTreeMap::new())
                .unwrap_err()
                .contains("AntstorVolumeGroup g to be placed")
        );
    }

    #[test]
    fn linear_is_a_concat_raid0_a_raid0_raid1_a_mirror_and_nothing_else() {
        let mut dc = AntstorDataControl::new("d", Default::default());
        dc.spec.raid.level = RaidLevel::Linear;
        assert_eq!(level_of(&dc), Ok(AssemblyLevel::Concat));
        dc.spec.raid.level = RaidLevel::Raid0;
        assert_eq!(level_of(&dc), Ok(AssemblyLevel::Raid0));
        dc.spec.raid.level = RaidLevel::Raid1;
        assert_eq!(level_of(&dc), Ok(AssemblyLevel::Mirror));
        dc.spec.raid.level = RaidLevel::Raid5;
        assert_eq!(
            level_of(&dc).unwrap_err(),
            "spec.raid.level: raid5 is not assembled (linear, raid0 and raid1 are)"
        );
    }

    #[test]
    fn a_served_mirror_goes_on_without_the_replicas_it_cannot_reach() {
        let groups = [group("g", &[("a", "n2"), ("b", "n1"), ("c", "n3")])];
        let mut down = member("c", "n3", "n1", true);
        down.status = None;
        let vols = by_name(vec![
            member("a", "n2", "n1", true),
            member("b", "n1", "n1", false),
            down,
        ]);
        // A new volume waits for every replica; a served one takes the others and says why
        // the third is missing, in the groups' order.
        assert!(assembly_members("n1", &groups, &vols).is_err());
        let m = mirror_members("n1", &groups, &vols).unwrap();
        let names: Vec<&str> = m.iter().map(|m| m.volume.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(matches!(&m[0].source, MemberSource::Remote { .. }));
        assert!(matches!(&m[1].source, MemberSource::Local { .. }));
        assert!(
            matches!(&m[2].source, MemberSource::Absent { reason } if reason.contains("member c to be ready")),
            "{:?}",
            m[2]
        );
        assert_eq!(m[2].node, "n3");
        // A group that is not placed is still waited for.
        let mut g = group("g", &[("a", "n2")]);
        g.spec.total_size = 2 * GIB;
        assert!(mirror_members("n1", &[g], &vols).is_err());
    }

    #[test]
    fn replica_reports_are_written_when_they_change_and_keep_their_since() {
        use liteio_api::replica::{ReplicaState, ReplicaStatus};
        let r = |v: &str, st: ReplicaState, pct: Option<u8>| ReplicaStatus {
            volume: v.into(),
            node: "n".into(),
            state: st,
            rebuild_percent: pct,
            rebuilt_bytes: None,
            since: None,
            message: String::new(),
        };
        let old = with_since(&[], vec![r("a", ReplicaState::Online, None)]);
        assert!(old[0].since.is_some());
        assert!(!replicas_changed(
            &old,
            &[r("a", ReplicaState::Online, None)]
        ));
        assert!(replicas_changed(
            &old,
            &[r("a", ReplicaState::Failed, None)]
        ));
        assert!(replicas_changed(
            &old,
            &[r("b", ReplicaState::Online, None)]
        ));
        let rebuilding = with_since(&[], vec![r("a", ReplicaState::Rebuilding, Some(10))]);
        assert!(replicas_changed(
            &rebuilding,
            &[r("a", ReplicaState::Rebuilding, Some(11))]
        ));
        // The same state keeps its time; a new one gets a new time.
        let kept = with_since(&old, vec![r("a", ReplicaState::Online, None)]);
        assert_eq!(kept[0].since, old[0].since);
        let moved = with_since(&old, vec![r("a", ReplicaState::Failed, None)]);
        assert!(moved[0].since.is_some());
    }
}
