//! The cluster's objects as the tests read them: any LiteIO object in the `obnvmf`
//! namespace by name, the nodes of a run by name, a group's members, the pools' free space,
//! the events about an object, and JSON-RPC on a node's SPDK.

use std::collections::HashMap;
use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Secret;
use kube::api::ListParams;
use kube::{Api, Resource};
use liteio_api::keys::{self, labels};
use liteio_api::{AntstorVolume, AntstorVolumeGroup, StoragePool};
use liteio_local::cluster::Cluster;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::err;

/// The object `name` of kind `K` in LiteIO's namespace.
pub async fn get<K>(c: &Cluster, name: &str) -> Result<K, String>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(
        c.kube().await.map_err(err("kube"))?,
        keys::DEFAULT_NAMESPACE,
    );
    api.get(name)
        .await
        .map_err(|e| format!("get {} {name}: {e}", K::kind(&())))
}

/// [`get`], `None` when it does not exist or the API server did not answer.
pub async fn get_opt<K>(c: &Cluster, name: &str) -> Option<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(c.kube().await.ok()?, keys::DEFAULT_NAMESPACE);
    api.get_opt(name).await.ok().flatten()
}

/// The index (1-based) of the run's node called `name`.
pub fn node_index(c: &Cluster, name: &str) -> Result<usize, String> {
    (1..=c.opts.nodes)
        .find(|&k| c.node_name(k) == name)
        .ok_or_else(|| format!("{name} is not a node of this run"))
}

/// The index of the node volume `name` is placed on.
pub async fn node_of(c: &Cluster, name: &str) -> Result<usize, String> {
    let v: AntstorVolume = get(c, name).await?;
    node_index(c, v.target_node().ok_or("no target node")?)
}

/// The member volumes of multi-disk or replicated volume `pv` (label
/// `obnvmf/vol-group-name`), in the API server's order.
pub async fn group_volumes(c: &Cluster, pv: &str) -> Result<Vec<AntstorVolume>, String> {
    let api: Api<AntstorVolume> = Api::namespaced(
        c.kube().await.map_err(err("kube"))?,
        keys::DEFAULT_NAMESPACE,
    );
    let lp = ListParams::default().labels(&format!("{}={pv}", labels::VOL_GROUP_NAME));
    Ok(api.list(&lp).await.map_err(err("list members"))?.items)
}

/// The data of Secret `name` in LiteIO's namespace, as text (what kubelet hands a CSI node
/// as the stage secrets of a volume whose Secret it is).
pub async fn secret_data(c: &Cluster, name: &str) -> Result<HashMap<String, String>, String> {
    let s: Secret = get(c, name).await?;
    s.data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| {
            String::from_utf8(v.0)
                .map(|v| (k.clone(), v))
                .map_err(|_| format!("Secret key {k} is not text"))
        })
        .collect()
}

/// Group `name`'s members in the group's (the raid's) order: (member, node).
pub async fn group_members(c: &Cluster, name: &str) -> Result<Vec<(String, String)>, String> {
    let g: AntstorVolumeGroup = get(c, name).await?;
    Ok(g.spec
        .volumes
        .iter()
        .map(|m| (m.vol_id.name.clone(), m.target_node_name.clone()))
        .collect())
}

/// Each node's free pool bytes as its agent reports them, in node order.
pub async fn free_bytes(c: &Cluster) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for k in 1..=c.opts.nodes {
        let p: StoragePool = get(c, &c.node_name(k)).await?;
        out.push(p.reported_free_bytes());
    }
    Ok(out)
}

/// `(type, note)` of the events with `reason` about the object called `name`.
pub async fn events(
    c: &Cluster,
    name: &str,
    reason: &str,
) -> Result<Vec<(String, String)>, String> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(
        c.kube().await.map_err(err("kube"))?,
        keys::DEFAULT_NAMESPACE,
    );
    Ok(api
        .list(&Default::default())
        .await
        .map_err(err("list events"))?
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .map(|e| (e.type_.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect())
}

/// One JSON-RPC call on node `k`'s SPDK (its agent's socket), off the runtime's threads.
pub async fn rpc(
    c: &Cluster,
    k: usize,
    method: &'static str,
    params: Value,
) -> Result<Value, String> {
    let sock = c.node_dir(k).join("spdk.sock");
    tokio::task::spawn_blocking(move || liteio_tests::spdk_rpc::rpc(&sock, method, params))
        .await
        .map_err(err("join"))?
        .map_err(|e| format!("{method} on node {k}: {e}"))
}

/// The `key` of each element of the array `v` (an RPC's list), as strings.
pub fn names(v: &Value, key: &str) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x[key].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}
