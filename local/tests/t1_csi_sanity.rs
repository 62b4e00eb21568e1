//! T1: kubernetes-csi's `csi-sanity` against the real stack as `liteio-local` starts it: the
//! test API server, the node-disk-controller, the disk-agent on the file engine and the CSI
//! driver, each as its own process. csi-sanity sends what any CO may send, volumes without
//! an accessibility requirement included; every spec must pass.
//!
//! csi-sanity is in no registry: without a `csi-sanity` on PATH (or `CSI_SANITY`) the test
//! prints `SKIP csi-sanity: …`. It needs root for loop devices and mounts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use liteio_local::poolfs::XfsImage;
use liteio_local::sanity;
use liteio_local::{ApiSource, Engine, Local};

/// csi-sanity keeps several 512 MiB volumes and their snapshots at once, and deletion
/// finishes after DeleteVolume returns: a pool of 16 GiB (sparse; the data written is small).
const SANITY_POOL: u64 = 16 << 30;

fn bin_dir() -> PathBuf {
    // target/<profile>/deps/t1_csi_sanity-… → target/<profile>
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

#[test]
fn csi_sanity_against_the_real_stack_on_the_file_engine() {
    let Some(bin) = sanity::find_csi_sanity() else {
        println!("SKIP csi-sanity: not installed (put csi-sanity on PATH or set CSI_SANITY)");
        return;
    };
    if !is_root() {
        println!("SKIP csi-sanity: needs root for loop devices and mounts");
        return;
    }
    if !std::process::Command::new("mkfs.xfs")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        println!(
            "SKIP csi-sanity: needs mkfs.xfs (Debian xfsprogs) for the file engine's reflinks"
        );
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let fs = XfsImage::scratch(base.path(), SANITY_POOL + (1 << 30))
        .expect("cannot make an XFS scratch fs");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = fs.dir.clone();
    let report = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(360), async {
            let mut local = Local::start_sized(
                &dir,
                &bin_dir(),
                "sanity-node",
                Engine::File,
                ApiSource::Test,
                SANITY_POOL,
            )
            .await
            .map_err(|e| e.to_string())?;
            let r = sanity::run(
                &bin,
                &local.csi_endpoint(),
                &dir,
                &[],
                Duration::from_secs(240),
            )
            .await;
            local.stop().await;
            r
        })
        .await
        .map_err(|_| "csi-sanity run timed out".to_string())
        .and_then(|r| r)
    });
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            println!("{}", liteio_local::log_tails(&dir, 40));
            panic!("{e}");
        }
    };
    println!("csi-sanity (file engine, real stack): {}", report.summary);
    if report.failed != 0 || !report.success {
        println!("{}", report.output);
        println!("{}", liteio_local::log_tails(&dir, 40));
    }
    assert_eq!(report.failed, 0, "csi-sanity: {}", report.summary);
    assert!(
        report.success,
        "csi-sanity exited non-zero: {}",
        report.summary
    );
    // The suite ran for real: a run that skipped nearly everything proves nothing.
    assert!(report.passed >= 50, "too few specs ran: {}", report.summary);
    drop(fs);
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}
