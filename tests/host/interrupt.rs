//! SIGTERM, SIGINT and SIGHUP to boxd-host while a call runs (an MCP client shutting its
//! server down, Ctrl-C on `call`): the boxd CLI's own children go with it, the call's audit
//! line is written (marked interrupted, with its spawns), and the host dies of the signal.
//!
//! The boxd here is a shell script standing in for a CLI that runs a child of its own and
//! waits for it (as one shelling out to ssh does), and that ignores SIGTERM, SIGINT and
//! SIGHUP: only the kill of its whole group ends it and its child.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::audit_log::{lines, within, Mcp};
use crate::common::*;

/// The stand-in boxd: each run starts `sleep 600` (its child, in its group), writes the
/// sleep's pid to `pids`, and waits.
fn stubborn_boxd(dir: &Path) -> PathBuf {
    let boxd = dir.join("boxd");
    let script = format!("#!/bin/sh\ntrap '' TERM INT HUP\nsleep 600 &\necho $! >> {}/pids\nwait\n", dir.display());
    std::fs::write(&boxd, script).unwrap();
    std::fs::set_permissions(&boxd, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    boxd
}

fn host(laptop: &Laptop, boxd: &Path, log: &Path, args: &[&str], stdin: Stdio) -> Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(boxd_host());
    // The host keeps a signal ignored that it was started with ignored (nohup ignores
    // SIGHUP, a shell's background job SIGINT), and this test may itself run so: its host
    // starts with the three at their default, as a terminal or an MCP client starts one.
    // SAFETY: signal(2) only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    cmd
        .arg("--project")
        .arg(&laptop.project)
        .arg("--ledger")
        .arg(&laptop.ledger)
        .arg("--boxd")
        .arg(boxd)
        .arg("--audit-log")
        .arg(log)
        .args(args)
        .env("BOXD_HOST_CACHE", cache_dir())
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The grandchildren's pids, once `n` of them are running.
fn sleeps(dir: &Path, n: usize) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pids: Vec<i32> = std::fs::read_to_string(dir.join("pids")).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect();
        if pids.len() >= n {
            return pids;
        }
        assert!(Instant::now() < deadline, "the boxd stand-in's children never started");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` still runs (a zombie waiting for init to reap it does not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

fn send(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

/// The host died of `sig`, left no child's child running, and wrote one line for the call,
/// marked interrupted, with the spawns it made.
fn check_stopped(out: &std::process::Output, sig: i32, name: &str, sleeps: &[i32], log: &Path) {
    assert_eq!(out.status.signal(), Some(sig), "{:?}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    let deadline = Instant::now() + Duration::from_secs(5);
    while sleeps.iter().any(|&p| alive(p)) {
        if Instant::now() > deadline {
            for &p in sleeps {
                // SAFETY: kill(2) of the test's own leftovers, by pid.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            panic!("{name}: the boxd CLI's children outlived the host: {sleeps:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let all = lines(log);
    let calls: Vec<&Value> = all.iter().filter(|l| l["tool"] == "boxd_status").collect();
    assert_eq!(calls.len(), 1, "{name}: {all:#?}");
    let line = calls[0];
    assert_eq!(line["interrupted"], name, "{line:#}");
    let spawns = line["spawns"].as_array().unwrap();
    assert!(!spawns.is_empty() && spawns.iter().all(|s| s["outcome"] == "interrupted" && s["program"] == "boxd"), "{name}: {line:#}");
}

#[test]
fn a_signal_to_call_kills_the_boxd_clis_children_and_audits_the_call() {
    for (sig, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGINT, "SIGINT"), (libc::SIGHUP, "SIGHUP")] {
        let laptop = Laptop::new("interrupt-call");
        let boxd = stubborn_boxd(&laptop.scratch.0);
        let log = laptop.scratch.0.join("audit.jsonl");
        let child = host(&laptop, &boxd, &log, &["call", "boxd_status"], Stdio::null());
        // boxd_status asks two things of boxd side by side: both are running.
        let pids = sleeps(&laptop.scratch.0, 2);
        send(&child, sig);
        // A second signal while the first is handled changes nothing.
        send(&child, sig);
        let out = within(child, Duration::from_secs(30));
        assert!(out.stdout.is_empty(), "{name}: an interrupted call prints no answer");
        check_stopped(&out, sig, name, &pids, &log);
    }
}

#[test]
fn sigterm_to_the_mcp_server_mid_call_kills_the_children_and_audits_the_call() {
    let laptop = Laptop::new("interrupt-mcp");
    let boxd = stubborn_boxd(&laptop.scratch.0);
    let log = laptop.scratch.0.join("audit.jsonl");
    let mut mcp = Mcp::from(host(&laptop, &boxd, &log, &["mcp"], Stdio::piped()));
    mcp.call(2, "boxd_status", json!({}));
    // Queued behind it: never started once the signal came.
    mcp.call(3, "boxd_job", json!({ "work": "w3" }));
    let pids = sleeps(&laptop.scratch.0, 2);
    send(&mcp.child, libc::SIGTERM);
    let Mcp { child, .. } = mcp;
    let out = within(child, Duration::from_secs(30));
    check_stopped(&out, libc::SIGTERM, "SIGTERM", &pids, &log);
    assert!(!lines(&log).iter().any(|l| l["tool"] == "boxd_job"), "the queued call ran");
}

#[test]
fn sigterm_to_an_idle_mcp_server_ends_it_by_the_signal() {
    let laptop = Laptop::new("interrupt-idle");
    let boxd = stubborn_boxd(&laptop.scratch.0);
    let log = laptop.scratch.0.join("audit.jsonl");
    let mcp = Mcp::from(host(&laptop, &boxd, &log, &["mcp"], Stdio::piped()));
    send(&mcp.child, libc::SIGTERM);
    let Mcp { child, .. } = mcp;
    let out = within(child, Duration::from_secs(10));
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{:?}", out.status);
    assert!(lines(&log).is_empty());
}
