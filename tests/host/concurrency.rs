//! Many writers, one ledger (issue 13): change calls from separate `boxd-host` processes
//! at once on one work record every admitted prompt exactly once, and a lock left by a
//! host that died is recovered; two harvests at once bring one transcript and one file.

use serde_json::{json, Value};

use crate::common::*;

#[test]
fn six_submits_at_once_record_every_admitted_prompt_exactly_once() {
    let world = World::new("concurrent");
    world.ok_call("boxd_ensure", r#"{"work":"w1"}"#);
    let mut answered = Vec::new();
    for round in 0..3 {
        let results: Vec<(i32, Value)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..6)
                .map(|i| {
                    let world = &world;
                    s.spawn(move || world.call("boxd_submit", &json!({ "work": "w1", "prompt": format!("round {round} writer {i}") }).to_string()))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (code, v) in results {
            assert_ne!(v["error"], "LEDGER_FAILED", "{v:#}");
            assert_eq!(code, 0, "{v:#}");
            answered.push(v["promptId"].as_str().unwrap().to_string());
        }
    }
    let record: Value = serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap()).unwrap();
    let mut ids: Vec<String> = record["prompts"].as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap().to_string()).collect();
    assert!(record["prompts"].as_array().unwrap().iter().all(|p| p["admitted"] == true), "{record:#}");
    ids.sort();
    answered.sort();
    assert_eq!(ids, answered, "the ledger holds exactly the 18 admitted prompts");
    let out = world.on_machine("oc-w1", "cat .boxd-helper/works/w1/state.json");
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut seen: Vec<String> = st["seen"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    seen.sort();
    assert_eq!(seen, answered, "the guest admitted each once");
    // No temp file or lock is left behind.
    let names: Vec<String> = std::fs::read_dir(world.laptop.ledger.join("works/w1")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(!names.iter().any(|n| n.ends_with(".boxd-tmp") || n == "lock"), "{names:?}");
}

#[test]
fn a_lock_left_by_a_dead_host_is_taken_over() {
    let world = World::new("deadlock");
    world.ok_call("boxd_ensure", r#"{"work":"w1"}"#);
    let lock = world.laptop.ledger.join("works/w1/lock");
    std::fs::write(&lock, r#"{"owner":"boxd-host:dead0000dead0000"}"#).unwrap();
    let v = world.ok_call("boxd_sleep", r#"{"work":"w1"}"#);
    assert_eq!(v["state"], "asleep");
    assert!(!lock.exists(), "the dead owner's lock was moved aside and ours released");
    let record: Value = serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap()).unwrap();
    assert_eq!(record["asleepByTool"], true, "the change landed under the recovered lock");
}

/// Two hosts harvest one work at once, with the laptop's OpenCode and a file (in the runs
/// looked at, both imported the session; either may find the other's proof first): both
/// answer with the same proof, neither is a PROOF_FAILED or a FILE_CONFLICT against the
/// other, the laptop's copy holds each guest message, the file comes home with the guest's
/// bytes, nothing temporary or locked is left in the project or the ledger, and the work
/// drops.
#[test]
fn two_harvests_of_one_work_at_once_both_prove_the_same_transcript_and_bring_the_file() {
    let world = World::new("concurrent-harvest");
    world.ok_call("boxd_ensure", r#"{"work":"w1"}"#);
    crate::harvest::run_on(&world, "w1", &format!("write {}", crate::harvest::bash("echo 'the notes' > NOTES.md")));
    let results: Vec<(i32, Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2).map(|_| s.spawn(|| world.call("boxd_harvest", r#"{"work":"w1","files":["NOTES.md"]}"#))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (code, v) in &results {
        assert_eq!(*code, 0, "{v:#}");
        assert_eq!(v["files"][0]["path"], "NOTES.md", "{v:#}");
        assert_eq!(v["files"][0]["sha256"], crate::guest::sha256(b"the notes\n").as_str(), "{v:#}");
        let s = &v["sessions"];
        assert_eq!(s.as_array().unwrap().len(), 1, "{v:#}");
        for key in ["id", "messages", "digest"] {
            assert_eq!(s[0][key], results[0].1["sessions"][0][key], "both proved the same transcript: {results:#?}");
        }
    }
    let session = &results[0].1["sessions"][0];
    let copy = crate::harvest::laptop_export(&world, session["id"].as_str().unwrap());
    assert_eq!(copy["messages"].as_array().unwrap().len() as u64, session["messages"].as_u64().unwrap());
    assert_eq!(std::fs::read_to_string(world.laptop.project.join("NOTES.md")).unwrap(), "the notes\n");
    let names = |dir: &std::path::Path| -> Vec<String> { std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect() };
    let left = names(&world.laptop.project);
    assert!(!left.iter().any(|n| n.contains(".boxd-tmp") || n.ends_with(".kept")), "{left:?}");
    let left = names(&world.laptop.ledger.join("works/w1"));
    assert!(!left.iter().any(|n| n.ends_with(".boxd-tmp") || n.starts_with("lock")), "{left:?}");
    let record: Value = serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap()).unwrap();
    assert!(record["temps"].as_array().is_none_or(|t| t.is_empty()), "no temp file is owed: {record:#}");
    assert_eq!(world.ok_call("boxd_drop", r#"{"work":"w1"}"#)["dropped"], true);
}

/// A folder the component lists while other calls add and remove entries in it (claims
/// released, works made): the host reads each entry's type as it lists, and an entry gone
/// meanwhile failed the whole listing (LEDGER_FAILED "could not list the ledger's admission
/// claims: no-entry", seen in caps_at_once under load). The listing is read again instead.
#[test]
fn a_folder_that_changes_while_it_is_listed_is_read_again_not_ledger_failed() {
    let world = World::new("list-churn");
    let works = world.laptop.ledger.join("works");
    std::fs::create_dir_all(&works).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let d = works.join(format!("churn{}", i % 64));
                let _ = std::fs::create_dir(&d);
                let _ = std::fs::remove_dir(&d);
                i += 1;
            }
        });
        let failed: Vec<Value> = (0..40).map(|_| world.call("boxd_status", "{}")).filter(|(code, _)| *code != 0).map(|(_, v)| v).collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(failed.is_empty(), "{} of 40 failed: {:#}", failed.len(), failed[0]);
    });
}
