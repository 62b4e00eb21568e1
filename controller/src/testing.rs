//! Test fixtures: builders for pools, volumes, snapshots and migrations
//! (`volume("v1", 10 * GIB).host("n1").scheduled_to("n1").arc()`). Used by the unit and
//! integration tests; nothing here talks to a cluster.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use liteio_api::common::{NodeInfo, VolumePosition, VolumeType};
use liteio_api::keys::{self, labels};
use liteio_api::pool::{
    ConditionStatus, KernelLvm, PoolCondition, PoolConditionType, PoolStatus, ReservedLvol,
    SpdkLvStore,
};
use liteio_api::snapshot::{AntstorSnapshotSpec, SnapshotVolType};
use liteio_api::{
    AntstorSnapshot, AntstorVolume, AntstorVolumeSpec, StoragePool, StoragePoolSpec,
    StoragePoolStatus, VolumeMigration, VolumeMigrationSpec,
};

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(keys::DEFAULT_NAMESPACE.to_string()),
        ..ObjectMeta::default()
    }
}

/// Builder of a [`StoragePool`].
#[derive(Debug, Clone)]
pub struct PoolFixture(pub StoragePool);

/// A ready SPDK pool of `bytes` on node `name`, with a healthy Spdk condition.
pub fn pool(name: &str, bytes: u64) -> PoolFixture {
    let mut m = meta(name);
    m.labels = Some(BTreeMap::from([(
        labels::NODE_SN.to_string(),
        name.to_string(),
    )]));
    PoolFixture(StoragePool {
        metadata: m,
        spec: StoragePoolSpec {
            spdk_lv_store: SpdkLvStore {
                name: keys::DEFAULT_LVS_NAME.into(),
                uuid: format!("lvs-{name}"),
                bytes,
                ..SpdkLvStore::default()
            },
            node_info: NodeInfo {
                id: name.to_string(),
                ip: "10.0.0.1".into(),
                hostname: name.to_string(),
                labels: BTreeMap::new(),
            },
            ..StoragePoolSpec::default()
        },
        status: Some(StoragePoolStatus {
            status: Some(PoolStatus::Ready),
            conditions: vec![PoolCondition {
                type_: PoolConditionType::Spdk,
                status: ConditionStatus::Ok,
                message: String::new(),
            }],
            ..StoragePoolStatus::default()
        }),
    })
}

impl PoolFixture {
    /// Makes it an LVM pool (no SPDK condition).
    pub fn lvm(mut self) -> Self {
        let bytes = self.0.spec.spdk_lv_store.bytes;
        self.0.spec.spdk_lv_store = SpdkLvStore::default();
        self.0.spec.kernel_lvm = KernelLvm {
            name: keys::DEFAULT_LVM_NAME.into(),
            vg_uuid: "vg-uuid".into(),
            bytes,
            ..KernelLvm::default()
        };
        if let Some(s) = self.0.status.as_mut() {
            s.conditions.clear();
        }
        self
    }
    /// Adds a `reserved-*` LV of `bytes`.
    pub fn reserved_lv(mut self, bytes: u64) -> Self {
        self.0.spec.kernel_lvm.reserved_lvol.push(ReservedLvol {
            name: "reserved-1".into(),
            size_byte: bytes,
            ..ReservedLvol::default()
        });
        self
    }
    /// Sets `status.status`.
    pub fn status(mut self, s: PoolStatus) -> Self {
        self.0.status.get_or_insert_with(Default::default).status = Some(s);
        self
    }
    /// Marks the SPDK condition unhealthy.
    pub fn spdk_unhealthy(mut self) -> Self {
        let st = self.0.status.get_or_insert_with(Default::default);
        st.conditions.retain(|c| c.type_ != PoolConditionType::Spdk);
        st.conditions.push(PoolCondition {
            type_: PoolConditionType::Spdk,
            status: ConditionStatus::Error,
            message: "no SPDK target".to_string(),
        });
        self
    }
    /// Sets the reported free size.
    pub fn reported_free(mut self, bytes: u64) -> Self {
        self.0
            .status
            .get_or_insert_with(Default::default)
            .vg_free_size = Some(liteio_api::size::quantity(bytes));
        self
    }
    /// Adds a pool label.
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
        self
    }
    /// Adds a node label (`spec.nodeInfo.labels`).
    pub fn node_label(mut self, k: &str, v: &str) -> Self {
        self.0.spec.node_info.labels.insert(k.into(), v.into());
        self
    }
    /// Locks it by label.
    pub fn locked(self) -> Self {
        self.label(
            labels::POOL_SCHEDULING_STATUS,
            labels::POOL_SCHEDULING_LOCKED,
        )
    }
    /// Sets the creation timestamp.
    pub fn created(mut self, at: Timestamp) -> Self {
        self.0.metadata.creation_timestamp = Some(Time(at));
        self
    }
    /// The pool.
    pub fn build(self) -> StoragePool {
        self.0
    }
    /// The pool in an `Arc`.
    pub fn arc(self) -> Arc<StoragePool> {
        Arc::new(self.0)
    }
}

/// Builder of an [`AntstorVolume`].
#[derive(Debug, Clone)]
pub struct VolumeFixture(pub AntstorVolume);

