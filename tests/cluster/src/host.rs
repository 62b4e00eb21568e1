//! A host on a cluster node: `nvmf-check` (SPDK's userspace initiator, built with the
//! agent) run in a node's network namespace against a volume's export, with the host NQN
//! and keys the export admits. Three ways the tests drive it:
//! - [`Host`]: a long-running writer whose output lines are collected as they come (the
//!   verifying writer `--verify-writes`, told `stop`/`path …`/`detach …` on its stdin; or
//!   the sequential writer `--write-seconds`, which rides out reconnects);
//! - [`random_io`]: one bounded run of random I/O, its figures;
//! - [`nvmf_check`]: the command itself, for anything else.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use liteio_api::common::SpdkTarget;
use liteio_local::cluster::Cluster;
use liteio_local::datapath::{self, CheckOutcome, HostNqn, KeysFile};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::watch;

use crate::err;

/// Node `k`'s host NQN file (the NQN its CSI node plugin presents).
pub fn hostnqn_file(c: &Cluster, k: usize) -> PathBuf {
    c.node_dir(k).join("hostnqn")
}

/// `nvmf-check` in node `from`'s network namespace against `t`, presenting `hostnqn` and
/// `keys`, with `extra` arguments; stdin closed, killed when dropped.
pub fn nvmf_check(
    c: &Cluster,
    from: usize,
    t: &SpdkTarget,
    hostnqn: HostNqn<'_>,
    keys: Option<&KeysFile>,
    extra: &[&str],
) -> Result<Command, String> {
    let prefix = c
        .net
        .exec_prefix(from)
        .map_err(|e| format!("{}'s network namespace: {e}", c.node_name(from)))?;
    Ok(datapath::check_command(
        &c.bin_dir, &prefix, t, hostnqn, keys, extra,
    ))
}

/// The arguments of a sequential writer: numbered blocks one after another for `secs`,
/// reconnecting for up to `reconnect_secs` when the path goes away; it prints `written N
/// blocks` as it goes and a JSON result (with `blocks_after_stall`) at the end.
pub fn sequential_writes(secs: u64, reconnect_secs: u64) -> Vec<String> {
    [
        "--check-bytes",
        "0",
        "--write-seconds",
        &secs.to_string(),
        "--reconnect-seconds",
        &reconnect_secs.to_string(),
    ]
    .map(str::to_string)
    .to_vec()
}

/// One bounded run of 4 KiB random I/O.
#[derive(Debug, Clone, Copy)]
pub struct RandomIo {
    pub secs: u64,
    /// Percent of reads (0: writes only).
    pub read_percent: u8,
    pub queue_depth: u32,
}

/// Runs `io` from node `from` with node `host`'s host NQN against `t`; its outcome, or an
/// error when the tool failed. `random_iops` and `random_p99_us` are in its result.
pub async fn random_io(
    c: &Cluster,
    from: usize,
    host: usize,
    t: &SpdkTarget,
    keys: &KeysFile,
    io: RandomIo,
) -> Result<CheckOutcome, String> {
    let out = datapath::run_check(
        random_io_command(c, from, host, t, keys, io)?,
        Duration::from_secs(io.secs + 300),
    )
    .await
    .map_err(err("nvmf-check"))?;
    if out.code != 0 {
        return Err(format!(
            "nvmf-check failed ({}): {}\n{}",
            out.code,
            out.result,
            out.lines.join("\n")
        ));
    }
    Ok(out)
}

/// The command [`random_io`] runs, for a run whose failure is itself a result.
pub fn random_io_command(
    c: &Cluster,
    from: usize,
    host: usize,
    t: &SpdkTarget,
    keys: &KeysFile,
    io: RandomIo,
) -> Result<Command, String> {
    let (secs, pct, qd) = (
        io.secs.to_string(),
        io.read_percent.to_string(),
        io.queue_depth.to_string(),
    );
    let hostnqn = hostnqn_file(c, host);
    nvmf_check(
        c,
        from,
        t,
        HostNqn::File(&hostnqn),
        Some(keys),
        &[
            "--check-bytes",
            "0",
            "--random-seconds",
            &secs,
            "--read-percent",
            &pct,
            "--queue-depth",
            &qd,
        ],
    )
}

/// A number of `result[key]`, or an error naming it.
pub fn figure(result: &Value, key: &str) -> Result<f64, String> {
    result[key]
        .as_f64()
        .ok_or_else(|| format!("no {key} in {result}"))
}

