//! T0 property tests: how the CSI driver reads requests, on bad input (issue 16, item 5).
//!
//! The functions every CreateVolume / NodeStage / NodePublish / List* request goes through
//! before anything is made: StorageClass parameters, capacity ranges, volume capabilities,
//! the object name derived from a CSI name, paging tokens, the mount table and the
//! `nvme connect` command line built from a volume's target. Never a panic; an
//! `InvalidArgument` names the request field it is about; derived object names are always
//! valid Kubernetes names.
//!
//! Cases per property: 256, or `PROPTEST_CASES`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use liteio_api::common::SpdkTarget;
use liteio_csi::csi::volume_capability::access_mode::Mode;
use liteio_csi::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use liteio_csi::csi::{CapacityRange, VolumeCapability};
use liteio_csi::{CsiError, ErrorKind, mount, nvme, params};
use liteio_tests::prop::check;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

fn nasty_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just(" ".to_string()),
        Just("-1".to_string()),
        Just("18446744073709551616".to_string()),
        Just("ext4".to_string()),
        Just("XFS".to_string()),
        Just("SpdkLVol".to_string()),
        Just("VolumeGroup".to_string()),
        Just("ünïcödé-名前-🦀".to_string()),
        Just("../../etc/passwd".to_string()),
        Just("a".repeat(300)),
        "\\PC{0,40}",
        "[a-z0-9.-]{1,70}",
    ]
}

/// An `InvalidArgument` message must start with the field (`name: …`, `parameters.fsType: …`).
fn names_field(e: &CsiError, fields: &[&str]) -> Result<(), TestCaseError> {
    if e.kind() == ErrorKind::InvalidArgument {
        let msg = e.to_string();
        prop_assert!(
            fields.iter().any(|f| msg.starts_with(f)),
            "{msg:?} does not start with one of {fields:?}"
        );
    }
    Ok(())
}

fn parameters() -> impl Strategy<Value = HashMap<String, String>> {
    let key = prop_oneof![
        Just("fsType".to_string()),
        Just("csi.storage.k8s.io/fstype".to_string()),
        Just("volumeType".to_string()),
        Just("positionAdvice".to_string()),
        Just("mkfsParams".to_string()),
        Just("obnvmf/pv-type".to_string()),
        Just("obnvmf/raid-level".to_string()),
        Just("csi.storage.k8s.io/pvc/name".to_string()),
        Just("csi.storage.k8s.io/pvc/namespace".to_string()),
        nasty_string(),
    ];
    prop::collection::hash_map(key, nasty_string(), 0..6)
}

#[test]
fn storage_class_parameters() {
    check("params::VolumeParams::parse", parameters(), |p| {
        if let Err(e) = params::VolumeParams::parse(&p) {
            names_field(&e, &["parameters."])?;
        }
        let _ = params::volume_context(&p, "uuid", "node", "ext4");
        let _ = params::obnvmf_annotations(&p.clone().into_iter().collect());
        Ok(())
    });
}

#[test]
fn capacity_ranges() {
    let n = prop_oneof![
        any::<i64>(),
        Just(i64::MAX),
        Just(i64::MIN),
        Just(0i64),
        Just(-1i64),
        Just(1i64 << 20),
    ];
    let range = prop::option::of((n.clone(), n).prop_map(|(r, l)| CapacityRange {
        required_bytes: r,
        limit_bytes: l,
    }));
    check("params::volume_size", range, |r| {
        match params::volume_size(r.as_ref()) {
            Ok(size) => {
                prop_assert!(size >= liteio_api::size::MIN_VOLUME_SIZE);
                if let Some(r) = &r
                    && r.limit_bytes > 0
                {
                    prop_assert!(size <= r.limit_bytes.unsigned_abs());
                }
            }
            Err(e) => names_field(&e, &["capacity_range"])?,
        }
        Ok(())
    });
}

