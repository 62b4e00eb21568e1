//! The HTTP endpoints: `GET /metrics`, `/healthz`, `/readyz`.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::{Metrics, MetricsError};

async fn respond(metrics: &Arc<Metrics>, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let (status, body, ctype) = match (req.method().as_str(), req.uri().path()) {
        ("GET", "/metrics") => (
            StatusCode::OK,
            metrics.scrape().await,
            "text/plain; version=0.0.4",
        ),
        ("GET", "/healthz") => (StatusCode::OK, "ok\n".to_string(), "text/plain"),
        ("GET", "/readyz") => match metrics.not_ready() {
            None => (StatusCode::OK, "ok\n".to_string(), "text/plain"),
            Some(why) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{why}\n"),
                "text/plain",
            ),
        },
        _ => (
            StatusCode::NOT_FOUND,
            "not found\n".to_string(),
            "text/plain",
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(ctype) {
        resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    resp
}

/// Binds `addr` (port 0 picks one) and returns the listener with its real address.
pub async fn bind(
    addr: std::net::SocketAddr,
) -> Result<(TcpListener, std::net::SocketAddr), MetricsError> {
    let l = TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind { addr, source })?;
    let local = l
        .local_addr()
        .map_err(|source| MetricsError::Bind { addr, source })?;
    Ok((l, local))
}

/// Serves the endpoints on `listener` until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let (stream, _) = match accepted {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "metrics listener accept failed");
                continue;
            }
        };
        let m = Arc::clone(&metrics);
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let m = Arc::clone(&m);
                async move { Ok::<_, Infallible>(respond(&m, &req).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                tracing::debug!(error = %e, "metrics connection ended");
            }
        });
    }
}
