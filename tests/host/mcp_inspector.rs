//! `boxd-host mcp` driven by a second real MCP client: the MCP Inspector's CLI mode
//! (npm `@modelcontextprotocol/inspector`, pinned in tests/package.json). Each check is one
//! `mcp-inspector --cli` run, which starts the server over stdio, makes one request and
//! prints the result as JSON; what the Inspector reads is asserted field by field.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::common::*;

fn inspector() -> PathBuf {
    let p = repo().join("tests/node_modules/.bin/mcp-inspector");
    assert!(p.exists(), "{} is missing: run bash tests/bootstrap.sh (tests/package.json pins the Inspector)", p.display());
    p
}

/// One Inspector CLI run against `boxd-host [server_flags] mcp`: its exit code and the JSON
/// it prints. Like most clients, the Inspector gives a stdio server only a short default
/// environment, so the server's variables go in with `-e` (docs/hosts.md).
fn inspect(laptop: &Laptop, server_flags: &[&str], request: &[&str]) -> (i32, Value) {
    let home = laptop.scratch.path("inspector-home");
    let mut cmd = Command::new(inspector());
    // The first start may compile the component: more than the Inspector's 15 s default
    // on a loaded machine.
    cmd.args(["--cli", "--format", "json", "--quiet", "--connect-timeout", "120000"]);
    for (k, v) in [("BOXD_LOCAL_HOME", laptop.boxd_home.as_path()), ("BOXD_HOST_CACHE", cache_dir())] {
        cmd.arg("-e").arg(format!("{k}={}", v.display()));
    }
    cmd.arg(boxd_host()).arg("--project").arg(&laptop.project).arg("--ledger").arg(&laptop.ledger);
    cmd.args(server_flags).arg("mcp").args(request);
    // The Inspector keeps its own state under HOME; this one is the test's.
    let out = cmd.env("HOME", &home).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let value: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("the Inspector printed no JSON ({e}): {stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), value)
}

/// A tool result as the Inspector shows it: its text must be the same JSON as its
/// structuredContent; returns that value and isError.
fn tool_result(value: &Value) -> (Value, bool) {
    let r = &value["result"];
    let content = r["content"].as_array().unwrap_or_else(|| panic!("no content: {value:#}"));
    assert_eq!(content.len(), 1, "{value:#}");
    assert_eq!(content[0]["type"], "text", "{value:#}");
    let text: Value = serde_json::from_str(content[0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(as_js(&text), r["structuredContent"], "text and structuredContent differ");
    (text, r["isError"] == true)
}

/// `v` as JavaScript prints it back: a number with no fraction loses its `.0` (the
/// Inspector re-serialises structuredContent; our text keeps serde_json's `0.0`).
fn as_js(v: &Value) -> Value {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
            _ => v.clone(),
        },
        Value::Array(a) => a.iter().map(as_js).collect(),
        Value::Object(o) => o.iter().map(|(k, v)| (k.clone(), as_js(v))).collect(),
        _ => v.clone(),
    }
}

/// A tool error exactly as the model reads it: `{error, message, next}` and nothing else.
fn tool_error(code: i32, value: &Value, expected: &str) -> Value {
    let (e, is_error) = tool_result(value);
    assert!(is_error, "{value:#}");
    assert_eq!(code, 5, "the Inspector exits 5 for a result with isError");
    assert_eq!(e["error"], expected, "{e:#}");
    let keys: Vec<&str> = e.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["error", "message", "next"], "{e:#}");
    assert!(!e["message"].as_str().unwrap().is_empty() && !e["next"].as_str().unwrap().is_empty(), "{e:#}");
    e
}

