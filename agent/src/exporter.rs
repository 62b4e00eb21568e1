//! NVMe-oF export of volumes: the seam where the embedded SPDK target plugs in.
//!
//! The volume sync calls an [`Exporter`] where LiteIO created its "open access": for every
//! SPDK lvol volume, and for LVM / file volumes whose consumer runs on another node
//! (`spec.hostNode.id != spec.targetNodeId`). The exporter returns the
//! [`SpdkTarget`](liteio_api::SpdkTarget) recorded in `spec.spdkTarget`; the sync adds the
//! `antstor.alipay.com/spdk-tgt` finalizer only after that succeeded.
//!
//! Contract for implementations:
//! - [`Exporter::ensure_export`] is idempotent and level-triggered: it creates the subsystem,
//!   namespace and listener when missing and sets the allowed hosts to exactly
//!   `allowed_hosts` (hosts are added and removed live). It is called on every reconcile of an
//!   exported volume, so after a restart of the agent (and of the embedded target) every ready
//!   volume gets its export back. A `preset` target (migration, earlier run) keeps its NQN,
//!   namespace UUID and port when possible.
//! - [`Exporter::remove_export`] is idempotent: nothing exported is success.
//! - [`Exporter::resize_export`] makes the export see a grown volume (aio rescan).
//! - Nothing here may block a tokio worker: SPDK calls go through the reactor bridge.
//!
//! [`NoExporter`] is the implementation when the agent has no NVMe-oF target (built without
//! the `spdk` feature): every export request fails with [`ExportError::Unavailable`], so a
//! remote volume stays `creating` with a message instead of being reported ready.
//!
//! Multi-disk volumes of engine SpdkLVStore are assembled here too
//! ([`Exporter::ensure_assembly`], [`Exporter::remove_assembly`]): the members attached with
//! the target's NVMe/TCP initiator (remote) or opened directly (local), a raid bdev over
//! them, one subsystem for it. An exporter without SPDK refuses
//! ([`ExportError::Unsupported`]) and [`Exporter::assembles`] says so beforehand.

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use liteio_api::replica::ReplicaStatus;
use liteio_api::{SpdkLvol, SpdkTarget};

/// A boxed future of an exporter call.
pub type ExportFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ExportError>> + Send + 'a>>;

/// What to export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportRequest {
    /// AntstorVolume name.
    pub volume: String,
    /// Volume UUID (`spec.uuid`): subsystem NQN, serial and namespace UUID derive from it
    /// (see `liteio_api::naming`).
    pub uuid: String,
    /// Local block device or file of an LVM / file volume (exported through an aio bdev).
    pub device: Option<PathBuf>,
    /// The lvol of an SPDK volume (exported directly).
    pub lvol: Option<SpdkLvol>,
    /// Current size in bytes.
    pub size_bytes: u64,
    /// Host NQNs allowed to connect: exactly these, nobody else.
    pub allowed_hosts: Vec<String>,
    /// Hosts of `allowed_hosts` admitted by their NQN alone, without DH-HMAC-CHAP keys: the
    /// volume's `spec.hostAuth` allows it for them (see `liteio_api::host_auth`). Every other
    /// host authenticates with `keys`.
    pub keyless_hosts: Vec<String>,
    /// The target recorded on the volume by an earlier export, if any.
    pub preset: Option<SpdkTarget>,
    /// The keys the allowed hosts authenticate with (DH-HMAC-CHAP, bidirectional; TLS when
    /// they include a PSK); `None` when [`Exporter::authenticates`] is false.
    pub keys: Option<liteio_api::auth::VolumeKeys>,
    /// The ANA state hosts see on the export's listener: `Optimized` for every volume,
    /// except during a hot migration (the destination until the switch-over, the source
    /// after it). A new export starts in it; an existing one is only ever promoted to
    /// `Optimized` here (the destination's switch-over). Demoting a live export is
    /// [`Migrator::set_path_state`]'s job alone: it must come after the destination's
    /// promotion has reached the hosts, or they find no usable path and SPDK's initiator
    /// waits a whole second before it looks again.
    pub path_state: PathState,
    /// The volume's QoS limits (`spec.qos`; unlimited when absent), enforced on the
    /// exported bdev and changed live on a live export.
    pub qos: liteio_api::qos::VolumeQos,
    /// A member of a multi-disk volume (label `obnvmf/vol-group-name`), exported to the node
    /// that assembles it: a new export's namespace takes the lvol's own UUID rather than the
    /// volume's. A replicated volume's raid superblock names each replica by the UUID of the
    /// bdev it was opened as; with this, the lvol opened directly on its own node and its
    /// namespace attached on another have the same one, so the raid can be assembled from
    /// the superblocks on any replica's node.
    pub group_member: bool,
}

