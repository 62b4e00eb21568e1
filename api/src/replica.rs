//! Replicated volumes: a raid1 data control over one volume group whose members each hold
//! the whole volume, on distinct storage nodes (and, with a spread key, in distinct values
//! of a node label such as a zone). Not in LiteIO, whose data controls stored `raid1` and
//! built a linear volume.
//!
//! Who writes what (see `docs/replicas.md`):
//! - the CSI controller: the group ([`ANNO_SPREAD_KEY`], the member reserve) and the data
//!   control (`spec.raid.level: raid1`);
//! - the disk-agent that assembles the raid1: `status.replicas` (each member's state, rebuild
//!   progress, since when);
//! - the controller: `status.health` and `status.conditions` (from the replicas and the
//!   pools' liveness), the replacement of lost members ([`ANNO_REPLACING`],
//!   [`ANNO_REPLACED`]) and the move of the assembly off a lost node
//!   ([`ANNO_ASSEMBLY_MOVING_TO`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The fewest replicas of a replicated volume (one is a plain volume).
pub const MIN_REPLICAS: u32 = 2;
/// The most replicas of a replicated volume: every write goes to each of them, so more
/// costs write bandwidth for no useful gain in durability.
pub const MAX_REPLICAS: u32 = 5;
/// Replicas of a `datacontrol/raid-level: raid1` volume whose StorageClass gives no
/// [`crate::keys::SC_PARAM_REPLICAS`].
pub const DEFAULT_REPLICAS: u32 = 2;
/// Bytes each replica holds beyond the volume's size, for the raid superblock (one 4 MiB
/// unit; written on the group as [`crate::group::ANNO_MEMBER_RESERVE`]).
pub const RAID_SUPERBLOCK_RESERVE: u64 = 4 * crate::size::MIB;

/// Annotation on a replicated volume's AntstorVolumeGroup: a node label key whose values
/// must differ between its replicas (e.g. `topology.kubernetes.io/zone`); nodes without the
/// label take no replica. From the StorageClass parameter
/// [`crate::keys::SC_PARAM_REPLICA_SPREAD_KEY`].
pub const ANNO_SPREAD_KEY: &str = "liteio.io/spread-key";
/// Annotation on a replicated volume's AntstorVolumeGroup: the member (AntstorVolume name)
/// the controller is replacing. Written before the replacement is placed or created (the
/// intent first), removed once the replaced member's deletion was requested; while it is
/// set no other member of the volume is replaced.
pub const ANNO_REPLACING: &str = "liteio.io/replacing";
/// Annotation on a replaced member AntstorVolume: the member that took its place. Set when
/// the group's `spec.volumes` swapped them; the member is deleted once its data control no
/// longer lists it in `status.replicas`.
pub const ANNO_REPLACED: &str = "liteio.io/replaced-by";
/// Annotation on a replicated AntstorDataControl: the node its assembly is moving to after
/// the assembling node was lost (set with `spec.targetNodeId`, after every member admits
/// only that node); removed by the controller once the data control is ready again.
pub const ANNO_ASSEMBLY_MOVING_TO: &str = "liteio.io/assembly-moving-to";
/// Condition type on a replicated AntstorDataControl: `True` while a replica is not online.
pub const CONDITION_DEGRADED: &str = "Degraded";

/// Event reason: a replica's node or disk was lost (Warning).
pub const EVENT_REPLICA_LOST: &str = "ReplicaLost";
/// Event reason: a lost replica was replaced by a new member (Normal).
pub const EVENT_REPLICA_REPLACED: &str = "ReplicaReplaced";
/// Event reason: the volume serves with fewer online replicas than it has (Warning).
pub const EVENT_DEGRADED: &str = "Degraded";
/// Event reason: the assembly moved to another member's node (Normal).
pub const EVENT_ASSEMBLY_MOVED: &str = "AssemblyMoved";
/// Event reason, on the group: a lost replica's replacement has no place yet (Warning).
pub const EVENT_REPLICA_NOT_REPLACED: &str = "ReplicaNotReplaced";

/// Health of a replicated volume.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ReplicaHealth {
    /// Every replica is online.
    Healthy,
    /// Some replica is not online and none is being rebuilt.
    Degraded,
    /// Some replica is being rebuilt.
    Rebuilding,
    /// No replica is online: the volume cannot serve.
    Failed,
}

impl ReplicaHealth {
    /// Every value, in the order of increasing trouble (`rebuilding` is recovering).
    pub const ALL: [Self; 4] = [
        Self::Healthy,
        Self::Rebuilding,
        Self::Degraded,
        Self::Failed,
    ];

    /// The word as serialized (`healthy`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Degraded => "degraded",
            Self::Rebuilding => "rebuilding",
            Self::Failed => "failed",
        }
    }
}

impl std::fmt::Display for ReplicaHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// State of one replica in the raid1.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ReplicaState {
    /// In the raid, current.
    Online,
    /// In the raid, being written from the online replicas; not read.
    Rebuilding,
    /// Removed from the raid after an I/O error.
    Failed,
    /// Not reachable from the assembling node.
    Missing,
}

