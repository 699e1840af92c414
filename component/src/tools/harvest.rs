//! boxd_harvest: export → import and verify → git → files, one phase function each. The
//! transcript comes home and is proven by reading the laptop's copy back; a failure at any
//! phase leaves the earlier ones recorded, and the next harvest resumes. Three boxd calls
//! however many files; the host streams their bytes into temp files beside their
//! destinations (docs/guest.md, "Frames"), which this tool renames into place.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::{json, Value};

use super::account::stored_intact;
use super::landing::{self, Landing};
use super::machine::running_state;
use super::{work_arg, Env};
use crate::boxd::Boxd;
use crate::caps::{Streamed, Streams};
use crate::encode::sha256_hex;
use crate::errors::{Code, ToolError, ToolResult};
use crate::guest::Guest;
use crate::ledger::{Ledger, Proof, SessionProof, Work};
use crate::opencode::{Held, Opencode};
pub use proof::canonical_digest;
use proof::{import_checked, message_ids};

/// One session as the guest exported it: `{info, messages}`.
struct Exported {
    id: String,
    parent: Option<String>,
    json: Value,
    messages: u64,
    digest: String,
}

pub(super) fn invalid(why: String) -> ToolError {
    ToolError::new(Code::ExportInvalid, format!("the guest's export is not a whole transcript: {why}"))
}

/// Check the export's shape and order it parents first.
fn parse_export(v: &Value) -> ToolResult<Vec<Exported>> {
    let sessions = v.get("sessions").and_then(Value::as_array).ok_or_else(|| invalid("no session list".into()))?;
    let mut all = Vec::new();
    // Message and part ids seen so far: each is one row on the laptop, in one session.
    let mut seen = BTreeSet::new();
    for (i, s) in sessions.iter().enumerate() {
        let id = s["info"]["id"].as_str().filter(|id| !id.is_empty()).ok_or_else(|| invalid(format!("session {i} has no id")))?;
        let msgs = s["messages"].as_array().ok_or_else(|| invalid(format!("session {id} has no message list")))?;
        for (j, m) in msgs.iter().enumerate() {
            if m["info"]["id"].as_str().is_none() || !m["parts"].is_array() {
                return Err(invalid(format!("message {j} of session {id} is malformed")));
            }
        }
        transcript::check_session(s, id, &mut seen).map_err(invalid)?;
        if all.iter().any(|e: &Exported| e.id == id) {
            return Err(invalid(format!("session {id} appears twice")));
        }
        all.push(Exported {
            id: id.to_string(),
            parent: s["info"]["parentID"].as_str().map(String::from),
            messages: msgs.len() as u64,
            digest: canonical_digest(msgs),
            json: transcript::clean_session(s),
        });
    }
    // The root is the work's own session: it hangs under nothing on the laptop (a fork's
    // guest starts a root session of its own too; docs/architecture.md, "Forks").
    if let Some(root) = all.first().filter(|s| s.parent.is_some()) {
        return Err(invalid(format!("its root session {} names a parent ({}): a work's root session has none", root.id, root.parent.as_deref().unwrap_or_default())));
    }
    // Parents first: a session goes once its parent is placed (or it is the root).
    let ids: BTreeSet<String> = all.iter().map(|s| s.id.clone()).collect();
    if let Some(orphan) = all.iter().skip(1).find(|s| s.parent.as_ref().is_none_or(|p| !ids.contains(p))) {
        return Err(ToolError::new(Code::ParentMissing, format!("session {} names a parent that is not in the export", orphan.id)));
    }
    let mut placed: BTreeSet<String> = BTreeSet::new();
    let mut ordered = Vec::new();
    while !all.is_empty() {
        let before = all.len();
        let mut rest = Vec::new();
        for s in all {
            if ordered.is_empty() || s.parent.as_ref().is_some_and(|p| placed.contains(p)) {
                placed.insert(s.id.clone());
                ordered.push(s);
            } else {
                rest.push(s);
            }
        }
        if rest.len() == before {
            // Every parent is in the export, yet none of these hangs under the root: a cycle.
            let ids: Vec<&str> = rest.iter().map(|s| s.id.as_str()).collect();
            return Err(invalid(format!("sessions {} are each other's parents (a cycle), not a tree under the root", ids.join(", "))));
        }
        all = rest;
    }
    Ok(ordered)
}

