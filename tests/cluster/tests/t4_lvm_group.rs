//! T4: multi-disk volumes assembled by the kernel (engine KernelLVM) on a host that is a
//! microVM with Debian 12's backports kernel (6.12), through the real CSI controller,
//! node-disk-controller and disk-agents: three storage nodes (network namespaces, SPDK
//! engine) whose pools are each smaller than the volume, so that its members must be on two
//! of them, and the third takes the member an expansion adds.
//!
//! For a linear volume (ext4) and a raid0 volume (xfs), one after the other in the same VM:
//! - CreateVolume places one member on each storage node; ControllerPublishVolume makes the
//!   VM node the host; the data control becomes ready.
//! - NodeStageVolume connects every member with the PV's keys, makes the VG and its LV
//!   (linear, or striped over both members with 64 KiB stripes) and mounts it; a second
//!   call changes nothing. NodePublishVolume bind-mounts it; data is written through it.
//! - NodeGetVolumeStats answers. Grown online: ControllerExpandVolume places a member on
//!   the third node, NodeExpandVolume connects it, extends the VG and the LV over it and
//!   grows the mounted file system; the data reads back.
//! - NodeUnstageVolume leaves no mount, LV device or NVMe controller (the member the
//!   expansion connected included); staging again only activates the VG (it is not made
//!   again) and the data reads back; unstaged again.
//! - DeleteVolume: no data control, group, member AntstorVolume or Secret is left, no lvol
//!   or subsystem on the storage nodes, and no PV, VG, LV, device-mapper device or NVMe
//!   controller in the VM.
//! - A volume deleted while staged and mounted: unpublish and unstage still succeed, within
//!   a minute (not the kernel's ctrl-loss-tmo), and leave nothing in the guest.
//!
//! Needs SPDK (the agent's `spdk` feature), root, network namespaces and a bootable VM;
//! elsewhere it prints one `SKIP` line.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use liteio_api::{AntstorDataControl, AntstorVolumeGroup, VolumeStatus};
use liteio_cluster_tests::*;
use liteio_csi::client::CsiClient;
use liteio_csi::csi::*;
use liteio_local::Engine;
use liteio_local::cluster::{Cluster, ClusterOptions, Role};
use liteio_local::demo::mount_capability;
use liteio_local::vm::Kernel;
use liteio_local::vm_node::VmNode;
use serde_json::{Value, json};
use tonic::Code;

/// `assert!` that fails the scenario with an error instead of a panic, so that the cluster
/// is still shut down and checked for leftovers.
macro_rules! check {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!("check failed: {}: {}", stringify!($cond), format!($($msg)+)));
        }
    };
}

const STEP: Duration = Duration::from_secs(120);
/// Each storage node's pool.
const POOL: u64 = 512 << 20;
/// The volume: larger than either pool; above xfs's 300 MiB least.
const SIZE: i64 = 640 << 20;
/// What an expansion adds: placed on the third node.
const GROW: i64 = 256 << 20;
/// The SPDK lvstore of the cluster's nodes.
const LVS: &str = "local-lvs";

/// The lvols and NVMe-oF subsystems (but the discovery one) of each storage node.
fn storage_state(c: &Cluster) -> Result<Vec<(usize, usize)>, String> {
    (1..=c.opts.nodes)
        .map(|k| {
            let sock = c.node_dir(k).join("spdk.sock");
            let lvols = liteio_tests::spdk_rpc::rpc(
                &sock,
                "bdev_lvol_get_lvols",
                json!({"lvs_name": LVS}),
            )?
            .as_array()
            .map_or(0, Vec::len);
            let subsystems =
                liteio_tests::spdk_rpc::rpc(&sock, "nvmf_get_subsystems", Value::Null)?
                    .as_array()
                    .map_or(0, |a| {
                        a.iter()
                            .filter(|s| !s["nqn"].as_str().unwrap_or("").contains("discovery"))
                            .count()
                    });
            Ok((lvols, subsystems))
        })
        .collect()
}

