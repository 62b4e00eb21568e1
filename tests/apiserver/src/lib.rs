//! An in-process Kubernetes API server for tests.
//!
//! [`TestApiServer`] listens on plain HTTP on 127.0.0.1 (or another loopback address) and behaves like kube-apiserver for
//! what LiteIO's components and `kubectl get/apply/delete/patch` use: discovery, CRUD, label
//! and field selectors, watches with bookmarks and `410 Gone`, optimistic concurrency, merge /
//! JSON / server-side-apply patches, the status subresource, finalizers, CRD schema
//! validation, and fault injection through [`Faults`]. The [`conformance`] cases run against it
//! and against a real kube-apiserver.
#![forbid(unsafe_code)]

pub mod cel;
pub mod conformance;
pub mod discovery;
pub mod error;
pub mod faults;
mod http;
pub mod meta;
pub mod resources;
pub mod schema;
pub mod selector;
pub mod store;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext,
};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

pub use error::ApiError;
pub use faults::{CLIENT_HEADER, Faults, Matcher, Verb};

use crate::http::Shared;
use crate::store::{State, WriteOpts};

/// Errors of starting, stopping or talking to the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding the listening socket failed.
    #[error("cannot listen on {address}:{port}")]
    Bind {
        /// The requested address.
        address: Ipv4Addr,
        /// The requested port (0 for any).
        port: u16,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The state file could not be read or does not hold a state of this server.
    #[error("state file {}: {message}", path.display())]
    State {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        message: String,
    },
    /// A built-in CRD could not be installed.
    #[error("cannot install CRD {name}: {message}")]
    InstallCrd {
        /// CRD name.
        name: String,
        /// Why.
        message: String,
    },
    /// Building a kube client from the generated kubeconfig failed.
    #[error("cannot build a client for the test server")]
    Client(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Writing the kubeconfig failed.
    #[error("cannot write kubeconfig {path}")]
    WriteKubeconfig {
        /// Destination.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Start-up options.
#[derive(Debug, Clone)]
pub struct Options {
    /// Address to listen on: a loopback address (127.0.0.0/8), by default 127.0.0.1. Another
    /// one, such as a bridge's 127.10.x.1, lets processes in other network namespaces reach
    /// the server (liteio-local's multi-node runs).
    pub address: Ipv4Addr,
    /// Port on `address`; 0 picks a free one.
    pub port: u16,
    /// How many events the watch window retains; older resourceVersions get `410 Gone`.
    pub event_window: usize,
    /// Interval between BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
    /// Install LiteIO's six CRDs (those not there yet).
    pub install_crds: bool,
    /// Keep the objects in this file across restarts (read at start when it exists, with
    /// every change appended to `<file>.journal` before it is answered and folded into the
    /// file now and then); `None` keeps everything in memory only.
    pub state_file: Option<std::path::PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            address: Ipv4Addr::LOCALHOST,
            port: 0,
            event_window: 10_000,
            bookmark_interval: Duration::from_secs(1),
            install_crds: true,
            state_file: None,
        }
    }
}

/// A running test API server; dropping it stops it.
#[derive(Debug)]
pub struct TestApiServer {
    shared: Arc<Shared>,
    task: Option<JoinHandle<()>>,
}

impl TestApiServer {
    /// Starts a server on an ephemeral port with LiteIO's CRDs installed.
    pub async fn start() -> Result<Self, Error> {
        Self::start_with(Options::default()).await
    }

    /// Starts a server with explicit options.
    pub async fn start_with(opts: Options) -> Result<Self, Error> {
        if !opts.address.is_loopback() {
            return Err(Error::Bind {
                address: opts.address,
                port: opts.port,
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "the test API server has no authentication: it listens on 127.0.0.0/8 only",
                ),
            });
        }
        let listener = TcpListener::bind((opts.address, opts.port))
            .await
            .map_err(|source| Error::Bind {
                address: opts.address,
                port: opts.port,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            address: opts.address,
            port: opts.port,
            source,
        })?;
        let state = match &opts.state_file {
            Some(path) if path.exists() => {
                let body = std::fs::read(path).map_err(|e| Error::State {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
                let mut snap: store::Snapshot =
                    serde_json::from_slice(&body).map_err(|e| Error::State {
                        path: path.clone(),
                        message: format!("not a state file of this server: {e}"),
                    })?;
                let jpath = http::journal_path(path);
                match std::fs::read(&jpath) {
                    Ok(journal) => snap.replay(&journal).map_err(|message| Error::State {
                        path: jpath.clone(),
                        message,
                    })?,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(Error::State {
                            path: jpath,
                            message: e.to_string(),
                        });
                    }
                }
                State::restore(opts.event_window, snap).map_err(|message| Error::State {
                    path: path.clone(),
                    message,
                })?
            }
            _ => State::new(opts.event_window),
        };
        let rv = state.rv();
        let (notify, _) = watch::channel(rv);
        let (shutdown, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            state: std::sync::Mutex::new(state),
            notify,
            shutdown,
            faults: Faults::default(),
            addr,
            bookmark_interval: opts.bookmark_interval,
            state_file: opts.state_file.clone(),
            journal: std::sync::Mutex::default(),
        });
        if opts.install_crds {
            install_liteio_crds(&shared)?;
        }
        shared.save(&shared.lock());
        let task = tokio::spawn(serve(listener, Arc::clone(&shared)));
        tracing::info!(%addr, "test API server listening");
        Ok(TestApiServer {
            shared,
            task: Some(task),
        })
    }

    /// `http://ADDRESS:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// A kubeconfig with one context `liteio-test` pointing at this server.
    pub fn kubeconfig(&self) -> Kubeconfig {
        Kubeconfig {
            clusters: vec![NamedCluster {
                name: "liteio-test".into(),
                cluster: Some(Cluster {
                    server: Some(self.url()),
                    ..Cluster::default()
                }),
                ..NamedCluster::default()
            }],
            auth_infos: vec![NamedAuthInfo {
                name: "liteio-test".into(),
                auth_info: Some(AuthInfo::default()),
                ..NamedAuthInfo::default()
            }],
            contexts: vec![NamedContext {
                name: "liteio-test".into(),
                context: Some(Context {
                    cluster: "liteio-test".into(),
                    user: Some("liteio-test".into()),
                    namespace: Some("default".into()),
                    ..Context::default()
                }),
                ..NamedContext::default()
            }],
            current_context: Some("liteio-test".into()),
            api_version: Some("v1".into()),
            kind: Some("Config".into()),
            ..Kubeconfig::default()
        }
    }

    /// A kube client talking to this server through [`TestApiServer::kubeconfig`].
    pub async fn client(&self) -> Result<kube::Client, Error> {
        let config =
            kube::Config::from_custom_kubeconfig(self.kubeconfig(), &KubeConfigOptions::default())
                .await
                .map_err(|e| Error::Client(Box::new(e)))?;
        kube::Client::try_from(config).map_err(|e| Error::Client(Box::new(e)))
    }

    /// Like [`TestApiServer::client`], but every request carries [`faults::CLIENT_HEADER`]
    /// `name`, so [`Matcher::from_client`] can aim a fault at this client alone.
    pub async fn named_client(&self, name: &str) -> Result<kube::Client, Error> {
        let mut config =
            kube::Config::from_custom_kubeconfig(self.kubeconfig(), &KubeConfigOptions::default())
                .await
                .map_err(|e| Error::Client(Box::new(e)))?;
        let value = ::http::HeaderValue::from_str(name).map_err(|e| Error::Client(Box::new(e)))?;
        config.headers.push((
            ::http::HeaderName::from_static(faults::CLIENT_HEADER),
            value,
        ));
        kube::Client::try_from(config).map_err(|e| Error::Client(Box::new(e)))
    }

    /// Writes [`TestApiServer::kubeconfig`] as YAML to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), Error> {
        let yaml =
            serde_yaml::to_string(&self.kubeconfig()).map_err(|e| Error::WriteKubeconfig {
                path: path.display().to_string(),
                source: std::io::Error::other(e),
            })?;
        std::fs::write(path, yaml).map_err(|source| Error::WriteKubeconfig {
            path: path.display().to_string(),
            source,
        })
    }

    /// The fault-injection handle.
    pub fn faults(&self) -> Faults {
        self.shared.faults.clone()
    }

    /// Changes how many events the watch window retains.
    pub fn set_event_window(&self, events: usize) {
        self.shared.lock().set_window(events);
    }

    /// Forgets every retained event: any watch resuming from an older resourceVersion gets
    /// `410 Gone`, like after an etcd compaction.
    pub fn compact(&self) {
        self.shared.lock().compact();
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv()
    }

    /// A cheap, cloneable handle for tests (faults, compaction, window size).
    pub fn handle(&self) -> ServerHandle {
        ServerHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Stops accepting connections, ends watches and waits for the server task.
    pub async fn shutdown(mut self) {
        self.shared.shutdown.send_replace(true);
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

/// A cloneable handle to a running [`TestApiServer`]; it does not keep the server alive.
#[derive(Debug, Clone)]
pub struct ServerHandle {
    shared: Arc<Shared>,
}

impl ServerHandle {
    /// The fault-injection handle.
    pub fn faults(&self) -> Faults {
        self.shared.faults.clone()
    }

    /// Changes how many events the watch window retains.
    pub fn set_event_window(&self, events: usize) {
        self.shared.lock().set_window(events);
    }

    /// Forgets every retained event (see [`TestApiServer::compact`]).
    pub fn compact(&self) {
        self.shared.lock().compact();
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv()
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        self.shared.shutdown.send_replace(true);
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

fn install_liteio_crds(shared: &Shared) -> Result<(), Error> {
    let mut state = shared.lock();
    let Some(res) = state.find("apiextensions.k8s.io", "v1", "customresourcedefinitions") else {
        return Err(Error::InstallCrd {
            name: "*".into(),
            message: "customresourcedefinitions are not served".into(),
        });
    };
    let opts = WriteOpts {
        manager: "liteio-test-apiserver".into(),
        ..WriteOpts::default()
    };
    for crd in liteio_api::crd::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        if state.get(&res, "", &name).is_ok() {
            continue;
        }
        let value = serde_json::to_value(&crd).map_err(|e| Error::InstallCrd {
            name: name.clone(),
            message: e.to_string(),
        })?;
        state
            .create(&res, "", value, &opts)
            .map_err(|e| Error::InstallCrd {
                name,
                message: e.message,
            })?;
    }
    let rv = state.rv();
    drop(state);
    shared.notify.send_replace(rv);
    Ok(())
}

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        continue;
                    }
                };
                let shared = Arc::clone(&shared);
                connections.spawn(async move {
                    let service = service_fn(move |req| {
                        let shared = Arc::clone(&shared);
                        async move { Ok::<_, std::convert::Infallible>(http::handle(shared, req).await) }
                    });
                    if let Err(e) = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                    {
                        tracing::debug!(%peer, error = %e, "connection ended");
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    connections.shutdown().await;
}
