//! Per-volume NVMe in-band authentication keys: DH-HMAC-CHAP secrets and the optional TLS
//! pre-shared key, in the textual forms the NVMe specifications define, and their place in
//! the volume's Kubernetes Secret.
//!
//! Each volume has one Secret, `liteio-auth-<pv name>` ([`crate::naming::auth_secret`]) in
//! [`crate::keys::DEFAULT_NAMESPACE`], created by the disk-agent when it first exports the
//! volume. Its data keys are [`DATA_DHCHAP_KEY`] (the host proves itself with it),
//! [`DATA_DHCHAP_CTRL_KEY`] (the target proves itself with it: bidirectional authentication)
//! and, optionally, [`DATA_TLS_PSK`]. kubelet hands the Secret to the CSI node in
//! `NodeStageVolume` because the StorageClass names it in [`SC_PARAM_NODE_STAGE_SECRET_NAME`]
//! and [`SC_PARAM_NODE_STAGE_SECRET_NAMESPACE`], and again to every `NodePublishVolume`
//! (including kubelet's periodic republish) through [`SC_PARAM_NODE_PUBLISH_SECRET_NAME`] and
//! [`SC_PARAM_NODE_PUBLISH_SECRET_NAMESPACE`], so that rotated keys reach connected hosts.
//!
//! Key material never leaves these types by accident: `Debug` and `Display` print
//! `<redacted>`, and no error message contains a secret or any part of it. Only
//! [`DhchapSecret::expose`] and [`TlsPsk::expose`] give the text, for the one place that
//! hands it to the kernel or to SPDK.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::ByteString;

/// Secret data key of the host's DH-HMAC-CHAP secret.
pub const DATA_DHCHAP_KEY: &str = "dhchapKey";
/// Secret data key of the controller's DH-HMAC-CHAP secret (bidirectional authentication).
pub const DATA_DHCHAP_CTRL_KEY: &str = "dhchapCtrlKey";
/// Secret data key of the optional TLS pre-shared key (NVMe interchange format).
pub const DATA_TLS_PSK: &str = "tlsPsk";
/// StorageClass parameter that makes kubelet pass a Secret to `NodeStageVolume`.
pub const SC_PARAM_NODE_STAGE_SECRET_NAME: &str = "csi.storage.k8s.io/node-stage-secret-name";
/// StorageClass parameter naming the namespace of that Secret.
pub const SC_PARAM_NODE_STAGE_SECRET_NAMESPACE: &str =
    "csi.storage.k8s.io/node-stage-secret-namespace";
/// StorageClass parameter that makes kubelet pass a Secret to `NodePublishVolume`, also to
/// the periodic republish of a mounted volume (the CSIDriver's `requiresRepublish`): how the
/// CSI node learns of rotated keys.
pub const SC_PARAM_NODE_PUBLISH_SECRET_NAME: &str = "csi.storage.k8s.io/node-publish-secret-name";
/// StorageClass parameter naming the namespace of the node-publish Secret.
pub const SC_PARAM_NODE_PUBLISH_SECRET_NAMESPACE: &str =
    "csi.storage.k8s.io/node-publish-secret-namespace";

/// What `Debug` and `Display` print instead of key material.
pub const REDACTED: &str = "<redacted>";

const DHCHAP_PREFIX: &str = "DHHC-1:";
const TLS_PSK_PREFIX: &str = "NVMeTLSkey-1:";
/// Bytes of a generated key.
const GENERATED_KEY_LEN: usize = 32;
/// Bytes of the CRC-32 that follows the key inside the base64 part.
const CRC_LEN: usize = 4;

/// The kind of an [`AuthError`], for status codes and metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AuthErrorKind {
    /// A required key is absent.
    Missing,
    /// A key is present but malformed.
    Invalid,
    /// The system's random source failed.
    Random,
}

/// A key that is missing or malformed. Messages name the field (a Secret data key such as
/// `dhchapKey`, or whatever the caller passed) and never contain key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// A required key is absent or empty.
    #[error("{field}: is missing")]
    Missing {
        /// The field.
        field: String,
    },
    /// A key is malformed.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field.
        field: String,
        /// What is wrong and what is expected; never contains the value.
        reason: String,
    },
    /// The system's random source failed while generating a key.
    #[error("cannot generate a key: the system's random source failed: {0}")]
    Random(String),
}

