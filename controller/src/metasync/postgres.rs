//! The PostgreSQL backend (tokio-postgres; TLS per `sslmode`, see [`super::tls`]): the
//! production target. The password comes from the URL or from a
//! [`PasswordSource`](super::credentials::PasswordSource) read at every (re)connect.
//!
//! The connection is made on first use, not at start-up, so a database that is down does
//! not keep the controller from reconciling volumes: the plug-in step fails, the reconcile
//! retries with back-off, and each retry tries to connect again. A connection that is lost
//! (server restart, network) or a statement that does not finish within
//! [`STATEMENT_TIMEOUT`] fails that step and drops the connection; the next use reconnects.
//!
//! The schema is [`MIGRATIONS`], tracked in the table `liteio_schema_version` (one row per
//! applied migration) and applied on every (re)connect in one transaction under an advisory
//! lock, so controllers starting together do not race. Tables are created unqualified: the
//! `search_path` of the connection picks the schema (`?options=-c%20search_path%3Dliteio`
//! in the URL).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::timeout;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Config, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;
use tracing::{info, warn};

use super::credentials::PasswordSource;
use super::row::{self, Cell, Dialect, Row};
use super::tls::{self, tls_settings};
use crate::error::{Error, Result};
use crate::plugin::Kind;
use crate::state::ObjectKey;

// The URL this backend reads, under the backend's name too (`metasync::postgres::parse_url`).
pub use super::pgurl::{CONNECT_TIMEOUT, PgUrl, TlsMode, describe, parse_url};

/// The schema, one migration per entry (same tables and columns as SQLite's, `BIGINT` for
/// integers). Never edit a shipped entry: append a new one.
pub const MIGRATIONS: &[&str] = &[r"
CREATE TABLE IF NOT EXISTS storage_pool (
    id BIGSERIAL PRIMARY KEY,
    cluster_name TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    vg_type TEXT NOT NULL DEFAULT '',
    vg_name TEXT NOT NULL DEFAULT '',
    reserved_vol TEXT NOT NULL DEFAULT '[]',
    total_size BIGINT NOT NULL DEFAULT 0,
    free_size BIGINT NOT NULL DEFAULT 0,
    node_id TEXT NOT NULL DEFAULT '',
    node_ip TEXT NOT NULL DEFAULT '',
    node_hostname TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT '',
    created_at BIGINT NOT NULL DEFAULT 0,
    updated_at BIGINT NOT NULL DEFAULT 0,
    deleted_at BIGINT NOT NULL DEFAULT 0,
    UNIQUE (cluster_name, namespace, name)
);
CREATE TABLE IF NOT EXISTS antstor_volume (
    id BIGSERIAL PRIMARY KEY,
    cluster_name TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    uid TEXT NOT NULL DEFAULT '',
    labels TEXT NOT NULL DEFAULT '{}',
    pvc_ns TEXT NOT NULL DEFAULT '',
    pvc_name TEXT NOT NULL DEFAULT '',
    lvol_dev_path TEXT NOT NULL DEFAULT '',
    lvol_name TEXT NOT NULL DEFAULT '',
    is_thin BIGINT NOT NULL DEFAULT 0,
    position_advice TEXT NOT NULL DEFAULT '',
    size BIGINT NOT NULL DEFAULT 0,
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
    created_at BIGINT NOT NULL DEFAULT 0,
    updated_at BIGINT NOT NULL DEFAULT 0,
    deleted_at BIGINT NOT NULL DEFAULT 0,
    UNIQUE (cluster_name, namespace, name)
);
CREATE INDEX IF NOT EXISTS antstor_volume_uid ON antstor_volume (uid);
CREATE TABLE IF NOT EXISTS antstor_snapshot (
    id BIGSERIAL PRIMARY KEY,
    cluster_name TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    uid TEXT NOT NULL DEFAULT '',
    origin_vol_name TEXT NOT NULL DEFAULT '',
    origin_vol_ns TEXT NOT NULL DEFAULT '',
    origin_vol_t_node_id TEXT NOT NULL DEFAULT '',
    vol_type TEXT NOT NULL DEFAULT '',
    size BIGINT NOT NULL DEFAULT 0,
    status TEXT NOT NULL DEFAULT '',
    created_at BIGINT NOT NULL DEFAULT 0,
    updated_at BIGINT NOT NULL DEFAULT 0,
    deleted_at BIGINT NOT NULL DEFAULT 0,
    UNIQUE (cluster_name, namespace, name)
);
"];

/// The table that records applied migrations.
pub const VERSION_TABLE: &str = "liteio_schema_version";

/// Key of the advisory lock held while migrating (`LiteIO` in ASCII).
const MIGRATION_LOCK: i64 = 0x4c69_7465_494f;

/// Bound of one statement (or a connect with its migrations).
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

fn pg(action: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> Error {
    let action = action.into();
    move |source| Error::Postgres { action, source }
}

fn param(c: &Cell) -> &(dyn ToSql + Sync) {
    match c {
        Cell::Text(s) => s,
        Cell::Int(n) => n,
    }
}

/// A PostgreSQL database, connected on first use.
#[derive(Clone)]
pub struct Postgres {
    config: Arc<Config>,
    target: String,
    tls: TlsMode,
    connector: Option<MakeRustlsConnect>,
    password: PasswordSource,
    client: Arc<Mutex<Option<Arc<Client>>>>,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres")
            .field("target", &self.target)
            .field("sslmode", &self.tls.as_str())
            .field("password", &self.password)
            .finish_non_exhaustive()
    }
}

/// Connects with `tls` and runs the connection on its own task.
async fn connect_with<T>(
    config: &Config,
    tls: T,
    target: &str,
) -> std::result::Result<Client, tokio_postgres::Error>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: Send + 'static,
{
    let (client, conn) = config.connect(tls).await?;
    let target = target.to_string();
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            warn!(target, error = %e, "PostgreSQL connection closed");
        }
    });
    Ok(client)
}

