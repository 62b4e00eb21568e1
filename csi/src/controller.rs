//! The CSI Controller service: AntstorVolume and AntstorSnapshot objects on behalf of the
//! external provisioner, resizer and snapshotter.
//!
//! The driver never schedules or provisions: CreateVolume writes an AntstorVolume and waits,
//! bounded by [`DriverConfig::schedule_timeout`], for the node-disk-controller to set
//! `spec.targetNodeId` (or to explain in `status.msg` why it cannot). Every call is idempotent
//! and a call that cannot finish yet returns a retryable code instead of hanging.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Secret};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use liteio_api::auth::{self, VolumeKeys};
use liteio_api::host_auth::HostAuthPolicy;
use liteio_api::keys::{self, annotations, labels};
use liteio_api::qos::VolumeQos;
use liteio_api::snapshot::{SnapshotStatusName, SnapshotVolType};
use liteio_api::{
    AntstorSnapshot, AntstorSnapshotSpec, AntstorVolume, AntstorVolumeSpec, NodeInfo, StoragePool,
    VolumePosition, VolumeType, size,
};
use tonic::{Request, Response, Status};
use tracing::{info, instrument, warn};

use crate::config::DriverConfig;
use crate::csi::controller_server::Controller;
use crate::csi::controller_service_capability::rpc::Type as RpcType;
use crate::csi::volume_content_source::Type as SourceType;
use crate::csi::*;
use crate::error::{CsiError, Result};
use crate::group;
use crate::k8s::{self, Inflight, Waited};
use crate::params::{self, VolumeParams};
use crate::publish;

/// Capabilities the controller advertises.
pub const CONTROLLER_CAPABILITIES: [RpcType; 8] = [
    RpcType::CreateDeleteVolume,
    RpcType::PublishUnpublishVolume,
    RpcType::ExpandVolume,
    RpcType::CreateDeleteSnapshot,
    RpcType::ListSnapshots,
    RpcType::ListVolumes,
    RpcType::GetCapacity,
    RpcType::ModifyVolume,
];

/// Prefix of the controller's message when no pool fits (RESOURCE_EXHAUSTED).
pub const MSG_NO_POOL: &str = "NoStoragePoolAvailable";
/// Prefix of the controller's message when the volume is invalid (INVALID_ARGUMENT).
pub const MSG_INVALID: &str = "invalid volume";

/// The Controller service.
#[derive(Clone)]
pub struct ControllerService {
    pub(crate) client: Client,
    pub(crate) cfg: Arc<DriverConfig>,
    pub(crate) inflight: Inflight,
    /// Volume names by uuid, for the calls that name a volume by its id.
    pub(crate) by_uuid: crate::uuid_index::UuidIndex,
}

fn ts(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.0.as_second(),
        nanos: t.0.subsec_nanosecond(),
    }
}

fn i64_of(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

fn require<'a>(field: &str, v: &'a str) -> Result<&'a str> {
    if v.trim().is_empty() {
        Err(CsiError::invalid(field, "is required"))
    } else {
        Ok(v)
    }
}

use liteio_api::meta::{annotation, label};

/// The filesystem recorded on a volume (label, then annotation, then xfs).
pub fn volume_fs(v: &AntstorVolume) -> String {
    label(&v.metadata, labels::FS_TYPE)
        .or_else(|| annotation(&v.metadata, annotations::FS_TYPE))
        .filter(|s| !s.is_empty())
        .unwrap_or(params::DEFAULT_FS)
        .to_string()
}

/// The topology segment that pins a volume to `node`.
pub fn hostname_topology(node: &str) -> Topology {
    Topology {
        segments: HashMap::from([(labels::KUBE_HOSTNAME.to_string(), node.to_string())]),
    }
}

/// The node a request's topology points at (`kubernetes.io/hostname`), preferred first.
fn topology_node(req: Option<&TopologyRequirement>) -> Option<String> {
    let r = req?;
    r.preferred
        .iter()
        .chain(r.requisite.iter())
        .find_map(|t| t.segments.get(labels::KUBE_HOSTNAME).cloned())
}

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

/// The CSI volume of an AntstorVolume.
pub fn csi_volume(v: &AntstorVolume, extra_ctx: &HashMap<String, String>) -> Volume {
    let fs = volume_fs(v);
    let mut ctx = params::volume_context(extra_ctx, &v.spec.uuid, &v.spec.target_node_id, &fs);
    if let Some(m) = annotation(&v.metadata, keys::SC_PARAM_MKFS_PARAMS) {
        ctx.insert(keys::SC_PARAM_MKFS_PARAMS.into(), m.into());
    }
    // Usable only on its node: asked so (MustLocal), or placed on a pool that cannot export
    // it (the controller's `obnvmf/local-only`; see the scheduler's rules).
    let local_only = v.spec.position_advice == VolumePosition::MustLocal
        || annotation(&v.metadata, annotations::LOCAL_ONLY) == Some("true");
    let accessible_topology = if local_only {
        v.target_node()
            .map(|n| vec![hostname_topology(n)])
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let content_source =
        label(&v.metadata, labels::VOLUME_SOURCE_SNAP_NAME).map(|_| VolumeContentSource {
            r#type: annotation(&v.metadata, ANNO_SOURCE_SNAP_ID).map(|id| {
                SourceType::Snapshot(volume_content_source::SnapshotSource {
                    snapshot_id: id.to_string(),
                })
            }),
        });
    Volume {
        capacity_bytes: i64_of(v.spec.size_byte),
        volume_id: v.spec.uuid.clone(),
        volume_context: ctx,
        content_source,
        accessible_topology,
    }
}

