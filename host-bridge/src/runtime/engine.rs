//! The engine's configuration, in one place: the runtime builds its engine from it, and
//! build.rs compiles the built-in component ahead of time with the same one (a compiled
//! component loads only into an engine whose configuration matches the one that made it).

pub fn config() -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config.wasm_component_model(true);
    // No .eh_frame for the compiled code: wasmtime's own traps and backtraces do not use it
    // (only outside unwinders such as a debugger's do), and registering it frame by frame
    // cost every start ~0.15 ms (docs/performance.md).
    config.native_unwind_info(false);
    config
}
