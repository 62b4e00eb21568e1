//! T0: LiteIO-shaped objects deserialize and serialize back unchanged; invalid objects are
//! rejected with messages that name the field.

use liteio_api::validate::{self, ValidationErrors};
use liteio_api::{
    AntstorDataControl, AntstorSnapshot, AntstorVolume, AntstorVolumeGroup, StoragePool,
    VolumeMigration, VolumePosition, VolumeType,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Parse `name` as T, serialize it again, and compare with the document as written.
fn roundtrip<T: DeserializeOwned + Serialize>(name: &str) -> T {
    let text = fixture(name);
    let original: Value = serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    let typed: T = serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    let again = serde_json::to_value(&typed).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(again, original, "{name} changed on round-trip");
    typed
}

#[test]
fn storage_pools_roundtrip() {
    let spdk: StoragePool = roundtrip("storagepool-spdk.yaml");
    assert_eq!(spdk.mode(), Some(liteio_api::PoolMode::SpdkLVStore));
    assert_eq!(spdk.total_bytes(), 1_069_547_520);
    assert_eq!(spdk.reported_free_bytes(), 964_689_920);
    assert!(spdk.is_schedulable());
    assert_eq!(
        spdk.host_nqn(),
        Some("nqn.2021-03.com.alipay.host:uuid:node-1")
    );
    validate::pool(&spdk).unwrap_or_else(|e| panic!("{e}"));

    let lvm: StoragePool = roundtrip("storagepool-lvm.yaml");
    assert_eq!(lvm.mode(), Some(liteio_api::PoolMode::KernelLVM));
    assert_eq!(lvm.available_bytes(), 1_069_547_520 - 104_857_600);
    assert!(!lvm.is_schedulable(), "offline and locked");
}

#[test]
fn volumes_roundtrip() {
    let v: AntstorVolume = roundtrip("antstorvolume.yaml");
    assert_eq!(v.spec.type_, Some(VolumeType::SpdkLVol));
    assert_eq!(v.spec.position_advice, VolumePosition::PreferLocal);
    assert_eq!(v.total_size(), 104_857_600);
    assert!(!v.is_local());
    assert_eq!(v.target_node(), Some("node-1"));
    validate::volume(&v).unwrap_or_else(|e| panic!("{e}"));

    let u: AntstorVolume = roundtrip("antstorvolume-unscheduled.yaml");
    assert_eq!(u.target_node(), None);
    assert_eq!(u.spec.position_advice, VolumePosition::MustLocal);
}

#[test]
fn other_kinds_roundtrip() {
    let s: AntstorSnapshot = roundtrip("antstorsnapshot.yaml");
    validate::snapshot(&s).unwrap_or_else(|e| panic!("{e}"));
    let _: VolumeMigration = roundtrip("volumemigration.yaml");
    let g: AntstorVolumeGroup = roundtrip("antstorvolumegroup.yaml");
    validate::volume_group(&g).unwrap_or_else(|e| panic!("{e}"));
    let dc: AntstorDataControl = roundtrip("antstordatacontrol.yaml");
    assert!(!dc.is_replicated());
    assert!(
        dc.status.as_ref().is_some_and(|s| s.health.is_none()
            && s.replicas.is_empty()
            && s.conditions.is_empty())
    );
}

#[test]
fn a_replicated_data_control_roundtrips_with_its_replicas() {
    use liteio_api::replica::{self, ConditionState, ReplicaHealth, ReplicaState};
    let dc: AntstorDataControl = roundtrip("antstordatacontrol-raid1.yaml");
    assert!(dc.is_replicated());
    let st = dc.status.unwrap_or_else(|| panic!("no status"));
    assert_eq!(st.health, Some(ReplicaHealth::Rebuilding));
    assert_eq!(st.replicas.len(), 2);
    assert_eq!(st.replicas[0].state, ReplicaState::Online);
    assert_eq!(st.replicas[1].state, ReplicaState::Rebuilding);
    assert_eq!(st.replicas[1].rebuild_percent, Some(42));
    assert_eq!(st.replicas[1].rebuilt_bytes, Some(4_509_715_660));
    let c = replica::condition(&st.conditions, replica::CONDITION_DEGRADED)
        .unwrap_or_else(|| panic!("no Degraded condition"));
    assert_eq!(c.status, ConditionState::True);
    assert_eq!(c.reason, "Rebuilding");
    // A state the API does not know is refused, naming it.
    let text =
        fixture("antstordatacontrol-raid1.yaml").replace("state: rebuilding", "state: syncing");
    let e = parse_err::<AntstorDataControl>(&text);
    assert!(e.contains("syncing"), "{e}");
}

#[test]
fn a_spread_key_that_is_no_label_key_is_refused() {
    let mut g: AntstorVolumeGroup = roundtrip("antstorvolumegroup.yaml");
    g.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            liteio_api::replica::ANNO_SPREAD_KEY.into(),
            "topology.kubernetes.io/zone".into(),
        );
    validate::volume_group(&g).unwrap_or_else(|e| panic!("{e}"));
    g.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            liteio_api::replica::ANNO_SPREAD_KEY.into(),
            "no such key/".into(),
        );
    let e = invalid(validate::volume_group(&g));
    assert!(
        e.mentions("metadata.annotations[liteio.io/spread-key]"),
        "{e}"
    );
}