/// Annotation recording the CSI snapshot id a volume was cloned from.
pub const ANNO_SOURCE_SNAP_ID: &str = "obnvmf/volume-source-snap-id";

/// The CSI snapshot of an AntstorSnapshot.
pub fn csi_snapshot(s: &AntstorSnapshot, source_volume_id: &str) -> Snapshot {
    Snapshot {
        size_bytes: s.spec.size.max(0),
        snapshot_id: s.spec.uuid.clone(),
        source_volume_id: source_volume_id.to_string(),
        creation_time: s.metadata.creation_timestamp.as_ref().map(ts),
        ready_to_use: snapshot_ready(s),
        group_snapshot_id: String::new(),
    }
}

/// Whether the snapshot is cut and usable.
fn snapshot_ready(s: &AntstorSnapshot) -> bool {
    s.status.as_ref().map(|st| st.status) == Some(SnapshotStatusName::Ready)
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
    /// A controller service using `client`.
    pub fn new(client: Client, cfg: Arc<DriverConfig>) -> Self {
        ControllerService {
            client,
            cfg,
            inflight: Inflight::default(),
            by_uuid: crate::uuid_index::UuidIndex::default(),
        }
    }

    fn volumes(&self) -> Api<AntstorVolume> {
        Api::namespaced(self.client.clone(), &self.cfg.namespace)
    }

    fn snapshots(&self) -> Api<AntstorSnapshot> {
        Api::namespaced(self.client.clone(), &self.cfg.namespace)
    }

    fn pools(&self) -> Api<StoragePool> {
        Api::namespaced(self.client.clone(), &self.cfg.namespace)
    }

    async fn find_volume(&self, id: &str) -> Result<AntstorVolume> {
        self.by_uuid
            .volume(&self.volumes(), id)
            .await?
            .ok_or_else(|| CsiError::NotFound(format!("volume {id} does not exist")))
    }

    pub(crate) async fn node_info(&self, node: &str) -> Result<NodeInfo> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let n = k8s::get_opt(&nodes, "Node", node).await?;
        let mut info = NodeInfo {
            id: node.to_string(),
            hostname: node.to_string(),
            ..NodeInfo::default()
        };
        if let Some(n) = n {
            if let Some(h) = n.labels().get(labels::KUBE_HOSTNAME) {
                info.hostname = h.clone();
            }
            if let Some(ip) = n
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
            {
                info.ip = ip.address.clone();
            }
        }
        Ok(info)
    }

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
        let mut host_node = topology_node(req.accessibility_requirements.as_ref());
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

    async fn source_snapshot(&self, req: &CreateVolumeRequest) -> Result<Option<AntstorSnapshot>> {
        let Some(src) = req.volume_content_source.as_ref() else {
            return Ok(None);
        };
        match &src.r#type {
            Some(SourceType::Snapshot(s)) => {
                let id = require("volume_content_source.snapshot.snapshot_id", &s.snapshot_id)?;
                let snap = k8s::snapshot_by_uuid(&self.snapshots(), id)
                    .await?
                    .ok_or_else(|| CsiError::NotFound(format!("snapshot {id} does not exist")))?;
                Ok(Some(snap))
            }
            Some(SourceType::Volume(_)) => Err(CsiError::invalid(
                "volume_content_source.volume",
                "cloning a volume from a volume is not supported (CLONE_VOLUME is not advertised); clone from a snapshot",
            )),
            None => Err(CsiError::invalid(
                "volume_content_source",
                "names no source",
            )),
        }
    }

    /// CreateVolume of a multi-disk volume (see [`group`]): what it cannot have is refused
    /// here, by name.
    async fn create_group_request(
        &self,
        req: &CreateVolumeRequest,
        name: &str,
        p: &VolumeParams,
        gp: group::GroupParams,
        size: u64,
        accesses: &[params::Access],
    ) -> Result<Volume> {
        if req.volume_content_source.is_some() {
            return Err(CsiError::invalid(
                "volume_content_source",
                "a multi-disk volume (obnvmf/pv-type: VolumeGroup) cannot be made from a snapshot or a volume",
            ));
        }
        if p.qos.is_some() || !req.mutable_parameters.is_empty() {
            return Err(CsiError::invalid(
                format!("parameters.{}", liteio_api::qos::PARAM_IOPS),
                "QoS limits are not supported on multi-disk volumes (obnvmf/pv-type: VolumeGroup) yet",
            ));
        }
        if p.nvmf_tls {
            return Err(CsiError::invalid(
                format!("parameters.{}", keys::SC_PARAM_NVMF_TLS),
                "TLS is not supported on multi-disk volumes (obnvmf/pv-type: VolumeGroup) yet",
            ));
        }
        let mut fs = p.fs_type.clone();
        for a in accesses {
            if let params::Access::Mount { fs_type, .. } = a
                && !fs_type.is_empty()
            {
                fs = fs_type.clone();
            }
        }
        params::check_fs("volume_capabilities.mount.fs_type", &fs)?;
        let want = group::GroupRequest {
            params: gp,
            size,
            fs,
            mkfs_params: p.mkfs_params.clone(),
            host: topology_node(req.accessibility_requirements.as_ref()),
            pv_name: p.pv_name.clone().unwrap_or_else(|| name.to_string()),
        };
        self.create_group(name, want).await
    }

    async fn create_volume_inner(&self, req: &CreateVolumeRequest) -> Result<Volume> {
        let csi_name = require("name", &req.name)?;
        let obj_name = params::object_name(csi_name);
        let name = obj_name.as_str();
        let accesses = params::check_capabilities("volume_capabilities", &req.volume_capabilities)?;
        let p = VolumeParams::parse(&req.parameters)?;
        let mut size = params::volume_size(req.capacity_range.as_ref())?;
        if let Some(gp) = group::GroupParams::parse(&req.parameters)? {
            return self
                .create_group_request(req, name, &p, gp, size, &accesses)
                .await;
        }
        // A filesystem capability may name the filesystem; it must agree with the class.
        let mut fs = p.fs_type.clone();
        for a in &accesses {
            if let params::Access::Mount { fs_type, .. } = a
                && !fs_type.is_empty()
            {
                fs = fs_type.clone();
            }
        }
        let snap = self.source_snapshot(req).await?;
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
    pub(crate) async fn ensure_keys_owned(
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

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.cfg.namespace)
    }

    async fn delete_volume_inner(&self, req: &DeleteVolumeRequest) -> Result<()> {
        let id = require("volume_id", &req.volume_id)?;
        if group::is_group_id(id) {
            return self.delete_group(id).await;
        }
        let _guard = self.inflight.claim(&format!("volume {id}"))?;
        let Some(v) = self.by_uuid.volume(&self.volumes(), id).await? else {
            return Ok(());
        };
        let name = v.name_any();
        match self.volumes().delete(&name, &DeleteParams::default()).await {
            Ok(_) => info!(volume = %name, uuid = id, "AntstorVolume deletion requested"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(CsiError::kube(format!("delete AntstorVolume {name}"), e)),
        }
        // Its keys go with it (the Secret is also owned by the volume, for the garbage
        // collector; this is for API servers without one).
        let secret = v.auth_secret_name();
        match self
            .secrets()
            .delete(&secret, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(CsiError::kube(format!("delete Secret {secret}"), e)),
        }
    }

    /// ControllerPublishVolume: see [`publish`].
    async fn publish_inner(
        &self,
        req: &ControllerPublishVolumeRequest,
    ) -> Result<ControllerPublishVolumeResponse> {
        let id = require("volume_id", &req.volume_id)?;
        let node = require("node_id", &req.node_id)?;
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| CsiError::invalid("volume_capability", "is required"))?;
        params::check_capability("volume_capability", cap)?;
        let nodes: Api<Node> = Api::all(self.client.clone());
        if group::is_group_id(id) {
            if k8s::get_opt(&nodes, "Node", node).await?.is_none() {
                return Err(CsiError::NotFound(format!("node {node} does not exist")));
            }
            self.publish_group(id, node).await?;
            return Ok(ControllerPublishVolumeResponse::default());
        }
        let _guard = self.inflight.claim(&format!("volume {id}"))?;
        if k8s::get_opt(&nodes, "Node", node).await?.is_none() {
            return Err(CsiError::NotFound(format!("node {node} does not exist")));
        }
        let name = 'retry: {
            for attempt in 0..5 {
                let mut v = self.find_volume(id).await?;
                let name = v.name_any();
                let migration = self.migration_of(&v).await?;
                let exportable = v.spec.spdk_target.is_some()
                    || match v.target_node() {
                        Some(t) => k8s::get_opt(&self.pools(), "StoragePool", t)
                            .await?
                            .is_some_and(|p| p.can_export()),
                        None => false,
                    };
                let plan = publish::plan(&v, node, exportable, migration.as_deref())?;
                let recorded = publish::published_node(&v) == Some(node);
                if plan == publish::Plan::Stay && recorded {
                    return Ok(ControllerPublishVolumeResponse::default());
                }
                let annos = v.metadata.annotations.get_or_insert_with(BTreeMap::new);
                annos.insert(annotations::PUBLISHED_NODE.into(), node.into());
                if let publish::Plan::Move { from } = &plan {
                    // Reached over NVMe-oF from now on (or used on its own node): no longer
                    // bound to the node it was placed on.
                    annos.remove(annotations::LOCAL_ONLY);
                    v.spec.host_node = Some(self.node_info(node).await?);
                    info!(volume = %name, from = %from, to = node, "volume's consumer moves to the node it is published to");
                }
                match self
                    .volumes()
                    .replace(&name, &PostParams::default(), &v)
                    .await
                {
                    Ok(_) if plan == publish::Plan::Stay => {
                        info!(volume = %name, node, "volume published");
                        return Ok(ControllerPublishVolumeResponse::default());
                    }
                    Ok(_) => break 'retry name,
                    Err(kube::Error::Api(s)) if s.code == 409 && attempt < 4 => continue,
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        return Err(CsiError::Busy(format!(
                            "volume {name} changed while publishing; retry"
                        )));
                    }
                    Err(e) => {
                        return Err(CsiError::kube(format!("update AntstorVolume {name}"), e));
                    }
                }
            }
            return Err(CsiError::Busy(format!(
                "volume {id} kept changing while publishing; retry"
            )));
        };
        // The consumer moved: wait until the storage node's agent admits the new node.
        let who = node.to_string();
        match k8s::wait_for(
            self.volumes(),
            "AntstorVolume",
            &name,
            self.cfg.schedule_timeout,
            move |v: &AntstorVolume| publish::exported_to(v, &who),
        )
        .await?
        {
            Waited::Done(_) => {
                info!(volume = %name, node, "volume published; its export admits the node");
                Ok(ControllerPublishVolumeResponse::default())
            }
            Waited::Gone => Err(CsiError::NotFound(format!("volume {name} was deleted"))),
            Waited::TimedOut => Err(CsiError::Pending(format!(
                "volume {name} is published to node {node}, but its storage node's agent has not admitted that node to the volume's export after {}s (annotation {}); retry",
                self.cfg.schedule_timeout.as_secs(),
                annotations::EXPORTED_TO
            ))),
        }
    }

    /// ControllerUnpublishVolume: clears the publish record of the node (of any node when the
    /// request names none). A volume that does not exist is unpublished (OK).
    async fn unpublish_inner(
        &self,
        req: &ControllerUnpublishVolumeRequest,
    ) -> Result<ControllerUnpublishVolumeResponse> {
        let id = require("volume_id", &req.volume_id)?;
        if group::is_group_id(id) {
            // The host stays recorded until another node publishes the volume.
            return Ok(ControllerUnpublishVolumeResponse::default());
        }
        let _guard = self.inflight.claim(&format!("volume {id}"))?;
        for attempt in 0..5 {
            let Some(mut v) = self.by_uuid.volume(&self.volumes(), id).await? else {
                return Ok(ControllerUnpublishVolumeResponse::default());
            };
            let name = v.name_any();
            match publish::published_node(&v) {
                Some(p) if req.node_id.is_empty() || p == req.node_id => {}
                _ => return Ok(ControllerUnpublishVolumeResponse::default()),
            }
            if let Some(a) = v.metadata.annotations.as_mut() {
                a.remove(annotations::PUBLISHED_NODE);
            }
            match self
                .volumes()
                .replace(&name, &PostParams::default(), &v)
                .await
            {
                Ok(_) => {
                    info!(volume = %name, node = %req.node_id, "volume unpublished");
                    return Ok(ControllerUnpublishVolumeResponse::default());
                }
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < 4 => continue,
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    return Ok(ControllerUnpublishVolumeResponse::default());
                }
                Err(e) => return Err(CsiError::kube(format!("update AntstorVolume {name}"), e)),
            }
        }
        Err(CsiError::Busy(format!(
            "volume {id} kept changing while unpublishing; retry"
        )))
    }

    /// The running migration of `vol`, by name: a destination volume names its source
    /// (label `migrate.obnvmf/source-volume-name`) while the migration runs.
    async fn migration_of(&self, vol: &AntstorVolume) -> Result<Option<String>> {
        if let Some(m) = vol.labels().get(labels::MIGRATE_MIGRATION_NAME) {
            return Ok(Some(m.clone()));
        }
        let name = vol.name_any();
        if !k8s::is_label_value(&name) {
            return Ok(None);
        }
        let lp =
            ListParams::default().labels(&format!("{}={name}", labels::MIGRATE_SOURCE_VOLUME_NAME));
        let dests = self
            .volumes()
            .list(&lp)
            .await
            .map_err(|e| CsiError::kube("list AntstorVolumes being migrated to", e))?;
        Ok(dests.items.first().map(|d| {
            d.labels()
                .get(labels::MIGRATE_MIGRATION_NAME)
                .cloned()
                .unwrap_or_else(|| d.name_any())
        }))
    }

    async fn expand_inner(
        &self,
        req: &ControllerExpandVolumeRequest,
    ) -> Result<ControllerExpandVolumeResponse> {
        let id = require("volume_id", &req.volume_id)?;
        let range = req
            .capacity_range
            .as_ref()
            .ok_or_else(|| CsiError::invalid("capacity_range", "is required"))?;
        let new_size = params::volume_size(Some(range))?;
        if group::is_group_id(id) {
            let size = self.expand_group(id, new_size).await?;
            return Ok(ControllerExpandVolumeResponse {
                capacity_bytes: i64_of(size),
                node_expansion_required: true,
            });
        }
        let _guard = self.inflight.claim(&format!("volume {id}"))?;
        let (name, old) = 'retry: {
            for attempt in 0..5 {
                let mut v = self.find_volume(id).await?;
                let name = v.name_any();
                let old = v.spec.size_byte;
                if new_size <= old {
                    // Growth only: a volume at or above the request is left alone (a retried or
                    // smaller request succeeds with the current size; nothing is ever shrunk).
                    return Ok(ControllerExpandVolumeResponse {
                        capacity_bytes: i64_of(old),
                        node_expansion_required: true,
                    });
                }
                let Some(target) = v.target_node().map(str::to_string) else {
                    return Err(CsiError::FailedPrecondition(format!(
                        "volume {name} is not scheduled yet; it cannot be expanded"
                    )));
                };
                let pool = k8s::get_opt(&self.pools(), "StoragePool", &target)
                    .await?
                    .ok_or_else(|| {
                        CsiError::FailedPrecondition(format!(
                            "StoragePool {target} holding volume {name} does not exist"
                        ))
                    })?;
                let delta = new_size - old;
                let free = pool.reported_free_bytes();
                if free < delta {
                    return Err(CsiError::OutOfRange(format!(
                        "capacity_range.required_bytes: pool {target} has {} free, volume {name} needs {} more",
                        size::format_bytes(free),
                        size::format_bytes(delta)
                    )));
                }
                let labels_map = v.metadata.labels.get_or_insert_with(BTreeMap::new);
                labels_map
                    .entry(labels::EXPANSION_ORIGINAL_SIZE.to_string())
                    .or_insert_with(|| old.to_string());
                v.spec.size_byte = new_size;
                match self
                    .volumes()
                    .replace(&name, &PostParams::default(), &v)
                    .await
                {
                    Ok(_) => break 'retry (name, old),
                    // Another writer (the agent, the controller) updated the volume between our
                    // read and write: read it again, a few times, before asking the CO to retry.
                    Err(kube::Error::Api(s)) if s.code == 409 && attempt < 4 => continue,
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        return Err(CsiError::Busy(format!(
                            "volume {name} changed while expanding; retry"
                        )));
                    }
                    Err(e) => {
                        return Err(CsiError::kube(format!("update AntstorVolume {name}"), e));
                    }
                }
            }
            return Err(CsiError::Busy(format!(
                "volume {id} kept changing while expanding; retry"
            )));
        };
        info!(volume = %name, from = old, to = new_size, "volume expansion requested");
        Ok(ControllerExpandVolumeResponse {
            capacity_bytes: i64_of(new_size),
            node_expansion_required: true,
        })
    }

    /// ControllerModifyVolume: the QoS limits of a VolumeAttributesClass's
    /// `mutable_parameters`, written to the volume's `spec.qos` (what a parameter does not
    /// name stays); the agent applies them to the live export. Idempotent.
    async fn modify_inner(
        &self,
        req: &ControllerModifyVolumeRequest,
    ) -> Result<ControllerModifyVolumeResponse> {
        let id = require("volume_id", &req.volume_id)?;
        // Keys first: a bad request fails the same whether or not the volume exists.
        params::mutable_qos(&req.mutable_parameters, VolumeQos::default())?;
        if group::is_group_id(id) {
            return Err(group::unsupported(
                "ControllerModifyVolume (QoS limits)",
                id,
            ));
        }
        let _guard = self.inflight.claim(&format!("volume {id}"))?;
        for attempt in 0..5 {
            let mut v = self.find_volume(id).await?;
            let name = v.name_any();
            let old = v.spec.qos.unwrap_or_default();
            let Some(new) = params::mutable_qos(&req.mutable_parameters, old)? else {
                return Ok(ControllerModifyVolumeResponse {});
            };
            if new == old {
                return Ok(ControllerModifyVolumeResponse {});
            }
            if !new.is_unlimited() {
                self.check_qos_enforced(&v).await?;
            }
            // A migration copies the limits when it starts; a change now would miss the
            // destination.
            if let Some(m) = self.migration_of(&v).await? {
                return Err(CsiError::Busy(format!(
                    "volume {name} is being migrated ({m}); change its limits when the migration ends"
                )));
            }
            v.spec.qos = (!new.is_unlimited()).then_some(new);
            match self
                .volumes()
                .replace(&name, &PostParams::default(), &v)
                .await
            {
                Ok(_) => {
                    info!(volume = %name, from = %old.summary(), to = %new.summary(), "volume QoS limits changed");
                    return Ok(ControllerModifyVolumeResponse {});
                }
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < 4 => {}
                Err(kube::Error::Api(s)) if s.code == 409 => break,
                Err(e) => return Err(CsiError::kube(format!("update AntstorVolume {name}"), e)),
            }
        }
        Err(CsiError::Busy(format!(
            "volume {id} kept changing while its limits were set; retry"
        )))
    }

    /// A limit is accepted only where it is enforced: a volume on an SPDK lvstore (or not
    /// placed yet: the scheduler puts a limited volume on one).
    async fn check_qos_enforced(&self, v: &AntstorVolume) -> Result<()> {
        let name = v.name_any();
        let engine = match (v.spec.type_, v.target_node()) {
            (Some(VolumeType::SpdkLVol), _) | (_, None) => return Ok(()),
            (Some(VolumeType::KernelLVol), Some(t)) => format!("an LVM or file volume on node {t}"),
            (_, Some(t)) => match k8s::get_opt(&self.pools(), "StoragePool", t).await? {
                Some(p) if p.mode() == Some(liteio_api::PoolMode::SpdkLVStore) => return Ok(()),
                Some(_) => format!("on node {t}, whose pool is not an SPDK lvstore"),
                None => format!("on node {t}, which has no StoragePool"),
            },
        };
        Err(CsiError::FailedPrecondition(format!(
            "volume {name} is {engine}: only the SPDK engine enforces QoS limits, and a limit that is not enforced is not accepted"
        )))
    }

    async fn create_snapshot_inner(&self, req: &CreateSnapshotRequest) -> Result<Snapshot> {
        let csi_name = require("name", &req.name)?;
        let src = require("source_volume_id", &req.source_volume_id)?;
        if group::is_group_id(src) {
            return Err(group::unsupported("CreateSnapshot", src));
        }
        let _guard = self.inflight.claim(&format!("snapshot {csi_name}"))?;
        let obj_name = params::object_name(csi_name);
        let name = obj_name.as_str();
        let api = self.snapshots();
        if let Some(s) = k8s::get_opt(&api, "AntstorSnapshot", name).await? {
            let origin = s.spec.origin_vol_name.clone();
            let vol = self.by_uuid.volume(&self.volumes(), src).await?;
            if vol.as_ref().map(ResourceExt::name_any) != Some(origin.clone()) {
                return Err(CsiError::AlreadyExists(format!(
                    "snapshot {name} exists for volume {origin}, not for volume {src}"
                )));
            }
            return self.snapshot_outcome(s, src).await;
        }
        let vol = self.find_volume(src).await?;
        let vname = vol.name_any();
        let Some(target) = vol.target_node().map(str::to_string) else {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {vname} is not scheduled yet; it cannot be snapshotted"
            )));
        };
        let reserve = annotation(&vol.metadata, annotations::SNAPSHOT_RESERVED_BYTES)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|v| *v > 0);
        // The controller accepts a snapshot only when its size fits the origin's reserve.
        let snap_size = reserve.unwrap_or(vol.spec.size_byte);
        let uuid = uuid::Uuid::new_v4().to_string();
        let s = AntstorSnapshot {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.cfg.namespace.clone()),
                labels: Some(BTreeMap::from([
                    (labels::SNAP_UUID.to_string(), uuid.clone()),
                    (labels::ORIGIN_VOLUME_NAME.to_string(), vname.clone()),
                    (
                        labels::ORIGIN_VOLUME_NAMESPACE.to_string(),
                        vol.namespace().unwrap_or_default(),
                    ),
                    (labels::TARGET_NODE_ID.to_string(), target.clone()),
                ])),
                annotations: (name != csi_name).then(|| {
                    BTreeMap::from([(params::ANNO_CSI_NAME.to_string(), csi_name.to_string())])
                }),
                ..ObjectMeta::default()
            },
            spec: AntstorSnapshotSpec {
                uuid,
                vol_type: match vol.spec.type_ {
                    Some(VolumeType::KernelLVol) => SnapshotVolType::KernelLVol,
                    _ => SnapshotVolType::SpdkLVol,
                },
                size: i64_of(snap_size),
                origin_vol_name: vname.clone(),
                origin_vol_namespace: vol.namespace().unwrap_or_default(),
                origin_vol_target_node_id: target,
                ..AntstorSnapshotSpec::default()
            },
            status: None,
        };
        let created = match api.create(&PostParams::default(), &s).await {
            Ok(c) => c,
            Err(kube::Error::Api(st)) if st.code == 409 => {
                return Err(CsiError::Busy(format!(
                    "snapshot {name} was created concurrently; retry"
                )));
            }
            Err(e) => return Err(CsiError::kube(format!("create AntstorSnapshot {name}"), e)),
        };
        info!(snapshot = name, volume = %vname, "AntstorSnapshot created");
        self.snapshot_outcome(created, src).await
    }

    /// The answer to CreateSnapshot for `s`: ready, or still being cut after a short wait
    /// ([`DriverConfig::snapshot_wait`]; `ready_to_use = false`, the CO polls again), or
    /// FAILED_PRECONDITION with the storage node's reason when it failed for good (the pool
    /// cannot take snapshots): then the AntstorSnapshot is deleted, so that nothing is left
    /// of a snapshot the CO never got an id for.
    async fn snapshot_outcome(&self, s: AntstorSnapshot, src: &str) -> Result<Snapshot> {
        let settled = |s: &AntstorSnapshot| snapshot_ready(s) || s.permanent_failure().is_some();
        let name = s.name_any();
        let s = if settled(&s) {
            s
        } else {
            match k8s::wait_for(
                self.snapshots(),
                "AntstorSnapshot",
                &name,
                self.cfg.snapshot_wait,
                settled,
            )
            .await?
            {
                Waited::Done(now) => now,
                Waited::Gone => {
                    return Err(CsiError::Busy(format!(
                        "snapshot {name} was deleted while it was being cut; retry"
                    )));
                }
                Waited::TimedOut => return Ok(csi_snapshot(&s, src)),
            }
        };
        let Some(msg) = s.permanent_failure() else {
            return Ok(csi_snapshot(&s, src));
        };
        let err = CsiError::FailedPrecondition(format!(
            "snapshot {name} of volume {} cannot be cut: {msg}",
            s.spec.origin_vol_name
        ));
        match self
            .snapshots()
            .delete(&name, &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(st)) if st.code == 404 => {}
            Err(e) => {
                warn!(snapshot = %name, error = %e, "cannot delete the failed AntstorSnapshot")
            }
        }
        Err(err)
    }

    async fn delete_snapshot_inner(&self, req: &DeleteSnapshotRequest) -> Result<()> {
        let id = require("snapshot_id", &req.snapshot_id)?;
        let _guard = self.inflight.claim(&format!("snapshot {id}"))?;
        let Some(s) = k8s::snapshot_by_uuid(&self.snapshots(), id).await? else {
            return Ok(());
        };
        let name = s.name_any();
        match self
            .snapshots()
            .delete(&name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(st)) if st.code == 404 => Ok(()),
            Err(e) => Err(CsiError::kube(format!("delete AntstorSnapshot {name}"), e)),
        }
    }

    async fn uuid_by_volume_name(&self) -> Result<HashMap<String, String>> {
        let vols = self
            .volumes()
            .list(&ListParams::default())
            .await
            .map_err(|e| CsiError::kube("list AntstorVolume", e))?;
        Ok(vols
            .items
            .into_iter()
            .map(|v| (v.name_any(), v.spec.uuid))
            .collect())
    }

    async fn list_snapshots_inner(
        &self,
        req: &ListSnapshotsRequest,
    ) -> Result<ListSnapshotsResponse> {
        let list = self
            .snapshots()
            .list(&ListParams::default())
            .await
            .map_err(|e| CsiError::kube("list AntstorSnapshot", e))?;
        let uuids = self.uuid_by_volume_name().await?;
        let mut snaps: Vec<Snapshot> = list
            .items
            .iter()
            .filter(|s| !s.spec.uuid.is_empty() && s.metadata.deletion_timestamp.is_none())
            .map(|s| {
                let src = uuids
                    .get(&s.spec.origin_vol_name)
                    .cloned()
                    .unwrap_or_default();
                csi_snapshot(s, &src)
            })
            .filter(|s| req.snapshot_id.is_empty() || s.snapshot_id == req.snapshot_id)
            .filter(|s| {
                req.source_volume_id.is_empty() || s.source_volume_id == req.source_volume_id
            })
            .collect();
        snaps.sort_by(|a, b| a.snapshot_id.cmp(&b.snapshot_id));
        let start = params::page_offset(&req.starting_token, snaps.len())?;
        let (start, end, next_token) = params::page(start, req.max_entries, snaps.len())?;
        Ok(ListSnapshotsResponse {
            entries: snaps[start..end]
                .iter()
                .map(|s| list_snapshots_response::Entry {
                    snapshot: Some(s.clone()),
                })
                .collect(),
            next_token,
        })
    }

    async fn list_volumes_inner(&self, req: &ListVolumesRequest) -> Result<ListVolumesResponse> {
        let list = self
            .volumes()
            .list(&ListParams::default())
            .await
            .map_err(|e| CsiError::kube("list AntstorVolume", e))?;
        let mut vols: Vec<&AntstorVolume> = list
            .items
            .iter()
            // A volume being deleted is gone for the CO (DeleteVolume returned); only the
            // agent's clean-up is left.
            .filter(|v| !v.spec.uuid.is_empty() && v.metadata.deletion_timestamp.is_none())
            .collect();
        vols.sort_by(|a, b| a.spec.uuid.cmp(&b.spec.uuid));
        let start = params::page_offset(&req.starting_token, vols.len())?;
        let (start, end, next_token) = params::page(start, req.max_entries, vols.len())?;
        Ok(ListVolumesResponse {
            entries: vols[start..end]
                .iter()
                .map(|v| list_volumes_response::Entry {
                    volume: Some(csi_volume(v, &HashMap::new())),
                    status: None,
                })
                .collect(),
            next_token,
        })
    }

    async fn get_capacity_inner(&self, req: &GetCapacityRequest) -> Result<GetCapacityResponse> {
        if !req.volume_capabilities.is_empty() {
            params::check_capabilities("volume_capabilities", &req.volume_capabilities)?;
        }
        let node = req
            .accessible_topology
            .as_ref()
            .and_then(|t| t.segments.get(labels::KUBE_HOSTNAME));
        let pools = self
            .pools()
            .list(&ListParams::default())
            .await
            .map_err(|e| CsiError::kube("list StoragePool", e))?;
        let free: Vec<u64> = pools
            .items
            .iter()
            .filter(|p| p.is_schedulable())
            .filter(|p| {
                node.is_none_or(|n| {
                    p.name_any() == *n
                        || p.spec.node_info.hostname == *n
                        || p.spec.node_info.id == *n
                })
            })
            .map(StoragePool::reported_free_bytes)
            .collect();
        // Saturating: the free sizes come from the API server (vgFreeSize).
        let total = free.iter().fold(0u64, |sum, f| sum.saturating_add(*f));
        let largest = free.iter().copied().max().unwrap_or(0);
        Ok(GetCapacityResponse {
            available_capacity: i64_of(total),
            // One volume lives in one pool: the largest free space bounds a single volume.
            maximum_volume_size: Some(i64_of(
                size::round_down(largest, size::VOLUME_UNIT).unwrap_or(0),
            )),
            minimum_volume_size: Some(i64_of(size::MIN_VOLUME_SIZE)),
        })
    }

    async fn validate_inner(
        &self,
        req: &ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse> {
        let id = require("volume_id", &req.volume_id)?;
        if req.volume_capabilities.is_empty() {
            return Err(CsiError::invalid(
                "volume_capabilities",
                "at least one capability is required",
            ));
        }
        if group::is_group_id(id) {
            self.data_control_by_id(id)
                .await?
                .ok_or_else(|| CsiError::NotFound(format!("volume {id} does not exist")))?;
        } else {
            self.find_volume(id).await?;
        }
        match params::check_capabilities("volume_capabilities", &req.volume_capabilities) {
            Ok(_) => Ok(ValidateVolumeCapabilitiesResponse {
                confirmed: Some(validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context.clone(),
                    volume_capabilities: req.volume_capabilities.clone(),
                    parameters: req.parameters.clone(),
                    mutable_parameters: HashMap::new(),
                }),
                message: String::new(),
            }),
            Err(e) => Ok(ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: e.to_string(),
            }),
        }
    }
}

