//! Network namespaces for multi-node local runs, and the record that lets a later run undo
//! what a crashed one left.
//!
//! Layout of one run (`i` is the run's index, 1..=250, chosen so that no other run on this
//! machine uses it):
//!
//! ```text
//! root namespace:  bridge lio<i>br  127.10.<i>.1/24
//!                    ├── veth lio<i>n1h ── (netns lio<i>n1) lio<i>n1p  127.10.<i>.11/24
//!                    ├── veth lio<i>n2h ── (netns lio<i>n2) lio<i>n2p  127.10.<i>.12/24
//!                    └── …
//! ```
//!
//! Only addresses of 127.0.0.0/8 are used, so nothing can be routed off the machine; every
//! interface that carries them has `route_localnet=1` (the kernel drops 127/8 on other
//! interfaces otherwise). The bridge's index is claimed by creating the bridge: the name
//! `lio<i>br` exists at most once on the machine, so parallel runs cannot pick the same
//! subnet.
//!
//! Processes enter a node's namespace with `nsenter --net=/run/netns/<ns>` rather than
//! `ip netns exec`: the latter also gives each process a private mount namespace, so the
//! mounts a node's CSI plugin makes would be invisible to the host (and to cleanup).
//!
//! Everything created is written to `<dir>/cluster-state.json` right after it exists, so
//! [`cleanup`] removes it also when the run that made it was killed.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use liteio_node::cmd::{CommandRunner, SystemRunner, argv};
use serde::{Deserialize, Serialize};

use crate::LocalError;

/// Most nodes of one run: each runs a disk-agent and a CSI plugin.
pub const MAX_NODES: usize = 16;

/// Name of the record in the run directory.
pub const STATE_FILE: &str = "cluster-state.json";

/// A process a run started, identified by pid and start time (a pid alone may be reused by
/// the time a later run cleans up).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcessRecord {
    /// Process id.
    pub pid: u32,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start: u64,
    /// What it is, for messages.
    pub what: String,
}

/// What a run created on the host, in creation order.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Record {
    /// Links in the root namespace (the bridge, the host ends of the veth pairs).
    pub links: Vec<String>,
    /// Network namespaces.
    pub namespaces: Vec<String>,
    /// Processes started by the run.
    pub processes: Vec<ProcessRecord>,
}

/// The record of one run, written through to `<dir>/cluster-state.json` on every change.
#[derive(Debug)]
pub struct Ledger {
    path: PathBuf,
    record: Record,
}

impl Ledger {
    /// Starts an empty record in `dir` (replacing an old one: call [`cleanup`] first).
    pub fn create(dir: &Path) -> Result<Self, LocalError> {
        let me = Self {
            path: dir.join(STATE_FILE),
            record: Record::default(),
        };
        me.save()?;
        Ok(me)
    }

    /// What is recorded.
    pub fn record(&self) -> &Record {
        &self.record
    }

    fn save(&self) -> Result<(), LocalError> {
        let body = serde_json::to_string_pretty(&self.record)
            .map_err(|e| LocalError::Config(format!("cluster state: {e}")))?;
        let tmp = self.path.with_extension("json.tmp");
        std::fs::write(&tmp, body)
            .and_then(|()| std::fs::rename(&tmp, &self.path))
            .map_err(|source| LocalError::Io {
                path: self.path.clone(),
                source,
            })
    }

    /// Records a link that now exists.
    pub fn add_link(&mut self, name: &str) -> Result<(), LocalError> {
        self.record.links.push(name.into());
        self.save()
    }

    /// Records a namespace that now exists.
    pub fn add_namespace(&mut self, name: &str) -> Result<(), LocalError> {
        self.record.namespaces.push(name.into());
        self.save()
    }

    /// Records a started process.
    pub fn add_process(&mut self, pid: u32, what: &str) -> Result<(), LocalError> {
        let start = process_start(pid).unwrap_or(0);
        self.record.processes.push(ProcessRecord {
            pid,
            start,
            what: what.into(),
        });
        self.save()
    }

    /// Forgets a process that has exited.
    pub fn remove_process(&mut self, pid: u32) -> Result<(), LocalError> {
        self.record.processes.retain(|p| p.pid != pid);
        self.save()
    }
}

/// Start time of `pid` in clock ticks since boot, when it runs.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: count after the last ')'.
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(19)?.parse().ok()
}

/// True while the recorded process runs (same pid and start time).
pub fn is_running(p: &ProcessRecord) -> bool {
    process_start(p.pid).is_some_and(|s| p.start == 0 || s == p.start)
        && !std::fs::read_to_string(format!("/proc/{}/stat", p.pid)).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        })
}

