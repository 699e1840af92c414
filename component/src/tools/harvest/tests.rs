//! Unit tests of boxd_harvest's phases: the proof's count, the import's checks.

use super::*;

fn session(id: &str, parent: Option<&str>, n: usize) -> Value {
    let msgs: Vec<Value> = (0..n).map(|i| json!({ "info": { "id": format!("msg_{id}_{i}"), "role": "user" }, "parts": [{ "id": format!("prt_{i}"), "type": "text", "text": "hi" }] })).collect();
    json!({ "info": { "id": id, "parentID": parent }, "messages": msgs })
}

#[test]
fn a_proof_covers_the_prompts_the_guest_admitted_whatever_order_the_ledger_holds_them_in() {
    use crate::ledger::{Proof, Prompt};
    let prompt = |id: &str| Prompt { id: id.into(), admitted: true, ..Default::default() };
    let mut w = Work { work: "w1".into(), ..Default::default() };
    w.prompts = alloc::vec![prompt("p0"), prompt("pa"), prompt("pb")];
    w.proofs.push(Proof { prompts: 1, ..Default::default() });
    let known = |pairs: &[(&str, bool)]| pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>();
    let ids = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let all = ids(&["p0", "pa", "pb"]);
    // Two submits at once: the ledger holds pa then pb, the guest admitted pb then pa
    // (pa is its newest). Both are covered; the newest's position alone gave 2 of 3.
    assert_eq!(covered(&w, &known(&[("pa", true), ("pb", true)]), &all, false), 3);
    // pa was still on its way when the guest exported: pa is not covered, and so
    // neither is pb after it, though the ledger has both admitted by the time the proof
    // is written (the newest's position alone gave 3).
    assert_eq!(covered(&w, &known(&[("pa", false), ("pb", true)]), &all, false), 1);
    // Not asked about (older than the ones asked): the ledger's word from before the
    // export counts, and only that.
    assert_eq!(covered(&w, &known(&[("pb", true)]), &all, false), 3);
    assert_eq!(covered(&w, &known(&[("pb", true)]), &ids(&["p0", "pb"]), false), 1);
    // A guest that admitted none covers what the last proof did; a proof count past a
    // list that shrank since is cut to it.
    assert_eq!(covered(&w, &known(&[("pa", false), ("pb", false)]), &all, false), 1);
    w.proofs.push(Proof { prompts: 7, ..Default::default() });
    assert_eq!(covered(&w, &known(&[]), &all, false), 3);
}

#[test]
fn a_session_another_work_proved_is_never_imported_from_this_works_guest() {
    use crate::ledger::{Proof, SessionProof};
    use crate::testing::{raw_context, MemFiles, Scripted};
    let ctx = crate::tools::context(raw_context("{}", "{}")).unwrap();
    let mut files = MemFiles::new(&["/p", "/l"]);
    let mut w0 = Work { work: "w0".into(), machine: "oc-w0".into(), schema: crate::ledger::SCHEMA, ..Default::default() };
    w0.proofs.push(Proof { prompts: 1, sessions: alloc::vec![SessionProof { id: "ses_theirs".into(), ..Default::default() }], ..Default::default() });
    let w1 = Work { work: "w1".into(), machine: "oc-w1".into(), schema: crate::ledger::SCHEMA, ..Default::default() };
    Ledger::new(&mut files, "/l").write(&w0).unwrap();
    Ledger::new(&mut files, "/l").write(&w1).unwrap();
    let export = json!({ "sessions": [session("ses_theirs", None, 2)] });
    let sessions = parse_export(&export).unwrap();
    let mut programs = Scripted::default();
    let mut env = Env { programs: &mut programs, files: &mut files, ctx: &ctx };
    let e = import_and_prove(&mut env, &w1, &sessions).unwrap_err();
    assert_eq!(e.code, Code::ExportInvalid, "{e:?}");
    assert!(e.message.contains("ses_theirs") && e.message.contains("work 'w0'"), "{}", e.message);
    assert!(programs.requests.is_empty(), "no laptop opencode ran: nothing was imported");
}

