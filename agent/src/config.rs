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

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use liteio_api::NodeInfo;
use liteio_api::keys::labels;
use liteio_api::size;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

/// Default VG name when LiteIO runs without a config file.
pub const DEFAULT_LVM_NAME: &str = "antstore-vg";
/// Default lvstore name.
pub const DEFAULT_LVS_NAME: &str = "antstor_lvstore";
/// Default raid0 bdev name of the NVMe takeover.
pub const DEFAULT_RAID0_NAME: &str = "antstor_raid0";
/// First NVMe/TCP port LiteIO hands out.
pub const DEFAULT_PORT_START: u16 = 4510;
/// Last NVMe/TCP port LiteIO hands out.
pub const DEFAULT_PORT_END: u16 = 4610;
/// Default Lease renewal period.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(20);
/// Default Lease duration.
pub const DEFAULT_HEARTBEAT_DURATION: Duration = Duration::from_secs(40);
/// Default limit of one request to the embedded SPDK (`timeouts.spdkRequest`).
pub const DEFAULT_SPDK_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Default SPDK core mask.
pub const DEFAULT_CORE_MASK: &str = "0x1";
/// SPDK memory used in no-huge mode when `spdk.memSizeMiB` is not set.
pub const DEFAULT_NO_HUGE_MEM_MIB: u32 = 1024;
/// Smallest SPDK memory size accepted.
pub const MIN_MEM_MIB: u32 = 64;

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read agent config {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file's content is wrong; the source says where and why.
    #[error("agent config {}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: Box<ConfigError>,
    },
    /// YAML syntax, a wrong type, an unknown key or a value outside a fixed set.
    #[error("{field}: {message}")]
    Parse {
        /// Dotted path of the field (`storage.pooling.mode`); `.` for the document.
        field: String,
        /// What the parser said.
        message: String,
    },
    /// A required field is missing or empty.
    #[error("{field}: required {reason}")]
    Missing {
        /// Dotted path of the field.
        field: String,
        /// When it is required.
        reason: String,
    },
    /// A value is present but not acceptable.
    #[error("{field}: {value} {problem}")]
    Invalid {
        /// Dotted path of the field.
        field: String,
        /// The value as written.
        value: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl ConfigError {
    /// Dotted path of the offending field, when the error is about one field.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Read { .. } => None,
            Self::File { source, .. } => source.field(),
            Self::Parse { field, .. }
            | Self::Missing { field, .. }
            | Self::Invalid { field, .. } => Some(field),
        }
    }
}

fn invalid(field: &str, value: impl fmt::Display, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_string(),
        value: value.to_string(),
        problem: problem.into(),
    }
}

fn missing(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Missing {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// `"a", "b", "c"`.
fn quoted_list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A string enum whose parse error lists the allowed values.
macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every accepted spelling, in order.
            pub const ALLOWED: &'static [&'static str] = &[$($text),+];

            /// The spelling used in the file.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text),+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok(Self::$variant),)+
                    other => Err(format!("{other:?} is not one of {}", quoted_list(Self::ALLOWED))),
                }
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(de::Error::custom)
            }
        }
    };
}

string_enum! {
    /// Which engine builds the pool.
    PoolingMode {
        /// Kernel LVM volume group.
        KernelLvm = "KernelLVM",
        /// SPDK logical volume store (needs the `spdk` feature).
        SpdkLvStore = "SpdkLVStore",
        /// A directory of sparse files (development and CI).
        File = "File",
    }
}

string_enum! {
    /// Kind of SPDK base bdev under the lvstore.
    BdevType {
        /// Linux AIO over a file or block device.
        Aio = "aioBdev",
        /// RAM (tests).
        Mem = "memBdev",
        /// NVMe devices over VFIO (raid0 when several).
        Raid = "raidBdev",
    }
}

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

/// `storage`: pool mode and what it is built from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// Pool name and engine.
    pub pooling: Pooling,
    /// LVM physical volumes (KernelLVM only; empty = the VG must exist).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pvs: Vec<LvmPv>,
    /// SPDK base bdev (SpdkLVStore only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bdev: Option<SpdkBdev>,
    /// Pool directory (File only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<FilePool>,
}

