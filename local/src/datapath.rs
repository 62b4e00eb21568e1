//! A volume's data path without the kernel's NVMe/TCP initiator: wait until the agent has
//! exported the volume, then run `nvmf-check` (SPDK's userspace initiator, a bin of the agent
//! built with SPDK) against the export as a given host, in a node's network namespace or
//! here.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use liteio_api::common::{SpdkTarget, VolumeStatus};
use liteio_api::{AntstorVolume, keys};

use crate::LocalError;

/// The initiator's binary name (next to `disk-agent` when the agent was built with SPDK).
pub const NVMF_CHECK: &str = "nvmf-check";

/// Whether the agent in `bin_dir` was built with SPDK: `LITEIO_AGENT_SPDK` (set by
/// scripts/run.sh) says so when set; otherwise `disk-agent --build-features` does.
pub fn agent_has_spdk(bin_dir: &Path) -> bool {
    if let Ok(v) = std::env::var("LITEIO_AGENT_SPDK") {
        return v == "1";
    }
    std::process::Command::new(bin_dir.join("disk-agent"))
        .arg("--build-features")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| {
            o.status.success()
                && String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .any(|l| l == "spdk")
        })
}

/// Whether this kernel has the NVMe/TCP initiator (can `nvme connect` and mount).
pub fn kernel_has_nvme_tcp() -> bool {
    Path::new("/sys/module/nvme_tcp").exists()
}

/// Waits until `name` is ready and exported; returns its export.
pub async fn wait_exported(
    client: &Client,
    name: &str,
    secs: u64,
    log: &Path,
) -> Result<SpdkTarget, LocalError> {
    let api: Api<AntstorVolume> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Ok(Some(v)) = api.get_opt(name).await {
            let ready = v
                .status
                .as_ref()
                .is_some_and(|s| s.status == VolumeStatus::Ready);
            if let Some(t) = v
                .spec
                .spdk_target
                .filter(|t| ready && !t.subsys_nqn.is_empty())
            {
                return Ok(t);
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(LocalError::NotReady {
                what: format!("volume {name} ready and exported"),
                secs,
                log: log.display().to_string(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A volume's authentication keys in a file for `nvmf-check --keys-file`: the Secret's data
/// as a JSON object of strings, which is what kubelet hands the CSI node. Mode 0600 in a
/// directory of the caller's; removed when dropped.
#[derive(Debug)]
pub struct KeysFile {
    path: PathBuf,
}

impl KeysFile {
    /// Where the keys are.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for KeysFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Plays kubelet's part for a consumer: reads volume `name`'s authentication Secret and
/// writes its keys to a [`KeysFile`] in `dir`. `None` when the volume has no Secret (the
/// agent exports it without authentication, `nvmf.auth: none`).
pub async fn keys_file(
    client: &Client,
    name: &str,
    dir: &Path,
) -> Result<Option<KeysFile>, LocalError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let vol = vols
        .get(name)
        .await
        .map_err(|e| LocalError::Config(format!("get AntstorVolume {name}: {e}")))?;
    let secret_name = vol.auth_secret_name();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let Some(secret) = secrets
        .get_opt(&secret_name)
        .await
        .map_err(|e| LocalError::Config(format!("get Secret {secret_name}: {e}")))?
    else {
        return Ok(None);
    };
    let mut map = serde_json::Map::new();
    for (k, v) in secret.data.unwrap_or_default() {
        let v = String::from_utf8(v.0).map_err(|_| {
            LocalError::Config(format!("Secret {secret_name}: data key {k} is not text"))
        })?;
        map.insert(k, serde_json::Value::String(v));
    }
    let path = dir.join(format!("keys-{name}-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let file = KeysFile { path };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&file.path)
        .map_err(|e| LocalError::Config(format!("write {}: {e}", file.path.display())))?;
    f.write_all(serde_json::Value::Object(map).to_string().as_bytes())
        .map_err(|e| LocalError::Config(format!("write {}: {e}", file.path.display())))?;
    Ok(Some(file))
}

/// The command that runs `nvmf-check` from `bin_dir` against `t` as the host NQN in
/// `hostnqn_file`, after `prefix` (e.g. `nsenter --net=…` for a node's namespace), with the
/// volume's keys when it has some; `extra` are its options (`--random-seconds 3`, ...).
/// Prints one JSON line last.
pub fn check_command(
    bin_dir: &Path,
    prefix: &[String],
    t: &SpdkTarget,
    hostnqn: HostNqn<'_>,
    keys: Option<&KeysFile>,
    extra: &[&str],
) -> tokio::process::Command {
    let bin = bin_dir.join(NVMF_CHECK);
    let mut cmd = match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = tokio::process::Command::new(first);
            c.args(rest).arg(&bin);
            c
        }
        None => tokio::process::Command::new(&bin),
    };
    cmd.args(["--address", &t.address, "--port", &t.svc_id])
        .args(["--subnqn", &t.subsys_nqn, "--json"]);
    match hostnqn {
        HostNqn::File(f) => cmd.arg("--hostnqn-file").arg(f),
        HostNqn::Nqn(n) => cmd.args(["--hostnqn", n]),
    };
    if let Some(k) = keys {
        cmd.arg("--keys-file").arg(k.path());
    }
    cmd.args(extra).stdin(Stdio::null()).kill_on_drop(true);
    cmd
}

/// Which host NQN `nvmf-check` presents.
#[derive(Debug, Clone, Copy)]
pub enum HostNqn<'a> {
    /// Read from a node's host NQN file.
    File(&'a Path),
    /// Given as is.
    Nqn(&'a str),
}

/// What one `nvmf-check` run said.
#[derive(Debug, Clone)]
pub struct CheckOutcome {
    /// Exit status (0 ok, 3 could not connect, 4 data differs, 5 I/O failed; -1 killed).
    pub code: i32,
    /// Its result (the last line of its output).
    pub result: serde_json::Value,
    /// Its human-readable lines, without the JSON one.
    pub lines: Vec<String>,
    /// Its stderr (SPDK's log).
    pub stderr: String,
}

/// Runs [`check_command`] to its end, within `limit`.
pub async fn run_check(
    mut cmd: tokio::process::Command,
    limit: Duration,
) -> Result<CheckOutcome, LocalError> {
    let out = tokio::time::timeout(limit, cmd.output())
        .await
        .map_err(|_| LocalError::Config(format!("{NVMF_CHECK} did not finish within {limit:?}")))?
        .map_err(|source| LocalError::Spawn {
            name: NVMF_CHECK,
            source,
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines: Vec<String> = stdout.lines().map(str::to_string).collect();
    let result = lines
        .pop()
        .and_then(|l| serde_json::from_str(&l).ok())
        .ok_or_else(|| {
            LocalError::Config(format!(
                "{NVMF_CHECK} printed no result: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            ))
        })?;
    Ok(CheckOutcome {
        code: out.status.code().unwrap_or(-1),
        result,
        lines,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}
