//! The sub-commands: each reads what it needs from the API server and returns the text to
//! print.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use liteio_api::keys::{annotations, labels, managers};
use liteio_api::migration::MigrationPhase;
use liteio_api::naming;
use liteio_api::size::format_bytes;
use liteio_api::{
    AntstorSnapshot, AntstorVolume, StoragePool, VolumeMigration, VolumeMigrationSpec,
};
use serde::Serialize;
use serde_json::json;

use crate::args::OutputFormat;
use crate::error::{CliError, is_not_found};
use crate::table::{Fields, Table};
use crate::view::{self, NONE};

/// At most this many events are shown by `describe`.
const MAX_EVENTS: usize = 10;

/// Renders `value` as JSON or YAML (never called for tables).
pub fn render<T: Serialize>(value: &T, format: OutputFormat) -> Result<String, CliError> {
    match format {
        OutputFormat::Yaml => serde_yaml::to_string(value).map_err(|e| CliError::Render {
            format: "yaml",
            message: e.to_string(),
        }),
        _ => serde_json::to_string_pretty(value)
            .map(|s| s + "\n")
            .map_err(|e| CliError::Render {
                format: "json",
                message: e.to_string(),
            }),
    }
}

async fn list<K>(client: &Client, ns: &str, what: &str) -> Result<Vec<K>, CliError>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| CliError::api(format!("list {what} in namespace {ns}"), &e))
}

fn no_rows(what: &str, ns: &str) -> String {
    format!("No {what} found in namespace {ns}.\n")
}

/// Where `top` reads the disk-agents' metrics: for every StoragePool (sorted by name), its
/// node's address as the agent reports it (`spec.nodeInfo.ip`) at `port`. Pools without
/// an address are left out; none at all is an error that says to use `--metrics-url`.
pub async fn agent_metrics_urls(
    client: &Client,
    ns: &str,
    port: u16,
) -> Result<Vec<String>, CliError> {
    let mut pools: Vec<StoragePool> = list(client, ns, "storagepools").await?;
    pools.sort_by_key(|p| p.name_any());
    let urls: Vec<String> = pools
        .iter()
        .map(|p| p.spec.node_info.ip.trim())
        .filter(|ip| !ip.is_empty())
        .map(|ip| crate::top::agent_url(ip, port))
        .collect();
    if urls.is_empty() {
        return Err(CliError::NoMetrics(format!(
            "no StoragePool in namespace {ns} has a node address (spec.nodeInfo.ip) to find its agent at; name the agents with --metrics-url"
        )));
    }
    Ok(urls)
}

/// `pools`.
pub async fn pools(
    client: &Client,
    ns: &str,
    format: OutputFormat,
    now: Timestamp,
) -> Result<String, CliError> {
    let pools: Vec<StoragePool> = list(client, ns, "storagepools").await?;
    let volumes: Vec<AntstorVolume> = list(client, ns, "antstorvolumes").await?;
    let leases: Vec<Lease> = list(client, ns, "leases").await?;
    let rows = view::pool_rows(&pools, &volumes, &leases, now);
    table_or(&rows, view::pools_table(&rows), format, "pools", ns)
}

/// `volumes`.
pub async fn volumes(client: &Client, ns: &str, format: OutputFormat) -> Result<String, CliError> {
    let volumes: Vec<AntstorVolume> = list(client, ns, "antstorvolumes").await?;
    let dcs: Vec<liteio_api::AntstorDataControl> = list(client, ns, "antstordatacontrols").await?;
    let groups: Vec<liteio_api::AntstorVolumeGroup> =
        list(client, ns, "antstorvolumegroups").await?;
    let rows = view::volume_rows_with_groups(&volumes, &dcs, &groups);
    table_or(&rows, view::volumes_table(&rows), format, "volumes", ns)
}

/// `snapshots`.
pub async fn snapshots(
    client: &Client,
    ns: &str,
    format: OutputFormat,
) -> Result<String, CliError> {
    let snaps: Vec<AntstorSnapshot> = list(client, ns, "antstorsnapshots").await?;
    let rows = view::snapshot_rows(&snaps);
    table_or(&rows, view::snapshots_table(&rows), format, "snapshots", ns)
}

