//! T1: the MetaSync plug-in in the running controller, on SQLite and on PostgreSQL.
//!
//! Pools, volumes and snapshots are created, updated and deleted through the test API
//! server; the rows must then match the objects (as the shared row model renders them) and
//! the deleted ones be soft-deleted. The PostgreSQL tests need `LITEIO_TEST_POSTGRES_URL`
//! (scripts/test.sh starts a server and sets it); without it they print `SKIP …` and pass.
//! Each PostgreSQL test works in its own schema, so the tests run in parallel.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use liteio_api::keys::annotations;
use liteio_api::size::GIB;
use liteio_api::{AntstorSnapshot, AntstorVolume, StoragePool};
use liteio_controller::config::{Config, MetaSyncConfig};
use liteio_controller::metasync::{MetaSync, Row};
use liteio_controller::plugin::{Kind, PluginObject};
use liteio_controller::state::ObjectKey;
use liteio_controller::testing::*;
use liteio_controller::{Error, ErrorKind};
use serde::de::DeserializeOwned;
use tokio::time::timeout;
use tokio_postgres::NoTls;

use common::*;

const CLUSTER: &str = "t1";

// ---- PostgreSQL: one schema per test ----------------------------------------------------

struct PgSchema {
    admin: tokio_postgres::Client,
    name: String,
    url: String,
}

/// A fresh schema named after `test`, or `None` (after printing `SKIP`) when no server is
/// configured.
async fn pg_schema(test: &str) -> Option<PgSchema> {
    let Ok(base) = std::env::var("LITEIO_TEST_POSTGRES_URL") else {
        let why = std::env::var("LITEIO_TEST_POSTGRES_SKIP").unwrap_or_else(|_| {
            "LITEIO_TEST_POSTGRES_URL is not set (scripts/test.sh starts a server and sets it)"
                .into()
        });
        println!("SKIP {test}: {why}");
        return None;
    };
    let (admin, conn) = tokio_postgres::connect(&base, NoTls)
        .await
        .unwrap_or_else(|e| panic!("LITEIO_TEST_POSTGRES_URL is set but: {e}"));
    tokio::spawn(conn);
    let name = format!("liteio_{}", test.trim_start_matches("postgres_"));
    admin
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}"
        ))
        .await
        .unwrap();
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-c%20search_path%3D{name}");
    Some(PgSchema { admin, name, url })
}

impl PgSchema {
    async fn count(&self, table: &str, filter: &str) -> i64 {
        self.admin
            .query_one(
                &format!("SELECT count(*) FROM {}.{table} WHERE {filter}", self.name),
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }

    async fn drop(self) {
        let _ = self
            .admin
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name))
            .await;
    }
}

fn pg_config(url: &str) -> Config {
    let mut c = test_config();
    c.meta_sync = Some(MetaSyncConfig {
        sqlite_path: None,
        postgres_url: Some(url.into()),
        cluster: CLUSTER.into(),
        ..MetaSyncConfig::default()
    });
    c
}

// ---- comparing rows with objects --------------------------------------------------------

fn col<'a>(row: &'a [(String, String)], name: &str) -> Option<&'a str> {
    row.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

/// The row of a live object holds exactly what the row model makes of the object.
async fn live_row_matches<K>(
    h: &Harness,
    sync: &MetaSync,
    kind: Kind,
    name: &str,
) -> Result<(), String>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    for<'a> &'a K: Into<PluginObject<'a>>,
{
    let obj: K = Api::namespaced(h.client.clone(), NS)
        .get(name)
        .await
        .map_err(|e| e.to_string())?;
    let want = Row::of((&obj).into());
    let got = sync
        .row(kind, &ObjectKey::new(NS, name))
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no {} row {name}", kind.as_str()))?;
    for (c, v) in &want.cells {
        let have = col(&got, c).unwrap_or("<missing>");
        if have != v.to_string() {
            return Err(format!(
                "{} {name}: {c} is {have:?}, object says {v}",
                kind.as_str()
            ));
        }
    }
    for (c, v) in [("cluster_name", CLUSTER), ("deleted_at", "0")] {
        if col(&got, c) != Some(v) {
            return Err(format!(
                "{} {name}: {c} is {:?}, want {v}",
                kind.as_str(),
                col(&got, c)
            ));
        }
    }
    Ok(())
}

