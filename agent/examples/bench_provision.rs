//! Provisioning benchmark (issue 5): volumes created against the test API server with the
//! controller's step simulated (the `in-state` finalizer and the target node set by this
//! program), time from creation to `ready` (p50, p99), on the file engine and, with the
//! `spdk` feature, on the SPDK lvstore engine (aio file base, no hugepages, interrupt mode).
//! Also prints the agent's resident memory with all volumes in place (SPDK's memory pools
//! excluded: the file-engine run has no SPDK).
//!
//! `cargo run --release -p liteio-agent [--features spdk] --example bench_provision [-- COUNT] [--sequential] [--runs N] [--engine file|spdk] [--polling]`
//!
//! `--agent-memory` instead runs the `disk-agent` binary as its own process (file engine)
//! and prints its resident memory with COUNT ready volumes.
//!
//! By default all volumes are created at once, 64 creations in flight (a burst: latency
//! includes queueing behind the others); `--sequential` creates the next volume only when
//! the previous one is ready. Each run also prints when the last volume was ready, counted
//! from the first creation.
//!
//! `--runs N` repeats the measurement N times, each in a fresh process (a new API server,
//! agent and SPDK), and prints the worst run's p99 and the median run's p50 per engine.
//! `--prefill MIB` writes zeroes over the first MIB of the lvstore's file before SPDK
//! starts (by default the file is sparse).
//! `--engine file|spdk` measures one engine only. `--polling` runs SPDK's reactor polling,
//! as the agent does by default on production nodes (otherwise it runs in interrupt mode).
//!
//! Each run also says where its slowest volumes spent their time, from the agent's own
//! accounting (`liteio_agent::sync::provision`, captured from its log events in this
//! process) and this program's clock:
//! `queue` (created → the agent's first pass), `engine`, `export`, `api` (the agent's steps),
//! `waiting` (between the agent's passes), `delivery` (ready patch done → seen in the watch).

use std::collections::{BTreeMap, HashMap};

const USAGE: &str = "\
bench_provision [COUNT] [--sequential] [--runs N] [--engine file|spdk] [--polling]
                [--prefill MIB] [--agent-memory]

Creates COUNT volumes (default 200) against an in-process test API server and agent and
prints creation-to-ready p50/p99, where the slowest volumes spent their time, and the
resident memory.
  COUNT            volumes per run
  --sequential     create the next volume only when the previous one is ready
  --runs N         N runs, each in a fresh process; prints the worst-run p99 and the
                   median-run p50 per engine
  --engine E       measure one engine only: file, or spdk (needs --features spdk)
  --polling        SPDK's reactor polls (default: interrupt mode)
  --prefill MIB    write zeroes over the first MIB of the lvstore file before SPDK starts
  --reactor-nice N nice value of SPDK's reactor in interrupt mode (default -10, the agent's
                   spdk.reactorNice; 0 leaves it at the process's)
  --agent-memory   run the disk-agent binary as its own process (file engine) and print
                   its resident memory with COUNT ready volumes
";
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use liteio_agent::agent::{Agent, AgentOptions};
use liteio_agent::config::Config;
use liteio_agent::engine::{FileEngine, PoolEngine};
use liteio_agent::exporter::{Exporter, NoExporter};
use liteio_agent::heartbeat::HeartbeatOptions;
use liteio_api::keys::{finalizers, labels};
use liteio_api::{AntstorVolume, AntstorVolumeSpec, VolumeStatus, keys};
use liteio_test_apiserver::TestApiServer;

const NODE: &str = "bench-node";
/// Volumes created at once (not `--sequential`).
const CREATE_IN_FLIGHT: usize = 64;
const MIB: u64 = 1 << 20;