/// Import the sessions that changed since the last proof, then read each back. A session
/// whose digest equals the last proof's is already proven: no laptop OpenCode runs for it.
fn import_and_prove(env: &mut Env, w: &Work, sessions: &[Exported]) -> ToolResult<(Vec<SessionProof>, Vec<Value>)> {
    let last: BTreeMap<String, (String, Option<String>)> = w
        .proofs
        .last()
        .map(|p| p.sessions.iter().map(|s| (s.id.clone(), (s.digest.clone(), s.file.clone()))).collect())
        .unwrap_or_default();
    let mut report = Vec::new();
    let mut proofs = Vec::new();
    let new: Vec<&str> = sessions.iter().map(|s| s.id.as_str()).filter(|id| !last.contains_key(*id)).collect();
    refuse_foreign_sessions(env, w, &new)?;
    // Reused only while the stored export is whole: one deleted or damaged in the ledger
    // is stored again and imported (an import adds only ids the laptop lacks).
    let mut reused = Vec::with_capacity(sessions.len());
    for s in sessions {
        reused.push(match last.get(&s.id) {
            Some((d, Some(f))) if *d == s.digest && stored_intact(&mut Ledger::for_call(&mut env.files, env.ctx), &w.work, f, None)? => Some(f.clone()),
            _ => None,
        });
    }
    // Before anything is imported: no id of it is held elsewhere on the laptop.
    let imports: Vec<&Exported> = sessions.iter().zip(&reused).filter(|(_, r)| r.is_none()).map(|(s, _)| s).collect();
    transcript::refuse_foreign_ids(env, w, &imports)?;
    let fresh: Vec<&Exported> = sessions.iter().filter(|s| new.contains(&s.id.as_str())).collect();
    transcript::refuse_held_sessions(env, w, &fresh)?;
    for (s, reused) in sessions.iter().zip(reused) {
        let held;
        let (s, name, imported, changed) = match reused {
            Some(f) => (s, f, false, Vec::new()),
            None => {
                let bytes = serde_json::to_vec(&s.json).expect("serialises");
                let name = format!("export-{}.json", &sha256_hex(&bytes)[..16]);
                let mut ledger = Ledger::for_call(&mut env.files, env.ctx);
                ledger.put_blob(&w.work, &name, &bytes)?;
                let file = format!("{}/{name}", ledger.work_dir(&w.work));
                let proven = last.get(&s.id).and_then(|(d, f)| Some((format!("{}/{}", ledger.work_dir(&w.work), f.as_ref()?), d.as_str())));
                let kept = import_checked(env, &file, s, &w.directory, proven.as_ref().map(|(f, d)| (f.as_str(), *d)))?;
                if kept.is_empty() {
                    (s, name, true, Vec::new())
                } else {
                    // What the laptop holds is what is proven: stored and digested as such.
                    held = proof::as_held(s, &kept);
                    let bytes = serde_json::to_vec(&held.json).expect("serialises");
                    let name = format!("export-{}.json", &sha256_hex(&bytes)[..16]);
                    Ledger::for_call(&mut env.files, env.ctx).put_blob(&w.work, &name, &bytes)?;
                    let changed: Vec<String> = kept.iter().filter_map(|m| m["info"]["id"].as_str().map(String::from)).collect();
                    (&held, name, true, changed)
                }
            }
        };
        proofs.push(SessionProof { id: s.id.clone(), parent_id: s.parent.clone(), messages: s.messages, digest: s.digest.clone(), file: Some(name), ..Default::default() });
        let mut entry = json!({ "id": s.id, "parentId": s.parent, "messages": s.messages, "digest": s.digest, "imported": imported });
        if !changed.is_empty() {
            entry["changedOnGuest"] = json!(changed);
            entry["warning"] = json!(format!("message(s) {} changed on the machine after they were proven; the laptop keeps the copies it proved", changed.join(", ")));
        }
        report.push(entry);
    }
    Ok((proofs, report))
}

