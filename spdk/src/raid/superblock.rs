//! Raid superblocks: reading the one on a bdev, and assembling a raid again from its
//! members' superblocks (after a restart, or on another node), with the members that missed
//! writes told apart and never read as current.
//!
//! SPDK's raid module writes the superblock on every member of a raid made with one
//! ([`super::RaidCreateOpts::superblock`]): the raid's name, UUID, level and size, each slot's
//! member UUID and state (configured, missing, failed) and a sequence number it increments
//! on every update (the raid's start, a member removed or failed, a rebuild done). A member
//! that left the raid keeps the superblock it had when it left, so its sequence number is
//! lower than the others': it is not current. See `docs/replicas-spdk.md`.

use std::ffi::CString;

use super::super::bdev::{self, check_name};
use super::super::error::{Result, SpdkError, libc_errno};
use super::super::runtime::{
    Reactor, cstr, errno_cb, errno_ctx, exec_on, from_c_array, handle_cb, handle_ctx,
    on_reactor_with,
};
use super::{
    MAX_BASE_BDEVS, RaidInfo, RaidLevel, RaidState, SlotState, check_base_name, delete_raid,
    info_now,
};

/// One member slot as a raid superblock records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuperblockBase {
    /// UUID of the member bdev in this slot (the bdev's own UUID).
    pub uuid: String,
    /// The slot (place in the raid).
    pub slot: u8,
    /// The slot's state; `None` for a value SPDK does not define.
    pub state: Option<SlotState>,
    /// Blocks of the member before the raid's data.
    pub data_offset_blocks: u64,
    /// Blocks of the member the raid uses.
    pub data_size_blocks: u64,
}

/// The raid superblock found on a bdev.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// Name of the raid.
    pub name: String,
    /// UUID of the raid.
    pub uuid: String,
    /// Sequence number: higher is newer.
    pub seq: u64,
    /// Level; `None` for one not offered here (raid5f).
    pub level: Option<RaidLevel>,
    /// Block size of the raid, bytes.
    pub block_size: u32,
    /// Blocks of the raid bdev.
    pub num_blocks: u64,
    /// Strip size in blocks (0 for raid1).
    pub strip_blocks: u32,
    /// Slots of the raid.
    pub num_base_bdevs: u8,
    /// The slots it records, in its order.
    pub bases: Vec<SuperblockBase>,
}

impl Superblock {
    /// The slot recording the member `uuid`, if any.
    pub fn slot_of(&self, uuid: &str) -> Option<&SuperblockBase> {
        self.bases.iter().find(|b| b.uuid == uuid)
    }

    /// UUIDs of the members this superblock counts as configured (current), in slot order.
    pub fn configured(&self) -> Vec<String> {
        let mut c: Vec<&SuperblockBase> = self
            .bases
            .iter()
            .filter(|b| b.state == Some(SlotState::Configured))
            .collect();
        c.sort_by_key(|b| b.slot);
        c.into_iter().map(|b| b.uuid.clone()).collect()
    }

    fn from_raw(sb: &spdk_sys::liteio_raid_sb) -> Self {
        let n = usize::from(sb.base_bdevs_size).min(sb.bases.len());
        Self {
            name: from_c_array(&sb.name),
            uuid: from_c_array(&sb.uuid),
            seq: sb.seq_number,
            level: RaidLevel::from_spdk(sb.level),
            block_size: sb.block_size,
            num_blocks: sb.raid_size,
            strip_blocks: sb.strip_size,
            num_base_bdevs: sb.num_base_bdevs,
            bases: sb.bases[..n]
                .iter()
                .map(|b| SuperblockBase {
                    uuid: from_c_array(&b.uuid),
                    slot: b.slot,
                    state: SlotState::from_raw(b.state),
                    data_offset_blocks: b.data_offset,
                    data_size_blocks: b.data_size,
                })
                .collect(),
        }
    }
}