impl AuthError {
    fn invalid(field: &str, reason: impl Into<String>) -> Self {
        AuthError::Invalid {
            field: field.to_string(),
            reason: reason.into(),
        }
    }

    /// The kind of error.
    pub fn kind(&self) -> AuthErrorKind {
        match self {
            AuthError::Missing { .. } => AuthErrorKind::Missing,
            AuthError::Invalid { .. } => AuthErrorKind::Invalid,
            AuthError::Random(_) => AuthErrorKind::Random,
        }
    }

    /// The field the error is about, when it is about one.
    pub fn field(&self) -> Option<&str> {
        match self {
            AuthError::Missing { field } | AuthError::Invalid { field, .. } => Some(field),
            AuthError::Random(_) => None,
        }
    }
}

/// CRC-32 with the IEEE 802.3 polynomial (reflected 0xEDB88320), initial value and final
/// XOR 0xFFFFFFFF: the checksum of zlib, gzip and the NVMe key representations.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = u32::MAX;
    for b in data {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            let low_bit_set = crc & 1 != 0;
            crc >>= 1;
            if low_bit_set {
                crc ^= 0xEDB8_8320;
            }
        }
    }
    !crc
}

/// Compares two byte strings in time that depends on their lengths only.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Overwrites the bytes of `s` before it is freed (best effort: copies made earlier by
/// reallocation are not reached).
fn wipe(s: &mut String) {
    let mut bytes = std::mem::take(s).into_bytes();
    bytes.iter_mut().for_each(|b| *b = 0);
    std::hint::black_box(&bytes);
}

fn random_key() -> Result<Vec<u8>, AuthError> {
    let mut key = vec![0u8; GENERATED_KEY_LEN];
    getrandom::fill(&mut key).map_err(|e| AuthError::Random(e.to_string()))?;
    Ok(key)
}

/// `<prefix><code>:<base64(key ‖ crc32(key) LE)>:`.
fn encode(prefix: &str, code: &str, key: &[u8]) -> String {
    let mut raw = Vec::with_capacity(key.len() + CRC_LEN);
    raw.extend_from_slice(key);
    raw.extend_from_slice(&crc32(key).to_le_bytes());
    let out = format!("{prefix}{code}:{}:", STANDARD.encode(&raw));
    raw.iter_mut().for_each(|b| *b = 0);
    out
}

/// Splits `<prefix><code>:<base64>:` and decodes the base64 part into a key whose length is
/// accepted by `key_len_ok(code, len)`, checking its CRC. Returns the code.
fn decode<'a>(
    field: &str,
    s: &'a str,
    prefix: &str,
    what: &str,
    codes: &[&str],
    key_len_ok: impl Fn(&str, usize) -> Result<(), String>,
) -> Result<&'a str, AuthError> {
    if s.is_empty() {
        return Err(AuthError::Missing {
            field: field.to_string(),
        });
    }
    let rest = s.strip_prefix(prefix).ok_or_else(|| {
        AuthError::invalid(
            field,
            format!("is not {what}: it must start with {prefix:?}"),
        )
    })?;
    let (code, rest) = rest.split_once(':').ok_or_else(|| {
        AuthError::invalid(
            field,
            format!("is not {what}: no ':' after the {prefix:?} prefix"),
        )
    })?;
    if !codes.contains(&code) {
        // Not echoed: in a mangled value the "code" may well be key material.
        return Err(AuthError::invalid(
            field,
            format!(
                "the code after {prefix:?} must be one of {}",
                codes.join(", ")
            ),
        ));
    }
    let b64 = rest
        .strip_suffix(':')
        .ok_or_else(|| AuthError::invalid(field, format!("is not {what}: it must end with ':'")))?;
    if b64.contains(':') {
        return Err(AuthError::invalid(
            field,
            format!("is not {what}: the key part contains ':'"),
        ));
    }
    let mut raw = STANDARD.decode(b64).map_err(|_| {
        AuthError::invalid(
            field,
            "the key part is not valid base64 (standard alphabet, padded)",
        )
    })?;
    let result = check_raw(field, code, &raw, key_len_ok);
    raw.iter_mut().for_each(|b| *b = 0);
    result.map(|()| code)
}

