//! The kernel NVMe/TCP initiator through `nvme-cli` or, for authenticated connections, the
//! kernel's fabrics device; and finding namespaces in sysfs.
//!
//! A volume without keys is connected with `nvme connect` ([`connect_argv`]). A volume with
//! DH-HMAC-CHAP keys is connected by writing the options string to `/dev/nvme-fabrics`
//! ([`connect_options`], [`Fabrics`]), as nvme-cli itself does (libnvme's `nvmf_add_ctrl`),
//! so that the secrets appear neither on a command line (`/proc/<pid>/cmdline` is readable by
//! every user) nor in a file: `nvme connect --dhchap-secret` would put them in argv, and
//! `nvme connect --config` would need them in a JSON file.
//!
//! A LiteIO volume's NVMe serial number is derived from its uuid
//! ([`liteio_api::naming::serial_number`]); the kernel shows it in
//! `<sysfs>/class/nvme/nvmeX/serial`. The namespace's block device is `nvmeXnY` under the
//! controller, or, with native multipath, the `nvmeSnY` head of the controller's subsystem in
//! `<sysfs>/class/nvme-subsystem/nvme-subsysS/`.
//!
//! Unit tests: `nvme/tests.rs`.

use std::fmt;
use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use liteio_api::SpdkTarget;
use liteio_api::auth::{self, VolumeKeys};

use crate::cmd::argv;
use crate::error::{CsiError, Result};

/// Delay between reconnect attempts after a lost connection (seconds; the kernel's least):
/// the host is back within a second of its target. An agent restart brings its target back
/// in well under a second (the restart benchmark), so with 2 s the reconnect delay was most
/// of the host's stall; a failed attempt against a node that is down costs a refused TCP
/// connect.
pub const RECONNECT_DELAY: &str = "1";
/// How long the kernel keeps a lost controller, holding its I/O and reconnecting, before it
/// gives up and fails the I/O (seconds). Long enough for a storage node's agent to restart
/// or be upgraded (measured in a 6.12 VM: with 10 s, an agent down for 16 s made fio see
/// EIO and ext4 abort its journal); the price is that I/O to a node that is lost for good
/// waits this long before it fails. The kernel's own default.
pub const CTRL_LOSS_TMO: &str = "600";

/// Checks that `t` is a complete TCP export.
fn check_target(t: &SpdkTarget) -> Result<()> {
    let transport = t.trans_type.to_ascii_lowercase();
    if transport != "tcp" {
        return Err(CsiError::FailedPrecondition(format!(
            "spec.spdkTarget.transType: {:?} is not supported by the node service (only TCP)",
            t.trans_type
        )));
    }
    for (field, v) in [
        ("address", &t.address),
        ("svcID", &t.svc_id),
        ("subsysNqn", &t.subsys_nqn),
    ] {
        if v.trim().is_empty() {
            return Err(CsiError::FailedPrecondition(format!(
                "spec.spdkTarget.{field}: is empty; the export is incomplete"
            )));
        }
    }
    Ok(())
}

/// `nvme connect` for a target, as this host, without authentication.
pub fn connect_argv(t: &SpdkTarget, host_nqn: &str) -> Result<Vec<String>> {
    check_target(t)?;
    Ok(argv(&[
        "nvme",
        "connect",
        "-t",
        "tcp",
        "-a",
        &t.address,
        "-s",
        &t.svc_id,
        "-n",
        &t.subsys_nqn,
        "--hostnqn",
        host_nqn,
        "--reconnect-delay",
        RECONNECT_DELAY,
        "--ctrl-loss-tmo",
        CTRL_LOSS_TMO,
    ]))
}

/// The kernel's NVMe over Fabrics control device.
pub const FABRICS_DEV: &str = "/dev/nvme-fabrics";

/// Option names of the fabrics options string whose values are secrets.
const SECRET_OPTIONS: [&str; 2] = ["dhchap_secret", "dhchap_ctrl_secret"];