/// The raid superblock on the bdev `bdev` (read from its first blocks, also while the bdev is
/// a raid's member); `None` when it holds no valid one (never a raid member, wiped, or a torn
/// write SPDK's checksum rejects).
///
/// Errors: [`SpdkError::NotFound`] for no such bdev; `ENOTSUP` for a bdev with metadata or
/// DIF (the raids here have none); `EIO` when the read fails.
pub async fn read_superblock(bdev: &str) -> Result<Option<Superblock>> {
    check_base_name("bdev", bdev)?;
    let name = bdev.to_string();
    exec_on(move |_r, reply| {
        let c = match cstr("bdev", &name) {
            Ok(c) => c,
            Err(e) => return reply.send(Err(e)),
        };
        let n = name.clone();
        let ctx = handle_ctx::<spdk_sys::liteio_raid_sb>(move |_r, sb, rc| {
            reply.send(match rc {
                0 if !sb.is_null() => {
                    // SAFETY: the shim passes a superblock that is valid for this call when
                    // the status is 0; it is copied here.
                    Ok(Some(Superblock::from_raw(unsafe { &*sb })))
                }
                rc if rc == -libc_errno::EINVAL => Ok(None),
                rc if rc == -libc_errno::ENODEV => Err(SpdkError::NotFound {
                    kind: "bdev",
                    name: n,
                }),
                rc => Err(SpdkError::errno("read raid superblock", n, rc)),
            })
        });
        // SAFETY: on the app thread; `c` outlives the call; `ctx` is owned by SPDK when the
        // call returns 0.
        let rc = unsafe {
            spdk_sys::liteio_raid_sb_read(
                c.as_ptr(),
                Some(handle_cb::<spdk_sys::liteio_raid_sb>),
                ctx,
            )
        };
        if rc != 0 {
            // SAFETY: SPDK refused the call and never took `ctx`: it is answered here, once.
            unsafe { handle_cb::<spdk_sys::liteio_raid_sb>(ctx, std::ptr::null_mut(), rc) };
        }
    })
    .await
}

/// How [`assemble_from_superblock_with`] assembles.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AssembleOpts {
    /// Start the raid with the current members present when some are absent (a raid1 needs
    /// one): their slots are marked missing in the present members' superblocks first, as SPDK
    /// does when a member goes, so an absent member that comes back later is not current.
    /// Without it the raid waits for them, configuring (holding the present members), as
    /// SPDK's own assembly does.
    pub start_degraded: bool,
    /// Refuse to assemble unless a present member's superblock has at least this sequence
    /// number: the caller's record of the raid's [`RaidInfo::superblock_seq`]. Without it a
    /// member that missed writes looks current when every member that did not is absent
    /// (nothing on the members can tell); with it that case is refused.
    pub min_seq: Option<u64>,
}

/// What [`assemble_from_superblock`] found and made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assembly {
    /// The raid as it is now: online (degraded when members are missing), or configuring
    /// when current members are absent and `start_degraded` was not asked.
    pub raid: RaidInfo,
    /// Members given that exist but are not current: a superblock with a lower sequence
    /// number than the newest, a slot the newest marks missing or failed, or no superblock.
    /// They were not examined: the raid does not use them. Put one back with
    /// [`super::add_raid_base`] to rebuild it (SPDK overwrites it from the current members).
    pub not_current: Vec<String>,
    /// Members given that do not exist (no such bdev).
    pub absent: Vec<String>,
    /// The newest superblock sequence number found on the members given, before anything was
    /// written.
    pub seq_found: u64,
}

/// One member given, as found.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Member {
    /// The name given (an lvol's alias `lvs/lvol`, or a bdev's name).
    name: String,
    /// The bdev's own name (an lvol's is its UUID: SPDK's raid module names the members it
    /// finds by UUID so) and UUID; `None` when there is no such bdev.
    bdev: Option<(String, String)>,
    sb: Option<Superblock>,
}

impl Member {
    fn bdev_uuid(&self) -> Option<&str> {
        self.bdev.as_ref().map(|(_, u)| u.as_str())
    }
}

/// Whether the raid's member name `raid_name` is the member given as `given` (by the name
/// given, or by the bdev's own name).
fn same_member(raid_name: &str, given: &str, members: &[Member]) -> bool {
    raid_name == given
        || members
            .iter()
            .any(|m| m.name == given && m.bdev.as_ref().is_some_and(|(n, _)| n == raid_name))
}

