//! A work's machine coming up and going down without loss: ensure (create or adopt),
//! sleep and resume (wake, or rebuild a gone one). Creating a machine and preparing its
//! guest live in `machine`; image and drop have their own modules.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use serde_json::{json, Value};

use super::machine::{check_owned, create_machine, owned_state, owned_state_claiming, prepare_fresh_guest, work_json, Build};
use super::{work_arg, Env};
use crate::boxd::{Boxd, Failure, MachineInfo, State};
use crate::caps::{Files, Kind};
use crate::errors::{Code, ToolError, ToolResult};
use crate::ledger::{iso8601, Ledger, Sleep, Work, WorkState};
use crate::opencode::Opencode;
use crate::options::Context;

/// The work's laptop folder: inside a granted root, an existing directory, reached through
/// no symlink. Checked before anything is created.
pub(super) fn work_directory(env: &mut Env, args: &Value) -> ToolResult<String> {
    let ctx = env.ctx;
    let Some(d) = args.get("directory").and_then(Value::as_str) else { return Ok(ctx.project.clone()) };
    let dir = super::user_path(ctx, d, &ctx.project)?;
    let refused = |why: &str| ToolError::new(Code::PathRefused, format!("directory '{d}' {why}; no machine was created"));
    match env.files.stat(&dir) {
        Ok(Some(m)) if m.kind == Kind::Dir => Ok(dir),
        Ok(Some(m)) if m.kind == Kind::Symlink => Err(refused("is a symlink (or leads through one), which is never followed")),
        Ok(Some(_)) => Err(refused("is not a folder")),
        Ok(None) => Err(refused("does not exist")),
        Err(_) => Err(refused("cannot be checked")),
    }
}

/// A drop of this work may be under way (marked `dropping` less than IN_FLIGHT_MS ago):
/// reopening it would let a prompt run on the machine the drop is about to remove, so it
/// is left to finish. An older mark is a drop that was interrupted: it may be reopened.
fn refuse_under_a_drop(w: &Work, ctx: &crate::options::Context, done: &str) -> ToolResult<()> {
    if !w.drop_under_way(ctx.now_ms) {
        return Ok(());
    }
    Err(ToolError::with_next(
        Code::SessionBusy,
        format!("work '{}' is being dropped (a drop marked it {} s ago); it is not {done} under that drop", w.work, ctx.now_ms.saturating_sub(w.dropping_ms) / 1000),
        format!("Wait for that boxd_drop to answer. If it was interrupted, call boxd_drop for work '{}' to finish it; to keep the work instead, call this again once the drop is 10 minutes old.", w.work),
    ))
}

