//! Scale on one machine: a cluster of storage nodes in network namespaces (file engine),
//! thousands of volumes created through the CSI controller in one burst, every one ready.
//!
//! Per run (a fresh cluster each time) it prints the time until every CreateVolume was
//! answered and until every AntstorVolume was `Ready`, volumes per second, CreateVolume and
//! create-to-ready latencies (p50/p99/max), the resident memory (VmRSS, VmHWM) of the API
//! server, the CSI controller, the node-disk-controller and each agent once all are ready,
//! then deletes every volume through CSI DeleteVolume and times until the objects and their
//! files are gone. After the last run it prints the worst figure of each kind.
//!
//! A benchmark, not a test: `cargo test` never runs it. It needs root (network namespaces)
//! and the component binaries built with the same profile:
//!
//! ```text
//! cargo build --release -p liteio-test-apiserver -p liteio-controller -p liteio-agent -p liteio-csi --bins
//! cargo bench -p liteio-local --bench scale                     # 3 nodes, 3,000 volumes, 3 runs
//! cargo bench -p liteio-local --bench scale -- --volumes 300 --runs 1 --concurrency 32
//! cargo bench -p liteio-local --bench scale --profile dev       # with the debug binaries
//! ```
//!
//! Every flag also reads an environment variable (`LITEIO_SCALE_VOLUMES`, …; see `--help`).
//! Volumes are 16 MiB sparse files by default (`--size-mib`): nothing is written to them, so
//! the figures are the control plane's, not the disk's. Each asks for node (i mod nodes)+1
//! as its topology, as the external provisioner does for pods spread over the nodes
//! (`--no-topology` leaves placement to the scheduler alone); each node's pool has room for
//! twice its share.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use clap::Parser;
use futures::StreamExt;
use kube::Api;
use kube::runtime::watcher;
use liteio_api::common::VolumeStatus;
use liteio_api::{AntstorVolume, keys};
use liteio_csi::client::CsiClient;
use liteio_csi::csi::{
    CapacityRange, CreateVolumeRequest, DeleteVolumeRequest, Topology, TopologyRequirement,
};
use liteio_local::cluster::{Cluster, ClusterOptions, Role};
use liteio_local::demo::mount_capability;
use liteio_local::{Engine, netns};
use tokio::sync::{Mutex, Semaphore};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// Volume names: `<prefix>-<index>`.
const PREFIX: &str = "scale";

