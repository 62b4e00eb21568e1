//! T0: the LVM engine against recorded command output. Every test scripts the exact argv
//! sequence it expects; an unexpected command fails the test. Real LVM on device-mapper is
//! `t4_lvm.rs` (a microVM): this tier never pretends to have run it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use liteio_agent::config::LvmPv;
use liteio_agent::engine::lvm::{cmd, report};
use liteio_agent::engine::{
    CmdOutput, CommandRunner, EngineError, ErrorKind, LvLayout, LvmEngine, PoolEngine, VolumeInfo,
    VolumeOptions,
};

const MIB: u64 = 1 << 20;

fn fixture(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/lvm")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Replays `(argv, output)` pairs in order and records what ran.
#[derive(Debug, Default)]
struct Script {
    expected: Mutex<VecDeque<(Vec<String>, CmdOutput)>>,
    ran: Mutex<Vec<Vec<String>>>,
}

impl Script {
    fn new(steps: Vec<(Vec<String>, CmdOutput)>) -> Arc<Self> {
        Arc::new(Self {
            expected: Mutex::new(steps.into()),
            ran: Mutex::default(),
        })
    }

    fn assert_done(&self) {
        let left = self.expected.lock().unwrap();
        assert!(
            left.is_empty(),
            "commands not run: {:?}",
            left.iter().map(|(a, _)| a.join(" ")).collect::<Vec<_>>()
        );
    }
}

impl CommandRunner for Script {
    fn run(&self, argv: &[String]) -> io::Result<CmdOutput> {
        self.ran.lock().unwrap().push(argv.to_vec());
        let Some((want, out)) = self.expected.lock().unwrap().pop_front() else {
            panic!("unexpected command: {}", argv.join(" "));
        };
        assert_eq!(argv, want.as_slice(), "wrong command");
        Ok(out)
    }
}

fn ok(stdout: &str) -> CmdOutput {
    CmdOutput::ok(stdout)
}

fn s(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_string()).collect()
}

fn engine(script: &Arc<Script>) -> LvmEngine {
    LvmEngine::with_runner("test-vg", Vec::new(), script.clone())
}

/// An `lvs` report with one row per `(name, size, origin, origin_size, segtype, stripes, tags)`.
fn lvs_json(rows: &[(&str, u64, &str, u64, &str, u32, &str)]) -> String {
    let rows: Vec<String> = rows
        .iter()
        .map(|(name, size, origin, osize, seg, stripes, tags)| {
            let attr = if origin.is_empty() { "-wi-a-----" } else { "swi-a-s---" };
            let osize = if origin.is_empty() { String::new() } else { format!("{osize}B") };
            format!(
                r#"{{"lv_uuid":"uuid-{name}", "lv_name":"{name}", "lv_full_name":"test-vg/{name}", "lv_path":"/dev/test-vg/{name}", "lv_size":"{size}B", "lv_attr":"{attr}", "lv_layout":"{seg}", "lv_device_open":"", "lv_tags":"{tags}", "origin":"{origin}", "origin_size":"{osize}", "segtype":"{seg}", "stripes":"{stripes}", "stripe_size":"0B", "vg_name":"test-vg"}}"#
            )
        })
        .collect();
    format!(
        "  {{\n      \"report\": [\n          {{\n              \"lv\": [\n                  {}\n              ]\n          }}\n      ]\n  }}\n",
        rows.join(",\n                  ")
    )
}

/// What `lvs --select` prints of `json` (an `lvs` report): the rows of the LVs in `names`.
fn select(json: &str, names: &[&str]) -> String {
    let mut doc: serde_json::Value = serde_json::from_str(json).unwrap();
    for section in doc["report"].as_array_mut().unwrap() {
        if let Some(rows) = section["lv"].as_array_mut() {
            rows.retain(|r| names.contains(&r["lv_name"].as_str().unwrap()));
        }
    }
    doc.to_string()
}

/// The one-LV query of `name` in `test-vg`.
fn one(name: &str) -> Vec<String> {
    cmd::lvs_named("test-vg", &[name])
}

