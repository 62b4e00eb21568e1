//! SPDK's NVMe-oF initiator (`bdev_nvme`): attach a remote subsystem as local bdevs. Used for
//! migration pipes and to test the target end to end.

use std::ffi::{CString, c_char, c_void};

use super::error::{Result, SpdkError};
use super::nvmf::{AnaState, DhGroup, HostKeys, ptr_or_null};
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
/// `<ctrlr>n<nsid>`. Returns their names.
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
    let reconnect = reconnect_secs(reconnect)?;
    attach(
        ctrlr,
        tcp_trid(address, port, subnqn)?,
        hostnqn,
        reconnect,
        keys,
        false,
    )
    .await
}

/// Checked reconnect settings: (seconds between attempts, seconds before giving up).
fn reconnect_secs(reconnect: Option<Reconnect>) -> Result<Option<(u32, i32)>> {
    let Some(r) = reconnect else {
        return Ok(None);
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
    Ok(Some((delay, loss)))
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
    let reconnect = reconnect_secs(reconnect)?;
    attach(
        ctrlr,
        tcp_trid(address, port, subnqn)?,
        hostnqn,
        reconnect,
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
        None,
        &HostKeys::default(),
        false,
    )
    .await
}

/// `reconnect`: (seconds between attempts, seconds before giving up), checked by the caller.
/// `multipath`: add a path to the controller `ctrlr` (active-passive) instead of failing
/// when the name is taken.
async fn attach(
    ctrlr: &str,
    trid: String,
    hostnqn: &str,
    reconnect: Option<(u32, i32)>,
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
        // SAFETY: as above.
        let mut bopts: spdk_sys::spdk_bdev_nvme_ctrlr_opts = unsafe { std::mem::zeroed() };
        // SAFETY: `bopts` writable.
        unsafe { spdk_sys::spdk_bdev_nvme_get_default_ctrlr_opts(&mut bopts) };
        if let Some((delay, loss)) = reconnect {
            // I/O waits (fast_io_fail_timeout_sec 0) while SPDK reconnects.
            bopts.reconnect_delay_sec = delay;
            bopts.ctrlr_loss_timeout_sec = loss;
            bopts.fast_io_fail_timeout_sec = 0;
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
