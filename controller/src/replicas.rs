//! Replicated volumes (raid1 data controls): the controller's decisions, pure, over what it
//! knows of each replica: its node's pool liveness (the Lease the controller already
//! tracks) and what the assembling disk-agent reports in `status.replicas`. The reconcilers
//! (`reconcile::group`) carry them out.
//!
//! - **Which replica to replace** ([`decide`]): a member whose pool is down (`offline` or
//!   `unknown`, or gone) at once; a member reported `failed` or `missing` once it has been so
//!   for `replicaReplaceGrace` (from the report's `since`, else from when the controller first
//!   saw it). Never the last online replica: with no other member online and on a live node,
//!   replacing it would throw away the only current copy, so it is kept and reported. One
//!   replacement at a time per volume: none while the group's `liteio.io/replacing` is set.
//! - **Health** ([`health`]): `failed` with no member online, `healthy` with every member
//!   online, else `rebuilding` while one is rebuilding, else `degraded`.
//! - **Where the assembly moves** ([`assembly_target`]) when its node's pool is down: the
//!   first member (in the raid's order) on a live node that is online.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use liteio_api::AntstorDataControl;
use liteio_api::group::VolumeMeta;
use liteio_api::pool::PoolStatus;
use liteio_api::replica::{
    CONDITION_DEGRADED, Condition, ConditionState, ReplicaHealth, ReplicaState, ReplicaStatus,
};

use crate::clock::elapsed;
use crate::state::State;

/// Whether the pool of `node` is down: `offline` or `unknown` (its agent stopped renewing
/// its Lease), or gone. A locked pool is up (its agent serves; it only takes no new volume).
pub fn pool_down(state: &State, node: &str) -> bool {
    match state.pool(node) {
        None => true,
        Some(p) => matches!(
            p.pool.status.as_ref().and_then(|s| s.status),
            Some(PoolStatus::Offline | PoolStatus::Unknown)
        ),
    }
}

/// What the controller knows of one replica (a member of the group, in the raid's order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaView {
    /// The member AntstorVolume.
    pub volume: String,
    /// Its node.
    pub node: String,
    /// Whether its node's pool is down ([`pool_down`]).
    pub pool_down: bool,
    /// What the assembling agent reports; `None` when it lists other replicas but not this
    /// one, or lists none at all.
    pub reported: Option<ReplicaState>,
    /// Since when it is in the reported state (the report's `since`, else when the
    /// controller first saw that state).
    pub since: Option<Timestamp>,
}

/// How the controller counts a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Current and reachable.
    Online,
    /// Being rebuilt.
    Rebuilding,
    /// Lost: its pool is down (`at_once`) or the agent reports it failed or missing.
    Lost {
        /// Its pool is down: replaced without the grace.
        at_once: bool,
    },
    /// Neither reported nor lost (an agent that reports others but not this one yet).
    Unknown,
}

impl ReplicaView {
    /// How it counts. `any_report`: the agent reports some replica (without any report a
    /// member on a live node counts as online: nothing says otherwise).
    pub fn seen(&self, any_report: bool) -> Seen {
        if self.pool_down {
            return Seen::Lost { at_once: true };
        }
        match self.reported {
            Some(ReplicaState::Online) => Seen::Online,
            Some(ReplicaState::Rebuilding) => Seen::Rebuilding,
            Some(ReplicaState::Failed | ReplicaState::Missing) => Seen::Lost { at_once: false },
            None if !any_report => Seen::Online,
            None => Seen::Unknown,
        }
    }

    /// Why it is lost, for events and messages.
    pub fn why_lost(&self) -> String {
        if self.pool_down {
            format!("the StoragePool of node {} is down", self.node)
        } else {
            match self.reported {
                Some(s) => format!("the assembling agent reports it {}", s.as_str()),
                None => "it is not reported".into(),
            }
        }
    }
}