/// What `cmd::lvs_linear` prints when the LVs `names` start linear.
fn linear_json(names: &[&str]) -> String {
    let rows: Vec<String> = names
        .iter()
        .map(|n| format!(r#"{{"lv_name":"{n}", "segtype":"linear", "vg_name":"test-vg"}}"#))
        .collect();
    format!(r#"{{"report": [{{"lv": [{}]}}]}}"#, rows.join(", "))
}

#[test]
fn argv_of_every_command() {
    assert_eq!(
        cmd::vgs(),
        s(&[
            "vgs",
            "--options",
            "vg_all",
            "--reportformat",
            "json",
            "--units",
            "B"
        ])
    );
    assert_eq!(cmd::lvs("test-vg")[..2], s(&["lvs", "--options"])[..]);
    assert_eq!(
        cmd::lvs("test-vg")[3..],
        s(&["--reportformat", "json", "--units", "B", "test-vg"])[..]
    );
    let lvs_head = [
        "lvs",
        "--options",
        cmd::LV_FIELDS,
        "--reportformat",
        "json",
        "--units",
        "B",
        "--select",
    ];
    assert_eq!(
        cmd::lvs_named("test-vg", &["pvc-1"]),
        s(&[&lvs_head[..], &["lv_name=\"pvc-1\"", "test-vg"]].concat())
    );
    assert_eq!(
        cmd::lvs_named("test-vg", &["pvc-1_snap", "pvc-1"]),
        s(&[
            &lvs_head[..],
            &["lv_name=\"pvc-1_snap\" || lv_name=\"pvc-1\"", "test-vg"]
        ]
        .concat())
    );
    assert_eq!(
        cmd::lvs_linear("test-vg"),
        s(&[
            "lvs",
            "--options",
            "lv_name,segtype,vg_name",
            "--reportformat",
            "json",
            "--units",
            "B",
            "--select",
            "segtype=linear && seg_start=0",
            "test-vg"
        ])
    );
    assert_eq!(
        cmd::lvcreate("test-vg", "pvc-1", 8 * MIB, None, None),
        s(&["lvcreate", "-y", "-L", "8388608B", "-n", "pvc-1", "test-vg"])
    );
    assert_eq!(
        cmd::lvcreate("test-vg", "pvc-1", 16 * MIB, Some(2), None),
        s(&[
            "lvcreate",
            "-y",
            "-L",
            "16777216B",
            "-i",
            "2",
            "-I",
            "128k",
            "-n",
            "pvc-1",
            "test-vg"
        ])
    );
    assert_eq!(
        cmd::lvcreate_snapshot("test-vg", "pvc-1", "pvc-1_snap", 4 * MIB),
        s(&[
            "lvcreate",
            "-s",
            "-L",
            "4194304B",
            "-n",
            "pvc-1_snap",
            "test-vg/pvc-1"
        ])
    );
    assert_eq!(
        cmd::lvconvert_merge("test-vg", "pvc-1_snap"),
        s(&["lvconvert", "--merge", "test-vg/pvc-1_snap"])
    );
    assert_eq!(
        cmd::lvextend("test-vg", "pvc-1", 12 * MIB),
        s(&["lvextend", "-L", "12582912B", "test-vg/pvc-1"])
    );
    assert_eq!(
        cmd::lvremove("test-vg", "pvc-1"),
        s(&["lvremove", "-y", "test-vg/pvc-1"])
    );
    assert_eq!(
        cmd::pvcreate(&s(&["/dev/loop0", "/dev/loop1"])),
        s(&["pvcreate", "/dev/loop0", "/dev/loop1"])
    );
    assert_eq!(
        cmd::vgcreate("test-vg", &s(&["/dev/loop0"])),
        s(&["vgcreate", "test-vg", "/dev/loop0"])
    );
    assert_eq!(
        cmd::fallocate(Path::new("/local-storage/pv01"), 1_048_576_000),
        s(&["fallocate", "-l", "1048576000", "/local-storage/pv01"])
    );
}

#[test]
fn parses_recorded_vgs() {
    let vgs = report::parse_vgs(&fixture("vgs-test-vg.json")).unwrap();
    assert_eq!(vgs.len(), 2);
    let vg = &vgs[0];
    assert_eq!(vg.name, "test-vg");
    assert_eq!(vg.uuid, "Xq3fLd-8bQm-2XvA-c1Uy-P0oz-jJ4f-Hk7tRe");
    assert_eq!(vg.size, 1_044_381_696);
    assert_eq!(vg.free, 910_163_968);
    assert_eq!(vg.extent_size, 4 * MIB);
    assert_eq!(vg.extent_count, 249);
    assert_eq!(vg.pv_count, 1);
    assert_eq!(vgs[1].size, 8_001_566_015_488);
    assert!(
        report::parse_vgs(&fixture("vgs-none.json"))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn parses_recorded_lvs() {
    let lvs = report::parse_lvs(&fixture("lvs-test-vg.json")).unwrap();
    // The second segment row of pvc-a is folded.
    assert_eq!(
        lvs.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(),
        ["pvc-a", "pvc-a_snap", "reserved-meta"]
    );
    let a = &lvs[0];
    assert_eq!(a.size, 100 * MIB);
    assert!(a.open);
    assert!(!a.is_snapshot());
    assert_eq!(a.path, "/dev/test-vg/pvc-a");
    let snap = &lvs[1];
    assert_eq!(snap.origin.as_deref(), Some("pvc-a"));
    assert_eq!(snap.origin_size, Some(100 * MIB));
    assert_eq!(snap.size, 20 * MIB);
    assert!(!snap.is_merging());
    assert!(
        report::parse_lvs(&fixture("lvs-empty.json"))
            .unwrap()
            .is_empty()
    );
    let bad = lvs_json(&[("x", 1, "", 0, "linear", 1, "")]).replace("\"1B\"", "\"lots\"");
    assert!(report::parse_lvs(&bad).unwrap_err().contains("lv_size"));
}

#[test]
fn ensure_pool_reuses_vg_and_reports_reserved() {
    let dir = tempfile::tempdir().unwrap();
    let pv_file = dir.path().join("pv01");
    std::fs::write(&pv_file, b"").unwrap();
    let pv = pv_file.to_string_lossy().into_owned();
    let script = Script::new(vec![
        (
            s(&["losetup", "-j", &pv]),
            ok(&format!("/dev/loop5: [2049]:1234 ({pv})\n")),
        ),
        (cmd::vgs(), ok(&fixture("vgs-test-vg.json"))),
        (cmd::lvs("test-vg"), ok(&fixture("lvs-test-vg.json"))),
    ]);
    let pvs = vec![LvmPv {
        file_path: pv.clone(),
        size: 1_048_576_000,
        ..LvmPv::default()
    }];
    let e = LvmEngine::with_runner("test-vg", pvs, script.clone());
    let info = e.ensure_pool().unwrap();
    script.assert_done();
    assert_eq!(info.name, "test-vg");
    assert_eq!(info.total_bytes, 1_044_381_696);
    assert_eq!(info.free_bytes, 910_163_968);
    assert_eq!(info.allocation_unit, 4 * MIB);
    assert_eq!(info.pv_count, 1);
    assert_eq!(info.reserved.len(), 1);
    assert_eq!(info.reserved[0].name, "reserved-meta");
    assert_eq!(info.reserved[0].size_bytes, 8 * MIB);
}

#[test]
fn ensure_pool_builds_vg_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let pv_file = dir.path().join("sub/pv01");
    let pv = pv_file.to_string_lossy().into_owned();
    let script = Script::new(vec![
        (s(&["fallocate", "-l", "1048576000", &pv]), ok("")),
        (s(&["losetup", "-j", &pv]), ok("")),
        (s(&["losetup", "--find", "--show", &pv]), ok("/dev/loop0\n")),
        (cmd::vgs(), ok(&fixture("vgs-none.json"))),
        (
            s(&["pvcreate", "/dev/loop0"]),
            ok("  Physical volume \"/dev/loop0\" successfully created.\n"),
        ),
        (
            s(&["vgcreate", "test-vg", "/dev/loop0"]),
            ok("  Volume group \"test-vg\" successfully created\n"),
        ),
        (cmd::vgs(), ok(&fixture("vgs-test-vg.json"))),
        (cmd::lvs("test-vg"), ok(&fixture("lvs-empty.json"))),
    ]);
    let pvs = vec![LvmPv {
        file_path: pv,
        size: 1_048_576_000,
        ..LvmPv::default()
    }];
    let e = LvmEngine::with_runner("test-vg", pvs, script.clone());
    let info = e.ensure_pool().unwrap();
    script.assert_done();
    assert_eq!(info.uuid, "Xq3fLd-8bQm-2XvA-c1Uy-P0oz-jJ4f-Hk7tRe");
    assert!(info.reserved.is_empty());
    // The parent directory of the PV file was made for fallocate.
    assert!(pv_file.parent().unwrap().is_dir());
}

#[test]
fn ensure_pool_without_vg_or_pvs_is_not_found() {
    let script = Script::new(vec![(cmd::vgs(), ok(&fixture("vgs-none.json")))]);
    let err = engine(&script).ensure_pool().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(err.to_string(), "volume group test-vg not found");
}

#[test]
fn lost_pv_is_pool_unavailable() {
    let out = CmdOutput {
        code: Some(0),
        stdout: fixture("vgs-test-vg.json"),
        stderr: fixture("vgs-pv-lost.stderr"),
    };
    let script = Script::new(vec![(cmd::vgs(), out)]);
    let err = engine(&script).info().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PoolUnavailable);
    assert!(
        err.to_string()
            .contains("Couldn't find device with uuid 3tLXeC"),
        "{err}"
    );
}

/// `lvcreate` of LV `name` of `bytes` in test-vg: linear, or striped over its two PVs.
fn lvcreate(name: &str, bytes: u64, striped: bool) -> Vec<String> {
    let size = format!("{bytes}B");
    let mut argv = s(&["lvcreate", "-y", "-L", &size]);
    if striped {
        argv.extend(s(&["-i", "2", "-I", "128k"]));
    }
    argv.extend(s(&["-n", name, "test-vg"]));
    argv
}

/// Creates volume `name` of `size` bytes with `opts` through the engine running `script`,
/// which must have run to its end.
fn created(script: &Arc<Script>, name: &str, size: u64, opts: &VolumeOptions) -> VolumeInfo {
    let v = engine(script).create_volume(name, size, opts).unwrap();
    script.assert_done();
    v
}

/// The refusal of volume `name` of `size` bytes by the engine running `script`, which must
/// have run to its end.
fn refused(script: &Arc<Script>, name: &str, size: u64) -> EngineError {
    let err = engine(script)
        .create_volume(name, size, &VolumeOptions::default())
        .unwrap_err();
    script.assert_done();
    err
}

/// The steps of creating LV `name` on the VG of fixture `vgs` before the create: the VG
/// read, the LVs that start linear (`linear`, when the layout rule reads them) and the new
/// LV read (absent).
fn before_create(vgs: &str, linear: Option<&[&str]>, name: &str) -> Vec<(Vec<String>, CmdOutput)> {
    let mut steps = vec![(cmd::vgs(), ok(&fixture(vgs)))];
    if let Some(names) = linear {
        steps.push((cmd::lvs_linear("test-vg"), ok(&linear_json(names))));
    }
    steps.push((one(name), ok(&fixture("lvs-empty.json"))));
    steps
}

/// The script of creating LV `name` with `lvcreate` ([`before_create`], the create, and the
/// new LV read again: `after`).
fn create_script(
    vgs: &str,
    linear: Option<&[&str]>,
    name: &str,
    lvcreate: &[String],
    after: &str,
) -> Arc<Script> {
    let mut steps = before_create(vgs, linear, name);
    steps.extend([(lvcreate.to_vec(), ok("")), (one(name), ok(after))]);
    Script::new(steps)
}

#[test]
fn create_linear_rounds_up_to_the_extent() {
    let after = lvs_json(&[("pvc-new", 8 * MIB, "", 0, "linear", 1, "")]);
    let script = create_script(
        "vgs-test-vg.json",
        None,
        "pvc-new",
        &lvcreate("pvc-new", 8388608, false),
        &after,
    );
    let v = created(&script, "pvc-new", 5 * MIB, &VolumeOptions::default());
    assert_eq!(v.size_bytes, 8 * MIB);
    assert_eq!(v.uuid.as_deref(), Some("uuid-pvc-new"));
    assert_eq!(v.path, PathBuf::from("/dev/test-vg/pvc-new"));
    assert_eq!(v.layout, Some(LvLayout::Linear));
    assert!(!v.thin);
}

#[test]
fn create_striped_uses_every_pv() {
    let after = lvs_json(&[("pvc-s", 16 * MIB, "", 0, "striped", 2, "")]);
    let script = create_script(
        "vgs-striped-vg.json",
        Some(&[]),
        "pvc-s",
        &lvcreate("pvc-s", 16777216, true),
        &after,
    );
    let v = created(&script, "pvc-s", 10 * MIB, &VolumeOptions::default());
    assert_eq!(v.size_bytes, 16 * MIB);
    assert_eq!(v.layout, Some(LvLayout::Striped));
}

#[test]
fn default_layout_is_linear_once_a_linear_lv_exists() {
    let after = lvs_json(&[("pvc-l", 12 * MIB, "", 0, "linear", 1, "")]);
    let script = create_script(
        "vgs-striped-vg.json",
        Some(&["old"]),
        "pvc-l",
        &lvcreate("pvc-l", 12582912, false),
        &after,
    );
    let v = created(&script, "pvc-l", 10 * MIB, &VolumeOptions::default());
    assert_eq!(v.size_bytes, 12 * MIB);
}

/// The commands a script ran, as lines.
fn ran(script: &Script) -> Vec<String> {
    script
        .ran
        .lock()
        .unwrap()
        .iter()
        .map(|a| a.join(" "))
        .collect()
}

#[test]
fn create_on_a_single_pv_vg_reads_only_the_new_lv() {
    // Asked or not, a single-PV VG is linear: the layout rule reads nothing, and the only LV
    // read (before and after lvcreate) is the new one, never the VG's list.
    for layout in [None, Some(LvLayout::Striped)] {
        let lvcreate = lvcreate("pvc-1", 8388608, false);
        let after = lvs_json(&[("pvc-1", 8 * MIB, "", 0, "linear", 1, "")]);
        let script = create_script("vgs-test-vg.json", None, "pvc-1", &lvcreate, &after);
        let opts = VolumeOptions {
            layout,
            ..VolumeOptions::default()
        };
        let v = created(&script, "pvc-1", 8 * MIB, &opts);
        assert_eq!(v.layout, Some(LvLayout::Linear), "{layout:?}");
        assert_eq!(
            ran(&script),
            [cmd::vgs(), one("pvc-1"), lvcreate, one("pvc-1")].map(|a| a.join(" "))
        );
        assert!(
            !ran(&script).contains(&cmd::lvs("test-vg").join(" ")),
            "{layout:?}"
        );
    }
}

#[test]
fn create_on_a_multi_pv_vg_reads_the_linear_lvs_only_without_a_layout() {
    let striped = lvcreate("pvc-2", 16777216, true);
    let linear = lvcreate("pvc-2", 12582912, false);
    let striped_lv = lvs_json(&[("pvc-2", 16 * MIB, "", 0, "striped", 2, "")]);
    let linear_lv = lvs_json(&[("pvc-2", 12 * MIB, "", 0, "linear", 1, "")]);
    // No layout asked: the rule reads the LVs that start linear (none here, then one), and
    // the new LV; never the whole VG.
    for (linear_lvs, lvcreate, after, want) in [
        (vec![], &striped, &striped_lv, LvLayout::Striped),
        (vec!["old"], &linear, &linear_lv, LvLayout::Linear),
    ] {
        let script = create_script(
            "vgs-striped-vg.json",
            Some(linear_lvs.as_slice()),
            "pvc-2",
            lvcreate,
            after,
        );
        let v = created(&script, "pvc-2", 10 * MIB, &VolumeOptions::default());
        assert_eq!(v.layout, Some(want));
        assert!(!ran(&script).contains(&cmd::lvs("test-vg").join(" ")));
    }
    // A layout asked decides alone: nothing but the new LV is read.
    for (layout, lvcreate, after) in [
        (LvLayout::Striped, &striped, &striped_lv),
        (LvLayout::Linear, &linear, &linear_lv),
    ] {
        let script = create_script("vgs-striped-vg.json", None, "pvc-2", lvcreate, after);
        let opts = VolumeOptions {
            layout: Some(layout),
            ..VolumeOptions::default()
        };
        let v = created(&script, "pvc-2", 10 * MIB, &opts);
        assert_eq!(v.layout, Some(layout));
    }
}

#[test]
fn choose_layout_asks_for_linear_lvs_only_when_they_decide() {
    let vgs = report::parse_vgs(&fixture("vgs-striped-vg.json")).unwrap();
    let two = &vgs[0];
    assert_eq!(two.pv_count, 2);
    let one_pv = report::Vg {
        pv_count: 1,
        ..two.clone()
    };
    let never = || -> Result<bool, liteio_agent::engine::EngineError> {
        panic!("the linear LVs were read though they decide nothing")
    };
    for asked in [None, Some(LvLayout::Striped), Some(LvLayout::Linear)] {
        assert_eq!(
            LvmEngine::choose_layout(&one_pv, asked, never).unwrap(),
            LvLayout::Linear
        );
    }
    for asked in [LvLayout::Striped, LvLayout::Linear] {
        assert_eq!(
            LvmEngine::choose_layout(two, Some(asked), never).unwrap(),
            asked
        );
    }
    assert_eq!(
        LvmEngine::choose_layout(two, None, || Ok(true)).unwrap(),
        LvLayout::Linear
    );
    assert_eq!(
        LvmEngine::choose_layout(two, None, || Ok(false)).unwrap(),
        LvLayout::Striped
    );
}

#[test]
fn create_existing_is_idempotent_or_a_clear_error() {
    let lvs = fixture("lvs-test-vg.json");
    let a = select(&lvs, &["pvc-a"]);
    let script = Script::new(vec![
        (cmd::vgs(), ok(&fixture("vgs-test-vg.json"))),
        (one("pvc-a"), ok(&a)),
        (cmd::vgs(), ok(&fixture("vgs-test-vg.json"))),
        (one("pvc-a"), ok(&a)),
        (cmd::vgs(), ok(&fixture("vgs-test-vg.json"))),
        (one("pvc-a_snap"), ok(&select(&lvs, &["pvc-a_snap"]))),
    ]);
    let e = engine(&script);
    let v = e
        .create_volume("pvc-a", 100 * MIB - 1, &VolumeOptions::default())
        .unwrap();
    assert_eq!(v.size_bytes, 100 * MIB);
    let err = e
        .create_volume("pvc-a", 200 * MIB, &VolumeOptions::default())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExistsDifferent);
    assert_eq!(
        err.to_string(),
        "volume pvc-a exists with 100.0 MiB, asked 200.0 MiB"
    );
    let err = e
        .create_volume("pvc-a_snap", 100 * MIB, &VolumeOptions::default())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExistsDifferent);
    script.assert_done();
}

#[test]
fn create_race_with_already_exists_rechecks_the_size() {
    let mut fail = CmdOutput::fail(5, fixture("lvcreate-already-exists.stderr"));
    fail.stdout.clear();
    let mut steps = before_create("vgs-test-vg.json", None, "pvc-a");
    steps.extend([
        (lvcreate("pvc-a", 209715200, false), fail),
        (
            one("pvc-a"),
            ok(&select(&fixture("lvs-test-vg.json"), &["pvc-a"])),
        ),
    ]);
    let script = Script::new(steps);
    let err = refused(&script, "pvc-a", 200 * MIB);
    assert_eq!(err.kind(), ErrorKind::AlreadyExistsDifferent);
}

#[test]
fn no_space_is_refused_before_and_by_lvcreate() {
    let script = Script::new(before_create("vgs-test-vg.json", None, "pvc-big"));
    let err = refused(&script, "pvc-big", 1 << 30);
    assert_eq!(err.kind(), ErrorKind::NoSpace);
    assert_eq!(
        err.to_string(),
        "pool test-vg has 868.0 MiB free, pvc-big needs 1.0 GiB"
    );

    let mut steps = before_create("vgs-test-vg.json", None, "pvc-c");
    steps.push((
        lvcreate("pvc-c", 838860800, false),
        CmdOutput::fail(5, fixture("lvcreate-no-space.stderr")),
    ));
    let script = Script::new(steps);
    let err = refused(&script, "pvc-c", 800 * MIB);
    assert_eq!(err.kind(), ErrorKind::NoSpace);
}

#[test]
fn other_lvcreate_failures_carry_argv_and_stderr() {
    let mut steps = before_create("vgs-test-vg.json", None, "pvc-x");
    steps.push((
        lvcreate("pvc-x", 4194304, false),
        CmdOutput::fail(
            3,
            "  device-mapper: reload ioctl on (253:3) failed: Invalid argument\n",
        ),
    ));
    let script = Script::new(steps);
    let err = engine(&script)
        .create_volume("pvc-x", 1, &VolumeOptions::default())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CommandFailed);
    assert_eq!(
        err.to_string(),
        "`lvcreate -y -L 4194304B -n pvc-x test-vg` exited with 3: device-mapper: reload ioctl on (253:3) failed: Invalid argument"
    );
}

