//! VolumeMigration: moves a volume's data to another node.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{SpdkTarget, is_zero};

/// One end of a migration.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct VolumeInfo {
    /// Volume namespace.
    #[serde(default)]
    pub namespace: String,
    /// Volume name.
    #[serde(default)]
    pub name: String,
    /// Node holding the data.
    #[serde(default, rename = "targetNodeId")]
    pub target_node_id: String,
    /// Node consuming it.
    #[serde(default, rename = "hostNodeId")]
    pub host_node_id: String,
    /// Its export.
    #[serde(default)]
    pub spdk: SpdkTarget,
}

/// Connection state.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ConnectStatus {
    /// Not known yet.
    #[default]
    Unknown,
    /// Connected.
    Connected,
    /// Disconnected.
    Disconnected,
}

/// Outcome of a step.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ResultStatus {
    /// Not known yet.
    #[default]
    Unknown,
    /// Succeeded.
    Success,
    /// Failed.
    Error,
}

/// The data pipe from the source agent to the destination.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct MigrationPipe {
    /// bdev of the destination on the source node.
    #[serde(
        default,
        rename = "destBdevName",
        skip_serializing_if = "String::is_empty"
    )]
    pub dest_bdev_name: String,
    /// Pipe state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ConnectStatus>,
}

/// Switch of the host to the destination.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct AutoSwitch {
    /// Switch enabled.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub enabled: bool,
    /// Switch outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ResultStatus>,
}

/// Progress of the copy job.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct JobProgress {
    /// Source bdev.
    #[serde(default, rename = "srcBdev", skip_serializing_if = "String::is_empty")]
    pub src_bdev: String,
    /// Destination bdev.
    #[serde(default, rename = "dstBdev", skip_serializing_if = "String::is_empty")]
    pub dst_bdev: String,
    /// Job state.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status: String,
    /// Pages written.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub total_write_pages: i64,
    /// Pages read.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub total_read_pages: i64,
    /// Copy rounds passed.
    #[serde(default, rename = "roundPassed", skip_serializing_if = "is_zero")]
    pub round_passed: i64,
    /// Job time in milliseconds.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ms_elapsed: i64,
    /// Whether this is the last round.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub is_last_round: String,
}

/// Everything about a running migration.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct MigrationInfo {
    /// The data pipe.
    #[serde(default, rename = "migrationPipe")]
    pub migration_pipe: MigrationPipe,
    /// The host's connection to the destination.
    #[serde(
        default,
        rename = "hostConnectStatus",
        skip_serializing_if = "Option::is_none"
    )]
    pub host_connect_status: Option<ConnectStatus>,
    /// Start time (Unix seconds).
    #[serde(default, rename = "startTs", skip_serializing_if = "is_zero")]
    pub start_ts: i64,
    /// The switch of the host.
    #[serde(default, rename = "autoSwitch")]
    pub auto_switch: AutoSwitch,
    /// The copy job.
    #[serde(default, rename = "jobProgress")]
    pub job_progress: JobProgress,
}

/// Desired state of a migration.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "volume.antstor.alipay.com",
    version = "v1",
    kind = "VolumeMigration",
    namespaced,
    status = "VolumeMigrationStatus",
    shortname = "volmig",
    category = "liteio",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"source","type":"string","jsonPath":".spec.sourceVolume.name"}"#,
    printcolumn = r#"{"name":"target","type":"string","jsonPath":".spec.destVolume.name"}"#,
    printcolumn = r#"{"name":"phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"status","type":"string","jsonPath":".status.status"}"#,
    printcolumn = r#"{"name":"age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct VolumeMigrationSpec {
    /// Where the data is.
    #[serde(default, rename = "sourceVolume")]
    pub source_volume: VolumeInfo,
    /// Where the data goes.
    #[serde(default, rename = "destVolume")]
    pub dest_volume: VolumeInfo,
    /// Progress.
    #[serde(default, rename = "migrationInfo")]
    pub migration_info: MigrationInfo,
}

