//! A boxd CLI that acts and then fails anyway (boxd-local's `fail` fault with `land`: the
//! command runs, its answer is lost, an error is printed): the hibernate, wake, exec,
//! remove and create each happened, and the tool was told otherwise. The call answers a
//! documented error (or, where it looks again, the truth), and the same call made again
//! settles the work as if the first had answered: nothing done twice, nothing lost.

use serde_json::Value;

use crate::common::*;

const W1: &str = r#"{"work":"w1"}"#;

fn acted_then_failed(world: &World, verb: &str) {
    world.forget_calls();
    world.faults(&format!(r#"[{{"verb":"{verb}","times":1,"action":"fail","land":true,"message":"internal server error"}}]"#));
}

fn machine_status(world: &World, machine: &str) -> String {
    stdout_json(&world.laptop.boxd(&["machine", "get", machine, "--json"]))["status"].as_str().unwrap_or("").to_string()
}

/// The first call is told boxd failed; the machine shows it acted.
fn told_failed(world: &World, tool: &str, args: &str) -> Value {
    let v = world.err_call(tool, args, "BOXD_FAILED");
    assert!(v["message"].as_str().unwrap().contains("internal server error"), "{tool}: boxd's own words: {v:#}");
    v
}

#[test]
fn each_change_boxd_made_before_failing_is_settled_by_the_same_call_again_never_done_twice() {
    let world = World::new("acted");
    world.ok_call("boxd_ensure", W1);

    acted_then_failed(&world, "machine hibernate");
    told_failed(&world, "boxd_sleep", W1);
    assert_eq!(machine_status(&world, "oc-w1"), "hibernated");
    let again = world.ok_call("boxd_sleep", W1);
    assert_eq!((&again["state"], &again["alreadyAsleep"]), (&"asleep".into(), &true.into()), "{again:#}");
    // The first sleep recorded its intent before the hibernate: the machine is down by it.
    assert_eq!(again["asleepBy"], "boxd_sleep", "{again:#}");
    assert!(again["sleptAt"].is_string(), "{again:#}");
    assert_eq!(world.calls_starting(&["machine", "hibernate"]), 1, "hibernated once");

    acted_then_failed(&world, "machine wake");
    told_failed(&world, "boxd_resume", W1);
    assert_eq!(machine_status(&world, "oc-w1"), "running");
    let again = world.ok_call("boxd_resume", W1);
    assert_eq!((&again["state"], &again["action"]), (&"running".into(), &"already running".into()), "{again:#}");
    assert_eq!(world.calls_starting(&["machine", "wake"]), 1, "woken once");

    // The prompt reached the guest before the CLI failed: the retry is its duplicate.
    acted_then_failed(&world, "machine exec");
    told_failed(&world, "boxd_submit", r#"{"work":"w1","prompt":"hello once"}"#);
    let prompts = |w: &World| -> Vec<Value> {
        let record: Value = serde_json::from_slice(&std::fs::read(w.laptop.ledger.join("works/w1/work.json")).unwrap()).unwrap();
        record["prompts"].as_array().cloned().unwrap_or_default()
    };
    let recorded = prompts(&world);
    assert_eq!(recorded.len(), 1, "the prompt whose fate is unknown stays recorded: {recorded:#?}");
    let again = world.ok_call("boxd_submit", r#"{"work":"w1","prompt":"hello once"}"#);
    assert_eq!((&again["duplicate"], &again["promptId"]), (&true.into(), &recorded[0]["id"]), "{again:#}");
    assert_eq!(world.job_until_idle("w1")["lastText"], "MODEL_REPLY: hello once");

    // The export ran before the CLI failed: the retry proves the one run, once.
    acted_then_failed(&world, "machine exec");
    told_failed(&world, "boxd_harvest", W1);
    let again = world.ok_call("boxd_harvest", W1);
    assert_eq!(again["proven"], true, "{again:#}");
    assert_eq!(again["sessions"][0]["messages"], 2, "one prompt and its one answer: {again:#}");

    // The drop looks again after a failed remove, finds the machine gone, and closes the work.
    acted_then_failed(&world, "machine remove");
    let first = world.ok_call("boxd_drop", W1);
    assert_eq!(first["dropped"], true, "{first:#}");
    assert!(!world.laptop.boxd(&["machine", "get", "oc-w1", "--json"]).status.success(), "removed");
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], false, "already dropped");

    // A create that landed: the next ensure adopts it, and nothing is made twice.
    acted_then_failed(&world, "machine new");
    told_failed(&world, "boxd_ensure", r#"{"work":"w2"}"#);
    let again = world.ok_call("boxd_ensure", r#"{"work":"w2"}"#);
    assert_eq!((&again["adopted"], &again["state"]), (&true.into(), &"running".into()), "{again:#}");
    assert_eq!(world.calls_starting(&["machine", "new"]), 1, "created once");
}
