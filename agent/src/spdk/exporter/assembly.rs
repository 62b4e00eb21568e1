//! Multi-disk volumes of engine SpdkLVStore: the members (local lvols opened directly, remote
//! ones attached with SPDK's NVMe/TCP initiator), the concat, raid0 or raid1 bdev over them,
//! the replicas' states of a raid1, and one subsystem for it, built like a volume's export.
//! What a failed assembly made is removed again ([`Made`]).

use liteio_api::replica::{ReplicaState, ReplicaStatus};
use liteio_api::{SpdkTarget, naming};

use super::{MEMBER_RECONNECT, SpdkExporter, key_names, nqn_of, serial_of, target_err};
use crate::exporter::{
    AssemblyLevel, AssemblyRequest, ExportError, MemberSource, PathState, UnassembleRequest,
};
use crate::spdk::error::SpdkError;
use crate::spdk::initiator;
use crate::spdk::nvmf::{self, AnaState, HostKeys, SubsystemSpec};
use crate::spdk::raid::{self, RaidLevel, RaidState};
use crate::spdk::{bdev, keyring};

/// What one `Exporter::ensure_assembly` call made, removed again when the call fails.
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

    /// The replicas' states for `Exporter::replicas`.
    pub(super) async fn replica_reports(
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

    /// `Exporter::ensure_assembly`'s work; what it makes is recorded in `made`.
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
        let serial = serial_of(preset, &req.uuid);
        let base = SubsystemSpec {
            hosts: req.allowed_hosts.clone(),
            keys: keys.clone(),
            secure_channel,
            ..self.subsystem_spec(&nqn, serial, &exported, &ns_uuid, AnaState::Optimized)
        };
        let spec = |port| SubsystemSpec {
            port,
            ..base.clone()
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

    /// Removes what a failed `Exporter::ensure_assembly` made, newest first (best effort:
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

    /// `Exporter::ensure_assembly`: what a failed call made is removed again; a made one
    /// is remembered.
    pub(super) async fn assemble_recorded(
        &self,
        req: &AssemblyRequest,
    ) -> Result<SpdkTarget, ExportError> {
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
    }

    /// `Exporter::remove_assembly`: the subsystem, the raid, the members' controllers,
    /// the keys.
    pub(super) async fn unassemble(&self, req: &UnassembleRequest) -> Result<(), ExportError> {
        let nqn = nqn_of(req.target.as_ref(), &req.uuid);
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
    }
}