/// What to do, decided from the members found (pure: unit-tested).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Plan {
    uuid: String,
    level: RaidLevel,
    seq: u64,
    /// Current members present, in the order given.
    current: Vec<String>,
    not_current: Vec<String>,
    absent: Vec<String>,
    /// Member UUIDs to mark missing in the current members' superblocks before examining.
    mark: Vec<String>,
    /// Configured members of the newest superblock that stay absent: the raid waits for
    /// them.
    waiting_for: Vec<String>,
}

fn plan(name: &str, members: &[Member], opts: &AssembleOpts) -> Result<Plan> {
    let absent: Vec<String> = members
        .iter()
        .filter(|m| m.bdev.is_none())
        .map(|m| m.name.clone())
        .collect();
    let present: Vec<&Member> = members.iter().filter(|m| m.bdev.is_some()).collect();
    if present.is_empty() {
        return Err(SpdkError::NotFound {
            kind: "raid member",
            name: format!("of {name} among [{}]", absent.join(", ")),
        });
    }
    let with_sb: Vec<(&Member, &Superblock)> = present
        .iter()
        .filter_map(|m| m.sb.as_ref().map(|sb| (*m, sb)))
        .collect();
    if let Some((m, sb)) = with_sb.iter().find(|(_, sb)| sb.name != name) {
        return Err(SpdkError::InvalidArgument {
            field: "base_bdevs",
            reason: format!(
                "{} holds the superblock of raid {} ({}), not of {name}",
                m.name, sb.name, sb.uuid
            ),
        });
    }
    let Some(newest) = with_sb.iter().map(|(_, sb)| *sb).max_by_key(|sb| sb.seq) else {
        let names: Vec<&str> = present.iter().map(|m| m.name.as_str()).collect();
        return Err(SpdkError::NotFound {
            kind: "raid superblock",
            name: format!("of {name} on [{}]", names.join(", ")),
        });
    };
    if let Some((m, sb)) = with_sb.iter().find(|(_, sb)| sb.uuid != newest.uuid) {
        return Err(SpdkError::InvalidArgument {
            field: "base_bdevs",
            reason: format!(
                "{} holds the superblock of another raid named {name} ({}, not {})",
                m.name, sb.uuid, newest.uuid
            ),
        });
    }
    let level = newest.level.ok_or_else(|| SpdkError::InvalidArgument {
        field: "raid_level",
        reason: format!("the superblock of {name} names a level other than concat, raid0 or raid1"),
    })?;
    if let Some(min) = opts.min_seq
        && newest.seq < min
    {
        return Err(SpdkError::NotFound {
            kind: "current raid member",
            name: format!(
                "of {name}: the newest superblock present has sequence number {}, below the {min} recorded (the members that hold it are absent)",
                newest.seq
            ),
        });
    }
    let is_current = |m: &Member| {
        let (Some(uuid), Some(sb)) = (m.bdev_uuid(), &m.sb) else {
            return false;
        };
        sb.seq == newest.seq
            && newest
                .slot_of(uuid)
                .is_some_and(|s| s.state == Some(SlotState::Configured))
    };
    let current: Vec<String> = present
        .iter()
        .filter(|m| is_current(m))
        .map(|m| m.name.clone())
        .collect();
    if current.is_empty() {
        return Err(SpdkError::NotFound {
            kind: "current raid member",
            name: format!(
                "of {name}: the newest superblock (sequence number {}) counts none of the members present",
                newest.seq
            ),
        });
    }
    let not_current: Vec<String> = present
        .iter()
        .filter(|m| !is_current(m))
        .map(|m| m.name.clone())
        .collect();
    let current_uuids: Vec<&str> = present
        .iter()
        .filter(|m| is_current(m))
        .filter_map(|m| m.bdev_uuid())
        .collect();
    let missing: Vec<String> = newest
        .configured()
        .into_iter()
        .filter(|u| !current_uuids.contains(&u.as_str()))
        .collect();
    // A present member the newest superblock still counts configured although its own
    // superblock is older (a superblock write that failed on it): SPDK would take it as
    // current when examined, so its slot is always marked missing.
    let stale_configured: Vec<String> = missing
        .iter()
        .filter(|u| {
            present
                .iter()
                .any(|m| !is_current(m) && m.bdev_uuid() == Some(u.as_str()))
        })
        .cloned()
        .collect();
    let mark = if opts.start_degraded {
        missing.clone()
    } else {
        stale_configured
    };
    let waiting_for: Vec<String> = missing.into_iter().filter(|u| !mark.contains(u)).collect();
    let min_operational = if level == RaidLevel::Raid1 {
        1
    } else {
        usize::from(newest.num_base_bdevs)
    };
    if waiting_for.is_empty() && current.len() < min_operational {
        return Err(SpdkError::InvalidArgument {
            field: "start_degraded",
            reason: format!(
                "{level} {name} cannot start with {} of its {} members",
                current.len(),
                newest.num_base_bdevs
            ),
        });
    }
    Ok(Plan {
        uuid: newest.uuid.clone(),
        level,
        seq: newest.seq,
        current,
        not_current,
        absent,
        mark,
        waiting_for,
    })
}

