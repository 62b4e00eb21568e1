//! T1: two `node-disk-controller` processes with `--leader-elect` against the test API
//! server: exactly one leads and binds volumes; only the leader reports the pool's status and
//! Lease age and the volume that is not ready, and `promtool check metrics` has nothing to
//! say about either's `/metrics`; a
//! SIGKILLed leader is replaced once its Lease expired; a SIGTERMed leader releases the Lease
//! and its standby takes over at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::Api;
use liteio_api::size::GIB;
use liteio_controller::testing::*;
use liteio_test_apiserver::TestApiServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::time::timeout;

use common::*;

const LEASE: &str = "node-disk-controller";
/// Lease timings of the processes: short so failover is quick, far enough apart that an
/// expiry (≥ `LEASE_DURATION` − `RETRY`) and a release (≈ `RETRY`) cannot be confused.
const LEASE_DURATION: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_millis(200);

const CONFIG: &str = "\
liveness: {tick: 200ms}
leaderElection: {leaseName: node-disk-controller, leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 200ms}
";

/// One controller process; SIGKILLed when dropped.
struct Controller {
    identity: &'static str,
    addr: String,
    log: PathBuf,
    child: Child,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Controller {
    fn spawn(dir: &Path, identity: &'static str) -> Self {
        let addr = format!("127.0.0.1:{}", free_port());
        let log = dir.join(format!("{identity}.log"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_node-disk-controller"))
            .arg("--kubeconfig")
            .arg(dir.join("kubeconfig"))
            .arg("--config")
            .arg(dir.join("controller.yaml"))
            .args(["--metrics-addr", &addr, "--leader-elect"])
            .args(["--namespace", NS, "--identity", identity])
            .env("RUST_LOG", "info")
            .env_remove("POD_NAME")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Self {
            identity,
            addr,
            log,
            child,
        }
    }

    /// Status code and body of `GET path`, or `None` while nothing answers.
    async fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut s = timeout(
            Duration::from_secs(2),
            tokio::net::TcpStream::connect(&self.addr),
        )
        .await
        .ok()?
        .ok()?;
        let req = format!("GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr);
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        timeout(Duration::from_secs(2), s.read_to_end(&mut buf))
            .await
            .ok()?
            .ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let code = text.get(9..12)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
        Some((code, body))
    }

    /// The value of a metric line starting with `prefix` (0 when absent).
    async fn metric(&self, prefix: &str) -> Option<f64> {
        let (code, body) = self.get("/metrics").await?;
        if code != 200 {
            return None;
        }
        Some(
            body.lines()
                .filter(|l| l.starts_with(prefix))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum(),
        )
    }

    async fn is_leader(&self) -> Option<bool> {
        self.metric("liteio_controller_leader ")
            .await
            .map(|v| v == 1.0)
    }

    async fn ready(&self) -> bool {
        matches!(self.get("/readyz").await, Some((200, _)))
    }

    async fn volume_reconciles(&self) -> f64 {
        self.metric("liteio_controller_reconciles_total{kind=\"volume\"")
            .await
            .unwrap_or(0.0)
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.id().expect("the process is running");
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid} failed");
    }

    async fn wait_exit(&mut self) -> ExitStatus {
        timeout(Duration::from_secs(15), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{} did not exit\n{}", self.identity, self.logs()))
            .unwrap()
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- log of {} ---\n{}", self.identity, self.logs());
        }
    }
}

async fn holder(client: &Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    leases
        .get_opt(LEASE)
        .await
        .unwrap()
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty())
}

async fn transitions(client: &Client) -> i32 {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    leases
        .get(LEASE)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0)
}

/// Waits until `who` holds the Lease, says so in its metrics and is ready, while `other`
/// (if running) is a ready standby.
async fn wait_leader(client: &Client, who: &Controller, other: Option<&Controller>) {
    eventually_ok(&format!("{} leads", who.identity), || async {
        let h = holder(client).await;
        if h.as_deref() != Some(who.identity) {
            return Err(format!("Lease held by {h:?}"));
        }
        if who.is_leader().await != Some(true) || !who.ready().await {
            return Err(format!("{} not a ready leader yet", who.identity));
        }
        if let Some(o) = other
            && (o.is_leader().await != Some(false) || !o.ready().await)
        {
            return Err(format!("{} not a ready standby", o.identity));
        }
        Ok(())
    })
    .await;
}

/// The bind patch is visible before the reconcile that wrote it is counted.
async fn wait_reconciled(c: &Controller) {
    eventually(
        &format!("{} counted a volume reconcile", c.identity),
        || async { c.volume_reconciles().await >= 1.0 },
    )
    .await;
}

async fn add_volume(client: &Client, v: VolumeFixture) {
    let api: Api<liteio_api::AntstorVolume> = Api::namespaced(client.clone(), NS);
    api.create(&Default::default(), &v.build()).await.unwrap();
}

