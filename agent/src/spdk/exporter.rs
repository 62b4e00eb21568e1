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

use std::sync::Mutex;

use liteio_api::replica::{ReplicaState, ReplicaStatus};
use liteio_api::{SpdkTarget, naming};

use super::error::SpdkError;
use super::initiator;
use super::nvmf::{self, AnaState, HostKeys, Multipath, SubsystemSpec, TcpTransportOptions};
use super::ports::{PortMap, Role};
use super::raid::{self, RaidLevel, RaidState};
use super::{Spdk, bdev, gate, keyring};
use crate::exporter::{
    AssemblyLevel, AssemblyRequest, CopyPhase, CopyStatus, ExportError, ExportFuture,
    ExportRequest, Exporter, ExporterHealth, MemberSource, Migrator, PathState, PipeRequest,
    UnassembleRequest, UnexportRequest,
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

/// What one [`Exporter::ensure_assembly`] call made, removed again when the call fails.
#[derive(Debug, Default)]
struct Made {
    /// Keys loaded for a new assembly (its uuid).
    keys: Option<String>,
    /// Initiator controllers attached.
    controllers: Vec<String>,
    /// The raid bdev.
    raid: Option<String>,
    /// The subsystem (NQN).
    subsystem: Option<String>,
}

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
    req.preset
        .as_ref()
        .map(|t| t.subsys_nqn.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| naming::subsys_nqn(&req.uuid))
}

/// The host listener's port among a subsystem's listeners on `address`, for a subsystem the
/// port map does not know: the oldest (SPDK lists the newest listener first, and a pipe
/// listener is always added after the host's). Never the pipe's: a volume whose first export
/// was not recorded yet (a lost patch) would otherwise be recorded with the pipe's port, and
/// hosts would write to the destination of a migration through its always-optimized pipe
/// listener.
fn host_port(listeners: &[(String, u16)], address: &str) -> Option<u16> {
    listeners
        .iter()
        .rev()
        .find(|(a, _)| a == address)
        .map(|(_, p)| *p)
}

fn copy_status(p: &gate::CopyProgress) -> CopyStatus {
    CopyStatus {
        state: match p.state {
            gate::CopyState::Idle => CopyPhase::Idle,
            gate::CopyState::Starting => CopyPhase::Starting,
            gate::CopyState::Copying => CopyPhase::Copying,
            gate::CopyState::InStep => CopyPhase::InStep,
            gate::CopyState::Stopping => CopyPhase::Stopping,
            gate::CopyState::Cancelled => CopyPhase::Cancelled,
            gate::CopyState::Failed => CopyPhase::Failed,
            gate::CopyState::Finished => CopyPhase::Finished,
            _ => CopyPhase::Failed,
        },
        status: p.status,
        size_bytes: p.size_bytes,
        scanned_bytes: p.scanned_bytes,
        copied_bytes: p.copied_bytes,
        mirrored_writes: p.mirrored_writes,
        mirror_errors: p.mirror_errors,
        elapsed: p.elapsed,
    }
}

