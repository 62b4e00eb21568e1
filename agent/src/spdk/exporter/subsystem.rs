//! One subsystem per export: the port map kept in line with SPDK's listeners, the TCP
//! transport, the volume's keys in SPDK's keyring, the subsystem served (made or brought up to
//! date) and its limits; and a volume's export, removal and resize built on them.

use liteio_api::{SpdkTarget, naming};

use super::{SpdkExporter, ana, key_names, nqn_of, request_nqn, serial_of, target_err};
use crate::exporter::{ExportError, ExportRequest, PathState, UnexportRequest};
use crate::spdk::error::SpdkError;
use crate::spdk::nvmf::{self, AnaState, HostKeys, Multipath, SubsystemSpec};
use crate::spdk::ports::{PortMap, Role};
use crate::spdk::{bdev, gate, keyring};

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

impl SpdkExporter {
    /// The port map (its guard is never held across an `.await`).
    pub(super) fn ports(&self) -> std::sync::MutexGuard<'_, PortMap> {
        self.ports
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The host listener's port of subsystem `nqn`, when this exporter created it.
    pub(super) fn known_host_port(&self, nqn: &str) -> Option<u16> {
        self.ports().host(nqn)
    }

    /// The port map's view of subsystem `nqn` brought in line with SPDK's (`listeners`),
    /// when the map does not know `nqn`'s host port or SPDK does not list it (a creation
    /// cancelled after the reactor made the subsystem; a subsystem made outside this
    /// exporter). Its oldest listener on this node's
    /// address becomes its host port (SPDK lists the newest first, and a pipe listener is
    /// always added after the host's), the others its pipes. Returns the host port; `None`
    /// when the subsystem has no listener on the address.
    pub(super) fn settle_ports(&self, nqn: &str, listeners: &[(String, u16)]) -> Option<u16> {
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
    pub(super) async fn ensure_transport(&self) -> Result<(), ExportError> {
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
    pub(super) async fn load_keys_of(
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
    pub(super) async fn serve<F>(
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

    pub(super) fn target(
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

    /// The subsystem `nqn` with `serial` exporting `bdev` as namespace `ns_uuid` on this
    /// node's address, admitting no host yet (the caller adds its hosts and their keys; the
    /// port is [`Self::serve`]'s). Every export can become one of two paths of a hot
    /// migration: ANA reporting (in `ana_state`) must be on, and the controller IDs this
    /// node's range, before it starts.
    pub(super) fn subsystem_spec(
        &self,
        nqn: &str,
        serial: String,
        bdev: &str,
        ns_uuid: &str,
        ana_state: AnaState,
    ) -> SubsystemSpec {
        let (min_cntlid, max_cntlid) = naming::cntlid_range(&self.address);
        SubsystemSpec {
            nqn: nqn.to_string(),
            serial,
            model: ns_uuid.chars().take(40).collect(),
            bdev: bdev.to_string(),
            ns_uuid: ns_uuid.to_string(),
            address: self.address.clone(),
            port: 0,
            hosts: Vec::new(),
            keys: HostKeys::default(),
            keyless_hosts: Vec::new(),
            secure_channel: false,
            multipath: Some(Multipath {
                ana_state,
                min_cntlid,
                max_cntlid,
            }),
        }
    }

    /// `Exporter::ensure_export`: the volume's bdev (its lvol's gate or an aio bdev), its
    /// limits, its subsystem.
    pub(super) async fn export(&self, req: &ExportRequest) -> Result<SpdkTarget, ExportError> {
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
        let serial = serial_of(preset, &req.uuid);
        let base = SubsystemSpec {
            hosts: req.allowed_hosts.clone(),
            keys,
            secure_channel,
            // Only with authentication on: without it every entry is keyless already.
            keyless_hosts: if self.auth {
                req.keyless_hosts.clone()
            } else {
                Vec::new()
            },
            ..self.subsystem_spec(&nqn, serial, &bdev_name, &ns_uuid, ana(req.path_state))
        };
        let spec = |port| SubsystemSpec {
            port,
            ..base.clone()
        };
        let preferred = preset.and_then(|t| t.svc_id.parse().ok());
        let (info, port) = self.serve(&nqn, spec, req.path_state, preferred).await?;
        Ok(self.target(bdev_name, info, port, ns_uuid))
    }

    /// `Exporter::remove_export`: the subsystem, then the gates and the aio bdev it
    /// exported, then the keys.
    pub(super) async fn unexport(&self, req: &UnexportRequest) -> Result<(), ExportError> {
        let nqn = nqn_of(req.target.as_ref(), &req.uuid);
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
    }

    /// `Exporter::resize_export`.
    pub(super) async fn resize(&self, req: &ExportRequest) -> Result<(), ExportError> {
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
    }
}