/// A memory field (`VmRSS:`, `VmHWM:`) of /proc/`pid`/status in MiB; `pid` may be "self".
fn proc_mib(pid: &str, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Resident memory of this process by mapping, from /proc/self/smaps: (MiB, size MiB,
/// name), largest first. Anonymous mappings are named `[anon]`.
fn resident_mappings() -> Vec<(f64, f64, String)> {
    let Ok(text) = std::fs::read_to_string("/proc/self/smaps") else {
        return Vec::new();
    };
    let mut out: Vec<(f64, f64, String)> = Vec::new();
    let kib = |l: &str| {
        l.split_whitespace()
            .nth(1)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let first = f.next().unwrap_or_default();
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            let name = f.nth(4).unwrap_or("[anon]").to_string();
            out.push((0.0, 0.0, name));
        } else if let Some(last) = out.last_mut() {
            if first == "Rss:" {
                last.0 = kib(line);
            } else if first == "Size:" {
                last.1 = kib(line);
            }
        }
    }
    out.sort_by(|a, b| b.0.total_cmp(&a.0));
    out
}

/// Resident memory split (MiB): SPDK's memory arena (the anonymous mapping of at least
/// `arena_mib`, DPDK's memory without hugepages), other anonymous memory (heaps, stacks),
/// and file-backed memory (code, libraries).
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
struct MemorySplit {
    spdk_arena: f64,
    heap: f64,
    files: f64,
}

fn memory_split(arena_mib: f64) -> MemorySplit {
    let mut m = MemorySplit::default();
    for (rss, size, name) in resident_mappings() {
        if name.starts_with('/') && !name.starts_with("/memfd:") {
            m.files += rss;
        } else if arena_mib > 0.0 && size >= arena_mib {
            m.spdk_arena += rss;
        } else {
            m.heap += rss;
        }
    }
    m
}

/// A test API server with the namespace and this node.
async fn cluster() -> anyhow::Result<(TestApiServer, kube::Client)> {
    let server = TestApiServer::start().await?;
    let client = server.client().await?;
    let ns: Api<Namespace> = Api::all(client.clone());
    let mut n = Namespace::default();
    n.metadata.name = Some(keys::DEFAULT_NAMESPACE.into());
    ns.create(&PostParams::default(), &n).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let mut node = Node::default();
    node.metadata.name = Some(NODE.into());
    nodes.create(&PostParams::default(), &node).await?;
    Ok((server, client))
}

/// Volume `i` as the controller leaves it: bound to this node, `in-state` finalizer.
fn volume(i: usize) -> (String, AntstorVolume) {
    let name = format!("pvc-{i:05}");
    let mut v = AntstorVolume::new(
        &name,
        AntstorVolumeSpec {
            uuid: format!("00000000-0000-4000-8000-{i:012}"),
            size_byte: 16 * MIB,
            target_node_id: NODE.into(),
            ..AntstorVolumeSpec::default()
        },
    );
    v.metadata = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(keys::DEFAULT_NAMESPACE.into()),
        labels: Some(BTreeMap::from([(
            labels::TARGET_NODE_ID.to_string(),
            NODE.to_string(),
        )])),
        finalizers: Some(vec![finalizers::IN_STATE.to_string()]),
        ..ObjectMeta::default()
    };
    (name, v)
}

/// The agent's provisioning figures of one volume, from its "volume ready" event (ms).
#[derive(Clone, Copy, Debug, Default)]
struct AgentFigures {
    took: f64,
    engine: f64,
    export: f64,
    api: f64,
    waiting: f64,
    passes: u64,
}

/// What the agent's provisioning events said, by volume name, with when they came.
#[derive(Debug, Default)]
struct Seen {
    started: HashMap<String, Instant>,
    ready: HashMap<String, (Instant, AgentFigures)>,
}

/// A tracing layer keeping the agent's provisioning events (target
/// `liteio_agent::sync::provision`) in [`Seen`].
#[derive(Clone, Debug, Default)]
struct Capture(Arc<Mutex<Seen>>);

