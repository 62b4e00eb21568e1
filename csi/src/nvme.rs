//! The kernel NVMe/TCP initiator through `nvme-cli`, and finding namespaces in sysfs.
//!
//! A LiteIO volume's NVMe serial number is derived from its uuid
//! ([`liteio_api::naming::serial_number`]); the kernel shows it in
//! `<sysfs>/class/nvme/nvmeX/serial`. The namespace's block device is `nvmeXnY` under the
//! controller, or, with native multipath, the `nvmeSnY` head of the controller's subsystem in
//! `<sysfs>/class/nvme-subsystem/nvme-subsysS/`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use liteio_api::SpdkTarget;

use crate::cmd::argv;
use crate::error::{CsiError, Result};

/// Delay between reconnect attempts after a lost connection (seconds).
pub const RECONNECT_DELAY: &str = "2";
/// How long the kernel keeps a lost controller before giving up (seconds).
pub const CTRL_LOSS_TMO: &str = "10";

/// `nvme connect` for a target, as this host.
pub fn connect_argv(t: &SpdkTarget, host_nqn: &str) -> Result<Vec<String>> {
    let transport = t.trans_type.to_ascii_lowercase();
    if transport != "tcp" {
        return Err(CsiError::FailedPrecondition(format!(
            "spec.spdkTarget.transType: {:?} is not supported by the node service (only TCP)",
            t.trans_type
        )));
    }
    for (field, v) in [
        ("address", &t.address),
        ("svcID", &t.svc_id),
        ("subsysNqn", &t.subsys_nqn),
    ] {
        if v.trim().is_empty() {
            return Err(CsiError::FailedPrecondition(format!(
                "spec.spdkTarget.{field}: is empty; the export is incomplete"
            )));
        }
    }
    Ok(argv(&[
        "nvme",
        "connect",
        "-t",
        "tcp",
        "-a",
        &t.address,
        "-s",
        &t.svc_id,
        "-n",
        &t.subsys_nqn,
        "--hostnqn",
        host_nqn,
        "--reconnect-delay",
        RECONNECT_DELAY,
        "--ctrl-loss-tmo",
        CTRL_LOSS_TMO,
    ]))
}

/// `nvme disconnect` for a subsystem.
pub fn disconnect_argv(nqn: &str) -> Vec<String> {
    argv(&["nvme", "disconnect", "-n", nqn])
}

/// This node's host NQN (see [`liteio_node::hostnqn::load`]: the first line of `path`, or
/// `naming::host_nqn(node)` written there when the file is missing or blank).
pub fn host_nqn(path: &Path, node: &str) -> Result<String> {
    use liteio_node::hostnqn::HostNqnError;
    liteio_node::hostnqn::load(path, node).map_err(|e| match e {
        HostNqnError::Read { path, source } => {
            CsiError::io(format!("read {}", path.display()), source)
        }
        HostNqnError::Write { path, source } => {
            CsiError::io(format!("write {}", path.display()), source)
        }
        e @ HostNqnError::Invalid { .. } => CsiError::Internal(e.to_string()),
    })
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

fn dir_names(p: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(p)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn digits(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_digit())
}

/// True for `nvme<digits>n<digits>` (a namespace head, not a `c` path).
fn is_ns_name(name: &str) -> bool {
    name.strip_prefix("nvme")
        .and_then(|r| r.split_once('n'))
        .is_some_and(|(c, n)| digits(c) && digits(n))
}

/// True for `nvme<d>c<d>n<d>` (a multipath path device).
fn is_path_name(name: &str) -> bool {
    name.strip_prefix("nvme")
        .and_then(|r| r.split_once('c'))
        .is_some_and(|(a, b)| {
            digits(a)
                && b.split_once('n')
                    .is_some_and(|(c, n)| digits(c) && digits(n))
        })
}

/// A controller whose serial number matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Controller name (`nvme3`).
    pub controller: String,
    /// Namespace block device name (`nvme3n1`), when the namespace is visible yet.
    pub namespace: Option<String>,
    /// Subsystem NQN the controller reports.
    pub subsys_nqn: String,
}

/// Finds the controller with serial number `serial` and its namespace device in `sysfs`.
pub fn find_by_serial(sysfs: &Path, serial: &str) -> Option<Found> {
    let class = sysfs.join("class/nvme");
    for ctrl in dir_names(&class) {
        let dir = class.join(&ctrl);
        if read_trim(&dir.join("serial")).as_deref() != Some(serial) {
            continue;
        }
        let subsys_nqn = read_trim(&dir.join("subsysnqn")).unwrap_or_default();
        let entries = dir_names(&dir);
        let mut namespace = entries.iter().find(|n| is_ns_name(n)).cloned();
        if namespace.is_none() && entries.iter().any(|n| is_path_name(n)) {
            namespace = multipath_head(sysfs, &ctrl);
        }
        return Some(Found {
            controller: ctrl,
            namespace,
            subsys_nqn,
        });
    }
    None
}

/// The namespace head of the subsystem that contains controller `ctrl`.
fn multipath_head(sysfs: &Path, ctrl: &str) -> Option<String> {
    let class = sysfs.join("class/nvme-subsystem");
    for subsys in dir_names(&class) {
        let entries = dir_names(&class.join(&subsys));
        if entries.iter().any(|e| e == ctrl) {
            return entries.into_iter().find(|n| is_ns_name(n));
        }
    }
    None
}