/// Before a drop destroys the machine: each session of the last proof must still be in the
/// laptop's OpenCode. A harvest with nothing new does not read it again, so one deleted
/// there since (or an OpenCode data folder changed) is imported again from the export the
/// ledger stored when it was proven, and checked as a harvest checks it. A session that is
/// there is left as it is, whatever it holds now: messages reverted or added on the laptop
/// are the user's, unless a drop's restore of it was cut short (`laptop_restoring`). Only
/// OpenCode's own "not found" is an absence (`Opencode::held`): an import after a lookup
/// that merely failed would bring back messages the user reverted.
/// Returns the ids restored, and a note when the laptop's copy could not be looked at from
/// here (the work belongs to another project: the ledger's copy stays).
pub(super) fn restore_for_drop(env: &mut Env, w: &Work) -> ToolResult<(Vec<String>, Option<String>)> {
    let Some(proof) = w.proofs.last().filter(|p| !p.sessions.is_empty()) else { return Ok((Vec::new(), None)) };
    if work_folder_granted(env.ctx, w).is_err() {
        let note = format!("the laptop's OpenCode copy of the transcript was not checked: work '{}' belongs to {}, outside this project; the ledger keeps its proven export", w.work, w.directory);
        return Ok((Vec::new(), Some(note)));
    }
    // A harvest would not put the session back (its digest is unchanged): the next step of
    // a failed lookup or import here is the drop again.
    let drop_next = |e: ToolError| match e.code {
        Code::ImportFailed | Code::ProofFailed => ToolError::with_next(e.code, e.message, "Read the laptop OpenCode's message above, fix it, then call boxd_drop again; nothing was destroyed."),
        _ => e,
    };
    let ids: Vec<&str> = proof.sessions.iter().map(|p| p.id.as_str()).collect();
    let held = Opencode::new(&mut env.programs).held(&ids, &w.directory).map_err(drop_next)?;
    let mut restored = Vec::new();
    for (p, held) in proof.sessions.iter().zip(held) {
        // Held, and no earlier drop's restore of it was cut short: the user's as it is.
        if !matches!(held, Held::Absent) && !w.laptop_restoring.contains(&p.id) {
            continue;
        }
        let mut ledger = Ledger::for_call(&mut env.files, env.ctx);
        let intact = p.file.as_ref().map_or(Ok(false), |f| stored_intact(&mut ledger, &w.work, f, None))?;
        let stored = p.file.as_ref().filter(|_| intact).map(|f| format!("{}/{f}", ledger.work_dir(&w.work)));
        let json = stored.as_ref().and_then(|path| env.files.read(path).ok().flatten()).and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        // Cleaned as a harvest cleans it: an export an earlier version stored as the guest
        // gave it (its permission rules among it) is imported from a cleaned copy.
        let json = json.filter(|j| transcript::check_session(j, &p.id, &mut BTreeSet::new()).is_ok()).map(|j| (transcript::clean_session(&j), j));
        let (stored, json) = match (stored, json) {
            (Some(_), Some((clean, raw))) if clean != raw => {
                let bytes = serde_json::to_vec(&clean).expect("serialises");
                let name = format!("export-{}.json", &sha256_hex(&bytes)[..16]);
                let mut ledger = Ledger::for_call(&mut env.files, env.ctx);
                ledger.put_blob(&w.work, &name, &bytes)?;
                (Some(format!("{}/{name}", ledger.work_dir(&w.work))), Some(clean))
            }
            (path, json) => (path, json.map(|(clean, _)| clean)),
        };
        let (Some(path), Some(json)) = (stored, json) else {
            return Err(ToolError::with_next(
                Code::NotProven,
                format!("session {} of work '{}' is no longer in this laptop's OpenCode and the ledger holds no whole copy of it (its stored export is missing or damaged); nothing was destroyed", p.id, w.work),
                format!("Call boxd_harvest for work '{}' (it imports the session again from the machine), then boxd_drop.", w.work),
            ));
        };
        let s = Exported { id: p.id.clone(), parent: p.parent_id.clone(), json, messages: p.messages, digest: p.digest.clone() };
        // Marked before the import and cleared once the copy is read back whole: a host
        // killed between leaves a partial copy that only the mark tells from a user's revert.
        let id = p.id.clone();
        Ledger::for_call(&mut env.files, env.ctx).update(&w.work, |w| {
            if !w.laptop_restoring.contains(&id) {
                w.laptop_restoring.push(id.clone());
            }
        })?;
        import_checked(env, &path, &s, &w.directory, None).map_err(drop_next)?;
        Ledger::for_call(&mut env.files, env.ctx).update(&w.work, |w| w.laptop_restoring.retain(|i| *i != id))?;
        restored.push(p.id.clone());
    }
    Ok((restored, None))
}

