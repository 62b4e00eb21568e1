//! Deadlines of requests, kept by one thread of ours: no timers on the reactors, and no
//! particular async runtime needed by the callers (the agent's engine blocks on its calls).

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
