//! T3: crash recovery of the `disk-agent` binary built with SPDK. The agent (its own SPDK and
//! NVMe/TCP exports) kills itself with SIGKILL at each crash point of the volume sync
//! (`LITEIO_AGENT_CRASH_AT`, see `liteio_agent::crash`), is restarted without the hook, and
//! must converge: the volume ready and exported (or gone when deleted), exactly one engine
//! object and one subsystem per live volume and nothing else (the SPDK side read from the
//! agent's SPDK over its JSON-RPC socket), and the data written through the export before the
//! kills reads back through the export after them. Twice: on an SPDK lvstore (an lvol per
//! volume) and on a file pool (a file per volume, exported through an aio bdev).
//!
//! This test process runs a second SPDK, polling on the other core, for the NVMe/TCP
//! initiator (SPDK 26.05's initiator refuses interrupt mode); the agent's runs in interrupt
//! mode, as in production on small nodes.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::binary::{AgentProc, DATA, DATA_OFFSET, data_pattern, spawn_agent};
use common::{HOST_B, MIB, rpc};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use liteio_agent::spdk::{SpdkOptions, bdev, initiator, io};
use liteio_api::keys::{self, finalizers};
use liteio_api::{AntstorVolume, VolumeStatus, naming};
use liteio_test_apiserver::TestApiServer;
use serde_json::{Value, json};

const LVS: &str = "lvs-crash";
const BASE_AIO: &str = "crash-aio";
/// Limit of one convergence (an agent start includes SPDK's and the lvstore's).
const CONVERGE: Duration = Duration::from_secs(45);

fn pattern(seed: u8) -> Vec<u8> {
    data_pattern(37, seed)
}

#[test]
fn killed_at_every_step_the_spdk_agent_converges_without_orphans_or_data_loss() {
    // The initiator's SPDK polls: keep it off the agent's core. The agent, started many
    // times, gets core 1, which other SPDK tests (core 0) do not lock.
    let opts = SpdkOptions {
        core_mask: "0x1".into(),
        interrupt_mode: false,
        mem_size_mb: 512,
        ..common::spdk::small("t3-crash")
    };
    common::with_spdk_opts(&opts, Duration::from_secs(480), async {
        scenario(Pool::Lvs).await;
        scenario(Pool::File).await;
    });
}

/// Volume `name` as the controller schedules it here, consumed by node-b.
fn volume(name: &str, uuid_tail: u32, size: u64) -> AntstorVolume {
    // Serial numbers and aio bdev names are the first 20 hex digits: vary those.
    common::remote_volume(
        name,
        &format!("{uuid_tail:08x}-5b6a-4978-8a9b-3f2e1d0c5b6a"),
        size,
    )
}

/// The pool engine of a scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pool {
    /// An SPDK lvstore on an aio file; volumes are lvols.
    Lvs,
    /// A directory of files; volumes are exported through aio bdevs.
    File,
}

/// What the node holds: engine objects (lvols of the lvstore, or files of the pool
/// directory), subsystem NQNs (the discovery subsystem left out) and aio bdevs (the
/// lvstore's base left out).
#[derive(Debug, PartialEq, Eq)]
struct TargetState {
    engine: BTreeSet<String>,
    subsystems: BTreeSet<String>,
    aio_bdevs: BTreeSet<String>,
}

async fn target_state(pool: Pool, sock: &Path, pool_dir: &Path) -> Option<TargetState> {
    let (sock, pool_dir) = (sock.to_path_buf(), pool_dir.to_path_buf());
    tokio::task::spawn_blocking(move || {
        let engine = match pool {
            Pool::Lvs => rpc(&sock, "bdev_lvol_get_lvols", json!({"lvs_name": LVS}))
                .ok()?
                .as_array()?
                .iter()
                .filter_map(|l| l.get("name")?.as_str().map(str::to_string))
                .collect(),
            Pool::File => std::fs::read_dir(pool_dir.join("volumes"))
                .ok()?
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .map(|n| n.strip_suffix(".img").map_or(n.clone(), str::to_string))
                .collect(),
        };
        let subsystems = rpc(&sock, "nvmf_get_subsystems", Value::Null).ok()?;
        let bdevs = rpc(&sock, "bdev_get_bdevs", Value::Null).ok()?;
        Some(TargetState {
            engine,
            subsystems: subsystems
                .as_array()?
                .iter()
                .filter(|s| s.get("subtype").and_then(Value::as_str) != Some("Discovery"))
                .filter_map(|s| s.get("nqn")?.as_str().map(str::to_string))
                .collect(),
            aio_bdevs: bdevs
                .as_array()?
                .iter()
                .filter(|b| b.get("product_name").and_then(Value::as_str) == Some("AIO disk"))
                .filter_map(|b| b.get("name")?.as_str().map(str::to_string))
                .filter(|n| n != BASE_AIO)
                .collect(),
        })
    })
    .await
    .unwrap()
}

struct Cluster {
    pool: Pool,
    _server: TestApiServer,
    client: kube::Client,
    api: Api<AntstorVolume>,
    dir: tempfile::TempDir,
    runs: u32,
    ctrlrs: u32,
    /// Live volumes and their UUIDs.
    live: BTreeMap<String, String>,
}

