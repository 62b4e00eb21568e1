//! Raid bdevs of SPDK's raid module:
//!
//! - [`RaidLevel::Concat`] chains its members one after another (each cut down to a whole
//!   number of strips) and [`RaidLevel::Raid0`] stripes over them (each cut down to the
//!   smallest, in whole strips): the two shapes of a multi-disk volume, whose members are
//!   volumes of other nodes attached over NVMe/TCP, or local disks for a pool. No superblock:
//!   the layout lives in the caller's records, not on the members;
//! - [`RaidLevel::Raid1`] mirrors its members: for replicated volumes, with a superblock
//!   ([`RaidCreateOpts::superblock`]). It stays online with one member left (degraded, after
//!   [`remove_raid_base`] or a member's I/O error); [`add_raid_base`] puts a new member in the
//!   empty slot and SPDK rebuilds the data onto it, which [`RaidInfo::process`] follows
//!   ([`set_rebuild_limit`] caps its bandwidth, with polling reactors). With a superblock the raid is assembled
//!   again from its members ([`assemble_from_superblock`]) after a restart or on another
//!   node, and a member that missed writes is told apart by its superblock's sequence number
//!   and never read as current (see `docs/replicas-spdk.md`).
//!
//! Raid5f, which SPDK also has, is not offered. A raid bdev whose members are not all present
//! is "configuring" inside SPDK and is no bdev yet: [`create_raid`] never leaves one behind,
//! and [`delete_raid`] removes one too.
//!
//! Superblocks and assembly are in `raid/superblock.rs`; the unit tests of the checks here
//! (no SPDK needed) in `raid/tests.rs`.

use std::fmt;

mod superblock;

use superblock::wipe_superblock;
pub use superblock::{
    AssembleOpts, Assembly, Superblock, SuperblockBase, assemble_from_superblock,
    assemble_from_superblock_with, read_superblock,
};

use super::bdev::{BdevInfo, bdev_by_name, check_name, info_by_name};
use super::error::{Result, SpdkError, libc_errno};
use super::runtime::{Reactor, cstr, errno_cb, errno_ctx, exec_on, from_c_array, on_reactor_with};

/// Most base bdevs of one raid bdev (SPDK counts them in a `u8`).
pub const MAX_BASE_BDEVS: usize = 255;
/// Fewest base bdevs of a raid bdev (of any level here).
pub const MIN_BASE_BDEVS: usize = 2;
/// Smallest strip of a concat or raid0 bdev, in KiB.
pub const MIN_STRIP_KB: u32 = 4;
/// Largest strip of a concat or raid0 bdev, in KiB (1 GiB; SPDK turns it into bytes in a
/// `u32`).
pub const MAX_STRIP_KB: u32 = 1 << 20;
/// Product name SPDK gives raid bdevs.
pub const PRODUCT: &str = "Raid Volume";

/// Longest base bdev name the shim reports back (its `LITEIO_NAME_MAX` with the NUL).
const MAX_BASE_NAME: usize = spdk_sys::LITEIO_NAME_MAX as usize - 1;

/// Level of a raid bdev.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RaidLevel {
    /// Members one after another; strip size only rounds each member down.
    Concat,
    /// Striped over the members.
    Raid0,
    /// Mirrored on every member; no strip size.
    Raid1,
}

impl RaidLevel {
    /// SPDK's name of the level (`concat`, `raid0`, `raid1`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Concat => "concat",
            Self::Raid0 => "raid0",
            Self::Raid1 => "raid1",
        }
    }

    fn to_spdk(self) -> spdk_sys::spdk_bdev_raid_level {
        match self {
            Self::Concat => spdk_sys::SPDK_BDEV_RAID_LEVEL_CONCAT,
            Self::Raid0 => spdk_sys::SPDK_BDEV_RAID_LEVEL_RAID0,
            Self::Raid1 => spdk_sys::SPDK_BDEV_RAID_LEVEL_RAID1,
        }
    }

    fn from_spdk(level: i32) -> Option<Self> {
        [Self::Concat, Self::Raid0, Self::Raid1]
            .into_iter()
            .find(|l| l.to_spdk() == level)
    }

    /// Whether the level takes a strip size (concat and raid0) or none (raid1).
    pub fn has_strip(self) -> bool {
        self != Self::Raid1
    }
}

impl fmt::Display for RaidLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// State of a raid bdev in SPDK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RaidState {
    /// Registered as a bdev and serving I/O (possibly degraded: see [`RaidInfo::is_degraded`]).
    Online,
    /// Waiting for base bdevs; not a bdev yet.
    Configuring,
    /// Too few base bdevs left to serve I/O; being torn down.
    Offline,
}

impl RaidState {
    fn from_spdk(state: u32) -> Option<Self> {
        match state {
            spdk_sys::SPDK_BDEV_RAID_STATE_ONLINE => Some(Self::Online),
            spdk_sys::SPDK_BDEV_RAID_STATE_CONFIGURING => Some(Self::Configuring),
            spdk_sys::SPDK_BDEV_RAID_STATE_OFFLINE => Some(Self::Offline),
            _ => None,
        }
    }