/// Waits (polling every 100 ms, blocking) until the namespace with `serial` appears, or
/// `timeout` passes.
pub fn wait_for_namespace(sysfs: &Path, serial: &str, timeout: Duration) -> Option<String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(ns) = find_by_serial(sysfs, serial).and_then(|f| f.namespace) {
            return Some(ns);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `/dev/<name>`.
pub fn dev_path(name: &str) -> PathBuf {
    Path::new("/dev").join(name)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::fs;

    fn target() -> SpdkTarget {
        SpdkTarget {
            subsys_nqn: "nqn.2021-03.com.alipay.ob:uuid:u1".into(),
            svc_id: "4420".into(),
            address: "10.0.0.2".into(),
            trans_type: "TCP".into(),
            sn: "0b9d1f3c6a2e4c1d9f0a".into(),
            ..SpdkTarget::default()
        }
    }

    #[test]
    fn connect_command() {
        let a = connect_argv(&target(), "nqn.host").unwrap();
        assert_eq!(
            a.join(" "),
            "nvme connect -t tcp -a 10.0.0.2 -s 4420 -n nqn.2021-03.com.alipay.ob:uuid:u1 --hostnqn nqn.host --reconnect-delay 2 --ctrl-loss-tmo 10"
        );
        let mut t = target();
        t.trans_type = "VFIOUSER".into();
        assert!(connect_argv(&t, "h").is_err());
        let mut t = target();
        t.svc_id.clear();
        assert!(
            connect_argv(&t, "h")
                .unwrap_err()
                .to_string()
                .contains("svcID")
        );
        assert_eq!(
            disconnect_argv("nqn.x").join(" "),
            "nvme disconnect -n nqn.x"
        );
    }

    #[test]
    fn host_nqn_is_read_or_generated() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("etc/nvme/hostnqn");
        assert_eq!(
            host_nqn(&p, "node-1").unwrap(),
            "nqn.2021-03.com.alipay.host:uuid:node-1"
        );
        assert_eq!(
            fs::read_to_string(&p).unwrap().trim(),
            "nqn.2021-03.com.alipay.host:uuid:node-1"
        );
        fs::write(&p, "nqn.2014-08.org.nvmexpress:uuid:abc\n").unwrap();
        assert_eq!(
            host_nqn(&p, "node-1").unwrap(),
            "nqn.2014-08.org.nvmexpress:uuid:abc"
        );
    }

    fn ctrl(root: &Path, name: &str, serial: &str, nqn: &str, entries: &[&str]) {
        let d = root.join("class/nvme").join(name);
        fs::create_dir_all(&d).unwrap();
        // The kernel pads serial numbers with spaces.
        fs::write(d.join("serial"), format!("{serial}      \n")).unwrap();
        fs::write(d.join("subsysnqn"), format!("{nqn}\n")).unwrap();
        for e in entries {
            fs::create_dir_all(d.join(e)).unwrap();
        }
    }

    #[test]
    fn finds_namespace_by_serial() {
        let d = tempfile::tempdir().unwrap();
        ctrl(
            d.path(),
            "nvme0",
            "LOCALDISK",
            "nqn.local",
            &["nvme0n1", "device", "power"],
        );
        ctrl(
            d.path(),
            "nvme1",
            "0b9d1f3c6a2e4c1d9f0a",
            "nqn.x",
            &["nvme1n1"],
        );
        let f = find_by_serial(d.path(), "0b9d1f3c6a2e4c1d9f0a").unwrap();
        assert_eq!(f.controller, "nvme1");
        assert_eq!(f.namespace.as_deref(), Some("nvme1n1"));
        assert_eq!(f.subsys_nqn, "nqn.x");
        assert!(find_by_serial(d.path(), "nope").is_none());
        assert!(find_by_serial(&d.path().join("missing"), "x").is_none());
    }

    #[test]
    fn finds_multipath_head() {
        let d = tempfile::tempdir().unwrap();
        ctrl(d.path(), "nvme2", "SN2", "nqn.y", &["nvme2c2n1"]);
        let s = d.path().join("class/nvme-subsystem/nvme-subsys1");
        fs::create_dir_all(s.join("nvme2")).unwrap();
        fs::create_dir_all(s.join("nvme1n1")).unwrap();
        let f = find_by_serial(d.path(), "SN2").unwrap();
        assert_eq!(f.namespace.as_deref(), Some("nvme1n1"));
    }

    #[test]
    fn controller_without_namespace_yet() {
        let d = tempfile::tempdir().unwrap();
        ctrl(d.path(), "nvme4", "SN4", "nqn.z", &[]);
        assert_eq!(find_by_serial(d.path(), "SN4").unwrap().namespace, None);
        assert_eq!(
            wait_for_namespace(d.path(), "SN4", Duration::from_millis(150)),
            None
        );
    }

    #[test]
    fn names() {
        assert!(is_ns_name("nvme0n1"));
        assert!(is_ns_name("nvme12n3"));
        assert!(!is_ns_name("nvme0c1n1"));
        assert!(!is_ns_name("nvme0"));
        assert!(is_path_name("nvme0c1n1"));
        assert!(!is_path_name("nvme0n1"));
    }
}
