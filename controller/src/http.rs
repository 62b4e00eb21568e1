//! `/healthz`, `/readyz` and `/metrics` over HTTP/1.1.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{debug, info};

use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// What the probes report.
#[derive(Debug, Clone, Default)]
pub struct Health {
    /// Ready: a standby waiting for the Lease, or a leader whose caches are synced.
    pub ready: Arc<AtomicBool>,
    /// True while this instance leads.
    pub leader: Arc<AtomicBool>,
}

fn respond(code: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    r
}

/// Binds `addr` and serves until `shutdown` turns true; returns the bound address through
/// `bound` (useful with port 0).
pub async fn serve(
    addr: SocketAddr,
    health: Health,
    metrics: Metrics,
    mut shutdown: watch::Receiver<bool>,
    bound: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
) -> Result<()> {
    let listener = TcpListener::bind(addr).await.map_err(|source| Error::Io {
        action: format!("listen on {addr}"),
        source,
    })?;
    let local = listener.local_addr().map_err(|source| Error::Io {
        action: format!("read the address bound for {addr}"),
        source,
    })?;
    info!(%local, "serving /healthz, /readyz and /metrics");
    if let Some(tx) = bound {
        let _ = tx.send(local);
    }
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.changed() => return Ok(()),
            a = listener.accept() => match a {
                Ok(x) => x,
                Err(e) => { debug!(error = %e, "accept failed"); continue; }
            },
        };
        let health = health.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let health = health.clone();
                let metrics = metrics.clone();
                async move {
                    let r = match req.uri().path() {
                        "/healthz" | "/livez" => respond(StatusCode::OK, "ok\n".into()),
                        "/readyz" => {
                            if health.ready.load(Ordering::SeqCst) {
                                respond(StatusCode::OK, "ok\n".into())
                            } else {
                                respond(StatusCode::SERVICE_UNAVAILABLE, "not ready\n".into())
                            }
                        }
                        "/metrics" => respond(StatusCode::OK, metrics.render()),
                        _ => respond(StatusCode::NOT_FOUND, "not found\n".into()),
                    };
                    Ok::<_, std::convert::Infallible>(r)
                }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                debug!(error = %e, "probe connection ended");
            }
        });
    }
}
