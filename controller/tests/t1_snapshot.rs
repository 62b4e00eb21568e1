//! T1: the snapshot reconciler in the running controller, against the test API server.
//!
//! Validation and reserve failures become Warning events about the snapshot; a valid
//! snapshot binds to its origin's node once the origin is scheduled; deletion releases the
//! agent's finalizer only when the snapshot was merged or its pool is gone. An in-memory
//! MetaSync plug-in runs after each step of the reconciler, so its rows show that the
//! controller has handled an object: no sleeps.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use liteio_api::keys::{annotations, finalizers, labels};
use liteio_api::size::{GIB, MIB};
use liteio_api::snapshot::SnapshotStatusName;
use liteio_controller::metasync::MetaSync;
use liteio_controller::plugin::Kind;
use liteio_controller::state::ObjectKey;
use liteio_controller::testing::*;
use tokio::time::timeout;

use common::*;

async fn start_probed() -> (Harness, MetaSync) {
    let probe = MetaSync::in_memory("t1").unwrap();
    let h = start_with(test_config(), vec![Arc::new(probe.clone())]).await;
    (h, probe)
}

/// The notes of the Warning events about snapshot `name` with `reason`.
async fn warnings(h: &Harness, name: &str, reason: &str) -> Vec<String> {
    warnings_about(h, "AntstorSnapshot", name, reason).await
}

async fn warned(h: &Harness, name: &str, reason: &str, says: &str) {
    eventually(
        &format!("{reason} event on {name} saying {says:?}"),
        || async {
            warnings(h, name, reason)
                .await
                .iter()
                .any(|n| n.contains(says))
        },
    )
    .await;
}

/// A volume `name` of 10 GiB reserving `reserve` bytes for snapshots, bound to a pool.
async fn origin(h: &Harness, name: &str, reserve: u64) -> String {
    h.add_volume(
        volume(name, 10 * GIB).annotate(annotations::SNAPSHOT_RESERVED_BYTES, &reserve.to_string()),
    )
    .await;
    eventually(&format!("{name} bound"), || async {
        !h.volume(name).await.spec.target_node_id.is_empty()
    })
    .await;
    h.volume(name).await.spec.target_node_id
}

