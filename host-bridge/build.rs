//! The built-in component: its path, digest and compiled form for the host. The
//! component itself is built by the `boxd-component-wasm` build dependency
//! (component-wasm/build.rs), which cargo runs at the start of a build instead of after
//! wasmtime and Cranelift, which this script needs.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed={}", boxd_component_wasm::PATH);
    emit(PathBuf::from(boxd_component_wasm::PATH));
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
