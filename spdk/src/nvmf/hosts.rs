//! Who may use an export: the allow-list made exact with each host's keys, and the hosts
//! that must go disconnected and waited for, so that a host taken off the list can write
//! nothing more through the subsystem (how an export is fenced off from an old user).

use super::spec::{HostKeys, KeyNames, SubsystemInfo, ptr_or_null};
use super::target::{info, subsystem};
use crate::error::{Result, SpdkError, libc_errno};
use crate::runtime::{Reactor, cstr, errno_cb, errno_ctx, exec_on, on_reactor_with};
use spdk_sys::spdk_nvmf_subsystem;

/// Make the allow-list exactly `hosts`, authenticating with `keys` (live: a removed host's
/// new connections fail, and its existing ones are closed before this returns; a host whose
/// DH-HMAC-CHAP keys change stays connected, and its next connection needs the new keys).
pub async fn set_hosts(nqn: &str, hosts: &[String], keys: &HostKeys) -> Result<SubsystemInfo> {
    set_hosts_with(nqn, hosts, keys, &[]).await
}

/// [`set_hosts`], except that the entries of the hosts in `keyless` get no DH-HMAC-CHAP keys
/// (a host's keys are taken away or given live, as a rotation does).
///
/// SPDK's `remove_host` only refuses a host's new connections: a host already connected
/// keeps its queue pairs and goes on reading and writing. So every host connected to the
/// subsystem that is not in `hosts` (one removed now, or by an earlier call that failed) is
/// disconnected here, and the call returns once its queue pairs are gone, their commands
/// finished or aborted ([`disconnect_host`]): from then on the host can write nothing more
/// through this subsystem. This is how an export is fenced off from an old user (a raid
/// node that lost the volume).
///
/// Errors: [`SpdkError::NotFound`] for no such subsystem; `ETIMEDOUT` when a removed host's
/// queue pairs are not gone within SPDK's 15 s (it is allowed no more; a retry disconnects
/// it again).
pub async fn set_hosts_with(
    nqn: &str,
    hosts: &[String],
    keys: &HostKeys,
    keyless: &[String],
) -> Result<SubsystemInfo> {
    keys.c_names()?;
    let (nqn, hosts, keys, keyless) = (
        nqn.to_string(),
        hosts.to_vec(),
        keys.clone(),
        keyless.to_vec(),
    );
    exec_on(move |r, reply| {
        let removed = (|| -> Result<Vec<String>> {
            let ss = subsystem(r, &nqn)?;
            let all = KeyNames::new(&keys)?;
            let without = all.without_dhchap();
            // SAFETY: `ss` was just returned by the lookup on this thread.
            let cur = unsafe { info(ss) };
            for h in &hosts {
                let c = cstr("hosts", h)?;
                let names = if keyless.contains(h) { &without } else { &all };
                let rc = if cur.hosts.contains(h) {
                    // SAFETY: on the reactor; `ss` live; every string valid or NULL, copied.
                    unsafe {
                        spdk_sys::liteio_nvmf_set_keys(
                            ss,
                            c.as_ptr(),
                            ptr_or_null(&names.0[0]),
                            ptr_or_null(&names.0[1]),
                        )
                    }
                } else {
                    // SAFETY: on the reactor; `ss` live.
                    unsafe { names.add_host(ss, &c) }
                };
                if rc != 0 {
                    return Err(SpdkError::errno("allow host", h.clone(), rc));
                }
            }
            let mut gone: Vec<String> = Vec::new();
            for h in cur.hosts.iter().filter(|h| !hosts.contains(h)) {
                let c = cstr("hosts", h)?;
                // SAFETY: on the reactor; `ss` live.
                let rc = unsafe { spdk_sys::spdk_nvmf_subsystem_remove_host(ss, c.as_ptr()) };
                if rc != 0 && rc != -libc_errno::ENOENT {
                    return Err(SpdkError::errno("remove host", h.clone(), rc));
                }
                gone.push(h.clone());
            }
            // SAFETY: `ss` is still live: nothing on this thread removed it since the lookup.
            for h in unsafe { connected(ss) } {
                if !hosts.contains(&h) && !gone.contains(&h) {
                    gone.push(h);
                }
            }
            Ok(gone)
        })();
        let gone = match removed {
            Ok(g) => g,
            Err(e) => return reply.send(Err(e)),
        };
        let n = nqn.clone();
        disconnect_all(r, nqn, gone, move |r, done| {
            reply.send(done.and_then(|()| {
                let ss = subsystem(r, &n)?;
                // SAFETY: `ss` was just returned by the lookup on this thread.
                Ok(unsafe { info(ss) })
            }))
        });
    })
    .await
}

