//! MetaSync: mirrors pools, volumes and snapshots into SQL (LiteIO's MySQL sync, F27).
//!
//! Two backends with the same tables, columns and semantics:
//! - [`sqlite`]: embedded (rusqlite, bundled), the default (`metaSync.sqlitePath`); schema
//!   version in `PRAGMA user_version`.
//! - [`postgres`]: PostgreSQL (tokio-postgres), the production target
//!   (`metaSync.postgresUrl`); schema version in the table `liteio_schema_version`,
//!   connected on first use and reconnected after a lost connection; TLS per the URL's
//!   `sslmode` ([`tls`]), the password from the URL or from a Secret, an environment
//!   variable or a file ([`credentials`]), never shown in logs, errors or `Debug` output.
//!
//! [`settings`] is the `metaSync:` section of the config file and its checks (re-exported by
//! [`crate::config`]); [`pgurl`] reads a PostgreSQL URL as libpq does, for the settings,
//! [`tls`] and [`postgres`] alike.
//!
//! [`row`] is the one place that turns an object into columns and builds the upsert. Unlike
//! LiteIO, the schema ships with the code (migrations applied in order), rows are keyed by
//! (cluster, namespace, name) rather than ignoring the namespace, snapshots are mirrored too,
//! and the sweep for vanished objects runs after every full relist instead of an hourly
//! timer. Rows are upserted (written only when a column changed) and soft-deleted
//! (`status = 'deleted'`, `deleted_at` = unix seconds). Any failure is an
//! [`Error`](crate::Error) of kind `Sql` naming what failed; the reconcile that ran the step
//! retries with back-off.

pub mod credentials;
pub mod pgurl;
pub mod postgres;
pub mod row;
pub mod settings;
pub mod sqlite;
pub mod tls;

use std::path::Path;

use futures::future::BoxFuture;
use k8s_openapi::jiff::Timestamp;

use crate::error::Result;
use crate::plugin::{Kind, Plugin, PluginObject};
use crate::state::ObjectKey;

pub use row::{Cell, Row};
pub use settings::{MetaSyncConfig, MetaSyncTarget};

#[derive(Debug, Clone)]
enum Backend {
    Sqlite(sqlite::Sqlite),
    Postgres(Box<postgres::Postgres>),
}

fn unix(t: Timestamp) -> i64 {
    t.as_second()
}

/// The SQL mirror, a [`Plugin`].
#[derive(Debug, Clone)]
pub struct MetaSync {
    backend: Backend,
    cluster: String,
}

impl MetaSync {
    /// The mirror the `metaSync` section asks for. SQLite is opened and migrated at once;
    /// PostgreSQL is connected on first use. A `passwordSecret` needs [`MetaSync::open_in`].
    pub fn open(config: &MetaSyncConfig) -> Result<Self> {
        Self::open_with(config, None)
    }

    /// As [`MetaSync::open`], reading `metaSync.passwordSecret` (if set) from `namespace`
    /// through `client`.
    pub fn open_in(
        config: &MetaSyncConfig,
        client: &kube::Client,
        namespace: &str,
    ) -> Result<Self> {
        Self::open_with(config, Some((client, namespace)))
    }

    fn open_with(config: &MetaSyncConfig, kube: Option<(&kube::Client, &str)>) -> Result<Self> {
        match config.target()? {
            MetaSyncTarget::Sqlite(path) => Self::open_sqlite(&path, &config.cluster),
            MetaSyncTarget::Postgres(url) => {
                let password = match (
                    &config.password_secret,
                    &config.password_env,
                    &config.password_file,
                ) {
                    (Some(reference), _, _) => {
                        let Some((client, namespace)) = kube else {
                            return Err(crate::Error::config(
                                "metaSync.passwordSecret",
                                "needs a Kubernetes client to read the Secret",
                            ));
                        };
                        credentials::PasswordSource::Secret {
                            secrets: Box::new(kube::Api::namespaced(client.clone(), namespace)),
                            namespace: namespace.to_string(),
                            reference: reference.clone(),
                        }
                    }
                    (None, Some(var), _) => credentials::PasswordSource::Env(var.clone()),
                    (None, None, Some(path)) => credentials::PasswordSource::File(path.clone()),
                    (None, None, None) => credentials::PasswordSource::Url,
                };
                Ok(Self {
                    backend: Backend::Postgres(Box::new(postgres::Postgres::with(
                        &url,
                        config.ca_file.as_deref(),
                        password,
                    )?)),
                    cluster: config.cluster.clone(),
                })
            }
        }
    }

    /// Opens (creating when missing) the SQLite database at `path` and applies the
    /// migrations.
    pub fn open_sqlite(path: &Path, cluster: &str) -> Result<Self> {
        Ok(Self {
            backend: Backend::Sqlite(sqlite::Sqlite::open(path)?),
            cluster: cluster.to_string(),
        })
    }

    /// An in-memory SQLite database (tests).
    pub fn in_memory(cluster: &str) -> Result<Self> {
        Ok(Self {
            backend: Backend::Sqlite(sqlite::Sqlite::in_memory()?),
            cluster: cluster.to_string(),
        })
    }

    /// A PostgreSQL mirror at `url` (`postgres://user:password@host:port/database`); the URL
    /// is checked now, the connection made on first use.
    pub fn postgres(url: &str, cluster: &str) -> Result<Self> {
        Ok(Self {
            backend: Backend::Postgres(Box::new(postgres::Postgres::new(url)?)),
            cluster: cluster.to_string(),
        })
    }

