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
    controller: bool,
}

impl IdentityService {
    /// `controller` tells whether this process also serves the Controller service.
    pub fn new(version: impl Into<String>, controller: bool) -> Self {
        IdentityService {
            version: version.into(),
            controller,
        }
    }
}

/// Plug-in capabilities: the controller service (when served), topology constraints and
/// online expansion.
pub fn plugin_capabilities(controller: bool) -> Vec<PluginCapability> {
    let svc = |t: service::Type| PluginCapability {
        r#type: Some(plugin_capability::Type::Service(
            plugin_capability::Service { r#type: t as i32 },
        )),
    };
    let mut caps = Vec::new();
    if controller {
        caps.push(svc(service::Type::ControllerService));
    }
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
            capabilities: plugin_capabilities(self.controller),
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
