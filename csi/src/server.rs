//! The gRPC server on a unix socket.

use std::future::Future;
use std::path::PathBuf;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use crate::controller::ControllerService;
use crate::csi::controller_server::ControllerServer;
use crate::csi::identity_server::IdentityServer;
use crate::csi::node_server::NodeServer;
use crate::error::{CsiError, Result};
use crate::identity::IdentityService;
use crate::node::NodeService;

/// The socket path of an endpoint: `unix:///csi/csi.sock`, `unix:/csi/csi.sock` or a plain
/// absolute path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf> {
    let rest = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    if rest.is_empty() || !rest.starts_with('/') {
        return Err(CsiError::invalid(
            "endpoint",
            format!("{endpoint:?} is not unix:///absolute/path.sock"),
        ));
    }
    Ok(PathBuf::from(rest))
}

/// The services one process offers.
pub struct Services {
    /// Always served.
    pub identity: IdentityService,
    /// Served in controller mode.
    pub controller: Option<ControllerService>,
    /// Served in node mode.
    pub node: Option<NodeService>,
}

/// Binds `endpoint` (removing a stale socket file first).
pub fn bind(endpoint: &str) -> Result<UnixListener> {
    let path = socket_path(endpoint)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| CsiError::io(format!("create {}", dir.display()), e))?;
    }
    match std::fs::remove_file(&path) {
        Ok(()) => tracing::info!(path = %path.display(), "removed stale socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(CsiError::io(format!("remove {}", path.display()), e)),
    }
    UnixListener::bind(&path).map_err(|e| CsiError::io(format!("listen on {}", path.display()), e))
}

/// Serves `services` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: UnixListener,
    services: Services,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    tonic::transport::Server::builder()
        .add_service(IdentityServer::new(services.identity))
        .add_optional_service(services.controller.map(ControllerServer::new))
        .add_optional_service(services.node.map(NodeServer::new))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
        .map_err(|e| CsiError::Internal(format!("gRPC server failed: {e}")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            socket_path("unix:///csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("unix:/csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(socket_path("/x.sock").unwrap(), PathBuf::from("/x.sock"));
        assert!(socket_path("unix://csi/csi.sock").is_err());
        assert!(socket_path("tcp://1.2.3.4:5").is_err());
    }
}