fn runner() -> SystemRunner {
    SystemRunner::with_timeout(Duration::from_secs(30))
}

/// Runs `ip`/`sysctl`/`nsenter`; an error names the command and what it printed.
fn sh(args: &[&str]) -> Result<(), LocalError> {
    let out = runner()
        .run(&argv(args))
        .map_err(|e| LocalError::Network(format!("cannot run {}: {e}", args.join(" "))))?;
    if out.success() {
        Ok(())
    } else {
        Err(LocalError::Network(format!(
            "{} failed ({}): {}",
            args.join(" "),
            out.status(),
            out.stderr.trim()
        )))
    }
}

/// One node's place in the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetNode {
    /// Network namespace.
    pub netns: String,
    /// The veth end on the bridge (root namespace); down = the node is cut off.
    pub host_link: String,
    /// The veth end inside the namespace.
    pub peer_link: String,
    /// The node's address.
    pub address: Ipv4Addr,
}

/// The run's bridge and nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    /// The run's index: its subnet is 127.10.<index>.0/24 and its names start `lio<index>`.
    pub index: u8,
    /// The bridge in the root namespace.
    pub bridge: String,
    /// The nodes, node 1 first.
    pub nodes: Vec<NetNode>,
}

/// First and last index a run may take.
const INDEXES: std::ops::RangeInclusive<u8> = 1..=250;

/// The names and addresses of run `index` with `nodes` nodes (nothing is created).
pub fn plan(index: u8, nodes: usize) -> Network {
    let p = format!("lio{index}");
    Network {
        index,
        bridge: format!("{p}br"),
        nodes: (1..=nodes)
            .map(|k| NetNode {
                netns: format!("{p}n{k}"),
                host_link: format!("{p}n{k}h"),
                peer_link: format!("{p}n{k}p"),
                address: Ipv4Addr::new(
                    127,
                    10,
                    index,
                    u8::try_from(k).map_or(u8::MAX, |k| k.saturating_add(10)),
                ),
            })
            .collect(),
    }
}

/// Checks a node count: 1..=[`MAX_NODES`].
pub fn check_nodes(nodes: usize) -> Result<(), LocalError> {
    if nodes == 0 || nodes > MAX_NODES {
        return Err(LocalError::Network(format!(
            "--nodes {nodes}: a run has 1 to {MAX_NODES} nodes"
        )));
    }
    Ok(())
}

/// Why this host cannot make network namespaces, if it cannot (not root, no `ip`, no
/// `nsenter`, or the kernel refuses): the one line a skipped test prints.
/// Probed once per process (tests in one binary ask in parallel).
pub fn unsupported() -> Option<String> {
    static PROBED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    PROBED.get_or_init(probe).clone()
}

fn probe() -> Option<String> {
    let root = runner()
        .run(&argv(&["id", "-u"]))
        .is_ok_and(|o| o.stdout.trim() == "0");
    if !root {
        return Some("needs root to create network namespaces".into());
    }
    for tool in ["ip", "nsenter", "sysctl"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).exists()));
        if !found {
            return Some(format!("needs `{tool}` on PATH"));
        }
    }
    let probe = format!("liop{}", std::process::id());
    match sh(&["ip", "netns", "add", &probe]) {
        Ok(()) => {
            let _ = sh(&["ip", "netns", "del", &probe]);
            None
        }
        Err(e) => Some(format!("this kernel refuses network namespaces: {e}")),
    }
}

impl Network {
    /// Creates the bridge and `nodes` namespaces joined to it, recording each piece in
    /// `ledger` as soon as it exists. On failure everything this call created is removed
    /// again before the error returns.
    pub fn create(ledger: &mut Ledger, nodes: usize) -> Result<Self, LocalError> {
        check_nodes(nodes)?;
        let (links, namespaces) = (ledger.record.links.len(), ledger.record.namespaces.len());
        let index = claim_bridge(ledger)?;
        let net = plan(index, nodes);
        match net.build(ledger) {
            Ok(()) => Ok(net),
            Err(e) => {
                // Undo this call's links and namespaces (the bridge included).
                let mine = Record {
                    links: ledger
                        .record
                        .links
                        .get(links..)
                        .unwrap_or_default()
                        .to_vec(),
                    namespaces: ledger
                        .record
                        .namespaces
                        .get(namespaces..)
                        .unwrap_or_default()
                        .to_vec(),
                    processes: Vec::new(),
                };
                remove_network(&mine);
                ledger.record.links.retain(|l| !mine.links.contains(l));
                ledger
                    .record
                    .namespaces
                    .retain(|n| !mine.namespaces.contains(n));
                let _ = ledger.save();
                Err(e)
            }
        }
    }

