//! boxd_fork's unit tests: the queue, claims, adoption and the parent as it is now.

use super::*;
use crate::testing::{open_work, raw_at, raw_context, MemFiles, Scripted, Shared, OURS};
use crate::tools::call;

/// A prepared parent w1 whose machine runs alone, and the boxd answers a fork call reads
/// first: the laptop's OpenCode version, the parent's state, the listing.
fn parent_running() -> (MemFiles, Scripted) {
    let mut fs = open_work(None);
    Ledger::new(&mut fs, "/l").update("w1", |w| w.helper_sha256 = Some(crate::encode::sha256_hex(crate::guest::HELPER))).unwrap();
    let mut p = Scripted::default();
    p.push_exit(0, "1.18.33", "");
    p.push_exit(0, OURS, "");
    p.push_exit(0, r#"[{"name":"oc-w1","status":"running"}]"#, "");
    (fs, p)
}

fn fork_call(fs: &mut MemFiles, running: &[&str], admit: &[&str], options: &str, args: &str) -> (ToolResult<Value>, Vec<String>) {
    // The parent was prepared: the ledger knows its machine holds this helper, and a
    // fork's copied home does too.
    Ledger::new(fs, "/l").update("w1", |w| w.helper_sha256 = Some(crate::encode::sha256_hex(crate::guest::HELPER))).unwrap();
    let mut p = Scripted::default();
    p.push_exit(0, "1.18.33", "");
    p.push_exit(0, OURS, "");
    let rows: Vec<String> = running.iter().map(|n| format!(r#"{{"name":"{n}","status":"running"}}"#)).collect();
    p.push_exit(0, &format!("[{}]", rows.join(",")), "");
    // Each fork is admitted on a look of its own (admission.rs); after the first, the parent
    // is looked at again too.
    let mut rows = rows;
    for (i, id) in admit.iter().enumerate() {
        if i > 0 {
            p.push_exit(0, &format!("[{}]", rows.join(",")), "");
            p.push_exit(0, OURS, "");
        }
        p.push_exit(0, &format!(r#"{{"name":"oc-{id}","id":"vm_{id}","boot":"5ms"}}"#), "");
        p.push_exit(0, "", "");
        p.push_exit(0, &format!(r#"{{"ok":true,"work":"{id}"}}"#), "");
        rows.push(format!(r#"{{"name":"oc-{id}","status":"running"}}"#));
    }
    p.push_exit(0, &format!("[{}]", rows.join(",")), "");
    let r = call(&mut p, fs, "boxd_fork", args, raw_context(options, "{}"));
    (r, p.commands())
}

#[test]
fn forks_past_a_cap_wait_queued_and_a_later_call_admits_them_in_order() {
    let mut fs = open_work(None);
    let cap2 = r#"{"maxRunningPerLedger":2}"#;
    let (r, cmds) = fork_call(&mut fs, &["oc-w1"], &["fa"], cap2, r#"{"work":"w1","forks":["fa","fb","fc"]}"#);
    let v = r.unwrap();
    assert_eq!(v["queued"], json!(["fb", "fc"]), "{v}");
    assert_eq!(v["waiting"]["error"], "CAP_REACHED", "{v}");
    assert!(cmds[3].starts_with("machine fork oc-w1 oc-fa --auto-hibernate-timeout "), "{cmds:?}");
    assert!(cmds[4].contains("cp -a w1 \"$t\"") && cmds[4].contains("t=fa.fork-tmp.$$") && cmds[4].contains("mv -T \"$t\" fa") && cmds[4].contains("rm -rf fa.fork-tmp.* 2>/dev/null; [ -d fa ]"), "{cmds:?}");
    assert_eq!(cmds.len(), 7, "one fork, one copy, one prepare, and the look fb waits on: {cmds:?}");
    assert_eq!(cmds[6], "machine list --json", "each fork is admitted on a look of its own: {cmds:?}");
    let fa = Ledger::new(&mut fs, "/l").require("fa").unwrap();
    assert_eq!((fa.state, fa.machine_id.as_deref(), fa.fork.as_ref().map(|f| f.parent.as_str())), (WorkState::Open, Some("vm_fa"), Some("w1")));
    assert_eq!(fa.runs.len(), 1, "its run is priced from the fork on");

    // A slot frees (cap 3): the oldest queued fork goes first, the next still waits.
    let cap3 = r#"{"maxRunningPerLedger":3}"#;
    let (r, cmds) = fork_call(&mut fs, &["oc-w1", "oc-fa"], &["fb"], cap3, r#"{"work":"w1"}"#);
    let v = r.unwrap();
    assert!(cmds[3].starts_with("machine fork oc-w1 oc-fb "), "{cmds:?}");
    assert_eq!(v["queued"], json!(["fc"]), "{v}");
    let mut l = Ledger::new(&mut fs, "/l");
    assert_ne!(l.password("fa").unwrap(), l.password("fb").unwrap(), "each fork has its own server password");
    assert_eq!(l.require("fc").unwrap().state, WorkState::Queued);
}

#[test]
fn a_fork_id_the_ledger_holds_for_another_work_is_a_conflict() {
    let mut fs = open_work(None);
    let mut other = Work::new("fa", "/p", "t");
    other.state = WorkState::Open;
    Ledger::new(&mut fs, "/l").write(&other).unwrap();
    let mut p = Scripted::default();
    p.push_exit(0, "1.18.33", "");
    let e = call(&mut p, &mut fs, "boxd_fork", r#"{"work":"w1","forks":["fa"]}"#, raw_context("{}", "{}")).unwrap_err();
    assert_eq!(e.code, Code::WorkConflict, "{e:?}");
    assert_eq!(p.commands(), ["--version"], "refused before boxd is asked");
}

#[test]
fn a_queued_fork_takes_no_prompt_and_drops_without_a_machine() {
    let mut fs = open_work(None);
    let (r, _) = fork_call(&mut fs, &["oc-w1"], &[], r#"{"maxRunningPerLedger":1}"#, r#"{"work":"w1","forks":["fa"]}"#);
    assert_eq!(r.unwrap()["queued"], json!(["fa"]));
    let mut p = Scripted::default();
    let e = call(&mut p, &mut fs, "boxd_submit", r#"{"work":"fa","prompt":"x"}"#, raw_context("{}", "{}")).unwrap_err();
    assert!(e.code == Code::CapReached && e.next.contains("boxd_fork for work 'w1'"), "{e:?}");
    let v = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"fa"}"#, raw_context("{}", "{}")).unwrap();
    assert_eq!(v["dropped"], true);
    assert!(p.commands().iter().all(|c| !c.starts_with("machine")), "{:?}", p.commands());
}

/// `machine fork` that made the fork and then failed: the fork is not put back in the
/// queue (which disowned it: NOT_OURS from boxd_fork, "no machine" from drop while it
/// ran); it stays creating for the next boxd_fork to adopt. One that made nothing visible
/// stays creating too, its claim released (it may land late), and the next call forks
/// it again at once; only a failure that made nothing for certain (signed out) puts it
/// back in the queue.
#[test]
fn a_fork_that_landed_and_then_failed_stays_this_works_to_adopt() {
    // A call's time, long after the epoch (a released claim reads as old).
    let at = || raw_at(2 * FORK_CLAIM_MS);
    let landed = OURS.replace("oc-w1", "oc-fa").replace("vm_1", "vm_fa");
    for (failure, after, state) in [
        ("error: internal server error", landed.as_str(), WorkState::Creating),
        ("error: internal server error", "", WorkState::Creating),
        ("error: not logged in", "", WorkState::Queued),
    ] {
        let mut fs = open_work(None);
        let mut p = Scripted::default();
        p.push_exit(0, "1.18.33", "");
        p.push_exit(0, OURS, "");
        p.push_exit(0, r#"[{"name":"oc-w1","status":"running"}]"#, "");
        p.push_fail(1, failure);
        if after.is_empty() {
            p.push_fail(1, "error: VM 'oc-fa' not found");
        } else {
            p.push_exit(0, after, "");
        }
        let e = call(&mut p, &mut fs, "boxd_fork", r#"{"work":"w1","forks":["fa"]}"#, at());
        let fa = Ledger::new(&mut fs, "/l").require("fa").unwrap();
        assert_eq!(fa.state, state, "{failure} {after:?}: {e:?}");
        if state == WorkState::Creating && !after.is_empty() {
            let e = call(&mut Scripted::default(), &mut fs, "boxd_drop", r#"{"work":"fa"}"#, at()).unwrap_err();
            assert_eq!(e.code, Code::CreateUncertain, "drop does not close it while the claim is this call's: {e:?}");
        }
        if after.is_empty() && state == WorkState::Creating {
            assert_eq!(fa.created_ms, 0, "the claim is released");
            // The next call finds no machine and forks it again at once.
            Ledger::new(&mut fs, "/l").update("w1", |w| w.helper_sha256 = Some(crate::encode::sha256_hex(crate::guest::HELPER))).unwrap();
            let mut p = Scripted::default();
            p.push_exit(0, "1.18.33", "");
            p.push_exit(0, OURS, "");
            p.push_fail(1, "error: VM 'oc-fa' not found");
            p.push_exit(0, r#"[{"name":"oc-w1","status":"running"}]"#, "");
            p.push_exit(0, r#"{"name":"oc-fa","id":"vm_fa","boot":"5ms"}"#, "");
            p.push_exit(0, "", "");
            p.push_exit(0, r#"{"ok":true,"work":"fa"}"#, "");
            let r = call(&mut p, &mut fs, "boxd_fork", r#"{"work":"w1"}"#, at());
            let cmds = p.commands();
            assert!(r.is_ok() && cmds.iter().any(|c| c.starts_with("machine fork oc-w1 oc-fa")), "{r:?} {cmds:?}");
            assert_eq!(Ledger::new(&mut fs, "/l").require("fa").unwrap().state, WorkState::Open);
        }
    }
}

/// A fork's tree is a copy of its parent's: the files the laptop sent there or brought home
/// from there are the laptop's in the fork too (a submit over one was refused as the
/// agent's output, and an untouched fork's drop as untracked).
#[test]
fn a_fork_holds_what_its_parent_held_of_its_tree() {
    let mut fs = open_work(None);
    let rec = crate::ledger::FileRecord { guest: "in.md".into(), laptop: "/p/input.md".into(), sha256: "ab".into(), ..Default::default() };
    Ledger::new(&mut fs, "/l").update("w1", |w| {
        w.files_in.push(rec.clone());
        w.files_out.push(crate::ledger::FileRecord { guest: "out.csv".into(), ..rec.clone() });
    })
    .unwrap();
    let (r, _) = fork_call(&mut fs, &["oc-w1"], &["fa"], "{}", r#"{"work":"w1","forks":["fa"]}"#);
    r.unwrap();
    let (parent, fa) = (Ledger::new(&mut fs, "/l").require("w1").unwrap(), Ledger::new(&mut fs, "/l").require("fa").unwrap());
    assert_eq!((fa.files_in, fa.files_out), (parent.files_in, parent.files_out));
}

/// A fork whose name someone else's machine holds: NOT_OURS, the fork stays queued, and
/// the next step is one that works (it said "call boxd_ensure", which refuses a fork's id,
/// so the user went round in a loop); the drop it names closes the fork sending nothing.
#[test]
fn a_fork_whose_name_someone_else_holds_names_the_drop_of_the_fork() {
    let at = || raw_at(2 * FORK_CLAIM_MS);
    let mut fs = open_work(None);
    let mut p = Scripted::default();
    p.push_exit(0, "1.18.33", "");
    p.push_exit(0, OURS, "");
    p.push_exit(0, r#"[{"name":"oc-w1","status":"running"},{"name":"oc-fa","status":"running"}]"#, "");
    p.push_fail(1, "error: VM 'oc-fa' already exists");
    let e = call(&mut p, &mut fs, "boxd_fork", r#"{"work":"w1","forks":["fa"]}"#, at()).unwrap_err();
    assert_eq!(e.code, Code::NotOurs, "{e:?}");
    assert!(e.next.contains("Leave oc-fa alone") && e.next.contains("boxd_drop for work 'fa'") && e.next.contains("boxd_fork for work 'w1'"), "{}", e.next);
    assert_eq!(Ledger::new(&mut fs, "/l").require("fa").unwrap().state, WorkState::Queued);
    let mut p = Scripted::default();
    let v = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"fa"}"#, at()).unwrap();
    assert_eq!(v["dropped"], true, "{v}");
    assert!(p.requests.is_empty(), "nothing reached boxd: {:?}", p.commands());
}

/// A fork claimed by another call (`creating`, no machine yet) is left to it while the
/// claim is younger than FORK_CLAIM_MS, and forked again once it is older.
#[test]
fn a_young_claim_is_left_to_its_holder_and_an_old_one_is_taken_over() {
    for (age, forked) in [(60_000, false), (FORK_CLAIM_MS, true)] {
        let mut fs = open_work(None);
        let (r, _) = fork_call(&mut fs, &["oc-w1"], &[], r#"{"maxRunningPerLedger":1}"#, r#"{"work":"w1","forks":["fa"]}"#);
        assert_eq!(r.unwrap()["queued"], json!(["fa"]));
        let now = 20 * 60_000;
        Ledger::new(&mut fs, "/l").update("fa", |w| (w.state, w.created_ms) = (WorkState::Creating, now - age)).unwrap();
        let raw = raw_at(now);
        let mut p = Scripted::default();
        p.push_exit(0, "1.18.33", "");
        p.push_exit(0, OURS, "");
        p.push_fail(1, "error: VM 'oc-fa' not found");
        if forked {
            p.push_exit(0, r#"[{"name":"oc-w1","status":"running"}]"#, "");
            p.push_exit(0, r#"{"name":"oc-fa","id":"vm_fa","boot":"5ms"}"#, "");
            p.push_exit(0, "", "");
            p.push_exit(0, r#"{"ok":true,"work":"fa"}"#, "");
        }
        let v = call(&mut p, &mut fs, "boxd_fork", r#"{"work":"w1"}"#, raw).unwrap();
        let forks = p.commands().iter().filter(|c| c.starts_with("machine fork")).count();
        assert_eq!(forks, usize::from(forked), "{:?}", p.commands());
        let fa = Ledger::new(&mut fs, "/l").require("fa").unwrap();
        if forked {
            assert_eq!((fa.state, fa.machine_id.as_deref()), (WorkState::Open, Some("vm_fa")));
        } else {
            assert_eq!((fa.state, fa.created_ms), (WorkState::Creating, now - age), "the holder's claim is left as it is");
            assert!(v["next"].as_str().unwrap().contains("still being made"), "{v:#}");
        }
    }
}

/// A fork queued behind a cap copies the parent as it is when it is made: while a prompt
/// reached the parent after the last harvest it waits (NOT_PROVEN, nothing forked), and
/// once proven it is made, its record naming the prompt it was made at.
#[test]
fn a_queued_fork_copies_the_parent_as_it_is_now_and_waits_while_it_is_unproven() {
    let mut fs = open_work(None);
    let (r, _) = fork_call(&mut fs, &["oc-w1"], &[], r#"{"maxRunningPerLedger":1}"#, r#"{"work":"w1","forks":["fa"]}"#);
    assert_eq!(r.unwrap()["queued"], json!(["fa"]));
    Ledger::new(&mut fs, "/l").update("w1", |w| w.prompts.push(crate::ledger::Prompt { id: "p1".into(), admitted: true, ..Default::default() })).unwrap();
    let cap3 = r#"{"maxRunningPerLedger":3}"#;
    let (r, cmds) = fork_call(&mut fs, &["oc-w1"], &[], cap3, r#"{"work":"w1"}"#);
    let v = r.unwrap();
    assert_eq!((v["queued"].clone(), v["waiting"]["error"].as_str()), (json!(["fa"]), Some("NOT_PROVEN")), "{v:#}");
    assert!(!cmds.iter().any(|c| c.starts_with("machine fork")), "{cmds:?}");
    Ledger::new(&mut fs, "/l").update("w1", |w| w.proofs.push(crate::ledger::Proof { prompts: 1, ..Default::default() })).unwrap();
    let (r, cmds) = fork_call(&mut fs, &["oc-w1"], &["fa"], cap3, r#"{"work":"w1"}"#);
    assert_eq!(r.unwrap()["queued"], json!([]), "{cmds:?}");
    let fa = Ledger::new(&mut fs, "/l").require("fa").unwrap();
    assert_eq!((fa.state, fa.fork.and_then(|f| f.at_prompt)), (WorkState::Open, Some("p1".to_string())));
}

/// A parent dropped and its id ensured again is another work: the old parent's queued
/// forks are not made from its machine (they stay queued, to be dropped on their own).
#[test]
fn forks_queued_by_a_dropped_parent_are_not_made_from_its_id_ensured_again() {
    let mut fs = open_work(None);
    let (r, _) = fork_call(&mut fs, &["oc-w1"], &[], r#"{"maxRunningPerLedger":1}"#, r#"{"work":"w1","forks":["fa"]}"#);
    assert_eq!(r.unwrap()["queued"], json!(["fa"]));
    Ledger::new(&mut fs, "/l").update("w1", |w| (w.created_at, w.machine_id) = ("2026-12-02T00:00:00Z".into(), Some("vm_1".into()))).unwrap();
    let (r, cmds) = fork_call(&mut fs, &["oc-w1"], &[], r#"{"maxRunningPerLedger":3}"#, r#"{"work":"w1"}"#);
    let v = r.unwrap();
    assert_eq!(v["forks"], json!([]), "{v:#}");
    assert!(!cmds.iter().any(|c| c.starts_with("machine fork")), "{cmds:?}");
    assert_eq!(Ledger::new(&mut fs, "/l").require("fa").unwrap().state, WorkState::Queued);
    let v = call(&mut Scripted::default(), &mut fs, "boxd_drop", r#"{"work":"fa"}"#, raw_context("{}", "{}")).unwrap();
    assert_eq!(v["dropped"], true);
}

/// A fork whose machine landed but was never readied is adopted and counted once against
/// the caps (the listing already shows it): the fork queued behind it is admitted.
#[test]
fn an_adopted_fork_counts_once_against_the_caps() {
    let mut fs = open_work(None);
    let (r, _) = fork_call(&mut fs, &["oc-w1"], &[], r#"{"maxRunningPerLedger":1}"#, r#"{"work":"w1","forks":["fa","fb"]}"#);
    assert_eq!(r.unwrap()["queued"], json!(["fa", "fb"]));
    Ledger::new(&mut fs, "/l").update("fa", |w| (w.state, w.machine_id) = (WorkState::Creating, Some("vm_fa".into()))).unwrap();
    let mut p = Scripted::default();
    p.push_exit(0, "1.18.33", "");
    p.push_exit(0, OURS, "");
    p.push_exit(0, &OURS.replace("oc-w1", "oc-fa").replace("vm_1", "vm_fa"), "");
    p.push_exit(0, "", "");
    p.push_exit(0, r#"{"ok":true,"work":"fa"}"#, "");
    p.push_exit(0, r#"[{"name":"oc-w1","status":"running"},{"name":"oc-fa","status":"running"}]"#, "");
    p.push_exit(0, OURS, "");
    p.push_exit(0, r#"{"name":"oc-fb","id":"vm_fb","boot":"5ms"}"#, "");
    p.push_exit(0, "", "");
    p.push_exit(0, r#"{"ok":true,"work":"fb"}"#, "");
    Ledger::new(&mut fs, "/l").update("w1", |w| w.helper_sha256 = Some(crate::encode::sha256_hex(crate::guest::HELPER))).unwrap();
    let v = call(&mut p, &mut fs, "boxd_fork", r#"{"work":"w1"}"#, raw_context(r#"{"maxRunningPerLedger":3}"#, "{}")).unwrap();
    assert_eq!((v["queued"].clone(), v["waiting"].clone()), (json!([]), Value::Null), "{v:#} {:?}", p.commands());
    assert_eq!(Ledger::new(&mut fs, "/l").require("fb").unwrap().state, WorkState::Open);
}

/// A fork still being made holds nothing of its own, and its parent may be dropped (whose
/// boxd_fork would then never finish it): drop removes its machine by the recorded id, or
/// closes it when boxd has none (recorded or not); a machine under its name with no id
/// recorded that we did not fork is left alone, as is another machine where the recorded
/// one was (ours is gone: the fork closes, boxd is sent nothing for it).
#[test]
fn a_fork_still_being_made_is_dropped_whatever_its_parent_is_now() {
    let landed = OURS.replace("oc-w1", "oc-fa").replace("vm_1", "vm_fa");
    let theirs = r#"{"name":"oc-fa","id":"vm_x","status":"running","source":"standalone"}"#;
    let cases: [(Option<&str>, Option<&str>, Result<&[&str], Code>); 6] = [
        (Some("vm_fa"), Some(landed.as_str()), Ok(&["machine get oc-fa --json", "machine remove oc-fa -y --json"])),
        (None, None, Ok(&["machine get oc-fa --json", "machine list --json"])),
        (None, Some(theirs), Ok(&["machine get oc-fa --json"])),
        (None, Some(landed.as_str()), Err(Code::CreateUncertain)),
        (Some("vm_other"), Some(landed.as_str()), Ok(&["machine get oc-fa --json"])),
        (Some("vm_fa"), None, Ok(&["machine get oc-fa --json", "machine list --json"])),
    ];
    for (id, get, want) in cases {
        let mut fs = open_work(None);
        let mut fa = Work::new("fa", "/p", "t");
        (fa.state, fa.machine_id) = (WorkState::Creating, id.map(String::from));
        fa.fork = Some(ForkOrigin { parent: "w1".into(), ..Default::default() });
        if id == Some("vm_other") {
            fa.name_taken_by = Some("vm_fa".into()); // an earlier call saw that id there too
        }
        Ledger::new(&mut fs, "/l").write(&fa).unwrap();
        Ledger::new(&mut fs, "/l").update("w1", |w| w.state = WorkState::Closed).unwrap();
        let mut p = Scripted::default();
        match get {
            Some(g) => p.push_exit(0, g, ""),
            None => p.push_fail(1, "error: VM 'oc-fa' not found"),
        }
        p.push_exit(0, if id.is_some() && get.is_some() { r#"{"name":"oc-fa","status":"destroyed"}"# } else { "[]" }, "");
        let r = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"fa"}"#, raw_at(2 * FORK_CLAIM_MS));
        let state = Ledger::new(&mut fs, "/l").require("fa").unwrap().state;
        match want {
            Ok(cmds) => {
                assert_eq!(r.map(|v| v["dropped"].clone()).ok(), Some(json!(true)), "{id:?} {:?}", p.commands());
                assert_eq!(p.commands(), cmds, "{id:?}");
                assert_eq!(state, WorkState::Closed);
            }
            Err(code) => {
                let e = r.unwrap_err();
                assert_eq!(e.code, code, "{id:?} {e:?}");
                assert!(!p.commands().iter().any(|c| c.contains("remove")), "{id:?} {:?}", p.commands());
                assert_eq!(state, WorkState::Creating);
            }
        }
    }
}

/// A fork left `creating` with no machine id (its `machine fork` failed, the claim
/// released) is adopted by name only when the machine there was forked from its parent
/// with our idle bound: one made otherwise under that name is someone else's, refused
/// untouched (no copy, no password).
#[test]
fn a_machine_under_a_forks_name_not_forked_from_its_parent_is_never_adopted() {
    for (source, adopted) in [("fork/oc-w1", true), ("snapshot/other:v1", false), ("standalone", false)] {
        let mut fs = open_work(None);
        let mut fa = Work::new("fa", "/p", "t");
        fa.state = WorkState::Creating;
        fa.fork = Some(ForkOrigin { parent: "w1".into(), ..Default::default() });
        Ledger::new(&mut fs, "/l").write(&fa).unwrap();
        Ledger::new(&mut fs, "/l").update("w1", |w| w.helper_sha256 = Some(crate::encode::sha256_hex(crate::guest::HELPER))).unwrap();
        let mut p = Scripted::default();
        p.push_exit(0, "1.18.33", "");
        p.push_exit(0, OURS, "");
        p.push_exit(0, &format!(r#"{{"name":"oc-fa","id":"vm_fa","status":"running","source":"{source}"}}"#), "");
        p.push_exit(0, "", "");
        p.push_exit(0, crate::testing::CLAIMED, "");
        p.push_exit(0, r#"{"ok":true,"work":"fa"}"#, "");
        let r = call(&mut p, &mut fs, "boxd_fork", r#"{"work":"w1"}"#, raw_at(2 * FORK_CLAIM_MS));
        let fa = Ledger::new(&mut fs, "/l").require("fa").unwrap();
        if adopted {
            assert!(r.is_ok(), "{source}: {r:?}");
            assert_eq!((fa.state, fa.machine_id.as_deref()), (WorkState::Open, Some("vm_fa")), "{source}");
        } else {
            let e = r.unwrap_err();
            assert!(e.code == Code::NotOurs && e.message.contains(source), "{source}: {e:?}");
            assert_eq!((fa.state, fa.machine_id), (WorkState::Creating, None), "{source}");
            assert_eq!(p.commands().len(), 3, "nothing reached the machine: {:?}", p.commands());
        }
    }
}

/// Scripted boxd, but a boxd_fork of the parent claims fork `fa` as boxd answers the
/// drop's `machine list` (after its `get` said not found).
struct ClaimedDuringTheLook {
    inner: Scripted,
    fs: alloc::rc::Rc<core::cell::RefCell<MemFiles>>,
    now: u64,
}

impl Programs for ClaimedDuringTheLook {
    fn run(&mut self, r: &crate::caps::RunRequest) -> Result<crate::caps::RunOutput, crate::caps::SpawnError> {
        if r.args.iter().take(2).map(String::as_str).eq(["machine", "list"]) {
            let now = self.now;
            Ledger::new(&mut *self.fs.borrow_mut(), "/l").update("fa", |w| w.created_ms = now).unwrap();
        }
        self.inner.run(r)
    }
}

/// A drop of a fork whose claim was released, racing a boxd_fork that claims it while the
/// drop looks: the drop closes nothing (that call's `machine fork` may land after any close,
/// with no record to own it), and the claim stands.
#[test]
fn a_drop_leaves_a_fork_claimed_while_it_looked_to_the_claiming_call() {
    let mut fs = open_work(None);
    let mut fa = Work::new("fa", "/p", "t");
    fa.state = WorkState::Creating;
    fa.fork = Some(ForkOrigin { parent: "w1".into(), ..Default::default() });
    Ledger::new(&mut fs, "/l").write(&fa).unwrap();
    let now = 3 * FORK_CLAIM_MS;
    let shared = alloc::rc::Rc::new(core::cell::RefCell::new(fs));
    let mut p = ClaimedDuringTheLook { inner: Scripted::default(), fs: shared.clone(), now };
    p.inner.push_fail(1, "error: VM 'oc-fa' not found");
    p.inner.push_exit(0, "[]", "");
    let e = call(&mut p, &mut Shared(shared.clone()), "boxd_drop", r#"{"work":"fa"}"#, raw_at(now)).unwrap_err();
    assert_eq!(e.code, Code::SessionBusy, "{e:?}");
    let w = Ledger::new(&mut *shared.borrow_mut(), "/l").require("fa").unwrap();
    assert_eq!((w.state, w.created_ms, w.dropping_ms), (WorkState::Creating, now, 0), "the claim stands, unmarked");
}

/// A fork a drop marked (then killed before its remove) is the drop's: boxd_fork neither
/// opens nor claims it, and the next drop finishes it.
#[test]
fn a_fork_a_drop_marked_is_never_opened_and_the_next_drop_finishes_it() {
    let mut fs = open_work(None);
    let mut fa = Work::new("fa", "/p", "t");
    (fa.state, fa.machine_id, fa.dropping_ms) = (WorkState::Creating, Some("vm_fa".into()), 1);
    fa.fork = Some(ForkOrigin { parent: "w1".into(), ..Default::default() });
    Ledger::new(&mut fs, "/l").write(&fa).unwrap();
    let landed = OURS.replace("oc-w1", "oc-fa").replace("vm_1", "vm_fa");
    let (r, cmds) = {
        Ledger::new(&mut fs, "/l").update("w1", |w| w.helper_sha256 = Some(crate::encode::sha256_hex(crate::guest::HELPER))).unwrap();
        let mut p = Scripted::default();
        p.push_exit(0, "1.18.33", "");
        p.push_exit(0, OURS, "");
        p.push_exit(0, &landed, "");
        let r = call(&mut p, &mut fs, "boxd_fork", r#"{"work":"w1"}"#, raw_at(2 * FORK_CLAIM_MS));
        (r, p.commands())
    };
    assert!(r.is_ok(), "{r:?}");
    assert!(!cmds.iter().any(|c| c.starts_with("machine exec") || c.starts_with("machine fork")), "{cmds:?}");
    assert_eq!(Ledger::new(&mut fs, "/l").require("fa").unwrap().state, WorkState::Creating);
    let mut p = Scripted::default();
    p.push_exit(0, &landed, "");
    p.push_exit(0, r#"{"name":"oc-fa","status":"destroyed"}"#, "");
    let v = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"fa"}"#, raw_at(2 * FORK_CLAIM_MS)).unwrap();
    assert_eq!(v["dropped"], true, "{v:#}");
    assert_eq!(p.commands(), ["machine get oc-fa --json", "machine remove oc-fa -y --json"]);
}

/// The parent's name found holding another machine between two forks: the parent's own
/// machine is gone, so its queued forks can never be made from it. The answer's next step
/// is one that leads somewhere (drop the parent and those forks), not "start again under
/// another work id" joined to "call boxd_fork again" as before.
#[test]
fn a_parent_whose_name_now_holds_another_machine_leaves_one_next_step() {
    let (mut fs, mut p) = parent_running();
    p.push_exit(0, r#"{"name":"oc-fa","id":"vm_fa","boot":"5ms"}"#, "");
    p.push_exit(0, "", "");
    p.push_exit(0, r#"{"ok":true,"work":"fa"}"#, "");
    p.push_exit(0, r#"[{"name":"oc-w1","status":"running"},{"name":"oc-fa","status":"running"}]"#, "");
    p.push_exit(0, &OURS.replace("vm_1", "vm_theirs"), "");
    let v = call(&mut p, &mut fs, "boxd_fork", r#"{"work":"w1","forks":["fa","fb"]}"#, raw_context(r#"{"maxRunningPerLedger":3}"#, "{}")).unwrap();
    assert_eq!((v["queued"].clone(), v["waiting"]["error"].as_str()), (json!(["fb"]), Some("NOT_OURS")), "{v:#}");
    let next = v["next"].as_str().unwrap();
    assert!(next.contains("call boxd_drop for work 'w1'") && next.contains("(fb) can no longer be made") && !next.contains("another work id") && !next.contains("boxd_fork"), "{next}");
    assert_eq!(Ledger::new(&mut fs, "/l").require("w1").unwrap().name_taken_by.as_deref(), Some("vm_theirs"));
}

/// A `machine fork` that timed out leaves no claim behind: no other call holds the fork, so
/// the next boxd_fork adopts a fork that landed late, or forks it again at once (before, it
/// answered "still being made by another boxd_fork call" for 10 minutes, and a drop
/// CREATE_UNCERTAIN). A fork that lands between is refused by name (boxd's names are unique),
/// answered CREATE_UNCERTAIN, and adopted by the call after.
#[test]
fn a_fork_that_timed_out_is_not_left_claimed() {
    let at = || raw_at(2 * FORK_CLAIM_MS);
    let landed = OURS.replace("oc-w1", "oc-fa").replace("vm_1", "vm_fa");
    for late in [None, Some(landed.as_str())] {
        let (mut fs, mut p) = parent_running();
        p.push_spawn_error(crate::caps::SpawnError::TimedOut);
        let e = call(&mut p, &mut fs, "boxd_fork", r#"{"work":"w1","forks":["fa"]}"#, at()).unwrap_err();
        assert!(e.code == Code::CreateUncertain && e.next.contains("boxd_fork for work 'w1' again"), "{e:?}");
        let fa = Ledger::new(&mut fs, "/l").require("fa").unwrap();
        assert_eq!((fa.state, fa.created_ms, fa.machine_id), (WorkState::Creating, 0, None), "released, still creating");
        let mut p = Scripted::default();
        p.push_exit(0, "1.18.33", "");
        p.push_exit(0, OURS, "");
        match late {
            // Landed late: adopted.
            Some(m) => p.push_exit(0, m, ""),
            // Not there: forked again at once.
            None => {
                p.push_fail(1, "error: VM 'oc-fa' not found");
                p.push_exit(0, r#"[{"name":"oc-w1","status":"running"}]"#, "");
                p.push_exit(0, r#"{"name":"oc-fa","id":"vm_fa","boot":"5ms"}"#, "");
            }
        }
        p.push_exit(0, "", "");
        if late.is_some() {
            // Taken up by its name: the guest's claim first.
            p.push_exit(0, crate::testing::CLAIMED, "");
        }
        p.push_exit(0, r#"{"ok":true,"work":"fa"}"#, "");
        let v = call(&mut p, &mut fs, "boxd_fork", r#"{"work":"w1"}"#, at()).unwrap();
        assert!(!v["next"].as_str().unwrap().contains("another boxd_fork call"), "{v:#}");
        let fa = Ledger::new(&mut fs, "/l").require("fa").unwrap();
        assert_eq!((fa.state, fa.machine_id.as_deref()), (WorkState::Open, Some("vm_fa")), "{late:?} {:?}", p.commands());
        assert_eq!(p.commands().iter().filter(|c| c.starts_with("machine fork")).count(), usize::from(late.is_none()), "{:?}", p.commands());
    }
}

/// A parent over its workSpendCeiling or past maxLifetimeHours forks nothing, and takes no
/// prompt: each fork would start spending and ageing from nothing with its transcript.
#[test]
fn a_parent_past_its_ceiling_or_lifetime_forks_nothing_and_takes_no_prompt() {
    const H: u64 = 3_600_000;
    let (now, created) = (10 * H, 1_000);
    for (options, code) in [(r#"{"workSpendCeiling":1}"#, Code::CeilingReached), (r#"{"maxLifetimeHours":2}"#, Code::LifetimeReached)] {
        let mut fs = open_work(None);
        // Running since `created`: 10 h at 0.218/h is 2.18, past a ceiling of 1.
        Ledger::new(&mut fs, "/l").update("w1", |w| {
            w.created_ms = created;
            w.open_run(created);
        }).unwrap();
        let ctx = || crate::tools::RawContext { now_ms: now, ..raw_context(options, "{}") };
        let mut p = Scripted::default();
        let e = call(&mut p, &mut fs, "boxd_fork", r#"{"work":"w1","forks":["fa"]}"#, ctx()).unwrap_err();
        assert!(e.code == code && e.message.contains("forks nothing") && e.next.contains("boxd_harvest"), "{options}: {e:?}");
        assert!(Ledger::new(&mut fs, "/l").read("fa").unwrap().is_none(), "{options}: no fork recorded");
        let e = call(&mut p, &mut fs, "boxd_submit", r#"{"work":"w1","prompt":"x"}"#, ctx()).unwrap_err();
        assert_eq!(e.code, code, "{options}: {e:?}");
        assert!(p.commands().is_empty(), "{options}: {:?}", p.commands());
        // Within both, the fork is made as ever.
        let (r, _) = fork_call(&mut open_work(None), &["oc-w1"], &["fa"], options, r#"{"work":"w1","forks":["fa"]}"#);
        let v = r.unwrap();
        assert!(v["queued"] == json!([]) && v["forks"].to_string().contains("\"fa\""), "{options}: {v}");
    }
}