/// `migrations`.
pub async fn migrations(
    client: &Client,
    ns: &str,
    format: OutputFormat,
    now: Timestamp,
) -> Result<String, CliError> {
    let migs: Vec<VolumeMigration> = list(client, ns, "volumemigrations").await?;
    let volumes: Vec<AntstorVolume> = list(client, ns, "antstorvolumes").await?;
    let rows = view::migration_rows(&migs, &volumes, now);
    table_or(
        &rows,
        view::migrations_table(&rows),
        format,
        "migrations",
        ns,
    )
}

/// What `migrate` did, in `-o json|yaml`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct MigrateResult {
    migration: String,
    volume: String,
    /// The node the user asked for (empty: the scheduler's choice).
    to: String,
    /// False when a migration of the volume was already under way.
    created: bool,
    phase: String,
    status: String,
}

/// Name of a new migration of `volume`: `<volume>-mig-<unix seconds>` (cut so that it stays
/// a valid object name).
fn migration_name(volume: &str, now: Timestamp) -> String {
    let suffix = format!("-mig-{}", now.as_second());
    let mut head = volume.to_string();
    let max = 253usize.saturating_sub(suffix.len());
    while head.len() > max {
        head.pop();
    }
    format!("{}{suffix}", head.trim_end_matches(['-', '.']))
}

/// `migrate VOLUME [--to NODE]`: creates a VolumeMigration of the volume, unless one that
/// has not finished exists already; then reports that one.
pub async fn migrate(
    client: &Client,
    ns: &str,
    volume: &str,
    to: Option<&str>,
    format: OutputFormat,
    now: Timestamp,
) -> Result<String, CliError> {
    let vol: AntstorVolume = get(client, ns, "volume", volume).await?;
    let to = to.unwrap_or_default();
    if !to.is_empty() && vol.target_node() == Some(to) {
        return Err(CliError::Refused(format!(
            "volume {volume} is already on node {to}; name another node with --to, or leave it out"
        )));
    }
    let migs: Vec<VolumeMigration> = list(client, ns, "volumemigrations").await?;
    let running = migs.iter().find(|m| {
        m.spec.source_volume.name == volume
            && m.phase() != MigrationPhase::Finished
            && m.metadata.deletion_timestamp.is_none()
    });
    let (mig, created) = match running {
        Some(m) => (m.clone(), false),
        None => {
            let mut m =
                VolumeMigration::new(&migration_name(volume, now), VolumeMigrationSpec::default());
            m.metadata.namespace = Some(ns.to_string());
            m.spec.source_volume.namespace = ns.to_string();
            m.spec.source_volume.name = volume.to_string();
            m.spec.dest_volume.target_node_id = to.to_string();
            let api: Api<VolumeMigration> = Api::namespaced(client.clone(), ns);
            let pp = kube::api::PostParams {
                field_manager: Some(managers::CLI.to_string()),
                ..kube::api::PostParams::default()
            };
            let out = api.create(&pp, &m).await.map_err(|e| {
                CliError::api(
                    format!("create volumemigration {} in namespace {ns}", m.name_any()),
                    &e,
                )
            })?;
            (out, true)
        }
    };
    let result = MigrateResult {
        migration: mig.name_any(),
        volume: volume.to_string(),
        to: mig.spec.dest_volume.target_node_id.clone(),
        created,
        phase: mig.phase().as_str().to_string(),
        status: mig.status_name().to_string(),
    };
    if format != OutputFormat::Table {
        return render(&result, format);
    }
    let dest = if result.to.is_empty() {
        "a node the scheduler picks".to_string()
    } else {
        format!("node {}", result.to)
    };
    Ok(if created {
        format!(
            "migration {} created: volume {volume} moves to {dest}; follow it with `kubectl liteio migrations`\n",
            result.migration
        )
    } else {
        format!(
            "volume {volume} is already being migrated by migration {} to {dest} (phase {}, status {}); nothing created\n",
            result.migration,
            result.phase,
            if result.status.is_empty() {
                NONE
            } else {
                result.status.as_str()
            }
        )
    })
}

fn table_or<T: Serialize>(
    rows: &[T],
    table: Table,
    format: OutputFormat,
    what: &str,
    ns: &str,
) -> Result<String, CliError> {
    match format {
        OutputFormat::Table if table.is_empty() => Ok(no_rows(what, ns)),
        OutputFormat::Table => Ok(table.render()),
        other => render(&rows, other),
    }
}

