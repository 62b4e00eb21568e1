//! Compute nodes as microVMs (real Linux kernels, joined to the cluster's bridge) and what
//! the tests run in them: a volume staged and published through the guest's CSI node, fio
//! with verification in the background, online growth; and the bench setting that lets a
//! VM's emulated CPU run beside polling reactors.

use std::collections::HashMap;

use liteio_csi::client::CsiClient;
use liteio_csi::csi::{
    CapacityRange, ControllerExpandVolumeRequest, NodeExpandVolumeRequest,
    NodePublishVolumeRequest, NodeStageVolumeRequest,
};
use liteio_local::cluster::{Cluster, Role};
use liteio_local::demo::mount_capability;

use crate::{create_volume_sized, err, eventually, is_ready, skip, volume};

/// Polling reactors take both cores of this machine and starve a VM's emulated CPU: the
/// threads of node `k`'s agent yield to it (`renice 15`; a test-bench setting: a storage
/// node's reactor polls a core of its own).
pub fn yield_to_the_vm(c: &Cluster, k: usize) -> Result<(), String> {
    let pid = c.pid(Role::Agent(k)).ok_or("no agent pid")?;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).map_err(err("tasks"))? {
        let tid = task
            .map_err(err("task"))?
            .file_name()
            .to_string_lossy()
            .into_owned();
        let _ = std::process::Command::new("renice")
            .args(["-n", "15", "-p", &tid])
            .output();
    }
    Ok(())
}

/// NodeStageVolume at `staging`, then NodePublishVolume at `target`, of volume `id` with a
/// mount of file system `fs`, as kubelet calls them for a pod, with the stage `secrets`.
pub async fn stage_and_publish(
    csi: &mut CsiClient,
    id: &str,
    staging: &str,
    target: &str,
    fs: &str,
    secrets: HashMap<String, String>,
) -> Result<(), String> {
    csi.node
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: id.to_string(),
            staging_target_path: staging.into(),
            volume_capability: Some(mount_capability(fs)),
            secrets: secrets.clone(),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("stage {fs}: {}", e.message()))?;
    csi.node
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: id.to_string(),
            staging_target_path: staging.into(),
            target_path: target.into(),
            volume_capability: Some(mount_capability(fs)),
            secrets,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("publish {fs}: {}", e.message()))?;
    Ok(())
}

/// Whether a test with a VM node on `kernel` cannot run here (no network namespaces, no
/// bootable VM, no socat to reach the guest's CSI socket); prints its one SKIP line.
pub fn skip_vm(test: &str, kernel: &liteio_local::vm::Kernel) -> bool {
    if skip(test) {
        return true;
    }
    let why = liteio_local::vm::unavailable(kernel).or_else(|| {
        liteio_local::vm::which("socat")
            .is_none()
            .then(|| "no socat (Debian package socat)".to_string())
    });
    if let Some(why) = why {
        println!("SKIP {test}: {why}");
        return true;
    }
    false
}

/// Boots compute node `n` as a microVM with `kernel` ([`Cluster::add_vm_node`]) and prints
/// its boot and readiness times.
pub async fn vm_node(
    c: &mut Cluster,
    n: u8,
    kernel: liteio_local::vm::Kernel,
) -> Result<liteio_local::vm_node::VmNode, String> {
    let started = std::time::Instant::now();
    let node = c.add_vm_node(n, kernel).await.map_err(|e| e.to_string())?;
    println!(
        "VM node {} at {} ready after {:.1}s (boot {:.1}s)",
        node.name,
        node.address,
        started.elapsed().as_secs_f64(),
        node.vm.booted_in().as_secs_f64()
    );
    Ok(node)
}

/// The size of the file system mounted at `path` in the guest of `node`, in bytes.
pub async fn fs_size(node: &mut liteio_local::vm_node::VmNode, path: &str) -> Result<u64, String> {
    let out = node
        .vm
        .sh_ok(
            &format!("df --output=size -B1 {path} | tail -n 1"),
            std::time::Duration::from_secs(120),
        )
        .await
        .map_err(|e| e.to_string())?;
    out.trim()
        .parse()
        .map_err(|e| format!("df said {out:?}: {e}"))
}

/// Grows volume `id`, published at `target` with file system `fs`, to `bytes` online as the
/// CO does (ControllerExpandVolume, then NodeExpandVolume on the node); returns the file
/// system's size before and after, and how long the node's part took.
#[allow(clippy::too_many_arguments)]
pub async fn grow_online(
    node: &mut liteio_local::vm_node::VmNode,
    ctl: &mut CsiClient,
    csi: &mut CsiClient,
    id: &str,
    staging: &str,
    target: &str,
    fs: &str,
    bytes: i64,
) -> Result<(u64, u64, std::time::Duration), String> {
    let before = fs_size(node, target).await?;
    let grow = CapacityRange {
        required_bytes: bytes,
        limit_bytes: 0,
    };
    ctl.controller
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: id.to_string(),
            capacity_range: Some(grow),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("controller expand: {}", e.message()))?;
    let t = std::time::Instant::now();
    csi.node
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: id.to_string(),
            volume_path: target.into(),
            staging_target_path: staging.into(),
            capacity_range: Some(grow),
            volume_capability: Some(mount_capability(fs)),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("node expand {fs}: {}", e.message()))?;
    let took = t.elapsed();
    let after = fs_size(node, target).await?;
    Ok((before, after, took))
}

