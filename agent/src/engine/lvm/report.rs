//! LVM's JSON reports (`--reportformat json --units B`).
//!
//! Every value is a string; sizes carry a `B` suffix (`"1069547520B"`). Unknown fields are
//! ignored (`--options vg_all` prints dozens), and so is a `log` section.

use serde::Deserialize;

/// A volume group row of `vgs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vg {
    /// VG name.
    pub name: String,
    /// VG UUID.
    pub uuid: String,
    /// Size in bytes.
    pub size: u64,
    /// Free bytes.
    pub free: u64,
    /// Extent size in bytes.
    pub extent_size: u64,
    /// Number of extents.
    pub extent_count: u64,
    /// Number of PVs.
    pub pv_count: u32,
}

/// A logical volume row of `lvs` (one per LV, first segment's segment fields).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lv {
    /// LV name.
    pub name: String,
    /// VG name.
    pub vg_name: String,
    /// LV UUID.
    pub uuid: String,
    /// Size in bytes (for a snapshot: its copy-on-write space).
    pub size: u64,
    /// `/dev/<vg>/<lv>`.
    pub path: String,
    /// `lv_attr`, e.g. `-wi-ao----`, `swi-a-s---`.
    pub attr: String,
    /// Device is open.
    pub open: bool,
    /// Tags.
    pub tags: Vec<String>,
    /// Origin LV of a snapshot.
    pub origin: Option<String>,
    /// Origin size of a snapshot.
    pub origin_size: Option<u64>,
    /// `linear`, `striped`, `thin`, …
    pub segtype: String,
    /// Stripe count of the first segment.
    pub stripes: u32,
}

impl Lv {
    /// Whether the LV is a snapshot (has an origin).
    pub fn is_snapshot(&self) -> bool {
        self.origin.is_some()
    }

    /// Whether a snapshot merge into the origin is under way (`S` in `lv_attr`).
    pub fn is_merging(&self) -> bool {
        self.attr.starts_with('S')
    }
}

/// A row of [`lvs_linear`](super::cmd::lvs_linear): an LV and the type of its first segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LvSegtype {
    /// LV name.
    pub name: String,
    /// VG name.
    pub vg_name: String,
    /// `linear`, `striped`, `thin`, …
    pub segtype: String,
}

#[derive(Deserialize)]
struct Report {
    report: Vec<Section>,
}

#[derive(Deserialize, Default)]
struct Section {
    #[serde(default)]
    vg: Vec<VgRow>,
    #[serde(default)]
    lv: Vec<LvRow>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct VgRow {
    vg_name: String,
    vg_uuid: String,
    vg_size: String,
    vg_free: String,
    vg_extent_size: String,
    vg_extent_count: String,
    pv_count: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct LvRow {
    lv_uuid: String,
    lv_name: String,
    lv_path: String,
    lv_size: String,
    lv_attr: String,
    lv_device_open: String,
    lv_tags: String,
    origin: String,
    origin_size: String,
    segtype: String,
    stripes: String,
    vg_name: String,
}

/// `"1069547520B"` → 1069547520; also accepts no suffix.
pub fn parse_bytes(field: &str, value: &str) -> Result<u64, String> {
    let v = value.trim();
    let digits = v.strip_suffix(['B', 'b']).unwrap_or(v);
    digits
        .parse()
        .map_err(|_| format!("{field} {value:?} is not a byte count like \"1069547520B\""))
}

fn parse_num<T: std::str::FromStr>(field: &str, value: &str) -> Result<T, String> {
    value
        .trim()
        .parse()
        .map_err(|_| format!("{field} {value:?} is not a number"))
}

fn parse_report(json: &str) -> Result<Vec<Section>, String> {
    let r: Report = serde_json::from_str(json).map_err(|e| format!("bad JSON: {e}"))?;
    Ok(r.report)
}

/// Parses `vgs --options vg_all --reportformat json --units B`.
pub fn parse_vgs(json: &str) -> Result<Vec<Vg>, String> {
    let mut out = Vec::new();
    for row in parse_report(json)?.into_iter().flat_map(|s| s.vg) {
        out.push(Vg {
            size: parse_bytes("vg_size", &row.vg_size)?,
            free: parse_bytes("vg_free", &row.vg_free)?,
            extent_size: parse_bytes("vg_extent_size", &row.vg_extent_size)?,
            extent_count: parse_num("vg_extent_count", &row.vg_extent_count)?,
            pv_count: parse_num("pv_count", &row.pv_count)?,
            name: row.vg_name,
            uuid: row.vg_uuid,
        });
    }
    Ok(out)
}

/// Parses `lvs --options … --reportformat json --units B`; rows of further segments of an
/// LV already seen are dropped.
pub fn parse_lvs(json: &str) -> Result<Vec<Lv>, String> {
    let mut out: Vec<Lv> = Vec::new();
    for row in parse_report(json)?.into_iter().flat_map(|s| s.lv) {
        if out
            .iter()
            .any(|l| l.name == row.lv_name && l.vg_name == row.vg_name)
        {
            continue;
        }
        let origin_size = if row.origin_size.trim().is_empty() {
            None
        } else {
            Some(parse_bytes("origin_size", &row.origin_size)?)
        };
        let stripes = if row.stripes.trim().is_empty() {
            1
        } else {
            parse_num("stripes", &row.stripes)?
        };
        out.push(Lv {
            size: parse_bytes("lv_size", &row.lv_size)?,
            open: row.lv_device_open == "open",
            tags: row
                .lv_tags
                .split(',')
                .filter(|t| !t.is_empty())
                .map(str::to_string)
                .collect(),
            origin: Some(row.origin).filter(|o| !o.is_empty()),
            origin_size,
            stripes,
            name: row.lv_name,
            vg_name: row.vg_name,
            uuid: row.lv_uuid,
            path: row.lv_path,
            attr: row.lv_attr,
            segtype: row.segtype,
        });
    }
    Ok(out)
}

/// Parses `lvs --options lv_name,segtype,vg_name --reportformat json`.
pub fn parse_lv_segtypes(json: &str) -> Result<Vec<LvSegtype>, String> {
    Ok(parse_report(json)?
        .into_iter()
        .flat_map(|s| s.lv)
        .map(|row| LvSegtype {
            name: row.lv_name,
            vg_name: row.vg_name,
            segtype: row.segtype,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn bytes() {
        assert_eq!(parse_bytes("x", "1069547520B").unwrap(), 1_069_547_520);
        assert_eq!(parse_bytes("x", "0B").unwrap(), 0);
        assert_eq!(parse_bytes("x", "42").unwrap(), 42);
        assert!(parse_bytes("x", "1.5g").is_err());
        assert!(parse_bytes("x", "").is_err());
    }

    #[test]
    fn empty_report() {
        assert!(parse_vgs(r#"{"report":[{"vg":[]}]}"#).unwrap().is_empty());
        assert!(parse_lvs(r#"{"report":[{"lv":[]}]}"#).unwrap().is_empty());
        assert!(
            parse_lv_segtypes(r#"{"report":[{"lv":[]}]}"#)
                .unwrap()
                .is_empty()
        );
        assert!(parse_lv_segtypes("not json").is_err());
        assert!(parse_vgs("not json").is_err());
    }
}
