//! Runtime statistics of SPDK: how each SPDK thread spent its time, and a metrics source
//! that reports it with the lvol counters of the engine (the statistics themselves come
//! from [`liteio_spdk::stats`]).
//!
//! SPDK accounts a thread's time in `spdk_thread_poll`: busy when a poller or message did
//! work, idle otherwise. In interrupt mode the reactors sleep in `epoll_wait` and never call
//! it, so these counters stay at 0; the reactor threads' CPU time from `/proc` (see
//! [`crate::metrics::thread_cpu_seconds`]) is the measure that holds in both modes.

pub use liteio_spdk::stats::{RuntimeStats, ThreadStats, threads};

/// The SPDK runtime as a metrics source: every SPDK thread's busy/idle time and the reactor
/// threads' CPU time. Register it with [`crate::metrics::Metrics::add_source`] while SPDK
/// runs; when SPDK is stopped it reports the error and the scrape goes on without it.
#[derive(Debug, Default, Clone, Copy)]
pub struct RuntimeSource;

impl crate::metrics::ScrapeSource for RuntimeSource {
    fn name(&self) -> &'static str {
        "spdk"
    }

    fn scrape(
        &self,
        _volumes: &[String],
        out: &mut crate::metrics::Scrape,
    ) -> std::result::Result<(), crate::metrics::SourceError> {
        // Reactor threads name themselves `reactor_<core>` (the main one included).
        out.reactor_cpu.extend(crate::metrics::thread_cpu_seconds(
            std::path::Path::new("/proc/self/task"),
            "reactor_",
        ));
        // The longest-waiting first.
        let stuck = liteio_spdk::runtime::stuck_requests();
        out.spdk_faults = Some(crate::metrics::SpdkFaults {
            request_timeouts: liteio_spdk::runtime::timed_out_requests(),
            caught_panics: liteio_spdk::runtime::caught_panics(),
            stuck_requests: stuck.len() as u64,
            oldest_stuck_seconds: stuck.first().map_or(0.0, |r| r.waiting.as_secs_f64()),
        });
        let stats = futures::executor::block_on(threads())?;
        let hz = stats.ticks_hz.max(1) as f64;
        out.spdk_threads.extend(stats.threads.into_iter().map(|t| {
            crate::metrics::SpdkThreadTime {
                thread: t.name,
                busy_seconds: t.busy_ticks as f64 / hz,
                idle_seconds: t.idle_ticks as f64 / hz,
            }
        }));
        Ok(())
    }
}
