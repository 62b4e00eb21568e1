//! `node-disk-controller`: LiteIO's central controller.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use kube::config::{KubeConfigOptions, Kubeconfig};
use liteio_controller::http::Health;
use liteio_controller::metrics::Metrics;
use liteio_controller::{Config, run};
use tokio::sync::watch;
use tracing::{info, warn};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

/// LiteIO node-disk-controller: schedules volumes to storage pools, tracks pool liveness,
/// drives snapshots and mirrors metadata to SQL.
#[derive(Debug, Parser)]
#[command(name = "node-disk-controller", version)]
struct Args {
    /// Kubeconfig file; in-cluster config or $KUBECONFIG when absent.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Controller config file (LiteIO schema); defaults apply when the default path is absent.
    #[arg(long, default_value = "/controller-config.yaml")]
    config: PathBuf,
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:9090")]
    metrics_addr: SocketAddr,
    /// Take part in leader election through a Lease.
    #[arg(long)]
    leader_elect: bool,
    /// Namespace of LiteIO's objects and Leases.
    #[arg(long, default_value = liteio_api::keys::DEFAULT_NAMESPACE)]
    namespace: String,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Identity in the leader Lease (defaults to $POD_NAME, else the hostname).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Json => b.json().init(),
        LogFormat::Text => b.init(),
    }
}

fn load_config(path: &PathBuf) -> anyhow::Result<Config> {
    let default = PathBuf::from("/controller-config.yaml");
    if !path.exists() && *path == default {
        warn!(path = %path.display(), "config file absent; using defaults");
        return Ok(Config::default());
    }
    Ok(Config::load(path)?)
}

async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(p) => {
            let kc = Kubeconfig::read_from(p)
                .with_context(|| format!("cannot read kubeconfig {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(config)?)
}

async fn signals(tx: watch::Sender<bool>) {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = term => info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => info!("SIGINT: stopping"),
    }
    tx.send_replace(true);
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_logs(args.log_format);
    // `liteio_panics_total` counts from here on.
    liteio_node::panics::install();
    let config = load_config(&args.config)?;
    let client = client(args.kubeconfig.as_ref()).await?;
    let metrics = Metrics::new().context("cannot register metrics")?;
    let health = Health::default();
    let (tx, rx) = watch::channel(false);
    tokio::spawn(signals(tx));
    let http = tokio::spawn(liteio_controller::http::serve(
        args.metrics_addr,
        health.clone(),
        metrics.clone(),
        rx.clone(),
        None,
    ));
    let identity = args.identity.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/etc/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| format!("node-disk-controller-{}", std::process::id()))
    });
    let plugins = run::plugins(&config, &client, &args.namespace)?;
    let opts = run::Options {
        config,
        namespace: args.namespace,
        leader_elect: args.leader_elect,
        identity,
        health,
        metrics,
        clock: None,
    };
    let result = run::run(client, opts, plugins, rx, None).await;
    http.abort();
    // A lost leadership is handled inside `run` (stop reconciling, wait for the Lease again).
    result.map_err(Into::into)
}
