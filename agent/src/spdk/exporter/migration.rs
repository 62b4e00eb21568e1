//! The exporter's part of a hot migration: on the source, the pipe to the destination
//! (SPDK's NVMe/TCP initiator), the copy on the volume's gate, the fence and the ANA state
//! ([`Migrator`]); on the destination, the pipe listener of the volume's subsystem.

use liteio_api::naming;

use super::{SpdkExporter, ana, key_names, request_nqn, target_err};
use crate::exporter::{
    CopyPhase, CopyStatus, ExportError, ExportFuture, ExportRequest, Migrator, PathState,
    PipeRequest,
};
use crate::spdk::error::SpdkError;
use crate::spdk::nvmf::{self, AnaState, HostKeys};
use crate::spdk::ports::Role;
use crate::spdk::{bdev, gate, initiator};

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

impl SpdkExporter {
    /// `Exporter::ensure_pipe`: the pipe listener of a migration destination, added or
    /// removed.
    pub(super) async fn pipe_listener(
        &self,
        req: &ExportRequest,
        want: bool,
    ) -> Result<Option<u16>, ExportError> {
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
