//! T3: the copy engine of hot migration (issue 15, item 2) on real SPDK. A source lvol sits
//! behind its gate; the destination is a fresh thin lvol in the same SPDK, exported over
//! NVMe/TCP on 127.0.0.1 and attached back with SPDK's initiator (loopback stands in for
//! the other node). A consumer writes 4 KiB blocks at QD 8 through the gate while the copy
//! runs; afterwards every block of the destination must hold the last write to it.
//!
//! Throughput figures go to stdout (`--show-output`).
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use liteio_agent::spdk::gate::{self, CopyOptions, CopyState};
use liteio_agent::spdk::nvmf::{self, TcpTransportOptions};
use liteio_agent::spdk::{bdev, initiator, io, lvol};

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;
const HOST: &str = "nqn.2021-03.com.alipay.host:uuid:copy-test";
const WRITERS: u64 = 8;

/// The content of `block` after its write number `seq` (seq 0: the prefill): a header with
/// both numbers, then bytes of a xorshift stream seeded by them.
fn block_data(block: u64, seq: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(BLOCK as usize);
    v.extend_from_slice(&block.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    let mut x = block.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seq.wrapping_add(1);
    while v.len() < BLOCK as usize {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

/// A lvstore on an aio file of `size` bytes (SPDK's no-huge memory is too small for
/// malloc bdevs of this size).
async fn lvstore(dir: &std::path::Path, name: &str, size: u64) {
    let path = dir.join(format!("{name}.img"));
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(size).unwrap();
    bdev::create_aio(&format!("{name}-aio"), &path, 4096)
        .await
        .unwrap();
    lvol::create_lvstore(&format!("{name}-aio"), name, 1 << 20)
        .await
        .unwrap();
}

/// Export `lvs/name` over NVMe/TCP on 127.0.0.1 and attach it back as `<ctrlr>n1`.
async fn remote(lvs: &str, name: &str, ctrlr: &str) -> String {
    nvmf::ensure_tcp_transport(&TcpTransportOptions::default())
        .await
        .unwrap();
    let nqn = format!("nqn.2016-06.io.spdk:copy-{ctrlr}");
    let port = common::free_port();
    // Not the lvol's own UUID: the initiator's bdev lives in the same SPDK.
    let ns_uuid = format!(
        "{:08x}-c0de-4000-8000-000000000000",
        ctrlr
            .bytes()
            .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
    );
    nvmf::create_subsystem(common::spdk::local_subsystem(
        &nqn,
        &format!("COPY{ctrlr}"),
        "copy",
        &format!("{lvs}/{name}"),
        &ns_uuid,
        port,
        vec![HOST.into()],
    ))
    .await
    .unwrap();
    let names = initiator::attach_tcp(ctrlr, "127.0.0.1", port, &nqn, HOST)
        .await
        .unwrap();
    assert_eq!(names, vec![format!("{ctrlr}n1")]);
    names[0].clone()
}

/// Fill `bdev` with every block's seq-0 content.
async fn prefill(bdev: &str, size: u64) {
    let per = MIB / BLOCK;
    for chunk in 0..size / MIB {
        let mut data = Vec::with_capacity(MIB as usize);
        for b in chunk * per..(chunk + 1) * per {
            data.extend(block_data(b, 0));
        }
        io::write_at(bdev, chunk * MIB, data).await.unwrap();
    }
}

/// Compare `bdev` with the expected content: `expect(block)` or zeroes for `None`.
async fn verify(bdev: &str, size: u64, expect: impl Fn(u64) -> Option<Vec<u8>>) {
    let per = MIB / BLOCK;
    let zero = vec![0u8; BLOCK as usize];
    let mut bad = Vec::new();
    for chunk in 0..size / MIB {
        let data = io::read_at(bdev, chunk * MIB, MIB as usize).await.unwrap();
        for (i, got) in data.chunks(BLOCK as usize).enumerate() {
            let b = chunk * per + i as u64;
            let want = expect(b);
            if got != want.as_deref().unwrap_or(&zero) {
                bad.push(b);
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{bdev}: {} block(s) differ from the last write, first {:?}",
        bad.len(),
        &bad[..bad.len().min(10)]
    );
}

/// The consumer: `WRITERS` tasks (QD 8), writer `w` owning the blocks `b % WRITERS == w`
/// among the first `blocks`, so that each block's writes are ordered. Stops when `written`
/// reaches `stop_at`. Returns each block's last sequence number and the error count.
struct Consumer {
    written: Arc<AtomicU64>,
    stop_at: Arc<AtomicU64>,
    progress: tokio::sync::watch::Receiver<u64>,
    tasks: Vec<tokio::task::JoinHandle<(HashMap<u64, u64>, u64)>>,
    started: Instant,
}

impl Consumer {
    fn start(target: &str, blocks: u64) -> Self {
        let written = Arc::new(AtomicU64::new(0));
        let stop_at = Arc::new(AtomicU64::new(u64::MAX));
        let seqs = Arc::new(AtomicU64::new(1));
        let (tx, progress) = tokio::sync::watch::channel(0u64);
        let tx = Arc::new(tx);
        let tasks = (0..WRITERS)
            .map(|w| {
                let (target, written, stop_at, seqs, tx) = (
                    target.to_string(),
                    written.clone(),
                    stop_at.clone(),
                    seqs.clone(),
                    tx.clone(),
                );
                tokio::spawn(async move {
                    let mut last = HashMap::new();
                    let mut errors = 0;
                    let mut x = 0x2545_F491_4F6C_DD1D_u64 ^ (w + 1);
                    while written.load(Ordering::Relaxed) < stop_at.load(Ordering::Relaxed) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let b = (x % (blocks / WRITERS)) * WRITERS + w;
                        let seq = seqs.fetch_add(1, Ordering::Relaxed);
                        match io::write_at(&target, b * BLOCK, block_data(b, seq)).await {
                            Ok(()) => {
                                last.insert(b, seq);
                            }
                            Err(e) => {
                                errors += 1;
                                eprintln!("consumer write of block {b} failed: {e}");
                            }
                        }
                        let n = written.fetch_add(1, Ordering::Relaxed) + 1;
                        tx.send_replace(n);
                    }
                    (last, errors)
                })
            })
            .collect();
        Self {
            written,
            stop_at,
            progress,
            tasks,
            started: Instant::now(),
        }
    }

    async fn reached(&mut self, n: u64) {
        self.progress.wait_for(|v| *v >= n).await.unwrap();
    }

    /// Write `more` blocks more, then stop; the merged last writes and the error count.
    async fn stop_after(mut self, more: u64) -> (HashMap<u64, u64>, u64) {
        let now = self.written.load(Ordering::Relaxed);
        self.stop_at.store(now + more, Ordering::Relaxed);
        self.reached(now + more).await;
        let mut last = HashMap::new();
        let mut errors = 0;
        for t in self.tasks {
            let (l, e) = t.await.unwrap();
            last.extend(l);
            errors += e;
        }
        let n = self.written.load(Ordering::Relaxed);
        println!(
            "consumer: {n} writes of 4 KiB at QD {WRITERS}, {:.0} IOPS",
            n as f64 / self.started.elapsed().as_secs_f64()
        );
        (last, errors)
    }
}

/// One SPDK instance per test binary: the scenarios run in turn, each on lvstores of its
/// own. SPDK's NVMe/TCP initiator needs polling mode.
#[test]
fn copy_engine() {
    common::with_spdk("t3-copy", true, Duration::from_secs(300), async {
        thin().await;
        cancel().await;
        copy_under_load().await;
    });
}

/// Idle and under load, the copy leaves an exact copy.
async fn copy_under_load() {
    const SIZE: u64 = 256 * MIB;
    let dir = tempfile::tempdir().unwrap();
    lvstore(dir.path(), "src", SIZE + 64 * MIB).await;
    lvstore(dir.path(), "dst", 2 * SIZE + 64 * MIB).await;
    let src = lvol::create_lvol("src", "vol", SIZE, false, lvol::Clear::WriteZeroes)
        .await
        .unwrap();
    prefill(&src.alias(), SIZE).await;
    let g = gate::create_gate(&src.alias()).await.unwrap();
    assert_eq!(g, gate::gate_name(&src.bdev_name));
    assert_eq!(
        gate::create_gate(&src.alias()).await.unwrap(),
        g,
        "idempotent"
    );
    assert_eq!(gate::gate_of(&src.alias()).await.unwrap(), Some(g.clone()));
    let gb = bdev::get(&g).await.unwrap().unwrap();
    assert_eq!(gb.size_bytes(), SIZE);
    assert_eq!(gb.product, gate::GATE_PRODUCT);
    // The gate claims its base: nobody else writes the lvol behind its back.
    assert!(io::write_at(&src.alias(), 0, vec![0; 4096]).await.is_err());

    // Idle: the whole thick volume is copied.
    lvol::create_lvol("dst", "idle", SIZE, true, lvol::Clear::WriteZeroes)
        .await
        .unwrap();
    let m1 = remote("dst", "idle", "idle").await;
    let h = gate::start_copy(&g, &m1, CopyOptions::default())
        .await
        .unwrap();
    // A second mirror is refused while one is attached.
    assert!(
        gate::start_copy(&g, &m1, CopyOptions::default())
            .await
            .is_err()
    );
    let p = h.wait().await.unwrap();
    assert_eq!(p.state, CopyState::InStep);
    assert!(p.mirror_attached);
    assert_eq!(p.copied_bytes, SIZE);
    println!(
        "copy idle: {} MiB in {:.2} s = {:.0} MiB/s",
        p.copied_bytes / MIB,
        p.elapsed.as_secs_f64(),
        p.mib_per_s()
    );
    let p = gate::finish(&g).await.unwrap();
    assert_eq!(p.state, CopyState::Finished);
    assert!(!p.mirror_attached);
    verify("dst/idle", SIZE, |b| Some(block_data(b, 0))).await;

    // Under load: a consumer writes through the gate before, during and after the copy.
    lvol::create_lvol("dst", "load", SIZE, true, lvol::Clear::WriteZeroes)
        .await
        .unwrap();
    let m2 = remote("dst", "load", "load").await;
    let mut consumer = Consumer::start(&g, SIZE / BLOCK);
    consumer.reached(500).await;
    let h = gate::start_copy(&g, &m2, CopyOptions::default())
        .await
        .unwrap();
    let mid = gate::copy_progress(&g).await.unwrap();
    assert!(matches!(
        mid.state,
        CopyState::Starting | CopyState::Copying | CopyState::InStep
    ));
    let p = h.wait().await.unwrap();
    assert_eq!(p.state, CopyState::InStep);
    println!(
        "copy under load: {} MiB in {:.2} s = {:.0} MiB/s, {} mirrored writes",
        p.copied_bytes / MIB,
        p.elapsed.as_secs_f64(),
        p.mib_per_s(),
        p.mirrored_writes
    );
    // Keep writing in step (mirrored), then stop.
    let (last, errors) = consumer.stop_after(2000).await;
    assert_eq!(errors, 0, "the consumer saw I/O errors");
    let p = gate::copy_progress(&g).await.unwrap();
    assert!(p.mirrored_writes >= 2000, "{p:?}");
    assert_eq!(p.mirror_errors, 0);
    gate::finish(&g).await.unwrap();
    verify("dst/load", SIZE, |b| {
        Some(block_data(b, last.get(&b).copied().unwrap_or(0)))
    })
    .await;
    // The source has the same content (the consumer's writes went through).
    verify(&g, SIZE, |b| {
        Some(block_data(b, last.get(&b).copied().unwrap_or(0)))
    })
    .await;

    gate::delete_gate(&g).await.unwrap();
    gate::delete_gate(&g).await.unwrap();
    assert!(bdev::get(&g).await.unwrap().is_none());
    // The lvol is free again.
    io::write_at(&src.alias(), 0, block_data(0, 0))
        .await
        .unwrap();
}

/// A thin source copies only its allocated clusters.
async fn thin() {
    const SIZE: u64 = 512 * MIB;
    let dir = tempfile::tempdir().unwrap();
    lvstore(dir.path(), "tsrc", 128 * MIB).await;
    lvstore(dir.path(), "tdst", 128 * MIB).await;
    let src = lvol::create_lvol("tsrc", "thin", SIZE, true, lvol::Clear::WriteZeroes)
        .await
        .unwrap();
    // 8 regions of 2 MiB spread over the volume, cluster-aligned and not.
    let offsets: Vec<u64> = (0..8u64).map(|i| i * 60 * MIB + (i % 3) * 4096).collect();
    for &o in &offsets {
        let data: Vec<u8> = (o / BLOCK..o / BLOCK + 2 * MIB / BLOCK)
            .flat_map(|b| block_data(b, 1))
            .collect();
        io::write_at(&src.alias(), o, data).await.unwrap();
    }
    let allocated = lvol::lvol("tsrc", "thin")
        .await
        .unwrap()
        .unwrap()
        .allocated_bytes;
    let g = gate::create_gate(&src.alias()).await.unwrap();
    lvol::create_lvol("tdst", "thin", SIZE, true, lvol::Clear::WriteZeroes)
        .await
        .unwrap();
    let m = remote("tdst", "thin", "thin").await;
    let p = gate::start_copy(&g, &m, CopyOptions::default())
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    println!(
        "thin copy: {} of {} MiB allocated, {} MiB copied in {:.2} s",
        allocated / MIB,
        SIZE / MIB,
        p.copied_bytes / MIB,
        p.elapsed.as_secs_f64()
    );
    assert_eq!(p.state, CopyState::InStep);
    assert_eq!(
        p.copied_bytes, allocated,
        "only allocated clusters are copied"
    );
    assert_eq!(p.scanned_bytes, SIZE);
    gate::finish(&g).await.unwrap();
    let dst = lvol::lvol("tdst", "thin").await.unwrap().unwrap();
    assert_eq!(dst.allocated_bytes, allocated, "holes stay holes");
    let in_region = |b: u64| {
        offsets
            .iter()
            .any(|&o| b >= o / BLOCK && b < (o + 2 * MIB) / BLOCK)
    };
    verify("tdst/thin", SIZE, |b| {
        in_region(b).then(|| block_data(b, 1))
    })
    .await;
    // The source lvol goes away (hot-remove): its gate goes with it.
    lvol::delete_lvol("tsrc", "thin").await.unwrap();
    assert!(bdev::get(&g).await.unwrap().is_none());
    assert_eq!(gate::gate_of("tsrc/thin").await.unwrap(), None);
}

/// Cancel and mirror failure leave the source serving, without a mirror.
async fn cancel() {
    const SIZE: u64 = 256 * MIB;
    let dir = tempfile::tempdir().unwrap();
    lvstore(dir.path(), "csrc", SIZE + 64 * MIB).await;
    lvstore(dir.path(), "cdst", 2 * SIZE + 64 * MIB).await;
    let src = lvol::create_lvol("csrc", "vol", SIZE, false, lvol::Clear::WriteZeroes)
        .await
        .unwrap();
    let g = gate::create_gate(&src.alias()).await.unwrap();
    // Small chunks, one at a time: the copy is slow enough to be caught in the middle.
    let slow = CopyOptions {
        chunk_bytes: 64 * 1024,
        queue_depth: 1,
    };

    // Cancel mid-copy.
    lvol::create_lvol("cdst", "c", SIZE, true, lvol::Clear::WriteZeroes)
        .await
        .unwrap();
    let m = remote("cdst", "c", "c").await;
    let h = gate::start_copy(&g, &m, slow).await.unwrap();
    common::eventually("the copy to start", Duration::from_secs(30), || async {
        let p = gate::copy_progress(&g).await.unwrap();
        (p.copied_bytes > 0).then_some(())
    })
    .await;
    let p = gate::cancel_copy(&g).await.unwrap();
    assert_eq!(p.state, CopyState::Cancelled, "{p:?}");
    assert!(!p.mirror_attached);
    assert!(p.copied_bytes < SIZE);
    assert!(h.wait().await.is_err(), "a cancelled copy ends in an error");
    // No mirror any more: cancelling again is a no-op, finishing is refused.
    gate::cancel_copy(&g).await.unwrap();
    assert!(gate::finish(&g).await.is_err());
    // The source serves; writes no longer reach the old mirror.
    let before = gate::copy_progress(&g).await.unwrap().mirrored_writes;
    io::write_at(&g, 0, block_data(0, 7)).await.unwrap();
    assert_eq!(io::read_at(&g, 0, 4096).await.unwrap(), block_data(0, 7));
    assert_eq!(
        gate::copy_progress(&g).await.unwrap().mirrored_writes,
        before
    );
    initiator::detach("c").await.unwrap();

    // Mirror failure: the destination goes away mid-copy, under load.
    lvol::create_lvol("cdst", "f", SIZE, true, lvol::Clear::WriteZeroes)
        .await
        .unwrap();
    let m = remote("cdst", "f", "f").await;
    let mut consumer = Consumer::start(&g, SIZE / BLOCK);
    consumer.reached(200).await;
    let h = gate::start_copy(&g, &m, slow).await.unwrap();
    common::eventually("the copy to start", Duration::from_secs(30), || async {
        let p = gate::copy_progress(&g).await.unwrap();
        (p.copied_bytes > 0 && p.mirrored_writes > 0).then_some(())
    })
    .await;
    initiator::detach("f").await.unwrap();
    let e = h.wait().await.unwrap_err();
    println!("copy after the mirror went away: {e}");
    let p = gate::copy_progress(&g).await.unwrap();
    assert_eq!(p.state, CopyState::Failed, "{p:?}");
    assert!(!p.mirror_attached);
    let (last, errors) = consumer.stop_after(500).await;
    assert_eq!(errors, 0, "the consumer saw I/O errors");
    verify(&g, SIZE, |b| {
        last.get(&b).map(|s| block_data(b, *s)).or_else(|| {
            // Block 0 was written above; the rest of the thick volume reads zeroes.
            (b == 0).then(|| block_data(0, 7))
        })
    })
    .await;
    gate::delete_gate(&g).await.unwrap();
}
