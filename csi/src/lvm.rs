//! LVM on the host for multi-disk volumes assembled by the CSI node (engine KernelLVM): one
//! volume group over the member devices with one logical volume using all of it. Every LVM
//! command line the driver runs is built here, and every report it reads is parsed here;
//! what to do given those reports is decided here too ([`plan_vg`], [`plan_lv`]), so that
//! the node service only runs what this module says.
//!
//! **Names** ([`names`]): the VG and the LV are both named after the data control, which the
//! CSI controller names after the PV (`pvc-<uuid>`): `/dev/<pv>/<pv>`. A name LVM or
//! device-mapper cannot take (characters, length of `<vg>-<lv>` with its dashes doubled
//! over 127 bytes, a reserved prefix) falls back to the volume id (`dc-<uuid>`). The VG
//! carries the tag `liteio.volume.<id>`, so that a VG of that name which was not made for
//! this volume is refused instead of used.
//!
//! **Safety of every command:**
//! - `--config` restricts LVM to exactly the member devices: `devices/filter` and
//!   `global_filter` accept those paths and reject every other device, the devices file
//!   and udev's device list are not used. A command never scans, shows or changes a disk
//!   of the host, and a VG of the same name elsewhere on the host is invisible to it.
//! - Activation without udev (`activation/udev_sync=0`, `udev_rules=0`): LVM creates
//!   `/dev/mapper/<vg>-<lv>` and `/dev/<vg>/<lv>` itself. The CSI node runs in a container,
//!   where waiting for a udev confirmation that never comes would hang the command.
//! - No metadata backups or archives in the host's `/etc/lvm` (`backup/backup=0`,
//!   `archive=0`): the metadata lives on the members, and a copy on one host is stale once
//!   the pod and its volume move to another.
//! - No prompt is answered yes, except `lvcreate -y`, whose only prompt wipes signatures
//!   inside the LV just created on a VG just created. The runner closes stdin, on which LVM
//!   answers every other prompt no (`pvcreate` over a file system aborts). Before that,
//!   [`plan_vg`] refuses any member that carries a signature other than an LVM label of
//!   this volume: data the driver did not write is never wiped.
//!
//! **Stripe size** ([`STRIPE_SIZE_KIB`], raid0): 64 KiB, LVM's own default. A 4 KiB random
//! I/O stays on one member (one NVMe/TCP command), while a 1 MiB sequential I/O is split
//! over 16 stripes and so reaches every member of a group of up to 16 in parallel; larger
//! stripes would leave a sequential stream on one member at a time, smaller ones split
//! even medium I/O into several network commands. It divides the 4 MiB extent, so the LV
//! ends on a stripe boundary.
//!
//! Unit tests: `lvm/tests.rs`.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use crate::error::{CsiError, Result};

/// Physical extent size of a group's VG: the 4 MiB each member reserves for the PV label and
/// the VG metadata ([`crate::group::KERNEL_LVM_RESERVE`]) is one extent, so the LV holds
/// at least the volume's size.
pub const EXTENT_SIZE: u64 = 4 << 20;
/// Stripe size of a raid0 group's LV, in KiB (see the module documentation).
pub const STRIPE_SIZE_KIB: u64 = 64;
/// `TYPE` blkid reports for an LVM physical volume.
pub const LVM2_MEMBER: &str = "LVM2_member";
/// Prefix of the tag that marks a VG as made for one multi-disk volume.
pub const TAG_PREFIX: &str = "liteio.volume.";
/// device-mapper's longest device name.
const DM_NAME_MAX: usize = 127;

/// How the LV uses the members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Concatenated in member order (`raid.level: linear`).
    Linear,
    /// Striped over every member (`raid.level: raid0`).
    Striped,
}

