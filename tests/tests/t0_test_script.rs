//! The test script's tier accounting (`scripts/lib/tier.sh`) against throw-away crates: a tier
//! that does not compile, does not link, crashes, exits without reporting, hangs or runs no test
//! must fail the run and say why; a passing tier and a tier of skips must not.
//!
//! Each case builds a tiny crate with no dependencies in a temp dir (offline, its own target
//! dir) and runs `run_tier` on it exactly as `scripts/test.sh` does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// What one `run_tier` call left in the script's globals.
#[derive(Debug)]
struct Tier {
    line: String,
    pass: u32,
    fail: u32,
    skip: u32,
    /// The summary lines after the tier's own (where failed tests panicked).
    details: Vec<String>,
    output: String,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// A crate named `case` with the given `Cargo.toml` tail and files, its lock file generated.
fn make_crate(dir: &Path, manifest_tail: &str, files: &[(&str, &str)]) -> PathBuf {
    let root = dir.join("case");
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(
        root.join("Cargo.toml"),
        format!(
            "[package]\nname = \"case\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n{manifest_tail}"
        ),
    )
    .unwrap();
    std::fs::write(root.join("src/lib.rs"), "").unwrap();
    for (path, text) in files {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let st = Command::new(cargo())
        .args(["generate-lockfile", "--offline"])
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", root.join("target"))
        .status()
        .unwrap();
    assert!(
        st.success(),
        "cargo generate-lockfile failed in {}",
        root.display()
    );
    root
}

/// Runs `run_tier` on the crate at `root` (with `timeout` seconds for the tier), with
/// `--show-output` as `scripts/test.sh` passes it: that is what brings a passing test's
/// `SKIP` line into the log.
fn run_tier(root: &Path, timeout: u32) -> Tier {
    let lib = repo_root().join("scripts/lib/tier.sh");
    let logs = root.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let script = r#"
        set -uo pipefail
        log_dir=$LOGS
        source "$LIB"
        run_tier TX "case" -- --offline -- --show-output
        printf 'LINE=%s\n' "${summary[0]}"
        for d in "${summary[@]:1}"; do printf 'DETAIL=%s\n' "$d"; done
        printf 'COUNTS=%s %s %s\n' "$total_pass" "$total_fail" "$total_skip"
    "#;
    // The outer bound: the tier's own timeout plus the build of a tiny crate.
    let out = Command::new("timeout")
        .args(["300", "bash", "-c", script])
        .current_dir(root)
        .env("LOGS", &logs)
        .env("LIB", &lib)
        .env("LITEIO_TEST_TIER_TIMEOUT", timeout.to_string())
        .env("CARGO_TARGET_DIR", root.join("target"))
        .env("CARGO", cargo())
        .output()
        .unwrap();
    // Indented so that the outer tier's accounting never reads the inner result lines.
    let output: String = String::from_utf8_lossy(&out.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&out.stderr).lines())
        .map(|l| format!("  | {l}\n"))
        .collect();
    let field = |key: &str| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix(key).map(str::to_string))
            .unwrap_or_else(|| panic!("no {key} in the script's output:\n{output}"))
    };
    let line = field("LINE=");
    let counts: Vec<u32> = field("COUNTS=")
        .split(' ')
        .map(|n| n.parse().unwrap())
        .collect();
    let details = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("DETAIL=").map(str::to_string))
        .collect();
    Tier {
        line,
        details,
        pass: counts[0],
        fail: counts[1],
        skip: counts[2],
        output,
    }
}

fn assert_fails(tier: &Tier, why: &str) {
    assert!(
        tier.fail >= 1 && tier.line.contains(&format!("FAILED: {why}")),
        "expected the tier to fail with {why:?}, got {:?} (fail={})\n{}",
        tier.line,
        tier.fail,
        tier.output
    );
}

#[test]
fn passing_tier_passes_and_counts_its_tests() {
    let tmp = tempfile::tempdir().unwrap();
    let root = make_crate(
        tmp.path(),
        "",
        &[("tests/ok.rs", "#[test] fn one() {}\n#[test] fn two() {}\n")],
    );
    let t = run_tier(&root, 300);
    assert_eq!((t.pass, t.fail, t.skip), (2, 0, 0), "{t:?}");
    assert!(!t.line.contains("FAILED"), "{t:?}");
}

