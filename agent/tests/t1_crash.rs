//! T1: crash recovery of the `disk-agent` binary on the file engine. The agent kills itself
//! with SIGKILL at a crash point of the volume sync (`LITEIO_AGENT_CRASH_AT`, see
//! `liteio_agent::crash`); the test checks the state the kill left, restarts the agent
//! without the hook, and checks that the volume converges (ready, or gone when deleted),
//! that the pool holds exactly one file per live volume and nothing else, and that data
//! written to a ready volume before the kill reads back intact.
//!
//! The export points (`after-export`, `after-unexport`) need an NVMe-oF target: they are
//! covered by `t3_crash.rs` on the SPDK build.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::binary::{AgentProc, DATA, DATA_OFFSET, data_pattern, spawn_agent};
use common::{Env, MIB, POOL_CAP};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use liteio_api::keys::{self, finalizers, labels};
use liteio_api::{AntstorVolume, VolumeStatus};

/// Limit of one convergence; the binary retries failed reconciles every second.
const CONVERGE: Duration = Duration::from_secs(20);

fn pattern(seed: u8) -> Vec<u8> {
    data_pattern(29, seed)
}

fn volume(name: &str, uuid_tail: u32, size: u64) -> AntstorVolume {
    common::scheduled_volume(
        name,
        &format!("7e1c2d3a-4b5c-4d6e-8f70-{uuid_tail:012}"),
        size,
    )
}

struct Cluster {
    env: Env,
    api: Api<AntstorVolume>,
    runs: u32,
}

impl Cluster {
    async fn new() -> Self {
        let env = Env::new().await;
        env.server
            .write_kubeconfig(&env.dir.path().join("kubeconfig"))
            .unwrap();
        let cfg = format!(
            "storage:\n  pooling: {{name: dev-pool, mode: File}}\n  file: {{path: {}, size: {POOL_CAP}}}\n",
            env.pool_dir().display()
        );
        std::fs::write(env.dir.path().join("agent.yaml"), cfg).unwrap();
        let api = Api::namespaced(env.client.clone(), keys::DEFAULT_NAMESPACE);
        Self { env, api, runs: 0 }
    }

    fn spawn(&mut self, crash_at: Option<&str>) -> AgentProc {
        self.runs += 1;
        spawn_agent(self.env.dir.path(), self.runs, crash_at)
    }

    /// Polls `f` until it returns `Some`; on timeout panics with the agent's log.
    async fn converge<T, F, Fut>(&self, agent: &AgentProc, what: &str, f: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        agent.converge(what, CONVERGE, f).await
    }

    async fn ready(&self, agent: &AgentProc, name: &str) -> AntstorVolume {
        let api = self.api.clone();
        self.converge(agent, &format!("{name} ready"), || {
            let api = api.clone();
            async move {
                let v = api.get_opt(name).await.unwrap()?;
                (v.phase() == VolumeStatus::Ready).then_some(v)
            }
        })
        .await
    }

    async fn finish_delete(&self, agent: &AgentProc, name: &str) {
        agent.finish_delete(&self.api, name, CONVERGE).await;
    }

