//! A harvest killed while its files land leaves temp files beside their destinations on
//! the laptop. They are the plugin's own (named in the ledger before the host makes them):
//! status names them, and a later harvest or drop removes exactly those, never a user's
//! file that merely looks like one. A harvest killed while it replaces a file this work
//! brought home leaves that file's bytes aside: the next harvest puts them back first.

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
    let args = json!({ "work": "t1", "files": ["out.txt"], "to": "back" }).to_string();
    assert!(world.killed_at(&format!("after-spawn:{n}"), "boxd_harvest", &args), "killed at after-spawn:{n}");
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

/// Every `*.kept` (a replaced file's bytes, moved aside) under `dir`.
fn asides_under(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).filter(|p| p.to_string_lossy().ends_with(".boxd-tmp.kept")).collect()
}

/// A prompt that writes NOTES.md on the guest, then the transcript home, so the files
/// harvest that follows has only the file to do.
fn write_notes(world: &World, text: &str) {
    let bash = json!({ "command": format!("echo {text} > NOTES.md"), "description": "write" });
    world.ok_call("boxd_submit", &json!({ "work": "t3", "prompt": format!("write @@tool:bash:{bash}@@") }).to_string());
    assert_eq!(world.job_until_idle("t3")["outcome"], "completed");
    world.ok_call("boxd_harvest", r#"{"work":"t3"}"#);
}

#[test]
fn a_harvest_killed_while_it_replaces_a_file_puts_the_old_bytes_back_and_never_loses_an_edit() {
    let world = World::new("temps-aside");
    world.ok_call("boxd_ensure", r#"{"work":"t3"}"#);
    let project = world.laptop.project.clone();
    let notes = project.join("NOTES.md");
    let files = r#"{"work":"t3","files":["NOTES.md"]}"#;
    write_notes(&world, "v1");
    world.ok_call("boxd_harvest", files);

    // Which committed write moves NOTES.md aside, from the audit of a replacement.
    write_notes(&world, "v2");
    let log = world.laptop.scratch.0.join("aside-audit.jsonl");
    let (code, v) = world.call_with(&["--audit-log", log.to_str().unwrap()], "boxd_harvest", files);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "v2\n");
    let entry: Value = serde_json::from_str(std::fs::read_to_string(&log).unwrap().lines().last().unwrap()).unwrap();
    let commits: Vec<&Value> = entry["paths"].as_array().unwrap().iter().filter(|p| p["mode"] == "rename-from" || p["mode"] == "link-from").collect();
    let k = 1 + commits.iter().position(|p| p["mode"] == "rename-from" && p["path"] == notes.display().to_string()).expect("NOTES.md is moved aside") as u32;

    // Killed right after the move aside: NOTES.md is empty, its bytes beside it. Status
    // says so; the rerun puts them back, then replaces them as usual, leaving nothing.
    write_notes(&world, "v3");
    assert!(world.killed_at(&format!("after-rename:{k}"), "boxd_harvest", files), "killed at after-rename:{k}");
    assert!(!notes.exists(), "killed between the move aside and the placement");
    let aside = asides_under(&project);
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read_to_string(&aside[0]).unwrap(), "v2\n");
    let status = world.ok_call("boxd_status", "{}");
    let row = status["works"].as_array().unwrap().iter().find(|w| w["work"] == "t3").unwrap().clone();
    let said = row["warnings"].to_string();
    assert!(said.contains(&aside[0].display().to_string()) && said.contains("puts it back"), "{row:#}");
    world.ok_call("boxd_harvest", files);
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "v3\n");
    assert!(asides_under(&project).is_empty(), "nothing left aside");

    // Again, and this time what was moved aside is an edit the user saved just before (as
    // the move found it): it goes back, and the harvest refuses to replace it.
    write_notes(&world, "v4");
    assert!(world.killed_at(&format!("after-rename:{k}"), "boxd_harvest", files), "killed at after-rename:{k}");
    let aside = asides_under(&project);
    assert_eq!(aside.len(), 1, "{aside:?}");
    std::fs::write(&aside[0], "v3 and my edit\n").unwrap();
    world.err_call("boxd_harvest", files, "FILE_CONFLICT");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "v3 and my edit\n", "the edit is where the user left it");
    assert!(asides_under(&project).is_empty());
}

/// A harvest killed after it placed its first file and before it recorded either: the
/// bytes it placed were recorded as arrived, so once the guest changes that file the next
/// harvest replaces it as this work's, instead of calling it a file no harvest wrote.
#[test]
fn a_file_a_killed_harvest_placed_but_never_recorded_is_this_works_to_replace() {
    let world = World::new("temps-unrecorded");
    let work = "t4";
    world.ok_call("boxd_ensure", &json!({ "work": work }).to_string());
    let write = |text: &str| {
        let bash = json!({ "command": format!("echo {text} > a.txt && echo {text} > b.txt"), "description": "write" });
        world.ok_call("boxd_submit", &json!({ "work": work, "prompt": format!("write @@tool:bash:{bash}@@") }).to_string());
        assert_eq!(world.job_until_idle(work)["outcome"], "completed");
        world.ok_call("boxd_harvest", &json!({ "work": work }).to_string());
    };
    write("v1");
    // Which committed write places a.txt, from the audit of the same harvest elsewhere.
    let log = world.laptop.scratch.0.join("unrecorded-audit.jsonl");
    let (code, v) = world.call_with(&["--audit-log", log.to_str().unwrap()], "boxd_harvest", &json!({ "work": work, "files": ["a.txt", "b.txt"], "to": "first" }).to_string());
    assert_eq!(code, 0, "{v:#}");
    let entry: Value = serde_json::from_str(std::fs::read_to_string(&log).unwrap().lines().last().unwrap()).unwrap();
    let commits: Vec<&Value> = entry["paths"].as_array().unwrap().iter().filter(|p| p["mode"] == "rename-from" || p["mode"] == "link-from").collect();
    let k = 1 + commits.iter().position(|p| p["mode"] == "link-from" && p["path"].as_str().is_some_and(|p| p.contains("first/a.txt."))).expect("a.txt is placed by a link") as u32;
    let files = json!({ "work": work, "files": ["a.txt", "b.txt"] }).to_string();
    assert!(world.killed_at(&format!("after-rename:{k}"), "boxd_harvest", &files), "killed at after-rename:{k}");
    let a = world.laptop.project.join("a.txt");
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "v1\n", "a.txt was placed before the kill");
    // The guest changes it; the next harvest brings the new bytes over the ones it placed.
    write("v2");
    let v = world.ok_call("boxd_harvest", &files);
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "v2\n", "{v:#}");
    assert_eq!(std::fs::read_to_string(world.laptop.project.join("b.txt")).unwrap(), "v2\n");
    // The killed harvest's temp for b.txt goes with the next sweep, once nothing is owed.
    world.ok_call("boxd_harvest", &json!({ "work": work }).to_string());
    assert!(temps_under(&world.laptop.project).is_empty(), "no temp file left: {:?}", temps_under(&world.laptop.project));
}
