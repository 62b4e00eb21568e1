//! Wiring: start every task of the agent, stop them in order.
//!
//! [`Agent::start`] prepares the pool (`ensure_pool`), loads the host NQN, starts the metrics
//! server, and spawns a supervisor that registers the StoragePool (retrying until it
//! succeeds), runs one recovery scan, then runs the heartbeat, the pool reporter, the volume,
//! snapshot, data-control and migration syncs and the periodic orphan scan. [`Agent::shutdown`] stops the watches,
//! lets the pool reporter write a final status, and stops the heartbeat; nothing that holds
//! data is released (volumes, exports of the engine and the Lease stay as they are).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tracing::{info, warn};

use crate::config::{Config, PoolingMode};
use crate::context::Ctx;
use crate::engine::{
    CommandRunner, EngineError, FileEngine, LvmEngine, PoolEngine, PoolInfo, SystemRunner,
};
use crate::exporter::Exporter;
use crate::heartbeat::{Heartbeat, HeartbeatOptions, HeartbeatState};
use crate::metrics::{self, Metrics, MetricsError};
use crate::pool::{self, PoolOptions, PoolReporter};
use crate::recovery::Recovery;
use crate::sync;
use liteio_api::keys::labels;

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The pool engine configured cannot be built into this binary.
    #[error("storage.pooling.mode {mode} needs {needs}")]
    EngineUnavailable {
        /// Configured mode.
        mode: PoolingMode,
        /// What is missing.
        needs: &'static str,
    },
    /// The pool could not be created or loaded.
    #[error("cannot prepare pool {pool}")]
    Pool {
        /// Pool name.
        pool: String,
        /// The engine error.
        #[source]
        source: EngineError,
    },
    /// The pool preparation task did not complete.
    #[error("pool preparation of {pool} did not complete")]
    Join {
        /// Pool name.
        pool: String,
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
    },
    /// Metrics could not be set up.
    #[error("metrics")]
    Metrics(#[source] MetricsError),
    /// The node's host NQN could not be read or written.
    #[error("host NQN")]
    HostNqn(#[source] pool::HostNqnError),
    /// The export record's directory (`nvmf.exportRecordDir`) could not be created.
    #[error("nvmf.exportRecordDir {}: cannot create it or make it private", dir.display())]
    ExportRecord {
        /// The directory.
        dir: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl StartError {
    /// Bounded classification.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::EngineUnavailable { .. } => "engine_unavailable",
            Self::Pool { .. } | Self::Join { .. } => "pool",
            Self::Metrics(_) => "metrics",
            Self::HostNqn(_) => "host_nqn",
            Self::ExportRecord { .. } => "export_record",
        }
    }
}

/// Builds the configured engine (without SPDK: File and KernelLVM).
pub fn engine_from_config(cfg: &Config) -> Result<Arc<dyn PoolEngine>, StartError> {
    let st = &cfg.storage;
    let runner: Arc<dyn CommandRunner> = Arc::new(SystemRunner::with_timeout(cfg.timeouts.command));
    match st.pooling.mode {
        PoolingMode::File => {
            let Some(f) = &st.file else {
                // Config::validate refuses this; keep the message useful anyway.
                return Err(StartError::EngineUnavailable {
                    mode: PoolingMode::File,
                    needs: "storage.file.path",
                });
            };
            Ok(Arc::new(FileEngine::with_runner(
                &st.pooling.name,
                &f.path,
                f.size,
                runner,
            )))
        }
        PoolingMode::KernelLvm => Ok(Arc::new(LvmEngine::with_runner(
            &st.pooling.name,
            st.pvs.clone(),
            runner,
        ))),
        PoolingMode::SpdkLvStore => Err(StartError::EngineUnavailable {
            mode: PoolingMode::SpdkLvStore,
            needs: "the SPDK engine (build with --features spdk once it implements PoolEngine)",
        }),
    }
}

/// Everything the agent needs besides the client, engine and exporter.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// Node name.
    pub node: String,
    /// The config file's content.
    pub config: Config,
    /// Where the host NQN is read (and written when generated).
    pub host_nqn_path: PathBuf,
    /// Heartbeat timings.
    pub heartbeat: HeartbeatOptions,
    /// Safety-net resync of the pool status, settled objects and the orphan scan.
    pub resync: Duration,
    /// Requeue delay after a failed reconcile or write (doubling per further failure of one
    /// object, up to `retry_max`).
    pub retry: Duration,
    /// Longest requeue delay of an object that keeps failing.
    pub retry_max: Duration,
    /// Limit of one API request.
    pub request_timeout: Duration,
    /// Metrics address (`None` = no server); port 0 picks one.
    pub metrics_addr: Option<SocketAddr>,
    /// The client with which the volumes' key Secrets are read, patched and deleted: the
    /// node's own identity (`system:node:<node>`), which the controller grants exactly the
    /// Secrets of the volumes stored on this node. `None`: the agent's own client.
    pub keys_client: Option<NodeIdentity>,
}

