//! The driver's errors and the one place where they become gRPC status codes: [`CsiError`]
//! and its [`ErrorKind`], and `answer`, through which every Controller and Node handler
//! replies (a failure logged once, then turned into a status).

use std::fmt::Write as _;

/// Why a CSI call failed.
#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    /// A request field is missing or malformed.
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// Request field, in the CSI message's naming (`capacity_range.required_bytes`).
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The volume, snapshot or path does not exist.
    #[error("{0}")]
    NotFound(String),
    /// An object with this name exists with other parameters.
    #[error("{0}")]
    AlreadyExists(String),
    /// No pool has room for the request.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The requested size is outside what the driver or the pool allows.
    #[error("{0}")]
    OutOfRange(String),
    /// The object is not in a state that allows the call.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The work was started but has not finished within the wait bound; calling again is safe.
    #[error("{0}")]
    Pending(String),
    /// The volume's target cannot be reached now (refused, timed out, no route): UNAVAILABLE,
    /// so that the CO retries.
    #[error("{0}")]
    Unreachable(String),
    /// The target and this host did not authenticate each other (no keys, rejected keys):
    /// UNAUTHENTICATED.
    #[error("{message}")]
    Unauthenticated {
        /// Which refusal, a fixed word (`keys_required`, `keys_rejected`): the `reason` of
        /// `liteio_auth_refusals_total`.
        reason: &'static str,
        /// What happened and what to check.
        message: String,
    },
    /// Another call for the same object is in progress.
    #[error("{0}")]
    Busy(String),
    /// The call or option is not offered by this driver.
    #[error("{0}")]
    Unimplemented(String),
    /// A Kubernetes API call failed.
    #[error("{what}")]
    Kube {
        /// What the driver was doing (`get AntstorVolume obnvmf/pvc-1`).
        what: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A system command failed.
    #[error("{command} exited with {status}: {stderr}")]
    Command {
        /// The command line, for the log.
        command: String,
        /// Exit status (or `signal`).
        status: String,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// A file-system operation failed.
    #[error("{what}")]
    Io {
        /// What the driver was doing.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A bug or an impossible state.
    #[error("{0}")]
    Internal(String),
}

/// Coarse classes of [`CsiError`]; drives gRPC codes (and would drive metric labels).
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Bad request.
    InvalidArgument,
    /// Missing object.
    NotFound,
    /// Name taken with other parameters.
    AlreadyExists,
    /// Out of space.
    ResourceExhausted,
    /// Size out of range.
    OutOfRange,
    /// Wrong state for the call.
    FailedPrecondition,
    /// Not finished in time; retry.
    Timeout,
    /// Concurrent call or write conflict; retry.
    Aborted,
    /// A dependency (API server) is unreachable; retry.
    Unavailable,
    /// Not offered.
    Unimplemented,
    /// Authentication failed (keys missing or rejected).
    Unauthenticated,
    /// Anything else.
    Internal,
}

impl ErrorKind {
    /// The gRPC status code CSI callers expect for this class.
    pub fn code(self) -> tonic::Code {
        match self {
            ErrorKind::InvalidArgument => tonic::Code::InvalidArgument,
            ErrorKind::NotFound => tonic::Code::NotFound,
            ErrorKind::AlreadyExists => tonic::Code::AlreadyExists,
            ErrorKind::ResourceExhausted => tonic::Code::ResourceExhausted,
            ErrorKind::OutOfRange => tonic::Code::OutOfRange,
            ErrorKind::FailedPrecondition => tonic::Code::FailedPrecondition,
            ErrorKind::Timeout => tonic::Code::DeadlineExceeded,
            ErrorKind::Aborted => tonic::Code::Aborted,
            ErrorKind::Unavailable => tonic::Code::Unavailable,
            ErrorKind::Unimplemented => tonic::Code::Unimplemented,
            ErrorKind::Unauthenticated => tonic::Code::Unauthenticated,
            ErrorKind::Internal => tonic::Code::Internal,
        }
    }

    /// A short stable name, usable as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::NotFound => "not_found",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::ResourceExhausted => "resource_exhausted",
            ErrorKind::OutOfRange => "out_of_range",
            ErrorKind::FailedPrecondition => "failed_precondition",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Aborted => "aborted",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Unimplemented => "unimplemented",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::Internal => "internal",
        }
    }
}

/// Class of a Kubernetes client error.
pub fn kube_kind(e: &kube::Error) -> ErrorKind {
    match e {
        kube::Error::Api(s) => match s.code {
            404 => ErrorKind::NotFound,
            409 => ErrorKind::Aborted,
            400 | 422 => ErrorKind::InvalidArgument,
            429 | 500..=599 => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        },
        kube::Error::HyperError(_)
        | kube::Error::Service(_)
        | kube::Error::HttpError(_)
        | kube::Error::Auth(_) => ErrorKind::Unavailable,
        _ => ErrorKind::Internal,
    }
}

