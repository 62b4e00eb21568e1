//! How the Controller service answers: the CSI form of an AntstorVolume ([`csi_volume`])
//! and of an AntstorSnapshot ([`csi_snapshot`]), and the pieces both are made of (the
//! volume's filesystem, the topology that pins a volume to its node, sizes as CSI's
//! `int64`). Pure; the Node service reads the filesystem and topology from here too.

use std::collections::HashMap;

use liteio_api::keys::{self, annotations, labels};
use liteio_api::meta::{annotation, label};
use liteio_api::snapshot::SnapshotStatusName;
use liteio_api::{AntstorSnapshot, AntstorVolume, VolumePosition};

use crate::csi::volume_content_source::Type as SourceType;
use crate::csi::{Snapshot, Topology, Volume, VolumeContentSource, volume_content_source};
use crate::params;

fn ts(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.0.as_second(),
        nanos: t.0.subsec_nanosecond(),
    }
}

pub(super) fn i64_of(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// The filesystem recorded on a volume (label, then annotation, then xfs).
pub fn volume_fs(v: &AntstorVolume) -> String {
    label(&v.metadata, labels::FS_TYPE)
        .or_else(|| annotation(&v.metadata, annotations::FS_TYPE))
        .filter(|s| !s.is_empty())
        .unwrap_or(params::DEFAULT_FS)
        .to_string()
}

/// The topology segment that pins a volume to `node`.
pub fn hostname_topology(node: &str) -> Topology {
    Topology {
        segments: HashMap::from([(labels::KUBE_HOSTNAME.to_string(), node.to_string())]),
    }
}

/// The CSI volume of an AntstorVolume.
pub fn csi_volume(v: &AntstorVolume, extra_ctx: &HashMap<String, String>) -> Volume {
    let fs = volume_fs(v);
    let mut ctx = params::volume_context(extra_ctx, &v.spec.uuid, &v.spec.target_node_id, &fs);
    if let Some(m) = annotation(&v.metadata, keys::SC_PARAM_MKFS_PARAMS) {
        ctx.insert(keys::SC_PARAM_MKFS_PARAMS.into(), m.into());
    }
    // Usable only on its node: asked so (MustLocal), or placed on a pool that cannot export
    // it (the controller's `obnvmf/local-only`; see the scheduler's rules).
    let local_only = v.spec.position_advice == VolumePosition::MustLocal
        || annotation(&v.metadata, annotations::LOCAL_ONLY) == Some("true");
    let accessible_topology = if local_only {
        v.target_node()
            .map(|n| vec![hostname_topology(n)])
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let content_source =
        label(&v.metadata, labels::VOLUME_SOURCE_SNAP_NAME).map(|_| VolumeContentSource {
            r#type: annotation(&v.metadata, ANNO_SOURCE_SNAP_ID).map(|id| {
                SourceType::Snapshot(volume_content_source::SnapshotSource {
                    snapshot_id: id.to_string(),
                })
            }),
        });
    Volume {
        capacity_bytes: i64_of(v.spec.size_byte),
        volume_id: v.spec.uuid.clone(),
        volume_context: ctx,
        content_source,
        accessible_topology,
    }
}

/// Annotation recording the CSI snapshot id a volume was cloned from.
pub const ANNO_SOURCE_SNAP_ID: &str = "obnvmf/volume-source-snap-id";

/// The CSI snapshot of an AntstorSnapshot.
pub fn csi_snapshot(s: &AntstorSnapshot, source_volume_id: &str) -> Snapshot {
    Snapshot {
        size_bytes: s.spec.size.max(0),
        snapshot_id: s.spec.uuid.clone(),
        source_volume_id: source_volume_id.to_string(),
        creation_time: s.metadata.creation_timestamp.as_ref().map(ts),
        ready_to_use: snapshot_ready(s),
        group_snapshot_id: String::new(),
    }
}

/// Whether the snapshot is cut and usable.
pub(super) fn snapshot_ready(s: &AntstorSnapshot) -> bool {
    s.status.as_ref().map(|st| st.status) == Some(SnapshotStatusName::Ready)
}