/// What of a multi-disk volume is left in the guest: NVMe controllers and devices,
/// device-mapper devices, mounts of `paths`, LVM's PVs, VGs and LVs (LVM sees every device
/// of the guest, which has no disk of its own).
async fn guest_leftovers(node: &mut VmNode, paths: &[&str]) -> String {
    let mut script = String::from(
        "ls /sys/class/nvme 2>/dev/null; ls /dev | grep -E '^nvme[0-9]'; ls /sys/block | grep '^dm-'; \
         pvs --noheadings 2>/dev/null; vgs --noheadings 2>/dev/null; lvs --noheadings 2>/dev/null;",
    );
    for p in paths {
        script.push_str(&format!(" grep -F ' {p} ' /proc/mounts;"));
    }
    script.push_str(" true");
    node.vm
        .sh(
            &format!("export LVM_SUPPRESS_FD_WARNINGS=1; {script}"),
            STEP,
        )
        .await
        .map(|o| o.output.trim().to_string())
        .unwrap_or_else(|e| e.to_string())
}

async fn guest(node: &mut VmNode, script: &str) -> Result<String, String> {
    node.vm
        .sh_ok(
            &format!("export LVM_SUPPRESS_FD_WARNINGS=1; {script}"),
            STEP,
        )
        .await
        .map_err(|e| format!("{script}: {e}"))
}

/// The sectors written to the guest's block device `dev` (`nvme1n1`) so far.
async fn sectors_written(node: &mut VmNode, dev: &str) -> Result<u64, String> {
    let stat = guest(node, &format!("cat /sys/block/{dev}/stat")).await?;
    stat.split_whitespace()
        .nth(6)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("/sys/block/{dev}/stat: {stat}"))
}

struct Case {
    pv: &'static str,
    raid: &'static str,
    fs: &'static str,
}

async fn stage(
    csi: &mut CsiClient,
    id: &str,
    staging: &str,
    fs: &str,
    secrets: &HashMap<String, String>,
) -> Result<Duration, String> {
    let t = Instant::now();
    csi.node
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.into(),
            volume_capability: Some(mount_capability(fs)),
            secrets: secrets.clone(),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("stage {id}: {:?}: {}", e.code(), e.message()))?;
    Ok(t.elapsed())
}

async fn publish(
    csi: &mut CsiClient,
    id: &str,
    staging: &str,
    target: &str,
    fs: &str,
    secrets: &HashMap<String, String>,
) -> Result<(), String> {
    csi.node
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.into(),
            target_path: target.into(),
            volume_capability: Some(mount_capability(fs)),
            secrets: secrets.clone(),
            ..Default::default()
        })
        .await
        .map(|_| ())
        .map_err(|e| format!("publish {id}: {}", e.message()))
}

/// Unpublishes and unstages; nothing of the volume may be left in the guest.
async fn release(
    node: &mut VmNode,
    csi: &mut CsiClient,
    id: &str,
    staging: &str,
    target: &str,
) -> Result<Duration, String> {
    csi.node
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.into(),
        })
        .await
        .map_err(|e| format!("unpublish {id}: {}", e.message()))?;
    let t = Instant::now();
    csi.node
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.into(),
        })
        .await
        .map_err(|e| format!("unstage {id}: {}", e.message()))?;
    let took = t.elapsed();
    // No mount, no LV device, no controller; the PV labels stay on the (disconnected)
    // members, so LVM sees nothing either.
    let left = guest_leftovers(node, &[staging, target]).await;
    if !left.is_empty() {
        return Err(format!("unstaging {id} left in the guest:\n{left}"));
    }
    let files = guest(node, &format!("ls -A {staging} 2>/dev/null; true")).await?;
    if !files.trim().is_empty() {
        return Err(format!(
            "unstaging {id} left files in {staging} (kubelet cannot remove it): {files}"
        ));
    }
    Ok(took)
}

