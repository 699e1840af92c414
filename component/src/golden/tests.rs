//! The golden build's unit tests: its spec, its cleanup of earlier builds, its save.

use super::*;

#[test]
fn a_spec_takes_defaults_and_refuses_what_would_reach_a_shell() {
    let s = Spec::parse(r#"{"snapshot":"opencode-golden"}"#).unwrap();
    assert_eq!((s.attempts, s.retry_delay_seconds, s.url.as_str()), (3, 5, DEFAULT_URL));
    assert_eq!(Spec::parse(r#"{"snapshot":"Bad Name"}"#).unwrap_err().code, Code::NameInvalid);
    assert_eq!(Spec::parse(r#"{"opencodeVersion":"1.0; rm -rf ~"}"#).unwrap_err().code, Code::ArgsInvalid);
    assert_eq!(Spec::parse(r#"{"keyEnv":["A B"]}"#).unwrap_err().code, Code::ArgsInvalid);
    assert_eq!(Spec::parse(r#"{"force":true}"#).unwrap_err().code, Code::ArgsInvalid);
    assert_eq!(Spec::parse(r#"{"attempts":0}"#).unwrap_err().code, Code::ArgsInvalid);
}

#[test]
fn a_literal_key_is_refused_wherever_it_sits() {
    assert!(check_config(r#"{"provider":{"x":{"options":{"apiKey":"{env:KEY}"}}}}"#).is_ok());
    let e = check_config(r#"{"provider":{"x":{"options":{"apiKey":"sk-123"}}}}"#).unwrap_err();
    assert!(e.message.contains("/provider/x/options/apiKey"), "{}", e.message);
    assert!(!e.message.contains("sk-123"));
    assert_eq!(check_config("not json").unwrap_err().code, Code::ArgsInvalid);
}

#[test]
fn the_script_quotes_the_url_and_checks_the_version() {
    let s = Spec::parse(r#"{"url":"http://h/v{version}/o-{target}.tgz'x"}"#).unwrap();
    let text = script(&s, "1.18.33");
    assert!(text.contains(r#"'http://h/v1.18.33/o-{target}.tgz'\''x'"#), "{text}");
    assert!(text.contains(r#"[ "$v" = 1.18.33 ]"#));
}

use crate::ledger::{BuildMachine, Ledger};
use crate::testing::{raw_context, MemFiles, Scripted};

const HOUR_MS: u64 = 3_600_000;

fn recorded(fs: &mut MemFiles, machine: &str, id: Option<&str>, started_at_ms: u64, ended: bool) {
    let m = BuildMachine { machine: machine.into(), id: id.map(Into::into), started_at_ms, ended };
    Ledger::new(fs, "/l").note_build_machine(&m).unwrap();
}

fn left(fs: &mut MemFiles) -> Vec<String> {
    Ledger::new(fs, "/l").build_machines().unwrap().into_iter().map(|m| m.machine).collect()
}

/// A build whose snapshot name is taken stops after the leftovers are dealt with, so
/// each case below runs only the cleanup (and the snapshot listing).
fn build_at(now_ms: u64, p: &mut Scripted, fs: &mut MemFiles) -> Vec<String> {
    p.push_exit(0, r#"[{"name":"opencode-golden"}]"#, "");
    let mut raw = raw_context("{}", "{}");
    raw.now_ms = now_ms;
    let ctx = crate::tools::context(raw).unwrap();
    let e = build(p, fs, &ctx, r#"{"opencodeVersion":"1.18.33"}"#).unwrap_err();
    assert_eq!(e.code, Code::SnapshotExists);
    p.commands()
}

#[test]
fn no_record_means_no_extra_boxd_call() {
    let (mut p, mut fs) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
    assert_eq!(build_at(10 * HOUR_MS, &mut p, &mut fs), ["snapshots list --json"]);
}

#[test]
fn an_abandoned_build_machine_is_removed_once_it_is_the_recorded_one() {
    let (mut p, mut fs) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
    recorded(&mut fs, "golden-build-aaaa", Some("vm_a"), 0, false);
    recorded(&mut fs, "golden-build-bbbb", None, 0, false); // killed before boxd answered
    p.push_exit(0, r#"{"name":"golden-build-aaaa","id":"vm_a","status":"running"}"#, "");
    p.push_exit(0, "{}", "");
    p.push_exit(0, r#"{"name":"golden-build-bbbb","id":"vm_b","status":"running"}"#, "");
    p.push_exit(0, "{}", "");
    let asked = build_at(10 * HOUR_MS, &mut p, &mut fs);
    assert_eq!(asked[..4], ["machine get golden-build-aaaa --json", "machine remove golden-build-aaaa -y --json", "machine get golden-build-bbbb --json", "machine remove golden-build-bbbb -y --json"]);
    assert!(left(&mut fs).is_empty());
}

#[test]
fn a_build_that_may_still_run_or_a_name_now_someone_else_s_is_left_alone() {
    let (mut p, mut fs) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
    recorded(&mut fs, "golden-build-beef", Some("vm_y"), 10 * HOUR_MS - 60_000, false);
    recorded(&mut fs, "golden-build-c0ffee", Some("vm_old"), 0, false);
    p.push_exit(0, r#"{"name":"golden-build-c0ffee","id":"vm_new","status":"running"}"#, "");
    let asked = build_at(10 * HOUR_MS, &mut p, &mut fs);
    // young: no call at all; c0ffee: only looked at, never removed.
    assert_eq!(asked, ["machine get golden-build-c0ffee --json", "snapshots list --json"]);
    assert_eq!(left(&mut fs), ["golden-build-beef"], "the other machine's record is forgotten");
}

#[test]
fn an_ended_build_s_machine_is_retried_at_once_and_a_gone_one_forgotten() {
    let (mut p, mut fs) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
    recorded(&mut fs, "golden-build-e0", Some("vm_e"), 10 * HOUR_MS - 1000, true);
    recorded(&mut fs, "golden-build-f0", Some("vm_f"), 0, false);
    p.push_exit(0, r#"{"name":"golden-build-e0","id":"vm_e","status":"running"}"#, "");
    p.push_fail(1, "error: remove failed");
    p.push_fail(1, "error: VM 'golden-build-f0' not found");
    let asked = build_at(10 * HOUR_MS, &mut p, &mut fs);
    assert_eq!(asked.len(), 4, "{asked:?}");
    assert_eq!(left(&mut fs), ["golden-build-e0"], "a failed remove keeps the record for the next build");
}

const MACHINE: &str = "golden-build-010101010101";

/// A build that runs to its save: no leftovers, the name free at the first look, the
/// build machine made and OpenCode installed. The caller scripts the rest.
fn to_the_second_look(p: &mut Scripted) {
    p.push_exit(0, "[]", "");
    p.push_exit(0, &alloc::format!(r#"{{"name":"{MACHINE}","id":"vm_b"}}"#), "");
    p.push_exit(0, "golden: OpenCode 1.18.33 installed after 1 attempt(s)\n", "");
}

fn run_build(p: &mut Scripted, fs: &mut MemFiles) -> ToolResult<Value> {
    let ctx = crate::tools::context(raw_context("{}", "{}")).unwrap();
    build(p, fs, &ctx, r#"{"opencodeVersion":"1.18.33"}"#)
}

/// The name is looked at again just before the save: one someone made during the
/// install is refused (nothing saved into their snapshot), and the machine removed.
#[test]
fn a_name_taken_during_the_install_is_not_saved_into() {
    let (mut p, mut fs) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
    to_the_second_look(&mut p);
    p.push_exit(0, r#"[{"name":"opencode-golden","status":"ready"}]"#, "");
    p.push_exit(0, "{}", "");
    let e = run_build(&mut p, &mut fs).unwrap_err();
    assert!(e.code == Code::SnapshotExists && e.message.contains("appeared while"), "{e:?}");
    let asked = p.commands();
    assert!(!asked.iter().any(|c| c.starts_with("snapshots save")), "{asked:?}");
    assert_eq!(asked.last().unwrap(), &alloc::format!("machine remove {MACHINE} -y --json"));
    assert!(left(&mut fs).is_empty());
}

/// A save that timed out is looked for until boxd holds it ready (the build is done) or
/// failed (GOLDEN_FAILED); the build machine is removed only then. Still pending after
/// every look, the machine is left for the capture, and its record stays for a later
/// build (not ended: swept only once this build is certainly over).
#[test]
fn a_save_that_timed_out_is_settled_before_the_build_machine_goes() {
    let pending = r#"[{"name":"opencode-golden","status":"pending"}]"#;
    let (mut p, mut fs) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
    to_the_second_look(&mut p);
    p.push_exit(0, "[]", "");
    p.push_spawn_error(crate::caps::SpawnError::TimedOut);
    p.push_exit(0, pending, "");
    p.push_exit(0, r#"[{"name":"opencode-golden","version":"v1","status":"ready"}]"#, "");
    p.push_exit(0, "{}", "");
    let v = run_build(&mut p, &mut fs).unwrap();
    assert_eq!(v["buildMachineRemoved"], true, "{v:#}");
    let asked = p.commands();
    assert_eq!(asked[asked.len() - 3..], ["snapshots list --json", "snapshots list --json", &alloc::format!("machine remove {MACHINE} -y --json")]);

    let (mut p, mut fs) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
    to_the_second_look(&mut p);
    p.push_exit(0, "[]", "");
    p.push_fail(124, "error: timed out waiting for boxd.sh");
    p.push_exit(0, r#"[{"name":"opencode-golden","status":"failed"}]"#, "");
    p.push_exit(0, "{}", "");
    let e = run_build(&mut p, &mut fs).unwrap_err();
    assert!(e.code == Code::GoldenFailed && e.message.contains("failed") && e.next.contains("another name"), "{e:?}");
    assert!(p.commands().last().unwrap().starts_with("machine remove"), "{:?}", p.commands());
    assert!(left(&mut fs).is_empty());

    let (mut p, mut fs) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
    to_the_second_look(&mut p);
    p.push_exit(0, "[]", "");
    p.push_spawn_error(crate::caps::SpawnError::TimedOut);
    for _ in 0..SAVE_LOOKS {
        p.push_exit(0, pending, "");
    }
    let e = run_build(&mut p, &mut fs).unwrap_err();
    assert!(e.code == Code::Timeout && e.message.contains(MACHINE) && e.message.contains("left running"), "{e:?}");
    assert!(!p.commands().iter().any(|c| c.starts_with("machine remove")), "{:?}", p.commands());
    let kept = Ledger::new(&mut fs, "/l").build_machines().unwrap();
    assert!(kept.len() == 1 && kept[0].machine == MACHINE && !kept[0].ended, "{kept:?}");
}

/// The save's answer names the version it made: a later one than v1 means someone made
/// the name between the second look and the save, and the build added a version to
/// their snapshot: SNAPSHOT_EXISTS saying so, not a build (before: a build). A save
/// that timed out and is then listed ready at a later version is not adopted either.
#[test]
fn a_save_that_made_a_later_version_is_not_this_builds() {
    let (mut p, mut fs) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
    to_the_second_look(&mut p);
    p.push_exit(0, "[]", "");
    p.push_exit(0, r#"{"name":"opencode-golden","version":"v2","status":"ready"}"#, "");
    p.push_exit(0, "{}", "");
    let e = run_build(&mut p, &mut fs).unwrap_err();
    assert!(e.code == Code::SnapshotExists && e.message.contains("added version v2") && e.message.contains("someone else") && e.next.contains("--name"), "{e:?}");
    let asked = p.commands();
    assert!(asked.contains(&alloc::format!("snapshots save {MACHINE} opencode-golden --json")), "{asked:?}");
    assert_eq!(asked.last().unwrap(), &alloc::format!("machine remove {MACHINE} -y --json"), "the save is over: the machine goes");
    assert!(left(&mut fs).is_empty());

    let (mut p, mut fs) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
    to_the_second_look(&mut p);
    p.push_exit(0, "[]", "");
    p.push_spawn_error(crate::caps::SpawnError::TimedOut);
    p.push_exit(0, r#"[{"name":"opencode-golden","version":"v2","status":"ready"}]"#, "");
    p.push_exit(0, "{}", "");
    let e = run_build(&mut p, &mut fs).unwrap_err();
    assert!(e.code == Code::SnapshotExists && e.message.contains("v2"), "{e:?}");
}

/// A save boxd answers with a failure after it landed (not a timeout) is looked for
/// once: listed ready at v1 (the name was free at the look just before), it is this
/// build's (before: BOXD_FAILED, and a rebuild under the name SNAPSHOT_EXISTS); not
/// listed, or at another version, the failure stands.
#[test]
fn a_save_that_landed_and_then_failed_is_adopted_only_at_v1() {
    for (listed, ok) in [
        (r#"[{"name":"opencode-golden","version":"v1","status":"ready"}]"#, true),
        ("[]", false),
        (r#"[{"name":"opencode-golden","version":"v2","status":"ready"}]"#, false),
        (r#"[{"name":"opencode-golden","status":"ready"}]"#, false),
    ] {
        let (mut p, mut fs) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
        to_the_second_look(&mut p);
        p.push_exit(0, "[]", "");
        p.push_fail(1, "error: internal");
        p.push_exit(0, listed, "");
        p.push_exit(0, "{}", "");
        let r = run_build(&mut p, &mut fs);
        assert_eq!(p.commands().last().unwrap(), &alloc::format!("machine remove {MACHINE} -y --json"), "{listed}");
        match r {
            Ok(v) => {
                assert!(ok, "{listed}: {v:#}");
                assert_eq!(v["buildMachineRemoved"], true);
                assert!(v["steps"].to_string().contains("answered a failure (boxd snapshots save failed: error: internal)"), "{v:#}");
            }
            Err(e) => {
                assert!(!ok && e.code == Code::BoxdFailed && e.message.contains("error: internal"), "{listed}: {e:?}");
            }
        }
        assert!(left(&mut fs).is_empty());
    }
}

/// A `machine new` that fails or times out may have landed: one `get`, and the build
/// machine is removed when it is there; the message names it either way.
#[test]
fn a_build_machine_whose_create_failed_is_looked_for_and_removed() {
    let (mut p, mut fs) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
    p.push_exit(0, "[]", "");
    p.push_spawn_error(crate::caps::SpawnError::TimedOut);
    p.push_exit(0, &alloc::format!(r#"{{"name":"{MACHINE}","id":"vm_b","status":"running"}}"#), "");
    p.push_exit(0, "{}", "");
    let e = run_build(&mut p, &mut fs).unwrap_err();
    assert!(e.code == Code::Timeout && e.message.contains(&alloc::format!("{MACHINE} had been made all the same, and was removed")), "{e:?}");
    assert_eq!(p.commands()[2..], [alloc::format!("machine get {MACHINE} --json"), alloc::format!("machine remove {MACHINE} -y --json")]);
    assert!(left(&mut fs).is_empty());

    // Refused outright and not there: forgotten. Timed out and not there (yet): the
    // record stays for the next build.
    let (mut p, mut fs) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
    p.push_exit(0, "[]", "");
    p.push_fail(1, "error: quota exceeded");
    p.push_fail(1, &alloc::format!("error: VM '{MACHINE}' not found"));
    let e = run_build(&mut p, &mut fs).unwrap_err();
    assert!(e.code == Code::BoxdFailed && e.message.contains(&alloc::format!("{MACHINE} was not made")), "{e:?}");
    assert!(left(&mut fs).is_empty());
    let (mut p, mut fs) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
    p.push_exit(0, "[]", "");
    p.push_spawn_error(crate::caps::SpawnError::TimedOut);
    p.push_fail(1, &alloc::format!("error: VM '{MACHINE}' not found"));
    let e = run_build(&mut p, &mut fs).unwrap_err();
    assert!(e.message.contains("may still appear") && e.message.contains(MACHINE), "{e:?}");
    assert_eq!(left(&mut fs), [MACHINE]);
}

#[test]
fn a_record_naming_another_machine_is_never_acted_on() {
    let (mut p, mut fs) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
    fs.put("/l/golden-builds/prod-db.json", br#"{"machine":"prod-db","startedAtMs":0}"#);
    fs.put("/l/golden-builds/golden-build-ab.json", br#"{"machine":"prod-db","startedAtMs":0}"#);
    assert_eq!(build_at(10 * HOUR_MS, &mut p, &mut fs), ["snapshots list --json"]);
}
