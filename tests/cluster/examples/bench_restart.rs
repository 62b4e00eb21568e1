//! Restart benchmark (issue 29): what a storage node's agent restart costs the hosts of its
//! volumes, for a planned restart (SIGTERM, as a DaemonSet rollout does) and a crash
//! (SIGKILL), with 1 and 50 volumes on the node.
//!
//! A two-node `liteio-local` cluster on the SPDK engine (network namespaces, the real
//! controller, agents and CSI controller): the volumes live on node 1 and are consumed by
//! node 2. A writer on node 2 (`nvmf-check --verify-writes`-style writes with reconnects,
//! SPDK's initiator; one volume) writes while node 1's agent is stopped and started again.
//! Each restart is measured twice: with the node's export record (`nvmf.exportRecordDir`,
//! the exports served again from it before the API server is asked) and without it (the
//! volume reconcilers alone restore them), the same cluster, volumes and host.
//! Printed per run and as the worst of the runs:
//! - the longest write the host saw across the restart, and whether any write failed;
//! - the steps, from the agent's own log on one clock: signal → reconcilers stopped → SPDK
//!   stopped → process gone; new process → SPDK started ("pool ready": SPDK up and the
//!   lvstore loaded) → exports served from the record (with it) → first volume listening →
//!   every volume listening ("served again") →
//!   `/readyz` 200 (the agent's own word for it, what a DaemonSet rollout waits for).
//!
//! `cargo run -p liteio-cluster-tests --features spdk --example bench_restart [-- --volumes 1,50]
//! [--runs 3] [--write-seconds 30]`; root, network namespaces and the workspace's binaries
//! (`cargo build --workspace --features liteio-agent/spdk`).

#[cfg(not(feature = "spdk"))]
fn main() {
    eprintln!(
        "bench_restart needs the `spdk` feature: cargo run -p liteio-cluster-tests --features spdk --example bench_restart"
    );
    std::process::exit(2);
}

#[cfg(feature = "spdk")]
fn main() {
    bench::main();
}

#[cfg(feature = "spdk")]
mod bench {
    use std::collections::HashMap;
    use std::path::Path;

    use std::time::{Duration, SystemTime};

    use liteio_api::common::SpdkTarget;
    use liteio_local::Engine;
    use liteio_local::cluster::{Cluster, ClusterOptions, Role};
    use liteio_local::datapath::{self};

    use liteio_cluster_tests::*;

    const USAGE: &str = "\
bench_restart [--volumes 1,50] [--runs 3] [--write-seconds 30]

Restarts the agent of a storage node (SIGTERM then start, and SIGKILL then start) while a
host writes to one of its volumes, and prints the longest write and the restart's steps.
  --volumes LIST      volume counts on the node, measured in this order (default 1,50)
  --runs N            restarts of each kind per count; the worst is printed last (default 3)
  --write-seconds S   how long the host writes per restart (default 30; must cover it)
";

    struct Args {
        volumes: Vec<usize>,
        runs: usize,
        write_seconds: u64,
    }