/// CreateVolume of `case` (one member on each storage node, each smaller than the volume),
/// ControllerPublishVolume to the VM node, until the data control is ready; its id.
async fn create(
    c: &Cluster,
    node: &VmNode,
    ctl: &mut CsiClient,
    case: &Case,
) -> Result<String, String> {
    let Case { pv, raid, fs } = *case;
    println!("--- {pv}: {raid}, {fs}, {} MiB", SIZE >> 20);
    let params = HashMap::from([
        ("obnvmf/pv-type".to_string(), "VolumeGroup".to_string()),
        ("datacontrol/raid-level".to_string(), raid.to_string()),
        (
            "datacontrol/engine-type".to_string(),
            "KernelLVM".to_string(),
        ),
        ("volgroup/min-size".to_string(), "64Mi".to_string()),
        ("fsType".to_string(), fs.to_string()),
    ]);
    let t = Instant::now();
    let id = ctl
        .controller
        .create_volume(CreateVolumeRequest {
            name: pv.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: SIZE,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![mount_capability(fs)],
            parameters: params,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("CreateVolume {pv}: {:?}: {}", e.code(), e.message()))?
        .into_inner()
        .volume
        .ok_or("CreateVolume returned no volume")?
        .volume_id;
    check!(id.starts_with("dc-"), "{id}");
    // One member on each storage node, each smaller than the volume.
    let ms = group_volumes(c, pv).await?;
    let mut nodes: Vec<String> = ms.iter().map(|m| m.spec.target_node_id.clone()).collect();
    nodes.sort();
    println!(
        "CreateVolume in {:.2}s: members {:?}",
        t.elapsed().as_secs_f64(),
        ms.iter()
            .map(|m| format!(
                "{} on {}: {} MiB",
                m.name_any(),
                m.spec.target_node_id,
                m.spec.size_byte >> 20
            ))
            .collect::<Vec<_>>()
    );
    check!(
        nodes.len() == 2 && nodes[0] != nodes[1],
        "members of {pv} on two nodes: {nodes:?}"
    );
    check!(
        ms.iter().all(|m| (m.spec.size_byte as i64) < SIZE),
        "a member as large as the volume"
    );

    // ABORTED (the data control changed under the call: the controller writes it too) is
    // retried, as the external-attacher does.
    let mut attempts = 0;
    loop {
        attempts += 1;
        match ctl
            .controller
            .controller_publish_volume(ControllerPublishVolumeRequest {
                volume_id: id.clone(),
                node_id: node.name.clone(),
                volume_capability: Some(mount_capability(fs)),
                ..Default::default()
            })
            .await
        {
            Ok(_) => break,
            Err(e) if e.code() == Code::Aborted && attempts < 5 => {
                println!(
                    "ControllerPublishVolume {pv} aborted, retried: {}",
                    e.message()
                );
            }
            Err(e) => {
                return Err(format!(
                    "ControllerPublishVolume {pv} (attempt {attempts}): {:?}: {}",
                    e.code(),
                    e.message()
                ));
            }
        }
    }
    let t = Instant::now();
    eventually(
        c,
        &format!("{pv} ready"),
        120,
        Role::Controller(0),
        || async {
            get_opt::<AntstorDataControl>(c, pv)
                .await
                .is_some_and(|d| d.status.and_then(|s| s.status) == Some(VolumeStatus::Ready))
        },
    )
    .await?;
    println!(
        "data control ready {:.2}s after ControllerPublishVolume",
        t.elapsed().as_secs_f64()
    );
    Ok(id)
}

/// Grows the staged and mounted volume of `case` online by a member on the node that holds
/// none of it: ControllerExpandVolume, then NodeExpandVolume (with the PV's keys, as the
/// node-expand Secret), and checks the VG, the LV and the file system in the guest and the
/// data.
#[allow(clippy::too_many_arguments)]
async fn grow(
    c: &Cluster,
    node: &mut VmNode,
    csi: &mut CsiClient,
    ctl: &mut CsiClient,
    case: &Case,
    id: &str,
    staging: &str,
    target: &str,
    secrets: &HashMap<String, String>,
) -> Result<(), String> {
    let Case { pv, raid, fs } = *case;
    let before = fs_size(node, target).await?;
    let want = SIZE + GROW;
    let t = Instant::now();
    let placed = ctl
        .controller
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: id.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: want,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .map_err(|e| {
            format!(
                "ControllerExpandVolume {pv}: {:?}: {}",
                e.code(),
                e.message()
            )
        })?
        .into_inner();
    check!(
        placed.capacity_bytes >= want && placed.node_expansion_required,
        "{placed:?}"
    );
    let ms = group_volumes(c, pv).await?;
    let mut nodes: Vec<String> = ms.iter().map(|m| m.spec.target_node_id.clone()).collect();
    nodes.sort();
    check!(
        nodes == ["node-1", "node-2", "node-3"],
        "after the expansion {pv}'s members are on {nodes:?}"
    );
    println!(
        "ControllerExpandVolume {pv} to {} MiB in {:.2}s: members {:?}",
        want >> 20,
        t.elapsed().as_secs_f64(),
        ms.iter()
            .map(|m| format!("{}: {} MiB", m.spec.target_node_id, m.spec.size_byte >> 20))
            .collect::<Vec<_>>()
    );
    // NodeExpandVolume waits for the new member (ready, admitting this node); kubelet retries
    // what it answers while it is not.
    let t = Instant::now();
    let grown = loop {
        match csi
            .node
            .node_expand_volume(NodeExpandVolumeRequest {
                volume_id: id.into(),
                volume_path: target.into(),
                staging_target_path: staging.into(),
                capacity_range: Some(CapacityRange {
                    required_bytes: want,
                    limit_bytes: 0,
                }),
                volume_capability: Some(mount_capability(fs)),
                secrets: secrets.clone(),
            })
            .await
        {
            Ok(r) => break r.into_inner(),
            Err(e)
                if matches!(e.code(), Code::DeadlineExceeded | Code::Unavailable)
                    && t.elapsed() < STEP =>
            {
                println!("NodeExpandVolume {pv} retried: {}", e.message());
            }
            Err(e) => {
                return Err(format!(
                    "NodeExpandVolume {pv}: {:?}: {}",
                    e.code(),
                    e.message()
                ));
            }
        }
    };
    let after = fs_size(node, target).await?;
    println!(
        "NodeExpandVolume {pv} in {:.2}s: LV {} MiB, {fs} {} → {} MiB",
        t.elapsed().as_secs_f64(),
        grown.capacity_bytes >> 20,
        before >> 20,
        after >> 20
    );
    check!(grown.capacity_bytes >= want, "{grown:?}");
    check!(
        after >= before + (GROW as u64) * 9 / 10,
        "{fs} grew from {before} to {after} bytes only"
    );
    let report = guest(
        node,
        &format!(
            "pvs --noheadings -o pv_name,vg_name,pv_pe_alloc_count;              lvs --noheadings --units b --nosuffix -o segtype,stripes,devices {pv}/{pv}"
        ),
    )
    .await?;
    println!("guest after the expansion:\n{report}");
    let pvs = report
        .lines()
        .filter(|l| l.trim_start().starts_with("/dev/nvme") && l.contains(pv))
        .count();
    check!(pvs == 3, "three PVs in {pv}: {report}");
    if raid == "raid0" {
        // The first segment striped over the first two members, the new one linear.
        check!(
            report.contains("striped") && report.contains("linear"),
            "{report}"
        );
    }
    guest(
        node,
        &format!(
            "echo 3 > /proc/sys/vm/drop_caches; sha256sum < {target}/data | cmp - /tmp/{pv}.sum && \
             head -c {}M /dev/zero > {target}/more && sync",
            (GROW >> 20) / 2
        ),
    )
    .await
    .map_err(|e| format!("{pv}'s data after growing, or a write into the new space: {e}"))?;
    // Again: nothing changes.
    let again = csi
        .node
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: id.into(),
            volume_path: target.into(),
            staging_target_path: staging.into(),
            volume_capability: Some(mount_capability(fs)),
            secrets: secrets.clone(),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("second NodeExpandVolume {pv}: {}", e.message()))?
        .into_inner();
    check!(again.capacity_bytes == grown.capacity_bytes, "{again:?}");
    Ok(())
}

