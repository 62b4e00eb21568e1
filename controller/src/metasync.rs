//! MetaSync: mirrors pools, volumes and snapshots into SQL (LiteIO's MySQL sync, F27).
//!
//! SQLite is embedded (rusqlite, bundled). Unlike LiteIO, the schema ships with the code
//! ([`MIGRATIONS`], applied in order and tracked in `PRAGMA user_version`), rows are keyed by
//! (cluster, namespace, name) rather than ignoring the namespace, snapshots are mirrored too,
//! and the sweep for vanished objects runs after every full relist instead of an hourly
//! timer. Rows are upserted (only written when a column changed) and soft-deleted
//! (`status = 'deleted'`, `deleted_at` = unix seconds). PostgreSQL is not implemented.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use k8s_openapi::jiff::Timestamp;
use liteio_api::keys::labels;
use liteio_api::{AntstorSnapshot, AntstorVolume, StoragePool};
use rusqlite::types::Value;
use rusqlite::{Connection, params_from_iter};

use crate::error::{Error, Result};
use crate::plugin::{Kind, Plugin, PluginObject};
use crate::state::ObjectKey;

/// The schema, one migration per entry.
pub const MIGRATIONS: &[&str] = &[r"
CREATE TABLE IF NOT EXISTS storage_pool (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster_name TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    vg_type TEXT NOT NULL DEFAULT '',
    vg_name TEXT NOT NULL DEFAULT '',
    reserved_vol TEXT NOT NULL DEFAULT '[]',
    total_size INTEGER NOT NULL DEFAULT 0,
    free_size INTEGER NOT NULL DEFAULT 0,
    node_id TEXT NOT NULL DEFAULT '',
    node_ip TEXT NOT NULL DEFAULT '',
    node_hostname TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT '',
    created_at INTEGER NOT NULL DEFAULT 0,
    updated_at INTEGER NOT NULL DEFAULT 0,
    deleted_at INTEGER NOT NULL DEFAULT 0,
    UNIQUE (cluster_name, namespace, name)
);
CREATE TABLE IF NOT EXISTS antstor_volume (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster_name TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    uid TEXT NOT NULL DEFAULT '',
    labels TEXT NOT NULL DEFAULT '{}',
    pvc_ns TEXT NOT NULL DEFAULT '',
    pvc_name TEXT NOT NULL DEFAULT '',
    lvol_dev_path TEXT NOT NULL DEFAULT '',
    lvol_name TEXT NOT NULL DEFAULT '',
    is_thin INTEGER NOT NULL DEFAULT 0,
    position_advice TEXT NOT NULL DEFAULT '',
    size INTEGER NOT NULL DEFAULT 0,
    t_node_id TEXT NOT NULL DEFAULT '',
    h_node_id TEXT NOT NULL DEFAULT '',
    h_node_ip TEXT NOT NULL DEFAULT '',
    h_node_hostname TEXT NOT NULL DEFAULT '',
    spdk_subsys_nqn TEXT NOT NULL DEFAULT '',
    spdk_svc_id TEXT NOT NULL DEFAULT '',
    spdk_sn TEXT NOT NULL DEFAULT '',
    spdk_trans_type TEXT NOT NULL DEFAULT '',
    spdk_bdev_name TEXT NOT NULL DEFAULT '',
    spdk_ns_uuid TEXT NOT NULL DEFAULT '',
    spdk_address TEXT NOT NULL DEFAULT '',
    csi_staging_path TEXT NOT NULL DEFAULT '',
    csi_publish_path TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT '',
    created_at INTEGER NOT NULL DEFAULT 0,
    updated_at INTEGER NOT NULL DEFAULT 0,
    deleted_at INTEGER NOT NULL DEFAULT 0,
    UNIQUE (cluster_name, namespace, name)
);
CREATE INDEX IF NOT EXISTS antstor_volume_uid ON antstor_volume (uid);
CREATE TABLE IF NOT EXISTS antstor_snapshot (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster_name TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    uid TEXT NOT NULL DEFAULT '',
    origin_vol_name TEXT NOT NULL DEFAULT '',
    origin_vol_ns TEXT NOT NULL DEFAULT '',
    origin_vol_t_node_id TEXT NOT NULL DEFAULT '',
    vol_type TEXT NOT NULL DEFAULT '',
    size INTEGER NOT NULL DEFAULT 0,
    status TEXT NOT NULL DEFAULT '',
    created_at INTEGER NOT NULL DEFAULT 0,
    updated_at INTEGER NOT NULL DEFAULT 0,
    deleted_at INTEGER NOT NULL DEFAULT 0,
    UNIQUE (cluster_name, namespace, name)
);
"];

fn sql(action: impl Into<String>) -> impl FnOnce(rusqlite::Error) -> Error {
    let action = action.into();
    move |source| Error::Sql { action, source }
}

fn table(kind: Kind) -> &'static str {
    match kind {
        Kind::Volume => "antstor_volume",
        Kind::Pool => "storage_pool",
        Kind::Snapshot => "antstor_snapshot",
    }
}

