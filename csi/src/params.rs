//! Pure request parsing: StorageClass parameters, capacity ranges and volume capabilities,
//! and the two words every check speaks: a required field ([`require`]) and a parameter's
//! name in an error ([`field`]).

use std::collections::{BTreeMap, HashMap};

use liteio_api::host_auth::HostAuthPolicy;
use liteio_api::keys::{self, annotations};
use liteio_api::qos::VolumeQos;
use liteio_api::size::{self, GIB, MIN_VOLUME_SIZE, VOLUME_UNIT};
use liteio_api::{VolumePosition, VolumeType};

use crate::csi::volume_capability::access_mode::Mode;
use crate::csi::volume_capability::{AccessType, MountVolume};
use crate::csi::{CapacityRange, VolumeCapability};
use crate::error::{CsiError, Result};

/// Size of a volume whose request gives no size.
pub const DEFAULT_VOLUME_SIZE: u64 = GIB;

/// Filesystems the node service can create and mount.
pub const SUPPORTED_FS: [&str; 2] = ["xfs", "ext4"];

/// Default filesystem (LiteIO's).
pub const DEFAULT_FS: &str = "xfs";

/// Volume context key: the volume uuid.
pub const CTX_UUID: &str = "obnvmf/uuid";
/// Volume context key: the node that holds the data.
pub const CTX_TARGET_NODE: &str = "obnvmf/target-node-id";
/// Volume context key: skip recording publish parameters on the volume.
pub const CTX_SKIP_SAVE: &str = "skip-save-context";

/// What CreateVolume needs from the StorageClass parameters and `--extra-create-metadata`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VolumeParams {
    /// Filesystem (`fsType`, default xfs).
    pub fs_type: String,
    /// Volume type (`volumeType`, default Flexible).
    pub volume_type: VolumeType,
    /// Position advice (`positionAdvice`).
    pub position: VolumePosition,
    /// Extra mkfs arguments (`obnvmf/mkfsParams`), split on whitespace by the node.
    pub mkfs_params: String,
    /// PVC name from `csi.storage.k8s.io/pvc/name`.
    pub pvc_name: Option<String>,
    /// PVC namespace from `csi.storage.k8s.io/pvc/namespace`.
    pub pvc_namespace: Option<String>,
    /// PV name from `csi.storage.k8s.io/pv/name`.
    pub pv_name: Option<String>,
    /// Export over TLS only (`nvmfTls: "true"`).
    pub nvmf_tls: bool,
    /// How the volume's hosts authenticate (`liteio.io/host-auth`); `None` when the class
    /// does not say (the volume then has no `spec.hostAuth`, which means `required`).
    pub host_auth: Option<HostAuthPolicy>,
    /// QoS limits (`liteio.io/qos-*`); `None` when the class sets none.
    pub qos: Option<VolumeQos>,
}

/// `v`, unless it is empty or blank: then INVALID_ARGUMENT naming `field`, "is required".
pub fn require<'a>(field: &str, v: &'a str) -> Result<&'a str> {
    if v.trim().is_empty() {
        Err(CsiError::invalid(field, "is required"))
    } else {
        Ok(v)
    }
}

/// How an error names StorageClass parameter `key`: `parameters.<key>`.
pub fn field(key: &str) -> String {
    format!("parameters.{key}")
}