/// An options string for [`FABRICS_DEV`] (`nqn=…,transport=tcp,…`). It may hold secrets, so
/// `Debug` and [`ConnectOptions::redacted`] show their values as `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectOptions(String);

impl ConnectOptions {
    /// The string to write to the device. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The string with every secret value replaced by `***`, for logs and errors.
    pub fn redacted(&self) -> String {
        redact_options(&self.0)
    }
}

/// An options string (or a reply of the fabrics device) with the values of
/// `dhchap_secret` and `dhchap_ctrl_secret` replaced by `***`.
pub fn redact_options(s: &str) -> String {
    s.split(',')
        .map(|opt| match opt.split_once('=') {
            Some((name, _)) if SECRET_OPTIONS.contains(&name.trim()) => {
                format!("{}=***", name.trim())
            }
            _ => opt.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

impl fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ConnectOptions")
            .field(&self.redacted())
            .finish()
    }
}

impl Drop for ConnectOptions {
    fn drop(&mut self) {
        let mut bytes = std::mem::take(&mut self.0).into_bytes();
        bytes.iter_mut().for_each(|b| *b = 0);
        std::hint::black_box(&bytes);
    }
}

/// Rejects values that would break the comma-separated options string.
fn option_value<'a>(field: &str, v: &'a str) -> Result<&'a str> {
    if v.is_empty()
        || v.chars()
            .any(|c| c == ',' || c.is_whitespace() || c.is_control())
    {
        return Err(CsiError::FailedPrecondition(format!(
            "{field}: {v:?} cannot be passed to the kernel (empty, or holds a comma, space or control character)"
        )));
    }
    Ok(v)
}

/// The options string that connects this host to `t` with DH-HMAC-CHAP: the host proves
/// itself with `keys.host` and checks the target with `keys.ctrl` (bidirectional). The
/// options and their order are those libnvme 1.4 (nvme-cli 2.4) writes for
/// `nvme connect -t tcp -a … -s … -n … --hostnqn … --dhchap-secret … --dhchap-ctrl-secret …
/// --reconnect-delay 1 --ctrl-loss-tmo 600`, so an authenticated connection behaves like an
/// unauthenticated one. `host_id` is `/etc/nvme/hostid` when the node has one (nvme-cli
/// passes it too; the kernel insists that one host NQN keeps one host id).
///
/// A TLS PSK is refused: the kernel takes TLS keys only from its `.nvme` keyring (Linux 6.7
/// or later, with the `tlshd` daemon), which this driver does not manage yet, and connecting
/// without TLS to an export that asks for it would only fail later.
pub fn connect_options(
    t: &SpdkTarget,
    host_nqn: &str,
    host_id: Option<&str>,
    keys: &VolumeKeys,
) -> Result<ConnectOptions> {
    check_target(t)?;
    if keys.tls_psk.is_some() {
        return Err(CsiError::FailedPrecondition(format!(
            "secrets: {}: the Secret asks for NVMe/TCP TLS, which this node service cannot set up \
             (the kernel needs the PSK in its .nvme keyring, Linux 6.7+ and tlshd); remove \
             {} from the Secret and the export, or connect this volume from a node that can",
            auth::DATA_TLS_PSK,
            auth::DATA_TLS_PSK
        )));
    }
    let mut opts = base_options(t, host_nqn, host_id)?;
    // Validated by VolumeKeys: `DHHC-1:<tt>:<base64>:` holds no comma or space.
    opts.push(format!("dhchap_secret={}", keys.host.expose()));
    opts.push(format!("dhchap_ctrl_secret={}", keys.ctrl.expose()));
    opts.push(format!("reconnect_delay={RECONNECT_DELAY}"));
    opts.push(format!("ctrl_loss_tmo={CTRL_LOSS_TMO}"));
    Ok(ConnectOptions(opts.join(",")))
}

