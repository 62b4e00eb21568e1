//! A cluster on one machine: N storage nodes, each in its own network namespace
//! ([`crate::netns`]) with its own disk-agent, CSI node plugin, host NQN, node name and state
//! directory; the test API server, the CSI controller service and (by default) the
//! node-disk-controller in the root namespace, listening on the bridge address so that every
//! node reaches them. `liteio-local --nodes N` (N > 1) and the multi-node tests run this.
//!
//! Every process is recorded in the run directory as it starts, with the namespaces and
//! links, so [`crate::netns::cleanup`] undoes a run that was killed.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use liteio_agent::config::Config as AgentConfig;
use liteio_api::{StoragePool, keys};
use liteio_controller::config::Config as ControllerConfig;
use tokio::process::{Child, Command};

use crate::netns::{Ledger, Network};
use crate::{ApiSource, Engine, Local, LocalError, http_ok, wait_until};

/// The last `lines` lines of every log of a run in `dir` (the root namespace's components and
/// each node's), for failure reports.
pub fn log_tails(dir: &Path, lines: usize) -> String {
    let mut logs = Vec::new();
    for d in [dir.to_path_buf(), dir.join("nodes")] {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "log") {
                logs.push(p);
            } else if p.is_dir() {
                logs.extend(
                    std::fs::read_dir(&p)
                        .into_iter()
                        .flatten()
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|x| x == "log")),
                );
            }
        }
    }
    let mut out = String::new();
    for l in logs {
        let text = std::fs::read_to_string(&l).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        out.push_str(&format!("---- {} ----\n", l.display()));
        for line in &all[all.len().saturating_sub(lines)..] {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Port of each node's agent metrics (in the node's namespace, on its address).
pub const AGENT_METRICS_PORT: u16 = 9100;
/// Port of a controller's probes and metrics when it runs in a node's namespace.
pub const NODE_CONTROLLER_PORT: u16 = 9090;
/// Port of each node's CSI node plugin metrics (in the node's namespace, on its address).
pub const CSI_NODE_METRICS_PORT: u16 = 9101;

/// Where a node-disk-controller runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The root namespace (with the API server).
    Root,
    /// Node `k`'s namespace (1-based): cutting the node's link cuts the controller off.
    Node(usize),
}

/// Timings of pool liveness (the controller's `liveness:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// Silent this long: pool `unknown`.
    pub unknown_after: Duration,
    /// Silent this long: pool `offline`.
    pub offline_after: Duration,
    /// Period of the liveness clock.
    pub tick: Duration,
}

/// Timings of the controllers' leader election (`leaderElection:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Election {
    /// `leaseDuration`.
    pub lease: Duration,
    /// `renewDeadline`.
    pub renew_deadline: Duration,
    /// `retryPeriod`.
    pub retry: Duration,
}

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterOptions {
    /// Storage nodes (1..=[`crate::netns::MAX_NODES`]).
    pub nodes: usize,
    /// The agents' engine.
    pub engine: Engine,
    /// Size of each node's pool in bytes (sparse).
    pub pool_bytes: u64,
    /// node-disk-controllers; with more than one they take part in leader election.
    pub controllers: Vec<Place>,
    /// Pool liveness; `None` keeps the controller's defaults (3 min / 24 h).
    pub liveness: Option<Liveness>,
    /// Leader election; `None` keeps the controller's defaults (15 s / 10 s / 2 s).
    pub election: Option<Election>,
    /// Agents' heartbeat (interval, leaseDuration); `None` keeps the agent's defaults.
    pub heartbeat: Option<(Duration, Duration)>,
    /// Nodes (1-based) whose agent runs SPDK with polling reactors, as production nodes do;
    /// the others run in interrupt mode (a polling reactor takes a whole core). SPDK's
    /// NVMe/TCP initiator, which a hot migration's source uses, needs polling.
    pub spdk_polling: Vec<usize>,
    /// The scheduler's `maxRemoteVolumeCount` (remote volumes per storage node); `None`
    /// keeps the controller's default (3). The agents' listen port range is widened to fit.
    pub max_remote_volumes: Option<u32>,
    /// The controller's volume workers (`workers.volume`); `None` keeps its default.
    pub volume_workers: Option<u32>,
}