    /// Every entry of the pool's volume directory (work files included).
    fn pool_files(&self) -> BTreeSet<String> {
        std::fs::read_dir(self.env.pool_dir().join("volumes"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// The pool holds exactly one file per name, nothing else.
    fn assert_pool_holds(&self, names: &[&str]) {
        let want: BTreeSet<String> = names.iter().map(|n| format!("{n}.img")).collect();
        assert_eq!(
            self.pool_files(),
            want,
            "pool content (orphans or leftovers)"
        );
    }

    fn file(&self, name: &str) -> PathBuf {
        self.env.pool_dir().join(format!("volumes/{name}.img"))
    }

    /// A fresh cluster with `pvc-data` ready and written to; no agent running.
    async fn with_data() -> Self {
        let mut c = Self::new().await;
        let agent = c.spawn(None);
        c.create(DATA, 1, 8 * MIB).await;
        c.ready(&agent, DATA).await;
        write_pattern(&c.file(DATA), 1);
        agent.kill().await;
        c
    }

    /// Creates volume `name` (UUID tail `tail`) of `size` bytes.
    async fn create(&self, name: &str, tail: u32, size: u64) {
        self.api
            .create(&PostParams::default(), &volume(name, tail, size))
            .await
            .unwrap();
    }

    async fn delete(&self, name: &str) {
        self.api
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    /// The end of every scenario: the pool holds `names` only, the data volume's bytes are
    /// intact, and the agent is killed.
    async fn end(&self, agent: AgentProc, names: &[&str]) {
        self.assert_pool_holds(names);
        self.assert_data_intact();
        agent.kill().await;
    }

    fn assert_data_intact(&self) {
        let f = std::fs::File::open(self.file(DATA)).unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        f.read_exact_at(&mut buf, DATA_OFFSET).unwrap();
        assert!(buf == pattern(1), "data of {DATA} changed");
    }
}

fn write_pattern(path: &Path, seed: u8) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&pattern(seed), DATA_OFFSET).unwrap();
    f.sync_all().unwrap();
}

fn has(v: &AntstorVolume, f: &str) -> bool {
    v.finalizers().iter().any(|x| x == f)
}

/// What a kill at provisioning `point` leaves of the new volume: (its lvol recorded, its
/// file made).
fn left_at(point: &str) -> (bool, bool) {
    match point {
        "after-finalizer" => (false, false),
        "after-create" => (false, true),
        "after-record" | "before-ready" => (true, true),
        other => panic!("no provisioning crash point {other}"),
    }
}

/// Provisioning killed at `point` for a new volume (within 90 s); the restarted agent
/// finishes it.
async fn provisioning_crash(point: &str) {
    tokio::time::timeout(Duration::from_secs(90), provisioning_crash_at(point))
        .await
        .unwrap();
}

async fn provisioning_crash_at(point: &str) {
    let mut c = Cluster::with_data().await;
    let agent = c.spawn(Some(&format!("{point}:pvc-x")));
    c.create("pvc-x", 2, 10 * MIB + 1).await;
    agent.expect_crash(point, CONVERGE).await;
    let v = c.api.get("pvc-x").await.unwrap();
    assert_ne!(v.phase(), VolumeStatus::Ready, "killed before ready");
    assert!(
        has(&v, finalizers::LOGIC_VOLUME),
        "the finalizer comes before the engine volume"
    );
    let (recorded, made) = left_at(point);
    assert_eq!(
        v.spec.kernel_lvol.is_some(),
        recorded,
        "killed at {point}: the record"
    );
    assert_eq!(
        c.file("pvc-x").exists(),
        made,
        "killed at {point}: the create"
    );

    let agent = c.spawn(None);
    let v = c.ready(&agent, "pvc-x").await;
    assert_eq!(
        v.finalizers(),
        &[
            finalizers::IN_STATE.to_string(),
            finalizers::LOGIC_VOLUME.to_string()
        ]
    );
    assert_eq!(
        v.spec.kernel_lvol.as_ref().map(|l| l.name.as_str()),
        Some("pvc-x")
    );
    assert_eq!(common::allocated_bytes(&v), Some("12582912"));
    assert_eq!(std::fs::metadata(c.file("pvc-x")).unwrap().len(), 12 * MIB);
    c.end(agent, &[DATA, "pvc-x"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_the_finalizer_the_restart_creates_and_readies_the_volume() {
    provisioning_crash("after-finalizer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_create_the_restart_records_and_readies_the_volume() {
    provisioning_crash("after-create").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_the_record_the_restart_readies_the_volume() {
    provisioning_crash("after-record").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_before_ready_the_restart_readies_the_volume() {
    provisioning_crash("before-ready").await;
}

/// Killed after the file was made but before it was recorded, and the volume deleted while
/// the agent was down: the controller must wait for the agent (its finalizer is already
/// there), and the restarted agent must not leave the file behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_create_then_deleted_while_down_leaves_no_file() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let mut c = Cluster::with_data().await;
        let agent = c.spawn(Some("after-create:pvc-x"));
        c.create("pvc-x", 2, 8 * MIB).await;
        agent.expect_crash("after-create", CONVERGE).await;
        assert!(c.file("pvc-x").exists());
        assert!(has(
            &c.api.get("pvc-x").await.unwrap(),
            finalizers::LOGIC_VOLUME
        ));
        c.delete("pvc-x").await;

        let agent = c.spawn(None);
        c.finish_delete(&agent, "pvc-x").await;
        c.converge(&agent, "no file of pvc-x", || async {
            (!c.file("pvc-x").exists()).then_some(())
        })
        .await;
        c.end(agent, &[DATA]).await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_in_the_middle_of_a_deletion_the_restart_finishes_it() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let mut c = Cluster::with_data().await;
        let agent = c.spawn(None);
        c.create("pvc-x", 2, 8 * MIB).await;
        c.ready(&agent, "pvc-x").await;
        agent.kill().await;

        let agent = c.spawn(Some("after-delete:pvc-x"));
        c.delete("pvc-x").await;
        agent.expect_crash("after-delete", CONVERGE).await;
        let v = c.api.get("pvc-x").await.unwrap();
        assert!(
            has(&v, finalizers::LOGIC_VOLUME),
            "killed before the finalizer went"
        );
        assert!(!c.file("pvc-x").exists(), "killed after the file went");

        let agent = c.spawn(None);
        c.finish_delete(&agent, "pvc-x").await;
        c.end(agent, &[DATA]).await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_in_the_middle_of_an_expansion_the_restart_finishes_it() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let mut c = Cluster::with_data().await;
        let agent = c.spawn(Some(&format!("after-resize:{DATA}")));
        // As the CSI controller asks for it; 20 MiB + 1 rounds to 24 MiB.
        common::expand(&c.api, DATA, 8 * MIB, 20 * MIB + 1).await;
        agent.expect_crash("after-resize", CONVERGE).await;
        assert_eq!(std::fs::metadata(c.file(DATA)).unwrap().len(), 24 * MIB);
        let v = c.api.get(DATA).await.unwrap();
        assert!(v.labels().contains_key(labels::EXPANSION_ORIGINAL_SIZE));

        let agent = c.spawn(None);
        let v = agent.expansion_recorded(&c.api, DATA, CONVERGE).await;
        assert_eq!(common::allocated_bytes(&v), Some("25165824"));
        assert_eq!(std::fs::metadata(c.file(DATA)).unwrap().len(), 24 * MIB);
        c.end(agent, &[DATA]).await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_crash_point_is_refused_with_exit_2() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut c = Cluster::new().await;
        let mut agent = c.spawn(Some("after-lunch"));
        let status = agent.child.wait().await.unwrap();
        assert_eq!(status.code(), Some(2), "{}", agent.log());
        let log = agent.log();
        assert!(
            log.contains("after-lunch") && log.contains("after-create"),
            "{log}"
        );
    })
    .await
    .unwrap();
}