impl Cluster {
    fn pool_dir(&self) -> PathBuf {
        self.dir.path().join("pool")
    }

    fn sock(&self) -> PathBuf {
        self.dir.path().join("spdk.sock")
    }

    fn spawn(&mut self, crash_at: Option<&str>) -> AgentProc {
        self.runs += 1;
        spawn_agent(self.dir.path(), self.runs, crash_at)
    }

    async fn create(&mut self, name: &str, tail: u32, size: u64) {
        let v = volume(name, tail, size);
        self.live.insert(name.into(), v.spec.uuid.clone());
        self.api.create(&PostParams::default(), &v).await.unwrap();
    }

    /// Ready and exported with its target recorded.
    async fn ready(&self, agent: &AgentProc, name: &str) -> AntstorVolume {
        let api = self.api.clone();
        agent
            .converge(&format!("{name} ready and exported"), CONVERGE, || {
                let api = api.clone();
                async move {
                    let v = api.get_opt(name).await.unwrap()?;
                    (v.phase() == VolumeStatus::Ready
                        && v.spec.spdk_target.is_some()
                        && v.status.as_ref().is_none_or(|s| s.message.is_empty()))
                    .then_some(v)
                }
            })
            .await
    }

    /// Exactly one lvol and one subsystem per live volume, nothing else.
    async fn no_orphans(&self, agent: &AgentProc) {
        let want = TargetState {
            engine: self.live.keys().cloned().collect(),
            subsystems: self.live.values().map(|u| naming::subsys_nqn(u)).collect(),
            aio_bdevs: match self.pool {
                Pool::Lvs => BTreeSet::new(),
                Pool::File => self
                    .live
                    .values()
                    .map(|u| naming::aio_bdev_name(u))
                    .collect(),
            },
        };
        let deadline = tokio::time::Instant::now() + CONVERGE;
        loop {
            let seen = target_state(self.pool, &self.sock(), &self.pool_dir()).await;
            if seen.as_ref() == Some(&want) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the target holds {seen:?}, want {want:?}:\n{}",
                agent.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn finish_delete(&mut self, agent: &AgentProc, name: &str) {
        agent.finish_delete(&self.api, name, CONVERGE).await;
        self.live.remove(name);
        // Nothing of the volume is left: not even its keys.
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(self.client.clone(), keys::DEFAULT_NAMESPACE);
        let secret = naming::auth_secret(name);
        assert!(
            secrets.get_opt(&secret).await.unwrap().is_none(),
            "Secret {secret} of deleted volume {name} is left"
        );
    }

    /// Connects to the volume's export as the consuming host; returns the controller and
    /// the namespace bdev.
    async fn attach(&mut self, v: &AntstorVolume) -> (String, String) {
        let t = v.spec.spdk_target.clone().unwrap();
        self.ctrlrs += 1;
        let ctrlr = format!("c{}", self.ctrlrs);
        // The agent runs with its default nvmf.auth: dhchap; the host needs the volume's keys.
        let keys = common::consumer_keys(&self.client, v).await;
        let names = initiator::attach_tcp_auth(
            &ctrlr,
            "127.0.0.1",
            t.svc_id.parse().unwrap(),
            &t.subsys_nqn,
            HOST_B,
            None,
            &keys,
        )
        .await
        .unwrap();
        assert_eq!(names.len(), 1);
        (ctrlr, names[0].clone())
    }

    async fn detach(&self, ctrlr: &str, ns: &str) {
        initiator::detach(ctrlr).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while bdev::get(ns).await.unwrap().is_some() {
            assert!(tokio::time::Instant::now() < deadline, "{ns} stays");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Reads the data of `pvc-data` through its export; returns the namespace size.
    async fn assert_data_intact(&mut self, agent: &AgentProc) -> u64 {
        let v = self.ready(agent, DATA).await;
        let (ctrlr, ns) = self.attach(&v).await;
        let data = io::read_at(&ns, DATA_OFFSET, 64 * 1024).await.unwrap();
        let size = bdev::get(&ns).await.unwrap().unwrap().size_bytes();
        self.detach(&ctrlr, &ns).await;
        assert!(data == pattern(5), "the data of {DATA} changed");
        size
    }

    /// After a restart: every live volume ready and exported, no orphans, data intact.
    async fn converged(&mut self, agent: &AgentProc) {
        for name in self.live.keys() {
            self.ready(agent, name).await;
        }
        self.no_orphans(agent).await;
        self.assert_data_intact(agent).await;
    }
}

async fn scenario(pool: Pool) {
    let (server, client, dir) = common::test_cluster("warn").await;
    server
        .write_kubeconfig(&dir.path().join("kubeconfig"))
        .unwrap();
    let port = common::free_port();
    let storage = match pool {
        Pool::Lvs => format!(
            "storage:\n  pooling: {{name: {LVS}, mode: SpdkLVStore}}\n  bdev: {{type: aioBdev, name: {BASE_AIO}, size: {}, filePath: {}, createIfNotExist: true}}\n",
            256 * MIB,
            dir.path().join("pool.img").display(),
        ),
        Pool::File => format!(
            "storage:\n  pooling: {{name: file-crash, mode: File}}\n  file: {{path: {}, size: {}}}\n",
            dir.path().join("pool").display(),
            256 * MIB,
        ),
    };
    let cfg = format!(
        "{storage}spdk: {{coreMask: \"0x2\", interruptMode: true, noHuge: true, memSizeMiB: 512, rpcSocket: {}}}\n\
         nvmf: {{listenAddress: 127.0.0.1, portRange: {{start: {port}, end: {}}}}}\n",
        dir.path().join("spdk.sock").display(),
        port.saturating_add(40),
    );
    std::fs::write(dir.path().join("agent.yaml"), cfg).unwrap();
    // The consuming host publishes its NQN on its own pool object.
    common::consumer_pool(&client).await;
    let mut c = Cluster {
        pool,
        api: Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE),
        client: client.clone(),
        _server: server,
        dir,
        runs: 0,
        ctrlrs: 0,
        live: BTreeMap::new(),
    };

    // A ready volume with data written through its export.
    let agent = c.spawn(None);
    c.create(DATA, 1, 8 * MIB).await;
    let v = c.ready(&agent, DATA).await;
    let (ctrlr, ns) = c.attach(&v).await;
    io::write_at(&ns, DATA_OFFSET, pattern(5)).await.unwrap();
    assert!(io::read_at(&ns, DATA_OFFSET, 64 * 1024).await.unwrap() == pattern(5));
    c.detach(&ctrlr, &ns).await;
    c.no_orphans(&agent).await;
    agent.kill().await;

    // Provisioning, killed at each step.
    let steps = [
        "after-finalizer",
        "after-create",
        "after-record",
        "after-export",
        "before-ready",
    ];
    for (i, point) in steps.into_iter().enumerate() {
        let name = format!("pvc-{point}");
        let agent = c.spawn(Some(&format!("{point}:{name}")));
        // 10 MiB + 1 is rounded up to whole 4 MiB clusters.
        c.create(&name, 10 + i as u32, 10 * MIB + 1).await;
        agent.expect_crash(point, CONVERGE).await;
        let v = c.api.get(&name).await.unwrap();
        assert_ne!(
            v.phase(),
            VolumeStatus::Ready,
            "{point}: killed before ready"
        );
        assert!(
            v.finalizers()
                .contains(&finalizers::LOGIC_VOLUME.to_string()),
            "{point}: the finalizer comes first"
        );
        let agent = c.spawn(None);
        c.converged(&agent).await;
        let v = c.ready(&agent, &name).await;
        let recorded = match pool {
            Pool::Lvs => v.spec.spdk_lvol.as_ref().map(|l| l.name.as_str()),
            Pool::File => v.spec.kernel_lvol.as_ref().map(|l| l.name.as_str()),
        };
        assert_eq!(recorded, Some(name.as_str()));
        assert!(
            v.finalizers()
                .contains(&finalizers::SPDK_TARGET.to_string())
        );
        agent.kill().await;
    }

    // Killed after the create, then deleted while the agent is down.
    let agent = c.spawn(Some("after-create:pvc-gone"));
    c.create("pvc-gone", 30, 8 * MIB).await;
    agent.expect_crash("after-create", CONVERGE).await;
    c.api
        .delete("pvc-gone", &DeleteParams::default())
        .await
        .unwrap();
    let agent = c.spawn(None);
    c.finish_delete(&agent, "pvc-gone").await;
    c.converged(&agent).await;
    agent.kill().await;

    // Deletion, killed after the export went and after the lvol went.
    for (point, name) in [
        ("after-unexport", "pvc-after-export"),
        ("after-delete", "pvc-before-ready"),
    ] {
        let agent = c.spawn(Some(&format!("{point}:{name}")));
        c.ready(&agent, name).await;
        c.api.delete(name, &DeleteParams::default()).await.unwrap();
        agent.expect_crash(point, CONVERGE).await;
        let v = c.api.get(name).await.unwrap();
        assert!(
            v.finalizers()
                .contains(&finalizers::LOGIC_VOLUME.to_string()),
            "{point}: killed before the finalizers went"
        );
        let agent = c.spawn(None);
        c.finish_delete(&agent, name).await;
        c.converged(&agent).await;
        agent.kill().await;
    }

    // Expansion of the volume with data, killed after the lvol grew. 20 MiB + 1 is rounded
    // up to 24 MiB.
    let agent = c.spawn(Some(&format!("after-resize:{DATA}")));
    c.ready(&agent, DATA).await;
    common::expand(&c.api, DATA, 8 * MIB, 20 * MIB + 1).await;
    agent.expect_crash("after-resize", CONVERGE).await;
    let agent = c.spawn(None);
    let v = agent.expansion_recorded(&c.api, DATA, CONVERGE).await;
    assert_eq!(common::allocated_bytes(&v), Some("25165824"));
    c.converged(&agent).await;
    assert_eq!(c.assert_data_intact(&agent).await, 24 * MIB);
    agent.kill().await;
}
