//! Noisy-neighbour benchmark (QoS issue): two volumes (thick lvols) of one lvstore on an aio
//! file, through the embedded SPDK's bdev layer with channels held as the NVMe-oF target
//! holds them. Volume A writes 4 KiB at random with `--depth` writers (unlimited); volume B
//! reads 4 KiB at random, one at a time. Printed per run: B's p50/p99 read latency alone,
//! beside A, and beside A limited to `--fraction` of the IOPS A reached alone; A's IOPS in
//! each case. The worst run (highest ratio of B's p99 beside limited A to B's p99 alone) is
//! printed last. Latencies include the hop from the benchmark's task to SPDK's thread
//! (the same in every case).
//!
//! `cargo run --release -p liteio-agent --features spdk --example bench_qos -- [--runs 3]
//! [--seconds 5] [--depth 64] [--fraction 0.25] [--file /var/tmp/liteio-bench-qos.img]`

#[cfg(not(feature = "spdk"))]
fn main() {
    eprintln!(
        "bench_qos needs the `spdk` feature: cargo run -p liteio-agent --features spdk --example bench_qos"
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
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use anyhow::Context;
    use clap::Parser;
    use liteio_agent::spdk::bdev::{self, QosLimits};
    use liteio_agent::spdk::{Spdk, SpdkOptions, io, lvol};

    const MIB: u64 = 1 << 20;
    const VOL: u64 = 256 * MIB;
    const BLOCK: u64 = 4096;

    /// Noisy neighbour on one pool: B's read latency alone, beside A, beside A limited.
    #[derive(Parser, Debug)]
    struct Args {
        /// Runs; the worst is printed last.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// A's writers (its queue depth).
        #[arg(long, default_value_t = 64)]
        depth: usize,
        /// A's IOPS limit as a fraction of what A reached alone (rounded down to SPDK's
        /// step of 1000, at least 1000).
        #[arg(long, default_value_t = 0.25)]
        fraction: f64,
        /// The pool's backing file (created, 1 GiB; removed at the end).
        #[arg(long, default_value = "/var/tmp/liteio-bench-qos.img")]
        file: PathBuf,
    }

    /// A pseudo-random block of a volume, from a counter (no RNG crate needed).
    fn block(seed: u64) -> u64 {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (seed >> 29);
        x ^= x >> 31;
        x % (VOL / BLOCK)
    }

    /// A: `depth` writers until `stop`; returns the writes done.
    fn noisy(name: String, depth: usize, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
        tokio::spawn(async move {
            let done = Arc::new(AtomicU64::new(0));
            let mut tasks = Vec::new();
            for w in 0..depth {
                let (name, stop, done) = (name.clone(), Arc::clone(&stop), Arc::clone(&done));
                tasks.push(tokio::spawn(async move {
                    let mut i = w as u64 * 1_000_003;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        let _ =
                            io::write_at(&name, block(i) * BLOCK, vec![0x5a; BLOCK as usize]).await;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
            done.load(Ordering::Relaxed)
        })
    }

    /// B: one read at a time for `secs`; sorted latencies in microseconds.
    async fn reads(name: &str, secs: u64) -> anyhow::Result<Vec<u64>> {
        let until = Instant::now() + Duration::from_secs(secs);
        let mut lat = Vec::new();
        let mut i = 7u64;
        while Instant::now() < until {
            i += 1;
            let t = Instant::now();
            io::read_at(name, block(i) * BLOCK, BLOCK as usize).await?;
            lat.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
        }
        lat.sort_unstable();
        Ok(lat)
    }

    fn pct(sorted: &[u64], p: f64) -> u64 {
        if sorted.is_empty() {
            return 0;
        }
        let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
        sorted[i.min(sorted.len() - 1)]
    }

    struct Run {
        alone: (u64, u64),
        beside: (u64, u64),
        limited: (u64, u64),
        a_iops: f64,
        a_beside_iops: f64,
        limit: u64,
        a_limited_iops: f64,
    }

    async fn one_run(a: &Args, vol_a: &str, vol_b: &str) -> anyhow::Result<Run> {
        let secs = a.seconds;
        bdev::set_qos_limits(vol_a, QosLimits::default()).await?;
        // A alone: its unlimited rate.
        let stop = Arc::new(AtomicBool::new(false));
        let t = Instant::now();
        let h = noisy(vol_a.to_string(), a.depth, Arc::clone(&stop));
        tokio::time::sleep(Duration::from_secs(secs)).await;
        stop.store(true, Ordering::Relaxed);
        let a_iops = h.await? as f64 / t.elapsed().as_secs_f64();
        // B alone.
        let alone = reads(vol_b, secs).await?;
        // B beside A.
        let stop = Arc::new(AtomicBool::new(false));
        let t = Instant::now();
        let h = noisy(vol_a.to_string(), a.depth, Arc::clone(&stop));
        let beside = reads(vol_b, secs).await?;
        stop.store(true, Ordering::Relaxed);
        let a_beside_iops = h.await? as f64 / t.elapsed().as_secs_f64();
        // B beside A limited.
        let limit = (((a_iops * a.fraction) / 1000.0).floor() as u64 * 1000).max(1000);
        bdev::set_qos_limits(
            vol_a,
            QosLimits {
                rw_iops: limit,
                ..QosLimits::default()
            },
        )
        .await?;
        let stop = Arc::new(AtomicBool::new(false));
        let t = Instant::now();
        let h = noisy(vol_a.to_string(), a.depth, Arc::clone(&stop));
        let limited = reads(vol_b, secs).await?;
        stop.store(true, Ordering::Relaxed);
        let a_limited_iops = h.await? as f64 / t.elapsed().as_secs_f64();
        bdev::set_qos_limits(vol_a, QosLimits::default()).await?;
        let p = |v: &[u64]| (pct(v, 0.5), pct(v, 0.99));
        Ok(Run {
            alone: p(&alone),
            beside: p(&beside),
            limited: p(&limited),
            a_iops,
            a_beside_iops,
            limit,
            a_limited_iops,
        })
    }

    fn row(r: &Run) -> String {
        format!(
            "{:>9.0} {:>7}/{:<7} {:>9.0} {:>7}/{:<7} {:>6} {:>9.0} {:>7}/{:<7} {:>6.2}",
            r.a_iops,
            r.alone.0,
            r.alone.1,
            r.a_beside_iops,
            r.beside.0,
            r.beside.1,
            r.limit,
            r.a_limited_iops,
            r.limited.0,
            r.limited.1,
            r.limited.1 as f64 / r.alone.1.max(1) as f64,
        )
    }

    const HEADER: &str = "A-alone   B-alone p50/p99  A-beside  B-beside p50/p99  limit  A-limited B-limited p50/p99  B-p99-limited/alone   (IOPS; us)";

    pub fn main() -> anyhow::Result<()> {
        let a = Args::parse();
        let _spdk = Spdk::start(&SpdkOptions {
            name: "liteio-bench-qos".into(),
            ..SpdkOptions::small()
        })?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let file = a.file.clone();
        let result = rt.block_on(async {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .open(&file)
                .with_context(|| format!("create {}", file.display()))?;
            f.set_len(1 << 30)?;
            drop(f);
            bdev::create_aio("qos_aio", &file, 4096).await?;
            lvol::create_lvstore("qos_aio", "qos_lvs", 4 << 20).await?;
            let va = lvol::create_lvol("qos_lvs", "vol_a", VOL, false, lvol::Clear::WriteZeroes)
                .await?
                .alias();
            let vb = lvol::create_lvol("qos_lvs", "vol_b", VOL, false, lvol::Clear::WriteZeroes)
                .await?
                .alias();
            // Real data under B, so its reads reach the disk.
            let chunk = vec![0xb7u8; MIB as usize];
            for off in (0..VOL).step_by(MIB as usize) {
                io::write_at(&vb, off, chunk.clone()).await?;
            }
            let _ha = io::hold_channel(&va).await?;
            let _hb = io::hold_channel(&vb).await?;
            println!(
                "A: {} writers of 4 KiB at random; B: one 4 KiB read at a time; {} s each; lvstore on {}",
                a.depth,
                a.seconds,
                file.display()
            );
            println!("{HEADER}");
            let mut runs = Vec::new();
            for _ in 0..a.runs {
                let r = one_run(&a, &va, &vb).await?;
                println!("{}", row(&r));
                runs.push(r);
            }
            let worst = runs
                .iter()
                .max_by(|x, y| {
                    let rx = x.limited.1 as f64 / x.alone.1.max(1) as f64;
                    let ry = y.limited.1 as f64 / y.alone.1.max(1) as f64;
                    rx.total_cmp(&ry)
                })
                .context("no run")?;
            println!("worst of {} runs:\n{HEADER}\n{}", a.runs, row(worst));
            anyhow::Ok(())
        });
        let _ = std::fs::remove_file(&file);
        result
    }
}
