//! T0: placement of volume group members (sizes, counts, symmetry, distinct nodes, the
//! local-storage floor, nearly full pools, all or nothing).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use liteio_api::common::VolumeType;
use liteio_api::group::{
    ANNO_MEMBER_RESERVE, AntstorVolumeGroup, AntstorVolumeGroupSpec, EntityIdentity, SymmetryValue,
    VolumeMeta,
};
use liteio_api::size::{GIB, MIB};
use liteio_controller::config::SchedulerConfig;
use liteio_controller::group_scheduler::{GroupScheduleError, plan};
use liteio_controller::scheduler::{Reason, Scheduler};
use liteio_controller::state::State;
use liteio_controller::testing::*;

fn group(total: u64) -> AntstorVolumeGroup {
    let mut g = AntstorVolumeGroup::new(
        "pvc-g",
        AntstorVolumeGroupSpec {
            uuid: "0c0c0c0c-1111-4222-8333-444455556666".into(),
            total_size: total as i64,
            ..Default::default()
        },
    );
    g.metadata.namespace = Some("obnvmf".into());
    g.spec.stragety.allow_empty_node = true;
    g
}

fn sized(mut g: AntstorVolumeGroup, min: &str, max: &str) -> AntstorVolumeGroup {
    let r = &mut g.spec.desired_volume_spec.size_range;
    r.min = Some(Quantity(min.into()));
    r.max = Some(Quantity(max.into()));
    g
}

fn symmetric(mut g: AntstorVolumeGroup, count: i64) -> AntstorVolumeGroup {
    g.spec.desired_volume_spec.size_symmetry = SymmetryValue::Symmetric;
    g.spec.desired_volume_spec.desired_count = count;
    g
}

fn max_members(mut g: AntstorVolumeGroup, n: i64) -> AntstorVolumeGroup {
    g.spec.desired_volume_spec.count_range.max = n;
    g
}

/// Pools of the given sizes (GiB) named n1, n2, …
fn state(gib: &[u64]) -> State {
    let mut s = State::new(&SchedulerConfig::default());
    for (i, g) in gib.iter().enumerate() {
        s.upsert_pool(pool(&format!("n{}", i + 1), g * GIB).arc());
    }
    s
}

fn run(s: &State, g: &AntstorVolumeGroup) -> Result<Vec<(String, u64)>, GroupScheduleError> {
    run_with(&Scheduler::new(&SchedulerConfig::default()), s, g)
}

fn run_with(
    sched: &Scheduler,
    s: &State,
    g: &AntstorVolumeGroup,
) -> Result<Vec<(String, u64)>, GroupScheduleError> {
    let mut n = 0;
    let members = plan(sched, s, g, VolumeType::SpdkLVol, || {
        n += 1;
        format!("00000000-0000-4000-8000-{n:012}")
    })?;
    // Distinct nodes, distinct names, each member named after the group.
    let mut nodes: Vec<&str> = members
        .iter()
        .map(|m| m.target_node_name.as_str())
        .collect();
    nodes.sort();
    nodes.dedup();
    assert_eq!(
        nodes.len(),
        members.len(),
        "two members on one node: {members:?}"
    );
    for m in &members {
        assert!(m.vol_id.name.starts_with("pvc-g-"), "{m:?}");
        assert_eq!(m.size as u64 % (4 * MIB), 0, "not 4 MiB aligned: {m:?}");
    }
    Ok(members
        .into_iter()
        .map(|m| (m.target_node_name, m.size as u64))
        .collect())
}

#[test]
fn asymmetric_fills_the_roomiest_pools_first() {
    let s = state(&[20, 15, 8]);
    assert_eq!(
        run(&s, &group(30 * GIB)).unwrap(),
        vec![("n1".into(), 20 * GIB), ("n2".into(), 10 * GIB)]
    );
    // Capped at the maximum member size: three members.
    assert_eq!(
        run(&s, &sized(group(30 * GIB), "1Gi", "12Gi")).unwrap(),
        vec![
            ("n1".into(), 12 * GIB),
            ("n2".into(), 12 * GIB),
            ("n3".into(), 6 * GIB)
        ]
    );
}

