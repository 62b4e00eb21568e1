//! ControllerPublishVolume and ControllerUnpublishVolume: the CO's attach of a volume to the
//! node that will stage it.
//!
//! A volume is served to one consumer node (`spec.hostNode`): its NVMe-oF export admits that
//! node's host NQN alone. Publishing it to a node:
//! - that is its consumer already: nothing changes (idempotent);
//! - that is another node: the volume moves to it (`spec.hostNode`), when it can be reached
//!   from there: it is exported over NVMe-oF (`spec.spdkTarget`) or lives on that very node,
//!   it is not `MustLocal`, and no migration of it is running. The storage node's agent then
//!   admits the new node's NQN instead of the old one and says so in
//!   [`annotations::EXPORTED_TO`]; the publish waits for that, bounded.
//!
//! The node it is published to is recorded ([`annotations::PUBLISHED_NODE`]); the volume's
//! access modes admit one node, so a publish to a second node is FAILED_PRECONDITION until the
//! first is unpublished. Unpublishing clears the record and leaves the consumer as it is
//! (its export goes on admitting that node until another publish moves it).

use liteio_api::keys::annotations;
use liteio_api::meta::annotation;
use liteio_api::{AntstorVolume, VolumePosition};

use crate::error::{CsiError, Result};

/// What a publish of a volume to a node does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// The node is the volume's consumer: at most the publish record is written.
    Stay,
    /// The volume moves to the node (`spec.hostNode`).
    Move {
        /// The node it moves from (empty: it had none).
        from: String,
    },
}

/// The consumer node recorded on the volume (`spec.hostNode.id`), if any.
pub fn consumer(vol: &AntstorVolume) -> Option<&str> {
    vol.spec
        .host_node
        .as_ref()
        .map(|h| h.id.as_str())
        .filter(|id| !id.is_empty())
}

/// The node the volume is published to, if any.
pub fn published_node(vol: &AntstorVolume) -> Option<&str> {
    annotation(&vol.metadata, annotations::PUBLISHED_NODE).filter(|n| !n.is_empty())
}

/// Whether `node` can use the volume now: its export admits the node, or, without an
/// export, the volume lives on that node.
pub fn exported_to(vol: &AntstorVolume, node: &str) -> bool {
    if vol.spec.spdk_target.is_some() {
        annotation(&vol.metadata, annotations::EXPORTED_TO) == Some(node)
    } else {
        vol.spec.target_node_id == node
    }
}