/// The gate over the lvol `lvol` (alias or name); an error when the volume has none (it
/// is not exported by this target).
async fn gate_over(lvol: &str) -> Result<String, ExportError> {
    gate::gate_of(lvol)
        .await
        .map_err(target_err)?
        .ok_or_else(|| {
            ExportError::InvalidRequest(format!(
                "lvol {lvol} has no gate: it is not exported by this node's target"
            ))
        })
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

    /// The port map (its guard is never held across an `.await`).
    fn ports(&self) -> std::sync::MutexGuard<'_, PortMap> {
        self.ports
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The host listener's port of subsystem `nqn`, when this exporter created it.
    fn known_host_port(&self, nqn: &str) -> Option<u16> {
        self.ports().host(nqn)
    }

    /// The port map's view of subsystem `nqn` brought in line with SPDK's (`listeners`),
    /// when the map does not know `nqn`'s host port or SPDK does not list it (a creation
    /// cancelled after the reactor made the subsystem; a subsystem made outside this
    /// exporter). Its oldest listener on this node's
    /// address becomes its host port (SPDK lists the newest first, and a pipe listener is
    /// always added after the host's), the others its pipes. Returns the host port; `None`
    /// when the subsystem has no listener on the address.
    fn settle_ports(&self, nqn: &str, listeners: &[(String, u16)]) -> Option<u16> {
        let listed = |p: &u16| listeners.iter().any(|(a, q)| a == &self.address && q == p);
        if let Some(p) = self.known_host_port(nqn).filter(listed) {
            return Some(p);
        }
        let host = host_port(listeners, &self.address)?;
        let pipes: Vec<u16> = listeners
            .iter()
            .filter(|(a, p)| a == &self.address && *p != host)
            .map(|(_, p)| *p)
            .collect();
        let conflicts = self.ports().adopt(nqn, host, &pipes);
        for c in conflicts {
            tracing::error!(nqn = %nqn, port = c.port, owner = %c.owner, "SPDK lists a listener of this subsystem on a port the exporter gave to another subsystem");
        }
        tracing::info!(nqn = %nqn, port = host, pipes = ?pipes, "ports of a subsystem the port map did not know taken over from its listeners");
        Some(host)
    }

    /// The TCP transport, added to the target by the first caller (the others wait for it),
    /// and the port map seeded once from the subsystems the target has already. In the agent
    /// the target starts empty with it; a target that outlived an earlier exporter (tests
    /// that restart an agent in one process) keeps its listeners, and their ports must not
    /// be handed out again. Before any port is taken: every taker comes here first.
    async fn ensure_transport(&self) -> Result<(), ExportError> {
        self.transport_added
            .get_or_try_init(|| async {
                nvmf::ensure_tcp_transport(&self.transport).await?;
                for s in nvmf::subsystems().await? {
                    self.settle_ports(&s.nqn, &s.listeners);
                }
                Ok::<(), SpdkError>(())
            })
            .await
            .map(|_| ())
            .map_err(target_err)
    }

    /// Put the request's keys into SPDK's keyring under the volume's key names (a changed key
    /// replaces the old one) and say how the subsystem's hosts use them.
    async fn load_keys(&self, req: &ExportRequest) -> Result<(HostKeys, bool), ExportError> {
        self.load_keys_of(
            &format!("volume {}", req.volume),
            &req.uuid,
            req.keys.as_ref(),
        )
        .await
    }

    /// [`Self::load_keys`] for `what` (messages) with uuid `uuid` and keys `keys`.
    async fn load_keys_of(
        &self,
        what: &str,
        uuid: &str,
        keys: Option<&liteio_api::auth::VolumeKeys>,
    ) -> Result<(HostKeys, bool), ExportError> {
        if !self.auth {
            return Ok((HostKeys::default(), false));
        }
        let Some(k) = keys else {
            return Err(ExportError::InvalidRequest(format!(
                "{what}: this target requires host authentication and the request has no keys"
            )));
        };
        let [host, ctrl, psk] = key_names(uuid);
        keyring::add_key(&host, k.host.expose())
            .await
            .map_err(target_err)?;
        keyring::add_key(&ctrl, k.ctrl.expose())
            .await
            .map_err(target_err)?;
        let psk = match &k.tls_psk {
            Some(p) => {
                keyring::add_key(&psk, p.expose())
                    .await
                    .map_err(target_err)?;
                Some(psk)
            }
            None => None,
        };
        let tls = psk.is_some();
        Ok((
            HostKeys {
                dhchap_key: Some(host),
                dhchap_ctrlr_key: Some(ctrl),
                psk,
            },
            tls,
        ))
    }

    /// Serves subsystem `nqn` as `spec(port)` says: an existing one (every reconcile of a
    /// ready volume comes here) is checked and gets its host list brought up to date, and is
    /// promoted to `path_state` when that is optimized; a new one gets a port of the range
    /// from the port map (`preferred` first, or the port `nqn` holds already). Returns the
    /// subsystem and its host listener's port.
    ///
    /// Nothing here waits on the reactor while holding a lock: the port is taken from the
    /// map (pending for `nqn`), the subsystem made, and the port committed. A call dropped
    /// in between leaves the port pending for `nqn`, never to another volume, since the
    /// reactor may still make the subsystem: `nqn`'s next export takes it over (from SPDK's
    /// listeners when the subsystem exists, else as its pending port), its removal frees it.
    async fn serve<F>(
        &self,
        nqn: &str,
        spec: F,
        path_state: PathState,
        preferred: Option<u16>,
    ) -> Result<(nvmf::SubsystemInfo, u16), ExportError>
    where
        F: Fn(u16) -> SubsystemSpec + Sync,
    {
        let existing = nvmf::find_subsystem(nqn).await.map_err(target_err)?;
        if let Some(port) = existing.and_then(|s| self.settle_ports(nqn, &s.listeners)) {
            let info = nvmf::create_subsystem(spec(port))
                .await
                .map_err(target_err)?;
            // Promoted only (see `ExportRequest::path_state`), and only when it is not
            // optimized yet: a change pauses and resumes the subsystem, which would end a
            // switch-over's fence.
            if path_state == PathState::Optimized
                && nvmf::ana_state(nqn, &self.address, port, 1)
                    .await
                    .map_err(target_err)?
                    != ana(PathState::Optimized)
            {
                nvmf::set_ana_state(nqn, &self.address, port, ana(PathState::Optimized), 1)
                    .await
                    .map_err(target_err)?;
            }
            return Ok((info, port));
        }
        // A new subsystem. The creations run concurrently (one slow subsystem start must not
        // hold every other export of the node); the map keeps two volumes off one port.
        self.ensure_transport().await?;
        let mut tried = std::collections::HashSet::new();
        let mut last = None;
        loop {
            let taken = self.ports().take(nqn, Role::Host, preferred, &tried);
            let port = match taken {
                Ok(p) => p,
                Err(e) => {
                    return Err(last.map_or_else(
                        || ExportError::Target {
                            message: e.to_string(),
                            source: None,
                        },
                        target_err,
                    ));
                }
            };
            match nvmf::create_subsystem(spec(port)).await {
                Ok(info) => {
                    if let Err(c) = self.ports().commit(nqn, port, Role::Host) {
                        // Only when a removal of `nqn` raced this export.
                        tracing::error!(nqn = %nqn, port, owner = %c.owner, "NVMe-oF subsystem made on a port that was given to another subsystem meanwhile");
                    }
                    // Hosts can connect from now on: after a restart, the moment a volume is
                    // served again (the restart benchmark reads it).
                    tracing::info!(nqn = %nqn, port, "NVMe-oF subsystem listening");
                    return Ok((info, port));
                }
                // Another program holds the port: try the next one (this one goes to the
                // back of the queue).
                Err(e @ SpdkError::Errno { op: "listen", .. }) => {
                    self.ports().abandon(nqn, port);
                    tried.insert(port);
                    last = Some(e);
                }
                Err(e) => {
                    self.ports().abandon(nqn, port);
                    return Err(target_err(e));
                }
            }
        }
    }

    fn target(
        &self,
        bdev_name: String,
        info: nvmf::SubsystemInfo,
        port: u16,
        ns_uuid: String,
    ) -> SpdkTarget {
        SpdkTarget {
            bdev_name,
            subsys_nqn: info.nqn,
            svc_id: port.to_string(),
            sn: info.serial,
            trans_type: naming::TRANS_TYPE_TCP.into(),
            ns_uuid,
            address: self.address.clone(),
            addr_fam: naming::ADDR_FAM_IPV4.into(),
        }
    }
}

