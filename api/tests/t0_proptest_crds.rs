//! T0 property tests: every CRD kind as it could come from the API server.
//!
//! Each case starts from a checked-in fixture of the kind (so every field the fixture sets is
//! reached) and applies one to four mutations: a field replaced by a value of any JSON type
//! (huge and negative numbers, floats, unicode and empty strings, nested arrays/objects), a
//! field removed, an unknown field added, or an array element duplicated. Then:
//!
//! - deserializing never panics, and a failure's path (serde_path_to_error) is the mutated
//!   field or a field above it: the error names the field;
//! - a decoded object goes through the crate's validate function and every accessor the
//!   controller and agent call (sizes, phase, scheduling state) without panicking, every
//!   validation error names a field under `metadata`, `spec` or `status`, and the object
//!   serializes again.
//!
//! Cases per property: 256, or `PROPTEST_CASES`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use liteio_api::validate::{self, ValidationErrors};
use liteio_api::{
    AntstorDataControl, AntstorSnapshot, AntstorVolume, AntstorVolumeGroup, StoragePool,
    VolumeMigration,
};
use liteio_tests::prop::check;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// One step of a JSON path.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Key(String),
    Index(usize),
}

/// Every path in `v` below the root (objects' keys and arrays' elements).
fn paths(v: &Value, prefix: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                prefix.push(Step::Key(k.clone()));
                out.push(prefix.clone());
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                prefix.push(Step::Index(i));
                out.push(prefix.clone());
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn at<'a>(v: &'a mut Value, path: &[Step]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, s| match s {
        Step::Key(k) => v.get_mut(k.as_str()),
        Step::Index(i) => v.get_mut(*i),
    })
}

/// Strings that tend to break parsers.
fn nasty_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just(" ".to_string()),
        Just("-1".to_string()),
        Just("18446744073709551616".to_string()),
        Just("1Zi".to_string()),
        Just("1e400".to_string()),
        Just("9223372036854775808Ei".to_string()),
        Just("NaN".to_string()),
        Just("ünïcödé-名前-🦀".to_string()),
        Just("a/b/../../etc".to_string()),
        Just("\u{0}".to_string()),
        "\\PC{0,40}",
        any::<String>(),
    ]
}

