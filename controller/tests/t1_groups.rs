//! T1: multi-disk volumes in the controller against the in-process test API server: a
//! group's members placed, created and mirrored, its data control assigned and its host
//! pushed into every member, an unplaceable group creating nothing until a pool appears,
//! deletion in order with nothing left, a restarted controller creating nothing twice, and a
//! grown group getting members for the difference (or none, with the reason).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use liteio_api::common::{NodeInfo, PoolMode, VolumeStatus};
use liteio_api::datacontrol::{AntstorDataControlSpec, Raid, RaidLevel};
use liteio_api::group::{
    ANNO_MEMBER_RESERVE, AntstorVolumeGroupSpec, EntityIdentity, SymmetryValue, VolumeMeta,
};
use liteio_api::keys::{annotations, finalizers, labels};
use liteio_api::size::{GIB, MIB};
use liteio_api::{AntstorDataControl, AntstorVolume, AntstorVolumeGroup};
use serde_json::json;
use tokio::time::timeout;

use common::*;
use liteio_controller::testing::*;

fn groups(c: &Client) -> Api<AntstorVolumeGroup> {
    Api::namespaced(c.clone(), NS)
}

fn dcs(c: &Client) -> Api<AntstorDataControl> {
    Api::namespaced(c.clone(), NS)
}

fn vols(c: &Client) -> Api<AntstorVolume> {
    Api::namespaced(c.clone(), NS)
}

fn group(name: &str, total: u64, symmetric: bool) -> AntstorVolumeGroup {
    let mut g = AntstorVolumeGroup::new(
        name,
        AntstorVolumeGroupSpec {
            uuid: format!("uuid-{name}"),
            total_size: total as i64,
            ..Default::default()
        },
    );
    g.metadata.namespace = Some(NS.into());
    g.metadata.labels = Some(BTreeMap::from([(
        labels::DATA_CONTROL_NAME.to_string(),
        name.to_string(),
    )]));
    let d = &mut g.spec.desired_volume_spec;
    d.size_symmetry = if symmetric {
        SymmetryValue::Symmetric
    } else {
        SymmetryValue::Asymmetric
    };
    d.size_range.min = Some(Quantity("1Gi".into()));
    d.annotations
        .insert(annotations::VOLUME_TYPE.into(), "SpdkLVol".into());
    g.spec.stragety.allow_empty_node = true;
    g
}

fn data_control(name: &str, engine: PoolMode, raid: RaidLevel, host: &str) -> AntstorDataControl {
    let mut dc = AntstorDataControl::new(
        name,
        AntstorDataControlSpec {
            uuid: format!("dc-uuid-{name}"),
            engine_type: engine,
            raid: Raid { level: raid },
            host_node: NodeInfo {
                id: host.into(),
                ..NodeInfo::default()
            },
            volume_groups: vec![EntityIdentity {
                namespace: NS.into(),
                name: name.into(),
                uuid: format!("uuid-{name}"),
            }],
            ..Default::default()
        },
    );
    dc.metadata.namespace = Some(NS.into());
    dc
}

async fn members(c: &Client, group: &str) -> Vec<AntstorVolume> {
    let lp = ListParams::default().labels(&format!("{}={group}", labels::VOL_GROUP_NAME));
    let mut v = vols(c).list(&lp).await.unwrap().items;
    v.sort_by_key(|v| v.spec.target_node_id.clone());
    v
}

/// Marks every member of `group` ready, as their agents would.
async fn members_ready(c: &Client, group: &str) {
    for m in members(c, group).await {
        vols(c)
            .patch_status(
                &m.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"status": "ready"}})),
            )
            .await
            .unwrap();
    }
}

async fn group_status(c: &Client, name: &str) -> Option<VolumeStatus> {
    groups(c)
        .get(name)
        .await
        .unwrap()
        .status
        .and_then(|s| s.status)
}