impl SpdkExporter {
    /// The bdev a member of `req` is found at, attaching a remote one when missing (recorded
    /// in `made`).
    async fn member_bdev(
        &self,
        req: &AssemblyRequest,
        index: usize,
        keys: &HostKeys,
        made: &mut Made,
    ) -> Result<String, ExportError> {
        let m = &req.members[index];
        match &m.source {
            MemberSource::Local { lvol } => {
                let alias = lvol.full_name();
                // Its canonical name (the lvol's UUID): what SPDK reports as the raid's base.
                let b = bdev::get(&alias).await.map_err(target_err)?.ok_or_else(|| {
                    ExportError::InvalidRequest(format!(
                        "multi-disk volume {}: member {} ({alias}) is not in this node's lvstore",
                        req.name, m.volume
                    ))
                })?;
                Ok(b.name)
            }
            MemberSource::Absent { reason } => Err(ExportError::InvalidRequest(format!(
                "multi-disk volume {}: member {} is not reachable ({reason}); only a replicated volume serves without a member",
                req.name, m.volume
            ))),
            MemberSource::Remote { target } => {
                let ctrl = naming::assembly_controller(&req.name, index);
                let ns = naming::nvme_ns_bdev(&ctrl);
                if bdev::get(&ns).await.map_err(target_err)?.is_some() {
                    if req.level != AssemblyLevel::Mirror || self.attached_to(&ctrl, target).await {
                        return Ok(ns);
                    }
                    // A replica replaced in its slot: the controller reaches the old one.
                    // Out of the raid first, then detached, then the new one attached.
                    tracing::info!(assembly = %req.name, member = %m.volume, controller = %ctrl, "slot's controller reaches a replaced replica; detaching it");
                    raid::remove_raid_base(&ns).await.map_err(target_err)?;
                }
                let port: u16 = target.svc_id.parse().map_err(|_| {
                    ExportError::InvalidRequest(format!(
                        "multi-disk volume {}: member {}'s export spec.spdkTarget.svcID is {:?}, not a port",
                        req.name, m.volume, target.svc_id
                    ))
                })?;
                // A controller left without its namespace (it gave up reconnecting) is
                // attached anew.
                match initiator::detach(&ctrl).await {
                    Ok(()) | Err(SpdkError::NotFound { .. }) => {}
                    Err(e) => return Err(target_err(e)),
                }
                let attached = if req.level == AssemblyLevel::Mirror {
                    // A replica whose node dies must fail its I/O fast, so that the raid
                    // degrades instead of holding the host's I/O.
                    initiator::attach_tcp_opts(
                        &ctrl,
                        &target.address,
                        port,
                        &target.subsys_nqn,
                        &req.hostnqn,
                        keys,
                        &initiator::AttachOpts::raid_member(),
                    )
                    .await
                } else {
                    initiator::attach_tcp_auth(
                        &ctrl,
                        &target.address,
                        port,
                        &target.subsys_nqn,
                        &req.hostnqn,
                        Some(MEMBER_RECONNECT),
                        keys,
                    )
                    .await
                };
                let names = attached.map_err(|e| ExportError::Target {
                    message: format!(
                        "multi-disk volume {}: cannot attach member {} (node {}) at {}:{port} as {}",
                        req.name, m.volume, m.node, target.address, req.hostnqn
                    ),
                    source: Some(Box::new(e)),
                })?;
                made.controllers.push(ctrl.clone());
                self.member_nqns
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(ctrl.clone(), target.subsys_nqn.clone());
                if !names.contains(&ns) {
                    return Err(ExportError::Target {
                        message: format!(
                            "multi-disk volume {}: member {} at {}:{port} has no namespace 1 (got {names:?})",
                            req.name, m.volume, target.address
                        ),
                        source: None,
                    });
                }
                tracing::info!(assembly = %req.name, member = %m.volume, node = %m.node, controller = %ctrl, "member attached");
                Ok(ns)
            }
        }
    }

    /// The raid bdev over `bases` (made when missing, recorded in `made`); a raid that lost
    /// a member (configuring, offline, being deleted) is made again.
    async fn raid_over(
        &self,
        req: &AssemblyRequest,
        bases: &[String],
        made: &mut Made,
    ) -> Result<String, ExportError> {
        let name = naming::assembly_bdev(&req.name);
        let level = match req.level {
            AssemblyLevel::Concat => RaidLevel::Concat,
            AssemblyLevel::Raid0 => RaidLevel::Raid0,
            AssemblyLevel::Mirror => {
                return Err(ExportError::InvalidRequest(format!(
                    "multi-disk volume {}: a mirror is made by mirror_over",
                    req.name
                )));
            }
        };
        let had = match raid::raid_info(&name).await.map_err(target_err)? {
            Some(i) if i.state != RaidState::Online || i.deleting => {
                tracing::warn!(assembly = %req.name, state = %i.state, "raid bdev lost a member; making it again");
                raid::delete_raid(&name).await.map_err(target_err)?;
                false
            }
            Some(_) => true,
            None => false,
        };
        raid::create_raid(&name, level, bases, req.strip_kb)
            .await
            .map_err(|e| ExportError::Target {
                message: format!(
                    "multi-disk volume {}: cannot make the {} bdev over [{}]",
                    req.name,
                    level,
                    bases.join(", ")
                ),
                source: Some(Box::new(e)),
            })?;
        if !had {
            made.raid = Some(name.clone());
            tracing::info!(assembly = %req.name, level = %level, strip_kb = req.strip_kb, members = bases.len(), "raid bdev made");
        }
        Ok(name)
    }

