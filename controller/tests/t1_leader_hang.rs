//! T1: leader election when the API server stops answering one participant. Renewals of the
//! leader hang (held by the test API server, never answered): the leader steps down before
//! its Lease can expire for the other, the other takes over after expiry, and leadership
//! terms of the two never overlap. Also: a remote `renewTime` far in the future or the past
//! (clock skew) does not change when a standby takes over.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};
use liteio_controller::config::LeaderElectionConfig;
use liteio_controller::http::Health;
use liteio_controller::leader::LeaderElector;
use liteio_controller::metrics::Metrics;
use liteio_controller::run::{self, Options};
use liteio_test_apiserver::{Matcher, TestApiServer, Verb};
use tokio::sync::watch;
use tokio::time::timeout;

use common::*;

const LEASE: &str = "node-disk-controller";
/// Timings: the margin `LEASE_DURATION - RENEW_DEADLINE` is what keeps terms apart, large so
/// a loaded machine does not make the test flaky.
const LEASE_DURATION: Duration = Duration::from_secs(3);
const RENEW_DEADLINE: Duration = Duration::from_millis(1500);
const RETRY: Duration = Duration::from_millis(100);

fn election(lease: &str, duration: Duration) -> LeaderElectionConfig {
    LeaderElectionConfig {
        lease_name: lease.into(),
        lease_duration: duration,
        renew_deadline: RENEW_DEADLINE.min(duration / 2),
        retry_period: RETRY,
    }
}

/// One term of leadership: from `acquire` returning to `hold` returning.
#[derive(Debug, Clone, Copy)]
struct Term {
    who: &'static str,
    start: Instant,
    end: Option<Instant>,
}

#[derive(Debug, Clone, Default)]
struct Terms(Arc<Mutex<Vec<Term>>>);

impl Terms {
    fn begin(&self, who: &'static str) {
        let mut g = self.0.lock().unwrap();
        g.push(Term {
            who,
            start: Instant::now(),
            end: None,
        });
    }
    fn end(&self, who: &'static str) {
        let mut g = self.0.lock().unwrap();
        let now = Instant::now();
        if let Some(t) = g.iter_mut().rev().find(|t| t.who == who && t.end.is_none()) {
            t.end = Some(now);
        }
    }
    fn of(&self, who: &str) -> Vec<Term> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|t| t.who == who)
            .copied()
            .collect()
    }
    fn leading(&self, who: &str) -> bool {
        self.of(who).last().is_some_and(|t| t.end.is_none())
    }
    /// Panics when two participants' terms overlap (an open term lasts until now).
    fn assert_disjoint(&self) {
        let g = self.0.lock().unwrap().clone();
        let now = Instant::now();
        for (i, a) in g.iter().enumerate() {
            for b in &g[i + 1..] {
                if a.who == b.who {
                    continue;
                }
                let (ae, be) = (a.end.unwrap_or(now), b.end.unwrap_or(now));
                assert!(
                    ae <= b.start || be <= a.start,
                    "two leaders at once: {a:?} and {b:?}"
                );
            }
        }
    }
}

/// A participant driving the same loop as the controller's `run`: acquire, lead while
/// `hold` says so, go back to acquiring after losing; release on shutdown.
fn participate(
    elector: LeaderElector,
    who: &'static str,
    terms: Terms,
    mut shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(since) = elector.acquire(&mut shutdown).await {
            terms.begin(who);
            let r = elector.hold(since, &mut shutdown).await;
            terms.end(who);
            if r.is_ok() {
                elector.release().await;
                return;
            }
        }
    })
}

async fn named(server: &TestApiServer, who: &str) -> Client {
    server.named_client(who).await.unwrap()
}