impl Layout {
    /// The layout of a raid level; `None` for the levels multi-disk volumes refuse.
    pub fn of(level: liteio_api::datacontrol::RaidLevel) -> Option<Self> {
        use liteio_api::datacontrol::RaidLevel;
        match level {
            RaidLevel::Linear => Some(Layout::Linear),
            RaidLevel::Raid0 => Some(Layout::Striped),
            RaidLevel::Raid1 | RaidLevel::Raid5 | RaidLevel::Raid6 => None,
        }
    }

    fn word(self) -> &'static str {
        match self {
            Layout::Linear => "linear",
            Layout::Striped => "striped (raid0)",
        }
    }
}

/// The VG, LV and tag of one multi-disk volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// Volume group.
    pub vg: String,
    /// Logical volume.
    pub lv: String,
    /// The tag the VG carries (`liteio.volume.<id>`).
    pub tag: String,
}

impl Names {
    /// The LV's device-mapper name: `<vg>-<lv>` with the dashes of each doubled.
    pub fn dm_name(&self) -> String {
        format!(
            "{}-{}",
            self.vg.replace('-', "--"),
            self.lv.replace('-', "--")
        )
    }

    /// `/dev/<vg>/<lv>`.
    pub fn lv_path(&self) -> String {
        format!("/dev/{}/{}", self.vg, self.lv)
    }
}

/// Whether LVM takes `name` as a VG and LV name (its characters, no leading dash or
/// reserved prefix; no underscore, which LVM reserves for its internal LVs' suffixes).
fn lvm_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.starts_with('-')
        && !name.starts_with("snapshot")
        && !name.starts_with("pvmove")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '+'))
}

/// The names of the multi-disk volume `id` whose data control is `dc_name` (see the module
/// documentation): VG and LV `<dc_name>`, or `<id>` when LVM cannot take `<dc_name>`.
pub fn names(dc_name: &str, id: &str) -> Names {
    let fits = |n: &str| {
        lvm_name_ok(n)
            && Names {
                vg: n.into(),
                lv: n.into(),
                tag: String::new(),
            }
            .dm_name()
            .len()
                <= DM_NAME_MAX
    };
    let base = if fits(dc_name) { dc_name } else { id };
    Names {
        vg: base.to_string(),
        lv: base.to_string(),
        tag: format!("{TAG_PREFIX}{id}"),
    }
}

/// Checks that `dev` can stand in an LVM filter as it is (`/dev/…`, letters, digits, `/`,
/// `_`, `-`): the member devices are `/dev/nvmeXnY`, anything else is refused rather than
/// escaped.
fn check_device(dev: &str) -> Result<()> {
    let ok = dev.starts_with("/dev/")
        && dev.len() > 5
        && dev
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(CsiError::FailedPrecondition(format!(
            "member device {dev:?} cannot be given to LVM's device filter (expected a /dev/nvmeXnY path)"
        )))
    }
}

/// The `--config` of every command on the members `devs` (see the module documentation).
pub fn config(devs: &[String]) -> Result<String> {
    if devs.is_empty() {
        return Err(CsiError::Internal(
            "an LVM command over no member device".into(),
        ));
    }
    for d in devs {
        check_device(d)?;
    }
    let mut filter: Vec<String> = devs.iter().map(|d| format!("\"a|^{d}$|\"")).collect();
    filter.push("\"r|.*|\"".into());
    let filter = filter.join(", ");
    Ok(format!(
        "devices {{ filter = [ {filter} ] global_filter = [ {filter} ] \
         obtain_device_list_from_udev = 0 use_devicesfile = 0 }} \
         activation {{ udev_sync = 0 udev_rules = 0 }} \
         backup {{ backup = 0 archive = 0 }}"
    ))
}

fn lvm(cmd: &str, devs: &[String]) -> Result<Vec<String>> {
    Ok(vec![cmd.to_string(), "--config".into(), config(devs)?])
}

