//! T3: the switch-over of a hot migration through NVMe multipath and ANA (issue 15, item 3).
//! SPDK's NVMe/TCP initiator plays the host (no `nvme_tcp` in this kernel): it attaches two
//! paths to one NQN as one multipath bdev, a writer runs 4 KiB random writes at QD 8 with a
//! verifying pattern, and the ANA states flip. Three parts, one SPDK per process:
//!
//! 1. one subsystem with two listeners on 127.0.0.1 (the two ports stand in for two nodes):
//!    A optimized, B inaccessible, then B optimized and A inaccessible; no I/O error, I/O
//!    goes on after path A is detached, every block reads back its last write;
//! 2. a path that is only inaccessible: a write neither succeeds nor fails at once (SPDK
//!    queues it) and fails once the ANA transition time (10 s) has passed;
//! 3. two SPDK processes, the realistic case: this one serves the source on 127.0.0.2, a
//!    child process (this test binary again) the destination on 127.0.0.3, with the same
//!    NQN, serial, model and namespace UUID and disjoint controller-ID ranges. The
//!    switch-over is the documented sequence: fence the source's I/O, promote the
//!    destination, demote the source (which releases the fenced I/O to fail over). No I/O
//!    error, and the source bdev takes no write after the switch.
//!
//! Each part prints the longest I/O completion time across its switch (goal: at most 1 s);
//! run with `--nocapture` to read them.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::free_port_on;
use liteio_agent::spdk::nvmf::{self, AnaState, HostKeys, Multipath, SubsystemSpec};
use liteio_agent::spdk::{bdev, initiator, io};
use liteio_api::naming;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;
/// Blocks the writer uses (the bdevs are larger).
const BLOCKS: u64 = 4096;
const QD: u64 = 8;
const HOST: &str = "nqn.2021-03.com.alipay.host:uuid:node-host";
const UUID: &str = "5e0c7d1a-2b3c-4d5e-8f90-a1b2c3d4e5f6";
/// Set in the child process of part 3: what it serves (see [`ChildSpec`]).
const CHILD_ENV: &str = "LITEIO_T3_ANA_CHILD";
const CHILD_TAG: &str = "ANA-CHILD";

