//! `nvmf-check`: reach one NVMe-oF/TCP subsystem with SPDK's userspace initiator, in this
//! process, and check its data path: a pattern written and read back, a few seconds of 4 KiB
//! random I/O, or a stream of logged writes that rides out a target restart and is verified
//! block by block afterwards; or, with `--verify-writes`, a host whose volume is migrated:
//! verified random writes while commands on standard input add and drop multipath paths
//! (see `verify.rs`).
//!
//! It stands in for the kernel's `nvme connect` where the kernel has no `nvme_tcp` (as here):
//! `liteio-local` uses it to show the SPDK engine's data path, and the multi-node tests run it
//! inside a consumer node's network namespace with that node's host NQN.
//!
//! The figures it prints are those of this tool (one bdev descriptor per I/O, requests passed
//! to SPDK's thread one message each), not a benchmark of the target.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use futures::executor::block_on;
use liteio_agent::spdk::initiator::{self, Reconnect};
use liteio_agent::spdk::nvmf::HostKeys;
use liteio_agent::spdk::{Spdk, SpdkError, SpdkOptions, bdev, io, keyring};
use serde_json::json;

mod verify;

/// Connect to an NVMe-oF/TCP subsystem with SPDK's userspace initiator and check its data path.
///
/// Exit status: 0 all checks passed; 2 bad arguments; 3 could not connect (refused: wrong
/// host NQN or keys, no such subsystem, nothing listening); 4 data read back differs; 5 an I/O failed.
#[derive(Parser, Debug)]
#[command(name = "nvmf-check", version)]
struct Args {
    /// Target address (IPv4).
    #[arg(long)]
    address: std::net::Ipv4Addr,
    /// Target TCP port.
    #[arg(long)]
    port: u16,
    /// Subsystem NQN.
    #[arg(long)]
    subnqn: String,
    /// Host NQN to connect as.
    #[arg(
        long,
        conflicts_with = "hostnqn_file",
        required_unless_present = "hostnqn_file"
    )]
    hostnqn: Option<String>,
    /// File holding the host NQN (as the CSI node plugin and the agent read it).
    #[arg(long)]
    hostnqn_file: Option<std::path::PathBuf>,
    /// Bytes written with a pattern at the start of the namespace and read back (0 = skip).
    #[arg(long, default_value_t = 1 << 20)]
    check_bytes: u64,
    /// Seconds of 4 KiB random I/O, half reads and half writes (0 = skip).
    #[arg(long, default_value_t = 0)]
    random_seconds: u64,
    /// Share of reads in the random phase, in percent (100: reads only, 0: writes only).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    read_percent: u8,
    /// I/Os in flight during the random phase.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=256))]
    queue_depth: u32,
    /// Seconds of sequential 4 KiB writes, one at a time, each block tagged with its index;
    /// then every block is read back and compared. Reports the longest stall between two
    /// completed writes (a target restart shows as one).
    #[arg(long, default_value_t = 0)]
    write_seconds: u64,
    /// Keep reconnecting for up to this many seconds when the connection drops, with I/O
    /// queued meanwhile (0 = do not reconnect: I/O fails at once).
    #[arg(long, default_value_t = 0)]
    reconnect_seconds: u64,
    /// Authenticate with the keys in this file: a JSON object of the volume's Secret data as
    /// strings (`dhchapKey`, `dhchapCtrlKey`, optional `tlsPsk` for TLS), as kubelet hands
    /// them to the CSI node. A file, not an option value, so that no key shows in the
    /// process's command line; keep it mode 0600.
    #[arg(long)]
    keys_file: Option<std::path::PathBuf>,
    /// Play a host whose volume is being migrated: attach the path as the first of a
    /// multipath controller, run 4 KiB random writes at --queue-depth with a verifying
    /// pattern until `stop` (or end of input) on standard input, then read back every block
    /// written. Commands on standard input, one a line: `path <address> <port>`,
    /// `detach <address> <port>`, `paths`, `stop`. Prints a `tick {...}` line every second.
    /// Skips the --check-bytes phase.
    #[arg(long, conflicts_with_all = ["random_seconds", "write_seconds", "check_bytes"])]
    verify_writes: bool,
    /// With --verify-writes: the writes go to this many bytes at the start of the
    /// namespace (default: all of it).
    #[arg(long, requires = "verify_writes")]
    span_bytes: Option<u64>,
    /// With --verify-writes: a sample of the blocks never written must read zeroes (a fresh
    /// volume).
    #[arg(long, requires = "verify_writes")]
    expect_zeroes: bool,
    /// Print the result as one JSON object on the last line.
    #[arg(long)]
    json: bool,
}

