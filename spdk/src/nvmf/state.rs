//! A subsystem's state changes: pause and resume (and an operation run while paused, which
//! the multipath calls use), waiting until queued changes are done (`settle`), and
//! deleting a subsystem, which stops it first.

use std::ffi::c_void;

use super::target::subsystem;
use crate::error::{Result, SpdkError, libc_errno};
use crate::runtime::{Reactor, Reply, errno_cb, errno_ctx, exec_on, no_unwind, on_reactor_with};
use spdk_sys::spdk_nvmf_subsystem;

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
    on_existing(nqn, "settle subsystem", |ss, ctx| {
        // Resuming an active subsystem is a no-op state change queued behind the others.
        // SAFETY: on the reactor, `ss` just looked up (see `on_existing`); `ctx` owned by
        // SPDK when rc == 0.
        unsafe { spdk_sys::spdk_nvmf_subsystem_resume(ss, Some(settled), ctx) }
    })
    .await
}

/// Start one change of the subsystem `nqn` on the reactor and answer with its status
/// (missing = success). `start` gets the subsystem, just looked up, and an [`errno_ctx`]
/// to pass to SPDK with [`errno_cb`]; it returns SPDK's return code (not 0: SPDK never took
/// the context, which is answered here). `what` names the change in its error.
#[track_caller]
fn on_existing(
    nqn: &str,
    what: &'static str,
    start: impl FnOnce(*mut spdk_nvmf_subsystem, *mut c_void) -> i32 + Send + 'static,
) -> impl Future<Output = Result<()>> + Send {
    let nqn = nqn.to_string();
    exec_on(move |r, reply| {
        let ss = match subsystem(r, &nqn) {
            Ok(s) => s,
            Err(SpdkError::NotFound { .. }) => return reply.send(Ok(())),
            Err(e) => return reply.send(Err(e)),
        };
        let ctx = errno_ctx(move |_r, rc| {
            reply.send(if rc == 0 {
                Ok(())
            } else {
                Err(SpdkError::errno(what, nqn, rc))
            })
        });
        let rc = start(ss, ctx);
        if rc != 0 {
            // SAFETY: SPDK refused the call and never took `ctx`: answered here, once.
            unsafe { errno_cb(ctx, rc) };
        }
    })
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
    on_existing(nqn, "delete subsystem", |ss, ctx| {
        // SAFETY: on the reactor, `ss` just looked up (see `on_existing`); `ctx` owned by
        // SPDK until `delete_stopped` hands it on.
        unsafe { spdk_sys::spdk_nvmf_subsystem_stop(ss, Some(delete_stopped), ctx) }
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
pub(super) fn change_state(
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
/// `detail` name the operation in its error. Resuming also lifts a fence (`fence_io`).
pub(super) fn paused_op(
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