impl Capture {
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[derive(Default)]
struct Fields {
    volume: String,
    message: String,
    figures: AgentFigures,
    has_figures: bool,
}

impl tracing::field::Visit for Fields {
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        let f = &mut self.figures;
        match field.name() {
            "took_ms" => f.took = value,
            "engine_ms" => f.engine = value,
            "export_ms" => f.export = value,
            "api_ms" => f.api = value,
            "waiting_ms" => f.waiting = value,
            _ => return,
        }
        self.has_figures = true;
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        if field.name() == "passes" {
            self.figures.passes = value;
        }
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "volume" {
            // `namespace/name`, or the name alone.
            self.volume = value.rsplit('/').next().unwrap_or(value).to_string();
        }
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "volume" => {
                let v = format!("{value:?}");
                self.volume = v.rsplit('/').next().unwrap_or(&v).to_string();
            }
            "message" => self.message = format!("{value:?}"),
            _ => {}
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() != "liteio_agent::sync::provision" {
            return;
        }
        let at = Instant::now();
        let mut f = Fields::default();
        event.record(&mut f);
        if f.volume.is_empty() {
            return;
        }
        let mut seen = self.seen();
        if f.has_figures {
            // The first time the agent made it ready (a later pass may report again).
            seen.ready.entry(f.volume).or_insert((at, f.figures));
        } else if f.message.contains("provisioning started") {
            seen.started.entry(f.volume).or_insert(at);
        }
    }
}

/// Where one volume's time went (ms): this program's view and the agent's.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
struct Breakdown {
    total: f64,
    queue: f64,
    engine: f64,
    export: f64,
    api: f64,
    waiting: f64,
    delivery: f64,
    passes: u64,
}

impl Breakdown {
    fn line(&self) -> String {
        format!(
            "{:.0} ms = queue {:.0} + engine {:.0} + export {:.0} + api {:.0} + waiting {:.0} + delivery {:.0} ({} passes)",
            self.total,
            self.queue,
            self.engine,
            self.export,
            self.api,
            self.waiting,
            self.delivery,
            self.passes
        )
    }

    fn mean(all: &[Breakdown]) -> Breakdown {
        let n = all.len().max(1) as f64;
        let sum = |f: fn(&Breakdown) -> f64| all.iter().map(f).sum::<f64>() / n;
        Breakdown {
            total: sum(|b| b.total),
            queue: sum(|b| b.queue),
            engine: sum(|b| b.engine),
            export: sum(|b| b.export),
            api: sum(|b| b.api),
            waiting: sum(|b| b.waiting),
            delivery: sum(|b| b.delivery),
            passes: (all.iter().map(|b| b.passes).sum::<u64>() as f64 / n).round() as u64,
        }
    }
}

/// One run's result, printed as a `RESULT {json}` line for `--runs`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct RunResult {
    engine: String,
    ready: usize,
    count: usize,
    p50: f64,
    p99: f64,
    /// The slowest 1 % of volumes, on average.
    slowest: Breakdown,
    /// Every volume, on average.
    mean: Breakdown,
    memory_mib: f64,
    memory: MemorySplit,
    /// CPU time the hypervisor gave to others while this machine wanted it, in % of all CPU
    /// time during the run (from /proc/stat).
    #[serde(default)]
    steal_pct: f64,
    /// Where the SPDK requests of the run spent their time (SPDK engine only).
    #[serde(default)]
    reactor: String,
    /// First creation to the last volume seen ready, in seconds.
    #[serde(default)]
    all_ready_s: f64,
}

/// The `cpu` line of /proc/stat: (steal, total) in clock ticks.
fn cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    (v.get(7).copied().unwrap_or(0), v.iter().take(8).sum())
}