/// Scale benchmark: N nodes, M volumes through CSI CreateVolume in one burst.
#[derive(Debug, Parser)]
#[command(name = "scale")]
struct Args {
    /// Storage nodes (each in its own network namespace).
    #[arg(long, env = "LITEIO_SCALE_NODES", default_value_t = 3)]
    nodes: usize,
    /// Volumes created in the burst.
    #[arg(long, env = "LITEIO_SCALE_VOLUMES", default_value_t = 3000)]
    volumes: usize,
    /// CreateVolume / DeleteVolume calls in flight at once.
    #[arg(long, env = "LITEIO_SCALE_CONCURRENCY", default_value_t = 64)]
    concurrency: usize,
    /// Size of each volume in MiB (a sparse file).
    #[arg(long, env = "LITEIO_SCALE_SIZE_MIB", default_value_t = 16)]
    size_mib: u64,
    /// Size of each node's pool in GiB (0: room for every volume on one node, plus a half).
    #[arg(long, env = "LITEIO_SCALE_POOL_GIB", default_value_t = 0)]
    pool_gib: u64,
    /// Runs, each on a fresh cluster.
    #[arg(long, env = "LITEIO_SCALE_RUNS", default_value_t = 3)]
    runs: usize,
    /// Seconds allowed for each phase (all created, all ready, all deleted).
    #[arg(long, env = "LITEIO_SCALE_DEADLINE", default_value_t = 900)]
    deadline: u64,
    /// Directory of the component binaries (default: this benchmark's profile directory).
    #[arg(long, env = "LITEIO_SCALE_BIN_DIR")]
    bin_dir: Option<PathBuf>,
    /// Send no accessibility requirement: the scheduler alone picks the pools (its
    /// `LeastResource` priority packs them, so most volumes land on one node). By default
    /// volume i asks for node (i mod nodes)+1, as the external provisioner does for pods
    /// spread over the nodes.
    #[arg(long, env = "LITEIO_SCALE_NO_TOPOLOGY")]
    no_topology: bool,
    /// The node-disk-controller's volume workers (`workers.volume`; default: its own, 16).
    /// `--volume-workers 1` measures the single worker per kind of earlier versions.
    #[arg(long, env = "LITEIO_SCALE_VOLUME_WORKERS")]
    volume_workers: Option<u32>,
    /// Keep the run directories (logs) of successful runs.
    #[arg(long)]
    keep: bool,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// Resident memory of one process, in KiB.
#[derive(Debug, Clone, Copy, Default)]
struct Mem {
    rss_kib: u64,
    hwm_kib: u64,
}

/// What one run measured.
#[derive(Debug, Default)]
struct Figures {
    /// Start of the burst to the last CreateVolume answer.
    all_answered: Duration,
    /// Start of the burst to the last volume seen Ready.
    all_ready: Duration,
    /// CreateVolume latency (first attempt to success), sorted.
    create_latency: Vec<Duration>,
    /// Start of a volume's CreateVolume to the volume seen Ready, sorted.
    ready_latency: Vec<Duration>,
    /// CreateVolume attempts answered with a retryable code (and retried).
    retries: usize,
    /// Volumes per node once all were ready.
    per_node: BTreeMap<String, usize>,
    /// Memory before the burst (cluster idle) and once all were ready, by process.
    mem_idle: BTreeMap<String, Mem>,
    mem_ready: BTreeMap<String, Mem>,
    /// Start of the delete burst to the last DeleteVolume answer / the last object gone.
    delete_answered: Duration,
    all_gone: Duration,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn millis(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// VmRSS and VmHWM of `pid` (`/proc/<pid>/status`). A node's processes are started through
/// `nsenter`, which execs the program in place, so the pid is the program's.
fn memory(pid: u32) -> Result<Mem> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    let field = |name: &str| -> Result<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| anyhow!("{path} has no {name}"))
    };
    Ok(Mem {
        rss_kib: field("VmRSS:")?,
        hwm_kib: field("VmHWM:")?,
    })
}

fn roles(nodes: usize) -> Vec<(String, Role)> {
    let mut v = vec![
        ("test-apiserver".to_string(), Role::ApiServer),
        ("csi-controller".to_string(), Role::CsiController),
        ("node-disk-controller".to_string(), Role::Controller(0)),
    ];
    for k in 1..=nodes {
        v.push((format!("disk-agent node-{k}"), Role::Agent(k)));
    }
    v
}

fn measure_memory(c: &Cluster) -> Result<BTreeMap<String, Mem>> {
    roles(c.opts.nodes)
        .into_iter()
        .map(|(name, r)| {
            let pid = c.pid(r).ok_or_else(|| anyhow!("{name} is not running"))?;
            Ok((name, memory(pid)?))
        })
        .collect()
}

/// Ready volumes seen by a watch: name → first time seen Ready; and which names exist.
#[derive(Debug, Default)]
struct Seen {
    ready: HashMap<String, Instant>,
    present: HashMap<String, AntstorVolume>,
    /// True once the watch has listed everything at least once.
    synced: bool,
}

impl Seen {
    fn apply(&mut self, v: AntstorVolume) {
        let Some(name) = v.metadata.name.clone() else {
            return;
        };
        if !name.starts_with(PREFIX) {
            return;
        }
        if v.status
            .as_ref()
            .is_some_and(|s| s.status == VolumeStatus::Ready)
        {
            self.ready.entry(name.clone()).or_insert_with(Instant::now);
        }
        self.present.insert(name, v);
    }
}