fn nonempty(p: &HashMap<String, String>, key: &str) -> Option<String> {
    p.get(key)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// The QoS limits `mutable_parameters` (of CreateVolume or ControllerModifyVolume) set on
/// top of `base`; `None` when it names none. Every key must be a QoS parameter: a
/// VolumeAttributesClass's parameters are all meant to change something.
pub fn mutable_qos(mp: &HashMap<String, String>, base: VolumeQos) -> Result<Option<VolumeQos>> {
    let mut unknown: Vec<&String> = mp.keys().filter(|k| !VolumeQos::is_param(k)).collect();
    unknown.sort();
    if let Some(k) = unknown.first() {
        return Err(CsiError::invalid(
            format!("mutable_parameters.{k}"),
            format!(
                "is not a parameter this driver can change; it knows {}",
                liteio_api::qos::PARAMS.join(", ")
            ),
        ));
    }
    VolumeQos::from_params(mp, base)
        .map_err(|e| CsiError::invalid(format!("mutable_parameters.{}", e.field), e.reason))
}

/// Checks a filesystem name against [`SUPPORTED_FS`].
pub fn check_fs(field: &str, fs: &str) -> Result<()> {
    if SUPPORTED_FS.contains(&fs) {
        Ok(())
    } else {
        Err(CsiError::invalid(
            field,
            format!("filesystem {fs:?} is not supported; use one of {SUPPORTED_FS:?}"),
        ))
    }
}

impl VolumeParams {
    /// Parses CreateVolume's `parameters`.
    pub fn parse(p: &HashMap<String, String>) -> Result<Self> {
        let fs_type = nonempty(p, keys::SC_PARAM_FS_TYPE)
            .unwrap_or_else(|| DEFAULT_FS.to_string())
            .to_ascii_lowercase();
        check_fs("parameters.fsType", &fs_type)?;
        let volume_type = match nonempty(p, keys::SC_PARAM_VOLUME_TYPE) {
            Some(v) => v
                .parse::<VolumeType>()
                .map_err(|e| CsiError::invalid("parameters.volumeType", e.reason))?,
            None => VolumeType::Flexible,
        };
        let position = match nonempty(p, keys::SC_PARAM_POSITION_ADVICE) {
            Some(v) => v
                .parse::<VolumePosition>()
                .map_err(|e| CsiError::invalid("parameters.positionAdvice", e.reason))?,
            None => VolumePosition::NoPreference,
        };
        let nvmf_tls = match nonempty(p, keys::SC_PARAM_NVMF_TLS).as_deref() {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                return Err(CsiError::invalid(
                    field(keys::SC_PARAM_NVMF_TLS),
                    format!("{other:?} is not \"true\" or \"false\""),
                ));
            }
        };
        let host_auth = nonempty(p, keys::SC_PARAM_HOST_AUTH)
            .map(|v| {
                HostAuthPolicy::parse(&field(keys::SC_PARAM_HOST_AUTH), &v)
                    .map_err(|e| CsiError::invalid(e.field, e.reason))
            })
            .transpose()?;
        // A TLS listener takes only hosts that hold the volume's PSK: "no authentication"
        // cannot be had on it.
        if nvmf_tls && host_auth == Some(HostAuthPolicy::None) {
            return Err(CsiError::invalid(
                field(keys::SC_PARAM_HOST_AUTH),
                format!(
                    "\"none\" cannot go with {}: \"true\" (a TLS export admits only hosts holding the volume's key); use required or preferred, or drop {}",
                    keys::SC_PARAM_NVMF_TLS,
                    keys::SC_PARAM_NVMF_TLS
                ),
            ));
        }
        let qos = VolumeQos::from_params(p, VolumeQos::default())
            .map_err(|e| CsiError::invalid(field(&e.field), e.reason))?;
        Ok(VolumeParams {
            nvmf_tls,
            host_auth,
            qos,
            fs_type,
            volume_type,
            position,
            mkfs_params: nonempty(p, keys::SC_PARAM_MKFS_PARAMS).unwrap_or_default(),
            pvc_name: nonempty(p, annotations::CSI_PVC_NAME),
            pvc_namespace: nonempty(p, annotations::CSI_PVC_NAMESPACE),
            pv_name: nonempty(p, annotations::CSI_PV_NAME),
        })
    }
}

fn non_negative(field: &str, v: i64) -> Result<u64> {
    u64::try_from(v).map_err(|_| CsiError::invalid(field, format!("{v} must not be negative")))
}

