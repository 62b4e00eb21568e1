//! System commands: the shared runner of `liteio-node` (argv vectors, `LC_ALL=C`, a timeout,
//! secrets masked in logs), with failures turned into [`CsiError`]s.

pub use liteio_node::cmd::{CommandRunner, Output, ScriptedRunner, SystemRunner, argv, argv_line};

use crate::error::{CsiError, Result};

/// Runs `argv` and returns its output whatever the exit code.
pub fn run(runner: &dyn CommandRunner, argv: &[String]) -> Result<Output> {
    runner
        .run(argv)
        .map_err(|e| CsiError::io(format!("cannot run {}", argv_line(argv)), e))
}

/// Runs `argv` and fails unless it exits with 0.
pub fn run_ok(runner: &dyn CommandRunner, argv: &[String]) -> Result<Output> {
    let out = run(runner, argv)?;
    if out.success() {
        Ok(out)
    } else {
        Err(CsiError::Command {
            command: argv_line(argv),
            status: out.status(),
            stderr: out.stderr.trim().to_string(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn failures_name_the_command_and_mask_secrets() {
        let r = ScriptedRunner::new();
        r.once(&["blkid"], Output::fail(2, ""))
            .on(&["blkid"], Output::ok("xfs\n"));
        assert_eq!(run(&r, &argv(&["blkid", "/dev/x"])).unwrap().code, Some(2));
        assert_eq!(
            run_ok(&r, &argv(&["blkid", "/dev/x"])).unwrap().stdout,
            "xfs\n"
        );
        let e = run_ok(&r, &argv(&["mount", "a"])).unwrap_err();
        assert!(
            e.to_string().starts_with("mount a exited with code 127"),
            "{e}"
        );
        let e = run_ok(
            &r,
            &argv(&["nvme", "connect", "--dhchap-secret", "DHHC-1:00:s3cr3t:"]),
        )
        .unwrap_err();
        assert!(!e.to_string().contains("s3cr3t"), "{e}");
        assert_eq!(r.lines()[..3], ["blkid /dev/x", "blkid /dev/x", "mount a"]);
    }
}
