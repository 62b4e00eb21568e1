//! T1: csi-sanity against the stack exactly as the README's main command starts it: the
//! `liteio-local` binary with its default options (file engine where the agent has no SPDK,
//! default pool, default `--dir`), then with `--dir` on an ext4 and on an XFS file system.
//! Every spec must pass and none may take longer than 30 s: nothing waits on a retry loop.
//!
//! The first case uses the real default `--dir` (`/var/tmp/liteio-local`): a `liteio-local`
//! running there is cleared, as a second run of the main command would. csi-sanity is in no
//! registry: without a `csi-sanity` on PATH (or `CSI_SANITY`) each case prints `SKIP …`.
//! Needs root (loop devices, mounts).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use liteio_local::poolfs::XfsImage;
use liteio_local::sanity;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The longest a spec may take.
const SPEC_LIMIT: Duration = Duration::from_secs(30);

/// The cases share the machine's loop devices and, for the default one, a directory.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

fn ok(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn skip_reason() -> Option<&'static str> {
    if sanity::find_csi_sanity().is_none() {
        return Some("csi-sanity not installed (put it on PATH or set CSI_SANITY)");
    }
    if !Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
    {
        return Some("needs root for loop devices and mounts");
    }
    if !ok("mkfs.xfs", &["-V"]) || !ok("mkfs.ext4", &["-V"]) {
        return Some("needs mkfs.xfs and mkfs.ext4 (xfsprogs, e2fsprogs)");
    }
    None
}

/// Specs slower than [`SPEC_LIMIT`] in ginkgo's JSON report, as `name: seconds`.
fn slow_specs(report: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(report).expect("csi-sanity wrote no JSON report");
    let suites: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut slow = Vec::new();
    let (mut specs, mut longest) = (0, 0u64);
    for spec in suites
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["SpecReports"].as_array())
        .flatten()
    {
        specs += 1;
        let ns = spec["RunTime"].as_u64().unwrap_or(0);
        longest = longest.max(ns);
        if Duration::from_nanos(ns) > SPEC_LIMIT {
            slow.push(format!(
                "{} {}: {:.1}s",
                spec["ContainerHierarchyTexts"],
                spec["LeafNodeText"],
                ns as f64 / 1e9
            ));
        }
    }
    assert!(specs > 0, "the JSON report lists no spec");
    println!("{specs} specs, the longest {:.2}s", longest as f64 / 1e9);
    slow
}

/// Runs `liteio-local [--dir dir]` as the main command does, csi-sanity against it, then
/// Ctrl-C; returns what liteio-local printed.
async fn sanity_against_main_command(case: &str, dir: Option<&Path>) -> String {
    let _serial = SERIAL.lock().await;
    let run_dir = dir.map_or_else(|| PathBuf::from("/var/tmp/liteio-local"), Path::to_path_buf);
    let work = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(bin_dir().join("liteio-local"));
    if let Some(d) = dir {
        cmd.arg("--dir").arg(d);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("cannot start liteio-local");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut printed = String::new();
    // The demo is done and the run waits for Ctrl-C.
    let ready = tokio::time::timeout(Duration::from_secs(240), async {
        while let Some(l) = lines.next_line().await.unwrap() {
            printed.push_str(&l);
            printed.push('\n');
            if l.contains("Ctrl-C") {
                return true;
            }
        }
        false
    })
    .await;
    if ready != Ok(true) {
        let _ = child.start_kill();
        let out = child.wait_with_output().await.unwrap();
        panic!(
            "{case}: liteio-local did not get ready:\n{printed}\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            liteio_local::log_tails(&run_dir, 40)
        );
    }
    let json = work.path().join("report.json");
    let report = sanity::run(
        &sanity::find_csi_sanity().unwrap(),
        &format!("unix://{}", run_dir.join("csi.sock").display()),
        work.path(),
        &[format!("--ginkgo.json-report={}", json.display())],
        Duration::from_secs(600),
    )
    .await;
    // Ctrl-C, as a user stops it: everything deleted and stopped, exit 0.
    let pid = child.id().unwrap().to_string();
    assert!(ok("kill", &["-INT", &pid]));
    let status = tokio::time::timeout(Duration::from_secs(120), child.wait())
        .await
        .expect("liteio-local did not stop after Ctrl-C")
        .unwrap();
    while let Ok(Some(l)) = lines.next_line().await {
        printed.push_str(&l);
        printed.push('\n');
    }
    let report = report.unwrap_or_else(|e| panic!("{case}: {e}\n{printed}"));
    println!(
        "csi-sanity against the main command ({case}): {}",
        report.summary
    );
    if report.failed != 0 || !report.success {
        println!("{}\n{printed}", report.output);
    }
    assert_eq!(report.failed, 0, "{case}: {}", report.summary);
    assert!(
        report.success,
        "{case}: csi-sanity exited non-zero: {}",
        report.summary
    );
    assert!(
        report.passed >= 50,
        "{case}: too few specs ran: {}",
        report.summary
    );
    let slow = slow_specs(&json);
    assert!(
        slow.is_empty(),
        "{case}: specs over {SPEC_LIMIT:?}: {slow:?}"
    );
    assert!(
        status.success(),
        "{case}: liteio-local exited with {status}:\n{printed}"
    );
    // Nothing of the run is left mounted.
    let prefix = format!("{} ", run_dir.display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts
            .lines()
            .any(|l| l.contains(&prefix) || l.contains(&format!("{}/", run_dir.display()))),
        "{case}: mounts left under {}",
        run_dir.display()
    );
    printed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_sanity_against_the_main_command_with_its_defaults() {
    if let Some(why) = skip_reason() {
        println!("SKIP csi-sanity (main command, defaults): {why}");
        return;
    }
    sanity_against_main_command("default --dir", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_sanity_against_the_main_command_on_ext4() {
    if let Some(why) = skip_reason() {
        println!("SKIP csi-sanity (main command, ext4 --dir): {why}");
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let (img, mnt) = (base.path().join("ext4.img"), base.path().join("mnt"));
    std::fs::create_dir(&mnt).unwrap();
    std::fs::File::create(&img)
        .unwrap()
        .set_len(4 << 30)
        .unwrap();
    assert!(ok("mkfs.ext4", &["-q", "-F", &img.to_string_lossy()]));
    assert!(ok(
        "mount",
        &["-o", "loop", &img.to_string_lossy(), &mnt.to_string_lossy()]
    ));
    let run = mnt.join("run");
    let printed = sanity_against_main_command("ext4 --dir", Some(&run)).await;
    assert!(
        ok("umount", &[&mnt.to_string_lossy()]),
        "the ext4 file system is still busy"
    );
    // ext4 has no reflinks: the run said where the pool went instead.
    assert!(
        printed.contains("has no reflinks") && printed.contains("XFS file system (reflink=1)"),
        "{printed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_sanity_against_the_main_command_on_xfs() {
    if let Some(why) = skip_reason() {
        println!("SKIP csi-sanity (main command, XFS --dir): {why}");
        return;
    }
    let base = tempfile::tempdir().unwrap();
    // Room for the default pool (sparse), as a user's XFS would have.
    let size = liteio_local::DEFAULT_POOL_BYTES + liteio_local::poolfs::XFS_OVERHEAD;
    let fs = XfsImage::scratch(base.path(), size).expect("cannot make an XFS file system");
    let printed = sanity_against_main_command("XFS --dir", Some(&fs.dir.join("run"))).await;
    // XFS has reflinks: the pool stays in --dir, nothing is said about it.
    assert!(!printed.contains("has no reflinks"), "{printed}");
    drop(fs);
}
