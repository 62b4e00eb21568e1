//! T1: bad volumes in a running controller. Each gets a message naming what is wrong, the
//! controller keeps scheduling good volumes, and a bad volume costs a bounded number of
//! requests (one message write; failed writes back off exponentially).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use liteio_api::AntstorVolume;
use liteio_api::keys::annotations;
use liteio_api::size::{GIB, MIB, VOLUME_UNIT};
use liteio_controller::state::ObjectKey;
use liteio_controller::testing::*;
use liteio_test_apiserver::{Matcher, Verb};
use tokio::time::{Instant, timeout};

use common::*;

/// Writes the controller made to volume `name` (status and main resource).
fn writes(h: &Harness, name: &str) -> u64 {
    let f = &h.server_faults;
    [
        (Verb::Patch, "antstorvolumes"),
        (Verb::Patch, "antstorvolumes/status"),
        (Verb::Update, "antstorvolumes"),
        (Verb::Update, "antstorvolumes/status"),
    ]
    .iter()
    .map(|(v, r)| f.requests_for(*v, r, name))
    .sum()
}

async fn message(h: &Harness, name: &str) -> String {
    h.volume(name)
        .await
        .status
        .map(|s| s.message)
        .unwrap_or_default()
}

async fn wait_message(h: &Harness, name: &str, check: impl Fn(&str) -> bool) -> String {
    let check = &check;
    eventually_ok(&format!("message on {name}"), || async move {
        let m = message(h, name).await;
        if check(&m) {
            Ok(())
        } else {
            Err(format!("status.msg is {m:?}"))
        }
    })
    .await;
    message(h, name).await
}

async fn wait_scheduled(h: &Harness, name: &str) {
    eventually(&format!("{name} scheduled"), || async {
        !h.volume(name).await.spec.target_node_id.is_empty()
    })
    .await;
}

