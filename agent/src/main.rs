//! `disk-agent`: the LiteIO storage-node agent.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use liteio_agent::agent::{Agent, AgentOptions, engine_from_config};
use liteio_agent::config::Config;
#[cfg(not(feature = "spdk"))]
use liteio_agent::exporter::NoExporter;

/// Exit code for a bad command line or config file.
const EXIT_CONFIG: u8 = 2;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

/// LiteIO disk-agent: pools this node's disks and serves volumes over NVMe/TCP.
///
/// `disk-agent --build-features` (alone) prints the optional features it was built with
/// (`spdk`: the embedded SPDK engine and NVMe-oF target) and exits.
#[derive(Parser, Debug)]
#[command(name = "disk-agent", version)]
struct Args {
    /// Agent config file (LiteIO's agent-config.yaml schema). Absent: LiteIO's default, an
    /// existing LVM volume group `antstore-vg`.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Name of this node (the StoragePool and Lease name).
    #[arg(long, env = "NODE_ID")]
    node_id: String,
    /// Kubeconfig file; default: in-cluster config, then $KUBECONFIG / ~/.kube/config.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig of this node's own identity (the kubelet's, `system:node:<node>`; with
    /// kubeadm /etc/kubernetes/kubelet.conf), used only to get, patch and delete the
    /// volumes' key Secrets. The controller grants that identity exactly the Secrets of the
    /// volumes stored on this node, so one node cannot read another's keys, which the
    /// DaemonSet's shared ServiceAccount could not ensure. Absent: the agent's own client
    /// (whose ServiceAccount then needs get, patch and delete on Secrets).
    #[arg(long, value_name = "PATH")]
    keys_kubeconfig: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Where the node's NVMe host NQN is read (generated there when missing).
    #[arg(long, default_value = liteio_agent::pool::DEFAULT_HOST_NQN_PATH)]
    host_nqn_file: PathBuf,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Json => b.json().init(),
        LogFormat::Text => b.init(),
    }
}

fn load_config(path: Option<&PathBuf>) -> anyhow::Result<Config> {
    match path {
        Some(p) => Ok(Config::load(p)?),
        None => Ok(Config::from_yaml(
            "storage: {pooling: {name: antstore-vg, mode: KernelLVM}}",
        )?),
    }
}

async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
    match kubeconfig {
        Some(p) => client_from(p).await,
        None => {
            let config = kube::Config::infer()
                .await
                .context("cannot find a Kubernetes configuration")?;
            kube::Client::try_from(config).context("cannot build the Kubernetes client")
        }
    }
}

async fn client_from(p: &PathBuf) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(p)
        .with_context(|| format!("cannot read kubeconfig {}", p.display()))?;
    client_of(kc, p).await
}

/// The client of the kubeconfig `kc`, read from `p`.
async fn client_of(kc: kube::config::Kubeconfig, p: &Path) -> anyhow::Result<kube::Client> {
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .with_context(|| format!("cannot use kubeconfig {}", p.display()))?;
    kube::Client::try_from(config).context("cannot build the Kubernetes client")
}

async fn wait_for_signal() -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

/// The embedded SPDK target, its engine (SpdkLVStore pools) and exporter.
#[cfg(feature = "spdk")]
async fn start_spdk(
    config: &Config,
) -> anyhow::Result<(
    liteio_agent::spdk::Spdk,
    Option<Arc<dyn liteio_agent::engine::PoolEngine>>,
    Arc<dyn liteio_agent::exporter::Exporter>,
)> {
    use liteio_agent::spdk::setup;
    let cfg = config.clone();
    tracing::info!(core_mask = %cfg.spdk.core_mask, interrupt = cfg.spdk.interrupt_mode, "starting SPDK");
    let spdk = tokio::task::spawn_blocking(move || setup::start(&cfg))
        .await
        .context("the SPDK start task failed")?
        .context("cannot start SPDK")?;
    let engine = setup::engine(config).context("bad SPDK pool configuration")?;
    let address = config
        .nvmf
        .listen_address
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    let exporter = setup::exporter(config, address).context("bad nvmf configuration")?;
    Ok((spdk, engine, Arc::new(exporter)))
}

async fn run(
    args: Args,
    config: Config,
    keys_kubeconfig: Option<kube::config::Kubeconfig>,
) -> anyhow::Result<()> {
    // SPDK backs an SpdkLVStore pool and exports volumes of every engine. When it cannot
    // start (no hugepages, say) an LVM or file pool still serves local volumes: remote
    // volumes then get a clear "no NVMe-oF target" message instead of the agent exiting.
    #[cfg(feature = "spdk")]
    let (spdk, engine, exporter): (_, _, Arc<dyn liteio_agent::exporter::Exporter>) =
        match start_spdk(&config).await {
            Ok((spdk, engine, exporter)) => {
                let engine = match engine {
                    Some(e) => e,
                    None => engine_from_config(&config)?,
                };
                (Some(spdk), engine, exporter)
            }
            Err(e)
                if config.storage.pooling.mode
                    != liteio_agent::config::PoolingMode::SpdkLvStore =>
            {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "SPDK did not start; serving local volumes only (no NVMe-oF exports)"
                );
                (
                    None,
                    engine_from_config(&config)?,
                    Arc::new(liteio_agent::exporter::NoExporter),
                )
            }
            Err(e) => return Err(e),
        };
    #[cfg(not(feature = "spdk"))]
    let (engine, exporter): (_, Arc<dyn liteio_agent::exporter::Exporter>) =
        (engine_from_config(&config)?, Arc::new(NoExporter));
    let served = serve(&args, config, keys_kubeconfig, engine, exporter, {
        #[cfg(feature = "spdk")]
        {
            spdk.is_some()
        }
        #[cfg(not(feature = "spdk"))]
        {
            false
        }
    })
    .await;
    // Last, also when serving failed: SPDK removes listeners and subsystems, unloads
    // lvstores cleanly and stops its reactors, off the async threads (bounded by
    // liteio_spdk::runtime::STOP_TIMEOUT).
    #[cfg(feature = "spdk")]
    if let Some(spdk) = spdk {
        let t = std::time::Instant::now();
        tokio::task::spawn_blocking(move || spdk.stop())
            .await
            .context("the SPDK stop task failed")?;
        tracing::info!(took_ms = t.elapsed().as_secs_f64() * 1e3, "SPDK stopped");
        // Deprecated SPDK features this run used (SPDK 26.05 still makes some itself): they
        // go in the next SPDK release, so say which, once, in our own log.
        for d in liteio_agent::spdk::deprecation::deprecation_hits() {
            tracing::warn!(
                tag = %d.tag,
                hits = d.hits,
                remove_release = %d.remove_release,
                "SPDK deprecation hit: {}",
                d.description
            );
        }
    }
    served
}

