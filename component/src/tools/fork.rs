//! boxd_fork: copy a work whose transcript is proven into new works (boxd's machine fork),
//! one machine each, for trying several approaches at once. Every fork is recorded as
//! queued first (intent before effect), then admitted in order under the caps and
//! ceilings; those past a cap stay queued, and a later boxd_fork for the same parent
//! admits them, oldest first, once a slot frees.
//!
//! A fork's machine carries the parent's home. Its work tree is copied from the parent's
//! without the parent's `.boxd/` (server, password, inbox, session), so the fork's guest
//! starts clean under its own id and password, and its first prompt opens a new session:
//! its harvest brings home only the fork's own messages. The link to the parent (its work,
//! the prompt it forked at, the parent's proven sessions) lives in the fork's record.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::{json, Value};

use super::admission::{claim, headroom, refused};
use super::machine::{check_owned, owned_state, prepare_guest, work_json};
use super::{require_open, require_proven, work_arg, Env};
use crate::boxd::{Boxd, Failure, State};
use crate::caps::{Files, Programs};
use crate::errors::{Code, ToolError, ToolResult};
use crate::ledger::{iso8601, ForkOrigin, Ledger, Work, WorkState, MACHINE_SIZE};
use crate::opencode::Opencode;
use crate::options::Context;
use crate::paths;

/// The most forks one call may name (each is a billing machine).
pub const MAX_FORKS: usize = 8;

/// The parent, its existing forks and the new fork ids, read from the ledger and checked:
/// every refusal before a fork is recorded.
fn admit(env: &mut Env, args: &Value) -> ToolResult<(Work, Vec<Work>, Vec<String>)> {
    let (parent_id, _) = work_arg(args)?;
    let ids = fork_ids(args, &parent_id)?;
    let mut ledger = Ledger::for_call(&mut env.files, env.ctx);
    let parent = ledger.require(&parent_id)?;
    require_open(&parent)?;
    if parent.state != WorkState::Open {
        return Err(ToolError::new(Code::WorkConflict, format!("work '{parent_id}' is {}; only an open work can be forked", parent.state.as_str())));
    }
    // Each fork would start its spend and its age from nothing with the parent's transcript.
    super::admission::check_lifetime(&parent, env.ctx)?;
    super::admission::check_spend(&parent, env.ctx)?;
    let forks = forks_of(&mut ledger, &parent)?;
    let new: Vec<String> = ids.into_iter().filter(|id| !forks.iter().any(|w| &w.work == id)).collect();
    if !new.is_empty() {
        // Only a proven parent is copied: a fork of an unharvested transcript would hold
        // prompts the laptop has never seen.
        require_proven(&parent)?;
    }
    Ok((parent, forks, new))
}

/// The refusals a fork gives before it records anything (see `admit`).
pub fn check(env: &mut Env, args: &Value) -> ToolResult<()> {
    admit(env, args).map(|_| ())
}

