//! Unit tests of the registry, the scrape and the rendering.

#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use crate::engine::blkstat::BlockStat;
use crate::engine::{BdevIo, VolumeIo};
use liteio_api::AntstorVolumeSpec;

fn block(dev: &str, read_ios: u64, write_sectors: u64, in_flight: u64) -> VolumeIo {
    VolumeIo::Block {
        dev: dev.into(),
        stat: BlockStat {
            read_ios,
            read_ticks_ms: 1500,
            write_ios: write_sectors / 8,
            write_sectors,
            in_flight,
            time_in_queue_ms: 7,
            ..BlockStat::default()
        },
    }
}

/// An AntstorVolume `name` with `uuid`, made for PVC `app/data`.
fn vol(name: &str, uuid: &str) -> AntstorVolume {
    let mut v = AntstorVolume::new(
        name,
        AntstorVolumeSpec {
            uuid: uuid.into(),
            ..Default::default()
        },
    );
    v.labels_mut()
        .insert(labels::PVC_NAMESPACE.into(), "app".into());
    v.labels_mut()
        .insert(labels::PVC_NAME.into(), "data".into());
    v.labels_mut().insert(labels::PV_NAME.into(), name.into());
    v
}

/// Sample lines of `text` that start with `name{`.
fn samples<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .collect()
}

/// The value of the sample `name` whose labels are exactly `labels` (any order).
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    want.sort();
    samples(text, name).into_iter().find_map(|l| {
        let (head, v) = l.rsplit_once(' ')?;
        let inner = head
            .strip_prefix(name)?
            .strip_prefix('{')?
            .strip_suffix('}')?;
        let mut got: Vec<String> = inner.split(',').map(str::to_string).collect();
        got.sort();
        if got == want { v.parse().ok() } else { None }
    })
}

/// Every family name of the exposition (its `# TYPE` lines).
fn family_names(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
        .collect()
}

#[test]
fn block_counters_in_base_units_labelled_by_volume_uuid_and_dev() {
    let m = Metrics::new("node-1").unwrap();
    m.set_volume(&vol("pvc-a", "u-a"), "pvc-a", 1 << 20);
    m.set_volume(&vol("pvc-b", "u-b"), "eng-b", 1 << 20);
    let scrape = Scrape {
        volumes: vec![
            ("pvc-a".into(), block("loop3", 12, 4096, 1)),
            ("eng-b".into(), block("dm-2", 5, 0, 0)),
            // An engine volume no AntstorVolume maps to is not reported.
            ("stray".into(), block("loop9", 1, 1, 0)),
        ],
        ..Scrape::default()
    };
    let text = m.render_with(&scrape, SystemTime::now());
    let a = [
        ("node", "node-1"),
        ("volume", "pvc-a"),
        ("uuid", "u-a"),
        ("dev", "loop3"),
    ];
    let b = [
        ("node", "node-1"),
        ("volume", "pvc-b"),
        ("uuid", "u-b"),
        ("dev", "dm-2"),
    ];
    let v = |name, l: &[(&str, &str)]| value(&text, name, l);
    assert_eq!(
        v("liteio_volume_reads_completed_total", &a),
        Some(12.0),
        "{text}"
    );
    assert_eq!(v("liteio_volume_reads_completed_total", &b), Some(5.0));
    assert!(text.contains("# TYPE liteio_volume_written_bytes_total counter"));
    // Sectors become bytes, milliseconds seconds.
    assert_eq!(
        v("liteio_volume_written_bytes_total", &a),
        Some(4096.0 * 512.0)
    );
    assert_eq!(v("liteio_volume_read_time_seconds_total", &a), Some(1.5));
    assert_eq!(v("liteio_volume_writes_completed_total", &a), Some(512.0));
    assert!(text.contains("# TYPE liteio_volume_io_now gauge"));
    assert_eq!(v("liteio_volume_io_now", &a), Some(1.0));
    assert_eq!(
        v("liteio_volume_io_time_weighted_seconds_total", &a),
        Some(0.007)
    );
    for name in [
        "liteio_volume_reads_merged_total",
        "liteio_volume_read_bytes_total",
        "liteio_volume_writes_merged_total",
        "liteio_volume_write_time_seconds_total",
        "liteio_volume_discards_completed_total",
        "liteio_volume_discards_merged_total",
        "liteio_volume_discarded_bytes_total",
        "liteio_volume_discard_time_seconds_total",
        "liteio_volume_io_time_seconds_total",
    ] {
        assert_eq!(samples(&text, name).len(), 2, "{name}: {text}");
    }
    assert!(!text.contains("loop9"));
    assert!(!text.contains("lvol="), "no lvol, no lvol series");
    // LiteIO's names only when asked for.
    assert!(!text.contains("blk_"), "{text}");
}