fn report(cmd: &str, devs: &[String], fields: &str) -> Result<Vec<String>> {
    let mut a = lvm(cmd, devs)?;
    a.extend(
        [
            "--reportformat",
            "json",
            "--units",
            "b",
            "--nosuffix",
            "-o",
            fields,
        ]
        .map(String::from),
    );
    Ok(a)
}

/// Fields [`pvs_argv`] asks for.
pub const PV_FIELDS: &str = "pv_name,pv_uuid,vg_name,pv_pe_count,pv_pe_alloc_count,dev_size";
/// Fields [`vgs_argv`] asks for.
pub const VG_FIELDS: &str = "vg_name,vg_uuid,vg_tags,pv_count,vg_missing_pv_count,lv_count,vg_extent_size,vg_extent_count,vg_free_count";
/// Fields [`lvs_argv`] asks for (segment fields: one row per segment).
pub const LV_FIELDS: &str =
    "lv_name,vg_name,lv_uuid,lv_size,lv_path,lv_dm_path,lv_attr,segtype,stripes,stripe_size";

/// `pvs` of the PVs on `devs`.
pub fn pvs_argv(devs: &[String]) -> Result<Vec<String>> {
    report("pvs", devs, PV_FIELDS)
}

/// `vgs` of the VGs on `devs`.
pub fn vgs_argv(devs: &[String]) -> Result<Vec<String>> {
    report("vgs", devs, VG_FIELDS)
}

/// `lvs` of VG `vg` on `devs`.
pub fn lvs_argv(devs: &[String], vg: &str) -> Result<Vec<String>> {
    let mut a = report("lvs", devs, LV_FIELDS)?;
    a.push(vg.to_string());
    Ok(a)
}

/// `blkid -p -o export <dev>`: the signatures on a device, read from the device itself
/// (exit status 2: none).
pub fn signature_argv(dev: &str) -> Vec<String> {
    ["blkid", "-p", "-o", "export", dev]
        .map(String::from)
        .to_vec()
}

/// `pvcreate` of `create` (a subset of the members `devs`).
pub fn pvcreate_argv(devs: &[String], create: &[String]) -> Result<Vec<String>> {
    let mut a = lvm("pvcreate", devs)?;
    a.extend(create.iter().cloned());
    Ok(a)
}

/// `vgextend <vg> <add…>` (`add`: members of `devs` that are PVs of no VG).
pub fn vgextend_argv(devs: &[String], vg: &str, add: &[String]) -> Result<Vec<String>> {
    let mut a = lvm("vgextend", devs)?;
    a.push(vg.to_string());
    a.extend(add.iter().cloned());
    Ok(a)
}

/// `lvextend -l +<extents> [-i <k> [-I 64k]] <vg>/<lv> <on…>`: the LV grown over the PVs
/// `on` only. A striped LV is always given its stripes (`-i`), since LVM would otherwise
/// keep the last segment's count, which needs that many PVs with room.
pub fn lvextend_argv(devs: &[String], n: &Names, grow: &Grow) -> Result<Vec<String>> {
    let mut a = lvm("lvextend", devs)?;
    a.extend(["-l".to_string(), format!("+{}", grow.extents)]);
    if let Some(k) = grow.stripes {
        a.extend(["-i".to_string(), k.to_string()]);
        if k > 1 {
            a.extend(["-I".to_string(), format!("{STRIPE_SIZE_KIB}k")]);
        }
    }
    a.push(format!("{}/{}", n.vg, n.lv));
    a.extend(grow.on.iter().cloned());
    Ok(a)
}

/// An LVM version (`2.03.16`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32, pub u32);

/// The first LVM with `vgcreate --setautoactivation`.
pub const SETAUTOACTIVATION_SINCE: Version = Version(2, 3, 12);

/// `lvm version`.
pub fn version_argv() -> Vec<String> {
    ["lvm", "version"].map(String::from).to_vec()
}

