//! Leader election through a `coordination.k8s.io/v1` Lease: only the holder reconciles; a
//! standby takes over once the holder stopped renewing for `leaseDuration`.
//!
//! Safety argument (no two instances reconcile at once), with the local monotonic clock
//! only, so clock skew between nodes does not matter:
//! - a leader counts its claim from the moment it *sent* its last successful renewal and
//!   steps down `renewDeadline` later unless another renewal succeeded; every request is
//!   bounded by that same deadline, so a hung renewal cannot keep it leading;
//! - a standby counts another holder's claim from the moment *it observed* the Lease change
//!   (holder, renewTime or resourceVersion), which is after the holder sent it, and takes
//!   over only `leaseDuration` after that; it never compares the remote `renewTime` with its
//!   own clock.
//!
//! Since `renewDeadline < leaseDuration`, the old leader stopped before the standby starts.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::config::LeaderElectionConfig;
use crate::error::{Error, Result};

/// A holder's claim as last observed: who, which renewal, which version.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Claim {
    holder: String,
    renew_time: Option<Timestamp>,
    resource_version: Option<String>,
}

/// Judges whether another holder's claim expired by the local monotonic time of the last
/// observed change of the Lease, never by its remote `renewTime` (clocks of nodes differ).
#[derive(Debug, Default)]
pub struct ExpiryTracker {
    last: Option<(Claim, Instant)>,
}

impl ExpiryTracker {
    /// Records what was observed of the Lease at `now` and says whether the holder's claim
    /// expired: true only when nothing changed for `duration` since this tracker first saw
    /// the current claim. A claim seen for the first time is never expired, whatever its
    /// `renewTime` says.
    pub fn observe(
        &mut self,
        holder: &str,
        renew_time: Option<Timestamp>,
        resource_version: Option<&str>,
        duration: Duration,
        now: Instant,
    ) -> bool {
        let claim = Claim {
            holder: holder.to_string(),
            renew_time,
            resource_version: resource_version.map(str::to_string),
        };
        match &self.last {
            Some((seen, since)) if *seen == claim => {
                now.saturating_duration_since(*since) >= duration
            }
            _ => {
                self.last = Some((claim, now));
                false
            }
        }
    }

    /// Forgets the last observation (the next claim seen starts a new count).
    pub fn reset(&mut self) {
        self.last = None;
    }
}

/// Acquires, renews and releases the leader Lease.
#[derive(Debug, Clone)]
pub struct LeaderElector {
    api: Api<Lease>,
    namespace: String,
    identity: String,
    cfg: LeaderElectionConfig,
    observed: Arc<Mutex<ExpiryTracker>>,
}

/// A successful acquisition or renewal: the claim lasts from `sent`, when its request left.
#[derive(Debug, Clone, Copy)]
pub struct Renewed {
    /// When the request that renewed (or acquired) the Lease was sent.
    pub sent: Instant,
}

