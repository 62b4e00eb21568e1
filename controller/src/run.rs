//! The controller process minus argument parsing: optional leader election around the
//! reconcile runtime.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use kube::Client;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::clock::Clock;
use crate::config::Config;
use crate::error::Result;
use crate::http::Health;
use crate::leader::LeaderElector;
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

/// Builds the plug-ins the config asks for (MetaSync when `metaSync` is set).
pub fn plugins(config: &Config) -> Result<Vec<Arc<dyn Plugin>>> {
    let mut v: Vec<Arc<dyn Plugin>> = Vec::new();
    if let Some(m) = &config.meta_sync {
        let sync = MetaSync::open(m)?;
        info!(backend = sync.backend_name(), "metadata sync enabled");
        v.push(Arc::new(sync));
    }
    Ok(v)
}

/// Runs until `shutdown` turns true (`Ok`; a leader stops reconciling, then releases the
/// Lease) or leadership is lost (`LeadershipLost`; the process should exit and be restarted
/// as a standby). `on_context` sees the reconcile
/// context once this instance starts reconciling (tests inspect the state through it).
pub async fn run(
    client: Client,
    opts: Options,
    plugins: Vec<Arc<dyn Plugin>>,
    mut shutdown: watch::Receiver<bool>,
    on_context: Option<tokio::sync::oneshot::Sender<Arc<Context>>>,
) -> Result<()> {
    let elector = opts.leader_elect.then(|| {
        LeaderElector::new(
            client.clone(),
            &opts.namespace,
            &opts.identity,
            opts.config.leader_election.clone(),
        )
    });
    if let Some(e) = &elector {
        opts.health.ready.store(true, Ordering::SeqCst);
        if !e.acquire(&mut shutdown).await {
            return Ok(());
        }
    }
    opts.health.leader.store(true, Ordering::SeqCst);
    opts.metrics.leader.set(1);
    let ctx = Context::new(
        client,
        &opts.namespace,
        opts.config.clone(),
        opts.clock.clone(),
        plugins,
        opts.metrics.clone(),
    );
    if let Some(tx) = on_context {
        let _ = tx.send(Arc::clone(&ctx));
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let runtime = tokio::spawn(reconcile::run(Arc::clone(&ctx), stop_rx));
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
    let result = match &elector {
        Some(e) => e.hold(&mut shutdown).await,
        None => {
            while !*shutdown.borrow() {
                if shutdown.changed().await.is_err() {
                    break;
                }
            }
            Ok(())
        }
    };
    stop_tx.send_replace(true);
    ready.abort();
    let mut runtime = runtime;
    let grace = elector
        .as_ref()
        .map_or(opts.config.leader_election.renew_deadline, |e| {
            e.renew_deadline()
        });
    if tokio::time::timeout(grace, &mut runtime).await.is_err() {
        warn!(?grace, "reconcilers did not stop in time; aborting them");
        runtime.abort();
        let _ = runtime.await;
    }
    opts.health.leader.store(false, Ordering::SeqCst);
    opts.metrics.leader.set(0);
    // Only now that nothing reconciles any more may a standby start: a clean stop (rolling
    // update) hands over at once instead of after `leaseDuration`.
    if let (Some(e), Ok(())) = (&elector, &result) {
        e.release().await;
    }
    info!(ok = result.is_ok(), "controller stopped");
    result
}
