//! StoragePool: one per storage node, name = node name.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeAddress;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{NodeInfo, PoolMode, is_zero};
use crate::{keys, size};

/// A logical volume of the VG that is not schedulable (`reserved-*`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ReservedLvol {
    /// LV name.
    #[serde(default)]
    pub name: String,
    /// VG name.
    #[serde(default, rename = "vgName")]
    pub vg_name: String,
    /// Device path.
    #[serde(default, rename = "devPath")]
    pub dev_path: String,
    /// Size in bytes.
    #[serde(default, rename = "sizeByte")]
    pub size_byte: u64,
    /// `linear` or `striped`.
    #[serde(default, rename = "lvLayout")]
    pub lv_layout: String,
}

/// A kernel LVM volume group backing the pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct KernelLvm {
    /// VG name; set when the pool is an LVM pool.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// VG UUID.
    #[serde(default, rename = "vgUUID", skip_serializing_if = "String::is_empty")]
    pub vg_uuid: String,
    /// VG size in bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes: u64,
    /// Extent size in bytes.
    #[serde(default, rename = "extendSize", skip_serializing_if = "is_zero")]
    pub extend_size: u64,
    /// Number of extents.
    #[serde(default, rename = "extendCount", skip_serializing_if = "is_zero")]
    pub extend_count: i64,
    /// Number of PVs.
    #[serde(default, rename = "pvCount", skip_serializing_if = "is_zero")]
    pub pv_count: i64,
    /// LVs excluded from schedulable space.
    #[serde(
        default,
        rename = "reservedLVol",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub reserved_lvol: Vec<ReservedLvol>,
}

/// An SPDK logical volume store backing the pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct SpdkLvStore {
    /// lvstore name; set when the pool is an SPDK pool.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// lvstore UUID.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uuid: String,
    /// Base bdev.
    #[serde(default, rename = "baseBdev", skip_serializing_if = "String::is_empty")]
    pub base_bdev: String,
    /// clusterSize × totalDataClusters.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes: u64,
    /// Cluster size in bytes.
    #[serde(default, rename = "clusterSize", skip_serializing_if = "is_zero")]
    pub cluster_size: i64,
    /// Number of data clusters.
    #[serde(default, rename = "totalDataClusters", skip_serializing_if = "is_zero")]
    pub total_data_clusters: i64,
    /// Block size in bytes.
    #[serde(default, rename = "blockSize", skip_serializing_if = "is_zero")]
    pub block_size: i64,
}

/// Desired state of a storage pool, written by its agent.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "volume.antstor.alipay.com",
    version = "v1",
    kind = "StoragePool",
    namespaced,
    status = "StoragePoolStatus",
    shortname = "sp",
    shortname = "pool",
    category = "liteio",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"ip","type":"string","jsonPath":".spec.nodeInfo.ip"}"#,
    printcolumn = r#"{"name":"hostname","type":"string","jsonPath":".spec.nodeInfo.hostname"}"#,
    printcolumn = r#"{"name":"storage","type":"string","jsonPath":".status.capacity.storage"}"#,
    printcolumn = r#"{"name":"free","type":"string","jsonPath":".status.vgFreeSize"}"#,
    printcolumn = r#"{"name":"status","type":"string","jsonPath":".status.status"}"#,
    printcolumn = r#"{"name":"lvs","type":"string","priority":1,"jsonPath":".spec.spdkLVStore.name"}"#,
    printcolumn = r#"{"name":"vg","type":"string","priority":1,"jsonPath":".spec.kernelLvm.name"}"#,
    printcolumn = r#"{"name":"scheduling","type":"string","priority":1,"jsonPath":".metadata.labels.obnvmf/pool-scheduling-status"}"#,
    printcolumn = r#"{"name":"age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct StoragePoolSpec {
    /// The LVM volume group, for an LVM pool.
    #[serde(default, rename = "kernelLvm")]
    pub kernel_lvm: KernelLvm,
    /// The SPDK lvstore, for an SPDK pool.
    #[serde(default, rename = "spdkLVStore")]
    pub spdk_lv_store: SpdkLvStore,
    /// Addresses of the node (the agent writes `[{InternalIP, nodeIP}]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<NodeAddress>,
    /// The node this pool lives on.
    #[serde(default, rename = "nodeInfo")]
    pub node_info: NodeInfo,
}

