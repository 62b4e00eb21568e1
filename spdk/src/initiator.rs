//! SPDK's NVMe-oF initiator (`bdev_nvme`): attach a remote subsystem as local bdevs. Used for
//! migration pipes and to test the target end to end.

use std::ffi::{CString, c_char, c_void};
use std::time::Duration;

use super::dhchap::DhGroup;
use super::error::{Result, SpdkError, libc_errno};
use super::nvmf::{AnaState, HostKeys, ptr_or_null};
use super::runtime::{Reply, cstr, errno_cb, errno_ctx, exec, no_unwind};

struct Attach {
    names: Vec<*const c_char>,
    _strings: (CString, CString),
    /// Key names SPDK looks up during the call (kept alive with the request anyway).
    _keys: [Option<CString>; 3],
    ctrlr: String,
    reply: Reply<Vec<String>>,
}

/// Completion of `spdk_bdev_nvme_create`.
///
/// # Safety
/// `arg` must be a `Box<Attach>` leaked by [`attach`], reclaimed here once; its first `count`
/// names are set by SPDK.
unsafe extern "C" fn attached(arg: *mut c_void, count: usize, rc: i32) {
    no_unwind("attached", || {
        // SAFETY: the caller's contract: `arg` is our `Attach`, reclaimed once.
        let a = unsafe { Box::from_raw(arg.cast::<Attach>()) };
        if rc != 0 {
            return a
                .reply
                .send(Err(SpdkError::errno("attach NVMe controller", a.ctrlr, rc)));
        }
        let names = a
            .names
            .iter()
            .take(count)
            .map(|p| super::runtime::from_c(*p))
            .collect();
        a.reply.send(Ok(names));
    });
}

/// Connect to `subnqn` at `address:port` over TCP as `hostnqn`, creating bdevs named
/// `<ctrlr>n<nsid>`. Returns their names. SPDK's default for a lost connection
/// ([`AttachOpts::default`]: no reconnect); [`attach_tcp_opts`] chooses.
pub async fn attach_tcp(
    ctrlr: &str,
    address: &str,
    port: u16,
    subnqn: &str,
    hostnqn: &str,
) -> Result<Vec<String>> {
    attach_tcp_with(ctrlr, address, port, subnqn, hostnqn, None).await
}

/// How the initiator rides out a target that goes away (an agent restart): it reconnects
/// every `delay` and keeps the I/O queued meanwhile; after `give_up_after` without a
/// connection the controller is deleted and queued I/O fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconnect {
    /// Between attempts (at least 1 s: SPDK counts whole seconds).
    pub delay: std::time::Duration,
    /// How long to keep trying (at least `delay`).
    pub give_up_after: std::time::Duration,
}

/// [`attach_tcp`], reconnecting as `reconnect` says when the connection drops (`None`:
/// SPDK's default, no reconnect: I/O fails at once).
pub async fn attach_tcp_with(
    ctrlr: &str,
    address: &str,
    port: u16,
    subnqn: &str,
    hostnqn: &str,
    reconnect: Option<Reconnect>,
) -> Result<Vec<String>> {
    attach_tcp_auth(
        ctrlr,
        address,
        port,
        subnqn,
        hostnqn,
        reconnect,
        &HostKeys::default(),
    )
    .await
}

/// [`attach_tcp_with`], authenticating with `keys` (names of keys in the keyring):
/// `dhchap_key` proves this host, `dhchap_ctrlr_key` makes the host check the target
/// (bidirectional), `psk` connects over TLS.
pub async fn attach_tcp_auth(
    ctrlr: &str,
    address: &str,
    port: u16,
    subnqn: &str,
    hostnqn: &str,
    reconnect: Option<Reconnect>,
    keys: &HostKeys,
) -> Result<Vec<String>> {
    let timeouts = reconnect_secs(reconnect)?;
    attach(
        ctrlr,
        tcp_trid(address, port, subnqn)?,
        hostnqn,
        timeouts,
        keys,
        false,
    )
    .await
}

