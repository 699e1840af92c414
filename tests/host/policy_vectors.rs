//! The shared policy vectors (tests/vectors/policy.json) against boxd-host's own code:
//! `policy::resolve`, `Policy::allows`/`allows_cwd`/`allows_env` and `policy::host_failed`. The
//! OpenCode bridge runs the same file through lib/policy.js
//! (tests/opencode/policy_vectors.test.js), so both hosts must reach the same outcome.
//!
//! A vector: `setup` builds a world in a fresh temp dir (`dir`, `file`, `symlink`, each
//! with an optional octal `mode`); `env`, `options`, `cwd` are the request, the project
//! is `{tmp}/proj`; `expect` is either `problem` {code, field?, next} or the fields of the
//! grants to check (`programs`, `ledger`, `ledgerMode`, `preopens`, `childEnv` (every
//! variable some child may get), `childEnvOf` (program → what its child gets),
//! `componentOptions`, `spawn`). A `spawn` check asks for `program` with `args` (none when
//! absent), an optional `cwd` and optional `env` pairs the request sets, and is `allowed`
//! (with the `grant` matched), `refused` (the exact text) or `refusedStartsWith`. `{tmp}` stands for the temp dir everywhere.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use boxd_host::policy::{self, GrantRequest, Refusal};
use serde_json::{json, Map, Value};

use crate::common::Scratch;

fn vectors() -> Value {
    serde_json::from_str(include_str!("../vectors/policy.json")).expect("tests/vectors/policy.json is JSON")
}

/// `v` with every "{tmp}" in its strings replaced.
fn placed(v: &Value, tmp: &Path) -> Value {
    let t = tmp.display().to_string();
    match v {
        Value::String(s) => json!(s.replace("{tmp}", &t)),
        Value::Array(a) => Value::Array(a.iter().map(|x| placed(x, tmp)).collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, x)| (k.clone(), placed(x, tmp))).collect()),
        other => other.clone(),
    }
}

fn build_world(tmp: &Path, setup: &Value) {
    for item in setup.as_array().expect("setup is a list") {
        let s = |k: &str| item.get(k).and_then(Value::as_str);
        let (path, is_file) = match (s("dir"), s("file"), s("symlink")) {
            (Some(d), None, None) => (tmp.join(d), false),
            (None, Some(f), None) => (tmp.join(f), true),
            (None, None, Some(l)) => {
                let link = tmp.join(l);
                std::fs::create_dir_all(link.parent().unwrap()).unwrap();
                std::os::unix::fs::symlink(s("to").expect("a symlink names its target"), &link).unwrap();
                continue;
            }
            _ => panic!("a setup item is one of dir, file, symlink: {item}"),
        };
        if is_file {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, "#!/bin/sh\n").unwrap();
        } else {
            std::fs::create_dir_all(&path).unwrap();
        }
        if let Some(mode) = s("mode") {
            let mode = u32::from_str_radix(mode, 8).expect("mode is octal");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
    }
}

fn request(v: &Value, tmp: &Path) -> GrantRequest {
    GrantRequest {
        project: tmp.join("proj"),
        options: Some(v["options"].to_string()),
        env: v["env"].as_object().expect("env is an object").iter().map(|(k, x)| (k.clone(), x.as_str().unwrap().to_string())).collect(),
        cwd: v.get("cwd").and_then(Value::as_str).map(PathBuf::from).unwrap_or_else(|| tmp.to_path_buf()),
        ..GrantRequest::default()
    }
}

/// The outcome as the vectors word it, keeping only the fields `expect` names.
fn outcome(v: &Value, tmp: &Path, expect: &Map<String, Value>) -> Value {
    let grants = match policy::resolve(&request(v, tmp)) {
        Err(p) => {
            let field = p.message.strip_prefix("plugin option '").and_then(|m| m.split_once('\'')).map(|(f, _)| f.to_string());
            let mut problem = json!({ "code": p.code, "next": p.next });
            if expect["problem"].get("field").is_some() {
                problem["field"] = json!(field);
            }
            return json!({ "problem": problem });
        }
        Ok(g) => g,
    };
    let mut out = Map::new();
    for key in expect.keys() {
        let value = match key.as_str() {
            "programs" => json!(grants.policy.programs().iter().map(|(k, p)| (k.clone(), json!(p))).collect::<Map<_, _>>()),
            "ledger" => json!(grants.ledger),
            "ledgerMode" => json!(format!("{:o}", std::fs::metadata(&grants.ledger).unwrap().permissions().mode() & 0o777)),
            "preopens" => json!(grants.policy.preopens().iter().map(|p| &p.path).collect::<Vec<_>>()),
            "childEnv" => env_json(boxd_host::policy::program_names().iter().flat_map(|p| grants.policy.child_env(p))),
            "childEnvOf" => json!(expect["childEnvOf"].as_object().unwrap().keys().map(|p| (p.clone(), env_json(grants.policy.child_env(p)))).collect::<Map<_, _>>()),
            "componentOptions" => grants.component_options.clone(),
            "spawn" => Value::Array(expect["spawn"].as_array().unwrap().iter().map(|ask| spawn(&grants.policy, ask)).collect()),
            "problem" => json!("granted"),
            other => panic!("unknown expect key {other}"),
        };
        out.insert(key.clone(), value);
    }
    Value::Object(out)
}

