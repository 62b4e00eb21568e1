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

/// The snapshot a volume is cloned from: `(namespace, name)` from the labels
/// `VOLUME_SOURCE_SNAP_NAME` and `VOLUME_SOURCE_SNAP_NS` (LiteIO's default namespace when the
/// latter is absent), or `None` for a volume made from scratch.
pub fn source_snapshot(meta: &ObjectMeta) -> Option<(&str, &str)> {
    use crate::keys::{self, labels};
    let name = label(meta, labels::VOLUME_SOURCE_SNAP_NAME).filter(|n| !n.is_empty())?;
    let ns = label(meta, labels::VOLUME_SOURCE_SNAP_NS)
        .filter(|n| !n.is_empty())
        .unwrap_or(keys::DEFAULT_NAMESPACE);
    Some((ns, name))
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

    #[test]
    fn the_source_snapshot_defaults_to_liteio_s_namespace() {
        use crate::keys::{self, labels};
        let with = |pairs: &[(&str, &str)]| ObjectMeta {
            labels: Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..ObjectMeta::default()
        };
        assert_eq!(source_snapshot(&ObjectMeta::default()), None);
        assert_eq!(
            source_snapshot(&with(&[(labels::VOLUME_SOURCE_SNAP_NAME, "s1")])),
            Some((keys::DEFAULT_NAMESPACE, "s1"))
        );
        assert_eq!(
            source_snapshot(&with(&[
                (labels::VOLUME_SOURCE_SNAP_NAME, "s1"),
                (labels::VOLUME_SOURCE_SNAP_NS, "app")
            ])),
            Some(("app", "s1"))
        );
        assert_eq!(
            source_snapshot(&with(&[(labels::VOLUME_SOURCE_SNAP_NAME, "")])),
            None
        );
    }
}
