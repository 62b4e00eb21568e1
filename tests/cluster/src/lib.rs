//! The cluster test kit: what every whole-cluster test and benchmark of this crate shares.
//! A cluster here is the real thing as `liteio-local` starts it (test API server, controller,
//! disk-agents and CSI drivers as processes, storage nodes in network namespaces or in
//! microVMs); the binaries are the workspace's own, found beside the test executable.
//!
//! - this file: start a cluster in a scratch directory, run a scenario with a deadline, shut
//!   it down and check that nothing of the run is left; object getters and waits; CSI calls;
//! - [`vm`]: compute nodes as microVMs and what runs in them (staging through their CSI
//!   node, fio, online growth);
//! - [`scenarios`]: the multi-node scenarios run on both engines (T1 file, T3 SPDK);
//! - [`e2e`]: the single-node end-to-end scenario of `liteio-local` (T1 and T2);
//! - [`host`]: `nvmf-check` as a host on a node: verifying and sequential writers, random I/O;
//! - [`migration`]: a VolumeMigration as the tests drive it (made by `kubectl liteio
//!   migrate`, the host's reports, the copy under way, the destination killed);
//! - [`objects`]: objects by name, nodes by name, group members, events, JSON-RPC on a
//!   node's SPDK.
//!
//! Must not be a dependency of any other crate: it sits above all of them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod e2e;
pub mod host;
pub mod migration;
pub mod objects;
pub mod scenarios;
pub mod vm;

pub use host::*;
pub use migration::*;
pub use objects::*;
pub use vm::*;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::Api;
use liteio_api::common::VolumeStatus;
use liteio_api::pool::PoolStatus;
use liteio_api::{AntstorVolume, StoragePool, keys};
use liteio_csi::csi::{CapacityRange, CreateVolumeRequest, Topology, TopologyRequirement};
use liteio_local::cluster::{Cluster, ClusterOptions, Role};
use liteio_local::demo::mount_capability;
use liteio_local::netns;
use liteio_local::wait_until;

pub const MIB: i64 = 1 << 20;

/// Where the workspace's binaries are: beside this test's executable
/// (`target/<profile>/deps/<test>-…` or `target/<profile>/examples/<example>` →
/// `target/<profile>`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// Fails (a test that should run must not pass without them) unless the components'
/// binaries are built in [`bin_dir`]; with this crate's `spdk` feature, the agent with SPDK.
/// Building this crate does not build them: cargo builds only a test's own package's
/// binaries.
pub fn require_binaries() {
    for b in [
        "test-apiserver",
        "node-disk-controller",
        "disk-agent",
        "csi-driver",
    ] {
        assert!(
            bin_dir().join(b).exists(),
            "{b} is not built in {}; run cargo build --workspace --bins first",
            bin_dir().display()
        );
    }
    #[cfg(feature = "spdk")]
    assert!(
        liteio_local::datapath::agent_has_spdk(&bin_dir()),
        "the disk-agent in {} was built without SPDK; run cargo build --workspace --bins --features liteio-agent/spdk first",
        bin_dir().display()
    );
}

/// Whether a cluster test cannot run here (no network namespaces: not root, no `ip netns`);
/// prints its one SKIP line. Binaries missing is a failure instead ([`require_binaries`]).
pub fn skip(test: &str) -> bool {
    if let Some(why) = netns::unsupported() {
        println!("SKIP {test}: {why}");
        return true;
    }
    require_binaries();
    false
}

pub fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("liteio-cluster-{tag}-{}", std::process::id()));
    let _ = netns::cleanup(&d);
    let _ = std::fs::remove_dir_all(&d);
    d
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Starts a cluster in `dir`, runs `scenario` on it within `limit`, then shuts it down and
/// checks that no namespace, link or process of the run is left.
pub fn with_cluster<F>(dir: &Path, opts: ClusterOptions, limit: Duration, scenario: F)
where
    F: for<'a> FnOnce(
        &'a mut Cluster,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<(), String>> + Send + 'a>,
    >,
{
    let rt = runtime();
    let started = std::time::Instant::now();
    let (result, record, undone) = rt.block_on(async {
        let mut c = match Cluster::start(dir, &bin_dir(), opts).await {
            Ok(c) => c,
            Err(e) => {
                let tails = liteio_local::cluster::log_tails(dir, 25);
                let _ = netns::cleanup(dir);
                panic!("the cluster did not start: {e}\n{tails}");
            }
        };
        let result = match tokio::time::timeout(limit, scenario(&mut c)).await {
            Ok(r) => r,
            Err(_) => Err(format!("timed out after {limit:?}")),
        };
        if result.is_err() {
            println!("{}", liteio_local::cluster::log_tails(dir, 25));
        }
        let record = c.record().clone();
        let undone = c.shutdown().await;
        keep_logs(dir);
        (result, record, undone)
    });
    println!("run took {:.1} s", started.elapsed().as_secs_f64());
    let left = netns::leftovers(&record);
    let _ = std::fs::remove_dir_all(dir);
    result.unwrap();
    assert!(
        left.is_empty(),
        "left behind: {left:?} (cleanup did {undone:?})"
    );
}