fn capability() -> impl Strategy<Value = VolumeCapability> {
    let access_type = prop_oneof![
        Just(None),
        Just(Some(AccessType::Block(BlockVolume {}))),
        (nasty_string(), prop::collection::vec(nasty_string(), 0..3)).prop_map(|(fs, flags)| {
            Some(AccessType::Mount(MountVolume {
                fs_type: fs,
                mount_flags: flags,
                volume_mount_group: String::new(),
            }))
        }),
    ];
    let mode = prop_oneof![
        Just(None),
        any::<i32>().prop_map(|m| Some(AccessMode { mode: m })),
        (0i32..8).prop_map(|m| Some(AccessMode { mode: m })),
        Just(Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32
        })),
    ];
    (access_type, mode).prop_map(|(access_type, access_mode)| VolumeCapability {
        access_type,
        access_mode,
    })
}

#[test]
fn volume_capabilities() {
    check(
        "params::check_capabilities",
        prop::collection::vec(capability(), 0..4),
        |caps| {
            if let Err(e) = params::check_capabilities("volume_capabilities", &caps) {
                names_field(&e, &["volume_capabilities"])?;
            }
            for c in &caps {
                if let Err(e) = params::check_capability("volume_capability", c) {
                    names_field(&e, &["volume_capability"])?;
                }
            }
            Ok(())
        },
    );
}

#[test]
fn object_names_are_kubernetes_names() {
    check("params::object_name", nasty_string(), |name| {
        let o = params::object_name(&name);
        prop_assert!(!o.is_empty() && o.len() <= 63, "{o:?}");
        prop_assert!(
            o.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
            "{o:?}"
        );
        prop_assert!(
            !o.starts_with('-') && !o.ends_with('-'),
            "{o:?} is not a DNS label"
        );
        prop_assert_eq!(o.clone(), params::object_name(&name), "not stable");
        Ok(())
    });
}

#[test]
fn paging_tokens() {
    check(
        "params::page_offset + params::page",
        (nasty_string(), any::<i32>(), 0usize..10_000),
        |(token, max, len)| {
            match params::page_offset(&token, len) {
                Ok(start) => {
                    prop_assert!(start <= len);
                    match params::page(start, max, len) {
                        Ok((s, e, next)) => {
                            prop_assert!(s <= e && e <= len);
                            prop_assert!(next.is_empty() || next == e.to_string());
                        }
                        Err(e) => names_field(&e, &["max_entries"])?,
                    }
                }
                Err(e) => prop_assert!(e.to_string().starts_with("starting_token")),
            }
            Ok(())
        },
    );
}

#[test]
fn mount_tables_never_panic() {
    let line = prop_oneof![
        "\\PC{0,80}",
        (
            "[0-9]{1,3}",
            "\\PC{0,10}",
            "[/a-z\\\\0-9 ]{0,20}",
            "\\PC{0,10}"
        )
            .prop_map(|(id, root, mp, fs)| format!("{id} 1 0:1 {root} {mp} rw - {fs} /dev/x rw")),
    ];
    check(
        "mount::parse_mountinfo",
        prop::collection::vec(line, 0..6),
        |lines| {
            let entries = mount::parse_mountinfo(&lines.join("\n"));
            let _ = mount::mount_at(&entries, std::path::Path::new("/mnt/x"));
            Ok(())
        },
    );
}

#[test]
fn nvme_connect_lines() {
    let target = (
        nasty_string(),
        nasty_string(),
        nasty_string(),
        prop_oneof![
            Just("TCP".to_string()),
            Just("tcp".to_string()),
            nasty_string()
        ],
    )
        .prop_map(|(address, svc_id, subsys_nqn, trans_type)| SpdkTarget {
            address,
            svc_id,
            subsys_nqn,
            trans_type,
            ..SpdkTarget::default()
        });
    check(
        "nvme::connect_argv",
        (target, nasty_string()),
        |(t, host)| {
            match nvme::connect_argv(&t, &host) {
                Ok(argv) => {
                    // Every value is its own argument: nothing can smuggle in an option.
                    prop_assert!(argv.iter().any(|a| a == &t.address));
                    prop_assert!(argv.iter().any(|a| a == &t.subsys_nqn));
                }
                Err(e) => prop_assert!(e.to_string().contains("spec.spdkTarget."), "{e}"),
            }
            Ok(())
        },
    );
}