/// Reads `--keys-file`; errors name the file and the data key, never a key.
fn read_keys(path: &std::path::Path) -> Result<liteio_api::auth::VolumeKeys, Failure> {
    let bad = |m: String| Failure::Args(format!("--keys-file {}: {m}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let map: std::collections::HashMap<String, String> = serde_json::from_str(&text)
        .map_err(|_| bad("not a JSON object of strings (the Secret's data)".into()))?;
    liteio_api::auth::VolumeKeys::from_string_map(&map).map_err(|e| bad(e.to_string()))
}

/// Loads `keys` into this process's keyring and says how to attach with them.
async fn load_keys(keys: &liteio_api::auth::VolumeKeys) -> Result<HostKeys, Failure> {
    let add = |name: &'static str, secret: &str| {
        let secret = secret.to_string();
        async move {
            keyring::add_key(name, &secret)
                .await
                .map(|()| name.to_string())
                .map_err(|e| Failure::Args(format!("--keys-file: {e}")))
        }
    };
    Ok(HostKeys {
        dhchap_key: Some(add("chk-host", keys.host.expose()).await?),
        dhchap_ctrlr_key: Some(add("chk-ctrl", keys.ctrl.expose()).await?),
        psk: match &keys.tls_psk {
            Some(p) => Some(add("chk-psk", p.expose()).await?),
            None => None,
        },
    })
}

const BLOCK: u64 = 4096;
/// The random phase stays within this many bytes of the namespace's start.
const RANDOM_SPAN: u64 = 256 << 20;

/// Why the check failed, with its exit status.
#[derive(Debug)]
enum Failure {
    Args(String),
    Connect(String),
    Mismatch(String),
    Io(String),
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Self::Args(_) => 2,
            Self::Connect(_) => 3,
            Self::Mismatch(_) => 4,
            Self::Io(_) => 5,
        }
    }
    fn message(&self) -> &str {
        match self {
            Self::Args(m) | Self::Connect(m) | Self::Mismatch(m) | Self::Io(m) => m,
        }
    }
}

fn io_failure(what: &str, e: &SpdkError) -> Failure {
    Failure::Io(format!("{what}: {e}"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut report = serde_json::Map::new();
    let result = run(&args, &mut report);
    if let Err(f) = &result {
        eprintln!("nvmf-check: {}", f.message());
        report.insert("error".into(), json!(f.message()));
    }
    report.insert("ok".into(), json!(result.is_ok()));
    if args.json {
        println!("{}", serde_json::Value::Object(report));
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => ExitCode::from(f.code()),
    }
}

fn host_nqn(args: &Args) -> Result<String, Failure> {
    let (nqn, from) = match (&args.hostnqn, &args.hostnqn_file) {
        (Some(n), _) => (n.trim().to_string(), "--hostnqn".to_string()),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Failure::Args(format!("--hostnqn-file {}: {e}", path.display())))?;
            let line = text.lines().map(str::trim).find(|l| !l.is_empty());
            (
                line.unwrap_or_default().to_string(),
                format!("--hostnqn-file {}", path.display()),
            )
        }
        (None, None) => return Err(Failure::Args("give --hostnqn or --hostnqn-file".into())),
    };
    if !liteio_node::hostnqn::is_nqn(&nqn) {
        return Err(Failure::Args(format!(
            "{from}: {nqn:?} is not an NQN (nqn.…, printable ASCII, at most 223 bytes)"
        )));
    }
    Ok(nqn)
}

