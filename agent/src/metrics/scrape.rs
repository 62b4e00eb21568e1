//! What a scrape collects besides the metrics the control loop sets: the samples
//! ([`Scrape`]) and the sources asked for them at every scrape ([`ScrapeSource`]; the pool
//! engine's is [`EngineSource`]).

use std::sync::Arc;

use crate::engine::{PoolEngine, VolumeIo};

/// Samples taken at scrape time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scrape {
    /// I/O counters by engine volume name.
    pub volumes: Vec<(String, VolumeIo)>,
    /// SPDK threads' own time accounting.
    pub spdk_threads: Vec<SpdkThreadTime>,
    /// CPU seconds of each reactor thread (`reactor_0`, …).
    pub reactor_cpu: Vec<(String, f64)>,
    /// Faults of the SPDK runtime since the process started; `None` without SPDK.
    pub spdk_faults: Option<SpdkFaults>,
}

/// Faults the SPDK runtime survived, since the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpdkFaults {
    /// Requests that got no answer within their deadline.
    pub request_timeouts: u64,
    /// Panics caught on SPDK threads.
    pub caught_panics: u64,
    /// Requests past their deadline and still unanswered right now.
    pub stuck_requests: u64,
    /// Seconds the oldest of them has waited (0 when none).
    pub oldest_stuck_seconds: f64,
}

/// How an SPDK thread spent its time, in seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpdkThreadTime {
    /// SPDK's thread name.
    pub thread: String,
    /// Seconds doing work.
    pub busy_seconds: f64,
    /// Seconds polling without work.
    pub idle_seconds: f64,
}

/// Why a source could not give its samples (logged, counted by source; never a label).
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// Something asked for samples at every scrape. Runs on the blocking pool; must be cheap.
pub trait ScrapeSource: Send + Sync + std::fmt::Debug {
    /// A short, fixed name for logs and the error counter's `source` label.
    fn name(&self) -> &'static str;

    /// Adds samples to `out`. `volumes` are the engine names of the volumes the agent serves
    /// right now.
    fn scrape(&self, volumes: &[String], out: &mut Scrape) -> Result<(), SourceError>;
}

/// The pool engine's per-volume I/O counters ([`PoolEngine::io_stats`]).
#[derive(Debug)]
pub struct EngineSource(pub Arc<dyn PoolEngine>);

impl ScrapeSource for EngineSource {
    fn name(&self) -> &'static str {
        "engine"
    }

    fn scrape(&self, volumes: &[String], out: &mut Scrape) -> Result<(), SourceError> {
        out.volumes.extend(self.0.io_stats(volumes)?);
        Ok(())
    }
}