fn parse_err<T: DeserializeOwned + std::fmt::Debug>(text: &str) -> String {
    match serde_yaml::from_str::<T>(text) {
        Ok(v) => panic!("accepted invalid object: {v:?}"),
        Err(e) => e.to_string(),
    }
}

const VOLUME_HEAD: &str =
    "apiVersion: volume.antstor.alipay.com/v1\nkind: AntstorVolume\nmetadata:\n  name: v\n";

#[test]
fn unknown_enum_values_name_the_field() {
    let e = parse_err::<AntstorVolume>(&format!(
        "{VOLUME_HEAD}spec:\n  uuid: u\n  sizeByte: 1\n  positionAdvice: Sideways\n"
    ));
    assert!(e.contains("spec.positionAdvice"), "{e}");
    assert!(e.contains("Sideways"), "{e}");
    let e = parse_err::<AntstorVolume>(&format!(
        "{VOLUME_HEAD}spec:\n  uuid: u\n  sizeByte: 1\n  type: Ceph\n"
    ));
    assert!(e.contains("spec.type"), "{e}");
    let e = parse_err::<AntstorVolume>(&format!("{VOLUME_HEAD}spec:\n  uuid: u\n  sizeByte: -5\n"));
    assert!(e.contains("spec.sizeByte"), "{e}");
    let e = parse_err::<StoragePool>(
        "apiVersion: volume.antstor.alipay.com/v1\nkind: StoragePool\nmetadata:\n  name: p\nspec: {}\nstatus:\n  status: broken\n",
    );
    assert!(e.contains("status.status"), "{e}");
}

fn invalid(e: Result<(), ValidationErrors>) -> ValidationErrors {
    match e {
        Ok(()) => panic!("invalid object passed validation"),
        Err(e) => e,
    }
}

#[test]
fn validation_names_the_field() {
    let mut v: AntstorVolume = roundtrip("antstorvolume.yaml");
    v.spec.uuid.clear();
    v.spec.size_byte = 1024;
    v.metadata
        .annotations
        .get_or_insert_default()
        .insert("obnvmf/lv-layout".into(), "thin,pool".into());
    let e = invalid(validate::volume(&v));
    assert!(e.mentions("spec.uuid"), "{e}");
    assert!(e.mentions("spec.sizeByte"), "{e}");
    assert!(e.mentions("metadata.annotations[obnvmf/lv-layout]"), "{e}");
    assert!(
        e.to_string()
            .contains("spec.sizeByte: 1024 bytes is below the minimum of 4.0 MiB"),
        "{e}"
    );

    let mut s: AntstorSnapshot = roundtrip("antstorsnapshot.yaml");
    s.spec.size = -1;
    s.spec.origin_vol_name.clear();
    let e = invalid(validate::snapshot(&s));
    assert!(
        e.mentions("spec.size") && e.mentions("spec.originVolName"),
        "{e}"
    );

    let mut p: StoragePool = roundtrip("storagepool-spdk.yaml");
    p.spec.kernel_lvm.name = "vg".into();
    p.spec.node_info.id = "other".into();
    let e = invalid(validate::pool(&p));
    assert!(e.mentions("spec") && e.mentions("spec.nodeInfo.id"), "{e}");

    let mut g: AntstorVolumeGroup = roundtrip("antstorvolumegroup.yaml");
    g.spec.desired_volume_spec.count_range.min = 5;
    g.spec.desired_volume_spec.desired_count = 2;
    g.spec.desired_volume_spec.size_symmetry = liteio_api::group::SymmetryValue::Asymmetric;
    let e = invalid(validate::volume_group(&g));
    assert!(e.mentions("spec.desiredVolumeSpec.countRange"), "{e}");
    assert!(e.mentions("spec.desiredVolumeSpec.desiredCount"), "{e}");
    // Symmetric without a count is valid (LiteIO refused every such group).
    let mut g: AntstorVolumeGroup = roundtrip("antstorvolumegroup.yaml");
    g.spec.desired_volume_spec.size_symmetry = liteio_api::group::SymmetryValue::Symmetric;
    g.spec.desired_volume_spec.desired_count = 0;
    validate::volume_group(&g).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn enum_parsing_lists_allowed_values() {
    let e = match "Nearby".parse::<VolumePosition>() {
        Ok(v) => panic!("parsed {v:?}"),
        Err(e) => e,
    };
    assert_eq!(e.field, "positionAdvice");
    assert!(
        e.reason.contains("\"MustLocal\"") && e.reason.contains("\"PreferRemote\""),
        "{e}"
    );
    assert_eq!(
        "MustRemote".parse::<VolumePosition>().ok(),
        Some(VolumePosition::MustRemote)
    );
    assert_eq!(
        "".parse::<VolumePosition>().ok(),
        Some(VolumePosition::NoPreference)
    );
}
