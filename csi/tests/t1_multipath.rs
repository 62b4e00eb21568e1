//! T1: the node's half of a migration switch-over on recorded host state: a sysfs tree of a
//! host with the source path, the destination path and another volume's controller, and
//! `nvme list-subsys -o json` of nvme-cli 1 and 2 (fixtures under `tests/fixtures/multipath/`).
//! The fabrics device is a fake that records the options string it was given.
//!
//! The switch-over itself runs against the real kernel in `tests/cluster/tests/t4_kernel_migration.rs`
//! (Debian's 6.12 in a VM: second path with the volume's keys, the source's path dropped).
//! What stays here is what that kernel cannot be made to show on cue: nvme-cli 1's output
//! (Debian 12 ships nvme-cli 2), a path caught in the kernel's `deleting` state at the moment
//! of a connect, the guard that never deletes a subsystem's last path, and a refused connect's
//! message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/sysfs.rs"]
mod recorded;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use liteio_api::auth::VolumeKeys;
use liteio_api::migration::VolumeInfo;
use liteio_api::{SpdkTarget, VolumeMigration, VolumeMigrationSpec, keys};
use liteio_csi::ErrorKind;
use liteio_csi::multipath::{self, HostPath, PathConnect};
use liteio_csi::nvme::{ConnectOptions, Fabrics};

const NQN: &str = "nqn.2021-03.com.alipay.ob:uuid:5e0c7d1a-2b3c-4d5e-8f90-a1b2c3d4e5f6";
const OTHER: &str = "nqn.2021-03.com.alipay.ob:uuid:0b9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a11";
const HOST: &str = "nqn.2021-03.com.alipay.host:uuid:node-3";
const HOST_ID: &str = "6b1c4f0e-3d2a-4e5b-9c8d-7f6e5d4c3b2a";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/multipath")
}

/// A writable copy of the recorded sysfs tree, without the controllers in `drop`.
fn sysfs(drop: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    recorded::copy_two_paths(dir.path(), drop);
    dir
}

fn set_state(sysfs: &Path, ctrl: &str, state: &str) {
    std::fs::write(
        sysfs.join("class/nvme").join(ctrl).join("state"),
        format!("{state}\n"),
    )
    .unwrap();
}

fn target(address: &str, port: &str) -> SpdkTarget {
    SpdkTarget {
        subsys_nqn: NQN.into(),
        trans_type: "TCP".into(),
        address: address.into(),
        svc_id: port.into(),
        addr_fam: "IPv4".into(),
        sn: "5e0c7d1a2b3c4d5e8f90".into(),
        ns_uuid: "5e0c7d1a-2b3c-4d5e-8f90-a1b2c3d4e5f6".into(),
        bdev_name: "lvs/pvc".into(),
    }
}

fn volume_keys() -> VolumeKeys {
    VolumeKeys::generate(false).unwrap()
}

/// A fabrics device that answers with controller instance `instance` and keeps the options
/// strings it was given.
#[derive(Debug)]
struct FakeFabrics {
    instance: u32,
    seen: Mutex<Vec<String>>,
}

