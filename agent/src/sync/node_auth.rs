//! Follows what the hosts' kernels can do: a change of a Node's `liteio.io/nvme-host-auth`
//! reconciles this agent's volumes consumed on that node, so that their exports give the
//! host's entry keys, or take them away, at once (see [`liteio_api::host_auth`]).
//!
//! Without it, an annotation that appears or changes after a volume was exported (the CSI
//! node started after the export, the node rebooted into another kernel) reached the export
//! only at the volume's next reconcile, and a `preferred` NodeStageVolume waited for
//! `obnvmf/hosts-without-auth` until its deadline.
//!
//! One metadata-only watch of the Nodes (an agent reads nothing else of them), of which only
//! the annotation's value per Node is kept ([`CapabilityChanges`]); the volumes of a changed
//! Node are looked up in the volume controller's own cache, never listed from the API
//! server. What the watch last listed is also kept whole, for the exports to read
//! ([`crate::state::capabilities`]). Only the consumer's entry (`spec.hostNode.id`) follows a capability: a migration's
//! pipe host is SPDK's initiator on the source node, which always authenticates, so its
//! Node's annotation changes nothing and its volumes are not requeued for it.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Node;
use kube::api::PartialObjectMeta;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Resource};
use liteio_api::AntstorVolume;
use liteio_api::keys::annotations;
use tracing::{info, warn};

use crate::context::Ctx;

/// The last value of each Node's `liteio.io/nvme-host-auth` seen on the watch, and which
/// Nodes' values changed with each event.
///
/// A Node first seen with the annotation counts as a change (a Node that joins, or one seen
/// for the first time after the agent started: its volumes are reconciled then anyway, and
/// a second pass changes nothing). A deleted Node, or one gone from a re-list, has lost its
/// value: a change too (its hosts' capability is unknown again, which never downgrades).
#[derive(Debug, Default)]
pub struct CapabilityChanges {
    /// Node → annotation value, for the Nodes that have one.
    seen: HashMap<String, String>,
    /// The values of a re-list under way (between `Init` and `InitDone`).
    relist: Option<HashMap<String, String>>,
}

impl CapabilityChanges {
    /// The Nodes whose annotation `event` changed.
    pub fn observe<K: Resource>(&mut self, event: watcher::Event<K>) -> Vec<String> {
        match event {
            watcher::Event::Apply(n) => self.set(&n, value(&n)),
            watcher::Event::Delete(n) => self.set(&n, None),
            watcher::Event::Init => {
                self.relist = Some(HashMap::new());
                Vec::new()
            }
            watcher::Event::InitApply(n) => match self.relist.as_mut() {
                Some(relist) => {
                    if let Some(v) = value(&n) {
                        relist.insert(n.meta().name.clone().unwrap_or_default(), v);
                    }
                    Vec::new()
                }
                None => self.set(&n, value(&n)),
            },
            watcher::Event::InitDone => {
                let Some(relist) = self.relist.take() else {
                    return Vec::new();
                };
                let mut changed: Vec<String> = self
                    .seen
                    .iter()
                    .filter(|(n, v)| relist.get(*n) != Some(*v))
                    .map(|(n, _)| n.clone())
                    .chain(
                        relist
                            .keys()
                            .filter(|n| !self.seen.contains_key(*n))
                            .cloned(),
                    )
                    .collect();
                changed.sort();
                self.seen = relist;
                changed
            }
        }
    }

    /// Records `value` for the Node of `n`; its name when that is a change.
    fn set<K: Resource>(&mut self, n: &K, value: Option<String>) -> Vec<String> {
        let name = n.meta().name.clone().unwrap_or_default();
        let before = match &value {
            Some(v) => self.seen.insert(name.clone(), v.clone()),
            None => self.seen.remove(&name),
        };
        if before == value {
            Vec::new()
        } else {
            vec![name]
        }
    }
}

/// The annotation's value on `n` (trimmed), when it has one.
fn value<K: Resource>(n: &K) -> Option<String> {
    n.meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::NODE_HOST_AUTH))
        .map(|v| v.trim().to_string())
}

/// This agent's volumes (in the controller's cache `store`) consumed on `node`.
pub fn consumed_on(store: &Store<AntstorVolume>, node: &str) -> Vec<ObjectRef<AntstorVolume>> {
    store
        .state_filter(|v| {
            v.metadata.deletion_timestamp.is_none()
                && v.spec.host_node.as_ref().is_some_and(|h| h.id == node)
        })
        .iter()
        .map(|v| ObjectRef::from_obj(v.as_ref()))
        .collect()
}

