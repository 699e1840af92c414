//! boxd_drop: destroy a work's machine only when the laptop can account for everything on
//! it. The drop is recorded before the machine is sealed and checked (`account`), so one
//! killed midway is finished by the next; a work whose machine is gone is closed, naming
//! what could not be recovered.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::{json, Value};

use super::machine::{check_machine, work_json};
use super::{require_proven, work_arg, Env};
use crate::boxd::{Boxd, Failure, State};
use crate::caps::Files;
use crate::errors::{Code, ToolError, ToolResult};
use crate::options::Context;
use crate::ledger::{amount, iso8601, Ledger, Work, WorkState};

/// The cost and lifetime a drop fixed in the closed record.
fn settled_json(w: &Work) -> Value {
    match &w.settled {
        Some(s) => json!({ "cost": amount(s.cost_micros), "lifetimeHours": hours(s.lifetime_ms), "runningHours": hours(s.running_ms) }),
        None => Value::Null,
    }
}

/// Close the work with its settled cost: the record as written, and the answer's start.
pub(super) fn close<F: Files>(ledger: &mut Ledger<F>, work: &str, ctx: &Context) -> ToolResult<(Work, Value)> {
    Ok(match close_when(ledger, work, ctx, |_| true)? {
        Ok(closed) => closed,
        // Closed by another drop at once: its settled cost stands.
        Err(w) => {
            let mut out = work_json(&w, "gone");
            out["dropped"] = json!(true);
            out["settled"] = settled_json(&w);
            (w, out)
        }
    })
}

/// `close`, only if `when` holds for the record as it is at the write: Err with that record
/// (closed already, or changed) when it does not.
fn close_when<F: Files>(ledger: &mut Ledger<F>, work: &str, ctx: &Context, when: impl FnOnce(&Work) -> bool) -> ToolResult<Result<(Work, Value), Work>> {
    let mut closed = false;
    let w = ledger.update(work, |w| {
        if !w.is_closed() && when(w) {
            w.state = WorkState::Closed;
            w.settle(&ctx.options.prices, ctx.now_ms);
            closed = true;
        }
    })?;
    if !closed {
        return Ok(Err(w));
    }
    let mut out = work_json(&w, "gone");
    out["dropped"] = json!(true);
    out["settled"] = settled_json(&w);
    Ok(Ok((w, out)))
}

/// The answer for a work that changed under a drop after it planned (reopened on another
/// machine, or taken up by a fork call): nothing more is done to it.
fn changed(w: &Work, what: &str) -> ToolError {
    ToolError::with_next(
        Code::SessionBusy,
        format!("work '{}' changed while this drop looked at it (it is {} now, on {}); {what}", w.work, w.state.as_str(), w.machine_id.as_deref().unwrap_or("no machine yet")),
        format!("Call boxd_status, then boxd_drop for work '{}' again if it is still wanted.", w.work),
    )
}