/// How an attached controller rides out a lost connection, and how fast its I/O fails
/// meanwhile: SPDK's per-controller `reconnect_delay_sec`, `fast_io_fail_timeout_sec` and
/// `ctrlr_loss_timeout_sec` (whole seconds), and the keep-alive timeout.
///
/// For a member of a raid1 on another node: a member that cannot be reached must fail its
/// I/O soon (the raid then fails the member and goes on degraded, with no error to its own
/// user) instead of holding the raid's I/O, while an outage shorter than
/// `fast_io_fail_timeout` only delays I/O. [`AttachOpts::raid_member`] is such a setting.
/// [`AttachOpts::default`] is SPDK's default (no reconnect: I/O fails at once and the
/// controller is deleted when the connection drops), what [`attach_tcp`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachOpts {
    /// Between reconnect attempts (whole seconds, at least 1 s); zero: no reconnect (then
    /// `ctrlr_loss_timeout` must be zero and `fast_io_fail_timeout` `None`).
    pub reconnect_delay: Duration,
    /// From the connection's loss until the controller's queued and new I/O fails (while it
    /// goes on reconnecting): whole seconds, at least `reconnect_delay`, at most
    /// `ctrlr_loss_timeout`. `None`: I/O waits until the controller is given up.
    pub fast_io_fail_timeout: Option<Duration>,
    /// From the connection's loss until the controller is given up and deleted with its
    /// bdevs (whole seconds, at least `reconnect_delay`); zero: at once (no reconnect);
    /// `None`: never (reconnect for ever).
    pub ctrlr_loss_timeout: Option<Duration>,
    /// The keep-alive timeout asked of the target (the host sends a keep-alive every half
    /// of it; a target that hears none for that long drops the host's controller; SPDK's
    /// target takes 10 s at least). SPDK applies one value to every NVMe controller of the
    /// process: a value other than the current one is set only while no controller is
    /// attached (else `keep_alive_timeout` [`SpdkError::InvalidArgument`]). `None`: the
    /// current one (SPDK's default: 10 s).
    pub keep_alive_timeout: Option<Duration>,
}

impl Default for AttachOpts {
    fn default() -> Self {
        Self {
            reconnect_delay: Duration::ZERO,
            fast_io_fail_timeout: None,
            ctrlr_loss_timeout: Some(Duration::ZERO),
            keep_alive_timeout: None,
        }
    }
}

impl AttachOpts {
    /// For a raid1 member on another node: reconnect every second; I/O fails after 2 s
    /// without a connection (the raid degrades instead of waiting); the controller is
    /// given up after 30 s.
    pub fn raid_member() -> Self {
        Self {
            reconnect_delay: Duration::from_secs(1),
            fast_io_fail_timeout: Some(Duration::from_secs(2)),
            ctrlr_loss_timeout: Some(Duration::from_secs(30)),
            keep_alive_timeout: None,
        }
    }

    /// The settings checked as SPDK checks them and turned into its units.
    fn timeouts(&self) -> Result<Timeouts> {
        let bad = |reason: String| {
            Err(SpdkError::InvalidArgument {
                field: "attach_opts",
                reason,
            })
        };
        let secs = |what: &str, d: Duration| -> Result<u32> {
            if d.subsec_nanos() != 0 {
                return Err(SpdkError::InvalidArgument {
                    field: "attach_opts",
                    reason: format!("{what} {d:?} is not a whole number of seconds"),
                });
            }
            u32::try_from(d.as_secs())
                .ok()
                .filter(|s| *s <= i32::MAX as u32)
                .ok_or_else(|| SpdkError::InvalidArgument {
                    field: "attach_opts",
                    reason: format!("{what} {d:?} is too long"),
                })
        };
        let delay = secs("reconnect_delay", self.reconnect_delay)?;
        let fast = match self.fast_io_fail_timeout {
            Some(d) if d.is_zero() => {
                return bad("fast_io_fail_timeout of zero: say None for no fast fail".into());
            }
            Some(d) => secs("fast_io_fail_timeout", d)?,
            None => 0,
        };
        // SPDK: -1 for ever, 0 at once.
        let loss: i32 = match self.ctrlr_loss_timeout {
            // At most i32::MAX: checked by `secs`.
            Some(d) => secs("ctrlr_loss_timeout", d)? as i32,
            None => -1,
        };
        if loss == 0 {
            if delay != 0 || fast != 0 {
                return bad(format!(
                    "without reconnecting (ctrlr_loss_timeout zero), reconnect_delay must be zero and fast_io_fail_timeout None (got {:?}, {:?})",
                    self.reconnect_delay, self.fast_io_fail_timeout
                ));
            }
        } else {
            if delay == 0 {
                return bad("reconnecting needs a reconnect_delay of at least 1 s".into());
            }
            if loss > 0 && delay > loss as u32 {
                return bad(format!(
                    "reconnect_delay {:?} is longer than ctrlr_loss_timeout {:?}",
                    self.reconnect_delay, self.ctrlr_loss_timeout
                ));
            }
            if fast != 0 && fast < delay {
                return bad(format!(
                    "fast_io_fail_timeout {:?} is shorter than reconnect_delay {:?}",
                    self.fast_io_fail_timeout, self.reconnect_delay
                ));
            }
            if fast != 0 && loss > 0 && fast > loss as u32 {
                return bad(format!(
                    "fast_io_fail_timeout {:?} is longer than ctrlr_loss_timeout {:?}",
                    self.fast_io_fail_timeout, self.ctrlr_loss_timeout
                ));
            }
        }
        let keep_alive_ms = match self.keep_alive_timeout {
            Some(d) if d.is_zero() => {
                return Err(SpdkError::InvalidArgument {
                    field: "keep_alive_timeout",
                    reason: "zero would turn keep-alives off; say None for the current one".into(),
                });
            }
            Some(d) => {
                Some(
                    u32::try_from(d.as_millis()).map_err(|_| SpdkError::InvalidArgument {
                        field: "keep_alive_timeout",
                        reason: format!("{d:?} is too long"),
                    })?,
                )
            }
            None => None,
        };
        Ok(Timeouts {
            reconnect_delay_sec: delay,
            ctrlr_loss_timeout_sec: loss,
            fast_io_fail_timeout_sec: fast,
            keep_alive_ms,
        })
    }
}

