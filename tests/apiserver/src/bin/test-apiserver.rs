//! `test-apiserver`: runs LiteIO's test Kubernetes API server until SIGINT/SIGTERM.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use liteio_test_apiserver::{Options, TestApiServer};

/// An in-process Kubernetes API server for local use and tests (plain HTTP on a loopback address,
/// 127.0.0.1 by default).
///
/// It serves LiteIO's CRDs (group volume.antstor.alipay.com) and the core kinds LiteIO
/// touches, and keeps everything in memory: it forgets it on exit unless `--state-file` is
/// given. Point kubectl at it with `kubectl --kubeconfig <PATH> get storagepools`.
#[derive(Debug, Parser)]
#[command(name = "test-apiserver", version)]
struct Args {
    /// Address to listen on; only loopback addresses (127.0.0.0/8) are accepted. Another
    /// one than 127.0.0.1 (a bridge's 127.10.x.1) serves other network namespaces.
    #[arg(long, default_value = "127.0.0.1")]
    address: std::net::Ipv4Addr,
    /// Port to listen on; 0 picks a free port.
    #[arg(long, default_value_t = 0, env = "LITEIO_TEST_APISERVER_PORT")]
    port: u16,
    /// Write a kubeconfig for this server to PATH (context `liteio-test`).
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// Events retained for watch resumption; older resourceVersions get 410 Gone.
    #[arg(long, default_value_t = 10_000)]
    event_window: usize,
    /// Seconds between BOOKMARK events on watches that allow them.
    #[arg(long, default_value_t = 10)]
    bookmark_seconds: u64,
    /// Do not install LiteIO's CRDs at start-up.
    #[arg(long)]
    no_crds: bool,
    /// Keep every object in FILE, so that a restarted server (even after kill -9) serves
    /// what the last one held, like kube-apiserver over etcd. Without it, state is lost on
    /// exit. Watches from before a restart get 410 Gone and list again.
    #[arg(long, value_name = "FILE")]
    state_file: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let server = TestApiServer::start_with(Options {
        address: args.address,
        port: args.port,
        event_window: args.event_window,
        bookmark_interval: Duration::from_secs(args.bookmark_seconds.max(1)),
        install_crds: !args.no_crds,
        state_file: args.state_file.clone(),
    })
    .await
    .context("starting the test API server")?;
    if let Some(path) = &args.kubeconfig {
        server
            .write_kubeconfig(path)
            .with_context(|| format!("writing {}", path.display()))?;
        tracing::info!(kubeconfig = %path.display(), "kubeconfig written");
    }
    println!("{}", server.url());

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT")?,
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    server.shutdown().await;
    Ok(())
}
