//! T1: `kubectl liteio top` against a small HTTP server in this test that plays a disk-agent
//! under load: it serves the recorded /metrics of a real SPDK agent under random I/O
//! (tests/fixtures/agent-metrics-{1,2}.txt) with every counter moved on by the recorded
//! difference at each request, so any two scrapes show the recorded pace.
//!
//! - `--once -o json` finds the agent through the StoragePools of the test API server (the
//!   pool's `spec.nodeInfo.ip` and `--metrics-port`), and names a pool whose agent does not
//!   answer;
//! - the real binary in a tmux session: the live view shows the volume with non-zero IOPS
//!   and the pool with its free space, refreshes, and quits with `q` and with Ctrl-C, exit
//!   status 0 and the terminal given back (alternate screen left, echo and line editing on).
//!
//! The tmux part prints one SKIP line where tmux is not installed (Debian package tmux).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use liteio_api::common::NodeInfo;
use liteio_api::size::format_bytes;
use liteio_api::{StoragePool, StoragePoolSpec};
use liteio_cli::Cli;
use liteio_cli::top::text;
use liteio_test_apiserver::TestApiServer;
use serde_json::Value;

const FIRST: &str = include_str!("fixtures/agent-metrics-1.txt");
const SECOND: &str = include_str!("fixtures/agent-metrics-2.txt");
const NS: &str = "obnvmf";

/// The `n`-th answer of the played agent: FIRST with each counter (`…_total`) moved on by
/// `n` times its growth from FIRST to SECOND.
fn nth_scrape(n: u64) -> String {
    let second: BTreeMap<&str, f64> = SECOND
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            Some((series, v.parse().ok()?))
        })
        .collect();
    let mut out = String::new();
    for l in FIRST.lines() {
        let line = match l.rsplit_once(' ') {
            Some((series, v)) if !l.starts_with('#') && series.contains("_total") => {
                let v1: f64 = v.parse().unwrap();
                let v2 = second.get(series).copied().unwrap_or(v1);
                format!("{series} {}", v1 + n as f64 * (v2 - v1))
            }
            _ => l.to_string(),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The recorded value of `name` in FIRST (gauges do not move).
fn recorded(name: &str) -> f64 {
    text::parse(FIRST)
        .unwrap()
        .into_iter()
        .find(|s| s.name == name)
        .unwrap()
        .value
}

/// Serves [`nth_scrape`] on 127.0.0.1 from a thread; returns the port and the number of
/// scrapes served.
fn played_agent() -> (u16, Arc<AtomicU64>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let served = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&served);
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut s) = conn else { continue };
            let mut req = Vec::new();
            let mut b = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut b) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&b[..n]),
                }
            }
            let n = count.fetch_add(1, Ordering::SeqCst);
            let body = nth_scrape(n);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, served)
}

fn pool(name: &str, ip: &str) -> StoragePool {
    let mut p = StoragePool::new(
        name,
        StoragePoolSpec {
            node_info: NodeInfo {
                id: name.into(),
                ip: ip.into(),
                ..NodeInfo::default()
            },
            ..StoragePoolSpec::default()
        },
    );
    p.metadata.namespace = Some(NS.into());
    p
}

#[tokio::test]
async fn once_finds_the_agents_through_the_storage_pools() {
    let (port, served) = played_agent();
    tokio::time::timeout(Duration::from_secs(60), async {
        let server = TestApiServer::start().await.unwrap();
        let client = server.client().await.unwrap();
        let mut ns = Namespace::default();
        ns.metadata.name = Some(NS.into());
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        let pools: Api<StoragePool> = Api::namespaced(client.clone(), NS);
        // node-1's agent is the played one; nothing listens on node-2's address.
        for p in [pool("node-1", "127.0.0.1"), pool("node-2", "127.0.0.2")] {
            pools.create(&PostParams::default(), &p).await.unwrap();
        }
        let port_arg = port.to_string();
        let cli = Cli::try_parse_from([
            "kubectl-liteio",
            "top",
            "--once",
            "--interval",
            "1",
            "--metrics-port",
            &port_arg,
            "-o",
            "json",
        ])
        .unwrap();
        let out = liteio_cli::run(&cli, &client).await.unwrap();
        println!("{out}");
        let f: Value = serde_json::from_str(&out).unwrap();
        let v = &f["volumes"][0];
        assert_eq!(v["volume"], "pvc-demo");
        assert_eq!(v["node"], "node-1");
        let iops = v["readIops"].as_f64().unwrap() + v["writeIops"].as_f64().unwrap();
        assert!(iops > 0.0, "{v}");
        assert_eq!(f["pools"][0]["node"], "node-1");
        assert_eq!(
            f["pools"][0]["freeBytes"].as_f64(),
            Some(recorded("liteio_pool_free_bytes"))
        );
        let bad = f["unreachable"].as_array().unwrap();
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert_eq!(
            bad[0]["url"],
            format!("http://127.0.0.2:{port}/metrics"),
            "{bad:?}"
        );
        // Two scrapes of the played agent.
        assert_eq!(served.load(Ordering::SeqCst), 2);
        // With no pool answering, the error names them.
        pools.delete("node-1", &Default::default()).await.unwrap();
        let e = liteio_cli::run(&cli, &client).await.unwrap_err();
        assert_eq!(e.kind(), liteio_cli::ErrorKind::Unreachable);
        assert!(e.to_string().contains("127.0.0.2"), "{e}");
    })
    .await
    .expect("test timed out");
}

