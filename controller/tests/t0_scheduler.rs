//! T0: the scheduler's filters and priorities, case by case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::{
    NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
};
use liteio_api::common::{VolumePosition, VolumeType};
use liteio_api::keys::annotations;
use liteio_api::pool::PoolStatus;
use liteio_api::size::GIB;
use liteio_controller::config::{NodeReservation, SchedulerConfig};
use liteio_controller::scheduler::{Reason, ScheduleError, Scheduler, tie_hash};
use liteio_controller::state::State;
use liteio_controller::testing::*;

fn cfg(filters: &[&str]) -> SchedulerConfig {
    SchedulerConfig {
        filters: filters.iter().map(|s| s.to_string()).collect(),
        ..SchedulerConfig::default()
    }
}

fn one_pool(p: PoolFixture) -> State {
    let mut s = State::new(&SchedulerConfig::default());
    s.upsert_pool(p.arc());
    s
}

fn affinity(key: &str, op: &str, values: &[&str]) -> NodeAffinity {
    NodeAffinity {
        required_during_scheduling_ignored_during_execution: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(vec![NodeSelectorRequirement {
                    key: key.into(),
                    operator: op.into(),
                    values: Some(values.iter().map(|s| s.to_string()).collect()),
                }]),
                match_fields: None,
            }],
        }),
        preferred_during_scheduling_ignored_during_execution: None,
    }
}

/// (case, pool, volume, expected verdict for the pool "n1") with all filters on.
#[test]
fn filters_case_by_case() {
    let all = cfg(&["Basic", "Affinity", "MinLocalStorage"]);
    let big = 100 * GIB;
    let cases: Vec<(&str, PoolFixture, VolumeFixture, Result<(), Reason>)> = vec![
        ("fits", pool("n1", big), volume("v", 10 * GIB), Ok(())),
        (
            "not ready",
            pool("n1", big).status(PoolStatus::Unknown),
            volume("v", GIB),
            Err(Reason::PoolUnschedulable),
        ),
        (
            "offline",
            pool("n1", big).status(PoolStatus::Offline),
            volume("v", GIB),
            Err(Reason::PoolUnschedulable),
        ),
        (
            "locked by label",
            pool("n1", big).locked(),
            volume("v", GIB),
            Err(Reason::PoolUnschedulable),
        ),
        (
            "too big",
            pool("n1", 10 * GIB),
            volume("v", 11 * GIB),
            Err(Reason::PoolFreeSize),
        ),
        (
            "exactly fits",
            pool("n1", 10 * GIB),
            volume("v", 10 * GIB),
            Ok(()),
        ),
        (
            "snapshot reserve of the incoming volume counts",
            pool("n1", 10 * GIB),
            volume("v", 8 * GIB)
                .annotate(annotations::SNAPSHOT_RESERVED_BYTES, &(3 * GIB).to_string()),
            Err(Reason::PoolFreeSize),
        ),
        (
            "spdk unhealthy",
            pool("n1", big).spdk_unhealthy(),
            volume("v", GIB).host("n1"),
            Err(Reason::SpdkUnhealthy),
        ),
        (
            "must local elsewhere",
            pool("n1", big),
            volume("v", GIB)
                .host("h2")
                .position(VolumePosition::MustLocal),
            Err(Reason::PositionAdvice),
        ),
        (
            "must local here",
            pool("n1", big),
            volume("v", GIB)
                .host("n1")
                .position(VolumePosition::MustLocal),
            Ok(()),
        ),
        // Without a requested topology a volume is local to the pool it is placed on.
        (
            "must local without host",
            pool("n1", big),
            volume("v", GIB).position(VolumePosition::MustLocal),
            Ok(()),
        ),
        (
            "no host on a pool that cannot export",
            pool("n1", big).lvm().spdk_unhealthy(),
            volume("v", GIB),
            Ok(()),
        ),
        (
            "remote consumer on a pool that cannot export",
            pool("n1", big).lvm().spdk_unhealthy(),
            volume("v", GIB).host("h2"),
            Err(Reason::SpdkUnhealthy),
        ),
        (
            "must remote without host, pool can export",
            pool("n1", big),
            volume("v", GIB).position(VolumePosition::MustRemote),
            Ok(()),
        ),
        (
            "must remote without host, pool cannot export",
            pool("n1", big).lvm().spdk_unhealthy(),
            volume("v", GIB).position(VolumePosition::MustRemote),
            Err(Reason::PositionAdvice),
        ),
        (
            "no host on an unhealthy spdk pool",
            pool("n1", big).spdk_unhealthy(),
            volume("v", GIB),
            Err(Reason::SpdkUnhealthy),
        ),
        (
            "must remote here",
            pool("n1", big),
            volume("v", GIB)
                .host("n1")
                .position(VolumePosition::MustRemote),
            Err(Reason::PositionAdvice),
        ),
        (
            "spdk volume on lvm pool",
            pool("n1", big).lvm(),
            volume("v", GIB).host("n1").kind(VolumeType::SpdkLVol),
            Err(Reason::VolTypeNotMatch),
        ),
        (
            "lvm volume on spdk pool",
            pool("n1", big),
            volume("v", GIB).kind(VolumeType::KernelLVol),
            Err(Reason::VolTypeNotMatch),
        ),
        (
            "limited volume on an spdk pool",
            pool("n1", big),
            volume("v", GIB).host("h2").iops(2000),
            Ok(()),
        ),
        (
            "limited volume on an lvm pool (it cannot enforce the limit)",
            pool("n1", big).lvm(),
            volume("v", GIB).iops(2000),
            Err(Reason::QosNotEnforced),
        ),
        (
            "explicitly unlimited volume on an lvm pool",
            pool("n1", big).lvm(),
            volume("v", GIB).iops(0),
            Ok(()),
        ),
        (
            "lvm volume on lvm pool",
            pool("n1", big).lvm(),
            volume("v", GIB).kind(VolumeType::KernelLVol),
            Ok(()),
        ),
        (
            "node affinity in",
            pool("n1", big).node_label("rack", "r1"),
            volume("v", GIB).annotate(annotations::NODE_LABEL_SELECTOR, "rack in (r1,r2)"),
            Ok(()),
        ),
        (
            "node selector mismatch",
            pool("n1", big).node_label("rack", "r1"),
            volume("v", GIB).annotate(annotations::NODE_LABEL_SELECTOR, "rack=r2"),
            Err(Reason::NodeAffinity),
        ),
        (
            "pool selector on node-sn",
            pool("n1", big),
            volume("v", GIB).annotate(annotations::POOL_LABEL_SELECTOR, "obnvmf/node-sn!=n1"),
            Err(Reason::PoolAffinity),
        ),
        (
            "pool selector matches",
            pool("n1", big),
            volume("v", GIB).annotate(annotations::POOL_LABEL_SELECTOR, "obnvmf/node-sn=n1"),
            Ok(()),
        ),
        (
            "min local storage (default 0) fine",
            pool("n1", big),
            volume("v", 90 * GIB).host("h2"),
            Ok(()),
        ),
    ];
    let sched = Scheduler::new(&all);
    for (name, p, v, want) in cases {
        let s = one_pool(p);
        let got = sched.check_pool(&s, "n1", &v.0).unwrap();
        assert_eq!(got, want, "case {name:?}");
    }
}

