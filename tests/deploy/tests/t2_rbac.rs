//! T2: what the ServiceAccounts of deploy/base may do with Secrets, asked of a real
//! kube-apiserver with RBAC on (a SubjectAccessReview, which is what `kubectl auth can-i
//! --as=system:serviceaccount:NS:SA` sends). The RBAC objects of deploy/base are created for
//! real in a fresh namespace (cluster-scoped names get a suffix), so the answers are the
//! server's, not a reading of the YAML. Then the controller's per-node key Roles are applied
//! by the controller's own code acting as the controller's ServiceAccount, and each node's
//! identity (`system:node:<node>`, `kubectl auth can-i --as=system:node:n1
//! --as-group=system:nodes`) is asked about its own and another node's volume. Needs
//! `LITEIO_TEST_KUBECONFIG`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Doc, docs_under};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::Value;

/// `doc` moved from `obnvmf` to `ns`, cluster-scoped names suffixed with `-<ns>`.
fn moved(doc: &Doc, ns: &str) -> Value {
    let mut v = doc.value.clone();
    if v.pointer("/metadata/namespace").is_some() {
        v["metadata"]["namespace"] = Value::from(ns);
    } else {
        let name = doc.name().to_string();
        v["metadata"]["name"] = Value::from(format!("{name}-{ns}"));
    }
    if let Some(subjects) = v.get_mut("subjects").and_then(Value::as_array_mut) {
        for s in subjects {
            if s.get("namespace").is_some() {
                s["namespace"] = Value::from(ns);
            }
        }
    }
    if doc.kind() == "ClusterRoleBinding" {
        let r = v["roleRef"]["name"].as_str().unwrap().to_string();
        v["roleRef"]["name"] = Value::from(format!("{r}-{ns}"));
    }
    v
}

/// The groups a ServiceAccount of `ns` authenticates with.
fn sa_groups(ns: &str) -> Vec<String> {
    vec![
        "system:serviceaccounts".into(),
        format!("system:serviceaccounts:{ns}"),
        "system:authenticated".into(),
    ]
}

/// The groups a kubelet authenticates with.
fn node_groups() -> Vec<String> {
    vec!["system:nodes".into(), "system:authenticated".into()]
}

async fn can(client: &Client, ns: &str, sa: &str, verb: &str, in_ns: &str, name: &str) -> bool {
    can_user(
        client,
        &format!("system:serviceaccount:{ns}:{sa}"),
        sa_groups(ns),
        verb,
        in_ns,
        name,
    )
    .await
}

async fn can_user(
    client: &Client,
    user: &str,
    groups: Vec<String>,
    verb: &str,
    in_ns: &str,
    name: &str,
) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            groups: Some(groups),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(in_ns.into()),
                verb: Some(verb.into()),
                resource: Some("secrets".into()),
                name: (!name.is_empty()).then(|| name.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let answer = api.create(&PostParams::default(), &review).await.unwrap();
    answer.status.is_some_and(|s| s.allowed)
}

/// A client of the kubeconfig at `path` that acts as the ServiceAccount `ns:sa`.
async fn impersonating(path: &str, ns: &str, sa: &str) -> Client {
    let kc = kube::config::Kubeconfig::read_from(path).unwrap();
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{ns}:{sa}"));
    config.auth_info.impersonate_groups = Some(sa_groups(ns));
    Client::try_from(config).unwrap()
}