/// SPDK's units of [`AttachOpts`], checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Timeouts {
    reconnect_delay_sec: u32,
    ctrlr_loss_timeout_sec: i32,
    fast_io_fail_timeout_sec: u32,
    keep_alive_ms: Option<u32>,
}

/// Connect to `subnqn` at `address:port` over TCP as `hostnqn`, authenticating with `keys`
/// (as [`attach_tcp_auth`]), with `opts` for a lost connection: creates bdevs named
/// `<ctrlr>n<nsid>` and returns their names.
pub async fn attach_tcp_opts(
    ctrlr: &str,
    address: &str,
    port: u16,
    subnqn: &str,
    hostnqn: &str,
    keys: &HostKeys,
    opts: &AttachOpts,
) -> Result<Vec<String>> {
    let timeouts = opts.timeouts()?;
    attach(
        ctrlr,
        tcp_trid(address, port, subnqn)?,
        hostnqn,
        timeouts,
        keys,
        false,
    )
    .await
}

/// Checked reconnect settings: [`Reconnect`] as [`AttachOpts`] (I/O waits while SPDK
/// reconnects); `None` is SPDK's default.
fn reconnect_secs(reconnect: Option<Reconnect>) -> Result<Timeouts> {
    let Some(r) = reconnect else {
        return AttachOpts::default().timeouts();
    };
    let delay = u32::try_from(r.delay.as_secs()).unwrap_or(u32::MAX);
    let loss = i32::try_from(r.give_up_after.as_secs()).unwrap_or(i32::MAX);
    if delay == 0 || i64::from(loss) < i64::from(delay) {
        return Err(SpdkError::InvalidArgument {
            field: "reconnect",
            reason: format!(
                "delay {:?} must be at least 1 s and at most give_up_after {:?}",
                r.delay, r.give_up_after
            ),
        });
    }
    Ok(Timeouts {
        reconnect_delay_sec: delay,
        ctrlr_loss_timeout_sec: loss,
        fast_io_fail_timeout_sec: 0,
        keep_alive_ms: None,
    })
}

fn check_ip(address: &str) -> Result<()> {
    if address.parse::<std::net::IpAddr>().is_err() {
        return Err(SpdkError::InvalidArgument {
            field: "address",
            reason: format!("{address:?} is not an IP address"),
        });
    }
    Ok(())
}

/// The transport ID of `subnqn` at `address:port` over TCP (`address` checked).
fn tcp_trid(address: &str, port: u16, subnqn: &str) -> Result<String> {
    check_ip(address)?;
    Ok(format!(
        "trtype:TCP adrfam:IPv4 traddr:{address} trsvcid:{port} subnqn:{subnqn}"
    ))
}

/// Attach `address:port` as one more path of the multipath NVMe bdev controller `ctrlr`
/// (created by the first call with that name): every path must lead to the same subsystem
/// `subnqn` with the same namespace identity (UUID/NGUID), through controllers with
/// different controller IDs. The namespace stays one bdev, `<ctrlr>n1`; I/O takes one path
/// at a time (active-passive), an ANA-optimized one when there is one, else a non-optimized
/// one, and moves to another path when the current one becomes inaccessible or
/// disconnects. Returns the bdev names. This is the host's half of a hot migration, done
/// here by SPDK's initiator.
pub async fn attach_tcp_path(
    ctrlr: &str,
    address: &str,
    port: u16,
    subnqn: &str,
    hostnqn: &str,
    reconnect: Option<Reconnect>,
    keys: &HostKeys,
) -> Result<Vec<String>> {
    let timeouts = reconnect_secs(reconnect)?;
    attach(
        ctrlr,
        tcp_trid(address, port, subnqn)?,
        hostnqn,
        timeouts,
        keys,
        true,
    )
    .await
}

/// One path of a multipath NVMe bdev controller, as the initiator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathInfo {
    /// Target address.
    pub address: String,
    /// Target port.
    pub port: u16,
    /// Controller ID the target handed out.
    pub cntlid: u16,
    /// ANA state of namespace 1 on this path as last read from the target; `None` when the
    /// path has no namespace 1 or reports a state LiteIO does not use.
    pub ana_state: Option<AnaState>,
    /// Connected (not resetting, failed or being deleted).
    pub connected: bool,
}

