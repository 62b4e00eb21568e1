//! T1: the Lease heartbeat keeps renewing through injected failures (LiteIO's bug: a failed
//! renewal was reported as success and renewals stopped).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::DeleteParams;
use liteio_api::keys;
use liteio_test_apiserver::{Matcher, Verb};

fn renew_time(l: &Lease) -> Option<Timestamp> {
    l.spec.as_ref()?.renew_time.as_ref().map(|t| t.0)
}

/// Waits until the Lease's renewTime is later than `after`; returns it.
async fn renewed_after(api: &Api<Lease>, after: Option<Timestamp>, within: Duration) -> Timestamp {
    eventually("a later renewTime", within, || async {
        let l = api.get_opt(NODE).await.ok()??;
        let t = renew_time(&l)?;
        (Some(t) > after).then_some(t)
    })
    .await
}

async fn setup() -> (Env, liteio_agent::agent::Agent, Api<Lease>, Timestamp) {
    let env = Env::new().await;
    let agent = env.start_agent().await;
    let api: Api<Lease> = Api::namespaced(env.client.clone(), keys::LEASE_NAMESPACE);
    let t = renewed_after(&api, None, Duration::from_secs(3)).await;
    (env, agent, api, t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_is_created_owned_by_the_pool_and_renewed() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let (_env, agent, api, t0) = setup().await;
        let l = api.get(NODE).await.unwrap();
        let spec = l.spec.as_ref().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some(NODE));
        assert_eq!(spec.lease_duration_seconds, Some(1));
        let owner = &l.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.kind, "StoragePool");
        assert_eq!(owner.name, NODE);
        assert!(!owner.uid.is_empty());
        let t1 = renewed_after(&api, Some(t0), Duration::from_secs(2)).await;
        renewed_after(&api, Some(t1), Duration::from_secs(2)).await;
        assert_eq!(agent.heartbeat().borrow().consecutive_failures, 0);
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

/// Lease updates failing with `code` (`reason`) are retried, and renewals resume (within
/// 30 s).
async fn survives_failed_updates(code: u16, reason: &str) {
    tokio::time::timeout(
        Duration::from_secs(30),
        survives_failed_updates_in_time(code, reason),
    )
    .await
    .unwrap();
}

async fn survives_failed_updates_in_time(code: u16, reason: &str) {
    let (env, agent, api, t0) = setup().await;
    let faults = env.server.faults();
    let before = faults.requests(Verb::Get, "leases");
    faults.fail_next(3, Matcher::new(Verb::Update, "leases"), code, reason);
    let mut state = agent.heartbeat();
    // The failures are seen and counted, not reported as success...
    state
        .wait_for(|s| s.consecutive_failures >= 1)
        .await
        .unwrap();
    // ...and renewals resume promptly (retries back off from 10 ms, never beyond the interval).
    let t1 = renewed_after(&api, Some(t0), Duration::from_secs(2)).await;
    renewed_after(&api, Some(t1), Duration::from_secs(2)).await;
    assert!(agent.ctx().metrics.heartbeat_failures() >= 3);
    assert!(
        faults.requests(Verb::Get, "leases") >= before + 3,
        "each failure re-fetches the Lease"
    );
    assert_eq!(agent.heartbeat().borrow().consecutive_failures, 0);
    agent.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_are_retried_with_a_fresh_lease() {
    survives_failed_updates(409, "Conflict").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_retried() {
    survives_failed_updates(500, "InternalError").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_timeout_are_failures_then_recover() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let (env, agent, api, _) = setup().await;
        let faults = env.server.faults();
        faults.delay(
            Matcher::new(Verb::Update, "leases"),
            Duration::from_millis(800),
        );
        let mut state = agent.heartbeat();
        state
            .wait_for(|s| s.consecutive_failures >= 2)
            .await
            .unwrap();
        assert_eq!(
            agent.heartbeat().borrow().last_error,
            Some(liteio_agent::error::ErrorKind::Timeout)
        );
        faults.clear();
        let t = api.get(NODE).await.ok().as_ref().and_then(renew_time);
        let t1 = renewed_after(&api, t, Duration::from_secs(3)).await;
        renewed_after(&api, Some(t1), Duration::from_secs(2)).await;
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lease_is_recreated() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let (_env, agent, api, _) = setup().await;
        let old_uid = api.get(NODE).await.unwrap().metadata.uid;
        api.delete(NODE, &DeleteParams::default()).await.unwrap();
        let l = eventually("a new Lease", Duration::from_secs(2), || async {
            let l = api.get_opt(NODE).await.ok()??;
            (l.metadata.uid != old_uid).then_some(l)
        })
        .await;
        renewed_after(&api, renew_time(&l), Duration::from_secs(2)).await;
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}