#[test]
fn the_inspector_cli_lists_the_tools_with_their_annotations() {
    let laptop = Laptop::new("insp-list");
    let manifest = stdout_json(&laptop.host(&["describe"]));
    let (code, v) = inspect(&laptop, &["--boxd", boxd_local().to_str().unwrap()], &["--method", "tools/list"]);
    assert_eq!(code, 0, "{v:#}");
    let tools = v["result"]["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 10, "{v:#}");
    let described = manifest["tools"].as_array().unwrap();
    for (listed, spec) in tools.iter().zip(described) {
        let name = &spec["name"];
        assert_eq!(&listed["name"], name);
        assert_eq!(listed["inputSchema"], spec["inputSchema"], "{name}");
        assert_eq!(listed["description"], spec["description"], "{name}");
        assert_eq!(listed["annotations"]["readOnlyHint"], spec["access"] == "read", "{name}");
        assert_eq!(listed["annotations"]["destructiveHint"], spec["destructive"] == true, "{name}");
    }
    let destructive: Vec<&Value> = tools.iter().filter(|t| t["annotations"]["destructiveHint"] == true).map(|t| &t["name"]).collect();
    assert_eq!(destructive, ["boxd_drop"]);
    let read_only: Vec<&Value> = tools.iter().filter(|t| t["annotations"]["readOnlyHint"] == true).map(|t| &t["name"]).collect();
    assert_eq!(read_only, ["boxd_status", "boxd_job"]);
}

#[test]
fn the_inspector_cli_calls_status_on_boxd_local() {
    let laptop = Laptop::new("insp-status");
    let oc = opencode_bin();
    let version = Command::new(&oc).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    let boxd = boxd_local();
    let flags = ["--boxd", boxd.to_str().unwrap(), "--opencode", oc.to_str().unwrap()];
    let (code, v) = inspect(&laptop, &flags, &["--method", "tools/call", "--tool-name", "boxd_status"]);
    assert_eq!(code, 0, "{v:#}");
    let (status, is_error) = tool_result(&v);
    assert!(!is_error, "{status:#}");
    assert_eq!(status["boxd"]["cli"], "signed in", "{status:#}");
    assert_eq!(status["host"]["name"], "boxd-host-mcp");
    assert_eq!(status["guest"]["opencode"], version.as_str(), "the laptop OpenCode comes from --opencode");
    assert_eq!(status["tools"].as_array().unwrap().len(), 10);
    for field in ["agentsWithoutRules", "rulesAdded", "skills"] {
        assert!(status.get(field).is_none(), "{field} is the OpenCode bridge's alone: {status:#}");
    }
    assert!(laptop.boxd_calls().iter().any(|c| c.join(" ").starts_with("machine list")), "status asked boxd-local: {:?}", laptop.boxd_calls());
}

#[test]
fn the_inspector_cli_sees_refusals_as_error_next_objects() {
    let laptop = Laptop::new("insp-refused");
    let boxd = boxd_local();
    let flags = ["--boxd", boxd.to_str().unwrap()];
    let (code, v) = inspect(&laptop, &flags, &["--method", "tools/call", "--tool-name", "boxd_ensure", "--tool-args-json", r#"{"work":42}"#]);
    let e = tool_error(code, &v, "ARGS_INVALID");
    assert_eq!(e["message"], "argument 'work' must be a string");
    assert!(laptop.boxd_calls().is_empty(), "a refused call runs nothing: {:?}", laptop.boxd_calls());

    // Past its checks a long call sends progress when the client asks (the Python SDK
    // test asserts the notifications); the Inspector CLI 2.12 builds its client with
    // progress off and shows none, so here the result must simply arrive whole.
    let request = ["--method", "tools/call", "--tool-name", "boxd_ensure", "--tool-arg", "work=w1", "--tool-metadata", "progressToken=ensure-1"];
    let (code, v) = inspect(&laptop, &flags, &request);
    let e = tool_error(code, &v, "SNAPSHOT_MISSING");
    assert!(e["message"].as_str().unwrap().contains("no machine was created"), "{e:#}");

    // A grant the host cannot make: the server still starts, lists its tools and answers
    // the call with the problem (before, the Inspector saw only "Connection closed").
    let missing = ["--boxd", "/no/such/boxd"];
    let (code, v) = inspect(&laptop, &missing, &["--method", "tools/list"]);
    assert_eq!((code, v["result"]["tools"].as_array().map(Vec::len)), (0, Some(10)), "{v:#}");
    let (code, v) = inspect(&laptop, &missing, &["--method", "tools/call", "--tool-name", "boxd_status"]);
    let e = tool_error(code, &v, "OPTIONS_INVALID");
    assert!(e["message"].as_str().unwrap().contains("/no/such/boxd"), "{e:#}");
}
