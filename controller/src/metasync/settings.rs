//! The `metaSync:` section of the config file ([`MetaSyncConfig`]) and its checks: exactly
//! one target, the password in at most one place, a CA only where `sslmode` uses it. It lives
//! with the mirror because its checks are the mirror's rules (the PostgreSQL URL, TLS and
//! password sources); [`crate::config`] re-exports it as one section of the file, so the
//! config knows nothing of the mirror's insides.

use std::path::PathBuf;

use serde::Deserialize;

use super::credentials::SecretKeyRef;
use super::pgurl::{describe, parse_url};
use super::tls::tls_settings;
use crate::error::{Error, Result};

/// The SQL metadata mirror (`metaSync:`): exactly one of `sqlitePath` and `postgresUrl`.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MetaSyncConfig {
    /// SQLite database file (created with its schema when missing).
    #[serde(default)]
    pub sqlite_path: Option<PathBuf>,
    /// PostgreSQL URL, `postgres://user[:password]@host:port/database` (libpq URL
    /// parameters such as `connect_timeout`, `options=-c%20search_path%3Dschema`,
    /// `sslmode=disable|prefer|require|verify-ca|verify-full` (default `prefer`) and
    /// `sslrootcert=/path/ca.pem` are accepted).
    #[serde(default)]
    pub postgres_url: Option<String>,
    /// The PostgreSQL password from a key of a Secret in the controller's namespace (read
    /// at every connect; one trailing newline trimmed).
    #[serde(default)]
    pub password_secret: Option<SecretKeyRef>,
    /// The PostgreSQL password from this environment variable of the controller.
    #[serde(default)]
    pub password_env: Option<String>,
    /// The PostgreSQL password from this file, e.g. a mounted Secret (read at every
    /// connect; one trailing newline trimmed).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// PEM file of the CA that signed the PostgreSQL server's certificate (for
    /// `sslmode=require|verify-ca|verify-full`; or `sslrootcert` in the URL).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Cluster name written into every row.
    #[serde(default)]
    pub cluster: String,
}

impl std::fmt::Debug for MetaSyncConfig {
    /// Shows the PostgreSQL URL without its password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = self.postgres_url.as_deref().map(|u| {
            parse_url(u)
                .map(|c| describe(&c.config))
                .unwrap_or_else(|_| "<invalid>".into())
        });
        f.debug_struct("MetaSyncConfig")
            .field("sqlite_path", &self.sqlite_path)
            .field("postgres_url", &url)
            .field("password_secret", &self.password_secret)
            .field("password_env", &self.password_env)
            .field("password_file", &self.password_file)
            .field("ca_file", &self.ca_file)
            .field("cluster", &self.cluster)
            .finish()
    }
}

/// Where the mirror goes, from a valid [`MetaSyncConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaSyncTarget {
    /// `metaSync.sqlitePath`.
    Sqlite(PathBuf),
    /// `metaSync.postgresUrl` (checked: a `postgres://` URL tokio-postgres accepts).
    Postgres(String),
}

impl MetaSyncConfig {
    /// The one target this section names; the error names the field.
    pub fn target(&self) -> Result<MetaSyncTarget> {
        match (&self.sqlite_path, &self.postgres_url) {
            (Some(_), Some(_)) => Err(Error::config(
                "metaSync",
                "set exactly one of sqlitePath and postgresUrl, not both",
            )),
            (None, None) => Err(Error::config(
                "metaSync",
                "set sqlitePath (embedded SQLite) or postgresUrl (PostgreSQL)",
            )),
            (Some(p), None) if p.as_os_str().is_empty() => {
                Err(Error::config("metaSync.sqlitePath", "must not be empty"))
            }
            (Some(p), None) => {
                for (field, set) in [
                    ("metaSync.passwordSecret", self.password_secret.is_some()),
                    ("metaSync.passwordEnv", self.password_env.is_some()),
                    ("metaSync.passwordFile", self.password_file.is_some()),
                    ("metaSync.caFile", self.ca_file.is_some()),
                ] {
                    if set {
                        return Err(Error::config(field, "is for postgresUrl, not sqlitePath"));
                    }
                }
                Ok(MetaSyncTarget::Sqlite(p.clone()))
            }
            (None, Some(u)) => {
                let url =
                    parse_url(u).map_err(|reason| Error::config("metaSync.postgresUrl", reason))?;
                let sources: Vec<&str> = [
                    ("passwordSecret", self.password_secret.is_some()),
                    ("passwordEnv", self.password_env.is_some()),
                    ("passwordFile", self.password_file.is_some()),
                ]
                .into_iter()
                .filter_map(|(f, set)| set.then_some(f))
                .collect();
                if sources.len() > 1 {
                    return Err(Error::config(
                        "metaSync",
                        format!(
                            "set at most one of passwordSecret, passwordEnv and passwordFile, not {}",
                            sources.join(" and ")
                        ),
                    ));
                }
                if let Some(source) = sources.first()
                    && url.has_password()
                {
                    return Err(Error::config(
                        "metaSync.postgresUrl",
                        format!(
                            "holds a password and metaSync.{source} is set too: keep the \
                             password in one place"
                        ),
                    ));
                }
                if let Some(r) = &self.password_secret {
                    if r.name.trim().is_empty() {
                        return Err(Error::config(
                            "metaSync.passwordSecret.name",
                            "must not be empty",
                        ));
                    }
                    if r.key.trim().is_empty() {
                        return Err(Error::config(
                            "metaSync.passwordSecret.key",
                            "must not be empty",
                        ));
                    }
                }
                if self
                    .password_env
                    .as_deref()
                    .is_some_and(|v| v.is_empty() || v.contains('='))
                {
                    return Err(Error::config(
                        "metaSync.passwordEnv",
                        "must be the name of an environment variable",
                    ));
                }
                if self
                    .password_file
                    .as_deref()
                    .is_some_and(|p| p.as_os_str().is_empty())
                {
                    return Err(Error::config("metaSync.passwordFile", "must not be empty"));
                }
                if self
                    .ca_file
                    .as_deref()
                    .is_some_and(|p| p.as_os_str().is_empty())
                {
                    return Err(Error::config("metaSync.caFile", "must not be empty"));
                }
                tls_settings(&url, self.ca_file.as_deref())?;
                Ok(MetaSyncTarget::Postgres(u.clone()))
            }
        }
    }
}
