//! Creating an export: the spec's checks, then one subsystem with its namespace, hosts and
//! listener, started; a failed create destroys what it made. An existing subsystem of the
//! same shape only gets its hosts reconciled (`hosts`).

use std::ffi::c_void;

use super::hosts::set_hosts_with;
use super::spec::{KeyNames, MAX_CNTLID, SubsystemInfo, SubsystemSpec};
use super::target::{info, subsystem, tgt, trid};
use crate::bdev::bdev_by_name;
use crate::error::{Result, SpdkError, libc_errno};
use crate::runtime::{Reply, cstr, exec_on, no_unwind, on_reactor_with};
use spdk_sys::spdk_nvmf_subsystem;

/// Copy `s` into the fixed-size C string `dst`, NUL-terminated; `s` must be shorter than
/// `dst` (checked by [`validate`]).
fn fill(dst: &mut [std::ffi::c_char], s: &str) {
    dst.fill(0);
    let room = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as std::ffi::c_char;
    }
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
                crate::bdev::info_by_name(r, &spec.bdev)?.name,
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