#[test]
fn a_failed_test_is_named_in_the_summary_with_where_it_panicked() {
    let tmp = tempfile::tempdir().unwrap();
    let root = make_crate(
        tmp.path(),
        "",
        &[(
            "tests/bad.rs",
            "#[test] fn fine() {}\n#[test] fn broken() { assert_eq!(1 + 1, 3, \"sums are off\"); }\n",
        )],
    );
    let t = run_tier(&root, 300);
    assert_eq!((t.pass, t.fail), (1, 1), "{t:?}");
    assert!(t.line.contains("FAILED: 1 test(s) failed"), "{t:?}");
    assert!(
        t.details
            .iter()
            .any(|d| d.contains("panic: broken: tests/bad.rs:2:") && d.contains("sums are off")),
        "the summary does not say where `broken` panicked: {t:?}"
    );
}

#[test]
fn skipped_tests_count_as_skipped_not_failed() {
    let tmp = tempfile::tempdir().unwrap();
    let root = make_crate(
        tmp.path(),
        "",
        &[(
            "tests/skip.rs",
            "#[test] fn cannot_run_here() { println!(\"SKIP no such device\"); }\n#[test] fn runs() {}\n",
        )],
    );
    let t = run_tier(&root, 300);
    assert_eq!(
        (t.pass, t.fail, t.skip),
        (1, 0, 1),
        "one passed, one skipped: {t:?}"
    );
    assert!(!t.line.contains("FAILED"), "{t:?}");
}

#[test]
fn tier_that_does_not_compile_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let root = make_crate(
        tmp.path(),
        "",
        &[
            ("tests/ok.rs", "#[test] fn fine() {}\n"),
            (
                "tests/broken.rs",
                "#[test] fn t() { let _: u32 = \"not a number\"; }\n",
            ),
        ],
    );
    assert_fails(&run_tier(&root, 300), "did not build");
}

#[test]
fn tier_that_does_not_link_fails() {
    // What an SPDK with other modules than expected did: a library that is not there.
    let tmp = tempfile::tempdir().unwrap();
    let root = make_crate(
        tmp.path(),
        "",
        &[(
            "tests/link.rs",
            "#[link(name = \"liteio_no_such_library\")]\nunsafe extern \"C\" { fn liteio_no_such_fn(); }\n\
             #[test] fn t() { unsafe { liteio_no_such_fn() } }\n",
        )],
    );
    assert_fails(&run_tier(&root, 300), "did not build");
}

#[test]
fn tier_whose_test_binary_aborts_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let root = make_crate(
        tmp.path(),
        "",
        &[
            ("tests/a_ok.rs", "#[test] fn fine() {}\n"),
            (
                "tests/b_abort.rs",
                "#[test] fn t() { std::process::abort(); }\n",
            ),
        ],
    );
    let t = run_tier(&root, 300);
    assert_fails(&t, "a test binary crashed");
    assert_eq!(t.pass, 1, "the other binary still ran: {t:?}");
}

#[test]
fn tier_whose_binary_exits_without_a_result_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let root = make_crate(
        tmp.path(),
        "[[test]]\nname = \"custom\"\nharness = false\n",
        &[("tests/custom.rs", "fn main() { std::process::exit(3); }\n")],
    );
    let t = run_tier(&root, 300);
    assert!(t.fail >= 1 && t.line.contains("FAILED"), "{t:?}");
}

#[test]
fn tier_that_runs_no_test_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let root = make_crate(tmp.path(), "", &[("tests/empty.rs", "// nothing here\n")]);
    assert_fails(&run_tier(&root, 300), "ran no test");
}

#[test]
fn tier_that_hangs_is_killed_and_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let root = make_crate(
        tmp.path(),
        "",
        &[(
            "tests/hang.rs",
            "#[test] fn t() { loop { std::thread::park(); } }\n",
        )],
    );
    // Build first so that the tier's short limit covers only the run.
    let st = Command::new(cargo())
        .args(["test", "--offline", "--no-run", "--quiet"])
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", root.join("target"))
        .status()
        .unwrap();
    assert!(st.success());
    assert_fails(&run_tier(&root, 5), "timed out after 5s");
}