pub fn ensure(env: &mut Env, args: &Value) -> ToolResult<Value> {
    let (work, machine) = work_arg(args)?;
    let directory = work_directory(env, args)?;
    let ctx = env.ctx;
    let version = Opencode::new(&mut env.programs).version(ctx);
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    let mut record = ledger.read(&work)?;
    // A closed work whose own machine is still there (its recorded id under its name): a
    // drop that took it for gone (boxd showed another id there, twice) is reopened on it.
    let mut closed = None;
    if let Some(w) = &record {
        if w.is_closed() {
            // A dropped work's id may be used again; keep the old record beside the new one.
            let old = serde_json::to_vec_pretty(w).expect("serialises");
            let stamp: String = w.created_at.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '-' }).collect();
            ledger.put_blob(&work, &format!("closed-{stamp}.json"), &old)?;
            closed = record.take();
        }
    }
    if let Some(w) = &record {
        same_work(ctx, w, args, &directory)?;
    }
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    // One read that carries the id: the machine is ours, or it is refused untouched.
    if let Some(info) = boxd.get(&machine).map_err(Failure::into_error)? {
        // Only a work a drop closed because another id answered under its name (a normal
        // drop removed its machine), not a fork (boxd_fork owns those), on a live machine.
        let live = !matches!(crate::boxd::known_state(&info), Ok(State::Gone) | Err(_));
        let own = |c: &Work| !info.id.is_empty() && c.machine_id.as_deref() == Some(info.id.as_str()) && c.name_taken_by.is_some() && c.fork.is_none();
        if let Some(c) = closed.filter(|c| live && own(c)) {
            record = Some(reopen(&mut ledger, ctx, c, args, &directory)?);
        }
        let Some(w) = record else {
            return Err(ToolError::with_next(
                Code::NotOurs,
                format!("a machine named {machine} exists, but this ledger ({}) did not create it", ctx.ledger),
                format!("Pick another work id. If {machine} is a work of yours kept in another ledger (the ledgerDir option, or boxd-host --ledger), use that ledger: it holds what is not harvested yet. Remove it yourself ('boxd machine remove {machine} -y') only if it is yours and holds nothing you need."),
            ));
        };
        refuse_under_a_drop(&w, ctx, "reopened")?;
        let (w, st, adopted) = adopt(&mut ledger, w, &info, ctx)?;
        // A create whose answer never came, taken up by its machine: the account it is in.
        let w = if adopted && w.account.is_none() { super::machine::keep_account(&mut boxd, &mut ledger, w)? } else { w };
        let (w, guest) = if matches!(st, State::Running | State::Standby) {
            let guest = prepare_fresh_guest(&mut boxd, &mut ledger, ctx, &w, version.as_deref())?;
            // A rebuild whose create answered late: this adoption finishes it.
            (restore_if_pending(env, w)?.0, guest)
        } else {
            (w, Value::Null)
        };
        let next = match st {
            State::Asleep | State::Stopped => format!("Call boxd_resume for work '{work}' to wake its machine."),
            _ => format!("Call boxd_submit for work '{work}' with the task."),
        };
        return Ok(ensured(&w, super::status::job_state(st), guest, (adopted, false), next));
    }
    if let Some(w) = &record {
        if w.state == WorkState::Dropping {
            return Err(ToolError::with_next(
                Code::MachineGone,
                format!("work '{work}' was being dropped when its machine was removed"),
                format!("Call boxd_drop for work '{work}' to finish closing it, then boxd_ensure to start it again."),
            ));
        }
        if w.state == WorkState::Open && w.machine_id.is_some() {
            return Err(ToolError::new(Code::MachineGone, format!("{machine}, recorded for work '{work}', no longer exists")));
        }
    }
    // A create that answered with an id and never came up, seen from another account, would
    // be made again here while its machine runs there.
    if let Some(w) = &record {
        super::machine::same_account(&mut boxd, w, "nothing was created")?;
    }
    let w = create_machine(&mut boxd, &mut ledger, ctx, &work, Build::New { directory: &directory })?;
    let guest = prepare_fresh_guest(&mut boxd, &mut ledger, ctx, &w, version.as_deref())?;
    Ok(ensured(&w, "running", guest, (false, true), format!("Call boxd_submit for work '{work}' with the task.")))
}

/// Reopen a closed work on its own machine, found under its name with the id it recorded:
/// the drop that closed it took it for gone (boxd showed another id there), and whatever
/// it held, the prompts named unrecovered too, can be harvested again.
fn reopen<F: Files>(ledger: &mut Ledger<F>, ctx: &Context, closed: Work, args: &Value, directory: &str) -> ToolResult<Work> {
    same_work(ctx, &closed, args, directory)?;
    let machine = closed.machine.clone();
    let mut reopened = false;
    let w = ledger.update(&closed.work, |w| {
        if w.is_closed() && w.machine_id == closed.machine_id {
            reopened = true;
            w.state = WorkState::Open;
            w.settled = None;
            w.name_taken_by = None;
            w.dropping_ms = 0;
            if !w.unrecovered.is_empty() {
                let lost = core::mem::take(&mut w.unrecovered);
                w.warnings.push(format!("{}: reopened on {machine}, its own machine (the id it recorded), which a drop had taken for gone; what it named unrecovered (prompts, files) may be harvested again: {}", iso8601(ctx.now_ms), lost.join(", ")));
            }
        }
    })?;
    if !reopened {
        return Err(ToolError::new(Code::SessionBusy, format!("work '{}' changed while this call reopened it; nothing was done", w.work)));
    }
    Ok(w)
}