async fn soft_deleted(sync: &MetaSync, kind: Kind, name: &str) -> Result<(), String> {
    let got = sync
        .row(kind, &ObjectKey::new(NS, name))
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no {} row {name}", kind.as_str()))?;
    if col(&got, "status") != Some("deleted") || col(&got, "deleted_at") == Some("0") {
        return Err(format!(
            "{} {name} not soft-deleted: status {:?}, deleted_at {:?}",
            kind.as_str(),
            col(&got, "status"),
            col(&got, "deleted_at")
        ));
    }
    Ok(())
}

async fn gone<K>(api: Api<K>, name: &str)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    eventually(&format!("{name} gone"), || async {
        api.get_opt(name).await.unwrap().is_none()
    })
    .await;
}

async fn bound(h: &Harness, volume: &str) -> String {
    eventually(&format!("{volume} bound"), || async {
        !h.volume(volume).await.spec.target_node_id.is_empty()
    })
    .await;
    h.volume(volume).await.spec.target_node_id
}

/// Creates, updates and deletes pools, volumes and snapshots through the API server with
/// the controller running `sync`, then checks every row.
async fn rows_follow_the_objects(config: Config, sync: MetaSync) {
    // A row of a volume that vanished while no controller ran: the first list sweeps it.
    let ghost = volume("ghost", GIB).build();
    assert!(sync.upsert(PluginObject::Volume(&ghost)).await.unwrap());

    let h = start_with(config, vec![Arc::new(sync.clone())]).await;
    h.add_pool(pool("p1", 100 * GIB)).await;
    h.add_pool(pool("p2", 20 * GIB)).await;
    let reserve = (2 * GIB).to_string();
    h.add_volume(volume("v1", 10 * GIB).annotate(annotations::SNAPSHOT_RESERVED_BYTES, &reserve))
        .await;
    h.add_volume(volume("v2", 4 * GIB).annotate(annotations::SNAPSHOT_RESERVED_BYTES, &reserve))
        .await;
    let v1_node = bound(&h, "v1").await;
    bound(&h, "v2").await;
    // The pool v1 is on stays; the other one is empty once v2 is gone.
    let (kept, dropped) = if v1_node == "p1" {
        ("p1", "p2")
    } else {
        ("p2", "p1")
    };
    h.add_snapshot(snapshot("s1", "v1", GIB)).await;
    h.add_snapshot(snapshot("s2", "v2", GIB)).await;
    for s in ["s1", "s2"] {
        eventually(&format!("{s} bound"), || async {
            !h.snapshot(s)
                .await
                .spec
                .origin_vol_target_node_id
                .is_empty()
        })
        .await;
    }

    // Updates: an expansion and a changed pool address.
    let pp = PatchParams::default();
    h.volumes()
        .patch(
            "v1",
            &pp,
            &Patch::Merge(serde_json::json!({ "spec": { "sizeByte": 12 * GIB } })),
        )
        .await
        .unwrap();
    h.pools()
        .patch(
            kept,
            &pp,
            &Patch::Merge(serde_json::json!({ "spec": { "nodeInfo": { "ip": "192.0.2.7" } } })),
        )
        .await
        .unwrap();

    // Deletes: a snapshot, its volume, and an empty pool.
    let dp = DeleteParams::default();
    h.snapshots().delete("s2", &dp).await.unwrap();
    gone(h.snapshots(), "s2").await;
    h.volumes().delete("v2", &dp).await.unwrap();
    gone(h.volumes(), "v2").await;
    h.pools().delete(dropped, &dp).await.unwrap();
    gone(h.pools(), dropped).await;

    eventually_ok("rows match the objects", || async {
        live_row_matches::<StoragePool>(&h, &sync, Kind::Pool, kept).await?;
        live_row_matches::<AntstorVolume>(&h, &sync, Kind::Volume, "v1").await?;
        live_row_matches::<AntstorSnapshot>(&h, &sync, Kind::Snapshot, "s1").await?;
        soft_deleted(&sync, Kind::Pool, dropped).await?;
        soft_deleted(&sync, Kind::Volume, "v2").await?;
        soft_deleted(&sync, Kind::Snapshot, "s2").await?;
        soft_deleted(&sync, Kind::Volume, "ghost").await?;
        Ok(())
    })
    .await;
    // Not only equal to the model: the values the test made.
    let v1 = sync
        .row(Kind::Volume, &ObjectKey::new(NS, "v1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(col(&v1, "size"), Some((12 * GIB).to_string().as_str()));
    assert_eq!(col(&v1, "t_node_id"), Some(v1_node.as_str()));
    let p1 = sync
        .row(Kind::Pool, &ObjectKey::new(NS, kept))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(col(&p1, "node_ip"), Some("192.0.2.7"));
    let s1 = sync
        .row(Kind::Snapshot, &ObjectKey::new(NS, "s1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(col(&s1, "origin_vol_t_node_id"), Some(v1_node.as_str()));
    assert_eq!(col(&s1, "status"), Some("creating"));
    h.stop().await;
}

#[tokio::test]
async fn sqlite_rows_follow_the_objects() {
    timeout(LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let mut config = test_config();
        let m = MetaSyncConfig {
            sqlite_path: Some(dir.path().join("meta.db")),
            postgres_url: None,
            cluster: CLUSTER.into(),
            ..MetaSyncConfig::default()
        };
        let sync = MetaSync::open(&m).unwrap();
        assert_eq!(sync.backend_name(), "SQLite");
        config.meta_sync = Some(m);
        rows_follow_the_objects(config, sync).await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn postgres_rows_follow_the_objects() {
    timeout(LIMIT, async {
        let Some(schema) = pg_schema("postgres_rows_follow_the_objects").await else {
            return;
        };
        let config = pg_config(&schema.url);
        let sync = MetaSync::open(config.meta_sync.as_ref().unwrap()).unwrap();
        assert_eq!(sync.backend_name(), "PostgreSQL");
        rows_follow_the_objects(config, sync).await;
        // Read back on another connection, in the test's schema.
        assert_eq!(schema.count("antstor_volume", "deleted_at = 0").await, 1);
        assert_eq!(
            schema.count("antstor_volume", "status = 'deleted'").await,
            2
        );
        assert_eq!(schema.count("storage_pool", "deleted_at = 0").await, 1);
        assert_eq!(schema.count("antstor_snapshot", "deleted_at <> 0").await, 1);
        schema.drop().await;
    })
    .await
    .unwrap();
}

// ---- backend semantics, the same on both ------------------------------------------------

async fn semantics(m: &MetaSync) {
    let key = ObjectKey::new(NS, "v1");
    let v = volume("v1", GIB).scheduled_to("n1");
    assert!(
        m.upsert(PluginObject::Volume(&v.0)).await.unwrap(),
        "insert"
    );
    assert!(
        !m.upsert(PluginObject::Volume(&v.0)).await.unwrap(),
        "unchanged"
    );
    let row = m.row(Kind::Volume, &key).await.unwrap().unwrap();
    let id = col(&row, "id").unwrap().to_string();
    let v2 = v.clone().size(2 * GIB);
    assert!(
        m.upsert(PluginObject::Volume(&v2.0)).await.unwrap(),
        "changed"
    );
    let row = m.row(Kind::Volume, &key).await.unwrap().unwrap();
    assert_eq!(col(&row, "id"), Some(id.as_str()));
    assert_eq!(col(&row, "size"), Some((2 * GIB).to_string().as_str()));
    // Soft delete, once.
    let at = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap();
    assert!(m.mark_deleted(Kind::Volume, &key, at).await.unwrap());
    assert!(!m.mark_deleted(Kind::Volume, &key, at).await.unwrap());
    let row = m.row(Kind::Volume, &key).await.unwrap().unwrap();
    assert_eq!(col(&row, "status"), Some("deleted"));
    assert_eq!(col(&row, "deleted_at"), Some("1700000000"));
    // The same object again: live again, same id.
    assert!(
        m.upsert(PluginObject::Volume(&v2.0)).await.unwrap(),
        "revived"
    );
    let row = m.row(Kind::Volume, &key).await.unwrap().unwrap();
    assert_eq!(col(&row, "deleted_at"), Some("0"));
    assert_eq!(col(&row, "status"), Some("creating"));
    assert_eq!(col(&row, "id"), Some(id.as_str()));
    // Sweep: only rows whose objects are not live, only once.
    for name in ["a", "b", "c"] {
        m.upsert(PluginObject::Pool(&pool(name, GIB).0))
            .await
            .unwrap();
    }
    let live = vec![ObjectKey::new(NS, "b")];
    assert_eq!(m.sweep_rows(Kind::Pool, live.clone()).await.unwrap(), 2);
    assert_eq!(m.sweep_rows(Kind::Pool, live).await.unwrap(), 0);
    let b = m
        .row(Kind::Pool, &ObjectKey::new(NS, "b"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(col(&b, "deleted_at"), Some("0"));
    // The sweep of one kind leaves the others alone.
    assert_eq!(m.sweep_rows(Kind::Snapshot, vec![]).await.unwrap(), 0);
    let row = m.row(Kind::Volume, &key).await.unwrap().unwrap();
    assert_eq!(col(&row, "deleted_at"), Some("0"));
    // Rows of another cluster are not this mirror's.
    assert!(
        m.row(Kind::Pool, &ObjectKey::new("other", "b"))
            .await
            .unwrap()
            .is_none()
    );
    // The schema holds every column of the row model.
    for kind in [Kind::Volume, Kind::Pool, Kind::Snapshot] {
        let cols = m.columns(kind).await.unwrap();
        assert!(cols.iter().any(|c| c == "deleted_at"), "{cols:?}");
    }
}

#[tokio::test]
async fn sqlite_semantics() {
    timeout(LIMIT, async {
        semantics(&MetaSync::in_memory(CLUSTER).unwrap()).await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn postgres_semantics_and_migrations() {
    timeout(LIMIT, async {
        let Some(schema) = pg_schema("postgres_semantics_and_migrations").await else {
            return;
        };
        // Two controllers starting together migrate once.
        let a = MetaSync::postgres(&schema.url, CLUSTER).unwrap();
        let b = MetaSync::postgres(&schema.url, CLUSTER).unwrap();
        let (ra, rb) = tokio::join!(a.connect(), b.connect());
        ra.unwrap();
        rb.unwrap();
        assert_eq!(
            schema.count("liteio_schema_version", "true").await,
            i64::try_from(liteio_controller::metasync::postgres::MIGRATIONS.len()).unwrap()
        );
        semantics(&a).await;
        // A mirror of another cluster in the same tables sees none of these rows.
        let other = MetaSync::postgres(&schema.url, "other-cluster").unwrap();
        assert!(
            other
                .row(Kind::Pool, &ObjectKey::new(NS, "b"))
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(other.sweep_rows(Kind::Pool, vec![]).await.unwrap(), 0);
        schema.drop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn postgres_errors_name_what_failed() {
    timeout(LIMIT, async {
        let Some(schema) = pg_schema("postgres_errors_name_what_failed").await else {
            return;
        };
        // A database that does not exist: the connect fails, with the target in the message.
        let url = schema.url.replacen("/liteio_test", "/no_such_db", 1);
        let m = MetaSync::postgres(&url, CLUSTER).unwrap();
        let err = m
            .upsert(PluginObject::Pool(&pool("p", GIB).0))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Sql);
        assert!(matches!(err, Error::Postgres { .. }), "{err:?}");
        assert!(
            err.to_string()
                .contains("connect to PostgreSQL at postgres://"),
            "{err}"
        );
        assert!(err.to_string().contains("/no_such_db"), "{err}");
        schema.drop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn postgres_connection_loss_is_retried() {
    timeout(LIMIT, async {
        let Some(schema) = pg_schema("postgres_connection_loss_is_retried").await else {
            return;
        };
        let config = pg_config(&schema.url);
        let sync = MetaSync::open(config.meta_sync.as_ref().unwrap()).unwrap();
        let h = start_with(config, vec![Arc::new(sync.clone())]).await;
        h.add_pool(pool("p1", 100 * GIB)).await;
        eventually_ok("pool row", || {
            live_row_matches::<StoragePool>(&h, &sync, Kind::Pool, "p1")
        })
        .await;
        // The server drops the controller's connection.
        let pg = sync.as_postgres().unwrap();
        let pid = pg.backend_pid().await.unwrap();
        let killed: bool = schema
            .admin
            .query_one("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap()
            .get(0);
        assert!(killed);
        // The next writes fail at most once, the reconcile retries, and they land.
        h.add_volume(volume("v1", GIB)).await;
        h.pools()
            .patch(
                "p1",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "spec": { "nodeInfo": { "ip": "192.0.2.9" } } })),
            )
            .await
            .unwrap();
        eventually_ok("rows after the reconnect", || async {
            live_row_matches::<AntstorVolume>(&h, &sync, Kind::Volume, "v1").await?;
            live_row_matches::<StoragePool>(&h, &sync, Kind::Pool, "p1").await
        })
        .await;
        assert_ne!(pg.backend_pid().await.unwrap(), pid, "a new connection");
        // The controller did not stop over it.
        assert!(!h.task.is_finished());
        h.stop().await;
        schema.drop().await;
    })
    .await
    .unwrap();
}
