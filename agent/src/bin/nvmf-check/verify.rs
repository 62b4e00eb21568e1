//! `--verify-writes`: a host whose volume is being migrated. 4 KiB random writes at a fixed
//! queue depth whose content is derivable from (block, sequence number of its last write),
//! while commands on standard input add and drop paths of the multipath controller; on
//! `stop` (or end of input) every block written is read back and compared.
//!
//! Protocol, one line each way:
//!
//! | stdin | stdout |
//! |---|---|
//! | `path <address> <port>` | `path attached <address> <port>` or `error …` |
//! | `detach <address> <port>` | `path detached <address> <port>` or `error …` |
//! | `paths` | `paths [{"address":…,"port":…,"cntlid":…,"ana_state":…,"connected":…}]` |
//! | `stop` | the summary (and with `--json` the result as the last line) |
//!
//! Commands run one at a time, in order, beside the writes (a slow attach does not hold the
//! I/O). Once a second the tool prints `tick {"t_ms":…,"writes":…,"errors":…,"max_us":…}`:
//! writes completed in that second, failed ones, and the longest completion among them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use futures::future::{Fuse, FusedFuture, LocalBoxFuture};
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use liteio_agent::spdk::initiator::{self, PathInfo, Reconnect};
use liteio_agent::spdk::nvmf::{AnaState, HostKeys};
use liteio_agent::spdk::{SpdkError, io};
use serde_json::{Value, json};

use super::{BLOCK, Failure};

/// The multipath NVMe bdev controller of this mode; its namespace is `chkn1`.
pub const CTRLR: &str = "chk";
/// Unwritten blocks read back with `--expect-zeroes`, spread over the namespace.
const ZERO_SAMPLES: u64 = 256;

/// What every path is attached with: the first path's subsystem, host NQN, keys and
/// reconnect settings.
pub struct Session<'a> {
    pub subnqn: &'a str,
    pub hostnqn: &'a str,
    pub reconnect: Option<Reconnect>,
    pub keys: &'a HostKeys,
}

/// What this mode is asked to do.
pub struct Options {
    pub queue_depth: usize,
    /// Bytes at the start of the namespace the writes go to.
    pub span_bytes: u64,
    pub expect_zeroes: bool,
}

/// The content of `block` after the write with sequence number `seq` (from 1): the block
/// and the number in the first 16 bytes, then a stream seeded by both.
pub fn pattern(block: u64, seq: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(BLOCK as usize);
    v.extend_from_slice(&block.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    let mut x = block.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seq;
    while (v.len() as u64) < BLOCK {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

/// What a block read back holds, for the first mismatch's report.
fn describe(data: &[u8]) -> String {
    if data.iter().all(|&b| b == 0) {
        return "zeroes".into();
    }
    let word = |i: usize| {
        data.get(i..i + 8)
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            .map(u64::from_le_bytes)
    };
    match (word(0), word(8)) {
        (Some(b), Some(s)) if data == pattern(b, s).as_slice() => {
            format!("block {b}'s write {s}")
        }
        _ => "other data".into(),
    }
}

/// A line of standard input, or its end; or a second has passed.
enum Event {
    Line(String),
    Eof,
    Tick,
}

/// Standard input and the clock, as one stream of events. Both threads end when the
/// receiver is gone (the stdin thread at its next line or at end of input).
fn events(start: Instant) -> mpsc::UnboundedReceiver<Event> {
    let (tx, rx) = mpsc::unbounded();
    let input = tx.clone();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if input.unbounded_send(Event::Line(line)).is_err() {
                return;
            }
        }
        let _ = input.unbounded_send(Event::Eof);
    });
    std::thread::spawn(move || {
        // Due times from the start, so that the ticks do not drift.
        for k in 1.. {
            let due = start + Duration::from_secs(k);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if tx.unbounded_send(Event::Tick).is_err() {
                return;
            }
        }
    });
    rx
}

enum Command {
    Path(String, u16),
    Detach(String, u16),
    Paths,
    Stop,
}

