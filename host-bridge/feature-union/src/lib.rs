//! Intentionally empty: this crate exists for its Cargo.toml (see there).
#![no_std]
