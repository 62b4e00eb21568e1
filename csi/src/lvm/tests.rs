//! Unit tests of LVM for multi-disk volumes: names, argv, report parsing and the plans.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

const ID: &str = "dc-0b9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a11";

fn n() -> Names {
    names("pvc-1", ID)
}

fn devs() -> Vec<String> {
    vec!["/dev/nvme1n1".into(), "/dev/nvme2n1".into()]
}

/// What LVM 2.03.16 prints for two fresh PVs of VG `pvc-1` (recorded on loop devices,
/// names replaced).
const PVS: &str = r#"  {
      "report": [
          {
              "pv": [
                  {"pv_name":"/dev/nvme1n1", "pv_uuid":"2B9Bpp-6Ozg-zUPA-PGYk-z30T-0Luu-tjiN0P", "vg_name":"pvc-1", "pv_pe_count":"15", "pv_pe_alloc_count":"0", "dev_size":"67108864"},
                  {"pv_name":"/dev/nvme2n1", "pv_uuid":"yaGBb8-29yE-U2dp-xcH0-dq0E-cWQB-z0Ebd6", "vg_name":"pvc-1", "pv_pe_count":"15", "pv_pe_alloc_count":"0", "dev_size":"67108864"}
              ]
          }
      ]
  }
"#;

const VGS: &str = r#"  {
      "report": [
          {
              "vg": [
                  {"vg_name":"pvc-1", "vg_uuid":"mFqNrc-TIfo-8Vy9-z2mr-PEkp-Ygmk-1Dl4M8", "vg_tags":"liteio.volume.dc-0b9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a11", "pv_count":"2", "vg_missing_pv_count":"0", "lv_count":"0", "vg_extent_size":"4194304", "vg_extent_count":"30", "vg_free_count":"30"}
              ]
          }
      ]
  }
"#;

const EMPTY_PVS: &str = r#"  {
      "report": [
          {
              "pv": [
              ]
          }
      ]
  }
"#;

/// LVM 2.03.16's report of a raid0 group's LV, active and open (recorded in the T4 VM,
/// names replaced).
const LVS: &str = r#"  {
      "report": [
          {
              "lv": [
                  {"lv_name":"pvc-1", "vg_name":"pvc-1", "lv_uuid":"xLcYw9-03SH-O7f3-qRDr-NnMQ-E3L9-tKfI17", "lv_size":"671088640", "lv_path":"/dev/pvc-1/pvc-1", "lv_dm_path":"/dev/mapper/pvc--1-pvc--1", "lv_attr":"-wi-ao----", "segtype":"striped", "stripes":"2", "stripe_size":"65536"}
              ]
          }
      ]
  }
"#;

/// A linear group's LV over two members: one row per segment (recorded likewise, then
/// shown inactive).
const LVS_LINEAR: &str = r#"  {
      "report": [
          {
              "lv": [
                  {"lv_name":"pvc-1", "vg_name":"pvc-1", "lv_uuid":"vKytvM-AKIb-lsRf-lXBz-RahE-GeSq-6o9zcB", "lv_size":"671088640", "lv_path":"/dev/pvc-1/pvc-1", "lv_dm_path":"/dev/mapper/pvc--1-pvc--1", "lv_attr":"-wi-------", "segtype":"linear", "stripes":"1", "stripe_size":"0"},
                  {"lv_name":"pvc-1", "vg_name":"pvc-1", "lv_uuid":"vKytvM-AKIb-lsRf-lXBz-RahE-GeSq-6o9zcB", "lv_size":"671088640", "lv_path":"/dev/pvc-1/pvc-1", "lv_dm_path":"/dev/mapper/pvc--1-pvc--1", "lv_attr":"-wi-------", "segtype":"linear", "stripes":"1", "stripe_size":"0"}
              ]
          }
      ]
  }
"#;

fn member(dev: &str, sig: Option<&str>) -> MemberDevice {
    MemberDevice {
        volume: format!("pvc-1-{}", &dev[5..]),
        dev: dev.into(),
        signature: sig.map(str::to_string),
    }
}

