//! T1: the controller against the in-process test API server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use liteio_api::keys::finalizers;
use liteio_api::pool::PoolStatus;
use liteio_api::size::GIB;
use liteio_controller::clock::Clock;
use liteio_controller::config::Config;
use liteio_controller::http::Health;
use liteio_controller::metrics::Metrics;
use liteio_controller::run::{self, Options};
use liteio_controller::state::ObjectKey;
use liteio_controller::testing::*;
use liteio_test_apiserver::{Matcher, TestApiServer, Verb};
use tokio::sync::watch;
use tokio::time::timeout;

use common::*;
use kube::ResourceExt;

#[tokio::test]
async fn volume_is_scheduled_and_bound() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("n1", 100 * GIB)).await;
        h.add_volume(volume("v1", 10 * GIB).host("n1")).await;
        h.wait_bound("v1", "n1").await;
        // Creating until its agent writes ready. Binding writes no status of its own; one
        // is there only when the volume was reconciled before the pool was seen (nothing
        // fit then), and its message is cleared once bound.
        eventually("creating, without a message", || async {
            let v = h.volume("v1").await;
            v.phase() == liteio_api::VolumeStatus::Creating
                && v.status.as_ref().is_none_or(|s| s.message.is_empty())
        })
        .await;
        assert_eq!(h.ctx.state().free_bytes("n1"), Some(i128::from(90 * GIB)));
        // The pool got its finalizer and label.
        eventually("pool finalizer", || async {
            h.pools()
                .get("n1")
                .await
                .unwrap()
                .finalizers()
                .iter()
                .any(|f| f == finalizers::IN_STATE)
        })
        .await;
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn nothing_fits_then_a_pool_appears() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("small", GIB)).await;
        h.add_volume(volume("v1", 10 * GIB)).await;
        eventually("status.msg", || async {
            h.volume("v1").await.status.map(|s| s.message)
                == Some("NoStoragePoolAvailable: PoolFreeSize: 1".to_string())
        })
        .await;
        h.add_pool(pool("big", 100 * GIB)).await;
        h.wait_bound("v1", "big").await;
        eventually("message cleared", || async {
            h.volume("v1")
                .await
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
async fn locked_pool_is_skipped() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("a-locked", 100 * GIB).locked()).await;
        h.add_volume(volume("v0", GIB)).await;
        eventually("unschedulable message", || async {
            h.volume("v0").await.status.map(|s| s.message)
                == Some("NoStoragePoolAvailable: PoolUnschedulable: 1".to_string())
        })
        .await;
        h.add_pool(pool("b-open", 10 * GIB)).await;
        h.wait_bound("v0", "b-open").await;
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn pool_liveness_follows_the_lease() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        let node = k8s_openapi::api::core::v1::Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                ..ObjectMeta::default()
            },
            ..Default::default()
        };
        Api::<k8s_openapi::api::core::v1::Node>::all(h.client.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
        h.add_pool(pool("n1", 10 * GIB)).await;
        eventually("ready", || async {
            h.pool_status("n1").await == Some(PoolStatus::Ready)
        })
        .await;
        h.clock.advance(Duration::from_secs(4 * 60));
        eventually("unknown", || async {
            h.pool_status("n1").await == Some(PoolStatus::Unknown)
        })
        .await;
        h.clock.advance(Duration::from_secs(24 * 3600));
        eventually("offline", || async {
            h.pool_status("n1").await == Some(PoolStatus::Offline)
        })
        .await;
        h.renew("n1", h.clock.now()).await;
        eventually("ready again", || async {
            h.pool_status("n1").await == Some(PoolStatus::Ready)
        })
        .await;
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn deletion_on_a_dead_pool_strips_the_right_finalizers() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("n1", 10 * GIB)).await;
        h.add_volume(
            volume("v1", GIB)
                .finalizer(finalizers::LOGIC_VOLUME)
                .finalizer(finalizers::SPDK_TARGET)
                .finalizer("example.com/keep"),
        )
        .await;
        h.wait_bound("v1", "n1").await;
        // A live pool: the agent owns the deletion, nothing is stripped.
        h.volumes()
            .delete("v1", &DeleteParams::default())
            .await
            .unwrap();
        tokio::task::yield_now().await;
        let fins = h.volume("v1").await.finalizers().to_vec();
        assert!(
            fins.iter().any(|f| f == finalizers::LOGIC_VOLUME),
            "{fins:?}"
        );
        // The agent dies: the pool goes offline and the agent's finalizers go.
        h.clock.advance(Duration::from_secs(25 * 3600));
        eventually("finalizers stripped", || async {
            h.volume("v1").await.finalizers() == ["example.com/keep".to_string()]
        })
        .await;
        assert_eq!(h.ctx.state().free_bytes("n1"), Some(i128::from(10 * GIB)));
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn expansion_updates_the_state() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("n1", 20 * GIB)).await;
        h.add_volume(volume("v1", 10 * GIB)).await;
        h.wait_bound("v1", "n1").await;
        h.volumes()
            .patch(
                "v1",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "spec": { "sizeByte": 15 * GIB } })),
            )
            .await
            .unwrap();
        eventually("free space after expansion", || async {
            h.ctx.state().free_bytes("n1") == Some(i128::from(5 * GIB))
        })
        .await;
        // A second volume no longer fits where the old size would have let it.
        h.add_volume(volume("v2", 8 * GIB)).await;
        eventually("v2 rejected", || async {
            h.volume("v2").await.status.map(|s| s.message)
                == Some("NoStoragePoolAvailable: PoolFreeSize: 1".to_string())
        })
        .await;
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn api_errors_are_retried() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("n1", 20 * GIB)).await;
        h.server_faults.fail_next(
            3,
            Matcher::new(Verb::Patch, "antstorvolumes").named("v1"),
            500,
            "InternalError",
        );
        h.add_volume(volume("v1", GIB)).await;
        h.wait_bound("v1", "n1").await;
        assert!(h.server_faults.requests(Verb::Patch, "antstorvolumes") >= 4);
        // Bound exactly once.
        assert_eq!(
            h.ctx.state().volumes_on("n1"),
            vec![ObjectKey::new(NS, "v1")]
        );
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn restart_places_nothing_twice() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("n1", 10 * GIB)).await;
        h.add_volume(volume("v1", 6 * GIB)).await;
        h.wait_bound("v1", "n1").await;
        // A second controller on the same server sees v1 from its first list.
        h.stop.send_replace(true);
        let (stop, task, ctx2) = another_controller(&h.client, "t1b").await;
        h.add_volume(volume("v2", 6 * GIB)).await;
        eventually("v2 rejected by the new controller", || async {
            h.volume("v2").await.status.map(|s| s.message)
                == Some("NoStoragePoolAvailable: PoolFreeSize: 1".to_string())
        })
        .await;
        assert_eq!(ctx2.state().free_bytes("n1"), Some(i128::from(4 * GIB)));
        stop.send_replace(true);
        timeout(LIMIT, task).await.unwrap().unwrap().unwrap();
    })
    .await
    .unwrap();
}

