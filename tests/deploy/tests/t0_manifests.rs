//! T0: every manifest under deploy/ (base, overlays, CRDs, the Prometheus operator's objects)
//! parses into its Kubernetes API type with no unknown field, the configs it carries are valid
//! for the agent and the controller, every image is pinned, the workloads have the shape
//! LiteIO needs, every component is scraped (pod annotations for a plain Prometheus, a
//! ServiceMonitor or PodMonitor for the operator), and each component's RBAC covers what its
//! code calls (a hand-written table below) and nothing else. The plain Prometheus files of
//! deploy/prometheus/ (rules and their unit tests) are checked by t0_alert_rules.rs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::prometheus::{self, MONITORING_API, PodMonitor, PrometheusRule, ServiceMonitor};
use common::{Doc, deploy_dir, docs_under};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodSpec, Service, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

const NS: &str = "obnvmf";
const DRIVER: &str = "antstor.csi.alipay.com";
const AGENT_METRICS_PORT: u16 = 9810;

/// Paths present in `orig` but absent after the typed round trip: fields the type does not
/// know (a misspelt or misplaced key). `null` values are ignored.
fn unknown_fields(orig: &Value, back: &Value, path: &str, out: &mut Vec<String>) {
    match (orig, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                if v.is_null() {
                    continue;
                }
                let p = format!("{path}.{k}");
                match b.get(k) {
                    None => out.push(p),
                    Some(bv) => unknown_fields(v, bv, &p, out),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                unknown_fields(x, y, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Deserializes into `T` (the error names the field) and refuses unknown fields.
fn strict<T: DeserializeOwned + Serialize>(doc: &Doc) -> T {
    let typed: T = serde_path_to_error::deserialize(doc.value.clone())
        .unwrap_or_else(|e| panic!("{}: {} at {}", doc.what(), e.inner(), e.path()));
    let back = serde_json::to_value(&typed).unwrap();
    let mut unknown = Vec::new();
    unknown_fields(&doc.value, &back, "", &mut unknown);
    assert!(
        unknown.is_empty(),
        "{}: unknown fields {unknown:?}",
        doc.what()
    );
    typed
}

/// Only these keys, and `metadata` typed.
fn generic(doc: &Doc, allowed: &[&str]) {
    let obj = doc
        .value
        .as_object()
        .unwrap_or_else(|| panic!("{}: not a mapping", doc.what()));
    for k in obj.keys() {
        assert!(
            allowed.contains(&k.as_str()),
            "{}: unknown field .{k} (allowed: {allowed:?})",
            doc.what()
        );
    }
    if let Some(meta) = obj.get("metadata") {
        let m = Doc {
            value: meta.clone(),
            ..doc.clone()
        };
        let _: ObjectMeta = strict(&m);
    }
}

/// Every object of deploy/, typed.
#[derive(Default)]
struct Objects {
    docs: Vec<Doc>,
    deployments: Vec<(Doc, Deployment)>,
    daemonsets: Vec<(Doc, DaemonSet)>,
    config_maps: Vec<(Doc, ConfigMap)>,
    service_accounts: Vec<(Doc, ServiceAccount)>,
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    storage_classes: Vec<StorageClass>,
    csi_drivers: Vec<CSIDriver>,
    crds: Vec<CustomResourceDefinition>,
    snapshot_classes: Vec<Doc>,
    services: Vec<(Doc, Service)>,
    service_monitors: Vec<(Doc, ServiceMonitor)>,
    pod_monitors: Vec<(Doc, PodMonitor)>,
    prometheus_rules: Vec<(Doc, PrometheusRule)>,
}

/// The files of deploy/prometheus/ that are Prometheus's own formats, not Kubernetes
/// objects (t0_alert_rules.rs checks them).
const PROMETHEUS_FILES: [&str; 2] = [
    "prometheus/liteio-rules.yaml",
    "prometheus/liteio-rules.test.yaml",
];

fn check_kustomization(doc: &Doc) {
    generic(
        doc,
        &[
            "apiVersion",
            "kind",
            "namespace",
            "labels",
            "resources",
            "patches",
            "images",
            "components",
            "configMapGenerator",
        ],
    );
    assert_eq!(doc.api_version(), "kustomize.config.k8s.io/v1beta1");
    let dir = deploy_dir().join(&doc.file);
    let dir = dir.parent().unwrap();
    let mut refs: Vec<String> = Vec::new();
    for r in doc.value["resources"].as_array().into_iter().flatten() {
        refs.push(r.as_str().unwrap().to_string());
    }
    for p in doc.value["patches"].as_array().into_iter().flatten() {
        for k in p.as_object().unwrap().keys() {
            assert!(
                ["path", "target", "patch", "options"].contains(&k.as_str()),
                "{}: patch key {k}",
                doc.what()
            );
        }
        if let Some(path) = p["path"].as_str() {
            refs.push(path.to_string());
        }
    }
    for r in refs {
        assert!(dir.join(&r).exists(), "{}: {r} does not exist", doc.what());
    }
    for img in doc.value["images"].as_array().into_iter().flatten() {
        assert!(
            img["name"].is_string() && img["newTag"].is_string(),
            "{}: image {img}",
            doc.what()
        );
    }
}

/// A JSON 6902 patch file (a YAML sequence of operations).
fn check_json_patch(doc: &Doc) {
    for (i, op) in doc.value.as_array().unwrap().iter().enumerate() {
        let o = op["op"].as_str().unwrap_or("");
        assert!(
            ["add", "remove", "replace", "test", "move", "copy"].contains(&o),
            "{}[{i}]: op {o:?}",
            doc.file
        );
        assert!(
            op["path"].as_str().is_some_and(|p| p.starts_with('/')),
            "{}[{i}]: path",
            doc.file
        );
        for k in op.as_object().unwrap().keys() {
            assert!(
                ["op", "path", "value", "from"].contains(&k.as_str()),
                "{}[{i}]: key {k}",
                doc.file
            );
        }
    }
}

fn load() -> Objects {
    let mut o = Objects::default();
    for doc in docs_under("") {
        if PROMETHEUS_FILES.contains(&doc.file.as_str()) {
            continue;
        }
        if doc.file.ends_with("kustomization.yaml") {
            check_kustomization(&doc);
            continue;
        }
        if doc.value.is_array() {
            check_json_patch(&doc);
            continue;
        }
        match (doc.api_version(), doc.kind()) {
            ("v1", "Namespace") => {
                let _: Namespace = strict(&doc);
            }
            ("v1", "Service") => o.services.push((doc.clone(), strict(&doc))),
            (MONITORING_API, "ServiceMonitor") => {
                o.service_monitors.push((doc.clone(), strict(&doc)))
            }
            (MONITORING_API, "PodMonitor") => o.pod_monitors.push((doc.clone(), strict(&doc))),
            (MONITORING_API, "PrometheusRule") => {
                o.prometheus_rules.push((doc.clone(), strict(&doc)))
            }
            ("v1", "ServiceAccount") => o.service_accounts.push((doc.clone(), strict(&doc))),
            ("v1", "ConfigMap") => o.config_maps.push((doc.clone(), strict(&doc))),
            ("apps/v1", "Deployment") => o.deployments.push((doc.clone(), strict(&doc))),
            ("apps/v1", "DaemonSet") => o.daemonsets.push((doc.clone(), strict(&doc))),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => o.cluster_roles.push(strict(&doc)),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                o.cluster_role_bindings.push(strict(&doc))
            }
            ("rbac.authorization.k8s.io/v1", "Role") => o.roles.push(strict(&doc)),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => o.role_bindings.push(strict(&doc)),
            ("storage.k8s.io/v1", "StorageClass") => o.storage_classes.push(strict(&doc)),
            ("storage.k8s.io/v1", "CSIDriver") => o.csi_drivers.push(strict(&doc)),
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => o.crds.push(strict(&doc)),
            ("storage.k8s.io/v1", "VolumeAttributesClass") => {
                generic(
                    &doc,
                    &["apiVersion", "kind", "metadata", "driverName", "parameters"],
                );
                // Only keys ControllerModifyVolume takes, with values it accepts.
                assert_eq!(
                    doc.value["driverName"].as_str(),
                    Some("antstor.csi.alipay.com"),
                    "{}",
                    doc.what()
                );
                let params: std::collections::HashMap<String, String> =
                    serde_json::from_value(doc.value["parameters"].clone())
                        .unwrap_or_else(|e| panic!("{}: parameters: {e}", doc.what()));
                for k in params.keys() {
                    assert!(
                        liteio_api::qos::VolumeQos::is_param(k),
                        "{}: {k} is not a QoS parameter",
                        doc.what()
                    );
                }
                liteio_api::qos::VolumeQos::from_params(&params, Default::default())
                    .unwrap_or_else(|e| panic!("{}: {e}", doc.what()));
            }
            ("snapshot.storage.k8s.io/v1", "VolumeSnapshotClass") => {
                generic(
                    &doc,
                    &[
                        "apiVersion",
                        "kind",
                        "metadata",
                        "driver",
                        "deletionPolicy",
                        "parameters",
                    ],
                );
                o.snapshot_classes.push(doc.clone());
            }
            (v, k) => panic!("{}: unexpected kind {v} {k}", doc.what()),
        }
        o.docs.push(doc);
    }
    o
}

fn base_only<T: Clone>(items: &[(Doc, T)]) -> Vec<T> {
    items
        .iter()
        .filter(|(d, _)| d.file.starts_with("base/"))
        .map(|(_, t)| t.clone())
        .collect()
}

#[test]
fn every_manifest_parses_strictly() {
    let o = load();
    assert_eq!(o.crds.len(), 6, "deploy/crds");
    assert_eq!(base_only(&o.deployments).len(), 2);
    assert_eq!(base_only(&o.daemonsets).len(), 2);
    assert_eq!(o.storage_classes.len(), 3);
    assert_eq!(o.csi_drivers.len(), 1);
    assert_eq!(o.snapshot_classes.len(), 1);
    assert_eq!(o.service_monitors.len(), 2, "ServiceMonitors");
    assert_eq!(o.pod_monitors.len(), 1, "PodMonitors");
    assert_eq!(o.prometheus_rules.len(), 1, "PrometheusRules");
    for overlay in ["spdk-aio-lvs", "spdk-nvme", "lvm", "file", "monitoring"] {
        assert!(
            deploy_dir()
                .join("overlays")
                .join(overlay)
                .join("kustomization.yaml")
                .exists(),
            "overlay {overlay}"
        );
    }
    // Namespaced objects name their namespace, so the files also apply without kustomize.
    for d in &o.docs {
        let cluster_scoped = matches!(
            d.kind(),
            "Namespace"
                | "ClusterRole"
                | "ClusterRoleBinding"
                | "StorageClass"
                | "CSIDriver"
                | "CustomResourceDefinition"
                | "VolumeSnapshotClass"
                | "VolumeAttributesClass"
        );
        let ns = d
            .value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str);
        if cluster_scoped {
            assert_eq!(ns, None, "{}: cluster-scoped with a namespace", d.what());
        } else {
            assert_eq!(ns, Some(NS), "{}: namespace", d.what());
        }
    }
}

/// Each base workload: its name, pod template labels and annotations, and pod spec.
fn base_templates(o: &Objects) -> Vec<(String, ObjectMeta, PodSpec)> {
    let mut out = Vec::new();
    for (d, dep) in o
        .deployments
        .iter()
        .filter(|(d, _)| d.file.starts_with("base/"))
    {
        let t = dep.spec.clone().unwrap().template;
        out.push((d.name().to_string(), t.metadata.unwrap(), t.spec.unwrap()));
    }
    for (d, ds) in o
        .daemonsets
        .iter()
        .filter(|(d, _)| d.file.starts_with("base/"))
    {
        let t = ds.spec.clone().unwrap().template;
        out.push((d.name().to_string(), t.metadata.unwrap(), t.spec.unwrap()));
    }
    out
}

/// The container of `spec` that declares `port`, and the port's name.
fn container_port(spec: &PodSpec, port: i32) -> Option<(&Container, String)> {
    spec.containers.iter().find_map(|c| {
        c.ports
            .iter()
            .flatten()
            .find(|p| p.container_port == port)
            .map(|p| (c, p.name.clone().unwrap_or_default()))
    })
}

#[test]
fn every_component_is_scraped() {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let o = load();
    let templates = base_templates(&o);
    assert_eq!(
        templates.len(),
        4,
        "agent, controller, CSI controller and node"
    );
    for (name, meta, spec) in &templates {
        // A plain Prometheus: the pod annotations name a port the pod serves /metrics on.
        let ann = meta.annotations.clone().unwrap_or_default();
        let get = |k: &str| {
            ann.get(k)
                .unwrap_or_else(|| panic!("{name}: no annotation {k}"))
                .as_str()
        };
        assert_eq!(get("prometheus.io/scrape"), "true", "{name}");
        assert_eq!(get("prometheus.io/path"), "/metrics", "{name}");
        let port: i32 = get("prometheus.io/port")
            .parse()
            .unwrap_or_else(|e| panic!("{name}: prometheus.io/port: {e}"));
        let (c, port_name) = container_port(spec, port)
            .unwrap_or_else(|| panic!("{name}: no container declares port {port}"));
        let serves = if name == "liteio-disk-agent" {
            // The agent's address is in its config (checked by the configs test).
            port == i32::from(AGENT_METRICS_PORT)
        } else {
            c.args
                .iter()
                .flatten()
                .any(|a| *a == format!("--metrics-addr=0.0.0.0:{port}"))
        };
        assert!(
            serves,
            "{name}: {} does not serve metrics on {port}",
            c.name
        );

        // The Prometheus operator: exactly one monitor reaches that port.
        let labels = meta.labels.clone().unwrap_or_default();
        let mut monitors = Vec::new();
        for (d, pm) in &o.pod_monitors {
            if prometheus::selects(&pm.spec.selector, &labels)
                && pm
                    .spec
                    .pod_metrics_endpoints
                    .iter()
                    .any(|e| e.port == port_name)
            {
                assert!(labels.contains_key(&pm.spec.job_label), "{}", d.what());
                monitors.push(d.what());
            }
        }
        for (d, sm) in &o.service_monitors {
            for (_, svc) in o
                .services
                .iter()
                .filter(|(sd, _)| sd.file.starts_with("base/"))
            {
                let svc_labels = svc.metadata.labels.clone().unwrap_or_default();
                let svc_spec = svc.spec.clone().unwrap_or_default();
                let routes_here = svc_spec
                    .selector
                    .as_ref()
                    .is_some_and(|sel| sel.iter().all(|(k, v)| labels.get(k) == Some(v)));
                if !routes_here || !prometheus::selects(&sm.spec.selector, &svc_labels) {
                    continue;
                }
                let reaches = sm.spec.endpoints.iter().any(|e| {
                    svc_spec.ports.iter().flatten().any(|p| {
                        p.name.as_deref() == Some(e.port.as_str())
                            && match &p.target_port {
                                Some(IntOrString::String(n)) => *n == port_name,
                                Some(IntOrString::Int(n)) => *n == port,
                                None => p.port == port,
                            }
                    })
                });
                if reaches {
                    assert!(svc_labels.contains_key(&sm.spec.job_label), "{}", d.what());
                    monitors.push(d.what());
                }
            }
        }
        assert_eq!(monitors.len(), 1, "{name}: scraped by {monitors:?}");
    }
    for (d, ns, endpoints) in o
        .service_monitors
        .iter()
        .map(|(d, m)| (d, &m.spec.namespace_selector, &m.spec.endpoints))
        .chain(
            o.pod_monitors
                .iter()
                .map(|(d, m)| (d, &m.spec.namespace_selector, &m.spec.pod_metrics_endpoints)),
        )
    {
        assert_eq!(ns.match_names, [NS], "{}", d.what());
        assert!(!endpoints.is_empty(), "{}", d.what());
        for e in endpoints {
            assert_eq!(e.path, "/metrics", "{}", d.what());
        }
    }
}

#[test]
fn strictness_catches_a_misspelt_monitor_field() {
    let doc = Doc {
        file: "inline".into(),
        index: 0,
        value: serde_json::json!({
            "apiVersion": MONITORING_API, "kind": "ServiceMonitor",
            "metadata": {"name": "x", "namespace": NS},
            "spec": {
                "jobLabel": "app", "selector": {}, "namespaceSelector": {"matchNames": [NS]},
                "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s",
                               "honourLabels": true}]
            }
        }),
    };
    let caught = std::panic::catch_unwind(|| {
        let _: ServiceMonitor = strict(&doc);
    });
    assert!(caught.is_err(), "endpoints[0].honourLabels accepted");
}

