//! The cluster test kit: what every whole-cluster test and benchmark of this crate shares.
//! A cluster here is the real thing as `liteio-local` starts it (test API server, controller,
//! disk-agents and CSI drivers as processes, storage nodes in network namespaces or in
//! microVMs); the binaries are the workspace's own, found beside the test executable.
//!
//! - this file: start a cluster in a scratch directory, run a scenario with a deadline, shut
//!   it down and check that nothing of the run is left; object getters and waits; CSI calls;
//!   VM nodes and what runs in them (fio, online growth);
//! - [`scenarios`]: the multi-node scenarios run on both engines (T1 file, T3 SPDK);
//! - [`e2e`]: the single-node end-to-end scenario of `liteio-local` (T1 and T2);
//! - [`host`]: `nvmf-check` as a host on a node: verifying and sequential writers, random I/O;
//! - [`objects`]: objects by name, nodes by name, group members, events, JSON-RPC on a
//!   node's SPDK.
//!
//! Must not be a dependency of any other crate: it sits above all of them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod e2e;
pub mod host;
pub mod objects;
pub mod scenarios;

pub use host::*;
pub use objects::*;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::Api;
use liteio_api::common::VolumeStatus;
use liteio_api::pool::PoolStatus;
use liteio_api::{AntstorVolume, StoragePool, keys};
use liteio_csi::csi::{
    CapacityRange, ControllerExpandVolumeRequest, CreateVolumeRequest, NodeExpandVolumeRequest,
    Topology, TopologyRequirement,
};
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

/// The migration of volume `vol` (`kubectl liteio migrate` names it after the volume and
/// the time).
pub async fn migration_of(c: &Cluster, vol: &str) -> Option<liteio_api::VolumeMigration> {
    let api: Api<liteio_api::VolumeMigration> =
        Api::namespaced(c.kube().await.ok()?, keys::DEFAULT_NAMESPACE);
    let l = api.list(&kube::api::ListParams::default()).await.ok()?;
    l.items
        .into_iter()
        .find(|m| m.spec.source_volume.name == vol)
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

/// `kubectl liteio migrate <volume>` with the cluster's kubeconfig.
pub async fn kubectl_migrate(c: &Cluster, volume: &str) -> Result<String, String> {
    kubectl_liteio(c, &["migrate", volume]).await
}

/// The node-stage secret kubelet hands the consumer's CSI node for volume `name`: the data
/// of the volume's Secret (`liteio-auth-<pv>`).
pub async fn stage_secrets(c: &Cluster, name: &str) -> Result<HashMap<String, String>, String> {
    let client = c.kube().await.map_err(err("kube"))?;
    let v = Api::<AntstorVolume>::namespaced(client.clone(), keys::DEFAULT_NAMESPACE)
        .get(name)
        .await
        .map_err(err("get the volume"))?;
    let s = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client, keys::DEFAULT_NAMESPACE)
        .get(&v.auth_secret_name())
        .await
        .map_err(err("get the volume's Secret"))?;
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

/// Whether a test with a VM node on `kernel` cannot run here (no network namespaces, no
/// bootable VM, no socat to reach the guest's CSI socket); prints its one SKIP line.
pub fn skip_vm(test: &str, kernel: &liteio_local::vm::Kernel) -> bool {
    if skip(test) {
        return true;
    }
    let why = liteio_local::vm::unavailable(kernel).or_else(|| {
        liteio_local::vm::which("socat")
            .is_none()
            .then(|| "no socat (Debian package socat)".to_string())
    });
    if let Some(why) = why {
        println!("SKIP {test}: {why}");
        return true;
    }
    false
}

/// Boots compute node `n` as a microVM with `kernel` ([`Cluster::add_vm_node`]) and prints
/// its boot and readiness times.
pub async fn vm_node(
    c: &mut Cluster,
    n: u8,
    kernel: liteio_local::vm::Kernel,
) -> Result<liteio_local::vm_node::VmNode, String> {
    let started = std::time::Instant::now();
    let node = c.add_vm_node(n, kernel).await.map_err(|e| e.to_string())?;
    println!(
        "VM node {} at {} ready after {:.1}s (boot {:.1}s)",
        node.name,
        node.address,
        started.elapsed().as_secs_f64(),
        node.vm.booted_in().as_secs_f64()
    );
    Ok(node)
}

/// The size of the file system mounted at `path` in the guest of `node`, in bytes.
pub async fn fs_size(node: &mut liteio_local::vm_node::VmNode, path: &str) -> Result<u64, String> {
    let out = node
        .vm
        .sh_ok(
            &format!("df --output=size -B1 {path} | tail -n 1"),
            std::time::Duration::from_secs(120),
        )
        .await
        .map_err(|e| e.to_string())?;
    out.trim()
        .parse()
        .map_err(|e| format!("df said {out:?}: {e}"))
}

/// Grows volume `id`, published at `target` with file system `fs`, to `bytes` online as the
/// CO does (ControllerExpandVolume, then NodeExpandVolume on the node); returns the file
/// system's size before and after, and how long the node's part took.
#[allow(clippy::too_many_arguments)]
pub async fn grow_online(
    node: &mut liteio_local::vm_node::VmNode,
    ctl: &mut liteio_csi::client::CsiClient,
    csi: &mut liteio_csi::client::CsiClient,
    id: &str,
    staging: &str,
    target: &str,
    fs: &str,
    bytes: i64,
) -> Result<(u64, u64, std::time::Duration), String> {
    let before = fs_size(node, target).await?;
    let grow = CapacityRange {
        required_bytes: bytes,
        limit_bytes: 0,
    };
    ctl.controller
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: id.to_string(),
            capacity_range: Some(grow),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("controller expand: {}", e.message()))?;
    let t = std::time::Instant::now();
    csi.node
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: id.to_string(),
            volume_path: target.into(),
            staging_target_path: staging.into(),
            capacity_range: Some(grow),
            volume_capability: Some(mount_capability(fs)),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("node expand {fs}: {}", e.message()))?;
    let took = t.elapsed();
    let after = fs_size(node, target).await?;
    Ok((before, after, took))
}

