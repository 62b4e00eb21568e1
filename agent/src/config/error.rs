//! Why a configuration could not be used ([`ConfigError`]), and the checks that say so: each
//! names the field by its dotted path. Knows nothing of the sections it checks.

use std::fmt;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read agent config {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file's content is wrong; the source says where and why.
    #[error("agent config {}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: Box<ConfigError>,
    },
    /// YAML syntax, a wrong type, an unknown key or a value outside a fixed set.
    #[error("{field}: {message}")]
    Parse {
        /// Dotted path of the field (`storage.pooling.mode`); `.` for the document.
        field: String,
        /// What the parser said.
        message: String,
    },
    /// A required field is missing or empty.
    #[error("{field}: required {reason}")]
    Missing {
        /// Dotted path of the field.
        field: String,
        /// When it is required.
        reason: String,
    },
    /// A value is present but not acceptable.
    #[error("{field}: {value} {problem}")]
    Invalid {
        /// Dotted path of the field.
        field: String,
        /// The value as written.
        value: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl ConfigError {
    /// Dotted path of the offending field, when the error is about one field.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Read { .. } => None,
            Self::File { source, .. } => source.field(),
            Self::Parse { field, .. }
            | Self::Missing { field, .. }
            | Self::Invalid { field, .. } => Some(field),
        }
    }
}

pub(super) fn invalid(
    field: &str,
    value: impl fmt::Display,
    problem: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_string(),
        value: value.to_string(),
        problem: problem.into(),
    }
}

pub(super) fn missing(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Missing {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// `value` of `field` must lie in `range`; `problem` says so when it does not.
pub(super) fn in_range<T: PartialOrd + fmt::Display>(
    field: &str,
    value: T,
    range: impl RangeBounds<T>,
    problem: impl Into<String>,
) -> Result<(), ConfigError> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(invalid(field, value, problem))
    }
}

/// The duration `field` must not be zero.
pub(super) fn positive(field: &str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        return Err(invalid(field, "0s", "must be positive"));
    }
    Ok(())
}

/// The path `field` must be absolute; `what` it is, in the message (`path`, `directory path`).
pub(super) fn absolute(field: &str, path: &Path, what: &str) -> Result<(), ConfigError> {
    if path.is_absolute() {
        return Ok(());
    }
    Err(invalid(
        field,
        path.display(),
        format!("must be an absolute {what}"),
    ))
}
