//! Unit tests of the NVMe/TCP initiator: connect argv and options, the fabrics device,
//! namespaces found in a fake sysfs, host capabilities.
#![allow(clippy::unwrap_used, clippy::expect_used)]

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
        "nvme connect -t tcp -a 10.0.0.2 -s 4420 -n nqn.2021-03.com.alipay.ob:uuid:u1 --hostnqn nqn.host --reconnect-delay 1 --ctrl-loss-tmo 600"
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

fn keys() -> VolumeKeys {
    VolumeKeys::generate(false).unwrap()
}

/// 8-character pieces of the keys' base64 parts.
fn fragments(k: &VolumeKeys) -> Vec<String> {
    [k.host.expose(), k.ctrl.expose()]
        .iter()
        .flat_map(|s| {
            s.as_bytes()["DHHC-1:00:".len()..]
                .chunks(8)
                .filter(|c| c.len() == 8)
                .map(|c| String::from_utf8_lossy(c).into_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn assert_no_secret(text: &str, k: &VolumeKeys) {
    for f in fragments(k) {
        assert!(!text.contains(&f), "{text} holds {f}");
    }
}

#[test]
fn connect_options_are_what_libnvme_writes() {
    let k = keys();
    let o = connect_options(&target(), "nqn.host", None, &k).unwrap();
    assert_eq!(
        o.expose(),
        format!(
            "nqn=nqn.2021-03.com.alipay.ob:uuid:u1,transport=tcp,traddr=10.0.0.2,trsvcid=4420,\
                 hostnqn=nqn.host,dhchap_secret={},dhchap_ctrl_secret={},reconnect_delay=1,\
                 ctrl_loss_tmo=600",
            k.host.expose(),
            k.ctrl.expose()
        )
    );
    let o = connect_options(
        &target(),
        "nqn.host",
        Some("3f1c9a2e-0000-4000-8000-000000000001"),
        &k,
    )
    .unwrap();
    assert!(
        o.expose().contains(
            ",hostnqn=nqn.host,hostid=3f1c9a2e-0000-4000-8000-000000000001,dhchap_secret="
        ),
        "{}",
        o.redacted()
    );
    assert_eq!(
        o.redacted(),
        "nqn=nqn.2021-03.com.alipay.ob:uuid:u1,transport=tcp,traddr=10.0.0.2,trsvcid=4420,\
             hostnqn=nqn.host,hostid=3f1c9a2e-0000-4000-8000-000000000001,dhchap_secret=***,\
             dhchap_ctrl_secret=***,reconnect_delay=1,ctrl_loss_tmo=600"
    );
    assert_no_secret(&format!("{o:?}"), &k);
    assert!(format!("{o:?}").contains("dhchap_secret=***"));
}

#[test]
fn connect_options_reject_what_would_break_the_string() {
    let k = keys();
    let mut t = target();
    t.subsys_nqn = "nqn.a,dhchap_secret=x".into();
    let e = connect_options(&t, "h", None, &k).unwrap_err();
    assert!(
        e.to_string().starts_with("spec.spdkTarget.subsysNqn: "),
        "{e}"
    );
    let e = connect_options(&target(), "nqn.h ost", None, &k).unwrap_err();
    assert!(e.to_string().starts_with("host NQN: "), "{e}");
    let e = connect_options(&target(), "h", Some(""), &k).unwrap_err();
    assert!(e.to_string().starts_with("host id: "), "{e}");
    let mut t = target();
    t.address.clear();
    assert!(
        connect_options(&t, "h", None, &k)
            .unwrap_err()
            .to_string()
            .contains("address")
    );
}

#[test]
fn a_tls_psk_is_refused_by_name() {
    let k = VolumeKeys::generate(true).unwrap();
    let psk = k.tls_psk.as_ref().unwrap().expose()["NVMeTLSkey-1:01:".len()..][..16].to_string();
    let e = connect_options(&target(), "h", None, &k).unwrap_err();
    assert_eq!(e.kind(), crate::error::ErrorKind::FailedPrecondition);
    assert!(e.to_string().starts_with("secrets: tlsPsk: "), "{e}");
    assert!(!e.to_string().contains(&psk), "{e}");
    assert_no_secret(&e.to_string(), &k);
}

#[test]
fn fabrics_replies() {
    assert_eq!(parse_fabrics_reply("instance=3,cntlid=1\n"), Some(3));
    assert_eq!(parse_fabrics_reply("cntlid=1,instance=12"), Some(12));
    assert_eq!(parse_fabrics_reply(""), None);
    assert_eq!(parse_fabrics_reply("instance=x"), None);
}

/// Records the options it is given and answers with `reply` or fails with `errno`.
#[derive(Debug, Default)]
struct FakeFabrics {
    seen: std::sync::Mutex<Vec<String>>,
    reply: String,
    errno: Option<i32>,
}

impl Fabrics for FakeFabrics {
    fn add_ctrl(&self, options: &ConnectOptions) -> io::Result<String> {
        self.seen.lock().unwrap().push(options.expose().to_string());
        match self.errno {
            Some(n) => Err(io::Error::from_raw_os_error(n)),
            None => Ok(self.reply.clone()),
        }
    }
}

#[test]
fn connect_with_keys_names_the_controller_and_hides_secrets_in_errors() {
    let k = keys();
    let f = FakeFabrics {
        reply: "instance=7,cntlid=2\n".into(),
        ..FakeFabrics::default()
    };
    assert_eq!(
        connect_with_keys(&f, &target(), "h", None, &k).unwrap(),
        "nvme7"
    );
    assert!(f.seen.lock().unwrap()[0].contains(k.ctrl.expose()));
    // ECONNREFUSED from the kernel.
    let f = FakeFabrics {
        errno: Some(111),
        ..FakeFabrics::default()
    };
    let e = connect_with_keys(&f, &target(), "h", None, &k).unwrap_err();
    let msg = e.chain();
    assert!(
        msg.contains("authenticated connect to nqn.2021-03.com.alipay.ob:uuid:u1"),
        "{msg}"
    );
    assert!(msg.contains("dhchap_secret=***"), "{msg}");
    assert!(msg.contains("Secret holds the keys"), "{msg}");
    assert_no_secret(&msg, &k);
    assert_no_secret(&format!("{e:?}"), &k);
    let f = FakeFabrics {
        reply: "garbage,dhchap_secret=oops".into(),
        ..FakeFabrics::default()
    };
    let e = connect_with_keys(&f, &target(), "h", None, &k).unwrap_err();
    assert!(!e.to_string().contains("oops"), "{e}");
}

#[test]
fn fabrics_device_writes_once_and_reads_the_reply() {
    let d = tempfile::tempdir().unwrap();
    let missing = FabricsDevice::new(d.path().join("nvme-fabrics"));
    let k = keys();
    let o = connect_options(&target(), "h", None, &k).unwrap();
    let e = missing.add_ctrl(&o).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    assert!(e.to_string().contains("modprobe nvme-tcp"), "{e}");
    // A FIFO opened read-write gives back what was written: one write, then one read
    // on the same file, like the kernel's device. Its "reply" has no instance.
    let fifo = d.path().join("fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        println!("SKIP fifo part: mkfifo is not available");
        return;
    }
    let dev = FabricsDevice::new(&fifo);
    let short = ConnectOptions("instance=4,cntlid=9".into());
    assert_eq!(dev.add_ctrl(&short).unwrap(), "instance=4,cntlid=9");
    let e = connect_with_keys(&dev, &target(), "h", None, &k).unwrap_err();
    assert_eq!(e.kind(), crate::error::ErrorKind::Internal);
    assert!(e.to_string().contains("no controller instance"), "{e}");
    assert_no_secret(&e.to_string(), &k);
}

#[test]
fn the_no_secrets_hint_names_the_storage_class_parameters() {
    let h = no_secrets_hint();
    assert!(
        h.contains("csi.storage.k8s.io/node-stage-secret-name: liteio-auth-${pv.name}"),
        "{h}"
    );
    assert!(
        h.contains("csi.storage.k8s.io/node-stage-secret-namespace: obnvmf"),
        "{h}"
    );
}

#[test]
fn host_ids_are_read_when_present() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("hostid");
    assert_eq!(host_id(&p), None);
    fs::write(&p, "\n").unwrap();
    assert_eq!(host_id(&p), None);
    fs::write(&p, "3f1c9a2e-0000-4000-8000-000000000001\n").unwrap();
    assert_eq!(
        host_id(&p).as_deref(),
        Some("3f1c9a2e-0000-4000-8000-000000000001")
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
fn a_gone_volumes_controllers_are_deleted_and_no_other() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    // Two paths of the gone volume's subsystem, one of another volume's.
    ctrl(r, "nvme0", "s1", "nqn.gone", &[]);
    ctrl(r, "nvme1", "s2", "nqn.other", &[]);
    ctrl(r, "nvme2", "s1", "nqn.gone", &[]);
    for c in ["nvme0", "nvme1", "nvme2"] {
        fs::write(r.join("class/nvme").join(c).join("delete_controller"), "").unwrap();
    }
    // A third path the kernel removed while we looked: its attribute is gone.
    ctrl(r, "nvme3", "s1", "nqn.gone", &[]);
    let mut deleted = delete_controllers(r, "nqn.gone").unwrap();
    deleted.sort();
    assert_eq!(deleted, ["nvme0", "nvme2"]);
    let written = |c: &str| {
        fs::read_to_string(r.join("class/nvme").join(c).join("delete_controller")).unwrap()
    };
    assert_eq!(written("nvme0"), "1");
    assert_eq!(written("nvme2"), "1");
    assert_eq!(
        written("nvme1"),
        "",
        "another subsystem's controller was touched"
    );
    assert!(delete_controllers(r, "nqn.none").unwrap().is_empty());
    assert!(
        delete_controllers(Path::new("/nonexistent"), "nqn.gone")
            .unwrap()
            .is_empty()
    );
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

/// A controller `nvme3` in a fake sysfs whose secret attributes show `host` and `ctrl`
/// the way the kernel does (`<secret>\n`, or `none\n`); returns its directory.
fn auth_ctrl(root: &Path, host: &str, ctrl_secret: &str) -> PathBuf {
    ctrl(root, "nvme3", "SN3", "nqn.a", &["nvme3n1"]);
    let d = root.join("class/nvme/nvme3");
    fs::write(d.join(ATTR_DHCHAP_SECRET), format!("{host}\n")).unwrap();
    fs::write(d.join(ATTR_DHCHAP_CTRL_SECRET), format!("{ctrl_secret}\n")).unwrap();
    d
}

/// Sets the modification time of every secret attribute to a fixed past instant, so that
/// a later write shows.
fn age(dir: &Path) -> std::time::SystemTime {
    let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    for a in [ATTR_DHCHAP_SECRET, ATTR_DHCHAP_CTRL_SECRET] {
        fs::File::options()
            .write(true)
            .open(dir.join(a))
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    old
}

fn mtime(p: &Path) -> std::time::SystemTime {
    fs::metadata(p).unwrap().modified().unwrap()
}

#[test]
fn controller_keys_are_those_the_controller_holds() {
    let d = tempfile::tempdir().unwrap();
    let k = keys();
    let dir = auth_ctrl(d.path(), k.host.expose(), k.ctrl.expose());
    assert_eq!(controller_keys(d.path(), "nvme3").unwrap(), Some(k.clone()));
    // Connected without keys, or a kernel without in-band authentication: no keys.
    auth_ctrl(d.path(), NO_SECRET, NO_SECRET);
    assert_eq!(controller_keys(d.path(), "nvme3").unwrap(), None);
    fs::remove_file(dir.join(ATTR_DHCHAP_SECRET)).unwrap();
    fs::remove_file(dir.join(ATTR_DHCHAP_CTRL_SECRET)).unwrap();
    assert_eq!(controller_keys(d.path(), "nvme3").unwrap(), None);
    // A masked or one-sided content is an error that names the attribute, not the value.
    auth_ctrl(d.path(), "DHHC-1:00:********:", k.ctrl.expose());
    let e = controller_keys(d.path(), "nvme3").unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::FailedPrecondition);
    assert!(e.to_string().contains(ATTR_DHCHAP_SECRET), "{e}");
    auth_ctrl(d.path(), k.host.expose(), NO_SECRET);
    let e = controller_keys(d.path(), "nvme3").unwrap_err();
    assert!(!e.to_string().contains(k.host.expose()), "{e}");
}

#[test]
fn refresh_keys_writes_only_what_changed() {
    let d = tempfile::tempdir().unwrap();
    let k1 = keys();
    let dir = auth_ctrl(d.path(), k1.host.expose(), k1.ctrl.expose());
    // The keys the controller was connected with: nothing to write.
    let old = age(&dir);
    assert!(refresh_keys(d.path(), "nvme3", &k1).unwrap().is_empty());
    assert_eq!(mtime(&dir.join(ATTR_DHCHAP_SECRET)), old);
    assert_eq!(mtime(&dir.join(ATTR_DHCHAP_CTRL_SECRET)), old);
    // Rotated keys: both attributes get the new secret, as is (no newline).
    let k2 = keys();
    assert_eq!(
        refresh_keys(d.path(), "nvme3", &k2).unwrap(),
        vec![ATTR_DHCHAP_SECRET, ATTR_DHCHAP_CTRL_SECRET]
    );
    assert_eq!(
        fs::read_to_string(dir.join(ATTR_DHCHAP_SECRET)).unwrap(),
        k2.host.expose()
    );
    assert_eq!(
        fs::read_to_string(dir.join(ATTR_DHCHAP_CTRL_SECRET)).unwrap(),
        k2.ctrl.expose()
    );
    // The next republish with the same keys writes nothing.
    let old = age(&dir);
    assert!(refresh_keys(d.path(), "nvme3", &k2).unwrap().is_empty());
    assert_eq!(mtime(&dir.join(ATTR_DHCHAP_SECRET)), old);
    assert_eq!(mtime(&dir.join(ATTR_DHCHAP_CTRL_SECRET)), old);
    // Only the controller key changed: only its attribute is written.
    let k3 = VolumeKeys {
        ctrl: k1.ctrl.clone(),
        ..k2.clone()
    };
    assert_eq!(
        refresh_keys(d.path(), "nvme3", &k3).unwrap(),
        vec![ATTR_DHCHAP_CTRL_SECRET]
    );
    assert_eq!(mtime(&dir.join(ATTR_DHCHAP_SECRET)), old);
    assert_ne!(mtime(&dir.join(ATTR_DHCHAP_CTRL_SECRET)), old);
    assert_eq!(
        fs::read_to_string(dir.join(ATTR_DHCHAP_CTRL_SECRET)).unwrap(),
        k1.ctrl.expose()
    );
}

#[test]
fn refresh_keys_writes_over_a_content_that_is_no_secret() {
    // A kernel that masked the secret would show something else: write, never skip.
    let d = tempfile::tempdir().unwrap();
    let k = keys();
    let dir = auth_ctrl(d.path(), "********", "DHHC-1:00:garbage:");
    assert_eq!(
        refresh_keys(d.path(), "nvme3", &k).unwrap(),
        vec![ATTR_DHCHAP_SECRET, ATTR_DHCHAP_CTRL_SECRET]
    );
    assert_eq!(
        fs::read_to_string(dir.join(ATTR_DHCHAP_SECRET)).unwrap(),
        k.host.expose()
    );
}

#[test]
fn refresh_keys_errors_name_the_attribute_and_hold_no_secret() {
    let d = tempfile::tempdir().unwrap();
    let k = keys();
    // A kernel without in-band authentication has no such attribute.
    ctrl(d.path(), "nvme3", "SN3", "nqn.a", &["nvme3n1"]);
    let e = refresh_keys(d.path(), "nvme3", &k).unwrap_err();
    assert_eq!(e.kind(), crate::error::ErrorKind::FailedPrecondition);
    let msg = e.chain();
    assert!(
        msg.starts_with(&format!(
            "{}: does not exist",
            d.path().join("class/nvme/nvme3/dhchap_secret").display()
        )),
        "{msg}"
    );
    assert!(msg.contains("CONFIG_NVME_HOST_AUTH"), "{msg}");
    assert!(msg.contains("Linux 6.0"), "{msg}");
    assert!(
        !d.path().join("class/nvme/nvme3/dhchap_secret").exists(),
        "a missing attribute must not be created"
    );
    assert_no_secret(&msg, &k);
    // A controller connected without keys shows `none`: nothing is written.
    let dir = auth_ctrl(d.path(), NO_SECRET, NO_SECRET);
    let e = refresh_keys(d.path(), "nvme3", &k).unwrap_err();
    let msg = e.chain();
    assert!(
        msg.starts_with(&format!(
            "{}: reads none",
            dir.join(ATTR_DHCHAP_SECRET).display()
        )),
        "{msg}"
    );
    assert!(
        msg.contains("nvme3 was connected without DH-HMAC-CHAP"),
        "{msg}"
    );
    assert_eq!(
        fs::read_to_string(dir.join(ATTR_DHCHAP_SECRET)).unwrap(),
        "none\n"
    );
    assert_no_secret(&msg, &k);
    // An attribute that cannot be read.
    let other = keys();
    auth_ctrl(d.path(), other.host.expose(), other.ctrl.expose());
    fs::remove_file(dir.join(ATTR_DHCHAP_CTRL_SECRET)).unwrap();
    fs::create_dir(dir.join(ATTR_DHCHAP_CTRL_SECRET)).unwrap();
    let e = refresh_keys(d.path(), "nvme3", &k).unwrap_err();
    let msg = e.chain();
    assert!(
        msg.starts_with(&format!(
            "read {}: ",
            dir.join(ATTR_DHCHAP_CTRL_SECRET).display()
        )),
        "{msg}"
    );
    assert_no_secret(&msg, &k);
    assert_no_secret(&msg, &other);
    assert_no_secret(&format!("{e:?}"), &k);
    // The host key was written before the failure; a retry writes only what differs.
    assert_eq!(
        fs::read_to_string(dir.join(ATTR_DHCHAP_SECRET)).unwrap(),
        k.host.expose()
    );
}

#[test]
fn host_capabilities_follow_the_kernel_config() {
    let d = tempfile::tempdir().unwrap();
    let (boot, mods, sysm) = (
        d.path().join("boot"),
        d.path().join("lib"),
        d.path().join("sys"),
    );
    std::fs::create_dir_all(&boot).unwrap();
    let fabrics = d.path().join("fabrics");
    // Debian 12's 6.1: dhchap_secret listed, built without authentication, no tls.
    std::fs::write(
        &fabrics,
        "instance=-1,transport=%s,dhchap_secret=%s,dhchap_ctrl_secret=%s\n",
    )
    .unwrap();
    std::fs::write(
        boot.join("config-6.1.0-57-amd64"),
        "CONFIG_NVME_TCP=m\n# CONFIG_NVME_AUTH is not set\n",
    )
    .unwrap();
    let c = host_capabilities("6.1.0-57-amd64", &fabrics, &boot, &mods, &sysm);
    assert!(!c.dhchap && !c.tls, "{c:?}");
    let why = c.auth_refusal().unwrap();
    assert!(
        why.contains("6.1.0-57-amd64") && why.contains("CONFIG_NVME_AUTH"),
        "{why}"
    );
    // Debian 12's backports 6.12: host authentication and TLS.
    std::fs::write(
        &fabrics,
        "instance=-1,transport=%s,tls_key=%d,dhchap_secret=%s,tls\n",
    )
    .unwrap();
    std::fs::write(
        boot.join("config-6.12.95+deb12-amd64"),
        "CONFIG_NVME_AUTH=m\nCONFIG_NVME_HOST_AUTH=y\n",
    )
    .unwrap();
    let c = host_capabilities("6.12.95+deb12-amd64", &fabrics, &boot, &mods, &sysm);
    assert!(c.dhchap && c.tls && c.auth_refusal().is_none(), "{c:?}");
    // 6.7+ with the target's CONFIG_NVME_AUTH only: the host cannot.
    std::fs::write(
        boot.join("config-6.8.0"),
        "CONFIG_NVME_AUTH=m\n# CONFIG_NVME_HOST_AUTH is not set\n",
    )
    .unwrap();
    assert!(!host_capabilities("6.8.0", &fabrics, &boot, &mods, &sysm).dhchap);
    // 6.0 to 6.6: CONFIG_NVME_AUTH is the host's.
    std::fs::write(boot.join("config-6.5.0"), "CONFIG_NVME_AUTH=y\n").unwrap();
    assert!(host_capabilities("6.5.0", &fabrics, &boot, &mods, &sysm).dhchap);
    // No config: the module decides.
    let common = mods.join("6.9.0/kernel/drivers/nvme/common");
    assert!(!host_capabilities("6.9.0", &fabrics, &boot, &mods, &sysm).dhchap);
    std::fs::create_dir_all(&common).unwrap();
    std::fs::write(common.join("nvme-auth.ko.xz"), "").unwrap();
    assert!(host_capabilities("6.9.0", &fabrics, &boot, &mods, &sysm).dhchap);
}

#[test]
fn unreachable_targets_are_told_apart() {
    let t = SpdkTarget {
        address: "127.10.1.1".into(),
        svc_id: "4999".into(),
        subsys_nqn: "nqn.x".into(),
        ..SpdkTarget::default()
    };
    let cmd = |stderr: &str| CsiError::Command {
        command: "nvme connect".into(),
        status: "exit 1".into(),
        stderr: stderr.into(),
    };
    let e = connect_failure(
        &t,
        cmd("Failed to write to /dev/nvme-fabrics: Connection refused"),
    );
    assert_eq!(e.kind(), crate::error::ErrorKind::Unavailable);
    assert!(
        e.to_string().contains("127.10.1.1:4999") && e.to_string().contains("refused"),
        "{e}"
    );
    let e = connect_failure(
        &t,
        cmd("Failed to write to /dev/nvme-fabrics: Connection timed out"),
    );
    assert!(e.to_string().contains("timed out"), "{e}");
    let e = connect_failure(
        &t,
        cmd("Failed to write to /dev/nvme-fabrics: Input/output error"),
    );
    assert!(
        matches!(e, CsiError::Command { .. }),
        "an I/O error is neither a reachability nor a key failure"
    );
}

#[test]
fn key_failures_are_unauthenticated_and_say_what_to_check() {
    let t = SpdkTarget {
        address: "127.10.1.1".into(),
        svc_id: "4999".into(),
        subsys_nqn: "nqn.x".into(),
        ..SpdkTarget::default()
    };
    // The CLI's words without keys (ENOKEY).
    let e = connect_failure(
        &t,
        CsiError::Command {
            command: "nvme connect".into(),
            status: "exit 1".into(),
            stderr: "Failed to write to /dev/nvme-fabrics: Required key not available".into(),
        },
    );
    assert_eq!(e.kind(), crate::error::ErrorKind::Unauthenticated);
    assert_eq!(e.kind().code(), tonic::Code::Unauthenticated);
    assert!(matches!(
        e,
        CsiError::Unauthenticated {
            reason: "keys_required",
            ..
        }
    ));
    assert!(
        e.to_string().contains("nqn.x")
            && e.to_string()
                .contains(auth::SC_PARAM_NODE_STAGE_SECRET_NAME),
        "{e}"
    );
    // The fabrics device's errno with keys (EKEYREJECTED).
    let e = connect_failure(
        &t,
        CsiError::io("authenticated connect", io::Error::from_raw_os_error(129)),
    );
    assert_eq!(e.kind(), crate::error::ErrorKind::Unauthenticated);
    assert!(matches!(
        e,
        CsiError::Unauthenticated {
            reason: "keys_rejected",
            ..
        }
    ));
    assert!(
        e.to_string().contains("127.10.1.1:4999") && e.to_string().contains("Secret"),
        "{e}"
    );
}