impl Postgres {
    /// A backend for `url` (password, `sslmode` and `sslrootcert` from the URL); nothing is
    /// connected yet.
    pub fn new(url: &str) -> Result<Self> {
        Self::with(url, None, PasswordSource::Url)
    }

    /// A backend for `url` with the CA of `metaSync.caFile` and the password from
    /// `password`. The URL, the CA file and the combination are checked now (errors name the
    /// field); the password is read at every connect.
    pub fn with(url: &str, ca_file: Option<&Path>, password: PasswordSource) -> Result<Self> {
        let parsed =
            parse_url(url).map_err(|reason| Error::config("metaSync.postgresUrl", reason))?;
        if parsed.has_password() && !matches!(password, PasswordSource::Url) {
            return Err(Error::config(
                "metaSync.postgresUrl",
                format!(
                    "holds a password and {} is set too: keep the password in one place",
                    password.field()
                ),
            ));
        }
        let ca = tls_settings(&parsed, ca_file)?;
        let connector = tls::connector(parsed.tls, ca.as_ref())?;
        Ok(Self {
            target: describe(&parsed.config),
            tls: parsed.tls,
            config: Arc::new(parsed.config),
            connector,
            password,
            client: Arc::new(Mutex::new(None)),
        })
    }

    /// `postgres://user@host:port/database` (no password).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The `sslmode` in force.
    pub fn tls_mode(&self) -> TlsMode {
        self.tls
    }

