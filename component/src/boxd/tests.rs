//! The boxd adapter's unit tests: its argument lists, its reading of answers and failures.

use super::*;
use crate::testing::Scripted;

#[test]
fn arguments_the_host_refuses_are_a_host_mismatch_not_a_missing_cli() {
    let mut p = Scripted::default();
    p.push_spawn_error(SpawnError::NotAllowed("boxd machine list --json: no grant allows these arguments".into()));
    let e = Boxd::new(&mut p, 10).list().unwrap_err().into_error();
    assert_eq!(e.code, Code::HostFailed, "{}", e.message);
    assert!(e.message.contains("host's policy refused"), "{}", e.message);
    let mut p = Scripted::default();
    p.push_spawn_error(SpawnError::NotAllowed("boxd: not in the host's policy".into()));
    assert_eq!(Boxd::new(&mut p, 10).list().unwrap_err().into_error().code, Code::BoxdMissing);
}

#[test]
fn json_is_found_past_the_cli_noise() {
    let out = b"(restarted client-utilities daemon)\n[{\"name\":\"oc-a\",\"status\":\"running\",\"sharing\":\"private\"}]\n";
    let v = first_json(out).unwrap();
    assert_eq!(v[0]["name"], "oc-a");
    assert_eq!(first_json(b"garbage\nmore garbage"), None);
    let noisy = b"\xff\xfe daemon said\n{\"name\":\"oc-a\"}\n";
    assert_eq!(first_json(noisy).unwrap()["name"], "oc-a", "a noise line that is not UTF-8 hides nothing");
    assert_eq!(first_json(b"{\"name\":\"\xff\"}\n"), None, "JSON that is not UTF-8 is no JSON");
}

#[test]
fn quoting_survives_the_guest_shell() {
    assert_eq!(sh_quote("plain-word"), "plain-word");
    assert_eq!(sh_quote("it's $HOME; rm -rf /"), "'it'\\''s $HOME; rm -rf /'");
    assert_eq!(sh_quote(""), "''");
}

#[test]
fn failures_are_classified() {
    let mut p = Scripted::default();
    p.push_fail(1, "error: not logged in");
    p.push_fail(1, "error: cannot connect to https://boxd.sh:9443: dns error: not found");
    p.push_fail(1, "error: VM 'oc-x' not found");
    p.push_fail(1, "error: quota exceeded");
    let mut b = Boxd::new(&mut p, 10);
    assert!(matches!(b.list(), Err(Failure::SignedOut(_))));
    assert!(matches!(b.list(), Err(Failure::Unreachable(_))));
    assert_eq!(b.get("oc-x").unwrap(), None);
    let e = b.list().unwrap_err().into_error();
    assert_eq!(e.code, Code::BoxdFailed);
    assert!(e.message.contains("quota exceeded"), "{}", e.message);
    assert_eq!(b.calls, 4);
}

#[test]
fn timeout_messages_name_the_bound_that_fired() {
    let mut p = Scripted::default();
    p.push_fail(124, "error: command timed out after 120s");
    p.push_fail(124, "");
    p.push_spawn_error(SpawnError::TimedOut);
    p.push_spawn_error(SpawnError::TimedOut);
    let mut b = Boxd::new(&mut p, 10);
    let m = |f: Failure| match f {
        Failure::Timeout(m) => m,
        _ => panic!("not a timeout"),
    };
    let fired = m(b.exec("oc-a", &["true"], None, 120).unwrap_err());
    assert!(fired.contains("--timeout of 120 s") && fired.contains("stopped"), "{fired}");
    let itself = m(b.exec("oc-a", &["true"], None, 120).unwrap_err());
    assert!(itself.contains("exited with 124 itself") && itself.contains("did not fire"), "{itself}");
    let host = m(b.exec("oc-a", &["true"], None, 120).unwrap_err());
    assert!(host.contains("within 150 s"), "{host}");
    let cli = m(b.list().unwrap_err());
    assert!(cli.contains("within 10 s") && cli.contains("boxdTimeoutSeconds"), "{cli}");
}

