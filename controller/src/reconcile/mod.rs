//! The reconcile runtime: watches feed the [`State`](crate::state::State) and per-kind work
//! queues; each kind's workers (`workers:` in the config) drain its queue, never two on one
//! key at once; the liveness clock re-queues pools (and volumes being deleted on pools that
//! are not ready) every `liveness.tick`. Nothing else runs on a timer: a volume that did not
//! fit is retried when a pool changes or space is freed, a clone waiting for its source
//! snapshot when that snapshot appears, a snapshot waiting for its origin when the origin
//! changes, a migration when its source or destination volume changes (or another migration
//! of its volume goes away).
//!
//! Workers start only after the first full list of pools, volumes, snapshots, migrations,
//! groups, data controls and Leases, so the scheduler never decides on a partial view (a
//! restarted controller places nothing twice). Failed reconciles are retried with per-key
//! exponential back-off.
//!
//! Parallel workers and placement: a volume (or group) is placed by deciding and charging
//! its pool in the state under one lock, before its binding is written; so a worker placing
//! the next volume sees the space taken even while the first one's patch is in flight, and
//! no two volumes are placed on the same free space.
//!
//! The rooms. The runtime: [`run`] here (start everything, wait for the end); `watches`
//! (the table of watched kinds and what each event triggers); `workers` (the table of
//! reconciled kinds and the worker loop); `liveness` (the one timer); [`context`] (the
//! [`Context`] they share, with the caches and queues); [`queue`] (the [`WorkQueue`] and
//! [`backoff`]). The reconcilers, one per kind: [`volume`], [`pool`], [`snapshot`],
//! [`migration`] (its pure decisions in [`migration::plan`]), [`keys`] (key access, and its
//! start-up sweep), [`group`] (groups and data controls) with [`replicated`] (raid1
//! replicas) and [`members`] (what a group is made of, for both).

pub mod context;
pub mod group;
pub mod keys;
mod liveness;
pub mod members;
pub mod migration;
pub mod pool;
pub mod queue;
pub mod replicated;
pub mod snapshot;
pub mod volume;
mod watches;
mod workers;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

pub use context::Context;
pub use queue::{WorkQueue, backoff};

/// What a reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing until the next watch event.
    Done,
    /// Run again after this long (grace periods of the liveness clock).
    RequeueAfter(Duration),
}

/// Runs the watches, the workers and the liveness clock until `shutdown` turns true.
pub async fn run(ctx: Arc<Context>, shutdown: watch::Receiver<bool>) {
    let mut tasks = tokio::task::JoinSet::new();
    for spawn in watches::WATCHES {
        spawn(&mut tasks, &ctx, &shutdown);
    }
    for kind in workers::WorkKind::ALL {
        for _ in 0..kind.workers(&ctx.config.workers) {
            tasks.spawn(workers::worker(Arc::clone(&ctx), kind, shutdown.clone()));
        }
    }
    if ctx.config.node_key_access {
        tasks.spawn(keys::stale_key_access(Arc::clone(&ctx), shutdown.clone()));
    }
    tasks.spawn(liveness::liveness_clock(Arc::clone(&ctx), shutdown.clone()));
    while tasks.join_next().await.is_some() {}
}
