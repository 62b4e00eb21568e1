//! Structural-schema handling for custom resources, as kube-apiserver does it: pruning of
//! unknown fields, `default:` values, and validation of `type`, `enum`, `minimum`/`maximum`,
//! `required`, `minLength`/`maxLength`, `maxItems` and the `x-kubernetes-validations` rules
//! the CEL subset in [`crate::cel`] understands.

use serde_json::{Map, Value};

use crate::cel::Rule;
use crate::error::Cause;

/// Outcome of checking one object against its schema.
#[derive(Debug, Default)]
pub struct Checked {
    /// Field errors; non-empty means `422 Invalid`.
    pub causes: Vec<Cause>,
    /// Paths of unknown fields that were pruned.
    pub pruned: Vec<String>,
    /// Failed `x-kubernetes-validations` rules, kept apart: kube-apiserver evaluates them
    /// after the schema and only when no blocking error (Required, TooLong, TooMany,
    /// TypeInvalid) was found.
    rule_causes: Vec<Cause>,
}

/// Whether a schema has any `x-kubernetes-validations` (kube-apiserver then has a CEL
/// validator for the version).
pub fn has_rules(schema: &Value) -> bool {
    match schema {
        Value::Object(m) => m
            .iter()
            .any(|(k, v)| k == "x-kubernetes-validations" || has_rules(v)),
        Value::Array(a) => a.iter().any(has_rules),
        _ => false,
    }
}

/// The error kube-apiserver adds instead of evaluating the validation rules when the object
/// already has a blocking error.
pub fn rules_not_checked() -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        field: "<nil>".to_string(),
        message: "<nil>: Invalid value: \"null\": some validation rules were not checked because \
                  the object was invalid; correct the existing errors to complete validation"
            .to_string(),
    }
}

fn blocking(c: &Cause) -> bool {
    matches!(
        c.reason,
        "FieldValueRequired" | "FieldValueTooLong" | "FieldValueTooMany" | "FieldValueTypeInvalid"
    )
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_ok(want: &str, v: &Value) -> bool {
    let got = type_name(v);
    got == want || (want == "number" && got == "integer")
}

fn invalid(path: &str, shown: &str, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        field: path.to_string(),
        message: format!("{path}: Invalid value: {shown}: {detail}"),
    }
}

/// Applies defaults, prunes unknown fields and validates `value` (a whole object) against
/// `schema` (an `openAPIV3Schema`). `old` is the stored object on update.
pub fn check(schema: &Value, value: &mut Value, old: Option<&Value>) -> Checked {
    let mut out = Checked::default();
    walk(schema, value, old, "", &mut out);
    let rules = std::mem::take(&mut out.rule_causes);
    if has_rules(schema) {
        if out.causes.iter().any(blocking) {
            out.causes.push(rules_not_checked());
        } else {
            out.causes.extend(rules);
        }
    }
    out
}

fn walk(schema: &Value, value: &mut Value, old: Option<&Value>, path: &str, out: &mut Checked) {
    let preserve = schema["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true);
    let int_or_string = schema["x-kubernetes-int-or-string"].as_bool() == Some(true);
    if value.is_null() {
        return;
    }
    if int_or_string {
        if !matches!(type_name(value), "integer" | "string") {
            out.causes.push(invalid(
                path,
                &format!("\"{}\"", type_name(value)),
                &format!("{path} in body must be of type int-or-string"),
            ));
        }
    } else if let Some(want) = schema["type"].as_str()
        && !type_ok(want, value)
    {
        out.causes.push(Cause {
            reason: "FieldValueTypeInvalid",
            field: path.to_string(),
            message: format!(
                "{path}: Invalid value: \"{}\": {path} in body must be of type {want}: \"{}\"",
                type_name(value),
                type_name(value)
            ),
        });
        return;
    }

    match value {
        Value::Object(map) => walk_object(schema, map, old, path, preserve, out),
        Value::Array(items) => {
            if let Some(max) = schema["maxItems"].as_u64()
                && items.len() as u64 > max
            {
                out.causes.push(Cause {
                    reason: "FieldValueTooMany",
                    field: path.to_string(),
                    message: format!(
                        "{path}: Too many: {}: must have at most {max} items",
                        items.len()
                    ),
                });
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    if item.is_null() && item_schema["nullable"].as_bool() != Some(true) {
                        continue;
                    }
                    walk(item_schema, item, None, &format!("{path}[{i}]"), out);
                }
            }
        }
        Value::String(s) => {
            let len = s.chars().count() as u64;
            if let Some(min) = schema["minLength"].as_u64()
                && len < min
            {
                out.causes.push(invalid(
                    path,
                    &format!("{value}"),
                    &format!("{path} in body should be at least {min} chars long"),
                ));
            }
            if let Some(max) = schema["maxLength"].as_u64()
                && len > max
            {
                out.causes.push(Cause {
                    reason: "FieldValueTooLong",
                    field: path.to_string(),
                    message: format!("{path}: Too long: may not be more than {max} bytes"),
                });
            }
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or_default();
            if let Some(min) = schema["minimum"].as_f64()
                && x < min
            {
                out.causes.push(invalid(
                    path,
                    &n.to_string(),
                    &format!("{path} in body should be greater than or equal to {min}"),
                ));
            }
            if let Some(max) = schema["maximum"].as_f64()
                && x > max
            {
                out.causes.push(invalid(
                    path,
                    &n.to_string(),
                    &format!("{path} in body should be less than or equal to {max}"),
                ));
            }
        }
        _ => {}
    }

    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        let list = allowed
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        out.causes.push(Cause {
            reason: "FieldValueNotSupported",
            field: path.to_string(),
            message: format!("{path}: Unsupported value: {value}: supported values: {list}"),
        });
    }

    if let Some(rules) = schema["x-kubernetes-validations"].as_array() {
        for r in rules {
            let Some(src) = r["rule"].as_str() else {
                continue;
            };
            let rule = match Rule::parse(src) {
                Ok(rule) => rule,
                Err(e) => {
                    tracing::warn!(rule = src, error = %e, "validation rule skipped");
                    continue;
                }
            };
            if rule.uses_old_self && old.is_none() {
                continue;
            }
            let failed = match rule.eval(value, old) {
                Ok(ok) => !ok,
                Err(e) => {
                    tracing::debug!(rule = src, error = %e, "validation rule errored");
                    true
                }
            };
            if failed {
                let message = r["message"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("failed rule: {src}"));
                let shown = format!("\"{}\"", type_name(value));
                out.rule_causes.push(invalid(path, &shown, &message));
            }
        }
    }
}