/// The LVM version in the output of `lvm version` (`  LVM version:     2.03.16(2) (2022-05-18)`).
pub fn parse_version(out: &str) -> Option<Version> {
    let v = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("LVM version:"))?
        .trim();
    let end = v
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(v.len());
    let mut parts = v[..end].split('.').map(|p| p.parse::<u32>().ok());
    Some(Version(parts.next()??, parts.next()??, parts.next()??))
}

/// `vgcreate -s 4m --addtag <tag> [--setautoactivation n] <vg> <devs…>`. With `manual`
/// (LVM 2.03.12 or later, [`SETAUTOACTIVATION_SINCE`]) the host's own LVM never activates
/// the VG when its members appear (udev's `pvscan --cache -aay`): the CSI node activates it
/// at NodeStageVolume and deactivates it at NodeUnstageVolume, and nothing else does.
pub fn vgcreate_argv(devs: &[String], n: &Names, manual: bool) -> Result<Vec<String>> {
    let mut a = lvm("vgcreate", devs)?;
    a.extend(["--physicalextentsize", "4m", "--addtag", n.tag.as_str()].map(String::from));
    if manual {
        a.extend(["--setautoactivation".to_string(), "n".into()]);
    }
    a.push(n.vg.clone());
    a.extend(devs.iter().cloned());
    Ok(a)
}

/// `lvcreate -y -l <extents> [-i <n> -I 64k] -n <lv> <vg> <devs…>`: the devices in member
/// order, which is the order a linear LV concatenates them in.
pub fn lvcreate_argv(
    devs: &[String],
    n: &Names,
    layout: Layout,
    extents: u64,
) -> Result<Vec<String>> {
    let mut a = lvm("lvcreate", devs)?;
    a.extend(["-y".to_string(), "-l".into(), extents.to_string()]);
    if layout == Layout::Striped {
        a.extend([
            "-i".to_string(),
            devs.len().to_string(),
            "-I".into(),
            format!("{STRIPE_SIZE_KIB}k"),
        ]);
    }
    a.extend(["-n".to_string(), n.lv.clone(), n.vg.clone()]);
    a.extend(devs.iter().cloned());
    Ok(a)
}

/// `vgchange -a y|n <vg>`.
pub fn vgchange_argv(devs: &[String], vg: &str, active: bool) -> Result<Vec<String>> {
    let mut a = lvm("vgchange", devs)?;
    a.extend([
        "-a".to_string(),
        if active { "y" } else { "n" }.into(),
        vg.into(),
    ]);
    Ok(a)
}

/// `vgremove -y -f <vg>`: only to undo a VG this driver created in the same call.
pub fn vgremove_argv(devs: &[String], vg: &str) -> Result<Vec<String>> {
    let mut a = lvm("vgremove", devs)?;
    a.extend(["-y".to_string(), "-f".into(), vg.into()]);
    Ok(a)
}

/// `pvremove <devs…>` of orphan PVs: only to undo PVs this driver created in the same call.
pub fn pvremove_argv(devs: &[String], remove: &[String]) -> Result<Vec<String>> {
    let mut a = lvm("pvremove", devs)?;
    a.extend(remove.iter().cloned());
    Ok(a)
}

/// `dmsetup remove <dm-name>`: the LV's device when LVM no longer sees its VG (its members
/// are gone).
pub fn dmsetup_remove_argv(dm_name: &str) -> Vec<String> {
    ["dmsetup", "remove", dm_name].map(String::from).to_vec()
}

/// A row of `pvs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pv {
    /// Device (`/dev/nvme3n1`).
    pub name: String,
    /// PV uuid.
    pub uuid: String,
    /// Its VG, empty for an orphan PV.
    pub vg: String,
    /// Extents (0 for an orphan).
    pub pe_count: u64,
    /// Extents allocated to LVs.
    pub pe_alloc_count: u64,
}