async fn run(path: &str) {
    let client = liteio_cli::client(Some(std::path::Path::new(path)))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let ns = format!(
        "liteio-t2-rbac-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            % 1_000_000
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut n = Namespace::default();
    n.metadata.name = Some(ns.clone());
    namespaces.create(&PostParams::default(), &n).await.unwrap();
    let pp = PostParams::default();
    let mut cluster_roles = Vec::new();
    let mut cluster_bindings = Vec::new();
    let docs: Vec<Doc> = docs_under("base")
        .into_iter()
        .filter(|d| d.file.contains("rbac-"))
        .collect();
    assert!(docs.len() >= 8, "only {} RBAC documents", docs.len());
    for d in &docs {
        let v = moved(d, &ns);
        match d.kind() {
            "ServiceAccount" => {
                let o: ServiceAccount = serde_json::from_value(v).unwrap();
                Api::<ServiceAccount>::namespaced(client.clone(), &ns)
                    .create(&pp, &o)
                    .await
                    .unwrap();
            }
            "Role" => {
                let o: Role = serde_json::from_value(v).unwrap();
                Api::<Role>::namespaced(client.clone(), &ns)
                    .create(&pp, &o)
                    .await
                    .unwrap();
            }
            "RoleBinding" => {
                let o: RoleBinding = serde_json::from_value(v).unwrap();
                Api::<RoleBinding>::namespaced(client.clone(), &ns)
                    .create(&pp, &o)
                    .await
                    .unwrap();
            }
            "ClusterRole" => {
                let o: ClusterRole = serde_json::from_value(v).unwrap();
                let c = Api::<ClusterRole>::all(client.clone())
                    .create(&pp, &o)
                    .await
                    .unwrap();
                cluster_roles.push(c.metadata.name.unwrap());
            }
            "ClusterRoleBinding" => {
                let o: ClusterRoleBinding = serde_json::from_value(v).unwrap();
                let c = Api::<ClusterRoleBinding>::all(client.clone())
                    .create(&pp, &o)
                    .await
                    .unwrap();
                cluster_bindings.push(c.metadata.name.unwrap());
            }
            other => panic!("{}: unexpected kind {other}", d.what()),
        }
    }
    let key = "liteio-auth-pvc-1";
    let mut wrong = Vec::new();
    for (sa, verb, in_ns, name, want) in [
        // The CSI node never reads a Secret: kubelet hands it the node-stage secret.
        ("liteio-csi-node", "get", ns.as_str(), key, false),
        ("liteio-csi-node", "list", ns.as_str(), "", false),
        // The agent's ServiceAccount (shared by every node's agent) only makes Secrets; it
        // reads and deletes them as its node (below).
        ("liteio-disk-agent", "create", ns.as_str(), "", true),
        ("liteio-disk-agent", "get", ns.as_str(), key, false),
        ("liteio-disk-agent", "delete", ns.as_str(), key, false),
        ("liteio-disk-agent", "list", ns.as_str(), "", false),
        ("liteio-disk-agent", "watch", ns.as_str(), "", false),
        ("liteio-disk-agent", "update", ns.as_str(), key, false),
        ("liteio-disk-agent", "get", "default", key, false),
        ("liteio-disk-agent", "create", "kube-system", "", false),
        // The CSI controller makes them at CreateVolume and deletes them at DeleteVolume.
        ("liteio-csi-controller", "create", ns.as_str(), "", true),
        ("liteio-csi-controller", "get", ns.as_str(), key, true),
        ("liteio-csi-controller", "delete", ns.as_str(), key, true),
        ("liteio-csi-controller", "list", ns.as_str(), "", false),
        ("liteio-csi-controller", "get", "default", key, false),
        // The controller holds what it grants the nodes (RBAC's escalation rule), one named
        // Secret at a time, never a list.
        ("liteio-controller", "get", ns.as_str(), key, true),
        ("liteio-controller", "list", ns.as_str(), "", false),
        ("liteio-controller", "get", "default", key, false),
    ] {
        let got = can(&client, &ns, sa, verb, in_ns, name).await;
        println!(
            "can-i {verb} secrets/{name} -n {in_ns} --as=system:serviceaccount:{ns}:{sa}: {}",
            if got { "yes" } else { "no" }
        );
        if got != want {
            wrong.push(format!(
                "{sa} {verb} secrets in {in_ns}: {got}, want {want}"
            ));
        }
    }
    // Each node's keys, granted by the controller's own code acting as the controller's
    // ServiceAccount with the RBAC of deploy/base (so RBAC's escalation check is the real
    // one): n1 stores pvc-1, n2 stores pvc-2.
    let as_controller = impersonating(path, &ns, "liteio-controller").await;
    let pp_apply = PatchParams::apply("liteio-controller").force();
    for (node, secret) in [("n1", "liteio-auth-pvc-1"), ("n2", "liteio-auth-pvc-2")] {
        let role = liteio_controller::reconcile::keys::role(&ns, node, vec![secret.to_string()]);
        let binding = liteio_controller::reconcile::keys::role_binding(&ns, node);
        let name = liteio_api::naming::node_keys_role(node);
        Api::<Role>::namespaced(as_controller.clone(), &ns)
            .patch(&name, &pp_apply, &Patch::Apply(&role))
            .await
            .unwrap_or_else(|e| panic!("the controller cannot grant {node} its keys: {e}"));
        Api::<RoleBinding>::namespaced(as_controller.clone(), &ns)
            .patch(&name, &pp_apply, &Patch::Apply(&binding))
            .await
            .unwrap_or_else(|e| panic!("the controller cannot bind {node}'s keys: {e}"));
    }
    // The agent's ServiceAccount cannot grant itself anything.
    let as_agent = impersonating(path, &ns, "liteio-disk-agent").await;
    let forged = liteio_controller::reconcile::keys::role(&ns, "n3", vec![key.to_string()]);
    let refused = Api::<Role>::namespaced(as_agent, &ns)
        .patch("liteio-keys-n3", &pp_apply, &Patch::Apply(&forged))
        .await;
    println!(
        "the agent's ServiceAccount applies a key Role: {}",
        match &refused {
            Ok(_) => "allowed".to_string(),
            Err(e) => format!("refused ({e})"),
        }
    );
    if refused.is_ok() {
        wrong.push("the agent's ServiceAccount could write a key Role".into());
    }
    let other = "liteio-auth-pvc-2";
    for (node, verb, name, want) in [
        // Its own volume's Secret: read, add a TLS PSK, delete with the volume.
        ("n1", "get", key, true),
        ("n1", "patch", key, true),
        ("n1", "delete", key, true),
        ("n1", "update", key, false),
        ("n1", "list", "", false),
        ("n1", "watch", "", false),
        // Another node's volume: nothing.
        ("n1", "get", other, false),
        ("n1", "delete", other, false),
        ("n2", "get", other, true),
        ("n2", "get", key, false),
        // A node that stores nothing: nothing.
        ("n3", "get", key, false),
        ("n3", "get", other, false),
    ] {
        let user = liteio_api::naming::node_user(node);
        let got = can_user(&client, &user, node_groups(), verb, &ns, name).await;
        println!(
            "can-i {verb} secrets/{name} -n {ns} --as={user} --as-group=system:nodes: {}",
            if got { "yes" } else { "no" }
        );
        if got != want {
            wrong.push(format!("{user} {verb} secrets/{name}: {got}, want {want}"));
        }
    }
    let dp = DeleteParams::default();
    for b in cluster_bindings {
        let _ = Api::<ClusterRoleBinding>::all(client.clone())
            .delete(&b, &dp)
            .await;
    }
    for r in cluster_roles {
        let _ = Api::<ClusterRole>::all(client.clone())
            .delete(&r, &dp)
            .await;
    }
    let _ = namespaces.delete(&ns, &dp).await;
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[tokio::test]
async fn each_node_reaches_only_its_own_volumes_keys_and_no_service_account_lists_them() {
    let Ok(path) = std::env::var("LITEIO_TEST_KUBECONFIG") else {
        println!("T2 skipped: LITEIO_TEST_KUBECONFIG not set");
        return;
    };
    tokio::time::timeout(Duration::from_secs(120), run(&path))
        .await
        .expect("T2 RBAC check timed out");
}
