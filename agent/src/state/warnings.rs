//! The Warning events told about objects whose reconcile failed for good ([`Warnings`]):
//! one per object and distinct message.

use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use liteio_api::keys::managers;
use tracing::warn;

use super::{describe, object_key};

/// Warning events about the objects whose reconcile failed for good
/// ([`Retry::OnChange`](crate::error::Retry::OnChange)): one per object and distinct message,
/// so that an object retried on every pool change does not repeat it.
pub struct Warnings {
    recorder: Recorder,
    last: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

impl std::fmt::Debug for Warnings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Warnings").finish_non_exhaustive()
    }
}

/// Longest event note (the API server refuses notes over 1 KiB).
const NOTE_MAX: usize = 1000;

impl Warnings {
    /// Events reported by the agent of `node`.
    pub fn new(client: kube::Client, node: &str) -> Self {
        Self {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: managers::AGENT.into(),
                    instance: Some(node.to_string()),
                },
            ),
            last: Default::default(),
        }
    }

    fn last(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, String>> {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The key of `obj`: its kind, namespace and name (a volume and a snapshot may share a
    /// name).
    fn key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
        format!("{}/{}", K::kind(&()), object_key(obj))
    }

    /// Publishes a Warning event `reason` about `obj` unless the last one about it said the
    /// same (best effort: a failure is logged).
    pub async fn publish<K: Resource<DynamicType = ()>>(&self, obj: &K, reason: &str, note: &str) {
        let key = Self::key(obj);
        if self.last().get(&key).is_some_and(|n| n == note) {
            return;
        }
        let mut text = note.to_string();
        if text.len() > NOTE_MAX {
            let mut end = NOTE_MAX;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
        }
        let ev = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(text),
            action: "Reconcile".into(),
            secondary: None,
        };
        match self.recorder.publish(&ev, &obj.object_ref(&())).await {
            Ok(()) => {
                self.last().insert(key, note.to_string());
            }
            Err(e) => {
                warn!(object = %describe(obj), reason, error = %e, "cannot publish a Warning event")
            }
        }
    }

    /// `obj` reconciled: its next failure is told again.
    pub fn forget<K: Resource<DynamicType = ()>>(&self, obj: &K) {
        self.last().remove(&Self::key(obj));
    }

    /// Forgets the objects of kind `K` for which `keep` (given [`object_key`]) is false.
    pub(crate) fn retain<K: Resource<DynamicType = ()>>(&self, mut keep: impl FnMut(&str) -> bool) {
        let prefix = format!("{}/", K::kind(&()));
        self.last()
            .retain(|k, _| k.strip_prefix(&prefix).is_none_or(&mut keep));
    }
}