/// The replicas of a replicated data control: the members of its groups (`members`, in the
/// raid's order) with their pools' liveness and the agent's reports in `dc.status.replicas`.
/// `first_seen(volume, state)` gives when the controller first saw a reported state that
/// has no `since`.
pub fn views(
    state: &State,
    dc: &AntstorDataControl,
    members: &[VolumeMeta],
    mut first_seen: impl FnMut(&str, ReplicaState) -> Timestamp,
) -> Vec<ReplicaView> {
    let reports = dc
        .status
        .as_ref()
        .map(|s| s.replicas.as_slice())
        .unwrap_or_default();
    members
        .iter()
        .map(|m| {
            let r = reports.iter().find(|r| r.volume == m.vol_id.name);
            let since = r.map(|r| {
                r.since
                    .as_deref()
                    .and_then(|t| t.parse::<Timestamp>().ok())
                    .unwrap_or_else(|| first_seen(&m.vol_id.name, r.state))
            });
            ReplicaView {
                volume: m.vol_id.name.clone(),
                node: m.target_node_name.clone(),
                pool_down: pool_down(state, &m.target_node_name),
                reported: r.map(|r| r.state),
                since,
            }
        })
        .collect()
}

/// Whether the agent reports any replica of `dc`.
pub fn any_report(dc: &AntstorDataControl) -> bool {
    dc.status.as_ref().is_some_and(|s| !s.replicas.is_empty())
}

/// The health of a replicated volume from its replicas.
pub fn health(replicas: &[ReplicaView], any_report: bool) -> ReplicaHealth {
    let seen: Vec<Seen> = replicas.iter().map(|r| r.seen(any_report)).collect();
    let online = seen.iter().filter(|s| **s == Seen::Online).count();
    if online == 0 {
        ReplicaHealth::Failed
    } else if online == seen.len() {
        ReplicaHealth::Healthy
    } else if seen.contains(&Seen::Rebuilding) {
        ReplicaHealth::Rebuilding
    } else {
        ReplicaHealth::Degraded
    }
}

/// A replica to replace and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replace {
    /// The member AntstorVolume.
    pub volume: String,
    /// Why (for the event and the log).
    pub reason: String,
}

/// What [`decide`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The replica to replace now, if any.
    pub replace: Option<Replace>,
    /// A lost replica still within the grace: look again after this long.
    pub recheck_after: Option<Duration>,
    /// Lost replicas that are kept: the last online copy (no other member online on a live
    /// node), with why.
    pub kept: Vec<(String, String)>,
    /// Every lost replica with why (for events).
    pub lost: Vec<(String, String)>,
}

/// Which replica to replace now (see the module documentation). `replacing`: the group's
/// `liteio.io/replacing` (a replacement in progress: no other is started). Pure.
pub fn decide(
    replicas: &[ReplicaView],
    any_report: bool,
    replacing: Option<&str>,
    now: Timestamp,
    grace: Duration,
) -> Verdict {
    let mut v = Verdict::default();
    // Candidates: pools down first, then the longest lost, then the raid's order.
    let mut cands: Vec<(usize, bool, Option<Timestamp>)> = Vec::new();
    for (i, r) in replicas.iter().enumerate() {
        if let Seen::Lost { at_once } = r.seen(any_report) {
            v.lost.push((r.volume.clone(), r.why_lost()));
            cands.push((i, at_once, r.since));
        }
    }
    if replacing.is_some() {
        return v;
    }
    cands.sort_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)).then(a.0.cmp(&b.0)));
    for (i, at_once, since) in cands {
        let r = &replicas[i];
        let others_online = replicas
            .iter()
            .enumerate()
            .filter(|(j, o)| *j != i && o.seen(any_report) == Seen::Online)
            .count();
        if others_online == 0 {
            v.kept.push((
                r.volume.clone(),
                format!(
                    "{}, but it is the last online replica: no other member on a live node is online, so it is kept until one is",
                    r.why_lost()
                ),
            ));
            continue;
        }
        if !at_once {
            let gone_for = since.map_or(Duration::ZERO, |s| elapsed(now, s));
            if gone_for < grace {
                let left = grace - gone_for;
                v.recheck_after = Some(v.recheck_after.map_or(left, |d| d.min(left)));
                continue;
            }
        }
        if v.replace.is_none() {
            v.replace = Some(Replace {
                volume: r.volume.clone(),
                reason: if at_once {
                    r.why_lost()
                } else {
                    format!("{} for {}s or more", r.why_lost(), grace.as_secs())
                },
            });
        }
    }
    v
}

