//! The laptop and the world change between calls, and names are used again: what a work
//! made stays named and reachable through every such change.

use serde_json::Value;

use crate::common::*;
use crate::harvest::{bash, run_on};
use crate::nothing_lost::git;

const W1: &str = r#"{"work":"w1"}"#;

fn record(world: &World) -> Value {
    serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap()).unwrap()
}

/// A machine lost after a harvest and rebuilt by boxd_resume starts from a new work tree,
/// which the next harvest records. The gone tree's commits and uncommitted changes stay
/// named: in the record (`earlierGit`), in a warning boxd_status shows, and in the drop's
/// answer. (Before, the next harvest's record named only the new tree's bundle, and the
/// drop said the work's commits were there: the gone tree's bundle and patch were files no
/// record named.)
#[test]
fn a_rebuild_keeps_the_gone_trees_commits_and_changes_named_through_the_drop() {
    let world = World::new("changed-rebuild");
    world.ok_call("boxd_ensure", W1);
    run_on(&world, "w1", &format!("commit {}", bash("echo before-loss > OLD.md && git add OLD.md && git commit -qm old && echo wip > WIP.md && git add WIP.md")));
    let first = world.ok_call("boxd_harvest", W1);
    let (bundle, patch) = (first["git"]["bundle"].as_str().unwrap().to_string(), first["git"]["patch"].as_str().unwrap().to_string());
    assert!(world.laptop.boxd(&["machine", "remove", "oc-w1", "-y"]).status.success());
    assert_eq!(world.ok_call("boxd_resume", W1)["action"], "rebuilt");
    let status = world.ok_call("boxd_status", "{}");
    let warnings = status["works"][0]["warnings"].to_string();
    assert!(warnings.contains(&bundle) && warnings.contains(&patch), "status names where the gone tree went: {status:#}");
    run_on(&world, "w1", &format!("again {}", bash("echo after > NEW.md && git add NEW.md && git commit -qm new")));
    let second = world.ok_call("boxd_harvest", W1);
    assert_ne!(second["git"]["bundle"].as_str(), Some(bundle.as_str()), "{second:#}");
    let r = record(&world);
    assert_eq!((r["earlierGit"][0]["bundle"].as_str(), r["earlierGit"][0]["patch"].as_str()), (Some(bundle.as_str()), Some(patch.as_str())), "{:#}", r["earlierGit"]);
    let dropped = world.ok_call("boxd_drop", W1);
    assert_eq!(dropped["dropped"], true, "{dropped:#}");
    assert_eq!(dropped["earlierGit"][0]["bundle"].as_str(), Some(bundle.as_str()), "{dropped:#}");
    assert!(dropped["next"].as_str().unwrap().contains("earlierGit"), "{dropped:#}");
    // What the drop names holds the gone tree: its commit and its uncommitted change.
    let dir = world.laptop.ledger.join("works/w1");
    let clone = world.laptop.scratch.path("clone");
    git(&clone, &["init", "-q"]);
    git(&clone, &["fetch", "-q", dir.join(&bundle).to_str().unwrap(), "HEAD:refs/heads/gone"]);
    assert_eq!(git(&clone, &["show", "gone:OLD.md"]), "before-loss\n");
    assert!(std::fs::read_to_string(dir.join(&patch)).unwrap().contains("+wip"), "the patch holds the staged change");
}

/// After a harvest the user deletes the session in the laptop's OpenCode, and then the
/// machine goes (boxd lost it). The drop closes the work as a gone one, and, as a drop of a
/// live machine does, imports the proven session again from the ledger's export first and
/// says so (before: it closed saying only that nothing was unrecovered, and the transcript
/// was in no OpenCode).
#[test]
fn a_gone_works_drop_puts_the_deleted_proven_session_back_on_the_laptop() {
    let world = World::new("changed-gone-deleted");
    world.ok_call("boxd_ensure", W1);
    run_on(&world, "w1", "marker-gone-deleted");
    let sid = world.ok_call("boxd_harvest", W1)["sessions"][0]["id"].as_str().unwrap().to_string();
    let before = crate::harvest::laptop_export(&world, &sid)["messages"].to_string();
    let opencode = |args: &[&str]| std::process::Command::new(opencode_bin()).args(args).current_dir(&world.laptop.project).envs(world.laptop_env()).output().unwrap();
    assert!(opencode(&["session", "delete", &sid]).status.success());
    assert!(!opencode(&["export", &sid]).status.success(), "the laptop's copy is deleted");
    assert!(world.laptop.boxd(&["machine", "remove", "oc-w1", "-y"]).status.success());
    let v = world.ok_call("boxd_drop", W1);
    assert_eq!((v["dropped"].as_bool(), v["machineWasGone"].as_bool()), (Some(true), Some(true)), "{v:#}");
    assert_eq!(v["restoredToLaptop"], serde_json::json!([sid]), "{v:#}");
    assert_eq!(crate::harvest::laptop_export(&world, &sid)["messages"].to_string(), before, "the transcript is back as it was proven");
}

