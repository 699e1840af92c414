//! The guest: a real OpenCode server per work inside a boxd-local machine, the inbox,
//! boxd_submit and boxd_job, driven by the scripted model.

use serde_json::json;

use crate::common::*;

const W1: &str = r#"{"work":"w1"}"#;

fn submit(world: &World, prompt: &str) -> serde_json::Value {
    world.ok_call("boxd_submit", &json!({ "work": "w1", "prompt": prompt }).to_string())
}

#[test]
fn submit_runs_to_completion_and_a_second_prompt_queues_behind_the_first() {
    let world = World::new("guest-run");
    world.ok_call("boxd_ensure", W1);
    let v = submit(&world, "first task @@sleep:3000@@");
    assert_eq!(v["admitted"], true);
    assert_eq!(v["queued"], false);
    let v = submit(&world, "second task");
    assert_eq!(v["queued"], true, "a prompt that arrives while a run is busy waits: {v:#}");
    assert_eq!(v["pending"], 1);
    let busy = world.ok_call("boxd_job", W1);
    assert_eq!(busy["state"], "busy");
    let v = world.job_until_idle("w1");
    assert_eq!(v["state"], "idle", "{v:#}");
    // Both ran, in order: the newest text is the second prompt's reply.
    let v = if v["pending"] != 0 { world.job_until_idle("w1") } else { v };
    assert_eq!(v["outcome"], "completed");
    assert_eq!(v["lastText"], "MODEL_REPLY: second task");
    assert_eq!(v["pending"], 0);
    assert!(v["lastActivityAt"].as_str().is_some());
    let ledger: serde_json::Value = serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap()).unwrap();
    assert_eq!(ledger["prompts"].as_array().unwrap().len(), 2);
    assert!(ledger["prompts"][0]["sha256"].as_str().unwrap().len() == 64);
    assert!(!String::from_utf8_lossy(&std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap()).contains("first task"), "the ledger holds digests, not prompts");
}

#[test]
fn failed_auth_failed_and_aborted_runs_are_told_apart() {
    let world = World::new("guest-fail");
    world.ok_call("boxd_ensure", W1);
    submit(&world, "break @@fail:500@@");
    // A failed run is a fact about the run: the work is idle, and every call says so.
    for _ in 0..2 {
        let v = world.job_until_idle("w1");
        assert_eq!((v["state"].as_str(), v["outcome"].as_str()), (Some("idle"), Some("failed")), "{v:#}");
        assert_eq!(v["errorCode"], "GUEST_RUN_FAILED", "{v:#}");
        assert!(v["errorMessage"].as_str().is_some_and(|m| !m.is_empty()), "{v:#}");
        assert!(v.get("pending").is_some() && v.get("lastText").is_some(), "{v:#}");
    }
    submit(&world, "bad key @@fail:401@@");
    let v = world.job_until_idle("w1");
    assert_eq!((v["outcome"].as_str(), v["errorCode"].as_str()), (Some("failed"), Some("GUEST_AUTH_FAILED")), "{v:#}");
}

#[test]
fn a_killed_server_is_restarted_by_job() {
    let world = World::new("guest-restart");
    world.ok_call("boxd_ensure", W1);
    // Kill the work's OpenCode server inside the machine.
    let pid = on_guest(&world, SERVER).split_whitespace().next().unwrap().to_string();
    on_guest(&world, &format!("kill -9 {pid}"));
    let (_, v) = world.call("boxd_job", W1);
    assert_eq!(v["error"], "GUEST_SERVER_DOWN", "{v:#}");
    assert!(v["message"].as_str().unwrap().contains("restart"), "{v:#}");
    let v = world.ok_call("boxd_job", W1);
    assert_eq!(v["state"], "idle");
    submit(&world, "after restart");
    assert_eq!(world.job_until_idle("w1")["lastText"], "MODEL_REPLY: after restart");
}

