//! Host commands for the tests that need a real host (root, loop devices, `mkfs.xfs`): one
//! way to run a command, and the reasons such a test is skipped.

use std::process::Command;

/// Runs `program` with `args`; its trimmed stdout, or an error naming the command and its
/// stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Why a test that needs root cannot run here, if it cannot.
pub fn not_root() -> Option<String> {
    (run("id", &["-u"]).ok().as_deref() != Some("0")).then(|| "not root".into())
}

/// Why a test that needs loop devices cannot run here, if it cannot.
pub fn no_loop_devices() -> Option<String> {
    (!std::path::Path::new("/dev/loop-control").exists()).then(|| "no /dev/loop-control".into())
}