/// Take up the machine under the work's name, which exists: the ledger's own (its id
/// matches), or the one a create whose answer never came made (the ledger recorded the
/// create first). Returns the record, the machine's state, and whether it was adopted.
fn adopt<F: Files>(ledger: &mut Ledger<F>, w: Work, info: &MachineInfo, ctx: &Context) -> ToolResult<(Work, State, bool)> {
    let (work, machine) = (&w.work, &info.name);
    let adopted = w.machine_id.is_none() || w.state == WorkState::Creating;
    if w.machine_id.is_none() && w.state != WorkState::Creating {
        return Err(ToolError::with_next(
            Code::NotOurs,
            format!("{machine} exists, but the ledger recorded no create for work '{work}'"),
            format!("Leave {machine} alone: no create of this ledger made it. Use another work id for this task (boxd_ensure)."),
        ));
    }
    if info.id.is_empty() {
        return Err(ToolError::new(Code::NotOurs, format!("boxd gave no id for {machine}, so it cannot be checked against the ledger")));
    }
    // Taken by its name alone (a create whose answer never came; no id recorded): only a
    // machine made the way that create makes one can be it. Another is someone else's,
    // made under the name since; the intent is withdrawn so no later call adopts it.
    let source = format!("snapshot/{}", w.snapshot.as_deref().unwrap_or(&ctx.options.snapshot));
    if w.machine_id.is_none() && !super::machine::made_like_ours(info, &source, ctx.options.idle_seconds()) {
        ledger.update(work, |w| {
            if w.state == WorkState::Creating && w.machine_id.is_none() {
                w.state = WorkState::Open;
            }
        })?;
        return Err(ToolError::with_next(
            Code::NotOurs,
            format!(
                "{machine} exists, but not as the create this ledger recorded for work '{work}' makes one (source '{}', auto-hibernate '{}'; that create asked for {source} with {}s): someone else made it under the name, and it is not adopted",
                info.source,
                info.auto_hibernate,
                ctx.options.idle_seconds()
            ),
            format!("Leave {machine} alone; use another work id for this task (boxd_ensure)."),
        ));
    }
    let by_name = w.machine_id.is_none();
    let mut owned = w.clone();
    owned.machine_id.get_or_insert_with(|| info.id.clone());
    check_owned(ledger, ctx, &owned, info)?;
    let st = crate::boxd::known_state(info)?;
    let w = ledger.update(work, |w| {
        w.machine_id = owned.machine_id;
        // Its guest's claim, before the first prepare, proves it is no other ledger's (machine.rs).
        w.taken_by_name |= by_name;
        if st != State::Starting {
            w.state = WorkState::Open;
        }
        match st {
            // The guest is prepared next: an exec, traffic boxd's idle clock counts.
            State::Running | State::Standby => w.in_use(ctx.now_ms),
            State::Asleep | State::Stopped => w.seen_not_running(ctx.now_ms, ctx.options.idle_ms(), false),
            _ => {}
        }
    })?;
    if st == State::Starting {
        return Err(ToolError::new(Code::MachineStarting, format!("{machine} is still starting")));
    }
    Ok((w, st, adopted))
}

/// The work the ledger holds is the one this ensure asks for, and this project's: another
/// project's work (or one whose folder moved), taken up from here, had its prompts and
/// files come from here, and nothing it made could be harvested here.
fn same_work(ctx: &Context, w: &Work, args: &Value, directory: &str) -> ToolResult<()> {
    refuse_other_spec(w, args, directory, &ctx.options.snapshot)?;
    super::harvest::work_folder_granted(ctx, w)
}

/// An ensure must ask for the work the ledger holds: the same folder (when one is named)
/// and golden snapshot, and not a fork's (boxd_fork owns those). Else nothing is made.
fn refuse_other_spec(w: &Work, args: &Value, directory: &str, snapshot: &str) -> ToolResult<()> {
    let conflict = |what: String| {
        ToolError::new(Code::WorkConflict, format!("work '{}' is in the ledger with {what}; no machine was created or adopted", w.work))
    };
    if args.get("directory").is_some() && w.directory != directory {
        return Err(conflict(format!("folder {} (this call asked for {directory})", w.directory)));
    }
    if let Some(recorded) = w.snapshot.as_deref().filter(|s| *s != snapshot) {
        return Err(conflict(format!("snapshot {recorded} (the snapshot option now says {snapshot})")));
    }
    if let Some(f) = &w.fork {
        return Err(conflict(format!("parent work '{}' (a fork: boxd_fork with that parent admits and adopts it)", f.parent)));
    }
    Ok(())
}