/// A benchmark's setting from the environment (`LITEIO_BENCH_RUNS` …), or `default`.
pub fn bench_setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A running `nvmf-check` whose output lines are collected, with the time each arrived, by
/// a task of its own, so that a test can look at them at any time (ticks, errors) or wait
/// for one.
pub struct Host {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
    /// The number of lines so far; closed when the output ends.
    count: watch::Receiver<usize>,
    /// Lines before this index were looked at by [`Host::wait_for`].
    cursor: usize,
}

impl Host {
    /// The verifying writer from node `from` with node `host`'s host NQN against `t`:
    /// random 4 KiB writes of a verifying pattern at queue depth 8, plus `extra`, until told
    /// `stop`; it prints `tick {"writes":…,"errors":…,"max_us":…}` each second.
    pub fn verifying(
        c: &Cluster,
        from: usize,
        host: usize,
        t: &SpdkTarget,
        keys: &KeysFile,
        extra: &[&str],
    ) -> Result<Self, String> {
        let hostnqn = hostnqn_file(c, host);
        let args = [&["--verify-writes", "--queue-depth", "8"], extra].concat();
        Self::spawn(nvmf_check(
            c,
            from,
            t,
            HostNqn::File(&hostnqn),
            Some(keys),
            &args,
        )?)
    }

    /// The sequential writer ([`sequential_writes`]) from node `from` with node `host`'s host
    /// NQN against `t`, once it has written its first 64 blocks.
    pub async fn sequential(
        c: &Cluster,
        from: usize,
        host: usize,
        t: &SpdkTarget,
        keys: Option<&KeysFile>,
        secs: u64,
        reconnect_secs: u64,
    ) -> Result<Self, String> {
        let hostnqn = hostnqn_file(c, host);
        let args = sequential_writes(secs, reconnect_secs);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut h = Self::spawn(nvmf_check(
            c,
            from,
            t,
            HostNqn::File(&hostnqn),
            keys,
            &args,
        )?)?;
        h.wait_for("written 64 blocks", 60).await?;
        Ok(h)
    }

