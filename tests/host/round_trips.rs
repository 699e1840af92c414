//! boxd round trips per tool, counted from boxd-local's call log: every tool that touches
//! one machine makes exactly one state read carrying the machine id (`machine get`, where
//! the ownership check rides) plus its own action calls, whatever the number of files
//! (issue 15). A harvest with nothing new runs no laptop OpenCode.

use serde_json::json;

use crate::common::*;

const W1: &str = r#"{"work":"w1"}"#;

/// One successful tool call and the boxd invocations it made.
fn trips(world: &World, tool: &str, args: &str) -> Vec<Vec<String>> {
    world.forget_calls();
    world.ok_call(tool, args);
    world.laptop.boxd_calls()
}

/// The calls' verbs (`machine get`, `machine exec`, …), for readable failures.
fn verbs(calls: &[Vec<String>]) -> Vec<String> {
    calls.iter().map(|c| c.iter().take(2).cloned().collect::<Vec<_>>().join(" ")).collect()
}

/// Exactly one state read, and it carries the machine's id (`machine get oc-w1`).
fn one_state_read(tool: &str, calls: &[Vec<String>]) {
    let reads: Vec<&Vec<String>> = calls.iter().filter(|c| c[0] == "machine" && (c[1] == "get" || c[1] == "list")).collect();
    assert_eq!(reads.len(), 1, "{tool}: one state read: {:?}", verbs(calls));
    assert_eq!(reads[0][..3], ["machine", "get", "oc-w1"], "{tool}: the read carries the id: {:?}", verbs(calls));
}

#[test]
fn every_tool_makes_one_state_read_and_a_fixed_number_of_round_trips() {
    let world = World::new("round-trips");
    // A create: the name read once, the account's machines listed for the caps, the golden
    // snapshot checked, the machine made, the account that made it asked (kept for the
    // gone checks), the helper uploaded (the ledger knows a new
    // machine lacks it) and the guest prepared.
    let create = trips(&world, "boxd_ensure", W1);
    assert_eq!(verbs(&create), ["machine get", "machine list", "snapshots list", "machine new", "auth --json", "machine exec", "machine exec"]);
    world.ok_call("boxd_ensure", r#"{"work":"w2"}"#);

    let status = trips(&world, "boxd_status", "{}");
    assert!(status.len() <= 2, "boxd_status at two works: {:?}", verbs(&status));

    let adopt = trips(&world, "boxd_ensure", W1);
    one_state_read("boxd_ensure (adopt)", &adopt);
    assert_eq!(adopt.len(), 2, "ensure on a running machine: {:?}", verbs(&adopt));

    let files: Vec<_> = (0..3)
        .map(|i| {
            std::fs::write(world.laptop.project.join(format!("in-{i}.txt")), format!("file {i}")).unwrap();
            json!({ "from": format!("in-{i}.txt"), "to": format!("in/{i}.txt") })
        })
        .collect();
    let submit = trips(&world, "boxd_submit", &json!({ "work": "w1", "prompt": "hello", "files": files }).to_string());
    one_state_read("boxd_submit", &submit);
    assert_eq!(submit.len(), 2, "submit with three files: {:?}", verbs(&submit));
    assert_eq!(world.job_until_idle("w1")["outcome"], "completed");

    let job = trips(&world, "boxd_job", W1);
    one_state_read("boxd_job", &job);
    assert_eq!(job.len(), 2, "{:?}", verbs(&job));

    let harvest_args = r#"{"work":"w1","files":["in/0.txt","in/1.txt","in/2.txt"],"to":"back"}"#;
    let harvest = trips(&world, "boxd_harvest", harvest_args);
    one_state_read("boxd_harvest", &harvest);
    assert_eq!(harvest.len(), 3, "harvest with three files: {:?}", verbs(&harvest));

    // Nothing new since that proof: the laptop's OpenCode is not run again.
    let log = world.laptop.scratch.0.join("audit.jsonl");
    world.forget_calls();
    let (code, v) = world.call_with(&["--audit-log", log.to_str().unwrap()], "boxd_harvest", harvest_args);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(world.laptop.boxd_calls().len(), 3, "{:?}", verbs(&world.laptop.boxd_calls()));
    assert!(v["sessions"].as_array().unwrap().iter().all(|s| s["imported"] == false), "{v:#}");
    let audit = std::fs::read_to_string(&log).unwrap();
    assert!(audit.contains("\"program\":\"boxd\""), "the audit line lists the spawns: {audit}");
    assert!(!audit.contains("\"program\":\"opencode\""), "no laptop OpenCode for an unchanged session: {audit}");

    // The snapshot listing, the machine's state, a second look at the name just before the
    // save (it may have been taken meanwhile), the save (its answer names its version).
    let image = trips(&world, "boxd_image", r#"{"work":"w1","name":"w1-image"}"#);
    assert!(image.len() <= 3, "{:?}", verbs(&image));
    assert_eq!(image.iter().filter(|c| c[..2] == ["machine", "get"]).count(), 1, "{:?}", verbs(&image));

    let sleep = trips(&world, "boxd_sleep", W1);
    one_state_read("boxd_sleep", &sleep);
    assert_eq!(sleep.len(), 2, "{:?}", verbs(&sleep));

    let resume = trips(&world, "boxd_resume", W1);
    one_state_read("boxd_resume", &resume);
    assert!(resume.len() <= 4, "resume of a sleeping machine: {:?}", verbs(&resume));

    let drop = trips(&world, "boxd_drop", W1);
    one_state_read("boxd_drop", &drop);
    assert!(drop.len() <= 3, "{:?}", verbs(&drop));
}
