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

/// The most members a group may have (SPDK's raid bdevs take up to 255 bases; more than a
/// few dozen fragments of one volume is a configuration mistake).
pub const MAX_MEMBERS: i64 = 64;
/// `countRange.max` when the StorageClass gives no `volgroup/max-volumes` (LiteIO: 0, and a
/// group with 0 was never scheduled).
pub const DEFAULT_MAX_MEMBERS: i64 = 8;
/// `sizeRange.min` when the StorageClass gives no `volgroup/min-size` (capped at the
/// volume's size): smaller fragments cost more in connections than they add in space.
pub const DEFAULT_MIN_MEMBER_BYTES: u64 = crate::size::GIB;
/// Annotation on a group (ours, not LiteIO's): bytes each member holds beyond its share of
/// `totalSize`, for the assembly's own metadata (KernelLVM: one 4 MiB extent for the PV
/// label and the VG metadata), so that the assembled device is at least `totalSize`.
pub const ANNO_MEMBER_RESERVE: &str = "liteio.io/member-reserve-bytes";

impl SymmetryValue {
    /// Unset is Asymmetric (LiteIO's behaviour).
    pub fn is_symmetric(self) -> bool {
        self == Self::Symmetric
    }
}

impl AntstorVolumeGroup {
    /// Bytes each member holds beyond its share ([`ANNO_MEMBER_RESERVE`]; 0 when absent or
    /// unparsable, which validation reports).
    pub fn member_reserve(&self) -> u64 {
        crate::meta::annotation(&self.metadata, ANNO_MEMBER_RESERVE)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The members with a node and a size.
    pub fn placed(&self) -> impl Iterator<Item = &VolumeMeta> {
        self.spec
            .volumes
            .iter()
            .filter(|m| m.size > 0 && !m.target_node_name.is_empty())
    }

    /// The bytes of `totalSize` the placed members hold (their sizes less the reserve).
    pub fn scheduled_bytes(&self) -> u64 {
        let reserve = self.member_reserve();
        self.placed()
            .map(|m| u64::try_from(m.size).unwrap_or(0).saturating_sub(reserve))
            .sum()
    }

    /// Whether the placed members hold all of `totalSize`.
    pub fn fully_placed(&self) -> bool {
        self.scheduled_bytes() >= u64::try_from(self.spec.total_size).unwrap_or(u64::MAX)
    }

    /// The member size range in bytes: `sizeRange` with the defaults (min
    /// [`DEFAULT_MIN_MEMBER_BYTES`] capped at the total, max the total).
    pub fn size_bounds(&self) -> (u64, u64) {
        let total = u64::try_from(self.spec.total_size).unwrap_or(0);
        let r = &self.spec.desired_volume_spec.size_range;
        let q = |q: &Option<Quantity>| {
            q.as_ref()
                .and_then(|q| crate::size::parse_quantity(q).ok())
                .filter(|b| *b > 0)
        };
        let min = q(&r.min).unwrap_or(DEFAULT_MIN_MEMBER_BYTES.min(total));
        let max = q(&r.max).unwrap_or(total).max(min);
        (min, max)
    }

    /// The member count range: `countRange` with the defaults (min 1, max
    /// [`DEFAULT_MAX_MEMBERS`]).
    pub fn count_bounds(&self) -> (i64, i64) {
        let r = &self.spec.desired_volume_spec.count_range;
        let min = r.min.max(1);
        let max = if r.max > 0 {
            r.max
        } else {
            DEFAULT_MAX_MEMBERS
        };
        (min, max.max(min))
    }
}

/// The name of the member volume of `group` with `uuid`: stable, so that a controller that
/// restarts between recording a member and creating it creates the same object.
pub fn member_name(group: &str, uuid: &str) -> String {
    let short: String = uuid.chars().filter(|c| *c != '-').take(10).collect();
    format!("{group}-{short}")
}
