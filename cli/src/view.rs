//! What the list commands show, computed from API objects without I/O, so tests can feed
//! objects and a fixed clock.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use liteio_api::keys::{annotations, labels};
use liteio_api::size::format_bytes;
use liteio_api::{
    AntstorDataControl, AntstorSnapshot, AntstorVolume, AntstorVolumeGroup, StoragePool,
    VolumeMigration,
};
use serde::Serialize;

use crate::table::Table;

/// Placeholder for an absent value in tables.
pub const NONE: &str = "-";

/// One row of `pools`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRow {
    /// Pool name (= node name).
    pub node: String,
    /// The agent's pooling mode (`File`, `KernelLVM`, `SpdkLVStore`; from the spec when the
    /// agent does not say), or empty when the agent has not reported yet.
    pub engine: String,
    /// Total bytes.
    pub total_bytes: u64,
    /// Free bytes as the agent reports them.
    pub free_bytes: u64,
    /// Volumes scheduled to the pool.
    pub volumes: usize,
    /// `ready`, `unknown`, `offline`, `locked`, or empty before the controller wrote it.
    pub state: String,
    /// Locked by the `obnvmf/pool-scheduling-status` label.
    pub locked: bool,
    /// Seconds since the agent last renewed its Lease; `None` without a Lease.
    pub heartbeat_age_seconds: Option<i64>,
}

/// One row of `volumes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeRow {
    /// Volume name (the PV name).
    pub name: String,
    /// Volume UUID (the CSI volume id).
    pub uuid: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Pool (node) holding the data; empty until scheduled.
    pub pool: String,
    /// Node of the consuming pod; empty when unknown.
    pub host: String,
    /// `creating`, `ready`, `deleted`; `deleting` once a deletion was requested.
    pub state: String,
    /// NVMe/TCP listener `address:port`, once exported.
    pub export: Option<String>,
    /// QoS limits (`spec.qos`), `unlimited` when none; `(pending)` appended while the
    /// disk-agent has not applied them.
    pub qos: String,
    /// A multi-disk volume: how it is assembled (`raid0/KernelLVM`); empty for a volume.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub layout: String,
    /// A member of a multi-disk volume: that volume's name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub member_of: String,
    /// A replicated volume: its health (`healthy`, `rebuilding`, `degraded`, `failed`), once
    /// the controller reported it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    /// A replicated volume: how many replicas it has.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// A replica of a replicated volume: its state in the raid as the assembling agent
    /// reports it (`online`, `rebuilding`, `failed`, `missing`), or `replaced` for a member
    /// that is being taken out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_state: Option<String>,
    /// A replica being rebuilt: how far, in percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rebuild_percent: Option<u8>,
}

/// One row of `snapshots`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRow {
    /// Snapshot name.
    pub name: String,
    /// Snapshot UUID (the CSI snapshot id).
    pub uuid: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Origin volume.
    pub origin: String,
    /// Node holding the origin volume.
    pub node: String,
    /// `KernelLVol` or `SpdkLVol`.
    pub vol_type: String,
    /// `creating`, `ready`, `merging`, `merged`; `deleting` once a deletion was requested.
    pub state: String,
}

/// Seconds from `then` to `now` (0 when `then` is in the future).
pub fn seconds_since(then: Timestamp, now: Timestamp) -> i64 {
    (now.as_second() - then.as_second()).max(0)
}

/// `kubectl`-style age: `45s`, `3m20s`, `17m`, `5h3m`, `20h`, `3d4h`, `12d`.
pub fn format_age(seconds: i64) -> String {
    let s = seconds.max(0);
    let (m, h, d) = (s / 60, s / 3600, s / 86_400);
    if s < 120 {
        format!("{s}s")
    } else if s < 600 {
        if s % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", s % 60)
        }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if d < 8 {
        if h % 24 == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{}h", h % 24)
        }
    } else {
        format!("{d}d")
    }
}

/// When the Lease was last renewed (or acquired).
pub fn lease_renewed(lease: &Lease) -> Option<Timestamp> {
    let spec = lease.spec.as_ref()?;
    spec.renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0)
}

/// True when the pool carries the lock label.
pub fn is_locked(pool: &StoragePool) -> bool {
    pool.labels()
        .get(labels::POOL_SCHEDULING_STATUS)
        .is_some_and(|v| v == labels::POOL_SCHEDULING_LOCKED)
}