/// Follows every AntstorVolume of the namespace into `seen` until the task is aborted.
fn follow(api: Api<AntstorVolume>, seen: Arc<Mutex<Seen>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        let mut relisted: HashMap<String, AntstorVolume> = HashMap::new();
        while let Some(ev) = stream.next().await {
            let Ok(ev) = ev else {
                // The watcher retries by itself; back off a little.
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let mut s = seen.lock().await;
            match ev {
                watcher::Event::Apply(v) => s.apply(v),
                watcher::Event::Delete(v) => {
                    if let Some(n) = v.metadata.name.as_deref() {
                        s.present.remove(n);
                    }
                }
                watcher::Event::Init => relisted.clear(),
                watcher::Event::InitApply(v) => {
                    if let Some(n) = v.metadata.name.clone() {
                        relisted.insert(n, v);
                    }
                }
                watcher::Event::InitDone => {
                    s.present.clear();
                    for (_, v) in relisted.drain() {
                        s.apply(v);
                    }
                    s.synced = true;
                }
            }
        }
    })
}

fn retryable(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Aborted
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Unavailable
            | tonic::Code::ResourceExhausted
    )
}

/// Outcome of one volume's CreateVolume.
struct Created {
    name: String,
    started: Instant,
    result: Result<(String, Duration), String>,
    retries: usize,
}

/// CreateVolume for `name`, retried (as the external provisioner does) on a retryable code
/// until `deadline`.
async fn create_one(
    mut csi: CsiClient,
    name: String,
    node: Option<String>,
    bytes: u64,
    deadline: Instant,
) -> Created {
    let topology = node.map(|n| {
        let t = Topology {
            segments: HashMap::from([(keys::labels::KUBE_HOSTNAME.to_string(), n)]),
        };
        TopologyRequirement {
            requisite: vec![t.clone()],
            preferred: vec![t],
        }
    });
    let started = Instant::now();
    let mut retries = 0;
    let mut backoff = Duration::from_millis(100);
    loop {
        let req = CreateVolumeRequest {
            name: name.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
                limit_bytes: 0,
            }),
            volume_capabilities: vec![mount_capability("xfs")],
            accessibility_requirements: topology.clone(),
            ..Default::default()
        };
        let res = csi.controller.create_volume(req).await;
        let result = match res {
            Ok(r) => match r.into_inner().volume {
                Some(v) => Ok((v.volume_id, started.elapsed())),
                None => Err("CreateVolume answered without a volume".to_string()),
            },
            Err(s) if retryable(s.code()) && Instant::now() + backoff < deadline => {
                retries += 1;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
            Err(s) => Err(format!("{:?}: {}", s.code(), s.message())),
        };
        return Created {
            name,
            started,
            result,
            retries,
        };
    }
}

/// DeleteVolume for `id`, retried on a retryable code until `deadline`.
async fn delete_one(mut csi: CsiClient, id: String, deadline: Instant) -> Result<(), String> {
    let mut backoff = Duration::from_millis(100);
    loop {
        let req = DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        };
        match csi.controller.delete_volume(req).await {
            Ok(_) => return Ok(()),
            Err(s) if retryable(s.code()) && Instant::now() + backoff < deadline => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(s) => return Err(format!("{id}: {:?}: {}", s.code(), s.message())),
        }
    }
}