/// A CLI that exits 0 with an error as its JSON answer did not do what was asked: a
/// remove or hibernate answering so is BOXD_FAILED in boxd's words; a `get` saying not
/// found so is "gone" as its stderr form is. An `error` that is null is no error.
#[test]
fn a_json_error_answer_that_exits_0_is_a_failure() {
    let mut p = Scripted::default();
    p.push_exit(0, "{\"error\":\"internal: machine is busy\"}\n", "");
    p.push_exit(0, "(restarted client-utilities daemon)\n{\"error\":{\"code\":\"aborted\"}}", "");
    p.push_exit(0, "{\"error\":\"VM 'oc-x' not found\"}", "");
    p.push_exit(0, "{\"name\":\"oc-x\",\"status\":\"destroyed\",\"error\":null}", "");
    p.push_exit(1, "{\"error\":\"quota exceeded\"}", "");
    let mut b = Boxd::new(&mut p, 10);
    let e = b.remove("oc-x").unwrap_err().into_error();
    assert!(e.code == Code::BoxdFailed && e.message.contains("machine remove failed: error: internal: machine is busy"), "{e:?}");
    let e = b.hibernate("oc-x").unwrap_err().into_error();
    assert!(e.code == Code::BoxdFailed && e.message.contains("aborted"), "{e:?}");
    assert_eq!(b.get("oc-x").unwrap(), None);
    assert_eq!(b.remove("oc-x"), Ok(()));
    assert!(matches!(b.list(), Err(Failure::Other(m)) if m.contains("quota exceeded")), "a non-zero exit says the JSON's words too");
}

#[test]
fn a_missing_cli_is_boxd_missing() {
    let mut p = Scripted::default();
    p.push_spawn_error(SpawnError::NotFound("boxd".into()));
    let mut b = Boxd::new(&mut p, 10);
    assert_eq!(b.list().unwrap_err().into_error().code, Code::BoxdMissing);
}

