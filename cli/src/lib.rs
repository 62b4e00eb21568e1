//! `kubectl-liteio`: a kubectl plugin that shows LiteIO's storage pools, volumes and snapshots
//! the way an operator thinks of them (capacity, placement, export, heartbeat) and locks pools
//! out of scheduling.
//!
//! The library holds everything but process set-up, so tests drive [`run`] with a client of
//! the test API server. Every list is read with one request per kind; nothing is cached.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod args;
pub mod commands;
pub mod error;
pub mod table;
pub mod top;
pub mod view;

use std::path::Path;

use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use args::{Cli, Command, DescribeTarget, OutputFormat, PoolTarget};
pub use error::{CliError, ErrorKind};

/// Builds a client from `kubeconfig`, or from the usual places when it is `None`
/// (`$KUBECONFIG`, `~/.kube/config`, the in-cluster service account).
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, CliError> {
    let config = match kubeconfig {
        Some(path) => {
            let bad = |message: String| CliError::Kubeconfig {
                path: path.to_path_buf(),
                message,
            };
            let kc = Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| bad(e.to_string()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| CliError::NoConfig(e.to_string()))?,
    };
    Client::try_from(config).map_err(|e| CliError::Api {
        action: "build the Kubernetes client".into(),
        message: e.to_string(),
    })
}

/// Runs the command of `cli` against `client` and returns what to print on stdout.
pub async fn run(cli: &Cli, client: &Client) -> Result<String, CliError> {
    run_at(cli, client, Timestamp::now()).await
}

/// [`run`] with a fixed clock for ages.
pub async fn run_at(cli: &Cli, client: &Client, now: Timestamp) -> Result<String, CliError> {
    let ns = cli.namespace.as_str();
    let fmt = cli.output;
    match &cli.command {
        Command::Pools => commands::pools(client, ns, fmt, now).await,
        Command::Volumes => commands::volumes(client, ns, fmt).await,
        Command::Snapshots => commands::snapshots(client, ns, fmt).await,
        Command::Migrations => commands::migrations(client, ns, fmt, now).await,
        Command::Migrate { volume, to } => {
            commands::migrate(client, ns, volume, to.as_deref(), fmt, now).await
        }
        Command::Describe {
            target: DescribeTarget::Volume { name },
        } => commands::describe_volume(client, ns, name, fmt, now).await,
        Command::Describe {
            target: DescribeTarget::Pool { name },
        } => commands::describe_pool(client, ns, name, fmt, now).await,
        Command::Lock {
            target: PoolTarget::Pool { name },
        } => commands::set_lock(client, ns, name, true, fmt).await,
        Command::Unlock {
            target: PoolTarget::Pool { name },
        } => commands::set_lock(client, ns, name, false, fmt).await,
        Command::Qos {
            volume,
            iops,
            mbps,
            read_mbps,
            write_mbps,
        } => {
            let change = commands::QosChange {
                iops: *iops,
                mbps: *mbps,
                read_mbps: *read_mbps,
                write_mbps: *write_mbps,
            };
            commands::qos(client, ns, volume, change, fmt).await
        }
        Command::RotateKeys { volume, node } => {
            commands::rotate_keys(client, ns, volume.as_deref(), node.as_deref(), fmt, now).await
        }
        Command::Top { .. } => top(cli, Some(client)).await,
    }
}

/// True when `cli` is a `top` that names its agents (`--metrics-url`): it needs no
/// Kubernetes client.
pub fn needs_no_client(cli: &Cli) -> bool {
    matches!(&cli.command, Command::Top { metrics_urls, .. } if !metrics_urls.is_empty())
}

/// `top`: with `--once` the frame to print; otherwise the live view, drawn until `q` or
/// Ctrl-C, and nothing to print. `client` finds the agents through the StoragePools when
/// no `--metrics-url` is given (and must then be `Some`).
pub async fn top(cli: &Cli, client: Option<&Client>) -> Result<String, CliError> {
    let Command::Top {
        interval,
        once,
        metrics_urls,
        metrics_port,
        limit,
    } = &cli.command
    else {
        return Err(CliError::Refused("not a top command".into()));
    };
    let urls = if metrics_urls.is_empty() {
        let client = client.ok_or_else(|| {
            CliError::NoConfig(
                "top without --metrics-url finds the agents through the StoragePools".into(),
            )
        })?;
        commands::agent_metrics_urls(client, &cli.namespace, *metrics_port).await?
    } else {
        metrics_urls.clone()
    };
    let interval = std::time::Duration::from_secs(*interval);
    if *once {
        let frame = top::screen::once(&urls, interval).await;
        if !urls.is_empty() && frame.unreachable.len() == urls.len() {
            return Err(CliError::NoMetrics(
                frame
                    .unreachable
                    .iter()
                    .map(|u| format!("{}: {}", u.url, u.error))
                    .collect::<Vec<_>>()
                    .join("; "),
            ));
        }
        return match cli.output {
            OutputFormat::Table => Ok(top::render(
                &frame,
                &format!(
                    "kubectl liteio top · {} agents · rates over {}s",
                    urls.len(),
                    interval.as_secs()
                ),
                *limit,
            )),
            f => commands::render(&frame, f),
        };
    }
    if cli.output != OutputFormat::Table {
        return Err(CliError::Refused(
            "top prints JSON or YAML only with --once (the live view is a table)".into(),
        ));
    }
    top::screen::live(&urls, interval, *limit).await;
    Ok(String::new())
}