/// Creates `name` (`bytes`) through CSI for consumer `node` with `positionAdvice:
/// MustRemote` (stored on a storage node, exported to the consumer) and waits until it is
/// ready; returns its volume id.
pub async fn remote_volume_for(
    c: &Cluster,
    name: &str,
    node: &str,
    bytes: i64,
) -> Result<String, String> {
    let params = HashMap::from([("positionAdvice".to_string(), "MustRemote".to_string())]);
    let id = create_volume_sized(c, name, Some(node.to_string()), params, bytes)
        .await
        .map_err(err("join"))??;
    eventually(c, &format!("{name} ready"), 120, Role::Agent(1), || async {
        volume(c, name).await.is_some_and(|v| is_ready(&v))
    })
    .await?;
    Ok(id)
}

/// Starts fio in the guest of `node` in the background: 4 KiB random writes at queue depth
/// 8 with crc32c verification on a 32 MiB `file`, for `runtime` seconds (or until SIGINT);
/// returns once fio is writing (its file has its size).
pub async fn start_fio(
    node: &mut liteio_local::vm_node::VmNode,
    file: &str,
    runtime: u32,
) -> Result<(), String> {
    let step = std::time::Duration::from_secs(120);
    node.vm
        .sh_ok(
            &format!(
                "cd /tmp; setsid fio --name=t4 --filename={file} --size=32M --rw=randwrite --bs=4k \
                 --iodepth=8 --ioengine=libaio --direct=1 --verify=crc32c --do_verify=1 --time_based \
                 --runtime={runtime} --output-format=json --output=/tmp/fio.json >/tmp/fio.out 2>&1 </dev/null 3>&- &"
            ),
            step,
        )
        .await
        .map_err(|e| e.to_string())?;
    let writing = format!("test \"$(stat -c %s {file} 2>/dev/null)\" = 33554432");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !node
        .vm
        .sh(&writing, step)
        .await
        .map_err(|e| e.to_string())?
        .success()
    {
        if std::time::Instant::now() > deadline {
            return Err("fio did not start writing within 60 s".into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    Ok(())
}

/// Whether fio still runs in the guest.
pub async fn fio_running(node: &mut liteio_local::vm_node::VmNode) -> Result<bool, String> {
    node.vm
        .sh("pgrep -x fio", std::time::Duration::from_secs(120))
        .await
        .map(|o| o.success())
        .map_err(|e| e.to_string())
}

/// What fio reported.
#[derive(Debug)]
pub struct FioResult {
    /// fio's job error (0: none).
    pub error: serde_json::Value,
    /// Writes completed.
    pub writes: u64,
    /// The longest write, in milliseconds.
    pub max_write_ms: f64,
    /// fio's own output and the guest kernel's NVMe messages.
    pub log: String,
}

/// Waits up to `limit` for fio (of [`start_fio`]) to end and reads its report; when it does
/// not end, the error says what the kernel's controllers and fio were doing.
pub async fn fio_result(
    node: &mut liteio_local::vm_node::VmNode,
    limit: std::time::Duration,
) -> Result<FioResult, String> {
    let step = std::time::Duration::from_secs(120);
    let deadline = std::time::Instant::now() + limit;
    while fio_running(node).await? {
        if std::time::Instant::now() > deadline {
            let why = node
                .vm
                .sh("for c in /sys/class/nvme/nvme*; do echo \"$c $(cat $c/state) $(cat $c/address)\"; done; cat /tmp/fio.out; dmesg | tail -n 40", step)
                .await
                .map(|o| o.output)
                .unwrap_or_default();
            return Err(format!(
                "fio did not finish within {}s:\n{why}",
                limit.as_secs()
            ));
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    let json = node
        .vm
        .sh_ok("cat /tmp/fio.json", step)
        .await
        .map_err(|e| e.to_string())?;
    let log = node
        .vm
        .sh(
            "cat /tmp/fio.out; dmesg | grep -iE 'nvme|I/O error' | tail -n 30",
            step,
        )
        .await
        .map_err(|e| e.to_string())?
        .output;
    let start = json
        .find('{')
        .ok_or_else(|| format!("no fio JSON: {json}\n{log}"))?;
    let report: serde_json::Value =
        serde_json::from_str(&json[start..]).map_err(|e| format!("{e}: {json}"))?;
    let job = &report["jobs"][0];
    Ok(FioResult {
        error: job["error"].clone(),
        writes: job["write"]["total_ios"].as_u64().unwrap_or(0),
        max_write_ms: job["write"]["clat_ns"]["max"].as_f64().unwrap_or(0.0) / 1e6,
        log,
    })
}
