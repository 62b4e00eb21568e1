//! T0: `kubectl liteio top`'s rates and tables from two recorded scrapes of a real
//! disk-agent (tests/fixtures/agent-metrics-{1,2}.txt: the SPDK engine of `liteio-local`
//! under `nvmf-check`'s 4 KiB random I/O, 50 % reads, its /metrics read twice), taken here
//! as 1.0 s apart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use liteio_api::size::format_bytes;
use liteio_cli::top::{self, AgentReading, text};

const FIRST: &str = include_str!("fixtures/agent-metrics-1.txt");
const SECOND: &str = include_str!("fixtures/agent-metrics-2.txt");
const URL: &str = "http://127.0.0.1:9109/metrics";

/// The value of the sample `name` (with every label of `labels`) in `text`.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text::parse(text)
        .unwrap()
        .into_iter()
        .find(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == *v))
        .unwrap_or_else(|| panic!("no {name} {labels:?}"))
        .value
}

fn reading(text: &str, at: f64) -> AgentReading {
    AgentReading::new(URL, at, &text::parse(text).unwrap())
}

#[test]
fn rates_between_two_recorded_scrapes() {
    let vol = [("volume", "pvc-demo")];
    let d = |name: &str| value(SECOND, name, &vol) - value(FIRST, name, &vol);
    let (reads, writes) = (
        d("liteio_volume_reads_completed_total"),
        d("liteio_volume_writes_completed_total"),
    );
    let bytes = d("liteio_volume_read_bytes_total") + d("liteio_volume_written_bytes_total");
    let secs =
        d("liteio_volume_read_time_seconds_total") + d("liteio_volume_write_time_seconds_total");
    assert!(reads > 1000.0 && writes > 1000.0, "{reads} {writes}");

    let f = top::frame(
        &[reading(FIRST, 10.0)],
        &[reading(SECOND, 11.0)],
        Vec::new(),
    );
    assert_eq!(f.volumes.len(), 1);
    let v = &f.volumes[0];
    println!(
        "pvc-demo over 1 s: {:.0} reads/s, {:.0} writes/s, {:.1} MiB/s, mean latency {:.0} µs",
        v.read_iops.unwrap(),
        v.write_iops.unwrap(),
        v.bytes_per_second().unwrap() / 1048576.0,
        v.latency_seconds.unwrap() * 1e6
    );
    assert_eq!((v.volume.as_str(), v.node.as_str()), ("pvc-demo", "node-1"));
    assert_eq!(v.read_iops, Some(reads));
    assert_eq!(v.write_iops, Some(writes));
    assert_eq!(v.iops(), Some(reads + writes));
    assert_eq!(v.bytes_per_second(), Some(bytes));
    // 4 KiB requests.
    assert_eq!(bytes, (reads + writes) * 4096.0);
    let lat = v.latency_seconds.unwrap();
    assert!((lat - secs / (reads + writes)).abs() < 1e-12, "{lat}");
    assert_eq!(v.size_bytes, Some(512 << 20));

    // Half a second apart: twice the rate.
    let f2 = top::frame(
        &[reading(FIRST, 10.0)],
        &[reading(SECOND, 10.5)],
        Vec::new(),
    );
    assert_eq!(f2.volumes[0].iops(), Some(2.0 * (reads + writes)));

    let p = &f.pools[0];
    assert_eq!(p.node, "node-1");
    assert_eq!(
        p.free_bytes as f64,
        value(SECOND, "liteio_pool_free_bytes", &[])
    );
    assert_eq!(
        p.capacity_bytes as f64,
        value(SECOND, "liteio_pool_capacity_bytes", &[])
    );
    assert_eq!(p.volumes, 1);
    assert_eq!(p.iops, v.iops());
}

#[test]
fn the_frame_as_a_table() {
    let f = top::frame(
        &[reading(FIRST, 10.0)],
        &[reading(SECOND, 11.0)],
        Vec::new(),
    );
    let text = top::render(&f, "kubectl liteio top", 20);
    println!("{text}");
    let lines: Vec<&str> = text.lines().collect();
    let header = lines.iter().position(|l| l.starts_with("VOLUME")).unwrap();
    let cols: Vec<&str> = lines[header].split_whitespace().collect();
    assert_eq!(
        cols,
        [
            "VOLUME", "NODE", "IOPS", "READ/S", "WRITE/S", "MIB/S", "LATENCY", "SIZE"
        ]
    );
    let row: Vec<&str> = lines[header + 1].split_whitespace().collect();
    let v = &f.volumes[0];
    assert_eq!(row[0], "pvc-demo");
    assert_eq!(row[1], "node-1");
    assert_eq!(row[2], format!("{:.0}", v.iops().unwrap()));
    assert_eq!(
        row[5],
        format!("{:.1}", v.bytes_per_second().unwrap() / 1048576.0)
    );
    assert!(row[6].ends_with("µs") || row[6].ends_with("ms"), "{row:?}");
    assert_eq!(row[7..].join(" "), "512.0 MiB");

    let pools = lines.iter().position(|l| l.starts_with("POOL")).unwrap();
    let cols: Vec<&str> = lines[pools].split_whitespace().collect();
    assert_eq!(
        cols,
        ["POOL", "TOTAL", "FREE", "USED", "VOLUMES", "IOPS", "MIB/S"]
    );
    let free = format_bytes(value(SECOND, "liteio_pool_free_bytes", &[]) as u64);
    let row = lines[pools + 1];
    assert!(row.starts_with("node-1"), "{row}");
    assert!(row.contains(&free), "{row} lacks {free}");
    assert!(row.contains(&format!("{:.0}", v.iops().unwrap())), "{row}");

    // The first scrape alone: the same rows, without rates.
    let f = top::frame(&[], &[reading(FIRST, 10.0)], Vec::new());
    let text = top::render(&f, "t", 20);
    let row = text.lines().find(|l| l.starts_with("pvc-demo")).unwrap();
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        [
            "pvc-demo", "node-1", "-", "-", "-", "-", "-", "512.0", "MiB"
        ]
    );
}

#[test]
fn volumes_are_sorted_by_iops() {
    // A second agent: the same recording for another node and volume at a third of the pace.
    let other = |t: &str, scale: f64| -> String {
        t.lines()
            .map(|l| {
                let l = l
                    .replace("node-1", "node-2")
                    .replace("pvc-demo", "pvc-quiet");
                match l.rsplit_once(' ') {
                    Some((series, v)) if !l.starts_with('#') && series.contains("_total") => {
                        format!("{series} {}", v.parse::<f64>().unwrap() * scale)
                    }
                    _ => l,
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let b = "http://127.0.0.2:9109/metrics";
    let prev = [
        reading(FIRST, 0.0),
        AgentReading::new(b, 0.0, &text::parse(&other(FIRST, 1.0 / 3.0)).unwrap()),
    ];
    let cur = [
        AgentReading::new(b, 1.0, &text::parse(&other(SECOND, 1.0 / 3.0)).unwrap()),
        reading(SECOND, 1.0),
    ];
    let f = top::frame(&prev, &cur, Vec::new());
    let names: Vec<&str> = f.volumes.iter().map(|v| v.volume.as_str()).collect();
    assert_eq!(names, ["pvc-demo", "pvc-quiet"]);
    let pools: Vec<&str> = f.pools.iter().map(|p| p.node.as_str()).collect();
    assert_eq!(pools, ["node-1", "node-2"]);
    let (busy, quiet) = (f.volumes[0].iops().unwrap(), f.volumes[1].iops().unwrap());
    assert!((busy / quiet - 3.0).abs() < 1e-6, "{busy} {quiet}");
}