async fn one_volume(
    c: &Cluster,
    node: &mut VmNode,
    csi: &mut CsiClient,
    ctl: &mut CsiClient,
    case: &Case,
) -> Result<(), String> {
    let Case { pv, raid, fs } = *case;
    let id = create(c, node, ctl, case).await?;
    let secrets = secret_data(c, &liteio_api::naming::auth_secret(pv)).await?;
    let staging = format!("/tmp/stage/{pv}");
    let target = format!("/tmp/pods/{pv}/mount");
    let took = stage(csi, &id, &staging, fs, &secrets).await?;
    println!(
        "staged (2 NVMe/TCP connects with DH-HMAC-CHAP, pvcreate, vgcreate, lvcreate, mkfs.{fs}, mount) in {:.2}s",
        took.as_secs_f64()
    );
    // Again: nothing changes.
    stage(csi, &id, &staging, fs, &secrets).await?;
    publish(csi, &id, &staging, &target, fs, &secrets).await?;

    // What the host assembled.
    let report = guest(
        node,
        &format!(
            "pvs --noheadings --units b --nosuffix -o pv_name,vg_name,pv_pe_alloc_count; \
             lvs --noheadings --units b --nosuffix -o lv_name,segtype,stripes,stripe_size,lv_size,devices {pv}/{pv}; \
             vgs --noheadings -o vg_tags {pv}; findmnt -no FSTYPE,SOURCE {target}; \
             for c in /sys/class/nvme/nvme*; do echo \"$(basename $c) $(cat $c/subsysnqn) $(cut -c1-10 $c/dhchap_secret)\"; done"
        ),
    )
    .await?;
    println!("guest:\n{report}");
    // The report the CSI node parses, as this LVM prints it.
    let json = guest(
        node,
        &format!(
            "lvs --reportformat json --units b --nosuffix -o {} {pv}",
            liteio_csi::lvm::LV_FIELDS
        ),
    )
    .await?;
    println!("lvs --reportformat json:\n{json}");
    let parsed = liteio_csi::lvm::parse_lvs(&json).map_err(|e| e.to_string())?;
    check!(
        parsed.iter().all(|l| l.name == pv && l.active()),
        "{parsed:?}"
    );
    // `pvs`: one line per member, each in the VG with extents allocated to the LV.
    let pvs: Vec<Vec<&str>> = report
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.first().is_some_and(|d| d.starts_with("/dev/nvme")))
        .collect();
    check!(pvs.len() == 2, "two PVs: {report}");
    for p in &pvs {
        check!(p.get(1) == Some(&pv), "{report}");
        check!(
            p.get(2)
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|n| n > 0),
            "the LV uses both members: {report}"
        );
    }
    let segs: Vec<Vec<&str>> = report
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.first() == Some(&pv) && w.len() >= 5)
        .collect();
    match raid {
        "raid0" => {
            check!(segs.len() == 1, "{report}");
            check!(segs[0][1..4] == ["striped", "2", "65536"], "{report}");
        }
        _ => {
            check!(segs.iter().all(|s| s[1] == "linear"), "{report}");
            check!(segs.len() == 2, "one segment per member: {report}");
        }
    }
    let lv_size: i64 = segs[0][4]
        .parse()
        .map_err(|_| format!("lv_size: {report}"))?;
    println!("LV {} MiB for a {} MiB volume", lv_size >> 20, SIZE >> 20);
    check!(
        lv_size >= SIZE,
        "the LV is smaller than the volume: {lv_size}"
    );
    check!(report.contains(&format!("liteio.volume.{id}")), "{report}");
    check!(report.contains(fs), "{report}");
    check!(report.contains("/dev/mapper/"), "{report}");
    check!(
        report.matches("DHHC-1:").count() == 2,
        "both member controllers authenticated: {report}"
    );

    // Data through the file system; both members take writes.
    let devs: Vec<String> = pvs
        .iter()
        .map(|p| p[0].trim_start_matches("/dev/").to_string())
        .collect();
    let mut before = Vec::new();
    for d in &devs {
        before.push(sectors_written(node, d).await?);
    }
    guest(
        node,
        &format!(
            "head -c 48M /dev/urandom > /tmp/{pv}.data && cp /tmp/{pv}.data {target}/data && sync && \
             sha256sum < /tmp/{pv}.data > /tmp/{pv}.sum"
        ),
    )
    .await?;
    for (d, b) in devs.iter().zip(&before) {
        let after = sectors_written(node, d).await?;
        println!(
            "{d}: {} KiB written by the copy",
            after.saturating_sub(*b) / 2
        );
        if raid == "raid0" {
            check!(
                after.saturating_sub(*b) >= 16 << 10,
                "{d} took {} sectors of a 48 MiB striped write",
                after.saturating_sub(*b)
            );
        }
    }

    let stats = csi
        .node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: target.clone(),
            staging_target_path: staging.clone(),
        })
        .await
        .map_err(|e| format!("stats: {}", e.message()))?
        .into_inner();
    let total = stats
        .usage
        .iter()
        .find(|u| u.unit == volume_usage::Unit::Bytes as i32)
        .map_or(0, |u| u.total);
    check!(total > 500 << 20, "{stats:?}");
    check!(
        stats.volume_condition.as_ref().map(|c| c.abnormal) == Some(false),
        "the mounted group is healthy: {stats:?}"
    );
    grow(c, node, csi, ctl, case, &id, &staging, &target, &secrets).await?;

    // Unstaged, then staged again: the VG is found on the members and only activated.
    let took = release(node, csi, &id, &staging, &target).await?;
    println!(
        "unstaged (umount, vgchange -an, 3 disconnects) in {:.2}s",
        took.as_secs_f64()
    );
    let took = stage(csi, &id, &staging, fs, &secrets).await?;
    println!(
        "staged again (connect, vgchange -ay, mount) in {:.2}s",
        took.as_secs_f64()
    );
    publish(csi, &id, &staging, &target, fs, &secrets).await?;
    guest(
        node,
        &format!(
            "echo 3 > /proc/sys/vm/drop_caches; sha256sum < {target}/data | cmp - /tmp/{pv}.sum"
        ),
    )
    .await
    .map_err(|e| format!("{pv}'s data after the restage: {e}"))?;
    let log = node.csi_log(400).await;
    let created = log
        .lines()
        .filter(|l| l.contains("volume group created over the members") && l.contains(pv))
        .count();
    let activated = log
        .lines()
        .filter(|l| l.contains("volume group activated") && l.contains(pv))
        .count();
    check!(
        (created, activated) == (1, 1),
        "the restage made the VG again or did not activate it ({created} created, {activated} activated):\n{log}"
    );
    release(node, csi, &id, &staging, &target).await?;
    // Unstaged twice: nothing to do, no error.
    csi.node
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.clone(),
        })
        .await
        .map_err(|e| format!("second unstage: {}", e.message()))?;

    // Deleted: nothing of it anywhere.
    let t = Instant::now();
    ctl.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("delete {id}: {}", e.message()))?;
    eventually(
        c,
        &format!("{pv} and its members gone"),
        120,
        Role::Controller(0),
        || async {
            get_opt::<AntstorDataControl>(c, pv).await.is_none()
                && get_opt::<AntstorVolumeGroup>(c, pv).await.is_none()
                && group_volumes(c, pv).await.is_ok_and(|m| m.is_empty())
        },
    )
    .await?;
    eventually(c, "the storage nodes empty", 60, Role::Agent(1), || async {
        storage_state(c).is_ok_and(|s| s.iter().all(|&(l, n)| l == 0 && n == 0))
    })
    .await?;
    println!(
        "deleted, members and exports gone in {:.2}s",
        t.elapsed().as_secs_f64()
    );
    check!(
        secret_data(c, &liteio_api::naming::auth_secret(pv))
            .await
            .is_err(),
        "the PV's Secret outlives the volume"
    );
    let left = guest_leftovers(node, &[&staging, &target]).await;
    check!(left.is_empty(), "after DeleteVolume the guest has:\n{left}");
    Ok(())
}

