//! The decisions of a migration, pure functions of the objects so that they are unit-tested
//! without an API server: which volumes a migration links ([`source_key`], [`dest_key`],
//! [`migration_of_dest`]), whether a volume can be migrated ([`validate_source`]), the
//! destination volume's object ([`dest_volume`]), which node cannot be its other path
//! ([`cntlid_clash`]), and the flow through the agent-driven phases ([`next`], [`switched`],
//! [`agent_error`]). The reconciler ([`super`]) applies them.

use std::collections::BTreeMap;

use kube::ResourceExt;
use liteio_api::common::{SpdkTarget, VolumePosition, VolumeType};
use liteio_api::keys::{annotations, finalizers, labels};
use liteio_api::migration::{ConnectStatus, MigrationPhase, ResultStatus};
use liteio_api::{AntstorVolume, AntstorVolumeSpec, VolumeMigration, VolumeStatus, naming};

use crate::state::ObjectKey;

/// Labels of the source volume that the destination does not inherit: its node, and the
/// clone labels (the destination is a plain lvol holding a full copy, not a clone of a
/// snapshot that exists only on the source node).
const NOT_INHERITED_LABELS: [&str; 4] = [
    labels::TARGET_NODE_ID,
    labels::VOLUME_SOURCE_SNAP_NAME,
    labels::VOLUME_SOURCE_SNAP_NS,
    labels::EXPANSION_ORIGINAL_SIZE,
];

/// Annotations of the source volume that the destination does not inherit: the forced
/// node, what the controller and the agent write for the node the data is on, and the
/// switch-over state of an earlier migration (a destination starts inaccessible).
const NOT_INHERITED_ANNOTATIONS: [&str; 7] = [
    annotations::SELECTED_TGT_NODE,
    annotations::ALLOCATED_BYTES,
    annotations::LOCAL_ONLY,
    annotations::MIGRATE_ANA_STATE,
    annotations::MIGRATE_ANA_APPLIED,
    annotations::MIGRATE_PIPE_SVC_ID,
    // What the source's export admits without keys: the destination's agent decides it
    // for its own export, with the same policy (`spec.hostAuth`) and host.
    annotations::HOSTS_WITHOUT_AUTH,
];

/// The key of the source volume of `mig`.
pub fn source_key(mig: &VolumeMigration) -> ObjectKey {
    ObjectKey::new(mig.source_namespace(), mig.spec.source_volume.name.clone())
}

/// The key of the destination volume of `mig` (it lives beside the source), once the
/// migration has a uid.
pub fn dest_key(mig: &VolumeMigration) -> Option<ObjectKey> {
    Some(ObjectKey::new(
        mig.source_namespace(),
        mig.dest_volume_name()?,
    ))
}

