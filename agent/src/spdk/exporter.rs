//! The NVMe-oF exporter of the embedded SPDK target: one subsystem per volume with LiteIO's
//! NQN and serial scheme, a listener on the node address with a port from a configured range,
//! and an explicit host allow-list. SPDK volumes are exported through their gate (a
//! pass-through bdev over the lvol, `<lvol bdev>-gate`, where hot migration mirrors and
//! copies; see `liteio_spdk::gate`); LVM and file volumes through an aio bdev named after the
//! volume's serial number.

use std::sync::Mutex;

use liteio_api::{SpdkTarget, naming};

use super::error::SpdkError;
use super::nvmf::{self, AnaState, HostKeys, Multipath, SubsystemSpec, TcpTransportOptions};
use super::{Spdk, bdev, gate, keyring};
use crate::exporter::{
    ExportError, ExportFuture, ExportRequest, Exporter, ExporterHealth, UnexportRequest,
};

/// Exports volumes through the embedded SPDK NVMe-oF/TCP target.
#[derive(Debug)]
pub struct SpdkExporter {
    address: String,
    ports: std::ops::RangeInclusive<u16>,
    transport: TcpTransportOptions,
    /// Serialises port choice (not the creation of subsystems, which run concurrently).
    lock: tokio::sync::Mutex<()>,
    /// Last port handed out, so allocation walks the range round-robin.
    cursor: Mutex<u16>,
    /// Ports chosen for subsystems still being created: SPDK lists a listener only once its
    /// subsystem exists, so these are held here meanwhile.
    reserved: Mutex<std::collections::HashSet<u16>>,
    /// Hosts must authenticate (DH-HMAC-CHAP with the request's keys).
    auth: bool,
}