/// Close a work whose machine is gone, naming what could not be recovered: the prompts
/// after the last proof and the files still owed (from the record as it is now: another
/// drop at once may have closed it already). Only while the record still names the machine
/// the drop planned on and is not being created: a resume may have rebuilt it meanwhile.
/// `taken_by`: the id of another machine now under the name (the drop sent boxd nothing
/// for it), said in the answer.
fn close_gone<F: Files>(ledger: &mut Ledger<F>, work: &str, ctx: &Context, planned: &Option<String>, creating: bool, taken_by: Option<&str>) -> ToolResult<Value> {
    let (mut covered, mut was_closed, mut moved) = (0, false, false);
    let w = ledger.update(work, |w| {
        was_closed = w.is_closed();
        // Only as the plan read it: a create under way since (or a rebuild) makes it
        // creating, and an ensure that took up a create's machine since makes it open.
        moved = w.machine_id != *planned || (w.state == WorkState::Creating) != creating;
        if was_closed || moved {
            return;
        }
        covered = w.proofs.last().map_or(0, |p| p.prompts as usize);
        let lost: Vec<String> = w.prompts.iter().skip(covered).map(|p| p.id.clone()).chain(w.owed.iter().cloned()).collect();
        w.state = WorkState::Closed;
        w.unrecovered = lost;
        w.seen_not_running(ctx.now_ms, ctx.options.idle_ms(), true);
        w.settle(&ctx.options.prices, ctx.now_ms);
    })?;
    if was_closed {
        return Ok(already_dropped(&w));
    }
    if moved {
        return Err(changed(&w, "nothing was closed"));
    }
    let mut out = work_json(&w, "gone");
    out["dropped"] = json!(true);
    out["machineWasGone"] = json!(true);
    out["settled"] = settled_json(&w);
    out["unrecovered"] = json!({
        "prompts": w.prompts.iter().skip(covered).map(|p| p.id.clone()).collect::<Vec<_>>(),
        "files": w.owed,
    });
    out["next"] = json!("Done: the machine was already gone; the work is closed. The prompts listed as unrecovered never reached this laptop.");
    if let Some(id) = taken_by {
        out["nameTakenBy"] = json!(id);
        let own = if planned.is_some() { "the work's own machine was gone" } else { "the work had no machine of its own (its create was withdrawn)" };
        out["next"] = json!(format!("Done: {own}, and {} is another machine (id {id}), left untouched; the work is closed. The prompts listed as unrecovered never reached this laptop.", w.machine));
    }
    Ok(out)
}

/// Whether boxd no longer has the machine: `get` says not found, and its listing agrees
/// (a proxy's 404 reads as not found too). Any failure to ask is "not known to be gone".
fn gone<P: crate::caps::Programs>(boxd: &mut Boxd<P>, machine: &str) -> bool {
    matches!(boxd.get(machine), Ok(None)) && boxd.list().is_ok_and(|l| !l.iter().any(|m| m.name == machine))
}

/// The work's machine as boxd has it, or None when it is gone. Closing forgets the machine,
/// so one "not found" (which a proxy's 404 also reads as) is checked against the account's
/// listing first: a machine the listing holds is BOXD_FAILED, and nothing is changed.
fn look<P: crate::caps::Programs>(boxd: &mut Boxd<P>, machine: &str, work: &str) -> ToolResult<Option<crate::boxd::MachineInfo>> {
    if let Some(info) = boxd.get(machine).map_err(Failure::into_error)? {
        return Ok(Some(info));
    }
    if boxd.list().map_err(Failure::into_error)?.iter().any(|m| m.name == machine) {
        return Err(ToolError::with_next(
            Code::BoxdFailed,
            format!("boxd answered that {machine} was not found, but its machine listing holds it; nothing was changed"),
            format!("Call boxd_status in a later turn, then boxd_drop for work '{work}' again."),
        ));
    }
    Ok(None)
}

/// The answer for a work a drop finds closed: by an earlier drop, or by one at once.
fn already_dropped(w: &Work) -> Value {
    let mut out = work_json(w, "gone");
    out["dropped"] = json!(false);
    out["next"] = json!("Nothing to do: this work was already dropped.");
    out
}

/// Milliseconds as hours with two decimals (what a person reads).
pub fn hours(ms: u64) -> f64 {
    (ms / 36_000) as f64 / 100.0
}

/// What a drop will do, decided from reads only (the ledger and one `machine get`). Every
/// refusal before the machine is sealed comes from here, so `check` gives it before the
/// user is asked.
enum Plan {
    AlreadyDropped(Work),
    /// A queued fork: no machine, nothing on boxd to account for.
    Queued,
    /// A fork still being made: nothing of its own on it yet. Closed only while it still
    /// records the machine id the plan read and the claim time it saw (a boxd_fork that
    /// claims it since is left to make it); its machine removed first when the plan found
    /// it there and ours (`remove`), else nothing is sent to boxd.
    Unready { recorded: Option<String>, claimed: u64, remove: bool },
    /// The machine is gone (or its name holds another machine, whose id is given): close
    /// the work, naming what could not be recovered (only while it still names the machine
    /// id the plan read, and is `creating` as the plan read it: the bool).
    Gone(Option<String>, Option<String>, bool),
    /// Running and ours, its transcript proven: seal, check the live state, remove.
    Live(Work),
}

