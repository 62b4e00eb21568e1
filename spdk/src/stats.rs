//! Runtime statistics of SPDK: how each SPDK thread spent its time.
//!
//! SPDK accounts a thread's time in `spdk_thread_poll`: busy when a poller or message did
//! work, idle otherwise. In interrupt mode the reactors sleep in `epoll_wait` and never call
//! it, so these counters stay at 0; the reactor threads' CPU time from `/proc` is the measure
//! that holds in both modes (the agent's metrics read it).

use std::ffi::c_void;

use super::error::Result;
use super::runtime::{Reply, exec, from_c, no_unwind};

/// How one SPDK thread spent its time since it started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadStats {
    /// SPDK's name of the thread (`app_thread`, `nvmf_tgt_poll_group_000`, …).
    pub name: String,
    /// SPDK's id of the thread (unique while the runtime runs).
    pub id: u64,
    /// Ticks spent doing work.
    pub busy_ticks: u64,
    /// Ticks spent polling without work.
    pub idle_ticks: u64,
}

/// Every SPDK thread's statistics and the tick rate (ticks per second) to convert them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeStats {
    /// One entry per SPDK thread.
    pub threads: Vec<ThreadStats>,
    /// `spdk_get_ticks_hz()`.
    pub ticks_hz: u64,
}

/// The state carried from thread to thread by `spdk_for_each_thread`.
struct Walk {
    out: Vec<ThreadStats>,
    reply: Reply<RuntimeStats>,
}

/// Runs on each SPDK thread in turn.
///
/// # Safety
/// `arg` must be the `Box<Walk>` leaked by [`threads`], not yet reclaimed, and no other
/// reference to it may be live (spdk_for_each_thread visits one thread at a time).
unsafe extern "C" fn on_thread(arg: *mut c_void) {
    no_unwind("on_thread", || {
        // SAFETY: the caller's contract: `arg` is the `Walk`, and this is the only reference
        // (each call is a message sent after the previous one returned; `on_done` reclaims it
        // only after the last one).
        let walk = unsafe { &mut *arg.cast::<Walk>() };
        // SAFETY: called by SPDK on one of its threads; returns that thread.
        let thread = unsafe { spdk_sys::spdk_get_thread() };
        if thread.is_null() {
            return;
        }
        // SAFETY: a zeroed spdk_thread_stats (two integers) is valid.
        let mut st: spdk_sys::spdk_thread_stats = unsafe { std::mem::zeroed() };
        // SAFETY: on an SPDK thread (the one whose stats are read); `st` is writable.
        let rc = unsafe { spdk_sys::spdk_thread_get_stats(&mut st) };
        if rc != 0 {
            return;
        }
        // SAFETY: `thread` is the live current thread; its name lives as long as it does.
        let name = from_c(unsafe { spdk_sys::spdk_thread_get_name(thread) });
        // SAFETY: as above; reads the thread's id.
        let id = unsafe { spdk_sys::spdk_thread_get_id(thread) };
        walk.out.push(ThreadStats {
            name,
            id,
            busy_ticks: st.busy_tsc,
            idle_ticks: st.idle_tsc,
        });
    });
}

/// Runs once on the originating thread after every thread was visited (or right away when
/// SPDK could not start the walk).
///
/// # Safety
/// `arg` must be the `Box<Walk>` leaked by [`threads`]; it is reclaimed here, once.
unsafe extern "C" fn on_done(arg: *mut c_void) {
    no_unwind("on_done", || {
        // SAFETY: the caller's contract: SPDK calls the completion exactly once, after the
        // last `on_thread`, so the `Walk` is reclaimed exactly once.
        let walk = unsafe { Box::from_raw(arg.cast::<Walk>()) };
        // SAFETY: a pure read of the TSC rate.
        let ticks_hz = unsafe { spdk_sys::spdk_get_ticks_hz() };
        walk.reply.send(Ok(RuntimeStats {
            threads: walk.out,
            ticks_hz,
        }));
    });
}

/// Busy and idle time of every SPDK thread (one message per thread; no reactor blocks).
pub async fn threads() -> Result<RuntimeStats> {
    exec(|reply| {
        let walk = Box::into_raw(Box::new(Walk {
            out: Vec::new(),
            reply,
        }))
        .cast::<c_void>();
        // SAFETY: on the application thread (an SPDK thread, as the walk requires); `walk` is
        // owned by SPDK until `on_done` runs once, which SPDK guarantees even on failure.
        unsafe { spdk_sys::spdk_for_each_thread(Some(on_thread), walk, Some(on_done)) };
    })
    .await
}
