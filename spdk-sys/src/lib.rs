//! Raw bindings to SPDK. Built only with the `link` feature.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]
