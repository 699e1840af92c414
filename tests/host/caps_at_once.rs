//! The caps and the fork queue under calls at once, each its own `boxd-host call` process
//! against boxd-local (docs/configuration.md, "Calls at once"): a create, fork or wake
//! under way is counted by every other call, so no cap is passed; two boxd_fork calls of
//! one parent never give two forks one queue place; and a `machine fork` that timed out
//! leaves its fork to the next boxd_fork at once.

use serde_json::{json, Value};

use crate::common::*;
use crate::kill_matrix::ledger_record;

fn with(world: &World, options: &str, tool: &str, args: &str) -> (i32, Value) {
    world.call_with(&["--options", options], tool, args)
}

/// Machines boxd-local shows running.
fn running(world: &World) -> Vec<String> {
    let out = world.laptop.boxd(&["machine", "list", "--json"]);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap_or(json!([]));
    list.as_array().into_iter().flatten().filter(|m| m["status"] == "running").map(|m| m["name"].as_str().unwrap_or_default().to_string()).collect()
}

/// Each answer is a success or a cap refusal with its next step; the refusals.
fn successes_or_refusals(answers: &[(i32, Value)]) -> usize {
    let mut refused = 0;
    for (code, v) in answers {
        if *code != 0 {
            assert!(matches!(v["error"].as_str(), Some("CAP_REACHED")) && v["next"].as_str().is_some_and(|n| n.contains("then call again")), "{v:#}");
            refused += 1;
        }
    }
    refused
}

