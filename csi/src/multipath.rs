//! The host's half of a hot migration's switch-over (issue 15, item 3): this node consumes a
//! volume that moves to another storage node, and its kernel's native NVMe multipath moves
//! the I/O when the ANA states flip. The node service plays LiteIO's host-nvme role:
//!
//! 1. [`connect_second_path`]: connect the destination's export (same NQN and namespace
//!    identity, another address and port) as a second path, unless this host already has a
//!    path to that address and port for that NQN. The connection goes through the kernel's
//!    fabrics device with the same options string as the first connect (host NQN, host id,
//!    the volume's DH-HMAC-CHAP keys when it has them, `reconnect_delay=1`,
//!    `ctrl_loss_tmo=600`), so no secret ever reaches an argv.
//! 2. The targets flip ANA states (source inaccessible, destination optimized); the kernel
//!    requeues I/O and sends it on the optimized path. Nothing to do on the host.
//! 3. [`disconnect_path`]: delete the controller of the old address and port (sysfs
//!    `delete_controller`), never the last live path of the subsystem.
//!
//! Both steps are idempotent and read the host's state from sysfs ([`sysfs_paths`]) or from
//! `nvme list-subsys -o json` ([`list_subsys_paths`]). The node's VolumeMigration controller
//! ([`crate::migration`]) calls them for migrations whose host is this node
//! ([`host_migration`]).

use std::fmt;
use std::path::Path;

use liteio_api::auth::VolumeKeys;
use liteio_api::{SpdkTarget, VolumeMigration, keys};
use serde_json::Value;

use crate::cmd::argv;
use crate::error::{CsiError, Result};
use crate::nvme::{self, ConnectOptions, Fabrics};

/// One path (a controller) of an NVMe-oF subsystem on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPath {
    /// Controller name (`nvme3`).
    pub controller: String,
    /// Transport (`tcp`).
    pub transport: String,
    /// Target address.
    pub traddr: String,
    /// Target port (service id).
    pub trsvcid: String,
    /// Controller state as the kernel shows it (`live`, `connecting`, `deleting`, …).
    pub state: String,
}

impl HostPath {
    /// Whether the kernel still counts this controller: a controller being deleted or dead
    /// is no path (the kernel also lets a new connect to its address through).
    pub fn present(&self) -> bool {
        !(self.state.starts_with("deleting") || self.state == "dead")
    }

    /// Whether this path leads to `address:port`.
    pub fn leads_to(&self, address: &str, port: &str) -> bool {
        self.traddr == address && self.trsvcid == port
    }
}

/// `traddr` and `trsvcid` of an address as the kernel shows it in sysfs and nvme-cli 2
/// reports it (`traddr=10.0.0.1,trsvcid=4420,src_addr=10.0.0.2`), or as nvme-cli 1 does
/// (`traddr=10.0.0.1 trsvcid=4420`).
pub fn parse_address(s: &str) -> (String, String) {
    let (mut traddr, mut trsvcid) = (String::new(), String::new());
    for kv in s.split([',', ' ', '\n']) {
        if let Some(v) = kv.trim().strip_prefix("traddr=") {
            traddr = v.to_string();
        } else if let Some(v) = kv.trim().strip_prefix("trsvcid=") {
            trsvcid = v.to_string();
        }
    }
    (traddr, trsvcid)
}

fn read_trim(p: &Path) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The paths of subsystem `nqn` on this host, from `<sysfs>/class/nvme/nvme*`
/// (`subsysnqn`, `transport`, `address`, `state`), sorted by controller name.
pub fn sysfs_paths(sysfs: &Path, nqn: &str) -> Vec<HostPath> {
    let class = sysfs.join("class/nvme");
    let mut names: Vec<String> = std::fs::read_dir(&class)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
        .into_iter()
        .filter_map(|ctrl| {
            let dir = class.join(&ctrl);
            if read_trim(&dir.join("subsysnqn")) != nqn {
                return None;
            }
            let (traddr, trsvcid) = parse_address(&read_trim(&dir.join("address")));
            Some(HostPath {
                transport: read_trim(&dir.join("transport")),
                state: read_trim(&dir.join("state")),
                controller: ctrl,
                traddr,
                trsvcid,
            })
        })
        .collect()
}

/// `nvme list-subsys -o json`: every subsystem with its paths.
pub fn list_subsys_argv() -> Vec<String> {
    argv(&["nvme", "list-subsys", "-o", "json"])
}