/// The content of `block` after its write number `seq`: derivable from the last write alone.
fn pattern(block: u64, seq: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(BLOCK as usize);
    v.extend_from_slice(&block.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    let mut x = block.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seq;
    while v.len() < BLOCK as usize {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

/// What a worker of the [`Writer`] leaves: the last write number of each of its blocks, and
/// one sample per I/O.
type WorkerResult = (HashMap<u64, u64>, Vec<Sample>);

/// One I/O of the writer: when it started, how long it took, what it wrote.
#[derive(Debug, Clone, Copy)]
struct Sample {
    start: Instant,
    took: Duration,
    block: u64,
    seq: u64,
}

/// 4 KiB random writes at QD 8 on one bdev until stopped: each of the 8 workers owns the
/// blocks `b % 8 == worker`, so no two writes to a block are in flight together and each
/// block's last write is known.
struct Writer {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    workers: Vec<tokio::task::JoinHandle<WorkerResult>>,
}

impl Writer {
    fn start(bdev: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let workers = (0..QD)
            .map(|w| {
                let (bdev, stop, done, errors) =
                    (bdev.to_string(), stop.clone(), done.clone(), errors.clone());
                tokio::spawn(async move {
                    let mut last = HashMap::new();
                    let mut samples = Vec::new();
                    let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ (w + 1);
                    let mut seq = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let block = (rng % (BLOCKS / QD)) * QD + w;
                        seq += 1;
                        let start = Instant::now();
                        match io::write_at(&bdev, block * BLOCK, pattern(block, seq)).await {
                            Ok(()) => {
                                last.insert(block, seq);
                            }
                            Err(e) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                                eprintln!("write of block {block} failed: {e}");
                            }
                        }
                        samples.push(Sample {
                            start,
                            took: start.elapsed(),
                            block,
                            seq,
                        });
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    (last, samples)
                })
            })
            .collect();
        Self {
            stop,
            done,
            errors,
            workers,
        }
    }

    /// Wait until `n` more writes completed (or failed) than now.
    async fn progress(&self, n: u64, what: &str) {
        let target = self.done.load(Ordering::Relaxed) + n;
        let done = self.done.clone();
        common::eventually(what, Duration::from_secs(30), || {
            let ok = done.load(Ordering::Relaxed) >= target;
            async move { ok.then_some(()) }
        })
        .await;
    }

    /// Stop; the last written sequence number of every block, and every sample.
    async fn finish(self) -> (HashMap<u64, u64>, Vec<Sample>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let mut last = HashMap::new();
        let mut samples = Vec::new();
        for w in self.workers {
            let (l, s) = w.await.unwrap();
            last.extend(l);
            samples.extend(s);
        }
        (last, samples, self.errors.load(Ordering::Relaxed))
    }
}

/// The longest I/O overall and among those that were in flight while `window` ran.
fn longest(samples: &[Sample], window: (Instant, Instant)) -> (Duration, Duration) {
    let overall = samples.iter().map(|s| s.took).max().unwrap_or_default();
    let across = samples
        .iter()
        .filter(|s| s.start <= window.1 && s.start + s.took >= window.0)
        .map(|s| s.took)
        .max()
        .unwrap_or_default();
    (overall, across)
}

async fn verify(bdev: &str, last: &HashMap<u64, u64>) {
    for (&block, &seq) in last {
        let got = io::read_at(bdev, block * BLOCK, BLOCK as usize)
            .await
            .unwrap();
        assert!(
            got == pattern(block, seq),
            "block {block} does not hold its last write {seq}"
        );
    }
}

/// Wait until the host sees `state` on the path to `port`.
async fn host_sees(ctrlr: &str, address: &str, port: u16, state: AnaState) {
    common::eventually(
        &format!("the host to see {address}:{port} {state:?}"),
        Duration::from_secs(15),
        || async {
            let p = initiator::paths(ctrlr).await.unwrap();
            p.iter()
                .any(|p| p.address == address && p.port == port && p.ana_state == Some(state))
                .then_some(())
        },
    )
    .await;
}

fn spec(nqn: &str, bdev: &str, address: &str, port: u16, mp: Multipath) -> SubsystemSpec {
    SubsystemSpec {
        address: address.into(),
        multipath: Some(mp),
        ..common::spdk::local_subsystem(
            nqn,
            &naming::serial_number(UUID),
            UUID,
            bdev,
            UUID,
            port,
            vec![HOST.into()],
        )
    }
}

#[test]
fn ana_switch_over() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    // SPDK 26.05's NVMe/TCP initiator refuses interrupt mode, so this process polls; the
    // child of part 3 is a target only and runs in interrupt mode.
    common::with_spdk("t3-ana", true, Duration::from_secs(240), scenario());
}

async fn scenario() {
    nvmf::ensure_tcp_transport(&Default::default())
        .await
        .unwrap();
    one_subsystem_two_listeners().await;
    only_inaccessible_path().await;
    two_targets().await;
}

/// Part 1.
async fn one_subsystem_two_listeners() {
    let nqn = naming::subsys_nqn("ana-one");
    let (a, b) = (free_port_on("127.0.0.1"), free_port_on("127.0.0.1"));
    bdev::create_malloc("one", 64 * MIB, 4096).await.unwrap();
    let mp = Multipath {
        ana_state: AnaState::Optimized,
        min_cntlid: 1,
        max_cntlid: 1024,
    };
    let info = nvmf::create_subsystem(spec(&nqn, "one", "127.0.0.1", a, mp))
        .await
        .unwrap();
    assert!(info.ana_reporting);
    assert_eq!(info.cntlid_range, (1, 1024));
    nvmf::add_listener(&nqn, "127.0.0.1", b, false, Some(AnaState::Inaccessible))
        .await
        .unwrap();
    // Idempotent.
    nvmf::add_listener(&nqn, "127.0.0.1", b, false, Some(AnaState::Inaccessible))
        .await
        .unwrap();
    assert_eq!(
        nvmf::ana_state(&nqn, "127.0.0.1", b, 1).await.unwrap(),
        AnaState::Inaccessible
    );
    let keys = HostKeys::default();
    let names = initiator::attach_tcp_path("mp1", "127.0.0.1", a, &nqn, HOST, None, &keys)
        .await
        .unwrap();
    assert_eq!(names, ["mp1n1"]);
    initiator::attach_tcp_path("mp1", "127.0.0.1", b, &nqn, HOST, None, &keys)
        .await
        .unwrap();
    let paths = initiator::paths("mp1").await.unwrap();
    assert_eq!(paths.len(), 2, "{paths:?}");
    assert_ne!(paths[0].cntlid, paths[1].cntlid);
    host_sees("mp1", "127.0.0.1", a, AnaState::Optimized).await;
    host_sees("mp1", "127.0.0.1", b, AnaState::Inaccessible).await;

    let w = Writer::start("mp1n1");
    w.progress(300, "writes through path A").await;
    let t0 = Instant::now();
    // One target serves both paths here: promote B, then demote A (the host stays on its
    // current path A until A turns inaccessible, and both lead to the same bdev). SPDK's
    // host retries a command that finds no usable path only after 1 s (the kernel's host
    // requeues it when the ANA state changes), so the demotion waits until the host has
    // read B's new state.
    nvmf::set_ana_state(&nqn, "127.0.0.1", b, AnaState::Optimized, 1)
        .await
        .unwrap();
    host_sees("mp1", "127.0.0.1", b, AnaState::Optimized).await;
    nvmf::set_ana_state(&nqn, "127.0.0.1", a, AnaState::Inaccessible, 1)
        .await
        .unwrap();
    let t1 = Instant::now();
    host_sees("mp1", "127.0.0.1", a, AnaState::Inaccessible).await;
    w.progress(300, "writes after the switch").await;
    // I/O goes through B: without path A it goes on.
    initiator::detach_path("mp1", "127.0.0.1", a).await.unwrap();
    common::eventually("path A gone", Duration::from_secs(15), || async {
        (initiator::paths("mp1").await.unwrap().len() == 1).then_some(())
    })
    .await;
    w.progress(300, "writes without path A").await;
    let (last, samples, errors) = w.finish().await;
    assert_eq!(errors, 0, "the writer saw I/O errors");
    let (overall, across) = longest(&samples, (t0, t1));
    println!(
        "part 1 (one target, two listeners): {} writes, 0 errors, longest I/O across the switch {:?}, overall {:?}",
        samples.len(),
        across,
        overall
    );
    assert!(
        across <= Duration::from_secs(2),
        "longest I/O across the switch {across:?}"
    );
    verify("mp1n1", &last).await;
    initiator::detach("mp1").await.unwrap();
    nvmf::delete_subsystem(&nqn).await.unwrap();
}

/// Part 2: what SPDK's host does when its only path is inaccessible.
async fn only_inaccessible_path() {
    let nqn = naming::subsys_nqn("ana-none");
    let a = free_port_on("127.0.0.1");
    bdev::create_malloc("none", 16 * MIB, 4096).await.unwrap();
    let mp = Multipath {
        ana_state: AnaState::Inaccessible,
        min_cntlid: 1,
        max_cntlid: 1024,
    };
    nvmf::create_subsystem(spec(&nqn, "none", "127.0.0.1", a, mp))
        .await
        .unwrap();
    initiator::attach_tcp_path(
        "mp2",
        "127.0.0.1",
        a,
        &nqn,
        HOST,
        None,
        &HostKeys::default(),
    )
    .await
    .unwrap();
    host_sees("mp2", "127.0.0.1", a, AnaState::Inaccessible).await;
    let start = Instant::now();
    let write = tokio::spawn(io::write_at("mp2n1", 0, pattern(0, 1)));
    let result = tokio::time::timeout(Duration::from_secs(30), write)
        .await
        .expect("a write on an inaccessible path neither completed nor failed in 30 s")
        .unwrap();
    let took = start.elapsed();
    println!("part 2 (only an inaccessible path): the write ended after {took:?} with {result:?}");
    assert!(
        result.is_err(),
        "a write through an inaccessible path succeeded"
    );
    // SPDK queues it while the path may still become accessible, and fails it once the ANA
    // transition time the target reports (10 s) has passed.
    assert!(
        took >= Duration::from_secs(5),
        "it failed at once: {took:?}"
    );
    // Nothing reached the namespace.
    assert_eq!(bdev::io_stats("none").await.unwrap().write_ops, 0);
    initiator::detach("mp2").await.unwrap();
    nvmf::delete_subsystem(&nqn).await.unwrap();
}

/// What the child process of part 3 serves, passed in [`CHILD_ENV`] as `|`-separated
/// fields: address, port, NQN, min and max controller ID.
struct ChildSpec {
    address: String,
    port: u16,
    nqn: String,
    cntlid: (u16, u16),
}

impl ChildSpec {
    fn encode(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}",
            self.address, self.port, self.nqn, self.cntlid.0, self.cntlid.1
        )
    }

    fn decode(s: &str) -> Self {
        let f: Vec<&str> = s.split('|').collect();
        Self {
            address: f[0].into(),
            port: f[1].parse().unwrap(),
            nqn: f[2].into(),
            cntlid: (f[3].parse().unwrap(), f[4].parse().unwrap()),
        }
    }
}