/// A client that acts as the node itself (see [`AgentOptions::keys_client`]).
#[derive(Clone)]
pub struct NodeIdentity(pub Client);

impl std::fmt::Debug for NodeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeIdentity")
    }
}

impl AgentOptions {
    /// Production defaults from the config: resync 5 min, retry 1 s doubling to 5 min,
    /// API requests `timeouts.apiRequest`.
    pub fn from_config(node: impl Into<String>, config: Config) -> Self {
        Self {
            node: node.into(),
            heartbeat: HeartbeatOptions::from_config(&config.heartbeat),
            metrics_addr: config.metrics.listen_address,
            host_nqn_path: pool::default_host_nqn_path(),
            resync: Duration::from_secs(300),
            retry: Duration::from_secs(1),
            retry_max: Duration::from_secs(300),
            request_timeout: config.timeouts.api_request,
            keys_client: None,
            config,
        }
    }
}

/// A running agent.
#[derive(Debug)]
pub struct Agent {
    ctx: Arc<Ctx>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
    metrics_addr: Option<SocketAddr>,
    heartbeat: watch::Receiver<HeartbeatState>,
    pool: PoolInfo,
}

impl Agent {
    /// Prepares the pool and starts every task. Errors: the pool cannot be prepared or the
    /// metrics address cannot be bound. API failures do not fail the start: the supervisor
    /// retries them.
    pub async fn start(
        client: Client,
        engine: Arc<dyn PoolEngine>,
        exporter: Arc<dyn Exporter>,
        opts: AgentOptions,
    ) -> Result<Self, StartError> {
        let pool_name = opts.config.storage.pooling.name.clone();
        let e = Arc::clone(&engine);
        let pool = tokio::task::spawn_blocking(move || e.ensure_pool())
            .await
            .map_err(|source| StartError::Join {
                pool: pool_name.clone(),
                source,
            })?
            .map_err(|source| StartError::Pool {
                pool: pool_name.clone(),
                source,
            })?;
        info!(node = %opts.node, pool = %pool.name, kind = %engine.kind(), total = pool.total_bytes, free = pool.free_bytes, "pool ready");
        let record = match &opts.config.nvmf.export_record_dir {
            Some(dir) => Some(Arc::new(crate::record::ExportRecord::open(dir).map_err(
                |source| StartError::ExportRecord {
                    dir: dir.clone(),
                    source,
                },
            )?)),
            None => None,
        };
        let exporter: Arc<dyn Exporter> = match &record {
            Some(r) => Arc::new(crate::record::RecordingExporter::new(
                exporter,
                Arc::clone(r),
            )),
            None => exporter,
        };
        let metrics = Arc::new(
            Metrics::with_liteio_names(&opts.node, opts.config.metrics.liteio_compat_names)
                .map_err(StartError::Metrics)?,
        );
        metrics.add_source(Arc::new(metrics::EngineSource(Arc::clone(&engine))));
        let ctx = Arc::new(Ctx {
            warnings: crate::state::warnings::Warnings::new(client.clone(), &opts.node),
            keys_client: opts
                .keys_client
                .clone()
                .map_or_else(|| client.clone(), |n| n.0),
            client,
            node: opts.node.clone(),
            engine,
            exporter,
            record: record.clone(),
            metrics: Arc::clone(&metrics),
            pool_changed: Arc::new(Notify::new()),
            request_timeout: opts.request_timeout,
            resync: opts.resync,
            retry: opts.retry,
            retry_max: opts.retry_max,
            pool_epoch: watch::channel(0).0,
            pool_name,
            provisioning: Default::default(),
            own_writes: Default::default(),
            copy_failures: Default::default(),
            engine_slots: tokio::sync::Semaphore::new(crate::context::ENGINE_CALLS),
            capabilities: Default::default(),
        });
        let (shutdown, _) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let mut metrics_addr = None;
        if let Some(addr) = opts.metrics_addr {
            let (listener, local) = metrics::bind(addr).await.map_err(StartError::Metrics)?;
            info!(addr = %local, "serving /metrics, /healthz, /readyz");
            metrics_addr = Some(local);
            tasks.spawn(metrics::serve(listener, metrics, shutdown.subscribe()));
        }
        let host_nqn =
            pool::load_host_nqn(&opts.host_nqn_path, &opts.node).map_err(StartError::HostNqn)?;
        let reporter = Arc::new(PoolReporter::new(
            Arc::clone(&ctx),
            PoolOptions {
                config: opts.config.clone(),
                host_nqn,
                resync: opts.resync,
                retry: opts.retry,
            },
        ));
        let heartbeat = Arc::new(Heartbeat::new(Arc::clone(&ctx), opts.heartbeat));
        let hb_state = heartbeat.subscribe();
        let recovery = Arc::new(Recovery::new(Arc::clone(&ctx), opts.config.recovery));
        tasks.spawn(metrics::qos::sample(
            Arc::clone(&ctx.metrics),
            Arc::clone(&ctx.engine),
            shutdown.subscribe(),
        ));
        tasks.spawn(crate::restore::wait_restored(
            Arc::clone(&ctx),
            shutdown.subscribe(),
        ));
        let sup_ctx = Arc::clone(&ctx);
        let sup_shutdown = shutdown.clone();
        tasks.spawn(async move {
            // The node's own record first: its exports are served again before the
            // reconcilers (which need the API server) start.
            if let Some(r) = record {
                let exporter = Arc::clone(&sup_ctx.exporter);
                let restoring = tokio::spawn(async move {
                    crate::record::restore(exporter.as_ref(), r).await;
                });
                let wait = crate::record::RESTORE_WAIT;
                if tokio::time::timeout(wait, restoring).await.is_err() {
                    warn!(
                        ?wait,
                        "still serving exports from the node's record; the reconcilers start beside it"
                    );
                }
            }
            supervise(sup_ctx, reporter, heartbeat, recovery, sup_shutdown).await;
        });
        Ok(Self {
            ctx,
            shutdown,
            tasks,
            metrics_addr,
            heartbeat: hb_state,
            pool,
        })
    }

