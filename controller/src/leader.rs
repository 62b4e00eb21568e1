//! Leader election through a `coordination.k8s.io/v1` Lease: only the holder reconciles; a
//! standby takes over once the holder stopped renewing for `leaseDuration`.

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

/// Acquires, renews and releases the leader Lease.
#[derive(Debug, Clone)]
pub struct LeaderElector {
    api: Api<Lease>,
    namespace: String,
    identity: String,
    cfg: LeaderElectionConfig,
}

impl LeaderElector {
    /// An elector for Lease `cfg.lease_name` in `namespace`, holding as `identity`.
    pub fn new(client: Client, namespace: &str, identity: &str, cfg: LeaderElectionConfig) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            identity: identity.to_string(),
            cfg,
        }
    }

    fn lease_ref(&self) -> String {
        format!("{}/{}", self.namespace, self.cfg.lease_name)
    }

    fn duration_secs(&self) -> i32 {
        i32::try_from(self.cfg.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// One attempt: returns true when this instance holds the Lease afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool> {
        let now = Timestamp::now();
        let name = &self.cfg.lease_name;
        let existing = self
            .api
            .get_opt(name)
            .await
            .map_err(|e| Error::kube(format!("get Lease {}", self.lease_ref()), e))?;
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
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        if holder != self.identity {
            let dur = i64::from(spec.lease_duration_seconds.unwrap_or(0));
            let expired = spec
                .renew_time
                .as_ref()
                .is_none_or(|t| t.0 + SignedDuration::from_secs(dur) < now);
            if !holder.is_empty() && !expired {
                return Ok(false);
            }
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(self.duration_secs());
        match self.api.replace(name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(Error::kube(format!("update Lease {}", self.lease_ref()), e)),
        }
    }

    /// Waits until this instance leads; false when `shutdown` turned true first.
    pub async fn acquire(&self, shutdown: &mut watch::Receiver<bool>) -> bool {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    info!(lease = %self.lease_ref(), identity = %self.identity, "became leader");
                    return true;
                }
                Ok(false) => debug!(lease = %self.lease_ref(), "another instance leads"),
                Err(e) => warn!(error = %e, "leader election attempt failed"),
            }
            tokio::select! {
                _ = shutdown.changed() => return false,
                _ = tokio::time::sleep(self.cfg.retry_period) => {}
            }
            if *shutdown.borrow() {
                return false;
            }
        }
    }

    /// Renews every `retryPeriod` until `shutdown` (`Ok`; the Lease is still held, the caller
    /// stops its work and then calls [`LeaderElector::release`]) or until renewal failed for
    /// `renewDeadline` or another holder appeared (`LeadershipLost`).
    pub async fn hold(&self, shutdown: &mut watch::Receiver<bool>) -> Result<()> {
        let mut last_ok = Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.changed() => return Ok(()),
                _ = tokio::time::sleep(self.cfg.retry_period) => {}
            }
            match self.try_acquire_or_renew().await {
                Ok(true) => last_ok = Instant::now(),
                Ok(false) => {
                    warn!(lease = %self.lease_ref(), "another instance holds the Lease");
                    return Err(Error::LeadershipLost {
                        lease: self.lease_ref(),
                    });
                }
                Err(e) => {
                    warn!(error = %e, "cannot renew the leader Lease");
                    if last_ok.elapsed() >= self.cfg.renew_deadline {
                        return Err(Error::LeadershipLost {
                            lease: self.lease_ref(),
                        });
                    }
                }
            }
        }
    }

    /// Gives the Lease up so a standby takes over at once (best effort). Call it only once
    /// this instance stopped reconciling: the standby starts as soon as the Lease is free.
    pub async fn release(&self) {
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