#[test]
fn affinity_terms_on_spec() {
    let sched = Scheduler::new(&cfg(&["Affinity"]));
    let s = one_pool(
        pool("n1", GIB)
            .node_label("zone", "a")
            .label("tier", "fast"),
    );
    let mut v = volume("v", GIB).build();
    v.spec.node_affinity = Some(affinity("zone", "In", &["a"]));
    assert_eq!(sched.check_pool(&s, "n1", &v).unwrap(), Ok(()));
    v.spec.node_affinity = Some(affinity("zone", "NotIn", &["a"]));
    assert_eq!(
        sched.check_pool(&s, "n1", &v).unwrap(),
        Err(Reason::NodeAffinity)
    );
    v.spec.node_affinity = None;
    v.spec.pool_affinity = Some(affinity("tier", "In", &["slow"]));
    assert_eq!(
        sched.check_pool(&s, "n1", &v).unwrap(),
        Err(Reason::PoolAffinity)
    );
    v.spec.pool_affinity = Some(affinity("tier", "Bogus", &["slow"]));
    let e = sched.check_pool(&s, "n1", &v).unwrap_err();
    assert!(
        e.to_string()
            .contains("spec.poolAffinity.requiredDuringSchedulingIgnoredDuringExecution"),
        "{e}"
    );
}