fn elector_config() -> Config {
    let mut c = test_config();
    c.leader_election.lease_duration = Duration::from_secs(2);
    c.leader_election.renew_deadline = Duration::from_millis(1500);
    c.leader_election.retry_period = Duration::from_millis(100);
    c
}

#[tokio::test]
async fn leader_election_fails_over() {
    timeout(LIMIT, async {
        let server = TestApiServer::start().await.unwrap();
        let client = server.client().await.unwrap();
        ensure_ns(&client).await;
        let spawn = |id: &str| {
            let health = Health::default();
            let (stop, rx) = watch::channel(false);
            let opts = Options {
                config: elector_config(),
                namespace: NS.into(),
                leader_elect: true,
                identity: id.into(),
                health: health.clone(),
                metrics: Metrics::new().unwrap(),
                clock: None,
            };
            let task = tokio::spawn(run::run(client.clone(), opts, Vec::new(), rx, None));
            (health, stop, task)
        };
        let (ha, _stop_a, ta) = spawn("a");
        let (hb, stop_b, tb) = spawn("b");
        eventually("one leader", || async {
            ha.leader.load(Ordering::SeqCst) || hb.leader.load(Ordering::SeqCst)
        })
        .await;
        assert!(
            !(ha.leader.load(Ordering::SeqCst) && hb.leader.load(Ordering::SeqCst)),
            "two leaders"
        );
        let (leader_task, other) = if ha.leader.load(Ordering::SeqCst) {
            (ta, hb.clone())
        } else {
            (tb, ha.clone())
        };
        // The leader crashes without releasing: the other takes over after the lease expires.
        leader_task.abort();
        eventually("failover", || async { other.leader.load(Ordering::SeqCst) }).await;
        let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
        // The new leader loses its Lease to an intruder: it steps down.
        let mut l = leases.get("node-disk-controller").await.unwrap();
        let spec = l.spec.as_mut().unwrap();
        spec.holder_identity = Some("intruder".into());
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        spec.lease_duration_seconds = Some(3600);
        leases
            .replace("node-disk-controller", &PostParams::default(), &l)
            .await
            .unwrap();
        eventually("step down", || async {
            !other.leader.load(Ordering::SeqCst)
        })
        .await;
        drop(stop_b);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn pool_of_a_vanished_node_is_deleted_when_empty() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("gone", 10 * GIB)).await;
        eventually("in-state finalizer", || async {
            h.pools().get("gone").await.unwrap().finalizers().len() == 1
        })
        .await;
        // No Node object exists; once offline and old enough the pool is removed.
        h.clock.advance(Duration::from_secs(25 * 3600));
        eventually("pool deleted", || async {
            h.pools().get_opt("gone").await.unwrap().is_none()
        })
        .await;
        h.stop().await;
    })
    .await
    .unwrap();
}

/// One volume's writes hang at the API server: its reconcile is abandoned after
/// `reconcileTimeout` and retried, and the other volumes are scheduled meanwhile (with one
/// volume worker, as here, the hung request would stop them all without the bound).
#[tokio::test]
async fn a_hung_request_does_not_stop_the_other_volumes() {
    timeout(LIMIT, async {
        let mut config = test_config();
        config.reconcile_timeout = Duration::from_secs(2);
        config.workers.volume = 1;
        let h = start(config).await;
        h.add_pool(pool("n1", 100 * GIB)).await;
        for verb in [Verb::Patch, Verb::Update] {
            h.server_faults
                .hang(Matcher::new(verb, "antstorvolumes").named("stuck"));
        }
        h.add_volume(volume("stuck", GIB).host("n1")).await;
        eventually("a write of the stuck volume is held", || async {
            h.server_faults.hung() >= 1
        })
        .await;
        h.add_volume(volume("v2", GIB).host("n1")).await;
        h.wait_bound("v2", "n1").await;
        eventually("the timeout counted as an API failure", || async {
            h.ctx
                .metrics
                .reconciles
                .with_label_values(&["volume", "api"])
                .get()
                >= 1
        })
        .await;
        h.server_faults.release_hangs();
        h.wait_bound("stuck", "n1").await;
        h.stop().await;
    })
    .await
    .unwrap();
}
