//! The row model both backends share: the one place that turns a pool, volume or snapshot
//! into the columns of its table, and the upsert statement built from those columns.
//!
//! Every backend stores the same columns with the same meaning: text columns as text,
//! integer columns as 64-bit integers, times as unix seconds. Only the SQL dialect differs
//! ([`Dialect`]).

use liteio_api::keys::labels;
use liteio_api::{AntstorSnapshot, AntstorVolume, StoragePool};

use crate::plugin::{Kind, PluginObject};
use crate::state::ObjectKey;

/// One column value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    /// A `TEXT` column.
    Text(String),
    /// An integer column (`INTEGER` in SQLite, `BIGINT` in PostgreSQL).
    Int(i64),
}

impl std::fmt::Display for Cell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Text(s) => f.write_str(s),
            Self::Int(n) => write!(f, "{n}"),
        }
    }
}

/// The row of one object: its table, its key and its data columns (the key columns
/// `cluster_name`, `namespace`, `name` and the bookkeeping columns `id`, `created_at`,
/// `updated_at`, `deleted_at` are not among `cells`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Which kind of object.
    pub kind: Kind,
    /// Namespace and name.
    pub key: ObjectKey,
    /// Data columns, in table order.
    pub cells: Vec<(&'static str, Cell)>,
}

impl Row {
    /// The row of `obj`.
    pub fn of(obj: PluginObject<'_>) -> Self {
        match obj {
            PluginObject::Volume(v) => Self {
                kind: Kind::Volume,
                key: ObjectKey::of(v),
                cells: volume_cells(v),
            },
            PluginObject::Pool(p) => Self {
                kind: Kind::Pool,
                key: ObjectKey::of(p),
                cells: pool_cells(p),
            },
            PluginObject::Snapshot(s) => Self {
                kind: Kind::Snapshot,
                key: ObjectKey::of(s),
                cells: snapshot_cells(s),
            },
        }
    }

    /// The value of column `name`, if it is a data column.
    pub fn get(&self, name: &str) -> Option<&Cell> {
        self.cells.iter().find(|(n, _)| *n == name).map(|(_, c)| c)
    }
}

/// The table of `kind`.
pub fn table(kind: Kind) -> &'static str {
    match kind {
        Kind::Volume => "antstor_volume",
        Kind::Pool => "storage_pool",
        Kind::Snapshot => "antstor_snapshot",
    }
}

/// The SQL dialect of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `?1` placeholders, `IS NOT` for null-safe inequality.
    Sqlite,
    /// `$1` placeholders, `IS DISTINCT FROM`.
    Postgres,
}

impl Dialect {
    fn placeholder(self, i: usize) -> String {
        match self {
            Self::Sqlite => format!("?{i}"),
            Self::Postgres => format!("${i}"),
        }
    }

    fn differs(self) -> &'static str {
        match self {
            Self::Sqlite => "IS NOT",
            Self::Postgres => "IS DISTINCT FROM",
        }
    }
}

/// The upsert statement of `row` in `dialect`. Its parameters, in order: `cluster_name`,
/// `namespace`, `name`, the row's cells, `created_at`, `updated_at`.
///
/// A new row is inserted. An existing row is written only when a data column changed or it
/// was soft-deleted (then it is live again: `deleted_at = 0`); otherwise the statement
/// affects no row, so `updated_at` is the time of the last real change.
pub fn upsert_sql(dialect: Dialect, row: &Row) -> String {
    let t = table(row.kind);
    let mut cols = vec!["cluster_name", "namespace", "name"];
    cols.extend(row.cells.iter().map(|(c, _)| *c));
    cols.extend(["created_at", "updated_at"]);
    let placeholders: Vec<String> = (1..=cols.len()).map(|i| dialect.placeholder(i)).collect();
    let set: Vec<String> = row
        .cells
        .iter()
        .map(|(c, _)| format!("{c} = excluded.{c}"))
        .collect();
    let changed: Vec<String> = row
        .cells
        .iter()
        .map(|(c, _)| format!("{t}.{c} {} excluded.{c}", dialect.differs()))
        .collect();
    format!(
        "INSERT INTO {t} ({}) VALUES ({}) \
         ON CONFLICT (cluster_name, namespace, name) DO UPDATE SET {}, \
         updated_at = excluded.updated_at, deleted_at = 0 \
         WHERE {} OR {t}.deleted_at <> 0",
        cols.join(", "),
        placeholders.join(", "),
        set.join(", "),
        changed.join(" OR "),
    )
}

