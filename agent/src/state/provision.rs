//! Where a volume's provisioning spends its time, from the first reconcile that saw it not
//! ready to the status patch that made it ready.
//!
//! Each reconcile pass of a volume that is not ready yet adds the time of its steps to the
//! volume's record: `engine` (pool engine calls: create, clone, find), `export` (the
//! exporter, i.e. the NVMe-oF target), `api` (API server requests). What the passes do not
//! account for is `waiting`: time between passes (queued behind other objects, a conflict
//! retry, a back-off). When the volume becomes ready the record is reported:
//! - histogram `liteio_provision_seconds{step}` (step = engine, export, api, waiting, total),
//! - the log line "volume ready" with the same figures in milliseconds (`took_ms`, …),
//! - a warning naming the largest share when `total` exceeds [`SLOW`].
//!
//! A pass that ends in an error keeps the record, so a volume that needs several passes is
//! reported once, with all of them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

/// Provisioning slower than this is logged as a warning.
pub const SLOW: Duration = Duration::from_secs(1);

/// A step of a provisioning pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Pool engine calls.
    Engine,
    /// The exporter (NVMe-oF target).
    Export,
    /// API server requests.
    Api,
}

/// Time spent per step, summed over the passes so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Steps {
    /// Pool engine calls.
    pub engine: Duration,
    /// The exporter.
    pub export: Duration,
    /// API server requests.
    pub api: Duration,
    /// Reconcile passes.
    pub passes: u32,
}

impl Steps {
    fn add(&mut self, step: Step, d: Duration) {
        match step {
            Step::Engine => self.engine += d,
            Step::Export => self.export += d,
            Step::Api => self.api += d,
        }
    }
}

/// A finished provisioning: the steps and the time from the first pass to ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    /// From the start of the first pass to the end of the last.
    pub total: Duration,
    /// Per step.
    pub steps: Steps,
}

impl Report {
    /// Time between passes: `total` minus the steps.
    pub fn waiting(&self) -> Duration {
        self.total
            .saturating_sub(self.steps.engine + self.steps.export + self.steps.api)
    }

    /// The step that took the largest share, and its time.
    pub fn largest(&self) -> (&'static str, Duration) {
        [
            ("engine", self.steps.engine),
            ("export", self.steps.export),
            ("api", self.steps.api),
            ("waiting", self.waiting()),
        ]
        .into_iter()
        .max_by_key(|(_, d)| *d)
        .unwrap_or(("waiting", Duration::ZERO))
    }
}

#[derive(Debug)]
struct Record {
    first_seen: Instant,
    steps: Steps,
}

/// The records of the volumes being provisioned, by `namespace/name`.
#[derive(Debug, Default)]
pub struct Provisioning {
    pending: Mutex<HashMap<String, Record>>,
}

impl Provisioning {
    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, Record>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts a pass of volume `key`; `tracked` is false for a volume that is ready already
    /// (its pass is not timed).
    pub fn begin(&self, key: String, tracked: bool) -> Pass<'_> {
        let (first_seen, steps) = if tracked {
            match self.pending().remove(&key) {
                Some(r) => (r.first_seen, r.steps),
                None => {
                    debug!(volume = %key, "provisioning started");
                    (Instant::now(), Steps::default())
                }
            }
        } else {
            (Instant::now(), Steps::default())
        };
        Pass {
            owner: self,
            key,
            first_seen,
            steps: Steps {
                passes: steps.passes + 1,
                ..steps
            },
            tracked,
        }
    }

    /// Drops the record of a volume (deleted before it became ready).
    pub fn forget(&self, key: &str) {
        self.pending().remove(key);
    }

    /// Volumes being provisioned right now.
    pub fn len(&self) -> usize {
        self.pending().len()
    }

    /// Whether no volume is being provisioned.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One reconcile pass of a volume. Dropped without [`Pass::finish`], it keeps its times for
/// the next pass.
#[derive(Debug)]
pub struct Pass<'a> {
    owner: &'a Provisioning,
    key: String,
    first_seen: Instant,
    steps: Steps,
    tracked: bool,
}

impl Pass<'_> {
    /// Runs `fut`, adding its time to `step`.
    pub async fn time<T>(&mut self, step: Step, fut: impl Future<Output = T>) -> T {
        let t0 = Instant::now();
        let out = fut.await;
        self.steps.add(step, t0.elapsed());
        out
    }

    /// The volume is ready: returns the report (`None` when the pass was not tracked) and
    /// forgets the record.
    pub fn finish(mut self) -> Option<Report> {
        let tracked = std::mem::replace(&mut self.tracked, false);
        tracked.then(|| Report {
            total: self.first_seen.elapsed(),
            steps: self.steps,
        })
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        if self.tracked {
            self.owner.pending().insert(
                std::mem::take(&mut self.key),
                Record {
                    first_seen: self.first_seen,
                    steps: self.steps,
                },
            );
        }
    }
}

/// Logs `report` of `volume` (`namespace/name`): "volume ready" with the figures, a warning
/// when slower than [`SLOW`].
pub fn log(volume: &str, report: &Report) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (largest, largest_time) = report.largest();
    if report.total > SLOW {
        warn!(
            volume,
            took_ms = ms(report.total),
            engine_ms = ms(report.steps.engine),
            export_ms = ms(report.steps.export),
            api_ms = ms(report.steps.api),
            waiting_ms = ms(report.waiting()),
            passes = report.steps.passes,
            "volume ready after {:.2} s, {:.2} s of it in {largest}",
            report.total.as_secs_f64(),
            largest_time.as_secs_f64()
        );
    } else {
        info!(
            volume,
            took_ms = ms(report.total),
            engine_ms = ms(report.steps.engine),
            export_ms = ms(report.steps.export),
            api_ms = ms(report.steps.api),
            waiting_ms = ms(report.waiting()),
            passes = report.steps.passes,
            "volume ready"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn passes_add_up_until_the_volume_is_ready() {
        let p = Provisioning::default();
        let mut pass = p.begin("ns/a".into(), true);
        pass.time(Step::Api, tokio::time::sleep(Duration::from_millis(2)))
            .await;
        drop(pass); // a failed pass keeps its record
        assert_eq!(p.len(), 1);
        let mut pass = p.begin("ns/a".into(), true);
        pass.time(Step::Engine, async {}).await;
        let Some(r) = pass.finish() else {
            panic!("a tracked pass reports");
        };
        assert_eq!(r.steps.passes, 2);
        assert!(p.is_empty(), "the record is gone once reported");
        assert!(r.total >= r.steps.api + r.steps.engine);
    }

    #[test]
    fn an_untracked_pass_reports_nothing_and_keeps_nothing() {
        let p = Provisioning::default();
        let pass = p.begin("ns/a".into(), false);
        assert!(pass.finish().is_none());
        drop(p.begin("ns/b".into(), false));
        assert!(p.is_empty());
    }

    #[test]
    fn the_largest_share_is_named() {
        let r = Report {
            total: Duration::from_millis(1000),
            steps: Steps {
                engine: Duration::from_millis(100),
                export: Duration::from_millis(600),
                api: Duration::from_millis(50),
                passes: 1,
            },
        };
        assert_eq!(r.waiting(), Duration::from_millis(250));
        assert_eq!(r.largest(), ("export", Duration::from_millis(600)));
    }
}