pub fn run(env: &mut Env, args: &Value) -> ToolResult<Value> {
    let (parent, mut forks, new) = admit(env, args)?;
    let parent_id = parent.work.clone();
    let ctx = env.ctx;
    let version = Opencode::new(&mut env.programs).version(ctx);
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    if !new.is_empty() {
        // Numbered under the parent's fork lock, from the forks as they are then: two
        // boxd_fork calls at once never give two forks one place in the queue.
        forks = ledger.serialized(&parent_id, "forks", |ledger| {
            let mut forks = forks_of(ledger, &parent)?;
            let mut order = forks.iter().map(|w| w.fork.as_ref().map_or(0, |f| f.order)).max().unwrap_or(0);
            let fresh: Vec<&String> = new.iter().filter(|id| !forks.iter().any(|w| &w.work == *id)).collect();
            for id in fresh {
                order += 1;
                forks.push(record_fork(ledger, ctx, &parent, id, order)?);
            }
            Ok(forks)
        })?;
    }
    let waiting_ids: Vec<&Work> = forks.iter().filter(|w| matches!(w.state, WorkState::Queued | WorkState::Creating)).collect();
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    let mut waiting = None;
    let mut admitted = Vec::new();
    if !waiting_ids.is_empty() {
        parent_up(&mut boxd, &mut ledger, ctx, &parent)?;
        // `machine fork` names the parent by name; a fork and its guest take seconds to
        // minutes, so the parent is looked at again (its id too) before each later fork.
        let mut parent_seen = true;
        let queue: Vec<Work> = waiting_ids.into_iter().cloned().collect();
        // The forks this call made or found made: each counts against the caps on every
        // later look, whether or not boxd lists it yet.
        let mut made: Vec<(String, String)> = Vec::new();
        for w in queue {
            // The record as it is now: another boxd_fork of this parent at once may have made
            // this fork since the snapshot, or a drop closed it.
            let Some(w) = ledger.read(&w.work)? else { continue };
            let step = match w.state {
                WorkState::Closed => continue,
                WorkState::Queued | WorkState::Creating => {
                    let adopted = if w.state == WorkState::Creating || w.machine_id.is_some() { adopt_fork(&mut boxd, &mut ledger, ctx, &parent.machine, &w)? } else { None };
                    match adopted {
                        Some(step) => step,
                        None => {
                            // Each fork is admitted on its own claim and its own look at what
                            // runs (admission.rs): other calls start machines meanwhile.
                            let held = claim(&mut ledger, ctx, &w.work, &w.directory, MACHINE_SIZE, false)?;
                            let room = headroom(&mut boxd, &mut ledger, ctx, &w.work).map(|mut room| {
                                made.iter().for_each(|(id, dir)| room.take(ctx, id, dir));
                                room
                            });
                            let admitted = room.and_then(|room| room.check(ctx, &w.work, &w.directory, w.spend_micros(&ctx.options.prices, ctx.now_ms)));
                            if let Err(e) = admitted {
                                ledger.release(held);
                                if !matches!(e.code, Code::CapReached | Code::CeilingReached) {
                                    return Err(e);
                                }
                                // In order: nothing behind a fork that waits jumps ahead of it.
                                waiting = Some(e);
                                break;
                            }
                            // The parent as the ledger has it now (a resume may have rebuilt it,
                            // a prompt may have reached it since the fork was queued): the
                            // same record, open, proven, and, after the first fork, up.
                            let now = match parent_now(&mut ledger, &parent) {
                                Ok(now) if parent_seen => Ok(now),
                                Ok(now) => parent_up(&mut boxd, &mut ledger, ctx, &now).map(|_| now),
                                Err(e) => Err(e),
                            };
                            let now = match now {
                                Ok(now) => now,
                                Err(e) => {
                                    ledger.release(held);
                                    waiting = Some(e);
                                    break;
                                }
                            };
                            parent_seen = false;
                            let step = fork_machine(&mut boxd, &mut ledger, ctx, &now, &w);
                            // A fork that may still land (left `creating`) keeps its claim until
                            // boxd lists it, for at most CLAIM_MS; any other outcome releases it.
                            let may_land = step.is_err() && matches!(ledger.read(&w.work), Ok(Some(r)) if r.state == WorkState::Creating);
                            if !may_land {
                                ledger.release(held);
                            }
                            step?
                        }
                    }
                }
                _ => Step::Elsewhere,
            };
            // A fork another call makes or made runs too: it counts against the caps.
            made.push((w.work.clone(), w.directory.clone()));
            if let Step::Ready(w) = step {
                // Readying a fork takes seconds to minutes: the next fork looks again.
                parent_seen = false;
                if let Some(guest) = ready_guest(&mut boxd, &mut ledger, ctx, &parent, &w, version.as_deref())? {
                    admitted.push((w.work.clone(), guest));
                }
            }
        }
    }
    if let Some(e) = waiting.as_ref().filter(|e| e.code == Code::CeilingReached && admitted.is_empty()) {
        return Err(ToolError::with_next(e.code, e.message.clone(), format!("{} The forks stay queued: call boxd_fork for work '{parent_id}' again to admit them.", e.next)));
    }
    answer(&mut ledger, &parent_id, &forks, admitted, waiting)
}

