//! The newcomer's path: `boxd-host tour` end to end, and the golden-image builder's
//! download retries against boxd-local.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use boxd_host::golden;

use crate::common::*;
use crate::guest::sha256;

#[test]
fn the_tour_runs_every_step_and_brings_summary_home() {
    let s = Scratch::new("tour");
    let keep = s.0.join("kept");
    let out = std::process::Command::new(boxd_host())
        .args(["--opencode", opencode_bin().to_str().unwrap(), "tour", "--keep", keep.to_str().unwrap()])
        .env("BOXD_HOST_CACHE", cache_dir())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["tour"], "ok");
    let steps: Vec<&str> = last["steps"].as_array().unwrap().iter().map(|s| s["step"].as_str().unwrap()).collect();
    assert_eq!(steps, ["golden", "boxd_status", "boxd_ensure", "boxd_submit", "boxd_job", "boxd_harvest", "boxd_drop"]);
    assert!(last["steps"].as_array().unwrap().iter().all(|s| s["ok"] == true));
    assert_eq!(last["work"], "tour");
    assert_eq!(last["machine"], "oc-tour");
    let expected = sha256(boxd_host::tour::expected_summary().as_bytes());
    assert_eq!(last["files"][0]["path"], "SUMMARY.md");
    assert_eq!(last["files"][0]["sha256"], expected.as_str());
    assert_eq!(std::fs::read_to_string(keep.join("project/SUMMARY.md")).unwrap(), boxd_host::tour::expected_summary());
    // The machine is gone at the end, and the audit was printed.
    let list = std::process::Command::new(boxd_local()).args(["machine", "list", "--json"]).env("BOXD_LOCAL_HOME", keep.join("boxd-local")).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&list.stdout).trim(), "[]");
    assert!(stdout.contains("boxd:plugin/spawn@0.1.0") && stdout.contains("programs it may run"));
    assert!(keep.join("audit.jsonl").exists() && keep.join("ledger/works/tour/work.json").exists());
}

/// A release server that fails `failures` times (503), then serves `body`.
fn flaky_server(failures: u32, body: Vec<u8>) -> (String, Arc<AtomicU32>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicU32::new(0));
    let counter = hits.clone();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let mut buf = [0u8; 2048];
            let _ = s.read(&mut buf);
            let n = counter.fetch_add(1, Ordering::SeqCst);
            if n < failures {
                let _ = s.write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            } else {
                let _ = write!(s, "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
                let _ = s.write_all(&body);
            }
        }
    });
    (format!("http://127.0.0.1:{port}/v{{version}}/opencode-{{target}}.tar.gz"), hits)
}

/// The tour's stand-in release archive: an `opencode` that runs the pinned one.
fn archive(dir: &std::path::Path) -> Vec<u8> {
    let oc = std::fs::canonicalize(opencode_bin()).unwrap();
    std::fs::read(boxd_host::tour::make_archive(dir, &oc).unwrap()).unwrap()
}

fn spec(url: String) -> golden::Spec {
    golden::Spec {
        snapshot: "opencode-golden".into(),
        opencode_version: "1.18.33".into(),
        config: golden::default_config(Some("scripted/scripted-model")),
        url,
        attempts: 3,
        retry_delay_s: 0,
        key_env: vec![],
    }
}

fn provider(laptop: &Laptop) -> Vec<(String, String)> {
    vec![("PATH".into(), std::env::var("PATH").unwrap()), ("BOXD_LOCAL_HOME".into(), laptop.boxd_home.display().to_string())]
}

#[test]
fn golden_retries_a_failing_download_then_snapshots() {
    let laptop = Laptop::new("golden-retry");
    let (url, hits) = flaky_server(2, archive(&laptop.scratch.0));
    let env = provider(&laptop);
    let cli = golden::Cli { boxd: &boxd_local(), env: &env };
    let report = golden::build(&cli, &spec(url), &mut |_| {}).unwrap();
    assert_eq!(hits.load(Ordering::SeqCst), 3, "two failures, then the download");
    assert_eq!(report["buildMachineRemoved"], true);
    assert!(report["install"].as_str().unwrap().contains("after 3 attempt(s)"));
    let snaps = String::from_utf8(laptop.boxd(&["snapshots", "list", "--json"]).stdout).unwrap();
    assert!(snaps.contains("\"opencode-golden\""));
    // The config was written into the image, and the binary answers with the version.
    let m = laptop.boxd(&["machine", "new", "check", "--from-snapshot", "opencode-golden", "--json"]);
    assert!(m.status.success());
    let v = laptop.boxd(&["machine", "exec", "check", "--", "sh", "-c", "'cat .config/opencode/opencode.json && .local/bin/opencode --version'"]);
    let text = String::from_utf8_lossy(&v.stdout);
    assert!(text.contains("scripted/scripted-model") && text.trim_end().ends_with("1.18.33"), "{text}");
    let _ = laptop.boxd(&["machine", "remove", "check", "-y"]);
}

#[test]
fn golden_fails_loudly_with_no_snapshot_and_no_build_machine_left() {
    let laptop = Laptop::new("golden-fail");
    let (url, hits) = flaky_server(u32::MAX, vec![]);
    let env = provider(&laptop);
    let cli = golden::Cli { boxd: &boxd_local(), env: &env };
    let err = golden::build(&cli, &spec(url), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("download failed after 3 attempts"), "{err}");
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    assert_eq!(String::from_utf8_lossy(&laptop.boxd(&["snapshots", "list", "--json"]).stdout).trim(), "[]");
    assert_eq!(String::from_utf8_lossy(&laptop.boxd(&["machine", "list", "--json"]).stdout).trim(), "[]");
}
