//! Export probe (issue 30, "O(1) per export"): the time of one more export, and of its
//! removal, as the node already serves more volumes. The embedded SPDK target (no hugepages,
//! interrupt mode unless `--polling`) gets thin lvols on an aio lvstore, exported through
//! the agent's `SpdkExporter` until LEVEL exports exist; at each level, K further volumes
//! are exported one after another (each timed) and removed again (each timed), then the
//! same K at once (a burst: wall time per export). The per-export time should stay flat
//! from 100 to 5,000 existing exports.
//!
//! `cargo run --release -p liteio-agent --features spdk --example bench_export -- [--levels 100,1000,5000] [--probe K] [--polling]`

#[cfg(not(feature = "spdk"))]
fn main() {
    eprintln!(
        "bench_export needs the `spdk` feature: cargo run -p liteio-agent --features spdk --example bench_export"
    );
    std::process::exit(2);
}

#[cfg(feature = "spdk")]
fn main() -> anyhow::Result<()> {
    bench::main()
}

#[cfg(feature = "spdk")]
mod bench {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use anyhow::Context;
    use futures::StreamExt;
    use liteio_agent::exporter::{ExportRequest, Exporter, UnexportRequest};
    use liteio_agent::spdk::exporter::SpdkExporter;
    use liteio_agent::spdk::nvmf::TcpTransportOptions;
    use liteio_agent::spdk::{Spdk, SpdkOptions, bdev, lvol};
    use liteio_api::SpdkLvol;

    const USAGE: &str = "\
bench_export [--levels 100,1000,5000] [--probe K] [--polling] [--first-port P]

Exports volumes through the in-process SPDK target until each level of existing exports
is reached, and there times K more exports and their removals: one after another (mean,
p99) and all at once (wall time per export).
  --levels L,..  existing exports at which to probe (default 100,1000,5000)
  --probe K      exports timed at each level (default 50)
  --polling      SPDK's reactor polls (default: interrupt mode)
  --first-port P first port of the listen range (default 20000)
";
    const MIB: u64 = 1 << 20;
    const LVS: &str = "probe-lvs";
    const HOST: &str = "nqn.2021-03.com.alipay.host:uuid:probe-host";
    /// Exports made at once while filling up to a level (as the record's restore does).
    const FILL_PARALLEL: usize = 32;

    fn uuid(i: usize) -> String {
        format!("3e0a5c7d-0000-4000-8000-{i:012}")
    }

    fn lvol_name(i: usize) -> String {
        format!("probe-{i}")
    }

    fn request(i: usize) -> ExportRequest {
        ExportRequest {
            volume: lvol_name(i),
            uuid: uuid(i),
            device: None,
            lvol: Some(SpdkLvol {
                name: lvol_name(i),
                lvs_name: LVS.into(),
                thin: true,
            }),
            size_bytes: 4 * MIB,
            allowed_hosts: vec![HOST.into()],
            keyless_hosts: Vec::new(),
            preset: None,
            keys: None,
            path_state: Default::default(),
            qos: Default::default(),
            group_member: false,
        }
    }

    fn unexport(i: usize) -> UnexportRequest {
        UnexportRequest {
            volume: lvol_name(i),
            uuid: uuid(i),
            target: None,
        }
    }

    /// Mean and p99 in milliseconds.
    fn stats(mut d: Vec<Duration>) -> (f64, f64) {
        if d.is_empty() {
            return (0.0, 0.0);
        }
        d.sort();
        let ms = |x: Duration| x.as_secs_f64() * 1e3;
        let mean = d.iter().map(|x| ms(*x)).sum::<f64>() / d.len() as f64;
        let p99 = ms(d[((d.len() * 99).div_ceil(100)).saturating_sub(1)]);
        (mean, p99)
    }

    /// The thin lvols `from..to`, made `FILL_PARALLEL` at a time.
    async fn make_lvols(from: usize, to: usize) -> anyhow::Result<()> {
        let mut s = futures::stream::iter(from..to)
            .map(|i| async move {
                lvol::create_lvol(LVS, &lvol_name(i), 4 * MIB, true, lvol::Clear::Unmap)
                    .await
                    .with_context(|| format!("lvol {i}"))
            })
            .buffer_unordered(FILL_PARALLEL);
        while let Some(r) = s.next().await {
            r?;
        }
        Ok(())
    }

    /// Exports of volumes `from..to`, made `FILL_PARALLEL` at a time.
    async fn export_range(exp: &Arc<SpdkExporter>, from: usize, to: usize) -> anyhow::Result<()> {
        let mut s = futures::stream::iter(from..to)
            .map(|i| {
                let exp = exp.clone();
                async move {
                    exp.ensure_export(&request(i))
                        .await
                        .with_context(|| format!("export {i}"))
                }
            })
            .buffer_unordered(FILL_PARALLEL);
        while let Some(r) = s.next().await {
            r?;
        }
        Ok(())
    }

    struct Row {
        level: usize,
        export: (f64, f64),
        remove: (f64, f64),
        burst_export: f64,
        burst_remove: f64,
    }

