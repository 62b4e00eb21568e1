//! Typed validation of LiteIO objects. Every error names the field it is about, in the
//! JSON path form an operator sees in `kubectl get -o yaml` (`spec.sizeByte`).
//!
//! The top of the crate's validation: it checks whole objects (volume, snapshot, pool,
//! volume group) and imports their types; nothing in the crate imports it back. The error
//! types and `parse_enum` live below the types, in `invalid`, and are re-exported here.

use crate::common::VolumeType;
use crate::group::{AntstorVolumeGroup, SymmetryValue};
use crate::keys::annotations;
use crate::meta::annotation;
use crate::pool::StoragePool;
use crate::size::{self, MIN_VOLUME_SIZE};
use crate::snapshot::AntstorSnapshot;
use crate::volume::AntstorVolume;

pub use crate::invalid::{ValidationError, ValidationErrors, allowed_values, parse_enum};

fn finish(errors: Vec<ValidationError>) -> Result<(), ValidationErrors> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(errors))
    }
}

fn check_u64_annotation(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
    errors: &mut Vec<ValidationError>,
) {
    if let Some(v) = annotation(meta, key)
        && v.trim().parse::<u64>().is_err()
    {
        errors.push(ValidationError::new(
            format!("metadata.annotations[{key}]"),
            format!("{v:?} is not a byte count (a non-negative integer)"),
        ));
    }
}

/// Validate an AntstorVolume as the API server's CEL rules and LiteIO's webhook would, plus
/// the annotations the scheduler and agent read.
pub fn volume(v: &AntstorVolume) -> Result<(), ValidationErrors> {
    let mut errors = Vec::new();
    if v.spec.uuid.trim().is_empty() {
        errors.push(ValidationError::new("spec.uuid", "must not be empty"));
    }
    if v.spec.size_byte < MIN_VOLUME_SIZE {
        errors.push(ValidationError::new(
            "spec.sizeByte",
            format!(
                "{} bytes is below the minimum of {} ({MIN_VOLUME_SIZE} bytes)",
                v.spec.size_byte,
                size::format_bytes(MIN_VOLUME_SIZE)
            ),
        ));
    }
    if let (Some(VolumeType::KernelLVol), Some(_)) = (v.spec.type_, &v.spec.spdk_lvol) {
        errors.push(ValidationError::new(
            "spec.spdkLvol",
            "is set on a KernelLVol volume",
        ));
    }
    if let (Some(VolumeType::SpdkLVol), Some(_)) = (v.spec.type_, &v.spec.kernel_lvol) {
        errors.push(ValidationError::new(
            "spec.kernelLvol",
            "is set on a SpdkLVol volume",
        ));
    }
    if let Some(Err(e)) = v.spec.qos.map(|q| q.validate()) {
        errors.push(ValidationError::new(e.field, e.reason));
    }
    check_u64_annotation(&v.metadata, annotations::ALLOCATED_BYTES, &mut errors);
    check_u64_annotation(
        &v.metadata,
        annotations::SNAPSHOT_RESERVED_BYTES,
        &mut errors,
    );
    if let Some(layout) = annotation(&v.metadata, annotations::LV_LAYOUT)
        && layout != "linear"
        && layout != "striped"
    {
        errors.push(ValidationError::new(
            format!("metadata.annotations[{}]", annotations::LV_LAYOUT),
            format!("{layout:?} is not one of \"linear\", \"striped\""),
        ));
    }
    finish(errors)
}

/// Validate an AntstorSnapshot.
pub fn snapshot(s: &AntstorSnapshot) -> Result<(), ValidationErrors> {
    let mut errors = Vec::new();
    if s.spec.uuid.trim().is_empty() {
        errors.push(ValidationError::new("spec.uuid", "must not be empty"));
    }
    if s.spec.size < 0 {
        errors.push(ValidationError::new(
            "spec.size",
            format!("{} is negative", s.spec.size),
        ));
    }
    if s.spec.origin_vol_name.is_empty() {
        errors.push(ValidationError::new(
            "spec.originVolName",
            "must name the volume to snapshot",
        ));
    }
    if s.spec.origin_vol_namespace.is_empty() {
        errors.push(ValidationError::new(
            "spec.originVolNamespace",
            "must not be empty",
        ));
    }
    finish(errors)
}

