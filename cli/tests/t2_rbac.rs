//! T2: what the ServiceAccounts of deploy/base may do with Secrets, asked of a real
//! kube-apiserver with RBAC on (a SubjectAccessReview, which is what `kubectl auth can-i
//! --as=system:serviceaccount:NS:SA` sends). The RBAC objects of deploy/base are created for
//! real in a fresh namespace (cluster-scoped names get a suffix), so the answers are the
//! server's, not a reading of the YAML. Needs `LITEIO_TEST_KUBECONFIG`.
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
use kube::api::{Api, DeleteParams, PostParams};
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

async fn can(client: &Client, ns: &str, sa: &str, verb: &str, in_ns: &str, name: &str) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{ns}:{sa}")),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ]),
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
        // The agent reads, makes and deletes one named Secret at a time, in its namespace.
        ("liteio-disk-agent", "get", ns.as_str(), key, true),
        ("liteio-disk-agent", "create", ns.as_str(), "", true),
        ("liteio-disk-agent", "delete", ns.as_str(), key, true),
        ("liteio-disk-agent", "list", ns.as_str(), "", false),
        ("liteio-disk-agent", "watch", ns.as_str(), "", false),
        ("liteio-disk-agent", "update", ns.as_str(), key, false),
        ("liteio-disk-agent", "get", "default", key, false),
        ("liteio-disk-agent", "get", "kube-system", key, false),
        // The CSI controller makes them at CreateVolume and deletes them at DeleteVolume.
        ("liteio-csi-controller", "create", ns.as_str(), "", true),
        ("liteio-csi-controller", "get", ns.as_str(), key, true),
        ("liteio-csi-controller", "delete", ns.as_str(), key, true),
        ("liteio-csi-controller", "list", ns.as_str(), "", false),
        ("liteio-csi-controller", "get", "default", key, false),
        // The scheduler has no business with keys.
        ("liteio-controller", "get", ns.as_str(), key, false),
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
async fn only_the_agent_and_the_csi_controller_touch_secrets_one_at_a_time() {
    let Ok(path) = std::env::var("LITEIO_TEST_KUBECONFIG") else {
        println!("T2 skipped: LITEIO_TEST_KUBECONFIG not set");
        return;
    };
    tokio::time::timeout(Duration::from_secs(120), run(&path))
        .await
        .expect("T2 RBAC check timed out");
}