async fn get<K>(client: &Client, ns: &str, kind: &'static str, name: &str) -> Result<K, CliError>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    match api.get(name).await {
        Ok(o) => Ok(o),
        Err(e) if is_not_found(&e) => Err(CliError::NotFound {
            kind,
            name: name.to_string(),
            namespace: ns.to_string(),
        }),
        Err(e) => Err(CliError::api(
            format!("get {kind} {name} in namespace {ns}"),
            &e,
        )),
    }
}

/// An event as `describe` shows it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventView {
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Reason.
    pub reason: String,
    /// Seconds since the event was last seen.
    pub age_seconds: Option<i64>,
    /// Reporting component.
    pub from: String,
    /// Message.
    pub message: String,
}

/// Recent events about `name` of `kind`; an error is shown rather than failing `describe`.
async fn events(
    client: &Client,
    ns: &str,
    kind: &str,
    name: &str,
    now: Timestamp,
) -> Result<Vec<EventView>, String> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().fields(&format!(
        "involvedObject.kind={kind},involvedObject.name={name}"
    ));
    let mut items = api.list(&lp).await.map_err(|e| match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    })?;
    let seen = |e: &Event| -> Option<Timestamp> {
        e.last_timestamp
            .as_ref()
            .map(|t| t.0)
            .or(e.event_time.as_ref().map(|t| t.0))
            .or(e.first_timestamp.as_ref().map(|t| t.0))
            .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))
    };
    items.items.sort_by_key(|e| seen(e));
    let start = items.items.len().saturating_sub(MAX_EVENTS);
    Ok(items.items[start..]
        .iter()
        .map(|e| EventView {
            type_: e.type_.clone().unwrap_or_default(),
            reason: e.reason.clone().unwrap_or_default(),
            age_seconds: seen(e).map(|t| view::seconds_since(t, now)),
            from: e
                .reporting_component
                .clone()
                .filter(|s| !s.is_empty())
                .or_else(|| e.source.as_ref().and_then(|s| s.component.clone()))
                .unwrap_or_default(),
            message: e.message.clone().unwrap_or_default(),
        })
        .collect())
}

fn events_section(f: &mut Fields, events: &Result<Vec<EventView>, String>) {
    match events {
        Err(msg) => {
            f.field(0, "Events", format!("<cannot list: {msg}>"));
        }
        Ok(list) if list.is_empty() => {
            f.field(0, "Events", "<none>");
        }
        Ok(list) => {
            f.heading(0, "Events");
            let mut t = Table::new(&["TYPE", "REASON", "AGE", "FROM", "MESSAGE"]);
            for e in list {
                t.row(vec![
                    e.type_.clone(),
                    e.reason.clone(),
                    e.age_seconds
                        .map(view::format_age)
                        .unwrap_or_else(|| NONE.into()),
                    e.from.clone(),
                    e.message.clone(),
                ]);
            }
            f.text(1, t.render());
        }
    }
}

fn meta_section<K: Resource>(f: &mut Fields, obj: &K, now: Timestamp) {
    let m = obj.meta();
    f.map(0, "Labels", m.labels.iter().flatten());
    f.map(0, "Annotations", m.annotations.iter().flatten());
    f.list(0, "Finalizers", m.finalizers.clone().unwrap_or_default());
    if let Some(t) = &m.creation_timestamp {
        f.field(
            0,
            "Created",
            format!(
                "{} ({} ago)",
                t.0,
                view::format_age(view::seconds_since(t.0, now))
            ),
        );
    }
    if let Some(t) = &m.deletion_timestamp {
        f.field(0, "Deleting since", t.0.to_string());
    }
}

fn or_none(s: &str) -> String {
    if s.is_empty() {
        "<none>".to_string()
    } else {
        s.to_string()
    }
}

fn bytes(b: u64) -> String {
    format!("{} ({b} bytes)", format_bytes(b))
}

/// What `describe volume -o json|yaml` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct VolumeDescription<'a> {
    volume: &'a AntstorVolume,
    subsystem_nqn: Option<String>,
    serial_number: Option<String>,
    events: Vec<EventView>,
}

