//! The agent's configuration file.
//!
//! The schema is LiteIO's `agent-config.yaml` (`storage.pooling`, `storage.pvs`, `storage.bdev`,
//! `nodeInfoKeys`, `nodeInfo`), so LiteIO's own files parse unchanged, extended with what this
//! agent needs:
//!
//! ```yaml
//! storage:
//!   pooling: {name: dev-pool, mode: File}      # KernelLVM | SpdkLVStore | File
//!   file: {path: /var/lib/liteio/pool, size: 10Gi}   # File mode only; size 0 = the filesystem
//! spdk:
//!   coreMask: "0x1"
//!   interruptMode: true
//!   noHuge: true                             # development only; production uses hugepages
//!   memSizeMiB: 1024
//!   hugeDir: /dev/hugepages                  # optional hugetlbfs mount (hugepages only)
//!   rpcSocket: /var/tmp/spdk.sock            # optional SPDK-compatible JSON-RPC socket
//!   traceEntries: 0                          # SPDK trace buffer for spdk_trace; 0 = none
//!   maxSubsystems: 4096                      # most volumes the node can export
//!   reactorNice: -10                         # interrupt mode: the reactor's priority
//!   nvmePciAddresses: ["0000:00:04.0"]
//! nvmf:
//!   listenAddress: 192.168.0.10              # default: the node IP
//!   portRange: {start: 4510, end: 4610}
//!   auth: dhchap                             # dhchap (default): per-volume keys in a Secret; none
//!   dhchapDhgroups: [null, ffdhe2048]        # DH groups DH-HMAC-CHAP may use (the default)
//!   exportRecordDir: /var/lib/liteio/exports # serve exports again at restart before the API
//! metrics:
//!   listenAddress: "0.0.0.0:9100"            # absent = no metrics server
//!   liteioCompatNames: false                 # true: also LiteIO's blk_*/spdk_lvol_* names
//! heartbeat: {interval: 20s, duration: 40s}
//! recovery: {collectOrphans: false, orphanGracePeriod: 1h}   # orphans are only reported by default
//! ```
//!
//! Sizes are bytes (LiteIO's integers) or Kubernetes quantities (`"10Gi"`); durations are
//! `"20s"`, `"1m"`, `"1m30s"`, `"500ms"` or a plain number of seconds. Unknown keys are refused,
//! so a misspelt key is reported instead of silently ignored.
//!
//! [`Config::load`] reads, parses and validates; every error names the field path, and
//! errors about a file name the file.
//!
//! Where each part is: `storage.rs` (pool mode and what it is built from), `spdk.rs` (the
//! embedded runtime), `nvmf.rs` (the exports' listener and authentication), `node.rs` (the
//! Node's label keys), `timing.rs` (heartbeat, timeouts, orphans' grace); the document
//! itself, the `metrics` section and the order of the checks are here. `error.rs` holds the
//! error and the checks that name a field; `value.rs` how sizes, durations and enums are
//! written. Every public name is re-exported here. Each section's defaults are one table, its
//! `Default` impl (a missing key takes its value from it), built from the `DEFAULT_*`
//! constants beside it.

mod error;
mod node;
mod nvmf;
mod spdk;
mod storage;
mod timing;
mod value;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use liteio_api::NodeInfo;
use serde::{Deserialize, Serialize};

pub use self::error::ConfigError;
pub use self::node::NodeInfoKeys;
pub use self::nvmf::{
    DEFAULT_DHCHAP_DHGROUPS, DEFAULT_PORT_END, DEFAULT_PORT_START, DHCHAP_DHGROUPS, NvmfAuth,
    NvmfConfig, PortRange,
};
pub use self::spdk::{
    DEFAULT_CORE_MASK, DEFAULT_MAX_SUBSYSTEMS, DEFAULT_NO_HUGE_MEM_MIB, DEFAULT_REACTOR_NICE,
    MIN_MEM_MIB, SpdkConfig,
};
pub use self::storage::{
    BdevType, DEFAULT_LVM_NAME, DEFAULT_LVS_NAME, DEFAULT_RAID0_NAME, FilePool, LvmPv, Pooling,
    PoolingMode, SpdkBdev, StorageConfig,
};
pub use self::timing::{
    DEFAULT_API_REQUEST_TIMEOUT, DEFAULT_COMMAND_TIMEOUT, DEFAULT_HEARTBEAT_DURATION,
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_NVME_ADMIN_TIMEOUT, DEFAULT_NVME_IO_TIMEOUT,
    DEFAULT_NVME_TRANSPORT_TIMEOUT, DEFAULT_ORPHAN_GRACE, DEFAULT_SPDK_REQUEST_TIMEOUT,
    HeartbeatConfig, RecoveryConfig, TimeoutsConfig,
};
pub use self::value::{format_duration, parse_duration};

