//! LiteIO csi.
#![forbid(unsafe_code)]
