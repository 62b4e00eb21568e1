//! T3: a raid1 with a superblock whose second member is a volume exported by this process's
//! NVMe-oF target on 127.0.0.1 and attached with SPDK's NVMe/TCP initiator
//! ([`initiator::AttachOpts::raid_member`]), the shape of a replicated volume. A writer
//! runs through every scenario and must see no error from the raid:
//!
//! - a brief outage (the host's connection closed, [`nvmf::disconnect_host`]): the member
//!   reconnects and the raid stays whole;
//! - the host fenced off ([`nvmf::set_hosts`] without it: it is disconnected before the call
//!   returns): the member's I/O fails after `fast_io_fail_timeout` and the raid goes on
//!   degraded;
//! - a new member attached and rebuilt under a bandwidth limit (progress seen), then
//!   compared block for block with the local member, reading the exported bdev directly;
//! - a target that stops answering without closing the connection (its I/O held,
//!   [`nvmf::fence_io`]): the command deadline ([`initiator::set_io_timeouts`]) resets the
//!   controller and the member fails as fast;
//! - the member's subsystem deleted: the same.
//!
//! One SPDK, polling (SPDK 26.05's NVMe/TCP initiator refuses interrupt mode), stopped before
//! the process exits; the scenarios run in order in one test and print their names.
#![cfg(feature = "link")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use liteio_spdk::initiator::{self, AttachOpts, IoTimeouts};
use liteio_spdk::nvmf::{self, HostKeys, SubsystemSpec, TcpTransportOptions};
use liteio_spdk::raid::{self, RaidCreateOpts, RaidInfo, RaidLevel, RaidState};
use liteio_spdk::{ErrorKind, Spdk, SpdkOptions, bdev, io};

const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;
const HOST: &str = "nqn.2021-03.com.alipay.host:uuid:raid-member-test";
const RAID: &str = "rep";
/// Each member: 64 MiB; the raid's data starts 1 MiB in (malloc and NVMe bdevs have no
/// optimal I/O boundary).
const MEMBER: u64 = 64 * MIB;
/// The writer writes 64 KiB pieces round the first 16 MiB.
const WRITE: u64 = 64 * KIB;
const SPAN: u64 = 16 * MIB;
/// How long a member may take to fail once its target is gone: `fast_io_fail_timeout`
/// (2 s) after the controller noticed, plus the command deadline for a silent target (2 s),
/// plus the raid's removal of the member.
const FAIL_WITHIN: Duration = Duration::from_secs(10);
/// A silent target: the I/O deadline (3 s), the status read (up to the 2 s admin deadline),
/// then the reset fails and `fast_io_fail_timeout` (2 s) runs out.
const SILENT_FAIL_WITHIN: Duration = Duration::from_secs(12);