/// boxd_ensure's answer: the work, its machine's state and guest, and how it came to be.
fn ensured(w: &Work, state: &str, guest: Value, (adopted, created): (bool, bool), next: String) -> Value {
    let mut out = work_json(w, state);
    out["guest"] = guest;
    out["adopted"] = json!(adopted);
    out["created"] = json!(created);
    out["next"] = json!(next);
    out
}

pub fn sleep(env: &mut Env, args: &Value) -> ToolResult<Value> {
    let (work, machine) = work_arg(args)?;
    let now = env.now();
    let ctx = env.ctx;
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    let w = ledger.require(&work)?;
    super::require_open(&w)?;
    // A drop under way (or interrupted) needs the machine awake to finish: put to sleep, the
    // drop asked for a resume, which waits for the drop (stuck both ways for 10 minutes).
    refuse_under_a_drop(&w, ctx, "put to sleep")?;
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    // Hibernated, or stopped by hand (boxd hibernates only a running or standby machine):
    // either way it is down and bills disk only, so the sleep is done; its run is closed.
    let st = owned_state(&mut boxd, &mut ledger, ctx, &w)?;
    let already = match st {
        State::Asleep | State::Stopped => true,
        State::Gone => return Err(ToolError::new(Code::MachineGone, format!("{machine} no longer exists"))),
        State::Starting => return Err(ToolError::new(Code::MachineStarting, format!("{machine} is still starting"))),
        _ => {
            // Intent before effect (`Work::sleeping`).
            ledger.update(&work, |w| w.sleeping = Some(Sleep { by: "boxd_sleep".into(), at: now.clone(), ..Default::default() }))?;
            boxd.hibernate(&machine).map_err(Failure::into_error)?;
            false
        }
    };
    let mut warning = None;
    let w = ledger.update(&work, |w| {
        let earlier = w.sleeping.take();
        if !w.prompts.is_empty() && !w.proven() {
            let text = format!("slept at {now} {}: the transcript on this laptop is behind the machine", super::harvest::UNHARVESTED_SLEEP);
            w.warnings.push(text.clone());
            warning = Some(text);
        }
        if !already {
            w.sleeps.push(Sleep { by: "boxd_sleep".into(), at: now.clone(), ..Default::default() });
            w.asleep_by_tool = true;
            w.close_run(ctx.now_ms, "boxd_sleep");
        } else {
            // An earlier boxd_sleep's hibernate landed though its answer did not (its spend
            // still ends as a machine seen down does: the later, so never under-counted).
            // One left by a sleep that raced another's, which recorded it down, adds nothing;
            // and a hibernate does not stop a machine (one stopped by hand is not the sleep's).
            if let Some(s) = earlier.filter(|_| !w.asleep_by_tool && st == State::Asleep) {
                w.sleeps.push(s);
                w.asleep_by_tool = true;
            }
            w.seen_not_running(ctx.now_ms, ctx.options.idle_ms(), false);
        }
    })?;
    let mut out = work_json(&w, if st == State::Stopped { "stopped" } else { "asleep" });
    // Down already: by this tool's earlier sleep, or by boxd's idle bound or the CLI (as boxd_job says).
    let by_tool = !already || w.asleep_by_tool;
    out["asleepBy"] = json!(if by_tool { "boxd_sleep" } else { "idle_or_cli" });
    out["sleptAt"] = json!(if by_tool { w.sleeps.last().map(|s| s.at.clone()) } else { None });
    out["alreadyAsleep"] = json!(already);
    out["warning"] = json!(warning);
    out["next"] = json!(format!("Call boxd_resume for work '{work}' when you need it again."));
    Ok(out)
}