/// While SPDK requests wait and the application thread has started none for 20 ms, what
/// that thread is doing, sampled every 2 ms from /proc: its state and the kernel function it
/// sleeps in (`ep_poll`: asleep in epoll, so a wake-up went missing; a file system function:
/// blocked in a system call; running: busy in SPDK's own pollers). Stops when `stop` is set;
/// returns "state wchan: ms" sorted by time, the most first.
#[cfg(feature = "spdk")]
fn sample_held_reactor(
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let tid = std::fs::read_dir("/proc/self/task")
            .into_iter()
            .flatten()
            .flatten()
            .find(|e| {
                std::fs::read_to_string(e.path().join("comm"))
                    .is_ok_and(|c| c.trim() == "reactor_0")
            })
            .map(|e| e.path());
        let Some(task) = tid else {
            return "no reactor_0 thread".to_string();
        };
        let mut held: BTreeMap<String, u32> = BTreeMap::new();
        // /proc/…/schedstat: nanoseconds on the CPU, nanoseconds runnable but waiting for one.
        let schedstat = || -> (u64, u64) {
            let t = std::fs::read_to_string(task.join("schedstat")).unwrap_or_default();
            let mut f = t.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(0));
            (f.next().unwrap_or(0), f.next().unwrap_or(0))
        };
        let (mut on_cpu, mut runqueue) = (0u64, 0u64);
        let mut last: Option<(u64, u64)> = None;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(2));
            let (queued, since) = liteio_agent::spdk::runtime::queue_state();
            if queued == 0 || since < Duration::from_millis(20) {
                last = None;
                continue;
            }
            let now = schedstat();
            if let Some(prev) = last {
                on_cpu += now.0.saturating_sub(prev.0);
                runqueue += now.1.saturating_sub(prev.1);
            }
            last = Some(now);
            let stat = std::fs::read_to_string(task.join("stat")).unwrap_or_default();
            // The state follows the command name in parentheses.
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .unwrap_or("?")
                .to_string();
            let wchan = std::fs::read_to_string(task.join("wchan")).unwrap_or_default();
            *held.entry(format!("{state} {}", wchan.trim())).or_default() += 1;
        }
        let mut v: Vec<(String, u32)> = held.into_iter().collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.1));
        let states = v
            .iter()
            .take(5)
            .map(|(k, n)| format!("{k}: {} ms", n * 2))
            .collect::<Vec<_>>()
            .join(", ");
        if states.is_empty() {
            return states;
        }
        format!(
            "{states} (on a CPU {} ms, runnable waiting for one {} ms)",
            on_cpu / 1_000_000,
            runqueue / 1_000_000
        )
    })
}

/// The SPDK request times since the last call, as one line (empty without SPDK).
fn reactor_line() -> String {
    #[cfg(feature = "spdk")]
    {
        let t = liteio_agent::spdk::runtime::take_request_times();
        if t.count == 0 {
            return String::new();
        }
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let n = t.count as f64;
        format!(
            "{} requests: queue wait mean {:.2} ms max {:.1} ms; run mean {:.2} ms max {:.1} ms ({}); answer mean {:.1} ms max {:.1} ms ({})",
            t.count,
            ms(t.wait_total) / n,
            ms(t.wait_max),
            ms(t.run_total) / n,
            ms(t.run_max),
            t.run_max_request,
            ms(t.answer_total) / n,
            ms(t.answer_max),
            t.answer_max_request,
        )
    }
    #[cfg(not(feature = "spdk"))]
    String::new()
}

