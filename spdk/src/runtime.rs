//! The SPDK runtime: SPDK's application framework and reactors on dedicated threads, and an
//! async handle that runs typed requests on SPDK's application thread.
//!
//! Threading: `spdk_app_start` runs on a thread of ours ("spdk-main"), which becomes the
//! first reactor; the other cores of the mask get reactor threads of SPDK's own. Every
//! request is a closure queued for SPDK's application thread (see `inbox`) and
//! answered through a oneshot channel; completions that arrive after the caller went away
//! are dropped on the reactor without touching freed memory (the boxed callback context is
//! owned by SPDK until its one call).

use std::collections::BTreeMap;
use std::ffi::{CString, c_char, c_int, c_void};
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, Location};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::dhchap::DhGroup;
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

/// True while an SPDK runtime exists in this process (SPDK allows one at a time).
static RUNNING: AtomicBool = AtomicBool::new(false);

/// SPDK's application thread (`*mut spdk_thread`) while it takes requests, else 0.
///
/// Senders hold the read lock while they queue a request and wake the thread;
/// [`Spdk::stop`] clears it under the write lock on the application thread itself, *before*
/// `spdk_app_stop`, and then closes the queue. So a request is either queued before the stop
/// began (and refused when its turn comes or when the queue closes) or refused by
/// [`send_task`]: no sender ever wakes a thread that is gone.
static APP_THREAD: RwLock<usize> = RwLock::new(0);

fn app_thread_read() -> std::sync::RwLockReadGuard<'static, usize> {
    APP_THREAD.read().unwrap_or_else(PoisonError::into_inner)
}

fn set_app_thread(thread: usize) {
    *APP_THREAD.write().unwrap_or_else(PoisonError::into_inner) = thread;
}

/// How long a caller waits for SPDK's answer by default: [`SpdkOptions::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long [`Spdk::stop`] (and so dropping an [`Spdk`]) waits for SPDK to finish: unloading
/// lvstores writes their metadata, which takes well under a second on a healthy disk.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// The deadline of every request, in milliseconds (set from the options at start).
static REQUEST_TIMEOUT_MS: AtomicU64 = AtomicU64::new(30_000);
/// Requests that got no answer within their deadline, since the process started.
static TIMED_OUT: AtomicU64 = AtomicU64::new(0);
/// Panics caught on SPDK threads, since the process started.
static PANICKED: AtomicU64 = AtomicU64::new(0);

/// The deadline of each request in force.
pub fn request_timeout() -> Duration {
    Duration::from_millis(REQUEST_TIMEOUT_MS.load(Ordering::Relaxed))
}

/// Requests that got no answer within their deadline since the process started (a metric:
/// each one is also logged with the code that sent it).
pub fn timed_out_requests() -> u64 {
    TIMED_OUT.load(Ordering::Relaxed)
}

/// Panics caught on SPDK threads since the process started (each one failed its request and
/// was logged).
pub fn caught_panics() -> u64 {
    PANICKED.load(Ordering::Relaxed)
}

/// Where requests spent their time, summed since the last [`take_request_times`]: waiting
/// in the application thread's message queue, running there, and from sending to the answer
/// (which adds the SPDK operations the request started and their completions). Tells a busy
/// reactor (long waits) from a slow request (long runs) from slow I/O below SPDK (long
/// answers after short runs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestTimes {
    /// Requests that ran.
    pub count: u64,
    /// Total wait in the queue.
    pub wait_total: Duration,
    /// Longest wait in the queue.
    pub wait_max: Duration,
    /// Total time running on the application thread.
    pub run_total: Duration,
    /// Longest run.
    pub run_max: Duration,
    /// The code (`file:line:column`) of the longest run.
    pub run_max_request: String,
    /// Total time from sending to the answer (answered requests).
    pub answer_total: Duration,
    /// Longest time from sending to the answer.
    pub answer_max: Duration,
    /// The code of the slowest answer.
    pub answer_max_request: String,
}

/// Nanosecond sums and maxima behind [`RequestTimes`].
struct TimeSums {
    count: AtomicU64,
    wait_total: AtomicU64,
    wait_max: AtomicU64,
    run_total: AtomicU64,
    run_max: AtomicU64,
    answer_total: AtomicU64,
    answer_max: AtomicU64,
}

