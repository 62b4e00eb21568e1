//! The SPDK runtime: SPDK's application framework and reactors on dedicated threads, and an
//! async handle that runs typed requests on SPDK's application thread.
//!
//! Threading: `spdk_app_start` runs on a thread of ours ("spdk-main"), which becomes the
//! first reactor; the other cores of the mask get reactor threads of SPDK's own. Every
//! request is a closure queued for SPDK's application thread (see `inbox`) and
//! answered through a oneshot channel; completions that arrive after the caller went away
//! are dropped on the reactor without touching freed memory (the boxed callback context is
//! owned by SPDK until its one call).
//!
//! This file starts and stops the framework ([`Spdk`]); the rest is in rooms of its own,
//! each below this one and none importing it back (their public names are re-exported
//! here, so `runtime::…` paths stay as they were):
//! - `options`: [`SpdkOptions`], their checks and SPDK's start-up JSON config;
//! - `health`: deadlines, request times, stuck requests, caught panics (counters only);
//! - `reactor`: the [`Reactor`] token and `no_unwind`, the ground the others stand on;
//! - `inbox`: the queue to the application thread, its wake-up, and `send_task`;
//! - `watchdog`: the thread that keeps the requests' deadlines;
//! - `request`: one round trip, [`exec`] and [`on_reactor`] and their [`Reply`];
//! - `ffi`: callback contexts and trampolines, C strings.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::error::{Result, SpdkError};

mod ffi;
mod health;
mod inbox;
mod options;
mod reactor;
mod request;
mod watchdog;

pub(crate) use ffi::{
    cstr, drop_errno_ctx, errno_cb, errno_ctx, from_c, from_c_array, handle_cb, handle_ctx,
};
pub use health::{
    RequestTimes, StuckRequest, caught_panics, queue_state, request_timeout, set_stuck_observer,
    stuck_requests, take_request_times, timed_out_requests,
};
pub(crate) use inbox::send_task;
pub use options::{DEFAULT_REACTOR_NICE, DEFAULT_REQUEST_TIMEOUT, SpdkOptions};
pub use reactor::Reactor;
pub(crate) use reactor::no_unwind;
pub use request::{Reply, exec, on_reactor};
pub(crate) use request::{exec_on, on_reactor_with};

use inbox::set_app_thread;
use options::startup_config;

/// True while an SPDK runtime exists in this process (SPDK allows one at a time).
static RUNNING: AtomicBool = AtomicBool::new(false);

/// How long [`Spdk::stop`] (and so dropping an [`Spdk`]) waits for SPDK to finish: unloading
/// lvstores writes their metadata, which takes well under a second on a healthy disk.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// `Ok` once the framework is up; `Err(rc)` when `spdk_app_start` returned first.
type ReadySender = std::sync::mpsc::Sender<std::result::Result<(), i32>>;

struct StartCtx {
    ready: ReadySender,
    /// Nice value to give the application thread (0: leave it).
    nice: i32,
}

/// Gives the calling thread the nice value `nice`; logs once when the process may not
/// (no CAP_SYS_NICE): SPDK runs as before.
fn set_thread_nice(nice: i32) {
    // SAFETY: gettid has no preconditions and cannot fail.
    let tid = unsafe { libc::gettid() };
    let Ok(id) = libc::id_t::try_from(tid) else {
        return;
    };
    // SAFETY: setpriority only reads its arguments; PRIO_PROCESS with a thread id changes
    // that one thread (Linux), here the calling thread.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, id, nice) };
    if rc == 0 {
        tracing::info!(
            nice,
            "the SPDK application thread's reactor runs at a raised priority"
        );
    } else {
        tracing::warn!(
            nice,
            error = %std::io::Error::last_os_error(),
            "cannot raise the SPDK reactor's priority (needs CAP_SYS_NICE); requests may wait behind the process's other threads when the core is busy"
        );
    }
}

extern "C" fn on_started(arg: *mut c_void) {
    no_unwind("on_started", || {
        // SAFETY: `arg` is the `StartCtx` that `run_framework` owns and frees only after
        // spdk_app_start returned; SPDK calls the start function at most once, during that
        // call, on the application thread.
        let ctx = unsafe { &*arg.cast::<StartCtx>() };
        // SAFETY: called on an SPDK thread; returns that thread.
        let thread = unsafe { spdk_sys::spdk_get_thread() };
        if ctx.nice != 0 {
            set_thread_nice(ctx.nice);
        }
        if let Err(rc) = inbox::open() {
            tracing::error!(
                rc,
                "SPDK cannot take requests: registering their wake-up failed"
            );
            let _ = ctx.ready.send(Err(rc));
            // SAFETY: called on SPDK's application thread while the framework runs.
            unsafe { spdk_sys::spdk_app_stop(rc) };
            return;
        }
        set_app_thread(thread as usize);
        let _ = ctx.ready.send(Ok(()));
    });
}

