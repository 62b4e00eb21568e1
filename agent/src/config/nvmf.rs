//! `nvmf`: the NVMe/TCP listener of this node's exports: address, the ports handed out, how
//! hosts authenticate, and where the agent keeps its record of the exports.

use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::error::{ConfigError, absolute, in_range, invalid};

/// First NVMe/TCP port LiteIO hands out.
pub const DEFAULT_PORT_START: u16 = 4510;
/// Last NVMe/TCP port LiteIO hands out.
pub const DEFAULT_PORT_END: u16 = 4610;

/// `nvmf`: the NVMe/TCP listener.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct NvmfConfig {
    /// Address to listen on; default the node IP.
    #[serde(rename = "listenAddress", skip_serializing_if = "Option::is_none")]
    pub listen_address: Option<IpAddr>,
    /// Ports handed out to subsystems.
    #[serde(rename = "portRange")]
    pub port_range: PortRange,
    /// How hosts prove who they are when they connect to an export.
    pub auth: NvmfAuth,
    /// Diffie-Hellman groups DH-HMAC-CHAP may use, from [`DHCHAP_DHGROUPS`]; the target picks
    /// the strongest one the host also offers. Each new queue pair computes one exchange on
    /// the target's reactor, which serves nothing else meanwhile, so the default leaves out
    /// the large groups (see docs/auth.md for the measured cost of each).
    #[serde(rename = "dhchapDhgroups")]
    pub dhchap_dhgroups: Vec<String>,
    /// Where the agent keeps its own record of the exports it serves (one file per volume,
    /// readable by root alone: it holds the volume's keys). A restarted agent serves them
    /// again from it as soon as its pool is ready, before it reaches the API server, then
    /// reconciles them with the volumes (see docs/failures.md). Absent: exports come back
    /// only through the volume reconcilers, once the API server answers.
    #[serde(rename = "exportRecordDir", skip_serializing_if = "Option::is_none")]
    pub export_record_dir: Option<PathBuf>,
}

impl Default for NvmfConfig {
    fn default() -> Self {
        Self {
            listen_address: None,
            port_range: PortRange::default(),
            auth: NvmfAuth::default(),
            dhchap_dhgroups: DEFAULT_DHCHAP_DHGROUPS.map(String::from).to_vec(),
            export_record_dir: None,
        }
    }
}

/// The DH groups `nvmf.dhchapDhgroups` may name, weakest first (`null`: no DH exchange, the
/// challenge and response rest on the 256-bit keys alone).
pub const DHCHAP_DHGROUPS: [&str; 6] = [
    "null",
    "ffdhe2048",
    "ffdhe3072",
    "ffdhe4096",
    "ffdhe6144",
    "ffdhe8192",
];

/// Default of `nvmf.dhchapDhgroups`: the groups a new queue pair can afford on the reactor.
pub const DEFAULT_DHCHAP_DHGROUPS: [&str; 2] = ["null", "ffdhe2048"];

/// `nvmf.auth`: how hosts authenticate to this node's exports.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum NvmfAuth {
    /// DH-HMAC-CHAP, bidirectional, with keys generated per volume and kept in the volume's
    /// Secret (the default). TLS too for volumes that ask for it.
    #[default]
    Dhchap,
    /// The host NQN alone admits a host (anyone who knows it can connect).
    None,
}

/// An inclusive TCP port range.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PortRange {
    /// First port.
    pub start: u32,
    /// Last port (inclusive).
    pub end: u32,
}

impl Default for PortRange {
    fn default() -> Self {
        Self {
            start: u32::from(DEFAULT_PORT_START),
            end: u32::from(DEFAULT_PORT_END),
        }
    }
}

impl PortRange {
    /// The ports, once validated.
    pub fn ports(&self) -> std::ops::RangeInclusive<u32> {
        self.start..=self.end
    }
}

impl NvmfConfig {
    /// Ports, DH groups, paths.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let pr = self.port_range;
        for (field, port) in [
            ("nvmf.portRange.start", pr.start),
            ("nvmf.portRange.end", pr.end),
        ] {
            in_range(field, port, 1..=65535, "is outside 1..=65535")?;
        }
        if pr.start > pr.end {
            return Err(invalid(
                "nvmf.portRange",
                format!("{}-{}", pr.start, pr.end),
                "is empty: start must be <= end",
            ));
        }
        let groups = &self.dhchap_dhgroups;
        if groups.is_empty() {
            return Err(invalid(
                "nvmf.dhchapDhgroups",
                "[]",
                format!("needs at least one of {}", DHCHAP_DHGROUPS.join(", ")),
            ));
        }
        for (i, g) in groups.iter().enumerate() {
            if !DHCHAP_DHGROUPS.contains(&g.as_str()) {
                return Err(invalid(
                    &format!("nvmf.dhchapDhgroups[{i}]"),
                    g,
                    format!("is not one of {}", DHCHAP_DHGROUPS.join(", ")),
                ));
            }
        }
        if let Some(dir) = &self.export_record_dir {
            absolute("nvmf.exportRecordDir", dir, "path")?;
        }
        Ok(())
    }
}
