//! T1: replicated volumes (raid1 data controls) in the controller against the in-process
//! test API server: replicas on distinct nodes; a replica whose node's pool goes down
//! replaced on the third node (intent first, same position in `spec.volumes`), the old one
//! deleted only after the data control stops listing it; health, condition, events and
//! metrics; the assembly moved off a lost node with the members fenced first; a controller
//! restarted in the middle of a replacement creating one replacement only. The assembling
//! disk-agent is played by the test: it writes the data control's status.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::SignedDuration;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use liteio_api::common::{NodeInfo, PoolMode, VolumeStatus};
use liteio_api::datacontrol::{AntstorDataControlSpec, Raid, RaidLevel};
use liteio_api::group::{
    ANNO_MEMBER_RESERVE, AntstorVolumeGroupSpec, EntityIdentity, SymmetryValue,
};
use liteio_api::keys::{annotations, labels};
use liteio_api::pool::PoolStatus;
use liteio_api::replica::{
    ANNO_ASSEMBLY_MOVING_TO, ANNO_REPLACED, ANNO_REPLACING, CONDITION_DEGRADED, ConditionState,
    ReplicaHealth,
};
use liteio_api::size::{GIB, MIB};
use liteio_api::{AntstorDataControl, AntstorVolume, AntstorVolumeGroup};
use liteio_controller::clock::Clock;
use liteio_test_apiserver::faults::{Matcher, Verb};
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

/// A replicated volume's group and data control as the CSI controller makes them: `n`
/// whole copies of 1 GiB with the superblock reserve, SpdkLVStore raid1.
fn replicated(name: &str, n: i64) -> (AntstorVolumeGroup, AntstorDataControl) {
    let mut g = AntstorVolumeGroup::new(
        name,
        AntstorVolumeGroupSpec {
            uuid: format!("uuid-{name}"),
            total_size: n * GIB as i64,
            ..Default::default()
        },
    );
    g.metadata.namespace = Some(NS.into());
    g.metadata.labels = Some(BTreeMap::from([
        (labels::DATA_CONTROL_NAME.to_string(), name.to_string()),
        (labels::PV_NAME.to_string(), name.to_string()),
    ]));
    g.metadata.annotations = Some(BTreeMap::from([(
        ANNO_MEMBER_RESERVE.to_string(),
        (4 * MIB).to_string(),
    )]));
    let d = &mut g.spec.desired_volume_spec;
    d.size_symmetry = SymmetryValue::Symmetric;
    d.desired_count = n;
    d.count_range.min = n;
    d.count_range.max = n;
    d.size_range.min = Some(Quantity(GIB.to_string()));
    d.size_range.max = Some(Quantity(GIB.to_string()));
    d.annotations
        .insert(annotations::VOLUME_TYPE.into(), "SpdkLVol".into());
    g.spec.stragety.allow_empty_node = true;
    let mut dc = AntstorDataControl::new(
        name,
        AntstorDataControlSpec {
            uuid: format!("dc-uuid-{name}"),
            total_size: GIB as i64,
            engine_type: PoolMode::SpdkLVStore,
            raid: Raid {
                level: RaidLevel::Raid1,
            },
            host_node: NodeInfo {
                id: "host-a".into(),
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
    dc.metadata.labels = Some(BTreeMap::from([(
        labels::PV_NAME.to_string(),
        name.to_string(),
    )]));
    (g, dc)
}

/// Every AntstorVolume labelled as a member of `group` (also replaced ones), by name.
async fn all_members(c: &Client, group: &str) -> Vec<AntstorVolume> {
    let lp = ListParams::default().labels(&format!("{}={group}", labels::VOL_GROUP_NAME));
    let mut v = vols(c).list(&lp).await.unwrap().items;
    v.sort_by_key(|v| v.name_any());
    v
}

async fn group(c: &Client, name: &str) -> AntstorVolumeGroup {
    groups(c).get(name).await.unwrap()
}

async fn dc(c: &Client, name: &str) -> AntstorDataControl {
    dcs(c).get(name).await.unwrap()
}

async fn mark_ready(c: &Client, names: &[String]) {
    for n in names {
        vols(c)
            .patch_status(
                n,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"status": "ready"}})),
            )
            .await
            .unwrap();
    }
}

/// What the assembling agent reports: ready, an export, and `replicas` as
/// `(member, node, state, rebuiltBytes)`.
async fn agent_reports(c: &Client, name: &str, replicas: &[(&str, &str, &str, Option<u64>)]) {
    let reps: Vec<serde_json::Value> = replicas
        .iter()
        .map(|(v, n, s, b)| json!({"volume": v, "node": n, "state": s, "rebuiltBytes": b}))
        .collect();
    dcs(c)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "status": "ready",
                "spdkTarget": {"address": "127.0.0.1", "svcID": "4420"},
                "replicas": reps,
            }})),
        )
        .await
        .unwrap();
}

