//! AntstorVolume: one per PersistentVolume, name = PV name.

use k8s_openapi::api::core::v1::NodeAffinity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{
    CsiNodePubParams, KernelLvol, NodeInfo, SpdkLvol, SpdkTarget, VolumePosition, VolumeStatus,
    VolumeType, is_zero,
};
use crate::keys;

/// Desired state of a volume: written by the CSI controller (request), the controller
/// (`targetNodeId`) and the agent (engine-side names).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "volume.antstor.alipay.com",
    version = "v1",
    kind = "AntstorVolume",
    namespaced,
    status = "AntstorVolumeStatus",
    shortname = "av",
    shortname = "antvol",
    category = "liteio",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"uuid","type":"string","jsonPath":".spec.uuid"}"#,
    printcolumn = r#"{"name":"size","type":"integer","jsonPath":".spec.sizeByte"}"#,
    printcolumn = r#"{"name":"targetId","type":"string","jsonPath":".spec.targetNodeId"}"#,
    printcolumn = r#"{"name":"host_ip","type":"string","jsonPath":".spec.hostNode.ip"}"#,
    printcolumn = r#"{"name":"status","type":"string","jsonPath":".status.status"}"#,
    printcolumn = r#"{"name":"host","type":"string","priority":1,"jsonPath":".spec.hostNode.id"}"#,
    printcolumn = r#"{"name":"type","type":"string","priority":1,"jsonPath":".spec.type"}"#,
    printcolumn = r#"{"name":"position","type":"string","priority":1,"jsonPath":".spec.positionAdvice"}"#,
    printcolumn = r#"{"name":"msg","type":"string","priority":1,"jsonPath":".status.msg"}"#,
    printcolumn = r#"{"name":"age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.uuid) && size(self.uuid) > 0", "message": "spec.uuid must not be empty"},
    {"rule": "!has(oldSelf.uuid) || !has(self.uuid) || self.uuid == oldSelf.uuid", "message": "spec.uuid is immutable"}
]))]
pub struct AntstorVolumeSpec {
    /// Volume UUID; the CSI volume id.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uuid: String,
    /// Kind of logical volume.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<VolumeType>,
    /// Size in bytes.
    #[serde(default, rename = "sizeByte")]
    pub size_byte: u64,
    /// Where the data should be relative to its consumer.
    #[serde(default, rename = "positionAdvice", skip_serializing_if = "is_zero")]
    pub position_advice: VolumePosition,
    /// Thin provisioned.
    #[serde(default, rename = "isThin", skip_serializing_if = "is_zero")]
    pub is_thin: bool,
    /// The controller leaves the volume alone.
    #[serde(default, rename = "stopReconcile", skip_serializing_if = "is_zero")]
    pub stop_reconcile: bool,
    /// Required node affinity of the target node.
    #[serde(
        default,
        rename = "nodeAffinity",
        skip_serializing_if = "Option::is_none"
    )]
    pub node_affinity: Option<NodeAffinity>,
    /// Required affinity over pool labels.
    #[serde(
        default,
        rename = "poolAffinity",
        skip_serializing_if = "Option::is_none"
    )]
    pub pool_affinity: Option<NodeAffinity>,
    /// The pool (node) chosen by the scheduler; empty until scheduled.
    #[serde(default, rename = "targetNodeId")]
    pub target_node_id: String,
    /// Where the consuming pod runs.
    #[serde(default, rename = "hostNode", skip_serializing_if = "Option::is_none")]
    pub host_node: Option<NodeInfo>,
    /// The LVM logical volume, once created.
    #[serde(
        default,
        rename = "kernelLvol",
        skip_serializing_if = "Option::is_none"
    )]
    pub kernel_lvol: Option<KernelLvol>,
    /// The SPDK lvol, once created.
    #[serde(default, rename = "spdkLvol", skip_serializing_if = "Option::is_none")]
    pub spdk_lvol: Option<SpdkLvol>,
    /// The NVMe-oF export, once created.
    #[serde(
        default,
        rename = "spdkTarget",
        skip_serializing_if = "Option::is_none"
    )]
    pub spdk_target: Option<SpdkTarget>,
    /// How the volume's hosts authenticate (`required`, `preferred`, `none`; absent:
    /// `required`), from the StorageClass parameter `liteio.io/host-auth`. Not in LiteIO.
    #[serde(default, rename = "hostAuth", skip_serializing_if = "Option::is_none")]
    pub host_auth: Option<crate::host_auth::HostAuthPolicy>,
    /// Per-volume QoS limits (IOPS, MiB/s), enforced on the volume's SPDK export; absent:
    /// unlimited. From the StorageClass or a VolumeAttributesClass (`liteio.io/qos-*`
    /// parameters). Not in LiteIO.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<crate::qos::VolumeQos>,
}