#[test]
fn a_hibernated_machine_is_asleep_with_zero_execs() {
    let world = World::new("guest-asleep");
    world.ok_call("boxd_ensure", W1);
    assert!(world.laptop.boxd(&["machine", "hibernate", "oc-w1"]).status.success());
    world.forget_calls();
    let v = world.ok_call("boxd_job", W1);
    assert_eq!(v["state"], "asleep");
    assert_eq!(world.calls_starting(&["machine", "exec"]), 0);
    assert_eq!(world.laptop.boxd_calls().len(), 1, "one listing, nothing else");
}

#[test]
fn prompts_arrive_byte_for_byte_and_large_prompts_are_admitted() {
    let world = World::new("guest-bytes");
    world.ok_call("boxd_ensure", W1);
    let nasty = "it's \"quoted\" $(rm -rf /) `id` ; && || > /tmp/x \\ \n\ttabs and naïve ünïcödé 🚀 %s {} @@echo-bytes@@";
    submit(&world, nasty);
    let v = world.job_until_idle("w1");
    let expect = format!("ECHO_BYTES sha256={} bytes={}", sha256(nasty.as_bytes()), nasty.len());
    assert_eq!(v["lastText"], expect.as_str());
    let big = "x".repeat(1 << 20);
    let v = submit(&world, &big);
    assert_eq!(v["admitted"], true);
    world.job_until_idle("w1");
}

#[test]
fn files_go_in_with_their_names_and_bad_files_send_nothing() {
    let world = World::new("guest-files");
    world.ok_call("boxd_ensure", W1);
    let dir = world.laptop.project.join("data");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("my bookmarks ü.json"), b"{\"a\":1}").unwrap();
    let v = world.ok_call(
        "boxd_submit",
        &json!({ "work": "w1", "prompt": "read it", "files": [{ "from": "data/my bookmarks ü.json", "to": "in/my bookmarks ü.json" }] }).to_string(),
    );
    assert_eq!(v["files"][0]["sha256"], sha256(b"{\"a\":1}").as_str());
    let out = world.laptop.boxd(&["machine", "exec", "oc-w1", "--", "cat", "'work/w1/in/my bookmarks ü.json'"]);
    assert_eq!(out.stdout, b"{\"a\":1}");

    std::os::unix::fs::symlink("/etc/passwd", dir.join("link.json")).unwrap();
    std::fs::write(dir.join("big.bin"), vec![0u8; (8 << 20) + 1]).unwrap();
    world.forget_calls();
    for (from, to, code) in [
        ("data/link.json", "x.json", "PATH_REFUSED"),
        ("/etc/passwd", "x", "PATH_REFUSED"),
        ("../outside.txt", "x", "PATH_REFUSED"),
        ("data/big.bin", "big.bin", "FILE_TOO_LARGE"),
        ("data/my bookmarks ü.json", "../escape.json", "NAME_INVALID"),
        ("data/my bookmarks ü.json", "/abs.json", "NAME_INVALID"),
    ] {
        world.err_call("boxd_submit", &json!({ "work": "w1", "prompt": "p", "files": [{ "from": from, "to": to }] }).to_string(), code);
    }
    assert!(world.laptop.boxd_calls().is_empty(), "a refused file sends nothing: {:?}", world.laptop.boxd_calls());
}

