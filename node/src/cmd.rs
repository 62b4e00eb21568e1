//! Running programs. Every command goes through [`CommandRunner`] as an argv vector (never a
//! shell string), so that tests can replay recorded output ([`ScriptedRunner`]).
//!
//! [`SystemRunner`] runs real programs: stdin closed, `LC_ALL=C` (the messages callers match
//! are the English ones), and a timeout ([`DEFAULT_TIMEOUT`] unless set) after which the
//! program is killed and the call fails with [`std::io::ErrorKind::TimedOut`]. The argv is
//! logged at debug level through [`argv_line`], which masks the values of secret-bearing flags.

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, Read};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::Duration;

/// How long a command may run when no other timeout is set: long enough for `mkfs` on a
/// large device or an `nvme connect` that retries, short enough that a hung tool (a stuck
/// `losetup` on a dead device) does not hold a volume forever.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

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

    /// How it ended, for messages: `code 3` or `a signal`.
    pub fn status(&self) -> String {
        self.code
            .map_or_else(|| "a signal".to_string(), |c| format!("code {c}"))
    }
}

/// Runs a program. Implementations block; async callers run them off the async workers.
pub trait CommandRunner: Send + Sync + fmt::Debug {
    /// Runs `argv[0]` with the remaining arguments and waits for it.
    fn run(&self, argv: &[String]) -> io::Result<Output>;
}

/// Builds an argv vector from string-likes.
pub fn argv<S: AsRef<str>>(parts: &[S]) -> Vec<String> {
    parts.iter().map(|s| s.as_ref().to_string()).collect()
}

/// Flag names whose value is a secret (matched as a substring of the flag, lower case).
const SECRET_FLAGS: [&str; 5] = ["secret", "key", "password", "psk", "token"];

fn is_secret_flag(arg: &str) -> bool {
    let lower = arg.to_ascii_lowercase();
    lower.starts_with('-') && SECRET_FLAGS.iter().any(|s| lower.contains(s))
}

/// The argv as one line for logs and error messages, with the value of every secret-bearing
/// flag (`--dhchap-secret X`, `--tls-key=X`, `--password X`, …) replaced by `***`.
pub fn argv_line(argv: &[String]) -> String {
    let mut out: Vec<String> = Vec::with_capacity(argv.len());
    let mut mask_next = false;
    for a in argv {
        if mask_next {
            out.push("***".into());
            mask_next = false;
        } else if let Some((flag, _)) = a.split_once('=').filter(|(f, _)| is_secret_flag(f)) {
            out.push(format!("{flag}=***"));
        } else {
            mask_next = is_secret_flag(a);
            out.push(a.clone());
        }
    }
    out.join(" ")
}

/// Runs real programs found on `PATH` (see the module documentation).
#[derive(Debug, Clone, Copy)]
pub struct SystemRunner {
    timeout: Duration,
}

impl Default for SystemRunner {
    fn default() -> Self {
        Self::new()
    }
}

impl SystemRunner {
    /// A runner with [`DEFAULT_TIMEOUT`].
    pub const fn new() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// A runner that kills a program after `timeout`.
    pub const fn with_timeout(timeout: Duration) -> Self {
        Self { timeout }
    }

    /// The timeout in use.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

fn drain(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        // A read error leaves what was read so far; the exit status tells the rest.
        let _ = r.read_to_end(&mut buf);
        buf
    })
}

