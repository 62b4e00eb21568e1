//! What an export is: the TCP transport's tunables, one volume's [`SubsystemSpec`] and what
//! SPDK reports of a subsystem ([`SubsystemInfo`]), how its hosts authenticate
//! ([`HostKeys`], and their C names for the shim) and the ANA state of a path. Values
//! only, besides the one shim call that allows a host with its keys.

use super::super::error::{Result, SpdkError};
use spdk_sys::spdk_nvmf_subsystem;

/// Tunables of the TCP transport; `None` keeps SPDK's default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TcpTransportOptions {
    /// Queue depth per queue pair.
    pub max_queue_depth: Option<u32>,
    /// Queue pairs per controller (admin included).
    pub max_qpairs_per_ctrlr: Option<u32>,
    /// In-capsule data size in bytes.
    pub in_capsule_data_size: Option<u32>,
    /// Largest I/O in bytes.
    pub max_io_size: Option<u32>,
    /// I/O unit size in bytes.
    pub io_unit_size: Option<u32>,
    /// Shared data buffers.
    pub num_shared_buffers: Option<u32>,
    /// Buffers cached per poll group.
    pub buf_cache_size: Option<u32>,
}

/// How the hosts of one export authenticate: names of keys in the keyring
/// ([`crate::keyring`]), the same for every allowed host of the subsystem.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostKeys {
    /// DH-HMAC-CHAP key a host must prove it holds; `None`: the NQN alone admits a host.
    pub dhchap_key: Option<String>,
    /// DH-HMAC-CHAP controller key: the target proves itself to the host too
    /// (bidirectional). Needs `dhchap_key`.
    pub dhchap_ctrlr_key: Option<String>,
    /// TLS pre-shared key, for a secure-channel listener. Set when a host is added; a host
    /// already allowed keeps its PSK.
    pub psk: Option<String>,
}

impl HostKeys {
    /// The key names checked (valid names; a controller key only with a host key) and
    /// turned into C strings for SPDK: host key, controller key, PSK.
    pub(crate) fn c_names(&self) -> Result<[Option<std::ffi::CString>; 3]> {
        if self.dhchap_ctrlr_key.is_some() && self.dhchap_key.is_none() {
            return Err(SpdkError::InvalidArgument {
                field: "dhchap_ctrlr_key",
                reason: "a controller key needs a host key (dhchap_key)".into(),
            });
        }
        let c = |field, name: &Option<String>| {
            name.as_deref()
                .map(|n| crate::keyring::check_name(field, n))
                .transpose()
        };
        Ok([
            c("dhchap_key", &self.dhchap_key)?,
            c("dhchap_ctrlr_key", &self.dhchap_ctrlr_key)?,
            c("psk", &self.psk)?,
        ])
    }
}

/// A C string's pointer for SPDK, NULL for none.
pub(crate) fn ptr_or_null(c: &Option<std::ffi::CString>) -> *const std::ffi::c_char {
    c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())
}

/// Key names as C strings, for the shim: host key, controller key, PSK.
pub(super) struct KeyNames(pub(super) [Option<std::ffi::CString>; 3]);

impl KeyNames {
    pub(super) fn new(k: &HostKeys) -> Result<Self> {
        k.c_names().map(Self)
    }

    /// The same without the DH-HMAC-CHAP keys (the PSK stays).
    pub(super) fn without_dhchap(&self) -> Self {
        let [_, _, p] = &self.0;
        Self([None, None, p.clone()])
    }

    /// Allow `host` on `ss` with these keys.
    ///
    /// # Safety
    /// On the reactor, `ss` a live subsystem.
    pub(super) unsafe fn add_host(
        &self,
        ss: *mut spdk_nvmf_subsystem,
        host: &std::ffi::CStr,
    ) -> i32 {
        let [k, c, p] = &self.0;
        // SAFETY: the caller's contract; every string is valid or NULL, copied by SPDK.
        unsafe {
            spdk_sys::liteio_nvmf_add_host(
                ss,
                host.as_ptr(),
                ptr_or_null(k),
                ptr_or_null(c),
                ptr_or_null(p),
            )
        }
    }
}