pub fn sha256(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Run a shell line inside the work's machine (as a test's hand on the guest).
pub fn on_guest(world: &World, line: &str) -> String {
    let quoted = format!("'{}'", line.replace('\'', "'\\''"));
    let out = world.laptop.boxd(&["machine", "exec", "oc-w1", "--", "sh", "-c", &quoted]);
    assert!(out.status.success(), "{line}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const SERVER: &str = r#"python3 -c 'import json; s = json.load(open(".boxd-helper/works/w1/server.json")); print(s["pid"], s["port"])'"#;

#[test]
fn an_aborted_run_is_reported_as_aborted() {
    let world = World::new("guest-abort");
    world.ok_call("boxd_ensure", W1);
    submit(&world, "long one @@sleep:20000@@");
    assert_eq!(world.ok_call("boxd_job", W1)["state"], "busy");
    // Abort through the guest's own server API, as a user at the machine would.
    let line = on_guest(&world, SERVER);
    let port = line.split_whitespace().nth(1).unwrap().to_string();
    let session = on_guest(&world, "cat .boxd-helper/works/w1/session").trim().to_string();
    on_guest(&world, &format!("curl -sf -m 10 -u opencode:$(cat .boxd-helper/works/w1/password) -X POST http://127.0.0.1:{port}/session/{session}/abort"));
    let v = world.job_until_idle("w1");
    assert_eq!(v["outcome"], "aborted", "{v:#}");
}

#[test]
fn a_server_that_dies_mid_run_is_reported_once_as_run_interrupted() {
    let world = World::new("guest-interrupted");
    world.ok_call("boxd_ensure", W1);
    submit(&world, "long one @@sleep:20000@@");
    assert_eq!(world.ok_call("boxd_job", W1)["state"], "busy");
    let pid = on_guest(&world, SERVER).split_whitespace().next().unwrap().to_string();
    on_guest(&world, &format!("kill -9 {pid}"));
    let first = world.job_until_idle("w1");
    assert_eq!(first["error"], "RUN_INTERRUPTED", "{first:#}");
    assert!(first["next"].as_str().unwrap().contains("boxd_harvest"));
    let v = world.ok_call("boxd_job", W1);
    assert_eq!((v["state"].as_str(), v["outcome"].as_str()), (Some("idle"), Some("aborted")), "reported once, then aborted: {v:#}");
}

/// The helper's own suite (tests/guest, Python unittest against a real opencode serve),
/// run here so the one test command covers it.
#[test]
fn the_guest_helpers_own_tests_pass() {
    let out = std::process::Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "tests/guest"])
        .current_dir(repo())
        .env("PATH", format!("{}:{}", opencode_bin().parent().unwrap().display(), std::env::var("PATH").unwrap_or_default()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("\nOK"), "{err}");
}

/// A headless guest has nobody to approve a permission ask: the agent reading a file outside
/// its work tree would wait for ever, holding the work busy (no harvest, no drop). The guest
/// declines it, the run finishes, and boxd_job says what was declined and harvest works.
#[test]
fn an_ask_nobody_on_the_guest_can_answer_is_declined_and_the_work_comes_home() {
    let world = World::new("guest-ask");
    world.ok_call("boxd_ensure", W1);
    let read = json!({ "filePath": "/etc/hostname" });
    submit(&world, &format!("look @@tool:read:{read}@@"));
    let v = world.job_until_idle("w1");
    assert_eq!((v["state"].as_str(), v["outcome"].as_str()), (Some("idle"), Some("completed")), "{v:#}");
    assert_eq!(v["declined"], json!([{ "permission": "external_directory", "patterns": ["/etc/*"] }]), "{v:#}");
    let h = world.ok_call("boxd_harvest", W1);
    assert_eq!(h["proven"], true, "{h:#}");
}

/// A submit whose answer was lost (the host killed right after the exec) and then sent
/// again: with a file of another size it is a new prompt, admitted with the new bytes;
/// with the same text and files it is the lost one's retry, which the guest answers as a
/// duplicate: no file is claimed placed or recorded in files_in again.
#[test]
fn a_resubmit_with_other_files_is_a_new_prompt_and_a_duplicate_places_no_file() {
    let world = World::new("guest-resubmit");
    world.ok_call("boxd_ensure", W1);
    let file = world.laptop.project.join("a.txt");
    let args = |prompt: &str| json!({ "work": "w1", "prompt": prompt, "files": [{ "from": "a.txt", "to": "in/a.txt" }] }).to_string();
    let record = || -> serde_json::Value { serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap()).unwrap() };
    let on_guest = || String::from_utf8_lossy(&world.on_machine("oc-w1", "cat work/w1/in/a.txt").stdout).into_owned();

    std::fs::write(&file, "one").unwrap();
    assert!(world.killed_at("after-spawn:2", "boxd_submit", &args("first")), "the host was killed after the submit's exec");
    let lost = record()["prompts"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(on_guest(), "one", "the lost submit landed");
    std::fs::write(&file, "one, edited").unwrap();
    let v = world.ok_call("boxd_submit", &args("first"));
    assert_ne!(v["promptId"], lost.as_str(), "{v:#}");
    assert_eq!((v["duplicate"].as_bool(), v["files"][0]["size"].as_u64()), (Some(false), Some(11)), "{v:#}");
    assert_eq!(on_guest(), "one, edited", "the new file was placed");

    // Lost again, then sent again unchanged: the guest has it, and says so.
    std::fs::write(&file, "two").unwrap();
    assert!(world.killed_at("after-spawn:2", "boxd_submit", &args("second")));
    let before = record()["filesIn"].as_array().map_or(0, |f| f.len());
    let v = world.ok_call("boxd_submit", &args("second"));
    assert_eq!((v["duplicate"].as_bool(), v["files"].as_array().map(|f| f.len())), (Some(true), Some(0)), "{v:#}");
    assert_eq!(record()["filesIn"].as_array().map_or(0, |f| f.len()), before, "a duplicate records no file");
    assert_eq!(on_guest(), "two");
}

/// The guest helper's own state of work `w1` (state.json).
fn guest_state(world: &World) -> serde_json::Value {
    let out = world.on_machine("oc-w1", "cat .boxd-helper/works/w1/state.json");
    serde_json::from_slice(&out.stdout).unwrap_or(json!({}))
}

/// F1: a submit whose client gave up (a timeout, a cancel) runs on to its end and admits
/// its prompt; the client's retry of the same words comes while that prompt still runs. It
/// is the first's duplicate: answered with the first id, no second prompt recorded, the
/// text run once. Once that run has ended, the same words sent again (a deliberate
/// "continue") are a prompt of their own and run. Before, the retry got a new id and the
/// guest ran the text twice.
#[test]
fn a_retry_while_the_first_runs_is_its_duplicate_and_a_repeat_after_it_runs_again() {
    let world = World::new("guest-retry-running");
    world.ok_call("boxd_ensure", W1);
    std::fs::write(world.laptop.project.join("a.txt"), "one").unwrap();
    let args = json!({ "work": "w1", "prompt": "slow words @@sleep:6000@@", "files": [{ "from": "a.txt", "to": "a.txt" }] }).to_string();
    let first = world.ok_call("boxd_submit", &args);
    let retry = world.ok_call("boxd_submit", &args);
    assert_eq!((retry["promptId"].clone(), retry["duplicate"].as_bool(), retry["files"].clone()), (first["promptId"].clone(), Some(true), json!([])), "{retry:#}");
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap()).unwrap();
    assert_eq!(record["prompts"].as_array().map(Vec::len), Some(1), "{record:#}");
    assert_eq!(record["filesIn"].as_array().map(Vec::len), Some(1), "{record:#}");
    let v = world.job_until_idle("w1");
    assert_eq!(v["outcome"], "completed", "{v:#}");
    assert_eq!(guest_state(&world)["runs"], 1, "the text ran once");

    let again = world.ok_call("boxd_submit", &args);
    assert_ne!(again["promptId"], first["promptId"], "{again:#}");
    assert_eq!(again["duplicate"], false, "{again:#}");
    world.job_until_idle("w1");
    assert_eq!(guest_state(&world)["runs"], 2, "a repeat after the run ended runs");
    assert!(world.ok_call("boxd_harvest", W1)["proven"] == true);
}
