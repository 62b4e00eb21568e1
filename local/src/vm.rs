//! MicroVMs with Debian's stock kernels, for what this machine's kernel cannot do (NVMe/TCP
//! host, device-mapper, LVM): the tier-4 tests boot one per test file and run their cases in
//! it.
//!
//! **How.** `virtme-ng` (`vng`, from PyPI) starts QEMU with the host's root file system
//! read-only over 9p, writable overlays for `/etc`, `/var`, `/usr`, … and a `/tmp` of the
//! guest's own, so the guest runs this checkout's binaries (and the test binary itself) at
//! the same paths without an image to build. virtme-ng rather than an own init: it already
//! mounts the overlays, `/proc`, `/sys`, `/dev` and loads modules from the host's
//! `/lib/modules`, which is all a test guest needs. Under TCG (no usable KVM here) a boot
//! takes 25–40 s on 2 cores.
//!
//! **Commands.** The guest's one command is a loop reading scripts from a virtio-serial port
//! (`liteio`, a Unix socket on the host): each line is a base64 script for `bash`, answered by
//! one line `<exit status> <base64 output>` (stdout and stderr together). A serial channel,
//! not the network: tests cut and break the guest's network, the channel stays.
//!
//! **Network.** With [`VmNet`] the guest gets a tap on a bridge of the host (the one-machine
//! cluster's) and its own address in 127.0.0.0/8, with `route_localnet=1` inside: never slirp,
//! never a private range.
//!
//! QEMU's pid is returned by [`Vm::pid`] for the run's ledger ([`crate::netns::Ledger`]), so
//! a crashed run's VM is stopped by the next run's cleanup; a dropped [`Vm`] kills it.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::process::{Child, Command};

/// A guest kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Debian 12's backports kernel (6.12, package `linux-image-amd64` from
    /// `bookworm-backports`): NVMe in-band authentication and NVMe/TCP TLS. The default.
    Backports,
    /// Debian 12's stock kernel (6.1, package `linux-image-amd64`): NVMe/TCP without
    /// in-band authentication (built without `CONFIG_NVME_AUTH`).
    Stock,
    /// A `vmlinuz` of one's own (its modules must be in the host's `/lib/modules`).
    Path(PathBuf),
}

impl Kernel {
    /// The `vmlinuz` to boot, `None` when the package is not installed.
    pub fn image(&self) -> Option<PathBuf> {
        let series = match self {
            Self::Path(p) => return p.is_file().then(|| p.clone()),
            Self::Backports => "6.12.",
            Self::Stock => "6.1.",
        };
        let mut found: Vec<PathBuf> = std::fs::read_dir("/boot")
            .ok()?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.strip_prefix("vmlinuz-"))
                    .is_some_and(|v| v.starts_with(series) && v.ends_with("-amd64"))
            })
            .collect();
        found.sort();
        found.pop()
    }

    /// The package that provides it, for messages.
    pub fn package(&self) -> &'static str {
        match self {
            Self::Backports => "linux-image-amd64 from bookworm-backports (6.12)",
            Self::Stock => "linux-image-amd64 from bookworm (6.1)",
            Self::Path(_) => "the given kernel image",
        }
    }
}

/// The guest's place on a host bridge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmNet {
    /// The host bridge the tap joins (e.g. a cluster's `lio<i>br`).
    pub bridge: String,
    /// The tap's name (at most 15 bytes), created here and removed with the VM.
    pub tap: String,
    /// The guest's address, in 127.0.0.0/8.
    pub address: Ipv4Addr,
    /// Its prefix length.
    pub prefix: u8,
}

/// What to boot.
#[derive(Clone, Debug)]
pub struct VmOptions {
    /// The guest's host name (also QEMU's `-name`).
    pub name: String,
    /// The kernel.
    pub kernel: Kernel,
    /// Virtual CPUs.
    pub cpus: u32,
    /// Memory in MiB (the guest's `/tmp` lives in it).
    pub memory_mib: u32,
    /// Where the control socket, the guest script and the console log go (a host directory).
    pub dir: PathBuf,
    /// Network, `None` = loopback only.
    pub net: Option<VmNet>,
    /// Longest boot.
    pub boot_timeout: Duration,
}

impl VmOptions {
    /// `name` on the default kernel, 2 CPUs, 2 GiB, files in `dir`, no network.
    pub fn new(name: &str, dir: &Path) -> Self {
        Self {
            name: name.into(),
            kernel: Kernel::Backports,
            cpus: 2,
            memory_mib: 2048,
            dir: dir.into(),
            net: None,
            boot_timeout: Duration::from_secs(240),
        }
    }
}

