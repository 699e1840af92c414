//! A harvest killed while its files land leaves temp files beside their destinations on
//! the laptop. They are the plugin's own (named in the ledger before the host makes them):
//! status names them, and a later harvest or drop removes exactly those, never a user's
//! file that merely looks like one.

use std::path::Path;

use serde_json::{json, Value};

use crate::common::*;

/// Every `*.boxd-tmp` under `dir`.
fn temps_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() && !p.ends_with(".git") {
            found.extend(temps_under(&p));
        } else if p.to_string_lossy().ends_with(".boxd-tmp") {
            found.push(p.display().to_string());
        }
    }
    found
}

/// The index (from 1) of the harvest's spawn that streams the files home, from an audit log.
fn files_exec_index(world: &World, work: &str) -> u32 {
    let log = world.laptop.scratch.0.join("temps-audit.jsonl");
    let (code, v) = world.call_with(&["--audit-log", log.to_str().unwrap()], "boxd_harvest", &json!({ "work": work, "files": ["out.txt"], "to": "first" }).to_string());
    assert_eq!(code, 0, "{v:#}");
    let line = std::fs::read_to_string(&log).unwrap().lines().last().unwrap().to_string();
    let entry: Value = serde_json::from_str(&line).unwrap();
    let spawns = entry["spawns"].as_array().unwrap();
    let at = spawns.iter().position(|s| s["args"].as_array().unwrap().iter().any(|a| a.as_str().is_some_and(|a| a.contains("--files-stdin")))).expect("a files exec");
    at as u32 + 1
}

#[test]
fn a_harvest_killed_while_files_land_leaves_recorded_temps_that_the_next_harvest_and_drop_remove() {
    let world = World::new("temps");
    world.ok_call("boxd_ensure", r#"{"work":"t1"}"#);
    let bash = json!({ "command": "echo result > out.txt", "description": "write" });
    world.ok_call("boxd_submit", &json!({ "work": "t1", "prompt": format!("write @@tool:bash:{bash}@@") }).to_string());
    assert_eq!(world.job_until_idle("t1")["outcome"], "completed");
    world.ok_call("boxd_harvest", r#"{"work":"t1"}"#); // the transcript home: what follows has nothing new
    let n = files_exec_index(&world, "t1");

    // A user's own file that looks like a temp file: never the plugin's to remove.
    let project = world.laptop.project.clone();
    std::fs::create_dir_all(project.join("back")).unwrap();
    let lookalike = project.join("back/out.txt.0123456789ab-0.boxd-tmp");
    std::fs::write(&lookalike, "mine").unwrap();

    // Killed right after the files exec: the bytes are in temp files, not yet renamed.
    let oc = opencode_bin();
    let mut env = world.laptop_env();
    env.push(("PATH".into(), format!("{}:{}", oc.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default())));
    env.push(("BOXD_HOST_KILL_AT".into(), format!("after-spawn:{n}")));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let args = json!({ "work": "t1", "files": ["out.txt"], "to": "back" }).to_string();
    let out = world.laptop.host_stdin(&["--opencode", oc.to_str().unwrap(), "call", "boxd_harvest", &args], &env, None);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(9), "killed at after-spawn:{n}");
    let left: Vec<String> = temps_under(&project).into_iter().filter(|p| !p.ends_with("0123456789ab-0.boxd-tmp")).collect();
    assert_eq!(left.len(), 1, "the kill left the landing temp file: {left:?}");

    // Status names it; the rerun brings the file home (the temp may still belong to a
    // harvest running now while the file is owed, so it stays until nothing is owed).
    let status = world.ok_call("boxd_status", "{}");
    let row = status["works"].as_array().unwrap().iter().find(|w| w["work"] == "t1").unwrap().clone();
    assert!(row["warnings"].as_array().unwrap().iter().any(|w| w.as_str().unwrap().contains(&left[0])), "{row:#}");
    let again = world.ok_call("boxd_harvest", &args);
    assert_eq!(again["files"][0]["path"], "out.txt", "{again:#}");
    assert_eq!(std::fs::read_to_string(project.join("back/out.txt")).unwrap(), "result\n");

    // Nothing owed now: the next harvest removes the recorded temp, and only it.
    world.ok_call("boxd_harvest", r#"{"work":"t1"}"#);
    assert!(!Path::new(&left[0]).exists(), "the recorded temp is gone");
    assert_eq!(std::fs::read_to_string(&lookalike).unwrap(), "mine", "a look-alike the ledger never named is kept");
    let record: Value = serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/t1/work.json")).unwrap()).unwrap();
    assert!(record.get("temps").is_none(), "the record no longer names it: {record:#}");
    let status = world.ok_call("boxd_status", "{}");
    assert!(!status.to_string().contains(".boxd-tmp"), "{status:#}");
}

#[test]
fn a_drop_removes_what_an_interrupted_harvest_recorded() {
    let world = World::new("temps-drop");
    world.ok_call("boxd_ensure", r#"{"work":"t2"}"#);
    world.ok_call("boxd_harvest", r#"{"work":"t2"}"#);
    // As a killed harvest leaves it: a temp file on the laptop, named in the record.
    let temp = world.laptop.project.join("gone.txt.aaaaaaaaaaaa-0.boxd-tmp");
    std::fs::write(&temp, "partial").unwrap();
    let path = world.laptop.ledger.join("works/t2/work.json");
    let mut record: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    record["temps"] = json!([{ "path": temp.display().to_string(), "atMs": 1 }]);
    std::fs::write(&path, serde_json::to_vec_pretty(&record).unwrap()).unwrap();
    let dropped = world.ok_call("boxd_drop", r#"{"work":"t2"}"#);
    assert_eq!(dropped["dropped"], true, "{dropped:#}");
    assert!(!temp.exists(), "the drop removed the recorded temp file");
}
