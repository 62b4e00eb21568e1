//! LiteIO's naming scheme for engine-side objects. Kept identical to the original so that
//! hosts connected to a LiteIO target see the same subsystem after a switch.

use crate::invalid::ValidationError;

/// Prefix of a volume's subsystem NQN.
pub const SUBSYS_NQN_PREFIX: &str = "nqn.2021-03.com.alipay.ob:uuid:";
/// Prefix of a node's host NQN.
pub const HOST_NQN_PREFIX: &str = "nqn.2021-03.com.alipay.host:uuid:";
/// Length of an NVMe serial number.
pub const SERIAL_NUMBER_LEN: usize = 20;
/// Transport type of NVMe/TCP exports.
pub const TRANS_TYPE_TCP: &str = "TCP";
/// Address family of IPv4 listeners.
pub const ADDR_FAM_IPV4: &str = "IPv4";
/// Suffix of a snapshot's engine name.
pub const SNAPSHOT_SUFFIX: &str = "_snap";

/// Subsystem NQN of the volume with this uuid.
pub fn subsys_nqn(volume_uuid: &str) -> String {
    format!("{SUBSYS_NQN_PREFIX}{volume_uuid}")
}

/// Serial number of the volume with this uuid: the uuid without dashes, first 20 characters.
pub fn serial_number(volume_uuid: &str) -> String {
    volume_uuid
        .chars()
        .filter(|c| *c != '-')
        .take(SERIAL_NUMBER_LEN)
        .collect()
}

/// Name of the aio bdev that exports an LVM or file volume: its serial number.
pub fn aio_bdev_name(volume_uuid: &str) -> String {
    serial_number(volume_uuid)
}

/// Host NQN of a node that has no `/etc/nvme/hostnqn`.
pub fn host_nqn(node: &str) -> String {
    format!("{HOST_NQN_PREFIX}{node}")
}

/// lvol alias `lvs/name`.
pub fn lvol_alias(lvs: &str, name: &str) -> String {
    format!("{lvs}/{name}")
}

/// Longest engine object name every engine takes (SPDK's lvol names: 63 bytes).
pub const ENGINE_NAME_MAX: usize = 63;

/// Engine name of a snapshot of the volume `origin` when the snapshot object names none:
/// `<origin>_snap`, as LiteIO names it. When that would be longer than
/// [`ENGINE_NAME_MAX`] (an origin of 59 bytes or more), the origin is cut and a hash of the
/// whole origin name keeps it unique and stable: `<origin prefix>-<16 hex>_snap`.
pub fn snapshot_name(origin: &str) -> String {
    let plain = format!("{origin}{SNAPSHOT_SUFFIX}");
    if plain.len() <= ENGINE_NAME_MAX {
        return plain;
    }
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in origin.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let tail = format!("-{h:016x}{SNAPSHOT_SUFFIX}");
    let mut cut = ENGINE_NAME_MAX - tail.len();
    while !origin.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{tail}", &origin[..cut])
}

/// Controller IDs per node slot: a subsystem needs one per connected host path (plus a few
/// while a host reconnects), so 1,024 is plenty.
pub const CNTLID_SLOT_SIZE: u16 = 1024;
/// Slots in the controller-ID space (NVMe allows 1-0xFFEF: 63 whole slots of 1,024).
pub const CNTLID_SLOTS: u16 = 63;

/// The controller-ID range `(min, max)` every export of the node with this NVMe-oF listener
/// address hands out. Two targets serving one NQN (the source and destination of a hot
/// migration) must hand out different controller IDs, or the host refuses the second path.
/// The range is slot `fnv1a(address) mod 63` of 1,024 IDs: stable across restarts and
/// builds, different for most pairs of nodes but not all (two addresses share a slot with a
/// chance of 1 in 63): a migration checks that source and destination differ
/// (`cntlid_range(a) != cntlid_range(b)`) and picks another destination when they do not.
pub fn cntlid_range(node_address: &str) -> (u16, u16) {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node_address.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // The remainder is below 63, so it fits in u16.
    let slot = (h % u64::from(CNTLID_SLOTS)) as u16;
    let min = slot * CNTLID_SLOT_SIZE + 1;
    (min, min + CNTLID_SLOT_SIZE - 1)
}

/// Bdev created by attaching the NVMe controller `controller` (namespace 1).
pub fn nvme_ns_bdev(controller: &str) -> String {
    format!("{controller}n1")
}

/// Name of the raid bdev that assembles the SpdkLVStore data control `name` (the data
/// control's own name: Kubernetes names cannot clash with the bdevs the agent makes
/// otherwise, which are lvol UUIDs, `lvs/lvol` aliases, `<uuid>-gate`, serials and
/// `<controller>n1`).
pub fn assembly_bdev(data_control: &str) -> String {
    data_control.to_string()
}

