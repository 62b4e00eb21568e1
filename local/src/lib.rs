//! The all-in-one local mode: every LiteIO component as its own process on this machine,
//! against the test API server's binary (its state kept in a file, so that it can be
//! restarted like a real one) or against an existing Kubernetes API server.
#![forbid(unsafe_code)]

pub mod cluster;
pub mod datapath;
pub mod demo;
pub mod hugepages;
pub mod leaks;
pub mod netns;
pub mod poolfs;
pub mod sanity;
pub mod vm;
pub mod vm_node;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, NodeAddress, NodeStatus};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use liteio_agent::config::{BdevType, Config as AgentConfig, PoolingMode, SpdkBdev};
use liteio_api::{StoragePool, keys};
use liteio_controller::config::{Config as ControllerConfig, SchedulerConfig};
use tokio::process::{Child, Command};

/// Why the local cluster could not run.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// A binary is missing.
    #[error(
        "{0} not found next to liteio-local ({1}); build the workspace first: cargo build --release --workspace"
    )]
    MissingBinary(&'static str, PathBuf),
    /// A process could not be started.
    #[error("cannot start {name}")]
    Spawn {
        /// Component.
        name: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A component did not become ready in time.
    #[error("{what} was not ready after {secs} s; its log is {log}")]
    NotReady {
        /// What was awaited.
        what: String,
        /// Seconds waited.
        secs: u64,
        /// Log file of the component.
        log: String,
    },
    /// A file could not be written.
    #[error("cannot write {path}")]
    Io {
        /// Path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The API server refused a request.
    #[error("API server: {0}")]
    Kube(#[from] kube::Error),
    /// The kubeconfig could not be used.
    #[error("kubeconfig: {0}")]
    Config(String),
    /// A network namespace, link or address of a multi-node run could not be set up.
    #[error("network: {0}")]
    Network(String),
    /// `--hugepages`: the pages could not be reserved, mounted or given back.
    #[error("{0}")]
    Hugepages(String),
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::File => "file",
            Self::Spdk => "SPDK",
        })
    }
}

/// The pool size when none is given: 16 GiB (sparse: it takes on disk what the volumes
/// hold). Room for what csi-sanity keeps at once (five 512 MiB volumes, each with a snapshot
/// that the file engine counts at its origin's size, and those still being deleted).
pub const DEFAULT_POOL_BYTES: u64 = 16 << 30;

/// Which storage engine the local agent uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// Sparse files in the state directory, attached through loop devices.
    File,
    /// The embedded SPDK lvstore on an aio file (no hugepages, interrupt mode); volumes are
    /// reached over NVMe/TCP, which needs the kernel's nvme-tcp initiator.
    Spdk,
}

/// The components.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// The test API server.
    ApiServer,
    /// The node-disk-controller.
    Controller,
    /// The disk-agent.
    Agent,
    /// The CSI driver (controller and node services).
    Csi,
}

impl Component {
    fn binary(self) -> &'static str {
        match self {
            Self::ApiServer => "test-apiserver",
            Self::Controller => "node-disk-controller",
            Self::Agent => "disk-agent",
            Self::Csi => "csi-driver",
        }
    }
}

/// A running local cluster.
#[derive(Debug)]
pub struct Local {
    /// State directory (kubeconfig, configs, logs, pool, socket, mounts).
    pub dir: PathBuf,
    /// Directory of the component binaries.
    pub bin_dir: PathBuf,
    /// This node's name.
    pub node: String,
    /// The engine in use.
    pub engine: Engine,
    /// The API server's port.
    pub api_port: u16,
    /// The controller's probe/metrics port.
    pub controller_port: u16,
    /// Whether the API server is ours (the test API server) or an existing one.
    pub api: ApiSource,
    /// Size of the node's pool in bytes.
    pub pool_bytes: u64,
    /// Where the agent's SPDK takes its memory from.
    pub spdk_memory: hugepages::SpdkMemory,
    /// Where the agent serves `/metrics` (`None`: no metrics server).
    pub agent_metrics: Option<std::net::SocketAddr>,
    /// The agent's SPDK reactors poll (as on production nodes) instead of sleeping when idle.
    pub spdk_polling: bool,
    /// Where the file engine's pool has its reflinks from, in one line for the user, when it
    /// is not the run directory's own file system (see [`poolfs`]).
    pub pool_note: Option<String>,
    children: Vec<(Component, Child)>,
    /// The XFS image under the file engine's pool, when one was made: released after the
    /// components stopped (declared after `children`, so also when dropped).
    pool_fs: Option<poolfs::XfsImage>,
}