    /// SPDK's name of the state (`online`, `configuring`, `offline`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Online => "online",
            Self::Configuring => "configuring",
            Self::Offline => "offline",
        }
    }
}

impl fmt::Display for RaidState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One base bdev slot of a raid bdev.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaidBase {
    /// Name of the base bdev as the raid was given it; `None` for a missing slot (never
    /// found, or removed: SPDK forgets the name of a removed member).
    pub name: Option<String>,
    /// UUID of the base bdev; empty when none was seen in this slot.
    pub uuid: String,
    /// The base bdev is open and part of the array (a member being rebuilt counts as
    /// configured: see `rebuilding`).
    pub configured: bool,
    /// The base bdev is being rebuilt, from the moment it was added until its rebuild ends:
    /// its data is not whole yet.
    pub rebuilding: bool,
    /// The raid failed this member (an I/O error on it, or its superblock slot says so): it
    /// is being removed, or was and the slot waits for a new member.
    pub failed: bool,
    /// The slot's state in the raid's superblock; `None` without a superblock.
    pub sb_state: Option<SlotState>,
    /// Blocks of the base bdev before the raid's data (0 without a superblock).
    pub data_offset_blocks: u64,
    /// Blocks of the base bdev the raid uses (rounded down as the level does; 0 until
    /// configured).
    pub data_size_blocks: u64,
}

/// State of a member slot in a raid superblock (SPDK's `raid_bdev_sb_base_bdev_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SlotState {
    /// A member of the array whose data is current.
    Configured,
    /// No member (removed, never added, or a member the raid was started without).
    Missing,
    /// The member failed (an I/O error) and was taken out.
    Failed,
    /// A spare (SPDK writes none today).
    Spare,
}

impl SlotState {
    pub(crate) fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            spdk_sys::LITEIO_RAID_SB_CONFIGURED => Some(Self::Configured),
            spdk_sys::LITEIO_RAID_SB_MISSING => Some(Self::Missing),
            spdk_sys::LITEIO_RAID_SB_FAILED => Some(Self::Failed),
            spdk_sys::LITEIO_RAID_SB_SPARE => Some(Self::Spare),
            _ => None,
        }
    }

    /// SPDK's word for the state.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Configured => "configured",
            Self::Missing => "missing",
            Self::Failed => "failed",
            Self::Spare => "spare",
        }
    }
}

impl fmt::Display for SlotState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The background process of a raid bdev (SPDK has one kind: a raid1 rebuild).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaidProcess {
    /// SPDK's name of the process (`rebuild`).
    pub kind: String,
    /// The base bdev it writes.
    pub target: String,
    /// Blocks of the raid bdev done.
    pub blocks_done: u64,
    /// Blocks of the raid bdev in all (its size).
    pub blocks_total: u64,
    /// Percentage done, as SPDK rounds it.
    pub percent: u32,
}

/// What SPDK knows about a raid bdev.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaidInfo {
    /// Name.
    pub name: String,
    /// UUID (generated by SPDK; empty until it has one).
    pub uuid: String,
    /// Level.
    pub level: RaidLevel,
    /// State.
    pub state: RaidState,
    /// Strip size in KiB (0 for raid1).
    pub strip_kb: u32,
    /// Block size in bytes (0 while configuring).
    pub block_size: u32,
    /// Number of blocks (0 while configuring).
    pub num_blocks: u64,
    /// Base bdev slots, in order.
    pub bases: Vec<RaidBase>,
    /// Base bdevs present and configured.
    pub num_base_bdevs_discovered: u8,
    /// Base bdevs SPDK counts on: all of them, less the ones removed from a raid1.
    pub num_base_bdevs_operational: u8,
    /// Fewest operational base bdevs the level serves I/O with (raid1: 1; others: all).
    pub min_base_bdevs_operational: u8,
    /// The raid writes a superblock on its members ([`RaidCreateOpts::superblock`], or
    /// assembled from one).
    pub superblock: bool,
    /// The superblock's sequence number, which SPDK increments on every superblock update
    /// (the raid's start, a member removed or failed, a rebuild done); `None` without a
    /// superblock (or before the first one is written). A member whose superblock has a
    /// lower number missed an update and is not current.
    pub superblock_seq: Option<u64>,
    /// A delete was started.
    pub deleting: bool,
    /// The background process, while one runs (SPDK starts it a moment after the member is
    /// added, on a thread of its own).
    pub process: Option<RaidProcess>,
}

impl RaidInfo {
    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.num_blocks.saturating_mul(u64::from(self.block_size))
    }

    /// Online, but short of whole members: a raid1 that lost a member, until a new member's
    /// rebuild is done.
    pub fn is_degraded(&self) -> bool {
        self.state == RaidState::Online && self.bases.iter().any(|b| !b.configured || b.rebuilding)
    }

    /// Names of the slots that are missing or not configured (a name is unknown for a
    /// removed member: those are left out).
    fn unconfigured(&self) -> Vec<String> {
        self.bases
            .iter()
            .filter(|b| !b.configured)
            .filter_map(|b| b.name.clone())
            .collect()
    }
}

