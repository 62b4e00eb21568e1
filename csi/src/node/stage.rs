//! NodeStageVolume and NodeUnstageVolume of plain volumes: wait until the volume is ready
//! (and, over NVMe/TCP, exported to this node), decide how this host authenticates to its
//! target ([`NodeService::host_auth`]: keys, none, or a refusal with a Warning event on the
//! volume), attach, format when blank, mount at the staging path; and the reverse.
//! Multi-disk volumes are staged in [`super::group`].

use std::path::PathBuf;

use kube::Resource as _;
use kube::ResourceExt;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use liteio_api::auth::VolumeKeys;
use liteio_api::host_auth::{self, HostAuthDecision, HostAuthPolicy};
use liteio_api::keys::{self, labels, managers};
use liteio_api::{AntstorVolume, VolumeStatus};
use tracing::{info, warn};

use super::auth::stage_keys;
use super::host::{Attach, attach_plan, check_host};
use super::{NodeService, blocking, permanent_failure};
use crate::controller::volume_fs;
use crate::csi::{NodeStageVolumeRequest, NodeUnstageVolumeRequest};
use crate::error::{CsiError, Result};
use crate::k8s::{self, Waited};
use crate::mount;
use crate::nvme;
use crate::params::{self, Access, require};

fn is_clone(v: &AntstorVolume) -> bool {
    v.labels().contains_key(labels::VOLUME_SOURCE_SNAP_NAME)
}

/// Longest event note the API server takes.
const EVENT_NOTE_MAX: usize = 1024;

impl NodeService {
    /// The volume once ready; a permanent failure of it (see
    /// [`AntstorVolume::permanent_failure`]) answers at once.
    pub(super) async fn wait_ready(&self, vol: AntstorVolume) -> Result<AntstorVolume> {
        if vol.phase() == VolumeStatus::Ready {
            return Ok(vol);
        }
        permanent_failure(&vol)?;
        let name = vol.name_any();
        match k8s::wait_for(
            self.volumes(),
            "AntstorVolume",
            &name,
            self.cfg.ready_timeout,
            |v: &AntstorVolume| v.phase() == VolumeStatus::Ready || v.permanent_failure().is_some(),
        )
        .await?
        {
            Waited::Done(v) if v.phase() == VolumeStatus::Ready => Ok(v),
            Waited::Done(v) => {
                permanent_failure(&v)?;
                Ok(v)
            }
            Waited::Gone => Err(CsiError::NotFound(format!("volume {name} was deleted"))),
            Waited::TimedOut => {
                let msg = vol
                    .status
                    .as_ref()
                    .map(|s| s.message.clone())
                    .filter(|m| !m.is_empty())
                    .map(|m| format!(" ({m})"))
                    .unwrap_or_default();
                Err(CsiError::Pending(format!(
                    "volume {name} is not ready after {}s{msg}; retry",
                    self.cfg.ready_timeout.as_secs()
                )))
            }
        }
    }

    pub(super) async fn stage(&self, req: &NodeStageVolumeRequest) -> Result<()> {
        let id = require("volume_id", &req.volume_id)?;
        let staging = PathBuf::from(require("staging_target_path", &req.staging_target_path)?);
        let access = params::require_capability(req.volume_capability.as_ref())?;
        let _g = self.inflight.claim(&format!("volume {id}"))?;
        if crate::group::is_group_id(id) {
            return self.stage_group(req, id, staging, access).await;
        }
        let vol = self.find_volume(id).await?;
        let vol = self.wait_ready(vol).await?;
        check_host(&vol, &self.cfg.node_id)?;
        let plan = attach_plan(&vol, &self.cfg.node_id)?;
        let vol = match &plan {
            Attach::Nvme(_) => self.wait_exported_here(vol).await?,
            Attach::Local(_) => vol,
        };
        let host = self.host.clone();
        let fs = match &access {
            Access::Mount { fs_type, .. } if !fs_type.is_empty() => fs_type.clone(),
            _ => req
                .volume_context
                .get(liteio_api::keys::SC_PARAM_FS_TYPE)
                .filter(|s| !s.is_empty())
                .cloned()
                .unwrap_or_else(|| volume_fs(&vol)),
        };
        let mkfs = req
            .volume_context
            .get(liteio_api::keys::SC_PARAM_MKFS_PARAMS)
            .cloned()
            .unwrap_or_default();
        let keys = match &plan {
            Attach::Nvme(_) => stage_keys(&req.secrets)?,
            Attach::Local(_) => None,
        };
        // The volume's policy and this kernel decide whether the connect carries keys; a
        // kernel that cannot authenticate where it must is told so now, not by a bare EIO.
        let (vol, keys) = match keys {
            Some(k) => self.host_auth(vol, k).await?,
            None => (vol, None),
        };
        let clone = is_clone(&vol);
        let name = vol.name_any();
        blocking(move || {
            let dev = host.attach(&plan, keys.as_ref())?;
            let Access::Mount { flags, .. } = access else {
                info!(volume = %name, device = %dev.display(), "volume staged for block access");
                return Ok(());
            };
            if host.mounted(&staging)?.is_some() {
                return Ok(());
            }
            let opts = mount::mount_options(&flags, &fs, clone, false);
            let used = host.format_and_mount(&dev, &staging, &fs, &mkfs, &opts)?;
            info!(volume = %name, device = %dev.display(), fs = %used, staging = %staging.display(), "volume staged");
            Ok(())
        })
        .await
    }