/// What publishing `vol` to `node` does, or why it cannot. `exportable`: the volume is
/// exported over NVMe-oF or its pool can export it (its node's SPDK target works);
/// `migration` names a running migration of the volume.
pub fn plan(
    vol: &AntstorVolume,
    node: &str,
    exportable: bool,
    migration: Option<&str>,
) -> Result<Plan> {
    let name = vol.metadata.name.as_deref().unwrap_or_default();
    if let Some(other) = published_node(vol).filter(|p| *p != node) {
        return Err(CsiError::FailedPrecondition(format!(
            "volume {name} is published to node {other}; its access mode admits one node: it must be unpublished there (ControllerUnpublishVolume) before node {node} can use it"
        )));
    }
    let from = consumer(vol).unwrap_or_default();
    if from == node {
        return Ok(Plan::Stay);
    }
    let target = vol.spec.target_node_id.as_str();
    if target.is_empty() {
        return Err(CsiError::Pending(format!(
            "volume {name} is not placed on a storage node yet; retry"
        )));
    }
    if vol.spec.position_advice == VolumePosition::MustLocal && target != node {
        return Err(CsiError::FailedPrecondition(format!(
            "volume {name} is MustLocal on node {target} (positionAdvice): it cannot be used on node {node}"
        )));
    }
    if !exportable && target != node {
        return Err(CsiError::FailedPrecondition(format!(
            "volume {name} lives on node {target}, whose pool cannot export it over NVMe-oF (no working SPDK target there: its StoragePool's Spdk condition): it can be used on node {target} only, not on node {node}"
        )));
    }
    if let Some(m) = migration {
        return Err(CsiError::Busy(format!(
            "volume {name} is being migrated (migration {m}); its consumer cannot move to node {node} until the migration ends; retry"
        )));
    }
    Ok(Plan::Move {
        from: from.to_string(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use liteio_api::{NodeInfo, SpdkTarget};
    use std::collections::BTreeMap;

    fn vol(host: &str, target: &str, exported: bool) -> AntstorVolume {
        let mut v = AntstorVolume::new("pvc-1", Default::default());
        v.spec.target_node_id = target.into();
        if !host.is_empty() {
            v.spec.host_node = Some(NodeInfo {
                id: host.into(),
                ..NodeInfo::default()
            });
        }
        if exported {
            v.spec.spdk_target = Some(SpdkTarget::default());
        }
        v
    }

    fn annotate(v: &mut AntstorVolume, key: &str, value: &str) {
        v.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
    }

    #[test]
    fn the_consumer_stays() {
        assert_eq!(
            plan(&vol("a", "s", true), "a", true, None).unwrap(),
            Plan::Stay
        );
        // Even a local-only volume, and while it migrates.
        assert_eq!(
            plan(&vol("s", "s", false), "s", false, Some("m")).unwrap(),
            Plan::Stay
        );
    }

    #[test]
    fn an_exported_volume_moves_to_another_node() {
        assert_eq!(
            plan(&vol("s", "s", true), "b", true, None).unwrap(),
            Plan::Move { from: "s".into() }
        );
        assert_eq!(
            plan(&vol("", "s", true), "b", true, None).unwrap(),
            Plan::Move {
                from: String::new()
            }
        );
        // Not exported yet (just created), on a pool that can export it: it moves, and the
        // publish waits for the export.
        assert_eq!(
            plan(&vol("s", "s", false), "b", true, None).unwrap(),
            Plan::Move { from: "s".into() }
        );
        // A volume that is not exported may still move onto its own storage node.
        assert_eq!(
            plan(&vol("a", "s", false), "s", false, None).unwrap(),
            Plan::Move { from: "a".into() }
        );
    }

    #[test]
    fn refusals_name_the_reason() {
        let e = plan(&vol("s", "s", false), "b", false, None).unwrap_err();
        assert!(
            matches!(e, CsiError::FailedPrecondition(ref m) if m.contains("on node s only")),
            "{e}"
        );
        let mut must = vol("s", "s", true);
        must.spec.position_advice = VolumePosition::MustLocal;
        let e = plan(&must, "b", true, None).unwrap_err();
        assert!(
            matches!(e, CsiError::FailedPrecondition(ref m) if m.contains("MustLocal")),
            "{e}"
        );
        let e = plan(&vol("s", "s", true), "b", true, Some("mig-1")).unwrap_err();
        assert!(
            matches!(e, CsiError::Busy(ref m) if m.contains("mig-1")),
            "{e}"
        );
        let e = plan(&vol("", "", true), "b", true, None).unwrap_err();
        assert!(matches!(e, CsiError::Pending(_)), "{e}");
    }

    #[test]
    fn a_volume_published_elsewhere_is_refused() {
        let mut v = vol("a", "s", true);
        annotate(&mut v, annotations::PUBLISHED_NODE, "a");
        let e = plan(&v, "b", true, None).unwrap_err();
        assert!(
            matches!(e, CsiError::FailedPrecondition(ref m) if m.contains("published to node a")),
            "{e}"
        );
        assert_eq!(plan(&v, "a", true, None).unwrap(), Plan::Stay);
    }

    #[test]
    fn export_admission_follows_the_agent() {
        let mut v = vol("b", "s", true);
        assert!(!exported_to(&v, "b"));
        annotate(&mut v, annotations::EXPORTED_TO, "s");
        assert!(!exported_to(&v, "b"));
        annotate(&mut v, annotations::EXPORTED_TO, "b");
        assert!(exported_to(&v, "b"));
        // Not exported (yet): usable on its own node only.
        assert!(exported_to(&vol("b", "b", false), "b"));
        assert!(!exported_to(&vol("b", "s", false), "b"));
    }
}