/// Validate a StoragePool: exactly one engine section, named after its node.
pub fn pool(p: &StoragePool) -> Result<(), ValidationErrors> {
    let mut errors = Vec::new();
    let lvm = !p.spec.kernel_lvm.name.is_empty();
    let lvs = !p.spec.spdk_lv_store.name.is_empty();
    if lvm && lvs {
        errors.push(ValidationError::new(
            "spec",
            "kernelLvm.name and spdkLVStore.name are both set; a pool has one engine",
        ));
    }
    if let Some(name) = &p.metadata.name
        && !p.spec.node_info.id.is_empty()
        && &p.spec.node_info.id != name
    {
        errors.push(ValidationError::new(
            "spec.nodeInfo.id",
            format!(
                "{:?} differs from the pool name {name:?}; a pool is named after its node",
                p.spec.node_info.id
            ),
        ));
    }
    if lvs && p.spec.spdk_lv_store.cluster_size < 0 {
        errors.push(ValidationError::new(
            "spec.spdkLVStore.clusterSize",
            "is negative",
        ));
    }
    finish(errors)
}

/// Validate an AntstorVolumeGroup (LiteIO accepted groups that could never be scheduled).
pub fn volume_group(g: &AntstorVolumeGroup) -> Result<(), ValidationErrors> {
    let mut errors = Vec::new();
    let d = &g.spec.desired_volume_spec;
    if g.spec.total_size <= 0 {
        errors.push(ValidationError::new("spec.totalSize", "must be positive"));
    }
    if d.count_range.min < 0 || d.count_range.max < 0 {
        errors.push(ValidationError::new(
            "spec.desiredVolumeSpec.countRange",
            "bounds must not be negative",
        ));
    }
    if d.count_range.max > 0 && d.count_range.min > d.count_range.max {
        errors.push(ValidationError::new(
            "spec.desiredVolumeSpec.countRange",
            format!(
                "min {} is above max {}",
                d.count_range.min, d.count_range.max
            ),
        ));
    }
    let min = d
        .size_range
        .min
        .as_ref()
        .map(size::parse_quantity)
        .transpose();
    let max = d
        .size_range
        .max
        .as_ref()
        .map(size::parse_quantity)
        .transpose();
    match (min, max) {
        (Err(e), _) => errors.push(ValidationError::new(
            "spec.desiredVolumeSpec.sizeRange.min",
            e.to_string(),
        )),
        (_, Err(e)) => errors.push(ValidationError::new(
            "spec.desiredVolumeSpec.sizeRange.max",
            e.to_string(),
        )),
        (Ok(Some(lo)), Ok(Some(hi))) if lo > hi => errors.push(ValidationError::new(
            "spec.desiredVolumeSpec.sizeRange",
            format!(
                "min {} is above max {}",
                size::format_bytes(lo),
                size::format_bytes(hi)
            ),
        )),
        _ => {}
    }
    // LiteIO required desiredCount > 0 for a Symmetric group, which its CSI driver never
    // set (every Symmetric group failed): here 0 means "as few members as fit".
    if d.desired_count < 0 {
        errors.push(ValidationError::new(
            "spec.desiredVolumeSpec.desiredCount",
            "must not be negative (0: as few members as fit)",
        ));
    }
    if d.desired_count > 0 && d.size_symmetry != SymmetryValue::Symmetric {
        errors.push(ValidationError::new(
            "spec.desiredVolumeSpec.desiredCount",
            "is for Symmetric groups only; an Asymmetric group takes as many members as fit",
        ));
    }
    let (lo, hi) = (d.count_range.min.max(1), d.count_range.max);
    if d.desired_count > 0 && hi > 0 && !(lo..=hi).contains(&d.desired_count) {
        errors.push(ValidationError::new(
            "spec.desiredVolumeSpec.desiredCount",
            format!("{} is outside countRange {lo}..{hi}", d.desired_count),
        ));
    }
    if d.count_range.max > crate::group::MAX_MEMBERS {
        errors.push(ValidationError::new(
            "spec.desiredVolumeSpec.countRange.max",
            format!(
                "{} is above the most members a group may have ({})",
                d.count_range.max,
                crate::group::MAX_MEMBERS
            ),
        ));
    }
    if g.spec.uuid.trim().is_empty() {
        errors.push(ValidationError::new("spec.uuid", "is required"));
    }
    if let Some(k) = annotation(&g.metadata, crate::replica::ANNO_SPREAD_KEY)
        && !crate::replica::is_label_key(k.trim())
    {
        errors.push(ValidationError::new(
            format!("metadata.annotations[{}]", crate::replica::ANNO_SPREAD_KEY),
            format!("{k:?} is not a node label key"),
        ));
    }
    finish(errors)
}
