//! boxd_image: save a work's machine as a new named snapshot, only once a harvest has
//! proven the transcript since the last prompt. The save is recorded before it runs, so a
//! save whose answer was lost is recognised by the next call.

use alloc::format;
use alloc::string::ToString;
use serde_json::{json, Value};

use super::machine::{owned_state, work_json};
use super::{require_proven, work_arg, Env};
use crate::boxd::{Boxd, Failure, State};
use crate::errors::{Code, ToolError, ToolResult};
use crate::ledger::{Ledger, Work};
use crate::paths;

/// What an image will do, decided from reads only (the ledger, the snapshot list, one
/// `machine get`): every refusal comes from here, so `check` gives it before anyone is asked.
enum Plan {
    /// This work's own save whose answer was lost (recorded before it ran).
    AlreadyMade(Work),
    Save(Work),
}

fn plan(env: &mut Env, work: &str, machine: &str, name: &str) -> ToolResult<Plan> {
    if !paths::is_snapshot_name(name) {
        return Err(ToolError::new(Code::NameInvalid, format!("snapshot name '{name}' must be lowercase [a-z0-9-] starting with a letter")));
    }
    let ctx = env.ctx;
    let w = Ledger::for_call(&mut env.files, ctx).require(work)?;
    super::require_open(&w)?;
    require_proven(&w)?;
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    if boxd.snapshots().map_err(Failure::into_error)?.iter().any(|s| s.name == name) {
        // A rerun of this work's own save (its answer lost) is answered as made; the same
        // name asked for after a later prompt would be a new save, which an existing
        // snapshot cannot take (snapshots are immutable).
        let prompts = w.prompts.len() as u64;
        let made_at = w.images.iter().any(|n| n == name).then(|| w.images_at.get(name).copied());
        match made_at {
            _ if w.images_pending.iter().any(|n| n == name) => return Ok(Plan::AlreadyMade(w)),
            Some(None) => return Ok(Plan::AlreadyMade(w)),
            Some(Some(at)) if at == prompts => return Ok(Plan::AlreadyMade(w)),
            Some(Some(at)) => {
                return Err(ToolError::new(
                    Code::SnapshotExists,
                    format!("work '{work}' saved snapshot '{name}' after {at} prompts; it has {prompts} now, and a snapshot cannot be saved again under a name"),
                ));
            }
            None => return Err(ToolError::new(Code::SnapshotExists, format!("a snapshot named '{name}' already exists"))),
        }
    }
    match owned_state(&mut boxd, &w)? {
        State::Running => super::machine::require_restored(&w)?,
        State::Gone => return Err(ToolError::new(Code::MachineGone, format!("{machine} no longer exists"))),
        State::Starting => return Err(ToolError::new(Code::MachineStarting, format!("{machine} is still starting"))),
        state => {
            return Err(ToolError::with_next(
                Code::MachineAsleep,
                format!("{machine} is {}; boxd snapshots only a running machine", super::status::job_state(state)),
                format!("Call boxd_resume for work '{work}', then boxd_image again."),
            ));
        }
    }
    Ok(Plan::Save(w))
}

/// The refusals an image gives before it records the save (see `plan`).
pub fn check(env: &mut Env, args: &Value) -> ToolResult<()> {
    let (work, machine) = work_arg(args)?;
    plan(env, &work, &machine, args.get("name").and_then(Value::as_str).unwrap_or_default()).map(|_| ())
}

pub fn run(env: &mut Env, args: &Value) -> ToolResult<Value> {
    let (work, machine) = work_arg(args)?;
    let name = args.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
    let plan = plan(env, &work, &machine, &name)?;
    let ctx = env.ctx;
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    let w = match plan {
        Plan::AlreadyMade(w) => {
            let n = name.clone();
            ledger.update(&work, |w| {
                w.images_pending.retain(|p| p != &n);
                if !w.images.contains(&n) {
                    w.images_at.insert(n.clone(), w.prompts.len() as u64);
                    w.images.push(n);
                }
            })?;
            let mut out = work_json(&w, "running");
            out["snapshot"] = json!(name);
            out["alreadyMade"] = json!(true);
            out["next"] = json!(format!("Set \"snapshot\": \"{name}\" in the plugin options to boot new works from it."));
            return Ok(out);
        }
        Plan::Save(w) => w,
    };
    let n = name.clone();
    ledger.update(&work, |w| {
        if !w.images_pending.contains(&n) {
            w.images_pending.push(n);
        }
    })?;
    if let Err(f) = boxd.snapshot_save(&machine, &name) {
        return Err(crate::guest::failed_on(&mut boxd, &machine, &work, f));
    }
    let n = name.clone();
    ledger.update(&work, |w| {
        w.images_pending.retain(|p| p != &n);
        w.images_at.insert(n.clone(), w.prompts.len() as u64);
        w.images.push(n);
    })?;
    let mut out = work_json(&w, "running");
    out["snapshot"] = json!(name);
    out["next"] = json!(format!("Set \"snapshot\": \"{name}\" in the plugin options to boot new works from it."));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{open_work, raw_context, Scripted, OURS};
    use crate::tools::call;

    /// A save boxd refuses because the machine went to sleep under it (another call's
    /// boxd_sleep) is MACHINE_ASLEEP, and the name stays pending for the rerun.
    #[test]
    fn a_save_the_machine_fell_asleep_under_is_machine_asleep_and_stays_pending() {
        let mut fs = open_work(None);
        let mut p = Scripted::default();
        p.push_exit(0, "[]", "");
        p.push_exit(0, OURS, "");
        p.push_fail(1, "error: VM 'oc-w1' is hibernated — run 'boxd machine wake oc-w1' first");
        p.push_exit(0, &OURS.replace("running", "hibernated"), "");
        let e = call(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")).unwrap_err();
        assert!(e.code == Code::MachineAsleep && e.message.contains("is hibernated") && e.next.contains("boxd_resume for work 'w1'"), "{e:?}");
        assert_eq!(Ledger::new(&mut fs, "/l").require("w1").unwrap().images_pending, ["img"]);
    }
}
