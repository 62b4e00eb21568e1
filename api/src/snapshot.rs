//! AntstorSnapshot: a point-in-time copy of a volume, on the volume's node.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{KernelLvol, SpdkLvol};

/// Kind of a snapshot's origin volume.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum SnapshotVolType {
    /// LVM snapshot.
    KernelLVol,
    /// SPDK lvol snapshot.
    #[default]
    SpdkLVol,
}

/// Desired state of a snapshot.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "volume.antstor.alipay.com",
    version = "v1",
    kind = "AntstorSnapshot",
    namespaced,
    status = "AntstorSnapshotStatus",
    shortname = "asnap",
    category = "liteio",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"size","type":"integer","jsonPath":".spec.size"}"#,
    printcolumn = r#"{"name":"volType","type":"string","jsonPath":".spec.volType"}"#,
    printcolumn = r#"{"name":"originVol","type":"string","jsonPath":".spec.originVolName"}"#,
    printcolumn = r#"{"name":"status","type":"string","jsonPath":".status.status"}"#,
    printcolumn = r#"{"name":"msg","type":"string","priority":1,"jsonPath":".status.msg"}"#,
    printcolumn = r#"{"name":"targetId","type":"string","priority":1,"jsonPath":".spec.originVolTargetNodeId"}"#,
    printcolumn = r#"{"name":"age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct AntstorSnapshotSpec {
    /// Snapshot UUID; the CSI snapshot id.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uuid: String,
    /// Kind of the origin volume.
    #[serde(rename = "volType")]
    pub vol_type: SnapshotVolType,
    /// The LVM snapshot.
    #[serde(default, rename = "kernelLvol")]
    pub kernel_lvol: KernelLvol,
    /// The SPDK snapshot.
    #[serde(default, rename = "spdkLvol")]
    pub spdk_lvol: SpdkLvol,
    /// Size in bytes (the reserve it may use).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub size: i64,
    /// Origin volume name.
    #[serde(default, rename = "originVolName")]
    pub origin_vol_name: String,
    /// Origin volume namespace.
    #[serde(default, rename = "originVolNamespace")]
    pub origin_vol_namespace: String,
    /// Node holding the origin volume.
    #[serde(default, rename = "originVolTargetNodeId")]
    pub origin_vol_target_node_id: String,
}

/// Life-cycle state of a snapshot.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotStatusName {
    /// Being created.
    #[default]
    Creating,
    /// Usable.
    Ready,
    /// Being merged back into its origin (restore).
    Merging,
    /// Merged into its origin.
    Merged,
}

/// Observed state of a snapshot.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct AntstorSnapshotStatus {
    /// Life-cycle state.
    #[serde(default)]
    pub status: SnapshotStatusName,
    /// Why the snapshot is not (yet) in the state it should reach: the storage node's last
    /// error. Not in LiteIO.
    #[serde(default, rename = "msg", skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The failure in `msg` cannot heal by retrying (e.g. the pool's file system has no
    /// reflinks): retried only when the snapshot or its pool changes. Not in LiteIO.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub permanent: bool,
}

impl AntstorSnapshot {
    /// The permanent failure recorded in the status (`msg` with `permanent: true`), if any.
    pub fn permanent_failure(&self) -> Option<&str> {
        self.status
            .as_ref()
            .filter(|s| s.permanent && !s.message.is_empty())
            .map(|s| s.message.as_str())
    }
}
