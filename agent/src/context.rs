//! What every control-loop task shares: the client, the node, the engine, the exporter,
//! metrics, and the pool-change notification; and what the control loops remember between
//! passes ([`crate::state`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::{Notify, watch};

use crate::engine::{EngineError, PoolEngine, PoolInfo};
use crate::error::{AgentError, Result};
use crate::exporter::Exporter;
use crate::metrics::Metrics;
use crate::state::capabilities::KnownCapabilities;
use crate::state::copy_failures::CopyFailures;
use crate::state::own_writes::OwnWrites;
use crate::state::provision::Provisioning;
use crate::state::warnings::Warnings;

/// Shared state of one agent.
pub struct Ctx {
    /// Kubernetes client.
    pub client: Client,
    /// The client for the volumes' key Secrets (get, patch, delete): the node's own
    /// identity where the deployment gives it (`--keys-kubeconfig`), else `client`.
    pub keys_client: Client,
    /// This node's name (= StoragePool name = Lease name).
    pub node: String,
    /// The pool engine.
    pub engine: Arc<dyn PoolEngine>,
    /// The NVMe-oF exporter.
    pub exporter: Arc<dyn Exporter>,
    /// The node's own record of its exports (`nvmf.exportRecordDir`), when kept.
    pub record: Option<Arc<crate::record::ExportRecord>>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Notified after every engine change so the pool status is pushed promptly.
    pub pool_changed: Arc<Notify>,
    /// Limit of one API request.
    pub request_timeout: Duration,
    /// Safety-net requeue of settled objects.
    pub resync: Duration,
    /// Requeue delay after a first failed reconcile; doubles per further failure.
    pub retry: Duration,
    /// Longest requeue delay after failed reconciles.
    pub retry_max: Duration,
    /// Bumped after every engine change (any number of subscribers, unlike `pool_changed`).
    pub pool_epoch: watch::Sender<u64>,
    /// Pool name (VG, lvstore or file pool name).
    pub pool_name: String,
    /// Where the volumes being provisioned spend their time.
    pub provisioning: Provisioning,
    /// Versions of objects the agent's own passes superseded.
    pub own_writes: OwnWrites,
    /// When the copy of each migration last failed (a failed copy starts again only after a
    /// pause, so that the failure is seen).
    pub copy_failures: CopyFailures,
    /// Warning events about objects whose reconcile failed for good.
    pub warnings: Warnings,
    /// The hosts' capabilities from the Node watch (empty without authentication).
    pub capabilities: KnownCapabilities,
    /// Engine calls running at once (see [`ENGINE_CALLS`]).
    pub engine_slots: tokio::sync::Semaphore,
}

/// Engine calls that run at once; the others wait, in order, for a slot. Each runs on a
/// thread of the blocking pool: without a bound a burst of thousands of volumes started a
/// thread per call (up to tokio's 512), each then waiting for the pool's own lock, SPDK's
/// reactor or LVM's, and the engine got its requests in no order at all.
pub const ENGINE_CALLS: usize = 32;

/// Runs `f` on the blocking pool once `slots` has a slot for it, held until `f` returns.
async fn blocking_in_slot<T, F>(
    slots: &tokio::sync::Semaphore,
    f: F,
) -> std::result::Result<T, tokio::task::JoinError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    // Never closed, so never an error.
    let _slot = slots.acquire().await.ok();
    tokio::task::spawn_blocking(f).await
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("node", &self.node)
            .field("pool_name", &self.pool_name)
            .field("engine", &self.engine)
            .field("exporter", &self.exporter)
            .finish_non_exhaustive()
    }
}

impl Ctx {
    /// Runs an API request with the request timeout.
    pub async fn timed<T>(
        &self,
        op: &'static str,
        what: impl Into<String>,
        fut: impl Future<Output = std::result::Result<T, kube::Error>>,
    ) -> Result<T> {
        let what = what.into();
        match tokio::time::timeout(self.request_timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(AgentError::kube(op, what, e)),
            Err(_) => Err(AgentError::Timeout {
                op,
                what,
                after: self.request_timeout,
            }),
        }
    }

    /// Runs a blocking engine operation on the blocking pool.
    pub async fn engine_call<T, F>(&self, op: &'static str, name: &str, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&dyn PoolEngine) -> std::result::Result<T, EngineError> + Send + 'static,
    {
        let engine = Arc::clone(&self.engine);
        let res = blocking_in_slot(&self.engine_slots, move || f(engine.as_ref()))
            .await
            .map_err(|source| AgentError::Join {
                op,
                name: name.to_string(),
                source,
            })?;
        res.map_err(|source| AgentError::engine(op, name, source))
    }

    /// The pool's capacity and free space.
    pub async fn engine_info(&self) -> Result<PoolInfo> {
        let pool = self.node.clone();
        self.engine_call("read", &pool, |e| e.info()).await
    }

    /// Tells the pool reporter (and the sync controllers waiting to retry) that the engine
    /// changed.
    pub fn pool_changed(&self) {
        self.pool_changed.notify_one();
        self.pool_epoch.send_modify(|e| *e = e.wrapping_add(1));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::{ENGINE_CALLS, blocking_in_slot};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn engine_calls_run_at_most_their_slots_at_once() {
        let slots = Arc::new(tokio::sync::Semaphore::new(ENGINE_CALLS));
        let (running, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let calls: Vec<_> = (0..4 * ENGINE_CALLS)
            .map(|i| {
                let (slots, running, peak) =
                    (Arc::clone(&slots), Arc::clone(&running), Arc::clone(&peak));
                tokio::spawn(async move {
                    blocking_in_slot(&slots, move || {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(20));
                        running.fetch_sub(1, Ordering::SeqCst);
                        i
                    })
                    .await
                })
            })
            .collect();
        let done = tokio::time::timeout(Duration::from_secs(60), async {
            let mut sum = 0;
            for c in calls {
                sum += c.await.unwrap().unwrap();
            }
            sum
        })
        .await
        .expect("the calls did not finish in time");
        assert_eq!(
            done,
            (0..4 * ENGINE_CALLS).sum::<usize>(),
            "every call ran once"
        );
        let peak = peak.load(Ordering::SeqCst);
        assert!(peak <= ENGINE_CALLS, "{peak} calls ran at once");
        assert!(peak > 1, "the calls ran side by side");
        assert_eq!(
            slots.available_permits(),
            ENGINE_CALLS,
            "every slot came back"
        );
    }
}