fn plan(env: &mut Env, work: &str, machine: &str) -> ToolResult<Plan> {
    let plan = plan_of(env, work, machine)?;
    // Closed as gone, or a fork that recorded its machine closed with none seen.
    if matches!(plan, Plan::Gone(..) | Plan::Unready { recorded: Some(_), remove: false, .. }) {
        let w = Ledger::for_call(&mut env.files, env.ctx).require(work)?;
        let mut boxd = Boxd::new(&mut env.programs, env.ctx.options.boxd_timeout_seconds);
        super::machine::same_account(&mut boxd, &w, "nothing was closed")?;
    }
    Ok(plan)
}

fn plan_of(env: &mut Env, work: &str, machine: &str) -> ToolResult<Plan> {
    let ctx = env.ctx;
    let w = Ledger::for_call(&mut env.files, ctx).require(work)?;
    if w.is_closed() {
        return Ok(Plan::AlreadyDropped(w));
    }
    if w.state == WorkState::Queued {
        return Ok(Plan::Queued);
    }
    if let (WorkState::Creating, Some(f)) = (w.state, &w.fork) {
        return unready_fork(env, &w, &f.parent);
    }
    // A create answered with an id but not with a booted machine (its boot timed out): it
    // is looked at as any machine is below, and closes once gone or taken.
    let answered = w.state == WorkState::Creating && w.machine_id.is_some();
    if w.state == WorkState::Creating && !answered {
        // Its create never answered: the machine may still appear, and closing the work now
        // would leave it billing with no record.
        return Err(ToolError::with_next(
            Code::CreateUncertain,
            format!("work '{work}': the create of {machine} never answered, so it may still appear"),
            format!("Call boxd_ensure for work '{work}' (it adopts the machine or makes one), then boxd_drop."),
        ));
    }
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    let Some(info) = look(&mut boxd, machine, work)? else { return Ok(Plan::Gone(w.machine_id, None, answered)) };
    // Another machine under the name: ours is gone (names are unique), and that one is
    // never touched. The work closes as any gone one does, once seen so twice.
    if super::machine::taken(&w, &info) {
        seen_taken_before(env, &w, &info)?;
        return Ok(Plan::Gone(w.machine_id, Some(info.id), answered));
    }
    if answered {
        // Still there and ours: boxd_ensure takes it up once it is up.
        return Err(ToolError::with_next(
            Code::CreateUncertain,
            format!("work '{work}': the create of {machine} answered before the machine came up, and no boxd_ensure has taken it up since"),
            format!("Call boxd_ensure for work '{work}' (it adopts the machine once it is up), then boxd_drop."),
        ));
    }
    // Its create was withdrawn (refused, or the name held someone else's machine): no
    // machine under the name is this ledger's, so the work closes with that one untouched.
    if w.holds_no_machine() {
        return Ok(Plan::Gone(None, Some(info.id), false));
    }
    // Taken up by its name and not claimed yet: it may be another install's machine.
    super::machine::refuse_unclaimed(&w)?;
    check_machine(&w, &info)?;
    // Another project's work (or a folder since moved): its transcript and files are
    // checked where they are, so its live machine is dropped only from there (a drop from
    // here destroyed what that laptop folder no longer held).
    super::harvest::work_folder_granted(ctx, &w)?;
    match crate::boxd::known_state(&info)? {
        State::Running | State::Standby => {}
        State::Starting => return Err(ToolError::new(Code::MachineStarting, format!("{machine} is still starting"))),
        state => {
            // A drop interrupted less than IN_FLIGHT_MS ago keeps boxd_resume off the work
            // until then (it would reopen it under that drop): the step says when.
            let young = w.drop_under_way(ctx.now_ms);
            let when = if young { format!(" at {} (a drop of this work was interrupted at {}; resume waits 10 minutes after it)", iso8601(w.dropping_ms + crate::ledger::IN_FLIGHT_MS), iso8601(w.dropping_ms)) } else { String::new() };
            return Err(ToolError::with_next(
                Code::MachineAsleep,
                format!("{machine} is {}: drop checks the live machine before destroying it, which needs it awake", super::status::job_state(state)),
                format!("Call boxd_resume for work '{work}'{when}, then boxd_drop again."),
            ));
        }
    }
    require_saving(&w)?;
    require_proven(&w)?;
    Ok(Plan::Live(w))
}