/// `describe volume NAME`.
pub async fn describe_volume(
    client: &Client,
    ns: &str,
    name: &str,
    format: OutputFormat,
    now: Timestamp,
) -> Result<String, CliError> {
    let vol: AntstorVolume = get(client, ns, "volume", name).await?;
    let events = events(client, ns, "AntstorVolume", name, now).await;
    let target = vol.spec.spdk_target.as_ref();
    // The names the agent uses even before the export exists.
    let nqn = target
        .map(|t| t.subsys_nqn.clone())
        .filter(|s| !s.is_empty())
        .or_else(|| (!vol.spec.uuid.is_empty()).then(|| naming::subsys_nqn(&vol.spec.uuid)));
    let serial = target
        .map(|t| t.sn.clone())
        .filter(|s| !s.is_empty())
        .or_else(|| (!vol.spec.uuid.is_empty()).then(|| naming::serial_number(&vol.spec.uuid)));
    if format != OutputFormat::Table {
        return render(
            &VolumeDescription {
                volume: &vol,
                subsystem_nqn: nqn,
                serial_number: serial,
                events: events.unwrap_or_default(),
            },
            format,
        );
    }
    let s = &vol.spec;
    let mut f = Fields::new();
    f.field(0, "Name", vol.name_any())
        .field(0, "Namespace", vol.namespace().unwrap_or_default())
        .field(0, "UUID", or_none(&s.uuid))
        .field(0, "Size", bytes(s.size_byte));
    let allocated = vol.total_size();
    if allocated != s.size_byte {
        f.field(0, "Charged to pool", bytes(allocated));
    }
    f.field(
        0,
        "Type",
        s.type_
            .map(|t| t.to_string())
            .unwrap_or_else(|| "<none>".into()),
    )
    .field(0, "Thin", s.is_thin.to_string())
    .field(
        0,
        "Position advice",
        or_none(&s.position_advice.to_string()),
    )
    .field(0, "State", view::volume_state(&vol));
    if let Some(msg) = vol.status.as_ref().map(|st| st.message.as_str())
        && !msg.is_empty()
    {
        f.field(0, "Message", msg);
    }
    f.field(0, "Pool", or_none(&s.target_node_id));
    match &s.host_node {
        Some(h) if !h.id.is_empty() => {
            let local = if vol.is_local() { "local" } else { "remote" };
            f.field(0, "Host", format!("{} ({}, {local})", h.id, or_none(&h.ip)));
        }
        _ => {
            f.field(0, "Host", "<none>");
        }
    }
    f.heading(0, "Engine");
    let mut engine_named = false;
    if let Some(l) = &s.spdk_lvol {
        f.field(1, "SPDK lvol", l.full_name());
        if l.thin {
            f.field(1, "Thin lvol", "true");
        }
        engine_named = true;
    }
    if let Some(l) = &s.kernel_lvol {
        f.field(1, "LV", or_none(&l.name))
            .field(1, "Device", or_none(&l.dev_path));
        engine_named = true;
    }
    if !engine_named {
        f.field(1, "Volume", "<not created yet>");
    }
    if let Some(layout) = vol.annotations().get(annotations::LV_LAYOUT) {
        f.field(1, "LV layout", layout.clone());
    }
    f.heading(0, "Export");
    f.field(1, "Subsystem NQN", nqn.unwrap_or_else(|| "<none>".into()))
        .field(1, "Serial", serial.unwrap_or_else(|| "<none>".into()));
    match target {
        Some(t) => {
            f.field(
                1,
                "Listener",
                format!(
                    "{}:{} ({} {})",
                    or_none(&t.address),
                    or_none(&t.svc_id),
                    or_none(&t.trans_type),
                    or_none(&t.addr_fam)
                ),
            )
            .field(1, "Port", or_none(&t.svc_id))
            .field(1, "Bdev", or_none(&t.bdev_name))
            .field(1, "Namespace UUID", or_none(&t.ns_uuid));
        }
        None => {
            f.field(1, "Listener", "<not exported>");
        }
    }
    if let Some(p) = vol
        .status
        .as_ref()
        .and_then(|st| st.csi_node_pub_params.as_ref())
    {
        f.heading(0, "Published");
        f.field(1, "Staging path", or_none(&p.staging_target_path))
            .field(1, "Target path", or_none(&p.target_path));
    }
    meta_section(&mut f, &vol, now);
    events_section(&mut f, &events);
    Ok(f.render())
}

