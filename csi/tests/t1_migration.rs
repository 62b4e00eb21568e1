//! T1: the host CSI node's part of a hot migration (`liteio_csi::migration`) against the test
//! API server, on the recorded sysfs tree of `tests/fixtures/multipath/` (the source's path
//! `nvme0` to 10.0.0.12:4421, the destination's `nvme2` to 10.0.0.13:4430, another volume's
//! `nvme1`) and a fake fabrics device that plays the kernel: it records each options string
//! and makes the new controller appear in sysfs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/sysfs.rs"]
mod recorded;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use liteio_api::auth::VolumeKeys;
use liteio_api::keys::{finalizers, labels};
use liteio_api::migration::{ConnectStatus, MigrationPhase, VolumeInfo};
use liteio_api::{SpdkTarget, VolumeMigration, VolumeMigrationSpec};
use liteio_csi::DriverConfig;
use liteio_csi::k8s::{self, Waited};
use liteio_csi::migration;
use liteio_csi::nvme::{ConnectOptions, Fabrics};
use liteio_test_apiserver::TestApiServer;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const NS: &str = "obnvmf";
const NODE: &str = "node-3";
const NQN: &str = "nqn.2021-03.com.alipay.ob:uuid:5e0c7d1a-2b3c-4d5e-8f90-a1b2c3d4e5f6";
const HOST_NQN: &str = "nqn.2021-03.com.alipay.host:uuid:node-3";
const HOST_ID: &str = "6b1c4f0e-3d2a-4e5b-9c8d-7f6e5d4c3b2a";
const SRC: (&str, &str) = ("10.0.0.12", "4421");
const DST: (&str, &str) = ("10.0.0.13", "4430");
/// Every test body runs under this bound; each wait for the cluster under [`WAIT`].
const TEST_TIMEOUT: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(20);

/// A writable copy of the recorded sysfs tree under `root`, without the controllers in `drop`.
fn sysfs(root: &Path, drop: &[&str]) -> PathBuf {
    let dir = root.join("sys");
    recorded::copy_two_paths(&dir, drop);
    dir
}

fn deleted_controller(sysfs: &Path, ctrl: &str) -> String {
    std::fs::read_to_string(
        sysfs
            .join("class/nvme")
            .join(ctrl)
            .join("delete_controller"),
    )
    .unwrap()
}

/// A fabrics device standing in for the kernel: fails the first `failures` connects as a node
/// without `/dev/nvme-fabrics` does, then records the options string and creates controller
/// `nvme2` in `sysfs` for the address it names.
#[derive(Debug)]
struct FakeKernel {
    sysfs: PathBuf,
    failures: AtomicU32,
    seen: Mutex<Vec<String>>,
}

impl FakeKernel {
    fn new(sysfs: &Path, failures: u32) -> Arc<Self> {
        Arc::new(Self {
            sysfs: sysfs.to_path_buf(),
            failures: AtomicU32::new(failures),
            seen: Mutex::new(Vec::new()),
        })
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

impl Fabrics for FakeKernel {
    fn add_ctrl(&self, options: &ConnectOptions) -> io::Result<String> {
        if self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "/dev/nvme-fabrics does not exist: load the nvme-tcp kernel module",
            ));
        }
        let opts = options.expose().to_string();
        self.seen.lock().unwrap().push(opts.clone());
        let o: HashMap<&str, &str> = opts
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .collect();
        let dir = self.sysfs.join("class/nvme/nvme2");
        std::fs::create_dir_all(&dir)?;
        for (attr, value) in [
            ("subsysnqn", o["nqn"].to_string()),
            ("transport", "tcp".into()),
            (
                "address",
                format!("traddr={},trsvcid={}", o["traddr"], o["trsvcid"]),
            ),
            ("state", "live".into()),
            ("delete_controller", String::new()),
        ] {
            std::fs::write(dir.join(attr), format!("{value}\n").trim_start())?;
        }
        Ok("instance=2,cntlid=36865\n".into())
    }
}