/// Base bdev names: 1-127 characters without NUL (slashes allowed: an lvol's alias names it
/// too), none twice.
fn check_bases(level: RaidLevel, bases: &[String]) -> Result<()> {
    if !(MIN_BASE_BDEVS..=MAX_BASE_BDEVS).contains(&bases.len()) {
        return Err(SpdkError::InvalidArgument {
            field: "base_bdevs",
            reason: format!(
                "{level} needs {MIN_BASE_BDEVS}-{MAX_BASE_BDEVS} base bdevs, got {}",
                bases.len()
            ),
        });
    }
    for (i, b) in bases.iter().enumerate() {
        check_base_name("base_bdevs", b)?;
        if bases[..i].contains(b) {
            return Err(SpdkError::InvalidArgument {
                field: "base_bdevs",
                reason: format!("{b} is named twice"),
            });
        }
    }
    Ok(())
}

fn check_base_name(field: &'static str, b: &str) -> Result<()> {
    if b.is_empty() || b.len() > MAX_BASE_NAME || b.contains('\0') {
        return Err(SpdkError::InvalidArgument {
            field,
            reason: format!("{b:?} must be 1-{MAX_BASE_NAME} characters without NUL"),
        });
    }
    Ok(())
}

fn check_strip(level: RaidLevel, strip_kb: u32) -> Result<()> {
    let bad = |reason: String| {
        Err(SpdkError::InvalidArgument {
            field: "strip_size_kb",
            reason,
        })
    };
    if !level.has_strip() {
        if strip_kb != 0 {
            return bad(format!("{level} takes no strip size, got {strip_kb} KiB"));
        }
        return Ok(());
    }
    if !strip_kb.is_power_of_two() || !(MIN_STRIP_KB..=MAX_STRIP_KB).contains(&strip_kb) {
        return bad(format!(
            "{strip_kb} KiB is not a power of two from {MIN_STRIP_KB} KiB to {MAX_STRIP_KB} KiB"
        ));
    }
    Ok(())
}

/// How an existing raid differs from the one asked for, naming the field; `None` when it is
/// the same. A missing slot (a removed member) matches any name.
fn differs(
    have: &RaidInfo,
    level: RaidLevel,
    bases: &[String],
    strip_kb: u32,
    opts: &RaidCreateOpts,
) -> Option<String> {
    if have.level != level {
        return Some(format!("with raid_level {} (asked {level})", have.level));
    }
    if have.superblock != opts.superblock {
        return Some(format!(
            "with superblock {} (asked {})",
            have.superblock, opts.superblock
        ));
    }
    if let Some(u) = opts.uuid
        && have.uuid != u.to_string()
    {
        return Some(format!("with uuid {} (asked {u})", have.uuid));
    }
    if level.has_strip() && have.strip_kb != strip_kb {
        return Some(format!(
            "with strip_size_kb {} (asked {strip_kb})",
            have.strip_kb
        ));
    }
    let same = have.bases.len() == bases.len()
        && have
            .bases
            .iter()
            .zip(bases)
            .all(|(h, b)| h.name.as_ref().is_none_or(|n| n == b));
    if !same {
        let names: Vec<&str> = have
            .bases
            .iter()
            .map(|b| b.name.as_deref().unwrap_or("(missing)"))
            .collect();
        return Some(format!(
            "with base_bdevs [{}] (asked [{}])",
            names.join(", "),
            bases.join(", ")
        ));
    }
    None
}

/// The raid `name` as SPDK has it now, or `None`.
fn info_now(_r: &Reactor, name: &str) -> Result<Option<RaidInfo>> {
    let c = cstr("name", name)?;
    let mut info = spdk_sys::liteio_raid_info::default();
    let mut bases = vec![spdk_sys::liteio_raid_base::default(); MAX_BASE_BDEVS];
    // SAFETY: on the app thread (the `Reactor` token; raid bdevs are read there); `info` and
    // the `MAX_BASE_BDEVS` entries of `bases` are writable for the call, `c` outlives it.
    let n = unsafe {
        spdk_sys::liteio_raid_get_info(
            c.as_ptr(),
            &mut info,
            bases.as_mut_ptr(),
            MAX_BASE_BDEVS as i32,
        )
    };
    if n == -libc_errno::ENODEV {
        return Ok(None);
    }
    if n < 0 {
        return Err(SpdkError::errno("read raid bdev", name, n));
    }
    bases.truncate(usize::try_from(n).unwrap_or(0).min(MAX_BASE_BDEVS));
    let level = RaidLevel::from_spdk(info.level).ok_or_else(|| SpdkError::InvalidArgument {
        field: "raid_level",
        reason: format!(
            "raid bdev {name} has SPDK raid level {}, which is not concat, raid0 or raid1",
            info.level
        ),
    })?;
    let state = RaidState::from_spdk(info.state).ok_or_else(|| SpdkError::InvalidArgument {
        field: "state",
        reason: format!(
            "raid bdev {name} has unknown SPDK raid state {}",
            info.state
        ),
    })?;
    let process_kind = from_c_array(&info.process_type);
    Ok(Some(RaidInfo {
        name: from_c_array(&info.name),
        uuid: from_c_array(&info.uuid),
        level,
        state,
        strip_kb: info.strip_size_kb,
        block_size: info.block_size,
        num_blocks: info.num_blocks,
        bases: bases
            .iter()
            .map(|b| {
                let name = from_c_array(&b.name);
                RaidBase {
                    name: (!name.is_empty()).then_some(name),
                    uuid: from_c_array(&b.uuid),
                    configured: b.configured,
                    rebuilding: b.process_target,
                    failed: b.failed,
                    sb_state: SlotState::from_raw(b.sb_state),
                    data_offset_blocks: b.data_offset,
                    data_size_blocks: b.data_size,
                }
            })
            .collect(),
        num_base_bdevs_discovered: info.num_base_bdevs_discovered,
        num_base_bdevs_operational: info.num_base_bdevs_operational,
        min_base_bdevs_operational: info.min_base_bdevs_operational,
        superblock: info.superblock,
        superblock_seq: (info.superblock && info.sb_seq > 0).then_some(info.sb_seq),
        deleting: info.destroying,
        process: (!process_kind.is_empty()).then(|| RaidProcess {
            kind: process_kind,
            target: from_c_array(&info.process_target),
            blocks_done: info.process_blocks,
            blocks_total: info.num_blocks,
            percent: info.process_percent,
        }),
    }))
}

