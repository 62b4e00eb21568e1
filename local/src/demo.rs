//! The demo volume: create through the CSI controller, stage, publish, write and read a file,
//! and the reverse.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use liteio_csi::client::CsiClient;
use liteio_csi::csi::volume_capability::access_mode::Mode;
use liteio_csi::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use liteio_csi::csi::{
    CapacityRange, CreateVolumeRequest, DeleteVolumeRequest, NodePublishVolumeRequest,
    NodeStageVolumeRequest, NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, Topology,
    TopologyRequirement, VolumeCapability,
};

/// A volume created, staged and published by the demo.
#[derive(Debug, Clone)]
pub struct DemoVolume {
    /// PV / AntstorVolume name.
    pub name: String,
    /// CSI volume id (the volume uuid).
    pub id: String,
    /// Volume context returned by CreateVolume.
    pub context: HashMap<String, String>,
    /// Staging path.
    pub staging: PathBuf,
    /// Publish path.
    pub target: PathBuf,
}

/// A mounted-filesystem capability (`fs` e.g. xfs), single-node writer.
pub fn mount_capability(fs: &str) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// A raw block capability, single-node writer.
pub fn block_capability() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// Why a demo step failed.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A CSI call failed.
    #[error("{op}: {message} ({code:?})")]
    Csi {
        /// The CSI call.
        op: &'static str,
        /// gRPC code.
        code: tonic::Code,
        /// The driver's message.
        message: String,
    },
    /// CreateVolume answered without a volume.
    #[error("CreateVolume returned no volume")]
    NoVolume,
    /// A directory could not be made.
    #[error("cannot create a mount directory: {0}")]
    Io(#[from] std::io::Error),
}

fn status(op: &'static str, e: tonic::Status) -> DemoError {
    DemoError::Csi {
        op,
        code: e.code(),
        message: e.message().to_string(),
    }
}

/// A volume created through the CSI controller, not staged.
#[derive(Debug, Clone)]
pub struct CreatedVolume {
    /// PV / AntstorVolume name.
    pub name: String,
    /// CSI volume id (the volume uuid).
    pub id: String,
    /// Volume context returned by CreateVolume.
    pub context: HashMap<String, String>,
}

/// CreateVolume `name` (`bytes`, xfs) for a consumer on `node` (as a provisioner does for a
/// pod scheduled there), with StorageClass `parameters` besides `fsType`.
pub async fn create(
    csi: &mut CsiClient,
    node: &str,
    name: &str,
    bytes: i64,
    parameters: &[(&str, &str)],
) -> Result<CreatedVolume, DemoError> {
    let topology = Topology {
        segments: HashMap::from([(
            liteio_api::keys::labels::KUBE_HOSTNAME.to_string(),
            node.to_string(),
        )]),
    };
    let mut params = HashMap::from([("fsType".to_string(), "xfs".to_string())]);
    params.extend(
        parameters
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let created = csi
        .controller
        .create_volume(CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: bytes,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![mount_capability("xfs")],
            parameters: params,
            accessibility_requirements: Some(TopologyRequirement {
                requisite: vec![topology.clone()],
                preferred: vec![topology],
            }),
            ..Default::default()
        })
        .await
        .map_err(|e| status("CreateVolume", e))?
        .into_inner();
    let vol = created.volume.ok_or(DemoError::NoVolume)?;
    Ok(CreatedVolume {
        name: name.into(),
        id: vol.volume_id,
        context: vol.volume_context,
    })
}

/// DeleteVolume.
pub async fn delete(csi: &mut CsiClient, id: &str) -> Result<(), DemoError> {
    csi.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        })
        .await
        .map_err(|e| status("DeleteVolume", e))?;
    Ok(())
}

/// Create `name` (`bytes`, xfs) for a consumer on `node`, stage it under `dir/staging`,
/// publish it at `dir/mnt`.
pub async fn provision(
    csi: &mut CsiClient,
    dir: &Path,
    node: &str,
    name: &str,
    bytes: i64,
) -> Result<DemoVolume, DemoError> {
    let created = create(csi, node, name, bytes, &[]).await?;
    let vol = liteio_csi::csi::Volume {
        volume_id: created.id,
        volume_context: created.context,
        ..Default::default()
    };
    let staging = dir.join("staging").join(name);
    let target = dir.join("mnt").join(name);
    std::fs::create_dir_all(&staging)?;
    std::fs::create_dir_all(target.parent().unwrap_or(dir))?;
    csi.node
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: vol.volume_id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(mount_capability("xfs")),
            volume_context: vol.volume_context.clone(),
            ..Default::default()
        })
        .await
        .map_err(|e| status("NodeStageVolume", e))?;
    csi.node
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(mount_capability("xfs")),
            volume_context: vol.volume_context.clone(),
            ..Default::default()
        })
        .await
        .map_err(|e| status("NodePublishVolume", e))?;
    Ok(DemoVolume {
        name: name.into(),
        id: vol.volume_id,
        context: vol.volume_context,
        staging,
        target,
    })
}

/// Unpublish, unstage and delete.
pub async fn remove(csi: &mut CsiClient, v: &DemoVolume) -> Result<(), DemoError> {
    csi.node
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: v.id.clone(),
            target_path: v.target.display().to_string(),
        })
        .await
        .map_err(|e| status("NodeUnpublishVolume", e))?;
    csi.node
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: v.id.clone(),
            staging_target_path: v.staging.display().to_string(),
        })
        .await
        .map_err(|e| status("NodeUnstageVolume", e))?;
    delete(csi, &v.id).await
}
