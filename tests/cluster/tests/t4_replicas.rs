//! T4: a replicated volume as the Linux kernel's NVMe/TCP host sees it. Three storage nodes
//! (network namespaces, SPDK) and a compute node that is a microVM with Debian 12's 6.12
//! kernel. A volume with two replicas is staged and mounted (ext4) by the VM's CSI node
//! plugin; fio writes 4 KiB random blocks at queue depth 8 with crc32c verification while
//! the link of the replica's node that does not assemble the raid is cut: the raid fails
//! that replica and serves degraded, the controller places a replacement on the third node
//! and the assembling agent rebuilds it, all under fio. Afterwards: no I/O error, verify
//! passes; the longest write is printed.
//!
//! Needs SPDK, root, network namespaces and a bootable VM; elsewhere one `SKIP` line.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use liteio_api::AntstorDataControl;
use liteio_api::replica::{ReplicaHealth, ReplicaState};
use liteio_cluster_tests::*;
use liteio_local::Engine;
use liteio_local::cluster::{ClusterOptions, Liveness, Role};
use liteio_local::vm::Kernel;

const STEP: Duration = Duration::from_secs(120);
const NAME: &str = "pvc-r";

/// Healthy, with every replica online.
fn healthy(dc: &AntstorDataControl) -> bool {
    dc.status.as_ref().is_some_and(|s| {
        s.health == Some(ReplicaHealth::Healthy)
            && s.replicas.len() == 2
            && s.replicas.iter().all(|r| r.state == ReplicaState::Online)
    })
}

#[test]
fn a_replica_lost_under_fio_on_a_kernel_host() {
    if skip_vm("t4 replicas", &Kernel::Backports) {
        return;
    }
    let dir = scratch("t4-replicas");
    let mut opts = ClusterOptions::new(3, Engine::Spdk);
    opts.pool_bytes = 1 << 30;
    // The assembling node, known once placed, attaches the other replica with SPDK's
    // initiator, which needs polling.
    opts.spdk_polling = vec![1, 2, 3];
    opts.liveness = Some(Liveness {
        unknown_after: Duration::from_secs(6),
        offline_after: Duration::from_secs(15),
        tick: Duration::from_millis(500),
    });
    opts.heartbeat = Some((Duration::from_secs(1), Duration::from_secs(6)));
    with_cluster(&dir, opts, Duration::from_secs(1500), |c| {
        Box::pin(async move {
            for k in 1..=3 {
                yield_to_the_vm(c, k)?;
            }
            let mut node = vm_node(c, 1, Kernel::Backports).await?;
            let mut csi = liteio_csi::client::connect(&node.csi_endpoint())
                .await
                .map_err(|e| e.to_string())?;
            let id = create_volume_sized(
                c,
                NAME,
                Some(node.name.clone()),
                HashMap::from([("liteio.io/replicas".to_string(), "2".to_string())]),
                256 * MIB,
            )
            .await
            .map_err(err("join"))??;
            eventually(
                c,
                "the volume healthy",
                240,
                Role::Controller(0),
                || async {
                    get::<AntstorDataControl>(c, NAME)
                        .await
                        .is_ok_and(|dc| healthy(&dc))
                },
            )
            .await?;
            let first = group_members(c, NAME).await?;
            let dc = get::<AntstorDataControl>(c, NAME).await?;
            let asm = dc.spec.target_node_id.clone();
            let (lost, other) = first
                .iter()
                .find(|(_, n)| *n != asm)
                .map(|(v, n)| (v.clone(), n.clone()))
                .ok_or("no replica off the assembling node")?;
            let other = node_index(c, &other)?;
            println!("{NAME}: replicas {first:?}, assembled on {asm}");
            let secrets = stage_secrets(c, &first[0].0).await?;
            let (staging, target) = ("/tmp/stage/pvc-r", "/tmp/pods/p1/pvc-r");
            stage_and_publish(&mut csi, &id, staging, target, "ext4", secrets).await?;
            start_fio(&mut node, &format!("{target}/fio.dat"), 900).await?;

            let t0 = Instant::now();
            c.set_link(other, false).await.map_err(err("link down"))?;
            println!("replica {lost} on {} cut off under fio", c.node_name(other));
            eventually(
                c,
                "a replacement rebuilt",
                400,
                Role::Controller(0),
                || async {
                    group_members(c, NAME)
                        .await
                        .is_ok_and(|m| m.len() == 2 && !m.iter().any(|(v, _)| *v == lost))
                        && get::<AntstorDataControl>(c, NAME)
                            .await
                            .is_ok_and(|dc| healthy(&dc))
                },
            )
            .await?;
            println!(
                "replaced and rebuilt {:.1} s after the cut: {:?}",
                t0.elapsed().as_secs_f64(),
                group_members(c, NAME).await?
            );
            if !fio_running(&mut node).await? {
                return Err("fio ended before it was told to".into());
            }
            node.vm
                .sh_ok("pkill -INT -x fio; true", STEP)
                .await
                .map_err(|e| e.to_string())?;
            let fio = fio_result(&mut node, Duration::from_secs(300)).await?;
            println!(
                "fio across the replica's loss and rebuild: error {}, {} writes, longest write {:.0} ms",
                fio.error, fio.writes, fio.max_write_ms
            );
            assert_eq!(fio.error, 0, "fio saw an I/O error: {}", fio.log);
            assert!(fio.writes > 0, "{}", fio.log);
            assert!(
                !fio.log.contains("verify: bad")
                    && !fio.log.contains("verify failed")
                    && !fio.log.contains("I/O error"),
                "{}",
                fio.log
            );
            c.set_link(other, true).await.map_err(err("link up"))?;
            node.vm.shutdown().await;
            Ok(())
        })
    });
}