/// Creates the volume, waits for its members on distinct nodes, marks them ready, waits for
/// the assembly's node and plays the agent reporting every replica online. Returns the
/// member names in `spec.volumes` order.
async fn healthy_volume(h: &Harness, name: &str, n: i64) -> Vec<(String, String)> {
    let (g, d) = replicated(name, n);
    groups(&h.client)
        .create(&PostParams::default(), &g)
        .await
        .unwrap();
    dcs(&h.client)
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
    eventually("the replicas placed", || async {
        group(&h.client, name).await.spec.volumes.len() == n as usize
            && all_members(&h.client, name).await.len() == n as usize
    })
    .await;
    let placed: Vec<(String, String)> = group(&h.client, name)
        .await
        .spec
        .volumes
        .iter()
        .map(|m| (m.vol_id.name.clone(), m.target_node_name.clone()))
        .collect();
    mark_ready(
        &h.client,
        &placed.iter().map(|(v, _)| v.clone()).collect::<Vec<_>>(),
    )
    .await;
    eventually("assembled on the first member's node", || async {
        let d = dc(&h.client, name).await;
        let m = all_members(&h.client, name).await;
        d.spec.target_node_id == placed[0].1
            && m.iter().all(|v| {
                v.spec
                    .host_node
                    .as_ref()
                    .is_some_and(|x| x.id == placed[0].1)
            })
    })
    .await;
    let reps: Vec<(&str, &str, &str, Option<u64>)> = placed
        .iter()
        .map(|(v, node)| (v.as_str(), node.as_str(), "online", None))
        .collect();
    agent_reports(&h.client, name, &reps).await;
    eventually("healthy", || async {
        dc(&h.client, name)
            .await
            .status
            .is_some_and(|s| s.health == Some(ReplicaHealth::Healthy))
    })
    .await;
    placed
}

/// Makes the pool of `down` unknown (its Lease silent for 4 min) while the others stay live.
async fn lose_node(h: &Harness, down: &str, others: &[&str]) {
    let later = h.clock.now() + SignedDuration::from_secs(4 * 60);
    for n in others {
        h.renew(n, later).await;
    }
    h.clock.advance(Duration::from_secs(4 * 60));
    eventually(&format!("pool {down} down"), || async {
        h.pool_status(down).await == Some(PoolStatus::Unknown)
    })
    .await;
    for n in others {
        assert_eq!(h.pool_status(n).await, Some(PoolStatus::Ready), "{n}");
    }
}

