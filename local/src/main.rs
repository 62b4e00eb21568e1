//! `liteio-local`: LiteIO on this machine, every component as its own process, with a demo
//! volume. The README's main command runs it.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use liteio_local::hugepages::{RunHugepages, SpdkMemory};
use liteio_local::{AgentTuning, Component, Engine, Local, datapath, demo};

/// `--nodes N` with N > 1.
mod nodes_cmd;

/// Run LiteIO on this machine: test API server, node-disk-controller, disk-agent and CSI driver,
/// then a demo volume created through CSI, staged and published into a directory.
///
/// Runs until interrupted (Ctrl-C / SIGTERM), then unmounts, deletes and stops everything.
#[derive(Parser, Debug)]
#[command(name = "liteio-local", version)]
pub(crate) struct Args {
    /// State directory (kubeconfig, configs, logs, pool, mounts); removed at exit unless --keep.
    #[arg(long, default_value = "/var/tmp/liteio-local")]
    dir: PathBuf,
    /// Directory of the component binaries (default: next to this binary).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Node name of this machine.
    #[arg(long, default_value = "local-node")]
    node: String,
    /// Engine: `auto` picks the embedded SPDK engine (an lvstore on an aio file in --dir, no
    /// hugepages) when the agent was built with SPDK, else the file engine. Where the kernel
    /// has the NVMe/TCP initiator the demo volume is mounted; where it has not, the volume's
    /// data path is shown with SPDK's userspace initiator (`nvmf-check`) instead.
    #[arg(long, default_value = "auto", value_parser = ["auto", "file", "spdk"])]
    engine: String,
    /// Size of the node's pool in GiB (sparse: the file engine's capacity, or the aio file
    /// under the SPDK engine's lvstore). Where --dir's file system has no reflinks (ext4),
    /// the file engine's pool is an XFS image of this size (plus 1 GiB) mounted in --dir.
    #[arg(long, default_value_t = liteio_local::DEFAULT_POOL_BYTES >> 30, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pool_size_gib: u64,
    /// Run the demo, clean up and exit instead of waiting for a signal.
    #[arg(long)]
    once: bool,
    /// Keep the state directory at exit.
    #[arg(long)]
    keep: bool,
    /// Storage nodes. 1 runs every component in this machine's network namespace. N > 1
    /// (root only) gives each node `node-<k>` its own network namespace with its
    /// own disk-agent, CSI node plugin, host NQN and address 127.10.<i>.<10+k>, all joined by
    /// a bridge at 127.10.<i>.1 where the test API server listens; only loopback addresses
    /// are used. Namespaces, links, mounts and processes are recorded in --dir and removed at
    /// exit, or by the next run in the same --dir after a crash.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=16))]
    nodes: u64,
    /// Run the agent's SPDK on N 2 MiB hugepages, as production nodes do (root only, N at
    /// least 256). They are reserved on top of the kernel's count, mounted as a hugetlbfs in
    /// --dir, and given back at exit (also after an error or Ctrl-C, or by the next run after
    /// a crash); the run fails if the kernel cannot find them all. Without it SPDK runs on
    /// ordinary memory (the development mode).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=65536))]
    hugepages: Option<u64>,
    /// Serve the disk-agent's Prometheus metrics at this address (`/metrics`), for
    /// benchmarks and for looking around; by default it serves none (single-node run only).
    #[arg(long, value_name = "ADDR")]
    agent_metrics_addr: Option<std::net::SocketAddr>,
    /// Run the agent's SPDK reactor polling, as production nodes do, instead of in interrupt
    /// mode: it then keeps core 0 busy all the time (single-node run only).
    #[arg(long)]
    spdk_polling: bool,
}

pub(crate) fn say(msg: &str) {
    println!("==> {msg}");
}

pub(crate) async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