impl ClusterOptions {
    /// `nodes` nodes on `engine`, one controller in the root namespace, defaults elsewhere.
    pub fn new(nodes: usize, engine: Engine) -> Self {
        Self {
            nodes,
            engine,
            pool_bytes: crate::DEFAULT_POOL_BYTES,
            controllers: vec![Place::Root],
            liveness: None,
            election: None,
            heartbeat: None,
            spdk_polling: Vec::new(),
            max_remote_volumes: None,
            volume_workers: None,
        }
    }
}

/// A process of the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The test API server (root namespace).
    ApiServer,
    /// The CSI controller service (root namespace).
    CsiController,
    /// node-disk-controller number `i` (0-based index into [`ClusterOptions::controllers`]).
    Controller(usize),
    /// Node `k`'s disk-agent.
    Agent(usize),
    /// Node `k`'s CSI node plugin.
    CsiNode(usize),
}

impl Role {
    fn binary(self) -> &'static str {
        match self {
            Self::ApiServer => "test-apiserver",
            Self::Controller(_) => "node-disk-controller",
            Self::Agent(_) => "disk-agent",
            Self::CsiController | Self::CsiNode(_) => "csi-driver",
        }
    }
}

/// A running multi-node cluster.
#[derive(Debug)]
pub struct Cluster {
    /// Run directory: kubeconfig, configs, logs, `nodes/<name>/` per node, the record.
    pub dir: PathBuf,
    /// Directory of the component binaries.
    pub bin_dir: PathBuf,
    /// The namespaces and addresses.
    pub net: Network,
    /// The API server's port on the bridge address.
    pub api_port: u16,
    /// What was asked.
    pub opts: ClusterOptions,
    controller_ports: Vec<u16>,
    csi_controller_metrics_port: u16,
    ledger: Ledger,
    /// Where the file engine's pools have their reflinks from, when not the run directory's
    /// own file system (see [`crate::poolfs`]), one line per node.
    pub pool_notes: Vec<String>,
    children: Vec<(Role, Child)>,
    /// The XFS images under the nodes' file-engine pools (released at shutdown, after the
    /// processes; declared after `children`, so also when dropped).
    pool_fs: Vec<crate::poolfs::XfsImage>,
}

