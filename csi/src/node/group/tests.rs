//! Unit tests of multi-disk volumes on the node: LVM assembly and its undoing, expansion,
//! deactivation, the record, data control checks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use std::path::Path;

use liteio_api::SpdkTarget;

use crate::cmd::{Output, ScriptedRunner};
use crate::config::DriverConfig;
use crate::lvm::Names;
use liteio_api::datacontrol::{AntstorDataControlSpec, RaidLevel};
use std::collections::HashMap;
use std::fs;
use std::sync::Arc;
use std::time::Duration;

const ID: &str = "dc-0b9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a11";

fn cfg(dir: &Path) -> Arc<DriverConfig> {
    let mut c = DriverConfig::new("node-1");
    c.sysfs_root = dir.join("sys");
    c.hostnqn_path = dir.join("etc/nvme/hostnqn");
    c.mountinfo_path = dir.join("mountinfo");
    fs::write(&c.mountinfo_path, "").unwrap();
    c.device_timeout = Duration::from_millis(300);
    Arc::new(c)
}

fn names() -> Names {
    lvm::names("pvc-1", ID)
}

fn members() -> Vec<(String, PathBuf)> {
    vec![
        ("pvc-1-aaaa".into(), PathBuf::from("/dev/nvme1n1")),
        ("pvc-1-bbbb".into(), PathBuf::from("/dev/nvme2n1")),
    ]
}

fn report(kind: &str, rows: &[String]) -> String {
    format!(
        "  {{\n      \"report\": [\n          {{\n              \"{kind}\": [\n{}\n              ]\n          }}\n      ]\n  }}\n",
        rows.join(",\n")
    )
}

fn pvs(rows: &[(&str, &str, u64)]) -> Output {
    Output::ok(report(
            "pv",
            &rows
                .iter()
                .map(|(d, vg, pe)| format!("{{\"pv_name\":\"{d}\", \"pv_uuid\":\"u-{d}\", \"vg_name\":\"{vg}\", \"pv_pe_count\":\"{pe}\", \"pv_pe_alloc_count\":\"0\", \"dev_size\":\"67108864\"}}"))
                .collect::<Vec<_>>(),
        ))
}

/// PVs whose extents the LV uses, all of them.
fn pvs_used(rows: &[(&str, &str, u64)]) -> Output {
    Output::ok(report(
            "pv",
            &rows
                .iter()
                .map(|(d, vg, pe)| format!("{{\"pv_name\":\"{d}\", \"pv_uuid\":\"u-{d}\", \"vg_name\":\"{vg}\", \"pv_pe_count\":\"{pe}\", \"pv_pe_alloc_count\":\"{pe}\", \"dev_size\":\"67108864\"}}"))
                .collect::<Vec<_>>(),
        ))
}

fn vgs(tag: &str) -> Output {
    Output::ok(report(
        "vg",
        &[format!(
            "{{\"vg_name\":\"pvc-1\", \"vg_uuid\":\"v\", \"vg_tags\":\"{tag}\", \"pv_count\":\"2\", \"vg_missing_pv_count\":\"0\", \"lv_count\":\"1\", \"vg_extent_size\":\"4194304\", \"vg_extent_count\":\"30\", \"vg_free_count\":\"0\"}}"
        )],
    ))
}

fn lvs(segtype: &str, stripes: u32, active: bool, dm_path: &Path) -> Output {
    let attr = if active { "-wi-a-----" } else { "-wi-------" };
    Output::ok(report(
        "lv",
        &[format!(
            "{{\"lv_name\":\"pvc-1\", \"vg_name\":\"pvc-1\", \"lv_uuid\":\"l\", \"lv_size\":\"125829120\", \"lv_path\":\"/dev/pvc-1/pvc-1\", \"lv_dm_path\":\"{}\", \"lv_attr\":\"{attr}\", \"segtype\":\"{segtype}\", \"stripes\":\"{stripes}\", \"stripe_size\":\"65536\"}}",
            dm_path.display()
        )],
    ))
}

fn empty(kind: &str) -> Output {
    Output::ok(report(kind, &[]))
}

/// The command names run, in order.
fn commands(r: &ScriptedRunner) -> Vec<String> {
    r.calls().iter().map(|c| c[0].clone()).collect()
}