/// The destination target of part 3, run by the parent as a child process: serves a fresh
/// bdev under the parent's NQN and namespace identity, starting inaccessible, and obeys
/// one command a line on stdin (`optimized`, `inaccessible`, `writes`, `quit`), answering
/// each with one `ANA-CHILD ...` line on stdout.
#[test]
#[ignore = "the destination target of ana_switch_over, started by it as a child process"]
fn ana_target_child() {
    let Some(env) = std::env::var_os(CHILD_ENV) else {
        println!("ana_target_child: skipped, it runs only as the child of ana_switch_over");
        return;
    };
    let c = ChildSpec::decode(&env.to_string_lossy());
    common::with_spdk(
        "t3-ana-child",
        false,
        Duration::from_secs(200),
        async move {
            nvmf::ensure_tcp_transport(&Default::default())
                .await
                .unwrap();
            bdev::create_malloc("dst", 64 * MIB, 4096).await.unwrap();
            let mp = Multipath {
                ana_state: AnaState::Inaccessible,
                min_cntlid: c.cntlid.0,
                max_cntlid: c.cntlid.1,
            };
            nvmf::create_subsystem(spec(&c.nqn, "dst", &c.address, c.port, mp))
                .await
                .unwrap();
            println!("{CHILD_TAG} ready");
            // Standard input is read on a thread of its own (tokio's stdin is not enabled).
            let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
            std::thread::spawn(move || {
                for line in std::io::stdin().lines() {
                    if tx.send(line.unwrap_or_default()).is_err() {
                        break;
                    }
                }
            });
            while let Some(line) = lines.recv().await {
                let state = match line.trim() {
                    "optimized" => AnaState::Optimized,
                    "inaccessible" => AnaState::Inaccessible,
                    "writes" => {
                        let s = bdev::io_stats("dst").await.unwrap();
                        println!("{CHILD_TAG} {}", s.write_ops);
                        continue;
                    }
                    _ => break,
                };
                match nvmf::set_ana_state(&c.nqn, &c.address, c.port, state, 1).await {
                    Ok(()) => println!("{CHILD_TAG} ok"),
                    Err(e) => println!("{CHILD_TAG} error {e}"),
                }
            }
            nvmf::delete_subsystem(&c.nqn).await.unwrap();
        },
    );
}

