//! CreateVolume and DeleteVolume of plain volumes (one AntstorVolume each; multi-disk
//! volumes go to [`super::group`]).
//!
//! CreateVolume: the checked request ([`super::checks::create_volume`]) becomes what is
//! wanted ([`Wanted`]); an existing volume of that name must be the same ([`differences`],
//! else ALREADY_EXISTS), a new one is built ([`ControllerService::build_volume`]: the PVC's
//! annotations, the consuming node, the source snapshot) and created, its authentication
//! Secret made ([`ControllerService::ensure_keys`]), and then it waits, bounded, until the
//! node-disk-controller scheduled it ([`schedule_outcome`]). DeleteVolume deletes the volume
//! and its Secret; idempotent.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, PostParams};
use liteio_api::auth::{self, VolumeKeys};
use liteio_api::host_auth::HostAuthPolicy;
use liteio_api::keys::{self, annotations, labels};
use liteio_api::qos::VolumeQos;
use liteio_api::snapshot::SnapshotStatusName;
use liteio_api::{
    AntstorSnapshot, AntstorVolume, AntstorVolumeSpec, VolumePosition, VolumeType, size,
};
use tracing::{info, warn};

use super::answer::{ANNO_SOURCE_SNAP_ID, csi_volume, i64_of, volume_fs};
use super::checks::{self, CreateKind};
use super::{ControllerService, MSG_INVALID, MSG_NO_POOL};
use crate::csi::{CreateVolumeRequest, DeleteVolumeRequest, Volume};
use crate::error::{CsiError, Result};
use crate::group;
use crate::k8s::{self, Waited};
use crate::params::{self, VolumeParams};

/// What the request asks for, in the form stored on the AntstorVolume; compared field by
/// field for idempotency.
#[derive(Debug)]
struct Wanted {
    tls: bool,
    host_auth: Option<HostAuthPolicy>,
    /// Unlimited: no limits.
    qos: VolumeQos,
    size: u64,
    fs: String,
    volume_type: VolumeType,
    position: VolumePosition,
    snapshot: Option<(String, String)>,
}

fn differences(v: &AntstorVolume, w: &Wanted) -> Vec<String> {
    let mut out = Vec::new();
    if v.spec.size_byte != w.size {
        out.push(format!(
            "spec.sizeByte is {} but the request needs {}",
            v.spec.size_byte, w.size
        ));
    }
    let fs = volume_fs(v);
    if fs != w.fs {
        out.push(format!("fsType is {fs} but the request asks for {}", w.fs));
    }
    // The agent turns Flexible into the pool's type; only an explicit mismatch counts.
    if w.volume_type != VolumeType::Flexible && v.spec.type_.unwrap_or_default() != w.volume_type {
        out.push(format!(
            "spec.type is {} but the request asks for {}",
            v.spec.type_.unwrap_or_default(),
            w.volume_type
        ));
    }
    if v.spec.position_advice != w.position {
        out.push(format!(
            "spec.positionAdvice is {:?} but the request asks for {:?}",
            v.spec.position_advice.to_string(),
            w.position.to_string()
        ));
    }
    let tls = v
        .annotations()
        .get(annotations::NVMF_TLS)
        .is_some_and(|t| t == "true");
    if tls != w.tls {
        out.push(format!(
            "nvmfTls is {tls} but the request asks for {}",
            w.tls
        ));
    }
    if v.spec.host_auth.unwrap_or_default() != w.host_auth.unwrap_or_default() {
        out.push(format!(
            "spec.hostAuth is {} but the request asks for {}",
            v.spec.host_auth.unwrap_or_default(),
            w.host_auth.unwrap_or_default()
        ));
    }
    if v.spec.qos.unwrap_or_default() != w.qos {
        out.push(format!(
            "spec.qos is {} but the request asks for {}",
            v.spec.qos.unwrap_or_default().summary(),
            w.qos.summary()
        ));
    }
    let src = liteio_api::meta::source_snapshot(&v.metadata).map(|(_, name)| name.to_string());
    if src != w.snapshot.as_ref().map(|s| s.0.clone()) {
        out.push(format!(
            "the volume's source snapshot is {src:?} but the request asks for {:?}",
            w.snapshot.as_ref().map(|s| &s.0)
        ));
    }
    out
}

