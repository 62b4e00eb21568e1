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

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

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
    /// The target recorded on the volume by an earlier export, if any.
    pub preset: Option<SpdkTarget>,
    /// The keys the allowed hosts authenticate with (DH-HMAC-CHAP, bidirectional; TLS when
    /// they include a PSK); `None` when [`Exporter::authenticates`] is false.
    pub keys: Option<liteio_api::auth::VolumeKeys>,
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

    /// Tells the export that the volume grew to `req.size_bytes`. No export (a restarted
    /// target) is success: the next `ensure_export` exports the grown volume.
    fn resize_export<'a>(&'a self, req: &'a ExportRequest) -> ExportFuture<'a, ()> {
        let _ = req;
        Box::pin(async { Ok(()) })
    }
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