#[test]
fn a_fresh_group_is_made_over_blank_members() {
    let d = tempfile::tempdir().unwrap();
    let dm = d.path().join("dm-node");
    fs::write(&dm, "").unwrap();
    let r = Arc::new(ScriptedRunner::new());
    r.on(
        &["lvm", "version"],
        Output::ok("  LVM version:     2.03.16(2) (2022-05-18)\n"),
    )
    .once(&["pvs"], empty("pv"))
    .on(
        &["pvs"],
        pvs(&[("/dev/nvme1n1", "pvc-1", 15), ("/dev/nvme2n1", "pvc-1", 16)]),
    )
    .on(&["vgs"], empty("vg"))
    .on(&["blkid"], Output::fail(2, ""))
    .on(&["pvcreate"], Output::ok(""))
    .on(&["vgcreate"], Output::ok(""))
    .on(&["lvcreate"], Output::ok(""))
    .on(&["lvs"], lvs("striped", 2, true, &dm));
    let host = Host::new(cfg(d.path()), r.clone());
    let a = host
        .assemble_lvm(&names(), Layout::Striped, &members())
        .unwrap();
    assert_eq!(a.device, dm);
    assert!(a.created_vg && !a.activated);
    assert_eq!(
        commands(&r),
        [
            "pvs", "vgs", "blkid", "blkid", "pvcreate", "lvm", "vgcreate", "pvs", "lvcreate", "lvs"
        ]
    );
    let lines = r.lines();
    assert!(
        lines[4].ends_with(" /dev/nvme1n1 /dev/nvme2n1"),
        "{}",
        lines[4]
    );
    // LVM 2.03.16: a VG only the CSI node activates.
    assert!(
            lines[6].ends_with(&format!(
                "--physicalextentsize 4m --addtag liteio.volume.{ID} --setautoactivation n pvc-1 /dev/nvme1n1 /dev/nvme2n1"
            )),
            "{}",
            lines[6]
        );
    // Equal stripes: twice the smaller member's 15 extents.
    assert!(
        lines[8].ends_with("-y -l 30 -i 2 -I 64k -n pvc-1 pvc-1 /dev/nvme1n1 /dev/nvme2n1"),
        "{}",
        lines[8]
    );
    // Every LVM command is confined to the two members.
    for c in r
        .calls()
        .iter()
        .filter(|c| c[0] != "blkid" && c[0] != "lvm")
    {
        assert_eq!(c[1], "--config");
        assert!(
            c[2].starts_with(
                "devices { filter = [ \"a|^/dev/nvme1n1$|\", \"a|^/dev/nvme2n1$|\", \"r|.*|\" ]"
            ),
            "{}",
            c[2]
        );
    }
}

#[test]
fn a_member_with_foreign_data_is_refused_before_anything_is_written() {
    let d = tempfile::tempdir().unwrap();
    let r = Arc::new(ScriptedRunner::new());
    r.on(&["pvs"], empty("pv"))
        .on(&["vgs"], empty("vg"))
        .on(
            &["blkid", "-p", "-o", "export", "/dev/nvme2n1"],
            Output::ok("DEVNAME=/dev/nvme2n1\nUUID=f3\nBLOCK_SIZE=4096\nTYPE=xfs\n"),
        )
        .on(&["blkid"], Output::fail(2, ""));
    let host = Host::new(cfg(d.path()), r.clone());
    let e = host
        .assemble_lvm(&names(), Layout::Linear, &members())
        .unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::FailedPrecondition);
    assert!(
        e.to_string()
            .starts_with("member device /dev/nvme2n1 (volume pvc-1-bbbb) carries a xfs signature"),
        "{e}"
    );
    assert_eq!(commands(&r), ["pvs", "vgs", "blkid", "blkid"]);
    // blkid failing otherwise is an error of its own, not "no signature".
    let r = Arc::new(ScriptedRunner::new());
    r.on(&["pvs"], empty("pv")).on(&["vgs"], empty("vg")).on(
        &["blkid"],
        Output::fail(4, "blkid: error: /dev/nvme1n1: Input/output error"),
    );
    let host = Host::new(cfg(d.path()), r.clone());
    let e = host
        .assemble_lvm(&names(), Layout::Linear, &members())
        .unwrap_err();
    assert!(e.to_string().contains("Input/output error"), "{e}");
    assert!(r.calls_to(&["pvcreate"]).is_empty());
}

