//! Every string the cluster sees: labels, annotations, finalizers, field managers and
//! well-known names. The values are LiteIO's, typos included (`obnmvf/` in the snapshot
//! labels), so that existing clusters keep working.

/// API group of every LiteIO custom resource.
pub const GROUP: &str = "volume.antstor.alipay.com";
/// API version of every LiteIO custom resource.
pub const VERSION: &str = "v1";
/// `apiVersion` string of every LiteIO custom resource.
pub const API_VERSION: &str = "volume.antstor.alipay.com/v1";
/// The namespace every LiteIO object lives in.
pub const DEFAULT_NAMESPACE: &str = "obnvmf";
/// Namespace of the agents' heartbeat Leases.
pub const LEASE_NAMESPACE: &str = "obnvmf";
/// Name of the CSI driver and StorageClass provisioner.
pub const CSI_DRIVER_NAME: &str = "antstor.csi.alipay.com";
/// StorageClass parameter that sets the volume's position advice.
pub const SC_PARAM_POSITION_ADVICE: &str = "positionAdvice";
/// StorageClass parameter that sets the volume type.
pub const SC_PARAM_VOLUME_TYPE: &str = "volumeType";
/// StorageClass parameter that sets the filesystem.
pub const SC_PARAM_FS_TYPE: &str = "fsType";
/// StorageClass parameter / annotation carrying extra mkfs arguments.
pub const SC_PARAM_MKFS_PARAMS: &str = "obnvmf/mkfsParams";
/// StorageClass parameter: `"true"` to export the class's volumes over NVMe/TCP with TLS only
/// (a PSK in each volume's Secret, beside its DH-HMAC-CHAP keys).
pub const SC_PARAM_NVMF_TLS: &str = "nvmfTls";
/// StorageClass parameter: how the class's volumes' hosts authenticate, `required` (the
/// default), `preferred` or `none` (see [`crate::host_auth`]). Not in LiteIO.
pub const SC_PARAM_HOST_AUTH: &str = "liteio.io/host-auth";
/// StorageClass parameter: the number of replicas of a replicated volume (2 to
/// [`crate::replica::MAX_REPLICAS`]); makes the class's volumes raid1 data controls over
/// that many full copies on distinct nodes. Not in LiteIO.
pub const SC_PARAM_REPLICAS: &str = "liteio.io/replicas";
/// StorageClass parameter: a node label key (e.g. `topology.kubernetes.io/zone`) whose
/// values must differ between a replicated volume's replicas; stored on its group as
/// [`crate::replica::ANNO_SPREAD_KEY`]. Not in LiteIO.
pub const SC_PARAM_REPLICA_SPREAD_KEY: &str = "liteio.io/replica-spread-key";
/// Prefix of LiteIO's label and annotation keys.
pub const PREFIX_OBNVMF: &str = "obnvmf";

/// Field managers used for server-side apply and patches.
pub mod managers {
    /// The disk-agent.
    pub const AGENT: &str = "liteio-disk-agent";
    /// The node-disk-controller.
    pub const CONTROLLER: &str = "liteio-controller";
    /// The CSI driver.
    pub const CSI: &str = "liteio-csi";
    /// The kubectl plugin.
    pub const CLI: &str = "kubectl-liteio";
}