/// The paths of the NVMe bdev controller `ctrlr`, in the order they were attached.
pub async fn paths(ctrlr: &str) -> Result<Vec<PathInfo>> {
    let c = cstr("ctrlr", ctrlr)?;
    let name = ctrlr.to_string();
    super::runtime::on_reactor_with(move |_r| {
        const MAX: usize = 16;
        // SAFETY: an all-zero path record is a valid value (empty strings, zeros, false).
        let mut out: Vec<spdk_sys::liteio_nvme_path> = vec![unsafe { std::mem::zeroed() }; MAX];
        // SAFETY: on the reactor (bdev_nvme's app thread); `out` has room for MAX records.
        let n =
            unsafe { spdk_sys::liteio_bdev_nvme_paths(c.as_ptr(), out.as_mut_ptr(), MAX as i32) };
        if n == -19 {
            return Err(SpdkError::NotFound {
                kind: "NVMe controller",
                name,
            });
        }
        if n < 0 {
            return Err(SpdkError::errno("list paths", name, n));
        }
        Ok(out
            .iter()
            .take(usize::try_from(n).unwrap_or(0))
            .map(|p| PathInfo {
                address: super::runtime::from_c_array(&p.traddr),
                port: super::runtime::from_c_array(&p.trsvcid)
                    .parse()
                    .unwrap_or(0),
                cntlid: p.cntlid,
                ana_state: AnaState::from_raw(p.ana_state),
                connected: p.connected,
            })
            .collect())
    })
    .await
}

/// Detach the path to `address:port` of the NVMe bdev controller `ctrlr`, keeping the others
/// and the bdev (the last path takes the controller and its bdevs with it, like [`detach`]).
/// I/O on that path moves to another. A missing path or controller is success.
pub async fn detach_path(ctrlr: &str, address: &str, port: u16) -> Result<()> {
    check_ip(address)?;
    let c = cstr("ctrlr", ctrlr)?;
    let spec = cstr(
        "address",
        &format!("trtype:TCP adrfam:IPv4 traddr:{address} trsvcid:{port}"),
    )?;
    let what = format!("{ctrlr} path {address}:{port}");
    exec(move |reply: Reply<()>| {
        // SAFETY: a zeroed transport id is valid input for the parser.
        let mut trid: spdk_sys::spdk_nvme_transport_id = unsafe { std::mem::zeroed() };
        // SAFETY: `trid` writable; `spec` valid.
        let rc = unsafe { spdk_sys::spdk_nvme_transport_id_parse(&mut trid, spec.as_ptr()) };
        if rc != 0 {
            return reply.send(Err(SpdkError::errno("parse transport id", what, rc)));
        }
        let ctx = errno_ctx(move |_, rc| {
            // -ENXIO: no such path; -ENODEV: no such controller.
            reply.send(if rc == 0 || rc == -6 || rc == -19 {
                Ok(())
            } else {
                Err(SpdkError::errno("detach path", what, rc))
            })
        });
        // SAFETY: on the reactor; `trid` is copied; `ctx` owned by SPDK when rc == 0.
        let rc = unsafe {
            spdk_sys::liteio_bdev_nvme_detach_path(c.as_ptr(), &trid, Some(errno_cb), ctx)
        };
        if rc != 0 {
            // SAFETY: SPDK refused the call and never took `ctx`: answered here, once.
            unsafe { errno_cb(ctx, rc) };
        }
    })
    .await
}

/// Take over the local NVMe controller at PCI address `bdf` (`0000:01:00.0`, bound to
/// vfio-pci), creating bdevs `<ctrlr>n<nsid>`. Needs the runtime started with PCI enabled.
pub async fn attach_pcie(ctrlr: &str, bdf: &str) -> Result<Vec<String>> {
    let valid = bdf.len() == 12
        && bdf.char_indices().all(|(i, c)| match i {
            4 | 7 => c == ':',
            10 => c == '.',
            _ => c.is_ascii_hexdigit(),
        });
    if !valid {
        return Err(SpdkError::InvalidArgument {
            field: "pci_address",
            reason: format!("{bdf:?} is not a PCI address like 0000:01:00.0"),
        });
    }
    attach(
        ctrlr,
        format!("trtype:PCIe traddr:{bdf}"),
        "",
        AttachOpts::default().timeouts()?,
        &HostKeys::default(),
        false,
    )
    .await
}

