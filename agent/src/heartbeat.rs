//! The Lease heartbeat: `obnvmf/<node>` renewed every interval.
//!
//! **Expected flow.** Each renewal takes the cached Lease, sets `holderIdentity`,
//! `leaseDurationSeconds` and `renewTime` (now, MicroTime) and replaces it (optimistic
//! concurrency through its resourceVersion). Without a cached Lease it GETs it; when it does
//! not exist it creates it with an ownerReference to this node's StoragePool (so deleting
//! the pool deletes the Lease).
//!
//! **Guarantees** (the fix of LiteIO's bug, reference §4.4 / §8.20). A renewal is reported
//! successful only when the API server accepted the write. Any failure — 409 conflict, 5xx,
//! a request that does not answer within `request_timeout`, the Lease deleted behind our
//! back — drops the cached Lease, counts a failure, and retries after a short backoff that
//! doubles from `retry_min` up to `retry_max` (never more than the interval), re-fetching the
//! Lease first. The loop never stops before shutdown.
//!
//! **Errors.** Each failed attempt is logged with its kind and counted in
//! `liteio_heartbeat_failures_total`; [`HeartbeatState`] carries the consecutive failures.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, PostParams};
use liteio_api::StoragePool;
use liteio_api::keys::{self, managers};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::config::HeartbeatConfig;
use crate::context::Ctx;
use crate::error::{AgentError, ErrorKind, Result};

/// Timings of the heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeartbeatOptions {
    /// Renewal period.
    pub interval: Duration,
    /// `leaseDurationSeconds` (rounded up to whole seconds, at least 1).
    pub duration: Duration,
    /// Limit of one renewal (GET + PUT, or GET + CREATE).
    pub request_timeout: Duration,
    /// First retry delay after a failure.
    pub retry_min: Duration,
    /// Longest retry delay.
    pub retry_max: Duration,
}

impl HeartbeatOptions {
    /// From the config: the request timeout is the interval capped at 10 s; retries start at
    /// a tenth of the interval (at most 1 s) and back off up to the interval.
    pub fn from_config(c: &HeartbeatConfig) -> Self {
        Self::with_interval(c.interval, c.duration)
    }

    /// Derived timings for `interval` and `duration`.
    pub fn with_interval(interval: Duration, duration: Duration) -> Self {
        Self {
            interval,
            duration,
            request_timeout: interval.clamp(Duration::from_millis(50), Duration::from_secs(10)),
            retry_min: (interval / 10).clamp(Duration::from_millis(10), Duration::from_secs(1)),
            retry_max: interval,
        }
    }
}

/// What the heartbeat last did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeartbeatState {
    /// Time of the last successful renewal.
    pub last_renewal: Option<Timestamp>,
    /// When the last renewal succeeded, on this process's monotonic clock (what the
    /// self-fence of replicated volumes measures the Lease's age by).
    pub renewed_at: Option<std::time::Instant>,
    /// Failed attempts since the last success.
    pub consecutive_failures: u32,
    /// Kind of the last failure.
    pub last_error: Option<ErrorKind>,
}

fn lease_seconds(d: Duration) -> i32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
}

/// Renews the Lease until shutdown. See the module doc.
#[derive(Debug)]
pub struct Heartbeat {
    ctx: Arc<Ctx>,
    opts: HeartbeatOptions,
    state: watch::Sender<HeartbeatState>,
}

impl Heartbeat {
    /// A heartbeat for the agent's node.
    pub fn new(ctx: Arc<Ctx>, opts: HeartbeatOptions) -> Self {
        Self {
            ctx,
            opts,
            state: watch::Sender::new(HeartbeatState::default()),
        }
    }

    /// The Lease's duration.
    pub fn duration(&self) -> Duration {
        self.opts.duration
    }

    /// Follows the heartbeat's state.
    pub fn subscribe(&self) -> watch::Receiver<HeartbeatState> {
        self.state.subscribe()
    }

    fn what(&self) -> String {
        format!("Lease {}/{}", keys::LEASE_NAMESPACE, self.ctx.node)
    }

