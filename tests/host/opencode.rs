//! The OpenCode bridge (host-bridge/opencode) is tested by its own Node suite,
//! tests/opencode/, against the real opencode, this component and boxd-local. This test
//! runs that suite so `cargo test --workspace` covers it, building the bridge first when
//! its dist/ is missing or stale (another component, or a changed input of the build).

use std::process::Command;

use crate::common::*;

#[test]
fn the_opencode_bridge_suite_passes_against_the_real_opencode() {
    let repo = repo();
    build_bridge();
    // conformance.test.js runs from tests/host/conformance.rs, which compares its results.
    let out = Command::new("node")
        .args(["--test", "tests/opencode/bridge.test.js", "tests/opencode/bounds.test.js", "tests/opencode/frames.test.js", "tests/opencode/ledger.test.js", "tests/opencode/opencode.test.js", "tests/opencode/asking.test.js", "tests/opencode/inworker.test.js", "tests/opencode/audit.test.js", "tests/opencode/bun.test.js", "tests/opencode/hostkill.test.js"])
        .current_dir(&repo)
        .env("BOXD_LOCAL_BIN", boxd_local())
        // audit.test.js makes its spawn requests through the test-only probe component.
        .env("BOXD_PROBE_WASM", probe_wasm())
        .output()
        .expect("node runs the bridge suite");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "node --test tests/opencode/ failed:\n{}\n{}", tail(&stdout), tail(&stderr));
    // A failed before() hook cancels its tests without failing one: count both. A skipped
    // suite (a missing prerequisite) counts as no test at all, so any SKIP fails here.
    assert!(stdout.contains("# fail 0") && stdout.contains("# cancelled 0"), "{}", tail(&stdout));
    assert!(!stdout.contains("# SKIP"), "a bridge test was skipped:\n{}", tail(&stdout));
}

/// The last 30 KB of a long report.
pub fn tail(s: &str) -> &str {
    let mut i = s.len().saturating_sub(30_000);
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}