/// The bases can make a raid now: each exists, is claimed by no module, and all have one
/// block size that fits in the strip.
fn check_bases_now(
    r: &Reactor,
    op: &'static str,
    raid: &str,
    bases: &[String],
    strip_kb: u32,
) -> Result<()> {
    let mut first: Option<(String, u32)> = None;
    for b in bases {
        let bdev = bdev_by_name(r, b).map_err(|_| SpdkError::NotFound {
            kind: "base bdev",
            name: b.clone(),
        })?;
        let mut module = [0 as std::ffi::c_char; 64];
        // SAFETY: on the reactor; `bdev` was just looked up there and is live for the call;
        // `module` is writable for its length.
        let claimed =
            unsafe { spdk_sys::liteio_bdev_claimed_by(bdev, module.as_mut_ptr(), module.len()) };
        if claimed {
            return Err(SpdkError::errno(
                op,
                format!(
                    "{raid}: base bdev {b} is claimed by the {} module",
                    from_c_array(&module)
                ),
                -libc_errno::EBUSY,
            ));
        }
        // SAFETY: as above; a pure getter.
        let bs = unsafe { spdk_sys::spdk_bdev_get_block_size(bdev) };
        match &first {
            None => first = Some((b.clone(), bs)),
            Some((f, fbs)) if *fbs != bs => {
                return Err(SpdkError::InvalidArgument {
                    field: "base_bdevs",
                    reason: format!("{f} has {fbs}-byte blocks but {b} has {bs}-byte blocks"),
                });
            }
            Some(_) => {}
        }
        if strip_kb != 0 && u64::from(strip_kb) * 1024 < u64::from(bs) {
            return Err(SpdkError::InvalidArgument {
                field: "strip_size_kb",
                reason: format!("{strip_kb} KiB is smaller than the {bs}-byte blocks of {b}"),
            });
        }
    }
    Ok(())
}

/// The error for an existing raid of the requested shape that is not online.
fn not_online(info: &RaidInfo) -> SpdkError {
    if info.deleting {
        return SpdkError::errno(
            "create raid bdev",
            format!("{} (being deleted)", info.name),
            -libc_errno::EBUSY,
        );
    }
    SpdkError::errno(
        "create raid bdev",
        format!(
            "{} ({}, base bdevs missing: [{}])",
            info.name,
            info.state,
            info.unconfigured().join(", ")
        ),
        -libc_errno::ENODEV,
    )
}

/// Bytes at the start of each member that a raid with a superblock keeps for it at least
/// (SPDK's `RAID_BDEV_MIN_DATA_OFFSET_SIZE`): its data starts after them, rounded up to the
/// member's optimal I/O boundary (an lvol's cluster), as [`RaidBase::data_offset_blocks`]
/// says.
pub const SUPERBLOCK_RESERVED_BYTES: u64 = 1 << 20;

/// How a raid is made beyond its level, members and strip size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RaidCreateOpts {
    /// Keep the raid's layout in a superblock at the start of every member (its data starts
    /// [`SUPERBLOCK_RESERVED_BYTES`] in, or at the member's next optimal I/O boundary: an
    /// lvol's next cluster; the raid is that much smaller than a member): the
    /// raid can then be assembled again from its members
    /// ([`assemble_from_superblock`]), and a member that missed writes is known by its
    /// superblock's lower sequence number. For replicated volumes (raid1).
    pub superblock: bool,
    /// The raid's UUID (its bdev's UUID and, with a superblock, the identity its members
    /// carry); `None`: SPDK makes one.
    pub uuid: Option<uuid::Uuid>,
}