/// Why the volume `key` (as the state has it, `None` when it does not exist) cannot be
/// migrated, if it cannot. `snapshots` are its snapshots; `other` names another unfinished
/// migration of the same volume.
pub fn validate_source(
    key: &ObjectKey,
    vol: Option<&AntstorVolume>,
    snapshots: &[ObjectKey],
    other: Option<&ObjectKey>,
) -> std::result::Result<(), String> {
    if key.name.is_empty() {
        return Err("spec.sourceVolume.name is empty; name the AntstorVolume to migrate".into());
    }
    let Some(vol) = vol else {
        return Err(format!(
            "spec.sourceVolume: AntstorVolume {key} does not exist"
        ));
    };
    if vol.metadata.deletion_timestamp.is_some() {
        return Err(format!("source volume {key} is being deleted"));
    }
    if vol.spec.type_ != Some(VolumeType::SpdkLVol) {
        let t = vol
            .spec
            .type_
            .map_or("unset".to_string(), |t| format!("{t:?}"));
        return Err(format!(
            "source volume {key} has spec.type {t}; only SpdkLVol volumes can be migrated"
        ));
    }
    if vol.spec.position_advice == VolumePosition::MustLocal {
        return Err(format!(
            "source volume {key} has spec.positionAdvice MustLocal; its data must stay on its consumer's node"
        ));
    }
    if liteio_api::meta::annotation(&vol.metadata, annotations::LOCAL_ONLY) == Some("true") {
        return Err(format!(
            "source volume {key} is usable only on its node (annotation {}); its consumer cannot reach another node",
            annotations::LOCAL_ONLY
        ));
    }
    if vol.target_node().is_none() {
        return Err(format!(
            "source volume {key} has no spec.targetNodeId; it is not scheduled yet"
        ));
    }
    if vol.phase() != VolumeStatus::Ready {
        return Err(format!(
            "source volume {key} has status.status {}; it must be ready",
            status_name(vol.phase())
        ));
    }
    if vol
        .spec
        .spdk_target
        .as_ref()
        .is_none_or(|t| t.subsys_nqn.is_empty())
    {
        return Err(format!(
            "source volume {key} has no spec.spdkTarget.subsysNqn; it is not exported"
        ));
    }
    if let Some(m) = liteio_api::meta::label(&vol.metadata, labels::MIGRATE_MIGRATION_NAME) {
        return Err(format!(
            "source volume {key} is the destination of migration {m}, which has not finished"
        ));
    }
    if liteio_api::meta::label(&vol.metadata, labels::EXPANSION_ORIGINAL_SIZE).is_some() {
        return Err(format!(
            "source volume {key} is being expanded (label {}); migrate it afterwards",
            labels::EXPANSION_ORIGINAL_SIZE
        ));
    }
    if let Some(s) = snapshots.first() {
        return Err(format!(
            "source volume {key} has the snapshot {s}, which cannot move with it; delete the snapshot first"
        ));
    }
    if let Some(o) = other {
        return Err(format!(
            "source volume {key} is already being migrated by VolumeMigration {o}"
        ));
    }
    Ok(())
}

fn status_name(s: VolumeStatus) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{s:?}"))
}

/// The destination volume of `mig` for the source `src`, on `node` (empty: not placed yet,
/// the form the scheduler is asked about).
///
/// Labels: the source's minus `obnvmf/target-node-id` (and the clone and expansion labels),
/// the same `obnvmf/vol-uuid`, plus `migrate.obnvmf/source-volume-name` and
/// `migrate.obnvmf/migration-name`. Annotations: the source's minus the forced node and
/// what is node-specific, plus `obnvmf/csi-name` = the source's CSI name (so the agent on
/// the destination node loads the same authentication Secret). Spec: the same uuid (so the
/// serial number and model derived from it are the same), type, size, thinness, position
/// advice, affinities, host node and host-authentication policy; `spdkTarget` preset with the source's NQN, serial and
/// namespace UUID, which the agent keeps, so the host sees one namespace with two paths.
pub fn dest_volume(
    mig: &VolumeMigration,
    src: &AntstorVolume,
    name: &str,
    node: &str,
) -> AntstorVolume {
    let mut lbls: BTreeMap<String, String> = src.labels().clone();
    for l in NOT_INHERITED_LABELS {
        lbls.remove(l);
    }
    lbls.insert(labels::VOL_UUID.into(), src.spec.uuid.clone());
    lbls.insert(labels::MIGRATE_SOURCE_VOLUME_NAME.into(), src.name_any());
    lbls.insert(labels::MIGRATE_MIGRATION_NAME.into(), mig.name_any());
    if !node.is_empty() {
        lbls.insert(labels::TARGET_NODE_ID.into(), node.into());
    }
    let mut annos: BTreeMap<String, String> = src.annotations().clone();
    for a in NOT_INHERITED_ANNOTATIONS {
        annos.remove(a);
    }
    annos.remove("kubectl.kubernetes.io/last-applied-configuration");
    annos.insert(annotations::CSI_NAME.into(), src.csi_name());
    let st = src.spec.spdk_target.clone().unwrap_or_default();
    let preset = SpdkTarget {
        subsys_nqn: if st.subsys_nqn.is_empty() {
            naming::subsys_nqn(&src.spec.uuid)
        } else {
            st.subsys_nqn
        },
        sn: if st.sn.is_empty() {
            naming::serial_number(&src.spec.uuid)
        } else {
            st.sn
        },
        ns_uuid: if st.ns_uuid.is_empty() {
            src.spec.uuid.clone()
        } else {
            st.ns_uuid
        },
        trans_type: st.trans_type,
        addr_fam: st.addr_fam,
        ..SpdkTarget::default()
    };
    let mut vol = AntstorVolume::new(
        name,
        AntstorVolumeSpec {
            uuid: src.spec.uuid.clone(),
            type_: Some(VolumeType::SpdkLVol),
            size_byte: src.spec.size_byte,
            position_advice: src.spec.position_advice,
            is_thin: src.spec.is_thin,
            stop_reconcile: false,
            node_affinity: src.spec.node_affinity.clone(),
            pool_affinity: src.spec.pool_affinity.clone(),
            target_node_id: node.into(),
            host_node: src.spec.host_node.clone(),
            kernel_lvol: None,
            spdk_lvol: None,
            spdk_target: Some(preset),
            // The destination admits the host as the source does (same policy, same host).
            host_auth: src.spec.host_auth,
            // The destination enforces the source's limits from its first export, before
            // the host's I/O moves to it.
            qos: src.spec.qos,
        },
    );
    vol.metadata.namespace = src.metadata.namespace.clone();
    vol.metadata.labels = Some(lbls);
    vol.metadata.annotations = Some(annos);
    vol
}