static TIMES: TimeSums = TimeSums {
    count: AtomicU64::new(0),
    wait_total: AtomicU64::new(0),
    wait_max: AtomicU64::new(0),
    run_total: AtomicU64::new(0),
    run_max: AtomicU64::new(0),
    answer_total: AtomicU64::new(0),
    answer_max: AtomicU64::new(0),
};
/// The code of the longest run and of the slowest answer so far (updated only on a new
/// maximum, which is rare).
static SLOWEST: Mutex<(
    Option<&'static Location<'static>>,
    Option<&'static Location<'static>>,
)> = Mutex::new((None, None));

/// Requests sent and not yet started on the application thread.
static QUEUED: AtomicU64 = AtomicU64::new(0);
/// When the application thread last started a request, in nanoseconds since [`epoch`].
static LAST_START: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Requests waiting in the application thread's queue now, and how long ago the thread last
/// started one: a long time with requests waiting means the thread is held by something
/// else (a benchmark samples what, from /proc).
pub fn queue_state() -> (u64, Duration) {
    let last = Duration::from_nanos(LAST_START.load(Ordering::Relaxed));
    (
        QUEUED.load(Ordering::Relaxed),
        epoch().elapsed().saturating_sub(last),
    )
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn note_wait_and_run(wait: Duration, run: Duration, caller: &'static Location<'static>) {
    TIMES.count.fetch_add(1, Ordering::Relaxed);
    TIMES.wait_total.fetch_add(nanos(wait), Ordering::Relaxed);
    TIMES.wait_max.fetch_max(nanos(wait), Ordering::Relaxed);
    TIMES.run_total.fetch_add(nanos(run), Ordering::Relaxed);
    if TIMES.run_max.fetch_max(nanos(run), Ordering::Relaxed) < nanos(run) {
        SLOWEST.lock().unwrap_or_else(PoisonError::into_inner).0 = Some(caller);
    }
}

fn note_answer(answer: Duration, caller: &'static Location<'static>) {
    TIMES
        .answer_total
        .fetch_add(nanos(answer), Ordering::Relaxed);
    if TIMES.answer_max.fetch_max(nanos(answer), Ordering::Relaxed) < nanos(answer) {
        SLOWEST.lock().unwrap_or_else(PoisonError::into_inner).1 = Some(caller);
    }
}

/// The request times since the last call (or the start), and start again from zero.
pub fn take_request_times() -> RequestTimes {
    let d = |a: &AtomicU64| Duration::from_nanos(a.swap(0, Ordering::Relaxed));
    let (run_at, answer_at) =
        std::mem::take(&mut *SLOWEST.lock().unwrap_or_else(PoisonError::into_inner));
    let name = |l: Option<&Location<'_>>| l.map(ToString::to_string).unwrap_or_default();
    RequestTimes {
        count: TIMES.count.swap(0, Ordering::Relaxed),
        wait_total: d(&TIMES.wait_total),
        wait_max: d(&TIMES.wait_max),
        run_total: d(&TIMES.run_total),
        run_max: d(&TIMES.run_max),
        run_max_request: name(run_at),
        answer_total: d(&TIMES.answer_total),
        answer_max: d(&TIMES.answer_max),
        answer_max_request: name(answer_at),
    }
}

/// A request whose deadline passed and which has not been answered since: its caller got
/// [`SpdkError::Timeout`], and SPDK still holds it (a reactor stuck in it, or a completion
/// that never comes). It leaves the list when the late answer comes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StuckRequest {
    /// The code that sent it (`file:line:column`).
    pub request: String,
    /// How long it has been waiting.
    pub waiting: Duration,
}

/// Requests past their deadline and still unanswered, by an id of their own.
static STUCK: Mutex<BTreeMap<u64, (String, Instant)>> = Mutex::new(BTreeMap::new());
static STUCK_IDS: AtomicU64 = AtomicU64::new(0);
/// Called whenever [`stuck_requests`] changes.
static STUCK_OBSERVER: OnceLock<Box<dyn Fn() + Send + Sync>> = OnceLock::new();

