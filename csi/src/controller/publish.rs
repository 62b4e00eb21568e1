//! ControllerPublishVolume and ControllerUnpublishVolume of plain volumes: what the
//! publication means for the volume ([`crate::publish`]: stay, or move its consumer) is
//! recorded on the AntstorVolume, and a move waits until the storage node's agent admits
//! the new node to the export. A multi-disk volume's host is set in [`super::group`].

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::api::{ListParams, PostParams};
use liteio_api::AntstorVolume;
use liteio_api::keys::{annotations, labels};
use tracing::info;

use super::ControllerService;
use super::checks;
use crate::csi::{
    ControllerPublishVolumeRequest, ControllerPublishVolumeResponse,
    ControllerUnpublishVolumeRequest, ControllerUnpublishVolumeResponse,
};
use crate::error::{CsiError, Result};
use crate::group;
use crate::k8s::{self, Waited};
use crate::publish;

impl ControllerService {
    /// ControllerPublishVolume: see [`publish`].
    pub(super) async fn publish_inner(
        &self,
        req: &ControllerPublishVolumeRequest,
    ) -> Result<ControllerPublishVolumeResponse> {
        let (id, node) = checks::publish(req)?;
        if group::is_group_id(id) {
            self.require_node(node).await?;
            self.publish_group(id, node).await?;
            return Ok(ControllerPublishVolumeResponse::default());
        }
        let _guard = self.inflight.claim(&format!("volume {id}"))?;
        self.require_node(node).await?;
        let name = 'retry: {
            for attempt in 0..5 {
                let mut v = self.find_volume(id).await?;
                let name = v.name_any();
                let migration = self.migration_of(&v).await?;
                let exportable = v.spec.spdk_target.is_some()
                    || match v.target_node() {
                        Some(t) => k8s::get_opt(&self.pools(), "StoragePool", t)
                            .await?
                            .is_some_and(|p| p.can_export()),
                        None => false,
                    };
                let plan = publish::plan(&v, node, exportable, migration.as_deref())?;
                let recorded = publish::published_node(&v) == Some(node);
                if plan == publish::Plan::Stay && recorded {
                    return Ok(ControllerPublishVolumeResponse::default());
                }
                let annos = v.metadata.annotations.get_or_insert_with(BTreeMap::new);
                annos.insert(annotations::PUBLISHED_NODE.into(), node.into());
                if let publish::Plan::Move { from } = &plan {
                    // Reached over NVMe-oF from now on (or used on its own node): no longer
                    // bound to the node it was placed on.
                    annos.remove(annotations::LOCAL_ONLY);
                    v.spec.host_node = Some(self.node_info(node).await?);
                    info!(volume = %name, from = %from, to = node, "volume's consumer moves to the node it is published to");
                }
                match self
                    .volumes()
                    .replace(&name, &PostParams::default(), &v)
                    .await
                {
                    Ok(_) if plan == publish::Plan::Stay => {
                        info!(volume = %name, node, "volume published");
                        return Ok(ControllerPublishVolumeResponse::default());
                    }
                    Ok(_) => break 'retry name,
                    Err(kube::Error::Api(s)) if s.code == 409 && attempt < 4 => continue,
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        return Err(CsiError::Busy(format!(
                            "volume {name} changed while publishing; retry"
                        )));
                    }
                    Err(e) => {
                        return Err(CsiError::kube(format!("update AntstorVolume {name}"), e));
                    }
                }
            }
            return Err(CsiError::Busy(format!(
                "volume {id} kept changing while publishing; retry"
            )));
        };
        // The consumer moved: wait until the storage node's agent admits the new node.
        let who = node.to_string();
        match k8s::wait_for(
            self.volumes(),
            "AntstorVolume",
            &name,
            self.cfg.schedule_timeout,
            move |v: &AntstorVolume| publish::exported_to(v, &who),
        )
        .await?
        {
            Waited::Done(_) => {
                info!(volume = %name, node, "volume published; its export admits the node");
                Ok(ControllerPublishVolumeResponse::default())
            }
            Waited::Gone => Err(CsiError::NotFound(format!("volume {name} was deleted"))),
            Waited::TimedOut => Err(CsiError::Pending(format!(
                "volume {name} is published to node {node}, but its storage node's agent has not admitted that node to the volume's export after {}s (annotation {}); retry",
                self.cfg.schedule_timeout.as_secs(),
                annotations::EXPORTED_TO
            ))),
        }
    }

    /// ControllerUnpublishVolume: clears the publish record of the node (of any node when the
    /// request names none). A volume that does not exist is unpublished (OK).
    pub(super) async fn unpublish_inner(
        &self,
        req: &ControllerUnpublishVolumeRequest,
    ) -> Result<ControllerUnpublishVolumeResponse> {
        let id = checks::volume_id(&req.volume_id)?;
        if group::is_group_id(id) {
            // The host stays recorded until another node publishes the volume.
            return Ok(ControllerUnpublishVolumeResponse::default());
        }
        let _guard = self.inflight.claim(&format!("volume {id}"))?;
        for attempt in 0..5 {
            let Some(mut v) = self.by_uuid.volume(&self.volumes(), id).await? else {
                return Ok(ControllerUnpublishVolumeResponse::default());
            };
            let name = v.name_any();
            match publish::published_node(&v) {
                Some(p) if req.node_id.is_empty() || p == req.node_id => {}
                _ => return Ok(ControllerUnpublishVolumeResponse::default()),
            }
            if let Some(a) = v.metadata.annotations.as_mut() {
                a.remove(annotations::PUBLISHED_NODE);
            }
            match self
                .volumes()
                .replace(&name, &PostParams::default(), &v)
                .await
            {
                Ok(_) => {
                    info!(volume = %name, node = %req.node_id, "volume unpublished");
                    return Ok(ControllerUnpublishVolumeResponse::default());
                }
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < 4 => continue,
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    return Ok(ControllerUnpublishVolumeResponse::default());
                }
                Err(e) => return Err(CsiError::kube(format!("update AntstorVolume {name}"), e)),
            }
        }
        Err(CsiError::Busy(format!(
            "volume {id} kept changing while unpublishing; retry"
        )))
    }

    /// The running migration of `vol`, by name: a destination volume names its source
    /// (label `migrate.obnvmf/source-volume-name`) while the migration runs.
    pub(super) async fn migration_of(&self, vol: &AntstorVolume) -> Result<Option<String>> {
        if let Some(m) = vol.labels().get(labels::MIGRATE_MIGRATION_NAME) {
            return Ok(Some(m.clone()));
        }
        let name = vol.name_any();
        if !k8s::is_label_value(&name) {
            return Ok(None);
        }
        let lp =
            ListParams::default().labels(&format!("{}={name}", labels::MIGRATE_SOURCE_VOLUME_NAME));
        let dests = self
            .volumes()
            .list(&lp)
            .await
            .map_err(|e| CsiError::kube("list AntstorVolumes being migrated to", e))?;
        Ok(dests.items.first().map(|d| {
            d.labels()
                .get(labels::MIGRATE_MIGRATION_NAME)
                .cloned()
                .unwrap_or_else(|| d.name_any())
        }))
    }
}