/// Why a VM could not be booted or driven.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// This machine cannot boot one (what is missing is said).
    #[error("cannot boot a VM here: {0}")]
    Unavailable(String),
    /// Booting failed or took too long.
    #[error("VM {name} did not boot: {why}; console log {}", log.display())]
    Boot {
        /// The guest.
        name: String,
        /// What happened.
        why: String,
        /// vng's and the guest's output.
        log: PathBuf,
    },
    /// The control channel failed.
    #[error("VM {name}: {why}")]
    Channel {
        /// The guest.
        name: String,
        /// What happened.
        why: String,
    },
}

/// What a script run in the guest did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestOutput {
    /// Its exit status.
    pub status: i32,
    /// stdout and stderr, interleaved.
    pub output: String,
}

impl GuestOutput {
    /// Exit status 0.
    pub fn success(&self) -> bool {
        self.status == 0
    }
}

/// Why this machine cannot boot a VM with `kernel`, `None` when it can: `vng` and
/// `qemu-system-x86_64` on PATH, the kernel installed, root (taps, loop devices in tests).
pub fn unavailable(kernel: &Kernel) -> Option<String> {
    if !is_root() {
        return Some("not root".into());
    }
    for (bin, from) in [
        ("vng", "virtme-ng from PyPI"),
        ("qemu-system-x86_64", "Debian package qemu-system-x86"),
        ("busybox", "Debian package busybox-static"),
    ] {
        if which(bin).is_none() {
            return Some(format!("no {bin} on PATH ({from})"));
        }
    }
    if kernel.image().is_none() {
        return Some(format!("no kernel: install {}", kernel.package()));
    }
    None
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            == Some("0")
    })
}

/// The first `name` on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// The guest's one command: configure the network when asked, say `ready`, then run each
/// base64 script it reads from the `liteio` port and answer `<status> <base64 output>`.
fn guest_script(net: Option<&VmNet>) -> String {
    // The NIC's name depends on udev (enp0s…); the loopback range's catch-all local route
    // would swallow 127.10.x.y, so only 127.0.0.1 stays local.
    let net = net.map_or_else(String::new, |n| {
        format!(
            "modprobe virtio_net\n\
             dev=\n\
             for i in $(seq 100); do dev=$(ls /sys/class/net | grep -vx lo | head -n 1); [ -n \"$dev\" ] && break; sleep 0.1; done\n\
             [ -n \"$dev\" ] || {{ echo 'no network interface' >&2; exit 1; }}\n\
             sysctl -qw net.ipv4.conf.all.route_localnet=1\n\
             sysctl -qw net.ipv4.conf.$dev.route_localnet=1\n\
             ip link set \"$dev\" up\n\
             ip addr add {addr}/{prefix} dev \"$dev\"\n\
             ip route del local 127.0.0.0/8 dev lo table local\n",
            addr = n.address,
            prefix = n.prefix
        )
    });
    format!(
        "#!/bin/bash\n\
         # LiteIO test guest: runs the scripts the host sends on the virtio port 'liteio'.\n\
         {net}\
         port=\n\
         for d in /sys/class/virtio-ports/*; do\n\
         \x20 [ \"$(cat \"$d/name\" 2>/dev/null)\" = liteio ] && port=/dev/${{d##*/}}\n\
         done\n\
         [ -n \"$port\" ] || {{ echo 'no virtio port liteio' >&2; exit 1; }}\n\
         exec 3<>\"$port\"\n\
         echo ready >&3\n\
         while IFS= read -r line <&3; do\n\
         \x20 out=$(bash -c \"$(printf %s \"$line\" | base64 -d)\" 2>&1 </dev/null)\n\
         \x20 rc=$?\n\
         \x20 printf '%s %s\\n' \"$rc\" \"$(printf %s \"$out\" | base64 -w0)\" >&3\n\
         done\n"
    )
}

