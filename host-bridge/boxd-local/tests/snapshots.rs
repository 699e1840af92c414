//! Snapshots: versions are immutable, restore into new machines, list/remove shapes, and
//! the running-only rule.

mod common;
use common::*;
use serde_json::json;

#[test]
fn versions_are_immutable_and_restore() {
    let h = Home::new("snap");
    h.ok(&["machine", "new", "base", "--isolated"]);
    h.ok(&["machine", "exec", "base", "--", "mkdir -p proj && echo one > proj/a && echo keep > b"]);
    let r = h.ok(&["snapshots", "save", "base", "golden"]);
    assert_eq!(r.out, "", "save prints nothing");
    let v1 = h.dir.join("snapshots/golden/v1/home");
    assert_eq!(std::fs::read_to_string(v1.join("proj/a")).unwrap(), "one\n");

    // Change the machine, save again: v2; v1 is untouched.
    h.ok(&["machine", "exec", "base", "--", "echo two > proj/a && rm b && echo new > c"]);
    let saved = h.json(&["snapshots", "save", "base", "golden"]);
    assert_eq!(saved["version"], "v2");
    assert_eq!(std::fs::read_to_string(v1.join("proj/a")).unwrap(), "one\n");
    assert!(v1.join("b").exists() && !v1.join("c").exists());

    let list = h.json(&["snapshots", "list"]);
    assert_eq!(list.as_array().unwrap().len(), 1);
    let row = &list[0];
    assert_shape(row, &[("name", "string"), ("version", "string"), ("status", "string"), ("size", "string"), ("used", "string")]);
    assert_eq!((row["name"].as_str(), row["version"].as_str(), row["status"].as_str()), (Some("golden"), Some("v2"), Some("ready")));
    assert!(row["size"].as_str().unwrap().ends_with('B'), "{row}");

    // Restore takes the latest version, and the restored machine changes only itself.
    let m = h.json(&["machine", "new", "restored", "--from-snapshot", "golden"]);
    assert_eq!(m["source"], "snapshot/golden:v2");
    let got = h.json(&["machine", "get", "restored"]);
    assert_eq!((got["source"].as_str(), got["isolated"].as_str()), (Some("snapshot/golden:v2"), Some("yes")));
    assert_eq!(h.ok(&["exec", "restored", "--", "cat proj/a c"]).out, "two\nnew\n");
    h.ok(&["exec", "restored", "--", "echo three > proj/a"]);
    let v2 = h.dir.join("snapshots/golden/v2/home");
    assert_eq!(std::fs::read_to_string(v2.join("proj/a")).unwrap(), "two\n");
    assert_eq!(h.json(&["snapshots", "list"])[0]["used"], "1");

    assert_eq!(h.fails(&["machine", "new", "x", "--from-snapshot", "nope"]), "error: snapshot not found");
    assert!(h.fails(&["machine", "new", "x", "--from-snapshot", "golden", "--vcpu", "4"]).contains("--vcpu"));
}

/// A save killed mid-copy leaves a version with no meta.json: listed `failed`, never
/// `pending` (no save is under way while the listing holds the lock), and the next save
/// takes the next number.
#[test]
fn a_killed_save_is_listed_failed() {
    let h = Home::new("snap-killed");
    h.ok(&["machine", "new", "m"]);
    std::fs::create_dir_all(h.dir.join("snapshots/img/v1/home")).unwrap();
    let row = &h.json(&["snapshots", "list"])[0];
    assert_eq!((row["name"].as_str(), row["version"].as_str(), row["status"].as_str()), (Some("img"), Some("v1"), Some("failed")));
    assert_eq!(h.json(&["snapshots", "save", "m", "img"])["version"], "v2");
    assert_eq!(h.json(&["snapshots", "list"])[0]["status"], "ready");
}

#[test]
fn save_needs_a_running_machine() {
    let h = Home::new("snap-state");
    h.ok(&["machine", "new", "m"]);
    h.ok(&["machine", "hibernate", "m"]);
    assert_eq!(h.fails(&["snapshots", "save", "m", "s"]), "error: vm is 'hibernated' — must be running to snapshot");
    h.ok(&["machine", "wake", "m"]);
    h.ok(&["machine", "pause", "m"]);
    assert_eq!(h.fails(&["snapshots", "save", "m", "s"]), "error: vm is 'standby' — must be running to snapshot");
    assert_eq!(h.fails(&["snapshots", "save", "nope", "s"]), "error: VM 'nope' not found");
    assert!(h.fails(&["snapshots", "save", "m", "Bad Name"]).contains("invalid snapshot name"));
}

#[test]
fn remove_snapshot() {
    let h = Home::new("snap-rm");
    h.ok(&["machine", "new", "m"]);
    h.ok(&["snapshots", "save", "m", "s1"]);
    h.ok(&["snapshots", "save", "m", "s1"]);
    assert!(h.fails(&["snapshots", "remove", "s1"]).contains("without -y"));
    assert_eq!(h.json(&["snapshots", "remove", "s1", "-y"]), json!({"name": "s1", "status": "removed"}));
    assert_eq!(h.json(&["snapshots", "list"]), json!([]));
    assert_eq!(h.fails(&["snapshots", "remove", "s1", "-y"]), "error: snapshot not found");
    // A machine restored from a snapshot outlives it.
    h.ok(&["snapshots", "save", "m", "s2"]);
    h.ok(&["machine", "new", "child", "--from-snapshot", "s2"]);
    h.ok(&["snapshots", "remove", "s2", "-y"]);
    assert_eq!(h.status("child"), "running");
}