    /// Whether initiator controller `ctrl` reaches `target` (its first path's address and
    /// port); no when it cannot tell.
    async fn attached_to(&self, ctrl: &str, target: &SpdkTarget) -> bool {
        let known = self
            .member_nqns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(ctrl)
            .cloned();
        if let Some(nqn) = known {
            return nqn == target.subsys_nqn;
        }
        match initiator::paths(ctrl).await {
            Ok(paths) => paths.first().is_some_and(|p| {
                p.address == target.address && p.port.to_string() == target.svc_id
            }),
            Err(_) => false,
        }
    }

    /// The raid1 of a replicated volume over its reachable replicas (see
    /// [`AssemblyRequest::new_mirror`]): made with a superblock over every replica when the
    /// volume is new; otherwise found, or assembled again from the replicas' superblocks
    /// (degraded when some are missing; a replica that missed writes is left out). Then
    /// re-asserted: a slot whose replica is no longer a member (replaced) is removed, and one
    /// reachable replica that is not in the raid is added and rebuilt — one at a time, while
    /// no rebuild runs. A replica that cannot be attached counts as missing: the mirror
    /// serves without it.
    async fn mirror_over(
        &self,
        req: &AssemblyRequest,
        keys: &HostKeys,
        made: &mut Made,
    ) -> Result<String, ExportError> {
        let name = naming::assembly_bdev(&req.name);
        let mut present: Vec<String> = Vec::new();
        let mut missing: Vec<String> = Vec::new();
        for (i, m) in req.members.iter().enumerate() {
            if let MemberSource::Absent { reason } = &m.source {
                missing.push(format!("{} ({reason})", m.volume));
                continue;
            }
            match self.member_bdev(req, i, keys, made).await {
                Ok(b) => present.push(b),
                Err(e) if !req.new_mirror => {
                    tracing::warn!(assembly = %req.name, member = %m.volume, error = %e, "replica not reachable; the mirror serves without it");
                    missing.push(format!("{} ({e})", m.volume));
                }
                Err(e) => return Err(e),
            }
        }
        let info = raid::raid_info(&name).await.map_err(target_err)?;
        let info = match info {
            Some(i) if !i.deleting && i.state == RaidState::Online => i,
            found => {
                if let Some(i) = found {
                    // Configuring (waiting for members) or offline: assembled again below.
                    tracing::warn!(assembly = %req.name, state = %i.state, "mirror not online; assembling it again from its replicas");
                    raid::delete_raid(&name).await.map_err(target_err)?;
                }
                if req.new_mirror {
                    if !missing.is_empty() || present.len() < 2 {
                        return Err(ExportError::InvalidRequest(format!(
                            "replicated volume {}: a new mirror is made over every replica, and {} of {} are reachable (missing: {})",
                            req.name,
                            present.len(),
                            req.members.len(),
                            missing.join(", ")
                        )));
                    }
                    // SPDK gives the raid a UUID of its own (not the export's namespace
                    // UUID: a host in the same process would take that for its bdev).
                    raid::create_raid_with(
                        &name,
                        RaidLevel::Raid1,
                        &present,
                        0,
                        &raid::RaidCreateOpts {
                            superblock: true,
                            uuid: None,
                        },
                    )
                    .await
                    .map_err(|e| ExportError::Target {
                        message: format!(
                            "replicated volume {}: cannot make the raid1 over [{}]",
                            req.name,
                            present.join(", ")
                        ),
                        source: Some(Box::new(e)),
                    })?;
                    made.raid = Some(name.clone());
                    tracing::info!(assembly = %req.name, replicas = present.len(), "mirror made over every replica");
                } else {
                    let a = raid::assemble_from_superblock(&name, &present, true)
                        .await
                        .map_err(|e| ExportError::Target {
                            message: format!(
                                "replicated volume {}: cannot assemble the raid1 again from the superblocks of [{}]",
                                req.name,
                                present.join(", ")
                            ),
                            source: Some(Box::new(e)),
                        })?;
                    made.raid = Some(name.clone());
                    tracing::info!(assembly = %req.name, not_current = ?a.not_current, absent = ?a.absent, missing = ?missing, "mirror assembled again from its replicas' superblocks");
                }
                raid::raid_info(&name)
                    .await
                    .map_err(target_err)?
                    .ok_or_else(|| ExportError::Target {
                        message: format!("replicated volume {}: its raid1 vanished", req.name),
                        source: None,
                    })?
            }
        };
        // Slots of replicas that are no longer members (replaced) leave the raid.
        for b in &info.bases {
            if let Some(n) = &b.name
                && b.configured
                && !present.contains(n)
                && !self.is_member_slot(req, n)
            {
                raid::remove_raid_base(n).await.map_err(target_err)?;
                tracing::info!(assembly = %req.name, base = %n, "replica that is no longer a member removed from the mirror");
            }
        }
        // One reachable replica outside the raid joins it and is rebuilt.
        let info = raid::raid_info(&name)
            .await
            .map_err(target_err)?
            .unwrap_or(info);
        let rebuilding = info.process.is_some() || info.bases.iter().any(|b| b.rebuilding);
        if !rebuilding
            && let Some(b) = present.iter().find(|p| {
                !info
                    .bases
                    .iter()
                    .any(|s| s.name.as_deref() == Some(p.as_str()) && s.configured)
            })
        {
            raid::add_raid_base(&name, b)
                .await
                .map_err(|e| ExportError::Target {
                    message: format!(
                        "replicated volume {}: cannot add replica {b} to the mirror",
                        req.name
                    ),
                    source: Some(Box::new(e)),
                })?;
            tracing::info!(assembly = %req.name, base = %b, "replica added to the mirror; rebuilding it");
        }
        Ok(name)
    }

    /// Whether base bdev `n` is the bdev of one of `req`'s member slots (a remote member's
    /// namespace bdev whose controller is gone is still its slot's).
    fn is_member_slot(&self, req: &AssemblyRequest, n: &str) -> bool {
        req.members
            .iter()
            .enumerate()
            .any(|(i, m)| match &m.source {
                MemberSource::Remote { .. } => {
                    naming::nvme_ns_bdev(&naming::assembly_controller(&req.name, i)) == n
                }
                _ => false,
            })
    }