/// A multi-disk volume deleted while it is staged and mounted (its members and their
/// exports go): unpublish and unstage still succeed, at once rather than after the
/// kernel's ctrl-loss-tmo, and leave nothing in the guest.
async fn deleted_while_staged(
    c: &Cluster,
    node: &mut VmNode,
    csi: &mut CsiClient,
    ctl: &mut CsiClient,
) -> Result<(), String> {
    let case = Case {
        pv: "pvc-gone",
        raid: "raid0",
        fs: "ext4",
    };
    let id = create(c, node, ctl, &case).await?;
    let secrets = secret_data(c, &liteio_api::naming::auth_secret(case.pv)).await?;
    let (staging, target) = ("/tmp/stage/pvc-gone", "/tmp/pods/pvc-gone/mount");
    stage(csi, &id, staging, case.fs, &secrets).await?;
    publish(csi, &id, staging, target, case.fs, &secrets).await?;
    guest(
        node,
        &format!("head -c 4M /dev/urandom > {target}/f && sync && echo more >> {target}/f"),
    )
    .await?;
    ctl.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("delete {id}: {}", e.message()))?;
    eventually(
        c,
        "pvc-gone's members and exports gone",
        120,
        Role::Controller(0),
        || async {
            get_opt::<AntstorDataControl>(c, case.pv).await.is_none()
                && group_volumes(c, case.pv).await.is_ok_and(|m| m.is_empty())
                && storage_state(c).is_ok_and(|s| s.iter().all(|&(l, n)| l == 0 && n == 0))
        },
    )
    .await?;
    let took = release(node, csi, &id, staging, target).await?;
    println!(
        "a multi-disk volume deleted under its mount: unstaged in {:.2}s",
        took.as_secs_f64()
    );
    // The kernel would hold the unmount's writes for ctrl-loss-tmo (600 s): the CSI node
    // deletes the members' controllers first.
    check!(took < Duration::from_secs(60), "unstaging took {took:?}");
    let log = node.csi_log(200).await;
    check!(
        log.matches("deleted its member's NVMe controllers before unmounting")
            .count()
            == 2,
        "the unstage did not delete both members' controllers first:\n{log}"
    );
    Ok(())
}