/// The options every connection names, in libnvme's order: NQN, transport, address, port,
/// host NQN and host id.
fn base_options(t: &SpdkTarget, host_nqn: &str, host_id: Option<&str>) -> Result<Vec<String>> {
    let mut opts = vec![
        format!(
            "nqn={}",
            option_value("spec.spdkTarget.subsysNqn", &t.subsys_nqn)?
        ),
        "transport=tcp".to_string(),
        format!(
            "traddr={}",
            option_value("spec.spdkTarget.address", &t.address)?
        ),
        format!(
            "trsvcid={}",
            option_value("spec.spdkTarget.svcID", &t.svc_id)?
        ),
        format!("hostnqn={}", option_value("host NQN", host_nqn)?),
    ];
    if let Some(id) = host_id {
        opts.push(format!("hostid={}", option_value("host id", id)?));
    }
    Ok(opts)
}

/// The options string of [`connect_options`] without authentication: what `nvme connect -t
/// tcp -a … -s … -n … --hostnqn … --reconnect-delay 1 --ctrl-loss-tmo 600` writes to the
/// fabrics device.
pub fn plain_connect_options(
    t: &SpdkTarget,
    host_nqn: &str,
    host_id: Option<&str>,
) -> Result<ConnectOptions> {
    check_target(t)?;
    let mut opts = base_options(t, host_nqn, host_id)?;
    opts.push(format!("reconnect_delay={RECONNECT_DELAY}"));
    opts.push(format!("ctrl_loss_tmo={CTRL_LOSS_TMO}"));
    Ok(ConnectOptions(opts.join(",")))
}

/// The controller instance in the fabrics device's reply (`instance=3,cntlid=1`): the new
/// controller is `nvme<instance>`.
pub fn parse_fabrics_reply(reply: &str) -> Option<u32> {
    reply
        .split([',', '\n'])
        .find_map(|opt| opt.trim().strip_prefix("instance="))
        .and_then(|n| n.parse().ok())
}

/// Creates NVMe-oF controllers from options strings. Implementations block.
pub trait Fabrics: Send + Sync + fmt::Debug {
    /// Creates the controller `options` describe; returns the device's reply
    /// (`instance=N,cntlid=M`).
    fn add_ctrl(&self, options: &ConnectOptions) -> io::Result<String>;
}

/// The kernel's fabrics device (normally [`FABRICS_DEV`]): one write of the options string,
/// then one read of the reply on the same open file, as libnvme does.
#[derive(Debug, Clone)]
pub struct FabricsDevice {
    path: PathBuf,
}

impl FabricsDevice {
    /// The device at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FabricsDevice { path: path.into() }
    }
}

impl Fabrics for FabricsDevice {
    fn add_ctrl(&self, options: &ConnectOptions) -> io::Result<String> {
        if !self.path.exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} does not exist: load the nvme-tcp kernel module (modprobe nvme-tcp)",
                    self.path.display()
                ),
            ));
        }
        let mut dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.path)?;
        // The kernel parses each write as one complete options string.
        let bytes = options.expose().as_bytes();
        let written = dev.write(bytes)?;
        if written != bytes.len() {
            return Err(io::Error::other(format!(
                "the kernel took {written} of {} bytes of the options",
                bytes.len()
            )));
        }
        let mut buf = [0u8; 256];
        let n = dev.read(&mut buf)?;
        Ok(String::from_utf8_lossy(buf.get(..n).unwrap_or_default()).into_owned())
    }
}

/// Connects to `t` with `keys` through `fabrics` (see [`connect_options`]); returns the new
/// controller's name (`nvme3`). Errors show the options with their secrets masked.
pub fn connect_with_keys(
    fabrics: &dyn Fabrics,
    t: &SpdkTarget,
    host_nqn: &str,
    host_id: Option<&str>,
    keys: &VolumeKeys,
) -> Result<String> {
    let opts = connect_options(t, host_nqn, host_id, keys)?;
    let reply = fabrics.add_ctrl(&opts).map_err(|e| {
        let hint = if e.kind() != io::ErrorKind::NotFound {
            "; if the target rejected the keys, check that the volume's Secret holds the keys \
             its export was given"
        } else {
            ""
        };
        CsiError::io(
            format!(
                "authenticated connect to {} at {}:{} ({}) failed{hint}",
                t.subsys_nqn,
                t.address,
                t.svc_id,
                opts.redacted()
            ),
            e,
        )
    })?;
    parse_fabrics_reply(&reply)
        .map(|n| format!("nvme{n}"))
        .ok_or_else(|| {
            CsiError::Internal(format!(
                "the fabrics device answered {:?} to a connect to {}, with no controller instance",
                redact_options(reply.trim()),
                t.subsys_nqn
            ))
        })
}

