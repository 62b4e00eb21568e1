//! The target and its subsystems as they are: finding the target and a subsystem by NQN,
//! parsing a listener's transport ID, reading what SPDK reports of a subsystem, and the
//! calls that only look (listings, listener ports) or add the one TCP transport.

use super::spec::{SubsystemInfo, TcpTransportOptions};
use crate::error::{Result, SpdkError};
use crate::runtime::{Reactor, cstr, errno_cb, errno_ctx, exec_on, from_c, on_reactor_with};
use spdk_sys::spdk_nvmf_subsystem;

/// The NVMe-oF target, or [`SpdkError::NotRunning`] before SPDK made it.
pub(super) fn tgt(_r: &Reactor) -> Result<*mut spdk_sys::spdk_nvmf_tgt> {
    // SAFETY: on the reactor; returns the target the nvmf subsystem created, or NULL.
    let t = unsafe { spdk_sys::spdk_nvmf_get_first_tgt() };
    if t.is_null() {
        Err(SpdkError::NotRunning)
    } else {
        Ok(t)
    }
}

/// The subsystem `nqn`, or [`SpdkError::NotFound`].
pub(super) fn subsystem(r: &Reactor, nqn: &str) -> Result<*mut spdk_nvmf_subsystem> {
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

/// The TCP transport ID of the listener `address:port` (IPv4).
pub(super) fn trid(address: &str, port: u16) -> Result<spdk_sys::spdk_nvme_transport_id> {
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
pub(super) unsafe fn opts(
    ss: *mut spdk_nvmf_subsystem,
) -> *const spdk_sys::spdk_nvmf_subsystem_opts {
    // SAFETY: the caller's contract; SPDK returns a pointer into the subsystem, never NULL.
    unsafe { spdk_sys::spdk_nvmf_subsystem_get_opts(ss) }
}

/// What SPDK reports of `ss`.
///
/// # Safety
/// `ss` must be a live subsystem and the call must run on an SPDK thread.
pub(super) unsafe fn info(ss: *mut spdk_nvmf_subsystem) -> SubsystemInfo {
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
                let addr = crate::runtime::from_c_array(&(*t).traddr);
                let port = crate::runtime::from_c_array(&(*t).trsvcid)
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
            serial: crate::runtime::from_c_array(&(*opts(ss)).sn),
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
                        .map(|t| crate::runtime::from_c_array(&t.trsvcid).parse::<u16>())
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