/// The parent's record as it is now, when it is still the record the forks were queued
/// from, open, and proven since its last prompt: what a fork made now copies.
fn parent_now<F: Files>(ledger: &mut Ledger<F>, parent: &Work) -> ToolResult<Work> {
    let now = ledger.require(&parent.work)?;
    if now.created_at != parent.created_at || now.state != WorkState::Open {
        return Err(ToolError::new(Code::WorkConflict, format!("work '{}' changed under this boxd_fork (it is {} now); no more forks were made from it", parent.work, now.state.as_str())));
    }
    require_proven(&now)?;
    Ok(now)
}

/// The parent's machine is ours (its id), up, and holds the transcript: a fork copies it.
fn parent_up<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, ctx: &Context, parent: &Work) -> ToolResult<()> {
    match owned_state(boxd, ledger, ctx, parent)? {
        State::Running | State::Standby => super::machine::require_restored(parent),
        state => Err(ToolError::with_next(
            Code::MachineAsleep,
            format!("{} is {}: a fork copies a machine that is up", parent.machine, super::status::job_state(state)),
            format!("Call boxd_resume for work '{}', then boxd_fork again (its queued forks wait in the ledger).", parent.work),
        )),
    }
}

/// The `forks` argument: new work ids, each valid, none twice, none the parent.
fn fork_ids(args: &Value, parent: &str) -> ToolResult<Vec<String>> {
    let mut ids: Vec<String> = Vec::new();
    for v in args.get("forks").and_then(Value::as_array).into_iter().flatten() {
        let id = v.as_str().unwrap_or_default();
        paths::work_id(id)?;
        if id == parent || ids.iter().any(|i| i == id) {
            return Err(ToolError::new(Code::ArgsInvalid, format!("forks names '{id}' twice (or names the parent)")));
        }
        ids.push(id.to_string());
    }
    Ok(ids)
}

/// Whether `w` is a fork of this parent record: its id, and (when the fork recorded it) the
/// same record, not a dropped parent's id ensured again.
fn fork_of(w: &Work, parent: &Work) -> bool {
    w.fork.as_ref().is_some_and(|f| f.parent == parent.work && f.parent_created.as_ref().is_none_or(|c| *c == parent.created_at))
}

/// The parent's forks still open or waiting, oldest first.
fn forks_of<F: Files>(ledger: &mut Ledger<F>, parent: &Work) -> ToolResult<Vec<Work>> {
    let mut forks = Vec::new();
    for id in ledger.ids()? {
        if let Some(w) = ledger.read(&id)?.filter(|w| !w.is_closed() && fork_of(w, parent)) {
            forks.push(w);
        }
    }
    forks.sort_by_key(|w| w.fork.as_ref().map_or(0, |f| f.order));
    Ok(forks)
}

/// Record a new fork as queued, or refuse an id the ledger holds for something else (an
/// id is one work: never a second machine under it). One recorded as this parent's fork
/// since `admit` read the ledger (another boxd_fork at once) is taken as it is.
fn record_fork<F: Files>(ledger: &mut Ledger<F>, ctx: &Context, parent: &Work, id: &str, order: u64) -> ToolResult<Work> {
    let now = iso8601(ctx.now_ms);
    let w = ledger.upsert(id, |cur| {
        if let Some(w) = cur {
            if !w.is_closed() && fork_of(&w, parent) {
                return Ok(None);
            }
            let what = match &w.fork {
                _ if w.is_closed() => "a dropped work (pick a new id for the fork)".to_string(),
                Some(f) => format!("a fork of work '{}'", f.parent),
                None => "a work of its own (boxd_ensure made it)".to_string(),
            };
            return Err(ToolError::new(Code::WorkConflict, format!("work '{id}' is in the ledger as {what}; no fork was made")));
        }
        let mut w = Work::new(id, &parent.directory, &now);
        w.state = WorkState::Queued;
        w.snapshot = parent.snapshot.clone();
        // A fork is made in its parent's account: boxd forks never cross one.
        w.account = parent.account.clone();
        w.fork = Some(ForkOrigin {
            parent: parent.work.clone(),
            at_prompt: parent.prompts.last().map(|p| p.id.clone()),
            inherited: parent.proofs.last().map(|p| p.sessions.iter().map(|s| (s.id.clone(), s.messages)).collect()).unwrap_or_default(),
            order,
            parent_created: Some(parent.created_at.clone()),
            ..Default::default()
        });
        Ok(Some(w))
    })?;
    Ok(w.expect("a new fork is written"))
}

