//! Installing without a checkout: the npm package `npm pack` makes, installed into a real
//! OpenCode (tests/opencode/pack.test.js), and a `boxd-host` copied away from its source
//! tree, as `cargo install --path host-bridge --locked` leaves it (the real install takes
//! minutes; the README names it).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

#[test]
fn the_packed_plugin_installs_into_opencode_and_runs_boxd_status() {
    build_bridge();
    let out = Command::new("node")
        .args(["--test", "tests/opencode/pack.test.js"])
        .current_dir(repo())
        .env("BOXD_LOCAL_BIN", boxd_local())
        .output()
        .expect("node runs the pack suite");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\n{}", crate::opencode::tail(&stdout), String::from_utf8_lossy(&out.stderr));
    // A skipped suite (a missing prerequisite) tests nothing: it fails here.
    assert!(stdout.contains("# pass 2") && stdout.contains("# fail 0") && !stdout.contains("# SKIP"), "{}", crate::opencode::tail(&stdout));
}

/// `boxd-host` and `boxd-local` copied into `dir`/bin, as `cargo install` puts them
/// side by side; returns that boxd-host.
pub fn relocated(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for (exe, name) in [(boxd_host(), "boxd-host"), (boxd_local(), "boxd-local")] {
        std::fs::copy(&exe, bin.join(name)).unwrap();
    }
    bin.join("boxd-host")
}

/// A command for a relocated binary: run from `cwd`, with none of cargo's variables (no
/// CARGO_MANIFEST_DIR to find the source tree by).
pub fn away_from_the_source(exe: &Path, cwd: &Path) -> Command {
    let mut cmd = Command::new(exe);
    cmd.current_dir(cwd);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("CARGO") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// The plugin's npm package, packed into `dir` from a current dist/; its path.
/// --ignore-scripts: prepack is the build build_bridge just ran; running it again would
/// swap dist/ under the bridge suites running beside this test.
pub fn packed_plugin(dir: &Path) -> PathBuf {
    build_bridge();
    let out = Command::new("npm")
        .args(["pack", "--json", "--ignore-scripts", "--pack-destination"])
        .arg(dir)
        .current_dir(repo().join("host-bridge/opencode"))
        .output()
        .expect("npm packs the plugin");
    assert!(out.status.success(), "npm pack: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    dir.join(report[0]["filename"].as_str().unwrap())
}

#[test]
fn a_boxd_host_copied_away_from_its_source_tree_describes_and_calls() {
    let s = Scratch::new("relocated");
    let host = relocated(&s.0);
    let (elsewhere, project, ledger, boxd_home) = (s.path("elsewhere"), s.path("project"), s.path("ledger"), s.path("boxd-local"));
    let run = |args: &[&str]| {
        let mut cmd = away_from_the_source(&host, &elsewhere);
        cmd.arg("--project").arg(&project).arg("--ledger").arg(&ledger).arg("--boxd").arg(s.0.join("bin/boxd-local"));
        cmd.args(args).env("BOXD_LOCAL_HOME", &boxd_home).env("BOXD_HOST_CACHE", s.path("cache")).output().unwrap()
    };
    let out = run(&["describe"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let manifest = stdout_json(&out);
    assert!(manifest["tools"].as_array().unwrap().iter().any(|t| t["name"] == "boxd_status"), "{manifest}");
    let out = run(&["call", "boxd_status"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let status = stdout_json(&out);
    assert_eq!(status["boxd"]["cli"], "signed in", "{status}");
    assert_eq!(status["host"]["name"], "boxd-host", "{status}");
    // The tour (tests/host/tour.rs) runs from such a copy too.
}

/// boxd-host's build script compiles the component with wasmtime, so wasmtime and
/// Cranelift are build dependencies as well as runtime ones; cargo builds them once only
/// while host-bridge/feature-union and the workspace's profiles keep both sides alike (a
/// dependency bump can undo that). Asks cargo for the units it would build (nothing is
/// compiled), for the test command and the README's build. (Release builds keep two:
/// docs/testing.md.)
#[test]
fn wasmtime_and_cranelift_are_built_once_for_the_build_script_and_the_runtime() {
    let s = Scratch::new("unit-graph");
    for args in [&["test", "--workspace", "--no-run"][..], &["build", "-p", "boxd-host"]] {
        let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(repo())
            .args(args)
            .args(["--locked", "-Z", "unstable-options", "--unit-graph", "--target-dir"])
            .arg(&s.0)
            // `--unit-graph` is unstable: the stable cargo takes it with this.
            .env("RUSTC_BOOTSTRAP", "1")
            .env_remove("CARGO_BUILD_TARGET")
            .output()
            .expect("cargo runs");
        assert!(out.status.success(), "cargo {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let graph: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for krate in ["cranelift-codegen", "wasmtime"] {
            let copies: Vec<&serde_json::Value> = graph["units"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|u| u["pkg_id"].as_str().unwrap().contains(&format!("#{krate}@")) && u["mode"] == "build" && u["target"]["kind"][0] == "lib")
                .collect();
            let why: Vec<_> = copies.iter().map(|u| (&u["features"], &u["profile"])).collect();
            assert_eq!(copies.len(), 1, "cargo {args:?} builds {krate} {} times (features, profile): {why:#?}\nsee host-bridge/feature-union/Cargo.toml", copies.len());
        }
    }
}