/// maxRunningPerLedger 2, one work running: an ensure whose `machine new` is slow, and four
/// more at once while it is under way. Only the first is made; before, all five were (6
/// running: each call counted what boxd listed, and the first's machine was not listed yet).
#[test]
fn creates_at_once_never_pass_the_ledger_cap() {
    let world = World::new("caps-creates");
    let two = r#"{"maxRunningPerLedger":2}"#;
    assert_eq!(with(&world, two, "boxd_ensure", r#"{"work":"base"}"#).0, 0);
    world.faults(r#"[{"verb":"machine new","times":1,"action":"delay","ms":4000}]"#);
    let w = &world;
    let answers: Vec<(i32, Value)> = std::thread::scope(|s| {
        let first = s.spawn(move || with(w, two, "boxd_ensure", r#"{"work":"c1"}"#));
        until_running(&["machine", "new", "oc-c1"]);
        let rest: Vec<_> = (2..=5).map(|i| s.spawn(move || with(w, two, "boxd_ensure", &format!(r#"{{"work":"c{i}"}}"#)))).collect();
        let mut all = vec![first.join().unwrap()];
        all.extend(rest.into_iter().map(|h| h.join().unwrap()));
        all
    });
    let up = running(&world);
    assert_eq!(up.len(), 2, "{up:?}\n{answers:#?}");
    assert_eq!(answers[0].0, 0, "the first was admitted before the others came: {answers:#?}");
    assert_eq!(successes_or_refusals(&answers), 4, "{answers:#?}");
    assert!(answers[1].1["next"].as_str().unwrap().contains("c1 (being started by another call)"), "{:#}", answers[1].1);
    let left: Vec<_> = std::fs::read_dir(world.laptop.ledger.join("admission")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "every claim was released: {left:?}");
    // The slot frees with a sleep, as the refusal says.
    assert_eq!(with(&world, two, "boxd_sleep", r#"{"work":"c1"}"#).0, 0);
    assert_eq!(with(&world, two, "boxd_ensure", r#"{"work":"c2"}"#).0, 0);
}

/// Two wakes at once with one slot left: the first's `machine wake` is slow, and the second
/// (which counts from the ledger, where the first's run is not recorded yet, and checks its
/// refusal against a listing that still shows the first asleep) comes meanwhile. One wakes.
#[test]
fn wakes_at_once_never_pass_the_ledger_cap() {
    let world = World::new("caps-wakes");
    let two = r#"{"maxRunningPerLedger":2}"#;
    for w in ["base", "w1", "w2"] {
        assert_eq!(with(&world, "{}", "boxd_ensure", &json!({ "work": w }).to_string()).0, 0);
    }
    for w in ["w1", "w2"] {
        assert_eq!(with(&world, "{}", "boxd_sleep", &json!({ "work": w }).to_string()).0, 0);
    }
    world.faults(r#"[{"verb":"machine wake","times":1,"action":"delay","ms":4000}]"#);
    let answers: Vec<(i32, Value)> = std::thread::scope(|s| {
        let first = s.spawn(|| with(&world, two, "boxd_resume", r#"{"work":"w1"}"#));
        until_running(&["machine", "wake", "oc-w1"]);
        let second = with(&world, two, "boxd_resume", r#"{"work":"w2"}"#);
        vec![first.join().unwrap(), second]
    });
    let up = running(&world);
    assert_eq!(up.len(), 2, "{up:?}\n{answers:#?}");
    assert_eq!((answers[0].0, successes_or_refusals(&answers)), (0, 1), "{answers:#?}");
}

/// maxRunningPerLedger 3 with the parent running: two boxd_fork calls of it (naming forks
/// that overlap) and an ensure, at once, each `machine fork` and `machine new` slowed. At
/// most three machines run, and every fork has its own place in the queue (before: 5
/// running, and f1 and f2 both took place 1).
#[test]
fn forks_and_an_ensure_at_once_never_pass_the_cap_and_number_their_forks_apart() {
    let world = World::new("caps-forks");
    let three = r#"{"maxRunningPerLedger":3}"#;
    assert_eq!(with(&world, three, "boxd_ensure", r#"{"work":"p"}"#).0, 0);
    world.ok_call("boxd_harvest", r#"{"work":"p"}"#);
    world.faults(r#"[{"verb":"machine fork","times":3,"action":"delay","ms":2000},{"verb":"machine new","times":1,"action":"delay","ms":2000}]"#);
    let answers: Vec<(i32, Value)> = std::thread::scope(|s| {
        let a = s.spawn(|| with(&world, three, "boxd_fork", r#"{"work":"p","forks":["f1","f2"]}"#));
        let b = s.spawn(|| with(&world, three, "boxd_fork", r#"{"work":"p","forks":["f2","f3"]}"#));
        let c = s.spawn(|| with(&world, three, "boxd_ensure", r#"{"work":"e1"}"#));
        vec![a.join().unwrap(), b.join().unwrap(), c.join().unwrap()]
    });
    let up = running(&world);
    assert!(up.len() <= 3, "{up:?}\n{answers:#?}");
    for (code, v) in &answers {
        assert!(*code == 0 || v["error"] == "CAP_REACHED", "{v:#}");
    }
    let mut orders: Vec<u64> = ["f1", "f2", "f3"].iter().map(|f| ledger_record(&world, f)["fork"]["order"].as_u64().unwrap()).collect();
    orders.sort();
    orders.dedup();
    assert_eq!(orders.len(), 3, "each fork its own place: {orders:?}");
    let left: Vec<_> = std::fs::read_dir(world.laptop.ledger.join("admission")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "every claim was released: {left:?}");
}

/// boxd stops answering one `machine fork` (boxdTimeoutSeconds 5): the call answers
/// CREATE_UNCERTAIN, and the next boxd_fork makes the fork at once (before, it answered
/// "still being made by another boxd_fork call" for 10 minutes, and nothing was made).
#[test]
fn a_fork_that_timed_out_is_made_by_the_next_call() {
    let world = World::new("caps-fork-hang");
    let quick = r#"{"boxdTimeoutSeconds":5}"#;
    world.ok_call("boxd_ensure", r#"{"work":"p"}"#);
    world.ok_call("boxd_harvest", r#"{"work":"p"}"#);
    world.faults(r#"[{"verb":"machine fork","times":1,"action":"hang","ms":60000}]"#);
    let (code, v) = with(&world, quick, "boxd_fork", r#"{"work":"p","forks":["f1"]}"#);
    assert_eq!((code, v["error"].as_str()), (1, Some("CREATE_UNCERTAIN")), "{v:#}");
    let (code, v) = with(&world, quick, "boxd_fork", r#"{"work":"p"}"#);
    assert_eq!(code, 0, "{v:#}");
    let f1 = v["forks"].as_array().unwrap().iter().find(|f| f["work"] == "f1").cloned().unwrap_or_default();
    assert_eq!(f1["state"], "running", "{v:#}");
    assert!(!v["next"].as_str().unwrap().contains("another boxd_fork call"), "{v:#}");
    assert_eq!(ledger_record(&world, "f1")["state"], "open");
    assert_eq!(world.calls_starting(&["machine", "fork"]), 2, "one hung, one made it");
}
