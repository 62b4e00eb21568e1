//! Cross-component test support.
#![forbid(unsafe_code)]

pub mod promtool;
pub mod prop;
