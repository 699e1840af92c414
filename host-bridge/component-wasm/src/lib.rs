//! The component built for wasm32-wasip2 by this crate's build script: boxd-host's build
//! script reads it, hashes it and compiles it ahead of time.

/// Where the component's `.wasm` is (or the file `BOXD_COMPONENT_WASM` named).
pub const PATH: &str = env!("BOXD_COMPONENT_WASM_PATH");
