//! Label and field selectors as kube-apiserver parses them.

use serde_json::Value;

use crate::error::ApiError;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Req>);

fn valid_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'))
    });
    name_ok && prefix_ok
}

fn valid_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err("unbalanced parentheses".into());
                }
            }
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced parentheses".into());
    }
    parts.push(&s[start..]);
    Ok(parts)
}

fn parse_set(rest: &str) -> Result<Vec<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("found '{rest}', expected: '('"))?;
    let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
    if let Some(bad) = values.iter().find(|v| !valid_value(v)) {
        return Err(format!("invalid label value: \"{bad}\""));
    }
    Ok(values)
}

fn parse_req(part: &str) -> Result<Req, String> {
    let p = part.trim();
    if p.is_empty() {
        return Err("found '', expected: identifier".into());
    }
    if let Some(key) = p.strip_prefix('!') {
        let key = key.trim();
        return if valid_key(key) {
            Ok(Req::NotExists(key.into()))
        } else {
            Err(format!("invalid label key \"{key}\""))
        };
    }
    let (key, req) = if let Some((k, v)) = p.split_once("!=") {
        (k.trim(), Some(Req::Ne(k.trim().into(), v.trim().into())))
    } else if let Some((k, v)) = p.split_once("==") {
        (k.trim(), Some(Req::Eq(k.trim().into(), v.trim().into())))
    } else if let Some((k, v)) = p.split_once('=') {
        (k.trim(), Some(Req::Eq(k.trim().into(), v.trim().into())))
    } else {
        (p, None)
    };
    let req = match req {
        Some(r) => r,
        None => {
            let mut words = p.splitn(2, char::is_whitespace);
            let key = words.next().unwrap_or_default().trim();
            let rest = words.next().unwrap_or_default().trim();
            if rest.is_empty() {
                Req::Exists(key.into())
            } else if let Some(set) = rest.strip_prefix("notin") {
                Req::NotIn(key.into(), parse_set(set)?)
            } else if let Some(set) = rest.strip_prefix("in") {
                Req::In(key.into(), parse_set(set)?)
            } else {
                return Err(format!(
                    "found '{rest}', expected: in, notin, =, ==, !=, gt, lt"
                ));
            }
        }
    };
    let key = match &req {
        Req::Exists(k) | Req::In(k, _) | Req::NotIn(k, _) => k.as_str(),
        _ => key,
    };
    if !valid_key(key) {
        return Err(format!("invalid label key \"{key}\""));
    }
    if let Req::Eq(_, v) | Req::Ne(_, v) = &req
        && !valid_value(v)
    {
        return Err(format!("invalid label value: \"{v}\""));
    }
    Ok(req)
}

impl LabelSelector {
    /// Parses a `labelSelector` query value; `400 BadRequest` when it is malformed.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        if s.trim().is_empty() {
            return Ok(Self::default());
        }
        let parts = split_top(s)
            .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
        parts
            .into_iter()
            .map(|p| {
                parse_req(p)
                    .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(LabelSelector)
    }

    /// Whether an object's labels satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::Ne(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector`: equality and inequality on supported fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

fn field_value(obj: &Value, path: &str) -> String {
    let pointer = format!("/{}", path.replace('.', "/"));
    match obj.pointer(&pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

impl FieldSelector {
    /// Parses a `fieldSelector`; only `metadata.name`, `metadata.namespace` and the
    /// resource's selectable fields are accepted, like kube-apiserver.
    pub fn parse(s: &str, allowed: &[String]) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, eq, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let field = field.trim();
            let known = field == "metadata.name"
                || field == "metadata.namespace"
                || allowed.iter().any(|a| a == field);
            if !known {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            reqs.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector(reqs))
    }

    /// Whether the object satisfies every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0
            .iter()
            .all(|(f, eq, v)| (field_value(obj, f) == *v) == *eq)
    }

    /// The name an equality on `metadata.name` asks for, if any: such a list holds one
    /// object at most, which kube-apiserver's cache fetches by key instead of scanning.
    pub fn single_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(f, eq, _)| *eq && f == "metadata.name")
            .map(|(_, _, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}, "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn a_name_equality_is_a_single_object() {
        let f = FieldSelector::parse("metadata.name=a,metadata.namespace=ns", &[]).unwrap();
        assert_eq!(f.single_name(), Some("a"));
        let f = FieldSelector::parse("metadata.name!=a", &[]).unwrap();
        assert_eq!(f.single_name(), None);
        assert_eq!(FieldSelector::default().single_name(), None);
    }

    #[test]
    fn every_label_operator() {
        let o = obj(json!({"app": "x", "tier": "db"}));
        for (sel, want) in [
            ("app=x", true),
            ("app==x", true),
            ("app!=x", false),
            ("app!=y", true),
            ("missing!=y", true),
            ("app in (x, y)", true),
            ("app in (y)", false),
            ("app notin (y)", true),
            ("missing notin (y)", true),
            ("app notin (x)", false),
            ("app", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app=x,tier in (db,web),!gone", true),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&o),
                want,
                "{sel}"
            );
        }
    }

    #[test]
    fn bad_label_selectors_are_rejected() {
        for sel in [
            "app in x",
            "app in (x",
            "a b c",
            "=x",
            "app=x,",
            "app=x y",
            "-a=b",
        ] {
            assert!(LabelSelector::parse(sel).is_err(), "{sel}");
        }
    }

    #[test]
    fn field_selectors() {
        let o = obj(json!({}));
        let allowed = vec!["spec.nodeName".to_string()];
        for (sel, want) in [
            ("metadata.name=a", true),
            ("metadata.name!=a", false),
            ("metadata.namespace==ns,spec.nodeName=n1", true),
            ("spec.nodeName!=n1", false),
        ] {
            assert_eq!(
                FieldSelector::parse(sel, &allowed).unwrap().matches(&o),
                want,
                "{sel}"
            );
        }
        assert!(FieldSelector::parse("spec.other=x", &allowed).is_err());
        assert!(FieldSelector::parse("metadata.name", &allowed).is_err());
    }
}
