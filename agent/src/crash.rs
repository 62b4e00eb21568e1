//! Crash points for crash-recovery tests.
//!
//! `LITEIO_AGENT_CRASH_AT=<point>[:<volume>]` makes the `disk-agent` process kill itself with
//! SIGKILL the first time the volume sync reaches `<point>` (for volume `<volume>` only, when
//! given). The variable is read once, at start, by `main`; unset (the default) nothing is
//! armed and [`reached`] is a load of an empty `OnceLock`. A process killed this way leaves
//! exactly the state a power cut or an OOM kill would leave at that step, so tests can restart
//! the agent and check that it converges. The process logs one `error` line naming the point
//! just before it dies.
//!
//! Points (all in [`crate::sync::volume`]):
//!
//! | point | the engine has | the API object has |
//! |---|---|---|
//! | `after-finalizer` | nothing yet | `logic-volume`; no `spec.kernelLvol`/`spdkLvol` |
//! | `after-create` | the volume | `logic-volume`; no `spec.kernelLvol`/`spdkLvol` |
//! | `after-record` | the volume | `logic-volume`, `spec.kernelLvol`/`spdkLvol`; no export, not ready |
//! | `after-export` | the volume, exported | no `spdk-tgt`, no `spec.spdkTarget`, not ready |
//! | `before-ready` | the volume, exported when due | everything but `status.status = ready` |
//! | `after-resize` | the grown volume | the expansion label, the old allocated size |
//! | `after-unexport` | the volume, export removed | deleting, `spdk-tgt` still there |
//! | `after-delete` | nothing | deleting, `logic-volume` still there |

use std::fmt;
use std::sync::OnceLock;

/// The environment variable that arms a crash point.
pub const ENV: &str = "LITEIO_AGENT_CRASH_AT";

/// A step of the volume sync where the process may be killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CrashPoint {
    /// `logic-volume` was added; the engine volume is not made.
    AfterFinalizer,
    /// The engine volume was created; it is not recorded in the spec.
    AfterCreate,
    /// The engine volume was recorded; the export is not made.
    AfterRecord,
    /// The export exists; `spec.spdkTarget` and `spdk-tgt` are not recorded.
    AfterExport,
    /// Everything is done but the ready status.
    BeforeReady,
    /// The engine volume was grown; the expansion is not recorded.
    AfterResize,
    /// Deleting: the export was removed; `spdk-tgt` is still there.
    AfterUnexport,
    /// Deleting: the engine volume was removed; `logic-volume` is still there.
    AfterDelete,
}

impl CrashPoint {
    /// Every point, in the order a volume meets them.
    pub const ALL: [Self; 8] = [
        Self::AfterFinalizer,
        Self::AfterCreate,
        Self::AfterRecord,
        Self::AfterExport,
        Self::BeforeReady,
        Self::AfterResize,
        Self::AfterUnexport,
        Self::AfterDelete,
    ];

    /// The name used in [`ENV`].
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AfterFinalizer => "after-finalizer",
            Self::AfterCreate => "after-create",
            Self::AfterRecord => "after-record",
            Self::AfterExport => "after-export",
            Self::BeforeReady => "before-ready",
            Self::AfterResize => "after-resize",
            Self::AfterUnexport => "after-unexport",
            Self::AfterDelete => "after-delete",
        }
    }
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A crash point and the volume it is limited to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrashSpec {
    /// Where.
    pub point: CrashPoint,
    /// Only for this volume (object name); `None` = the first volume that gets there.
    pub volume: Option<String>,
}

/// A value of [`ENV`] that names no crash point.
#[derive(Debug, thiserror::Error)]
#[error(
    "{ENV}={value:?} names no crash point; use one of {} with an optional :<volume>",
    names()
)]
pub struct CrashSpecError {
    /// The value given.
    pub value: String,
}

fn names() -> String {
    CrashPoint::ALL.map(CrashPoint::as_str).join(", ")
}

impl CrashSpec {
    /// Parses `<point>[:<volume>]`.
    pub fn parse(value: &str) -> Result<Self, CrashSpecError> {
        let (p, v) = match value.split_once(':') {
            Some((p, v)) => (p, Some(v)),
            None => (value, None),
        };
        let err = || CrashSpecError {
            value: value.to_string(),
        };
        let point = CrashPoint::ALL
            .into_iter()
            .find(|c| c.as_str() == p.trim())
            .ok_or_else(err)?;
        let volume = match v.map(str::trim) {
            Some("") => return Err(err()),
            Some(v) => Some(v.to_string()),
            None => None,
        };
        Ok(Self { point, volume })
    }

    /// Reads [`ENV`]: `Ok(None)` when unset or empty.
    pub fn from_env() -> Result<Option<Self>, CrashSpecError> {
        match std::env::var(ENV) {
            Ok(v) if !v.trim().is_empty() => Self::parse(&v).map(Some),
            Ok(_) => Ok(None),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(v)) => Err(CrashSpecError {
                value: v.to_string_lossy().into_owned(),
            }),
        }
    }
}

static ARMED: OnceLock<CrashSpec> = OnceLock::new();

/// Arms a crash point for the rest of the process's life (the first call wins). Only the
/// `disk-agent` binary calls this; a library user never should.
pub fn arm(spec: CrashSpec) {
    let _ = ARMED.set(spec);
}

/// The armed crash point, if any.
pub fn armed() -> Option<&'static CrashSpec> {
    ARMED.get()
}

/// Kills the process with SIGKILL when `point` is armed for `volume`; otherwise returns.
pub fn reached(point: CrashPoint, volume: &str) {
    let Some(spec) = ARMED.get() else {
        return;
    };
    if spec.point != point || spec.volume.as_deref().is_some_and(|v| v != volume) {
        return;
    }
    tracing::error!(point = %point, volume, "crash point reached; killing this process with SIGKILL ({ENV})");
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    // SIGKILL to oneself is delivered before kill(2) returns; this is never reached.
    std::process::abort();
}
