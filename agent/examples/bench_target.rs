//! The agent's in-process NVMe-oF target for `scripts/bench-spdk.sh`: starts the embedded
//! SPDK runtime, builds one export (a null bdev, or aio file → lvstore → lvol) and serves it
//! on 127.0.0.1 until SIGINT/SIGTERM. Prints `READY <nqn>` once the export is up.
//!
//! Needs the `spdk` feature:
//! `cargo run --release -p liteio-agent --features spdk --example bench_target -- --help`

#[cfg(not(feature = "spdk"))]
fn main() {
    eprintln!(
        "bench_target needs the `spdk` feature: cargo run -p liteio-agent --features spdk --example bench_target"
    );
    std::process::exit(2);
}

#[cfg(feature = "spdk")]
fn main() -> anyhow::Result<()> {
    bench::main()
}

#[cfg(feature = "spdk")]
mod bench {
    use std::path::PathBuf;

    use anyhow::Context;
    use clap::Parser;
    use liteio_agent::spdk::nvmf::{self, SubsystemSpec, TcpTransportOptions};
    use liteio_agent::spdk::{Spdk, SpdkOptions, bdev, lvol};

    /// In-process NVMe-oF/TCP target of the LiteIO agent, for benchmarks.
    #[derive(Parser, Debug)]
    struct Args {
        /// What to export: `null` (a null bdev) or `lvol` (aio file → lvstore → lvol).
        #[arg(long, default_value = "null")]
        case: String,
        /// TCP port of the listener on 127.0.0.1.
        #[arg(long, default_value_t = 4420)]
        port: u16,
        /// Reactor core mask.
        #[arg(long, default_value = "0x1")]
        core_mask: String,
        /// Interrupt mode instead of polling.
        #[arg(long)]
        interrupt: bool,
        /// Memory in MiB (no hugepages).
        #[arg(long, default_value_t = 1024)]
        mem_size: u32,
        /// Backing file of the lvol case (created with --size bytes when missing).
        #[arg(long, default_value = "/var/tmp/liteio-bench.img")]
        aio_file: PathBuf,
        /// Size in MiB of the null bdev, the aio file and the lvol (the lvol takes half).
        #[arg(long, default_value_t = 1024)]
        size_mib: u64,
        /// Subsystem NQN.
        #[arg(long, default_value = "nqn.2016-06.io.spdk:bench")]
        nqn: String,
        /// Host NQN allowed to connect.
        #[arg(
            long,
            default_value = "nqn.2014-08.org.nvmexpress:uuid:6b1c7a70-3f5e-4b6e-9c1d-2a3b4c5d6e7f"
        )]
        host: String,
    }

    pub fn main() -> anyhow::Result<()> {
        let a = Args::parse();
        let spdk = Spdk::start(&SpdkOptions {
            name: "liteio-bench".into(),
            core_mask: a.core_mask.clone(),
            interrupt_mode: a.interrupt,
            no_huge: true,
            mem_size_mb: a.mem_size,
            huge_dir: None,
            no_pci: true,
            rpc_socket: None,
            trace_entries: 0,
            lock_cores: true,
            request_timeout: liteio_agent::spdk::runtime::DEFAULT_REQUEST_TIMEOUT,
            ..SpdkOptions::default()
        })?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mib = 1u64 << 20;
        rt.block_on(async {
            let bdev_name = match a.case.as_str() {
                "null" => {
                    bdev::create_null("bench_null", a.size_mib * mib, 512)
                        .await?
                        .name
                }
                "lvol" => {
                    let f = std::fs::OpenOptions::new()
                        .create(true)
                        .truncate(false)
                        .write(true)
                        .open(&a.aio_file)?;
                    f.set_len(a.size_mib * mib)?;
                    bdev::create_aio("bench_aio", &a.aio_file, 512).await?;
                    bdev::wait_for_examine().await?;
                    if lvol::lvstore("bench_lvs").await?.is_none() {
                        lvol::create_lvstore("bench_aio", "bench_lvs", 4 << 20).await?;
                    }
                    lvol::create_lvol(
                        "bench_lvs",
                        "bench_vol",
                        a.size_mib * mib / 2,
                        false,
                        lvol::Clear::WriteZeroes,
                    )
                    .await?
                    .alias()
                }
                other => anyhow::bail!("--case {other:?} is not one of null, lvol"),
            };
            nvmf::ensure_tcp_transport(&TcpTransportOptions::default()).await?;
            nvmf::create_subsystem(SubsystemSpec {
                nqn: a.nqn.clone(),
                serial: "LITEIOBENCH0001".into(),
                model: "LiteIO bench".into(),
                bdev: bdev_name,
                ns_uuid: "0b9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a11".into(),
                address: "127.0.0.1".into(),
                port: a.port,
                hosts: vec![a.host.clone()],
                keys: Default::default(),
                secure_channel: false,
                keyless_hosts: Vec::new(),
                multipath: None,
            })
            .await?;
            println!("READY {}", a.nqn);
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            anyhow::Ok(())
        })
        .context("bench target")?;
        spdk.stop();
        Ok(())
    }
}
