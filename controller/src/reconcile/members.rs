//! What a volume group is made of, for the reconcilers that act on it: its members' keys,
//! type and volumes (`members`, `unrecorded_members`), the data control it belongs to
//! ([`data_control_key`]), the creation of a member owned by the group (`create_member`)
//! and the writer of the group's status (`group_status`). The group reconciler
//! ([`super::group`]) and the replicated-volume steps it calls ([`super::replicated`]) both
//! use these, so the two import this room and never each other back.

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::{Api, PostParams};
use liteio_api::AntstorVolume;
use liteio_api::common::{VolumeStatus, VolumeType};
use liteio_api::group::{AntstorVolumeGroup, VolumeMeta, VolumeTargetStatus};
use liteio_api::keys::{annotations, labels};
use serde_json::json;
use tracing::info;

use super::Context;
use crate::error::{Error, Result};
use crate::group_scheduler;
use crate::state::ObjectKey;

/// The members' volume type a group asks for (`obnvmf/volume-type` in
/// `desiredVolumeSpec.annotations`; Flexible when absent or unknown).
pub fn member_type(g: &AntstorVolumeGroup) -> VolumeType {
    g.spec
        .desired_volume_spec
        .annotations
        .get(annotations::VOLUME_TYPE)
        .and_then(|t| t.parse().ok())
        .unwrap_or(VolumeType::Flexible)
}

/// The data control a group belongs to: label `obnvmf/data-control-name`, else the group's
/// own name (the CSI driver names both after the PV).
pub fn data_control_key(g: &AntstorVolumeGroup) -> ObjectKey {
    let ns = g.namespace().unwrap_or_default();
    let name = liteio_api::meta::label(&g.metadata, labels::DATA_CONTROL_NAME)
        .map_or_else(|| g.name_any(), str::to_string);
    ObjectKey::new(ns, name)
}

/// The key of the member `m` of a group in `group_ns` (its own namespace when it names one).
pub fn member_key(m: &VolumeMeta, group_ns: &str) -> ObjectKey {
    let ns = if m.vol_id.namespace.is_empty() {
        group_ns.to_string()
    } else {
        m.vol_id.namespace.clone()
    };
    ObjectKey::new(ns, m.vol_id.name.clone())
}

/// The recorded members of `g` as the state has them (`None`: not in the API server yet).
pub(super) fn members(
    ctx: &Context,
    g: &AntstorVolumeGroup,
) -> Vec<(VolumeMeta, Option<Arc<AntstorVolume>>)> {
    let ns = g.namespace().unwrap_or_default();
    let state = ctx.state();
    g.spec
        .volumes
        .iter()
        .map(|m| {
            let v = state
                .volume(&member_key(m, &ns))
                .filter(|v| v.metadata.resource_version.is_some())
                .cloned();
            (m.clone(), v)
        })
        .collect()
}

/// The volumes labelled as members of `g` (`obnvmf/vol-group-name`) that its
/// `spec.volumes` does not record.
pub(super) fn unrecorded_members(ctx: &Context, g: &AntstorVolumeGroup) -> Vec<Arc<AntstorVolume>> {
    let ns = g.namespace().unwrap_or_default();
    let name = g.name_any();
    let recorded: Vec<&str> = g
        .spec
        .volumes
        .iter()
        .map(|m| m.vol_id.name.as_str())
        .collect();
    let state = ctx.state();
    state
        .volume_keys()
        .iter()
        .filter(|k| k.namespace == ns && !recorded.contains(&k.name.as_str()))
        .filter_map(|k| state.volume(k))
        .filter(|v| {
            v.metadata.resource_version.is_some()
                && liteio_api::meta::label(&v.metadata, labels::VOL_GROUP_NAME)
                    == Some(name.as_str())
        })
        .cloned()
        .collect()
}

/// True when the volume's status is Ready.
pub(super) fn is_ready(v: &AntstorVolume) -> bool {
    v.status
        .as_ref()
        .is_some_and(|s| s.status == VolumeStatus::Ready)
}

/// Writes the group's `status` (its state, message and, when given, the members' statuses);
/// nothing when it says so already.
pub(super) async fn group_status(
    ctx: &Context,
    g: &AntstorVolumeGroup,
    status: VolumeStatus,
    message: &str,
    members: Option<Vec<VolumeTargetStatus>>,
) -> Result<()> {
    let cur = g.status.clone().unwrap_or_default();
    let mut want = cur.clone();
    want.status = Some(status);
    want.message = message.to_string();
    if let Some(m) = members {
        want.volume_status = m;
    }
    if want == cur {
        return Ok(());
    }
    let key = ObjectKey::of(g);
    // Explicit nulls: an empty message or member list is left out when serialized, and a
    // merge patch would keep the old one.
    let body = json!({ "status": {
        "status": want.status,
        "message": if want.message.is_empty() { serde_json::Value::Null } else { json!(want.message) },
        "volumeStatus": if want.volume_status.is_empty() { serde_json::Value::Null } else { json!(want.volume_status) },
    }});
    let out: AntstorVolumeGroup = ctx.patch(&key.namespace, &key.name, &body, true).await?;
    ctx.upsert_group(Arc::new(out));
    Ok(())
}

/// The owner reference a member carries: the group (so the members go with it).
fn owner(g: &AntstorVolumeGroup) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: liteio_api::keys::API_VERSION.into(),
        kind: "AntstorVolumeGroup".into(),
        name: g.name_any(),
        uid: g.uid().unwrap_or_default(),
        block_owner_deletion: Some(true),
        controller: Some(true),
    }
}

/// Creates the member volume `m` of `g` (owned by the group) through `api` and records it in
/// the state; one that exists already is left as it is. `what` is the log line of a creation.
pub(super) async fn create_member(
    ctx: &Context,
    api: &Api<AntstorVolume>,
    g: &AntstorVolumeGroup,
    m: &VolumeMeta,
    mtype: VolumeType,
    what: &str,
) -> Result<()> {
    let mut vol = group_scheduler::member_volume(g, m, mtype);
    vol.metadata.owner_references = Some(vec![owner(g)]);
    match api.create(&PostParams::default(), &vol).await {
        Ok(created) => {
            info!(member = %m.vol_id.name, node = %m.target_node_name, size = m.size, "{what}");
            ctx.state().upsert_volume(Arc::new(created));
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(
            format!("create member AntstorVolume {}", m.vol_id.name),
            e,
        )),
    }
}
