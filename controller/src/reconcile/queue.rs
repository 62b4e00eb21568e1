//! The work queue every reconciled kind has ([`WorkQueue`]: a key queued at most once, never
//! held by two workers, processed again when added while it runs) and the back-off of a
//! failed reconcile ([`backoff`]). Knows nothing of the kinds or the cluster.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::error::ErrorKind;
use crate::state::ObjectKey;

#[derive(Debug, Default)]
struct QueueInner {
    queue: VecDeque<ObjectKey>,
    queued: HashSet<ObjectKey>,
    running: HashSet<ObjectKey>,
    dirty: HashSet<ObjectKey>,
    failures: HashMap<ObjectKey, u32>,
}

/// A de-duplicating work queue: a key is queued at most once and never processed by two
/// workers at the same time; a key added while running is processed again afterwards.
#[derive(Debug, Default)]
pub struct WorkQueue {
    inner: Mutex<QueueInner>,
    notify: Notify,
}

impl WorkQueue {
    fn lock(&self) -> MutexGuard<'_, QueueInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `key`.
    pub fn add(&self, key: ObjectKey) {
        let mut g = self.lock();
        if g.running.contains(&key) {
            g.dirty.insert(key);
            return;
        }
        if g.queued.insert(key.clone()) {
            g.queue.push_back(key);
            drop(g);
            self.notify.notify_one();
        }
    }

    /// Queues `key` after `delay`.
    pub fn add_after(self: &Arc<Self>, key: ObjectKey, delay: Duration) {
        let q = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            q.add(key);
        });
    }

    pub(super) async fn pop(&self) -> ObjectKey {
        loop {
            let notified = self.notify.notified();
            {
                let mut g = self.lock();
                if let Some(k) = g.queue.pop_front() {
                    g.queued.remove(&k);
                    g.running.insert(k.clone());
                    return k;
                }
            }
            notified.await;
        }
    }

    pub(super) fn done(&self, key: &ObjectKey) {
        let mut g = self.lock();
        g.running.remove(key);
        if g.dirty.remove(key) && g.queued.insert(key.clone()) {
            g.queue.push_back(key.clone());
            drop(g);
            self.notify.notify_one();
        }
    }

    pub(super) fn failed(&self, key: &ObjectKey) -> u32 {
        let mut g = self.lock();
        let n = g.failures.entry(key.clone()).or_default();
        *n = n.saturating_add(1);
        *n
    }

    pub(super) fn succeeded(&self, key: &ObjectKey) {
        self.lock().failures.remove(key);
    }

    /// Keys waiting (not running).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Back-off before retrying a failed reconcile: 10 ms doubling to 1 s for conflicts,
/// 50 ms doubling to 30 s otherwise.
pub fn backoff(failures: u32, kind: ErrorKind) -> Duration {
    let (base, cap) = match kind {
        ErrorKind::Conflict => (10u64, 1_000u64),
        _ => (50, 30_000),
    };
    let exp = failures.saturating_sub(1).min(16);
    Duration::from_millis(base.saturating_mul(1 << exp).min(cap))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Many workers on one queue while keys are added again and again: a key is never held
    /// by two workers at once, a key added while it runs is processed again afterwards, and
    /// different keys do run at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_key_is_never_held_by_two_workers() {
        tokio::time::timeout(Duration::from_secs(30), async {
            const KEYS: usize = 20;
            const WORKERS: usize = 8;
            let queue = Arc::new(WorkQueue::default());
            let key = |i: usize| ObjectKey::new("ns", format!("k{i}"));
            // Per key: held now, times added, adds seen by a run that started after them.
            let held = Arc::new(Mutex::new(HashSet::<ObjectKey>::new()));
            let added = Arc::new(Mutex::new(HashMap::<ObjectKey, usize>::new()));
            let covered = Arc::new(Mutex::new(HashMap::<ObjectKey, usize>::new()));
            let overlaps = Arc::new(AtomicUsize::new(0));
            let peak = Arc::new(AtomicUsize::new(0));
            let mut workers = tokio::task::JoinSet::new();
            for _ in 0..WORKERS {
                let (queue, held, added, covered, overlaps, peak) = (
                    Arc::clone(&queue),
                    Arc::clone(&held),
                    Arc::clone(&added),
                    Arc::clone(&covered),
                    Arc::clone(&overlaps),
                    Arc::clone(&peak),
                );
                workers.spawn(async move {
                    loop {
                        let k = queue.pop().await;
                        {
                            let mut h = held.lock().unwrap();
                            if !h.insert(k.clone()) {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            peak.fetch_max(h.len(), Ordering::SeqCst);
                            let n = added.lock().unwrap().get(&k).copied().unwrap_or(0);
                            covered.lock().unwrap().insert(k.clone(), n);
                        }
                        for _ in 0..3 {
                            tokio::task::yield_now().await;
                        }
                        held.lock().unwrap().remove(&k);
                        queue.done(&k);
                    }
                });
            }
            for round in 0..200 {
                for i in 0..KEYS {
                    let k = key((i + round) % KEYS);
                    *added.lock().unwrap().entry(k.clone()).or_default() += 1;
                    queue.add(k);
                }
                tokio::task::yield_now().await;
            }
            // Drained: every key's last add was seen by a run that started after it.
            loop {
                let idle = queue.is_empty() && held.lock().unwrap().is_empty();
                let caught_up = {
                    let a = added.lock().unwrap();
                    let c = covered.lock().unwrap();
                    a.iter().all(|(k, n)| c.get(k) == Some(n))
                };
                if idle && caught_up {
                    break;
                }
                tokio::task::yield_now().await;
            }
            workers.abort_all();
            assert_eq!(overlaps.load(Ordering::SeqCst), 0, "a key held twice");
            assert!(
                peak.load(Ordering::SeqCst) >= 2,
                "the workers never held two keys at once"
            );
        })
        .await
        .expect("timed out: an added key was never processed again");
    }
}
