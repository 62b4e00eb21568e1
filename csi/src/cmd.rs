//! System commands. Every command the node service runs goes through [`CommandRunner`] as an
//! argv vector (never a shell string), so tests can replay recorded output.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Mutex;

use crate::error::{CsiError, Result};

/// What a finished command printed and how it exited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Output {
    /// Exit code; `None` when killed by a signal.
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Output {
    /// A successful run printing `stdout`.
    pub fn ok(stdout: impl Into<String>) -> Self {
        Output {
            code: Some(0),
            stdout: stdout.into(),
            stderr: String::new(),
        }
    }

    /// A failed run with exit code `code` printing `stderr`.
    pub fn fail(code: i32, stderr: impl Into<String>) -> Self {
        Output {
            code: Some(code),
            stdout: String::new(),
            stderr: stderr.into(),
        }
    }

    /// True for exit code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs a program. Implementations block; callers run them off the async workers.
pub trait CommandRunner: Send + Sync + fmt::Debug {
    /// Runs `argv[0]` with the remaining arguments and waits for it.
    fn run(&self, argv: &[String]) -> std::io::Result<Output>;
}

/// Runs real programs found on `PATH`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemRunner;

impl CommandRunner for SystemRunner {
    fn run(&self, argv: &[String]) -> std::io::Result<Output> {
        let (prog, args) = argv
            .split_first()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty argv"))?;
        let out = std::process::Command::new(prog)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()?;
        Ok(Output {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// Builds an argv vector from string slices.
pub fn argv(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| (*s).to_string()).collect()
}

/// Runs `argv` and returns its output whatever the exit code.
pub fn run(runner: &dyn CommandRunner, argv: &[String]) -> Result<Output> {
    tracing::debug!(command = %argv.join(" "), "running");
    runner
        .run(argv)
        .map_err(|e| CsiError::io(format!("cannot run {}", argv.join(" ")), e))
}

/// Runs `argv` and fails unless it exits with 0.
pub fn run_ok(runner: &dyn CommandRunner, argv: &[String]) -> Result<Output> {
    let out = run(runner, argv)?;
    if out.success() {
        Ok(out)
    } else {
        Err(CsiError::Command {
            command: argv.join(" "),
            status: out
                .code
                .map_or_else(|| "a signal".to_string(), |c| format!("code {c}")),
            stderr: out.stderr.trim().to_string(),
        })
    }
}

type Action = Box<dyn Fn(&[String]) + Send + Sync>;

struct Rule {
    prefix: Vec<String>,
    output: Output,
    action: Option<Action>,
    once: bool,
}

/// A [`CommandRunner`] that replays recorded output: each rule matches an argv prefix and
/// answers with its output (optionally running an action first, for example creating the
/// fake sysfs entries a real `nvme connect` would make). Unmatched commands fail with 127.
/// Every call is recorded.
#[derive(Default)]
pub struct ScriptedRunner {
    rules: Mutex<VecDeque<Rule>>,
    calls: Mutex<Vec<Vec<String>>>,
}

impl fmt::Debug for ScriptedRunner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedRunner").finish_non_exhaustive()
    }
}

impl ScriptedRunner {
    /// An empty script.
    pub fn new() -> Self {
        Self::default()
    }

    fn push(&self, prefix: &[&str], output: Output, action: Option<Action>, once: bool) {
        if let Ok(mut r) = self.rules.lock() {
            r.push_back(Rule {
                prefix: argv(prefix),
                output,
                action,
                once,
            });
        }
    }

    /// Answers every command starting with `prefix` with `output`.
    pub fn on(&self, prefix: &[&str], output: Output) -> &Self {
        self.push(prefix, output, None, false);
        self
    }

    /// Answers the next command starting with `prefix` with `output` (used once).
    pub fn once(&self, prefix: &[&str], output: Output) -> &Self {
        self.push(prefix, output, None, true);
        self
    }

    /// Like [`ScriptedRunner::on`], running `action` with the argv before answering.
    pub fn on_with(
        &self,
        prefix: &[&str],
        output: Output,
        action: impl Fn(&[String]) + Send + Sync + 'static,
    ) -> &Self {
        self.push(prefix, output, Some(Box::new(action)), false);
        self
    }

    /// Every argv run so far.
    pub fn calls(&self) -> Vec<Vec<String>> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// The commands run so far, joined with spaces.
    pub fn lines(&self) -> Vec<String> {
        self.calls().iter().map(|c| c.join(" ")).collect()
    }
}

impl CommandRunner for ScriptedRunner {
    fn run(&self, argv: &[String]) -> std::io::Result<Output> {
        if let Ok(mut c) = self.calls.lock() {
            c.push(argv.to_vec());
        }
        let mut rules = self
            .rules
            .lock()
            .map_err(|_| std::io::Error::other("script poisoned"))?;
        let pos = rules
            .iter()
            .position(|r| argv.len() >= r.prefix.len() && argv[..r.prefix.len()] == r.prefix[..]);
        let Some(pos) = pos else {
            return Ok(Output::fail(
                127,
                format!("no scripted answer for {argv:?}"),
            ));
        };
        let out = rules[pos].output.clone();
        if let Some(a) = &rules[pos].action {
            a(argv);
        }
        if rules[pos].once {
            rules.remove(pos);
        }
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn scripted_runner_matches_prefixes_and_records() {
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
        assert_eq!(r.lines(), vec!["blkid /dev/x", "blkid /dev/x", "mount a"]);
    }

    #[test]
    fn system_runner_runs_argv_without_a_shell() {
        let out = SystemRunner.run(&argv(&["echo", "a;b"])).unwrap();
        assert_eq!(out.stdout, "a;b\n");
        assert!(SystemRunner.run(&[]).is_err());
    }
}