#[test]
fn strictness_catches_a_misspelt_field() {
    let doc = Doc {
        file: "inline".into(),
        index: 0,
        value: serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "namespace": NS, "lables": {"a": "b"}},
            "data": {}
        }),
    };
    let caught = std::panic::catch_unwind(|| {
        let _: ConfigMap = strict(&doc);
    });
    assert!(caught.is_err(), "metadata.lables accepted");
}

/// Known keys of the controller config (its loader ignores unknown keys, so this test does
/// not): top level and `scheduler`, `liveness`, `leaderElection`, `metaSync`.
fn controller_keys_known(text: &str, what: &str) {
    let v: Value = serde_yaml::from_str(text).unwrap();
    let sections: BTreeMap<&str, &[&str]> = BTreeMap::from([
        (
            "scheduler",
            &[
                "filters",
                "priorities",
                "maxRemoteVolumeCount",
                "remoteIgnoreAnnoSelector",
                "lockSchedConfig",
                "minLocalStoragePct",
                "nodeReservations",
                "nodeCacheSelector",
                "seed",
                "thinOvercommitRatio",
                "poolOvercommitRatios",
            ][..],
        ),
        (
            "liveness",
            &[
                "unknownAfter",
                "offlineAfter",
                "tick",
                "deadPoolDeletionGrace",
                "vanishedPoolGrace",
            ][..],
        ),
        (
            "leaderElection",
            &["leaseName", "leaseDuration", "renewDeadline", "retryPeriod"][..],
        ),
        ("metaSync", &["sqlitePath", "postgresUrl", "cluster"][..]),
        ("pluginConfigs", &[][..]),
    ]);
    for (k, body) in v.as_object().unwrap() {
        let keys = sections
            .get(k.as_str())
            .unwrap_or_else(|| panic!("{what}: unknown controller config key {k}"));
        if k == "pluginConfigs" {
            continue;
        }
        for sub in body.as_object().unwrap().keys() {
            assert!(
                keys.contains(&sub.as_str()),
                "{what}: unknown key {k}.{sub}"
            );
        }
    }
}