impl LeaderElector {
    /// An elector for Lease `cfg.lease_name` in `namespace`, holding as `identity`.
    pub fn new(client: Client, namespace: &str, identity: &str, cfg: LeaderElectionConfig) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            identity: identity.to_string(),
            cfg,
            observed: Arc::default(),
        }
    }

    fn lease_ref(&self) -> String {
        format!("{}/{}", self.namespace, self.cfg.lease_name)
    }

    fn duration_secs(&self) -> i32 {
        i32::try_from(self.cfg.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    fn tracker(&self) -> MutexGuard<'_, ExpiryTracker> {
        self.observed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One attempt: returns true when this instance holds the Lease afterwards. Not bounded
    /// in time: [`LeaderElector::acquire`] and [`LeaderElector::hold`] bound it.
    pub async fn try_acquire_or_renew(&self) -> Result<bool> {
        let name = &self.cfg.lease_name;
        let existing = self
            .api
            .get_opt(name)
            .await
            .map_err(|e| Error::kube(format!("get Lease {}", self.lease_ref()), e))?;
        // Written into the Lease for humans and other tools; never used for decisions.
        let now = Timestamp::now();
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(self.duration_secs()),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(Error::kube(format!("create Lease {}", self.lease_ref()), e)),
            };
        };
        let rv = lease.metadata.resource_version.clone();
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        if holder != self.identity {
            if !holder.is_empty() {
                let remote = u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0);
                let duration = if remote == 0 {
                    self.cfg.lease_duration
                } else {
                    Duration::from_secs(remote)
                };
                let expired = self.tracker().observe(
                    &holder,
                    spec.renew_time.as_ref().map(|t| t.0),
                    rv.as_deref(),
                    duration,
                    Instant::now(),
                );
                if !expired {
                    return Ok(false);
                }
                info!(lease = %self.lease_ref(), holder = %holder, ?duration, "the holder did not renew in time; taking over");
            }
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(self.duration_secs());
        match self.api.replace(name, &PostParams::default(), &lease).await {
            Ok(_) => {
                self.tracker().reset();
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(Error::kube(format!("update Lease {}", self.lease_ref()), e)),
        }
    }

    /// One attempt bounded by `deadline`: `Some` when this instance holds the Lease afterwards,
    /// with the instant the attempt started (its claim counts from then).
    async fn attempt(&self, deadline: Instant) -> Option<Renewed> {
        let sent = Instant::now();
        match tokio::time::timeout_at(deadline.into(), self.try_acquire_or_renew()).await {
            Ok(Ok(true)) => Some(Renewed { sent }),
            Ok(Ok(false)) => {
                debug!(lease = %self.lease_ref(), "another instance holds the Lease");
                None
            }
            Ok(Err(e)) => {
                warn!(error = %e, "leader election attempt failed");
                None
            }
            Err(_) => {
                warn!(lease = %self.lease_ref(), timeout = ?deadline.saturating_duration_since(sent), "leader election request timed out");
                None
            }
        }
    }

    /// Waits until this instance leads; `None` when `shutdown` turned true first. Each
    /// attempt is bounded by `renewDeadline`.
    pub async fn acquire(&self, shutdown: &mut watch::Receiver<bool>) -> Option<Renewed> {
        loop {
            if *shutdown.borrow() {
                return None;
            }
            let attempt = self.attempt(Instant::now() + self.cfg.renew_deadline);
            let won = tokio::select! {
                _ = shutdown.changed() => return None,
                r = attempt => r,
            };
            if let Some(r) = won {
                info!(lease = %self.lease_ref(), identity = %self.identity, "became leader");
                return Some(r);
            }
            tokio::select! {
                _ = shutdown.changed() => return None,
                _ = tokio::time::sleep(self.cfg.retry_period) => {}
            }
        }
    }

    /// Renews every `retryPeriod`, starting from the claim `since`, until `shutdown` (`Ok` with
    /// the last successful renewal; the Lease is still held, the caller stops its work before
    /// that claim runs out and then calls [`LeaderElector::release`]) or until no renewal
    /// succeeded within `renewDeadline` of the last one sent, or another holder appeared
    /// (`LeadershipLost`). It returns at the deadline even while a renewal hangs: the caller
    /// must stop reconciling at once, which is before the Lease can expire for others.
    pub async fn hold(
        &self,
        since: Renewed,
        shutdown: &mut watch::Receiver<bool>,
    ) -> std::result::Result<Renewed, Error> {
        let mut last = since;
        loop {
            let deadline = last.sent + self.cfg.renew_deadline;
            let lost = || {
                warn!(lease = %self.lease_ref(), deadline = ?self.cfg.renew_deadline, "no renewal succeeded in time; stepping down");
                Error::LeadershipLost {
                    lease: self.lease_ref(),
                }
            };
            let next = (Instant::now() + self.cfg.retry_period).min(deadline);
            tokio::select! {
                _ = shutdown.changed() => return Ok(last),
                _ = tokio::time::sleep_until(next.into()) => {}
            }
            if Instant::now() >= deadline {
                return Err(lost());
            }
            let sent = Instant::now();
            let r = tokio::select! {
                _ = shutdown.changed() => return Ok(last),
                r = tokio::time::timeout_at(deadline.into(), self.try_acquire_or_renew()) => r,
            };
            match r {
                Ok(Ok(true)) => last = Renewed { sent },
                Ok(Ok(false)) => {
                    warn!(lease = %self.lease_ref(), "another instance holds the Lease");
                    return Err(Error::LeadershipLost {
                        lease: self.lease_ref(),
                    });
                }
                Ok(Err(e)) => warn!(error = %e, "cannot renew the leader Lease"),
                Err(_) => return Err(lost()),
            }
        }
    }

    /// Gives the Lease up so a standby takes over at once (best effort, bounded by
    /// `renewDeadline`). Call it only once this instance stopped reconciling: the standby
    /// starts as soon as the Lease is free.
    pub async fn release(&self) {
        let deadline = self.cfg.renew_deadline;
        if tokio::time::timeout(deadline, self.release_unbounded())
            .await
            .is_err()
        {
            warn!(lease = %self.lease_ref(), ?deadline, "releasing the leader Lease timed out");
        }
    }

    async fn release_unbounded(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.cfg.lease_name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.renew_time = Some(MicroTime(
            Timestamp::now() - SignedDuration::from_secs(3600),
        ));
        if let Err(e) = self
            .api
            .replace(&self.cfg.lease_name, &PostParams::default(), &lease)
            .await
        {
            warn!(error = %e, "cannot release the leader Lease");
        } else {
            info!(lease = %self.lease_ref(), "released leadership");
        }
    }

    /// The configured retry period.
    pub fn retry_period(&self) -> Duration {
        self.cfg.retry_period
    }

    /// The configured renew deadline.
    pub fn renew_deadline(&self) -> Duration {
        self.cfg.renew_deadline
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECS_15: Duration = Duration::from_secs(15);

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn an_unchanged_claim_expires_a_lease_duration_after_it_was_first_seen() {
        let t0 = Instant::now();
        let renew = Some(Timestamp::now());
        let mut t = ExpiryTracker::default();
        assert!(!t.observe("a", renew, Some("1"), SECS_15, t0));
        assert!(!t.observe("a", renew, Some("1"), SECS_15, at(t0, 14_999)));
        assert!(t.observe("a", renew, Some("1"), SECS_15, at(t0, 15_000)));
    }

    #[test]
    fn any_change_of_the_claim_restarts_the_count() {
        let t0 = Instant::now();
        let renew = Some(Timestamp::now());
        let later = renew.map(|r| r + SignedDuration::from_secs(2));
        let mut t = ExpiryTracker::default();
        assert!(!t.observe("a", renew, Some("1"), SECS_15, t0));
        // New renewTime, new resourceVersion, new holder: each is a renewal.
        assert!(!t.observe("a", later, Some("1"), SECS_15, at(t0, 10_000)));
        assert!(!t.observe("a", later, Some("2"), SECS_15, at(t0, 20_000)));
        assert!(!t.observe("b", later, Some("2"), SECS_15, at(t0, 30_000)));
        assert!(!t.observe("b", later, Some("2"), SECS_15, at(t0, 44_999)));
        assert!(t.observe("b", later, Some("2"), SECS_15, at(t0, 45_000)));
    }

    #[test]
    fn remote_renew_time_in_the_far_future_or_past_does_not_matter() {
        let t0 = Instant::now();
        let day = SignedDuration::from_hours(24);
        for renew in [Timestamp::now() + day, Timestamp::now() - day] {
            let mut t = ExpiryTracker::default();
            assert!(!t.observe("a", Some(renew), Some("7"), SECS_15, t0));
            assert!(!t.observe("a", Some(renew), Some("7"), SECS_15, at(t0, 14_000)));
            assert!(t.observe("a", Some(renew), Some("7"), SECS_15, at(t0, 15_000)));
        }
        // No renewTime at all: also counted from first sight.
        let mut t = ExpiryTracker::default();
        assert!(!t.observe("a", None, Some("7"), SECS_15, t0));
        assert!(t.observe("a", None, Some("7"), SECS_15, at(t0, 15_000)));
    }

    #[test]
    fn reset_forgets_the_observation() {
        let t0 = Instant::now();
        let mut t = ExpiryTracker::default();
        assert!(!t.observe("a", None, Some("1"), SECS_15, t0));
        t.reset();
        assert!(!t.observe("a", None, Some("1"), SECS_15, at(t0, 60_000)));
    }
}