/// The requests stuck right now, the longest-waiting first (empty when SPDK answers
/// everything in time). A health check reports them: the agent turns them into its pool's
/// `Spdk` condition.
pub fn stuck_requests() -> Vec<StuckRequest> {
    let now = Instant::now();
    let mut v: Vec<StuckRequest> = STUCK
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .values()
        .map(|(request, since)| StuckRequest {
            request: request.clone(),
            waiting: now.saturating_duration_since(*since),
        })
        .collect();
    v.sort_by_key(|r| std::cmp::Reverse(r.waiting));
    v
}

/// Have `f` called whenever a request becomes stuck or a stuck one is answered (at most one
/// observer per process; later calls are ignored and return false). `f` runs on SPDK's or
/// the deadline thread: it must only signal, e.g. wake a task.
pub fn set_stuck_observer(f: impl Fn() + Send + Sync + 'static) -> bool {
    STUCK_OBSERVER.set(Box::new(f)).is_ok()
}

fn stuck_changed() {
    if let Some(f) = STUCK_OBSERVER.get() {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(f));
    }
}

/// Run `f`, the body of an `extern "C"` function SPDK calls, without letting a panic unwind
/// into C (that would abort the process and every export on the node). A [`Reply`] dropped
/// by the unwinding answers its caller with [`SpdkError::Panicked`].
/// Returns what `f` returned, `None` when it panicked.
pub(crate) fn no_unwind<R>(callback: &'static str, f: impl FnOnce() -> R) -> Option<R> {
    let payload = match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => return Some(r),
        Err(payload) => payload,
    };
    PANICKED.fetch_add(1, Ordering::Relaxed);
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string payload".into());
    tracing::error!(
        callback,
        panic = %message,
        "a panic on the SPDK thread was caught; its request failed and SPDK goes on"
    );
    // Dropping the payload runs foreign code too.
    let _ = std::panic::catch_unwind(AssertUnwindSafe(move || drop(payload)));
    None
}

/// Proof that the code holding it runs on an SPDK thread, inside a request or a completion
/// callback: functions that must run there (lookups by name, reading SPDK objects) take a
/// `&Reactor`. Only the runtime makes one, in the trampolines SPDK calls; it is `!Send` and
/// `!Sync` and handed out by reference for the duration of one call, so it cannot leave the
/// thread or outlive the call.
#[derive(Debug)]
pub struct Reactor {
    _on_spdk_thread: PhantomData<*const ()>,
}

impl Reactor {
    /// # Safety
    /// The caller must be running on an SPDK thread (called by SPDK: a message or a
    /// completion callback), and must lend the token only for the duration of that call.
    unsafe fn new() -> Self {
        Self {
            _on_spdk_thread: PhantomData,
        }
    }
}

// `Reactor` must stay `!Send` and `!Sync` (checked at compile time: the trait item below is
// ambiguous, and so an error, as soon as either is implemented).
const _: fn() = || {
    trait AmbiguousIfSendOrSync<A> {
        fn some_item() {}
    }
    impl<T: ?Sized> AmbiguousIfSendOrSync<()> for T {}
    impl<T: ?Sized + Send> AmbiguousIfSendOrSync<u8> for T {}
    impl<T: ?Sized + Sync> AmbiguousIfSendOrSync<u16> for T {}
    let _ = <Reactor as AmbiguousIfSendOrSync<_>>::some_item;
};

type Task = Box<dyn FnOnce(&Reactor) + Send>;

/// Requests for SPDK's application thread, oldest first, and how that thread is woken.
///
/// Callers do not use `spdk_thread_send_msg` themselves: SPDK's message queue is DPDK's
/// multi-producer ring, where each producer waits, spinning, until every earlier producer has
/// finished its enqueue. A caller thread preempted halfway through one held up the reactor,
/// which queues messages to its own thread all the time (nvmf and blobstore completions),
/// spinning on its core until that caller ran again: 0.1 to 2.7 s in bursts of 200 volumes
/// on two cores (perf: the reactor thread in `spdk_ring_enqueue`). Here a preempted caller
/// holds at worst this mutex, on which the reactor sleeps and so hands the core to it.
mod inbox {
    use std::collections::VecDeque;
    use std::ffi::{c_int, c_void};
    use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
    use std::sync::{Mutex, PoisonError};

