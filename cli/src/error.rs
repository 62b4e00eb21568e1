//! The plugin's errors: one short sentence each, printed on one line.

use std::path::PathBuf;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    /// The kubeconfig given with `--kubeconfig` could not be used.
    #[error("cannot use kubeconfig {}: {message}", path.display())]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// No kubeconfig was given and none could be inferred.
    #[error("cannot find a Kubernetes configuration (use --kubeconfig or set KUBECONFIG): {0}")]
    NoConfig(String),
    /// The object does not exist.
    #[error("{kind} {name} not found in namespace {namespace}")]
    NotFound {
        /// `volume`, `pool`.
        kind: &'static str,
        /// Object name.
        name: String,
        /// Namespace searched.
        namespace: String,
    },
    /// An API request failed.
    #[error("cannot {action}: {message}")]
    Api {
        /// What was attempted (`list storagepools in namespace obnvmf`).
        action: String,
        /// The API server's message.
        message: String,
    },
    /// The request cannot be carried out as things stand (the message says why and what to
    /// do).
    #[error("{0}")]
    Refused(String),
    /// No disk-agent answered for its metrics (`top`); the message names each one and why.
    #[error("no disk-agent answered: {0}")]
    NoMetrics(String),
    /// The result could not be rendered.
    #[error("cannot render the output as {format}: {message}")]
    Render {
        /// `json` or `yaml`.
        format: &'static str,
        /// The serializer's message.
        message: String,
    },
}

/// Coarse class of a [`CliError`], for callers that branch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Configuration of the plugin itself.
    Config,
    /// The named object does not exist.
    NotFound,
    /// The API server refused or could not be reached.
    Api,
    /// Refused as things stand.
    Refused,
    /// Output rendering.
    Render,
    /// The components that serve what was asked for did not answer.
    Unreachable,
}

impl CliError {
    /// The class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Kubeconfig { .. } | Self::NoConfig(_) => ErrorKind::Config,
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::Api { .. } => ErrorKind::Api,
            Self::Refused(_) => ErrorKind::Refused,
            Self::Render { .. } => ErrorKind::Render,
            Self::NoMetrics(_) => ErrorKind::Unreachable,
        }
    }

    /// An [`CliError::Api`] for `action` from a kube error, keeping only the server's message.
    pub fn api(action: impl Into<String>, err: &kube::Error) -> Self {
        let message = match err {
            kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
            other => other.to_string(),
        };
        Self::Api {
            action: action.into(),
            message,
        }
    }
}

/// True when `err` is the API server's 404.
pub fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404)
}