/// A row of `vgs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vg {
    /// Name.
    pub name: String,
    /// UUID.
    pub uuid: String,
    /// Tags.
    pub tags: Vec<String>,
    /// PVs in its metadata.
    pub pv_count: u64,
    /// PVs in its metadata that were not found (outside the filter, or gone).
    pub missing_pv_count: u64,
    /// LVs.
    pub lv_count: u64,
    /// Extent size in bytes.
    pub extent_size: u64,
    /// Free extents.
    pub free_count: u64,
}

/// A row of `lvs` (one per segment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lv {
    /// Name.
    pub name: String,
    /// VG.
    pub vg: String,
    /// UUID.
    pub uuid: String,
    /// Bytes.
    pub size: u64,
    /// `/dev/<vg>/<lv>`.
    pub path: String,
    /// `/dev/mapper/<dm-name>`.
    pub dm_path: String,
    /// `lv_attr` (`-wi-a-----`: the fifth character is `a` when active).
    pub attr: String,
    /// `linear`, `striped`, …
    pub segtype: String,
    /// Stripes of this segment.
    pub stripes: u64,
    /// Stripe size in bytes (0 for linear).
    pub stripe_size: u64,
}

impl Lv {
    /// Whether the LV is active (its device-mapper device exists).
    pub fn active(&self) -> bool {
        self.attr.chars().nth(4) == Some('a')
    }
}

#[derive(Deserialize)]
struct Report {
    report: Vec<Section>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Section {
    pv: Vec<BTreeMap<String, String>>,
    vg: Vec<BTreeMap<String, String>>,
    lv: Vec<BTreeMap<String, String>>,
}

fn sections(what: &str, json: &str) -> Result<Vec<Section>> {
    serde_json::from_str::<Report>(json)
        .map(|r| r.report)
        .map_err(|e| CsiError::Internal(format!("{what} printed no JSON report LVM writes: {e}")))
}

struct Row<'a> {
    what: &'a str,
    row: BTreeMap<String, String>,
}

impl Row<'_> {
    fn text(&self, field: &str) -> String {
        self.row
            .get(field)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }

    /// A number; empty is 0. `--units b --nosuffix` prints plain numbers, a `B` is accepted.
    fn num(&self, field: &str) -> Result<u64> {
        let v = self.text(field);
        if v.is_empty() {
            return Ok(0);
        }
        v.strip_suffix(['B', 'b'])
            .unwrap_or(&v)
            .parse()
            .map_err(|_| {
                CsiError::Internal(format!(
                    "{}: field {field} is {v:?}, not a number",
                    self.what
                ))
            })
    }
}

/// Parses `pvs --reportformat json` ([`pvs_argv`]).
pub fn parse_pvs(json: &str) -> Result<Vec<Pv>> {
    sections("pvs", json)?
        .into_iter()
        .flat_map(|s| s.pv)
        .map(|row| {
            let r = Row { what: "pvs", row };
            Ok(Pv {
                name: r.text("pv_name"),
                uuid: r.text("pv_uuid"),
                vg: r.text("vg_name"),
                pe_count: r.num("pv_pe_count")?,
                pe_alloc_count: r.num("pv_pe_alloc_count")?,
            })
        })
        .collect()
}

/// Parses `vgs --reportformat json` ([`vgs_argv`]).
pub fn parse_vgs(json: &str) -> Result<Vec<Vg>> {
    sections("vgs", json)?
        .into_iter()
        .flat_map(|s| s.vg)
        .map(|row| {
            let r = Row { what: "vgs", row };
            Ok(Vg {
                name: r.text("vg_name"),
                uuid: r.text("vg_uuid"),
                tags: r
                    .text("vg_tags")
                    .split(',')
                    .filter(|t| !t.is_empty())
                    .map(str::to_string)
                    .collect(),
                pv_count: r.num("pv_count")?,
                missing_pv_count: r.num("vg_missing_pv_count")?,
                lv_count: r.num("lv_count")?,
                extent_size: r.num("vg_extent_size")?,
                free_count: r.num("vg_free_count")?,
            })
        })
        .collect()
}

