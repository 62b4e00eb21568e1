//! How values are written in the file: string enums that list what they accept
//! (`string_enum!`), sizes as bytes or quantities, durations as `"1m30s"` or seconds.
//! Knows nothing of the sections that use them.

use std::fmt;
use std::time::Duration;

use liteio_api::size;
use serde::de::{self, Deserializer};

/// `"a", "b", "c"`.
pub(crate) fn quoted_list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A string enum whose parse error lists the allowed values.
macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every accepted spelling, in order.
            pub const ALLOWED: &'static [&'static str] = &[$($text),+];

            /// The spelling used in the file.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text),+
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok(Self::$variant),)+
                    other => Err(format!("{other:?} is not one of {}", $crate::config::value::quoted_list(Self::ALLOWED))),
                }
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <String as ::serde::Deserialize>::deserialize(d)?;
                s.parse().map_err(<D::Error as ::serde::de::Error>::custom)
            }
        }
    };
}
pub(super) use string_enum;

/// Accepts an unsigned integer or a string, handing each to its parser.
struct IntOrText<F> {
    expecting: &'static str,
    from_int: fn(u64) -> Result<F, String>,
    from_text: fn(&str) -> Result<F, String>,
}

impl<F> de::Visitor<'_> for IntOrText<F> {
    type Value = F;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expecting)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<F, E> {
        (self.from_int)(v).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<F, E> {
        let v = u64::try_from(v).map_err(|_| E::custom(format!("{v} is negative")))?;
        (self.from_int)(v).map_err(E::custom)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<F, E> {
        (self.from_text)(v).map_err(E::custom)
    }
}

/// A size: bytes, or a Kubernetes quantity (`"10Gi"`).
pub(super) fn de_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_any(IntOrText {
        expecting: "a size in bytes or a quantity like \"10Gi\"",
        from_int: Ok,
        from_text: |s| size::parse_quantity_str(s).map_err(|e| e.to_string()),
    })
}

/// Parses `"20s"`, `"1m"`, `"1m30s"`, `"500ms"`, `"2h"`, `"40"` (seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let bad = || format!("{text:?} is not a duration like \"20s\", \"1m30s\" or \"500ms\"");
    if t.is_empty() {
        return Err(bad());
    }
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let part = match &rest[..unit_len] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(bad)?),
            "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(bad)?),
            _ => return Err(bad()),
        };
        total = total.checked_add(part).ok_or_else(bad)?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

/// `20s`, `1m30s`, `500ms`: the shortest form [`parse_duration`] reads back.
pub fn format_duration(d: Duration) -> String {
    if d.subsec_millis() != 0 || d.is_zero() {
        return format!("{}ms", d.as_millis());
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 {
        out.push_str(&format!("{s}s"));
    }
    out
}

/// `#[serde(with = "duration")]`: a duration written as [`format_duration`] writes it, read
/// as [`parse_duration`] reads it (or a plain number of seconds).
pub(super) mod duration {
    use std::time::Duration;

    use serde::Deserializer;

    use super::{IntOrText, format_duration, parse_duration};

    pub(in crate::config) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Duration, D::Error> {
        d.deserialize_any(IntOrText {
            expecting: "a duration like \"20s\", \"1m\" or a number of seconds",
            from_int: |n| Ok(Duration::from_secs(n)),
            from_text: parse_duration,
        })
    }

    pub(in crate::config) fn serialize<S: serde::Serializer>(
        d: &Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*d))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn durations_round_trip() {
        for (text, secs_ms) in [
            ("20s", 20_000),
            ("1m", 60_000),
            ("1m30s", 90_000),
            ("500ms", 500),
            ("2h", 7_200_000),
            ("40", 40_000),
        ] {
            let d = parse_duration(text).unwrap();
            assert_eq!(d.as_millis(), secs_ms, "{text}");
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
        for bad in ["", "s", "10x", "1.5s", "-1s", "m10"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }
}
