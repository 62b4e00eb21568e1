//! Unit tests of the raid checks that need no SPDK: strip and member rules, the shape
//! comparison of an existing raid, which member a raid1 may lose, and the level mapping.
#![allow(clippy::unwrap_used)]

use super::*;

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| s.to_string()).collect()
}

fn info(level: RaidLevel, strip_kb: u32, bases: &[Option<&str>]) -> RaidInfo {
    RaidInfo {
        name: "r".into(),
        uuid: String::new(),
        level,
        state: RaidState::Online,
        strip_kb,
        block_size: 512,
        num_blocks: 0,
        bases: bases
            .iter()
            .map(|b| RaidBase {
                name: b.map(str::to_string),
                uuid: String::new(),
                configured: b.is_some(),
                rebuilding: false,
                failed: false,
                sb_state: None,
                data_offset_blocks: 0,
                data_size_blocks: 0,
            })
            .collect(),
        num_base_bdevs_discovered: 0,
        num_base_bdevs_operational: 0,
        min_base_bdevs_operational: 0,
        superblock: false,
        superblock_seq: None,
        deleting: false,
        process: None,
    }
}

#[test]
fn strip_rules_per_level() {
    for level in [RaidLevel::Concat, RaidLevel::Raid0] {
        for ok in [4, 8, 64, 128, 1 << 20] {
            assert!(check_strip(level, ok).is_ok(), "{level} {ok}");
        }
        for bad in [0, 1, 2, 3, 6, 100, 2 << 20] {
            let e = check_strip(level, bad).unwrap_err();
            assert!(e.to_string().starts_with("strip_size_kb:"), "{e}");
        }
    }
    assert!(check_strip(RaidLevel::Raid1, 0).is_ok());
    let e = check_strip(RaidLevel::Raid1, 64).unwrap_err();
    assert!(e.to_string().contains("raid1 takes no strip size"), "{e}");
}

#[test]
fn base_count_names_and_duplicates() {
    let e = check_bases(RaidLevel::Raid0, &names(&["a"])).unwrap_err();
    assert!(
        e.to_string()
            .contains("base_bdevs: raid0 needs 2-255 base bdevs, got 1"),
        "{e}"
    );
    let many: Vec<String> = (0..256).map(|i| format!("b{i}")).collect();
    assert!(check_bases(RaidLevel::Concat, &many).is_err());
    assert!(check_bases(RaidLevel::Concat, &many[..255]).is_ok());
    let e = check_bases(RaidLevel::Raid1, &names(&["a", "b", "a"])).unwrap_err();
    assert!(e.to_string().contains("a is named twice"), "{e}");
    assert!(check_bases(RaidLevel::Raid1, &names(&["a", ""])).is_err());
    assert!(check_bases(RaidLevel::Raid1, &names(&["a", "x\0"])).is_err());
    assert!(check_bases(RaidLevel::Raid1, &names(&["lvs/vol", "c0n1"])).is_ok());
}