#[test]
fn every_family_follows_the_naming_conventions() {
    // What `promtool check metrics` asks of names (the T1 tests run promtool itself on
    // a live agent): counters end in `_total`, nothing else does, base units only.
    let m = Metrics::new("n").unwrap();
    m.set_volume(&vol("pvc-a", "u-a"), "pvc-a", 1);
    m.set_volume(&vol("pvc-s", "u-s"), "pvc-s", 1);
    m.set_volume_qos(
        "pvc-s",
        "u-s",
        "pvc-s",
        liteio_api::qos::VolumeQos {
            iops: 10,
            mbps: 1,
            ..Default::default()
        },
    );
    m.auth_refused("keys_forbidden");
    m.reconcile_error("antstorvolume", "api");
    m.set_orphans("volume", 1);
    let scrape = Scrape {
        volumes: vec![
            ("pvc-a".into(), block("loop3", 1, 8, 0)),
            (
                "pvc-s".into(),
                VolumeIo::Lvol {
                    lvol: "lvs/pvc-s".into(),
                    stat: BdevIo::default(),
                },
            ),
        ],
        spdk_threads: vec![SpdkThreadTime::default()],
        reactor_cpu: vec![("reactor_0".into(), 1.0)],
        spdk_faults: Some(SpdkFaults::default()),
    };
    let text = m.render_with(&scrape, SystemTime::now());
    let names = family_names(&text);
    assert!(names.len() > 30, "{text}");
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut f = line.split(' ').skip(2);
        let (name, ty) = (f.next().unwrap(), f.next().unwrap());
        assert!(name.starts_with("liteio_"), "{name}: not LiteIO's prefix");
        assert_eq!(
            ty == "counter",
            name.ends_with("_total"),
            "{name} is a {ty}"
        );
        for unit in ["milli", "micro", "nano", "msec", "sectors", "_ms", "_us"] {
            assert!(!name.contains(unit), "{name}: not a base unit");
        }
    }
    // One family per name, even where kernel devices and lvols both report.
    let mut sorted = names.clone();
    sorted.dedup();
    assert_eq!(sorted, names, "a family rendered twice");
    assert_eq!(
        samples(&text, "liteio_volume_reads_completed_total").len(),
        2
    );
}

#[test]
fn liteio_names_are_served_beside_when_asked_for() {
    let m = Metrics::with_liteio_names("node-1", true).unwrap();
    m.set_volume(&vol("pvc-a", "u-a"), "pvc-a", 1 << 20);
    m.set_volume(&vol("pvc-s", "u-s"), "pvc-s", 1 << 20);
    let scrape = Scrape {
        volumes: vec![
            ("pvc-a".into(), block("loop3", 12, 4096, 1)),
            (
                "pvc-s".into(),
                VolumeIo::Lvol {
                    lvol: "lvs0/pvc-s".into(),
                    stat: BdevIo {
                        read_ops: 3,
                        read_latency_us: 90,
                        ..Default::default()
                    },
                },
            ),
        ],
        ..Scrape::default()
    };
    let text = m.render_with(&scrape, SystemTime::now());
    // LiteIO's units and labels (its `pvc` is `<PVC namespace>/<PV name>`).
    let a = [
        ("node", "node-1"),
        ("volume", "pvc-a"),
        ("uuid", "u-a"),
        ("dev", "loop3"),
        ("pvc", "app/pvc-a"),
    ];
    assert_eq!(value(&text, "blk_read_req", &a), Some(12.0), "{text}");
    assert_eq!(value(&text, "blk_write_sectors", &a), Some(4096.0));
    assert_eq!(value(&text, "blk_msec_read", &a), Some(1500.0));
    assert!(text.contains("# TYPE blk_io_inflight gauge"));
    let s = [
        ("node", "node-1"),
        ("volume", "pvc-s"),
        ("uuid", "u-s"),
        ("lvol", "lvs0/pvc-s"),
        ("pvc", "app/pvc-s"),
    ];
    assert_eq!(value(&text, "spdk_lvol_read_reqs_total", &s), Some(3.0));
    assert_eq!(
        value(&text, "spdk_lvol_read_lat_microseconds", &s),
        Some(90.0)
    );
    // Every LiteIO name of a kind that reports is there, once.
    for name in families::liteio_names() {
        assert_eq!(samples(&text, name).len(), 1, "{name}: {text}");
    }
    // And the Prometheus names beside them.
    let sp = [
        ("node", "node-1"),
        ("volume", "pvc-s"),
        ("uuid", "u-s"),
        ("lvol", "lvs0/pvc-s"),
    ];
    assert_eq!(
        value(&text, "liteio_volume_read_time_seconds_total", &sp),
        Some(0.00009)
    );
    assert_eq!(
        value(&text, "liteio_volume_reads_completed_total", &sp),
        Some(3.0)
    );
}