#[test]
fn malformed_selector_annotation_is_an_invalid_volume() {
    let sched = Scheduler::new(&SchedulerConfig::default());
    let s = one_pool(pool("n1", 10 * GIB));
    let v = volume("v", GIB).annotate(annotations::NODE_LABEL_SELECTOR, "rack in r1");
    match sched.schedule(&s, &v.0) {
        Err(ScheduleError::InvalidVolume { field, .. }) => {
            assert_eq!(field, "metadata.annotations[obnvmf/node-label-selector]")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn remote_volume_count() {
    let c = SchedulerConfig {
        max_remote_volume_count: 1,
        ..SchedulerConfig::default()
    };
    let sched = Scheduler::new(&c);
    let mut s = State::new(&c);
    s.upsert_pool(pool("n1", 100 * GIB).arc());
    s.upsert_volume(volume("r1", GIB).host("h9").scheduled_to("n1").arc());
    let remote = volume("v", GIB).host("h2").build();
    assert_eq!(
        sched.check_pool(&s, "n1", &remote).unwrap(),
        Err(Reason::RemoteVolMaxCount)
    );
    let local = volume("v", GIB).host("n1").build();
    assert_eq!(sched.check_pool(&s, "n1", &local).unwrap(), Ok(()));
    // No requested topology: the volume will be local to the pool's node, not remote.
    let hostless = volume("v", GIB).build();
    assert_eq!(sched.check_pool(&s, "n1", &hostless).unwrap(), Ok(()));
    let ignored = volume("v", GIB)
        .host("h2")
        .annotate(annotations::REGARD_AS_REMOTE, "true")
        .build();
    let mut c2 = c.clone();
    c2.remote_ignore_anno_selector
        .insert(annotations::REGARD_AS_REMOTE.into(), "true".into());
    assert_eq!(
        Scheduler::new(&c2).check_pool(&s, "n1", &ignored).unwrap(),
        Ok(())
    );
}

#[test]
fn min_local_storage() {
    let c = SchedulerConfig {
        filters: vec!["MinLocalStorage".into()],
        min_local_storage_pct: 50,
        ..SchedulerConfig::default()
    };
    let sched = Scheduler::new(&c);
    let mut s = State::new(&c);
    s.upsert_pool(pool("n1", 100 * GIB).arc());
    s.upsert_volume(volume("r1", 30 * GIB).host("h9").scheduled_to("n1").arc());
    // 100 − 30 − 20 = 50 % left: fine; 21 GiB leaves 49 %.
    let ok = volume("v", 20 * GIB).host("h2").build();
    let too_much = volume("v", 21 * GIB).host("h2").build();
    let local = volume("v", 60 * GIB).host("n1").build();
    assert_eq!(sched.check_pool(&s, "n1", &ok).unwrap(), Ok(()));
    assert_eq!(
        sched.check_pool(&s, "n1", &too_much).unwrap(),
        Err(Reason::LocalStorageTooLow)
    );
    assert_eq!(sched.check_pool(&s, "n1", &local).unwrap(), Ok(()));
}

#[test]
fn reservations() {
    let c = SchedulerConfig {
        node_reservations: vec![NodeReservation {
            id: "ns/pvc".into(),
            size: 10 * GIB,
        }],
        ..SchedulerConfig::default()
    };
    let sched = Scheduler::new(&c);
    let mut s = State::new(&c);
    s.upsert_pool(pool("n1", 15 * GIB).arc());
    // Free is 5 GiB; the 8 GiB volume with the matching reservation fits into it.
    let with = volume("v", 8 * GIB).annotate(annotations::RESERVATION_ID, "ns/pvc");
    assert_eq!(sched.check_pool(&s, "n1", &with.0).unwrap(), Ok(()));
    let too_big = volume("v", 12 * GIB).annotate(annotations::RESERVATION_ID, "ns/pvc");
    assert_eq!(
        sched.check_pool(&s, "n1", &too_big.0).unwrap(),
        Err(Reason::ReservationTooSmall)
    );
    let other = volume("v", GIB).annotate(annotations::RESERVATION_ID, "ns/other");
    assert_eq!(
        sched.check_pool(&s, "n1", &other.0).unwrap(),
        Err(Reason::ReservationNotMatch)
    );
    let without = volume("v", 8 * GIB);
    assert_eq!(
        sched.check_pool(&s, "n1", &without.0).unwrap(),
        Err(Reason::PoolFreeSize)
    );
}

#[test]
fn thin_overcommit_ratio_per_pool() {
    let mut c = SchedulerConfig::default();
    c.pool_overcommit_ratios.insert("n2".into(), 3.0);
    let sched = Scheduler::new(&c);
    let mut s = State::new(&c);
    s.upsert_pool(pool("n1", 10 * GIB).arc());
    s.upsert_pool(pool("n2", 10 * GIB).arc());
    let thin = volume("t", 25 * GIB).thin().build();
    assert_eq!(
        sched.check_pool(&s, "n1", &thin).unwrap(),
        Err(Reason::ThinOvercommit)
    );
    assert_eq!(sched.check_pool(&s, "n2", &thin).unwrap(), Ok(()));
    s.upsert_volume(volume("t0", 10 * GIB).thin().scheduled_to("n2").arc());
    assert_eq!(
        sched.check_pool(&s, "n2", &thin).unwrap(),
        Err(Reason::ThinOvercommit)
    );
}

#[test]
fn message_counts_per_reason() {
    let sched = Scheduler::new(&SchedulerConfig::default());
    let mut s = State::new(&SchedulerConfig::default());
    s.upsert_pool(pool("n1", GIB).arc());
    s.upsert_pool(pool("n2", GIB).arc());
    s.upsert_pool(pool("n3", 100 * GIB).arc());
    let v = volume("v", 10 * GIB)
        .host("n9")
        .position(VolumePosition::MustRemote)
        .annotate(annotations::POOL_LABEL_SELECTOR, "obnvmf/node-sn!=n3");
    let e = sched.schedule(&s, &v.0).unwrap_err();
    assert_eq!(
        e.to_string(),
        "NoStoragePoolAvailable: PoolFreeSize: 2, PoolAffinity: 1"
    );
    let empty = State::new(&SchedulerConfig::default());
    assert!(
        sched
            .schedule(&empty, &v.0)
            .unwrap_err()
            .to_string()
            .starts_with("NoStoragePoolAvailable")
    );
    let must_local = volume("v", 10 * GIB)
        .host("n9")
        .position(VolumePosition::MustLocal);
    assert_eq!(
        sched.schedule(&s, &must_local.0).unwrap_err().to_string(),
        "NoStoragePoolAvailable: PoolFreeSize: 2, PositionAdvice: 1"
    );
}

#[test]
fn least_resource_uses_state_free_space() {
    let sched = Scheduler::new(&cfg(&["Basic"]));
    let mut s = State::new(&SchedulerConfig::default());
    // n1 reports itself empty but the state knows it is half full: bin-packing picks it.
    s.upsert_pool(pool("n1", 100 * GIB).reported_free(100 * GIB).arc());
    s.upsert_pool(pool("n2", 100 * GIB).reported_free(10 * GIB).arc());
    s.upsert_volume(volume("a", 50 * GIB).scheduled_to("n1").arc());
    let p = sched.schedule(&s, &volume("v", GIB).0).unwrap();
    assert_eq!(p.node, "n1");
    assert_eq!(p.score, 50);
}

#[test]
fn position_advice_priority() {
    let sched = Scheduler::new(&SchedulerConfig::default());
    let mut s = State::new(&SchedulerConfig::default());
    s.upsert_pool(pool("n1", 100 * GIB).arc());
    s.upsert_pool(pool("n2", 100 * GIB).arc());
    let local = volume("v", GIB)
        .host("n2")
        .position(VolumePosition::PreferLocal);
    assert_eq!(sched.schedule(&s, &local.0).unwrap().node, "n2");
    let remote = volume("v", GIB)
        .host("n2")
        .position(VolumePosition::PreferRemote);
    assert_eq!(sched.schedule(&s, &remote.0).unwrap().node, "n1");
}

#[test]
fn ties_are_deterministic_given_a_seed() {
    let names: Vec<String> = (0..20).map(|i| format!("n{i}")).collect();
    let pick = |seed: u64| {
        let c = SchedulerConfig {
            seed,
            ..SchedulerConfig::default()
        };
        let mut s = State::new(&c);
        for n in &names {
            s.upsert_pool(pool(n, 100 * GIB).arc());
        }
        Scheduler::new(&c)
            .schedule(&s, &volume("v", GIB).0)
            .unwrap()
            .node
    };
    assert_eq!(pick(7), pick(7));
    let picks: std::collections::BTreeSet<String> = (0..16).map(pick).collect();
    assert!(
        picks.len() > 1,
        "different seeds should spread ties: {picks:?}"
    );
    let min = names.iter().min_by_key(|n| tie_hash(7, n)).unwrap();
    assert_eq!(&pick(7), min);
}

#[test]
fn selected_target_node_skips_filters() {
    let sched = Scheduler::new(&SchedulerConfig::default());
    let s = one_pool(pool("n1", GIB).status(PoolStatus::Unknown));
    let v = volume("v", 10 * GIB).annotate(annotations::SELECTED_TGT_NODE, "n1");
    assert_eq!(sched.schedule(&s, &v.0).unwrap().node, "n1");
    let v = volume("v", GIB).annotate(annotations::SELECTED_TGT_NODE, "n7");
    assert_eq!(
        sched.schedule(&s, &v.0).unwrap_err().to_string(),
        "NoStoragePoolAvailable: SelectedNodeNotFound: 1"
    );
}

#[test]
fn scheduling_then_binding_updates_free_space() {
    let sched = Scheduler::new(&SchedulerConfig::default());
    let mut s = State::new(&SchedulerConfig::default());
    s.upsert_pool(pool("n1", 10 * GIB).arc());
    for i in 0..3 {
        let v = volume(&format!("v{i}"), 3 * GIB);
        s.upsert_volume(v.clone().arc());
        let p = sched.schedule(&s, &v.0).unwrap();
        s.bind(&liteio_controller::state::ObjectKey::of(&v.0), &p.node)
            .unwrap();
    }
    let v = volume("v4", 3 * GIB);
    assert_eq!(
        sched.schedule(&s, &v.0).unwrap_err().to_string(),
        "NoStoragePoolAvailable: PoolFreeSize: 1"
    );
}
