//! Small helpers for object metadata: timestamps, uids, names, managed fields.

use serde_json::{Map, Value, json};

use crate::error::Cause;

/// Now, as kube-apiserver writes `metav1.Time` (RFC 3339, whole seconds, UTC).
pub fn now() -> String {
    let ts = k8s_openapi::jiff::Timestamp::now();
    let secs = ts.as_second();
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| ts.to_string())
}

/// A fresh v4 uid.
pub fn uid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Five random characters as `generateName` appends them.
pub fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .take(5)
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

/// The DNS-1123 label pattern, without the length limit.
fn dns_label_chars(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// Validates `metadata.name` as a DNS-1123 subdomain (or label for namespaces).
pub fn check_name(name: &str, label_only: bool) -> Option<Cause> {
    // apimachinery's IsDNS1123Label / IsDNS1123Subdomain: the length error, then the
    // pattern error with its examples and regex; several are joined by ", ".
    let (max, ok, what) = if label_only {
        (
            63,
            dns_label_chars(name),
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or \
             '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or \
             '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
        )
    } else {
        (
            253,
            name.split('.').all(|l| !l.is_empty() && dns_label_chars(l)),
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, \
             '-' or '.', and must start and end with an alphanumeric character (e.g. \
             'example.com', regex used for validation is \
             '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        )
    };
    let mut errs = Vec::new();
    if name.len() > max {
        errs.push(format!("must be no more than {max} characters"));
    }
    if !ok {
        errs.push(what.to_string());
    }
    if errs.is_empty() {
        return None;
    }
    Some(Cause {
        reason: "FieldValueInvalid",
        field: "metadata.name".into(),
        message: format!(
            "metadata.name: Invalid value: \"{name}\": {}",
            errs.join(", ")
        ),
    })
}

/// The `fieldsV1` set of an object: every key path, leaves as `{}`.
pub fn fields_v1(v: &Value) -> Value {
    fn inner(v: &Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, c)| (format!("f:{k}"), inner(c)))
                    .collect::<Map<_, _>>(),
            ),
            _ => json!({}),
        }
    }
    let mut set = Map::new();
    if let Value::Object(m) = v {
        for (k, c) in m {
            match k.as_str() {
                "apiVersion" | "kind" => {}
                "metadata" => {
                    let mut md = Map::new();
                    for key in ["labels", "annotations", "finalizers", "ownerReferences"] {
                        if let Some(x) = c.get(key) {
                            md.insert(format!("f:{key}"), inner(x));
                        }
                    }
                    if !md.is_empty() {
                        set.insert("f:metadata".into(), Value::Object(md));
                    }
                }
                _ => {
                    set.insert(format!("f:{k}"), inner(c));
                }
            }
        }
    }
    Value::Object(set)
}

/// Removes from `obj` the leaf fields present in `old_set` but not in `new_set`.
pub fn remove_disowned(obj: &mut Value, old_set: &Value, new_set: &Value) {
    let (Some(old), Some(map)) = (old_set.as_object(), obj.as_object_mut()) else {
        return;
    };
    for (fk, old_child) in old {
        let Some(key) = fk.strip_prefix("f:") else {
            continue;
        };
        let new_child = new_set.get(fk);
        let leaf = old_child.as_object().is_none_or(Map::is_empty);
        match (new_child, leaf) {
            (None, true) => {
                map.remove(key);
            }
            (None, false) => {
                if let Some(c) = map.get_mut(key) {
                    remove_disowned(c, old_child, &json!({}));
                }
            }
            (Some(n), false) => {
                if let Some(c) = map.get_mut(key) {
                    remove_disowned(c, old_child, n);
                }
            }
            (Some(_), true) => {}
        }
    }
}

/// Recursive merge used by server-side apply: maps merge, everything else replaces.
pub fn apply_merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    continue;
                }
                match t.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        apply_merge(existing, v)
                    }
                    _ => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// Records a manager in `metadata.managedFields`, replacing its earlier entry for the same
/// operation and subresource.
pub fn record_manager(
    obj: &mut Value,
    manager: &str,
    operation: &str,
    api_version: &str,
    subresource: Option<&str>,
    fields: Value,
) {
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let mut list = meta
        .get("managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    list.retain(|e| {
        !(e["manager"] == manager
            && e["operation"] == operation
            && e["subresource"].as_str() == subresource)
    });
    let mut entry = json!({
        "manager": manager,
        "operation": operation,
        "apiVersion": api_version,
        "time": now(),
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    });
    if let Some(s) = subresource {
        entry["subresource"] = json!(s);
    }
    list.push(entry);
    meta.insert("managedFields".into(), Value::Array(list));
}

/// The `fieldsV1` an apply manager recorded earlier, if any.
pub fn applied_fields(obj: &Value, manager: &str, subresource: Option<&str>) -> Option<Value> {
    obj.pointer("/metadata/managedFields")?
        .as_array()?
        .iter()
        .find(|e| {
            e["manager"] == manager
                && e["operation"] == "Apply"
                && e["subresource"].as_str() == subresource
        })
        .map(|e| e["fieldsV1"].clone())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn names_and_suffixes() {
        assert!(check_name("a-b.c", false).is_none());
        assert!(check_name("a-b.c", true).is_some());
        assert!(check_name("Upper", false).is_some());
        assert_eq!(name_suffix().len(), 5);
        assert!(now().ends_with('Z'), "{}", now());
    }

    #[test]
    fn apply_removes_fields_it_no_longer_sets() {
        let mut obj = json!({"spec": {"a": 1, "b": 2, "c": 3}});
        let old = fields_v1(&json!({"spec": {"a": 1, "b": 2}}));
        let new = fields_v1(&json!({"spec": {"a": 1}}));
        remove_disowned(&mut obj, &old, &new);
        assert_eq!(obj, json!({"spec": {"a": 1, "c": 3}}));
    }
}