/// With `LITEIO_KEEP_CLUSTER_LOGS=<dir>`, the run's logs (every `*.log` under `dir`) are
/// copied to `<dir>/<run directory's name>/` before the run directory is removed.
fn keep_logs(dir: &Path) {
    let Some(to) = std::env::var_os("LITEIO_KEEP_CLUSTER_LOGS") else {
        return;
    };
    let to = PathBuf::from(to).join(dir.file_name().unwrap_or_default());
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "log")
                && let Ok(rel) = p.strip_prefix(dir)
            {
                let dest = to.join(rel);
                if let Some(parent) = dest.parent() {
                    let _ = std::fs::create_dir_all(parent);
                }
                let _ = std::fs::copy(&p, &dest);
            }
        }
    }
    println!("logs kept in {}", to.display());
}

pub fn err<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

/// Starts CreateVolume `name` through the CSI controller in the background (the call returns
/// only once the volume is scheduled); pinned to `node` when given (`positionAdvice:
/// MustLocal`: a consumer's topology alone is a preference, and volumes that can be served
/// remotely, as SPDK's can, may go elsewhere).
pub fn create_volume(
    c: &Cluster,
    name: &str,
    node: Option<String>,
) -> tokio::task::JoinHandle<Result<String, String>> {
    let params = match node {
        Some(_) => HashMap::from([("positionAdvice".to_string(), "MustLocal".to_string())]),
        None => HashMap::new(),
    };
    create_volume_with(c, name, node, params)
}

/// [`create_volume`] with StorageClass `parameters` (`positionAdvice`, ...); with
/// `positionAdvice` MustRemote, `node` is the consumer and the volume goes elsewhere.
pub fn create_volume_with(
    c: &Cluster,
    name: &str,
    node: Option<String>,
    parameters: HashMap<String, String>,
) -> tokio::task::JoinHandle<Result<String, String>> {
    create_volume_sized(c, name, node, parameters, 64 * MIB)
}

/// [`create_volume_with`] of `bytes`.
pub fn create_volume_sized(
    c: &Cluster,
    name: &str,
    node: Option<String>,
    parameters: HashMap<String, String>,
    bytes: i64,
) -> tokio::task::JoinHandle<Result<String, String>> {
    let ep = c.csi_controller_endpoint();
    let name = name.to_string();
    tokio::spawn(async move {
        let mut csi = liteio_csi::client::connect(&ep)
            .await
            .map_err(|e| e.to_string())?;
        let req = node.map(|n| {
            let t = Topology {
                segments: HashMap::from([(keys::labels::KUBE_HOSTNAME.to_string(), n)]),
            };
            TopologyRequirement {
                requisite: vec![t.clone()],
                preferred: vec![t],
            }
        });
        csi.controller
            .create_volume(CreateVolumeRequest {
                name,
                capacity_range: Some(CapacityRange {
                    required_bytes: bytes,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![mount_capability("xfs")],
                accessibility_requirements: req,
                parameters,
                ..Default::default()
            })
            .await
            .map(|r| {
                r.into_inner()
                    .volume
                    .map(|v| v.volume_id)
                    .unwrap_or_default()
            })
            .map_err(|s| format!("CreateVolume: {} ({:?})", s.message(), s.code()))
    })
}

pub async fn volume(c: &Cluster, name: &str) -> Option<AntstorVolume> {
    let api: Api<AntstorVolume> = Api::namespaced(c.kube().await.ok()?, keys::DEFAULT_NAMESPACE);
    api.get_opt(name).await.ok().flatten()
}

pub fn is_ready(v: &AntstorVolume) -> bool {
    v.status
        .as_ref()
        .is_some_and(|s| s.status == VolumeStatus::Ready)
}

pub async fn pool_status(c: &Cluster, node: &str) -> Option<PoolStatus> {
    let api: Api<StoragePool> = Api::namespaced(c.kube().await.ok()?, keys::DEFAULT_NAMESPACE);
    api.get_opt(node).await.ok().flatten()?.status?.status
}

/// Polls `check` until it holds or `secs` pass; the error names `what` and the log.
pub async fn eventually<F, Fut>(
    c: &Cluster,
    what: &str,
    secs: u64,
    log: Role,
    check: F,
) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_until(what, secs, &c.log(log), check)
        .await
        .map_err(|e| e.to_string())
}

/// `kubectl liteio <args>` with the cluster's kubeconfig; its output.
pub async fn kubectl_liteio(c: &Cluster, args: &[&str]) -> Result<String, String> {
    let out = tokio::process::Command::new(bin_dir().join("kubectl-liteio"))
        .arg("--kubeconfig")
        .arg(c.kubeconfig())
        .args(args)
        .output()
        .await
        .map_err(err("run kubectl-liteio"))?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if !out.status.success() {
        return Err(format!(
            "kubectl liteio {} failed: {text}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(text)
}

/// The node-stage secret kubelet hands the consumer's CSI node for volume `name`: the data
/// of the volume's Secret (`liteio-auth-<pv>`).
pub async fn stage_secrets(c: &Cluster, name: &str) -> Result<HashMap<String, String>, String> {
    let v: AntstorVolume = get(c, name).await?;
    secret_data(c, &v.auth_secret_name()).await
}