/// The ANA state of an export's listener, as hosts with NVMe multipath see it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PathState {
    /// Hosts send I/O here.
    #[default]
    Optimized,
    /// No I/O: hosts use another path of the same subsystem.
    Inaccessible,
}

impl PathState {
    /// The name used in annotations (`optimized`, `inaccessible`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Optimized => "optimized",
            Self::Inaccessible => liteio_api::keys::ANA_INACCESSIBLE,
        }
    }

    /// Parses [`PathState::as_str`]'s names.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "optimized" => Some(Self::Optimized),
            liteio_api::keys::ANA_INACCESSIBLE => Some(Self::Inaccessible),
            _ => None,
        }
    }
}

/// How the members of an assembly are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AssemblyLevel {
    /// One after another (LiteIO's `linear`): a concat raid bdev.
    Concat,
    /// Striped (`raid0`).
    Raid0,
    /// Every member a whole copy (`raid1`: a replicated volume): a raid1 bdev with an on-disk
    /// superblock, which serves while one member is whole, and rebuilds a member added to it.
    Mirror,
}

impl AssemblyLevel {
    /// The name used in messages (`concat`, `raid0`, `raid1`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Concat => "concat",
            Self::Raid0 => "raid0",
            Self::Mirror => "raid1",
        }
    }
}

/// Where the target finds one member of an assembly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberSource {
    /// A volume of this node's lvstore, opened directly (not exported: see
    /// `sync::volume::assembled_locally`).
    Local {
        /// Its lvol.
        lvol: SpdkLvol,
    },
    /// A volume of another node, attached over NVMe/TCP as this node's host NQN with the
    /// assembly's keys.
    Remote {
        /// Its export (`spec.spdkTarget`).
        target: SpdkTarget,
    },
    /// A replica the assembling node cannot reach now (its node is down, it is not exported
    /// to this node, …): a mirror serves without it. Refused for other levels.
    Absent {
        /// Why (reported in the replica's status).
        reason: String,
    },
}

/// One member of an assembly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AssemblyMember {
    /// AntstorVolume name (for messages).
    pub volume: String,
    /// Its node.
    pub node: String,
    /// Where it is.
    pub source: MemberSource,
}

/// What to assemble: a multi-disk volume of engine SpdkLVStore on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AssemblyRequest {
    /// AntstorDataControl name: the raid bdev's name (`naming::assembly_bdev`) and the
    /// prefix of its initiator controllers (`naming::assembly_controller`).
    pub name: String,
    /// Its `spec.uuid` (`dc-<uuid>`): subsystem NQN, serial, key names; the namespace UUID
    /// is the uuid without `dc-`.
    pub uuid: String,
    /// How the members are combined.
    pub level: AssemblyLevel,
    /// Strip size in KiB (concat: each member is rounded down to whole strips).
    pub strip_kb: u32,
    /// The members in the raid's order (the groups' `spec.volumes`, in order). One member
    /// is exported as it is, without a raid.
    pub members: Vec<AssemblyMember>,
    /// The assembled device must hold at least this many bytes (`spec.totalSize`).
    pub size_bytes: u64,
    /// This node's host NQN: the remote members' exports admit it.
    pub hostnqn: String,
    /// Host NQNs allowed to connect to the assembled export: exactly these.
    pub allowed_hosts: Vec<String>,
    /// The PV's keys (`None` when [`Exporter::authenticates`] is false): the remote members
    /// and the assembled export use the same ones.
    pub keys: Option<liteio_api::auth::VolumeKeys>,
    /// The target recorded on the data control (`status.spdkTarget`) by an earlier
    /// assembly: kept (NQN, serial, namespace UUID, port when free).
    pub preset: Option<SpdkTarget>,
    /// Mirror only: the volume was never assembled (no data yet), so the raid is made over
    /// every member, which must all be present. Otherwise a missing raid is assembled again
    /// from its members' superblocks (degraded if need be), never made anew over them: a
    /// replica that missed writes is rebuilt, never read as current.
    pub new_mirror: bool,
}