/// Where the deployed agents keep their export record: under the `/var/lib/liteio` host path.
const EXPORT_RECORD_DIR: &str = "/var/lib/liteio/exports";

#[test]
fn configs_are_valid_for_the_agent_and_the_controller() {
    let o = load();
    let mut agent_configs = 0;
    let mut controller_configs = 0;
    let mut modes = BTreeSet::new();
    for (doc, cm) in &o.config_maps {
        let data = cm.data.clone().unwrap_or_default();
        if let Some(text) = data.get("agent-config.yaml") {
            let cfg = liteio_agent::config::Config::from_yaml(text)
                .unwrap_or_else(|e| panic!("{}: agent config: {e}", doc.what()));
            let metrics = cfg.metrics.listen_address.unwrap_or_else(|| {
                panic!(
                    "{}: metrics.listenAddress missing (probes use it)",
                    doc.what()
                )
            });
            assert_eq!(metrics.port(), AGENT_METRICS_PORT, "{}", doc.what());
            // A restart serves the node's exports from its record, kept on the host.
            assert_eq!(
                cfg.nvmf.export_record_dir.as_deref(),
                Some(std::path::Path::new(EXPORT_RECORD_DIR)),
                "{}",
                doc.what()
            );
            modes.insert(cfg.storage.pooling.mode.to_string());
            agent_configs += 1;
        }
        if let Some(text) = data.get("config.yaml") {
            liteio_controller::Config::parse(text)
                .unwrap_or_else(|e| panic!("{}: controller config: {e}", doc.what()));
            controller_keys_known(text, &doc.what());
            controller_configs += 1;
        }
    }
    assert_eq!(agent_configs, 5, "base + 4 overlays");
    assert_eq!(controller_configs, 5, "base + 4 overlays");
    assert_eq!(
        modes.into_iter().collect::<Vec<_>>(),
        ["File", "KernelLVM", "SpdkLVStore"]
    );
}

