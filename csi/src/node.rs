//! The CSI Node service: attach (NVMe/TCP or a local device), format, mount, publish and the
//! reverse, expansion and statistics.
//!
//! How a volume is attached on this node:
//! - **local**: the volume is scheduled to this node (`spec.targetNodeId`) and has
//!   `spec.kernelLvol.devPath`. A block device (an LVM LV) is used as is; a regular file (a
//!   file-engine volume, `<pool>/volumes/<name>.img`) gets a loop device
//!   (`losetup --find --show`, reused when `losetup -j` shows one).
//! - **NVMe/TCP**: otherwise, when the agent exported it (`spec.spdkTarget`): `nvme connect`
//!   as this node's host NQN, then the namespace is found by serial number in sysfs. When
//!   kubelet passes the volume's Secret (`NodeStageVolumeRequest.secrets`, from the
//!   StorageClass's `csi.storage.k8s.io/node-stage-secret-*` parameters), the connection uses
//!   DH-HMAC-CHAP in both directions and is made through `/dev/nvme-fabrics`, so that no
//!   secret is ever on a command line (see [`crate::nvme`]). Keys rotated later reach the
//!   connected controller at NodePublishVolume: the CSIDriver's `requiresRepublish` makes
//!   kubelet call it about every minute with the current node-publish Secret, and changed
//!   keys are written to the controller's sysfs attributes ([`Host::refresh_keys`]).
//!
//! Blocking work (commands, sysfs polling) runs on tokio's blocking pool.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::Resource as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, ResourceExt};
use liteio_api::auth::VolumeKeys;
use liteio_api::host_auth::{self, HostAuthCapability, HostAuthDecision, HostAuthPolicy};
use liteio_api::keys::{self, labels, managers};
use liteio_api::{AntstorVolume, CsiNodePubParams, SpdkTarget, VolumeStatus, naming};
use serde_json::json;
use tonic::{Request, Response, Status};
use tracing::{info, instrument, warn};

use crate::cmd::{self, CommandRunner, argv};
use crate::config::DriverConfig;
use crate::controller::{hostname_topology, volume_fs};
use crate::csi::node_server::Node;
use crate::csi::node_service_capability::rpc::Type as RpcType;
use crate::csi::*;
use crate::error::{CsiError, Result};
use crate::k8s::{self, Inflight, Waited};
use crate::metrics::VolumeMetrics;
use crate::mount::{self, MountEntry};
use crate::nvme;
use crate::params::{self, Access};

pub mod group;

/// Capabilities the node advertises.
pub const NODE_CAPABILITIES: [RpcType; 4] = [
    RpcType::StageUnstageVolume,
    RpcType::ExpandVolume,
    RpcType::GetVolumeStats,
    RpcType::VolumeCondition,
];

/// How this node reaches a volume's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attach {
    /// A local block device or a file to loop-attach.
    Local(PathBuf),
    /// An NVMe-oF export to connect to.
    Nvme(SpdkTarget),
}

/// Decides how `node` reaches `vol`.
pub fn attach_plan(vol: &AntstorVolume, node: &str) -> Result<Attach> {
    let local_path = vol
        .spec
        .kernel_lvol
        .as_ref()
        .map(|l| l.dev_path.trim())
        .filter(|p| !p.is_empty());
    if let Some(p) = local_path
        && vol.spec.target_node_id == node
    {
        return Ok(Attach::Local(PathBuf::from(p)));
    }
    if let Some(t) = vol.spec.spdk_target.as_ref() {
        return Ok(Attach::Nvme(t.clone()));
    }
    Err(CsiError::FailedPrecondition(format!(
        "volume {} lives on node {:?} and has no NVMe-oF export (spec.spdkTarget) for node {node}",
        vol.name_any(),
        vol.spec.target_node_id
    )))
}

/// Whether `node` may stage `vol`: a volume reached over NVMe/TCP is exported to the host
/// NQN of its host node (`spec.hostNode`) only, and another node's connect would fail with
/// the kernel's bare EIO ("Connect Invalid Host"): FAILED_PRECONDITION naming both nodes.
pub fn check_host(vol: &AntstorVolume, node: &str) -> Result<()> {
    match vol.spec.host_node.as_ref().filter(|h| !h.id.is_empty()) {
        Some(host) if host.id != node && matches!(attach_plan(vol, node)?, Attach::Nvme(_)) => {
            Err(CsiError::FailedPrecondition(format!(
                "volume {} is exported to node {} (spec.hostNode), not to this node {node}: its NVMe-oF target admits only that node's host NQN",
                vol.name_any(),
                host.id
            )))
        }
        _ => Ok(()),
    }
}

/// The keys kubelet passed in `NodeStageVolumeRequest.secrets`: `None` when it passed none
/// (the StorageClass names no node-stage Secret). Errors name the Secret data key and never
/// contain its value.
pub fn stage_keys(secrets: &HashMap<String, String>) -> Result<Option<VolumeKeys>> {
    request_keys(secrets, "node-stage")
}

/// The keys kubelet passed in `NodePublishVolumeRequest.secrets` (also at each periodic
/// republish): `None` when it passed none (the StorageClass names no node-publish Secret).
/// Errors name the Secret data key and never contain its value.
pub fn publish_keys(secrets: &HashMap<String, String>) -> Result<Option<VolumeKeys>> {
    request_keys(secrets, "node-publish")
}

pub(crate) fn request_keys(
    secrets: &HashMap<String, String>,
    which: &str,
) -> Result<Option<VolumeKeys>> {
    if secrets.is_empty() {
        return Ok(None);
    }
    VolumeKeys::from_string_map(secrets)
        .map(Some)
        .map_err(|e| CsiError::invalid("secrets", format!("{e} (in the {which} Secret)")))
}

/// What [`Host::refresh_keys`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRefresh {
    /// The volume has no NVMe/TCP controller on this node (a local device, or not connected).
    NotConnected,
    /// The controller holds these keys already: nothing was written.
    Unchanged {
        /// Controller name (`nvme3`).
        controller: String,
    },
    /// New keys were written; the kernel re-authenticates the controller with them.
    Written {
        /// Controller name (`nvme3`).
        controller: String,
        /// The sysfs attributes written ([`nvme::ATTR_DHCHAP_SECRET`], …).
        attributes: Vec<&'static str>,
    },
}

/// Logs the outcome of a key refresh of `volume` at NodePublishVolume. A failure is a
/// warning, not a failed publish: the volume stays usable over its current connection, and
/// kubelet's next republish tries again. Nothing logged holds a secret: errors name Secret
/// data keys and sysfs attributes only.
pub fn report_key_refresh(volume: &str, outcome: &Result<KeyRefresh>) {
    match outcome {
        Ok(KeyRefresh::NotConnected | KeyRefresh::Unchanged { .. }) => {}
        Ok(KeyRefresh::Written {
            controller,
            attributes,
        }) => {
            info!(volume, controller = %controller, attributes = %attributes.join(","), "gave the volume's current DH-HMAC-CHAP keys to its NVMe controller; the kernel re-authenticates with them");
        }
        Err(e) => {
            warn!(volume, kind = e.kind().as_str(), error = %e.chain(), "cannot give the volume's current DH-HMAC-CHAP keys to its NVMe controller; it keeps working with its old keys until a reconnect, and the next republish tries again");
        }
    }
}