#[tokio::test]
async fn invalid_snapshots_get_a_warning_and_stay_unbound() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("n1", 100 * GIB)).await;
        origin(&h, "v1", 2 * GIB).await;
        let mut no_uuid = snapshot("s-no-uuid", "v1", GIB);
        no_uuid.0.spec.uuid = String::new();
        h.add_snapshot(no_uuid).await;
        h.add_snapshot(snapshot("s-tiny", "v1", MIB)).await;
        warned(&h, "s-no-uuid", "SnapshotCreateFailure", "spec.uuid").await;
        warned(&h, "s-tiny", "SnapshotCreateFailure", "below the minimum").await;
        for s in ["s-no-uuid", "s-tiny"] {
            let snap = h.snapshot(s).await;
            assert!(snap.spec.origin_vol_target_node_id.is_empty(), "{s} bound");
            assert!(snap.status.is_none(), "{s}: {:?}", snap.status);
            // The origin labels were added before validation.
            assert_eq!(
                snap.labels()
                    .get(labels::ORIGIN_VOLUME_NAME)
                    .map(String::as_str),
                Some("v1")
            );
        }
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn snapshot_binds_to_its_origins_node_within_the_reserve() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("n1", 100 * GIB)).await;
        let node = origin(&h, "v1", 2 * GIB).await;
        // More than the origin reserves: refused, not bound.
        h.add_snapshot(snapshot("s-big", "v1", 4 * GIB)).await;
        warned(&h, "s-big", "SnapshotCreateFailure", "reserves 2.0 GiB").await;
        assert!(
            h.snapshot("s-big")
                .await
                .spec
                .origin_vol_target_node_id
                .is_empty()
        );
        // Deleting it (no finalizer) lets it go at once.
        h.snapshots()
            .delete("s-big", &DeleteParams::default())
            .await
            .unwrap();
        eventually("s-big gone", || async {
            h.snapshots().get_opt("s-big").await.unwrap().is_none()
        })
        .await;
        // Within the reserve: bound to the origin's node, size rounded down to 4 MiB.
        h.add_snapshot(snapshot("s1", "v1", GIB + 12_345)).await;
        eventually("s1 bound", || async {
            !h.snapshot("s1")
                .await
                .spec
                .origin_vol_target_node_id
                .is_empty()
        })
        .await;
        let s1 = h.snapshot("s1").await;
        assert_eq!(s1.spec.origin_vol_target_node_id, node);
        assert_eq!(s1.spec.size, i64::try_from(GIB).unwrap());
        assert_eq!(
            s1.labels().get(labels::TARGET_NODE_ID).map(String::as_str),
            Some(node.as_str())
        );
        eventually("s1 creating", || async {
            h.snapshot("s1").await.status.map(|s| s.status) == Some(SnapshotStatusName::Creating)
        })
        .await;
        // A second unmerged snapshot of the same origin is refused.
        h.add_snapshot(snapshot("s2", "v1", GIB)).await;
        warned(
            &h,
            "s2",
            "SnapshotCreateFailure",
            "already has the unmerged snapshot obnvmf/s1",
        )
        .await;
        assert!(
            h.snapshot("s2")
                .await
                .spec
                .origin_vol_target_node_id
                .is_empty()
        );
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn snapshot_waits_for_its_origin() {
    timeout(LIMIT, async {
        let (h, probe) = start_probed().await;
        h.add_pool(pool("n1", 100 * GIB)).await;
        h.add_snapshot(snapshot("s1", "late", GIB)).await;
        // The reconciler has seen s1 (its origin labels are there) and left it unbound.
        eventually("origin labels on s1", || async {
            h.snapshot("s1")
                .await
                .labels()
                .get(labels::ORIGIN_VOLUME_NAME)
                == Some(&"late".to_string())
        })
        .await;
        assert!(
            h.snapshot("s1")
                .await
                .spec
                .origin_vol_target_node_id
                .is_empty()
        );
        assert!(
            probe
                .row(Kind::Snapshot, &ObjectKey::new(NS, "s1"))
                .await
                .unwrap()
                .is_none(),
            "plug-ins ran for an unbound snapshot"
        );
        // The origin appears and is scheduled: its event re-queues s1, which binds.
        let node = origin(&h, "late", GIB).await;
        eventually("s1 bound to the origin's node", || async {
            h.snapshot("s1").await.spec.origin_vol_target_node_id == node
        })
        .await;
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn deletion_releases_the_agent_finalizer_only_when_merged_or_pool_gone() {
    timeout(LIMIT, async {
        let (h, probe) = start_probed().await;
        h.add_pool(pool("n1", 100 * GIB)).await;
        origin(&h, "v1", 2 * GIB).await;
        let mut s1 = snapshot("s1", "v1", GIB);
        s1.0.metadata.finalizers = Some(vec![finalizers::SNAPSHOT.into()]);
        h.add_snapshot(s1).await;
        eventually("s1 bound", || async {
            !h.snapshot("s1")
                .await
                .spec
                .origin_vol_target_node_id
                .is_empty()
        })
        .await;
        // Deleted while the pool lives and it is not merged: the agent owns the deletion.
        h.snapshots()
            .delete("s1", &DeleteParams::default())
            .await
            .unwrap();
        let key = ObjectKey::new(NS, "s1");
        eventually("the deletion step ran", || async {
            probe
                .row(Kind::Snapshot, &key)
                .await
                .unwrap()
                .is_some_and(|r| r.iter().any(|(c, v)| c == "status" && v == "deleted"))
        })
        .await;
        let s = h.snapshot("s1").await;
        assert!(s.metadata.deletion_timestamp.is_some());
        assert_eq!(s.finalizers(), [finalizers::SNAPSHOT.to_string()]);
        // Merged: the finalizer goes and so does the snapshot.
        h.snapshots()
            .patch_status(
                "s1",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "status": { "status": "merged" } })),
            )
            .await
            .unwrap();
        eventually("merged s1 gone", || async {
            h.snapshots().get_opt("s1").await.unwrap().is_none()
        })
        .await;
        // A snapshot whose pool no longer exists is released too.
        let mut orphan = snapshot("s-orphan", "v-gone", GIB).bound_to("n-gone");
        orphan.0.metadata.finalizers =
            Some(vec![finalizers::SNAPSHOT.into(), "example.com/keep".into()]);
        h.add_snapshot(orphan).await;
        h.snapshots()
            .delete("s-orphan", &DeleteParams::default())
            .await
            .unwrap();
        eventually("the agent finalizer stripped, others kept", || async {
            h.snapshot("s-orphan").await.finalizers() == ["example.com/keep".to_string()]
        })
        .await;
        h.stop().await;
    })
    .await
    .unwrap();
}