/// Device the host attached (unused by LiteIO).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct HostAttachment {
    /// Device path on the host.
    #[serde(
        default,
        rename = "hostDevPath",
        skip_serializing_if = "String::is_empty"
    )]
    pub host_dev_path: String,
}

/// Observed state of a volume.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct AntstorVolumeStatus {
    /// Life-cycle state.
    #[serde(default)]
    pub status: VolumeStatus,
    /// Parameters of the last CSI publish.
    #[serde(
        default,
        rename = "csiNodePubParams",
        skip_serializing_if = "Option::is_none"
    )]
    pub csi_node_pub_params: Option<CsiNodePubParams>,
    /// Host attachment (unused).
    #[serde(
        default,
        rename = "hostAttachment",
        skip_serializing_if = "Option::is_none"
    )]
    pub host_attachment: Option<HostAttachment>,
    /// Why the volume is not ready (for example a scheduling failure).
    #[serde(default, rename = "msg", skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The failure in `msg` cannot heal by retrying (the pool cannot do it, the object is
    /// invalid as it is): the agent tries again only when the object or its pool changes, and
    /// the CSI driver answers at once instead of waiting. Not in LiteIO; absent = false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub permanent: bool,
}

impl AntstorVolume {
    /// Whether the source agent of a hot migration has committed its switch-over on this
    /// volume (annotation `migrate.obnvmf/ana-state: inaccessible`): from then on the
    /// migration only goes forward, never back to this volume.
    pub fn switch_committed(&self) -> bool {
        crate::meta::annotation(&self.metadata, crate::keys::annotations::MIGRATE_ANA_STATE)
            == Some(crate::keys::ANA_INACCESSIBLE)
    }

    /// The name of the Secret that holds the volume's authentication keys:
    /// `liteio-auth-<CSI name>`, the name kubelet derives from the PV name (the StorageClass
    /// names the node-stage secret `liteio-auth-${pv.name}`). A CSI name that makes no valid
    /// Secret name (uppercase, too long: never a Kubernetes PV name, but a CSI caller may use
    /// one) falls back to `liteio-auth-<object name>`, which always is one.
    pub fn auth_secret_name(&self) -> String {
        use kube::ResourceExt;
        crate::naming::auth_secret_checked(&self.csi_name())
            .unwrap_or_else(|_| crate::naming::auth_secret(&self.name_any()))
    }

    /// The volume's CSI name (its PV's name): the `obnvmf/csi-name` annotation when the
    /// object name had to be derived from it, else the `obnvmf/pv-name` label, else the
    /// object name. The volume's authentication Secret is named after it
    /// ([`crate::naming::auth_secret`]), because kubelet knows only the PV name.
    pub fn csi_name(&self) -> String {
        use kube::ResourceExt;
        self.annotations()
            .get(keys::annotations::CSI_NAME)
            .or_else(|| self.labels().get(keys::labels::PV_NAME))
            .filter(|n| !n.is_empty())
            .cloned()
            .unwrap_or_else(|| self.name_any())
    }

    fn annotation_u64(&self, key: &str) -> u64 {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    }

    /// Bytes the volume takes from its pool: the allocated size when the engine
    /// allocated another size than asked, plus the snapshot reserve.
    pub fn total_size(&self) -> u64 {
        let allocated = self.annotation_u64(keys::annotations::ALLOCATED_BYTES);
        let base = if allocated > 0 {
            allocated
        } else {
            self.spec.size_byte
        };
        base.saturating_add(self.annotation_u64(keys::annotations::SNAPSHOT_RESERVED_BYTES))
    }

    /// True when the consumer runs on the node that holds the data.
    pub fn is_local(&self) -> bool {
        self.spec
            .host_node
            .as_ref()
            .is_some_and(|h| !h.id.is_empty() && h.id == self.spec.target_node_id)
    }

    /// The scheduled node, if any.
    pub fn target_node(&self) -> Option<&str> {
        Some(self.spec.target_node_id.as_str()).filter(|s| !s.is_empty())
    }

    /// Current life-cycle state (`creating` when no status was written yet).
    pub fn phase(&self) -> VolumeStatus {
        self.status.as_ref().map(|s| s.status).unwrap_or_default()
    }

    /// The permanent failure recorded in the status (`msg` with `permanent: true`), if any.
    pub fn permanent_failure(&self) -> Option<&str> {
        self.status
            .as_ref()
            .filter(|s| s.permanent && !s.message.is_empty())
            .map(|s| s.message.as_str())
    }
}