/// Blocking host operations; cloned into `spawn_blocking`.
#[derive(Debug, Clone)]
pub struct Host {
    cfg: Arc<DriverConfig>,
    runner: Arc<dyn CommandRunner>,
    fabrics: Arc<dyn nvme::Fabrics>,
    /// This host's LVM version (`lvm version`), asked once, when a multi-disk volume's
    /// volume group is first made.
    lvm_version: Arc<std::sync::OnceLock<Option<crate::lvm::Version>>>,
}

fn is_file(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file())
}

impl Host {
    /// Host operations with `runner`.
    /// Authenticated connections go through the fabrics device `cfg.fabrics_dev`.
    pub fn new(cfg: Arc<DriverConfig>, runner: Arc<dyn CommandRunner>) -> Self {
        let fabrics = Arc::new(nvme::FabricsDevice::new(cfg.fabrics_dev.clone()));
        Host {
            cfg,
            runner,
            fabrics,
            lvm_version: Arc::default(),
        }
    }

    /// The same host, with authenticated connections made through `fabrics` (tests).
    pub fn with_fabrics(mut self, fabrics: Arc<dyn nvme::Fabrics>) -> Self {
        self.fabrics = fabrics;
        self
    }

    fn mounts(&self) -> Result<Vec<MountEntry>> {
        mount::read_mounts(&self.cfg.mountinfo_path)
    }

    /// The mount at `target`, if any.
    pub fn mounted(&self, target: &Path) -> Result<Option<MountEntry>> {
        Ok(mount::mount_at(&self.mounts()?, target))
    }

    /// The block device of an attached volume, without attaching it.
    pub fn find_device(&self, plan: &Attach) -> Result<Option<PathBuf>> {
        match plan {
            Attach::Local(p) if is_file(p) => Ok(mount::loops_for(self.runner.as_ref(), p)?
                .into_iter()
                .next()),
            Attach::Local(p) => Ok(p.exists().then(|| p.clone())),
            Attach::Nvme(t) => Ok(nvme::find_by_serial(&self.cfg.sysfs_root, &t.sn)
                .and_then(|f| f.namespace)
                .map(|n| nvme::dev_path(&n))),
        }
    }

    /// Attaches the volume and returns its block device. An NVMe/TCP connection
    /// authenticates with `keys` when given (see [`nvme::connect_with_keys`]).
    pub fn attach(&self, plan: &Attach, keys: Option<&VolumeKeys>) -> Result<PathBuf> {
        match plan {
            Attach::Local(p) if is_file(p) => mount::attach_loop(self.runner.as_ref(), p),
            Attach::Local(p) => {
                if p.exists() {
                    Ok(p.clone())
                } else {
                    Err(CsiError::FailedPrecondition(format!(
                        "spec.kernelLvol.devPath: {} does not exist on this node",
                        p.display()
                    )))
                }
            }
            Attach::Nvme(t) => {
                if t.sn.is_empty() {
                    return Err(CsiError::FailedPrecondition(
                        "spec.spdkTarget.sn: is empty; the export is incomplete".into(),
                    ));
                }
                if let Some(ns) =
                    nvme::find_by_serial(&self.cfg.sysfs_root, &t.sn).and_then(|f| f.namespace)
                {
                    return Ok(nvme::dev_path(&ns));
                }
                let hostnqn = nvme::host_nqn(&self.cfg.hostnqn_path, &self.cfg.node_id)?;
                let connected = nvme::find_by_serial(&self.cfg.sysfs_root, &t.sn).is_some();
                if !connected {
                    match keys {
                        Some(keys) => {
                            let host_id = nvme::host_id(&self.cfg.hostid_path);
                            let ctrl = nvme::connect_with_keys(
                                self.fabrics.as_ref(),
                                t,
                                &hostnqn,
                                host_id.as_deref(),
                                keys,
                            )
                            .map_err(|e| nvme::connect_failure(t, e))?;
                            info!(nqn = %t.subsys_nqn, address = %t.address, svc_id = %t.svc_id, controller = %ctrl, "connected NVMe/TCP target with DH-HMAC-CHAP");
                        }
                        None => {
                            cmd::run_ok(self.runner.as_ref(), &nvme::connect_argv(t, &hostnqn)?)
                                .map_err(|e| match nvme::connect_failure(t, e) {
                                    // Refused for another reason: perhaps keys are needed.
                                    CsiError::Command {
                                        command,
                                        status,
                                        stderr,
                                    } => CsiError::Command {
                                        command,
                                        status,
                                        stderr: format!("{stderr}; {}", nvme::no_secrets_hint()),
                                    },
                                    e => e,
                                })?;
                            info!(nqn = %t.subsys_nqn, address = %t.address, svc_id = %t.svc_id, "connected NVMe/TCP target");
                        }
                    }
                }
                nvme::wait_for_namespace(&self.cfg.sysfs_root, &t.sn, self.cfg.device_timeout)
                    .map(|n| nvme::dev_path(&n))
                    .ok_or_else(|| {
                        CsiError::Pending(format!(
                            "no NVMe namespace with serial {} appeared within {}s after connecting {}",
                            t.sn,
                            self.cfg.device_timeout.as_secs(),
                            t.subsys_nqn
                        ))
                    })
            }
        }
    }

    /// Gives `keys` to the NVMe/TCP controller of a connected volume (see
    /// [`nvme::refresh_keys`]): at each NodePublishVolume, including kubelet's periodic
    /// republish, so that keys rotated since NodeStageVolume are used at the next reconnect.
    /// Cheap and idempotent: nothing is written when the controller holds these keys.
    /// Local volumes and volumes without a controller on this node: nothing to do.
    pub fn refresh_keys(&self, plan: &Attach, keys: &VolumeKeys) -> Result<KeyRefresh> {
        let Attach::Nvme(t) = plan else {
            return Ok(KeyRefresh::NotConnected);
        };
        if t.sn.is_empty() {
            return Ok(KeyRefresh::NotConnected);
        }
        let Some(found) = nvme::find_by_serial(&self.cfg.sysfs_root, &t.sn) else {
            return Ok(KeyRefresh::NotConnected);
        };
        let attributes = nvme::refresh_keys(&self.cfg.sysfs_root, &found.controller, keys)?;
        Ok(if attributes.is_empty() {
            KeyRefresh::Unchanged {
                controller: found.controller,
            }
        } else {
            KeyRefresh::Written {
                controller: found.controller,
                attributes,
            }
        })
    }

