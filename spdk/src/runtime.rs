//! The SPDK runtime: SPDK's application framework and reactors on dedicated threads, and an
//! async handle that runs typed requests on SPDK's application thread.
//!
//! Threading: `spdk_app_start` runs on a thread of ours ("spdk-main"), which becomes the
//! first reactor; the other cores of the mask get reactor threads of SPDK's own. Every
//! request is a closure sent with `spdk_thread_send_msg` to SPDK's application thread and
//! answered through a oneshot channel; completions that arrive after the caller went away
//! are dropped on the reactor without touching freed memory (the boxed callback context is
//! owned by SPDK until its one call).

use std::ffi::{CString, c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::oneshot;

use super::error::{Result, SpdkError};

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
    /// Memory SPDK reserves, in MiB (required with `no_huge`; 0 = SPDK's default).
    pub mem_size_mb: u32,
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
}

impl Default for SpdkOptions {
    fn default() -> Self {
        Self {
            name: "liteio-agent".into(),
            core_mask: "0x1".into(),
            interrupt_mode: true,
            no_huge: false,
            mem_size_mb: 0,
            no_pci: true,
            rpc_socket: None,
            trace_entries: 0,
            lock_cores: true,
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

    fn validate(&self) -> Result<()> {
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
        if self.name.is_empty() || self.name.contains('\0') {
            return Err(SpdkError::InvalidArgument {
                field: "name",
                reason: "must be a non-empty string without NUL".into(),
            });
        }
        Ok(())
    }
}

/// True while an SPDK runtime exists in this process (SPDK allows one at a time).
static RUNNING: AtomicBool = AtomicBool::new(false);
/// SPDK's application thread (`*mut spdk_thread`) while running, else 0.
static APP_THREAD: AtomicUsize = AtomicUsize::new(0);

type Task = Box<dyn FnOnce() + Send>;

/// Runs a boxed task on the SPDK thread that received it.
extern "C" fn run_task(arg: *mut c_void) {
    // SAFETY: `arg` is the pointer `send_task` leaked from a `Box<Task>`; SPDK calls this
    // function exactly once per message, so the box is reclaimed exactly once.
    let task = unsafe { Box::from_raw(arg.cast::<Task>()) };
    task();
}

/// Send `task` to SPDK's application thread.
pub(crate) fn send_task(task: Task) -> Result<()> {
    let thread = APP_THREAD.load(Ordering::Acquire);
    if thread == 0 {
        return Err(SpdkError::NotRunning);
    }
    let arg = Box::into_raw(Box::new(task)).cast::<c_void>();
    // SAFETY: `thread` is SPDK's live application thread (cleared before the framework
    // stops); spdk_thread_send_msg is safe to call from any thread and takes ownership of
    // `arg` only when it returns 0.
    let rc = unsafe {
        spdk_sys::spdk_thread_send_msg(thread as *const spdk_sys::spdk_thread, Some(run_task), arg)
    };
    if rc != 0 {
        // SAFETY: SPDK rejected the message, so `arg` is still ours and was never run.
        drop(unsafe { Box::from_raw(arg.cast::<Task>()) });
        return Err(SpdkError::errno("send message", "app thread", rc));
    }
    Ok(())
}

/// Where a request's answer goes. Dropping it without [`Reply::send`] makes the caller see
/// [`SpdkError::NotRunning`].
pub struct Reply<T>(oneshot::Sender<Result<T>>);

impl<T> Reply<T> {
    /// Deliver the answer; ignored when the caller stopped waiting.
    pub fn send(self, value: Result<T>) {
        let _ = self.0.send(value);
    }
}

/// Run `f` on SPDK's application thread and await the answer it sends through its [`Reply`],
/// possibly later from an SPDK completion callback.
pub async fn exec<T: Send + 'static>(f: impl FnOnce(Reply<T>) + Send + 'static) -> Result<T> {
    let (tx, rx) = oneshot::channel();
    send_task(Box::new(move || f(Reply(tx))))?;
    rx.await.map_err(|_| SpdkError::NotRunning)?
}

/// Run a synchronous `f` on SPDK's application thread and return its result.
pub async fn on_reactor<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    exec(move |reply| reply.send(f())).await
}

// ---- completion callbacks -------------------------------------------------------------

type ErrnoFn = Box<dyn FnOnce(i32)>;

/// A context for an SPDK callback of shape `(void *arg, int rc)`: pass the returned pointer as
/// `cb_arg` and [`errno_cb`] as the function. If SPDK rejects the call synchronously and never
/// calls back, reclaim it with [`drop_errno_ctx`].
pub(crate) fn errno_ctx(f: impl FnOnce(i32) + 'static) -> *mut c_void {
    Box::into_raw(Box::new(Box::new(f) as ErrnoFn)).cast()
}

