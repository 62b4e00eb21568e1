//! Block I/O through SPDK's bdev layer: diagnostics, data checks in tests, and the engine's
//! own small reads and writes. Not a data path (the data path is the NVMe-oF target).

use std::ffi::c_void;

use super::error::{Result, SpdkError};
use super::runtime::{Reply, cstr, exec, no_unwind};

struct Io {
    desc: *mut spdk_sys::spdk_bdev_desc,
    ch: *mut spdk_sys::spdk_io_channel,
    buf: *mut c_void,
    len: usize,
    write: bool,
    name: String,
    reply: Reply<Vec<u8>>,
}

impl Io {
    /// Release everything; must run on the thread that opened the bdev.
    fn finish(self, result: Result<()>) {
        let data = if result.is_ok() && !self.write {
            // SAFETY: `buf` holds `len` bytes SPDK finished writing into.
            unsafe { std::slice::from_raw_parts(self.buf.cast::<u8>(), self.len) }.to_vec()
        } else {
            Vec::new()
        };
        // SAFETY: the I/O completed (or never started); channel and descriptor were opened on
        // this thread and are released exactly once here, then the DMA buffer.
        unsafe {
            if !self.ch.is_null() {
                spdk_sys::spdk_put_io_channel(self.ch);
            }
            if !self.desc.is_null() {
                spdk_sys::spdk_bdev_close(self.desc);
            }
            spdk_sys::spdk_dma_free(self.buf);
        }
        self.reply.send(result.map(|()| data));
    }
}

/// Completion of one read or write.
///
/// # Safety
/// `arg` must be a `Box<Io>` leaked by [`submit`] for this I/O, reclaimed here once;
/// `bdev_io` is the completed I/O, freed here once.
unsafe extern "C" fn io_done(
    bdev_io: *mut spdk_sys::spdk_bdev_io,
    success: bool,
    arg: *mut c_void,
) {
    no_unwind("io_done", || {
        // SAFETY: the caller's contract: `bdev_io` is the completed I/O; freed once here.
        unsafe { spdk_sys::spdk_bdev_free_io(bdev_io) };
        // SAFETY: the caller's contract: `arg` is our `Io`, reclaimed once.
        let io = unsafe { Box::from_raw(arg.cast::<Io>()) };
        let result = if success {
            Ok(())
        } else {
            Err(SpdkError::errno(
                if io.write { "write" } else { "read" },
                io.name.clone(),
                -5,
            ))
        };
        io.finish(result);
    });
}

extern "C" fn ignore_event(
    _t: spdk_sys::spdk_bdev_event_type,
    _b: *mut spdk_sys::spdk_bdev,
    _ctx: *mut c_void,
) {
    // Nothing that can panic: the descriptor lives only for one I/O.
}

async fn submit(name: &str, offset: u64, data: Option<Vec<u8>>, len: usize) -> Result<Vec<u8>> {
    if len == 0 {
        return Err(SpdkError::InvalidArgument {
            field: "len",
            reason: "must be positive".into(),
        });
    }
    let name = name.to_string();
    exec(move |reply| {
        let c = match cstr("bdev", &name) {
            Ok(c) => c,
            Err(e) => return reply.send(Err(e)),
        };
        // SAFETY: DMA-able memory from SPDK's allocator; checked for NULL below.
        let buf = unsafe { spdk_sys::spdk_dma_zmalloc(len, 4096, std::ptr::null_mut()) };
        if buf.is_null() {
            return reply.send(Err(SpdkError::errno("allocate buffer", name, -12)));
        }
        let write = data.is_some();
        if let Some(d) = &data {
            // SAFETY: `buf` has `len` bytes and `d` has `len` bytes (checked by the callers).
            unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), buf.cast::<u8>(), len) };
        }
        let mut io = Io {
            desc: std::ptr::null_mut(),
            ch: std::ptr::null_mut(),
            buf,
            len,
            write,
            name: name.clone(),
            reply,
        };
        // SAFETY: on an SPDK thread; `io.desc` receives the descriptor.
        let rc = unsafe {
            spdk_sys::spdk_bdev_open_ext(
                c.as_ptr(),
                write,
                Some(ignore_event),
                std::ptr::null_mut(),
                &mut io.desc,
            )
        };
        if rc != 0 {
            io.desc = std::ptr::null_mut();
            let e = if rc == -19 {
                SpdkError::NotFound { kind: "bdev", name }
            } else {
                SpdkError::errno("open bdev", name, rc)
            };
            return io.finish(Err(e));
        }
        // SAFETY: `desc` is open on this thread.
        io.ch = unsafe { spdk_sys::spdk_bdev_get_io_channel(io.desc) };
        if io.ch.is_null() {
            return io.finish(Err(SpdkError::errno("get io channel", name, -12)));
        }
        let (desc, ch) = (io.desc, io.ch);
        let arg = Box::into_raw(Box::new(io)).cast::<c_void>();
        // SAFETY: `desc`/`ch` are open on this thread; `buf` stays valid until `io_done`,
        // which owns `arg` once the submission succeeds.
        let rc = unsafe {
            if write {
                spdk_sys::spdk_bdev_write(desc, ch, buf, offset, len as u64, Some(io_done), arg)
            } else {
                spdk_sys::spdk_bdev_read(desc, ch, buf, offset, len as u64, Some(io_done), arg)
            }
        };
        if rc != 0 {
            // SAFETY: the submission failed, so `arg` was not taken.
            let io = unsafe { Box::from_raw(arg.cast::<Io>()) };
            let e = SpdkError::errno(
                if write { "submit write" } else { "submit read" },
                io.name.clone(),
                rc,
            );
            io.finish(Err(e));
        }
    })
    .await
}