/// `timeouts`: checked by the caller. `multipath`: add a path to the controller `ctrlr`
/// (active-passive) instead of failing when the name is taken.
async fn attach(
    ctrlr: &str,
    trid: String,
    hostnqn: &str,
    timeouts: Timeouts,
    keys: &HostKeys,
    multipath: bool,
) -> Result<Vec<String>> {
    let key_names = keys.c_names()?;
    let (ctrlr, hostnqn) = (ctrlr.to_string(), hostnqn.to_string());
    let address = trid.clone();
    exec(move |reply| {
        let prepared = (|| -> Result<_> {
            let spec = cstr("address", &trid)?;
            let base = cstr("ctrlr", &ctrlr)?;
            let host = cstr("hostnqn", &hostnqn)?;
            if hostnqn.len() > 223 {
                return Err(SpdkError::InvalidArgument {
                    field: "hostnqn",
                    reason: "longer than 223 bytes".into(),
                });
            }
            Ok((spec, base, host))
        })();
        let (spec, base, host) = match prepared {
            Ok(p) => p,
            Err(e) => return reply.send(Err(e)),
        };
        // SAFETY: zeroed structs are valid inputs for the parser and the defaults init.
        let mut trid: spdk_sys::spdk_nvme_transport_id = unsafe { std::mem::zeroed() };
        // SAFETY: `trid` writable; `spec` valid.
        let rc = unsafe { spdk_sys::spdk_nvme_transport_id_parse(&mut trid, spec.as_ptr()) };
        if rc != 0 {
            return reply.send(Err(SpdkError::errno("parse transport id", address, rc)));
        }
        // SAFETY: as above.
        let mut drv: spdk_sys::spdk_nvme_ctrlr_opts = unsafe { std::mem::zeroed() };
        // SAFETY: `drv` writable and of the size passed.
        unsafe {
            spdk_sys::spdk_nvme_ctrlr_get_default_ctrlr_opts(
                &mut drv,
                std::mem::size_of::<spdk_sys::spdk_nvme_ctrlr_opts>(),
            )
        };
        if !host.as_bytes().is_empty() {
            for (dst, src) in drv.hostnqn.iter_mut().zip(host.as_bytes_with_nul()) {
                *dst = *src as c_char;
            }
        }
        let admin_ms = ADMIN_TIMEOUT_MS.load(std::sync::atomic::Ordering::Relaxed);
        if admin_ms > 0 {
            drv.admin_timeout_ms = u32::try_from(admin_ms).unwrap_or(u32::MAX);
        }
        // SAFETY: as above.
        let mut bopts: spdk_sys::spdk_bdev_nvme_ctrlr_opts = unsafe { std::mem::zeroed() };
        // SAFETY: `bopts` writable.
        unsafe { spdk_sys::spdk_bdev_nvme_get_default_ctrlr_opts(&mut bopts) };
        bopts.reconnect_delay_sec = timeouts.reconnect_delay_sec;
        bopts.ctrlr_loss_timeout_sec = timeouts.ctrlr_loss_timeout_sec;
        bopts.fast_io_fail_timeout_sec = timeouts.fast_io_fail_timeout_sec;
        if let Some(ms) = timeouts.keep_alive_ms
            && let Err(e) = set_keep_alive(ms)
        {
            return reply.send(Err(e));
        }
        if multipath {
            bopts.multipath = true;
            bopts.multipath_policy = spdk_sys::SPDK_BDEV_NVME_MULTIPATH_POLICY_ACTIVE_PASSIVE as u8;
        }
        bopts.dhchap_key = ptr_or_null(&key_names[0]);
        bopts.dhchap_ctrlr_key = ptr_or_null(&key_names[1]);
        bopts.psk = ptr_or_null(&key_names[2]);
        let mut a = Box::new(Attach {
            names: vec![std::ptr::null(); 32],
            _strings: (base, host),
            _keys: key_names,
            ctrlr: format!("{ctrlr} at {address}"),
            reply,
        });
        let names = a.names.as_mut_ptr();
        let base_ptr = a._strings.0.as_ptr();
        let arg = Box::into_raw(a).cast::<c_void>();
        // SAFETY: on the reactor; `trid`, `drv` and `bopts` are copied during the call; the
        // names array lives in `arg`, which SPDK owns until `attached` runs once.
        let rc = unsafe {
            spdk_sys::spdk_bdev_nvme_create(
                &mut trid,
                base_ptr,
                names,
                32,
                Some(attached),
                arg,
                &mut drv,
                &mut bopts,
            )
        };
        if rc != 0 {
            // SAFETY: SPDK refused the call and never took `arg`: answered here, once.
            unsafe { attached(arg, 0, rc) };
        }
    })
    .await
}

