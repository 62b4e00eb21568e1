//! Errors of the agent's control loop (pool reporting, heartbeat, sync, recovery).

use std::fmt;
use std::time::Duration;

use crate::engine::{self, EngineError};
use crate::exporter::ExportError;

/// Small, stable classification of [`AgentError`]s: metric labels, log fields, requeue policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The API server refused or failed a request (5xx, transport).
    Api,
    /// Optimistic concurrency: the object changed under us; retry with a fresh copy.
    Conflict,
    /// An object the agent needs does not exist (yet).
    NotFound,
    /// A request did not finish in time.
    Timeout,
    /// The pool engine failed.
    Engine(engine::ErrorKind),
    /// The NVMe-oF exporter failed or is absent.
    Export,
    /// The object's content cannot be served (bad size, wrong type for this pool).
    InvalidObject,
    /// A blocking engine task was cancelled or panicked.
    Internal,
}

impl ErrorKind {
    /// Bounded label for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Api => "api",
            Self::Conflict => "conflict",
            Self::NotFound => "not_found",
            Self::Timeout => "timeout",
            Self::Engine(k) => match k {
                engine::ErrorKind::NotFound => "engine_not_found",
                engine::ErrorKind::AlreadyExistsDifferent => "engine_already_exists_different",
                engine::ErrorKind::NoSpace => "engine_no_space",
                engine::ErrorKind::Unsupported => "engine_unsupported",
                engine::ErrorKind::InvalidArgument => "engine_invalid_argument",
                engine::ErrorKind::Busy => "engine_busy",
                engine::ErrorKind::PoolUnavailable => "engine_pool_unavailable",
                engine::ErrorKind::Io => "engine_io",
                _ => "engine_command_failed",
            },
            Self::Export => "export",
            Self::InvalidObject => "invalid_object",
            Self::Internal => "internal",
        }
    }
}

/// Whether retrying a failed reconcile on a timer can help: the one place that decides it
/// ([`AgentError::retry`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Retry {
    /// Transient (the API server, a timeout, a busy engine, I/O): retried with back-off.
    Backoff,
    /// Permanent as things stand (the engine cannot do it on this pool, the object is
    /// invalid, the export cannot be served here): written to the object's status with a
    /// Warning event, never retried on a timer, reconciled again only when the object or the
    /// pool changes.
    OnChange,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a control-loop step failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// A Kubernetes API request failed.
    #[error("cannot {op} {what}")]
    Kube {
        /// `get`, `patch`, `create`, …
        op: &'static str,
        /// `StoragePool node-1`, `Lease obnvmf/node-1`, …
        what: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// A Kubernetes API request did not answer in time.
    #[error("{op} {what} timed out after {}ms", after.as_millis())]
    Timeout {
        /// Operation.
        op: &'static str,
        /// Object.
        what: String,
        /// Limit.
        after: Duration,
    },
    /// A pool engine operation failed.
    #[error("cannot {op} {name} in the pool")]
    Engine {
        /// Operation.
        op: &'static str,
        /// Volume or snapshot.
        name: String,
        /// The engine error.
        #[source]
        source: EngineError,
    },
    /// The exporter failed.
    #[error("cannot {op} the NVMe-oF export of volume {volume}")]
    Export {
        /// `create` or `remove`.
        op: &'static str,
        /// Volume name.
        volume: String,
        /// The exporter's error.
        #[source]
        source: ExportError,
    },
    /// The exporter could not assemble (or tear down) a multi-disk volume.
    #[error("cannot {op} multi-disk volume {data_control}")]
    Assembly {
        /// `assemble` or `tear down`.
        op: &'static str,
        /// AntstorDataControl name.
        data_control: String,
        /// The exporter's error.
        #[source]
        source: ExportError,
    },
    /// The object cannot be served as it is.
    #[error("{what}: {reason}")]
    InvalidObject {
        /// `AntstorVolume obnvmf/pvc-1`.
        what: String,
        /// What is wrong.
        reason: String,
    },
    /// A required object is missing.
    #[error("{what} not found")]
    NotFound {
        /// The object.
        what: String,
    },
    /// A blocking engine task did not complete.
    #[error("engine task for {op} {name} did not complete")]
    Join {
        /// Operation.
        op: &'static str,
        /// Object.
        name: String,
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
    },
}