#[test]
fn a_snapshot_row_without_a_name_fails_the_whole_listing() {
    for row in [r#"{"version":"v1"}"#, r#"{"name":7}"#, r#"{"name":""}"#] {
        let mut p = Scripted::default();
        p.push_exit(0, &format!(r#"[{{"name":"img","status":"ready"}},{row}]"#), "");
        let e = Boxd::new(&mut p, 10).snapshots().unwrap_err().into_error();
        assert!(e.code == Code::BoxdFailed && e.message.contains("row without a name"), "{row}: {e:?}");
    }
    let mut p = Scripted::default();
    p.push_exit(0, r#"[{"name":"img","status":"ready"}]"#, "");
    assert_eq!(Boxd::new(&mut p, 10).snapshots().unwrap()[0].name, "img");
}

/// Names are unique in an org: a listing that names one machine of ours live twice cannot
/// say which row is there (a running machine with a hibernated twin read as asleep). Its
/// rows become one with a status no tool acts on; the rest of the listing reads (the whole
/// listing refused made every other work's tools fail too, and status's next step looped).
#[test]
fn a_machine_of_ours_listed_twice_is_one_row_no_tool_acts_on() {
    let twice = r#"[{"name":"oc-w1","status":"running"},{"name":"other","status":"running"},{"name":"oc-w1","status":"hibernated"}]"#;
    let mut p = Scripted::default();
    p.push_exit(0, twice, "");
    let got = Boxd::new(&mut p, 10).list().unwrap();
    let rows: Vec<(&str, &str)> = got.iter().map(|m| (m.name.as_str(), m.status.as_str())).collect();
    assert_eq!(rows, [("oc-w1", "listed 2 times by boxd machine list (running, hibernated)"), ("other", "running")]);
    assert_eq!(State::from_status(&got[0].status), None, "a status no tool acts on");
    // A removed machine's row lingers (destroyed) while its name is taken again: the live
    // row stands. Two gone rows are one gone machine; another's name twice is theirs.
    for (listing, want) in [
        (r#"[{"name":"oc-w1","status":"destroyed"},{"name":"oc-w1","status":"running"}]"#, vec![("oc-w1", "running")]),
        (r#"[{"name":"oc-w1","status":"destroyed"},{"name":"oc-w1","status":"deleted"}]"#, vec![("oc-w1", "destroyed"), ("oc-w1", "deleted")]),
        (r#"[{"name":"theirs","status":"running"},{"name":"theirs","status":"stopped"}]"#, vec![("theirs", "running"), ("theirs", "stopped")]),
    ] {
        let mut p = Scripted::default();
        p.push_exit(0, listing, "");
        let got = Boxd::new(&mut p, 10).list().unwrap();
        assert_eq!(got.iter().map(|m| (m.name.as_str(), m.status.as_str())).collect::<Vec<_>>(), want, "{listing}");
    }
    // Snapshot names repeat by design (a save of the same name is a new version).
    let mut p = Scripted::default();
    p.push_exit(0, r#"[{"name":"img","version":"v1"},{"name":"img","version":"v2"}]"#, "");
    assert_eq!(Boxd::new(&mut p, 10).snapshots().unwrap().len(), 2);
}

/// A stranger's name that is not UTF-8 costs its own row nothing but its bytes: the other
/// rows, ours among them, still read (strict JSON lost the whole listing to it).
#[test]
fn a_listing_row_whose_name_is_not_utf8_leaves_the_others_readable() {
    let raw = |stdout: &[u8]| RunOutput { exit_code: Some(0), stdout: stdout.to_vec(), ..Default::default() };
    let mut p = Scripted::default();
    p.answers.push_back(Ok(raw(b"[{\"name\":\"oc-w1\",\"status\":\"running\"},{\"name\":\"their\xff\xfe\",\"status\":\"running\"}]\n")));
    p.answers.push_back(Ok(raw(b"[{\"name\":\"img\xff\",\"status\":\"ready\"},{\"name\":\"opencode-golden\",\"status\":\"ready\"}]\n")));
    let (machines, snapshots) = Boxd::new(&mut p, 10).list_and_snapshots();
    let machines = machines.unwrap();
    assert_eq!(machines.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), ["oc-w1", "their\u{fffd}\u{fffd}"]);
    assert_eq!(snapshots.unwrap()[1].name, "opencode-golden");
    let mut p = Scripted::default();
    p.answers.push_back(Ok(raw(b"[{\"name\":\"oc-w1\",\"status\":\"running\"},{\"name\":\"\xff\"}]")));
    assert_eq!(Boxd::new(&mut p, 10).list().unwrap()[0].status, "running");
    // Where it is not a listing, JSON that is not UTF-8 is still no JSON (guest.rs, opencode.rs).
    assert_eq!(first_json(b"{\"name\":\"\xff\"}\n"), None);
}

/// A file the host could not land from the exec's stdout is the laptop's (PATH_REFUSED,
/// said as the host's word); the same words from an exec that lands nothing, and a frame
/// the guest damaged, stay the CLI's (BOXD_FAILED).
#[test]
fn a_landing_the_host_could_not_make_is_the_laptops_not_boxds() {
    use crate::caps::{SpawnError, Streams};
    let landing = Streams { stdin_files: Vec::new(), stdout_files: vec!["/p/a.txt.x-0.boxd-tmp".into()], ..Default::default() };
    let said = |streams: &Streams, host: &str| {
        let mut p = Scripted::default();
        p.push_spawn_error(SpawnError::Failed(host.into()));
        Boxd::new(&mut p, 10).exec_streaming("oc-x", &["true"], None, streams, 10).unwrap_err().into_error()
    };
    let full = said(&landing, "boxd: the files framed on its stdout: cannot write /p/a.txt.x-0.boxd-tmp: No space left on device (os error 28)");
    assert!(full.code == Code::PathRefused && full.message.starts_with(LAPTOP_FULL), "{full:?}");
    let refused = said(&landing, "boxd: the files framed on its stdout: cannot create /p/a.txt.x-0.boxd-tmp: Permission denied (os error 13)");
    assert!(refused.code == Code::PathRefused && refused.message.starts_with(UNRECEIVED), "{refused:?}");
    let damaged = said(&landing, "boxd: the files framed on its stdout: /p/a.txt.x-0.boxd-tmp arrived damaged: its digest is 00, the sender's 11");
    assert!(damaged.code == Code::GuestFailed && damaged.message.contains("arrived damaged") && damaged.next.contains("~/.local/bin"), "the helper's, not the CLI's: {damaged:?}");
    // The laptop's own failures as the frames land stay its own, not the machine's.
    for laptops in ["cannot write /p/a.txt.x-0.boxd-tmp: Input/output error (os error 5)", "cannot sync /p/a.txt.x-0.boxd-tmp: Read-only file system (os error 30)"] {
        let e = said(&landing, &format!("boxd: the files framed on its stdout: {laptops}"));
        assert_ne!(e.code, Code::GuestFailed, "{e:?}");
    }
    let short = said(&landing, "boxd: the files framed on its stdout: the frame for /p/a.txt.x-0.boxd-tmp ended after 3 of 9 bytes");
    assert_eq!(short.code, Code::GuestFailed, "{short:?}");
    let nothing_landed = said(&Streams::default(), "boxd: the files framed on its stdout: cannot create /p/a: Permission denied (os error 13)");
    assert!(nothing_landed.code == Code::BoxdFailed && nothing_landed.message.starts_with("could not run boxd machine exec"), "{nothing_landed:?}");
}
