//! Placement of a volume group's members (LiteIO's `ScheduleVolumeGroup`, reference §3.5,
//! with its gaps fixed).
//!
//! Every member is a remote volume of its own node: the group's assembly reads it over
//! NVMe/TCP (or locally when it is assembled on that node). Members of one group are on
//! distinct nodes. The decision is pure ([`plan`]): the reconciler records it on the group
//! and creates the members with their node preset, holding the state lock from the decision
//! until the members are charged to their pools, so that no other volume takes the space in
//! between.
//!
//! - **Candidates**: the pools that pass the configured filters for a probe volume of the
//!   group's smallest member (remote: no host), not used by the group yet, and not empty
//!   unless `allowEmptyNode`. A pool's room for a member is its free space, capped by the
//!   local-storage floor (`minLocalStoragePct` of its capacity stays for local volumes,
//!   after the remote volumes it already serves), rounded down to 4 MiB.
//! - **Asymmetric** (LiteIO's default): the roomiest pools first, empty ones last; each
//!   takes what is left of the total, at least the minimum member size, at most the maximum,
//!   rounded up to 4 MiB, or as much as it has room for; until the total is held or the
//!   count is at its maximum. LiteIO skipped a last fragment smaller than the minimum (and
//!   failed); here it is rounded up to the minimum.
//! - **Symmetric** (LiteIO refused every such group: its CSI driver never set the count):
//!   `desiredCount` members when given, else the fewest (at least `countRange.min`) whose
//!   equal shares of the total, rounded up to 4 MiB and within the size range, fit on that
//!   many distinct pools.
//! - **All or nothing**: members are created only once every one of them has a place;
//!   otherwise the group's status says what was missing and the group waits for a pool to
//!   change.
//! - Each member also holds the group's [`ANNO_MEMBER_RESERVE`] bytes for the assembly's
//!   metadata.
//! - **Spread key** ([`ANNO_SPREAD_KEY`], replicated volumes): members also go to nodes with
//!   distinct values of that node label (the Node's labels, else the pool's
//!   `spec.nodeInfo.labels`); a node without the label takes no member, and the reason says
//!   how many were left out for it.
//! - **A replacement** ([`place_replacement`]) of one member of a replicated group: the same
//!   size, on a node holding no member of the group (the replaced one's included), the
//!   spread key respected against the members that stay.

use std::collections::BTreeSet;

use liteio_api::common::{NodeInfo, VolumePosition, VolumeType};
use liteio_api::group::{ANNO_MEMBER_RESERVE, AntstorVolumeGroup, EntityIdentity, VolumeMeta};
use liteio_api::keys::annotations;
use liteio_api::replica::ANNO_SPREAD_KEY;
use liteio_api::size::{self, VOLUME_UNIT};
use liteio_api::{AntstorVolume, AntstorVolumeSpec};

use crate::scheduler::{Rejections, ScheduleError, Scheduler};
use crate::state::State;

/// Why a group's members cannot all be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupScheduleError {
    /// Not enough room on distinct pools.
    #[error(
        "NoStoragePoolAvailable: {missing} of the group's {total} bytes have no place ({detail}); pools rejected: {rejected}"
    )]
    NoRoom {
        /// Bytes of the total without a member.
        missing: u64,
        /// The group's total.
        total: u64,
        /// What the placement tried.
        detail: String,
        /// Why pools were not candidates.
        rejected: Rejections,
    },
    /// The group's own fields are invalid.
    #[error("invalid volume group: {0}")]
    Invalid(String),
}

/// A pool the group may use and its room for a member.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Candidate {
    node: String,
    room: u64,
    empty: bool,
    /// The node's value of the group's spread key (`None` without a spread key).
    spread: Option<String>,
}

/// The group's spread key ([`ANNO_SPREAD_KEY`]), if it has one.
pub fn spread_key(group: &AntstorVolumeGroup) -> Option<&str> {
    liteio_api::meta::annotation(&group.metadata, ANNO_SPREAD_KEY)
        .map(str::trim)
        .filter(|k| !k.is_empty())
}

/// The value of node label `key` of `node`: the Node's labels (from the Node watch), else
/// the node's StoragePool's `spec.nodeInfo.labels`.
pub fn node_label(state: &State, node: &str, key: &str) -> Option<String> {
    state
        .node(node)
        .and_then(|n| n.labels.get(key).cloned())
        .or_else(|| {
            state
                .pool(node)
                .and_then(|p| p.pool.spec.node_info.labels.get(key).cloned())
        })
}

/// What [`candidates`] found besides the candidates.
#[derive(Debug, Default)]
struct Skipped {
    rejected: Rejections,
    /// Pools that passed everything but lack the spread key's label.
    unlabeled: Vec<String>,
}

