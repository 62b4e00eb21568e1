//! The NVMe-oF TCP target: transport, one subsystem per volume, listeners, host allow-lists.

use std::ffi::c_void;

use super::bdev::bdev_by_name;
use super::error::{Result, SpdkError, libc_errno};
use super::runtime::{
    Reactor, Reply, cstr, errno_cb, errno_ctx, exec_on, from_c, no_unwind, on_reactor_with,
};
use spdk_sys::spdk_nvmf_subsystem;

pub use super::dhchap::DhGroup;

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
/// ([`super::keyring`]), the same for every allowed host of the subsystem.
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
                .map(|n| super::keyring::check_name(field, n))
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
struct KeyNames([Option<std::ffi::CString>; 3]);

impl KeyNames {
    fn new(k: &HostKeys) -> Result<Self> {
        k.c_names().map(Self)
    }

    /// The same without the DH-HMAC-CHAP keys (the PSK stays).
    fn without_dhchap(&self) -> Self {
        let [_, _, p] = &self.0;
        Self([None, None, p.clone()])
    }

    /// Allow `host` on `ss` with these keys.
    ///
    /// # Safety
    /// On the reactor, `ss` a live subsystem.
    unsafe fn add_host(&self, ss: *mut spdk_nvmf_subsystem, host: &std::ffi::CStr) -> i32 {
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
    fn raw(self) -> spdk_sys::spdk_nvme_ana_state {
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

fn tgt(_r: &Reactor) -> Result<*mut spdk_sys::spdk_nvmf_tgt> {
    // SAFETY: on the reactor; returns the target the nvmf subsystem created, or NULL.
    let t = unsafe { spdk_sys::spdk_nvmf_get_first_tgt() };
    if t.is_null() {
        Err(SpdkError::NotRunning)
    } else {
        Ok(t)
    }
}

fn subsystem(r: &Reactor, nqn: &str) -> Result<*mut spdk_nvmf_subsystem> {
    let t = tgt(r)?;
    let c = cstr("nqn", nqn)?;
    // SAFETY: on the reactor.
    let ss = unsafe { spdk_sys::spdk_nvmf_tgt_find_subsystem(t, c.as_ptr()) };
    if ss.is_null() {
        Err(SpdkError::NotFound {
            kind: "subsystem",
            name: nqn.into(),
        })
    } else {
        Ok(ss)
    }
}

fn trid(address: &str, port: u16) -> Result<spdk_sys::spdk_nvme_transport_id> {
    if address.parse::<std::net::Ipv4Addr>().is_err() {
        return Err(SpdkError::InvalidArgument {
            field: "address",
            reason: format!("{address:?} is not an IPv4 address"),
        });
    }
    let s = cstr(
        "address",
        &format!("trtype:TCP adrfam:IPv4 traddr:{address} trsvcid:{port}"),
    )?;
    // SAFETY: a zeroed transport id is valid input for the parser.
    let mut t: spdk_sys::spdk_nvme_transport_id = unsafe { std::mem::zeroed() };
    // SAFETY: `t` writable, `s` a valid C string.
    let rc = unsafe { spdk_sys::spdk_nvme_transport_id_parse(&mut t, s.as_ptr()) };
    if rc != 0 {
        return Err(SpdkError::errno(
            "parse transport id",
            format!("{address}:{port}"),
            rc,
        ));
    }
    Ok(t)
}

/// The options `ss` was created with (type, serial and model numbers); SPDK 26.05 deprecates
/// the single-field getters for these.
///
/// # Safety
/// `ss` must be a live subsystem and the call must run on an SPDK thread; the result lives as
/// long as `ss`.
unsafe fn opts(ss: *mut spdk_nvmf_subsystem) -> *const spdk_sys::spdk_nvmf_subsystem_opts {
    // SAFETY: the caller's contract; SPDK returns a pointer into the subsystem, never NULL.
    unsafe { spdk_sys::spdk_nvmf_subsystem_get_opts(ss) }
}

/// Copy `s` into the fixed-size C string `dst`, NUL-terminated; `s` must be shorter than
/// `dst` (checked by [`validate`]).
fn fill(dst: &mut [std::ffi::c_char], s: &str) {
    dst.fill(0);
    let room = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as std::ffi::c_char;
    }
}

/// What SPDK reports of `ss`.
///
/// # Safety
/// `ss` must be a live subsystem and the call must run on an SPDK thread.
unsafe fn info(ss: *mut spdk_nvmf_subsystem) -> SubsystemInfo {
    // SAFETY: the caller's contract: `ss` is a live subsystem; accessors only read.
    unsafe {
        let mut bdevs = Vec::new();
        let mut ns = spdk_sys::spdk_nvmf_subsystem_get_first_ns(ss);
        while !ns.is_null() {
            let b = spdk_sys::spdk_nvmf_ns_get_bdev(ns);
            if !b.is_null() {
                bdevs.push(from_c(spdk_sys::spdk_bdev_get_name(b)));
            }
            ns = spdk_sys::spdk_nvmf_subsystem_get_next_ns(ss, ns);
        }
        let mut listeners = Vec::new();
        let mut l = spdk_sys::spdk_nvmf_subsystem_get_first_listener(ss);
        while !l.is_null() {
            let t = spdk_sys::spdk_nvmf_subsystem_listener_get_trid(l);
            if !t.is_null() {
                let addr = super::runtime::from_c_array(&(*t).traddr);
                let port = super::runtime::from_c_array(&(*t).trsvcid)
                    .parse()
                    .unwrap_or(0);
                listeners.push((addr, port));
            }
            l = spdk_sys::spdk_nvmf_subsystem_get_next_listener(ss, l);
        }
        let mut hosts = Vec::new();
        let mut h = spdk_sys::spdk_nvmf_subsystem_get_first_host(ss);
        while !h.is_null() {
            hosts.push(from_c(spdk_sys::spdk_nvmf_host_get_nqn(h)));
            h = spdk_sys::spdk_nvmf_subsystem_get_next_host(ss, h);
        }
        SubsystemInfo {
            nqn: from_c(spdk_sys::spdk_nvmf_subsystem_get_nqn(ss)),
            serial: super::runtime::from_c_array(&(*opts(ss)).sn),
            bdevs,
            listeners,
            hosts,
            ana_reporting: (*opts(ss)).ana_reporting,
            cntlid_range: (
                spdk_sys::spdk_nvmf_subsystem_get_min_cntlid(ss),
                spdk_sys::spdk_nvmf_subsystem_get_max_cntlid(ss),
            ),
        }
    }
}

/// Add the TCP transport to the target unless it has one. Idempotent.
pub async fn ensure_tcp_transport(opts: &TcpTransportOptions) -> Result<()> {
    let o = spdk_sys::liteio_tcp_opts {
        max_queue_depth: opts.max_queue_depth.unwrap_or(0),
        max_qpairs_per_ctrlr: opts.max_qpairs_per_ctrlr.unwrap_or(0),
        in_capsule_data_size: opts.in_capsule_data_size.unwrap_or(0),
        max_io_size: opts.max_io_size.unwrap_or(0),
        io_unit_size: opts.io_unit_size.unwrap_or(0),
        num_shared_buffers: opts.num_shared_buffers.unwrap_or(0),
        buf_cache_size: opts.buf_cache_size.unwrap_or(0),
    };
    exec_on(move |r, reply| {
        let t = match tgt(r) {
            Ok(t) => t,
            Err(e) => return reply.send(Err(e)),
        };
        let tcp = c"TCP";
        // SAFETY: on the reactor.
        if !unsafe { spdk_sys::spdk_nvmf_tgt_get_transport(t, tcp.as_ptr()) }.is_null() {
            return reply.send(Ok(()));
        }
        let ctx = errno_ctx(move |_r, rc| {
            reply.send(if rc == 0 {
                Ok(())
            } else {
                Err(SpdkError::errno("add TCP transport", "TCP", rc))
            })
        });
        // SAFETY: on the reactor; `o` is copied; `ctx` owned by SPDK when rc == 0.
        let rc = unsafe { spdk_sys::liteio_nvmf_tcp_transport_add(t, &o, Some(errno_cb), ctx) };
        if rc != 0 {
            // SAFETY: SPDK refused the call and never took `ctx`: answered here, once.
            unsafe { errno_cb(ctx, rc) };
        }
    })
    .await
}

/// Every subsystem except the discovery subsystem.
pub async fn subsystems() -> Result<Vec<SubsystemInfo>> {
    on_reactor_with(|r| {
        let t = tgt(r)?;
        let mut out = Vec::new();
        // SAFETY: iteration on the reactor.
        let mut ss = unsafe { spdk_sys::spdk_nvmf_subsystem_get_first(t) };
        while !ss.is_null() {
            // SAFETY: `ss` is live; the options are packed, so the type is copied out.
            if unsafe { (*opts(ss)).type_ } == spdk_sys::SPDK_NVMF_SUBTYPE_NVME {
                // SAFETY: `ss` is live: returned by the iteration on this thread.
                out.push(unsafe { info(ss) });
            }
            // SAFETY: `ss` is live.
            ss = unsafe { spdk_sys::spdk_nvmf_subsystem_get_next(ss) };
        }
        Ok(out)
    })
    .await
}

/// Whether the NVMe-oF target is up (a round trip to the reactor; no listing).
pub async fn target_running() -> Result<()> {
    on_reactor_with(|r| tgt(r).map(|_| ())).await
}

/// One subsystem by NQN, or `None`. A single lookup, unlike [`subsystems`].
pub async fn find_subsystem(nqn: &str) -> Result<Option<SubsystemInfo>> {
    let nqn = nqn.to_string();
    on_reactor_with(move |r| match subsystem(r, &nqn) {
        // SAFETY: `ss` was just returned by the lookup on this thread.
        Ok(ss) => Ok(Some(unsafe { info(ss) })),
        Err(SpdkError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    })
    .await
}

/// The TCP ports any subsystem listens on (only the ports: cheaper than [`subsystems`]).
pub async fn listener_ports() -> Result<std::collections::HashSet<u16>> {
    on_reactor_with(|r| {
        let t = tgt(r)?;
        let mut out = std::collections::HashSet::new();
        // SAFETY: iteration on the reactor; every pointer comes from SPDK's own lists and
        // stays valid while we do not yield.
        unsafe {
            let mut ss = spdk_sys::spdk_nvmf_subsystem_get_first(t);
            while !ss.is_null() {
                let mut l = spdk_sys::spdk_nvmf_subsystem_get_first_listener(ss);
                while !l.is_null() {
                    let trid = spdk_sys::spdk_nvmf_subsystem_listener_get_trid(l);
                    if let Some(Ok(port)) = trid
                        .as_ref()
                        .map(|t| super::runtime::from_c_array(&t.trsvcid).parse::<u16>())
                    {
                        out.insert(port);
                    }
                    l = spdk_sys::spdk_nvmf_subsystem_get_next_listener(ss, l);
                }
                ss = spdk_sys::spdk_nvmf_subsystem_get_next(ss);
            }
        }
        Ok(out)
    })
    .await
}

fn validate_cntlid(min: u16, max: u16) -> Result<()> {
    if min == 0 || min > max || max > MAX_CNTLID {
        return Err(SpdkError::InvalidArgument {
            field: "cntlid",
            reason: format!("{min}-{max} is not a range within 1-{MAX_CNTLID}"),
        });
    }
    Ok(())
}

fn validate(spec: &SubsystemSpec) -> Result<()> {
    if !spec.nqn.starts_with("nqn.") || spec.nqn.len() > 223 {
        return Err(SpdkError::InvalidArgument {
            field: "nqn",
            reason: format!("{:?} is not an NQN (nqn.…, at most 223 bytes)", spec.nqn),
        });
    }
    // NVMe allows printable ASCII only (SPDK refuses the rest).
    let printable = |s: &str| s.bytes().all(|b| (0x20..=0x7e).contains(&b));
    if spec.serial.is_empty() || spec.serial.len() > 20 || !printable(&spec.serial) {
        return Err(SpdkError::InvalidArgument {
            field: "serial",
            reason: format!("{:?} must be 1-20 printable ASCII characters", spec.serial),
        });
    }
    if spec.model.len() > 40 || !printable(&spec.model) {
        return Err(SpdkError::InvalidArgument {
            field: "model",
            reason: format!(
                "{:?} must be at most 40 printable ASCII characters",
                spec.model
            ),
        });
    }
    if spec.port == 0 {
        return Err(SpdkError::InvalidArgument {
            field: "port",
            reason: "must be 1-65535".into(),
        });
    }
    spec.keys.c_names()?;
    if spec.secure_channel && spec.keys.psk.is_none() {
        return Err(SpdkError::InvalidArgument {
            field: "psk",
            reason: "a secure-channel (TLS) listener needs a PSK for its hosts".into(),
        });
    }
    if let Some(m) = &spec.multipath {
        validate_cntlid(m.min_cntlid, m.max_cntlid)?;
    }
    for h in &spec.hosts {
        if !h.starts_with("nqn.") {
            return Err(SpdkError::InvalidArgument {
                field: "hosts",
                reason: format!("{h:?} is not a host NQN"),
            });
        }
    }
    Ok(())
}

/// State of a create in progress, owned by SPDK callbacks on the reactor.
struct Create {
    spec: SubsystemSpec,
    ss: *mut spdk_nvmf_subsystem,
    reply: Reply<SubsystemInfo>,
}

fn destroy_and_fail(c: Create, err: SpdkError) {
    // SAFETY: the subsystem is inactive (never started, or start failed) on the reactor;
    // destroy frees it now or later without calling back (no callback given).
    unsafe { spdk_sys::spdk_nvmf_subsystem_destroy(c.ss, None, std::ptr::null_mut()) };
    c.reply.send(Err(err));
}

/// Completion of `spdk_nvmf_subsystem_start` in a create.
///
/// # Safety
/// `arg` must be a `Box<Create>` leaked by [`create_listened`], reclaimed here once; called on
/// the SPDK thread that owns the subsystem.
unsafe extern "C" fn create_started(_ss: *mut spdk_nvmf_subsystem, arg: *mut c_void, status: i32) {
    no_unwind("create_started", || {
        // SAFETY: the caller's contract: `arg` is our `Create`, reclaimed once.
        let c = unsafe { Box::from_raw(arg.cast::<Create>()) };
        if status != 0 {
            let e = SpdkError::errno("start subsystem", c.spec.nqn.clone(), status);
            return destroy_and_fail(*c, e);
        }
        // SAFETY: the subsystem was created by this request and just started.
        let i = unsafe { info(c.ss) };
        c.reply.send(Ok(i));
    });
}

/// Completion of `spdk_nvmf_subsystem_add_listener` in a create.
///
/// # Safety
/// `arg` must be a `Box<Create>` leaked by [`create_subsystem`], reclaimed here once; called
/// on the SPDK thread that owns the subsystem.
unsafe extern "C" fn create_listened(arg: *mut c_void, status: i32) {
    no_unwind("create_listened", || {
        // SAFETY: the caller's contract: `arg` is our `Create`, reclaimed once.
        let c = unsafe { Box::from_raw(arg.cast::<Create>()) };
        if status != 0 {
            let e = SpdkError::errno(
                "add listener",
                format!("{} on {}:{}", c.spec.nqn, c.spec.address, c.spec.port),
                status,
            );
            return destroy_and_fail(*c, e);
        }
        let ss = c.ss;
        let arg = Box::into_raw(c).cast::<c_void>();
        // SAFETY: on the reactor; `arg` is owned by SPDK until `create_started` runs once.
        let rc = unsafe { spdk_sys::spdk_nvmf_subsystem_start(ss, Some(create_started), arg) };
        if rc != 0 {
            // SAFETY: SPDK refused the start and never took `arg`: answered here, once.
            unsafe { create_started(ss, arg, rc) };
        }
    });
}

/// Export `spec.bdev` as a subsystem listening on `spec.address:spec.port`, reachable only by
/// `spec.hosts`. Idempotent: an existing subsystem with the same NQN, bdev and listener gets
/// its host list reconciled and is success; one with another bdev is an error. A failed create
/// leaves nothing behind.
pub async fn create_subsystem(spec: SubsystemSpec) -> Result<SubsystemInfo> {
    validate(&spec)?;
    let existing = on_reactor_with({
        let spec = spec.clone();
        move |r| match subsystem(r, &spec.nqn) {
            // Compare by the bdev's canonical name: the spec may use an alias (`lvs/lvol`).
            Ok(ss) => Ok(Some((
                // SAFETY: `ss` was just returned by the lookup on this thread.
                unsafe { info(ss) },
                super::bdev::info_by_name(r, &spec.bdev)?.name,
            ))),
            Err(SpdkError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    })
    .await?;
    if let Some((cur, bdev)) = existing {
        if cur.bdevs != [bdev] || !cur.listeners.contains(&(spec.address.clone(), spec.port)) {
            return Err(SpdkError::AlreadyExists {
                kind: "subsystem",
                name: spec.nqn,
                detail: format!("exporting {:?} on {:?}", cur.bdevs, cur.listeners),
            });
        }
        return set_hosts_with(&spec.nqn, &spec.hosts, &spec.keys, &spec.keyless_hosts).await;
    }
    exec_on(move |r, reply| {
        let setup = || -> Result<(*mut spdk_nvmf_subsystem, spdk_sys::spdk_nvme_transport_id)> {
            let t = tgt(r)?;
            bdev_by_name(r, &spec.bdev)?;
            let trid = trid(&spec.address, spec.port)?;
            let (nqn, bdev, uuid) = (cstr("nqn", &spec.nqn)?, cstr("bdev", &spec.bdev)?, cstr("ns_uuid", &spec.ns_uuid)?);
            let hosts: Vec<_> = spec.hosts.iter().map(|h| cstr("hosts", h)).collect::<Result<_>>()?;
            let keys = KeyNames::new(&spec.keys)?;
            let mut sopts = spdk_sys::spdk_nvmf_subsystem_opts::default();
            // SAFETY: `sopts` is writable and `opts_size` is its size; SPDK fills in defaults.
            unsafe { spdk_sys::spdk_nvmf_subsystem_opts_init(spdk_sys::SPDK_NVMF_SUBTYPE_NVME, &mut sopts, std::mem::size_of::<spdk_sys::spdk_nvmf_subsystem_opts>()) };
            sopts.__bindgen_anon_1.max_namespaces = 1;
            fill(&mut sopts.sn, &spec.serial);
            if !spec.model.is_empty() {
                fill(&mut sopts.mn, &spec.model);
            }
            sopts.ana_reporting = spec.multipath.is_some();
            // SAFETY: on the reactor; the NQN and `sopts` are copied by SPDK.
            let ss = unsafe { spdk_sys::spdk_nvmf_subsystem_create_ext(t, nqn.as_ptr(), spdk_sys::SPDK_NVMF_SUBTYPE_NVME, &sopts) };
            if ss.is_null() {
                // `validate` checked the NQN, serial and model: the NQN is taken, or every
                // subsystem slot of the target is (SPDK logs which).
                let mut count = 0usize;
                // SAFETY: iteration on the reactor over SPDK's own list; nothing yields.
                unsafe {
                    let mut cur = spdk_sys::spdk_nvmf_subsystem_get_first(t);
                    while !cur.is_null() {
                        count += 1;
                        cur = spdk_sys::spdk_nvmf_subsystem_get_next(cur);
                    }
                }
                return Err(SpdkError::errno(
                    "create subsystem",
                    format!("{} (the NQN is taken, or the target's {count} subsystems fill its slots: raise spdk.maxSubsystems)", spec.nqn),
                    -libc_errno::ENOSPC,
                ));
            }
            let fail = |e: SpdkError| {
                // SAFETY: `ss` was just created and never started.
                unsafe { spdk_sys::spdk_nvmf_subsystem_destroy(ss, None, std::ptr::null_mut()) };
                e
            };
            if let Some(m) = &spec.multipath {
                // SAFETY: `ss` is a new inactive subsystem on the reactor.
                let rc = unsafe { spdk_sys::spdk_nvmf_subsystem_set_cntlid_range(ss, m.min_cntlid, m.max_cntlid) };
                if rc != 0 {
                    return Err(fail(SpdkError::errno("set controller ID range", format!("{}-{}", m.min_cntlid, m.max_cntlid), rc)));
                }
            }
            // SAFETY: `ss` is a new inactive subsystem on the reactor.
            unsafe {
                spdk_sys::spdk_nvmf_subsystem_set_allow_any_host(ss, false);
                if spdk_sys::liteio_nvmf_add_ns(ss, bdev.as_ptr(), uuid.as_ptr()) == 0 {
                    return Err(fail(SpdkError::InvalidArgument {
                        field: "bdev",
                        reason: format!("cannot add {} as a namespace with uuid {:?} (claimed by another subsystem, or a bad uuid)", spec.bdev, spec.ns_uuid),
                    }));
                }
                let keyless = keys.without_dhchap();
                for (h, name) in hosts.iter().zip(&spec.hosts) {
                    let k = if spec.keyless_hosts.contains(name) { &keyless } else { &keys };
                    let rc = k.add_host(ss, h);
                    if rc != 0 {
                        return Err(fail(SpdkError::errno("add host", name.clone(), rc)));
                    }
                }
                let mut lopts: spdk_sys::spdk_nvmf_listen_opts = std::mem::zeroed();
                spdk_sys::spdk_nvmf_listen_opts_init(&mut lopts, std::mem::size_of::<spdk_sys::spdk_nvmf_listen_opts>());
                lopts.secure_channel = spec.secure_channel;
                let rc = spdk_sys::spdk_nvmf_tgt_listen_ext(t, &trid, &mut lopts);
                if rc != 0 && rc != -libc_errno::EEXIST {
                    return Err(fail(SpdkError::errno("listen", format!("{}:{}", spec.address, spec.port), rc)));
                }
            }
            Ok((ss, trid))
        };
        match setup() {
            Err(e) => reply.send(Err(e)),
            Ok((ss, trid)) => {
                let secure_channel = spec.secure_channel;
                let ana_state = spec.multipath.map(|m| m.ana_state);
                let arg = Box::into_raw(Box::new(Create { spec, ss, reply })).cast::<c_void>();
                // SAFETY: a zeroed struct is valid input for the defaults init, which fills it.
                let mut lopts: spdk_sys::spdk_nvmf_listener_opts = unsafe { std::mem::zeroed() };
                // SAFETY: `lopts` is writable and of the size passed.
                unsafe { spdk_sys::spdk_nvmf_subsystem_listener_opts_init(&mut lopts, std::mem::size_of::<spdk_sys::spdk_nvmf_listener_opts>()) };
                lopts.secure_channel = secure_channel;
                if let Some(a) = ana_state {
                    lopts.ana_state = a.raw();
                }
                // SAFETY: on the reactor; `trid` and `lopts` are copied; `arg` owned by SPDK
                // until `create_listened` runs once.
                unsafe { spdk_sys::spdk_nvmf_subsystem_add_listener_ext(ss, &trid, Some(create_listened), arg, &mut lopts) };
            }
        }
    })
    .await
}

/// Make the allow-list exactly `hosts`, authenticating with `keys` (live: a removed host's
/// new connections fail, and its existing ones are closed before this returns; a host whose
/// DH-HMAC-CHAP keys change stays connected, and its next connection needs the new keys).
pub async fn set_hosts(nqn: &str, hosts: &[String], keys: &HostKeys) -> Result<SubsystemInfo> {
    set_hosts_with(nqn, hosts, keys, &[]).await
}

/// [`set_hosts`], except that the entries of the hosts in `keyless` get no DH-HMAC-CHAP keys
/// (a host's keys are taken away or given live, as a rotation does).
///
/// SPDK's `remove_host` only refuses a host's new connections: a host already connected
/// keeps its queue pairs and goes on reading and writing. So every host connected to the
/// subsystem that is not in `hosts` (one removed now, or by an earlier call that failed) is
/// disconnected here, and the call returns once its queue pairs are gone, their commands
/// finished or aborted ([`disconnect_host`]): from then on the host can write nothing more
/// through this subsystem. This is how an export is fenced off from an old user (a raid
/// node that lost the volume).
///
/// Errors: [`SpdkError::NotFound`] for no such subsystem; `ETIMEDOUT` when a removed host's
/// queue pairs are not gone within SPDK's 15 s (it is allowed no more; a retry disconnects
/// it again).
pub async fn set_hosts_with(
    nqn: &str,
    hosts: &[String],
    keys: &HostKeys,
    keyless: &[String],
) -> Result<SubsystemInfo> {
    keys.c_names()?;
    let (nqn, hosts, keys, keyless) = (
        nqn.to_string(),
        hosts.to_vec(),
        keys.clone(),
        keyless.to_vec(),
    );
    exec_on(move |r, reply| {
        let removed = (|| -> Result<Vec<String>> {
            let ss = subsystem(r, &nqn)?;
            let all = KeyNames::new(&keys)?;
            let without = all.without_dhchap();
            // SAFETY: `ss` was just returned by the lookup on this thread.
            let cur = unsafe { info(ss) };
            for h in &hosts {
                let c = cstr("hosts", h)?;
                let names = if keyless.contains(h) { &without } else { &all };
                let rc = if cur.hosts.contains(h) {
                    // SAFETY: on the reactor; `ss` live; every string valid or NULL, copied.
                    unsafe {
                        spdk_sys::liteio_nvmf_set_keys(
                            ss,
                            c.as_ptr(),
                            ptr_or_null(&names.0[0]),
                            ptr_or_null(&names.0[1]),
                        )
                    }
                } else {
                    // SAFETY: on the reactor; `ss` live.
                    unsafe { names.add_host(ss, &c) }
                };
                if rc != 0 {
                    return Err(SpdkError::errno("allow host", h.clone(), rc));
                }
            }
            let mut gone: Vec<String> = Vec::new();
            for h in cur.hosts.iter().filter(|h| !hosts.contains(h)) {
                let c = cstr("hosts", h)?;
                // SAFETY: on the reactor; `ss` live.
                let rc = unsafe { spdk_sys::spdk_nvmf_subsystem_remove_host(ss, c.as_ptr()) };
                if rc != 0 && rc != -libc_errno::ENOENT {
                    return Err(SpdkError::errno("remove host", h.clone(), rc));
                }
                gone.push(h.clone());
            }
            // SAFETY: `ss` is still live: nothing on this thread removed it since the lookup.
            for h in unsafe { connected(ss) } {
                if !hosts.contains(&h) && !gone.contains(&h) {
                    gone.push(h);
                }
            }
            Ok(gone)
        })();
        let gone = match removed {
            Ok(g) => g,
            Err(e) => return reply.send(Err(e)),
        };
        let n = nqn.clone();
        disconnect_all(r, nqn, gone, move |r, done| {
            reply.send(done.and_then(|()| {
                let ss = subsystem(r, &n)?;
                // SAFETY: `ss` was just returned by the lookup on this thread.
                Ok(unsafe { info(ss) })
            }))
        });
    })
    .await
}

/// How long SPDK waits for a host's queue pairs to go (0: its default, 15 s).
const DISCONNECT_TIMEOUT_MS: u64 = 0;

/// Disconnect the hosts `hosts` from the subsystem `nqn` one after another, each waited for,
/// then run `then` (with the first error). The subsystem is looked up again for each.
fn disconnect_all(
    r: &Reactor,
    nqn: String,
    mut hosts: Vec<String>,
    then: impl FnOnce(&Reactor, Result<()>) + 'static,
) {
    let Some(h) = hosts.pop() else {
        return then(r, Ok(()));
    };
    let (ss, c) = match (subsystem(r, &nqn), cstr("host", &h)) {
        (Ok(ss), Ok(c)) => (ss, c),
        (Err(e), _) | (_, Err(e)) => return then(r, Err(e)),
    };
    let what = format!("{h} from {nqn}");
    let ctx = errno_ctx(move |r, rc| {
        if rc != 0 {
            return then(r, Err(SpdkError::errno("disconnect host", what, rc)));
        }
        disconnect_all(r, nqn, hosts, then);
    });
    // SAFETY: on the reactor; `ss` was just looked up; SPDK copies the host NQN; `ctx` is
    // owned by SPDK when the call returns 0 (it calls back once the host's queue pairs are
    // gone, or with -ETIMEDOUT).
    let rc = unsafe {
        spdk_sys::spdk_nvmf_subsystem_disconnect_host(
            ss,
            c.as_ptr(),
            Some(errno_cb),
            ctx,
            DISCONNECT_TIMEOUT_MS,
        )
    };
    if rc != 0 {
        // SAFETY: SPDK refused the call and never took `ctx`: it is answered here, once.
        unsafe { errno_cb(ctx, rc) };
    }
}

/// Close every connection (queue pair) of the host `host` to the subsystem `nqn` and wait
/// until they are gone: the host's commands in flight are finished or aborted, and nothing
/// more it sends through them lands. The allow-list is not changed: an allowed host may
/// connect again at once (its initiator reconnects); to fence a host off, take it out of the
/// allow-list ([`set_hosts`] does both). A host with no connection: nothing to do.
///
/// Errors: [`SpdkError::NotFound`] for no such subsystem; `ETIMEDOUT` when the queue pairs
/// are not gone within SPDK's 15 s.
pub async fn disconnect_host(nqn: &str, host: &str) -> Result<()> {
    cstr("host", host)?;
    let (nqn, host) = (nqn.to_string(), host.to_string());
    exec_on(move |r, reply| {
        disconnect_all(r, nqn, vec![host], move |_r, done| reply.send(done));
    })
    .await
}

/// The hosts (NQNs) with a controller on the subsystem `nqn` now, each once. A host being
/// disconnected may be listed a moment longer than its queue pairs live.
pub async fn connected_hosts(nqn: &str) -> Result<Vec<String>> {
    let nqn = nqn.to_string();
    on_reactor_with(move |r| {
        let ss = subsystem(r, &nqn)?;
        // SAFETY: `ss` was just returned by the lookup on this thread.
        Ok(unsafe { connected(ss) })
    })
    .await
}

/// The host NQNs of the controllers of `ss`.
///
/// # Safety
/// On the reactor (the subsystem's thread), `ss` a live subsystem.
unsafe fn connected(ss: *mut spdk_nvmf_subsystem) -> Vec<String> {
    const NQN: usize = spdk_sys::LITEIO_NQN_MAX as usize;
    let mut max = 16usize;
    loop {
        let mut buf = vec![0 as std::ffi::c_char; max * NQN];
        // SAFETY: the caller's contract; `buf` has room for `max` NQNs.
        let n = unsafe {
            spdk_sys::liteio_nvmf_connected_hosts(
                ss,
                buf.as_mut_ptr(),
                i32::try_from(max).unwrap_or(i32::MAX),
            )
        };
        let n = usize::try_from(n).unwrap_or(0);
        if n <= max {
            return buf
                .chunks(NQN)
                .take(n)
                .map(super::runtime::from_c_array)
                .collect();
        }
        max = n;
    }
}

extern "C" fn settled(_ss: *mut spdk_nvmf_subsystem, arg: *mut c_void, status: i32) {
    no_unwind("settled", || {
        // SAFETY: `arg` is the `errno_ctx` given to spdk_nvmf_subsystem_resume, which calls
        // this once.
        unsafe { errno_cb(arg, status) };
    });
}

/// Wait until every state change SPDK queued on a subsystem (a namespace resize pauses and
/// resumes it) has finished. SPDK 26.05 frees a destroyed subsystem even while such a change
/// is still queued, so the exporter settles before deleting and after resizing. Missing =
/// success.
pub async fn settle(nqn: &str) -> Result<()> {
    // Messages to a thread run in order: this one runs after a pending resize notice.
    on_reactor_with(|_r| Ok(())).await?;
    let nqn = nqn.to_string();
    exec_on(move |r, reply| {
        let ss = match subsystem(r, &nqn) {
            Ok(s) => s,
            Err(SpdkError::NotFound { .. }) => return reply.send(Ok(())),
            Err(e) => return reply.send(Err(e)),
        };
        let n = nqn.clone();
        let ctx = errno_ctx(move |_r, rc| {
            reply.send(if rc == 0 {
                Ok(())
            } else {
                Err(SpdkError::errno("settle subsystem", n, rc))
            })
        });
        // Resuming an active subsystem is a no-op state change queued behind the others.
        // SAFETY: on the reactor; `ctx` owned by SPDK when rc == 0.
        let rc = unsafe { spdk_sys::spdk_nvmf_subsystem_resume(ss, Some(settled), ctx) };
        if rc != 0 {
            // SAFETY: SPDK refused the call and never took `ctx`: answered here, once.
            unsafe { errno_cb(ctx, rc) };
        }
    })
    .await
}

extern "C" fn delete_stopped(ss: *mut spdk_nvmf_subsystem, arg: *mut c_void, status: i32) {
    no_unwind("delete_stopped", || {
        if status != 0 {
            // SAFETY: `arg` is the `errno_ctx` given to spdk_nvmf_subsystem_stop, which calls
            // this once; it is answered once, here.
            return unsafe { errno_cb(arg, status) };
        }
        extern "C" fn destroyed(arg: *mut c_void) {
            no_unwind("destroyed", || {
                // SAFETY: `arg` is the `errno_ctx` handed on to spdk_nvmf_subsystem_destroy,
                // which calls this once.
                unsafe { errno_cb(arg, 0) };
            });
        }
        // SAFETY: the subsystem is inactive now; destroy calls `destroyed` once when it
        // returns -EINPROGRESS, and not at all otherwise.
        let rc = unsafe { spdk_sys::spdk_nvmf_subsystem_destroy(ss, Some(destroyed), arg) };
        if rc != -libc_errno::EINPROGRESS {
            // SAFETY: destroy will not call back: `arg` is answered here, once.
            unsafe { errno_cb(arg, rc) };
        }
    });
}

/// Stop and remove a subsystem; missing = success. Its listener stays on the target while
/// other subsystems may use the port.
pub async fn delete_subsystem(nqn: &str) -> Result<()> {
    settle(nqn).await?;
    let nqn = nqn.to_string();
    exec_on(move |r, reply| {
        let ss = match subsystem(r, &nqn) {
            Ok(s) => s,
            Err(SpdkError::NotFound { .. }) => return reply.send(Ok(())),
            Err(e) => return reply.send(Err(e)),
        };
        let n = nqn.clone();
        let ctx = errno_ctx(move |_r, rc| {
            reply.send(if rc == 0 {
                Ok(())
            } else {
                Err(SpdkError::errno("delete subsystem", n, rc))
            })
        });
        // SAFETY: on the reactor; `ctx` owned by SPDK until `delete_stopped` hands it on.
        let rc = unsafe { spdk_sys::spdk_nvmf_subsystem_stop(ss, Some(delete_stopped), ctx) };
        if rc != 0 {
            // SAFETY: SPDK refused the call and never took `ctx`: answered here, once.
            unsafe { errno_cb(ctx, rc) };
        }
    })
    .await
}

/// Trampoline for a subsystem state change (pause, resume) whose context is an
/// [`errno_ctx`].
extern "C" fn state_changed(_ss: *mut spdk_nvmf_subsystem, arg: *mut c_void, status: i32) {
    no_unwind("state_changed", || {
        // SAFETY: `arg` is the `errno_ctx` given to the state change, which calls this once.
        unsafe { errno_cb(arg, status) };
    });
}

/// Start a state change of `ss` (`spdk_nvmf_subsystem_pause` with `Some(nsid)`,
/// `spdk_nvmf_subsystem_resume` with `None`) that calls `then` once with its status.
fn change_state(
    ss: *mut spdk_nvmf_subsystem,
    pause_nsid: Option<u32>,
    then: impl FnOnce(&Reactor, i32) + 'static,
) {
    let ctx = errno_ctx(then);
    // SAFETY: on the reactor (the callers run there), `ss` a live subsystem they just looked
    // up; `ctx` owned by SPDK when rc == 0.
    let rc = unsafe {
        match pause_nsid {
            Some(nsid) => spdk_sys::spdk_nvmf_subsystem_pause(ss, nsid, Some(state_changed), ctx),
            None => spdk_sys::spdk_nvmf_subsystem_resume(ss, Some(state_changed), ctx),
        }
    };
    if rc != 0 {
        // SAFETY: SPDK refused the call and never took `ctx`: answered here, once.
        unsafe { errno_cb(ctx, rc) };
    }
}

/// Pause `nqn` (admin queues only: no namespace's I/O is held), run `op` on the paused
/// subsystem, resume it, and answer with `op`'s result, else the resume's. `op` gets the
/// subsystem and a continuation it must call once with 0 or a negative errno; `what` and
/// `detail` name the operation in its error. Resuming also lifts a [`fence_io`].
fn paused_op(
    r: &Reactor,
    nqn: String,
    what: &'static str,
    detail: String,
    reply: Reply<()>,
    op: impl FnOnce(&Reactor, *mut spdk_nvmf_subsystem, Box<dyn FnOnce(&Reactor, i32)>) + 'static,
) {
    let ss = match subsystem(r, &nqn) {
        Ok(s) => s,
        Err(e) => return reply.send(Err(e)),
    };
    change_state(ss, Some(0), move |r, rc| {
        if rc != 0 {
            return reply.send(Err(SpdkError::errno("pause subsystem", nqn, rc)));
        }
        // Look the subsystem up again: it may have gone while the pause ran.
        let ss = match subsystem(r, &nqn) {
            Ok(s) => s,
            Err(e) => return reply.send(Err(e)),
        };
        let done = Box::new(move |r: &Reactor, op_rc: i32| {
            let ss = match subsystem(r, &nqn) {
                Ok(s) => s,
                Err(e) => return reply.send(Err(e)),
            };
            change_state(ss, None, move |_r, rc| {
                reply.send(if op_rc != 0 {
                    Err(SpdkError::errno(what, detail, op_rc))
                } else if rc != 0 {
                    Err(SpdkError::errno("resume subsystem", nqn, rc))
                } else {
                    Ok(())
                })
            });
        });
        op(r, ss, done);
    });
}

/// Set the ANA state of `nqn`'s namespaces behind the listener `address:port`, for ANA group
/// `anagrpid` (the namespace's group: its nsid, 1 for LiteIO's exports; 0: every group).
/// Connected hosts get an asynchronous event and re-read the ANA log page. The subsystem
/// must have been created with [`SubsystemSpec::multipath`]. Setting the state it already
/// has is success.
///
/// SPDK changes the state of a paused subsystem only: this pauses the admin queues (no I/O
/// is held), sets the state and resumes. A resume also ends a [`fence_io`]: the hot-migration
/// switch-over fences the old path's I/O, promotes the new path (on the other target) and
/// then demotes the old path with this call, which releases the held I/O; the held commands
/// then fail with an ANA path error and the host retries them on the new path.
pub async fn set_ana_state(
    nqn: &str,
    address: &str,
    port: u16,
    state: AnaState,
    anagrpid: u32,
) -> Result<()> {
    let t = trid(address, port)?;
    let nqn = nqn.to_string();
    let detail = format!("{nqn} on {address}:{port} to {state:?}");
    exec_on(move |r, reply| {
        paused_op(
            r,
            nqn,
            "set ANA state",
            detail,
            reply,
            move |_r, ss, done| {
                let ctx = errno_ctx(done);
                // SAFETY: on the reactor; `ss` paused and live; `t` is copied; SPDK calls
                // `errno_cb` once with `ctx` on every path (this function has no return code).
                unsafe {
                    spdk_sys::spdk_nvmf_subsystem_set_ana_state(
                        ss,
                        &t,
                        state.raw(),
                        anagrpid,
                        Some(errno_cb),
                        ctx,
                    )
                };
            },
        )
    })
    .await
}

/// The ANA state of ANA group `anagrpid` (at least 1) behind the listener `address:port` of
/// `nqn`.
pub async fn ana_state(nqn: &str, address: &str, port: u16, anagrpid: u32) -> Result<AnaState> {
    let t = trid(address, port)?;
    let nqn = nqn.to_string();
    on_reactor_with(move |r| {
        let ss = subsystem(r, &nqn)?;
        let mut raw: spdk_sys::spdk_nvme_ana_state = 0;
        // SAFETY: on the reactor; `ss` live; `t` and `raw` valid for the call.
        let rc = unsafe { spdk_sys::spdk_nvmf_subsystem_get_ana_state(ss, &t, anagrpid, &mut raw) };
        if rc != 0 {
            return Err(SpdkError::errno(
                "get ANA state",
                format!("{nqn} on {}", trid_str(&t)),
                rc,
            ));
        }
        AnaState::from_raw(raw).ok_or_else(|| SpdkError::InvalidArgument {
            field: "ana_state",
            reason: format!("SPDK reports state {raw}, which LiteIO does not use"),
        })
    })
    .await
}

fn trid_str(t: &spdk_sys::spdk_nvme_transport_id) -> String {
    format!(
        "{}:{}",
        super::runtime::from_c_array(&t.traddr),
        super::runtime::from_c_array(&t.trsvcid)
    )
}

/// Add a listener `address:port` to the existing subsystem `nqn` (a second path to the same
/// export), starting in `ana_state` when the subsystem reports ANA. Idempotent: a listener
/// that exists is success.
pub async fn add_listener(
    nqn: &str,
    address: &str,
    port: u16,
    secure_channel: bool,
    ana_state: Option<AnaState>,
) -> Result<()> {
    if port == 0 {
        return Err(SpdkError::InvalidArgument {
            field: "port",
            reason: "must be 1-65535".into(),
        });
    }
    let t = trid(address, port)?;
    let nqn = nqn.to_string();
    let detail = format!("{nqn} on {address}:{port}");
    let present = {
        let (nqn, address) = (nqn.clone(), address.to_string());
        on_reactor_with(move |r| {
            let ss = subsystem(r, &nqn)?;
            // SAFETY: `ss` was just returned by the lookup on this thread.
            Ok(unsafe { info(ss) }.listeners.contains(&(address, port)))
        })
        .await?
    };
    if present {
        return Ok(());
    }
    exec_on(move |r, reply| {
        let tgt = match tgt(r) {
            Ok(t) => t,
            Err(e) => return reply.send(Err(e)),
        };
        paused_op(r, nqn, "add listener", detail, reply, move |r, ss, done| {
            // SAFETY: a zeroed struct is valid input for the defaults init, which fills it.
            let mut topts: spdk_sys::spdk_nvmf_listen_opts = unsafe { std::mem::zeroed() };
            // SAFETY: `topts` writable and of the size passed.
            unsafe {
                spdk_sys::spdk_nvmf_listen_opts_init(
                    &mut topts,
                    std::mem::size_of::<spdk_sys::spdk_nvmf_listen_opts>(),
                )
            };
            topts.secure_channel = secure_channel;
            // SAFETY: on the reactor; `t` and `topts` are copied.
            let rc = unsafe { spdk_sys::spdk_nvmf_tgt_listen_ext(tgt, &t, &mut topts) };
            if rc != 0 && rc != -libc_errno::EEXIST {
                return done(r, rc);
            }
            // SAFETY: as above.
            let mut lopts: spdk_sys::spdk_nvmf_listener_opts = unsafe { std::mem::zeroed() };
            // SAFETY: `lopts` writable and of the size passed.
            unsafe {
                spdk_sys::spdk_nvmf_subsystem_listener_opts_init(
                    &mut lopts,
                    std::mem::size_of::<spdk_sys::spdk_nvmf_listener_opts>(),
                )
            };
            lopts.secure_channel = secure_channel;
            if let Some(a) = ana_state {
                lopts.ana_state = a.raw();
            }
            let ctx = errno_ctx(done);
            // SAFETY: on the reactor; `ss` paused and live; `t` and `lopts` are copied; SPDK
            // calls `errno_cb` once with `ctx`.
            unsafe {
                spdk_sys::spdk_nvmf_subsystem_add_listener_ext(
                    ss,
                    &t,
                    Some(errno_cb),
                    ctx,
                    &mut lopts,
                )
            };
        })
    })
    .await
}

/// Remove the listener `address:port` from the subsystem `nqn` and stop the target
/// listening there: no new connection comes in through it (the other listeners stay).
/// Idempotent: a missing listener or subsystem is success. Pauses and resumes the
/// subsystem, so it also ends a [`fence_io`].
pub async fn remove_listener(nqn: &str, address: &str, port: u16) -> Result<()> {
    let t = trid(address, port)?;
    let nqn = nqn.to_string();
    let detail = format!("{nqn} on {address}:{port}");
    let present = {
        let (nqn, address) = (nqn.clone(), address.to_string());
        on_reactor_with(move |r| match subsystem(r, &nqn) {
            // SAFETY: `ss` was just returned by the lookup on this thread.
            Ok(ss) => Ok(unsafe { info(ss) }.listeners.contains(&(address, port))),
            Err(SpdkError::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        })
        .await?
    };
    if !present {
        return Ok(());
    }
    exec_on(move |r, reply| {
        let tgt = match tgt(r) {
            Ok(t) => t,
            Err(e) => return reply.send(Err(e)),
        };
        paused_op(
            r,
            nqn,
            "remove listener",
            detail,
            reply,
            move |r, ss, done| {
                // SAFETY: on the reactor; `ss` paused and live; `t` is read only.
                let rc = unsafe { spdk_sys::spdk_nvmf_subsystem_remove_listener(ss, &t) };
                if rc != 0 && rc != -libc_errno::ENOENT {
                    return done(r, rc);
                }
                // SAFETY: on the reactor; `t` is read only. The target may still listen for
                // another subsystem on the same address only when one was added there, which
                // LiteIO never does (one port per subsystem): stop listening.
                let rc = unsafe { spdk_sys::spdk_nvmf_tgt_stop_listen(tgt, &t) };
                done(r, if rc == -libc_errno::ENOENT { 0 } else { rc });
            },
        )
    })
    .await
}

/// Hold the I/O of `nqn`'s namespace 1 on this target: commands already running finish,
/// new ones wait in the target (the host sees them as slow, not failed). The first step of a
/// hot-migration switch-over, on the old path's target, so that no write lands on the old
/// copy once the new path serves. [`set_ana_state`] (or [`unfence_io`]) ends the fence, and
/// so does anything else that resumes the subsystem ([`settle`], hence the exporter's
/// resize and delete). The admin queues wait too, keep-alives included: a fence must end
/// well within the hosts' keep-alive timeout (the kernel's default: 5 s).
pub async fn fence_io(nqn: &str) -> Result<()> {
    let nqn = nqn.to_string();
    exec_on(move |r, reply| {
        let ss = match subsystem(r, &nqn) {
            Ok(s) => s,
            Err(e) => return reply.send(Err(e)),
        };
        change_state(ss, Some(1), move |_r, rc| {
            reply.send(if rc == 0 {
                Ok(())
            } else {
                Err(SpdkError::errno("fence subsystem I/O", nqn, rc))
            })
        });
    })
    .await
}

/// End a [`fence_io`] without changing ANA states (a cancelled switch-over): the held I/O
/// runs. Missing subsystem = success.
pub async fn unfence_io(nqn: &str) -> Result<()> {
    settle(nqn).await
}
