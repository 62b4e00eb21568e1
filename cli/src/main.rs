//! `kubectl-liteio`: inspect LiteIO pools, volumes and snapshots; lock and unlock pools.
//! Run as `kubectl liteio …` once the binary is on `PATH`.
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;
use liteio_cli::{Cli, client, run};

fn init_logging() {
    // Quiet by default: the output is the product. RUST_LOG=debug shows the requests.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn main_async(cli: Cli) -> anyhow::Result<String> {
    if liteio_cli::needs_no_client(&cli) {
        return Ok(liteio_cli::top(&cli, None).await?);
    }
    let client = client(cli.kubeconfig.as_deref()).await?;
    Ok(run(&cli, &client).await?)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(main_async(cli)) {
        Ok(text) => {
            let mut out = std::io::stdout().lock();
            // A closed pipe (`| head`) is not an error worth reporting.
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