/// `/etc/nvme/hostid`-style file: its first line, when it has a non-blank one.
pub fn host_id(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().and_then(|s| {
        s.lines()
            .next()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
    })
}

/// What to add to a failed unauthenticated connect: the export may require keys the
/// StorageClass did not ask kubelet to pass.
pub fn no_secrets_hint() -> String {
    format!(
        "no authentication keys were given; if the export requires DH-HMAC-CHAP, the \
         StorageClass must set {}: {}${{pv.name}} and {}: {}",
        auth::SC_PARAM_NODE_STAGE_SECRET_NAME,
        liteio_api::naming::AUTH_SECRET_PREFIX,
        auth::SC_PARAM_NODE_STAGE_SECRET_NAMESPACE,
        liteio_api::keys::DEFAULT_NAMESPACE
    )
}

/// `nvme disconnect` for a subsystem.
pub fn disconnect_argv(nqn: &str) -> Vec<String> {
    argv(&["nvme", "disconnect", "-n", nqn])
}

/// This node's host NQN (see [`liteio_node::hostnqn::load`]: the first line of `path`, or
/// `naming::host_nqn(node)` written there when the file is missing or blank).
pub fn host_nqn(path: &Path, node: &str) -> Result<String> {
    use liteio_node::hostnqn::HostNqnError;
    liteio_node::hostnqn::load(path, node).map_err(|e| match e {
        HostNqnError::Read { path, source } => {
            CsiError::io(format!("read {}", path.display()), source)
        }
        HostNqnError::Write { path, source } => {
            CsiError::io(format!("write {}", path.display()), source)
        }
        e @ HostNqnError::Invalid { .. } => CsiError::Internal(e.to_string()),
    })
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

fn dir_names(p: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(p)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn digits(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_digit())
}

/// True for `nvme<digits>n<digits>` (a namespace head, not a `c` path).
fn is_ns_name(name: &str) -> bool {
    name.strip_prefix("nvme")
        .and_then(|r| r.split_once('n'))
        .is_some_and(|(c, n)| digits(c) && digits(n))
}

/// True for `nvme<d>c<d>n<d>` (a multipath path device).
fn is_path_name(name: &str) -> bool {
    name.strip_prefix("nvme")
        .and_then(|r| r.split_once('c'))
        .is_some_and(|(a, b)| {
            digits(a)
                && b.split_once('n')
                    .is_some_and(|(c, n)| digits(c) && digits(n))
        })
}

/// A controller whose serial number matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Controller name (`nvme3`).
    pub controller: String,
    /// Namespace block device name (`nvme3n1`), when the namespace is visible yet.
    pub namespace: Option<String>,
    /// Subsystem NQN the controller reports.
    pub subsys_nqn: String,
}

/// Finds the controller with serial number `serial` and its namespace device in `sysfs`.
pub fn find_by_serial(sysfs: &Path, serial: &str) -> Option<Found> {
    let class = sysfs.join("class/nvme");
    for ctrl in dir_names(&class) {
        let dir = class.join(&ctrl);
        if read_trim(&dir.join("serial")).as_deref() != Some(serial) {
            continue;
        }
        let subsys_nqn = read_trim(&dir.join("subsysnqn")).unwrap_or_default();
        let entries = dir_names(&dir);
        let mut namespace = entries.iter().find(|n| is_ns_name(n)).cloned();
        if namespace.is_none() && entries.iter().any(|n| is_path_name(n)) {
            namespace = multipath_head(sysfs, &ctrl);
        }
        return Some(Found {
            controller: ctrl,
            namespace,
            subsys_nqn,
        });
    }
    None
}

