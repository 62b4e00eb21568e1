//! T3: a raid1 with a superblock over lvols, against real SPDK (interrupt mode, no
//! hugepages, `--features link`): made, written, a member removed (degraded, I/O goes on), a
//! new member added and rebuilt (progress seen, then every block compared), assembled again
//! from the superblocks (both current: online; a member that missed writes: reported not
//! current and not used, then rebuilt), across SPDK restarts with auto-examine off (nothing
//! assembled behind the caller's back; a member absent: waiting, or started degraded) and on
//! (SPDK assembles by itself); bad inputs that leave nothing behind.
//!
//! One SPDK at a time per process, started three times in one test (the phases depend on
//! each other's data on disk); each scenario prints its name first. The members are lvols on
//! two lvstores over aio files, so that a member's UUID survives a restart and a whole
//! "node" (the second lvstore) can be absent.
#![cfg(feature = "link")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use liteio_spdk::raid::{
    self, AssembleOpts, RaidCreateOpts, RaidInfo, RaidLevel, RaidState, SlotState,
};
use liteio_spdk::{ErrorKind, Spdk, SpdkOptions, bdev, io, lvol};

const MIB: u64 = 1 << 20;
/// Each member: 32 MiB (8 clusters of 4 MiB). The raid's data starts at the first lvol
/// cluster boundary past the superblock's 1 MiB (an lvol's optimal I/O boundary), 4 MiB in.
const MEMBER: u64 = 32 * MIB;
const DATA_OFFSET: u64 = 4 * MIB;
const RAID: &str = "r1";
const RAID_UUID: &str = "5f1c0de0-0b1e-4a5e-9c1a-7e57ab1eface";

/// The lvols: `ra`, `rc`, `rd` on lvstore `lvs1` (pool1), `rb` on `lvs2` (pool2: the member
/// that can be absent).
const RA: &str = "lvs1/ra";
const RB: &str = "lvs2/rb";
const RC: &str = "lvs1/rc";
const RD: &str = "lvs1/rd";

fn opts(auto_examine: bool) -> SpdkOptions {
    SpdkOptions {
        name: "t3-raid-sb".into(),
        auto_examine,
        ..SpdkOptions::small()
    }
}

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| s.to_string()).collect()
}

/// The byte at absolute raid offset `off` of pattern `seed`.
fn byte(seed: u8, off: u64) -> u8 {
    ((off >> 9) as u8).wrapping_mul(31) ^ seed ^ (off as u8)
}

fn pattern(seed: u8, off: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| byte(seed, off + i)).collect()
}

/// What the raid should hold, kept in memory, and written through the raid.
struct Model {
    data: Vec<u8>,
}

impl Model {
    async fn write(&mut self, seed: u8, off: u64, len: usize) {
        let p = pattern(seed, off, len);
        io::write_at(RAID, off, p.clone()).await.unwrap();
        self.data[off as usize..off as usize + len].copy_from_slice(&p);
    }

    /// Every byte of the raid equals the model (read in 1 MiB pieces).
    async fn check_raid(&self, what: &str) {
        let mut off = 0;
        while off < self.data.len() {
            let len = (self.data.len() - off).min(MIB as usize);
            let got = io::read_at(RAID, off as u64, len).await.unwrap();
            assert!(
                got == self.data[off..off + len],
                "{what}: raid differs from what was written at {off}"
            );
            off += len;
        }
    }
}

/// The data regions of two members are equal block for block, and equal the model.
async fn members_equal(info: &RaidInfo, a: &str, b: &str, model: &Model) {
    let base = info
        .bases
        .iter()
        .find(|x| x.configured)
        .expect("a configured member");
    let start = base.data_offset_blocks * u64::from(info.block_size);
    let len = base.data_size_blocks * u64::from(info.block_size);
    assert_eq!(len, model.data.len() as u64);
    let mut off = 0;
    while off < len {
        let n = (len - off).min(MIB) as usize;
        let x = io::read_at(a, start + off, n).await.unwrap();
        let y = io::read_at(b, start + off, n).await.unwrap();
        assert!(x == y, "{a} and {b} differ in the MiB at raid offset {off}");
        assert!(
            x == model.data[off as usize..off as usize + n],
            "{a} differs from what was written at raid offset {off}"
        );
        off += n as u64;
    }
}