fn run(
    args: &Args,
    report: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<(), Failure> {
    let hostnqn = host_nqn(args)?;
    let keys = args.keys_file.as_deref().map(read_keys).transpose()?;
    if args.subnqn.trim().is_empty() {
        return Err(Failure::Args("--subnqn must not be empty".into()));
    }
    let reconnect = (args.reconnect_seconds > 0).then(|| Reconnect {
        delay: Duration::from_secs(1),
        give_up_after: Duration::from_secs(args.reconnect_seconds.max(1)),
    });
    // A write queued while the initiator reconnects waits that long for its answer.
    let request_timeout = Duration::from_secs(30 + args.reconnect_seconds);
    // No hugepages and no core lock: a short-lived client beside the agents. SPDK's NVMe/TCP
    // initiator has no interrupt mode (only PCIe has), so its reactor polls one core while
    // the check runs.
    let spdk = Spdk::start(&SpdkOptions {
        name: format!("nvmf-check-{}", std::process::id()),
        interrupt_mode: false,
        no_pci: true,
        request_timeout,
        ..SpdkOptions::small()
    })
    .map_err(|e| Failure::Io(format!("cannot start SPDK: {e}")))?;
    let mut attached = false;
    let result = block_on(async {
        let auth = match &keys {
            Some(k) => load_keys(k).await?,
            None => HostKeys::default(),
        };
        check(args, &hostnqn, reconnect, &auth, report, &mut attached).await
    });
    if attached {
        let _ = block_on(initiator::detach("chk"));
    }
    spdk.stop();
    result
}

async fn check(
    args: &Args,
    hostnqn: &str,
    reconnect: Option<Reconnect>,
    auth: &HostKeys,
    report: &mut serde_json::Map<String, serde_json::Value>,
    attached: &mut bool,
) -> Result<(), Failure> {
    let address = args.address.to_string();
    let t = Instant::now();
    let attached_names = if args.verify_writes {
        // The first path of a multipath controller: `path` commands add others.
        initiator::attach_tcp_path(
            verify::CTRLR,
            &address,
            args.port,
            &args.subnqn,
            hostnqn,
            reconnect,
            auth,
        )
        .await
    } else {
        initiator::attach_tcp_auth(
            "chk",
            &address,
            args.port,
            &args.subnqn,
            hostnqn,
            reconnect,
            auth,
        )
        .await
    };
    let names = attached_names.map_err(|e| {
        let keys = if auth.dhchap_key.is_some() {
            "these keys are not the volume's"
        } else {
            "the target may require authentication: give --keys-file"
        };
        Failure::Connect(format!(
            "cannot connect to {} at {address}:{} as {hostnqn}: {e} (refused when this host NQN is not allowed or {keys}, the subsystem does not exist or nothing listens)",
            args.subnqn, args.port
        ))
    })?;
    *attached = true;
    let name = names
        .first()
        .cloned()
        .ok_or_else(|| Failure::Connect(format!("{} has no namespace", args.subnqn)))?;
    let info = bdev::get(&name)
        .await
        .map_err(|e| io_failure("look up the namespace", &e))?
        .ok_or_else(|| Failure::Connect(format!("namespace bdev {name} vanished")))?;
    let size = info.size_bytes();
    println!(
        "connected to {} at {address}:{} as {hostnqn} in {:?}: namespace {name}, {size} bytes, {}-byte blocks",
        args.subnqn,
        args.port,
        t.elapsed(),
        info.block_size
    );
    report.insert("size_bytes".into(), json!(size));
    report.insert("connect_ms".into(), json!(t.elapsed().as_millis()));

    if args.verify_writes {
        let session = verify::Session {
            subnqn: &args.subnqn,
            hostnqn,
            reconnect,
            keys: auth,
        };
        let opts = verify::Options {
            queue_depth: args.queue_depth as usize,
            span_bytes: args.span_bytes.unwrap_or(size),
            expect_zeroes: args.expect_zeroes,
        };
        return verify::run(&session, &opts, &name, size, report).await;
    }

    if args.check_bytes > 0 {
        let len = args.check_bytes.min(size) / BLOCK * BLOCK;
        if len == 0 {
            return Err(Failure::Args(format!(
                "--check-bytes {}: the namespace ({size} bytes) has no whole 4 KiB block",
                args.check_bytes
            )));
        }
        let data = pattern(0x5eed, 0, len);
        io::write_at(&name, 0, data.clone())
            .await
            .map_err(|e| io_failure("write the check pattern", &e))?;
        let back = io::read_at(&name, 0, usize::try_from(len).unwrap_or(usize::MAX))
            .await
            .map_err(|e| io_failure("read the check pattern back", &e))?;
        if back != data {
            let at = back
                .iter()
                .zip(&data)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Err(Failure::Mismatch(format!(
                "the {len} bytes read back differ from those written, first at byte {at}"
            )));
        }
        println!("wrote {len} bytes and read them back: identical");
        report.insert("checked_bytes".into(), json!(len));
    }

    if args.random_seconds > 0 {
        random_io(args, &name, size, report).await?;
    }
    if args.write_seconds > 0 {
        logged_writes(args, &name, size, report).await?;
    }
    Ok(())
}

/// `len` bytes of a pattern that names `seed` and each 8-byte word's byte offset `base + i`.
fn pattern(seed: u64, base: u64, len: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    let mut off = base;
    while (v.len() as u64) < len {
        v.extend_from_slice(&(off ^ seed.rotate_left(32)).to_le_bytes());
        off += 8;
    }
    v
}

/// xorshift64*: offsets for the random phase, no dependency needed.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn random_io(
    args: &Args,
    name: &str,
    size: u64,
    report: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<(), Failure> {
    let blocks = size.min(RANDOM_SPAN) / BLOCK;
    if blocks == 0 {
        return Err(Failure::Args("the namespace is smaller than 4 KiB".into()));
    }
    let until = Instant::now() + Duration::from_secs(args.random_seconds);
    let start = Instant::now();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(std::process::id());
    let read_percent = u64::from(args.read_percent);
    let ops = futures::stream::iter(std::iter::from_fn(|| {
        (Instant::now() < until).then(|| next(&mut seed))
    }))
    .map(|r| {
        let name = name.to_string();
        async move {
            let offset = (r % blocks) * BLOCK;
            let t = Instant::now();
            let res = if (r >> 33) % 100 < read_percent {
                io::read_at(&name, offset, BLOCK as usize).await.map(|_| ())
            } else {
                io::write_at(&name, offset, pattern(r, offset, BLOCK)).await
            };
            res.map(|()| t.elapsed())
        }
    })
    .buffer_unordered(args.queue_depth as usize)
    .collect::<Vec<_>>()
    .await;
    let elapsed = start.elapsed();
    let mut lat = Vec::with_capacity(ops.len());
    for r in ops {
        lat.push(r.map_err(|e| io_failure("random I/O", &e))?);
    }
    lat.sort();
    let iops = lat.len() as f64 / elapsed.as_secs_f64();
    let (p50, p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));
    let mean = lat.iter().sum::<Duration>() / u32::try_from(lat.len().max(1)).unwrap_or(1);
    println!(
        "4 KiB random I/O ({read_percent} % reads, queue depth {}) for {:.1} s: {} I/Os, {iops:.0} IOPS, latency mean {:?}, p50 {p50:?}, p99 {p99:?}",
        args.queue_depth,
        elapsed.as_secs_f64(),
        lat.len(),
        mean,
    );
    report.insert("random_read_percent".into(), json!(read_percent));
    report.insert("random_ios".into(), json!(lat.len()));
    report.insert("random_iops".into(), json!(iops.round()));
    report.insert("random_p50_us".into(), json!(p50.as_micros()));
    report.insert("random_p99_us".into(), json!(p99.as_micros()));
    Ok(())
}