impl FakeFabrics {
    fn new(instance: u32) -> Self {
        Self {
            instance,
            seen: Mutex::new(Vec::new()),
        }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

impl Fabrics for FakeFabrics {
    fn add_ctrl(&self, options: &ConnectOptions) -> io::Result<String> {
        self.seen.lock().unwrap().push(options.expose().to_string());
        Ok(format!("instance={},cntlid=36865\n", self.instance))
    }
}

#[test]
fn list_subsys_of_both_nvme_cli_versions() {
    let v2 = std::fs::read_to_string(fixtures().join("list-subsys-nvme-cli-2.json")).unwrap();
    let p = multipath::list_subsys_paths(&v2, NQN).unwrap();
    assert_eq!(p.len(), 2);
    assert_eq!(
        p[1],
        HostPath {
            controller: "nvme2".into(),
            transport: "tcp".into(),
            traddr: "10.0.0.13".into(),
            trsvcid: "4430".into(),
            state: "deleting".into(),
        }
    );
    assert_eq!(multipath::list_subsys_paths(&v2, OTHER).unwrap().len(), 1);

    let v1 = std::fs::read_to_string(fixtures().join("list-subsys-nvme-cli-1.json")).unwrap();
    let p = multipath::list_subsys_paths(&v1, NQN).unwrap();
    let names: Vec<_> = p
        .iter()
        .map(|p| (p.controller.as_str(), p.trsvcid.as_str()))
        .collect();
    assert_eq!(names, [("nvme0", "4421"), ("nvme2", "4430")]);
    let other = multipath::list_subsys_paths(&v1, OTHER).unwrap();
    assert_eq!(other.len(), 1);
    assert_eq!(other[0].controller, "nvme1");

    assert!(multipath::list_subsys_paths("[]", NQN).unwrap().is_empty());
    assert!(multipath::list_subsys_paths("No NVMe subsystems", NQN).is_err());
    assert_eq!(
        multipath::list_subsys_argv(),
        ["nvme", "list-subsys", "-o", "json"]
    );
}

#[test]
fn second_path_connects_once_with_the_volume_keys() {
    // The host has only the source's path (nvme0) and another volume's controller.
    let dir = sysfs(&["nvme2"]);
    let fabrics = FakeFabrics::new(2);
    let dst = target("10.0.0.13", "4430");
    let keys = volume_keys();
    let (host_secret, ctrl_secret) = (keys.host.expose(), keys.ctrl.expose());
    let r = multipath::connect_second_path(
        &fabrics,
        dir.path(),
        &dst,
        HOST,
        Some(HOST_ID),
        Some(&keys),
    )
    .unwrap();
    assert_eq!(r, PathConnect::Connected("nvme2".into()));
    let seen = fabrics.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0],
        format!(
            "nqn={NQN},transport=tcp,traddr=10.0.0.13,trsvcid=4430,hostnqn={HOST},hostid={HOST_ID},\
             dhchap_secret={host_secret},dhchap_ctrl_secret={ctrl_secret},reconnect_delay=1,ctrl_loss_tmo=600"
        )
    );
    // What logs and errors show of it has no secret.
    let opts = multipath::path_options(&dst, HOST, Some(HOST_ID), Some(&keys)).unwrap();
    assert!(!opts.redacted().contains(host_secret) && !format!("{opts:?}").contains(ctrl_secret));

    // Once the kernel shows the new controller, connecting again does nothing.
    let again = sysfs(&[]);
    let r = multipath::connect_second_path(
        &fabrics,
        again.path(),
        &dst,
        HOST,
        Some(HOST_ID),
        Some(&keys),
    )
    .unwrap();
    assert_eq!(r, PathConnect::AlreadyConnected("nvme2".into()));
    assert_eq!(fabrics.seen().len(), 1);

    // A controller the kernel is deleting is no path: connect again.
    set_state(again.path(), "nvme2", "deleting (no IO)");
    let r = multipath::connect_second_path(&fabrics, again.path(), &dst, HOST, None, None).unwrap();
    assert_eq!(r, PathConnect::Connected("nvme2".into()));
    assert_eq!(
        fabrics.seen()[1],
        format!(
            "nqn={NQN},transport=tcp,traddr=10.0.0.13,trsvcid=4430,hostnqn={HOST},reconnect_delay=1,ctrl_loss_tmo=600"
        )
    );

    // The same with the paths nvme list-subsys reports (there nvme2 is being deleted).
    let v2 = std::fs::read_to_string(fixtures().join("list-subsys-nvme-cli-2.json")).unwrap();
    let paths = multipath::list_subsys_paths(&v2, NQN).unwrap();
    let r = multipath::connect_path(&fabrics, &paths, &dst, HOST, None, None).unwrap();
    assert_eq!(r, PathConnect::Connected("nvme2".into()));
    let src = target("10.0.0.12", "4421");
    let r = multipath::connect_path(&fabrics, &paths, &src, HOST, None, None).unwrap();
    assert_eq!(r, PathConnect::AlreadyConnected("nvme0".into()));
    assert_eq!(fabrics.seen().len(), 3);
}