#[test]
fn an_existing_group_is_only_activated() {
    let d = tempfile::tempdir().unwrap();
    let dm = d.path().join("dm-node");
    fs::write(&dm, "").unwrap();
    let tag = format!("liteio.volume.{ID}");
    let r = Arc::new(ScriptedRunner::new());
    // Another host made it; on this one the devices have other names.
    r.on(
        &["pvs"],
        pvs_used(&[("/dev/nvme1n1", "pvc-1", 15), ("/dev/nvme2n1", "pvc-1", 15)]),
    )
    .on(&["vgs"], vgs(&tag))
    .on(&["blkid"], Output::ok("TYPE=LVM2_member\n"))
    .once(&["lvs"], lvs("linear", 1, false, &dm))
    .on(&["vgchange"], Output::ok(""))
    .on(&["lvs"], lvs("linear", 1, true, &dm));
    let host = Host::new(cfg(d.path()), r.clone());
    let a = host
        .assemble_lvm(&names(), Layout::Linear, &members())
        .unwrap();
    assert!(a.activated && !a.created_vg && a.created_pvs.is_empty());
    assert_eq!(
        commands(&r),
        [
            "pvs", "vgs", "blkid", "blkid", "lvs", "pvs", "vgchange", "lvs"
        ]
    );
    assert!(r.lines()[6].ends_with("-a y pvc-1"), "{}", r.lines()[6]);
    // Active already (a restage): nothing changes.
    let r = Arc::new(ScriptedRunner::new());
    r.on(
        &["pvs"],
        pvs_used(&[("/dev/nvme1n1", "pvc-1", 15), ("/dev/nvme2n1", "pvc-1", 15)]),
    )
    .on(&["vgs"], vgs(&tag))
    .on(&["blkid"], Output::ok("TYPE=LVM2_member\n"))
    .on(&["lvs"], lvs("linear", 1, true, &dm));
    let host = Host::new(cfg(d.path()), r.clone());
    let a = host
        .assemble_lvm(&names(), Layout::Linear, &members())
        .unwrap();
    assert!(!a.activated);
    assert!(r.calls_to(&["vgchange"]).is_empty());
    // Made as linear, asked as raid0: refused, and the activation is undone.
    let r = Arc::new(ScriptedRunner::new());
    r.on(
        &["pvs"],
        pvs_used(&[("/dev/nvme1n1", "pvc-1", 15), ("/dev/nvme2n1", "pvc-1", 15)]),
    )
    .on(&["vgs"], vgs(&tag))
    .on(&["blkid"], Output::ok("TYPE=LVM2_member\n"))
    .once(&["lvs"], lvs("linear", 1, false, &dm))
    .on(&["vgchange"], Output::ok(""))
    .on(&["lvs"], lvs("linear", 1, true, &dm));
    let host = Host::new(cfg(d.path()), r.clone());
    let e = host
        .assemble_lvm(&names(), Layout::Striped, &members())
        .unwrap_err();
    assert!(
        e.to_string().contains("striped (raid0) over 2 members"),
        "{e}"
    );
    let changes: Vec<String> = r
        .calls_to(&["vgchange"])
        .iter()
        .map(|c| c[3..].join(" "))
        .collect();
    assert_eq!(changes, ["-a y pvc-1", "-a n pvc-1"]);
}