/// `tmux -L <socket> args…`: its stdout.
fn tmux(socket: &str, args: &[&str]) -> String {
    let o = Command::new("tmux")
        .arg("-L")
        .arg(socket)
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "tmux {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Polls the pane until `check` finds what it wants in it (within `secs`); returns that.
fn wait_pane<T>(
    socket: &str,
    secs: u64,
    what: &str,
    mut check: impl FnMut(&str) -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let pane = tmux(socket, &["capture-pane", "-p", "-t", "top"]);
        if let Some(t) = check(&pane) {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not shown within {secs} s; the pane:\n{pane}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The cells of the row of the pane that starts with `first`.
fn row<'a>(pane: &'a str, first: &str) -> Option<Vec<&'a str>> {
    pane.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|c| c.first() == Some(&first))
}

struct Session(String);

impl Drop for Session {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.0, "kill-server"])
            .output();
    }
}

#[test]
fn the_live_view_in_a_terminal_shows_the_busiest_volume_and_quits_cleanly() {
    if Command::new("tmux").arg("-V").output().is_err() {
        println!("SKIP the live view in tmux: tmux is not installed (Debian package tmux)");
        return;
    }
    let (port, served) = played_agent();
    let bin = env!("CARGO_BIN_EXE_kubectl-liteio");
    let url = format!("http://127.0.0.1:{port}/metrics");
    let free = format_bytes(recorded("liteio_pool_free_bytes") as u64);
    let total = format_bytes(recorded("liteio_pool_capacity_bytes") as u64);
    for (quit, keys) in [("q", "q"), ("Ctrl-C", "C-c")] {
        // A tmux server of our own (its socket named after this process), killed at the end.
        let socket = format!("liteio-top-{}-{quit}", std::process::id());
        let _session = Session(socket.clone());
        // After top: its exit status and whether the terminal has echo and line editing. The
        // shell keeps running on Ctrl-C, as an interactive one does (a trap with a command
        // is reset to the default in top, unlike an ignored signal).
        let script = format!(
            "trap : INT; {bin} top --metrics-url {url} --interval 1; echo TOP_EXIT=$?; \
             stty -a | tr ' ;' '\\n\\n' | grep -x -e icanon -e -icanon -e echo -e -echo | tr '\\n' ' '; \
             echo TTY_END; sleep 600"
        );
        tmux(
            &socket,
            &[
                "new-session",
                "-d",
                "-s",
                "top",
                "-x",
                "150",
                "-y",
                "40",
                "sh",
                "-c",
                &script,
            ],
        );
        let started = Instant::now();
        // The first frame has no rates yet; a later one has the volume's.
        let iops: f64 = wait_pane(&socket, 30, "pvc-demo with non-zero IOPS", |pane| {
            let r = row(pane, "pvc-demo")?;
            let iops: f64 = r.get(2)?.parse().ok()?;
            (iops > 0.0).then_some(iops)
        });
        let pane = tmux(&socket, &["capture-pane", "-p", "-t", "top"]);
        println!(
            "after {:.1} s ({} scrapes):\n{pane}",
            started.elapsed().as_secs_f64(),
            served.load(Ordering::SeqCst)
        );
        assert!(
            pane.contains("kubectl liteio top · 1 agents · every 1s"),
            "{pane}"
        );
        let r = row(&pane, "pvc-demo").unwrap();
        assert_eq!(r[1], "node-1", "{r:?}");
        let p = row(&pane, "node-1").unwrap();
        assert_eq!(p[1..3].join(" "), total, "{p:?}");
        assert_eq!(p[3..5].join(" "), free, "{p:?}");
        // The pool's IOPS are its volume's.
        let pool_iops: f64 = p[7].parse().unwrap();
        assert!(pool_iops > 0.0, "{p:?}");
        assert_eq!(
            tmux(&socket, &["display", "-p", "-t", "top", "#{alternate_on}"]).trim(),
            "1",
            "the view is not on the alternate screen"
        );
        // It refreshes: more scrapes come.
        let before = served.load(Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(10);
        while served.load(Ordering::SeqCst) < before + 2 {
            assert!(Instant::now() < deadline, "no refresh within 10 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        tmux(&socket, &["send-keys", "-t", "top", keys]);
        let (status, tty) = wait_pane(&socket, 15, "top's exit", |pane| {
            let status = pane
                .lines()
                .find_map(|l| l.trim().strip_prefix("TOP_EXIT="))?
                .to_string();
            let tty = pane
                .lines()
                .find(|l| l.contains("TTY_END"))?
                .replace("TTY_END", "");
            Some((status, tty))
        });
        println!("quit with {quit}: exit status {status}, terminal: {tty}; {iops} IOPS shown");
        assert_eq!(status, "0", "top did not exit cleanly on {quit}");
        let modes: Vec<&str> = tty.split_whitespace().collect();
        assert!(
            modes.contains(&"icanon") && modes.contains(&"echo"),
            "terminal not restored after {quit}: {modes:?}"
        );
        assert_eq!(
            tmux(&socket, &["display", "-p", "-t", "top", "#{alternate_on}"]).trim(),
            "0",
            "the alternate screen was not left after {quit}"
        );
        // No more scrapes once it exited.
        let after = served.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(served.load(Ordering::SeqCst), after, "still scraping");
    }
}
