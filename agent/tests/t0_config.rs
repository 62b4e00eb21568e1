//! T0: the agent config file: LiteIO's examples, our extensions, defaults, and errors that
//! name the field.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use liteio_agent::config::{BdevType, Config, ConfigError, PoolingMode};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn err(yaml: &str) -> ConfigError {
    Config::from_yaml(yaml).expect_err("config accepted")
}

/// `yaml` is refused, naming `field`; returns the error.
fn refused(yaml: &str, field: &str) -> ConfigError {
    let e = err(yaml);
    assert_eq!(e.field(), Some(field), "{e}");
    e
}

const MINIMAL_FILE: &str =
    "storage:\n  pooling: {name: p, mode: File}\n  file: {path: /srv/pool}\n";

#[test]
fn liteio_lvm_example_parses_with_defaults() {
    let cfg = Config::load(fixture("liteio-lvm-agent-config.yaml")).unwrap();
    assert_eq!(cfg.storage.pooling.name, "test-vg");
    assert_eq!(cfg.storage.pooling.mode, PoolingMode::KernelLvm);
    assert_eq!(cfg.storage.pvs.len(), 1);
    assert_eq!(cfg.storage.pvs[0].file_path, "/local-storage/pv01");
    assert_eq!(cfg.storage.pvs[0].size, 1_048_576_000);
    assert_eq!(cfg.storage.pvs[0].device_path, "");
    assert!(cfg.storage.bdev.is_none());
    // Defaults.
    assert_eq!(cfg.node_info_keys.ip_label_key, "lite.io/ip");
    assert_eq!(cfg.node_info_keys.hostname_label_key, "lite.io/hostname");
    assert_eq!(cfg.node_info_keys.rack_label_key, "lite.io/rack");
    assert_eq!(cfg.node_info_keys.room_label_key, "lite.io/room");
    assert_eq!(cfg.nvmf.port_range.ports(), 4510..=4610);
    assert_eq!(cfg.nvmf.listen_address, None);
    assert_eq!(cfg.heartbeat.interval, Duration::from_secs(20));
    assert_eq!(cfg.heartbeat.duration, Duration::from_secs(40));
    assert_eq!(cfg.metrics.listen_address, None);
    assert!(
        !cfg.metrics.liteio_compat_names,
        "LiteIO's metric names off by default"
    );
    assert_eq!(cfg.spdk.core_mask, "0x1");
    assert!(!cfg.spdk.no_huge);
    assert_eq!(cfg.spdk.mem_size_mib(), None);
}

#[test]
fn liteio_aio_lvs_example_parses() {
    let cfg = Config::load(fixture("liteio-aio-lvs-agent-config.yaml")).unwrap();
    assert_eq!(cfg.storage.pooling.name, "aio-lvs");
    assert_eq!(cfg.storage.pooling.mode, PoolingMode::SpdkLvStore);
    let bdev = cfg.storage.bdev.unwrap();
    assert_eq!(bdev.kind, BdevType::Aio);
    assert_eq!(bdev.name, "test-aio-bdev");
    assert_eq!(bdev.size, 1_048_576_000);
    assert_eq!(bdev.file_path, "/local-storage/aio-lvs");
    assert!(cfg.storage.pvs.is_empty());
}

