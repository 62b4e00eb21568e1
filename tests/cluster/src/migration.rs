//! A VolumeMigration as the cluster tests drive it: made by `kubectl liteio migrate` (named
//! after the volume and the time), the host's part reported as a consumer's CSI node does
//! it, waited on until its copy runs, its destination's agent killed mid-copy.

use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use liteio_api::VolumeMigration;
use liteio_api::keys::{self, finalizers};
use liteio_api::migration::ConnectStatus;
use liteio_local::cluster::{Cluster, Role};
use serde_json::json;

use crate::{err, eventually, get_opt, kubectl_liteio, node_index};

/// The migration of volume `vol` (`kubectl liteio migrate` names it after the volume and
/// the time).
pub async fn migration_of(c: &Cluster, vol: &str) -> Option<VolumeMigration> {
    let api: Api<VolumeMigration> = Api::namespaced(c.kube().await.ok()?, keys::DEFAULT_NAMESPACE);
    let l = api.list(&kube::api::ListParams::default()).await.ok()?;
    l.items
        .into_iter()
        .find(|m| m.spec.source_volume.name == vol)
}

/// `kubectl liteio migrate <volume>` with the cluster's kubeconfig.
pub async fn kubectl_migrate(c: &Cluster, volume: &str) -> Result<String, String> {
    kubectl_liteio(c, &["migrate", volume]).await
}

/// Migration `name`'s host part as the consumer's CSI node writes it: `hostConnectStatus`
/// and the host's finalizer, `connected` or not. Retried over conflicts with the agents'
/// and the controller's writes; a migration already gone is fine once disconnected.
pub async fn host_reports(c: &Cluster, name: &str, connected: bool) -> Result<(), String> {
    let api: Api<VolumeMigration> = Api::namespaced(
        c.kube().await.map_err(err("kube"))?,
        keys::DEFAULT_NAMESPACE,
    );
    let mut last = String::new();
    for _ in 0..50 {
        // The CSI node of this host may have released a deleted migration already.
        let Some(m) = api.get_opt(name).await.map_err(err("get migration"))? else {
            return if connected {
                Err(format!("migration {name} is gone"))
            } else {
                Ok(())
            };
        };
        let mut fins: Vec<String> = m.finalizers().to_vec();
        fins.retain(|f| f != finalizers::MIGRATE_HOST_CONNECTED);
        if connected {
            fins.push(finalizers::MIGRATE_HOST_CONNECTED.into());
        }
        let status = if connected {
            ConnectStatus::Connected
        } else {
            ConnectStatus::Disconnected
        };
        let body = json!({
            "metadata": {"finalizers": fins, "resourceVersion": m.resource_version()},
            "spec": {"migrationInfo": {"hostConnectStatus": status}},
        });
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 && !connected => return Ok(()),
            Err(e) => last = format!("patch migration {name}: {e}"),
        }
    }
    Err(last)
}

/// Waits until the source's agent reports migration `name`'s copy running with some pages
/// copied.
pub async fn copy_under_way(c: &Cluster, name: &str, secs: u64) -> Result<(), String> {
    eventually(
        c,
        "the copy under way",
        secs,
        Role::Controller(0),
        || async {
            get_opt::<VolumeMigration>(c, name).await.is_some_and(|m| {
                let j = &m.spec.migration_info.job_progress;
                j.status == "Copying" && j.total_write_pages > 0
            })
        },
    )
    .await
}

/// SIGKILLs the agent of migration `name`'s destination node and waits until the migration
/// is in `Error`; returns that node's index.
pub async fn kill_destination(c: &mut Cluster, name: &str) -> Result<usize, String> {
    let dest_node = get_opt::<VolumeMigration>(c, name)
        .await
        .ok_or("migration gone")?
        .spec
        .dest_volume
        .target_node_id;
    let k = node_index(c, &dest_node)?;
    c.kill(Role::Agent(k)).await.map_err(err("kill"))?;
    eventually(
        c,
        "the migration in Error",
        120,
        Role::Controller(0),
        || async {
            get_opt::<VolumeMigration>(c, name)
                .await
                .is_some_and(|m| m.status_name() == liteio_api::migration::STATUS_ERROR)
        },
    )
    .await?;
    Ok(k)
}