#[test]
fn members_added_by_an_expansion_extend_the_group_and_its_lv() {
    let d = tempfile::tempdir().unwrap();
    let dm = d.path().join("dm-node");
    fs::write(&dm, "").unwrap();
    let tag = format!("liteio.volume.{ID}");
    let mut three = members();
    three.push(("pvc-1-cccc".into(), PathBuf::from("/dev/nvme3n1")));
    let r = Arc::new(ScriptedRunner::new());
    // The VG holds the first two members; the third one is blank. After the vgextend the
    // third is a PV of it without an extent used: the LV grows over it.
    r.once(
            &["pvs"],
            pvs_used(&[("/dev/nvme1n1", "pvc-1", 15), ("/dev/nvme2n1", "pvc-1", 15)]),
        )
        .on(&["vgs"], vgs(&tag))
        .on(
            &["blkid", "-p", "-o", "export", "/dev/nvme3n1"],
            Output::fail(2, ""),
        )
        .on(&["blkid"], Output::ok("TYPE=LVM2_member\n"))
        .on(&["pvcreate"], Output::ok(""))
        .on(&["vgextend"], Output::ok(""))
        .once(&["lvs"], lvs("linear", 1, true, &dm))
        .once(
            &["pvs"],
            Output::ok(report(
                "pv",
                &[
                    "{\"pv_name\":\"/dev/nvme1n1\", \"vg_name\":\"pvc-1\", \"pv_pe_count\":\"15\", \"pv_pe_alloc_count\":\"15\"}".into(),
                    "{\"pv_name\":\"/dev/nvme2n1\", \"vg_name\":\"pvc-1\", \"pv_pe_count\":\"15\", \"pv_pe_alloc_count\":\"15\"}".into(),
                    "{\"pv_name\":\"/dev/nvme3n1\", \"vg_name\":\"pvc-1\", \"pv_pe_count\":\"9\", \"pv_pe_alloc_count\":\"0\"}".into(),
                ],
            )),
        )
        .on(&["lvextend"], Output::ok(""))
        .on(&["lvs"], lvs("linear", 1, true, &dm));
    let host = Host::new(cfg(d.path()), r.clone());
    let a = host.assemble_lvm(&names(), Layout::Linear, &three).unwrap();
    assert!(!a.activated && !a.created_vg);
    assert_eq!(
        commands(&r),
        [
            "pvs", "vgs", "blkid", "blkid", "blkid", "pvcreate", "vgextend", "lvs", "pvs",
            "lvextend", "lvs", "lvs"
        ]
    );
    let line = |cmd: &str| {
        r.calls_to(&[cmd])
            .first()
            .map(|c| c[3..].join(" "))
            .unwrap_or_default()
    };
    assert_eq!(line("pvcreate"), "/dev/nvme3n1");
    assert_eq!(line("vgextend"), "pvc-1 /dev/nvme3n1");
    assert_eq!(line("lvextend"), "-l +9 pvc-1/pvc-1 /dev/nvme3n1");
    // Every command is still confined to the members, the new one included.
    for c in r.calls_to(&["vgextend"]) {
        assert!(c[2].contains("\"a|^/dev/nvme3n1$|\""), "{}", c[2]);
    }

    // A vgextend that fails removes the PV it made, and nothing is extended.
    let r = Arc::new(ScriptedRunner::new());
    r.on(
        &["pvs"],
        pvs_used(&[("/dev/nvme1n1", "pvc-1", 15), ("/dev/nvme2n1", "pvc-1", 15)]),
    )
    .on(&["vgs"], vgs(&tag))
    .on(
        &["blkid", "-p", "-o", "export", "/dev/nvme3n1"],
        Output::fail(2, ""),
    )
    .on(&["blkid"], Output::ok("TYPE=LVM2_member\n"))
    .on(&["pvcreate"], Output::ok(""))
    .on(
        &["vgextend"],
        Output::fail(5, "  Cannot add physical volume"),
    )
    .on(&["pvremove"], Output::ok(""));
    let host = Host::new(cfg(d.path()), r.clone());
    let e = host
        .assemble_lvm(&names(), Layout::Linear, &three)
        .unwrap_err();
    assert!(e.to_string().contains("Cannot add physical volume"), "{e}");
    assert_eq!(
        commands(&r),
        [
            "pvs", "vgs", "blkid", "blkid", "blkid", "pvcreate", "vgextend", "pvremove"
        ]
    );
}

