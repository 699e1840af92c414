//! Builds the component for wasm32-wasip2 with a nested cargo, so `cargo build -p
//! boxd-host` needs no other step. `BOXD_COMPONENT_WASM` skips the build and uses a
//! prebuilt file. (The test-only probe is built by the tests that load it.)

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let ws = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("../..").canonicalize().unwrap();
    // component/guest: the guest helper is embedded in the component (include_bytes).
    for p in ["component/src", "component/guest", "component/build.rs", "component/Cargo.toml", "wit", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", ws.join(p).display());
    }
    println!("cargo:rerun-if-env-changed=BOXD_COMPONENT_WASM");
    if let Ok(c) = env::var("BOXD_COMPONENT_WASM") {
        println!("cargo:rerun-if-changed={c}");
        println!("cargo:rustc-env=BOXD_COMPONENT_WASM_PATH={c}");
        return;
    }
    // One shared target dir for every profile and command (not OUT_DIR, which differs
    // per profile), and not the outer one, which the outer cargo holds locked.
    let target_dir = env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| ws.join("target")).join("wasm-component");
    let status = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&ws)
        .args(["build", "-p", "boxd-component", "--target", "wasm32-wasip2", "--profile", "wasm", "--target-dir"])
        .arg(&target_dir)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("CARGO_MAKEFLAGS")
        .status()
        .expect("run cargo for the wasm32-wasip2 component");
    assert!(status.success(), "building the component failed; is the target installed? run: rustup target add wasm32-wasip2");
    println!("cargo:rustc-env=BOXD_COMPONENT_WASM_PATH={}", target_dir.join("wasm32-wasip2/wasm/boxd_component.wasm").display());
}