    fn build(&self, ledger: &mut Ledger) -> Result<(), LocalError> {
        let br = self.bridge.as_str();
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", self.bridge_address()),
            "dev",
            br,
        ])?;
        sh(&["ip", "link", "set", br, "up"])?;
        localnet(None, br)?;
        for n in &self.nodes {
            sh(&["ip", "netns", "add", &n.netns])?;
            ledger.add_namespace(&n.netns)?;
            sh(&[
                "ip",
                "link",
                "add",
                &n.host_link,
                "type",
                "veth",
                "peer",
                "name",
                &n.peer_link,
                "netns",
                &n.netns,
            ])?;
            ledger.add_link(&n.host_link)?;
            sh(&["ip", "link", "set", &n.host_link, "master", br])?;
            localnet(None, &n.host_link)?;
            sh(&["ip", "link", "set", &n.host_link, "up"])?;
            let inside = |args: &[&str]| {
                let mut a = vec!["ip", "netns", "exec", n.netns.as_str()];
                a.extend_from_slice(args);
                sh(&a)
            };
            inside(&["ip", "link", "set", "lo", "up"])?;
            inside(&[
                "ip",
                "addr",
                "add",
                &format!("{}/24", n.address),
                "dev",
                &n.peer_link,
            ])?;
            localnet(Some(&n.netns), "all")?;
            localnet(Some(&n.netns), &n.peer_link)?;
            inside(&["ip", "link", "set", &n.peer_link, "up"])?;
        }
        Ok(())
    }

    /// The bridge's address: where the API server and the controller listen.
    pub fn bridge_address(&self) -> Ipv4Addr {
        Ipv4Addr::new(127, 10, self.index, 1)
    }

    /// Node `k` (1-based).
    pub fn node(&self, k: usize) -> Result<&NetNode, LocalError> {
        k.checked_sub(1)
            .and_then(|i| self.nodes.get(i))
            .ok_or_else(|| {
                LocalError::Network(format!(
                    "no node {k}: this run has nodes 1 to {}",
                    self.nodes.len()
                ))
            })
    }

    /// Cuts node `k` off (its veth down: the bridge, the API server and every other node
    /// become unreachable from it) or joins it again.
    pub fn set_link(&self, k: usize, up: bool) -> Result<(), LocalError> {
        let n = self.node(k)?;
        sh(&[
            "ip",
            "link",
            "set",
            &n.host_link,
            if up { "up" } else { "down" },
        ])
    }

    /// The command prefix that runs a program in node `k`'s network namespace (and nothing
    /// else of it: mounts stay the host's).
    pub fn exec_prefix(&self, k: usize) -> Result<Vec<String>, LocalError> {
        let n = self.node(k)?;
        Ok(vec![
            "nsenter".into(),
            format!("--net=/run/netns/{}", n.netns),
            "--".into(),
        ])
    }
}

/// Sets `route_localnet=1` on `dev` (in `netns`, or the root namespace).
fn localnet(netns: Option<&str>, dev: &str) -> Result<(), LocalError> {
    let key = format!("net.ipv4.conf.{dev}.route_localnet=1");
    match netns {
        Some(ns) => sh(&["ip", "netns", "exec", ns, "sysctl", "-qw", &key]),
        None => sh(&["sysctl", "-qw", &key]),
    }
}