fn run_ok(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A booted guest. Dropping it kills QEMU and removes its tap.
#[derive(Debug)]
pub struct Vm {
    name: String,
    child: Child,
    channel: BufReader<UnixStream>,
    log: PathBuf,
    tap: Option<String>,
    booted_in: Duration,
}

impl Vm {
    /// Boots a guest and waits until its command loop answers.
    pub async fn boot(opts: &VmOptions) -> Result<Self, VmError> {
        if let Some(why) = unavailable(&opts.kernel) {
            return Err(VmError::Unavailable(why));
        }
        let kernel = opts.kernel.image().ok_or_else(|| {
            VmError::Unavailable(format!("no kernel: install {}", opts.kernel.package()))
        })?;
        let boot_err = |why: String| VmError::Boot {
            name: opts.name.clone(),
            why,
            log: opts.dir.join(format!("{}.console.log", opts.name)),
        };
        std::fs::create_dir_all(&opts.dir)
            .map_err(|e| boot_err(format!("cannot create {}: {e}", opts.dir.display())))?;
        let sock = opts.dir.join(format!("{}.sock", opts.name));
        let script = opts.dir.join(format!("{}.guest.sh", opts.name));
        let log = opts.dir.join(format!("{}.console.log", opts.name));
        let _ = std::fs::remove_file(&sock);
        std::fs::write(&script, guest_script(opts.net.as_ref()))
            .map_err(|e| boot_err(format!("cannot write {}: {e}", script.display())))?;
        let mut qemu_opts = format!(
            "-chardev socket,id=liteio,path={},server=on,wait=off -device virtio-serial-pci -device virtserialport,chardev=liteio,name=liteio",
            sock.display()
        );
        let mut tap = None;
        if let Some(n) = &opts.net {
            run_ok("ip", &["tuntap", "add", "dev", &n.tap, "mode", "tap"]).map_err(boot_err)?;
            tap = Some(n.tap.clone());
            let joined = run_ok("ip", &["link", "set", &n.tap, "master", &n.bridge])
                .and_then(|()| run_ok("ip", &["link", "set", &n.tap, "up"]))
                .and_then(|()| {
                    std::fs::write(
                        format!("/proc/sys/net/ipv4/conf/{}/route_localnet", n.tap),
                        "1",
                    )
                    .map_err(|e| format!("route_localnet on {}: {e}", n.tap))
                });
            if let Err(e) = joined {
                let _ = run_ok("ip", &["link", "del", &n.tap]);
                return Err(boot_err(e));
            }
            let mac = mac_for(n.address);
            qemu_opts.push_str(&format!(
                " -netdev tap,id=lionet,ifname={},script=no,downscript=no -device virtio-net-pci,netdev=lionet,mac={mac}",
                n.tap
            ));
        }
        let console = std::fs::File::create(&log)
            .map_err(|e| boot_err(format!("cannot create {}: {e}", log.display())))?;
        let console2 = console
            .try_clone()
            .map_err(|e| boot_err(format!("cannot open {}: {e}", log.display())))?;
        let mut cmd = Command::new("vng");
        cmd.arg("--run")
            .arg(&kernel)
            .arg("--disable-kvm")
            .args(["--user", "root", "--name", &opts.name])
            .args(["--cpus", &opts.cpus.to_string()])
            .args(["--memory", &format!("{}M", opts.memory_mib)])
            .arg(format!("--qemu-opts={qemu_opts}"))
            .arg("--exec")
            .arg(format!("bash {}", script.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::from(console))
            .stderr(Stdio::from(console2))
            .kill_on_drop(true);
        // QEMU runs in vng's process group: killing the group stops both.
        cmd.process_group(0);
        let started = Instant::now();
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                if let Some(t) = &tap {
                    let _ = run_ok("ip", &["link", "del", t]);
                }
                return Err(boot_err(format!("cannot start vng: {e}")));
            }
        };
        let connected = tokio::time::timeout(opts.boot_timeout, async {
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!(
                        "vng exited with {status} before the guest was ready"
                    ));
                }
                if let Ok(s) = UnixStream::connect(&sock).await {
                    let mut r = BufReader::new(s);
                    let mut line = String::new();
                    // The guest's loop says `ready` once it holds the port.
                    match r.read_line(&mut line).await {
                        Ok(n) if n > 0 && line.trim() == "ready" => return Ok(r),
                        Ok(_) => {}
                        Err(e) => return Err(format!("control socket: {e}")),
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
        let channel = match connected {
            Ok(Ok(c)) => c,
            Ok(Err(why)) => {
                kill_group(&mut child).await;
                if let Some(t) = &tap {
                    let _ = run_ok("ip", &["link", "del", t]);
                }
                return Err(boot_err(why));
            }
            Err(_) => {
                kill_group(&mut child).await;
                if let Some(t) = &tap {
                    let _ = run_ok("ip", &["link", "del", t]);
                }
                return Err(boot_err(format!(
                    "no answer within {}s",
                    opts.boot_timeout.as_secs()
                )));
            }
        };
        Ok(Self {
            name: opts.name.clone(),
            child,
            channel,
            log,
            tap,
            booted_in: started.elapsed(),
        })
    }

    /// How long the boot took (start of vng to the guest's `ready`).
    pub fn booted_in(&self) -> Duration {
        self.booted_in
    }

    /// The process id of vng (QEMU's group leader), for a run's ledger.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The console log (vng's output, the guest's kernel messages on failure).
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Runs `script` with bash in the guest as root and returns its status and output;
    /// fails when the guest does not answer within `limit` (the channel is then unusable).
    pub async fn sh(&mut self, script: &str, limit: Duration) -> Result<GuestOutput, VmError> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let err = |why: String| VmError::Channel {
            name: self.name.clone(),
            why,
        };
        let mut line = b64.encode(script);
        line.push('\n');
        let answer = tokio::time::timeout(limit, async {
            self.channel.get_mut().write_all(line.as_bytes()).await?;
            let mut reply = String::new();
            self.channel.read_line(&mut reply).await?;
            Ok::<_, std::io::Error>(reply)
        })
        .await;
        let reply = match answer {
            Ok(Ok(r)) if !r.is_empty() => r,
            Ok(Ok(_)) => return Err(err("the guest closed the channel".into())),
            Ok(Err(e)) => return Err(err(format!("channel: {e}"))),
            Err(_) => {
                return Err(err(format!(
                    "no answer within {}s to: {}",
                    limit.as_secs(),
                    script.lines().next().unwrap_or_default()
                )));
            }
        };
        let (status, out) = reply
            .trim_end()
            .split_once(' ')
            .unwrap_or((reply.trim_end(), ""));
        let status = status
            .parse()
            .map_err(|_| err(format!("bad answer {reply:?}")))?;
        let output = b64
            .decode(out)
            .map_err(|e| err(format!("bad answer: {e}")))?;
        Ok(GuestOutput {
            status,
            output: String::from_utf8_lossy(&output).into_owned(),
        })
    }

    /// Like [`Vm::sh`], but a non-zero status is an error carrying the output.
    pub async fn sh_ok(&mut self, script: &str, limit: Duration) -> Result<String, VmError> {
        let out = self.sh(script, limit).await?;
        if out.success() {
            Ok(out.output)
        } else {
            Err(VmError::Channel {
                name: self.name.clone(),
                why: format!(
                    "`{}` exited with {}: {}",
                    script.lines().next().unwrap_or_default(),
                    out.status,
                    out.output.trim()
                ),
            })
        }
    }

    /// Powers the guest off (QEMU killed if it does not stop within 20 s) and removes its
    /// tap.
    pub async fn shutdown(mut self) {
        // The guest's loop never answers this one: the kernel powers off.
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            self.channel.get_mut().write_all(b"cG93ZXJvZmYgLWY=\n"),
        )
        .await;
        if tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .is_err()
        {
            kill_group(&mut self.child).await;
        }
        if let Some(t) = self.tap.take() {
            let _ = run_ok("ip", &["link", "del", &t]);
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            // QEMU runs in vng's process group: end both.
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stderr(Stdio::null())
                .status();
        }
        if let Some(t) = self.tap.take() {
            let _ = run_ok("ip", &["link", "del", &t]);
        }
    }
}

async fn kill_group(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .stderr(Stdio::null())
            .status()
            .await;
    }
    let _ = child.wait().await;
}

/// A locally administered MAC derived from the guest's address.
fn mac_for(a: Ipv4Addr) -> String {
    let o = a.octets();
    format!("52:54:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_script_sets_the_address_only_when_asked() {
        let plain = guest_script(None);
        assert!(!plain.contains("ip addr add"));
        assert!(plain.contains("echo ready >&3"));
        let net = VmNet {
            bridge: "lio1br".into(),
            tap: "lio1vm1".into(),
            address: Ipv4Addr::new(127, 10, 1, 21),
            prefix: 24,
        };
        let s = guest_script(Some(&net));
        assert!(s.contains("ip addr add 127.10.1.21/24 dev \"$dev\""), "{s}");
        assert!(s.contains("route_localnet=1"), "{s}");
    }

    #[test]
    fn macs_are_locally_administered_and_follow_the_address() {
        assert_eq!(mac_for(Ipv4Addr::new(127, 10, 1, 21)), "52:54:7f:0a:01:15");
    }
}