/// The error an agent reports on the migration, if one does: the source agent's copy job
/// (`jobProgress.status` `Error` or `Failed`, any case) or the switch-over
/// (`autoSwitch.status: Error`).
pub fn agent_error(mig: &VolumeMigration) -> Option<String> {
    let info = &mig.spec.migration_info;
    let job = info.job_progress.status.as_str();
    if job.eq_ignore_ascii_case("error") || job.eq_ignore_ascii_case("failed") {
        return Some(format!(
            "the source agent reports that the copy job failed (spec.migrationInfo.jobProgress.status: {job}); the source volume keeps serving"
        ));
    }
    if info.auto_switch.status == Some(ResultStatus::Error) {
        return Some(
            "the switch-over to the destination failed (spec.migrationInfo.autoSwitch.status: Error); the source volume keeps serving"
                .into(),
        );
    }
    None
}

/// True once the host has no part in the migration or its CSI node reported `want`.
fn host_is(mig: &VolumeMigration, want: ConnectStatus) -> bool {
    mig.spec.source_volume.host_node_id.is_empty()
        || mig.spec.migration_info.host_connect_status == Some(want)
}

/// True when `mig` carries the finalizer `f`.
pub(super) fn has_finalizer(mig: &VolumeMigration, f: &str) -> bool {
    mig.finalizers().iter().any(|x| x == f)
}

/// What the flow does next in the phases where the controller only waits for the agents
/// (`SetupPipe`, `Syncing`, and the agents' part of `Cleaning`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Wait for the next change of the object.
    Wait,
    /// Go to this phase.
    Advance(MigrationPhase),
    /// The agents are done with `Cleaning`: the controller retires the source.
    RetireSource,
    /// An agent reported an error: the phase stays, the status becomes `Error`.
    Fail(String),
}

/// The next step of `mig` in the agent-driven phases (pure).
///
/// - `SetupPipe` → `Syncing` once the source agent's pipe is `Connected` and the host (when
///   the volume has one) is `Connected`.
/// - `Syncing` → `Cleaning` once `autoSwitch.status` is `Success`.
/// - `Cleaning`: the source is retired once the pipe is `Disconnected` and its finalizer
///   gone, and the host (when there is one) is `Disconnected` and its finalizer gone.
/// - An agent error ([`agent_error`]) before the switch is reported; after the switch
///   (`Cleaning`) the host already uses the destination, so the flow goes on.
pub fn next(mig: &VolumeMigration) -> Next {
    let info = &mig.spec.migration_info;
    let phase = mig.phase();
    if matches!(phase, MigrationPhase::SetupPipe | MigrationPhase::Syncing)
        && let Some(e) = agent_error(mig)
    {
        return Next::Fail(e);
    }
    match phase {
        MigrationPhase::SetupPipe => {
            if info.migration_pipe.status == Some(ConnectStatus::Connected)
                && host_is(mig, ConnectStatus::Connected)
            {
                Next::Advance(MigrationPhase::Syncing)
            } else {
                Next::Wait
            }
        }
        MigrationPhase::Syncing => {
            if info.auto_switch.status == Some(ResultStatus::Success) {
                Next::Advance(MigrationPhase::Cleaning)
            } else {
                Next::Wait
            }
        }
        MigrationPhase::Cleaning => {
            let pipe_done = info.migration_pipe.status == Some(ConnectStatus::Disconnected)
                && !has_finalizer(mig, finalizers::MIGRATE_PIPE_CONNECTED);
            let host_done = host_is(mig, ConnectStatus::Disconnected)
                && !has_finalizer(mig, finalizers::MIGRATE_HOST_CONNECTED);
            if pipe_done && host_done {
                Next::RetireSource
            } else {
                Next::Wait
            }
        }
        _ => Next::Wait,
    }
}

