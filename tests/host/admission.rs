//! Admission and spend through the real host, guest and boxd-local: a cap reached and
//! freed, a ceiling crossed (the work over it still sleeps, harvests and drops), an ensure
//! with another spec refused, spend shown by status, job and drop, and forks (queued, admitted
//! in order, each harvested on its own). Exact figures are
//! the unit tests' (component/src/ledger/spend.rs, fixed clocks); here the clock is real.

use crate::common::*;

fn with(world: &World, options: &str, tool: &str, args: &str) -> (i32, serde_json::Value) {
    world.call_with(&["--options", options], tool, args)
}

fn refused(world: &World, options: &str, tool: &str, args: &str, code: &str) -> serde_json::Value {
    let (exit, v) = with(world, options, tool, args);
    assert_eq!((exit, v["error"].as_str()), (1, Some(code)), "{tool} {args}: {v:#}");
    v
}

#[test]
fn a_cap_is_reached_then_freed_by_a_sleep() {
    let world = World::new("admission-cap");
    let one = r#"{"maxRunningPerLedger":1}"#;
    assert_eq!(with(&world, one, "boxd_ensure", r#"{"work":"w1"}"#).0, 0);
    world.forget_calls();
    let v = refused(&world, one, "boxd_ensure", r#"{"work":"w2"}"#, "CAP_REACHED");
    assert!(v["message"].as_str().unwrap().contains("maxRunningPerLedger is at most 1"), "{v:#}");
    assert!(v["next"].as_str().unwrap().ends_with(": w1."), "the next step names the work to sleep: {v:#}");
    assert_eq!(world.calls_starting(&["machine", "new"]), 0, "nothing was created past the cap");
    // A hibernated machine does not count: the slot is free again.
    assert_eq!(with(&world, one, "boxd_sleep", r#"{"work":"w1"}"#).0, 0);
    assert_eq!(with(&world, one, "boxd_ensure", r#"{"work":"w2"}"#).0, 0);
    // And waking w1 now would pass it.
    let v = refused(&world, one, "boxd_resume", r#"{"work":"w1"}"#, "CAP_REACHED");
    assert!(v["next"].as_str().unwrap().ends_with(": w2."), "{v:#}");
    let status = world.ok_call("boxd_status", "{}");
    let burn = status["spend"]["burnPerHour"].as_f64().unwrap();
    assert!((burn - 0.219).abs() < 1e-9, "one machine running at 0.218 and one asleep at 0.001: {status:#}");
    for w in status["works"].as_array().unwrap() {
        assert!(w["spend"]["spent"].as_f64().is_some(), "{w:#}");
    }
    // w2's machine removed outside the plugin: its record still has an open run, but a
    // wake is refused only for what really runs (the refusal is checked against the
    // account's listing), so w1 wakes.
    assert!(world.laptop.boxd(&["machine", "remove", "oc-w2", "-y"]).status.success());
    let (code, v) = with(&world, one, "boxd_resume", r#"{"work":"w1"}"#);
    assert_eq!((code, v["action"].as_str()), (0, Some("woken")), "{v:#}");
}

#[test]
fn a_ceiling_is_crossed_and_the_work_over_it_still_sleeps_and_drops() {
    let world = World::new("admission-ceiling");
    assert_eq!(with(&world, r#"{"burnRateCeiling":0.3}"#, "boxd_ensure", r#"{"work":"w1"}"#).0, 0);
    let v = refused(&world, r#"{"burnRateCeiling":0.3}"#, "boxd_ensure", r#"{"work":"w2"}"#, "CEILING_REACHED");
    assert!(v["message"].as_str().unwrap().contains("burnRateCeiling 0.3000"), "{v:#}");
    // w1 has spent something (it runs), so a spend ceiling of 0 refuses waking it, but
    // nothing else: it sleeps, harvests and drops. Asleep, it cannot be harvested or
    // dropped, so the next step is the one way out: raise the ceiling, then wake it.
    let zero = r#"{"workSpendCeiling":0}"#;
    assert_eq!(with(&world, zero, "boxd_sleep", r#"{"work":"w1"}"#).0, 0);
    let v = refused(&world, zero, "boxd_resume", r#"{"work":"w1"}"#, "CEILING_REACHED");
    assert!(v["next"].as_str().unwrap().starts_with("Raise workSpendCeiling"), "{v:#}");
    refused(&world, zero, "boxd_harvest", r#"{"work":"w1"}"#, "MACHINE_ASLEEP");
    assert_eq!(with(&world, "{}", "boxd_resume", r#"{"work":"w1"}"#).0, 0);
    let (code, v) = with(&world, zero, "boxd_harvest", r#"{"work":"w1"}"#);
    assert_eq!(code, 0, "{v:#}");
    let (code, v) = with(&world, zero, "boxd_drop", r#"{"work":"w1"}"#);
    assert_eq!(code, 0, "{v:#}");
    assert!(v["settled"]["cost"].as_f64().is_some_and(|c| c >= 0.0) && v["settled"]["lifetimeHours"].is_number(), "{v:#}");
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap()).unwrap();
    assert_eq!(record["state"], "closed");
    assert!(record["settled"]["costMicros"].is_u64() && record["runs"].as_array().unwrap().iter().all(|r| r["toMs"].is_u64()), "{record:#}");
}

#[test]
fn ensure_with_another_folder_is_a_conflict_never_a_second_machine() {
    let world = World::new("admission-conflict");
    world.ok_call("boxd_ensure", r#"{"work":"w1"}"#);
    std::fs::create_dir_all(world.laptop.project.join("sub")).unwrap();
    world.forget_calls();
    let v = world.err_call("boxd_ensure", r#"{"work":"w1","directory":"sub"}"#, "WORK_CONFLICT");
    assert!(v["message"].as_str().unwrap().contains("sub"), "{v:#}");
    assert_eq!(world.calls_starting(&["machine", "new"]), 0);
    let v = world.ok_call("boxd_job", r#"{"work":"w1"}"#);
    assert!(v["spend"]["burnPerHour"].as_f64().is_some_and(|b| (b - 0.218).abs() < 1e-9), "{v:#}");
}

/// A fork of a proven work runs its own prompt in its own session (its harvest brings home
/// only its messages, not the parent's again); forks past a cap wait queued and a later
/// boxd_fork admits them in order once a slot frees.
#[test]
fn forks_of_a_proven_work_run_their_own_prompts_and_the_queue_admits_in_order() {
    let world = World::new("admission-fork");
    let two = r#"{"maxRunningPerLedger":2}"#;
    world.ok_call("boxd_ensure", r#"{"work":"w1"}"#);
    let setup = format!("set up @@tool:bash:{}@@", serde_json::json!({ "command": "echo base > base.txt", "description": "set up" }));
    world.ok_call("boxd_submit", &serde_json::json!({ "work": "w1", "prompt": setup }).to_string());
    assert_eq!(world.job_until_idle("w1")["outcome"], "completed");
    // An unharvested parent is not copied.
    world.err_call("boxd_fork", r#"{"work":"w1","forks":["fa"]}"#, "NOT_PROVEN");
    let parent = world.ok_call("boxd_harvest", r#"{"work":"w1"}"#);
    let parent_session = parent["sessions"][0]["id"].as_str().unwrap().to_string();

    let (code, v) = with(&world, two, "boxd_fork", r#"{"work":"w1","forks":["fa","fb"]}"#);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!((v["queued"].clone(), v["waiting"]["error"].as_str()), (serde_json::json!(["fb"]), Some("CAP_REACHED")), "{v:#}");
    let tree = world.on_machine("oc-fa", "cat work/fa/base.txt && test ! -e .boxd-helper/works/fa/session && echo clean");
    assert_eq!(String::from_utf8_lossy(&tree.stdout), "base\nclean\n", "the fork has the parent's tree and its own guest state");
    world.err_call("boxd_submit", r#"{"work":"fb","prompt":"variant b"}"#, "CAP_REACHED");

    world.ok_call("boxd_submit", r#"{"work":"fa","prompt":"variant a"}"#);
    assert_eq!(world.job_until_idle("fa")["outcome"], "completed");
    let h = world.ok_call("boxd_harvest", r#"{"work":"fa"}"#);
    let sessions = h["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{h:#}");
    assert_ne!(sessions[0]["id"].as_str().unwrap(), parent_session, "the fork's own session, not the parent's again");
    assert_eq!(sessions[0]["messages"], 2, "only the fork's prompt and its answer: {h:#}");
    // …and linked to where it came from.
    assert_eq!(h["forkOf"]["work"], "w1", "{h:#}");
    assert_eq!(h["forkOf"]["parentSessions"], serde_json::json!([parent_session]), "{h:#}");

    // The slot frees: the queued fork is admitted by the next call for the parent.
    assert_eq!(with(&world, two, "boxd_sleep", r#"{"work":"fa"}"#).0, 0);
    let (code, v) = with(&world, two, "boxd_fork", r#"{"work":"w1"}"#);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["queued"], serde_json::json!([]), "{v:#}");
    let fb = v["forks"].as_array().unwrap().iter().find(|f| f["work"] == "fb").unwrap();
    assert_eq!((fb["state"].as_str(), fb["admittedNow"].as_bool(), fb["parent"].as_str()), (Some("running"), Some(true), Some("w1")), "{v:#}");
    // Drop guards hold for each fork: fb's copied tree is unaccounted until fb is harvested.
    world.err_call("boxd_drop", r#"{"work":"fb"}"#, "NOT_PROVEN");
    world.ok_call("boxd_harvest", r#"{"work":"fb"}"#);
    // The copied new file is the parent's, not fb's to account for: losing fb's copy is said.
    world.err_call("boxd_drop", r#"{"work":"fb"}"#, "UNTRACKED");
    world.ok_call("boxd_drop", r#"{"work":"fb","discard":["base.txt"]}"#);
}

/// boxd's own idle bound hibernates a work holding an unharvested run; a hundred hours
/// later (the record's times moved back: the clock here is real) boxd_status shows what it
/// spent, 0.5 h running and the rest asleep at the disk rate (about 0.2085), and the wake
/// is judged on that same figure: a workSpendCeiling of 1 lets it wake, and the run comes
/// home. Before, the wake billed the asleep hours as running (21.8) and refused it.
#[test]
fn a_machine_boxd_hibernated_wakes_on_the_spend_status_shows() {
    let world = World::new("admission-idle");
    world.ok_call("boxd_ensure", r#"{"work":"w1"}"#);
    world.ok_call("boxd_submit", r#"{"work":"w1","prompt":"a task left unharvested"}"#);
    assert_eq!(world.job_until_idle("w1")["outcome"], "completed");
    // boxd's idle timer, not a tool: a bound of one second, applied by the next boxd call.
    assert!(world.laptop.boxd(&["machine", "config", "set", "oc-w1", "auto-hibernate.timeout", "1"]).status.success());
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let path = world.laptop.ledger.join("works/w1/work.json");
    let mut record: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    const BACK: u64 = 100 * 3_600_000;
    let back = |v: &mut serde_json::Value| *v = (v.as_u64().unwrap() - BACK).into();
    back(&mut record["createdMs"]);
    for run in record["runs"].as_array_mut().unwrap() {
        back(&mut run["fromMs"]);
        if run["activeMs"].is_u64() {
            back(&mut run["activeMs"]);
        }
    }
    for p in record["prompts"].as_array_mut().unwrap() {
        back(&mut p["atMs"]);
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&record).unwrap()).unwrap();

    let status = world.ok_call("boxd_status", "{}");
    let row = &status["works"][0];
    let spent = row["spend"]["spent"].as_f64().unwrap();
    assert_eq!(row["state"], "asleep", "{status:#}");
    assert!((0.2085..0.211).contains(&spent), "0.5 h running, 99.5 h asleep: {status:#}");
    assert!(status["next"].as_str().unwrap().contains("boxd_resume for work 'w1', then boxd_harvest"), "{status:#}");
    let v = refused(&world, r#"{"workSpendCeiling":0.2}"#, "boxd_resume", r#"{"work":"w1"}"#, "CEILING_REACHED");
    assert!(v["message"].as_str().unwrap().contains("has spent 0.2"), "the figure status shows: {v:#}");
    let (code, v) = with(&world, r#"{"workSpendCeiling":1}"#, "boxd_resume", r#"{"work":"w1"}"#);
    assert_eq!((code, v["action"].as_str()), (0, Some("woken")), "{v:#}");
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let first = &record["runs"][0];
    assert_eq!(first["endedBy"], "seen asleep", "the wake recorded where the run ended: {record:#}");
    assert_eq!(first["toMs"].as_u64().unwrap(), first["fromMs"].as_u64().unwrap().max(record["prompts"][0]["atMs"].as_u64().unwrap()).max(first["activeMs"].as_u64().unwrap_or(0)) + 1_800_000, "{record:#}");
    let h = world.ok_call("boxd_harvest", r#"{"work":"w1"}"#);
    assert_eq!(h["sessions"][0]["messages"], 2, "the unharvested run came home: {h:#}");
}