/// What to tear down: the assembly of a data control.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnassembleRequest {
    /// AntstorDataControl name.
    pub name: String,
    /// Its `spec.uuid`.
    pub uuid: String,
    /// The target recorded on it, if any.
    pub target: Option<SpdkTarget>,
    /// How many members it has (their controllers are detached by index, besides those
    /// found by name).
    pub members: usize,
}

/// What to stop exporting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnexportRequest {
    /// AntstorVolume name.
    pub volume: String,
    /// Volume UUID.
    pub uuid: String,
    /// The target recorded on the volume, if any.
    pub target: Option<SpdkTarget>,
}

/// Health of the NVMe-oF target, for the pool's `Spdk` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExporterHealth {
    /// This agent has no target.
    Absent,
    /// The target answers; `version` goes into the `obnvmf/tgt-version` annotation.
    Ok {
        /// Target version (`v23.09`).
        version: String,
    },
    /// The target does not answer.
    Error {
        /// Why.
        message: String,
    },
}

/// Why an export operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// No NVMe-oF target in this agent.
    #[error(
        "volume {volume} needs an NVMe-oF export, and this agent has no target (built without the spdk feature)"
    )]
    Unavailable {
        /// Volume name.
        volume: String,
    },
    /// The request cannot be served (no device and no lvol, …).
    #[error("{0}")]
    InvalidRequest(String),
    /// This target cannot do it at all (no SPDK, SPDK without its NVMe/TCP initiator): only
    /// a change of the object or of the node's configuration helps.
    #[error("{0}")]
    Unsupported(String),
    /// The target failed.
    #[error("NVMe-oF target: {message}")]
    Target {
        /// What failed, with the fields.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

/// Exports volumes over NVMe-oF. See the module documentation for the contract.
pub trait Exporter: Send + Sync + fmt::Debug {
    /// Health and version of the target.
    fn health(&self) -> ExportFuture<'_, ExporterHealth>;

    /// Creates or re-asserts the export of a volume; returns the target to record.
    fn ensure_export<'a>(&'a self, req: &'a ExportRequest) -> ExportFuture<'a, SpdkTarget>;

    /// Whether exports need authentication keys ([`ExportRequest::keys`]): the sync then
    /// reads or creates the volume's Secret before exporting.
    fn authenticates(&self) -> bool {
        false
    }

    /// Removes the export of a volume; missing is success.
    fn remove_export<'a>(&'a self, req: &'a UnexportRequest) -> ExportFuture<'a, ()>;

    /// The port of the export's migration pipe listener when `want` (a second listener of
    /// the same subsystem, always ANA optimized, through which the source node's agent
    /// writes the copy while hosts see the destination inaccessible), created when missing;
    /// removed when not `want` (`None`). The export must exist.
    fn ensure_pipe<'a>(
        &'a self,
        req: &'a ExportRequest,
        want: bool,
    ) -> ExportFuture<'a, Option<u16>> {
        Box::pin(async move {
            if want {
                Err(ExportError::Unavailable {
                    volume: req.volume.clone(),
                })
            } else {
                Ok(None)
            }
        })
    }

    /// The hot-migration operations of this target (`None`: it cannot be a migration's
    /// source).
    fn migrator(&self) -> Option<&dyn Migrator> {
        None
    }

    /// Whether exports enforce the volume's QoS limits ([`ExportRequest::qos`]).
    fn enforces_qos(&self) -> bool {
        false
    }

    /// Whether the export recorded as `target` exists and listens (after a restart: served
    /// again). A target without an NVMe-oF target answers `true`: it has nothing to restore.
    fn is_listening<'a>(&'a self, target: &'a SpdkTarget) -> ExportFuture<'a, bool> {
        let _ = target;
        Box::pin(async { Ok(true) })
    }

    /// Tells the export that the volume grew to `req.size_bytes`. No export (a restarted
    /// target) is success: the next `ensure_export` exports the grown volume.
    fn resize_export<'a>(&'a self, req: &'a ExportRequest) -> ExportFuture<'a, ()> {
        let _ = req;
        Box::pin(async { Ok(()) })
    }

    /// Whether this target assembles multi-disk volumes of engine SpdkLVStore
    /// ([`Exporter::ensure_assembly`]).
    fn assembles(&self) -> bool {
        false
    }

    /// Whether this target serves subsystem `nqn` to a host (from its own record, without a
    /// request to the target): an assembly made here and not removed since. The default
    /// serves nothing.
    fn serves(&self, nqn: &str) -> bool {
        let _ = nqn;
        false
    }

    /// The assemblies this target made and has not removed since, from its own record. The
    /// default has none.
    fn assemblies(&self) -> Vec<ServedAssembly> {
        Vec::new()
    }

    /// Holds the I/O of an assembly's export in the target (nothing is acknowledged, nothing
    /// fails) until [`Exporter::unfence_assembly`]: the self-fence of a node whose Lease is
    /// stale. The default has nothing to hold.
    fn fence_assembly<'a>(&'a self, uuid: &'a str) -> ExportFuture<'a, ()> {
        let _ = uuid;
        Box::pin(async { Ok(()) })
    }

    /// Releases [`Exporter::fence_assembly`]; an assembly that is gone is success.
    fn unfence_assembly<'a>(&'a self, uuid: &'a str) -> ExportFuture<'a, ()> {
        let _ = uuid;
        Box::pin(async { Ok(()) })
    }

    /// Creates or re-asserts the assembly of a multi-disk volume and its export; returns the
    /// target to record (`status.spdkTarget`). Idempotent and level-triggered like
    /// [`Exporter::ensure_export`]: what exists is checked and kept, what is missing is made
    /// (after an agent restart, everything), the allowed hosts are set to exactly
    /// `allowed_hosts`. A failed call removes what it made itself, so a failed first
    /// assembly leaves no raid bdev, initiator controller or subsystem behind (a working
    /// assembly that fails a re-assertion keeps serving). The default refuses: only an
    /// SPDK target assembles.
    fn ensure_assembly<'a>(&'a self, req: &'a AssemblyRequest) -> ExportFuture<'a, SpdkTarget> {
        Box::pin(async move { Err(no_assembly(&req.name)) })
    }

    /// The state of each replica of a mirror assembly (`req.level` Mirror), in member order:
    /// online, rebuilding (with progress), failed or missing. Empty for other levels and
    /// for a target that does not assemble.
    fn replicas<'a>(&'a self, req: &'a AssemblyRequest) -> ExportFuture<'a, Vec<ReplicaStatus>> {
        let _ = req;
        Box::pin(async move { Ok(Vec::new()) })
    }

    /// Tears an assembly down: the subsystem, then the raid bdev, then the initiator
    /// controllers of its remote members, then its keys. Idempotent: nothing left is
    /// success. The default has nothing to remove (a target without SPDK never assembled).
    fn remove_assembly<'a>(&'a self, req: &'a UnassembleRequest) -> ExportFuture<'a, ()> {
        let _ = req;
        Box::pin(async { Ok(()) })
    }
}