    /// The live connection, connecting and migrating when there is none.
    pub async fn connect(&self) -> Result<Arc<Client>> {
        let mut slot = self.client.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(Arc::clone(c));
        }
        *slot = None;
        let action = format!("connect to PostgreSQL at {}", self.target);
        let mut with_password;
        let config = match self.password.read().await? {
            Some(p) => {
                with_password = Config::clone(&self.config);
                with_password.password(p.expose());
                &with_password
            }
            None => self.config.as_ref(),
        };
        let connecting = async {
            match &self.connector {
                Some(tls) => connect_with(config, tls.clone(), &self.target).await,
                None => connect_with(config, NoTls, &self.target).await,
            }
        };
        let mut client = match timeout(STATEMENT_TIMEOUT, connecting).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                return Err(match tls::refusal(&e) {
                    Some(reason) => Error::PostgresTls { action, reason },
                    None => pg(action)(e),
                });
            }
            Err(_) => {
                return Err(Error::SqlTimeout {
                    action,
                    after: STATEMENT_TIMEOUT,
                });
            }
        };
        let action = format!("migrate the schema at {}", self.target);
        match timeout(STATEMENT_TIMEOUT, migrate(&mut client)).await {
            Ok(Ok(applied)) if applied > 0 => {
                info!(target = %self.target, applied, "PostgreSQL schema migrated");
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(pg(action)(e)),
            Err(_) => {
                return Err(Error::SqlTimeout {
                    action,
                    after: STATEMENT_TIMEOUT,
                });
            }
        }
        info!(target = %self.target, "connected to PostgreSQL");
        let client = Arc::new(client);
        *slot = Some(Arc::clone(&client));
        Ok(client)
    }

    /// Runs one statement on the connection; a failure that closed the connection, or a
    /// time-out, drops it so the next use reconnects.
    async fn run<T>(
        &self,
        action: String,
        f: impl AsyncFnOnce(&Client) -> std::result::Result<T, tokio_postgres::Error>,
    ) -> Result<T> {
        let client = self.connect().await?;
        let r = timeout(STATEMENT_TIMEOUT, f(&client)).await;
        let err = match r {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if !(e.is_closed() || client.is_closed()) => return Err(pg(action)(e)),
            Ok(Err(e)) => pg(action)(e),
            Err(_) => Error::SqlTimeout {
                action,
                after: STATEMENT_TIMEOUT,
            },
        };
        let mut slot = self.client.lock().await;
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, &client)) {
            *slot = None;
            warn!(target = %self.target, "PostgreSQL connection dropped; reconnecting on next use");
        }
        Err(err)
    }

    /// See [`super::MetaSync::upsert`].
    pub async fn upsert(&self, cluster: String, row: Row, now: i64) -> Result<bool> {
        let stmt = row::upsert_sql(Dialect::Postgres, &row);
        let mut params: Vec<&(dyn ToSql + Sync)> =
            vec![&cluster, &row.key.namespace, &row.key.name];
        params.extend(row.cells.iter().map(|(_, c)| param(c)));
        params.extend([&now as &(dyn ToSql + Sync), &now]);
        let action = format!("upsert {} row {}", row::table(row.kind), row.key);
        let n = self
            .run(action, async |c| c.execute(&stmt, &params).await)
            .await?;
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
        let t = row::table(kind);
        let stmt = format!(
            "UPDATE {t} SET status = 'deleted', deleted_at = $1, updated_at = $1 \
             WHERE cluster_name = $2 AND namespace = $3 AND name = $4 AND deleted_at = 0"
        );
        let n = self
            .run(format!("mark {t} row {key} deleted"), async |c| {
                c.execute(&stmt, &[&at, &cluster, &key.namespace, &key.name])
                    .await
            })
            .await?;
        Ok(n > 0)
    }

    /// See [`super::MetaSync::sweep_rows`]: one statement.
    pub async fn sweep(
        &self,
        cluster: String,
        kind: Kind,
        live: Vec<ObjectKey>,
        now: i64,
    ) -> Result<usize> {
        let t = row::table(kind);
        let (namespaces, names): (Vec<String>, Vec<String>) =
            live.into_iter().map(|k| (k.namespace, k.name)).unzip();
        let stmt = format!(
            "UPDATE {t} AS r SET status = 'deleted', deleted_at = $1, updated_at = $1 \
             WHERE r.cluster_name = $2 AND r.deleted_at = 0 AND NOT EXISTS ( \
               SELECT 1 FROM unnest($3::text[], $4::text[]) AS live(namespace, name) \
               WHERE live.namespace = r.namespace AND live.name = r.name)"
        );
        let n = self
            .run(format!("sweep {t} rows"), async |c| {
                c.execute(&stmt, &[&now, &cluster, &namespaces, &names])
                    .await
            })
            .await?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// See [`super::MetaSync::row`].
    pub async fn row(
        &self,
        cluster: String,
        kind: Kind,
        key: ObjectKey,
    ) -> Result<Option<Vec<(String, String)>>> {
        let t = row::table(kind);
        let stmt =
            format!("SELECT * FROM {t} WHERE cluster_name = $1 AND namespace = $2 AND name = $3");
        let found = self
            .run(format!("read {t} row {key}"), async |c| {
                c.query_opt(&stmt, &[&cluster, &key.namespace, &key.name])
                    .await
            })
            .await?;
        let Some(r) = found else {
            return Ok(None);
        };
        let mut out = Vec::new();
        for (i, col) in r.columns().iter().enumerate() {
            let action = || format!("read {t}.{}", col.name());
            let v = match *col.type_() {
                Type::INT8 => r
                    .try_get::<_, Option<i64>>(i)
                    .map(|v| v.map(|n| n.to_string())),
                Type::INT4 => r
                    .try_get::<_, Option<i32>>(i)
                    .map(|v| v.map(|n| n.to_string())),
                _ => r.try_get::<_, Option<String>>(i),
            }
            .map_err(|e| pg(action())(e))?;
            out.push((col.name().to_string(), v.unwrap_or_default()));
        }
        Ok(Some(out))
    }

    /// Column names of `table` in the connection's schema (tests: the row model matches).
    pub async fn columns(&self, table: &'static str) -> Result<Vec<String>> {
        let rows = self
            .run(format!("list columns of {table}"), async |c| {
                c.query(
                    "SELECT column_name::text FROM information_schema.columns \
                     WHERE table_schema = current_schema() AND table_name = $1 \
                     ORDER BY ordinal_position",
                    &[&table],
                )
                .await
            })
            .await?;
        Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect())
    }

    /// The server's id of the current connection (tests cut it to simulate a lost link).
    pub async fn backend_pid(&self) -> Result<i32> {
        let r = self
            .run("read the backend pid".into(), async |c| {
                c.query_one("SELECT pg_backend_pid()", &[]).await
            })
            .await?;
        Ok(r.get(0))
    }
}