fn text(s: impl Into<String>) -> Cell {
    Cell::Text(s.into())
}

fn int(n: u64) -> Cell {
    Cell::Int(i64::try_from(n).unwrap_or(i64::MAX))
}

fn json_text<T: serde::Serialize>(v: &T) -> Cell {
    text(serde_json::to_string(v).unwrap_or_default())
}

fn enum_text<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

fn volume_cells(v: &AntstorVolume) -> Vec<(&'static str, Cell)> {
    let l = v.metadata.labels.clone().unwrap_or_default();
    let host = v.spec.host_node.clone().unwrap_or_default();
    let t = v.spec.spdk_target.clone().unwrap_or_default();
    let (dev, lvol) = match (&v.spec.kernel_lvol, &v.spec.spdk_lvol) {
        (Some(k), _) => (k.dev_path.clone(), k.name.clone()),
        (None, Some(s)) => (String::new(), s.lvs_name.clone()),
        _ => (String::new(), String::new()),
    };
    let pub_params = v
        .status
        .as_ref()
        .and_then(|s| s.csi_node_pub_params.clone())
        .unwrap_or_default();
    vec![
        ("uid", text(v.spec.uuid.clone())),
        ("labels", json_text(&l)),
        (
            "pvc_ns",
            text(l.get(labels::PVC_NAMESPACE).cloned().unwrap_or_default()),
        ),
        (
            "pvc_name",
            text(l.get(labels::PVC_NAME).cloned().unwrap_or_default()),
        ),
        ("lvol_dev_path", text(dev)),
        ("lvol_name", text(lvol)),
        ("is_thin", int(u64::from(v.spec.is_thin))),
        ("position_advice", text(v.spec.position_advice.to_string())),
        ("size", int(v.spec.size_byte)),
        ("t_node_id", text(v.spec.target_node_id.clone())),
        ("h_node_id", text(host.id)),
        ("h_node_ip", text(host.ip)),
        ("h_node_hostname", text(host.hostname)),
        ("spdk_subsys_nqn", text(t.subsys_nqn)),
        ("spdk_svc_id", text(t.svc_id)),
        ("spdk_sn", text(t.sn)),
        ("spdk_trans_type", text(t.trans_type)),
        ("spdk_bdev_name", text(t.bdev_name)),
        ("spdk_ns_uuid", text(t.ns_uuid)),
        ("spdk_address", text(t.address)),
        ("csi_staging_path", text(pub_params.staging_target_path)),
        ("csi_publish_path", text(pub_params.target_path)),
        ("status", text(enum_text(&v.phase()))),
    ]
}

fn pool_cells(p: &StoragePool) -> Vec<(&'static str, Cell)> {
    let (vg_type, vg_name) = match p.mode() {
        Some(liteio_api::PoolMode::KernelLVM) => ("KernelLVol", p.spec.kernel_lvm.name.clone()),
        Some(liteio_api::PoolMode::SpdkLVStore) => ("SpdkLVol", p.spec.spdk_lv_store.name.clone()),
        None => ("", String::new()),
    };
    let status = p
        .status
        .as_ref()
        .and_then(|s| s.status)
        .map(|s| enum_text(&s))
        .unwrap_or_default();
    vec![
        ("vg_type", text(vg_type)),
        ("vg_name", text(vg_name)),
        ("reserved_vol", json_text(&p.spec.kernel_lvm.reserved_lvol)),
        ("total_size", int(p.total_bytes())),
        ("free_size", int(p.reported_free_bytes())),
        ("node_id", text(p.spec.node_info.id.clone())),
        ("node_ip", text(p.spec.node_info.ip.clone())),
        ("node_hostname", text(p.spec.node_info.hostname.clone())),
        ("status", text(status)),
    ]
}