#[tokio::test]
async fn hung_renewals_never_make_two_leaders() {
    timeout(Duration::from_secs(60), async {
        let server = TestApiServer::start().await.unwrap();
        ensure_ns(&server.client().await.unwrap()).await;
        let faults = server.faults();
        let terms = Terms::default();
        let (stop, rx) = watch::channel(false);
        let cfg = election(LEASE, LEASE_DURATION);
        let a = LeaderElector::new(named(&server, "a").await, NS, "a", cfg.clone());
        let b = LeaderElector::new(named(&server, "b").await, NS, "b", cfg);
        let ta = participate(a, "a", terms.clone(), rx.clone());
        eventually("a leads", || async { terms.leading("a") }).await;
        let tb = participate(b, "b", terms.clone(), rx.clone());

        // From now on, every Lease update of `a` is held without an answer.
        let hung_at = Instant::now();
        faults.hang(
            Matcher::new(Verb::Update, "leases")
                .named(LEASE)
                .from_client("a"),
        );
        eventually("a steps down", || async { !terms.leading("a") }).await;
        let a_end = terms.of("a")[0].end.unwrap();
        assert!(faults.hung() >= 1, "no renewal of a was held");
        assert!(
            a_end < hung_at + LEASE_DURATION,
            "a stepped down {:?} after its renewals hung; its Lease lasts {LEASE_DURATION:?}",
            a_end - hung_at
        );
        eventually("b takes over", || async { terms.leading("b") }).await;
        let b_start = terms.of("b")[0].start;
        assert!(b_start >= a_end);
        // a's last successful renewal was sent at most RETRY (plus a request) before the
        // hang: b must have waited for it to expire.
        assert!(
            b_start + RETRY + Duration::from_millis(200) >= hung_at + LEASE_DURATION,
            "b took over {:?} after a's renewals hung, before a's Lease expired",
            b_start - hung_at
        );
        terms.assert_disjoint();

        // Observation window: a keeps trying while b renews; a never leads again, neither
        // while its updates hang nor after they are released (a held update that goes on
        // now carries a stale resourceVersion).
        let window_end = Instant::now() + 2 * LEASE_DURATION;
        while Instant::now() < window_end {
            assert!(!terms.leading("a"), "a came back while b holds the Lease");
            if Instant::now() + LEASE_DURATION > window_end {
                faults.release_hangs();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(terms.of("a").len(), 1, "a led again: {:?}", terms.of("a"));
        assert!(terms.leading("b"), "b lost the Lease: {:?}", terms.of("b"));
        terms.assert_disjoint();

        stop.send_replace(true);
        ta.await.unwrap();
        tb.await.unwrap();
        terms.assert_disjoint();
    })
    .await
    .expect("timed out");
}

/// Starts the whole controller (`run`) as `id`, leader-elected, until `stop` turns true.
fn spawn_controller(
    client: Client,
    id: &str,
    config: &liteio_controller::config::Config,
    stop: &watch::Receiver<bool>,
) -> (
    Health,
    tokio::task::JoinHandle<liteio_controller::error::Result<()>>,
) {
    let health = Health::default();
    let opts = Options {
        config: config.clone(),
        namespace: NS.into(),
        leader_elect: true,
        identity: id.into(),
        health: health.clone(),
        metrics: Metrics::new().unwrap(),
        clock: None,
    };
    let task = tokio::spawn(run::run(client, opts, Vec::new(), stop.clone(), None));
    (health, task)
}

/// The whole controller (`run`): the leader whose renewals hang stops reconciling before its
/// Lease could expire and the other takes over. Both probe flags are sampled every
/// millisecond during the test (an observation, not a proof: the participant test above
/// checks the exact terms).
#[tokio::test]
async fn controller_steps_down_when_renewals_hang() {
    timeout(Duration::from_secs(60), async {
        let server = TestApiServer::start().await.unwrap();
        ensure_ns(&server.client().await.unwrap()).await;
        let faults = server.faults();
        let (stop, rx) = watch::channel(false);
        let mut config = test_config();
        config.leader_election = election(LEASE, LEASE_DURATION);
        let spawn = |client: Client, id: &str| spawn_controller(client, id, &config, &rx);
        let (ha, ta) = spawn(named(&server, "a").await, "a");
        eventually("a leads", || async { ha.leader.load(Ordering::SeqCst) }).await;
        let (hb, tb) = spawn(named(&server, "b").await, "b");
        let both = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (ha, hb, both) = (ha.clone(), hb.clone(), Arc::clone(&both));
            tokio::spawn(async move {
                loop {
                    if ha.leader.load(Ordering::SeqCst) && hb.leader.load(Ordering::SeqCst) {
                        both.store(true, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        };
        let hung_at = Instant::now();
        faults.hang(
            Matcher::new(Verb::Update, "leases")
                .named(LEASE)
                .from_client("a"),
        );
        eventually("a steps down", || async {
            !ha.leader.load(Ordering::SeqCst)
        })
        .await;
        assert!(
            hung_at.elapsed() < LEASE_DURATION,
            "a still reconciled {:?} after its renewals hung",
            hung_at.elapsed()
        );
        eventually("b takes over", || async {
            hb.leader.load(Ordering::SeqCst)
        })
        .await;
        faults.release_hangs();
        assert!(!ha.leader.load(Ordering::SeqCst));
        sampler.abort();
        assert!(!both.load(Ordering::SeqCst), "both controllers led at once");
        stop.send_replace(true);
        ta.await.unwrap().unwrap();
        tb.await.unwrap().unwrap();
    })
    .await
    .expect("timed out");
}

async fn put_foreign_lease(client: &Client, name: &str, renew: Timestamp, secs: i32) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("skewed".into()),
            lease_duration_seconds: Some(secs),
            acquire_time: Some(MicroTime(renew)),
            renew_time: Some(MicroTime(renew)),
            ..LeaseSpec::default()
        }),
    };
    leases.create(&PostParams::default(), &lease).await.unwrap();
}

/// A holder whose clock is a day ahead or behind: the standby takes over one lease duration
/// after it first saw the (then unchanged) Lease, neither never (future `renewTime`) nor at
/// once (past `renewTime`).
#[tokio::test]
async fn remote_clock_skew_does_not_change_expiry() {
    timeout(Duration::from_secs(30), async {
        let server = TestApiServer::start().await.unwrap();
        let client = server.client().await.unwrap();
        ensure_ns(&client).await;
        let duration = Duration::from_secs(2);
        let day = SignedDuration::from_hours(24);
        let mut tasks = Vec::new();
        for (lease, renew) in [
            ("skew-future", Timestamp::now() + day),
            ("skew-past", Timestamp::now() - day),
        ] {
            put_foreign_lease(&client, lease, renew, 2).await;
            let e = LeaderElector::new(client.clone(), NS, "standby", election(lease, duration));
            tasks.push(tokio::spawn(async move {
                let (_stop, mut rx) = watch::channel(false);
                let started = Instant::now();
                let won = e.acquire(&mut rx).await;
                (lease, won.is_some(), started.elapsed())
            }));
        }
        for t in tasks {
            let (lease, won, took) = t.await.unwrap();
            assert!(won, "{lease}: not acquired");
            assert!(
                took >= duration && took < duration + Duration::from_secs(2),
                "{lease}: taken over after {took:?}, the Lease lasts {duration:?} from first sight"
            );
        }
    })
    .await
    .expect("timed out");
}

/// Alone, a controller whose renewals hang steps down all the same (it cannot know nobody
/// else waits), and leads again once its requests are answered: losing the Lease does not
/// end the process.
#[tokio::test]
async fn lone_controller_leads_again_after_renewals_recover() {
    timeout(Duration::from_secs(60), async {
        let server = TestApiServer::start().await.unwrap();
        ensure_ns(&server.client().await.unwrap()).await;
        let faults = server.faults();
        let (stop, rx) = watch::channel(false);
        let mut config = test_config();
        config.leader_election = election(LEASE, LEASE_DURATION);
        let (health, task) = spawn_controller(named(&server, "a").await, "a", &config, &rx);
        eventually("a leads", || async { health.leader.load(Ordering::SeqCst) }).await;
        faults.hang(
            Matcher::new(Verb::Update, "leases")
                .named(LEASE)
                .from_client("a"),
        );
        eventually("a steps down", || async {
            !health.leader.load(Ordering::SeqCst)
        })
        .await;
        faults.release_hangs();
        eventually("a leads again", || async {
            health.leader.load(Ordering::SeqCst)
        })
        .await;
        assert!(!task.is_finished(), "run ended after losing the Lease");
        stop.send_replace(true);
        task.await.unwrap().unwrap();
    })
    .await
    .expect("timed out");
}