/// What `describe pool -o json|yaml` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PoolDescription<'a> {
    pool: &'a StoragePool,
    lease: Option<&'a Lease>,
    heartbeat_age_seconds: Option<i64>,
    volumes: Vec<view::VolumeRow>,
    events: Vec<EventView>,
}

/// `describe pool NAME`.
pub async fn describe_pool(
    client: &Client,
    ns: &str,
    name: &str,
    format: OutputFormat,
    now: Timestamp,
) -> Result<String, CliError> {
    let pool: StoragePool = get(client, ns, "pool", name).await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let lease = leases
        .get_opt(name)
        .await
        .map_err(|e| CliError::api(format!("get lease {name} in namespace {ns}"), &e))?;
    let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("{}={name}", labels::TARGET_NODE_ID));
    let mut on_pool: Vec<AntstorVolume> = vols
        .list(&lp)
        .await
        .map_err(|e| CliError::api(format!("list antstorvolumes in namespace {ns}"), &e))?
        .items;
    // The label is set with targetNodeId; keep only volumes that really name this pool.
    on_pool.retain(|v| v.target_node() == Some(name));
    let volume_rows = view::volume_rows(&on_pool);
    let events = events(client, ns, "StoragePool", name, now).await;
    let age = lease
        .as_ref()
        .and_then(view::lease_renewed)
        .map(|t| view::seconds_since(t, now));
    if format != OutputFormat::Table {
        return render(
            &PoolDescription {
                pool: &pool,
                lease: lease.as_ref(),
                heartbeat_age_seconds: age,
                volumes: volume_rows,
                events: events.unwrap_or_default(),
            },
            format,
        );
    }
    let spec = &pool.spec;
    let info = &spec.node_info;
    let mut f = Fields::new();
    f.field(0, "Name", pool.name_any())
        .field(0, "Namespace", pool.namespace().unwrap_or_default())
        .field(
            0,
            "Node",
            format!(
                "{} (ip {}, hostname {})",
                or_none(&info.id),
                or_none(&info.ip),
                or_none(&info.hostname)
            ),
        );
    let addrs: Vec<String> = spec
        .addresses
        .iter()
        .map(|a| format!("{} {}", a.type_, a.address))
        .collect();
    if !addrs.is_empty() {
        f.list(0, "Addresses", addrs);
    }
    f.field(
        0,
        "Engine",
        pool.mode()
            .map(|m| m.to_string())
            .unwrap_or_else(|| "<not reported>".into()),
    );
    let lvm = &spec.kernel_lvm;
    let lvs = &spec.spdk_lv_store;
    if !lvm.name.is_empty() {
        f.field(1, "Volume group", lvm.name.clone())
            .field(1, "VG UUID", or_none(&lvm.vg_uuid))
            .field(1, "Extent size", bytes(lvm.extend_size))
            .field(1, "Extents", lvm.extend_count.to_string())
            .field(1, "PVs", lvm.pv_count.to_string());
        let reserved: Vec<String> = lvm
            .reserved_lvol
            .iter()
            .map(|r| format!("{} {} {}", r.name, format_bytes(r.size_byte), r.dev_path))
            .collect();
        f.list(1, "Reserved LVs", reserved);
    }
    if !lvs.name.is_empty() {
        f.field(1, "LVStore", lvs.name.clone())
            .field(1, "LVStore UUID", or_none(&lvs.uuid))
            .field(1, "Base bdev", or_none(&lvs.base_bdev))
            .field(
                1,
                "Cluster size",
                bytes(u64::try_from(lvs.cluster_size).unwrap_or(0)),
            )
            .field(1, "Data clusters", lvs.total_data_clusters.to_string());
    }
    // Saturating: sizes and annotations come from the API server.
    let charged = on_pool
        .iter()
        .map(AntstorVolume::total_size)
        .fold(0u64, |sum, s| sum.saturating_add(s));
    f.field(0, "Total", bytes(pool.total_bytes()))
        .field(0, "Schedulable", bytes(pool.available_bytes()))
        .field(0, "Free (reported)", bytes(pool.reported_free_bytes()))
        .field(0, "Charged to volumes", bytes(charged));
    let state = view::pool_state(&pool);
    f.field(0, "State", or_none(&state)).field(
        0,
        "Scheduling",
        if view::is_locked(&pool) {
            "locked (label obnvmf/pool-scheduling-status=locked)"
        } else {
            "open"
        },
    );
    if let Some(msg) = pool.status.as_ref().map(|s| s.message.as_str())
        && !msg.is_empty()
    {
        f.field(0, "Message", msg);
    }
    let conditions = pool
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    if conditions.is_empty() {
        f.field(0, "Conditions", "<none>");
    } else {
        f.heading(0, "Conditions");
        let mut t = Table::new(&["TYPE", "STATUS", "MESSAGE"]);
        for c in &conditions {
            let word = |v: serde_json::Value| v.as_str().map(str::to_string).unwrap_or_default();
            t.row(vec![
                word(serde_json::to_value(c.type_).unwrap_or_default()),
                word(serde_json::to_value(c.status).unwrap_or_default()),
                c.message.clone(),
            ]);
        }
        f.text(1, t.render());
    }
    match (&lease, age) {
        (Some(l), _) => {
            f.heading(0, "Heartbeat");
            let spec = l.spec.clone().unwrap_or_default();
            f.field(
                1,
                "Lease",
                format!("{}/{}", l.namespace().unwrap_or_default(), l.name_any()),
            )
            .field(1, "Holder", spec.holder_identity.unwrap_or_default());
            match (view::lease_renewed(l), age) {
                (Some(t), Some(a)) => {
                    f.field(1, "Renewed", format!("{t} ({} ago)", view::format_age(a)));
                }
                _ => {
                    f.field(1, "Renewed", "<never>");
                }
            }
            if let Some(d) = spec.lease_duration_seconds {
                f.field(1, "Duration", format!("{d}s"));
            }
        }
        (None, _) => {
            f.field(0, "Heartbeat", "<no Lease>");
        }
    }
    let ann = pool.annotations();
    f.field(
        0,
        "Host NQN",
        ann.get(annotations::HOST_NQN)
            .cloned()
            .unwrap_or_else(|| "<none>".into()),
    );
    if let Some(v) = ann.get(annotations::TGT_VERSION) {
        f.field(0, "Target version", v.clone());
    }
    meta_section(&mut f, &pool, now);
    if volume_rows.is_empty() {
        f.field(0, "Volumes", "<none>");
    } else {
        f.heading(0, &format!("Volumes ({})", volume_rows.len()));
        let mut t = Table::new(&["NAME", "SIZE", "HOST", "STATE", "EXPORT"]);
        for r in &volume_rows {
            t.row(vec![
                r.name.clone(),
                format_bytes(r.size_bytes),
                if r.host.is_empty() {
                    NONE.into()
                } else {
                    r.host.clone()
                },
                r.state.clone(),
                r.export.clone().unwrap_or_else(|| NONE.into()),
            ]);
        }
        f.text(1, t.render());
    }
    events_section(&mut f, &events);
    Ok(f.render())
}