#[test]
fn a_last_fragment_below_the_minimum_is_rounded_up_to_it() {
    // LiteIO skipped it and failed the group.
    let s = state(&[100, 100, 100]);
    assert_eq!(
        run(&s, &sized(group(21 * GIB), "2Gi", "10Gi")).unwrap(),
        vec![
            ("n1".into(), 10 * GIB),
            ("n2".into(), 10 * GIB),
            ("n3".into(), 2 * GIB)
        ]
    );
}

#[test]
fn symmetric_takes_the_fewest_equal_members_that_fit() {
    let s = state(&[20, 15, 8]);
    assert_eq!(
        run(&s, &symmetric(group(30 * GIB), 0)).unwrap(),
        vec![("n1".into(), 15 * GIB), ("n2".into(), 15 * GIB)]
    );
    // Asked for three: 10 GiB each does not fit n3 (8 GiB).
    let e = run(&s, &symmetric(group(30 * GIB), 3)).unwrap_err();
    assert!(
        e.to_string()
            .contains("3 members of 10.0 GiB: 2 pools have room"),
        "{e}"
    );
    // Shares round up to 4 MiB: 10 GiB + 1 MiB in two.
    let s = state(&[100, 100]);
    assert_eq!(
        run(&s, &symmetric(group(10 * GIB + MIB), 2)).unwrap(),
        vec![
            ("n1".into(), 5 * GIB + 4 * MIB),
            ("n2".into(), 5 * GIB + 4 * MIB)
        ]
    );
}

#[test]
fn counts_and_nearly_full_pools() {
    // Three nearly full pools: 30 GiB needs all three.
    let s = state(&[10, 10, 10]);
    assert_eq!(run(&s, &group(30 * GIB)).unwrap().len(), 3);
    // At most two members: nothing is created, the message says what is missing.
    let e = run(&s, &max_members(group(30 * GIB), 2)).unwrap_err();
    match &e {
        GroupScheduleError::NoRoom { missing, .. } => assert_eq!(*missing, 10 * GIB),
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().starts_with("NoStoragePoolAvailable"), "{e}");
    // More than all pools hold.
    assert!(run(&s, &group(31 * GIB)).is_err());
}

#[test]
fn members_already_placed_are_kept_and_their_nodes_not_reused() {
    let s = state(&[20, 20, 20]);
    let mut g = sized(group(30 * GIB), "1Gi", "10Gi");
    g.spec.volumes = vec![VolumeMeta {
        vol_id: EntityIdentity {
            namespace: "obnvmf".into(),
            name: "pvc-g-old".into(),
            uuid: "u-old".into(),
        },
        target_node_name: "n1".into(),
        size: (10 * GIB) as i64,
    }];
    assert_eq!(
        run(&s, &g).unwrap(),
        vec![("n2".into(), 10 * GIB), ("n3".into(), 10 * GIB)]
    );
    // Fully placed: nothing to add.
    g.spec.total_size = (10 * GIB) as i64;
    assert!(run(&s, &g).unwrap().is_empty());
}

#[test]
fn each_member_holds_the_assemblys_reserve() {
    let s = state(&[20, 20]);
    let mut g = symmetric(group(20 * GIB), 2);
    g.metadata.annotations = Some(
        [(ANNO_MEMBER_RESERVE.to_string(), (4 * MIB).to_string())]
            .into_iter()
            .collect(),
    );
    assert_eq!(
        run(&s, &g).unwrap(),
        vec![
            ("n1".into(), 10 * GIB + 4 * MIB),
            ("n2".into(), 10 * GIB + 4 * MIB)
        ]
    );
}

