//! The versions of objects the agent's own passes superseded ([`OwnWrites`]): a pass on such
//! a copy is skipped, and the watch event of the pass's last write brings the next one.

/// The resourceVersions objects went through during the agent's own last pass over them,
/// except the last one.
///
/// A pass may write an object several times (finalizer, spec, export, status). The watch
/// delivers those writes one by one, and each schedules another pass, which runs on the copy
/// the watch has delivered so far: one the agent itself has already superseded. Such a pass
/// would redo engine and export checks and then fail on a conflict; it is skipped instead,
/// and the watch event of the pass's last write brings the next pass. resourceVersions are
/// only compared for equality.
#[derive(Debug, Default)]
pub struct OwnWrites {
    passed: std::sync::Mutex<std::collections::HashMap<String, Vec<String>>>,
}

impl OwnWrites {
    fn passed(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Vec<String>>> {
        self.passed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `rv` of object `key` is a version the agent's last pass wrote and then
    /// superseded. Any other version means the object has moved on: the record is dropped.
    pub fn is_superseded(&self, key: &str, rv: Option<&str>) -> bool {
        let mut passed = self.passed();
        match (passed.get(key), rv) {
            (Some(rvs), Some(rv)) if rvs.iter().any(|r| r == rv) => true,
            (Some(_), _) => {
                passed.remove(key);
                false
            }
            (None, _) => false,
        }
    }

    /// A pass over `key` went through `rvs` (the version it was given, then each write's),
    /// in order.
    pub fn record(&self, key: String, mut rvs: Vec<String>) {
        rvs.dedup();
        if rvs.len() > 1 {
            rvs.pop();
            self.passed().insert(key, rvs);
        } else {
            self.passed().remove(&key);
        }
    }

    /// Objects with a record.
    pub fn len(&self) -> usize {
        self.passed().len()
    }

    /// Whether no object has a record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::OwnWrites;

    #[test]
    fn only_versions_the_agent_superseded_are_skipped() {
        let w = OwnWrites::default();
        w.record("ns/a".into(), vec!["1".into(), "2".into(), "3".into()]);
        assert!(w.is_superseded("ns/a", Some("1")));
        assert!(w.is_superseded("ns/a", Some("2")));
        assert!(!w.is_superseded("ns/b", Some("2")), "another object");
        // The last write is not superseded: its pass must run, and the record goes.
        assert!(!w.is_superseded("ns/a", Some("3")));
        assert!(w.is_empty());
        assert!(!w.is_superseded("ns/a", Some("1")), "the record is gone");
    }

    #[test]
    fn a_pass_without_writes_leaves_no_record() {
        let w = OwnWrites::default();
        w.record("ns/a".into(), vec!["1".into(), "2".into()]);
        w.record("ns/a".into(), vec!["2".into()]);
        assert!(w.is_empty());
        assert!(!w.is_superseded("ns/a", None));
    }
}
