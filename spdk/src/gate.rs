//! The gate: a pass-through bdev of LiteIO's own bdev module (`liteio_gate`, in the C shim)
//! in front of an exported volume, and the copy engine of hot migration that runs in it.
//!
//! A gate claims its base bdev (an lvol) and forwards every I/O. [`start_copy`] attaches a
//! mirror bdev (the destination volume, typically attached over NVMe/TCP): from then on
//! writes, write-zeroes and unmaps go to both and complete when both did, and a copy pass
//! moves the base's data to the mirror chunk by chunk, each chunk quiesced on the gate while
//! it is read and written. When the pass ends without error the mirror is *in step*: it
//! equals the base and stays so while writes are mirrored, until [`finish`] (after the
//! switch-over) or [`cancel_copy`] detaches it. See `docs/migration.md` for why the result
//! is exact.

use std::time::Duration;

use tokio::sync::oneshot;

use super::bdev::bdev_by_name;
use super::error::{Result, SpdkError, libc_errno};
use super::runtime::{Reactor, cstr, errno_cb, errno_ctx, exec_on, from_c_array, on_reactor_with};

/// Product name of gate bdevs.
pub const GATE_PRODUCT: &str = "LiteIO gate";
/// Suffix of a gate's name after its base bdev's name.
pub const GATE_SUFFIX: &str = "-gate";

/// Options of a copy pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyOptions {
    /// Bytes per chunk, a multiple of the block size.
    pub chunk_bytes: u64,
    /// Chunks in flight (1 to 32).
    pub queue_depth: u32,
}

impl Default for CopyOptions {
    fn default() -> Self {
        Self {
            chunk_bytes: 1 << 20,
            queue_depth: 4,
        }
    }
}

/// Where a gate's mirror and copy pass stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CopyState {
    /// No copy was ever started on this gate.
    Idle,
    /// The mirror is being attached.
    Starting,
    /// The copy pass runs; writes are mirrored.
    Copying,
    /// The pass is over and writes are mirrored: the mirror equals the base.
    InStep,
    /// Cancelled; the mirror is being detached.
    Stopping,
    /// Cancelled; the mirror is detached.
    Cancelled,
    /// The copy or a mirrored write failed; the mirror is (being) detached.
    Failed,
    /// Was in step, then the mirror was detached by [`finish`].
    Finished,
}

impl CopyState {
    fn from_c(v: u32) -> Self {
        match v {
            spdk_sys::LITEIO_COPY_STARTING => Self::Starting,
            spdk_sys::LITEIO_COPY_COPYING => Self::Copying,
            spdk_sys::LITEIO_COPY_IN_STEP => Self::InStep,
            spdk_sys::LITEIO_COPY_STOPPING => Self::Stopping,
            spdk_sys::LITEIO_COPY_CANCELLED => Self::Cancelled,
            spdk_sys::LITEIO_COPY_FAILED => Self::Failed,
            spdk_sys::LITEIO_COPY_FINISHED => Self::Finished,
            _ => Self::Idle,
        }
    }
}

/// Counters of a gate's last copy pass, readable at any time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyProgress {
    /// The gate's name.
    pub gate: String,
    /// Its base bdev.
    pub base: String,
    /// Where the pass stands.
    pub state: CopyState,
    /// The errno the pass failed with (negative), 0 otherwise.
    pub status: i32,
    /// A mirror is attached.
    pub mirror_attached: bool,
    /// Size of the volume when the pass started.
    pub size_bytes: u64,
    /// How far the pass has looked (holes of a thin volume are skipped).
    pub scanned_bytes: u64,
    /// Bytes read from the base and written to the mirror by the pass.
    pub copied_bytes: u64,
    /// Writes (and write-zeroes, unmaps) the mirror completed besides the base.
    pub mirrored_writes: u64,
    /// Writes the mirror failed (any breaks the mirror).
    pub mirror_errors: u64,
    /// Time from the start to the end of the pass (until now while it runs).
    pub elapsed: Duration,
}

impl CopyProgress {
    /// Copy throughput of the pass so far, in MiB/s.
    pub fn mib_per_s(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s <= 0.0 {
            return 0.0;
        }
        self.copied_bytes as f64 / f64::from(1u32 << 20) / s
    }
}

/// The name of the gate over the bdev named `base_bdev` (its real name, not an alias).
pub fn gate_name(base_bdev: &str) -> String {
    format!("{base_bdev}{GATE_SUFFIX}")
}

fn progress_by_name(_r: &Reactor, gate: &str) -> Result<CopyProgress> {
    let c = cstr("gate", gate)?;
    let mut p = spdk_sys::liteio_copy_progress::default();
    // SAFETY: on the reactor (the token); `c` and `p` outlive the call, which fills `p`.
    let rc = unsafe { spdk_sys::liteio_gate_progress(c.as_ptr(), &mut p) };
    if rc != 0 {
        return Err(not_found_or(rc, "read gate progress", gate));
    }
    Ok(CopyProgress {
        gate: gate.to_string(),
        base: from_c_array(&p.base),
        state: CopyState::from_c(p.state),
        status: p.status,
        mirror_attached: p.mirror_attached,
        size_bytes: p.size_bytes,
        scanned_bytes: p.scanned_bytes,
        copied_bytes: p.copied_bytes,
        mirrored_writes: p.mirrored_writes,
        mirror_errors: p.mirror_errors,
        elapsed: Duration::from_micros(p.elapsed_us),
    })
}

