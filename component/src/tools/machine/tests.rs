//! The machine checks and creates every tool shares, with doubles for boxd and the files.

use super::*;
use crate::ledger::GitRecord;
use crate::testing::{open_work, raw_context, Scripted, OURS};
use crate::tools::call;

/// A golden snapshot boots a machine only once boxd holds it ready (or lists it with no
/// status, as an older CLI may): a capture still pending or one that failed is
/// SNAPSHOT_MISSING saying which, and a status this plugin does not know BOXD_FAILED.
#[test]
fn only_a_ready_golden_snapshot_boots_a_machine() {
    let ctx = crate::tools::context(raw_context("{}", "{}")).unwrap();
    let golden = |status: &str| {
        let mut p = Scripted::default();
        p.push_exit(0, &alloc::format!(r#"[{{"name":"opencode-golden","version":"v1"{status}}}]"#), "");
        let mut boxd = Boxd::new(&mut p, 10);
        require_golden(&mut boxd, &ctx, "oc-w1", Build::New { directory: "" })
    };
    assert_eq!(golden(r#","status":"ready""#), Ok(()));
    assert_eq!(golden(""), Ok(()));
    let e = golden(r#","status":"pending""#).unwrap_err();
    assert!(e.code == Code::SnapshotMissing && e.message.contains("still saving") && e.message.contains("no machine was created") && e.next.contains("in a minute"), "{e:?}");
    let e = golden(r#","status":"failed""#).unwrap_err();
    assert!(e.code == Code::SnapshotMissing && e.message.contains("as failed") && e.next.contains("another name"), "{e:?}");
    assert_eq!(golden(r#","status":"weird""#).unwrap_err().code, Code::BoxdFailed);
    let mut p = Scripted::default();
    p.push_exit(0, r#"[{"name":"opencode-golden","status":"pending"}]"#, "");
    let e = require_golden(&mut Boxd::new(&mut p, 10), &ctx, "oc-w1", Build::Rebuild).unwrap_err();
    assert!(e.message.contains("oc-w1, which is gone, was not rebuilt"), "{e:?}");
}

/// Every tool that acts on a work's machine, with arguments that pass their own checks.
const MACHINE_TOOLS: [(&str, &str); 7] = [
    ("boxd_job", r#"{"work":"w1"}"#),
    ("boxd_submit", r#"{"work":"w1","prompt":"hi"}"#),
    ("boxd_harvest", r#"{"work":"w1"}"#),
    ("boxd_sleep", r#"{"work":"w1"}"#),
    ("boxd_resume", r#"{"work":"w1"}"#),
    ("boxd_drop", r#"{"work":"w1"}"#),
    ("boxd_ensure", r#"{"work":"w1"}"#),
];

/// Each of MACHINE_TOOLS on the open work w1 (vm_1) whose `machine get` answers `got`:
/// it must fail after that one read (drop: end after it); its error and the record after it.
fn each_refuses_after_one_read(got: &str) -> Vec<(&'static str, ToolError, Work)> {
    let mut out = Vec::new();
    for (tool, args) in MACHINE_TOOLS {
        let mut fs = open_work(Some(GitRecord::default()));
        let mut p = Scripted::default();
        p.push_exit(0, got, "");
        let r = call(&mut p, &mut fs, tool, args, raw_context("{}", r#"{"opencodeVersion":"1.18.33"}"#));
        assert_eq!(p.commands(), ["machine get oc-w1 --json"], "{tool} made one read and nothing else");
        let Err(e) = r else { continue };
        out.push((tool, e, Ledger::new(&mut fs, "/l").require("w1").unwrap()));
    }
    out
}

/// Another machine under the work's name: ours is gone (names are unique). Every tool
/// but drop refuses it after its one read, naming boxd_drop (one step that leads
/// somewhere), and records the name taken with the run ended, so status and admission
/// stop counting that machine as this work's (before: NOT_OURS "start again under another
/// work id" from every tool, drop included, the run left open). Drop closes the work as a
/// gone machine's, sending boxd nothing for the other machine.
#[test]
fn every_tool_refuses_a_machine_with_another_id_before_touching_it() {
    const THEIRS: &str = r#"{"name":"oc-w1","id":"vm_new","status":"running","sharing":"private","isolated":"no"}"#;
    for (tool, e, w) in each_refuses_after_one_read(THEIRS) {
        if tool == "boxd_drop" {
            continue;
        }
        assert_eq!(e.code, Code::NotOurs, "{tool}: {e:?}");
        assert!(e.next.contains("call boxd_drop for work 'w1'") && !e.next.contains("another work id"), "{tool}: {e:?}");
        assert_eq!((w.name_taken_by.as_deref(), w.running_since(), w.state), (Some("vm_new"), None, WorkState::Open), "{tool}: {w:?}");
    }
    let mut fs = open_work(Some(GitRecord::default()));
    Ledger::new(&mut fs, "/l").update("w1", |w| w.prompts.push(crate::ledger::Prompt { id: "p1".into(), admitted: true, ..Default::default() })).unwrap();
    // One look is not enough to close it (a wrong answer would orphan our machine): the
    // first drop records the other id and refuses; the next, seeing it again, closes.
    let mut p = Scripted::default();
    p.push_exit(0, THEIRS, "");
    let e = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw_context("{}", "{}")).unwrap_err();
    assert!(e.code == Code::NotOurs && e.next.contains("call boxd_drop for work 'w1'"), "{e:?}");
    let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    assert_eq!((w.name_taken_by.as_deref(), w.state), (Some("vm_new"), WorkState::Open));
    let mut p = Scripted::default();
    p.push_exit(0, THEIRS, "");
    let v = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw_context("{}", "{}")).unwrap();
    assert_eq!(p.commands(), ["machine get oc-w1 --json"], "nothing sealed or removed on their machine");
    assert!(v["dropped"] == true && v["nameTakenBy"] == "vm_new" && v["unrecovered"]["prompts"] == serde_json::json!(["p1"]), "{v:#}");
    assert!(Ledger::new(&mut fs, "/l").require("w1").unwrap().is_closed());
}

/// One wrong answer (a fault, a confused CLI) showing another id under the name, then our
/// own id again: the mark goes and the run it ended is open again, so status, spend and
/// the caps count the machine once more.
#[test]
fn a_wrong_id_seen_once_is_undone_when_our_id_answers_again() {
    let mut fs = open_work(None);
    Ledger::new(&mut fs, "/l").update("w1", |w| w.open_run(1_000)).unwrap();
    let info = |id: &str| crate::boxd::MachineInfo { name: "oc-w1".into(), id: id.into(), status: "running".into(), sharing: "private".into(), ..Default::default() };
    let ctx = crate::tools::context(crate::testing::raw_at(60_000)).unwrap();
    let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    assert_eq!(check_owned(&mut Ledger::new(&mut fs, "/l"), &ctx, &w, &info("vm_wrong")).unwrap_err().code, Code::NotOurs);
    let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    assert_eq!((w.name_taken_by.as_deref(), w.running_since()), (Some("vm_wrong"), None));
    check_owned(&mut Ledger::new(&mut fs, "/l"), &ctx, &w, &info("vm_1")).unwrap();
    let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    assert_eq!((w.name_taken_by.as_deref(), w.running_since(), w.state), (None, Some(1_000), WorkState::Open), "{:?}", w.runs);
}

/// A status word boxd may add later is not "gone": resume would rebuild a machine that
/// still holds the work, drop would close it. Every tool refuses after its one read.
#[test]
fn every_tool_refuses_a_machine_in_a_state_it_does_not_know_before_touching_it() {
    for (tool, e, w) in each_refuses_after_one_read(r#"{"name":"oc-w1","id":"vm_1","status":"updating","sharing":"private","isolated":"no"}"#) {
        assert_eq!(e.code, Code::BoxdFailed, "{tool}: {e:?}");
        assert!(e.message.contains("\"updating\""), "{tool}: {}", e.message);
        assert_eq!((w.state, w.machine_id.as_deref()), (WorkState::Open, Some("vm_1")), "{tool}: the record is as it was");
    }
}

/// A gone machine is rebuilt through the one create: intent first, and a create whose
/// answer carries no id leaves the work creating for ensure to adopt.
/// boxd_resume of w1 whose machine is gone, rebuilt by a create that answers no id: the
/// scripted boxd after the call, and its refusal (CREATE_UNCERTAIN).
fn rebuilt_without_an_id(fs: &mut crate::testing::MemFiles) -> (Scripted, crate::errors::ToolError) {
    let mut p = Scripted::default();
    p.push_exit(0, "1.18.33", "");
    p.push_fail(1, "error: VM 'oc-w1' not found");
    p.push_exit(0, "[]", "");
    p.push_exit(0, r#"[{"name":"opencode-golden","version":"1","status":"ready"}]"#, "");
    p.push_exit(0, r#"{"name":"oc-w1"}"#, "");
    let e = call(&mut p, fs, "boxd_resume", r#"{"work":"w1"}"#, raw_context("{}", "{}")).unwrap_err();
    assert_eq!(e.code, Code::CreateUncertain, "{e:?}");
    (p, e)
}

#[test]
fn a_rebuild_without_an_id_stays_creating_until_ensure_adopts_it() {
    let mut fs = open_work(Some(GitRecord::default()));
    let (mut p, e) = rebuilt_without_an_id(&mut fs);
    assert!(e.message.contains("rebuilt oc-w1"), "{}", e.message);
    assert_eq!(p.commands()[2], "machine list --json", "admission reads what runs before the create");
    assert!(p.commands()[4].starts_with("machine new oc-w1 --from-snapshot opencode-golden"), "{:?}", p.commands());
    let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    assert_eq!((w.state, w.machine_id), (WorkState::Creating, None));
    p.push_exit(0, OURS, "");
    p.push_exit(0, r#"{"user_id":"usr_1","active_org":null}"#, ""); // the account it is in
    p.push_exit(0, "", "");
    p.push_exit(0, crate::testing::CLAIMED, "");
    p.push_exit(0, r#"{"ok":true}"#, "");
    let v = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, raw_context("{}", r#"{"opencodeVersion":"1.18.33"}"#)).unwrap();
    assert_eq!((v["adopted"].as_bool(), v["created"].as_bool(), v["machineId"].as_str()), (Some(true), Some(false), Some("vm_1")));
    // The account it is in is kept; the adopted machine is not known to hold the helper:
    // uploaded first, then claimed (taken up by its name), then one prepare.
    let c = p.commands();
    let last = &c[c.len() - 5..];
    assert!(last[0] == "machine get oc-w1 --json" && last[1] == "auth --json" && last[2].contains("upload.tmp") && last[3].contains("claim --work w1") && last[4].contains("prepare --work w1"), "{last:?}");
    assert_eq!(Ledger::new(&mut fs, "/l").require("w1").unwrap().account.as_deref(), Some("usr_1/-"));
}

/// A rebuilt machine starts from a new work tree, and the next harvest records that one:
/// the gone tree's bundle and patch stay named in the record (`earlier_git`, with a warning
/// naming them), in the rebuild's intent write, and a rebuild asked again keeps them once.
#[test]
fn a_rebuild_keeps_the_gone_trees_bundle_and_patch_named() {
    let gone = GitRecord { head: "c0ffee".into(), bundle: Some("bundle-0123456789abcdef.bundle".into()), patch: Some("patch-0123456789abcdef.diff".into()), ..Default::default() };
    let mut fs = open_work(Some(gone.clone()));
    for _ in 0..2 {
        rebuilt_without_an_id(&mut fs);
    }
    let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    assert_eq!((w.git, w.earlier_git), (None, alloc::vec![gone]), "the new tree has no harvest yet; the gone one's record is kept once");
    let warned: Vec<&String> = w.warnings.iter().filter(|t| t.contains("bundle-0123456789abcdef.bundle and patch-0123456789abcdef.diff")).collect();
    assert_eq!(warned.len(), 1, "{:?}", w.warnings);
}

/// Files a harvest was asked for and never brought home went with the gone tree: once it
/// is rebuilt they are owed no more (the drop refused over files no machine held, and
/// boxd_status said they were still on the machine), and a warning names them once.
#[test]
fn a_rebuild_names_the_owed_files_that_went_with_the_gone_tree() {
    let mut fs = open_work(None);
    Ledger::new(&mut fs, "/l").update("w1", |w| w.owed = alloc::vec!["SUMMARY.md".into(), "out/r.csv".into()]).unwrap();
    for _ in 0..2 {
        rebuilt_without_an_id(&mut fs);
    }
    let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    assert!(w.owed.is_empty(), "{:?}", w.owed);
    let warned: Vec<&String> = w.warnings.iter().filter(|t| t.contains("never came home") && t.contains("SUMMARY.md, out/r.csv")).collect();
    assert_eq!(warned.len(), 1, "{:?}", w.warnings);
}

/// A create boxd refused made nothing: the work does not stay "creating", so a machine
/// someone else later makes under its name is refused, never adopted and prepared.
#[test]
fn a_refused_create_is_withdrawn_and_a_later_machine_under_the_name_is_not_adopted() {
    let mut fs = crate::testing::MemFiles::new(&["/p", "/l"]);
    let facts = r#"{"opencodeVersion":"1.18.33"}"#;
    let mut p = Scripted::default();
    p.push_fail(1, "error: VM 'oc-w1' not found");
    p.push_exit(0, "[]", "");
    p.push_exit(0, r#"[{"name":"opencode-golden","version":"1","status":"ready"}]"#, "");
    p.push_fail(1, "error: request failed: quota exceeded");
    p.push_fail(1, "error: VM 'oc-w1' not found");
    let e = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, raw_context("{}", facts)).unwrap_err();
    assert_eq!(e.code, Code::QuotaReached, "{e:?}");
    let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    assert_eq!((w.state, w.machine_id), (WorkState::Open, None), "the create's intent is withdrawn");
    let mut p = Scripted::default();
    p.push_exit(0, r#"{"name":"oc-w1","id":"vm_someone","status":"running","sharing":"private","isolated":"no"}"#, "");
    let e = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, raw_context("{}", facts)).unwrap_err();
    assert_eq!(e.code, Code::NotOurs, "{e:?}");
    assert_eq!(p.commands(), ["machine get oc-w1 --json"], "nothing uploaded, prepared or recorded");
    // Any other failure may have made it (boxd failing after the create): uncertain, so
    // the work stays creating for ensure to adopt, with no look spent.
    let (mut fs, commands) = uncertain_create("error: internal server error");
    assert_eq!(commands.len(), 4, "{commands:?}");
    assert_eq!(Ledger::new(&mut fs, "/l").require("w1").unwrap().state, WorkState::Creating);
}

/// A first ensure of w1 whose `machine new` fails with `error`, on an empty ledger: the
/// files after it and the commands it sent.
fn uncertain_create(error: &str) -> (crate::testing::MemFiles, alloc::vec::Vec<alloc::string::String>) {
    let mut fs = crate::testing::MemFiles::new(&["/p", "/l"]);
    let mut p = Scripted::default();
    p.push_fail(1, "error: VM 'oc-w1' not found");
    p.push_exit(0, "[]", "");
    p.push_exit(0, r#"[{"name":"opencode-golden","version":"1","status":"ready"}]"#, "");
    p.push_fail(1, error);
    call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, raw_context("{}", r#"{"opencodeVersion":"1.18.33"}"#)).unwrap_err();
    (fs, p.commands())
}

/// A create whose answer never came leaves the work creating; the machine a later ensure
/// finds under the name is adopted only when it was made the way that create makes one
/// (from the golden snapshot, with the idle bound). One someone else made there since (any
/// other source or bound) is refused untouched, and the intent withdrawn.
#[test]
fn an_uncertain_create_adopts_only_a_machine_made_like_ours() {
    let facts = r#"{"opencodeVersion":"1.18.33"}"#;
    let uncertain = || {
        let (mut fs, _) = uncertain_create("error: connection reset by peer");
        assert_eq!(Ledger::new(&mut fs, "/l").require("w1").unwrap().state, WorkState::Creating);
        fs
    };
    let theirs = [
        r#"{"name":"oc-w1","id":"vm_x","status":"running","sharing":"private","isolated":"no","source":"standalone","auto_hibernate":"1800s"}"#,
        r#"{"name":"oc-w1","id":"vm_x","status":"running","sharing":"private","isolated":"no","source":"snapshot/other-image","auto_hibernate":"1800s"}"#,
        r#"{"name":"oc-w1","id":"vm_x","status":"running","sharing":"private","isolated":"no","source":"snapshot/opencode-golden","auto_hibernate":"60s"}"#,
    ];
    for machine in theirs {
        let mut fs = uncertain();
        let mut p = Scripted::default();
        p.push_exit(0, machine, "");
        let e = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, raw_context("{}", facts)).unwrap_err();
        assert!(e.code == Code::NotOurs && e.message.contains("someone else made it") && e.next.contains("another work id"), "{machine}: {e:?}");
        assert_eq!(p.commands(), ["machine get oc-w1 --json"], "{machine}: nothing uploaded, prepared or recorded");
        let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        assert_eq!((w.state, w.machine_id), (WorkState::Open, None), "{machine}: the intent is withdrawn");
        // And no later ensure adopts it.
        let mut p = Scripted::default();
        p.push_exit(0, machine, "");
        assert_eq!(call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, raw_context("{}", facts)).unwrap_err().code, Code::NotOurs);
    }
    let ours = r#"{"name":"oc-w1","id":"vm_1","status":"running","sharing":"private","isolated":"no","source":"snapshot/opencode-golden:v1","auto_hibernate":"1800s"}"#;
    let mut fs = uncertain();
    let mut p = Scripted::default();
    for a in [ours, r#"{"user_id":"usr_1","active_org":null}"#, "", crate::testing::CLAIMED, r#"{"ok":true}"#] {
        p.push_exit(0, a, "");
    }
    let v = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, raw_context("{}", facts)).unwrap();
    assert_eq!((v["adopted"].as_bool(), v["machineId"].as_str()), (Some(true), Some("vm_1")), "{v:#}");
}

/// A rebuilt machine that still owes the proven transcript: every tool that would use
/// or copy its guest refuses, naming boxd_resume, after its one state read.
#[test]
fn a_machine_owing_the_transcript_is_neither_used_nor_copied() {
    for (tool, args, answers) in [
        ("boxd_submit", r#"{"work":"w1","prompt":"hi"}"#, &[OURS][..]),
        ("boxd_harvest", r#"{"work":"w1"}"#, &[OURS]),
        ("boxd_image", r#"{"work":"w1","name":"snap-1"}"#, &[OURS, "[]"]),
        ("boxd_fork", r#"{"work":"w1","forks":["f1"]}"#, &[OURS]),
    ] {
        let mut fs = open_work(Some(GitRecord::default()));
        Ledger::new(&mut fs, "/l").update("w1", |w| w.restore_pending = true).unwrap();
        let mut p = Scripted::default();
        for a in answers {
            p.push_exit(0, a, "");
        }
        let e = call(&mut p, &mut fs, tool, args, raw_context("{}", r#"{"opencodeVersion":"1.18.33"}"#)).unwrap_err();
        assert_eq!(e.code, Code::MachineGone, "{tool}: {e:?}");
        assert!(e.message.contains("not on it yet") && e.next.contains("boxd_resume"), "{tool}: {e:?}");
        assert_eq!(p.commands().len(), answers.len(), "{tool}: {:?}", p.commands());
    }
}

/// A machine no prompt has reached that boots another OpenCode than the laptop's is
/// removed and the work closed; one a prompt has reached is left for the user.
#[test]
fn a_guest_version_mismatch_removes_only_a_machine_no_prompt_reached() {
    const MISMATCH: &str = r#"{"ok":false,"error":"GUEST_VERSION","message":"the machine has OpenCode 1.18.33 but the laptop runs 1.19.0"}"#;
    // (prompted, taken up by its name): one taken up by its name may be another install's
    // (two creates that crossed), so it is not removed either.
    for (prompted, by_name) in [(false, false), (true, false), (false, true)] {
        let mut fs = open_work(Some(GitRecord::default()));
        let mut w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        if prompted {
            w.prompts.push(crate::ledger::Prompt { id: "p1".into(), admitted: true, ..Default::default() });
        }
        w.taken_by_name = by_name;
        Ledger::new(&mut fs, "/l").write(&w).unwrap();
        let prompted = prompted || by_name;
        let mut p = Scripted::default();
        p.push_exit(0, OURS, "");
        p.push_exit(0, "", "");
        if by_name {
            p.push_exit(0, crate::testing::CLAIMED, "");
        }
        p.push_exit(3, MISMATCH, "");
        p.push_exit(0, r#"{"name":"oc-w1","status":"destroyed"}"#, "");
        let e = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, raw_context("{}", r#"{"opencodeVersion":"1.19.0"}"#)).unwrap_err();
        assert_eq!(e.code, Code::GuestVersion, "{e:?}");
        let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        let removed = p.commands().last().map(String::as_str) == Some("machine remove oc-w1 -y --json");
        if prompted {
            assert!(!removed, "{:?}", p.commands());
            assert_eq!(w.state, WorkState::Open);
        } else {
            assert!(removed, "{:?}", p.commands());
            assert!(e.message.contains("1.19.0") && e.message.contains("oc-w1 was removed and work 'w1' closed"), "{}", e.message);
            assert_eq!(w.state, WorkState::Closed);
        }
    }
}

/// A rebuild whose OpenCode differs (the golden image changed since the work began)
/// holds nothing of the work yet: it is removed and the work stays open, so the next
/// resume rebuilds it; resume and ensure both.
#[test]
fn a_rebuild_that_boots_another_opencode_is_removed_and_the_work_stays_open() {
    const MISMATCH: &str = r#"{"ok":false,"error":"GUEST_VERSION","message":"the machine has OpenCode 1.18.99 but the laptop runs 1.18.33"}"#;
    for tool in ["boxd_ensure", "boxd_resume"] {
        let mut fs = open_work(Some(GitRecord::default()));
        let mut w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        w.prompts.push(crate::ledger::Prompt { id: "p1".into(), admitted: true, ..Default::default() });
        w.restore_pending = true;
        Ledger::new(&mut fs, "/l").write(&w).unwrap();
        let mut p = Scripted::default();
        p.push_exit(0, OURS, "");
        p.push_exit(0, "", ""); // resume: set the idle bound; ensure: the helper's upload
        if tool == "boxd_resume" {
            p.push_exit(0, "", ""); // the helper's upload
        }
        p.push_exit(3, MISMATCH, "");
        p.push_exit(0, r#"{"name":"oc-w1","status":"destroyed"}"#, "");
        let e = call(&mut p, &mut fs, tool, r#"{"work":"w1"}"#, raw_context("{}", r#"{"opencodeVersion":"1.18.33"}"#)).unwrap_err();
        assert_eq!(e.code, Code::GuestVersion, "{tool}: {e:?}");
        assert_eq!(p.commands().last().map(String::as_str), Some("machine remove oc-w1 -y --json"), "{tool}: {:?}", p.commands());
        assert!(e.message.contains("was removed") && e.next.contains("boxd_resume"), "{tool}: {e:?}");
        let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        assert_eq!(w.state, WorkState::Open, "{tool}");
        assert!(w.restore_pending, "{tool}: the transcript is still owed to the next rebuild");
    }
    // An OpenCode that could not be asked (a timeout on a busy machine) is not final:
    // the rebuild stays.
    let mut fs = open_work(Some(GitRecord::default()));
    let mut w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    w.restore_pending = true;
    Ledger::new(&mut fs, "/l").write(&w).unwrap();
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_exit(0, "", "");
    p.push_exit(0, "", "");
    p.push_exit(3, r#"{"ok":false,"error":"GUEST_FAILED","message":"opencode --version did not answer within 60 s"}"#, "");
    let e = call(&mut p, &mut fs, "boxd_resume", r#"{"work":"w1"}"#, raw_context("{}", r#"{"opencodeVersion":"1.18.33"}"#)).unwrap_err();
    assert_eq!(e.code, Code::GuestFailed, "{e:?}");
    assert!(!p.commands().iter().any(|c| c.starts_with("machine remove")), "{:?}", p.commands());
}

/// Once a tool saw another machine under a work's name, boxd_status shows that row as not
/// ours (no burn, next boxd_drop) rather than running with burn and "call boxd_harvest",
/// and admission does not count it: with maxRunningPerLedger 1 another work's create goes
/// past the caps (before: CAP_REACHED naming w1, which no tool could then close).
#[test]
fn a_name_seen_holding_another_machine_is_not_counted_as_this_works_running_one() {
    let mut fs = open_work(Some(GitRecord::default()));
    Ledger::new(&mut fs, "/l").update("w1", |w| w.open_run(0)).unwrap();
    let mut p = Scripted::default();
    p.push_exit(0, r#"{"name":"oc-w1","id":"vm_new","status":"running","sharing":"private","isolated":"no"}"#, "");
    let e = call(&mut p, &mut fs, "boxd_job", r#"{"work":"w1"}"#, crate::testing::raw_at(60_000)).unwrap_err();
    assert_eq!(e.code, Code::NotOurs);
    let mut p = Scripted::default();
    p.push_exit(0, r#"[{"name":"oc-w1","status":"running"}]"#, "");
    p.push_exit(0, r#"[{"name":"opencode-golden","version":"v1","status":"ready"}]"#, "");
    let v = call(&mut p, &mut fs, "boxd_status", "{}", crate::testing::raw_at(3_600_000)).unwrap();
    let row = &v["works"][0];
    assert_eq!((row["state"].as_str(), row["spend"]["burnPerHour"].as_f64()), (Some("notOurs"), Some(0.0)), "{v:#}");
    assert_eq!(v["spend"]["burnPerHour"].as_f64(), Some(0.0), "{v:#}");
    assert!(row["warnings"].to_string().contains("now another machine (id vm_new)"), "{row:#}");
    assert!(v["next"].as_str().unwrap().contains("boxd_drop for work 'w1'"), "{v:#}");
    let mut p = Scripted::default();
    p.push_fail(1, "error: VM 'oc-w9' not found");
    p.push_exit(0, r#"[{"name":"oc-w1","status":"running"}]"#, "");
    p.push_exit(0, "[]", "");
    let e = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w9"}"#, raw_context(r#"{"maxRunningPerLedger":1}"#, r#"{"opencodeVersion":"1.18.33"}"#)).unwrap_err();
    assert_eq!(e.code, Code::SnapshotMissing, "past the caps: {e:?}");
}
