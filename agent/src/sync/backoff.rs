//! Per-object retry back-off of the sync controllers: a failed object is retried after
//! `retry`, doubling on every further failure up to `retry_max`, each delay spread by ±20 %
//! so that objects failing for one cause (a lost disk) do not retry in lock-step; a success
//! forgets the object's failures. Every error counts, also those that retrying cannot heal
//! (`crate::error::Retry::OnChange`): those get no timer, but stay counted here so that a
//! change of the pool retries them. The controller's work queue backs off the same way
//! (`liteio_controller::reconcile::backoff`), without jitter since it runs once per cluster.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// The delays: `base · 2^(failures − 1)`, spread by ±`jitter`, never above `cap`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// Delay after the first failure.
    pub base: Duration,
    /// Longest delay.
    pub cap: Duration,
    /// Spread as a fraction of the delay (0.2 = ±20 %).
    pub jitter: f64,
}

impl Schedule {
    /// The agent's schedule: `base` doubling to `cap`, ±20 %.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap: cap.max(base),
            jitter: 0.2,
        }
    }

    /// The delay after `failures` consecutive failures (1 = the first), with `unit` in
    /// [−1, 1] choosing where in the jitter band it falls (clamped).
    pub fn delay(&self, failures: u32, unit: f64) -> Duration {
        let exp = failures.saturating_sub(1).min(32);
        let nominal = self
            .base
            .checked_mul(1u32 << exp.min(31))
            .unwrap_or(self.cap)
            .min(self.cap);
        let unit = if unit.is_finite() {
            unit.clamp(-1.0, 1.0)
        } else {
            0.0
        };
        let factor = 1.0 + self.jitter.clamp(0.0, 1.0) * unit;
        nominal.mul_f64(factor).min(self.cap)
    }
}

/// A source of jitter: values in [−1, 1].
pub trait Jitter: Send + Sync + std::fmt::Debug {
    /// The next value.
    fn unit(&self) -> f64;
}

/// Pseudo-random jitter (SplitMix64 seeded from the process's random hash keys); not for
/// anything that needs unpredictability.
#[derive(Debug)]
pub struct RandomJitter(AtomicU64);

impl RandomJitter {
    /// A generator with a random seed.
    pub fn new() -> Self {
        Self(AtomicU64::new(RandomState::new().hash_one(0x5eed_u64)))
    }
}

impl Default for RandomJitter {
    fn default() -> Self {
        Self::new()
    }
}

