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
use crate::ledger::Ledger;
use crate::paths;

pub fn run(env: &mut Env, args: &Value) -> ToolResult<Value> {
    let (work, machine) = work_arg(args)?;
    let name = args.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
    if !paths::is_snapshot_name(&name) {
        return Err(ToolError::new(Code::NameInvalid, format!("snapshot name '{name}' must be lowercase [a-z0-9-] starting with a letter")));
    }
    let ctx = env.ctx;
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    let w = ledger.require(&work)?;
    super::require_open(&w)?;
    require_proven(&w)?;
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    if boxd.snapshots().map_err(Failure::into_error)?.iter().any(|s| s.name == name) {
        // This work's own save whose answer was lost (recorded before it ran) is done.
        if w.images_pending.contains(&name) || w.images.contains(&name) {
            let n = name.clone();
            ledger.update(&work, |w| {
                w.images_pending.retain(|p| p != &n);
                if !w.images.contains(&n) {
                    w.images.push(n);
                }
            })?;
            let mut out = work_json(&w, "running");
            out["snapshot"] = json!(name);
            out["alreadyMade"] = json!(true);
            out["next"] = json!(format!("Set \"snapshot\": \"{name}\" in the plugin options to boot new works from it."));
            return Ok(out);
        }
        return Err(ToolError::new(Code::SnapshotExists, format!("a snapshot named '{name}' already exists")));
    }
    match owned_state(&mut boxd, &w)? {
        State::Running => {}
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
    let n = name.clone();
    ledger.update(&work, |w| {
        if !w.images_pending.contains(&n) {
            w.images_pending.push(n);
        }
    })?;
    boxd.snapshot_save(&machine, &name).map_err(Failure::into_error)?;
    let n = name.clone();
    ledger.update(&work, |w| {
        w.images_pending.retain(|p| p != &n);
        w.images.push(n);
    })?;
    let mut out = work_json(&w, "running");
    out["snapshot"] = json!(name);
    out["next"] = json!(format!("Set \"snapshot\": \"{name}\" in the plugin options to boot new works from it."));
    Ok(out)
}