#[test]
fn a_failed_connect_names_the_path_without_secrets() {
    #[derive(Debug)]
    struct Refusing;
    impl Fabrics for Refusing {
        fn add_ctrl(&self, _: &ConnectOptions) -> io::Result<String> {
            Err(io::Error::from_raw_os_error(111))
        }
    }
    let dir = sysfs(&["nvme2"]);
    let keys = volume_keys();
    let e = multipath::connect_second_path(
        &Refusing,
        dir.path(),
        &target("10.0.0.13", "4430"),
        HOST,
        None,
        Some(&keys),
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("10.0.0.13:4430"), "{msg}");
    assert!(
        !msg.contains(keys.host.expose()) && !msg.contains(keys.ctrl.expose()),
        "{msg}"
    );
}

#[test]
fn the_old_path_is_deleted_through_sysfs_but_never_the_last_one() {
    let dir = sysfs(&[]);
    let ctrl = |c: &str| {
        dir.path()
            .join("class/nvme")
            .join(c)
            .join("delete_controller")
    };
    let r = multipath::disconnect_path(dir.path(), NQN, "10.0.0.12", "4421").unwrap();
    assert_eq!(r.as_deref(), Some("nvme0"));
    assert_eq!(std::fs::read_to_string(ctrl("nvme0")).unwrap(), "1");
    // The other paths and the other volume's controller are left alone.
    assert_eq!(std::fs::read_to_string(ctrl("nvme2")).unwrap(), "");
    assert_eq!(std::fs::read_to_string(ctrl("nvme1")).unwrap(), "");

    // The kernel now deletes nvme0: again is a no-op, and so is an unknown address.
    set_state(dir.path(), "nvme0", "deleting");
    std::fs::write(ctrl("nvme0"), "").unwrap();
    assert_eq!(
        multipath::disconnect_path(dir.path(), NQN, "10.0.0.12", "4421").unwrap(),
        None
    );
    assert_eq!(
        multipath::disconnect_path(dir.path(), NQN, "10.0.0.99", "4421").unwrap(),
        None
    );
    assert_eq!(std::fs::read_to_string(ctrl("nvme0")).unwrap(), "");

    // nvme2 is the last live path now: refused.
    let e = multipath::disconnect_path(dir.path(), NQN, "10.0.0.13", "4430").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FailedPrecondition, "{e}");
    assert_eq!(std::fs::read_to_string(ctrl("nvme2")).unwrap(), "");
}

#[test]
fn a_migration_concerns_the_node_of_its_host() {
    let info = |node: &str, t: SpdkTarget| VolumeInfo {
        namespace: "obnvmf".into(),
        name: format!("vol-{node}"),
        target_node_id: node.into(),
        host_node_id: "node-3".into(),
        spdk: t,
    };
    let mut m = VolumeMigration::new(
        "mig-1",
        VolumeMigrationSpec {
            source_volume: info("node-1", target("10.0.0.12", "4421")),
            dest_volume: info("node-2", target("10.0.0.13", "4430")),
            ..VolumeMigrationSpec::default()
        },
    );
    let p = multipath::host_migration(&m, "node-3").unwrap();
    assert_eq!(p.nqn, NQN);
    assert_eq!(
        (p.old.address.as_str(), p.new.address.as_str()),
        ("10.0.0.12", "10.0.0.13")
    );
    assert!(multipath::host_migration(&m, "node-1").is_none());

    // The label names the host when present.
    m.metadata.labels = Some(BTreeMap::from([(
        keys::labels::MIGRATE_HOST_NODE_ID.to_string(),
        "node-4".to_string(),
    )]));
    assert!(multipath::host_migration(&m, "node-3").is_none());
    assert!(multipath::host_migration(&m, "node-4").is_some());

    // A destination under another NQN, or not exported yet, is no second path.
    m.spec.dest_volume.spdk.subsys_nqn = OTHER.into();
    assert!(multipath::host_migration(&m, "node-4").is_none());
    m.spec.dest_volume.spdk = SpdkTarget::default();
    assert!(multipath::host_migration(&m, "node-4").is_none());
}
