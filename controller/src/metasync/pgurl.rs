//! A PostgreSQL URL read the way libpq reads it: [`parse_url`] gives tokio-postgres what it
//! knows and keeps what it does not ([`TlsMode`] from `sslmode`, `sslrootcert`);
//! [`describe`] shows a connection without its password. Pure text work, no connection and
//! no config: [`super::settings`] checks `metaSync.postgresUrl` with it, [`super::tls`]
//! takes its `sslmode`, and [`super::postgres`] connects with what it parsed.

use std::path::PathBuf;
use std::time::Duration;

use tokio_postgres::Config;
use tokio_postgres::config::{Host, SslMode};

/// Bound of one connection attempt when the URL sets no `connect_timeout`.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How the connection is secured: libpq's `sslmode`, from the URL (`?sslmode=`; libpq's
/// default, `prefer`, when absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain TCP, never TLS.
    Disable,
    /// TLS when the server offers it, plain otherwise; the certificate is not checked.
    Prefer,
    /// TLS or no connection; the certificate is not checked unless a CA is given, which
    /// makes it `verify-ca` (as libpq does).
    Require,
    /// TLS, the server's certificate signed by the CA; its name is not checked.
    VerifyCa,
    /// TLS, the certificate signed by the CA and naming the host connected to.
    VerifyFull,
}

impl TlsMode {
    /// The `sslmode` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }

    fn parse(s: &str) -> std::result::Result<Self, String> {
        Ok(match s {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            "allow" => {
                return Err("sslmode=allow is not supported: use disable or prefer".into());
            }
            other => {
                return Err(format!(
                    "sslmode={other:?} is not one of disable, prefer, require, verify-ca, verify-full"
                ));
            }
        })
    }

    /// True when the server's certificate must chain to a CA.
    pub fn verifies(self) -> bool {
        matches!(self, Self::VerifyCa | Self::VerifyFull)
    }
}

/// A parsed `postgres://` URL: what tokio-postgres connects with, plus the TLS settings it
/// does not know (`sslmode=verify-ca|verify-full`, `sslrootcert`).
#[derive(Debug, Clone)]
pub struct PgUrl {
    /// Connection settings (`sslmode` mapped to what tokio-postgres knows).
    pub config: Config,
    /// The URL's `sslmode`.
    pub tls: TlsMode,
    /// The URL's `sslrootcert` (a PEM file of CA certificates).
    pub root_cert: Option<PathBuf>,
}

impl PgUrl {
    /// True when the URL holds a password.
    pub fn has_password(&self) -> bool {
        self.config.get_password().is_some()
    }
}

/// Decodes `%XX` escapes of a URL query value (`+` stays itself, as libpq reads it).
fn percent_decode(s: &str) -> std::result::Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| "has a bad %-escape in a parameter".to_string())?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "has a parameter that is not UTF-8".to_string())
}

/// Parses a `postgres://` or `postgresql://` URL. The error says what is wrong without
/// repeating the URL (it may hold a password).
pub fn parse_url(url: &str) -> std::result::Result<PgUrl, String> {
    let url = url.trim();
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err("must be a URL starting with postgres:// or postgresql://".into());
    }
    // tokio-postgres knows sslmode disable/prefer/require and no sslrootcert: take both
    // out of the query and hand it the rest.
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut kept = Vec::new();
    let mut tls = TlsMode::Prefer;
    let mut root_cert = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "sslmode" => tls = TlsMode::parse(&percent_decode(v)?)?,
            "sslrootcert" => {
                let path = percent_decode(v)?;
                if path.is_empty() {
                    return Err("has an empty sslrootcert".into());
                }
                root_cert = Some(PathBuf::from(path));
            }
            "sslcert" | "sslkey" | "sslpassword" => {
                return Err(format!(
                    "sets {k}, but client certificates are not supported: authenticate with a password"
                ));
            }
            _ => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    let mut config: Config = rest
        .parse()
        .map_err(|e: tokio_postgres::Error| format!("is not a valid PostgreSQL URL: {e}"))?;
    if config.get_hosts().is_empty() {
        return Err("names no host (postgres://user@host:5432/database)".into());
    }
    config.ssl_mode(match tls {
        TlsMode::Disable => SslMode::Disable,
        TlsMode::Prefer => SslMode::Prefer,
        TlsMode::Require | TlsMode::VerifyCa | TlsMode::VerifyFull => SslMode::Require,
    });
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("liteio-metasync");
    }
    Ok(PgUrl {
        config,
        tls,
        root_cert,
    })
}

