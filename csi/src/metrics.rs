//! Per-volume capacity and inode gauges (F34) for the volumes published on this node, in a
//! private Prometheus registry served at `<addr>/metrics`, with the constant label `node`.
//!
//! Labels are bounded: one series per published volume (`volume` = CSI volume id, `pv` =
//! the AntstorVolume's name, which is the PV's, plus the PVC namespace and name when known);
//! a series is removed when its volume is unpublished. Values are refreshed at scrape time
//! (statvfs of each published path), so no timer runs.
//!
//! Also `liteio_auth_refusals_total{reason}`: stages refused because this host and a
//! volume's target did not authenticate each other (`host_cannot_authenticate`: this kernel
//! cannot do what the volume needs; `keys_required`: the target wants keys and none were
//! given; `keys_rejected`: one side rejected the other's keys), and `liteio_panics_total`.
//! Every family: `docs/metrics.md`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kube::ResourceExt;
use liteio_api::AntstorVolume;
use liteio_api::keys::labels;
use prometheus::{Encoder, GaugeVec, IntCounter, IntCounterVec, Opts, Registry, TextEncoder};

use crate::csi::{VolumeUsage, volume_usage};
use crate::error::{CsiError, Result};

const LABELS: [&str; 4] = ["volume", "pv", "pvc_namespace", "pvc"];

#[derive(Debug, Clone)]
struct Published {
    volume: String,
    pv: String,
    pvc_namespace: String,
    pvc: String,
}

impl Published {
    fn labels(&self) -> [&str; 4] {
        [
            self.volume.as_str(),
            self.pv.as_str(),
            self.pvc_namespace.as_str(),
            self.pvc.as_str(),
        ]
    }
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
    auth_refusals: IntCounterVec,
    node: String,
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
    /// Creates the metrics of node `node` in a private registry.
    pub fn new(node: &str) -> Result<Self> {
        let registry = Registry::new_custom(
            None,
            Some(HashMap::from([("node".to_string(), node.to_string())])),
        )
        .map_err(|e| CsiError::Internal(format!("metrics registry: {e}")))?;
        let auth_refusals = IntCounterVec::new(
            Opts::new(
                "liteio_auth_refusals_total",
                "Stages refused because this host and the volume's target did not authenticate each other, by reason (host_cannot_authenticate, keys_required, keys_rejected)",
            ),
            &["reason"],
        )
        .map_err(|e| CsiError::Internal(format!("metric liteio_auth_refusals_total: {e}")))?;
        registry
            .register(Box::new(auth_refusals.clone()))
            .map_err(|e| CsiError::Internal(format!("register metric: {e}")))?;
        Ok(VolumeMetrics {
            node: node.to_string(),
            auth_refusals,
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
            pv: vol.name_any(),
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
                    let _ = g.remove_label_values(&p.labels());
                }
            }
        }
    }

    fn set(&self, p: &Published, usage: &[VolumeUsage]) {
        let lv = p.labels();
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
                && let Ok(u) = crate::mount::usage(&path)
            {
                self.set(&p, &u);
            }
        }
    }

    /// A stage was refused for want of authentication (`reason`: a fixed word, see the
    /// module's doc).
    pub fn auth_refused(&self, reason: &'static str) {
        self.auth_refusals.with_label_values(&[reason]).inc();
    }

    /// The registry in Prometheus' text format.
    pub fn encode(&self) -> String {
        let mut families = self.registry.gather();
        // The process-wide panic count, read now.
        if let Ok(panics) = IntCounter::with_opts(
            Opts::new("liteio_panics_total", liteio_node::panics::HELP)
                .const_label("node", &self.node),
        ) {
            panics.inc_by(liteio_node::panics::count());
            families.extend(prometheus::core::Collector::collect(&panics));
        }
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut buf = Vec::new();
        if TextEncoder::new().encode(&families, &mut buf).is_err() {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// Binds `addr` for [`serve_on`] (port 0 picks one) and returns the listener with its real
/// address.
pub async fn bind(addr: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CsiError::io(format!("listen on {addr} for metrics"), e))?;
    let local = listener
        .local_addr()
        .map_err(|e| CsiError::io(format!("address of the metrics listener on {addr}"), e))?;
    Ok((listener, local))
}

/// Serves `/metrics` on `addr` until the task is dropped.
pub async fn serve(addr: SocketAddr, metrics: Arc<VolumeMetrics>) -> Result<()> {
    let (listener, local) = bind(addr).await?;
    tracing::info!(addr = %local, "serving metrics");
    serve_on(listener, metrics).await;
    Ok(())
}

/// Serves `/metrics` on `listener` until the task is dropped.
pub async fn serve_on(listener: tokio::net::TcpListener, metrics: Arc<VolumeMetrics>) {
    use http_body_util::Full;
    use hyper::body::Bytes;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;

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

    /// The sample of `name` whose labels are exactly `labels` (any order).
    fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        want.sort();
        text.lines().find_map(|l| {
            let (head, v) = l.strip_prefix(name)?.rsplit_once(' ')?;
            let inner = head.strip_prefix('{')?.strip_suffix('}')?;
            let mut got: Vec<String> = inner.split(',').map(str::to_string).collect();
            got.sort();
            if got == want { v.parse().ok() } else { None }
        })
    }

    #[test]
    fn series_follow_published_volumes() {
        let m = VolumeMetrics::new("node-1").unwrap();
        let mut v = AntstorVolume::new("pvc-1", AntstorVolumeSpec::default());
        v.labels_mut()
            .insert(labels::PVC_NAME.into(), "data".into());
        v.labels_mut()
            .insert(labels::PVC_NAMESPACE.into(), "app".into());
        let d = tempfile::tempdir().unwrap();
        m.register("u1", &v, d.path());
        m.refresh();
        let text = m.encode();
        let l = [
            ("node", "node-1"),
            ("volume", "u1"),
            ("pv", "pvc-1"),
            ("pvc_namespace", "app"),
            ("pvc", "data"),
        ];
        assert!(
            value(&text, "liteio_csi_volume_capacity_bytes", &l).is_some_and(|c| c > 0.0),
            "{text}"
        );
        assert!(value(&text, "liteio_csi_volume_inodes_free", &l).is_some());
        m.unregister(d.path());
        assert!(!m.encode().contains("volume=\"u1\""));
        m.auth_refused("keys_rejected");
        let text = m.encode();
        assert_eq!(
            value(
                &text,
                "liteio_auth_refusals_total",
                &[("node", "node-1"), ("reason", "keys_rejected")]
            ),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            value(&text, "liteio_panics_total", &[("node", "node-1")]),
            Some(liteio_node::panics::count() as f64)
        );
    }

    #[test]
    fn every_family_is_documented() {
        let m = VolumeMetrics::new("n").unwrap();
        let v = AntstorVolume::new("pvc-1", AntstorVolumeSpec::default());
        let d = tempfile::tempdir().unwrap();
        m.register("u1", &v, d.path());
        m.refresh();
        m.auth_refused("keys_required");
        let text = m.encode();
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md"))
                .unwrap();
        let names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
            .collect();
        assert_eq!(names.len(), 8, "{text}");
        for n in names {
            assert!(
                doc.contains(&format!("`{n}`")),
                "docs/metrics.md does not list {n}"
            );
        }
    }
}
