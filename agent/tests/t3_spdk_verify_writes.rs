//! T3: `nvmf-check --verify-writes`, the host of the hot-migration end-to-end test
//! (issue 15), against a real SPDK target. This process serves one subsystem with two
//! listeners, 127.0.0.2 (path A, optimized) and 127.0.0.3 (path B, inaccessible), the two
//! addresses standing in for the source and the destination node; one bdev behind both
//! keeps one copy of the data, so every block must read back its last write. The tool runs
//! as a child process and is driven through its standard input as the migration flow will
//! drive it: attach path B, flip ANA (B optimized, then A inaccessible), detach path A,
//! stop. No I/O error, every written block verified, sampled unwritten blocks zero.
//!
//! The fence of the real switch-over (`nvmf::fence_io`) pauses the whole subsystem, both
//! listeners here, so this test flips ANA without it (as part 1 of `t3_spdk_ana`).
//!
//! Prints the writes per second before, during and after the switch and the longest I/O
//! across it; run with `--nocapture` to read them.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::free_port_on;
use liteio_agent::spdk::bdev;
use liteio_agent::spdk::nvmf::{self, AnaState, Multipath, SubsystemSpec};
use liteio_api::naming;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const MIB: u64 = 1 << 20;
const HOST: &str = "nqn.2021-03.com.alipay.host:uuid:verify-writes-host";
const UUID: &str = "7a1f3c2e-4b5d-4e6f-8a90-b1c2d3e4f5a6";
const SRC: &str = "127.0.0.2";
const DST: &str = "127.0.0.3";
/// Longest wait for any one line of the tool once it is connected.
const LINE_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for its first line: SPDK's start in the child, then the connect, whose
/// admin requests the tool itself bounds at 30 s each. Longer than that bound, so that a
/// slow or failed connect shows the tool's own error line, not this test's timeout (seen:
/// no line in 30 s while the rest of the test suite loaded both cores).
const FIRST_LINE_TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn verify_writes_across_an_ana_switch() {
    if !rustix::process::geteuid().is_root() {
        println!("SKIP verify_writes_across_an_ana_switch: needs root (SPDK target and initiator)");
        return;
    }
    // This process is a target only: interrupt mode (the tool's initiator polls its core).
    common::with_spdk(
        "t3-verify-writes",
        false,
        Duration::from_secs(240),
        scenario(),
    );
}

/// One `tick` line of the tool, with the phase of the test it arrived in.
#[derive(Debug, Clone)]
struct Tick {
    phase: &'static str,
    writes: u64,
    errors: u64,
    max_us: u64,
}

/// `nvmf-check --verify-writes` as a child process: its stdin, and its stdout lines as they
/// come (ticks are collected on the way).
struct Tool {
    proc: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    ticks: Vec<Tick>,
    phase: &'static str,
    /// Every line but the ticks, for failure messages.
    seen: Vec<String>,
}

impl Tool {
    fn spawn(nqn: &str, port: u16) -> Self {
        let mut proc = tokio::process::Command::new(env!("CARGO_BIN_EXE_nvmf-check"))
            .args(["--address", SRC, "--port", &port.to_string()])
            .args(["--subnqn", nqn, "--hostnqn", HOST])
            .args(["--verify-writes", "--queue-depth", "8", "--expect-zeroes"])
            .arg("--json")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = proc.stdin.take().unwrap();
        let lines = BufReader::new(proc.stdout.take().unwrap()).lines();
        Self {
            proc,
            stdin,
            lines,
            ticks: Vec::new(),
            phase: "start",
            seen: Vec::new(),
        }
    }

    /// The next line of output, tick or not; `None` at its end.
    async fn raw_line(&mut self) -> Option<String> {
        let limit = if self.seen.is_empty() && self.ticks.is_empty() {
            FIRST_LINE_TIMEOUT
        } else {
            LINE_TIMEOUT
        };
        tokio::time::timeout(limit, self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("no line from nvmf-check in {limit:?}: {:?}", self.seen))
            .unwrap()
    }

