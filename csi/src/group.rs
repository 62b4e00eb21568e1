//! Multi-disk volumes (LiteIO's VolumeGroup PV type): StorageClass parameters, and the
//! AntstorVolumeGroup and AntstorDataControl a CreateVolume makes. Volume ids are
//! `dc-<uuid>`, the data control's uuid.
//!
//! Parameters (LiteIO's names) and what is done when they are absent:
//!
//! | Key | Values | Default |
//! |---|---|---|
//! | `obnvmf/pv-type` | `VolumeGroup` (anything else: a plain volume) | plain volume, unless a `datacontrol/*` or `volgroup/*` key is set |
//! | `datacontrol/raid-level` | `linear`, `raid0`, `raid1` (a replicated volume) | `linear`; `raid1` with `liteio.io/replicas` (raid5, raid6: refused; LiteIO stored them and built a linear LV) |
//! | `datacontrol/engine-type` | `KernelLVM`, `SpdkLVStore` | `KernelLVM` (LiteIO's only engine); `SpdkLVStore` for raid1, the only engine that assembles it |
//! | `liteio.io/replicas` | 2..5 | 2 with raid1; makes the volume raid1 when the raid level is not given (linear, raid0: refused) |
//! | `liteio.io/replica-spread-key` | a node label key | none; raid1 only: replicas on nodes with distinct values of that label |
//! | `volgroup/size-symmetry` | `Symmetric`, `Asymmetric` | `Symmetric` for raid0 (it stripes over equal members), `Asymmetric` for linear |
//! | `volgroup/min-size` | quantity, at least 4 MiB | 1 GiB, capped at the volume's size (LiteIO panicked when absent) |
//! | `volgroup/max-size` | quantity | the volume's size (LiteIO panicked when absent) |
//! | `volgroup/max-volumes` | 1..64 (raid0: 2..64) | 8 (LiteIO: 0, and such a group was never placed) |
//! | `volgroup/allow-empty-node` | `true`, `false` | `true` (LiteIO: `false`, which never places a group on a fresh cluster) |
//!
//! A replicated volume (raid1) is one Symmetric group of N members that each hold the whole
//! volume plus a 4 MiB reserve for the raid superblock (the group's `totalSize` is N times the
//! volume's size: the bytes over all members), on distinct nodes, assembled in SPDK by the
//! disk-agent of one member's node; `volgroup/*` size and count keys do not apply to it and
//! are refused. See `docs/replicas.md`.
//!
//! KernelLVM is the default because it is LiteIO's behaviour and its data path is one hop:
//! the host reads every member over its own NVMe/TCP connection. SpdkLVStore assembles the
//! members inside the disk-agent of the node holding the largest member and exports one
//! namespace: the host needs no device-mapper and one connection, at the cost of a second
//! hop for the remote members' data.

//!
//! This file is what a multi-disk volume is: its parameters ([`GroupParams`]), what a
//! CreateVolume asks for ([`GroupRequest`]) and the objects made for it ([`objects`]). What
//! the services do with it stands beside each service: the Controller's CreateVolume,
//! DeleteVolume, expansion and publication in `controller/group.rs`, the Node's stage,
//! unstage and expansion in `node/group.rs`. Request fields are named as
//! [`crate::params::field`] names them.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use kube::api::ObjectMeta;
use liteio_api::datacontrol::{AntstorDataControlSpec, Raid, RaidLevel};
use liteio_api::group::{
    ANNO_MEMBER_RESERVE, AntstorVolumeGroupSpec, DesiredVolumeSpec, EntityIdentity, IntRange,
    MAX_MEMBERS, QuantityRange, SymmetryValue, VolumeGroupStrategy,
};
use liteio_api::keys::{self, annotations, labels};
use liteio_api::replica;
use liteio_api::size::{self, MIB};
use liteio_api::{AntstorDataControl, AntstorVolumeGroup, NodeInfo, PoolMode, VolumeType};

use crate::error::{CsiError, Result};
use crate::params::field;