/// The result of `lock` / `unlock` in `-o json|yaml`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct LockResult {
    pool: String,
    locked: bool,
    changed: bool,
}

/// `lock pool NAME` (`lock = true`) and `unlock pool NAME`: a merge patch of the pool's
/// `obnvmf/pool-scheduling-status` label under the plugin's field manager. Idempotent.
pub async fn set_lock(
    client: &Client,
    ns: &str,
    name: &str,
    lock: bool,
    format: OutputFormat,
) -> Result<String, CliError> {
    let pool: StoragePool = get(client, ns, "pool", name).await?;
    let was = view::is_locked(&pool);
    let value = if lock {
        json!(labels::POOL_SCHEDULING_LOCKED)
    } else {
        serde_json::Value::Null
    };
    let mut labels_patch = BTreeMap::new();
    labels_patch.insert(labels::POOL_SCHEDULING_STATUS, value);
    let body = json!({"metadata": {"labels": labels_patch}});
    let api: Api<StoragePool> = Api::namespaced(client.clone(), ns);
    let pp = PatchParams {
        field_manager: Some(managers::CLI.to_string()),
        ..PatchParams::default()
    };
    let verb = if lock { "lock" } else { "unlock" };
    let patched = api
        .patch(name, &pp, &Patch::Merge(&body))
        .await
        .map_err(|e| match e {
            e if is_not_found(&e) => CliError::NotFound {
                kind: "pool",
                name: name.to_string(),
                namespace: ns.to_string(),
            },
            e => CliError::api(format!("{verb} pool {name} in namespace {ns}"), &e),
        })?;
    let now_locked = view::is_locked(&patched);
    let result = LockResult {
        pool: name.to_string(),
        locked: now_locked,
        changed: was != now_locked,
    };
    if format != OutputFormat::Table {
        return render(&result, format);
    }
    let word = if now_locked { "locked" } else { "unlocked" };
    Ok(if result.changed {
        format!("pool {name} {word}\n")
    } else {
        format!("pool {name} already {word}\n")
    })
}