#[test]
fn names_follow_the_data_control_and_fall_back_to_the_id() {
    let n = names("pvc-0b9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a11", ID);
    assert_eq!(n.vg, "pvc-0b9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a11");
    assert_eq!(n.lv, n.vg);
    assert_eq!(n.tag, format!("liteio.volume.{ID}"));
    assert_eq!(
        n.lv_path(),
        "/dev/pvc-0b9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a11/pvc-0b9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a11"
    );
    assert_eq!(
        n.dm_name(),
        "pvc--0b9d1f3c--6a2e--4c1d--9f0a--5e7b2c8d4a11-pvc--0b9d1f3c--6a2e--4c1d--9f0a--5e7b2c8d4a11"
    );
    // Too long for a device-mapper name once doubled, a reserved prefix, an underscore.
    for bad in [&"a-".repeat(40)[..], "snapshot-1", "pvmove1", "my_pv", ""] {
        let n = names(bad, ID);
        assert_eq!(n.vg, ID, "{bad}");
        assert_eq!(n.lv, ID, "{bad}");
    }
    assert!(names(ID, ID).dm_name().len() <= DM_NAME_MAX);
}

#[test]
fn every_command_is_confined_to_the_members() {
    let cfg = config(&devs()).unwrap();
    assert_eq!(
        cfg,
        "devices { filter = [ \"a|^/dev/nvme1n1$|\", \"a|^/dev/nvme2n1$|\", \"r|.*|\" ] \
             global_filter = [ \"a|^/dev/nvme1n1$|\", \"a|^/dev/nvme2n1$|\", \"r|.*|\" ] \
             obtain_device_list_from_udev = 0 use_devicesfile = 0 } \
             activation { udev_sync = 0 udev_rules = 0 } backup { backup = 0 archive = 0 }"
    );
    let n = n();
    let all = [
        pvs_argv(&devs()).unwrap(),
        vgs_argv(&devs()).unwrap(),
        lvs_argv(&devs(), &n.vg).unwrap(),
        pvcreate_argv(&devs(), &devs()[1..]).unwrap(),
        vgcreate_argv(&devs(), &n, true).unwrap(),
        lvcreate_argv(&devs(), &n, Layout::Striped, 30).unwrap(),
        vgchange_argv(&devs(), &n.vg, true).unwrap(),
        vgremove_argv(&devs(), &n.vg).unwrap(),
        pvremove_argv(&devs(), &devs()).unwrap(),
    ];
    for a in &all {
        assert_eq!(a[1], "--config", "{a:?}");
        assert_eq!(a[2], cfg, "{a:?}");
    }
    // Devices that cannot stand in a filter are refused, not escaped.
    for bad in [
        "/dev/nvme1n1|",
        "nvme1n1",
        "/dev/",
        "/dev/a b",
        "/dev/a\"b",
        "/dev/x.*",
    ] {
        let e = config(&[bad.to_string()]).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::FailedPrecondition, "{bad}");
        assert!(e.to_string().contains("member device"), "{e}");
    }
    assert_eq!(config(&[]).unwrap_err().kind(), crate::ErrorKind::Internal);
}