/// Where a fork's machine stands for this call: made or adopted, and this call's to ready;
/// or another boxd_fork's (at once), which readies it.
enum Step {
    Ready(Work),
    Elsewhere,
}

/// How long a fork's claim (`creating`, no machine id yet) keeps another call from forking
/// it again: the call that holds it may still be waiting on its `machine fork` (a call
/// admits up to MAX_FORKS, one after another, and only knows its start time). The same
/// bound as a prompt that may still be on its way.
pub const FORK_CLAIM_MS: u64 = crate::ledger::IN_FLIGHT_MS;

/// A fork that is `creating` (a `machine fork` under way, or one that never answered), or
/// whose machine is recorded: take up the machine under its name. None when there is none
/// and no other call may still be making it (it is forked again).
fn adopt_fork<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, ctx: &Context, parent_machine: &str, w: &Work) -> ToolResult<Option<Step>> {
    let Some(info) = boxd.get(&w.machine).map_err(Failure::into_error)? else {
        let held = w.state == WorkState::Creating && w.machine_id.is_none() && !crate::ledger::waited(w.created_ms, FORK_CLAIM_MS, ctx.now_ms);
        return Ok(held.then_some(Step::Elsewhere));
    };
    if info.id.is_empty() {
        return Err(ToolError::new(Code::NotOurs, format!("boxd gave no id for {}, so it cannot be checked against the ledger", info.name)));
    }
    // Taken by its name alone (no id recorded): only a machine forked from this parent with
    // our idle bound can be the fork a call of ours made; another under the name is not.
    if w.machine_id.is_none() && !super::machine::made_like_ours(&info, &format!("fork/{}", parent_machine), ctx.options.idle_seconds()) {
        return Err(ToolError::with_next(
            Code::NotOurs,
            format!("{} exists, but it was not forked from {parent_machine} the way this plugin forks (source '{}', auto-hibernate '{}'); it is not adopted", info.name, info.source, info.auto_hibernate),
            format!("Leave {} alone; drop fork '{}' (boxd_drop) and fork again under another id.", info.name, w.work),
        ));
    }
    let mut owned = w.clone();
    owned.machine_id.get_or_insert_with(|| info.id.clone());
    check_owned(ledger, ctx, &owned, &info)?;
    // Only a fork still waiting, with no machine recorded or this one: another call at once
    // may have opened it, recorded another, or a drop closed it since.
    let mut took = false;
    let w = ledger.update(&w.work, |w| {
        if matches!(w.state, WorkState::Queued | WorkState::Creating) && w.dropping_ms == 0 && w.machine_id.as_ref().is_none_or(|id| *id == info.id) {
            w.taken_by_name |= w.machine_id.is_none();
            w.machine_id = Some(info.id.clone());
            w.state = WorkState::Creating;
            w.open_run(ctx.now_ms);
            took = true;
        }
    })?;
    Ok(Some(if took { Step::Ready(w) } else { Step::Elsewhere }))
}

