//! A process-wide count of panics, for the components' `liteio_panics_total`.
//!
//! With `panic = "unwind"` a panic in a tokio task or a request handler is caught (the task
//! fails, the process goes on), so it is easily missed. [`install`] chains a panic hook that
//! counts every panic before the previous hook prints it; each component's `/metrics` reports
//! [`count`]. A panic that ends the process is counted too, but nobody scrapes it any more.

use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

static PANICS: AtomicU64 = AtomicU64::new(0);
static INSTALL: Once = Once::new();

/// The help text of `liteio_panics_total`, the same in every component.
pub const HELP: &str = "Panics in this process since it started (each one caught: a task or request failed and the process went on)";

/// Counts every panic from now on (the hook that was set before still runs after the count).
/// Binaries call it once at start; later calls do nothing.
pub fn install() {
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::Relaxed);
            previous(info);
        }));
    });
}

/// Panics counted since [`install`] (0 when it was never called).
pub fn count() -> u64 {
    PANICS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_panic_is_counted_once() {
        install();
        install();
        let before = count();
        let caught = std::panic::catch_unwind(|| panic!("counted"));
        assert!(caught.is_err());
        // Other tests of this binary may panic meanwhile: at least this one is counted.
        assert!(count() > before, "{before} -> {}", count());
    }
}