/// An assembly a target serves ([`Exporter::assemblies`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedAssembly {
    /// Its name (the data control's).
    pub name: String,
    /// The data control's UUID.
    pub uuid: String,
    /// A replicated volume's mirror.
    pub mirror: bool,
}

/// Why a target without SPDK cannot assemble multi-disk volume `name`.
pub fn no_assembly(name: &str) -> ExportError {
    ExportError::Unsupported(format!(
        "multi-disk volume {name} (engine SpdkLVStore) is assembled in SPDK, and this agent's target has no SPDK (an agent built without the spdk feature, or another pool engine): it cannot assemble it"
    ))
}

/// The exporter of an agent without an NVMe-oF target.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoExporter;

impl Exporter for NoExporter {
    fn health(&self) -> ExportFuture<'_, ExporterHealth> {
        Box::pin(async { Ok(ExporterHealth::Absent) })
    }

    fn ensure_export<'a>(&'a self, req: &'a ExportRequest) -> ExportFuture<'a, SpdkTarget> {
        Box::pin(async move {
            Err(ExportError::Unavailable {
                volume: req.volume.clone(),
            })
        })
    }

    fn remove_export<'a>(&'a self, _req: &'a UnexportRequest) -> ExportFuture<'a, ()> {
        // An embedded target's exports die with the process: nothing can be left.
        Box::pin(async { Ok(()) })
    }
}