/// Prefix of multi-disk volume ids (LiteIO's).
pub const ID_PREFIX: &str = "dc-";
/// Bytes each KernelLVM member holds beyond its share: one 4 MiB extent for the PV label
/// and the VG metadata, so that the LV is at least the volume's size.
pub const KERNEL_LVM_RESERVE: u64 = 4 * MIB;

/// The keys that make a request a multi-disk volume (or a replicated one).
pub const KEYS: [&str; 10] = [
    annotations::PV_TYPE,
    annotations::DATACONTROL_RAID_LEVEL,
    annotations::DATACONTROL_ENGINE_TYPE,
    annotations::VOLGROUP_SIZE_SYMMETRY,
    annotations::VOLGROUP_MIN_SIZE,
    annotations::VOLGROUP_MAX_SIZE,
    annotations::VOLGROUP_MAX_VOLUMES,
    annotations::VOLGROUP_ALLOW_EMPTY_NODE,
    keys::SC_PARAM_REPLICAS,
    keys::SC_PARAM_REPLICA_SPREAD_KEY,
];

/// What a multi-disk volume's StorageClass asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupParams {
    /// How the members are put together.
    pub raid: RaidLevel,
    /// Where they are put together.
    pub engine: PoolMode,
    /// Equal members or not.
    pub symmetry: SymmetryValue,
    /// Member size range in bytes (`None`: the default).
    pub min_size: Option<u64>,
    /// See `min_size`.
    pub max_size: Option<u64>,
    /// Most members.
    pub max_volumes: i64,
    /// Whether pools that hold no volume may take a member.
    pub allow_empty_node: bool,
    /// raid1: the number of replicas (each a member holding the whole volume); 0 otherwise.
    pub replicas: u32,
    /// raid1: the node label whose values must differ between replicas.
    pub spread_key: Option<String>,
}

fn get<'a>(p: &'a HashMap<String, String>, key: &str) -> Option<&'a str> {
    p.get(key).map(|v| v.trim()).filter(|v| !v.is_empty())
}

/// Whether the id is a multi-disk volume's.
pub fn is_group_id(id: &str) -> bool {
    id.starts_with(ID_PREFIX)
}