fn not_found_or(rc: i32, op: &'static str, gate: &str) -> SpdkError {
    if rc == -libc_errno::ENODEV {
        SpdkError::NotFound {
            kind: "gate",
            name: gate.into(),
        }
    } else {
        SpdkError::errno(op, gate, rc)
    }
}

/// Put a gate in front of the bdev `base` (a name or an alias, e.g. `lvs/lvol`) and return
/// the gate's name (`<base bdev name>-gate`). Idempotent: an existing gate over `base` is
/// returned as it is. Fails when another module claimed `base` (an lvol can have one gate).
pub async fn create_gate(base: &str) -> Result<String> {
    let base = base.to_string();
    on_reactor_with(move |r| {
        let b = bdev_by_name(r, &base)?;
        // SAFETY: `b` was just returned by the lookup on this thread.
        let real = super::runtime::from_c(unsafe { spdk_sys::spdk_bdev_get_name(b) });
        let name = gate_name(&real);
        if progress_by_name(r, &name).is_ok_and(|p| p.base == real) {
            return Ok(name);
        }
        let c = cstr("base", &real)?;
        let mut out = [0 as std::ffi::c_char; spdk_sys::LITEIO_NAME_MAX as usize];
        // SAFETY: on the reactor; `c` and `out` outlive the call, which writes at most
        // `out.len()` bytes (NUL included) into `out`.
        let rc = unsafe { spdk_sys::liteio_gate_create(c.as_ptr(), out.as_mut_ptr(), out.len()) };
        if rc != 0 {
            return Err(SpdkError::errno("create gate over", real, rc));
        }
        Ok(from_c_array(&out))
    })
    .await
}

