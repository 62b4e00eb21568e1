//! Where the PostgreSQL password comes from, and a type that never shows it.
//!
//! The password is read again on every (re)connect, so a rotated Secret, environment or
//! mounted file takes effect at the next connection without a restart. Nothing here puts the
//! password into an error, a log line or `Debug` output: errors name the field and the
//! source (`metaSync.passwordFile: cannot read /etc/liteio/pg-password`), never the value.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use crate::error::{Error, Result};

/// A password. `Debug` shows `Password(<redacted>)`; there is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(Vec<u8>);

impl Password {
    /// Wraps the bytes of a password.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }

    /// The bytes, for the one place that sends them (the connection's config).
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Password(<redacted>)")
    }
}

/// `metaSync.passwordSecret`: a key of a Secret in the controller's namespace.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct SecretKeyRef {
    /// Name of the Secret.
    pub name: String,
    /// Key in its `data`.
    pub key: String,
}

/// Where the password comes from.
#[derive(Clone)]
pub enum PasswordSource {
    /// The URL's own password, if any.
    Url,
    /// `metaSync.passwordEnv`: an environment variable of the controller.
    Env(String),
    /// `metaSync.passwordFile`: a file, one trailing newline trimmed.
    File(PathBuf),
    /// `metaSync.passwordSecret`: a key of a Secret, one trailing newline trimmed.
    Secret {
        /// Secrets of the controller's namespace.
        secrets: Box<Api<Secret>>,
        /// `namespace/name` of the Secret (messages).
        namespace: String,
        /// Which Secret and key.
        reference: SecretKeyRef,
    },
}

impl std::fmt::Debug for PasswordSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Url => f.write_str("Url"),
            Self::Env(name) => f.debug_tuple("Env").field(name).finish(),
            Self::File(path) => f.debug_tuple("File").field(path).finish(),
            Self::Secret {
                namespace,
                reference,
                ..
            } => f
                .debug_struct("Secret")
                .field("namespace", namespace)
                .field("name", &reference.name)
                .field("key", &reference.key)
                .finish(),
        }
    }
}

/// Drops one trailing `\n` or `\r\n` (files and Secrets made with `echo` or an editor).
fn trim_newline(mut v: Vec<u8>) -> Vec<u8> {
    if v.last() == Some(&b'\n') {
        v.pop();
        if v.last() == Some(&b'\r') {
            v.pop();
        }
    }
    v
}

impl PasswordSource {
    /// The config field this source comes from.
    pub fn field(&self) -> &'static str {
        match self {
            Self::Url => "metaSync.postgresUrl",
            Self::Env(_) => "metaSync.passwordEnv",
            Self::File(_) => "metaSync.passwordFile",
            Self::Secret { .. } => "metaSync.passwordSecret",
        }
    }

    /// Reads the password now; `None` for [`PasswordSource::Url`]. Errors name the field
    /// and where it looked, never the value.
    pub async fn read(&self) -> Result<Option<Password>> {
        let field = self.field();
        let bytes = match self {
            Self::Url => return Ok(None),
            Self::Env(name) => match std::env::var_os(name) {
                Some(v) => v.into_encoded_bytes(),
                None => {
                    return Err(Error::config(
                        field,
                        format!("environment variable {name} is not set"),
                    ));
                }
            },
            Self::File(path) => trim_newline(tokio::fs::read(path).await.map_err(|e| {
                Error::config(field, format!("cannot read {}: {e}", path.display()))
            })?),
            Self::Secret {
                secrets,
                namespace,
                reference,
            } => {
                let name = &reference.name;
                let secret = secrets.get_opt(name).await.map_err(|e| {
                    Error::kube(format!("read Secret {namespace}/{name} ({field})"), e)
                })?;
                let Some(secret) = secret else {
                    return Err(Error::config(
                        format!("{field}.name"),
                        format!("Secret {namespace}/{name} does not exist"),
                    ));
                };
                let value = secret
                    .data
                    .and_then(|mut d| d.remove(&reference.key))
                    .map(|b| b.0)
                    .or_else(|| {
                        secret
                            .string_data
                            .and_then(|mut d| d.remove(&reference.key))
                            .map(String::into_bytes)
                    });
                match value {
                    Some(v) => trim_newline(v),
                    None => {
                        return Err(Error::config(
                            format!("{field}.key"),
                            format!("Secret {namespace}/{name} has no key {:?}", reference.key),
                        ));
                    }
                }
            }
        };
        if bytes.is_empty() {
            return Err(Error::config(field, "the password is empty"));
        }
        Ok(Some(Password(bytes)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn debug_redacts() {
        let p = Password::new("hunter2");
        assert_eq!(format!("{p:?}"), "Password(<redacted>)");
        assert_eq!(p.expose(), b"hunter2");
        let wrapped = format!("{:?}", Some(p));
        assert!(!wrapped.contains("hunter2"), "{wrapped}");
    }

    #[test]
    fn one_trailing_newline_goes() {
        assert_eq!(trim_newline(b"pw\n".to_vec()), b"pw");
        assert_eq!(trim_newline(b"pw\r\n".to_vec()), b"pw");
        assert_eq!(trim_newline(b"pw\n\n".to_vec()), b"pw\n");
        assert_eq!(trim_newline(b" pw ".to_vec()), b" pw ");
    }

    #[tokio::test]
    async fn file_and_env_errors_name_the_field_not_the_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "s3cret-file\n").unwrap();
        let got = PasswordSource::File(path.clone()).read().await.unwrap();
        assert_eq!(got.unwrap().expose(), b"s3cret-file");
        let missing = dir.path().join("nope");
        let err = PasswordSource::File(missing).read().await.unwrap_err();
        assert!(
            err.to_string()
                .starts_with("config field metaSync.passwordFile: cannot read "),
            "{err}"
        );
        std::fs::write(&path, "\n").unwrap();
        let err = PasswordSource::File(path).read().await.unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
        let err = PasswordSource::Env("LITEIO_TEST_SURELY_UNSET_VARIABLE".into())
            .read()
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "config field metaSync.passwordEnv: environment variable \
             LITEIO_TEST_SURELY_UNSET_VARIABLE is not set"
        );
        assert_eq!(PasswordSource::Url.read().await.unwrap(), None);
    }
}
