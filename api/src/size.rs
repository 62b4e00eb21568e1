//! Sizes: units, rounding and Kubernetes quantities.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// One KiB.
pub const KIB: u64 = 1 << 10;
/// One MiB.
pub const MIB: u64 = 1 << 20;
/// One GiB.
pub const GIB: u64 = 1 << 30;
/// One TiB.
pub const TIB: u64 = 1 << 40;
/// Allocation unit of LiteIO volumes (LVM extent and default lvstore cluster are smaller or equal).
pub const VOLUME_UNIT: u64 = 4 * MIB;
/// Smallest volume LiteIO creates.
pub const MIN_VOLUME_SIZE: u64 = 4 * MIB;

/// Why a size could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Rounding up overflowed `u64`.
    #[error("{0} bytes rounded up to a multiple of {1} does not fit in 64 bits")]
    Overflow(u64, u64),
    /// The rounding unit is zero.
    #[error("rounding unit must be positive")]
    ZeroUnit,
    /// A quantity string was not understood.
    #[error("quantity {0:?} is not a valid non-negative size")]
    BadQuantity(String),
}

/// `bytes` rounded up to a multiple of `unit`.
pub fn round_up(bytes: u64, unit: u64) -> Result<u64, SizeError> {
    if unit == 0 {
        return Err(SizeError::ZeroUnit);
    }
    let rem = bytes % unit;
    if rem == 0 {
        return Ok(bytes);
    }
    bytes
        .checked_add(unit - rem)
        .ok_or(SizeError::Overflow(bytes, unit))
}

/// `bytes` rounded down to a multiple of `unit`.
pub fn round_down(bytes: u64, unit: u64) -> Result<u64, SizeError> {
    if unit == 0 {
        return Err(SizeError::ZeroUnit);
    }
    Ok(bytes - bytes % unit)
}

/// Human-readable binary size: `10.0 GiB`, `512 B`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 5] = [
        ("PiB", 1 << 50),
        ("TiB", TIB),
        ("GiB", GIB),
        ("MiB", MIB),
        ("KiB", KIB),
    ];
    for (name, unit) in UNITS {
        if bytes >= unit {
            // Precision loss is fine for display.
            #[allow(clippy::cast_precision_loss)]
            let v = bytes as f64 / unit as f64;
            return format!("{v:.1} {name}");
        }
    }
    format!("{bytes} B")
}

/// Exact byte count of a Kubernetes quantity (`10Gi`, `1G`, `1500M`, `1e9`, `1.5Gi`).
/// Fractions of a byte round up, as Kubernetes does for storage.
pub fn parse_quantity(q: &Quantity) -> Result<u64, SizeError> {
    parse_quantity_str(&q.0)
}

/// Exact byte count of a quantity string; see [`parse_quantity`].
pub fn parse_quantity_str(s: &str) -> Result<u64, SizeError> {
    let bad = || SizeError::BadQuantity(s.to_string());
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() || num.starts_with('.') && num.len() == 1 {
        return Err(bad());
    }
    let (mult, exp10): (u128, i32) = match suffix {
        "" => (1, 0),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        "m" => (1, -3),
        s if s.starts_with(['e', 'E']) => (1, s[1..].parse::<i32>().map_err(|_| bad())?),
        _ => return Err(bad()),
    };
    let num = num.trim_start_matches('+');
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    if !int_part.chars().all(|c| c.is_ascii_digit())
        || !frac_part.chars().all(|c| c.is_ascii_digit())
    {
        return Err(bad());
    }
    let digits = format!("{int_part}{frac_part}");
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| bad())?
    };
    let frac_len = i32::try_from(frac_part.len()).map_err(|_| bad())?;
    let exp = exp10 - frac_len;
    let value = mantissa.checked_mul(mult).ok_or_else(bad)?;
    let value = if exp >= 0 {
        let p = 10u128.checked_pow(exp.unsigned_abs()).ok_or_else(bad)?;
        value.checked_mul(p).ok_or_else(bad)?
    } else {
        let p = 10u128.checked_pow(exp.unsigned_abs()).ok_or_else(bad)?;
        value.div_ceil(p)
    };
    u64::try_from(value).map_err(|_| bad())
}

/// A quantity holding exactly `bytes`.
pub fn quantity(bytes: u64) -> Quantity {
    Quantity(bytes.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding() {
        assert_eq!(round_up(1, VOLUME_UNIT), Ok(VOLUME_UNIT));
        assert_eq!(round_up(VOLUME_UNIT, VOLUME_UNIT), Ok(VOLUME_UNIT));
        assert_eq!(round_up(0, VOLUME_UNIT), Ok(0));
        assert_eq!(round_down(VOLUME_UNIT + 1, VOLUME_UNIT), Ok(VOLUME_UNIT));
        assert_eq!(
            round_up(u64::MAX, VOLUME_UNIT),
            Err(SizeError::Overflow(u64::MAX, VOLUME_UNIT))
        );
        assert_eq!(round_up(5, 0), Err(SizeError::ZeroUnit));
    }

    #[test]
    fn quantities() {
        for (s, v) in [
            ("10Gi", 10 * GIB),
            ("1G", 1_000_000_000),
            ("1500M", 1_500_000_000),
            ("1e9", 1_000_000_000),
            ("1.5Gi", 3 * GIB / 2),
            ("512", 512),
            ("100Mi", 100 * MIB),
            ("1500m", 2),
            ("0", 0),
        ] {
            assert_eq!(parse_quantity_str(s), Ok(v), "{s}");
        }
        for s in ["", "Gi", "-1Gi", "10Zi", "1.2.3", "abc"] {
            assert!(parse_quantity_str(s).is_err(), "{s} must be rejected");
        }
    }

    #[test]
    fn formatting() {
        assert_eq!(format_bytes(2 * GIB), "2.0 GiB");
        assert_eq!(format_bytes(10 * GIB + GIB / 2), "10.5 GiB");
        assert_eq!(format_bytes(100), "100 B");
    }
}