/// A session another work proved on this laptop is that work's transcript: importing it
/// from this work's guest would change it there (a tampered guest can export any id), and
/// would prove this work with a history that is not its own. Checked for the sessions this
/// work has not proven before, against every other record, before anything is imported.
fn refuse_foreign_sessions(env: &mut Env, w: &Work, new: &[&str]) -> ToolResult<()> {
    if new.is_empty() {
        return Ok(());
    }
    let mut ledger = Ledger::for_call(&mut env.files, env.ctx);
    for id in ledger.ids()?.into_iter().filter(|id| *id != w.work) {
        let Ok(Some(other)) = ledger.read(&id) else { continue };
        let theirs = other.proofs.iter().flat_map(|p| &p.sessions).find(|s| new.contains(&s.id.as_str()));
        if let Some(s) = theirs {
            return Err(ToolError::with_next(
                Code::ExportInvalid,
                format!("the guest of work '{}' exported session {}, which is work '{id}''s transcript on this laptop; nothing was imported", w.work, s.id),
                format!("Look at the machine of work '{}' (its OpenCode data or the helper was changed) before you harvest or drop it; work '{id}' is untouched.", w.work),
            ));
        }
    }
    Ok(())
}

/// The warning boxd_sleep leaves when it puts down an unharvested work; a proof covering
/// every prompt resolves it.
pub const UNHARVESTED_SLEEP: &str = "before the newest prompt was harvested";