/// The gate over `base` (a name or an alias), if there is one.
pub async fn gate_of(base: &str) -> Result<Option<String>> {
    let base = base.to_string();
    on_reactor_with(move |r| {
        let b = match bdev_by_name(r, &base) {
            Ok(b) => b,
            Err(SpdkError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        // SAFETY: `b` was just returned by the lookup on this thread.
        let real = super::runtime::from_c(unsafe { spdk_sys::spdk_bdev_get_name(b) });
        let name = gate_name(&real);
        Ok(progress_by_name(r, &name).ok().map(|_| name))
    })
    .await
}

/// Remove a gate (its base stays); a copy pass in flight is cancelled first. Missing =
/// success. Whoever exports the gate must stop first: the gate goes once nobody has it open.
pub async fn delete_gate(gate: &str) -> Result<()> {
    let gate = gate.to_string();
    exec_on(move |_r, reply| {
        let c = match cstr("gate", &gate) {
            Ok(c) => c,
            Err(e) => return reply.send(Err(e)),
        };
        let n = gate.clone();
        let ctx = errno_ctx(move |_, rc| {
            reply.send(if rc == 0 || rc == -libc_errno::ENODEV {
                Ok(())
            } else {
                Err(SpdkError::errno("delete gate", n, rc))
            })
        });
        // SAFETY: on the reactor; SPDK owns `ctx` when the call returns 0.
        let rc = unsafe { spdk_sys::liteio_gate_delete(c.as_ptr(), Some(errno_cb), ctx) };
        if rc != 0 {
            // SAFETY: the call failed and never took `ctx`: answered here, once.
            unsafe { errno_cb(ctx, rc) };
        }
    })
    .await
}

/// A copy pass in flight; [`CopyHandle::wait`] gives its outcome. Dropping it does not stop
/// the pass (see [`cancel_copy`]).
#[derive(Debug)]
pub struct CopyHandle {
    gate: String,
    done: oneshot::Receiver<Result<CopyProgress>>,
}

impl CopyHandle {
    /// The gate copying.
    pub fn gate(&self) -> &str {
        &self.gate
    }

    /// Wait for the pass to end: `Ok` once the mirror is in step (it stays attached and
    /// mirrored), or the error it ended with (the mirror is detached by then). No deadline:
    /// a pass takes as long as the volume needs; callers put their own around it.
    pub async fn wait(self) -> Result<CopyProgress> {
        self.done.await.map_err(|_| SpdkError::NotRunning)?
    }
}

/// Attach `mirror` (a bdev at least as large as the gate, of the same block size, that no
/// one else writes) to `gate` and start the copy pass. Returns once the pass started. A
/// thin lvol that is not a clone has its holes skipped (the mirror must read zeroes there,
/// e.g. a fresh thin lvol); anything else is copied whole.
pub async fn start_copy(gate: &str, mirror: &str, opts: CopyOptions) -> Result<CopyHandle> {
    if opts.queue_depth == 0 || opts.queue_depth > 32 {
        return Err(SpdkError::InvalidArgument {
            field: "queue_depth",
            reason: format!("{} is not within 1-32", opts.queue_depth),
        });
    }
    if opts.chunk_bytes == 0 || opts.chunk_bytes > 16 << 20 {
        return Err(SpdkError::InvalidArgument {
            field: "chunk_bytes",
            reason: format!("{} is not within 1 B - 16 MiB", opts.chunk_bytes),
        });
    }
    let (gate, mirror) = (gate.to_string(), mirror.to_string());
    let (done_tx, done_rx) = oneshot::channel();
    let handle_gate = gate.clone();
    exec_on(move |r, reply| {
        let started = (|| -> Result<()> {
            let p = progress_by_name(r, &gate)?;
            let base = bdev_by_name(r, &p.base)?;
            let mut info = spdk_sys::liteio_lvol_info::default();
            // SAFETY: `base` was just returned by the lookup on this thread; `info` is
            // written by the call.
            let is_lvol = unsafe { spdk_sys::liteio_bdev_lvol_info(base, &mut info) };
            let skip_holes = is_lvol && info.thin && !info.clone && info.parent[0] == 0;
            let (cg, cm) = (cstr("gate", &gate)?, cstr("mirror", &mirror)?);
            let c_opts = spdk_sys::liteio_copy_opts {
                chunk_bytes: opts.chunk_bytes,
                queue_depth: opts.queue_depth,
                skip_holes,
            };
            let g = gate.clone();
            let ctx = errno_ctx(move |r, rc| {
                let result = if rc == 0 {
                    progress_by_name(r, &g)
                } else {
                    Err(SpdkError::errno("copy to the mirror of", g, rc))
                };
                let _ = done_tx.send(result);
            });
            // SAFETY: on the reactor; the strings and options outlive the call; SPDK owns
            // `ctx` when it returns 0 and calls back exactly once.
            let rc = unsafe {
                spdk_sys::liteio_gate_start_copy(
                    cg.as_ptr(),
                    cm.as_ptr(),
                    &c_opts,
                    Some(errno_cb),
                    ctx,
                )
            };
            if rc != 0 {
                // SAFETY: the call failed and never took `ctx`; reclaimed here, once.
                unsafe { super::runtime::drop_errno_ctx(ctx) };
                return Err(match rc {
                    -19 => SpdkError::NotFound {
                        kind: "gate or mirror bdev",
                        name: format!("{gate} / {mirror}"),
                    },
                    -16 => SpdkError::InvalidArgument {
                        field: "gate",
                        reason: format!("{gate} already has a mirror"),
                    },
                    -22 => SpdkError::InvalidArgument {
                        field: "mirror",
                        reason: format!(
                            "{mirror} has another block size, is smaller than {gate}, or is its own base"
                        ),
                    },
                    rc => SpdkError::errno("start copy to", mirror, rc),
                });
            }
            Ok(())
        })();
        reply.send(started);
    })
    .await?;
    Ok(CopyHandle {
        gate: handle_gate,
        done: done_rx,
    })
}

/// The counters of the gate's last copy pass.
pub async fn copy_progress(gate: &str) -> Result<CopyProgress> {
    let gate = gate.to_string();
    on_reactor_with(move |r| progress_by_name(r, &gate)).await
}

async fn stop_mirror(gate: &str, require_in_step: bool) -> Result<CopyProgress> {
    let gate = gate.to_string();
    exec_on(move |_r, reply| {
        let c = match cstr("gate", &gate) {
            Ok(c) => c,
            Err(e) => return reply.send(Err(e)),
        };
        let g = gate.clone();
        let ctx = errno_ctx(move |r, rc| {
            reply.send(match rc {
                0 => progress_by_name(r, &g),
                -11 => Err(SpdkError::InvalidArgument {
                    field: "gate",
                    reason: format!("{g} is not in step with its mirror"),
                }),
                rc => Err(not_found_or(rc, "detach the mirror of", &g)),
            })
        });
        // SAFETY: on the reactor; SPDK owns `ctx` when the call returns 0.
        let rc = unsafe {
            spdk_sys::liteio_gate_stop_mirror(c.as_ptr(), require_in_step, Some(errno_cb), ctx)
        };
        if rc != 0 {
            // SAFETY: the call failed and never took `ctx`: answered here, once.
            unsafe { errno_cb(ctx, rc) };
        }
    })
    .await
}

/// Cancel the copy pass (its [`CopyHandle::wait`] fails), or stop mirroring when it ended
/// in step: mirrored writes in flight finish, the mirror is detached, and the source goes
/// on serving. Returns the final counters. No mirror = success.
pub async fn cancel_copy(gate: &str) -> Result<CopyProgress> {
    stop_mirror(gate, false).await
}

/// Detach a mirror that is in step (the copy pass ended and every write since was
/// mirrored), after the switch-over to it. Refused unless in step.
pub async fn finish(gate: &str) -> Result<CopyProgress> {
    stop_mirror(gate, true).await
}
