//! Types shared by several LiteIO resources.
//!
//! Serialization mirrors LiteIO's Go types field by field: a Go field with `omitempty`
//! is skipped when it holds its zero value, a field without it is always written, and a
//! Go pointer is an `Option`. Objects written by the original therefore round-trip
//! unchanged.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// True when `v` holds its type's zero value (Go's `omitempty`).
pub(crate) fn is_zero<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// Where a node is and how to reach it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct NodeInfo {
    /// Node name.
    #[serde(default)]
    pub id: String,
    /// Node IP.
    #[serde(default)]
    pub ip: String,
    /// Node hostname.
    #[serde(default)]
    pub hostname: String,
    /// Selected node labels (the agent's `nodeInfoKeys`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// An NVMe-oF export of a volume.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct SpdkTarget {
    /// Name of the exported bdev.
    #[serde(default, rename = "bdevName")]
    pub bdev_name: String,
    /// Subsystem NQN.
    #[serde(default, rename = "subsysNqn")]
    pub subsys_nqn: String,
    /// Transport service id (the TCP port).
    #[serde(default, rename = "svcID")]
    pub svc_id: String,
    /// Serial number of the subsystem.
    #[serde(default)]
    pub sn: String,
    /// Transport type (`TCP`, `VFIOUSER`).
    #[serde(default, rename = "transType")]
    pub trans_type: String,
    /// Namespace UUID.
    #[serde(default, rename = "nsUuid")]
    pub ns_uuid: String,
    /// Listener address.
    #[serde(default)]
    pub address: String,
    /// Address family (`IPv4`, `IPv6`).
    #[serde(default, rename = "addrFam")]
    pub addr_fam: String,
}

/// A kernel LVM logical volume.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct KernelLvol {
    /// LV name.
    #[serde(default)]
    pub name: String,
    /// Device path of the LV.
    #[serde(default, rename = "devPath")]
    pub dev_path: String,
}

/// An SPDK logical volume.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct SpdkLvol {
    /// lvol name.
    #[serde(default)]
    pub name: String,
    /// Name of the lvstore holding it.
    #[serde(default, rename = "lvsName")]
    pub lvs_name: String,
    /// Thin provisioned.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub thin: bool,
}

impl SpdkLvol {
    /// `lvs/lvol`, the alias SPDK knows the lvol by.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.lvs_name, self.name)
    }
}

/// Parameters the CSI node service was called with, recorded on the volume.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct CsiNodePubParams {
    /// Staging path.
    #[serde(default, rename = "stagingTargetPath")]
    pub staging_target_path: String,
    /// Publish path.
    #[serde(default, rename = "targetPath")]
    pub target_path: String,
    /// Volume context of the publish call.
    #[serde(
        default,
        rename = "volumeContext",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub volume_context: BTreeMap<String, String>,
}

/// Kind of logical volume.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum VolumeType {
    /// Whatever the chosen pool provides.
    #[default]
    Flexible,
    /// A kernel LVM logical volume.
    KernelLVol,
    /// An SPDK lvol.
    SpdkLVol,
}

/// Where the data should be relative to its consumer.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum VolumePosition {
    /// On the consuming node, or fail.
    MustLocal,
    /// On the consuming node if possible.
    PreferLocal,
    /// On another node if possible.
    PreferRemote,
    /// On another node, or fail.
    MustRemote,
    /// No preference.
    #[default]
    #[serde(rename = "")]
    NoPreference,
}

/// Life-cycle state of a volume (also used by volume groups and data controls).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum VolumeStatus {
    /// Being created.
    #[default]
    Creating,
    /// Usable.
    Ready,
    /// Deleted (used by the metadata mirror).
    Deleted,
}

/// Kind of storage pool engine.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum PoolMode {
    /// Kernel LVM volume group.
    KernelLVM,
    /// SPDK logical volume store.
    #[default]
    SpdkLVStore,
}

impl std::fmt::Display for VolumeType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Flexible => "Flexible",
            Self::KernelLVol => "KernelLVol",
            Self::SpdkLVol => "SpdkLVol",
        })
    }
}

impl std::fmt::Display for VolumePosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::MustLocal => "MustLocal",
            Self::PreferLocal => "PreferLocal",
            Self::PreferRemote => "PreferRemote",
            Self::MustRemote => "MustRemote",
            Self::NoPreference => "",
        })
    }
}

impl std::str::FromStr for VolumePosition {
    type Err = crate::invalid::ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        crate::invalid::parse_enum("positionAdvice", s)
    }
}

impl std::str::FromStr for VolumeType {
    type Err = crate::invalid::ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        crate::invalid::parse_enum("volumeType", s)
    }
}

impl std::fmt::Display for PoolMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::KernelLVM => "KernelLVM",
            Self::SpdkLVStore => "SpdkLVStore",
        })
    }
}