impl CommandRunner for SystemRunner {
    fn run(&self, argv: &[String]) -> io::Result<Output> {
        let (prog, args) = argv
            .split_first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty argv"))?;
        tracing::debug!(command = %argv_line(argv), "running");
        let mut child = Command::new(prog)
            .args(args)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let out = child.stdout.take().map(drain);
        let err = child.stderr.take().map(drain);
        let pid = child.id();
        let (tx, rx) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let r = child.wait();
            let _ = tx.send(());
            r
        });
        let timed_out = rx.recv_timeout(self.timeout).is_err();
        if timed_out {
            // The waiter still owns the child (not yet reaped), so the pid is still ours.
            if let Some(pid) = rustix::process::Pid::from_raw(pid.cast_signed()) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        let status = waiter
            .join()
            .map_err(|_| io::Error::other("the thread waiting for the command panicked"))??;
        let text = |h: Option<std::thread::JoinHandle<Vec<u8>>>| {
            h.and_then(|h| h.join().ok())
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        };
        let (stdout, stderr) = (text(out), text(err));
        if timed_out {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{} did not finish within {:?} and was killed",
                    argv_line(argv),
                    self.timeout
                ),
            ));
        }
        Ok(Output {
            code: status.code(),
            stdout,
            stderr,
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

    /// The calls whose argv starts with `prefix`.
    pub fn calls_to(&self, prefix: &[&str]) -> Vec<Vec<String>> {
        let p = argv(prefix);
        self.calls()
            .into_iter()
            .filter(|c| c.starts_with(&p))
            .collect()
    }
}

impl CommandRunner for ScriptedRunner {
    fn run(&self, argv: &[String]) -> io::Result<Output> {
        if let Ok(mut c) = self.calls.lock() {
            c.push(argv.to_vec());
        }
        let mut rules = self
            .rules
            .lock()
            .map_err(|_| io::Error::other("script lock poisoned"))?;
        let Some(i) = rules.iter().position(|r| argv.starts_with(&r.prefix)) else {
            return Ok(Output::fail(
                127,
                format!("no scripted answer for {}", argv_line(argv)),
            ));
        };
        let out = rules[i].output.clone();
        if let Some(a) = &rules[i].action {
            a(argv);
        }
        if rules[i].once {
            rules.remove(i);
        }
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn system_runner_runs_argv_without_a_shell_in_the_c_locale() {
        let r = SystemRunner::new();
        let out = r.run(&argv(&["echo", "a;b"])).unwrap();
        assert_eq!(out.stdout, "a;b\n");
        let out = r
            .run(&argv(&["sh", "-c", "echo $LC_ALL; echo oops >&2; exit 3"]))
            .unwrap();
        assert_eq!((out.code, out.stdout.as_str()), (Some(3), "C\n"));
        assert_eq!(out.stderr, "oops\n");
        assert!(r.run(&[]).is_err());
        assert!(r.run(&argv(&["/nonexistent/tool"])).is_err());
    }

    #[test]
    fn a_hung_program_is_killed_at_the_timeout() {
        let r = SystemRunner::with_timeout(Duration::from_millis(300));
        let started = std::time::Instant::now();
        let e = r.run(&argv(&["sleep", "30"])).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(
            e.to_string()
                .contains("sleep 30 did not finish within 300ms"),
            "{e}"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn secrets_are_masked_in_displayed_argv() {
        let a = argv(&[
            "nvme",
            "connect",
            "--dhchap-secret",
            "DHHC-1:00:abc:",
            "--dhchap-ctrl-secret=DHHC-1:00:def:",
            "--tls-key",
            "NVMeTLSkey-1:01:x:",
            "-n",
            "nqn.x",
        ]);
        let shown = argv_line(&a);
        assert!(!shown.contains("abc") && !shown.contains("def") && !shown.contains("x:"));
        assert_eq!(
            shown,
            "nvme connect --dhchap-secret *** --dhchap-ctrl-secret=*** --tls-key *** -n nqn.x"
        );
    }

    #[test]
    fn scripted_runner_replays_and_records() {
        let s = ScriptedRunner::new();
        s.once(&["losetup", "-j"], Output::ok("/dev/loop1: []: (/f)\n"))
            .on(&["losetup"], Output::fail(1, "busy"));
        assert!(s.run(&argv(&["losetup", "-j", "/f"])).unwrap().success());
        assert_eq!(
            s.run(&argv(&["losetup", "-j", "/f"])).unwrap().code,
            Some(1)
        );
        assert_eq!(s.run(&argv(&["mkfs"])).unwrap().code, Some(127));
        assert_eq!(s.calls_to(&["losetup"]).len(), 2);
    }
}
