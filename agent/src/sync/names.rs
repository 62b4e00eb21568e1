//! The names the sync derives from its objects to find things outside them: a volume's and a
//! snapshot's name in the engine, a node's host NQN. Volumes, snapshots, migrations and
//! data controls all ask; this room asks none of them back.

use kube::{Api, ResourceExt};
use liteio_api::{AntstorSnapshot, AntstorVolume, StoragePool, keys, naming};

use crate::context::Ctx;
use crate::error::Result;

/// Name of the volume in the engine: the recorded LV / lvol name, else the object name.
pub fn volume_engine_name(vol: &AntstorVolume) -> String {
    vol.spec
        .kernel_lvol
        .as_ref()
        .map(|l| l.name.clone())
        .filter(|n| !n.is_empty())
        .or_else(|| {
            vol.spec
                .spdk_lvol
                .as_ref()
                .map(|l| l.name.clone())
                .filter(|n| !n.is_empty())
        })
        .unwrap_or_else(|| vol.name_any())
}

/// Name of the snapshot in the engine.
pub fn snapshot_engine_name(snap: &AntstorSnapshot) -> String {
    [&snap.spec.kernel_lvol.name, &snap.spec.spdk_lvol.name]
        .into_iter()
        .find(|n| !n.is_empty())
        .cloned()
        .unwrap_or_else(|| naming::snapshot_name(&snap.spec.origin_vol_name))
}

/// The host NQN of `node` (its StoragePool's, else the one derived from its name).
pub async fn node_host_nqn(ctx: &Ctx, node: &str) -> Result<String> {
    let pools: Api<StoragePool> = Api::namespaced(ctx.client.clone(), keys::DEFAULT_NAMESPACE);
    let pool = ctx
        .timed("get", format!("StoragePool {node}"), pools.get_opt(node))
        .await?;
    Ok(pool
        .as_ref()
        .and_then(|p| p.host_nqn())
        .map_or_else(|| naming::host_nqn(node), str::to_string))
}
