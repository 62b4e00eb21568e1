//! T1: kubernetes-csi/csi-test's `csi-sanity` against the driver in both modes, with the test
//! API server, a fake scheduler and a fake file-engine agent. csi-sanity is in no registry:
//! the test runs only when a `csi-sanity` binary is on PATH (or `CSI_SANITY` names one) and
//! prints `SKIP csi-sanity: not installed` otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;

use common::{NODE, pool, start};

fn find_sanity() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CSI_SANITY")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
    {
        return Some(p);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("csi-sanity"))
            .find(|p| p.is_file())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn csi_sanity() {
    let Some(bin) = find_sanity() else {
        println!("SKIP csi-sanity: not installed");
        return;
    };
    if !rustix::process::geteuid().is_root() {
        println!("SKIP csi-sanity: needs root for loop devices and mounts");
        return;
    }
    // csi-sanity takes about 10 s here; its own suite timeout and ours are far below the
    // 5 minutes CI allows, and dropping the child on timeout kills it.
    tokio::time::timeout(std::time::Duration::from_secs(240), async {
        let mut env = start(true, true, |_| {}).await;
        env.start_scheduler(1 << 40);
        env.start_file_agent();
        // The StoragePool the fake scheduler places volumes in (expansion checks its free
        // space, GetCapacity reports it).
        pool(&env.client, NODE, 1 << 40).await;
        let dir = env.dir.path().to_path_buf();
        let out = tokio::process::Command::new(&bin)
            .arg(format!(
                "--csi.endpoint={}",
                env.endpoint.trim_start_matches("unix://")
            ))
            .arg(format!(
                "--csi.stagingdir={}",
                dir.join("sanity-staging").display()
            ))
            .arg(format!(
                "--csi.mountdir={}",
                dir.join("sanity-mount").display()
            ))
            .arg("--csi.testvolumesize=536870912")
            .arg("--csi.testvolumeexpandsize=805306368")
            .arg("--ginkgo.timeout=180s")
            .arg("--ginkgo.no-color")
            .kill_on_drop(true)
            .output()
            .await
            .expect("run csi-sanity");
        let stdout = String::from_utf8_lossy(&out.stdout);
        println!("{stdout}");
        println!("{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "csi-sanity reported failures");
        env.stop().await;
    })
    .await
    .expect("csi-sanity timed out");
}
