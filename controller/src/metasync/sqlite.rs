//! The SQLite backend (embedded, rusqlite with the bundled library): the default target.
//!
//! The schema version is `PRAGMA user_version`. Every statement runs on a blocking thread
//! under one connection lock.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use rusqlite::types::Value;
use rusqlite::{Connection, params_from_iter};

use super::row::{self, Cell, Dialect, Row};
use crate::error::{Error, Result};
use crate::plugin::Kind;
use crate::state::ObjectKey;

/// The schema, one migration per entry. Never edit a shipped entry: append a new one.
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

fn value(c: &Cell) -> Value {
    match c {
        Cell::Text(s) => Value::Text(s.clone()),
        Cell::Int(n) => Value::Integer(*n),
    }
}

/// A SQLite database.
#[derive(Debug, Clone)]
pub struct Sqlite {
    conn: Arc<Mutex<Connection>>,
}

impl Sqlite {
    /// Opens (creating when missing) the database at `path` and applies the migrations.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open(path)
            .map_err(sql(format!("open SQLite database {}", path.display())))?;
        Self::with_connection(conn)
    }

    /// An in-memory database (tests).
    pub fn in_memory() -> Result<Self> {
        let conn = Connection::open_in_memory().map_err(sql("open in-memory SQLite"))?;
        Self::with_connection(conn)
    }

    fn with_connection(conn: Connection) -> Result<Self> {
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(sql("read SQLite schema version"))?;
        let from = usize::try_from(version).unwrap_or(0);
        for (i, m) in MIGRATIONS.iter().enumerate().skip(from) {
            conn.execute_batch(m)
                .map_err(sql(format!("apply SQLite migration {}", i + 1)))?;
            conn.execute_batch(&format!("PRAGMA user_version = {}", i + 1))
                .map_err(sql("record SQLite schema version"))?;
        }
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs `f` on the connection on a blocking thread.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            let c = conn.lock().unwrap_or_else(PoisonError::into_inner);
            f(&c)
        })
        .await
        .map_err(|e| Error::Io {
            action: "run SQL on a blocking thread".into(),
            source: std::io::Error::other(e),
        })?
    }

    /// See [`super::MetaSync::upsert`].
    pub async fn upsert(&self, cluster: String, row: Row, now: i64) -> Result<bool> {
        self.with(move |c| {
            let stmt = row::upsert_sql(Dialect::Sqlite, &row);
            let mut vals = vec![
                Value::Text(cluster),
                Value::Text(row.key.namespace.clone()),
                Value::Text(row.key.name.clone()),
            ];
            vals.extend(row.cells.iter().map(|(_, v)| value(v)));
            vals.extend([Value::Integer(now), Value::Integer(now)]);
            let n = c
                .execute(&stmt, params_from_iter(vals))
                .map_err(sql(format!(
                    "upsert {} row {}",
                    row::table(row.kind),
                    row.key
                )))?;
            Ok(n > 0)
        })
        .await
    }

    fn mark_deleted_sync(
        c: &Connection,
        cluster: &str,
        kind: Kind,
        key: &ObjectKey,
        at: i64,
    ) -> Result<bool> {
        let t = row::table(kind);
        let n = c
            .execute(
                &format!(
                    "UPDATE {t} SET status = 'deleted', deleted_at = ?1, updated_at = ?1 \
                     WHERE cluster_name = ?2 AND namespace = ?3 AND name = ?4 AND deleted_at = 0"
                ),
                rusqlite::params![at, cluster, key.namespace, key.name],
            )
            .map_err(sql(format!("mark {t} row {key} deleted")))?;
        Ok(n > 0)
    }

    /// See [`super::MetaSync::mark_deleted`].
    pub async fn mark_deleted(
        &self,
        cluster: String,
        kind: Kind,
        key: ObjectKey,
        at: i64,
    ) -> Result<bool> {
        self.with(move |c| Self::mark_deleted_sync(c, &cluster, kind, &key, at))
            .await
    }

    /// See [`super::MetaSync::sweep_rows`].
    pub async fn sweep(
        &self,
        cluster: String,
        kind: Kind,
        live: Vec<ObjectKey>,
        now: i64,
    ) -> Result<usize> {
        self.with(move |c| {
            let t = row::table(kind);
            let mut stmt = c
                .prepare(&format!(
                    "SELECT namespace, name FROM {t} WHERE cluster_name = ?1 AND deleted_at = 0"
                ))
                .map_err(sql(format!("list {t} rows")))?;
            let rows: Vec<ObjectKey> = stmt
                .query_map([&cluster], |r| {
                    Ok(ObjectKey::new(
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                    ))
                })
                .map_err(sql(format!("list {t} rows")))?
                .filter_map(std::result::Result::ok)
                .collect();
            let live: HashSet<ObjectKey> = live.into_iter().collect();
            let mut n = 0;
            for k in rows.iter().filter(|k| !live.contains(*k)) {
                if Self::mark_deleted_sync(c, &cluster, kind, k, now)? {
                    n += 1;
                }
            }
            Ok(n)
        })
        .await
    }

    /// See [`super::MetaSync::row`].
    pub async fn row(
        &self,
        cluster: String,
        kind: Kind,
        key: ObjectKey,
    ) -> Result<Option<Vec<(String, String)>>> {
        self.with(move |c| {
            let t = row::table(kind);
            let mut stmt = c
                .prepare(&format!(
                    "SELECT * FROM {t} WHERE cluster_name = ?1 AND namespace = ?2 AND name = ?3"
                ))
                .map_err(sql(format!("read {t} row {key}")))?;
            let names: Vec<String> = stmt.column_names().map(|s| s.to_string()).collect();
            let mut rows = stmt
                .query(rusqlite::params![cluster, key.namespace, key.name])
                .map_err(sql(format!("read {t} row {key}")))?;
            let Some(r) = rows.next().map_err(sql(format!("read {t} row {key}")))? else {
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

    /// Column names of `table` (tests: the row model matches the schema).
    pub async fn columns(&self, table: &'static str) -> Result<Vec<String>> {
        self.with(move |c| {
            let mut stmt = c
                .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))
                .map_err(sql(format!("list columns of {table}")))?;
            let names = stmt
                .query_map([], |r| r.get::<_, String>(0))
                .map_err(sql(format!("list columns of {table}")))?
                .filter_map(std::result::Result::ok)
                .collect();
            Ok(names)
        })
        .await
    }
}