#[test]
fn removed_volumes_disappear_from_the_next_scrape() {
    let m = Metrics::with_liteio_names("n", true).unwrap();
    m.set_volume(&vol("pvc-a", "u-a"), "pvc-a", 1);
    let scrape = Scrape {
        volumes: vec![("pvc-a".into(), block("loop0", 1, 8, 0))],
        ..Scrape::default()
    };
    let text = m.render_with(&scrape, SystemTime::now());
    assert!(text.contains("liteio_volume_reads_completed_total{"));
    assert!(text.contains("blk_read_req{"));
    m.remove_volume("pvc-a", "u-a");
    let text = m.render_with(&scrape, SystemTime::now());
    assert!(!text.contains("pvc-a"), "{text}");
    assert!(!text.contains("reads_completed"), "{text}");
    assert!(!text.contains("blk_read_req"), "{text}");
}

#[test]
fn lvol_counters_in_base_units() {
    let m = Metrics::new("n").unwrap();
    m.set_volume(&vol("pvc-s", "u-s"), "pvc-s", 1);
    let stat = BdevIo {
        read_ops: 3,
        bytes_read: 12288,
        read_latency_us: 90,
        write_ops: 4,
        bytes_written: 16384,
        write_latency_us: 120,
        unmap_ops: 1,
        bytes_unmapped: 4096,
        unmap_latency_us: 5,
    };
    let scrape = Scrape {
        volumes: vec![(
            "pvc-s".into(),
            VolumeIo::Lvol {
                lvol: "lvs0/pvc-s".into(),
                stat,
            },
        )],
        ..Scrape::default()
    };
    let text = m.render_with(&scrape, SystemTime::now());
    let l = [
        ("node", "n"),
        ("volume", "pvc-s"),
        ("uuid", "u-s"),
        ("lvol", "lvs0/pvc-s"),
    ];
    for (name, v) in [
        ("liteio_volume_reads_completed_total", 3.0),
        ("liteio_volume_read_bytes_total", 12288.0),
        ("liteio_volume_read_time_seconds_total", 0.00009),
        ("liteio_volume_writes_completed_total", 4.0),
        ("liteio_volume_written_bytes_total", 16384.0),
        ("liteio_volume_write_time_seconds_total", 0.00012),
        ("liteio_volume_discards_completed_total", 1.0),
        ("liteio_volume_discarded_bytes_total", 4096.0),
        ("liteio_volume_discard_time_seconds_total", 0.000005),
    ] {
        assert_eq!(value(&text, name, &l), Some(v), "{name}: {text}");
        assert!(text.contains(&format!("# TYPE {name} counter")), "{name}");
    }
    // What only kernel devices count is not made up for lvols.
    assert!(!text.contains("merged"), "{text}");
    assert!(!text.contains("liteio_volume_io_"), "{text}");
    assert!(!text.contains("spdk_lvol_"), "{text}");
}

