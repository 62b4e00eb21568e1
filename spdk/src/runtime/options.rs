//! What the runtime is started with: [`SpdkOptions`], their defaults and checks, and the
//! start-up JSON config SPDK's own subsystems read from them.

use std::path::PathBuf;
use std::time::Duration;

use super::ffi::cstr;
use crate::dhchap::DhGroup;
use crate::error::{Result, SpdkError};

/// Options of the SPDK runtime.
#[derive(Debug, Clone)]
pub struct SpdkOptions {
    /// Process name shown in SPDK's logs and shared memory.
    pub name: String,
    /// Reactor core mask, as SPDK takes it (`0x1`, `[0,1]`).
    pub core_mask: String,
    /// Reactors sleep on file descriptors instead of busy-polling.
    pub interrupt_mode: bool,
    /// Use ordinary memory instead of hugepages (development and tests).
    pub no_huge: bool,
    /// Memory SPDK reserves, in MiB (required with `no_huge`; 0 = SPDK's default). With
    /// hugepages this much is taken from them at start (DPDK's `-m`), and start fails when
    /// they are not free.
    pub mem_size_mb: u32,
    /// The hugetlbfs mount to take hugepages from (DPDK's `--huge-dir`); `None` = any
    /// hugetlbfs mount of the default page size. Only with hugepages (`no_huge` false).
    pub huge_dir: Option<PathBuf>,
    /// Disable PCI probing (no NVMe devices configured).
    pub no_pci: bool,
    /// Serve SPDK's JSON-RPC on this unix socket for operators' tools; `None` = no socket.
    pub rpc_socket: Option<PathBuf>,
    /// Entries of SPDK's trace buffer (`spdk_trace`); 0 = no trace buffer. It lives in
    /// /dev/shm (megabytes of RAM) and outlives a killed process, so it is off by default.
    pub trace_entries: u64,
    /// Claim the reactor cores with SPDK's lock files (`/var/tmp/spdk_cpu_lock_*`), so that a
    /// second SPDK process on the same cores fails to start. Tests turn it off: several test
    /// binaries (or sessions) share the cores of one small machine.
    pub lock_cores: bool,
    /// How long a caller waits for the answer to one request before it fails with
    /// [`SpdkError::Timeout`] ([`DEFAULT_REQUEST_TIMEOUT`]). The one place this deadline is
    /// set, for every call of this crate and so every engine call of the agent.
    pub request_timeout: Duration,
    /// Most NVMe-oF subsystems the target holds, i.e. volumes one node can export; 0 =
    /// SPDK's default (1,024, one of them the discovery subsystem). Each slot costs a pointer
    /// in the target and a small record per poll group.
    pub max_subsystems: u32,
    /// DH groups the NVMe-oF target allows in DH-HMAC-CHAP; empty = SPDK's default (all, so
    /// a host that offers ffdhe8192 gets it: see [`DhGroup`] for what that costs).
    pub dhchap_dhgroups: Vec<DhGroup>,
    /// Nice value of the application thread's reactor in interrupt mode
    /// ([`DEFAULT_REACTOR_NICE`]); 0 leaves it as it is. DPDK pins the reactor to its core,
    /// so when the process's other threads keep that core busy the reactor waits in the run
    /// queue while requests queue up behind it (measured: 2.3 s runnable but waiting, 0.3 s
    /// on the CPU, in a burst of 200 volumes on 2 cores). An interrupt-mode reactor sleeps
    /// when idle, so its priority costs the rest nothing while SPDK has no work. Polling
    /// reactors take their core anyway and are left alone.
    pub reactor_nice: i32,
    /// SPDK examines every new bdev (SPDK's `bdev_auto_examine`, the default): an lvstore on
    /// it loads, and the raid module reads its raid superblock and assembles the raid it names
    /// (from whichever members appear first, also one that missed writes). Off, SPDK examines
    /// only the bdevs named with [`crate::bdev::examine`], and raids with a superblock are
    /// assembled only by [`crate::raid::assemble_from_superblock`]: a stale replica is never
    /// assembled behind the caller's back. Set at start.
    pub auto_examine: bool,
}

/// Default of [`SpdkOptions::reactor_nice`].
pub const DEFAULT_REACTOR_NICE: i32 = -10;