/// Import the proven transcript into a rebuilt guest, parents first (the proof's order).
/// Each session comes from the export the ledger stored when it was proven, used only while
/// its bytes still hash to its name; one deleted or damaged there comes from the laptop's
/// OpenCode instead, when its copy is still exactly the proven one. Neither: refused, and
/// the transcript stays owed (nothing else would give the rebuilt guest a wrong history).
fn restore_transcript(env: &mut Env, w: &Work) -> ToolResult<usize> {
    let Some(proof) = w.proofs.last() else { return Ok(0) };
    let mut sessions = Vec::new();
    for s in proof.sessions.iter().filter(|s| s.file.is_some()) {
        let file = s.file.as_deref().unwrap_or_default();
        let mut ledger = Ledger::for_call(&mut env.files, env.ctx);
        let stored = if super::account::stored_intact(&mut ledger, &w.work, file, None)? { ledger.get_blob(&w.work, file)? } else { None };
        let session = match stored.and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok()) {
            Some(v) => v,
            None => laptop_copy(env, w, s).ok_or_else(|| {
                ToolError::with_next(
                    Code::LedgerFailed,
                    format!("work '{}': the ledger's {file} (session {}) is missing or damaged, and this laptop's OpenCode no longer holds that session as it was proven; the rebuilt machine was given no transcript", w.work, s.id),
                    format!("Put {file} back in the work's ledger folder (from a backup), or the session back in this laptop's OpenCode as it was proven, then call boxd_resume for work '{}' again.", w.work),
                )
            })?,
        };
        sessions.push(session);
    }
    if sessions.is_empty() {
        return Ok(0);
    }
    let n = sessions.len();
    let payload = serde_json::to_vec(&json!({ "sessions": sessions })).expect("serialises");
    let mut boxd = Boxd::new(&mut env.programs, env.ctx.options.boxd_timeout_seconds);
    crate::guest::Guest::new(&mut boxd, &w.machine, &w.work).call("import", &[], Some(payload))?;
    Ok(n)
}

/// The laptop OpenCode's copy of a proven session, when it still holds exactly the proven
/// messages (the user added none since) under the proven parent.
fn laptop_copy(env: &mut Env, w: &Work, s: &crate::ledger::SessionProof) -> Option<Value> {
    super::harvest::work_folder_granted(env.ctx, w).ok()?;
    let back = Opencode::new(&mut env.programs).export(&s.id, &w.directory).ok()?;
    let messages = back["messages"].as_array()?;
    let same = messages.len() as u64 == s.messages
        && super::harvest::canonical_digest(messages) == s.digest
        && back["info"]["parentID"].as_str() == s.parent_id.as_deref();
    same.then_some(back)
}

/// A rebuilt machine gets the proven transcript once: imported, then the record says so.
/// (Cut short between the two, the next call imports it again; an import of the same
/// sessions writes the same sessions.)
fn restore_if_pending(env: &mut Env, w: Work) -> ToolResult<(Work, usize)> {
    if !w.restore_pending {
        return Ok((w, 0));
    }
    let n = restore_transcript(env, &w)?;
    let w = Ledger::for_call(&mut env.files, env.ctx).update(&w.work, |w| w.restore_pending = false)?;
    Ok((w, n))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Wake {
    Woken,
    Resumed,
    Started,
    AlreadyRunning,
    Rebuilt,
}

impl Wake {
    fn word(self) -> &'static str {
        match self {
            Wake::Woken => "woken",
            Wake::Resumed => "resumed",
            Wake::Started => "started",
            Wake::AlreadyRunning => "already running",
            Wake::Rebuilt => "rebuilt",
        }
    }
}

