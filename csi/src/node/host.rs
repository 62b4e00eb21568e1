//! The host side of a volume on this node, all blocking (run on tokio's blocking pool):
//! how the node reaches a volume ([`attach_plan`]: a local device or file, or an NVMe/TCP
//! export; [`check_host`]: whether this node may), and [`Host`], which attaches and detaches
//! (loop device, `nvme connect`/`disconnect` or the fabrics device), formats and mounts,
//! bind-mounts for a publish ([`publish_bind`]), unmounts, and hands rotated keys to a
//! connected controller.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kube::ResourceExt;
use liteio_api::auth::VolumeKeys;
use liteio_api::{AntstorVolume, SpdkTarget, naming};
use tracing::{info, warn};

use super::auth::KeyRefresh;
use crate::cmd::{self, CommandRunner, argv};
use crate::config::DriverConfig;
use crate::error::{CsiError, Result};
use crate::mount::{self, MountEntry};
use crate::nvme;
use crate::params::Access;

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

/// Blocking host operations; cloned into `spawn_blocking`.
#[derive(Debug, Clone)]
pub struct Host {
    pub(super) cfg: Arc<DriverConfig>,
    pub(super) runner: Arc<dyn CommandRunner>,
    pub(super) fabrics: Arc<dyn nvme::Fabrics>,
    /// This host's LVM version (`lvm version`), asked once, when a multi-disk volume's
    /// volume group is first made.
    pub(super) lvm_version: Arc<std::sync::OnceLock<Option<crate::lvm::Version>>>,
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
    pub(super) fn detach_loop(&self, dev: &str, file: Option<&Path>) -> Result<()> {
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
pub(super) fn publish_bind(
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

/// The NQN a volume's export uses (for tools).
pub fn volume_nqn(vol: &AntstorVolume) -> String {
    vol.spec
        .spdk_target
        .as_ref()
        .map(|t| t.subsys_nqn.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| naming::subsys_nqn(&vol.spec.uuid))
}
