//! Integration tests of the wasmtime host (`boxd-host`), run against the real component
//! and the real boxd-local provider. Themes: the import list, confinement through a real
//! probe guest, and the command line.

mod common;
mod confinement;
mod bounds;
mod imports;
mod cli;
mod conformance;
mod guest;
mod harvest;
mod lifecycle;
mod admission;
mod caps_at_once;
mod nothing_lost;
mod kill_matrix;
mod concurrency;
mod races;
mod tour;
mod install;
mod mcp;
mod mcp_inspector;
mod opencode;
mod faults_matrix;
mod secrets;
mod policy_vectors;
mod round_trips;
mod streaming;
mod temps;
mod live_check;
mod boxd_local_remove;
mod warm;
mod laptop_lookup;
mod world_lies;
mod guest_lies;
mod acted_then_failed;
mod side_by_side;
mod audit_log;
mod audit_faults;
mod interrupt;
mod mcp_lines;
mod mcp_retry;
mod changed_world;
mod laptop_config;
mod other_ledger;
