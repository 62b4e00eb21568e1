//! Cross-component test support.
#![forbid(unsafe_code)]