/// Variables as the vectors word them: one object, sorted by name.
fn env_json(vars: impl IntoIterator<Item = (String, String)>) -> Value {
    Value::Object(vars.into_iter().map(|(k, x)| (k, json!(x))).collect())
}

/// One spawn check in the vectors' words: allowed (with its grant), refused (exact) or
/// refusedStartsWith.
fn spawn(policy: &policy::Policy, ask: &Value) -> Value {
    let program = ask["program"].as_str().unwrap();
    let args: Vec<String> = ask.get("args").and_then(Value::as_array).into_iter().flatten().map(|a| a.as_str().unwrap().to_string()).collect();
    let env: Vec<(String, String)> = ask.get("env").and_then(Value::as_array).into_iter().flatten().map(|p| (p[0].as_str().unwrap().to_string(), p[1].as_str().unwrap().to_string())).collect();
    let answer = match (policy.allows_call(program, &args), ask.get("cwd").and_then(Value::as_str)) {
        (Err(r), _) => Err(r),
        (Ok((_, g)), Some(cwd)) => policy.allows_cwd(cwd).map(|_| g),
        (Ok((_, g)), None) => Ok(g),
    }
    .and_then(|g| policy.allows_env(program, &env).map(|()| g));
    let mut out = ask.clone();
    let asked = |out: &mut Value| out.as_object_mut().unwrap().retain(|k, _| k == "program" || k == "args" || k == "cwd" || k == "env");
    match (answer, ask.get("refusedStartsWith").and_then(Value::as_str)) {
        (Ok(grant), _) => {
            asked(&mut out);
            out["allowed"] = json!(true);
            out["grant"] = json!(grant.name);
        }
        (Err(Refusal::NotAllowed(m) | Refusal::CwdOutside(m)), Some(prefix)) if m.starts_with(prefix) => {}
        (Err(Refusal::NotAllowed(m) | Refusal::CwdOutside(m)), _) => {
            asked(&mut out);
            out["refused"] = json!(m);
        }
    }
    out
}

#[test]
fn every_policy_vector_has_its_outcome_in_boxd_host() {
    let doc = vectors();
    let list = doc["vectors"].as_array().unwrap();
    assert!(list.len() >= 20, "the vectors file lost its vectors");
    for raw in list {
        let s = Scratch::new("vector");
        let v = placed(raw, &s.0);
        build_world(&s.0, &v["setup"]);
        let expect = v["expect"].as_object().expect("a vector expects something");
        assert_eq!(outcome(&v, &s.0, expect), Value::Object(expect.clone()), "vector: {}", v["name"]);
    }
}

#[test]
fn a_trap_is_host_failed_with_the_vectors_words() {
    for case in vectors()["hostFailed"].as_array().unwrap() {
        let e = policy::host_failed(case["tool"].as_str().unwrap(), case["message"].as_str().unwrap());
        assert_eq!(json!({ "code": e["error"], "message": e["message"], "next": e["next"] }), case["expect"]);
    }
}

/// The vectors through lib/policy.js, then the probe's dangerous calls through the
/// bridge's plugin module (as confinement.rs makes them through boxd-host).
#[test]
fn every_policy_vector_has_its_outcome_in_the_opencode_bridge() {
    crate::common::build_bridge();
    let out = std::process::Command::new("node")
        .args(["--test", "tests/opencode/policy_vectors.test.js"])
        .current_dir(crate::common::repo())
        .env("BOXD_PROBE_WASM", crate::common::probe_wasm())
        .output()
        .expect("node runs the bridge's vector test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // A skipped suite shows as "# SKIP", not in the skipped count.
    let ran = stdout.contains("# fail 0") && stdout.contains("# skipped 0") && !stdout.contains("# SKIP");
    assert!(out.status.success() && ran, "{}", crate::opencode::tail(&stdout));
}
