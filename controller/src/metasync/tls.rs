//! TLS to PostgreSQL (rustls with ring), following libpq's `sslmode`.
//!
//! | sslmode       | TLS            | certificate checked                                  |
//! |---------------|----------------|------------------------------------------------------|
//! | `disable`     | never          | –                                                    |
//! | `prefer`      | when offered   | no                                                   |
//! | `require`     | always         | no; with a CA as `verify-ca` (libpq does the same)   |
//! | `verify-ca`   | always         | signed by the CA                                     |
//! | `verify-full` | always         | signed by the CA and naming the host connected to   |
//!
//! The CA is a PEM file (`metaSync.caFile` or the URL's `sslrootcert`), read when the
//! mirror is opened, so a missing or malformed file is a config error at start-up. Even when
//! the certificate is not checked, the handshake's signatures are: the connection is
//! encrypted, only the peer is not authenticated. [`tls_settings`] checks the CA against
//! the URL's `sslmode` (config errors naming the field).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::pgurl::{PgUrl, TlsMode};
use crate::error::{Error, Result};

/// The CA file and the config field that named it (messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaFile {
    /// `metaSync.caFile` or `metaSync.postgresUrl (sslrootcert)`.
    pub field: &'static str,
    /// The PEM file.
    pub path: PathBuf,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads the CA certificates of a PEM file; the error names the field and the file.
pub fn read_roots(ca: &CaFile) -> Result<RootCertStore> {
    let field = ca.field;
    let path = ca.path.as_path();
    let pem = std::fs::read(path)
        .map_err(|e| Error::config(field, format!("cannot read {}: {e}", path.display())))?;
    let mut roots = RootCertStore::empty();
    let mut n = 0usize;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| {
            Error::config(
                field,
                format!("{} is not a PEM file of certificates: {e}", path.display()),
            )
        })?;
        roots.add(cert).map_err(|e| {
            Error::config(
                field,
                format!(
                    "{} holds a certificate that cannot be a CA: {e}",
                    path.display()
                ),
            )
        })?;
        n += 1;
    }
    if n == 0 {
        return Err(Error::config(
            field,
            format!("{} holds no PEM certificate", path.display()),
        ));
    }
    Ok(roots)
}

