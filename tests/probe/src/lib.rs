//! A test-only component that tries to escape the host's policy: it asks for unlisted
//! programs and for paths outside the preopens, and reports what the host answered.
//! It implements the same world as the product component; it is never shipped.
#![cfg_attr(target_arch = "wasm32", no_std)]

#[cfg(target_arch = "wasm32")]
mod probe;