    /// Records a tick (`None`) or passes the line on.
    fn take(&mut self, line: String) -> Option<String> {
        if let Some(t) = line.strip_prefix("tick ") {
            let v: Value = serde_json::from_str(t).unwrap();
            self.ticks.push(Tick {
                phase: self.phase,
                writes: v["writes"].as_u64().unwrap(),
                errors: v["errors"].as_u64().unwrap(),
                max_us: v["max_us"].as_u64().unwrap(),
            });
            return None;
        }
        println!("nvmf-check: {line}");
        self.seen.push(line.clone());
        Some(line)
    }

    /// The next line that is not a tick; `None` at the end of the output.
    async fn next_line(&mut self) -> Option<String> {
        loop {
            let line = self.raw_line().await?;
            if let Some(line) = self.take(line) {
                return Some(line);
            }
        }
    }

    /// Waits for the line that starts with `prefix`; panics on an `error` line.
    async fn expect(&mut self, prefix: &str) -> String {
        loop {
            let Some(line) = self.next_line().await else {
                panic!("nvmf-check ended before `{prefix}`: {:?}", self.seen);
            };
            assert!(!line.starts_with("error"), "nvmf-check: {line}");
            if line.starts_with(prefix) {
                return line;
            }
        }
    }

    async fn send(&mut self, command: &str) {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn ask(&mut self, command: &str, answer: &str) -> String {
        self.send(command).await;
        self.expect(answer).await
    }

    /// The paths as the tool's host sees them.
    async fn paths(&mut self) -> Vec<Value> {
        let line = self.ask("paths", "paths ").await;
        let v: Value = serde_json::from_str(&line["paths ".len()..]).unwrap();
        v.as_array().unwrap().clone()
    }

    /// Polls `paths` until the path to `port` shows `state`.
    async fn host_sees(&mut self, port: u16, state: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let paths = self.paths().await;
            if paths
                .iter()
                .any(|p| p["port"] == port && p["ana_state"] == state)
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the host does not see port {port} {state}: {paths:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `n` more ticks have come.
    async fn ticks(&mut self, n: usize) {
        let want = self.ticks.len() + n;
        while self.ticks.len() < want {
            let Some(line) = self.raw_line().await else {
                panic!("nvmf-check ended: {:?}", self.seen);
            };
            self.take(line);
        }
    }

    /// Writes per second over the ticks of `phase` (each tick is one second); `None` when
    /// no tick came in it.
    fn iops(&self, phase: &str) -> Option<u64> {
        let t: Vec<&Tick> = self.ticks.iter().filter(|t| t.phase == phase).collect();
        (!t.is_empty()).then(|| t.iter().map(|t| t.writes).sum::<u64>() / t.len() as u64)
    }
}

/// A phase's writes per second for the summary.
fn per_second(iops: Option<u64>) -> String {
    iops.map_or("no whole second".into(), |n| n.to_string())
}

fn spec(nqn: &str, port: u16) -> SubsystemSpec {
    SubsystemSpec {
        address: SRC.into(),
        multipath: Some(Multipath {
            ana_state: AnaState::Optimized,
            min_cntlid: 1,
            max_cntlid: 1024,
        }),
        ..common::spdk::local_subsystem(
            nqn,
            &naming::serial_number(UUID),
            UUID,
            "vw",
            UUID,
            port,
            vec![HOST.into()],
        )
    }
}

async fn scenario() {
    nvmf::ensure_tcp_transport(&Default::default())
        .await
        .unwrap();
    let nqn = naming::subsys_nqn(UUID);
    let (a, b) = (free_port_on(SRC), free_port_on(DST));
    bdev::create_malloc("vw", 64 * MIB, 4096).await.unwrap();
    nvmf::create_subsystem(spec(&nqn, a)).await.unwrap();
    nvmf::add_listener(&nqn, DST, b, false, Some(AnaState::Inaccessible))
        .await
        .unwrap();

    let mut tool = Tool::spawn(&nqn, a);
    tool.expect("connected to").await;
    tool.expect("writing 4 KiB blocks").await;
    assert_eq!(tool.paths().await.len(), 1);
    tool.ask(
        &format!("path {DST} {b}"),
        &format!("path attached {DST} {b}"),
    )
    .await;
    let paths = tool.paths().await;
    assert_eq!(paths.len(), 2, "{paths:?}");
    assert_ne!(paths[0]["cntlid"], paths[1]["cntlid"]);
    tool.host_sees(b, "inaccessible").await;
    tool.host_sees(a, "optimized").await;

    tool.phase = "before";
    tool.ticks(3).await;
    // The switch: promote B, then (once the host has read that: SPDK's host retries a
    // command without a usable path only after 1 s) demote A.
    tool.phase = "switch";
    let t0 = std::time::Instant::now();
    nvmf::set_ana_state(&nqn, DST, b, AnaState::Optimized, 1)
        .await
        .unwrap();
    tool.host_sees(b, "optimized").await;
    nvmf::set_ana_state(&nqn, SRC, a, AnaState::Inaccessible, 1)
        .await
        .unwrap();
    tool.host_sees(a, "inaccessible").await;
    let switch = t0.elapsed();
    tool.phase = "after";
    tool.ticks(3).await;
    tool.ask(
        &format!("detach {SRC} {a}"),
        &format!("path detached {SRC} {a}"),
    )
    .await;
    let paths = tool.paths().await;
    assert_eq!(paths.len(), 1, "{paths:?}");
    assert_eq!(paths[0]["port"], b);
    tool.phase = "detached";
    tool.ticks(2).await;

    tool.send("stop").await;
    let mut last = String::new();
    while let Some(line) = tool.next_line().await {
        last = line;
    }
    let status = tokio::time::timeout(Duration::from_secs(30), tool.proc.wait())
        .await
        .expect("nvmf-check did not exit in 30 s after its output ended")
        .unwrap();
    let r: Value = serde_json::from_str(&last).unwrap();
    assert!(status.success(), "nvmf-check failed ({status}): {r}");
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["errors"], 0, "{r}");
    assert_eq!(r["mismatches"], 0, "{r}");
    assert_eq!(r["unverified_blocks"], 0, "{r}");
    let written = r["written_blocks"].as_u64().unwrap();
    assert!(written > 0, "{r}");
    assert_eq!(r["verified_blocks"], written, "{r}");
    assert!(r["zero_checked_blocks"].as_u64().unwrap() > 0, "{r}");
    let end_paths = r["paths"].as_array().unwrap();
    assert_eq!(end_paths.len(), 1, "{r}");
    assert_eq!(end_paths[0]["port"], b, "{r}");

    // Every tick counted no error, and writes went on in every phase.
    assert!(tool.ticks.iter().all(|t| t.errors == 0), "{:?}", tool.ticks);
    for phase in ["before", "after", "detached"] {
        assert!(
            tool.iops(phase).unwrap_or(0) > 0,
            "no writes {phase}: {:?}",
            tool.ticks
        );
    }
    // The longest I/O across the switch: the ticks that arrived during it and the one after
    // (its window held the end of the switch).
    let first_after = tool.ticks.iter().position(|t| t.phase == "after").unwrap();
    let across = tool.ticks[..=first_after]
        .iter()
        .filter(|t| t.phase == "switch" || t.phase == "after")
        .map(|t| t.max_us)
        .max()
        .unwrap_or(0);
    println!(
        "verify-writes: {} writes, {} IOPS overall; per second before {}, during the switch {}, after {}, path A detached {}; switch took {switch:?}, longest I/O across it {across} µs, overall {} µs; {written} blocks verified, {} unwritten ones zero",
        r["writes"],
        r["iops"],
        per_second(tool.iops("before")),
        per_second(tool.iops("switch")),
        per_second(tool.iops("after")),
        per_second(tool.iops("detached")),
        r["longest_io_us"],
        r["zero_checked_blocks"],
    );
    assert!(
        across <= 2_000_000,
        "longest I/O across the switch {across} µs"
    );
    nvmf::delete_subsystem(&nqn).await.unwrap();
}