impl CsiError {
    /// The error's class.
    pub fn kind(&self) -> ErrorKind {
        match self {
            CsiError::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            CsiError::NotFound(_) => ErrorKind::NotFound,
            CsiError::AlreadyExists(_) => ErrorKind::AlreadyExists,
            CsiError::ResourceExhausted(_) => ErrorKind::ResourceExhausted,
            CsiError::OutOfRange(_) => ErrorKind::OutOfRange,
            CsiError::FailedPrecondition(_) => ErrorKind::FailedPrecondition,
            CsiError::Pending(_) => ErrorKind::Timeout,
            CsiError::Unreachable(_) => ErrorKind::Unavailable,
            CsiError::Busy(_) => ErrorKind::Aborted,
            CsiError::Unimplemented(_) => ErrorKind::Unimplemented,
            CsiError::Unauthenticated { .. } => ErrorKind::Unauthenticated,
            CsiError::Kube { source, .. } => kube_kind(source),
            CsiError::Command { .. } | CsiError::Io { .. } | CsiError::Internal(_) => {
                ErrorKind::Internal
            }
        }
    }

    /// An [`CsiError::InvalidArgument`] about `field`.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        CsiError::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// A [`CsiError::Kube`] for the API call `what`.
    pub fn kube(what: impl Into<String>, source: kube::Error) -> Self {
        CsiError::Kube {
            what: what.into(),
            source,
        }
    }

    /// A [`CsiError::Io`] for the operation `what`.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        CsiError::Io {
            what: what.into(),
            source,
        }
    }

    /// True when the error is a Kubernetes 404.
    pub fn is_not_found(&self) -> bool {
        self.kind() == ErrorKind::NotFound
    }

    /// The message with its causes: `get AntstorVolume x: connection refused`.
    pub fn chain(&self) -> String {
        let mut out = self.to_string();
        let mut cur = std::error::Error::source(self);
        while let Some(s) = cur {
            let _ = write!(out, ": {s}");
            cur = s.source();
        }
        out
    }
}

impl From<CsiError> for tonic::Status {
    fn from(e: CsiError) -> Self {
        tonic::Status::new(e.kind().code(), e.chain())
    }
}

/// The reply to CSI call `op`: what `call` returns, or its failure logged (with its kind and
/// its whole chain) and turned into a status.
pub(crate) async fn answer<T>(
    op: &str,
    call: impl std::future::Future<Output = Result<T>>,
) -> Result<tonic::Response<T>, tonic::Status> {
    call.await.map(tonic::Response::new).map_err(|e| {
        tracing::warn!(op, kind = e.kind().as_str(), error = %e.chain(), "CSI call failed");
        e.into()
    })
}

/// Result of the driver's operations.
pub type Result<T, E = CsiError> = std::result::Result<T, E>;

impl From<liteio_node::losetup::LoopError> for CsiError {
    fn from(e: liteio_node::losetup::LoopError) -> Self {
        use liteio_node::losetup::LoopError;
        match e {
            LoopError::Run { argv, source } => CsiError::io(format!("cannot run {argv}"), source),
            LoopError::Failed {
                argv,
                status,
                stderr,
            } => CsiError::Command {
                command: argv,
                status,
                stderr,
            },
            e @ LoopError::BadOutput { .. } => CsiError::Internal(e.to_string()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn api_err(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("boom", "Reason")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn kinds_map_to_csi_codes() {
        let cases: Vec<(CsiError, tonic::Code)> = vec![
            (
                CsiError::invalid("name", "must not be empty"),
                tonic::Code::InvalidArgument,
            ),
            (CsiError::NotFound("x".into()), tonic::Code::NotFound),
            (
                CsiError::AlreadyExists("x".into()),
                tonic::Code::AlreadyExists,
            ),
            (
                CsiError::ResourceExhausted("x".into()),
                tonic::Code::ResourceExhausted,
            ),
            (CsiError::OutOfRange("x".into()), tonic::Code::OutOfRange),
            (
                CsiError::FailedPrecondition("x".into()),
                tonic::Code::FailedPrecondition,
            ),
            (CsiError::Pending("x".into()), tonic::Code::DeadlineExceeded),
            (CsiError::Busy("x".into()), tonic::Code::Aborted),
            (
                CsiError::Unimplemented("x".into()),
                tonic::Code::Unimplemented,
            ),
            (CsiError::Internal("x".into()), tonic::Code::Internal),
            (CsiError::kube("get", api_err(404)), tonic::Code::NotFound),
            (CsiError::kube("update", api_err(409)), tonic::Code::Aborted),
            (
                CsiError::kube("create", api_err(422)),
                tonic::Code::InvalidArgument,
            ),
            (
                CsiError::kube("list", api_err(503)),
                tonic::Code::Unavailable,
            ),
        ];
        for (e, code) in cases {
            let status: tonic::Status = e.into();
            assert_eq!(status.code(), code, "{}", status.message());
        }
    }

    #[test]
    fn messages_name_the_field_and_carry_causes() {
        let s: tonic::Status =
            CsiError::invalid("capacity_range.required_bytes", "must not be negative").into();
        assert_eq!(
            s.message(),
            "capacity_range.required_bytes: must not be negative"
        );
        let e = CsiError::kube("get AntstorVolume obnvmf/pvc-1", api_err(503));
        assert!(
            e.chain().starts_with("get AntstorVolume obnvmf/pvc-1: "),
            "{}",
            e.chain()
        );
    }
}