/// Prefix of the NVMe controllers with which the assembly of `data_control` attaches its
/// remote members: `<data control>_m`. Kubernetes names have no `_`, so the prefix of one
/// data control is never the prefix of another's.
pub fn assembly_controller_prefix(data_control: &str) -> String {
    format!("{data_control}_m")
}

/// The NVMe controller that attaches member number `index` (its place in the raid) of the
/// assembly of `data_control`: `<data control>_m<index>`; its bdev is
/// [`nvme_ns_bdev`] of it.
pub fn assembly_controller(data_control: &str, index: usize) -> String {
    format!("{}{index}", assembly_controller_prefix(data_control))
}

/// Prefix of a data control's `spec.uuid` (LiteIO's volume id of a multi-disk volume).
pub const DATA_CONTROL_UUID_PREFIX: &str = "dc-";

/// The namespace UUID of an assembled data control's export: its `spec.uuid` without the
/// `dc-` prefix (a namespace UUID must be a UUID).
pub fn assembly_ns_uuid(data_control_uuid: &str) -> String {
    data_control_uuid
        .strip_prefix(DATA_CONTROL_UUID_PREFIX)
        .unwrap_or(data_control_uuid)
        .to_string()
}

/// VG and LV names of a data control.
pub fn data_control_vg(namespace: &str, name: &str) -> String {
    format!("{namespace}-{name}")
}

/// Prefix of a volume's authentication Secret.
pub const AUTH_SECRET_PREFIX: &str = "liteio-auth-";
/// Longest name of a Secret (a DNS subdomain).
pub const SECRET_NAME_MAX: usize = 253;

/// Name of the Secret that holds the authentication keys of the volume whose CSI volume name
/// (PV name) is `csi_volume_name`: `liteio-auth-<name>`. StorageClasses name it as
/// `liteio-auth-${pv.name}` (see [`crate::auth`]).
pub fn auth_secret(csi_volume_name: &str) -> String {
    format!("{AUTH_SECRET_PREFIX}{csi_volume_name}")
}

/// Prefix of the Role (and RoleBinding) that lets one storage node read the keys of the
/// volumes it stores.
pub const NODE_KEYS_ROLE_PREFIX: &str = "liteio-keys-";

/// Name of the Role and RoleBinding that let `node` get, patch and delete the authentication
/// Secrets of the volumes stored on it: `liteio-keys-<node>`. The controller keeps the
/// Role's `resourceNames` to exactly those Secrets.
pub fn node_keys_role(node: &str) -> String {
    format!("{NODE_KEYS_ROLE_PREFIX}{node}")
}

/// The Kubernetes user a node's kubelet authenticates as, `system:node:<node>`: the one
/// identity RBAC can tell apart per node (a DaemonSet's pods share one ServiceAccount). The
/// disk-agent reads its volumes' keys with it.
pub fn node_user(node: &str) -> String {
    format!("system:node:{node}")
}

/// True for a DNS-1123 label: lower-case letters, digits and `-`, starting and ending with a
/// letter or digit.
fn is_dns_label(label: &str) -> bool {
    let b = label.as_bytes();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        }
        _ => false,
    }
}

/// True for a DNS-1123 subdomain of at most 253 bytes (the names of Secrets and PVs).
pub fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= SECRET_NAME_MAX && name.split('.').all(is_dns_label)
}