struct Env {
    server: TestApiServer,
    client: kube::Client,
    dir: tempfile::TempDir,
    sysfs: PathBuf,
    kernel: Arc<FakeKernel>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Env {
    /// The test API server, a sysfs tree without `drop`, and the migration watch of node
    /// [`NODE`] connecting through a [`FakeKernel`] that fails its first `failures` connects.
    async fn start(drop: &[&str], failures: u32) -> Self {
        let server = TestApiServer::start().await.expect("test API server");
        let client = server.client().await.expect("client");
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(NS.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let sysfs = sysfs(dir.path(), drop);
        std::fs::write(dir.path().join("hostnqn"), format!("{HOST_NQN}\n")).unwrap();
        std::fs::write(dir.path().join("hostid"), format!("{HOST_ID}\n")).unwrap();
        let mut cfg = DriverConfig::new(NODE);
        // A host that can authenticate (the tests give the kernel's answers).
        cfg.host_capabilities = Some(liteio_csi::nvme::HostCapabilities {
            kernel: "6.12.0-test".into(),
            dhchap: true,
            tls: true,
            dhchap_evidence: "given by the test".into(),
        });
        cfg.sysfs_root = sysfs.clone();
        cfg.hostnqn_path = dir.path().join("hostnqn");
        cfg.hostid_path = dir.path().join("hostid");
        cfg.fabrics_dev = dir.path().join("no-such-device");
        cfg.migration_retry = Duration::from_millis(50);
        cfg.migration_retry_max = Duration::from_millis(200);
        let kernel = FakeKernel::new(&sysfs, failures);
        let ctx = migration::Ctx::new(client.clone(), Arc::new(cfg), kernel.clone());
        let (stop, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(migration::run(ctx, async {
            let _ = rx.await;
        }));
        Env {
            server,
            client,
            dir,
            sysfs,
            kernel,
            stop: Some(stop),
            task: Some(task),
        }
    }

    fn api(&self) -> Api<VolumeMigration> {
        Api::namespaced(self.client.clone(), NS)
    }

    /// Stops the watch (it must end on its own, within the bound) and the server.
    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            tokio::time::timeout(WAIT, t)
                .await
                .expect("the migration watch did not stop")
                .unwrap();
        }
        drop(self.dir);
        self.server.shutdown().await;
    }
}

fn target(address: &str, port: &str) -> SpdkTarget {
    SpdkTarget {
        subsys_nqn: NQN.into(),
        trans_type: "TCP".into(),
        address: address.into(),
        svc_id: port.into(),
        addr_fam: "IPv4".into(),
        sn: "5e0c7d1a2b3c4d5e8f90".into(),
        ns_uuid: "5e0c7d1a-2b3c-4d5e-8f90-a1b2c3d4e5f6".into(),
        bdev_name: String::new(),
    }
}

/// A migration whose host is `host`, as the controller and the agents leave it in `phase`:
/// with `host_status` and `fins` written.
async fn migration(
    env: &Env,
    name: &str,
    host: &str,
    phase: MigrationPhase,
    host_status: Option<ConnectStatus>,
    fins: &[&str],
) -> VolumeMigration {
    let info = |node: &str, (a, p): (&str, &str)| VolumeInfo {
        namespace: NS.into(),
        name: format!("vol-{node}"),
        target_node_id: node.into(),
        host_node_id: host.into(),
        spdk: target(a, p),
    };
    let mut m = VolumeMigration::new(
        name,
        VolumeMigrationSpec {
            source_volume: info("node-1", SRC),
            dest_volume: info("node-2", DST),
            ..VolumeMigrationSpec::default()
        },
    );
    m.metadata.namespace = Some(NS.into());
    m.metadata.labels = Some(BTreeMap::from([(
        labels::MIGRATE_HOST_NODE_ID.to_string(),
        host.to_string(),
    )]));
    m.metadata.finalizers = Some(fins.iter().map(|f| f.to_string()).collect());
    m.spec.migration_info.host_connect_status = host_status;
    env.api().create(&PostParams::default(), &m).await.unwrap();
    env.api()
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": phase, "status": "Working"}})),
        )
        .await
        .unwrap()
}

