//! T4: kubernetes-csi's `csi-sanity` (v5.3.1) run inside a microVM with Debian 12's stock
//! kernel (6.1, which cannot authenticate NVMe/TCP connections), against the real stack on the SPDK engine: the controller service, agent and
//! API server of a one-machine cluster on the host (one storage node in a network
//! namespace), the CSI node plugin in the VM. So the Node Service specs run for real
//! (NodeStage connects with the kernel's NVMe/TCP host, formats, mounts; NodeExpand grows
//! online), where the host-only run (`t3_csi_sanity`) must skip them.
//!
//! csi-sanity reaches the controller service through a TCP forwarder on the cluster
//! bridge's address (socat on the host, to the controller's unix socket) and the node
//! plugin through its unix socket in the guest. Its volumes are created with the
//! StorageClass parameter `liteio.io/host-auth: preferred`: the node plugin has published
//! that its kernel cannot authenticate, so each export admits this host's NQN alone, and
//! NodeStage connects without keys. (csi-sanity could not pass them anyway: it hands every
//! NodeStage the same fixed secrets, while each LiteIO volume has keys of its own. The
//! DH-HMAC-CHAP path is `t4_kernel_host`'s.)
//!
//! Needs SPDK, root, network namespaces, a bootable VM, socat and csi-sanity (built from
//! its vendored sources: it is in no registry); elsewhere one `SKIP` line.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use liteio_cluster_tests::*;
use liteio_local::Engine;
use liteio_local::cluster::ClusterOptions;
use liteio_local::sanity;
use liteio_local::vm::{Kernel, which};

/// The controller service's TCP port on the bridge address.
const CONTROLLER_PORT: u16 = 10_001;
/// Specs that create their volume without accessibility requirements and stage it on the
/// node under test anyway: the controller binds such a volume to the storage node it lands
/// on, and ControllerPublishVolume (which csi-sanity calls first, as the CO's attach would)
/// moves its consumer to the VM. They must run and pass here.
const PUBLISH_MOVES: [&str; 3] = [
    "should remove target path",
    "should fail when volume does not exist on the specified path",
    "should work if node-expand is called after node-publish",
];
/// ControllerModifyVolume's specs that need `--csi.testvolumemutableparameters` (QoS limits
/// as a VolumeAttributesClass sets them) and the SPDK engine.
const MODIFY: [&str; 2] = [
    "should modify a volume created with a volume attribute class",
    "should modify a volume created without a volume attribute class",
];
/// The whole csi-sanity run in the guest (TCG: a few minutes).
const SANITY_LIMIT: Duration = Duration::from_secs(1500);

