//! Fault injection: every action, consumption of `times`, alias matching, the `machine`
//! filter, and rules from the BOXD_LOCAL_FAULTS env var.

mod common;
use common::*;
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn hang_then_124_and_times_are_consumed() {
    let h = Home::new("hang");
    h.write_faults(json!([{"verb": "machine list", "times": 1, "action": "hang", "ms": 300}]));
    let t0 = Instant::now();
    let r = h.run(&["ls", "--json"]);
    assert_eq!(r.code, 124);
    assert!(t0.elapsed() >= Duration::from_millis(300));
    assert_eq!(r.out, "");
    assert_eq!(h.faults()[0]["times"], 0, "the file records the use");
    h.json(&["machine", "list"]);
    let calls = h.calls();
    assert_eq!(calls[0]["fault"], "hang");
    assert_eq!(calls[0]["exit_code"], 124);
    assert!(calls[1].get("fault").is_none());
}

#[test]
fn hang_forever_is_logged_before_it_hangs() {
    let h = Home::new("hang-forever");
    h.write_faults(json!([{"verb": "machine get", "action": "hang"}]));
    let mut child = h.cmd(&["machine", "get", "x"]).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "still hanging");
    child.kill().unwrap();
    child.wait().unwrap();
    let calls = h.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!((calls[0]["fault"].as_str(), calls[0]["duration_ms"].is_null()), (Some("hang"), true));
}

#[test]
fn hang_that_lands_creates_the_machine_later() {
    let h = Home::new("hang-land");
    h.write_faults(json!([{"verb": "machine new", "times": 1, "action": "hang", "ms": 100, "land": true, "appear_after_ms": 700}]));
    let r = h.run(&["machine", "new", "late", "--json"]);
    assert_eq!(r.code, 124);
    assert_eq!(h.fails(&["machine", "get", "late"]), "error: VM 'late' not found");
    assert_eq!(h.json(&["machine", "list"]), json!([]));
    // The name is taken already: a retry would duplicate it on real boxd.
    assert_eq!(h.fails(&["machine", "new", "late"]), "error: VM 'late' already exists");
    wait_for("the machine to appear", 5, || h.run(&["machine", "get", "late"]).code == 0);
    assert_eq!(h.status("late"), "running");
}

#[test]
fn fail_that_lands_acts_then_fails_and_prints_only_the_error() {
    let h = Home::new("fail-land");
    h.json(&["machine", "new", "a"]);
    h.write_faults(json!([
        {"verb": "machine fork", "times": 1, "action": "fail", "land": true, "message": "internal server error"},
        {"verb": "machine remove", "times": 1, "action": "fail", "exit_code": 0, "message": "the VM is busy"},
    ]));
    let r = h.run(&["machine", "fork", "a", "--name", "b", "--json"]);
    assert_eq!((r.code, r.out.as_str(), r.err.trim()), (1, "", "error: internal server error"));
    assert_eq!(h.status("b"), "running", "the fork was made before the failure");
    // Exit 0 with an error: nothing was removed.
    let r = h.run(&["machine", "remove", "b", "-y"]);
    assert_eq!((r.code, r.err.trim()), (0, "error: the VM is busy"));
    assert_eq!(h.status("b"), "running");
}

#[test]
fn fail_network_and_garbage() {
    let h = Home::new("fail");
    h.write_faults(json!([
        {"verb": "machine get", "times": 1, "action": "fail", "exit_code": 3, "message": "quota exceeded"},
        {"verb": "machine get", "times": 1, "action": "fail"},
        {"verb": "machine list", "times": 1, "action": "network"},
        {"verb": "machine list", "times": 1, "action": "garbage"},
        {"verb": "env list", "times": 1, "action": "garbage", "output": "<html>502</html>"}
    ]));
    let r = h.run(&["machine", "get", "x"]);
    assert_eq!((r.code, r.err.as_str()), (3, "error: quota exceeded\n"));
    let r = h.run(&["machine", "get", "x"]);
    assert_eq!((r.code, r.err.as_str()), (1, "error: internal\n"));
    let r = h.run(&["machine", "list", "--json"]);
    assert_eq!((r.code, r.err.as_str()), (1, "error: cannot connect to https://boxd.sh:9443: dns error: not found\n"));
    let r = h.run(&["machine", "list", "--json"]);
    assert_eq!(r.code, 0);
    assert!(serde_json::from_str::<serde_json::Value>(&r.out).is_err() && !r.out.is_empty(), "{}", r.out);
    assert_eq!(h.ok(&["env", "list", "--json"]).out, "<html>502</html>\n");
    assert_eq!(h.json(&["machine", "list"]), json!([]), "all rules spent");
}

#[test]
fn flood_prints_noise_until_its_bytes_are_out_on_the_stream_it_names() {
    let h = Home::new("flood");
    h.write_faults(json!([
        {"verb": "machine list", "times": 1, "action": "flood", "bytes": 300000},
        {"verb": "machine list", "times": 1, "action": "flood", "bytes": 70000, "stream": "stderr", "exit_code": 1},
        {"verb": "machine list", "times": 1, "action": "flood", "stream": "both"}
    ]));
    let r = h.run(&["machine", "list", "--json"]);
    assert_eq!((r.code, r.raw.len(), r.err.as_str()), (0, 300000, ""));
    assert!(r.out.starts_with("upstream connect error"), "{}", &r.out[..80]);
    let r = h.run(&["machine", "list", "--json"]);
    assert_eq!((r.code, r.raw.len(), r.err.len()), (1, 0, 70000));
    let r = h.run(&["machine", "list", "--json"]);
    assert_eq!(r.code, 1);
    assert!(r.err.contains("flood's stream is stdout or stderr, not 'both'"), "{}", r.err);
    assert_eq!(h.json(&["machine", "list"]), json!([]), "all rules spent");
}