#[test]
fn a_failed_lvcreate_removes_the_group_it_made() {
    let d = tempfile::tempdir().unwrap();
    let r = Arc::new(ScriptedRunner::new());
    // The first member is an orphan PV of an earlier attempt: kept, not removed.
    r.once(&["pvs"], pvs(&[("/dev/nvme1n1", "", 0)]))
        .on(
            &["pvs"],
            pvs(&[("/dev/nvme1n1", "pvc-1", 15), ("/dev/nvme2n1", "pvc-1", 15)]),
        )
        .on(&["vgs"], empty("vg"))
        .on(
            &["blkid", "-p", "-o", "export", "/dev/nvme1n1"],
            Output::ok("TYPE=LVM2_member\n"),
        )
        .on(&["blkid"], Output::fail(2, ""))
        .on(&["pvcreate"], Output::ok(""))
        .on(&["vgcreate"], Output::ok(""))
        .on(
            &["lvcreate"],
            Output::fail(5, "  Volume group \"pvc-1\" has insufficient free space"),
        )
        .on(&["vgremove"], Output::ok(""))
        .on(&["pvremove"], Output::ok(""));
    let host = Host::new(cfg(d.path()), r.clone());
    let e = host
        .assemble_lvm(&names(), Layout::Linear, &members())
        .unwrap_err();
    assert!(e.to_string().contains("insufficient free space"), "{e}");
    assert_eq!(
        commands(&r),
        [
            "pvs", "vgs", "blkid", "blkid", "pvcreate", "lvm", "vgcreate", "pvs", "lvcreate",
            "vgremove", "pvremove"
        ]
    );
    let calls = r.calls();
    assert_eq!(calls[4][3..], ["/dev/nvme2n1"], "only the blank one");
    // LVM's version unknown: a VG without --setautoactivation, which older LVM refuses.
    assert!(
        !calls[6].iter().any(|a| a == "--setautoactivation"),
        "{:?}",
        calls[6]
    );
    assert_eq!(calls[9][3..], ["-y", "-f", "pvc-1"]);
    assert_eq!(
        calls[10][3..],
        ["/dev/nvme2n1"],
        "the orphan PV it found stays"
    );
}

/// A fake sysfs with the LV's device-mapper device `dm-3` and, when `members`, the two
/// member controllers.
fn sysfs_with(dir: &Path, dm_name: &str, members: bool) {
    let sys = dir.join("sys");
    let dm = sys.join("block/dm-3");
    fs::create_dir_all(dm.join("dm")).unwrap();
    fs::write(dm.join("dm/name"), format!("{dm_name}\n")).unwrap();
    for (i, sn) in [(1, "SN1"), (2, "SN2")] {
        fs::create_dir_all(dm.join("slaves").join(format!("nvme{i}n1"))).unwrap();
        let dev = sys.join(format!("block/nvme{i}n1/device"));
        fs::create_dir_all(&dev).unwrap();
        fs::write(dev.join("subsysnqn"), format!("nqn.m{i}\n")).unwrap();
        if members {
            let c = sys.join(format!("class/nvme/nvme{i}"));
            fs::create_dir_all(c.join(format!("nvme{i}n1"))).unwrap();
            fs::write(c.join("serial"), format!("{sn}\n")).unwrap();
            fs::write(c.join("subsysnqn"), format!("nqn.m{i}\n")).unwrap();
        }
    }
}

fn staged_members() -> Vec<StagedMember> {
    (1..=2)
        .map(|i| StagedMember {
            volume: format!("pvc-1-m{i}"),
            nvme: Some(SpdkTarget {
                subsys_nqn: format!("nqn.m{i}"),
                sn: format!("SN{i}"),
                svc_id: "4420".into(),
                address: "127.0.0.1".into(),
                trans_type: "TCP".into(),
                ..SpdkTarget::default()
            }),
            local: None,
        })
        .collect()
}

