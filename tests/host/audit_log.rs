//! The audit log (`--audit-log`, audit.rs) against the real binaries: whole lines from many
//! writers at once, a line that cannot be written, paths that cannot be opened (named, not
//! fatal to the MCP server, no hang on a FIFO, no symbolic link followed, narrowed to 0600),
//! the host's own `opencode --version` audited; and the MCP server's queue: a queued call
//! that was cancelled or whose client hung up never runs, and pipelined calls run in order.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::*;

pub fn lines(log: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a torn audit line ({e}): {l:?}"))).collect()
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// boxd-host as `Laptop::host` makes it, started (not waited for).
pub fn start(laptop: &Laptop, args: &[&str], stdin: Stdio) -> Child {
    command(laptop, args, stdin).spawn().unwrap()
}

/// boxd-host as `Laptop::host` makes it, not started: its output piped.
pub fn command(laptop: &Laptop, args: &[&str], stdin: Stdio) -> Command {
    let mut cmd = Command::new(boxd_host());
    cmd
        .arg("--project")
        .arg(&laptop.project)
        .arg("--ledger")
        .arg(&laptop.ledger)
        .arg("--boxd")
        .arg(boxd_local())
        .args(args)
        .env("BOXD_LOCAL_HOME", &laptop.boxd_home)
        .env("BOXD_HOST_CACHE", cache_dir())
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// The child's output, or a panic when it has not ended within `limit` (it is killed).
pub fn within(mut child: Child, limit: Duration) -> std::process::Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("boxd-host still running after {limit:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn parallel_calls_write_whole_lines() {
    let laptop = Laptop::new("audit-parallel");
    let log = laptop.scratch.0.join("audit.jsonl");
    let log_s = log.to_str().unwrap();
    let (n, rounds) = (16, 3);
    for _ in 0..rounds {
        std::thread::scope(|s| {
            let calls: Vec<_> = (0..n).map(|_| s.spawn(|| laptop.host(&["--audit-log", log_s, "call", "boxd_status"]))).collect();
            for c in calls {
                let out = c.join().unwrap();
                assert!(matches!(out.status.code(), Some(0 | 1)), "{}", String::from_utf8_lossy(&out.stderr));
            }
        });
    }
    let all = lines(&log);
    assert_eq!(all.iter().filter(|l| l["tool"] == "boxd_status").count(), n * rounds, "one whole line per call");
}

#[test]
fn an_audit_line_that_cannot_be_written_fails_the_call_and_a_removed_log_is_made_again() {
    let laptop = Laptop::new("audit-lost");
    let dir = laptop.scratch.path("logs");
    let log = dir.join("audit.jsonl");
    let log_s = log.to_str().unwrap().to_string();
    // The first boxd call sleeps, so the log can go while the call runs.
    let faults = r#"[{"verb":"*","times":1,"action":"delay","ms":1500}]"#;
    std::fs::write(laptop.boxd_home.join("faults.json"), faults).unwrap();
    let child = start(&laptop, &["--audit-log", &log_s, "call", "boxd_status"], Stdio::null());
    std::thread::sleep(Duration::from_millis(700));
    assert!(log.exists(), "the log is opened before the call");
    std::fs::remove_file(&log).unwrap();
    let out = within(child, Duration::from_secs(60));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The line went to the path, not to the unlinked file.
    assert_eq!(lines(&log).iter().filter(|l| l["tool"] == "boxd_status").count(), 1);
    assert_eq!(mode(&log), 0o600);

    // The folder gone: the line cannot be written; stderr says so and the call exits 2.
    std::fs::write(laptop.boxd_home.join("faults.json"), faults).unwrap();
    let child = start(&laptop, &["--audit-log", &log_s, "call", "boxd_status"], Stdio::null());
    std::thread::sleep(Duration::from_millis(700));
    std::fs::remove_dir_all(&dir).unwrap();
    let out = within(child, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stdout={} stderr={stderr}", String::from_utf8_lossy(&out.stdout));
    assert!(stderr.contains("cannot write the audit log") && stderr.contains(&log_s), "{stderr}");
    stdout_json(&out);
}

#[test]
fn an_audit_log_that_cannot_be_opened_is_named_and_refused() {
    let laptop = Laptop::new("audit-open");
    let dir = laptop.scratch.0.clone();
    let refused = |path: &Path| {
        let out = within(start(&laptop, &["--audit-log", path.to_str().unwrap(), "call", "boxd_status"], Stdio::null()), Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
        let v = stdout_json(&out);
        assert_eq!(v["error"], "OPTIONS_INVALID", "{v:#}");
        assert!(v["message"].as_str().unwrap().contains(path.to_str().unwrap()), "{v:#}");
        assert!(v["next"].as_str().unwrap().contains("--audit-log"), "{v:#}");
        v
    };
    // A folder that is not there.
    refused(&dir.join("missing/audit.jsonl"));
    // Not a regular file: a device, and a FIFO (which would block the open forever).
    refused(Path::new("/dev/full"));
    let fifo = dir.join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    refused(&fifo);
    // A symbolic link is not followed, and a dangling one does not create its target.
    let target = dir.join("elsewhere.jsonl");
    let link = dir.join("link.jsonl");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    refused(&link);
    assert!(!target.exists(), "the dangling link's target was created");

    // A log already there 0644 is narrowed to 0600.
    let old = dir.join("old.jsonl");
    std::fs::write(&old, "").unwrap();
    std::fs::set_permissions(&old, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let out = laptop.host(&["--audit-log", old.to_str().unwrap(), "call", "boxd_status"]);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(mode(&old), 0o600);
    assert_eq!(lines(&old).len(), 1);

    // The MCP server still shakes hands and lists its tools; each call answers the problem.
    let fifo_s = fifo.to_str().unwrap().to_string();
    let mut mcp = Mcp::start(&laptop, &["--audit-log", &fifo_s]);
    let tools = mcp.request(2, "tools/list", json!({}));
    assert!(tools["result"]["tools"].as_array().is_some_and(|t| !t.is_empty()), "{tools:#}");
    let call = mcp.request(3, "tools/call", json!({ "name": "boxd_status", "arguments": {} }));
    assert_eq!(call["result"]["isError"], true, "{call:#}");
    assert_eq!(call["result"]["structuredContent"]["error"], "OPTIONS_INVALID", "{call:#}");
    assert!(call["result"]["structuredContent"]["message"].as_str().unwrap().contains(&fifo_s), "{call:#}");
    mcp.close();
}

#[test]
fn the_hosts_own_opencode_version_lookup_is_audited() {
    let laptop = Laptop::new("audit-opencode");
    // A fresh binary: its version is in no cache yet.
    let oc = laptop.scratch.0.join("opencode");
    std::fs::write(&oc, "#!/bin/sh\necho 1.2.3\n").unwrap();
    std::fs::set_permissions(&oc, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let log = laptop.scratch.0.join("audit.jsonl");
    let args = ["--opencode", oc.to_str().unwrap(), "--audit-log", log.to_str().unwrap(), "call", "boxd_status"];
    let out = laptop.host(&args);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", String::from_utf8_lossy(&out.stderr));
    let all = lines(&log);
    let host: Vec<&Value> = all.iter().filter(|l| l["tool"] == "host:opencode").collect();
    assert_eq!(host.len(), 1, "{all:#?}");
    let spawn = &host[0]["spawns"][0];
    assert_eq!((spawn["program"].as_str(), &spawn["args"], spawn["outcome"].as_str()), (Some("opencode"), &json!(["--version"]), Some("exited")), "{all:#?}");
    assert!(spawn["grant"].as_str().unwrap().starts_with("host: opencode"), "{all:#?}");
    // Known now (cached): the next call asks no more.
    let out = laptop.host(&args);
    assert!(matches!(out.status.code(), Some(0 | 1)));
    assert_eq!(lines(&log).iter().filter(|l| l["tool"] == "host:opencode").count(), 1);
}

/// `boxd-host mcp` driven with raw JSON-RPC on stdio.
pub struct Mcp {
    pub child: Child,
    stdin: Option<std::process::ChildStdin>,
    pub lines: mpsc::Receiver<Value>,
}

impl Mcp {
    pub fn start(laptop: &Laptop, flags: &[&str]) -> Mcp {
        let mut args = flags.to_vec();
        args.push("mcp");
        Mcp::from(start(laptop, &args, Stdio::piped()))
    }

    /// A server already started with piped stdio, past the handshake.
    pub fn from(mut child: Child) -> Mcp {
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    let _ = tx.send(v);
                }
            }
        });
        let stdin = child.stdin.take();
        let mut mcp = Mcp { child, stdin, lines };
        let init = mcp.request(1, "initialize", json!({ "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "audit-test", "version": "0" } }));
        assert!(init["result"]["serverInfo"].is_object(), "{init:#}");
        mcp.send(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }));
        mcp
    }

    /// One line as given (a newline added).
    pub fn raw(&mut self, line: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    pub fn send(&mut self, msg: Value) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
    }

    pub fn call(&mut self, id: u64, tool: &str, args: Value) {
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": { "name": tool, "arguments": args } }));
    }

    /// The responses (by id) until every id in `ids` has one.
    pub fn responses(&mut self, ids: &[u64]) -> std::collections::BTreeMap<u64, Value> {
        let mut got = std::collections::BTreeMap::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        while !ids.iter().all(|i| got.contains_key(i)) {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self.lines.recv_timeout(left).unwrap_or_else(|_| panic!("no answer to {ids:?}; have {:?}", got.keys()));
            if let Some(id) = v["id"].as_u64() {
                got.insert(id, v);
            }
        }
        got
    }

    pub fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
        self.responses(&[id]).remove(&id).unwrap()
    }

    /// Close stdin (the client hangs up) and wait for the server to end.
    pub fn close(mut self) -> std::process::Output {
        drop(self.stdin.take());
        let out = within(self.child, Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        out
    }
}

/// The `works/<id>` a boxd_job line read, which tells the calls apart.
fn job_work(line: &Value) -> Option<String> {
    let paths = line["paths"].as_array()?;
    paths.iter().filter_map(|p| p["path"].as_str()).find_map(|p| {
        let rest = &p[p.find("works/")? + "works/".len()..];
        Some(rest.split('/').next()?.to_string())
    })
}

#[test]
fn mcp_queued_calls_run_in_order_and_a_cancelled_one_never_runs() {
    let laptop = Laptop::new("audit-mcp-queue");
    let log = laptop.scratch.0.join("audit.jsonl");
    // The first call's first boxd call sleeps: the calls after it queue.
    std::fs::write(laptop.boxd_home.join("faults.json"), r#"[{"verb":"*","times":1,"action":"delay","ms":2500}]"#).unwrap();
    let mut mcp = Mcp::start(&laptop, &["--audit-log", log.to_str().unwrap()]);
    mcp.call(2, "boxd_status", json!({}));
    std::thread::sleep(Duration::from_millis(300));
    mcp.call(3, "boxd_status", json!({}));
    let jobs: Vec<u64> = (4..34).collect();
    for &i in &jobs {
        mcp.call(i, "boxd_job", json!({ "work": format!("w{i}") }));
    }
    mcp.send(json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": 3, "reason": "test" } }));
    let mut want = vec![2];
    want.extend(&jobs);
    let got = mcp.responses(&want);
    for (id, v) in &got {
        assert!(v["result"].is_object(), "{id}: {v:#}");
    }
    mcp.close();
    let all = lines(&log);
    let order: Vec<String> = all.iter().filter(|l| l["tool"] == "boxd_job").map(|l| job_work(l).unwrap_or_else(|| panic!("{l:#}"))).collect();
    let sent: Vec<String> = jobs.iter().map(|i| format!("w{i}")).collect();
    assert_eq!(order, sent, "pipelined calls ran out of order");
    assert_eq!(all.iter().filter(|l| l["tool"] == "boxd_status").count(), 1, "the cancelled call ran: {all:#?}");
}

#[test]
fn mcp_a_call_queued_when_the_client_hangs_up_never_runs() {
    let laptop = Laptop::new("audit-mcp-hangup");
    let log = laptop.scratch.0.join("audit.jsonl");
    std::fs::write(laptop.boxd_home.join("faults.json"), r#"[{"verb":"*","times":1,"action":"delay","ms":2000}]"#).unwrap();
    let mut mcp = Mcp::start(&laptop, &["--audit-log", log.to_str().unwrap()]);
    mcp.call(2, "boxd_status", json!({}));
    std::thread::sleep(Duration::from_millis(300));
    mcp.call(3, "boxd_job", json!({ "work": "w3" }));
    std::thread::sleep(Duration::from_millis(300));
    mcp.close();
    let all = lines(&log);
    // The call that had started ran to its end; the queued one did not start.
    assert_eq!(all.iter().filter(|l| l["tool"] == "boxd_status").count(), 1, "{all:#?}");
    assert_eq!(all.iter().filter(|l| l["tool"] == "boxd_job").count(), 0, "the queued call ran for nobody: {all:#?}");
}
