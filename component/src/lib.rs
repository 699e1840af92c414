//! opencode-boxd's component: every tool's behaviour, over two capabilities.
//!
//! The crate is `no_std` + `alloc` on wasm32, so the built component imports exactly the
//! spawn interface and wasi:filesystem (std would add wasi:cli, clocks and more). Native
//! builds link std only so unit tests can run; domain code uses `core`/`alloc` alone.
//! `wasm` is the one file that touches the generated bindings.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

pub mod boxd;
pub mod encode;
pub mod guest;
pub mod redact;
pub mod caps;
pub mod errors;
pub mod golden;
pub mod ledger;
pub mod manifest;
pub mod opencode;
pub mod options;
pub mod paths;
pub mod schema;
pub mod tools;

#[cfg(test)]
mod testing;
#[cfg(test)] mod proptests;

#[cfg(target_arch = "wasm32")]
mod wasm;

pub use manifest::describe;
pub use tools::{call, RawContext};