/// Polls `f` every 50 ms until it returns `Some`, or panics after `within`.
async fn eventually<T, F, Fut>(what: &str, within: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn info() -> RaidInfo {
    raid::raid_info(RAID)
        .await
        .unwrap()
        .expect("the raid exists")
}

/// Whether the raid has `member` configured (by the name given or the lvol's own name).
async fn holds(info: &RaidInfo, member: &str) -> bool {
    let own = bdev::get(member).await.unwrap().map(|b| b.name);
    info.bases.iter().any(|b| {
        b.configured && (b.name.as_deref() == Some(member) || b.name.as_deref() == own.as_deref())
    })
}

/// Add `member` to the raid's empty slot and follow its rebuild to the end, polling its
/// progress every 2 ms (unlimited: in interrupt mode SPDK's rebuild limit is refused, see
/// `raid::set_rebuild_limit`; the NVMe/TCP test, which polls, sees a limited one move).
async fn rebuild_onto(member: &str) -> RaidInfo {
    let e = raid::set_rebuild_limit(8).await.unwrap_err();
    assert!(e.to_string().contains("needs polling reactors"), "{e}");
    raid::set_rebuild_limit(0).await.unwrap();
    let started = raid::add_raid_base(RAID, member).await.unwrap();
    assert!(
        started.is_degraded(),
        "not whole until rebuilt: {started:?}"
    );
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let done = loop {
        let i = info().await;
        if let Some(p) = &i.process {
            assert_eq!(p.kind, "rebuild");
            assert_eq!(p.blocks_total, i.num_blocks);
            seen.push(p.blocks_done);
        } else if !i.is_degraded() {
            break i;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "rebuild not done: {i:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    seen.dedup();
    println!(
        "rebuild onto {member}: blocks done seen {seen:?} of {}",
        done.num_blocks
    );
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "progress only grows");
    assert!(seen.iter().all(|b| *b <= done.num_blocks), "{seen:?}");
    assert!(holds(&done, member).await, "{done:?}");
    done
}

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn sparse_file(path: &Path, size: u64) {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
}

#[test]
fn raid1_superblock_degrade_rebuild_and_assemble_across_restarts() {
    let dir = Dir(std::env::temp_dir().join(format!("liteio-t3-raid-sb-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let (pool1, pool2) = (dir.0.join("pool1"), dir.0.join("pool2"));
    sparse_file(&pool1, 192 * MIB);
    sparse_file(&pool2, 64 * MIB);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut model = Model {
        data: vec![0; (MEMBER - DATA_OFFSET) as usize],
    };

    println!("== phase 1: auto-examine off, a fresh raid1 with a superblock");
    let spdk = Spdk::start(&opts(false)).expect("SPDK starts");
    let seq = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(300), async {
            for (aio, file, lvs) in [("pool1", &pool1, "lvs1"), ("pool2", &pool2, "lvs2")] {
                bdev::create_aio(aio, file, 512).await.unwrap();
                bdev::examine(aio).await.unwrap();
                lvol::create_lvstore(aio, lvs, 0).await.unwrap();
            }
            for m in [RA, RB, RC, RD] {
                let (lvs, name) = m.split_once('/').unwrap();
                lvol::create_lvol(lvs, name, MEMBER, false, lvol::Clear::Unmap)
                    .await
                    .unwrap();
            }
            println!("(a) bad inputs leave nothing");
            bad_inputs_leave_nothing().await;
            println!("(b) create, write, superblocks");
            create_and_write(&mut model).await;
            println!("(c) a member removed: degraded, I/O goes on");
            remove_a_member(&mut model).await;
            println!("(d) a new member rebuilt");
            let i = rebuild_onto(RC).await;
            members_equal(&i, RA, RC, &model).await;
            model.check_raid("after the rebuild").await;
            println!("(e) deleted and assembled again from the superblocks");
            both_current_assemble_online(&model).await;
            println!("(f) the member that missed writes is not current");
            stale_member_not_used_then_rebuilt(&mut model).await;
            info().await.superblock_seq.unwrap()
        })
        .await
        .expect("phase 1 timed out")
    });
    spdk.stop();

    println!("== phase 2: restarted, auto-examine off");
    let spdk = Spdk::start(&opts(false)).expect("SPDK starts again");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(300), async {
            after_restart_absent_member_then_degraded(&pool1, &pool2, seq, &mut model).await;
        })
        .await
        .expect("phase 2 timed out")
    });
    spdk.stop();

    println!("== phase 3: restarted, auto-examine on");
    let spdk = Spdk::start(&opts(true)).expect("SPDK starts a third time");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(120), async {
            auto_examine_assembles_by_itself(&pool1, &pool2, &model).await;
        })
        .await
        .expect("phase 3 timed out")
    });
    spdk.stop();
}

