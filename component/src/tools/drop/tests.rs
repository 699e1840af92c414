//! boxd_drop's unit tests, with doubles for boxd and the files.

use super::*;
use crate::ledger::GitRecord;
use crate::testing::{open_work as work_with, raw_context, Scripted, OURS};
use crate::tools::{call, RawContext};

fn raw() -> RawContext {
    raw_context("{}", "{}")
}

#[test]
fn drop_checks_the_live_tree_and_refuses_a_change_the_patch_does_not_hold() {
    let mut fs = work_with(Some(GitRecord { dirty: false, ..Default::default() }));
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_exit(0, r#"{"ok":true,"repo":true,"refs":{},"dirty":true,"diffSha256":"abc","changed":["README.md"],"untracked":[],"ignored":[]}"#, "");
    let e = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap_err();
    assert_eq!(e.code, Code::Dirty);
    assert!(e.message.contains("README.md"), "{}", e.message);
    assert_eq!(p.commands().len(), 2, "get and the sealing exec; nothing removed: {:?}", p.commands());
    assert!(p.commands()[1].contains("seal"), "{:?}", p.commands());
}

#[test]
fn a_bundle_or_patch_missing_or_damaged_in_the_ledger_refuses_the_drop_whatever_the_record_says() {
    use crate::encode::sha256_hex;
    let head = "0123456789abcdef0123456789abcdef01234567";
    let (bundle, patch) = (b"# v2 git bundle\n".as_slice(), b"diff".as_slice());
    let name = |kind: &str, bytes: &[u8], ext: &str| format!("{kind}-{}.{ext}", &sha256_hex(bytes)[..16]);
    let record = GitRecord {
        refs: [("HEAD".to_string(), head.to_string())].into_iter().collect(),
        bundle: Some(name("bundle", bundle, "bundle")),
        patch: Some(name("patch", patch, "diff")),
        patch_sha256: Some(sha256_hex(patch)),
        ..Default::default()
    };
    let sealed = format!(r#"{{"ok":true,"repo":true,"refs":{{"HEAD":"{head}"}},"dirty":true,"diffSha256":"{}","untracked":[],"ignored":[]}}"#, sha256_hex(patch));
    for (bundle_bytes, patch_bytes) in [(None, Some(patch)), (Some(bundle), None), (Some(b"damaged".as_slice()), Some(patch)), (Some(bundle), Some(b"damaged".as_slice()))] {
        let mut fs = work_with(Some(record.clone()));
        for (stored, bytes) in [(&record.bundle, bundle_bytes), (&record.patch, patch_bytes)] {
            if let Some(bytes) = bytes {
                fs.put(&format!("/l/works/w1/{}", stored.as_ref().unwrap()), bytes);
            }
        }
        let mut p = Scripted::default();
        p.push_exit(0, OURS, "");
        p.push_exit(0, &sealed, "");
        let e = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap_err();
        assert_eq!(e.code, Code::NotProven, "{e:?}");
        assert!(e.next.contains("boxd_harvest"), "{e:?}");
        assert_eq!(p.commands().len(), 2, "nothing removed: {:?}", p.commands());
    }
    // Both whole: the drop goes on.
    let mut fs = work_with(Some(record.clone()));
    fs.put(&format!("/l/works/w1/{}", record.bundle.as_ref().unwrap()), bundle);
    fs.put(&format!("/l/works/w1/{}", record.patch.as_ref().unwrap()), patch);
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_exit(0, &sealed, "");
    p.push_exit(0, r#"{"name":"oc-w1","status":"destroyed"}"#, "");
    assert_eq!(call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap()["dropped"], true);
}

#[test]
fn drop_removes_only_the_machine_the_ledger_recorded() {
    // Shared with the organisation: not ours to seal or remove.
    let mut fs = work_with(Some(GitRecord::default()));
    let mut p = Scripted::default();
    p.push_exit(0, r#"{"name":"oc-w1","id":"vm_1","status":"running","sharing":"shared","isolated":"no"}"#, "");
    let e = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap_err();
    assert_eq!(e.code, Code::MachineShared);
    assert_eq!(p.commands(), ["machine get oc-w1 --json"], "nothing was sealed or removed");
    p.requests.clear();
    p.push_exit(0, OURS, "");
    p.push_exit(0, r#"{"ok":true,"repo":true,"refs":{},"dirty":false,"untracked":[],"ignored":[]}"#, "");
    p.push_exit(0, r#"{"name":"oc-w1","status":"destroyed"}"#, "");
    let v = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap();
    assert_eq!(v["dropped"], true);
    assert_eq!(p.commands().len(), 3, "at most three boxd calls for a drop");
    assert_eq!(p.commands().last().unwrap(), "machine remove oc-w1 -y --json");
}

#[test]
fn a_drop_says_where_a_file_an_interrupted_harvest_moved_aside_is() {
    let mut fs = work_with(Some(GitRecord::default()));
    let mut w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    w.temps.push(crate::ledger::TempFile { path: "/p/a.md.x-0.boxd-tmp".into(), at_ms: 0, dest: Some("/p/a.md".into()), sha256: None, ..Default::default() });
    Ledger::new(&mut fs, "/l").write(&w).unwrap();
    fs.put("/p/a.md.x-0.boxd-tmp.kept", b"the user's edit");
    fs.put("/p/a.md", b"written since");
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_exit(0, r#"{"ok":true,"repo":true,"refs":{},"dirty":false,"untracked":[],"ignored":[]}"#, "");
    p.push_exit(0, r#"{"name":"oc-w1","status":"destroyed"}"#, "");
    let v = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap();
    assert_eq!(v["dropped"], true);
    assert!(v["warnings"].to_string().contains("/p/a.md.x-0.boxd-tmp.kept"), "{v:#}");
    assert_eq!(fs.text("/p/a.md.x-0.boxd-tmp.kept").as_deref(), Some("the user's edit"), "never removed");
}

#[test]
fn a_remove_that_exits_0_saying_error_is_not_taken_for_done() {
    let mut fs = work_with(Some(GitRecord::default()));
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_exit(0, r#"{"ok":true,"repo":true,"refs":{},"dirty":false,"untracked":[],"ignored":[]}"#, "");
    p.push_exit(0, "", "error: VM is busy, try again\n");
    p.push_exit(0, OURS, "");
    let e = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap_err();
    assert_eq!(e.code, Code::BoxdFailed, "{e:?}");
    assert!(e.message.contains("VM is busy"), "the CLI's own words: {}", e.message);
    assert!(!Ledger::new(&mut fs, "/l").require("w1").unwrap().is_closed(), "the work is not closed");
}

#[test]
fn a_remove_that_finds_the_machine_already_gone_closes_only_when_boxd_agrees_it_is_gone() {
    let mut fs = work_with(Some(GitRecord::default()));
    let sealed = r#"{"ok":true,"repo":true,"refs":{},"dirty":false,"untracked":[],"ignored":[]}"#;
    // The remove fails, and the machine is still there: nothing is closed.
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_exit(0, sealed, "");
    p.push_fail(1, "error: VM is busy");
    p.push_exit(0, OURS, "");
    let e = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap_err();
    assert_eq!(e.code, Code::BoxdFailed, "{e:?}");
    assert_eq!(Ledger::new(&mut fs, "/l").require("w1").unwrap().state, WorkState::Dropping, "the next drop finishes it");
    // Another drop removed it after this one's checks: get and the listing agree it is gone.
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_exit(0, sealed, "");
    p.push_fail(1, "error: VM 'oc-w1' not found");
    p.push_fail(1, "error: VM 'oc-w1' not found");
    p.push_exit(0, "[]", "");
    let v = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap();
    assert_eq!(v["dropped"], true, "{v:#}");
    assert!(v.get("unrecovered").is_none(), "everything was checked before the machine went: {v:#}");
    assert!(Ledger::new(&mut fs, "/l").require("w1").unwrap().is_closed());
}

/// A save whose answer was lost may still be capturing the machine: drop refuses before
/// anything is sealed or removed, naming boxd_image to settle it, in its one `get`. A
/// gone machine has no capture left to abort: its work closes as any gone one does.
#[test]
fn a_drop_waits_for_a_save_recorded_as_under_way() {
    let mut fs = work_with(Some(GitRecord::default()));
    let mut w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    w.images_pending.push("img".into());
    Ledger::new(&mut fs, "/l").write(&w).unwrap();
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    let e = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap_err();
    assert!(e.code == Code::SessionBusy && e.message.contains("'img'") && e.next.contains("boxd_image for work 'w1' with name 'img' again"), "{e:?}");
    assert_eq!(p.commands(), ["machine get oc-w1 --json"], "nothing sealed or removed");
    assert_eq!(Ledger::new(&mut fs, "/l").require("w1").unwrap().state, WorkState::Open);
    let mut p = Scripted::default();
    p.push_fail(1, "error: VM 'oc-w1' not found");
    p.push_exit(0, "[]", "");
    assert_eq!(call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap()["dropped"], true);
}

#[test]
fn a_gone_work_closes_naming_what_was_not_recovered() {
    let mut fs = work_with(None);
    let mut w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    w.prompts.push(crate::ledger::Prompt { id: "p1".into(), admitted: true, ..Default::default() });
    Ledger::new(&mut fs, "/l").write(&w).unwrap();
    // A "not found" the listing contradicts closes nothing.
    let mut p = Scripted::default();
    p.push_fail(1, "error: VM 'oc-w1' not found");
    p.push_exit(0, r#"[{"name":"oc-w1","status":"running"}]"#, "");
    let e = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap_err();
    assert_eq!(e.code, Code::BoxdFailed, "{e:?}");
    assert_eq!(Ledger::new(&mut fs, "/l").require("w1").unwrap().state, WorkState::Open);
    let mut p = Scripted::default();
    p.push_fail(1, "error: VM 'oc-w1' not found");
    p.push_exit(0, "[]", "");
    let v = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap();
    assert_eq!(v["dropped"], true);
    assert_eq!(v["unrecovered"]["prompts"], json!(["p1"]));
    assert!(Ledger::new(&mut fs, "/l").require("w1").unwrap().is_closed());
}

/// A remove boxd answers with exit 0 and a JSON error did not remove anything: BOXD_FAILED
/// in boxd's words, and the work stays (dropping: the next drop finishes it), never closed
/// while its machine bills.
#[test]
fn a_remove_answered_with_a_json_error_is_not_taken_for_done() {
    let mut fs = work_with(Some(GitRecord::default()));
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_exit(0, r#"{"ok":true,"repo":true,"refs":{},"dirty":false,"untracked":[],"ignored":[]}"#, "");
    p.push_exit(0, r#"{"error":"internal: machine is busy"}"#, "");
    p.push_exit(0, OURS, "");
    let e = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap_err();
    assert!(e.code == Code::BoxdFailed && e.message.contains("machine is busy"), "{e:?}");
    assert_eq!(Ledger::new(&mut fs, "/l").require("w1").unwrap().state, WorkState::Dropping);
}

/// A gone machine's work whose proven session was deleted in the laptop's OpenCode since the
/// harvest: its drop imports it again from the ledger's export, as a live drop does, and
/// says so. One it cannot put back (no stored export either) is said, and the work still
/// closes: nothing is left on boxd to keep it open for.
#[test]
fn a_gone_works_drop_puts_a_deleted_proven_session_back_on_the_laptop() {
    use crate::ledger::{Proof, SessionProof};
    let session = json!({ "info": { "id": "ses_a", "slug": "s", "title": "boxd work w1", "version": "1.18.33", "time": { "created": 1, "updated": 1 } },
        "messages": [{ "info": { "id": "msg_1", "sessionID": "ses_a", "role": "user", "time": { "created": 1 } },
            "parts": [{ "id": "prt_1", "sessionID": "ses_a", "messageID": "msg_1", "type": "text", "text": "hi" }] }] });
    let bytes = serde_json::to_vec(&session).unwrap();
    let name = format!("export-{}.json", &crate::encode::sha256_hex(&bytes)[..16]);
    let digest = super::super::harvest::canonical_digest(session["messages"].as_array().unwrap());
    for stored in [true, false] {
        let mut fs = work_with(None);
        if stored {
            fs.put(&format!("/l/works/w1/{name}"), &bytes);
        }
        let mut w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        w.proofs = alloc::vec![Proof { prompts: 0, sessions: alloc::vec![SessionProof { id: "ses_a".into(), messages: 1, digest: digest.clone(), file: Some(name.clone()), ..Default::default() }], ..Default::default() }];
        Ledger::new(&mut fs, "/l").write(&w).unwrap();
        let mut p = Scripted::default();
        p.push_fail(1, "error: VM 'oc-w1' not found");
        p.push_exit(0, "[]", "");
        p.push_fail(1, "Error: Session not found: ses_a");
        if stored {
            p.push_exit(0, "Imported session: ses_a", "");
            p.push_exit(0, &session.to_string(), "");
        }
        let v = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap();
        assert_eq!((v["dropped"].as_bool(), v["machineWasGone"].as_bool()), (Some(true), Some(true)), "{v:#}");
        assert!(Ledger::new(&mut fs, "/l").require("w1").unwrap().is_closed());
        if stored {
            assert_eq!(v["restoredToLaptop"], json!(["ses_a"]), "{v:#}");
            assert_eq!(p.requests[3].args, ["import", &format!("/l/works/w1/{name}")]);
        } else {
            assert!(v.get("restoredToLaptop").is_none() && v["warnings"][0].as_str().unwrap().contains("could not be checked or put back"), "{v:#}");
        }
    }
}

/// A drop killed after its mark: boxd_sleep is refused under it (a drop cannot finish on a
/// machine asleep, and boxd_resume waits for the drop), and a drop that finds the machine
/// asleep all the same (boxd's idle bound) says when boxd_resume will take it.
#[test]
fn an_interrupted_drop_is_not_put_to_sleep_and_an_asleep_one_says_when_it_wakes() {
    let mut fs = work_with(None);
    let now = 5_000_000;
    Ledger::new(&mut fs, "/l").update("w1", |w| {
        w.state = WorkState::Dropping;
        w.dropping_ms = now - 60_000;
    }).unwrap();
    let at = || RawContext { now_ms: now, ..raw() };
    let mut p = Scripted::default();
    let e = call(&mut p, &mut fs, "boxd_sleep", r#"{"work":"w1"}"#, at()).unwrap_err();
    assert!(e.code == Code::SessionBusy && e.message.contains("not put to sleep") && e.next.contains("boxd_drop"), "{e:?}");
    assert!(p.commands().is_empty(), "{:?}", p.commands());
    p.push_exit(0, &OURS.replace("running", "hibernated"), "");
    let e = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, at()).unwrap_err();
    assert!(e.code == Code::MachineAsleep && e.next.contains(&format!("at {}", iso8601(now - 60_000 + crate::ledger::IN_FLIGHT_MS))), "{e:?}");
    // boxd_status says so (it showed the work running, no word of the drop).
    p.push_exit(0, r#"[{"name":"oc-w1","status":"hibernated"}]"#, "");
    p.push_exit(0, r#"[{"name":"opencode-golden","version":"v1","status":"ready"}]"#, "");
    let v = call(&mut p, &mut fs, "boxd_status", "{}", at()).unwrap();
    let row = &v["works"][0];
    assert!(row["warnings"].to_string().contains("boxd_drop of this work is under way or was interrupted"), "{v:#}");
    assert!(v["next"].as_str().unwrap().contains("boxd_drop for work 'w1' to finish"), "{v:#}");
}
