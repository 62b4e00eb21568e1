//! The CSI Identity service.

use liteio_api::keys::CSI_DRIVER_NAME;
use tonic::{Request, Response, Status};
use tracing::instrument;

use crate::csi::identity_server::Identity;
use crate::csi::plugin_capability::{self, service, volume_expansion};
use crate::csi::*;

/// The Identity service: name, version, capabilities and readiness.
#[derive(Debug, Clone)]
pub struct IdentityService {
    version: String,
}

impl IdentityService {
    pub fn new(version: impl Into<String>) -> Self {
        IdentityService {
            version: version.into(),
        }
    }
}

/// Plug-in capabilities: those of the driver as a whole, the same from every instance: the
/// controller service, topology constraints and online expansion. The controller service
/// runs in the controller Deployment; a node instance (`--mode=node`) reports it too, since
/// a CO or a test tool (csi-sanity with `--csi.controllerendpoint`) reads the plugin's
/// capabilities from the node socket to learn, for one, that volumes are published
/// (ControllerPublishVolume) before they are staged. Controller calls on a node-only socket
/// are UNIMPLEMENTED.
pub fn plugin_capabilities() -> Vec<PluginCapability> {
    let svc = |t: service::Type| PluginCapability {
        r#type: Some(plugin_capability::Type::Service(
            plugin_capability::Service { r#type: t as i32 },
        )),
    };
    let mut caps = vec![svc(service::Type::ControllerService)];
    caps.push(svc(service::Type::VolumeAccessibilityConstraints));
    caps.push(PluginCapability {
        r#type: Some(plugin_capability::Type::VolumeExpansion(
            plugin_capability::VolumeExpansion {
                r#type: volume_expansion::Type::Online as i32,
            },
        )),
    });
    caps
}

#[tonic::async_trait]
impl Identity for IdentityService {
    #[instrument(skip_all)]
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: CSI_DRIVER_NAME.to_string(),
            vendor_version: self.version.clone(),
            manifest: Default::default(),
        }))
    }

    #[instrument(skip_all)]
    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: plugin_capabilities(),
        }))
    }

    #[instrument(skip_all)]
    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}
