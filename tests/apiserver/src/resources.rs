//! The resources the server serves: a table of built-in kinds plus one entry per served
//! version of every CustomResourceDefinition.

use serde_json::Value;

/// How the server treats one resource (one group/version/plural).
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceInfo {
    /// API group; empty for the core group.
    pub group: String,
    /// API version, e.g. `v1`.
    pub version: String,
    /// Plural name used in URLs.
    pub plural: String,
    /// Singular name.
    pub singular: String,
    /// Kind.
    pub kind: String,
    /// Namespace-scoped.
    pub namespaced: bool,
    /// Has a `/status` subresource.
    pub has_status: bool,
    /// Short names (`av`, `pvc`, ...).
    pub short_names: Vec<String>,
    /// Categories (`all`, `liteio`, ...).
    pub categories: Vec<String>,
    /// Served through a CustomResourceDefinition.
    pub custom: bool,
    /// `metadata.generation` is maintained.
    pub tracks_generation: bool,
    /// A PUT without `metadata.resourceVersion` is accepted.
    pub unconditional_update: bool,
    /// A PUT of a missing object creates it.
    pub create_on_update: bool,
    /// `status` given on create is kept (Node).
    pub keep_status_on_create: bool,
    /// DELETE answers with the deleted object (`ReturnDeletedObject` in kube-apiserver's
    /// registry); otherwise with a success `Status`.
    pub delete_returns_object: bool,
    /// Field paths besides `metadata.name`/`metadata.namespace` usable in field selectors.
    pub selectable_fields: Vec<String>,
    /// The `openAPIV3Schema` of a custom resource.
    pub schema: Option<Value>,
    /// The CRD's `additionalPrinterColumns`.
    pub printer_columns: Vec<Value>,
}

impl ResourceInfo {
    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `group/version` as used in discovery.
    pub fn group_version(&self) -> String {
        self.api_version()
    }
}

struct Builtin {
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    has_status: bool,
    short: &'static [&'static str],
    fields: &'static [&'static str],
}

const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

const BUILTINS: &[Builtin] = &[
    Builtin {
        group: "",
        plural: "namespaces",
        kind: "Namespace",
        namespaced: false,
        has_status: true,
        short: &["ns"],
        fields: &["status.phase"],
    },
    Builtin {
        group: "",
        plural: "nodes",
        kind: "Node",
        namespaced: false,
        has_status: true,
        short: &["no"],
        fields: &["spec.unschedulable"],
    },
    Builtin {
        group: "",
        plural: "persistentvolumes",
        kind: "PersistentVolume",
        namespaced: false,
        has_status: true,
        short: &["pv"],
        fields: &[],
    },
    Builtin {
        group: "",
        plural: "persistentvolumeclaims",
        kind: "PersistentVolumeClaim",
        namespaced: true,
        has_status: true,
        short: &["pvc"],
        fields: &[],
    },
    Builtin {
        group: "",
        plural: "events",
        kind: "Event",
        namespaced: true,
        has_status: false,
        short: &["ev"],
        fields: EVENT_FIELDS,
    },
    Builtin {
        group: "",
        plural: "configmaps",
        kind: "ConfigMap",
        namespaced: true,
        has_status: false,
        short: &["cm"],
        fields: &[],
    },
    Builtin {
        group: "",
        plural: "secrets",
        kind: "Secret",
        namespaced: true,
        has_status: false,
        short: &[],
        fields: &["type"],
    },
    Builtin {
        group: "",
        plural: "pods",
        kind: "Pod",
        namespaced: true,
        has_status: true,
        short: &["po"],
        fields: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        plural: "roles",
        kind: "Role",
        namespaced: true,
        has_status: false,
        short: &[],
        fields: &[],
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        plural: "rolebindings",
        kind: "RoleBinding",
        namespaced: true,
        has_status: false,
        short: &[],
        fields: &[],
    },
    Builtin {
        group: "coordination.k8s.io",
        plural: "leases",
        kind: "Lease",
        namespaced: true,
        has_status: false,
        short: &[],
        fields: &[],
    },
    Builtin {
        group: "storage.k8s.io",
        plural: "storageclasses",
        kind: "StorageClass",
        namespaced: false,
        has_status: false,
        short: &["sc"],
        fields: &[],
    },
    Builtin {
        group: "storage.k8s.io",
        plural: "csidrivers",
        kind: "CSIDriver",
        namespaced: false,
        has_status: false,
        short: &[],
        fields: &[],
    },
    Builtin {
        group: "storage.k8s.io",
        plural: "csinodes",
        kind: "CSINode",
        namespaced: false,
        has_status: false,
        short: &[],
        fields: &[],
    },
    Builtin {
        group: "storage.k8s.io",
        plural: "volumeattachments",
        kind: "VolumeAttachment",
        namespaced: false,
        has_status: true,
        short: &[],
        fields: &[],
    },
    Builtin {
        group: "events.k8s.io",
        plural: "events",
        kind: "Event",
        namespaced: true,
        has_status: false,
        short: &["ev"],
        fields: EVENT_FIELDS,
    },
    Builtin {
        group: "apiextensions.k8s.io",
        plural: "customresourcedefinitions",
        kind: "CustomResourceDefinition",
        namespaced: false,
        has_status: true,
        short: &["crd", "crds"],
        fields: &[],
    },
];