/// How the local agent runs where a run departs from the development defaults (no hugepages,
/// interrupt mode, no metrics server).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentTuning {
    /// Where the agent's SPDK takes its memory from.
    pub memory: hugepages::SpdkMemory,
    /// Serve the agent's `/metrics` on this address.
    pub metrics: Option<std::net::SocketAddr>,
    /// SPDK reactors poll, keeping their core busy, as on production nodes.
    pub spdk_polling: bool,
}

/// Which Kubernetes API server the components talk to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiSource {
    /// Start the test API server as a component, its state in `<dir>/apiserver-state.json`
    /// (a fresh cluster on every start; kept across restarts of the component).
    Test,
    /// An existing API server reached through this kubeconfig: LiteIO's CRDs are applied to
    /// it and this node's Node object is created when missing.
    External(PathBuf),
}

fn free_port() -> Result<u16, LocalError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|source| LocalError::Spawn {
            name: "port probe",
            source,
        })
}

fn write(path: &Path, body: &str) -> Result<(), LocalError> {
    std::fs::write(path, body).map_err(|source| LocalError::Io {
        path: path.into(),
        source,
    })
}

/// Poll `check` every 100 ms until it returns true or `secs` pass.
pub async fn wait_until<F, Fut>(
    what: &str,
    secs: u64,
    log: &Path,
    mut check: F,
) -> Result<(), LocalError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !check().await {
        if tokio::time::Instant::now() >= deadline {
            return Err(LocalError::NotReady {
                what: what.into(),
                secs,
                log: log.display().to_string(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

impl Local {
    /// Paths.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }
    /// The CSI endpoint.
    pub fn csi_endpoint(&self) -> String {
        format!("unix://{}", self.dir.join("csi.sock").display())
    }
    fn log(&self, c: Component) -> PathBuf {
        self.dir.join(format!("{}.log", c.binary()))
    }

    /// Start every component, with the test API server, and wait until each is ready.
    pub async fn start(
        dir: &Path,
        bin_dir: &Path,
        node: &str,
        engine: Engine,
    ) -> Result<Self, LocalError> {
        Self::start_with(dir, bin_dir, node, engine, ApiSource::Test).await
    }

    /// Start every component against `api` and wait until each is ready.
    pub async fn start_with(
        dir: &Path,
        bin_dir: &Path,
        node: &str,
        engine: Engine,
        api: ApiSource,
    ) -> Result<Self, LocalError> {
        Self::start_sized(dir, bin_dir, node, engine, api, DEFAULT_POOL_BYTES).await
    }

    /// Like [`Local::start_with`], with a pool of `pool_bytes` (the file engine's capacity or
    /// the SPDK engine's aio file; both sparse).
    pub async fn start_sized(
        dir: &Path,
        bin_dir: &Path,
        node: &str,
        engine: Engine,
        api: ApiSource,
        pool_bytes: u64,
    ) -> Result<Self, LocalError> {
        let memory = hugepages::SpdkMemory::NoHuge;
        Self::start_on(dir, bin_dir, node, engine, api, pool_bytes, memory).await
    }

    /// Like [`Local::start_sized`], the agent's SPDK on `memory` (hugepages the caller holds,
    /// see [`hugepages::RunHugepages`]).
    pub async fn start_on(
        dir: &Path,
        bin_dir: &Path,
        node: &str,
        engine: Engine,
        api: ApiSource,
        pool_bytes: u64,
        memory: hugepages::SpdkMemory,
    ) -> Result<Self, LocalError> {
        let tuning = AgentTuning {
            memory,
            ..AgentTuning::default()
        };
        Self::start_tuned(dir, bin_dir, node, engine, api, pool_bytes, tuning).await
    }

    /// Like [`Local::start_sized`], the agent run as `tuning` says.
    pub async fn start_tuned(
        dir: &Path,
        bin_dir: &Path,
        node: &str,
        engine: Engine,
        api: ApiSource,
        pool_bytes: u64,
        tuning: AgentTuning,
    ) -> Result<Self, LocalError> {
        let components: &[Component] = match api {
            ApiSource::Test => &[
                Component::ApiServer,
                Component::Controller,
                Component::Agent,
                Component::Csi,
            ],
            ApiSource::External(_) => &[Component::Controller, Component::Agent, Component::Csi],
        };
        for &c in components {
            let p = bin_dir.join(c.binary());
            if !p.exists() {
                return Err(LocalError::MissingBinary(c.binary(), p));
            }
        }
        std::fs::create_dir_all(dir.join("pool")).map_err(|source| LocalError::Io {
            path: dir.into(),
            source,
        })?;
        let (pool_fs, pool_note) = match engine {
            Engine::File => {
                let (pool, image) = (dir.join("pool"), dir.join("pool.xfs"));
                match poolfs::reflink_pool(&pool, &image, pool_bytes) {
                    poolfs::PoolFs::Native => (None, None),
                    poolfs::PoolFs::Image(fs) => (
                        Some(fs),
                        Some(format!(
                            "{} has no reflinks, which the file engine's snapshots need: its pool is an XFS file system (reflink=1) in the sparse image {}, loop-mounted at {}",
                            dir.display(),
                            image.display(),
                            pool.display()
                        )),
                    ),
                    poolfs::PoolFs::Without(why) => (
                        None,
                        Some(format!(
                            "{} has no reflinks and no XFS image could be made for the pool ({why}): snapshots and clones will be refused; put --dir on XFS (reflink=1) or btrfs",
                            dir.display()
                        )),
                    ),
                }
            }
            Engine::Spdk => (None, None),
        };
        let mut me = Self {
            dir: dir.to_path_buf(),
            bin_dir: bin_dir.to_path_buf(),
            node: node.into(),
            engine,
            api_port: free_port()?,
            controller_port: free_port()?,
            api: api.clone(),
            pool_bytes,
            spdk_memory: tuning.memory,
            agent_metrics: tuning.metrics,
            spdk_polling: tuning.spdk_polling,
            pool_note,
            children: Vec::new(),
            pool_fs,
        };
        me.write_configs()?;
        match &api {
            // A fresh cluster: forget the state of an earlier run.
            ApiSource::Test => match std::fs::remove_file(me.state_file()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(LocalError::Io {
                        path: me.state_file(),
                        source: e,
                    });
                }
                _ => {}
            },
            ApiSource::External(kc) => {
                std::fs::copy(kc, me.kubeconfig()).map_err(|source| LocalError::Io {
                    path: kc.clone(),
                    source,
                })?;
                let client = me.client().await?;
                install_crds(&client).await?;
                me.seed(&client).await?;
            }
        }
        for &c in components {
            me.launch(c).await?;
        }
        Ok(me)
    }

    /// The agent's SPDK JSON-RPC socket (when the agent runs SPDK).
    pub fn spdk_rpc_socket(&self) -> PathBuf {
        self.dir.join("spdk.sock")
    }

    /// Where the test API server keeps its objects.
    pub fn state_file(&self) -> PathBuf {
        self.dir.join("apiserver-state.json")
    }

    /// The agent's configuration for this run, built from the agent's own types.
    pub fn agent_config(&self) -> AgentConfig {
        let mut cfg = match self.engine {
            Engine::File => {
                let mut c = AgentConfig::file_pool("local-pool", self.dir.join("pool"));
                if let Some(f) = c.storage.file.as_mut() {
                    f.size = self.pool_bytes;
                }
                c
            }
            Engine::Spdk => {
                let mut c = AgentConfig::file_pool("local-lvs", self.dir.join("pool"));
                c.storage.pooling.mode = PoolingMode::SpdkLvStore;
                c.storage.file = None;
                c.storage.bdev = Some(SpdkBdev {
                    kind: BdevType::Aio,
                    name: "local-aio".into(),
                    size: self.pool_bytes,
                    file_path: self.dir.join("pool/aio-lvs.img").display().to_string(),
                    create_if_not_exist: true,
                    vfio_pcie_keyword: String::new(),
                });
                c
            }
        };
        // SPDK without busy-polling (unless the run asks for it), on core 0, without hugepages unless the run holds some
        // (`--hugepages`): an agent built with SPDK also starts it under the file engine, to
        // export volumes over NVMe/TCP.
        cfg.spdk.core_mask = "0x1".into();
        cfg.spdk.interrupt_mode = !self.spdk_polling;
        cfg.metrics.listen_address = self.agent_metrics;
        match &self.spdk_memory {
            hugepages::SpdkMemory::NoHuge => {
                cfg.spdk.no_huge = true;
                cfg.spdk.mem_size_mib = Some(768);
            }
            hugepages::SpdkMemory::Hugepages { dir, mem_mib } => {
                cfg.spdk.no_huge = false;
                cfg.spdk.mem_size_mib = Some(*mem_mib);
                cfg.spdk.huge_dir = Some(dir.clone());
            }
        }
        // SPDK's JSON-RPC socket, for spdk_rpc.py / rpc.py -s and the tests.
        cfg.spdk.rpc_socket = Some(self.spdk_rpc_socket());
        cfg.nvmf.listen_address = Some(std::net::IpAddr::from([127, 0, 0, 1]));
        // A restarted agent serves its exports from its own record before the API server
        // answers, as a deployed one does.
        cfg.nvmf.export_record_dir = Some(self.dir.join("exports"));
        cfg
    }

    /// The controller's scheduler settings for this run (everything else is the default),
    /// built from the controller's own types.
    pub fn scheduler_config(&self) -> SchedulerConfig {
        SchedulerConfig {
            filters: vec!["Basic".into(), "Affinity".into()],
            priorities: vec!["LeastResource".into(), "PositionAdvice".into()],
            ..SchedulerConfig::default()
        }
    }

    fn write_configs(&self) -> Result<(), LocalError> {
        let agent = serde_yaml::to_string(&self.agent_config())
            .map_err(|e| LocalError::Config(format!("agent config: {e}")))?;
        #[derive(serde::Serialize)]
        struct ControllerFile {
            scheduler: SchedulerConfig,
        }
        let controller = serde_yaml::to_string(&ControllerFile {
            scheduler: self.scheduler_config(),
        })
        .map_err(|e| LocalError::Config(format!("controller config: {e}")))?;
        // What the components will read back must load: a config they refuse would only
        // show as a component that never gets ready.
        AgentConfig::from_yaml(&agent)
            .map_err(|e| LocalError::Config(format!("agent config does not load: {e}")))?;
        ControllerConfig::parse(&controller)
            .map_err(|e| LocalError::Config(format!("controller config does not load: {e}")))?;
        write(&self.dir.join("agent-config.yaml"), &agent)?;
        write(&self.dir.join("controller-config.yaml"), &controller)
    }

    async fn client(&self) -> Result<Client, LocalError> {
        let kc = kube::config::Kubeconfig::read_from(self.kubeconfig())
            .map_err(|e| LocalError::Config(e.to_string()))?;
        let cfg =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| LocalError::Config(e.to_string()))?;
        Client::try_from(cfg).map_err(LocalError::Kube)
    }

    fn command(&self, c: Component) -> Command {
        let mut cmd = Command::new(self.bin_dir.join(c.binary()));
        let kc = self.kubeconfig();
        match c {
            Component::ApiServer => {
                cmd.arg("--port")
                    .arg(self.api_port.to_string())
                    .arg("--kubeconfig")
                    .arg(&kc)
                    .arg("--state-file")
                    .arg(self.state_file());
            }
            Component::Controller => {
                cmd.arg("--kubeconfig")
                    .arg(&kc)
                    .arg("--config")
                    .arg(self.dir.join("controller-config.yaml"));
                cmd.arg("--metrics-addr")
                    .arg(format!("127.0.0.1:{}", self.controller_port));
            }
            Component::Agent => {
                cmd.arg("--kubeconfig")
                    .arg(&kc)
                    .arg("--config")
                    .arg(self.dir.join("agent-config.yaml"));
                cmd.arg("--node-id")
                    .arg(&self.node)
                    .arg("--host-nqn-file")
                    .arg(self.dir.join("hostnqn"));
            }
            Component::Csi => {
                cmd.arg("--kubeconfig")
                    .arg(&kc)
                    .arg("--endpoint")
                    .arg(self.csi_endpoint());
                cmd.arg("--node-id")
                    .arg(&self.node)
                    .arg("--mode")
                    .arg("both");
                cmd.arg("--hostnqn-file").arg(self.dir.join("hostnqn"));
            }
        }
        cmd.env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        );
        cmd.kill_on_drop(true);
        // Own process group: a Ctrl-C in the terminal reaches liteio-local only, which then
        // unmounts and deletes through the still-running components before stopping them.
        cmd.process_group(0);
        cmd
    }

    /// Start one component and wait until it is ready.
    pub async fn launch(&mut self, c: Component) -> Result<(), LocalError> {
        let log_path = self.log(c);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|source| LocalError::Io {
                path: log_path.clone(),
                source,
            })?;
        let err = log.try_clone().map_err(|source| LocalError::Io {
            path: log_path.clone(),
            source,
        })?;
        // Lease times have microsecond precision: a heartbeat of this process is not earlier.
        let launched = k8s_openapi::jiff::Timestamp::now()
            .checked_sub(k8s_openapi::jiff::SignedDuration::from_millis(1))
            .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now());
        let child = self
            .command(c)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|source| LocalError::Spawn {
                name: c.binary(),
                source,
            })?;
        self.children.push((c, child));
        match c {
            Component::ApiServer => {
                let kc = self.kubeconfig();
                wait_until("the test API server", 30, &log_path, || {
                    let kc = kc.clone();
                    async move { kc.exists() }
                })
                .await?;
                let client = self.client().await?;
                wait_until("the test API server", 30, &log_path, || {
                    let client = client.clone();
                    async move { client.apiserver_version().await.is_ok() }
                })
                .await?;
                self.seed(&client).await?;
            }
            Component::Controller => {
                let url = format!("127.0.0.1:{}", self.controller_port);
                wait_until("the controller", 30, &log_path, || {
                    let url = url.clone();
                    async move { http_ok(&url, "/healthz").await }
                })
                .await?;
            }
            Component::Agent => {
                // Ready = its pool registered and a heartbeat from this process: the Lease
                // renewed after the launch (a restarted agent's old pool object is there
                // already).
                let client = self.client().await?;
                let pools: Api<StoragePool> =
                    Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
                let leases: Api<Lease> = Api::namespaced(client, keys::DEFAULT_NAMESPACE);
                let node = self.node.clone();
                wait_until(
                    "the disk-agent's StoragePool and heartbeat",
                    60,
                    &log_path,
                    || {
                        let (pools, leases, node) = (pools.clone(), leases.clone(), node.clone());
                        async move {
                            let pool = pools
                                .get_opt(&node)
                                .await
                                .ok()
                                .flatten()
                                .is_some_and(|p| p.total_bytes() > 0);
                            let beat = leases.get_opt(&node).await.ok().flatten().and_then(|l| {
                                let s = l.spec?;
                                s.renew_time.or(s.acquire_time).map(|t| t.0)
                            });
                            pool && beat.is_some_and(|t| t >= launched)
                        }
                    },
                )
                .await?;
            }
            Component::Csi => {
                let ep = self.csi_endpoint();
                wait_until("the CSI driver", 30, &log_path, || {
                    let ep = ep.clone();
                    async move { liteio_csi::client::connect(&ep).await.is_ok() }
                })
                .await?;
            }
        }
        Ok(())
    }

    /// The namespace and this machine's Node object.
    async fn seed(&self, client: &Client) -> Result<(), LocalError> {
        ensure_namespace(client).await?;
        let nodes: Api<Node> = Api::all(client.clone());
        if nodes.get_opt(&self.node).await?.is_none() {
            let labels = [
                (keys::labels::KUBE_HOSTNAME, self.node.as_str()),
                (keys::labels::NODE_IP, "127.0.0.1"),
                (keys::labels::NODE_HOSTNAME, self.node.as_str()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            let obj = Node {
                metadata: ObjectMeta {
                    name: Some(self.node.clone()),
                    labels: Some(labels),
                    ..Default::default()
                },
                status: Some(NodeStatus {
                    addresses: Some(vec![NodeAddress {
                        type_: "InternalIP".into(),
                        address: "127.0.0.1".into(),
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            };
            nodes.create(&PostParams::default(), &obj).await?;
        }
        Ok(())
    }

    /// Stop one component (SIGTERM, then SIGKILL after 15 s).
    pub async fn stop_component(&mut self, c: Component) {
        if let Some(i) = self.children.iter().position(|(k, _)| *k == c) {
            let (_, mut child) = self.children.remove(i);
            terminate(&mut child).await;
        }
    }

    /// Kill one component with SIGKILL (crash), without waiting for cleanup.
    pub async fn kill_component(&mut self, c: Component) {
        if let Some(i) = self.children.iter().position(|(k, _)| *k == c) {
            let (_, mut child) = self.children.remove(i);
            let _ = child.kill().await;
        }
    }

    /// Kill one component with SIGKILL (a crash) and start it again, ready.
    pub async fn crash_and_restart(&mut self, c: Component) -> Result<(), LocalError> {
        self.kill_component(c).await;
        self.launch(c).await
    }

    /// Stop every component, last started first; then release the pool's XFS image, if one
    /// was made (what volumes left mounted or attached under the run directory first).
    pub async fn stop(&mut self) {
        while let Some((_, mut child)) = self.children.pop() {
            terminate(&mut child).await;
        }
        if let Some(fs) = self.pool_fs.take() {
            let _ = tokio::task::spawn_blocking(move || drop(fs)).await;
        }
    }

    /// The process id of a running component.
    pub fn pid(&self, c: Component) -> Option<u32> {
        self.children
            .iter()
            .find(|(k, _)| *k == c)
            .and_then(|(_, child)| child.id())
    }

    /// A client of the API server.
    pub async fn kube(&self) -> Result<Client, LocalError> {
        self.client().await
    }
}

/// Applies LiteIO's CRDs (server-side apply, so a re-run updates them) and waits until the
/// API server serves them.
async fn install_crds(client: &Client) -> Result<(), LocalError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply("liteio-local").force();
    let mut names = Vec::new();
    for crd in liteio_api::crd::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &pp, &Patch::Apply(&crd)).await?;
        names.push(name);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    for name in names {
        loop {
            let established = api.get(&name).await?.status.is_some_and(|s| {
                s.conditions
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
            if established {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(LocalError::Config(format!(
                    "the API server did not establish CRD {name} within 30 s"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

async fn terminate(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status();
        if tokio::time::timeout(Duration::from_secs(15), child.wait())
            .await
            .is_ok()
        {
            return;
        }
    }
    let _ = child.kill().await;
}

/// The last `lines` lines of every component's log in the state directory `dir`, for a
/// failed run.
pub fn log_tails(dir: &Path, lines: usize) -> String {
    let mut out = String::new();
    for c in [
        Component::ApiServer,
        Component::Controller,
        Component::Agent,
        Component::Csi,
    ] {
        let Ok(log) = std::fs::read_to_string(dir.join(format!("{}.log", c.binary()))) else {
            continue;
        };
        let all: Vec<&str> = log.lines().collect();
        out.push_str(&format!(
            "---- {}.log (last {lines} lines) ----\n",
            c.binary()
        ));
        for l in &all[all.len().saturating_sub(lines)..] {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// Creates LiteIO's namespace when it is missing.
pub(crate) async fn ensure_namespace(client: &Client) -> Result<(), LocalError> {
    let ns: Api<Namespace> = Api::all(client.clone());
    if ns.get_opt(keys::DEFAULT_NAMESPACE).await?.is_none() {
        let obj = Namespace {
            metadata: ObjectMeta {
                name: Some(keys::DEFAULT_NAMESPACE.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        ns.create(&PostParams::default(), &obj).await?;
    }
    Ok(())
}

/// Undoes what volumes may have left on this host under `dir`: unmounts every mount below it
/// (deepest first) and detaches every loop device backed by a file below it. The last resort
/// when the teardown through CSI could not run (a component died); returns what it undid.
pub fn release_host_resources(dir: &Path) -> Vec<String> {
    use liteio_node::cmd::{CommandRunner, SystemRunner, argv};
    // A stuck umount or losetup must not hang the teardown: the runner's timeout applies.
    let runner = SystemRunner::with_timeout(Duration::from_secs(60));
    let run = |cmd: &str, args: &[&str]| {
        let mut a = vec![cmd];
        a.extend_from_slice(args);
        runner.run(&argv(&a)).is_ok_and(|o| o.success())
    };
    let prefix = format!("{}/", dir.display());
    let mut done = Vec::new();
    let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| m.starts_with(&prefix))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    // A file system holding the backing files of attached loop devices (the file engine's
    // pool on its XFS image) is busy until they are detached, and a lazy unmount would hide
    // their paths from `losetup`: unmount what can be, detach, then the rest.
    let mut busy = Vec::new();
    for m in mounts {
        if run("umount", &[&m]) {
            done.push(format!("unmounted {m}"));
        } else {
            busy.push(m);
        }
    }
    if let Ok(o) = runner.run(&argv(&["losetup", "-a"])) {
        for l in o.stdout.lines().filter(|l| l.contains(&prefix)) {
            if let Some(dev) = l.split(':').next()
                && run("losetup", &["-d", dev])
            {
                done.push(format!("detached {dev}"));
            }
        }
    }
    for m in busy {
        if run("umount", &[&m]) || run("umount", &["-l", &m]) {
            done.push(format!("unmounted {m}"));
        }
    }
    done
}

/// True when `GET http://addr/path` answers 200.
pub async fn http_ok(addr: &str, path: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(Ok(mut s)) =
        tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr)).await
    else {
        return false;
    };
    let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    let mut buf = [0u8; 32];
    matches!(tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await, Ok(Ok(n)) if n >= 12 && buf[9..12] == *b"200")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn local(engine: Engine, dir: &Path) -> Local {
        Local {
            dir: dir.to_path_buf(),
            bin_dir: dir.to_path_buf(),
            node: "n1".into(),
            engine,
            api_port: 1,
            controller_port: 2,
            api: ApiSource::Test,
            pool_bytes: 8 << 30,
            spdk_memory: hugepages::SpdkMemory::NoHuge,
            agent_metrics: None,
            spdk_polling: false,
            pool_note: None,
            children: Vec::new(),
            pool_fs: None,
        }
    }

    #[test]
    fn written_configs_load_as_the_components_read_them() {
        let d = tempfile::tempdir().unwrap();
        for engine in [Engine::File, Engine::Spdk] {
            let l = local(engine, d.path());
            l.write_configs().unwrap();
            let a = AgentConfig::load(d.path().join("agent-config.yaml")).unwrap();
            assert_eq!(a, l.agent_config());
            assert!(a.spdk.interrupt_mode && a.spdk.no_huge);
            match engine {
                Engine::File => assert_eq!(a.storage.file.unwrap().size, 8 << 30),
                Engine::Spdk => assert_eq!(a.storage.bdev.unwrap().size, 8 << 30),
            }
            let c = ControllerConfig::load(&d.path().join("controller-config.yaml")).unwrap();
            assert_eq!(c.scheduler, l.scheduler_config());
        }
    }

    #[test]
    fn with_hugepages_the_agent_takes_them_from_the_runs_mount() {
        let d = tempfile::tempdir().unwrap();
        let mut l = local(Engine::Spdk, d.path());
        l.spdk_memory = hugepages::SpdkMemory::Hugepages {
            dir: d.path().join("hugepages"),
            mem_mib: 512,
        };
        l.write_configs().unwrap();
        let a = AgentConfig::load(d.path().join("agent-config.yaml")).unwrap();
        assert!(!a.spdk.no_huge);
        assert_eq!(a.spdk.mem_size_mib, Some(512));
        assert_eq!(a.spdk.huge_dir, Some(d.path().join("hugepages")));
    }

    #[test]
    fn a_tuned_agent_polls_and_serves_metrics() {
        let d = tempfile::tempdir().unwrap();
        let mut l = local(Engine::Spdk, d.path());
        l.spdk_polling = true;
        l.agent_metrics = Some("127.0.0.1:9109".parse().unwrap());
        l.write_configs().unwrap();
        let a = AgentConfig::load(d.path().join("agent-config.yaml")).unwrap();
        assert!(!a.spdk.interrupt_mode);
        assert_eq!(a.metrics.listen_address, l.agent_metrics);
    }
}