#[allow(clippy::too_many_arguments)]
async fn run(
    label: &str,
    engine: Arc<dyn PoolEngine>,
    exporter: Arc<dyn Exporter>,
    config: Config,
    count: usize,
    sequential: bool,
    capture: &Capture,
    arena_mib: f64,
) -> anyhow::Result<RunResult> {
    *capture.seen() = Seen::default();
    let (_server, client) = cluster().await?;
    let dir = tempfile::tempdir()?;
    let mut opts = AgentOptions::from_config(NODE, config);
    opts.host_nqn_path = dir.path().join("hostnqn");
    opts.heartbeat =
        HeartbeatOptions::with_interval(Duration::from_secs(5), Duration::from_secs(20));
    opts.metrics_addr = None;
    let agent = Agent::start(client.clone(), engine, exporter, opts).await?;

    let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    // Readiness is observed through a watch, like the CSI controller does.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let w = vols.clone();
    let watch = tokio::spawn(async move {
        let mut s = watcher(w, watcher::Config::default()).boxed();
        while let Some(ev) = s.next().await {
            if let Ok(watcher::Event::Apply(v)) = ev
                && v.phase() == VolumeStatus::Ready
            {
                let _ = tx.send((v.name_any(), Instant::now()));
            }
        }
    });
    let _ = reactor_line();
    #[cfg(feature = "spdk")]
    let stop_sampler = Arc::new(std::sync::atomic::AtomicBool::new(false));
    #[cfg(feature = "spdk")]
    let sampler = sample_held_reactor(Arc::clone(&stop_sampler));
    let ticks0 = cpu_ticks();
    let mut created = BTreeMap::new();
    let mut lat = Vec::new();
    let mut breakdowns = Vec::new();
    // Where the time of a volume created at `t0` and seen ready at `at` went.
    let breakdown = |name: &str, t0: Instant, at: Instant| {
        let seen = capture.seen();
        let mut b = Breakdown {
            total: at.duration_since(t0).as_secs_f64() * 1000.0,
            ..Breakdown::default()
        };
        if let Some(started) = seen.started.get(name) {
            b.queue = started.saturating_duration_since(t0).as_secs_f64() * 1000.0;
        }
        if let Some((ready, f)) = seen.ready.get(name) {
            (b.engine, b.export, b.api, b.waiting, b.passes) =
                (f.engine, f.export, f.api, f.waiting, f.passes);
            b.delivery = at.saturating_duration_since(*ready).as_secs_f64() * 1000.0;
        }
        b
    };
    let first_created = Instant::now();
    let mut last_ready = first_created;
    if !sequential {
        // All at once: CREATE_IN_FLIGHT creations in flight, as a burst of PVCs through the
        // CSI controller comes (one POST after another would time this program's requests).
        let made: Vec<anyhow::Result<(String, Instant)>> = futures::stream::iter(0..count)
            .map(|i| {
                let vols = vols.clone();
                async move {
                    let (name, v) = volume(i);
                    let t0 = Instant::now();
                    vols.create(&PostParams::default(), &v).await?;
                    Ok((name, t0))
                }
            })
            .buffer_unordered(CREATE_IN_FLIGHT)
            .collect()
            .await;
        for m in made {
            let (name, t0) = m?;
            created.insert(name, t0);
        }
    }
    for i in (0..count).filter(|_| sequential) {
        let (name, v) = volume(i);
        created.insert(name, Instant::now());
        vols.create(&PostParams::default(), &v).await?;
        {
            let (name, at) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await?
                .ok_or_else(|| anyhow::anyhow!("readiness watch ended"))?;
            if let Some(t0) = created.remove(&name) {
                lat.push(at.duration_since(t0).as_secs_f64() * 1000.0);
                breakdowns.push(breakdown(&name, t0, at));
                last_ready = last_ready.max(at);
            }
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while lat.len() < count {
        let Ok(Some((name, at))) = tokio::time::timeout_at(deadline, rx.recv()).await else {
            break;
        };
        if let Some(t0) = created.remove(&name) {
            lat.push(at.duration_since(t0).as_secs_f64() * 1000.0);
            breakdowns.push(breakdown(&name, t0, at));
            last_ready = last_ready.max(at);
        }
    }
    let all_ready_s = last_ready.duration_since(first_created).as_secs_f64();
    #[cfg(feature = "spdk")]
    let reactor = {
        stop_sampler.store(true, std::sync::atomic::Ordering::Relaxed);
        let held = sampler.join().unwrap_or_default();
        let line = reactor_line();
        if held.is_empty() || line.is_empty() {
            line
        } else {
            format!("{line}; reactor held with requests waiting: {held}")
        }
    };
    #[cfg(not(feature = "spdk"))]
    let reactor = reactor_line();
    let ticks1 = cpu_ticks();
    let steal_pct = 100.0 * ticks1.0.saturating_sub(ticks0.0) as f64
        / ticks1.1.saturating_sub(ticks0.1).max(1) as f64;
    lat.sort_by(f64::total_cmp);
    breakdowns.sort_by(|a, b| b.total.total_cmp(&a.total));
    let slowest = Breakdown::mean(&breakdowns[..breakdowns.len().div_ceil(100)]);
    let mean = Breakdown::mean(&breakdowns);
    let p = |q: f64| {
        lat.get(((lat.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let memory_mib = proc_mib("self", "VmRSS:");
    println!(
        "{label}{}: {} of {count} volumes ready {all_ready_s:.2} s after the first was created; creation to ready p50 {:.1} ms, p99 {:.1} ms; resident memory {memory_mib:.0} MiB",
        if sequential {
            ", one at a time"
        } else {
            ", all at once"
        },
        lat.len(),
        p(0.5),
        p(0.99),
    );
    let memory = memory_split(arena_mib);
    println!(
        "  resident memory: SPDK arena {:.0} MiB, other anonymous (heaps, stacks) {:.0} MiB, files {:.0} MiB",
        memory.spdk_arena, memory.heap, memory.files
    );
    if std::env::var_os("BENCH_MAPPINGS").is_some() {
        for (rss, size, name) in resident_mappings().into_iter().take(8) {
            println!("    {rss:8.1} MiB resident of {size:8.1} MiB  {name}");
        }
    }
    println!("  slowest 1 %: {}", slowest.line());
    println!("  mean:        {}", mean.line());
    println!("  CPU steal:   {steal_pct:.1} %");
    if !reactor.is_empty() {
        println!("  SPDK:        {reactor}");
    }
    watch.abort();
    agent.shutdown(Duration::from_secs(10)).await;
    Ok(RunResult {
        engine: label.to_string(),
        ready: lat.len(),
        count,
        p50: p(0.5),
        p99: p(0.99),
        slowest,
        mean,
        memory_mib,
        memory,
        steal_pct,
        reactor,
        all_ready_s,
    })
}

/// `--runs N`: runs this program N times (`--one-run`), each a fresh process, and prints
/// the worst run's p99 and the median run's p50 per engine, with where the worst run's
/// slowest volumes spent their time.
fn repeat(runs: usize, args: &[String]) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let mut pass_on: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--runs" {
            it.next();
        } else {
            pass_on.push(a.clone());
        }
    }
    let mut by_engine: BTreeMap<String, Vec<RunResult>> = BTreeMap::new();
    for i in 1..=runs {
        let out = std::process::Command::new(&exe)
            .args(&pass_on)
            .arg("--one-run")
            .stderr(std::process::Stdio::inherit())
            .output()?;
        anyhow::ensure!(out.status.success(), "run {i} failed: {}", out.status);
        for json in String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("RESULT "))
        {
            let r: RunResult = serde_json::from_str(json)?;
            println!(
                "run {i:>2} {}: {} of {} ready (all after {:.2} s), p50 {:.1} ms, p99 {:.1} ms, CPU steal {:.1} %; slowest 1 %: {}",
                r.engine,
                r.ready,
                r.count,
                r.all_ready_s,
                r.p50,
                r.p99,
                r.steal_pct,
                r.slowest.line()
            );
            if !r.reactor.is_empty() {
                println!("       SPDK: {}", r.reactor);
            }
            by_engine.entry(r.engine.clone()).or_default().push(r);
        }
    }
    println!();
    for (engine, rs) in &by_engine {
        let Some(worst) = rs.iter().max_by(|a, b| a.p99.total_cmp(&b.p99)) else {
            continue;
        };
        let mut p50s: Vec<f64> = rs.iter().map(|r| r.p50).collect();
        p50s.sort_by(f64::total_cmp);
        let incomplete = rs.iter().filter(|r| r.ready < r.count).count();
        println!(
            "{engine}, {} runs of {} volumes: all ready after {:.2} s at worst; worst-run p99 {:.1} ms, median-run p50 {:.1} ms, best-run p99 {:.1} ms; runs with p99 above 300 ms: {}; runs with volumes not ready: {incomplete}",
            rs.len(),
            worst.count,
            rs.iter().map(|r| r.all_ready_s).fold(0.0, f64::max),
            worst.p99,
            p50s[p50s.len() / 2],
            rs.iter().map(|r| r.p99).fold(f64::INFINITY, f64::min),
            rs.iter().filter(|r| r.p99 > 300.0).count(),
        );
        println!("  worst run, slowest 1 %: {}", worst.slowest.line());
        println!("  worst run, mean:        {}", worst.mean.line());
    }
    Ok(())
}

/// The agent's own resident memory with `count` volumes: the `disk-agent` binary (file
/// engine, so no SPDK memory pools) as its own process against the test API server in this
/// one, measured from /proc once every volume is ready.
async fn agent_process_memory(count: usize) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let bin = exe
        .parent()
        .and_then(std::path::Path::parent)
        .map(|d| d.join("disk-agent"))
        .filter(|p| p.exists())
        .ok_or_else(|| {
            anyhow::anyhow!("disk-agent is not built next to this example: cargo build --release -p liteio-agent")
        })?;
    let (server, client) = cluster().await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig)?;
    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "storage:\n  pooling: {{name: bench, mode: File}}\n  file: {{path: {}, size: 68719476736}}\n",
            dir.path().join("pool").display()
        ),
    )?;
    let mut agent = tokio::process::Command::new(bin)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--config")
        .arg(&config)
        .arg("--node-id")
        .arg(NODE)
        .arg("--host-nqn-file")
        .arg(dir.path().join("hostnqn"))
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()?;
    let pid = agent
        .id()
        .ok_or_else(|| anyhow::anyhow!("the agent exited at once"))?;
    let pid = pid.to_string();
    let status = |field: &str| proc_mib(&pid, field);
    let idle = {
        let pools: Api<liteio_api::StoragePool> =
            Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while pools.get_opt(NODE).await?.is_none() {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the agent registered no pool in 60 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        status("VmRSS:")
    };
    let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    for i in 0..count {
        vols.create(&PostParams::default(), &volume(i).1).await?;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    loop {
        let ready = vols
            .list(&Default::default())
            .await?
            .items
            .iter()
            .filter(|v| v.phase() == VolumeStatus::Ready)
            .count();
        if ready == count {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{ready} of {count} volumes ready after 600 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "disk-agent process, file engine: resident memory {idle:.1} MiB with its pool only, {:.1} MiB with {count} ready volumes (peak {:.1} MiB)",
        status("VmRSS:"),
        status("VmHWM:")
    );
    agent.kill().await?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let capture = Capture::default();
    {
        use tracing_subscriber::prelude::*;
        // Warnings and errors only (RUST_LOG overrides): a failed step shows up in the run.
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_filter(filter),
            )
            .with(
                capture.clone().with_filter(
                    tracing_subscriber::filter::Targets::new()
                        .with_target("liteio_agent::sync::provision", tracing::Level::DEBUG),
                ),
            )
            .init();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{USAGE}");
        return Ok(());
    }
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let sequential = args.iter().any(|a| a == "--sequential");
    let one_run = args.iter().any(|a| a == "--one-run");
    let polling = args.iter().any(|a| a == "--polling");
    let count: usize = args
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            *i == 0
                || !matches!(
                    args[i - 1].as_str(),
                    "--runs" | "--engine" | "--prefill" | "--reactor-nice"
                )
        })
        .find_map(|(_, a)| a.parse().ok())
        .unwrap_or(200);
    let engine = value("--engine");
    anyhow::ensure!(
        matches!(engine.as_deref(), None | Some("file" | "spdk")),
        "--engine: expected file or spdk, got {:?}",
        engine.unwrap_or_default()
    );
    let want = |e: &str| engine.as_deref().is_none_or(|x| x == e);
    let reactor_nice: i32 = match value("--reactor-nice") {
        None => liteio_agent::config::DEFAULT_REACTOR_NICE,
        Some(v) => v
            .parse()
            .ok()
            .filter(|n| (-20..=19).contains(n))
            .ok_or_else(|| anyhow::anyhow!("--reactor-nice: expected -20..=19, got {v:?}"))?,
    };
    #[cfg(not(feature = "spdk"))]
    let _ = reactor_nice;
    let prefill_mib: u64 = match value("--prefill") {
        None => 0,
        Some(v) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("--prefill: expected MiB as a number, got {v:?}"))?,
    };
    #[cfg(not(feature = "spdk"))]
    anyhow::ensure!(
        prefill_mib == 0,
        "--prefill: only the SPDK engine has an lvstore file (build with --features spdk)"
    );
    if let Some(runs) = value("--runs") {
        let runs: usize =
            runs.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                anyhow::anyhow!("--runs: expected a positive number, got {runs:?}")
            })?;
        return repeat(runs, &args);
    }
    let report = |r: RunResult| -> anyhow::Result<()> {
        if one_run {
            println!("RESULT {}", serde_json::to_string(&r)?);
        }
        Ok(())
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if args.iter().any(|a| a == "--agent-memory") {
        return rt.block_on(agent_process_memory(count));
    }
    let dir = tempfile::tempdir()?;
    let pool = dir.path().join("pool");
    if want("file") {
        report(rt.block_on(run(
            "file engine",
            // 16 MiB volumes with room to spare: 64 GiB at least.
            Arc::new(FileEngine::new(
                "bench",
                &pool,
                ((count as u64 * 16 * MIB) * 5 / 4).max(64 << 30),
            )),
            Arc::new(NoExporter),
            Config::file_pool("bench", &pool),
            count,
            sequential,
            &capture,
            0.0,
        ))?)?;
    }
    #[cfg(not(feature = "spdk"))]
    anyhow::ensure!(
        want("file") && !polling,
        "--engine spdk, --polling: this build has no SPDK (build with --features spdk)"
    );
    #[cfg(feature = "spdk")]
    if want("spdk") {
        use liteio_agent::engine::spdk::{BaseBdev, SpdkLvsEngine};
        use liteio_agent::spdk::{Spdk, SpdkOptions};
        let spdk = Spdk::start(&SpdkOptions {
            name: "bench-provision".into(),
            // Production nodes poll (the agent's default); tests use interrupt mode.
            interrupt_mode: !polling,
            // One subsystem per volume, beyond SPDK's default of 1,024.
            max_subsystems: (count as u32 + 16).max(1024),
            reactor_nice,
            ..SpdkOptions::small()
        })?;
        let file = dir.path().join("lvs.img");
        // 16 MiB volumes with room to spare (sparse file): 8 GiB at least.
        let lvs_bytes = ((count as u64 * 16 * MIB) * 5 / 4)
            .max(8 << 30)
            .next_multiple_of(1 << 30);
        if prefill_mib > 0 {
            // Written zeroes, not a hole: the blobstore's metadata writes land on allocated
            // blocks, so the file system has nothing to allocate under io_submit.
            use std::io::Write as _;
            let mut f = std::fs::File::create(&file)?;
            let zeroes = vec![0u8; MIB as usize];
            for _ in 0..prefill_mib.min(lvs_bytes / MIB) {
                f.write_all(&zeroes)?;
            }
            f.sync_all()?;
            f.set_len(lvs_bytes)?;
        }
        let base = BaseBdev::Aio {
            name: "bench-aio".into(),
            path: file.clone(),
            size: lvs_bytes,
            create: true,
        };
        let engine = Arc::new(SpdkLvsEngine::new("bench-lvs", base, 0));
        let config = Config::from_yaml(&format!(
            "storage: {{pooling: {{name: bench-lvs, mode: SpdkLVStore}}, bdev: {{type: aioBdev, name: bench-aio, size: {lvs_bytes}, filePath: {}}}}}",
            file.display()
        ))?;
        // SPDK volumes are always exported: one subsystem and listener port each.
        let exporter = Arc::new(liteio_agent::spdk::exporter::SpdkExporter::new(
            "127.0.0.1",
            21000..=21000 + count.clamp(1000, 40_000) as u16,
            liteio_agent::spdk::nvmf::TcpTransportOptions::default(),
        ));
        report(rt.block_on(run(
            "SPDK engine (with NVMe/TCP export)",
            engine,
            exporter,
            config,
            count,
            sequential,
            &capture,
            f64::from(SpdkOptions::small().mem_size_mb),
        ))?)?;
        drop(rt);
        spdk.stop();
    }
    Ok(())
}