/// One run of SPDK's framework, executed by the SPDK main thread.
struct Job {
    opts: SpdkOptions,
    ready: ReadySender,
    done: std::sync::mpsc::Sender<i32>,
}

/// The process's SPDK main thread. DPDK binds its main lcore to the thread that first
/// initialised the environment, so every run of the framework (a restart included) must
/// happen on that same thread: it lives for the whole process and takes jobs.
fn main_thread() -> Result<&'static Mutex<std::sync::mpsc::Sender<Job>>> {
    static MAIN: std::sync::OnceLock<Mutex<std::sync::mpsc::Sender<Job>>> =
        std::sync::OnceLock::new();
    if let Some(m) = MAIN.get() {
        return Ok(m);
    }
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("spdk-main".into())
        .spawn(move || {
            for job in rx {
                let rc = run_framework(&job.opts, job.ready.clone());
                // A framework that failed before it was ready never called `on_started`
                // (its context, holding the other sender, is leaked): say so here, or
                // `Spdk::start` would wait forever.
                let _ = job.ready.send(Err(rc));
                let _ = job.done.send(rc);
            }
        })
        .map_err(|e| SpdkError::Start(format!("cannot spawn the SPDK thread: {e}")))?;
    Ok(MAIN.get_or_init(|| Mutex::new(tx)))
}

/// Run SPDK's framework on this thread until `spdk_app_stop`; returns its exit code.
fn run_framework(opts: &SpdkOptions, ready: ReadySender) -> i32 {
    let strings = (|| -> Result<_> {
        let rpc = opts
            .rpc_socket
            .as_ref()
            .map(|p| cstr("rpc_socket", &p.to_string_lossy()))
            .transpose()?;
        let huge_dir = opts
            .huge_dir
            .as_ref()
            .map(|p| cstr("huge_dir", &p.to_string_lossy()))
            .transpose()?;
        Ok((
            cstr("name", &opts.name)?,
            cstr("core_mask", opts.core_mask.trim())?,
            rpc,
            huge_dir,
        ))
    })();
    let Ok((name, mask, rpc, huge_dir)) = strings else {
        return -22;
    };
    // SAFETY: spdk_app_opts is a plain C struct; zeroed is a valid starting state that
    // spdk_app_opts_init overwrites with defaults.
    let mut o: spdk_sys::spdk_app_opts = unsafe { std::mem::zeroed() };
    // SAFETY: `o` is a valid, writable spdk_app_opts of the size we pass.
    unsafe { spdk_sys::spdk_app_opts_init(&mut o, std::mem::size_of::<spdk_sys::spdk_app_opts>()) };
    o.name = name.as_ptr();
    o.reactor_mask = mask.as_ptr();
    o.rpc_addr = rpc.as_ref().map_or(std::ptr::null(), |r| r.as_ptr());
    o.interrupt_mode = opts.interrupt_mode;
    o.no_huge = opts.no_huge;
    o.hugedir = huge_dir.as_ref().map_or(std::ptr::null(), |d| d.as_ptr());
    if opts.mem_size_mb > 0 {
        o.mem_size = i32::try_from(opts.mem_size_mb).unwrap_or(i32::MAX);
    }
    o.no_pci = opts.no_pci;
    o.num_entries = opts.trace_entries;
    o.disable_signal_handlers = true;
    o.disable_cpumask_locks = !opts.lock_cores;
    o.print_level = spdk_sys::SPDK_LOG_WARN;
    // Start-up settings of SPDK's own subsystems go through its JSON config (SPDK copies it).
    let config = startup_config(opts);
    o.json_data = config.as_ptr().cast_mut().cast::<c_void>();
    o.json_data_size = config.len();
    let nice = if opts.interrupt_mode {
        opts.reactor_nice
    } else {
        0
    };
    // SPDK sets its RPC state to "runtime" once started and never back: a framework started
    // again in this process would skip the start-up methods of its JSON config (the bdev
    // options, the NVMe-oF target's limits) without a word.
    // SAFETY: no framework runs on this process now (`Spdk::start` allows one at a time and
    // this thread runs them in turn); the setter only stores the state.
    unsafe { spdk_sys::spdk_rpc_set_state(spdk_sys::SPDK_RPC_STARTUP) };
    let ctx = Box::into_raw(Box::new(StartCtx { ready, nice })).cast::<c_void>();
    // SAFETY: `o` and the strings it points to outlive spdk_app_start, which runs the
    // framework on this thread until spdk_app_stop; `ctx` stays valid for the whole call.
    let rc = unsafe { spdk_sys::spdk_app_start(&mut o, Some(on_started), ctx) };
    // Freed here, not in `on_started`: when SPDK fails before starting (a core held by another
    // SPDK process, no memory) it never calls `on_started`, and the `ready` sender must be
    // dropped so that `Spdk::start` stops waiting and reports the exit code.
    // SAFETY: `ctx` came from Box::into_raw above; SPDK no longer uses it after returning.
    drop(unsafe { Box::from_raw(ctx.cast::<StartCtx>()) });
    // Already cleared by `Spdk::stop`; this covers a framework that ended by itself.
    set_app_thread(0);
    inbox::refuse_queued();
    // SAFETY: spdk_app_start returned; spdk_app_fini releases the framework on the thread
    // that ran it.
    unsafe { spdk_sys::spdk_app_fini() };
    rc
}

