//! Finds SPDK, compiles LiteIO's C shim against it, generates bindings, and tells cargo how to
//! link it. Does nothing unless the `link` feature is on.
//!
//! Lookup order (the first that exists wins):
//! 1. `SPDK_INCLUDE_DIR` + `SPDK_LIB_DIR` (+ `SPDK_SRC_DIR` for the source-tree headers);
//! 2. `SPDK_DIR`: an SPDK build tree (`build/lib`) or an install prefix (`lib`);
//! 3. `vendor/spdk` at the workspace root, same shapes;
//! 4. pkg-config `spdk_nvmf` (its prefix), with the source-tree headers from `SPDK_SRC_DIR`
//!    or `<prefix>/share/spdk/src`.
//!
//! SPDK does not install the headers of the aio, lvol, malloc, null and raid bdev modules, nor
//! `spdk_internal/`; the shim needs them, so a source tree is required beside an install
//! prefix. The shim was written against SPDK 26.05: any other version is refused.
//!
//! Linking: the link line comes from SPDK's own pkg-config files, never from a list kept
//! here, so that any SPDK configuration (with or without fsdev, uring, another DPDK) links as
//! it was built. The files are `<lib>/pkgconfig/*.pc`: an install prefix has them from
//! `make install`, a build tree from the build (`build/lib/pkgconfig`). `pkg-config --libs
//! <the SPDK libraries the agent uses>` gives SPDK's libraries with their dependencies and
//! DPDK's (`spdk_env_dpdk` requires `spdk_dpdklibs`); `pkg-config --libs --static
//! spdk_syslibs` gives the system libraries. A missing `.pc` means SPDK was configured
//! without a module the agent needs, and the build stops naming it.
//!
//! SPDK's libraries are linked whole-archive when static (`lib/libspdk_*.a`), because its
//! modules register themselves from constructors that nothing references; shared libraries
//! (`SPDK_LINK=shared`) are linked with `--no-as-needed` for the same reason, and so are
//! DPDK's (its mempool ring and PCI bus drivers only register constructors).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "link")]
    link::run();
}

#[cfg(feature = "link")]
mod link {
    use std::path::{Path, PathBuf};

    /// SPDK libraries the agent calls or whose modules it registers (pkg-config names);
    /// pkg-config adds what each depends on, DPDK included.
    const SPDK_PACKAGES: &[&str] = &[
        "spdk_event_nvmf",
        "spdk_event_bdev",
        "spdk_event_accel",
        "spdk_event_iobuf",
        "spdk_event_keyring",
        "spdk_event_sock",
        "spdk_event_vmd",
        "spdk_event_scheduler",
        "spdk_event",
        "spdk_nvmf",
        "spdk_bdev_aio",
        "spdk_bdev_lvol",
        "spdk_bdev_malloc",
        "spdk_bdev_null",
        "spdk_bdev_nvme",
        "spdk_bdev_raid",
        "spdk_bdev",
        "spdk_lvol",
        "spdk_blob_bdev",
        "spdk_accel_error",
        "spdk_sock_posix",
        "spdk_scheduler_dynamic",
        "spdk_env_dpdk_rpc",
        "spdk_env_dpdk",
    ];
    /// The shim's C files, one per concept (see `shim/`): SPDK's bdev modules, raid bdevs and
    /// their superblocks, the NVMe-oF target and the hosts connected to it (the one file that
    /// reads SPDK's private `nvmf_internal.h`), the in-memory keyring, the initiator, and the
    /// gate's bdev module and copy engine.
    const SHIM_SOURCES: &[&str] = &[
        "shim/shim_bdev.c",
        "shim/shim_raid.c",
        "shim/shim_raid_sb.c",
        "shim/shim_nvmf.c",
        "shim/nvmf_hosts.c",
        "shim/shim_keyring.c",
        "shim/shim_nvme.c",
        "shim/gate.c",
        "shim/gate_copy.c",
    ];
    /// Module headers the shim and bindings need, relative to a source tree.
    const MODULE_DIRS: &[&str] = &[
        "module/bdev/aio",
        "module/bdev/nvme",
        "module/bdev/lvol",
        "module/bdev/malloc",
        "module/bdev/null",
        "module/bdev/raid",
    ];

