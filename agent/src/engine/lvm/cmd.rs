//! The argv of every LVM and helper command the engine runs.

use std::path::Path;

/// Tag on a clone LV while its data is still being copied.
pub const CLONE_INCOMPLETE_TAG: &str = "liteio.clone-incomplete";

/// Fields `lvs` prints (segment fields included: one row per segment, first one kept).
pub const LV_FIELDS: &str = "lv_uuid,lv_name,lv_full_name,lv_path,lv_size,lv_attr,lv_layout,\
lv_device_open,lv_tags,origin,origin_size,segtype,stripes,stripe_size,vg_name";

/// Stripe size of striped LVs, as LiteIO.
pub const STRIPE_SIZE: &str = "128k";

fn v(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_string()).collect()
}

fn bytes(size: u64) -> String {
    format!("{size}B")
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// `vgs --options vg_all --reportformat json --units B`.
pub fn vgs() -> Vec<String> {
    v(&[
        "vgs",
        "--options",
        "vg_all",
        "--reportformat",
        "json",
        "--units",
        "B",
    ])
}

/// `lvs --options <LV_FIELDS> --reportformat json --units B <vg>`.
pub fn lvs(vg: &str) -> Vec<String> {
    lvs_report(LV_FIELDS, None, vg)
}

/// `lvs --options <fields> --reportformat json --units B [--select <select>] <vg>`.
fn lvs_report(fields: &str, select: Option<&str>, vg: &str) -> Vec<String> {
    let mut a = v(&[
        "lvs",
        "--options",
        fields,
        "--reportformat",
        "json",
        "--units",
        "B",
    ]);
    if let Some(s) = select {
        a.extend(v(&["--select", s]));
    }
    a.push(vg.to_string());
    a
}

/// `lvs --options <LV_FIELDS> --reportformat json --units B --select 'lv_name="a" || …' <vg>`:
/// only the named LVs (one row per segment). No such LV is an empty report and exit 0, so a
/// missing LV is told from a failed command. `names` is not empty.
///
/// Each name is quoted, so LVM's selection parser reads it as one string value: unquoted, a
/// value ends at LVM's selection operators (`&&`, `||`, `,`, `#`, `!`, brackets). A quote
/// inside a name would end the value early, so the names must have passed
/// [`check_name`](crate::engine::check_name), whose charset (`[A-Za-z0-9+_.-]`) has none of
/// these; the engine checks them again right before building this command. No shell sees
/// the argv.
pub fn lvs_named(vg: &str, names: &[&str]) -> Vec<String> {
    let select = names
        .iter()
        .map(|n| format!("lv_name=\"{n}\""))
        .collect::<Vec<_>>()
        .join(" || ");
    lvs_report(LV_FIELDS, Some(&select), vg)
}

/// Fields [`lvs_linear`] prints: what the layout rule reads.
pub const LINEAR_FIELDS: &str = "lv_name,segtype,vg_name";

/// `lvs --options lv_name,segtype,vg_name --reportformat json --units B --select
/// 'segtype=linear && seg_start=0' <vg>`: one row per LV whose first segment is linear, and
/// no other rows. These are the LVs the layout rule looks for, which it used to find in the
/// whole list of [`lvs`] (each LV by its first segment): `seg_start=0` keeps that, so an LV
/// striped first and extended linearly does not count.
pub fn lvs_linear(vg: &str) -> Vec<String> {
    lvs_report(LINEAR_FIELDS, Some("segtype=linear && seg_start=0"), vg)
}

/// `pvcreate <devs…>`.
pub fn pvcreate(devs: &[String]) -> Vec<String> {
    let mut a = v(&["pvcreate"]);
    a.extend(devs.iter().cloned());
    a
}

/// `vgcreate <vg> <devs…>`.
pub fn vgcreate(vg: &str, devs: &[String]) -> Vec<String> {
    let mut a = v(&["vgcreate", vg]);
    a.extend(devs.iter().cloned());
    a
}

/// `lvcreate -y -L <size>B [-i <stripes> -I 128k] [--addtag <tag>] -n <lv> <vg>`.
pub fn lvcreate(
    vg: &str,
    lv: &str,
    size: u64,
    stripes: Option<u32>,
    tag: Option<&str>,
) -> Vec<String> {
    let mut a = v(&["lvcreate", "-y", "-L", &bytes(size)]);
    if let Some(n) = stripes {
        a.extend(v(&["-i", &n.to_string(), "-I", STRIPE_SIZE]));
    }
    if let Some(t) = tag {
        a.extend(v(&["--addtag", t]));
    }
    a.extend(v(&["-n", lv, vg]));
    a
}

/// `lvcreate -s -L <reserve>B -n <snap> <vg>/<origin>`.
pub fn lvcreate_snapshot(vg: &str, origin: &str, snap: &str, reserve: u64) -> Vec<String> {
    v(&[
        "lvcreate",
        "-s",
        "-L",
        &bytes(reserve),
        "-n",
        snap,
        &format!("{vg}/{origin}"),
    ])
}

/// `lvconvert --merge <vg>/<snap>`.
pub fn lvconvert_merge(vg: &str, snap: &str) -> Vec<String> {
    v(&["lvconvert", "--merge", &format!("{vg}/{snap}")])
}

/// `lvextend -L <size>B <vg>/<lv>`.
pub fn lvextend(vg: &str, lv: &str, size: u64) -> Vec<String> {
    v(&["lvextend", "-L", &bytes(size), &format!("{vg}/{lv}")])
}

/// `lvremove -y <vg>/<lv>`.
pub fn lvremove(vg: &str, lv: &str) -> Vec<String> {
    v(&["lvremove", "-y", &format!("{vg}/{lv}")])
}

/// `lvchange --deltag <tag> <vg>/<lv>`.
pub fn lvchange_deltag(vg: &str, lv: &str, tag: &str) -> Vec<String> {
    v(&["lvchange", "--deltag", tag, &format!("{vg}/{lv}")])
}

/// `dd if=<src> of=<dst> bs=4M oflag=direct conv=fsync status=none` (clone data copy).
pub fn dd(src: &Path, dst: &Path) -> Vec<String> {
    v(&[
        "dd",
        &format!("if={}", path(src)),
        &format!("of={}", path(dst)),
        "bs=4M",
        "oflag=direct",
        "conv=fsync",
        "status=none",
    ])
}

/// `fallocate -l <size> <file>`.
pub fn fallocate(file: &Path, size: u64) -> Vec<String> {
    v(&["fallocate", "-l", &size.to_string(), &path(file)])
}