fn nqn(i: usize) -> String {
    format!("nqn.2021-03.com.alipay.raid-member-test:m{i}")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Export the malloc bdev `ex{i}` as subsystem `m{i}` for [`HOST`], attach it as controller
/// `c{i}` with the raid member's options; returns the initiator's bdev (`c{i}n1`).
async fn export_and_attach(i: usize) -> String {
    let ex = format!("ex{i}");
    bdev::create_malloc(&ex, MEMBER, 512).await.unwrap();
    let port = free_port();
    nvmf::create_subsystem(SubsystemSpec {
        nqn: nqn(i),
        serial: format!("RAIDMEMBER{i}"),
        model: "raid member".into(),
        bdev: ex,
        ns_uuid: format!("6a1d2c3b-0000-4000-8000-00000000000{i}"),
        address: "127.0.0.1".into(),
        port,
        hosts: vec![HOST.into()],
        keys: HostKeys::default(),
        keyless_hosts: Vec::new(),
        secure_channel: false,
        multipath: None,
    })
    .await
    .unwrap();
    let opts = AttachOpts {
        keep_alive_timeout: Some(Duration::from_secs(10)),
        ..AttachOpts::raid_member()
    };
    let ns = initiator::attach_tcp_opts(
        &format!("c{i}"),
        "127.0.0.1",
        port,
        &nqn(i),
        HOST,
        &HostKeys::default(),
        &opts,
    )
    .await
    .unwrap();
    assert_eq!(ns, [format!("c{i}n1")]);
    ns[0].clone()
}

fn byte(seed: u8, off: u64) -> u8 {
    ((off >> 9) as u8).wrapping_mul(29) ^ seed ^ (off as u8)
}

/// Writes 64 KiB pieces through the raid, one after another, until stopped; keeps what it
/// wrote (the last seed of each piece) and counts errors.
struct Writer {
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    errors: Arc<Mutex<Vec<String>>>,
    seeds: Arc<Mutex<Vec<u8>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let seeds = Arc::new(Mutex::new(vec![0u8; (SPAN / WRITE) as usize]));
        let (s, w, e, sd) = (stop.clone(), written.clone(), errors.clone(), seeds.clone());
        let task = tokio::spawn(async move {
            let mut n: u64 = 0;
            while !s.load(Ordering::Relaxed) {
                let piece = n % (SPAN / WRITE);
                let seed = (n / (SPAN / WRITE)) as u8 + 1;
                let off = piece * WRITE;
                let data: Vec<u8> = (0..WRITE).map(|i| byte(seed, off + i)).collect();
                match io::write_at(RAID, off, data).await {
                    Ok(()) => {
                        sd.lock().unwrap()[piece as usize] = seed;
                        w.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(err) => e.lock().unwrap().push(format!("write at {off}: {err}")),
                }
                n += 1;
            }
        });
        Self {
            stop,
            written,
            errors,
            seeds,
            task,
        }
    }

    fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Writes land (at least `n` more within 10 s) and none failed.
    async fn goes_on(&self, what: &str, n: u64) {
        let from = self.written();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.written() < from + n {
            assert!(Instant::now() < deadline, "{what}: the writer is stuck");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let errors = self.errors.lock().unwrap().clone();
        assert!(
            errors.is_empty(),
            "{what}: the raid failed writes: {errors:?}"
        );
    }

    /// Stops it; returns what each piece should hold.
    async fn stop(self) -> Vec<u8> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        let errors = self.errors.lock().unwrap().clone();
        assert!(errors.is_empty(), "the raid failed writes: {errors:?}");
        self.seeds.lock().unwrap().clone()
    }
}

/// The raid reads what the writer wrote last into each piece.
async fn raid_holds(seeds: &[u8]) {
    for (piece, seed) in seeds.iter().enumerate() {
        let off = piece as u64 * WRITE;
        let got = io::read_at(RAID, off, WRITE as usize).await.unwrap();
        let want: Vec<u8> = (0..WRITE).map(|i| byte(*seed, off + i)).collect();
        assert!(got == want, "raid piece at {off} is not what was written");
    }
}

/// The data regions of the local member and the exported bdev are equal, block for block.
async fn members_equal(info: &RaidInfo, local: &str, exported: &str) {
    let b = &info.bases[0];
    let start = b.data_offset_blocks * 512;
    let len = b.data_size_blocks * 512;
    let mut off = 0;
    while off < len {
        let n = (len - off).min(MIB) as usize;
        let x = io::read_at(local, start + off, n).await.unwrap();
        let y = io::read_at(exported, start + off, n).await.unwrap();
        assert!(x == y, "{local} and {exported} differ at data offset {off}");
        off += n as u64;
    }
}

async fn info() -> RaidInfo {
    raid::raid_info(RAID)
        .await
        .unwrap()
        .expect("the raid exists")
}

/// Waits until the raid has lost `member` (failed by the raid on its I/O errors), and
/// returns how long that took.
async fn degraded_without(member: &str, since: Instant) -> Duration {
    loop {
        let i = info().await;
        assert_eq!(i.state, RaidState::Online, "{i:?}");
        if !i
            .bases
            .iter()
            .any(|b| b.configured && b.name.as_deref() == Some(member))
        {
            let slot = i.bases.iter().find(|b| !b.configured).unwrap();
            println!("{member} failed after {:?}: {slot:?}", since.elapsed());
            assert!(slot.failed, "the slot says failed: {slot:?}");
            return since.elapsed();
        }
        assert!(
            since.elapsed() < FAIL_WITHIN * 3,
            "{member} still in the raid after {:?}: {i:?}",
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Adds `member` and follows its rebuild to the end (limited to 32 MiB/s: about 2 s).
async fn rebuild_onto(member: &str, limit: u32) -> RaidInfo {
    raid::set_rebuild_limit(limit).await.unwrap();
    let started = raid::add_raid_base(RAID, member).await.unwrap();
    raid::set_rebuild_limit(0).await.unwrap();
    assert!(started.is_degraded());
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let done = loop {
        let i = info().await;
        if let Some(p) = &i.process {
            seen.push((p.blocks_done, p.blocks_total));
        } else if !i.is_degraded() {
            break i;
        }
        assert!(Instant::now() < deadline, "rebuild not done: {i:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    seen.dedup();
    println!("rebuild onto {member} at {limit} MiB/s: (done, total) seen {seen:?}");
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0));
    if limit > 0 {
        assert!(seen.len() >= 3, "progress seen moving: {seen:?}");
    }
    done
}

#[test]
fn raid1_over_an_nvme_tcp_member_degrades_on_fencing_and_rebuilds() {
    let spdk = Spdk::start(&SpdkOptions {
        name: "t3-raid-nvme".into(),
        interrupt_mode: false,
        auto_examine: false,
        ..SpdkOptions::small()
    })
    .expect("SPDK starts");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(300), scenarios())
            .await
            .expect("the scenarios timed out")
    });
    drop(rt);
    spdk.stop();
}

async fn scenarios() {
    println!("(a) command deadlines and the transport, before any controller");
    // Past the I/O deadline SPDK reads the controller's status synchronously (bounded by
    // the admin deadline), then resets it.
    initiator::set_io_timeouts(&IoTimeouts {
        io: Some(Duration::from_secs(3)),
        admin: Some(Duration::from_secs(2)),
        transport: Some(Duration::from_secs(2)),
    })
    .await
    .unwrap();
    let e = initiator::set_io_timeouts(&IoTimeouts {
        io: None,
        admin: Some(Duration::from_secs(1)),
        transport: None,
    })
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    nvmf::ensure_tcp_transport(&TcpTransportOptions::default())
        .await
        .unwrap();

    println!("(b) a raid1 with a superblock over a local member and an NVMe/TCP member");
    bdev::create_malloc("local", MEMBER, 512).await.unwrap();
    let m0 = export_and_attach(0).await;
    // One keep-alive timeout for all controllers: another one is refused now.
    let e = initiator::attach_tcp_opts(
        "cx",
        "127.0.0.1",
        free_port(),
        &nqn(9),
        HOST,
        &HostKeys::default(),
        &AttachOpts {
            keep_alive_timeout: Some(Duration::from_secs(20)),
            ..AttachOpts::raid_member()
        },
    )
    .await
    .unwrap_err();
    println!("another keep-alive timeout: {e}");
    assert!(e.to_string().starts_with("keep_alive_timeout:"), "{e}");
    assert_eq!(bdev::get("cxn1").await.unwrap(), None);
    let r = raid::create_raid_with(
        RAID,
        RaidLevel::Raid1,
        &["local".to_string(), m0.clone()],
        0,
        &RaidCreateOpts {
            superblock: true,
            uuid: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(r.size_bytes(), MEMBER - MIB);
    let writer = Writer::start();
    writer.goes_on("whole", 50).await;

    println!("(c) a brief outage: the member reconnects, the raid stays whole");
    assert_eq!(nvmf::connected_hosts(&nqn(0)).await.unwrap(), [HOST]);
    nvmf::disconnect_host(&nqn(0), HOST).await.unwrap();
    // Still allowed: SPDK's initiator reconnects within its 1 s delay.
    let t = Instant::now();
    loop {
        let paths = initiator::paths("c0").await.unwrap();
        if t.elapsed() > Duration::from_millis(500) && paths.iter().all(|p| p.connected) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no reconnect: {paths:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    writer.goes_on("after a brief outage", 50).await;
    let i = info().await;
    assert!(!i.is_degraded(), "a brief outage does not degrade: {i:?}");
    // Disconnecting a host that is not connected: nothing to do.
    nvmf::disconnect_host(&nqn(0), "nqn.2021-03.com.alipay.host:uuid:nobody")
        .await
        .unwrap();

    println!("(d) the host fenced off: disconnected at once, the member fails fast");
    let t = Instant::now();
    let after = nvmf::set_hosts(&nqn(0), &[], &HostKeys::default())
        .await
        .unwrap();
    println!("fenced in {:?}", t.elapsed());
    assert!(after.hosts.is_empty());
    let took = degraded_without(&m0, t).await;
    assert!(took < FAIL_WITHIN, "{took:?}");
    assert!(
        nvmf::connected_hosts(&nqn(0)).await.unwrap().is_empty(),
        "the fenced host is not connected"
    );
    writer.goes_on("degraded", 50).await;
    let i = info().await;
    assert!(i.is_degraded());
    assert!(i.superblock_seq.is_some());

    println!("(e) a new member over NVMe/TCP, rebuilt under a limit");
    let m1 = export_and_attach(1).await;
    let i = rebuild_onto(&m1, 32).await;
    writer.goes_on("rebuilt", 50).await;
    // Compared at rest: the writer paused meanwhile.
    let seeds = writer.stop().await;
    members_equal(&i, "local", "ex1").await;
    raid_holds(&seeds).await;
    let writer = Writer::start();

    println!("(f) a target that stops answering: the command deadline fails the member");
    nvmf::fence_io(&nqn(1)).await.unwrap();
    let t = Instant::now();
    let took = degraded_without(&m1, t).await;
    assert!(took < SILENT_FAIL_WITHIN, "{took:?}");
    writer.goes_on("after a silent target", 50).await;
    nvmf::unfence_io(&nqn(1)).await.unwrap();

    println!("(g) a member whose subsystem is deleted fails fast too");
    let m2 = export_and_attach(2).await;
    rebuild_onto(&m2, 0).await;
    writer.goes_on("rebuilt again", 20).await;
    let t = Instant::now();
    nvmf::delete_subsystem(&nqn(2)).await.unwrap();
    let took = degraded_without(&m2, t).await;
    assert!(took < FAIL_WITHIN, "{took:?}");
    writer.goes_on("after the subsystem went", 50).await;
    let seeds = writer.stop().await;
    raid_holds(&seeds).await;

    println!("(h) clean up");
    raid::delete_raid(RAID).await.unwrap();
    for i in 0..3 {
        initiator::detach(&format!("c{i}")).await.unwrap();
        nvmf::delete_subsystem(&nqn(i)).await.unwrap();
        bdev::delete_malloc(&format!("ex{i}")).await.unwrap();
    }
    bdev::delete_malloc("local").await.unwrap();
    assert_eq!(raid::raid_info(RAID).await.unwrap(), None);
}
