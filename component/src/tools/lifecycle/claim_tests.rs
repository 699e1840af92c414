//! A machine taken up by its name alone (a create whose answer never came) is proven no
//! other ledger's by its guest's first prepare, before anything of the work goes to it.

use super::*;
use crate::testing::{raw_context, MemFiles, Scripted};
use crate::tools::call;

const FACTS: &str = r#"{"opencodeVersion":"1.18.33"}"#;
/// Made like ours: from the golden snapshot, with the default idle bound.
const LIKE_OURS: &str = r#"{"name":"oc-w1","id":"vm_other","status":"running","source":"snapshot/opencode-golden:v1","auto_hibernate":"1800s","sharing":"private","isolated":"no"}"#;
const CLAIM_REFUSED: &str = r#"{"ok":false,"error":"NOT_OURS","message":"work w1 on this machine was prepared by another ledger (its OpenCode server runs with another password): this is not the machine this ledger's create made"}"#;

/// w1 with a create recorded that never answered.
fn creating() -> MemFiles {
    let mut fs = MemFiles::new(&["/p", "/l"]);
    Ledger::new(&mut fs, "/l")
        .upsert("w1", |_| {
            let mut w = Work::new("w1", "/p", "2026-01-01T00:00:00Z");
            w.state = WorkState::Creating;
            Ok(Some(w))
        })
        .unwrap();
    fs
}