#[test]
fn boot_timeout_appears_then_starts_then_runs() {
    let h = Home::new("boot");
    h.write_faults(json!([{"verb": "machine new", "times": 1, "action": "boot_timeout", "appear_after_ms": 600, "starting_ms": 800}]));
    let v = h.json(&["machine", "new", "slow"]);
    assert_shape(&v, &[("name", "string"), ("id", "string"), ("url", "string"), ("source", "string"), ("boot", "string")]);
    assert_eq!(v["boot"], "timeout");
    assert_eq!(h.fails(&["machine", "get", "slow"]), "error: VM 'slow' not found");
    wait_for("the machine to appear", 5, || h.run(&["machine", "get", "slow"]).code == 0);
    assert_eq!(h.status("slow"), "starting");
    assert_eq!(h.json(&["machine", "list"])[0]["status"], "starting");
    assert!(h.fails(&["machine", "exec", "slow", "--", "true"]).contains("starting"));
    wait_for("it to run", 5, || h.status("slow") == "running");
    assert_eq!(h.json(&["machine", "get", "slow"])["id"], v["id"]);
    h.ok(&["machine", "exec", "slow", "--", "true"]);
}

#[test]
fn lose_machine_kills_and_removes_it() {
    let h = Home::new("lose");
    h.ok(&["machine", "new", "doomed"]);
    h.ok(&["machine", "new", "other"]);
    let home = h.machine_home("doomed");
    let (pid, _) = start_counter(&h, "doomed");
    h.write_faults(json!([
        {"verb": "machine exec", "times": 1, "action": "lose_machine", "machine": "doomed"},
        {"verb": "machine list", "times": 1, "action": "lose_machine", "machine": "other"}
    ]));
    // The filter: an exec naming another machine does not match.
    h.ok(&["machine", "exec", "other", "--", "true"]);
    assert_eq!(h.fails(&["machine", "exec", "doomed", "--", "true"]), "error: VM 'doomed' not found");
    assert!(proc_state(pid).is_none());
    assert!(!home.exists());
    assert_eq!(h.json(&["machine", "list"]), json!([]), "list names no machine: its rule's victim goes");
}

#[test]
fn signed_out_and_delay() {
    let h = Home::new("signed-out");
    h.write_faults(json!([
        {"verb": "machine list", "times": 1, "action": "signed_out"},
        {"verb": "version", "times": 1, "action": "delay", "ms": 400}
    ]));
    assert_eq!(h.fails(&["machine", "list"]), "error: not logged in");
    assert_eq!(h.fails(&["machine", "list"]), "error: not logged in", "stays signed out");
    h.ok(&["auth", "login"]);
    h.ok(&["machine", "list"]);
    let t0 = Instant::now();
    assert_eq!(h.ok(&["version"]).out, "boxd 0.2.20-local\n");
    assert!(t0.elapsed() >= Duration::from_millis(400));
}

/// `delay` with `land`: the command acts at once and answers late, so its effect shows
/// while it still runs (a slow fork that holds its name from its start).
#[test]
fn a_delay_that_lands_acts_before_it_answers() {
    let h = Home::new("delay-land");
    h.write_faults(json!([{"verb": "machine new", "times": 1, "action": "delay", "ms": 1500, "land": true}]));
    let mut slow = h.cmd(&["machine", "new", "late", "--json"]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let t0 = Instant::now();
    while !h.json(&["machine", "list"]).to_string().contains("\"late\"") {
        assert!(t0.elapsed() < Duration::from_secs(10), "the machine never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(slow.try_wait().unwrap().is_none(), "listed while its create still runs");
    let out = slow.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["name"], "late");
    assert!(t0.elapsed() >= Duration::from_millis(1000));
}

#[test]
fn aliases_and_wildcards_match_canonical_verbs() {
    let h = Home::new("alias");
    h.ok(&["machine", "new", "a"]);
    h.write_faults(json!([{"verb": "machine remove", "times": 1, "action": "fail", "message": "internal"}]));
    assert_eq!(h.fails(&["destroy", "a", "-y"]), "error: internal", "matched via an alias");
    assert_eq!(h.status("a"), "running");
    h.write_faults(json!([{"verb": "*", "times": 1, "action": "fail", "message": "anything"}]));
    assert_eq!(h.fails(&["version"]), "error: anything");
    h.ok(&["version"]);
}

#[test]
fn env_var_rules_count_uses_in_state() {
    let h = Home::new("env-faults");
    let rules = json!([{"verb": "machine list", "times": 2, "action": "fail", "message": "flaky"}]).to_string();
    let run = || h.cmd(&["machine", "list"]).env("BOXD_LOCAL_FAULTS", &rules).output().unwrap();
    assert_eq!(run().status.code(), Some(1));
    assert_eq!(run().status.code(), Some(1));
    assert_eq!(run().status.code(), Some(0));
    // A broken rule is loud, not ignored.
    let bad = h.cmd(&["machine", "list"]).env("BOXD_LOCAL_FAULTS", r#"[{"verb":"x","action":"explode"}]"#).output().unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("bad fault rule"));
}
