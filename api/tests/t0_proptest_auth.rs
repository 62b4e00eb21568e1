//! T0 property tests: the key parsers of `liteio_api::auth` on anything a Secret could hold.
//!
//! Inputs are arbitrary strings, and strings built near the formats (a right or wrong prefix,
//! any code, base64 of any bytes with a right or wrong CRC-32, with or without the final
//! colon), so that every branch of the parsers is reached. Then:
//!
//! - parsing never panics;
//! - an accepted value is given back unchanged by `expose` and parses again to an equal key;
//! - a rejection names the field and its message contains no 8-character piece of the value
//!   after the prefix.
//!
//! Cases per property: 256, or `PROPTEST_CASES`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use liteio_api::auth::{AuthError, DhchapSecret, TlsPsk, crc32};
use liteio_tests::prop::check;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// A string near one of the two formats.
fn near_format() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec!["DHHC-1:", "NVMeTLSkey-1:", "DHHC-1", "dhhc-1:", ""]),
        prop::sample::select(vec!["00", "01", "02", "03", "04", "1", "", "0x"]),
        prop::collection::vec(any::<u8>(), 0..80),
        any::<bool>(),
        prop::sample::select(vec![":", "", "::", "=:", "\n"]),
    )
        .prop_map(|(prefix, code, key, good_crc, end)| {
            let mut raw = key.clone();
            let crc = if good_crc {
                crc32(&key)
            } else {
                crc32(&key) ^ 1
            };
            raw.extend_from_slice(&crc.to_le_bytes());
            format!("{prefix}{code}:{}{end}", STANDARD.encode(raw))
        })
}

fn any_input() -> impl Strategy<Value = String> {
    prop_oneof![any::<String>(), "[A-Za-z0-9+/=:-]{0,120}", near_format()]
}

/// The message of `e` names `field` and holds no 8-character piece of `s` after its prefix.
fn check_error(field: &str, s: &str, e: &AuthError) -> Result<(), TestCaseError> {
    let msg = e.to_string();
    let debug = format!("{e:?}");
    prop_assert!(msg.starts_with(&format!("{field}: ")), "{msg}");
    prop_assert_eq!(e.field(), Some(field));
    let body = s
        .strip_prefix("DHHC-1:")
        .or_else(|| s.strip_prefix("NVMeTLSkey-1:"))
        .unwrap_or(s);
    let chars: Vec<char> = body.chars().collect();
    for piece in chars.windows(8) {
        let piece: String = piece.iter().collect();
        // Pieces made only of characters the messages themselves use are not evidence.
        if piece.chars().all(|c| c.is_ascii_alphabetic() || c == ' ') {
            continue;
        }
        prop_assert!(!msg.contains(&piece), "{msg} holds {piece:?}");
        prop_assert!(!debug.contains(&piece), "{debug} holds {piece:?}");
    }
    Ok(())
}

#[test]
fn dhchap_parse_never_panics_and_never_leaks() {
    check("dhchap_parse", any_input(), |s| {
        match DhchapSecret::parse("dhchapKey", &s) {
            Ok(k) => {
                prop_assert_eq!(k.expose(), s.as_str());
                prop_assert_eq!(DhchapSecret::parse("x", k.expose()).unwrap(), k.clone());
                prop_assert_eq!(format!("{k:?}"), "<redacted>");
            }
            Err(e) => check_error("dhchapKey", &s, &e)?,
        }
        Ok(())
    });
}

#[test]
fn tls_psk_parse_never_panics_and_never_leaks() {
    check("tls_psk_parse", any_input(), |s| {
        match TlsPsk::parse("tlsPsk", &s) {
            Ok(k) => {
                prop_assert_eq!(k.expose(), s.as_str());
                prop_assert_eq!(TlsPsk::parse("x", k.expose()).unwrap(), k.clone());
                prop_assert_eq!(format!("{k}"), "<redacted>");
            }
            Err(e) => check_error("tlsPsk", &s, &e)?,
        }
        Ok(())
    });
}
