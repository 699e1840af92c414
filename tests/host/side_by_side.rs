//! `run-all`: several children side by side, each checked, refused, run and audited as
//! `run` would, the answers in request order. boxd_status asks its two listings this way.
//! The proof that they really run at once: a fake `boxd` whose two listings each wait for
//! the other to start, which one after the other can never answer.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use boxd_host::policy::Policy;

use crate::common::*;

/// A `boxd` whose `machine list` and `snapshots list` each mark that they started, then
/// wait (2 to 3 s by the clock, well inside the probe's 5 s timeout even on a loaded
/// machine) for the other's mark before answering.
fn rendezvous_boxd(dir: &Path) -> PathBuf {
    let script = dir.join("boxd");
    let body = format!(
        r#"#!/bin/sh
dir='{dir}'
case "$1 $2" in
  "machine list") me=list; other=snapshots; out='[]' ;;
  "snapshots list") me=snapshots; other=list; out='[{{"name":"opencode-golden","version":"v1","status":"ready"}}]' ;;
  *) echo "error: unexpected boxd $*" >&2; exit 2 ;;
esac
: > "$dir/$me"
end=$(( $(date +%s) + 3 ))
while [ ! -e "$dir/$other" ]; do
  if [ "$(date +%s)" -ge "$end" ]; then echo "error: $me ran alone" >&2; exit 1; fi
  /bin/sleep 0.05
done
echo "$out"
"#,
        dir = dir.display()
    );
    std::fs::write(&script, body).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    script
}

fn argvs(batch: &[&[&str]]) -> String {
    serde_json::json!({ "argvs": batch }).to_string()
}

#[test]
fn run_all_refuses_only_the_request_it_must_and_answers_in_request_order() {
    let s = Scratch::new("run-all-order");
    let mut policy = Policy::new();
    policy.program("boxd", Path::new("/bin/true")).unwrap().program("opencode", Path::new("/bin/false")).unwrap();
    policy.preopen(&s.0, "project").unwrap();
    let rt = probe(policy);
    let batch: &[&[&str]] = &[&["boxd", "machine", "list", "--json"], &["boxd", "auth", "logout"], &["sh"], &["opencode", "--version"]];
    let (result, trace) = rt.call("spawn-all", &argvs(batch), &boxd_host::runtime::CallContext::default()).unwrap();
    let answer = result.unwrap_or_else(|e| panic!("{}: {}", e.code, e.message));
    let lines: Vec<&str> = answer.lines().collect();
    assert_eq!(lines.len(), 4, "{answer}");
    assert_eq!(lines[0], "ok exit=Some(0)");
    assert!(lines[1].starts_with("not-allowed: ") && lines[1].contains("the nearest, boxd account"), "{}", lines[1]);
    assert!(lines[2].starts_with("not-allowed: "), "{}", lines[2]);
    assert_eq!(lines[3], "ok exit=Some(1)", "the refusals stopped nothing else");
    // The audit's trace: one record per request, in order, each with the grant it matched.
    let seen: Vec<(String, Option<String>, String)> = trace.spawns.iter().map(|r| (r.program.clone(), r.grant.clone(), r.outcome.clone())).collect();
    assert_eq!(
        seen,
        [
            ("boxd".to_string(), Some("boxd machine-list".to_string()), "exited".to_string()),
            ("boxd".into(), None, "not-allowed".into()),
            ("sh".into(), None, "not-allowed".into()),
            ("opencode".into(), Some("opencode version".into()), "exited".into()),
        ]
    );
}

/// More requests than policy.json's `runAll.maxRequests`: the batch is refused whole and
/// no child starts.
#[test]
fn a_batch_over_the_bound_runs_nothing() {
    let s = Scratch::new("run-all-bound");
    let marker = s.0.join("ran");
    let script = s.0.join("boxd");
    std::fs::write(&script, format!("#!/bin/sh\n: > '{}'\necho '[]'\n", marker.display())).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut policy = Policy::new();
    policy.program("boxd", &script).unwrap();
    policy.preopen(&s.0, "project").unwrap();
    let rt = probe(policy);
    let max = boxd_host::policy::run_all_max();
    let listing: &[&str] = &["boxd", "machine", "list", "--json"];
    let answer = ask(&rt, "spawn-all", &argvs(&vec![listing; max + 1]));
    assert_eq!(answer.lines().count(), max + 1, "{answer}");
    for line in answer.lines() {
        assert!(line.starts_with(&format!("failed: run-all takes at most {max} requests")) && line.ends_with("so none ran"), "{line}");
    }
    assert!(!marker.exists(), "a child of a refused batch ran");
    // At the bound, all run.
    assert_eq!(ask(&rt, "spawn-all", &argvs(&vec![listing; max])), vec!["ok exit=Some(0)"; max].join("\n"));
    assert!(marker.exists());
}

