//! Per-volume capacity and inode gauges (F34) for the volumes published on this node, in a
//! private Prometheus registry served at `<addr>/metrics`.
//!
//! Labels are bounded: one series per published volume (`volume` = CSI volume id, plus the
//! PVC namespace and name when known); a series is removed when its volume is unpublished.
//! Values are refreshed at scrape time (statvfs of each published path), so no timer runs.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kube::ResourceExt;
use liteio_api::AntstorVolume;
use liteio_api::keys::labels;
use prometheus::{Encoder, GaugeVec, Opts, Registry, TextEncoder};

use crate::csi::{VolumeUsage, volume_usage};
use crate::error::{CsiError, Result};

const LABELS: [&str; 3] = ["volume", "pvc_namespace", "pvc"];

#[derive(Debug, Clone)]
struct Published {
    volume: String,
    pvc_namespace: String,
    pvc: String,
}

/// The gauges and the set of published volumes they describe.
#[derive(Debug)]
pub struct VolumeMetrics {
    registry: Registry,
    capacity: GaugeVec,
    used: GaugeVec,
    available: GaugeVec,
    inodes: GaugeVec,
    inodes_used: GaugeVec,
    inodes_free: GaugeVec,
    published: Mutex<HashMap<PathBuf, Published>>,
}

fn gauge(registry: &Registry, name: &str, help: &str) -> Result<GaugeVec> {
    let g = GaugeVec::new(Opts::new(name, help), &LABELS)
        .map_err(|e| CsiError::Internal(format!("metric {name}: {e}")))?;
    registry
        .register(Box::new(g.clone()))
        .map_err(|e| CsiError::Internal(format!("register metric {name}: {e}")))?;
    Ok(g)
}

impl VolumeMetrics {
    /// Creates the gauges in a private registry.
    pub fn new() -> Result<Self> {
        let registry = Registry::new();
        Ok(VolumeMetrics {
            capacity: gauge(
                &registry,
                "liteio_csi_volume_capacity_bytes",
                "Filesystem size of a published volume",
            )?,
            used: gauge(
                &registry,
                "liteio_csi_volume_used_bytes",
                "Bytes used on a published volume",
            )?,
            available: gauge(
                &registry,
                "liteio_csi_volume_available_bytes",
                "Bytes available to unprivileged users on a published volume",
            )?,
            inodes: gauge(
                &registry,
                "liteio_csi_volume_inodes",
                "Inodes of a published volume",
            )?,
            inodes_used: gauge(
                &registry,
                "liteio_csi_volume_inodes_used",
                "Inodes used on a published volume",
            )?,
            inodes_free: gauge(
                &registry,
                "liteio_csi_volume_inodes_free",
                "Inodes free on a published volume",
            )?,
            registry,
            published: Mutex::new(HashMap::new()),
        })
    }

    fn all(&self) -> [&GaugeVec; 6] {
        [
            &self.capacity,
            &self.used,
            &self.available,
            &self.inodes,
            &self.inodes_used,
            &self.inodes_free,
        ]
    }

    /// Starts describing the volume published at `target`.
    pub fn register(&self, volume_id: &str, vol: &AntstorVolume, target: &Path) {
        let l = vol.labels();
        let p = Published {
            volume: volume_id.to_string(),
            pvc_namespace: l.get(labels::PVC_NAMESPACE).cloned().unwrap_or_default(),
            pvc: l.get(labels::PVC_NAME).cloned().unwrap_or_default(),
        };
        if let Ok(mut m) = self.published.lock() {
            m.insert(target.to_path_buf(), p);
        }
    }

    /// Stops describing the volume published at `target` and drops its series.
    pub fn unregister(&self, target: &Path) {
        let removed = self
            .published
            .lock()
            .ok()
            .and_then(|mut m| m.remove(target));
        if let Some(p) = removed {
            let still = self
                .published
                .lock()
                .map(|m| m.values().any(|q| q.volume == p.volume))
                .unwrap_or(false);
            if !still {
                for g in self.all() {
                    let _ = g.remove_label_values(&[&p.volume, &p.pvc_namespace, &p.pvc]);
                }
            }
        }
    }