async fn nothing_named(name: &str) {
    assert_eq!(raid::raid_info(name).await.unwrap(), None, "raid {name}");
    assert_eq!(bdev::get(name).await.unwrap(), None, "bdev {name}");
}

/// (a) Typed errors, and no raid (not even one configuring) left.
async fn bad_inputs_leave_nothing() {
    let sb = RaidCreateOpts {
        superblock: true,
        uuid: None,
    };
    bdev::create_malloc("tiny", MIB, 512).await.unwrap();
    type Case = (&'static str, Vec<String>, ErrorKind, &'static str);
    let cases: Vec<Case> = vec![
        (
            "raid1 with one base",
            names(&[RA]),
            ErrorKind::InvalidArgument,
            "base_bdevs: raid1 needs 2-255 base bdevs, got 1",
        ),
        (
            "a base twice",
            names(&[RA, RA]),
            ErrorKind::InvalidArgument,
            "is named twice",
        ),
        (
            "unknown base",
            names(&[RA, "nope"]),
            ErrorKind::NotFound,
            "base bdev nope does not exist",
        ),
        (
            "a base too small for a superblock",
            names(&[RA, "tiny"]),
            ErrorKind::InvalidArgument,
            "a raid with a superblock needs more than 1048576",
        ),
    ];
    for (what, bases, kind, text) in cases {
        let e = raid::create_raid_with("bad", RaidLevel::Raid1, &bases, 0, &sb)
            .await
            .unwrap_err();
        println!("{what}: {e}");
        assert_eq!(e.kind(), kind, "{what}: {e}");
        assert!(e.to_string().contains(text), "{what}: {e}");
        nothing_named("bad").await;
    }
    let e = raid::create_raid_with(
        "bad",
        RaidLevel::Raid1,
        &names(&[RA, RB]),
        0,
        &RaidCreateOpts {
            superblock: true,
            uuid: Some(uuid::Uuid::nil()),
        },
    )
    .await
    .unwrap_err();
    assert!(e.to_string().starts_with("uuid:"), "{e}");
    // Assembly: nothing there, no superblock, bad lists.
    let e = raid::assemble_from_superblock("bad", &names(&["nope", "nada"]), true)
        .await
        .unwrap_err();
    println!("assemble from unknown bdevs: {e}");
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let e = raid::assemble_from_superblock("bad", &names(&[RA, RB]), true)
        .await
        .unwrap_err();
    println!("assemble from blank bdevs: {e}");
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("raid superblock of bad"), "{e}");
    let e = raid::assemble_from_superblock("bad", &names(&[RA, RA]), true)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    let e = raid::assemble_from_superblock("bad", &[], true)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    nothing_named("bad").await;
    // Removing a bdev no raid holds, or none at all: nothing to do.
    assert_eq!(raid::remove_raid_base(RA).await.unwrap(), None);
    assert_eq!(raid::remove_raid_base("nope").await.unwrap(), None);
    bdev::delete_malloc("tiny").await.unwrap();
}

