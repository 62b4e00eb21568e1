//! Authentication on this node: the DH-HMAC-CHAP keys kubelet passes in a request's
//! `secrets` ([`stage_keys`], [`publish_keys`]; errors name the Secret data key, never its
//! value), the report of a key refresh at NodePublishVolume ([`report_key_refresh`]), and
//! what this host's kernel can do, announced on its Node object ([`publish_capabilities`]).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use liteio_api::auth::VolumeKeys;
use liteio_api::host_auth::HostAuthCapability;
use liteio_api::keys::{self, managers};
use serde_json::json;
use tracing::{info, warn};

use crate::error::{CsiError, Result};
use crate::nvme;

/// The keys kubelet passed in `NodeStageVolumeRequest.secrets`: `None` when it passed none
/// (the StorageClass names no node-stage Secret). Errors name the Secret data key and never
/// contain its value.
pub fn stage_keys(secrets: &HashMap<String, String>) -> Result<Option<VolumeKeys>> {
    request_keys(secrets, "node-stage")
}

/// The keys kubelet passed in `NodePublishVolumeRequest.secrets` (also at each periodic
/// republish): `None` when it passed none (the StorageClass names no node-publish Secret).
/// Errors name the Secret data key and never contain its value.
pub fn publish_keys(secrets: &HashMap<String, String>) -> Result<Option<VolumeKeys>> {
    request_keys(secrets, "node-publish")
}

pub(crate) fn request_keys(
    secrets: &HashMap<String, String>,
    which: &str,
) -> Result<Option<VolumeKeys>> {
    if secrets.is_empty() {
        return Ok(None);
    }
    VolumeKeys::from_string_map(secrets)
        .map(Some)
        .map_err(|e| CsiError::invalid("secrets", format!("{e} (in the {which} Secret)")))
}

/// What [`crate::node::Host::refresh_keys`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRefresh {
    /// The volume has no NVMe/TCP controller on this node (a local device, or not connected).
    NotConnected,
    /// The controller holds these keys already: nothing was written.
    Unchanged {
        /// Controller name (`nvme3`).
        controller: String,
    },
    /// New keys were written; the kernel re-authenticates the controller with them.
    Written {
        /// Controller name (`nvme3`).
        controller: String,
        /// The sysfs attributes written ([`nvme::ATTR_DHCHAP_SECRET`], …).
        attributes: Vec<&'static str>,
    },
}

/// Logs the outcome of a key refresh of `volume` at NodePublishVolume. A failure is a
/// warning, not a failed publish: the volume stays usable over its current connection, and
/// kubelet's next republish tries again. Nothing logged holds a secret: errors name Secret
/// data keys and sysfs attributes only.
pub fn report_key_refresh(volume: &str, outcome: &Result<KeyRefresh>) {
    match outcome {
        Ok(KeyRefresh::NotConnected | KeyRefresh::Unchanged { .. }) => {}
        Ok(KeyRefresh::Written {
            controller,
            attributes,
        }) => {
            info!(volume, controller = %controller, attributes = %attributes.join(","), "gave the volume's current DH-HMAC-CHAP keys to its NVMe controller; the kernel re-authenticates with them");
        }
        Err(e) => {
            warn!(volume, kind = e.kind().as_str(), error = %e.chain(), "cannot give the volume's current DH-HMAC-CHAP keys to its NVMe controller; it keeps working with its old keys until a reconnect, and the next republish tries again");
        }
    }
}

/// What `caps` says, in the api crate's terms.
pub fn capability(caps: &nvme::HostCapabilities) -> HostAuthCapability {
    HostAuthCapability {
        dhchap: caps.dhchap,
        tls: caps.tls,
        kernel: caps.kernel.clone(),
    }
}

/// Writes `caps` onto Node `node`'s annotations unless they say so already; `true` when it
/// wrote.
pub async fn publish_capabilities(
    client: &Client,
    node: &str,
    caps: &nvme::HostCapabilities,
) -> Result<bool> {
    let nodes: Api<KubeNode> = Api::all(client.clone());
    let current = nodes
        .get(node)
        .await
        .map_err(|e| CsiError::kube(format!("get Node {node}"), e))?;
    let want = capability(caps);
    let have = HostAuthCapability::from_annotations(current.metadata.annotations.as_ref());
    if have.as_ref() == Some(&want) {
        return Ok(false);
    }
    let body = json!({"metadata": {"annotations": {
        keys::annotations::NODE_HOST_AUTH: want.annotation(),
        keys::annotations::NODE_KERNEL_RELEASE: want.kernel,
    }}});
    let pp = PatchParams {
        field_manager: Some(managers::CSI.to_string()),
        ..PatchParams::default()
    };
    nodes
        .patch(node, &pp, &Patch::Merge(&body))
        .await
        .map_err(|e| CsiError::kube(format!("annotate Node {node}"), e))?;
    Ok(true)
}
