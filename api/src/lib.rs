//! LiteIO's Kubernetes API: the six custom resources of group `volume.antstor.alipay.com/v1`,
//! every label, annotation and finalizer key, the naming scheme of engine-side objects, size
//! helpers and typed validation. No I/O happens here.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod auth;
pub mod common;
pub mod crd;
pub mod datacontrol;
pub mod group;
pub mod host_auth;
mod invalid;
pub mod keys;
pub mod meta;
pub mod migration;
pub mod naming;
pub mod pool;
pub mod qos;
pub mod replica;
pub mod size;
pub mod snapshot;
pub mod validate;
pub mod volume;

pub use common::{
    CsiNodePubParams, KernelLvol, NodeInfo, PoolMode, SpdkLvol, SpdkTarget, VolumePosition,
    VolumeStatus, VolumeType,
};
pub use datacontrol::{AntstorDataControl, AntstorDataControlSpec, AntstorDataControlStatus};
pub use group::{AntstorVolumeGroup, AntstorVolumeGroupSpec, AntstorVolumeGroupStatus};
pub use migration::{VolumeMigration, VolumeMigrationSpec, VolumeMigrationStatus};
pub use pool::{StoragePool, StoragePoolSpec, StoragePoolStatus};
pub use snapshot::{AntstorSnapshot, AntstorSnapshotSpec, AntstorSnapshotStatus};
pub use volume::{AntstorVolume, AntstorVolumeSpec, AntstorVolumeStatus};
