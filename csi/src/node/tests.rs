//! Unit tests of the Node service's host side: attach plans, NVMe/TCP connects with and
//! without keys, key refreshes at republish, formatting.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::cmd::{Output, ScriptedRunner};
use liteio_api::auth::VolumeKeys;
use liteio_api::{AntstorVolumeSpec, KernelLvol};
use liteio_api::{SpdkTarget, naming};
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