#[test]
fn every_extension_parses() {
    let cfg = Config::load(fixture("full-agent-config.yaml")).unwrap();
    assert_eq!(cfg.storage.pooling.mode, PoolingMode::File);
    let file = cfg.storage.file.as_ref().unwrap();
    assert_eq!(file.path, PathBuf::from("/var/lib/liteio/pool"));
    assert_eq!(file.size, 10 << 30);
    assert_eq!(cfg.node_info_keys.ip_label_key, "example.com/ip");
    assert_eq!(cfg.spdk.core_mask_bits(), Some(3));
    assert!(cfg.spdk.interrupt_mode);
    assert!(cfg.spdk.no_huge);
    assert_eq!(cfg.spdk.mem_size_mib(), Some(512));
    assert_eq!(
        cfg.spdk.rpc_socket.as_deref(),
        Some(Path::new("/var/tmp/liteio-spdk.sock"))
    );
    assert_eq!(
        cfg.spdk.nvme_pci_addresses,
        ["0000:00:04.0", "0000:af:00.1"]
    );
    assert_eq!(
        cfg.nvmf.listen_address,
        Some("192.0.2.10".parse::<IpAddr>().unwrap())
    );
    assert_eq!(cfg.nvmf.port_range.ports(), 5000..=5099);
    assert_eq!(
        cfg.nvmf.export_record_dir.as_deref(),
        Some(std::path::Path::new("/var/lib/liteio/exports"))
    );
    assert_eq!(
        cfg.metrics.listen_address,
        Some("0.0.0.0:9100".parse::<SocketAddr>().unwrap())
    );
    assert!(cfg.metrics.liteio_compat_names);
    assert_eq!(cfg.heartbeat.interval, Duration::from_secs(10));
    assert_eq!(cfg.heartbeat.duration, Duration::from_secs(60));
}

#[test]
fn serialises_back_to_the_same_config() {
    let cfg = Config::load(fixture("full-agent-config.yaml")).unwrap();
    let text = serde_yaml::to_string(&cfg).unwrap();
    assert_eq!(Config::from_yaml(&text).unwrap(), cfg);
    let built = Config::file_pool("p", "/srv/pool");
    assert_eq!(Config::from_yaml(MINIMAL_FILE).unwrap(), built);
}

#[test]
fn no_huge_gets_a_default_memory_size() {
    let cfg = Config::from_yaml(&format!("{MINIMAL_FILE}spdk: {{noHuge: true}}\n")).unwrap();
    assert_eq!(cfg.spdk.mem_size_mib(), Some(1024));
}

#[test]
fn huge_dir_is_taken_with_hugepages_only() {
    let cfg = Config::from_yaml(&format!(
        "{MINIMAL_FILE}spdk: {{memSizeMiB: 256, hugeDir: /dev/hugepages}}\n"
    ))
    .unwrap();
    assert_eq!(
        cfg.spdk.huge_dir.as_deref(),
        Some(std::path::Path::new("/dev/hugepages"))
    );
    assert_eq!(cfg.spdk.mem_size_mib(), Some(256));
    let e = refused(
        &format!("{MINIMAL_FILE}spdk: {{noHuge: true, hugeDir: /dev/hugepages}}\n"),
        "spdk.hugeDir",
    );
    assert!(e.to_string().contains("noHuge"), "{e}");
    let e = refused(
        &format!("{MINIMAL_FILE}spdk: {{hugeDir: hugepages}}\n"),
        "spdk.hugeDir",
    );
    assert!(e.to_string().contains("absolute"), "{e}");
}

#[test]
fn unknown_mode_lists_the_allowed_values() {
    let e = refused(
        "storage:\n  pooling: {name: tank, mode: Zfs}\n",
        "storage.pooling.mode",
    );
    let msg = e.to_string();
    assert!(
        msg.starts_with(
            r#"storage.pooling.mode: "Zfs" is not one of "KernelLVM", "SpdkLVStore", "File""#
        ),
        "{msg}"
    );
}