    fn stamp(&self, lease: &mut Lease, now: Timestamp) {
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.ctx.node.clone());
        spec.lease_duration_seconds = Some(lease_seconds(self.opts.duration));
        spec.renew_time = Some(MicroTime(now));
    }

    async fn create(&self, api: &Api<Lease>, now: Timestamp) -> Result<Lease> {
        let pools: Api<StoragePool> =
            Api::namespaced(self.ctx.client.clone(), keys::DEFAULT_NAMESPACE);
        let pool = pools
            .get_opt(&self.ctx.node)
            .await
            .map_err(|e| AgentError::kube("get", format!("StoragePool {}", self.ctx.node), e))?
            .ok_or_else(|| AgentError::NotFound {
                what: format!(
                    "StoragePool {}/{} (owner of the Lease)",
                    keys::DEFAULT_NAMESPACE,
                    self.ctx.node
                ),
            })?;
        let owner = OwnerReference {
            api_version: StoragePool::api_version(&()).to_string(),
            kind: StoragePool::kind(&()).to_string(),
            name: self.ctx.node.clone(),
            uid: pool.metadata.uid.clone().unwrap_or_default(),
            ..OwnerReference::default()
        };
        let mut lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.ctx.node.clone()),
                namespace: Some(keys::LEASE_NAMESPACE.to_string()),
                owner_references: Some(vec![owner]),
                ..ObjectMeta::default()
            },
            spec: None,
        };
        self.stamp(&mut lease, now);
        let pp = PostParams {
            field_manager: Some(managers::AGENT.to_string()),
            ..PostParams::default()
        };
        let created = api
            .create(&pp, &lease)
            .await
            .map_err(|e| AgentError::kube("create", self.what(), e))?;
        info!(node = %self.ctx.node, "Lease created");
        Ok(created)
    }

    /// One renewal. `cached` is taken; it holds the written Lease only on success.
    async fn renew(&self, cached: &mut Option<Lease>) -> Result<Lease> {
        let api: Api<Lease> = Api::namespaced(self.ctx.client.clone(), keys::LEASE_NAMESPACE);
        let now = Timestamp::now();
        let mut lease = match cached.take() {
            Some(l) => l,
            None => match api
                .get_opt(&self.ctx.node)
                .await
                .map_err(|e| AgentError::kube("get", self.what(), e))?
            {
                Some(l) => l,
                None => return self.create(&api, now).await,
            },
        };
        self.stamp(&mut lease, now);
        let pp = PostParams {
            field_manager: Some(managers::AGENT.to_string()),
            ..PostParams::default()
        };
        api.replace(&self.ctx.node, &pp, &lease)
            .await
            .map_err(|e| AgentError::kube("renew", self.what(), e))
    }

    /// One attempt with the request timeout; updates the cache, state and metrics.
    pub async fn tick(&self, cached: &mut Option<Lease>) -> Result<()> {
        let res = match tokio::time::timeout(self.opts.request_timeout, self.renew(cached)).await {
            Ok(r) => r,
            Err(_) => Err(AgentError::Timeout {
                op: "renew",
                what: self.what(),
                after: self.opts.request_timeout,
            }),
        };
        match res {
            Ok(lease) => {
                let renewed = lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.renew_time.as_ref())
                    .map(|t| t.0);
                *cached = Some(lease);
                if let Some(t) = renewed {
                    self.ctx
                        .metrics
                        .heartbeat_ok(t.as_millisecond() as f64 / 1000.0);
                }
                self.state.send_modify(|s| {
                    s.last_renewal = renewed;
                    s.renewed_at = Some(std::time::Instant::now());
                    s.consecutive_failures = 0;
                    s.last_error = None;
                });
                debug!(node = %self.ctx.node, "Lease renewed");
                Ok(())
            }
            Err(e) => {
                // Never trust the cache after a failure: the next attempt re-fetches.
                *cached = None;
                self.ctx.metrics.heartbeat_failed();
                self.state.send_modify(|s| {
                    s.consecutive_failures = s.consecutive_failures.saturating_add(1);
                    s.last_error = Some(e.kind());
                });
                Err(e)
            }
        }
    }

    /// Renews until `shutdown` turns true. Never returns early; never reports a failed
    /// renewal as a success. The Lease is left as it is on shutdown (it expires by itself).
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut cached = None;
        let mut delay = Duration::ZERO;
        let mut backoff = self.opts.retry_min;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
            match self.tick(&mut cached).await {
                Ok(()) => {
                    delay = self.opts.interval;
                    backoff = self.opts.retry_min;
                }
                Err(e) => {
                    let failures = self.state.borrow().consecutive_failures;
                    warn!(node = %self.ctx.node, kind = %e.kind(), failures, retry_in_ms = backoff.as_millis() as u64, error = %e.chain(), "Lease renewal failed; re-fetching and retrying");
                    delay = backoff;
                    backoff = (backoff * 2).min(self.opts.retry_max.max(self.opts.retry_min));
                }
            }
        }
    }
}