/// `storage.pooling`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Pooling {
    /// VG name, lvstore name, or a label for the file pool.
    pub name: String,
    /// Engine.
    pub mode: PoolingMode,
}

/// `storage.pvs[i]`: one LVM physical volume.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct LvmPv {
    /// Block device; empty = a loop device over `filePath`.
    #[serde(rename = "devicePath", default)]
    pub device_path: String,
    /// Size of the backing file in bytes.
    #[serde(default, deserialize_with = "de_size")]
    pub size: u64,
    /// Backing file of a loop device.
    #[serde(rename = "filePath", default)]
    pub file_path: String,
    /// Create the backing file when missing (LiteIO always does; kept for compatibility).
    #[serde(rename = "createIfNotExist", default)]
    pub create_if_not_exist: bool,
}

/// `storage.bdev`: the lvstore's base bdev.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SpdkBdev {
    /// Kind of bdev.
    #[serde(rename = "type")]
    pub kind: BdevType,
    /// Bdev name.
    pub name: String,
    /// Size in bytes (memBdev; aioBdev when the file is created).
    #[serde(default, deserialize_with = "de_size")]
    pub size: u64,
    /// Backing file or device of an aioBdev.
    #[serde(rename = "filePath", default)]
    pub file_path: String,
    /// Create the aio file when missing.
    #[serde(rename = "createIfNotExist", default)]
    pub create_if_not_exist: bool,
    /// Declared by LiteIO and unused there; use `spdk.nvmePciAddresses`.
    #[serde(
        rename = "vfioPCIeKeyword",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub vfio_pcie_keyword: String,
}

/// `storage.file`: the file engine's directory.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FilePool {
    /// Absolute directory holding the pool.
    pub path: PathBuf,
    /// Capacity cap in bytes; 0 = the size of the filesystem.
    #[serde(default, deserialize_with = "de_size")]
    pub size: u64,
}

/// `nodeInfoKeys`: which Node labels carry the node's facts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeInfoKeys {
    /// Label with the node IP.
    #[serde(rename = "ipLabelKey", default = "default_ip_key")]
    pub ip_label_key: String,
    /// Label with the hostname.
    #[serde(rename = "hostnameLabelKey", default = "default_hostname_key")]
    pub hostname_label_key: String,
    /// Label with the rack.
    #[serde(rename = "rackLabelKey", default = "default_rack_key")]
    pub rack_label_key: String,
    /// Label with the room.
    #[serde(rename = "roomLabelKey", default = "default_room_key")]
    pub room_label_key: String,
}

fn default_ip_key() -> String {
    labels::NODE_IP.to_string()
}
fn default_hostname_key() -> String {
    labels::NODE_HOSTNAME.to_string()
}
fn default_rack_key() -> String {
    labels::NODE_RACK.to_string()
}
fn default_room_key() -> String {
    labels::NODE_ROOM.to_string()
}

impl Default for NodeInfoKeys {
    fn default() -> Self {
        Self {
            ip_label_key: default_ip_key(),
            hostname_label_key: default_hostname_key(),
            rack_label_key: default_rack_key(),
            room_label_key: default_room_key(),
        }
    }
}

