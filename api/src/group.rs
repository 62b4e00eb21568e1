//! AntstorVolumeGroup: several volumes that together make one large device.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{SpdkTarget, VolumeStatus, is_zero};

/// Identity of a namespaced object with a uuid.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct EntityIdentity {
    /// Namespace.
    #[serde(default)]
    pub namespace: String,
    /// Name.
    #[serde(default)]
    pub name: String,
    /// UUID.
    #[serde(default)]
    pub uuid: String,
}

/// An integer range.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct IntRange {
    /// Lower bound.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub min: i64,
    /// Upper bound.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max: i64,
}

/// A quantity range.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct QuantityRange {
    /// Lower bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<Quantity>,
    /// Upper bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<Quantity>,
}

/// Whether member volumes must have equal sizes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum SymmetryValue {
    /// All members the same size.
    Symmetric,
    /// Members may differ.
    Asymmetric,
    /// Not set.
    #[default]
    #[serde(rename = "")]
    Unset,
}

/// Shape of the member volumes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct DesiredVolumeSpec {
    /// Annotations copied to each member.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Labels copied to each member.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Desired member count.
    #[serde(default, rename = "desiredCount", skip_serializing_if = "is_zero")]
    pub desired_count: i64,
    /// Allowed member count.
    #[serde(default, rename = "countRange")]
    pub count_range: IntRange,
    /// Allowed member size.
    #[serde(default, rename = "sizeRange")]
    pub size_range: QuantityRange,
    /// Size symmetry.
    #[serde(default, rename = "sizeSymmetry")]
    pub size_symmetry: SymmetryValue,
}

/// How members are placed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct VolumeGroupStrategy {
    /// `BestFit` or `NonEmptyBestFit`.
    #[serde(default)]
    pub name: String,
    /// Pools below this usage percentage count as empty (LiteIO's spelling).
    #[serde(default, rename = "emptyThreasholdPct")]
    pub empty_threashold_pct: i64,
    /// Whether empty nodes may be used.
    #[serde(default, rename = "allowEmptyNode")]
    pub allow_empty_node: bool,
}

/// One member volume.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct VolumeMeta {
    /// Member identity.
    #[serde(default, rename = "volId")]
    pub vol_id: EntityIdentity,
    /// Member's node.
    #[serde(default, rename = "targetNodeName")]
    pub target_node_name: String,
    /// Member's size in bytes.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub size: i64,
}

/// Desired state of a volume group.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "volume.antstor.alipay.com",
    version = "v1",
    kind = "AntstorVolumeGroup",
    namespaced,
    status = "AntstorVolumeGroupStatus",
    shortname = "avg",
    category = "liteio",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"symmetry","type":"string","jsonPath":".spec.desiredVolumeSpec.sizeSymmetry"}"#,
    printcolumn = r#"{"name":"size","type":"integer","jsonPath":".spec.totalSize"}"#,
    printcolumn = r#"{"name":"status","type":"string","jsonPath":".status.status"}"#,
    printcolumn = r#"{"name":"age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct AntstorVolumeGroupSpec {
    /// Group UUID.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uuid: String,
    /// Total bytes over all members.
    #[serde(default, rename = "totalSize")]
    #[schemars(range(min = 0))]
    pub total_size: i64,
    /// Shape of the members.
    #[serde(default, rename = "desiredVolumeSpec")]
    pub desired_volume_spec: DesiredVolumeSpec,
    /// Placement strategy (LiteIO's spelling `stragety`).
    #[serde(default)]
    pub stragety: VolumeGroupStrategy,
    /// Members.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMeta>,
}

/// Observed state of one member.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct VolumeTargetStatus {
    /// Member UUID.
    #[serde(default)]
    pub uuid: String,
    /// Member export.
    #[serde(
        default,
        rename = "spdkTarget",
        skip_serializing_if = "Option::is_none"
    )]
    pub spdk_target: Option<SpdkTarget>,
    /// Member state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeStatus>,
    /// Detail.
    #[serde(default)]
    pub message: String,
}

/// Observed state of a volume group.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct AntstorVolumeGroupStatus {
    /// Per-member state.
    #[serde(
        default,
        rename = "volumeStatus",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub volume_status: Vec<VolumeTargetStatus>,
    /// Group state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeStatus>,
    /// Detail.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}
