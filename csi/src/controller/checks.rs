//! The Controller service's checks of a request, one function per call: what the call must
//! carry, and what it may not ask for, decided before anything is read from or written to
//! the API server, so that a bad request fails the same whatever exists. Each returns the
//! checked pieces the handler goes on with. The words are [`crate::params`]' (a required
//! field, a parameter's name); a multi-disk volume's parameters are [`crate::group`]'s.
//!
//! | Call | Must carry | Refused |
//! |---|---|---|
//! | CreateVolume | `name`, valid capabilities, parameters and capacity range | a multi-disk volume from a source, with QoS limits or TLS; a source that is not a snapshot |
//! | DeleteVolume, ControllerUnpublishVolume | `volume_id` | |
//! | ControllerPublishVolume | `volume_id`, `node_id`, a valid `volume_capability` | |
//! | ControllerExpandVolume | `volume_id`, `capacity_range` | |
//! | ControllerModifyVolume | `volume_id`, valid `mutable_parameters` | a multi-disk volume |
//! | ValidateVolumeCapabilities | `volume_id`, a capability | |
//! | GetCapacity | valid capabilities, when given | |
//! | CreateSnapshot | `name`, `source_volume_id` | a multi-disk volume's |
//! | DeleteSnapshot | `snapshot_id` | |

use liteio_api::keys;
use liteio_api::qos::{self, VolumeQos};

use crate::csi::volume_content_source::Type as SourceType;
use crate::csi::{
    ControllerExpandVolumeRequest, ControllerModifyVolumeRequest, ControllerPublishVolumeRequest,
    CreateSnapshotRequest, CreateVolumeRequest, GetCapacityRequest, TopologyRequirement,
    ValidateVolumeCapabilitiesRequest,
};
use crate::error::{CsiError, Result};
use crate::group::{self, GroupParams, GroupRequest};
use crate::params::{self, Access, VolumeParams, field, require};

/// A checked CreateVolume.
#[derive(Debug)]
pub(super) struct CreateVolume<'a> {
    /// The CSI name.
    pub csi_name: &'a str,
    /// The object's name ([`params::object_name`] of the CSI name).
    pub name: String,
    /// The StorageClass parameters.
    pub params: VolumeParams,
    /// Bytes.
    pub size: u64,
    /// The filesystem: a mount capability's, else the class's.
    pub fs: String,
    /// A plain volume or a multi-disk one.
    pub kind: CreateKind<'a>,
}

/// What kind of volume a CreateVolume makes.
#[derive(Debug)]
pub(super) enum CreateKind<'a> {
    /// One AntstorVolume, from the snapshot of this id when given.
    Plain {
        /// The source snapshot's id.
        snapshot: Option<&'a str>,
    },
    /// A multi-disk volume.
    Group(GroupRequest),
}

/// CreateVolume.
pub(super) fn create_volume(req: &CreateVolumeRequest) -> Result<CreateVolume<'_>> {
    let csi_name = require("name", &req.name)?;
    let name = params::object_name(csi_name);
    let accesses = params::check_capabilities("volume_capabilities", &req.volume_capabilities)?;
    let p = VolumeParams::parse(&req.parameters)?;
    let size = params::volume_size(req.capacity_range.as_ref())?;
    let fs = requested_fs(&p, &accesses);
    let kind = match GroupParams::parse(&req.parameters)? {
        Some(gp) => CreateKind::Group(group_request(req, &name, &p, gp, size, &fs)?),
        None => CreateKind::Plain {
            snapshot: snapshot_source(req)?,
        },
    };
    Ok(CreateVolume {
        csi_name,
        name,
        params: p,
        size,
        fs,
        kind,
    })
}

/// A filesystem capability may name the filesystem; it must agree with the class.
fn requested_fs(p: &VolumeParams, accesses: &[Access]) -> String {
    let mut fs = p.fs_type.clone();
    for a in accesses {
        if let Access::Mount { fs_type, .. } = a
            && !fs_type.is_empty()
        {
            fs = fs_type.clone();
        }
    }
    fs
}

/// A multi-disk volume's CreateVolume (see [`crate::group`]): what it cannot have is
/// refused here, by name.
fn group_request(
    req: &CreateVolumeRequest,
    name: &str,
    p: &VolumeParams,
    gp: GroupParams,
    size: u64,
    fs: &str,
) -> Result<GroupRequest> {
    if req.volume_content_source.is_some() {
        return Err(CsiError::invalid(
            "volume_content_source",
            "a multi-disk volume (obnvmf/pv-type: VolumeGroup) cannot be made from a snapshot or a volume",
        ));
    }
    if p.qos.is_some() || !req.mutable_parameters.is_empty() {
        return Err(CsiError::invalid(
            field(qos::PARAM_IOPS),
            "QoS limits are not supported on multi-disk volumes (obnvmf/pv-type: VolumeGroup) yet",
        ));
    }
    if p.nvmf_tls {
        return Err(CsiError::invalid(
            field(keys::SC_PARAM_NVMF_TLS),
            "TLS is not supported on multi-disk volumes (obnvmf/pv-type: VolumeGroup) yet",
        ));
    }
    params::check_fs("volume_capabilities.mount.fs_type", fs)?;
    Ok(GroupRequest {
        params: gp,
        size,
        fs: fs.to_string(),
        mkfs_params: p.mkfs_params.clone(),
        host: topology_node(req.accessibility_requirements.as_ref()),
        pv_name: p.pv_name.clone().unwrap_or_else(|| name.to_string()),
    })
}

