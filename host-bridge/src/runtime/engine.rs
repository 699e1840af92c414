//! The engine's configuration, in one place: the runtime builds its engine from it, and
//! build.rs compiles the built-in component ahead of time with the same one (a compiled
//! component loads only into an engine whose configuration matches the one that made it).

pub fn config() -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config.wasm_component_model(true);
    config
}