/// A work's record removed by hand while its machine runs: boxd_status names the work, its
/// machine and what to put back (before: the work vanished from status while its machine
/// billed and held what the work made, and no tool could reach it). With the record put
/// back, the work goes on.
#[test]
fn a_record_removed_by_hand_while_its_machine_runs_is_named_by_status() {
    let world = World::new("changed-record-gone");
    world.ok_call("boxd_ensure", W1);
    let record = world.laptop.ledger.join("works/w1/work.json");
    let saved = std::fs::read(&record).unwrap();
    std::fs::remove_file(&record).unwrap();
    let status = world.ok_call("boxd_status", "{}");
    let row = &status["works"][0];
    assert_eq!((row["work"].as_str(), row["machine"].as_str(), row["error"].as_str()), (Some("w1"), Some("oc-w1"), Some("LEDGER_FAILED")), "{status:#}");
    assert!(row["next"].as_str().unwrap().contains("work.json back"), "{row:#}");
    std::fs::write(&record, saved).unwrap();
    let status = world.ok_call("boxd_status", "{}");
    assert_eq!((status["works"][0]["state"].as_str(), status["works"][0].get("error")), (Some("running"), None), "{status:#}");
    world.ok_call("boxd_harvest", W1);
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], true);
}

/// A file harvested home counts as recovered only while the laptop holds it: the user
/// removed the harvested copy (a `git clean`, a move), and the drop refused, naming it,
/// where it had destroyed its only bytes with the machine. A harvest brings it home again,
/// and then the drop goes on.
#[test]
fn a_harvested_file_gone_from_the_laptop_keeps_the_machine_until_it_is_home_again() {
    let world = World::new("changed-file-gone");
    world.ok_call("boxd_ensure", W1);
    run_on(&world, "w1", &bash("echo 'only here' > RESULT.md"));
    world.ok_call("boxd_harvest", r#"{"work":"w1","files":["RESULT.md"],"to":"r2"}"#);
    let copy = world.laptop.project.join("r2/RESULT.md");
    assert_eq!(std::fs::read_to_string(&copy).unwrap(), "only here\n");
    std::fs::remove_dir_all(world.laptop.project.join("r2")).unwrap();
    let e = world.err_call("boxd_drop", W1, "UNTRACKED");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("RESULT.md (was ") && message.contains("r2/RESULT.md"), "{e:#}");
    assert!(e["next"].as_str().unwrap().contains("boxd_harvest"), "{e:#}");
    assert_eq!(world.ok_call("boxd_job", W1)["state"], "idle", "the machine is still there");
    world.ok_call("boxd_harvest", r#"{"work":"w1","files":["RESULT.md"],"to":"r2"}"#);
    assert_eq!(std::fs::read_to_string(&copy).unwrap(), "only here\n", "home again");
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], true);
}

/// What the agent wrote on the machine since the last harvest is never replaced by a
/// submit's file: the submit is FILE_CONFLICT, nothing placed and no prompt left recorded
/// (one left behind held the drop for ten minutes). Before, the file was replaced and the
/// drop then counted it as sent. Bytes the laptop holds there (harvested), and a committed
/// file, are replaced as before.
#[test]
fn a_submit_never_replaces_what_the_agent_wrote_since_the_last_harvest() {
    let world = World::new("changed-submit-over");
    world.ok_call("boxd_ensure", W1);
    run_on(&world, "w1", &bash("echo 'v1' > tracked.txt && git add tracked.txt && git -c user.email=t@t -c user.name=t commit -qm t && echo 'only here' > results.csv"));
    std::fs::write(world.laptop.project.join("input.md"), "mine\n").unwrap();
    let over = |to: &str| serde_json::json!({ "work": "w1", "prompt": format!("use {to}"), "files": [{ "from": "input.md", "to": to }] }).to_string();
    let e = world.err_call("boxd_submit", &over("results.csv"), "FILE_CONFLICT");
    assert!(e["message"].as_str().unwrap().contains("results.csv") && e["next"].as_str().unwrap().contains("boxd_harvest"), "{e:#}");
    assert_eq!(crate::nothing_lost::in_tree(&world, "w1", "cat results.csv"), "only here\n", "the agent's bytes are as they were");
    assert_eq!(record(&world)["prompts"].as_array().unwrap().len(), 1, "the refused prompt left the record: {:#}", record(&world));
    // A committed file: its commit holds the bytes, so it is replaced.
    world.ok_call("boxd_submit", &over("tracked.txt"));
    world.job_until_idle("w1");
    assert_eq!(crate::nothing_lost::in_tree(&world, "w1", "cat tracked.txt"), "mine\n");
    // Once harvested, the laptop holds the agent's bytes: replaced too, and the drop goes on.
    world.ok_call("boxd_harvest", r#"{"work":"w1","files":["results.csv"],"to":"kept"}"#);
    world.ok_call("boxd_submit", &over("results.csv"));
    world.job_until_idle("w1");
    assert_eq!(crate::nothing_lost::in_tree(&world, "w1", "cat results.csv"), "mine\n");
    assert_eq!(std::fs::read_to_string(world.laptop.project.join("kept/results.csv")).unwrap(), "only here\n");
    world.ok_call("boxd_harvest", W1);
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], true);
}