/// Fork the parent's machine into the fork's. The fork is claimed first (`creating`, with
/// this call's time), so one that lands after boxd stops answering is adopted by the next
/// boxd_fork, never made twice, and a call at once leaves it to this one (`FORK_CLAIM_MS`).
/// Every later write that undoes the claim checks it is still this call's. Only a failure
/// that made nothing for certain puts the fork back in the queue; any other leaves it
/// `creating` with the claim released, so a fork that lands late is adopted, never taken
/// for someone else's.
fn fork_machine<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, ctx: &Context, parent: &Work, w: &Work) -> ToolResult<Step> {
    let machine = &w.machine;
    let (mut claimed, mut from_queue) = (false, false);
    ledger.update(&w.work, |w| {
        let stale = w.state == WorkState::Creating && crate::ledger::waited(w.created_ms, FORK_CLAIM_MS, ctx.now_ms);
        // A fork a drop marked is the drop's to close: never claimed again.
        if w.machine_id.is_none() && w.dropping_ms == 0 && (w.state == WorkState::Queued || stale) {
            from_queue = w.state == WorkState::Queued;
            w.state = WorkState::Creating;
            w.created_ms = ctx.now_ms;
            // What the fork copies is the parent as it is now, not as it was when queued.
            if let Some(f) = &mut w.fork {
                f.at_prompt = parent.prompts.last().map(|p| p.id.clone());
                f.inherited = parent.proofs.last().map(|p| p.sessions.iter().map(|s| (s.id.clone(), s.messages)).collect()).unwrap_or_default();
            }
            // Its tree is a copy of the parent's: the files the laptop sent there or brought
            // home from there are the laptop's in the fork too (a submit over one was refused
            // as the agent's, and an untouched fork's drop as untracked).
            w.files_in = parent.files_in.clone();
            w.files_out = parent.files_out.clone();
            claimed = true;
        }
    })?;
    if !claimed {
        return Ok(Step::Elsewhere);
    }
    let mine = |w: &Work| w.state == WorkState::Creating && w.machine_id.is_none() && w.created_ms == ctx.now_ms;
    // Back in the queue (`queued`), or left creating with the claim released (age 0 reads as
    // stale): only while the claim is still this call's.
    let unclaim = |ledger: &mut Ledger<F>, queued: bool| -> ToolResult<bool> {
        let mut undone = false;
        ledger.update(&w.work, |w| {
            if mine(w) {
                if queued {
                    w.state = WorkState::Queued;
                } else {
                    w.created_ms = 0;
                }
                undone = true;
            }
        })?;
        Ok(undone)
    };
    let again = format!("Call boxd_fork for work '{}' again: it adopts the fork if it appears.", parent.work);
    let created = match boxd.fork(&parent.machine, machine, ctx.options.idle_seconds()) {
        Ok(c) => c,
        Err(Failure::Timeout(m)) => {
            // No other call holds the fork now: the claim is released (it stays creating), so
            // the next boxd_fork adopts the machine if it landed, or forks it again, which
            // boxd refuses while the late one holds the name (CREATE_UNCERTAIN, then adopted).
            unclaim(ledger, false)?;
            return Err(ToolError::with_next(
                Code::CreateUncertain,
                format!("boxd machine fork did not answer ({m}); {machine} may still appear"),
                format!("Call boxd_fork for work '{}' again: it adopts the fork if it appeared, or forks it again.", parent.work),
            ));
        }
        Err(Failure::Other(m)) if m.contains("already exists") && from_queue => {
            // Claimed from the queue, so no call of ours had forked it: the name is someone
            // else's. A claim another call took since is that call's to settle.
            if !unclaim(ledger, true)? {
                return Ok(Step::Elsewhere);
            }
            return Err(ToolError::with_next(
                Code::NotOurs,
                format!("a machine named {machine} exists, but this laptop's ledger did not create it; the fork stays queued"),
                format!("Leave {machine} alone; call boxd_drop for work '{}' (a queued fork: boxd is sent nothing) and boxd_fork for work '{}' with another fork id, or call boxd_fork for work '{}' again once that name is free.", w.work, parent.work, parent.work),
            ));
        }
        Err(Failure::Other(m)) if m.contains("already exists") => {
            // A claim taken over from one that never answered: its fork may have landed late.
            return Err(ToolError::with_next(Code::CreateUncertain, format!("boxd says {machine} already exists; an earlier boxd_fork of it may have made it late"), again));
        }
        Err(e) => {
            // A failure may still have made the fork (boxd failing after it). One look: there,
            // it is the one this call made, and the fork stays creating for the next boxd_fork
            // to adopt. Absent after a failure that made nothing for certain (signed out, no
            // CLI, the host's policy, quota), it goes back in the queue, in its place; after
            // any other it stays creating with the claim released, so one that lands late is
            // adopted and one that never does is forked again by the next call.
            let definite = matches!(e, Failure::SignedOut(_) | Failure::Missing(_) | Failure::Refused(_));
            let e = refused(e);
            if let Ok(None) = boxd.get(machine) {
                unclaim(ledger, definite || e.code == Code::QuotaReached)?;
                return Err(e);
            }
            return Err(ToolError::with_next(e.code, format!("{}; {machine} exists now, so the fork may have been made", e.message), again));
        }
    };
    let Some(id) = created.id.filter(|_| !created.boot_timeout) else {
        return Err(ToolError::with_next(Code::CreateUncertain, format!("boxd forked {machine} but its boot timed out or its answer carried no id"), again));
    };
    // Recorded while the fork still waits (creating again if a call that took a stale claim
    // found the name taken by this fork and put it back in the queue). Another call may have
    // adopted the machine and readied it since (it is that call's now); a drop may have
    // closed the record in that moment, and then the machine made for it, which no record
    // names, is removed (it holds nothing yet).
    let mut took = false;
    let w = ledger.update(&w.work, |w| {
        if matches!(w.state, WorkState::Queued | WorkState::Creating) && w.machine_id.as_ref().is_none_or(|m| *m == id) {
            w.machine_id = Some(id.clone());
            w.state = WorkState::Creating;
            w.open_run(ctx.now_ms);
            took = true;
        }
    })?;
    if took {
        return Ok(Step::Ready(w));
    }
    if w.is_closed() && w.machine_id.is_none() {
        return match boxd.remove(machine) {
            Ok(()) => Ok(Step::Elsewhere),
            Err(f) => Err(ToolError::with_next(
                Code::BoxdFailed,
                format!("work '{}' was dropped while its fork was being made, and removing the new {machine} ({id}) failed: {}", w.work, f.into_error().message),
                format!("Remove it with 'boxd machine remove {machine} -y' (it holds nothing yet)."),
            )),
        };
    }
    Ok(Step::Elsewhere)
}