/// Runs the agent until a signal, then shuts it down.
async fn serve(
    args: &Args,
    config: Config,
    keys_kubeconfig: Option<kube::config::Kubeconfig>,
    engine: Arc<dyn liteio_agent::engine::PoolEngine>,
    exporter: Arc<dyn liteio_agent::exporter::Exporter>,
    spdk_running: bool,
) -> anyhow::Result<()> {
    let client = client(args.kubeconfig.as_ref()).await?;
    let mut opts = AgentOptions::from_config(args.node_id.clone(), config);
    opts.host_nqn_path = args.host_nqn_file.clone();
    if let (Some(p), Some(kc)) = (&args.keys_kubeconfig, keys_kubeconfig) {
        // Given but unusable is fatal: falling back to the agent's own identity would hide a
        // broken deployment until the first export.
        let keys = client_of(kc, p)
            .await
            .with_context(|| format!("--keys-kubeconfig {}", p.display()))?;
        opts.keys_client = Some(liteio_agent::agent::NodeIdentity(keys));
    }
    let agent = Agent::start(client, engine, exporter, opts)
        .await
        .context("cannot start the agent")?;
    #[cfg(feature = "spdk")]
    if spdk_running {
        agent
            .ctx()
            .metrics
            .add_source(Arc::new(liteio_agent::spdk::stats::RuntimeSource));
        // A request that gets stuck (or answers late) changes the pool's Spdk condition:
        // have the pool reporter look again at once.
        let changed = Arc::clone(&agent.ctx().pool_changed);
        liteio_agent::spdk::runtime::set_stuck_observer(move || changed.notify_one());
    }
    #[cfg(not(feature = "spdk"))]
    let _ = spdk_running;
    let sig = wait_for_signal().await?;
    tracing::info!(signal = sig, "shutting down");
    let t = std::time::Instant::now();
    agent.shutdown(Duration::from_secs(15)).await;
    tracing::info!(
        took_ms = t.elapsed().as_secs_f64() * 1e3,
        "reconcilers stopped"
    );
    Ok(())
}

/// The optional features this binary was built with, one per line (`spdk`): what
/// `disk-agent --build-features` prints, for tools that pick an engine (liteio-local).
const BUILD_FEATURES: &[&str] = &[
    #[cfg(feature = "spdk")]
    "spdk",
];

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("--build-features") {
        for f in BUILD_FEATURES {
            println!("{f}");
        }
        return ExitCode::SUCCESS;
    }
    let args = Args::parse();
    init_logging(args.log_format);
    // `liteio_panics_total` counts from here on.
    liteio_node::panics::install();
    let config = match load_config(args.config.as_ref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("disk-agent: bad configuration: {e:#}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    // Crash-recovery tests only; unset in production (see liteio_agent::crash).
    match liteio_agent::crash::CrashSpec::from_env() {
        Ok(Some(spec)) => {
            tracing::warn!(point = %spec.point, volume = ?spec.volume, "crash point armed: this process kills itself with SIGKILL when it gets there");
            liteio_agent::crash::arm(spec);
        }
        Ok(None) => {}
        Err(e) => {
            eprintln!("disk-agent: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    }
    if args.node_id.trim().is_empty() {
        eprintln!("disk-agent: --node-id (or NODE_ID) must not be empty");
        return ExitCode::from(EXIT_CONFIG);
    }
    // Before any engine starts: a node identity that cannot be read is a deployment error.
    let keys_kubeconfig = match args
        .keys_kubeconfig
        .as_ref()
        .map(|p| (p, kube::config::Kubeconfig::read_from(p)))
    {
        None => None,
        Some((_, Ok(kc))) => Some(kc),
        Some((p, Err(e))) => {
            eprintln!(
                "disk-agent: --keys-kubeconfig {}: cannot read this node's kubeconfig: {e}",
                p.display()
            );
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let spdk_pool = config.storage.pooling.mode == liteio_agent::config::PoolingMode::SpdkLvStore;
    if let Err(e) = engine_from_config(&config).map(|_| ()).or_else(|e| {
        if cfg!(feature = "spdk") && spdk_pool {
            Ok(())
        } else {
            Err(e)
        }
    }) {
        eprintln!("disk-agent: bad configuration: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("disk-agent: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args, config, keys_kubeconfig)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "disk-agent failed");
            eprintln!("disk-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}