    fn set(&self, p: &Published, usage: &[VolumeUsage]) {
        let lv = [p.volume.as_str(), p.pvc_namespace.as_str(), p.pvc.as_str()];
        #[allow(clippy::cast_precision_loss)]
        for u in usage {
            let (t, us, av) = match u.unit() {
                volume_usage::Unit::Bytes => (&self.capacity, &self.used, &self.available),
                volume_usage::Unit::Inodes => (&self.inodes, &self.inodes_used, &self.inodes_free),
                volume_usage::Unit::Unknown => continue,
            };
            t.with_label_values(&lv).set(u.total as f64);
            us.with_label_values(&lv).set(u.used as f64);
            av.with_label_values(&lv).set(u.available as f64);
        }
    }

    /// Records usage measured elsewhere (NodeGetVolumeStats) for `volume_id`.
    pub fn observe(&self, volume_id: &str, usage: &[VolumeUsage]) {
        let p = self
            .published
            .lock()
            .ok()
            .and_then(|m| m.values().find(|p| p.volume == volume_id).cloned());
        if let Some(p) = p {
            self.set(&p, usage);
        }
    }

    /// Measures every published filesystem (blocking: statvfs).
    pub fn refresh(&self) {
        let list: Vec<(PathBuf, Published)> = self
            .published
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        for (path, p) in list {
            if path.is_dir()
                && let Ok(u) = crate::node::usage(&path)
            {
                self.set(&p, &u);
            }
        }
    }

    /// The registry in Prometheus' text format.
    pub fn encode(&self) -> String {
        let mut buf = Vec::new();
        if TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// Serves `/metrics` on `addr` until the task is dropped.
pub async fn serve(addr: SocketAddr, metrics: Arc<VolumeMetrics>) -> Result<()> {
    use http_body_util::Full;
    use hyper::body::Bytes;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;

    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CsiError::io(format!("listen on {addr} for metrics"), e))?;
    tracing::info!(%addr, "serving metrics");
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "metrics accept failed");
                continue;
            }
        };
        let m = Arc::clone(&metrics);
        tokio::spawn(async move {
            let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let m = Arc::clone(&m);
                async move {
                    let resp = if req.uri().path() == "/metrics" {
                        let m2 = Arc::clone(&m);
                        let _ = tokio::task::spawn_blocking(move || m2.refresh()).await;
                        hyper::Response::builder()
                            .header("content-type", "text/plain; version=0.0.4")
                            .body(Full::new(Bytes::from(m.encode())))
                    } else {
                        hyper::Response::builder()
                            .status(404)
                            .body(Full::new(Bytes::from_static(b"not found\n")))
                    };
                    resp.map_err(std::io::Error::other)
                }
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use liteio_api::AntstorVolumeSpec;

    #[test]
    fn series_follow_published_volumes() {
        let m = VolumeMetrics::new().unwrap();
        let mut v = AntstorVolume::new("pvc-1", AntstorVolumeSpec::default());
        v.labels_mut()
            .insert(labels::PVC_NAME.into(), "data".into());
        v.labels_mut()
            .insert(labels::PVC_NAMESPACE.into(), "app".into());
        let d = tempfile::tempdir().unwrap();
        m.register("u1", &v, d.path());
        m.refresh();
        let text = m.encode();
        assert!(
            text.contains(
                r#"liteio_csi_volume_capacity_bytes{pvc="data",pvc_namespace="app",volume="u1"}"#
            ),
            "{text}"
        );
        assert!(text.contains("liteio_csi_volume_inodes_free"));
        m.unregister(d.path());
        assert!(!m.encode().contains("volume=\"u1\""));
    }
}