/// `spdk`: the embedded SPDK runtime.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SpdkConfig {
    /// Reactor core mask, hexadecimal (`"0x3"`).
    #[serde(rename = "coreMask", default = "default_core_mask")]
    pub core_mask: String,
    /// Reactors sleep when idle instead of polling.
    #[serde(rename = "interruptMode", default)]
    pub interrupt_mode: bool,
    /// Run without hugepages (development).
    #[serde(rename = "noHuge", default)]
    pub no_huge: bool,
    /// SPDK memory in MiB; see [`SpdkConfig::mem_size_mib`].
    #[serde(
        rename = "memSizeMiB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub mem_size_mib: Option<u32>,
    /// The hugetlbfs mount SPDK takes its 2 MiB hugepages from (DPDK's `--huge-dir`); absent =
    /// any hugetlbfs mount of the default page size. Not allowed with `noHuge`.
    #[serde(rename = "hugeDir", default, skip_serializing_if = "Option::is_none")]
    pub huge_dir: Option<PathBuf>,
    /// Optional SPDK-compatible JSON-RPC socket for debugging tools.
    #[serde(rename = "rpcSocket", default, skip_serializing_if = "Option::is_none")]
    pub rpc_socket: Option<PathBuf>,
    /// NVMe controllers to take over, as PCI addresses (`0000:00:04.0`).
    #[serde(
        rename = "nvmePciAddresses",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub nvme_pci_addresses: Vec<String>,
    /// Entries of SPDK's trace buffer for `spdk_trace` (0, the default, keeps none: it takes
    /// RAM in /dev/shm and is left behind when the agent is killed).
    #[serde(rename = "traceEntries", default, skip_serializing_if = "is_zero")]
    pub trace_entries: u64,
    /// Claim the reactor cores with SPDK's lock files so that a second SPDK process on the
    /// same cores fails to start (default true). Turn it off only to run several agents on
    /// one machine for development (`liteio-local --nodes N`).
    #[serde(rename = "lockCores", default = "yes")]
    pub lock_cores: bool,
    /// Most volumes this node can export: the NVMe-oF target's subsystem slots (default
    /// 4,096; SPDK's own default, 1,024, capped a node at 1,023 volumes).
    #[serde(rename = "maxSubsystems", default = "default_max_subsystems")]
    pub max_subsystems: u32,
    /// Nice value (-20..=19) of the reactor that runs the agent's requests, in interrupt mode
    /// (default -10; 0 leaves it). DPDK pins the reactor to its core, so without it a burst
    /// of provisioning left requests queued for seconds while the reactor waited for its
    /// core behind the agent's other threads.
    #[serde(rename = "reactorNice", default = "default_reactor_nice")]
    pub reactor_nice: i32,
}

/// Default of `spdk.reactorNice`.
pub const DEFAULT_REACTOR_NICE: i32 = -10;

fn default_reactor_nice() -> i32 {
    DEFAULT_REACTOR_NICE
}

/// Default of `spdk.maxSubsystems`.
pub const DEFAULT_MAX_SUBSYSTEMS: u32 = 4096;

fn default_max_subsystems() -> u32 {
    DEFAULT_MAX_SUBSYSTEMS
}

fn yes() -> bool {
    true
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn default_core_mask() -> String {
    DEFAULT_CORE_MASK.to_string()
}

impl Default for SpdkConfig {
    fn default() -> Self {
        Self {
            core_mask: default_core_mask(),
            interrupt_mode: false,
            no_huge: false,
            mem_size_mib: None,
            huge_dir: None,
            rpc_socket: None,
            nvme_pci_addresses: Vec::new(),
            trace_entries: 0,
            lock_cores: true,
            max_subsystems: DEFAULT_MAX_SUBSYSTEMS,
            reactor_nice: DEFAULT_REACTOR_NICE,
        }
    }
}

impl SpdkConfig {
    /// Memory to give SPDK: the configured size, else [`DEFAULT_NO_HUGE_MEM_MIB`] in no-huge
    /// mode, else `None` (SPDK's own default over the hugepages).
    pub fn mem_size_mib(&self) -> Option<u32> {
        self.mem_size_mib
            .or(self.no_huge.then_some(DEFAULT_NO_HUGE_MEM_MIB))
    }

    /// The core mask as a number (valid after [`Config::validate`]).
    pub fn core_mask_bits(&self) -> Option<u128> {
        parse_core_mask(&self.core_mask)
    }
}

/// `nvmf`: the NVMe/TCP listener.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NvmfConfig {
    /// Address to listen on; default the node IP.
    #[serde(
        rename = "listenAddress",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub listen_address: Option<IpAddr>,
    /// Ports handed out to subsystems.
    #[serde(rename = "portRange", default)]
    pub port_range: PortRange,
    /// How hosts prove who they are when they connect to an export.
    #[serde(default)]
    pub auth: NvmfAuth,
    /// Diffie-Hellman groups DH-HMAC-CHAP may use, from [`DHCHAP_DHGROUPS`]; the target picks
    /// the strongest one the host also offers. Each new queue pair computes one exchange on
    /// the target's reactor, which serves nothing else meanwhile, so the default leaves out
    /// the large groups (see docs/auth.md for the measured cost of each).
    #[serde(rename = "dhchapDhgroups", default = "default_dhgroups")]
    pub dhchap_dhgroups: Vec<String>,
    /// Where the agent keeps its own record of the exports it serves (one file per volume,
    /// readable by root alone: it holds the volume's keys). A restarted agent serves them
    /// again from it as soon as its pool is ready, before it reaches the API server, then
    /// reconciles them with the volumes (see docs/failures.md). Absent: exports come back
    /// only through the volume reconcilers, once the API server answers.
    #[serde(
        rename = "exportRecordDir",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub export_record_dir: Option<PathBuf>,
}

