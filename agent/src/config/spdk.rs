//! `spdk`: the embedded SPDK runtime: cores, memory, hugepages, the NVMe devices it takes
//! over, the target's size; their defaults and the formats they must have.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::error::{ConfigError, absolute, in_range, invalid};

/// Default SPDK core mask.
pub const DEFAULT_CORE_MASK: &str = "0x1";
/// SPDK memory used in no-huge mode when `spdk.memSizeMiB` is not set.
pub const DEFAULT_NO_HUGE_MEM_MIB: u32 = 1024;
/// Smallest SPDK memory size accepted.
pub const MIN_MEM_MIB: u32 = 64;
/// Default of `spdk.reactorNice`.
pub const DEFAULT_REACTOR_NICE: i32 = -10;
/// Default of `spdk.maxSubsystems`.
pub const DEFAULT_MAX_SUBSYSTEMS: u32 = 4096;

/// `spdk`: the embedded SPDK runtime.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SpdkConfig {
    /// Reactor core mask, hexadecimal (`"0x3"`).
    #[serde(rename = "coreMask")]
    pub core_mask: String,
    /// Reactors sleep when idle instead of polling.
    #[serde(rename = "interruptMode")]
    pub interrupt_mode: bool,
    /// Run without hugepages (development).
    #[serde(rename = "noHuge")]
    pub no_huge: bool,
    /// SPDK memory in MiB; see [`SpdkConfig::mem_size_mib`].
    #[serde(rename = "memSizeMiB", skip_serializing_if = "Option::is_none")]
    pub mem_size_mib: Option<u32>,
    /// The hugetlbfs mount SPDK takes its 2 MiB hugepages from (DPDK's `--huge-dir`); absent =
    /// any hugetlbfs mount of the default page size. Not allowed with `noHuge`.
    #[serde(rename = "hugeDir", skip_serializing_if = "Option::is_none")]
    pub huge_dir: Option<PathBuf>,
    /// Optional SPDK-compatible JSON-RPC socket for debugging tools.
    #[serde(rename = "rpcSocket", skip_serializing_if = "Option::is_none")]
    pub rpc_socket: Option<PathBuf>,
    /// NVMe controllers to take over, as PCI addresses (`0000:00:04.0`).
    #[serde(rename = "nvmePciAddresses", skip_serializing_if = "Vec::is_empty")]
    pub nvme_pci_addresses: Vec<String>,
    /// Entries of SPDK's trace buffer for `spdk_trace` (0, the default, keeps none: it takes
    /// RAM in /dev/shm and is left behind when the agent is killed).
    #[serde(rename = "traceEntries", skip_serializing_if = "is_zero")]
    pub trace_entries: u64,
    /// Claim the reactor cores with SPDK's lock files so that a second SPDK process on the
    /// same cores fails to start (default true). Turn it off only to run several agents on
    /// one machine for development (`liteio-local --nodes N`).
    #[serde(rename = "lockCores")]
    pub lock_cores: bool,
    /// Most volumes this node can export: the NVMe-oF target's subsystem slots (default
    /// 4,096; SPDK's own default, 1,024, capped a node at 1,023 volumes).
    #[serde(rename = "maxSubsystems")]
    pub max_subsystems: u32,
    /// Nice value (-20..=19) of the reactor that runs the agent's requests, in interrupt mode
    /// (default -10; 0 leaves it). DPDK pins the reactor to its core, so without it a burst
    /// of provisioning left requests queued for seconds while the reactor waited for its
    /// core behind the agent's other threads.
    #[serde(rename = "reactorNice")]
    pub reactor_nice: i32,
}

impl Default for SpdkConfig {
    fn default() -> Self {
        Self {
            core_mask: DEFAULT_CORE_MASK.to_string(),
            interrupt_mode: false,
            no_huge: false,
            mem_size_mib: None,
            huge_dir: None,
            rpc_socket: None,
            nvme_pci_addresses: Vec::new(),
            trace_entries: 0,
            lock_cores: true,
            max_subsystems: DEFAULT_MAX_SUBSYSTEMS,
            reactor_nice: DEFAULT_REACTOR_NICE,
        }
    }
}