/// The id of the snapshot a CreateVolume starts from, when it names one; cloning a volume
/// is refused.
fn snapshot_source(req: &CreateVolumeRequest) -> Result<Option<&str>> {
    let Some(src) = req.volume_content_source.as_ref() else {
        return Ok(None);
    };
    match &src.r#type {
        Some(SourceType::Snapshot(s)) => {
            require("volume_content_source.snapshot.snapshot_id", &s.snapshot_id).map(Some)
        }
        Some(SourceType::Volume(_)) => Err(CsiError::invalid(
            "volume_content_source.volume",
            "cloning a volume from a volume is not supported (CLONE_VOLUME is not advertised); clone from a snapshot",
        )),
        None => Err(CsiError::invalid(
            "volume_content_source",
            "names no source",
        )),
    }
}

/// The node a request's topology points at (`kubernetes.io/hostname`), preferred first.
pub(super) fn topology_node(req: Option<&TopologyRequirement>) -> Option<String> {
    let r = req?;
    r.preferred.iter().chain(r.requisite.iter()).find_map(|t| {
        t.segments
            .get(liteio_api::keys::labels::KUBE_HOSTNAME)
            .cloned()
    })
}

/// The volume id of DeleteVolume and ControllerUnpublishVolume.
pub(super) fn volume_id(id: &str) -> Result<&str> {
    require("volume_id", id)
}

/// ControllerPublishVolume: the volume id and the node id.
pub(super) fn publish(req: &ControllerPublishVolumeRequest) -> Result<(&str, &str)> {
    let id = require("volume_id", &req.volume_id)?;
    let node = require("node_id", &req.node_id)?;
    params::require_capability(req.volume_capability.as_ref())?;
    Ok((id, node))
}

/// ControllerExpandVolume: the volume id and the size asked for.
pub(super) fn expand(req: &ControllerExpandVolumeRequest) -> Result<(&str, u64)> {
    let id = require("volume_id", &req.volume_id)?;
    let range = req
        .capacity_range
        .as_ref()
        .ok_or_else(|| CsiError::invalid("capacity_range", "is required"))?;
    Ok((id, params::volume_size(Some(range))?))
}

/// ControllerModifyVolume: the volume id. The keys are checked first: a bad request fails
/// the same whether or not the volume exists.
pub(super) fn modify(req: &ControllerModifyVolumeRequest) -> Result<&str> {
    let id = require("volume_id", &req.volume_id)?;
    params::mutable_qos(&req.mutable_parameters, VolumeQos::default())?;
    if group::is_group_id(id) {
        return Err(unsupported("ControllerModifyVolume (QoS limits)", id));
    }
    Ok(id)
}

/// ValidateVolumeCapabilities: the volume id. Whether the capabilities are supported is the
/// answer, not an error.
pub(super) fn validate(req: &ValidateVolumeCapabilitiesRequest) -> Result<&str> {
    let id = require("volume_id", &req.volume_id)?;
    if req.volume_capabilities.is_empty() {
        return Err(CsiError::invalid(
            "volume_capabilities",
            "at least one capability is required",
        ));
    }
    Ok(id)
}

/// GetCapacity: its capabilities, when it gives any.
pub(super) fn get_capacity(req: &GetCapacityRequest) -> Result<()> {
    if !req.volume_capabilities.is_empty() {
        params::check_capabilities("volume_capabilities", &req.volume_capabilities)?;
    }
    Ok(())
}

/// CreateSnapshot: the CSI name and the source volume id.
pub(super) fn create_snapshot(req: &CreateSnapshotRequest) -> Result<(&str, &str)> {
    let csi_name = require("name", &req.name)?;
    let src = require("source_volume_id", &req.source_volume_id)?;
    if group::is_group_id(src) {
        return Err(unsupported("CreateSnapshot", src));
    }
    Ok((csi_name, src))
}

/// DeleteSnapshot: the snapshot id.
pub(super) fn snapshot_id(id: &str) -> Result<&str> {
    require("snapshot_id", id)
}

/// The error for an operation multi-disk volumes do not support yet.
pub fn unsupported(op: &str, id: &str) -> CsiError {
    CsiError::FailedPrecondition(format!(
        "{op} is not supported for multi-disk volume {id} (volume groups) yet"
    ))
}