impl Default for NvmfConfig {
    fn default() -> Self {
        Self {
            listen_address: None,
            port_range: PortRange::default(),
            auth: NvmfAuth::default(),
            dhchap_dhgroups: default_dhgroups(),
            export_record_dir: None,
        }
    }
}

/// The DH groups `nvmf.dhchapDhgroups` may name, weakest first (`null`: no DH exchange, the
/// challenge and response rest on the 256-bit keys alone).
pub const DHCHAP_DHGROUPS: [&str; 6] = [
    "null",
    "ffdhe2048",
    "ffdhe3072",
    "ffdhe4096",
    "ffdhe6144",
    "ffdhe8192",
];

fn default_dhgroups() -> Vec<String> {
    vec!["null".into(), "ffdhe2048".into()]
}

/// `nvmf.auth`: how hosts authenticate to this node's exports.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum NvmfAuth {
    /// DH-HMAC-CHAP, bidirectional, with keys generated per volume and kept in the volume's
    /// Secret (the default). TLS too for volumes that ask for it.
    #[default]
    Dhchap,
    /// The host NQN alone admits a host (anyone who knows it can connect).
    None,
}

/// An inclusive TCP port range.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PortRange {
    /// First port.
    pub start: u32,
    /// Last port (inclusive).
    pub end: u32,
}

impl Default for PortRange {
    fn default() -> Self {
        Self {
            start: u32::from(DEFAULT_PORT_START),
            end: u32::from(DEFAULT_PORT_END),
        }
    }
}

impl PortRange {
    /// The ports, once validated.
    pub fn ports(&self) -> std::ops::RangeInclusive<u32> {
        self.start..=self.end
    }
}

/// `metrics`: the Prometheus endpoint.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` to serve `/metrics` on; absent = no metrics server.
    #[serde(
        rename = "listenAddress",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub listen_address: Option<SocketAddr>,
    /// Also serve the per-volume I/O counters under the names, units and `pvc` label of
    /// LiteIO's Go agent (`blk_*`, `spdk_lvol_*`), for dashboards written against it. Off by
    /// default: those names break Prometheus' conventions (`promtool check metrics` flags
    /// them). See docs/metrics.md.
    #[serde(
        rename = "liteioCompatNames",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub liteio_compat_names: bool,
}

/// `heartbeat`: Lease timings.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatConfig {
    /// Renewal period.
    #[serde(
        default = "default_hb_interval",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub interval: Duration,
    /// `leaseDurationSeconds`; must exceed the interval.
    #[serde(
        default = "default_hb_duration",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub duration: Duration,
}

fn default_hb_interval() -> Duration {
    DEFAULT_HEARTBEAT_INTERVAL
}
fn default_hb_duration() -> Duration {
    DEFAULT_HEARTBEAT_DURATION
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        Self {
            interval: DEFAULT_HEARTBEAT_INTERVAL,
            duration: DEFAULT_HEARTBEAT_DURATION,
        }
    }
}

/// Default limit of one Kubernetes API request.
pub const DEFAULT_API_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Default limit of one external command (`lvcreate`, `losetup`, `mkfs`, ...).
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

