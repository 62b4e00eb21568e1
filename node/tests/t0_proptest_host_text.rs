//! T0 property tests: node plumbing that parses what the host says (issue 16, item 5):
//! `/proc/<pid>/maps`, the hugepage counters in sysfs, the host NQN file and `losetup -J`
//! output, with arbitrary contents. Never a panic; an error names the file it read.
//!
//! Cases per property: 256, or `PROPTEST_CASES`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use liteio_node::{hostnqn, hugepages, losetup};
use liteio_tests::prop::check;
use proptest::prelude::*;

fn hex() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9a-f]{1,16}",
        Just("ffffffffffffffff".to_string()),
        Just("0".to_string()),
        Just("fffffffffffffffff".to_string()),
        "\\PC{0,5}",
    ]
}

fn maps_line() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => (hex(), hex(), prop::sample::select(vec![
            "/dev/hugepages/rtemap_0", "/dev/hugepages/rtemap_1 (deleted)", "/usr/lib/x.so", "",
        ]))
            .prop_map(|(a, b, p)| format!("{a}-{b} rw-s 00000000 00:2f 1234    {p}")),
        1 => "\\PC{0,60}",
    ]
}

#[test]
fn proc_maps_text() {
    check(
        "hugepages::mapped_bytes_in(/proc/<pid>/maps)",
        prop::collection::vec(maps_line(), 0..8),
        |lines| {
            let _ = hugepages::mapped_bytes_in(&lines.join("\n"), Path::new("/dev/hugepages"));
            Ok(())
        },
    );
}

fn counter() -> impl Strategy<Value = Option<String>> {
    prop::option::of(prop_oneof![
        any::<u64>().prop_map(|n| format!("{n}\n")),
        Just("18446744073709551616\n".to_string()),
        Just("-1".to_string()),
        Just(String::new()),
        "\\PC{0,12}",
    ])
}

#[test]
fn hugepage_counters_in_sysfs() {
    check(
        "hugepages::counts_in(sysfs files)",
        (counter(), counter(), counter()),
        |(nr, free, surplus)| {
            let dir = tempfile::tempdir().unwrap();
            for (f, v) in [
                ("nr_hugepages", &nr),
                ("free_hugepages", &free),
                ("surplus_hugepages", &surplus),
            ] {
                if let Some(v) = v {
                    std::fs::write(dir.path().join(f), v).unwrap();
                }
            }
            if let Err(e) = hugepages::counts_in(dir.path()) {
                let msg = e.to_string();
                prop_assert!(msg.contains("_hugepages"), "names no file: {msg}");
            }
            Ok(())
        },
    );
}

#[test]
fn host_nqn_files() {
    let content = prop_oneof![
        "\\PC{0,80}",
        "nqn\\.[ -~]{0,300}",
        Just("\n\n  \n".to_string()),
        Just("nqn.2014-08.org.nvmexpress:uuid:1\n".to_string()),
    ];
    check(
        "hostnqn::load(file contents)",
        (content, "[a-z0-9-]{1,20}"),
        |(text, node)| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("hostnqn");
            std::fs::write(&path, &text).unwrap();
            match hostnqn::load(&path, &node) {
                Ok(nqn) => prop_assert!(hostnqn::is_nqn(&nqn), "{nqn:?}"),
                Err(e) => prop_assert!(e.to_string().contains("hostnqn"), "{e}"),
            }
            Ok(())
        },
    );
}

#[test]
fn losetup_json() {
    let entry = (
        prop_oneof!["\\PC{0,20}", Just("/dev/loop0".to_string())],
        prop_oneof!["\\PC{0,20}", Just("/var/lib/x".to_string())],
    )
        .prop_map(|(name, file)| serde_json::json!({"name": name, "back-file": file}));
    let text = prop_oneof![
        "\\PC{0,80}",
        prop::collection::vec(entry, 0..4)
            .prop_map(|v| serde_json::json!({ "loopdevices": v }).to_string()),
    ];
    check("losetup::parse_losetup_j", text, |t| {
        let _ = losetup::parse_losetup_j(&t);
        Ok(())
    });
}
