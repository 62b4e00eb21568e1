//! `csi-driver`: LiteIO's CSI plug-in (`antstor.csi.alipay.com`) serving the Identity service
//! plus the Controller and/or Node services on a unix socket.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use liteio_csi::DriverConfig;
use liteio_csi::cmd::SystemRunner;
use liteio_csi::controller::ControllerService;
use liteio_csi::identity::IdentityService;
use liteio_csi::metrics::{self, VolumeMetrics};
use liteio_csi::migration;
use liteio_csi::node::NodeService;
use liteio_csi::nvme::FabricsDevice;
use liteio_csi::server::{self, Services};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Controller,
    Node,
    Both,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

/// LiteIO CSI driver (antstor.csi.alipay.com).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// gRPC endpoint, `unix:///path/csi.sock`; a stale socket file is removed.
    #[arg(long, default_value = "unix:///csi/csi.sock")]
    endpoint: String,
    /// This node's name.
    #[arg(long, env = "NODE_ID", required_unless_present = "host_capabilities")]
    node_id: Option<String>,
    /// Print what this host's kernel can do for NVMe-oF connections (kernel release,
    /// DH-HMAC-CHAP, TLS, and how it was found) as JSON, and exit. The node plugin finds the
    /// same at start.
    #[arg(long)]
    host_capabilities: bool,
    /// Which services to serve besides Identity.
    #[arg(long, value_enum, default_value = "both")]
    mode: Mode,
    /// Kubeconfig to use; in-cluster configuration (or $KUBECONFIG) when absent.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Namespace of LiteIO's objects.
    #[arg(long, default_value = liteio_api::keys::DEFAULT_NAMESPACE)]
    namespace: String,
    /// Seconds CreateVolume waits for the volume to be scheduled.
    #[arg(long, default_value_t = 30)]
    schedule_timeout: u64,
    /// Seconds NodeStageVolume waits for the volume to be ready (a permanent failure of the
    /// volume answers at once).
    #[arg(long, default_value_t = 30)]
    ready_timeout: u64,
    /// Seconds CreateSnapshot waits for the snapshot to be cut before it answers
    /// ready_to_use=false (the CO polls again; a permanent failure answers at once).
    #[arg(long, default_value_t = 5)]
    snapshot_wait: u64,
    /// Seconds NodeStageVolume waits for the NVMe namespace after connecting.
    #[arg(long, default_value_t = 20)]
    device_timeout: u64,
    /// Maximum volumes per node reported by NodeGetInfo.
    #[arg(long, default_value_t = 20)]
    max_volumes: i64,
    /// Address for Prometheus metrics (`0.0.0.0:9819`); none when absent. In node mode the
    /// published volumes' usage, in both modes authentication refusals and panics.
    #[arg(long)]
    metrics_addr: Option<SocketAddr>,
    /// This node's NVMe host NQN file.
    #[arg(long, default_value = "/etc/nvme/hostnqn")]
    hostnqn_file: PathBuf,
    /// Root of sysfs (tests).
    #[arg(long, default_value = "/sys", hide = true)]
    sysfs_root: PathBuf,
    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

async fn client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client> {
    let config = match kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .with_context(|| format!("reading kubeconfig {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", p.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("inferring the Kubernetes configuration")?,
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
    tracing::info!("shutting down");
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    match args.log_format {
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init(),
        LogFormat::Text => tracing_subscriber::fmt().with_env_filter(filter).init(),
    }
    // `liteio_panics_total` counts from here on.
    liteio_node::panics::install();
    if args.host_capabilities {
        let _ = std::process::Command::new("modprobe")
            .arg("nvme-fabrics")
            .status();
        println!(
            "{}",
            serde_json::to_string_pretty(&liteio_csi::nvme::this_host_capabilities())?
        );
        return Ok(());
    }
    let node_id = args.node_id.clone().unwrap_or_default();
    let mut cfg = DriverConfig::new(node_id.clone());
    cfg.namespace = args.namespace.clone();
    cfg.schedule_timeout = Duration::from_secs(args.schedule_timeout);
    cfg.ready_timeout = Duration::from_secs(args.ready_timeout);
    cfg.snapshot_wait = Duration::from_secs(args.snapshot_wait);
    cfg.device_timeout = Duration::from_secs(args.device_timeout);
    cfg.max_volumes_per_node = args.max_volumes;
    cfg.sysfs_root = args.sysfs_root.clone();
    cfg.hostnqn_path = args.hostnqn_file.clone();
    let cfg = Arc::new(cfg);
    let client = client(args.kubeconfig.as_ref()).await?;
    let controller = matches!(args.mode, Mode::Controller | Mode::Both);
    let node = matches!(args.mode, Mode::Node | Mode::Both);
    let metrics = if args.metrics_addr.is_some() {
        Some(Arc::new(VolumeMetrics::new(&node_id)?))
    } else {
        None
    };
    if let (Some(addr), Some(m)) = (args.metrics_addr, metrics.clone()) {
        tokio::spawn(async move {
            if let Err(e) = metrics::serve(addr, m).await {
                tracing::error!(error = %e.chain(), "metrics server stopped");
            }
        });
    }
    let node_service = if node {
        let svc = NodeService::new(
            client.clone(),
            Arc::clone(&cfg),
            Arc::new(SystemRunner::new()),
            metrics.clone(),
        );
        // What this kernel can do goes onto the Node (for the agents' host-auth decisions).
        svc.publish_capabilities().await;
        Some(svc)
    } else {
        None
    };
    let services = Services {
        identity: IdentityService::new(cfg.version.clone()),
        controller: controller.then(|| ControllerService::new(client.clone(), Arc::clone(&cfg))),
        node: node_service,
    };
    let listener = server::bind(&args.endpoint)?;
    // One shutdown for the gRPC server and, in node mode, the watch over this node's
    // VolumeMigrations (the host's part of a hot migration). A server that stops on an error
    // drops the sender, which stops the watch too.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let migrations = node.then(|| {
        let fabrics = Arc::new(FabricsDevice::new(cfg.fabrics_dev.clone()));
        let ctx = migration::Ctx::new(client.clone(), Arc::clone(&cfg), fabrics);
        let mut stop_rx = stop_rx.clone();
        tokio::spawn(migration::run(ctx, async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        }))
    });
    tracing::info!(endpoint = %args.endpoint, node = %node_id, mode = ?args.mode, "CSI driver serving");
    let served = server::serve(listener, services, async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    })
    .await;
    if let Some(task) = migrations
        && let Err(e) = task.await
    {
        tracing::error!(error = %e, "the VolumeMigration watch failed");
    }
    served?;
    Ok(())
}