#[test]
fn unknown_bdev_type_lists_the_allowed_values() {
    let e =
        err("storage:\n  pooling: {name: l, mode: SpdkLVStore}\n  bdev: {type: nvme, name: b}\n");
    assert_eq!(e.field(), Some("storage.bdev.type"));
    assert!(
        e.to_string()
            .contains(r#""nvme" is not one of "aioBdev", "memBdev", "raidBdev""#),
        "{e}"
    );
}

#[test]
fn unknown_keys_are_refused_with_their_path() {
    // LiteIO's own unit test used a `file:` key that its Go structs silently ignored.
    let e = refused(
        "storage:\n  pooling: {name: vg, mode: KernelLVM}\n  pvs:\n  - {devicePath: /dev/xxx, size: 1234, file: /tmp/xxx}\n",
        "storage.pvs[0].file",
    );
    assert!(e.to_string().contains("unknown field `file`"), "{e}");

    refused(
        &format!("{MINIMAL_FILE}heartbeat: {{intervall: 5s}}\n"),
        "heartbeat.intervall",
    );
}

#[test]
fn liteio_node_info_is_accepted() {
    let cfg = Config::from_yaml(&format!(
        "{MINIMAL_FILE}nodeInfo: {{id: node-1, ip: 10.0.0.1, hostname: node-1}}\n"
    ))
    .unwrap();
    assert_eq!(cfg.node_info.unwrap().ip, "10.0.0.1");
}

#[test]
fn port_range_is_checked() {
    let e = refused(
        &format!("{MINIMAL_FILE}nvmf: {{portRange: {{start: 4610, end: 4510}}}}\n"),
        "nvmf.portRange",
    );
    assert!(e.to_string().contains("start must be <= end"), "{e}");

    let e = err(&format!(
        "{MINIMAL_FILE}nvmf: {{portRange: {{start: 0, end: 10}}}}\n"
    ));
    assert_eq!(
        e.to_string(),
        "nvmf.portRange.start: 0 is outside 1..=65535"
    );
    refused(
        &format!("{MINIMAL_FILE}nvmf: {{portRange: {{start: 4510, end: 70000}}}}\n"),
        "nvmf.portRange.end",
    );
    // A single port is a valid range.
    Config::from_yaml(&format!(
        "{MINIMAL_FILE}nvmf: {{portRange: {{start: 4510, end: 4510}}}}\n"
    ))
    .unwrap();
}

#[test]
fn heartbeat_duration_must_exceed_interval() {
    let e = err(&format!(
        "{MINIMAL_FILE}heartbeat: {{interval: 1m, duration: 60s}}\n"
    ));
    assert_eq!(
        e.to_string(),
        "heartbeat.duration: 1m must exceed heartbeat.interval (1m)"
    );
    refused(
        &format!("{MINIMAL_FILE}heartbeat: {{interval: soon}}\n"),
        "heartbeat.interval",
    );
    let ok = Config::from_yaml(&format!(
        "{MINIMAL_FILE}heartbeat: {{interval: 500ms, duration: 2}}\n"
    ))
    .unwrap();
    assert_eq!(ok.heartbeat.interval, Duration::from_millis(500));
    assert_eq!(ok.heartbeat.duration, Duration::from_secs(2));
}

#[test]
fn mode_specific_fields_are_required() {
    refused(
        "storage:\n  pooling: {name: p, mode: File}\n",
        "storage.file.path",
    );
    refused(
        "storage:\n  pooling: {name: p, mode: File}\n  file: {path: rel/dir}\n",
        "storage.file.path",
    );
    refused(
        "storage:\n  pooling: {name: l, mode: SpdkLVStore}\n",
        "storage.bdev",
    );
    refused(
        "storage:\n  pooling: {name: l, mode: SpdkLVStore}\n  bdev: {type: aioBdev, name: b}\n",
        "storage.bdev.filePath",
    );
    refused(
        "storage:\n  pooling: {name: l, mode: SpdkLVStore}\n  bdev: {type: memBdev, name: m, size: 1000}\n",
        "storage.bdev.size",
    );
    refused(
        "storage:\n  pooling: {name: l, mode: SpdkLVStore}\n  bdev: {type: raidBdev, name: antstor_raid0}\n",
        "spdk.nvmePciAddresses",
    );
    Config::from_yaml(
        "storage:\n  pooling: {name: l, mode: SpdkLVStore}\n  bdev: {type: raidBdev, name: antstor_raid0}\nspdk: {nvmePciAddresses: ['0000:01:00.0', '0000:02:00.0']}\n",
    )
    .expect("a raidBdev pool with its devices");
    refused(
        "storage:\n  pooling: {name: vg, mode: KernelLVM}\n  pvs:\n  - {size: 10}\n",
        "storage.pvs[0].filePath",
    );
    refused(
        "storage:\n  pooling: {name: vg, mode: KernelLVM}\n  pvs:\n  - {filePath: /f}\n",
        "storage.pvs[0].size",
    );
    refused(
        "storage:\n  pooling: {name: 'bad vg', mode: KernelLVM}\n",
        "storage.pooling.name",
    );
    refused(
        "storage:\n  pooling: {name: '', mode: KernelLVM}\n",
        "storage.pooling.name",
    );
    let e = refused(
        "storage:\n  pooling: {mode: KernelLVM}\n",
        "storage.pooling",
    );
    assert!(e.to_string().contains("missing field `name`"), "{e}");
}

#[test]
fn sizes_accept_quantities() {
    let cfg = Config::from_yaml(
        "storage:\n  pooling: {name: vg, mode: KernelLVM}\n  pvs:\n  - {filePath: /f, size: 1Gi}\n",
    )
    .unwrap();
    assert_eq!(cfg.storage.pvs[0].size, 1 << 30);
    refused(
        "storage:\n  pooling: {name: vg, mode: KernelLVM}\n  pvs:\n  - {filePath: /f, size: lots}\n",
        "storage.pvs[0].size",
    );
    refused(
        "storage:\n  pooling: {name: vg, mode: KernelLVM}\n  pvs:\n  - {filePath: /f, size: -5}\n",
        "storage.pvs[0].size",
    );
}

#[test]
fn spdk_trace_buffer_is_off_unless_asked() {
    let c = Config::from_yaml(MINIMAL_FILE).unwrap();
    assert_eq!(c.spdk.trace_entries, 0);
    let c = Config::from_yaml(&format!("{MINIMAL_FILE}spdk: {{traceEntries: 4096}}\n")).unwrap();
    assert_eq!(c.spdk.trace_entries, 4096);
    // A node exports up to 4,095 volumes unless told otherwise (SPDK alone allows 1,023).
    assert_eq!(c.spdk.max_subsystems, 4096);
    let c = Config::from_yaml(&format!("{MINIMAL_FILE}spdk: {{maxSubsystems: 10000}}\n")).unwrap();
    assert_eq!(c.spdk.max_subsystems, 10000);
    // The reactor that runs the agent's requests gets ahead of the agent's other threads.
    assert_eq!(c.spdk.reactor_nice, -10);
    let c = Config::from_yaml(&format!("{MINIMAL_FILE}spdk: {{reactorNice: 0}}\n")).unwrap();
    assert_eq!(c.spdk.reactor_nice, 0);
}

#[test]
fn spdk_options_are_checked() {
    for (spdk, field) in [
        ("{coreMask: '3'}", "spdk.coreMask"),
        ("{coreMask: '0x0'}", "spdk.coreMask"),
        ("{memSizeMiB: 8}", "spdk.memSizeMiB"),
        ("{maxSubsystems: 1}", "spdk.maxSubsystems"),
        ("{reactorNice: -21}", "spdk.reactorNice"),
        ("{reactorNice: 20}", "spdk.reactorNice"),
        ("{rpcSocket: spdk.sock}", "spdk.rpcSocket"),
        (
            "{nvmePciAddresses: ['00:04.0']}",
            "spdk.nvmePciAddresses[0]",
        ),
    ] {
        let e = err(&format!("{MINIMAL_FILE}spdk: {spdk}\n"));
        assert_eq!(e.field(), Some(field), "{spdk}: {e}");
    }
    refused(
        &format!("{MINIMAL_FILE}metrics: {{listenAddress: nowhere}}\n"),
        "metrics.listenAddress",
    );
    // The export record holds keys: a relative path would land wherever the agent started.
    refused(
        &format!("{MINIMAL_FILE}nvmf: {{exportRecordDir: exports}}\n"),
        "nvmf.exportRecordDir",
    );
    assert!(
        Config::from_yaml(MINIMAL_FILE)
            .unwrap()
            .nvmf
            .export_record_dir
            .is_none()
    );
}

#[test]
fn load_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.yaml");
    let e = Config::load(&missing).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }));
    assert!(e.to_string().contains("nope.yaml"), "{e}");

    let bad = dir.path().join("agent-config.yaml");
    std::fs::write(&bad, "storage:\n  pooling: {name: tank, mode: Zfs}\n").unwrap();
    let e = Config::load(&bad).unwrap_err();
    assert!(e.to_string().contains("agent-config.yaml"), "{e}");
    assert_eq!(e.field(), Some("storage.pooling.mode"));
    let chain = std::error::Error::source(&e).unwrap().to_string();
    assert!(
        chain.starts_with("storage.pooling.mode: \"Zfs\""),
        "{chain}"
    );

    std::fs::write(&bad, "storage: [unclosed\n").unwrap();
    let e = Config::load(&bad).unwrap_err();
    assert!(matches!(e, ConfigError::File { .. }), "{e}");
}