/// Applies the missing migrations in one transaction; returns how many.
async fn migrate(client: &mut Client) -> std::result::Result<usize, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {VERSION_TABLE} \
         (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)"
    ))
    .await?;
    let current: i64 = tx
        .query_one(
            &format!("SELECT COALESCE(MAX(version), 0) FROM {VERSION_TABLE}"),
            &[],
        )
        .await?
        .get(0);
    let from = usize::try_from(current).unwrap_or(0);
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let mut applied = 0;
    for (i, m) in MIGRATIONS.iter().enumerate().skip(from) {
        tx.batch_execute(m).await?;
        let version = i64::try_from(i + 1).unwrap_or(i64::MAX);
        tx.execute(
            &format!("INSERT INTO {VERSION_TABLE} (version, applied_at) VALUES ($1, $2)"),
            &[&version, &now],
        )
        .await?;
        applied += 1;
    }
    tx.commit().await?;
    Ok(applied)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn password_in_one_place_and_ca_only_where_it_counts() {
        let err = Postgres::with(
            "postgres://u:s3cret@h/db",
            None,
            PasswordSource::Env("PGPW".into()),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("metaSync.postgresUrl: holds a password and metaSync.passwordEnv"),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
        let err = Postgres::with(
            "postgres://u@h/db?sslmode=disable",
            Some(Path::new("/ca.pem")),
            PasswordSource::Url,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("metaSync.caFile: a CA is set but sslmode=disable"),
            "{err}"
        );
        let err = Postgres::with(
            "postgres://u@h/db?sslmode=verify-full",
            None,
            PasswordSource::Url,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("metaSync.caFile"), "{err}");
        let p = Postgres::with(
            "postgres://u@h/db?sslmode=require",
            None,
            PasswordSource::File("/run/pw".into()),
        )
        .unwrap();
        assert_eq!(p.tls_mode(), TlsMode::Require);
        let d = format!("{p:?}");
        assert!(d.contains("require") && d.contains("/run/pw"), "{d}");
    }

    #[test]
    fn debug_hides_the_password() {
        let p = Postgres::new("postgres://u:hunter2@h/db").unwrap();
        let d = format!("{p:?}");
        assert!(d.contains("postgres://u@h:5432/db"), "{d}");
        assert!(!d.contains("hunter2"));
    }

    #[tokio::test]
    async fn an_unreachable_server_is_an_error_not_a_panic() {
        // Port 1 on loopback: nothing listens there, the connect is refused at once.
        let p = Postgres::new("postgres://u@127.0.0.1:1/db?connect_timeout=5").unwrap();
        let err = tokio::time::timeout(Duration::from_secs(20), p.connect())
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Sql);
        let msg = err.to_string();
        assert!(
            msg.contains("connect to PostgreSQL at postgres://u@127.0.0.1:1/db"),
            "{msg}"
        );
    }
}
