//! One conformance suite for every host: tests/conformance/scenario.json runs through
//! `boxd-host call`, the MCP server (official Python client) and the OpenCode bridge (a
//! real opencode with the scripted model), each against its own boxd-local, and the
//! normalised results must be equal.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::common::*;

fn scenario() -> Value {
    serde_json::from_str(include_str!("../conformance/scenario.json")).unwrap()
}

/// What must match across hosts: the error code (and on a host-setup step its next step),
/// or the fields that carry meaning (never timings, ids or paths, which differ per run).
fn normalise(step: &Value, value: &Value) -> Value {
    let tool = step["tool"].as_str().unwrap();
    if let Some(code) = value.get("error").and_then(Value::as_str) {
        if step.get("host").is_some() {
            return json!({ "tool": tool, "error": code, "next": value["next"] });
        }
        return json!({ "tool": tool, "error": code, "hasNext": value["next"].as_str().is_some_and(|n| !n.is_empty()) });
    }
    if let Some(text) = value.as_str() {
        return json!({ "tool": tool, "text": text });
    }
    let pick = |keys: &[&str]| -> Value {
        let mut m = serde_json::Map::new();
        m.insert("tool".into(), json!(tool));
        for k in keys {
            m.insert((*k).into(), value.get(*k).cloned().unwrap_or(Value::Null));
        }
        Value::Object(m)
    };
    match tool {
        "boxd_status" => json!({ "tool": tool, "cli": value["boxd"]["cli"], "snapshot": value["snapshot"]["present"], "works": value["works"].as_array().map(Vec::len) }),
        "boxd_ensure" => pick(&["machine", "state", "created", "adopted"]),
        "boxd_submit" => json!({ "tool": tool, "admitted": value["admitted"], "queued": value["queued"], "files": value["files"] }),
        "boxd_job" => pick(&["state", "outcome", "lastText", "pending", "asleepBy"]),
        "boxd_harvest" => json!({
            "tool": tool, "proven": value["proven"], "sessions": value["sessions"].as_array().map(Vec::len),
            "git": value["git"]["repo"], "files": value["files"].as_array().map(|f| f.iter().map(|x| json!([x["path"], x["sha256"]])).collect::<Vec<_>>()),
        }),
        "boxd_sleep" => pick(&["state", "asleepBy", "alreadyAsleep"]),
        "boxd_resume" => pick(&["state", "action"]),
        "boxd_drop" => pick(&["state", "dropped"]),
        "boxd_fork" => json!({ "tool": tool, "queued": value["queued"], "forks": value["forks"].as_array().map(|f| f.iter().map(|x| json!([x["work"], x["state"], x["parent"]])).collect::<Vec<_>>()) }),
        _ => pick(&["state"]),
    }
}

/// Lay out the scenario's laptop files in a world's project.
fn prepare(world: &World) {
    for (name, content) in scenario()["files"].as_object().unwrap() {
        std::fs::write(world.laptop.project.join(name), content.as_str().unwrap()).unwrap();
    }
    std::fs::create_dir_all(world.laptop.project.join("out")).unwrap();
}

/// The boxd-host flags of a step's host setup (scenario `hosts`): none for the default. A
/// laptop opencode that fails is laid out in `scratch`.
fn setup_flags(step: &Value, scratch: &Path) -> Vec<String> {
    let Some(name) = step.get("host").and_then(Value::as_str) else { return Vec::new() };
    let setup = &scenario()["hosts"][name];
    let mut flags = Vec::new();
    if let Some(options) = setup.get("options") {
        flags.extend(["--options".to_string(), options.to_string()]);
    }
    if setup.get("component").and_then(Value::as_str) == Some("probe") {
        flags.extend(["--component".to_string(), probe_wasm().display().to_string()]);
    }
    if let Some(fails) = setup.get("opencodeFails").and_then(Value::as_u64) {
        flags.extend(["--opencode".to_string(), failing_opencode(&scratch.join("failing-opencode"), fails).display().to_string()]);
    }
    flags
}

/// tests/conformance/opencode-that-fails.sh in `dir`, beside the real opencode and its count
/// of failures (scenario `opencodeFails`).
fn failing_opencode(dir: &Path, fails: u64) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let wrapper = dir.join("opencode");
    std::fs::copy(repo().join("tests/conformance/opencode-that-fails.sh"), &wrapper).unwrap();
    let _ = std::fs::remove_file(dir.join("real"));
    std::os::unix::fs::symlink(opencode_bin(), dir.join("real")).unwrap();
    std::fs::write(dir.join("fails"), fails.to_string()).unwrap();
    std::fs::write(dir.join("commands"), "").unwrap();
    wrapper
}