/// The volumes to reconcile because their consumer's capability changed: a watch of the
/// Nodes' metadata, mapped through the volume controller's cache `store`. Empty when the
/// exporter does not authenticate (the capability is then never read).
pub(crate) fn volume_triggers(
    ctx: &Arc<Ctx>,
    store: Store<AntstorVolume>,
) -> BoxStream<'static, ObjectRef<AntstorVolume>> {
    if !ctx.exporter.authenticates() {
        return futures::stream::empty().boxed();
    }
    let nodes: Api<PartialObjectMeta<Node>> = Api::all(ctx.client.clone());
    let mut changes = CapabilityChanges::default();
    let known = ctx.capabilities.clone();
    watcher(nodes, watcher::Config::default())
        .default_backoff()
        .map(move |ev| match ev {
            Ok(ev) => {
                known.observe(&ev);
                changes.observe(ev)
            }
            Err(e) => {
                warn!(error = %e, "cannot watch the Nodes for their hosts' authentication support; retrying");
                Vec::new()
            }
        })
        .flat_map(move |changed| {
            let refs: Vec<ObjectRef<AntstorVolume>> = changed
                .iter()
                .flat_map(|node| {
                    let refs = consumed_on(&store, node);
                    if !refs.is_empty() {
                        info!(node = %node, volumes = refs.len(), annotation = annotations::NODE_HOST_AUTH, "the Node's host authentication support is new or changed; reconciling the volumes consumed there");
                    }
                    refs
                })
                .collect();
            futures::stream::iter(refs)
        })
        .boxed()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use k8s_openapi::api::core::v1::Node;
    use kube::runtime::watcher::Event;

    use super::{CapabilityChanges, consumed_on};
    use crate::state::capabilities::tests::node;
    use liteio_api::{AntstorVolume, NodeInfo};

    #[test]
    fn only_a_change_of_the_annotation_counts() {
        let mut c = CapabilityChanges::default();
        assert!(
            c.observe(Event::Apply(node("a", None))).is_empty(),
            "never had it"
        );
        assert_eq!(c.observe(Event::Apply(node("a", Some("none")))), ["a"]);
        assert!(
            c.observe(Event::Apply(node("a", Some(" none "))))
                .is_empty(),
            "same value: another field of the Node changed"
        );
        assert_eq!(c.observe(Event::Apply(node("a", Some("dhchap")))), ["a"]);
        assert_eq!(c.observe(Event::Apply(node("a", None))), ["a"], "removed");
        assert_eq!(c.observe(Event::Apply(node("a", Some("dhchap")))), ["a"]);
        assert_eq!(c.observe(Event::Delete(node("a", Some("dhchap")))), ["a"]);
        assert!(c.observe(Event::Delete(node("b", None))).is_empty());
    }

    #[test]
    fn a_relist_tells_what_changed_while_the_watch_was_away() {
        let mut c = CapabilityChanges::default();
        for ev in [
            Event::Init,
            Event::InitApply(node("same", Some("dhchap"))),
            Event::InitApply(node("flips", Some("dhchap"))),
            Event::InitApply(node("gone", Some("none"))),
            Event::InitApply(node("bare", None)),
        ] {
            assert!(c.observe(ev).is_empty(), "nothing before InitDone");
        }
        assert_eq!(
            c.observe(Event::<Node>::InitDone),
            ["flips", "gone", "same"],
            "first sight"
        );
        for ev in [
            Event::Init,
            Event::InitApply(node("same", Some("dhchap"))),
            Event::InitApply(node("flips", Some("none"))),
            Event::InitApply(node("bare", Some("dhchap,tls"))),
        ] {
            assert!(c.observe(ev).is_empty());
        }
        // "gone" was deleted while the watch was away: no Delete event, but a change.
        assert_eq!(
            c.observe(Event::<Node>::InitDone),
            ["bare", "flips", "gone"]
        );
        assert!(
            c.observe(Event::<Node>::InitDone).is_empty(),
            "no re-list under way"
        );
    }

    #[test]
    fn the_volumes_of_a_node_are_those_it_consumes() {
        let (store, mut writer) = kube::runtime::reflector::store::<AntstorVolume>();
        for (name, host, deleting) in [
            ("a", Some("n1"), false),
            ("b", Some("n2"), false),
            ("c", Some("n1"), true),
            ("d", None, false),
            ("e", Some("n1"), false),
        ] {
            let mut v = AntstorVolume::new(name, Default::default());
            v.metadata.namespace = Some("obnvmf".into());
            v.spec.target_node_id = "n2".into();
            v.spec.host_node = host.map(|h| NodeInfo {
                id: h.into(),
                ..NodeInfo::default()
            });
            if deleting {
                v.metadata.deletion_timestamp = Some(
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
                );
            }
            writer.apply_watcher_event(&Event::Apply(v));
        }
        let mut got: Vec<String> = consumed_on(&store, "n1")
            .into_iter()
            .map(|r| format!("{}/{}", r.namespace.unwrap_or_default(), r.name))
            .collect();
        got.sort();
        assert_eq!(got, ["obnvmf/a", "obnvmf/e"]);
        assert!(consumed_on(&store, "n3").is_empty());
    }
}