/// `(type, note)` of the events with `reason` about the data control `name`.
async fn events(h: &Harness, name: &str, reason: &str) -> Vec<(String, String)> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(h.client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.regarding.as_ref().and_then(|r| r.kind.as_deref())
                    == Some("AntstorDataControl")
        })
        .map(|e| (e.type_.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn a_replica_on_a_lost_node_is_replaced_on_the_third_and_leaves_once_unlisted() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        for n in ["n1", "n2", "n3"] {
            h.add_pool(pool(n, 10 * GIB)).await;
        }
        let placed = healthy_volume(&h, "pvc-r", 2).await;
        // Whole copies (with the superblock's reserve) on distinct nodes.
        assert_eq!(
            placed.iter().map(|(_, n)| n.as_str()).collect::<Vec<_>>(),
            vec!["n1", "n2"]
        );
        for v in all_members(&h.client, "pvc-r").await {
            assert_eq!(v.spec.size_byte, GIB + 4 * MIB);
        }
        let d = dc(&h.client, "pvc-r").await;
        let cond = d.status.as_ref().unwrap().conditions[0].clone();
        assert_eq!(
            (cond.type_.as_str(), cond.status),
            (CONDITION_DEGRADED, ConditionState::False)
        );
        let (old, _) = placed[1].clone();

        // n2's agent stops renewing its Lease: its replica is replaced at once, on n3.
        lose_node(&h, "n2", &["n1", "n3"]).await;
        eventually("the replacement in the old one's place", || async {
            let g = group(&h.client, "pvc-r").await;
            g.spec.volumes.len() == 2
                && g.spec.volumes[0].vol_id.name == placed[0].0
                && g.spec.volumes[1].target_node_name == "n3"
        })
        .await;
        let g = group(&h.client, "pvc-r").await;
        let new = g.spec.volumes[1].vol_id.name.clone();
        assert_eq!(g.spec.volumes[1].size, (GIB + 4 * MIB) as i64, "same size");
        assert_eq!(
            g.annotations().get(ANNO_REPLACING),
            Some(&old),
            "the intent stays until the old replica leaves"
        );
        let members = all_members(&h.client, "pvc-r").await;
        assert_eq!(members.len(), 3, "one replacement: {members:?}");
        let old_vol = vols(&h.client).get(&old).await.unwrap();
        assert_eq!(old_vol.annotations().get(ANNO_REPLACED), Some(&new));
        // The new replica admits the assembling node.
        eventually("the new replica admits n1", || async {
            vols(&h.client)
                .get(&new)
                .await
                .unwrap()
                .spec
                .host_node
                .is_some_and(|x| x.id == "n1")
        })
        .await;
        // Degraded: status, condition, events, metric.
        eventually("degraded, the new replica not reported yet", || async {
            dc(&h.client, "pvc-r").await.status.is_some_and(|s| {
                s.health == Some(ReplicaHealth::Degraded) && s.conditions[0].message.contains(&new)
            })
        })
        .await;
        let st = dc(&h.client, "pvc-r").await.status.unwrap();
        let cond = &st.conditions[0];
        assert_eq!(cond.status, ConditionState::True);
        assert_eq!(cond.reason, "ReplicaLost");
        assert!(
            cond.message.starts_with("1 of 2 replicas online")
                && cond
                    .message
                    .contains("not reported by the assembling agent"),
            "{}",
            cond.message
        );
        eventually("the events", || async {
            let lost = events(&h, "pvc-r", "ReplicaLost").await;
            let replaced = events(&h, "pvc-r", "ReplicaReplaced").await;
            let degraded = events(&h, "pvc-r", "Degraded").await;
            lost.len() == 1
                && lost[0].0 == "Warning"
                && lost[0].1.contains(&old)
                && lost[0].1.contains("n2 is down")
                && replaced.len() == 1
                && replaced[0].0 == "Normal"
                && replaced[0].1.contains(&new)
                && degraded.len() == 1
                && degraded[0].0 == "Warning"
        })
        .await;
        eventually("the health metric", || async {
            let text = h.ctx.metrics.render();
            text.contains(
                "liteio_controller_replicated_volume_health{health=\"degraded\",pv=\"pvc-r\"} 1",
            ) && text.contains(
                "liteio_controller_replicated_volume_health{health=\"healthy\",pv=\"pvc-r\"} 0",
            )
        })
        .await;
        // Still listed by the assembly: the old replica is kept.
        assert!(
            vols(&h.client)
                .get(&old)
                .await
                .unwrap()
                .metadata
                .deletion_timestamp
                .is_none()
        );

        // The agent takes it out of the raid and rebuilds the new one: the old one goes,
        // then the intent.
        agent_reports(
            &h.client,
            "pvc-r",
            &[
                (&placed[0].0, "n1", "online", None),
                (&new, "n3", "rebuilding", Some(512 * MIB)),
            ],
        )
        .await;
        eventually("the old replica deleted and the intent gone", || async {
            let gone = vols(&h.client)
                .get_opt(&old)
                .await
                .unwrap()
                .is_none_or(|v| v.metadata.deletion_timestamp.is_some());
            gone && !group(&h.client, "pvc-r")
                .await
                .annotations()
                .contains_key(ANNO_REPLACING)
        })
        .await;
        eventually("rebuilding, bytes in the metric", || async {
            let text = h.ctx.metrics.render();
            dc(&h.client, "pvc-r")
                .await
                .status
                .is_some_and(|s| s.health == Some(ReplicaHealth::Rebuilding))
                && text.contains(&format!(
                    "liteio_controller_replica_rebuilt_bytes{{pv=\"pvc-r\",volume=\"{new}\"}} {}",
                    512 * MIB
                ))
        })
        .await;
        // Rebuilt: healthy again, the condition false; nothing else was created.
        agent_reports(
            &h.client,
            "pvc-r",
            &[
                (&placed[0].0, "n1", "online", None),
                (&new, "n3", "online", Some(GIB)),
            ],
        )
        .await;
        eventually("healthy again", || async {
            dc(&h.client, "pvc-r").await.status.is_some_and(|s| {
                s.health == Some(ReplicaHealth::Healthy)
                    && s.conditions[0].status == ConditionState::False
            })
        })
        .await;
        let names: Vec<String> = all_members(&h.client, "pvc-r")
            .await
            .iter()
            .filter(|v| v.metadata.deletion_timestamp.is_none())
            .map(|v| v.name_any())
            .collect();
        let mut want = vec![placed[0].0.clone(), new.clone()];
        want.sort();
        assert_eq!(names, want);
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn the_last_online_replica_is_kept() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        for n in ["n1", "n2", "n3"] {
            h.add_pool(pool(n, 10 * GIB)).await;
        }
        let placed = healthy_volume(&h, "pvc-k", 2).await;
        // The other replica is still rebuilding when n2, holding the only current copy,
        // is lost: nothing is replaced, and the condition says why.
        agent_reports(
            &h.client,
            "pvc-k",
            &[
                (&placed[0].0, "n1", "rebuilding", Some(0)),
                (&placed[1].0, "n2", "online", None),
            ],
        )
        .await;
        lose_node(&h, "n2", &["n1", "n3"]).await;
        eventually("failed, the lost replica kept", || async {
            dc(&h.client, "pvc-k").await.status.is_some_and(|s| {
                s.health == Some(ReplicaHealth::Failed)
                    && s.conditions[0].message.contains("last online replica")
            })
        })
        .await;
        let g = group(&h.client, "pvc-k").await;
        assert!(!g.annotations().contains_key(ANNO_REPLACING));
        assert_eq!(all_members(&h.client, "pvc-k").await.len(), 2);
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn the_assembly_moves_off_a_lost_node_after_every_member_is_fenced() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        for n in ["n1", "n2", "n3"] {
            h.add_pool(pool(n, 10 * GIB)).await;
        }
        let placed = healthy_volume(&h, "pvc-m", 2).await;
        assert_eq!(dc(&h.client, "pvc-m").await.spec.target_node_id, "n1");
        // Hold the data control's spec writes: the fence must come before them.
        h.server_faults
            .hang(Matcher::new(Verb::Patch, "antstordatacontrols").named("pvc-m"));
        lose_node(&h, "n1", &["n2", "n3"]).await;
        eventually(
            "every member fenced to n2 while the target is held",
            || async {
                let m0 = vols(&h.client).get(&placed[0].0).await.unwrap();
                let m1 = vols(&h.client).get(&placed[1].0).await.unwrap();
                h.server_faults.hung() >= 1
                    && [m0, m1]
                        .iter()
                        .all(|v| v.spec.host_node.as_ref().is_some_and(|x| x.id == "n2"))
            },
        )
        .await;
        let held = dc(&h.client, "pvc-m").await;
        assert_eq!(held.spec.target_node_id, "n1", "moved before the fence");
        assert!(
            held.status
                .as_ref()
                .is_some_and(|s| s.message.contains("moves from node n1")),
            "{:?}",
            held.status
        );
        h.server_faults.release_hangs();
        eventually("moved to n2", || async {
            let d = dc(&h.client, "pvc-m").await;
            d.spec.target_node_id == "n2"
                && d.labels().get(labels::TARGET_NODE_ID).map(String::as_str) == Some("n2")
                && d.annotations()
                    .get(ANNO_ASSEMBLY_MOVING_TO)
                    .map(String::as_str)
                    == Some("n2")
        })
        .await;
        eventually("the AssemblyMoved event", || async {
            events(&h, "pvc-m", "AssemblyMoved")
                .await
                .iter()
                .any(|(t, n)| t == "Normal" && n.contains("n1") && n.contains("n2"))
        })
        .await;
        // The lost replica on n1 is replaced too; its replacement admits n2.
        eventually("n1's replica replaced, the new one admits n2", || async {
            let g = group(&h.client, "pvc-m").await;
            let Some(new) = g.spec.volumes.first() else {
                return false;
            };
            new.target_node_name == "n3"
                && vols(&h.client)
                    .get_opt(&new.vol_id.name)
                    .await
                    .unwrap()
                    .is_some_and(|v| v.spec.host_node.is_some_and(|x| x.id == "n2"))
        })
        .await;
        // The new node's agent assembles and reports: the move is over.
        let new = group(&h.client, "pvc-m").await.spec.volumes[0]
            .vol_id
            .name
            .clone();
        agent_reports(
            &h.client,
            "pvc-m",
            &[
                (&new, "n3", "rebuilding", Some(0)),
                (&placed[1].0, "n2", "online", None),
            ],
        )
        .await;
        eventually("the move annotation gone", || async {
            !dc(&h.client, "pvc-m")
                .await
                .annotations()
                .contains_key(ANNO_ASSEMBLY_MOVING_TO)
        })
        .await;
        assert_eq!(dc(&h.client, "pvc-m").await.spec.target_node_id, "n2");
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_controller_restarted_mid_replacement_makes_one_replacement() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        for n in ["n1", "n2", "n3", "n4"] {
            h.add_pool(pool(n, 10 * GIB)).await;
        }
        let placed = healthy_volume(&h, "pvc-x", 2).await;
        let client = h.client.clone();
        h.stop.send_replace(true);
        timeout(LIMIT, h.task).await.unwrap().unwrap().unwrap();
        // As a controller leaves it when it stops after recording the intent and creating
        // the replacement (on n4), before swapping it into the group.
        let g = group(&client, "pvc-x").await;
        groups(&client)
            .patch(
                "pvc-x",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {ANNO_REPLACING: placed[1].0}}})),
            )
            .await
            .unwrap();
        let made = liteio_api::group::VolumeMeta {
            vol_id: EntityIdentity {
                namespace: NS.into(),
                name: "pvc-x-made".into(),
                uuid: "uuid-made".into(),
            },
            target_node_name: "n4".into(),
            size: (GIB + 4 * MIB) as i64,
        };
        let mut v = liteio_controller::group_scheduler::member_volume(
            &g,
            &made,
            liteio_api::VolumeType::SpdkLVol,
        );
        v.metadata.namespace = Some(NS.into());
        vols(&client)
            .create(&PostParams::default(), &v)
            .await
            .unwrap();
        // Another controller takes over: it adopts that one, places nothing else.
        let (stop, task, _ctx) = another_controller(&client, "t1-b").await;
        eventually("the made replacement swapped in", || async {
            let g = group(&client, "pvc-x").await;
            g.spec.volumes.len() == 2
                && g.spec.volumes[0].vol_id.name == placed[0].0
                && g.spec.volumes[1].vol_id.name == "pvc-x-made"
        })
        .await;
        let names: Vec<String> = all_members(&client, "pvc-x")
            .await
            .iter()
            .map(|v| v.name_any())
            .collect();
        let mut want = vec![
            placed[0].0.clone(),
            placed[1].0.clone(),
            "pvc-x-made".into(),
        ];
        want.sort();
        assert_eq!(names, want, "one replacement");
        assert_eq!(
            vols(&client)
                .get(&placed[1].0)
                .await
                .unwrap()
                .annotations()
                .get(ANNO_REPLACED)
                .map(String::as_str),
            Some("pvc-x-made")
        );
        // The agent drops the old replica: it goes, and so does the intent.
        agent_reports(
            &client,
            "pvc-x",
            &[
                (&placed[0].0, "n1", "online", None),
                ("pvc-x-made", "n4", "rebuilding", Some(0)),
            ],
        )
        .await;
        eventually("finished", || async {
            !group(&client, "pvc-x")
                .await
                .annotations()
                .contains_key(ANNO_REPLACING)
                && vols(&client)
                    .get_opt(&placed[1].0)
                    .await
                    .unwrap()
                    .is_none_or(|v| v.metadata.deletion_timestamp.is_some())
        })
        .await;
        assert_eq!(
            dc(&client, "pvc-x").await.status.unwrap().status,
            Some(VolumeStatus::Ready),
            "a serving volume is not held back by its replacement"
        );
        stop.send_replace(true);
        timeout(LIMIT, task).await.unwrap().unwrap().unwrap();
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn deleting_a_volume_mid_replacement_removes_the_replaced_member_too() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        for n in ["n1", "n2", "n3"] {
            h.add_pool(pool(n, 10 * GIB)).await;
        }
        let placed = healthy_volume(&h, "pvc-d", 2).await;
        lose_node(&h, "n2", &["n1", "n3"]).await;
        // Replaced, but the assembly still lists the old one: it is not in spec.volumes and
        // not deleted yet.
        eventually("swapped", || async {
            let g = group(&h.client, "pvc-d").await;
            g.spec.volumes.iter().all(|m| m.vol_id.name != placed[1].0)
                && g.annotations().contains_key(ANNO_REPLACING)
        })
        .await;
        assert_eq!(all_members(&h.client, "pvc-d").await.len(), 3);
        dcs(&h.client)
            .delete("pvc-d", &kube::api::DeleteParams::default())
            .await
            .unwrap();
        groups(&h.client)
            .delete("pvc-d", &kube::api::DeleteParams::default())
            .await
            .unwrap();
        eventually("every member and the group gone", || async {
            all_members(&h.client, "pvc-d").await.is_empty()
                && groups(&h.client).get_opt("pvc-d").await.unwrap().is_none()
        })
        .await;
        assert!(
            !h.ctx
                .metrics
                .render()
                .contains("replicated_volume_health{health=\"degraded\",pv=\"pvc-d\"}"),
            "the health series outlive the volume"
        );
        h.stop().await;
    })
    .await
    .unwrap();
}
