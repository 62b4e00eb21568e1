//! The record of a staged multi-disk volume ([`RECORD_FILE`] in its staging directory):
//! what was connected and assembled, written before anything is connected, so that
//! NodeUnstageVolume knows what to tear down even when the data control is gone. It holds
//! no secret.

use std::path::{Path, PathBuf};

use liteio_api::{PoolMode, SpdkTarget};
use serde::{Deserialize, Serialize};

use crate::error::{CsiError, Result};
use crate::lvm::{self, Names};

use crate::node::host::Attach;

/// The record of a staged multi-disk volume, in its staging directory.
pub const RECORD_FILE: &str = ".liteio-multi-disk.json";

/// One member (or, for SpdkLVStore, the assembled export) as staged.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct StagedMember {
    /// The member AntstorVolume (the data control for SpdkLVStore).
    pub volume: String,
    /// Its NVMe-oF export, when connected over NVMe/TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvme: Option<SpdkTarget>,
    /// Its local device or file, when it is on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<PathBuf>,
}

impl StagedMember {
    pub(super) fn of(volume: &str, plan: &Attach) -> Self {
        match plan {
            Attach::Nvme(t) => StagedMember {
                volume: volume.to_string(),
                nvme: Some(t.clone()),
                local: None,
            },
            Attach::Local(p) => StagedMember {
                volume: volume.to_string(),
                nvme: None,
                local: Some(p.clone()),
            },
        }
    }

    /// How it was attached.
    pub fn plan(&self) -> Option<Attach> {
        match (&self.nvme, &self.local) {
            (Some(t), _) => Some(Attach::Nvme(t.clone())),
            (None, Some(p)) => Some(Attach::Local(p.clone())),
            (None, None) => None,
        }
    }
}

/// What NodeStageVolume of a multi-disk volume connected and assembled. Holds no secret.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    /// Volume id (`dc-<uuid>`).
    pub id: String,
    /// The data control.
    pub data_control: String,
    /// Where the members are put together.
    pub engine: PoolMode,
    /// KernelLVM: the volume group.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vg: String,
    /// KernelLVM: the logical volume.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub lv: String,
    /// What was connected, in member order.
    pub members: Vec<StagedMember>,
}

impl Staged {
    /// The LVM names, for KernelLVM.
    pub fn names(&self) -> Option<Names> {
        (self.engine == PoolMode::KernelLVM && !self.vg.is_empty()).then(|| Names {
            vg: self.vg.clone(),
            lv: self.lv.clone(),
            tag: format!("{}{}", lvm::TAG_PREFIX, self.id),
        })
    }

    fn path(staging: &Path) -> PathBuf {
        staging.join(RECORD_FILE)
    }

    /// The record in `staging`, `None` when there is none. Only meaningful while nothing is
    /// mounted at `staging` (a mount hides it).
    pub fn read(staging: &Path) -> Result<Option<Self>> {
        let p = Self::path(staging);
        match std::fs::read_to_string(&p) {
            Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| {
                CsiError::Internal(format!(
                    "{}: not a record of a staged multi-disk volume: {e}",
                    p.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(CsiError::io(format!("read {}", p.display()), e)),
        }
    }

    /// Writes the record into `staging` (created), atomically.
    pub fn write(&self, staging: &Path) -> Result<()> {
        std::fs::create_dir_all(staging).map_err(|e| {
            CsiError::io(
                format!("create staging_target_path {}", staging.display()),
                e,
            )
        })?;
        let p = Self::path(staging);
        let tmp = staging.join(format!("{RECORD_FILE}.tmp"));
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| CsiError::Internal(format!("serialize the stage record: {e}")))?;
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &p))
            .map_err(|e| CsiError::io(format!("write {}", p.display()), e))
    }

    /// Removes the record from `staging` (kubelet removes the directory after
    /// NodeUnstageVolume, which fails while a file is left in it). Idempotent.
    pub fn remove(staging: &Path) -> Result<()> {
        let p = Self::path(staging);
        match std::fs::remove_file(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(CsiError::io(format!("remove {}", p.display()), e)),
        }
    }
}