pub fn resume(env: &mut Env, args: &Value) -> ToolResult<Value> {
    let (work, machine) = work_arg(args)?;
    let version = Opencode::new(&mut env.programs).version(env.ctx);
    let ctx = env.ctx;
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    let w = ledger.require(&work)?;
    if w.is_closed() {
        return Err(ToolError::with_next(Code::MachineGone, format!("work '{work}' was dropped"), format!("Call boxd_ensure for work '{work}' to start it again.")));
    }
    refuse_under_a_drop(&w, ctx, "reopened")?;
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    // A machine taken up by its name is claimed by the prepare after the wake.
    let state = owned_state_claiming(&mut boxd, &mut ledger, ctx, &w)?;
    // The wake's claim on a slot, released once its run is recorded (admission.rs).
    let mut held = None;
    if matches!(state, State::Asleep | State::Standby | State::Stopped | State::Failed) {
        held = Some(super::admission::admit_wake(&mut boxd, &mut ledger, ctx, &work, &w.directory, state)?);
    }
    // A rebuild names the prompts whose runs went with the gone machine.
    let mut lost: Vec<String> = Vec::new();
    let action = match state {
        State::Asleep => {
            super::admission::woke(&mut ledger, &mut held, boxd.wake(&machine))?;
            Wake::Woken
        }
        State::Standby => {
            super::admission::woke(&mut ledger, &mut held, boxd.resume(&machine))?;
            Wake::Resumed
        }
        State::Stopped | State::Failed => {
            super::admission::woke(&mut ledger, &mut held, boxd.start(&machine))?;
            Wake::Started
        }
        State::Running => Wake::AlreadyRunning,
        State::Starting => return Err(ToolError::new(Code::MachineStarting, format!("{machine} is still starting"))),
        // A drop removed it and was stopped before it closed the work: finish that instead.
        State::Gone if w.state == WorkState::Dropping => {
            return Err(ToolError::with_next(
                Code::MachineGone,
                format!("work '{work}' was being dropped when its machine was removed"),
                format!("Call boxd_drop for work '{work}' to finish closing it."),
            ));
        }
        // The name is free (boxd knows no machine by it): rebuild under it.
        State::Gone => {
            super::machine::same_account(&mut boxd, &w, "nothing was rebuilt")?;
            let rebuilt = create_machine(&mut boxd, &mut ledger, ctx, &work, Build::Rebuild)?;
            lost = w.prompts.iter().filter(|p| !rebuilt.prompts.iter().any(|q| q.id == p.id)).map(|p| p.id.clone()).collect();
            Wake::Rebuilt
        }
    };
    if action != Wake::Rebuilt {
        // Waking restores boxd's default bound on some paths; ours is what limits billing.
        // Also when it is already running: a resume killed between its wake and this call
        // must not leave the default bound behind.
        boxd.set_idle(&machine, ctx.options.idle_seconds()).map_err(Failure::into_error)?;
    }
    let sleeping_then = w.sleeping.clone();
    let w = ledger.update(&work, |w| {
        w.seen_running(&sleeping_then);
        if matches!(action, Wake::Woken | Wake::Started) {
            // It was down: whatever the ledger thought ran ended an idle bound after use.
            w.seen_not_running(ctx.now_ms, ctx.options.idle_ms(), false);
        }
        // Its guest is prepared next (an exec: a use the idle clock counts).
        w.in_use(ctx.now_ms);
    })?;
    if let Some(held) = held {
        ledger.release(held);
    }
    // Prepare starts a server that is not running; a run it interrupted is reported once,
    // by the next boxd_job (no status exec here: resume stays within four round trips).
    super::machine::prepare_rebuilt_guest(&mut boxd, &mut ledger, &w, &ctx.entropy, version.as_deref())?;
    let (w, restored) = restore_if_pending(env, w)?;
    let mut out = work_json(&w, "running");
    out["action"] = json!(action.word());
    out["restoredSessions"] = json!(restored);
    if !lost.is_empty() {
        out["unrecovered"] = json!({ "prompts": lost });
    }
    out["next"] = json!(format!("Call boxd_job for work '{work}'."));
    Ok(out)
}

#[cfg(test)]
mod spend_tests;