    use super::{Reactor, Task, app_thread_read, no_unwind};

    /// Requests queued and not yet taken by the application thread.
    static QUEUE: Mutex<VecDeque<Task>> = Mutex::new(VecDeque::new());
    /// Set when a request was queued since the application thread last looked; the caller
    /// that sets it wakes the thread, so a burst costs one wake-up.
    static PENDING: AtomicBool = AtomicBool::new(false);
    /// The eventfd that wakes the application thread in interrupt mode; -1 when the process
    /// polls or SPDK is not running.
    static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
    /// The registered `spdk_interrupt` (interrupt mode only) and `spdk_poller`, 0 when none;
    /// touched on the application thread only.
    static INTERRUPT: AtomicUsize = AtomicUsize::new(0);
    static POLLER: AtomicUsize = AtomicUsize::new(0);
    /// Requests run per turn, so that SPDK's own messages and pollers run between batches.
    const BATCH: usize = 64;

    /// Start taking requests; on SPDK's application thread, before it is published.
    /// Returns a negative errno when SPDK or the kernel refuses.
    ///
    /// Two ways in, because the thread may run either way: a poller, run on every iteration
    /// while the thread polls, and in interrupt mode an eventfd that wakes the thread while it
    /// sleeps. (A framework restarted in the same process polls its application thread even
    /// in interrupt mode, so the mode of the process does not tell.)
    pub(super) fn open() -> Result<(), i32> {
        PENDING.store(false, Ordering::Release);
        // SAFETY: called on an SPDK thread; a period of 0 runs the poller on every iteration
        // of the thread while it polls.
        let poller = unsafe {
            spdk_sys::spdk_poller_register_named(
                Some(on_poll),
                std::ptr::null_mut(),
                0,
                c"liteio_requests".as_ptr(),
            )
        };
        if poller.is_null() {
            return Err(-libc::ENOMEM);
        }
        POLLER.store(poller as usize, Ordering::Relaxed);
        // SAFETY: a pure query of SPDK's global mode.
        if !unsafe { spdk_sys::spdk_interrupt_mode_is_enabled() } {
            return Ok(());
        }
        // In interrupt mode SPDK would run a period-0 poller through an eventfd that always
        // fires (a busy loop); taking over its mode changes drops that eventfd, so the poller
        // runs only while the thread polls.
        // SAFETY: `poller` was registered on this thread just now.
        unsafe {
            spdk_sys::spdk_poller_register_interrupt(poller, Some(on_mode), std::ptr::null_mut())
        };
        // SAFETY: eventfd has no memory preconditions.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            let rc = -std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            close();
            return Err(rc);
        }
        // SAFETY: called on an SPDK thread in interrupt mode (its fd group exists); `fd` is
        // ours and stays open until `close` unregisters it; SPDK copies the name.
        let intr = unsafe {
            spdk_sys::spdk_interrupt_register(
                fd,
                Some(on_wake),
                std::ptr::null_mut(),
                c"liteio_requests".as_ptr(),
            )
        };
        if intr.is_null() {
            // SAFETY: `fd` is ours and registered nowhere.
            unsafe { libc::close(fd) };
            close();
            return Err(-libc::ENOMEM);
        }
        INTERRUPT.store(intr as usize, Ordering::Relaxed);
        WAKE_FD.store(fd, Ordering::Release);
        Ok(())
    }

    /// Stop taking requests and refuse the queued ones (their callers get
    /// [`super::SpdkError::NotRunning`]); on the application thread, after it was
    /// unpublished, so no caller touches the queue or the eventfd any more.
    pub(super) fn close() {
        let intr = INTERRUPT.swap(0, Ordering::Relaxed);
        if intr != 0 {
            let mut p = intr as *mut spdk_sys::spdk_interrupt;
            // SAFETY: `p` is the interrupt `open` registered on this thread, unregistered once
            // (the swap above); SPDK sets `p` to NULL.
            unsafe { spdk_sys::spdk_interrupt_unregister(&mut p) };
        }
        let poller = POLLER.swap(0, Ordering::Relaxed);
        if poller != 0 {
            let mut p = poller as *mut spdk_sys::spdk_poller;
            // SAFETY: as above, for the poller.
            unsafe { spdk_sys::spdk_poller_unregister(&mut p) };
        }
        let fd = WAKE_FD.swap(-1, Ordering::AcqRel);
        if fd >= 0 {
            // SAFETY: `fd` is the eventfd `open` made; no longer registered, and no caller
            // reads `WAKE_FD` once the application thread is unpublished.
            unsafe { libc::close(fd) };
        }
        refuse_queued();
    }

    /// Drop every queued request (a framework that ended by itself leaves some behind).
    pub(super) fn refuse_queued() {
        let left = std::mem::take(&mut *QUEUE.lock().unwrap_or_else(PoisonError::into_inner));
        // Dropping a request answers its caller, which runs foreign code.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(left)));
    }

    /// Queue `task`; the caller holds the application thread's read lock (so SPDK runs).
    pub(super) fn push(task: Task) {
        QUEUE
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(task);
        if !PENDING.swap(true, Ordering::AcqRel) {
            wake();
        }
    }

    fn wake() {
        let fd = WAKE_FD.load(Ordering::Acquire);
        if fd >= 0 {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to the eventfd, which stays open while
            // the caller holds the application thread's read lock (or is that thread). A
            // full counter (EAGAIN) means a wake-up is pending anyway.
            let _ = unsafe { libc::write(fd, (&raw const one).cast::<c_void>(), 8) };
        }
    }

    /// Run up to [`BATCH`] queued requests; the number run (SPDK counts a call that ran any
    /// as busy).
    fn run_batch() -> c_int {
        let fd = WAKE_FD.load(Ordering::Acquire);
        if fd >= 0 {
            let mut count: u64 = 0;
            // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd; resets it
            // before the queue is read, so a later push wakes the thread again.
            let _ = unsafe { libc::read(fd, (&raw mut count).cast::<c_void>(), 8) };
        }
        PENDING.store(false, Ordering::SeqCst);
        let (batch, more) = {
            let mut q = QUEUE.lock().unwrap_or_else(PoisonError::into_inner);
            let n = q.len().min(BATCH);
            let batch: Vec<Task> = q.drain(..n).collect();
            (batch, !q.is_empty())
        };
        if more && !PENDING.swap(true, Ordering::AcqRel) {
            wake();
        }
        let ran = c_int::try_from(batch.len()).unwrap_or(c_int::MAX);
        for task in batch {
            // A request queued before a stop began is refused (dropped: its caller gets
            // `NotRunning`); the stop request itself unpublishes the thread.
            if *app_thread_read() == 0 {
                drop(task);
                continue;
            }
            no_unwind("request", || {
                // SAFETY: runs on SPDK's application thread, inside the interrupt or poller
                // SPDK called; the token lives for this call only.
                let reactor = unsafe { Reactor::new() };
                task(&reactor);
            });
        }
        ran
    }

    /// The eventfd fired (interrupt mode).
    extern "C" fn on_wake(_arg: *mut c_void) -> c_int {
        no_unwind("on_wake", run_batch).unwrap_or(0)
    }

    /// The thread switched between polling and interrupt mode: nothing to do, the eventfd
    /// serves the one and the poller the other.
    extern "C" fn on_mode(
        _poller: *mut spdk_sys::spdk_poller,
        _arg: *mut c_void,
        _interrupt: bool,
    ) {
        no_unwind("on_mode", || {});
    }

    /// Every iteration of the thread while it polls.
    extern "C" fn on_poll(_arg: *mut c_void) -> c_int {
        no_unwind("on_poll", || {
            if PENDING.load(Ordering::Acquire) {
                run_batch()
            } else {
                0
            }
        })
        .unwrap_or(0)
    }
}