#[test]
fn timeouts_have_defaults_and_refuse_zero() {
    let cfg = Config::from_yaml(MINIMAL_FILE).unwrap();
    assert_eq!(cfg.timeouts.api_request, Duration::from_secs(10));
    assert_eq!(cfg.timeouts.spdk_request, Duration::from_secs(30));
    assert_eq!(cfg.timeouts.command, Duration::from_secs(300));
    assert_eq!(cfg.timeouts.nvme_io, Duration::from_secs(3));
    assert_eq!(cfg.timeouts.nvme_admin, Duration::from_secs(2));
    assert_eq!(cfg.timeouts.nvme_transport, Duration::from_secs(2));
    let cfg = Config::from_yaml(&format!(
        "{MINIMAL_FILE}timeouts: {{apiRequest: 3s, spdkRequest: 1m, command: 90, nvmeIo: 5s, nvmeAdmin: 4s, nvmeTransport: 500ms}}\n"
    ))
    .unwrap();
    assert_eq!(cfg.timeouts.nvme_io, Duration::from_secs(5));
    assert_eq!(cfg.timeouts.nvme_admin, Duration::from_secs(4));
    assert_eq!(cfg.timeouts.nvme_transport, Duration::from_millis(500));
    assert_eq!(cfg.timeouts.api_request, Duration::from_secs(3));
    assert_eq!(cfg.timeouts.spdk_request, Duration::from_secs(60));
    assert_eq!(cfg.timeouts.command, Duration::from_secs(90));
    for field in [
        "apiRequest",
        "spdkRequest",
        "command",
        "nvmeIo",
        "nvmeAdmin",
        "nvmeTransport",
    ] {
        let e = err(&format!("{MINIMAL_FILE}timeouts: {{{field}: 0s}}\n"));
        assert_eq!(
            e.to_string(),
            format!("timeouts.{field}: 0s must be positive"),
            "{field}"
        );
    }
    let e = refused(
        &format!("{MINIMAL_FILE}timeouts: {{nvmeTransport: 1ms}}\n"),
        "timeouts.nvmeTransport",
    );
    assert!(e.to_string().contains("from 2ms"), "{e}");
    refused(
        &format!("{MINIMAL_FILE}timeouts: {{spdkRequest: forever}}\n"),
        "timeouts.spdkRequest",
    );
    refused(
        &format!("{MINIMAL_FILE}timeouts: {{api: 1s}}\n"),
        "timeouts.api",
    );
}

#[test]
fn the_timeouts_reach_the_agent_and_spdk() {
    let cfg = Config::from_yaml(&format!(
        "{MINIMAL_FILE}timeouts: {{apiRequest: 4s, spdkRequest: 7s}}\n"
    ))
    .unwrap();
    let opts = liteio_agent::agent::AgentOptions::from_config("n", cfg.clone());
    assert_eq!(opts.request_timeout, Duration::from_secs(4));
    #[cfg(feature = "spdk")]
    assert_eq!(
        liteio_agent::spdk::setup::runtime_options(&cfg).request_timeout,
        Duration::from_secs(7)
    );
}
