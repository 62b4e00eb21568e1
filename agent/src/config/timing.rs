//! How long the agent waits: the Lease heartbeat (`heartbeat`), the bound of every wait on
//! something outside the agent (`timeouts`), and the grace of orphans before they may be
//! collected (`recovery`); their defaults, and that none is zero.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::{ConfigError, invalid, positive};
use super::value::{duration, format_duration};

/// Default Lease renewal period.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(20);
/// Default Lease duration.
pub const DEFAULT_HEARTBEAT_DURATION: Duration = Duration::from_secs(40);

/// `heartbeat`: Lease timings.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct HeartbeatConfig {
    /// Renewal period.
    #[serde(with = "duration")]
    pub interval: Duration,
    /// `leaseDurationSeconds`; must exceed the interval.
    #[serde(with = "duration")]
    pub duration: Duration,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        Self {
            interval: DEFAULT_HEARTBEAT_INTERVAL,
            duration: DEFAULT_HEARTBEAT_DURATION,
        }
    }
}

/// Default limit of one Kubernetes API request.
pub const DEFAULT_API_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Default limit of one request to the embedded SPDK (`timeouts.spdkRequest`).
pub const DEFAULT_SPDK_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Default limit of one external command (`lvcreate`, `losetup`, `mkfs`, ...).
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(300);
/// Default of `timeouts.nvmeIo`.
pub const DEFAULT_NVME_IO_TIMEOUT: Duration = Duration::from_secs(3);
/// Default of `timeouts.nvmeAdmin`.
pub const DEFAULT_NVME_ADMIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Default of `timeouts.nvmeTransport`.
pub const DEFAULT_NVME_TRANSPORT_TIMEOUT: Duration = Duration::from_secs(2);

/// `timeouts`: every wait of the agent on something outside itself is bounded, and these are
/// the bounds. A call that runs out fails its operation with an error naming what timed out;
/// the volume is retried with back-off and the other volumes go on. (The Lease renewal has
/// its own bound, derived from `heartbeat.interval`.)
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct TimeoutsConfig {
    /// One request to the Kubernetes API server (default 10s).
    #[serde(rename = "apiRequest", with = "duration")]
    pub api_request: Duration,
    /// One request to the embedded SPDK, from sending it to its completion (default 30s).
    /// Past it the request is reported stuck: metric `liteio_spdk_stuck_requests`, an error
    /// log naming the caller and the pool's `Spdk` condition, until its late answer comes.
    #[serde(rename = "spdkRequest", with = "duration")]
    pub spdk_request: Duration,
    /// One external command; it is killed when it runs longer (default 5m).
    #[serde(with = "duration")]
    pub command: Duration,
    /// One I/O command this node's NVMe-oF initiator sent (to a remote replica or member of
    /// an assembly, or to a migration's destination) without an answer: its controller is
    /// reset, and the I/O fails once reconnecting has failed for the member's fast-fail
    /// time (2 s), so that a raid1 goes on degraded instead of waiting for TCP to give up
    /// on a node that vanished without closing its connections (default 3s). SPDK applies
    /// it to every NVMe controller of the node.
    #[serde(rename = "nvmeIo", with = "duration")]
    pub nvme_io: Duration,
    /// The same for the initiator's admin commands, keep-alives included; also how long
    /// SPDK's synchronous admin commands may hold the reactor (every volume of the node)
    /// after an I/O deadline passed (default 2s; SPDK's own is 30s).
    #[serde(rename = "nvmeAdmin", with = "duration")]
    pub nvme_admin: Duration,
    /// The TCP connections of this node's NVMe-oF initiator: data unacknowledged this long
    /// closes the connection (`TCP_USER_TIMEOUT`, rounded up to a power of two
    /// milliseconds), and a reconnect that has not connected this long fails (default 2s).
    /// Without it a peer behind a cut link holds the controller's reset in a connect that
    /// the kernel retries for tens of seconds, and a raid1's writes wait with it.
    #[serde(rename = "nvmeTransport", with = "duration")]
    pub nvme_transport: Duration,
}

impl Default for TimeoutsConfig {
    fn default() -> Self {
        Self {
            api_request: DEFAULT_API_REQUEST_TIMEOUT,
            spdk_request: DEFAULT_SPDK_REQUEST_TIMEOUT,
            command: DEFAULT_COMMAND_TIMEOUT,
            nvme_io: DEFAULT_NVME_IO_TIMEOUT,
            nvme_admin: DEFAULT_NVME_ADMIN_TIMEOUT,
            nvme_transport: DEFAULT_NVME_TRANSPORT_TIMEOUT,
        }
    }
}

/// Default grace period before an orphan may be collected.
pub const DEFAULT_ORPHAN_GRACE: Duration = Duration::from_secs(3600);

/// `recovery`: engine objects (volumes, snapshots) that no AntstorVolume / AntstorSnapshot
/// owns are always reported; they are deleted only when `collectOrphans` is true and they
/// stayed orphaned for `orphanGracePeriod`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct RecoveryConfig {
    /// Delete orphans after the grace period (default false: never delete data).
    #[serde(rename = "collectOrphans")]
    pub collect_orphans: bool,
    /// How long an object must stay orphaned before it is collected.
    #[serde(rename = "orphanGracePeriod", with = "duration")]
    pub orphan_grace_period: Duration,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        Self {
            collect_orphans: false,
            orphan_grace_period: DEFAULT_ORPHAN_GRACE,
        }
    }
}

impl HeartbeatConfig {
    /// Positive, and the Lease outlives a renewal period.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        positive("heartbeat.interval", self.interval)?;
        if self.duration <= self.interval {
            return Err(invalid(
                "heartbeat.duration",
                format_duration(self.duration),
                format!(
                    "must exceed heartbeat.interval ({})",
                    format_duration(self.interval)
                ),
            ));
        }
        Ok(())
    }
}

impl TimeoutsConfig {
    /// Positive, and within what SPDK can set.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (field, value) in [
            ("timeouts.apiRequest", self.api_request),
            ("timeouts.spdkRequest", self.spdk_request),
            ("timeouts.command", self.command),
            ("timeouts.nvmeIo", self.nvme_io),
            ("timeouts.nvmeAdmin", self.nvme_admin),
            ("timeouts.nvmeTransport", self.nvme_transport),
        ] {
            positive(field, value)?;
        }
        let t = self.nvme_transport;
        if t < Duration::from_millis(2) || t > Duration::from_millis(1 << 31) {
            return Err(invalid(
                "timeouts.nvmeTransport",
                format_duration(t),
                "must be from 2ms to 2^31 ms (SPDK's TCP acknowledgement timeout is 2^n ms)",
            ));
        }
        Ok(())
    }
}
