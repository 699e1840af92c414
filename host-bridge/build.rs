//! Builds the component for wasm32-wasip2 with a nested cargo, so `cargo build -p
//! boxd-host` needs no other step. `BOXD_COMPONENT_WASM` skips the build and uses a
//! prebuilt file. (The test-only probe is built by the tests that load it.)

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let ws = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).parent().unwrap().to_owned();
    // component/guest: the guest helper is embedded in the component (include_bytes).
    for p in ["component/src", "component/guest", "component/build.rs", "component/Cargo.toml", "wit", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", ws.join(p).display());
    }
    println!("cargo:rerun-if-env-changed=BOXD_COMPONENT_WASM");
    if let Ok(c) = env::var("BOXD_COMPONENT_WASM") {
        println!("cargo:rerun-if-changed={c}");
        emit(PathBuf::from(c));
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
    emit(target_dir.join("wasm32-wasip2/wasm/boxd_component.wasm"));
}

/// The component's path, its sha256 and its compiled form, worked out here so a start never
/// hashes or compiles it (the digest names a compiled copy in the cache; the compiled form
/// is what a first start would otherwise spend ~0.3 s making).
fn emit(wasm: PathBuf) {
    use sha2::Digest;
    let bytes = std::fs::read(&wasm).unwrap_or_else(|e| panic!("cannot read the component {}: {e}", wasm.display()));
    let digest: String = sha2::Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    println!("cargo:rustc-env=COMPONENT_WASM={}", wasm.display());
    println!("cargo:rustc-env=COMPONENT_SHA256={digest}");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("component.cwasm");
    std::fs::write(&out, precompile(&bytes)).expect("write the compiled component");
    println!("cargo:rustc-env=COMPONENT_PRECOMPILED={}", out.display());
}

#[path = "src/runtime/engine.rs"]
mod engine;

/// The component compiled for the host this binary is for, or nothing when that is not the
/// machine building it (Cranelift compiles for the machine it runs on here) or the compile
/// fails: the host then compiles at its first start, as for any --component.
fn precompile(wasm: &[u8]) -> Vec<u8> {
    if env::var("TARGET").ok() != env::var("HOST").ok() {
        return Vec::new();
    }
    let engine = wasmtime::Engine::new(&engine::config()).expect("a wasmtime engine");
    engine.precompile_component(wasm).unwrap_or_else(|e| {
        println!("cargo:warning=the component was not compiled ahead of time ({e}); the host compiles it at its first start");
        Vec::new()
    })
}