/// The whole agent configuration.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// How the pool is built.
    pub storage: StorageConfig,
    /// Node label keys for IP, hostname, rack and room.
    #[serde(rename = "nodeInfoKeys", default)]
    pub node_info_keys: NodeInfoKeys,
    /// Node info given directly (LiteIO accepts it; normally derived from the Node).
    #[serde(rename = "nodeInfo", default, skip_serializing_if = "Option::is_none")]
    pub node_info: Option<NodeInfo>,
    /// SPDK runtime options (used by the `SpdkLVStore` engine and remote export).
    #[serde(default)]
    pub spdk: SpdkConfig,
    /// NVMe-oF TCP listener.
    #[serde(default)]
    pub nvmf: NvmfConfig,
    /// Prometheus endpoint.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// Lease heartbeat timings.
    #[serde(default)]
    pub heartbeat: HeartbeatConfig,
    /// Restart recovery: what to do with engine objects no API object owns.
    #[serde(default)]
    pub recovery: RecoveryConfig,
    /// How long the agent waits for anything outside itself.
    #[serde(default)]
    pub timeouts: TimeoutsConfig,
}

/// `metrics`: the Prometheus endpoint.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` to serve `/metrics` on; absent = no metrics server.
    #[serde(rename = "listenAddress", skip_serializing_if = "Option::is_none")]
    pub listen_address: Option<SocketAddr>,
    /// Also serve the per-volume I/O counters under the names, units and `pvc` label of
    /// LiteIO's Go agent (`blk_*`, `spdk_lvol_*`), for dashboards written against it. Off by
    /// default: those names break Prometheus' conventions (`promtool check metrics` flags
    /// them). See docs/metrics.md.
    #[serde(
        rename = "liteioCompatNames",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub liteio_compat_names: bool,
}

impl Config {
    /// A config for the file engine over `dir`, with defaults for everything else.
    pub fn file_pool(name: &str, dir: impl Into<PathBuf>) -> Self {
        Self {
            storage: StorageConfig {
                pooling: Pooling {
                    name: name.to_string(),
                    mode: PoolingMode::File,
                },
                pvs: Vec::new(),
                bdev: None,
                file: Some(FilePool {
                    path: dir.into(),
                    size: 0,
                }),
            },
            node_info_keys: NodeInfoKeys::default(),
            node_info: None,
            spdk: SpdkConfig::default(),
            nvmf: NvmfConfig::default(),
            metrics: MetricsConfig::default(),
            heartbeat: HeartbeatConfig::default(),
            recovery: RecoveryConfig::default(),
            timeouts: TimeoutsConfig::default(),
        }
    }

    /// Reads, parses and validates `path`. Errors name the file and the field.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_yaml(&text).map_err(|e| ConfigError::File {
            path: path.to_path_buf(),
            source: Box::new(e),
        })
    }

    /// Parses and validates YAML text.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let de = serde_yaml::Deserializer::from_str(text);
        let cfg: Self = serde_path_to_error::deserialize(de).map_err(|e| {
            // An empty key (YAML `?`) has an empty path: say so rather than name nothing.
            let field = Some(e.path().to_string())
                .filter(|f| !f.is_empty())
                .unwrap_or_else(|| "(empty key)".to_string());
            let inner = e.into_inner();
            let mut message = inner.to_string();
            // serde_yaml prefixes the parent's path ("storage.pooling: …"); the field path
            // says it better. Its " at line L column C" suffix stays: it helps find the spot.
            if let Some((prefix, rest)) = message.split_once(": ")
                && !prefix.contains([' ', '"', '`'])
                && field.starts_with(prefix)
            {
                message = rest.to_string();
            }
            ConfigError::Parse { field, message }
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks what the types cannot: required fields per mode, ranges, formats. The sections
    /// are checked in the order of the file, and the first error is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.storage.validate()?;
        let raid_pool = self
            .storage
            .bdev
            .as_ref()
            .is_some_and(|b| b.kind == BdevType::Raid);
        self.spdk.validate(raid_pool)?;
        self.nvmf.validate()?;
        self.heartbeat.validate()?;
        self.timeouts.validate()?;
        self.node_info_keys.validate()
    }
}