pub fn run(env: &mut Env, args: &Value) -> ToolResult<Value> {
    let (work, machine) = work_arg(args)?;
    let wanted = super::guest_paths_arg(args, "files")?;
    let w = Ledger::for_call(&mut env.files, env.ctx).require(&work)?;
    super::require_open(&w)?;
    let dest_dir = destination(env, args, &w)?;
    // Every file's laptop path is checked before any is recorded as owed: a refused one
    // would otherwise stay owed and block the drop.
    landing::check_destinations(env, &wanted, &dest_dir)?;
    let w = landing::sweep_temps(env, w)?;
    // The prompts admitted before the guest exported: what the proof may count on the
    // ledger's word (`covered`).
    let admitted_before: BTreeSet<String> = w.prompts.iter().filter(|p| p.admitted).map(|p| p.id.clone()).collect();
    let (w, export, sessions) = export(env, w, &wanted)?;
    let (w, report) = prove(env, w, &export, &sessions, &admitted_before)?;
    let (w, landing) = landing::landing(env, w, &wanted, &dest_dir)?;
    let (w, git, fetched, arrived) = match record_git(env, w, &wanted, &landing) {
        Ok(r) => r,
        Err(e) => return Err(landing::discard(env, &landing, e)),
    };
    let (w, written) = match landing::bring_files(env, w, &git, &landing, arrived) {
        Ok(r) => r,
        Err(e) => return Err(landing::discard(env, &landing, e)),
    };
    let mut git_json = match &w.git {
        Some(g) => json!({ "repo": true, "head": g.head, "branch": g.branch, "dirty": g.dirty, "patch": g.patch, "bundle": g.bundle,
            "untracked": g.untracked.iter().map(|e| e.path.clone()).collect::<Vec<_>>(),
            "ignored": g.ignored.iter().map(|e| e.path.clone()).collect::<Vec<_>>() }),
        None => json!({ "repo": false, "warning": "GIT_UNKNOWN: the work tree is not a git repository, so boxd_drop will refuse it" }),
    };
    if let Some(f) = fetched {
        git_json["fetched"] = f;
    }
    let mut answer = json!({
        "work": work,
        "machine": machine,
        "proven": w.proven(),
        "prompts": w.prompts.len(),
        "sessions": report,
        "git": git_json,
        "files": written,
        "owed": w.owed,
        "next": harvested_next(&w),
    });
    // A fork's sessions are its own; this links them to where it came from: the parent
    // work, the prompt it forked at and the parent's sessions as proven then.
    if let Some(f) = &w.fork {
        answer["forkOf"] = json!({ "work": f.parent, "atPrompt": f.at_prompt, "parentSessions": f.inherited.keys().collect::<Vec<_>>() });
    }
    Ok(answer)
}

/// The laptop folder the files come home to: `to`, else the work's folder; inside the
/// project or an allowed root either way (`user_path` checks `to`, `work_folder_granted`
/// the work's folder).
fn destination(env: &Env, args: &Value, w: &Work) -> ToolResult<String> {
    let ctx = env.ctx;
    work_folder_granted(ctx, w)?;
    match args.get("to").and_then(Value::as_str) {
        Some(t) => super::user_path(ctx, t, &ctx.project),
        None => Ok(w.directory.clone()),
    }
}

/// The laptop's OpenCode imports a work's transcript in the folder the work was started in
/// (its sessions belong to that project), so that folder must be one this host opened. A
/// work started in another project, or in a folder since moved, is said as such, not as a
/// missing OpenCode.
pub(super) fn work_folder_granted(ctx: &crate::options::Context, w: &Work) -> ToolResult<()> {
    if super::granted_root(ctx, &w.directory).is_some() {
        return Ok(());
    }
    Err(ToolError::with_next(
        Code::PathRefused,
        format!("work '{}' was started in {}, outside this project ({}) and the allowed roots: its transcript and files belong there", w.work, w.directory, ctx.project),
        format!("Open OpenCode in {} and call the tool there. If that folder was moved or renamed, move it back (or add its old path to allowedRoots if it still exists); the ledger keeps the work's proven transcripts and commits either way.", w.directory),
    ))
}

/// The harvest's next step: the transcript proven, or the prompts this proof left out.
fn harvested_next(w: &Work) -> String {
    if w.proven() {
        return "The transcript is proven on this laptop (a session already proven is not read again here; boxd_drop reads the laptop's copy again before it destroys anything). boxd_sleep keeps the machine; boxd_drop destroys it once everything is accounted for.".to_string();
    }
    let covered = w.proofs.last().map_or(0, |p| p.prompts as usize);
    let open: Vec<&str> = w.prompts.iter().skip(covered).map(|p| p.id.as_str()).collect();
    format!(
        "Prompt(s) {} are not in this proof yet: a run still going (boxd_job until it is idle), or a submit whose answer never came (taken as not run 10 minutes after it was sent). Call boxd_harvest again then; boxd_drop refuses until every prompt is proven, and boxd_sleep keeps the machine meanwhile.",
        open.join(", ")
    )
}