#[test]
fn empty_pools_only_when_allowed_and_the_local_floor_holds() {
    let mut s = state(&[50, 50]);
    // n1 holds a volume; n2 is empty.
    s.upsert_volume(volume("other", GIB).scheduled_to("n1").arc());
    let mut g = group(60 * GIB);
    g.spec.stragety.allow_empty_node = false;
    let e = run(&s, &g).unwrap_err();
    match &e {
        GroupScheduleError::NoRoom { rejected, .. } => {
            assert_eq!(rejected.0.get(&Reason::EmptyNode), Some(&1), "{e}")
        }
        other => panic!("{other:?}"),
    }
    g.spec.stragety.allow_empty_node = true;
    assert_eq!(
        run(&s, &g).unwrap(),
        vec![("n1".into(), 49 * GIB), ("n2".into(), 11 * GIB)]
    );
    // The local floor: half of each pool stays for local volumes (and n1 already serves
    // 1 GiB remotely): room n1 24 GiB, n2 25 GiB; the empty pool comes last.
    let cfg = SchedulerConfig {
        filters: vec!["Basic".into(), "Affinity".into(), "MinLocalStorage".into()],
        min_local_storage_pct: 50,
        ..SchedulerConfig::default()
    };
    let sched = Scheduler::new(&cfg);
    assert_eq!(
        run_with(&sched, &s, &group(30 * GIB)).unwrap(),
        vec![("n1".into(), 24 * GIB), ("n2".into(), 6 * GIB)]
    );
    assert_eq!(run_with(&sched, &s, &group(49 * GIB)).unwrap().len(), 2);
    let e = run_with(&sched, &s, &group(50 * GIB)).unwrap_err();
    assert!(e.to_string().contains("n1 24.0 GiB, n2 25.0 GiB"), "{e}");
}

// ---- replicated volumes: the spread key and replacements ------------------------------

const ZONE: &str = "topology.kubernetes.io/zone";

/// A replicated volume's group as the CSI controller makes it: `n` whole copies of
/// `size`, each with the 4 MiB superblock reserve, optionally spread over `ZONE`.
fn replicated(n: i64, size: u64, spread: bool) -> AntstorVolumeGroup {
    let each = size.to_string();
    let mut g = symmetric(sized(group(size * n as u64), &each, &each), n);
    g.spec.desired_volume_spec.count_range.min = n;
    g.spec.desired_volume_spec.count_range.max = n;
    let mut annos = std::collections::BTreeMap::from([(
        ANNO_MEMBER_RESERVE.to_string(),
        (4 * MIB).to_string(),
    )]);
    if spread {
        annos.insert(
            liteio_api::replica::ANNO_SPREAD_KEY.to_string(),
            ZONE.into(),
        );
    }
    g.metadata.annotations = Some(annos);
    g
}

/// Pools n1.. of 10 GiB with these zones (`None`: no zone label).
fn zoned(zones: &[Option<&str>]) -> State {
    let mut s = State::new(&SchedulerConfig::default());
    for (i, z) in zones.iter().enumerate() {
        let mut p = pool(&format!("n{}", i + 1), 10 * GIB);
        if let Some(z) = z {
            p = p.node_label(ZONE, z);
        }
        s.upsert_pool(p.arc());
    }
    s
}

#[test]
fn replicas_are_whole_copies_on_distinct_nodes_and_distinct_spread_values() {
    // Without a spread key: the first nodes by room then name, each a whole copy.
    let s = zoned(&[Some("a"), Some("a"), Some("b"), None]);
    assert_eq!(
        run(&s, &replicated(2, GIB, false)).unwrap(),
        vec![("n1".into(), GIB + 4 * MIB), ("n2".into(), GIB + 4 * MIB)]
    );
    // With it: n2 shares n1's zone, n4 has no zone label.
    assert_eq!(
        run(&s, &replicated(2, GIB, true)).unwrap(),
        vec![("n1".into(), GIB + 4 * MIB), ("n3".into(), GIB + 4 * MIB)]
    );
    // Three replicas in two zones: nothing placed, and the reason says why.
    match run(&s, &replicated(3, GIB, true)).unwrap_err() {
        GroupScheduleError::NoRoom { detail, .. } => {
            assert!(
                detail.contains("2 of them in distinct spread values"),
                "{detail}"
            );
            assert!(
                detail.contains("1 pools not candidates because their node has no label topology.kubernetes.io/zone (n4)"),
                "{detail}"
            );
        }
        e => panic!("{e:?}"),
    }
    // The Node object's labels count too (they win over the pool's nodeInfo).
    let mut s = zoned(&[Some("a"), Some("a"), None]);
    s.upsert_node(
        "n3",
        liteio_controller::state::NodeFacts {
            labels: std::collections::BTreeMap::from([(ZONE.to_string(), "c".to_string())]),
            taints: Vec::new(),
        },
    );
    assert_eq!(
        run(&s, &replicated(2, GIB, true)).unwrap(),
        vec![("n1".into(), GIB + 4 * MIB), ("n3".into(), GIB + 4 * MIB)]
    );
}

