//! Errors of the SPDK engine.

/// Broad class of an SPDK engine error; drives CSI codes, conditions and metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The named object does not exist.
    NotFound,
    /// An object with that name exists with another shape.
    AlreadyExists,
    /// The request is malformed.
    InvalidArgument,
    /// Not enough space.
    NoSpace,
    /// The runtime is not running, or stopped while the request was in flight.
    NotRunning,
    /// SPDK reported a failure, or a request panicked on the SPDK thread.
    Engine,
    /// SPDK did not answer in time (a stuck reactor or a lost completion).
    Timeout,
}

/// An SPDK engine error.
#[derive(Debug, thiserror::Error)]
pub enum SpdkError {
    /// SPDK returned a negative errno.
    #[error("{op} {name}: {source}")]
    Errno {
        /// The operation.
        op: &'static str,
        /// The object it was about.
        name: String,
        /// The errno as an OS error.
        #[source]
        source: std::io::Error,
    },
    /// No such object.
    #[error("{kind} {name} does not exist")]
    NotFound {
        /// Kind of object (`bdev`, `lvstore`, `lvol`, `subsystem`).
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// The object exists with another shape.
    #[error("{kind} {name} already exists {detail}")]
    AlreadyExists {
        /// Kind of object.
        kind: &'static str,
        /// Its name.
        name: String,
        /// How it differs.
        detail: String,
    },
    /// A request field is invalid.
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The SPDK runtime is not running.
    #[error("the SPDK runtime is not running")]
    NotRunning,
    /// The request panicked on the SPDK thread; SPDK went on (the panic is logged).
    #[error("the request panicked on the SPDK thread (see the log); SPDK goes on")]
    Panicked,
    /// No answer within the request deadline; a late answer is dropped.
    #[error(
        "no answer from SPDK within {after:?} to the request from {request}; is the reactor stuck?"
    )]
    Timeout {
        /// The code that sent the request (`file:line:column`).
        request: String,
        /// The deadline.
        after: std::time::Duration,
    },
    /// The SPDK runtime could not start.
    #[error("SPDK did not start: {0}")]
    Start(String),
}

impl SpdkError {
    /// Broad class of the error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Errno { source, .. } => match source.raw_os_error() {
                Some(libc_errno::ENODEV) | Some(libc_errno::ENOENT) => ErrorKind::NotFound,
                Some(libc_errno::EEXIST) => ErrorKind::AlreadyExists,
                Some(libc_errno::ENOSPC) | Some(libc_errno::ENOMEM) => ErrorKind::NoSpace,
                Some(libc_errno::EINVAL) => ErrorKind::InvalidArgument,
                _ => ErrorKind::Engine,
            },
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::AlreadyExists { .. } => ErrorKind::AlreadyExists,
            Self::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            Self::NotRunning => ErrorKind::NotRunning,
            Self::Start(_) | Self::Panicked => ErrorKind::Engine,
            Self::Timeout { .. } => ErrorKind::Timeout,
        }
    }

    /// The error for a negative SPDK return code (the one place errnos are converted).
    pub fn errno(op: &'static str, name: impl Into<String>, rc: i32) -> Self {
        Self::Errno {
            op,
            name: name.into(),
            source: std::io::Error::from_raw_os_error(rc.saturating_abs()),
        }
    }
}

/// Result of an SPDK engine call.
pub type Result<T, E = SpdkError> = std::result::Result<T, E>;

/// errno values SPDK returns (Linux).
pub(crate) mod libc_errno {
    pub const EPERM: i32 = 1;
    pub const ENOENT: i32 = 2;
    pub const EAGAIN: i32 = 11;
    pub const ENOMEM: i32 = 12;
    pub const EEXIST: i32 = 17;
    pub const EBUSY: i32 = 16;
    pub const ENODEV: i32 = 19;
    pub const EINVAL: i32 = 22;
    pub const ENOSPC: i32 = 28;
    pub const EINPROGRESS: i32 = 115;
    pub const ESTALE: i32 = 116;
    pub const ENOKEY: i32 = 126;
}