/// Names of a volume's keys in SPDK's keyring: host key, controller key, TLS PSK.
fn key_names(uuid: &str) -> [String; 3] {
    ["host", "ctrl", "psk"].map(|k| format!("liteio-{uuid}-{k}"))
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
        let start = *ports.start();
        Self {
            address: address.into(),
            ports,
            transport,
            lock: tokio::sync::Mutex::new(()),
            cursor: Mutex::new(start),
            reserved: Mutex::new(std::collections::HashSet::new()),
            auth: false,
        }
    }

    /// Require hosts to authenticate with the keys of each [`ExportRequest`] (`nvmf.auth:
    /// dhchap`, the agent's default); without, the host NQN alone admits a host.
    #[must_use]
    pub fn with_auth(mut self, on: bool) -> Self {
        self.auth = on;
        self
    }

    /// Put the request's keys into SPDK's keyring under the volume's key names (a changed key
    /// replaces the old one) and say how the subsystem's hosts use them.
    async fn load_keys(&self, req: &ExportRequest) -> Result<(HostKeys, bool), ExportError> {
        if !self.auth {
            return Ok((HostKeys::default(), false));
        }
        let Some(k) = &req.keys else {
            return Err(ExportError::InvalidRequest(format!(
                "volume {}: this target requires host authentication and the export request has no keys",
                req.volume
            )));
        };
        let [host, ctrl, psk] = key_names(&req.uuid);
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

    /// Ports of the range that no subsystem listens on, in the order to try them: `preferred`
    /// first when it is free, then round-robin from after the last port handed out.
    async fn free_ports(&self, preferred: Option<u16>) -> Result<Vec<u16>, ExportError> {
        let used = nvmf::listener_ports().await.map_err(target_err)?;
        let start = *self
            .cursor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut order: Vec<u16> = preferred
            .filter(|p| self.ports.contains(p) && !used.contains(p))
            .into_iter()
            .collect();
        let (lo, hi) = (*self.ports.start(), *self.ports.end());
        let after = start.clamp(lo, hi);
        order.extend(
            (after..=hi)
                .chain(lo..after)
                .filter(|p| !used.contains(p) && Some(*p) != preferred),
        );
        if order.is_empty() {
            return Err(ExportError::Target {
                message: format!("every port of {lo}-{hi} is taken; widen the listen port range"),
                source: None,
            });
        }
        Ok(order)
    }

    /// Choose a free port (not listened on, not reserved, not in `tried`) and reserve it;
    /// `None` when the range has none left.
    async fn reserve_port(
        &self,
        preferred: Option<u16>,
        tried: &std::collections::HashSet<u16>,
    ) -> Result<Option<u16>, ExportError> {
        let _g = self.lock.lock().await;
        // Under the lock too: adding the transport is not idempotent while another add runs.
        nvmf::ensure_tcp_transport(&self.transport)
            .await
            .map_err(target_err)?;
        let free = self.free_ports(preferred).await?;
        let mut reserved = self
            .reserved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(port) = free
            .into_iter()
            .find(|p| !reserved.contains(p) && !tried.contains(p))
        else {
            return Ok(None);
        };
        reserved.insert(port);
        *self
            .cursor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = port.saturating_add(1);
        Ok(Some(port))
    }

    /// The subsystem on `port` exists now (SPDK lists its listener) or was not created.
    fn release_port(&self, port: u16) {
        self.reserved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&port);
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

impl Exporter for SpdkExporter {
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
            let preset = req.preset.as_ref().filter(|t| !t.subsys_nqn.is_empty());
            let nqn =
                preset.map_or_else(|| naming::subsys_nqn(&req.uuid), |t| t.subsys_nqn.clone());
            let ns_uuid = preset
                .map(|t| t.ns_uuid.clone())
                .filter(|u| !u.is_empty())
                .unwrap_or_else(|| req.uuid.clone());
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
                // Every export can become one of two paths of a hot migration: ANA reporting
                // must be on, and the controller IDs this node's range, before it starts.
                multipath: Some(Multipath {
                    ana_state: AnaState::Optimized,
                    min_cntlid,
                    max_cntlid,
                }),
            };
            // Already exported (every reconcile of a ready volume comes here): check it and
            // bring its host list up to date, without the creation lock.
            let existing = nvmf::find_subsystem(&nqn).await.map_err(target_err)?;
            if let Some(port) = existing.and_then(|s| s.listeners.first().map(|l| l.1)) {
                let info = nvmf::create_subsystem(spec(port))
                    .await
                    .map_err(target_err)?;
                return Ok(self.target(bdev_name, info, port, ns_uuid));
            }
            // A new subsystem: the port is chosen under the lock and reserved until the
            // subsystem exists, so two volumes never pick the same port; the creations
            // themselves run concurrently (one slow subsystem start must not hold every
            // other export of the node).
            let preferred = preset.and_then(|t| t.svc_id.parse().ok());
            let mut tried = std::collections::HashSet::new();
            let mut last = None;
            loop {
                let Some(port) = self.reserve_port(preferred, &tried).await? else {
                    let (lo, hi) = (*self.ports.start(), *self.ports.end());
                    return Err(last.map_or_else(
                        || ExportError::Target {
                            message: format!(
                                "every port of {lo}-{hi} is taken or being given to another volume; widen the listen port range"
                            ),
                            source: None,
                        },
                        target_err,
                    ));
                };
                let created = nvmf::create_subsystem(spec(port)).await;
                self.release_port(port);
                match created {
                    Ok(info) => return Ok(self.target(bdev_name, info, port, ns_uuid)),
                    // Another program holds the port: try the next one.
                    Err(e @ SpdkError::Errno { op: "listen", .. }) => {
                        tried.insert(port);
                        last = Some(e);
                    }
                    Err(e) => return Err(target_err(e)),
                }
            }
        })
    }

    fn authenticates(&self) -> bool {
        self.auth
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
            let nqn = req
                .preset
                .as_ref()
                .map(|t| t.subsys_nqn.clone())
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| naming::subsys_nqn(&req.uuid));
            nvmf::settle(&nqn).await.map_err(target_err)
        })
    }
}
