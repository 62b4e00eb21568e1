//! When the copy of each hot migration last failed ([`CopyFailures`]): a failed copy starts
//! again only after a pause (the migration's own rule, passed in), so that the failure is
//! seen.

use std::time::Duration;

/// When the copy of each migration (by uid) last failed.
#[derive(Debug, Default)]
pub struct CopyFailures(std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>);

impl CopyFailures {
    fn map(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, std::time::Instant>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The copy of `key` failed just now.
    pub fn failed(&self, key: &str) {
        self.map()
            .insert(key.to_string(), std::time::Instant::now());
    }

    /// How long the copy of `key` must still wait before it starts again, `pause` after its
    /// last failure.
    pub fn wait_left(&self, key: &str, pause: Duration) -> Option<Duration> {
        let at = *self.map().get(key)?;
        pause.checked_sub(at.elapsed())
    }

    /// The copy of `key` started again, or its migration is over.
    pub fn forget(&self, key: &str) {
        self.map().remove(key);
    }
}
