//! Per-volume QoS limits (`spec.qos`, not in LiteIO): what a volume's export may do per
//! second, enforced by the embedded SPDK's bdev rate limiter on the volume's lvol.
//!
//! - **Where they come from.** StorageClass parameters at CreateVolume and the same keys as a
//!   VolumeAttributesClass's `mutable_parameters` at ControllerModifyVolume: [`PARAM_IOPS`],
//!   [`PARAM_MBPS`], [`PARAM_READ_MBPS`], [`PARAM_WRITE_MBPS`] (decimal integers; `0`:
//!   unlimited). Parsed by [`VolumeQos::from_params`].
//! - **Units and granularity** (SPDK's): IOPS count reads and writes together and are a
//!   multiple of 1000; bandwidth is in MiB/s (SPDK's "megabytes": 2^20 bytes), at least 1.
//!   A value SPDK would round is refused, never rounded: the limit in force is the one asked.
//! - **Where they hold.** Only on an export of the SPDK engine; a volume with limits is placed
//!   only on pools that can export ([`crate::StoragePool::can_export`]), and a limit on a
//!   volume of another engine is refused with a message, never accepted unenforced.
//! - **What is in force.** The agent writes the limits it applied to the volume's annotation
//!   [`crate::keys::annotations::QOS_IN_FORCE`] in [`VolumeQos::to_annotation`]'s form; it
//!   equals that of `spec.qos` once the export follows the spec.

use std::collections::HashMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// StorageClass / mutable parameter: read and write I/O per second together.
pub const PARAM_IOPS: &str = "liteio.io/qos-iops";
/// StorageClass / mutable parameter: read and write MiB per second together.
pub const PARAM_MBPS: &str = "liteio.io/qos-mbps";
/// StorageClass / mutable parameter: read MiB per second.
pub const PARAM_READ_MBPS: &str = "liteio.io/qos-read-mbps";
/// StorageClass / mutable parameter: write MiB per second.
pub const PARAM_WRITE_MBPS: &str = "liteio.io/qos-write-mbps";
/// Every QoS parameter, in the order messages list them.
pub const PARAMS: [&str; 4] = [PARAM_IOPS, PARAM_MBPS, PARAM_READ_MBPS, PARAM_WRITE_MBPS];

/// SPDK's IOPS granularity (and least non-zero IOPS limit).
pub const IOPS_STEP: u64 = 1000;
/// The largest IOPS limit accepted (100 million: far above any device; a larger number is a
/// typo, not a limit).
pub const MAX_IOPS: u64 = 100_000_000;
/// The largest bandwidth limit accepted, in MiB/s (1 TiB/s).
pub const MAX_MBPS: u64 = 1 << 20;

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// A volume's limits (`spec.qos`). Each 0 or absent: unlimited.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub struct VolumeQos {
    /// Read and write I/O per second together; a multiple of 1000.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub iops: u64,
    /// Read and write MiB per second together.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mbps: u64,
    /// Read MiB per second.
    #[serde(default, rename = "readMbps", skip_serializing_if = "is_zero")]
    pub read_mbps: u64,
    /// Write MiB per second.
    #[serde(default, rename = "writeMbps", skip_serializing_if = "is_zero")]
    pub write_mbps: u64,
}

/// A limit that cannot be enforced as written: the field (or parameter) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QosError {
    /// The field (`spec.qos.iops`) or parameter (`liteio.io/qos-iops`).
    pub field: String,
    /// Why, with what would be accepted.
    pub reason: String,
}

impl fmt::Display for QosError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl std::error::Error for QosError {}

/// The four limits with their spec field names and parameter keys.
fn fields(q: &VolumeQos) -> [(&'static str, &'static str, u64); 4] {
    [
        ("iops", PARAM_IOPS, q.iops),
        ("mbps", PARAM_MBPS, q.mbps),
        ("readMbps", PARAM_READ_MBPS, q.read_mbps),
        ("writeMbps", PARAM_WRITE_MBPS, q.write_mbps),
    ]
}

fn check(field: &str, is_iops: bool, v: u64) -> Result<(), QosError> {
    let err = |reason: String| {
        Err(QosError {
            field: field.to_string(),
            reason,
        })
    };
    if v == 0 {
        return Ok(());
    }
    if is_iops {
        if !v.is_multiple_of(IOPS_STEP) {
            let up = v.div_ceil(IOPS_STEP) * IOPS_STEP;
            return err(format!(
                "{v} I/O per second is not a multiple of {IOPS_STEP} (SPDK's granularity); use {} or {up}, or 0 for no limit",
                up - IOPS_STEP
            ));
        }
        if v > MAX_IOPS {
            return err(format!(
                "{v} I/O per second is above {MAX_IOPS}; use 0 for no limit"
            ));
        }
    } else if v > MAX_MBPS {
        return err(format!(
            "{v} MiB/s is above {MAX_MBPS} (1 TiB/s); use 0 for no limit"
        ));
    }
    Ok(())
}

impl VolumeQos {
    /// No limit at all.
    pub fn is_unlimited(&self) -> bool {
        *self == Self::default()
    }

    /// Checks every limit; the error names the spec field (`spec.qos.<field>`).
    pub fn validate(&self) -> Result<(), QosError> {
        for (name, _, v) in fields(self) {
            check(&format!("spec.qos.{name}"), name == "iops", v)?;
        }
        Ok(())
    }

