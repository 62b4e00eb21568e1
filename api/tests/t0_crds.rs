//! T0: the checked-in CRDs under deploy/crds are what the types generate, and carry the
//! schema rules the API server enforces.

use liteio_api::crd;

#[test]
fn checked_in_crds_are_current() {
    let dir = format!("{}/../deploy/crds", env!("CARGO_MANIFEST_DIR"));
    let files = crd::files().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(files.len(), 6);
    for (name, body) in files {
        let on_disk = std::fs::read_to_string(format!("{dir}/{name}")).unwrap_or_default();
        assert!(
            on_disk == body,
            "deploy/crds/{name} is stale: run `cargo run -p liteio-api --bin crdgen`"
        );
    }
}

#[test]
fn crds_have_status_subresource_printer_columns_and_rules() {
    for c in crd::all() {
        let v = &c.spec.versions[0];
        assert_eq!(c.spec.group, "volume.antstor.alipay.com");
        assert_eq!(c.spec.scope, "Namespaced");
        assert!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            "{} lacks /status",
            c.spec.names.kind
        );
        let cols: Vec<_> = v
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert!(
            cols.contains(&"status") && cols.contains(&"age"),
            "{}: {cols:?}",
            c.spec.names.kind
        );
        assert!(
            c.spec
                .names
                .short_names
                .as_ref()
                .is_some_and(|s| !s.is_empty())
        );
    }
    let yaml = std::fs::read_to_string(format!(
        "{}/../deploy/crds/antstorvolumes.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap_or_default();
    assert!(yaml.contains("spec.uuid must not be empty"));
    assert!(yaml.contains("- MustRemote"), "positionAdvice enum present");
    let pool = std::fs::read_to_string(format!(
        "{}/../deploy/crds/storagepools.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap_or_default();
    for col in ["ip", "hostname", "storage", "free", "status"] {
        assert!(
            pool.contains(&format!("name: {col}\n")),
            "pool column {col}"
        );
    }
}