/// (b) A raid1 with a superblock and a given UUID over `ra` and `rb`: a cluster smaller than
/// a member, the same superblock on both, written whole.
async fn create_and_write(model: &mut Model) {
    let uuid: uuid::Uuid = RAID_UUID.parse().unwrap();
    let sb = RaidCreateOpts {
        superblock: true,
        uuid: Some(uuid),
    };
    let r = raid::create_raid_with(RAID, RaidLevel::Raid1, &names(&[RA, RB]), 0, &sb)
        .await
        .unwrap();
    assert_eq!(r.size_bytes(), MEMBER - DATA_OFFSET);
    assert_eq!(r.uuid, RAID_UUID);
    // Idempotent; another superblock setting is another shape.
    assert_eq!(
        raid::create_raid_with(RAID, RaidLevel::Raid1, &names(&[RA, RB]), 0, &sb)
            .await
            .unwrap(),
        r
    );
    let e = raid::create_raid(RAID, RaidLevel::Raid1, &names(&[RA, RB]), 0)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("superblock true (asked false)"),
        "{e}"
    );
    let i = info().await;
    println!("raid1 with a superblock: {i:?}");
    assert!(i.superblock && !i.is_degraded());
    assert_eq!(i.uuid, RAID_UUID);
    let seq = i.superblock_seq.expect("a superblock sequence number");
    for b in &i.bases {
        assert_eq!(b.sb_state, Some(SlotState::Configured), "{b:?}");
        assert_eq!(b.data_offset_blocks * 512, DATA_OFFSET, "{b:?}");
        assert!(!b.failed);
    }
    let (a, b) = (
        raid::read_superblock(RA).await.unwrap().unwrap(),
        raid::read_superblock(RB).await.unwrap().unwrap(),
    );
    assert_eq!(a, b, "the same superblock on both members");
    assert_eq!(
        (a.name.as_str(), a.uuid.as_str(), a.seq),
        (RAID, RAID_UUID, seq)
    );
    assert_eq!(a.level, Some(RaidLevel::Raid1));
    assert_eq!(a.num_blocks, i.num_blocks);
    let ra_uuid = bdev::get(RA).await.unwrap().unwrap().uuid;
    assert_eq!(a.slot_of(&ra_uuid).unwrap().slot, 0);
    assert_eq!(a.configured().len(), 2);
    assert_eq!(raid::read_superblock(RC).await.unwrap(), None, "blank");

    let len = model.data.len();
    let mut off = 0;
    while off < len {
        let n = (len - off).min(MIB as usize);
        model.write(1, off as u64, n).await;
        off += n;
    }
    model.check_raid("written whole").await;
}

/// (c) `rb` removed: the raid goes on degraded with `ra`; the superblock moves on on `ra`
/// and marks `rb`'s slot missing, while `rb` keeps the older one. Writes go on.
async fn remove_a_member(model: &mut Model) {
    let before = info().await.superblock_seq.unwrap();
    let after = raid::remove_raid_base(RB)
        .await
        .unwrap()
        .expect("rb was a member");
    println!("degraded: {after:?}");
    assert_eq!(after.state, RaidState::Online);
    assert!(after.is_degraded());
    assert_eq!(after.bases[1].name, None);
    assert!(!after.bases[1].configured);
    assert_eq!(after.bases[1].sb_state, Some(SlotState::Missing));
    let now = after.superblock_seq.unwrap();
    assert!(now > before, "the superblock moved on: {before} -> {now}");
    assert_eq!(raid::read_superblock(RA).await.unwrap().unwrap().seq, now);
    assert_eq!(
        raid::read_superblock(RB).await.unwrap().unwrap().seq,
        before,
        "the removed member keeps the superblock it left with"
    );
    // Idempotent; the last whole member is refused.
    assert_eq!(raid::remove_raid_base(RB).await.unwrap(), None);
    let e = raid::remove_raid_base(RA).await.unwrap_err();
    println!("last member: {e}");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("last whole member"), "{e}");
    assert_eq!(info().await.state, RaidState::Online);
    // I/O goes on, degraded: rb misses these writes.
    model.write(2, 0, 8 * MIB as usize).await;
    model.write(2, 20 * MIB, 3 * MIB as usize).await;
    model.check_raid("degraded").await;
}