/// The API groups kube-apiserver 1.26 serves itself (through go-restful). An unknown path
/// under `/api` or under one of these groups is a `Status` 404; any other unknown path,
/// including one under a CRD's group, is the plain-text `404 page not found` of the end of
/// kube-apiserver's delegation chain.
pub const KUBE_APISERVER_GROUPS: &[&str] = &[
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "apiregistration.k8s.io",
    "apps",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "autoscaling",
    "batch",
    "certificates.k8s.io",
    "coordination.k8s.io",
    "discovery.k8s.io",
    "events.k8s.io",
    "flowcontrol.apiserver.k8s.io",
    "networking.k8s.io",
    "node.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "scheduling.k8s.io",
    "storage.k8s.io",
];

/// The built-in resources.
pub fn builtins() -> Vec<ResourceInfo> {
    BUILTINS
        .iter()
        .map(|b| ResourceInfo {
            group: b.group.to_string(),
            version: "v1".to_string(),
            plural: b.plural.to_string(),
            singular: b.kind.to_lowercase(),
            kind: b.kind.to_string(),
            namespaced: b.namespaced,
            has_status: b.has_status,
            short_names: b.short.iter().map(|s| s.to_string()).collect(),
            categories: if b.plural == "pods" {
                vec!["all".to_string()]
            } else {
                Vec::new()
            },
            custom: false,
            tracks_generation: b.plural == "customresourcedefinitions",
            // `AllowUnconditionalUpdate()` of each registry strategy in Kubernetes 1.26.
            unconditional_update: !matches!(
                b.plural,
                "customresourcedefinitions"
                    | "leases"
                    | "csidrivers"
                    | "csinodes"
                    | "volumeattachments"
            ),
            // The RBAC strategies of 1.26 allow create on update too.
            create_on_update: matches!(b.plural, "events" | "leases" | "roles" | "rolebindings"),
            keep_status_on_create: b.plural == "nodes",
            delete_returns_object: matches!(
                b.plural,
                "namespaces"
                    | "persistentvolumes"
                    | "persistentvolumeclaims"
                    | "pods"
                    | "storageclasses"
                    | "csidrivers"
                    | "csinodes"
                    | "volumeattachments"
            ),
            selectable_fields: b.fields.iter().map(|s| s.to_string()).collect(),
            schema: None,
            printer_columns: Vec::new(),
        })
        .collect()
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// One entry per served version of a CRD given as JSON; empty when the CRD is malformed.
pub fn from_crd(crd: &Value) -> Vec<ResourceInfo> {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let (Some(group), Some(plural), Some(kind)) = (
        spec["group"].as_str(),
        names["plural"].as_str(),
        names["kind"].as_str(),
    ) else {
        return Vec::new();
    };
    let singular = names["singular"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| kind.to_lowercase());
    let namespaced = spec["scope"].as_str() != Some("Cluster");
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    versions
        .iter()
        .filter(|v| v["served"].as_bool().unwrap_or(true))
        .filter_map(|v| {
            let version = v["name"].as_str()?;
            Some(ResourceInfo {
                group: group.to_string(),
                version: version.to_string(),
                plural: plural.to_string(),
                singular: singular.clone(),
                kind: kind.to_string(),
                namespaced,
                has_status: v.pointer("/subresources/status").is_some(),
                short_names: strings(names.get("shortNames")),
                categories: strings(names.get("categories")),
                custom: true,
                tracks_generation: true,
                unconditional_update: false,
                create_on_update: false,
                keep_status_on_create: false,
                // The CRD handler's store does not set `ReturnDeletedObject`.
                delete_returns_object: false,
                selectable_fields: v["selectableFields"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|f| f["jsonPath"].as_str())
                            .map(|p| p.trim_start_matches('.').to_string())
                            .collect()
                    })
                    .unwrap_or_default(),
                schema: v.pointer("/schema/openAPIV3Schema").cloned(),
                printer_columns: v["additionalPrinterColumns"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            })
        })
        .collect()
}
