//! The liveness clock: an injectable source of "now", so tests can move time without waiting,
//! and the two readings of it the rest uses ([`elapsed`], [`unix_seconds`]).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that moves only when told to (tests).
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Mutex<Timestamp>>);

impl ManualClock {
    /// A manual clock starting at the system time.
    pub fn new() -> Self {
        Self(Arc::new(Mutex::new(Timestamp::now())))
    }
    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let mut g = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let d = SignedDuration::try_from(by).unwrap_or(SignedDuration::MAX);
        *g = g.saturating_add(d).unwrap_or(*g);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Time from `earlier` to `now`, zero when `earlier` is in the future.
pub fn elapsed(now: Timestamp, earlier: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(earlier)).unwrap_or(Duration::ZERO)
}

/// Unix seconds of a timestamp (metrics' time gauges).
pub fn unix_seconds(t: Timestamp) -> f64 {
    t.as_millisecond() as f64 / 1e3
}
