//! The `disk-agent` binary as a child process, for crash-recovery tests: spawned with a
//! config and a kubeconfig, its output in a log file, optionally armed with a crash point.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::NODE;

/// The volume with data that every crash scenario keeps across the kills.
pub const DATA: &str = "pvc-data";
/// Where in [`DATA`] its pattern is written.
pub const DATA_OFFSET: u64 = super::MIB;

/// The 64 KiB written to [`DATA`]: byte `i` is `i * step + seed` (wrapping).
pub fn data_pattern(step: u8, seed: u8) -> Vec<u8> {
    (0..64 * 1024)
        .map(|i: usize| (i as u8).wrapping_mul(step).wrapping_add(seed))
        .collect()
}

/// One `disk-agent` process; killed (SIGKILL) when dropped.
pub struct AgentProc {
    pub child: tokio::process::Child,
    pub log: PathBuf,
    pid: u32,
}

/// Spawns the agent with `dir/agent.yaml` and `dir/kubeconfig`, logging to
/// `dir/agent-<run>.log`; `crash_at` arms `LITEIO_AGENT_CRASH_AT`.
pub fn spawn_agent(dir: &Path, run: u32, crash_at: Option<&str>) -> AgentProc {
    let log = dir.join(format!("agent-{run}.log"));
    let out = std::fs::File::create(&log).unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_disk-agent"));
    cmd.arg("--config")
        .arg(dir.join("agent.yaml"))
        .arg("--node-id")
        .arg(NODE)
        .arg("--kubeconfig")
        .arg(dir.join("kubeconfig"))
        .arg("--host-nqn-file")
        .arg(dir.join("hostnqn"))
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .env_remove("NODE_ID")
        .env_remove(liteio_agent::crash::ENV)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .kill_on_drop(true);
    if let Some(c) = crash_at {
        cmd.env(liteio_agent::crash::ENV, c);
    }
    let child = cmd.spawn().unwrap();
    let pid = child.id().unwrap();
    AgentProc { child, log, pid }
}

/// Removes what a killed agent's SPDK leaves behind (its trace shared memory, 3.4 MiB of
/// RAM each, and DPDK's runtime directory); SPDK removes them only on an orderly stop.
fn remove_spdk_leftovers(pid: u32) {
    let _ = std::fs::remove_file(format!("/dev/shm/liteio-agent_trace.pid{pid}"));
    let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/spdk_pid{pid}"));
}

fn sigkill() -> i32 {
    rustix::process::Signal::KILL.as_raw()
}

impl AgentProc {
    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (at most `within`) for the process to kill itself at `point`; asserts it died
    /// by SIGKILL and logged the point.
    pub async fn expect_crash(mut self, point: &str, within: Duration) {
        let status = match tokio::time::timeout(within, self.child.wait()).await {
            Ok(s) => s.unwrap(),
            Err(_) => panic!("the agent did not crash at {point}:\n{}", self.log()),
        };
        remove_spdk_leftovers(self.pid);
        assert_eq!(
            status.signal(),
            Some(sigkill()),
            "the agent must die by SIGKILL at {point}, got {status}:\n{}",
            self.log()
        );
        let log = self.log();
        assert!(
            log.contains("crash point reached") && log.contains(point),
            "{log}"
        );
    }

    /// SIGKILL from outside.
    pub async fn kill(mut self) {
        self.child.start_kill().unwrap();
        let status = self.child.wait().await.unwrap();
        remove_spdk_leftovers(self.pid);
        assert_eq!(status.signal(), Some(sigkill()));
    }

    /// Polls `f` every 20 ms until it returns `Some`; after `within` panics with the log.
    pub async fn converge<T, F, Fut>(&self, what: &str, within: Duration, f: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        super::poll(within, f)
            .await
            .unwrap_or_else(|| panic!("timed out waiting for {what}:\n{}", self.log()))
    }

    /// Waits until volume `name`'s expansion is recorded (the CSI label gone) and it is
    /// ready again; returns it.
    pub async fn expansion_recorded(
        &self,
        api: &kube::Api<liteio_api::AntstorVolume>,
        name: &str,
        within: Duration,
    ) -> liteio_api::AntstorVolume {
        use kube::ResourceExt;
        use liteio_api::keys::labels;
        self.converge("expansion recorded", within, || async {
            let v = api.get(name).await.unwrap();
            (!v.labels().contains_key(labels::EXPANSION_ORIGINAL_SIZE)
                && v.phase() == liteio_api::VolumeStatus::Ready)
                .then_some(v)
        })
        .await
    }

    /// Waits until the agent dropped its finalizers of the deleting volume `name`, does the
    /// controller's part (drop `in-state`) and waits for the object to go.
    pub async fn finish_delete(
        &self,
        api: &kube::Api<liteio_api::AntstorVolume>,
        name: &str,
        within: Duration,
    ) {
        use kube::ResourceExt;
        let fin = liteio_api::keys::finalizers::IN_STATE.to_string();
        self.converge(
            &format!("{name}: agent finalizers gone"),
            within,
            || async {
                let v = api.get(name).await.unwrap();
                (v.finalizers() == std::slice::from_ref(&fin)).then_some(())
            },
        )
        .await;
        api.patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
        self.converge(&format!("{name} gone"), within, || async {
            api.get_opt(name).await.unwrap().is_none().then_some(())
        })
        .await;
    }
}