/// [`auth_secret`], checked to be a valid Secret name; the error names the volume.
pub fn auth_secret_checked(csi_volume_name: &str) -> Result<String, ValidationError> {
    let name = auth_secret(csi_volume_name);
    if name.len() > SECRET_NAME_MAX {
        return Err(ValidationError::new(
            "volume name",
            format!(
                "volume {csi_volume_name:?} gives an authentication Secret name of {} bytes; \
                 Secret names have at most {SECRET_NAME_MAX}",
                name.len()
            ),
        ));
    }
    if !is_dns_subdomain(&name) {
        return Err(ValidationError::new(
            "volume name",
            format!(
                "volume {csi_volume_name:?} gives the authentication Secret name {name:?}, \
                 which is not a DNS subdomain (lower-case letters, digits, '-' and '.')"
            ),
        ));
    }
    Ok(name)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn cntlid_ranges_are_slots_within_nvme_limits() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..=255u8 {
            let (min, max) = cntlid_range(&format!("127.0.0.{i}"));
            assert!(min >= 1 && max <= 0xFFEF && max - min + 1 == CNTLID_SLOT_SIZE);
            assert_eq!((min - 1) % CNTLID_SLOT_SIZE, 0);
            seen.insert(min);
        }
        // 256 addresses spread over most of the 63 slots.
        assert!(seen.len() > 50, "{}", seen.len());
        assert_eq!(cntlid_range("10.0.0.1"), cntlid_range("10.0.0.1"));
        assert_ne!(cntlid_range("127.0.0.2"), cntlid_range("127.0.0.3"));
    }

    #[test]
    fn nqn_and_serial_follow_liteio() {
        let uuid = "0b9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a11";
        assert_eq!(
            subsys_nqn(uuid),
            "nqn.2021-03.com.alipay.ob:uuid:0b9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a11"
        );
        assert_eq!(serial_number(uuid), "0b9d1f3c6a2e4c1d9f0a");
        assert_eq!(serial_number(uuid).len(), SERIAL_NUMBER_LEN);
        assert_eq!(aio_bdev_name(uuid), serial_number(uuid));
        assert_eq!(
            host_nqn("node-1"),
            "nqn.2021-03.com.alipay.host:uuid:node-1"
        );
    }

    #[test]
    fn short_uuid_gives_short_serial() {
        assert_eq!(serial_number("ab-cd"), "abcd");
    }

    #[test]
    fn engine_names() {
        assert_eq!(lvol_alias("lvs", "pvc-1"), "lvs/pvc-1");
        assert_eq!(snapshot_name("pvc-1"), "pvc-1_snap");
        // Long origins are cut and hashed: at most 63 bytes, stable, distinct.
        let a = "sanity-controller-source-vol-e432c061-53f006db-681bef07ee4b3c02";
        let b = "sanity-controller-source-vol-e432c061-53f006db-681bef07ee4b3c03";
        assert_eq!(snapshot_name(a).len(), ENGINE_NAME_MAX);
        assert!(snapshot_name(a).ends_with(SNAPSHOT_SUFFIX));
        assert_eq!(snapshot_name(a), snapshot_name(a));
        assert_ne!(snapshot_name(a), snapshot_name(b));
        let exactly = "x".repeat(ENGINE_NAME_MAX - SNAPSHOT_SUFFIX.len());
        assert_eq!(snapshot_name(&exactly), format!("{exactly}_snap"));
        assert!(snapshot_name(&"é".repeat(40)).len() <= ENGINE_NAME_MAX);
        assert_eq!(nvme_ns_bdev("mig-1"), "mig-1n1");
        assert_eq!(data_control_vg("obnvmf", "dc"), "obnvmf-dc");
    }

    #[test]
    fn assembly_names() {
        assert_eq!(assembly_bdev("pvc-7"), "pvc-7");
        assert_eq!(assembly_controller("pvc-7", 2), "pvc-7_m2");
        assert_eq!(nvme_ns_bdev(&assembly_controller("pvc-7", 0)), "pvc-7_m0n1");
        // One data control's controllers never carry another's prefix.
        assert!(
            !assembly_controller("pvc-7-m1", 0).starts_with(&assembly_controller_prefix("pvc-7"))
        );
        assert_eq!(
            assembly_ns_uuid("dc-0b9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a11"),
            "0b9d1f3c-6a2e-4c1d-9f0a-5e7b2c8d4a11"
        );
        assert_eq!(assembly_ns_uuid("0b9d1f3c"), "0b9d1f3c");
    }

    #[test]
    fn node_key_access_names() {
        assert_eq!(node_keys_role("n1"), "liteio-keys-n1");
        assert_eq!(node_user("n1"), "system:node:n1");
    }

    #[test]
    fn auth_secret_names() {
        assert_eq!(auth_secret("pvc-1a2b"), "liteio-auth-pvc-1a2b");
        assert_eq!(
            auth_secret_checked("pvc-1a2b").unwrap(),
            "liteio-auth-pvc-1a2b"
        );
        assert_eq!(auth_secret_checked("a.b").unwrap(), "liteio-auth-a.b");
        let longest = "p".repeat(SECRET_NAME_MAX - AUTH_SECRET_PREFIX.len());
        assert_eq!(
            auth_secret_checked(&longest).unwrap().len(),
            SECRET_NAME_MAX
        );
        let e = auth_secret_checked(&format!("{longest}p")).unwrap_err();
        assert!(e.to_string().contains("254 bytes"), "{e}");
        assert!(e.to_string().contains(&format!("{longest}p")), "{e}");
        for bad in ["", "PVC-1", "pvc_1", "pvc-", "a..b", "a.-b", "pvc 1"] {
            let e = auth_secret_checked(bad).unwrap_err();
            assert!(
                e.reason.contains(&format!("volume {bad:?}")),
                "{bad:?}: {e}"
            );
        }
        assert!(is_dns_subdomain("a-1.b2"));
        assert!(!is_dns_subdomain("-a"));
    }
}
