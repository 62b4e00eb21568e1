//! The runner the property tests of every crate share: a case count that `PROPTEST_CASES`
//! overrides, a run that prints how many cases it tried (the closing notes state the counts)
//! and fails on the first failure or panic, and no persistence files left in the tree.

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Cases per property of the T0 tests unless `PROPTEST_CASES` says otherwise.
pub const T0_CASES: u32 = 256;

/// `PROPTEST_CASES` when it is a number, else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A runner for `cases` cases that writes no failure-persistence file.
pub fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

/// Runs `test` on [`cases`]`(`[`T0_CASES`]`)` values of `strategy`, prints how many ran, and
/// panics with the property's name on the first failure (proptest shrinks it first).
pub fn check<S: Strategy>(
    name: &str,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let ran = std::sync::atomic::AtomicU32::new(0);
    let result = runner(cases(T0_CASES)).run(&strategy, |v| {
        ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        test(v)
    });
    println!(
        "property {name}: {} cases",
        ran.load(std::sync::atomic::Ordering::Relaxed)
    );
    if let Err(e) = result {
        panic!("property {name} failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "property always-fails failed")]
    fn a_failing_property_panics_with_its_name() {
        check("always-fails", 0u8..10, |_| Err(TestCaseError::fail("no")));
    }

    #[test]
    fn a_passing_property_runs_its_cases() {
        let seen = std::sync::atomic::AtomicU32::new(0);
        check("counts", 0u32..1000, |_| {
            seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        });
        assert_eq!(seen.into_inner(), cases(T0_CASES));
    }
}