/// Closing a work because another id answers under its name rests on that answer: one
/// wrong `get` (a fault, a lying CLI) would orphan our machine, billing and holding
/// unharvested work. So the drop closes only when an earlier call already saw the same
/// other id there (`nameTakenBy`); the first sighting is recorded and refused (NOT_OURS,
/// whose next step is this drop again).
fn seen_taken_before(env: &mut Env, w: &Work, info: &crate::boxd::MachineInfo) -> ToolResult<()> {
    if w.name_taken_by.as_deref() == Some(info.id.as_str()) {
        return Ok(());
    }
    let mut ledger = Ledger::for_call(&mut env.files, env.ctx);
    super::machine::check_owned(&mut ledger, env.ctx, w, info)?;
    Err(ToolError::new(Code::NotOurs, format!("{} answered another id than work '{}' recorded", info.name, w.work)))
}

/// A fork still `creating` holds nothing of its own: no prompt reaches a fork before it
/// opens, and its tree is a copy of the proven parent's. So it is dropped whatever its
/// parent is now (a dropped parent's boxd_fork would never finish it): its machine removed
/// once its recorded id is checked, or closed with no machine when boxd has none (or the
/// machine under its name was plainly not forked from the parent by us: left alone).
/// Refused while a boxd_fork may still be making it (a young claim), and for a machine
/// under its name with no id recorded that looks like our fork: only boxd_fork adopts it.
fn unready_fork(env: &mut Env, w: &Work, parent: &str) -> ToolResult<Plan> {
    let (work, machine, ctx) = (&w.work, &w.machine, env.ctx);
    let again = format!("Call boxd_fork for work '{parent}' (it adopts the fork or makes it), or boxd_drop for work '{work}' again in a later turn.");
    if w.machine_id.is_none() && w.created_ms != 0 && !crate::ledger::waited(w.created_ms, super::fork::FORK_CLAIM_MS, ctx.now_ms) {
        return Err(ToolError::with_next(Code::CreateUncertain, format!("work '{work}': a boxd_fork call may still be making {machine}"), again));
    }
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    let leave = Plan::Unready { recorded: w.machine_id.clone(), claimed: w.created_ms, remove: false };
    let Some(info) = look(&mut boxd, machine, work)? else { return Ok(leave) };
    if w.machine_id.is_none() && !super::machine::made_like_ours(&info, &format!("fork/{}", crate::paths::machine_name(parent)), ctx.options.idle_seconds()) {
        // Not forked from the parent the way this plugin forks: someone else's, left alone;
        // the fork never got a machine of its own.
        return Ok(leave);
    }
    if super::machine::taken(w, &info) {
        // Its machine is gone and the name is someone else's: left alone.
        seen_taken_before(env, w, &info)?;
        return Ok(leave);
    }
    if w.machine_id.is_none() {
        return Err(ToolError::with_next(
            Code::CreateUncertain,
            format!("work '{work}': {machine} exists, but the fork that may have made it never answered with its id"),
            format!("Call boxd_fork for work '{parent}' to adopt it, then boxd_drop. If '{parent}' was dropped, remove {machine} yourself if it is yours ('boxd machine remove {machine} -y'), then boxd_drop."),
        ));
    }
    super::machine::refuse_unclaimed(w)?;
    check_machine(w, &info)?;
    Ok(Plan::Unready { recorded: w.machine_id.clone(), claimed: w.created_ms, remove: true })
}