fn check_raw(
    field: &str,
    code: &str,
    raw: &[u8],
    key_len_ok: impl Fn(&str, usize) -> Result<(), String>,
) -> Result<(), AuthError> {
    let key_len = raw.len().checked_sub(CRC_LEN).ok_or_else(|| {
        AuthError::invalid(
            field,
            format!("the key part decodes to {} bytes, too short", raw.len()),
        )
    })?;
    key_len_ok(code, key_len).map_err(|reason| AuthError::invalid(field, reason))?;
    let (key, crc) = raw.split_at(key_len);
    if !same_bytes(crc, &crc32(key).to_le_bytes()) {
        return Err(AuthError::invalid(
            field,
            "the CRC-32 after the key does not match: the value is corrupted or truncated",
        ));
    }
    Ok(())
}

/// A DH-HMAC-CHAP secret in the NVMe representation `DHHC-1:<tt>:<base64>:`: `tt` is the
/// transform applied to the secret (`00` none, `01` SHA-256, `02` SHA-384, `03` SHA-512) and
/// the base64 part (standard alphabet, padded) holds the 32-, 48- or 64-byte key followed by
/// its CRC-32, little-endian.
///
/// `Debug` and `Display` print `<redacted>`; equality does not stop at the first difference.
#[derive(Clone)]
pub struct DhchapSecret(String);

