//! The StoragePool reconciler: liveness from the agent's Lease, locking, finalizer, labels,
//! cleanup of pools whose node vanished, and deletion.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Taint, Toleration};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams};
use liteio_api::keys::{self, finalizers, labels};
use liteio_api::pool::{ConditionStatus, PoolCondition, PoolConditionType, PoolStatus};
use liteio_api::{AntstorVolume, StoragePool};
use serde_json::json;
use tracing::{info, instrument};

use super::{Action, Context};
use crate::clock::elapsed;
use crate::config::{LivenessConfig, LockSchedConfig};
use crate::error::{Error, Result};
use crate::plugin::{Kind, PluginObject};
use crate::selector::Requirement;
use crate::state::ObjectKey;

/// Reason of the Warning event each volume on a pool gets when the pool goes `offline` or
/// `unknown`.
pub const POOL_NOT_READY: &str = "PoolNotReady";

/// Liveness of a pool from its heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Renewed within `unknownAfter`.
    Ready,
    /// Silent for `unknownAfter` or longer.
    Unknown,
    /// Silent for `offlineAfter` or longer.
    Offline,
}

/// Liveness at `now` given the last Lease renewal (or, without a Lease, the pool's
/// creation time; with neither the pool is `Unknown`).
pub fn liveness(
    now: Timestamp,
    last: Option<Timestamp>,
    created: Option<Timestamp>,
    cfg: &LivenessConfig,
) -> Liveness {
    let Some(seen) = last.or(created) else {
        return Liveness::Unknown;
    };
    let age = elapsed(now, seen);
    if age >= cfg.offline_after {
        Liveness::Offline
    } else if age >= cfg.unknown_after {
        Liveness::Unknown
    } else {
        Liveness::Ready
    }
}

/// Lower-case name of a pool status.
pub fn status_name(s: PoolStatus) -> &'static str {
    match s {
        PoolStatus::Ready => "ready",
        PoolStatus::Locked => "locked",
        PoolStatus::Offline => "offline",
        PoolStatus::Unknown => "unknown",
    }
}

fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if let Some(e) = t.effect.as_deref()
        && !e.is_empty()
        && e != taint.effect
    {
        return false;
    }
    let key = t.key.as_deref().unwrap_or_default();
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => key.is_empty() || key == taint.key,
        _ => {
            key == taint.key
                && t.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
    }
}

/// True when the config locks a node with these labels and taints: any `nodeSelector`
/// requirement matches, or any configured toleration tolerates one of its taints.
pub fn config_locks(
    cfg: &LockSchedConfig,
    node_labels: &std::collections::BTreeMap<String, String>,
    taints: &[Taint],
) -> bool {
    let by_label = cfg
        .node_selector
        .iter()
        .any(|r| Requirement::from_node_selector(r).is_ok_and(|r| r.matches(node_labels)));
    by_label
        || cfg
            .taints
            .iter()
            .any(|t| taints.iter().any(|taint| tolerates(t, taint)))
}

/// The status the controller wants for a pool.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    /// `status.status`.
    pub status: PoolStatus,
    /// `status.conditions` (the KubeNode condition is the controller's).
    pub conditions: Vec<PoolCondition>,
    /// `status.message`.
    pub message: String,
}

