//! Shared T1 fixtures: a test API server, the driver on a real unix socket, and a fake
//! scheduler standing in for the node-disk-controller.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use liteio_api::keys::labels;
use liteio_api::pool::{PoolStatus, StoragePoolStatus};
use liteio_api::{AntstorVolume, StoragePool, StoragePoolSpec};
use liteio_csi::DriverConfig;
use liteio_csi::client::{self, CsiClient};
use liteio_csi::cmd::SystemRunner;
use liteio_csi::controller::ControllerService;
use liteio_csi::identity::IdentityService;
use liteio_csi::metrics::VolumeMetrics;
use liteio_csi::node::NodeService;
use liteio_csi::server::{self, Services};
use liteio_test_apiserver::TestApiServer;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const NS: &str = "obnvmf";
pub const NODE: &str = "node-1";

/// Every async test body runs under this bound.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(120);

pub struct Env {
    pub server: TestApiServer,
    pub client: kube::Client,
    pub csi: CsiClient,
    pub dir: tempfile::TempDir,
    pub endpoint: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    sched: Option<JoinHandle<()>>,
    agent: Vec<JoinHandle<()>>,
    /// The driver's metrics, served at `metrics_addr` (`/metrics`).
    pub metrics: Arc<VolumeMetrics>,
    pub metrics_addr: std::net::SocketAddr,
    metrics_task: Option<JoinHandle<()>>,
}

impl Env {
    pub fn volumes(&self) -> Api<AntstorVolume> {
        Api::namespaced(self.client.clone(), NS)
    }

    /// GET `/metrics` of the driver over HTTP.
    pub async fn scrape(&self) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(self.metrics_addr)
            .await
            .expect("connect to the metrics server");
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n")
            .await
            .expect("request");
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.expect("response");
        let text = String::from_utf8(buf).expect("UTF-8");
        let (head, body) = text.split_once("\r\n\r\n").expect("HTTP response");
        assert!(
            head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
            "{head}"
        );
        body.to_string()
    }

    /// Starts the fake scheduler: every unscheduled volume that fits `capacity` bytes gets
    /// `spec.targetNodeId = NODE`; others get the controller's NoStoragePoolAvailable message.
    pub fn start_scheduler(&mut self, capacity: u64) {
        let api = self.volumes();
        self.sched = Some(tokio::spawn(async move {
            let mut s = watcher(api.clone(), watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = s.next().await {
                let objs = match ev {
                    Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => vec![o],
                    _ => continue,
                };
                for v in objs {
                    if !v.spec.target_node_id.is_empty() || v.metadata.deletion_timestamp.is_some()
                    {
                        continue;
                    }
                    let name = v.name_any();
                    let pp = PatchParams::default();
                    if v.spec.size_byte <= capacity {
                        let _ = api
                            .patch(
                                &name,
                                &pp,
                                &Patch::Merge(json!({"spec": {"targetNodeId": NODE}})),
                            )
                            .await;
                    } else {
                        let _ = api
                            .patch_status(
                                &name,
                                &pp,
                                &Patch::Merge(json!({"status": {"status": "creating", "msg": format!("NoStoragePoolAvailable: PoolFreeSize: 1 (volume needs {} bytes)", v.spec.size_byte)}})),
                            )
                            .await;
                    }
                }
            }
        }));
    }

    /// Starts a fake disk-agent for the file engine: every scheduled volume gets a sparse file
    /// under `<dir>/pool/volumes`, `spec.kernelLvol.devPath` and status ready (an expanded
    /// volume's file grows and its expansion label is removed); every snapshot becomes ready.
    pub fn start_file_agent(&mut self) {
        let api = self.volumes();
        let pool = self.dir.path().join("pool/volumes");
        let snaps: Api<liteio_api::AntstorSnapshot> = Api::namespaced(self.client.clone(), NS);
        let t1 = tokio::spawn(async move {
            let mut s = watcher(api.clone(), watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = s.next().await {
                let v = match ev {
                    Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => o,
                    _ => continue,
                };
                if v.spec.target_node_id.is_empty() {
                    continue;
                }
                let name = v.name_any();
                let file = pool.join(format!("{name}.img"));
                if v.phase() == liteio_api::VolumeStatus::Ready {
                    // Like the real agent, grow the backing file when the volume is expanded,
                    // then drop the expansion label.
                    if v.labels().contains_key(labels::EXPANSION_ORIGINAL_SIZE) {
                        if let Ok(f) = std::fs::OpenOptions::new().write(true).open(&file)
                            && f.metadata().is_ok_and(|m| m.len() < v.spec.size_byte)
                        {
                            let _ = f.set_len(v.spec.size_byte);
                        }
                        let _ = api
                            .patch(
                                &name,
                                &PatchParams::default(),
                                &Patch::Merge(json!({"metadata": {"labels": {labels::EXPANSION_ORIGINAL_SIZE: null}}})),
                            )
                            .await;
                    }
                    continue;
                }
                let _ = std::fs::create_dir_all(&pool);
                if let Ok(f) = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&file)
                {
                    let _ = f.set_len(v.spec.size_byte);
                }
                let pp = PatchParams::default();
                let _ = api
                    .patch(&name, &pp, &Patch::Merge(json!({"spec": {"type": "KernelLVol", "kernelLvol": {"name": name, "devPath": file.display().to_string()}}})))
                    .await;
                let _ = api
                    .patch_status(
                        &name,
                        &pp,
                        &Patch::Merge(json!({"status": {"status": "ready"}})),
                    )
                    .await;
            }
        });
        let t2 = tokio::spawn(async move {
            let mut s = watcher(snaps.clone(), watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = s.next().await {
                if let Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) = ev
                    && o.status.as_ref().map(|s| s.status)
                        != Some(liteio_api::snapshot::SnapshotStatusName::Ready)
                {
                    let _ = snaps
                        .patch_status(
                            &o.name_any(),
                            &PatchParams::default(),
                            &Patch::Merge(json!({"status": {"status": "ready"}})),
                        )
                        .await;
                }
            }
        });
        self.agent = vec![t1, t2];
    }

    pub async fn stop(mut self) {
        for t in self.agent.drain(..) {
            t.abort();
        }
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
        if let Some(s) = self.sched.take() {
            s.abort();
        }
        if let Some(t) = self.metrics_task.take() {
            t.abort();
        }
        self.server.shutdown().await;
    }
}

