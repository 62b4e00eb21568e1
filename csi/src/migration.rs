//! The host CSI node's part of a hot migration (`docs/migration.md`, "The CSI node's part"):
//! a controller over the VolumeMigrations labelled `migrate.obnvmf/host-node-id=<this node>`
//! that drives [`crate::multipath`]:
//!
//! - `SetupPipe` / `Syncing`, once `spec.destVolume.spdk` names the destination's export:
//!   connect a second path to it ([`multipath::connect_second_path`]), then report
//!   `spec.migrationInfo.hostConnectStatus: Connected` and add the finalizer
//!   [`finalizers::MIGRATE_HOST_CONNECTED`];
//! - `Cleaning` (or `Finished`), or deleted after the switch: drop the path to the source's
//!   export ([`multipath::disconnect_path`]), then report `Disconnected` and remove the
//!   finalizer;
//! - deleted before the switch (cancelled): drop the path to the destination's export, then
//!   report `Disconnected` and remove the finalizer, so that the object can go.
//!
//! The second path is connected with the options of the first: this node's host NQN and host
//! id, and the DH-HMAC-CHAP keys the first path's controller holds, read from its sysfs
//! attributes ([`nvme::controller_keys`]). So the node needs no access to the volume's Secret:
//! kubelet handed the keys to NodeStageVolume, and the kernel keeps them (also those rotated
//! since, which NodePublishVolume gives to the controller).
//!
//! Errors are logged with the migration's name and retried with a per-object back-off
//! ([`DriverConfig::migration_retry`], doubling to [`DriverConfig::migration_retry_max`]); a
//! node without `/dev/nvme-fabrics` logs the error and retries, like any other. Nothing
//! logged or written holds a secret: connect errors show the options with secrets masked,
//! key errors name sysfs attributes.

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use liteio_api::auth::VolumeKeys;
use liteio_api::keys::{finalizers, labels, managers};
use liteio_api::migration::{ConnectStatus, MigrationPhase, ResultStatus};
use liteio_api::{SpdkTarget, VolumeMigration};
use serde_json::json;
use tracing::{debug, info, instrument, warn};

use crate::config::DriverConfig;
use crate::error::{CsiError, ErrorKind, Result};
use crate::k8s;
use crate::multipath::{self, MigrationPaths, PathConnect};
use crate::nvme::{self, Fabrics};

/// How often a connected second path is checked again while the copy runs (a lost path is
/// connected again).
pub const RESYNC: Duration = Duration::from_secs(60);
/// Delay before retrying a write that met a newer version of the object.
const CONFLICT_RETRY: Duration = Duration::from_millis(200);
/// How long running reconciles may take to finish after shutdown.
const DRAIN: Duration = Duration::from_secs(5);

/// A path of subsystem `nqn` to one export's listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathTo {
    /// The subsystem (the same on both exports).
    pub nqn: String,
    /// The listener's address.
    pub address: String,
    /// The listener's port.
    pub port: String,
}

impl PathTo {
    fn of(nqn: &str, t: &SpdkTarget) -> Self {
        PathTo {
            nqn: nqn.to_string(),
            address: t.address.clone(),
            port: t.svc_id.clone(),
        }
    }
}

/// What this node does for one migration ([`plan`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Not this node's migration, or nothing to do in its state.
    Nothing,
    /// Connect the second path to the destination, then report `Connected` (when not yet).
    Connect(Box<MigrationPaths>),
    /// The switch is done: drop the path to the source, then report `Disconnected` (when not
    /// yet).
    DropSource(PathTo),
    /// Cancelled before the switch: drop the path to the destination (when it is known), then
    /// remove the finalizer (when present).
    Cancel(Option<PathTo>),
}

/// Whether `m` carries this node's finalizer.
pub fn has_finalizer(m: &VolumeMigration) -> bool {
    m.finalizers()
        .iter()
        .any(|f| f == finalizers::MIGRATE_HOST_CONNECTED)
}