    /// The volume once its export admits this node: right after its consumer moved here
    /// (ControllerPublishVolume), the storage node's agent may not have changed the export's
    /// host list yet, and a connect then would fail with the kernel's bare EIO. Waits, up to
    /// `ready_timeout`, while [`keys::annotations::EXPORTED_TO`] names another node; a volume
    /// without the annotation (an agent older than it) is not waited for.
    pub(super) async fn wait_exported_here(&self, vol: AntstorVolume) -> Result<AntstorVolume> {
        let node = self.cfg.node_id.clone();
        let exported = |v: &AntstorVolume, node: &str| {
            liteio_api::meta::annotation(&v.metadata, keys::annotations::EXPORTED_TO)
                .is_none_or(|n| n == node)
        };
        if exported(&vol, &node) {
            return Ok(vol);
        }
        let name = vol.name_any();
        let me = node.clone();
        match k8s::wait_for(
            self.volumes(),
            "AntstorVolume",
            &name,
            self.cfg.ready_timeout,
            move |v: &AntstorVolume| exported(v, &me),
        )
        .await?
        {
            Waited::Done(v) => Ok(v),
            Waited::Gone => Err(CsiError::NotFound(format!("volume {name} was deleted"))),
            Waited::TimedOut => Err(CsiError::Pending(format!(
                "volume {name}'s export does not admit node {node} yet after {}s (annotation {} names another node); its storage node's agent changes it when it sees the volume's spec.hostNode; retry",
                self.cfg.ready_timeout.as_secs(),
                keys::annotations::EXPORTED_TO
            ))),
        }
    }

    /// What NodeStageVolume connects with, for a volume whose keys kubelet passed: the
    /// [`host_auth::decide`] of the volume's `spec.hostAuth` and this kernel.
    /// - keys: the keys;
    /// - NQN-only (`preferred` on a kernel without DH-HMAC-CHAP, or `none`): no keys, once the
    ///   volume's `obnvmf/hosts-without-auth` lists this host (the agent's export admits it
    ///   without keys), waited for up to `ready_timeout`;
    /// - refused: FAILED_PRECONDITION naming the kernel, the option it lacks and the
    ///   StorageClass parameter, and a Warning event on the volume.
    pub(super) async fn host_auth(
        &self,
        vol: AntstorVolume,
        keys: VolumeKeys,
    ) -> Result<(AntstorVolume, Option<VolumeKeys>)> {
        let policy = HostAuthPolicy::of(&vol);
        let tls = keys.tls_psk.is_some()
            || liteio_api::meta::annotation(&vol.metadata, keys::annotations::NVMF_TLS)
                == Some("true");
        let name = vol.name_any();
        match host_auth::decide(policy, tls, Some(self.caps.dhchap)) {
            HostAuthDecision::Keys => Ok((vol, Some(keys))),
            HostAuthDecision::Refuse => {
                let why = self.caps.auth_refusal().unwrap_or_else(|| {
                    format!(
                        "this node's kernel {} cannot do what the volume needs",
                        self.caps.kernel
                    )
                });
                let msg = format!(
                    "{}; or export the storage node's volumes without keys (agent config nvmf.auth: none)",
                    host_auth::refusal(&name, policy, tls, &why)
                );
                self.warn_volume(&vol, host_auth::EVENT_HOST_CANNOT_AUTHENTICATE, &msg)
                    .await;
                self.auth_refused("host_cannot_authenticate");
                Err(CsiError::FailedPrecondition(msg))
            }
            HostAuthDecision::NqnOnly => {
                let hostnqn = nvme::host_nqn(&self.cfg.hostnqn_path, &self.cfg.node_id)?;
                if host_auth::hosts_without_auth(&vol).contains(&hostnqn) {
                    info!(volume = %name, policy = %policy, kernel = %self.caps.kernel, dhchap = self.caps.dhchap, "connecting without authentication: the volume's policy admits this host by its NQN alone");
                    return Ok((vol, None));
                }
                // The agent follows this Node's annotation: make sure it is there (a failure
                // at start is retried here), then wait for the export to admit this host.
                self.publish_capabilities().await;
                let nqn = hostnqn.clone();
                let waited = k8s::wait_for(
                    self.volumes(),
                    "AntstorVolume",
                    &name,
                    self.cfg.ready_timeout,
                    move |v: &AntstorVolume| host_auth::hosts_without_auth(v).contains(&nqn),
                )
                .await?;
                match waited {
                    Waited::Done(v) => {
                        info!(volume = %name, policy = %policy, kernel = %self.caps.kernel, dhchap = self.caps.dhchap, "connecting without authentication: the volume's policy admits this host by its NQN alone");
                        Ok((v, None))
                    }
                    Waited::Gone => Err(CsiError::NotFound(format!("volume {name} was deleted"))),
                    Waited::TimedOut => Err(CsiError::Pending(format!(
                        "volume {name} ({}: {policy}) admits host {hostnqn} by its NQN alone because this node's kernel {} cannot authenticate, but its export does not yet (annotation {} on the volume); the storage node's agent changes it when it sees this Node's annotation {}; retry",
                        keys::SC_PARAM_HOST_AUTH,
                        self.caps.kernel,
                        keys::annotations::HOSTS_WITHOUT_AUTH,
                        keys::annotations::NODE_HOST_AUTH,
                    ))),
                }
            }
        }
    }