/// Finalizers, in the order components add them.
pub mod finalizers {
    /// Added by the controller once an object is cached in its state.
    pub const IN_STATE: &str = "antstor.alipay.com/in-state";
    /// Declared by LiteIO for pools but unused.
    pub const STORAGE_POOL: &str = "antstor.alipay.com/storage-pool";
    /// Added by the agent once the LV / lvol of a volume exists.
    pub const LOGIC_VOLUME: &str = "antstor.alipay.com/logic-volume";
    /// Added by the agent once the NVMe-oF subsystem of a volume exists.
    pub const SPDK_TARGET: &str = "antstor.alipay.com/spdk-tgt";
    /// Legacy LVM finalizer, still honoured on delete (also used by AntstorDataControl).
    pub const KERNEL_LVOL: &str = "antstor.alipay.com/lvm";
    /// AntstorDataControl: the agent of `spec.targetNodeId` built the SpdkLVStore assembly
    /// (raid bdev, initiator controllers, subsystem); it drops it after the teardown.
    /// LiteIO's name, the same string as [`KERNEL_LVOL`].
    pub const ASSEMBLY: &str = KERNEL_LVOL;
    /// Legacy SPDK lvol finalizer, still honoured on delete.
    pub const SPDK_LVOL: &str = "antstor.alipay.com/spdk-lvol";
    /// Added by the agent once a snapshot exists.
    pub const SNAPSHOT: &str = "antstor.alipay.com/snapshot";
    /// Added to a volume group while it owns member volumes.
    pub const VOLUMES: &str = "antstor.alipay.com/volumes";
    /// Migration: the source agent connected the pipe to the destination.
    pub const MIGRATE_PIPE_CONNECTED: &str = "obnvmf/migrate-pipe-connected";
    /// Migration: the host connected a path to the destination.
    pub const MIGRATE_HOST_CONNECTED: &str = "obnvmf/migrate-host-connected";
    /// Finalizers of a volume that the agent owns (current and legacy).
    pub const AGENT_VOLUME: [&str; 4] = [LOGIC_VOLUME, SPDK_TARGET, KERNEL_LVOL, SPDK_LVOL];
}

/// Label keys.
pub mod labels {
    /// StoragePool: the node serial (= pool name); used by affinity selectors.
    pub const NODE_SN: &str = "obnvmf/node-sn";
    /// StoragePool: `locked` to take a pool out of scheduling by hand.
    pub const POOL_SCHEDULING_STATUS: &str = "obnvmf/pool-scheduling-status";
    /// Value of [`POOL_SCHEDULING_STATUS`] for a locked pool.
    pub const POOL_SCHEDULING_LOCKED: &str = "locked";
    /// StoragePool: local-storage watermark.
    pub const POOL_LOCAL_STORAGE_BYTES: &str = "obnvmf/local-storage-bytes";
    /// Volume / snapshot / data control: the node that holds the data.
    pub const TARGET_NODE_ID: &str = "obnvmf/target-node-id";
    /// Role / RoleBinding: `true` on the controller's per-node key access objects
    /// (`liteio-keys-<node>`).
    pub const NODE_KEYS: &str = "obnvmf/node-keys";
    /// Volume: its uuid (the CSI volume id).
    pub const VOL_UUID: &str = "obnvmf/vol-uuid";
    /// PersistentVolume: the target node.
    pub const PV_TARGET_NODE: &str = "obnvmf/pv-target-node";
    /// Volume: the PV name.
    pub const PV_NAME: &str = "obnvmf/pv-name";
    /// Volume: filesystem type (also an annotation).
    pub const FS_TYPE: &str = "obnvmf/fs-type";
    /// Volume: name of the owning PVC.
    pub const PVC_NAME: &str = "csi.storage.k8s.io/pvc-name";
    /// Volume: namespace of the owning PVC.
    pub const PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc-namespace";
    /// Volume: data-holder group for anti-affinity.
    pub const DATA_HOLDER: &str = "antstor.csi.alipay.com/data-holder";
    /// Volume: name of the snapshot it was cloned from.
    pub const VOLUME_SOURCE_SNAP_NAME: &str = "obnvmf/volume-source-snap-name";
    /// Volume: namespace of the snapshot it was cloned from.
    pub const VOLUME_SOURCE_SNAP_NS: &str = "obnvmf/volume-source-snap-ns";
    /// Volume: original size while an expansion is in progress.
    pub const EXPANSION_ORIGINAL_SIZE: &str = "obnvmf/expansion-original-size";
    /// Volume: member of an AntstorVolumeGroup.
    pub const VOL_GROUP_NAME: &str = "obnvmf/vol-group-name";
    /// Volume group: the data control it belongs to.
    pub const DATA_CONTROL_NAME: &str = "obnvmf/data-control-name";
    /// Migration destination volume: name of the source volume.
    pub const MIGRATE_SOURCE_VOLUME_NAME: &str = "migrate.obnvmf/source-volume-name";
    /// Migration destination volume: name of the migration.
    pub const MIGRATE_MIGRATION_NAME: &str = "migrate.obnvmf/migration-name";
    /// Migration: the source node.
    pub const MIGRATE_SOURCE_NODE_ID: &str = "migrate.obnvmf/source-node-id";
    /// Migration: the host node.
    pub const MIGRATE_HOST_NODE_ID: &str = "migrate.obnvmf/host-node-id";
    /// Snapshot: origin volume name (LiteIO's typo `obnmvf` kept).
    pub const ORIGIN_VOLUME_NAME: &str = "obnmvf/origin-antstorvol-name";
    /// Snapshot: origin volume namespace (typo kept).
    pub const ORIGIN_VOLUME_NAMESPACE: &str = "obnmvf/origin-antstorvol-ns";
    /// Snapshot: set by a user to request a merge-restore (typo kept).
    pub const MERGE_START_TIMESTAMP: &str = "obnmvf/merge-start-timestamp";
    /// Snapshot: set by the agent when the merge finished (typo kept).
    pub const MERGE_FINISH_TIMESTAMP: &str = "obnmvf/merge-finish-timestamp";
    /// Snapshot: its uuid (the CSI snapshot id).
    pub const SNAP_UUID: &str = "obnvmf/snap-uuid";
    /// Node: default pool mode when the agent has no config file.
    pub const NODE_POOL_MODE: &str = "custom.k8s.alipay.com/nvmf-pool-mode";
    /// Node: IP (default `nodeInfoKeys`).
    pub const NODE_IP: &str = "lite.io/ip";
    /// Node: hostname (default `nodeInfoKeys`).
    pub const NODE_HOSTNAME: &str = "lite.io/hostname";
    /// Node: rack (default `nodeInfoKeys`).
    pub const NODE_RACK: &str = "lite.io/rack";
    /// Node: room (default `nodeInfoKeys`).
    pub const NODE_ROOM: &str = "lite.io/room";
    /// Node: the well-known hostname label.
    pub const KUBE_HOSTNAME: &str = "kubernetes.io/hostname";
}

