//! Reading labels and annotations of any object's metadata.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The value of label `key`, if set.
pub fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// The value of annotation `key`, if set.
pub fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Whether finalizer `f` is present.
pub fn has_finalizer(meta: &ObjectMeta, f: &str) -> bool {
    meta.finalizers
        .as_ref()
        .is_some_and(|v| v.iter().any(|x| x == f))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn reads_what_is_set_and_nothing_else() {
        let m = ObjectMeta {
            labels: Some(BTreeMap::from([("a".to_string(), "1".to_string())])),
            annotations: Some(BTreeMap::from([("b".to_string(), "2".to_string())])),
            finalizers: Some(vec!["f".to_string()]),
            ..ObjectMeta::default()
        };
        assert_eq!(label(&m, "a"), Some("1"));
        assert_eq!(label(&m, "b"), None);
        assert_eq!(annotation(&m, "b"), Some("2"));
        assert_eq!(annotation(&ObjectMeta::default(), "b"), None);
        assert!(has_finalizer(&m, "f") && !has_finalizer(&m, "g"));
    }
}