/// A version staged apart from its file (`git add`, then the file changed again) is in no
/// commit and not in the patch (`git diff HEAD` holds the file's): the drop refuses it as
/// DIRTY, naming it, where it dropped and lost it. Staged again, it comes home and drops.
#[test]
fn a_version_staged_apart_from_its_file_keeps_the_machine() {
    let world = World::new("changed-staged-apart");
    world.ok_call("boxd_ensure", W1);
    let commit = "git add f.txt && git -c user.email=t@t -c user.name=t commit -qm one";
    run_on(&world, "w1", &bash(&format!("echo v1 > f.txt && {commit} && echo 'v2, staged' > f.txt && git add f.txt && echo v3 > f.txt")));
    world.ok_call("boxd_harvest", W1);
    let e = world.err_call("boxd_drop", W1, "DIRTY");
    assert!(e["message"].as_str().unwrap().contains("staged versions") && e["message"].as_str().unwrap().contains("f.txt"), "{e:#}");
    crate::nothing_lost::in_tree(&world, "w1", "git add f.txt");
    world.ok_call("boxd_harvest", W1);
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], true);
}

/// A harvest naming a file the work tree does not hold is NAME_INVALID, and the path is
/// not owed: the drop refused over it, naming a harvest that could never bring it home.
#[test]
fn a_file_the_work_tree_does_not_hold_is_not_owed() {
    let world = World::new("changed-missing-file");
    world.ok_call("boxd_ensure", W1);
    let e = world.err_call("boxd_harvest", r#"{"work":"w1","files":["nope.txt"]}"#, "NAME_INVALID");
    assert!(e["message"].as_str().unwrap().contains("nope.txt does not exist"), "{e:#}");
    assert!(e["next"].as_str().unwrap().contains("git.untracked lists the new ones"), "not about work ids: {e:#}");
    assert_eq!(record(&world)["owed"], serde_json::json!([]), "{:#}", record(&world));
    // A symbolic link on the machine is refused there: mended there, not in allowedRoots.
    assert!(world.on_machine("oc-w1", "cd work/w1 && ln -s /etc/passwd link").status.success());
    let e = world.err_call("boxd_harvest", r#"{"work":"w1","files":["link"]}"#, "PATH_REFUSED");
    let next = e["next"].as_str().unwrap();
    assert!(next.contains("Leave link out of files") && !next.contains("allowedRoots"), "{e:#}");
    world.ok_call("boxd_harvest", W1);
    // Still asked for: the drop names it, and discarding it by name is the way out.
    world.err_call("boxd_drop", W1, "UNTRACKED");
    assert_eq!(world.ok_call("boxd_drop", r#"{"work":"w1","discard":["link"]}"#)["dropped"], true);
}

/// A submit killed before its exec reached the guest leaves its prompt recorded and unheard
/// for 10 minutes: a harvest meanwhile is not proven, and its next step says which prompt
/// and why (it said the transcript was proven, while boxd_drop refused as NOT_PROVEN).
#[test]
fn a_harvest_that_proves_not_every_prompt_says_which_and_why() {
    let world = World::new("changed-unheard");
    world.ok_call("boxd_ensure", W1);
    // The submit's spawns: the machine's state, then the guest's exec.
    assert!(world.killed_at("before-spawn:2", "boxd_submit", r#"{"work":"w1","prompt":"never sent"}"#));
    let h = world.ok_call("boxd_harvest", W1);
    assert_eq!(h["proven"], false, "{h:#}");
    let next = h["next"].as_str().unwrap();
    assert!(next.contains("not in this proof yet") && !next.contains("The transcript is proven"), "{h:#}");
    let id = record(&world)["prompts"][0]["id"].as_str().unwrap().to_string();
    assert!(next.contains(&id), "{h:#}");
    world.err_call("boxd_drop", W1, "NOT_PROVEN");
}
