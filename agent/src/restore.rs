//! Readiness after a restart: the agent is ready (`/readyz`) once every NVMe-oF export the
//! node had when it started listens again, not merely once its pool is registered. A
//! DaemonSet rollout (`maxUnavailable: 1`) waits for a restarted pod to be ready before it
//! restarts the next node's agent, so an upgrade goes one storage node at a time and never
//! takes a second node's exports away while the first one's are still coming back.
//!
//! The exports to wait for: this node's volumes (label `obnvmf/target-node-id`) that this
//! agent exported (finalizer `obnvmf/spdk-target`) and that are not being deleted, and the
//! multi-disk volumes this agent assembled (AntstorDataControls with that label, the
//! `antstor.alipay.com/lvm` finalizer and a `status.spdkTarget`). They are
//! listed once at start (retried until the API server answers) and again every
//! [`RELIST`], so that a volume deleted or moved meanwhile is not waited for. The volume and
//! data-control reconcilers restore the exports; this only watches them come back, through
//! the exporter. (An assembly comes back only once its remote members' nodes serve them: a
//! rollout then waits for those too, which is what keeps it from restarting them all at
//! once.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::{Api, ListParams};
use liteio_api::common::SpdkTarget;
use liteio_api::keys::{finalizers, labels};
use liteio_api::meta::has_finalizer;
use liteio_api::{AntstorDataControl, AntstorVolume};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::context::Ctx;

/// How often the exports still missing are looked at.
const POLL: Duration = Duration::from_millis(100);
/// How often the list of exports to wait for is read again (and the missing ones logged).
const RELIST: Duration = Duration::from_secs(30);

/// The exports of this node to wait for: (volume, recorded target).
async fn exports(ctx: &Ctx) -> crate::error::Result<Vec<(String, SpdkTarget)>> {
    // In the agent's namespace, where its Role lets it list them (a cluster-wide list is
    // refused by a real API server).
    let api: Api<AntstorVolume> =
        Api::namespaced(ctx.client.clone(), liteio_api::keys::DEFAULT_NAMESPACE);
    let lp = ListParams::default().labels(&format!("{}={}", labels::TARGET_NODE_ID, ctx.node));
    let list = ctx
        .timed(
            "list",
            format!("AntstorVolumes of node {}", ctx.node),
            api.list(&lp),
        )
        .await?;
    let mut out: Vec<(String, SpdkTarget)> = list
        .items
        .into_iter()
        .filter(|v| {
            v.metadata.deletion_timestamp.is_none()
                && v.spec.target_node_id == ctx.node
                && has_finalizer(&v.metadata, finalizers::SPDK_TARGET)
        })
        .filter_map(|v| {
            let name = v.name_any();
            v.spec.spdk_target.map(|t| (name, t))
        })
        .collect();
    if ctx.exporter.assembles() {
        let dcs: Api<AntstorDataControl> =
            Api::namespaced(ctx.client.clone(), liteio_api::keys::DEFAULT_NAMESPACE);
        let list = ctx
            .timed(
                "list",
                format!("AntstorDataControls of node {}", ctx.node),
                dcs.list(&lp),
            )
            .await?;
        out.extend(
            list.items
                .into_iter()
                .filter(|d| {
                    d.metadata.deletion_timestamp.is_none()
                        && d.spec.target_node_id == ctx.node
                        && has_finalizer(&d.metadata, finalizers::ASSEMBLY)
                })
                .filter_map(|d| {
                    let name = format!("AntstorDataControl {}", d.name_any());
                    d.status.and_then(|s| s.spdk_target).map(|t| (name, t))
                }),
        );
    }
    Ok(out)
}

/// Waits until every export this node had listens again, then marks the agent restored
/// (ready, once its pool is registered too). Ends early on shutdown.
pub async fn wait_restored(ctx: Arc<Ctx>, mut shutdown: watch::Receiver<bool>) {
    let started = Instant::now();
    let mut delay = ctx.retry;
    let mut pending = loop {
        match exports(&ctx).await {
            Ok(p) => break p,
            Err(e) => {
                warn!(error = %e.chain(), ?delay, "cannot list this node's exports to restore; retrying");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    _ = shutdown.wait_for(|s| *s) => return,
                }
                delay = (delay * 2).min(ctx.retry_max);
            }
        }
    };
    prune_record(&ctx, &pending).await;
    let total = pending.len();
    let mut relisted = Instant::now();
    while !pending.is_empty() {
        let mut missing = Vec::with_capacity(pending.len());
        for (name, t) in pending {
            if !ctx.exporter.is_listening(&t).await.unwrap_or(false) {
                missing.push((name, t));
            }
        }
        pending = missing;
        if pending.is_empty() {
            break;
        }
        if relisted.elapsed() >= RELIST {
            relisted = Instant::now();
            let names: Vec<&str> = pending.iter().map(|(n, _)| n.as_str()).take(10).collect();
            warn!(missing = pending.len(), of = total, first = ?names, "exports of this node not listening yet; not ready");
            // Still this node's and still exported: a deleted or moved volume's export is
            // not coming back here.
            if let Ok(now) = exports(&ctx).await {
                pending.retain(|(n, _)| now.iter().any(|(m, _)| m == n));
            }
        }
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
    ctx.metrics.set_restored();
    info!(
        exports = total,
        took_ms = started.elapsed().as_secs_f64() * 1e3,
        "every export of this node listens again"
    );
}

/// Removes the exports the node's record served again (`crate::record`) whose volume is gone
/// (deleted while the agent was down, its finalizer released by the controller) or is another
/// volume of the same name now. An export of a volume that exists stays: its reconciler
/// re-asserts or removes it. Errors are logged; the next start tries again.
async fn prune_record(ctx: &Ctx, listed: &[(String, SpdkTarget)]) {
    let Some(record) = &ctx.record else {
        return;
    };
    let r = Arc::clone(record);
    let Ok((recorded, _)) = tokio::task::spawn_blocking(move || r.list()).await else {
        return;
    };
    let api: Api<AntstorVolume> =
        Api::namespaced(ctx.client.clone(), liteio_api::keys::DEFAULT_NAMESPACE);
    for r in recorded {
        if listed.iter().any(|(n, _)| n == &r.volume) {
            continue;
        }
        let found = ctx
            .timed(
                "get",
                format!("AntstorVolume {}", r.volume),
                api.get_opt(&r.volume),
            )
            .await;
        let gone = match found {
            Ok(None) => true,
            Ok(Some(v)) => v.spec.uuid != r.uuid,
            Err(e) => {
                warn!(volume = %r.volume, error = %e.chain(), "cannot tell whether a recorded export's volume still exists; keeping it");
                false
            }
        };
        if !gone {
            continue;
        }
        let req = crate::exporter::UnexportRequest {
            volume: r.volume.clone(),
            uuid: r.uuid.clone(),
            target: Some(r.target.clone()),
        };
        match ctx.exporter.remove_export(&req).await {
            Ok(()) => {
                info!(volume = %r.volume, nqn = %r.target.subsys_nqn, "removed the export of a volume that is gone (served from the node's record)");
            }
            Err(e) => {
                warn!(volume = %r.volume, error = %e, "cannot remove the export of a volume that is gone");
            }
        }
    }
}