#[test]
fn kernel_lvm_multi_disk_volumes_are_assembled_on_a_kernel_host() {
    if skip_vm("t4 KernelLVM multi-disk volumes", &Kernel::Backports) {
        return;
    }
    let dir = scratch("t4-lvm-group");
    let mut opts = ClusterOptions::new(3, Engine::Spdk);
    opts.pool_bytes = POOL;
    with_cluster(&dir, opts, Duration::from_secs(1500), |c| {
        Box::pin(async move {
            let started = Instant::now();
            let mut node = vm_node(c, 1, Kernel::Backports).await?;
            let mut csi = liteio_csi::client::connect(&node.csi_endpoint())
                .await
                .map_err(|e| e.to_string())?;
            let mut ctl = liteio_csi::client::connect(&c.csi_controller_endpoint())
                .await
                .map_err(|e| e.to_string())?;
            let state = storage_state(c)?;
            check!(
                state == [(0, 0), (0, 0), (0, 0)],
                "the storage nodes start with (lvols, subsystems) {state:?}"
            );
            let left = guest_leftovers(&mut node, &[]).await;
            check!(left.is_empty(), "the guest starts with:\n{left}");
            let cases = [
                Case {
                    pv: "pvc-lin",
                    raid: "linear",
                    fs: "ext4",
                },
                Case {
                    pv: "pvc-r0",
                    raid: "raid0",
                    fs: "xfs",
                },
            ];
            for case in &cases {
                if let Err(e) = one_volume(c, &mut node, &mut csi, &mut ctl, case).await {
                    let log = node.csi_log(60).await;
                    return Err(format!("{e}\nCSI node log:\n{log}"));
                }
            }
            if let Err(e) = deleted_while_staged(c, &mut node, &mut csi, &mut ctl).await {
                let log = node.csi_log(60).await;
                return Err(format!("{e}\nCSI node log:\n{log}"));
            }
            node.vm.shutdown().await;
            println!(
                "three volumes in {:.1}s (VM included)",
                started.elapsed().as_secs_f64()
            );
            Ok(())
        })
    });
}
