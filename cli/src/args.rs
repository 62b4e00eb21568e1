//! Command-line arguments of `kubectl-liteio`.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use liteio_api::keys;

/// Inspect LiteIO storage pools, volumes, snapshots and migrations, lock pools out of
/// scheduling and migrate volumes.
#[derive(Parser, Debug, Clone)]
#[command(name = "kubectl-liteio", version, bin_name = "kubectl liteio")]
pub struct Cli {
    /// Kubeconfig file; default: $KUBECONFIG, ~/.kube/config, then the in-cluster config.
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of LiteIO's objects and heartbeat Leases.
    #[arg(short = 'n', long, global = true, default_value = keys::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// How results are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns (lists) or indented fields (describe).
    Table,
    /// Pretty-printed JSON.
    Json,
    /// YAML.
    Yaml,
}

/// The sub-commands.
#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// List storage pools: engine, capacity, volumes, state and heartbeat age.
    #[command(visible_alias = "pool")]
    Pools,
    /// List volumes: size, pool, consuming host, state and NVMe/TCP export.
    #[command(visible_aliases = ["volume", "vol"])]
    Volumes,
    /// List snapshots.
    #[command(visible_aliases = ["snapshot", "snap"])]
    Snapshots,
    /// List volume migrations: volume, source and destination node, phase, status, copy
    /// progress and rate.
    #[command(visible_aliases = ["migration", "mig"])]
    Migrations,
    /// Move a volume's data to another node while its consumer keeps using it (a
    /// VolumeMigration). A second call for a volume that is being migrated reports that
    /// migration instead of starting another.
    Migrate {
        /// Volume name (the AntstorVolume name).
        volume: String,
        /// Destination node; default: the scheduler picks one other than the volume's.
        #[arg(long)]
        to: Option<String>,
    },
    /// Everything about one volume or pool.
    Describe {
        /// The object.
        #[command(subcommand)]
        target: DescribeTarget,
    },
    /// Take a pool out of scheduling (label `obnvmf/pool-scheduling-status=locked`).
    Lock {
        /// The pool.
        #[command(subcommand)]
        target: PoolTarget,
    },
    /// Return a locked pool to scheduling.
    Unlock {
        /// The pool.
        #[command(subcommand)]
        target: PoolTarget,
    },
    /// Show a volume's QoS limits, or change them with any of the flags (the others keep
    /// their value; 0 lifts a limit). The disk-agent applies them to the volume's live
    /// SPDK export without a reconnect and records what holds in the annotation
    /// liteio.io/qos-in-force. Only volumes on an SPDK lvstore take limits. A PVC's
    /// VolumeAttributesClass (deploy/qos/) sets the same limits through Kubernetes; the
    /// next class change overrides what this command set.
    Qos {
        /// Volume name (the AntstorVolume / PV name).
        volume: String,
        /// Read and write I/O per second together (a multiple of 1000).
        #[arg(long)]
        iops: Option<u64>,
        /// Read and write MiB per second together.
        #[arg(long)]
        mbps: Option<u64>,
        /// Read MiB per second.
        #[arg(long = "read-mbps")]
        read_mbps: Option<u64>,
        /// Write MiB per second.
        #[arg(long = "write-mbps")]
        write_mbps: Option<u64>,
    },
    /// Replace the DH-HMAC-CHAP keys of a volume, or of every volume a node stores or
    /// consumes. The new keys go into the volume's Secret (liteio-auth-<pv name>) and the
    /// disk-agent applies them to the live export: connected hosts stay connected, and any
    /// new connection needs the new keys. The agent acknowledges with the volume's
    /// annotation obnvmf/keys-applied-at (the rotation's time). A kernel host gets them at kubelet's next
    /// republish of the volume (about a minute; the CSI node hands them to the live
    /// controller); a reconnect before that is refused. A TLS PSK is kept (SPDK cannot
    /// change it live).
    #[command(name = "rotate-keys")]
    RotateKeys {
        /// Volume name (the AntstorVolume / PV name).
        #[arg(required_unless_present = "node", conflicts_with = "node")]
        volume: Option<String>,
        /// Every volume stored on or consumed by this node (for a node that was lost or
        /// broken into: it knew those keys).
        #[arg(long)]
        node: Option<String>,
    },
    /// A live view of the busiest volumes (IOPS, reads and writes per second, MiB/s, mean
    /// latency) and of the pools (capacity, free space, I/O), read from the disk-agents'
    /// /metrics and refreshed every --interval seconds until q or Ctrl-C. The agents are
    /// found at every StoragePool's node address (spec.nodeInfo.ip) and --metrics-port,
    /// unless --metrics-url names them. Volumes are sorted by IOPS, the busiest first.
    Top {
        /// Seconds between two refreshes; rates are over this interval.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=3600))]
        interval: u64,
        /// Print one frame (two scrapes --interval apart) and exit; with -o json or yaml,
        /// the frame's rows with raw numbers.
        #[arg(long)]
        once: bool,
        /// An agent's metrics URL (http://10.0.0.5:9810/metrics); repeat it for several
        /// agents. Without it, every StoragePool's agent is scraped.
        #[arg(long = "metrics-url", value_name = "URL")]
        metrics_urls: Vec<String>,
        /// Port of the agents' metrics (their config's metrics.listenAddress).
        #[arg(long, default_value_t = AGENT_METRICS_PORT)]
        metrics_port: u16,
        /// Volumes shown, the busiest first.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
}

/// Default `--metrics-port`: the disk-agent's metrics port in deploy/ (`metrics.listenAddress`).
pub const AGENT_METRICS_PORT: u16 = 9810;

/// Object of `describe`.
#[derive(Subcommand, Debug, Clone)]
pub enum DescribeTarget {
    /// An AntstorVolume.
    #[command(visible_alias = "vol")]
    Volume {
        /// Volume name (the PV name).
        name: String,
    },
    /// A StoragePool.
    Pool {
        /// Pool name (the node name).
        name: String,
    },
}

/// Object of `lock` / `unlock`.
#[derive(Subcommand, Debug, Clone)]
pub enum PoolTarget {
    /// A StoragePool.
    Pool {
        /// Pool name (the node name).
        name: String,
    },
}
