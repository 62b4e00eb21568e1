//! LiteIO's naming scheme for engine-side objects. Kept identical to the original so that
//! hosts connected to a LiteIO target see the same subsystem after a switch.

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

/// Engine name of a snapshot of the volume `origin` when the snapshot object names none.
pub fn snapshot_name(origin: &str) -> String {
    format!("{origin}{SNAPSHOT_SUFFIX}")
}

/// Bdev created by attaching the NVMe controller `controller` (namespace 1).
pub fn nvme_ns_bdev(controller: &str) -> String {
    format!("{controller}n1")
}

/// VG and LV names of a data control.
pub fn data_control_vg(namespace: &str, name: &str) -> String {
    format!("{namespace}-{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(nvme_ns_bdev("mig-1"), "mig-1n1");
        assert_eq!(data_control_vg("obnvmf", "dc"), "obnvmf-dc");
    }
}