    /// K exports of the probe volumes (numbered from `base`) and their removals, one after
    /// another, then all at once.
    async fn probe(
        exp: &Arc<SpdkExporter>,
        level: usize,
        base: usize,
        k: usize,
    ) -> anyhow::Result<Row> {
        let mut ex = Vec::with_capacity(k);
        let mut rm = Vec::with_capacity(k);
        for i in base..base + k {
            let t = Instant::now();
            exp.ensure_export(&request(i)).await?;
            ex.push(t.elapsed());
        }
        for i in base..base + k {
            let t = Instant::now();
            exp.remove_export(&unexport(i)).await?;
            rm.push(t.elapsed());
        }
        let t = Instant::now();
        let made = futures::future::join_all((base..base + k).map(|i| {
            let exp = exp.clone();
            async move { exp.ensure_export(&request(i)).await }
        }))
        .await;
        let burst_export = t.elapsed().as_secs_f64() * 1e3 / k as f64;
        for m in made {
            m?;
        }
        let t = Instant::now();
        let gone = futures::future::join_all((base..base + k).map(|i| {
            let exp = exp.clone();
            async move { exp.remove_export(&unexport(i)).await }
        }))
        .await;
        let burst_remove = t.elapsed().as_secs_f64() * 1e3 / k as f64;
        for g in gone {
            g?;
        }
        Ok(Row {
            level,
            export: stats(ex),
            remove: stats(rm),
            burst_export,
            burst_remove,
        })
    }

    pub fn main() -> anyhow::Result<()> {
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_writer(std::io::stderr)
            .init();
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
        let mut levels: Vec<usize> = value("--levels")
            .unwrap_or_else(|| "100,1000,5000".into())
            .split(',')
            .map(|l| {
                l.trim()
                    .parse()
                    .context("--levels: a comma-separated list of counts")
            })
            .collect::<anyhow::Result<_>>()?;
        levels.sort_unstable();
        let k: usize = value("--probe")
            .map(|v| v.parse().context("--probe: a count"))
            .transpose()?
            .unwrap_or(50)
            .max(1);
        let first_port: u16 = value("--first-port")
            .map(|v| v.parse().context("--first-port: a port"))
            .transpose()?
            .unwrap_or(20000);
        let polling = args.iter().any(|a| a == "--polling");
        let top = levels.last().copied().unwrap_or(0);
        let total = top + k;
        let slots = u32::try_from(total + 64).context("too many exports")?;
        let span = u16::try_from(total + 64).context("too many exports for one port range")?;
        let last_port = first_port
            .checked_add(span)
            .context("--first-port: the range passes 65535")?;

        let spdk = Spdk::start(&SpdkOptions {
            name: "bench-export".into(),
            interrupt_mode: !polling,
            max_subsystems: slots.max(1024),
            mem_size_mb: 2048,
            ..SpdkOptions::small()
        })?;
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("lvs.img");
        // Thin lvols take one metadata page each and no cluster; the blobstore has one
        // metadata page per cluster, so the (sparse) file has a cluster per volume and more.
        let bytes = ((total as u64 + 1024) * 4 * MIB).next_multiple_of(1 << 30);
        std::fs::File::create(&file)?.set_len(bytes)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let exp = Arc::new(SpdkExporter::new(
            "127.0.0.1",
            first_port..=last_port,
            TcpTransportOptions::default(),
        ));
        let rows = rt.block_on(async {
            bdev::create_aio_with("probe-aio", &file, 512, true).await?;
            lvol::create_lvstore("probe-aio", LVS, 0).await?;
            let t = Instant::now();
            make_lvols(0, total).await?;
            eprintln!(
                "{total} thin lvols made in {:.1} s",
                t.elapsed().as_secs_f64()
            );
            let mut rows = Vec::new();
            let mut have = 0;
            for &level in &levels {
                let t = Instant::now();
                export_range(&exp, have, level).await?;
                eprintln!(
                    "{} exports made ({level} exist) in {:.1} s",
                    level - have,
                    t.elapsed().as_secs_f64()
                );
                have = level;
                let row = probe(&exp, level, top, k).await?;
                eprintln!(
                    "level {level}: export {:.2} ms, remove {:.2} ms",
                    row.export.0, row.remove.0
                );
                rows.push(row);
            }
            anyhow::Ok(rows)
        })?;
        println!(
            "per-export time, K={k} probes at each level ({}, ms)",
            if polling { "polling" } else { "interrupt mode" }
        );
        println!(
            "{:>8} | {:>12} {:>12} | {:>12} {:>12} | {:>13} {:>13}",
            "existing",
            "export mean",
            "export p99",
            "remove mean",
            "remove p99",
            "burst export",
            "burst remove"
        );
        for r in &rows {
            println!(
                "{:>8} | {:>12.3} {:>12.3} | {:>12.3} {:>12.3} | {:>13.3} {:>13.3}",
                r.level,
                r.export.0,
                r.export.1,
                r.remove.0,
                r.remove.1,
                r.burst_export,
                r.burst_remove
            );
        }
        if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
            println!(
                "ratio {} → {}: export {:.2}×, remove {:.2}×, burst export {:.2}×",
                first.level,
                last.level,
                last.export.0 / first.export.0,
                last.remove.0 / first.remove.0,
                last.burst_export / first.burst_export
            );
        }
        drop(rt);
        spdk.stop();
        Ok(())
    }
}