/// Finds a free index by creating its bridge (creation fails when another run has it) and
/// records the bridge.
fn claim_bridge(ledger: &mut Ledger) -> Result<u8, LocalError> {
    let n = INDEXES.clone().count();
    // Start at a place that depends on the process, so parallel runs rarely race.
    let start = (std::process::id() as usize + ledger.record.links.len()) % n;
    let mut last = String::new();
    for i in 0..n {
        let Some(index) = INDEXES.clone().nth((start + i) % n) else {
            continue;
        };
        let name = plan(index, 0).bridge;
        match sh(&["ip", "link", "add", &name, "type", "bridge"]) {
            Ok(()) => {
                ledger.add_link(&name)?;
                return Ok(index);
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(LocalError::Network(format!(
        "no free bridge lio1br..lio250br; the last attempt said: {last}"
    )))
}

/// Processes running in network namespace `ns`.
fn pids_in(ns: &str) -> Vec<u32> {
    runner()
        .run(&argv(&["ip", "netns", "pids", ns]))
        .map(|o| {
            o.stdout
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn kill(pid: u32) -> bool {
    runner()
        .run(&argv(&["kill", "-KILL", &pid.to_string()]))
        .is_ok_and(|o| o.success())
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

/// Deletes the links and namespaces of `r` (processes in them are killed first); returns
/// what it did.
fn remove_network(r: &Record) -> Vec<String> {
    let mut done = Vec::new();
    for ns in &r.namespaces {
        for pid in pids_in(ns) {
            if kill(pid) {
                done.push(format!("killed pid {pid} in namespace {ns}"));
            }
        }
    }
    // Host ends first (each takes its peer with it), the bridge last.
    for l in r.links.iter().rev() {
        if link_exists(l) && sh(&["ip", "link", "del", l]).is_ok() {
            done.push(format!("deleted link {l}"));
        }
    }
    for ns in &r.namespaces {
        if netns_exists(ns) && sh(&["ip", "netns", "del", ns]).is_ok() {
            done.push(format!("deleted namespace {ns}"));
        }
    }
    done
}

/// Undoes what the run in `dir` recorded (also a run that was killed): kills its processes
/// that still run (same pid and start time), unmounts and detaches what is below `dir`
/// ([`crate::release_host_resources`]), deletes its links and namespaces, then the record.
/// Returns what it undid; an absent record means nothing to undo but the mounts.
pub fn cleanup(dir: &Path) -> Vec<String> {
    let path = dir.join(STATE_FILE);
    let record: Record = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    let mut done = Vec::new();
    let mut killed = Vec::new();
    for p in &record.processes {
        if is_running(p) && kill(p.pid) {
            done.push(format!("killed {} (pid {})", p.what, p.pid));
            killed.push(p.clone());
        }
    }
    // Mounts and loop devices go before the processes' namespaces; wait for the kills first
    // so that nothing re-creates them.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while killed.iter().any(is_running) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    done.extend(remove_network(&Record {
        links: record.links.clone(),
        namespaces: record.namespaces.clone(),
        processes: Vec::new(),
    }));
    done.extend(crate::release_host_resources(dir));
    // A deleted namespace's veth goes with the namespace, asynchronously.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while record.links.iter().any(|l| link_exists(l)) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_file(&path);
    done
}

/// What of the run recorded in `dir` is still on the host (for tests and `--check`).
pub fn leftovers(record: &Record) -> Vec<String> {
    let mut out = Vec::new();
    out.extend(
        record
            .links
            .iter()
            .filter(|l| link_exists(l))
            .map(|l| format!("link {l}")),
    );
    out.extend(
        record
            .namespaces
            .iter()
            .filter(|n| netns_exists(n))
            .map(|n| format!("namespace {n}")),
    );
    out.extend(
        record
            .processes
            .iter()
            .filter(|p| is_running(p))
            .map(|p| format!("{} (pid {})", p.what, p.pid)),
    );
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_ifnamsiz_and_addresses_are_loopback() {
        let net = plan(250, MAX_NODES);
        for n in &net.nodes {
            for name in [&n.host_link, &n.peer_link, &net.bridge] {
                assert!(name.len() <= 15, "{name} is longer than IFNAMSIZ-1");
            }
            assert!(n.address.is_loopback(), "{}", n.address);
        }
        assert!(net.bridge_address().is_loopback());
        assert_eq!(net.nodes[0].address, Ipv4Addr::new(127, 10, 250, 11));
        assert_eq!(net.nodes[15].netns, "lio250n16");
    }

    #[test]
    fn node_counts_outside_1_to_max_are_refused() {
        assert!(check_nodes(0).unwrap_err().to_string().contains("1 to 16"));
        assert!(check_nodes(MAX_NODES + 1).is_err());
        assert!(check_nodes(1).is_ok() && check_nodes(MAX_NODES).is_ok());
        assert!(plan(3, 2).node(3).is_err() && plan(3, 2).node(0).is_err());
    }

    #[test]
    fn the_record_is_written_through() {
        let d = tempfile::tempdir().unwrap();
        let mut l = Ledger::create(d.path()).unwrap();
        l.add_link("lio9br").unwrap();
        l.add_namespace("lio9n1").unwrap();
        l.add_process(std::process::id(), "me").unwrap();
        let back: Record =
            serde_json::from_str(&std::fs::read_to_string(d.path().join(STATE_FILE)).unwrap())
                .unwrap();
        assert_eq!(&back, l.record());
        assert!(is_running(&back.processes[0]));
        l.remove_process(std::process::id()).unwrap();
        assert!(l.record().processes.is_empty());
    }
}
