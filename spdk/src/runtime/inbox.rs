//! Requests for SPDK's application thread, oldest first, and how that thread is woken: the
//! one door every request of the crate goes through ([`send_task`]), and which thread it
//! leads to (`APP_THREAD`, published once SPDK takes requests and cleared when it stops).
//!
//! Callers do not use `spdk_thread_send_msg` themselves: SPDK's message queue is DPDK's
//! multi-producer ring, where each producer waits, spinning, until every earlier producer has
//! finished its enqueue. A caller thread preempted halfway through one held up the reactor,
//! which queues messages to its own thread all the time (nvmf and blobstore completions),
//! spinning on its core until that caller ran again: 0.1 to 2.7 s in bursts of 200 volumes
//! on two cores (perf: the reactor thread in `spdk_ring_enqueue`). Here a preempted caller
//! holds at worst this mutex, on which the reactor sleeps and so hands the core to it.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError, RwLock};

use super::reactor::{Reactor, no_unwind};
use crate::error::{Result, SpdkError};

/// SPDK's application thread (`*mut spdk_thread`) while it takes requests, else 0.
///
/// Senders hold the read lock while they queue a request and wake the thread;
/// `Spdk::stop` clears it under the write lock on the application thread itself, *before*
/// `spdk_app_stop`, and then closes the queue. So a request is either queued before the stop
/// began (and refused when its turn comes or when the queue closes) or refused by
/// [`send_task`]: no sender ever wakes a thread that is gone.
static APP_THREAD: RwLock<usize> = RwLock::new(0);

fn app_thread_read() -> std::sync::RwLockReadGuard<'static, usize> {
    APP_THREAD.read().unwrap_or_else(PoisonError::into_inner)
}

pub(super) fn set_app_thread(thread: usize) {
    *APP_THREAD.write().unwrap_or_else(PoisonError::into_inner) = thread;
}

/// A request: a closure run once on SPDK's application thread.
pub(crate) type Task = Box<dyn FnOnce(&Reactor) + Send>;

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
pub(super) fn open() -> std::result::Result<(), i32> {
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
/// [`SpdkError::NotRunning`]); on the application thread, after it was
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
fn push(task: Task) {
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
extern "C" fn on_mode(_poller: *mut spdk_sys::spdk_poller, _arg: *mut c_void, _interrupt: bool) {
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

/// Send `task` to SPDK's application thread, or refuse it when SPDK is not running or
/// stopping.
pub(crate) fn send_task(task: Task) -> Result<()> {
    let thread = app_thread_read();
    if *thread == 0 {
        return Err(SpdkError::NotRunning);
    }
    push(task);
    drop(thread);
    Ok(())
}