/// Groups error texts: the most frequent first, with counts.
fn summarize_errors(errors: &[String]) -> String {
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    for e in errors {
        *by.entry(e.as_str()).or_default() += 1;
    }
    let mut v: Vec<_> = by.into_iter().collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.1));
    v.iter()
        .take(10)
        .map(|(e, n)| format!("  {n} × {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Why volumes are not ready: by (status, target node, message), with example names.
fn summarize_unready(seen: &Seen, names: &[String]) -> String {
    let mut by: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for n in names {
        if seen.ready.contains_key(n) {
            continue;
        }
        let why = match seen.present.get(n) {
            None => "no AntstorVolume".to_string(),
            Some(v) => {
                let (status, msg) = v
                    .status
                    .as_ref()
                    .map(|s| (format!("{:?}", s.status), s.message.clone()))
                    .unwrap_or_else(|| ("no status".into(), String::new()));
                format!(
                    "status {status}, target {:?}, message {msg:?}",
                    v.target_node()
                )
            }
        };
        by.entry(why).or_default().push(n.as_str());
    }
    by.iter()
        .map(|(why, ns)| {
            let eg: Vec<_> = ns.iter().take(3).copied().collect();
            format!("  {} × {why} (e.g. {})", ns.len(), eg.join(", "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn wait_for(
    what: &str,
    seen: &Arc<Mutex<Seen>>,
    deadline: Instant,
    done: impl Fn(&Seen) -> bool,
) -> Result<()> {
    loop {
        if done(&*seen.lock().await) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("{what}: deadline passed");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One run on a started cluster: the burst, all ready, memory, the deletes, all gone.
async fn scenario(c: &Cluster, args: &Args) -> Result<Figures> {
    let mut f = Figures::default();
    let client = c.kube().await?;
    let api: Api<AntstorVolume> = Api::namespaced(client, keys::DEFAULT_NAMESPACE);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let watch = follow(api, Arc::clone(&seen));
    let phase = Duration::from_secs(args.deadline);
    let result = async {
        wait_for("first list", &seen, Instant::now() + phase, |s| s.synced).await?;
        f.mem_idle = measure_memory(c)?;
        let csi = liteio_csi::client::connect(&c.csi_controller_endpoint()).await?;
        let names: Vec<String> = (0..args.volumes)
            .map(|i| format!("{PREFIX}-{i:05}"))
            .collect();
        let bytes = args.size_mib * MIB;

        // The burst.
        let start = Instant::now();
        let deadline = start + phase;
        let permits = Arc::new(Semaphore::new(args.concurrency.max(1)));
        let mut tasks = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            let permit = Arc::clone(&permits).acquire_owned().await?;
            let (csi, name) = (csi.clone(), name.clone());
            let node = (!args.no_topology).then(|| c.node_name(i % c.opts.nodes + 1));
            tasks.push(tokio::spawn(async move {
                let out = create_one(csi, name, node, bytes, deadline).await;
                drop(permit);
                out
            }));
        }
        let mut ids = Vec::with_capacity(names.len());
        let mut starts = HashMap::new();
        let mut errors = Vec::new();
        for t in tasks {
            let c = t.await?;
            f.retries += c.retries;
            starts.insert(c.name.clone(), c.started);
            match c.result {
                Ok((id, lat)) => {
                    ids.push(id);
                    f.create_latency.push(lat);
                }
                Err(e) => errors.push(e),
            }
        }
        f.all_answered = start.elapsed();
        f.create_latency.sort();
        if !errors.is_empty() {
            bail!(
                "{} of {} CreateVolume calls failed:\n{}",
                errors.len(),
                names.len(),
                summarize_errors(&errors)
            );
        }
        println!(
            "  all {} CreateVolume answered after {}",
            names.len(),
            secs(f.all_answered)
        );

        // All ready.
        let all_ready = |s: &Seen| names.iter().all(|n| s.ready.contains_key(n));
        if let Err(e) = wait_for("all ready", &seen, deadline, all_ready).await {
            let s = seen.lock().await;
            let ready = names.iter().filter(|n| s.ready.contains_key(*n)).count();
            bail!(
                "{e}: {ready} of {} volumes ready after {}; the others:\n{}",
                names.len(),
                secs(phase),
                summarize_unready(&s, &names)
            );
        }
        {
            let s = seen.lock().await;
            let last = names
                .iter()
                .filter_map(|n| s.ready.get(n))
                .max()
                .copied()
                .unwrap_or(start);
            f.all_ready = last.saturating_duration_since(start);
            f.ready_latency = names
                .iter()
                .filter_map(|n| Some(s.ready.get(n)?.saturating_duration_since(*starts.get(n)?)))
                .collect();
            f.ready_latency.sort();
            for n in &names {
                let node = s
                    .present
                    .get(n)
                    .and_then(|v| v.target_node().map(str::to_string))
                    .unwrap_or_else(|| "?".into());
                *f.per_node.entry(node).or_default() += 1;
            }
        }
        f.mem_ready = measure_memory(c)?;
        println!("  all ready after {}", secs(f.all_ready));

        // The deletes.
        let start = Instant::now();
        let deadline = start + phase;
        let mut tasks = Vec::with_capacity(ids.len());
        for id in ids {
            let permit = Arc::clone(&permits).acquire_owned().await?;
            let csi = csi.clone();
            tasks.push(tokio::spawn(async move {
                let out = delete_one(csi, id, deadline).await;
                drop(permit);
                out
            }));
        }
        let mut errors = Vec::new();
        for t in tasks {
            if let Err(e) = t.await? {
                errors.push(e);
            }
        }
        f.delete_answered = start.elapsed();
        if !errors.is_empty() {
            bail!(
                "{} DeleteVolume calls failed:\n{}",
                errors.len(),
                summarize_errors(&errors)
            );
        }
        let gone = |s: &Seen| names.iter().all(|n| !s.present.contains_key(n));
        if let Err(e) = wait_for("all gone", &seen, deadline, gone).await {
            let s = seen.lock().await;
            let left: Vec<_> = names
                .iter()
                .filter(|n| s.present.contains_key(*n))
                .collect();
            bail!(
                "{e}: {} AntstorVolumes are still there, e.g. {:?}",
                left.len(),
                &left[..left.len().min(5)]
            );
        }
        f.all_gone = start.elapsed();
        // And their files.
        for k in 1..=c.opts.nodes {
            let dir = c.node_dir(k).join("pool").join("volumes");
            let left = std::fs::read_dir(&dir)
                .map(|rd| rd.flatten().count())
                .unwrap_or(0);
            if left > 0 {
                bail!("{left} files are left in {}", dir.display());
            }
        }
        println!("  all deleted after {}", secs(f.all_gone));
        Ok::<_, anyhow::Error>(())
    }
    .await;
    watch.abort();
    result.map(|()| f)
}

fn print_figures(label: &str, f: &Figures, volumes: usize) {
    let rate = volumes as f64 / f.all_ready.as_secs_f64().max(1e-9);
    println!("{label}:");
    println!(
        "  CreateVolume: all {volumes} answered in {}, all ready in {} ({rate:.1} volumes/s); {} retried",
        secs(f.all_answered),
        secs(f.all_ready),
        f.retries
    );
    println!(
        "  CreateVolume latency p50 {} p99 {} max {}; create→ready p50 {} p99 {} max {}",
        millis(percentile(&f.create_latency, 50.0)),
        millis(percentile(&f.create_latency, 99.0)),
        millis(percentile(&f.create_latency, 100.0)),
        millis(percentile(&f.ready_latency, 50.0)),
        millis(percentile(&f.ready_latency, 99.0)),
        millis(percentile(&f.ready_latency, 100.0)),
    );
    if !f.per_node.is_empty() {
        let spread: Vec<String> = f.per_node.iter().map(|(n, c)| format!("{n} {c}")).collect();
        println!("  volumes per node: {}", spread.join(", "));
    }
    println!(
        "  DeleteVolume: all answered in {}, all gone (objects and files) in {}",
        secs(f.delete_answered),
        secs(f.all_gone)
    );
    println!(
        "  {:<22} {:>12} {:>12} {:>12}",
        "resident memory", "idle VmRSS", "ready VmRSS", "ready VmHWM"
    );
    for (name, m) in &f.mem_ready {
        let idle = f.mem_idle.get(name).copied().unwrap_or_default();
        println!(
            "  {:<22} {:>12} {:>12} {:>12}",
            name,
            mib(idle.rss_kib),
            mib(m.rss_kib),
            mib(m.hwm_kib)
        );
    }
}

/// The worst of each figure across runs.
fn worst(runs: &[Figures]) -> Figures {
    let mut w = Figures::default();
    let max_at =
        |pick: &dyn Fn(&Figures) -> Duration| runs.iter().map(pick).max().unwrap_or_default();
    w.all_answered = max_at(&|f| f.all_answered);
    w.all_ready = max_at(&|f| f.all_ready);
    w.delete_answered = max_at(&|f| f.delete_answered);
    w.all_gone = max_at(&|f| f.all_gone);
    w.retries = runs.iter().map(|f| f.retries).max().unwrap_or(0);
    // Latency lists: the run with the worst p99 stands for all.
    let worst_by = |pick: &dyn Fn(&Figures) -> &Vec<Duration>| {
        runs.iter()
            .max_by_key(|f| percentile(pick(f), 99.0))
            .map(|f| pick(f).clone())
            .unwrap_or_default()
    };
    w.create_latency = worst_by(&|f| &f.create_latency);
    w.ready_latency = worst_by(&|f| &f.ready_latency);
    for f in runs {
        for (n, m) in &f.mem_ready {
            let e = w.mem_ready.entry(n.clone()).or_default();
            e.rss_kib = e.rss_kib.max(m.rss_kib);
            e.hwm_kib = e.hwm_kib.max(m.hwm_kib);
        }
        for (n, m) in &f.mem_idle {
            let e = w.mem_idle.entry(n.clone()).or_default();
            e.rss_kib = e.rss_kib.max(m.rss_kib);
        }
    }
    w
}

fn default_bin_dir() -> Result<PathBuf> {
    // target/<profile>/deps/scale-… → target/<profile>
    let exe = std::env::current_exe()?;
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .ok_or_else(|| anyhow!("cannot tell the profile directory from {}", exe.display()))
}

async fn one_run(args: &Args, bin_dir: &Path, run: usize) -> Result<Figures> {
    let dir = std::env::temp_dir().join(format!("liteio-scale-{}-{run}", std::process::id()));
    let _ = netns::cleanup(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let mut opts = ClusterOptions::new(args.nodes, Engine::File);
    opts.volume_workers = args.volume_workers;
    opts.pool_bytes = if args.pool_gib > 0 {
        args.pool_gib * GIB
    } else {
        // Room to spare: with topology, twice a node's share; without, every volume fits on
        // one node, so placement is the scheduler's choice, not forced by capacity.
        let per_node = if args.no_topology {
            args.volumes
        } else {
            args.volumes.div_ceil(args.nodes) * 2
        };
        (per_node as u64 * args.size_mib * MIB).max(GIB)
    };
    let started = Instant::now();
    let mut c = match Cluster::start(&dir, bin_dir, opts).await {
        Ok(c) => c,
        Err(e) => {
            let tails = liteio_local::cluster::log_tails(&dir, 20);
            let _ = netns::cleanup(&dir);
            bail!("the cluster did not start: {e}\n{tails}");
        }
    };
    println!(
        "run {run}: {} nodes up in {} (run directory {})",
        args.nodes,
        secs(started.elapsed()),
        dir.display()
    );
    let result = scenario(&c, args).await;
    if result.is_err() {
        println!("{}", liteio_local::cluster::log_tails(&dir, 30));
    }
    let record = c.record().clone();
    let undone = c.shutdown().await;
    let left = netns::leftovers(&record);
    if !left.is_empty() {
        bail!("run {run} left behind {left:?} (cleanup did {undone:?})");
    }
    let f = result.with_context(|| format!("run {run} (logs in {})", dir.display()))?;
    if !args.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(f)
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.volumes == 0 || args.nodes == 0 || args.runs == 0 {
        bail!("--volumes, --nodes and --runs must be at least 1");
    }
    if let Some(why) = netns::unsupported() {
        println!("SKIP scale benchmark: {why}");
        return Ok(());
    }
    let bin_dir = match &args.bin_dir {
        Some(d) => d.clone(),
        None => default_bin_dir()?,
    };
    for b in [
        "test-apiserver",
        "node-disk-controller",
        "disk-agent",
        "csi-driver",
    ] {
        if !bin_dir.join(b).exists() {
            bail!(
                "{b} is not built in {}: cargo build{} -p liteio-test-apiserver -p liteio-controller -p liteio-agent -p liteio-csi --bins",
                bin_dir.display(),
                if bin_dir.ends_with("release") {
                    " --release"
                } else {
                    ""
                }
            );
        }
    }
    let profile = bin_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    println!(
        "scale: {} nodes (file engine), {} volumes of {} MiB ({}), {} CreateVolume in flight, {} run(s), binaries from {} ({profile})",
        args.nodes,
        args.volumes,
        args.size_mib,
        if args.no_topology {
            "no topology: the scheduler places them"
        } else {
            "spread over the nodes by topology"
        },
        args.concurrency,
        args.runs,
        bin_dir.display()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut runs = Vec::new();
    for run in 1..=args.runs {
        let f = rt.block_on(one_run(&args, &bin_dir, run))?;
        print_figures(&format!("run {run}"), &f, args.volumes);
        runs.push(f);
    }
    if runs.len() > 1 {
        print_figures(
            &format!("worst of {} runs", runs.len()),
            &worst(&runs),
            args.volumes,
        );
    }
    Ok(())
}