/// Outcome of waiting for a volume to be scheduled.
fn schedule_outcome(v: &AntstorVolume) -> Option<Result<()>> {
    if v.target_node().is_some() {
        return Some(Ok(()));
    }
    let msg = v
        .status
        .as_ref()
        .map(|s| s.message.trim())
        .unwrap_or_default();
    if msg.is_empty() {
        return None;
    }
    let name = v.name_any();
    Some(Err(if msg.starts_with(MSG_NO_POOL) {
        CsiError::ResourceExhausted(format!("volume {name} cannot be scheduled: {msg}"))
    } else if msg.starts_with(MSG_INVALID) {
        CsiError::invalid("parameters", format!("volume {name} was rejected: {msg}"))
    } else {
        CsiError::FailedPrecondition(format!("volume {name} is not scheduled: {msg}"))
    }))
}

impl ControllerService {
    /// Builds the AntstorVolume a CreateVolume request describes.
    async fn build_volume(
        &self,
        req: &CreateVolumeRequest,
        p: &VolumeParams,
        w: &Wanted,
        snap: Option<&AntstorSnapshot>,
    ) -> Result<AntstorVolume> {
        let mut labels_map = BTreeMap::new();
        let mut annos = BTreeMap::new();
        let mut host_node = checks::topology_node(req.accessibility_requirements.as_ref());
        let mut volume_type = p.volume_type;
        let mut position = p.position;
        if let (Some(pvc_name), Some(pvc_ns)) = (&p.pvc_name, &p.pvc_namespace) {
            labels_map.insert(labels::PVC_NAME.to_string(), pvc_name.clone());
            labels_map.insert(labels::PVC_NAMESPACE.to_string(), pvc_ns.clone());
            let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), pvc_ns);
            match k8s::get_opt(&pvcs, "PersistentVolumeClaim", pvc_name).await? {
                Some(pvc) => {
                    annos.extend(params::obnvmf_annotations(pvc.annotations()));
                    if let Some(n) = pvc.annotations().get(annotations::K8S_SELECTED_NODE) {
                        host_node = Some(n.clone());
                    }
                    if let Some(t) = pvc.annotations().get(annotations::VOLUME_TYPE) {
                        volume_type =
                            t.parse()
                                .map_err(|e: liteio_api::validate::ValidationError| {
                                    CsiError::invalid(
                                        format!(
                                            "PVC {pvc_ns}/{pvc_name} annotation {}",
                                            annotations::VOLUME_TYPE
                                        ),
                                        e.reason,
                                    )
                                })?;
                    }
                    if let Some(a) = pvc.annotations().get(annotations::SDS_POSITION_ADVICE) {
                        position =
                            a.parse()
                                .map_err(|e: liteio_api::validate::ValidationError| {
                                    CsiError::invalid(
                                        format!(
                                            "PVC {pvc_ns}/{pvc_name} annotation {}",
                                            annotations::SDS_POSITION_ADVICE
                                        ),
                                        e.reason,
                                    )
                                })?;
                    }
                    if let Some(h) = pvc.labels().get(labels::DATA_HOLDER) {
                        labels_map.insert(labels::DATA_HOLDER.to_string(), h.clone());
                    }
                }
                None => {
                    warn!(pvc = %format!("{pvc_ns}/{pvc_name}"), "PVC named by the request does not exist; creating the volume without its annotations")
                }
            }
        }
        if position == VolumePosition::MustLocal && host_node.is_none() {
            return Err(CsiError::invalid(
                "accessibility_requirements",
                "positionAdvice MustLocal needs the consuming node (the PVC's volume.kubernetes.io/selected-node or a kubernetes.io/hostname topology)",
            ));
        }
        let obj_name = params::object_name(&req.name);
        if obj_name != req.name {
            annos.insert(params::ANNO_CSI_NAME.to_string(), req.name.clone());
        }
        if p.nvmf_tls {
            annos.insert(annotations::NVMF_TLS.to_string(), "true".to_string());
        }
        let uuid = uuid::Uuid::new_v4().to_string();
        labels_map.insert(labels::VOL_UUID.to_string(), uuid.clone());
        labels_map.insert(labels::FS_TYPE.to_string(), w.fs.clone());
        labels_map.insert(
            labels::PV_NAME.to_string(),
            p.pv_name.clone().unwrap_or_else(|| obj_name.clone()),
        );
        annos.insert(annotations::FS_TYPE.to_string(), w.fs.clone());
        if !p.mkfs_params.is_empty() {
            annos.insert(
                keys::SC_PARAM_MKFS_PARAMS.to_string(),
                p.mkfs_params.clone(),
            );
        }
        if let Some(s) = snap {
            labels_map.insert(labels::VOLUME_SOURCE_SNAP_NAME.to_string(), s.name_any());
            labels_map.insert(
                labels::VOLUME_SOURCE_SNAP_NS.to_string(),
                s.namespace().unwrap_or_default(),
            );
            annos.insert(ANNO_SOURCE_SNAP_ID.to_string(), s.spec.uuid.clone());
            annos.insert(
                annotations::POOL_LABEL_SELECTOR.to_string(),
                format!("{}={}", labels::NODE_SN, s.spec.origin_vol_target_node_id),
            );
        }
        let host_node = match host_node {
            Some(n) => Some(self.node_info(&n).await?),
            None => None,
        };
        Ok(AntstorVolume {
            metadata: ObjectMeta {
                name: Some(obj_name),
                namespace: Some(self.cfg.namespace.clone()),
                labels: Some(labels_map),
                annotations: Some(annos),
                ..ObjectMeta::default()
            },
            spec: AntstorVolumeSpec {
                uuid,
                type_: Some(volume_type),
                size_byte: w.size,
                position_advice: position,
                host_node,
                host_auth: p.host_auth,
                qos: (!w.qos.is_unlimited()).then_some(w.qos),
                ..AntstorVolumeSpec::default()
            },
            status: None,
        })
    }

    /// The snapshot of id `id` (checked by [`checks::create_volume`]), when the request
    /// names one.
    async fn source_snapshot(&self, id: Option<&str>) -> Result<Option<AntstorSnapshot>> {
        let Some(id) = id else {
            return Ok(None);
        };
        let snap = k8s::snapshot_by_uuid(&self.snapshots(), id)
            .await?
            .ok_or_else(|| CsiError::NotFound(format!("snapshot {id} does not exist")))?;
        Ok(Some(snap))
    }

    pub(super) async fn create_volume_inner(&self, req: &CreateVolumeRequest) -> Result<Volume> {
        let checks::CreateVolume {
            csi_name,
            name: obj_name,
            params: p,
            mut size,
            fs,
            kind,
        } = checks::create_volume(req)?;
        let name = obj_name.as_str();
        let snapshot_id = match kind {
            CreateKind::Group(want) => return self.create_group(name, want).await,
            CreateKind::Plain { snapshot } => snapshot,
        };
        let snap = self.source_snapshot(snapshot_id).await?;
        if let Some(s) = &snap {
            if s.status.as_ref().map(|st| st.status) != Some(SnapshotStatusName::Ready) {
                return Err(CsiError::FailedPrecondition(format!(
                    "snapshot {} is not ready yet",
                    s.spec.uuid
                )));
            }
            let snap_size = u64::try_from(s.spec.size).unwrap_or(0);
            if size < snap_size {
                let limit = req.capacity_range.as_ref().map_or(0, |r| r.limit_bytes);
                if limit > 0 && i64_of(snap_size) > limit {
                    return Err(CsiError::OutOfRange(format!(
                        "capacity_range.limit_bytes: {limit} is smaller than snapshot {} ({snap_size} bytes)",
                        s.spec.uuid
                    )));
                }
                size = size::round_up(snap_size, size::VOLUME_UNIT)
                    .map_err(|e| CsiError::OutOfRange(e.to_string()))?;
            }
        }
        // The class's limits, with the VolumeAttributesClass's (mutable_parameters) over them.
        let class_qos = p.qos.unwrap_or_default();
        let qos = params::mutable_qos(&req.mutable_parameters, class_qos)?.unwrap_or(class_qos);
        let wanted = Wanted {
            tls: p.nvmf_tls,
            host_auth: p.host_auth,
            qos,
            size,
            fs,
            volume_type: p.volume_type,
            position: p.position,
            snapshot: snap
                .as_ref()
                .map(|s| (s.name_any(), s.namespace().unwrap_or_default())),
        };
        let _guard = self.inflight.claim(&format!("volume {csi_name}"))?;
        let api = self.volumes();
        let existing = match k8s::get_opt(&api, "AntstorVolume", name).await? {
            // The same name right after its DeleteVolume (csi-sanity does it; so may a CO
            // that reuses names): the old volume is not the one asked for. Wait for it to
            // go, then create a new one.
            Some(old) if old.metadata.deletion_timestamp.is_some() => {
                match k8s::wait_for(
                    api.clone(),
                    "AntstorVolume",
                    name,
                    self.cfg.schedule_timeout,
                    |_: &AntstorVolume| false,
                )
                .await?
                {
                    Waited::Gone => None,
                    _ => {
                        return Err(CsiError::Busy(format!(
                            "volume {name} (id {}) is still being deleted; a new volume of that name is created once it is gone",
                            old.spec.uuid
                        )));
                    }
                }
            }
            other => other,
        };
        let vol = match existing {
            Some(existing) => {
                let diff = differences(&existing, &wanted);
                if !diff.is_empty() {
                    return Err(CsiError::AlreadyExists(format!(
                        "volume {name} exists with other parameters: {}",
                        diff.join("; ")
                    )));
                }
                existing
            }
            None => {
                let v = self.build_volume(req, &p, &wanted, snap.as_ref()).await?;
                match api.create(&PostParams::default(), &v).await {
                    Ok(created) => {
                        info!(volume = name, uuid = %created.spec.uuid, size, "AntstorVolume created");
                        created
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        return Err(CsiError::Busy(format!(
                            "volume {name} was created concurrently; retry"
                        )));
                    }
                    Err(e) => {
                        return Err(CsiError::kube(format!("create AntstorVolume {name}"), e));
                    }
                }
            }
        };
        self.ensure_keys(&vol).await?;
        let vol = match schedule_outcome(&vol) {
            Some(Ok(())) => vol,
            Some(Err(e)) => return Err(e),
            None => {
                match k8s::wait_for(
                    api,
                    "AntstorVolume",
                    name,
                    self.cfg.schedule_timeout,
                    |v: &AntstorVolume| schedule_outcome(v).is_some(),
                )
                .await?
                {
                    Waited::Done(v) => {
                        if let Some(Err(e)) = schedule_outcome(&v) {
                            return Err(e);
                        }
                        v
                    }
                    Waited::Gone => {
                        return Err(CsiError::Busy(format!(
                            "volume {name} was deleted while waiting for it to be scheduled; retry"
                        )));
                    }
                    Waited::TimedOut => {
                        return Err(CsiError::Pending(format!(
                            "volume {name} is not scheduled to a storage pool after {}s; the controller may still be working on it, retry",
                            self.cfg.schedule_timeout.as_secs()
                        )));
                    }
                }
            }
        };
        let mut volume = csi_volume(&vol, &req.parameters);
        if let Some(src) = &req.volume_content_source {
            volume.content_source = Some(src.clone());
        }
        Ok(volume)
    }

    /// The volume's authentication Secret (DH-HMAC-CHAP keys for its NVMe/TCP export), made
    /// now when missing: kubelet reads it before NodeStageVolume (the StorageClass names it
    /// as the node-stage secret), also for a volume that ends up on its consumer's node and
    /// is never exported.
    async fn ensure_keys(&self, vol: &AntstorVolume) -> Result<()> {
        self.ensure_keys_owned(vol, None).await
    }

    /// [`Self::ensure_keys`], the Secret owned by `owner` instead of by `vol` when given (a
    /// multi-disk volume's keys belong to its data control).
    pub(super) async fn ensure_keys_owned(
        &self,
        vol: &AntstorVolume,
        owner: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
    ) -> Result<()> {
        let name = vol.auth_secret_name();
        let api = self.secrets();
        if k8s::get_opt(&api, "Secret", &name).await?.is_some() {
            return Ok(());
        }
        let tls = vol
            .annotations()
            .get(annotations::NVMF_TLS)
            .is_some_and(|v| v == "true");
        let keys = VolumeKeys::generate(tls)
            .map_err(|e| CsiError::Internal(format!("generate the keys of Secret {name}: {e}")))?;
        let mut secret =
            auth::volume_secret(vol, &keys).map_err(|e| CsiError::invalid("name", e.reason))?;
        if let Some(o) = owner {
            secret.metadata.owner_references = Some(vec![o]);
        }
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => {
                info!(secret = %name, "authentication keys generated");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(CsiError::kube(format!("create Secret {name}"), e)),
        }
    }

    pub(super) async fn delete_volume_inner(&self, req: &DeleteVolumeRequest) -> Result<()> {
        let id = checks::volume_id(&req.volume_id)?;
        if group::is_group_id(id) {
            return self.delete_group(id).await;
        }
        let _guard = self.inflight.claim(&format!("volume {id}"))?;
        let Some(v) = self.by_uuid.volume(&self.volumes(), id).await? else {
            return Ok(());
        };
        let name = v.name_any();
        if k8s::delete_opt(&self.volumes(), "AntstorVolume", &name).await? {
            info!(volume = %name, uuid = id, "AntstorVolume deletion requested");
        }
        // Its keys go with it (the Secret is also owned by the volume, for the garbage
        // collector; this is for API servers without one).
        let secret = v.auth_secret_name();
        k8s::delete_opt(&self.secrets(), "Secret", &secret).await?;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use liteio_api::VolumeStatus;
    use std::collections::HashMap;

    use crate::controller::answer::hostname_topology;

    fn vol(target: &str, msg: &str) -> AntstorVolume {
        let mut v = AntstorVolume::new("pvc-1", AntstorVolumeSpec::default());
        v.spec.target_node_id = target.into();
        v.status = Some(liteio_api::AntstorVolumeStatus {
            status: VolumeStatus::Creating,
            message: msg.into(),
            ..Default::default()
        });
        v
    }

    #[test]
    fn scheduling_outcomes_map_to_codes() {
        assert!(schedule_outcome(&vol("", "")).is_none());
        assert!(matches!(schedule_outcome(&vol("n1", "")), Some(Ok(()))));
        let e = schedule_outcome(&vol("", "NoStoragePoolAvailable: PoolFreeSize: 2"))
            .unwrap()
            .unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::ResourceExhausted);
        assert!(e.to_string().contains("PoolFreeSize: 2"));
        let e = schedule_outcome(&vol("", "invalid volume: bad layout"))
            .unwrap()
            .unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::InvalidArgument);
    }

    #[test]
    fn idempotency_compares_fields() {
        let mut v = vol("n1", "");
        v.spec.size_byte = 8 << 20;
        let same = Wanted {
            tls: false,
            host_auth: None,
            qos: VolumeQos::default(),
            size: 8 << 20,
            fs: "xfs".into(),
            volume_type: VolumeType::Flexible,
            position: VolumePosition::NoPreference,
            snapshot: None,
        };
        assert!(differences(&v, &same).is_empty());
        let other = Wanted {
            size: 12 << 20,
            fs: "ext4".into(),
            ..same
        };
        let d = differences(&v, &other);
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d[0].starts_with("spec.sizeByte"));
        let tls = Wanted {
            tls: true,
            host_auth: None,
            qos: VolumeQos::default(),
            size: 8 << 20,
            fs: "xfs".into(),
            volume_type: VolumeType::Flexible,
            position: VolumePosition::NoPreference,
            snapshot: None,
        };
        assert_eq!(
            differences(&v, &tls),
            vec!["nvmfTls is false but the request asks for true".to_string()]
        );
        // An absent spec.hostAuth is required: asking for required again is the same volume.
        let required = Wanted {
            tls: false,
            host_auth: Some(HostAuthPolicy::Required),
            qos: VolumeQos::default(),
            size: 8 << 20,
            fs: "xfs".into(),
            volume_type: VolumeType::Flexible,
            position: VolumePosition::NoPreference,
            snapshot: None,
        };
        assert!(differences(&v, &required).is_empty());
        let preferred = Wanted {
            host_auth: Some(HostAuthPolicy::Preferred),
            fs: required.fs.clone(),
            snapshot: None,
            ..required
        };
        assert_eq!(
            differences(&v, &preferred),
            vec!["spec.hostAuth is required but the request asks for preferred".to_string()]
        );
        // QoS limits are part of the volume asked for.
        let limited = Wanted {
            qos: VolumeQos {
                iops: 2000,
                ..Default::default()
            },
            ..required
        };
        assert_eq!(
            differences(&v, &limited),
            vec!["spec.qos is unlimited but the request asks for 2000 IOPS".to_string()]
        );
    }

    #[test]
    fn must_local_volume_reports_topology() {
        let mut v = vol("n1", "");
        v.spec.uuid = "u1".into();
        v.spec.position_advice = VolumePosition::MustLocal;
        let c = csi_volume(&v, &HashMap::new());
        assert_eq!(c.accessible_topology, vec![hostname_topology("n1")]);
        assert_eq!(
            c.volume_context.get(params::CTX_UUID).map(String::as_str),
            Some("u1")
        );
        v.spec.position_advice = VolumePosition::NoPreference;
        assert!(
            csi_volume(&v, &HashMap::new())
                .accessible_topology
                .is_empty()
        );
        // Placed where only its node can use it: the controller says so.
        v.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(annotations::LOCAL_ONLY.into(), "true".into());
        assert_eq!(
            csi_volume(&v, &HashMap::new()).accessible_topology,
            vec![hostname_topology("n1")]
        );
    }
}
