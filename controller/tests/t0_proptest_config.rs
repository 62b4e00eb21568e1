//! T0 property tests: the controller's config parser on bad input (issue 16, item 5).
//!
//! - Any text: `Config::parse` returns, never panics.
//! - A full valid config with one to three fields replaced by values of any type (huge and
//!   negative numbers, floats, unicode and empty strings, lists, maps) or removed: never a
//!   panic, and an error is a config error that names a field.
//! - Durations, and the MetaSync URL parser (with the password sources): never a panic, and
//!   the password of a URL never appears in an error or in `Debug` output.
//!
//! Cases per property: 256, or `PROPTEST_CASES`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use liteio_controller::Error;
use liteio_controller::config::{Config, parse_duration};
use liteio_tests::prop::check;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Map, Value, json};

fn nasty_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("-1".to_string()),
        Just("18446744073709551616".to_string()),
        Just("99999999999999999999h".to_string()),
        Just("18446744073709551615h".to_string()),
        Just("1Zi".to_string()),
        Just("1e400".to_string()),
        Just("NaN".to_string()),
        Just("ünïcödé-🦀".to_string()),
        Just("postgres://u:hunter2@h:1/db?sslmode=verify-full".to_string()),
        "\\PC{0,30}",
        "[0-9]{1,25}(ms|s|m|h|d|)",
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

/// A config that sets every section.
fn full() -> Value {
    json!({
        "scheduler": {
            "filters": ["Basic", "Affinity", "MinLocalStorage"],
            "priorities": ["LeastResource", "PositionAdvice"],
            "maxRemoteVolumeCount": 3,
            "remoteIgnoreAnnoSelector": {"obnvmf/regard-as-remote": "true"},
            "lockSchedConfig": {
                "nodeSelector": [{"key": "maintenance", "operator": "In", "values": ["yes"]}],
                "taints": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]
            },
            "minLocalStoragePct": 20,
            "nodeReservations": [{"id": "sys", "size": "10Gi"}, {"id": "b", "size": 4096}],
            "nodeCacheSelector": {"a": "b"},
            "seed": 7,
            "thinOvercommitRatio": 1.5,
            "poolOvercommitRatios": {"node-1": 2.0}
        },
        "liveness": {"unknownAfter": "3m", "offlineAfter": "24h", "tick": "15s",
                     "deadPoolDeletionGrace": "20m", "vanishedPoolGrace": "10m"},
        "leaderElection": {"leaseName": "ndc", "leaseDuration": "15s",
                           "renewDeadline": "10s", "retryPeriod": "2s"},
        "metaSync": {"postgresUrl": "postgres://liteio@db:5432/m?sslmode=verify-full",
                     "passwordFile": "/run/pw", "caFile": "/etc/ca.pem", "cluster": "c"},
        "pluginConfigs": {"x": 1},
        "reconcileTimeout": "60s"
    })
}

fn leaves(v: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if let Value::Object(m) = v {
        for (k, child) in m {
            prefix.push(k.clone());
            out.push(prefix.clone());
            leaves(child, prefix, out);
            prefix.pop();
        }
    }
}

#[derive(Debug, Clone)]
enum Edit {
    Set(prop::sample::Index, Value),
    Remove(prop::sample::Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (any::<prop::sample::Index>(), any_json()).prop_map(|(i, v)| Edit::Set(i, v)),
        1 => any::<prop::sample::Index>().prop_map(Edit::Remove),
    ]
}

fn apply(doc: &mut Value, e: &Edit) {
    let mut all = Vec::new();
    leaves(doc, &mut Vec::new(), &mut all);
    let (Edit::Set(i, _) | Edit::Remove(i)) = e;
    let path = i.get(&all).clone();
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    let mut v = &mut *doc;
    for k in parent {
        let Some(next) = v.get_mut(k.as_str()) else {
            return;
        };
        v = next;
    }
    if let Value::Object(m) = v {
        match e {
            Edit::Set(_, value) => {
                m.insert(last.clone(), value.clone());
            }
            Edit::Remove(_) => {
                m.remove(last);
            }
        }
    }
}

fn names_a_field(e: &Error) -> Result<(), TestCaseError> {
    match e {
        Error::ConfigParse { field, message, .. } => {
            prop_assert!(!field.is_empty() && !message.is_empty(), "{e:?}");
        }
        Error::ConfigInvalid { field, reason } => {
            prop_assert!(!field.is_empty() && !reason.is_empty(), "{e:?}");
        }
        other => prop_assert!(false, "not a config error: {other:?}"),
    }
    prop_assert!(!e.to_string().contains("hunter2"), "{e}");
    Ok(())
}

#[test]
fn any_text_is_parsed_or_refused() {
    check("Config::parse(any text)", "\\PC{0,200}", |text| {
        if let Err(e) = Config::parse(&text) {
            names_a_field(&e)?;
        }
        Ok(())
    });
}

#[test]
fn a_full_config_with_bad_fields_names_the_field() {
    assert!(Config::parse(&serde_yaml::to_string(&full()).unwrap()).is_ok());
    check(
        "Config::parse(full config, 1-3 fields replaced or removed)",
        prop::collection::vec(edit(), 1..4),
        |edits| {
            let mut doc = full();
            for e in &edits {
                apply(&mut doc, e);
            }
            let text = serde_yaml::to_string(&doc).unwrap();
            match Config::parse(&text) {
                Err(e) => names_a_field(&e)?,
                Ok(c) => {
                    // The metaSync section's Debug output never shows a URL password.
                    let shown = format!("{:?}", c.meta_sync);
                    prop_assert!(!shown.contains("hunter2"), "{}", shown);
                }
            }
            Ok(())
        },
    );
}

#[test]
fn durations_never_panic() {
    check("config::parse_duration", nasty_string(), |s| {
        if let Err(e) = parse_duration(&s) {
            prop_assert!(!e.is_empty());
        }
        Ok(())
    });
}

#[test]
fn postgres_urls_never_panic_nor_show_the_password() {
    let url = (
        prop_oneof![Just("postgres://"), Just("postgresql://"), Just("")],
        "[a-z]{0,5}",
        prop_oneof![Just(":hunter2"), Just("")],
        prop_oneof![Just("@"), Just("")],
        "[a-z0-9.:%\\[\\]]{0,20}",
        "(/[a-z_]{0,8})?",
        prop::collection::vec(
            (
                prop_oneof![
                    Just("sslmode"),
                    Just("sslrootcert"),
                    Just("connect_timeout"),
                    Just("options"),
                    Just("host"),
                    Just("port"),
                    Just("sslcert"),
                    Just("x"),
                ],
                "[a-z0-9%=-]{0,12}",
            ),
            0..4,
        ),
    )
        .prop_map(|(scheme, user, pw, at, host, db, params)| {
            let q: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let sep = if q.is_empty() { "" } else { "?" };
            format!("{scheme}{user}{pw}{at}{host}{db}{sep}{}", q.join("&"))
        });
    check("metasync::postgres::parse_url", url, |u| {
        match liteio_controller::metasync::postgres::parse_url(&u) {
            Err(e) => prop_assert!(!e.contains("hunter2"), "{e}"),
            Ok(parsed) => {
                let shown = liteio_controller::metasync::postgres::describe(&parsed.config);
                prop_assert!(!shown.contains("hunter2"), "{shown}");
            }
        }
        Ok(())
    });
}