    /// The replicas' states for [`Exporter::replicas`].
    async fn replica_reports(
        &self,
        req: &AssemblyRequest,
    ) -> Result<Vec<ReplicaStatus>, ExportError> {
        let name = naming::assembly_bdev(&req.name);
        let info = raid::raid_info(&name).await.map_err(target_err)?;
        let mut out = Vec::with_capacity(req.members.len());
        for (i, m) in req.members.iter().enumerate() {
            let base = match &m.source {
                MemberSource::Local { lvol } => bdev::get(&lvol.full_name())
                    .await
                    .map_err(target_err)?
                    .map(|b| b.name),
                MemberSource::Remote { .. } => Some(naming::nvme_ns_bdev(
                    &naming::assembly_controller(&req.name, i),
                )),
                MemberSource::Absent { .. } => None,
            };
            let slot = info.as_ref().and_then(|info| {
                info.bases
                    .iter()
                    .find(|b| b.name.is_some() && b.name == base)
            });
            let mut st = ReplicaStatus {
                volume: m.volume.clone(),
                node: m.node.clone(),
                state: ReplicaState::Missing,
                rebuild_percent: None,
                rebuilt_bytes: None,
                since: None,
                message: String::new(),
            };
            match (slot, &m.source) {
                (Some(b), _) if b.rebuilding => {
                    st.state = ReplicaState::Rebuilding;
                    if let Some(p) = info.as_ref().and_then(|i| i.process.as_ref()) {
                        let bs = u64::from(info.as_ref().map_or(0, |i| i.block_size));
                        st.rebuilt_bytes = Some(p.blocks_done.saturating_mul(bs));
                        st.rebuild_percent = u8::try_from(p.percent.min(100)).ok();
                    }
                }
                (Some(b), _) if b.configured && !b.failed => st.state = ReplicaState::Online,
                (Some(_), _) => {
                    st.state = ReplicaState::Failed;
                    st.message = "failed by the raid after an I/O error".into();
                }
                (None, MemberSource::Absent { reason }) => st.message = reason.clone(),
                (None, _) => {
                    st.message =
                        "reachable, not in the mirror yet (added once no rebuild runs)".into();
                }
            }
            out.push(st);
        }
        Ok(out)
    }

    /// [`Exporter::ensure_assembly`]'s work; what it makes is recorded in `made`.
    async fn assemble(
        &self,
        req: &AssemblyRequest,
        made: &mut Made,
    ) -> Result<SpdkTarget, ExportError> {
        if req.members.is_empty() {
            return Err(ExportError::InvalidRequest(format!(
                "multi-disk volume {} has no members to assemble",
                req.name
            )));
        }
        let remote = req
            .members
            .iter()
            .filter(|m| matches!(m.source, MemberSource::Remote { .. }))
            .count();
        if remote > 0 && self.interrupt_mode {
            return Err(ExportError::Unsupported(format!(
                "multi-disk volume {} has {remote} member(s) on other nodes, which this node attaches with SPDK's NVMe/TCP initiator, and this node's SPDK runs in interrupt mode (spdk.interruptMode: true), where that initiator cannot run; a node that assembles multi-disk volumes (the node of a volume's largest member) needs spdk.interruptMode: false",
                req.name
            )));
        }
        let preset = req.preset.as_ref().filter(|t| !t.subsys_nqn.is_empty());
        let nqn = preset.map_or_else(|| naming::subsys_nqn(&req.uuid), |t| t.subsys_nqn.clone());
        let fresh = nvmf::find_subsystem(&nqn)
            .await
            .map_err(target_err)?
            .is_none()
            && raid::raid_info(&naming::assembly_bdev(&req.name))
                .await
                .map_err(target_err)?
                .is_none();
        let what = format!("multi-disk volume {}", req.name);
        let (keys, secure_channel) = self
            .load_keys_of(&what, &req.uuid, req.keys.as_ref())
            .await?;
        if fresh && self.auth {
            made.keys = Some(req.uuid.clone());
        }
        let exported = if req.level == AssemblyLevel::Mirror {
            self.mirror_over(req, &keys, made).await?
        } else {
            let mut bases = Vec::with_capacity(req.members.len());
            for i in 0..req.members.len() {
                bases.push(self.member_bdev(req, i, &keys, made).await?);
            }
            // One member needs no raid (SPDK's raids take two or more).
            match bases.as_slice() {
                [one] => one.clone(),
                _ => self.raid_over(req, &bases, made).await?,
            }
        };
        let bases_count = req.members.len();
        let size = bdev::get(&exported)
            .await
            .map_err(target_err)?
            .map_or(0, |b| b.size_bytes());
        if size < req.size_bytes {
            return Err(ExportError::InvalidRequest(format!(
                "multi-disk volume {}: the {} of its {} member(s) holds {size} bytes, less than its spec.totalSize {}",
                req.name,
                req.level.as_str(),
                bases_count,
                req.size_bytes
            )));
        }
        // A subsystem that exports something else (the raid was made again, and SPDK took
        // the old one's namespace away with it) is made again.
        if let Some(sub) = nvmf::find_subsystem(&nqn).await.map_err(target_err)?
            && sub.bdevs != [exported.clone()]
        {
            tracing::warn!(assembly = %req.name, nqn = %nqn, bdevs = ?sub.bdevs, "the assembly's subsystem exports another bdev; making it again");
            // Its port stays with it in the map: `serve` makes it again on the same port.
            nvmf::delete_subsystem(&nqn).await.map_err(target_err)?;
        }
        let existed = nvmf::find_subsystem(&nqn)
            .await
            .map_err(target_err)?
            .is_some();
        let ns_uuid = preset
            .map(|t| t.ns_uuid.clone())
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| naming::assembly_ns_uuid(&req.uuid));
        let serial = preset
            .map(|t| t.sn.clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| naming::serial_number(&req.uuid));
        let (min_cntlid, max_cntlid) = naming::cntlid_range(&self.address);
        let spec = |port| SubsystemSpec {
            nqn: nqn.clone(),
            serial: serial.clone(),
            model: ns_uuid.chars().take(40).collect(),
            bdev: exported.clone(),
            ns_uuid: ns_uuid.clone(),
            address: self.address.clone(),
            port,
            hosts: req.allowed_hosts.clone(),
            keys: keys.clone(),
            secure_channel,
            keyless_hosts: Vec::new(),
            // As every export: ANA reporting and this node's controller IDs.
            multipath: Some(Multipath {
                ana_state: AnaState::Optimized,
                min_cntlid,
                max_cntlid,
            }),
        };
        let preferred = preset.and_then(|t| t.svc_id.parse().ok());
        let (info, port) = self
            .serve(&nqn, spec, PathState::Optimized, preferred)
            .await?;
        if !existed {
            made.subsystem = Some(nqn.clone());
        }
        Ok(self.target(exported, info, port, ns_uuid))
    }

    /// Removes what a failed [`Exporter::ensure_assembly`] made, newest first (best effort:
    /// a failure is logged, and the data control's deletion removes it later).
    async fn undo(&self, name: &str, made: Made) {
        if let Some(nqn) = &made.subsystem {
            match nvmf::delete_subsystem(nqn).await {
                Ok(()) => self.ports().free_all(nqn),
                // Its port stays with it: SPDK may still listen there.
                Err(e) => {
                    tracing::warn!(assembly = name, nqn = %nqn, error = %e, "cannot remove the subsystem of a failed assembly");
                }
            }
        }
        if let Some(r) = &made.raid
            && let Err(e) = raid::delete_raid(r).await
        {
            tracing::warn!(assembly = name, raid = %r, error = %e, "cannot remove the raid bdev of a failed assembly");
        }
        for c in made.controllers.iter().rev() {
            match initiator::detach(c).await {
                Ok(()) | Err(SpdkError::NotFound { .. }) => {}
                Err(e) => {
                    tracing::warn!(assembly = name, controller = %c, error = %e, "cannot detach a member of a failed assembly");
                }
            }
        }
        if let Some(uuid) = &made.keys {
            for k in key_names(uuid) {
                if let Err(e) = keyring::remove_key(&k).await {
                    tracing::warn!(assembly = name, error = %e, "cannot remove the keys of a failed assembly");
                }
            }
        }
    }
}