/// Assemble the raid `name` from the superblocks on `bases` (the bdevs that may be its
/// members, in any order): [`assemble_from_superblock_with`] with `start_degraded` and no
/// `min_seq`.
pub async fn assemble_from_superblock(
    name: &str,
    bases: &[String],
    start_degraded: bool,
) -> Result<Assembly> {
    assemble_from_superblock_with(
        name,
        bases,
        &AssembleOpts {
            start_degraded,
            min_seq: None,
        },
    )
    .await
}

/// Assemble the raid `name` from the superblocks on `bases` (the bdevs that may be its
/// members, in any order; a raid made with [`super::RaidCreateOpts::superblock`]).
///
/// Expected flow: each member's superblock is read; the newest one (highest sequence number)
/// decides which members are current: those whose own superblock is that newest one and
/// whose slot it marks configured. Only the current members are examined by SPDK's raid
/// module (which re-creates the raid from them, as it does on its own with auto-examine); the
/// others are reported in [`Assembly::not_current`] and left alone, never read as current.
/// When current members are absent the raid waits for them (configuring), or with
/// [`AssembleOpts::start_degraded`] starts without them. Members that do not exist are in
/// [`Assembly::absent`].
///
/// Guarantees: a raid that comes online holds only current members. Idempotent: an online
/// raid `name` of the same UUID over current members is reported as it is (a raid still
/// configuring is removed and assembled again). A failure after the raid was made removes
/// it again; the members keep their data (and superblocks marked by `start_degraded`).
///
/// Assumption: the newest superblock among the members present is the raid's newest. When
/// every member that has it is absent, a member that missed writes looks current: give
/// [`AssembleOpts::min_seq`] (the sequence number last seen in [`RaidInfo::superblock_seq`])
/// to refuse that case.
///
/// Errors: [`SpdkError::InvalidArgument`] for a bad name, no base or more than 255, a base
/// named twice, a member holding the superblock of another raid, a level that cannot start
/// with the members present (concat and raid0 need all); [`SpdkError::NotFound`] when no base
/// exists (kind `raid member`), none holds a superblock (kind `raid superblock`) or
/// `min_seq` is not reached (kind `current raid member`); [`SpdkError::AlreadyExists`] for a
/// raid or bdev `name` that is not this raid, or this raid online over a member that is not
/// current (made behind the caller's back by auto-examine: delete it first); `EBUSY` for a
/// current member another module claimed, `ESTALE` when a superblock changed while it was
/// being marked.
pub async fn assemble_from_superblock_with(
    name: &str,
    bases: &[String],
    opts: &AssembleOpts,
) -> Result<Assembly> {
    check_name("name", name)?;
    if bases.is_empty() || bases.len() > MAX_BASE_BDEVS {
        return Err(SpdkError::InvalidArgument {
            field: "base_bdevs",
            reason: format!("1-{MAX_BASE_BDEVS} base bdevs, got {}", bases.len()),
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
    // What exists: the bdevs (their UUIDs) and a raid or other bdev of that name.
    let (uuids, existing, other) = {
        let (name, bases) = (name.to_string(), bases.to_vec());
        on_reactor_with(move |r| {
            let uuids: Vec<Option<(String, String)>> = bases
                .iter()
                .map(|b| {
                    super::super::bdev::info_by_name(r, b)
                        .ok()
                        .map(|i| (i.name, i.uuid))
                })
                .collect();
            let existing = info_now(r, &name)?;
            let other = if existing.is_none() {
                super::super::bdev::info_by_name(r, &name).ok()
            } else {
                None
            };
            Ok((uuids, existing, other))
        })
        .await?
    };
    if let Some(o) = other {
        return Err(SpdkError::AlreadyExists {
            kind: "bdev",
            name: name.into(),
            detail: format!("as a {}, not a raid bdev", o.product),
        });
    }
    let mut members = Vec::with_capacity(bases.len());
    for (b, uuid) in bases.iter().zip(uuids) {
        let sb = match &uuid {
            Some(_) => match read_superblock(b).await {
                Ok(sb) => sb,
                // Gone since it was looked up: absent.
                Err(SpdkError::NotFound { .. }) => {
                    members.push(Member {
                        name: b.clone(),
                        bdev: None,
                        sb: None,
                    });
                    continue;
                }
                Err(e) => return Err(e),
            },
            None => None,
        };
        members.push(Member {
            name: b.clone(),
            bdev: uuid,
            sb,
        });
    }
    let plan = plan(name, &members, opts)?;
    let report = |raid: RaidInfo| Assembly {
        raid,
        not_current: plan.not_current.clone(),
        absent: plan.absent.clone(),
        seq_found: plan.seq,
    };
    if let Some(have) = existing {
        if !have.superblock || have.uuid != plan.uuid {
            return Err(SpdkError::AlreadyExists {
                kind: "raid bdev",
                name: name.into(),
                detail: format!(
                    "with uuid {} and superblock {} (the members' superblocks name {})",
                    have.uuid, have.superblock, plan.uuid
                ),
            });
        }
        if have.deleting {
            return Err(SpdkError::errno(
                "assemble raid bdev",
                format!("{name} (being deleted)"),
                -libc_errno::EBUSY,
            ));
        }
        if have.state == RaidState::Online {
            if let Some(stale) = have
                .bases
                .iter()
                .filter(|b| b.configured && !b.rebuilding)
                .filter_map(|b| b.name.as_ref())
                .find(|n| plan.not_current.iter().any(|g| same_member(n, g, &members)))
            {
                return Err(SpdkError::AlreadyExists {
                    kind: "raid bdev",
                    name: name.into(),
                    detail: format!(
                        "online over {stale}, whose superblock is not current (sequence number below {}): delete the raid and assemble it again",
                        plan.seq
                    ),
                });
            }
            return Ok(report(have));
        }
        // Configuring (made by auto-examine, or an earlier call that waited): start over from
        // the members this call found current.
        delete_raid(name).await?;
    }
    if !plan.mark.is_empty() {
        for b in &plan.current {
            mark_missing(b, &plan.uuid, plan.seq, &plan.mark).await?;
        }
    }
    let assembled = async {
        for b in &plan.current {
            examine_member(name, b, &members).await?;
            bdev::wait_for_examine().await?;
        }
        let raid = super::raid_info(name).await?;
        check_assembled(name, raid, &plan, &members)
    }
    .await;
    match assembled {
        Ok(raid) => Ok(report(raid)),
        Err(e) => {
            // Remove what this call made (a raid of this UUID), keep the error.
            if let Ok(Some(r)) = super::raid_info(name).await
                && r.uuid == plan.uuid
            {
                let _ = delete_raid(name).await;
            }
            Err(e)
        }
    }
}

/// The raid after examining the current members: it must exist with the plan's UUID, hold
/// every current member, and be online unless members are still awaited.
fn check_assembled(
    name: &str,
    raid: Option<RaidInfo>,
    plan: &Plan,
    members: &[Member],
) -> Result<RaidInfo> {
    let Some(raid) = raid else {
        return Err(SpdkError::NotFound {
            kind: "raid bdev",
            name: format!("{name} (SPDK's raid module made none from the superblocks)"),
        });
    };
    if raid.uuid != plan.uuid {
        return Err(SpdkError::AlreadyExists {
            kind: "raid bdev",
            name: name.into(),
            detail: format!(
                "with uuid {} (the superblocks name {})",
                raid.uuid, plan.uuid
            ),
        });
    }
    let missing: Vec<&str> = plan
        .current
        .iter()
        .filter(|c| {
            !raid.bases.iter().any(|b| {
                b.configured
                    && b.name
                        .as_deref()
                        .is_some_and(|n| same_member(n, c, members))
            })
        })
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        return Err(SpdkError::errno(
            "assemble raid bdev",
            format!("{name}: current members [{}] not taken", missing.join(", ")),
            -libc_errno::ENODEV,
        ));
    }
    let want = if plan.waiting_for.is_empty() {
        RaidState::Online
    } else {
        RaidState::Configuring
    };
    if raid.state != want {
        return Err(SpdkError::errno(
            "assemble raid bdev",
            format!("{name} is {} (expected {want})", raid.state),
            -libc_errno::EINVAL,
        ));
    }
    Ok(raid)
}

/// Have the raid module examine the member `base` of `raid` unless the raid already holds it
/// (SPDK examines the other members it knows by UUID once the first is in).
async fn examine_member(raid: &str, base: &str, members: &[Member]) -> Result<()> {
    let (raid, base, members) = (raid.to_string(), base.to_string(), members.to_vec());
    on_reactor_with(move |r| {
        if let Some(i) = info_now(r, &raid)?
            && i.bases.iter().any(|b| {
                b.configured
                    && b.name
                        .as_deref()
                        .is_some_and(|n| same_member(n, &base, &members))
            })
        {
            return Ok(());
        }
        raid_examine(r, &base)
    })
    .await
}

/// Start the raid module's examine of `base` (its completion: [`bdev::wait_for_examine`]).
fn raid_examine(_r: &Reactor, base: &str) -> Result<()> {
    let c = cstr("base_bdevs", base)?;
    // SAFETY: on the app thread; `c` outlives the call.
    let rc = unsafe { spdk_sys::liteio_raid_examine(c.as_ptr()) };
    match rc {
        0 => Ok(()),
        rc if rc == -libc_errno::ENODEV => Err(SpdkError::NotFound {
            kind: "base bdev",
            name: base.into(),
        }),
        rc if rc == -libc_errno::EBUSY => Err(SpdkError::errno(
            "examine raid member",
            format!("{base} (claimed by another module or raid)"),
            rc,
        )),
        rc => Err(SpdkError::errno("examine raid member", base, rc)),
    }
}

/// Mark the members `uuids` missing in the superblock of raid `raid_uuid` on `bdev`, which
/// must have sequence number `seq`; it gets `seq + 1`.
async fn mark_missing(bdev: &str, raid_uuid: &str, seq: u64, uuids: &[String]) -> Result<()> {
    let (bdev, raid_uuid, uuids) = (bdev.to_string(), raid_uuid.to_string(), uuids.to_vec());
    exec_on(move |_r, reply| {
        let prepared = (|| -> Result<_> {
            let ids: Vec<CString> = uuids
                .iter()
                .map(|u| cstr("uuid", u))
                .collect::<Result<_>>()?;
            Ok((cstr("bdev", &bdev)?, cstr("uuid", &raid_uuid)?, ids))
        })();
        let (c, u, ids) = match prepared {
            Ok(p) => p,
            Err(e) => return reply.send(Err(e)),
        };
        let ptrs: Vec<*const std::ffi::c_char> = ids.iter().map(|i| i.as_ptr()).collect();
        let what = format!("{bdev} (raid {raid_uuid}, sequence number {seq})");
        let ctx = errno_ctx(move |_r, rc| {
            reply.send(match rc {
                0 => Ok(()),
                rc if rc == -libc_errno::ESTALE => Err(SpdkError::errno(
                    "mark raid members missing",
                    format!("{what}: the superblock changed meanwhile"),
                    rc,
                )),
                rc if rc == -libc_errno::EPERM => Err(SpdkError::errno(
                    "mark raid members missing",
                    format!("{what}: claimed by a module"),
                    -libc_errno::EBUSY,
                )),
                rc => Err(SpdkError::errno("mark raid members missing", what, rc)),
            })
        });
        // SAFETY: on the app thread; the strings and the pointer array outlive the call, which
        // parses them before it returns; `ctx` is owned by SPDK when the call returns 0.
        let rc = unsafe {
            spdk_sys::liteio_raid_sb_mark_missing(
                c.as_ptr(),
                u.as_ptr(),
                seq,
                ptrs.as_ptr(),
                // At most the 255 slots of a superblock.
                ptrs.len() as i32,
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

/// Zero the superblock of raid `raid_uuid` on `bdev` if its sequence number is below `seq`
/// (a stale former member about to be rebuilt), so that SPDK takes it as a blank member.
pub(super) async fn wipe_superblock(bdev: &str, raid_uuid: &str, seq: u64) -> Result<()> {
    let (bdev, raid_uuid) = (bdev.to_string(), raid_uuid.to_string());
    exec_on(move |_r, reply| {
        let (c, u) = match (cstr("bdev", &bdev), cstr("uuid", &raid_uuid)) {
            (Ok(c), Ok(u)) => (c, u),
            (Err(e), _) | (_, Err(e)) => return reply.send(Err(e)),
        };
        let what = format!("{bdev} (raid {raid_uuid}, sequence number below {seq})");
        let ctx = errno_ctx(move |_r, rc| {
            reply.send(match rc {
                0 => Ok(()),
                rc if rc == -libc_errno::EPERM => Err(SpdkError::errno(
                    "clear stale raid superblock",
                    format!("{what}: claimed by a module"),
                    -libc_errno::EBUSY,
                )),
                rc => Err(SpdkError::errno("clear stale raid superblock", what, rc)),
            })
        });
        // SAFETY: on the app thread; `c` and `u` outlive the call, which parses them before it
        // returns; `ctx` is owned by SPDK when the call returns 0.
        let rc = unsafe {
            spdk_sys::liteio_raid_sb_wipe(c.as_ptr(), u.as_ptr(), seq, Some(errno_cb), ctx)
        };
        if rc != 0 {
            // SAFETY: SPDK refused the call and never took `ctx`: it is answered here, once.
            unsafe { errno_cb(ctx, rc) };
        }
    })
    .await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const RAID: &str = "11111111-1111-4111-8111-111111111111";
    const A: &str = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa";
    const B: &str = "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb";
    const C: &str = "cccccccc-cccc-4ccc-8ccc-cccccccccccc";

    fn sb(seq: u64, slots: &[(&str, SlotState)]) -> Superblock {
        Superblock {
            name: "r".into(),
            uuid: RAID.into(),
            seq,
            level: Some(RaidLevel::Raid1),
            block_size: 512,
            num_blocks: 1000,
            strip_blocks: 0,
            num_base_bdevs: slots.len() as u8,
            bases: slots
                .iter()
                .enumerate()
                .map(|(i, (u, s))| SuperblockBase {
                    uuid: u.to_string(),
                    slot: i as u8,
                    state: Some(*s),
                    data_offset_blocks: 2048,
                    data_size_blocks: 1000,
                })
                .collect(),
        }
    }

    fn m(name: &str, uuid: Option<&str>, sb: Option<Superblock>) -> Member {
        Member {
            name: name.into(),
            bdev: uuid.map(|u| (format!("bdev-{name}"), u.to_string())),
            sb,
        }
    }

    use SlotState::{Configured as Conf, Missing as Miss};

    #[test]
    fn both_current_start_whole() {
        let s = sb(3, &[(A, Conf), (B, Conf)]);
        let p = plan(
            "r",
            &[m("a", Some(A), Some(s.clone())), m("b", Some(B), Some(s))],
            &AssembleOpts::default(),
        )
        .unwrap();
        assert_eq!(p.current, ["a", "b"]);
        assert!(p.not_current.is_empty() && p.absent.is_empty() && p.mark.is_empty());
        assert!(p.waiting_for.is_empty());
        assert_eq!((p.seq, p.level), (3, RaidLevel::Raid1));
    }

    #[test]
    fn a_member_that_was_removed_is_not_current() {
        // b left at seq 3 (it kept that superblock); a went on to 4 with b's slot missing.
        let old = sb(3, &[(A, Conf), (B, Conf)]);
        let new = sb(4, &[(A, Conf), (B, Miss)]);
        for order in [[0, 1], [1, 0]] {
            let ms = [
                m("a", Some(A), Some(new.clone())),
                m("b", Some(B), Some(old.clone())),
            ];
            let given: Vec<Member> = order.iter().map(|i| ms[*i].clone()).collect();
            let p = plan("r", &given, &AssembleOpts::default()).unwrap();
            assert_eq!(p.current, ["a"]);
            assert_eq!(p.not_current, ["b"]);
            assert!(p.mark.is_empty() && p.waiting_for.is_empty(), "{p:?}");
        }
    }

    #[test]
    fn an_absent_member_is_waited_for_or_marked_missing() {
        let s = sb(5, &[(A, Conf), (B, Conf)]);
        let given = [m("a", Some(A), Some(s)), m("b", None, None)];
        let p = plan("r", &given, &AssembleOpts::default()).unwrap();
        assert_eq!(
            (p.absent.clone(), p.waiting_for.clone()),
            (vec!["b".to_string()], vec![B.to_string()])
        );
        assert!(p.mark.is_empty());
        let p = plan(
            "r",
            &given,
            &AssembleOpts {
                start_degraded: true,
                min_seq: None,
            },
        )
        .unwrap();
        assert_eq!(p.mark, [B]);
        assert!(p.waiting_for.is_empty());
        // Not given at all: the same.
        let s = sb(5, &[(A, Conf), (B, Conf), (C, Conf)]);
        let p = plan(
            "r",
            &[m("a", Some(A), Some(s))],
            &AssembleOpts {
                start_degraded: true,
                min_seq: Some(5),
            },
        )
        .unwrap();
        assert_eq!(p.mark, [B, C]);
    }

    #[test]
    fn a_stale_member_the_newest_still_counts_is_always_marked() {
        // A superblock write to b failed: the newest still says configured, b's own is older.
        let old = sb(3, &[(A, Conf), (B, Conf)]);
        let new = sb(4, &[(A, Conf), (B, Conf)]);
        let p = plan(
            "r",
            &[m("a", Some(A), Some(new)), m("b", Some(B), Some(old))],
            &AssembleOpts::default(),
        )
        .unwrap();
        assert_eq!(
            (p.current.clone(), p.not_current.clone()),
            (vec!["a".to_string()], vec!["b".to_string()])
        );
        assert_eq!(p.mark, [B]);
        assert!(p.waiting_for.is_empty());
    }

    #[test]
    fn blank_foreign_and_too_old_members() {
        let s = sb(2, &[(A, Conf), (B, Conf)]);
        let p = plan(
            "r",
            &[m("a", Some(A), Some(s.clone())), m("blank", Some(C), None)],
            &AssembleOpts::default(),
        )
        .unwrap();
        assert_eq!(p.not_current, ["blank"]);
        let mut other = s.clone();
        other.name = "q".into();
        let e = plan(
            "r",
            &[m("a", Some(A), Some(other))],
            &AssembleOpts::default(),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("a holds the superblock of raid q"),
            "{e}"
        );
        let mut twin = s.clone();
        twin.uuid = C.into();
        let e = plan(
            "r",
            &[
                m("a", Some(A), Some(s.clone())),
                m("b", Some(B), Some(twin)),
            ],
            &AssembleOpts::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("another raid named r"), "{e}");
        let e = plan("r", &[m("x", Some(C), None)], &AssembleOpts::default()).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::NotFound, "{e}");
        assert!(e.to_string().contains("raid superblock of r on [x]"), "{e}");
        let e = plan("r", &[m("x", None, None)], &AssembleOpts::default()).unwrap_err();
        assert!(e.to_string().contains("raid member of r among [x]"), "{e}");
        let e = plan(
            "r",
            &[m("a", Some(A), Some(s.clone()))],
            &AssembleOpts {
                start_degraded: true,
                min_seq: Some(3),
            },
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("sequence number 2, below the 3 recorded"),
            "{e}"
        );
        // raid0 cannot start without all its members.
        let mut stripe = s;
        stripe.level = Some(RaidLevel::Raid0);
        let e = plan(
            "r",
            &[m("a", Some(A), Some(stripe))],
            &AssembleOpts {
                start_degraded: true,
                min_seq: None,
            },
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("raid0 r cannot start with 1 of its 2"),
            "{e}"
        );
    }
}