fn containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
}

fn pod_specs(o: &Objects) -> Vec<(String, PodSpec)> {
    let mut out = Vec::new();
    for (d, dep) in &o.deployments {
        out.push((d.what(), dep.spec.clone().unwrap().template.spec.unwrap()));
    }
    for (d, ds) in &o.daemonsets {
        out.push((d.what(), ds.spec.clone().unwrap().template.spec.unwrap()));
    }
    out
}

#[test]
fn every_image_is_pinned() {
    let o = load();
    let mut seen = 0;
    for (what, spec) in pod_specs(&o) {
        for c in containers(&spec) {
            let image = c.image.clone().unwrap_or_default();
            let (repo, tag) = image
                .rsplit_once(':')
                .filter(|(_, t)| !t.contains('/'))
                .unwrap_or_else(|| panic!("{what}/{}: image {image:?} has no tag", c.name));
            if repo == "liteio" {
                // Ours: parameterised through the kustomization's `images:`.
                assert_eq!(tag, "latest", "{what}");
            } else {
                assert!(
                    repo.starts_with("registry.k8s.io/sig-storage/"),
                    "{what}: {image}"
                );
                let v = tag.strip_prefix('v').unwrap_or("");
                let parts: Vec<&str> = v.split('.').collect();
                assert!(
                    parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok()),
                    "{what}: sidecar {image} is not pinned to a release vX.Y.Z"
                );
            }
            seen += 1;
        }
    }
    assert!(seen >= 10, "{seen} containers");
}

fn find_container<'a>(spec: &'a PodSpec, name: &str) -> &'a Container {
    spec.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("container {name}"))
}

fn host_path<'a>(spec: &'a PodSpec, path: &str) -> Option<&'a str> {
    spec.volumes.iter().flatten().find_map(|v| {
        v.host_path
            .as_ref()
            .filter(|h| h.path == path)
            .map(|_| v.name.as_str())
    })
}

fn mount<'a>(c: &'a Container, volume: &str) -> &'a k8s_openapi::api::core::v1::VolumeMount {
    c.volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume)
        .unwrap_or_else(|| panic!("{}: no mount of {volume}", c.name))
}

fn node_id_from_downward_api(c: &Container) -> bool {
    c.env.iter().flatten().any(|e| {
        e.name == "NODE_ID"
            && e.value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .is_some_and(|f| f.field_path == "spec.nodeName")
    })
}