/// Give the fork its own work tree (a copy of the parent's without its `.boxd/`) and its
/// own guest (password, server, pump), then open it. Idempotent: a tree already there is
/// kept, so a call killed midway is finished by the next, and two calls at once each copy
/// into their own folder and the first rename wins (`mv -T` never moves one copy into the
/// other; a copy whose folder went loses quietly, and once the tree is there every copy
/// folder left goes, a removal that races a copy still writing being no failure: the
/// script answers whether the tree is there). The guest is prepared before the fork is opened, so an open fork
/// always has one (two calls at once both prepare it, with the ledger's one password).
/// None when another call opened it, or it is no longer creating (a drop under way).
fn ready_guest<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, ctx: &Context, parent: &Work, w: &Work, version: Option<&str>) -> ToolResult<Option<Value>> {
    // Work ids are [a-z0-9-]: safe in the script as they are.
    let (from, to) = (&parent.work, &w.work);
    let script = format!(
        "cd \"$HOME/work\" && [ -d {from} ] && {{ [ -e {to} ] || {{ t={to}.fork-tmp.$$; {{ rm -rf \"$t\" && cp -a {from} \"$t\" && rm -rf \"$t/.boxd\" && mv -T \"$t\" {to} 2>/dev/null; }} || rm -rf \"$t\" 2>/dev/null; }}; rm -rf {to}.fork-tmp.* 2>/dev/null; [ -d {to} ]; }}"
    );
    let out = boxd.exec(&w.machine, &["sh", "-c", &script], None, 120).map_err(Failure::into_error)?;
    if out.exit_code != Some(0) {
        return Err(ToolError::with_next(
            Code::GuestWorkspace,
            format!("could not copy work '{from}''s tree into fork '{to}' on {}: {}", w.machine, String::from_utf8_lossy(&out.stderr).trim()),
            format!("Call boxd_fork for work '{from}' again: it copies the tree again."),
        ));
    }
    let Some(mut w) = ledger.read(to)?.filter(|w| w.state == WorkState::Creating) else { return Ok(None) };
    // The copied home holds the parent's helper; every exec checks its digest anyway (a
    // missing or other file is uploaded then), so no upload is spent up front.
    w.helper_sha256 = parent.helper_sha256.clone();
    // One password per work: the call's random bytes, told apart by the fork's id.
    let mut seed = ctx.entropy.clone();
    seed.extend_from_slice(to.as_bytes());
    let entropy = if ctx.entropy.len() < 16 { ctx.entropy.clone() } else { crate::encode::sha256_hex(&seed).into_bytes() };
    let guest = prepare_guest(boxd, ledger, &w, &entropy, version)?;
    let mut opened = false;
    ledger.update(to, |w| {
        if w.state == WorkState::Creating && w.dropping_ms == 0 {
            w.state = WorkState::Open;
            opened = true;
        }
    })?;
    Ok(opened.then_some(guest))
}