/// Type of a pool condition.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum PoolConditionType {
    /// The SPDK data engine answers.
    Spdk,
    /// Every LVM PV is present.
    Lvm,
    /// The Kubernetes node is usable.
    KubeNode,
}

/// Status of a pool condition.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum ConditionStatus {
    /// Healthy.
    #[serde(rename = "OK")]
    Ok,
    /// Unhealthy.
    Error,
}

/// One health aspect of a pool.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct PoolCondition {
    /// Aspect.
    #[serde(rename = "type")]
    pub type_: PoolConditionType,
    /// Health.
    pub status: ConditionStatus,
    /// Detail.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Scheduling state of a pool.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PoolStatus {
    /// Heartbeating and schedulable.
    #[default]
    Ready,
    /// Taken out of scheduling.
    Locked,
    /// Silent for too long.
    Offline,
    /// Silent for a while.
    Unknown,
}

/// Observed state of a storage pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct StoragePoolStatus {
    /// Capacity; key `storage` is the total bytes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, Quantity>,
    /// Real free space reported by the agent.
    #[serde(
        default,
        rename = "vgFreeSize",
        skip_serializing_if = "Option::is_none"
    )]
    pub vg_free_size: Option<Quantity>,
    /// Health conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<PoolCondition>,
    /// Scheduling state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PoolStatus>,
    /// Detail of the state.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl StoragePool {
    /// Whether the pool can serve volumes to other nodes: every remote volume is exported by
    /// the node's SPDK target, whatever the pool's engine, so the pool's `Spdk` condition
    /// must not be `Error` (an agent without SPDK reports it so).
    pub fn can_export(&self) -> bool {
        !self.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == PoolConditionType::Spdk && c.status == ConditionStatus::Error)
        })
    }

    /// The pool's engine, from whichever spec section is filled in.
    pub fn mode(&self) -> Option<PoolMode> {
        if !self.spec.kernel_lvm.name.is_empty() {
            Some(PoolMode::KernelLVM)
        } else if !self.spec.spdk_lv_store.name.is_empty() {
            Some(PoolMode::SpdkLVStore)
        } else {
            None
        }
    }

    /// Total bytes of the pool: the VG, else the lvstore, else `status.capacity.storage`.
    pub fn total_bytes(&self) -> u64 {
        if self.spec.kernel_lvm.bytes > 0 {
            return self.spec.kernel_lvm.bytes;
        }
        if self.spec.spdk_lv_store.bytes > 0 {
            return self.spec.spdk_lv_store.bytes;
        }
        self.status
            .as_ref()
            .and_then(|s| s.capacity.get(keys::RESOURCE_STORAGE))
            .and_then(|q| size::parse_quantity(q).ok())
            .unwrap_or(0)
    }

    /// Free bytes as reported by the agent.
    pub fn reported_free_bytes(&self) -> u64 {
        self.status
            .as_ref()
            .and_then(|s| s.vg_free_size.as_ref())
            .and_then(|q| size::parse_quantity(q).ok())
            .unwrap_or(0)
    }

    /// Total minus the `reserved-*` LVs (sums saturate: sizes come from the API server).
    pub fn available_bytes(&self) -> u64 {
        let reserved: u64 = self
            .spec
            .kernel_lvm
            .reserved_lvol
            .iter()
            .fold(0u64, |sum, l| sum.saturating_add(l.size_byte));
        self.total_bytes().saturating_sub(reserved)
    }

    /// True when the pool is ready and not locked by label.
    pub fn is_schedulable(&self) -> bool {
        let ready = self
            .status
            .as_ref()
            .and_then(|s| s.status)
            .unwrap_or_default()
            == PoolStatus::Ready;
        let locked = self
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(keys::labels::POOL_SCHEDULING_STATUS))
            .is_some_and(|v| v == keys::labels::POOL_SCHEDULING_LOCKED);
        ready && !locked
    }

    /// The node's NVMe host NQN, from the `obnvmf/hostnqn` annotation.
    pub fn host_nqn(&self) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(keys::annotations::HOST_NQN))
            .map(String::as_str)
    }
}