impl ReplicaState {
    /// The word as serialized (`online`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Online => "online",
            Self::Rebuilding => "rebuilding",
            Self::Failed => "failed",
            Self::Missing => "missing",
        }
    }

    /// Whether the replica is lost (failed or missing): a candidate for replacement.
    pub fn is_lost(self) -> bool {
        matches!(self, Self::Failed | Self::Missing)
    }
}

/// One replica as the assembling disk-agent sees it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ReplicaStatus {
    /// The member AntstorVolume.
    #[serde(default)]
    pub volume: String,
    /// Its node.
    #[serde(default)]
    pub node: String,
    /// Its state in the raid.
    pub state: ReplicaState,
    /// While rebuilding: how far, 0..=100.
    #[serde(
        default,
        rename = "rebuildPercent",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(max = 100))]
    pub rebuild_percent: Option<u8>,
    /// While (or after) rebuilding: bytes written to it so far.
    #[serde(
        default,
        rename = "rebuiltBytes",
        skip_serializing_if = "Option::is_none"
    )]
    pub rebuilt_bytes: Option<u64>,
    /// Since when it is in `state` (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Detail (the error of a failed replica).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Value of a condition.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ConditionState {
    /// Holds.
    True,
    /// Does not hold.
    False,
    /// Not known.
    #[default]
    Unknown,
}

/// A Kubernetes-style condition (`metav1.Condition` without `observedGeneration`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Condition {
    /// Type (`Degraded`).
    #[serde(rename = "type")]
    pub type_: String,
    /// Whether it holds.
    #[serde(default)]
    pub status: ConditionState,
    /// One CamelCase word for why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Detail for humans.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When `status` last changed (RFC 3339).
    #[serde(
        default,
        rename = "lastTransitionTime",
        skip_serializing_if = "String::is_empty"
    )]
    pub last_transition_time: String,
}

/// The condition of `type_` in `conditions`, if present.
pub fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Parses a replica count (`liteio.io/replicas`): a whole number from [`MIN_REPLICAS`] to
/// [`MAX_REPLICAS`]; the error says what is allowed.
pub fn parse_replicas(v: &str) -> Result<u32, String> {
    match v.trim().parse::<u32>() {
        Ok(n) if (MIN_REPLICAS..=MAX_REPLICAS).contains(&n) => Ok(n),
        Ok(1) => Err(format!(
            "{v:?}: one replica is a plain volume; a replicated volume has {MIN_REPLICAS} to {MAX_REPLICAS}"
        )),
        _ => Err(format!(
            "{v:?} is not a whole number from {MIN_REPLICAS} to {MAX_REPLICAS}"
        )),
    }
}

/// Whether `key` is a valid Kubernetes label key (`[prefix/]name`: a DNS subdomain prefix of
/// at most 253 characters, a name of at most 63 alphanumerics, `-`, `_` or `.`, beginning
/// and ending with an alphanumeric).
pub fn is_label_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    });
    name_ok && prefix_ok
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn words_are_camel_case_and_old_objects_parse() {
        assert_eq!(
            serde_json::to_value(ReplicaHealth::Rebuilding).unwrap(),
            "rebuilding"
        );
        assert_eq!(
            serde_json::to_value(ReplicaState::Missing).unwrap(),
            "missing"
        );
        for h in ReplicaHealth::ALL {
            assert_eq!(serde_json::to_value(h).unwrap(), h.as_str());
        }
        let r: ReplicaStatus =
            serde_json::from_value(serde_json::json!({"volume": "m", "state": "failed"})).unwrap();
        assert!(r.state.is_lost());
        assert_eq!((r.rebuild_percent, r.since), (None, None));
        let c: Condition = serde_json::from_value(serde_json::json!({"type": "Degraded"})).unwrap();
        assert_eq!(c.status, ConditionState::Unknown);
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            serde_json::json!({"type": "Degraded", "status": "Unknown"})
        );
    }

    #[test]
    fn replica_counts_outside_two_to_five_are_refused() {
        assert_eq!(parse_replicas("2"), Ok(2));
        assert_eq!(parse_replicas(" 5 "), Ok(5));
        for bad in ["1", "6", "0", "x", "-2", "2.5", ""] {
            let e = parse_replicas(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
        assert!(parse_replicas("1").unwrap_err().contains("plain volume"));
    }

    #[test]
    fn label_keys() {
        for ok in [
            "topology.kubernetes.io/zone",
            "zone",
            "lite.io/rack",
            "a_b.c-d",
        ] {
            assert!(is_label_key(ok), "{ok}");
        }
        for bad in [
            "",
            "/zone",
            "Topology.io/zone",
            "zone-",
            "a b",
            "x/",
            "-a/b",
        ] {
            assert!(!is_label_key(bad), "{bad}");
        }
    }
}