fn parse(line: &str) -> Result<Command, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let target = |verb: &str| -> Result<(String, u16), String> {
        let [_, address, port] = words.as_slice() else {
            return Err(format!("usage: {verb} <address> <port>"));
        };
        let address: std::net::Ipv4Addr = address
            .parse()
            .map_err(|_| format!("{verb}: {address:?} is not an IPv4 address"))?;
        let port = port
            .parse()
            .map_err(|_| format!("{verb}: {port:?} is not a port"))?;
        Ok((address.to_string(), port))
    };
    match words.first().copied() {
        Some("path") => target("path").map(|(a, p)| Command::Path(a, p)),
        Some("detach") => target("detach").map(|(a, p)| Command::Detach(a, p)),
        Some("paths") if words.len() == 1 => Ok(Command::Paths),
        Some("stop") if words.len() == 1 => Ok(Command::Stop),
        _ => Err(format!(
            "unknown command {line:?} (path <address> <port>, detach <address> <port>, paths, stop)"
        )),
    }
}

fn ana_name(state: Option<AnaState>) -> Value {
    match state {
        Some(AnaState::Optimized) => json!("optimized"),
        Some(AnaState::NonOptimized) => json!("non_optimized"),
        Some(AnaState::Inaccessible) => json!("inaccessible"),
        None => Value::Null,
    }
}

fn paths_json(paths: &[PathInfo]) -> Value {
    paths
        .iter()
        .map(|p| {
            json!({
                "address": p.address,
                "port": p.port,
                "cntlid": p.cntlid,
                "ana_state": ana_name(p.ana_state),
                "connected": p.connected,
            })
        })
        .collect()
}

/// Runs one command other than `stop`; the line to print.
async fn command(session: &Session<'_>, cmd: Command) -> String {
    match cmd {
        Command::Path(address, port) => match initiator::attach_tcp_path(
            CTRLR,
            &address,
            port,
            session.subnqn,
            session.hostnqn,
            session.reconnect,
            session.keys,
        )
        .await
        {
            Ok(_) => format!("path attached {address} {port}"),
            Err(e) => format!("error path {address} {port}: {e}"),
        },
        Command::Detach(address, port) => {
            match initiator::detach_path(CTRLR, &address, port).await {
                Ok(()) => format!("path detached {address} {port}"),
                Err(e) => format!("error detach {address} {port}: {e}"),
            }
        }
        Command::Paths => match initiator::paths(CTRLR).await {
            Ok(p) => format!("paths {}", paths_json(&p)),
            Err(e) => format!("error paths: {e}"),
        },
        Command::Stop => "error stop is not a command to run".into(),
    }
}

/// One completed write.
struct Done {
    block: u64,
    seq: u64,
    took: Duration,
    result: Result<(), SpdkError>,
}

/// How long a write waits for an I/O channel before it counts as failed.
const CHANNEL_WAIT: Duration = Duration::from_secs(10);

/// Resolves after `d`, without blocking the executor (a thread sleeps instead).
async fn pause(d: Duration) {
    let (tx, rx) = futures::channel::oneshot::channel::<()>();
    std::thread::spawn(move || {
        std::thread::sleep(d);
        let _ = tx.send(());
    });
    let _ = rx.await;
}

async fn write_block(bdev: String, block: u64, seq: u64) -> Done {
    let start = Instant::now();
    let result = loop {
        let r = io::write_at(&bdev, block * BLOCK, pattern(block, seq)).await;
        // SPDK's multipath bdev cannot give out a channel while one of its paths is being
        // torn down (a target that died): the write was never submitted, so this tool,
        // like a host's block layer, tries again rather than report an I/O error.
        match r {
            Err(SpdkError::Errno {
                op: "get io channel",
                ..
            }) if start.elapsed() < CHANNEL_WAIT => pause(Duration::from_millis(20)).await,
            r => break r,
        }
    };
    Done {
        block,
        seq,
        took: start.elapsed(),
        result,
    }
}

/// Writes completed and failed in one tick, and the longest among them.
#[derive(Default)]
struct Window {
    writes: u64,
    errors: u64,
    max: Duration,
}

/// What the writes left: the last write of each block, and the counters.
#[derive(Default)]
struct Ledger {
    /// Block → sequence number of its last (successful) write.
    last: HashMap<u64, u64>,
    /// Blocks whose last write failed: their content is either write's, not compared.
    uncertain: HashSet<u64>,
    /// Blocks with a write in flight.
    busy: HashSet<u64>,
    writes: u64,
    errors: u64,
    first_error: Option<String>,
    longest: Duration,
    window: Window,
}

