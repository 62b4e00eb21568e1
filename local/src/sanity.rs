//! Running kubernetes-csi's `csi-sanity` against a local cluster's CSI endpoint.
//!
//! csi-sanity is in no package registry this project uses; it is found through `CSI_SANITY`
//! or on `PATH` (build it from csi-test v5.3.1 with Go: `cmd/csi-sanity`).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The `csi-sanity` binary: `CSI_SANITY` when it names a file, else the first on `PATH`.
pub fn find_csi_sanity() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CSI_SANITY")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
    {
        return Some(p);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("csi-sanity"))
            .find(|p| p.is_file())
    })
}

/// What one csi-sanity run reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SanityReport {
    /// Ginkgo's summary line, e.g. `SUCCESS! -- 65 Passed | 0 Failed | 0 Pending | 17 Skipped`.
    pub summary: String,
    /// Specs that passed.
    pub passed: u32,
    /// Specs that failed.
    pub failed: u32,
    /// Specs skipped (by csi-sanity itself, or by `--ginkgo.skip`).
    pub skipped: u32,
    /// Whether csi-sanity exited 0.
    pub success: bool,
    /// Its whole output (stdout, then stderr).
    pub output: String,
}

/// Parses ginkgo's closing line (`SUCCESS! -- 65 Passed | 0 Failed | 0 Pending | 17 Skipped`
/// or `FAIL! -- …`). `None` when the output has none (csi-sanity did not get that far).
pub fn parse_summary(output: &str) -> Option<(String, u32, u32, u32)> {
    let line =
        output.lines().rev().map(str::trim).find(|l| {
            (l.starts_with("SUCCESS!") || l.starts_with("FAIL!")) && l.contains(" Passed")
        })?;
    let count = |what: &str| -> Option<u32> {
        line.split('|').map(str::trim).find_map(|part| {
            let part = part.trim_start_matches(|c: char| !c.is_ascii_digit());
            let (n, rest) = part.split_once(' ')?;
            (rest.trim() == what).then(|| n.parse().ok()).flatten()
        })
    };
    Some((
        line.to_string(),
        count("Passed")?,
        count("Failed")?,
        count("Skipped").unwrap_or(0),
    ))
}

/// Runs `bin` against the CSI endpoint `endpoint` (a `unix://` address), with its staging
/// and mount directories under `dir`, a 512 MiB test volume expanded to 768 MiB, and `extra`
/// arguments (e.g. `--ginkgo.skip=…`). Ends it after `limit`.
pub async fn run(
    bin: &Path,
    endpoint: &str,
    dir: &Path,
    extra: &[String],
    limit: Duration,
) -> Result<SanityReport, String> {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg(format!(
        "--csi.endpoint={}",
        endpoint.trim_start_matches("unix://")
    ))
    .arg(format!(
        "--csi.stagingdir={}",
        dir.join("sanity-staging").display()
    ))
    .arg(format!(
        "--csi.mountdir={}",
        dir.join("sanity-mount").display()
    ))
    .arg("--csi.testvolumesize=536870912")
    .arg("--csi.testvolumeexpandsize=805306368")
    .arg(format!("--ginkgo.timeout={}s", limit.as_secs()))
    .arg("--ginkgo.no-color")
    .args(extra)
    .kill_on_drop(true);
    let out = tokio::time::timeout(limit + Duration::from_secs(30), cmd.output())
        .await
        .map_err(|_| format!("csi-sanity did not finish within {}s", limit.as_secs()))?
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let output = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let Some((summary, passed, failed, skipped)) = parse_summary(&output) else {
        return Err(format!(
            "csi-sanity printed no summary (exit {:?}):\n{output}",
            out.status.code()
        ));
    };
    Ok(SanityReport {
        summary,
        passed,
        failed,
        skipped,
        success: out.status.success(),
        output,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn summary_lines_are_parsed() {
        let ok = "Ran 65 of 82 Specs in 9.1 seconds\nSUCCESS! -- 65 Passed | 0 Failed | 0 Pending | 17 Skipped\nPASS\n";
        assert_eq!(
            parse_summary(ok).unwrap(),
            (
                "SUCCESS! -- 65 Passed | 0 Failed | 0 Pending | 17 Skipped".to_string(),
                65,
                0,
                17
            )
        );
        let bad = "FAIL! -- 41 Passed | 24 Failed | 0 Pending | 17 Skipped\n--- FAIL: TestSanity\n";
        let (_, p, f, s) = parse_summary(bad).unwrap();
        assert_eq!((p, f, s), (41, 24, 17));
        assert_eq!(parse_summary("panic: no such endpoint\n"), None);
    }
}