impl Jitter for RandomJitter {
    fn unit(&self) -> f64 {
        let mut z = self
            .0
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        // 53 random bits → [0, 1) → [−1, 1).
        ((z >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
}

/// Consecutive failures per object (`namespace/name`) and the delay they earn.
#[derive(Debug)]
pub struct Retries {
    schedule: Schedule,
    jitter: Arc<dyn Jitter>,
    failures: Mutex<HashMap<String, u32>>,
}

impl Retries {
    /// Retries on `schedule`, spread by `jitter`.
    pub fn new(schedule: Schedule, jitter: Arc<dyn Jitter>) -> Self {
        Self {
            schedule,
            jitter,
            failures: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.failures.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts one more failure of `key`; returns how many in a row and the delay before the
    /// next attempt.
    pub fn failed(&self, key: &str) -> (u32, Duration) {
        let n = {
            let mut g = self.lock();
            let n = g.entry(key.to_string()).or_default();
            *n = n.saturating_add(1);
            *n
        };
        (n, self.schedule.delay(n, self.jitter.unit()))
    }

    /// Forgets the failures of `key`.
    pub fn succeeded(&self, key: &str) {
        self.lock().remove(key);
    }

    /// Consecutive failures of `key` so far.
    pub fn failures(&self, key: &str) -> u32 {
        self.lock().get(key).copied().unwrap_or(0)
    }

    /// Forgets the failures of every key for which `keep` is false (objects gone).
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) {
        self.lock().retain(|k, _| keep(k));
    }

    /// True when some object waits for a retry.
    pub fn any_failing(&self) -> bool {
        !self.lock().is_empty()
    }

    /// The keys of the objects waiting for a retry.
    pub fn failing(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Jitter that replays values.
    #[derive(Debug)]
    struct Fixed(Mutex<Vec<f64>>);

    impl Jitter for Fixed {
        fn unit(&self) -> f64 {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop()
                .unwrap_or(0.0)
        }
    }

    const S: u64 = 1000;

    fn ms(d: Duration) -> u128 {
        d.as_millis()
    }

    #[test]
    fn doubles_from_one_second_to_the_five_minute_cap() {
        let s = Schedule::new(Duration::from_secs(1), Duration::from_secs(300));
        let got: Vec<u128> = (1..=11).map(|n| ms(s.delay(n, 0.0))).collect();
        assert_eq!(
            got,
            [
                S,
                2 * S,
                4 * S,
                8 * S,
                16 * S,
                32 * S,
                64 * S,
                128 * S,
                256 * S,
                300 * S,
                300 * S
            ]
            .map(u128::from)
        );
        assert_eq!(s.delay(u32::MAX, 0.0), Duration::from_secs(300));
        assert_eq!(s.delay(0, 0.0), Duration::from_secs(1));
    }

    #[test]
    fn jitter_spreads_by_twenty_percent_and_never_exceeds_the_cap() {
        let s = Schedule::new(Duration::from_secs(1), Duration::from_secs(300));
        assert_eq!(ms(s.delay(1, -1.0)), 800);
        assert_eq!(ms(s.delay(1, 1.0)), 1200);
        assert_eq!(ms(s.delay(3, 0.5)), 4400);
        assert_eq!(ms(s.delay(3, -7.0)), 3200, "clamped to −1");
        assert_eq!(ms(s.delay(3, f64::NAN)), 4000);
        assert_eq!(ms(s.delay(20, 1.0)), 300 * 1000);
        assert_eq!(ms(s.delay(20, -1.0)), 240 * 1000);
    }

    #[test]
    fn random_jitter_stays_in_band_and_varies() {
        let j = RandomJitter::new();
        let v: Vec<f64> = (0..1000).map(|_| j.unit()).collect();
        assert!(v.iter().all(|x| (-1.0..1.0).contains(x)));
        assert!(v.iter().any(|x| *x < -0.5) && v.iter().any(|x| *x > 0.5));
    }

    #[test]
    fn per_object_counts_reset_on_success() {
        let jitter = Fixed(Mutex::new(vec![0.0, 0.0, -1.0, 0.5, 1.0]));
        let r = Retries::new(
            Schedule::new(Duration::from_secs(1), Duration::from_secs(300)),
            Arc::new(jitter),
        );
        // Values are popped from the end: 1.0, 0.5, −1.0, 0.0, 0.0.
        assert_eq!(r.failed("ns/a"), (1, Duration::from_millis(1200)));
        assert_eq!(r.failed("ns/a"), (2, Duration::from_millis(2200)));
        assert_eq!(r.failed("ns/b"), (1, Duration::from_millis(800)));
        assert_eq!(r.failed("ns/a"), (3, Duration::from_secs(4)));
        assert!(r.any_failing());
        r.succeeded("ns/a");
        assert_eq!(r.failures("ns/a"), 0);
        assert_eq!(r.failures("ns/b"), 1);
        assert_eq!(r.failed("ns/a"), (1, Duration::from_secs(1)));
        r.succeeded("ns/a");
        r.succeeded("ns/b");
        assert!(!r.any_failing());
    }

    #[test]
    fn failures_of_objects_gone_are_forgotten() {
        let r = Retries::new(
            Schedule::new(Duration::from_secs(1), Duration::from_secs(300)),
            Arc::new(Fixed(Mutex::new(vec![0.0; 3]))),
        );
        r.failed("ns/gone");
        r.failed("ns/stays");
        r.retain(|k| k != "ns/gone");
        assert_eq!(r.failures("ns/gone"), 0);
        assert_eq!(r.failures("ns/stays"), 1);
        r.retain(|_| false);
        assert!(!r.any_failing());
    }
}
