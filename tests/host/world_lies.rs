//! When boxd or a guest says something untrue: each case acted out by the real boxd-local
//! (its fault rules) or a real guest changed from inside, against the real host. What the
//! user made stays, what is not ours is never touched, and no answer takes a failure for
//! done. The component's unit tests cover the same rules with doubles; these prove them
//! through the binaries.

use serde_json::{json, Value};

use crate::common::*;

const W1: &str = r#"{"work":"w1"}"#;

fn machine_get(world: &World, name: &str) -> Value {
    stdout_json(&world.laptop.boxd(&["machine", "get", name, "--json"]))
}

/// A world whose work w1 ran one prompt, not harvested yet.
fn ran_a_prompt(name: &str) -> World {
    let world = World::new(name);
    world.ok_call("boxd_ensure", W1);
    world.ok_call("boxd_submit", r#"{"work":"w1","prompt":"say hello"}"#);
    world.job_until_idle("w1");
    world
}

fn record(world: &World, work: &str) -> Value {
    serde_json::from_slice(&std::fs::read(world.laptop.ledger.join(format!("works/{work}/work.json"))).unwrap()).unwrap()
}

/// Every boxd-local call since the log was last forgotten, as "noun verb".
fn verbs(world: &World) -> Vec<String> {
    world.laptop.boxd_calls().iter().map(|c| c.iter().take(2).cloned().collect::<Vec<_>>().join(" ")).collect()
}

/// Someone else's oc-w1 (id `theirs`, their `theirs.txt` in it) after our create was
/// refused: ensure refuses it, drop drops nothing, and nothing was removed or prepared.
///
/// The work's record stays open with no machine of its own while theirs runs under its
/// name: status shows it not ours (nothing of it bills), the caps do not count their
/// machine as this ledger's, and a drop closes the record, sending boxd nothing for it.
fn left_alone(world: &World, theirs: &Value) {
    world.err_call("boxd_ensure", W1, "NOT_OURS");
    let status = world.ok_call("boxd_status", "{}");
    let row = status["works"].as_array().unwrap().iter().find(|w| w["work"] == "w1").unwrap().clone();
    assert_eq!(row["state"], "notOurs", "{status:#}");
    assert_eq!(row["spend"]["burnPerHour"], 0.0, "{row:#}");
    assert_eq!(status["spend"]["burnPerHour"], 0.0, "their machine is not this ledger's burn: {status:#}");
    // Their machine takes no slot of this ledger's: with room for one, w2 is made.
    let (code, v) = world.call_with(&["--options", r#"{"maxRunningPerLedger":1}"#], "boxd_ensure", r#"{"work":"w2"}"#);
    assert_eq!(code, 0, "{v:#}");
    let dropped = world.ok_call("boxd_drop", W1);
    assert_eq!((&dropped["dropped"], &dropped["nameTakenBy"]), (&json!(true), theirs), "{dropped:#}");
    assert!(dropped["next"].as_str().unwrap().contains("no machine of its own"), "{dropped:#}");
    assert_eq!(record(world, "w1")["state"], "closed");
    assert_eq!(world.calls_starting(&["machine", "remove"]), 0);
    assert_eq!(world.calls_starting(&["machine", "exec", "oc-w1"]), 1, "only their own echo: nothing was prepared on their machine");
    assert_eq!(&machine_get(world, "oc-w1")["id"], theirs, "their machine still runs");
    assert_eq!(String::from_utf8_lossy(&world.on_machine("oc-w1", "cat theirs.txt").stdout), "mine\n");
}

#[test]
fn a_status_word_boxd_does_not_know_is_boxd_failed_and_changes_nothing() {
    let world = World::new("lies-status");
    world.ok_call("boxd_ensure", W1);
    world.ok_call("boxd_harvest", W1); // proven: drop and image get as far as their state read
    let state_before = record(&world, "w1")["state"].clone();
    // boxd answers as usual, except that the machine's status is a word from a later boxd.
    let mut got = machine_get(&world, "oc-w1");
    got["status"] = json!("relocating");
    let mut listed = stdout_json(&world.laptop.boxd(&["machine", "list", "--json"]));
    for m in listed.as_array_mut().unwrap() {
        m["status"] = json!("relocating");
    }
    world.faults(
        &json!([
            { "verb": "machine get", "action": "garbage", "output": got.to_string() },
            { "verb": "machine list", "action": "garbage", "output": listed.to_string() },
        ])
        .to_string(),
    );
    world.forget_calls();
    let submit = r#"{"work":"w1","prompt":"hello"}"#;
    for (tool, args) in [("boxd_resume", W1), ("boxd_sleep", W1), ("boxd_drop", W1), ("boxd_ensure", W1), ("boxd_submit", submit)] {
        let v = world.err_call(tool, args, "BOXD_FAILED");
        assert!(v["message"].as_str().unwrap().contains("relocating"), "{tool}: {v:#}");
    }
    let status = world.ok_call("boxd_status", "{}");
    let row = status["works"].as_array().unwrap().iter().find(|w| w["work"] == "w1").unwrap().clone();
    assert_eq!(row["state"], "unknown", "{row:#}");
    // Only reads reached boxd: nothing rebuilt, hibernated, removed or created on a guess.
    let changes: Vec<String> = verbs(&world).into_iter().filter(|v| !["machine get", "machine list", "snapshots list"].contains(&v.as_str())).collect();
    assert!(changes.is_empty(), "boxd calls that change something: {changes:?}");
    assert_eq!(record(&world, "w1")["state"], state_before);
    world.faults("[]");
    assert_eq!(machine_get(&world, "oc-w1")["status"], "running", "the machine is untouched");
    assert_eq!(world.ok_call("boxd_job", W1)["state"], "idle");
}

#[test]
fn a_not_found_the_listing_contradicts_never_closes_a_live_work() {
    let world = World::new("lies-notfound");
    world.ok_call("boxd_ensure", W1);
    world.ok_call("boxd_harvest", W1);
    // A proxy's 404 on the one machine, while boxd's listing still shows it.
    world.faults(r#"[{"verb":"machine get","times":1,"action":"fail","message":"VM 'oc-w1' not found"}]"#);
    world.err_call("boxd_drop", W1, "BOXD_FAILED");
    assert_eq!(machine_get(&world, "oc-w1")["status"], "running");
    assert_ne!(record(&world, "w1")["state"], "closed", "the work is still open");
    assert_eq!(world.calls_starting(&["machine", "remove"]), 0);
    // Asked again with boxd answering truly, the drop does its work.
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], true);
    assert!(!world.laptop.boxd(&["machine", "get", "oc-w1", "--json"]).status.success(), "removed now");
}

#[test]
fn a_remove_that_exits_0_but_says_it_failed_is_not_taken_for_done() {
    let world = World::new("lies-remove");
    world.ok_call("boxd_ensure", W1);
    world.ok_call("boxd_harvest", W1);
    world.faults(r#"[{"verb":"machine remove","times":1,"action":"fail","exit_code":0,"message":"internal: the VM is busy"}]"#);
    let v = world.err_call("boxd_drop", W1, "BOXD_FAILED");
    assert!(v["message"].as_str().unwrap().contains("the VM is busy"), "the CLI's own words: {v:#}");
    assert_eq!(machine_get(&world, "oc-w1")["status"], "running");
    assert_ne!(record(&world, "w1")["state"], "closed", "a work whose machine still runs stays open");
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], true);
}

/// A CLI that exits 0 with a JSON error as its answer did not do what was asked: drop
/// and sleep answer BOXD_FAILED in boxd's words, the machine runs on, and the ledger does
/// not say otherwise (before: dropped:true with the machine billing and no record, or
/// asleep with its run interval closed).
#[test]
fn an_answer_that_exits_0_with_a_json_error_is_not_taken_for_done() {
    let world = World::new("lies-json-error");
    world.ok_call("boxd_ensure", W1);
    world.ok_call("boxd_harvest", W1);
    // The sleep first: a drop that failed leaves its mark, under which sleep is refused.
    for (tool, verb) in [("boxd_sleep", "machine hibernate"), ("boxd_drop", "machine remove")] {
        let fault = json!([{ "verb": verb, "times": 1, "action": "garbage", "output": r#"{"error":"internal: machine is busy"}"# }]);
        world.faults(&fault.to_string());
        let v = world.err_call(tool, W1, "BOXD_FAILED");
        assert!(v["message"].as_str().unwrap().contains("machine is busy"), "{tool}: the CLI's own words: {v:#}");
        assert_eq!(machine_get(&world, "oc-w1")["status"], "running", "{tool}");
        let w = record(&world, "w1");
        assert_ne!(w["state"], "closed", "{tool}: {w:#}");
        assert!(w["runs"].as_array().unwrap().last().unwrap()["toMs"].is_null(), "{tool}: the run goes on: {w:#}");
    }
    world.faults("[]");
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], true);
}

/// One `machine get` that answers another id under the work's name (a fault, a confused
/// CLI) never closes a work whose machine is ours and running: the drop records the id and
/// refuses, touching nothing; the next look that finds our id clears the mark, and status
/// counts the machine as running again.
#[test]
fn one_wrong_id_never_closes_a_work_whose_machine_still_runs() {
    let world = World::new("lies-one-wrong-id");
    world.ok_call("boxd_ensure", W1);
    world.ok_call("boxd_harvest", W1);
    let ours = machine_get(&world, "oc-w1");
    let lie = json!({ "name": "oc-w1", "id": "vm_0000000000000bad", "status": "running", "sharing": "private", "isolated": "no" });
    world.faults(&json!([{ "verb": "machine get", "times": 1, "action": "garbage", "output": lie.to_string() }]).to_string());
    let v = world.err_call("boxd_drop", W1, "NOT_OURS");
    assert!(v["next"].as_str().unwrap().contains("boxd_drop for work 'w1'"), "{v:#}");
    assert_eq!(machine_get(&world, "oc-w1")["id"], ours["id"], "our machine is still there");
    assert_eq!(machine_get(&world, "oc-w1")["status"], "running");
    let w = record(&world, "w1");
    assert_eq!((w["state"].as_str(), w["nameTakenBy"].as_str()), (Some("open"), Some("vm_0000000000000bad")), "{w:#}");
    world.faults("[]");
    world.ok_call("boxd_job", W1);
    let w = record(&world, "w1");
    assert!(w["nameTakenBy"].is_null() && w["runs"].as_array().unwrap().last().unwrap()["toMs"].is_null(), "{w:#}");
    let status = world.ok_call("boxd_status", "{}");
    assert_eq!(status["works"][0]["state"], "running", "{status:#}");
}

#[test]
fn a_fork_boxd_made_before_failing_stays_ours_and_the_next_fork_call_adopts_it() {
    let world = World::new("lies-fork");
    world.ok_call("boxd_ensure", W1);
    world.ok_call("boxd_harvest", W1);
    world.faults(r#"[{"verb":"machine fork","times":1,"action":"fail","land":true,"message":"internal server error"}]"#);
    let (code, v) = world.call("boxd_fork", r#"{"work":"w1","forks":["w2"]}"#);
    assert_eq!(code, 1, "{v:#}");
    let made = machine_get(&world, "oc-w2");
    assert!(made["id"].as_str().is_some_and(|id| !id.is_empty()), "boxd made the fork before failing: {made:#}");
    assert_ne!(record(&world, "w2")["state"], "queued", "a fork that may exist is not put back in the queue");
    // The next boxd_fork finds it and takes it as ours: not NOT_OURS, not a second machine.
    let again = world.ok_call("boxd_fork", r#"{"work":"w1"}"#);
    let w2 = again["forks"].as_array().unwrap().iter().find(|f| f["work"] == "w2").cloned().unwrap_or_default();
    assert_eq!(w2["state"], "running", "{again:#}");
    assert_eq!(record(&world, "w2")["machineId"], made["id"], "the ledger records the machine boxd made");
    assert_eq!(world.calls_starting(&["machine", "fork"]), 1, "one fork, never two");
    // Its copied tree is unaccounted until it is harvested: drop asks for that first.
    world.err_call("boxd_drop", r#"{"work":"w2"}"#, "NOT_PROVEN");
}

#[test]
fn a_create_refused_outright_never_adopts_a_machine_someone_else_makes_under_the_name() {
    let world = World::new("lies-refused");
    world.faults(r#"[{"verb":"machine new","times":1,"action":"fail","message":"quota exceeded"}]"#);
    let (code, v) = world.call("boxd_ensure", W1);
    assert_eq!(code, 1, "{v:#}");
    // Someone else makes a machine of that name, with their own files in it.
    assert!(world.laptop.boxd(&["machine", "new", "oc-w1", "--json"]).status.success());
    let theirs = machine_get(&world, "oc-w1")["id"].clone();
    assert!(world.on_machine("oc-w1", "echo mine > theirs.txt").status.success());
    left_alone(&world, &theirs);
}

/// A create whose answer was lost to the network (it made nothing) leaves the work
/// creating; a machine someone else then makes under the name by hand (not from the golden
/// snapshot, their own idle bound) is refused, never adopted, prepared or dropped.
#[test]
fn an_uncertain_create_never_adopts_a_machine_someone_else_makes_under_the_name() {
    let world = World::new("lies-uncertain");
    world.faults(r#"[{"verb":"machine new","times":1,"action":"network"}]"#);
    let (code, v) = world.call("boxd_ensure", W1);
    assert_eq!(code, 1, "{v:#}");
    assert_eq!(record(&world, "w1")["state"], "creating", "uncertain: it may have landed");
    assert!(world.laptop.boxd(&["machine", "new", "oc-w1", "--json"]).status.success());
    let theirs = machine_get(&world, "oc-w1")["id"].clone();
    assert!(world.on_machine("oc-w1", "echo mine > theirs.txt").status.success());
    world.err_call("boxd_ensure", W1, "NOT_OURS");
    assert_eq!(record(&world, "w1")["state"], "open", "the intent is withdrawn: {:#}", record(&world, "w1"));
    left_alone(&world, &theirs);
}

/// boxd answers a create with an empty id: nothing is recorded as the id (every later
/// check of our own machine would then call it another's), the work stays creating, and
/// the next ensure adopts the machine by the id boxd gives for it.
#[test]
fn a_create_that_answers_an_empty_id_is_adopted_by_the_id_boxd_gives_later() {
    let world = World::new("lies-empty-id");
    world.faults(r#"[{"verb":"machine new","times":1,"action":"garbage","output":"{\"name\":\"oc-w1\",\"id\":\"\",\"boot\":\"0.1s\"}"}]"#);
    world.err_call("boxd_ensure", W1, "CREATE_UNCERTAIN");
    assert_eq!(record(&world, "w1")["state"], "creating");
    assert!(record(&world, "w1").get("machineId").is_none_or(Value::is_null), "{:#}", record(&world, "w1"));
    // The create that landed.
    assert!(world.laptop.boxd(&["machine", "new", "oc-w1", "--from-snapshot", "opencode-golden", "--auto-hibernate-timeout", "1800", "--json"]).status.success());
    assert_eq!(world.ok_call("boxd_ensure", W1)["adopted"], true);
    assert_eq!(record(&world, "w1")["machineId"], machine_get(&world, "oc-w1")["id"]);
    assert_eq!(world.ok_call("boxd_job", W1)["state"], "idle", "our own machine is ours to every tool");
}

/// A create answered with an id and a boot that timed out leaves the work creating with
/// that id. When that machine never comes up and the name is someone else's since, the
/// ensure refuses it (NOT_OURS, whose next step is a drop) and the drop closes the record,
/// sending boxd nothing for their machine: the two no longer send the user to each other.
/// One whose machine is simply gone closes too, with no machine made just to be dropped.
#[test]
fn a_create_whose_boot_timed_out_closes_once_its_machine_is_gone_or_its_name_taken() {
    let world = World::new("lies-boot-timeout");
    let answer = |w: &str| format!(r#"[{{"verb":"machine new","times":1,"action":"garbage","output":"{{\"name\":\"oc-{w}\",\"id\":\"vm_{w}_never\",\"boot\":\"timeout\"}}"}}]"#);
    world.faults(&answer("w1"));
    world.err_call("boxd_ensure", W1, "CREATE_UNCERTAIN");
    let r = record(&world, "w1");
    assert_eq!((r["state"].as_str(), r["machineId"].as_str()), (Some("creating"), Some("vm_w1_never")), "{r:#}");
    assert!(world.laptop.boxd(&["machine", "new", "oc-w1", "--json"]).status.success());
    let theirs = machine_get(&world, "oc-w1")["id"].clone();
    let v = world.err_call("boxd_ensure", W1, "NOT_OURS");
    assert!(v["next"].as_str().unwrap().contains("boxd_drop"), "{v:#}");
    let dropped = world.ok_call("boxd_drop", W1);
    assert_eq!((&dropped["dropped"], &dropped["nameTakenBy"]), (&json!(true), &theirs), "{dropped:#}");
    assert_eq!(record(&world, "w1")["state"], "closed");
    assert_eq!(world.calls_starting(&["machine", "remove"]), 0);
    assert_eq!(machine_get(&world, "oc-w1")["id"], theirs, "their machine still runs");

    world.faults(&answer("w2"));
    world.err_call("boxd_ensure", r#"{"work":"w2"}"#, "CREATE_UNCERTAIN");
    let made = world.calls_starting(&["machine", "new"]);
    let dropped = world.ok_call("boxd_drop", r#"{"work":"w2"}"#);
    assert_eq!(dropped["dropped"], true, "{dropped:#}");
    assert_eq!(record(&world, "w2")["state"], "closed");
    assert_eq!(world.calls_starting(&["machine", "new"]), made, "no machine made just to be dropped");
}

/// A proxy's 404 on the machine, and a listing whose rows have no `name`: the listing
/// cannot confirm the machine is gone, so the drop closes nothing.
#[test]
fn a_listing_without_names_never_confirms_a_machine_gone() {
    let world = World::new("lies-nameless");
    world.ok_call("boxd_ensure", W1);
    world.ok_call("boxd_harvest", W1);
    world.faults(
        r#"[{"verb":"machine get","times":1,"action":"fail","message":"VM 'oc-w1' not found"},
            {"verb":"machine list","times":1,"action":"garbage","output":"[{\"vm\":\"oc-w1\",\"status\":\"running\"}]"}]"#,
    );
    world.err_call("boxd_drop", W1, "BOXD_FAILED");
    assert_ne!(record(&world, "w1")["state"], "closed", "the work is still open");
    assert_eq!(machine_get(&world, "oc-w1")["status"], "running");
    assert_eq!(world.calls_starting(&["machine", "remove"]), 0);
}

/// A proxy's 404 on the machine during a resume, while the listing shows it: nothing is
/// rebuilt, and no prompt is called lost while the machine that ran it still runs.
#[test]
fn a_resume_whose_not_found_the_listing_contradicts_rebuilds_nothing_and_loses_no_prompt() {
    let world = ran_a_prompt("lies-resume-404");
    world.faults(r#"[{"verb":"machine get","times":1,"action":"fail","message":"VM 'oc-w1' not found"}]"#);
    let made = world.calls_starting(&["machine", "new"]);
    let v = world.err_call("boxd_resume", W1, "BOXD_FAILED");
    assert!(v["message"].as_str().unwrap().contains("list shows it"), "{v:#}");
    assert_eq!(world.calls_starting(&["machine", "new"]), made, "nothing rebuilt");
    let r = record(&world, "w1");
    assert_eq!(r["state"], "open", "{r:#}");
    assert_eq!(r["prompts"].as_array().map(Vec::len), Some(1), "{r:#}");
    assert!(r.get("unrecovered").is_none_or(|u| u.as_array().is_some_and(Vec::is_empty)), "{r:#}");
    assert_eq!(world.ok_call("boxd_resume", W1)["action"], "already running", "asked again, boxd answers truly");
}

/// Someone else makes a machine under the work's name between the ensure's look and its
/// create (no create of this ledger was under way; theirs is not made from the golden
/// image): boxd refuses the create, and neither that ensure nor the next adopts, prepares
/// or removes their machine.
#[test]
fn a_name_taken_just_before_the_first_create_is_never_adopted() {
    let world = World::new("lies-taken");
    world.faults(r#"[{"verb":"snapshots list","times":1,"action":"delay","ms":3000}]"#);
    let (code, v) = std::thread::scope(|s| {
        let ensure = s.spawn(|| world.call("boxd_ensure", W1));
        until_running(&["snapshots", "list"]);
        assert!(world.laptop.boxd(&["machine", "new", "oc-w1", "--json"]).status.success());
        assert!(world.on_machine("oc-w1", "echo mine > theirs.txt").status.success());
        ensure.join().unwrap()
    });
    assert_eq!((code, v["error"].as_str()), (1, Some("NOT_OURS")), "{v:#}");
    assert!(v["next"].as_str().unwrap().contains("Leave oc-w1 alone"), "{v:#}");
    let theirs = machine_get(&world, "oc-w1")["id"].clone();
    left_alone(&world, &theirs);
}

/// The parent's name is taken over while boxd_fork readies its first fork (the parent
/// removed and someone else's machine made under its name): the second fork is not made
/// from their machine. It stays queued, and the answer says why.
#[test]
fn a_parent_replaced_between_two_forks_is_not_forked_again() {
    let world = World::new("lies-fork-parent");
    world.ok_call("boxd_ensure", W1);
    world.ok_call("boxd_harvest", W1);
    world.faults(r#"[{"verb":"machine exec","machine":"oc-f1","times":1,"action":"delay","ms":4000}]"#);
    let (code, v) = std::thread::scope(|s| {
        let fork = s.spawn(|| world.call("boxd_fork", r#"{"work":"w1","forks":["f1","f2"]}"#));
        until_running(&["machine", "exec", "oc-f1"]);
        assert!(world.laptop.boxd(&["machine", "remove", "oc-w1", "-y"]).status.success());
        assert!(world.laptop.boxd(&["machine", "new", "oc-w1", "--json"]).status.success());
        assert!(world.on_machine("oc-w1", "echo mine > theirs.txt").status.success());
        fork.join().unwrap()
    });
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["waiting"]["error"], "NOT_OURS", "{v:#}");
    // One next step that leads somewhere: the parent's own machine is gone, so drop it and
    // the fork that can no longer be made from it (not "start again" and "fork again").
    let next = v["next"].as_str().unwrap();
    assert!(next.contains("call boxd_drop for work 'w1'") && next.contains("(f2) can no longer be made") && !next.contains("boxd_fork"), "{v:#}");
    let state = |id: &str| v["forks"].as_array().unwrap().iter().find(|f| f["work"] == id).map(|f| f["state"].clone()).unwrap_or_default();
    assert_eq!((state("f1"), state("f2")), (json!("running"), json!("queued")), "{v:#}");
    assert_eq!(world.calls_starting(&["machine", "fork"]), 1, "one fork, made from our parent");
    assert!(!world.laptop.boxd(&["machine", "get", "oc-f2", "--json"]).status.success(), "no fork of their machine");
}

/// The guest of w2 exports w1's session (with a message added), as a tampered guest could:
/// a `python3` first on the guest's PATH that rewrites the helper's export of w2.
#[test]
fn a_guest_that_exports_another_works_session_is_refused_and_that_work_is_untouched() {
    let world = World::new("lies-session");
    world.ok_call("boxd_ensure", W1);
    world.ok_call("boxd_submit", r#"{"work":"w1","prompt":"hello from w1"}"#);
    assert_eq!(world.job_until_idle("w1")["outcome"], "completed");
    let sid1 = world.ok_call("boxd_harvest", W1)["sessions"][0]["id"].as_str().unwrap().to_string();
    let w1_before = crate::harvest::laptop_export(&world, &sid1);
    world.ok_call("boxd_ensure", r#"{"work":"w2"}"#);
    world.ok_call("boxd_submit", r#"{"work":"w2","prompt":"w2 says hi"}"#);
    assert_eq!(world.job_until_idle("w2")["outcome"], "completed");

    let lie = r#"import copy, json, os, sys
real = json.loads(sys.stdin.read())
s = json.load(open(os.path.expanduser("~/w1-session.json")))
m = copy.deepcopy(s["messages"][-1])
m["info"]["id"] = "msg_23146cc7a001zzzzzzzzzzzzzz"
m["info"]["time"]["created"] += 100000
for i, p in enumerate(m["parts"]):
    p["id"] = "prt_23146cd25001zzzzzzzzzzzz%02d" % i; p["messageID"] = m["info"]["id"]
    if "text" in p: p["text"] = "INJECTED BY GUEST w2"
s["messages"].append(m)
real["sessions"] = [s]
sys.stdout.write(json.dumps(real) + "\n")
"#;
    let shim = r#"#!/bin/sh
d=$(dirname "$0")
real=$(PATH=$(echo "$PATH" | tr : "\n" | grep -vx "$d" | paste -sd:) command -v python3)
case " $* " in *" export --work w2 "*) "$real" "$@" | "$real" "$d/lie.py"; exit 0;; esac
exec "$real" "$@"
"#;
    let put = |path: &str, bytes: &[u8]| {
        let mut child = std::process::Command::new(boxd_local())
            .args(["machine", "exec", "oc-w2", "--", "sh", "-c", &format!("'mkdir -p .local/bin && cat > {path} && chmod +x {path}'")])
            .env("BOXD_LOCAL_HOME", &world.laptop.boxd_home)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), bytes).unwrap();
        assert!(child.wait().unwrap().success(), "wrote {path} on the guest");
    };
    put("w1-session.json", &serde_json::to_vec(&w1_before).unwrap());
    put(".local/bin/lie.py", lie.as_bytes());
    put(".local/bin/python3", shim.as_bytes());

    let v = world.err_call("boxd_harvest", r#"{"work":"w2"}"#, "EXPORT_INVALID");
    let message = v["message"].as_str().unwrap();
    assert!(message.contains(&sid1) && message.contains("'w1'"), "{v:#}");
    assert_eq!(crate::harvest::laptop_export(&world, &sid1), w1_before, "w1's transcript on the laptop is unchanged");
    assert!(!serde_json::to_string(&record(&world, "w2")).unwrap().contains(&sid1), "w2 is not proven by w1's session");
    world.err_call("boxd_drop", r#"{"work":"w2"}"#, "NOT_PROVEN");
    assert_eq!(machine_get(&world, "oc-w2")["status"], "running", "w2's own session is still only on its machine");
}

/// Make the helper's `export --work WORK` on `machine` answer what `lie` makes of it (a
/// Python filter: the real answer on stdin, the lie on stdout), as the agent in the machine
/// could: a `python3` first on the guest's PATH. `None` takes the lie away.
pub(crate) fn export_lie(world: &World, machine: &str, work: &str, lie: Option<&str>) {
    let Some(lie) = lie else {
        assert!(world.on_machine(machine, "rm -f .local/bin/python3").status.success());
        return;
    };
    let shim = format!(
        r#"#!/bin/sh
d=$(dirname "$0")
real=$(PATH=$(echo "$PATH" | tr : "\n" | grep -vx "$d" | paste -sd:) command -v python3)
case " $* " in *" export --work {work} "*) "$real" "$@" | "$real" "$d/lie.py"; exit 0;; esac
exec "$real" "$@"
"#
    );
    for (path, bytes) in [(".local/bin/lie.py", lie.as_bytes()), (".local/bin/python3", shim.as_bytes())] {
        let mut child = std::process::Command::new(boxd_local())
            .args(["machine", "exec", machine, "--", "sh", "-c", &format!("'mkdir -p .local/bin && cat > {path} && chmod +x {path}'")])
            .env("BOXD_LOCAL_HOME", &world.laptop.boxd_home)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), bytes).unwrap();
        assert!(child.wait().unwrap().success(), "wrote {path} on {machine}");
    }
}

/// The start of every export lie: the real answer in `real`, its root session `root`.
pub(crate) const LIE_HEAD: &str = "import json, sys\nreal = json.loads(sys.stdin.read())\nroot = real[\"sessions\"][0]\n";
pub(crate) const LIE_TAIL: &str = "sys.stdout.write(json.dumps(real) + \"\\n\")\n";

/// A session of the user's own on the laptop, in another folder: no work's.
pub(crate) fn users_own_session(world: &World) -> (String, std::path::PathBuf) {
    let (sid, mid) = ("ses_2320ffffffffUSERSOWNSESSN", "msg_2320ffffffffUSERSOWNMSG01");
    let session = json!({
        "info": { "id": sid, "slug": "users-own", "projectID": "x", "directory": "/x", "title": "my own", "version": "1.18.33", "time": { "created": 1, "updated": 1 } },
        "messages": [{ "info": { "id": mid, "sessionID": sid, "role": "user", "time": { "created": 1 }, "agent": "build", "model": { "providerID": "scripted", "modelID": "scripted-model" } },
            "parts": [{ "id": "prt_2320ffffffffUSERSOWNPRT01", "sessionID": sid, "messageID": mid, "type": "text", "text": "MY OWN LAPTOP CONVERSATION" }] }],
    });
    let other = world.laptop.scratch.path("otherproj");
    let file = world.laptop.scratch.0.join("users-own.json");
    std::fs::write(&file, session.to_string()).unwrap();
    let out = std::process::Command::new(opencode_bin()).arg("import").arg(&file).current_dir(&other).envs(world.laptop_env()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (sid.to_string(), other)
}

/// The laptop's copy of a session read from `dir`, or None when it holds none.
pub(crate) fn laptop_copy(world: &World, dir: &std::path::Path, id: &str) -> Option<Value> {
    let path = world.laptop.scratch.0.join(format!("copy-{id}.json"));
    let out = std::process::Command::new(opencode_bin()).args(["export", id]).current_dir(dir).envs(world.laptop_env()).stdout(std::fs::File::create(&path).unwrap()).output().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    out.status.success().then(|| serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap())
}

/// The guest exports the user's own laptop session's id as its root (every message and part
/// made to name it), then a tree whose root names its own child as its parent. Both are
/// EXPORT_INVALID with nothing imported: the user's session keeps its messages and folder,
/// and no session of the cycle reaches the laptop (one there hid from the session list and
/// spun `opencode session delete`). The guest's honest export then proves.
#[test]
fn a_guest_that_exports_the_users_own_session_or_a_parent_cycle_imports_nothing() {
    let world = World::new("lies-tree");
    let (users, other) = users_own_session(&world);
    let users_before = laptop_copy(&world, &other, &users).unwrap();
    world.ok_call("boxd_ensure", W1);
    world.ok_call("boxd_submit", r#"{"work":"w1","prompt":"delegate @@task:{\"description\":\"sub\",\"prompt\":\"child hi\",\"subagent_type\":\"general\"}@@"}"#);
    assert_eq!(world.job_until_idle("w1")["outcome"], "completed");

    let take_over = format!(
        "{LIE_HEAD}old = root[\"info\"][\"id\"]\nfor s in real[\"sessions\"]:\n    if s[\"info\"].get(\"parentID\") == old: s[\"info\"][\"parentID\"] = \"{users}\"\nroot[\"info\"][\"id\"] = \"{users}\"\nfor m in root[\"messages\"]:\n    m[\"info\"][\"sessionID\"] = \"{users}\"\n    for p in m[\"parts\"]: p[\"sessionID\"] = \"{users}\"\n{LIE_TAIL}"
    );
    export_lie(&world, "oc-w1", "w1", Some(&take_over));
    let v = world.err_call("boxd_harvest", W1, "EXPORT_INVALID");
    assert!(v["message"].as_str().unwrap().contains(&users) && v["message"].as_str().unwrap().contains("already holds"), "{v:#}");
    assert_eq!(laptop_copy(&world, &other, &users).unwrap(), users_before, "the user's session is as it was, in its own folder");

    let cycle = format!("{LIE_HEAD}root[\"info\"][\"parentID\"] = real[\"sessions\"][1][\"info\"][\"id\"]\n{LIE_TAIL}");
    export_lie(&world, "oc-w1", "w1", Some(&cycle));
    let v = world.err_call("boxd_harvest", W1, "EXPORT_INVALID");
    assert!(v["message"].as_str().unwrap().contains("names a parent"), "{v:#}");
    let record = record(&world, "w1");
    assert!(record["proofs"].as_array().is_none_or(|p| p.is_empty()), "nothing proven: {record:#}");

    export_lie(&world, "oc-w1", "w1", None);
    let v = world.ok_call("boxd_harvest", W1);
    let sessions = v["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 2, "{v:#}");
    assert!(sessions[0]["parentId"].is_null() && sessions[1]["parentId"] == sessions[0]["id"], "{v:#}");
    assert!(sessions.iter().all(|s| s["id"] != users.as_str()), "{v:#}");
    assert_eq!(laptop_copy(&world, &other, &users).unwrap(), users_before);
}

/// A fork's machine holds its parent's OpenCode data, every id of the parent's proven
/// transcript. Its guest grafts its root under the parent's session, files a part under the
/// parent's message, or gives one of its own messages the id of the parent's (the import
/// would keep the parent's row and file the fork's parts under it): each is EXPORT_INVALID,
/// nothing imported, the parent's laptop transcript unchanged. The honest fork and its
/// parent then prove, harvested in either order.
#[test]
fn a_forks_guest_never_writes_into_its_parents_transcript_and_honest_forks_prove_either_order() {
    let world = World::new("lies-fork-ids");
    world.ok_call("boxd_ensure", W1);
    crate::harvest::run_on(&world, "w1", "hello from w1");
    let sid1 = world.ok_call("boxd_harvest", W1)["sessions"][0]["id"].as_str().unwrap().to_string();
    let w1_before = crate::harvest::laptop_export(&world, &sid1);
    let m1 = w1_before["messages"][0]["info"]["id"].as_str().unwrap().to_string();
    let fork = world.ok_call("boxd_fork", r#"{"work":"w1","forks":["w2"]}"#);
    assert_eq!(fork["forks"][0]["state"], "running", "{fork:#}");
    crate::harvest::run_on(&world, "w2", "FORK-TEXT");

    let lies = [
        ("graft", format!("{LIE_HEAD}root[\"info\"][\"parentID\"] = \"{sid1}\"\n{LIE_TAIL}"), "names a parent"),
        (
            "part",
            format!("{LIE_HEAD}m = root[\"messages\"][-1]\nm[\"parts\"].append({{\"id\": \"prt_2320ffffffffINJECTEDBYW2\", \"messageID\": \"{m1}\", \"sessionID\": root[\"info\"][\"id\"], \"type\": \"text\", \"text\": \"INJECTED BY w2\"}})\n{LIE_TAIL}"),
            "names message",
        ),
        (
            "message id",
            format!("{LIE_HEAD}m = root[\"messages\"][-1]\nm[\"info\"][\"id\"] = \"{m1}\"\nfor p in m[\"parts\"]: p[\"messageID\"] = \"{m1}\"\n{LIE_TAIL}"),
            "work 'w1''s session",
        ),
    ];
    for (what, lie, said) in lies {
        export_lie(&world, "oc-w2", "w2", Some(&lie));
        let v = world.err_call("boxd_harvest", r#"{"work":"w2"}"#, "EXPORT_INVALID");
        assert!(v["message"].as_str().unwrap().contains(said), "{what}: {v:#}");
        assert_eq!(crate::harvest::laptop_export(&world, &sid1), w1_before, "{what}: w1's transcript on the laptop is unchanged");
    }
    export_lie(&world, "oc-w2", "w2", None);

    // Honest: the fork first, then the parent; then the parent first, then the fork.
    let v = world.ok_call("boxd_harvest", r#"{"work":"w2"}"#);
    let sid2 = v["sessions"][0]["id"].as_str().unwrap().to_string();
    assert!(sid2 != sid1 && v["sessions"][0]["parentId"].is_null() && v["forkOf"]["work"] == "w1", "{v:#}");
    crate::harvest::run_on(&world, "w1", "more for w1");
    assert_eq!(world.ok_call("boxd_harvest", W1)["proven"], true);
    crate::harvest::run_on(&world, "w1", "and more for w1");
    crate::harvest::run_on(&world, "w2", "more for w2");
    assert_eq!(world.ok_call("boxd_harvest", W1)["proven"], true);
    assert_eq!(world.ok_call("boxd_harvest", r#"{"work":"w2"}"#)["proven"], true);
    let w1_now = crate::harvest::laptop_export(&world, &sid1).to_string();
    assert!(!w1_now.contains("FORK-TEXT") && !w1_now.contains("more for w2"), "nothing of w2 in w1's transcript");
    assert!(crate::harvest::laptop_export(&world, &sid2).to_string().contains("more for w2"));
}

/// The boxd CLI signed in to another org (`boxd auth switch`, another BOXD_TOKEN): there
/// the work's machine is truly not found and the listing truly lacks it. Neither a drop
/// closes the work (its prompt called unrecovered while its machine runs on in the first
/// org) nor a resume rebuilds it there: BOXD_FAILED naming both accounts. Signed in as
/// before, the machine is the work's as ever.
#[test]
fn another_account_signed_in_never_closes_or_rebuilds_a_work_it_cannot_see() {
    let world = ran_a_prompt("lies-account");
    let made = record(&world, "w1")["account"].as_str().unwrap().to_string();
    assert!(made.starts_with("usr_"), "the account that made it is kept: {made}");
    world.faults(
        r#"[{"verb":"machine get","action":"fail","message":"VM 'oc-w1' not found"},
            {"verb":"machine list","action":"garbage","output":"[]"},
            {"verb":"auth","action":"garbage","output":"{\"user_id\":\"usr_other\",\"active_org\":\"acme\"}"}]"#,
    );
    for tool in ["boxd_drop", "boxd_resume"] {
        let v = world.err_call(tool, W1, "BOXD_FAILED");
        assert!(v["message"].as_str().unwrap().contains("usr_other/acme") && v["message"].as_str().unwrap().contains(&made), "{tool}: {v:#}");
        assert!(v["next"].as_str().unwrap().contains("boxd auth switch"), "{tool}: {v:#}");
    }
    let r = record(&world, "w1");
    assert_eq!(r["state"], "open", "{r:#}");
    assert_eq!(r["prompts"].as_array().map(Vec::len), Some(1), "{r:#}");
    assert!(r.get("unrecovered").is_none_or(|u| u.as_array().is_some_and(Vec::is_empty)), "{r:#}");
    assert_eq!((world.calls_starting(&["machine", "new"]), world.calls_starting(&["machine", "remove"])), (1, 0), "nothing rebuilt or removed");
    world.faults("[]");
    assert_eq!(world.ok_call("boxd_job", W1)["state"], "idle", "signed in as before, the machine is the work's");
}