impl Skipped {
    /// What the NoRoom reason says about the spread key.
    fn spread_note(&self, key: Option<&str>, cands: &[Candidate]) -> String {
        let Some(key) = key else {
            return String::new();
        };
        let values: BTreeSet<&str> = cands.iter().filter_map(|c| c.spread.as_deref()).collect();
        let mut note = format!(
            "; spread key {key}: {} candidate pools in {} distinct values",
            cands.len(),
            values.len()
        );
        if !self.unlabeled.is_empty() {
            note.push_str(&format!(
                ", {} pools not candidates because their node has no label {key} ({})",
                self.unlabeled.len(),
                self.unlabeled.join(", ")
            ));
        }
        note
    }
}

/// Picks `need` candidates from `fits` (in order) whose spread values differ from each
/// other and from `taken`; all of the first `need` without a spread key.
fn pick<'a>(fits: &[&'a Candidate], need: usize, taken: &BTreeSet<String>) -> Vec<&'a Candidate> {
    let mut used = taken.clone();
    let mut out = Vec::new();
    for c in fits {
        if out.len() >= need {
            break;
        }
        if let Some(v) = &c.spread {
            if used.contains(v) {
                continue;
            }
            used.insert(v.clone());
        }
        out.push(*c);
    }
    out
}

/// The probe volume the filters judge a pool by: remote (no host), `size` bytes, the
/// group's member annotations and labels (for selectors), the members' type.
pub fn probe(group: &AntstorVolumeGroup, member_type: VolumeType, size: u64) -> AntstorVolume {
    let d = &group.spec.desired_volume_spec;
    let mut v = AntstorVolume::new(
        "group-probe",
        AntstorVolumeSpec {
            uuid: "group-probe".into(),
            size_byte: size,
            type_: Some(member_type),
            position_advice: VolumePosition::MustRemote,
            host_node: Some(NodeInfo::default()),
            ..Default::default()
        },
    );
    v.metadata.annotations = Some(
        d.annotations
            .iter()
            .filter(|(k, _)| k.as_str() != annotations::SELECTED_TGT_NODE)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    );
    v.metadata.labels = Some(d.labels.clone());
    v
}

fn candidates(
    sched: &Scheduler,
    state: &State,
    group: &AntstorVolumeGroup,
    member_type: VolumeType,
    min: u64,
    used: &BTreeSet<String>,
) -> Result<(Vec<Candidate>, Skipped), GroupScheduleError> {
    let probe = probe(group, member_type, min + group.member_reserve());
    let pct = u128::from(sched.config().min_local_storage_pct);
    let floor = sched
        .config()
        .filters
        .iter()
        .any(|f| f == "MinLocalStorage");
    let key = spread_key(group);
    let mut skipped = Skipped::default();
    let mut out = Vec::new();
    for p in state.pools() {
        if used.contains(p.name) {
            continue;
        }
        match sched.check_pool(state, p.name, &probe) {
            Err(ScheduleError::InvalidVolume { field, reason }) => {
                return Err(GroupScheduleError::Invalid(format!("{field}: {reason}")));
            }
            Err(e) => return Err(GroupScheduleError::Invalid(e.to_string())),
            Ok(Err(r)) => {
                *skipped.rejected.0.entry(r).or_default() += 1;
                continue;
            }
            Ok(Ok(())) => {}
        }
        let empty = p.volumes().next().is_none();
        if empty && !group.spec.stragety.allow_empty_node {
            *skipped
                .rejected
                .0
                .entry(crate::scheduler::Reason::EmptyNode)
                .or_default() += 1;
            continue;
        }
        let spread = match key {
            None => None,
            Some(k) => match node_label(state, p.name, k) {
                Some(v) => Some(v),
                None => {
                    skipped.unlabeled.push(p.name.to_string());
                    continue;
                }
            },
        };
        let mut room = p.free().max(0) as u128;
        if floor {
            let avail = u128::from(p.available());
            let keep = avail * pct / 100 + u128::from(p.remote_bytes());
            room = room.min(avail.saturating_sub(keep));
        }
        let room =
            size::round_down(u64::try_from(room).unwrap_or(u64::MAX), VOLUME_UNIT).unwrap_or(0);
        out.push(Candidate {
            node: p.name.to_string(),
            room,
            empty,
            spread,
        });
    }
    // Roomiest first, empty pools last, then by name (deterministic).
    out.sort_by(|a, b| {
        a.empty
            .cmp(&b.empty)
            .then(b.room.cmp(&a.room))
            .then(a.node.cmp(&b.node))
    });
    Ok((out, skipped))
}

fn up(bytes: u64) -> u64 {
    size::round_up(bytes, VOLUME_UNIT).unwrap_or(u64::MAX)
}

