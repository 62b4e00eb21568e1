//! Being on an SPDK thread: the [`Reactor`] token that proves it, and [`no_unwind`], which
//! every function SPDK calls runs its body in, so that no panic unwinds into C. The ground
//! floor of the runtime: the inbox, the requests and the callback trampolines stand on it.

use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;

use super::health::note_panic;

/// Run `f`, the body of an `extern "C"` function SPDK calls, without letting a panic unwind
/// into C (that would abort the process and every export on the node). A `Reply` dropped
/// by the unwinding answers its caller with [`SpdkError::Panicked`](crate::error::SpdkError::Panicked).
/// Returns what `f` returned, `None` when it panicked.
pub(crate) fn no_unwind<R>(callback: &'static str, f: impl FnOnce() -> R) -> Option<R> {
    let payload = match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => return Some(r),
        Err(payload) => payload,
    };
    note_panic();
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string payload".into());
    tracing::error!(
        callback,
        panic = %message,
        "a panic on the SPDK thread was caught; its request failed and SPDK goes on"
    );
    // Dropping the payload runs foreign code too.
    let _ = std::panic::catch_unwind(AssertUnwindSafe(move || drop(payload)));
    None
}

/// Proof that the code holding it runs on an SPDK thread, inside a request or a completion
/// callback: functions that must run there (lookups by name, reading SPDK objects) take a
/// `&Reactor`. Only the runtime makes one, in the trampolines SPDK calls; it is `!Send` and
/// `!Sync` and handed out by reference for the duration of one call, so it cannot leave the
/// thread or outlive the call.
#[derive(Debug)]
pub struct Reactor {
    _on_spdk_thread: PhantomData<*const ()>,
}

impl Reactor {
    /// # Safety
    /// The caller must be running on an SPDK thread (called by SPDK: a message or a
    /// completion callback), and must lend the token only for the duration of that call.
    pub(super) unsafe fn new() -> Self {
        Self {
            _on_spdk_thread: PhantomData,
        }
    }
}

// `Reactor` must stay `!Send` and `!Sync` (checked at compile time: the trait item below is
// ambiguous, and so an error, as soon as either is implemented).
const _: fn() = || {
    trait AmbiguousIfSendOrSync<A> {
        fn some_item() {}
    }
    impl<T: ?Sized> AmbiguousIfSendOrSync<()> for T {}
    impl<T: ?Sized + Send> AmbiguousIfSendOrSync<u8> for T {}
    impl<T: ?Sized + Sync> AmbiguousIfSendOrSync<u16> for T {}
    let _ = <Reactor as AmbiguousIfSendOrSync<_>>::some_item;
};
