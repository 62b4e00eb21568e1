//! T2: the manifests are accepted by a real kube-apiserver. Every object of deploy/base and
//! deploy/crds (and, when `kubectl` is on PATH, the rendered overlays) goes through a
//! server-side apply with `dryRun=All` and strict field validation; namespaced objects are
//! applied into a fresh namespace so nothing depends on `obnvmf` existing. Kinds the server
//! does not serve (VolumeSnapshotClass without the external-snapshotter CRDs) are reported
//! and left out. Needs `LITEIO_TEST_KUBECONFIG`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Doc, deploy_dir, docs_under};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{
    Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
    ValidationDirective,
};
use kube::{Client, Discovery};
use serde_json::Value;

const MANAGER: &str = "liteio-t2-deploy";
const PRIVILEGED_FORBIDDEN: &str = "privileged: Forbidden: disallowed by cluster policy";

fn gvk(doc: &Doc) -> GroupVersionKind {
    let (group, version) = doc
        .api_version()
        .rsplit_once('/')
        .unwrap_or(("", doc.api_version()));
    GroupVersionKind::gvk(group, version, doc.kind())
}

/// Drops `privileged` from every container of a pod template, and with it what only a
/// privileged container may have (Bidirectional mount propagation becomes HostToContainer).
fn strip_privileged(value: &mut Value) {
    if let Some(cs) = value
        .pointer_mut("/spec/template/spec/containers")
        .and_then(Value::as_array_mut)
    {
        for c in cs {
            if let Some(sc) = c.get_mut("securityContext").and_then(Value::as_object_mut) {
                sc.remove("privileged");
                sc.remove("allowPrivilegeEscalation");
            }
            for m in c
                .get_mut("volumeMounts")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if m["mountPropagation"] == "Bidirectional" {
                    m["mountPropagation"] = Value::from("HostToContainer");
                }
            }
        }
    }
}

struct Outcome {
    applied: usize,
    not_served: Vec<String>,
    notes: Vec<String>,
    failures: Vec<String>,
}

async fn apply_all(client: &Client, discovery: &Discovery, ns: &str, docs: &[Doc]) -> Outcome {
    let mut o = Outcome {
        applied: 0,
        not_served: Vec::new(),
        notes: Vec::new(),
        failures: Vec::new(),
    };
    let mut pp = PatchParams::apply(MANAGER).force();
    pp.dry_run = true;
    pp.field_validation = Some(ValidationDirective::Strict);
    for doc in docs {
        if doc.file.ends_with("kustomization.yaml") || doc.value.is_array() {
            continue;
        }
        let Some((ar, caps)) = discovery.resolve_gvk(&gvk(doc)) else {
            o.not_served
                .push(format!("{} ({} not served)", doc.what(), doc.api_version()));
            continue;
        };
        let namespaced = caps.scope == kube::discovery::Scope::Namespaced;
        let mut value = doc.value.clone();
        if namespaced {
            value["metadata"]["namespace"] = Value::from(ns);
        }
        let api: Api<DynamicObject> = if namespaced {
            Api::namespaced_with(client.clone(), ns, &ar)
        } else {
            Api::all_with(client.clone(), &ar)
        };
        let name = doc.name().to_string();
        let mut result = api.patch(&name, &pp, &Patch::Apply(&value)).await;
        if let Err(kube::Error::Api(s)) = &result
            && s.message.contains(PRIVILEGED_FORBIDDEN)
        {
            // The server runs without --allow-privileged; check everything else.
            o.notes.push(format!(
                "{}: server refuses privileged containers (no --allow-privileged); validated without",
                doc.what()
            ));
            strip_privileged(&mut value);
            result = api.patch(&name, &pp, &Patch::Apply(&value)).await;
        }
        match result {
            Ok(_) => o.applied += 1,
            Err(kube::Error::Api(s)) => o.failures.push(format!("{}: {}", doc.what(), s.message)),
            Err(e) => o.failures.push(format!("{}: {e}", doc.what())),
        }
    }
    o
}

fn rendered_overlay(overlay: &str) -> Option<Vec<Doc>> {
    let dir = deploy_dir().join("overlays").join(overlay);
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "{overlay}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tmp = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(tmp.path(), &out.stdout).unwrap();
    let mut docs = common::read_docs(tmp.path());
    for d in &mut docs {
        d.file = format!("overlays/{overlay} (rendered)");
    }
    Some(docs)
}

async fn run(path: &str) {
    let client = liteio_cli::client(Some(std::path::Path::new(path)))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let ns_name = format!(
        "liteio-t2-deploy-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            % 100_000
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut ns = Namespace::default();
    ns.metadata.name = Some(ns_name.clone());
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();

    let mut sets: Vec<(String, Vec<Doc>)> = vec![
        ("deploy/crds".into(), docs_under("crds")),
        ("deploy/base".into(), docs_under("base")),
    ];
    // monitoring: its ServiceMonitors, PodMonitor and PrometheusRule are noted as not
    // served where the Prometheus operator's CRDs are not installed.
    for overlay in ["spdk-aio-lvs", "spdk-nvme", "lvm", "file", "monitoring"] {
        match rendered_overlay(overlay) {
            Some(docs) => sets.push((format!("deploy/overlays/{overlay}"), docs)),
            None => println!("note: kubectl not found; overlay {overlay} not rendered"),
        }
    }
    let mut failures = Vec::new();
    for (set, docs) in &sets {
        let o = apply_all(&client, &discovery, &ns_name, docs).await;
        println!(
            "{set}: {} objects accepted (server-side apply, dryRun=All, fieldValidation=Strict)",
            o.applied
        );
        for n in o.not_served.iter().chain(&o.notes) {
            println!("  note: {n}");
        }
        assert!(o.applied > 0, "{set}: nothing applied");
        failures.extend(o.failures);
    }
    // The namespace stays Terminating on a server without kube-controller-manager; its
    // name is unique, so that is harmless.
    let _ = namespaces.delete(&ns_name, &DeleteParams::default()).await;
    assert!(failures.is_empty(), "refused:\n{}", failures.join("\n"));
}

#[tokio::test]
async fn manifests_are_accepted_by_a_real_apiserver() {
    let Ok(path) = std::env::var("LITEIO_TEST_KUBECONFIG") else {
        println!("T2 skipped: LITEIO_TEST_KUBECONFIG not set");
        return;
    };
    tokio::time::timeout(Duration::from_secs(300), run(&path))
        .await
        .expect("T2 manifest apply timed out");
}
