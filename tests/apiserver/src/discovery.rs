//! Discovery documents (`/api`, `/apis`, resource lists), `/version`, a minimal OpenAPI v3
//! and the `Table` rendering `kubectl get` asks for.

use serde_json::{Value, json};

use crate::resources::ResourceInfo;

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-liteio-test",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`.
pub fn api_versions(addr: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr}],
    })
}

fn groups(resources: &[ResourceInfo]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for r in resources.iter().filter(|r| !r.group.is_empty()) {
        match out.iter_mut().find(|(g, _)| *g == r.group) {
            Some((_, versions)) => {
                if !versions.contains(&r.version) {
                    versions.push(r.version.clone());
                }
            }
            None => out.push((r.group.clone(), vec![r.version.clone()])),
        }
    }
    out
}

fn group_json(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({
        "name": name,
        "versions": vs,
        "preferredVersion": vs.first().cloned().unwrap_or(Value::Null),
    })
}

/// `/apis`.
pub fn api_group_list(resources: &[ResourceInfo]) -> Value {
    let gs: Vec<Value> = groups(resources)
        .iter()
        .map(|(g, vs)| group_json(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
}

/// `/apis/<group>`, or None when the group is not served.
pub fn api_group(resources: &[ResourceInfo], group: &str) -> Option<Value> {
    groups(resources)
        .into_iter()
        .find(|(g, _)| g == group)
        .map(|(g, vs)| {
            let mut v = group_json(&g, &vs);
            v["kind"] = json!("APIGroup");
            v["apiVersion"] = json!("v1");
            v
        })
}

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `/api/v1` or `/apis/<group>/<version>`, or None when nothing is served there.
pub fn resource_list(resources: &[ResourceInfo], group: &str, version: &str) -> Option<Value> {
    let mine: Vec<&ResourceInfo> = resources
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if mine.is_empty() {
        return None;
    }
    let mut list = Vec::new();
    for r in mine {
        let mut entry = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": VERBS,
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            entry["categories"] = json!(r.categories);
        }
        list.push(entry);
        if r.has_status {
            list.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": list,
    }))
}

fn hash(s: &str) -> String {
    let h = s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    });
    format!("{h:016X}")
}

/// The OpenAPI v3 document of one group-version: only the paths, each PATCH carrying its
/// group-version-kind and the `fieldValidation` parameter, so kubectl uses server-side
/// field validation instead of downloading schemas.
pub fn openapi_v3_gv(resources: &[ResourceInfo], group: &str, version: &str) -> Option<Value> {
    let mine: Vec<&ResourceInfo> = resources
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if mine.is_empty() {
        return None;
    }
    let prefix = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let mut paths = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
    for r in mine {
        let path = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("{prefix}/{}/{{name}}", r.plural)
        };
        let gvk = json!({"group": group, "version": version, "kind": r.kind});
        let op = json!({
            "x-kubernetes-group-version-kind": gvk,
            "parameters": [
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            ],
            "responses": {"200": {"description": "OK"}},
        });
        paths.insert(
            path,
            json!({"get": op.clone(), "put": op.clone(), "patch": op}),
        );
        let schema_name = format!(
            "{}.{version}.{}",
            if group.is_empty() {
                "io.k8s.api.core"
            } else {
                group
            },
            r.kind
        );
        let mut schema = r.schema.clone().unwrap_or_else(
            || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        );
        schema["x-kubernetes-group-version-kind"] = json!([gvk]);
        schemas.insert(schema_name, schema);
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// `/openapi/v3`: where each group-version's document is.
pub fn openapi_v3_root(resources: &[ResourceInfo]) -> Value {
    let mut paths = serde_json::Map::new();
    let mut gvs: Vec<(String, String)> = Vec::new();
    for r in resources {
        let gv = (r.group.clone(), r.version.clone());
        if !gvs.contains(&gv) {
            gvs.push(gv);
        }
    }
    for (g, v) in gvs {
        let key = if g.is_empty() {
            format!("api/{v}")
        } else {
            format!("apis/{g}/{v}")
        };
        let doc = openapi_v3_gv(resources, &g, &v)
            .map(|d| d.to_string())
            .unwrap_or_default();
        paths.insert(
            key.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={}", hash(&doc))}),
        );
    }
    json!({"paths": paths})
}

fn age(ts: &str) -> String {
    let Ok(t) = ts.parse::<k8s_openapi::jiff::Timestamp>() else {
        return "<unknown>".into();
    };
    let secs = (k8s_openapi::jiff::Timestamp::now().as_second() - t.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn cell(obj: &Value, column: &Value) -> Value {
    let path = column["jsonPath"].as_str().unwrap_or_default();
    let pointer = path.replace('.', "/");
    let v = obj.pointer(&pointer).cloned().unwrap_or(Value::Null);
    match (column["type"].as_str(), &v) {
        (Some("date"), Value::String(s)) => json!(age(s)),
        _ => v,
    }
}

/// A `meta.k8s.io/v1` Table of `objects`; `headers` false leaves the column definitions out
/// (watch events after the first).
pub fn table(res: &ResourceInfo, objects: &[Value], rv: &str, headers: bool, full: bool) -> Value {
    let mut columns = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace.",
    })];
    let printer: Vec<Value> = if res.printer_columns.is_empty() {
        vec![json!({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"})]
    } else {
        res.printer_columns.clone()
    };
    for c in &printer {
        columns.push(json!({
            "name": c["name"].as_str().map(|n| {
                let mut cs = n.chars();
                cs.next().map(|f| f.to_uppercase().collect::<String>() + cs.as_str()).unwrap_or_default()
            }),
            "type": c["type"],
            "format": c.get("format").cloned().unwrap_or(json!("")),
            "description": c.get("description").cloned().unwrap_or(json!("")),
            "priority": c.get("priority").cloned().unwrap_or(json!(0)),
        }));
    }
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut cells = vec![o.pointer("/metadata/name").cloned().unwrap_or(Value::Null)];
            cells.extend(printer.iter().map(|c| cell(o, c)));
            let object = if full {
                o.clone()
            } else {
                json!({
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o.get("metadata").cloned().unwrap_or(json!({})),
                })
            };
            json!({"cells": cells, "object": object})
        })
        .collect();
    let mut t = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv},
        "rows": rows,
    });
    if headers {
        t["columnDefinitions"] = Value::Array(columns);
    } else {
        t["columnDefinitions"] = Value::Null;
    }
    t
}