impl GroupParams {
    /// Parses the multi-disk keys of CreateVolume's `parameters`; `None` when the request
    /// is for a plain volume. Every bad value is INVALID_ARGUMENT naming its key.
    pub fn parse(p: &HashMap<String, String>) -> Result<Option<Self>> {
        let pv_type = get(p, annotations::PV_TYPE);
        match pv_type {
            Some("VolumeGroup") => {}
            Some(other) if KEYS[1..].iter().all(|k| get(p, k).is_none()) => {
                // LiteIO knows VolumeGroup only; any other value is a plain volume there too.
                let _ = other;
                return Ok(None);
            }
            Some(other) => {
                return Err(CsiError::invalid(
                    field(annotations::PV_TYPE),
                    format!(
                        "{other:?} with multi-disk parameters; set it to \"VolumeGroup\" (or drop the datacontrol/* and volgroup/* keys)"
                    ),
                ));
            }
            None if KEYS[1..].iter().all(|k| get(p, k).is_none()) => return Ok(None),
            None => {}
        }
        let replicas = get(p, keys::SC_PARAM_REPLICAS)
            .map(|v| {
                replica::parse_replicas(v)
                    .map_err(|e| CsiError::invalid(field(keys::SC_PARAM_REPLICAS), e))
            })
            .transpose()?;
        let raid = match get(p, annotations::DATACONTROL_RAID_LEVEL) {
            None if replicas.is_some() => RaidLevel::Raid1,
            None | Some("linear") => RaidLevel::Linear,
            Some("raid0") => RaidLevel::Raid0,
            Some("raid1") => RaidLevel::Raid1,
            Some(l @ ("raid5" | "raid6")) => {
                return Err(CsiError::invalid(
                    field(annotations::DATACONTROL_RAID_LEVEL),
                    format!(
                        "{l} is not supported (linear, raid0 and raid1 are); LiteIO stored it and built a linear volume, which is not what was asked"
                    ),
                ));
            }
            Some(other) => {
                return Err(CsiError::invalid(
                    field(annotations::DATACONTROL_RAID_LEVEL),
                    format!("{other:?} is not one of \"linear\", \"raid0\", \"raid1\""),
                ));
            }
        };
        if let Some(n) = replicas
            && raid != RaidLevel::Raid1
        {
            return Err(CsiError::invalid(
                field(keys::SC_PARAM_REPLICAS),
                format!(
                    "{n} replicas cannot go with {}: {}; replicas are raid1 (drop the raid level or set it to raid1)",
                    annotations::DATACONTROL_RAID_LEVEL,
                    get(p, annotations::DATACONTROL_RAID_LEVEL).unwrap_or_default()
                ),
            ));
        }
        let engine = match get(p, annotations::DATACONTROL_ENGINE_TYPE) {
            None if raid == RaidLevel::Raid1 => PoolMode::SpdkLVStore,
            None | Some("KernelLVM") => PoolMode::KernelLVM,
            Some("SpdkLVStore") => PoolMode::SpdkLVStore,
            Some(other) => {
                return Err(CsiError::invalid(
                    field(annotations::DATACONTROL_ENGINE_TYPE),
                    format!("{other:?} is not one of \"KernelLVM\", \"SpdkLVStore\""),
                ));
            }
        };
        if raid == RaidLevel::Raid1 {
            return Self::parse_replicated(p, engine, replicas);
        }
        if get(p, keys::SC_PARAM_REPLICA_SPREAD_KEY).is_some() {
            return Err(CsiError::invalid(
                field(keys::SC_PARAM_REPLICA_SPREAD_KEY),
                "spreads the replicas of a replicated volume; set liteio.io/replicas (or datacontrol/raid-level: raid1) too",
            ));
        }
        let symmetry = match get(p, annotations::VOLGROUP_SIZE_SYMMETRY) {
            None if raid == RaidLevel::Raid0 => SymmetryValue::Symmetric,
            None => SymmetryValue::Asymmetric,
            Some("Symmetric") => SymmetryValue::Symmetric,
            Some("Asymmetric") if raid == RaidLevel::Raid0 => {
                return Err(CsiError::invalid(
                    field(annotations::VOLGROUP_SIZE_SYMMETRY),
                    "Asymmetric cannot go with raid0: raid0 stripes over equal members (the larger ones' excess would be lost); use Symmetric or linear",
                ));
            }
            Some("Asymmetric") => SymmetryValue::Asymmetric,
            Some(other) => {
                return Err(CsiError::invalid(
                    field(annotations::VOLGROUP_SIZE_SYMMETRY),
                    format!("{other:?} is not one of \"Symmetric\", \"Asymmetric\""),
                ));
            }
        };
        let bytes = |key: &str| -> Result<Option<u64>> {
            get(p, key)
                .map(|v| {
                    let b = size::parse_quantity_str(v)
                        .map_err(|e| CsiError::invalid(field(key), e.to_string()))?;
                    if b < size::VOLUME_UNIT {
                        return Err(CsiError::invalid(
                            field(key),
                            format!("{v} is below the smallest member (4 MiB)"),
                        ));
                    }
                    Ok(b)
                })
                .transpose()
        };
        let min_size = bytes(annotations::VOLGROUP_MIN_SIZE)?;
        let max_size = bytes(annotations::VOLGROUP_MAX_SIZE)?;
        if let (Some(lo), Some(hi)) = (min_size, max_size)
            && lo > hi
        {
            return Err(CsiError::invalid(
                field(annotations::VOLGROUP_MIN_SIZE),
                format!(
                    "{} is above {} ({})",
                    size::format_bytes(lo),
                    annotations::VOLGROUP_MAX_SIZE,
                    size::format_bytes(hi)
                ),
            ));
        }
        let least = if raid == RaidLevel::Raid0 { 2 } else { 1 };
        let max_volumes = match get(p, annotations::VOLGROUP_MAX_VOLUMES) {
            None => liteio_api::group::DEFAULT_MAX_MEMBERS,
            Some(v) => match v.parse::<i64>() {
                Ok(n) if (least..=MAX_MEMBERS).contains(&n) => n,
                _ => {
                    return Err(CsiError::invalid(
                        field(annotations::VOLGROUP_MAX_VOLUMES),
                        format!("{v:?} is not a whole number from {least} to {MAX_MEMBERS}"),
                    ));
                }
            },
        };
        let allow_empty_node = allow_empty_node(p)?;
        Ok(Some(Self {
            raid,
            engine,
            symmetry,
            min_size,
            max_size,
            max_volumes,
            allow_empty_node,
            replicas: 0,
            spread_key: None,
        }))
    }

