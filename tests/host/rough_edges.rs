//! Rough edges a new user met (issue 17), each run with the real binaries: boxd-host, the
//! component, boxd-local and the pinned OpenCode on both sides.

use std::process::Output;

use serde_json::Value;

use crate::common::*;

const W1: &str = r#"{"work":"w1"}"#;

/// `boxd-host call` as `world`'s laptop, but with a laptop OpenCode that reports `version`
/// (it is the pinned one otherwise), so the golden image's OpenCode differs from it.
fn call_as_opencode(world: &World, version: &str, options: &str, tool: &str, args: &str) -> (Output, Value) {
    let real = opencode_bin();
    let fake = world.laptop.scratch.path("other-opencode").join("opencode");
    let script = format!("#!/bin/sh\n[ \"$1\" = --version ] && {{ echo {version}; exit 0; }}\nexec '{}' \"$@\"\n", real.display());
    std::fs::write(&fake, script).unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", real.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let mut env = world.laptop_env();
    env.push(("PATH".into(), path));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = world.laptop.host_with(&["--opencode", fake.to_str().unwrap(), "--options", options, "call", tool, args], &env);
    let v = stdout_json(&out);
    (out, v)
}

fn machines(world: &World) -> Vec<String> {
    let out = world.laptop.boxd(&["machine", "list", "--json"]);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    list.as_array().unwrap().iter().filter_map(|m| m["name"].as_str().map(String::from)).collect()
}

/// With `allowUntestedHost` a laptop OpenCode outside the tested range is let through, and
/// the golden image's OpenCode then differs from it. The machine ensure just created can
/// never serve the work: it is removed and the work closed, so nothing is left billing,
/// and once the versions agree a plain ensure starts the work afresh.
#[test]
fn a_guest_version_mismatch_leaves_no_machine_behind() {
    let world = World::new("guest-version");
    let (out, e) = call_as_opencode(&world, "1.19.0", r#"{"allowUntestedHost":true}"#, "boxd_ensure", W1);
    assert_eq!(out.status.code(), Some(1), "{e:#}");
    assert_eq!(e["error"], "GUEST_VERSION", "{e:#}");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("1.19.0") && message.contains("1.18.33"), "names both versions: {message}");
    assert!(message.contains("oc-w1 was removed"), "says what became of the machine: {message}");
    assert!(!machines(&world).contains(&"oc-w1".to_string()), "no machine left running: {:?}", machines(&world));
    assert_eq!(world.calls_starting(&["machine", "remove", "oc-w1"]), 1);

    // The ledger recorded the machine before it was made, and closed the work after.
    let record: Value = serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap()).unwrap();
    assert_eq!(record["state"], "closed", "{record:#}");
    let status = world.ok_call("boxd_status", "{}");
    assert_eq!(status["works"].as_array().unwrap().len(), 0, "no open work: {status:#}");

    // The versions agree again: the same work id starts afresh.
    let v = world.ok_call("boxd_ensure", W1);
    assert_eq!((v["created"].as_bool(), v["state"].as_str()), (Some(true), Some("running")), "{v:#}");
}
