//! Prometheus metrics and the health endpoints.
//!
//! A private registry per agent (so several agents can run in one test process) with the
//! constant label `node`. Labels are bounded: volume names and error *kinds*, never error
//! text. [`serve`] answers `GET /metrics` (Prometheus text), `GET /healthz` (the process
//! serves requests) and `GET /readyz` (the pool is registered).

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus::{
    Encoder, Gauge, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Why the metrics could not be set up or served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// A metric could not be registered (a programming error: duplicate name).
    #[error("cannot register metric {name}")]
    Register {
        /// Metric name.
        name: &'static str,
        /// Prometheus' error.
        #[source]
        source: prometheus::Error,
    },
    /// The listener could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// Address.
        addr: std::net::SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl MetricsError {
    /// Bounded classification.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Register { .. } => "register",
            Self::Bind { .. } => "bind",
        }
    }
}

/// The agent's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pool_capacity: IntGauge,
    pool_free: IntGauge,
    volumes: IntGauge,
    volume_size: IntGaugeVec,
    heartbeat_last_success: Gauge,
    heartbeat_failures: IntCounter,
    reconcile_errors: IntCounterVec,
    orphans: IntGaugeVec,
    known_volumes: Mutex<BTreeSet<String>>,
    ready: AtomicBool,
}

fn reg<T: prometheus::core::Collector + Clone + 'static>(
    r: &Registry,
    name: &'static str,
    m: Result<T, prometheus::Error>,
) -> Result<T, MetricsError> {
    let m = m.map_err(|source| MetricsError::Register { name, source })?;
    r.register(Box::new(m.clone()))
        .map_err(|source| MetricsError::Register { name, source })?;
    Ok(m)
}

impl Metrics {
    /// A registry for `node` with every metric registered.
    pub fn new(node: &str) -> Result<Self, MetricsError> {
        let mut labels = HashMap::new();
        labels.insert("node".to_string(), node.to_string());
        let r =
            Registry::new_custom(None, Some(labels)).map_err(|source| MetricsError::Register {
                name: "registry",
                source,
            })?;
        Ok(Self {
            pool_capacity: reg(
                &r,
                "liteio_pool_capacity_bytes",
                IntGauge::new("liteio_pool_capacity_bytes", "Pool capacity in bytes"),
            )?,
            pool_free: reg(
                &r,
                "liteio_pool_free_bytes",
                IntGauge::new("liteio_pool_free_bytes", "Pool free bytes"),
            )?,
            volumes: reg(
                &r,
                "liteio_pool_volumes",
                IntGauge::new("liteio_pool_volumes", "Volumes provisioned in the pool"),
            )?,
            volume_size: reg(
                &r,
                "liteio_volume_size_bytes",
                IntGaugeVec::new(
                    Opts::new("liteio_volume_size_bytes", "Allocated size of a volume"),
                    &["volume", "uuid"],
                ),
            )?,
            heartbeat_last_success: reg(
                &r,
                "liteio_heartbeat_last_success_timestamp_seconds",
                Gauge::new(
                    "liteio_heartbeat_last_success_timestamp_seconds",
                    "Unix time of the last successful Lease renewal",
                ),
            )?,
            heartbeat_failures: reg(
                &r,
                "liteio_heartbeat_failures_total",
                IntCounter::new(
                    "liteio_heartbeat_failures_total",
                    "Failed Lease renewal attempts",
                ),
            )?,
            reconcile_errors: reg(
                &r,
                "liteio_reconcile_errors_total",
                IntCounterVec::new(
                    Opts::new("liteio_reconcile_errors_total", "Failed reconciles by kind"),
                    &["resource", "kind"],
                ),
            )?,
            orphans: reg(
                &r,
                "liteio_orphan_objects",
                IntGaugeVec::new(
                    Opts::new(
                        "liteio_orphan_objects",
                        "Engine objects no AntstorVolume/AntstorSnapshot owns",
                    ),
                    &["kind"],
                ),
            )?,
            registry: r,
            known_volumes: Mutex::new(BTreeSet::new()),
            ready: AtomicBool::new(false),
        })
    }

    /// Pool capacity and free space.
    pub fn set_pool(&self, total: u64, free: u64) {
        self.pool_capacity.set(clamp(total));
        self.pool_free.set(clamp(free));
    }

    /// A volume exists with `size` bytes.
    pub fn set_volume(&self, name: &str, uuid: &str, size: u64) {
        self.volume_size
            .with_label_values(&[name, uuid])
            .set(clamp(size));
        let mut known = self.known_volumes.lock().unwrap_or_else(|p| p.into_inner());
        known.insert(format!("{name}\u{0}{uuid}"));
        self.volumes.set(clamp(known.len() as u64));
    }

    /// A volume is gone.
    pub fn remove_volume(&self, name: &str, uuid: &str) {
        let _ = self.volume_size.remove_label_values(&[name, uuid]);
        let mut known = self.known_volumes.lock().unwrap_or_else(|p| p.into_inner());
        known.remove(&format!("{name}\u{0}{uuid}"));
        self.volumes.set(clamp(known.len() as u64));
    }

    /// A renewal succeeded at `unix_secs`.
    pub fn heartbeat_ok(&self, unix_secs: f64) {
        self.heartbeat_last_success.set(unix_secs);
    }

    /// A renewal attempt failed.
    pub fn heartbeat_failed(&self) {
        self.heartbeat_failures.inc();
    }

    /// Failed renewal attempts so far.
    pub fn heartbeat_failures(&self) -> u64 {
        self.heartbeat_failures.get()
    }

    /// A reconcile of `resource` failed with `kind`.
    pub fn reconcile_error(&self, resource: &'static str, kind: &'static str) {
        self.reconcile_errors
            .with_label_values(&[resource, kind])
            .inc();
    }

    /// Orphans currently seen, by kind (`volume`, `snapshot`).
    pub fn set_orphans(&self, kind: &'static str, n: usize) {
        self.orphans.with_label_values(&[kind]).set(clamp(n as u64));
    }

    /// Marks the agent ready (pool registered) or not.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Whether the agent is ready.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec only fails for invalid metric families, which we never build.
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn respond(metrics: &Metrics, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let (status, body, ctype) = match (req.method().as_str(), req.uri().path()) {
        ("GET", "/metrics") => (
            StatusCode::OK,
            metrics.render(),
            "text/plain; version=0.0.4",
        ),
        ("GET", "/healthz") => (StatusCode::OK, "ok\n".to_string(), "text/plain"),
        ("GET", "/readyz") if metrics.is_ready() => {
            (StatusCode::OK, "ok\n".to_string(), "text/plain")
        }
        ("GET", "/readyz") => (
            StatusCode::SERVICE_UNAVAILABLE,
            "pool not registered yet\n".to_string(),
            "text/plain",
        ),
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
                let resp = respond(&m, &req);
                async move { Ok::<_, Infallible>(resp) }
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