/// SPDK callback trampoline for [`errno_ctx`].
pub(crate) extern "C" fn errno_cb(arg: *mut c_void, rc: c_int) {
    // SAFETY: `arg` came from `errno_ctx` and SPDK calls each callback once.
    let f = unsafe { Box::from_raw(arg.cast::<ErrnoFn>()) };
    f(rc);
}

/// Reclaim a context SPDK did not take.
pub(crate) fn drop_errno_ctx(arg: *mut c_void) {
    // SAFETY: the caller owns `arg` (SPDK returned an error and will not call back).
    drop(unsafe { Box::from_raw(arg.cast::<ErrnoFn>()) });
}

type HandleFn<H> = Box<dyn FnOnce(*mut H, i32)>;

/// A context for an SPDK callback of shape `(void *arg, T *handle, int rc)`.
pub(crate) fn handle_ctx<H: 'static>(f: impl FnOnce(*mut H, i32) + 'static) -> *mut c_void {
    Box::into_raw(Box::new(Box::new(f) as HandleFn<H>)).cast()
}

/// SPDK callback trampoline for [`handle_ctx`].
pub(crate) extern "C" fn handle_cb<H: 'static>(arg: *mut c_void, handle: *mut H, rc: c_int) {
    // SAFETY: `arg` came from `handle_ctx::<H>` and SPDK calls each callback once.
    let f = unsafe { Box::from_raw(arg.cast::<HandleFn<H>>()) };
    f(handle, rc);
}

/// A C string for SPDK, or an error naming the field when `s` holds a NUL.
pub(crate) fn cstr(field: &'static str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| SpdkError::InvalidArgument {
        field,
        reason: format!("{s:?} contains a NUL byte"),
    })
}

/// A Rust string from a C string SPDK owns (empty for NULL).
pub(crate) fn from_c(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: SPDK returns NUL-terminated strings that live at least as long as the object
    // they describe, which is alive during this call on the reactor.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// A Rust string from a fixed-size C char array.
pub(crate) fn from_c_array(a: &[c_char]) -> String {
    let bytes: Vec<u8> = a
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

// ---- start and stop -------------------------------------------------------------------

/// `Ok` once the framework is up; `Err(rc)` when `spdk_app_start` returned first.
type ReadySender = std::sync::mpsc::Sender<std::result::Result<(), i32>>;

struct StartCtx {
    ready: ReadySender,
}

extern "C" fn on_started(arg: *mut c_void) {
    // SAFETY: `arg` is the `StartCtx` that `run_framework` owns and frees only after
    // spdk_app_start returned; SPDK calls the start function at most once, during that call,
    // on the application thread.
    let ctx = unsafe { &*arg.cast::<StartCtx>() };
    // SAFETY: called on an SPDK thread; returns that thread.
    let thread = unsafe { spdk_sys::spdk_get_thread() };
    APP_THREAD.store(thread as usize, Ordering::Release);
    let _ = ctx.ready.send(Ok(()));
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
        Ok((
            cstr("name", &opts.name)?,
            cstr("core_mask", opts.core_mask.trim())?,
            rpc,
        ))
    })();
    let Ok((name, mask, rpc)) = strings else {
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
    if opts.mem_size_mb > 0 {
        o.mem_size = i32::try_from(opts.mem_size_mb).unwrap_or(i32::MAX);
    }
    o.no_pci = opts.no_pci;
    o.num_entries = opts.trace_entries;
    o.disable_signal_handlers = true;
    o.disable_cpumask_locks = !opts.lock_cores;
    o.print_level = spdk_sys::SPDK_LOG_WARN;
    let ctx = Box::into_raw(Box::new(StartCtx { ready })).cast::<c_void>();
    // SAFETY: `o` and the strings it points to outlive spdk_app_start, which runs the
    // framework on this thread until spdk_app_stop; `ctx` stays valid for the whole call.
    let rc = unsafe { spdk_sys::spdk_app_start(&mut o, Some(on_started), ctx) };
    // Freed here, not in `on_started`: when SPDK fails before starting (a core held by another
    // SPDK process, no memory) it never calls `on_started`, and the `ready` sender must be
    // dropped so that `Spdk::start` stops waiting and reports the exit code.
    // SAFETY: `ctx` came from Box::into_raw above; SPDK no longer uses it after returning.
    drop(unsafe { Box::from_raw(ctx.cast::<StartCtx>()) });
    APP_THREAD.store(0, Ordering::Release);
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
    /// done. Idempotent.
    pub fn stop(&self) {
        let Some(done) = self.done.lock().ok().and_then(|mut m| m.take()) else {
            return;
        };
        // The framework stops through a message to its own thread.
        let _ = send_task(Box::new(|| {
            // SAFETY: called on SPDK's application thread while the framework runs.
            unsafe { spdk_sys::spdk_app_stop(0) };
        }));
        let _ = done.recv();
        RUNNING.store(false, Ordering::Release);
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