/// Phase of a migration.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum MigrationPhase {
    /// Not started.
    #[default]
    Pending,
    /// Creating the destination volume.
    CreatingVolume,
    /// Connecting the pipe.
    SetupPipe,
    /// Copying.
    Syncing,
    /// Removing the source.
    Cleaning,
    /// Done.
    Finished,
}

/// Observed state of a migration.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct VolumeMigrationStatus {
    /// Phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<MigrationPhase>,
    /// `Working`, `Error` or `Finished`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status: String,
    /// Detail.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// `status.status` while a migration makes progress.
pub const STATUS_WORKING: &str = "Working";
/// `status.status` when a step failed; the phase shows which one, `status.message` why.
pub const STATUS_ERROR: &str = "Error";
/// `status.status` once the migration is done.
pub const STATUS_FINISHED: &str = "Finished";
/// Prefix of the destination volume's name: `mig-<migration uid>` (LiteIO: `mig-<uuid>`).
pub const DEST_VOLUME_PREFIX: &str = "mig-";

impl MigrationPhase {
    /// Every phase, in flow order.
    pub const ALL: [Self; 6] = [
        Self::Pending,
        Self::CreatingVolume,
        Self::SetupPipe,
        Self::Syncing,
        Self::Cleaning,
        Self::Finished,
    ];

    /// LiteIO's name of the phase (also a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::CreatingVolume => "CreatingVolume",
            Self::SetupPipe => "SetupPipe",
            Self::Syncing => "Syncing",
            Self::Cleaning => "Cleaning",
            Self::Finished => "Finished",
        }
    }
}

impl VolumeMigration {
    /// The phase (`Pending` when none was written yet).
    pub fn phase(&self) -> MigrationPhase {
        self.status
            .as_ref()
            .and_then(|s| s.phase)
            .unwrap_or_default()
    }

    /// `status.status` (empty when none was written yet).
    pub fn status_name(&self) -> &str {
        self.status.as_ref().map_or("", |s| s.status.as_str())
    }

    /// Namespace of the source volume: `spec.sourceVolume.namespace`, else the migration's.
    pub fn source_namespace(&self) -> String {
        let ns = &self.spec.source_volume.namespace;
        if ns.is_empty() {
            self.metadata.namespace.clone().unwrap_or_default()
        } else {
            ns.clone()
        }
    }

    /// Name of the destination volume this migration creates: `mig-<metadata.uid>`, so that
    /// a retried step finds the volume it created before instead of making a second one.
    pub fn dest_volume_name(&self) -> Option<String> {
        let uid = self.metadata.uid.as_deref().filter(|u| !u.is_empty())?;
        Some(format!("{DEST_VOLUME_PREFIX}{uid}"))
    }

    /// Bytes copied so far according to the source agent (`jobProgress.total_write_pages`
    /// pages of 4 KiB).
    pub fn bytes_copied(&self) -> u64 {
        let pages = self.spec.migration_info.job_progress.total_write_pages;
        u64::try_from(pages).unwrap_or(0).saturating_mul(PAGE_BYTES)
    }
}

/// Size of one page of `jobProgress.total_write_pages` / `total_read_pages`.
pub const PAGE_BYTES: u64 = 4096;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn phases_keep_liteios_names() {
        for p in MigrationPhase::ALL {
            assert_eq!(
                serde_json::to_value(p).unwrap(),
                serde_json::json!(p.as_str())
            );
        }
    }

    #[test]
    fn dest_name_follows_the_uid() {
        let mut m = VolumeMigration::new("m1", VolumeMigrationSpec::default());
        assert_eq!(m.dest_volume_name(), None);
        m.metadata.uid = Some("0b9d1f3c-6a2e".into());
        assert_eq!(m.dest_volume_name().as_deref(), Some("mig-0b9d1f3c-6a2e"));
        assert_eq!(m.phase(), MigrationPhase::Pending);
        m.metadata.namespace = Some("obnvmf".into());
        assert_eq!(m.source_namespace(), "obnvmf");
    }
}