/// The paths of subsystem `nqn` in the output of `nvme list-subsys -o json`: nvme-cli 2's
/// form (a list of hosts, each with `Subsystems`, each subsystem with `NQN` and `Paths`) or
/// nvme-cli 1's (one object with `Subsystems`, where each subsystem's `Paths` follow in an
/// object of their own); a path has `Name`, `Transport`, `Address` and `State`.
pub fn list_subsys_paths(json: &str, nqn: &str) -> Result<Vec<HostPath>> {
    let v: Value = serde_json::from_str(json).map_err(|e| {
        CsiError::Internal(format!(
            "nvme list-subsys printed no JSON list of subsystems: {e}"
        ))
    })?;
    let hosts = match &v {
        Value::Array(hosts) => hosts.iter().collect(),
        Value::Object(_) => vec![&v],
        _ => Vec::new(),
    };
    let text = |p: &Value, k: &str| p.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let mut out = Vec::new();
    for host in hosts {
        let subsystems = host.get("Subsystems").and_then(Value::as_array);
        // nvme-cli 1 prints a subsystem's `Paths` as an object of their own right after the
        // one with its `Name` and `NQN`: paths without an NQN belong to the one before.
        let mut current: Option<&str> = None;
        for s in subsystems.into_iter().flatten() {
            if let Some(n) = s.get("NQN").and_then(Value::as_str) {
                current = Some(n);
            }
            if current != Some(nqn) {
                continue;
            }
            for p in s
                .get("Paths")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let (traddr, trsvcid) = parse_address(&text(p, "Address"));
                out.push(HostPath {
                    controller: text(p, "Name"),
                    transport: text(p, "Transport"),
                    state: text(p, "State"),
                    traddr,
                    trsvcid,
                });
            }
        }
    }
    Ok(out)
}

/// The two exports a host switches between during a migration.
#[derive(Debug, Clone, PartialEq)]
pub struct MigrationPaths {
    /// The NQN both exports serve.
    pub nqn: String,
    /// The source's export: the path to drop at the end.
    pub old: SpdkTarget,
    /// The destination's export: the path to add.
    pub new: SpdkTarget,
}

/// Whether `node` is the host of `m`: the node its `migrate.obnvmf/host-node-id` label names,
/// else the source volume's `hostNodeId`; never when both are empty.
pub fn is_host(m: &VolumeMigration, node: &str) -> bool {
    let host = m
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(keys::labels::MIGRATE_HOST_NODE_ID))
        .unwrap_or(&m.spec.source_volume.host_node_id);
    !host.is_empty() && host == node
}

/// The exports of `m` when `node` is its host (the `migrate.obnvmf/host-node-id` label, else
/// the source volume's `hostNodeId`) and both are known; `None` otherwise. The destination's
/// NQN must be the source's: the host sees one subsystem with two paths.
pub fn host_migration(m: &VolumeMigration, node: &str) -> Option<MigrationPaths> {
    if !is_host(m, node) {
        return None;
    }
    let (old, new) = (&m.spec.source_volume.spdk, &m.spec.dest_volume.spdk);
    if old.subsys_nqn.is_empty() || new.subsys_nqn != old.subsys_nqn || new.address.is_empty() {
        return None;
    }
    Some(MigrationPaths {
        nqn: old.subsys_nqn.clone(),
        old: old.clone(),
        new: new.clone(),
    })
}

/// What [`connect_second_path`] did.
#[derive(Clone, PartialEq, Eq)]
pub enum PathConnect {
    /// The host had a path to that address already: its controller.
    AlreadyConnected(String),
    /// A new controller (`nvme4`).
    Connected(String),
}

impl fmt::Debug for PathConnect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AlreadyConnected(c) => write!(f, "AlreadyConnected({c})"),
            Self::Connected(c) => write!(f, "Connected({c})"),
        }
    }
}

/// The options string for a path to `t`: with DH-HMAC-CHAP when `keys` are given
/// ([`nvme::connect_options`]), else [`nvme::plain_connect_options`].
pub fn path_options(
    t: &SpdkTarget,
    host_nqn: &str,
    host_id: Option<&str>,
    keys: Option<&VolumeKeys>,
) -> Result<ConnectOptions> {
    match keys {
        Some(k) => nvme::connect_options(t, host_nqn, host_id, k),
        None => nvme::plain_connect_options(t, host_nqn, host_id),
    }
}