/// What `rotate-keys` did to one volume, in `-o json|yaml`. Never the keys.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Rotated {
    volume: String,
    secret: String,
    rotated_at: String,
}

/// `rotate-keys VOLUME` or `rotate-keys --node NODE`: new DH-HMAC-CHAP keys into each
/// volume's Secret (a merge patch guarded by the Secret's resourceVersion, so a concurrent
/// change is not overwritten), then the volume's `obnvmf/keys-rotated-at` annotation, which
/// makes the disk-agent apply them to the export at once. The TLS PSK, if any, is kept.
pub async fn rotate_keys(
    client: &Client,
    ns: &str,
    volume: Option<&str>,
    node: Option<&str>,
    format: OutputFormat,
    now: Timestamp,
) -> Result<String, CliError> {
    let vols: Vec<AntstorVolume> = match (volume, node) {
        (Some(name), _) => vec![get(client, ns, "volume", name).await?],
        (None, Some(node)) => list::<AntstorVolume>(client, ns, "antstorvolumes")
            .await?
            .into_iter()
            .filter(|v| {
                v.spec.target_node_id == node
                    || v.spec.host_node.as_ref().is_some_and(|h| h.id == node)
            })
            .collect(),
        (None, None) => {
            return Err(CliError::Refused(
                "rotate-keys: name a volume or give --node".into(),
            ));
        }
    };
    let mut done = Vec::new();
    for v in &vols {
        done.push(rotate_one(client, ns, v, now).await?);
    }
    if format != OutputFormat::Table {
        return render(&done, format);
    }
    if done.is_empty() {
        return Ok(format!(
            "no volume in namespace {ns} is stored on or consumed by node {}\n",
            node.unwrap_or_default()
        ));
    }
    let mut out = String::new();
    for r in &done {
        out.push_str(&format!(
            "volume {}: new keys in Secret {ns}/{}; the disk-agent applies them to the export and then sets its annotation {}={} (connected hosts stay connected, new connections need the new keys)\n",
            r.volume, r.secret, annotations::KEYS_APPLIED_AT, r.rotated_at
        ));
    }
    Ok(out)
}

async fn rotate_one(
    client: &Client,
    ns: &str,
    vol: &AntstorVolume,
    now: Timestamp,
) -> Result<Rotated, CliError> {
    use k8s_openapi::api::core::v1::Secret;
    use liteio_api::auth::VolumeKeys;
    let name = vol.name_any();
    let secret_name = vol.auth_secret_name();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret = match secrets.get(&secret_name).await {
        Ok(s) => s,
        Err(e) if is_not_found(&e) => {
            return Err(CliError::Refused(format!(
                "volume {name} has no keys Secret {ns}/{secret_name}: the CSI driver makes it at CreateVolume, the disk-agent when it exports the volume with nvmf.auth: dhchap"
            )));
        }
        Err(e) => {
            return Err(CliError::api(
                format!("get Secret {secret_name} in namespace {ns}"),
                &e,
            ));
        }
    };
    // The PSK stays: SPDK sets it when a host is added and cannot change it live.
    let old = secret
        .data
        .as_ref()
        .and_then(|d| VolumeKeys::from_secret_data(d).ok());
    let mut keys = VolumeKeys::generate(false)
        .map_err(|e| CliError::Refused(format!("volume {name}: cannot generate keys: {e}")))?;
    keys.tls_psk = old.and_then(|k| k.tls_psk);
    let pp = PatchParams {
        field_manager: Some(managers::CLI.to_string()),
        ..PatchParams::default()
    };
    let body = json!({
        "metadata": {"resourceVersion": secret.resource_version()},
        "data": keys.to_secret_data(),
    });
    secrets
        .patch(&secret_name, &pp, &Patch::Merge(&body))
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 409 => CliError::Refused(format!(
                "Secret {ns}/{secret_name} changed while its keys were being replaced; run rotate-keys again"
            )),
            e => CliError::api(format!("replace the keys in Secret {secret_name}"), &e),
        })?;
    let at = now.to_string();
    let body = json!({"metadata": {"annotations": {annotations::KEYS_ROTATED_AT: at}}});
    let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), ns);
    vols.patch(&name, &pp, &Patch::Merge(&body))
        .await
        .map_err(|e| CliError::api(format!("annotate volume {name} (its new keys are in Secret {secret_name}; the agent applies them at its next pass)"), &e))?;
    Ok(Rotated {
        volume: name,
        secret: secret_name,
        rotated_at: at,
    })
}

