//! LiteIO controller.
#![forbid(unsafe_code)]
