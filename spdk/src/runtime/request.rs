//! One request's round trip: [`exec`] and its kin queue a closure for SPDK's application
//! thread (through `inbox`), arm its deadline (`watchdog`) and await the answer, which comes
//! through the request's [`Reply`], now or later from a completion callback; whichever
//! comes first, answer or deadline, takes the caller's end, and a late answer is dropped
//! here. The times and the stuck list go to `health`.

use std::panic::Location;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::oneshot;

use super::health::{
    list_stuck, note_answer, note_queued, note_refused, note_started, note_timed_out,
    note_wait_and_run, request_timeout, stuck_changed, unlist_stuck,
};
use super::inbox::send_task;
use super::reactor::Reactor;
use super::watchdog;
use crate::error::{Result, SpdkError};

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
        if let Some((request, since)) = unlist_stuck(id) {
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
    st.stuck = Some(list_stuck(caller));
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
/// that sent it (logged and counted in `timed_out_requests`), and the late answer is
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
        note_queued();
        let queued = send_task(Box::new(move |r: &Reactor| {
            let started = Instant::now();
            note_started(started);
            f(r, reply);
            note_wait_and_run(started.duration_since(sent), started.elapsed(), caller);
        }));
        if queued.is_err() {
            note_refused();
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
                note_timed_out();
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