/// After a step whose laptop opencode fails: the host ran it as many times as it fails, and
/// imported as often as the setup's `opencodeImports` says.
fn failures_spent(step: &Value, scratch: &Path) {
    let Some(name) = step.get("host").and_then(Value::as_str) else { return };
    let setup = &scenario()["hosts"][name];
    if setup.get("opencodeFails").is_some() {
        let dir = scratch.join("failing-opencode");
        let left = std::fs::read_to_string(dir.join("fails")).unwrap();
        assert_eq!(left.trim(), "0", "{}: the laptop's opencode was not run as often as it fails", step["tool"]);
        let ran = std::fs::read_to_string(dir.join("commands")).unwrap();
        assert_eq!(Some(ran.lines().filter(|c| *c == "import").count() as u64), setup["opencodeImports"].as_u64(), "{}: imports: {ran}", step["tool"]);
    }
}

/// A step's boxd-local fault rules (scenario `faults`), written just before it.
fn arm_faults(boxd_home: &std::path::Path, step: &Value) {
    if let Some(rules) = step.get("faults") {
        std::fs::write(boxd_home.join("faults.json"), rules.to_string()).unwrap();
    }
}

/// After a step with faults: every rule fired (its uses spent), and none is left for the next.
fn disarm_faults(boxd_home: &std::path::Path, step: &Value) {
    if step.get("faults").is_none() {
        return;
    }
    let file = boxd_home.join("faults.json");
    let rules: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    std::fs::remove_file(&file).unwrap();
    for rule in rules.as_array().unwrap() {
        assert_eq!(rule["times"], json!(0), "{}: the fault {rule} never fired", step["tool"]);
    }
}

/// A runner's results: each step normalised, and each step's raw answer (for a failure's message).
type Results = (Vec<Value>, Vec<Value>);

fn via_cli() -> Results {
    let world = World::new("conf-cli");
    prepare(&world);
    let (mut out, mut raw) = (Vec::new(), Vec::new());
    for step in scenario()["steps"].as_array().unwrap() {
        let (tool, args) = (step["tool"].as_str().unwrap(), step["args"].to_string());
        let flags = setup_flags(step, &world.laptop.scratch.0);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        arm_faults(&world.laptop.boxd_home, step);
        let mut v = world.call_with(&flags, tool, &args).1;
        disarm_faults(&world.laptop.boxd_home, step);
        failures_spent(step, &world.laptop.scratch.0);
        let until = step.get("until").and_then(Value::as_object);
        let mut tries = 0;
        while until.is_some_and(|u| u.iter().all(|(k, x)| &v[k] == x)) && tries < 240 {
            std::thread::sleep(std::time::Duration::from_millis(500));
            v = world.call_with(&flags, tool, &args).1;
            tries += 1;
        }
        out.push(normalise(step, &v));
        raw.push(v);
    }
    (out, raw)
}

