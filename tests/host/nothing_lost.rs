//! Nothing the user made is lost, nothing that is not ours is touched (issue 12), through
//! `boxd-host call`, boxd-local and the real guest: drop reads the live machine, commits
//! come home as a bundle, every work tree is a repository, every tool checks the
//! machine's id, and every work can end.

use std::process::Command;

use serde_json::{json, Value};

use crate::common::*;

const W1: &str = r#"{"work":"w1"}"#;

/// A shell line inside a work's machine, in its work tree (a hand on the guest).
pub(crate) fn in_tree(world: &World, work: &str, line: &str) -> String {
    let script = format!("cd work/{work} && {line}");
    let quoted = format!("'{}'", script.replace('\'', "'\\''"));
    let out = world.laptop.boxd(&["machine", "exec", &format!("oc-{work}"), "--", "sh", "-c", &quoted]);
    assert!(out.status.success(), "{line}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn run(world: &World, work: &str, prompt: &str) {
    world.ok_call("boxd_submit", &json!({ "work": work, "prompt": prompt }).to_string());
    let v = world.job_until_idle(work);
    assert_eq!(v["outcome"], "completed", "{v:#}");
}

fn bash(cmd: &str) -> String {
    format!("@@tool:bash:{}@@", json!({ "command": cmd, "description": "work" }))
}

fn machine_exists(world: &World, name: &str) -> bool {
    world.laptop.boxd(&["machine", "get", name, "--json"]).status.success()
}

pub(crate) fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn drop_reads_the_live_machine_and_refuses_a_late_write_naming_the_paths() {
    let world = World::new("lost-late");
    world.ok_call("boxd_ensure", W1);
    run(&world, "w1", &format!("readme {}", bash("echo hello > README.md && git add README.md && git commit -qm readme")));
    let v = world.ok_call("boxd_harvest", W1);
    assert_eq!(v["git"]["dirty"], false, "{v:#}");
    // A late write after the proof: a background job, a manual fix.
    in_tree(&world, "w1", "echo data > results.csv && echo x >> README.md");
    let e = world.err_call("boxd_drop", W1, "DIRTY");
    assert!(e["message"].as_str().unwrap().contains("README.md"), "{e:#}");
    assert!(machine_exists(&world, "oc-w1"), "a refused drop destroys nothing");
    // The patch comes home; the new file is still only on the machine.
    world.ok_call("boxd_harvest", W1);
    let e = world.err_call("boxd_drop", W1, "UNTRACKED");
    assert!(e["message"].as_str().unwrap().contains("results.csv"), "{e:#}");
    assert!(machine_exists(&world, "oc-w1"));
    world.ok_call("boxd_harvest", r#"{"work":"w1","files":["results.csv"]}"#);
    world.forget_calls();
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], true);
    assert!(world.laptop.boxd_calls().len() <= 3, "a drop is at most 3 boxd calls: {:?}", world.laptop.boxd_calls());
    assert!(!machine_exists(&world, "oc-w1"));
}

