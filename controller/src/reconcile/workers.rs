//! The workers: each reconciled kind ([`WorkKind`]) has its queue and `workers.<kind>`
//! workers (config); a worker waits for the first full lists, then takes a key, runs the
//! kind's reconciler under `reconcileTimeout`, counts the outcome (metric
//! `reconciles{kind,result}`) and retries a failure with per-key [`backoff`]. The kinds'
//! reconcilers are in their own rooms ([`super::volume`], [`super::pool`], ...).

use std::sync::Arc;

use tokio::sync::watch;
use tracing::{debug, warn};

use super::queue::{WorkQueue, backoff};
use super::{Action, Context, group, keys, migration, pool, snapshot, volume};
use crate::config::Workers;
use crate::error::{Error, ErrorKind, Result};
use crate::plugin::Kind;
use crate::state::ObjectKey;

/// The kinds the workers reconcile (one queue and `workers.<kind>` workers each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WorkKind {
    Volume,
    Pool,
    Snapshot,
    Migration,
    KeyAccess,
    Group,
    DataControl,
}

impl WorkKind {
    /// Every kind, in the order their workers start.
    pub(super) const ALL: [Self; 7] = [
        Self::Volume,
        Self::Pool,
        Self::Snapshot,
        Self::Migration,
        Self::KeyAccess,
        Self::Group,
        Self::DataControl,
    ];

    /// This kind's worker count.
    pub(super) fn workers(self, w: &Workers) -> u32 {
        match self {
            Self::Volume => w.volume,
            Self::Pool => w.pool,
            Self::Snapshot => w.snapshot,
            Self::Migration => w.migration,
            Self::KeyAccess => w.key_access,
            Self::Group => w.group,
            Self::DataControl => w.data_control,
        }
    }

    /// The kind's name in metrics and logs.
    fn as_str(self) -> &'static str {
        match self {
            Self::Volume => Kind::Volume.as_str(),
            Self::Pool => Kind::Pool.as_str(),
            Self::Snapshot => Kind::Snapshot.as_str(),
            Self::Migration => "migration",
            Self::KeyAccess => "key_access",
            Self::Group => "volume_group",
            Self::DataControl => "data_control",
        }
    }

    /// The kind's queue.
    fn queue(self, ctx: &Context) -> Arc<WorkQueue> {
        Arc::clone(match self {
            Self::Volume => &ctx.volumes,
            Self::Pool => &ctx.pools,
            Self::Snapshot => &ctx.snapshots,
            Self::Migration => &ctx.migration_queue,
            Self::KeyAccess => &ctx.key_access,
            Self::Group => &ctx.group_queue,
            Self::DataControl => &ctx.data_control_queue,
        })
    }

    /// One pass of the kind's reconciler over `key`.
    async fn reconcile(self, ctx: &Context, key: &ObjectKey) -> Result<Action> {
        match self {
            Self::Volume => volume::reconcile(ctx, key).await,
            Self::Pool => pool::reconcile(ctx, key).await,
            Self::Snapshot => snapshot::reconcile(ctx, key).await,
            Self::Migration => migration::reconcile(ctx, key).await,
            Self::KeyAccess => keys::reconcile(ctx, key).await,
            Self::Group => group::reconcile_group(ctx, key).await,
            Self::DataControl => group::reconcile_data_control(ctx, key).await,
        }
    }
}

/// One worker of `kind`, until `shutdown`.
pub(super) async fn worker(ctx: Arc<Context>, kind: WorkKind, mut shutdown: watch::Receiver<bool>) {
    if !ctx.wait_synced(&mut shutdown).await {
        return;
    }
    let queue = kind.queue(&ctx);
    loop {
        let key = tokio::select! {
            _ = shutdown.changed() => return,
            k = queue.pop() => k,
        };
        // A request that hangs would hold this worker (and, once every worker of the kind is
        // held, every object of the kind): past `reconcileTimeout` the reconcile is
        // abandoned (reconciles are idempotent: the next one starts from what the API
        // server has) and retried.
        let limit = ctx.config.reconcile_timeout;
        let res = tokio::time::timeout(limit, kind.reconcile(&ctx, &key))
            .await
            .unwrap_or_else(|_| {
                Err(Error::ReconcileTimeout {
                    object: format!("{} {key}", kind.as_str()),
                    after: limit,
                })
            });
        match res {
            Ok(action) => {
                ctx.metrics
                    .reconciles
                    .with_label_values(&[kind.as_str(), "ok"])
                    .inc();
                queue.succeeded(&key);
                if let Action::RequeueAfter(d) = action {
                    queue.add_after(key.clone(), d);
                }
            }
            Err(e) => {
                let ek = e.kind();
                ctx.metrics
                    .reconciles
                    .with_label_values(&[kind.as_str(), ek.as_str()])
                    .inc();
                let n = queue.failed(&key);
                let delay = backoff(n, ek);
                if ek == ErrorKind::Conflict {
                    debug!(kind = kind.as_str(), object = %key, error = %e, "conflict; retrying");
                } else {
                    warn!(kind = kind.as_str(), object = %key, error = %e.chain(), attempt = n, ?delay, "reconcile failed; retrying");
                }
                queue.add_after(key.clone(), delay);
            }
        }
        queue.done(&key);
    }
}