    struct Spdk {
        include: PathBuf,
        lib: PathBuf,
        src: PathBuf,
    }

    fn fail(msg: &str) -> ! {
        panic!(
            "\n\nspdk-sys: {msg}\n\nSPDK not found. Install SPDK v26.05 (shared or static) where pkg-config finds it \
             (spdk_nvmf.pc) together with its source tree (SPDK_SRC_DIR, or <prefix>/share/spdk/src), or set SPDK_DIR \
             to an SPDK build tree, or place one at vendor/spdk.\n\n"
        )
    }

    /// This package's directory, read when the script runs: `env!` would bake in the
    /// directory the script was compiled for, and cargo reuses one compiled script for every
    /// checkout (git worktree) of the workspace that shares a target directory.
    fn manifest_dir() -> PathBuf {
        env_path("CARGO_MANIFEST_DIR").unwrap_or_else(|| fail("CARGO_MANIFEST_DIR not set"))
    }

    fn env_path(var: &str) -> Option<PathBuf> {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    }

    fn is_src(dir: &Path) -> bool {
        dir.join("include/spdk_internal/lvolstore.h").exists()
            && MODULE_DIRS.iter().all(|m| dir.join(m).is_dir())
    }

    /// A build tree (`build/lib`, `include`, modules) or an install prefix (`lib`, `include`).
    fn tree(dir: &Path) -> Option<Spdk> {
        let dir = dir.canonicalize().ok()?;
        if dir.join("build/lib").is_dir() && is_src(&dir) {
            return Some(Spdk {
                include: dir.join("include"),
                lib: dir.join("build/lib"),
                src: dir,
            });
        }
        if dir.join("lib").is_dir() && dir.join("include/spdk/nvmf.h").exists() {
            let src = env_path("SPDK_SRC_DIR").or_else(|| Some(dir.join("share/spdk/src")))?;
            if !is_src(&src) {
                fail(&format!(
                    "{} is an install prefix but the SPDK source tree (SPDK_SRC_DIR or {}) is missing",
                    dir.display(),
                    src.display()
                ));
            }
            return Some(Spdk {
                include: dir.join("include"),
                lib: dir.join("lib"),
                src,
            });
        }
        None
    }

    fn locate() -> Spdk {
        if let (Some(include), Some(lib)) = (env_path("SPDK_INCLUDE_DIR"), env_path("SPDK_LIB_DIR"))
        {
            let src = env_path("SPDK_SRC_DIR")
                .unwrap_or_else(|| fail("SPDK_INCLUDE_DIR/SPDK_LIB_DIR need SPDK_SRC_DIR too"));
            return Spdk { include, lib, src };
        }
        if let Some(dir) = env_path("SPDK_DIR") {
            return tree(&dir).unwrap_or_else(|| {
                fail(&format!(
                    "SPDK_DIR={} is neither an SPDK build tree nor an install prefix",
                    dir.display()
                ))
            });
        }
        let vendor = manifest_dir().join("../vendor/spdk");
        if vendor.exists() {
            return tree(&vendor).unwrap_or_else(|| {
                fail("vendor/spdk is neither an SPDK build tree nor an install prefix")
            });
        }
        match pkg_config::Config::new()
            .cargo_metadata(false)
            .probe("spdk_nvmf")
        {
            Ok(lib) => {
                let libdir = lib
                    .link_paths
                    .first()
                    .cloned()
                    .unwrap_or_else(|| fail("spdk_nvmf.pc names no library directory"));
                let prefix = libdir.parent().map(Path::to_path_buf).unwrap_or_default();
                tree(&prefix).unwrap_or_else(|| {
                    fail(&format!(
                        "pkg-config prefix {} is not an SPDK install",
                        prefix.display()
                    ))
                })
            }
            Err(e) => fail(&format!("pkg-config: {e}")),
        }
    }