    /// The shared context (engine, metrics, node).
    pub fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// The bound metrics address, if serving.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The heartbeat's state.
    pub fn heartbeat(&self) -> watch::Receiver<HeartbeatState> {
        self.heartbeat.clone()
    }

    /// The pool as prepared at start.
    pub fn pool(&self) -> &PoolInfo {
        &self.pool
    }

    /// Orderly shutdown: stop watches and timers, write the final pool status, wait for
    /// every task (at most `grace`; stragglers are aborted).
    pub async fn shutdown(mut self, grace: Duration) {
        self.shutdown.send_replace(true);
        let drained = tokio::time::timeout(grace, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!(node = %self.ctx.node, "tasks did not stop in time; aborting them");
            self.tasks.abort_all();
        }
        info!(node = %self.ctx.node, "agent stopped");
    }
}

async fn supervise(
    ctx: Arc<Ctx>,
    reporter: Arc<PoolReporter>,
    heartbeat: Arc<Heartbeat>,
    recovery: Arc<Recovery>,
    shutdown: watch::Sender<bool>,
) {
    let mut stop = shutdown.subscribe();
    let mut delay = ctx.retry.min(Duration::from_millis(200));
    loop {
        match reporter.register().await {
            Ok(_) => break,
            Err(e) => {
                warn!(node = %ctx.node, kind = %e.kind(), error = %e.chain(), "cannot register the StoragePool; retrying");
                ctx.metrics
                    .reconcile_error("storagepool", e.kind().as_str());
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        delay = (delay * 2).min(ctx.retry.max(Duration::from_millis(10)) * 10);
    }
    if *stop.borrow() {
        return;
    }
    let mut set = JoinSet::new();
    set.spawn(Arc::clone(&heartbeat).run(shutdown.subscribe()));
    set.spawn(Arc::clone(&reporter).run(Arc::clone(&ctx.pool_changed), shutdown.subscribe()));
    set.spawn(sync::run_controller(
        Arc::clone(&ctx),
        sync::volume::RESOURCE,
        labels::TARGET_NODE_ID,
        sync::volume::reconcile,
        {
            let ctx = Arc::clone(&ctx);
            move |store| sync::node_auth::volume_triggers(&ctx, store)
        },
        shutdown.subscribe(),
    ));
    set.spawn(sync::run_controller(
        Arc::clone(&ctx),
        "antstorsnapshot",
        labels::TARGET_NODE_ID,
        sync::snapshot::reconcile,
        sync::no_triggers,
        shutdown.subscribe(),
    ));
    // Multi-disk volumes assembled here (SpdkLVStore); also without SPDK, to say why not.
    set.spawn(sync::run_controller(
        Arc::clone(&ctx),
        sync::datacontrol::RESOURCE,
        labels::TARGET_NODE_ID,
        sync::datacontrol::reconcile,
        {
            let ctx = Arc::clone(&ctx);
            move |store| sync::datacontrol::triggers(&ctx, store)
        },
        shutdown.subscribe(),
    ));
    // Replicated volumes assembled here hold their I/O while the Lease is stale.
    if ctx.exporter.assembles() {
        set.spawn(sync::datacontrol::self_fence(
            Arc::clone(&ctx),
            heartbeat.subscribe(),
            sync::datacontrol::self_fence_after(heartbeat.duration()),
            shutdown.subscribe(),
        ));
    }
    // Only a target that can copy and switch over takes part in migrations as a source.
    if ctx.exporter.migrator().is_some() {
        set.spawn(sync::run_controller(
            Arc::clone(&ctx),
            sync::migration::RESOURCE,
            labels::MIGRATE_SOURCE_NODE_ID,
            sync::migration::reconcile,
            sync::no_triggers,
            shutdown.subscribe(),
        ));
    }
    set.spawn(Arc::clone(&recovery).run(shutdown.subscribe()));
    while set.join_next().await.is_some() {}
}