    /// The raid1 part of [`GroupParams::parse`]: the replica count (default 2), the engine
    /// (SpdkLVStore only), the spread key; the `volgroup/*` size and count keys, which a
    /// replicated volume's members (each the whole volume) do not follow, are refused.
    fn parse_replicated(
        p: &HashMap<String, String>,
        engine: PoolMode,
        replicas: Option<u32>,
    ) -> Result<Option<Self>> {
        if engine == PoolMode::KernelLVM {
            return Err(CsiError::invalid(
                field(annotations::DATACONTROL_ENGINE_TYPE),
                "KernelLVM cannot assemble raid1 (replicated volumes are assembled in SPDK); use SpdkLVStore or leave the key out",
            ));
        }
        match get(p, annotations::VOLGROUP_SIZE_SYMMETRY) {
            None | Some("Symmetric") => {}
            Some(other) => {
                return Err(CsiError::invalid(
                    field(annotations::VOLGROUP_SIZE_SYMMETRY),
                    format!(
                        "{other:?} cannot go with raid1: every replica holds the whole volume (Symmetric)"
                    ),
                ));
            }
        }
        for key in [
            annotations::VOLGROUP_MIN_SIZE,
            annotations::VOLGROUP_MAX_SIZE,
            annotations::VOLGROUP_MAX_VOLUMES,
        ] {
            if get(p, key).is_some() {
                return Err(CsiError::invalid(
                    field(key),
                    format!(
                        "does not apply to raid1: every replica holds the whole volume and their number is {}",
                        keys::SC_PARAM_REPLICAS
                    ),
                ));
            }
        }
        let spread_key = match get(p, keys::SC_PARAM_REPLICA_SPREAD_KEY) {
            None => None,
            Some(k) if replica::is_label_key(k) => Some(k.to_string()),
            Some(k) => {
                return Err(CsiError::invalid(
                    field(keys::SC_PARAM_REPLICA_SPREAD_KEY),
                    format!("{k:?} is not a node label key (such as topology.kubernetes.io/zone)"),
                ));
            }
        };
        let n = replicas.unwrap_or(replica::DEFAULT_REPLICAS);
        Ok(Some(Self {
            raid: RaidLevel::Raid1,
            engine,
            symmetry: SymmetryValue::Symmetric,
            min_size: None,
            max_size: None,
            max_volumes: i64::from(n),
            allow_empty_node: allow_empty_node(p)?,
            replicas: n,
            spread_key,
        }))
    }

    /// Whether it is a replicated volume (raid1).
    pub fn is_replicated(&self) -> bool {
        self.raid == RaidLevel::Raid1
    }

    /// Bytes each member holds beyond its share for the assembly's metadata.
    pub fn member_reserve(&self) -> u64 {
        match (self.raid, self.engine) {
            (RaidLevel::Raid1, _) => replica::RAID_SUPERBLOCK_RESERVE,
            (_, PoolMode::KernelLVM) => KERNEL_LVM_RESERVE,
            (_, PoolMode::SpdkLVStore) => 0,
        }
    }

    /// The fewest members the raid level needs.
    pub fn min_volumes(&self) -> i64 {
        match self.raid {
            RaidLevel::Raid1 => i64::from(self.replicas),
            RaidLevel::Raid0 => 2,
            _ => 1,
        }
    }
}