/// The Node object of node `name` at `ip`, as kubelet registers it (hostname labels, the
/// InternalIP address).
pub(crate) fn node_object(name: &str, ip: Ipv4Addr) -> Node {
    let ip = ip.to_string();
    let labels = [
        (keys::labels::KUBE_HOSTNAME, name),
        (keys::labels::NODE_IP, ip.as_str()),
        (keys::labels::NODE_HOSTNAME, name),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels),
            ..Default::default()
        },
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: ip,
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A free TCP port on `addr`.
fn free_port(addr: Ipv4Addr) -> Result<u16, LocalError> {
    std::net::TcpListener::bind((addr, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|source| LocalError::Spawn {
            name: "port probe",
            source,
        })
}

fn mkdir(path: &Path) -> Result<(), LocalError> {
    std::fs::create_dir_all(path).map_err(|source| LocalError::Io {
        path: path.into(),
        source,
    })
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

impl Cluster {
    /// Creates the network, starts every process and waits until each is ready: the API
    /// server, the CSI controller, the controllers, then per node the agent (pool registered
    /// and heartbeating) and the CSI node plugin. `dir` must not hold another live run (run
    /// [`crate::netns::cleanup`] on it first). On failure everything started or created is
    /// removed again.
    pub async fn start(
        dir: &Path,
        bin_dir: &Path,
        opts: ClusterOptions,
    ) -> Result<Self, LocalError> {
        crate::netns::check_nodes(opts.nodes)?;
        if opts.controllers.is_empty() {
            return Err(LocalError::Config(
                "a cluster needs at least one node-disk-controller".into(),
            ));
        }
        for p in &opts.controllers {
            if let Place::Node(k) = p
                && (*k == 0 || *k > opts.nodes)
            {
                return Err(LocalError::Config(format!(
                    "a controller on node {k}: this run has nodes 1 to {}",
                    opts.nodes
                )));
            }
        }
        for b in [
            "test-apiserver",
            "node-disk-controller",
            "disk-agent",
            "csi-driver",
        ] {
            let p = bin_dir.join(b);
            if !p.exists() {
                return Err(LocalError::MissingBinary(b, p));
            }
        }
        mkdir(dir)?;
        let mut ledger = Ledger::create(dir)?;
        let nodes = opts.nodes;
        let net = tokio::task::spawn_blocking(move || {
            let net = Network::create(&mut ledger, nodes);
            (ledger, net)
        });
        let (ledger, net) = net
            .await
            .map_err(|e| LocalError::Network(format!("network set-up task: {e}")))?;
        let net = net?;
        let mut me = Self {
            dir: dir.to_path_buf(),
            bin_dir: bin_dir.to_path_buf(),
            api_port: 0,
            controller_ports: Vec::new(),
            csi_controller_metrics_port: 0,
            net,
            opts,
            ledger,
            pool_notes: Vec::new(),
            children: Vec::new(),
            pool_fs: Vec::new(),
        };
        match me.bring_up().await {
            Ok(()) => Ok(me),
            Err(e) => {
                me.shutdown().await;
                Err(e)
            }
        }
    }

    async fn bring_up(&mut self) -> Result<(), LocalError> {
        self.api_port = free_port(self.net.bridge_address())?;
        self.controller_ports = self
            .opts
            .controllers
            .iter()
            .map(|p| match p {
                Place::Root => free_port(Ipv4Addr::LOCALHOST),
                Place::Node(_) => Ok(NODE_CONTROLLER_PORT),
            })
            .collect::<Result<_, _>>()?;
        self.csi_controller_metrics_port = free_port(Ipv4Addr::LOCALHOST)?;
        for k in 1..=self.opts.nodes {
            let pool = self.node_dir(k).join("pool");
            mkdir(&pool)?;
            if self.opts.engine == crate::Engine::File {
                let image = self.node_dir(k).join("pool.xfs");
                match crate::poolfs::reflink_pool(&pool, &image, self.opts.pool_bytes) {
                    crate::poolfs::PoolFs::Native => {}
                    crate::poolfs::PoolFs::Image(fs) => {
                        self.pool_notes.push(format!(
                            "node {}: no reflinks in {}; the file engine's pool is an XFS image (reflink=1) at {}",
                            self.node_name(k),
                            self.dir.display(),
                            image.display()
                        ));
                        self.pool_fs.push(fs);
                    }
                    crate::poolfs::PoolFs::Without(why) => self.pool_notes.push(format!(
                        "node {}: no reflinks in {} and no XFS image ({why}): snapshots will be refused",
                        self.node_name(k),
                        self.dir.display()
                    )),
                }
            }
        }
        self.write_configs()?;
        self.launch(Role::ApiServer).await?;
        self.launch(Role::CsiController).await?;
        for i in 0..self.opts.controllers.len() {
            self.launch(Role::Controller(i)).await?;
        }
        for k in 1..=self.opts.nodes {
            self.launch(Role::Agent(k)).await?;
            self.launch(Role::CsiNode(k)).await?;
        }
        Ok(())
    }

    /// Node `k`'s name (`node-<k>`).
    pub fn node_name(&self, k: usize) -> String {
        format!("node-{k}")
    }

    /// Node `k`'s state directory.
    pub fn node_dir(&self, k: usize) -> PathBuf {
        self.dir.join("nodes").join(self.node_name(k))
    }

    /// Node `k`'s address.
    pub fn node_address(&self, k: usize) -> Result<Ipv4Addr, LocalError> {
        Ok(self.net.node(k)?.address)
    }

    /// The kubeconfig (server on the bridge address; the same for every node).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// The kubeconfig node `k`'s agent starts with: `nodes/<name>/kubeconfig` when present
    /// (a test points it at an API server that is not there, to restart the agent cut off
    /// from the API server while its node's link and data path stay up), else the shared one.
    pub fn agent_kubeconfig(&self, k: usize) -> PathBuf {
        let own = self.node_dir(k).join("kubeconfig");
        if own.exists() { own } else { self.kubeconfig() }
    }

    /// The CSI controller service's endpoint.
    pub fn csi_controller_endpoint(&self) -> String {
        format!("unix://{}", self.dir.join("csi.sock").display())
    }

    /// Node `k`'s CSI node plugin endpoint.
    pub fn csi_node_endpoint(&self, k: usize) -> String {
        format!("unix://{}", self.node_dir(k).join("csi.sock").display())
    }

    /// The log of a process.
    pub fn log(&self, r: Role) -> PathBuf {
        match r {
            Role::ApiServer => self.dir.join("test-apiserver.log"),
            Role::CsiController => self.dir.join("csi-controller.log"),
            Role::Controller(i) => self.dir.join(format!("node-disk-controller-{i}.log")),
            Role::Agent(k) => self.node_dir(k).join("disk-agent.log"),
            Role::CsiNode(k) => self.node_dir(k).join("csi-node.log"),
        }
    }

    /// Where controller `i` serves /healthz and /metrics.
    pub fn controller_addr(&self, i: usize) -> Result<SocketAddr, LocalError> {
        let port = self
            .controller_ports
            .get(i)
            .copied()
            .ok_or_else(|| LocalError::Config(format!("no controller {i}")))?;
        let ip = match self.opts.controllers.get(i) {
            Some(Place::Node(k)) => self.node_address(*k)?,
            _ => Ipv4Addr::LOCALHOST,
        };
        Ok(SocketAddr::from((ip, port)))
    }

    /// Where node `k`'s agent serves /metrics.
    pub fn agent_metrics_addr(&self, k: usize) -> Result<SocketAddr, LocalError> {
        Ok(SocketAddr::from((
            self.node_address(k)?,
            AGENT_METRICS_PORT,
        )))
    }

    /// Where node `k`'s CSI node plugin serves /metrics.
    pub fn csi_node_metrics_addr(&self, k: usize) -> Result<SocketAddr, LocalError> {
        Ok(SocketAddr::from((
            self.node_address(k)?,
            CSI_NODE_METRICS_PORT,
        )))
    }

    /// Where the CSI controller service serves /metrics (root namespace, 127.0.0.1).
    pub fn csi_controller_metrics_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.csi_controller_metrics_port))
    }

    /// Node `k`'s agent configuration: the single-node one for the engine, listening on the
    /// node's address.
    pub fn agent_config(&self, k: usize) -> Result<AgentConfig, LocalError> {
        // The single-node run's config for this engine, rooted in the node's directory.
        let single = Local {
            dir: self.node_dir(k),
            bin_dir: self.bin_dir.clone(),
            node: self.node_name(k),
            engine: self.opts.engine,
            api_port: self.api_port,
            controller_port: 0,
            api: ApiSource::Test,
            pool_bytes: self.opts.pool_bytes,
            spdk_memory: Default::default(),
            agent_metrics: None,
            spdk_polling: self.opts.spdk_polling.contains(&k),
            pool_note: None,
            children: Vec::new(),
            pool_fs: None,
        };
        let mut cfg = single.agent_config();
        // Several agents' SPDK runtimes share this machine's cores.
        cfg.spdk.lock_cores = false;
        let ip = self.node_address(k)?;
        cfg.nvmf.listen_address = Some(ip.into());
        // One listener port per export: room for every remote volume the scheduler may
        // place here (the default range has 101 ports).
        if let Some(n) = self.opts.max_remote_volumes {
            let pr = &mut cfg.nvmf.port_range;
            pr.end = pr
                .end
                .max(pr.start.saturating_add(n))
                .min(u32::from(u16::MAX));
        }
        cfg.metrics.listen_address = Some(SocketAddr::from((ip, AGENT_METRICS_PORT)));
        if let Some((interval, duration)) = self.opts.heartbeat {
            cfg.heartbeat.interval = interval;
            cfg.heartbeat.duration = duration;
        }
        Ok(cfg)
    }

    fn controller_config(&self) -> Result<String, LocalError> {
        let scheduler = Local {
            dir: self.dir.clone(),
            bin_dir: self.bin_dir.clone(),
            node: String::new(),
            engine: self.opts.engine,
            api_port: self.api_port,
            controller_port: 0,
            api: ApiSource::Test,
            pool_bytes: self.opts.pool_bytes,
            spdk_memory: Default::default(),
            agent_metrics: None,
            spdk_polling: false,
            pool_note: None,
            children: Vec::new(),
            pool_fs: None,
        }
        .scheduler_config();
        let mut body = serde_json::json!({ "scheduler": scheduler });
        if let Some(n) = self.opts.max_remote_volumes {
            body["scheduler"]["maxRemoteVolumeCount"] = serde_json::json!(n);
        }
        if let Some(n) = self.opts.volume_workers {
            body["workers"] = serde_json::json!({ "volume": n });
        }
        if let Some(l) = self.opts.liveness {
            body["liveness"] = serde_json::json!({
                "unknownAfter": ms(l.unknown_after),
                "offlineAfter": ms(l.offline_after),
                "tick": ms(l.tick),
            });
        }
        if let Some(e) = self.opts.election {
            body["leaderElection"] = serde_json::json!({
                "leaseDuration": ms(e.lease),
                "renewDeadline": ms(e.renew_deadline),
                "retryPeriod": ms(e.retry),
            });
        }
        serde_yaml::to_string(&body)
            .map_err(|e| LocalError::Config(format!("controller config: {e}")))
    }

    fn write_configs(&self) -> Result<(), LocalError> {
        let controller = self.controller_config()?;
        ControllerConfig::parse(&controller)
            .map_err(|e| LocalError::Config(format!("controller config does not load: {e}")))?;
        crate::write(&self.dir.join("controller-config.yaml"), &controller)?;
        for k in 1..=self.opts.nodes {
            let agent = serde_yaml::to_string(&self.agent_config(k)?)
                .map_err(|e| LocalError::Config(format!("agent config: {e}")))?;
            AgentConfig::from_yaml(&agent)
                .map_err(|e| LocalError::Config(format!("agent config does not load: {e}")))?;
            crate::write(&self.node_dir(k).join("agent-config.yaml"), &agent)?;
        }
        Ok(())
    }

    fn command(&self, r: Role) -> Result<Command, LocalError> {
        let bin = self.bin_dir.join(r.binary());
        let node = match r {
            Role::Agent(k) | Role::CsiNode(k) => Some(k),
            Role::Controller(i) => match self.opts.controllers.get(i) {
                Some(Place::Node(k)) => Some(*k),
                _ => None,
            },
            Role::ApiServer | Role::CsiController => None,
        };
        let mut cmd = match node {
            Some(k) => {
                let prefix = self.net.exec_prefix(k)?;
                let mut c = Command::new(&prefix[0]);
                c.args(&prefix[1..]).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        let kc = self.kubeconfig();
        match r {
            Role::ApiServer => {
                cmd.arg("--address")
                    .arg(self.net.bridge_address().to_string())
                    .arg("--port")
                    .arg(self.api_port.to_string())
                    .arg("--kubeconfig")
                    .arg(&kc)
                    .arg("--state-file")
                    .arg(self.dir.join("apiserver-state.json"));
            }
            Role::CsiController => {
                cmd.arg("--kubeconfig")
                    .arg(&kc)
                    .arg("--endpoint")
                    .arg(self.csi_controller_endpoint())
                    .arg("--node-id")
                    .arg("csi-controller")
                    .arg("--mode")
                    .arg("controller")
                    .arg("--metrics-addr")
                    .arg(self.csi_controller_metrics_addr().to_string());
            }
            Role::Controller(i) => {
                cmd.arg("--kubeconfig")
                    .arg(&kc)
                    .arg("--config")
                    .arg(self.dir.join("controller-config.yaml"))
                    .arg("--metrics-addr")
                    .arg(self.controller_addr(i)?.to_string())
                    .arg("--log-format")
                    .arg("json");
                if self.opts.controllers.len() > 1 {
                    cmd.arg("--leader-elect")
                        .arg("--identity")
                        .arg(format!("controller-{i}"));
                }
            }
            Role::Agent(k) => {
                cmd.arg("--kubeconfig")
                    .arg(self.agent_kubeconfig(k))
                    .arg("--config")
                    .arg(self.node_dir(k).join("agent-config.yaml"))
                    .arg("--node-id")
                    .arg(self.node_name(k))
                    .arg("--host-nqn-file")
                    .arg(self.node_dir(k).join("hostnqn"))
                    .arg("--log-format")
                    .arg("json");
            }
            Role::CsiNode(k) => {
                cmd.arg("--kubeconfig")
                    .arg(&kc)
                    .arg("--endpoint")
                    .arg(self.csi_node_endpoint(k))
                    .arg("--node-id")
                    .arg(self.node_name(k))
                    .arg("--mode")
                    .arg("node")
                    .arg("--hostnqn-file")
                    .arg(self.node_dir(k).join("hostnqn"))
                    .arg("--metrics-addr")
                    .arg(self.csi_node_metrics_addr(k)?.to_string());
            }
        }
        cmd.env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        );
        cmd.kill_on_drop(true);
        cmd.process_group(0);
        Ok(cmd)
    }

    /// Starts one process, records it, and waits until it is ready.
    pub async fn launch(&mut self, r: Role) -> Result<(), LocalError> {
        let launched = self.launch_unwaited(r)?;
        self.wait_ready(r, launched, &self.log(r)).await
    }

    /// Starts one process and records it, without waiting for it to be ready (an agent cut
    /// off from the API server never registers); returns when it was started.
    pub fn launch_unwaited(&mut self, r: Role) -> Result<k8s_openapi::jiff::Timestamp, LocalError> {
        let log_path = self.log(r);
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .map_err(|source| LocalError::Io {
                    path: log_path.clone(),
                    source,
                })
        };
        let (out, err) = (open()?, open()?);
        let launched = k8s_openapi::jiff::Timestamp::now()
            .checked_sub(k8s_openapi::jiff::SignedDuration::from_millis(1))
            .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now());
        let child = self
            .command(r)?
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|source| LocalError::Spawn {
                name: r.binary(),
                source,
            })?;
        if let Some(pid) = child.id() {
            self.ledger.add_process(pid, &format!("{r:?}"))?;
        }
        self.children.push((r, child));
        Ok(launched)
    }

    async fn wait_ready(
        &self,
        r: Role,
        launched: k8s_openapi::jiff::Timestamp,
        log: &Path,
    ) -> Result<(), LocalError> {
        match r {
            Role::ApiServer => {
                let kc = self.kubeconfig();
                wait_until("the test API server", 30, log, || {
                    let kc = kc.clone();
                    async move { kc.exists() }
                })
                .await?;
                let client = self.kube().await?;
                wait_until("the test API server", 30, log, || {
                    let client = client.clone();
                    async move { client.apiserver_version().await.is_ok() }
                })
                .await?;
                self.seed(&client).await
            }
            Role::Controller(i) => {
                let addr = self.controller_addr(i)?.to_string();
                wait_until(&format!("controller {i}"), 30, log, || {
                    let addr = addr.clone();
                    async move { http_ok(&addr, "/healthz").await }
                })
                .await
            }
            Role::Agent(k) => {
                let client = self.kube().await?;
                let pools: Api<StoragePool> =
                    Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
                let leases: Api<Lease> = Api::namespaced(client, keys::DEFAULT_NAMESPACE);
                let node = self.node_name(k);
                wait_until(
                    &format!("{node}'s disk-agent (StoragePool and heartbeat)"),
                    60,
                    log,
                    || {
                        let (pools, leases, node) = (pools.clone(), leases.clone(), node.clone());
                        async move {
                            let pool = pools
                                .get_opt(&node)
                                .await
                                .ok()
                                .flatten()
                                .is_some_and(|p| p.total_bytes() > 0);
                            pool && lease_renewed(&leases, &node)
                                .await
                                .is_some_and(|t| t >= launched)
                        }
                    },
                )
                .await
            }
            Role::CsiController | Role::CsiNode(_) => {
                let ep = match r {
                    Role::CsiNode(k) => self.csi_node_endpoint(k),
                    _ => self.csi_controller_endpoint(),
                };
                wait_until(&format!("{r:?}"), 30, log, || {
                    let ep = ep.clone();
                    async move { liteio_csi::client::connect(&ep).await.is_ok() }
                })
                .await
            }
        }
    }

    /// The namespace and one Node object per node, with its address.
    async fn seed(&self, client: &Client) -> Result<(), LocalError> {
        crate::ensure_namespace(client).await?;
        let nodes: Api<Node> = Api::all(client.clone());
        for k in 1..=self.opts.nodes {
            let name = self.node_name(k);
            if nodes.get_opt(&name).await?.is_some() {
                continue;
            }
            let obj = node_object(&name, self.node_address(k)?);
            nodes.create(&PostParams::default(), &obj).await?;
        }
        Ok(())
    }

    /// A client of the API server (from the root namespace).
    pub async fn kube(&self) -> Result<Client, LocalError> {
        let kc = kube::config::Kubeconfig::read_from(self.kubeconfig())
            .map_err(|e| LocalError::Config(e.to_string()))?;
        let cfg =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| LocalError::Config(e.to_string()))?;
        Client::try_from(cfg).map_err(LocalError::Kube)
    }

    /// What the run created so far (as recorded in the run directory).
    pub fn record(&self) -> &crate::netns::Record {
        self.ledger.record()
    }

    /// True while process `r` runs (it was started and has not exited).
    pub fn is_running(&mut self, r: Role) -> bool {
        self.children
            .iter_mut()
            .find(|(k, _)| *k == r)
            .is_some_and(|(_, c)| matches!(c.try_wait(), Ok(None)))
    }

    /// The process id of `r`, while it was started and not stopped or killed.
    pub fn pid(&self, r: Role) -> Option<u32> {
        self.children
            .iter()
            .find(|(k, _)| *k == r)
            .and_then(|(_, c)| c.id())
    }

    /// Cuts node `k` off the network (its veth down) or joins it again.
    pub async fn set_link(&self, k: usize, up: bool) -> Result<(), LocalError> {
        let net = self.net.clone();
        tokio::task::spawn_blocking(move || net.set_link(k, up))
            .await
            .map_err(|e| LocalError::Network(format!("link task: {e}")))?
    }

    /// Kills process `r` with SIGKILL (a crash) and waits until it is gone.
    pub async fn kill(&mut self, r: Role) -> Result<(), LocalError> {
        if let Some(i) = self.children.iter().position(|(k, _)| *k == r) {
            let (_, mut child) = self.children.remove(i);
            let pid = child.id();
            let _ = child.kill().await;
            if let Some(pid) = pid {
                self.ledger.remove_process(pid)?;
            }
        }
        Ok(())
    }

    /// Stops process `r` (SIGTERM, SIGKILL after 15 s).
    pub async fn stop(&mut self, r: Role) -> Result<(), LocalError> {
        if let Some(i) = self.children.iter().position(|(k, _)| *k == r) {
            let (_, mut child) = self.children.remove(i);
            let pid = child.id();
            crate::terminate(&mut child).await;
            if let Some(pid) = pid {
                self.ledger.remove_process(pid)?;
            }
        }
        Ok(())
    }

    /// The run's record of what to undo after a crash.
    pub(crate) fn ledger_mut(&mut self) -> &mut Ledger {
        &mut self.ledger
    }

    /// Stops every process (last started first), then removes the namespaces, links, mounts
    /// and loop devices of the run; returns what the last-resort cleanup still had to undo.
    pub async fn shutdown(&mut self) -> Vec<String> {
        while let Some((_, mut child)) = self.children.pop() {
            crate::terminate(&mut child).await;
        }
        let dir = self.dir.clone();
        let pools = std::mem::take(&mut self.pool_fs);
        tokio::task::spawn_blocking(move || {
            let undone = crate::netns::cleanup(&dir);
            drop(pools);
            undone
        })
        .await
        .unwrap_or_default()
    }

    /// Forgets the children without stopping them, as a killed harness would: only the
    /// record in the run directory knows them then (for the crash-cleanup test).
    pub fn abandon(mut self) {
        for (_, c) in self.children.drain(..) {
            // Dropping a tokio Child with kill_on_drop kills it: leak the handle instead.
            std::mem::forget(c);
        }
        // The pools stay mounted under the abandoned processes (the record's cleanup finds
        // the mounts under the run directory).
        std::mem::forget(std::mem::take(&mut self.pool_fs));
    }
}

/// When `node`'s Lease was last renewed (or acquired).
pub async fn lease_renewed(
    leases: &Api<Lease>,
    node: &str,
) -> Option<k8s_openapi::jiff::Timestamp> {
    leases.get_opt(node).await.ok().flatten().and_then(|l| {
        let s = l.spec?;
        s.renew_time.or(s.acquire_time).map(|t| t.0)
    })
}

/// The body of `GET http://addr/path` when it answers 200.
pub async fn http_get(addr: &str, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_string())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_string()))
}