/// Phase 1: the machine is ours and up; the wanted files are owed from now; the guest
/// exports its session tree (one exec), which is checked and ordered parents first.
fn export(env: &mut Env, w: Work, wanted: &[String]) -> ToolResult<(Work, Value, Vec<Exported>)> {
    let (ctx, now) = (env.ctx, env.now());
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    running_state(&mut boxd, &mut Ledger::for_call(&mut env.files, ctx), ctx, &w)?;
    if !wanted.is_empty() {
        // Owed from now until they are on the laptop: drop refuses while any is.
        Ledger::for_call(&mut env.files, ctx).update(&w.work, |w| {
            for f in wanted {
                if !w.owed.contains(f) {
                    w.owed.push(f.clone());
                }
            }
        })?;
    }
    // Asked about: the prompts whose fate is unknown, and the newest of those after the
    // last proof, which this proof may cover (`covered`).
    let mut asked = w.unresolved();
    let after: Vec<&str> = w.prompts.iter().skip(w.proofs.last().map_or(0, |p| p.prompts as usize)).filter(|p| p.admitted).map(|p| p.id.as_str()).collect();
    asked.extend(after.iter().skip(after.len().saturating_sub(ASKED_AFTER_PROOF)).map(|id| id.to_string()));
    let (export, known) = Guest::new(&mut boxd, &w.machine, &w.work).call_resolving("export", &asked).map_err(|e| too_large(e, &w))?;
    let w = match w.unresolved().iter().any(|id| known.contains_key(id)) {
        false => w,
        true => Ledger::for_call(&mut env.files, ctx).update(&w.work, |w| w.resolve_prompts(&known, &now, ctx.now_ms))?,
    };
    let sessions = parse_export(&export)?;
    let admitted = w.prompts.iter().filter(|p| p.admitted).count();
    if admitted > 0 && sessions.first().is_none_or(|s| s.messages == 0) {
        return Err(invalid(format!("{admitted} prompts were admitted but the export holds no messages")));
    }
    Ok((w, export, sessions))
}

/// An export past the host's output cap (its words: "printed more than … on stdout"): the
/// transcript cannot come home in one answer, so no harvest will prove it. Said as such,
/// with the ways out, not as the boxd CLI's failure.
fn too_large(e: ToolError, w: &Work) -> ToolError {
    if e.code != Code::BoxdFailed || !(e.message.contains("printed more than") && e.message.contains("on stdout")) {
        return e;
    }
    ToolError::with_next(
        Code::ExportInvalid,
        format!("work '{}': the guest's transcript export is larger than a boxd answer may be ({}); it cannot come home in one piece, so it is not proven", w.work, e.message),
        format!(
            "Keep the machine asleep with its disk (boxd_sleep for work '{}'); or give up its transcript: remove {} yourself ('boxd machine remove {} -y'), then boxd_drop closes the work naming what was not recovered.",
            w.work, w.machine, w.machine
        ),
    )
}

/// How many of the newest prompts after the last proof a harvest asks the guest about:
/// fewer than the 500 it remembers, so its "no" is never a prompt it forgot.
const ASKED_AFTER_PROOF: usize = 200;

