//! `storage`: what the pool is: its engine ([`PoolingMode`]) and name, and what it is built
//! from (LVM physical volumes, an SPDK base bdev, a directory of files); the rules each mode
//! has for them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::error::{ConfigError, absolute, invalid, missing};
use super::value::{de_size, string_enum};

/// Default VG name when LiteIO runs without a config file.
pub const DEFAULT_LVM_NAME: &str = "antstore-vg";
/// Default lvstore name.
pub const DEFAULT_LVS_NAME: &str = "antstor_lvstore";
/// Default raid0 bdev name of the NVMe takeover.
pub const DEFAULT_RAID0_NAME: &str = "antstor_raid0";
string_enum! {
    /// Which engine builds the pool.
    PoolingMode {
        /// Kernel LVM volume group.
        KernelLvm = "KernelLVM",
        /// SPDK logical volume store (needs the `spdk` feature).
        SpdkLvStore = "SpdkLVStore",
        /// A directory of sparse files (development and CI).
        File = "File",
    }
}

string_enum! {
    /// Kind of SPDK base bdev under the lvstore.
    BdevType {
        /// Linux AIO over a file or block device.
        Aio = "aioBdev",
        /// RAM (tests).
        Mem = "memBdev",
        /// NVMe devices over VFIO (raid0 when several).
        Raid = "raidBdev",
    }
}

/// `storage`: pool mode and what it is built from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// Pool name and engine.
    pub pooling: Pooling,
    /// LVM physical volumes (KernelLVM only; empty = the VG must exist).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pvs: Vec<LvmPv>,
    /// SPDK base bdev (SpdkLVStore only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bdev: Option<SpdkBdev>,
    /// Pool directory (File only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<FilePool>,
}

/// `storage.pooling`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Pooling {
    /// VG name, lvstore name, or a label for the file pool.
    pub name: String,
    /// Engine.
    pub mode: PoolingMode,
}

/// `storage.pvs[i]`: one LVM physical volume.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct LvmPv {
    /// Block device; empty = a loop device over `filePath`.
    #[serde(rename = "devicePath", default)]
    pub device_path: String,
    /// Size of the backing file in bytes.
    #[serde(default, deserialize_with = "de_size")]
    pub size: u64,
    /// Backing file of a loop device.
    #[serde(rename = "filePath", default)]
    pub file_path: String,
    /// Create the backing file when missing (LiteIO always does; kept for compatibility).
    #[serde(rename = "createIfNotExist", default)]
    pub create_if_not_exist: bool,
}

/// `storage.bdev`: the lvstore's base bdev.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SpdkBdev {
    /// Kind of bdev.
    #[serde(rename = "type")]
    pub kind: BdevType,
    /// Bdev name.
    pub name: String,
    /// Size in bytes (memBdev; aioBdev when the file is created).
    #[serde(default, deserialize_with = "de_size")]
    pub size: u64,
    /// Backing file or device of an aioBdev.
    #[serde(rename = "filePath", default)]
    pub file_path: String,
    /// Create the aio file when missing.
    #[serde(rename = "createIfNotExist", default)]
    pub create_if_not_exist: bool,
    /// Declared by LiteIO and unused there; use `spdk.nvmePciAddresses`.
    #[serde(
        rename = "vfioPCIeKeyword",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub vfio_pcie_keyword: String,
}

/// `storage.file`: the file engine's directory.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FilePool {
    /// Absolute directory holding the pool.
    pub path: PathBuf,
    /// Capacity cap in bytes; 0 = the size of the filesystem.
    #[serde(default, deserialize_with = "de_size")]
    pub size: u64,
}

/// LVM's rule for VG names: `[A-Za-z0-9+_.-]`, not starting with `-`, not `.` or `..`.
fn is_lvm_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 127
        && !name.starts_with('-')
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+_.-".contains(c))
}

impl StorageConfig {
    /// Required fields per mode, names and paths.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let name = &self.pooling.name;
        if name.trim().is_empty() {
            return Err(missing(
                "storage.pooling.name",
                "(VG, lvstore or pool name)",
            ));
        }
        match self.pooling.mode {
            PoolingMode::KernelLvm => {
                if !is_lvm_name(name) {
                    return Err(invalid(
                        "storage.pooling.name",
                        format!("{name:?}"),
                        "is not a valid VG name (letters, digits, +_.-, not starting with -)",
                    ));
                }
                for (i, pv) in self.pvs.iter().enumerate() {
                    if pv.device_path.is_empty() && pv.file_path.is_empty() {
                        return Err(missing(
                            &format!("storage.pvs[{i}].filePath"),
                            "when devicePath is empty",
                        ));
                    }
                    if !pv.file_path.is_empty() && pv.size == 0 {
                        return Err(missing(
                            &format!("storage.pvs[{i}].size"),
                            "(bytes, > 0) when filePath is set",
                        ));
                    }
                }
            }
            PoolingMode::SpdkLvStore => {
                let Some(bdev) = &self.bdev else {
                    return Err(missing("storage.bdev", "in SpdkLVStore mode"));
                };
                if bdev.name.trim().is_empty() {
                    return Err(missing("storage.bdev.name", "in SpdkLVStore mode"));
                }
                match bdev.kind {
                    BdevType::Aio if bdev.file_path.is_empty() => {
                        return Err(missing("storage.bdev.filePath", "for type \"aioBdev\""));
                    }
                    BdevType::Mem if bdev.size == 0 || bdev.size % 512 != 0 => {
                        return Err(invalid(
                            "storage.bdev.size",
                            bdev.size,
                            "must be a positive multiple of 512 for type \"memBdev\"",
                        ));
                    }
                    _ => {}
                }
            }
            PoolingMode::File => {
                let Some(file) = &self.file else {
                    return Err(missing("storage.file.path", "in File mode"));
                };
                absolute("storage.file.path", &file.path, "directory path")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lvm_names() {
        assert!(is_lvm_name("test-vg"));
        assert!(!is_lvm_name("-vg"));
        assert!(!is_lvm_name("a b"));
        assert!(!is_lvm_name(".."));
    }
}