/// Create a raid bdev `name` of `level` over `bases` (in that order), with a strip size in
/// KiB: a power of two from 4 KiB to 1 GiB for concat and raid0 (and at least the block
/// size), 0 for raid1. No superblock: [`create_raid_with`] with the default options.
/// Returns the raid bdev.
///
/// Idempotent: a raid of that name with the same level, bases and strip size is taken as it
/// is (a raid1 slot whose member was removed matches any name); another shape is
/// [`SpdkError::AlreadyExists`] naming the field that differs (`raid_level`,
/// `strip_size_kb`, `base_bdevs`), and so is another kind of bdev of that name.
///
/// Errors: [`SpdkError::InvalidArgument`] for 1 or more than 255 bases, a base named twice, a
/// bad strip size, bases of different block sizes; [`SpdkError::NotFound`] (kind `base bdev`)
/// for a base that does not exist; `EBUSY` for a base another module claimed (an lvstore,
/// another raid). A failed create leaves no raid behind, also none configuring in SPDK.
pub async fn create_raid(
    name: &str,
    level: RaidLevel,
    bases: &[String],
    strip_kb: u32,
) -> Result<BdevInfo> {
    create_raid_with(name, level, bases, strip_kb, &RaidCreateOpts::default()).await
}

/// Create a raid0 bdev over `bases` with a strip size in KiB: [`create_raid`] with
/// [`RaidLevel::Raid0`] (the older entry point, once `bdev::create_raid0`).
pub async fn create_raid0(name: &str, bases: &[String], strip_kb: u32) -> Result<BdevInfo> {
    create_raid(name, RaidLevel::Raid0, bases, strip_kb).await
}

/// [`create_raid`] with options: a superblock on the members, the raid's UUID. A raid1 with a
/// superblock is the shape of a replicated volume: SPDK writes the superblock on every
/// member before the raid comes online, and again (with a higher sequence number) whenever a
/// member goes or a rebuild ends.
///
/// Idempotent as [`create_raid`]; the superblock setting and a UUID asked for are compared
/// too (`superblock`, `uuid`).
///
/// Errors beyond [`create_raid`]'s: with a superblock, a base of at most
/// [`SUPERBLOCK_RESERVED_BYTES`] is `base_bdevs` [`SpdkError::InvalidArgument`]; a base that
/// holds the superblock of another raid is `EEXIST` (SPDK refuses to take it: wipe it first,
/// or assemble that raid); a nil UUID is `uuid` [`SpdkError::InvalidArgument`].
pub async fn create_raid_with(
    name: &str,
    level: RaidLevel,
    bases: &[String],
    strip_kb: u32,
    opts: &RaidCreateOpts,
) -> Result<BdevInfo> {
    check_name("name", name)?;
    check_bases(level, bases)?;
    check_strip(level, strip_kb)?;
    if opts.uuid.is_some_and(|u| u.is_nil()) {
        return Err(SpdkError::InvalidArgument {
            field: "uuid",
            reason: "the nil UUID names no raid".into(),
        });
    }
    let (name, bases, opts) = (name.to_string(), bases.to_vec(), *opts);
    exec_on(move |r, reply| {
        let existing = match info_now(r, &name) {
            Ok(i) => i,
            Err(e) => return reply.send(Err(e)),
        };
        if let Some(have) = existing {
            if let Some(detail) = differs(&have, level, &bases, strip_kb, &opts) {
                return reply.send(Err(SpdkError::AlreadyExists {
                    kind: "raid bdev",
                    name,
                    detail,
                }));
            }
            if have.state != RaidState::Online || have.deleting {
                return reply.send(Err(not_online(&have)));
            }
            return reply.send(info_by_name(r, &name));
        }
        if let Ok(other) = info_by_name(r, &name) {
            return reply.send(Err(SpdkError::AlreadyExists {
                kind: "bdev",
                name,
                detail: format!(
                    "as a {} of {} bytes, not a raid bdev",
                    other.product,
                    other.size_bytes()
                ),
            }));
        }
        if let Err(e) = check_bases_now(r, "create raid bdev", &name, &bases, strip_kb) {
            return reply.send(Err(e));
        }
        if opts.superblock {
            for b in &bases {
                match info_by_name(r, b) {
                    Ok(i) if i.size_bytes() <= SUPERBLOCK_RESERVED_BYTES => {
                        return reply.send(Err(SpdkError::InvalidArgument {
                            field: "base_bdevs",
                            reason: format!(
                                "{b} has {} bytes; a raid with a superblock needs more than {SUPERBLOCK_RESERVED_BYTES}",
                                i.size_bytes()
                            ),
                        }));
                    }
                    Ok(_) => {}
                    Err(e) => return reply.send(Err(e)),
                }
            }
        }
        let names: Result<Vec<_>> = bases.iter().map(|b| cstr("base_bdevs", b)).collect();
        let (c, names) = match (cstr("name", &name), names) {
            (Ok(c), Ok(n)) => (c, n),
            (Err(e), _) | (_, Err(e)) => return reply.send(Err(e)),
        };
        let ptrs: Vec<*const std::ffi::c_char> = names.iter().map(|n| n.as_ptr()).collect();
        let uuid = opts.uuid.map(|u| spdk_sys::spdk_uuid {
            u: spdk_sys::spdk_uuid__bindgen_ty_1 { raw: *u.as_bytes() },
        });
        let n2 = name.clone();
        let ctx = errno_ctx(move |r, rc| {
            if rc == -libc_errno::EEXIST {
                // SPDK removed the half-made raid before calling back.
                return reply.send(Err(SpdkError::errno(
                    "create raid bdev",
                    format!("{n2} (a base bdev holds the superblock of another raid)"),
                    rc,
                )));
            }
            if rc != 0 {
                return reply.send(Err(SpdkError::errno("create raid bdev", n2, rc)));
            }
            match info_now(r, &n2) {
                Ok(Some(i)) if i.state == RaidState::Online => reply.send(info_by_name(r, &n2)),
                Ok(Some(i)) => {
                    // A base went away between the check and the claim: the raid waits for
                    // it, configuring. Remove it, then answer.
                    let err = not_online(&i);
                    remove_then(r, &n2, move |_r, _rc| reply.send(Err(err)));
                }
                Ok(None) => reply.send(Err(SpdkError::NotFound {
                    kind: "raid bdev",
                    name: n2,
                })),
                Err(e) => reply.send(Err(e)),
            }
        });
        // SAFETY: on the app thread; the raid module copies the name, the base names and the
        // UUID before it returns (`c`, `names`, `ptrs` and `uuid` outlive the call); `ctx` is
        // owned by SPDK when the call returns 0.
        let rc = unsafe {
            spdk_sys::liteio_raid_create(
                c.as_ptr(),
                strip_kb,
                level.to_spdk(),
                // At most MAX_BASE_BDEVS (255): checked by `check_bases`.
                ptrs.len() as u8,
                ptrs.as_ptr(),
                opts.superblock,
                uuid.as_ref().map_or(std::ptr::null(), |u| u as *const _),
                Some(errno_cb),
                ctx,
            )
        };
        if rc != 0 {
            // SAFETY: SPDK refused the call and never took `ctx`: it is answered here, once.
            unsafe { errno_cb(ctx, rc) };
        }
    })
    .await
}