/// True once the host's I/O went to the destination: from then on a deletion no longer
/// cancels (the controller's rule too).
pub fn switched(m: &VolumeMigration) -> bool {
    matches!(
        m.phase(),
        MigrationPhase::Cleaning | MigrationPhase::Finished
    ) || m.spec.migration_info.auto_switch.status == Some(ResultStatus::Success)
}

/// What `node` does for `m` (pure; see the module documentation for the flow).
///
/// Guarantees: [`Step::Nothing`] for a migration whose host is another node
/// ([`multipath::is_host`]) or whose source export is unknown; once this node's report is
/// written (status and finalizer as the step wants them) the same object plans a step whose
/// report is a no-op, so running it again changes nothing in the cluster.
pub fn plan(m: &VolumeMigration, node: &str) -> Step {
    let nqn = &m.spec.source_volume.spdk.subsys_nqn;
    if !multipath::is_host(m, node) || nqn.is_empty() {
        return Step::Nothing;
    }
    let deleting = m.metadata.deletion_timestamp.is_some();
    let status = m.spec.migration_info.host_connect_status;
    let phase = m.phase();
    if deleting && !switched(m) {
        let dest = &m.spec.dest_volume.spdk;
        let path =
            (!dest.address.is_empty() && !dest.svc_id.is_empty()).then(|| PathTo::of(nqn, dest));
        return Step::Cancel(path);
    }
    let cleaning = matches!(phase, MigrationPhase::Cleaning | MigrationPhase::Finished);
    if deleting || cleaning {
        let pending =
            has_finalizer(m) || (!deleting && status != Some(ConnectStatus::Disconnected));
        return if pending {
            Step::DropSource(PathTo::of(nqn, &m.spec.source_volume.spdk))
        } else {
            Step::Nothing
        };
    }
    if matches!(phase, MigrationPhase::SetupPipe | MigrationPhase::Syncing)
        && let Some(paths) = multipath::host_migration(m, node)
    {
        return Step::Connect(Box::new(paths));
    }
    Step::Nothing
}

/// Connects the second path of `paths` on this host (blocking): nothing when sysfs shows a
/// path to the destination's listener already; else with the keys of a present path of the
/// subsystem (the first path). No present path at all means the volume is not attached here:
/// an error, since a second path needs a first one to follow.
pub fn connect(
    sysfs: &Path,
    fabrics: &dyn Fabrics,
    host_nqn: &str,
    host_id: Option<&str>,
    paths: &MigrationPaths,
) -> Result<PathConnect> {
    let existing = multipath::sysfs_paths(sysfs, &paths.nqn);
    let new = &paths.new;
    if let Some(p) = existing
        .iter()
        .find(|p| p.present() && p.leads_to(&new.address, &new.svc_id))
    {
        return Ok(PathConnect::AlreadyConnected(p.controller.clone()));
    }
    let first = existing
        .iter()
        .filter(|p| p.present())
        .min_by_key(|p| p.state != "live")
        .ok_or_else(|| {
            CsiError::FailedPrecondition(format!(
                "this host has no path to {}: the volume is not attached here, so there is no \
                 first path to add a second one to",
                paths.nqn
            ))
        })?;
    let keys: Option<VolumeKeys> = nvme::controller_keys(sysfs, &first.controller)?;
    multipath::connect_path(fabrics, &existing, new, host_nqn, host_id, keys.as_ref())
}