#[test]
fn deactivation_uses_lvm_and_falls_back_to_device_mapper() {
    let n = names();
    assert_eq!(n.dm_name(), "pvc--1-pvc--1");
    // Not active: nothing runs.
    let d = tempfile::tempdir().unwrap();
    let r = Arc::new(ScriptedRunner::new());
    let host = Host::new(cfg(d.path()), r.clone());
    host.deactivate_lvm(&n, &staged_members()).unwrap();
    assert!(r.calls().is_empty());
    // Active with its members: vgchange -an over them.
    sysfs_with(d.path(), &n.dm_name(), true);
    assert_eq!(
        dm_device(&d.path().join("sys"), &n.dm_name()).as_deref(),
        Some("dm-3")
    );
    assert_eq!(
        slave_nqns(&d.path().join("sys"), "dm-3"),
        ["nqn.m1", "nqn.m2"]
    );
    // The mount source LVM made without udev: a node named after the LV, found by name.
    let node = d.path().join("pvc--1-pvc--1");
    fs::write(&node, "").unwrap();
    assert_eq!(dm_of(&d.path().join("sys"), &node).as_deref(), Some("dm-3"));
    let other = d.path().join("sda1");
    fs::write(&other, "").unwrap();
    assert_eq!(dm_of(&d.path().join("sys"), &other), None);
    assert_eq!(
        dm_of(&d.path().join("sys"), &d.path().join("missing")),
        None
    );
    let gone = d.path().join("sys/block/dm-3");
    let r = Arc::new(ScriptedRunner::new());
    r.on_with(&["vgchange"], Output::ok(""), move |_| {
        let _ = fs::remove_dir_all(&gone);
    });
    let host = Host::new(cfg(d.path()), r.clone());
    host.deactivate_lvm(&n, &staged_members()).unwrap();
    assert_eq!(commands(&r), ["vgchange"]);
    assert!(r.lines()[0].ends_with("-a n pvc-1"));
    assert!(r.lines()[0].contains("a|^/dev/nvme1n1$|"));
    // Its members are gone: LVM cannot see the VG; the LV's device is removed directly.
    let d = tempfile::tempdir().unwrap();
    sysfs_with(d.path(), &n.dm_name(), false);
    let r = Arc::new(ScriptedRunner::new());
    r.on(&["dmsetup"], Output::ok(""));
    let host = Host::new(cfg(d.path()), r.clone());
    host.deactivate_lvm(&n, &staged_members()).unwrap();
    assert_eq!(r.lines(), ["dmsetup remove pvc--1-pvc--1"]);
    // Still open: the error says so, and is returned.
    let r = Arc::new(ScriptedRunner::new());
    r.on(
        &["dmsetup"],
        Output::fail(
            1,
            "device-mapper: remove ioctl on pvc--1-pvc--1  failed: Device or resource busy",
        ),
    );
    let host = Host::new(cfg(d.path()), r.clone());
    let e = host.deactivate_lvm(&n, &staged_members()).unwrap_err();
    assert!(e.to_string().contains("busy"), "{e}");
}

#[test]
fn the_record_holds_what_was_connected_and_no_secret() {
    let d = tempfile::tempdir().unwrap();
    let st = d.path().join("staging");
    assert_eq!(Staged::read(&st).unwrap(), None);
    let s = Staged {
        id: ID.into(),
        data_control: "pvc-1".into(),
        engine: PoolMode::KernelLVM,
        vg: "pvc-1".into(),
        lv: "pvc-1".into(),
        members: staged_members(),
    };
    s.write(&st).unwrap();
    assert_eq!(Staged::read(&st).unwrap().as_ref(), Some(&s));
    assert_eq!(s.names().unwrap(), names());
    let text = fs::read_to_string(st.join(RECORD_FILE)).unwrap();
    assert!(!text.contains("DHHC") && !text.contains("dhchap"), "{text}");
    assert_eq!(
        fs::read_dir(&st).unwrap().count(),
        1,
        "no temporary file left"
    );
    Staged::remove(&st).unwrap();
    Staged::remove(&st).unwrap();
    assert_eq!(fs::read_dir(&st).unwrap().count(), 0);
    fs::write(st.join(RECORD_FILE), "{").unwrap();
    let e = Staged::read(&st).unwrap_err();
    assert!(e.to_string().contains(RECORD_FILE), "{e}");
    // SpdkLVStore: no LVM names.
    let a = Staged {
        engine: PoolMode::SpdkLVStore,
        vg: String::new(),
        lv: String::new(),
        ..s
    };
    assert_eq!(a.names(), None);
}