    /// `SQLite` or `PostgreSQL`.
    pub fn backend_name(&self) -> &'static str {
        match &self.backend {
            Backend::Sqlite(_) => "SQLite",
            Backend::Postgres(_) => "PostgreSQL",
        }
    }

    /// The PostgreSQL backend, if that is the one in use (tests).
    pub fn as_postgres(&self) -> Option<&postgres::Postgres> {
        match &self.backend {
            Backend::Postgres(p) => Some(p),
            Backend::Sqlite(_) => None,
        }
    }

    /// Makes sure the database is reachable and its schema current (PostgreSQL connects
    /// and migrates; SQLite did that when opened).
    pub async fn connect(&self) -> Result<()> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(()),
            Backend::Postgres(p) => p.connect().await.map(|_| ()),
        }
    }

    /// Inserts or updates the row of an object; true when a row was written (false when
    /// it was already up to date).
    pub async fn upsert(&self, obj: PluginObject<'_>) -> Result<bool> {
        let row = Row::of(obj);
        let now = unix(Timestamp::now());
        let cluster = self.cluster.clone();
        match &self.backend {
            Backend::Sqlite(s) => s.upsert(cluster, row, now).await,
            Backend::Postgres(p) => p.upsert(cluster, row, now).await,
        }
    }

    /// Marks the row of an object deleted at `at`; true when a live row was marked.
    pub async fn mark_deleted(&self, kind: Kind, key: &ObjectKey, at: Timestamp) -> Result<bool> {
        let (cluster, key, at) = (self.cluster.clone(), key.clone(), unix(at));
        match &self.backend {
            Backend::Sqlite(s) => s.mark_deleted(cluster, kind, key, at).await,
            Backend::Postgres(p) => p.mark_deleted(cluster, kind, key, at).await,
        }
    }

    /// Marks every live row of `kind` whose object is not in `live` deleted; returns how
    /// many.
    pub async fn sweep_rows(&self, kind: Kind, live: Vec<ObjectKey>) -> Result<usize> {
        let (cluster, now) = (self.cluster.clone(), unix(Timestamp::now()));
        match &self.backend {
            Backend::Sqlite(s) => s.sweep(cluster, kind, live, now).await,
            Backend::Postgres(p) => p.sweep(cluster, kind, live, now).await,
        }
    }

    /// Reads one row as column → value text (tests and debugging).
    pub async fn row(&self, kind: Kind, key: &ObjectKey) -> Result<Option<Vec<(String, String)>>> {
        let (cluster, key) = (self.cluster.clone(), key.clone());
        match &self.backend {
            Backend::Sqlite(s) => s.row(cluster, kind, key).await,
            Backend::Postgres(p) => p.row(cluster, kind, key).await,
        }
    }

    /// Column names of the table of `kind` (tests: the schema holds every column of the row
    /// model).
    pub async fn columns(&self, kind: Kind) -> Result<Vec<String>> {
        let t = row::table(kind);
        match &self.backend {
            Backend::Sqlite(s) => s.columns(t).await,
            Backend::Postgres(p) => p.columns(t).await,
        }
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
        Box::pin(async move { self.upsert(obj).await.map(|_| ()) })
    }

    fn handle_deletion<'a>(&'a self, obj: PluginObject<'a>) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.upsert(obj).await?;
            let (kind, key) = kind_key(obj);
            self.mark_deleted(kind, &key, deletion_time(obj))
                .await
                .map(|_| ())
        })
    }

    fn forget<'a>(&'a self, kind: Kind, key: &'a ObjectKey) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.mark_deleted(kind, key, Timestamp::now())
                .await
                .map(|_| ())
        })
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
        assert!(m.upsert(PluginObject::Volume(&v2.0)).await.unwrap());
        assert!(!m.upsert(PluginObject::Volume(&v2.0)).await.unwrap());
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

    #[tokio::test]
    async fn the_schemas_hold_every_column_of_the_row_model() {
        let m = MetaSync::in_memory("c").unwrap();
        let v = volume("v", GIB).build();
        let p = pool("p", GIB).build();
        let s = snapshot("s", "v", GIB).build();
        for obj in [
            PluginObject::Volume(&v),
            PluginObject::Pool(&p),
            PluginObject::Snapshot(&s),
        ] {
            let r = Row::of(obj);
            let cols = m.columns(r.kind).await.unwrap();
            // PostgreSQL's DDL: the same table with the same columns, in the same order.
            let t = row::table(r.kind);
            let pg = postgres::MIGRATIONS[0];
            let start = pg
                .find(&format!("CREATE TABLE IF NOT EXISTS {t} ("))
                .unwrap();
            let body = &pg[start..start + pg[start..].find(");").unwrap()];
            let pg_cols: Vec<&str> = body
                .lines()
                .skip(1)
                .map(str::trim)
                .filter(|l| !l.starts_with("UNIQUE"))
                .filter_map(|l| l.split_whitespace().next())
                .collect();
            assert_eq!(cols, pg_cols, "{t}");
            for (c, _) in &r.cells {
                assert!(cols.iter().any(|n| n == c), "{t} lacks column {c}");
            }
        }
    }

    #[test]
    fn reopening_keeps_the_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        drop(MetaSync::open_sqlite(&path, "c").unwrap());
        drop(MetaSync::open_sqlite(&path, "c").unwrap());
    }
}