/// How many prompts a proof of this export covers, counted in the record it is written
/// to: those of its last proof, then each next one the guest said it had admitted when it
/// exported (the helper reads that before its snapshot, so each one's run had ended), in
/// the ledger's order. Two submits at once can reach the ledger in one order and the guest
/// in the other, so the newest prompt's position could leave one out (and the work could
/// never drop) or count one still on its way. A prompt the guest was not asked about
/// (older than the ones asked) counts when the ledger had it admitted before the export.
/// A guest that admitted none (a rebuilt machine holds the restored transcript) covers
/// what the last proof did. A guest whose state was lost and made again (`forgot`) no
/// longer knows which prompts the lost state admitted; what they made is in the sessions
/// it exported, and nothing more will come of them: one the ledger had admitted before the
/// export counts as ended (`forgotten` names those whose text never reached the session).
fn covered(w: &Work, known: &BTreeMap<String, bool>, admitted_before: &BTreeSet<String>, forgot: bool) -> u64 {
    let before = w.proofs.last().map_or(0, |p| p.prompts).min(w.prompts.len() as u64);
    let next = w
        .prompts
        .iter()
        .skip(before as usize)
        .take_while(|p| match known.get(&p.id) {
            Some(admitted) => *admitted || (forgot && admitted_before.contains(&p.id)),
            None => admitted_before.contains(&p.id),
        })
        .count();
    before + next as u64
}

/// Of the prompts a proof covers from `before` on only because the guest forgot them, those
/// whose text is in no user message of the export: they were waiting when the guest's state
/// was lost, and never ran.
fn forgotten(w: &Work, known: &BTreeMap<String, bool>, before: u64, upto: u64, sessions: &[Exported]) -> Vec<String> {
    let said: BTreeSet<String> = sessions
        .iter()
        .flat_map(|s| s.json["messages"].as_array().into_iter().flatten())
        .filter(|m| m["info"]["role"] == "user")
        .flat_map(|m| m["parts"].as_array().into_iter().flatten())
        .filter_map(|p| p["text"].as_str().map(|t| sha256_hex(t.as_bytes())))
        .collect();
    let span = w.prompts.iter().take(upto as usize).skip(before as usize);
    span.filter(|p| known.get(&p.id) == Some(&false) && !said.contains(&p.sha256)).map(|p| p.id.clone()).collect()
}

/// Phases 2–3: import and verify, then record the proof (before git and files). It covers
/// the prompts the guest had admitted when it exported (`covered`) — not one a concurrent
/// submit recorded but had not delivered yet.
fn prove(env: &mut Env, w: Work, export: &Value, sessions: &[Exported], admitted_before: &BTreeSet<String>) -> ToolResult<(Work, Vec<Value>)> {
    let newest = export.get("newestPrompt").and_then(Value::as_str).map(String::from);
    let known = crate::guest::resolved(export);
    let forgot = export.get("forgotAt").and_then(Value::as_str);
    let (proofs, report) = import_and_prove(env, &w, sessions)?;
    let now = env.now();
    let w = Ledger::for_call(&mut env.files, env.ctx).update(&w.work, |w| {
        let before = w.proofs.last().map_or(0, |p| p.prompts).min(w.prompts.len() as u64);
        let prompts = covered(w, &known, admitted_before, forgot.is_some());
        let never_ran = forgotten(w, &known, before, prompts, sessions);
        if let (Some(at), false) = (forgot, never_ran.is_empty()) {
            w.warnings.push(format!("{now}: prompt(s) {} were waiting on the machine when the guest's state of this work was lost (made again {at}) and never ran; submit again if still wanted", never_ran.join(", ")));
        }
        // The guest's word on its newest prompt is kept when it names one of ours, or one
        // this ledger lost (a record put back from an older copy): a prompt id, short, not
        // whatever the guest sends (a 20 MiB one made the record unwritable).
        let newest = newest.filter(|n| w.prompts.iter().any(|p| &p.id == n) || super::submit::prompt_id_ok(n));
        w.record_proof(Proof { at: now.clone(), prompts, sessions: proofs, newest_prompt: newest, ..Default::default() });
        if w.proven() {
            w.warnings.retain(|t| !t.contains(UNHARVESTED_SLEEP));
        }
    })?;
    Ok((w, report))
}