#[test]
fn a_failed_stage_disconnects_what_it_connected_and_leaves_no_record() {
    let d = tempfile::tempdir().unwrap();
    let cfg = cfg(d.path());
    let sys = cfg.sysfs_root.clone();
    let r = Arc::new(ScriptedRunner::new());
    // The first member connects, the second's target refuses.
    r.on_with(
        &[
            "nvme",
            "connect",
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            "4420",
            "-n",
            "nqn.m1",
        ],
        Output::ok(""),
        move |_| {
            let c = sys.join("class/nvme/nvme1");
            fs::create_dir_all(c.join("nvme1n1")).unwrap();
            fs::write(c.join("serial"), "SN1\n").unwrap();
            fs::write(c.join("subsysnqn"), "nqn.m1\n").unwrap();
        },
    )
    .on(
        &["nvme", "connect"],
        Output::fail(
            1,
            "Failed to write to /dev/nvme-fabrics: Connection refused",
        ),
    )
    .on(&["nvme", "disconnect"], Output::ok(""));
    let host = Host::new(Arc::clone(&cfg), r.clone());
    let staging = d.path().join("staging");
    let plans: Vec<Attach> = staged_members()
        .iter()
        .filter_map(StagedMember::plan)
        .collect();
    let g = GroupStage {
        record: Staged {
            id: ID.into(),
            data_control: "pvc-1".into(),
            engine: PoolMode::KernelLVM,
            vg: "pvc-1".into(),
            lv: "pvc-1".into(),
            members: staged_members(),
        },
        lvm: Some((names(), Layout::Linear)),
        members: plans
            .into_iter()
            .enumerate()
            .map(|(i, plan)| MemberConnect {
                volume: format!("pvc-1-m{}", i + 1),
                plan,
                keys: None,
            })
            .collect(),
        staging: staging.clone(),
        access: Access::Block,
        fs: "ext4".into(),
        mkfs: String::new(),
        total_size: 1 << 30,
    };
    let e = host.stage_group(&g).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::Unavailable, "{e}");
    assert_eq!(
        r.calls_to(&["nvme", "disconnect"]),
        [crate::cmd::argv(&["nvme", "disconnect", "-n", "nqn.m1"])]
    );
    assert!(
        r.calls_to(&["pvs"]).is_empty(),
        "no LVM before every member is there"
    );
    assert_eq!(Staged::read(&staging).unwrap(), None);
}

