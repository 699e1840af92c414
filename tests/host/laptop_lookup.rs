//! A harvest asks the laptop's `opencode export` whether it already holds each session id
//! new to the work, before it imports: the user's own session must never receive the
//! guest's messages. Only OpenCode's own "Session not found" is an absence; a lookup that
//! fails any other way (a locked database, a crash) imports nothing. Until 2026-12-05 every
//! failed lookup read as an absence, and a run of the whole suite under load once imported
//! a guest's lie into the user's session that way.

use std::path::{Path, PathBuf};

use crate::common::*;
use crate::world_lies::{export_lie, laptop_copy, users_own_session, LIE_HEAD, LIE_TAIL};

const W1: &str = r#"{"work":"w1"}"#;

/// A laptop `opencode` whose `export` fails as a locked database makes it fail; every other
/// command is the real one's.
fn export_fails(dir: &Path) -> PathBuf {
    let path = dir.join("opencode-export-fails");
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = export ]; then echo 'Error: database is locked' >&2; exit 1; fi\nexec '{}' \"$@\"\n",
        opencode_bin().display()
    );
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

/// `boxd-host call boxd_harvest` with `opencode` as the laptop's OpenCode.
fn harvest_with(world: &World, opencode: &Path) -> (i32, serde_json::Value) {
    let real = opencode_bin();
    let mut env = world.laptop_env();
    env.push(("PATH".into(), format!("{}:{}", real.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default())));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = world.laptop.host_stdin(&["--opencode", opencode.to_str().unwrap(), "call", "boxd_harvest", W1], &env, None);
    (out.status.code().unwrap_or(-1), stdout_json(&out))
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

    let (code, v) = harvest_with(&world, &export_fails(&world.laptop.scratch.0));
    assert_eq!((code, v["error"].as_str()), (1, Some("IMPORT_FAILED")), "{v:#}");
    let message = v["message"].as_str().unwrap();
    assert!(message.contains(&users) && message.contains("database is locked") && message.contains("nothing was imported"), "{v:#}");
    assert_eq!(laptop_copy(&world, &other, &users).unwrap(), before, "the user's session is as it was, in its own folder");

    // Once the laptop's OpenCode answers, the same export is refused as the user's own.
    let v = world.err_call("boxd_harvest", W1, "EXPORT_INVALID");
    assert!(v["message"].as_str().unwrap().contains("already holds"), "{v:#}");
    assert_eq!(laptop_copy(&world, &other, &users).unwrap(), before);
}