/// Computes the desired status: liveness first (`offline`, `unknown`); a live pool is
/// `locked` when the config locks its node or a KubeNode / Lvm condition is Error.
pub fn desired_status(
    pool: &StoragePool,
    live: Liveness,
    heartbeat: Option<Timestamp>,
    locked_by_config: bool,
) -> Desired {
    let current = pool.status.clone().unwrap_or_default();
    let mut conditions = current.conditions.clone();
    let kube_idx = conditions
        .iter()
        .position(|c| c.type_ == PoolConditionType::KubeNode);
    if locked_by_config {
        let c = PoolCondition {
            type_: PoolConditionType::KubeNode,
            status: ConditionStatus::Error,
            message: keys::KUBE_NODE_MSG_NC_OFFLINE.into(),
        };
        match kube_idx {
            Some(i) => conditions[i] = c,
            None => conditions.push(c),
        }
    } else if let Some(i) = kube_idx
        && conditions[i].status == ConditionStatus::Error
        && conditions[i].message == keys::KUBE_NODE_MSG_NC_OFFLINE
    {
        conditions[i] = PoolCondition {
            type_: PoolConditionType::KubeNode,
            status: ConditionStatus::Ok,
            message: String::new(),
        };
    }
    let errored = conditions.iter().any(|c| {
        matches!(
            c.type_,
            PoolConditionType::KubeNode | PoolConditionType::Lvm
        ) && c.status == ConditionStatus::Error
    });
    let since = heartbeat
        .map(|t| format!("no heartbeat since {t}"))
        .unwrap_or_else(|| "no heartbeat Lease".to_string());
    let (status, message) = match live {
        Liveness::Offline => (PoolStatus::Offline, since),
        Liveness::Unknown => (PoolStatus::Unknown, since),
        Liveness::Ready if locked_by_config => (
            PoolStatus::Locked,
            "node is locked by lockSchedConfig".to_string(),
        ),
        Liveness::Ready if errored => (
            PoolStatus::Locked,
            "a KubeNode or Lvm condition is Error".to_string(),
        ),
        Liveness::Ready => (PoolStatus::Ready, String::new()),
    };
    Desired {
        status,
        conditions,
        message,
    }
}

fn store(ctx: &Context, pool: StoragePool) -> Arc<StoragePool> {
    let p = Arc::new(pool);
    ctx.state().upsert_pool(Arc::clone(&p));
    p
}

/// Reconciles one StoragePool.
///
/// Flow: a pool gone from the cluster is forgotten by the plug-ins; one being deleted goes
/// to deletion handling. Otherwise: add the `obnvmf/node-sn=<name>` label if missing and
/// the `in-state` finalizer (one merge patch, resourceVersion-guarded); compute liveness from
/// the Lease `obnvmf/<name>` (`unknown` after `liveness.unknownAfter`, `offline` after
/// `liveness.offlineAfter` of silence) and locking from `lockSchedConfig` (node labels and
/// taints from the Node watch, else `spec.nodeInfo.labels`) and the KubeNode / Lvm
/// conditions; write `status.status`, `conditions` and `message` through the status
/// subresource when they differ. A pool whose Kubernetes Node is gone, that is not ready,
/// holds no volume and is older than `liveness.vanishedPoolGrace` is deleted.
/// Locking by the label `obnvmf/pool-scheduling-status=locked` needs nothing here: the
/// scheduler skips such pools.
///
/// Guarantees: idempotent; writes only when something changed, so the liveness clock's
/// periodic re-queue costs no API call.
///
/// Errors: API failures and conflicts (retried with back-off).
#[instrument(skip(ctx), fields(pool = %key.name))]
pub async fn reconcile(ctx: &Context, key: &ObjectKey) -> Result<Action> {
    let name = key.name.as_str();
    let Some(pool) = ctx.state().pool(name).map(|p| Arc::new(p.pool.clone())) else {
        ctx.run_plugin_forget(Kind::Pool, key).await?;
        return Ok(Action::Done);
    };
    if pool.metadata.deletion_timestamp.is_some() {
        handle_deletion(ctx, key, &pool).await?;
        ctx.run_plugin_deletions(PluginObject::Pool(&pool)).await?;
        return Ok(Action::Done);
    }
    let pool = ensure_meta(ctx, key, pool).await?;
    let now = ctx.clock.now();
    let (heartbeat, node) = {
        let s = ctx.state();
        (s.heartbeat(name), s.node(name).cloned())
    };
    let live = liveness(
        now,
        heartbeat,
        pool.metadata.creation_timestamp.as_ref().map(|t| t.0),
        &ctx.config.liveness,
    );
    let (node_labels, taints) = match &node {
        Some(n) => (n.labels.clone(), n.taints.clone()),
        None => (pool.spec.node_info.labels.clone(), Vec::new()),
    };
    let locked = config_locks(
        &ctx.config.scheduler.lock_sched_config,
        &node_labels,
        &taints,
    );
    let want = desired_status(&pool, live, heartbeat, locked);
    let cur = pool.status.clone().unwrap_or_default();
    let pool = if cur.status != Some(want.status)
        || cur.conditions != want.conditions
        || cur.message != want.message
    {
        let body = json!({
            "metadata": { "resourceVersion": pool.metadata.resource_version },
            "status": {
                "status": status_name(want.status),
                "conditions": want.conditions,
                "message": want.message,
            }
        });
        let out: StoragePool = ctx.patch(&key.namespace, name, &body, true).await?;
        info!(
            from = cur.status.map(status_name).unwrap_or(""),
            to = status_name(want.status),
            "pool status changed"
        );
        let stored = store(ctx, out);
        // The watch event of this write will find the state already up to date and retry
        // nothing: volumes waiting for a pool (this one back to ready, say) are retried here,
        // and the groups with a member here (a replica there may be lost or back).
        let waiting = ctx.state().unscheduled_volumes();
        ctx.enqueue_volumes(waiting);
        ctx.enqueue_groups_on(name);
        ctx.enqueue_unplaced_groups();
        stored
    } else {
        pool
    };
    report_to_volumes(ctx, name, cur.status, want.status, &want.message).await;
    if ctx.nodes_synced() && node.is_none() && want.status != PoolStatus::Ready {
        let empty = ctx.state().volumes_on(name).is_empty();
        let age = pool
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| elapsed(now, t.0))
            .unwrap_or(Duration::ZERO);
        if empty && age >= ctx.config.liveness.vanished_pool_grace {
            let api: Api<StoragePool> = Api::namespaced(ctx.client.clone(), &key.namespace);
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => info!("deleted the pool of a vanished node"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(Error::kube(format!("delete StoragePool {key}"), e)),
            }
        }
    }
    ctx.run_plugins(PluginObject::Pool(&pool)).await?;
    Ok(Action::Done)
}