#[test]
fn csi_sanity_in_a_debian_12_vm_on_the_spdk_engine() {
    if skip_vm("t4 csi-sanity", &Kernel::Stock) {
        return;
    }
    let Some(bin) = sanity::find_csi_sanity() else {
        println!("SKIP t4 csi-sanity: not installed (put csi-sanity on PATH or set CSI_SANITY)");
        return;
    };
    let dir = scratch("t4-csi-sanity");
    let mut opts = ClusterOptions::new(1, Engine::Spdk);
    // csi-sanity keeps several 512 MiB volumes and snapshots at once (sparse).
    opts.pool_bytes = 16 << 30;
    with_cluster(&dir, opts, Duration::from_secs(2400), |c| {
        Box::pin(async move {
            let mut node = vm_node(c, 1, Kernel::Stock).await?;
            // The controller service, reachable from the guest.
            let listen = format!(
                "TCP-LISTEN:{CONTROLLER_PORT},bind={},reuseaddr,fork",
                c.net.bridge_address()
            );
            let socket = c
                .csi_controller_endpoint()
                .trim_start_matches("unix://")
                .to_string();
            let mut forward = tokio::process::Command::new(which("socat").ok_or("no socat")?)
                .args([listen, format!("UNIX-CONNECT:{socket}")])
                .kill_on_drop(true)
                .spawn()
                .map_err(err("start socat"))?;
            let controller = format!("{}:{CONTROLLER_PORT}", c.net.bridge_address());
            let script = format!(
                "mkdir -p /tmp/sanity && cd /tmp/sanity && \
                 printf 'liteio.io/host-auth: preferred\\n' > params.yaml && \
                 printf 'liteio.io/qos-iops: \"2000\"\\nliteio.io/qos-write-mbps: \"50\"\\n' > mutable.yaml && \
                 {bin} --csi.endpoint=/tmp/liteio/csi.sock --csi.controllerendpoint={controller} \
                 --csi.stagingdir=/tmp/sanity/staging --csi.mountdir=/tmp/sanity/mount \
                 --csi.testvolumesize=536870912 --csi.testvolumeexpandsize=805306368 \
                 --csi.testvolumeparameters=/tmp/sanity/params.yaml \
                 --csi.testvolumemutableparameters=/tmp/sanity/mutable.yaml \
                 --ginkgo.timeout={timeout}s --ginkgo.no-color --ginkgo.json-report=/tmp/sanity/report.json \
                 > /tmp/sanity/out 2>&1; rc=$?; echo exit $rc; tail -n 60 /tmp/sanity/out; [ $rc = 0 ] || dmesg | tail -n 60",
                bin = bin.display(),
                timeout = SANITY_LIMIT.as_secs() - 60
            );
            let run = node
                .vm
                .sh(&script, SANITY_LIMIT)
                .await
                .map_err(|e| e.to_string())?;
            let _ = forward.kill().await;
            let Some((summary, passed, failed, _skipped)) = sanity::parse_summary(&run.output)
            else {
                return Err(format!("csi-sanity printed no summary:\n{}", run.output));
            };
            // What ran, spec by spec: `<state> <containers> :: <spec>`.
            let specs = node
                .vm
                .sh_ok(
                    "jq -r '.[].SpecReports[] | \"\\(.State) \\(.ContainerHierarchyTexts | join(\" / \")) :: \\(.LeafNodeText)\"' /tmp/sanity/report.json",
                    Duration::from_secs(120),
                )
                .await
                .map_err(|e| e.to_string())?;
            let node_passed = specs
                .lines()
                .filter(|l| l.starts_with("passed ") && l.contains("Node Service"))
                .count();
            println!(
                "csi-sanity in a VM (Debian 12 stock 6.1 kernel, host-auth preferred, SPDK engine): {summary}"
            );
            println!("Node Service specs passed: {node_passed}");
            for l in specs
                .lines()
                .filter(|l| l.starts_with("skipped ") && l.contains("Node Service"))
            {
                println!("  {l}");
            }
            if failed != 0 || !run.output.contains("exit 0") {
                println!("{}", run.output);
                for l in specs.lines().filter(|l| l.starts_with("failed")) {
                    println!("{l}");
                }
                println!("{}", node.csi_log(60).await);
            }
            assert_eq!(failed, 0, "csi-sanity: {summary}");
            assert!(run.output.contains("exit 0"), "csi-sanity exited non-zero");
            assert!(passed >= 60, "too few specs ran: {summary}");
            for spec in PUBLISH_MOVES {
                assert!(
                    specs
                        .lines()
                        .any(|l| l.starts_with("passed ") && l.ends_with(&format!(":: {spec}"))),
                    "spec {spec:?} did not pass:\n{specs}"
                );
            }
            // QoS limits through a VolumeAttributesClass (ControllerModifyVolume).
            for spec in MODIFY {
                assert!(
                    specs
                        .lines()
                        .any(|l| l.starts_with("passed ") && l.ends_with(&format!(":: {spec}"))),
                    "spec {spec:?} did not pass:\n{specs}"
                );
            }
            // The Node Service specs ran (the host-only run skips all of them).
            assert!(
                node_passed >= 10,
                "only {node_passed} Node Service specs passed:\n{specs}"
            );
            node.vm.shutdown().await;
            Ok(())
        })
    });
}