impl Ledger {
    fn error(&mut self, what: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(what);
        }
    }

    fn complete(&mut self, d: Done) {
        self.busy.remove(&d.block);
        self.longest = self.longest.max(d.took);
        self.window.max = self.window.max.max(d.took);
        match d.result {
            Ok(()) => {
                self.writes += 1;
                self.window.writes += 1;
                self.last.insert(d.block, d.seq);
                self.uncertain.remove(&d.block);
            }
            Err(e) => {
                self.window.errors += 1;
                self.error(format!("write block {}: {e}", d.block));
                self.last.remove(&d.block);
                self.uncertain.insert(d.block);
            }
        }
    }
}

/// xorshift64*: the blocks to write, no dependency needed.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Writes until `stop`, obeying the commands meanwhile; then verifies. Fills `report`;
/// fails with [`Failure::Mismatch`] when a block differs, else [`Failure::Io`] when any
/// I/O failed.
pub async fn run(
    session: &Session<'_>,
    opts: &Options,
    bdev: &str,
    size: u64,
    report: &mut serde_json::Map<String, Value>,
) -> Result<(), Failure> {
    let blocks = opts.span_bytes.min(size) / BLOCK;
    if blocks == 0 {
        return Err(Failure::Args(format!(
            "--span-bytes {}: no whole 4 KiB block of the namespace ({size} bytes)",
            opts.span_bytes
        )));
    }
    // Never two writes to a block at once: at most one write per block in flight.
    let depth = opts
        .queue_depth
        .min(usize::try_from(blocks).unwrap_or(usize::MAX));
    let start = Instant::now();
    let mut events = events(start);
    let mut ledger = Ledger::default();
    let mut inflight = FuturesUnordered::new();
    let mut queue: VecDeque<String> = VecDeque::new();
    let mut running: Fuse<LocalBoxFuture<'_, String>> = Fuse::terminated();
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(std::process::id());
    let mut seq = 0_u64;
    let mut stopping = false;
    println!(
        "writing 4 KiB blocks at queue depth {depth} over {} bytes; commands: path <address> <port>, detach <address> <port>, paths, stop",
        blocks * BLOCK
    );
    loop {
        while !stopping && inflight.len() < depth {
            let block = loop {
                let b = next(&mut rng) % blocks;
                if !ledger.busy.contains(&b) {
                    break b;
                }
            };
            seq += 1;
            ledger.busy.insert(block);
            inflight.push(write_block(bdev.to_string(), block, seq));
        }
        // One command at a time, in order; `stop` takes effect in its turn.
        while running.is_terminated() && !stopping {
            let Some(line) = queue.pop_front() else { break };
            match parse(&line) {
                Ok(Command::Stop) => stopping = true,
                Ok(cmd) => running = command(session, cmd).boxed_local().fuse(),
                Err(e) => println!("error {e}"),
            }
        }
        if stopping && inflight.is_empty() && running.is_terminated() {
            break;
        }
        futures::select! {
            done = inflight.select_next_some() => ledger.complete(done),
            event = events.next() => match event {
                Some(Event::Line(line)) if line.trim().is_empty() => {}
                Some(Event::Line(line)) => queue.push_back(line),
                Some(Event::Eof) | None => queue.push_back("stop".into()),
                Some(Event::Tick) if !stopping => {
                    let w = std::mem::take(&mut ledger.window);
                    println!(
                        "tick {}",
                        json!({
                            "t_ms": u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
                            "writes": w.writes,
                            "errors": w.errors,
                            "max_us": u64::try_from(w.max.as_micros()).unwrap_or(u64::MAX),
                        })
                    );
                }
                Some(Event::Tick) => {}
            },
            line = running => println!("{line}"),
            complete => break,
        }
    }
    let elapsed = start.elapsed();
    drop(events);
    let iops = ledger.writes as f64 / elapsed.as_secs_f64().max(1e-3);
    println!(
        "stopped after {:.1} s: {} writes ({iops:.0} IOPS), {} errors, longest I/O {:?}; verifying {} blocks",
        elapsed.as_secs_f64(),
        ledger.writes,
        ledger.errors,
        ledger.longest,
        ledger.last.len()
    );
    report.insert("writes".into(), json!(ledger.writes));
    report.insert("write_seconds".into(), json!(elapsed.as_secs_f64()));
    report.insert("iops".into(), json!(iops.round()));
    report.insert(
        "longest_io_us".into(),
        json!(u64::try_from(ledger.longest.as_micros()).unwrap_or(u64::MAX)),
    );
    report.insert("written_blocks".into(), json!(ledger.last.len()));
    report.insert("unverified_blocks".into(), json!(ledger.uncertain.len()));

    let v = verify(bdev, size, opts, depth, &mut ledger).await;
    println!(
        "verified {} of {} written blocks and {} unwritten ones: {} mismatches{}",
        v.verified,
        ledger.last.len(),
        v.zeroes,
        v.mismatches,
        v.first
            .as_ref()
            .map(|(b, what)| format!(", first at block {b}: {what}"))
            .unwrap_or_default()
    );
    report.insert("verified_blocks".into(), json!(v.verified));
    report.insert("zero_checked_blocks".into(), json!(v.zeroes));
    report.insert("mismatches".into(), json!(v.mismatches));
    report.insert(
        "first_mismatch".into(),
        v.first
            .as_ref()
            .map_or(Value::Null, |(b, what)| json!({"block": b, "found": what})),
    );
    report.insert("errors".into(), json!(ledger.errors));
    report.insert("first_error".into(), json!(ledger.first_error));
    report.insert(
        "paths".into(),
        match initiator::paths(CTRLR).await {
            Ok(p) => paths_json(&p),
            Err(e) => json!(format!("cannot list the paths: {e}")),
        },
    );
    if let Some((b, what)) = v.first {
        return Err(Failure::Mismatch(format!(
            "{} blocks read back differ from their last write, first block {b}: {what}",
            v.mismatches
        )));
    }
    if let Some(e) = ledger.first_error {
        return Err(Failure::Io(format!(
            "{} I/Os failed, first: {e}",
            ledger.errors
        )));
    }
    Ok(())
}