/// Make `ms` the keep-alive timeout of SPDK's NVMe controllers (one value for all of them,
/// which `spdk_bdev_nvme_create` copies into each); on the reactor.
fn set_keep_alive(ms: u32) -> Result<()> {
    // SAFETY: a zeroed options struct is a valid buffer for the getter, which fills it.
    let mut o: spdk_sys::spdk_bdev_nvme_opts = unsafe { std::mem::zeroed() };
    // SAFETY: on the reactor; `o` is writable and of the size passed.
    unsafe { spdk_sys::spdk_bdev_nvme_get_opts(&mut o, std::mem::size_of_val(&o)) };
    if o.keep_alive_timeout_ms == ms {
        return Ok(());
    }
    let now = o.keep_alive_timeout_ms;
    o.keep_alive_timeout_ms = ms;
    // SAFETY: on the reactor; `o` was filled by the getter and is copied by the call.
    let rc = unsafe { spdk_sys::spdk_bdev_nvme_set_opts(&o) };
    match rc {
        0 => Ok(()),
        rc if rc == -libc_errno::EPERM => Err(SpdkError::InvalidArgument {
            field: "keep_alive_timeout",
            reason: format!(
                "{ms} ms: SPDK applies one keep-alive timeout ({now} ms now) to every NVMe controller and changes it only while none is attached"
            ),
        }),
        rc => Err(SpdkError::errno(
            "set the NVMe keep-alive timeout",
            format!("{ms} ms"),
            rc,
        )),
    }
}

/// [`IoTimeouts::admin`] in milliseconds (0: none), for the controllers attached from now on.
static ADMIN_TIMEOUT_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Deadlines of the NVMe controllers' commands ([`set_io_timeouts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoTimeouts {
    /// An I/O command without an answer for this long resets its controller; `None`: wait.
    pub io: Option<Duration>,
    /// The same for admin commands, keep-alives included (needs `io`); `None`: wait. Also
    /// how long the controllers attached from now on wait for SPDK's synchronous admin
    /// commands (SPDK's `admin_timeout_ms`, 30 s by default), which hold the reactor while
    /// they wait: the status read after an I/O deadline passed is one, so with a silent
    /// target each I/O deadline would otherwise stall every volume of the node for 30 s.
    pub admin: Option<Duration>,
    /// The TCP connection of every NVMe/TCP controller: data unacknowledged this long closes
    /// it (`TCP_USER_TIMEOUT`, SPDK's `transport_ack_timeout`, rounded up to a power of two
    /// milliseconds), and a (re)connect that has not completed this long fails (SPDK's
    /// `tcp_connect_timeout_ms`). Without it a peer that vanished (a link down) holds the
    /// controller's reset in a connect that the kernel retries for many seconds, and the
    /// queued I/O with it, although `fast_io_fail_timeout` is shorter. `None`: the kernel's.
    pub transport: Option<Duration>,
}

/// Reset a controller whose command (I/O, or admin with `admin`) got no answer in time:
/// SPDK's `timeout_us`, `timeout_admin_us` and `action_on_timeout = reset`, for every NVMe
/// controller of this SPDK (set while none is attached: else `EPERM`). A target that vanished
/// without closing the connection (a node powered off, a link down) sends nothing, so
/// without a deadline the I/O waits until TCP gives up (minutes); with one, the controller
/// is reset, its reconnects fail, and [`AttachOpts::fast_io_fail_timeout`] fails the I/O.
/// Both `None`: no deadline (SPDK's default).
pub async fn set_io_timeouts(t: &IoTimeouts) -> Result<()> {
    let us = |what: &'static str, d: Option<Duration>| -> Result<u64> {
        match d {
            None => Ok(0),
            Some(d) if d.is_zero() => Err(SpdkError::InvalidArgument {
                field: what,
                reason: "zero: say None for no deadline".into(),
            }),
            Some(d) => u64::try_from(d.as_micros()).map_err(|_| SpdkError::InvalidArgument {
                field: what,
                reason: format!("{d:?} is too long"),
            }),
        }
    };
    let (io, admin) = (us("io", t.io)?, us("admin", t.admin)?);
    if io == 0 && admin != 0 {
        return Err(SpdkError::InvalidArgument {
            field: "admin",
            reason: "an admin deadline needs an I/O deadline too".into(),
        });
    }
    let (ack_exp, connect_ms) = match t.transport {
        None => (0_u8, 0_u32),
        Some(d) => transport_timeouts(d)?,
    };
    exec(move |reply: Reply<()>| {
        // SAFETY: a zeroed options struct is a valid buffer for the getter, which fills it.
        let mut o: spdk_sys::spdk_bdev_nvme_opts = unsafe { std::mem::zeroed() };
        // SAFETY: on the reactor; `o` is writable and of the size passed.
        unsafe { spdk_sys::spdk_bdev_nvme_get_opts(&mut o, std::mem::size_of_val(&o)) };
        o.timeout_us = io;
        o.timeout_admin_us = admin;
        o.transport_ack_timeout = ack_exp;
        o.tcp_connect_timeout_ms = connect_ms;
        o.action_on_timeout = if io == 0 {
            spdk_sys::SPDK_BDEV_NVME_TIMEOUT_ACTION_NONE
        } else {
            spdk_sys::SPDK_BDEV_NVME_TIMEOUT_ACTION_RESET
        };
        // SAFETY: on the reactor; `o` was filled by the getter and is copied by the call.
        let rc = unsafe { spdk_sys::spdk_bdev_nvme_set_opts(&o) };
        if rc == 0 {
            ADMIN_TIMEOUT_MS.store(admin / 1000, std::sync::atomic::Ordering::Relaxed);
        }
        reply.send(if rc == 0 {
            Ok(())
        } else {
            Err(SpdkError::errno(
                "set the NVMe command deadlines",
                format!("I/O {io} us, admin {admin} us"),
                rc,
            ))
        });
    })
    .await
}