fn allow_empty_node(p: &HashMap<String, String>) -> Result<bool> {
    match get(p, annotations::VOLGROUP_ALLOW_EMPTY_NODE) {
        None | Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(other) => Err(CsiError::invalid(
            field(annotations::VOLGROUP_ALLOW_EMPTY_NODE),
            format!("{other:?} is not \"true\" or \"false\""),
        )),
    }
}

/// What a CreateVolume of a multi-disk volume asks for, compared with an existing one of
/// the same name.
#[derive(Debug, Clone)]
pub struct GroupRequest {
    /// The parameters.
    pub params: GroupParams,
    /// Bytes.
    pub size: u64,
    /// Filesystem.
    pub fs: String,
    /// mkfs arguments.
    pub mkfs_params: String,
    /// The consuming node, when the request names it.
    pub host: Option<String>,
    /// PV name for the labels.
    pub pv_name: String,
}

/// How an existing data control differs from `want` (empty: the same volume).
pub fn differences(
    dc: &AntstorDataControl,
    g: Option<&AntstorVolumeGroup>,
    want: &GroupRequest,
) -> Vec<String> {
    let mut out = Vec::new();
    if dc.spec.total_size != i64::try_from(want.size).unwrap_or(i64::MAX) {
        out.push(format!("size {} (asked {})", dc.spec.total_size, want.size));
    }
    if dc.spec.raid.level != want.params.raid {
        out.push(format!(
            "raid level {:?} (asked {:?})",
            dc.spec.raid.level, want.params.raid
        ));
    }
    if dc.spec.engine_type != want.params.engine {
        out.push(format!(
            "engine {:?} (asked {:?})",
            dc.spec.engine_type, want.params.engine
        ));
    }
    if let Some(g) = g {
        let d = &g.spec.desired_volume_spec;
        if d.size_symmetry != want.params.symmetry {
            out.push(format!(
                "symmetry {:?} (asked {:?})",
                d.size_symmetry, want.params.symmetry
            ));
        }
        if d.count_range.max != want.params.max_volumes {
            out.push(format!(
                "max volumes {} (asked {})",
                d.count_range.max, want.params.max_volumes
            ));
        }
        let spread = liteio_api::meta::annotation(&g.metadata, replica::ANNO_SPREAD_KEY);
        if spread != want.params.spread_key.as_deref() {
            out.push(format!(
                "replica spread key {} (asked {})",
                spread.unwrap_or("none"),
                want.params.spread_key.as_deref().unwrap_or("none")
            ));
        }
    }
    out
}