/// Phase 4: the guest's git state and every commit (as a bundle), with the wanted files
/// streamed by the host in the same exec; recorded in the ledger, and fetched into the
/// project with `fetchCommits`. Returns the guest's answer (which lists the files), what
/// the fetch did, and the files that arrived.
fn record_git(env: &mut Env, w: Work, wanted: &[String], landing: &[Landing]) -> ToolResult<(Work, Value, Option<Value>, Vec<Streamed>)> {
    let (ctx, now) = (env.ctx, env.now());
    // The guest answers "unchanged" to the refs we say we hold: only while our bundle of them
    // is whole, so one deleted or damaged in the ledger is made again.
    let have = match w.git.as_ref().and_then(|g| Some((g, g.bundle.as_deref()?))) {
        Some((g, b)) if stored_intact(&mut Ledger::for_call(&mut env.files, ctx), &w.work, b, None)? => g.refs.clone(),
        _ => BTreeMap::new(),
    };
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    let stdin = serde_json::to_vec(&json!({ "files": wanted, "haveRefs": have })).expect("serialises");
    // Each temp takes the mode of the laptop file it may replace (the host sets it).
    let streams = Streams {
        stdin_files: Vec::new(),
        stdout_files: landing.iter().map(|l| l.temp.clone()).collect(),
        stdout_modes_from: landing.iter().map(|l| l.dest.clone()).collect(),
    };
    let mut guest = Guest::new(&mut boxd, &w.machine, &w.work);
    let (git, arrived) = match guest.call_streaming("git", &["--files-stdin"], Some(stdin), &streams) {
        Err(e) if e.code == Code::NameInvalid && e.message.ends_with(" does not exist in the work tree") => {
            // Asked for but not in the work tree: nothing of it can come home, so it is not
            // owed (the drop refused over it, naming a harvest that could never bring it).
            // A file the agent writes there later is the drop's to see (UNTRACKED).
            let missing = guest.refused.as_ref().and_then(|r| r["path"].as_str()).filter(|p| wanted.iter().any(|f| f == p)).map(str::to_string);
            if let Some(missing) = missing {
                Ledger::for_call(&mut env.files, ctx).update(&w.work, |w| w.owed.retain(|o| *o != missing))?;
            }
            let next = format!("Leave it out of files; to see the names the machine's work tree has (they are case-sensitive), call boxd_harvest for work '{}' without files: its git.untracked lists the new ones.", w.work);
            return Err(ToolError::with_next(e.code, e.message, next));
        }
        // A path the helper refuses on the machine (a symbolic link, a FIFO or another
        // special file, under .boxd/): mended there, not in the laptop's allowedRoots.
        Err(e) if e.code == Code::PathRefused && guest.refused.is_some() => {
            let path = guest.refused.as_ref().and_then(|r| r["path"].as_str()).unwrap_or("that path").to_string();
            let next = format!("Leave {path} out of files, or have the agent make it a plain file there (boxd_submit for work '{}'), then harvest it; if it is not wanted, boxd_drop with \"discard\" naming it.", w.work);
            return Err(ToolError::with_next(e.code, e.message, next));
        }
        answer => answer?,
    };
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    let record = super::account::record(&mut ledger, &w, &git, &now)?;
    let w = ledger.update(&w.work, |w| w.git = record.clone())?;
    let fetched = match record.and_then(|r| r.bundle) {
        Some(bundle) if ctx.options.fetch_commits => {
            let bundle = format!("{}/{bundle}", ledger.work_dir(&w.work));
            Some(match fetch::granted_repository(env.files, ctx, &w.directory) {
                true => fetch::fetch_commits(&mut env.programs, &w, &bundle),
                false => json!({ "ref": Value::Null, "reason": format!("no git repository holds {} inside the folders this host opened, so nothing was fetched (a repository above them, such as a home folder kept in git, is not written; add its top folder to allowedRoots to allow it); the commits are in the ledger's bundle", w.directory) }),
            })
        }
        _ => None,
    };
    Ok((w, git, fetched, arrived))
}

mod fetch;
mod proof;
mod transcript;

#[cfg(test)]
mod tests;
