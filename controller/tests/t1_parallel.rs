//! T1: the controller's parallel workers (issue 30) against the in-process test API server.
//! Many volume workers place a burst of volumes of mixed sizes on pools that cannot hold
//! them all: no pool is ever charged past its size, every volume left out really does not
//! fit, and no volume is reconciled by two workers at once (while different volumes are).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::future::BoxFuture;
use kube::ResourceExt;
use kube::api::{ListParams, Patch, PatchParams};
use liteio_controller::config::Workers;
use liteio_controller::error::Result;
use liteio_controller::plugin::{Plugin, PluginObject};
use liteio_controller::testing::*;
use serde_json::json;
use tokio::sync::Notify;
use tokio::time::timeout;

const GIB: u64 = 1 << 30;

/// Records which volumes are being reconciled at this moment (the plug-ins run inside the
/// volume reconcile, after the binding), every overlap of one volume with itself, and the
/// most volumes seen at once.
#[derive(Debug, Default)]
struct Overlaps {
    inner: Mutex<Seen>,
    /// Wakes the first reconcile, which waits for a second one to run beside it.
    arrived: Notify,
}

#[derive(Debug, Default)]
struct Seen {
    running: HashSet<String>,
    same_object: Vec<String>,
    peak: usize,
    calls: usize,
}