#[cfg(test)]
mod claim_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{open_work, raw_at, Scripted, OURS};
    use crate::tools::call;

    /// A work a drop marked moments ago is not reopened under it, and its sealed guest is
    /// not prepared again (a prompt would run on the machine the drop is removing); one
    /// marked long ago (an interrupted drop) is. A mark more than an hour ahead of the clock
    /// (a clock a day ahead when the drop marked it) held the work for that day; one 20
    /// minutes ahead (the clock stepped back while the drop ran) is still waited on.
    #[test]
    fn ensure_and_resume_leave_a_young_drop_to_finish() {
        let now = 3 * crate::ledger::IN_FLIGHT_MS;
        let marks = [(now - 30_000, true), (now - crate::ledger::IN_FLIGHT_MS, false), (now + 20 * 60_000, true), (now + 86_400_000, false)];
        for (mark, refused) in marks {
            for tool in ["boxd_ensure", "boxd_resume"] {
                let mut fs = open_work(None);
                Ledger::new(&mut fs, "/l").update("w1", |w| (w.state, w.dropping_ms) = (WorkState::Dropping, mark)).unwrap();
                let raw = raw_at(now);
                let mut p = Scripted::default();
                p.push_exit(0, "1.18.33", "");
                p.push_exit(0, OURS, "");
                for _ in 0..4 {
                    p.push_exit(0, r#"{"ok":true,"work":"w1"}"#, "");
                }
                let r = call(&mut p, &mut fs, tool, r#"{"work":"w1"}"#, raw);
                let state = Ledger::new(&mut fs, "/l").require("w1").unwrap().state;
                if refused {
                    let e = r.unwrap_err();
                    assert!(e.code == Code::SessionBusy && e.next.contains("boxd_drop for work 'w1'"), "{tool}: {e:?}");
                    assert_eq!(state, WorkState::Dropping, "{tool}");
                    assert!(p.commands().iter().all(|c| !c.starts_with("machine exec")), "{tool}: nothing reached the guest: {:?}", p.commands());
                } else {
                    // ensure reopens an interrupted drop's work; resume only wakes its machine.
                    assert!(r.is_ok(), "{tool}: {r:?} {:?}", p.commands());
                    assert_eq!(state, if tool == "boxd_ensure" { WorkState::Open } else { WorkState::Dropping }, "{tool}");
                }
            }
        }
    }

    const GOLDEN: &str = r#"[{"name":"opencode-golden","version":"1","status":"ready"}]"#;
    const GONE: &str = "error: VM 'oc-w1' not found";

    /// `get` says the machine is gone but the listing shows it (a proxy's 404): a resume
    /// rebuilds nothing and names no prompt lost, and an ensure of a new work writes no
    /// create. Both end before any create, with the record as it was.
    #[test]
    fn a_not_found_the_listing_contradicts_creates_and_rebuilds_nothing() {
        for (tool, new) in [("boxd_resume", false), ("boxd_ensure", true)] {
            let mut fs = if new { crate::testing::MemFiles::new(&["/p", "/l"]) } else { open_work(None) };
            if !new {
                Ledger::new(&mut fs, "/l").update("w1", |w| w.prompts.push(crate::ledger::Prompt { id: "p1".into(), admitted: true, ..Default::default() })).unwrap();
            }
            let before = Ledger::new(&mut fs, "/l").read("w1").unwrap();
            let mut p = Scripted::default();
            p.push_exit(0, "1.18.33", "");
            p.push_fail(1, GONE);
            p.push_exit(0, r#"[{"name":"oc-w1","status":"running"}]"#, "");
            let e = call(&mut p, &mut fs, tool, r#"{"work":"w1"}"#, crate::testing::raw_context("{}", "{}")).unwrap_err();
            assert_eq!(e.code, Code::BoxdFailed, "{tool}: {e:?}");
            assert!(e.message.contains("list shows it (running)"), "{tool}: {}", e.message);
            assert!(p.commands().iter().all(|c| !c.starts_with("machine new") && !c.starts_with("snapshots")), "{tool}: {:?}", p.commands());
            assert_eq!(Ledger::new(&mut fs, "/l").read("w1").unwrap(), before, "{tool}: the record is as it was");
        }
    }

    /// A create that finds the name taken though the listing did not show it. When no
    /// create of this ledger was under way, one look decides: a machine not made from the
    /// golden snapshot is someone else's (NOT_OURS, the intent withdrawn, so no ensure
    /// adopts it); one made like ours may be another call's create of this work at once or
    /// boxd's retry of this one, and stays creating. A create already under way (one that
    /// answered late) stays creating without a look. Either way the next ensure adopts.
    #[test]
    fn a_name_taken_under_the_first_create_is_adopted_only_when_made_like_ours() {
        let facts = r#"{"opencodeVersion":"1.18.33"}"#;
        let standalone = r#"{"name":"oc-w1","id":"vm_someone","status":"running","source":"standalone","auto_hibernate":"off","sharing":"private","isolated":"no"}"#;
        let golden = r#"{"name":"oc-w1","id":"vm_1","status":"running","source":"snapshot/opencode-golden:v1","sharing":"private","isolated":"no"}"#;
        for (under_way, found, ours) in [(true, None, true), (false, Some(standalone), false), (false, Some(golden), true)] {
            let mut fs = crate::testing::MemFiles::new(&["/p", "/l"]);
            if under_way {
                Ledger::new(&mut fs, "/l").upsert("w1", |_| {
                    let mut w = Work::new("w1", "/p", "2026-01-01T00:00:00Z");
                    w.state = WorkState::Creating;
                    Ok(Some(w))
                }).unwrap();
            }
            let mut p = Scripted::default();
            p.push_fail(1, GONE);
            p.push_exit(0, "[]", "");
            p.push_exit(0, GOLDEN, "");
            p.push_fail(1, "error: VM 'oc-w1' already exists");
            if let Some(found) = found {
                p.push_exit(0, found, "");
            }
            let e = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, crate::testing::raw_context("{}", facts)).unwrap_err();
            assert_eq!(e.code, if ours { Code::CreateUncertain } else { Code::NotOurs }, "{e:?}");
            let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
            assert_eq!((w.state, w.machine_id.as_deref()), (if ours { WorkState::Creating } else { WorkState::Open }, None), "{found:?}");
            let mut p = Scripted::default();
            p.push_exit(0, found.unwrap_or(OURS), "");
            p.push_exit(0, r#"{"user_id":"usr_1","active_org":null}"#, ""); // the account it is in
            p.push_exit(0, "", "");
            p.push_exit(0, crate::testing::CLAIMED, "");
            p.push_exit(0, r#"{"ok":true}"#, "");
            let r = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, crate::testing::raw_context("{}", facts));
            if ours {
                assert_eq!(r.unwrap()["adopted"], true);
            } else {
                let e = r.unwrap_err();
                assert!(e.code == Code::NotOurs && e.next.contains("Leave oc-w1 alone"), "{e:?}");
                assert_eq!(p.commands(), ["machine get oc-w1 --json"], "nothing reached their machine");
            }
        }
    }

    /// A create whose answer has an empty id recorded no id: the work stays creating and
    /// the next ensure adopts the machine by the id `get` gives. A `get` without an id (or
    /// about another name) cannot be checked, so it is boxd's failure, not a machine.
    #[test]
    fn an_empty_id_is_no_id() {
        let facts = r#"{"opencodeVersion":"1.18.33"}"#;
        let mut fs = crate::testing::MemFiles::new(&["/p", "/l"]);
        let mut p = Scripted::default();
        p.push_fail(1, GONE);
        p.push_exit(0, "[]", "");
        p.push_exit(0, GOLDEN, "");
        p.push_exit(0, r#"{"name":"oc-w1","id":"","boot":"0.1s"}"#, "");
        let e = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, crate::testing::raw_context("{}", facts)).unwrap_err();
        assert_eq!(e.code, Code::CreateUncertain, "{e:?}");
        let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        assert_eq!((w.state, w.machine_id), (WorkState::Creating, None));
        for got in [r#"{"name":"oc-w1","id":"","status":"running"}"#, r#"{"name":"oc-w2","id":"vm_2","status":"running"}"#, r#"{"status":"running"}"#] {
            let mut p = Scripted::default();
            p.push_exit(0, got, "");
            let e = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, crate::testing::raw_context("{}", facts)).unwrap_err();
            assert_eq!(e.code, Code::BoxdFailed, "{got}: {e:?}");
            assert_eq!(p.commands().len(), 1, "{got}");
        }
        let mut p = Scripted::default();
        p.push_exit(0, OURS, "");
        p.push_exit(0, r#"{"user_id":"usr_1","active_org":null}"#, ""); // the account it is in
        p.push_exit(0, "", "");
        p.push_exit(0, crate::testing::CLAIMED, "");
        p.push_exit(0, r#"{"ok":true}"#, "");
        let v = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, crate::testing::raw_context("{}", facts)).unwrap();
        assert_eq!((v["adopted"].as_bool(), v["machineId"].as_str()), (Some(true), Some("vm_1")));
    }

    /// A hibernate boxd answers with exit 0 and a JSON error did not happen: BOXD_FAILED in
    /// boxd's words, and the work is not recorded asleep (its run interval stays open).
    #[test]
    fn a_hibernate_answered_with_a_json_error_is_not_taken_for_asleep() {
        let mut fs = open_work(None);
        Ledger::new(&mut fs, "/l").update("w1", |w| w.open_run(1)).unwrap();
        let mut p = Scripted::default();
        p.push_exit(0, OURS, "");
        p.push_exit(0, r#"{"error":"internal: machine is busy"}"#, "");
        let e = call(&mut p, &mut fs, "boxd_sleep", r#"{"work":"w1"}"#, raw_at(10)).unwrap_err();
        assert!(e.code == Code::BoxdFailed && e.message.contains("machine is busy"), "{e:?}");
        let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        assert!(w.sleeps.is_empty() && !w.asleep_by_tool && w.running_since() == Some(1), "{w:?}");
    }
}
