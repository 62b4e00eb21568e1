//! T1: the `disk-agent` binary refuses a bad configuration with exit code 2 and a message
//! naming the field.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn agent(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_disk-agent"))
        .args(args)
        .env_remove("NODE_ID")
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap()
}

#[test]
fn bad_config_exits_2_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent-config.yaml");
    std::fs::write(&cfg, "storage:\n  pooling: {name: p, mode: Zfs}\n").unwrap();
    let out = agent(&["--config", cfg.to_str().unwrap(), "--node-id", "n1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("storage.pooling.mode"), "{err}");
    assert!(err.contains("agent-config.yaml"), "{err}");
}

#[test]
fn missing_config_file_and_missing_node_exit_2() {
    let out = agent(&["--config", "/nonexistent/agent.yaml", "--node-id", "n1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/agent.yaml"));
    let out = agent(&["--config", "/nonexistent/agent.yaml"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "clap reports a missing --node-id with 2"
    );
}

/// Only without the `spdk` feature: a binary built with it has the engine, tries to start
/// SPDK, and fails (exit 1) where SPDK cannot start, or runs.
#[cfg(not(feature = "spdk"))]
#[test]
fn spdk_mode_without_the_engine_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("a.yaml");
    std::fs::write(
        &cfg,
        "storage:\n  pooling: {name: lvs, mode: SpdkLVStore}\n  bdev: {type: memBdev, name: m, size: 1048576}\n",
    )
    .unwrap();
    let out = agent(&["--config", cfg.to_str().unwrap(), "--node-id", "n1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("SpdkLVStore"));
}

#[test]
fn an_unreadable_node_identity_exits_2_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent-config.yaml");
    std::fs::write(
        &cfg,
        format!(
            "storage:\n  pooling: {{name: p, mode: File}}\n  file: {{path: {}}}\n",
            dir.path().join("pool").display()
        ),
    )
    .unwrap();
    let missing = dir.path().join("kubelet.conf");
    let start = || {
        agent(&[
            "--config",
            cfg.to_str().unwrap(),
            "--node-id",
            "n1",
            "--keys-kubeconfig",
            missing.to_str().unwrap(),
        ])
    };
    let out = start();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--keys-kubeconfig"), "{err}");
    assert!(err.contains(missing.to_str().unwrap()), "{err}");
    // Not a kubeconfig at all.
    std::fs::write(&missing, "[not yaml").unwrap();
    let out = start();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--keys-kubeconfig"), "{err}");
}