impl Plugin for Overlaps {
    fn name(&self) -> &'static str {
        "Overlaps"
    }

    fn reconcile<'a>(&'a self, obj: PluginObject<'a>) -> BoxFuture<'a, Result<()>> {
        let PluginObject::Volume(v) = obj else {
            return Box::pin(async { Ok(()) });
        };
        let name = v.name_any();
        Box::pin(async move {
            let first_alone = {
                let mut s = self.inner.lock().unwrap();
                s.calls += 1;
                if !s.running.insert(name.clone()) {
                    s.same_object.push(name.clone());
                }
                s.peak = s.peak.max(s.running.len());
                s.peak < 2
            };
            self.arrived.notify_waiters();
            if first_alone {
                // Until another volume's reconcile runs beside this one (bounded: with one
                // worker nothing ever does, and the test's peak assertion fails).
                let _ = timeout(Duration::from_secs(5), async {
                    loop {
                        let notified = self.arrived.notified();
                        if self.inner.lock().unwrap().peak >= 2 {
                            return;
                        }
                        notified.await;
                    }
                })
                .await;
            } else {
                // A window in which a second reconcile of the same volume would be seen.
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            self.inner.lock().unwrap().running.remove(&name);
            Ok(())
        })
    }

    fn handle_deletion<'a>(&'a self, _: PluginObject<'a>) -> BoxFuture<'a, Result<()>> {
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_workers_never_overbook_a_pool_nor_share_a_volume() {
    timeout(Duration::from_secs(120), async {
        let mut config = test_config();
        config.workers = Workers::all(16);
        let overlaps = Arc::new(Overlaps::default());
        let h = start_with(config, vec![overlaps.clone() as Arc<dyn Plugin>]).await;
        let pools = ["p1", "p2", "p3"];
        for p in pools {
            h.add_pool(pool(p, 10 * GIB)).await;
        }
        // 60 volumes of 1, 2 and 3 GiB (120 GiB) for 30 GiB of pools, created at once.
        let sizes: BTreeMap<String, u64> = (0..60)
            .map(|i| (format!("v{i:02}"), (i % 3 + 1) as u64 * GIB))
            .collect();
        let creates = sizes.iter().map(|(name, bytes)| {
            let h = &h;
            async move { h.add_volume(volume(name, *bytes)).await }
        });
        futures::future::join_all(creates).await;

        // Settled: every volume is bound or was told that nothing fits, and what the state
        // charges each pool is what the API server shows bound to it (a volume placed in the
        // state has its binding written right after).
        let settled = || async {
            let vols = h.volumes().list(&ListParams::default()).await.unwrap();
            let mut used: BTreeMap<String, u64> = BTreeMap::new();
            for v in &vols.items {
                if !v.spec.target_node_id.is_empty() {
                    *used.entry(v.spec.target_node_id.clone()).or_default() += v.spec.size_byte;
                }
            }
            vols.items.len() == sizes.len()
                && vols.items.iter().all(|v| {
                    !v.spec.target_node_id.is_empty()
                        || v.status
                            .as_ref()
                            .is_some_and(|s| s.message.starts_with("NoStoragePoolAvailable"))
                })
                && pools.iter().all(|p| {
                    let bound = used.get(*p).copied().unwrap_or(0);
                    h.ctx.state().free_bytes(p) == Some(i128::from(10 * GIB) - i128::from(bound))
                })
        };
        if timeout(Duration::from_secs(15), async {
            while !settled().await {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .is_err()
        {
            let vols = h.volumes().list(&ListParams::default()).await.unwrap();
            let left: Vec<_> = vols
                .items
                .iter()
                .filter(|v| v.spec.target_node_id.is_empty())
                .map(|v| (v.name_any(), v.status.as_ref().map(|s| s.message.clone())))
                .collect();
            panic!(
                "not settled after 15 s: {} volumes, unbound {left:?}",
                vols.items.len()
            );
        }

        // More events for the bound volumes while the workers run: a label changed five
        // times on each, so each volume is queued again while it may be running.
        let vols = h.volumes().list(&ListParams::default()).await.unwrap();
        let bound: Vec<String> = vols
            .items
            .iter()
            .filter(|v| !v.spec.target_node_id.is_empty())
            .map(|v| v.name_any())
            .collect();
        let relabels = bound.iter().map(|name| {
            let api = h.volumes();
            async move {
                for round in 0..5 {
                    let body = json!({"metadata": {"labels": {"t1/round": round.to_string()}}});
                    api.patch(name, &PatchParams::default(), &Patch::Merge(&body))
                        .await
                        .unwrap();
                }
            }
        });
        let calls = overlaps.inner.lock().unwrap().calls;
        futures::future::join_all(relabels).await;
        eventually("the relabelled volumes reconciled", || async {
            overlaps.inner.lock().unwrap().calls >= calls + bound.len()
        })
        .await;

        // What the API server holds: no pool past its size.
        let vols = h.volumes().list(&ListParams::default()).await.unwrap();
        let mut used: BTreeMap<String, u64> = BTreeMap::new();
        for v in &vols.items {
            if !v.spec.target_node_id.is_empty() {
                *used.entry(v.spec.target_node_id.clone()).or_default() += v.spec.size_byte;
            }
        }
        for (node, bytes) in &used {
            assert!(
                *bytes <= 10 * GIB,
                "pool {node} holds {bytes} bytes of volumes, more than its 10 GiB"
            );
            assert_eq!(
                h.ctx.state().free_bytes(node),
                Some(i128::from(10 * GIB - bytes)),
                "the state's free space of {node} matches the bound volumes"
            );
        }
        // Every volume left out really did not fit: space only shrinks during the burst.
        let most_free = pools
            .iter()
            .map(|p| 10 * GIB - used.get(*p).copied().unwrap_or(0))
            .max()
            .unwrap();
        let refused: Vec<_> = vols
            .items
            .iter()
            .filter(|v| v.spec.target_node_id.is_empty())
            .collect();
        assert!(!refused.is_empty(), "the pools cannot hold 120 GiB");
        for v in &refused {
            assert!(
                v.spec.size_byte > most_free,
                "{} ({} bytes) was refused while a pool still has {most_free} bytes free",
                v.name_any(),
                v.spec.size_byte
            );
        }
        let (same_object, peak) = {
            let seen = overlaps.inner.lock().unwrap();
            (seen.same_object.clone(), seen.peak)
        };
        assert!(
            same_object.is_empty(),
            "volumes reconciled by two workers at once: {same_object:?}"
        );
        assert!(
            peak >= 2,
            "the workers never reconciled two volumes at once (peak {peak})"
        );
        h.stop().await;
    })
    .await
    .expect("timed out");
}