fn placed(mut g: AntstorVolumeGroup, nodes: &[&str], size: u64) -> AntstorVolumeGroup {
    g.spec.volumes = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| VolumeMeta {
            vol_id: EntityIdentity {
                namespace: "obnvmf".into(),
                name: format!("pvc-g-m{i}"),
                uuid: format!("uuid-m{i}"),
            },
            target_node_name: n.to_string(),
            size: size as i64,
        })
        .collect();
    g
}

#[test]
fn a_replacement_goes_to_a_node_holding_no_replica_in_another_spread_value() {
    use liteio_controller::group_scheduler::place_replacement;
    let sched = Scheduler::new(&SchedulerConfig::default());
    let uuid = || "00000000-0000-4000-8000-00000000abcd".to_string();
    // No spread key: never the replaced member's node nor the other's.
    let s = zoned(&[None, None, None]);
    let g = placed(replicated(2, GIB, false), &["n1", "n2"], GIB + 4 * MIB);
    let m = place_replacement(
        &sched,
        &s,
        &g,
        &g.spec.volumes[1],
        VolumeType::SpdkLVol,
        uuid,
    )
    .unwrap();
    assert_eq!(m.target_node_name, "n3");
    assert_eq!(m.size, (GIB + 4 * MIB) as i64, "the same size");
    assert!(m.vol_id.name.starts_with("pvc-g-"), "{m:?}");
    // Zones a (n1, n2), b (n3): the replica in b is lost; n2 is in a, which the replica
    // staying on n1 holds, n4 has no label: no place, and the reason says so.
    let s = zoned(&[Some("a"), Some("a"), Some("b"), None]);
    let g = placed(replicated(2, GIB, true), &["n1", "n3"], GIB + 4 * MIB);
    match place_replacement(
        &sched,
        &s,
        &g,
        &g.spec.volumes[1],
        VolumeType::SpdkLVol,
        uuid,
    )
    .unwrap_err()
    {
        GroupScheduleError::NoRoom { detail, .. } => {
            assert!(detail.contains("a replacement of pvc-g-m1"), "{detail}");
            assert!(
                detail.contains("no label topology.kubernetes.io/zone (n4)"),
                "{detail}"
            );
        }
        e => panic!("{e:?}"),
    }
    // A node in zone b (where the lost one was) or a new zone takes it.
    let s = zoned(&[Some("a"), Some("a"), Some("b"), None, Some("b")]);
    let m = place_replacement(
        &sched,
        &s,
        &g,
        &g.spec.volumes[1],
        VolumeType::SpdkLVol,
        uuid,
    )
    .unwrap();
    assert_eq!(m.target_node_name, "n5");
    // No pool with room for the whole copy: no place.
    let s = zoned(&[None, None, None]);
    let g = placed(
        replicated(2, 12 * GIB, false),
        &["n1", "n2"],
        12 * GIB + 4 * MIB,
    );
    assert!(matches!(
        place_replacement(
            &sched,
            &s,
            &g,
            &g.spec.volumes[0],
            VolumeType::SpdkLVol,
            uuid
        ),
        Err(GroupScheduleError::NoRoom { .. })
    ));
}
