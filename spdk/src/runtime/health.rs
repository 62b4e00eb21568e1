//! What the runtime tells of its requests: each request's deadline and the ones that missed
//! it (counted, and listed as stuck until their late answer comes), where requests spent
//! their time (queue wait, run, answer), how many are queued, and the panics caught on SPDK
//! threads. Counters and lists only: the request path (`request`, `reactor`) notes into
//! them through the `note_*` functions, and the agent's metrics and health check read them.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, Location};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

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

pub(super) fn note_wait_and_run(wait: Duration, run: Duration, caller: &'static Location<'static>) {
    TIMES.count.fetch_add(1, Ordering::Relaxed);
    TIMES.wait_total.fetch_add(nanos(wait), Ordering::Relaxed);
    TIMES.wait_max.fetch_max(nanos(wait), Ordering::Relaxed);
    TIMES.run_total.fetch_add(nanos(run), Ordering::Relaxed);
    if TIMES.run_max.fetch_max(nanos(run), Ordering::Relaxed) < nanos(run) {
        SLOWEST.lock().unwrap_or_else(PoisonError::into_inner).0 = Some(caller);
    }
}

pub(super) fn note_answer(answer: Duration, caller: &'static Location<'static>) {
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
/// [`SpdkError::Timeout`](crate::error::SpdkError::Timeout), and SPDK still holds it (a reactor stuck in it, or a completion
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

pub(super) fn stuck_changed() {
    if let Some(f) = STUCK_OBSERVER.get() {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(f));
    }
}

/// Set the deadline of every request (at start, from the options).
pub(super) fn set_request_timeout(after: Duration) {
    REQUEST_TIMEOUT_MS.store(
        u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

/// A panic was caught on an SPDK thread.
pub(super) fn note_panic() {
    PANICKED.fetch_add(1, Ordering::Relaxed);
}

/// A request was sent and waits for the application thread.
pub(super) fn note_queued() {
    QUEUED.fetch_add(1, Ordering::Relaxed);
}

/// A request that was noted as queued left the queue without running (refused).
pub(super) fn note_refused() {
    QUEUED.fetch_sub(1, Ordering::Relaxed);
}

/// The application thread started a queued request at `started`.
pub(super) fn note_started(started: Instant) {
    QUEUED.fetch_sub(1, Ordering::Relaxed);
    LAST_START.store(
        nanos(started.saturating_duration_since(epoch())),
        Ordering::Relaxed,
    );
}

/// A request got no answer within its deadline.
pub(super) fn note_timed_out() {
    TIMED_OUT.fetch_add(1, Ordering::Relaxed);
}

/// List the request sent by `caller`, past its deadline, as stuck; the id takes it off the
/// list again ([`unlist_stuck`]).
pub(super) fn list_stuck(caller: &Location<'static>) -> u64 {
    let id = STUCK_IDS.fetch_add(1, Ordering::Relaxed);
    STUCK
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(id, (caller.to_string(), Instant::now()));
    id
}

/// The stuck request `id` got its answer: take it off the list; what it was and since when.
pub(super) fn unlist_stuck(id: u64) -> Option<(String, Instant)> {
    STUCK
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&id)
}