/// Connect this host to `t` (the destination's export of a migrating volume) as one more
/// path of subsystem `t.subsys_nqn`, unless `existing` (the subsystem's paths, from
/// [`sysfs_paths`] or [`list_subsys_paths`]) has a path to `t.address:t.svc_id` that the
/// kernel still counts. Idempotent. Errors show the options with their secrets masked.
pub fn connect_path(
    fabrics: &dyn Fabrics,
    existing: &[HostPath],
    t: &SpdkTarget,
    host_nqn: &str,
    host_id: Option<&str>,
    keys: Option<&VolumeKeys>,
) -> Result<PathConnect> {
    if let Some(p) = existing
        .iter()
        .find(|p| p.present() && p.leads_to(&t.address, &t.svc_id))
    {
        return Ok(PathConnect::AlreadyConnected(p.controller.clone()));
    }
    let opts = path_options(t, host_nqn, host_id, keys)?;
    let reply = fabrics.add_ctrl(&opts).map_err(|e| {
        CsiError::io(
            format!(
                "connect of a second path to {} at {}:{} ({}) failed",
                t.subsys_nqn,
                t.address,
                t.svc_id,
                opts.redacted()
            ),
            e,
        )
    })?;
    nvme::parse_fabrics_reply(&reply)
        .map(|n| PathConnect::Connected(format!("nvme{n}")))
        .ok_or_else(|| {
            CsiError::Internal(format!(
                "the fabrics device answered {:?} to a connect to {}, with no controller instance",
                nvme::redact_options(reply.trim()),
                t.subsys_nqn
            ))
        })
}

/// [`connect_path`] with the paths this host has now, read from `sysfs`.
pub fn connect_second_path(
    fabrics: &dyn Fabrics,
    sysfs: &Path,
    t: &SpdkTarget,
    host_nqn: &str,
    host_id: Option<&str>,
    keys: Option<&VolumeKeys>,
) -> Result<PathConnect> {
    let existing = sysfs_paths(sysfs, &t.subsys_nqn);
    connect_path(fabrics, &existing, t, host_nqn, host_id, keys)
}

/// Disconnect this host's path to `address:port` of subsystem `nqn` (the source's export,
/// once the destination serves) by writing `1` to its controller's `delete_controller` in
/// `sysfs`, leaving the subsystem's other paths alone. Returns the controller deleted, or
/// `None` when there is no such path (idempotent). Refuses, with `FailedPrecondition`, to
/// delete the subsystem's last `live` path: that would cut the volume off its consumer.
pub fn disconnect_path(
    sysfs: &Path,
    nqn: &str,
    address: &str,
    port: &str,
) -> Result<Option<String>> {
    let paths = sysfs_paths(sysfs, nqn);
    let Some(old) = paths
        .iter()
        .find(|p| p.present() && p.leads_to(address, port))
    else {
        return Ok(None);
    };
    let others_live = paths
        .iter()
        .any(|p| p.controller != old.controller && p.state == "live");
    if !others_live {
        return Err(CsiError::FailedPrecondition(format!(
            "{} ({address}:{port}) is the last live path of {nqn} on this host; connect the new \
             path first",
            old.controller
        )));
    }
    let attr = sysfs
        .join("class/nvme")
        .join(&old.controller)
        .join("delete_controller");
    std::fs::write(&attr, "1").map_err(|e| {
        CsiError::io(
            format!(
                "delete controller {} via {}",
                old.controller,
                attr.display()
            ),
            e,
        )
    })?;
    Ok(Some(old.controller.clone()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn addresses_of_sysfs_and_both_nvme_cli_versions() {
        for s in [
            "traddr=10.0.0.2,trsvcid=4420,src_addr=10.0.0.9",
            "traddr=10.0.0.2,trsvcid=4420",
            "traddr=10.0.0.2 trsvcid=4420",
            "trsvcid=4420,traddr=10.0.0.2\n",
        ] {
            assert_eq!(parse_address(s), ("10.0.0.2".into(), "4420".into()), "{s}");
        }
        assert_eq!(parse_address(""), (String::new(), String::new()));
    }

    #[test]
    fn deleting_and_dead_controllers_are_no_path() {
        let p = |state: &str| HostPath {
            controller: "nvme1".into(),
            transport: "tcp".into(),
            traddr: "a".into(),
            trsvcid: "1".into(),
            state: state.into(),
        };
        assert!(p("live").present());
        assert!(p("connecting").present());
        assert!(p("resetting").present());
        assert!(!p("deleting").present());
        assert!(!p("deleting (no IO)").present());
        assert!(!p("dead").present());
    }
}
