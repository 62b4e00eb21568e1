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
//! server. Only the consumer's entry (`spec.hostNode.id`) follows a capability: a migration's
//! pipe host is SPDK's initiator on the source node, which always authenticates, so its
//! Node's annotation changes nothing and its volumes are not requeued for it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, PoisonError, RwLock};

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Node;
use kube::api::PartialObjectMeta;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Resource};
use liteio_api::AntstorVolume;
use liteio_api::host_auth::HostAuthCapability;
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

/// The hosts' capabilities as the Node watch last listed them, for the exports to read
/// instead of a GET of the consumer's Node on every pass (thousands of volumes consumed on
/// a node are thousands of passes at each resync). Only the two annotations a
/// [`HostAuthCapability`] is made of are kept, for the Nodes that have the first.
///
/// Empty ([`Self::get`] answers `None`: ask the API server) until the watch has listed every
/// Node once; a re-list replaces it whole at its end.
#[derive(Clone, Debug, Default)]
pub struct KnownCapabilities(Arc<RwLock<Known>>);

#[derive(Debug, Default)]
struct Known {
    /// Node → its two annotations; `None` until the first list is complete.
    nodes: Option<HashMap<String, BTreeMap<String, String>>>,
    /// A list under way.
    relist: Option<HashMap<String, BTreeMap<String, String>>>,
}

impl KnownCapabilities {
    /// What the Node `node` says its kernel can do: `Some(None)` when it says nothing (or
    /// there is no such Node), `None` when the watch has not listed the Nodes yet.
    pub fn get(&self, node: &str) -> Option<Option<HostAuthCapability>> {
        let known = self.0.read().unwrap_or_else(PoisonError::into_inner);
        let nodes = known.nodes.as_ref()?;
        Some(HostAuthCapability::from_annotations(nodes.get(node)))
    }

    /// Follows one event of the Node watch.
    pub fn observe<K: Resource>(&self, event: &watcher::Event<K>) {
        let mut known = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let known = &mut *known;
        match event {
            watcher::Event::Init => known.relist = Some(HashMap::new()),
            watcher::Event::InitApply(n) => {
                if let (Some(relist), Some(kept)) = (known.relist.as_mut(), kept(n)) {
                    relist.insert(n.meta().name.clone().unwrap_or_default(), kept);
                }
            }
            watcher::Event::InitDone => {
                if let Some(relist) = known.relist.take() {
                    known.nodes = Some(relist);
                }
            }
            watcher::Event::Apply(n) | watcher::Event::Delete(n) => {
                let Some(nodes) = known.nodes.as_mut() else {
                    return;
                };
                let name = n.meta().name.clone().unwrap_or_default();
                match kept(n).filter(|_| matches!(event, watcher::Event::Apply(_))) {
                    Some(k) => nodes.insert(name, k),
                    None => nodes.remove(&name),
                };
            }
        }
    }
}

/// The annotations of `n` a [`HostAuthCapability`] is made of, when it has the first.
fn kept<K: Resource>(n: &K) -> Option<BTreeMap<String, String>> {
    let a = n.meta().annotations.as_ref()?;
    a.get(annotations::NODE_HOST_AUTH)?;
    Some(
        [
            annotations::NODE_HOST_AUTH,
            annotations::NODE_KERNEL_RELEASE,
        ]
        .into_iter()
        .filter_map(|k| a.get(k).map(|v| (k.to_string(), v.clone())))
        .collect(),
    )
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
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::Node;
    use kube::runtime::watcher::Event;

    use super::{CapabilityChanges, consumed_on};
    use liteio_api::keys::annotations;
    use liteio_api::{AntstorVolume, NodeInfo};

    fn node(name: &str, can: Option<&str>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.annotations = can.map(|c| {
            BTreeMap::from([
                (annotations::NODE_HOST_AUTH.to_string(), c.to_string()),
                ("other".to_string(), "x".to_string()),
            ])
        });
        n
    }

    #[test]
    fn the_known_capabilities_follow_the_watch_and_say_nothing_before_its_first_list() {
        use super::KnownCapabilities;
        let k = KnownCapabilities::default();
        assert!(
            k.get("a").is_none(),
            "nothing listed yet: ask the API server"
        );
        k.observe(&Event::<Node>::Init);
        k.observe(&Event::InitApply(node("a", Some("dhchap"))));
        k.observe(&Event::InitApply(node("b", None)));
        assert!(k.get("a").is_none(), "the list is not complete");
        k.observe(&Event::<Node>::InitDone);
        assert!(k.get("a").unwrap().is_some_and(|c| c.dhchap && !c.tls));
        assert_eq!(k.get("b"), Some(None), "a Node that says nothing");
        assert_eq!(k.get("c"), Some(None), "no such Node");
        k.observe(&Event::Apply(node("a", Some("none"))));
        assert!(k.get("a").unwrap().is_some_and(|c| !c.dhchap));
        k.observe(&Event::Apply(node("b", Some("dhchap,tls"))));
        assert!(k.get("b").unwrap().is_some_and(|c| c.dhchap && c.tls));
        k.observe(&Event::Delete(node("b", Some("dhchap,tls"))));
        assert_eq!(k.get("b"), Some(None), "deleted");
        // A re-list replaces the copy at its end; until then the old one answers.
        k.observe(&Event::<Node>::Init);
        k.observe(&Event::InitApply(node("c", Some("tls"))));
        assert!(
            k.get("a").unwrap().is_some(),
            "the old copy until the list is complete"
        );
        k.observe(&Event::<Node>::InitDone);
        assert_eq!(k.get("a"), Some(None), "gone from the re-list");
        assert!(k.get("c").unwrap().is_some_and(|c| c.tls));
    }

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