fn host_status(m: &VolumeMigration) -> Option<ConnectStatus> {
    m.spec.migration_info.host_connect_status
}

fn has(m: &VolumeMigration, f: &str) -> bool {
    m.finalizers().iter().any(|x| x == f)
}

/// Waits (through a watch) until `cond` holds on migration `name`.
async fn wait(
    env: &Env,
    name: &str,
    what: &str,
    cond: impl Fn(&VolumeMigration) -> bool + Send + 'static,
) -> Waited<VolumeMigration> {
    let w = k8s::wait_for(env.api(), "VolumeMigration", name, WAIT, cond)
        .await
        .unwrap();
    assert!(!matches!(w, Waited::TimedOut), "{name}: {what}");
    w
}

async fn reported(env: &Env, name: &str, status: ConnectStatus, fin: bool) -> VolumeMigration {
    let what = format!("hostConnectStatus {status:?} and the finalizer present: {fin}");
    match wait(env, name, &what, move |m| {
        host_status(m) == Some(status) && has(m, finalizers::MIGRATE_HOST_CONNECTED) == fin
    })
    .await
    {
        Waited::Done(m) => m,
        w => panic!("{name}: {what}: {w:?}"),
    }
}

async fn bounded<F: std::future::Future<Output = ()>>(f: F) {
    tokio::time::timeout(TEST_TIMEOUT, f)
        .await
        .expect("test timed out");
}

#[tokio::test]
async fn setup_pipe_connects_the_second_path_once_with_the_first_paths_keys() {
    bounded(async {
        // The host has the source's path only, authenticated with the volume's keys.
        let env = Env::start(&["nvme2"], 0).await;
        let keys = VolumeKeys::generate(false).unwrap();
        let nvme0 = env.sysfs.join("class/nvme/nvme0");
        std::fs::write(
            nvme0.join("dhchap_secret"),
            format!("{}\n", keys.host.expose()),
        )
        .unwrap();
        std::fs::write(
            nvme0.join("dhchap_ctrl_secret"),
            format!("{}\n", keys.ctrl.expose()),
        )
        .unwrap();
        migration(
            &env,
            "m1",
            NODE,
            MigrationPhase::SetupPipe,
            None,
            &[finalizers::IN_STATE],
        )
        .await;
        let m = reported(&env, "m1", ConnectStatus::Connected, true).await;
        // The controller's finalizer is kept.
        assert!(has(&m, finalizers::IN_STATE), "{:?}", m.finalizers());
        let seen = env.kernel.seen();
        assert_eq!(
            seen,
            [format!(
                "nqn={NQN},transport=tcp,traddr={},trsvcid={},hostnqn={HOST_NQN},hostid={HOST_ID},\
                 dhchap_secret={},dhchap_ctrl_secret={},reconnect_delay=1,ctrl_loss_tmo=600",
                DST.0,
                DST.1,
                keys.host.expose(),
                keys.ctrl.expose()
            )]
        );
        // The object holds no secret.
        let text = serde_json::to_string(&m).unwrap();
        assert!(!text.contains(keys.host.expose()) && !text.contains(keys.ctrl.expose()));

        // Another pass (the report lost, the phase moved on): the path is in sysfs already,
        // so nothing is connected again, and the report is written again.
        env.api()
            .patch(
                "m1",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"migrationInfo": {"hostConnectStatus": "Unknown"}}})),
            )
            .await
            .unwrap();
        env.api()
            .patch_status(
                "m1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Syncing"}})),
            )
            .await
            .unwrap();
        reported(&env, "m1", ConnectStatus::Connected, true).await;
        assert_eq!(env.kernel.seen().len(), 1, "connected twice");
        assert_eq!(deleted_controller(&env.sysfs, "nvme0"), "");
        env.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_node_without_the_fabrics_device_retries_until_it_has_one() {
    bounded(async {
        // Connected without keys; the first two connects find no fabrics device.
        let env = Env::start(&["nvme2"], 2).await;
        migration(&env, "m1", NODE, MigrationPhase::SetupPipe, None, &[]).await;
        reported(&env, "m1", ConnectStatus::Connected, true).await;
        assert_eq!(env.kernel.failures.load(Ordering::SeqCst), 0);
        let seen = env.kernel.seen();
        assert_eq!(seen.len(), 1);
        assert!(!seen[0].contains("dhchap"), "{}", seen[0]);
        env.stop().await;
    })
    .await;
}