async fn run(args: Args) -> anyhow::Result<()> {
    let bin_dir = match &args.bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()?
            .parent()
            .map(PathBuf::from)
            .context("no binary directory")?,
    };
    let has_spdk = datapath::agent_has_spdk(&bin_dir);
    let engine = match args.engine.as_str() {
        "file" => Engine::File,
        "spdk" if !has_spdk => anyhow::bail!(
            "--engine spdk: the disk-agent in {} was built without SPDK (scripts/run.sh builds it with SPDK when SPDK is installed)",
            bin_dir.display()
        ),
        "spdk" => Engine::Spdk,
        _ if has_spdk => Engine::Spdk,
        _ => {
            say(
                "the disk-agent was built without SPDK (none was found at build time): using the file engine",
            );
            Engine::File
        }
    };
    if engine == Engine::Spdk && !datapath::kernel_has_nvme_tcp() {
        say(
            "this kernel has no NVMe/TCP initiator (nvme_tcp): volumes are not mounted; their data path is shown with SPDK's userspace initiator (nvmf-check) instead",
        );
    }
    if args.dir.exists() {
        // A run killed earlier may have left namespaces, processes and mounts behind.
        for undone in liteio_local::netns::cleanup(&args.dir) {
            say(&format!("cleanup of an earlier run: {undone}"));
        }
        if let Some(undone) = liteio_local::hugepages::restore_after_crash(&args.dir) {
            say(&format!("cleanup of an earlier run: {undone}"));
        }
        std::fs::remove_dir_all(&args.dir)
            .with_context(|| format!("cannot clear {}", args.dir.display()))?;
    }
    if args.nodes > 1 {
        if args.hugepages.is_some() {
            anyhow::bail!("--hugepages is for the single-node run for now (without --nodes)");
        }
        if args.agent_metrics_addr.is_some() || args.spdk_polling {
            anyhow::bail!(
                "--agent-metrics-addr and --spdk-polling are for the single-node run (without --nodes)"
            );
        }
        return nodes_cmd::run(&args, &bin_dir, engine).await;
    }
    // Held until the agent stopped; dropped on every early return (unmounted, given back).
    let huge = reserve_hugepages(&args, has_spdk)?;
    let memory = huge
        .as_ref()
        .map_or(SpdkMemory::NoHuge, RunHugepages::memory);
    say(&format!(
        "starting LiteIO in {} ({engine} engine, node {}, SPDK on {}, {})",
        args.dir.display(),
        args.node,
        match &memory {
            SpdkMemory::NoHuge => "ordinary memory: the no-huge development mode".to_string(),
            SpdkMemory::Hugepages { mem_mib, .. } => format!("{mem_mib} MiB of hugepages"),
        },
        if args.spdk_polling {
            "its reactor polling core 0"
        } else {
            "its reactor in interrupt mode"
        }
    ));
    let tuning = AgentTuning {
        memory,
        metrics: args.agent_metrics_addr,
        spdk_polling: args.spdk_polling,
    };
    let start = Local::start_tuned(
        &args.dir,
        &bin_dir,
        &args.node,
        engine,
        liteio_local::ApiSource::Test,
        args.pool_size_gib << 30,
        tuning,
    );
    // A Ctrl-C while starting stops what started (and gives the hugepages back) instead of
    // leaving the components running.
    let mut local = tokio::select! {
        r = start => r?,
        r = wait_for_signal() => {
            r?;
            anyhow::bail!("interrupted while starting; the components started so far were killed");
        }
    };
    say(&format!(
        "test API server ready on 127.0.0.1:{}; controller, disk-agent and CSI driver ready",
        local.api_port
    ));
    if let Some(note) = &local.pool_note {
        say(note);
    }
    if let Some(addr) = args.agent_metrics_addr {
        say(&format!(
            "the disk-agent serves its metrics at http://{addr}/metrics"
        ));
    }
    // The components run in their own process group and would outlive a killed run (the
    // agent holding its hugepages): the next run in --dir stops what is recorded here.
    let mut ledger = liteio_local::netns::Ledger::create(&args.dir)?;
    for c in [
        Component::ApiServer,
        Component::Controller,
        Component::Agent,
        Component::Csi,
    ] {
        if let Some(pid) = local.pid(c) {
            ledger.add_process(pid, &format!("{c:?}"))?;
        }
    }
    if let (Some(h), Some(pid)) = (&huge, local.pid(Component::Agent)) {
        let mapped = liteio_node::hugepages::mapped_bytes(pid, h.mount_path()).unwrap_or(0);
        say(&format!(
            "the disk-agent's SPDK maps {} MiB from the hugetlbfs at {}",
            mapped >> 20,
            h.mount_path().display()
        ));
    }
    let result = if engine == Engine::Spdk && !datapath::kernel_has_nvme_tcp() {
        spdk_demo_and_wait(&mut local, &args).await
    } else {
        demo_and_wait(&mut local, &args).await
    };
    say("stopping components");
    local.stop().await;
    if let Some(h) = huge {
        match h.release() {
            Ok(done) => say(&done),
            Err(e) => say(&format!("cleanup: {e}")),
        }
    }
    // Normally nothing: the demo volume was unstaged through CSI. After a failed teardown
    // (a component gone), no mount or loop device of ours stays behind.
    for undone in liteio_local::release_host_resources(&args.dir) {
        say(&format!("cleanup: {undone}"));
    }
    if !args.keep {
        let _ = std::fs::remove_dir_all(&args.dir);
    }
    result
}