/// The namespace head of the subsystem that contains controller `ctrl`.
fn multipath_head(sysfs: &Path, ctrl: &str) -> Option<String> {
    let class = sysfs.join("class/nvme-subsystem");
    for subsys in dir_names(&class) {
        let entries = dir_names(&class.join(&subsys));
        if entries.iter().any(|e| e == ctrl) {
            return entries.into_iter().find(|n| is_ns_name(n));
        }
    }
    None
}

/// Waits (polling every 100 ms, blocking) until the namespace with `serial` appears, or
/// `timeout` passes.
pub fn wait_for_namespace(sysfs: &Path, serial: &str, timeout: Duration) -> Option<String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(ns) = find_by_serial(sysfs, serial).and_then(|f| f.namespace) {
            return Some(ns);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `/dev/<name>`.
pub fn dev_path(name: &str) -> PathBuf {
    Path::new("/dev").join(name)
}

/// The controller attribute (`<sysfs>/class/nvme/nvmeX/…`) holding the host's DH-HMAC-CHAP
/// secret.
pub const ATTR_DHCHAP_SECRET: &str = "dhchap_secret";
/// The controller attribute holding the secret the target proves itself with.
pub const ATTR_DHCHAP_CTRL_SECRET: &str = "dhchap_ctrl_secret";

/// What the kernel shows in a secret attribute of a controller connected without one.
const NO_SECRET: &str = "none";

/// A secret attribute's content as read, wiped on drop; never printed.
struct AttrContent(Vec<u8>);

impl Drop for AttrContent {
    fn drop(&mut self) {
        self.0.iter_mut().for_each(|b| *b = 0);
        std::hint::black_box(&self.0);
    }
}

/// Gives `keys` to the live controller `controller` through its sysfs attributes
/// [`ATTR_DHCHAP_SECRET`] (`keys.host`) and [`ATTR_DHCHAP_CTRL_SECRET`] (`keys.ctrl`), writing
/// only those whose content differs. Returns the attributes written, in that order: empty
/// when the controller holds these keys already.
///
/// How the kernel behaves (Linux 6.0+, `drivers/nvme/host/sysfs.c`, formerly `core.c`):
/// - reading an attribute shows the secret the controller uses, as given (not masked), or
///   `none` when it was connected without one;
/// - a write of a `DHHC-1:` secret replaces it and *always* queues a re-authentication, even
///   when the secret is the same; the next reconnect uses the new secret too;
/// - a write to a controller connected without a secret fails with EINVAL.
///
/// So the attribute itself is the record of what the controller holds: comparing with it is
/// right after a restart of this driver, after a reconnect or a new controller with the same
/// name, and costs two small reads, while writing unconditionally would re-authenticate every
/// volume at every republish. The content read is compared without stopping at the first
/// difference, wiped after use and never logged. A content that is not a DH-HMAC-CHAP secret
/// (a kernel that masks it) counts as different: the key is written, and the kernel
/// re-authenticates with the key it already had when nothing changed.
///
/// Errors name the attribute's path, never a value: a missing attribute means a kernel
/// without NVMe in-band authentication; `none` means a controller connected without keys.
/// The attribute written first stays written when the second fails; a later call writes only
/// what still differs.
pub fn refresh_keys(
    sysfs: &Path,
    controller: &str,
    keys: &VolumeKeys,
) -> Result<Vec<&'static str>> {
    let dir = sysfs.join("class/nvme").join(controller);
    let mut written = Vec::new();
    for (attr, secret) in [
        (ATTR_DHCHAP_SECRET, &keys.host),
        (ATTR_DHCHAP_CTRL_SECRET, &keys.ctrl),
    ] {
        let path = dir.join(attr);
        let content = match std::fs::read(&path) {
            Ok(bytes) => AttrContent(bytes),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(CsiError::FailedPrecondition(format!(
                    "{}: does not exist; this kernel cannot change the DH-HMAC-CHAP keys of a \
                     connected controller (NVMe in-band authentication needs Linux 6.0 or later \
                     built with CONFIG_NVME_HOST_AUTH)",
                    path.display()
                )));
            }
            Err(e) => return Err(CsiError::io(format!("read {}", path.display()), e)),
        };
        let current = std::str::from_utf8(&content.0).unwrap_or_default().trim();
        if current == NO_SECRET {
            return Err(CsiError::FailedPrecondition(format!(
                "{}: reads {NO_SECRET}: controller {controller} was connected without \
                 DH-HMAC-CHAP, so the kernel takes no new key; the keys apply when the volume \
                 is staged again",
                path.display()
            )));
        }
        let same = auth::DhchapSecret::parse(attr, current).is_ok_and(|held| held == *secret);
        if same {
            continue;
        }
        write_attr(&path, secret.expose())?;
        written.push(attr);
    }
    Ok(written)
}