/// `timeouts`: every wait of the agent on something outside itself is bounded, and these are
/// the bounds. A call that runs out fails its operation with an error naming what timed out;
/// the volume is retried with back-off and the other volumes go on. (The Lease renewal has
/// its own bound, derived from `heartbeat.interval`.)
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TimeoutsConfig {
    /// One request to the Kubernetes API server (default 10s).
    #[serde(
        rename = "apiRequest",
        default = "default_api_request_timeout",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub api_request: Duration,
    /// One request to the embedded SPDK, from sending it to its completion (default 30s).
    /// Past it the request is reported stuck: metric `liteio_spdk_stuck_requests`, an error
    /// log naming the caller and the pool's `Spdk` condition, until its late answer comes.
    #[serde(
        rename = "spdkRequest",
        default = "default_spdk_request_timeout",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub spdk_request: Duration,
    /// One external command; it is killed when it runs longer (default 5m).
    #[serde(
        default = "default_command_timeout",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub command: Duration,
    /// One I/O command this node's NVMe-oF initiator sent (to a remote replica or member of
    /// an assembly, or to a migration's destination) without an answer: its controller is
    /// reset, and the I/O fails once reconnecting has failed for the member's fast-fail
    /// time (2 s), so that a raid1 goes on degraded instead of waiting for TCP to give up
    /// on a node that vanished without closing its connections (default 3s). SPDK applies
    /// it to every NVMe controller of the node.
    #[serde(
        rename = "nvmeIo",
        default = "default_nvme_io_timeout",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub nvme_io: Duration,
    /// The same for the initiator's admin commands, keep-alives included; also how long
    /// SPDK's synchronous admin commands may hold the reactor (every volume of the node)
    /// after an I/O deadline passed (default 2s; SPDK's own is 30s).
    #[serde(
        rename = "nvmeAdmin",
        default = "default_nvme_admin_timeout",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub nvme_admin: Duration,
    /// The TCP connections of this node's NVMe-oF initiator: data unacknowledged this long
    /// closes the connection (`TCP_USER_TIMEOUT`, rounded up to a power of two
    /// milliseconds), and a reconnect that has not connected this long fails (default 2s).
    /// Without it a peer behind a cut link holds the controller's reset in a connect that
    /// the kernel retries for tens of seconds, and a raid1's writes wait with it.
    #[serde(
        rename = "nvmeTransport",
        default = "default_nvme_transport_timeout",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub nvme_transport: Duration,
}

/// Default of `timeouts.nvmeIo`.
pub const DEFAULT_NVME_IO_TIMEOUT: Duration = Duration::from_secs(3);
/// Default of `timeouts.nvmeAdmin`.
pub const DEFAULT_NVME_ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

fn default_nvme_io_timeout() -> Duration {
    DEFAULT_NVME_IO_TIMEOUT
}
fn default_nvme_admin_timeout() -> Duration {
    DEFAULT_NVME_ADMIN_TIMEOUT
}
/// Default of `timeouts.nvmeTransport`.
pub const DEFAULT_NVME_TRANSPORT_TIMEOUT: Duration = Duration::from_secs(2);
fn default_nvme_transport_timeout() -> Duration {
    DEFAULT_NVME_TRANSPORT_TIMEOUT
}

fn default_api_request_timeout() -> Duration {
    DEFAULT_API_REQUEST_TIMEOUT
}
fn default_spdk_request_timeout() -> Duration {
    DEFAULT_SPDK_REQUEST_TIMEOUT
}
fn default_command_timeout() -> Duration {
    DEFAULT_COMMAND_TIMEOUT
}

impl Default for TimeoutsConfig {
    fn default() -> Self {
        Self {
            api_request: DEFAULT_API_REQUEST_TIMEOUT,
            spdk_request: DEFAULT_SPDK_REQUEST_TIMEOUT,
            command: DEFAULT_COMMAND_TIMEOUT,
            nvme_io: DEFAULT_NVME_IO_TIMEOUT,
            nvme_admin: DEFAULT_NVME_ADMIN_TIMEOUT,
            nvme_transport: DEFAULT_NVME_TRANSPORT_TIMEOUT,
        }
    }
}

/// Default grace period before an orphan may be collected.
pub const DEFAULT_ORPHAN_GRACE: Duration = Duration::from_secs(3600);

/// `recovery`: engine objects (volumes, snapshots) that no AntstorVolume / AntstorSnapshot
/// owns are always reported; they are deleted only when `collectOrphans` is true and they
/// stayed orphaned for `orphanGracePeriod`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RecoveryConfig {
    /// Delete orphans after the grace period (default false: never delete data).
    #[serde(rename = "collectOrphans", default)]
    pub collect_orphans: bool,
    /// How long an object must stay orphaned before it is collected.
    #[serde(
        rename = "orphanGracePeriod",
        default = "default_orphan_grace",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub orphan_grace_period: Duration,
}

