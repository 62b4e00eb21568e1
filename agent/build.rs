//! With the `spdk` feature, passes spdk-sys's final link arguments (kept-alive shared
//! libraries that only register constructors) to the agent's binaries and tests: a library's
//! build script cannot pass them itself.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_SPDK_LINK_ARGS");
    if std::env::var_os("CARGO_FEATURE_SPDK").is_some()
        && let Ok(args) = std::env::var("DEP_SPDK_LINK_ARGS")
    {
        for arg in args.split_whitespace() {
            println!("cargo:rustc-link-arg={arg}");
        }
    }
}
