//! T0: pure logic of the control loop: pool spec/status, node facts, orphans, volume
//! predicates, heartbeat timings, host NQN file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus};
use liteio_agent::config::{Config, NodeInfoKeys};
use liteio_agent::engine::{EngineError, EngineKind, PoolInfo, VolumeInfo};
use liteio_agent::exporter::ExporterHealth;
use liteio_agent::heartbeat::HeartbeatOptions;
use liteio_agent::pool::{desired_status, load_host_nqn, node_facts, pool_spec};
use liteio_agent::recovery::find_orphans;
use liteio_agent::sync::names::volume_engine_name as engine_name;
use liteio_agent::sync::volume::{needs_expansion, needs_export};
use liteio_api::keys::{annotations, labels};
use liteio_api::pool::{ConditionStatus, PoolCondition, PoolConditionType, PoolStatus};
use liteio_api::{AntstorVolume, AntstorVolumeSpec, KernelLvol, NodeInfo, StoragePoolStatus, size};

fn pool_info() -> PoolInfo {
    PoolInfo {
        name: "dev-pool".into(),
        uuid: "u-1".into(),
        total_bytes: 1 << 30,
        free_bytes: 1 << 29,
        allocation_unit: 4 << 20,
        pv_count: 0,
        reserved: Vec::new(),
    }
}

fn vinfo(name: &str, snap_of: Option<&str>) -> VolumeInfo {
    VolumeInfo {
        name: name.into(),
        uuid: None,
        size_bytes: 4 << 20,
        allocated_bytes: 4 << 20,
        path: PathBuf::from(format!("/p/{name}")),
        snapshot_of: snap_of.map(str::to_string),
        layout: None,
        thin: false,
    }
}

#[test]
fn file_and_lvm_pools_are_kernel_lvm_spdk_is_lvstore() {
    let cfg = Config::file_pool("dev-pool", "/p");
    let s = pool_spec(
        EngineKind::File,
        &pool_info(),
        &cfg,
        NodeInfo::default(),
        Vec::new(),
    );
    assert_eq!(s.kernel_lvm.name, "dev-pool");
    assert_eq!(s.kernel_lvm.vg_uuid, "u-1");
    assert_eq!(s.kernel_lvm.extend_count, 256);
    assert!(s.spdk_lv_store.name.is_empty());
    let s = pool_spec(
        EngineKind::SpdkLvs,
        &pool_info(),
        &cfg,
        NodeInfo::default(),
        Vec::new(),
    );
    assert_eq!(s.spdk_lv_store.name, "dev-pool");
    assert_eq!(s.spdk_lv_store.cluster_size, 4 << 20);
    assert_eq!(s.spdk_lv_store.total_data_clusters, 256);
    assert!(s.kernel_lvm.name.is_empty());
}

#[test]
fn node_facts_prefer_labels_then_addresses() {
    let mut node = Node::default();
    node.metadata.labels = Some(BTreeMap::from([(
        labels::KUBE_HOSTNAME.to_string(),
        "h".to_string(),
    )]));
    node.status = Some(NodeStatus {
        addresses: Some(vec![NodeAddress {
            type_: "InternalIP".into(),
            address: "10.1.1.1".into(),
        }]),
        ..NodeStatus::default()
    });
    let (info, addrs) = node_facts("n", Some(&node), &NodeInfoKeys::default(), None);
    assert_eq!(
        (info.ip.as_str(), info.hostname.as_str()),
        ("10.1.1.1", "h")
    );
    assert_eq!(addrs[0].address, "10.1.1.1");
    let (info, addrs) = node_facts("n", None, &NodeInfoKeys::default(), None);
    assert_eq!(info.hostname, "n");
    assert!(addrs.is_empty());
    let cfg = NodeInfo {
        ip: "1.2.3.4".into(),
        ..NodeInfo::default()
    };
    let (info, _) = node_facts("n", Some(&node), &NodeInfoKeys::default(), Some(&cfg));
    assert_eq!(info.ip, "1.2.3.4");
}

#[test]
fn status_keeps_the_controllers_kube_node_and_state() {
    let current = StoragePoolStatus {
        status: Some(PoolStatus::Locked),
        conditions: vec![PoolCondition {
            type_: PoolConditionType::KubeNode,
            status: ConditionStatus::Error,
            message: "NC_OFFLINE".into(),
        }],
        ..StoragePoolStatus::default()
    };
    let info = pool_info();
    let st = desired_status(
        Some(&current),
        EngineKind::File,
        Ok(&info),
        &ExporterHealth::Absent,
        true,
    );
    assert_eq!(st.status, Some(PoolStatus::Locked));
    assert_eq!(st.vg_free_size, Some(size::quantity(1 << 29)));
    let kube = st
        .conditions
        .iter()
        .find(|c| c.type_ == PoolConditionType::KubeNode)
        .unwrap();
    assert_eq!(kube.message, "NC_OFFLINE");
    // Same inputs again: nothing to write.
    let again = desired_status(
        Some(&st),
        EngineKind::File,
        Ok(&info),
        &ExporterHealth::Absent,
        true,
    );
    assert_eq!(again, st);

    let err = EngineError::PvLost {
        vg: "vg".into(),
        stderr: "Couldn't find device".into(),
    };
    let st = desired_status(
        None,
        EngineKind::KernelLvm,
        Err(&err),
        &ExporterHealth::Ok {
            version: "v1".into(),
        },
        false,
    );
    let c = |t| st.conditions.iter().find(|c| c.type_ == t).unwrap().clone();
    assert_eq!(c(PoolConditionType::Spdk).status, ConditionStatus::Ok);
    assert_eq!(c(PoolConditionType::Lvm).status, ConditionStatus::Error);
    assert!(
        c(PoolConditionType::Lvm)
            .message
            .contains("lost a physical volume")
    );
    assert_eq!(
        c(PoolConditionType::KubeNode).status,
        ConditionStatus::Error
    );
    assert_eq!(st.status, Some(PoolStatus::Ready));

    let st = desired_status(
        None,
        EngineKind::SpdkLvs,
        Ok(&info),
        &ExporterHealth::Error {
            message: "down".into(),
        },
        true,
    );
    assert!(
        st.conditions
            .iter()
            .all(|c| c.type_ != PoolConditionType::Lvm)
    );
    assert_eq!(st.conditions[0].message, "down");
}

