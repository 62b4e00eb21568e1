//! The hosts' capabilities as the Node watch last listed them ([`KnownCapabilities`]), read
//! by the exports instead of a GET of the consumer's Node on every pass. The watch itself,
//! and the volumes it reconciles on a change, are the sync's ([`crate::sync::node_auth`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, PoisonError, RwLock};

use kube::Resource;
use kube::runtime::watcher;
use liteio_api::host_auth::HostAuthCapability;
use liteio_api::keys::annotations;

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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::Node;
    use kube::runtime::watcher::Event;
    use liteio_api::keys::annotations;

    use super::KnownCapabilities;

    /// A Node named `name` whose host-auth annotation says `can` (none when `None`), beside
    /// another annotation.
    pub(crate) fn node(name: &str, can: Option<&str>) -> Node {
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
}
