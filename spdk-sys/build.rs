//! Finds SPDK and generates bindings when the `link` feature is on; does nothing otherwise.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "link")]
    link::run();
}

#[cfg(feature = "link")]
mod link {
    pub fn run() {
        for var in [
            "SPDK_DIR",
            "SPDK_INCLUDE_DIR",
            "SPDK_LIB_DIR",
            "PKG_CONFIG_PATH",
        ] {
            println!("cargo:rerun-if-env-changed={var}");
        }
        let found = std::env::var_os("SPDK_DIR").is_some()
            || std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../vendor/spdk"))
                .exists()
            || pkg_config::Config::new().probe("spdk_nvmf").is_ok();
        if !found {
            panic!(
                "SPDK not found. Install SPDK (v26.05) where pkg-config finds it (spdk_nvmf.pc), \
                 or set SPDK_DIR to an SPDK build or install tree, or place one at vendor/spdk."
            );
        }
    }
}