#[test]
fn delete_volume_and_snapshot() {
    let lvs = fixture("lvs-test-vg.json");
    let a = select(&lvs, &["pvc-a"]);
    let snap = select(&lvs, &["pvc-a_snap"]);
    let none = fixture("lvs-empty.json");
    let script = Script::new(vec![
        (one("pvc-a"), ok(&a)),
        (
            s(&["lvremove", "-y", "test-vg/pvc-a"]),
            ok("  Logical volume \"pvc-a\" successfully removed.\n"),
        ),
        (one("pvc-gone"), ok(&none)),
        (one("pvc-a_snap"), ok(&snap)),
        (s(&["lvremove", "-y", "test-vg/pvc-a_snap"]), ok("")),
        (one("gone_snap"), ok(&none)),
        (one("pvc-a"), ok(&a)),
        (one("pvc-a_snap"), ok(&snap)),
    ]);
    let e = engine(&script);
    e.delete_volume("pvc-a").unwrap();
    // Missing is success.
    e.delete_volume("pvc-gone").unwrap();
    e.delete_snapshot("pvc-a_snap").unwrap();
    e.delete_snapshot("gone_snap").unwrap();
    // Names of the wrong kind are refused, nothing is removed.
    assert_eq!(
        e.delete_snapshot("pvc-a").unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        e.delete_volume("pvc-a_snap").unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    script.assert_done();
}

#[test]
fn resize_grows_only() {
    let lvs = select(&fixture("lvs-test-vg.json"), &["pvc-a"]);
    let grown = lvs.replace("\"lv_size\":\"104857600B\"", "\"lv_size\":\"209715200B\"");
    assert_ne!(grown, lvs);
    let script = Script::new(vec![
        (cmd::vgs(), ok(&fixture("vgs-test-vg.json"))),
        (one("pvc-a"), ok(&lvs)),
        (
            s(&["lvextend", "-L", "209715200B", "test-vg/pvc-a"]),
            ok(""),
        ),
        (one("pvc-a"), ok(&grown)),
        (cmd::vgs(), ok(&fixture("vgs-test-vg.json"))),
        (one("pvc-a"), ok(&grown)),
        (cmd::vgs(), ok(&fixture("vgs-test-vg.json"))),
        (one("pvc-a"), ok(&grown)),
    ]);
    let e = engine(&script);
    // Rounded up to the extent; then the same size: nothing runs.
    for (ask, want) in [(197 * MIB, 200 * MIB), (200 * MIB, 200 * MIB)] {
        assert_eq!(
            e.resize_volume("pvc-a", ask).unwrap().size_bytes,
            want,
            "{ask}"
        );
    }
    let err = e.resize_volume("pvc-a", 100 * MIB).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(
        err.to_string(),
        "volume pvc-a has 200.0 MiB, cannot shrink to 100.0 MiB"
    );
    script.assert_done();
}

#[test]
fn snapshot_create_is_idempotent_per_origin() {
    let before = lvs_json(&[("pvc-b", 64 * MIB, "", 0, "linear", 1, "")]);
    let after = lvs_json(&[
        ("pvc-b", 64 * MIB, "", 0, "linear", 1, ""),
        ("pvc-b_snap", 8 * MIB, "pvc-b", 64 * MIB, "linear", 1, ""),
    ]);
    let both = |origin: &str| cmd::lvs_named("test-vg", &["pvc-b_snap", origin]);
    let script = Script::new(vec![
        (cmd::vgs(), ok(&fixture("vgs-test-vg.json"))),
        (both("pvc-b"), ok(&before)),
        (
            s(&[
                "lvcreate",
                "-s",
                "-L",
                "8388608B",
                "-n",
                "pvc-b_snap",
                "test-vg/pvc-b",
            ]),
            ok(""),
        ),
        (one("pvc-b_snap"), ok(&select(&after, &["pvc-b_snap"]))),
        (cmd::vgs(), ok(&fixture("vgs-test-vg.json"))),
        (both("pvc-b"), ok(&after)),
        (cmd::vgs(), ok(&fixture("vgs-test-vg.json"))),
        (both("other"), ok(&select(&after, &["pvc-b_snap"]))),
        (cmd::vgs(), ok(&fixture("vgs-test-vg.json"))),
        (
            cmd::lvs_named("test-vg", &["m_snap", "missing"]),
            ok(&fixture("lvs-empty.json")),
        ),
    ]);
    let e = engine(&script);
    let snap = e.create_snapshot("pvc-b", "pvc-b_snap", 5 * MIB).unwrap();
    assert_eq!(snap.snapshot_of.as_deref(), Some("pvc-b"));
    assert_eq!(snap.size_bytes, 64 * MIB);
    assert_eq!(snap.allocated_bytes, 8 * MIB);
    e.create_snapshot("pvc-b", "pvc-b_snap", 5 * MIB).unwrap();
    let err = e
        .create_snapshot("other", "pvc-b_snap", 5 * MIB)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExistsDifferent);
    assert_eq!(
        err.to_string(),
        "snapshot pvc-b_snap already exists of pvc-b, asked of other"
    );
    let err = e.create_snapshot("missing", "m_snap", 5 * MIB).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    script.assert_done();
}