/// (e) Deleted (the members keep their superblocks) and assembled from `ra` and `rc`: both
/// current, online, whole, the same data.
async fn both_current_assemble_online(model: &Model) {
    let seq = info().await.superblock_seq.unwrap();
    raid::delete_raid(RAID).await.unwrap();
    nothing_named(RAID).await;
    let a = raid::assemble_from_superblock(RAID, &names(&[RC, RA]), false)
        .await
        .unwrap();
    println!("assembled: {a:?}");
    assert_eq!(a.raid.state, RaidState::Online);
    assert!(!a.raid.is_degraded());
    assert!(a.not_current.is_empty() && a.absent.is_empty(), "{a:?}");
    assert_eq!(a.seq_found, seq);
    assert_eq!(a.raid.uuid, RAID_UUID);
    assert!(holds(&a.raid, RA).await && holds(&a.raid, RC).await);
    assert!(
        a.raid.superblock_seq.unwrap() > seq,
        "SPDK writes it at the start"
    );
    model.check_raid("assembled again").await;
    // Idempotent.
    let again = raid::assemble_from_superblock(RAID, &names(&[RA, RC]), false)
        .await
        .unwrap();
    assert_eq!(again.raid.uuid, a.raid.uuid);
    assert_eq!(again.raid.state, RaidState::Online);
}

/// (f) Assembled from all three: `rb` (which missed the writes of (c)) is reported not
/// current and left alone, also given first; an unknown name is absent. Then `rb` is put
/// back in place of `rc` and rebuilt: it holds the current data afterwards.
async fn stale_member_not_used_then_rebuilt(model: &mut Model) {
    raid::delete_raid(RAID).await.unwrap();
    let a = raid::assemble_from_superblock(RAID, &names(&[RB, RA, RC, "lvs1/nope"]), false)
        .await
        .unwrap();
    println!("assembled with a stale member: {a:?}");
    assert_eq!(a.not_current, [RB]);
    assert_eq!(a.absent, ["lvs1/nope"]);
    assert_eq!(a.raid.state, RaidState::Online);
    assert!(!a.raid.is_degraded());
    assert!(!holds(&a.raid, RB).await, "the stale member is not used");
    model.check_raid("assembled beside a stale member").await;
    // rb is still free and still stale; nothing wrote to it.
    let rb = raid::read_superblock(RB).await.unwrap().unwrap();
    assert!(rb.seq < a.seq_found, "{} < {}", rb.seq, a.seq_found);
    // Swap rc for rb: rb is rebuilt from ra (a former member goes back to its slot).
    raid::remove_raid_base(RC).await.unwrap().unwrap();
    model.write(3, 10 * MIB, MIB as usize).await;
    let i = rebuild_onto(RB).await;
    members_equal(&i, RA, RB, model).await;
    model.check_raid("rb rebuilt").await;
    let (sa, sb) = (
        raid::read_superblock(RA).await.unwrap().unwrap(),
        raid::read_superblock(RB).await.unwrap().unwrap(),
    );
    assert_eq!(sa, sb, "rb current again");
    assert_eq!(Some(sa.seq), i.superblock_seq);
}