/// `--hugepages N`: the pages reserved and mounted in the run directory, or `None`.
fn reserve_hugepages(args: &Args, has_spdk: bool) -> anyhow::Result<Option<RunHugepages>> {
    let Some(pages) = args.hugepages else {
        return Ok(None);
    };
    if !has_spdk {
        anyhow::bail!(
            "--hugepages {pages}: the disk-agent was built without SPDK; nothing would use the pages"
        );
    }
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let h = RunHugepages::reserve(&args.dir, pages).map_err(|e| {
        anyhow::anyhow!(
            "--hugepages {pages}: {e}; without --hugepages SPDK runs on ordinary memory (the development mode)"
        )
    })?;
    say(&format!(
        "reserved {pages} 2 MiB hugepages ({} MiB) for this run in a hugetlbfs at {}; nr_hugepages {} -> {}",
        pages * 2,
        h.mount_path().display(),
        h.previous(),
        h.previous() + pages
    ));
    Ok(Some(h))
}

async fn demo_and_wait(local: &mut Local, args: &Args) -> anyhow::Result<()> {
    let mut csi = liteio_csi::client::connect(&local.csi_endpoint()).await?;
    say("creating the demo volume pvc-demo (512 MiB, xfs) through the CSI controller");
    let v = demo::provision(&mut csi, &local.dir, &local.node, "pvc-demo", 512 << 20).await?;
    let file = v.target.join("hello.txt");
    std::fs::write(&file, b"hello from LiteIO\n")
        .with_context(|| format!("cannot write {}", file.display()))?;
    let back = std::fs::read_to_string(&file)?;
    say(&format!(
        "volume {} is mounted at {}; wrote and read back {:?}",
        v.id,
        v.target.display(),
        back.trim()
    ));
    let kc = local.kubeconfig();
    println!(
        "\nLiteIO is running. Try:\n  kubectl --kubeconfig {kc} -n obnvmf get storagepools,antstorvolumes\n  \
         {bin}/csictl --endpoint {ep} list-volumes\n  ls {mnt}\nLogs: {dir}/*.log. Press Ctrl-C to clean up and stop.\n",
        kc = kc.display(),
        bin = local.bin_dir.display(),
        ep = local.csi_endpoint(),
        mnt = v.target.display(),
        dir = local.dir.display(),
    );
    if !args.once {
        wait_for_signal().await?;
    }
    say("unpublishing, unstaging and deleting the demo volume");
    demo::remove(&mut csi, &v).await?;
    say("demo volume removed");
    Ok(())
}

/// The demo on the SPDK engine where the kernel cannot mount NVMe/TCP: the volume is created
/// through CSI and exported by the agent's embedded target; `nvmf-check` connects to it as
/// this node's host, writes and reads back, and runs a few seconds of 4 KiB random I/O.
async fn spdk_demo_and_wait(local: &mut Local, args: &Args) -> anyhow::Result<()> {
    let mut csi = liteio_csi::client::connect(&local.csi_endpoint()).await?;
    say("creating the demo volume pvc-demo (512 MiB) through the CSI controller");
    let v = demo::create(&mut csi, &local.node, "pvc-demo", 512 << 20, &[]).await?;
    let result = show_data_path(local, &v.name).await;
    if result.is_ok() {
        println!(
            "\nLiteIO is running on its SPDK engine. Try:\n  kubectl --kubeconfig {kc} -n obnvmf get storagepools,antstorvolumes\n  \
             {bin}/csictl --endpoint {ep} list-volumes\nLogs: {dir}/*.log. Press Ctrl-C to clean up and stop.\n",
            kc = local.kubeconfig().display(),
            bin = local.bin_dir.display(),
            ep = local.csi_endpoint(),
            dir = local.dir.display(),
        );
        if !args.once {
            wait_for_signal().await?;
        }
    }
    say("deleting the demo volume");
    demo::delete(&mut csi, &v.id).await?;
    say("demo volume removed");
    result
}

async fn show_data_path(local: &Local, name: &str) -> anyhow::Result<()> {
    let client = local.kube().await?;
    let agent_log = local.dir.join("disk-agent.log");
    let t = datapath::wait_exported(&client, name, 120, &agent_log).await?;
    say(&format!(
        "{name} is exported by the agent's SPDK target at {}:{} as {}",
        t.address, t.svc_id, t.subsys_nqn
    ));
    let hostnqn = local.dir.join("hostnqn");
    say(
        "connecting with SPDK's userspace NVMe/TCP initiator as this node's host NQN: write 4 MiB, read back, then 3 s of 4 KiB random I/O",
    );
    let keys = datapath::keys_file(&client, name, &local.dir).await?;
    let cmd = datapath::check_command(
        &local.bin_dir,
        &[],
        &t,
        datapath::HostNqn::File(&hostnqn),
        keys.as_ref(),
        &["--check-bytes", "4194304", "--random-seconds", "3"],
    );
    let out = datapath::run_check(cmd, std::time::Duration::from_secs(120)).await?;
    for l in &out.lines {
        println!("    {l}");
    }
    if out.code != 0 {
        anyhow::bail!(
            "nvmf-check failed (exit {}): {}\n{}",
            out.code,
            out.result,
            out.stderr
        );
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("liteio-local: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("liteio-local: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