#[test]
fn workloads_have_the_shape_liteio_needs() {
    let o = load();
    let ds = |name: &str| {
        o.daemonsets
            .iter()
            .find(|(d, _)| d.file.starts_with("base/") && d.name() == name)
            .map(|(_, ds)| ds.spec.clone().unwrap().template.spec.unwrap())
            .unwrap_or_else(|| panic!("DaemonSet {name}"))
    };
    let dep = |name: &str| {
        o.deployments
            .iter()
            .find(|(d, _)| d.file.starts_with("base/") && d.name() == name)
            .map(|(_, d)| d.spec.clone().unwrap().template.spec.unwrap())
            .unwrap_or_else(|| panic!("Deployment {name}"))
    };

    // disk-agent
    let agent = ds("liteio-disk-agent");
    assert_eq!(agent.host_network, Some(true));
    let c = find_container(&agent, "disk-agent");
    assert_eq!(
        c.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );
    let args = c.args.clone().unwrap_or_default();
    assert!(
        args.contains(&"--config=/config/agent-config.yaml".to_string()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--node-id=$(NODE_ID)".to_string()),
        "{args:?}"
    );
    assert!(node_id_from_downward_api(c));
    let res = c.resources.clone().unwrap();
    assert!(res.requests.unwrap().contains_key("hugepages-2Mi"));
    assert!(res.limits.unwrap().contains_key("hugepages-2Mi"));
    assert!(agent.volumes.iter().flatten().any(|v| {
        v.empty_dir
            .as_ref()
            .is_some_and(|e| e.medium.as_deref() == Some("HugePages"))
    }));
    for p in ["/dev", "/etc/nvme", "/local-storage", "/var/lib/liteio"] {
        let v = host_path(&agent, p).unwrap_or_else(|| panic!("agent host path {p}"));
        mount(c, v);
    }
    // The node's own identity, for its volumes' keys: the kubeconfig the flag names is the
    // host's, mounted read-only at the same path, and so are the credentials it refers to.
    let keys = args
        .iter()
        .find_map(|a| a.strip_prefix("--keys-kubeconfig="))
        .expect("--keys-kubeconfig");
    for p in [keys, "/var/lib/kubelet/pki"] {
        let v = host_path(&agent, p).unwrap_or_else(|| panic!("agent host path {p}"));
        let m = mount(c, v);
        assert_eq!(m.mount_path, p);
        assert_eq!(m.read_only, Some(true), "{p} mounted writable");
    }
    let cfg = agent
        .volumes
        .iter()
        .flatten()
        .find(|v| {
            v.config_map
                .as_ref()
                .is_some_and(|m| m.name == "liteio-agent-config")
        })
        .expect("agent config volume");
    assert_eq!(mount(c, &cfg.name).mount_path, "/config");
    for probe in [&c.liveness_probe, &c.readiness_probe] {
        let port = probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .port
            .clone();
        assert_eq!(
            port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(
                AGENT_METRICS_PORT.into()
            )
        );
    }

    // CSI node
    let node = ds("liteio-csi-node");
    let drv = find_container(&node, "csi-driver");
    assert_eq!(
        drv.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );
    let args = drv.args.clone().unwrap_or_default();
    assert!(
        args.contains(&"--mode=node".to_string())
            && args.contains(&"--endpoint=unix:///csi/csi.sock".to_string())
    );
    assert!(node_id_from_downward_api(drv));
    let kubelet = host_path(&node, "/var/lib/kubelet").expect("kubelet dir");
    assert_eq!(
        mount(drv, kubelet).mount_propagation.as_deref(),
        Some("Bidirectional")
    );
    for p in ["/dev", "/etc/nvme"] {
        mount(
            drv,
            host_path(&node, p).unwrap_or_else(|| panic!("csi node host path {p}")),
        );
    }
    let plugin =
        host_path(&node, "/var/lib/kubelet/plugins/antstor.csi.alipay.com").expect("plugin dir");
    let reg = host_path(&node, "/var/lib/kubelet/plugins_registry").expect("registry dir");
    let registrar = find_container(&node, "node-driver-registrar");
    mount(registrar, plugin);
    mount(registrar, reg);
    assert!(registrar.args.iter().flatten().any(|a| a
        == "--kubelet-registration-path=/var/lib/kubelet/plugins/antstor.csi.alipay.com/csi.sock"));

    // controller
    let ctl = dep("node-disk-controller");
    let c = find_container(&ctl, "controller");
    let args = c.args.clone().unwrap_or_default();
    assert!(args.contains(&"--leader-elect".to_string()), "{args:?}");
    assert!(
        args.contains(&"--config=/controller-config/config.yaml".to_string()),
        "{args:?}"
    );
    assert!(c.liveness_probe.is_some() && c.readiness_probe.is_some());

    // CSI controller
    let csi = dep("liteio-csi-controller");
    let args = find_container(&csi, "csi-driver")
        .args
        .clone()
        .unwrap_or_default();
    assert!(args.contains(&"--mode=controller".to_string()), "{args:?}");
    let prov = find_container(&csi, "csi-provisioner")
        .args
        .clone()
        .unwrap_or_default();
    for a in ["--extra-create-metadata", "--feature-gates=Topology=true"] {
        assert!(prov.contains(&a.to_string()), "{prov:?}");
    }
    for name in [
        "csi-attacher",
        "csi-resizer",
        "csi-snapshotter",
        "liveness-probe",
    ] {
        find_container(&csi, name);
    }

    // Every service account and config map a workload names exists.
    let sas: BTreeSet<String> = o
        .service_accounts
        .iter()
        .map(|(d, _)| d.name().to_string())
        .collect();
    let cms: BTreeSet<String> = o
        .config_maps
        .iter()
        .map(|(d, _)| d.name().to_string())
        .collect();
    for (what, spec) in pod_specs(&o) {
        let sa = spec.service_account_name.clone().unwrap_or_default();
        assert!(sas.contains(&sa), "{what}: service account {sa:?}");
        for v in spec.volumes.iter().flatten() {
            if let Some(cm) = &v.config_map {
                assert!(cms.contains(&cm.name), "{what}: config map {}", cm.name);
            }
        }
    }
}

#[test]
fn storage_objects_match_liteio() {
    let o = load();
    let d = &o.csi_drivers[0];
    assert_eq!(d.metadata.name.as_deref(), Some(DRIVER));
    // Unlike LiteIO's (false): ControllerPublishVolume records the one node a volume is used
    // on and moves its consumer there (csi-attacher).
    assert_eq!(d.spec.attach_required, Some(true));
    assert_eq!(d.spec.pod_info_on_mount, Some(true));
    assert_eq!(d.spec.fs_group_policy.as_deref(), Some("File"));
    // kubelet republishes mounted volumes with the current node-publish Secret: how rotated
    // keys reach a connected host.
    assert_eq!(d.spec.requires_republish, Some(true));
    let mut names = Vec::new();
    for sc in &o.storage_classes {
        let name = sc.metadata.name.clone().unwrap();
        assert_eq!(sc.provisioner, DRIVER);
        assert_eq!(sc.allow_volume_expansion, Some(true), "{name}");
        assert_eq!(
            sc.volume_binding_mode.as_deref(),
            Some("WaitForFirstConsumer")
        );
        assert_eq!(sc.reclaim_policy.as_deref(), Some("Delete"));
        let params = sc.parameters.clone().unwrap_or_default();
        assert_eq!(
            params.get("fsType").map(String::as_str),
            Some("xfs"),
            "{name}"
        );
        let advice = params.get(liteio_api::keys::SC_PARAM_POSITION_ADVICE);
        // Classes whose volumes can be attached over NVMe/TCP pass the volume's
        // authentication Secret to NodeStageVolume (to connect) and to NodePublishVolume (to
        // refresh rotated keys at each republish); must-local volumes never are.
        for (what, name_param, ns_param) in [
            (
                "node-stage",
                liteio_api::auth::SC_PARAM_NODE_STAGE_SECRET_NAME,
                liteio_api::auth::SC_PARAM_NODE_STAGE_SECRET_NAMESPACE,
            ),
            (
                "node-publish",
                liteio_api::auth::SC_PARAM_NODE_PUBLISH_SECRET_NAME,
                liteio_api::auth::SC_PARAM_NODE_PUBLISH_SECRET_NAMESPACE,
            ),
        ] {
            let secret = params.get(name_param);
            let secret_ns = params.get(ns_param);
            if name == "antstor-nvmf-mustlocal" {
                assert_eq!((secret, secret_ns), (None, None), "{name}: {what}");
            } else {
                assert_eq!(
                    secret.map(String::as_str),
                    Some(
                        format!("{}${{pv.name}}", liteio_api::naming::AUTH_SECRET_PREFIX).as_str()
                    ),
                    "{name}: {name_param}"
                );
                assert_eq!(
                    secret_ns.map(String::as_str),
                    Some(liteio_api::keys::DEFAULT_NAMESPACE),
                    "{name}: {ns_param}"
                );
            }
        }
        match name.as_str() {
            "antstor-nvmf" => assert_eq!(advice, None),
            "antstor-nvmf-mustlocal" => assert_eq!(advice.map(String::as_str), Some("MustLocal")),
            "antstor-nvmf-mustremote" => {
                assert_eq!(advice.map(String::as_str), Some("MustRemote"))
            }
            other => panic!("unexpected StorageClass {other}"),
        }
        names.push(name);
    }
    assert_eq!(names.len(), 3);
    let snap = &o.snapshot_classes[0].value;
    assert_eq!(snap["metadata"]["name"], "antstor-snapclass");
    assert_eq!(snap["driver"], DRIVER);
    assert_eq!(snap["deletionPolicy"], "Delete");
}

/// Where a permission must hold: the LiteIO namespace is enough, or cluster-wide (cluster
/// resources, or namespaced resources in users' namespaces such as PVCs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scope {
    Ns,
    Cluster,
}

