//! T3: the README's main command (`liteio-local`) on a machine with SPDK runs the agent on its
//! embedded SPDK engine (`--engine auto`), and where the kernel cannot mount NVMe/TCP it shows
//! the volume's data path with SPDK's userspace initiator instead of mounting.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_disk-agent"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn the_main_command_runs_the_spdk_engine_and_shows_its_data_path() {
    let local = bin_dir().join("liteio-local");
    assert!(
        local.exists(),
        "{} is not built; run cargo build --workspace first",
        local.display()
    );
    let dir = std::env::temp_dir().join(format!("liteio-t3-main-{}", std::process::id()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let out = rt
        .block_on(async {
            tokio::time::timeout(
                Duration::from_secs(300),
                tokio::process::Command::new(&local)
                    .args(["--once", "--pool-size-gib", "2", "--dir"])
                    .arg(&dir)
                    .env_remove("LITEIO_AGENT_SPDK")
                    .kill_on_drop(true)
                    .output(),
            )
            .await
        })
        .expect("liteio-local did not finish in 300 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let said: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('[')).collect();
    println!("{}", said.join("\n"));
    assert!(
        out.status.success(),
        "liteio-local failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("(SPDK engine, node local-node,"),
        "auto did not pick SPDK"
    );
    if Path::new("/sys/module/nvme_tcp").exists() {
        assert!(stdout.contains("is mounted at"), "not mounted");
    } else {
        assert!(stdout.contains("no NVMe/TCP initiator"), "no line says why");
        assert!(
            stdout.contains("read them back: identical"),
            "the data was not checked"
        );
        assert!(stdout.contains("IOPS"), "no random I/O figures");
    }
    assert!(stdout.contains("demo volume removed"));
    assert!(!dir.exists(), "{} was left behind", dir.display());
}