/// The DH-HMAC-CHAP keys the live controller `controller` authenticates with, read from its
/// sysfs attributes [`ATTR_DHCHAP_SECRET`] and [`ATTR_DHCHAP_CTRL_SECRET`] (see
/// [`refresh_keys`] for what the kernel shows there): `None` when it was connected without
/// keys (the attributes read `none`) or the kernel has no in-band authentication (no such
/// attributes, so no controller of it can have been connected with keys).
///
/// A second path of a volume must be connected with the keys of the first
/// ([`crate::multipath`]): these are them, including keys rotated since NodeStageVolume, and
/// the node needs no access to the volume's Secret to learn them. Errors name the attribute's
/// path, never a value; what is read is wiped after use.
pub fn controller_keys(sysfs: &Path, controller: &str) -> Result<Option<VolumeKeys>> {
    let dir = sysfs.join("class/nvme").join(controller);
    let read = |attr: &str| -> Result<Option<auth::DhchapSecret>> {
        let path = dir.join(attr);
        let content = match std::fs::read(&path) {
            Ok(bytes) => AttrContent(bytes),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(CsiError::io(format!("read {}", path.display()), e)),
        };
        let text = std::str::from_utf8(&content.0).unwrap_or_default().trim();
        if text == NO_SECRET || text.is_empty() {
            return Ok(None);
        }
        auth::DhchapSecret::parse(attr, text).map(Some).map_err(|_| {
            CsiError::FailedPrecondition(format!(
                "{}: holds no DH-HMAC-CHAP secret this node can reuse (a kernel that masks it?)",
                path.display()
            ))
        })
    };
    match (read(ATTR_DHCHAP_SECRET)?, read(ATTR_DHCHAP_CTRL_SECRET)?) {
        (None, None) => Ok(None),
        (Some(host), Some(ctrl)) => Ok(Some(VolumeKeys {
            host,
            ctrl,
            tls_psk: None,
        })),
        _ => Err(CsiError::FailedPrecondition(format!(
            "controller {controller} authenticates in one direction only ({} and {} differ in \
             being set); this node connects with both",
            ATTR_DHCHAP_SECRET, ATTR_DHCHAP_CTRL_SECRET
        ))),
    }
}

/// One write of `value` (no newline: the kernel keeps every byte it is given) to the sysfs
/// attribute `path`, which must exist. Errors name the path, not the value.
fn write_attr(path: &Path, value: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .map_err(|e| CsiError::io(format!("open {} for writing", path.display()), e))?;
    let bytes = value.as_bytes();
    let n = f
        .write(bytes)
        .map_err(|e| CsiError::io(format!("write {}", path.display()), e))?;
    if n != bytes.len() {
        return Err(CsiError::Internal(format!(
            "write {}: the kernel took {n} of {} bytes",
            path.display(),
            bytes.len()
        )));
    }
    Ok(())
}

