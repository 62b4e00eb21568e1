//! The controller process minus argument parsing: optional leader election around the
//! reconcile runtime.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use kube::Client;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::clock::Clock;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::http::Health;
use crate::leader::{LeaderElector, Renewed};
use crate::metasync::MetaSync;
use crate::metrics::Metrics;
use crate::plugin::Plugin;
use crate::reconcile::{self, Context};

/// How to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Validated configuration.
    pub config: Config,
    /// Namespace of LiteIO's objects, the pools' Leases and the leader Lease.
    pub namespace: String,
    /// Take part in leader election (otherwise reconcile at once).
    pub leader_elect: bool,
    /// Identity in the leader Lease.
    pub identity: String,
    /// Probe state shared with the HTTP server.
    pub health: Health,
    /// Metrics shared with the HTTP server.
    pub metrics: Metrics,
    /// Liveness clock (the system clock when `None`).
    pub clock: Option<Arc<dyn Clock>>,
}

/// Builds the plug-ins the config asks for (MetaSync when `metaSync` is set; its
/// `passwordSecret` is read from `namespace` through `client`).
pub fn plugins(config: &Config, client: &Client, namespace: &str) -> Result<Vec<Arc<dyn Plugin>>> {
    let mut v: Vec<Arc<dyn Plugin>> = Vec::new();
    if let Some(m) = &config.meta_sync {
        let sync = MetaSync::open_in(m, client, namespace)?;
        info!(backend = sync.backend_name(), "metadata sync enabled");
        v.push(Arc::new(sync));
    }
    Ok(v)
}

/// Runs until `shutdown` turns true (`Ok`; a leader stops reconciling, then releases the
/// Lease). With leader election, a leader that could not renew within `renewDeadline` stops
/// every reconciler at once (before its Lease can expire for the others) and goes back to
/// waiting for the Lease. `on_context` sees the reconcile context the first time this
/// instance starts reconciling (tests inspect the state through it).
pub async fn run(
    client: Client,
    opts: Options,
    plugins: Vec<Arc<dyn Plugin>>,
    mut shutdown: watch::Receiver<bool>,
    mut on_context: Option<tokio::sync::oneshot::Sender<Arc<Context>>>,
) -> Result<()> {
    let elector = opts.leader_elect.then(|| {
        LeaderElector::new(
            client.clone(),
            &opts.namespace,
            &opts.identity,
            opts.config.leader_election.clone(),
        )
    });
    opts.health.ready.store(elector.is_some(), Ordering::SeqCst);
    loop {
        let since = match &elector {
            Some(e) => match e.acquire(&mut shutdown).await {
                Some(r) => Some(r),
                None => return Ok(()),
            },
            None => None,
        };
        let result = lead(
            &client,
            &opts,
            &plugins,
            &mut shutdown,
            &mut on_context,
            elector.as_ref().zip(since),
        )
        .await;
        match result {
            Err(e @ Error::LeadershipLost { .. }) => {
                warn!(error = %e, "stopped reconciling; waiting for the Lease again");
                opts.health.ready.store(true, Ordering::SeqCst);
            }
            other => {
                info!(ok = other.is_ok(), "controller stopped");
                return other;
            }
        }
    }
}

/// One term as leader (or the whole run without leader election): reconciles until
/// `shutdown` or until leadership is lost; then stops the reconcilers (at once when
/// leadership was lost, within what is left of the claim otherwise) and, after a clean stop,
/// releases the Lease.
async fn lead(
    client: &Client,
    opts: &Options,
    plugins: &[Arc<dyn Plugin>],
    shutdown: &mut watch::Receiver<bool>,
    on_context: &mut Option<tokio::sync::oneshot::Sender<Arc<Context>>>,
    elector: Option<(&LeaderElector, Renewed)>,
) -> Result<()> {
    opts.health.leader.store(true, Ordering::SeqCst);
    opts.metrics.leader.set(1);
    let ctx = Context::new(
        client.clone(),
        &opts.namespace,
        opts.config.clone(),
        opts.clock.clone(),
        plugins.to_vec(),
        opts.metrics.clone(),
    );
    if let Some(tx) = on_context.take() {
        let _ = tx.send(Arc::clone(&ctx));
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut runtime = tokio::spawn(reconcile::run(Arc::clone(&ctx), stop_rx));
    let ready = {
        let ctx = Arc::clone(&ctx);
        let health = opts.health.clone();
        tokio::spawn(async move {
            let mut synced = ctx.synced_receiver();
            while !*synced.borrow() {
                if synced.changed().await.is_err() {
                    return;
                }
            }
            health.ready.store(true, Ordering::SeqCst);
            info!("caches synced; reconciling");
        })
    };
    let result = match elector {
        Some((e, since)) => e.hold(since, shutdown).await,
        None => {
            while !*shutdown.borrow() {
                if shutdown.changed().await.is_err() {
                    break;
                }
            }
            Ok(since_now())
        }
    };
    stop_tx.send_replace(true);
    ready.abort();
    match &result {
        Ok(last) => {
            // A clean stop: running reconciles may finish while the claim still holds.
            let renew_deadline = opts.config.leader_election.renew_deadline;
            let grace = match elector {
                Some(_) => (last.sent + renew_deadline).saturating_duration_since(Instant::now()),
                None => renew_deadline,
            };
            if tokio::time::timeout(grace, &mut runtime).await.is_err() {
                warn!(?grace, "reconcilers did not stop in time; aborting them");
                runtime.abort();
                let _ = runtime.await;
            }
        }
        Err(_) => {
            // Leadership is lost: not one more write, whatever a reconciler was doing.
            runtime.abort();
            let _ = runtime.await;
        }
    }
    ctx.stop_background().await;
    opts.health.leader.store(false, Ordering::SeqCst);
    opts.metrics.leader.set(0);
    opts.metrics.forget_cluster();
    // Only now that nothing reconciles any more may a standby start: a clean stop (rolling
    // update) hands over at once instead of after `leaseDuration`.
    if let (Some((e, _)), Ok(_)) = (elector, &result) {
        e.release().await;
    }
    result.map(|_| ())
}

fn since_now() -> Renewed {
    Renewed {
        sent: Instant::now(),
    }
}
