//! A harvest asks the laptop's `opencode export` whether it already holds each session id
//! new to the work, before it imports: the user's own session must never receive the
//! guest's messages. A drop asks the same of each proven session before it puts one back.
//! Only OpenCode's own "Session not found" is an absence; a lookup that fails any other way
//! (a locked database, a crash), three runs in a row, imports nothing. Until 2026-12-05
//! every failed lookup read as an absence, and a run of the whole suite under load once
//! imported a guest's lie into the user's session that way.

use std::path::{Path, PathBuf};

use crate::common::*;
use crate::world_lies::{export_lie, laptop_copy, users_own_session, LIE_HEAD, LIE_TAIL};

const W1: &str = r#"{"work":"w1"}"#;

/// A laptop `opencode` whose `export` fails as a locked database makes it fail; every other
/// command is the real one's. Each command's first word goes to `dir`/opencode-commands.
fn export_fails(dir: &Path) -> PathBuf {
    let path = dir.join("opencode-export-fails");
    let script = format!(
        "#!/bin/sh\necho \"$1\" >> '{}'\nif [ \"$1\" = export ]; then echo 'Error: database is locked' >&2; exit 1; fi\nexec '{}' \"$@\"\n",
        dir.join("opencode-commands").display(),
        opencode_bin().display()
    );
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

/// A world whose work w1 ran one prompt and was harvested, and its session's id.
fn harvested(name: &str) -> (World, String) {
    let world = World::new(name);
    world.ok_call("boxd_ensure", W1);
    world.ok_call("boxd_submit", r#"{"work":"w1","prompt":"hello"}"#);
    assert_eq!(world.job_until_idle("w1")["outcome"], "completed");
    let id = world.ok_call("boxd_harvest", W1)["sessions"][0]["id"].as_str().unwrap().to_string();
    (world, id)
}

/// `boxd-host call TOOL` for w1 with `opencode` as the laptop's OpenCode (its last
/// `--opencode` wins over the pinned one `call_with` names).
fn call_as(world: &World, opencode: &Path, tool: &str) -> (i32, serde_json::Value) {
    world.call_with(&["--opencode", opencode.to_str().unwrap()], tool, W1)
}

#[test]
fn a_lookup_the_laptops_opencode_cannot_answer_imports_nothing_into_the_users_session() {
    let world = World::new("lookup-fails");
    let (users, other) = users_own_session(&world);
    let before = laptop_copy(&world, &other, &users).unwrap();
    world.ok_call("boxd_ensure", W1);
    world.ok_call("boxd_submit", r#"{"work":"w1","prompt":"hello"}"#);
    assert_eq!(world.job_until_idle("w1")["outcome"], "completed");
    // The guest exports its session under the id of the user's own.
    let take_over = format!(
        "{LIE_HEAD}root[\"info\"][\"id\"] = \"{users}\"\nfor m in root[\"messages\"]:\n    m[\"info\"][\"sessionID\"] = \"{users}\"\n    for p in m[\"parts\"]: p[\"sessionID\"] = \"{users}\"\n{LIE_TAIL}"
    );
    export_lie(&world, "oc-w1", "w1", Some(&take_over));

    let (code, v) = call_as(&world, &export_fails(&world.laptop.scratch.0), "boxd_harvest");
    assert_eq!((code, v["error"].as_str()), (1, Some("IMPORT_FAILED")), "{v:#}");
    let message = v["message"].as_str().unwrap();
    assert!(message.contains(&users) && message.contains("database is locked") && message.contains("nothing was imported"), "{v:#}");
    assert_eq!(laptop_copy(&world, &other, &users).unwrap(), before, "the user's session is as it was, in its own folder");

    // Once the laptop's OpenCode answers, the same export is refused as the user's own.
    let v = world.err_call("boxd_harvest", W1, "EXPORT_INVALID");
    assert!(v["message"].as_str().unwrap().contains("already holds"), "{v:#}");
    assert_eq!(laptop_copy(&world, &other, &users).unwrap(), before);
}

/// Messages the user reverted on the laptop after a harvest are theirs to remove: a drop
/// leaves a proven session the laptop holds as it is, and puts back only one OpenCode says
/// it has none of. A lookup that fails (three runs of a locked database) stops the drop with
/// nothing imported and nothing destroyed; before, it read as "gone" and the drop imported
/// the reverted messages back.
#[test]
fn a_drop_whose_lookup_fails_puts_nothing_back_and_destroys_nothing() {
    let (world, id) = harvested("drop-lookup-fails");
    let proven = crate::harvest::laptop_export(&world, &id)["messages"].as_array().unwrap().len() as u64;
    // The user reverts the session's last message on the laptop (as OpenCode's revert
    // removes it: the message and its parts).
    let db = world.home.join("data/opencode/opencode.db");
    let revert = "import sqlite3, sys\nc = sqlite3.connect(sys.argv[1])\nm = c.execute('select id from message where session_id = ? order by time_created desc, id desc limit 1', (sys.argv[2],)).fetchone()[0]\nc.execute('delete from part where message_id = ?', (m,))\nc.execute('delete from message where id = ?', (m,))\nc.commit()\n";
    let out = std::process::Command::new("python3").args(["-c", revert, db.to_str().unwrap(), &id]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reverted = crate::harvest::laptop_export(&world, &id)["messages"].as_array().unwrap().len() as u64;
    assert_eq!(reverted, proven - 1, "the revert took");

    let (code, v) = call_as(&world, &export_fails(&world.laptop.scratch.0), "boxd_drop");
    assert_eq!((code, v["error"].as_str()), (1, Some("IMPORT_FAILED")), "{v:#}");
    assert!(v["message"].as_str().unwrap().contains(&id) && v["next"].as_str().unwrap().contains("boxd_drop"), "{v:#}");
    let ran = std::fs::read_to_string(world.laptop.scratch.0.join("opencode-commands")).unwrap();
    assert_eq!(ran.lines().filter(|c| *c == "export").count(), 3, "the lookup ran three times: {ran}");
    assert!(!ran.lines().any(|c| c == "import"), "nothing was imported: {ran}");
    assert_eq!(world.ok_call("boxd_job", W1)["state"], "idle", "nothing was destroyed");

    // With the laptop's OpenCode answering, the session is there: left as the user left it.
    let v = world.ok_call("boxd_drop", W1);
    assert_eq!(v["dropped"], true, "{v:#}");
    assert!(v.get("restoredToLaptop").is_none(), "{v:#}");
    assert_eq!(crate::harvest::laptop_export(&world, &id)["messages"].as_array().unwrap().len() as u64, proven - 1);
}

/// A drop puts back a session the user deleted on the laptop, and the host is killed in the
/// middle of that import (a wrapper imports all but the last message, then SIGKILLs the
/// host). The next drop finds a copy, but the ledger's mark says the restore was cut short:
/// it imports again, and the machine goes only once the laptop holds every proven message.
/// Without the mark, that partial copy read as the user's own and the drop destroyed the
/// machine with messages missing on the laptop.
#[test]
fn a_restore_the_host_was_killed_in_is_finished_by_the_next_drop() {
    let (world, id) = harvested("restore-cut-short");
    let proven = crate::harvest::laptop_export(&world, &id)["messages"].clone();
    crate::harvest::delete_laptop_session(&world, &id);

    let dir = &world.laptop.scratch.0;
    let cut = dir.join("opencode-import-cut-short");
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = import ]; then\n  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d[\"messages\"].pop(); json.dump(d, open(sys.argv[2], \"w\"))' \"$2\" '{partial}'\n  '{real}' import '{partial}' >&2\n  kill -9 $PPID\n  exit 1\nfi\nexec '{real}' \"$@\"\n",
        partial = dir.join("partial.json").display(),
        real = opencode_bin().display()
    );
    std::fs::write(&cut, script).unwrap();
    std::fs::set_permissions(&cut, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = world.host_call(&["--opencode", cut.to_str().unwrap()], "boxd_drop", W1, &[]);
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&out.status), Some(9), "{}", String::from_utf8_lossy(&out.stdout));
    let partial = crate::harvest::laptop_export(&world, &id)["messages"].as_array().unwrap().len();
    assert_eq!(partial, proven.as_array().unwrap().len() - 1, "the import was cut short");
    assert!(world.laptop.boxd(&["machine", "get", "oc-w1", "--json"]).status.success(), "the killed drop destroyed nothing");

    let v = world.ok_call("boxd_drop", W1);
    assert_eq!((&v["dropped"], &v["restoredToLaptop"]), (&serde_json::json!(true), &serde_json::json!([id])), "{v:#}");
    assert_eq!(crate::harvest::laptop_export(&world, &id)["messages"], proven, "every proven message is on the laptop");
}