/// How long SPDK waits for a host's queue pairs to go (0: its default, 15 s).
const DISCONNECT_TIMEOUT_MS: u64 = 0;

/// Disconnect the hosts `hosts` from the subsystem `nqn` one after another, each waited for,
/// then run `then` (with the first error). The subsystem is looked up again for each.
fn disconnect_all(
    r: &Reactor,
    nqn: String,
    mut hosts: Vec<String>,
    then: impl FnOnce(&Reactor, Result<()>) + 'static,
) {
    let Some(h) = hosts.pop() else {
        return then(r, Ok(()));
    };
    let (ss, c) = match (subsystem(r, &nqn), cstr("host", &h)) {
        (Ok(ss), Ok(c)) => (ss, c),
        (Err(e), _) | (_, Err(e)) => return then(r, Err(e)),
    };
    let what = format!("{h} from {nqn}");
    let ctx = errno_ctx(move |r, rc| {
        if rc != 0 {
            return then(r, Err(SpdkError::errno("disconnect host", what, rc)));
        }
        disconnect_all(r, nqn, hosts, then);
    });
    // SAFETY: on the reactor; `ss` was just looked up; SPDK copies the host NQN; `ctx` is
    // owned by SPDK when the call returns 0 (it calls back once the host's queue pairs are
    // gone, or with -ETIMEDOUT).
    let rc = unsafe {
        spdk_sys::spdk_nvmf_subsystem_disconnect_host(
            ss,
            c.as_ptr(),
            Some(errno_cb),
            ctx,
            DISCONNECT_TIMEOUT_MS,
        )
    };
    if rc != 0 {
        // SAFETY: SPDK refused the call and never took `ctx`: it is answered here, once.
        unsafe { errno_cb(ctx, rc) };
    }
}

/// Close every connection (queue pair) of the host `host` to the subsystem `nqn` and wait
/// until they are gone: the host's commands in flight are finished or aborted, and nothing
/// more it sends through them lands. The allow-list is not changed: an allowed host may
/// connect again at once (its initiator reconnects); to fence a host off, take it out of the
/// allow-list ([`set_hosts`] does both). A host with no connection: nothing to do.
///
/// Errors: [`SpdkError::NotFound`] for no such subsystem; `ETIMEDOUT` when the queue pairs
/// are not gone within SPDK's 15 s.
pub async fn disconnect_host(nqn: &str, host: &str) -> Result<()> {
    cstr("host", host)?;
    let (nqn, host) = (nqn.to_string(), host.to_string());
    exec_on(move |r, reply| {
        disconnect_all(r, nqn, vec![host], move |_r, done| reply.send(done));
    })
    .await
}

/// The hosts (NQNs) with a controller on the subsystem `nqn` now, each once. A host being
/// disconnected may be listed a moment longer than its queue pairs live.
pub async fn connected_hosts(nqn: &str) -> Result<Vec<String>> {
    let nqn = nqn.to_string();
    on_reactor_with(move |r| {
        let ss = subsystem(r, &nqn)?;
        // SAFETY: `ss` was just returned by the lookup on this thread.
        Ok(unsafe { connected(ss) })
    })
    .await
}

/// The host NQNs of the controllers of `ss`.
///
/// # Safety
/// On the reactor (the subsystem's thread), `ss` a live subsystem.
unsafe fn connected(ss: *mut spdk_nvmf_subsystem) -> Vec<String> {
    const NQN: usize = spdk_sys::LITEIO_NQN_MAX as usize;
    let mut max = 16usize;
    loop {
        let mut buf = vec![0 as std::ffi::c_char; max * NQN];
        // SAFETY: the caller's contract; `buf` has room for `max` NQNs.
        let n = unsafe {
            spdk_sys::liteio_nvmf_connected_hosts(
                ss,
                buf.as_mut_ptr(),
                i32::try_from(max).unwrap_or(i32::MAX),
            )
        };
        let n = usize::try_from(n).unwrap_or(0);
        if n <= max {
            return buf
                .chunks(NQN)
                .take(n)
                .map(crate::runtime::from_c_array)
                .collect();
        }
        max = n;
    }
}