#[test]
fn command_lines() {
    let n = n();
    let line = |a: Vec<String>| a[3..].join(" ");
    assert_eq!(
        line(pvs_argv(&devs()).unwrap()),
        format!("--reportformat json --units b --nosuffix -o {PV_FIELDS}")
    );
    assert_eq!(
        line(lvs_argv(&devs(), "pvc-1").unwrap()),
        format!("--reportformat json --units b --nosuffix -o {LV_FIELDS} pvc-1")
    );
    assert_eq!(
        line(pvcreate_argv(&devs(), &devs()[1..]).unwrap()),
        "/dev/nvme2n1"
    );
    assert_eq!(
        line(vgcreate_argv(&devs(), &n, false).unwrap()),
        format!(
            "--physicalextentsize 4m --addtag liteio.volume.{ID} pvc-1 /dev/nvme1n1 /dev/nvme2n1"
        )
    );
    assert_eq!(
        line(vgcreate_argv(&devs(), &n, true).unwrap()),
        format!(
            "--physicalextentsize 4m --addtag liteio.volume.{ID} --setautoactivation n pvc-1 /dev/nvme1n1 /dev/nvme2n1"
        )
    );
    assert_eq!(version_argv().join(" "), "lvm version");
    assert_eq!(
        line(lvcreate_argv(&devs(), &n, Layout::Striped, 30).unwrap()),
        "-y -l 30 -i 2 -I 64k -n pvc-1 pvc-1 /dev/nvme1n1 /dev/nvme2n1"
    );
    assert_eq!(
        line(lvcreate_argv(&devs(), &n, Layout::Linear, 30).unwrap()),
        "-y -l 30 -n pvc-1 pvc-1 /dev/nvme1n1 /dev/nvme2n1"
    );
    assert_eq!(
        line(vgchange_argv(&devs(), "pvc-1", true).unwrap()),
        "-a y pvc-1"
    );
    assert_eq!(
        line(vgchange_argv(&devs(), "pvc-1", false).unwrap()),
        "-a n pvc-1"
    );
    assert_eq!(
        line(vgremove_argv(&devs(), "pvc-1").unwrap()),
        "-y -f pvc-1"
    );
    assert_eq!(
        pvcreate_argv(&devs(), &devs()).unwrap()[0],
        "pvcreate",
        "pvcreate is never given -y or -f: a signature prompt is answered no"
    );
    assert!(
        !pvcreate_argv(&devs(), &devs())
            .unwrap()
            .iter()
            .any(|a| a == "-y" || a == "-f" || a == "-ff" || a == "--yes")
    );
    assert_eq!(
        signature_argv("/dev/nvme1n1").join(" "),
        "blkid -p -o export /dev/nvme1n1"
    );
    assert_eq!(
        dmsetup_remove_argv("pvc--1-pvc--1").join(" "),
        "dmsetup remove pvc--1-pvc--1"
    );
}

#[test]
fn reports_parse() {
    let pvs = parse_pvs(PVS).unwrap();
    assert_eq!(pvs.len(), 2);
    assert_eq!(pvs[0].name, "/dev/nvme1n1");
    assert_eq!(pvs[0].vg, "pvc-1");
    assert_eq!(pvs[0].pe_count, 15);
    assert!(parse_pvs(EMPTY_PVS).unwrap().is_empty());
    let vgs = parse_vgs(VGS).unwrap();
    assert_eq!(
        vgs,
        vec![Vg {
            name: "pvc-1".into(),
            uuid: "mFqNrc-TIfo-8Vy9-z2mr-PEkp-Ygmk-1Dl4M8".into(),
            tags: vec![format!("liteio.volume.{ID}")],
            pv_count: 2,
            missing_pv_count: 0,
            lv_count: 0,
            extent_size: 4 << 20,
            free_count: 30,
        }]
    );
    let lvs = parse_lvs(LVS).unwrap();
    assert_eq!(lvs[0].segtype, "striped");
    assert_eq!((lvs[0].stripes, lvs[0].stripe_size), (2, 65536));
    assert!(lvs[0].active());
    assert_eq!(lvs[0].dm_path, "/dev/mapper/pvc--1-pvc--1");
    let lin = parse_lvs(LVS_LINEAR).unwrap();
    assert_eq!(lin.len(), 2);
    assert!(!lin[0].active());
    // Garbage and bad numbers say which command printed them.
    let e = parse_vgs("WARNING: something\n").unwrap_err();
    assert!(e.to_string().starts_with("vgs printed no JSON"), "{e}");
    let e = parse_pvs(&PVS.replace("\"15\"", "\"many\"")).unwrap_err();
    assert!(
        e.to_string().contains("pv_pe_count") && e.to_string().contains("many"),
        "{e}"
    );
}

#[test]
fn versions() {
    // LVM 2.03.16 (Debian 12) and 2.03.11 (Ubuntu 22.04), as `lvm version` prints them.
    let v = parse_version(
        "  LVM version:     2.03.16(2) (2022-05-18)\n  Library version: 1.02.185 (2022-05-18)\n  Driver version:  4.48.0\n",
    );
    assert_eq!(v, Some(Version(2, 3, 16)));
    assert!(v.unwrap() >= SETAUTOACTIVATION_SINCE);
    let old = parse_version("  LVM version:     2.03.11(2) (2021-01-08)\n").unwrap();
    assert!(old < SETAUTOACTIVATION_SINCE);
    assert!(Version(2, 2, 187) < SETAUTOACTIVATION_SINCE);
    assert_eq!(parse_version("lvm: command not found"), None);
    assert_eq!(parse_version("  LVM version: 2.03\n"), None);
}