/// The members to add to `group` so that they hold its total (the members it already has
/// are kept). `new_uuid` makes the new members' uuids. Pure.
pub fn plan(
    sched: &Scheduler,
    state: &State,
    group: &AntstorVolumeGroup,
    member_type: VolumeType,
    mut new_uuid: impl FnMut() -> String,
) -> Result<Vec<VolumeMeta>, GroupScheduleError> {
    let total = u64::try_from(group.spec.total_size).unwrap_or(0);
    if total == 0 {
        return Err(GroupScheduleError::Invalid(
            "spec.totalSize: must be positive".into(),
        ));
    }
    let reserve = group.member_reserve();
    let (min, max) = group.size_bounds();
    let (min, max) = (up(min), up(max).max(up(min)));
    let (count_min, count_max) = group.count_bounds();
    let have: Vec<&VolumeMeta> = group.placed().collect();
    let used: BTreeSet<String> = have.iter().map(|m| m.target_node_name.clone()).collect();
    let held = group.scheduled_bytes();
    if held >= total {
        return Ok(Vec::new());
    }
    let left = total - held;
    let slots_left = usize::try_from(count_max)
        .unwrap_or(0)
        .saturating_sub(have.len());
    let (cands, skipped) = candidates(sched, state, group, member_type, min, &used)?;
    let key = spread_key(group);
    let taken: BTreeSet<String> = match key {
        Some(k) => have
            .iter()
            .filter_map(|m| node_label(state, &m.target_node_name, k))
            .collect(),
        None => BTreeSet::new(),
    };
    let spread_note = skipped.spread_note(key, &cands);
    let ns = group
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| liteio_api::keys::DEFAULT_NAMESPACE.to_string());
    let gname = group.metadata.name.clone().unwrap_or_default();
    let mut member = |node: &str, data: u64| {
        let uuid = new_uuid();
        VolumeMeta {
            vol_id: EntityIdentity {
                namespace: ns.clone(),
                name: liteio_api::group::member_name(&gname, &uuid),
                uuid,
            },
            target_node_name: node.to_string(),
            size: i64::try_from(data + reserve).unwrap_or(i64::MAX),
        }
    };
    let no_room = |missing: u64, detail: String| GroupScheduleError::NoRoom {
        missing,
        total,
        detail: format!("{detail}{spread_note}"),
        rejected: skipped.rejected.clone(),
    };
    if group.spec.desired_volume_spec.size_symmetry.is_symmetric() {
        // Members already placed fix the share; otherwise try counts from the fewest.
        let fixed = have
            .first()
            .map(|m| u64::try_from(m.size).unwrap_or(0).saturating_sub(reserve));
        let desired = group.spec.desired_volume_spec.desired_count;
        let counts: Vec<u64> = match (fixed, desired) {
            (Some(_), _) => vec![0],
            (None, d) if d > 0 => vec![u64::try_from(d).unwrap_or(1)],
            (None, _) => {
                let fewest = total
                    .div_ceil(max)
                    .max(u64::try_from(count_min).unwrap_or(1));
                (fewest..=u64::try_from(count_max).unwrap_or(1)).collect()
            }
        };
        let mut tried = Vec::new();
        for n in counts {
            let (share, need) = match fixed {
                Some(share) => (
                    share,
                    usize::try_from(left.div_ceil(share.max(1))).unwrap_or(0),
                ),
                None => (up(total.div_ceil(n)), usize::try_from(n).unwrap_or(0)),
            };
            if fixed.is_none() && (share < min || share > max) {
                tried.push(format!(
                    "{n} members of {}: outside the size range",
                    size::format_bytes(share)
                ));
                continue;
            }
            if need > slots_left {
                tried.push(format!("{need} more members: above the count range"));
                continue;
            }
            let fits: Vec<&Candidate> =
                cands.iter().filter(|c| c.room >= share + reserve).collect();
            let chosen = pick(&fits, need, &taken);
            if chosen.len() >= need {
                return Ok(chosen.into_iter().map(|c| member(&c.node, share)).collect());
            }
            match key {
                Some(_) => tried.push(format!(
                    "{need} members of {}: {} pools have room, {} of them in distinct spread values",
                    size::format_bytes(share),
                    fits.len(),
                    chosen.len()
                )),
                None => tried.push(format!(
                    "{need} members of {}: {} pools have room",
                    size::format_bytes(share),
                    fits.len()
                )),
            }
        }
        return Err(no_room(left, format!("Symmetric; {}", tried.join("; "))));
    }
    // Asymmetric.
    let mut out = Vec::new();
    let mut left = left;
    let mut taken = taken;
    for c in &cands {
        if left == 0 || out.len() >= slots_left {
            break;
        }
        if c.spread.as_ref().is_some_and(|v| taken.contains(v)) {
            continue;
        }
        let want = up(left.clamp(min, max));
        let data = if want + reserve <= c.room {
            want
        } else {
            size::round_down(c.room.saturating_sub(reserve), VOLUME_UNIT)
                .unwrap_or(0)
                .min(max)
        };
        if data < min || data == 0 {
            continue;
        }
        if let Some(v) = &c.spread {
            taken.insert(v.clone());
        }
        out.push(member(&c.node, data));
        left = left.saturating_sub(data);
    }
    if left > 0 {
        let detail = format!(
            "Asymmetric, members of {}..{}, at most {count_max}; {} candidate pools, their room {}",
            size::format_bytes(min),
            size::format_bytes(max),
            cands.len(),
            cands
                .iter()
                .map(|c| format!("{} {}", c.node, size::format_bytes(c.room)))
                .collect::<Vec<_>>()
                .join(", ")
        );
        return Err(no_room(left, detail));
    }
    Ok(out)
}