/// Creates the StoragePool `name` with `free` bytes free, ready.
pub async fn pool(client: &kube::Client, name: &str, free: u64) {
    let api: Api<StoragePool> = Api::namespaced(client.clone(), NS);
    let mut p = StoragePool::new(name, StoragePoolSpec::default());
    p.spec.node_info.id = name.into();
    p.spec.node_info.hostname = name.into();
    p.metadata.namespace = Some(NS.into());
    api.create(&PostParams::default(), &p).await.unwrap();
    let st = StoragePoolStatus {
        vg_free_size: Some(liteio_api::size::quantity(free)),
        status: Some(PoolStatus::Ready),
        ..Default::default()
    };
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": st})),
    )
    .await
    .unwrap();
}

/// Starts a test API server (with namespace obnvmf) and the driver in `mode`.
pub async fn start(controller: bool, node: bool, tweak: impl FnOnce(&mut DriverConfig)) -> Env {
    let server = TestApiServer::start().await.expect("test API server");
    let client = server.client().await.expect("client");
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(NS.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    nss.create(&PostParams::default(), &ns)
        .await
        .expect("namespace");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = DriverConfig::new(NODE);
    // A host that can authenticate (the tests give the kernel's answers).
    cfg.host_capabilities = Some(liteio_csi::nvme::HostCapabilities {
        kernel: "6.12.0-test".into(),
        dhchap: true,
        tls: true,
        dhchap_evidence: "given by the test".into(),
    });
    cfg.schedule_timeout = Duration::from_secs(10);
    cfg.ready_timeout = Duration::from_secs(10);
    // CreateSnapshot answers `ready_to_use = false` after this when no agent cuts it.
    cfg.snapshot_wait = Duration::from_millis(300);
    cfg.sysfs_root = dir.path().join("sys");
    cfg.hostnqn_path = dir.path().join("hostnqn");
    tweak(&mut cfg);
    let cfg = Arc::new(cfg);
    let endpoint = format!("unix://{}", dir.path().join("csi.sock").display());
    // Served as csi-driver --metrics-addr serves them.
    let metrics = Arc::new(VolumeMetrics::new(NODE).expect("metrics"));
    let (metrics_listener, metrics_addr) =
        liteio_csi::metrics::bind("127.0.0.1:0".parse().expect("address"))
            .await
            .expect("bind the metrics server");
    let metrics_task = tokio::spawn(liteio_csi::metrics::serve_on(
        metrics_listener,
        Arc::clone(&metrics),
    ));
    let node_service = if node {
        let svc = NodeService::new(
            client.clone(),
            Arc::clone(&cfg),
            Arc::new(SystemRunner::new()),
            Some(Arc::clone(&metrics)),
        );
        // What this kernel can do goes onto the Node (for the agents' host-auth decisions).
        svc.publish_capabilities().await;
        Some(svc)
    } else {
        None
    };
    let services = Services {
        identity: IdentityService::new("test"),
        controller: controller.then(|| ControllerService::new(client.clone(), Arc::clone(&cfg))),
        node: node_service,
    };
    let listener = server::bind(&endpoint).expect("bind");
    let (stop, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        server::serve(listener, services, async {
            let _ = rx.await;
        })
        .await
        .expect("serve");
    });
    let csi = client::connect(&endpoint).await.expect("connect");
    Env {
        server,
        client,
        csi,
        dir,
        endpoint,
        stop: Some(stop),
        task: Some(task),
        sched: None,
        agent: Vec::new(),
        metrics,
        metrics_addr,
        metrics_task: Some(metrics_task),
    }
}

/// Runs `f` under [`TEST_TIMEOUT`].
pub async fn bounded<F: std::future::Future<Output = ()>>(f: F) {
    tokio::time::timeout(TEST_TIMEOUT, f)
        .await
        .expect("test timed out");
}
