//! The names of the AntstorVolumes by their uuid label, kept by a metadata-only watch, so
//! that DeleteVolume and the other calls that name a volume by its CSI id (its uuid) read
//! one object instead of listing by label: an API server filters a label selector over
//! every object it holds, so one list per call made a burst of deletions O(n²).
//!
//! The index only shortens the look-up, it never decides alone: a uuid it does not know
//! (a volume created a moment ago may not be in it yet) or knows on more than one volume
//! (both ends of a hot migration carry it) is looked up by label as before, and the volume
//! it names is read with a GET and must still carry the uuid.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::StreamExt;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use liteio_api::AntstorVolume;
use liteio_api::keys::labels;
use tracing::warn;

use crate::error::Result;
use crate::k8s;

#[derive(Debug, Default)]
struct Maps {
    /// uuid label → names of the volumes carrying it.
    names: HashMap<String, BTreeSet<String>>,
    /// name → its uuid label, to move or drop an entry when the label changes or the
    /// volume goes.
    uuid_of: HashMap<String, String>,
    /// A relist in progress (`Init` … `InitDone`).
    relist: Option<Vec<(String, String)>>,
}

impl Maps {
    fn forget(&mut self, name: &str) {
        if let Some(old) = self.uuid_of.remove(name)
            && let Some(set) = self.names.get_mut(&old)
        {
            set.remove(name);
            if set.is_empty() {
                self.names.remove(&old);
            }
        }
    }

    fn set(&mut self, name: String, uuid: Option<String>) {
        self.forget(&name);
        if let Some(u) = uuid {
            self.names
                .entry(u.clone())
                .or_default()
                .insert(name.clone());
            self.uuid_of.insert(name, u);
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    maps: Mutex<Maps>,
    /// The watch, started by the first look-up; stopped when the index goes.
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(t) = self
            .task
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            t.abort();
        }
    }
}

/// Volume names by uuid (see the module documentation). Clones share one index.
#[derive(Debug, Clone, Default)]
pub struct UuidIndex(Arc<Inner>);

fn uuid_label(meta: &kube::api::ObjectMeta) -> Option<String> {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(labels::VOL_UUID))
        .cloned()
}

impl UuidIndex {
    fn maps(&self) -> MutexGuard<'_, Maps> {
        self.0.maps.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts the watch of `api`'s volumes unless it runs.
    fn ensure_started(&self, api: &Api<AntstorVolume>) {
        let mut task = self.0.task.lock().unwrap_or_else(PoisonError::into_inner);
        if task.is_some() {
            return;
        }
        // The task holds the maps only weakly: the index going stops it.
        let weak = Arc::downgrade(&self.0);
        let meta: Api<PartialObjectMeta<AntstorVolume>> = Api::namespaced(
            api.clone().into_client(),
            api.namespace().unwrap_or_default(),
        );
        let stream = watcher(meta, watcher::Config::default()).default_backoff();
        *task = Some(tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let ev = match ev {
                    Ok(ev) => ev,
                    Err(e) => {
                        warn!(error = %e, "watch of AntstorVolumes for the uuid index failed; retrying");
                        continue;
                    }
                };
                let mut m = inner.maps.lock().unwrap_or_else(PoisonError::into_inner);
                match ev {
                    Event::Init => m.relist = Some(Vec::new()),
                    Event::InitApply(o) => {
                        if let (Some(list), Some(name), Some(u)) = (
                            m.relist.as_mut(),
                            o.metadata.name.clone(),
                            uuid_label(&o.metadata),
                        ) {
                            list.push((name, u));
                        }
                    }
                    Event::InitDone => {
                        let list = m.relist.take().unwrap_or_default();
                        m.names.clear();
                        m.uuid_of.clear();
                        for (name, u) in list {
                            m.set(name, Some(u));
                        }
                    }
                    Event::Apply(o) => {
                        if let Some(name) = o.metadata.name.clone() {
                            let u = uuid_label(&o.metadata);
                            m.set(name, u);
                        }
                    }
                    Event::Delete(o) => {
                        if let Some(name) = o.metadata.name.as_deref() {
                            m.forget(name);
                        }
                    }
                }
            }
        }));
    }

    /// The one volume name the index holds for `uuid`, if exactly one.
    fn only_name(&self, uuid: &str) -> Option<String> {
        let m = self.maps();
        let set = m.names.get(uuid)?;
        (set.len() == 1)
            .then(|| set.iter().next().cloned())
            .flatten()
    }

    /// The AntstorVolume whose uuid is `uuid`, as [`k8s::volume_by_uuid`] finds it: through
    /// the index and one GET when the index names one volume that still carries the uuid,
    /// else by label.
    pub async fn volume(
        &self,
        api: &Api<AntstorVolume>,
        uuid: &str,
    ) -> Result<Option<AntstorVolume>> {
        self.ensure_started(api);
        if let Some(name) = self.only_name(uuid)
            && let Some(v) = k8s::get_opt(api, "AntstorVolume", &name).await?
            && uuid_label(&v.metadata).as_deref() == Some(uuid)
        {
            return Ok(Some(v));
        }
        k8s::volume_by_uuid(api, uuid).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_changed_or_removed_label_moves_the_entry() {
        let mut m = Maps::default();
        m.set("a".into(), Some("u1".into()));
        m.set("b".into(), Some("u1".into()));
        assert_eq!(m.names["u1"].len(), 2);
        // A retired migration source loses the label.
        m.set("a".into(), None);
        assert_eq!(m.names["u1"].iter().collect::<Vec<_>>(), ["b"]);
        m.set("b".into(), Some("u2".into()));
        assert!(!m.names.contains_key("u1"));
        m.forget("b");
        assert!(m.names.is_empty() && m.uuid_of.is_empty());
    }
}