    /// `losetup -d dev`, then waits until the kernel has let it go: a device still open
    /// somewhere (a scan by another process, a lazy unmount) is only marked for autoclear.
    /// Still attached after 10 s: an error, so that the caller's retry detaches it later.
    fn detach_loop(&self, dev: &str, file: Option<&Path>) -> Result<()> {
        cmd::run_ok(self.runner.as_ref(), &argv(&["losetup", "-d", dev]))?;
        let Some(file) = file else {
            info!(device = %dev, "loop device detached");
            return Ok(());
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while mount::loops_for(self.runner.as_ref(), file)?
            .iter()
            .any(|d| d.as_os_str() == dev)
        {
            if std::time::Instant::now() > deadline {
                return Err(CsiError::Pending(format!(
                    "loop device {dev} of {} is still in use 10 s after losetup -d; retry",
                    file.display()
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        info!(device = %dev, "loop device detached");
        Ok(())
    }

    /// Detaches the volume: `losetup -d` for a loop-attached file, `nvme disconnect` for an
    /// export. Idempotent.
    pub fn detach(&self, plan: &Attach) -> Result<()> {
        match plan {
            Attach::Local(p) if is_file(p) => {
                for dev in mount::loops_for(self.runner.as_ref(), p)? {
                    self.detach_loop(&dev.display().to_string(), Some(p))?;
                }
                Ok(())
            }
            Attach::Local(_) => Ok(()),
            Attach::Nvme(t) => {
                if nvme::find_by_serial(&self.cfg.sysfs_root, &t.sn).is_none() {
                    return Ok(());
                }
                cmd::run_ok(self.runner.as_ref(), &nvme::disconnect_argv(&t.subsys_nqn))?;
                info!(nqn = %t.subsys_nqn, "disconnected NVMe/TCP target");
                Ok(())
            }
        }
    }

    /// Formats `dev` when it has no filesystem and mounts it at `staging`. Returns the
    /// filesystem mounted.
    pub fn format_and_mount(
        &self,
        dev: &Path,
        staging: &Path,
        fs: &str,
        mkfs_params: &str,
        options: &[String],
    ) -> Result<String> {
        std::fs::create_dir_all(staging).map_err(|e| {
            CsiError::io(
                format!("create staging_target_path {}", staging.display()),
                e,
            )
        })?;
        let existing = mount::probe_fs(self.runner.as_ref(), dev)?;
        let fs_used = match existing {
            Some(found) => {
                if found != fs {
                    warn!(device = %dev.display(), found = %found, wanted = fs, "device already has another filesystem; mounting it as is");
                }
                found
            }
            None => {
                cmd::run_ok(
                    self.runner.as_ref(),
                    &mount::mkfs_argv(fs, dev, mkfs_params)?,
                )?;
                info!(device = %dev.display(), fs, "filesystem created");
                fs.to_string()
            }
        };
        let mut opts = options.to_vec();
        if fs_used != "xfs" {
            opts.retain(|o| o != "nouuid");
        }
        cmd::run_ok(
            self.runner.as_ref(),
            &mount::mount_argv(dev, staging, &fs_used, &opts),
        )?;
        Ok(fs_used)
    }

    /// Unmounts `target` when mounted (every stacked mount). Idempotent.
    pub fn unmount(&self, target: &Path) -> Result<Option<MountEntry>> {
        let mut first = None;
        while let Some(m) = self.mounted(target)? {
            cmd::run_ok(self.runner.as_ref(), &mount::umount_argv(target))?;
            first.get_or_insert(m);
        }
        Ok(first)
    }
}

/// NodePublishVolume's host part: bind-mounts the staging mount (a file system) or the
/// device `device` finds (raw block, onto a file) at `target`, read-only when asked.
/// Nothing to do when `target` is mounted already.
fn publish_bind(
    host: &Host,
    access: Access,
    staging: &Path,
    t: &Path,
    readonly: bool,
    device: impl FnOnce(&Host) -> Result<Option<PathBuf>>,
) -> Result<()> {
    if host.mounted(t)?.is_some() {
        return Ok(());
    }
    let source = match access {
        Access::Block => {
            let dev = device(host)?.ok_or_else(|| {
                CsiError::FailedPrecondition(format!(
                    "staging_target_path: volume is not staged at {} (no device on this node)",
                    staging.display()
                ))
            })?;
            if let Some(dir) = t.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| CsiError::io(format!("create {}", dir.display()), e))?;
            }
            if !t.exists() {
                std::fs::File::create(t)
                    .map_err(|e| CsiError::io(format!("create target_path {}", t.display()), e))?;
            }
            dev
        }
        Access::Mount { .. } => {
            if host.mounted(staging)?.is_none() {
                return Err(CsiError::FailedPrecondition(format!(
                    "staging_target_path: {} is not staged (nothing is mounted there)",
                    staging.display()
                )));
            }
            std::fs::create_dir_all(t)
                .map_err(|e| CsiError::io(format!("create target_path {}", t.display()), e))?;
            staging.to_path_buf()
        }
    };
    cmd::run_ok(host.runner.as_ref(), &mount::bind_argv(&source, t))?;
    if readonly {
        cmd::run_ok(host.runner.as_ref(), &mount::remount_ro_argv(t))?;
    }
    Ok(())
}

/// The Node service.
#[derive(Clone)]
pub struct NodeService {
    client: Client,
    cfg: Arc<DriverConfig>,
    /// What this host's kernel can do for NVMe-oF connections (found once, at start).
    caps: nvme::HostCapabilities,
    host: Host,
    inflight: Inflight,
    metrics: Option<Arc<VolumeMetrics>>,
}

fn require<'a>(field: &str, v: &'a str) -> Result<&'a str> {
    if v.trim().is_empty() {
        Err(CsiError::invalid(field, "is required"))
    } else {
        Ok(v)
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CsiError::Internal(format!("blocking task failed: {e}")))?
}

fn fail(op: &str, e: CsiError) -> Status {
    warn!(op, kind = e.kind().as_str(), error = %e.chain(), "CSI call failed");
    e.into()
}

fn is_clone(v: &AntstorVolume) -> bool {
    v.labels().contains_key(labels::VOLUME_SOURCE_SNAP_NAME)
}

/// statvfs of `path` as CSI usage.
pub fn usage(path: &Path) -> std::io::Result<Vec<VolumeUsage>> {
    let s = rustix::fs::statvfs(path).map_err(std::io::Error::from)?;
    let frsize = s.f_frsize.max(1);
    let b = |n: u64| i64::try_from(n.saturating_mul(frsize)).unwrap_or(i64::MAX);
    let n = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    Ok(vec![
        VolumeUsage {
            available: b(s.f_bavail),
            total: b(s.f_blocks),
            used: b(s.f_blocks.saturating_sub(s.f_bfree)),
            unit: volume_usage::Unit::Bytes as i32,
        },
        VolumeUsage {
            available: n(s.f_ffree),
            total: n(s.f_files),
            used: n(s.f_files.saturating_sub(s.f_ffree)),
            unit: volume_usage::Unit::Inodes as i32,
        },
    ])
}

/// Longest event note the API server takes.
const EVENT_NOTE_MAX: usize = 1024;

/// What `caps` says, in the api crate's terms.
pub fn capability(caps: &nvme::HostCapabilities) -> HostAuthCapability {
    HostAuthCapability {
        dhchap: caps.dhchap,
        tls: caps.tls,
        kernel: caps.kernel.clone(),
    }
}

/// Writes `caps` onto Node `node`'s annotations unless they say so already; `true` when it
/// wrote.
pub async fn publish_capabilities(
    client: &Client,
    node: &str,
    caps: &nvme::HostCapabilities,
) -> Result<bool> {
    let nodes: Api<KubeNode> = Api::all(client.clone());
    let current = nodes
        .get(node)
        .await
        .map_err(|e| CsiError::kube(format!("get Node {node}"), e))?;
    let want = capability(caps);
    let have = HostAuthCapability::from_annotations(current.metadata.annotations.as_ref());
    if have.as_ref() == Some(&want) {
        return Ok(false);
    }
    let body = json!({"metadata": {"annotations": {
        keys::annotations::NODE_HOST_AUTH: want.annotation(),
        keys::annotations::NODE_KERNEL_RELEASE: want.kernel,
    }}});
    let pp = PatchParams {
        field_manager: Some(managers::CSI.to_string()),
        ..PatchParams::default()
    };
    nodes
        .patch(node, &pp, &Patch::Merge(&body))
        .await
        .map_err(|e| CsiError::kube(format!("annotate Node {node}"), e))?;
    Ok(true)
}

impl NodeService {
    /// A node service for `cfg.node_id`.
    pub fn new(
        client: Client,
        cfg: Arc<DriverConfig>,
        runner: Arc<dyn CommandRunner>,
        metrics: Option<Arc<VolumeMetrics>>,
    ) -> Self {
        let caps = cfg
            .host_capabilities
            .clone()
            .unwrap_or_else(nvme::this_host_capabilities);
        info!(kernel = %caps.kernel, dhchap = caps.dhchap, tls = caps.tls, evidence = %caps.dhchap_evidence, "NVMe-oF host capabilities");
        NodeService {
            client,
            caps,
            host: Host::new(Arc::clone(&cfg), runner),
            cfg,
            inflight: Inflight::default(),
            metrics,
        }
    }

    fn volumes(&self) -> Api<AntstorVolume> {
        Api::namespaced(self.client.clone(), &self.cfg.namespace)
    }

    /// Counts a stage refused for want of authentication (when metrics are served).
    fn auth_refused(&self, reason: &'static str) {
        if let Some(m) = &self.metrics {
            m.auth_refused(reason);
        }
    }

    async fn find_volume(&self, id: &str) -> Result<AntstorVolume> {
        k8s::volume_by_uuid(&self.volumes(), id)
            .await?
            .ok_or_else(|| CsiError::NotFound(format!("volume {id} does not exist")))
    }

    /// The volume once ready; a permanent failure of it (see
    /// [`AntstorVolume::permanent_failure`]) answers at once.
    async fn wait_ready(&self, vol: AntstorVolume) -> Result<AntstorVolume> {
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

    async fn stage(&self, req: &NodeStageVolumeRequest) -> Result<()> {
        let id = require("volume_id", &req.volume_id)?;
        let staging = PathBuf::from(require("staging_target_path", &req.staging_target_path)?);
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| CsiError::invalid("volume_capability", "is required"))?;
        let access = params::check_capability("volume_capability", cap)?;
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
    async fn wait_exported_here(&self, vol: AntstorVolume) -> Result<AntstorVolume> {
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
    async fn host_auth(
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

    /// Writes what this kernel can do onto this node's Node object
    /// (`liteio.io/nvme-host-auth`, `liteio.io/kernel-release`), where the disk-agents read
    /// it to decide which hosts a `preferred` volume admits without keys. Idempotent (nothing
    /// is written when the annotations say so already); a failure is logged, not fatal: a
    /// host that needs the annotation tries again at NodeStageVolume.
    pub async fn publish_capabilities(&self) {
        let node = &self.cfg.node_id;
        match publish_capabilities(&self.client, node, &self.caps).await {
            Ok(true) => {
                info!(node = %node, host_auth = %capability(&self.caps).annotation(), kernel = %self.caps.kernel, "published this kernel's NVMe/TCP authentication support on the Node")
            }
            Ok(false) => {}
            Err(e) => {
                warn!(node = %node, error = %e.chain(), "cannot publish this kernel's NVMe/TCP authentication support on the Node; volumes with liteio.io/host-auth: preferred keep their keys for this host until it is published")
            }
        }
    }

    async fn unstage(&self, req: &NodeUnstageVolumeRequest) -> Result<()> {
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

    async fn record_publish(&self, vol: &AntstorVolume, req: &NodePublishVolumeRequest) {
        if req
            .volume_context
            .get(params::CTX_SKIP_SAVE)
            .map(String::as_str)
            == Some("true")
        {
            return;
        }
        let ctx: BTreeMap<String, String> = req
            .volume_context
            .iter()
            .filter(|(k, _)| k.starts_with("csi.storage.k8s.io/pod."))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let params = CsiNodePubParams {
            staging_target_path: req.staging_target_path.clone(),
            target_path: req.target_path.clone(),
            volume_context: ctx,
        };
        let body = json!({"status": {"csiNodePubParams": params}});
        let pp = PatchParams {
            field_manager: Some(managers::CSI.to_string()),
            ..PatchParams::default()
        };
        if let Err(e) = self
            .volumes()
            .patch_status(&vol.name_any(), &pp, &Patch::Merge(&body))
            .await
        {
            warn!(volume = %vol.name_any(), error = %e, "cannot record the publish parameters on the volume");
        }
    }

    /// Gives the keys of the node-publish Secret to the volume's NVMe/TCP controller when
    /// they changed (a rotation since NodeStageVolume). Never fails the publish: a failure
    /// is logged as a warning and retried at kubelet's next republish, because the volume is
    /// mounted and working and a failed NodePublishVolume would report the pod's volume as
    /// failing for a problem that only matters at the next reconnect.
    async fn refresh_keys(
        &self,
        vol: &AntstorVolume,
        plan: &Attach,
        req: &NodePublishVolumeRequest,
    ) {
        if !matches!(plan, Attach::Nvme(_)) || req.secrets.is_empty() {
            return;
        }
        let name = vol.name_any();
        let keys = match publish_keys(&req.secrets) {
            Ok(Some(keys)) => keys,
            Ok(None) => return,
            Err(e) => {
                report_key_refresh(&name, &Err(e));
                return;
            }
        };
        let host = self.host.clone();
        let plan = plan.clone();
        let outcome = blocking(move || host.refresh_keys(&plan, &keys)).await;
        report_key_refresh(&name, &outcome);
    }

    async fn publish(&self, req: &NodePublishVolumeRequest) -> Result<()> {
        let id = require("volume_id", &req.volume_id)?;
        let target = PathBuf::from(require("target_path", &req.target_path)?);
        let staging = PathBuf::from(require("staging_target_path", &req.staging_target_path)?);
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| CsiError::invalid("volume_capability", "is required"))?;
        let access = params::check_capability("volume_capability", cap)?;
        let _g = self.inflight.claim(&format!("volume {id}"))?;
        if crate::group::is_group_id(id) {
            return self.publish_group(req, id, target, staging, access).await;
        }
        let vol = self.find_volume(id).await?;
        let plan = attach_plan(&vol, &self.cfg.node_id)?;
        self.refresh_keys(&vol, &plan, req).await;
        let host = self.host.clone();
        let readonly = req.readonly;
        let t = target.clone();
        blocking(move || {
            publish_bind(&host, access, &staging, &t, readonly, |h: &Host| {
                h.find_device(&plan)
            })
        })
        .await?;
        info!(volume = %vol.name_any(), target = %target.display(), readonly, "volume published");
        self.record_publish(&vol, req).await;
        if let Some(m) = &self.metrics {
            m.register(id, &vol, &target);
        }
        Ok(())
    }

    async fn unpublish(&self, req: &NodeUnpublishVolumeRequest) -> Result<()> {
        let id = require("volume_id", &req.volume_id)?;
        let target = PathBuf::from(require("target_path", &req.target_path)?);
        let _g = self.inflight.claim(&format!("volume {id}"))?;
        let host = self.host.clone();
        let t = target.clone();
        blocking(move || {
            host.unmount(&t)?;
            match std::fs::symlink_metadata(&t) {
                Ok(m) if m.is_dir() => std::fs::remove_dir(&t),
                Ok(_) => std::fs::remove_file(&t),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
            }
            .map_err(|e| CsiError::io(format!("remove target_path {}", t.display()), e))
        })
        .await?;
        if let Some(m) = &self.metrics {
            m.unregister(&target);
        }
        info!(volume = id, target = %target.display(), "volume unpublished");
        Ok(())
    }

    async fn stats(&self, req: &NodeGetVolumeStatsRequest) -> Result<NodeGetVolumeStatsResponse> {
        require("volume_id", &req.volume_id)?;
        let path = PathBuf::from(require("volume_path", &req.volume_path)?);
        let host = self.host.clone();
        let metrics = self.metrics.clone();
        let id = req.volume_id.clone();
        blocking(move || {
            let meta = std::fs::metadata(&path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    CsiError::NotFound(format!("volume_path: {} does not exist", path.display()))
                } else {
                    CsiError::io(format!("stat volume_path {}", path.display()), e)
                }
            })?;
            let abnormal = |message: String| NodeGetVolumeStatsResponse {
                usage: Vec::new(),
                volume_condition: Some(VolumeCondition {
                    abnormal: true,
                    message,
                }),
            };
            let Some(m) = host.mounted(&path)? else {
                return Ok(abnormal(format!("{} is not mounted", path.display())));
            };
            if m.source.starts_with("/dev/") && !Path::new(&m.source).exists() {
                return Ok(abnormal(format!("device {} is gone", m.source)));
            }
            if !meta.is_dir() {
                // Raw block: the bind-mounted device file.
                let total = mount::device_size(&path)
                    .map(|b| i64::try_from(b).unwrap_or(i64::MAX))
                    .map_err(|e| CsiError::Internal(e.chain()));
                return Ok(match total {
                    Ok(total) => NodeGetVolumeStatsResponse {
                        usage: vec![VolumeUsage {
                            available: 0,
                            total,
                            used: 0,
                            unit: volume_usage::Unit::Bytes as i32,
                        }],
                        volume_condition: Some(VolumeCondition {
                            abnormal: false,
                            message: "block device present".into(),
                        }),
                    },
                    Err(e) => abnormal(format!("cannot read the block device: {e}")),
                });
            }
            match usage(&path) {
                Ok(u) => {
                    if let Some(mx) = &metrics {
                        mx.observe(&id, &u);
                    }
                    Ok(NodeGetVolumeStatsResponse {
                        usage: u,
                        volume_condition: Some(VolumeCondition {
                            abnormal: false,
                            message: "mounted".into(),
                        }),
                    })
                }
                Err(e) => Ok(abnormal(format!("statvfs {} failed: {e}", path.display()))),
            }
        })
        .await
    }

    async fn expand(&self, req: &NodeExpandVolumeRequest) -> Result<NodeExpandVolumeResponse> {
        let id = require("volume_id", &req.volume_id)?;
        let path = PathBuf::from(require("volume_path", &req.volume_path)?);
        if crate::group::is_group_id(id) {
            let size = self.expand_group(req, id).await?;
            return Ok(NodeExpandVolumeResponse {
                capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
            });
        }
        let mut vol = self.find_volume(id).await?;
        if growing(&vol) {
            // The storage node removes the label once the LV/file has grown; wait for it,
            // bounded like NodeStageVolume's wait for readiness.
            let name = vol.name_any();
            permanent_failure(&vol)?;
            vol = match k8s::wait_for(
                self.volumes(),
                "AntstorVolume",
                &name,
                self.cfg.ready_timeout,
                |v: &AntstorVolume| !growing(v) || v.permanent_failure().is_some(),
            )
            .await?
            {
                Waited::Done(v) => {
                    permanent_failure(&v)?;
                    v
                }
                Waited::Gone => {
                    return Err(CsiError::NotFound(format!("volume {name} was deleted")));
                }
                Waited::TimedOut => {
                    return Err(CsiError::Pending(format!(
                        "volume {name} is still being grown by its storage node after {}s; retry",
                        self.cfg.ready_timeout.as_secs()
                    )));
                }
            };
        }
        let _g = self.inflight.claim(&format!("volume {id}"))?;
        let plan = attach_plan(&vol, &self.cfg.node_id)?;
        let host = self.host.clone();
        let block_cap = matches!(
            req.volume_capability
                .as_ref()
                .map(|c| params::check_capability("volume_capability", c)),
            Some(Ok(Access::Block))
        );
        let vid = id.to_string();
        let size = blocking(move || {
            if !path.exists() {
                return Err(CsiError::NotFound(format!(
                    "volume_path: {} does not exist",
                    path.display()
                )));
            }
            let dev = host.find_device(&plan)?.ok_or_else(|| {
                CsiError::FailedPrecondition(format!("volume {vid} is not attached on this node"))
            })?;
            if dev.starts_with("/dev/loop") || dev.to_string_lossy().starts_with("/dev/loop") {
                // The file grew: make the loop device see it.
                cmd::run_ok(
                    host.runner.as_ref(),
                    &argv(&["losetup", "-c", &dev.display().to_string()]),
                )?;
            }
            if !block_cap && path.is_dir() {
                let m = host.mounted(&path)?.ok_or_else(|| {
                    CsiError::NotFound(format!("volume_path: {} is not mounted", path.display()))
                })?;
                cmd::run_ok(
                    host.runner.as_ref(),
                    &mount::grow_argv(&m.fs_type, &dev, &path)?,
                )?;
            }
            mount::device_size(&dev)
        })
        .await?;
        info!(volume = id, size, "filesystem expanded");
        Ok(NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
        })
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        self.stage(request.get_ref()).await.map_err(|e| {
            if let CsiError::Unauthenticated { reason, .. } = &e {
                self.auth_refused(reason);
            }
            fail("NodeStageVolume", e)
        })?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        self.unstage(request.get_ref())
            .await
            .map_err(|e| fail("NodeUnstageVolume", e))?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        self.publish(request.get_ref())
            .await
            .map_err(|e| fail("NodePublishVolume", e))?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        self.unpublish(request.get_ref())
            .await
            .map_err(|e| fail("NodeUnpublishVolume", e))?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        self.stats(request.get_ref())
            .await
            .map(Response::new)
            .map_err(|e| fail("NodeGetVolumeStats", e))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        self.expand(request.get_ref())
            .await
            .map(Response::new)
            .map_err(|e| fail("NodeExpandVolume", e))
    }

    #[instrument(skip_all)]
    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: NODE_CAPABILITIES
                .iter()
                .map(|t| NodeServiceCapability {
                    r#type: Some(node_service_capability::Type::Rpc(
                        node_service_capability::Rpc { r#type: *t as i32 },
                    )),
                })
                .collect(),
        }))
    }

    #[instrument(skip_all)]
    async fn node_get_info(
        &self,
        _request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.cfg.node_id.clone(),
            max_volumes_per_node: self.cfg.max_volumes_per_node,
            accessible_topology: Some(hostname_topology(&self.cfg.node_id)),
        }))
    }
}