/// Parses `lvs --reportformat json` ([`lvs_argv`]): one row per segment.
pub fn parse_lvs(json: &str) -> Result<Vec<Lv>> {
    sections("lvs", json)?
        .into_iter()
        .flat_map(|s| s.lv)
        .map(|row| {
            let r = Row { what: "lvs", row };
            Ok(Lv {
                name: r.text("lv_name"),
                vg: r.text("vg_name"),
                uuid: r.text("lv_uuid"),
                size: r.num("lv_size")?,
                path: r.text("lv_path"),
                dm_path: r.text("lv_dm_path"),
                attr: r.text("lv_attr"),
                segtype: r.text("segtype"),
                stripes: r.num("stripes")?,
                stripe_size: r.num("stripe_size")?,
            })
        })
        .collect()
}

/// What `blkid -p -o export` found on a device: `TYPE` (a file system, swap, an LVM label,
/// …) or `PTTYPE` (a partition table); `None` when it found nothing (exit status 2).
pub fn parse_signature(export: &str) -> Option<String> {
    let get = |key: &str| {
        export.lines().find_map(|l| {
            l.trim()
                .strip_prefix(key)
                .and_then(|v| v.strip_prefix('='))
                .map(str::to_string)
                .filter(|v| !v.is_empty())
        })
    };
    get("TYPE").or_else(|| get("PTTYPE").map(|t| format!("{t} partition table")))
}

/// One member as the host sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberDevice {
    /// The member AntstorVolume (for messages).
    pub volume: String,
    /// Its block device on this host.
    pub dev: String,
    /// What [`signature_argv`] found on it ([`parse_signature`]).
    pub signature: Option<String>,
}

/// What [`plan_vg`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VgPlan {
    /// No VG of this volume exists: `pvcreate` these members (the others are already orphan
    /// PVs, left by an attempt that stopped before its `vgcreate`), `vgcreate`, `lvcreate`.
    Create {
        /// Devices to `pvcreate`.
        pvcreate: Vec<String>,
    },
    /// The VG exists and consists of exactly the members.
    Existing,
    /// The VG exists over some of the members, and the others are blank or orphan PVs:
    /// members added by an expansion of the volume (ControllerExpandVolume places them after
    /// the ones the VG holds). `pvcreate` the blank ones, `vgextend` the VG by all of them;
    /// [`plan_grow`] then extends the LV over them.
    Extend {
        /// Devices to `pvcreate`.
        pvcreate: Vec<String>,
        /// Devices to `vgextend` the VG by (in member order).
        add: Vec<String>,
    },
}