    fn args() -> Args {
        let mut a = Args {
            volumes: vec![1, 50],
            runs: 3,
            write_seconds: 30,
        };
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            let mut value = |name: &str| {
                it.next().unwrap_or_else(|| {
                    eprintln!("{name} needs a value\n\n{USAGE}");
                    std::process::exit(2)
                })
            };
            match arg.as_str() {
                "--volumes" => {
                    a.volumes = value("--volumes")
                        .split(',')
                        .map(|v| {
                            v.trim().parse().unwrap_or_else(|_| {
                                eprintln!("--volumes: {v:?} is not a count\n\n{USAGE}");
                                std::process::exit(2)
                            })
                        })
                        .collect();
                    a.volumes.sort_unstable();
                }
                "--runs" => {
                    a.runs = value("--runs").parse().unwrap_or_else(|_| {
                        eprintln!("--runs: not a count\n\n{USAGE}");
                        std::process::exit(2)
                    });
                }
                "--write-seconds" => {
                    a.write_seconds = value("--write-seconds").parse().unwrap_or_else(|_| {
                        eprintln!("--write-seconds: not a number\n\n{USAGE}");
                        std::process::exit(2)
                    });
                }
                "-h" | "--help" => {
                    print!("{USAGE}");
                    std::process::exit(0)
                }
                other => {
                    eprintln!("unknown argument {other:?}\n\n{USAGE}");
                    std::process::exit(2)
                }
            }
        }
        a
    }

    /// Seconds since the epoch of an RFC 3339 UTC timestamp as the agent logs it
    /// (`2026-12-04T16:14:56.085167Z`).
    pub fn parse_utc(ts: &str) -> Option<f64> {
        let (date, time) = ts.trim_end_matches('Z').split_once('T')?;
        let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
        let (y, m, day) = (d.next()??, d.next()??, d.next()??);
        let mut t = time.split(':');
        let (h, min) = (
            t.next()?.parse::<f64>().ok()?,
            t.next()?.parse::<f64>().ok()?,
        );
        let s: f64 = t.next()?.parse().ok()?;
        // Days from 1970-01-01 of a proleptic Gregorian date.
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = (m + 9) % 12;
        let doy = (153 * mp + 2) / 5 + day - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        Some(days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + s)
    }

    fn now() -> f64 {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    }

    /// The agent's log lines after byte `from`: (seconds since the epoch, message).
    fn log_events(path: &Path, from: usize) -> Vec<(f64, String)> {
        let text = std::fs::read(path).unwrap_or_default();
        let text = String::from_utf8_lossy(text.get(from..).unwrap_or_default());
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| {
                let t = parse_utc(v["timestamp"].as_str()?)?;
                Some((t, v["fields"]["message"].as_str()?.to_string()))
            })
            .collect()
    }

    /// One restart, measured.
    #[derive(Debug, Clone, Default)]
    struct Restart {
        /// Longest write the host saw (ms), and whether every write succeeded and verified.
        longest_write_ms: f64,
        ok: bool,
        /// Steps, in seconds from the signal.
        stopped_reconcilers: Option<f64>,
        spdk_stopped: Option<f64>,
        gone: f64,
        started: f64,
        pool_ready: Option<f64>,
        /// The agent served the recorded exports again.
        from_record: Option<f64>,
        first_listening: Option<f64>,
        all_listening: Option<f64>,
        /// `/readyz` answered 200 (the agent's own "every export listens again").
        ready: Option<f64>,
    }

    fn opt(v: Option<f64>) -> String {
        v.map_or_else(|| "-".to_string(), |s| format!("{s:.2}"))
    }

    impl Restart {
        fn row(&self, n: usize, kind: &str) -> String {
            format!(
                "{n:>4} {kind:<12} {:>10.0} {:>5} {:>8} {:>8} {:>6.2} {:>8.2} {:>8} {:>8} {:>8} {:>8} {:>8}",
                self.longest_write_ms,
                if self.ok { "0" } else { "FAIL" },
                opt(self.stopped_reconcilers),
                opt(self.spdk_stopped),
                self.gone,
                self.started,
                opt(self.pool_ready),
                opt(self.from_record),
                opt(self.first_listening),
                opt(self.all_listening),
                opt(self.ready),
            )
        }
    }

    const HEADER: &str = "vols kind         longest-ms  errs recon-st spdk-st  gone  started pool-rdy   record first-ln  all-ln   readyz";

    async fn make_volume(c: &Cluster, i: usize) -> Result<SpdkTarget, String> {
        let name = format!("pvc-r{i:03}");
        let params = HashMap::from([("positionAdvice".to_string(), "MustRemote".to_string())]);
        create_volume_with(c, &name, Some(c.node_name(2)), params)
            .await
            .map_err(err("join"))??;
        eventually(c, &format!("{name} ready"), 120, Role::Agent(1), || async {
            volume(c, &name).await.is_some_and(|v| is_ready(&v))
        })
        .await?;
        let v = volume(c, &name).await.ok_or("volume gone")?;
        if v.target_node() != Some(c.node_name(1).as_str()) {
            return Err(format!("{name} is not on {}", c.node_name(1)));
        }
        v.spec
            .spdk_target
            .ok_or_else(|| format!("{name}: no spdkTarget"))
    }

    /// Node 1's agent config with or without the export record: the next start reads it.
    fn set_record(c: &Cluster, record: bool) -> Result<(), String> {
        let path = c.node_dir(1).join("agent-config.yaml");
        let text = std::fs::read_to_string(&path).map_err(err("agent config"))?;
        let mut cfg =
            liteio_agent::config::Config::from_yaml(&text).map_err(err("agent config"))?;
        cfg.nvmf.export_record_dir = record.then(|| c.node_dir(1).join("exports"));
        let text = serde_yaml::to_string(&cfg).map_err(err("agent config"))?;
        std::fs::write(&path, text).map_err(err("agent config"))
    }

    /// Restarts node 1's agent (`kill`: SIGKILL, else SIGTERM) while the host writes to
    /// `t`; `n` volumes are on the node.
    async fn restart(
        c: &mut Cluster,
        t: &SpdkTarget,
        keys: &datapath::KeysFile,
        n: usize,
        kill: bool,
        write_seconds: u64,
    ) -> Result<Restart, String> {
        let host = Host::sequential(c, 2, 2, t, Some(keys), write_seconds, 120).await?;
        let log = c.log(Role::Agent(1));
        let from = std::fs::metadata(&log).map_or(0, |m| m.len() as usize);
        let t0 = now();
        if kill {
            c.kill(Role::Agent(1)).await.map_err(err("kill"))?;
        } else {
            c.stop(Role::Agent(1)).await.map_err(err("stop"))?;
        }
        let gone = now() - t0;
        let launched = now();
        c.launch(Role::Agent(1)).await.map_err(err("start"))?;
        // Served again: every volume's subsystem listens in the new process, and the agent
        // says it is ready.
        let metrics = c
            .agent_metrics_addr(1)
            .map_err(err("metrics address"))?
            .to_string();
        let deadline = std::time::Instant::now() + Duration::from_secs(180);
        let mut ready = None;
        let events = loop {
            if ready.is_none()
                && liteio_local::cluster::http_get(&metrics, "/readyz")
                    .await
                    .is_some()
            {
                ready = Some(now() - t0);
            }
            let ev = log_events(&log, from);
            let listening = ev
                .iter()
                .filter(|(t, m)| *t >= launched && m == "NVMe-oF subsystem listening")
                .count();
            if listening >= n && ready.is_some() {
                break ev;
            }
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "only {listening} of {n} volumes listen again after 180 s"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let HostResult {
            status, result: r, ..
        } = host.end(Duration::from_secs(360)).await?;
        let first = |msg: &str, after: f64| {
            events
                .iter()
                .find(|(t, m)| *t >= after && m == msg)
                .map(|(t, _)| t - t0)
        };
        let listening: Vec<f64> = events
            .iter()
            .filter(|(t, m)| *t >= launched && m == "NVMe-oF subsystem listening")
            .map(|(t, _)| t - t0)
            .collect();
        Ok(Restart {
            longest_write_ms: r["longest_stall_ms"].as_f64().unwrap_or(f64::NAN),
            ok: status.success() && r["ok"] == true,
            stopped_reconcilers: first("reconcilers stopped", t0),
            spdk_stopped: first("SPDK stopped", t0),
            gone,
            started: first("starting SPDK", launched).unwrap_or(launched - t0),
            pool_ready: first("pool ready", launched),
            from_record: first("exports served again from the node's record", launched),
            first_listening: listening.first().copied(),
            all_listening: listening.get(n.saturating_sub(1)).copied(),
            ready,
        })
    }

    pub fn main() {
        let a = args();
        if skip("bench_restart") {
            std::process::exit(2);
        }
        let dir = scratch("bench-restart");
        let mut opts = ClusterOptions::new(2, Engine::Spdk);
        let max = a.volumes.iter().copied().max().unwrap_or(1);
        // Each volume is 64 MiB (csi-sanity's default size here); a sparse pool file with
        // room for all of them and the lvstore's metadata.
        opts.pool_bytes = (8u64 << 30).max((max as u64 + 16) * (64 << 20) * 5 / 4);
        opts.max_remote_volumes = Some(u32::try_from(max).unwrap_or(u32::MAX));
        let limit = Duration::from_secs(
            600 + 60 * max as u64 + 200 * a.runs as u64 * a.volumes.len() as u64,
        );
        with_cluster(&dir, opts, limit, |c| {
            Box::pin(async move {
                let first = make_volume(c, 0).await?;
                let client = c.kube().await.map_err(err("kube"))?;
                let keys = datapath::keys_file(&client, "pvc-r000", &c.node_dir(2))
                    .await
                    .map_err(err("keys"))?
                    .ok_or("no Secret for pvc-r000")?;
                let mut made = 1;
                let mut worst: Vec<String> = Vec::new();
                println!("{HEADER}   (steps in s from the signal)");
                for &n in &a.volumes {
                    while made < n {
                        make_volume(c, made).await?;
                        made += 1;
                    }
                    // Each kind without the record, then with it: the agent left running
                    // has one, so the volumes made for the next count are recorded.
                    for (kill, record) in
                        [(false, false), (false, true), (true, false), (true, true)]
                    {
                        let kind = match (kill, record) {
                            (false, true) => "SIGTERM+rec",
                            (false, false) => "SIGTERM",
                            (true, true) => "SIGKILL+rec",
                            (true, false) => "SIGKILL",
                        };
                        // Read by the restarted agent.
                        set_record(c, record)?;
                        let mut runs = Vec::new();
                        for _ in 0..a.runs {
                            let r = restart(c, &first, &keys, n, kill, a.write_seconds).await?;
                            println!("{}", r.row(n, kind));
                            runs.push(r);
                        }
                        let w = runs
                            .iter()
                            .max_by(|x, y| x.longest_write_ms.total_cmp(&y.longest_write_ms))
                            .cloned()
                            .unwrap_or_default();
                        let mut w2 = w.clone();
                        w2.ok = runs.iter().all(|r| r.ok);
                        w2.all_listening = runs
                            .iter()
                            .filter_map(|r| r.all_listening)
                            .max_by(f64::total_cmp);
                        w2.ready = runs.iter().filter_map(|r| r.ready).max_by(f64::total_cmp);
                        worst.push(w2.row(n, kind));
                    }
                }
                println!(
                    "\nworst of {} runs (longest write; slowest 'all listening'):",
                    a.runs
                );
                println!("{HEADER}");
                for l in worst {
                    println!("{l}");
                }
                Ok(())
            })
        });
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn parses_the_agents_timestamps() {
            assert_eq!(super::parse_utc("1970-01-01T00:00:01.5Z"), Some(1.5));
            assert_eq!(
                super::parse_utc("2026-12-04T16:14:56.085167Z").map(|s| s.floor()),
                Some(1_796_400_896.0)
            );
        }
    }
}