/// Value of `annotations::MIGRATE_ANA_STATE` that commits a hot migration's switch-over
/// on its source volume.
pub const ANA_INACCESSIBLE: &str = "inaccessible";

/// Annotation keys.
pub mod annotations {
    /// StoragePool: SPDK version suffix of the target.
    pub const TGT_VERSION: &str = "obnvmf/tgt-version";
    /// StoragePool: the node's NVMe host NQN, used for target allow-lists.
    pub const HOST_NQN: &str = "obnvmf/hostnqn";
    /// StoragePool: the agent's `storage.pooling.mode` (`File`, `KernelLVM`, `SpdkLVStore`).
    /// A file pool is described to LiteIO's readers as a KernelLVM one; this says what it is.
    pub const POOLING_MODE: &str = "obnvmf/pooling-mode";
    /// Volume: `"true"` when the volume can be used only on its target node, because the
    /// pool it was placed on cannot export it (no working SPDK target). Set by the controller
    /// when it binds the volume; the CSI controller then returns the node as the volume's
    /// accessible topology.
    pub const LOCAL_ONLY: &str = "obnvmf/local-only";
    /// Volume: filesystem type.
    pub const FS_TYPE: &str = "obnvmf/fs-type";
    /// Volume: `linear` or `striped`.
    pub const LV_LAYOUT: &str = "obnvmf/lv-layout";
    /// Volume: real LV / lvol size when it differs from the spec.
    pub const ALLOCATED_BYTES: &str = "obnvmf/allocated-bytes";
    /// Volume / PVC: space reserved for snapshots.
    pub const SNAPSHOT_RESERVED_BYTES: &str = "obnvmf/snapshot-reserved-bytes";
    /// Volume: label selector (string form) over Nodes.
    pub const NODE_LABEL_SELECTOR: &str = "obnvmf/node-label-selector";
    /// Volume: label selector (string form) over StoragePools.
    pub const POOL_LABEL_SELECTOR: &str = "obnvmf/pool-label-selector";
    /// Volume: capacity reservation to consume.
    pub const RESERVATION_ID: &str = "obnvmf/reservation-id";
    /// Volume / PVC: forced target node.
    pub const SELECTED_TGT_NODE: &str = "obnvmf/selected-tgt-node";
    /// Volume / snapshot: the CSI name (the PV name) when the object name had to be derived
    /// from it. The volume's authentication Secret is named after the CSI name.
    pub const CSI_NAME: &str = "obnvmf/csi-name";
    /// Volume: when its authentication keys were last replaced (`kubectl liteio rotate-keys`
    /// sets it, so that the agent applies the new keys of the Secret at once).
    pub const KEYS_ROTATED_AT: &str = "obnvmf/keys-rotated-at";
    /// Volume: the `keys-rotated-at` value whose keys the agent has applied to the live
    /// export (written by the agent once the subsystem's hosts hold them; until then new
    /// connections may still need the old keys).
    pub const KEYS_APPLIED_AT: &str = "obnvmf/keys-applied-at";
    /// Volume: `"true"` to export it over TLS only (a PSK in the volume's Secret). Set from
    /// the StorageClass parameter `nvmfTls`.
    pub const NVMF_TLS: &str = "obnvmf/nvmf-tls";
    /// Volume: the host NQNs its export admits without DH-HMAC-CHAP keys (comma-separated;
    /// absent: none), written by the disk-agent (see [`crate::host_auth`]). The CSI node
    /// waits for its own NQN here before it connects without keys.
    pub const HOSTS_WITHOUT_AUTH: &str = "obnvmf/hosts-without-auth";
    /// Volume: the node the volume is published to by ControllerPublishVolume (the CO's
    /// attach; absent: none). Its access modes admit one node: a publish to another node is
    /// refused until ControllerUnpublishVolume clears it.
    pub const PUBLISHED_NODE: &str = "liteio.io/published-node";
    /// Volume: the consumer node whose host NQN the volume's NVMe-oF export admits, written
    /// by the disk-agent once the subsystem's host list says so (absent: no export yet, or
    /// an agent older than the annotation). After the consumer (`spec.hostNode`) changes,
    /// ControllerPublishVolume and NodeStageVolume wait for it to name the new node.
    pub const EXPORTED_TO: &str = "liteio.io/exported-to";
    /// On an AntstorVolume, written by the disk-agent: the QoS limits in force on the
    /// volume's export (`VolumeQos::to_annotation`: `iops=…,mbps=…,readMbps=…,writeMbps=…`).
    pub const QOS_IN_FORCE: &str = "liteio.io/qos-in-force";
    /// Node: what the node's kernel can do for NVMe/TCP authentication (`dhchap`, `tls`,
    /// both comma-separated, or `none`), written by the CSI node when it starts.
    pub const NODE_HOST_AUTH: &str = "liteio.io/nvme-host-auth";
    /// Node: the kernel release (`uname -r`) [`NODE_HOST_AUTH`] was found on.
    pub const NODE_KERNEL_RELEASE: &str = "liteio.io/kernel-release";
    /// Migration: when the controller first saw the source agent enable the switch-over
    /// (`migrationInfo.autoSwitch.enabled`), RFC 3339.
    pub const MIGRATE_SWITCH_ENABLED_AT: &str = "migrate.obnvmf/switch-enabled-at";
    /// Migration: when the controller first saw the switch-over succeed
    /// (`migrationInfo.autoSwitch.status: Success`), RFC 3339.
    pub const MIGRATE_SWITCHED_AT: &str = "migrate.obnvmf/switched-at";
    /// Migration: when it reached `Finished`, RFC 3339.
    pub const MIGRATE_FINISHED_AT: &str = "migrate.obnvmf/finished-at";
    /// Volume: the ANA state its export's listener must have (`optimized`, `inaccessible`).
    /// Without it an export is optimized, except a migration destination's, which is
    /// inaccessible until the switch-over. Written by the source node's agent during the
    /// switch-over, on the source (`inaccessible`) and on the destination (`optimized`).
    pub const MIGRATE_ANA_STATE: &str = "migrate.obnvmf/ana-state";
    /// Volume: the ANA state of [`MIGRATE_ANA_STATE`] its agent last applied to the export
    /// (the source node's agent waits for the destination's promotion with it).
    pub const MIGRATE_ANA_APPLIED: &str = "migrate.obnvmf/ana-applied";
    /// Volume (a migration destination): the port of the export's pipe listener, through
    /// which the source node's agent writes the copy (always ANA optimized).
    pub const MIGRATE_PIPE_SVC_ID: &str = "migrate.obnvmf/pipe-svc-id";
    /// PVC: the node kube-scheduler selected.
    pub const K8S_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
    /// Volume: `guest-direct` when a Kata guest connects SPDK directly.
    pub const SPDK_CONN_MODE: &str = "obnvmf/spdk-conn-mode";
    /// Value of [`SPDK_CONN_MODE`] for a Kata guest.
    pub const SPDK_CONN_MODE_GUEST_DIRECT: &str = "guest-direct";
    /// Volume: VFIO-user mode.
    pub const VFIOUSER_MODE: &str = "obnvmf/volume-vfiouser-mode";
    /// Volume: pod runtime class (`rund`).
    pub const POD_RUNTIME_CLASS: &str = "obnvmf/pod-runtime-class";
    /// Volume: `Block` in rund block mode.
    pub const VOLUME_MODE: &str = "obnvmf/volume-mode";
    /// PVC: overrides the volume type.
    pub const VOLUME_TYPE: &str = "obnvmf/volume-type";
    /// Example key of `remoteIgnoreAnnoSelector`.
    pub const REGARD_AS_REMOTE: &str = "obnvmf/regard-as-remote";
    /// PVC: overrides the position advice.
    pub const SDS_POSITION_ADVICE: &str = "custom.k8s.alipay.com/sds-position-advice";
    /// CSI `--extra-create-metadata`: PVC name.
    pub const CSI_PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
    /// CSI `--extra-create-metadata`: PVC namespace.
    pub const CSI_PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";
    /// CSI `--extra-create-metadata`: PV name.
    pub const CSI_PV_NAME: &str = "csi.storage.k8s.io/pv/name";
    /// CSI volume context: pod name.
    pub const CSI_POD_NAME: &str = "csi.storage.k8s.io/pod.name";
    /// CSI volume context: pod namespace.
    pub const CSI_POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";
    /// CSI volume context: pod uid.
    pub const CSI_POD_UID: &str = "csi.storage.k8s.io/pod.uid";
    /// Volume group parameters passed through the StorageClass.
    pub const PV_TYPE: &str = "obnvmf/pv-type";
    /// Data control: raid level.
    pub const DATACONTROL_RAID_LEVEL: &str = "datacontrol/raid-level";
    /// Data control: engine type.
    pub const DATACONTROL_ENGINE_TYPE: &str = "datacontrol/engine-type";
    /// Volume group: size symmetry.
    pub const VOLGROUP_SIZE_SYMMETRY: &str = "volgroup/size-symmetry";
    /// Volume group: minimum member size.
    pub const VOLGROUP_MIN_SIZE: &str = "volgroup/min-size";
    /// Volume group: maximum member size.
    pub const VOLGROUP_MAX_SIZE: &str = "volgroup/max-size";
    /// Volume group: maximum member count.
    pub const VOLGROUP_MAX_VOLUMES: &str = "volgroup/max-volumes";
    /// Volume group: whether empty nodes may be used.
    pub const VOLGROUP_ALLOW_EMPTY_NODE: &str = "volgroup/allow-empty-node";
}

/// Pool condition message of a node locked by configuration.
pub const KUBE_NODE_MSG_NC_OFFLINE: &str = "NC_OFFLINE";
/// Name of the `storage` capacity key in `StoragePool.status.capacity`.
pub const RESOURCE_STORAGE: &str = "storage";
/// Name of the volume-count capacity key.
pub const RESOURCE_VOLUMES: &str = "volumes";
/// Default LVM volume group name.
pub const DEFAULT_LVM_NAME: &str = "antstore-vg";
/// Default SPDK lvstore name.
pub const DEFAULT_LVS_NAME: &str = "antstor_lvstore";
/// Default raid0 bdev name.
pub const DEFAULT_RAID0_NAME: &str = "antstor_raid0";
/// Default malloc bdev name.
pub const DEFAULT_MALLOC_BDEV_NAME: &str = "antstor_malloc";
/// Default aio bdev name.
pub const DEFAULT_AIO_BDEV_NAME: &str = "antstor_aio";