/// boxd_fork's answer: each of the parent's forks with its state, what was admitted now,
/// and what the queue waits for.
fn answer<F: Files>(ledger: &mut Ledger<F>, parent: &str, forks: &[Work], admitted: Vec<(String, Value)>, waiting: Option<ToolError>) -> ToolResult<Value> {
    let mut rows = Vec::new();
    for f in forks {
        let w = ledger.read(&f.work)?.unwrap_or_else(|| f.clone());
        let state = match w.state {
            WorkState::Open => "running",
            s => s.as_str(),
        };
        let mut row = work_json(&w, state);
        let origin = w.fork.clone().unwrap_or_default();
        row["parent"] = json!(origin.parent);
        row["atPrompt"] = json!(origin.at_prompt);
        row["admittedNow"] = json!(admitted.iter().any(|(id, _)| id == &w.work));
        row["guest"] = admitted.iter().find(|(id, _)| id == &w.work).map_or(Value::Null, |(_, g)| g.clone());
        rows.push(row);
    }
    let queued: Vec<String> = rows.iter().filter(|r| r["state"] == "queued").filter_map(|r| r["work"].as_str().map(String::from)).collect();
    let creating: Vec<String> = rows.iter().filter(|r| r["state"] == "creating").filter_map(|r| r["work"].as_str().map(String::from)).collect();
    let next = match &waiting {
        // The parent's name holds another machine: its own is gone, and no fork can be made
        // from it again. One step: drop it (its next says so) and its queued forks.
        Some(e) if e.code == Code::NotOurs && !queued.is_empty() => format!("{} Its queued forks ({}) can no longer be made from it: boxd_drop each of them too.", e.next, queued.join(", ")),
        Some(e) if e.code == Code::NotOurs => e.next.clone(),
        Some(e) => format!("{} The queued forks ({}) wait in the ledger: call boxd_fork for work '{parent}' again to admit them in order.", e.next, queued.join(", ")),
        // Being made by another call (or by one that never answered): it finishes them.
        None if !creating.is_empty() => format!(
            "Forks {} are still being made by another boxd_fork call: call boxd_fork for work '{parent}' again in a later turn (it adopts them once their machines are there), then boxd_submit each.",
            creating.join(", ")
        ),
        None => "Call boxd_submit for each fork with its own prompt, boxd_job for each in a later turn, then boxd_harvest each and compare; boxd_drop the ones you do not keep.".to_string(),
    };
    Ok(json!({
        "work": parent,
        "forks": rows,
        "queued": queued,
        "waiting": waiting.map(|e| json!({ "error": e.code.as_str(), "message": e.message })),
        "next": next,
    }))
}

#[cfg(test)]
mod tests;
