//! Restart recovery: compare what the engine holds with what the API says.
//!
//! **Expected flow.** [`Recovery::scan`] lists the engine's volumes and snapshots first, then
//! every AntstorVolume and AntstorSnapshot of the namespace (all nodes: a name owned by any
//! object is never touched). Engine objects that no API object owns are *orphans*: they are
//! logged (once each), counted in `liteio_orphan_objects{kind}`, and — only when
//! `recovery.collectOrphans` is true and the object stayed orphaned for
//! `recovery.orphanGracePeriod` since this agent first saw it — deleted. A failed list aborts
//! the scan: nothing is ever collected on partial information.
//!
//! Ready volumes get their exports back through the volume sync, which re-asserts the export
//! of every exported volume on its first pass after start-up (the controller lists every
//! object at start); half-done operations are finished there too (the engine is idempotent).
//!
//! **Guarantees.** By default nothing is deleted. The grace clock restarts with the agent.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kube::Api;
use kube::ResourceExt;
use kube::api::ListParams;
use liteio_api::{AntstorSnapshot, AntstorVolume, keys};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::RecoveryConfig;
use crate::context::Ctx;
use crate::engine::VolumeInfo;
use crate::error::Result;

/// An engine object no API object owns.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Orphan {
    /// Engine name.
    pub name: String,
    /// Whether it is a snapshot.
    pub snapshot: bool,
    /// Size in bytes.
    pub size_bytes: u64,
}

/// Engine objects whose names no volume / snapshot owns. Pure.
pub fn find_orphans(
    engine: &[VolumeInfo],
    volume_names: &HashSet<String>,
    snapshot_names: &HashSet<String>,
) -> Vec<Orphan> {
    engine
        .iter()
        .filter(|v| {
            if v.is_snapshot() {
                !snapshot_names.contains(&v.name)
            } else {
                !volume_names.contains(&v.name)
            }
        })
        .map(|v| Orphan {
            name: v.name.clone(),
            snapshot: v.is_snapshot(),
            size_bytes: v.size_bytes,
        })
        .collect()
}

/// Result of one scan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Orphans seen.
    pub orphans: Vec<Orphan>,
    /// Orphans deleted in this scan.
    pub collected: Vec<Orphan>,
}

/// The `resource` label of the orphan scan's errors.
const RESOURCE: &str = "recovery";

/// Orphan detection and (optional) collection.
#[derive(Debug)]
pub struct Recovery {
    ctx: Arc<Ctx>,
    policy: RecoveryConfig,
    first_seen: Mutex<HashMap<Orphan, Instant>>,
}

impl Recovery {
    /// A recovery for the agent context.
    pub fn new(ctx: Arc<Ctx>, policy: RecoveryConfig) -> Self {
        Self {
            ctx,
            policy,
            first_seen: Mutex::new(HashMap::new()),
        }
    }

    /// One scan. See the module doc. Errors: a list failed (nothing was collected).
    pub async fn scan(&self) -> Result<ScanReport> {
        let ctx = &self.ctx;
        let pool = ctx.pool_name.clone();
        let engine = ctx.engine_call("list", &pool, |e| e.list_volumes()).await?;
        let vols: Api<AntstorVolume> = Api::namespaced(ctx.client.clone(), keys::DEFAULT_NAMESPACE);
        let snaps: Api<AntstorSnapshot> =
            Api::namespaced(ctx.client.clone(), keys::DEFAULT_NAMESPACE);
        let lp = ListParams::default();
        let vol_list = ctx.timed("list", "AntstorVolumes", vols.list(&lp)).await?;
        let snap_list = ctx
            .timed("list", "AntstorSnapshots", snaps.list(&lp))
            .await?;
        let mut volume_names: HashSet<String> = HashSet::new();
        for v in &vol_list.items {
            volume_names.insert(crate::sync::names::volume_engine_name(v));
            volume_names.insert(v.name_any());
        }
        let snapshot_names: HashSet<String> = snap_list
            .items
            .iter()
            .map(crate::sync::names::snapshot_engine_name)
            .collect();
        let orphans = find_orphans(&engine, &volume_names, &snapshot_names);
        ctx.metrics
            .set_orphans("volume", orphans.iter().filter(|o| !o.snapshot).count());
        ctx.metrics
            .set_orphans("snapshot", orphans.iter().filter(|o| o.snapshot).count());
        let now = Instant::now();
        let due: Vec<Orphan> = {
            let mut seen = self.first_seen.lock().unwrap_or_else(|p| p.into_inner());
            seen.retain(|o, _| orphans.contains(o));
            for o in &orphans {
                seen.entry(o.clone()).or_insert_with(|| {
                    warn!(node = %ctx.node, name = %o.name, snapshot = o.snapshot, size = o.size_bytes,
                        collect = self.policy.collect_orphans,
                        "engine object has no AntstorVolume/AntstorSnapshot (orphan)");
                    now
                });
            }
            if self.policy.collect_orphans {
                seen.iter()
                    .filter(|(_, t)| now.duration_since(**t) >= self.policy.orphan_grace_period)
                    .map(|(o, _)| o.clone())
                    .collect()
            } else {
                Vec::new()
            }
        };
        let mut collected = Vec::new();
        for o in due {
            let n = o.name.clone();
            let res = if o.snapshot {
                ctx.engine_call("collect snapshot", &o.name, move |e| e.delete_snapshot(&n))
                    .await
            } else {
                ctx.engine_call("collect volume", &o.name, move |e| e.delete_volume(&n))
                    .await
            };
            match res {
                Ok(()) => {
                    info!(node = %ctx.node, name = %o.name, snapshot = o.snapshot, "orphan collected");
                    self.first_seen
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&o);
                    collected.push(o);
                }
                Err(e) => {
                    ctx.metrics.reconcile_error(RESOURCE, e.kind().as_str());
                    warn!(node = %ctx.node, name = %o.name, error = %e.chain(), "cannot collect orphan")
                }
            }
        }
        if !collected.is_empty() {
            ctx.pool_changed();
        }
        Ok(ScanReport { orphans, collected })
    }

    /// Scans now and then every `ctx.resync` until shutdown.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        loop {
            if let Err(e) = self.scan().await {
                self.ctx
                    .metrics
                    .reconcile_error(RESOURCE, e.kind().as_str());
                warn!(node = %self.ctx.node, error = %e.chain(), "orphan scan failed");
            }
            tokio::select! {
                _ = tokio::time::sleep(self.ctx.resync) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
        }
    }
}