/// Start deleting the raid `name` (online or configuring) and run `then` with the outcome:
/// 0 also when there is none.
fn remove_then(_r: &Reactor, name: &str, then: impl FnOnce(&Reactor, i32) + 'static) {
    let ctx = errno_ctx(then);
    let rc = match cstr("name", name) {
        // SAFETY: on the app thread; `c` outlives the call; `ctx` is owned by SPDK when the
        // call returns 0.
        Ok(c) => unsafe { spdk_sys::liteio_raid_delete(c.as_ptr(), Some(errno_cb), ctx) },
        Err(_) => -libc_errno::EINVAL,
    };
    if rc != 0 {
        // SAFETY: SPDK never took `ctx`: it is answered here, once.
        unsafe { errno_cb(ctx, if rc == -libc_errno::ENODEV { 0 } else { rc }) };
    }
}

/// What SPDK knows about the raid bdev `name`, also while configuring; `None` when there is
/// none. Read on SPDK's app thread.
pub async fn raid_info(name: &str) -> Result<Option<RaidInfo>> {
    let name = name.to_string();
    on_reactor_with(move |r| info_now(r, &name)).await
}

/// Delete the raid bdev `name`, also one still configuring; missing = success. The members
/// are released and keep their data. `EALREADY` when a delete is under way.
pub async fn delete_raid(name: &str) -> Result<()> {
    let name = name.to_string();
    exec_on(move |r, reply| {
        let n = name.clone();
        remove_then(r, &name, move |_r, rc| {
            reply.send(if rc == 0 || rc == -libc_errno::ENODEV {
                Ok(())
            } else {
                Err(SpdkError::errno("delete raid bdev", n, rc))
            })
        });
    })
    .await
}

/// Whether [`add_raid_base`] has anything to do.
enum Added {
    /// `base` is a member already: the raid as it is.
    Already(RaidInfo),
    /// `base` can be added to the raid as it is now.
    Not(RaidInfo),
}

/// The checks of [`add_raid_base`], on the reactor.
fn add_checks(r: &Reactor, name: &str, base: &str) -> Result<Added> {
    let have = info_now(r, name)?.ok_or_else(|| SpdkError::NotFound {
        kind: "raid bdev",
        name: name.into(),
    })?;
    // The raid names a member as it was given (an lvol's alias) or, found by its superblock,
    // by the bdev's own name.
    let own = info_by_name(r, base).ok().map(|i| i.name);
    if have
        .bases
        .iter()
        .any(|b| b.name.as_deref() == Some(base) || (own.is_some() && b.name == own))
    {
        return Ok(Added::Already(have));
    }
    if have.state != RaidState::Online || have.deleting {
        return Err(not_online(&have));
    }
    if let Some(p) = &have.process {
        return Err(SpdkError::errno(
            "add raid base bdev",
            format!("{base} to {name} ({} onto {} under way)", p.kind, p.target),
            -libc_errno::EBUSY,
        ));
    }
    if !have.bases.iter().any(|b| b.name.is_none() && !b.configured) {
        return Err(SpdkError::InvalidArgument {
            field: "base_bdev",
            reason: format!("{} {name} has no empty slot for {base}", have.level),
        });
    }
    check_bases_now(r, "add raid base bdev", name, &[base.to_string()], 0)?;
    // The new member's data starts where the others' does (past the superblock, if any) and
    // is as long.
    let need = have
        .bases
        .iter()
        .filter(|b| b.configured)
        .map(|b| b.data_offset_blocks.saturating_add(b.data_size_blocks))
        .max()
        .unwrap_or(0);
    let b = info_by_name(r, base)?;
    let reason = if b.block_size != have.block_size {
        format!(
            "{base} has {}-byte blocks, {name} {}-byte blocks",
            b.block_size, have.block_size
        )
    } else if b.num_blocks < need {
        format!("{base} has {} blocks, {name} needs {need}", b.num_blocks)
    } else {
        return Ok(Added::Not(have));
    };
    Err(SpdkError::InvalidArgument {
        field: "base_bdev",
        reason,
    })
}