/// The group and data control objects of a new multi-disk volume `name` with `uuid`.
pub fn objects(
    name: &str,
    namespace: &str,
    uuid: &str,
    want: &GroupRequest,
    host: NodeInfo,
) -> (AntstorVolumeGroup, AntstorDataControl) {
    let p = &want.params;
    let total = i64::try_from(want.size).unwrap_or(i64::MAX);
    // A replicated volume's group holds every copy: N members of the volume's size.
    let group_total = if p.is_replicated() {
        i64::try_from(want.size.saturating_mul(u64::from(p.replicas))).unwrap_or(i64::MAX)
    } else {
        total
    };
    let (desired_count, size_range) = if p.is_replicated() {
        let whole = Some(Quantity(want.size.to_string()));
        (
            i64::from(p.replicas),
            QuantityRange {
                min: whole.clone(),
                max: whole,
            },
        )
    } else {
        (
            0,
            QuantityRange {
                min: p.min_size.map(|b| Quantity(b.to_string())),
                max: p.max_size.map(|b| Quantity(b.to_string())),
            },
        )
    };
    let member_type = match p.engine {
        PoolMode::SpdkLVStore => VolumeType::SpdkLVol,
        PoolMode::KernelLVM => VolumeType::Flexible,
    };
    let mut g = AntstorVolumeGroup::new(
        name,
        AntstorVolumeGroupSpec {
            uuid: uuid.to_string(),
            total_size: group_total,
            desired_volume_spec: DesiredVolumeSpec {
                annotations: BTreeMap::from([(
                    annotations::VOLUME_TYPE.to_string(),
                    member_type.to_string(),
                )]),
                // Every member carries the PV's name: its keys are then the PV's Secret
                // (`liteio-auth-<pv>`, what kubelet passes to NodeStageVolume), one key pair
                // for every member and the assembled export.
                labels: BTreeMap::from([(labels::PV_NAME.to_string(), want.pv_name.clone())]),
                desired_count,
                count_range: IntRange {
                    min: p.min_volumes(),
                    max: p.max_volumes,
                },
                size_range,
                size_symmetry: p.symmetry,
            },
            stragety: VolumeGroupStrategy {
                name: "BestFit".into(),
                empty_threashold_pct: 0,
                allow_empty_node: p.allow_empty_node,
            },
            volumes: Vec::new(),
        },
    );
    g.metadata.namespace = Some(namespace.to_string());
    g.metadata.labels = Some(BTreeMap::from([
        (labels::DATA_CONTROL_NAME.to_string(), name.to_string()),
        (labels::PV_NAME.to_string(), want.pv_name.clone()),
    ]));
    let mut group_annos = BTreeMap::new();
    if p.member_reserve() > 0 {
        group_annos.insert(
            ANNO_MEMBER_RESERVE.to_string(),
            p.member_reserve().to_string(),
        );
    }
    if let Some(k) = &p.spread_key {
        group_annos.insert(replica::ANNO_SPREAD_KEY.to_string(), k.clone());
    }
    if !group_annos.is_empty() {
        g.metadata.annotations = Some(group_annos);
    }
    let dc_uuid = format!("{ID_PREFIX}{uuid}");
    let mut annos = BTreeMap::from([(annotations::FS_TYPE.to_string(), want.fs.clone())]);
    if !want.mkfs_params.is_empty() {
        annos.insert(
            keys::SC_PARAM_MKFS_PARAMS.to_string(),
            want.mkfs_params.clone(),
        );
    }
    let dc = AntstorDataControl {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([
                (labels::VOL_UUID.to_string(), dc_uuid.clone()),
                (labels::FS_TYPE.to_string(), want.fs.clone()),
                (labels::PV_NAME.to_string(), want.pv_name.clone()),
            ])),
            annotations: Some(annos),
            ..ObjectMeta::default()
        },
        spec: AntstorDataControlSpec {
            uuid: dc_uuid,
            total_size: total,
            lvm: None,
            engine_type: p.engine,
            raid: Raid { level: p.raid },
            host_node: host,
            target_node_id: String::new(),
            volume_groups: vec![EntityIdentity {
                namespace: namespace.to_string(),
                name: name.to_string(),
                uuid: uuid.to_string(),
            }],
        },
        status: None,
    };
    (g, dc)
}

/// The outcome of waiting for a group's members to be placed.
pub(crate) fn placement_outcome(g: &AntstorVolumeGroup) -> Option<Result<()>> {
    if g.fully_placed() {
        return Some(Ok(()));
    }
    let msg = g
        .status
        .as_ref()
        .map(|s| s.message.trim())
        .unwrap_or_default();
    if msg.starts_with("NoStoragePoolAvailable") {
        return Some(Err(CsiError::ResourceExhausted(format!(
            "multi-disk volume {} cannot be placed: {msg}",
            g.name_any()
        ))));
    }
    if msg.starts_with("invalid") {
        return Some(Err(CsiError::invalid(
            "parameters",
            format!("multi-disk volume {} was rejected: {msg}", g.name_any()),
        )));
    }
    None
}

/// Why an SpdkLVStore multi-disk volume cannot grow.
pub fn cannot_grow_spdk(id: &str) -> CsiError {
    CsiError::FailedPrecondition(format!(
        "multi-disk volume {id} (datacontrol/engine-type SpdkLVStore) cannot grow: its concat or raid0 bdev takes no new member while it serves the host (SPDK's raid grows only raid1); KernelLVM multi-disk volumes grow"
    ))
}