/// Per-object retry delays: `base`, doubling on each further failure up to `cap`; a success
/// forgets the object's failures.
#[derive(Debug)]
struct Retries {
    base: Duration,
    cap: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl Retries {
    fn failed(&self, key: &str) -> (u32, Duration) {
        let mut f = self
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = f.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        let delay = self
            .base
            .checked_mul(1u32 << (*n - 1).min(20))
            .unwrap_or(self.cap)
            .min(self.cap);
        (*n, delay)
    }

    fn succeeded(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(key);
    }
}

/// What the reconciler works with.
pub struct Ctx {
    client: Client,
    cfg: Arc<DriverConfig>,
    fabrics: Arc<dyn Fabrics>,
    retries: Retries,
}

impl Ctx {
    /// The context of node `cfg.node_id`, connecting through `fabrics`.
    pub fn new(client: Client, cfg: Arc<DriverConfig>, fabrics: Arc<dyn Fabrics>) -> Self {
        let retries = Retries {
            base: cfg.migration_retry,
            cap: cfg.migration_retry_max.max(cfg.migration_retry),
            failures: Mutex::new(HashMap::new()),
        };
        Ctx {
            client,
            cfg,
            fabrics,
            retries,
        }
    }

    fn api(&self, m: &VolumeMigration) -> Api<VolumeMigration> {
        let ns = m.namespace().unwrap_or_else(|| self.cfg.namespace.clone());
        Api::namespaced(self.client.clone(), &ns)
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CsiError::Internal(format!("blocking task failed: {e}")))?
}

/// Writes this node's report on `m`: `hostConnectStatus: status` and the finalizer present or
/// not, in one merge patch guarded by `m`'s resourceVersion (the finalizer list is replaced
/// whole, so a concurrent change must make it fail rather than be overwritten). Nothing when
/// `m` shows both already. A migration that is gone needs no report.
async fn report(
    ctx: &Ctx,
    m: &VolumeMigration,
    status: ConnectStatus,
    finalizer: bool,
) -> Result<()> {
    let already = m.spec.migration_info.host_connect_status == Some(status);
    if already && has_finalizer(m) == finalizer {
        return Ok(());
    }
    let mut fins: Vec<String> = m
        .finalizers()
        .iter()
        .filter(|f| *f != finalizers::MIGRATE_HOST_CONNECTED)
        .cloned()
        .collect();
    if finalizer {
        fins.push(finalizers::MIGRATE_HOST_CONNECTED.to_string());
    }
    let body = json!({
        "metadata": {"resourceVersion": m.resource_version(), "finalizers": fins},
        "spec": {"migrationInfo": {"hostConnectStatus": status}},
    });
    let pp = PatchParams {
        field_manager: Some(managers::CSI.to_string()),
        ..PatchParams::default()
    };
    let name = m.name_any();
    match ctx.api(m).patch(&name, &pp, &Patch::Merge(&body)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(CsiError::kube(
            format!("report hostConnectStatus {status:?} on VolumeMigration {name}"),
            e,
        )),
    }
}

/// Drops this host's path `p` (blocking, idempotent); returns the controller deleted.
fn drop_path(sysfs: &Path, p: &PathTo) -> Result<Option<String>> {
    multipath::disconnect_path(sysfs, &p.nqn, &p.address, &p.port)
}

/// Reconciles one migration whose host may be this node.
///
/// Flow: [`plan`] decides; the host work (sysfs, the fabrics device) runs on the blocking
/// pool; then [`report`] writes the outcome. Guarantees: the report follows the host work,
/// never precedes it, so `Connected` means the second path exists and a removed finalizer
/// means the path it guarded is gone; idempotent (a connected path is found in sysfs, a
/// dropped one is not looked for again once reported). Assumes the source and destination
/// exports serve the same NQN ([`multipath::host_migration`]). Errors: host errors (no
/// fabrics device, a refused connect, the last live path) and API errors; the caller retries
/// them with back-off.
#[instrument(skip_all, fields(migration = %m.name_any()))]
pub async fn reconcile(m: Arc<VolumeMigration>, ctx: Arc<Ctx>) -> Result<Action> {
    let name = m.name_any();
    let sysfs = ctx.cfg.sysfs_root.clone();
    match plan(&m, &ctx.cfg.node_id) {
        Step::Nothing => Ok(Action::await_change()),
        Step::Connect(paths) => {
            let host_nqn = nvme::host_nqn(&ctx.cfg.hostnqn_path, &ctx.cfg.node_id)?;
            let host_id = nvme::host_id(&ctx.cfg.hostid_path);
            let fabrics = Arc::clone(&ctx.fabrics);
            let to = format!("{}:{}", paths.new.address, paths.new.svc_id);
            let outcome = blocking(move || {
                connect(
                    &sysfs,
                    fabrics.as_ref(),
                    &host_nqn,
                    host_id.as_deref(),
                    &paths,
                )
            })
            .await?;
            if let PathConnect::Connected(c) = &outcome {
                info!(migration = %name, controller = %c, to = %to, "connected the second path to the migration's destination");
            }
            report(&ctx, &m, ConnectStatus::Connected, true).await?;
            Ok(Action::requeue(RESYNC))
        }
        Step::DropSource(p) => {
            let to = format!("{}:{}", p.address, p.port);
            let dropped = blocking(move || drop_path(&sysfs, &p)).await?;
            if let Some(c) = dropped {
                info!(migration = %name, controller = %c, to = %to, "dropped the path to the migration's source");
            }
            report(&ctx, &m, ConnectStatus::Disconnected, false).await?;
            Ok(Action::await_change())
        }
        Step::Cancel(p) => {
            if let Some(p) = p {
                let to = format!("{}:{}", p.address, p.port);
                let dropped = blocking(move || drop_path(&sysfs, &p)).await?;
                if let Some(c) = dropped {
                    info!(migration = %name, controller = %c, to = %to, "migration cancelled: dropped the path to its destination");
                }
            }
            if has_finalizer(&m) {
                report(&ctx, &m, ConnectStatus::Disconnected, false).await?;
            }
            Ok(Action::await_change())
        }
    }
}

fn error_policy(m: Arc<VolumeMigration>, e: &CsiError, ctx: Arc<Ctx>) -> Action {
    let name = m.name_any();
    if e.kind() == ErrorKind::Aborted {
        debug!(migration = %name, "conflict; retrying with a fresh copy");
        return Action::requeue(CONFLICT_RETRY);
    }
    let (attempt, delay) = ctx.retries.failed(&k8s::describe(m.as_ref()));
    warn!(migration = %name, kind = e.kind().as_str(), attempt, ?delay, error = %e.chain(), "cannot do this node's part of the migration; retrying");
    Action::requeue(delay)
}

/// The label selector of the migrations whose host is `node`.
pub fn selector(node: &str) -> String {
    format!("{}={node}", labels::MIGRATE_HOST_NODE_ID)
}

/// Runs the controller over the migrations whose host is `ctx`'s node until `shutdown`
/// completes; then running reconciles get a bounded time to finish. A node name that cannot
/// be a label value (so no migration can name it) is logged and nothing runs.
pub async fn run(ctx: Ctx, shutdown: impl Future<Output = ()> + Send + 'static) {
    let node = ctx.cfg.node_id.clone();
    if !k8s::is_label_value(&node) {
        warn!(node = %node, "the node name is no label value, so no VolumeMigration can name this node as its host; not watching migrations");
        return;
    }
    let api: Api<VolumeMigration> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let ctx = Arc::new(ctx);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (drain_tx, mut drain_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = drain_tx.send(true);
        let _ = stop_tx.send(());
    });
    info!(node = %node, "watching the VolumeMigrations of this node's volumes");
    let wrapped = |m: Arc<VolumeMigration>, ctx: Arc<Ctx>| async move {
        let key = k8s::describe(m.as_ref());
        let res = reconcile(m, Arc::clone(&ctx)).await;
        if res.is_ok() {
            ctx.retries.succeeded(&key);
        }
        res
    };
    let controller = Controller::new(api, watcher::Config::default().labels(&selector(&node)))
        .graceful_shutdown_on(async move {
            let _ = stop_rx.await;
        })
        .run(wrapped, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                debug!(error = %e, "migration controller event");
            }
        });
    tokio::select! {
        () = controller => {}
        () = async {
            let _ = drain_rx.wait_for(|s| *s).await;
            tokio::time::sleep(DRAIN).await;
        } => debug!("migration controller did not drain in time; dropping it"),
    }
    info!(node = %node, "stopped watching VolumeMigrations");
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn target(address: &str, port: &str) -> SpdkTarget {
        SpdkTarget {
            subsys_nqn: "nqn.x".into(),
            trans_type: "TCP".into(),
            address: address.into(),
            svc_id: port.into(),
            ..SpdkTarget::default()
        }
    }

    fn mig(phase: MigrationPhase) -> VolumeMigration {
        let mut m = VolumeMigration::new("m1", Default::default());
        m.metadata.labels = Some(BTreeMap::from([(
            labels::MIGRATE_HOST_NODE_ID.to_string(),
            "n1".to_string(),
        )]));
        m.spec.source_volume.spdk = target("10.0.0.1", "4420");
        m.spec.dest_volume.spdk = target("10.0.0.2", "4421");
        m.status = Some(liteio_api::migration::VolumeMigrationStatus {
            phase: Some(phase),
            ..Default::default()
        });
        m
    }

    fn deleted(mut m: VolumeMigration) -> VolumeMigration {
        m.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        m
    }

    fn reported(mut m: VolumeMigration, s: ConnectStatus, fin: bool) -> VolumeMigration {
        m.spec.migration_info.host_connect_status = Some(s);
        m.metadata.finalizers = fin.then(|| vec![finalizers::MIGRATE_HOST_CONNECTED.to_string()]);
        m
    }

    #[test]
    fn steps_follow_the_phase_and_the_deletion() {
        use MigrationPhase::*;
        let src = PathTo::of("nqn.x", &target("10.0.0.1", "4420"));
        let dst = PathTo::of("nqn.x", &target("10.0.0.2", "4421"));
        for p in [Pending, CreatingVolume] {
            assert_eq!(plan(&mig(p), "n1"), Step::Nothing, "{p:?}");
        }
        for p in [SetupPipe, Syncing] {
            assert!(matches!(plan(&mig(p), "n1"), Step::Connect(_)), "{p:?}");
            assert_eq!(plan(&mig(p), "n2"), Step::Nothing, "{p:?}");
        }
        // Destination not exported yet: nothing to connect.
        let mut m = mig(SetupPipe);
        m.spec.dest_volume.spdk = SpdkTarget::default();
        assert_eq!(plan(&m, "n1"), Step::Nothing);
        assert_eq!(plan(&deleted(m), "n1"), Step::Cancel(None));

        let connected = reported(mig(Cleaning), ConnectStatus::Connected, true);
        assert_eq!(plan(&connected, "n1"), Step::DropSource(src.clone()));
        let done = reported(mig(Cleaning), ConnectStatus::Disconnected, false);
        assert_eq!(plan(&done, "n1"), Step::Nothing);
        assert_eq!(plan(&deleted(done), "n1"), Step::Nothing);

        // Deleted before the switch: cancel; after it (success seen in Syncing): as Cleaning.
        let m = reported(mig(Syncing), ConnectStatus::Connected, true);
        assert_eq!(plan(&deleted(m.clone()), "n1"), Step::Cancel(Some(dst)));
        let mut sw = m;
        sw.spec.migration_info.auto_switch.status = Some(ResultStatus::Success);
        assert!(matches!(plan(&sw, "n1"), Step::Connect(_)));
        assert_eq!(plan(&deleted(sw), "n1"), Step::DropSource(src));
    }

    #[test]
    fn retries_double_up_to_the_cap_and_a_success_resets_them() {
        let r = Retries {
            base: Duration::from_secs(2),
            cap: Duration::from_secs(10),
            failures: Mutex::new(HashMap::new()),
        };
        let d: Vec<u64> = (0..4).map(|_| r.failed("a").1.as_secs()).collect();
        assert_eq!(d, [2, 4, 8, 10]);
        assert_eq!(r.failed("b").1.as_secs(), 2);
        r.succeeded("a");
        assert_eq!(r.failed("a"), (1, Duration::from_secs(2)));
    }
}