/// [`IoTimeouts::transport`] in SPDK's units: the exponent of the acknowledgement timeout
/// (2^n ms, 1..=31, NVMe/TCP's limit) and the connect deadline in milliseconds.
fn transport_timeouts(d: Duration) -> Result<(u8, u32)> {
    let bad = |reason: String| SpdkError::InvalidArgument {
        field: "transport",
        reason,
    };
    if d < Duration::from_millis(2) {
        return Err(bad(format!(
            "{d:?}: at least 2 ms (zero: say None for the kernel's)"
        )));
    }
    let ms = u32::try_from(d.as_millis()).map_err(|_| bad(format!("{d:?} is too long")))?;
    // The smallest n with 2^n >= ms.
    let exp = 32 - (ms - 1).leading_zeros();
    if exp > 31 {
        return Err(bad(format!("{d:?} is longer than 2^31 ms")));
    }
    Ok((exp as u8, ms))
}

/// Disconnect an attached controller and remove its bdevs; missing = success.
pub async fn detach(ctrlr: &str) -> Result<()> {
    let ctrlr = ctrlr.to_string();
    exec(move |reply: Reply<()>| {
        let c = match cstr("ctrlr", &ctrlr) {
            Ok(c) => c,
            Err(e) => return reply.send(Err(e)),
        };
        let n = ctrlr.clone();
        let ctx = errno_ctx(move |_, rc| {
            reply.send(if rc == 0 || rc == -19 {
                Ok(())
            } else {
                Err(SpdkError::errno("detach controller", n, rc))
            })
        });
        // SAFETY: on the reactor; `ctx` owned by SPDK when rc == 0.
        let rc = unsafe { spdk_sys::liteio_bdev_nvme_detach(c.as_ptr(), Some(errno_cb), ctx) };
        if rc != 0 {
            // SAFETY: SPDK refused the call and never took `ctx`: answered here, once.
            unsafe { errno_cb(ctx, rc) };
        }
    })
    .await
}

/// Give the attached controller `ctrlr` new DH-HMAC-CHAP keys (names in the keyring) and
/// re-authenticate its connections with them, without disconnecting: the host's half of a
/// key rotation, after the target got the new keys. Fails when the target refuses them.
pub async fn set_keys(ctrlr: &str, keys: &HostKeys) -> Result<()> {
    let [host, ctrl, _] = keys.c_names()?;
    let c = cstr("ctrlr", ctrlr)?;
    let name = ctrlr.to_string();
    exec(move |reply: Reply<()>| {
        let ctx = errno_ctx(move |_, rc| {
            reply.send(if rc == 0 {
                Ok(())
            } else {
                Err(SpdkError::errno("re-authenticate controller", name, rc))
            })
        });
        // SAFETY: on the reactor; the names are copied (looked up) during the call; `ctx` is
        // owned by SPDK when rc == 0.
        let rc = unsafe {
            spdk_sys::liteio_bdev_nvme_set_keys(
                c.as_ptr(),
                ptr_or_null(&host),
                ptr_or_null(&ctrl),
                Some(errno_cb),
                ctx,
            )
        };
        if rc != 0 {
            // SAFETY: SPDK refused the call and never took `ctx`: answered here, once.
            unsafe { errno_cb(ctx, rc) };
        }
    })
    .await
}