/// The connector for `mode`, or `None` for `disable` (plain TCP).
pub fn connector(mode: TlsMode, ca: Option<&CaFile>) -> Result<Option<MakeRustlsConnect>> {
    let provider = provider();
    let algorithms = provider.signature_verification_algorithms;
    let verifier: Arc<dyn ServerCertVerifier> = match (mode, ca) {
        (TlsMode::Disable, _) => return Ok(None),
        (TlsMode::Prefer, _) | (TlsMode::Require, None) => Arc::new(Unchecked { algorithms }),
        (TlsMode::VerifyCa | TlsMode::VerifyFull, None) => {
            return Err(Error::config(
                "metaSync.caFile",
                format!(
                    "sslmode={} needs the CA that signed the server's certificate: set \
                     metaSync.caFile or sslrootcert in the URL",
                    mode.as_str()
                ),
            ));
        }
        (TlsMode::Require | TlsMode::VerifyCa | TlsMode::VerifyFull, Some(ca)) => {
            let roots = Arc::new(read_roots(ca)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
                .build()
                .map_err(|e| Error::config(ca.field, format!("unusable CA: {e}")))?;
            Arc::new(Checked {
                webpki,
                check_name: mode == TlsMode::VerifyFull,
                mode,
                ca: ca.path.clone(),
                field: ca.field,
            })
        }
    };
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::config("metaSync", format!("TLS set-up failed: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Some(MakeRustlsConnect::new(config)))
}

/// `prefer` and `require` without a CA: any certificate, signatures still checked.
#[derive(Debug)]
struct Unchecked {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// `verify-ca` / `verify-full` (and `require` with a CA): webpki, the name check skipped
/// for `verify-ca`; a refusal says which mode and CA refused it.
#[derive(Debug)]
struct Checked {
    webpki: Arc<WebPkiServerVerifier>,
    check_name: bool,
    mode: TlsMode,
    ca: PathBuf,
    field: &'static str,
}

/// Why a server's certificate was refused (the cause inside rustls' error).
#[derive(Debug)]
struct NotTrusted {
    what: &'static str,
    mode: TlsMode,
    field: &'static str,
    ca: PathBuf,
    cause: CertificateError,
}

impl std::fmt::Display for NotTrusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (sslmode={}, CA from {} {}): {}",
            self.what,
            self.mode.as_str(),
            self.field,
            self.ca.display(),
            self.cause
        )
    }
}

impl std::error::Error for NotTrusted {}

fn is_name_mismatch(e: &CertificateError) -> bool {
    matches!(
        e,
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
    )
}

impl ServerCertVerifier for Checked {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Ok(v) => Ok(v),
            Err(rustls::Error::InvalidCertificate(e))
                if is_name_mismatch(&e) && !self.check_name =>
            {
                Ok(ServerCertVerified::assertion())
            }
            Err(rustls::Error::InvalidCertificate(cause)) => {
                let what = if is_name_mismatch(&cause) {
                    "server certificate does not name the host"
                } else {
                    "server certificate not trusted"
                };
                Err(rustls::Error::InvalidCertificate(CertificateError::Other(
                    rustls::OtherError(Arc::new(NotTrusted {
                        what,
                        mode: self.mode,
                        field: self.field,
                        ca: self.ca.clone(),
                        cause,
                    })),
                )))
            }
            Err(other) => Err(other),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// The message of a certificate refusal of [`Checked`] somewhere in `err`'s chain (rustls
/// shows it only in `Debug` form), so that the error says `server certificate not trusted
/// (sslmode=verify-full, CA from metaSync.caFile /etc/ca.pem): UnknownIssuer`.
pub fn refusal(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(err);
    while let Some(e) = next {
        // io::Error::source() skips the error it wraps: look inside it.
        let inner = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|i| i as &(dyn std::error::Error + 'static));
        for candidate in [Some(e), inner].into_iter().flatten() {
            if let Some(rustls::Error::InvalidCertificate(CertificateError::Other(o))) =
                candidate.downcast_ref::<rustls::Error>()
                && let Some(nt) = o.0.downcast_ref::<NotTrusted>()
            {
                return Some(nt.to_string());
            }
        }
        next = e.source();
    }
    None
}

/// The CA file given by the config or the URL (at most one), or `None`.
pub fn ca_file(config_ca: Option<&Path>, url_ca: Option<&Path>) -> Result<Option<CaFile>> {
    match (config_ca, url_ca) {
        (Some(_), Some(_)) => Err(Error::config(
            "metaSync.caFile",
            "set, and the URL sets sslrootcert too: keep one",
        )),
        (Some(p), None) => Ok(Some(CaFile {
            field: "metaSync.caFile",
            path: p.to_path_buf(),
        })),
        (None, Some(p)) => Ok(Some(CaFile {
            field: "metaSync.postgresUrl (sslrootcert)",
            path: p.to_path_buf(),
        })),
        (None, None) => Ok(None),
    }
}

/// The CA file of `url` and `metaSync.caFile` (at most one), checked against `sslmode`: a
/// CA with `disable`/`prefer` (where it would be ignored) and `verify-*` without one are
/// config errors naming the field.
pub fn tls_settings(url: &PgUrl, config_ca: Option<&Path>) -> Result<Option<CaFile>> {
    let ca = ca_file(config_ca, url.root_cert.as_deref())?;
    match &ca {
        Some(ca) if matches!(url.tls, TlsMode::Disable | TlsMode::Prefer) => Err(Error::config(
            ca.field,
            format!(
                "a CA is set but sslmode={} does not check certificates: use require, \
                 verify-ca or verify-full",
                url.tls.as_str()
            ),
        )),
        None if url.tls.verifies() => Err(Error::config(
            "metaSync.caFile",
            format!(
                "sslmode={} needs the CA that signed the server's certificate: set \
                 metaSync.caFile or sslrootcert in the URL",
                url.tls.as_str()
            ),
        )),
        _ => Ok(ca),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ca_file_errors_name_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let ca = |p: &Path| CaFile {
            field: "metaSync.caFile",
            path: p.to_path_buf(),
        };
        let missing = dir.path().join("ca.pem");
        let err = connector(TlsMode::VerifyFull, Some(&ca(&missing)))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.starts_with("config field metaSync.caFile: cannot read "),
            "{err}"
        );
        std::fs::write(&missing, "not a certificate\n").unwrap();
        let err = connector(TlsMode::VerifyCa, Some(&ca(&missing)))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("holds no PEM certificate"), "{err}");
        let err = connector(TlsMode::VerifyFull, None)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("metaSync.caFile"), "{err}");
        assert!(connector(TlsMode::Disable, None).unwrap().is_none());
        assert!(connector(TlsMode::Require, None).unwrap().is_some());
        assert!(ca_file(Some(&missing), Some(&missing)).is_err());
    }
}
