//! T0 property tests: what the agent parses, on bad input (issue 16, item 5).
//!
//! - The config file: any text, and LiteIO's full example with one to three fields replaced
//!   by values of any type or removed. Never a panic; an error names a field
//!   (`ConfigError::field`). A config that parses also answers its derived values.
//! - Durations of the config.
//! - LVM's `vgs`/`lvs` JSON reports: any text, and the checked-in reports with fields
//!   replaced. Never a panic; an error names the report field or says the JSON is bad.
//! - sysfs `/sys/block/*/stat`, `/proc/*/task/*/stat`, `losetup -J` output, the
//!   `LITEIO_CRASH_AT` spec: never a panic.
//!
//! Cases per property: 256, or `PROPTEST_CASES`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use liteio_agent::config::{Config, parse_duration};
use liteio_agent::engine::blkstat::parse_stat;
use liteio_agent::engine::lvm::report::{parse_lvs, parse_vgs};
use liteio_agent::engine::parse_losetup_j;
use liteio_agent::metrics::parse_task_stat;
use liteio_tests::prop::check;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Map, Value};

fn fixture(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn nasty_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("-1".to_string()),
        Just("18446744073709551616".to_string()),
        Just("18446744073709551615B".to_string()),
        Just("99999999999999999999h".to_string()),
        Just("1Zi".to_string()),
        Just("16Ei".to_string()),
        Just("0x".to_string()),
        Just("0xffffffffffffffffffffffffffffffffffff".to_string()),
        Just("ünïcödé-🦀".to_string()),
        Just("::".to_string()),
        Just("999.999.999.999".to_string()),
        "\\PC{0,30}",
        "[0-9]{1,25}(ms|s|m|h|B|Gi|)",
    ]
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        Just(Value::from(-1)),
        Just(Value::from(0)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        nasty_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map(nasty_string(), inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// One step of a path in a JSON document.
#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

fn paths(v: &Value, prefix: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                prefix.push(Step::Key(k.clone()));
                out.push(prefix.clone());
                paths(c, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                prefix.push(Step::Index(i));
                out.push(prefix.clone());
                paths(c, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

#[derive(Debug, Clone)]
enum Edit {
    Set(prop::sample::Index, Value),
    Remove(prop::sample::Index),
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    prop::collection::vec(
        prop_oneof![
            4 => (any::<prop::sample::Index>(), any_json()).prop_map(|(i, v)| Edit::Set(i, v)),
            1 => any::<prop::sample::Index>().prop_map(Edit::Remove),
        ],
        1..4,
    )
}

fn apply(doc: &mut Value, e: &Edit) {
    let mut all = Vec::new();
    paths(doc, &mut Vec::new(), &mut all);
    if all.is_empty() {
        return;
    }
    let (Edit::Set(i, _) | Edit::Remove(i)) = e;
    let path = i.get(&all).clone();
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    let mut v = &mut *doc;
    for s in parent {
        let next = match s {
            Step::Key(k) => v.get_mut(k.as_str()),
            Step::Index(i) => v.get_mut(*i),
        };
        let Some(next) = next else {
            return;
        };
        v = next;
    }
    match (v, last, e) {
        (Value::Object(m), Step::Key(k), Edit::Set(_, value)) => {
            m.insert(k.clone(), value.clone());
        }
        (Value::Object(m), Step::Key(k), Edit::Remove(_)) => {
            m.remove(k);
        }
        (Value::Array(a), Step::Index(j), Edit::Set(_, value)) if *j < a.len() => {
            a[*j] = value.clone();
        }
        (Value::Array(a), Step::Index(j), Edit::Remove(_)) if *j < a.len() => {
            a.remove(*j);
        }
        _ => {}
    }
}

fn config_error_names_a_field(e: &liteio_agent::config::ConfigError) -> Result<(), TestCaseError> {
    let field = e.field();
    prop_assert!(field.is_some_and(|f| !f.is_empty()), "no field in {e:?}");
    prop_assert!(!e.to_string().is_empty());
    Ok(())
}

fn use_config(c: &Config) {
    let _ = (
        c.spdk.mem_size_mib(),
        c.spdk.core_mask_bits(),
        c.nvmf.port_range.ports().count(),
    );
}

#[test]
fn agent_config_from_any_text() {
    check("agent Config::from_yaml(any text)", "\\PC{0,200}", |text| {
        match Config::from_yaml(&text) {
            Err(e) => config_error_names_a_field(&e)?,
            Ok(c) => use_config(&c),
        }
        Ok(())
    });
}

#[test]
fn agent_config_with_bad_fields_names_the_field() {
    for name in [
        "full-agent-config.yaml",
        "liteio-lvm-agent-config.yaml",
        "liteio-aio-lvs-agent-config.yaml",
    ] {
        let base: Value = serde_yaml::from_str(&fixture(name)).unwrap();
        assert!(Config::from_yaml(&fixture(name)).is_ok(), "{name}");
        check(
            &format!("agent Config::from_yaml({name} with 1-3 fields replaced)"),
            edits(),
            |es| {
                let mut doc = base.clone();
                for e in &es {
                    apply(&mut doc, e);
                }
                let text = serde_yaml::to_string(&doc).unwrap();
                match Config::from_yaml(&text) {
                    Err(e) => config_error_names_a_field(&e)?,
                    Ok(c) => use_config(&c),
                }
                Ok(())
            },
        );
    }
}

#[test]
fn agent_durations_never_panic() {
    check("agent config::parse_duration", nasty_string(), |s| {
        if let Err(e) = parse_duration(&s) {
            prop_assert!(!e.is_empty());
        }
        Ok(())
    });
}

/// Report fields the parsers read, so that an error can be checked to name one.
const LVM_FIELDS: &[&str] = &[
    "vg_size",
    "vg_free",
    "vg_extent_size",
    "vg_extent_count",
    "pv_count",
    "lv_size",
    "origin_size",
    "stripes",
    "bad JSON",
];

fn lvm_error_names_the_field(e: &str) -> Result<(), TestCaseError> {
    prop_assert!(
        LVM_FIELDS.iter().any(|f| e.contains(f)),
        "LVM report error names no field: {e}"
    );
    Ok(())
}

#[test]
fn lvm_reports_with_bad_fields() {
    for name in [
        "lvm/vgs-test-vg.json",
        "lvm/vgs-striped-vg.json",
        "lvm/lvs-test-vg.json",
    ] {
        let base: Value = serde_json::from_str(&fixture(name)).unwrap();
        check(
            &format!("LVM parse_vgs/parse_lvs({name} with 1-3 fields replaced)"),
            edits(),
            |es| {
                let mut doc = base.clone();
                for e in &es {
                    apply(&mut doc, e);
                }
                let text = doc.to_string();
                for r in [parse_vgs(&text).map(|_| ()), parse_lvs(&text).map(|_| ())] {
                    if let Err(e) = r {
                        lvm_error_names_the_field(&e)?;
                    }
                }
                Ok(())
            },
        );
    }
    check("LVM parse_vgs/parse_lvs(any text)", "\\PC{0,120}", |text| {
        for r in [parse_vgs(&text).map(|_| ()), parse_lvs(&text).map(|_| ())] {
            if let Err(e) = r {
                lvm_error_names_the_field(&e)?;
            }
        }
        Ok(())
    });
}

/// Whitespace-separated tokens that are mostly numbers, some huge or not numbers at all.
fn number_line() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            4 => any::<u64>().prop_map(|n| n.to_string()),
            1 => Just(u64::MAX.to_string()),
            1 => nasty_string(),
        ],
        0..20,
    )
    .prop_map(|v| v.join(" "))
}

#[test]
fn sysfs_and_procfs_text_never_panics() {
    check(
        "blkstat::parse_stat(/sys/block/*/stat)",
        number_line(),
        |text| {
            let _ = parse_stat(&text);
            Ok(())
        },
    );
    let task_stat = ("[0-9]{1,7}", "\\PC{0,20}", number_line())
        .prop_map(|(pid, comm, rest)| format!("{pid} ({comm}) S {rest}"));
    check(
        "metrics::parse_task_stat(/proc/*/task/*/stat)",
        task_stat,
        |text| {
            let _ = parse_task_stat(&text);
            Ok(())
        },
    );
    check(
        "metrics::parse_task_stat(any text)",
        "\\PC{0,100}",
        |text| {
            let _ = parse_task_stat(&text);
            Ok(())
        },
    );
}

#[test]
fn losetup_output_and_crash_specs_never_panic() {
    let losetup = prop_oneof![
        "\\PC{0,100}",
        any_json().prop_map(|v| serde_json::json!({ "loopdevices": [v] }).to_string()),
    ];
    check("losetup::parse_losetup_j", losetup, |text| {
        let _ = parse_losetup_j(&text);
        Ok(())
    });
    check("crash::CrashSpec::parse", "\\PC{0,40}", |text| {
        if let Err(e) = liteio_agent::crash::CrashSpec::parse(&text) {
            prop_assert_eq!(&e.value, &text);
        }
        Ok(())
    });
}