type Row = Vec<(&'static str, Value)>;

fn text(s: impl Into<String>) -> Value {
    Value::Text(s.into())
}

fn int(n: u64) -> Value {
    Value::Integer(i64::try_from(n).unwrap_or(i64::MAX))
}

fn json_text<T: serde::Serialize>(v: &T) -> Value {
    text(serde_json::to_string(v).unwrap_or_default())
}

fn enum_text<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

fn volume_row(v: &AntstorVolume) -> Row {
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

fn pool_row(p: &StoragePool) -> Row {
    let mode = p.mode();
    let (vg_type, vg_name) = match mode {
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

fn snapshot_row(s: &AntstorSnapshot) -> Row {
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

fn unix(t: Timestamp) -> i64 {
    t.as_second()
}

/// The SQLite mirror.
#[derive(Debug, Clone)]
pub struct MetaSync {
    conn: Arc<Mutex<Connection>>,
    cluster: String,
}

impl MetaSync {
    /// Opens (creating when missing) the database at `path` and applies the migrations.
    pub fn open_sqlite(path: &Path, cluster: &str) -> Result<Self> {
        let conn = Connection::open(path)
            .map_err(sql(format!("open SQLite database {}", path.display())))?;
        Self::with_connection(conn, cluster)
    }

    /// An in-memory database (tests).
    pub fn in_memory(cluster: &str) -> Result<Self> {
        let conn = Connection::open_in_memory().map_err(sql("open in-memory SQLite"))?;
        Self::with_connection(conn, cluster)
    }

    fn with_connection(conn: Connection, cluster: &str) -> Result<Self> {
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(sql("read schema version"))?;
        let from = usize::try_from(version).unwrap_or(0);
        for (i, m) in MIGRATIONS.iter().enumerate().skip(from) {
            conn.execute_batch(m)
                .map_err(sql(format!("apply migration {}", i + 1)))?;
            conn.execute_batch(&format!("PRAGMA user_version = {}", i + 1))
                .map_err(sql("record schema version"))?;
        }
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            cluster: cluster.to_string(),
        })
    }

    /// Runs `f` on the connection on a blocking thread.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection, &str) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let conn = Arc::clone(&self.conn);
        let cluster = self.cluster.clone();
        tokio::task::spawn_blocking(move || {
            let c = conn.lock().unwrap_or_else(PoisonError::into_inner);
            f(&c, &cluster)
        })
        .await
        .map_err(|e| Error::Io {
            action: "run SQL on a blocking thread".into(),
            source: std::io::Error::other(e),
        })?
    }

    fn upsert_sync(
        c: &Connection,
        cluster: &str,
        kind: Kind,
        key: &ObjectKey,
        row: Row,
        now: i64,
    ) -> Result<()> {
        let t = table(kind);
        let mut cols = vec!["cluster_name", "namespace", "name"];
        let mut vals = vec![
            text(cluster),
            text(key.namespace.clone()),
            text(key.name.clone()),
        ];
        for (c, v) in &row {
            cols.push(c);
            vals.push(v.clone());
        }
        let placeholders: Vec<String> = (1..=cols.len() + 2).map(|i| format!("?{i}")).collect();
        let set: Vec<String> = row
            .iter()
            .map(|(c, _)| format!("{c} = excluded.{c}"))
            .collect();
        let changed: Vec<String> = row
            .iter()
            .map(|(c, _)| format!("{t}.{c} IS NOT excluded.{c}"))
            .collect();
        let stmt = format!(
            "INSERT INTO {t} ({}, created_at, updated_at) VALUES ({}) \
             ON CONFLICT (cluster_name, namespace, name) DO UPDATE SET {}, \
             updated_at = excluded.updated_at, deleted_at = 0 \
             WHERE {} OR {t}.deleted_at != 0",
            cols.join(", "),
            placeholders.join(", "),
            set.join(", "),
            changed.join(" OR "),
        );
        vals.push(Value::Integer(now));
        vals.push(Value::Integer(now));
        c.execute(&stmt, params_from_iter(vals))
            .map_err(sql(format!("upsert {t} row {key}")))?;
        Ok(())
    }

    fn mark_deleted_sync(
        c: &Connection,
        cluster: &str,
        kind: Kind,
        key: &ObjectKey,
        at: i64,
    ) -> Result<()> {
        let t = table(kind);
        c.execute(
            &format!(
                "UPDATE {t} SET status = 'deleted', deleted_at = ?1, updated_at = ?1 \
                 WHERE cluster_name = ?2 AND namespace = ?3 AND name = ?4 AND deleted_at = 0"
            ),
            rusqlite::params![at, cluster, key.namespace, key.name],
        )
        .map_err(sql(format!("mark {t} row {key} deleted")))?;
        Ok(())
    }

    /// Inserts or updates the row of an object.
    pub async fn upsert(&self, obj: PluginObject<'_>) -> Result<()> {
        let (kind, key, row) = match obj {
            PluginObject::Volume(v) => (Kind::Volume, ObjectKey::of(v), volume_row(v)),
            PluginObject::Pool(p) => (Kind::Pool, ObjectKey::of(p), pool_row(p)),
            PluginObject::Snapshot(s) => (Kind::Snapshot, ObjectKey::of(s), snapshot_row(s)),
        };
        let now = unix(Timestamp::now());
        self.with(move |c, cl| Self::upsert_sync(c, cl, kind, &key, row, now))
            .await
    }

    /// Marks the row of an object deleted at `at`.
    pub async fn mark_deleted(&self, kind: Kind, key: &ObjectKey, at: Timestamp) -> Result<()> {
        let key = key.clone();
        let at = unix(at);
        self.with(move |c, cl| Self::mark_deleted_sync(c, cl, kind, &key, at))
            .await
    }

    /// Marks every live row of `kind` whose object is not in `live` deleted.
    pub async fn sweep_rows(&self, kind: Kind, live: Vec<ObjectKey>) -> Result<usize> {
        let now = unix(Timestamp::now());
        self.with(move |c, cl| {
            let t = table(kind);
            let mut stmt = c
                .prepare(&format!(
                    "SELECT namespace, name FROM {t} WHERE cluster_name = ?1 AND deleted_at = 0"
                ))
                .map_err(sql(format!("list {t} rows")))?;
            let rows: Vec<ObjectKey> = stmt
                .query_map([cl], |r| {
                    Ok(ObjectKey::new(
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                    ))
                })
                .map_err(sql(format!("list {t} rows")))?
                .filter_map(std::result::Result::ok)
                .collect();
            let live: std::collections::HashSet<ObjectKey> = live.into_iter().collect();
            let mut n = 0;
            for k in rows.iter().filter(|k| !live.contains(*k)) {
                Self::mark_deleted_sync(c, cl, kind, k, now)?;
                n += 1;
            }
            Ok(n)
        })
        .await
    }

    /// Reads one row as column → value text (tests and debugging).
    pub async fn row(&self, kind: Kind, key: &ObjectKey) -> Result<Option<Vec<(String, String)>>> {
        let key = key.clone();
        self.with(move |c, cl| {
            let t = table(kind);
            let mut stmt = c
                .prepare(&format!(
                    "SELECT * FROM {t} WHERE cluster_name = ?1 AND namespace = ?2 AND name = ?3"
                ))
                .map_err(sql(format!("read {t} row")))?;
            let names: Vec<String> = stmt.column_names().map(|s| s.to_string()).collect();
            let mut rows = stmt
                .query(rusqlite::params![cl, key.namespace, key.name])
                .map_err(sql(format!("read {t} row")))?;
            let Some(r) = rows.next().map_err(sql(format!("read {t} row")))? else {
                return Ok(None);
            };
            let mut out = Vec::new();
            for (i, n) in names.iter().enumerate() {
                let v: Value = r.get(i).map_err(sql(format!("read {t}.{n}")))?;
                let s = match v {
                    Value::Null => String::new(),
                    Value::Integer(i) => i.to_string(),
                    Value::Real(f) => f.to_string(),
                    Value::Text(s) => s,
                    Value::Blob(b) => format!("{b:?}"),
                };
                out.push((n.clone(), s));
            }
            Ok(Some(out))
        })
        .await
    }
}

fn deletion_time(obj: PluginObject<'_>) -> Timestamp {
    let meta = match obj {
        PluginObject::Volume(v) => &v.metadata,
        PluginObject::Pool(p) => &p.metadata,
        PluginObject::Snapshot(s) => &s.metadata,
    };
    meta.deletion_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or_else(Timestamp::now)
}

fn kind_key(obj: PluginObject<'_>) -> (Kind, ObjectKey) {
    match obj {
        PluginObject::Volume(v) => (Kind::Volume, ObjectKey::of(v)),
        PluginObject::Pool(p) => (Kind::Pool, ObjectKey::of(p)),
        PluginObject::Snapshot(s) => (Kind::Snapshot, ObjectKey::of(s)),
    }
}

impl Plugin for MetaSync {
    fn name(&self) -> &'static str {
        "MetaSync"
    }

    fn reconcile<'a>(&'a self, obj: PluginObject<'a>) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.upsert(obj))
    }

    fn handle_deletion<'a>(&'a self, obj: PluginObject<'a>) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.upsert(obj).await?;
            let (kind, key) = kind_key(obj);
            self.mark_deleted(kind, &key, deletion_time(obj)).await
        })
    }

    fn forget<'a>(&'a self, kind: Kind, key: &'a ObjectKey) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.mark_deleted(kind, key, Timestamp::now()))
    }

    fn sweep<'a>(&'a self, kind: Kind, live: Vec<ObjectKey>) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.sweep_rows(kind, live).await.map(|_| ()) })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::testing::*;
    use liteio_api::size::GIB;

    fn col(row: &[(String, String)], name: &str) -> String {
        row.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap()
    }

    #[tokio::test]
    async fn upsert_update_delete_sweep() {
        let m = MetaSync::in_memory("c1").unwrap();
        let v = volume("v1", GIB).host("h1");
        m.upsert(PluginObject::Volume(&v.0)).await.unwrap();
        let key = ObjectKey::new("obnvmf", "v1");
        let row = m.row(Kind::Volume, &key).await.unwrap().unwrap();
        assert_eq!(col(&row, "size"), (GIB).to_string());
        assert_eq!(col(&row, "t_node_id"), "");
        assert_eq!(col(&row, "status"), "creating");
        let id = col(&row, "id");
        let v2 = v.clone().size(2 * GIB).scheduled_to("n1");
        m.upsert(PluginObject::Volume(&v2.0)).await.unwrap();
        m.upsert(PluginObject::Volume(&v2.0)).await.unwrap();
        let row = m.row(Kind::Volume, &key).await.unwrap().unwrap();
        assert_eq!(col(&row, "id"), id);
        assert_eq!(col(&row, "size"), (2 * GIB).to_string());
        assert_eq!(col(&row, "t_node_id"), "n1");
        assert_eq!(col(&row, "h_node_id"), "h1");
        m.handle_deletion(PluginObject::Volume(&v2.clone().deleting().0))
            .await
            .unwrap();
        let row = m.row(Kind::Volume, &key).await.unwrap().unwrap();
        assert_eq!(col(&row, "status"), "deleted");
        assert_ne!(col(&row, "deleted_at"), "0");

        let p = pool("n1", 10 * GIB);
        m.upsert(PluginObject::Pool(&p.0)).await.unwrap();
        let pk = ObjectKey::new("obnvmf", "n1");
        assert_eq!(
            col(&m.row(Kind::Pool, &pk).await.unwrap().unwrap(), "status"),
            "ready"
        );
        assert_eq!(m.sweep_rows(Kind::Pool, vec![]).await.unwrap(), 1);
        assert_eq!(m.sweep_rows(Kind::Pool, vec![]).await.unwrap(), 0);
        assert_eq!(
            col(&m.row(Kind::Pool, &pk).await.unwrap().unwrap(), "status"),
            "deleted"
        );
    }

    #[test]
    fn reopening_keeps_the_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        drop(MetaSync::open_sqlite(&path, "c").unwrap());
        drop(MetaSync::open_sqlite(&path, "c").unwrap());
    }
}