/// Add the bdev `base` to the empty slot of the raid bdev `name`: a raid1 that lost a member
/// takes a new one and SPDK rebuilds the data onto it, which [`RaidInfo::process`] follows
/// (the member is [`RaidBase::rebuilding`] until the rebuild is done). Returns the raid as it
/// is once the member is in; the rebuild starts a moment later. Idempotent: a base already in
/// a slot is taken as it is.
///
/// With a superblock, SPDK reads the new member's first: a blank one (or one with no valid
/// superblock) is rebuilt; a former member of this raid (its superblock names the raid) goes
/// back to its slot and is rebuilt too (it missed writes: it is never read as current); a
/// member of another raid is refused (`EEXIST`). The superblock marks the member configured
/// (with a higher sequence number) when its rebuild is done.
///
/// Errors: [`SpdkError::NotFound`] for no such raid bdev or base bdev; `base_bdev`
/// [`SpdkError::InvalidArgument`] when the raid has no empty slot (concat and raid0 never
/// have one) or the base is too small or of another block size; `EBUSY` while a rebuild runs
/// or when another module claimed the base.
pub async fn add_raid_base(name: &str, base: &str) -> Result<RaidInfo> {
    check_name("name", name)?;
    check_base_name("base_bdev", base)?;
    let (n, b) = (name.to_string(), base.to_string());
    let have = match on_reactor_with(move |r| add_checks(r, &n, &b)).await? {
        Added::Already(i) => return Ok(i),
        Added::Not(have) => have,
    };
    if have.superblock {
        // A former member of this raid holds an older superblock of it: SPDK would put it
        // back only into its old slot, and refuses it once that slot has had another member.
        // Its data is rebuilt anyway: clear the stale superblock so that it is taken as a
        // blank member.
        if let Some(sb) = read_superblock(base).await?
            && sb.uuid == have.uuid
            && let Some(seq) = have.superblock_seq
            && sb.seq < seq
        {
            wipe_superblock(base, &have.uuid, seq).await?;
        }
    }
    let (name, base) = (name.to_string(), base.to_string());
    exec_on(move |r, reply| {
        match add_checks(r, &name, &base) {
            Ok(Added::Already(i)) => return reply.send(Ok(i)),
            Ok(Added::Not(_)) => {}
            Err(e) => return reply.send(Err(e)),
        }
        let (c, b) = match (cstr("name", &name), cstr("base_bdev", &base)) {
            (Ok(c), Ok(b)) => (c, b),
            (Err(e), _) | (_, Err(e)) => return reply.send(Err(e)),
        };
        let ctx = errno_ctx(move |r, rc| {
            if rc == -libc_errno::EEXIST {
                return reply.send(Err(SpdkError::errno(
                    "add raid base bdev",
                    format!("{base} to {name} ({base} holds the superblock of another raid)"),
                    rc,
                )));
            }
            if rc != 0 {
                return reply.send(Err(SpdkError::errno(
                    "add raid base bdev",
                    format!("{base} to {name}"),
                    rc,
                )));
            }
            reply.send(info_now(r, &name).and_then(|i| {
                i.ok_or(SpdkError::NotFound {
                    kind: "raid bdev",
                    name,
                })
            }))
        });
        // SAFETY: on the app thread; the raid module copies the base name before it returns
        // (`c` and `b` outlive the call); `ctx` is owned by SPDK when the call returns 0.
        let rc =
            unsafe { spdk_sys::liteio_raid_add_base(c.as_ptr(), b.as_ptr(), Some(errno_cb), ctx) };
        if rc != 0 {
            // SAFETY: SPDK refused the call and never took `ctx`: it is answered here, once.
            unsafe { errno_cb(ctx, rc) };
        }
    })
    .await
}