    /// The limits the QoS parameters among `params` set, or `None` when none is there.
    /// `base` gives the limits a parameter that is absent keeps (ModifyVolume changes only
    /// what it names). An unparsable or invalid value is an error naming its key.
    pub fn from_params(
        params: &HashMap<String, String>,
        base: VolumeQos,
    ) -> Result<Option<VolumeQos>, QosError> {
        let mut q = base;
        let mut any = false;
        for key in PARAMS {
            let Some(raw) = params.get(key) else { continue };
            any = true;
            let v: u64 = raw.trim().parse().map_err(|_| QosError {
                field: key.to_string(),
                reason: format!(
                    "{raw:?} is not a whole number ({} per second; 0 for no limit)",
                    if key == PARAM_IOPS { "I/O" } else { "MiB" }
                ),
            })?;
            check(key, key == PARAM_IOPS, v)?;
            match key {
                PARAM_IOPS => q.iops = v,
                PARAM_MBPS => q.mbps = v,
                PARAM_READ_MBPS => q.read_mbps = v,
                _ => q.write_mbps = v,
            }
        }
        Ok(any.then_some(q))
    }

    /// Whether `key` is one of the QoS parameters.
    pub fn is_param(key: &str) -> bool {
        PARAMS.contains(&key)
    }

    /// The canonical text of the limits (`iops=2000,mbps=0,readMbps=0,writeMbps=50`): the
    /// annotation of the limits in force.
    pub fn to_annotation(&self) -> String {
        fields(self)
            .iter()
            .map(|(n, _, v)| format!("{n}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A short human form for tables and messages (`2000 IOPS, 50 MiB/s write`;
    /// `unlimited`).
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if self.iops > 0 {
            parts.push(format!("{} IOPS", self.iops));
        }
        if self.mbps > 0 {
            parts.push(format!("{} MiB/s", self.mbps));
        }
        if self.read_mbps > 0 {
            parts.push(format!("{} MiB/s read", self.read_mbps));
        }
        if self.write_mbps > 0 {
            parts.push(format!("{} MiB/s write", self.write_mbps));
        }
        if parts.is_empty() {
            "unlimited".to_string()
        } else {
            parts.join(", ")
        }
    }
}

/// Whether the limits the disk-agent reports in force on `v` (annotation
/// [`crate::keys::annotations::QOS_IN_FORCE`]; absent: none) are those of its `spec.qos`.
pub fn applied(v: &crate::AntstorVolume) -> bool {
    let want = v.spec.qos.unwrap_or_default();
    match v
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::keys::annotations::QOS_IN_FORCE))
    {
        Some(in_force) => *in_force == want.to_annotation(),
        None => want.is_unlimited(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn params(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parameters_set_only_what_they_name() {
        let base = VolumeQos {
            iops: 3000,
            write_mbps: 10,
            ..Default::default()
        };
        let q = VolumeQos::from_params(&params(&[(PARAM_READ_MBPS, " 40 ")]), base)
            .unwrap()
            .unwrap();
        assert_eq!(
            q,
            VolumeQos {
                iops: 3000,
                read_mbps: 40,
                write_mbps: 10,
                mbps: 0
            }
        );
        assert_eq!(
            VolumeQos::from_params(&params(&[("fsType", "xfs")]), base).unwrap(),
            None
        );
        // 0 lifts a limit.
        let q = VolumeQos::from_params(&params(&[(PARAM_IOPS, "0")]), base)
            .unwrap()
            .unwrap();
        assert_eq!(q.iops, 0);
        assert_eq!(q.write_mbps, 10);
    }

    #[test]
    fn bad_values_name_the_key_and_what_would_do() {
        let e = VolumeQos::from_params(&params(&[(PARAM_IOPS, "1500")]), VolumeQos::default())
            .unwrap_err();
        assert_eq!(e.field, PARAM_IOPS);
        assert!(e.reason.contains("multiple of 1000"), "{e}");
        assert!(e.reason.contains("1000 or 2000"), "{e}");
        let e = VolumeQos::from_params(&params(&[(PARAM_WRITE_MBPS, "-5")]), VolumeQos::default())
            .unwrap_err();
        assert_eq!(e.field, PARAM_WRITE_MBPS);
        assert!(e.reason.contains("not a whole number"), "{e}");
        let e = VolumeQos::from_params(
            &params(&[(PARAM_MBPS, &(MAX_MBPS + 1).to_string())]),
            VolumeQos::default(),
        )
        .unwrap_err();
        assert_eq!(e.field, PARAM_MBPS);
        let e = VolumeQos {
            iops: 999,
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.field, "spec.qos.iops");
        assert!(e.reason.contains("use 0 or 1000"), "{e}");
        VolumeQos {
            iops: 1000,
            mbps: 1,
            read_mbps: MAX_MBPS,
            write_mbps: 0,
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn serialized_without_the_unlimited_fields_and_in_canonical_text() {
        let q = VolumeQos {
            iops: 2000,
            write_mbps: 50,
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(q).unwrap(),
            serde_json::json!({"iops": 2000, "writeMbps": 50})
        );
        assert_eq!(
            q.to_annotation(),
            "iops=2000,mbps=0,readMbps=0,writeMbps=50"
        );
        assert_eq!(q.summary(), "2000 IOPS, 50 MiB/s write");
        assert!(VolumeQos::default().is_unlimited());
        assert_eq!(VolumeQos::default().summary(), "unlimited");
    }
}