/// The size to allocate for `range`: at least `required_bytes` (default
/// [`DEFAULT_VOLUME_SIZE`]), at least [`MIN_VOLUME_SIZE`], rounded **up** to [`VOLUME_UNIT`],
/// and not above `limit_bytes` when one is given.
pub fn volume_size(range: Option<&CapacityRange>) -> Result<u64> {
    let (required, limit) = match range {
        Some(r) => (
            non_negative("capacity_range.required_bytes", r.required_bytes)?,
            non_negative("capacity_range.limit_bytes", r.limit_bytes)?,
        ),
        None => (0, 0),
    };
    if limit > 0 && required > limit {
        return Err(CsiError::invalid(
            "capacity_range",
            format!("required_bytes {required} is larger than limit_bytes {limit}"),
        ));
    }
    let wanted = if required > 0 {
        required.max(MIN_VOLUME_SIZE)
    } else if limit > 0 {
        // Only a limit: the default size, or the largest whole unit under the limit.
        DEFAULT_VOLUME_SIZE.min(size::round_down(limit, VOLUME_UNIT).unwrap_or(0))
    } else {
        DEFAULT_VOLUME_SIZE
    };
    let rounded = size::round_up(wanted, VOLUME_UNIT)
        .map_err(|e| CsiError::OutOfRange(format!("capacity_range.required_bytes: {e}")))?;
    if i64::try_from(rounded).is_err() {
        return Err(CsiError::OutOfRange(format!(
            "capacity_range.required_bytes: {required} rounded up to {rounded} does not fit in a CSI size (int64)"
        )));
    }
    if rounded < MIN_VOLUME_SIZE || (limit > 0 && rounded > limit) {
        return Err(CsiError::OutOfRange(format!(
            "capacity_range: no multiple of {VOLUME_UNIT} bytes (at least {MIN_VOLUME_SIZE}) lies between required_bytes {required} and limit_bytes {limit}"
        )));
    }
    Ok(rounded)
}

/// How a volume is consumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Raw block device.
    Block,
    /// Mounted filesystem with this type (empty = the volume's) and these flags.
    Mount {
        /// Requested filesystem, possibly empty.
        fs_type: String,
        /// Requested mount flags.
        flags: Vec<String>,
    },
}

/// A request's one capability, `volume_capability`: required, then checked as
/// [`check_capability`] does.
pub fn require_capability(cap: Option<&VolumeCapability>) -> Result<Access> {
    let cap = cap.ok_or_else(|| CsiError::invalid("volume_capability", "is required"))?;
    check_capability("volume_capability", cap)
}

/// Validates one capability and tells how the volume is consumed.
pub fn check_capability(field: &str, cap: &VolumeCapability) -> Result<Access> {
    let mode = cap
        .access_mode
        .as_ref()
        .map(|m| m.mode())
        .ok_or_else(|| CsiError::invalid(format!("{field}.access_mode"), "is required"))?;
    match mode {
        Mode::SingleNodeWriter | Mode::SingleNodeReaderOnly | Mode::SingleNodeSingleWriter => {}
        Mode::Unknown => {
            return Err(CsiError::invalid(
                format!("{field}.access_mode.mode"),
                "is required",
            ));
        }
        other => {
            return Err(CsiError::invalid(
                format!("{field}.access_mode.mode"),
                format!(
                    "{} is not supported: a LiteIO volume is attached to one node at a time",
                    other.as_str_name()
                ),
            ));
        }
    }
    match &cap.access_type {
        Some(AccessType::Block(_)) => Ok(Access::Block),
        Some(AccessType::Mount(MountVolume {
            fs_type,
            mount_flags,
            ..
        })) => {
            let fs = fs_type.trim().to_ascii_lowercase();
            if !fs.is_empty() {
                check_fs(&format!("{field}.mount.fs_type"), &fs)?;
            }
            Ok(Access::Mount {
                fs_type: fs,
                flags: mount_flags.clone(),
            })
        }
        None => Err(CsiError::invalid(
            format!("{field}.access_type"),
            "one of block or mount is required",
        )),
    }
}

/// Validates a list of capabilities (at least one).
pub fn check_capabilities(field: &str, caps: &[VolumeCapability]) -> Result<Vec<Access>> {
    if caps.is_empty() {
        return Err(CsiError::invalid(
            field,
            "at least one capability is required",
        ));
    }
    caps.iter()
        .enumerate()
        .map(|(i, c)| check_capability(&format!("{field}[{i}]"), c))
        .collect()
}