/// Take the member `base` out of the raid that holds it: a raid1 goes on degraded (online,
/// its slot empty, reads and writes on the other members), and with a superblock the other
/// members' superblocks mark the slot missing (a higher sequence number), so the removed
/// member is not current from then on and is never assembled as such. The member keeps its
/// data; [`add_raid_base`] can put it (or another bdev) back, and it is rebuilt. A member
/// being rebuilt can be removed (its rebuild stops). A raid still configuring just lets the
/// member go. Returns the raid as it is afterwards, or `None` when no raid held `base`.
///
/// Idempotent: no such bdev, or a bdev no raid holds, is `Ok(None)`.
///
/// Errors: `base_bdev` [`SpdkError::InvalidArgument`] when the raid is an online concat or
/// raid0 (losing a member would take it offline) or `base` is the raid1's last whole member
/// (the others missing or being rebuilt); `EBUSY` while the member is already being removed.
pub async fn remove_raid_base(base: &str) -> Result<Option<RaidInfo>> {
    check_base_name("base_bdev", base)?;
    let base = base.to_string();
    exec_on(move |r, reply| {
        let b = match cstr("base_bdev", &base) {
            Ok(b) => b,
            Err(e) => return reply.send(Err(e)),
        };
        let mut raid = [0 as std::ffi::c_char; spdk_sys::LITEIO_NAME_MAX as usize];
        let mut removing = false;
        // SAFETY: on the app thread; `b` outlives the call; `raid` is writable for its length
        // and `removing` for one bool.
        let rc = unsafe {
            spdk_sys::liteio_raid_find_base(
                b.as_ptr(),
                raid.as_mut_ptr(),
                raid.len(),
                &mut removing,
            )
        };
        if rc == -libc_errno::ENODEV || rc == -libc_errno::ENOENT {
            return reply.send(Ok(None));
        }
        if rc != 0 {
            return reply.send(Err(SpdkError::errno("find raid of base bdev", base, rc)));
        }
        let name = from_c_array(&raid);
        let have = match info_now(r, &name) {
            Ok(Some(i)) => i,
            Ok(None) => return reply.send(Ok(None)),
            Err(e) => return reply.send(Err(e)),
        };
        if removing {
            return reply.send(Err(SpdkError::errno(
                "remove raid base bdev",
                format!("{base} from {name} (being removed)"),
                -libc_errno::EBUSY,
            )));
        }
        if let Err(e) = check_removable(&have, &base) {
            return reply.send(Err(e));
        }
        let ctx = errno_ctx(move |r, rc| {
            if rc != 0 {
                return reply.send(Err(SpdkError::errno(
                    "remove raid base bdev",
                    format!("{base} from {name}"),
                    rc,
                )));
            }
            reply.send(info_now(r, &name));
        });
        // SAFETY: on the app thread; `b` outlives the call; `ctx` is owned by SPDK when the
        // call returns 0.
        let rc = unsafe { spdk_sys::liteio_raid_remove_base(b.as_ptr(), Some(errno_cb), ctx) };
        if rc != 0 {
            // SAFETY: SPDK refused the call and never took `ctx`: it is answered here, once.
            unsafe { errno_cb(ctx, rc) };
        }
    })
    .await
}

/// Whether the member `base` can leave the raid `have` without taking it offline.
fn check_removable(have: &RaidInfo, base: &str) -> Result<()> {
    if have.state != RaidState::Online {
        return Ok(());
    }
    let bad = |reason: String| {
        Err(SpdkError::InvalidArgument {
            field: "base_bdev",
            reason,
        })
    };
    if have.level != RaidLevel::Raid1 {
        return bad(format!(
            "{} {} cannot lose {base}: it would go offline",
            have.level, have.name
        ));
    }
    let whole_others = have
        .bases
        .iter()
        .filter(|b| b.configured && !b.rebuilding && b.name.as_deref() != Some(base))
        .count();
    if whole_others < usize::from(have.min_base_bdevs_operational.max(1)) {
        return bad(format!(
            "{base} is the last whole member of raid1 {}: removing it would take the raid offline",
            have.name
        ));
    }
    Ok(())
}

/// Limit the bandwidth of raid rebuilds started from now on (every raid bdev of this SPDK), in
/// MiB/s; 0 lifts the limit (SPDK's default). A rebuild under way keeps the limit it started
/// with.
///
/// Only with polling reactors: SPDK paces a limited rebuild with a paused and resumed poller,
/// which in interrupt mode runs again before its pause takes effect and locks the same range
/// twice (seen with SPDK 26.05: the rebuild stops at its last window and logs "Failed to lock
/// LBA range" forever). A limit in interrupt mode is `mib_per_sec`
/// [`SpdkError::InvalidArgument`]; 0 is always taken.
pub async fn set_rebuild_limit(mib_per_sec: u32) -> Result<()> {
    on_reactor_with(move |_r| {
        // SAFETY: a getter of a flag set once at start.
        if mib_per_sec != 0 && unsafe { spdk_sys::spdk_interrupt_mode_is_enabled() } {
            return Err(SpdkError::InvalidArgument {
                field: "mib_per_sec",
                reason: format!(
                    "a rebuild limit ({mib_per_sec} MiB/s) needs polling reactors; SPDK runs in interrupt mode"
                ),
            });
        }
        // SAFETY: on the app thread, where the raid module reads its options.
        let rc = unsafe { spdk_sys::liteio_raid_set_process_limit(mib_per_sec) };
        if rc != 0 {
            return Err(SpdkError::errno(
                "set raid rebuild limit",
                format!("{mib_per_sec} MiB/s"),
                rc,
            ));
        }
        Ok(())
    })
    .await
}

#[cfg(test)]
mod tests;