    /// Starts `cmd` with its stdin and stdout piped.
    pub fn spawn(mut cmd: Command) -> Result<Self, String> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(err("spawn nvmf-check"))?;
        let stdin = child.stdin.take();
        let mut out = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, count) = watch::channel(0);
        let l = Arc::clone(&lines);
        tokio::spawn(async move {
            while let Ok(Some(line)) = out.next_line().await {
                let n = {
                    let mut l = l.lock().unwrap();
                    l.push((Instant::now(), line));
                    l.len()
                };
                tx.send_replace(n);
            }
        });
        Ok(Self {
            child,
            stdin,
            lines,
            count,
            cursor: 0,
        })
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .map(|(_, l)| l.clone())
            .collect()
    }

    /// The next line (after those already waited for) that starts with `prefix`, within
    /// `secs`; a line starting with `error` before it fails.
    pub async fn wait_for(&mut self, prefix: &str, secs: u64) -> Result<String, String> {
        let until = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let found = {
                let lines = self.lines.lock().unwrap();
                let mut found = None;
                while self.cursor < lines.len() && found.is_none() {
                    let l = &lines[self.cursor].1;
                    self.cursor += 1;
                    if l.starts_with(prefix) {
                        found = Some(Ok(l.clone()));
                    } else if l.starts_with("error") {
                        found = Some(Err(format!("nvmf-check: {l}")));
                    }
                }
                found
            };
            if let Some(f) = found {
                return f;
            }
            match tokio::time::timeout_at(until, self.count.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    // The output ended; the last lines may have come with it.
                    if self.cursor < self.lines.lock().unwrap().len() {
                        continue;
                    }
                    return Err(format!(
                        "nvmf-check ended before {prefix:?}: {}",
                        self.lines().join("\n")
                    ));
                }
                Err(_) => {
                    return Err(format!(
                        "no line {prefix:?} from nvmf-check within {secs} s: {}",
                        self.lines().join("\n")
                    ));
                }
            }
        }
    }

    /// Waits (at most `secs`) until `n` ticks report writes: the writer is under way.
    pub async fn wait_writing(&mut self, n: usize, secs: u64) -> Result<(), String> {
        let until = Instant::now() + Duration::from_secs(secs);
        while self.ticks().iter().filter(|t| t["writes"] != 0).count() < n {
            let left = until.saturating_duration_since(Instant::now()).as_secs();
            self.wait_for("tick ", left.max(1))
                .await
                .map_err(|e| format!("the host did not start writing within {secs} s: {e}"))?;
        }
        Ok(())
    }

    /// The ticks so far with the time each arrived.
    pub fn timed_ticks(&self) -> Vec<(Instant, Value)> {
        ticks(&self.lines.lock().unwrap())
    }

    /// The ticks so far.
    pub fn ticks(&self) -> Vec<Value> {
        self.timed_ticks().into_iter().map(|(_, t)| t).collect()
    }

    /// Writes completed so far; an error if any write failed, the tool reported an error,
    /// or it ended (it runs until told to stop).
    pub fn check(&self) -> Result<u64, String> {
        if let Some(e) = self.lines().iter().find(|l| l.starts_with("error")) {
            return Err(format!("the host: {e}"));
        }
        let ticks = self.ticks();
        if let Some(t) = ticks.iter().find(|t| t["errors"] != 0) {
            return Err(format!("a write of the host failed: {t}"));
        }
        if self.count.has_changed().is_err() {
            return Err(format!("the host's nvmf-check ended: {:?}", self.lines()));
        }
        Ok(ticks.iter().filter_map(|t| t["writes"].as_u64()).sum())
    }

    /// The longest I/O completion in the ticks from index `from` on, in ms.
    pub fn longest_ms(&self, from: usize) -> f64 {
        self.ticks()
            .iter()
            .skip(from)
            .filter_map(|t| t["max_us"].as_f64())
            .fold(0.0, f64::max)
            / 1000.0
    }

    /// One command on the tool's stdin (`stop`, `path ADDR PORT`, `detach ADDR PORT`).
    pub async fn send(&mut self, cmd: &str) -> Result<(), String> {
        self.stdin
            .as_mut()
            .ok_or("nvmf-check's stdin is closed")?
            .write_all(format!("{cmd}\n").as_bytes())
            .await
            .map_err(err("write to nvmf-check"))
    }

    /// Its exit status if it ends within `within`; `None` if it is still running then.
    pub async fn exited_within(&mut self, within: Duration) -> Result<Option<ExitStatus>, String> {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(st) => st.map(Some).map_err(err("wait")),
            Err(_) => Ok(None),
        }
    }

    /// Kills it (SIGKILL).
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Waits (at most `within`) until it exits and its output ends: the exit code, its
    /// final JSON result and the ticks with the time each arrived.
    pub async fn end(mut self, within: Duration) -> Result<HostResult, String> {
        let st = self
            .exited_within(within)
            .await?
            .ok_or_else(|| format!("nvmf-check did not end within {within:?}"))?;
        // The reader task ends with the output.
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            while self.count.changed().await.is_ok() {}
        })
        .await;
        let lines = self.lines.lock().unwrap().clone();
        let result = lines
            .iter()
            .rev()
            .find_map(|(_, l)| {
                serde_json::from_str::<Value>(l)
                    .ok()
                    .filter(Value::is_object)
            })
            .ok_or_else(|| format!("no JSON result from nvmf-check ({st}): {:?}", self.lines()))?;
        Ok(HostResult {
            code: st.code().unwrap_or(-1),
            status: st,
            result,
            ticks: ticks(&lines),
        })
    }

    /// `stop`, then [`Host::end`] (the tool reads every block it wrote back first: up to
    /// 600 s).
    pub async fn finish(mut self) -> Result<HostResult, String> {
        self.send("stop").await?;
        self.end(Duration::from_secs(600)).await
    }

    /// [`Host::finish`] for a verifying writer that must have written without an error and
    /// read every block back as written; its result.
    pub async fn finish_verified(self) -> Result<Value, String> {
        self.check()?;
        let r = self.finish().await?;
        if r.code != 0
            || r.result["mismatches"] != 0
            || r.result["errors"] != 0
            || r.result["verified_blocks"].as_u64().unwrap_or(0) == 0
        {
            return Err(format!(
                "the host's writes did not verify ({}): {}",
                r.status, r.result
            ));
        }
        Ok(r.result)
    }
}

/// What a [`Host`] left when it ended.
#[derive(Debug)]
pub struct HostResult {
    pub status: ExitStatus,
    /// The exit code (-1 when a signal ended it).
    pub code: i32,
    /// Its final JSON result.
    pub result: Value,
    /// Its ticks with the time each arrived.
    pub ticks: Vec<(Instant, Value)>,
}

fn ticks(lines: &[(Instant, String)]) -> Vec<(Instant, Value)> {
    lines
        .iter()
        .filter_map(|(at, l)| Some((*at, serde_json::from_str(l.strip_prefix("tick ")?).ok()?)))
        .collect()
}