    fn check_version(spdk: &Spdk) {
        let header = spdk.include.join("spdk/version.h");
        let text = std::fs::read_to_string(&header)
            .unwrap_or_else(|e| fail(&format!("{}: {e}", header.display())));
        let field = |name: &str| -> Option<u32> {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("#define {name}")))
                .and_then(|rest| rest.trim().parse().ok())
        };
        match (field("SPDK_VERSION_MAJOR"), field("SPDK_VERSION_MINOR")) {
            (Some(26), Some(5)) => {}
            (major, minor) => fail(&format!(
                "SPDK 26.05 is required (the shim's declarations are checked against it); found {major:?}.{minor:?} in {}",
                header.display()
            )),
        }
    }

    /// Runs pkg-config with SPDK's `.pc` directory first in its search path.
    fn pkg_config(pc_dir: &Path, args: &[&str]) -> String {
        let mut path = pc_dir.as_os_str().to_owned();
        if let Some(rest) = std::env::var_os("PKG_CONFIG_PATH").filter(|v| !v.is_empty()) {
            path.push(":");
            path.push(rest);
        }
        let bin = std::env::var_os("PKG_CONFIG").unwrap_or_else(|| "pkg-config".into());
        let out = std::process::Command::new(&bin)
            .args(args)
            .env("PKG_CONFIG_PATH", &path)
            .output()
            .unwrap_or_else(|e| {
                fail(&format!(
                    "cannot run {}: {e} (install pkg-config)",
                    bin.to_string_lossy()
                ))
            });
        if !out.status.success() {
            fail(&format!(
                "pkg-config {} failed with SPDK's files in {}: {}\n\
                 A missing spdk_*.pc means this SPDK was configured without a module LiteIO needs \
                 (it needs {}).",
                args.join(" "),
                pc_dir.display(),
                String::from_utf8_lossy(&out.stderr).trim(),
                SPDK_PACKAGES.join(", ")
            ));
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn link(spdk: &Spdk) {
        let shared = std::env::var("SPDK_LINK")
            .map(|v| v == "shared")
            .unwrap_or(false);
        let pc_dir = env_path("SPDK_PKG_CONFIG_DIR").unwrap_or_else(|| spdk.lib.join("pkgconfig"));
        if !pc_dir.join("spdk_syslibs.pc").exists() {
            fail(&format!(
                "{} has no spdk_syslibs.pc: SPDK's build (build/lib/pkgconfig) or `make install` \
                 (<prefix>/lib/pkgconfig) writes it; set SPDK_PKG_CONFIG_DIR if it is elsewhere",
                pc_dir.display()
            ));
        }
        let mut args: Vec<&str> = vec!["--libs"];
        args.extend_from_slice(SPDK_PACKAGES);
        let spdk_libs = pkg_config(&pc_dir, &args);
        let sys_libs = pkg_config(&pc_dir, &["--libs", "--static", "spdk_syslibs"]);

        println!("cargo:rustc-link-search=native={}", spdk.lib.display());
        // Arguments the final link needs that a library's build script cannot give it:
        // shared libraries whose only job is a constructor (DPDK's mempool ring and PCI bus
        // drivers, SPDK modules when shared) must be kept with --no-as-needed. Dependents read
        // them as DEP_SPDK_LINK_ARGS (see the agent's build.rs).
        let mut final_args = vec!["-Wl,--no-as-needed".to_string()];
        let mut seen = std::collections::HashSet::new();
        let mut system = Vec::new();
        for (tok, is_sys) in spdk_libs
            .split_whitespace()
            .map(|t| (t, false))
            .chain(sys_libs.split_whitespace().map(|t| (t, true)))
        {
            if !seen.insert(tok.to_string()) {
                continue;
            }
            if let Some(dir) = tok.strip_prefix("-L") {
                println!("cargo:rustc-link-search=native={dir}");
            } else if let Some(lib) = tok.strip_prefix("-l") {
                if is_sys {
                    system.push(lib.to_string());
                } else if lib.starts_with("spdk_")
                    && !shared
                    && spdk.lib.join(format!("lib{lib}.a")).exists()
                {
                    println!("cargo:rustc-link-lib=static:+whole-archive,-bundle={lib}");
                } else {
                    println!("cargo:rustc-link-lib=dylib={lib}");
                    final_args.push(tok.to_string());
                }
            } else if tok == "-pthread" {
                system.push("pthread".to_string());
            } else {
                // Any other linker flag (-Wl,…) goes to the final link as it is.
                final_args.push(tok.to_string());
            }
        }
        if shared {
            final_args.push(format!("-Wl,-rpath,{}", spdk.lib.display()));
        }
        final_args.push("-Wl,--as-needed".to_string());
        println!("cargo:link_args={}", final_args.join(" "));
        for l in system {
            println!("cargo:rustc-link-lib=dylib={l}");
        }
    }

    pub fn run() {
        for var in [
            "SPDK_DIR",
            "SPDK_INCLUDE_DIR",
            "SPDK_LIB_DIR",
            "SPDK_SRC_DIR",
            "SPDK_LINK",
            "SPDK_PKG_CONFIG_DIR",
            "PKG_CONFIG_PATH",
            "PKG_CONFIG",
        ] {
            println!("cargo:rerun-if-env-changed={var}");
        }
        for f in SHIM_SOURCES.iter().chain(&[
            "wrapper.h",
            "shim/shim.h",
            "shim/shim_internal.h",
            "shim/gate.h",
        ]) {
            println!("cargo:rerun-if-changed={f}");
        }
        let spdk = locate();
        check_version(&spdk);
        let manifest = manifest_dir();
        let dpdk_includes = pkg_config::Config::new()
            .cargo_metadata(false)
            .probe("libdpdk")
            .map(|l| l.include_paths)
            .unwrap_or_default();
        let mut includes = vec![
            spdk.include.clone(),
            spdk.src.join("include"),
            manifest.join("shim"),
        ];
        includes.extend(MODULE_DIRS.iter().map(|m| spdk.src.join(m)));
        includes.extend(dpdk_includes);

        let mut cc = cc::Build::new();
        cc.files(SHIM_SOURCES)
            .warnings(true)
            .extra_warnings(false)
            .flag_if_supported("-Wno-unused-parameter");
        for i in &includes {
            cc.include(i);
        }
        // nvmf_hosts.c reads the subsystem's controllers from the library's private header.
        cc.include(spdk.src.join("lib/nvmf"));
        cc.compile("liteio_spdk_shim");

        let mut builder = bindgen::Builder::default()
            .header(manifest.join("wrapper.h").to_string_lossy())
            .allowlist_function("spdk_.*|liteio_.*|create_aio_bdev|bdev_aio_.*|vbdev_.*")
            .allowlist_type("spdk_.*|liteio_.*|lvs_clear_method|lvol_clear_method")
            .allowlist_var("SPDK_.*|LITEIO_.*")
            .opaque_type("spdk_nvme_ctrlr_data|spdk_nvme_.*_page|spdk_nvmf_fabric_.*|spdk_nvme_sgl_descriptor|spdk_nvme_cmd|spdk_nvme_cpl|spdk_nvmf_.*_cmd|spdk_nvme_registered_ctrlr.*|spdk_nvme_reservation.*|spdk_nvme_ns_data|spdk_nvme_feat.*|spdk_nvme_status|spdk_nvme_cdw.*|spdk_bdev_ext_io_opts|spdk_nvme_zns.*|spdk_nvme_cmds_and_effect.*|spdk_nvme_power_state|spdk_ocssd.*|spdk_nvmf_discovery_log.*|spdk_nvme_error_information_entry|spdk_nvme_health_information_page|spdk_nvme_fw_.*|spdk_nvme_ctrlr_list|spdk_nvme_ns_list|spdk_nvme_dsm_range|spdk_nvme_scc_source_range|spdk_nvme_ana_.*|spdk_nvme_primary_ctrl_capabilities|spdk_nvme_secondary_ctrl.*|spdk_nvme_ctrlr_register.*|spdk_nvme_io_msg.*|spdk_bdev_io|spdk_nvme_tcp_.*|spdk_nvme_cdata_.*|spdk_nvmf_transport_opts")
            .derive_default(true)
            .layout_tests(false)
            .generate_comments(false)
            .prepend_enum_name(false)
            .default_enum_style(bindgen::EnumVariation::Consts)
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
        for i in &includes {
            builder = builder.clang_arg(format!("-I{}", i.display()));
        }
        let bindings = builder
            .generate()
            .unwrap_or_else(|e| fail(&format!("bindgen failed: {e}")));
        let out =
            PathBuf::from(std::env::var("OUT_DIR").unwrap_or_else(|_| fail("OUT_DIR not set")));
        bindings
            .write_to_file(out.join("bindings.rs"))
            .unwrap_or_else(|e| fail(&format!("cannot write bindings: {e}")));
        link(&spdk);
    }
}