impl AgentError {
    /// The classification.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Kube { source, .. } => match source {
                kube::Error::Api(s) if s.code == 409 => ErrorKind::Conflict,
                kube::Error::Api(s) if s.code == 404 => ErrorKind::NotFound,
                _ => ErrorKind::Api,
            },
            Self::Timeout { .. } => ErrorKind::Timeout,
            Self::Engine { source, .. } => ErrorKind::Engine(source.kind()),
            Self::Export { .. } | Self::Assembly { .. } => ErrorKind::Export,
            Self::InvalidObject { .. } => ErrorKind::InvalidObject,
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::Join { .. } => ErrorKind::Internal,
        }
    }

    /// Whether a retry on a timer can help (see [`Retry`]). The permanent errors:
    /// - the engine cannot do it on this pool (`engine_unsupported`, e.g. snapshots on a
    ///   file system without reflinks, a layout LVM cannot build here);
    /// - the engine refuses the arguments (`engine_invalid_argument`, e.g. a shrink);
    /// - the pool holds a different object under the name (`engine_already_exists_different`);
    /// - the object cannot be served as it is (`invalid_object`);
    /// - the export cannot be made by this agent (built without an NVMe-oF target), or the
    ///   assembly of a multi-disk volume (a target without SPDK, or SPDK in interrupt mode).
    ///
    /// The exporter's `InvalidRequest` stays transient: some of its refusals depend on the
    /// order of steps in a migration (no export yet for a pipe) and heal on the next pass.
    pub fn retry(&self) -> Retry {
        use engine::ErrorKind as E;
        match self {
            Self::Engine { source, .. } => match source.kind() {
                E::Unsupported | E::InvalidArgument | E::AlreadyExistsDifferent => Retry::OnChange,
                _ => Retry::Backoff,
            },
            Self::InvalidObject { .. } => Retry::OnChange,
            Self::Export {
                source: ExportError::Unavailable { .. } | ExportError::Unsupported(_),
                ..
            }
            | Self::Assembly {
                source: ExportError::Unavailable { .. } | ExportError::Unsupported(_),
                ..
            } => Retry::OnChange,
            Self::Kube { .. }
            | Self::Timeout { .. }
            | Self::Export { .. }
            | Self::Assembly { .. }
            | Self::NotFound { .. }
            | Self::Join { .. } => Retry::Backoff,
        }
    }

    /// Whether the error is permanent ([`Retry::OnChange`]).
    pub fn is_permanent(&self) -> bool {
        self.retry() == Retry::OnChange
    }

    /// A Kubernetes request error.
    pub fn kube(op: &'static str, what: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            op,
            what: what.into(),
            source,
        }
    }

    /// An engine error.
    pub fn engine(op: &'static str, name: impl Into<String>, source: EngineError) -> Self {
        Self::Engine {
            op,
            name: name.into(),
            source,
        }
    }

    /// The error and its sources on one line, for status messages and logs.
    pub fn chain(&self) -> String {
        error_chain(self)
    }
}

/// `outer: inner: innermost`.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let s = e.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = e.source();
    }
    out
}

/// True when a kube error is a 404.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// True when a kube error is a 409.
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Result alias of the control loop.
pub type Result<T, E = AgentError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineError;

    fn engine(source: EngineError) -> AgentError {
        AgentError::engine("create", "pvc-1", source)
    }

    /// Every permanent error, by name: none is retried on a timer.
    #[test]
    fn the_permanent_errors_wait_for_a_change() {
        let permanent = [
            (
                "engine_unsupported",
                engine(EngineError::Unsupported {
                    op: "snapshot",
                    pool: "p".into(),
                    reason: "no reflinks".into(),
                }),
            ),
            (
                "engine_invalid_argument",
                engine(EngineError::InvalidArgument("bad name".into())),
            ),
            (
                "engine_invalid_argument",
                engine(EngineError::Shrink {
                    name: "pvc-1".into(),
                    current: 2,
                    requested: 1,
                }),
            ),
            (
                "engine_already_exists_different",
                engine(EngineError::SizeMismatch {
                    what: "volume",
                    name: "pvc-1".into(),
                    existing: 1,
                    requested: 2,
                }),
            ),
            (
                "engine_already_exists_different",
                engine(EngineError::Conflict {
                    what: "snapshot",
                    name: "s".into(),
                    detail: "of another volume".into(),
                }),
            ),
            (
                "invalid_object",
                AgentError::InvalidObject {
                    what: "AntstorVolume obnvmf/pvc-1".into(),
                    reason: "spec.sizeByte: below the minimum".into(),
                },
            ),
            (
                "export",
                AgentError::Export {
                    op: "create",
                    volume: "pvc-1".into(),
                    source: ExportError::Unavailable {
                        volume: "pvc-1".into(),
                    },
                },
            ),
            (
                "export",
                AgentError::Assembly {
                    op: "assemble",
                    data_control: "pvc-1".into(),
                    source: ExportError::Unsupported("no SPDK".into()),
                },
            ),
        ];
        for (kind, e) in &permanent {
            assert_eq!(e.kind().as_str(), *kind, "{}", e.chain());
            assert_eq!(e.retry(), Retry::OnChange, "{kind}: {}", e.chain());
            assert!(e.is_permanent());
        }
    }

    /// What a retry can heal keeps its back-off.
    #[test]
    fn transient_errors_back_off() {
        let transient = [
            AgentError::Timeout {
                op: "patch",
                what: "AntstorVolume obnvmf/pvc-1".into(),
                after: Duration::from_secs(5),
            },
            AgentError::NotFound {
                what: "AntstorVolume obnvmf/origin".into(),
            },
            engine(EngineError::NoSpace {
                pool: "p".into(),
                name: "pvc-1".into(),
                free: 1,
                needed: 2,
            }),
            engine(EngineError::Busy {
                what: "volume",
                name: "pvc-1".into(),
                reason: "attached".into(),
            }),
            engine(EngineError::PvLost {
                vg: "vg".into(),
                stderr: "missing".into(),
            }),
            engine(EngineError::NotFound {
                what: "volume",
                name: "pvc-1".into(),
            }),
            engine(EngineError::Io {
                op: "write",
                path: "/x".into(),
                source: std::io::Error::other("EIO"),
            }),
            AgentError::Export {
                op: "pipe",
                volume: "pvc-1".into(),
                source: ExportError::InvalidRequest("not exported yet".into()),
            },
            AgentError::Export {
                op: "create",
                volume: "pvc-1".into(),
                source: ExportError::Target {
                    message: "listener refused".into(),
                    source: None,
                },
            },
            AgentError::Assembly {
                op: "assemble",
                data_control: "pvc-1".into(),
                source: ExportError::Target {
                    message: "attach refused".into(),
                    source: None,
                },
            },
        ];
        for e in &transient {
            assert_eq!(e.retry(), Retry::Backoff, "{}", e.chain());
        }
    }
}
