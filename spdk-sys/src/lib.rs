//! Raw FFI bindings to SPDK 26.05 and LiteIO's C shim, generated at build time by bindgen.
//! Nothing here is safe to call without reading SPDK's documentation of the function: the
//! safe wrappers live in the `liteio-spdk` crate. Built only with the `link` feature.
#![allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code
)]
#![allow(
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]
#![allow(
    unsafe_op_in_unsafe_fn,
    missing_docs,
    improper_ctypes,
    unnecessary_transmutes
)]

#[cfg(feature = "link")]
include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