#[tokio::test]
async fn bad_volumes_get_a_message_and_good_ones_are_still_scheduled() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("n1", 100 * GIB)).await;
        let bad = [
            ("zero", volume("zero", 0)),
            (
                "node-sel",
                volume("node-sel", GIB).annotate(annotations::NODE_LABEL_SELECTOR, "a in (x"),
            ),
            (
                "pool-sel",
                volume("pool-sel", GIB).annotate(annotations::POOL_LABEL_SELECTOR, "=b"),
            ),
            (
                "clone",
                volume("clone", GIB)
                    .cloned_from("no-such-snap")
                    .annotate(annotations::POOL_LABEL_SELECTOR, "obnvmf/node-sn=n1"),
            ),
        ];
        for (_, v) in &bad {
            h.add_volume(v.clone()).await;
        }
        // Unaligned sizes are not an error: engines allocate whole units, so the volume is
        // placed and charged at the rounded size.
        h.add_volume(volume("odd", GIB + 1)).await;
        h.add_volume(volume("good", GIB)).await;

        let m = wait_message(&h, "zero", |m| !m.is_empty()).await;
        assert!(
            m.starts_with("invalid volume") && m.contains("spec.sizeByte"),
            "{m}"
        );
        let m = wait_message(&h, "node-sel", |m| !m.is_empty()).await;
        assert!(
            m.starts_with("invalid volume")
                && m.contains("metadata.annotations[obnvmf/node-label-selector]"),
            "{m}"
        );
        let m = wait_message(&h, "pool-sel", |m| !m.is_empty()).await;
        assert!(
            m.starts_with("invalid volume")
                && m.contains("metadata.annotations[obnvmf/pool-label-selector]"),
            "{m}"
        );
        let m = wait_message(&h, "clone", |m| !m.is_empty()).await;
        assert!(
            m.starts_with("SourceSnapshotNotFound") && m.contains("obnvmf/no-such-snap"),
            "{m}"
        );
        // An invalid volume is permanent (only a change heals it); a clone waiting for its
        // snapshot is not (the snapshot may still come).
        let permanent = |v: liteio_api::AntstorVolume| v.status.is_some_and(|s| s.permanent);
        assert!(
            permanent(h.volume("zero").await),
            "an invalid volume is marked permanent"
        );
        assert!(
            !permanent(h.volume("clone").await),
            "a clone waiting for its snapshot is not"
        );
        h.wait_bound("odd", "n1").await;
        h.wait_bound("good", "n1").await;
        let charged = h.ctx.state().charge(&ObjectKey::new(NS, "odd"));
        assert_eq!(charged, Some(GIB + VOLUME_UNIT));
        for (name, _) in &bad {
            let v = h.volume(name).await;
            assert!(v.spec.target_node_id.is_empty(), "{name} was scheduled");
        }

        // Everything that re-queues unscheduled volumes happens again (a new pool, a volume
        // freeing space); the bad volumes are reconciled again but write nothing new.
        let before: Vec<u64> = bad.iter().map(|(n, _)| writes(&h, n)).collect();
        for (n, w) in bad.iter().map(|(n, _)| *n).zip(&before) {
            assert!(*w <= 2, "{n}: {w} writes for one message");
        }
        h.add_pool(pool("n2", 100 * GIB)).await;
        h.add_volume(volume("good-2", GIB)).await;
        wait_scheduled(&h, "good-2").await;
        h.volumes()
            .delete("good", &Default::default())
            .await
            .unwrap();
        eventually("good released", || async {
            h.volumes().get_opt("good").await.unwrap().is_none()
        })
        .await;
        // An observation window, not a synchronisation: a retry storm would show here.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after: Vec<u64> = bad.iter().map(|(n, _)| writes(&h, n)).collect();
        assert_eq!(before, after, "bad volumes were written again");
        for (name, _) in &bad {
            assert!(
                !message(&h, name).await.is_empty(),
                "{name} lost its message"
            );
        }

        // The snapshot appears: the clone is scheduled and its message goes.
        h.add_snapshot(snapshot("no-such-snap", "good-2", GIB))
            .await;
        h.wait_bound("clone", "n1").await;
        wait_message(&h, "clone", str::is_empty).await;

        // A fixed volume is scheduled.
        h.volumes()
            .patch(
                "zero",
                &Default::default(),
                &kube::api::Patch::Merge(serde_json::json!({ "spec": { "sizeByte": 8 * MIB } })),
            )
            .await
            .unwrap();
        wait_scheduled(&h, "zero").await;
        wait_message(&h, "zero", str::is_empty).await;
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn failing_writes_for_a_bad_volume_back_off() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("n1", 100 * GIB)).await;
        h.server_faults.fail_next(
            usize::MAX,
            Matcher::new(Verb::Patch, "antstorvolumes/status").named("bad"),
            500,
            "InternalError",
        );
        h.add_volume(volume("bad", 0)).await;
        // Record when each attempt to write the message reached the server.
        let start = Instant::now();
        let mut seen = 0;
        let mut at: Vec<Duration> = Vec::new();
        while start.elapsed() < Duration::from_secs(3) {
            let n = h
                .server_faults
                .requests_for(Verb::Patch, "antstorvolumes/status", "bad");
            if n > seen {
                seen = n;
                at.push(start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // 50 ms doubling: about 6 attempts in 3 s, not hundreds.
        assert!((3..=10).contains(&seen), "{seen} attempts in 3 s: {at:?}");
        let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            gaps.last()
                .is_some_and(|g| *g >= Duration::from_millis(300)),
            "back-off did not grow: {gaps:?}"
        );
        // Meanwhile good volumes are scheduled.
        h.add_volume(volume("good", GIB)).await;
        h.wait_bound("good", "n1").await;
        // Once the server accepts the write, the message lands.
        h.server_faults.clear();
        let m = wait_message(&h, "bad", |m| !m.is_empty()).await;
        assert!(m.contains("spec.sizeByte"), "{m}");
        h.stop().await;
    })
    .await
    .unwrap();
}

fn volume_json(name: &str, spec: serde_json::Value) -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "volume.antstor.alipay.com/v1",
        "kind": "AntstorVolume",
        "metadata": { "name": name, "namespace": NS },
        "spec": spec,
    }))
    .unwrap()
}