impl Default for SpdkOptions {
    fn default() -> Self {
        Self {
            name: "liteio-agent".into(),
            core_mask: "0x1".into(),
            interrupt_mode: true,
            no_huge: false,
            mem_size_mb: 0,
            huge_dir: None,
            no_pci: true,
            rpc_socket: None,
            trace_entries: 0,
            lock_cores: true,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_subsystems: 0,
            dhchap_dhgroups: Vec::new(),
            reactor_nice: DEFAULT_REACTOR_NICE,
            auto_examine: true,
        }
    }
}

impl SpdkOptions {
    /// Options for tests and small machines: no hugepages, interrupt mode, one core, no PCI,
    /// no core lock (test binaries share the cores).
    pub fn small() -> Self {
        Self {
            no_huge: true,
            mem_size_mb: 768,
            lock_cores: false,
            ..Self::default()
        }
    }

    /// Check the options before SPDK sees them.
    pub(super) fn validate(&self) -> Result<()> {
        let mask = self.core_mask.trim();
        let valid_hex = mask
            .strip_prefix("0x")
            .or_else(|| mask.strip_prefix("0X"))
            .is_some_and(|h| {
                !h.is_empty()
                    && h.chars().all(|c| c.is_ascii_hexdigit())
                    && h.chars().any(|c| c != '0')
            });
        let valid_list = mask.starts_with('[')
            && mask.ends_with(']')
            && mask[1..mask.len() - 1].split(',').all(|p| {
                let p = p.trim();
                !p.is_empty() && p.split('-').all(|n| n.trim().parse::<u32>().is_ok())
            });
        if !valid_hex && !valid_list {
            return Err(SpdkError::InvalidArgument {
                field: "core_mask",
                reason: format!(
                    "{:?} is neither a hex mask like 0x3 nor a core list like [0,1]",
                    self.core_mask
                ),
            });
        }
        if self.no_huge && self.mem_size_mb < 256 {
            return Err(SpdkError::InvalidArgument {
                field: "mem_size_mb",
                reason: format!(
                    "{} MiB is too small without hugepages; SPDK needs at least 256 (512 or more recommended)",
                    self.mem_size_mb
                ),
            });
        }
        if self.no_huge && self.huge_dir.is_some() {
            return Err(SpdkError::InvalidArgument {
                field: "huge_dir",
                reason: "is a hugetlbfs mount, which no-huge mode does not use".into(),
            });
        }
        if let Some(d) = &self.huge_dir {
            cstr("huge_dir", &d.to_string_lossy())?;
        }
        if self.request_timeout.is_zero() {
            return Err(SpdkError::InvalidArgument {
                field: "request_timeout",
                reason: "must be positive".into(),
            });
        }
        if self.name.is_empty() || self.name.contains('\0') {
            return Err(SpdkError::InvalidArgument {
                field: "name",
                reason: "must be a non-empty string without NUL".into(),
            });
        }
        Ok(())
    }
}

/// How long a caller waits for SPDK's answer by default: [`SpdkOptions::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// SPDK's start-up JSON config for what `opts` sets beyond the app options (the NVMe-oF
/// target's `max_subsystems` and DH groups, the bdev layer's auto-examine).
pub(super) fn startup_config(opts: &SpdkOptions) -> Vec<u8> {
    let mut nvmf = Vec::new();
    if opts.max_subsystems > 0 {
        nvmf.push(format!(
            r#"{{"method":"nvmf_set_max_subsystems","params":{{"max_subsystems":{}}}}}"#,
            opts.max_subsystems
        ));
    }
    if !opts.dhchap_dhgroups.is_empty() {
        let groups: Vec<String> = opts
            .dhchap_dhgroups
            .iter()
            .map(|g| format!("\"{}\"", g.name()))
            .collect();
        nvmf.push(format!(
            r#"{{"method":"nvmf_set_config","params":{{"dhchap_dhgroups":[{}]}}}}"#,
            groups.join(",")
        ));
    }
    // Always said: SPDK keeps its bdev options across a restart in the same process, so a
    // start after one with auto-examine off would otherwise keep it off.
    let mut subsystems = vec![format!(
        r#"{{"subsystem":"bdev","config":[{{"method":"bdev_set_options","params":{{"bdev_auto_examine":{}}}}}]}}"#,
        opts.auto_examine
    )];
    if !nvmf.is_empty() {
        subsystems.push(format!(
            r#"{{"subsystem":"nvmf","config":[{}]}}"#,
            nvmf.join(",")
        ));
    }
    format!(r#"{{"subsystems":[{}]}}"#, subsystems.join(",")).into_bytes()
}