/// Decides from `pvs` and `vgs` on the members what to do for the VG `n.vg`. Refused
/// (FAILED_PRECONDITION naming the device, the member and what is wrong): a member that is
/// a PV of another VG, a member with any other signature than an LVM label (a file system, a
/// partition table, …: data this driver did not write), a VG of that name without this
/// volume's tag, or one whose PVs are not exactly the members.
pub fn plan_vg(n: &Names, members: &[MemberDevice], pvs: &[Pv], vgs: &[Vg]) -> Result<VgPlan> {
    let id = n.tag.strip_prefix(TAG_PREFIX).unwrap_or(&n.tag);
    for m in members {
        if let Some(pv) = pvs.iter().find(|p| p.name == m.dev)
            && !pv.vg.is_empty()
            && pv.vg != n.vg
        {
            return Err(CsiError::FailedPrecondition(format!(
                "member device {} (volume {}) is a physical volume of LVM volume group {}, not of {}; refusing to use it for multi-disk volume {id}",
                m.dev, m.volume, pv.vg, n.vg
            )));
        }
    }
    let Some(vg) = vgs.iter().find(|v| v.name == n.vg) else {
        let mut pvcreate = Vec::new();
        for m in members {
            let is_pv = pvs.iter().any(|p| p.name == m.dev);
            match m.signature.as_deref() {
                None => pvcreate.push(m.dev.clone()),
                Some(LVM2_MEMBER) if is_pv => {}
                Some(sig) => {
                    return Err(CsiError::FailedPrecondition(format!(
                        "member device {} (volume {}) carries a {sig} signature; refusing to make it an LVM physical volume of multi-disk volume {id}: this driver never overwrites data it did not write (wipe the member's volume if its data is not needed)",
                        m.dev, m.volume
                    )));
                }
            }
        }
        return Ok(VgPlan::Create { pvcreate });
    };
    if !vg.tags.contains(&n.tag) {
        return Err(CsiError::FailedPrecondition(format!(
            "LVM volume group {} on the members of multi-disk volume {id} was not made for it (it lacks the tag {}; tags: {:?}); refusing to use it",
            n.vg, n.tag, vg.tags
        )));
    }
    let on_members: BTreeSet<&str> = pvs
        .iter()
        .filter(|p| p.vg == n.vg)
        .map(|p| p.name.as_str())
        .collect();
    let missing: Vec<&MemberDevice> = members
        .iter()
        .filter(|m| !on_members.contains(m.dev.as_str()))
        .collect();
    let inside = u64::try_from(members.len() - missing.len()).unwrap_or(u64::MAX);
    if vg.pv_count != inside || vg.missing_pv_count > 0 || inside == 0 {
        let not_in: Vec<String> = missing
            .iter()
            .map(|m| format!("{} (volume {})", m.dev, m.volume))
            .collect();
        return Err(CsiError::FailedPrecondition(format!(
            "LVM volume group {} has {} physical volumes ({} of them not among the members), multi-disk volume {id} has {} members{}; refusing to activate a volume group that is not exactly its members",
            n.vg,
            vg.pv_count,
            vg.missing_pv_count,
            members.len(),
            if not_in.is_empty() {
                String::new()
            } else {
                format!("; not in the volume group: {}", not_in.join(", "))
            }
        )));
    }
    if missing.is_empty() {
        return Ok(VgPlan::Existing);
    }
    // Members the VG does not hold yet: added by an expansion. Only blank devices (or PVs of
    // no VG, left by an extension that stopped before its vgextend) are taken.
    let mut pvcreate = Vec::new();
    for m in &missing {
        let is_pv = pvs.iter().any(|p| p.name == m.dev);
        match m.signature.as_deref() {
            None => pvcreate.push(m.dev.clone()),
            Some(LVM2_MEMBER) if is_pv => {}
            Some(sig) => {
                return Err(CsiError::FailedPrecondition(format!(
                    "member device {} (volume {}) carries a {sig} signature; refusing to add it to LVM volume group {} of multi-disk volume {id}: this driver never overwrites data it did not write (wipe the member's volume if its data is not needed)",
                    m.dev, m.volume, n.vg
                )));
            }
        }
    }
    Ok(VgPlan::Extend {
        pvcreate,
        add: missing.iter().map(|m| m.dev.clone()).collect(),
    })
}

/// Whether the LV must still be created in the VG whose LVs are `lvs` (a VG made by an
/// attempt that stopped before its `lvcreate` has none); a VG holding other LVs is refused.
pub fn plan_lv(n: &Names, lvs: &[Lv]) -> Result<bool> {
    let others: BTreeSet<&str> = lvs
        .iter()
        .filter(|l| l.name != n.lv)
        .map(|l| l.name.as_str())
        .collect();
    if !others.is_empty() {
        return Err(CsiError::FailedPrecondition(format!(
            "LVM volume group {} holds logical volumes {others:?} this driver did not make (it makes one, {})",
            n.vg, n.lv
        )));
    }
    Ok(!lvs.iter().any(|l| l.name == n.lv))
}