/// The parent's end of the child target.
struct Child {
    proc: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Child {
    fn spawn(spec: &ChildSpec) -> Self {
        let mut proc = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "ana_target_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, spec.encode())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = proc.stdin.take().unwrap();
        let lines = BufReader::new(proc.stdout.take().unwrap()).lines();
        Self { proc, stdin, lines }
    }

    /// The next answer line of the child (without its tag).
    async fn answer(&mut self) -> String {
        let read = async {
            while let Some(l) = self.lines.next_line().await.unwrap() {
                // The harness prints `test ana_target_child ... ` without a newline first.
                if let Some(i) = l.find(CHILD_TAG) {
                    return l[i + CHILD_TAG.len()..].trim().to_string();
                }
            }
            panic!("the child target exited");
        };
        tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .expect("the child target did not answer in 60 s")
    }

    async fn ask(&mut self, command: &str) -> String {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
        self.answer().await
    }
}

/// Part 3: two targets in two processes.
async fn two_targets() {
    let nqn = naming::subsys_nqn(UUID);
    let (src_addr, dst_addr) = ("127.0.0.2", "127.0.0.3");
    let (a, b) = (free_port_on(src_addr), free_port_on(dst_addr));
    let (src_range, dst_range) = (
        naming::cntlid_range(src_addr),
        naming::cntlid_range(dst_addr),
    );
    assert_ne!(src_range, dst_range);
    let mut child = Child::spawn(&ChildSpec {
        address: dst_addr.into(),
        port: b,
        nqn: nqn.clone(),
        cntlid: dst_range,
    });
    assert_eq!(child.answer().await, "ready");

    bdev::create_malloc("src", 64 * MIB, 4096).await.unwrap();
    let mp = Multipath {
        ana_state: AnaState::Optimized,
        min_cntlid: src_range.0,
        max_cntlid: src_range.1,
    };
    nvmf::create_subsystem(spec(&nqn, "src", src_addr, a, mp))
        .await
        .unwrap();
    let keys = HostKeys::default();
    initiator::attach_tcp_path("mp3", src_addr, a, &nqn, HOST, None, &keys)
        .await
        .unwrap();
    initiator::attach_tcp_path("mp3", dst_addr, b, &nqn, HOST, None, &keys)
        .await
        .unwrap();
    let paths = initiator::paths("mp3").await.unwrap();
    println!("part 3 paths: {paths:?}");
    assert_eq!(paths.len(), 2);
    assert!((src_range.0..=src_range.1).contains(&paths[0].cntlid));
    assert!((dst_range.0..=dst_range.1).contains(&paths[1].cntlid));
    host_sees("mp3", dst_addr, b, AnaState::Inaccessible).await;

    let w = Writer::start("mp3n1");
    w.progress(300, "writes through the source").await;
    assert_eq!(child.ask("writes").await, "0");
    let t0 = Instant::now();
    // The switch-over: fence the source, promote the destination, demote the source (which
    // ends the fence: the held I/O fails over).
    nvmf::fence_io(&nqn).await.unwrap();
    let fenced = bdev::io_stats("src").await.unwrap().write_ops;
    assert_eq!(child.ask("optimized").await, "ok");
    // As in part 1: SPDK's host retries a command with no usable path only after 1 s, so
    // the source is demoted once the host has read the destination's new state.
    host_sees("mp3", dst_addr, b, AnaState::Optimized).await;
    nvmf::set_ana_state(&nqn, src_addr, a, AnaState::Inaccessible, 1)
        .await
        .unwrap();
    let t1 = Instant::now();
    host_sees("mp3", src_addr, a, AnaState::Inaccessible).await;
    w.progress(500, "writes through the destination").await;
    let (last, samples, errors) = w.finish().await;
    assert_eq!(errors, 0, "the writer saw I/O errors");
    let (overall, across) = longest(&samples, (t0, t1));
    println!(
        "part 3 (two targets, two processes): {} writes, 0 errors, switch took {:?}, longest I/O across the switch {:?}, overall {:?}",
        samples.len(),
        t1 - t0,
        across,
        overall
    );
    // Nothing reached the source after the fence; the destination took the writes since.
    assert_eq!(bdev::io_stats("src").await.unwrap().write_ops, fenced);
    let dst_writes: u64 = child.ask("writes").await.parse().unwrap();
    assert!(
        dst_writes >= 500,
        "the destination took {dst_writes} writes"
    );
    // Every block last written after the switch reads back that write from the
    // destination (the blocks written before are the copy engine's job, not tested here).
    let after: HashMap<u64, u64> = samples
        .iter()
        .filter(|s| s.start > t1 && last.get(&s.block) == Some(&s.seq))
        .map(|s| (s.block, s.seq))
        .collect();
    assert!(!after.is_empty());
    verify("mp3n1", &after).await;
    assert!(
        across <= Duration::from_secs(2),
        "longest I/O across the switch {across:?}"
    );

    initiator::detach_path("mp3", src_addr, a).await.unwrap();
    assert_eq!(initiator::paths("mp3").await.unwrap().len(), 1);
    initiator::detach("mp3").await.unwrap();
    nvmf::delete_subsystem(&nqn).await.unwrap();
    child.stdin.write_all(b"quit\n").await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(60), child.proc.wait())
        .await
        .expect("the child target did not exit in 60 s")
        .unwrap();
    assert!(status.success(), "the child target failed: {status}");
}