/// Why a replicated volume cannot grow.
pub fn cannot_grow_replicated(id: &str) -> CsiError {
    CsiError::FailedPrecondition(format!(
        "replicated volume {id} (raid1) cannot grow yet: every replica and the raid1 over them would have to grow while it serves the host, which is not built"
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn p(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn plain_volumes_are_not_groups() {
        assert_eq!(GroupParams::parse(&p(&[("fsType", "xfs")])).unwrap(), None);
        assert_eq!(
            GroupParams::parse(&p(&[("obnvmf/pv-type", "Volume")])).unwrap(),
            None
        );
    }

    #[test]
    fn defaults_fix_liteios_gaps() {
        let g = GroupParams::parse(&p(&[("obnvmf/pv-type", "VolumeGroup")]))
            .unwrap()
            .unwrap();
        assert_eq!(g.raid, RaidLevel::Linear);
        assert_eq!(g.engine, PoolMode::KernelLVM);
        assert_eq!(g.symmetry, SymmetryValue::Asymmetric);
        assert_eq!((g.min_size, g.max_size), (None, None));
        assert_eq!(g.max_volumes, 8);
        assert!(g.allow_empty_node);
        assert_eq!(g.member_reserve(), 4 * MIB);
        // raid0 alone makes a group, Symmetric.
        let g = GroupParams::parse(&p(&[
            ("datacontrol/raid-level", "raid0"),
            ("datacontrol/engine-type", "SpdkLVStore"),
            ("volgroup/min-size", "1Gi"),
            ("volgroup/max-size", "10Gi"),
            ("volgroup/max-volumes", "3"),
            ("volgroup/allow-empty-node", "false"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(g.symmetry, SymmetryValue::Symmetric);
        assert_eq!(g.engine, PoolMode::SpdkLVStore);
        assert_eq!(g.min_size, Some(1 << 30));
        assert_eq!(g.max_size, Some(10 << 30));
        assert_eq!(g.max_volumes, 3);
        assert!(!g.allow_empty_node);
        assert_eq!(g.member_reserve(), 0);
        assert_eq!(g.min_volumes(), 2);
    }

    #[test]
    fn raid1_or_a_replica_count_makes_a_replicated_volume() {
        // LiteIO's spelling: raid1 alone is two replicas, assembled in SPDK.
        let g = GroupParams::parse(&p(&[("datacontrol/raid-level", "raid1")]))
            .unwrap()
            .unwrap();
        assert!(g.is_replicated());
        assert_eq!(g.replicas, 2);
        assert_eq!(g.engine, PoolMode::SpdkLVStore);
        assert_eq!(g.symmetry, SymmetryValue::Symmetric);
        assert_eq!((g.min_volumes(), g.max_volumes), (2, 2));
        assert_eq!(g.member_reserve(), 4 * MIB, "the raid superblock");
        assert_eq!(g.spread_key, None);
        // The count alone: raid1, with the spread key.
        let g = GroupParams::parse(&p(&[
            ("liteio.io/replicas", "3"),
            (
                "liteio.io/replica-spread-key",
                "topology.kubernetes.io/zone",
            ),
            ("datacontrol/engine-type", "SpdkLVStore"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(g.raid, RaidLevel::Raid1);
        assert_eq!((g.replicas, g.min_volumes(), g.max_volumes), (3, 3, 3));
        assert_eq!(g.spread_key.as_deref(), Some("topology.kubernetes.io/zone"));
        // Other groups have no replicas.
        let g = GroupParams::parse(&p(&[("datacontrol/raid-level", "raid0")]))
            .unwrap()
            .unwrap();
        assert!(!g.is_replicated());
        assert_eq!(g.replicas, 0);
    }

    #[test]
    fn every_bad_value_names_its_key() {
        let vg = ("obnvmf/pv-type", "VolumeGroup");
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[vg, ("datacontrol/raid-level", "raid6")],
                "datacontrol/raid-level",
            ),
            (
                &[vg, ("datacontrol/raid-level", "raid5")],
                "datacontrol/raid-level",
            ),
            (
                &[vg, ("datacontrol/raid-level", "mirror")],
                "datacontrol/raid-level",
            ),
            (
                &[vg, ("datacontrol/engine-type", "Zfs")],
                "datacontrol/engine-type",
            ),
            (
                &[vg, ("volgroup/size-symmetry", "Even")],
                "volgroup/size-symmetry",
            ),
            (
                &[
                    ("datacontrol/raid-level", "raid0"),
                    ("volgroup/size-symmetry", "Asymmetric"),
                ],
                "volgroup/size-symmetry",
            ),
            (&[vg, ("volgroup/min-size", "lots")], "volgroup/min-size"),
            (&[vg, ("volgroup/min-size", "1Mi")], "volgroup/min-size"),
            (&[vg, ("volgroup/max-size", "-1Gi")], "volgroup/max-size"),
            (
                &[
                    vg,
                    ("volgroup/min-size", "2Gi"),
                    ("volgroup/max-size", "1Gi"),
                ],
                "volgroup/min-size",
            ),
            (&[vg, ("volgroup/max-volumes", "0")], "volgroup/max-volumes"),
            (
                &[vg, ("volgroup/max-volumes", "65")],
                "volgroup/max-volumes",
            ),
            (
                &[vg, ("volgroup/max-volumes", "four")],
                "volgroup/max-volumes",
            ),
            (
                &[
                    ("datacontrol/raid-level", "raid0"),
                    ("volgroup/max-volumes", "1"),
                ],
                "volgroup/max-volumes",
            ),
            (
                &[vg, ("volgroup/allow-empty-node", "yes")],
                "volgroup/allow-empty-node",
            ),
            (
                &[("obnvmf/pv-type", "Disk"), ("volgroup/max-volumes", "2")],
                "obnvmf/pv-type",
            ),
            // Replicated volumes.
            (&[("liteio.io/replicas", "1")], "liteio.io/replicas"),
            (&[("liteio.io/replicas", "6")], "liteio.io/replicas"),
            (&[("liteio.io/replicas", "x")], "liteio.io/replicas"),
            (
                &[
                    ("liteio.io/replicas", "2"),
                    ("datacontrol/raid-level", "raid0"),
                ],
                "liteio.io/replicas",
            ),
            (
                &[
                    vg,
                    ("liteio.io/replicas", "3"),
                    ("datacontrol/raid-level", "linear"),
                ],
                "liteio.io/replicas",
            ),
            (
                &[
                    ("datacontrol/raid-level", "raid1"),
                    ("datacontrol/engine-type", "KernelLVM"),
                ],
                "datacontrol/engine-type",
            ),
            (
                &[
                    ("liteio.io/replicas", "2"),
                    ("volgroup/size-symmetry", "Asymmetric"),
                ],
                "volgroup/size-symmetry",
            ),
            (
                &[("liteio.io/replicas", "2"), ("volgroup/max-volumes", "4")],
                "volgroup/max-volumes",
            ),
            (
                &[
                    ("datacontrol/raid-level", "raid1"),
                    ("volgroup/min-size", "1Gi"),
                ],
                "volgroup/min-size",
            ),
            (
                &[
                    ("liteio.io/replicas", "2"),
                    ("liteio.io/replica-spread-key", "not a key"),
                ],
                "liteio.io/replica-spread-key",
            ),
            (
                &[
                    ("datacontrol/raid-level", "raid0"),
                    (
                        "liteio.io/replica-spread-key",
                        "topology.kubernetes.io/zone",
                    ),
                ],
                "liteio.io/replica-spread-key",
            ),
        ];
        for (kv, key) in cases {
            let e = GroupParams::parse(&p(kv)).unwrap_err();
            assert_eq!(
                e.kind(),
                crate::error::ErrorKind::InvalidArgument,
                "{kv:?}: {e}"
            );
            assert!(
                e.to_string().starts_with(&format!("parameters.{key}: ")),
                "{kv:?}: {e}"
            );
        }
    }
}