/// The destination as the source node's agent connects to it (the migration pipe).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipeRequest {
    /// NVMe controller name on this node (its namespace bdev is `<name>n1`).
    pub controller: String,
    /// Destination address.
    pub address: String,
    /// The destination's pipe listener port.
    pub port: u16,
    /// Subsystem NQN (the volume's, same on both ends).
    pub subnqn: String,
    /// This node's host NQN.
    pub hostnqn: String,
    /// Volume UUID: the keys the source's export loaded for it authenticate the pipe too
    /// (both ends use the volume's one Secret).
    pub uuid: String,
    /// Connect over TLS (the volume's PSK).
    pub tls: bool,
}

/// Where a copy to the destination stands (the gate's counters).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopyStatus {
    /// `Idle`, `Starting`, `Copying`, `InStep`, `Stopping`, `Cancelled`, `Failed`, `Finished`.
    pub state: CopyPhase,
    /// Negative errno of a failure, 0 otherwise.
    pub status: i32,
    /// Size of the volume when the pass started.
    pub size_bytes: u64,
    /// Bytes the pass has looked at (holes of a thin volume are skipped).
    pub scanned_bytes: u64,
    /// Bytes the pass copied.
    pub copied_bytes: u64,
    /// Writes mirrored to the destination.
    pub mirrored_writes: u64,
    /// Mirrored writes that failed.
    pub mirror_errors: u64,
    /// Time of the pass.
    pub elapsed: std::time::Duration,
}

/// The state of a copy (see [`CopyStatus`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CopyPhase {
    /// No copy on this gate (none yet, or the agent restarted).
    #[default]
    Idle,
    /// Being attached.
    Starting,
    /// The pass runs; writes are mirrored.
    Copying,
    /// The destination equals the source and writes are mirrored.
    InStep,
    /// Being cancelled.
    Stopping,
    /// Cancelled.
    Cancelled,
    /// Failed; the mirror is detached.
    Failed,
    /// Was in step; the mirror was detached after the switch-over.
    Finished,
}

impl CopyPhase {
    /// The name reported in `jobProgress.status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "Idle",
            Self::Starting => "Starting",
            Self::Copying => "Copying",
            Self::InStep => "InStep",
            Self::Stopping => "Stopping",
            Self::Cancelled => "Cancelled",
            Self::Failed => "Failed",
            Self::Finished => "Finished",
        }
    }
}

/// The source node's part of a hot migration: the pipe, the copy and the switch-over calls
/// on the local target. Every call is idempotent.
pub trait Migrator: Send + Sync + fmt::Debug {
    /// Connect to the destination (missing: attach); returns the bdev to copy to.
    fn connect_pipe<'a>(&'a self, req: &'a PipeRequest) -> ExportFuture<'a, String>;

    /// Drop the connection to the destination; none is success.
    fn disconnect_pipe<'a>(&'a self, controller: &'a str) -> ExportFuture<'a, ()>;

    /// Start copying the volume's lvol `lvol` (its bdev name) to `mirror`, mirroring writes;
    /// a copy already running or in step is left alone. Returns the status after the start.
    fn start_copy<'a>(&'a self, lvol: &'a str, mirror: &'a str) -> ExportFuture<'a, CopyStatus>;

    /// Where the copy of the volume's lvol stands.
    fn copy_status<'a>(&'a self, lvol: &'a str) -> ExportFuture<'a, CopyStatus>;

    /// Stop the copy and mirroring (cancel, or after a failure); none is success.
    fn cancel_copy<'a>(&'a self, lvol: &'a str) -> ExportFuture<'a, ()>;

    /// Detach a mirror that is in step, after the switch-over; none is success.
    fn finish_copy<'a>(&'a self, lvol: &'a str) -> ExportFuture<'a, ()>;

    /// Hold the export's I/O in the target (switch-over step 1).
    fn fence<'a>(&'a self, nqn: &'a str) -> ExportFuture<'a, ()>;

    /// Release a fence without changing ANA states.
    fn unfence<'a>(&'a self, nqn: &'a str) -> ExportFuture<'a, ()>;

    /// Set the ANA state of the export's listener `address:port` (ends a fence).
    fn set_path_state<'a>(
        &'a self,
        nqn: &'a str,
        address: &'a str,
        port: u16,
        state: PathState,
    ) -> ExportFuture<'a, ()>;
}