/// The pool's state word (`ready`, …), empty before the controller wrote one.
pub fn pool_state(pool: &StoragePool) -> String {
    pool.status
        .as_ref()
        .and_then(|s| s.status)
        .and_then(|s| serde_json::to_value(s).ok())
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The volume's state word; `deleting` once it has a deletion timestamp.
pub fn volume_state(vol: &AntstorVolume) -> String {
    if vol.metadata.deletion_timestamp.is_some() {
        return "deleting".into();
    }
    serde_json::to_value(vol.phase())
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The snapshot's state word; `deleting` once it has a deletion timestamp.
pub fn snapshot_state(snap: &AntstorSnapshot) -> String {
    if snap.metadata.deletion_timestamp.is_some() {
        return "deleting".into();
    }
    snap.status
        .as_ref()
        .and_then(|s| serde_json::to_value(s.status).ok())
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "creating".into())
}

/// `address:port` of the volume's NVMe/TCP listener, once exported.
pub fn volume_export(vol: &AntstorVolume) -> Option<String> {
    let t = vol.spec.spdk_target.as_ref()?;
    if t.address.is_empty() && t.svc_id.is_empty() {
        return None;
    }
    Some(format!("{}:{}", t.address, t.svc_id))
}

/// Rows of `pools`: one per pool, sorted by name, with the volume counts and Lease ages.
pub fn pool_rows(
    pools: &[StoragePool],
    volumes: &[AntstorVolume],
    leases: &[Lease],
    now: Timestamp,
) -> Vec<PoolRow> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for v in volumes {
        if let Some(node) = v.target_node() {
            *counts.entry(node).or_default() += 1;
        }
    }
    let renewed: BTreeMap<String, Timestamp> = leases
        .iter()
        .filter_map(|l| Some((l.name_any(), lease_renewed(l)?)))
        .collect();
    let mut rows: Vec<PoolRow> = pools
        .iter()
        .map(|p| {
            let name = p.name_any();
            PoolRow {
                engine: p
                    .annotations()
                    .get(annotations::POOLING_MODE)
                    .cloned()
                    .or_else(|| p.mode().map(|m| m.to_string()))
                    .unwrap_or_default(),
                total_bytes: p.total_bytes(),
                free_bytes: p.reported_free_bytes(),
                volumes: counts.get(name.as_str()).copied().unwrap_or(0),
                state: pool_state(p),
                locked: is_locked(p),
                heartbeat_age_seconds: renewed.get(&name).map(|t| seconds_since(*t, now)),
                node: name,
            }
        })
        .collect();
    rows.sort_by(|a, b| a.node.cmp(&b.node));
    rows
}

