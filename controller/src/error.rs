//! The controller's error type. Every variant names the object or field it is about; the
//! [`ErrorKind`] drives metric labels and retry decisions in one place.

use std::path::PathBuf;

/// Coarse class of an [`Error`]; bounded, so it can be a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The configuration file is missing, unreadable or invalid.
    Config,
    /// A Kubernetes API request failed (retried with back-off).
    Api,
    /// An optimistic-concurrency conflict (retried at once).
    Conflict,
    /// An object is not valid; retrying does not help until it changes.
    Invalid,
    /// The SQL metadata mirror failed.
    Sql,
    /// A local I/O failure (listening socket, files).
    Io,
    /// This instance is not (or no longer) the leader.
    Leadership,
}

impl ErrorKind {
    /// Stable lower-case name, used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Config => "config",
            Self::Api => "api",
            Self::Conflict => "conflict",
            Self::Invalid => "invalid",
            Self::Sql => "sql",
            Self::Io => "io",
            Self::Leadership => "leadership",
        }
    }
}

/// Errors of the controller library.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The config file could not be read.
    #[error("cannot read config file {}", path.display())]
    ConfigRead {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid YAML of the expected shape.
    #[error("config file {}: field {field}: {message}", path.display())]
    ConfigParse {
        /// The file.
        path: PathBuf,
        /// Path of the offending field (`scheduler.maxRemoteVolumeCount`).
        field: String,
        /// What the parser said.
        message: String,
    },
    /// A config value is out of range or inconsistent.
    #[error("config field {field}: {reason}")]
    ConfigInvalid {
        /// Path of the field.
        field: String,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// A Kubernetes API request failed.
    #[error("{action} failed")]
    Kube {
        /// What was attempted (`patch AntstorVolume obnvmf/pvc-1`).
        action: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// An object cannot be handled until a user changes it.
    #[error("{object}: {reason}")]
    InvalidObject {
        /// `kind ns/name`.
        object: String,
        /// Why.
        reason: String,
    },
    /// The SQL metadata mirror failed.
    #[error("metadata sync: {action} failed")]
    Sql {
        /// What was attempted.
        action: String,
        /// The cause.
        #[source]
        source: rusqlite::Error,
    },
    /// The PostgreSQL metadata mirror failed (connect, migrate or a statement).
    #[error("metadata sync: {action} failed")]
    Postgres {
        /// What was attempted (`connect to PostgreSQL at postgres://liteio@db:5432/meta`).
        action: String,
        /// The cause.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The PostgreSQL server's certificate was refused (`sslmode=verify-ca|verify-full`).
    #[error("metadata sync: {action} failed: {reason}")]
    PostgresTls {
        /// What was attempted (`connect to PostgreSQL at postgres://liteio@db:5432/meta`).
        action: String,
        /// Why (`server certificate not trusted (sslmode=verify-full, CA from
        /// metaSync.caFile /etc/ca.pem): UnknownIssuer`).
        reason: String,
    },
    /// A metadata-mirror operation did not finish in time (the connection is dropped).
    #[error("metadata sync: {action} timed out after {after:?}")]
    SqlTimeout {
        /// What was attempted.
        action: String,
        /// The bound that ran out.
        after: std::time::Duration,
    },
    /// A local I/O operation failed.
    #[error("{action} failed")]
    Io {
        /// What was attempted (`listen on 0.0.0.0:9090`).
        action: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// One reconcile of an object did not finish in time (a hung API request): it is
    /// abandoned and retried with back-off; the other objects go on.
    #[error("reconcile of {object} did not finish within {after:?}")]
    ReconcileTimeout {
        /// `kind ns/name`.
        object: String,
        /// The bound that ran out.
        after: std::time::Duration,
    },
    /// This instance lost the leader Lease.
    #[error("lost leadership of Lease {lease}")]
    LeadershipLost {
        /// `namespace/name` of the Lease.
        lease: String,
    },
}

impl Error {
    /// The class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::ConfigRead { .. } | Self::ConfigParse { .. } | Self::ConfigInvalid { .. } => {
                ErrorKind::Config
            }
            Self::Kube { source, .. } => match source {
                kube::Error::Api(s) if s.code == 409 => ErrorKind::Conflict,
                _ => ErrorKind::Api,
            },
            Self::InvalidObject { .. } => ErrorKind::Invalid,
            Self::ReconcileTimeout { .. } => ErrorKind::Api,
            Self::Sql { .. }
            | Self::Postgres { .. }
            | Self::PostgresTls { .. }
            | Self::SqlTimeout { .. } => ErrorKind::Sql,
            Self::Io { .. } => ErrorKind::Io,
            Self::LeadershipLost { .. } => ErrorKind::Leadership,
        }
    }

    /// Wraps a kube error with the action that failed.
    pub fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            action: action.into(),
            source,
        }
    }

    /// A config error about `field`. URL passwords in `reason` (a quoted bad value) and in
    /// `field` (a map key) are redacted.
    pub fn config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::ConfigInvalid {
            field: crate::redact::redact_url_passwords(&field.into()),
            reason: crate::redact::redact_url_passwords(&reason.into()),
        }
    }

    /// This error and its causes, `: `-separated, for logs (`Display` shows only the action
    /// that failed).
    pub fn chain(&self) -> String {
        let mut out = self.to_string();
        let mut src = std::error::Error::source(self);
        while let Some(e) = src {
            out.push_str(": ");
            out.push_str(&e.to_string());
            src = e.source();
        }
        out
    }

    /// True when the API answered 404.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Kube { source: kube::Error::Api(s), .. } if s.code == 404)
    }
}

/// Result with the controller's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_shows_the_cause() {
        let e = Error::Io {
            action: "listen on 0.0.0.0:9090".into(),
            source: std::io::Error::other("address in use"),
        };
        assert_eq!(e.to_string(), "listen on 0.0.0.0:9090 failed");
        assert_eq!(e.chain(), "listen on 0.0.0.0:9090 failed: address in use");
    }
}