fn via_mcp() -> Results {
    let world = World::new("conf-mcp");
    prepare(&world);
    let venv = repo().join("tests/.venv/bin/python");
    assert!(venv.exists(), "run bash tests/bootstrap.sh (it creates tests/.venv with the mcp package)");
    let results = world.laptop.scratch.0.join("mcp-results.json");
    let oc = opencode_bin();
    let path = format!("{}:{}", oc.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let status = std::process::Command::new(venv)
        .arg(repo().join("tests/conformance/mcp_runner.py"))
        .args(["--host", boxd_host().to_str().unwrap(), "--probe", probe_wasm().to_str().unwrap(), "--out", results.to_str().unwrap(), "--"])
        .args(["--project", world.laptop.project.to_str().unwrap(), "--ledger", world.laptop.ledger.to_str().unwrap()])
        .args(["--boxd", boxd_local().to_str().unwrap(), "--opencode", oc.to_str().unwrap()])
        .env("BOXD_LOCAL_HOME", &world.laptop.boxd_home)
        .env("BOXD_HOST_CACHE", cache_dir())
        .env("PATH", path)
        .envs(world.laptop_env())
        .status()
        .unwrap();
    assert!(status.success(), "the MCP runner failed");
    normalised(&std::fs::read(results).unwrap())
}

/// A runner's raw results (one {tool, value} per step, in order), normalised.
fn normalised(raw: &[u8]) -> Results {
    let raw: Vec<Value> = serde_json::from_slice(raw).unwrap();
    let steps = scenario()["steps"].as_array().unwrap().clone();
    assert_eq!(raw.len(), steps.len(), "a runner skipped steps");
    let values: Vec<Value> = raw.into_iter().map(|mut r| r["value"].take()).collect();
    (steps.iter().zip(&values).map(|(step, v)| normalise(step, v)).collect(), values)
}

/// Two runners agree step by step; the first step that differs is shown with both raw
/// answers (an error's message is not part of the comparison, but says why). An `Err`, not a
/// panic: the harness then prints it last, after no backtrace, where a log's tail shows it.
fn same(what: &str, (a, a_raw): &Results, (b, b_raw): &Results) -> Result<(), Differs> {
    let Some(i) = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i)) else { return Ok(()) };
    let raw = |v: &[Value]| v.get(i).map_or_else(|| "(no step)".to_string(), |v| v.to_string().chars().take(800).collect());
    let step = |v: &[Value]| v.get(i).map_or_else(|| "(no step)".to_string(), Value::to_string);
    Err(Differs(format!(
        "{what} differs from boxd-host call at step {i}:\ncompared, {what}: {}\ncompared, boxd-host call: {}\nanswer, {what}: {}\nanswer, boxd-host call: {}",
        step(a), step(b), raw(a_raw), raw(b_raw)
    )))
}

/// A difference between runners, printed as its lines (a `String`'s Debug would quote it).
pub struct Differs(String);

impl std::fmt::Debug for Differs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[test]
fn every_host_gives_the_same_results() -> Result<(), Differs> {
    // Every runner finishes (and cleans up its machines) before anything is asserted.
    let (cli, opencode, mcp) = (std::thread::spawn(via_cli), std::thread::spawn(via_opencode), std::thread::spawn(via_mcp));
    let (cli, opencode, mcp) = (cli.join(), opencode.join(), mcp.join());
    let (cli_results, mcp) = (cli.expect("the boxd-host call runner failed"), mcp.expect("the MCP runner failed"));
    let cli = &cli_results.0;
    // The scenario itself: what a user must see, whichever host.
    assert_eq!(cli[0]["cli"], "signed in");
    assert_eq!(cli[1]["created"], true);
    assert_eq!(cli[2]["created"], false, "the second ensure is idempotent");
    assert_eq!(cli[4]["outcome"], "completed", "{:#}", cli[4]);
    assert_eq!(cli[6]["forks"], json!([["conf-b", "running", "conf"]]), "a proven work forks");
    assert_eq!(cli[8]["dropped"], true, "the fork drops once harvested: {:#}", cli[8]);
    assert_eq!(cli[5]["files"][0][1], crate::guest::sha256(b"conformance input\ndone\n").as_str());
    assert_eq!(cli[10]["asleepBy"], "boxd_sleep");
    assert_eq!(cli[11]["error"], "MACHINE_ASLEEP", "drop checks a live machine: an asleep one is resumed first");
    assert_eq!(cli[12]["action"], "woken");
    let codes: Vec<&str> = cli[13..17].iter().map(|v| v["error"].as_str().unwrap_or("-")).collect();
    assert_eq!(codes, ["NAME_INVALID", "WORK_UNKNOWN", "ARGS_INVALID", "PATH_REFUSED"]);
    assert_eq!(cli[17]["dropped"], true, "everything on the machine is accounted for: {:#}", cli[17]);
    // Host setups: an options error, a program the policy does not grant, a trap.
    assert_eq!(cli[18]["error"], "OPTIONS_INVALID");
    assert!(cli[18]["next"].as_str().unwrap().contains("'access'"), "{:#}", cli[18]);
    assert_eq!(cli[19]["text"], "not-allowed: {}: not in the host's policy (allowed: boxd, opencode, git)");
    assert_eq!((cli[20]["error"].as_str(), cli[20]["next"].as_str()), (Some("HOST_FAILED"), Some(boxd_host::policy::host_failed_next())));
    // A laptop opencode whose database stays locked, then one that loses a race twice.
    assert_eq!(cli[33]["outcome"], "completed", "{:#}", cli[33]);
    assert_eq!(cli[34]["error"], "IMPORT_FAILED", "{:#}", cli_results.1[34]);
    assert!(cli_results.1[34]["message"].as_str().unwrap().contains("database is locked"), "{:#}", cli_results.1[34]);
    assert_eq!((&cli[35]["proven"], &cli[35]["sessions"]), (&json!(true), &json!(1)), "{:#}", cli_results.1[35]);
    assert_eq!(cli[36]["dropped"], true, "{:#}", cli[36]);
    same("the MCP server", &mcp, &cli_results)?;
    let oc = opencode.expect("the OpenCode runner failed");
    same("the OpenCode bridge", &oc, &cli_results)
}