/// Asymmetric Namespace Access (ANA) state of one path (listener) of a subsystem: what a
/// multipath host is told about the namespace behind that listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnaState {
    /// The preferred path: a host sends I/O here.
    Optimized,
    /// Usable, but a host prefers an optimized path.
    NonOptimized,
    /// No I/O: commands fail with a path error and the host retries them on another path.
    Inaccessible,
}

impl AnaState {
    /// The state as SPDK takes it.
    pub(super) fn raw(self) -> spdk_sys::spdk_nvme_ana_state {
        match self {
            Self::Optimized => spdk_sys::SPDK_NVME_ANA_OPTIMIZED_STATE,
            Self::NonOptimized => spdk_sys::SPDK_NVME_ANA_NON_OPTIMIZED_STATE,
            Self::Inaccessible => spdk_sys::SPDK_NVME_ANA_INACCESSIBLE_STATE,
        }
    }

    /// The state SPDK reports as a raw `spdk_nvme_ana_state`; `None` for the states SPDK's
    /// target never sets (persistent loss, change) and unknown values.
    pub fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            spdk_sys::SPDK_NVME_ANA_OPTIMIZED_STATE => Some(Self::Optimized),
            spdk_sys::SPDK_NVME_ANA_NON_OPTIMIZED_STATE => Some(Self::NonOptimized),
            spdk_sys::SPDK_NVME_ANA_INACCESSIBLE_STATE => Some(Self::Inaccessible),
            _ => None,
        }
    }
}

/// Largest controller ID SPDK hands out (NVMe reserves 0xFFF0 and above).
pub const MAX_CNTLID: u16 = 0xFFEF;

/// An export that can be one path of several to the same NQN (two targets serving one volume
/// during a hot migration): ANA reporting on, a controller-ID range of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Multipath {
    /// ANA state the listener starts in (for the namespace's ANA group).
    pub ana_state: AnaState,
    /// Lowest controller ID this subsystem hands out (at least 1).
    pub min_cntlid: u16,
    /// Highest controller ID (at most [`MAX_CNTLID`]). Targets serving the same NQN must use
    /// disjoint ranges: a host refuses a second controller with a controller ID it already
    /// has for that subsystem.
    pub max_cntlid: u16,
}

/// One volume's export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsystemSpec {
    /// Subsystem NQN.
    pub nqn: String,
    /// Serial number (at most 20 characters).
    pub serial: String,
    /// Model number (at most 40 characters).
    pub model: String,
    /// Bdev exported as namespace 1.
    pub bdev: String,
    /// Namespace UUID (the volume UUID); NGUID carries the same bytes.
    pub ns_uuid: String,
    /// Listener address (IPv4).
    pub address: String,
    /// Listener TCP port.
    pub port: u16,
    /// Host NQNs allowed to connect.
    pub hosts: Vec<String>,
    /// How those hosts authenticate.
    pub keys: HostKeys,
    /// Hosts of `hosts` whose entries get no DH-HMAC-CHAP keys (admitted by their NQN
    /// alone; a PSK in `keys` still applies to them).
    pub keyless_hosts: Vec<String>,
    /// TLS: the listener takes secure channels only (the hosts need `keys.psk`).
    pub secure_channel: bool,
    /// ANA reporting and a controller-ID range, for exports that may become one of several
    /// paths to the volume; `None`: SPDK's defaults (no ANA reporting, controller IDs from
    /// the whole range). Only applied when the subsystem is created (SPDK allows both only
    /// before it starts).
    pub multipath: Option<Multipath>,
}

/// An existing subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsystemInfo {
    /// NQN.
    pub nqn: String,
    /// Serial number.
    pub serial: String,
    /// Bdevs of its namespaces.
    pub bdevs: Vec<String>,
    /// Listeners as `(address, port)`.
    pub listeners: Vec<(String, u16)>,
    /// Allowed hosts.
    pub hosts: Vec<String>,
    /// ANA reporting is on.
    pub ana_reporting: bool,
    /// Controller IDs it hands out, `(min, max)`.
    pub cntlid_range: (u16, u16),
}