/// Write `data` at byte `offset` of a bdev (both multiples of its block size).
pub async fn write_at(bdev: &str, offset: u64, data: Vec<u8>) -> Result<()> {
    let len = data.len();
    submit(bdev, offset, Some(data), len).await.map(|_| ())
}

/// Read `len` bytes at byte `offset` of a bdev (both multiples of its block size).
pub async fn read_at(bdev: &str, offset: u64, len: usize) -> Result<Vec<u8>> {
    submit(bdev, offset, None, len).await
}

/// A descriptor and I/O channel of a bdev held open on SPDK's application thread (where
/// this module's I/O runs) for as long as the value lives. SPDK hands out one channel per
/// thread and bdev, so [`read_at`] and [`write_at`] on the same bdev share it instead of
/// opening and closing one per I/O: what a long-lived consumer (the NVMe-oF target's poll
/// group) does, and what a bdev's QoS needs to stay bound to its channel between I/Os.
/// Released on drop (on the application thread; a no-op when SPDK has stopped).
#[derive(Debug)]
pub struct HeldChannel {
    /// `*mut spdk_bdev_desc` and `*mut spdk_io_channel`, only ever used on the application
    /// thread.
    desc: usize,
    ch: usize,
}

/// Opens `name` and holds a channel to it (see [`HeldChannel`]).
pub async fn hold_channel(name: &str) -> Result<HeldChannel> {
    let name = name.to_string();
    exec(move |reply| {
        let c = match cstr("bdev", &name) {
            Ok(c) => c,
            Err(e) => return reply.send(Err(e)),
        };
        let mut desc: *mut spdk_sys::spdk_bdev_desc = std::ptr::null_mut();
        // SAFETY: on an SPDK thread; `desc` receives the descriptor.
        let rc = unsafe {
            spdk_sys::spdk_bdev_open_ext(
                c.as_ptr(),
                true,
                Some(ignore_event),
                std::ptr::null_mut(),
                &mut desc,
            )
        };
        if rc != 0 {
            return reply.send(Err(if rc == -19 {
                SpdkError::NotFound { kind: "bdev", name }
            } else {
                SpdkError::errno("open bdev", name, rc)
            }));
        }
        // SAFETY: `desc` is open on this thread.
        let ch = unsafe { spdk_sys::spdk_bdev_get_io_channel(desc) };
        if ch.is_null() {
            // SAFETY: opened above on this thread, closed once.
            unsafe { spdk_sys::spdk_bdev_close(desc) };
            return reply.send(Err(SpdkError::errno("get io channel", name, -12)));
        }
        reply.send(Ok(HeldChannel {
            desc: desc as usize,
            ch: ch as usize,
        }));
    })
    .await
}

impl Drop for HeldChannel {
    fn drop(&mut self) {
        let (desc, ch) = (self.desc, self.ch);
        let _ = super::runtime::send_task(Box::new(move |_r| {
            no_unwind("release held channel", || {
                // SAFETY: on the application thread, where `hold_channel` opened both; this
                // value owned them and is dropped once, so they are released exactly once.
                unsafe {
                    spdk_sys::spdk_put_io_channel(ch as *mut spdk_sys::spdk_io_channel);
                    spdk_sys::spdk_bdev_close(desc as *mut spdk_sys::spdk_bdev_desc);
                }
            });
        }));
    }
}
