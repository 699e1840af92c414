//! State integrity and the call log: parallel invocations never tear state.json, and the
//! log has exactly one line per invocation.

mod common;
use common::*;
use serde_json::Value;

#[test]
fn parallel_invocations_do_not_tear_state() {
    let h = Home::new("parallel");
    h.ok(&["version"]); // create the state folder first
    let mut children = Vec::new();
    for i in 0..20 {
        children.push(h.cmd(&["machine", "new", &format!("m{i}"), "--json"]).spawn().unwrap());
        children.push(h.cmd(&["env", "set", &format!("K{i}"), &format!("v{i}")]).spawn().unwrap());
    }
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let state: Value = serde_json::from_slice(&std::fs::read(h.dir.join("state.json")).unwrap()).unwrap();
    assert_eq!(state["schema"], 1);
    assert_eq!(state["machines"].as_array().unwrap().len(), 20);
    assert_eq!(state["env"].as_array().unwrap().len(), 20);
    assert_eq!(h.json(&["machine", "list"]).as_array().unwrap().len(), 20);
    let mut ids: Vec<String> =
        state["machines"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_string()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 20, "ids are unique");
    assert_eq!(h.calls().len(), 1 + 40 + 1);
}

#[test]
fn call_log_counts_exactly_the_invocations() {
    let h = Home::new("calls");
    h.ok(&["machine", "new", "a"]);
    h.run(&["machine", "get", "missing", "--json"]);
    h.run(&["machine", "exec", "a", "--", "exit 7"]);
    h.run_in(&["machine", "exec", "a", "--", "cat >/dev/null"], b"do not log me");
    h.run(&["bogus-verb"]);
    let calls = h.calls();
    assert_eq!(calls.len(), 5);
    for c in &calls {
        assert_shape(c, &[("t", "number"), ("argv", "array"), ("exit_code", "number"), ("duration_ms", "number")]);
    }
    assert_eq!(calls[0]["argv"], serde_json::json!(["machine", "new", "a"]));
    let codes: Vec<i64> = calls.iter().map(|c| c["exit_code"].as_i64().unwrap()).collect();
    assert_eq!(codes, [0, 1, 7, 0, 1]);
    let log = std::fs::read_to_string(h.dir.join("calls.jsonl")).unwrap();
    assert!(!log.contains("do not log me"), "stdin is never logged");
}

#[test]
fn a_corrupt_state_file_is_reported_not_overwritten() {
    let h = Home::new("corrupt");
    h.ok(&["version"]);
    std::fs::write(h.dir.join("state.json"), "{ not json").unwrap();
    assert!(h.fails(&["machine", "list"]).contains("unreadable"));
    assert_eq!(std::fs::read_to_string(h.dir.join("state.json")).unwrap(), "{ not json");
    std::fs::remove_file(h.dir.join("state.json")).unwrap();
}