fn snapshot_cells(s: &AntstorSnapshot) -> Vec<(&'static str, Cell)> {
    vec![
        ("uid", text(s.spec.uuid.clone())),
        ("origin_vol_name", text(s.spec.origin_vol_name.clone())),
        ("origin_vol_ns", text(s.spec.origin_vol_namespace.clone())),
        (
            "origin_vol_t_node_id",
            text(s.spec.origin_vol_target_node_id.clone()),
        ),
        ("vol_type", text(enum_text(&s.spec.vol_type))),
        ("size", int(u64::try_from(s.spec.size).unwrap_or(0))),
        (
            "status",
            text(
                s.status
                    .as_ref()
                    .map(|st| enum_text(&st.status))
                    .unwrap_or_default(),
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::testing::*;
    use liteio_api::size::GIB;

    fn cell(row: &Row, name: &str) -> String {
        row.get(name).unwrap().to_string()
    }

    #[test]
    fn volume_columns() {
        let v = volume("v1", 2 * GIB)
            .scheduled_to("n1")
            .host("h1")
            .thin()
            .label(labels::PVC_NAME, "claim")
            .build();
        let r = Row::of(PluginObject::Volume(&v));
        assert_eq!(r.kind, Kind::Volume);
        assert_eq!(r.key, ObjectKey::new("obnvmf", "v1"));
        assert_eq!(r.get("size"), Some(&Cell::Int(2 * GIB as i64)));
        assert_eq!(r.get("is_thin"), Some(&Cell::Int(1)));
        assert_eq!(cell(&r, "t_node_id"), "n1");
        assert_eq!(cell(&r, "h_node_id"), "h1");
        assert_eq!(cell(&r, "pvc_name"), "claim");
        assert!(cell(&r, "labels").contains("\"claim\""));
        assert_eq!(cell(&r, "status"), "creating");
    }

    #[test]
    fn pool_and_snapshot_columns() {
        let p = pool("n1", 10 * GIB).lvm().build();
        let r = Row::of(PluginObject::Pool(&p));
        assert_eq!(table(r.kind), "storage_pool");
        assert_eq!(cell(&r, "vg_type"), "KernelLVol");
        assert_eq!(r.get("total_size"), Some(&Cell::Int(10 * GIB as i64)));
        assert_eq!(cell(&r, "node_id"), "n1");
        assert_eq!(cell(&r, "status"), "ready");

        let s = snapshot("s1", "v1", GIB).bound_to("n1").build();
        let r = Row::of(PluginObject::Snapshot(&s));
        assert_eq!(table(r.kind), "antstor_snapshot");
        assert_eq!(cell(&r, "origin_vol_name"), "v1");
        assert_eq!(cell(&r, "origin_vol_t_node_id"), "n1");
        assert_eq!(cell(&r, "vol_type"), "SpdkLVol");
        assert_eq!(r.get("size"), Some(&Cell::Int(GIB as i64)));
        assert_eq!(cell(&r, "status"), "");
    }

    #[test]
    fn a_negative_snapshot_size_is_zero_not_an_error() {
        let mut s = snapshot("s1", "v1", GIB).build();
        s.spec.size = -1;
        let r = Row::of(PluginObject::Snapshot(&s));
        assert_eq!(r.get("size"), Some(&Cell::Int(0)));
    }

    #[test]
    fn upsert_statement_per_dialect() {
        let p = pool("n1", GIB).build();
        let r = Row::of(PluginObject::Pool(&p));
        let n = 3 + r.cells.len() + 2;
        let lite = upsert_sql(Dialect::Sqlite, &r);
        assert!(lite.contains(&format!("?{n})")), "{lite}");
        assert!(lite.contains("storage_pool.status IS NOT excluded.status"));
        let pg = upsert_sql(Dialect::Postgres, &r);
        assert!(pg.contains(&format!("${n})")), "{pg}");
        assert!(!pg.contains('?'));
        assert!(pg.contains("storage_pool.free_size IS DISTINCT FROM excluded.free_size"));
        assert!(pg.contains("OR storage_pool.deleted_at <> 0"));
    }
}