/// A member to take the place of member `old` of `group` (a replicated volume's): the same
/// size, on a node that holds no member of the group (`old`'s included), with a spread value
/// none of the other members has. `new_uuid` makes its uuid. Pure.
pub fn place_replacement(
    sched: &Scheduler,
    state: &State,
    group: &AntstorVolumeGroup,
    old: &VolumeMeta,
    member_type: VolumeType,
    new_uuid: impl FnOnce() -> String,
) -> Result<VolumeMeta, GroupScheduleError> {
    let size = u64::try_from(old.size).unwrap_or(0);
    let reserve = group.member_reserve();
    if size == 0 {
        return Err(GroupScheduleError::Invalid(format!(
            "spec.volumes: member {} has no size",
            old.vol_id.name
        )));
    }
    let used: BTreeSet<String> = group
        .spec
        .volumes
        .iter()
        .map(|m| m.target_node_name.clone())
        .collect();
    let data = size.saturating_sub(reserve);
    let (cands, skipped) = candidates(sched, state, group, member_type, data, &used)?;
    let key = spread_key(group);
    let taken: BTreeSet<String> = match key {
        Some(k) => group
            .spec
            .volumes
            .iter()
            .filter(|m| m.vol_id.name != old.vol_id.name)
            .filter_map(|m| node_label(state, &m.target_node_name, k))
            .collect(),
        None => BTreeSet::new(),
    };
    let fits: Vec<&Candidate> = cands.iter().filter(|c| c.room >= size).collect();
    let Some(c) = pick(&fits, 1, &taken).into_iter().next() else {
        return Err(GroupScheduleError::NoRoom {
            missing: data,
            total: u64::try_from(group.spec.total_size).unwrap_or(0),
            detail: format!(
                "a replacement of {} ({}) on a node holding no replica: {} candidate pools, {} with room{}",
                old.vol_id.name,
                size::format_bytes(size),
                cands.len(),
                fits.len(),
                skipped.spread_note(key, &cands)
            ),
            rejected: skipped.rejected,
        });
    };
    let uuid = new_uuid();
    let gname = group.metadata.name.clone().unwrap_or_default();
    Ok(VolumeMeta {
        vol_id: EntityIdentity {
            namespace: old.vol_id.namespace.clone(),
            name: liteio_api::group::member_name(&gname, &uuid),
            uuid,
        },
        target_node_name: c.node.clone(),
        size: old.size,
    })
}

/// The member volume for slot `m` of `group`: its node preset (the group decided it), no
/// host yet (the data control pushes it), the group's member labels and annotations.
pub fn member_volume(
    group: &AntstorVolumeGroup,
    m: &VolumeMeta,
    member_type: VolumeType,
) -> AntstorVolume {
    use liteio_api::keys::labels;
    let d = &group.spec.desired_volume_spec;
    let mut v = AntstorVolume::new(
        &m.vol_id.name,
        AntstorVolumeSpec {
            uuid: m.vol_id.uuid.clone(),
            size_byte: u64::try_from(m.size).unwrap_or(0),
            type_: Some(member_type),
            // Placed already; its reader (host or assembling node) may be its own node.
            position_advice: VolumePosition::NoPreference,
            target_node_id: m.target_node_name.clone(),
            ..Default::default()
        },
    );
    v.metadata.namespace = Some(m.vol_id.namespace.clone());
    let mut lbls = d.labels.clone();
    lbls.insert(labels::VOL_UUID.into(), m.vol_id.uuid.clone());
    lbls.insert(labels::TARGET_NODE_ID.into(), m.target_node_name.clone());
    if let Some(g) = &group.metadata.name {
        lbls.insert(labels::VOL_GROUP_NAME.into(), g.clone());
    }
    v.metadata.labels = Some(lbls);
    let annos: std::collections::BTreeMap<String, String> = d
        .annotations
        .iter()
        .filter(|(k, _)| k.as_str() != ANNO_MEMBER_RESERVE)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    v.metadata.annotations = Some(annos);
    v
}