/// True once the host was switched to the destination: from then on the migration cannot be
/// cancelled, only finished.
pub fn switched(mig: &VolumeMigration) -> bool {
    matches!(
        mig.phase(),
        MigrationPhase::Cleaning | MigrationPhase::Finished
    ) || mig.spec.migration_info.auto_switch.status == Some(ResultStatus::Success)
}

/// Whether a node of `pool` hands out the same NVMe controller IDs as the export at
/// `src_addr` (`naming::cntlid_range` of their addresses): a host refuses a second
/// controller with an ID it already has for the subsystem, so such a node cannot be the
/// other path of a migration.
pub fn cntlid_clash(pool: &liteio_api::StoragePool, src_addr: &str) -> bool {
    !src_addr.is_empty()
        && pool.spec.addresses.iter().any(|a| {
            a.address != src_addr
                && liteio_api::naming::cntlid_range(&a.address)
                    == liteio_api::naming::cntlid_range(src_addr)
        })
}

/// The migration a destination volume belongs to (label `migrate.obnvmf/migration-name`).
pub fn migration_of_dest(vol: &AntstorVolume) -> Option<ObjectKey> {
    let name = liteio_api::meta::label(&vol.metadata, labels::MIGRATE_MIGRATION_NAME)?;
    Some(ObjectKey::new(
        vol.metadata.namespace.clone().unwrap_or_default(),
        name,
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::testing::*;
    use liteio_api::migration::STATUS_WORKING;
    use liteio_api::migration::{
        AutoSwitch, MigrationPipe, VolumeMigrationSpec, VolumeMigrationStatus,
    };
    use liteio_api::size::GIB;

    fn ready_source() -> AntstorVolume {
        let mut v = volume("pvc-1", 10 * GIB)
            .kind(VolumeType::SpdkLVol)
            .host("h1")
            .scheduled_to("n1")
            .label(labels::PV_NAME, "pvc-1")
            .annotate(annotations::SELECTED_TGT_NODE, "n1")
            .build();
        v.spec.spdk_target = Some(SpdkTarget {
            subsys_nqn: naming::subsys_nqn("uuid-pvc-1"),
            ns_uuid: "uuid-pvc-1".into(),
            sn: naming::serial_number("uuid-pvc-1"),
            svc_id: "4420".into(),
            address: "10.0.0.1".into(),
            ..SpdkTarget::default()
        });
        v.status = Some(liteio_api::AntstorVolumeStatus {
            status: VolumeStatus::Ready,
            ..Default::default()
        });
        v
    }

    fn key() -> ObjectKey {
        ObjectKey::new("obnvmf", "pvc-1")
    }

    fn mig(phase: MigrationPhase) -> VolumeMigration {
        let mut m = VolumeMigration::new("m1", VolumeMigrationSpec::default());
        m.metadata.namespace = Some("obnvmf".into());
        m.metadata.uid = Some("u1".into());
        m.spec.source_volume.name = "pvc-1".into();
        m.spec.source_volume.host_node_id = "h1".into();
        m.status = Some(VolumeMigrationStatus {
            phase: Some(phase),
            status: STATUS_WORKING.into(),
            message: String::new(),
        });
        m
    }

    #[test]
    fn a_ready_spdk_volume_is_a_valid_source() {
        assert_eq!(
            validate_source(&key(), Some(&ready_source()), &[], None),
            Ok(())
        );
    }

    #[test]
    fn invalid_sources_name_the_problem() {
        let k = key();
        let cases: Vec<(Option<AntstorVolume>, &str)> = vec![
            (None, "does not exist"),
            (
                Some({
                    let mut v = ready_source();
                    v.spec.type_ = Some(VolumeType::KernelLVol);
                    v
                }),
                "spec.type KernelLVol",
            ),
            (
                Some({
                    let mut v = ready_source();
                    v.spec.position_advice = VolumePosition::MustLocal;
                    v
                }),
                "MustLocal",
            ),
            (
                Some({
                    let mut v = ready_source();
                    v.status = None;
                    v
                }),
                "status.status creating",
            ),
            (
                Some({
                    let mut v = ready_source();
                    v.metadata
                        .annotations
                        .get_or_insert_default()
                        .insert(annotations::LOCAL_ONLY.into(), "true".into());
                    v
                }),
                annotations::LOCAL_ONLY,
            ),
            (
                Some({
                    let mut v = ready_source();
                    v.spec.spdk_target = None;
                    v
                }),
                "spdkTarget",
            ),
        ];
        for (vol, says) in cases {
            let e = validate_source(&k, vol.as_ref(), &[], None).unwrap_err();
            assert!(e.contains(says), "{e:?} should say {says:?}");
            assert!(e.contains("obnvmf/pvc-1"), "{e:?} names the volume");
        }
        let snap = ObjectKey::new("obnvmf", "s1");
        let e = validate_source(&k, Some(&ready_source()), &[snap], None).unwrap_err();
        assert!(e.contains("snapshot obnvmf/s1"), "{e}");
        let other = ObjectKey::new("obnvmf", "m0");
        let e = validate_source(&k, Some(&ready_source()), &[], Some(&other)).unwrap_err();
        assert!(e.contains("VolumeMigration obnvmf/m0"), "{e}");
        let e = validate_source(&ObjectKey::new("obnvmf", ""), None, &[], None).unwrap_err();
        assert!(e.contains("spec.sourceVolume.name"), "{e}");
    }

    #[test]
    fn the_destination_is_the_same_namespace_on_another_node() {
        let mut src = ready_source();
        src.spec.host_auth = Some(liteio_api::host_auth::HostAuthPolicy::Preferred);
        src.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(annotations::HOSTS_WITHOUT_AUTH.into(), "nqn.host".into());
        let m = mig(MigrationPhase::Pending);
        let d = dest_volume(&m, &src, "mig-u1", "n2");
        let l = d.labels();
        assert_eq!(l.get(labels::VOL_UUID).unwrap(), "uuid-pvc-1");
        assert_eq!(l.get(labels::TARGET_NODE_ID).unwrap(), "n2");
        assert_eq!(l.get(labels::MIGRATE_SOURCE_VOLUME_NAME).unwrap(), "pvc-1");
        assert_eq!(l.get(labels::MIGRATE_MIGRATION_NAME).unwrap(), "m1");
        assert_eq!(l.get(labels::PV_NAME).unwrap(), "pvc-1");
        assert!(!d.annotations().contains_key(annotations::SELECTED_TGT_NODE));
        assert_eq!(d.annotations().get(annotations::CSI_NAME).unwrap(), "pvc-1");
        assert_eq!(d.spec.uuid, src.spec.uuid);
        assert_eq!(d.spec.size_byte, src.spec.size_byte);
        assert_eq!(d.spec.target_node_id, "n2");
        assert_eq!(d.spec.host_node, src.spec.host_node);
        // The same policy; what the source's export admits without keys is its own.
        assert_eq!(d.spec.host_auth, src.spec.host_auth);
        assert!(
            !d.annotations()
                .contains_key(annotations::HOSTS_WITHOUT_AUTH)
        );
        let t = d.spec.spdk_target.unwrap();
        let s = src.spec.spdk_target.clone().unwrap();
        assert_eq!(
            (t.subsys_nqn, t.ns_uuid, t.sn),
            (s.subsys_nqn, s.ns_uuid, s.sn)
        );
        assert!(
            t.svc_id.is_empty() && t.address.is_empty(),
            "the destination picks its own listener"
        );
        // The probe the scheduler sees is unplaced.
        let probe = dest_volume(&m, &src, "mig-u1", "");
        assert!(probe.target_node().is_none());
        assert!(!probe.labels().contains_key(labels::TARGET_NODE_ID));
    }

    #[test]
    fn phases_follow_the_agents() {
        let mut m = mig(MigrationPhase::SetupPipe);
        assert_eq!(next(&m), Next::Wait);
        m.spec.migration_info.migration_pipe = MigrationPipe {
            dest_bdev_name: "mig-u1n1".into(),
            status: Some(ConnectStatus::Connected),
        };
        assert_eq!(next(&m), Next::Wait, "the host has not connected");
        m.spec.migration_info.host_connect_status = Some(ConnectStatus::Connected);
        assert_eq!(next(&m), Next::Advance(MigrationPhase::Syncing));

        m.status.as_mut().unwrap().phase = Some(MigrationPhase::Syncing);
        m.spec.migration_info.auto_switch = AutoSwitch {
            enabled: true,
            status: Some(ResultStatus::Unknown),
        };
        assert_eq!(next(&m), Next::Wait);
        assert!(!switched(&m));
        m.spec.migration_info.auto_switch.status = Some(ResultStatus::Success);
        assert_eq!(next(&m), Next::Advance(MigrationPhase::Cleaning));
        assert!(switched(&m));

        m.status.as_mut().unwrap().phase = Some(MigrationPhase::Cleaning);
        m.metadata.finalizers = Some(vec![
            finalizers::MIGRATE_PIPE_CONNECTED.into(),
            finalizers::MIGRATE_HOST_CONNECTED.into(),
        ]);
        assert_eq!(next(&m), Next::Wait);
        m.spec.migration_info.migration_pipe.status = Some(ConnectStatus::Disconnected);
        m.spec.migration_info.host_connect_status = Some(ConnectStatus::Disconnected);
        assert_eq!(next(&m), Next::Wait, "finalizers still there");
        m.metadata.finalizers = None;
        assert_eq!(next(&m), Next::RetireSource);
    }

    #[test]
    fn a_node_with_the_sources_controller_id_slot_is_no_destination() {
        use k8s_openapi::api::core::v1::NodeAddress;
        let src = "127.10.0.11";
        let slot = liteio_api::naming::cntlid_range(src);
        // An address in the same slot (1 in 63 share one) and one in another.
        let same = (0..=255u8)
            .flat_map(|a| (0..=255u8).map(move |b| format!("127.20.{a}.{b}")))
            .find(|a| liteio_api::naming::cntlid_range(a) == slot)
            .unwrap();
        let other = (0..=255u8)
            .map(|b| format!("127.30.0.{b}"))
            .find(|a| liteio_api::naming::cntlid_range(a) != slot)
            .unwrap();
        let pool = |addr: &str| {
            let mut p = liteio_api::StoragePool::new("n", Default::default());
            p.spec.addresses = vec![NodeAddress {
                address: addr.into(),
                type_: "InternalIP".into(),
            }];
            p
        };
        assert!(cntlid_clash(&pool(&same), src));
        assert!(!cntlid_clash(&pool(&other), src));
        // The source's own address is the source's node, not a clash; no address, no check.
        assert!(!cntlid_clash(&pool(src), src));
        assert!(!cntlid_clash(&pool(&same), ""));
    }

    #[test]
    fn a_volume_without_a_host_needs_only_the_pipe() {
        let mut m = mig(MigrationPhase::SetupPipe);
        m.spec.source_volume.host_node_id = String::new();
        m.spec.migration_info.migration_pipe.status = Some(ConnectStatus::Connected);
        assert_eq!(next(&m), Next::Advance(MigrationPhase::Syncing));
    }

    #[test]
    fn agent_errors_fail_before_the_switch_only() {
        let mut m = mig(MigrationPhase::Syncing);
        m.spec.migration_info.job_progress.status = "Failed".into();
        assert!(matches!(next(&m), Next::Fail(e) if e.contains("jobProgress.status: Failed")));
        m.spec.migration_info.job_progress.status = "running".into();
        m.spec.migration_info.auto_switch.status = Some(ResultStatus::Error);
        assert!(matches!(next(&m), Next::Fail(e) if e.contains("autoSwitch.status: Error")));
        // After the switch the host is on the destination: finishing is the only way on.
        m.status.as_mut().unwrap().phase = Some(MigrationPhase::Cleaning);
        m.spec.migration_info.auto_switch.status = Some(ResultStatus::Success);
        m.spec.migration_info.job_progress.status = "error".into();
        assert_eq!(next(&m), Next::Wait);
    }
}
