//! SPDK's deprecation counters: every deprecated SPDK feature registers itself at process
//! start (`SPDK_LOG_DEPRECATION_REGISTER`) and counts its uses; SPDK logs a warning at the
//! first use and the totals when its application stops (`log_deprecation_hits`). Reading them
//! here lets tests fail on a deprecated call and lets the agent report them.

use std::ffi::{c_int, c_void};

use super::runtime::{from_c, no_unwind};

/// One deprecated SPDK feature and how often this process used it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deprecation {
    /// SPDK's tag, usually the deprecated function's name (`spdk_nvmf_subsystem_create`).
    pub tag: String,
    /// What to use instead, in SPDK's words.
    pub description: String,
    /// The SPDK release that removes it (`v26.09`).
    pub remove_release: String,
    /// Uses since the process started.
    pub hits: u64,
}

/// Every deprecation SPDK registered, with its hits, in registration order.
///
/// The list is fixed once the process has started (SPDK registers deprecations from
/// constructors and never frees them), so this may be called from any thread, with or
/// without a running [`crate::Spdk`]. SPDK threads bump the counters without
/// synchronisation: while SPDK runs, a count read from another thread may lag the last use
/// by a moment; after [`crate::Spdk::stop`] the counts are final.
pub fn deprecations() -> Vec<Deprecation> {
    unsafe extern "C" fn collect(ctx: *mut c_void, dep: *mut spdk_sys::spdk_deprecation) -> c_int {
        no_unwind("deprecations", || {
            // SAFETY: `ctx` is the `Vec` passed below, alive and exclusively ours for the
            // whole iteration; `dep` is a registered deprecation, never freed; the getters
            // return its NUL-terminated fixed-size fields and its counter.
            unsafe {
                let out = &mut *ctx.cast::<Vec<Deprecation>>();
                out.push(Deprecation {
                    tag: from_c(spdk_sys::spdk_deprecation_get_tag(dep)),
                    description: from_c(spdk_sys::spdk_deprecation_get_description(dep)),
                    remove_release: from_c(spdk_sys::spdk_deprecation_get_remove_release(dep)),
                    hits: spdk_sys::spdk_deprecation_get_hits(dep),
                });
            }
        });
        0
    }
    let mut out: Vec<Deprecation> = Vec::new();
    // SAFETY: the iteration walks SPDK's static list (only appended to by constructors,
    // before main) and calls `collect` synchronously with `ctx` = `&mut out`, which outlives
    // the call; `collect` returns 0 so every entry is visited.
    unsafe {
        spdk_sys::spdk_log_for_each_deprecation((&raw mut out).cast::<c_void>(), Some(collect))
    };
    out
}

/// The deprecations this process has used at least once.
pub fn deprecation_hits() -> Vec<Deprecation> {
    deprecations().into_iter().filter(|d| d.hits > 0).collect()
}