/// Creates `name` (`bytes`) through CSI for consumer `node` with `positionAdvice:
/// MustRemote` (stored on a storage node, exported to the consumer) and waits until it is
/// ready; returns its volume id.
pub async fn remote_volume_for(
    c: &Cluster,
    name: &str,
    node: &str,
    bytes: i64,
) -> Result<String, String> {
    let params = HashMap::from([("positionAdvice".to_string(), "MustRemote".to_string())]);
    let id = create_volume_sized(c, name, Some(node.to_string()), params, bytes)
        .await
        .map_err(err("join"))??;
    eventually(c, &format!("{name} ready"), 120, Role::Agent(1), || async {
        volume(c, name).await.is_some_and(|v| is_ready(&v))
    })
    .await?;
    Ok(id)
}

/// Starts fio in the guest of `node` in the background: 4 KiB random writes at queue depth
/// 8 with crc32c verification on a 32 MiB `file`, for `runtime` seconds (or until SIGINT);
/// returns once fio is writing (its file has its size).
pub async fn start_fio(
    node: &mut liteio_local::vm_node::VmNode,
    file: &str,
    runtime: u32,
) -> Result<(), String> {
    let step = std::time::Duration::from_secs(120);
    node.vm
        .sh_ok(
            &format!(
                "cd /tmp; setsid fio --name=t4 --filename={file} --size=32M --rw=randwrite --bs=4k \
                 --iodepth=8 --ioengine=libaio --direct=1 --verify=crc32c --do_verify=1 --time_based \
                 --runtime={runtime} --output-format=json --output=/tmp/fio.json >/tmp/fio.out 2>&1 </dev/null 3>&- &"
            ),
            step,
        )
        .await
        .map_err(|e| e.to_string())?;
    let writing = format!("test \"$(stat -c %s {file} 2>/dev/null)\" = 33554432");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !node
        .vm
        .sh(&writing, step)
        .await
        .map_err(|e| e.to_string())?
        .success()
    {
        if std::time::Instant::now() > deadline {
            return Err("fio did not start writing within 60 s".into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    Ok(())
}

/// Whether fio still runs in the guest.
pub async fn fio_running(node: &mut liteio_local::vm_node::VmNode) -> Result<bool, String> {
    node.vm
        .sh("pgrep -x fio", std::time::Duration::from_secs(120))
        .await
        .map(|o| o.success())
        .map_err(|e| e.to_string())
}

/// What fio reported.
#[derive(Debug)]
pub struct FioResult {
    /// fio's job error (0: none).
    pub error: serde_json::Value,
    /// Writes completed.
    pub writes: u64,
    /// The longest write, in milliseconds.
    pub max_write_ms: f64,
    /// fio's own output and the guest kernel's NVMe messages.
    pub log: String,
}

/// Waits up to `limit` for fio (of [`start_fio`]) to end and reads its report; when it does
/// not end, the error says what the kernel's controllers and fio were doing.
pub async fn fio_result(
    node: &mut liteio_local::vm_node::VmNode,
    limit: std::time::Duration,
) -> Result<FioResult, String> {
    let step = std::time::Duration::from_secs(120);
    let deadline = std::time::Instant::now() + limit;
    while fio_running(node).await? {
        if std::time::Instant::now() > deadline {
            let why = node
                .vm
                .sh("for c in /sys/class/nvme/nvme*; do echo \"$c $(cat $c/state) $(cat $c/address)\"; done; cat /tmp/fio.out; dmesg | tail -n 40", step)
                .await
                .map(|o| o.output)
                .unwrap_or_default();
            return Err(format!(
                "fio did not finish within {}s:\n{why}",
                limit.as_secs()
            ));
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    let json = node
        .vm
        .sh_ok("cat /tmp/fio.json", step)
        .await
        .map_err(|e| e.to_string())?;
    let log = node
        .vm
        .sh(
            "cat /tmp/fio.out; dmesg | grep -iE 'nvme|I/O error' | tail -n 30",
            step,
        )
        .await
        .map_err(|e| e.to_string())?
        .output;
    let start = json
        .find('{')
        .ok_or_else(|| format!("no fio JSON: {json}\n{log}"))?;
    let report: serde_json::Value =
        serde_json::from_str(&json[start..]).map_err(|e| format!("{e}: {json}"))?;
    let job = &report["jobs"][0];
    Ok(FioResult {
        error: job["error"].clone(),
        writes: job["write"]["total_ios"].as_u64().unwrap_or(0),
        max_write_ms: job["write"]["clat_ns"]["max"].as_f64().unwrap_or(0.0) / 1e6,
        log,
    })
}