/// Send `task` to SPDK's application thread, or refuse it when SPDK is not running or
/// stopping.
pub(crate) fn send_task(task: Task) -> Result<()> {
    let thread = app_thread_read();
    if *thread == 0 {
        return Err(SpdkError::NotRunning);
    }
    inbox::push(task);
    drop(thread);
    Ok(())
}

/// The caller's end of a request, taken by whoever answers first, the [`Reply`] or the
/// deadline; when the deadline took it, the id under which the request is listed as stuck.
struct SlotState<T> {
    caller: Option<oneshot::Sender<Result<T>>>,
    stuck: Option<u64>,
}

type Slot<T> = Mutex<SlotState<T>>;

/// The answer came (or the [`Reply`] went away): hand back the caller's end, or, when the
/// deadline had already answered, take the request off the stuck list.
fn answered<T>(slot: &Slot<T>) -> Option<oneshot::Sender<Result<T>>> {
    let mut st = slot.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(tx) = st.caller.take() {
        return Some(tx);
    }
    if let Some(id) = st.stuck.take() {
        drop(st);
        let late = STUCK
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        if let Some((request, since)) = late {
            tracing::warn!(
                %request,
                after = ?since.elapsed(),
                "a stuck SPDK request got its answer late (dropped: its caller had timed out)"
            );
        }
        stuck_changed();
    }
    None
}

