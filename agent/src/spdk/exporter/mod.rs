//! The NVMe-oF exporter of the embedded SPDK target: one subsystem per volume with LiteIO's
//! NQN and serial scheme, a listener on the node address with a port from a configured range,
//! and an explicit host allow-list. SPDK volumes are exported through their gate (a
//! pass-through bdev over the lvol, `<lvol bdev>-gate`, where hot migration mirrors and
//! copies; see `liteio_spdk::gate`); LVM and file volumes through an aio bdev named after the
//! volume's serial number.
//!
//! It also assembles multi-disk volumes of engine SpdkLVStore: the remote members attached
//! with SPDK's NVMe/TCP initiator (controllers `<data control>_m<i>`, reconnecting for
//! [`MEMBER_RECONNECT`] when a member's target goes away), the local members' lvols opened
//! directly, a concat or raid0 bdev named after the data control over them, and one
//! subsystem for it, built like a volume's export.
//!
//! Where each part is: this file holds the exporter (its state, how it is made, the helpers
//! its parts share) and its [`Exporter`] implementation, which hands the larger calls on;
//! `subsystem.rs` serves one subsystem (ports, transport, keys) and a volume's export,
//! removal and resize; `assembly.rs` the multi-disk volumes; `migration.rs` the pipe, the
//! copy and the fence of a hot migration ([`Migrator`]).

mod assembly;
mod migration;
mod subsystem;

use std::sync::Mutex;

use liteio_api::replica::ReplicaStatus;
use liteio_api::{SpdkTarget, naming};

use super::Spdk;
use super::error::SpdkError;
use super::initiator;
use super::nvmf::{self, AnaState, TcpTransportOptions};
use super::ports::PortMap;
use crate::exporter::{
    AssemblyLevel, AssemblyRequest, ExportError, ExportFuture, ExportRequest, Exporter,
    ExporterHealth, Migrator, PathState, UnassembleRequest, UnexportRequest,
};

/// Exports volumes through the embedded SPDK NVMe-oF/TCP target.
#[derive(Debug)]
pub struct SpdkExporter {
    address: String,
    transport: TcpTransportOptions,
    /// The TCP transport was added to the target (once, before the first listener; retried
    /// by the next export when adding it failed).
    transport_added: tokio::sync::OnceCell<()>,
    /// Who owns each port of the range: the host listener's port of each subsystem this
    /// exporter created (SPDK runs in this process: every subsystem there was made here),
    /// the pipe listener's of a migration destination (nothing in SPDK tells the two apart),
    /// and the ports being given to subsystems still in the making. Never held across an
    /// `.await`: choosing, committing and freeing a port are O(1) and wait on nothing.
    ports: Mutex<PortMap>,
    /// The subsystem NQN each assembly member controller was attached to by this exporter
    /// (a replica replaced in its slot has another; after a restart the path's address
    /// tells).
    member_nqns: Mutex<std::collections::HashMap<String, String>>,
    /// The assemblies made here and not removed since: name → (data-control UUID, mirror).
    assemblies: Mutex<std::collections::BTreeMap<String, (String, bool)>>,
    /// Hosts must authenticate (DH-HMAC-CHAP with the request's keys).
    auth: bool,
    /// SPDK runs in interrupt mode, where its NVMe/TCP initiator (the migration pipe)
    /// cannot run.
    interrupt_mode: bool,
}

/// How the initiator of an assembly rides out a member's target going away (its agent
/// restarting: the export comes back with the same NQN and port within seconds): it
/// reconnects every second and holds the raid's I/O to that member meanwhile; after a minute
/// the controller is given up, its bdev goes, and the raid with it (the next reconcile of the
/// data control assembles it again once the member is back).
pub const MEMBER_RECONNECT: initiator::Reconnect = initiator::Reconnect {
    delay: std::time::Duration::from_secs(1),
    give_up_after: std::time::Duration::from_secs(60),
};

/// Names of a volume's keys in SPDK's keyring: host key, controller key, TLS PSK.
fn key_names(uuid: &str) -> [String; 3] {
    ["host", "ctrl", "psk"].map(|k| format!("liteio-{uuid}-{k}"))
}

fn ana(state: PathState) -> AnaState {
    match state {
        PathState::Optimized => AnaState::Optimized,
        PathState::Inaccessible => AnaState::Inaccessible,
    }
}

/// The NQN of a request: the preset's (a migration destination, an earlier export), else
/// the volume's.
fn request_nqn(req: &ExportRequest) -> String {
    nqn_of(req.preset.as_ref(), &req.uuid)
}

/// The NQN `recorded` names, else the one of the volume or data control `uuid`.
fn nqn_of(recorded: Option<&SpdkTarget>, uuid: &str) -> String {
    recorded
        .map(|t| t.subsys_nqn.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| naming::subsys_nqn(uuid))
}

/// The serial number `recorded` names (a migration destination serves the source volume's
/// identity), else the one of the volume or data control `uuid`.
fn serial_of(recorded: Option<&SpdkTarget>, uuid: &str) -> String {
    recorded
        .map(|t| t.sn.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| naming::serial_number(uuid))
}

fn target_err(e: SpdkError) -> ExportError {
    ExportError::Target {
        message: e.to_string(),
        source: Some(Box::new(e)),
    }
}

