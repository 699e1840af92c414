//! `boxd-host mcp` driven by a real MCP client: the official Python SDK's stdio client
//! (tests/mcp/client.py, installed into tests/.venv by tests/bootstrap.sh). The script
//! does the MCP side; this test gives it a laptop and boxd-local and wants exit 0.

use std::process::Command;

use crate::common::*;

#[test]
fn a_real_mcp_client_lists_calls_and_sees_errors_progress_and_a_lifecycle() {
    let python = repo().join("tests/.venv/bin/python");
    assert!(python.exists(), "{} is missing: run bash tests/bootstrap.sh (it installs tests/mcp/requirements.txt)", python.display());
    // The lifecycle needs a golden image and the scripted model (World).
    let w = World::new("mcp");
    let laptop = &w.laptop;

    let mut cmd = Command::new(&python);
    cmd.arg(repo().join("tests/mcp/client.py"))
        .arg("--host")
        .arg(boxd_host())
        .arg("--boxd")
        .arg(boxd_local())
        .arg("--project")
        .arg(&laptop.project)
        .arg("--ledger")
        .arg(&laptop.ledger)
        .arg("--boxd-home")
        .arg(&laptop.boxd_home)
        // The script passes its environment on to the server it starts.
        .env("BOXD_LOCAL_HOME", &laptop.boxd_home)
        .env("BOXD_HOST_CACHE", cache_dir());
    {
        // As World::call_with: the laptop's own OpenCode data and the pinned opencode.
        let oc = opencode_bin();
        let h = w.home.display().to_string();
        let path = format!("{}:{}", oc.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
        cmd.arg("--opencode").arg(&oc).arg("--lifecycle");
        cmd.env("PATH", path).env("HOME", &h);
        for (k, sub) in [("XDG_DATA_HOME", "data"), ("XDG_CONFIG_HOME", "config"), ("XDG_CACHE_HOME", "cache"), ("XDG_STATE_HOME", "state")] {
            cmd.env(k, format!("{h}/{sub}"));
        }
        cmd.env("OPENCODE_DISABLE_MODELS_FETCH", "1").env("OPENCODE_DISABLE_AUTOUPDATE", "1");
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert_eq!(out.status.code(), Some(0), "tests/mcp/client.py failed:\n{stdout}\n{stderr}");
    assert!(stdout.lines().any(|l| l.contains(" passed, 0 failed")), "no summary line:\n{stdout}");
}
