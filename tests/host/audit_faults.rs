//! The audit log when a line does not fit, and for calls refused before they run, against
//! the real binaries: a line cut short by a full disk is taken back (the log holds whole
//! lines only, and the next line is not glued to a fragment); `call` exits 2 and the MCP
//! server says `auditFailed` in every later result; a call refused for a grant problem
//! (a missing project folder) still gets its line, from `call` and from the MCP server.
//!
//! A full disk is played by a file-size limit (RLIMIT_FSIZE, with SIGXFSZ ignored as a
//! shell's `trap '' XFSZ` would): a write past it lands in part and the next fails with
//! EFBIG, as a write to a full disk lands in part and the next fails with ENOSPC. The limit
//! is raised (prlimit) to play space freed.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};

use crate::audit_log::{command, lines, within, Mcp};
use crate::common::*;

/// Past this size no file of the host's (or its children's) grows.
const LIMIT: u64 = 1 << 20;

/// An audit log that already holds one whole line and ends 40 bytes short of `LIMIT`:
/// every line after it lands in part.
fn nearly_full_log(laptop: &Laptop) -> std::path::PathBuf {
    let log = laptop.scratch.0.join("audit.jsonl");
    let pad = "x".repeat(LIMIT as usize - 40 - r#"{"pad":""}"#.len() - 1);
    std::fs::write(&log, format!("{}\n", json!({ "pad": pad }))).unwrap();
    assert_eq!(std::fs::metadata(&log).unwrap().len(), LIMIT - 40);
    log
}

/// boxd-host started under the file-size limit (no compiled cache written: it would pass it).
fn start_limited(laptop: &Laptop, args: &[&str], stdin: Stdio) -> std::process::Child {
    let mut args = args.to_vec();
    args.insert(0, "--no-cache");
    let mut cmd = command(laptop, &args, stdin);
    // SAFETY: between fork and exec only signal(2) and setrlimit(2), async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let limit = libc::rlimit { rlim_cur: LIMIT, rlim_max: libc::RLIM_INFINITY };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().unwrap()
}

/// Space freed: the running host's file-size limit lifted.
fn lift_limit(pid: u32) {
    let none = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: prlimit(2) on our own child, from a local.
    let r = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_FSIZE, &none, std::ptr::null_mut()) };
    assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
}

#[test]
fn a_line_cut_short_by_a_full_disk_is_taken_back_and_call_exits_2() {
    let laptop = Laptop::new("audit-full-call");
    let log = nearly_full_log(&laptop);
    let before = std::fs::read(&log).unwrap();
    let log_s = log.to_str().unwrap();
    let out = within(start_limited(&laptop, &["--audit-log", log_s, "call", "boxd_status"], Stdio::null()), Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    stdout_json(&out);
    assert!(stderr.contains("cannot write the audit log") && stderr.contains("taken back"), "{stderr}");
    // Nothing of the line is left: the log is as it was.
    assert!(std::fs::read(&log).unwrap() == before, "a fragment was left in the log");

    // Space again: the next line is whole, on its own line.
    let out = laptop.host(&["--audit-log", log_s, "call", "boxd_status"]);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", String::from_utf8_lossy(&out.stderr));
    let all = lines(&log);
    assert_eq!(all.iter().filter(|l| l["tool"] == "boxd_status").count(), 1, "{:?}", all.iter().map(|l| &l["tool"]).collect::<Vec<_>>());
}

#[test]
fn mcp_results_say_audit_failed_once_a_line_is_lost_and_the_log_stays_whole() {
    let laptop = Laptop::new("audit-full-mcp");
    let log = nearly_full_log(&laptop);
    let child = start_limited(&laptop, &["--audit-log", log.to_str().unwrap(), "mcp"], Stdio::piped());
    let pid = child.id();
    let mut mcp = Mcp::from(child);
    let first = mcp.request(2, "tools/call", json!({ "name": "boxd_status", "arguments": {} }));
    let note = &first["result"]["structuredContent"]["auditFailed"];
    assert_eq!(note["error"], "AUDIT_FAILED", "the client was not told its call is not in the log: {first:#}");
    assert!(note["message"].as_str().unwrap().contains("taken back") && !note["next"].as_str().unwrap().is_empty(), "{note:#}");
    // The tool's own answer is all there, beside the note (boxd_status names the host).
    assert_eq!(first["result"]["structuredContent"]["host"]["name"], "boxd-host-mcp", "{first:#}");
    let text: Value = serde_json::from_str(first["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text["auditFailed"], *note, "the text the model reads says it too");

    lift_limit(pid);
    let second = mcp.request(3, "tools/call", json!({ "name": "boxd_job", "arguments": { "work": "w1" } }));
    assert_eq!(second["result"]["structuredContent"]["auditFailed"]["error"], "AUDIT_FAILED", "the log is still missing a call: {second:#}");
    let out = mcp.close();
    assert!(String::from_utf8_lossy(&out.stderr).contains("the line for boxd_status is lost"));
    // Whole lines only: the lost one left nothing, the one after it is on its own line.
    let tools: Vec<Value> = lines(&log).iter().map(|l| l["tool"].clone()).filter(|t| t != "host:opencode").collect();
    assert_eq!(tools[1..], [json!("boxd_job")], "{tools:?}");
}

/// The calls a host refuses for a grant problem (here, a project folder that is gone)
/// run nothing, and their audit line says so.
fn refused_line(log: &Path, tool: &str) -> Value {
    let all = lines(log);
    let line = all.iter().find(|l| l["tool"] == tool).unwrap_or_else(|| panic!("no audit line for the refused {tool}: {all:#?}"));
    assert_eq!(line["result"], json!({ "error": "OPTIONS_INVALID" }), "{line:#}");
    assert_eq!((line["spawns"].clone(), line["paths"].clone()), (json!([]), json!([])), "{line:#}");
    line.clone()
}

#[test]
fn calls_refused_for_a_grant_problem_are_audited() {
    let laptop = Laptop::new("audit-refused");
    std::fs::remove_dir_all(&laptop.project).unwrap();
    let log = laptop.scratch.0.join("audit.jsonl");
    let log_s = log.to_str().unwrap();
    let out = laptop.host(&["--audit-log", log_s, "call", "boxd_ensure", r#"{"work":"w9"}"#]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout_json(&out)["error"], "OPTIONS_INVALID");
    refused_line(&log, "boxd_ensure");

    let mut mcp = Mcp::start(&laptop, &["--audit-log", log_s]);
    let drop = mcp.request(2, "tools/call", json!({ "name": "boxd_drop", "arguments": { "work": "w9" } }));
    assert_eq!(drop["result"]["structuredContent"]["error"], "OPTIONS_INVALID", "{drop:#}");
    mcp.close();
    refused_line(&log, "boxd_drop");
    assert!(laptop.boxd_calls().is_empty(), "a refused call ran boxd: {:?}", laptop.boxd_calls());
}
