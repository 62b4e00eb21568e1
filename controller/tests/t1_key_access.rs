//! T1: the controller keeps each storage node's access to its volumes' keys (Role and
//! RoleBinding `liteio-keys-<node>`) in line with the volumes bound to it, against the
//! in-process test API server. Whether RBAC then allows what the Role says is asked of a real
//! kube-apiserver in `tests/deploy/tests/t2_rbac.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use liteio_api::keys::finalizers;
use liteio_api::size::GIB;
use liteio_controller::testing::*;
use tokio::time::timeout;

use common::*;
use kube::ResourceExt;

fn roles(h: &Harness) -> Api<Role> {
    Api::namespaced(h.client.clone(), NS)
}

/// The Secret names the Role of `node` grants, or `None` without Role.
async fn granted(h: &Harness, node: &str) -> Option<Vec<String>> {
    let r = roles(h)
        .get_opt(&format!("liteio-keys-{node}"))
        .await
        .unwrap()?;
    let rules = r.rules.unwrap_or_default();
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(rules[0].resources, Some(vec!["secrets".to_string()]));
    assert_eq!(rules[0].verbs, ["get", "patch", "delete"]);
    Some(rules[0].resource_names.clone().unwrap_or_default())
}

/// True when `node` has neither a key Role nor its RoleBinding.
async fn no_access(h: &Harness, node: &str) -> bool {
    granted(h, node).await.is_none()
        && Api::<RoleBinding>::namespaced(h.client.clone(), NS)
            .get_opt(&format!("liteio-keys-{node}"))
            .await
            .unwrap()
            .is_none()
}

/// Sets the finalizers of volume `name` (`null` removes them all).
async fn set_finalizers(h: &Harness, name: &str, finalizers: serde_json::Value) {
    h.volumes()
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"finalizers": finalizers}})),
        )
        .await
        .unwrap();
}

fn names(v: &[&str]) -> Option<Vec<String>> {
    Some(v.iter().map(|s| s.to_string()).collect())
}

#[tokio::test]
async fn each_node_gets_exactly_the_keys_of_its_volumes() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("n1", 10 * GIB)).await;
        h.add_pool(pool("n2", 100 * GIB)).await;
        // The agent's finalizer holds a deleted volume until the agent let go of it.
        h.add_volume(
            volume("v1", GIB)
                .scheduled_to("n1")
                .finalizer(finalizers::LOGIC_VOLUME),
        )
        .await;
        h.add_volume(
            volume("v2", GIB)
                .scheduled_to("n1")
                .finalizer(finalizers::LOGIC_VOLUME),
        )
        .await;
        h.add_volume(volume("v3", GIB).scheduled_to("n2")).await;
        // Placed by the scheduler, not preset (only n2 has room): the grant follows the
        // binding.
        h.add_volume(volume("v4", 20 * GIB)).await;
        h.wait_bound("v4", "n2").await;
        // Preset to a node whose pool does not exist yet (its agent starts later): granted
        // already, so the agent can read the keys as soon as it runs.
        h.add_volume(volume("v5", GIB).scheduled_to("n9")).await;
        eventually("n9 holds v5", || async {
            granted(&h, "n9").await == names(&["liteio-auth-v5"])
        })
        .await;
        eventually("n1 holds v1 and v2", || async {
            granted(&h, "n1").await == names(&["liteio-auth-v1", "liteio-auth-v2"])
        })
        .await;
        eventually("n2 holds v3 and v4", || async {
            granted(&h, "n2").await == names(&["liteio-auth-v3", "liteio-auth-v4"])
        })
        .await;
        let b: RoleBinding = Api::namespaced(h.client.clone(), NS)
            .get("liteio-keys-n1")
            .await
            .unwrap();
        let subjects = b.subjects.unwrap();
        assert_eq!(subjects.len(), 1);
        assert_eq!(
            (subjects[0].kind.as_str(), subjects[0].name.as_str()),
            ("User", "system:node:n1")
        );
        assert_eq!(b.role_ref.name, "liteio-keys-n1");

        // A volume being deleted keeps its grant until it is gone: the agent still has to
        // delete its Secret.
        h.volumes()
            .delete("v2", &DeleteParams::default())
            .await
            .unwrap();
        let v2 = h.volume("v2").await;
        assert!(v2.metadata.deletion_timestamp.is_some());
        assert!(
            granted(&h, "n1")
                .await
                .unwrap()
                .contains(&"liteio-auth-v2".to_string()),
            "the grant went before the volume"
        );
        let keep: Vec<String> = v2
            .finalizers()
            .iter()
            .filter(|f| *f != finalizers::LOGIC_VOLUME)
            .cloned()
            .collect();
        set_finalizers(&h, "v2", serde_json::json!(keep)).await;
        eventually("v2's grant gone with it", || async {
            granted(&h, "n1").await == names(&["liteio-auth-v1"])
        })
        .await;

        // The node's last volume goes: no Role, no RoleBinding (an empty resourceNames would
        // grant every Secret).
        h.volumes()
            .delete("v1", &DeleteParams::default())
            .await
            .unwrap();
        set_finalizers(&h, "v1", serde_json::Value::Null).await;
        eventually("n1 has no key access left", || no_access(&h, "n1")).await;
        assert_eq!(
            granted(&h, "n2").await,
            names(&["liteio-auth-v3", "liteio-auth-v4"])
        );
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_restarted_controller_takes_back_what_a_gone_volume_left() {
    timeout(LIMIT, async {
        let h = start(test_config()).await;
        h.add_pool(pool("n1", 10 * GIB)).await;
        // A Role and RoleBinding left for a node that stores nothing any more (its last volume
        // went while no controller ran).
        let stale =
            liteio_controller::reconcile::keys::role(NS, "gone", vec!["liteio-auth-old".into()]);
        roles(&h)
            .create(&PostParams::default(), &stale)
            .await
            .unwrap();
        let binding = liteio_controller::reconcile::keys::role_binding(NS, "gone");
        Api::<RoleBinding>::namespaced(h.client.clone(), NS)
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
        // A second controller on the same server: it finds the grant and takes it back.
        h.stop.send_replace(true);
        let (stop, task, _) = another_controller(&h.client, "t1b").await;
        eventually("the stale grant removed", || no_access(&h, "gone")).await;
        stop.send_replace(true);
        timeout(LIMIT, task).await.unwrap().unwrap().unwrap();
    })
    .await
    .unwrap();
}