impl DhchapSecret {
    /// Transform codes the representation allows.
    pub const TRANSFORMS: [&'static str; 4] = ["00", "01", "02", "03"];
    /// Key lengths (bytes) the representation allows.
    pub const KEY_LENS: [usize; 3] = [32, 48, 64];

    /// A new random 32-byte secret with no transform (`DHHC-1:00:…:`).
    pub fn generate() -> Result<Self, AuthError> {
        let mut key = random_key()?;
        let s = encode(DHCHAP_PREFIX, "00", &key);
        key.iter_mut().for_each(|b| *b = 0);
        Ok(DhchapSecret(s))
    }

    /// Parses `s`, the value of `field`. Errors name `field` and never contain `s`.
    pub fn parse(field: &str, s: &str) -> Result<Self, AuthError> {
        decode(
            field,
            s,
            DHCHAP_PREFIX,
            "a DH-HMAC-CHAP secret (DHHC-1:<tt>:<base64>:)",
            &Self::TRANSFORMS,
            |_, len| {
                if Self::KEY_LENS.contains(&len) {
                    Ok(())
                } else {
                    Err(format!(
                        "the key part holds a {len}-byte key; DH-HMAC-CHAP keys are 32, 48 or 64 bytes"
                    ))
                }
            },
        )?;
        Ok(DhchapSecret(s.to_string()))
    }

    /// The transform code (`00` to `03`).
    pub fn transform(&self) -> &str {
        self.0
            .get(DHCHAP_PREFIX.len()..DHCHAP_PREFIX.len() + 2)
            .unwrap_or_default()
    }

    /// The secret's text, to hand to the kernel or to SPDK. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// A TLS pre-shared key in the NVMe interchange format `NVMeTLSkey-1:<hh>:<base64>:`: `hh` is
/// `01` (SHA-256, 32-byte key) or `02` (SHA-384, 48-byte key) and the base64 part (standard
/// alphabet, padded) holds the key followed by its CRC-32, little-endian.
///
/// `Debug` and `Display` print `<redacted>`; equality does not stop at the first difference.
#[derive(Clone)]
pub struct TlsPsk(String);

impl TlsPsk {
    /// Hash codes the interchange format allows, with their key lengths.
    pub const HASHES: [(&'static str, usize); 2] = [("01", 32), ("02", 48)];

    /// A new random 32-byte SHA-256 key (`NVMeTLSkey-1:01:…:`).
    pub fn generate() -> Result<Self, AuthError> {
        let mut key = random_key()?;
        let s = encode(TLS_PSK_PREFIX, "01", &key);
        key.iter_mut().for_each(|b| *b = 0);
        Ok(TlsPsk(s))
    }

    /// Parses `s`, the value of `field`. Errors name `field` and never contain `s`.
    pub fn parse(field: &str, s: &str) -> Result<Self, AuthError> {
        let codes = Self::HASHES.map(|(c, _)| c);
        decode(
            field,
            s,
            TLS_PSK_PREFIX,
            "a TLS PSK (NVMeTLSkey-1:<hh>:<base64>:)",
            &codes,
            |code, len| match Self::HASHES.iter().find(|(c, _)| *c == code) {
                Some((_, want)) if *want == len => Ok(()),
                Some((_, want)) => Err(format!(
                    "the key part holds a {len}-byte key; hash {code} needs {want} bytes"
                )),
                None => Err(format!("hash {code} is not supported")),
            },
        )?;
        Ok(TlsPsk(s.to_string()))
    }

    /// The hash code (`01` or `02`).
    pub fn hash(&self) -> &str {
        self.0
            .get(TLS_PSK_PREFIX.len()..TLS_PSK_PREFIX.len() + 2)
            .unwrap_or_default()
    }

    /// The key's text, to hand to the kernel or to SPDK. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

macro_rules! redacted_key_impls {
    ($t:ty) => {
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(REDACTED)
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(REDACTED)
            }
        }

        impl PartialEq for $t {
            fn eq(&self, other: &Self) -> bool {
                same_bytes(self.0.as_bytes(), other.0.as_bytes())
            }
        }

        impl Eq for $t {}

        impl Drop for $t {
            fn drop(&mut self) {
                wipe(&mut self.0);
            }
        }
    };
}

redacted_key_impls!(DhchapSecret);
redacted_key_impls!(TlsPsk);

/// The authentication keys of one volume, as stored in its Secret.
#[derive(Clone, PartialEq, Eq)]
pub struct VolumeKeys {
    /// The host's secret ([`DATA_DHCHAP_KEY`]): the host proves itself with it.
    pub host: DhchapSecret,
    /// The controller's secret ([`DATA_DHCHAP_CTRL_KEY`]): the target proves itself with it.
    pub ctrl: DhchapSecret,
    /// The TLS pre-shared key ([`DATA_TLS_PSK`]), when the export uses TLS.
    pub tls_psk: Option<TlsPsk>,
}

impl fmt::Debug for VolumeKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VolumeKeys")
            .field("host", &self.host)
            .field("ctrl", &self.ctrl)
            .field("tls_psk", &self.tls_psk.as_ref().map(|_| REDACTED))
            .finish()
    }
}

impl VolumeKeys {
    /// New random keys; with a TLS PSK when `with_tls`.
    pub fn generate(with_tls: bool) -> Result<Self, AuthError> {
        Ok(VolumeKeys {
            host: DhchapSecret::generate()?,
            ctrl: DhchapSecret::generate()?,
            tls_psk: if with_tls {
                Some(TlsPsk::generate()?)
            } else {
                None
            },
        })
    }

    /// Reads the keys from values looked up by data key. Values are trimmed of surrounding
    /// whitespace (a Secret made with `kubectl create secret --from-file` keeps the file's
    /// final newline); an empty [`DATA_TLS_PSK`] counts as absent.
    fn from_lookup(
        get: impl Fn(&str) -> Result<Option<String>, AuthError>,
    ) -> Result<Self, AuthError> {
        let required = |key: &str| -> Result<String, AuthError> {
            get(key)?
                .filter(|v| !v.trim().is_empty())
                .ok_or_else(|| AuthError::Missing {
                    field: key.to_string(),
                })
        };
        let host = DhchapSecret::parse(DATA_DHCHAP_KEY, required(DATA_DHCHAP_KEY)?.trim())?;
        let ctrl =
            DhchapSecret::parse(DATA_DHCHAP_CTRL_KEY, required(DATA_DHCHAP_CTRL_KEY)?.trim())?;
        let tls_psk = match get(DATA_TLS_PSK)?.filter(|v| !v.trim().is_empty()) {
            Some(v) => Some(TlsPsk::parse(DATA_TLS_PSK, v.trim())?),
            None => None,
        };
        Ok(VolumeKeys {
            host,
            ctrl,
            tls_psk,
        })
    }