/// Tells the volumes on a pool that is `offline` or `unknown` about it: a Warning event
/// [`POOL_NOT_READY`] on each, once per outage. Nothing of the volumes is written or deleted:
/// they wait for their node. When the pool is live again the warnings are forgotten, so the
/// next outage is reported again.
async fn report_to_volumes(
    ctx: &Context,
    pool: &str,
    was: Option<PoolStatus>,
    now: PoolStatus,
    message: &str,
) {
    let down = |s: PoolStatus| matches!(s, PoolStatus::Offline | PoolStatus::Unknown);
    let recovered = was.is_some_and(down) && !down(now);
    if !down(now) && !recovered {
        return;
    }
    let vols: Vec<Arc<AntstorVolume>> = {
        let s = ctx.state();
        s.volumes_on(pool)
            .iter()
            .filter_map(|k| s.volume(k).cloned())
            .collect()
    };
    for v in vols {
        if down(now) {
            let note = format!(
                "StoragePool {pool} is {} ({message}): the volume is kept, but unreachable \
                 until its node is back",
                status_name(now)
            );
            ctx.warn_once(v.as_ref(), POOL_NOT_READY, note).await;
        } else {
            ctx.clear_warning(&ObjectKey::of(v.as_ref()));
        }
    }
}

async fn ensure_meta(
    ctx: &Context,
    key: &ObjectKey,
    pool: Arc<StoragePool>,
) -> Result<Arc<StoragePool>> {
    let has_label = pool
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(labels::NODE_SN));
    let mut fins = pool.metadata.finalizers.clone().unwrap_or_default();
    let has_fin = fins.iter().any(|f| f == finalizers::IN_STATE);
    if has_label && has_fin {
        return Ok(pool);
    }
    fins.retain(|f| f != finalizers::IN_STATE);
    fins.push(finalizers::IN_STATE.to_string());
    let mut meta = json!({
        "resourceVersion": pool.metadata.resource_version,
        "finalizers": fins,
    });
    if !has_label {
        meta["labels"] = json!({ labels::NODE_SN: key.name });
    }
    let out: StoragePool = ctx
        .patch(
            &key.namespace,
            &key.name,
            &json!({ "metadata": meta }),
            false,
        )
        .await?;
    Ok(store(ctx, out))
}