    /// A Warning event on `vol` (best effort: a failure is logged).
    async fn warn_volume(&self, vol: &AntstorVolume, reason: &str, note: &str) {
        let recorder = Recorder::new(
            self.client.clone(),
            Reporter {
                controller: format!("{}-node", managers::CSI),
                instance: Some(self.cfg.node_id.clone()),
            },
        );
        let mut text = note.to_string();
        if text.len() > EVENT_NOTE_MAX {
            let mut end = EVENT_NOTE_MAX;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
        }
        let ev = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(text),
            action: "NodeStageVolume".into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&ev, &vol.object_ref(&())).await {
            warn!(volume = %vol.name_any(), reason, error = %e, "cannot publish a Warning event");
        }
    }

    pub(super) async fn unstage(&self, req: &NodeUnstageVolumeRequest) -> Result<()> {
        let id = require("volume_id", &req.volume_id)?;
        let staging = PathBuf::from(require("staging_target_path", &req.staging_target_path)?);
        let _g = self.inflight.claim(&format!("volume {id}"))?;
        if crate::group::is_group_id(id) {
            return self.unstage_group(id, staging).await;
        }
        let vol = k8s::volume_by_uuid(&self.volumes(), id).await?;
        let host = self.host.clone();
        let node = self.cfg.node_id.clone();
        let gone = vol.is_none().then(|| liteio_api::naming::subsys_nqn(id));
        let sysfs = self.cfg.sysfs_root.clone();
        blocking(move || {
            // The volume is gone (deleted on the storage side): its target will not come
            // back, and the kernel would hold the unmount's writes until ctrl-loss-tmo.
            // Delete its controllers first: the held I/O fails, the unmount goes through.
            if let Some(nqn) = gone {
                let deleted = nvme::delete_controllers(&sysfs, &nqn)?;
                if !deleted.is_empty() {
                    info!(nqn = %nqn, controllers = ?deleted, "the volume is gone: deleted its NVMe controllers before unmounting");
                }
            }
            let unmounted = host.unmount(&staging)?;
            let plan = match vol.as_ref().map(|v| attach_plan(v, &node)) {
                Some(Ok(p)) => Some(p),
                _ => None,
            };
            match plan {
                Some(p) => host.detach(&p)?,
                None => {
                    // The volume object is gone: a loop device can still be found from the mount.
                    if let Some(m) = unmounted.filter(|m| m.source.starts_with("/dev/loop")) {
                        host.detach_loop(&m.source, None)?;
                    }
                }
            }
            info!(staging = %staging.display(), "volume unstaged");
            Ok(())
        })
        .await
    }
}