/// Phase 2: after a restart with auto-examine off, the lvstores load only when examined and
/// no raid is assembled behind the caller's back. With `lvs2` (rb) not loaded, rb is absent:
/// the raid waits (configuring), then starts degraded with `ra` (rb's slot marked missing);
/// rb, loaded afterwards, is not current (it missed that start) and is rebuilt.
async fn after_restart_absent_member_then_degraded(
    pool1: &Path,
    pool2: &Path,
    seq: u64,
    model: &mut Model,
) {
    bdev::create_aio("pool1", pool1, 512).await.unwrap();
    bdev::create_aio("pool2", pool2, 512).await.unwrap();
    bdev::wait_for_examine().await.unwrap();
    assert_eq!(bdev::get(RA).await.unwrap(), None, "not examined: no lvols");
    bdev::examine("pool1").await.unwrap();
    bdev::examine("pool1").await.unwrap();
    assert!(bdev::get(RA).await.unwrap().is_some(), "lvs1 loaded");
    assert_eq!(bdev::get(RB).await.unwrap(), None, "lvs2 not loaded");
    assert_eq!(
        raid::raid_info(RAID).await.unwrap(),
        None,
        "no raid assembled behind the caller's back"
    );

    println!("(g) a current member absent: the raid waits, configuring");
    let members = names(&[RA, RB, RC]);
    let e = raid::assemble_from_superblock_with(
        RAID,
        &members,
        &AssembleOpts {
            start_degraded: true,
            min_seq: Some(seq + 1),
        },
    )
    .await
    .unwrap_err();
    println!("min_seq above what is present: {e}");
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    nothing_named(RAID).await;
    let a = raid::assemble_from_superblock_with(
        RAID,
        &members,
        &AssembleOpts {
            start_degraded: false,
            min_seq: Some(seq),
        },
    )
    .await
    .unwrap();
    println!("waiting: {a:?}");
    assert_eq!(a.raid.state, RaidState::Configuring);
    assert_eq!(a.absent, [RB]);
    assert_eq!(a.not_current, [RC]);
    assert_eq!(a.seq_found, seq);
    assert_eq!(
        bdev::get(RAID).await.unwrap(),
        None,
        "no bdev while configuring"
    );

    println!("(h) started degraded with the members it has");
    let a = raid::assemble_from_superblock(RAID, &members, true)
        .await
        .unwrap();
    println!("degraded start: {a:?}");
    assert_eq!(a.raid.state, RaidState::Online);
    assert!(a.raid.is_degraded());
    assert!(holds(&a.raid, RA).await);
    let missing = a.raid.bases.iter().find(|b| !b.configured).unwrap();
    assert_eq!(missing.sb_state, Some(SlotState::Missing));
    model.check_raid("started degraded").await;
    model.write(4, 5 * MIB, 2 * MIB as usize).await;

    println!("(i) the absent member comes back: not current, rebuilt");
    bdev::examine("pool2").await.unwrap();
    assert!(bdev::get(RB).await.unwrap().is_some(), "lvs2 loaded");
    let again = raid::assemble_from_superblock(RAID, &members, true)
        .await
        .unwrap();
    assert_eq!(again.not_current, [RB, RC], "rb missed the degraded start");
    assert!(again.absent.is_empty());
    assert!(!holds(&again.raid, RB).await);
    let i = rebuild_onto(RB).await;
    members_equal(&i, RA, RB, model).await;
    model.check_raid("rb rebuilt after the restart").await;
}

/// Phase 3: with auto-examine on, SPDK's raid module assembles the raid by itself as the
/// members appear (what auto-examine off prevents); assembling it is then idempotent.
async fn auto_examine_assembles_by_itself(pool1: &Path, pool2: &Path, model: &Model) {
    bdev::create_aio("pool1", pool1, 512).await.unwrap();
    bdev::create_aio("pool2", pool2, 512).await.unwrap();
    bdev::wait_for_examine().await.unwrap();
    let i = eventually(
        "the raid assembled by SPDK",
        Duration::from_secs(10),
        || async {
            raid::raid_info(RAID)
                .await
                .unwrap()
                .filter(|i| i.state == RaidState::Online)
        },
    )
    .await;
    println!("assembled by auto-examine: {i:?}");
    assert!(holds(&i, RA).await && holds(&i, RB).await);
    model.check_raid("auto-assembled").await;
    let a = raid::assemble_from_superblock(RAID, &names(&[RA, RB, RC]), false)
        .await
        .unwrap();
    assert_eq!(a.not_current, [RC]);
    assert_eq!(a.raid.uuid, RAID_UUID);
    raid::delete_raid(RAID).await.unwrap();
}
