//! boxd-host: the Rust hosts for the opencode-boxd component. Crates by job inside:
//! `cli` parses, `session` builds the policy, runtime, context and audit log once,
//! `commands` runs one command each, `runtime` loads and calls the component (and keeps
//! each call's trace), `audit` reads what it may reach and logs what it touched, `policy`
//! grants, `spawn` runs children. Tool behaviour lives in the component; hosts read the
//! manifest.

pub mod audit;
pub mod cli;
pub mod commands;
pub mod interrupt;
pub mod opencode_version;
pub mod out;
pub mod policy;
pub mod runtime;
pub mod session;
pub mod spawn;

/// The component this host was built with.
pub const COMPONENT: &[u8] = include_bytes!(env!("COMPONENT_WASM"));
/// Its sha256 (hex), computed by build.rs.
pub const COMPONENT_SHA256: &str = env!("COMPONENT_SHA256");
/// Its compiled form for this host's engine, made by build.rs (empty when the host was
/// built for another target than the build machine's: then the first start compiles).
pub const COMPONENT_PRECOMPILED: &[u8] = include_bytes!(env!("COMPONENT_PRECOMPILED"));