#[test]
fn a_failed_import_is_forgiven_only_when_the_laptops_copy_matches_anyway() {
    use crate::testing::{raw_context, MemFiles, Scripted};
    let ctx = crate::tools::context(raw_context("{}", "{}")).unwrap();
    let w1 = Work { work: "w1".into(), machine: "oc-w1".into(), directory: "/p".into(), schema: crate::ledger::SCHEMA, ..Default::default() };
    let full = session("ses_a", None, 2);
    let sessions = parse_export(&json!({ "sessions": [full.clone()] })).unwrap();
    let run = |import_fails: bool, back: Option<Value>| {
        let mut files = MemFiles::new(&["/p", "/l"]);
        Ledger::new(&mut files, "/l").write(&w1).unwrap();
        let mut programs = Scripted::default();
        if import_fails { programs.push_fail(1, "Error: database is locked") } else { programs.push_exit(0, "", "") }
        match back {
            Some(v) => programs.push_exit(0, &v.to_string(), ""),
            None => programs.push_fail(1, "Error: Session not found"),
        }
        let mut env = Env { programs: &mut programs, files: &mut files, ctx: &ctx };
        import_and_prove(&mut env, &w1, &sessions).map(|(proofs, _)| proofs.len()).map_err(|e| (e.code, e.message))
    };
    // Another harvest imported the same messages first: home either way.
    assert_eq!(run(true, Some(full.clone())), Ok(1));
    // Otherwise the import's own failure is the answer, not a proof's.
    let e = run(true, Some(session("ses_a", None, 1))).unwrap_err();
    assert_eq!(e.0, Code::ImportFailed, "{e:?}");
    assert!(e.1.contains("database is locked"), "{e:?}");
    assert_eq!(run(true, None).unwrap_err().0, Code::ImportFailed);
    assert_eq!(run(false, Some(session("ses_a", None, 1))).unwrap_err().0, Code::ProofFailed);
    assert_eq!(run(false, None).unwrap_err().0, Code::ProofFailed);
    // A message the user added on the laptop (the session continued there) is theirs:
    // the guest's messages are all home, so the proof holds and nothing is removed.
    let mut continued = full.clone();
    continued["messages"].as_array_mut().unwrap().push(json!({ "info": { "id": "msg_laptop_0", "role": "user" }, "parts": [{ "id": "prt_l", "type": "text", "text": "mine" }] }));
    assert_eq!(run(false, Some(continued)), Ok(1));
    // But a guest message changed on the laptop is not the guest's copy.
    let mut changed = full.clone();
    changed["messages"][1]["parts"][0]["text"] = json!("edited");
    assert_eq!(run(false, Some(changed)).unwrap_err().0, Code::ProofFailed);
}

#[test]
fn export_is_ordered_parents_first() {
    let v = json!({ "sessions": [session("ses_root", None, 2), session("ses_grandchild", Some("ses_child"), 1), session("ses_child", Some("ses_root"), 3)] });
    let s = parse_export(&v).unwrap();
    let ids: Vec<&str> = s.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["ses_root", "ses_child", "ses_grandchild"]);
    assert_eq!(s[1].messages, 3);
}

#[test]
fn orphans_and_malformed_exports_are_refused() {
    let v = json!({ "sessions": [session("ses_root", None, 1), session("ses_x", Some("ses_missing"), 1)] });
    assert_eq!(parse_export(&v).err().unwrap().code, Code::ParentMissing);
    let v = json!({ "sessions": [{ "info": { "id": "ses_a" }, "messages": [{ "info": {} }] }] });
    assert_eq!(parse_export(&v).err().unwrap().code, Code::ExportInvalid);
    assert_eq!(parse_export(&json!({ "nope": 1 })).err().unwrap().code, Code::ExportInvalid);
}

