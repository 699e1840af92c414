//! boxd_job: how a work's run is going. The machine state comes from the listing first,
//! so a hibernated, gone or starting machine is reported without an exec: nothing wakes
//! and nothing bills. A running machine costs one exec (the helper's status).

use alloc::format;
use alloc::string::{String, ToString};
use serde_json::{json, Value};

use super::{work_arg, Env};
use crate::boxd::{Boxd, State};
use crate::caps::{Files, Programs};
use crate::errors::{Code, ToolResult};
use crate::guest::Guest;
use crate::ledger::Ledger;
use crate::redact::redact;

pub const LAST_TEXT_MAX: usize = 300;

pub fn run<P: Programs, F: Files>(env: &mut Env<P, F>, args: &Value) -> ToolResult<Value> {
    let (work, machine) = work_arg(args)?;
    let ctx = env.ctx;
    let now = env.now();
    let mut ledger = Ledger::for_call(env.files, ctx);
    let w = ledger.require(&work)?;
    super::require_open(&w)?;
    let mut boxd = Boxd::new(env.programs, ctx.options.boxd_timeout_seconds);
    match super::owned_state(&mut boxd, &w)? {
        State::Asleep | State::Stopped => {
            let (by, at): (&str, Value) = if w.asleep_by_tool {
                ("boxd_sleep", json!(w.sleeps.last().map(|s| s.at.clone())))
            } else {
                ("idle_or_cli", Value::Null)
            };
            return Ok(json!({
                "work": work, "machine": machine, "state": "asleep", "asleepBy": by, "sleptAt": at,
                "next": format!("Call boxd_resume for work '{work}' to wake it (waking starts billing)."),
            }));
        }
        State::Gone | State::Failed => {
            return Ok(json!({
                "work": work, "machine": machine, "state": "gone",
                "next": format!("Call boxd_resume for work '{work}' to rebuild it from the golden image and the proven transcript, or boxd_drop to close the work."),
            }));
        }
        State::Starting => {
            return Ok(json!({ "work": work, "machine": machine, "state": "starting", "next": "Call boxd_job again in a later turn." }));
        }
        // An exec would wake a paused machine: report it as it is.
        State::Standby => {
            return Ok(json!({
                "work": work, "machine": machine, "state": "standby",
                "next": format!("Call boxd_resume for work '{work}' to continue it (resuming starts billing)."),
            }));
        }
        State::Running => {}
    }
    let (s, known) = Guest::new(&mut boxd, &machine, &work).call_resolving("status", &w.unresolved())?;
    if w.asleep_by_tool || !known.is_empty() {
        ledger.update(&work, |w| {
            w.asleep_by_tool = false;
            w.resolve_prompts(&known, &now, ctx.now_ms);
        })?;
    }
    let busy = s.get("state").and_then(Value::as_str) == Some("busy");
    let outcome = s.get("outcome").and_then(Value::as_str).map(String::from);
    let last_text = redact(s.get("lastText").and_then(Value::as_str).unwrap_or(""), LAST_TEXT_MAX);
    let pending = s.get("pending").cloned().unwrap_or(json!(0));
    let mut out = json!({
        "work": work,
        "machine": machine,
        "state": if busy { "busy" } else { "idle" },
        "outcome": if busy { Value::Null } else { json!(outcome) },
        "lastText": last_text,
        "lastActivityAt": s.get("lastActivityAt").cloned().unwrap_or(Value::Null),
        "pending": pending,
        "next": if busy {
            format!("Call boxd_job for work '{work}' again in a later turn.")
        } else {
            format!("Call boxd_harvest for work '{work}' to bring the transcript and files home.")
        },
    });
    // A failed run is a fact about the run, not a failure of this read: the work is idle.
    if !busy && outcome.as_deref() == Some("failed") {
        let failure = s.get("failure").cloned().unwrap_or(Value::Null);
        let detail = failure.get("message").and_then(Value::as_str).unwrap_or("").to_string();
        let code = if failure.get("kind").and_then(Value::as_str) == Some("auth") { Code::GuestAuthFailed } else { Code::GuestRunFailed };
        out["errorCode"] = json!(code.as_str());
        out["errorMessage"] = json!(redact(&detail, LAST_TEXT_MAX));
        out["next"] = json!(format!("{} (work '{work}')", code.next()));
    }
    Ok(out)
}