/// A running SPDK runtime. Dropping it stops SPDK (see [`Spdk::stop`]).
pub struct Spdk {
    done: Mutex<Option<std::sync::mpsc::Receiver<i32>>>,
}

impl std::fmt::Debug for Spdk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spdk").finish_non_exhaustive()
    }
}

impl Spdk {
    /// Start SPDK's framework (environment, reactors, bdev and NVMe-oF subsystems). Blocks
    /// until SPDK is ready; call it from a blocking context (`spawn_blocking`) in async code.
    /// SPDK's own signal handlers are disabled: the agent owns SIGTERM and calls `stop`.
    ///
    /// A process may start SPDK again after [`Spdk::stop`]; the environment options (core
    /// mask, memory) of the first start stay in force, as DPDK cannot be initialised twice.
    pub fn start(opts: &SpdkOptions) -> Result<Self> {
        opts.validate()?;
        if RUNNING.swap(true, Ordering::AcqRel) {
            return Err(SpdkError::Start(
                "an SPDK runtime is already running in this process".into(),
            ));
        }
        health::set_request_timeout(opts.request_timeout);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let job = Job {
            opts: opts.clone(),
            ready: ready_tx,
            done: done_tx,
        };
        let sent = main_thread().and_then(|m| {
            m.lock()
                .map_err(|_| SpdkError::Start("the SPDK thread is poisoned".into()))?
                .send(job)
                .map_err(|_| SpdkError::Start("the SPDK thread is gone".into()))
        });
        if let Err(e) = sent {
            RUNNING.store(false, Ordering::Release);
            return Err(e);
        }
        if !matches!(ready_rx.recv(), Ok(Ok(()))) {
            let rc = done_rx.recv().unwrap_or(-1);
            RUNNING.store(false, Ordering::Release);
            return Err(SpdkError::Start(format!(
                "spdk_app_start returned {rc} before the framework was ready (see SPDK's log above: core mask, memory, sockets)"
            )));
        }
        Ok(Self {
            done: Mutex::new(Some(done_rx)),
        })
    }

    /// Orderly shutdown: SPDK finishes its subsystems (NVMe-oF listeners and subsystems
    /// removed, lvstores unloaded cleanly, bdevs closed) and the reactors stop. Blocks until
    /// done, at most [`STOP_TIMEOUT`] (then logs and returns: SPDK goes on stopping on its
    /// own threads). Idempotent. Call it from a blocking context in async code.
    pub fn stop(&self) {
        if let Err(e) = self.stop_within(STOP_TIMEOUT) {
            tracing::error!(error = %e, "SPDK did not stop in time; leaving it to finish on its own threads");
        }
    }

    /// [`Spdk::stop`], waiting at most `limit`: [`SpdkError::Timeout`] when SPDK has not
    /// finished by then (a later call waits again). Idempotent once it succeeded.
    pub fn stop_within(&self, limit: Duration) -> Result<()> {
        let mut guard = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(done) = guard.take() else {
            return Ok(());
        };
        // The framework stops through a message to its own thread, which first stops taking
        // requests: from then on `send_task` refuses them, and those already queued are
        // refused when they run (see `APP_THREAD`). A second call finds it cleared already.
        let _ = send_task(Box::new(|_: &Reactor| {
            set_app_thread(0);
            inbox::close();
            // SAFETY: called on SPDK's application thread while the framework runs.
            unsafe { spdk_sys::spdk_app_stop(0) };
        }));
        match done.recv_timeout(limit) {
            Ok(_) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                RUNNING.store(false, Ordering::Release);
                Ok(())
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                *guard = Some(done);
                Err(SpdkError::Timeout {
                    request: "Spdk::stop".into(),
                    after: limit,
                })
            }
        }
    }

    /// SPDK's version (`v26.05.0`), as compiled in.
    pub fn version() -> String {
        // SAFETY: a pure function of compile-time constants.
        let v = unsafe { spdk_sys::liteio_spdk_version_compiled() };
        format!("v{}.{:02}.{}", v / 10000, v / 100 % 100, v % 100)
    }
}

impl Drop for Spdk {
    fn drop(&mut self) {
        self.stop();
    }
}
