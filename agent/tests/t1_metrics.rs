//! T1: `/metrics` of an agent on the file engine reports a volume's block I/O counters
//! (`liteio_volume_*`, read from the loop device its file is attached to), the heartbeat age,
//! and reconcile errors of objects the agent refuses; a deleted volume's series disappear;
//! and `promtool check metrics` has nothing to say about any of it (skipped, saying so,
//! without promtool). Needs root and loop devices; otherwise prints one skip line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::host::{no_loop_devices, not_root, run};
use common::*;
use kube::Api;
use liteio_agent::exporter::NoExporter;
use liteio_api::{AntstorVolume, VolumeType};

const UUID: &str = "5d1f6c2a-8e3b-4a7c-9d10-0000000000aa";

fn skip_reason() -> Option<String> {
    if let Some(r) = not_root().or_else(no_loop_devices) {
        return Some(r);
    }
    if run("losetup", &["--version"]).is_err() {
        return Some("losetup not installed".into());
    }
    None
}

/// A loop device bound to a file; unbound on drop, even when the test panics.
struct Loop(String);

impl Loop {
    fn attach(file: &str) -> Self {
        Self(run("losetup", &["--find", "--show", file]).unwrap())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if let Err(e) = run("losetup", &["-d", &self.0]) {
            eprintln!("cleanup: {e}");
        }
    }
}