    /// The keys in a Secret's `data`. Errors name the data key (`dhchapKey`, …).
    pub fn from_secret_data(data: &BTreeMap<String, ByteString>) -> Result<Self, AuthError> {
        Self::from_lookup(|key| {
            data.get(key)
                .map(|v| {
                    String::from_utf8(v.0.clone())
                        .map_err(|_| AuthError::invalid(key, "is not UTF-8 text"))
                })
                .transpose()
        })
    }

    /// The keys in a string map, as the CSI node receives the Secret in
    /// `NodeStageVolumeRequest.secrets`. Errors name the data key (`dhchapKey`, …).
    pub fn from_string_map(data: &HashMap<String, String>) -> Result<Self, AuthError> {
        Self::from_lookup(|key| Ok(data.get(key).cloned()))
    }

    /// The Secret `data` that holds these keys.
    pub fn to_secret_data(&self) -> BTreeMap<String, ByteString> {
        let mut data = BTreeMap::new();
        let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
        data.insert(DATA_DHCHAP_KEY.to_string(), bytes(self.host.expose()));
        data.insert(DATA_DHCHAP_CTRL_KEY.to_string(), bytes(self.ctrl.expose()));
        if let Some(psk) = &self.tls_psk {
            data.insert(DATA_TLS_PSK.to_string(), bytes(psk.expose()));
        }
        data
    }
}

/// Type of the Secrets that hold a volume's keys.
pub const SECRET_TYPE: &str = "liteio.io/nvme-auth";

/// The Secret that holds `keys` for `vol`: named after the volume's CSI name
/// ([`crate::naming::auth_secret`]) in the volume's namespace (LiteIO's), labelled with the volume's uuid and
/// owned by the volume (not as its controller), so that it goes away with the volume. Both
/// the CSI controller (at CreateVolume, so that kubelet finds it even for a volume that is
/// never exported) and the disk-agent (for volumes made without CSI) create it when missing.
pub fn volume_secret(
    vol: &crate::AntstorVolume,
    keys: &VolumeKeys,
) -> Result<k8s_openapi::api::core::v1::Secret, crate::invalid::ValidationError> {
    use kube::Resource as _;
    let name = vol.auth_secret_name();
    if name.len() > crate::naming::SECRET_NAME_MAX || !crate::naming::is_dns_subdomain(&name) {
        return Err(crate::invalid::ValidationError::new(
            "metadata.name",
            format!("the volume's name makes no valid Secret name ({name:?})"),
        ));
    }
    let owner = vol.controller_owner_ref(&()).map(|mut o| {
        o.controller = None;
        o.block_owner_deletion = None;
        o
    });
    Ok(k8s_openapi::api::core::v1::Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name),
            namespace: Some(
                vol.metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| crate::keys::DEFAULT_NAMESPACE.into()),
            ),
            labels: Some(BTreeMap::from([(
                crate::keys::labels::VOL_UUID.to_string(),
                vol.spec.uuid.clone(),
            )])),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        type_: Some(SECRET_TYPE.into()),
        data: Some(keys.to_secret_data()),
        ..Default::default()
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// 32 bytes 0x00..0x1f, transform 00 (built by hand from the format, not by `encode`).
    fn known_secret() -> String {
        let key: Vec<u8> = (0u8..32).collect();
        let mut raw = key.clone();
        raw.extend_from_slice(&crc32(&key).to_le_bytes());
        format!("DHHC-1:00:{}:", STANDARD.encode(raw))
    }

    fn with_raw(prefix: &str, code: &str, raw: &[u8]) -> String {
        format!("{prefix}{code}:{}:", STANDARD.encode(raw))
    }

    fn key_and_crc(len: usize, fill: u8) -> Vec<u8> {
        let key = vec![fill; len];
        let mut raw = key.clone();
        raw.extend_from_slice(&crc32(&key).to_le_bytes());
        raw
    }