async fn handle_deletion(ctx: &Context, key: &ObjectKey, pool: &StoragePool) -> Result<()> {
    let fins = pool.metadata.finalizers.clone().unwrap_or_default();
    if !fins.iter().any(|f| f == finalizers::IN_STATE) {
        return Ok(());
    }
    let left = ctx.state().volumes_on(&key.name);
    if !left.is_empty() {
        let names: Vec<String> = left.iter().map(ToString::to_string).collect();
        let msg = format!("Volumes left on node: {}", names.join(", "));
        if pool.status.as_ref().map(|s| s.message.as_str()) != Some(msg.as_str()) {
            let out: StoragePool = ctx
                .patch(
                    &key.namespace,
                    &key.name,
                    &json!({ "status": { "message": msg } }),
                    true,
                )
                .await?;
            store(ctx, out);
        }
        return Ok(());
    }
    let keep: Vec<String> = fins
        .into_iter()
        .filter(|f| f != finalizers::IN_STATE)
        .collect();
    let body = json!({
        "metadata": { "resourceVersion": pool.metadata.resource_version, "finalizers": keep }
    });
    let _: StoragePool = ctx.patch(&key.namespace, &key.name, &body, false).await?;
    info!("pool released");
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::testing::pool;
    use k8s_openapi::api::core::v1::NodeSelectorRequirement;
    use k8s_openapi::jiff::SignedDuration;

    #[test]
    fn liveness_thresholds() {
        let cfg = LivenessConfig::default();
        let now = Timestamp::now();
        let ago = |s: i64| Some(now - SignedDuration::from_secs(s));
        assert_eq!(liveness(now, ago(10), None, &cfg), Liveness::Ready);
        assert_eq!(liveness(now, ago(180), None, &cfg), Liveness::Unknown);
        assert_eq!(liveness(now, ago(86_400), None, &cfg), Liveness::Offline);
        assert_eq!(liveness(now, None, ago(10), &cfg), Liveness::Ready);
        assert_eq!(liveness(now, None, None, &cfg), Liveness::Unknown);
        // A clock behind the Lease counts as fresh.
        assert_eq!(liveness(now, ago(-60), None, &cfg), Liveness::Ready);
    }

    #[test]
    fn locking_by_config() {
        let cfg = LockSchedConfig {
            node_selector: vec![NodeSelectorRequirement {
                key: "maintenance".into(),
                operator: "Exists".into(),
                values: None,
            }],
            taints: vec![Toleration {
                key: Some("node.kubernetes.io/unschedulable".into()),
                operator: Some("Exists".into()),
                ..Toleration::default()
            }],
        };
        let mut l = std::collections::BTreeMap::new();
        assert!(!config_locks(&cfg, &l, &[]));
        l.insert("maintenance".to_string(), "yes".to_string());
        assert!(config_locks(&cfg, &l, &[]));
        let taint = Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        };
        assert!(config_locks(&cfg, &Default::default(), &[taint]));
    }

    #[test]
    fn desired_status_table() {
        let p = pool("n1", 1 << 30).build();
        let d = desired_status(&p, Liveness::Ready, None, false);
        assert_eq!(d.status, PoolStatus::Ready);
        assert_eq!(d.conditions, p.status.clone().unwrap().conditions);
        let d = desired_status(&p, Liveness::Unknown, None, false);
        assert_eq!(d.status, PoolStatus::Unknown);
        let d = desired_status(&p, Liveness::Offline, None, true);
        assert_eq!(d.status, PoolStatus::Offline);
        let d = desired_status(&p, Liveness::Ready, None, true);
        assert_eq!(d.status, PoolStatus::Locked);
        assert!(
            d.conditions
                .iter()
                .any(|c| c.type_ == PoolConditionType::KubeNode
                    && c.message == keys::KUBE_NODE_MSG_NC_OFFLINE)
        );
        // Unlocking turns the condition OK and the pool ready again.
        let mut locked = p.clone();
        locked.status.as_mut().unwrap().conditions = d.conditions.clone();
        let d = desired_status(&locked, Liveness::Ready, None, false);
        assert_eq!(d.status, PoolStatus::Ready);
        assert!(
            d.conditions
                .iter()
                .any(|c| c.type_ == PoolConditionType::KubeNode && c.status == ConditionStatus::Ok)
        );
    }
}
