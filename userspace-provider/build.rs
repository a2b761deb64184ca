// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! Generates the bindings to rdma-core's provider headers (driver.h,
//! verbs.h, kern-abi.h) and to `uapi/siw_rs-abi.h`, and links libibverbs.
//!
//! driver.h is not shipped by Debian; `scripts/rdma-core-headers` prepares
//! (once, cached under ~/.cache/siw_rs) the v55 headers whose provider ABI
//! matches Debian's libibverbs. `SIW_RS_RDMA_CORE_INCLUDE` overrides it.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn rdma_core_include(manifest: &Path) -> PathBuf {
    println!("cargo:rerun-if-env-changed=SIW_RS_RDMA_CORE_INCLUDE");
    if let Some(dir) = env::var_os("SIW_RS_RDMA_CORE_INCLUDE") {
        return PathBuf::from(dir);
    }
    let script = manifest.join("scripts/rdma-core-headers");
    println!("cargo:rerun-if-changed={}", script.display());
    let out = Command::new(&script)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    if !out.status.success() {
        panic!(
            "{} failed:\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let uapi = manifest.join("../uapi");
    let include = rdma_core_include(&manifest);
    let header = manifest.join("src/bindings.h");
    println!("cargo:rerun-if-changed={}", header.display());
    println!(
        "cargo:rerun-if-changed={}",
        uapi.join("siw_rs-abi.h").display()
    );

    let bindings = bindgen::Builder::default()
        .header(header.to_str().unwrap())
        .clang_arg(format!("-I{}", include.display()))
        .clang_arg(format!("-I{}", uapi.display()))
        .allowlist_type("siw_rs_.*|verbs_.*|ibv_.*|ib_uverbs_.*")
        .allowlist_function(
            "ibv_cmd_.*|verbs_init_cq|verbs_register_driver_34|verbs_set_ops|\
             verbs_uninit_context|_verbs_init_and_alloc_context|__verbs_log",
        )
        .allowlist_var("SIW_RS_.*|VERBS_.*|RDMA_DRIVER_.*|IBV_.*")
        .allowlist_item("siw_rs_opcode|rdma_driver_id|ibv_.*_flags|ibv_wr_opcode")
        .prepend_enum_name(false)
        .derive_default(false)
        .derive_debug(false)
        .generate_comments(false)
        .generate()
        .expect("bindgen failed on src/bindings.h");
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap()).join("bindings.rs");
    bindings
        .write_to_file(&out)
        .expect("cannot write bindings.rs");

    println!("cargo:rustc-link-lib=dylib=ibverbs");
}