impl SpdkConfig {
    /// Memory to give SPDK: the configured size, else [`DEFAULT_NO_HUGE_MEM_MIB`] in no-huge
    /// mode, else `None` (SPDK's own default over the hugepages).
    pub fn mem_size_mib(&self) -> Option<u32> {
        self.mem_size_mib
            .or(self.no_huge.then_some(DEFAULT_NO_HUGE_MEM_MIB))
    }

    /// The core mask as a number (valid after [`Config::validate`](super::Config::validate)).
    pub fn core_mask_bits(&self) -> Option<u128> {
        parse_core_mask(&self.core_mask)
    }

    /// Formats and ranges; `raid_pool`: the pool is a raidBdev over this section's NVMe
    /// devices.
    pub(super) fn validate(&self, raid_pool: bool) -> Result<(), ConfigError> {
        match parse_core_mask(&self.core_mask) {
            Some(0) => return Err(invalid("spdk.coreMask", &self.core_mask, "selects no core")),
            Some(_) => {}
            None => {
                return Err(invalid(
                    "spdk.coreMask",
                    format!("{:?}", self.core_mask),
                    "is not a hexadecimal mask like \"0x1\"",
                ));
            }
        }
        if let Some(mib) = self.mem_size_mib {
            in_range(
                "spdk.memSizeMiB",
                mib,
                MIN_MEM_MIB..,
                format!("is below the minimum of {MIN_MEM_MIB}"),
            )?;
        }
        in_range(
            "spdk.reactorNice",
            self.reactor_nice,
            -20..=19,
            "must be between -20 and 19",
        )?;
        in_range(
            "spdk.maxSubsystems",
            self.max_subsystems,
            2..,
            "must be at least 2 (the discovery subsystem takes one)",
        )?;
        if let Some(dir) = &self.huge_dir {
            if self.no_huge {
                return Err(invalid(
                    "spdk.hugeDir",
                    dir.display(),
                    "is a hugetlbfs mount, which noHuge: true does not use",
                ));
            }
            absolute("spdk.hugeDir", dir, "path")?;
        }
        if let Some(sock) = &self.rpc_socket {
            absolute("spdk.rpcSocket", sock, "path")?;
        }
        for (i, addr) in self.nvme_pci_addresses.iter().enumerate() {
            if !is_pci_address(addr) {
                return Err(invalid(
                    &format!("spdk.nvmePciAddresses[{i}]"),
                    format!("{addr:?}"),
                    "is not a PCI address like \"0000:00:04.0\"",
                ));
            }
        }
        if raid_pool && self.nvme_pci_addresses.is_empty() {
            return Err(invalid(
                "spdk.nvmePciAddresses",
                "[]",
                "must list the NVMe devices of a raidBdev pool",
            ));
        }
        Ok(())
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn parse_core_mask(mask: &str) -> Option<u128> {
    let hex = mask
        .strip_prefix("0x")
        .or_else(|| mask.strip_prefix("0X"))?;
    if hex.is_empty() {
        return None;
    }
    u128::from_str_radix(hex, 16).ok()
}

/// `DDDD:BB:DD.F` in hexadecimal.
fn is_pci_address(addr: &str) -> bool {
    let parts: Vec<&str> = addr.split([':', '.']).collect();
    let lens = [4usize, 2, 2, 1];
    parts.len() == 4
        && parts
            .iter()
            .zip(lens)
            .all(|(p, l)| p.len() == l && p.chars().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_and_mask_formats() {
        assert!(is_pci_address("0000:00:04.0"));
        assert!(is_pci_address("0000:af:00.1"));
        assert!(!is_pci_address("00:04.0"));
        assert!(!is_pci_address("0000:00:04"));
        assert_eq!(parse_core_mask("0x3"), Some(3));
        assert_eq!(parse_core_mask("3"), None);
        assert_eq!(parse_core_mask("0x"), None);
    }
}