impl SpdkExporter {
    /// An exporter listening on `address` (the node IP) with ports from `ports`.
    pub fn new(
        address: impl Into<String>,
        ports: std::ops::RangeInclusive<u16>,
        transport: TcpTransportOptions,
    ) -> Self {
        Self {
            address: address.into(),
            transport,
            transport_added: tokio::sync::OnceCell::new(),
            ports: Mutex::new(PortMap::new(&ports)),
            member_nqns: Mutex::new(std::collections::HashMap::new()),
            assemblies: Mutex::new(std::collections::BTreeMap::new()),
            auth: false,
            interrupt_mode: false,
        }
    }

    /// Say that SPDK runs in interrupt mode (`spdk.interruptMode`): this node then cannot
    /// connect a migration pipe, and says so instead of failing inside SPDK.
    #[must_use]
    pub fn with_interrupt_mode(mut self, on: bool) -> Self {
        self.interrupt_mode = on;
        self
    }

    /// Require hosts to authenticate with the keys of each [`ExportRequest`] (`nvmf.auth:
    /// dhchap`, the agent's default); without, the host NQN alone admits a host.
    #[must_use]
    pub fn with_auth(mut self, on: bool) -> Self {
        self.auth = on;
        self
    }
}

impl Exporter for SpdkExporter {
    fn enforces_qos(&self) -> bool {
        true
    }

    fn health(&self) -> ExportFuture<'_, ExporterHealth> {
        Box::pin(async {
            // A stuck request makes the pool unhealthy even while other requests get answers:
            // the operation it belongs to (and its volume) is hanging in SPDK.
            let stuck = liteio_spdk::runtime::stuck_requests();
            if let Some(oldest) = stuck.first() {
                return Ok(ExporterHealth::Error {
                    message: format!(
                        "{} SPDK request(s) got no answer within {:?}; the oldest, from {}, has waited {} s: a reactor may be stuck",
                        stuck.len(),
                        liteio_spdk::runtime::request_timeout(),
                        oldest.request,
                        oldest.waiting.as_secs()
                    ),
                });
            }
            Ok(match nvmf::target_running().await {
                Ok(_) => ExporterHealth::Ok {
                    version: Spdk::version(),
                },
                Err(e) => ExporterHealth::Error {
                    message: e.to_string(),
                },
            })
        })
    }

    fn ensure_export<'a>(&'a self, req: &'a ExportRequest) -> ExportFuture<'a, SpdkTarget> {
        Box::pin(self.export(req))
    }

    fn authenticates(&self) -> bool {
        self.auth
    }

    fn assembles(&self) -> bool {
        true
    }

    fn serves(&self, nqn: &str) -> bool {
        self.known_host_port(nqn).is_some()
    }

    fn assemblies(&self) -> Vec<crate::exporter::ServedAssembly> {
        self.assemblies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(n, (u, mirror))| crate::exporter::ServedAssembly {
                name: n.clone(),
                uuid: u.clone(),
                mirror: *mirror,
            })
            .collect()
    }

    fn fence_assembly<'a>(&'a self, uuid: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            nvmf::fence_io(&naming::subsys_nqn(uuid))
                .await
                .map_err(target_err)
        })
    }

    fn unfence_assembly<'a>(&'a self, uuid: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            match nvmf::unfence_io(&naming::subsys_nqn(uuid)).await {
                Ok(()) | Err(SpdkError::NotFound { .. }) => Ok(()),
                Err(e) => Err(target_err(e)),
            }
        })
    }

    fn ensure_assembly<'a>(&'a self, req: &'a AssemblyRequest) -> ExportFuture<'a, SpdkTarget> {
        Box::pin(self.assemble_recorded(req))
    }

    fn replicas<'a>(&'a self, req: &'a AssemblyRequest) -> ExportFuture<'a, Vec<ReplicaStatus>> {
        Box::pin(async move {
            if req.level != AssemblyLevel::Mirror {
                return Ok(Vec::new());
            }
            self.replica_reports(req).await
        })
    }

    fn remove_assembly<'a>(&'a self, req: &'a UnassembleRequest) -> ExportFuture<'a, ()> {
        Box::pin(self.unassemble(req))
    }

    fn is_listening<'a>(&'a self, target: &'a SpdkTarget) -> ExportFuture<'a, bool> {
        // This exporter's own record of the host listeners it created (SPDK runs in this
        // process): no request to the reactor, which is busy restoring the exports this is
        // polled for.
        let listening = self
            .known_host_port(&target.subsys_nqn)
            .is_some_and(|p| target.svc_id.parse() == Ok(p));
        Box::pin(async move { Ok(listening) })
    }

    fn ensure_pipe<'a>(
        &'a self,
        req: &'a ExportRequest,
        want: bool,
    ) -> ExportFuture<'a, Option<u16>> {
        Box::pin(self.pipe_listener(req, want))
    }

    fn migrator(&self) -> Option<&dyn Migrator> {
        Some(self)
    }

    fn remove_export<'a>(&'a self, req: &'a UnexportRequest) -> ExportFuture<'a, ()> {
        Box::pin(self.unexport(req))
    }

    fn resize_export<'a>(&'a self, req: &'a ExportRequest) -> ExportFuture<'a, ()> {
        Box::pin(self.resize(req))
    }
}