#[test]
fn restore_merges_and_tolerates_a_running_merge() {
    let lvs = select(&fixture("lvs-test-vg.json"), &["pvc-a_snap"]);
    let merging = lvs.replace("swi-a-s---", "Swi-a-s---");
    assert_ne!(merging, lvs);
    let script = Script::new(vec![
        (one("pvc-a_snap"), ok(&lvs)),
        (
            s(&["lvconvert", "--merge", "test-vg/pvc-a_snap"]),
            ok(
                "  Delaying merge since origin is open.\n  Merging of snapshot test-vg/pvc-a_snap will occur on next activation of test-vg/pvc-a.\n",
            ),
        ),
        (one("pvc-a_snap"), ok(&merging)),
        (one("pvc-a_snap"), ok(&fixture("lvs-empty.json"))),
    ]);
    let e = engine(&script);
    e.restore_snapshot("pvc-a_snap").unwrap();
    e.restore_snapshot("pvc-a_snap").unwrap();
    assert_eq!(
        e.restore_snapshot("pvc-a_snap").unwrap_err().kind(),
        ErrorKind::NotFound
    );
    script.assert_done();
}

#[test]
fn clone_copies_under_a_tag_and_redoes_an_interrupted_copy() {
    let base = [
        ("pvc-b", 64 * MIB, "", 0, "linear", 1, ""),
        ("pvc-b_snap", 8 * MIB, "pvc-b", 64 * MIB, "linear", 1, ""),
    ];
    let before = lvs_json(&base);
    let mut rows = base.to_vec();
    rows.push((
        "pvc-c",
        64 * MIB,
        "",
        0,
        "linear",
        1,
        cmd::CLONE_INCOMPLETE_TAG,
    ));
    let incomplete = lvs_json(&rows);
    rows.pop();
    rows.push(("pvc-c", 64 * MIB, "", 0, "linear", 1, ""));
    let done = lvs_json(&rows);
    let dd = s(&[
        "dd",
        "if=/dev/test-vg/pvc-b_snap",
        "of=/dev/test-vg/pvc-c",
        "bs=4M",
        "oflag=direct",
        "conv=fsync",
        "status=none",
    ]);
    let deltag = s(&[
        "lvchange",
        "--deltag",
        "liteio.clone-incomplete",
        "test-vg/pvc-c",
    ]);
    let both = cmd::lvs_named("test-vg", &["pvc-c", "pvc-b_snap"]);
    let both_names = ["pvc-c", "pvc-b_snap"];
    let script = Script::new(vec![
        // First attempt: create, copy, untag.
        (cmd::vgs(), ok(&fixture("vgs-test-vg.json"))),
        (both.clone(), ok(&select(&before, &both_names))),
        (
            s(&[
                "lvcreate",
                "-y",
                "-L",
                "67108864B",
                "--addtag",
                "liteio.clone-incomplete",
                "-n",
                "pvc-c",
                "test-vg",
            ]),
            ok(""),
        ),
        (one("pvc-c"), ok(&select(&incomplete, &["pvc-c"]))),
        (dd.clone(), ok("")),
        (deltag.clone(), ok("")),
        (one("pvc-c"), ok(&select(&done, &["pvc-c"]))),
        // Retry after a crash during dd: copy again, no lvcreate.
        (cmd::vgs(), ok(&fixture("vgs-test-vg.json"))),
        (both.clone(), ok(&select(&incomplete, &both_names))),
        (one("pvc-c"), ok(&select(&incomplete, &["pvc-c"]))),
        (dd, ok("")),
        (deltag, ok("")),
        (one("pvc-c"), ok(&select(&done, &["pvc-c"]))),
        // Done: idempotent.
        (cmd::vgs(), ok(&fixture("vgs-test-vg.json"))),
        (both, ok(&select(&done, &both_names))),
    ]);
    let e = engine(&script);
    let v = e.clone_from_snapshot("pvc-b_snap", "pvc-c").unwrap();
    assert_eq!(v.size_bytes, 64 * MIB);
    assert!(!v.is_snapshot());
    e.clone_from_snapshot("pvc-b_snap", "pvc-c").unwrap();
    e.clone_from_snapshot("pvc-b_snap", "pvc-c").unwrap();
    script.assert_done();
}