fn walk_object(
    schema: &Value,
    map: &mut Map<String, Value>,
    old: Option<&Value>,
    path: &str,
    preserve: bool,
    out: &mut Checked,
) {
    let props = schema["properties"].as_object();
    let additional = schema.get("additionalProperties");
    if let Some(props) = props {
        // Nulls in non-nullable fields are dropped before defaulting.
        map.retain(|k, v| {
            !(v.is_null()
                && props
                    .get(k)
                    .is_some_and(|p| p["nullable"].as_bool() != Some(true)))
        });
        for (k, p) in props {
            if let Some(d) = p.get("default")
                && !map.contains_key(k)
            {
                map.insert(k.clone(), d.clone());
            }
        }
        if !preserve && !matches!(additional, Some(a) if a.is_object() || a == &Value::Bool(true)) {
            let root = path.is_empty();
            let unknown: Vec<String> = map
                .keys()
                .filter(|k| !props.contains_key(*k))
                .filter(|k| !(root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata")))
                .cloned()
                .collect();
            for k in unknown {
                map.remove(&k);
                out.pruned.push(join(path, &k));
            }
        }
        for (k, v) in map.iter_mut() {
            if let Some(p) = props.get(k) {
                let old_child = old.and_then(|o| o.get(k)).filter(|o| !o.is_null());
                walk(p, v, old_child, &join(path, k), out);
            }
        }
    } else if let Some(a) = additional.filter(|a| a.is_object()) {
        for (k, v) in map.iter_mut() {
            let old_child = old.and_then(|o| o.get(k)).filter(|o| !o.is_null());
            walk(a, v, old_child, &join(path, k), out);
        }
    } else if !preserve && schema["type"].as_str() == Some("object") && !path.is_empty() {
        // An object without properties or additionalProperties keeps nothing.
        let keys: Vec<String> = map.keys().cloned().collect();
        for k in keys {
            map.remove(&k);
            out.pruned.push(join(path, &k));
        }
    }
    if let Some(required) = schema["required"].as_array() {
        for r in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(r) {
                let field = join(path, r);
                out.causes.push(Cause {
                    reason: "FieldValueRequired",
                    field: field.clone(),
                    message: format!("{field}: Required value"),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    fn volume_schema() -> Value {
        let crd = liteio_api::crd::all()
            .into_iter()
            .find(|c| c.spec.names.plural == "antstorvolumes")
            .unwrap();
        serde_json::to_value(crd).unwrap()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            .clone()
    }

    #[test]
    fn defaults_pruning_and_errors() {
        let s = volume_schema();
        let mut v = json!({"apiVersion": "x", "kind": "AntstorVolume", "metadata": {"name": "a"},
            "spec": {"uuid": "u", "sizeByte": 1, "bogus": 1}});
        let c = check(&s, &mut v, None);
        assert!(c.causes.is_empty(), "{:?}", c.causes);
        assert_eq!(c.pruned, vec!["spec.bogus".to_string()]);
        assert_eq!(v["spec"]["type"], json!("Flexible"));

        let mut v = json!({"spec": {"uuid": "", "sizeByte": -1, "positionAdvice": "X"}});
        let c = check(&s, &mut v, None);
        let fields: Vec<&str> = c.causes.iter().map(|c| c.field.as_str()).collect();
        assert!(fields.contains(&"spec.sizeByte"), "{fields:?}");
        assert!(fields.contains(&"spec.positionAdvice"), "{fields:?}");
        assert!(fields.contains(&"spec"), "{fields:?}");
        let msgs: Vec<&str> = c.causes.iter().map(|c| c.message.as_str()).collect();
        assert!(
            msgs.iter()
                .any(|m| m.starts_with("spec.positionAdvice: Unsupported value: \"X\"")),
            "{msgs:?}"
        );

        let old = json!({"uuid": "a", "sizeByte": 1});
        let mut v = json!({"spec": {"uuid": "b", "sizeByte": 1}});
        let c = check(&s, &mut v, Some(&json!({"spec": old})));
        assert!(
            c.causes.iter().any(|c| c.message.contains("immutable")),
            "{:?}",
            c.causes
        );
    }
}