/// `postgres://user@host:port/database` of `config`, without the password (errors, logs).
pub fn describe(config: &Config) -> String {
    let user = config
        .get_user()
        .map(|u| format!("{u}@"))
        .unwrap_or_default();
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let host = match h {
                Host::Tcp(s) => s.clone(),
                Host::Unix(p) => p.display().to_string(),
            };
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            format!("{host}:{port}")
        })
        .collect();
    let db = config.get_dbname().unwrap_or_default();
    format!("postgres://{user}{}/{db}", hosts.join(","))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::path::Path;

    #[test]
    fn urls() {
        let c = parse_url("postgres://liteio:secret@db.example:6543/meta")
            .unwrap()
            .config;
        assert_eq!(describe(&c), "postgres://liteio@db.example:6543/meta");
        assert_eq!(c.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        assert_eq!(c.get_application_name(), Some("liteio-metasync"));
        let c = parse_url("postgresql://h/db?options=-c%20search_path%3Dx")
            .unwrap()
            .config;
        assert_eq!(c.get_options(), Some("-c search_path=x"));
        assert_eq!(describe(&c), "postgres://h:5432/db");
        for (url, says) in [
            ("mysql://h/db", "postgres://"),
            ("host=h dbname=x", "postgres://"),
            ("postgres://h:notaport/db", "not a valid PostgreSQL URL"),
            (
                "postgres://h/db?sslmode=allow",
                "sslmode=allow is not supported",
            ),
            (
                "postgres://h/db?sslmode=maybe",
                "not one of disable, prefer",
            ),
            ("postgres://h/db?sslcert=/c.pem", "client certificates"),
            ("postgres://h/db?sslrootcert=", "empty sslrootcert"),
            ("postgres://h/db?sslrootcert=%zz", "%-escape"),
            ("postgres:///db", "no host"),
        ] {
            let err = parse_url(url).unwrap_err();
            assert!(err.contains(says), "{url}: {err}");
            assert!(!err.contains("secret"));
        }
    }

    #[test]
    fn sslmodes() {
        for (q, mode, pg) in [
            ("", TlsMode::Prefer, SslMode::Prefer),
            ("?sslmode=disable", TlsMode::Disable, SslMode::Disable),
            ("?sslmode=prefer", TlsMode::Prefer, SslMode::Prefer),
            ("?sslmode=require", TlsMode::Require, SslMode::Require),
            ("?sslmode=verify-ca", TlsMode::VerifyCa, SslMode::Require),
            (
                "?sslmode=verify-full",
                TlsMode::VerifyFull,
                SslMode::Require,
            ),
        ] {
            let u = parse_url(&format!("postgres://u:pw@h/db{q}")).unwrap();
            assert_eq!((u.tls, u.config.get_ssl_mode()), (mode, pg), "{q}");
            assert!(u.has_password());
        }
        let u = parse_url(
            "postgres://h/db?connect_timeout=3&sslrootcert=%2Fetc%2Fca.pem&sslmode=verify-full",
        )
        .unwrap();
        assert_eq!(u.root_cert.as_deref(), Some(Path::new("/etc/ca.pem")));
        assert_eq!(
            u.config.get_connect_timeout(),
            Some(&Duration::from_secs(3))
        );
        assert!(!u.has_password());
    }
}