/// Sets the exported bdev's rate limits to `qos` unless they are already in force.
async fn apply_qos(bdev_name: &str, qos: liteio_api::qos::VolumeQos) -> Result<(), ExportError> {
    let want = bdev::QosLimits {
        rw_iops: qos.iops,
        rw_mibps: qos.mbps,
        read_mibps: qos.read_mbps,
        write_mibps: qos.write_mbps,
    };
    let now = bdev::qos_limits(bdev_name).await.map_err(target_err)?;
    if now != want {
        bdev::set_qos_limits(bdev_name, want)
            .await
            .map_err(target_err)?;
        tracing::info!(bdev = bdev_name, limits = %qos.summary(), "QoS limits in force");
    }
    Ok(())
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
        Box::pin(async move {
            let bdev_name = match (&req.lvol, &req.device) {
                // Idempotent: an existing gate over the lvol is reused.
                (Some(l), _) => gate::create_gate(&l.full_name())
                    .await
                    .map_err(target_err)?,
                (None, Some(dev)) => {
                    let name = naming::aio_bdev_name(&req.uuid);
                    bdev::create_aio(&name, dev, 512)
                        .await
                        .map_err(target_err)?;
                    name
                }
                (None, None) => {
                    return Err(ExportError::InvalidRequest(format!(
                        "volume {} has neither an lvol nor a device to export",
                        req.volume
                    )));
                }
            };
            // The limits hold from the first I/O of a new export, and follow the spec live on
            // an existing one (SPDK swaps them under I/O in flight).
            apply_qos(&bdev_name, req.qos).await?;
            let preset = req.preset.as_ref().filter(|t| !t.subsys_nqn.is_empty());
            let nqn = request_nqn(req);
            let recorded = preset.map(|t| t.ns_uuid.clone()).filter(|u| !u.is_empty());
            // Looked up only for a new export (a re-assertion keeps the recorded one).
            let own = match (&recorded, &req.lvol, req.group_member) {
                (None, Some(l), true) => bdev::get(&l.full_name())
                    .await
                    .map_err(target_err)?
                    .map(|b| b.uuid),
                _ => None,
            };
            let ns_uuid = recorded.or(own).unwrap_or_else(|| req.uuid.clone());
            let (keys, secure_channel) = self.load_keys(req).await?;
            // The namespace's identity comes from the volume, never the node: the preset's
            // serial (a migration destination serves the source volume's identity, so the
            // host sees one subsystem with two paths), else the volume's.
            let serial = preset
                .map(|t| t.sn.clone())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| naming::serial_number(&req.uuid));
            let (min_cntlid, max_cntlid) = naming::cntlid_range(&self.address);
            let spec = |port| SubsystemSpec {
                nqn: nqn.clone(),
                serial: serial.clone(),
                model: ns_uuid.chars().take(40).collect(),
                bdev: bdev_name.clone(),
                ns_uuid: ns_uuid.clone(),
                address: self.address.clone(),
                port,
                hosts: req.allowed_hosts.clone(),
                keys: keys.clone(),
                secure_channel,
                // Only with authentication on: without it every entry is keyless already.
                keyless_hosts: if self.auth {
                    req.keyless_hosts.clone()
                } else {
                    Vec::new()
                },
                // Every export can become one of two paths of a hot migration: ANA reporting
                // must be on, and the controller IDs this node's range, before it starts.
                multipath: Some(Multipath {
                    ana_state: ana(req.path_state),
                    min_cntlid,
                    max_cntlid,
                }),
            };
            let preferred = preset.and_then(|t| t.svc_id.parse().ok());
            let (info, port) = self.serve(&nqn, spec, req.path_state, preferred).await?;
            Ok(self.target(bdev_name, info, port, ns_uuid))
        })
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
        Box::pin(async move {
            let mut made = Made::default();
            let res = self.assemble(req, &mut made).await;
            if res.is_err() {
                self.undo(&req.name, made).await;
            } else {
                self.assemblies
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(
                        req.name.clone(),
                        (req.uuid.clone(), req.level == AssemblyLevel::Mirror),
                    );
            }
            res
        })
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
        Box::pin(async move {
            let nqn = req
                .target
                .as_ref()
                .map(|t| t.subsys_nqn.clone())
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| naming::subsys_nqn(&req.uuid));
            nvmf::delete_subsystem(&nqn).await.map_err(target_err)?;
            self.ports().free_all(&nqn);
            let raid_name = naming::assembly_bdev(&req.name);
            if raid::raid_info(&raid_name)
                .await
                .map_err(target_err)?
                .is_some()
            {
                raid::delete_raid(&raid_name).await.map_err(target_err)?;
            }
            // The members' controllers: by index, and any other found by name.
            let prefix = naming::assembly_controller_prefix(&req.name);
            let mut controllers: Vec<String> = (0..req.members)
                .map(|i| naming::assembly_controller(&req.name, i))
                .collect();
            for b in bdev::list().await.map_err(target_err)? {
                if let Some(c) = b.name.strip_suffix("n1")
                    && c.starts_with(&prefix)
                    && !controllers.iter().any(|k| k == c)
                {
                    controllers.push(c.to_string());
                }
            }
            for c in controllers {
                match initiator::detach(&c).await {
                    Ok(()) | Err(SpdkError::NotFound { .. }) => {}
                    Err(e) => return Err(target_err(e)),
                }
            }
            for k in key_names(&req.uuid) {
                keyring::remove_key(&k).await.map_err(target_err)?;
            }
            self.assemblies
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&req.name);
            Ok(())
        })
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
        Box::pin(async move {
            let nqn = request_nqn(req);
            let Some(sub) = nvmf::find_subsystem(&nqn).await.map_err(target_err)? else {
                return if want {
                    Err(ExportError::InvalidRequest(format!(
                        "volume {} is not exported: no pipe listener without its export",
                        req.volume
                    )))
                } else {
                    Ok(None)
                };
            };
            // The map knows the pipe's port (a cancelled export's ports are taken over from
            // SPDK's listeners first): SPDK does not tell a pipe listener from the host's.
            self.settle_ports(&nqn, &sub.listeners);
            let pipe = self.ports().pipe(&nqn);
            if !want {
                if let Some(p) = pipe {
                    // Stops the target listening on the port, which no other subsystem uses.
                    nvmf::remove_listener(&nqn, &self.address, p)
                        .await
                        .map_err(target_err)?;
                    self.ports().free(&nqn, p);
                }
                return Ok(None);
            }
            if let Some(p) = pipe
                && sub
                    .listeners
                    .iter()
                    .any(|(a, q)| a == &self.address && *q == p)
            {
                return Ok(Some(p));
            }
            self.ensure_transport().await?;
            let secure_channel = req.keys.as_ref().is_some_and(|k| k.tls_psk.is_some());
            let mut tried = std::collections::HashSet::new();
            loop {
                // The pipe's port when the map has one SPDK lost, else a free one.
                let taken = match pipe.filter(|p| !tried.contains(p)) {
                    Some(p) => Ok(p),
                    None => self.ports().take(&nqn, Role::Pipe, None, &tried),
                };
                let Ok(port) = taken else {
                    return Err(ExportError::Target {
                        message: format!(
                            "no free port for the migration pipe of volume {}; widen the listen port range",
                            req.volume
                        ),
                        source: None,
                    });
                };
                let added = nvmf::add_listener(
                    &nqn,
                    &self.address,
                    port,
                    secure_channel,
                    Some(AnaState::Optimized),
                )
                .await;
                match added {
                    Ok(()) => {
                        if let Err(c) = self.ports().commit(&nqn, port, Role::Pipe) {
                            tracing::error!(nqn = %nqn, port, owner = %c.owner, "pipe listener added on a port that was given to another subsystem meanwhile");
                        }
                        return Ok(Some(port));
                    }
                    Err(SpdkError::Errno { .. }) if tried.len() < 8 => {
                        self.ports().abandon(&nqn, port);
                        tried.insert(port);
                    }
                    Err(e) => {
                        self.ports().abandon(&nqn, port);
                        return Err(target_err(e));
                    }
                }
            }
        })
    }

    fn migrator(&self) -> Option<&dyn Migrator> {
        Some(self)
    }

    fn remove_export<'a>(&'a self, req: &'a UnexportRequest) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            let nqn = req
                .target
                .as_ref()
                .map(|t| t.subsys_nqn.clone())
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| naming::subsys_nqn(&req.uuid));
            // The gates the subsystem exported (and the one recorded on the volume, when an
            // earlier unexport stopped after the subsystem) go after it: a gate goes once
            // nobody has it open.
            let mut gates: Vec<String> = nvmf::find_subsystem(&nqn)
                .await
                .map_err(target_err)?
                .map(|s| s.bdevs)
                .unwrap_or_default();
            gates.extend(req.target.as_ref().map(|t| t.bdev_name.clone()));
            gates.retain(|b| b.ends_with(gate::GATE_SUFFIX));
            nvmf::delete_subsystem(&nqn).await.map_err(target_err)?;
            self.ports().free_all(&nqn);
            for g in gates {
                if bdev::get(&g)
                    .await
                    .map_err(target_err)?
                    .is_some_and(|b| b.product == gate::GATE_PRODUCT)
                {
                    gate::delete_gate(&g).await.map_err(target_err)?;
                }
            }
            let aio = naming::aio_bdev_name(&req.uuid);
            if bdev::get(&aio)
                .await
                .map_err(target_err)?
                .is_some_and(|b| b.product == "AIO disk")
            {
                bdev::delete_aio(&aio).await.map_err(target_err)?;
            }
            for k in key_names(&req.uuid) {
                keyring::remove_key(&k).await.map_err(target_err)?;
            }
            Ok(())
        })
    }

    fn resize_export<'a>(&'a self, req: &'a ExportRequest) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            if req.device.is_some() {
                match bdev::rescan_aio(&naming::aio_bdev_name(&req.uuid)).await {
                    Ok(_) => {}
                    // No aio bdev, no export to resize (after a restart the target starts
                    // empty): the next ensure_export opens the file at its new size.
                    Err(SpdkError::NotFound { .. }) => return Ok(()),
                    Err(e) => return Err(target_err(e)),
                }
            }
            // Let the namespace resize (a pause and resume of the subsystem) finish.
            nvmf::settle(&request_nqn(req)).await.map_err(target_err)
        })
    }
}