/// The deadline passed: hand back the caller's end (if no answer came first) and list the
/// request as stuck until it is answered.
fn timed_out<T>(slot: &Slot<T>, caller: &Location<'static>) -> Option<oneshot::Sender<Result<T>>> {
    let mut st = slot.lock().unwrap_or_else(PoisonError::into_inner);
    let tx = st.caller.take()?;
    let id = STUCK_IDS.fetch_add(1, Ordering::Relaxed);
    STUCK
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(id, (caller.to_string(), Instant::now()));
    st.stuck = Some(id);
    Some(tx)
}

/// Where a request's answer goes. Dropping it without [`Reply::send`] makes the caller see
/// [`SpdkError::NotRunning`] ([`SpdkError::Panicked`] when dropped by a panic). An answer
/// after the deadline, or after the caller went away, is dropped here.
pub struct Reply<T>(Arc<Slot<T>>);

impl<T> Reply<T> {
    /// Deliver the answer; ignored when the caller stopped waiting.
    pub fn send(self, value: Result<T>) {
        if let Some(tx) = answered(&self.0) {
            let _ = tx.send(value);
        }
    }
}

impl<T> Drop for Reply<T> {
    fn drop(&mut self) {
        if let Some(tx) = answered(&self.0) {
            let _ = tx.send(Err(if std::thread::panicking() {
                SpdkError::Panicked
            } else {
                SpdkError::NotRunning
            }));
        }
    }
}

/// Run `f` on SPDK's application thread and await the answer it sends through its [`Reply`],
/// possibly later from an SPDK completion callback. The answer must come within
/// [`request_timeout`]; otherwise the call fails with [`SpdkError::Timeout`] naming the code
/// that sent it (logged and counted in [`timed_out_requests`]), and the late answer is
/// dropped when it comes.
#[track_caller]
pub fn exec<T: Send + 'static>(
    f: impl FnOnce(Reply<T>) + Send + 'static,
) -> impl Future<Output = Result<T>> + Send {
    exec_on(move |_, reply| f(reply))
}