/// The same scenario in a real opencode with the bridge loaded; tests/opencode's
/// conformance.test.js writes each tool part's result to target/conformance-opencode.json.
fn via_opencode() -> Results {
    build_bridge();
    let results = repo().join("target/conformance-opencode.json");
    let out = std::process::Command::new("node")
        .args(["--test", "tests/opencode/conformance.test.js"])
        .current_dir(repo())
        .env("BOXD_LOCAL_BIN", boxd_local())
        .env("BOXD_PROBE_WASM", probe_wasm())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("# fail 0") && !stdout.contains("# SKIP"), "{}", crate::opencode::tail(&stdout));
    normalised(&std::fs::read(&results).unwrap())
}

/// Prose the model or the user reads, where tool names belong: (file, first line, last
/// line) of each allowed constant. Anything else naming a tool is logic a host must take
/// from the manifest instead.
const PROSE: &[(&str, &str, &str)] = &[
    ("host-bridge/src/commands/mcp.rs", "pub const INSTRUCTIONS", "\";"),
    ("host-bridge/opencode/index.js", "const STATUS_COMMAND = {", "};"),
];

/// A file's lines that are code: no comments, no test module, no allowed prose.
fn code_lines(file: &str, text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut prose_end: Option<&str> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            break;
        }
        if let Some(end) = prose_end {
            if t.starts_with(end) || line.trim_end().ends_with(end) {
                prose_end = None;
            }
            continue;
        }
        if let Some((_, _, end)) = PROSE.iter().find(|(f, start, _)| *f == file && t.starts_with(start)) {
            prose_end = Some(end);
            continue;
        }
        if t.starts_with("//") || t.starts_with("/*") || t.starts_with('*') {
            continue;
        }
        // A command line shown to the user (`boxd-host call <tool>`) is prose too.
        let code = line.split(" //").next().unwrap_or(line);
        if !code.contains("boxd-host call ") {
            out.push((i + 1, code.to_string()));
        }
    }
    out
}

#[test]
fn no_host_source_names_a_tool_outside_prose() {
    let rt = boxd_host::runtime::Runtime::load(boxd_host::COMPONENT, boxd_host::policy::Policy::new(), Some(cache_dir())).unwrap();
    let manifest: Value = serde_json::from_str(&rt.describe().unwrap()).unwrap();
    let tools: Vec<String> = manifest["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_string()).collect();
    assert!(tools.len() >= 9, "{tools:?}");
    let repo = repo();
    let mut files: Vec<String> = Vec::new();
    // Every source file below the hosts' folders, nested rooms included.
    let mut dirs: Vec<(String, &str)> = vec![("host-bridge/src".into(), "rs"), ("host-bridge/opencode/lib".into(), "js")];
    while let Some((dir, ext)) = dirs.pop() {
        for e in std::fs::read_dir(repo.join(&dir)).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if e.file_type().unwrap().is_dir() {
                dirs.push((format!("{dir}/{name}"), ext));
            } else if name.ends_with(&format!(".{ext}")) {
                files.push(format!("{dir}/{name}"));
            }
        }
    }
    assert!(files.iter().any(|f| f.ends_with("commands/tour.rs")), "{files:?}");
    files.extend(["host-bridge/opencode/index.js", "host-bridge/opencode/worker.js"].map(String::from));
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    let mut hits = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(repo.join(file)).unwrap();
        for (n, line) in code_lines(file, &text) {
            for tool in &tools {
                let named = line.match_indices(tool.as_str()).any(|(i, _)| !word(line[..i].chars().next_back()) && !word(line[i + tool.len()..].chars().next()));
                if named {
                    hits.push(format!("{file}:{n}: {tool}: {}", line.trim()));
                }
            }
        }
    }
    assert!(hits.is_empty(), "host code names tools (take it from the manifest):\n{}", hits.join("\n"));
}