#[test]
fn list_excludes_reserved_and_device_path_uses_lv_path() {
    let lvs = fixture("lvs-test-vg.json");
    let script = Script::new(vec![
        (cmd::lvs("test-vg"), ok(&lvs)),
        (one("pvc-a"), ok(&select(&lvs, &["pvc-a"]))),
        (one("nope"), ok(&fixture("lvs-empty.json"))),
    ]);
    let e = engine(&script);
    let names: Vec<String> = e
        .list_volumes()
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert_eq!(names, ["pvc-a", "pvc-a_snap"]);
    assert_eq!(
        e.device_path("pvc-a").unwrap(),
        PathBuf::from("/dev/test-vg/pvc-a")
    );
    assert_eq!(
        e.device_path("nope").unwrap_err().kind(),
        ErrorKind::NotFound
    );
    script.assert_done();
}

#[test]
fn bad_names_never_reach_a_command() {
    let script = Script::new(Vec::new());
    let e = engine(&script);
    for name in ["", "-rf", "a/b", "x y", "../etc"] {
        let err = e
            .create_volume(name, MIB, &VolumeOptions::default())
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{name:?}");
    }
    // A name that would close its quotes in the LVM selection never reaches `lvs`.
    for name in [r#"x" || lv_name="y"#, "x||y", "x,y", "x#y"] {
        let err = e.find_lvs(&["pvc-a", name]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{name:?}");
    }
    assert!(script.ran.lock().unwrap().is_empty());
}