#[tokio::test]
async fn two_processes_one_leader_failover_and_clean_handover() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestApiServer::start().await.unwrap();
    server
        .write_kubeconfig(&dir.path().join("kubeconfig"))
        .unwrap();
    std::fs::write(dir.path().join("controller.yaml"), CONFIG).unwrap();
    let client = server.client().await.unwrap();
    let mut procs: Vec<Controller> = Vec::new();
    timeout(Duration::from_secs(90), async {
        ensure_ns(&client).await;
        create_pool(&client, pool("n1", 100 * GIB), Timestamp::now()).await;

        procs.push(Controller::spawn(dir.path(), "ctrl-a"));
        procs.push(Controller::spawn(dir.path(), "ctrl-b"));
        eventually_ok("a leader", || async {
            holder(&client)
                .await
                .map(|_| ())
                .ok_or_else(|| "no holder".to_string())
        })
        .await;
        let h = holder(&client).await.unwrap();
        let (li, si) = if h == "ctrl-a" { (0, 1) } else { (1, 0) };
        wait_leader(&client, &procs[li], Some(&procs[si])).await;

        // Only the leader reconciles: it binds v1, the standby never ran a reconcile.
        add_volume(&client, volume("v1", GIB)).await;
        wait_bound(&client, "v1", "n1").await;
        wait_reconciled(&procs[li]).await;
        assert_eq!(procs[si].volume_reconciles().await, 0.0);
        assert_eq!(procs[si].is_leader().await, Some(false));

        // The leader's view of the pool; the standby has none. Prometheus' linter on both.
        eventually_ok("the leader reports pool n1", || async {
            let (_, body) = procs[li].get("/metrics").await.ok_or("no answer")?;
            // v1 is bound to n1, and not ready (no agent serves it here).
            let v1_not_ready = body.lines().any(|l| {
                l.starts_with("liteio_controller_volume_not_ready_since_timestamp_seconds{")
                    && l.contains(r#"node="n1""#)
                    && l.contains(r#"volume="v1""#)
            });
            if body.contains(r#"liteio_controller_pool_status{pool="n1",status="ready"} 1"#)
                && body.contains(r#"liteio_controller_pool_lease_age_seconds{pool="n1"}"#)
                && v1_not_ready
            {
                Ok(())
            } else {
                Err(format!("not yet:\n{body}"))
            }
        })
        .await;
        for p in [&procs[li], &procs[si]] {
            let (code, body) = p.get("/metrics").await.unwrap();
            assert_eq!(code, 200);
            assert!(
                body.contains("# TYPE liteio_panics_total counter"),
                "{body}"
            );
            if p.identity == procs[si].identity {
                assert!(!body.contains("pool="), "a standby reports pools:\n{body}");
            }
            match liteio_tests::promtool::check_metrics(&body) {
                Ok(said) => assert_eq!(said, "", "{}: promtool check metrics:\n{said}", p.identity),
                Err(why) => println!("SKIP promtool check metrics: {why}"),
            }
        }

        // SIGKILL: nothing is released, the standby waits for the Lease to expire.
        let before = transitions(&client).await;
        let killed = Instant::now();
        procs[li].signal("-KILL");
        procs[li].wait_exit().await;
        wait_leader(&client, &procs[si], None).await;
        let took = killed.elapsed();
        assert!(
            took >= LEASE_DURATION - RETRY - Duration::from_millis(300),
            "the standby took the Lease after {took:?}, before it expired"
        );
        assert_eq!(transitions(&client).await, before + 1);
        add_volume(&client, volume("v2", GIB)).await;
        wait_bound(&client, "v2", "n1").await;
        wait_reconciled(&procs[si]).await;

        // A restarted process joins as a standby.
        procs[li] = Controller::spawn(dir.path(), "ctrl-a2");
        let (li, si) = (si, li);
        eventually_ok("ctrl-a2 is a ready standby", || async {
            if procs[si].is_leader().await == Some(false) && procs[si].ready().await {
                Ok(())
            } else {
                Err("not yet".into())
            }
        })
        .await;
        assert_eq!(holder(&client).await.as_deref(), Some(procs[li].identity));

        // SIGTERM: the leader stops reconciling, releases the Lease and exits 0; the standby
        // takes over well before the Lease would have expired.
        let stopped = Instant::now();
        procs[li].signal("-TERM");
        wait_leader(&client, &procs[si], None).await;
        let took = stopped.elapsed();
        assert!(
            took < LEASE_DURATION - RETRY,
            "clean handover took {took:?}; the Lease was not released"
        );
        let status = procs[li].wait_exit().await;
        assert!(status.success(), "{status:?}\n{}", procs[li].logs());
        add_volume(&client, volume("v3", GIB)).await;
        wait_bound(&client, "v3", "n1").await;
        wait_reconciled(&procs[si]).await;

        procs[si].signal("-TERM");
        let status = procs[si].wait_exit().await;
        assert!(status.success(), "{status:?}\n{}", procs[si].logs());
        assert_eq!(holder(&client).await, None, "the last leader released");
    })
    .await
    .unwrap_or_else(|_| {
        for p in &procs {
            eprintln!("--- log of {} ---\n{}", p.identity, p.logs());
        }
        panic!("timed out");
    });
}
