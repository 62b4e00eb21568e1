//! The paths of one export, for a hot migration: the ANA state a path reports, listeners
//! added and removed while the subsystem serves, and the I/O fence of the switch-over. Each
//! change pauses the subsystem's admin queues and resumes it (`state`).

use super::spec::AnaState;
use super::state::{change_state, paused_op, settle};
use super::target::{info, subsystem, tgt, trid};
use crate::error::{Result, SpdkError, libc_errno};
use crate::runtime::{errno_cb, errno_ctx, exec_on, on_reactor_with};

/// Set the ANA state of `nqn`'s namespaces behind the listener `address:port`, for ANA group
/// `anagrpid` (the namespace's group: its nsid, 1 for LiteIO's exports; 0: every group).
/// Connected hosts get an asynchronous event and re-read the ANA log page. The subsystem
/// must have been created with [`SubsystemSpec::multipath`](super::spec::SubsystemSpec::multipath). Setting the state it already
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
        crate::runtime::from_c_array(&t.traddr),
        crate::runtime::from_c_array(&t.trsvcid)
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