fn volume(name: &str, uuid: &str, size: u64) -> AntstorVolume {
    scheduled_volume(name, uuid, size)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_io_heartbeat_age_and_reconcile_errors_are_exported() {
    if let Some(why) = skip_reason() {
        println!("SKIP block_io_heartbeat_age_and_reconcile_errors_are_exported: {why}");
        return;
    }
    tokio::time::timeout(Duration::from_secs(60), async {
        let env = Env::new().await;
        let agent = env.start_agent().await;
        let api: Api<AntstorVolume> = ns_api(&env.client);
        create(&api, &volume("pvc-io", UUID, 16 * MIB)).await;
        let v = volume_ready(&api, "pvc-io", "volume ready", Duration::from_secs(5)).await;
        let file = v.spec.kernel_lvol.clone().unwrap().dev_path;

        // Not attached: no block counters for it (the size is reported).
        let text = scrape(&agent).await;
        let vol = [("node", NODE), ("volume", "pvc-io"), ("uuid", UUID)];
        assert_eq!(
            metric_value(&text, "liteio_volume_size_bytes", &vol),
            Some((16 * MIB) as f64),
            "{text}"
        );
        assert!(
            !text.contains("liteio_volume_writes_completed_total{"),
            "{text}"
        );

        // Its provisioning was timed once, per step (observed right after the ready patch).
        let text = eventually("provisioning figures", Duration::from_secs(5), || async {
            let text = scrape(&agent).await;
            let total = [("node", NODE), ("step", "total")];
            (metric_value(&text, "liteio_provision_seconds_count", &total)? >= 1.0).then_some(text)
        })
        .await;
        for step in ["total", "engine", "export", "api", "waiting"] {
            assert_eq!(
                metric_value(
                    &text,
                    "liteio_provision_seconds_count",
                    &[("node", NODE), ("step", step)]
                ),
                Some(1.0),
                "step {step}: {text}"
            );
        }

        let lo = Loop::attach(&file);
        let dev = lo.0.trim_start_matches("/dev/").to_string();
        let labels = [
            ("node", NODE),
            ("volume", "pvc-io"),
            ("uuid", UUID),
            ("dev", dev.as_str()),
        ];
        let before = io_series(&agent, &labels, "I/O series of the loop device").await;

        // 1 MiB of direct writes, then 1 MiB of direct reads, through the loop device.
        let of = format!("of={}", lo.0);
        run(
            "dd",
            &[
                "if=/dev/zero",
                &of,
                "bs=4096",
                "count=256",
                "oflag=direct",
                "status=none",
            ],
        )
        .unwrap();
        let inf = format!("if={}", lo.0);
        run(
            "dd",
            &[
                &inf,
                "of=/dev/null",
                "bs=4096",
                "count=256",
                "iflag=direct",
                "status=none",
            ],
        )
        .unwrap();
        let after = eventually(
            "write counters to grow by 1 MiB",
            Duration::from_secs(5),
            || async {
                let text = scrape(&agent).await;
                let (w, b, r) = volume_io(&text, &labels)?;
                (b - before.1 >= MIB as f64 && w > before.0 && r > before.2)
                    .then_some((w, b, r, text))
            },
        )
        .await;
        println!(
            "writes {} -> {}, bytes written {} -> {}, reads {} -> {}",
            before.0, after.0, before.1, after.1, before.2, after.2
        );
        let text = after.3;
        for l in text
            .lines()
            .filter(|l| l.contains("pvc-io") || l.contains("heartbeat_age"))
        {
            println!("{l}");
        }
        assert!(text.contains("# TYPE liteio_volume_writes_completed_total counter"));
        assert!(
            metric_value(&text, "liteio_volume_io_now", &labels).is_some(),
            "{text}"
        );
        // Milliseconds became seconds: 256 direct writes took more than nothing, and less
        // than the test's minute.
        let took = metric_value(&text, "liteio_volume_write_time_seconds_total", &labels).unwrap();
        assert!((0.0..60.0).contains(&took), "write time {took} s");
        // LiteIO's names only with metrics.liteioCompatNames.
        assert!(!text.contains("blk_"), "{text}");

        // The heartbeat renews every 100 ms here: its age is small.
        let age = metric_value(&text, "liteio_heartbeat_age_seconds", &[("node", NODE)]).unwrap();
        assert!((0.0..5.0).contains(&age), "heartbeat age {age}");

        // An object the agent must refuse (an SPDK volume on a file pool) counts a reconcile
        // error of its kind.
        let mut bad = volume("pvc-bad", "5d1f6c2a-8e3b-4a7c-9d10-0000000000bb", 16 * MIB);
        bad.spec.type_ = Some(VolumeType::SpdkLVol);
        create(&api, &bad).await;
        let errs = [
            ("node", NODE),
            ("resource", "antstorvolume"),
            ("kind", "invalid_object"),
        ];
        eventually(
            "invalid_object reconcile error",
            Duration::from_secs(5),
            || async {
                let text = scrape(&agent).await;
                (metric_value(&text, "liteio_reconcile_errors_total", &errs)? >= 1.0).then_some(())
            },
        )
        .await;

        // Prometheus' linter on everything this agent serves, a volume's I/O, histograms and
        // reconcile errors included.
        let text = scrape(&agent).await;
        match liteio_tests::promtool::check_metrics(&text) {
            Ok(said) => {
                assert_eq!(said, "", "promtool check metrics:\n{said}\n{text}");
                println!("promtool check metrics: nothing to say");
            }
            Err(why) => println!("SKIP promtool check metrics: {why}"),
        }

        // Restarted with metrics.liteioCompatNames: LiteIO's names, units and `pvc` label
        // beside the new ones; they are all promtool has to say anything about.
        agent.shutdown(Duration::from_secs(5)).await;
        let agent = env
            .start_agent_with(Arc::new(NoExporter), |o| {
                o.config.metrics.liteio_compat_names = true;
            })
            .await;
        let mut old = labels.to_vec();
        old.push(("pvc", "/pvc-io"));
        let text = eventually("LiteIO's names", Duration::from_secs(5), || async {
            let text = scrape(&agent).await;
            let sectors = metric_value(&text, "blk_write_sectors", &old)?;
            let bytes = metric_value(&text, "liteio_volume_written_bytes_total", &labels)?;
            (sectors * 512.0 == bytes).then_some(text)
        })
        .await;
        assert!(text.contains("# TYPE blk_io_inflight gauge"), "{text}");
        match liteio_tests::promtool::check_metrics(&text) {
            Ok(said) => {
                let flagged: Vec<&str> = said
                    .lines()
                    .filter_map(|l| l.split_whitespace().next())
                    .collect();
                assert!(!flagged.is_empty(), "promtool found the old names fine");
                for name in flagged {
                    assert!(
                        liteio_agent::metrics::families::liteio_names().any(|n| n == name),
                        "promtool flags {name}, not one of LiteIO's names:\n{said}"
                    );
                }
            }
            Err(why) => println!("SKIP promtool check metrics: {why}"),
        }

        // Detached and deleted: its series are gone.
        drop(lo);
        delete_and_release(&api, "pvc-io", Duration::from_secs(5)).await;
        let text = scrape(&agent).await;
        assert!(!text.contains("pvc-io"), "{text}");
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

/// The same linter where the first test cannot run (no root, no loop devices): an agent with
/// a ready volume, one it refuses and its provisioning histogram.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_has_nothing_to_say_about_the_agents_metrics() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let env = Env::new().await;
        let agent = env.start_agent().await;
        let api: Api<AntstorVolume> = ns_api(&env.client);
        create(&api, &volume("pvc-p", UUID, 16 * MIB)).await;
        let mut bad = volume("pvc-bad", "5d1f6c2a-8e3b-4a7c-9d10-0000000000bb", 16 * MIB);
        bad.spec.type_ = Some(VolumeType::SpdkLVol);
        create(&api, &bad).await;
        let text = eventually(
            "a provisioned volume and a refused one",
            Duration::from_secs(5),
            || async {
                let text = scrape(&agent).await;
                let total = [("node", NODE), ("step", "total")];
                let errs = [
                    ("node", NODE),
                    ("resource", "antstorvolume"),
                    ("kind", "invalid_object"),
                ];
                (metric_value(&text, "liteio_provision_seconds_count", &total)? >= 1.0
                    && metric_value(&text, "liteio_reconcile_errors_total", &errs)? >= 1.0)
                    .then_some(text)
            },
        )
        .await;
        assert!(
            text.contains("# TYPE liteio_panics_total counter"),
            "{text}"
        );
        match liteio_tests::promtool::check_metrics(&text) {
            Ok(said) => assert_eq!(said, "", "promtool check metrics:\n{said}\n{text}"),
            Err(why) => {
                println!("SKIP promtool_has_nothing_to_say_about_the_agents_metrics: {why}")
            }
        }
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}