use Scope::{Cluster, Ns};

const LITEIO: &str = "volume.antstor.alipay.com";
const CORE: &str = "";
const COORD: &str = "coordination.k8s.io";
const STORAGE: &str = "storage.k8s.io";
const SNAP: &str = "snapshot.storage.k8s.io";
const EVENTS: &str = "events.k8s.io";
const RBAC: &str = "rbac.authorization.k8s.io";

type Need = (&'static str, &'static str, &'static [&'static str], Scope);

/// What each component's code (and its sidecars) calls. Keep in step with agent/src,
/// controller/src, csi/src and the external-provisioner / resizer / snapshotter RBAC docs.
fn needs() -> BTreeMap<&'static str, Vec<Need>> {
    BTreeMap::from([
        (
            "liteio-disk-agent",
            vec![
                (CORE, "nodes", &["get", "list", "watch"][..], Cluster),
                (LITEIO, "storagepools", &["get", "create", "patch"][..], Ns),
                (LITEIO, "storagepools/status", &["patch"][..], Ns),
                (
                    LITEIO,
                    "antstorvolumes",
                    &["get", "list", "watch", "patch"][..],
                    Ns,
                ),
                (LITEIO, "antstorvolumes/status", &["patch"][..], Ns),
                (
                    LITEIO,
                    "antstorsnapshots",
                    &["get", "list", "watch", "patch"][..],
                    Ns,
                ),
                (LITEIO, "antstorsnapshots/status", &["patch"][..], Ns),
                // Multi-disk volumes assembled in SPDK on this node.
                (
                    LITEIO,
                    "antstordatacontrols",
                    &["get", "list", "watch", "patch"][..],
                    Ns,
                ),
                (LITEIO, "antstordatacontrols/status", &["patch"][..], Ns),
                (
                    LITEIO,
                    "antstorvolumegroups",
                    &["get", "list", "watch"][..],
                    Ns,
                ),
                // Hot migration, as the source node.
                (
                    LITEIO,
                    "volumemigrations",
                    &["get", "list", "watch", "patch"][..],
                    Ns,
                ),
                (COORD, "leases", &["get", "create", "update"][..], Ns),
                (CORE, "events", &["create"][..], Ns),
                (EVENTS, "events", &["create"][..], Ns),
                // Makes a volume's key Secret; reads and deletes it as its node.
                (CORE, "secrets", &["create"][..], Ns),
            ],
        ),
        (
            "liteio-controller",
            vec![
                (CORE, "nodes", &["get", "list", "watch"][..], Cluster),
                (
                    LITEIO,
                    "storagepools",
                    &["list", "watch", "patch", "delete"][..],
                    Ns,
                ),
                (LITEIO, "storagepools/status", &["patch"][..], Ns),
                (
                    LITEIO,
                    "antstorvolumes",
                    // create and delete: migration destinations and retired sources.
                    &["list", "watch", "patch", "create", "get", "delete"][..],
                    Ns,
                ),
                (LITEIO, "antstorvolumes/status", &["patch"][..], Ns),
                (
                    LITEIO,
                    "antstorsnapshots",
                    &["list", "watch", "patch"][..],
                    Ns,
                ),
                (LITEIO, "antstorsnapshots/status", &["patch"][..], Ns),
                (
                    LITEIO,
                    "volumemigrations",
                    &["list", "watch", "patch"][..],
                    Ns,
                ),
                (LITEIO, "volumemigrations/status", &["patch"][..], Ns),
                // Multi-disk volumes: members placed, data controls assigned.
                (
                    LITEIO,
                    "antstorvolumegroups",
                    &["list", "watch", "patch"][..],
                    Ns,
                ),
                (LITEIO, "antstorvolumegroups/status", &["patch"][..], Ns),
                (
                    LITEIO,
                    "antstordatacontrols",
                    &["list", "watch", "patch"][..],
                    Ns,
                ),
                (LITEIO, "antstordatacontrols/status", &["patch"][..], Ns),
                (
                    COORD,
                    "leases",
                    &["get", "list", "watch", "create", "update"][..],
                    Ns,
                ),
                (EVENTS, "events", &["create", "patch"][..], Ns),
                (CORE, "events", &["create"][..], Ns),
                // Each node's key access: it can grant only what it holds.
                (
                    RBAC,
                    "roles",
                    &["get", "list", "create", "patch", "delete"][..],
                    Ns,
                ),
                (
                    RBAC,
                    "rolebindings",
                    &["get", "list", "create", "patch", "delete"][..],
                    Ns,
                ),
                (CORE, "secrets", &["get", "patch", "delete"][..], Ns),
            ],
        ),
        (
            "liteio-csi-controller",
            vec![
                // The driver: each volume's keys, made at CreateVolume, gone at DeleteVolume.
                (CORE, "secrets", &["get", "create", "delete"][..], Ns),
                (
                    LITEIO,
                    "antstorvolumes",
                    &["get", "list", "watch", "create", "update", "delete"][..],
                    Ns,
                ),
                (
                    LITEIO,
                    "antstorsnapshots",
                    &["get", "list", "create", "delete"][..],
                    Ns,
                ),
                (LITEIO, "storagepools", &["get", "list"][..], Ns),
                // Multi-disk volumes: a group and a data control per PV.
                (
                    LITEIO,
                    "antstorvolumegroups",
                    &["get", "list", "watch", "create", "delete"][..],
                    Ns,
                ),
                (
                    LITEIO,
                    "antstordatacontrols",
                    &["get", "list", "create", "patch", "delete"][..],
                    Ns,
                ),
                (CORE, "persistentvolumeclaims", &["get"][..], Cluster),
                (CORE, "nodes", &["get", "list"][..], Cluster),
                // external-provisioner.
                (
                    CORE,
                    "persistentvolumes",
                    &["get", "list", "watch", "create", "patch", "delete"][..],
                    Cluster,
                ),
                (
                    CORE,
                    "persistentvolumeclaims",
                    &["get", "list", "watch", "update"][..],
                    Cluster,
                ),
                (
                    STORAGE,
                    "storageclasses",
                    &["get", "list", "watch"][..],
                    Cluster,
                ),
                (STORAGE, "csinodes", &["get", "list", "watch"][..], Cluster),
                (CORE, "nodes", &["get", "list", "watch"][..], Cluster),
                (
                    STORAGE,
                    "volumeattachments",
                    &["get", "list", "watch"][..],
                    Cluster,
                ),
                (
                    CORE,
                    "events",
                    &["list", "watch", "create", "update", "patch"][..],
                    Cluster,
                ),
                (SNAP, "volumesnapshots", &["get", "list"][..], Cluster),
                (
                    SNAP,
                    "volumesnapshotcontents",
                    &["get", "list"][..],
                    Cluster,
                ),
                // external-attacher.
                (
                    STORAGE,
                    "volumeattachments",
                    &["get", "list", "watch", "patch"][..],
                    Cluster,
                ),
                (STORAGE, "volumeattachments/status", &["patch"][..], Cluster),
                // external-resizer.
                (CORE, "persistentvolumes", &["patch"][..], Cluster),
                // external-provisioner and -resizer: the class a PVC names (QoS limits).
                (
                    STORAGE,
                    "volumeattributesclasses",
                    &["get", "list", "watch"][..],
                    Cluster,
                ),
                (
                    CORE,
                    "persistentvolumeclaims/status",
                    &["patch"][..],
                    Cluster,
                ),
                // external-snapshotter (sidecar).
                (
                    SNAP,
                    "volumesnapshotclasses",
                    &["get", "list", "watch"][..],
                    Cluster,
                ),
                (
                    SNAP,
                    "volumesnapshotcontents",
                    &["get", "list", "watch", "update", "patch"][..],
                    Cluster,
                ),
                (
                    SNAP,
                    "volumesnapshotcontents/status",
                    &["update", "patch"][..],
                    Cluster,
                ),
                // Leader election of the four sidecars.
                (
                    COORD,
                    "leases",
                    &[
                        "get", "list", "watch", "create", "update", "patch", "delete",
                    ][..],
                    Ns,
                ),
            ],
        ),
        (
            "liteio-csi-node",
            vec![
                (LITEIO, "antstorvolumes", &["get", "list", "watch"][..], Ns),
                (LITEIO, "antstorvolumes/status", &["patch"][..], Ns),
                // Multi-disk volumes: what to assemble on the host.
                (
                    LITEIO,
                    "antstordatacontrols",
                    &["get", "list", "watch"][..],
                    Ns,
                ),
                (
                    LITEIO,
                    "antstorvolumegroups",
                    &["get", "list", "watch"][..],
                    Ns,
                ),
                // The host's part of a hot migration: spec.migrationInfo and its finalizer.
                (
                    LITEIO,
                    "volumemigrations",
                    &["get", "list", "watch", "patch", "update"][..],
                    Ns,
                ),
                // Its kernel's NVMe/TCP authentication support, on its own Node.
                (CORE, "nodes", &["get", "patch"][..], Cluster),
                // A Warning event on a volume it refuses to stage.
                (CORE, "events", &["create"][..], Ns),
                (EVENTS, "events", &["create"][..], Ns),
            ],
        ),
    ])
}