/// Extents of the LV over PVs with `pe_counts` extents each: all of them for linear, the
/// smallest member's times the members for striped (equal stripes).
pub fn extents(layout: Layout, pe_counts: &[u64]) -> Result<u64> {
    let n = u64::try_from(pe_counts.len()).unwrap_or(u64::MAX);
    let total = match layout {
        Layout::Linear => pe_counts.iter().sum(),
        Layout::Striped => pe_counts
            .iter()
            .min()
            .copied()
            .unwrap_or(0)
            .saturating_mul(n),
    };
    if total == 0 {
        return Err(CsiError::FailedPrecondition(format!(
            "the members' physical volumes have no free extent ({pe_counts:?}); a member must be larger than {} MiB",
            EXTENT_SIZE >> 20
        )));
    }
    Ok(total)
}

/// An extension of the LV decided by [`plan_grow`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grow {
    /// Extents added.
    pub extents: u64,
    /// Stripes of the new segment (striped LVs only; `Some(1)` is a linear segment).
    pub stripes: Option<usize>,
    /// The PVs it goes on, in member order.
    pub on: Vec<String>,
}

/// How to extend the LV of VG `vg` over the members' PVs `pvs` (`devs` in member order):
/// over the members holding no extent of it yet (added by an expansion), all of their
/// extents for linear, the smallest one's times their count for striped (a new segment
/// striped over them, or linear for one). `None` when no member is unused. Extents left free
/// on a PV the LV uses already (the larger member of an unequal striped group) are never
/// used: the LV's segments each cover their own members.
pub fn plan_grow(layout: Layout, vg: &str, devs: &[String], pvs: &[Pv]) -> Option<Grow> {
    let fresh: Vec<&Pv> = devs
        .iter()
        .filter_map(|d| pvs.iter().find(|p| &p.name == d && p.vg == vg))
        .filter(|p| p.pe_alloc_count == 0 && p.pe_count > 0)
        .collect();
    if fresh.is_empty() {
        return None;
    }
    let on = fresh.iter().map(|p| p.name.clone()).collect();
    let counts: Vec<u64> = fresh.iter().map(|p| p.pe_count).collect();
    let extents = extents(layout, &counts).ok()?;
    Some(Grow {
        extents,
        stripes: (layout == Layout::Striped).then_some(fresh.len()),
        on,
    })
}

/// Checks that the LV's segments (`lvs` rows of `n.lv`) have `layout` over `members`
/// members: linear segments; or striped, a first segment striped over several members and
/// each further one (an expansion, [`plan_grow`]) striped or linear over its own, the
/// segments' stripes adding up to the members.
pub fn check_layout(n: &Names, layout: Layout, members: usize, lvs: &[Lv]) -> Result<()> {
    let segs: Vec<&Lv> = lvs.iter().filter(|l| l.name == n.lv).collect();
    let ok = match layout {
        _ if segs.is_empty() => false,
        // A one-member group is linear whatever it asked for.
        _ if members == 1 => segs.iter().all(|s| s.segtype == "linear"),
        Layout::Linear => segs.iter().all(|s| s.segtype == "linear"),
        Layout::Striped => {
            let stripes: u64 = segs.iter().map(|s| s.stripes).sum();
            segs[0].segtype == "striped"
                && segs[0].stripes > 1
                && segs
                    .iter()
                    .all(|s| s.segtype == "striped" || (s.segtype == "linear" && s.stripes == 1))
                && usize::try_from(stripes).is_ok_and(|k| k == members)
        }
    };
    if ok {
        return Ok(());
    }
    let found: Vec<String> = segs
        .iter()
        .map(|s| format!("{} × {}", s.segtype, s.stripes))
        .collect();
    Err(CsiError::FailedPrecondition(format!(
        "logical volume {}/{} is {found:?}, but the multi-disk volume is {} over {members} members; refusing to mount a volume laid out otherwise",
        n.vg,
        n.lv,
        layout.word()
    )))
}

#[cfg(test)]
mod tests;