#[test]
fn commits_come_home_as_a_bundle_and_an_unharvested_conflict_keeps_the_machine() {
    let world = World::new("lost-commits");
    for (work, text) in [("wa", "from a"), ("wb", "from b")] {
        world.ok_call("boxd_ensure", &json!({ "work": work }).to_string());
        run(&world, work, &format!("summary {}", bash(&format!("echo '{text}' > SUMMARY.md && git add SUMMARY.md && git commit -qm summary"))));
    }
    world.ok_call("boxd_harvest", r#"{"work":"wa","files":["SUMMARY.md"]}"#);
    let e = world.err_call("boxd_harvest", r#"{"work":"wb","files":["SUMMARY.md"]}"#, "FILE_CONFLICT");
    assert!(e["message"].as_str().unwrap().contains("stays owed"), "{e:#}");
    // The proof and the bundle are recorded, but SUMMARY.md is owed: B's drop refuses.
    let e = world.err_call("boxd_drop", r#"{"work":"wb"}"#, "UNTRACKED");
    assert!(e["message"].as_str().unwrap().contains("SUMMARY.md"), "{e:#}");
    assert!(machine_exists(&world, "oc-wb"));

    // B's commit is in the ledger's bundle: a fresh clone of the project can fetch it and
    // check it out.
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/wb/work.json")).unwrap()).unwrap();
    let bundle = world.laptop.ledger.join("works/wb").join(record["git"]["bundle"].as_str().expect("a bundle is recorded"));
    let head = in_tree(&world, "wb", "git rev-parse HEAD").trim().to_string();
    assert_eq!(record["git"]["refs"]["HEAD"], head.as_str());
    let project = &world.laptop.project;
    git(project, &["init", "-q"]);
    git(project, &["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "laptop"]);
    let clone = world.laptop.scratch.0.join("clone");
    assert!(Command::new("git").args(["clone", "-q"]).arg(project).arg(&clone).status().unwrap().success());
    git(&clone, &["bundle", "verify", "-q", bundle.to_str().unwrap()]);
    git(&clone, &["fetch", "-q", bundle.to_str().unwrap(), "HEAD:refs/boxd/wb"]);
    git(&clone, &["checkout", "-q", "refs/boxd/wb"]);
    assert_eq!(std::fs::read_to_string(clone.join("SUMMARY.md")).unwrap(), "from b\n");
    assert_eq!(git(&clone, &["rev-parse", "HEAD"]).trim(), head);

    // The user gives SUMMARY.md up by name: the commit holding it is safe in the bundle.
    let v = world.ok_call("boxd_drop", r#"{"work":"wb","discard":["SUMMARY.md"]}"#);
    assert_eq!(v["dropped"], true, "{v:#}");
    assert!(!machine_exists(&world, "oc-wb"));
}

#[test]
fn a_commit_made_after_the_harvest_is_not_dropped() {
    let world = World::new("lost-newcommit");
    world.ok_call("boxd_ensure", W1);
    world.ok_call("boxd_harvest", W1);
    in_tree(&world, "w1", "echo late > late.txt && git add late.txt && git -c user.email=t@t -c user.name=t commit -qm late");
    let e = world.err_call("boxd_drop", W1, "NOT_PROVEN");
    assert!(e["message"].as_str().unwrap().contains("HEAD"), "{e:#}");
    world.ok_call("boxd_harvest", W1);
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], true);
}

#[test]
fn an_ordinary_work_drops_on_the_first_try() {
    let world = World::new("lost-ordinary");
    world.ok_call("boxd_ensure", W1);
    run(&world, "w1", "just say hello");
    world.ok_call("boxd_harvest", W1);
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], true);
}

/// Our machine removed and someone else's made under its name: every tool refuses it with
/// no exec, naming boxd_drop (before: "start again under another work id", drop included,
/// so the work could never be closed); once a tool has seen it, boxd_status shows the row
/// not ours with no burn (before: running, burning, "call boxd_harvest") and the caps do
/// not count it (before: maxRunningPerLedger 1 refused every other work, naming w1); and
/// drop closes the work as a gone machine's, sending boxd nothing for theirs.
#[test]
fn a_machine_replaced_under_the_same_name_is_refused_by_every_tool_with_no_exec() {
    let world = World::new("lost-replaced");
    world.ok_call("boxd_ensure", W1);
    run(&world, "w1", "hello");
    world.ok_call("boxd_harvest", W1);
    assert!(world.laptop.boxd(&["machine", "remove", "oc-w1", "-y"]).status.success());
    assert!(world.laptop.boxd(&["machine", "new", "oc-w1", "--from-snapshot", "opencode-golden", "--json"]).status.success());
    world.forget_calls();
    let log = world.laptop.scratch.0.join("audit.jsonl");
    for (tool, args) in [
        ("boxd_job", W1.to_string()),
        ("boxd_submit", json!({ "work": "w1", "prompt": "secret plan" }).to_string()),
        ("boxd_harvest", W1.to_string()),
        ("boxd_sleep", W1.to_string()),
        ("boxd_resume", W1.to_string()),
        ("boxd_image", r#"{"work":"w1","name":"stolen"}"#.to_string()),
        ("boxd_ensure", W1.to_string()),
    ] {
        let (code, v) = world.call_with(&["--audit-log", log.to_str().unwrap()], tool, &args);
        assert_eq!((code, v["error"].as_str()), (1, Some("NOT_OURS")), "{tool}: {v:#}");
        assert!(v["next"].as_str().unwrap().contains("call boxd_drop for work 'w1'"), "{tool}: {v:#}");
    }
    let status = world.ok_call("boxd_status", "{}");
    let row = &status["works"][0];
    assert_eq!((row["work"].as_str(), row["state"].as_str(), row["spend"]["burnPerHour"].as_f64()), (Some("w1"), Some("notOurs"), Some(0.0)), "{status:#}");
    assert!(status["next"].as_str().unwrap().contains("boxd_drop for work 'w1'"), "{status:#}");
    let v = world.call_with(&["--audit-log", log.to_str().unwrap()], "boxd_drop", W1).1;
    assert_eq!((v["dropped"].as_bool(), v["machineWasGone"].as_bool()), (Some(true), Some(true)), "{v:#}");
    assert_eq!(v["nameTakenBy"], stdout_json(&world.laptop.boxd(&["machine", "get", "oc-w1", "--json"]))["id"], "{v:#}");
    let calls = world.laptop.boxd_calls();
    // Reads: the machines, the snapshots, and the account a drop checks before it closes.
    let touching: Vec<_> = calls.iter().filter(|c| !matches!(c.get(1).map(String::as_str), Some("get") | Some("list")) && c[0] != "snapshots" && c[..] != ["auth", "--json"]).collect();
    assert!(touching.is_empty(), "only reads reached boxd: {touching:?}");
    let audit = std::fs::read_to_string(&log).unwrap();
    assert!(!audit.contains("\"exec\""), "no exec on the stranger's machine: {audit}");
    assert!(machine_exists(&world, "oc-w1"), "the stranger's machine is untouched");
    assert_eq!(world.ok_call("boxd_status", "{}")["works"], json!([]), "the work is closed");
}

/// A work folder copied by hand to another id while someone else runs a machine under
/// that id's name: every tool on the copy is LEDGER_FAILED before boxd is asked anything
/// (before: boxd_sleep checked oc-w1 and hibernated their oc-w2, boxd_job put the guest
/// helper on it, boxd_resume set its idle bound), and boxd_status shows w1 once.
#[test]
fn a_work_folder_copied_by_hand_never_reaches_the_machine_under_the_copys_name() {
    let world = World::new("lost-copied");
    world.ok_call("boxd_ensure", W1);
    world.ok_call("boxd_harvest", W1);
    let works = world.laptop.ledger.join("works");
    std::fs::create_dir_all(works.join("w2")).unwrap();
    std::fs::copy(works.join("w1/work.json"), works.join("w2/work.json")).unwrap();
    assert!(world.laptop.boxd(&["machine", "new", "oc-w2", "--json"]).status.success());
    world.forget_calls();
    for tool in ["boxd_sleep", "boxd_job", "boxd_resume", "boxd_drop", "boxd_harvest"] {
        let v = world.err_call(tool, r#"{"work":"w2"}"#, "LEDGER_FAILED");
        assert!(v["message"].as_str().unwrap().contains("holds the record of work 'w1'") && v["next"].as_str().unwrap().contains("works/w1"), "{tool}: {v:#}");
    }
    assert!(world.laptop.boxd_calls().is_empty(), "boxd was asked {:?}", world.laptop.boxd_calls());
    assert_eq!(stdout_json(&world.laptop.boxd(&["machine", "get", "oc-w2", "--json"]))["status"], "running", "their machine runs on");
    let status = world.ok_call("boxd_status", "{}");
    let rows: Vec<(String, String)> = status["works"].as_array().unwrap().iter().map(|r| (r["work"].as_str().unwrap().into(), r["error"].as_str().unwrap_or("").into())).collect();
    assert_eq!(rows, [("w1".to_string(), String::new()), ("w2".to_string(), "LEDGER_FAILED".to_string())], "{status:#}");
}

#[test]
fn a_work_whose_machine_is_gone_can_be_closed_naming_what_was_lost() {
    let world = World::new("lost-gone");
    world.ok_call("boxd_ensure", W1);
    let p = world.ok_call("boxd_submit", r#"{"work":"w1","prompt":"never harvested"}"#);
    assert!(world.laptop.boxd(&["machine", "remove", "oc-w1", "-y"]).status.success());
    let e = world.err_call("boxd_harvest", W1, "MACHINE_GONE");
    assert!(e["next"].as_str().unwrap().contains("boxd_drop"), "{e:#}");
    let v = world.ok_call("boxd_drop", W1);
    assert_eq!(v["dropped"], true);
    assert_eq!(v["unrecovered"]["prompts"], json!([p["promptId"]]), "{v:#}");
    let status = world.ok_call("boxd_status", "{}");
    assert_eq!(status["works"], json!([]), "the work is closed");
}

/// A machine that vanished after a prompt the laptop never harvested, then rebuilt by
/// boxd_resume: that prompt's run went with the machine. The rebuild says so (and keeps it
/// in the record), so the harvest proves what the rebuilt machine holds instead of waiting
/// forever for a transcript no machine has, and the work can be dropped.
#[test]
fn a_rebuilt_machine_names_the_prompts_that_went_with_the_old_one_and_the_work_goes_on() {
    let world = World::new("lost-rebuilt");
    world.ok_call("boxd_ensure", W1);
    run(&world, "w1", "kept");
    world.ok_call("boxd_harvest", W1);
    let p = world.ok_call("boxd_submit", r#"{"work":"w1","prompt":"never harvested"}"#);
    assert_eq!(world.job_until_idle("w1")["outcome"], "completed");
    assert!(world.laptop.boxd(&["machine", "remove", "oc-w1", "-y"]).status.success());
    let v = world.ok_call("boxd_resume", W1);
    assert_eq!(v["action"], "rebuilt");
    assert_eq!(v["unrecovered"]["prompts"], json!([p["promptId"]]), "{v:#}");
    assert!(v["restoredSessions"].as_u64() >= Some(1), "the proven transcript is back: {v:#}");
    let status = world.ok_call("boxd_status", "{}");
    let w1 = &status["works"][0];
    assert_eq!(w1["prompts"], 1, "{w1:#}");
    assert!(w1["warnings"].to_string().contains("their runs are lost"), "{w1:#}");
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap()).unwrap();
    assert_eq!(record["unrecovered"], json!([p["promptId"]]));
    // The work goes on: the harvest proves the rebuilt machine's transcript, and drop closes it.
    assert_eq!(world.job_until_idle("w1")["state"], "idle");
    world.ok_call("boxd_harvest", W1);
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], true);
}

/// A rebuild whose `machine new` answers too late (CREATE_UNCERTAIN; the machine lands
/// anyway): the machine is adopted by the next call, and must still get the proven
/// transcript, or every harvest after would find an empty guest (found by the full faults
/// matrix). Until then a submit is refused (the machine is not yet known to be ours:
/// CREATE_UNCERTAIN, naming the ensure that takes it up).
#[test]
fn a_rebuild_that_answered_late_gets_the_transcript_when_it_is_adopted() {
    let world = World::new("late-rebuild");
    world.ok_call("boxd_ensure", W1);
    run(&world, "w1", "kept");
    world.ok_call("boxd_harvest", W1);
    assert!(world.laptop.boxd(&["machine", "remove", "oc-w1", "-y"]).status.success());
    world.faults(r#"[{"verb":"machine new","times":1,"action":"hang","ms":8000,"land":true}]"#);
    let (code, v) = world.call_with(&["--options", r#"{"boxdTimeoutSeconds":5}"#], "boxd_resume", W1);
    assert_eq!((code, v["error"].as_str()), (1, Some("CREATE_UNCERTAIN")), "{v:#}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !machine_exists(&world, "oc-w1") {
        assert!(std::time::Instant::now() < deadline, "the late create never landed");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // Landed, adopted by ensure: the proven transcript goes onto it in the same call.
    let record = || -> serde_json::Value { serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap()).unwrap() };
    assert_eq!(record()["restorePending"], true);
    let e = world.err_call("boxd_submit", r#"{"work":"w1","prompt":"too early"}"#, "CREATE_UNCERTAIN");
    assert!(e["next"].as_str().unwrap().contains("boxd_ensure"), "{e:#}");
    let v = world.ok_call("boxd_ensure", W1);
    assert_eq!(v["adopted"], true, "{v:#}");
    assert!(record().get("restorePending").is_none(), "{:#}", record());
    // The work goes on from its proven transcript: harvest proves it, a new prompt continues it.
    world.ok_call("boxd_harvest", W1);
    run(&world, "w1", "after the rebuild");
    world.ok_call("boxd_harvest", W1);

    // A rebuild killed after its create, just before the import (its last spawn): the
    // record says the transcript is owed; submit and harvest refuse and name boxd_resume,
    // which imports it.
    let log = world.laptop.scratch.0.join("rebuild.jsonl");
    assert!(world.laptop.boxd(&["machine", "remove", "oc-w1", "-y"]).status.success());
    let (code, v) = world.call_with(&["--audit-log", log.to_str().unwrap()], "boxd_resume", W1);
    assert_eq!((code, v["action"].as_str()), (0, Some("rebuilt")), "{v:#}");
    let audit: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&log).unwrap().lines().last().unwrap()).unwrap();
    let spawns = audit["spawns"].as_array().unwrap().len();
    assert!(audit["spawns"][spawns - 1]["args"].to_string().contains("import"), "the import is the rebuild's last spawn: {audit:#}");
    assert!(world.laptop.boxd(&["machine", "remove", "oc-w1", "-y"]).status.success());
    let killed = world.laptop.host_with(&["call", "boxd_resume", W1], &[("BOXD_HOST_KILL_AT", &format!("before-spawn:{spawns}"))]);
    assert_eq!(killed.status.code(), None, "killed before the import");
    assert_eq!(record()["restorePending"], true);
    for (tool, args) in [("boxd_submit", r#"{"work":"w1","prompt":"too early"}"#), ("boxd_harvest", W1)] {
        let e = world.err_call(tool, args, "MACHINE_GONE");
        assert!(e["message"].as_str().unwrap().contains("not on it yet") && e["next"].as_str().unwrap().contains("boxd_resume"), "{tool}: {e:#}");
    }
    let v = world.ok_call("boxd_resume", W1);
    assert_eq!((v["action"].as_str(), v["restoredSessions"].as_u64()), (Some("already running"), Some(1)), "{v:#}");
    let h = world.ok_call("boxd_harvest", W1);
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], true, "{h:#}");
}

#[test]
fn ensure_refuses_a_directory_that_is_not_a_plain_folder_before_creating_anything() {
    let world = World::new("lost-dir");
    let project = &world.laptop.project;
    std::fs::write(project.join("a-file"), "x").unwrap();
    std::os::unix::fs::symlink("/tmp", project.join("outside")).unwrap();
    std::fs::create_dir_all(project.join("real")).unwrap();
    std::os::unix::fs::symlink(project.join("real"), project.join("inside-link")).unwrap();
    for dir in ["a-file", "outside", "inside-link", "missing", "/etc"] {
        world.err_call("boxd_ensure", &json!({ "work": "w1", "directory": dir }).to_string(), "PATH_REFUSED");
    }
    assert_eq!(world.calls_starting(&["machine", "new"]), 0);
    assert!(world.laptop.boxd_calls().is_empty(), "nothing reached boxd: {:?}", world.laptop.boxd_calls());
    let v = world.ok_call("boxd_ensure", r#"{"work":"w1","directory":"real"}"#);
    assert_eq!(v["directory"], project.join("real").to_str().unwrap());
}

#[test]
fn job_reports_a_paused_machine_without_waking_it() {
    let world = World::new("lost-standby");
    world.ok_call("boxd_ensure", W1);
    assert!(world.laptop.boxd(&["machine", "pause", "oc-w1", "--json"]).status.success());
    world.forget_calls();
    let v = world.ok_call("boxd_job", W1);
    assert_eq!(v["state"], "standby", "{v:#}");
    assert_eq!(world.calls_starting(&["machine", "exec"]), 0, "no exec: it would wake the machine");
    let get = world.laptop.boxd(&["machine", "get", "oc-w1", "--json"]);
    assert!(String::from_utf8_lossy(&get.stdout).contains("standby"));
}

#[test]
fn a_harvest_clears_the_sleep_warning_it_resolves() {
    let world = World::new("lost-warning");
    world.ok_call("boxd_ensure", W1);
    run(&world, "w1", "hello");
    let v = world.ok_call("boxd_sleep", W1);
    assert!(v["warning"].as_str().is_some(), "{v:#}");
    let s = world.ok_call("boxd_status", "{}");
    assert!(s["next"].as_str().unwrap().contains("boxd_resume"), "asleep: resume first, not a harvest that cannot run: {s:#}");
    world.ok_call("boxd_resume", W1);
    world.ok_call("boxd_harvest", W1);
    let s = world.ok_call("boxd_status", "{}");
    assert_eq!(s["works"][0]["warnings"], json!([]), "{s:#}");
}

#[test]
fn with_fetch_commits_a_harvest_puts_the_works_commits_in_the_project_under_refs_boxd() {
    let world = World::new("lost-fetch");
    let project = &world.laptop.project;
    git(project, &["init", "-q"]);
    git(project, &["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "laptop"]);
    let branch_before = git(project, &["rev-parse", "HEAD"]);
    let opts = ["--options", r#"{"fetchCommits":true}"#];
    let (code, _) = world.call_with(&opts, "boxd_ensure", W1);
    assert_eq!(code, 0);
    run(&world, "w1", &format!("commit {}", bash("echo kept > KEPT.md && git add KEPT.md && git commit -qm kept")));
    let (code, v) = world.call_with(&opts, "boxd_harvest", W1);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["git"]["fetched"]["ref"], "refs/boxd/w1", "{v:#}");
    let head = in_tree(&world, "w1", "git rev-parse HEAD").trim().to_string();
    assert_eq!(git(project, &["rev-parse", "refs/boxd/w1"]).trim(), head);
    assert_eq!(git(project, &["show", "refs/boxd/w1:KEPT.md"]), "kept\n");
    assert_eq!(git(project, &["rev-parse", "HEAD"]), branch_before, "the project's own branch is untouched");
    // Without the option, git is not even granted: nothing is written into the project.
    let v = world.ok_call("boxd_harvest", W1);
    assert!(v["git"].get("fetched").is_none(), "{v:#}");
}

/// `refs/boxd/<work>` is the plugin's only while git can move it forward. A symbolic ref
/// of that name (a fetch would follow it and move the user's branch) and a ref holding
/// commits the work's HEAD lacks (another work of that name, a rebuilt machine: a forced
/// fetch left them unreachable) are left as they are, with the reason; once the reason's
/// commands put the old commits on a branch the ref is made again, and one behind the work
/// is moved forward.
#[test]
fn with_fetch_commits_a_ref_not_ours_or_not_behind_the_work_is_left_as_it_is() {
    let world = World::new("lost-fetch-refs");
    let project = &world.laptop.project;
    git(project, &["init", "-q", "-b", "main"]);
    git(project, &["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "laptop"]);
    let main = git(project, &["rev-parse", "main"]);
    let opts = ["--options", r#"{"fetchCommits":true}"#];
    assert_eq!(world.call_with(&opts, "boxd_ensure", W1).0, 0);
    let commit = |file: &str| in_tree(&world, "w1", &format!("echo {file} > {file} && git add {file} && git -c user.email=a@a -c user.name=a commit -qm {file} && git rev-parse HEAD"));
    let head = commit("ONE.md");
    let harvest = || {
        let (code, v) = world.call_with(&opts, "boxd_harvest", W1);
        assert_eq!(code, 0, "{v:#}");
        v["git"]["fetched"].clone()
    };

    git(project, &["symbolic-ref", "refs/boxd/w1", "refs/heads/main"]);
    let fetched = harvest();
    assert_eq!(fetched["ref"], Value::Null, "{fetched:#}");
    assert!(fetched["reason"].as_str().unwrap().contains("symbolic ref to refs/heads/main"), "{fetched:#}");
    assert_eq!(git(project, &["rev-parse", "main"]), main, "the user's branch did not move");
    assert_eq!(git(project, &["symbolic-ref", "refs/boxd/w1"]).trim(), "refs/heads/main", "their symbolic ref is as it was");

    git(project, &["symbolic-ref", "-d", "refs/boxd/w1"]);
    git(project, &["update-ref", "refs/boxd/w1", main.trim()]);
    let fetched = harvest();
    assert_eq!(fetched["ref"], Value::Null, "{fetched:#}");
    let reason = fetched["reason"].as_str().unwrap();
    assert!(reason.contains("does not contain"), "{fetched:#}");
    assert_eq!(git(project, &["rev-parse", "refs/boxd/w1"]), main, "the commits it held are still named");

    // The reason's own commands keep the old commits on a branch; then the ref is fetched.
    let (_, commands) = reason.rsplit_once("let the next harvest fetch: ").unwrap();
    let out = Command::new("sh").arg("-c").arg(commands).current_dir(project).output().unwrap();
    assert!(out.status.success(), "{commands}: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(git(project, &["rev-parse", "boxd-kept-w1"]), main);
    assert_eq!(harvest()["ref"], "refs/boxd/w1");
    assert_eq!(git(project, &["rev-parse", "refs/boxd/w1"]), head);
    let newer = commit("TWO.md");
    assert_eq!(harvest()["ref"], "refs/boxd/w1");
    assert_eq!(git(project, &["rev-parse", "refs/boxd/w1"]), newer, "moved forward to the work's new HEAD");
    assert_eq!(git(project, &["rev-parse", "main"]), main);
    assert!(!project.join(".git/FETCH_HEAD").exists(), "FETCH_HEAD is the user's");
}

/// A guest commit that moves a submodule's commit: a plain `git fetch` of it fetches in
/// the laptop's populated submodule too, from that submodule's own remote (the user's
/// network and credentials, its remote-tracking refs moved). The plugin's fetch brings
/// the work's commits and nothing else: no submodule fetch, no FETCH_HEAD.
#[test]
fn with_fetch_commits_a_guest_commit_moving_a_submodule_fetches_nothing_in_the_laptops_submodule() {
    let world = World::new("lost-fetch-submodule");
    let (project, upstream) = (&world.laptop.project, world.laptop.scratch.path("upstream"));
    let id = ["-c", "user.email=t@t", "-c", "user.name=t"];
    git(&world.laptop.scratch.0, &["init", "-q", "-b", "main", upstream.to_str().unwrap()]);
    git(&upstream, &[&id[..], &["commit", "-q", "--allow-empty", "-m", "one"]].concat());
    git(project, &["init", "-q", "-b", "main"]);
    git(project, &["-c", "protocol.file.allow=always", "submodule", "add", "-q", upstream.to_str().unwrap(), "sub"]);
    git(project, &[&id[..], &["commit", "-q", "-m", "sub"]].concat());
    git(&upstream, &[&id[..], &["commit", "-q", "--allow-empty", "-m", "two"]].concat());
    let (two, tracked) = (git(&upstream, &["rev-parse", "HEAD"]), git(&project.join("sub"), &["rev-parse", "refs/remotes/origin/main"]));
    assert_ne!(two, tracked);
    let opts = ["--options", r#"{"fetchCommits":true}"#];
    assert_eq!(world.call_with(&opts, "boxd_ensure", W1).0, 0);
    in_tree(&world, "w1", &format!(
        "printf '[submodule \"sub\"]\\n\\tpath = sub\\n\\turl = /nowhere\\n' > .gitmodules && git add .gitmodules && git update-index --add --cacheinfo 160000,{},sub && git -c user.email=a@a -c user.name=a commit -qm sub",
        two.trim()
    ));
    let (code, v) = world.call_with(&opts, "boxd_harvest", W1);
    assert_eq!((code, &v["git"]["fetched"]["ref"]), (0, &json!("refs/boxd/w1")), "{v:#}");
    assert_eq!(git(&project.join("sub"), &["rev-parse", "refs/remotes/origin/main"]), tracked, "nothing was fetched in the submodule");
    assert!(!project.join(".git/FETCH_HEAD").exists(), "FETCH_HEAD is the user's");
}

/// The guest's bundle is the agent's to shape: a commit whose tree names `.git` (which a
/// checkout would write into the repository's own folder) is refused as it arrives, and
/// nothing reaches the project's repository; the harvest itself completes.
#[test]
fn with_fetch_commits_a_bundle_git_refuses_never_reaches_the_project() {
    let world = World::new("lost-fetch-fsck");
    let project = &world.laptop.project;
    git(project, &["init", "-q"]);
    let opts = ["--options", r#"{"fetchCommits":true}"#];
    assert_eq!(world.call_with(&opts, "boxd_ensure", W1).0, 0);
    let evil = r#"export GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=a@a GIT_COMMITTER_NAME=a GIT_COMMITTER_EMAIL=a@a; b=$(echo owned | git hash-object -w --stdin); t=$(python3 -c "import sys,binascii; sys.stdout.buffer.write(b'100644 .git\0' + binascii.unhexlify(sys.argv[1]))" $b | git hash-object -t tree -w --literally --stdin); p=$(git rev-parse -q --verify HEAD >/dev/null && echo "-p HEAD"); c=$(git commit-tree $t $p -m evil); git update-ref HEAD $c && echo made"#;
    assert_eq!(in_tree(&world, "w1", evil).trim(), "made");
    let (code, v) = world.call_with(&opts, "boxd_harvest", W1);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["git"]["fetched"]["ref"], Value::Null, "{v:#}");
    assert!(v["git"]["fetched"]["reason"].as_str().unwrap().contains("fsck error"), "{v:#}");
    let refs = Command::new("git").arg("-C").arg(project).args(["for-each-ref", "refs/boxd"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&refs.stdout), "", "nothing was fetched");
}

/// A project that is not a repository but sits in one (a home folder kept in git): the
/// repository above is not the project's, and fetchCommits writes nothing into it.
#[test]
fn fetch_commits_never_writes_into_a_repository_above_the_project() {
    let world = World::new("lost-fetch-above");
    let above = &world.laptop.scratch.0;
    git(above, &["init", "-q"]);
    let opts = ["--options", r#"{"fetchCommits":true}"#];
    assert_eq!(world.call_with(&opts, "boxd_ensure", W1).0, 0);
    run(&world, "w1", &format!("commit {}", bash("echo kept > KEPT.md && git add KEPT.md && git commit -qm kept")));
    let (code, v) = world.call_with(&opts, "boxd_harvest", W1);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["git"]["fetched"]["ref"], Value::Null, "{v:#}");
    assert!(v["git"]["fetched"]["reason"].as_str().unwrap().contains("allowedRoots"), "{v:#}");
    let refs = Command::new("git").arg("-C").arg(above).args(["for-each-ref", "refs/boxd"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&refs.stdout), "", "nothing was fetched into the repository above");
    // Granted by the user (its top folder in allowedRoots), it is the project's repository.
    let granted = json!({ "fetchCommits": true, "allowedRoots": [above.display().to_string()] }).to_string();
    let (code, v) = world.call_with(&["--options", &granted], "boxd_harvest", W1);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["git"]["fetched"]["ref"], "refs/boxd/w1", "{v:#}");
}

/// The ledger's records name machines to act on: a guest's file harvested into it would
/// become a work of this laptop. No `to` and no harvested path may land in the ledger.
#[test]
fn a_harvest_never_writes_into_the_ledger() {
    let world = World::new("lost-into-ledger");
    let scratch = world.laptop.scratch.0.display().to_string();
    let opts = json!({ "allowedRoots": [scratch] }).to_string();
    let opts = ["--options", opts.as_str()];
    assert_eq!(world.call_with(&opts, "boxd_ensure", W1).0, 0);
    in_tree(&world, "w1", "mkdir -p ledger/works/w9 && echo '{\"schema\":1,\"work\":\"w9\",\"machine\":\"oc-w9\",\"state\":\"creating\"}' > ledger/works/w9/work.json");
    let ledger = world.laptop.ledger.display().to_string();
    for args in [json!({ "work": "w1", "files": ["ledger/works/w9/work.json"], "to": scratch }), json!({ "work": "w1", "files": ["ledger/works/w9/work.json"], "to": format!("{ledger}/inbox") })] {
        let (code, v) = world.call_with(&opts, "boxd_harvest", &args.to_string());
        assert_eq!((code, v["error"].as_str()), (1, Some("PATH_REFUSED")), "{args}: {v:#}");
        assert!(v["message"].as_str().unwrap().contains("ledger"), "{v:#}");
    }
    assert!(!world.laptop.ledger.join("works/w9").exists(), "no record was planted");
    assert!(!world.laptop.ledger.join("inbox").exists());
    let status = world.ok_call("boxd_status", "{}");
    assert!(status["works"].as_array().unwrap().iter().all(|w| w["work"] != "w9"), "{status:#}");
}

#[test]
fn a_repository_inside_the_work_tree_is_not_dropped_unless_discarded() {
    let world = World::new("lost-nested");
    world.ok_call("boxd_ensure", W1);
    // A clone inside the tree, then committed at the top as a gitlink: our bundle holds
    // none of its commits or files.
    in_tree(&world, "w1", "git init -q sub && cd sub && echo inner > f.txt && git add f.txt && git -c user.email=t@t -c user.name=t commit -qm inner && cd .. && git add -A && git commit -qm outer");
    world.ok_call("boxd_harvest", W1);
    let e = world.err_call("boxd_drop", W1, "UNTRACKED");
    assert!(e["message"].as_str().unwrap().contains("sub"), "{e:#}");
    assert!(machine_exists(&world, "oc-w1"));
    assert_eq!(world.ok_call("boxd_drop", r#"{"work":"w1","discard":["sub"]}"#)["dropped"], true);
}

/// A symlinked folder on the laptop side of a harvest or a submit is PATH_REFUSED before
/// anything is made, sent or recorded (not a boxd failure, and no prompt left "on its way"
/// to block the drop).
#[test]
fn a_symlinked_laptop_folder_is_path_refused_before_anything_is_made_or_recorded() {
    let world = World::new("lost-symlinked");
    let project = world.laptop.project.clone();
    world.ok_call("boxd_ensure", W1);
    in_tree(&world, "w1", "echo out > out.txt");
    std::fs::create_dir_all(project.join("sub")).unwrap();
    std::fs::write(project.join("sub/in.txt"), "in").unwrap();
    std::os::unix::fs::symlink("sub", project.join("link")).unwrap();
    let v = world.err_call("boxd_harvest", &json!({ "work": "w1", "files": ["out.txt"], "to": "link/deeper" }).to_string(), "PATH_REFUSED");
    assert!(v["message"].as_str().unwrap().contains("symlink"), "{v:#}");
    assert!(!project.join("sub/deeper").exists(), "no folder was made through the symlink");
    let v = world.err_call("boxd_harvest", &json!({ "work": "w1", "files": ["out.txt"], "to": "sub/in.txt" }).to_string(), "PATH_REFUSED");
    assert!(v["message"].as_str().unwrap().contains("not a folder"), "{v:#}");
    let v = world.err_call("boxd_submit", &json!({ "work": "w1", "prompt": "hi", "files": [{ "from": "link/in.txt", "to": "in.txt" }] }).to_string(), "PATH_REFUSED");
    assert!(v["message"].as_str().unwrap().contains("symlink"), "{v:#}");
    let record: Value = serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap()).unwrap();
    assert_eq!(record["prompts"].as_array().map_or(0, Vec::len), 0, "no prompt was recorded: {record:#}");
    assert_eq!(record["owed"].as_array().map_or(0, Vec::len), 0, "a refused file is not left owed: {record:#}");
    // Nothing is left waiting: harvest, then drop (giving up the file asked for above).
    world.ok_call("boxd_harvest", W1);
    assert_eq!(world.ok_call("boxd_drop", &json!({ "work": "w1", "discard": ["out.txt"] }).to_string())["dropped"], true);
}

/// One ledger, a work started in one project, the user now in another: the tools say
/// where the work belongs (PATH_REFUSED), not that OpenCode is missing, and nothing is lost.
#[test]
fn a_work_from_another_project_is_said_to_belong_there() {
    let world = World::new("lost-other-project");
    world.ok_call("boxd_ensure", W1);
    run(&world, "w1", "hello");
    let other = world.laptop.scratch.path("other-project");
    std::fs::create_dir_all(&other).unwrap();
    let oc = opencode_bin();
    let in_other = |tool: &str, args: &str| -> Value {
        let out = Command::new(boxd_host())
            .arg("--project").arg(&other).arg("--ledger").arg(&world.laptop.ledger).arg("--boxd").arg(boxd_local()).arg("--opencode").arg(&oc)
            .args(["call", tool, args])
            .env("BOXD_LOCAL_HOME", &world.laptop.boxd_home).env("BOXD_HOST_CACHE", cache_dir())
            .envs(world.laptop_env())
            .output()
            .unwrap();
        stdout_json(&out)
    };
    for args in [W1.to_string(), json!({ "work": "w1", "to": "." }).to_string()] {
        let v = in_other("boxd_harvest", &args);
        assert_eq!(v["error"], "PATH_REFUSED", "{v:#}");
        assert!(v["message"].as_str().unwrap().contains(&world.laptop.project.display().to_string()), "{v:#}");
        assert!(v["next"].as_str().unwrap().contains("Open OpenCode in"), "{v:#}");
    }
    // Nor is it taken up, sent a prompt or dropped from there: the prompt went into its
    // session and the files over its tree, where no harvest from there could reach what it
    // made, and a drop from there could not check what its folder still holds.
    for (tool, args) in [("boxd_ensure", W1.to_string()), ("boxd_submit", json!({ "work": "w1", "prompt": "from elsewhere" }).to_string()), ("boxd_drop", W1.to_string())] {
        let v = in_other(tool, &args);
        assert_eq!(v["error"], "PATH_REFUSED", "{tool}: {v:#}");
        assert!(v["next"].as_str().unwrap().contains("Open OpenCode in"), "{tool}: {v:#}");
    }
    let record: Value = serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap()).unwrap();
    assert_eq!(record["prompts"].as_array().unwrap().len(), 1, "no prompt recorded from the other project: {record:#}");
    // From its own project the work comes home as usual.
    assert_eq!(world.ok_call("boxd_harvest", W1)["proven"], true);
}

/// A commit and an uncommitted change on the machine, harvested; then the ledger's bundle
/// (and patch) are deleted. A harvest does not tell the guest it holds a bundle that is
/// gone, so the bundle is made again; a drop checks the files themselves, not only the
/// record naming them, and refuses while they are missing.
#[test]
fn a_bundle_or_patch_deleted_from_the_ledger_is_made_again_by_a_harvest_and_refuses_a_drop() {
    let world = World::new("lost-bundle");
    world.ok_call("boxd_ensure", W1);
    in_tree(&world, "w1", "echo one > a.txt && git add a.txt && git -c user.email=t@t -c user.name=t commit -qm one && echo two >> a.txt");
    let dir = world.laptop.ledger.join("works/w1");
    let v = world.ok_call("boxd_harvest", W1);
    let (bundle, patch) = (dir.join(v["git"]["bundle"].as_str().unwrap()), dir.join(v["git"]["patch"].as_str().unwrap()));
    std::fs::remove_file(&bundle).unwrap();
    let v = world.ok_call("boxd_harvest", W1);
    assert_eq!(dir.join(v["git"]["bundle"].as_str().unwrap()), bundle, "{v:#}");
    assert!(bundle.exists(), "the bundle is made again");
    let head = in_tree(&world, "w1", "git rev-parse HEAD").trim().to_string();
    git(&world.laptop.scratch.0, &["init", "-q", "verify"]);
    git(&world.laptop.scratch.0.join("verify"), &["fetch", "-q", bundle.to_str().unwrap(), "HEAD:refs/boxd/w1"]);
    assert_eq!(git(&world.laptop.scratch.0.join("verify"), &["rev-parse", "refs/boxd/w1"]).trim(), head);
    for gone in [&bundle, &patch] {
        std::fs::remove_file(gone).unwrap();
        let e = world.err_call("boxd_drop", W1, "NOT_PROVEN");
        assert!(e["next"].as_str().unwrap().contains("boxd_harvest"), "{e:#}");
        assert!(machine_exists(&world, "oc-w1"), "a refused drop destroys nothing");
        world.ok_call("boxd_harvest", W1);
        assert!(gone.exists(), "{} is stored again", gone.display());
    }
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], true);
}

#[test]
fn the_agents_git_clean_leaves_the_guest_state_and_a_removed_state_still_harvests_and_drops() {
    let world = World::new("lost-gitclean");
    world.ok_call("boxd_ensure", W1);
    // The agent cleans its tree, ignored files and nested repositories too, while a second
    // prompt waits in the inbox.
    let clean = bash("echo scratch > s.txt && git clean -fdx && git clean -fdX && git clean -fd && git clean -ffdx");
    world.ok_call("boxd_submit", &json!({ "work": "w1", "prompt": format!("tidy up {clean}") }).to_string());
    world.ok_call("boxd_submit", &json!({ "work": "w1", "prompt": "then say done" }).to_string());
    let v = world.job_until_idle("w1");
    let v = if v["pending"] != 0 { world.job_until_idle("w1") } else { v };
    assert_eq!((v["outcome"].as_str(), v["lastText"].as_str()), (Some("completed"), Some("MODEL_REPLY: then say done")), "{v:#}");
    assert_eq!(in_tree(&world, "w1", "test ! -e s.txt && echo cleaned"), "cleaned\n");
    let h = world.ok_call("boxd_harvest", W1);
    let session = h["sessions"][0]["id"].as_str().unwrap().to_string();

    // Removed all the same (by hand, outside the tree): said as such, and boxd_ensure finds
    // the same root session again, so the work proves and drops.
    // (again while the pump still writes into it, as a person's rm would race it)
    in_tree(&world, "w1", "s=~/.boxd-helper/works/w1; for i in 1 2 3 4 5; do rm -rf $s 2>/dev/null && break; sleep 0.2; done; test ! -e $s");
    world.err_call("boxd_job", W1, "GUEST_STATE_LOST");
    world.ok_call("boxd_ensure", W1);
    let h = world.ok_call("boxd_harvest", W1);
    assert_eq!(h["sessions"][0]["id"].as_str(), Some(session.as_str()), "{h:#}");
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], true);
}

/// The guest's state removed while one prompt runs and another waits: the waiting one went
/// with the state and never runs. The harvest after boxd_ensure proves what the session
/// holds, names the prompt that never ran, and the work drops (it stayed NOT_PROVEN for
/// ever: the made-again state says "no" to every prompt the lost one admitted).
#[test]
fn a_state_lost_with_a_prompt_waiting_proves_what_ran_names_what_never_ran_and_drops() {
    let world = World::new("lost-waiting");
    world.ok_call("boxd_ensure", W1);
    let ran = world.ok_call("boxd_submit", &json!({ "work": "w1", "prompt": bash("sleep 20") }).to_string());
    let waiting = world.ok_call("boxd_submit", &json!({ "work": "w1", "prompt": "then say done" }).to_string());
    let (ran, waiting) = (ran["promptId"].as_str().unwrap().to_string(), waiting["promptId"].as_str().unwrap().to_string());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while world.ok_call("boxd_job", W1)["state"] != "busy" {
        assert!(std::time::Instant::now() < deadline, "the first prompt never started");
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    in_tree(&world, "w1", "s=~/.boxd-helper/works/w1; for i in 1 2 3 4 5; do rm -rf $s 2>/dev/null && break; sleep 0.2; done; test ! -e $s");
    world.err_call("boxd_job", W1, "GUEST_STATE_LOST");
    world.ok_call("boxd_ensure", W1);
    let h = world.ok_call("boxd_harvest", W1);
    assert_eq!(h["sessions"].as_array().map(Vec::len), Some(1), "{h:#}");
    let status = world.ok_call("boxd_status", "{}");
    let row = status["works"].as_array().unwrap().iter().find(|r| r["work"] == "w1").unwrap().clone();
    assert_eq!(row["proven"], true, "{row:#}");
    let warnings = row["warnings"].to_string();
    assert!(warnings.contains(&waiting) && warnings.contains("never ran") && !warnings.contains(&ran), "{row:#}");
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], true);
}
