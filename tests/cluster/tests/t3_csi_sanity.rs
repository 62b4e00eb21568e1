//! T3: kubernetes-csi's `csi-sanity` against the real stack as `liteio-local` starts it, with
//! the disk-agent built with SPDK: on the file engine (the agent's SPDK target can export, so
//! the scheduler's remote-capable paths are live) and on the SPDK engine (lvstore on an aio
//! file). Every spec that runs must pass.
//!
//! On the SPDK engine a volume reaches a node only over NVMe/TCP: staging needs the kernel's
//! `nvme_tcp` initiator. Without it (this kernel has none) the Node Service specs are skipped
//! with a NOTE line, and the Identity and Controller Service specs run. csi-sanity is in no
//! registry: without one on PATH (or `CSI_SANITY`) the test prints `SKIP csi-sanity: …`.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use liteio_cluster_tests::{bin_dir, require_binaries};
use liteio_local::poolfs::XfsImage;
use liteio_local::sanity::{self, SanityReport};
use liteio_local::{ApiSource, Engine, Local};

/// csi-sanity keeps several 512 MiB volumes and their snapshots at once, and deletion
/// finishes after DeleteVolume returns: a pool of 16 GiB (sparse; the data written is small).
const SANITY_POOL: u64 = 16 << 30;

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// Starts the stack on `engine` in `dir`, runs csi-sanity with `extra` arguments, stops it.
fn run_on(engine: Engine, dir: &Path, extra: &[String]) -> Option<SanityReport> {
    let Some(bin) = sanity::find_csi_sanity() else {
        println!("SKIP csi-sanity: not installed (put csi-sanity on PATH or set CSI_SANITY)");
        return None;
    };
    require_binaries();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let report = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(420), async {
            let mut local = Local::start_sized(
                dir,
                &bin_dir(),
                "sanity-spdk",
                engine,
                ApiSource::Test,
                SANITY_POOL,
            )
            .await
            .map_err(|e| e.to_string())?;
            let r = sanity::run(
                &bin,
                &local.csi_endpoint(),
                dir,
                extra,
                Duration::from_secs(300),
            )
            .await;
            local.stop().await;
            r
        })
        .await
        .map_err(|_| "csi-sanity run timed out".to_string())
        .and_then(|r| r)
    });
    match report {
        Ok(r) => {
            if r.failed != 0 || !r.success {
                println!("{}", r.output);
                println!("{}", liteio_local::log_tails(dir, 40));
            }
            Some(r)
        }
        Err(e) => {
            println!("{}", liteio_local::log_tails(dir, 40));
            panic!("{e}");
        }
    }
}

#[test]
fn csi_sanity_on_the_file_engine_with_an_spdk_agent() {
    if !is_root() {
        println!("SKIP csi-sanity: needs root for loop devices and mounts");
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let fs = XfsImage::scratch(base.path(), SANITY_POOL + (1 << 30))
        .expect("cannot make an XFS scratch fs");
    let Some(r) = run_on(Engine::File, &fs.dir, &[]) else {
        return;
    };
    println!(
        "csi-sanity (file engine, SPDK agent, real stack): {}",
        r.summary
    );
    assert_eq!(r.failed, 0, "csi-sanity: {}", r.summary);
    assert!(r.success, "csi-sanity exited non-zero: {}", r.summary);
    assert!(r.passed >= 50, "too few specs ran: {}", r.summary);
}

#[test]
fn csi_sanity_on_the_spdk_engine() {
    if !is_root() {
        println!("SKIP csi-sanity: needs root for mounts");
        return;
    }
    let kernel_nvme = Path::new("/sys/module/nvme_tcp").exists();
    let mut extra = Vec::new();
    if !kernel_nvme {
        println!(
            "NOTE csi-sanity on the SPDK engine: no nvme_tcp module in this kernel, so the Node \
             Service specs (staging connects NVMe/TCP) are skipped; Identity and Controller run"
        );
        extra.push("--ginkgo.skip=Node Service".to_string());
    }
    let base = tempfile::tempdir().unwrap();
    // QoS limits as a VolumeAttributesClass sets them (ControllerModifyVolume's specs).
    let mutable = base.path().join("mutable.yaml");
    std::fs::write(
        &mutable,
        "liteio.io/qos-iops: \"2000\"\nliteio.io/qos-write-mbps: \"50\"\n",
    )
    .unwrap();
    let report = base.path().join("report.json");
    extra.push(format!(
        "--csi.testvolumemutableparameters={}",
        mutable.display()
    ));
    extra.push(format!("--ginkgo.json-report={}", report.display()));
    let Some(r) = run_on(Engine::Spdk, base.path(), &extra) else {
        return;
    };
    println!("csi-sanity (SPDK engine, real stack): {}", r.summary);
    let specs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let modify: Vec<(String, String)> = specs
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["SpecReports"].as_array())
        .flatten()
        .filter(|s| {
            s["ContainerHierarchyTexts"]
                .to_string()
                .contains("ModifyVolume")
        })
        .map(|s| {
            (
                s["LeafNodeText"].as_str().unwrap_or("").to_string(),
                s["State"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    println!("ModifyVolume specs: {modify:?}");
    for spec in [
        "should modify a volume created with a volume attribute class",
        "should modify a volume created without a volume attribute class",
    ] {
        assert!(
            modify.iter().any(|(n, st)| n == spec && st == "passed"),
            "{spec:?} did not pass: {modify:?}"
        );
    }
    assert_eq!(r.failed, 0, "csi-sanity: {}", r.summary);
    assert!(r.success, "csi-sanity exited non-zero: {}", r.summary);
    let floor = if kernel_nvme { 50 } else { 30 };
    assert!(r.passed >= floor, "too few specs ran: {}", r.summary);
}
