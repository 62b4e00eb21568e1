//! Loop devices over regular files (file-engine volumes, test pools).

use std::io;
use std::path::{Path, PathBuf};

use crate::cmd::{CommandRunner, Output, argv, argv_line};

/// Why a loop-device command failed.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    /// The program could not be run (or timed out).
    #[error("cannot run {argv}")]
    Run {
        /// The command, secrets masked.
        argv: String,
        /// What went wrong.
        #[source]
        source: io::Error,
    },
    /// It ran and failed.
    #[error("{argv} exited with {status}: {stderr}")]
    Failed {
        /// The command.
        argv: String,
        /// `code N` or `a signal`.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// It printed something else than a loop device.
    #[error("{argv} printed {printed:?} instead of a loop device")]
    BadOutput {
        /// The command.
        argv: String,
        /// What it printed.
        printed: String,
    },
}

fn run_ok(runner: &dyn CommandRunner, cmd: &[String]) -> Result<Output, LoopError> {
    let out = runner.run(cmd).map_err(|source| LoopError::Run {
        argv: argv_line(cmd),
        source,
    })?;
    if out.success() {
        Ok(out)
    } else {
        Err(LoopError::Failed {
            argv: argv_line(cmd),
            status: out.status(),
            stderr: out.stderr.trim().to_string(),
        })
    }
}

/// Device paths in `losetup -j <file>` output (`/dev/loop3: [2049]:131 (/path)` lines).
pub fn parse_losetup_j(stdout: &str) -> Vec<PathBuf> {
    stdout
        .lines()
        .filter_map(|l| l.split_once(':').map(|(dev, _)| dev.trim()))
        .filter(|dev| dev.starts_with("/dev/"))
        .map(PathBuf::from)
        .collect()
}

/// The loop devices bound to `file`.
pub fn loops_for(runner: &dyn CommandRunner, file: &Path) -> Result<Vec<PathBuf>, LoopError> {
    let cmd = argv(&["losetup", "-j", &file.to_string_lossy()]);
    Ok(parse_losetup_j(&run_ok(runner, &cmd)?.stdout))
}

/// Binds `file` to a loop device, or returns the one already bound (idempotent).
pub fn attach(runner: &dyn CommandRunner, file: &Path) -> Result<PathBuf, LoopError> {
    if let Some(dev) = loops_for(runner, file)?.into_iter().next() {
        return Ok(dev);
    }
    let cmd = argv(&["losetup", "--find", "--show", &file.to_string_lossy()]);
    let out = run_ok(runner, &cmd)?;
    let dev = out.stdout.trim();
    if !dev.starts_with("/dev/") {
        return Err(LoopError::BadOutput {
            argv: argv_line(&cmd),
            printed: dev.to_string(),
        });
    }
    Ok(PathBuf::from(dev))
}

/// Detaches every loop device bound to `file`; returns the devices detached.
pub fn detach_all(runner: &dyn CommandRunner, file: &Path) -> Result<Vec<PathBuf>, LoopError> {
    let devs = loops_for(runner, file)?;
    for d in &devs {
        run_ok(runner, &argv(&["losetup", "-d", &d.to_string_lossy()]))?;
    }
    Ok(devs)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::cmd::ScriptedRunner;

    #[test]
    fn losetup_j_output() {
        let out = "/dev/loop3: [2049]:131 (/var/pool/volumes/a.img)\n/dev/loop7: []: (/x)\n";
        assert_eq!(
            parse_losetup_j(out),
            vec![PathBuf::from("/dev/loop3"), PathBuf::from("/dev/loop7")]
        );
        assert!(parse_losetup_j("").is_empty());
    }

    #[test]
    fn attach_reuses_a_bound_device_and_checks_what_losetup_prints() {
        let s = ScriptedRunner::new();
        s.once(&["losetup", "-j"], Output::ok("/dev/loop2: []: (/f)\n"));
        assert_eq!(
            attach(&s, Path::new("/f")).unwrap(),
            PathBuf::from("/dev/loop2")
        );
        assert!(s.calls_to(&["losetup", "--find"]).is_empty());

        let s = ScriptedRunner::new();
        s.on(&["losetup", "-j"], Output::ok(""))
            .on(&["losetup", "--find"], Output::ok("nonsense\n"));
        let e = attach(&s, Path::new("/f")).unwrap_err();
        assert!(e.to_string().contains("instead of a loop device"), "{e}");

        let s = ScriptedRunner::new();
        s.on(&["losetup", "-j"], Output::fail(1, "losetup: /f: failed\n"));
        let e = attach(&s, Path::new("/f")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "losetup -j /f exited with code 1: losetup: /f: failed"
        );
    }
}