/// [`exec`] for code that needs the [`Reactor`] token.
#[track_caller]
pub(crate) fn exec_on<T: Send + 'static>(
    f: impl FnOnce(&Reactor, Reply<T>) + Send + 'static,
) -> impl Future<Output = Result<T>> + Send {
    let caller = Location::caller();
    async move {
        let (tx, rx) = oneshot::channel();
        let slot = Arc::new(Mutex::new(SlotState {
            caller: Some(tx),
            stuck: None,
        }));
        let reply = Reply(Arc::clone(&slot));
        let sent = Instant::now();
        QUEUED.fetch_add(1, Ordering::Relaxed);
        let queued = send_task(Box::new(move |r: &Reactor| {
            let started = Instant::now();
            QUEUED.fetch_sub(1, Ordering::Relaxed);
            LAST_START.store(
                nanos(started.saturating_duration_since(epoch())),
                Ordering::Relaxed,
            );
            f(r, reply);
            note_wait_and_run(started.duration_since(sent), started.elapsed(), caller);
        }));
        if queued.is_err() {
            QUEUED.fetch_sub(1, Ordering::Relaxed);
        }
        queued?;
        let after = request_timeout();
        let weak = Arc::downgrade(&slot);
        let _armed = watchdog::arm(
            after,
            Box::new(move || {
                let Some(tx) = weak.upgrade().and_then(|s| timed_out(&s, caller)) else {
                    return;
                };
                TIMED_OUT.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    request = %caller,
                    timeout = ?after,
                    "an SPDK request got no answer in time; is the reactor stuck?"
                );
                let _ = tx.send(Err(SpdkError::Timeout {
                    request: caller.to_string(),
                    after,
                }));
                stuck_changed();
            }),
        );
        drop(slot);
        let answer = rx.await.map_err(|_| SpdkError::NotRunning)?;
        note_answer(sent.elapsed(), caller);
        answer
    }
}

/// Run a synchronous `f` on SPDK's application thread and return its result (within
/// [`request_timeout`], as [`exec`]). A panic in `f` fails the request with
/// [`SpdkError::Panicked`] and SPDK goes on.
#[track_caller]
pub fn on_reactor<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> impl Future<Output = Result<T>> + Send {
    exec_on(move |_, reply| reply.send(f()))
}

/// [`on_reactor`] for code that needs the [`Reactor`] token.
#[track_caller]
pub(crate) fn on_reactor_with<T: Send + 'static>(
    f: impl FnOnce(&Reactor) -> Result<T> + Send + 'static,
) -> impl Future<Output = Result<T>> + Send {
    exec_on(move |r, reply| reply.send(f(r)))
}

/// Deadlines of requests, kept by one thread of ours: no timers on the reactors, and no
/// particular async runtime needed by the callers (the agent's engine blocks on its calls).
mod watchdog {
    use std::collections::BTreeMap;
    use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
    use std::time::{Duration, Instant};

    type Fire = Box<dyn FnOnce() + Send>;

    #[derive(Default)]
    struct Queue {
        due: BTreeMap<(Instant, u64), Fire>,
        seq: u64,
    }

    struct Watchdog {
        queue: Mutex<Queue>,
        wake: Condvar,
    }

    fn get() -> Option<&'static Watchdog> {
        static W: OnceLock<Option<&'static Watchdog>> = OnceLock::new();
        *W.get_or_init(|| {
            let w: &'static Watchdog = Box::leak(Box::new(Watchdog {
                queue: Mutex::new(Queue::default()),
                wake: Condvar::new(),
            }));
            match std::thread::Builder::new()
                .name("spdk-deadlines".into())
                .spawn(move || run(w))
            {
                Ok(_) => Some(w),
                Err(e) => {
                    tracing::error!(error = %e, "cannot spawn the SPDK deadline thread; requests wait without a deadline");
                    None
                }
            }
        })
    }

    fn run(w: &Watchdog) {
        let mut q = w.queue.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let now = Instant::now();
            match q.due.first_key_value().map(|(k, _)| *k) {
                None => q = w.wake.wait(q).unwrap_or_else(PoisonError::into_inner),
                Some(k) if k.0 <= now => {
                    if let Some(fire) = q.due.remove(&k) {
                        drop(q);
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(fire));
                        q = w.queue.lock().unwrap_or_else(PoisonError::into_inner);
                    }
                }
                Some(k) => {
                    q = w
                        .wake
                        .wait_timeout(q, k.0 - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
    }

    /// A deadline; dropping it (the answer came, or the caller went away) disarms it.
    pub(super) struct Armed(Option<(Instant, u64)>);

    impl Drop for Armed {
        fn drop(&mut self) {
            if let (Some(key), Some(w)) = (self.0, get()) {
                w.queue
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .due
                    .remove(&key);
            }
        }
    }

    /// Run `fire` on the deadline thread after `after`, unless disarmed first.
    pub(super) fn arm(after: Duration, fire: Fire) -> Armed {
        let Some(w) = get() else {
            return Armed(None);
        };
        let now = Instant::now();
        let at = now
            .checked_add(after)
            .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600));
        let mut q = w.queue.lock().unwrap_or_else(PoisonError::into_inner);
        q.seq += 1;
        let key = (at, q.seq);
        q.due.insert(key, fire);
        drop(q);
        w.wake.notify_one();
        Armed(Some(key))
    }
}

