//! Crossing into C: the boxed contexts of SPDK's completion callbacks and the `extern "C"`
//! trampolines that reclaim them exactly once ([`errno_ctx`]/[`errno_cb`] for `(arg, rc)`,
//! [`handle_ctx`]/[`handle_cb`] for `(arg, handle, rc)`), and C strings to and from SPDK.

use std::ffi::{CString, c_char, c_int, c_void};

use super::reactor::{Reactor, no_unwind};
use crate::error::{Result, SpdkError};

type ErrnoFn = Box<dyn FnOnce(&Reactor, i32)>;

/// A context for an SPDK callback of shape `(void *arg, int rc)`: pass the returned pointer as
/// `cb_arg` and [`errno_cb`] as the function. If SPDK rejects the call synchronously and never
/// calls back, reclaim it with [`drop_errno_ctx`] (or answer it with [`errno_cb`]).
pub(crate) fn errno_ctx(f: impl FnOnce(&Reactor, i32) + 'static) -> *mut c_void {
    Box::into_raw(Box::new(Box::new(f) as ErrnoFn)).cast()
}

/// SPDK callback trampoline for [`errno_ctx`]: runs the closure once, catching a panic.
///
/// # Safety
/// `arg` must come from [`errno_ctx`] and not have been passed to `errno_cb` or
/// [`drop_errno_ctx`] before: it is reclaimed here. Called on an SPDK thread.
pub(crate) unsafe extern "C" fn errno_cb(arg: *mut c_void, rc: c_int) {
    no_unwind("errno_cb", || {
        // SAFETY: the caller's contract: `arg` came from `errno_ctx` and is reclaimed once.
        let f = unsafe { Box::from_raw(arg.cast::<ErrnoFn>()) };
        // SAFETY: the caller's contract: on an SPDK thread; the token lives for this call.
        let reactor = unsafe { Reactor::new() };
        f(&reactor, rc);
    });
}

/// Reclaim a context SPDK did not take, without running it (its `Reply`, if any, answers
/// [`SpdkError::NotRunning`]).
///
/// # Safety
/// `arg` must come from [`errno_ctx`], SPDK must not hold it (the call that was given it
/// failed and will not call back), and it must not be reclaimed again.
pub(crate) unsafe fn drop_errno_ctx(arg: *mut c_void) {
    no_unwind("drop_errno_ctx", || {
        // SAFETY: the caller's contract: `arg` is ours and reclaimed once.
        drop(unsafe { Box::from_raw(arg.cast::<ErrnoFn>()) });
    });
}

type HandleFn<H> = Box<dyn FnOnce(&Reactor, *mut H, i32)>;

/// A context for an SPDK callback of shape `(void *arg, T *handle, int rc)`.
pub(crate) fn handle_ctx<H: 'static>(
    f: impl FnOnce(&Reactor, *mut H, i32) + 'static,
) -> *mut c_void {
    Box::into_raw(Box::new(Box::new(f) as HandleFn<H>)).cast()
}

/// SPDK callback trampoline for [`handle_ctx`]: runs the closure once, catching a panic.
///
/// # Safety
/// `arg` must come from [`handle_ctx::<H>`] and not have been reclaimed before; `handle` is
/// NULL or a live `H` for the duration of the call. Called on an SPDK thread.
pub(crate) unsafe extern "C" fn handle_cb<H: 'static>(arg: *mut c_void, handle: *mut H, rc: c_int) {
    no_unwind("handle_cb", || {
        // SAFETY: the caller's contract: `arg` came from `handle_ctx::<H>`, reclaimed once.
        let f = unsafe { Box::from_raw(arg.cast::<HandleFn<H>>()) };
        // SAFETY: the caller's contract: on an SPDK thread; the token lives for this call.
        let reactor = unsafe { Reactor::new() };
        f(&reactor, handle, rc);
    });
}

/// A C string for SPDK, or an error naming the field when `s` holds a NUL.
pub(crate) fn cstr(field: &'static str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| SpdkError::InvalidArgument {
        field,
        reason: format!("{s:?} contains a NUL byte"),
    })
}

/// A Rust string from a C string SPDK owns (empty for NULL).
pub(crate) fn from_c(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: SPDK returns NUL-terminated strings that live at least as long as the object
    // they describe, which is alive during this call on the reactor.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// A Rust string from a fixed-size C char array.
pub(crate) fn from_c_array(a: &[c_char]) -> String {
    let bytes: Vec<u8> = a
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