/// Volume context returned by CreateVolume: the StorageClass parameters plus the volume's
/// uuid, target node and filesystem.
pub fn volume_context(
    parameters: &HashMap<String, String>,
    uuid: &str,
    target_node: &str,
    fs_type: &str,
) -> HashMap<String, String> {
    let mut ctx: HashMap<String, String> = parameters
        .iter()
        .filter(|(k, _)| !k.starts_with("csi.storage.k8s.io/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    ctx.insert(CTX_UUID.into(), uuid.into());
    ctx.insert(CTX_TARGET_NODE.into(), target_node.into());
    ctx.insert(keys::SC_PARAM_FS_TYPE.into(), fs_type.into());
    ctx
}

/// The `obnvmf/*` annotations of a PVC, to be copied onto its volume.
pub fn obnvmf_annotations(pvc: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    pvc.iter()
        .filter(|(k, _)| k.starts_with("obnvmf/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Paging: the offset a `starting_token` stands for (empty = 0). An unknown token is
/// `ABORTED` as the CSI specification asks.
pub fn page_offset(token: &str, len: usize) -> Result<usize> {
    if token.is_empty() {
        return Ok(0);
    }
    match token.parse::<usize>() {
        Ok(n) if n <= len => Ok(n),
        _ => Err(CsiError::Busy(format!(
            "starting_token: {token:?} is not a token this driver handed out (or the list shrank)"
        ))),
    }
}

/// Paging: `(start, end, next_token)` for `max_entries` from `start` over `len` items.
pub fn page(start: usize, max_entries: i32, len: usize) -> Result<(usize, usize, String)> {
    if max_entries < 0 {
        return Err(CsiError::invalid(
            "max_entries",
            format!("{max_entries} must not be negative"),
        ));
    }
    let max = usize::try_from(max_entries).unwrap_or(0);
    let end = if max == 0 {
        len
    } else {
        (start + max).min(len)
    };
    let next = if end < len {
        end.to_string()
    } else {
        String::new()
    };
    Ok((start, end, next))
}

/// Annotation recording the CSI name of a volume or snapshot whose object name had to be
/// derived from it (see [`object_name`]).
pub const ANNO_CSI_NAME: &str = liteio_api::keys::annotations::CSI_NAME;

/// Longest object name used: names also go into label values (63 characters at most).
const MAX_OBJECT_NAME: usize = 63;

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_OBJECT_NAME
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

/// 64-bit FNV-1a: stable across builds and releases (unlike `DefaultHasher`).
fn fnv1a64(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The Kubernetes object name for a CSI volume/snapshot `name` (any UTF-8, up to 128
/// characters per the spec). A name that is already a DNS-1123 label (the external
/// provisioner's `pvc-<uuid>`, the snapshotter's `snapshot-<uuid>`) is used as is; any other
/// name maps deterministically to a sanitised prefix of it plus a hash of the whole name, so
/// the same CSI name always finds the same object.
pub fn object_name(name: &str) -> String {
    if is_dns_label(name) {
        return name.to_string();
    }
    let mut prefix = String::new();
    for c in name.chars().take(MAX_OBJECT_NAME - 17) {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            prefix.push(c);
        } else if !prefix.is_empty() && !prefix.ends_with('-') {
            prefix.push('-');
        }
    }
    let prefix = prefix.trim_end_matches('-');
    let hash = format!("{:016x}", fnv1a64(name));
    if prefix.is_empty() {
        format!("csi-{hash}")
    } else {
        format!("{prefix}-{hash}")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::csi::volume_capability::{AccessMode, BlockVolume};
    use liteio_api::size::MIB;

    fn p(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parameters_default_and_parse() {
        let d = VolumeParams::parse(&HashMap::new()).unwrap();
        assert_eq!(d.fs_type, "xfs");
        assert_eq!(d.volume_type, VolumeType::Flexible);
        assert_eq!(d.position, VolumePosition::NoPreference);
        let v = VolumeParams::parse(&p(&[
            ("fsType", "EXT4"),
            ("volumeType", "KernelLVol"),
            ("positionAdvice", "MustLocal"),
            ("obnvmf/mkfsParams", "-b 4096"),
            ("csi.storage.k8s.io/pvc/name", "data"),
            ("csi.storage.k8s.io/pvc/namespace", "app"),
        ]))
        .unwrap();
        assert_eq!(v.fs_type, "ext4");
        assert_eq!(v.volume_type, VolumeType::KernelLVol);
        assert_eq!(v.position, VolumePosition::MustLocal);
        assert_eq!(v.mkfs_params, "-b 4096");
        assert_eq!(v.pvc_name.as_deref(), Some("data"));
        assert_eq!(v.pvc_namespace.as_deref(), Some("app"));
    }

    #[test]
    fn host_auth_policy_is_parsed_and_validated() {
        assert_eq!(
            VolumeParams::parse(&HashMap::new()).unwrap().host_auth,
            None
        );
        for (v, want) in [
            ("required", HostAuthPolicy::Required),
            ("preferred", HostAuthPolicy::Preferred),
            ("none", HostAuthPolicy::None),
        ] {
            let got = VolumeParams::parse(&p(&[("liteio.io/host-auth", v)])).unwrap();
            assert_eq!(got.host_auth, Some(want));
        }
        let e = VolumeParams::parse(&p(&[("liteio.io/host-auth", "optional")])).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::InvalidArgument);
        assert_eq!(
            e.to_string(),
            "parameters.liteio.io/host-auth: \"optional\" is not one of required, preferred, none"
        );
        // No authentication and TLS-only contradict each other.
        let e = VolumeParams::parse(&p(&[("liteio.io/host-auth", "none"), ("nvmfTls", "true")]))
            .unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::InvalidArgument);
        assert!(
            e.to_string()
                .starts_with("parameters.liteio.io/host-auth: "),
            "{e}"
        );
        assert!(e.to_string().contains("nvmfTls"), "{e}");
        let v = VolumeParams::parse(&p(&[
            ("liteio.io/host-auth", "preferred"),
            ("nvmfTls", "true"),
        ]))
        .unwrap();
        assert!(v.nvmf_tls && v.host_auth == Some(HostAuthPolicy::Preferred));
    }

    #[test]
    fn csi_storage_parameters_are_ignored() {
        // The external-provisioner strips `csi.storage.k8s.io/*` secret parameters before
        // CreateVolume; should one get through, it is neither an error nor volume context.
        let params = p(&[
            ("fsType", "ext4"),
            (
                "csi.storage.k8s.io/node-stage-secret-name",
                "liteio-auth-${pv.name}",
            ),
            ("csi.storage.k8s.io/node-stage-secret-namespace", "obnvmf"),
            ("csi.storage.k8s.io/unknown-future-key", "x"),
        ]);
        let v = VolumeParams::parse(&params).unwrap();
        assert_eq!(v.fs_type, "ext4");
        assert_eq!(v.pv_name, None);
        let ctx = volume_context(&params, "u", "n1", &v.fs_type);
        assert!(
            ctx.keys().all(|k| !k.starts_with("csi.storage.k8s.io/")),
            "{ctx:?}"
        );
        assert_eq!(ctx.len(), 3, "{ctx:?}");
    }

    #[test]
    fn bad_parameters_name_the_field() {
        let e = VolumeParams::parse(&p(&[("fsType", "btrfs")])).unwrap_err();
        assert!(e.to_string().starts_with("parameters.fsType: "), "{e}");
        let e = VolumeParams::parse(&p(&[("positionAdvice", "Anywhere")])).unwrap_err();
        assert!(
            e.to_string().starts_with("parameters.positionAdvice: "),
            "{e}"
        );
        let e = VolumeParams::parse(&p(&[("volumeType", "Zfs")])).unwrap_err();
        assert!(e.to_string().starts_with("parameters.volumeType: "), "{e}");
    }

    fn range(req: i64, lim: i64) -> CapacityRange {
        CapacityRange {
            required_bytes: req,
            limit_bytes: lim,
        }
    }

    #[test]
    fn sizes_round_up_to_the_unit() {
        let mib = i64::try_from(MIB).unwrap();
        assert_eq!(volume_size(None).unwrap(), GIB);
        assert_eq!(volume_size(Some(&range(1, 0))).unwrap(), 4 * MIB);
        assert_eq!(volume_size(Some(&range(5 * mib, 0))).unwrap(), 8 * MIB);
        assert_eq!(
            volume_size(Some(&range(8 * mib, 8 * mib))).unwrap(),
            8 * MIB
        );
        assert_eq!(volume_size(Some(&range(0, 10 * mib))).unwrap(), 8 * MIB);
        assert_eq!(volume_size(Some(&range(0, 0))).unwrap(), GIB);
    }

    #[test]
    fn sizes_out_of_range() {
        let mib = i64::try_from(MIB).unwrap();
        let e = volume_size(Some(&range(5 * mib, 6 * mib))).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::OutOfRange);
        let e = volume_size(Some(&range(0, mib))).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::OutOfRange);
        let e = volume_size(Some(&range(-1, 0))).unwrap_err();
        assert!(e.to_string().starts_with("capacity_range.required_bytes: "));
        let e = volume_size(Some(&range(10, 5))).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::InvalidArgument);
        let e = volume_size(Some(&range(i64::MAX, 0))).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::OutOfRange);
    }

    fn cap(mode: Mode, access: AccessType) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(access),
        }
    }

    #[test]
    fn capabilities() {
        let mount = AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            mount_flags: vec!["noatime".into()],
            volume_mount_group: String::new(),
        });
        assert_eq!(
            check_capability("c", &cap(Mode::SingleNodeWriter, mount.clone())).unwrap(),
            Access::Mount {
                fs_type: "ext4".into(),
                flags: vec!["noatime".into()]
            }
        );
        assert_eq!(
            check_capability(
                "c",
                &cap(Mode::SingleNodeWriter, AccessType::Block(BlockVolume {}))
            )
            .unwrap(),
            Access::Block
        );
        let e = check_capability("c", &cap(Mode::MultiNodeMultiWriter, mount.clone())).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("c.access_mode.mode: MULTI_NODE_MULTI_WRITER"),
            "{e}"
        );
        let e = check_capability(
            "c",
            &VolumeCapability {
                access_mode: None,
                access_type: Some(mount),
            },
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "c.access_mode: is required");
        assert!(check_capabilities("volume_capabilities", &[]).is_err());
    }

    #[test]
    fn paging() {
        assert_eq!(page_offset("", 3).unwrap(), 0);
        assert_eq!(page_offset("2", 3).unwrap(), 2);
        assert_eq!(
            page_offset("zz", 3).unwrap_err().kind(),
            crate::error::ErrorKind::Aborted
        );
        assert_eq!(page(0, 2, 3).unwrap(), (0, 2, "2".into()));
        assert_eq!(page(2, 2, 3).unwrap(), (2, 3, String::new()));
        assert_eq!(page(0, 0, 3).unwrap(), (0, 3, String::new()));
        assert!(page(0, -1, 3).is_err());
    }

    #[test]
    fn context_and_annotations() {
        let ctx = volume_context(
            &p(&[("fsType", "xfs"), ("csi.storage.k8s.io/pvc/name", "x")]),
            "u",
            "n1",
            "xfs",
        );
        assert_eq!(ctx.get(CTX_UUID).map(String::as_str), Some("u"));
        assert!(!ctx.contains_key("csi.storage.k8s.io/pvc/name"));
        let a: BTreeMap<String, String> = [("obnvmf/a", "1"), ("other/b", "2")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(obnvmf_annotations(&a).len(), 1);
    }

    #[test]
    fn object_names_are_valid_and_stable() {
        assert_eq!(object_name("pvc-0a1b"), "pvc-0a1b");
        let n = object_name("CreateSnapshot-volume-1-F1447585-DE1276F7");
        assert_eq!(n, object_name("CreateSnapshot-volume-1-F1447585-DE1276F7"));
        assert!(n.starts_with("createsnapshot-volume-1-"), "{n}");
        assert!(is_dns_label(&n), "{n}");
        assert_ne!(n, object_name("CreateSnapshot-volume-1-F1447585-DE1276F8"));
        // Upper case differs from lower case: different CSI names, different objects.
        assert_ne!(object_name("A-1"), object_name("a-1"));
        for name in [
            "x".repeat(128),
            "__".into(),
            "-a-".into(),
            "ünï/cödé".into(),
        ] {
            let o = object_name(&name);
            assert!(is_dns_label(&o), "{name:?} -> {o}");
        }
    }
}