fn default_orphan_grace() -> Duration {
    DEFAULT_ORPHAN_GRACE
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        Self {
            collect_orphans: false,
            orphan_grace_period: DEFAULT_ORPHAN_GRACE,
        }
    }
}

/// Accepts an unsigned integer or a string, handing the string to `parse`.
struct IntOrText<F> {
    expecting: &'static str,
    from_int: fn(u64) -> Result<F, String>,
    from_text: fn(&str) -> Result<F, String>,
}

impl<F> de::Visitor<'_> for IntOrText<F> {
    type Value = F;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expecting)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<F, E> {
        (self.from_int)(v).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<F, E> {
        let v = u64::try_from(v).map_err(|_| E::custom(format!("{v} is negative")))?;
        (self.from_int)(v).map_err(E::custom)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<F, E> {
        (self.from_text)(v).map_err(E::custom)
    }
}

fn de_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_any(IntOrText {
        expecting: "a size in bytes or a quantity like \"10Gi\"",
        from_int: Ok,
        from_text: |s| size::parse_quantity_str(s).map_err(|e| e.to_string()),
    })
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_any(IntOrText {
        expecting: "a duration like \"20s\", \"1m\" or a number of seconds",
        from_int: |n| Ok(Duration::from_secs(n)),
        from_text: parse_duration,
    })
}

fn ser_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_duration(*d))
}

/// Parses `"20s"`, `"1m"`, `"1m30s"`, `"500ms"`, `"2h"`, `"40"` (seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let bad = || format!("{text:?} is not a duration like \"20s\", \"1m30s\" or \"500ms\"");
    if t.is_empty() {
        return Err(bad());
    }
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let part = match &rest[..unit_len] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(bad)?),
            "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(bad)?),
            _ => return Err(bad()),
        };
        total = total.checked_add(part).ok_or_else(bad)?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