impl Migrator for SpdkExporter {
    fn connect_pipe<'a>(&'a self, req: &'a PipeRequest) -> ExportFuture<'a, String> {
        Box::pin(async move {
            if self.interrupt_mode {
                return Err(ExportError::InvalidRequest(format!(
                    "this node's SPDK runs in interrupt mode (spdk.interruptMode: true), where SPDK's NVMe/TCP initiator cannot run, so it cannot copy volume {} to {}:{}; a migration source needs spdk.interruptMode: false",
                    req.uuid, req.address, req.port
                )));
            }
            let bdev = naming::nvme_ns_bdev(&req.controller);
            if bdev::get(&bdev).await.map_err(target_err)?.is_some() {
                return Ok(bdev);
            }
            // The keys the source's own export loaded for this volume (one Secret per
            // volume, shared by both ends).
            let keys = if self.auth {
                let [host, ctrl, psk] = key_names(&req.uuid);
                HostKeys {
                    dhchap_key: Some(host),
                    dhchap_ctrlr_key: Some(ctrl),
                    psk: req.tls.then_some(psk),
                }
            } else {
                HostKeys::default()
            };
            // No reconnect: when the destination goes away, mirrored writes must fail at
            // once (the mirror breaks and the source serves on) rather than hold the
            // consumer's writes while the initiator reconnects.
            let names = initiator::attach_tcp_auth(
                &req.controller,
                &req.address,
                req.port,
                &req.subnqn,
                &req.hostnqn,
                None,
                &keys,
            )
            .await
            .map_err(target_err)?;
            names.into_iter().next().ok_or_else(|| ExportError::Target {
                message: format!(
                    "the destination {} at {}:{} has no namespace",
                    req.subnqn, req.address, req.port
                ),
                source: None,
            })
        })
    }