/// The DH groups this host offers in DH-HMAC-CHAP (all of them by default; the target picks
/// the strongest it also allows). SPDK takes this only while no NVMe controller is attached:
/// otherwise the call fails with EPERM.
pub async fn set_dhchap_dhgroups(groups: &[DhGroup]) -> Result<()> {
    if groups.is_empty() {
        return Err(SpdkError::InvalidArgument {
            field: "dhchap_dhgroups",
            reason: "needs at least one group".into(),
        });
    }
    let mask = DhGroup::mask(groups);
    exec(move |reply: Reply<()>| {
        // SAFETY: a zeroed options struct is a valid buffer for the getter, which fills it.
        let mut o: spdk_sys::spdk_bdev_nvme_opts = unsafe { std::mem::zeroed() };
        // SAFETY: on the reactor; `o` is writable and of the size passed.
        unsafe {
            spdk_sys::spdk_bdev_nvme_get_opts(&mut o, std::mem::size_of_val(&o));
        }
        o.dhchap_dhgroups = mask;
        // SAFETY: on the reactor; `o` was filled by the getter and is copied by the call.
        let rc = unsafe { spdk_sys::spdk_bdev_nvme_set_opts(&o) };
        reply.send(if rc == 0 {
            Ok(())
        } else {
            Err(SpdkError::errno(
                "set the host's DH-HMAC-CHAP groups",
                "bdev_nvme",
                rc,
            ))
        });
    })
    .await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn the_transport_timeout_becomes_a_power_of_two_ack_timeout_and_a_connect_deadline() {
        let ms = Duration::from_millis;
        assert_eq!(transport_timeouts(s(2)).unwrap(), (11, 2000));
        assert_eq!(transport_timeouts(ms(1024)).unwrap(), (10, 1024));
        assert_eq!(transport_timeouts(ms(1025)).unwrap(), (11, 1025));
        assert_eq!(transport_timeouts(ms(2)).unwrap(), (1, 2));
        assert_eq!(transport_timeouts(ms(1 << 31)).unwrap(), (31, 1 << 31));
        for bad in [ms(0), ms(1), ms((1 << 31) + 1), s(u64::MAX)] {
            let e = transport_timeouts(bad).unwrap_err();
            assert!(
                matches!(
                    &e,
                    SpdkError::InvalidArgument {
                        field: "transport",
                        ..
                    }
                ),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn attach_opts_map_to_spdk_as_spdk_checks_them() {
        let t = AttachOpts::default().timeouts().unwrap();
        assert_eq!(
            (
                t.reconnect_delay_sec,
                t.ctrlr_loss_timeout_sec,
                t.fast_io_fail_timeout_sec
            ),
            (0, 0, 0),
            "SPDK's default: no reconnect"
        );
        let t = AttachOpts::raid_member().timeouts().unwrap();
        assert_eq!(
            (
                t.reconnect_delay_sec,
                t.ctrlr_loss_timeout_sec,
                t.fast_io_fail_timeout_sec
            ),
            (1, 30, 2)
        );
        let forever = AttachOpts {
            reconnect_delay: s(2),
            fast_io_fail_timeout: Some(s(5)),
            ctrlr_loss_timeout: None,
            keep_alive_timeout: Some(Duration::from_millis(2500)),
        };
        let t = forever.timeouts().unwrap();
        assert_eq!(t.ctrlr_loss_timeout_sec, -1);
        assert_eq!(t.keep_alive_ms, Some(2500));
        let bad = [
            (
                AttachOpts {
                    reconnect_delay: s(1),
                    ..AttachOpts::default()
                },
                "without reconnecting",
            ),
            (
                AttachOpts {
                    ctrlr_loss_timeout: Some(s(10)),
                    ..AttachOpts::default()
                },
                "needs a reconnect_delay of at least 1 s",
            ),
            (
                AttachOpts {
                    reconnect_delay: s(5),
                    ctrlr_loss_timeout: Some(s(3)),
                    ..AttachOpts::default()
                },
                "reconnect_delay 5s is longer than ctrlr_loss_timeout",
            ),
            (
                AttachOpts {
                    fast_io_fail_timeout: Some(s(1)),
                    reconnect_delay: s(2),
                    ctrlr_loss_timeout: Some(s(10)),
                    keep_alive_timeout: None,
                },
                "fast_io_fail_timeout Some(1s) is shorter than reconnect_delay 2s",
            ),
            (
                AttachOpts {
                    fast_io_fail_timeout: Some(s(40)),
                    ..AttachOpts::raid_member()
                },
                "is longer than ctrlr_loss_timeout",
            ),
            (
                AttachOpts {
                    fast_io_fail_timeout: Some(Duration::from_millis(1500)),
                    ..AttachOpts::raid_member()
                },
                "not a whole number of seconds",
            ),
            (
                AttachOpts {
                    fast_io_fail_timeout: Some(Duration::ZERO),
                    ..AttachOpts::raid_member()
                },
                "say None",
            ),
            (
                AttachOpts {
                    keep_alive_timeout: Some(Duration::ZERO),
                    ..AttachOpts::raid_member()
                },
                "keep_alive_timeout: zero",
            ),
        ];
        for (o, text) in bad {
            let e = o.timeouts().unwrap_err();
            assert!(e.to_string().contains(text), "{o:?}: {e}");
        }
        // The older Reconnect maps to the same: I/O waits while reconnecting.
        let t = reconnect_secs(Some(Reconnect {
            delay: s(1),
            give_up_after: s(60),
        }))
        .unwrap();
        assert_eq!(
            (
                t.reconnect_delay_sec,
                t.ctrlr_loss_timeout_sec,
                t.fast_io_fail_timeout_sec
            ),
            (1, 60, 0)
        );
    }
}