#[test]
fn run_all_runs_its_children_at_once() {
    let s = Scratch::new("run-all-at-once");
    let mut policy = Policy::new();
    policy.program("boxd", &rendezvous_boxd(&s.0)).unwrap();
    policy.preopen(&s.0, "project").unwrap();
    let rt = probe(policy);
    let batch: &[&[&str]] = &[&["boxd", "machine", "list", "--json"], &["boxd", "snapshots", "list", "--json"]];
    assert_eq!(ask(&rt, "spawn-all", &argvs(batch)), "ok exit=Some(0)\nok exit=Some(0)");
    // One at a time, the first waits for a listing that has not started, and gives up.
    std::fs::remove_file(s.0.join("list")).unwrap();
    std::fs::remove_file(s.0.join("snapshots")).unwrap();
    assert_eq!(ask(&rt, "spawn", r#"{"argv":["boxd","machine","list","--json"]}"#), "ok exit=Some(1)");
}

/// The real component and the real boxd-host binary: boxd_status answers only because its
/// two listings run at once. A kill point before the second child is checked fires before
/// either has started (docs/architecture.md, "Kill points").
#[test]
fn boxd_status_asks_its_two_listings_at_once() {
    let laptop = Laptop::new("status-at-once");
    std::fs::create_dir_all(&laptop.project).unwrap();
    let marks = laptop.scratch.path("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let boxd = rendezvous_boxd(&marks);
    let status = |env: &[(&str, &str)]| {
        let mut cmd = Command::new(boxd_host());
        cmd.arg("--project").arg(&laptop.project).arg("--ledger").arg(&laptop.ledger).arg("--boxd").arg(&boxd);
        cmd.args(["call", "boxd_status", "{}"]).env("BOXD_HOST_CACHE", cache_dir());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let out = status(&[]);
    let v = stdout_json(&out);
    assert_eq!((v["boxd"]["cli"].as_str(), v["snapshot"]["present"].as_bool()), (Some("signed in"), Some(true)), "{v:#}");
    assert_eq!(v["boxd"]["calls"], 2);

    std::fs::remove_file(marks.join("list")).unwrap();
    std::fs::remove_file(marks.join("snapshots")).unwrap();
    let out = status(&[("BOXD_HOST_KILL_AT", "before-spawn:2")]);
    assert_eq!(out.status.signal(), Some(9), "{out:?}");
    assert!(!marks.join("list").exists() && !marks.join("snapshots").exists(), "a child started before the batch was checked");
}

/// Processes whose environment names this boxd-local home and whose arguments hold `args`
/// in a row (so another test's calls at the same time do not count).
fn boxd_children(home: &Path, args: &[&str]) -> usize {
    let home = format!("BOXD_LOCAL_HOME={}", home.display());
    let want: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    std::fs::read_dir("/proc").into_iter().flatten().flatten().filter(|p| {
        let env = std::fs::read(p.path().join("environ")).unwrap_or_default();
        let argv = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        let argv: Vec<&[u8]> = argv.split(|b| *b == 0).collect();
        env.split(|b| *b == 0).any(|e| e == home.as_bytes()) && argv.windows(want.len()).any(|w| w == want.as_slice())
    }).count()
}

/// A status whose two listings meet `faults` (one hangs, the other fails), called with a
/// 5 s boxd bound. What holds whichever listing hangs: the call answers at the bound (not
/// when the hang would end), exits 0 (status still reads the ledger), leaves no child of the
/// batch running, and says the golden image is unknown, not absent. Returns the world, the
/// call's start (ms since the epoch, as boxd-local's call log writes it) and the answer.
fn status_under(name: &str, faults: &str) -> (World, u64, serde_json::Value) {
    let world = World::new(name);
    world.faults(faults);
    let started_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let started = std::time::Instant::now();
    let out = world.call_output(&["--options", r#"{"boxdTimeoutSeconds":5}"#], "boxd_status", "{}");
    let took = started.elapsed();
    let v = stdout_json(&out);
    assert!(took < std::time::Duration::from_secs(120), "the hang was bounded: {took:?}");
    for listing in [["machine", "list"], ["snapshots", "list"]] {
        assert_eq!(boxd_children(&world.laptop.boxd_home, &listing), 0, "{listing:?} was ended with the call");
    }
    assert_eq!(out.status.code(), Some(0), "status still reads the ledger: {v:#}");
    // Unknown, not absent: an unanswered or failed listing must not read as "no golden image".
    assert!(v["snapshot"]["present"].is_null(), "{v:#}");
    (world, started_ms, v)
}

/// One listing fails at once and the other never ends: the answer names the failure.
#[test]
fn a_status_whose_one_listing_fails_while_the_other_hangs_answers_at_its_bound() {
    let (_world, _, v) = status_under("status-fail-hang", r#"[{"verb":"machine list","times":1,"action":"fail","message":"internal"},{"verb":"snapshots list","times":1,"action":"hang","ms":600000}]"#);
    assert!(v["boxd"]["reason"].as_str().is_some_and(|r| r.contains("machine list") && r.contains("internal")), "the answer names the listing's failure: {v:#}");
}

/// The same with the roles swapped: the batch's first listing (`machine list`, which runs
/// on the host's calling thread) never ends and the other fails at once. The other child is
/// not held behind the hang.
#[test]
fn a_status_whose_first_listing_hangs_while_the_other_fails_answers_at_its_bound() {
    let (world, started_ms, v) = status_under("status-hang-fail", r#"[{"verb":"machine list","times":1,"action":"hang","ms":600000},{"verb":"snapshots list","times":1,"action":"fail","message":"internal"}]"#);
    // The failing listing started before the hang's 5 s bound could have passed (run after
    // it, it would start at least 5 s after the call).
    let log = std::fs::read_to_string(world.laptop.boxd_home.join("calls.jsonl")).unwrap();
    let snapshots: Vec<serde_json::Value> = log.lines().map(|l| serde_json::from_str(l).unwrap()).filter(|l: &serde_json::Value| l["argv"][0] == "snapshots" && l["argv"][1] == "list").collect();
    assert_eq!(snapshots.len(), 1, "snapshots list ran once: {log}");
    let at = snapshots[0]["t"].as_u64().unwrap();
    assert!(at < started_ms + 5000, "snapshots list started {} ms after the call, behind the hang: {log}", at.saturating_sub(started_ms));
    assert!(v["boxd"]["reason"].as_str().is_some_and(|r| r.contains("machine list")), "the answer names the listing that did not answer: {v:#}");
}