/// The ensure that takes oc-w1 up by its name: get, the account, the upload, then the
/// claim answering `claimed` (and, when it agrees, the prepare).
fn ensure_by_name(fs: &mut MemFiles, claimed: (i32, &str)) -> (Result<Value, ToolError>, Scripted) {
    let mut p = Scripted::default();
    p.push_exit(0, LIKE_OURS, "");
    p.push_exit(0, r#"{"user_id":"usr_1","active_org":null}"#, "");
    p.push_exit(0, "", "");
    p.push_exit(claimed.0, claimed.1, "");
    if claimed.0 == 0 {
        p.push_exit(0, r#"{"ok":true}"#, "");
    }
    let r = call(&mut p, fs, "boxd_ensure", r#"{"work":"w1"}"#, raw_context("{}", FACTS));
    (r, p)
}

#[test]
fn a_machine_another_ledger_prepared_is_not_taken_up_by_its_name() {
    let mut fs = creating();
    let (r, p) = ensure_by_name(&mut fs, (3, CLAIM_REFUSED));
    let e = r.unwrap_err();
    assert!(e.code == Code::NotOurs && e.message.contains("another ledger") && e.next.contains("Leave oc-w1 alone"), "{e:?}");
    // The claim carries the password's digest; the password itself (a prepare's stdin)
    // never went to their machine.
    let password = Ledger::new(&mut fs, "/l").password("w1").unwrap().unwrap();
    let claim = p.requests.last().unwrap().args.join(" ");
    assert!(claim.contains(&format!("claim --work w1 --sha256 {}", crate::encode::sha256_hex(password.as_bytes()))), "{claim}");
    assert!(p.requests.iter().all(|r| !r.args.join(" ").contains("prepare") && r.stdin.as_deref().is_none_or(|s| !s.windows(password.len()).any(|w| w == password.as_bytes()))), "{:?}", p.commands());
    // The id is forgotten and the intent withdrawn: no later call takes it up.
    let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    assert_eq!((w.state, w.machine_id.as_deref(), w.taken_by_name), (WorkState::Open, None, false));
    assert!(w.runs.is_empty(), "their machine's run bills nothing here: {:?}", w.runs);
    let mut p = Scripted::default();
    p.push_exit(0, LIKE_OURS, "");
    let e = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, raw_context("{}", FACTS)).unwrap_err();
    assert_eq!(e.code, Code::NotOurs, "{e:?}");
    assert_eq!(p.commands(), ["machine get oc-w1 --json"], "nothing more reached their machine");
}

#[test]
fn a_claim_the_guest_accepts_is_proven_once() {
    let mut fs = creating();
    let (r, p) = ensure_by_name(&mut fs, (0, r#"{"ok":true}"#));
    assert_eq!(r.unwrap()["adopted"], true);
    let c = p.commands();
    assert!(c[c.len() - 2].contains("claim --work w1") && c[c.len() - 1].contains("prepare --work w1"), "{c:?}");
    let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    assert_eq!((w.machine_id.as_deref(), w.taken_by_name, w.runs.len()), (Some("vm_other"), false, 1));
    // The next prepare of the work's own machine claims nothing.
    let mut p = Scripted::default();
    p.push_exit(0, LIKE_OURS, "");
    p.push_exit(0, r#"{"ok":true}"#, "");
    call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, raw_context("{}", FACTS)).unwrap();
    assert!(p.commands().iter().all(|c| !c.contains("claim --work")), "{:?}", p.commands());
}

/// A drop that took the work's machine for gone (boxd showed another id under its name)
/// closed it; its own machine, the recorded id, found there again is taken up again, with
/// the prompts the drop named unrecovered harvestable. Another id stays someone else's.
#[test]
fn a_closed_work_whose_own_machine_is_found_again_is_reopened_on_it() {
    for (found, reopened) in [(crate::testing::OURS, true), (LIKE_OURS, false)] {
        let mut fs = crate::testing::open_work(None);
        Ledger::new(&mut fs, "/l")
            .update("w1", |w| {
                w.state = WorkState::Closed;
                w.unrecovered = alloc::vec!["p1".into()];
                w.name_taken_by = Some("vm_other".into());
                w.settled = Some(Default::default());
            })
            .unwrap();
        let mut p = Scripted::default();
        p.push_exit(0, found, "");
        p.push_exit(0, "", "");
        p.push_exit(0, r#"{"ok":true}"#, "");
        let r = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, raw_context("{}", FACTS));
        let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        if reopened {
            let v = r.unwrap();
            assert_eq!((v["machineId"].as_str(), v["adopted"].as_bool()), (Some("vm_1"), Some(false)), "{v}");
            assert_eq!((w.state, w.unrecovered.len(), w.settled.is_none(), w.name_taken_by.as_deref()), (WorkState::Open, 0, true, None));
            assert!(w.warnings.iter().any(|m| m.contains("reopened on oc-w1") && m.contains("p1")), "{:?}", w.warnings);
            // A work a drop closed normally is not reopened on a machine under its name, nor
            // one whose machine boxd lists as being removed: a fresh work, or NOT_OURS.
            for (normal, found) in [(true, crate::testing::OURS.to_string()), (false, crate::testing::OURS.replace("running", "destroying"))] {
                let mut fs = crate::testing::open_work(None);
                Ledger::new(&mut fs, "/l").update("w1", |w| {
                    w.state = WorkState::Closed;
                    w.name_taken_by = (!normal).then(|| "vm_other".into());
                }).unwrap();
                let mut p = Scripted::default();
                p.push_exit(0, &found, "");
                let r = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, raw_context("{}", FACTS));
                assert!(r.is_err() && Ledger::new(&mut fs, "/l").require("w1").unwrap().is_closed() || r.is_ok_and(|v| v["created"] == true), "{normal} {found}");
            }
        } else {
            assert_eq!(r.unwrap_err().code, Code::NotOurs);
            assert_eq!(p.commands(), ["machine get oc-w1 --json"]);
        }
    }
}

/// A tool other than boxd_ensure that finds a machine under the name of a work whose create
/// (or rebuild) never answered: it may be the work's own, so CREATE_UNCERTAIN naming
/// boxd_ensure, which takes it up once the guest agrees (it said NOT_OURS of it).
#[test]
fn a_machine_a_create_may_have_made_is_uncertain_outside_ensure() {
    for tool in ["boxd_job", "boxd_submit", "boxd_resume"] {
        let mut fs = creating();
        let mut p = Scripted::default();
        p.push_exit(0, LIKE_OURS, "");
        let args = if tool == "boxd_submit" { r#"{"work":"w1","prompt":"x"}"# } else { r#"{"work":"w1"}"# };
        let e = call(&mut p, &mut fs, tool, args, raw_context("{}", FACTS)).unwrap_err();
        assert!(e.code == Code::CreateUncertain && e.next.contains("boxd_ensure for work 'w1'"), "{tool}: {e:?}");
    }
}

/// Until its guest agrees, a machine taken up by its name is used by no tool but the ones
/// that claim it (boxd_ensure, boxd_resume): nothing of the work goes to it, nothing is done
/// to it (it may be another install's machine).
#[test]
fn a_machine_not_claimed_yet_is_used_by_no_other_tool() {
    let tools = [
        ("boxd_job", r#"{"work":"w1"}"#),
        ("boxd_submit", r#"{"work":"w1","prompt":"x"}"#),
        ("boxd_harvest", r#"{"work":"w1"}"#),
        ("boxd_sleep", r#"{"work":"w1"}"#),
        ("boxd_image", r#"{"work":"w1","name":"img"}"#),
        ("boxd_fork", r#"{"work":"w1","forks":["fa"]}"#),
        ("boxd_drop", r#"{"work":"w1"}"#),
    ];
    for (tool, args) in tools {
        let mut fs = crate::testing::open_work(None);
        Ledger::new(&mut fs, "/l").update("w1", |w| w.taken_by_name = true).unwrap();
        let mut p = Scripted::default();
        for answer in [crate::testing::OURS, "[]", crate::testing::OURS] {
            p.push_exit(0, answer, "");
        }
        let e = call(&mut p, &mut fs, tool, args, raw_context("{}", FACTS)).unwrap_err();
        assert!(e.code == Code::CreateUncertain && e.next.contains("boxd_ensure for work 'w1'"), "{tool}: {e:?}");
        assert!(p.commands().iter().all(|c| c.starts_with("machine get") || c.starts_with("machine list") || c.starts_with("snapshots list")), "{tool}: {:?}", p.commands());
    }
}