#[test]
fn orphans_are_names_nobody_owns() {
    let engine = vec![
        vinfo("pvc-1", None),
        vinfo("pvc-2", None),
        vinfo("pvc-1_snap", Some("pvc-1")),
        vinfo("x_snap", Some("pvc-2")),
    ];
    let vols: HashSet<String> = ["pvc-1".to_string()].into();
    let snaps: HashSet<String> = ["pvc-1_snap".to_string()].into();
    let o = find_orphans(&engine, &vols, &snaps);
    let names: Vec<_> = o.iter().map(|o| (o.name.as_str(), o.snapshot)).collect();
    assert_eq!(names, vec![("pvc-2", false), ("x_snap", true)]);
}

fn vol() -> AntstorVolume {
    AntstorVolume::new(
        "pvc-1",
        AntstorVolumeSpec {
            target_node_id: "n1".into(),
            size_byte: 8 << 20,
            ..Default::default()
        },
    )
}

#[test]
fn volume_predicates() {
    let mut v = vol();
    assert_eq!(engine_name(&v), "pvc-1");
    v.spec.kernel_lvol = Some(KernelLvol {
        name: "lv-x".into(),
        dev_path: String::new(),
    });
    assert_eq!(engine_name(&v), "lv-x");

    assert!(!needs_export(&v, EngineKind::File), "no consumer known");
    assert!(
        needs_export(&v, EngineKind::SpdkLvs),
        "SPDK lvols are always exported"
    );
    v.spec.host_node = Some(NodeInfo {
        id: "n1".into(),
        ..NodeInfo::default()
    });
    assert!(!needs_export(&v, EngineKind::KernelLvm), "local");
    v.spec.host_node = Some(NodeInfo {
        id: "n2".into(),
        ..NodeInfo::default()
    });
    assert!(needs_export(&v, EngineKind::KernelLvm), "remote");

    assert!(!needs_expansion(&v));
    v.metadata.annotations = Some(BTreeMap::from([(
        annotations::ALLOCATED_BYTES.to_string(),
        (4u64 << 20).to_string(),
    )]));
    assert!(needs_expansion(&v), "spec grew past the allocated size");
    v.metadata.annotations = None;
    v.metadata.labels = Some(BTreeMap::from([(
        labels::EXPANSION_ORIGINAL_SIZE.to_string(),
        "1".to_string(),
    )]));
    assert!(needs_expansion(&v));
}

#[test]
fn heartbeat_timings_scale_with_the_interval() {
    let o = HeartbeatOptions::with_interval(Duration::from_secs(20), Duration::from_secs(40));
    assert_eq!(o.request_timeout, Duration::from_secs(10));
    assert_eq!(o.retry_min, Duration::from_secs(1));
    assert_eq!(o.retry_max, Duration::from_secs(20));
    let o = HeartbeatOptions::with_interval(Duration::from_millis(100), Duration::from_secs(1));
    assert_eq!(o.request_timeout, Duration::from_millis(100));
    assert_eq!(o.retry_min, Duration::from_millis(10));
}

#[test]
fn host_nqn_is_read_or_generated() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("nvme/hostnqn");
    assert_eq!(
        load_host_nqn(&p, "node-9").unwrap(),
        "nqn.2021-03.com.alipay.host:uuid:node-9"
    );
    assert_eq!(
        std::fs::read_to_string(&p).unwrap().trim(),
        "nqn.2021-03.com.alipay.host:uuid:node-9"
    );
    std::fs::write(&p, "nqn.custom\n").unwrap();
    assert_eq!(load_host_nqn(&p, "node-9").unwrap(), "nqn.custom");
    // Not an NQN: refused, not overwritten (the node would change identity for targets).
    std::fs::write(&p, "garbage\n").unwrap();
    assert!(load_host_nqn(&p, "node-9").is_err());
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "garbage\n");
}

#[test]
fn recovery_config_parses_and_defaults_to_never_delete() {
    let c =
        Config::from_yaml("storage: {pooling: {name: p, mode: File}, file: {path: /p}}").unwrap();
    assert!(!c.recovery.collect_orphans);
    assert_eq!(c.recovery.orphan_grace_period, Duration::from_secs(3600));
    let c = Config::from_yaml(
        "storage: {pooling: {name: p, mode: File}, file: {path: /p}}\nrecovery: {collectOrphans: true, orphanGracePeriod: 10m}",
    )
    .unwrap();
    assert!(c.recovery.collect_orphans);
    assert_eq!(c.recovery.orphan_grace_period, Duration::from_secs(600));
}