/// SESSION_BUSY while a snapshot save of the work is recorded as under way (its answer was
/// lost): the capture may still be landing, and removing the machine would abort it and
/// leave the name stuck pending on boxd. boxd_image for that name settles it.
fn require_saving(w: &Work) -> ToolResult<()> {
    let Some(name) = w.images_pending.first() else { return Ok(()) };
    Err(ToolError::with_next(
        Code::SessionBusy,
        format!("work '{}': the save of snapshot '{name}' never answered, so boxd may still be capturing {}; nothing was destroyed", w.work, w.machine),
        format!("Call boxd_image for work '{}' with name '{name}' again (it answers it made, still saving, or failed and cleared), then boxd_drop.", w.work),
    ))
}

/// The refusals a drop gives before it changes anything (see `plan`).
pub fn check(env: &mut Env, args: &Value) -> ToolResult<()> {
    let (work, machine) = work_arg(args)?;
    plan(env, &work, &machine).map(|_| ())
}

pub fn run(env: &mut Env, args: &Value) -> ToolResult<Value> {
    let (work, machine) = work_arg(args)?;
    // Only ever compared with the paths the machine reports, never used to touch a file:
    // any name the guest can list (control characters included) can be given up.
    let discard: Vec<String> = args
        .get("discard")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|p| p.trim_start_matches("./").trim_end_matches('/').to_string())
        .filter(|p| !p.is_empty())
        .collect();
    let now = env.now();
    // What an interrupted harvest left on the laptop goes first, whatever the drop decides
    // (not in `plan`, which `check` runs and which changes nothing).
    let w = Ledger::for_call(&mut env.files, env.ctx).require(&work)?;
    let before = if w.is_closed() { w } else { super::landing::sweep_temps(env, w)? };
    let plan = plan(env, &work, &machine)?;
    // The laptop must still hold the proven transcript before its machine goes. A gone
    // machine's work is closed as well: nothing is left on boxd to refuse for, so what
    // cannot be put back is said, not refused (the ledger keeps the proven export).
    let (restored, unchecked) = match &plan {
        Plan::Live(w) => super::harvest::restore_for_drop(env, w)?,
        Plan::Gone(..) => super::harvest::restore_for_drop(env, &before).unwrap_or_else(|e| {
            (Vec::new(), Some(format!("the laptop's OpenCode copy of the proven transcript could not be checked or put back ({}: {}); the ledger keeps its proven exports", e.code.as_str(), e.message)))
        }),
        _ => (Vec::new(), None),
    };
    let ctx = env.ctx;
    // Looked at before the seal: the laptop copies of the new files the record holds.
    let lost = match &plan {
        Plan::Live(w) => super::account::laptop_lost(&mut env.files, w),
        _ => Default::default(),
    };
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    let w = match plan {
        Plan::AlreadyDropped(w) => {
            return Ok(already_dropped(&w));
        }
        Plan::Queued => {
            // Only while it is still queued with no machine: a boxd_fork of its parent at once
            // may be making its machine now, and a closed record would leave that machine with
            // no owner.
            return match close_when(&mut ledger, &work, ctx, |w| w.state == WorkState::Queued && w.machine_id.is_none())? {
                Ok((_, mut out)) => {
                    out["next"] = json!("Done: the fork was still queued and had no machine; it is closed.");
                    Ok(out)
                }
                Err(w) if w.is_closed() => Ok(already_dropped(&w)),
                Err(w) => Err(changed(&w, "nothing was closed")),
            };
        }
        Plan::Unready { recorded: planned, claimed, remove } => {
            // Intent before effect, as a live drop marks `dropping`: from this write no
            // boxd_fork claims, adopts or opens the fork (they leave one a drop marked), and
            // only while it is as the plan saw it (a boxd_fork may have claimed it since,
            // and its `machine fork` may land after any close).
            let as_planned = |w: &Work| w.state == WorkState::Creating && w.machine_id == planned && w.created_ms == claimed;
            let mut marked = false;
            let w = ledger.update(&work, |w| {
                if as_planned(w) && w.dropping_ms == 0 {
                    w.dropping_ms = ctx.now_ms;
                    marked = true;
                } else if as_planned(w) {
                    // An earlier drop of it, killed after its mark: this one finishes it.
                    marked = true;
                }
            })?;
            if !marked {
                return if w.is_closed() { Ok(already_dropped(&w)) } else { Err(changed(&w, "nothing was removed or closed")) };
            }
            let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
            if remove {
                if let Err(f) = boxd.remove(&machine) {
                    if !gone(&mut boxd, &machine) {
                        return Err(f.into_error());
                    }
                }
            }
            return match close_when(&mut ledger, &work, ctx, as_planned)? {
                Ok((_, mut out)) => {
                    out["next"] = json!(if remove {
                        "Done: the fork was still being made and held nothing of its own; its machine is removed and the work is closed."
                    } else if planned.is_some() {
                        "Done: the fork was still being made and held nothing of its own; its machine was already gone (another machine under its name, if any, was left untouched) and the work is closed."
                    } else {
                        "Done: the fork was still being made and had no machine of its own; the work is closed."
                    });
                    Ok(out)
                }
                Err(w) if w.is_closed() => Ok(already_dropped(&w)),
                Err(w) => Err(changed(&w, "nothing was closed")),
            };
        }
        Plan::Gone(planned, taken_by, creating) => {
            let mut out = close_gone(&mut ledger, &work, ctx, &planned, creating, taken_by.as_deref())?;
            if out["machineWasGone"] == true {
                // Deleted in the laptop's OpenCode since the harvest: put back, as a live drop does.
                if !restored.is_empty() {
                    out["restoredToLaptop"] = json!(restored);
                }
                if let Some(note) = unchecked {
                    out["warnings"] = json!([note]);
                }
            }
            return Ok(out);
        }
        Plan::Live(w) => w,
    };
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    // Intent before effect: from here a submit is refused (the laptop side), and a drop
    // killed anywhere below is finished by the next one.
    // The record from here on, not the one the plan read: from this write no submit records
    // a prompt, and one recorded since the plan must be asked about and checked. Only an
    // open (or half-dropped) work is marked: another drop at once may have closed it since
    // the plan, and the work may even have been ensured again, on another machine.
    // A save recorded since the plan (a boxd_image at once) holds the work too.
    let planned = w.machine_id.clone();
    let w = ledger.update(&work, |w| {
        if matches!(w.state, WorkState::Open | WorkState::Dropping) && w.machine_id == planned && w.images_pending.is_empty() {
            w.state = WorkState::Dropping;
            w.dropping_ms = ctx.now_ms;
        }
    })?;
    if w.is_closed() {
        return Ok(already_dropped(&w));
    }
    require_saving(&w)?;
    if w.state != WorkState::Dropping {
        return Err(changed(&w, "nothing was destroyed"));
    }
    let checked = (|| {
        // Quiesce and read the live state in one exec: nothing starts or writes after it
        // (the guest also refuses a submit for a while after it).
        let (live, known) = crate::guest::Guest::new(&mut boxd, &machine, &work).call_resolving("seal", &w.unresolved())?;
        let w = if known.is_empty() { w.clone() } else { ledger.update(&work, |w| w.resolve_prompts(&known, &now, ctx.now_ms))? };
        if let Some(p) = w.unresolved().first() {
            return Err(ToolError::with_next(
                Code::SessionBusy,
                format!("work '{work}': prompt {p} may still be on its way to the machine"),
                format!("Call boxd_job for work '{work}' in a later turn, harvest, then drop."),
            ));
        }
        require_proven(&w)?;
        super::account::check_stored(&mut ledger, &w)?;
        super::account::check_live(&w, &live, &discard)?;
        super::account::check_laptop_copies(&w, &live, &discard, &lost)
    })();
    if let Err(e) = checked {
        // The seal's exec failed and the machine is gone: another drop of it, at once,
        // checked it and removed it (or boxd lost it). Nothing on it can be recovered any
        // more: the work closes as any gone one does, and is not reopened with no machine.
        if matches!(e.code, Code::GuestFailed | Code::BoxdFailed | Code::Timeout) && gone(&mut boxd, &machine) {
            return close_gone(&mut ledger, &work, ctx, &planned, false, None);
        }
        // Refused: the work is open again (the guest restarts on its next command). Unless
        // another drop of it, at once, finished first: then what was asked for is done.
        let w = ledger.update(&work, |w| {
            if w.state == WorkState::Dropping {
                w.state = WorkState::Open;
            }
        })?;
        return if w.is_closed() { Ok(already_dropped(&w)) } else { Err(e) };
    }
    if let Err(f) = boxd.remove(&machine) {
        let w = ledger.require(&work)?;
        if w.is_closed() {
            return Ok(already_dropped(&w));
        }
        // Another drop at once (or one killed right after its remove) took the machine after
        // this one sealed and checked it: what went is what this drop accounted for, so the
        // work closes as if this remove had done it. Anything else leaves it `dropping`.
        if !gone(&mut boxd, &machine) {
            return Err(f.into_error());
        }
    }
    // The machine this drop checked is gone. Still `dropping` on it, nothing can have been
    // submitted since the checks, and the record closes as checked. Reopened meanwhile (an
    // ensure, or another drop's refused seal) a prompt may have run after them: it closes
    // as a gone machine's, naming what was not recovered. On another machine (a resume
    // rebuilt it) it is left as it is.
    let (w, mut out) = match close_when(&mut ledger, &work, ctx, |w| w.machine_id == planned && w.state == WorkState::Dropping)? {
        Ok(closed) => closed,
        Err(w) if w.is_closed() => return Ok(already_dropped(&w)),
        Err(_) => return close_gone(&mut ledger, &work, ctx, &planned, false, None),
    };
    if let Some(g) = &w.git {
        out["patch"] = json!(g.patch);
        out["bundle"] = json!(g.bundle);
        out["head"] = json!(g.head);
    }
    out["discarded"] = json!(discard);
    if !restored.is_empty() {
        // Deleted in the laptop's OpenCode since the harvest: imported again from the
        // ledger's copy before the machine went, so the transcript is not lost.
        out["restoredToLaptop"] = json!(restored);
    }
    out["next"] = json!("Done: the machine is destroyed and the work is closed in the ledger. Its commits are in the ledger's bundle (git fetch <bundle>), its uncommitted changes in the stored patch.");
    if !w.earlier_git.is_empty() {
        // A rebuild started the tree afresh: what the gone machines' trees held is in these.
        out["earlierGit"] = json!(w.earlier_git.iter().map(|g| json!({ "head": g.head, "bundle": g.bundle, "patch": g.patch, "at": g.at })).collect::<Vec<_>>());
        out["next"] = json!("Done: the machine is destroyed and the work is closed in the ledger. Its commits are in the ledger's bundle (git fetch <bundle>), its uncommitted changes in the stored patch; those of the machines it was rebuilt from are in the bundles and patches earlierGit names.");
    }
    // A file an interrupted harvest moved aside stays on the laptop; status no longer lists
    // a closed work, so this answer is the last to say where it is.
    let mut left = super::landing::left_on_laptop(env.files, &w.temps);
    left.extend(unchecked);
    if !left.is_empty() {
        out["warnings"] = json!(left);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