/// Rows of `volumes`, sorted by name.
pub fn volume_rows(volumes: &[AntstorVolume]) -> Vec<VolumeRow> {
    let mut rows: Vec<VolumeRow> = volumes
        .iter()
        .map(|v| VolumeRow {
            name: v.name_any(),
            uuid: v.spec.uuid.clone(),
            size_bytes: v.spec.size_byte,
            pool: v.spec.target_node_id.clone(),
            host: v
                .spec
                .host_node
                .as_ref()
                .map(|h| h.id.clone())
                .unwrap_or_default(),
            state: volume_state(v),
            export: volume_export(v),
            qos: volume_qos(v),
            layout: String::new(),
            member_of: v
                .labels()
                .get(labels::VOL_GROUP_NAME)
                .cloned()
                .unwrap_or_default(),
            health: None,
            replicas: None,
            replica_state: None,
            rebuild_percent: None,
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

/// Rows of `volumes` with the multi-disk volumes: each data control's row (its members'
/// nodes as its pool, where it is assembled) followed by its members' rows; plain volumes
/// after, by name. A replicated volume (raid1) says how many replicas it has and its health;
/// each replica its state in the raid and rebuild progress (`status.replicas`), or
/// `replaced` while a replaced member is taken out.
pub fn volume_rows_with_groups(
    volumes: &[AntstorVolume],
    data_controls: &[AntstorDataControl],
    groups: &[AntstorVolumeGroup],
) -> Vec<VolumeRow> {
    let all = volume_rows(volumes);
    let mut out = Vec::new();
    let mut dcs: Vec<&AntstorDataControl> = data_controls.iter().collect();
    dcs.sort_by_key(|d| d.name_any());
    let mut shown = std::collections::BTreeSet::new();
    for dc in dcs {
        let group_names: Vec<&str> = dc
            .spec
            .volume_groups
            .iter()
            .map(|g| g.name.as_str())
            .collect();
        let members: Vec<&VolumeRow> = all
            .iter()
            .filter(|r| group_names.contains(&r.member_of.as_str()))
            .collect();
        let its_groups: Vec<&AntstorVolumeGroup> = groups
            .iter()
            .filter(|g| group_names.contains(&g.name_any().as_str()))
            .collect();
        let placed_nodes: Vec<String> = its_groups
            .iter()
            .flat_map(|g| g.spec.volumes.iter().map(|m| m.target_node_name.clone()))
            .collect();
        let replicated = dc.is_replicated();
        let replica_count = replicated.then(|| {
            let desired: i64 = its_groups
                .iter()
                .map(|g| g.spec.desired_volume_spec.desired_count)
                .sum();
            if desired > 0 {
                u32::try_from(desired).unwrap_or(0)
            } else {
                u32::try_from(placed_nodes.len()).unwrap_or(0)
            }
        });
        let reports = dc
            .status
            .as_ref()
            .map(|s| s.replicas.clone())
            .unwrap_or_default();
        let replaced: Vec<&str> = volumes
            .iter()
            .filter(|v| {
                v.annotations()
                    .contains_key(liteio_api::replica::ANNO_REPLACED)
            })
            .filter_map(|v| v.metadata.name.as_deref())
            .collect();
        let state = if dc.metadata.deletion_timestamp.is_some() {
            "deleting".to_string()
        } else {
            dc.status
                .as_ref()
                .and_then(|s| s.status)
                .and_then(|s| serde_json::to_value(s).ok())
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| "creating".into())
        };
        out.push(VolumeRow {
            name: dc.name_any(),
            uuid: dc.spec.uuid.clone(),
            size_bytes: u64::try_from(dc.spec.total_size).unwrap_or(0),
            pool: placed_nodes.join(","),
            host: dc.spec.host_node.id.clone(),
            state,
            export: dc
                .status
                .as_ref()
                .and_then(|s| s.spdk_target.as_ref())
                .map(|t| format!("{}:{}", t.address, t.svc_id)),
            qos: "unlimited".into(),
            layout: match replica_count {
                Some(n) => format!("raid1×{n}"),
                None => format!(
                    "{}/{}",
                    serde_json::to_value(dc.spec.raid.level)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                    dc.spec.engine_type
                ),
            },
            member_of: String::new(),
            health: dc
                .status
                .as_ref()
                .and_then(|s| s.health)
                .map(|h| h.as_str().to_string()),
            replicas: replica_count,
            replica_state: None,
            rebuild_percent: None,
        });
        for m in members {
            shown.insert(m.name.clone());
            let mut row = m.clone();
            if replicated {
                match reports.iter().find(|r| r.volume == m.name) {
                    Some(r) => {
                        row.replica_state = Some(r.state.as_str().to_string());
                        row.rebuild_percent = r.rebuild_percent;
                    }
                    None if replaced.contains(&m.name.as_str()) => {
                        row.replica_state = Some("replaced".into());
                    }
                    None => {}
                }
            }
            out.push(row);
        }
    }
    out.extend(all.into_iter().filter(|r| !shown.contains(&r.name)));
    out
}

/// A volume's limits and whether the agent applied them (`liteio.io/qos-in-force`).
fn volume_qos(v: &AntstorVolume) -> String {
    let q = v.spec.qos.unwrap_or_default();
    if liteio_api::qos::applied(v) {
        q.summary()
    } else {
        format!("{} (pending)", q.summary())
    }
}

/// Rows of `snapshots`, sorted by name.
pub fn snapshot_rows(snaps: &[AntstorSnapshot]) -> Vec<SnapshotRow> {
    let mut rows: Vec<SnapshotRow> = snaps
        .iter()
        .map(|s| SnapshotRow {
            name: s.name_any(),
            uuid: s.spec.uuid.clone(),
            size_bytes: u64::try_from(s.spec.size).unwrap_or(0),
            origin: s.spec.origin_vol_name.clone(),
            node: s.spec.origin_vol_target_node_id.clone(),
            vol_type: serde_json::to_value(s.spec.vol_type)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            state: snapshot_state(s),
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

fn or_none(s: &str) -> String {
    if s.is_empty() {
        NONE.to_string()
    } else {
        s.to_string()
    }
}

/// The `pools` table.
pub fn pools_table(rows: &[PoolRow]) -> Table {
    let mut t = Table::new(&[
        "NODE",
        "ENGINE",
        "TOTAL",
        "FREE",
        "VOLUMES",
        "STATE",
        "HEARTBEAT",
    ]);
    for r in rows {
        let state = match (r.state.as_str(), r.locked) {
            ("", true) => "locked".to_string(),
            (s, true) if s != "locked" => format!("{s},locked"),
            (s, _) => or_none(s),
        };
        t.row(vec![
            r.node.clone(),
            or_none(&r.engine),
            format_bytes(r.total_bytes),
            format_bytes(r.free_bytes),
            r.volumes.to_string(),
            state,
            r.heartbeat_age_seconds
                .map(|s| format!("{} ago", format_age(s)))
                .unwrap_or_else(|| NONE.to_string()),
        ]);
    }
    t
}

/// The `volumes` table.
pub fn volumes_table(rows: &[VolumeRow]) -> Table {
    let mut t = Table::new(&[
        "NAME", "UUID", "SIZE", "POOL", "HOST", "STATE", "EXPORT", "QOS",
    ]);
    for r in rows {
        // A multi-disk volume names its layout; its members are indented under it.
        let name = if !r.layout.is_empty() {
            format!("{} ({})", r.name, r.layout)
        } else if !r.member_of.is_empty() {
            format!("  └ {}", r.name)
        } else {
            r.name.clone()
        };
        // A replicated volume's health beside its state; a replica's state in the raid (with
        // its rebuild progress) instead of its volume's.
        let state = match (&r.health, &r.replica_state, r.rebuild_percent) {
            (Some(h), _, _) if !r.state.is_empty() => format!("{},{h}", r.state),
            (Some(h), _, _) => h.clone(),
            (None, Some(st), Some(p)) => format!("{st} {p}%"),
            (None, Some(st), None) => st.clone(),
            (None, None, _) => or_none(&r.state),
        };
        t.row(vec![
            name,
            or_none(&r.uuid),
            format_bytes(r.size_bytes),
            or_none(&r.pool),
            or_none(&r.host),
            state,
            r.export.clone().unwrap_or_else(|| NONE.to_string()),
            r.qos.clone(),
        ]);
    }
    t
}

/// The `snapshots` table.
pub fn snapshots_table(rows: &[SnapshotRow]) -> Table {
    let mut t = Table::new(&["NAME", "UUID", "SIZE", "ORIGIN", "NODE", "TYPE", "STATE"]);
    for r in rows {
        t.row(vec![
            r.name.clone(),
            or_none(&r.uuid),
            format_bytes(r.size_bytes),
            or_none(&r.origin),
            or_none(&r.node),
            or_none(&r.vol_type),
            or_none(&r.state),
        ]);
    }
    t
}

/// One row of `migrations`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationRow {
    /// Migration name.
    pub name: String,
    /// The volume being moved.
    pub volume: String,
    /// Node the data comes from.
    pub from: String,
    /// Node the data goes to; empty until placed (or the node the user named).
    pub to: String,
    /// `Pending`, `CreatingVolume`, `SetupPipe`, `Syncing`, `Cleaning`, `Finished`.
    pub phase: String,
    /// `Working`, `Error`, `Finished`; `deleting` once a deletion was requested.
    pub status: String,
    /// Bytes the source agent reports copied (`jobProgress`).
    pub copied_bytes: u64,
    /// Size of the volume, when known.
    pub size_bytes: Option<u64>,
    /// Copy rounds passed.
    pub rounds: i64,
    /// Copy rate in bytes per second, once the agent reported time spent.
    pub rate_bytes_per_second: Option<u64>,
    /// Why the migration is in `Error` (or what it waits for).
    pub message: String,
    /// Seconds since the migration was created.
    pub age_seconds: Option<i64>,
}

/// Rows of `migrations`, sorted by name; `volumes` give the sizes.
pub fn migration_rows(
    migs: &[VolumeMigration],
    volumes: &[AntstorVolume],
    now: Timestamp,
) -> Vec<MigrationRow> {
    let size_of = |name: &str| {
        volumes
            .iter()
            .find(|v| v.name_any() == name)
            .map(|v| v.spec.size_byte)
    };
    let mut rows: Vec<MigrationRow> = migs
        .iter()
        .map(|m| {
            let job = &m.spec.migration_info.job_progress;
            let copied = m.bytes_copied();
            let rate = u64::try_from(job.ms_elapsed)
                .ok()
                .filter(|ms| *ms > 0)
                .map(|ms| copied.saturating_mul(1000) / ms);
            let status = if m.metadata.deletion_timestamp.is_some() {
                "deleting".to_string()
            } else {
                m.status_name().to_string()
            };
            MigrationRow {
                name: m.name_any(),
                volume: m.spec.source_volume.name.clone(),
                from: m.spec.source_volume.target_node_id.clone(),
                to: m.spec.dest_volume.target_node_id.clone(),
                phase: m.phase().as_str().to_string(),
                status,
                copied_bytes: copied,
                size_bytes: size_of(&m.spec.source_volume.name)
                    .or_else(|| size_of(&m.spec.dest_volume.name)),
                rounds: job.round_passed,
                rate_bytes_per_second: rate,
                message: m
                    .status
                    .as_ref()
                    .map(|s| s.message.clone())
                    .unwrap_or_default(),
                age_seconds: m
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| seconds_since(t.0, now)),
            }
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

/// The copy progress as the table shows it: `42%` of the volume (capped at 100: a copy
/// that goes round again rewrites blocks), or the bytes copied when the size is unknown.
pub fn migration_progress(r: &MigrationRow) -> String {
    if r.phase == "Finished" {
        return "100%".into();
    }
    match r.size_bytes.filter(|s| *s > 0) {
        Some(size) if r.copied_bytes > 0 => {
            let pct = (u128::from(r.copied_bytes) * 100 / u128::from(size)).min(100);
            format!("{pct}%")
        }
        _ if r.copied_bytes > 0 => format_bytes(r.copied_bytes),
        _ => NONE.into(),
    }
}

/// The `migrations` table.
pub fn migrations_table(rows: &[MigrationRow]) -> Table {
    let mut t = Table::new(&[
        "NAME", "VOLUME", "FROM", "TO", "PHASE", "STATUS", "PROGRESS", "ROUNDS", "RATE", "AGE",
        "MESSAGE",
    ]);
    for r in rows {
        t.row(vec![
            r.name.clone(),
            or_none(&r.volume),
            or_none(&r.from),
            or_none(&r.to),
            or_none(&r.phase),
            or_none(&r.status),
            migration_progress(r),
            if r.rounds > 0 {
                r.rounds.to_string()
            } else {
                NONE.into()
            },
            r.rate_bytes_per_second
                .map(|b| format!("{}/s", format_bytes(b)))
                .unwrap_or_else(|| NONE.into()),
            r.age_seconds.map(format_age).unwrap_or_else(|| NONE.into()),
            or_none(&r.message),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_pool_is_shown_as_file_not_as_the_kernel_lvm_it_mimics() {
        let mut p = StoragePool::new("n", liteio_api::StoragePoolSpec::default());
        p.spec.kernel_lvm.name = "local-pool".into();
        let engine = |p: &StoragePool| {
            pool_rows(std::slice::from_ref(p), &[], &[], Timestamp::now())[0]
                .engine
                .clone()
        };
        assert_eq!(engine(&p), "KernelLVM");
        p.metadata.annotations = Some(BTreeMap::from([(
            annotations::POOLING_MODE.to_string(),
            "File".to_string(),
        )]));
        assert_eq!(engine(&p), "File");
    }

    #[test]
    fn migration_progress_and_rate_come_from_the_job() {
        let mut m = VolumeMigration::new("m1", liteio_api::VolumeMigrationSpec::default());
        m.spec.source_volume.name = "pvc-1".into();
        m.spec.migration_info.job_progress.total_write_pages = 65_536; // 256 MiB
        m.spec.migration_info.job_progress.ms_elapsed = 2_000;
        m.spec.migration_info.job_progress.round_passed = 1;
        let v = AntstorVolume::new(
            "pvc-1",
            liteio_api::AntstorVolumeSpec {
                size_byte: 1 << 30,
                ..Default::default()
            },
        );
        let rows = migration_rows(std::slice::from_ref(&m), &[v], Timestamp::now());
        assert_eq!(rows[0].copied_bytes, 256 << 20);
        assert_eq!(rows[0].rate_bytes_per_second, Some(128 << 20));
        assert_eq!(migration_progress(&rows[0]), "25%");
        let out = migrations_table(&rows).render();
        assert!(out.contains("25%") && out.contains("128.0 MiB/s"), "{out}");
        // Unknown size: the bytes; nothing copied: a dash.
        let rows = migration_rows(std::slice::from_ref(&m), &[], Timestamp::now());
        assert_eq!(migration_progress(&rows[0]), "256.0 MiB");
        m.spec.migration_info.job_progress = Default::default();
        let rows = migration_rows(std::slice::from_ref(&m), &[], Timestamp::now());
        assert_eq!(migration_progress(&rows[0]), NONE);
        assert_eq!(rows[0].rate_bytes_per_second, None);
    }

    #[test]
    fn a_replicated_volume_shows_its_replicas_health_and_rebuild_progress() {
        use liteio_api::datacontrol::{AntstorDataControlSpec, Raid, RaidLevel};
        use liteio_api::group::{AntstorVolumeGroupSpec, EntityIdentity};
        use liteio_api::replica::{ReplicaHealth, ReplicaState, ReplicaStatus};
        let member = |name: &str, node: &str| {
            let mut v = AntstorVolume::new(
                name,
                liteio_api::AntstorVolumeSpec {
                    uuid: format!("u-{name}"),
                    size_byte: 1 << 30,
                    target_node_id: node.into(),
                    ..Default::default()
                },
            );
            v.metadata.labels = Some(BTreeMap::from([(
                labels::VOL_GROUP_NAME.to_string(),
                "pvc-r".to_string(),
            )]));
            v
        };
        let mut old = member("pvc-r-old", "n2");
        old.metadata.annotations = Some(BTreeMap::from([(
            liteio_api::replica::ANNO_REPLACED.to_string(),
            "pvc-r-new".to_string(),
        )]));
        let vols = vec![member("pvc-r-a", "n1"), member("pvc-r-new", "n3"), old];
        let mut g = AntstorVolumeGroup::new("pvc-r", AntstorVolumeGroupSpec::default());
        g.spec.desired_volume_spec.desired_count = 2;
        let mut dc = AntstorDataControl::new(
            "pvc-r",
            AntstorDataControlSpec {
                uuid: "dc-u-r".into(),
                total_size: 1 << 30,
                raid: Raid {
                    level: RaidLevel::Raid1,
                },
                volume_groups: vec![EntityIdentity {
                    name: "pvc-r".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
        let report = |v: &str, st: ReplicaState, pct: Option<u8>| ReplicaStatus {
            volume: v.into(),
            node: String::new(),
            state: st,
            rebuild_percent: pct,
            rebuilt_bytes: None,
            since: None,
            message: String::new(),
        };
        dc.status = Some(liteio_api::AntstorDataControlStatus {
            status: Some(liteio_api::VolumeStatus::Ready),
            health: Some(ReplicaHealth::Rebuilding),
            replicas: vec![
                report("pvc-r-a", ReplicaState::Online, None),
                report("pvc-r-new", ReplicaState::Rebuilding, Some(42)),
            ],
            ..Default::default()
        });
        let rows = volume_rows_with_groups(&vols, &[dc], &[g]);
        assert_eq!(rows[0].layout, "raid1×2");
        assert_eq!(rows[0].replicas, Some(2));
        assert_eq!(rows[0].health.as_deref(), Some("rebuilding"));
        let out = volumes_table(&rows).render();
        let lines: Vec<String> = out
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        assert!(
            lines[1].starts_with("pvc-r (raid1×2) dc-u-r 1.0 GiB")
                && lines[1].contains("ready,rebuilding"),
            "{out}"
        );
        assert!(
            lines[2].contains("└ pvc-r-a") && lines[2].contains("n1 - online"),
            "{out}"
        );
        assert!(
            lines[3].contains("└ pvc-r-new") && lines[3].contains("n3 - rebuilding 42%"),
            "{out}"
        );
        assert!(
            lines[4].contains("└ pvc-r-old") && lines[4].contains("n2 - replaced"),
            "{out}"
        );
        let json = serde_json::to_value(&rows).unwrap_or_default();
        assert_eq!(json[0]["health"], "rebuilding");
        assert_eq!(json[0]["replicas"], 2);
        assert_eq!(json[2]["replicaState"], "rebuilding");
        assert_eq!(json[2]["rebuildPercent"], 42);
        assert_eq!(json[1].get("rebuildPercent"), None);
    }

    #[test]
    fn ages_read_like_kubectl() {
        for (secs, text) in [
            (-5, "0s"),
            (0, "0s"),
            (45, "45s"),
            (119, "119s"),
            (200, "3m20s"),
            (300, "5m"),
            (17 * 60 + 3, "17m"),
            (5 * 3600 + 180, "5h3m"),
            (20 * 3600, "20h"),
            (3 * 86_400 + 4 * 3600, "3d4h"),
            (12 * 86_400, "12d"),
        ] {
            assert_eq!(format_age(secs), text, "{secs}");
        }
    }
}