#[test]
fn an_assembled_export_is_staged_and_unstaged_as_a_plain_remote_volume() {
    // SpdkLVStore: one connection to status.spdkTarget, no LVM; a raw-block stage.
    let d = tempfile::tempdir().unwrap();
    let cfg = cfg(d.path());
    let sys = cfg.sysfs_root.clone();
    let r = Arc::new(ScriptedRunner::new());
    r.on_with(&["nvme", "connect"], Output::ok(""), move |_| {
        let c = sys.join("class/nvme/nvme4");
        fs::create_dir_all(c.join("nvme4n1")).unwrap();
        fs::write(c.join("serial"), "SNDC\n").unwrap();
        fs::write(c.join("subsysnqn"), "nqn.dc\n").unwrap();
    })
    .on(&["nvme", "disconnect"], Output::ok(""));
    let host = Host::new(Arc::clone(&cfg), r.clone());
    let mut dc = dc(PoolMode::SpdkLVStore, "node-1");
    dc.status = Some(liteio_api::datacontrol::AntstorDataControlStatus {
        status: Some(VolumeStatus::Ready),
        spdk_target: Some(SpdkTarget {
            subsys_nqn: "nqn.dc".into(),
            sn: "SNDC".into(),
            address: "127.10.0.2".into(),
            svc_id: "4430".into(),
            trans_type: "TCP".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    let plan = assembled_target(&dc).unwrap();
    let staging = d.path().join("staging");
    let record = Staged {
        id: ID.into(),
        data_control: "pvc-1".into(),
        engine: PoolMode::SpdkLVStore,
        vg: String::new(),
        lv: String::new(),
        members: vec![StagedMember::of("pvc-1", &plan)],
    };
    let g = GroupStage {
        record: record.clone(),
        lvm: None,
        members: vec![MemberConnect {
            volume: "pvc-1".into(),
            plan,
            keys: None,
        }],
        staging: staging.clone(),
        access: Access::Block,
        fs: "ext4".into(),
        mkfs: String::new(),
        total_size: 1 << 30,
    };
    host.stage_group(&g).unwrap();
    assert_eq!(
        r.lines(),
        [
            "nvme connect -t tcp -a 127.10.0.2 -s 4430 -n nqn.dc --hostnqn nqn.2021-03.com.alipay.host:uuid:node-1 --reconnect-delay 1 --ctrl-loss-tmo 600"
        ]
    );
    assert_eq!(Staged::read(&staging).unwrap(), Some(record.clone()));
    assert_eq!(
        host.group_device(&record).unwrap(),
        Some(PathBuf::from("/dev/nvme4n1"))
    );
    // Staged again: connected already, nothing more runs.
    host.stage_group(&g).unwrap();
    assert_eq!(r.calls().len(), 1);
    // Unstaged from the record (the data control may be gone): disconnected, no LVM.
    host.unstage_group(&staging, None, true).unwrap();
    assert_eq!(r.lines()[1..], ["nvme disconnect -n nqn.dc"]);
    assert_eq!(Staged::read(&staging).unwrap(), None);
    // Twice: nothing left to do.
    host.unstage_group(&staging, None, true).unwrap();
    assert_eq!(r.calls().len(), 2);
}

fn dc(engine: PoolMode, host: &str) -> AntstorDataControl {
    let mut dc = AntstorDataControl::new(
        "pvc-1",
        AntstorDataControlSpec {
            uuid: ID.into(),
            engine_type: engine,
            raid: liteio_api::datacontrol::Raid {
                level: RaidLevel::Raid0,
            },
            ..Default::default()
        },
    );
    dc.spec.host_node.id = host.into();
    dc
}

#[test]
fn data_control_checks() {
    let mut d = dc(PoolMode::SpdkLVStore, "vm-1");
    check_dc_host(&d, "vm-1").unwrap();
    let e = check_dc_host(&d, "vm-2").unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::FailedPrecondition);
    assert!(
        e.to_string()
            .contains("for node vm-1 (spec.hostNode), not for this node vm-2"),
        "{e}"
    );
    // Ready without an export yet: says who writes it.
    d.spec.target_node_id = "node-2".into();
    let e = assembled_target(&d).unwrap_err();
    assert!(
        e.to_string().contains("status.spdkTarget") && e.to_string().contains("node-2"),
        "{e}"
    );
    let t = SpdkTarget {
        subsys_nqn: "nqn.dc".into(),
        sn: "SNDC".into(),
        address: "127.10.0.2".into(),
        svc_id: "4430".into(),
        trans_type: "TCP".into(),
        ..Default::default()
    };
    d.status = Some(liteio_api::datacontrol::AntstorDataControlStatus {
        status: Some(VolumeStatus::Ready),
        spdk_target: Some(t.clone()),
        ..Default::default()
    });
    assert_eq!(assembled_target(&d).unwrap(), Attach::Nvme(t));
    assert!(dc_ready(&d));
    // The controller refused it: an answer at once, with its reason.
    d.status = Some(liteio_api::datacontrol::AntstorDataControlStatus {
        status: Some(VolumeStatus::Creating),
        message: "invalid data control: spec.raid.level: raid5 is not supported".into(),
        ..Default::default()
    });
    let e = dc_failed(&d).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::FailedPrecondition);
    assert!(e.to_string().contains("raid5"), "{e}");
    d.status.as_mut().unwrap().message = "waiting for the members".into();
    dc_failed(&d).unwrap();
    assert!(!dc_ready(&d));
}

#[test]
fn file_system_and_mkfs_come_from_the_request_then_the_data_control() {
    let mut d = dc(PoolMode::KernelLVM, "vm-1");
    let mount = |fs: &str| Access::Mount {
        fs_type: fs.into(),
        flags: Vec::new(),
    };
    let mut ctx = HashMap::new();
    assert_eq!(group_fs(&d, &mount(""), &ctx), params::DEFAULT_FS);
    d.metadata.labels = Some([(labels::FS_TYPE.to_string(), "ext4".to_string())].into());
    assert_eq!(group_fs(&d, &mount(""), &ctx), "ext4");
    ctx.insert(keys::SC_PARAM_FS_TYPE.to_string(), "xfs".to_string());
    assert_eq!(group_fs(&d, &mount(""), &ctx), "xfs");
    assert_eq!(group_fs(&d, &mount("ext3"), &ctx), "ext3");
    assert_eq!(group_mkfs(&d, &ctx), "");
    d.metadata.annotations = Some(
        [(
            keys::SC_PARAM_MKFS_PARAMS.to_string(),
            "-E nodiscard".to_string(),
        )]
        .into(),
    );
    assert_eq!(group_mkfs(&d, &ctx), "-E nodiscard");
    ctx.insert(keys::SC_PARAM_MKFS_PARAMS.to_string(), "-K".to_string());
    assert_eq!(group_mkfs(&d, &ctx), "-K");
}