#[tokio::test]
async fn cleaning_drops_the_source_path_and_the_finalizer() {
    bounded(async {
        let env = Env::start(&[], 0).await;
        migration(
            &env,
            "m1",
            NODE,
            MigrationPhase::Cleaning,
            Some(ConnectStatus::Connected),
            &[finalizers::IN_STATE, finalizers::MIGRATE_HOST_CONNECTED],
        )
        .await;
        let m = reported(&env, "m1", ConnectStatus::Disconnected, false).await;
        assert_eq!(m.finalizers(), [finalizers::IN_STATE.to_string()]);
        assert_eq!(deleted_controller(&env.sysfs, "nvme0"), "1");
        assert_eq!(deleted_controller(&env.sysfs, "nvme2"), "");
        assert_eq!(deleted_controller(&env.sysfs, "nvme1"), "");
        assert!(env.kernel.seen().is_empty());
        env.stop().await;
    })
    .await;
}

#[tokio::test]
async fn deletion_before_the_switch_drops_the_destination_path_and_lets_the_object_go() {
    bounded(async {
        let env = Env::start(&[], 0).await;
        migration(
            &env,
            "m1",
            NODE,
            MigrationPhase::Syncing,
            Some(ConnectStatus::Connected),
            &[finalizers::MIGRATE_HOST_CONNECTED],
        )
        .await;
        env.api()
            .delete("m1", &DeleteParams::default())
            .await
            .unwrap();
        let w = wait(&env, "m1", "the migration is gone", |_| false).await;
        assert!(matches!(w, Waited::Gone), "{w:?}");
        assert_eq!(deleted_controller(&env.sysfs, "nvme2"), "1");
        assert_eq!(deleted_controller(&env.sysfs, "nvme0"), "");
        assert!(env.kernel.seen().is_empty());
        env.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_migration_of_another_host_is_ignored() {
    bounded(async {
        let env = Env::start(&["nvme2"], 0).await;
        // Created first, so that this node's watch has seen it (or not) by the time it acts
        // on its own migration.
        // Its destination is another listener, so that a connect for it would show.
        migration(
            &env,
            "other",
            "node-4",
            MigrationPhase::SetupPipe,
            None,
            &[],
        )
        .await;
        env.api()
            .patch(
                "other",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"destVolume": {"spdk": {"address": "10.0.0.14"}}}})),
            )
            .await
            .unwrap();
        let created = env.api().get("other").await.unwrap();
        migration(&env, "mine", NODE, MigrationPhase::SetupPipe, None, &[]).await;
        reported(&env, "mine", ConnectStatus::Connected, true).await;
        // Nothing was written to the other host's migration, and no path was connected for it.
        let other = env.api().get("other").await.unwrap();
        assert_eq!(other.resource_version(), created.resource_version());
        assert_ne!(host_status(&other), Some(ConnectStatus::Connected));
        assert!(other.finalizers().is_empty(), "{:?}", other.finalizers());
        let seen = env.kernel.seen();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(
            seen[0].contains(&format!("traddr={}", DST.0)),
            "{}",
            seen[0]
        );
        env.stop().await;
    })
    .await;
}