/// Where the assembly of a replicated volume goes when `current` (its assembling node) is
/// down: the first replica, in the raid's order, that is online on a live node other than
/// `current`; `None` while `current` is up or no such replica exists.
pub fn assembly_target(
    replicas: &[ReplicaView],
    any_report: bool,
    current: &str,
    current_down: bool,
) -> Option<String> {
    if !current_down {
        return None;
    }
    replicas
        .iter()
        .find(|r| r.node != current && r.seen(any_report) == Seen::Online)
        .map(|r| r.node.clone())
}

/// The `Degraded` condition of a replicated volume of `health` with `replicas`: `True`
/// unless healthy, a reason word, a message naming each replica that is not online and why
/// (`kept`: the lost ones kept as the last online copy), and `prev`'s transition time when
/// the status did not change (else `now`).
pub fn degraded_condition(
    health: ReplicaHealth,
    replicas: &[ReplicaView],
    any_report: bool,
    reports: &[ReplicaStatus],
    kept: &[(String, String)],
    prev: Option<&Condition>,
    now: Timestamp,
) -> Condition {
    let status = if health == ReplicaHealth::Healthy {
        ConditionState::False
    } else {
        ConditionState::True
    };
    let reason = match health {
        ReplicaHealth::Healthy => "AllReplicasOnline",
        ReplicaHealth::Rebuilding => "Rebuilding",
        ReplicaHealth::Degraded => "ReplicaLost",
        ReplicaHealth::Failed => "NoReplicaOnline",
    };
    let online = replicas
        .iter()
        .filter(|r| r.seen(any_report) == Seen::Online)
        .count();
    let mut parts = Vec::new();
    for r in replicas {
        let why = match r.seen(any_report) {
            Seen::Online => continue,
            Seen::Rebuilding => {
                match reports
                    .iter()
                    .find(|x| x.volume == r.volume)
                    .and_then(|x| x.rebuild_percent)
                {
                    Some(p) => format!("rebuilding ({p}%)"),
                    None => "rebuilding".to_string(),
                }
            }
            Seen::Lost { .. } => kept
                .iter()
                .find(|(v, _)| *v == r.volume)
                .map_or_else(|| r.why_lost(), |(_, why)| why.clone()),
            Seen::Unknown => "not reported by the assembling agent yet".to_string(),
        };
        parts.push(format!("replica {} on {}: {why}", r.volume, r.node));
    }
    let message = format!(
        "{online} of {} replicas online{}{}",
        replicas.len(),
        if parts.is_empty() { "" } else { "; " },
        parts.join("; ")
    );
    let last_transition_time = match prev {
        Some(p) if p.status == status && !p.last_transition_time.is_empty() => {
            p.last_transition_time.clone()
        }
        _ => now.to_string(),
    };
    Condition {
        type_: CONDITION_DEGRADED.to_string(),
        status,
        reason: reason.to_string(),
        message,
        last_transition_time,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::jiff::SignedDuration;

    const GRACE: Duration = Duration::from_secs(20);

    fn r(volume: &str, down: bool, st: Option<ReplicaState>, ago: Option<i64>) -> ReplicaView {
        let now = now();
        ReplicaView {
            volume: volume.into(),
            node: format!("node-{volume}"),
            pool_down: down,
            reported: st,
            since: ago.map(|s| now - SignedDuration::from_secs(s)),
        }
    }

    fn now() -> Timestamp {
        "2025-05-01T10:00:00Z".parse().unwrap()
    }

    use ReplicaState::*;

    #[test]
    fn a_replica_on_a_pool_that_is_down_is_replaced_at_once() {
        let rs = [
            r("a", false, Some(Online), Some(600)),
            r("b", true, Some(Online), Some(600)),
        ];
        let v = decide(&rs, true, None, now(), GRACE);
        let rep = v.replace.unwrap();
        assert_eq!(rep.volume, "b");
        assert!(rep.reason.contains("node-b is down"), "{}", rep.reason);
        assert_eq!(v.lost.len(), 1);
        assert_eq!(v.recheck_after, None);
        // Without any report a live member counts as online: the same.
        let rs = [r("a", false, None, None), r("b", true, None, None)];
        assert_eq!(
            decide(&rs, false, None, now(), GRACE)
                .replace
                .unwrap()
                .volume,
            "b"
        );
    }

    #[test]
    fn a_failed_or_missing_replica_is_replaced_only_past_the_grace() {
        for st in [Failed, Missing] {
            // Lost for 5 s: look again in 15 s.
            let rs = [
                r("a", false, Some(Online), Some(600)),
                r("b", false, Some(st), Some(5)),
            ];
            let v = decide(&rs, true, None, now(), GRACE);
            assert_eq!(v.replace, None, "{st:?}");
            assert_eq!(v.recheck_after, Some(Duration::from_secs(15)));
            assert_eq!(v.lost[0].0, "b");
            // Lost for 20 s: replaced.
            let rs = [
                r("a", false, Some(Online), Some(600)),
                r("b", false, Some(st), Some(20)),
            ];
            let v = decide(&rs, true, None, now(), GRACE);
            assert_eq!(v.replace.unwrap().volume, "b");
            assert_eq!(v.recheck_after, None);
        }
        // Rebuilding and unreported-while-others-are are not lost.
        let rs = [
            r("a", false, Some(Online), Some(600)),
            r("b", false, Some(Rebuilding), Some(600)),
            r("c", false, None, None),
        ];
        let v = decide(&rs, true, None, now(), GRACE);
        assert_eq!(v, Verdict::default());
    }

    #[test]
    fn the_last_online_replica_is_never_replaced() {
        // The other member is rebuilding: the lost one holds the only current copy.
        let rs = [
            r("a", true, Some(Online), Some(600)),
            r("b", false, Some(Rebuilding), Some(60)),
        ];
        let v = decide(&rs, true, None, now(), GRACE);
        assert_eq!(v.replace, None);
        assert_eq!(v.kept.len(), 1);
        assert!(v.kept[0].1.contains("last online replica"), "{:?}", v.kept);
        // Both nodes down: neither is replaced.
        let rs = [
            r("a", true, Some(Online), None),
            r("b", true, Some(Online), None),
        ];
        let v = decide(&rs, true, None, now(), GRACE);
        assert_eq!(v.replace, None);
        assert_eq!(v.kept.len(), 2);
        // A stale "online" on a down node does not count as online.
        let rs = [
            r("a", false, Some(Failed), Some(600)),
            r("b", true, Some(Online), None),
        ];
        let v = decide(&rs, true, None, now(), GRACE);
        assert_eq!(v.replace, None);
        assert_eq!(v.kept.len(), 2);
    }

    #[test]
    fn one_replacement_at_a_time() {
        let rs = [
            r("a", false, Some(Online), Some(600)),
            r("b", true, Some(Online), None),
            r("c", false, Some(Failed), Some(600)),
        ];
        // In progress (intent recorded): nothing more, but both are reported lost.
        let v = decide(&rs, true, Some("b"), now(), GRACE);
        assert_eq!(v.replace, None);
        assert_eq!(v.lost.len(), 2);
        // Otherwise the one whose pool is down first, the other afterwards.
        let v = decide(&rs, true, None, now(), GRACE);
        assert_eq!(v.replace.unwrap().volume, "b");
        // Of two lost ones past the grace, the one lost longest.
        let rs = [
            r("a", false, Some(Online), Some(600)),
            r("b", false, Some(Missing), Some(30)),
            r("c", false, Some(Failed), Some(300)),
        ];
        assert_eq!(
            decide(&rs, true, None, now(), GRACE)
                .replace
                .unwrap()
                .volume,
            "c"
        );
    }

    #[test]
    fn health_from_the_replicas() {
        let h = |rs: &[ReplicaView]| health(rs, true);
        assert_eq!(
            h(&[
                r("a", false, Some(Online), None),
                r("b", false, Some(Online), None)
            ]),
            ReplicaHealth::Healthy
        );
        assert_eq!(
            h(&[
                r("a", false, Some(Online), None),
                r("b", false, Some(Rebuilding), None)
            ]),
            ReplicaHealth::Rebuilding
        );
        assert_eq!(
            h(&[
                r("a", false, Some(Online), None),
                r("b", true, Some(Online), None)
            ]),
            ReplicaHealth::Degraded
        );
        assert_eq!(
            h(&[
                r("a", false, Some(Failed), None),
                r("b", false, Some(Rebuilding), None)
            ]),
            ReplicaHealth::Failed
        );
        assert_eq!(
            health(
                &[r("a", false, None, None), r("b", false, None, None)],
                false
            ),
            ReplicaHealth::Healthy
        );
    }

    #[test]
    fn the_degraded_condition_names_each_replica_that_is_not_online() {
        let rs = [
            r("a", false, Some(Online), None),
            r("b", true, Some(Online), None),
            r("c", false, Some(Rebuilding), None),
        ];
        let reports = [ReplicaStatus {
            volume: "c".into(),
            node: "node-c".into(),
            state: Rebuilding,
            rebuild_percent: Some(42),
            rebuilt_bytes: None,
            since: None,
            message: String::new(),
        }];
        let c = degraded_condition(
            ReplicaHealth::Rebuilding,
            &rs,
            true,
            &reports,
            &[],
            None,
            now(),
        );
        assert_eq!(c.type_, "Degraded");
        assert_eq!(c.status, ConditionState::True);
        assert_eq!(c.reason, "Rebuilding");
        assert_eq!(
            c.message,
            "1 of 3 replicas online; replica b on node-b: the StoragePool of node node-b is down; replica c on node-c: rebuilding (42%)"
        );
        assert_eq!(c.last_transition_time, "2025-05-01T10:00:00Z");
        // Same status later: the transition time stays; healthy again: it moves.
        let later = now() + SignedDuration::from_secs(60);
        let again = degraded_condition(
            ReplicaHealth::Degraded,
            &rs,
            true,
            &reports,
            &[],
            Some(&c),
            later,
        );
        assert_eq!(again.last_transition_time, c.last_transition_time);
        assert_eq!(again.reason, "ReplicaLost");
        let ok = [r("a", false, Some(Online), None)];
        let healed = degraded_condition(
            ReplicaHealth::Healthy,
            &ok,
            true,
            &[],
            &[],
            Some(&again),
            later,
        );
        assert_eq!(healed.status, ConditionState::False);
        assert_eq!(healed.message, "1 of 1 replicas online");
        assert_eq!(healed.last_transition_time, later.to_string());
    }

    #[test]
    fn the_assembly_moves_to_the_first_online_replica_on_a_live_node() {
        let rs = [
            r("a", true, Some(Online), None),
            r("b", false, Some(Rebuilding), None),
            r("c", false, Some(Online), None),
        ];
        assert_eq!(
            assembly_target(&rs, true, "node-a", false),
            None,
            "not down"
        );
        assert_eq!(
            assembly_target(&rs, true, "node-a", true).as_deref(),
            Some("node-c")
        );
        let rs = [
            r("a", true, Some(Online), None),
            r("b", false, Some(Rebuilding), None),
        ];
        assert_eq!(assembly_target(&rs, true, "node-a", true), None);
    }
}