// ---- completion callbacks -------------------------------------------------------------

type ErrnoFn = Box<dyn FnOnce(&Reactor, i32)>;

/// A context for an SPDK callback of shape `(void *arg, int rc)`: pass the returned pointer as
/// `cb_arg` and [`errno_cb`] as the function. If SPDK rejects the call synchronously and never
/// calls back, reclaim it with [`drop_errno_ctx`] (or answer it with [`errno_cb`]).
pub(crate) fn errno_ctx(f: impl FnOnce(&Reactor, i32) + 'static) -> *mut c_void {
    Box::into_raw(Box::new(Box::new(f) as ErrnoFn)).cast()
}

/// SPDK callback trampoline for [`errno_ctx`]: runs the closure once, catching a panic.
///
/// # Safety
/// `arg` must come from [`errno_ctx`] and not have been passed to `errno_cb` or
/// [`drop_errno_ctx`] before: it is reclaimed here. Called on an SPDK thread.
pub(crate) unsafe extern "C" fn errno_cb(arg: *mut c_void, rc: c_int) {
    no_unwind("errno_cb", || {
        // SAFETY: the caller's contract: `arg` came from `errno_ctx` and is reclaimed once.
        let f = unsafe { Box::from_raw(arg.cast::<ErrnoFn>()) };
        // SAFETY: the caller's contract: on an SPDK thread; the token lives for this call.
        let reactor = unsafe { Reactor::new() };
        f(&reactor, rc);
    });
}

/// Reclaim a context SPDK did not take, without running it (its [`Reply`], if any, answers
/// [`SpdkError::NotRunning`]).
///
/// # Safety
/// `arg` must come from [`errno_ctx`], SPDK must not hold it (the call that was given it
/// failed and will not call back), and it must not be reclaimed again.
pub(crate) unsafe fn drop_errno_ctx(arg: *mut c_void) {
    no_unwind("drop_errno_ctx", || {
        // SAFETY: the caller's contract: `arg` is ours and reclaimed once.
        drop(unsafe { Box::from_raw(arg.cast::<ErrnoFn>()) });
    });
}

type HandleFn<H> = Box<dyn FnOnce(&Reactor, *mut H, i32)>;

/// A context for an SPDK callback of shape `(void *arg, T *handle, int rc)`.
pub(crate) fn handle_ctx<H: 'static>(
    f: impl FnOnce(&Reactor, *mut H, i32) + 'static,
) -> *mut c_void {
    Box::into_raw(Box::new(Box::new(f) as HandleFn<H>)).cast()
}

/// SPDK callback trampoline for [`handle_ctx`]: runs the closure once, catching a panic.
///
/// # Safety
/// `arg` must come from [`handle_ctx::<H>`] and not have been reclaimed before; `handle` is
/// NULL or a live `H` for the duration of the call. Called on an SPDK thread.
pub(crate) unsafe extern "C" fn handle_cb<H: 'static>(arg: *mut c_void, handle: *mut H, rc: c_int) {
    no_unwind("handle_cb", || {
        // SAFETY: the caller's contract: `arg` came from `handle_ctx::<H>`, reclaimed once.
        let f = unsafe { Box::from_raw(arg.cast::<HandleFn<H>>()) };
        // SAFETY: the caller's contract: on an SPDK thread; the token lives for this call.
        let reactor = unsafe { Reactor::new() };
        f(&reactor, handle, rc);
    });
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

/// SPDK's start-up JSON config for what `opts` sets beyond the app options (the NVMe-oF
/// target's `max_subsystems` and DH groups, the bdev layer's auto-examine).
fn startup_config(opts: &SpdkOptions) -> Vec<u8> {
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
        REQUEST_TIMEOUT_MS.store(
            u64::try_from(opts.request_timeout.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
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
