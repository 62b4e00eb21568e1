//! T4: Debian's stock kernels in microVMs (`liteio_local::vm`): they boot here under TCG,
//! load the NVMe/TCP host and device-mapper, and the CSI node finds what each can do for
//! NVMe-oF connections: Debian 12's 6.1 cannot authenticate (built without
//! `CONFIG_NVME_AUTH`) and has no TLS; the backports 6.12 has both.
//!
//! Prints `SKIP …` where no VM can boot (no QEMU, virtme-ng or kernel; not root).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use liteio_local::vm::{self, Kernel, Vm, VmOptions};

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

const STEP: Duration = Duration::from_secs(120);

/// Boots `kernel`, checks its modules and returns the CSI driver's `--host-capabilities`.
async fn capabilities_of(kernel: Kernel, name: &str) -> Option<serde_json::Value> {
    if let Some(why) = vm::unavailable(&kernel) {
        println!("SKIP {name}: {why}");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut opts = VmOptions::new(name, dir.path());
    opts.kernel = kernel;
    opts.cpus = 1;
    opts.memory_mib = 1024;
    let mut vm = match Vm::boot(&opts).await {
        Ok(vm) => vm,
        Err(e) => {
            let log = std::fs::read_to_string(dir.path().join(format!("{name}.console.log")))
                .unwrap_or_default();
            panic!("{e}\n{log}");
        }
    };
    println!("{name}: booted in {:.1}s", vm.booted_in().as_secs_f64());
    let release = vm.sh_ok("uname -r", STEP).await.unwrap();
    // The host path of every NVMe/TCP volume and of the LVM engine.
    vm.sh_ok("modprobe nvme-tcp && modprobe dm-mod && test -e /dev/nvme-fabrics && test -e /dev/mapper/control", STEP)
        .await
        .unwrap_or_else(|e| panic!("{name} ({release}): {e}"));
    // A failing script says so with its status and output.
    let bad = vm
        .sh("echo to-stdout; echo to-stderr >&2; exit 7", STEP)
        .await
        .unwrap();
    assert_eq!(bad.status, 7);
    assert!(
        bad.output.contains("to-stdout") && bad.output.contains("to-stderr"),
        "{bad:?}"
    );
    let json = vm
        .sh_ok(
            &format!("{}/csi-driver --host-capabilities", bin_dir().display()),
            STEP,
        )
        .await
        .unwrap();
    vm.shutdown().await;
    let caps: serde_json::Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(caps["kernel"], release.trim(), "{caps}");
    println!("{name}: {caps}");
    Some(caps)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debian_kernels_boot_and_say_what_they_can_do() {
    tokio::time::timeout(Duration::from_secs(900), async {
        if let Some(c) = capabilities_of(Kernel::Backports, "t4-612").await {
            assert_eq!(c["dhchap"], true, "{c}");
            assert_eq!(c["tls"], true, "{c}");
            assert!(c["kernel"].as_str().unwrap().starts_with("6.12."), "{c}");
        }
        if let Some(c) = capabilities_of(Kernel::Stock, "t4-61").await {
            assert_eq!(c["dhchap"], false, "{c}");
            assert_eq!(c["tls"], false, "{c}");
            assert!(
                c["dhchap_evidence"]
                    .as_str()
                    .unwrap()
                    .contains("CONFIG_NVME_AUTH"),
                "{c}"
            );
        }
    })
    .await
    .expect("T4 kernel test timed out");
}
