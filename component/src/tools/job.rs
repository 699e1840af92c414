//! boxd_job: how a work's run is going. The machine state comes from the listing first,
//! so a hibernated, gone or starting machine is reported without an exec: nothing wakes
//! and nothing bills. A running machine costs one exec (the helper's status).

use alloc::format;
use alloc::string::{String, ToString};
use serde_json::{json, Value};

use super::{work_arg, Env};
use crate::boxd::{Boxd, State};
use crate::errors::{Code, ToolResult};
use crate::guest::Guest;
use crate::ledger::Ledger;
use crate::redact::redact;

pub const LAST_TEXT_MAX: usize = 300;

/// The run as a generic task state (MCP's task words), so a host can show how a job is
/// going without knowing this tool: None while there is no run to speak of.
pub fn task_state(state: &str, outcome: Option<&str>) -> Option<&'static str> {
    match (state, outcome) {
        ("busy" | "starting", _) => Some("working"),
        ("idle", Some("completed")) => Some("completed"),
        ("idle", Some("failed")) => Some("failed"),
        ("idle", Some("aborted")) => Some("cancelled"),
        _ => None,
    }
}

pub fn run(env: &mut Env, args: &Value) -> ToolResult<Value> {
    let (work, machine) = work_arg(args)?;
    let ctx = env.ctx;
    let now = env.now();
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    let w = ledger.require(&work)?;
    super::require_open(&w)?;
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    let st = super::machine::owned_state(&mut boxd, &mut ledger, ctx, &w)?;
    // The spend as the state it reports (a machine boxd hibernated bills disk only, as
    // boxd_status shows it), not as the record last written.
    let spend = super::status::spend_json(&super::admission::seen_as(&w, st, ctx), ctx);
    match st {
        State::Asleep | State::Stopped => {
            let (by, at): (&str, Value) = if w.asleep_by_tool {
                ("boxd_sleep", json!(w.sleeps.last().map(|s| s.at.clone())))
            } else {
                ("idle_or_cli", Value::Null)
            };
            return Ok(json!({
                "work": work, "machine": machine, "state": "asleep", "asleepBy": by, "sleptAt": at, "taskState": Value::Null, "spend": spend,
                "next": format!("Call boxd_resume for work '{work}' to wake it (waking starts billing)."),
            }));
        }
        State::Gone | State::Failed => {
            return Ok(json!({
                "work": work, "machine": machine, "state": "gone", "taskState": Value::Null, "spend": spend,
                "next": format!("Call boxd_resume for work '{work}' to rebuild it from the golden image and the proven transcript, or boxd_drop to close the work."),
            }));
        }
        State::Starting => {
            return Ok(json!({ "work": work, "machine": machine, "state": "starting", "taskState": task_state("starting", None), "spend": spend, "next": "Call boxd_job again in a later turn." }));
        }
        // An exec would wake a paused machine: report it as it is.
        State::Standby => {
            return Ok(json!({
                "work": work, "machine": machine, "state": "standby", "taskState": Value::Null, "spend": spend,
                "next": format!("Call boxd_resume for work '{work}' to continue it (resuming starts billing)."),
            }));
        }
        State::Running => {}
    }
    let (s, known) = Guest::new(&mut boxd, &machine, &work).call_resolving("status", &w.unresolved())?;
    // The status exec is traffic boxd's idle clock counts (and comes after the guest's own
    // lastActivityAt): recorded, so the run is not ended before it when the machine is
    // later found hibernated. A machine woken outside the plugin opens its run here.
    if w.asleep_by_tool || w.sleeping.is_some() || !known.is_empty() || w.use_unrecorded(ctx.now_ms) {
        // Only over the run this call read: a sleep or drop that wrote while the exec ran
        // saw the machine later than this look did (no run reopened under it).
        let runs_then = (w.sleeps.len(), w.runs.len(), w.runs.last().map(|r| (r.from_ms, r.to_ms)));
        ledger.update(&work, |r| {
            r.resolve_prompts(&known, &now, ctx.now_ms);
            if !r.is_closed() && (r.sleeps.len(), r.runs.len(), r.runs.last().map(|x| (x.from_ms, x.to_ms))) == runs_then {
                r.seen_running(&w.sleeping);
                r.in_use(ctx.now_ms);
            }
        })?;
    }
    let busy = s.get("state").and_then(Value::as_str) == Some("busy");
    let outcome = s.get("outcome").and_then(Value::as_str).map(String::from);
    let last_text = redact(s.get("lastText").and_then(Value::as_str).unwrap_or(""), LAST_TEXT_MAX);
    let pending = s.get("pending").cloned().unwrap_or(json!(0));
    let state = if busy { "busy" } else { "idle" };
    let outcome = if busy { None } else { outcome };
    let mut out = json!({
        "work": work,
        "machine": machine,
        "state": state,
        "outcome": outcome,
        "taskState": task_state(state, outcome.as_deref()),
        "lastText": last_text,
        "lastActivityAt": s.get("lastActivityAt").cloned().unwrap_or(Value::Null),
        "pending": pending,
        // Which prompt the state and outcome are about: the run in flight's, else the last.
        "promptId": if busy { s.pointer("/running/promptId") } else { s.get("promptId") }.cloned().unwrap_or(Value::Null),
        "spend": spend,
        "next": if busy {
            format!("Call boxd_job for work '{work}' again in a later turn.")
        } else if w.prompts.is_empty() {
            // Nothing ran yet: there is nothing to bring home.
            format!("Call boxd_submit for work '{work}' with a prompt to start its first run.")
        } else {
            format!("Call boxd_harvest for work '{work}' to bring the transcript and files home.")
        },
    });
    // What the guest declined for want of a person (docs/guest.md, "The pump"): the run in
    // flight's while busy, else the last run's.
    let declined = if busy { s.pointer("/running/declined") } else { s.get("declined") };
    if let Some(list) = declined.and_then(Value::as_array).filter(|l| !l.is_empty()) {
        out["declined"] = Value::Array(list.iter().take(DECLINED_MAX).map(declined_json).collect());
    }
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

/// The most declined asks an answer lists (the guest keeps the first 20 of a run).
const DECLINED_MAX: usize = 20;

/// One declined ask as the laptop shows it: a permission with its patterns, or a question's
/// text; the guest's words redacted like lastText.
fn declined_json(d: &Value) -> Value {
    let text = |v: &Value| redact(v.as_str().unwrap_or(""), LAST_TEXT_MAX);
    match d.get("permission") {
        Some(p) => json!({ "permission": text(p), "patterns": d["patterns"].as_array().into_iter().flatten().take(5).map(text).collect::<alloc::vec::Vec<_>>() }),
        None => json!({ "question": text(&d["question"]) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{open_work, raw_context, Scripted, OURS};
    use crate::tools::call;

    #[test]
    fn task_states_follow_the_run() {
        assert_eq!(task_state("busy", None), Some("working"));
        assert_eq!(task_state("starting", None), Some("working"));
        assert_eq!(task_state("idle", Some("completed")), Some("completed"));
        assert_eq!(task_state("idle", Some("failed")), Some("failed"));
        assert_eq!(task_state("idle", Some("aborted")), Some("cancelled"));
        assert_eq!(task_state("idle", None), None);
        assert_eq!(task_state("asleep", None), None);
    }

    #[test]
    fn the_job_answer_carries_its_task_state() {
        let mut fs = open_work(None);
        let mut p = Scripted::default();
        p.push_exit(0, OURS, "");
        p.push_exit(0, r#"{"state":"idle","outcome":"aborted","lastText":"stopped","pending":0}"#, "");
        let v = call(&mut p, &mut fs, "boxd_job", r#"{"work":"w1"}"#, raw_context("{}", "{}")).unwrap();
        assert_eq!((v["state"].as_str(), v["outcome"].as_str(), v["taskState"].as_str()), (Some("idle"), Some("aborted"), Some("cancelled")));
        // No prompt sent yet: nothing to bring home, so the step is the first prompt.
        assert!(v["next"].as_str().unwrap().starts_with("Call boxd_submit for work 'w1'"), "{v:#}");
    }

    /// The answer names the prompt its state is about: the run in flight's while busy, the
    /// last run's once idle (an outcome is never read as a later prompt's answer).
    #[test]
    fn the_job_answer_names_the_prompt_its_state_is_about() {
        for (status, prompt) in [
            (r#"{"state":"busy","promptId":"p1","running":{"promptId":"p2"}}"#, json!("p2")),
            (r#"{"state":"idle","outcome":"completed","promptId":"p2"}"#, json!("p2")),
            (r#"{"state":"idle"}"#, Value::Null),
        ] {
            let mut fs = open_work(None);
            let mut p = Scripted::default();
            p.push_exit(0, OURS, "");
            p.push_exit(0, status, "");
            let v = call(&mut p, &mut fs, "boxd_job", r#"{"work":"w1"}"#, raw_context("{}", "{}")).unwrap();
            assert_eq!(v["promptId"], prompt, "{status}");
        }
    }

    #[test]
    fn what_the_guest_declined_is_shown_for_the_run_it_belongs_to() {
        let declined = r#"[{"permission":"external_directory","patterns":["/tmp/*"]},{"question":"Which one?"}]"#;
        for (status, shown) in [
            (format!(r#"{{"state":"idle","outcome":"completed","declined":{declined}}}"#), true),
            (format!(r#"{{"state":"busy","running":{{"promptId":"p1","declined":{declined}}},"declined":[{{"question":"old"}}]}}"#), true),
            (r#"{"state":"idle","outcome":"completed"}"#.to_string(), false),
        ] {
            let mut fs = open_work(None);
            let mut p = Scripted::default();
            p.push_exit(0, OURS, "");
            p.push_exit(0, &status, "");
            let v = call(&mut p, &mut fs, "boxd_job", r#"{"work":"w1"}"#, raw_context("{}", "{}")).unwrap();
            if shown {
                assert_eq!(v["declined"], serde_json::from_str::<Value>(declined).unwrap(), "{v:#}");
            } else {
                assert!(v.get("declined").is_none(), "{v:#}");
            }
        }
    }
}
