//! A CSI client over a unix socket (used by `csictl` and the tests).

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

use crate::csi::controller_client::ControllerClient;
use crate::csi::identity_client::IdentityClient;
use crate::csi::node_client::NodeClient;
use crate::error::{CsiError, Result};
use crate::server::socket_path;

/// Clients of the three services over one connection.
#[derive(Debug, Clone)]
pub struct CsiClient {
    /// Identity service.
    pub identity: IdentityClient<Channel>,
    /// Controller service.
    pub controller: ControllerClient<Channel>,
    /// Node service.
    pub node: NodeClient<Channel>,
}

/// Connects to `endpoint`: `unix:///path`, or `tcp://host:port` (a test reaching a node
/// plugin inside a VM through a forwarder; the driver itself serves only unix sockets).
pub async fn connect(endpoint: &str) -> Result<CsiClient> {
    if let Some(addr) = endpoint.strip_prefix("tcp://") {
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| CsiError::invalid("endpoint", format!("{endpoint:?}: {e}")))?
            .connect()
            .await
            .map_err(|e| {
                CsiError::FailedPrecondition(format!("cannot connect to {endpoint}: {e}"))
            })?;
        return Ok(CsiClient {
            identity: IdentityClient::new(channel.clone()),
            controller: ControllerClient::new(channel.clone()),
            node: NodeClient::new(channel),
        });
    }
    let path = socket_path(endpoint)?;
    let channel = Endpoint::from_static("http://csi.invalid")
        .connect_with_connector(tower::service_fn(move |_| {
            let p = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(p).await?;
                Ok::<_, std::io::Error>(TokioIo::new(s))
            }
        }))
        .await
        .map_err(|e| CsiError::FailedPrecondition(format!("cannot connect to {endpoint}: {e}")))?;
    Ok(CsiClient {
        identity: IdentityClient::new(channel.clone()),
        controller: ControllerClient::new(channel.clone()),
        node: NodeClient::new(channel),
    })
}