/// `20s`, `1m30s`, `500ms`: the shortest form [`parse_duration`] reads back.
pub fn format_duration(d: Duration) -> String {
    if d.subsec_millis() != 0 || d.is_zero() {
        return format!("{}ms", d.as_millis());
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 {
        out.push_str(&format!("{s}s"));
    }
    out
}

fn parse_core_mask(mask: &str) -> Option<u128> {
    let hex = mask
        .strip_prefix("0x")
        .or_else(|| mask.strip_prefix("0X"))?;
    if hex.is_empty() {
        return None;
    }
    u128::from_str_radix(hex, 16).ok()
}

/// `DDDD:BB:DD.F` in hexadecimal.
fn is_pci_address(addr: &str) -> bool {
    let parts: Vec<&str> = addr.split([':', '.']).collect();
    let lens = [4usize, 2, 2, 1];
    parts.len() == 4
        && parts
            .iter()
            .zip(lens)
            .all(|(p, l)| p.len() == l && p.chars().all(|c| c.is_ascii_hexdigit()))
}

/// LVM's rule for VG names: `[A-Za-z0-9+_.-]`, not starting with `-`, not `.` or `..`.
fn is_lvm_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 127
        && !name.starts_with('-')
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+_.-".contains(c))
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

    /// Checks what the types cannot: required fields per mode, ranges, formats.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_storage()?;
        self.validate_spdk()?;
        let pr = self.nvmf.port_range;
        for (field, port) in [
            ("nvmf.portRange.start", pr.start),
            ("nvmf.portRange.end", pr.end),
        ] {
            if !(1..=65535).contains(&port) {
                return Err(invalid(field, port, "is outside 1..=65535"));
            }
        }
        if pr.start > pr.end {
            return Err(invalid(
                "nvmf.portRange",
                format!("{}-{}", pr.start, pr.end),
                "is empty: start must be <= end",
            ));
        }
        let groups = &self.nvmf.dhchap_dhgroups;
        if groups.is_empty() {
            return Err(invalid(
                "nvmf.dhchapDhgroups",
                "[]",
                format!("needs at least one of {}", DHCHAP_DHGROUPS.join(", ")),
            ));
        }
        for (i, g) in groups.iter().enumerate() {
            if !DHCHAP_DHGROUPS.contains(&g.as_str()) {
                return Err(invalid(
                    &format!("nvmf.dhchapDhgroups[{i}]"),
                    g,
                    format!("is not one of {}", DHCHAP_DHGROUPS.join(", ")),
                ));
            }
        }
        if let Some(dir) = &self.nvmf.export_record_dir
            && !dir.is_absolute()
        {
            return Err(invalid(
                "nvmf.exportRecordDir",
                dir.display(),
                "must be an absolute path",
            ));
        }
        let hb = self.heartbeat;
        if hb.interval.is_zero() {
            return Err(invalid("heartbeat.interval", "0s", "must be positive"));
        }
        if hb.duration <= hb.interval {
            return Err(invalid(
                "heartbeat.duration",
                format_duration(hb.duration),
                format!(
                    "must exceed heartbeat.interval ({})",
                    format_duration(hb.interval)
                ),
            ));
        }
        for (field, value) in [
            ("timeouts.apiRequest", self.timeouts.api_request),
            ("timeouts.spdkRequest", self.timeouts.spdk_request),
            ("timeouts.command", self.timeouts.command),
            ("timeouts.nvmeIo", self.timeouts.nvme_io),
            ("timeouts.nvmeAdmin", self.timeouts.nvme_admin),
            ("timeouts.nvmeTransport", self.timeouts.nvme_transport),
        ] {
            if value.is_zero() {
                return Err(invalid(field, "0s", "must be positive"));
            }
        }
        let t = self.timeouts.nvme_transport;
        if t < Duration::from_millis(2) || t > Duration::from_millis(1 << 31) {
            return Err(invalid(
                "timeouts.nvmeTransport",
                format_duration(t),
                "must be from 2ms to 2^31 ms (SPDK's TCP acknowledgement timeout is 2^n ms)",
            ));
        }
        let keys = &self.node_info_keys;
        for (field, value) in [
            ("nodeInfoKeys.ipLabelKey", &keys.ip_label_key),
            ("nodeInfoKeys.hostnameLabelKey", &keys.hostname_label_key),
            ("nodeInfoKeys.rackLabelKey", &keys.rack_label_key),
            ("nodeInfoKeys.roomLabelKey", &keys.room_label_key),
        ] {
            if value.trim().is_empty() {
                return Err(missing(field, "(a Node label key)"));
            }
        }
        Ok(())
    }

    fn validate_storage(&self) -> Result<(), ConfigError> {
        let st = &self.storage;
        let name = &st.pooling.name;
        if name.trim().is_empty() {
            return Err(missing(
                "storage.pooling.name",
                "(VG, lvstore or pool name)",
            ));
        }
        match st.pooling.mode {
            PoolingMode::KernelLvm => {
                if !is_lvm_name(name) {
                    return Err(invalid(
                        "storage.pooling.name",
                        format!("{name:?}"),
                        "is not a valid VG name (letters, digits, +_.-, not starting with -)",
                    ));
                }
                for (i, pv) in st.pvs.iter().enumerate() {
                    if pv.device_path.is_empty() && pv.file_path.is_empty() {
                        return Err(missing(
                            &format!("storage.pvs[{i}].filePath"),
                            "when devicePath is empty",
                        ));
                    }
                    if !pv.file_path.is_empty() && pv.size == 0 {
                        return Err(missing(
                            &format!("storage.pvs[{i}].size"),
                            "(bytes, > 0) when filePath is set",
                        ));
                    }
                }
            }
            PoolingMode::SpdkLvStore => {
                let Some(bdev) = &st.bdev else {
                    return Err(missing("storage.bdev", "in SpdkLVStore mode"));
                };
                if bdev.name.trim().is_empty() {
                    return Err(missing("storage.bdev.name", "in SpdkLVStore mode"));
                }
                match bdev.kind {
                    BdevType::Aio if bdev.file_path.is_empty() => {
                        return Err(missing("storage.bdev.filePath", "for type \"aioBdev\""));
                    }
                    BdevType::Mem if bdev.size == 0 || bdev.size % 512 != 0 => {
                        return Err(invalid(
                            "storage.bdev.size",
                            bdev.size,
                            "must be a positive multiple of 512 for type \"memBdev\"",
                        ));
                    }
                    _ => {}
                }
            }
            PoolingMode::File => {
                let Some(file) = &st.file else {
                    return Err(missing("storage.file.path", "in File mode"));
                };
                if !file.path.is_absolute() {
                    return Err(invalid(
                        "storage.file.path",
                        file.path.display(),
                        "must be an absolute directory path",
                    ));
                }
            }
        }
        Ok(())
    }

    fn validate_spdk(&self) -> Result<(), ConfigError> {
        let sp = &self.spdk;
        match parse_core_mask(&sp.core_mask) {
            Some(0) => return Err(invalid("spdk.coreMask", &sp.core_mask, "selects no core")),
            Some(_) => {}
            None => {
                return Err(invalid(
                    "spdk.coreMask",
                    format!("{:?}", sp.core_mask),
                    "is not a hexadecimal mask like \"0x1\"",
                ));
            }
        }
        if let Some(mib) = sp.mem_size_mib
            && mib < MIN_MEM_MIB
        {
            return Err(invalid(
                "spdk.memSizeMiB",
                mib,
                format!("is below the minimum of {MIN_MEM_MIB}"),
            ));
        }
        if !(-20..=19).contains(&sp.reactor_nice) {
            return Err(invalid(
                "spdk.reactorNice",
                sp.reactor_nice,
                "must be between -20 and 19",
            ));
        }
        if sp.max_subsystems < 2 {
            return Err(invalid(
                "spdk.maxSubsystems",
                sp.max_subsystems,
                "must be at least 2 (the discovery subsystem takes one)",
            ));
        }
        if let Some(dir) = &sp.huge_dir {
            if sp.no_huge {
                return Err(invalid(
                    "spdk.hugeDir",
                    dir.display(),
                    "is a hugetlbfs mount, which noHuge: true does not use",
                ));
            }
            if !dir.is_absolute() {
                return Err(invalid(
                    "spdk.hugeDir",
                    dir.display(),
                    "must be an absolute path",
                ));
            }
        }
        if let Some(sock) = &sp.rpc_socket
            && !sock.is_absolute()
        {
            return Err(invalid(
                "spdk.rpcSocket",
                sock.display(),
                "must be an absolute path",
            ));
        }
        for (i, addr) in sp.nvme_pci_addresses.iter().enumerate() {
            if !is_pci_address(addr) {
                return Err(invalid(
                    &format!("spdk.nvmePciAddresses[{i}]"),
                    format!("{addr:?}"),
                    "is not a PCI address like \"0000:00:04.0\"",
                ));
            }
        }
        if self
            .storage
            .bdev
            .as_ref()
            .is_some_and(|b| b.kind == BdevType::Raid)
            && sp.nvme_pci_addresses.is_empty()
        {
            return Err(invalid(
                "spdk.nvmePciAddresses",
                "[]",
                "must list the NVMe devices of a raidBdev pool",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn durations_round_trip() {
        for (text, secs_ms) in [
            ("20s", 20_000),
            ("1m", 60_000),
            ("1m30s", 90_000),
            ("500ms", 500),
            ("2h", 7_200_000),
            ("40", 40_000),
        ] {
            let d = parse_duration(text).unwrap();
            assert_eq!(d.as_millis(), secs_ms, "{text}");
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
        for bad in ["", "s", "10x", "1.5s", "-1s", "m10"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn pci_and_mask_formats() {
        assert!(is_pci_address("0000:00:04.0"));
        assert!(is_pci_address("0000:af:00.1"));
        assert!(!is_pci_address("00:04.0"));
        assert!(!is_pci_address("0000:00:04"));
        assert_eq!(parse_core_mask("0x3"), Some(3));
        assert_eq!(parse_core_mask("3"), None);
        assert_eq!(parse_core_mask("0x"), None);
    }

    #[test]
    fn lvm_names() {
        assert!(is_lvm_name("test-vg"));
        assert!(!is_lvm_name("-vg"));
        assert!(!is_lvm_name("a b"));
        assert!(!is_lvm_name(".."));
    }
}