#[test]
fn same_shape_or_the_field_that_differs() {
    let plain = RaidCreateOpts::default();
    let have = info(RaidLevel::Raid0, 64, &[Some("a"), Some("b")]);
    assert_eq!(
        differs(&have, RaidLevel::Raid0, &names(&["a", "b"]), 64, &plain),
        None
    );
    let d = differs(&have, RaidLevel::Concat, &names(&["a", "b"]), 64, &plain).unwrap();
    assert!(d.contains("raid_level raid0 (asked concat)"), "{d}");
    let d = differs(&have, RaidLevel::Raid0, &names(&["a", "b"]), 128, &plain).unwrap();
    assert!(d.contains("strip_size_kb 64 (asked 128)"), "{d}");
    let d = differs(&have, RaidLevel::Raid0, &names(&["a", "c"]), 64, &plain).unwrap();
    assert!(d.contains("base_bdevs [a, b] (asked [a, c])"), "{d}");
    assert!(differs(&have, RaidLevel::Raid0, &names(&["b", "a"]), 64, &plain).is_some());
    assert!(
        differs(
            &have,
            RaidLevel::Raid0,
            &names(&["a", "b", "c"]),
            64,
            &plain
        )
        .is_some()
    );
    // A removed raid1 member matches any name; raid1 has no strip to compare.
    let degraded = info(RaidLevel::Raid1, 0, &[Some("a"), None]);
    assert_eq!(
        differs(&degraded, RaidLevel::Raid1, &names(&["a", "b"]), 0, &plain),
        None
    );
    assert!(degraded.is_degraded());
    assert_eq!(degraded.unconfigured(), Vec::<String>::new());
    // The superblock setting and a UUID asked for are part of the shape.
    let sb = RaidCreateOpts {
        superblock: true,
        uuid: None,
    };
    let d = differs(&have, RaidLevel::Raid0, &names(&["a", "b"]), 64, &sb).unwrap();
    assert!(d.contains("superblock false (asked true)"), "{d}");
    let mut with_sb = info(RaidLevel::Raid1, 0, &[Some("a"), Some("b")]);
    with_sb.superblock = true;
    with_sb.uuid = "0b0f6a53-3a0c-4a8e-9a4a-5d6c7e8f9a01".into();
    let same = RaidCreateOpts {
        superblock: true,
        uuid: Some(uuid::Uuid::from_u128(
            0x0b0f6a53_3a0c_4a8e_9a4a_5d6c7e8f9a01,
        )),
    };
    assert_eq!(
        differs(&with_sb, RaidLevel::Raid1, &names(&["a", "b"]), 0, &same),
        None
    );
    assert_eq!(
        differs(&with_sb, RaidLevel::Raid1, &names(&["a", "b"]), 0, &sb),
        None,
        "no UUID asked: any"
    );
    let other = RaidCreateOpts {
        superblock: true,
        uuid: Some(uuid::Uuid::from_u128(1)),
    };
    let d = differs(&with_sb, RaidLevel::Raid1, &names(&["a", "b"]), 0, &other).unwrap();
    assert!(d.contains("with uuid 0b0f6a53"), "{d}");
}

#[test]
fn only_a_raid1_with_another_whole_member_loses_one() {
    let two = info(RaidLevel::Raid1, 0, &[Some("a"), Some("b")]);
    assert!(check_removable(&two, "b").is_ok());
    let mut one = info(RaidLevel::Raid1, 0, &[Some("a"), None]);
    one.min_base_bdevs_operational = 1;
    let e = check_removable(&one, "a").unwrap_err();
    assert!(
        e.to_string()
            .contains("a is the last whole member of raid1 r"),
        "{e}"
    );
    // A member being rebuilt is not whole: the other one is the last.
    let mut rebuilding = two.clone();
    rebuilding.bases[1].rebuilding = true;
    assert!(check_removable(&rebuilding, "a").is_err());
    assert!(
        check_removable(&rebuilding, "b").is_ok(),
        "the rebuild target can go"
    );
    let stripe = info(RaidLevel::Raid0, 64, &[Some("a"), Some("b")]);
    let e = check_removable(&stripe, "a").unwrap_err();
    assert!(e.to_string().contains("raid0 r cannot lose a"), "{e}");
    let mut configuring = stripe.clone();
    configuring.state = RaidState::Configuring;
    assert!(check_removable(&configuring, "a").is_ok());
}

#[test]
fn levels_map_to_spdk_and_back() {
    for l in [RaidLevel::Concat, RaidLevel::Raid0, RaidLevel::Raid1] {
        assert_eq!(RaidLevel::from_spdk(l.to_spdk()), Some(l));
    }
    assert_eq!(RaidLevel::from_spdk(95), None, "raid5f is not offered");
    assert_eq!(RaidLevel::Concat.to_string(), "concat");
}
