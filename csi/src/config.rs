//! Settings shared by the services.

use std::path::PathBuf;
use std::time::Duration;

/// Settings of one driver process.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// This node's name (NodeGetInfo, local-device decisions).
    pub node_id: String,
    /// Namespace of LiteIO's objects.
    pub namespace: String,
    /// Version reported by GetPluginInfo.
    pub version: String,
    /// How long CreateVolume waits for the controller to schedule the volume.
    pub schedule_timeout: Duration,
    /// How long NodeStageVolume waits for the volume to become ready.
    pub ready_timeout: Duration,
    /// How long CreateSnapshot waits for the storage node to cut the snapshot before it
    /// answers `ready_to_use = false` (the CO polls again).
    pub snapshot_wait: Duration,
    /// What this host's kernel can do for NVMe-oF connections; `None` = found at start
    /// ([`crate::nvme::this_host_capabilities`]). Tests give it.
    pub host_capabilities: Option<crate::nvme::HostCapabilities>,
    /// How long NodeStageVolume waits for an NVMe namespace to appear after connecting.
    pub device_timeout: Duration,
    /// Root of sysfs (`/sys`); tests point it at a fake tree.
    pub sysfs_root: PathBuf,
    /// This node's NVMe host NQN file (`/etc/nvme/hostnqn`).
    pub hostnqn_path: PathBuf,
    /// This node's NVMe host id file (`/etc/nvme/hostid`); used when present, as nvme-cli does.
    pub hostid_path: PathBuf,
    /// The kernel's NVMe-oF control device (`/dev/nvme-fabrics`), written directly for
    /// authenticated connections.
    pub fabrics_dev: PathBuf,
    /// Path of the mount table (`/proc/self/mountinfo`).
    pub mountinfo_path: PathBuf,
    /// Reported by NodeGetInfo.
    pub max_volumes_per_node: i64,
    /// Delay before the first retry of a VolumeMigration the node failed to act on; doubles
    /// on each further failure up to [`DriverConfig::migration_retry_max`].
    pub migration_retry: Duration,
    /// Longest delay between retries of a failing VolumeMigration.
    pub migration_retry_max: Duration,
}

impl DriverConfig {
    /// Defaults for node `node_id`.
    pub fn new(node_id: impl Into<String>) -> Self {
        DriverConfig {
            node_id: node_id.into(),
            namespace: liteio_api::keys::DEFAULT_NAMESPACE.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            schedule_timeout: Duration::from_secs(30),
            ready_timeout: Duration::from_secs(30),
            snapshot_wait: Duration::from_secs(5),
            device_timeout: Duration::from_secs(20),
            host_capabilities: None,
            sysfs_root: PathBuf::from("/sys"),
            hostnqn_path: PathBuf::from("/etc/nvme/hostnqn"),
            hostid_path: PathBuf::from("/etc/nvme/hostid"),
            fabrics_dev: PathBuf::from(crate::nvme::FABRICS_DEV),
            mountinfo_path: PathBuf::from("/proc/self/mountinfo"),
            max_volumes_per_node: 20,
            migration_retry: Duration::from_secs(2),
            migration_retry_max: Duration::from_secs(300),
        }
    }
}
