//! boxd-host: the Rust hosts for the opencode-boxd component. The library owns the
//! policy (programs, folders, child environment), the runtime (engine, compiled cache,
//! an instance per call) and the audit; the binary's commands are thin fronts over it.
//! No tool logic lives here: every rule is in the component.

pub mod audit;
pub mod cli;
pub mod golden;
pub mod mcp;
pub mod policy;
pub mod runtime;
pub mod spawn;
pub mod tour;

/// The component this host was built with.
pub const COMPONENT: &[u8] = include_bytes!(env!("COMPONENT_WASM"));