/// The NQN a volume's export uses (for tools).
pub fn volume_nqn(vol: &AntstorVolume) -> String {
    vol.spec
        .spdk_target
        .as_ref()
        .map(|t| t.subsys_nqn.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| naming::subsys_nqn(&vol.spec.uuid))
}

/// FAILED_PRECONDITION with the storage node's reason when the volume failed for good (the
/// pool cannot do what it needs, the object is invalid): waiting would not help.
fn permanent_failure(v: &AntstorVolume) -> Result<()> {
    match v.permanent_failure() {
        Some(msg) => Err(CsiError::FailedPrecondition(format!(
            "volume {} cannot be served: {msg}",
            v.name_any()
        ))),
        None => Ok(()),
    }
}

/// Whether the storage node has yet to grow the volume (ControllerExpandVolume's label).
fn growing(v: &AntstorVolume) -> bool {
    v.labels().contains_key(labels::EXPANSION_ORIGINAL_SIZE)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::cmd::{Output, ScriptedRunner};
    use liteio_api::{AntstorVolumeSpec, KernelLvol};
    use std::fs;
    use std::time::Duration;

    fn nvme_volume(target: &str) -> AntstorVolume {
        let uuid = "0b9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a11";
        let mut v = AntstorVolume::new("pvc-1", AntstorVolumeSpec::default());
        v.spec.uuid = uuid.into();
        v.spec.target_node_id = target.into();
        v.spec.spdk_target = Some(SpdkTarget {
            subsys_nqn: naming::subsys_nqn(uuid),
            svc_id: "4421".into(),
            sn: naming::serial_number(uuid),
            trans_type: "TCP".into(),
            address: "10.0.0.9".into(),
            ..SpdkTarget::default()
        });
        v
    }

    #[test]
    fn plans() {
        let mut v = nvme_volume("node-2");
        assert!(matches!(
            attach_plan(&v, "node-1").unwrap(),
            Attach::Nvme(_)
        ));
        v.spec.kernel_lvol = Some(KernelLvol {
            name: "pvc-1".into(),
            dev_path: "/dev/vg/pvc-1".into(),
        });
        // A remote LVM volume is still reached over NVMe/TCP.
        assert!(matches!(
            attach_plan(&v, "node-1").unwrap(),
            Attach::Nvme(_)
        ));
        assert_eq!(
            attach_plan(&v, "node-2").unwrap(),
            Attach::Local(PathBuf::from("/dev/vg/pvc-1"))
        );
        // Exported to node-3's host NQN: node-1 may not stage it, node-3 may; node-2 holds
        // it locally.
        v.spec.host_node = Some(liteio_api::NodeInfo {
            id: "node-3".into(),
            ..Default::default()
        });
        let e = check_host(&v, "node-1").unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::FailedPrecondition);
        assert!(
            e.to_string().contains("node-3") && e.to_string().contains("node-1"),
            "{e}"
        );
        check_host(&v, "node-3").unwrap();
        check_host(&v, "node-2").unwrap();
        v.spec.spdk_target = None;
        assert_eq!(
            attach_plan(&v, "node-1").unwrap_err().kind(),
            crate::error::ErrorKind::FailedPrecondition
        );
    }

    fn cfg(dir: &Path) -> Arc<DriverConfig> {
        let mut c = DriverConfig::new("node-1");
        c.sysfs_root = dir.join("sys");
        c.hostnqn_path = dir.join("etc/nvme/hostnqn");
        c.device_timeout = Duration::from_secs(2);
        Arc::new(c)
    }

    #[test]
    fn nvme_attach_connects_and_finds_the_namespace_by_serial() {
        let d = tempfile::tempdir().unwrap();
        let cfg = cfg(d.path());
        let vol = nvme_volume("node-2");
        let sn = vol.spec.spdk_target.as_ref().unwrap().sn.clone();
        let runner = Arc::new(ScriptedRunner::new());
        let sys = cfg.sysfs_root.clone();
        runner.on_with(&["nvme", "connect"], Output::ok(""), move |_| {
            // What the kernel does on a successful connect.
            let c = sys.join("class/nvme/nvme3");
            fs::create_dir_all(c.join("nvme3n1")).unwrap();
            fs::write(c.join("serial"), format!("{sn}  \n")).unwrap();
            fs::write(c.join("subsysnqn"), "nqn.x\n").unwrap();
        });
        runner.on(
            &["nvme", "disconnect"],
            Output::ok("NQN:nqn disconnected 1 controller(s)\n"),
        );
        let host = Host::new(Arc::clone(&cfg), runner.clone());
        let plan = attach_plan(&vol, "node-1").unwrap();
        assert_eq!(
            host.attach(&plan, None).unwrap(),
            PathBuf::from("/dev/nvme3n1")
        );
        // Attached already: no second connect.
        assert_eq!(
            host.attach(&plan, None).unwrap(),
            PathBuf::from("/dev/nvme3n1")
        );
        host.detach(&plan).unwrap();
        let lines = runner.lines();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(
            lines[0],
            format!(
                "nvme connect -t tcp -a 10.0.0.9 -s 4421 -n {} --hostnqn nqn.2021-03.com.alipay.host:uuid:node-1 --reconnect-delay 1 --ctrl-loss-tmo 600",
                naming::subsys_nqn(&vol.spec.uuid)
            )
        );
        assert!(lines[1].starts_with("nvme disconnect -n nqn.2021-03.com.alipay.ob:uuid:"));
    }

    #[test]
    fn nvme_attach_reports_a_missing_namespace_as_retryable() {
        let d = tempfile::tempdir().unwrap();
        let mut c = DriverConfig::new("node-1");
        c.sysfs_root = d.path().join("sys");
        c.hostnqn_path = d.path().join("hostnqn");
        c.device_timeout = Duration::from_millis(200);
        let runner = Arc::new(ScriptedRunner::new());
        runner.on(&["nvme", "connect"], Output::ok(""));
        let host = Host::new(Arc::new(c), runner);
        let e = host
            .attach(&attach_plan(&nvme_volume("n2"), "node-1").unwrap(), None)
            .unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::Timeout, "{e}");
    }

    #[test]
    fn nvme_connect_failure_is_reported_with_stderr() {
        let d = tempfile::tempdir().unwrap();
        let runner = Arc::new(ScriptedRunner::new());
        runner.on(
            &["nvme", "connect"],
            Output::fail(
                1,
                "Failed to write to /dev/nvme-fabrics: Input/output error\n",
            ),
        );
        let host = Host::new(cfg(d.path()), runner);
        let e = host
            .attach(&attach_plan(&nvme_volume("n2"), "node-1").unwrap(), None)
            .unwrap_err();
        assert!(e.to_string().contains("Input/output error"), "{e}");
        // No keys were given: the error says how a StorageClass passes them.
        assert!(
            e.to_string()
                .contains("StorageClass must set csi.storage.k8s.io/node-stage-secret-name"),
            "{e}"
        );
        // A target that is not there is UNAVAILABLE, naming it; keys are not blamed.
        let runner = Arc::new(ScriptedRunner::new());
        runner.on(
            &["nvme", "connect"],
            Output::fail(
                1,
                "Failed to write to /dev/nvme-fabrics: Connection refused\n",
            ),
        );
        let host = Host::new(cfg(d.path()), runner);
        let e = host
            .attach(&attach_plan(&nvme_volume("n2"), "node-1").unwrap(), None)
            .unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::Unavailable, "{e}");
        assert!(e.to_string().contains("refused the connection"), "{e}");
        assert!(!e.to_string().contains("StorageClass"), "{e}");
        // Detach of a never-connected export does nothing.
        let runner = Arc::new(ScriptedRunner::new());
        let host = Host::new(cfg(d.path()), runner.clone());
        host.detach(&attach_plan(&nvme_volume("n2"), "node-1").unwrap())
            .unwrap();
        assert!(runner.calls().is_empty());
    }

    /// Answers every connect like the kernel: makes the controller in the fake sysfs and
    /// replies `instance=3,cntlid=1`; records the options.
    #[derive(Debug)]
    struct KernelFabrics {
        sys: PathBuf,
        sn: String,
        seen: std::sync::Mutex<Vec<String>>,
    }

    impl nvme::Fabrics for KernelFabrics {
        fn add_ctrl(&self, options: &nvme::ConnectOptions) -> std::io::Result<String> {
            self.seen.lock().unwrap().push(options.expose().to_string());
            let c = self.sys.join("class/nvme/nvme3");
            fs::create_dir_all(c.join("nvme3n1"))?;
            fs::write(c.join("serial"), format!("{}  \n", self.sn))?;
            fs::write(c.join("subsysnqn"), "nqn.x\n")?;
            Ok("instance=3,cntlid=1\n".into())
        }
    }

    #[test]
    fn nvme_attach_with_keys_authenticates_without_a_command_line() {
        let d = tempfile::tempdir().unwrap();
        let cfg = cfg(d.path());
        fs::create_dir_all(d.path().join("etc/nvme")).unwrap();
        let mut c = (*cfg).clone();
        c.hostid_path = d.path().join("etc/nvme/hostid");
        fs::write(&c.hostid_path, "3f1c9a2e-0000-4000-8000-000000000001\n").unwrap();
        let cfg = Arc::new(c);
        let vol = nvme_volume("node-2");
        let fabrics = Arc::new(KernelFabrics {
            sys: cfg.sysfs_root.clone(),
            sn: vol.spec.spdk_target.as_ref().unwrap().sn.clone(),
            seen: std::sync::Mutex::new(Vec::new()),
        });
        let runner = Arc::new(ScriptedRunner::new());
        runner.on(&["nvme", "disconnect"], Output::ok(""));
        let host = Host::new(Arc::clone(&cfg), runner.clone()).with_fabrics(fabrics.clone());
        let keys = VolumeKeys::generate(false).unwrap();
        let plan = attach_plan(&vol, "node-1").unwrap();
        assert_eq!(
            host.attach(&plan, Some(&keys)).unwrap(),
            PathBuf::from("/dev/nvme3n1")
        );
        // Attached already: no second connect.
        host.attach(&plan, Some(&keys)).unwrap();
        host.detach(&plan).unwrap();
        let seen = fabrics.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        assert!(
            seen[0].contains(&format!(
                ",hostnqn=nqn.2021-03.com.alipay.host:uuid:node-1,hostid=3f1c9a2e-0000-4000-8000-000000000001,dhchap_secret={},dhchap_ctrl_secret={},",
                keys.host.expose(),
                keys.ctrl.expose()
            )),
            "{}",
            nvme::redact_options(&seen[0])
        );
        // No program ran with the secrets: only the disconnect ran at all.
        let calls = runner.calls();
        assert_eq!(
            runner.lines(),
            vec![format!("nvme disconnect -n {}", volume_nqn(&vol))]
        );
        for argv in calls.iter().flatten() {
            for key in [keys.host.expose(), keys.ctrl.expose()] {
                assert!(!argv.contains(&key[10..40]), "{argv}");
            }
        }
    }

    #[test]
    fn stage_keys_come_from_the_request_and_errors_name_the_data_key() {
        assert_eq!(stage_keys(&HashMap::new()).unwrap(), None);
        let keys = VolumeKeys::generate(false).unwrap();
        let mut secrets: HashMap<String, String> = keys
            .to_secret_data()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
            .collect();
        assert_eq!(stage_keys(&secrets).unwrap(), Some(keys.clone()));
        // A wrong (corrupted) host key.
        let mut wrong = keys.host.expose().to_string();
        let flipped = if wrong.as_bytes()[12] == b'A' {
            "B"
        } else {
            "A"
        };
        wrong.replace_range(12..13, flipped);
        secrets.insert("dhchapKey".into(), wrong.clone());
        let e = stage_keys(&secrets).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::InvalidArgument);
        let msg = tonic::Status::from(e).message().to_string();
        assert!(msg.starts_with("secrets: dhchapKey: "), "{msg}");
        assert!(msg.contains("node-stage Secret"), "{msg}");
        assert!(
            !msg.contains(&wrong[10..]) && !msg.contains(&wrong[16..30]),
            "{msg}"
        );
        secrets.remove("dhchapCtrlKey");
        secrets.insert("dhchapKey".into(), keys.host.expose().to_string());
        let e = stage_keys(&secrets).unwrap_err();
        assert_eq!(
            e.to_string(),
            "secrets: dhchapCtrlKey: is missing (in the node-stage Secret)"
        );
    }

    /// Collects what `tracing` writes while a test runs.
    #[derive(Clone, Default)]
    struct LogBuf(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for LogBuf {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged(f: impl FnOnce()) -> String {
        let buf = LogBuf::default();
        let w = buf.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(sub, f);
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    /// Asserts that `text` holds no 8-character piece of the keys' base64 parts.
    fn assert_no_key(text: &str, k: &VolumeKeys) {
        for s in [k.host.expose(), k.ctrl.expose()] {
            for c in s.as_bytes()["DHHC-1:00:".len()..].chunks(8) {
                let c = String::from_utf8_lossy(c);
                assert!(
                    c.len() < 8 || !text.contains(c.as_ref()),
                    "{text} holds {c}"
                );
            }
        }
    }

    fn secrets_of(keys: &VolumeKeys) -> HashMap<String, String> {
        keys.to_secret_data()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
            .collect()
    }

    #[test]
    fn republished_keys_reach_the_connected_controller_once() {
        let d = tempfile::tempdir().unwrap();
        let cfg = cfg(d.path());
        let vol = nvme_volume("node-2");
        let plan = attach_plan(&vol, "node-1").unwrap();
        let host = Host::new(Arc::clone(&cfg), Arc::new(ScriptedRunner::new()));
        let k1 = VolumeKeys::generate(false).unwrap();
        // Not connected on this node yet: nothing to do.
        assert_eq!(
            host.refresh_keys(&plan, &k1).unwrap(),
            KeyRefresh::NotConnected
        );
        // Connected with k1 (what the kernel shows after an authenticated connect).
        let c = cfg.sysfs_root.join("class/nvme/nvme3");
        fs::create_dir_all(c.join("nvme3n1")).unwrap();
        let sn = &vol.spec.spdk_target.as_ref().unwrap().sn;
        fs::write(c.join("serial"), format!("{sn}  \n")).unwrap();
        fs::write(c.join("dhchap_secret"), format!("{}\n", k1.host.expose())).unwrap();
        fs::write(
            c.join("dhchap_ctrl_secret"),
            format!("{}\n", k1.ctrl.expose()),
        )
        .unwrap();
        assert_eq!(
            host.refresh_keys(&plan, &k1).unwrap(),
            KeyRefresh::Unchanged {
                controller: "nvme3".into()
            }
        );
        // Rotated: written once, then unchanged.
        let k2 = VolumeKeys::generate(false).unwrap();
        let written = host.refresh_keys(&plan, &k2);
        assert_eq!(
            written.as_ref().unwrap(),
            &KeyRefresh::Written {
                controller: "nvme3".into(),
                attributes: vec![nvme::ATTR_DHCHAP_SECRET, nvme::ATTR_DHCHAP_CTRL_SECRET],
            }
        );
        assert_eq!(
            fs::read_to_string(c.join("dhchap_secret")).unwrap(),
            k2.host.expose()
        );
        assert_eq!(
            fs::read_to_string(c.join("dhchap_ctrl_secret")).unwrap(),
            k2.ctrl.expose()
        );
        let log = logged(|| report_key_refresh("pvc-1", &written));
        assert!(log.contains("INFO"), "{log}");
        assert!(log.contains("volume=\"pvc-1\""), "{log}");
        assert!(log.contains("controller=nvme3"), "{log}");
        assert!(
            log.contains("attributes=dhchap_secret,dhchap_ctrl_secret"),
            "{log}"
        );
        assert_no_key(&log, &k1);
        assert_no_key(&log, &k2);
        let again = host.refresh_keys(&plan, &k2);
        assert_eq!(
            again.as_ref().unwrap(),
            &KeyRefresh::Unchanged {
                controller: "nvme3".into()
            }
        );
        // Nothing changed: nothing to say at every republish.
        assert_eq!(logged(|| report_key_refresh("pvc-1", &again)), "");
        // A local volume has no controller to refresh.
        let local = Attach::Local(d.path().join("dev-x"));
        assert_eq!(
            host.refresh_keys(&local, &k2).unwrap(),
            KeyRefresh::NotConnected
        );
    }

    #[test]
    fn a_failed_refresh_is_a_warning_that_names_the_attribute_and_volume() {
        let d = tempfile::tempdir().unwrap();
        let cfg = cfg(d.path());
        let vol = nvme_volume("node-2");
        let plan = attach_plan(&vol, "node-1").unwrap();
        let host = Host::new(Arc::clone(&cfg), Arc::new(ScriptedRunner::new()));
        // An old kernel: the controller has no dhchap attributes.
        let c = cfg.sysfs_root.join("class/nvme/nvme3");
        fs::create_dir_all(&c).unwrap();
        let sn = &vol.spec.spdk_target.as_ref().unwrap().sn;
        fs::write(c.join("serial"), format!("{sn}\n")).unwrap();
        let k = VolumeKeys::generate(false).unwrap();
        let outcome = host.refresh_keys(&plan, &k);
        let log = logged(|| report_key_refresh("pvc-1", &outcome));
        assert!(log.contains("WARN"), "{log}");
        assert!(log.contains("volume=\"pvc-1\""), "{log}");
        assert!(
            log.contains(&format!(
                "{}: does not exist",
                c.join("dhchap_secret").display()
            )),
            "{log}"
        );
        assert!(log.contains("CONFIG_NVME_HOST_AUTH"), "{log}");
        assert!(log.contains("the next republish tries again"), "{log}");
        assert_no_key(&log, &k);
        // A bad node-publish Secret: named by data key, also only a warning.
        let mut secrets = secrets_of(&k);
        let mut bad = k.ctrl.expose().to_string();
        bad.truncate(20);
        secrets.insert("dhchapCtrlKey".into(), bad.clone());
        let e = publish_keys(&secrets).unwrap_err();
        assert!(e.to_string().starts_with("secrets: dhchapCtrlKey: "), "{e}");
        assert!(
            e.to_string().ends_with("(in the node-publish Secret)"),
            "{e}"
        );
        let log = logged(|| report_key_refresh("pvc-1", &Err(e)));
        assert!(log.contains("WARN"), "{log}");
        assert!(!log.contains(&bad["DHHC-1:00:".len()..]), "{log}");
        assert_no_key(&log, &k);
        assert_eq!(publish_keys(&HashMap::new()).unwrap(), None);
        assert_eq!(publish_keys(&secrets_of(&k)).unwrap(), Some(k));
    }

    #[test]
    fn existing_filesystem_is_never_reformatted() {
        let d = tempfile::tempdir().unwrap();
        let runner = Arc::new(ScriptedRunner::new());
        runner
            .once(&["blkid"], Output::ok("ext4\n"))
            .once(&["blkid"], Output::fail(2, ""))
            .on(&["mkfs.xfs"], Output::ok(""))
            .on(&["mount"], Output::ok(""));
        let host = Host::new(cfg(d.path()), runner.clone());
        let st = d.path().join("staging");
        let used = host
            .format_and_mount(Path::new("/dev/x"), &st, "xfs", "", &["nouuid".into()])
            .unwrap();
        assert_eq!(used, "ext4");
        let used = host
            .format_and_mount(Path::new("/dev/x"), &st, "xfs", "-K", &["nouuid".into()])
            .unwrap();
        assert_eq!(used, "xfs");
        let lines = runner.lines();
        assert_eq!(
            lines,
            vec![
                "blkid -p -o value -s TYPE /dev/x".to_string(),
                format!("mount -t ext4 /dev/x {}", st.display()),
                "blkid -p -o value -s TYPE /dev/x".to_string(),
                "mkfs.xfs -f -m reflink=0 -K /dev/x".to_string(),
                format!("mount -t xfs -o nouuid /dev/x {}", st.display()),
            ]
        );
    }
}