/// Rules granted to service account `sa` in the LiteIO namespace: (rules, cluster-wide?).
fn granted(o: &Objects, sa: &str) -> Vec<(PolicyRule, Scope)> {
    let is_subject = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount" && s.name == sa && s.namespace.as_deref() == Some(NS)
        })
    };
    let mut out = Vec::new();
    for b in &o.cluster_role_bindings {
        if is_subject(&b.subjects) {
            assert_eq!(b.role_ref.kind, "ClusterRole");
            let role = o
                .cluster_roles
                .iter()
                .find(|r| r.metadata.name.as_deref() == Some(b.role_ref.name.as_str()))
                .unwrap_or_else(|| panic!("ClusterRole {}", b.role_ref.name));
            for r in role.rules.iter().flatten() {
                out.push((r.clone(), Cluster));
            }
        }
    }
    for b in &o.role_bindings {
        if is_subject(&b.subjects) {
            assert_eq!(b.metadata.namespace.as_deref(), Some(NS));
            let rules = if b.role_ref.kind == "Role" {
                o.roles
                    .iter()
                    .find(|r| r.metadata.name.as_deref() == Some(b.role_ref.name.as_str()))
                    .unwrap_or_else(|| panic!("Role {}", b.role_ref.name))
                    .rules
                    .clone()
            } else {
                o.cluster_roles
                    .iter()
                    .find(|r| r.metadata.name.as_deref() == Some(b.role_ref.name.as_str()))
                    .unwrap_or_else(|| panic!("ClusterRole {}", b.role_ref.name))
                    .rules
                    .clone()
            };
            for r in rules.into_iter().flatten() {
                out.push((r, Ns));
            }
        }
    }
    out
}