/// A `Flexible` volume `name` of `bytes` in `obnvmf`, uuid `uuid-<name>`.
pub fn volume(name: &str, bytes: u64) -> VolumeFixture {
    let mut m = meta(name);
    m.labels = Some(BTreeMap::from([(
        labels::VOL_UUID.to_string(),
        format!("uuid-{name}"),
    )]));
    VolumeFixture(AntstorVolume {
        metadata: m,
        spec: AntstorVolumeSpec {
            uuid: format!("uuid-{name}"),
            type_: Some(VolumeType::Flexible),
            size_byte: bytes,
            ..AntstorVolumeSpec::default()
        },
        status: None,
    })
}

impl VolumeFixture {
    /// Sets `spec.targetNodeId` (and the label).
    pub fn scheduled_to(mut self, node: &str) -> Self {
        self.0.spec.target_node_id = node.to_string();
        self.label(labels::TARGET_NODE_ID, node)
    }
    /// Sets the host node.
    pub fn host(mut self, node: &str) -> Self {
        self.0.spec.host_node = Some(NodeInfo {
            id: node.into(),
            ..NodeInfo::default()
        });
        self
    }
    /// Sets the size.
    pub fn size(mut self, bytes: u64) -> Self {
        self.0.spec.size_byte = bytes;
        self
    }
    /// Sets the type.
    pub fn kind(mut self, t: VolumeType) -> Self {
        self.0.spec.type_ = Some(t);
        self
    }
    /// Sets QoS limits of `iops` I/O per second.
    pub fn iops(mut self, iops: u64) -> Self {
        self.0.spec.qos = Some(liteio_api::qos::VolumeQos {
            iops,
            ..Default::default()
        });
        self
    }
    /// Sets the position advice.
    pub fn position(mut self, p: VolumePosition) -> Self {
        self.0.spec.position_advice = p;
        self
    }
    /// Makes it thin.
    pub fn thin(mut self) -> Self {
        self.0.spec.is_thin = true;
        self
    }
    /// Adds an annotation.
    pub fn annotate(mut self, k: &str, v: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
        self
    }
    /// Adds a label.
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
        self
    }
    /// Makes it a clone of snapshot `snap` in `obnvmf`, as the CSI driver labels one.
    pub fn cloned_from(self, snap: &str) -> Self {
        self.label(labels::VOLUME_SOURCE_SNAP_NAME, snap)
            .label(labels::VOLUME_SOURCE_SNAP_NS, keys::DEFAULT_NAMESPACE)
    }
    /// Adds a finalizer.
    pub fn finalizer(mut self, f: &str) -> Self {
        self.0
            .metadata
            .finalizers
            .get_or_insert_with(Vec::new)
            .push(f.into());
        self
    }
    /// Adds the controller's `in-state` finalizer.
    pub fn finalized(self) -> Self {
        self.finalizer(keys::finalizers::IN_STATE)
    }
    /// Sets a deletion timestamp.
    pub fn deleting(mut self) -> Self {
        self.0.metadata.deletion_timestamp = Some(Time(
            Timestamp::new(1_700_000_000, 0).unwrap_or(Timestamp::UNIX_EPOCH),
        ));
        self
    }
    /// The volume.
    pub fn build(self) -> AntstorVolume {
        self.0
    }
    /// The volume in an `Arc`.
    pub fn arc(self) -> Arc<AntstorVolume> {
        Arc::new(self.0)
    }
}

/// Builder of an [`AntstorSnapshot`].
#[derive(Debug, Clone)]
pub struct SnapshotFixture(pub AntstorSnapshot);

/// A snapshot `name` of volume `origin` (both in `obnvmf`) of `bytes`.
pub fn snapshot(name: &str, origin: &str, bytes: u64) -> SnapshotFixture {
    SnapshotFixture(AntstorSnapshot {
        metadata: meta(name),
        spec: AntstorSnapshotSpec {
            uuid: format!("snap-{name}"),
            vol_type: SnapshotVolType::SpdkLVol,
            size: i64::try_from(bytes).unwrap_or(i64::MAX),
            origin_vol_name: origin.into(),
            origin_vol_namespace: keys::DEFAULT_NAMESPACE.into(),
            ..AntstorSnapshotSpec::default()
        },
        status: None,
    })
}

impl SnapshotFixture {
    /// Sets `spec.originVolTargetNodeId`.
    pub fn bound_to(mut self, node: &str) -> Self {
        self.0.spec.origin_vol_target_node_id = node.into();
        self
    }
    /// Adds a label.
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
        self
    }
    /// The snapshot.
    pub fn build(self) -> AntstorSnapshot {
        self.0
    }
    /// The snapshot in an `Arc`.
    pub fn arc(self) -> Arc<AntstorSnapshot> {
        Arc::new(self.0)
    }
}

/// Builder of a [`VolumeMigration`].
#[derive(Debug, Clone)]
pub struct MigrationFixture(pub VolumeMigration);

/// A migration `name` of volume `source` (both in `obnvmf`), destination left to the
/// scheduler.
pub fn migration(name: &str, source: &str) -> MigrationFixture {
    let mut m = VolumeMigration::new(name, VolumeMigrationSpec::default());
    m.metadata = meta(name);
    m.spec.source_volume.namespace = keys::DEFAULT_NAMESPACE.into();
    m.spec.source_volume.name = source.into();
    MigrationFixture(m)
}

impl MigrationFixture {
    /// Names the destination node (`spec.destVolume.targetNodeId`).
    pub fn to(mut self, node: &str) -> Self {
        self.0.spec.dest_volume.target_node_id = node.into();
        self
    }
    /// The migration.
    pub fn build(self) -> VolumeMigration {
        self.0
    }
}
