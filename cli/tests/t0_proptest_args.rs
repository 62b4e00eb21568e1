//! T0 property tests: `kubectl-liteio` argument parsing on arbitrary command lines (issue 16,
//! item 5). Words from the real vocabulary (sub-commands, aliases, flags) mixed with
//! arbitrary strings: parsing never panics (clap's debug assertions included), a refusal is
//! a clap error with a message, and an accepted command line carries the words given.
//!
//! Cases per property: 256, or `PROPTEST_CASES`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::{CommandFactory, Parser};
use liteio_cli::Cli;
use liteio_cli::args::{Command, DescribeTarget, PoolTarget};
use liteio_tests::prop::check;
use proptest::prelude::*;

fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "pools", "pool", "volumes", "volume", "vol", "snapshots", "snap", "describe",
            "lock", "unlock", "-o", "--output", "json", "yaml", "table", "xml", "-n",
            "--namespace", "--kubeconfig", "--help", "-h", "--version", "--", "-", "=",
            "-o=json", "--namespace=", "-nfoo", "top", "--once", "--interval", "0", "1",
            "3601", "--metrics-url", "http://127.0.0.1:9810/metrics", "--metrics-port",
            "--limit",
        ])
        .prop_map(str::to_string),
        1 => "\\PC{0,20}",
        1 => Just(String::new()),
        1 => Just("ünïcödé-🦀".to_string()),
    ]
}

#[test]
fn clap_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn any_command_line_is_parsed_or_refused() {
    check(
        "Cli::try_parse_from(any words)",
        prop::collection::vec(word(), 0..6),
        |words| {
            let argv = std::iter::once("kubectl-liteio".to_string()).chain(words.iter().cloned());
            match Cli::try_parse_from(argv) {
                Ok(cli) => {
                    // The names and namespace are the words given, unchanged.
                    let name = match &cli.command {
                        Command::Describe {
                            target: DescribeTarget::Volume { name } | DescribeTarget::Pool { name },
                        }
                        | Command::Lock {
                            target: PoolTarget::Pool { name },
                        }
                        | Command::Unlock {
                            target: PoolTarget::Pool { name },
                        } => Some(name.clone()),
                        _ => None,
                    };
                    if let Some(n) = name {
                        prop_assert!(words.contains(&n), "{n:?} not in {words:?}");
                    }
                    // `top`: the interval is within its range, the URLs are words given.
                    if let Command::Top {
                        interval,
                        metrics_urls,
                        ..
                    } = &cli.command
                    {
                        prop_assert!((1..=3600).contains(interval), "--interval {interval}");
                        for u in metrics_urls {
                            prop_assert!(words.contains(u), "{u:?} not in {words:?}");
                        }
                    }
                }
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
            Ok(())
        },
    );
}