#[tokio::test]
async fn a_kernel_lvm_group_is_placed_assembled_on_its_host_and_deleted_in_order() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        for n in ["n1", "n2", "n3"] {
            h.add_pool(pool(n, 20 * GIB)).await;
        }
        let mut g = group("pvc-a", 30 * GIB, true);
        g.metadata.annotations = Some(BTreeMap::from([(
            ANNO_MEMBER_RESERVE.to_string(),
            (4 * MIB).to_string(),
        )]));
        groups(&h.client)
            .create(&PostParams::default(), &g)
            .await
            .unwrap();
        dcs(&h.client)
            .create(
                &PostParams::default(),
                &data_control("pvc-a", PoolMode::KernelLVM, RaidLevel::Raid0, "host-a"),
            )
            .await
            .unwrap();
        // Two equal members (the fewest that fit), on distinct nodes, each with the reserve.
        eventually("two members", || async {
            members(&h.client, "pvc-a").await.len() == 2
        })
        .await;
        let m = members(&h.client, "pvc-a").await;
        let nodes: Vec<&str> = m.iter().map(|v| v.spec.target_node_id.as_str()).collect();
        assert_eq!(nodes, vec!["n1", "n2"]);
        for v in &m {
            assert_eq!(v.spec.size_byte, 15 * GIB + 4 * MIB);
            assert_eq!(v.owner_references()[0].name, "pvc-a");
        }
        let g = groups(&h.client).get("pvc-a").await.unwrap();
        assert_eq!(g.spec.volumes.len(), 2);
        assert!(g.finalizers().iter().any(|f| f == finalizers::VOLUMES));
        // The members are charged to their pools.
        eventually("members bound", || async {
            h.ctx.state().free_bytes("n1") == Some(i128::from(5 * GIB - 4 * MIB))
        })
        .await;
        // Not ready until the members are; the data control waits for the group.
        assert_ne!(
            group_status(&h.client, "pvc-a").await,
            Some(VolumeStatus::Ready)
        );
        members_ready(&h.client, "pvc-a").await;
        eventually("group ready", || async {
            group_status(&h.client, "pvc-a").await == Some(VolumeStatus::Ready)
        })
        .await;
        // Assembled on its host: every member admits it; then ready.
        eventually("data control ready", || async {
            dcs(&h.client)
                .get("pvc-a")
                .await
                .unwrap()
                .status
                .and_then(|s| s.status)
                == Some(VolumeStatus::Ready)
        })
        .await;
        let dc = dcs(&h.client).get("pvc-a").await.unwrap();
        assert_eq!(dc.spec.target_node_id, "host-a");
        assert_eq!(
            dc.labels().get(labels::TARGET_NODE_ID).map(String::as_str),
            Some("host-a")
        );
        for v in members(&h.client, "pvc-a").await {
            assert_eq!(v.spec.host_node.map(|h| h.id).as_deref(), Some("host-a"));
        }
        let st = groups(&h.client)
            .get("pvc-a")
            .await
            .unwrap()
            .status
            .unwrap();
        assert_eq!(st.volume_status.len(), 2);
        // The members join their PV in the controller's metrics.
        let text = h.ctx.metrics.render();
        let info: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("liteio_controller_volume_group_member_info{"))
            .collect();
        assert_eq!(info.len(), 2, "{text}");
        assert!(info.iter().all(|l| l.contains("group=\"pvc-a\"")), "{text}");

        // Deleted: the group waits for its data control, then its members go, then it.
        groups(&h.client)
            .delete("pvc-a", &DeleteParams::default())
            .await
            .unwrap();
        eventually("the group waits for its data control", || async {
            groups(&h.client)
                .get("pvc-a")
                .await
                .unwrap()
                .status
                .is_some_and(|s| s.message.contains("waiting for AntstorDataControl"))
        })
        .await;
        assert_eq!(members(&h.client, "pvc-a").await.len(), 2);
        dcs(&h.client)
            .delete("pvc-a", &DeleteParams::default())
            .await
            .unwrap();
        eventually("members and group gone", || async {
            members(&h.client, "pvc-a").await.is_empty()
                && groups(&h.client).get_opt("pvc-a").await.unwrap().is_none()
        })
        .await;
        eventually("space given back", || async {
            h.ctx.state().free_bytes("n1") == Some(i128::from(20 * GIB))
        })
        .await;
        assert!(
            !h.ctx.metrics.render().contains("volume_group_member_info{"),
            "member series outlive the group"
        );
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn an_unplaceable_group_creates_nothing_until_a_pool_appears() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("n1", 10 * GIB)).await;
        groups(&h.client)
            .create(&PostParams::default(), &group("pvc-b", 25 * GIB, false))
            .await
            .unwrap();
        eventually("the reason on the group", || async {
            groups(&h.client)
                .get("pvc-b")
                .await
                .unwrap()
                .status
                .is_some_and(|s| s.message.starts_with("NoStoragePoolAvailable"))
        })
        .await;
        assert!(
            members(&h.client, "pvc-b").await.is_empty(),
            "all or nothing"
        );
        assert!(
            groups(&h.client)
                .get("pvc-b")
                .await
                .unwrap()
                .spec
                .volumes
                .is_empty()
        );
        assert_eq!(h.ctx.state().free_bytes("n1"), Some(i128::from(10 * GIB)));
        // Room appears: placed without anything else changing.
        h.add_pool(pool("n2", 10 * GIB)).await;
        h.add_pool(pool("n3", 10 * GIB)).await;
        eventually("three members", || async {
            members(&h.client, "pvc-b").await.len() == 3
        })
        .await;
        let sizes: Vec<u64> = members(&h.client, "pvc-b")
            .await
            .iter()
            .map(|v| v.spec.size_byte)
            .collect();
        assert_eq!(sizes.iter().sum::<u64>(), 25 * GIB, "{sizes:?}");
        eventually("the message cleared", || async {
            groups(&h.client)
                .get("pvc-b")
                .await
                .unwrap()
                .status
                .is_some_and(|s| s.message.is_empty())
        })
        .await;
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_restarted_controller_creates_recorded_members_once() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        for n in ["n1", "n2"] {
            h.add_pool(pool(n, 20 * GIB)).await;
        }
        // As a controller leaves it when it stops between recording the members and
        // creating them.
        let mut g = group("pvc-c", 8 * GIB, true);
        g.metadata.finalizers = Some(vec![finalizers::VOLUMES.into()]);
        g.spec.volumes = ["n1", "n2"]
            .iter()
            .enumerate()
            .map(|(i, n)| VolumeMeta {
                vol_id: EntityIdentity {
                    namespace: NS.into(),
                    name: format!("pvc-c-m{i}"),
                    uuid: format!("uuid-pvc-c-m{i}"),
                },
                target_node_name: n.to_string(),
                size: (4 * GIB) as i64,
            })
            .collect();
        groups(&h.client)
            .create(&PostParams::default(), &g)
            .await
            .unwrap();
        eventually("the recorded members", || async {
            members(&h.client, "pvc-c").await.len() == 2
        })
        .await;
        let names: Vec<String> = members(&h.client, "pvc-c")
            .await
            .iter()
            .map(|v| v.name_any())
            .collect();
        assert_eq!(names, vec!["pvc-c-m0", "pvc-c-m1"]);
        // Another controller takes over: the same two members, nothing more.
        let client = h.client.clone();
        h.stop.send_replace(true);
        timeout(LIMIT, h.task).await.unwrap().unwrap().unwrap();
        let (stop, task, ctx) = another_controller(&client, "t1-b").await;
        members_ready(&h.client, "pvc-c").await;
        eventually("group ready under the new controller", || async {
            group_status(&h.client, "pvc-c").await == Some(VolumeStatus::Ready)
        })
        .await;
        let after: Vec<String> = members(&h.client, "pvc-c")
            .await
            .iter()
            .map(|v| v.name_any())
            .collect();
        assert_eq!(after, names);
        assert_eq!(
            groups(&h.client)
                .get("pvc-c")
                .await
                .unwrap()
                .spec
                .volumes
                .len(),
            2
        );
        assert_eq!(ctx.state().free_bytes("n1"), Some(i128::from(16 * GIB)));
        stop.send_replace(true);
        timeout(LIMIT, task).await.unwrap().unwrap().unwrap();
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn an_spdk_data_control_runs_on_its_largest_members_node_and_bad_levels_are_refused() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("n1", 10 * GIB)).await;
        h.add_pool(pool("n2", 20 * GIB)).await;
        groups(&h.client)
            .create(&PostParams::default(), &group("pvc-d", 25 * GIB, false))
            .await
            .unwrap();
        dcs(&h.client)
            .create(
                &PostParams::default(),
                &data_control("pvc-d", PoolMode::SpdkLVStore, RaidLevel::Linear, "host-d"),
            )
            .await
            .unwrap();
        eventually("two members", || async {
            members(&h.client, "pvc-d").await.len() == 2
        })
        .await;
        members_ready(&h.client, "pvc-d").await;
        eventually("assigned to n2, its members admit n2", || async {
            let dc = dcs(&h.client).get("pvc-d").await.unwrap();
            let m = members(&h.client, "pvc-d").await;
            dc.spec.target_node_id == "n2"
                && m.iter()
                    .all(|v| v.spec.host_node.as_ref().is_some_and(|h| h.id == "n2"))
        })
        .await;
        // The agent reports the export: the controller leaves the status to it.
        assert_ne!(
            dcs(&h.client)
                .get("pvc-d")
                .await
                .unwrap()
                .status
                .and_then(|s| s.status),
            Some(VolumeStatus::Ready)
        );
        // raid1 and raid0 over an Asymmetric group: refused with a message naming the field.
        for (name, raid, want) in [
            ("pvc-e", RaidLevel::Raid1, "raid1"),
            ("pvc-f", RaidLevel::Raid0, "not Symmetric"),
            ("pvc-g", RaidLevel::Raid5, "raid5 is not supported"),
        ] {
            groups(&h.client)
                .create(&PostParams::default(), &group(name, GIB, false))
                .await
                .unwrap();
            dcs(&h.client)
                .create(
                    &PostParams::default(),
                    &data_control(name, PoolMode::SpdkLVStore, raid, "host-d"),
                )
                .await
                .unwrap();
            eventually(want, || async {
                dcs(&h.client)
                    .get(name)
                    .await
                    .unwrap()
                    .status
                    .is_some_and(|s| {
                        s.message.contains("spec.raid.level") && s.message.contains(want)
                    })
            })
            .await;
        }
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_grown_group_gets_members_for_the_difference_or_none() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        for n in ["n1", "n2", "n3", "n4"] {
            h.add_pool(pool(n, 10 * GIB)).await;
        }
        let mut g = group("pvc-g", 8 * GIB, true);
        g.spec.desired_volume_spec.desired_count = 2;
        groups(&h.client)
            .create(&PostParams::default(), &g)
            .await
            .unwrap();
        eventually("two members", || async {
            members(&h.client, "pvc-g").await.len() == 2
        })
        .await;
        members_ready(&h.client, "pvc-g").await;
        eventually("the group ready", || async {
            group_status(&h.client, "pvc-g").await == Some(VolumeStatus::Ready)
        })
        .await;
        let first: Vec<String> = members(&h.client, "pvc-g")
            .await
            .iter()
            .map(|v| v.spec.target_node_id.clone())
            .collect();
        // Grown by half a share: one more member of the same share, on a node holding none.
        let grow = |total: u64| Patch::Merge(json!({"spec": {"totalSize": total}}));
        groups(&h.client)
            .patch("pvc-g", &PatchParams::default(), &grow(10 * GIB))
            .await
            .unwrap();
        eventually("a third member", || async {
            members(&h.client, "pvc-g").await.len() == 3
        })
        .await;
        let all = members(&h.client, "pvc-g").await;
        assert!(
            all.iter().all(|v| v.spec.size_byte == 4 * GIB),
            "{:?}",
            all.iter().map(|v| v.spec.size_byte).collect::<Vec<_>>()
        );
        let third: Vec<&AntstorVolume> = all
            .iter()
            .filter(|v| !first.contains(&v.spec.target_node_id))
            .collect();
        assert_eq!(third.len(), 1, "the new member is on a node of its own");
        let g = groups(&h.client).get("pvc-g").await.unwrap();
        assert!(g.fully_placed() && g.spec.volumes.len() == 3);
        // Not ready until the new member is; then ready again.
        eventually("the group waits for its new member", || async {
            group_status(&h.client, "pvc-g").await == Some(VolumeStatus::Creating)
        })
        .await;
        members_ready(&h.client, "pvc-g").await;
        eventually("the group ready again", || async {
            group_status(&h.client, "pvc-g").await == Some(VolumeStatus::Ready)
        })
        .await;
        // Beyond what the nodes without a member hold (one node of 10 GiB left, 8 GiB more
        // need two members of 4 GiB): nothing placed, the reason on the group.
        groups(&h.client)
            .patch("pvc-g", &PatchParams::default(), &grow(18 * GIB))
            .await
            .unwrap();
        eventually("the reason on the group", || async {
            groups(&h.client)
                .get("pvc-g")
                .await
                .unwrap()
                .status
                .is_some_and(|s| s.message.starts_with("NoStoragePoolAvailable"))
        })
        .await;
        assert_eq!(members(&h.client, "pvc-g").await.len(), 3, "all or nothing");
        // Set back (what the CSI controller does): placed again, the message cleared.
        groups(&h.client)
            .patch("pvc-g", &PatchParams::default(), &grow(10 * GIB))
            .await
            .unwrap();
        eventually("the message cleared", || async {
            groups(&h.client)
                .get("pvc-g")
                .await
                .unwrap()
                .status
                .is_some_and(|s| s.message.is_empty())
        })
        .await;
        assert_eq!(members(&h.client, "pvc-g").await.len(), 3);
        h.stop().await;
    })
    .await
    .unwrap();
}