    #[test]
    fn crc32_matches_the_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"a"), 0xE8B7_BE43);
    }

    #[test]
    fn generated_keys_parse_back_and_differ() {
        let a = DhchapSecret::generate().unwrap();
        let b = DhchapSecret::generate().unwrap();
        assert_ne!(a, b);
        assert!(a.expose().starts_with("DHHC-1:00:") && a.expose().ends_with(':'));
        assert_eq!(a.transform(), "00");
        // 36 bytes of key and CRC are 48 base64 characters.
        assert_eq!(a.expose().len(), "DHHC-1:00:".len() + 48 + 1);
        assert_eq!(DhchapSecret::parse("f", a.expose()).unwrap(), a);
        let p = TlsPsk::generate().unwrap();
        assert!(p.expose().starts_with("NVMeTLSkey-1:01:"));
        assert_eq!(p.hash(), "01");
        assert_eq!(TlsPsk::parse("f", p.expose()).unwrap(), p);
        assert_ne!(p, TlsPsk::generate().unwrap());
    }

    #[test]
    fn every_transform_and_key_length_is_accepted() {
        for tt in DhchapSecret::TRANSFORMS {
            for len in DhchapSecret::KEY_LENS {
                let s = with_raw(DHCHAP_PREFIX, tt, &key_and_crc(len, 7));
                let parsed = DhchapSecret::parse("f", &s).unwrap();
                assert_eq!(parsed.expose(), s);
                assert_eq!(parsed.transform(), tt);
            }
        }
        DhchapSecret::parse("f", &known_secret()).unwrap();
        for (hh, len) in TlsPsk::HASHES {
            let s = with_raw(TLS_PSK_PREFIX, hh, &key_and_crc(len, 9));
            assert_eq!(TlsPsk::parse("f", &s).unwrap().hash(), hh);
        }
    }

    /// Every malformed form, with the word its error must contain.
    fn bad_dhchap_secrets() -> Vec<(String, &'static str)> {
        let good = known_secret();
        let b64 = good["DHHC-1:00:".len()..good.len() - 1].to_string();
        let mut bad_crc = key_and_crc(32, 1);
        bad_crc[33] ^= 0x40;
        vec![
            (String::new(), "missing"),
            (format!("DHHC-2:00:{b64}:"), "must start with"),
            (format!("dhhc-1:00:{b64}:"), "must start with"),
            (format!("DHHC-1:04:{b64}:"), "must be one of"),
            (format!("DHHC-1:0:{b64}:"), "must be one of"),
            (format!("DHHC-1:{b64}:"), "must be one of"),
            ("DHHC-1:00".to_string(), "no ':'"),
            (format!("DHHC-1:00:{b64}"), "must end with ':'"),
            (format!("DHHC-1:00:{b64}::"), "contains ':'"),
            (format!("DHHC-1:00:{}:", b64.replace('A', "*")), "base64"),
            (
                with_raw(DHCHAP_PREFIX, "00", &key_and_crc(48, 2))
                    .trim_end_matches([':', '='])
                    .to_string()
                    + ":",
                "base64",
            ),
            ("DHHC-1:00::".to_string(), "too short"),
            (
                with_raw(DHCHAP_PREFIX, "00", &key_and_crc(16, 3)),
                "16-byte key",
            ),
            (
                with_raw(DHCHAP_PREFIX, "01", &key_and_crc(33, 3)),
                "33-byte key",
            ),
            (with_raw(DHCHAP_PREFIX, "00", &bad_crc), "CRC-32"),
            // A key whose CRC was dropped is a 28-byte key.
            (with_raw(DHCHAP_PREFIX, "00", &[5u8; 32]), "28-byte key"),
        ]
    }

    #[test]
    fn malformed_dhchap_secrets_are_rejected_naming_the_field() {
        for (s, word) in bad_dhchap_secrets() {
            let e = DhchapSecret::parse("dhchapKey", &s).unwrap_err();
            let msg = e.to_string();
            assert!(msg.starts_with("dhchapKey: "), "{s:?}: {msg}");
            assert!(msg.contains(word), "{s:?}: {msg} lacks {word:?}");
            assert_eq!(e.field(), Some("dhchapKey"));
        }
        assert_eq!(
            DhchapSecret::parse("k", "").unwrap_err().kind(),
            AuthErrorKind::Missing
        );
        assert_eq!(
            DhchapSecret::parse("k", "x").unwrap_err().kind(),
            AuthErrorKind::Invalid
        );
    }

    #[test]
    fn malformed_tls_psks_are_rejected_naming_the_field() {
        let good = with_raw(TLS_PSK_PREFIX, "01", &key_and_crc(32, 4));
        let mut bad_crc = key_and_crc(48, 4);
        bad_crc[50] ^= 1;
        let cases = [
            (String::new(), "missing"),
            (
                good.replace("NVMeTLSkey-1", "NVMeTLSkey-2"),
                "must start with",
            ),
            (good.replace(":01:", ":00:"), "must be one of"),
            (good.replace(":01:", ":03:"), "must be one of"),
            (good[..good.len() - 1].to_string(), "must end with ':'"),
            (good.replace(":01:", ":01:%"), "base64"),
            // The key lengths are tied to the hash.
            (
                with_raw(TLS_PSK_PREFIX, "02", &key_and_crc(32, 4)),
                "needs 48 bytes",
            ),
            (
                with_raw(TLS_PSK_PREFIX, "01", &key_and_crc(48, 4)),
                "needs 32 bytes",
            ),
            (with_raw(TLS_PSK_PREFIX, "02", &bad_crc), "CRC-32"),
            (known_secret(), "must start with"),
        ];
        for (s, word) in cases {
            let msg = TlsPsk::parse("tlsPsk", &s).unwrap_err().to_string();
            assert!(msg.starts_with("tlsPsk: "), "{s:?}: {msg}");
            assert!(msg.contains(word), "{s:?}: {msg} lacks {word:?}");
        }
    }

    /// Pieces of `s` long enough that finding one in a message means a leak.
    fn fragments(s: &str) -> Vec<String> {
        let b64 = s
            .trim_end_matches(':')
            .rsplit(':')
            .next()
            .unwrap_or_default()
            .to_string();
        let mut out: Vec<String> = b64
            .as_bytes()
            .chunks(8)
            .filter(|c| c.len() == 8)
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect();
        if b64.len() >= 8 {
            out.push(b64);
        }
        out
    }

    #[test]
    fn errors_and_debug_output_never_contain_key_material() {
        let mut values: Vec<String> = bad_dhchap_secrets().into_iter().map(|(s, _)| s).collect();
        values.push(with_raw(TLS_PSK_PREFIX, "02", &key_and_crc(32, 0x5a)));
        for s in &values {
            let msgs = [
                DhchapSecret::parse("dhchapKey", s)
                    .err()
                    .map(|e| (e.to_string(), format!("{e:?}"))),
                TlsPsk::parse("tlsPsk", s)
                    .err()
                    .map(|e| (e.to_string(), format!("{e:?}"))),
            ];
            for (display, debug) in msgs.into_iter().flatten() {
                for frag in fragments(s) {
                    assert!(!display.contains(&frag), "{display} leaks {frag}");
                    assert!(!debug.contains(&frag), "{debug} leaks {frag}");
                }
            }
        }
        let keys = VolumeKeys::generate(true).unwrap();
        let shown = format!(
            "{keys:?} {:?} {} {:?} {}",
            keys.host,
            keys.ctrl,
            keys.tls_psk.as_ref().unwrap(),
            keys.tls_psk.as_ref().unwrap()
        );
        for s in [
            keys.host.expose(),
            keys.ctrl.expose(),
            keys.tls_psk.as_ref().unwrap().expose(),
        ] {
            for frag in fragments(s) {
                assert!(!shown.contains(&frag), "{shown} leaks {frag}");
            }
        }
        assert!(shown.contains(REDACTED), "{shown}");
        assert_eq!(format!("{}", keys.host), REDACTED);
    }

    #[test]
    fn volume_keys_round_trip_through_secret_data() {
        for with_tls in [false, true] {
            let keys = VolumeKeys::generate(with_tls).unwrap();
            assert_ne!(keys.host, keys.ctrl);
            let data = keys.to_secret_data();
            assert_eq!(data.len(), if with_tls { 3 } else { 2 });
            assert_eq!(data[DATA_DHCHAP_KEY].0, keys.host.expose().as_bytes());
            assert_eq!(VolumeKeys::from_secret_data(&data).unwrap(), keys);
            let map: HashMap<String, String> = data
                .iter()
                .map(|(k, v)| (k.clone(), String::from_utf8(v.0.clone()).unwrap()))
                .collect();
            assert_eq!(VolumeKeys::from_string_map(&map).unwrap(), keys);
        }
    }

    #[test]
    fn volume_keys_errors_name_the_data_key() {
        let keys = VolumeKeys::generate(false).unwrap();
        let mut data = keys.to_secret_data();
        data.remove(DATA_DHCHAP_CTRL_KEY);
        let e = VolumeKeys::from_secret_data(&data).unwrap_err();
        assert_eq!(e.to_string(), "dhchapCtrlKey: is missing");
        data.insert(DATA_DHCHAP_CTRL_KEY.into(), ByteString(b"  \n".to_vec()));
        assert_eq!(
            VolumeKeys::from_secret_data(&data).unwrap_err().kind(),
            AuthErrorKind::Missing
        );
        data.insert(DATA_DHCHAP_CTRL_KEY.into(), ByteString(vec![0xff, 0xfe]));
        assert_eq!(
            VolumeKeys::from_secret_data(&data).unwrap_err().to_string(),
            "dhchapCtrlKey: is not UTF-8 text"
        );
        let mut map = HashMap::new();
        assert_eq!(
            VolumeKeys::from_string_map(&map).unwrap_err().field(),
            Some(DATA_DHCHAP_KEY)
        );
        map.insert(DATA_DHCHAP_KEY.to_string(), keys.ctrl.expose().to_string());
        map.insert(
            DATA_DHCHAP_CTRL_KEY.to_string(),
            format!("{}\n", keys.host.expose()),
        );
        // A trailing newline (kubectl --from-file) is tolerated; an empty TLS PSK is absent.
        map.insert(DATA_TLS_PSK.to_string(), String::new());
        let parsed = VolumeKeys::from_string_map(&map).unwrap();
        assert_eq!(parsed.ctrl, keys.host);
        assert_eq!(parsed.tls_psk, None);
        map.insert(DATA_TLS_PSK.to_string(), keys.host.expose().to_string());
        let e = VolumeKeys::from_string_map(&map).unwrap_err();
        assert!(e.to_string().starts_with("tlsPsk: "), "{e}");
        assert!(!e.to_string().contains(&keys.host.expose()[10..30]), "{e}");
    }

    #[test]
    fn volume_secret_is_named_after_the_pv_and_owned_by_the_volume() {
        let mut vol = crate::AntstorVolume::new("pvc-1", Default::default());
        vol.metadata.namespace = Some("obnvmf".into());
        vol.metadata.uid = Some("uid-1".into());
        vol.spec.uuid = "u-1".into();
        vol.metadata.annotations = Some(BTreeMap::from([(
            crate::keys::annotations::CSI_NAME.to_string(),
            "pvc-0123456789-long-name".to_string(),
        )]));
        let keys = VolumeKeys::generate(true).unwrap();
        let s = volume_secret(&vol, &keys).unwrap();
        assert_eq!(
            s.metadata.name.as_deref(),
            Some("liteio-auth-pvc-0123456789-long-name")
        );
        assert_eq!(s.metadata.namespace.as_deref(), Some("obnvmf"));
        assert_eq!(s.type_.as_deref(), Some(SECRET_TYPE));
        let owners = s.metadata.owner_references.clone().unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(
            (owners[0].name.as_str(), owners[0].uid.as_str()),
            ("pvc-1", "uid-1")
        );
        assert_eq!(owners[0].controller, None);
        assert_eq!(
            s.metadata.labels.unwrap()[crate::keys::labels::VOL_UUID],
            "u-1"
        );
        assert_eq!(
            VolumeKeys::from_secret_data(&s.data.unwrap()).unwrap(),
            keys
        );
        // A CSI name that makes no valid Secret name falls back to the object name.
        vol.metadata.annotations = Some(BTreeMap::from([(
            crate::keys::annotations::CSI_NAME.to_string(),
            "Sanity-Volume-X".to_string(),
        )]));
        assert_eq!(
            volume_secret(&vol, &keys).unwrap().metadata.name.as_deref(),
            Some("liteio-auth-pvc-1")
        );
        // An object name too long for a Secret name is refused.
        vol.metadata.name = Some("y".repeat(250));
        assert!(volume_secret(&vol, &keys).is_err());
    }
}