#[test]
fn signatures() {
    assert_eq!(
        parse_signature(
            "DEVNAME=/dev/loop2\nUUID=2B9Bpp\nVERSION=LVM2\\ 001\nTYPE=LVM2_member\nUSAGE=raid\n"
        )
        .as_deref(),
        Some(LVM2_MEMBER)
    );
    assert_eq!(
        parse_signature("DEVNAME=/dev/loop5\nUUID=f3\nBLOCK_SIZE=1024\nTYPE=ext4\n").as_deref(),
        Some("ext4")
    );
    assert_eq!(
        parse_signature("DEVNAME=/dev/nvme1n1\nPTUUID=1\nPTTYPE=gpt\n").as_deref(),
        Some("gpt partition table")
    );
    assert_eq!(parse_signature(""), None);
}

#[test]
fn a_fresh_group_is_created_over_blank_members() {
    let n = n();
    let members = [member("/dev/nvme1n1", None), member("/dev/nvme2n1", None)];
    assert_eq!(
        plan_vg(&n, &members, &[], &[]).unwrap(),
        VgPlan::Create { pvcreate: devs() }
    );
    // An attempt stopped after its first pvcreate: that orphan PV is ours, not made again.
    let orphan = Pv {
        name: "/dev/nvme1n1".into(),
        uuid: "u".into(),
        vg: String::new(),
        pe_count: 0,
        pe_alloc_count: 0,
    };
    let members = [
        member("/dev/nvme1n1", Some(LVM2_MEMBER)),
        member("/dev/nvme2n1", None),
    ];
    assert_eq!(
        plan_vg(&n, &members, &[orphan], &[]).unwrap(),
        VgPlan::Create {
            pvcreate: vec!["/dev/nvme2n1".into()]
        }
    );
}

#[test]
fn foreign_data_is_never_overwritten() {
    let n = n();
    for sig in ["ext4", "xfs", "gpt partition table", "swap"] {
        let members = [
            member("/dev/nvme1n1", None),
            member("/dev/nvme2n1", Some(sig)),
        ];
        let e = plan_vg(&n, &members, &[], &[]).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::FailedPrecondition);
        let m = e.to_string();
        assert!(
            m.starts_with(&format!(
                "member device /dev/nvme2n1 (volume pvc-1-nvme2n1) carries a {sig} signature"
            )),
            "{m}"
        );
        assert!(m.contains(ID), "{m}");
    }
    // An LVM label blkid sees but LVM does not list (another tool's, or a damaged one).
    let members = [
        member("/dev/nvme1n1", Some(LVM2_MEMBER)),
        member("/dev/nvme2n1", None),
    ];
    let e = plan_vg(&n, &members, &[], &[]).unwrap_err();
    assert!(
        e.to_string().starts_with(
            "member device /dev/nvme1n1 (volume pvc-1-nvme1n1) carries a LVM2_member signature"
        ),
        "{e}"
    );
    // A PV of another VG, whether or not that VG is visible.
    let mut pvs = parse_pvs(PVS).unwrap();
    pvs[1].vg = "data".into();
    let members = [
        member("/dev/nvme1n1", Some(LVM2_MEMBER)),
        member("/dev/nvme2n1", Some(LVM2_MEMBER)),
    ];
    let e = plan_vg(&n, &members, &pvs, &[]).unwrap_err();
    assert!(
            e.to_string().starts_with(
                "member device /dev/nvme2n1 (volume pvc-1-nvme2n1) is a physical volume of LVM volume group data, not of pvc-1"
            ),
            "{e}"
        );
}