/// Any JSON value, leaning on edge cases.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        Just(Value::from(i64::MIN)),
        Just(Value::from(-1)),
        Just(Value::from(0)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        Just(Value::from(1e300)),
        nasty_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(nasty_string(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

#[derive(Debug, Clone)]
enum Mutation {
    Replace(prop::sample::Index, Value),
    Remove(prop::sample::Index),
    AddField(prop::sample::Index, String, Value),
    DuplicateElement(prop::sample::Index),
    /// A number replaced by an extreme one of either sign.
    Extreme(prop::sample::Index, prop::sample::Index),
}

fn extremes() -> Vec<Value> {
    vec![
        Value::from(u64::MAX),
        Value::from(u64::MAX / 2 + 1),
        Value::from(i64::MAX),
        Value::from(i64::MIN),
        Value::from(-1),
        Value::from(0),
        Value::from(1e308),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<prop::sample::Index>(), any_json()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        1 => any::<prop::sample::Index>().prop_map(Mutation::Remove),
        1 => (any::<prop::sample::Index>(), nasty_string(), any_json())
            .prop_map(|(i, k, v)| Mutation::AddField(i, k, v)),
        2 => any::<prop::sample::Index>().prop_map(Mutation::DuplicateElement),
        3 => (any::<prop::sample::Index>(), any::<prop::sample::Index>())
            .prop_map(|(i, v)| Mutation::Extreme(i, v)),
    ]
}

/// Applies `m` to `doc`; returns the path it touched.
fn apply(doc: &mut Value, m: &Mutation) -> Vec<Step> {
    let mut all = Vec::new();
    paths(doc, &mut Vec::new(), &mut all);
    if all.is_empty() {
        return Vec::new();
    }
    match m {
        Mutation::Replace(i, v) => {
            let p = i.get(&all).clone();
            if let Some(slot) = at(doc, &p) {
                *slot = v.clone();
            }
            p
        }
        Mutation::Remove(i) => {
            let p = i.get(&all).clone();
            let (last, parent) = p
                .split_last()
                .map(|(l, r)| (l.clone(), r.to_vec()))
                .unwrap_or((Step::Index(0), Vec::new()));
            match (at(doc, &parent), last) {
                (Some(Value::Object(o)), Step::Key(k)) => {
                    o.remove(&k);
                }
                (Some(Value::Array(a)), Step::Index(j)) if j < a.len() => {
                    a.remove(j);
                }
                _ => {}
            }
            parent
        }
        Mutation::AddField(i, k, v) => {
            let p = i.get(&all).clone();
            if let Some(Value::Object(o)) = at(doc, &p) {
                o.insert(k.clone(), v.clone());
            }
            p
        }
        Mutation::Extreme(i, v) => {
            let numbers: Vec<Vec<Step>> = all
                .iter()
                .filter(|p| {
                    let mut d = doc.clone();
                    at(&mut d, p).is_some_and(|x| x.is_number())
                })
                .cloned()
                .collect();
            if numbers.is_empty() {
                return Vec::new();
            }
            let p = i.get(&numbers).clone();
            if let Some(slot) = at(doc, &p) {
                *slot = v.get(&extremes()).clone();
            }
            p
        }
        Mutation::DuplicateElement(i) => {
            let arrays: Vec<Vec<Step>> = all
                .iter()
                .filter(|p| matches!(p.last(), Some(Step::Index(_))))
                .cloned()
                .collect();
            if arrays.is_empty() {
                return Vec::new();
            }
            let p = i.get(&arrays).clone();
            let parent = &p[..p.len() - 1];
            if let Some(Value::Array(a)) = at(doc, parent)
                && let Some(Step::Index(j)) = p.last()
                && let Some(e) = a.get(*j).cloned()
            {
                a.push(e);
            }
            parent.to_vec()
        }
    }
}

fn error_path(e: &serde_path_to_error::Path) -> Option<Vec<Step>> {
    e.iter()
        .map(|s| match s {
            serde_path_to_error::Segment::Map { key } => Some(Step::Key(key.clone())),
            serde_path_to_error::Segment::Seq { index } => Some(Step::Index(*index)),
            // Enums and untagged/flattened content: the path stops being precise.
            _ => None,
        })
        .collect()
}

/// Shared property: decode `doc` after `mutations`, and on success hand the object to
/// `use_it`.
fn decode_and_use<T: DeserializeOwned + Serialize>(
    base: &Value,
    mutations: &[Mutation],
    use_it: impl Fn(&T) -> Result<(), ValidationErrors>,
) -> Result<(), TestCaseError> {
    let mut doc = base.clone();
    let touched: Vec<Vec<Step>> = mutations.iter().map(|m| apply(&mut doc, m)).collect();
    match serde_path_to_error::deserialize::<_, T>(&doc) {
        Err(e) => {
            let Some(path) = error_path(e.path()) else {
                return Ok(());
            };
            // The failing field is one that was touched, or above or below one.
            let related = touched.iter().any(|t| {
                let n = t.len().min(path.len());
                t[..n] == path[..n]
            });
            prop_assert!(
                related,
                "error at {} ({}) but the mutations touched {touched:?}",
                e.path(),
                e.inner()
            );
            prop_assert!(!e.inner().to_string().is_empty());
        }
        Ok(obj) => {
            if let Err(errors) = use_it(&obj) {
                prop_assert!(!errors.0.is_empty());
                for err in &errors.0 {
                    prop_assert!(
                        ["metadata", "spec", "status"]
                            .iter()
                            .any(|p| err.field.starts_with(p)),
                        "validation error names no field: {err:?}"
                    );
                    prop_assert!(!err.reason.is_empty());
                }
            }
            let again = serde_json::to_value(&obj);
            prop_assert!(again.is_ok(), "does not serialize again: {again:?}");
        }
    }
    Ok(())
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(mutation(), 1..5)
}

#[test]
fn antstor_volumes_from_the_api_server() {
    for name in ["antstorvolume.yaml", "antstorvolume-unscheduled.yaml"] {
        let base = fixture(name);
        check(&format!("AntstorVolume ({name})"), mutations(), |m| {
            decode_and_use::<AntstorVolume>(&base, &m, |v| {
                let _ = (v.total_size(), v.is_local(), v.target_node(), v.phase());
                let _ = liteio_api::naming::subsys_nqn(&v.spec.uuid);
                let _ = liteio_api::naming::serial_number(&v.spec.uuid);
                validate::volume(v)
            })
        });
    }
}

#[test]
fn storage_pools_from_the_api_server() {
    for name in ["storagepool-lvm.yaml", "storagepool-spdk.yaml"] {
        let base = fixture(name);
        check(&format!("StoragePool ({name})"), mutations(), |m| {
            decode_and_use::<StoragePool>(&base, &m, |p| {
                let _ = (
                    p.mode(),
                    p.total_bytes(),
                    p.reported_free_bytes(),
                    p.available_bytes(),
                    p.is_schedulable(),
                    p.host_nqn(),
                );
                validate::pool(p)
            })
        });
    }
}

#[test]
fn antstor_snapshots_from_the_api_server() {
    let base = fixture("antstorsnapshot.yaml");
    check("AntstorSnapshot", mutations(), |m| {
        decode_and_use::<AntstorSnapshot>(&base, &m, |s| {
            let _ = liteio_api::naming::snapshot_name(&s.spec.origin_vol_name);
            validate::snapshot(s)
        })
    });
}

#[test]
fn volume_groups_from_the_api_server() {
    let base = fixture("antstorvolumegroup.yaml");
    check("AntstorVolumeGroup", mutations(), |m| {
        decode_and_use::<AntstorVolumeGroup>(&base, &m, validate::volume_group)
    });
}

#[test]
fn volume_migrations_from_the_api_server() {
    let base = fixture("volumemigration.yaml");
    check("VolumeMigration", mutations(), |m| {
        decode_and_use::<VolumeMigration>(&base, &m, |_| Ok(()))
    });
}

#[test]
fn data_controls_from_the_api_server() {
    let base = fixture("antstordatacontrol.yaml");
    check("AntstorDataControl", mutations(), |m| {
        decode_and_use::<AntstorDataControl>(&base, &m, |d| {
            let _ = liteio_api::naming::data_control_vg(
                d.metadata.namespace.as_deref().unwrap_or_default(),
                d.metadata.name.as_deref().unwrap_or_default(),
            );
            Ok(())
        })
    });
}

/// Found by `storage_pools_from_the_api_server`: two reserved LVs whose sizes add up past
/// u64 made `available_bytes` panic (debug) or wrap (release).
#[test]
fn reserved_sizes_that_overflow_saturate() {
    let mut doc = fixture("storagepool-lvm.yaml");
    let lvs = doc["spec"]["kernelLvm"]["reservedLVol"]
        .as_array_mut()
        .unwrap();
    lvs[0]["sizeByte"] = Value::from(u64::MAX);
    let second = lvs[0].clone();
    lvs.push(second);
    let p: StoragePool = serde_json::from_value(doc).unwrap();
    assert_eq!(p.available_bytes(), 0);
}

#[test]
fn quantities_never_panic_and_name_the_input() {
    check("size::parse_quantity_str", nasty_string(), |s| {
        if let Err(e) = liteio_api::size::parse_quantity_str(&s) {
            prop_assert!(!e.to_string().is_empty());
        }
        Ok(())
    });
    check(
        "size::round_up/round_down/format_bytes",
        (any::<u64>(), any::<u64>()),
        |(b, u)| {
            let _ = liteio_api::size::round_up(b, u);
            let _ = liteio_api::size::round_down(b, u);
            let _ = liteio_api::size::format_bytes(b);
            Ok(())
        },
    );
}