/// What the read-back found.
struct Verified {
    verified: u64,
    zeroes: u64,
    mismatches: u64,
    /// The lowest block that differs, and what it holds.
    first: Option<(u64, String)>,
}

/// Reads back every block with a known last write and, with `--expect-zeroes`, a sample of
/// never-written blocks of the whole namespace; read errors count in `ledger`.
async fn verify(
    bdev: &str,
    size: u64,
    opts: &Options,
    depth: usize,
    ledger: &mut Ledger,
) -> Verified {
    let mut want: Vec<(u64, Option<u64>)> =
        ledger.last.iter().map(|(&b, &s)| (b, Some(s))).collect();
    if opts.expect_zeroes {
        let all = size / BLOCK;
        let n = ZERO_SAMPLES.min(all);
        let mut sample: Vec<u64> = (0..n).map(|i| i * all / n).collect();
        sample.push(all.saturating_sub(1));
        sample.dedup();
        want.extend(
            sample
                .into_iter()
                .filter(|b| !ledger.last.contains_key(b) && !ledger.uncertain.contains(b))
                .map(|b| (b, None)),
        );
    }
    want.sort_unstable();
    let mut reads = futures::stream::iter(want)
        .map(|(block, seq)| async move {
            let got = io::read_at(bdev, block * BLOCK, BLOCK as usize).await;
            (block, seq, got)
        })
        .buffer_unordered(depth);
    let mut v = Verified {
        verified: 0,
        zeroes: 0,
        mismatches: 0,
        first: None,
    };
    while let Some((block, seq, got)) = reads.next().await {
        let data = match got {
            Ok(d) => d,
            Err(e) => {
                ledger.error(format!("read block {block}: {e}"));
                continue;
            }
        };
        let ok = match seq {
            Some(s) => data == pattern(block, s),
            None => data.iter().all(|&b| b == 0),
        };
        match (ok, seq) {
            (true, Some(_)) => v.verified += 1,
            (true, None) => v.zeroes += 1,
            (false, _) => {
                v.mismatches += 1;
                if v.first.as_ref().is_none_or(|(b, _)| block < *b) {
                    let expected = seq.map_or("zeroes".to_string(), |s| format!("write {s}"));
                    v.first = Some((
                        block,
                        format!("expected {expected}, found {}", describe(&data)),
                    ));
                }
            }
        }
    }
    v
}