/// Unknown enum values never reach the controller: the CRD schema rejects them, naming
/// the field.
#[tokio::test]
async fn unknown_enum_values_are_rejected_by_the_api_server() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("n1", 100 * GIB)).await;
        let api: Api<DynamicObject> = Api::namespaced_with(
            h.client.clone(),
            NS,
            &ApiResource::erase::<AntstorVolume>(&()),
        );
        for (name, field, spec) in [
            (
                "pos",
                "spec.positionAdvice",
                serde_json::json!({"uuid": "u-pos", "sizeByte": GIB, "positionAdvice": "Nearby"}),
            ),
            (
                "kind",
                "spec.type",
                serde_json::json!({"uuid": "u-kind", "sizeByte": GIB, "type": "FancyLVol"}),
            ),
        ] {
            let err = api
                .create(&PostParams::default(), &volume_json(name, spec))
                .await
                .expect_err("an unknown enum value must be rejected");
            let kube::Error::Api(s) = err else {
                panic!("not an API error: {err:?}");
            };
            assert_eq!(s.code, 422, "{s:?}");
            assert!(
                s.message.contains(field) && s.message.contains("Unsupported value"),
                "{s:?}"
            );
        }
        // The same through an update of an existing volume.
        h.add_volume(volume("ok", GIB)).await;
        h.wait_bound("ok", "n1").await;
        let err = api
            .patch(
                "ok",
                &Default::default(),
                &kube::api::Patch::Merge(serde_json::json!({"spec": {"positionAdvice": "Near"}})),
            )
            .await
            .expect_err("an unknown enum value must be rejected");
        assert!(
            matches!(&err, kube::Error::Api(s) if s.code == 422 && s.message.contains("spec.positionAdvice")),
            "{err:?}"
        );
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_second_volume_with_a_used_uuid_is_refused_naming_the_first() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("n1", 100 * GIB)).await;
        h.add_volume(volume("first", GIB)).await;
        h.wait_bound("first", "n1").await;
        let mut dup = volume("second", GIB);
        dup.0.spec.uuid = "uuid-first".to_string();
        h.add_volume(dup).await;
        let m = wait_message(&h, "second", |m| !m.is_empty()).await;
        assert!(
            m.starts_with("invalid volume: spec.uuid: uuid-first")
                && m.contains("AntstorVolume obnvmf/first"),
            "{m}"
        );
        eventually("InvalidVolume event on second", || async {
            warnings_about(&h, "AntstorVolume", "second", "InvalidVolume")
                .await
                .iter()
                .any(|n| n.contains("obnvmf/first"))
        })
        .await;
        assert!(h.volume("second").await.spec.target_node_id.is_empty());
        assert!(
            message(&h, "first").await.is_empty(),
            "the first is untouched"
        );

        // The first goes: the uuid is free and the second is scheduled.
        h.volumes()
            .delete("first", &Default::default())
            .await
            .unwrap();
        h.wait_bound("second", "n1").await;
        wait_message(&h, "second", str::is_empty).await;
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_preset_target_without_a_pool_gets_a_message_until_the_pool_appears() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("n1", 100 * GIB)).await;
        h.add_volume(volume("pinned", GIB).scheduled_to("ghost"))
            .await;
        let m = wait_message(&h, "pinned", |m| !m.is_empty()).await;
        assert!(
            m.contains("spec.targetNodeId: node ghost has no StoragePool"),
            "{m}"
        );
        eventually("InvalidVolume event on pinned", || async {
            !warnings_about(&h, "AntstorVolume", "pinned", "InvalidVolume")
                .await
                .is_empty()
        })
        .await;
        h.add_pool(pool("ghost", 100 * GIB)).await;
        wait_message(&h, "pinned", str::is_empty).await;
        eventually("pinned taken in", || async {
            h.volume("pinned")
                .await
                .metadata
                .finalizers
                .is_some_and(|f| {
                    f.iter()
                        .any(|f| f == liteio_api::keys::finalizers::IN_STATE)
                })
        })
        .await;
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_volume_without_a_requested_topology_is_bound_where_it_can_be_used() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        // A pool whose agent has no working SPDK target cannot export: local only.
        h.add_pool(pool("n1", 100 * GIB).lvm().spdk_unhealthy())
            .await;
        h.add_volume(volume("plain", GIB)).await;
        h.wait_bound("plain", "n1").await;
        let v = h.volume("plain").await;
        assert_eq!(v.spec.host_node.as_ref().map(|n| n.id.as_str()), Some("n1"));
        assert!(v.is_local());
        assert_eq!(
            v.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(annotations::LOCAL_ONLY))
                .map(String::as_str),
            Some("true")
        );
        // A volume whose consumer is elsewhere cannot be placed there, and says why.
        h.add_volume(volume("far", GIB).host("n9")).await;
        let m = wait_message(&h, "far", |m| !m.is_empty()).await;
        assert!(m.contains("SpdkUnhealthy: 1"), "{m}");
        // A consumer on the pool's own node: local, pinned as well (nothing can export it).
        h.add_volume(volume("here", GIB).host("n1")).await;
        h.wait_bound("here", "n1").await;
        let v = h.volume("here").await;
        assert_eq!(
            v.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(annotations::LOCAL_ONLY))
                .map(String::as_str),
            Some("true")
        );
        h.stop().await;
    })
    .await
    .unwrap();
}
