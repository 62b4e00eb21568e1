//! The liveness clock, the only timer of the reconcile runtime: every `liveness.tick` it
//! re-queues every pool (whose reconciler judges the pool's Lease) and every volume being
//! deleted, and refreshes the gauges that age with time (pools by state, each pool's Lease
//! age, the volumes that are not ready).

use std::collections::HashMap;
use std::sync::Arc;

use kube::ResourceExt;
use liteio_api::StoragePool;
use tokio::sync::watch;

use super::{Context, pool};
use crate::clock::unix_seconds;
use crate::state::State;

/// The lower-case name of a pool's status (`unknown` when it has none yet).
fn status_name(p: &StoragePool) -> &'static str {
    pool::status_name(p.status.as_ref().and_then(|s| s.status).unwrap_or_default())
}

/// The per-object gauges of pools and volumes as of `now`: each pool's status and Lease age,
/// and the volumes that are not ready (nor being deleted) with their creation time.
fn observe(ctx: &Context, s: &State, now: k8s_openapi::jiff::Timestamp) {
    let pools: Vec<crate::metrics::PoolSample> = s
        .pools()
        .map(|p| {
            let seen = s
                .heartbeat(p.name)
                .or_else(|| p.pool.metadata.creation_timestamp.as_ref().map(|t| t.0));
            crate::metrics::PoolSample {
                pool: p.name.to_string(),
                status: status_name(p.pool),
                lease_age_seconds: seen.map(|t| crate::clock::elapsed(now, t).as_secs_f64()),
            }
        })
        .collect();
    ctx.metrics.observe_pools(&pools);
    let volumes: Vec<crate::metrics::VolumeSample> = s
        .volume_keys()
        .iter()
        .filter_map(|k| s.volume(k))
        .filter(|v| {
            v.phase() != liteio_api::VolumeStatus::Ready && v.metadata.deletion_timestamp.is_none()
        })
        .map(|v| {
            let label = |k: &str| v.labels().get(k).cloned().unwrap_or_default();
            crate::metrics::VolumeSample {
                volume: v.name_any(),
                node: v.spec.target_node_id.clone(),
                pvc_namespace: label(liteio_api::keys::labels::PVC_NAMESPACE),
                pvc: label(liteio_api::keys::labels::PVC_NAME),
                created: v
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map_or_else(|| unix_seconds(now), |t| unix_seconds(t.0)),
            }
        })
        .collect();
    ctx.metrics.observe_volumes(&volumes);
}

/// The liveness clock: re-queues every pool and every volume being deleted, and refreshes
/// the pools-by-state gauge and the per-pool and per-volume ones.
pub(super) async fn liveness_clock(ctx: Arc<Context>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(ctx.config.liveness.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        let (pools, deleting, counts) = {
            let s = ctx.state();
            let mut counts: HashMap<&'static str, i64> = HashMap::new();
            let pools: Vec<String> = s
                .pools()
                .map(|p| {
                    *counts.entry(status_name(p.pool)).or_default() += 1;
                    p.name.to_string()
                })
                .collect();
            observe(&ctx, &s, ctx.clock.now());
            (pools, s.deleting_volumes(), counts)
        };
        for st in crate::metrics::POOL_STATUSES {
            ctx.metrics
                .pools
                .with_label_values(&[st])
                .set(counts.get(st).copied().unwrap_or(0));
        }
        for p in pools {
            ctx.enqueue_pool(&p);
        }
        ctx.enqueue_volumes(deleting);
    }
}