#[test]
fn rbac_covers_each_component_and_no_more() {
    let o = load();
    let needs = needs();
    for (sa, list) in &needs {
        let rules = granted(&o, sa);
        assert!(!rules.is_empty(), "{sa}: no RBAC bound");
        for (rule, scope) in &rules {
            for field in [&rule.api_groups, &rule.resources, &Some(rule.verbs.clone())] {
                assert!(
                    !field.iter().flatten().any(|v| v == "*"),
                    "{sa}: wildcard in {rule:?}"
                );
            }
            // Secrets: only in LiteIO's namespace, one named Secret at a time (no list or
            // watch, which would hand out every key at once), and never to the CSI node
            // (kubelet gives it the node-stage secret).
            if rule.resources.iter().flatten().any(|r| r == "secrets") {
                assert!(*sa != "liteio-csi-node", "{sa}: secrets access");
                assert!(*scope == Ns, "{sa}: secrets in every namespace");
                for v in &rule.verbs {
                    assert!(
                        ["get", "create", "patch", "delete"].contains(&v.as_str()),
                        "{sa}: verb {v} on secrets"
                    );
                }
            }
        }
        for (group, resource, verbs, scope) in list {
            for verb in *verbs {
                let ok = rules.iter().any(|(r, s)| {
                    (*scope == Ns || *s == Cluster)
                        && r.api_groups.iter().flatten().any(|g| g == group)
                        && r.resources.iter().flatten().any(|x| x == resource)
                        && r.verbs.iter().any(|v| v == verb)
                });
                assert!(
                    ok,
                    "{sa} cannot {verb} {resource} (group {group:?}, {scope:?} scope)"
                );
            }
        }
        // Least privilege: every granted resource is one the table says the component uses.
        let wanted: BTreeSet<(&str, &str)> = list.iter().map(|(g, r, _, _)| (*g, *r)).collect();
        for (rule, _) in &rules {
            for g in rule.api_groups.iter().flatten() {
                for r in rule.resources.iter().flatten() {
                    assert!(
                        wanted.contains(&(g.as_str(), r.as_str())),
                        "{sa} is granted {r} in group {g:?}, which the table does not need"
                    );
                }
            }
        }
    }
    // Every ServiceAccount of the base is one of the components above.
    for (d, _) in &o.service_accounts {
        assert!(
            needs.contains_key(d.name()),
            "{}: not in the RBAC table",
            d.what()
        );
    }
}

#[test]
fn overlays_render_with_kubectl_kustomize() {
    let Ok(out) = std::process::Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
    else {
        println!("SKIP kubectl not found: overlays not rendered");
        return;
    };
    assert!(out.status.success());
    for overlay in ["spdk-aio-lvs", "spdk-nvme", "lvm", "file"] {
        let dir = deploy_dir().join("overlays").join(overlay);
        let out = std::process::Command::new("kubectl")
            .arg("kustomize")
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{overlay}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let mut agent_cfg = None;
        let mut hugepages = None;
        for de in serde_yaml::Deserializer::from_str(&text) {
            let v: Value = serde_json::to_value(
                <serde_yaml::Value as serde::Deserialize>::deserialize(de).unwrap(),
            )
            .unwrap();
            if v["kind"] == "ConfigMap" && v["metadata"]["name"] == "liteio-agent-config" {
                agent_cfg = v["data"]["agent-config.yaml"].as_str().map(str::to_string);
            }
            if v["kind"] == "DaemonSet" && v["metadata"]["name"] == "liteio-disk-agent" {
                hugepages = Some(
                    v.pointer("/spec/template/spec/containers/0/resources/limits/hugepages-2Mi")
                        .cloned(),
                );
                assert_eq!(
                    v.pointer("/spec/template/spec/containers/0/image"),
                    Some(&Value::from("liteio:latest"))
                );
            }
        }
        let cfg = liteio_agent::config::Config::from_yaml(&agent_cfg.expect("agent config"))
            .unwrap_or_else(|e| panic!("{overlay}: {e}"));
        let hugepages = hugepages.expect("agent DaemonSet");
        // SPDK without hugepages exactly when the DaemonSet asks for none.
        assert_eq!(
            cfg.spdk.no_huge,
            hugepages.is_none(),
            "{overlay}: {hugepages:?}"
        );
    }
    // The monitoring overlay: the base with the monitors and the rules.
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(deploy_dir().join("overlays/monitoring"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "monitoring: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut kinds = BTreeMap::<String, usize>::new();
    for de in serde_yaml::Deserializer::from_str(&String::from_utf8(out.stdout).unwrap()) {
        let v: Value = serde_json::to_value(
            <serde_yaml::Value as serde::Deserialize>::deserialize(de).unwrap(),
        )
        .unwrap();
        *kinds
            .entry(v["kind"].as_str().unwrap_or_default().to_string())
            .or_default() += 1;
    }
    for (kind, n) in [
        ("ServiceMonitor", 2),
        ("PodMonitor", 1),
        ("PrometheusRule", 1),
        ("DaemonSet", 2),
        ("Deployment", 2),
    ] {
        assert_eq!(kinds.get(kind), Some(&n), "monitoring: {kinds:?}");
    }
}