#[test]
fn an_existing_group_is_used_only_when_it_is_exactly_the_members() {
    let n = n();
    let pvs = parse_pvs(PVS).unwrap();
    let vgs = parse_vgs(VGS).unwrap();
    let members = [
        member("/dev/nvme1n1", Some(LVM2_MEMBER)),
        member("/dev/nvme2n1", Some(LVM2_MEMBER)),
    ];
    assert_eq!(plan_vg(&n, &members, &pvs, &vgs).unwrap(), VgPlan::Existing);
    // The devices got other names on this host: found by the PV labels all the same.
    // A VG of that name without this volume's tag.
    let mut other = vgs.clone();
    other[0].tags = vec!["liteio.volume.dc-other".into()];
    let e = plan_vg(&n, &members, &pvs, &other).unwrap_err();
    assert!(e.to_string().contains("was not made for it"), "{e}");
    // A third PV outside the members (missing through the filter).
    let mut more = vgs.clone();
    more[0].pv_count = 3;
    more[0].missing_pv_count = 1;
    let e = plan_vg(&n, &members, &pvs, &more).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::FailedPrecondition);
    assert!(
            e.to_string().starts_with(
                "LVM volume group pvc-1 has 3 physical volumes (1 of them not among the members), multi-disk volume"
            ),
            "{e}"
        );
    // Members it does not hold yet (an expansion): a blank one is made a PV, an orphan PV
    // (an extension that stopped before its vgextend) is taken as it is; both are added.
    let mut orphan = pvs.clone();
    orphan.push(Pv {
        name: "/dev/nvme4n1".into(),
        uuid: "u4".into(),
        vg: String::new(),
        pe_count: 0,
        pe_alloc_count: 0,
    });
    let members4 = [
        member("/dev/nvme1n1", Some(LVM2_MEMBER)),
        member("/dev/nvme2n1", Some(LVM2_MEMBER)),
        member("/dev/nvme3n1", None),
        member("/dev/nvme4n1", Some(LVM2_MEMBER)),
    ];
    assert_eq!(
        plan_vg(&n, &members4, &orphan, &vgs).unwrap(),
        VgPlan::Extend {
            pvcreate: vec!["/dev/nvme3n1".into()],
            add: vec!["/dev/nvme3n1".into(), "/dev/nvme4n1".into()],
        }
    );
    // A new member with data of its own is never taken.
    let members3 = [
        member("/dev/nvme1n1", Some(LVM2_MEMBER)),
        member("/dev/nvme2n1", Some(LVM2_MEMBER)),
        member("/dev/nvme3n1", Some("xfs")),
    ];
    let e = plan_vg(&n, &members3, &pvs, &vgs).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::FailedPrecondition);
    assert!(
            e.to_string().starts_with(
                "member device /dev/nvme3n1 (volume pvc-1-nvme3n1) carries a xfs signature; refusing to add it"
            ),
            "{e}"
        );
    // A PV of the VG that is not a member any more (the filter hides it: missing).
    let mut lost = vgs.clone();
    lost[0].missing_pv_count = 1;
    let e = plan_vg(&n, &members, &pvs, &lost).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::FailedPrecondition);
}

fn pv(name: &str, pe: u64, alloc: u64) -> Pv {
    Pv {
        name: name.into(),
        uuid: format!("u-{name}"),
        vg: "pvc-1".into(),
        pe_count: pe,
        pe_alloc_count: alloc,
    }
}