#[test]
fn digest_ignores_key_order_and_rewritten_paths() {
    let a = json!([{ "info": { "id": "m1", "role": "user", "directory": "/guest" }, "parts": [{ "id": "p1", "type": "text", "text": "x" }] }]);
    let b = json!([{ "parts": [{ "text": "x", "type": "text", "id": "p1" }], "info": { "role": "user", "id": "m1", "directory": "/laptop" } }]);
    assert_eq!(canonical_digest(a.as_array().unwrap()), canonical_digest(b.as_array().unwrap()));
    let c = json!([{ "info": { "id": "m1", "role": "user" }, "parts": [{ "id": "p1", "type": "text", "text": "y" }] }]);
    assert_ne!(canonical_digest(a.as_array().unwrap()), canonical_digest(c.as_array().unwrap()));
}

#[test]
fn a_guest_that_lost_its_state_lets_the_proof_cover_what_it_forgot_and_names_what_never_ran() {
    use crate::ledger::{Proof, Prompt};
    let prompt = |id: &str, text: &str| Prompt { id: id.into(), admitted: true, sha256: sha256_hex(text.as_bytes()), ..Default::default() };
    let mut w = Work { work: "w1".into(), ..Default::default() };
    w.prompts = alloc::vec![prompt("p0", "start"), prompt("pa", "run the tests"), prompt("pb", "write the docs"), prompt("pc", "later")];
    w.proofs.push(Proof { prompts: 1, ..Default::default() });
    // The guest made its state again: it answers "no" for every prompt the lost state had.
    let known: BTreeMap<String, bool> = ["pa", "pb", "pc"].iter().map(|k| (k.to_string(), false)).collect();
    // pc was recorded after the export began: it may still be on its way, never covered.
    let before_export: BTreeSet<String> = ["p0", "pa", "pb"].iter().map(|s| s.to_string()).collect();
    assert_eq!(covered(&w, &known, &before_export, false), 1, "a guest that did not forget: as before");
    assert_eq!(covered(&w, &known, &before_export, true), 3);
    // pa's text is in the exported session (it ran before the state went); pb's is not.
    let ran = json!({ "info": { "id": "ses_a" }, "messages": [
        { "info": { "id": "msg_1", "role": "user" }, "parts": [{ "id": "prt_1", "type": "text", "text": "run the tests" }] },
        { "info": { "id": "msg_2", "role": "assistant" }, "parts": [{ "id": "prt_2", "type": "text", "text": "write the docs" }] } ] });
    let sessions = parse_export(&json!({ "sessions": [ran] })).unwrap();
    assert_eq!(forgotten(&w, &known, 1, 3, &sessions), alloc::vec![String::from("pb")], "an assistant's words are not a prompt");
    // A prompt the guest says it has is never named.
    let mut known = known;
    known.insert("pb".into(), true);
    assert!(forgotten(&w, &known, 1, 3, &sessions).is_empty());
}

/// An export past the host's output cap is the transcript's size, said with its ways out
/// (it was BOXD_FAILED "read the boxd CLI's own message", and drop's NOT_PROVEN sent the
/// user back to the harvest for ever); any other boxd failure is left as it is.
#[test]
fn an_export_past_the_output_cap_says_the_transcript_cannot_come_home_and_how_out() {
    let w = Work { work: "w1".into(), machine: "oc-w1".into(), ..Default::default() };
    let capped = ToolError::new(Code::BoxdFailed, "could not run boxd machine exec: boxd printed more than 64 MiB on stdout; the cap is 64 MiB (host-bridge/policy.json outputCaps.stdout), so the host killed it");
    let e = too_large(capped, &w);
    assert_eq!(e.code, Code::ExportInvalid, "{e:?}");
    assert!(e.message.contains("larger than a boxd answer may be") && e.next.contains("boxd_sleep") && e.next.contains("boxd machine remove oc-w1 -y"), "{e:?}");
    let other = ToolError::new(Code::BoxdFailed, "boxd machine exec: network unreachable");
    assert_eq!(too_large(other.clone(), &w), other);
}