#[test]
fn reactor_and_thread_times() {
    let m = Metrics::new("n").unwrap();
    let scrape = Scrape {
        spdk_threads: vec![SpdkThreadTime {
            thread: "app_thread".into(),
            busy_seconds: 0.5,
            idle_seconds: 2.25,
        }],
        reactor_cpu: vec![("reactor_0".into(), 1.5)],
        spdk_faults: Some(SpdkFaults {
            request_timeouts: 3,
            caught_panics: 1,
            stuck_requests: 2,
            oldest_stuck_seconds: 41.5,
        }),
        ..Scrape::default()
    };
    let text = m.render_with(&scrape, SystemTime::now());
    let n = [("node", "n")];
    assert_eq!(
        value(&text, "liteio_spdk_request_timeouts_total", &n),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "liteio_spdk_caught_panics_total", &n),
        Some(1.0)
    );
    assert_eq!(value(&text, "liteio_spdk_stuck_requests", &n), Some(2.0));
    assert_eq!(
        value(&text, "liteio_spdk_oldest_stuck_request_seconds", &n),
        Some(41.5)
    );
    let th = [("node", "n"), ("thread", "app_thread")];
    assert_eq!(
        value(&text, "liteio_spdk_thread_busy_seconds_total", &th),
        Some(0.5)
    );
    assert_eq!(
        value(&text, "liteio_spdk_thread_idle_seconds_total", &th),
        Some(2.25)
    );
    let r = [("node", "n"), ("reactor", "reactor_0")];
    assert_eq!(
        value(&text, "liteio_spdk_reactor_cpu_seconds_total", &r),
        Some(1.5),
        "{text}"
    );
    assert!(
        !m.render().contains("liteio_spdk_"),
        "no SPDK, no SPDK families"
    );
}

#[test]
fn auth_refusals_and_panics_are_counted() {
    let m = Metrics::new("n").unwrap();
    m.auth_refused("keys_forbidden");
    m.auth_refused("keys_forbidden");
    let text = m.render();
    assert_eq!(
        value(
            &text,
            "liteio_auth_refusals_total",
            &[("node", "n"), ("reason", "keys_forbidden")]
        ),
        Some(2.0),
        "{text}"
    );
    // The process-wide count, whatever it is in this test binary.
    let panics = value(&text, "liteio_panics_total", &[("node", "n")]).unwrap();
    assert_eq!(panics, liteio_node::panics::count() as f64, "{text}");
}

#[test]
fn liteio_pvc_is_the_pvc_namespace_and_the_pv_name() {
    assert_eq!(liteio_pvc(&vol("pvc-1", "u")), "app/pvc-1");
    // Without the labels: the volume's own name (which is the PV's).
    let bare = AntstorVolume::new("pvc-2", AntstorVolumeSpec::default());
    assert_eq!(liteio_pvc(&bare), "/pvc-2");
}

#[test]
fn heartbeat_age_from_the_last_success_or_from_start() {
    let m = Metrics::new("n").unwrap();
    let later = m.started + Duration::from_secs(7);
    assert!((m.heartbeat_age(later) - 7.0).abs() < 1e-6);
    m.heartbeat_ok(1_000_000.0);
    let now = UNIX_EPOCH + Duration::from_secs_f64(1_000_002.5);
    assert!((m.heartbeat_age(now) - 2.5).abs() < 1e-6);
    let text = m.render_with(&Scrape::default(), now);
    assert!(
        text.contains("liteio_heartbeat_age_seconds{node=\"n\"} 2.5\n"),
        "{text}"
    );
    // A clock that went back shows 0, not a negative age.
    assert_eq!(m.heartbeat_age(UNIX_EPOCH), 0.0);
}

#[derive(Debug)]
struct Fixed(Result<VolumeIo, &'static str>);

impl ScrapeSource for Fixed {
    fn name(&self) -> &'static str {
        "fixed"
    }
    fn scrape(&self, volumes: &[String], out: &mut Scrape) -> Result<(), SourceError> {
        let io = self.0.clone()?;
        out.volumes
            .extend(volumes.iter().map(|v| (v.clone(), io.clone())));
        Ok(())
    }
}

#[tokio::test]
async fn sources_are_asked_at_scrape_time_and_failures_counted() {
    tokio::time::timeout(Duration::from_secs(10), async {
        let m = Arc::new(Metrics::new("n").unwrap());
        m.set_volume(&vol("pvc-a", "u"), "e-a", 1);
        m.add_source(Arc::new(Fixed(Ok(block("loop1", 4, 8, 0)))));
        m.add_source(Arc::new(Fixed(Err("boom"))));
        let text = m.scrape().await;
        let l = [
            ("node", "n"),
            ("volume", "pvc-a"),
            ("uuid", "u"),
            ("dev", "loop1"),
        ];
        assert_eq!(
            value(&text, "liteio_volume_reads_completed_total", &l),
            Some(4.0),
            "{text}"
        );
        let e = [("node", "n"), ("source", "fixed")];
        assert_eq!(
            value(&text, "liteio_metrics_collect_errors_total", &e),
            Some(1.0),
            "{text}"
        );
        assert!(
            !m.collecting.load(Ordering::Acquire),
            "in-flight flag cleared"
        );
    })
    .await
    .unwrap();
}