/// The limits `qos` was asked to change (`None`: keep).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosChange {
    /// `--iops`.
    pub iops: Option<u64>,
    /// `--mbps`.
    pub mbps: Option<u64>,
    /// `--read-mbps`.
    pub read_mbps: Option<u64>,
    /// `--write-mbps`.
    pub write_mbps: Option<u64>,
}

/// What `qos` shows, in `-o json|yaml`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct QosResult {
    volume: String,
    /// `spec.qos` after the command.
    limits: liteio_api::qos::VolumeQos,
    /// What the disk-agent reports in force (`liteio.io/qos-in-force`); `None`: nothing
    /// recorded (unlimited, or not applied yet).
    in_force: Option<String>,
    /// Whether the limits in force are the spec's.
    applied: bool,
    changed: bool,
}

/// `qos VOLUME [--iops N] [--mbps N] [--read-mbps N] [--write-mbps N]`.
pub async fn qos(
    client: &Client,
    ns: &str,
    name: &str,
    change: QosChange,
    format: OutputFormat,
) -> Result<String, CliError> {
    use liteio_api::qos::VolumeQos;
    let vol: AntstorVolume = get(client, ns, "volume", name).await?;
    let old = vol.spec.qos.unwrap_or_default();
    let new = VolumeQos {
        iops: change.iops.unwrap_or(old.iops),
        mbps: change.mbps.unwrap_or(old.mbps),
        read_mbps: change.read_mbps.unwrap_or(old.read_mbps),
        write_mbps: change.write_mbps.unwrap_or(old.write_mbps),
    };
    if let Err(e) = new.validate() {
        let flag = match e.field.as_str() {
            "spec.qos.iops" => "--iops",
            "spec.qos.mbps" => "--mbps",
            "spec.qos.readMbps" => "--read-mbps",
            _ => "--write-mbps",
        };
        return Err(CliError::Refused(format!("{flag}: {}", e.reason)));
    }
    let changed = new != old;
    let vol = if changed {
        let lvm_or_file = vol.spec.type_ == Some(liteio_api::VolumeType::KernelLVol)
            || vol.spec.kernel_lvol.is_some();
        if !new.is_unlimited() && lvm_or_file {
            return Err(CliError::Refused(format!(
                "volume {name} is an LVM or file volume: only the SPDK engine enforces QoS limits"
            )));
        }
        let api: Api<AntstorVolume> = Api::namespaced(client.clone(), ns);
        let pp = PatchParams {
            field_manager: Some(managers::CLI.to_string()),
            ..PatchParams::default()
        };
        let body = json!({"spec": {"qos": if new.is_unlimited() { serde_json::Value::Null } else { json!(new) }}});
        api.patch(name, &pp, &Patch::Merge(&body))
            .await
            .map_err(|e| match e {
                e if is_not_found(&e) => CliError::NotFound {
                    kind: "volume",
                    name: name.to_string(),
                    namespace: ns.to_string(),
                },
                e => CliError::api(
                    format!("set the QoS limits of volume {name} in namespace {ns}"),
                    &e,
                ),
            })?
    } else {
        vol
    };
    let result = QosResult {
        volume: name.to_string(),
        limits: new,
        in_force: vol.annotations().get(annotations::QOS_IN_FORCE).cloned(),
        applied: liteio_api::qos::applied(&vol),
        changed,
    };
    if format != OutputFormat::Table {
        return render(&result, format);
    }
    let state = if result.applied {
        "in force"
    } else {
        "not in force yet: the disk-agent applies them to the live export"
    };
    Ok(format!(
        "volume {name}: {} ({state}){}\n",
        new.summary(),
        if changed {
            format!(", was {}", old.summary())
        } else {
            String::new()
        }
    ))
}