async fn logged_writes(
    args: &Args,
    name: &str,
    size: u64,
    report: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<(), Failure> {
    let max_blocks = size / BLOCK;
    let seed = 0x10_66ed ^ u64::from(std::process::id());
    let until = Instant::now() + Duration::from_secs(args.write_seconds);
    let mut last = Instant::now();
    let (mut stall, mut stall_ends_at, mut n) = (Duration::ZERO, 0_u64, 0_u64);
    let mut gaps = Vec::new();
    while Instant::now() < until && n < max_blocks {
        io::write_at(name, n * BLOCK, pattern(seed, n * BLOCK, BLOCK))
            .await
            .map_err(|e| io_failure(&format!("write block {n}"), &e))?;
        n += 1;
        let gap = last.elapsed();
        last = Instant::now();
        gaps.push(gap);
        if gap > stall {
            (stall, stall_ends_at) = (gap, n);
        }
        if n.is_power_of_two() || n % 1024 == 0 {
            println!("written {n} blocks; longest stall so far {stall:?}");
        }
    }
    for b in 0..n {
        let back = io::read_at(name, b * BLOCK, BLOCK as usize)
            .await
            .map_err(|e| io_failure(&format!("read block {b}"), &e))?;
        if back != pattern(seed, b * BLOCK, BLOCK) {
            return Err(Failure::Mismatch(format!(
                "block {b} of {n} read back differs from what was written"
            )));
        }
    }
    let after = n - stall_ends_at.min(n);
    println!(
        "wrote {n} blocks in sequence and read every one back: identical; longest stall {stall:?}, then {after} more blocks"
    );
    report.insert("written_blocks".into(), json!(n));
    report.insert("longest_stall_ms".into(), json!(stall.as_millis()));
    // What one write takes when nothing goes wrong, to tell a stall from the usual pace.
    gaps.sort();
    let median = gaps.get(gaps.len() / 2).copied().unwrap_or_default();
    report.insert(
        "median_write_us".into(),
        json!(u64::try_from(median.as_micros()).unwrap_or(u64::MAX)),
    );
    report.insert("blocks_after_stall".into(), json!(after));
    Ok(())
}