/// Logs a failed call and turns it into a status.
fn fail(op: &str, e: CsiError) -> Status {
    warn!(op, kind = e.kind().as_str(), error = %e.chain(), "CSI call failed");
    e.into()
}

#[tonic::async_trait]
impl Controller for ControllerService {
    #[instrument(skip_all, fields(name = %request.get_ref().name))]
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let volume = self
            .create_volume_inner(request.get_ref())
            .await
            .map_err(|e| fail("CreateVolume", e))?;
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(volume),
        }))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        self.delete_volume_inner(request.get_ref())
            .await
            .map_err(|e| fail("DeleteVolume", e))?;
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id, node = %request.get_ref().node_id))]
    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        self.publish_inner(request.get_ref())
            .await
            .map(Response::new)
            .map_err(|e| fail("ControllerPublishVolume", e))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id, node = %request.get_ref().node_id))]
    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        self.unpublish_inner(request.get_ref())
            .await
            .map(Response::new)
            .map_err(|e| fail("ControllerUnpublishVolume", e))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        self.validate_inner(request.get_ref())
            .await
            .map(Response::new)
            .map_err(|e| fail("ValidateVolumeCapabilities", e))
    }

    #[instrument(skip_all)]
    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        self.list_volumes_inner(request.get_ref())
            .await
            .map(Response::new)
            .map_err(|e| fail("ListVolumes", e))
    }

    #[instrument(skip_all)]
    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        self.get_capacity_inner(request.get_ref())
            .await
            .map(Response::new)
            .map_err(|e| fail("GetCapacity", e))
    }

    #[instrument(skip_all)]
    async fn controller_get_capabilities(
        &self,
        _request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: CONTROLLER_CAPABILITIES
                .iter()
                .map(|t| ControllerServiceCapability {
                    r#type: Some(controller_service_capability::Type::Rpc(
                        controller_service_capability::Rpc { r#type: *t as i32 },
                    )),
                })
                .collect(),
        }))
    }

    #[instrument(skip_all, fields(name = %request.get_ref().name, volume = %request.get_ref().source_volume_id))]
    async fn create_snapshot(
        &self,
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let snapshot = self
            .create_snapshot_inner(request.get_ref())
            .await
            .map_err(|e| fail("CreateSnapshot", e))?;
        Ok(Response::new(CreateSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    #[instrument(skip_all, fields(snapshot = %request.get_ref().snapshot_id))]
    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        self.delete_snapshot_inner(request.get_ref())
            .await
            .map_err(|e| fail("DeleteSnapshot", e))?;
        Ok(Response::new(DeleteSnapshotResponse {}))
    }

    #[instrument(skip_all)]
    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        self.list_snapshots_inner(request.get_ref())
            .await
            .map(Response::new)
            .map_err(|e| fail("ListSnapshots", e))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        self.expand_inner(request.get_ref())
            .await
            .map(Response::new)
            .map_err(|e| fail("ControllerExpandVolume", e))
    }

    async fn controller_get_volume(
        &self,
        _request: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "ControllerGetVolume: GET_VOLUME is not advertised",
        ))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn controller_modify_volume(
        &self,
        request: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        self.modify_inner(request.get_ref())
            .await
            .map(Response::new)
            .map_err(|e| fail("ControllerModifyVolume", e))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use liteio_api::VolumeStatus;

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
