//! Provisioning benchmark (issue 5): volumes created against the test API server with the
//! controller's step simulated (the `in-state` finalizer and the target node set by this
//! program), time from creation to `ready` (p50, p99), on the file engine and, with the
//! `spdk` feature, on the SPDK lvstore engine (aio file base, no hugepages, interrupt mode).
//! Also prints the agent's resident memory with all volumes in place (SPDK's memory pools
//! excluded: the file-engine run has no SPDK).
//!
//! `cargo run --release -p liteio-agent [--features spdk] --example bench_provision [-- COUNT] [--sequential]`
//!
//! `--agent-memory` instead runs the `disk-agent` binary as its own process (file engine)
//! and prints its resident memory with COUNT ready volumes.
//!
//! By default all volumes are created at once (a burst: latency includes queueing behind the
//! others); `--sequential` creates the next volume only when the previous one is ready.

use std::collections::BTreeMap;
use std::sync::Arc;
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

async fn run(
    label: &str,
    engine: Arc<dyn PoolEngine>,
    exporter: Arc<dyn Exporter>,
    config: Config,
    count: usize,
    sequential: bool,
) -> anyhow::Result<()> {
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
    let mut created = BTreeMap::new();
    let mut lat = Vec::new();
    for i in 0..count {
        let (name, v) = volume(i);
        created.insert(name, Instant::now());
        vols.create(&PostParams::default(), &v).await?;
        if sequential {
            let (name, at) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await?
                .ok_or_else(|| anyhow::anyhow!("readiness watch ended"))?;
            if let Some(t0) = created.remove(&name) {
                lat.push(at.duration_since(t0).as_secs_f64() * 1000.0);
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
        }
    }
    lat.sort_by(f64::total_cmp);
    let p = |q: f64| {
        lat.get(((lat.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    println!(
        "{label}{}: {} of {count} volumes ready; creation to ready p50 {:.1} ms, p99 {:.1} ms; resident memory {:.0} MiB",
        if sequential {
            ", one at a time"
        } else {
            ", all at once"
        },
        lat.len(),
        p(0.5),
        p(0.99),
        proc_mib("self", "VmRSS:")
    );
    watch.abort();
    agent.shutdown(Duration::from_secs(10)).await;
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
    // Warnings and errors only (RUST_LOG overrides): a failed step shows up in the run.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sequential = args.iter().any(|a| a == "--sequential");
    let count: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if args.iter().any(|a| a == "--agent-memory") {
        return rt.block_on(agent_process_memory(count));
    }
    let dir = tempfile::tempdir()?;
    let pool = dir.path().join("pool");
    rt.block_on(run(
        "file engine",
        Arc::new(FileEngine::new("bench", &pool, 64 << 30)),
        Arc::new(NoExporter),
        Config::file_pool("bench", &pool),
        count,
        sequential,
    ))?;
    #[cfg(feature = "spdk")]
    {
        use liteio_agent::engine::spdk::{BaseBdev, SpdkLvsEngine};
        use liteio_agent::spdk::{Spdk, SpdkOptions};
        let spdk = Spdk::start(&SpdkOptions {
            name: "bench-provision".into(),
            ..SpdkOptions::small()
        })?;
        let file = dir.path().join("lvs.img");
        // 16 MiB volumes with room to spare (sparse file): 8 GiB at least.
        let lvs_bytes = ((count as u64 * 16 * MIB) * 5 / 4)
            .max(8 << 30)
            .next_multiple_of(1 << 30);
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
            21000..=21999,
            liteio_agent::spdk::nvmf::TcpTransportOptions::default(),
        ));
        rt.block_on(run(
            "SPDK engine (with NVMe/TCP export)",
            engine,
            exporter,
            config,
            count,
            sequential,
        ))?;
        drop(rt);
        spdk.stop();
    }
    Ok(())
}