/// Deletes every controller of subsystem `nqn` on this host (`<sysfs>/class/nvme/*` whose
/// `subsysnqn` is `nqn`) through its `delete_controller` attribute: the kernel fails the
/// I/O it holds for them at once instead of after [`CTRL_LOSS_TMO`]. For a volume whose
/// target is gone for good (deleted on the storage side). Returns the controllers deleted;
/// one the kernel removed meanwhile is no error.
pub fn delete_controllers(sysfs: &Path, nqn: &str) -> Result<Vec<String>> {
    let class = sysfs.join("class/nvme");
    let mut deleted = Vec::new();
    for ctrl in dir_names(&class) {
        let dir = class.join(&ctrl);
        if read_trim(&dir.join("subsysnqn")).as_deref() != Some(nqn) {
            continue;
        }
        match write_attr(&dir.join("delete_controller"), "1") {
            Ok(()) => deleted.push(ctrl),
            Err(CsiError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

/// What a failed connect to `t` means, for the caller:
/// - the target cannot be reached (the kernel's "Connection refused", "Connection timed
///   out", "No route to host", …): [`CsiError::Unreachable`] naming the address, so that the
///   CO retries;
/// - the target wants DH-HMAC-CHAP and no keys were given (`ENOKEY`, "Required key not
///   available"), or one side rejected the other's keys (`EKEYREJECTED`, "Key was rejected
///   by service"): [`CsiError::Unauthenticated`] naming the subsystem and what to check;
/// - anything else is returned as it is.
pub fn connect_failure(t: &SpdkTarget, e: CsiError) -> CsiError {
    let os = match &e {
        CsiError::Io { source, .. } => source.raw_os_error(),
        _ => None,
    };
    let text = e.to_string().to_ascii_lowercase();
    if os == Some(libc_errno::ENOKEY) || text.contains("required key not available") {
        return CsiError::Unauthenticated {
            reason: "keys_required",
            message: format!(
                "NVMe/TCP target {}:{} of {} requires DH-HMAC-CHAP: {}",
                t.address,
                t.svc_id,
                t.subsys_nqn,
                no_secrets_hint()
            ),
        };
    }
    if os == Some(libc_errno::EKEYREJECTED) || text.contains("key was rejected") {
        return CsiError::Unauthenticated {
            reason: "keys_rejected",
            message: format!(
                "NVMe/TCP target {}:{} of {} and this host did not accept each other's DH-HMAC-CHAP keys: the node-stage Secret ({}<pv name>) must hold the keys the volume's export was given (after `kubectl liteio rotate-keys`, the new ones)",
                t.address,
                t.svc_id,
                t.subsys_nqn,
                liteio_api::naming::AUTH_SECRET_PREFIX
            ),
        };
    }
    let why = if text.contains("connection refused") {
        "refused the connection: nothing listens there (is the volume's storage node and its agent up?)"
    } else if text.contains("timed out") {
        "did not answer (connection timed out)"
    } else if text.contains("no route to host") || text.contains("host is unreachable") {
        "is unreachable (no route to host)"
    } else if text.contains("network is unreachable") {
        "is unreachable (network is unreachable)"
    } else {
        return e;
    };
    CsiError::Unreachable(format!(
        "NVMe/TCP target {}:{} of {} {why}",
        t.address, t.svc_id, t.subsys_nqn
    ))
}

/// Linux errno values of the kernel's key errors (not in `std`).
mod libc_errno {
    /// "Required key not available".
    pub const ENOKEY: i32 = 126;
    /// "Key was rejected by service".
    pub const EKEYREJECTED: i32 = 129;
}

/// What this host's kernel can do for NVMe-oF connections, as the CSI node finds it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct HostCapabilities {
    /// The kernel release (`uname -r`).
    pub kernel: String,
    /// In-band authentication (DH-HMAC-CHAP) of NVMe/TCP connections.
    pub dhchap: bool,
    /// NVMe/TCP TLS (the `tls` connect option).
    pub tls: bool,
    /// How `dhchap` was decided (a kernel config line, a module file, or why nothing was
    /// found), for messages.
    pub dhchap_evidence: String,
}

impl HostCapabilities {
    /// Why a volume that requires authentication cannot be connected from this host,
    /// `None` when it can: names the kernel and the option it was built without.
    pub fn auth_refusal(&self) -> Option<String> {
        (!self.dhchap).then(|| {
            format!(
                "this node's kernel {} cannot authenticate NVMe/TCP connections (DH-HMAC-CHAP): {}; it needs CONFIG_NVME_HOST_AUTH (Linux 6.7 and newer) or CONFIG_NVME_AUTH (6.0 to 6.6), e.g. Debian 12's bookworm-backports kernel",
                self.kernel, self.dhchap_evidence
            )
        })
    }
}

/// Finds what the running kernel can do: `tls` from the options `/dev/nvme-fabrics` lists
/// (`fabrics`; the nvme-fabrics module must be loaded); DH-HMAC-CHAP from the kernel's build
/// configuration in `boot` (`config-<release>`), else from the `nvme-auth` module in
/// `modules` (`<release>/…`, loaded or built in). The option list cannot tell: kernels built
/// without authentication (Debian 12's 6.1) still list `dhchap_secret`.
pub fn host_capabilities(
    release: &str,
    fabrics: &Path,
    boot: &Path,
    modules: &Path,
    sys_module: &Path,
) -> HostCapabilities {
    let tls = std::fs::read_to_string(fabrics)
        .map(|s| s.trim().split(',').any(|o| o == "tls"))
        .unwrap_or(false);
    let (dhchap, dhchap_evidence) = dhchap_support(release, boot, modules, sys_module);
    HostCapabilities {
        kernel: release.to_string(),
        dhchap,
        tls,
        dhchap_evidence,
    }
}

fn dhchap_support(release: &str, boot: &Path, modules: &Path, sys_module: &Path) -> (bool, String) {
    let config = boot.join(format!("config-{release}"));
    if let Ok(text) = std::fs::read_to_string(&config) {
        let value = |sym: &str| -> Option<String> {
            text.lines().find_map(|l| {
                if l == format!("# {sym} is not set") {
                    Some("n".into())
                } else {
                    l.strip_prefix(&format!("{sym}=")).map(str::to_string)
                }
            })
        };
        // Linux 6.7 split host authentication off CONFIG_NVME_AUTH.
        if let Some(v) = value("CONFIG_NVME_HOST_AUTH") {
            let yes = v == "y";
            return (
                yes,
                format!("{}: CONFIG_NVME_HOST_AUTH={v}", config.display()),
            );
        }
        return match value("CONFIG_NVME_AUTH") {
            Some(v) if v == "y" || v == "m" => {
                (true, format!("{}: CONFIG_NVME_AUTH={v}", config.display()))
            }
            Some(_) => (
                false,
                format!("built without CONFIG_NVME_AUTH ({})", config.display()),
            ),
            None => (
                false,
                format!(
                    "{} names neither CONFIG_NVME_HOST_AUTH nor CONFIG_NVME_AUTH",
                    config.display()
                ),
            ),
        };
    }
    if sys_module.join("nvme_auth").exists() {
        return (true, "module nvme_auth is loaded".into());
    }
    let dir = modules.join(release);
    if std::fs::read_to_string(dir.join("modules.builtin"))
        .is_ok_and(|s| s.lines().any(|l| l.ends_with("/nvme-auth.ko")))
    {
        return (true, "nvme-auth is built in".into());
    }
    let common = dir.join("kernel/drivers/nvme/common");
    if std::fs::read_dir(&common).is_ok_and(|rd| {
        rd.flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("nvme-auth.ko"))
    }) {
        return (true, format!("module nvme-auth in {}", common.display()));
    }
    (
        false,
        format!(
            "no kernel config at {} and no nvme-auth module",
            config.display()
        ),
    )
}

/// [`host_capabilities`] of the running kernel, at the standard paths.
pub fn this_host_capabilities() -> HostCapabilities {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    host_capabilities(
        &release,
        Path::new(FABRICS_DEV),
        Path::new("/boot"),
        Path::new("/lib/modules"),
        Path::new("/sys/module"),
    )
}

#[cfg(test)]
mod tests;