#[test]
fn an_expansion_extends_the_lv_over_the_members_it_does_not_use_yet() {
    let n = n();
    let devs: Vec<String> = [
        "/dev/nvme1n1",
        "/dev/nvme2n1",
        "/dev/nvme3n1",
        "/dev/nvme4n1",
    ]
    .map(String::from)
    .to_vec();
    // Nothing new: nothing to do, even with extents left on a used member (an unequal
    // striped group keeps them).
    let used = [pv("/dev/nvme1n1", 20, 15), pv("/dev/nvme2n1", 15, 15)];
    assert_eq!(plan_grow(Layout::Striped, "pvc-1", &devs, &used), None);
    assert_eq!(plan_grow(Layout::Linear, "pvc-1", &devs, &used), None);
    let mut grown = used.to_vec();
    grown.push(pv("/dev/nvme3n1", 10, 0));
    grown.push(pv("/dev/nvme4n1", 12, 0));
    // Linear: all the new extents, over the new members in order.
    let g = plan_grow(Layout::Linear, "pvc-1", &devs, &grown).unwrap();
    assert_eq!(
        g,
        Grow {
            extents: 22,
            stripes: None,
            on: vec!["/dev/nvme3n1".into(), "/dev/nvme4n1".into()],
        }
    );
    let a = lvextend_argv(&devs, &n, &g).unwrap();
    assert_eq!(
        a[3..],
        ["-l", "+22", "pvc-1/pvc-1", "/dev/nvme3n1", "/dev/nvme4n1"].map(String::from)
    );
    // Striped: a segment striped over the new members, the smallest one's extents each.
    let g = plan_grow(Layout::Striped, "pvc-1", &devs, &grown).unwrap();
    assert_eq!((g.extents, g.stripes), (20, Some(2)));
    let a = lvextend_argv(&devs, &n, &g).unwrap();
    assert_eq!(
        a[3..],
        [
            "-l",
            "+20",
            "-i",
            "2",
            "-I",
            "64k",
            "pvc-1/pvc-1",
            "/dev/nvme3n1",
            "/dev/nvme4n1"
        ]
        .map(String::from)
    );
    // One new member of a striped LV: a linear segment, said so (-i 1), since LVM would
    // keep the last segment's two stripes.
    let g = plan_grow(Layout::Striped, "pvc-1", &devs, &grown[..3]).unwrap();
    assert_eq!((g.extents, g.stripes), (10, Some(1)));
    let a = lvextend_argv(&devs, &n, &g).unwrap();
    assert_eq!(
        a[3..],
        ["-l", "+10", "-i", "1", "pvc-1/pvc-1", "/dev/nvme3n1"].map(String::from)
    );
    // A PV of another VG (or an orphan) on a member's device is not grown onto.
    let mut foreign = used.to_vec();
    foreign.push(Pv {
        vg: "other".into(),
        ..pv("/dev/nvme3n1", 10, 0)
    });
    assert_eq!(plan_grow(Layout::Linear, "pvc-1", &devs, &foreign), None);
    let a = vgextend_argv(&devs, "pvc-1", &devs[2..]).unwrap();
    assert_eq!(a[0], "vgextend");
    assert_eq!(
        a[3..],
        ["pvc-1", "/dev/nvme3n1", "/dev/nvme4n1"].map(String::from)
    );
}

#[test]
fn the_lv_is_made_once_and_alone() {
    let n = n();
    assert!(plan_lv(&n, &[]).unwrap());
    assert!(!plan_lv(&n, &parse_lvs(LVS).unwrap()).unwrap());
    let mut other = parse_lvs(LVS).unwrap();
    other[0].name = "scratch".into();
    let e = plan_lv(&n, &other).unwrap_err();
    assert!(e.to_string().contains("\"scratch\""), "{e}");
}

#[test]
fn extents_and_layouts() {
    assert_eq!(extents(Layout::Linear, &[15, 20]).unwrap(), 35);
    assert_eq!(extents(Layout::Striped, &[15, 20]).unwrap(), 30);
    assert_eq!(extents(Layout::Striped, &[16, 16, 16]).unwrap(), 48);
    assert!(extents(Layout::Linear, &[0, 0]).is_err());
    assert!(extents(Layout::Striped, &[]).is_err());
    let n = n();
    check_layout(&n, Layout::Striped, 2, &parse_lvs(LVS).unwrap()).unwrap();
    check_layout(&n, Layout::Linear, 2, &parse_lvs(LVS_LINEAR).unwrap()).unwrap();
    let e = check_layout(&n, Layout::Linear, 2, &parse_lvs(LVS).unwrap()).unwrap_err();
    assert!(
        e.to_string().contains("[\"striped × 2\"]") && e.to_string().contains("linear"),
        "{e}"
    );
    let e = check_layout(&n, Layout::Striped, 3, &parse_lvs(LVS).unwrap()).unwrap_err();
    assert!(e.to_string().contains("over 3 members"), "{e}");
    assert!(check_layout(&n, Layout::Striped, 2, &[]).is_err());
    // Grown by an expansion: striped × 2, then linear over a third member, then
    // striped × 2 over two more.
    let mut grown = parse_lvs(LVS).unwrap();
    let mut lin = grown[0].clone();
    (lin.segtype, lin.stripes) = ("linear".into(), 1);
    grown.push(lin.clone());
    check_layout(&n, Layout::Striped, 3, &grown).unwrap();
    assert!(check_layout(&n, Layout::Striped, 4, &grown).is_err());
    grown.push(parse_lvs(LVS).unwrap()[0].clone());
    check_layout(&n, Layout::Striped, 5, &grown).unwrap();
    // A linear first segment is not a striped volume, whatever follows.
    let mut first_linear = vec![lin];
    first_linear.push(parse_lvs(LVS).unwrap()[0].clone());
    assert!(check_layout(&n, Layout::Striped, 3, &first_linear).is_err());
}
