//! AntstorDataControl: aggregates volume groups into one device on the host.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{CsiNodePubParams, NodeInfo, PoolMode, SpdkTarget, VolumeStatus};
use crate::group::EntityIdentity;
use crate::replica::{Condition, ReplicaHealth, ReplicaStatus};

/// RAID level of the aggregate.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RaidLevel {
    /// Concatenation.
    #[default]
    Linear,
    /// Striping.
    Raid0,
    /// Mirroring.
    Raid1,
    /// Single parity.
    Raid5,
    /// Double parity.
    Raid6,
}

/// RAID settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Raid {
    /// Level.
    #[serde(default)]
    pub level: RaidLevel,
}

/// One PV of the host-side VG.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct LvmControlPv {
    /// Device path on the host.
    #[serde(default, rename = "devPath")]
    pub dev_path: String,
    /// Member volume.
    #[serde(default, rename = "volId")]
    pub vol_id: EntityIdentity,
    /// Member export.
    #[serde(default)]
    pub target: SpdkTarget,
}

/// Host-side LVM aggregate.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct LvmControl {
    /// VG name.
    #[serde(default)]
    pub vg: String,
    /// LV name.
    #[serde(default)]
    pub lvol: String,
    /// PVs.
    #[serde(default)]
    pub pvs: Vec<LvmControlPv>,
}

/// Desired state of a data control.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "volume.antstor.alipay.com",
    version = "v1",
    kind = "AntstorDataControl",
    namespaced,
    status = "AntstorDataControlStatus",
    shortname = "adc",
    category = "liteio",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"type","type":"string","jsonPath":".spec.engineType"}"#,
    printcolumn = r#"{"name":"raid","type":"string","jsonPath":".spec.raid.level"}"#,
    printcolumn = r#"{"name":"host","type":"string","jsonPath":".spec.hostNode.ip"}"#,
    printcolumn = r#"{"name":"status","type":"string","jsonPath":".status.status"}"#,
    printcolumn = r#"{"name":"age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct AntstorDataControlSpec {
    /// UUID (LiteIO prefixes it with `dc-`).
    #[serde(default)]
    pub uuid: String,
    /// Total bytes.
    #[serde(default, rename = "totalSize")]
    #[schemars(range(min = 0))]
    pub total_size: i64,
    /// Host-side LVM aggregate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lvm: Option<LvmControl>,
    /// Engine of the aggregate.
    #[serde(default, rename = "engineType")]
    pub engine_type: PoolMode,
    /// RAID settings.
    #[serde(default)]
    pub raid: Raid,
    /// Consuming node.
    #[serde(default, rename = "hostNode")]
    pub host_node: NodeInfo,
    /// Node that builds the aggregate.
    #[serde(default, rename = "targetNodeId")]
    pub target_node_id: String,
    /// Member volume groups.
    #[serde(default, rename = "volumeGroups")]
    pub volume_groups: Vec<EntityIdentity>,
}

/// Observed state of a data control.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct AntstorDataControlStatus {
    /// State.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeStatus>,
    /// Parameters of the last CSI publish.
    #[serde(
        default,
        rename = "csiNodePubParams",
        skip_serializing_if = "Option::is_none"
    )]
    pub csi_node_pub_params: Option<CsiNodePubParams>,
    /// SpdkLVStore: the export of the assembled device, written by the agent that assembled
    /// it (ours: LiteIO never assembled in SPDK).
    #[serde(
        default,
        rename = "spdkTarget",
        skip_serializing_if = "Option::is_none"
    )]
    pub spdk_target: Option<SpdkTarget>,
    /// Detail.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// raid1 (replicated volumes): the volume's health, written by the controller from
    /// `replicas` and the pools' liveness (ours: LiteIO had no replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<ReplicaHealth>,
    /// raid1: each replica as the assembling disk-agent sees it, in the raid's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaStatus>,
    /// raid1: conditions (`Degraded`), written by the controller.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl AntstorDataControl {
    /// Whether it is a replicated volume (raid level raid1): its group's members each hold
    /// the whole volume.
    pub fn is_replicated(&self) -> bool {
        self.spec.raid.level == RaidLevel::Raid1
    }
}
