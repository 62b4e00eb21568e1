//! Kubernetes look-ups shared by the controller and node services.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::wait::await_condition;
use kube::{Resource, ResourceExt};
use liteio_api::keys::labels;
use liteio_api::{AntstorSnapshot, AntstorVolume};
use serde::de::DeserializeOwned;

use crate::error::{CsiError, Result};

/// True when `v` can be used as a label value (so it can be looked up by label).
pub fn is_label_value(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && v.starts_with(|c: char| c.is_ascii_alphanumeric())
        && v.ends_with(|c: char| c.is_ascii_alphanumeric())
}

async fn by_uuid<K>(
    api: &Api<K>,
    kind: &str,
    label: &str,
    uuid: &str,
    spec_uuid: impl Fn(&K) -> &str,
) -> Result<Option<K>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    if is_label_value(uuid) {
        let lp = ListParams::default().labels(&format!("{label}={uuid}"));
        let list = api
            .list(&lp)
            .await
            .map_err(|e| CsiError::kube(format!("list {kind} with {label}={uuid}"), e))?;
        let mut items = list.items;
        items.sort_by_key(|o| o.meta().creation_timestamp.clone().map(|t| t.0));
        if let Some(first) = items.into_iter().next() {
            return Ok(Some(first));
        }
    }
    // Objects written by other tools may lack the label: fall back to the spec.
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| CsiError::kube(format!("list {kind}"), e))?;
    Ok(list.items.into_iter().find(|o| spec_uuid(o) == uuid))
}

/// The AntstorVolume whose uuid (the CSI volume id) is `uuid`.
pub async fn volume_by_uuid(api: &Api<AntstorVolume>, uuid: &str) -> Result<Option<AntstorVolume>> {
    by_uuid(api, "AntstorVolume", labels::VOL_UUID, uuid, |v| {
        v.spec.uuid.as_str()
    })
    .await
}

/// The AntstorDataControl whose uuid (a multi-disk volume's id, `dc-<uuid>`) is `uuid`.
pub async fn data_control_by_uuid(
    api: &Api<liteio_api::AntstorDataControl>,
    uuid: &str,
) -> Result<Option<liteio_api::AntstorDataControl>> {
    by_uuid(api, "AntstorDataControl", labels::VOL_UUID, uuid, |d| {
        d.spec.uuid.as_str()
    })
    .await
}

/// The AntstorSnapshot whose uuid (the CSI snapshot id) is `uuid`.
pub async fn snapshot_by_uuid(
    api: &Api<AntstorSnapshot>,
    uuid: &str,
) -> Result<Option<AntstorSnapshot>> {
    by_uuid(api, "AntstorSnapshot", labels::SNAP_UUID, uuid, |s| {
        s.spec.uuid.as_str()
    })
    .await
}

/// Gets `name`, `None` when it does not exist.
pub async fn get_opt<K>(api: &Api<K>, kind: &str, name: &str) -> Result<Option<K>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name)
        .await
        .map_err(|e| CsiError::kube(format!("get {kind} {name}"), e))
}

/// Asks the API server to delete `name`: `true` when asked, `false` when it was gone
/// already (a delete is idempotent).
pub async fn delete_opt<K>(api: &Api<K>, kind: &str, name: &str) -> Result<bool>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(CsiError::kube(format!("delete {kind} {name}"), e)),
    }
}

/// Outcome of a bounded wait.
#[derive(Debug)]
pub enum Waited<K> {
    /// The condition held; the object as last seen.
    Done(K),
    /// The object was deleted while waiting.
    Gone,
    /// The bound passed.
    TimedOut,
}

/// Waits up to `bound` for `cond` to hold on object `name` (through a watch, not polling).
pub async fn wait_for<K>(
    api: Api<K>,
    kind: &str,
    name: &str,
    bound: Duration,
    cond: impl Fn(&K) -> bool + Send + 'static,
) -> Result<Waited<K>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let fut = await_condition(api, name, move |o: Option<&K>| o.is_none_or(&cond));
    match tokio::time::timeout(bound, fut).await {
        Err(_) => Ok(Waited::TimedOut),
        Ok(Err(e)) => Err(CsiError::Internal(format!(
            "watching {kind} {name} failed: {e}"
        ))),
        Ok(Ok(None)) => Ok(Waited::Gone),
        Ok(Ok(Some(o))) => Ok(Waited::Done(o)),
    }
}

/// Names of objects with an operation in flight; a second concurrent call for the same name
/// gets `ABORTED`, as the CSI specification recommends.
#[derive(Debug, Clone, Default)]
pub struct Inflight(Arc<Mutex<HashSet<String>>>);

/// Removes its key from the in-flight set when dropped.
#[derive(Debug)]
pub struct InflightGuard {
    set: Arc<Mutex<HashSet<String>>>,
    key: String,
}

impl Inflight {
    /// Claims `key`, or fails with `ABORTED` when another call holds it.
    pub fn claim(&self, key: &str) -> Result<InflightGuard> {
        let mut set = self
            .0
            .lock()
            .map_err(|_| CsiError::Internal("in-flight set poisoned".into()))?;
        if !set.insert(key.to_string()) {
            return Err(CsiError::Busy(format!(
                "an operation on {key} is already in progress"
            )));
        }
        Ok(InflightGuard {
            set: Arc::clone(&self.0),
            key: key.to_string(),
        })
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if let Ok(mut set) = self.set.lock() {
            set.remove(&self.key);
        }
    }
}

/// `namespace/name` of an object, for messages.
pub fn describe<K: Resource>(o: &K) -> String {
    format!(
        "{}/{}",
        o.meta().namespace.as_deref().unwrap_or_default(),
        o.meta().name.as_deref().unwrap_or_default()
    )
}

/// Shorthand for `ResourceExt::name_any`.
pub fn name<K: Resource>(o: &K) -> String {
    o.name_any()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn label_values() {
        assert!(is_label_value("0b9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a11"));
        assert!(!is_label_value(""));
        assert!(!is_label_value("a/b"));
        assert!(!is_label_value(&"x".repeat(64)));
        assert!(!is_label_value("-a"));
    }

    #[test]
    fn inflight_is_exclusive() {
        let f = Inflight::default();
        let g = f.claim("v1").unwrap();
        assert_eq!(
            f.claim("v1").unwrap_err().kind(),
            crate::error::ErrorKind::Aborted
        );
        drop(g);
        assert!(f.claim("v1").is_ok());
    }
}