    fn disconnect_pipe<'a>(&'a self, controller: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            match initiator::detach(controller).await {
                Ok(()) | Err(SpdkError::NotFound { .. }) => Ok(()),
                Err(e) => Err(target_err(e)),
            }
        })
    }

    fn start_copy<'a>(&'a self, lvol: &'a str, mirror: &'a str) -> ExportFuture<'a, CopyStatus> {
        Box::pin(async move {
            let g = gate_over(lvol).await?;
            let now = gate::copy_progress(&g).await.map_err(target_err)?;
            if now.mirror_attached {
                return Ok(copy_status(&now));
            }
            // The handle is not kept: the migration reads the progress instead.
            drop(
                gate::start_copy(&g, mirror, gate::CopyOptions::default())
                    .await
                    .map_err(target_err)?,
            );
            let p = gate::copy_progress(&g).await.map_err(target_err)?;
            Ok(copy_status(&p))
        })
    }

    fn copy_status<'a>(&'a self, lvol: &'a str) -> ExportFuture<'a, CopyStatus> {
        Box::pin(async move {
            let g = gate_over(lvol).await?;
            let p = gate::copy_progress(&g).await.map_err(target_err)?;
            Ok(copy_status(&p))
        })
    }

    fn cancel_copy<'a>(&'a self, lvol: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            let Some(g) = gate::gate_of(lvol).await.map_err(target_err)? else {
                return Ok(());
            };
            gate::cancel_copy(&g).await.map_err(target_err).map(drop)
        })
    }

    fn finish_copy<'a>(&'a self, lvol: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            let Some(g) = gate::gate_of(lvol).await.map_err(target_err)? else {
                return Ok(());
            };
            let p = gate::copy_progress(&g).await.map_err(target_err)?;
            if !p.mirror_attached {
                return Ok(());
            }
            gate::finish(&g).await.map_err(target_err).map(drop)
        })
    }

    fn fence<'a>(&'a self, nqn: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move { nvmf::fence_io(nqn).await.map_err(target_err) })
    }

    fn unfence<'a>(&'a self, nqn: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move { nvmf::unfence_io(nqn).await.map_err(target_err) })
    }

    fn set_path_state<'a>(
        &'a self,
        nqn: &'a str,
        address: &'a str,
        port: u16,
        state: PathState,
    ) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            nvmf::set_ana_state(nqn, address, port, ana(state), 1)
                .await
                .map_err(target_err)
        })
    }
}
