//! boxd_status: one read of everything, starting nothing. One `machine list` for any
//! number of works and one `snapshots list`; the ledger gives the works.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::{json, Value};

use super::Env;
use crate::boxd::{Boxd, Failure, State};
use crate::errors::{Code, ToolError, ToolResult};
use crate::ledger::{amount, Ledger, Work, WorkState};
use crate::options::{self, AccessOption, Context};
use super::registry::{ToolAccess, TOOLS};

pub fn run(env: &mut Env, _args: &Value) -> ToolResult<Value> {
    let ctx = env.ctx;
    let opts = &ctx.options;
    let mut boxd = Boxd::new(&mut env.programs, opts.boxd_timeout_seconds);

    // The sign-in row is the machine listing: it is what every tool needs to work.
    let listing = boxd.list();
    let (cli, cli_reason, connection, mut next): (&str, String, &str, Option<String>) = match &listing {
        Ok(_) => ("signed in", String::new(), "ok", None),
        Err(Failure::Missing(m)) => ("not reachable", m.clone(), "no CLI", Some(Code::BoxdMissing.next().into())),
        Err(Failure::SignedOut(m)) => ("not signed in", m.clone(), "ok", Some("Run 'boxd auth login' on this laptop, then boxd_status again.".into())),
        Err(Failure::Unreachable(m)) => ("not reachable", m.clone(), "unreachable", Some("Check this laptop's network (a network failure looks like a sign-in failure from here), then 'boxd auth login' if it persists.".into())),
        Err(Failure::Timeout(m)) => ("not reachable", m.clone(), "timed out", Some(Code::Timeout.next().into())),
        Err(Failure::NotFound(m)) | Err(Failure::Other(m)) => ("not reachable", m.clone(), "error", Some(Code::BoxdFailed.next().into())),
        Err(Failure::Refused(m)) => ("refused by the host's policy", m.clone(), "refused", Some(Code::HostFailed.next().into())),
    };
    let states: BTreeMap<String, String> = listing
        .as_ref()
        .map(|ms| ms.iter().map(|m| (m.name.clone(), m.status.clone())).collect())
        .unwrap_or_default();

    let snapshot = if listing.is_ok() {
        match boxd.snapshots() {
            Ok(list) => match list.iter().find(|s| s.name == opts.snapshot) {
                Some(s) => json!({ "name": opts.snapshot, "present": true, "version": s.version, "status": s.status }),
                None => {
                    next.get_or_insert_with(|| Code::SnapshotMissing.next().into());
                    json!({ "name": opts.snapshot, "present": false })
                }
            },
            Err(e) => json!({ "name": opts.snapshot, "present": Value::Null, "reason": e.into_error().message }),
        }
    } else {
        json!({ "name": opts.snapshot, "present": Value::Null, "reason": "the boxd CLI did not answer" })
    };

    let mut ledger = Ledger::new(&mut env.files, &ctx.ledger);
    let ids = ledger.ids().map_err(|e| ToolError::new(Code::StatusUnavailable, format!("the ledger could not be read: {}", e.message)))?;
    let mut works = Vec::new();
    let (mut total, mut burn) = (0u64, 0u64);
    for id in ids {
        // One unreadable record is that work's problem, reported in its row; the rest go on.
        let w = match ledger.read(&id) {
            Ok(Some(w)) => w,
            Ok(None) => continue,
            Err(e) => {
                next.get_or_insert_with(|| e.next.clone());
                works.push(json!({ "work": id, "state": "unknown", "error": e.code.as_str(), "message": e.message, "next": e.next }));
                continue;
            }
        };
        if w.is_closed() {
            continue;
        }
        let state = match (&listing, states.get(&w.machine)) {
            _ if w.state == WorkState::Queued => "queued".to_string(),
            (Err(_), _) => "unknown".to_string(),
            (Ok(_), None) => "gone".to_string(),
            (Ok(_), Some(s)) => job_state(State::from_status(s)).to_string(),
        };
        // What the listing shows, applied to a copy: status reads and writes nothing.
        let mut seen = w.clone();
        match state.as_str() {
            "running" | "starting" => seen.open_run(ctx.now_ms),
            "asleep" | "stopped" | "gone" | "failed" => seen.seen_not_running(ctx.now_ms, opts.idle_ms(), state != "asleep"),
            _ => {}
        }
        total += seen.spend_micros(&opts.prices, ctx.now_ms);
        burn += seen.burn_micros(&opts.prices);
        let mut warnings = w.warnings.clone();
        let lifetime = super::admission::lifetime_note(&w, ctx);
        if let Some((word, left)) = lifetime {
            warnings.push(match word {
                "past" => "past its maxLifetimeHours: it takes no more prompts; harvest and drop it".to_string(),
                _ => format!("near its maxLifetimeHours: {left} h left"),
            });
        }
        if !w.prompts.is_empty() && !w.proven() {
            warnings.push("the newest prompt is not yet harvested to this laptop".into());
        }
        if !w.owed.is_empty() {
            warnings.push(format!("files a harvest was asked for are still on the machine: {}", w.owed.join(", ")));
        }
        if !w.temps.is_empty() {
            let paths: Vec<&str> = w.temps.iter().map(|t| t.path.as_str()).collect();
            warnings.push(format!("an interrupted harvest left temp files on the laptop; the next harvest or drop removes them: {}", paths.join(", ")));
        }
        if let Some(f) = w.fork.as_ref().filter(|_| state == "queued") {
            warnings.push(format!("a fork of '{}' waiting for a free slot", f.parent));
        }
        if !warnings.is_empty() {
            next.get_or_insert_with(|| match state.as_str() {
                "queued" => format!("Sleep or drop a running work, then call boxd_fork for work '{}' to admit its queued forks.", w.fork.as_ref().map_or("", |f| f.parent.as_str())),
                "asleep" | "stopped" => format!("Call boxd_resume for work '{}', then boxd_harvest to bring its transcript home.", w.work),
                "gone" => format!("Call boxd_resume for work '{}' to rebuild it, or boxd_drop to close it and see what could not be recovered.", w.work),
                _ => format!("Call boxd_harvest for work '{}' to bring its transcript home.", w.work),
            });
        }
        works.push(json!({
            "work": w.work, "machine": w.machine, "state": state, "directory": w.directory,
            "prompts": w.prompts.len(), "proven": w.proven(), "warnings": warnings,
            "spend": spend_json(&seen, ctx), "lifetime": lifetime.map(|(word, _)| word),
            "parent": w.fork.as_ref().map(|f| f.parent.clone()),
        }));
    }

    let tools: Vec<Value> = TOOLS
        .iter()
        .map(|t| {
            let runs = match (t.access, opts.access) {
                (ToolAccess::Read, _) | (_, AccessOption::All) => "runs",
                (_, AccessOption::AskChanges) => "asks",
                (_, AccessOption::ReadOnly) => "denied",
            };
            json!({ "name": t.name, "access": t.access.as_str(), "runs": runs })
        })
        .collect();

    let bridge_facts = ctx.facts.opencode.clone();
    let bridge = bridge_facts.clone().unwrap_or_default();
    let laptop_opencode = crate::opencode::known_version(ctx);
    let (lo, hi) = options::TESTED_OPENCODE;
    let host_ok = ctx.host_name != "opencode" || options::in_tested_range(&ctx.host_version);
    if !host_ok && !opts.allow_untested_host {
        next = Some(format!("Use OpenCode >={lo} <{hi}, or set \"allowUntestedHost\": true in the plugin options."));
    }
    if bridge.rules_not_added {
        next = Some(Code::RulesNotAdded.next().into());
    }
    if bridge.skills_invalid.is_some() {
        next = Some(Code::SkillsInvalid.next().into());
    }
    let next = next.unwrap_or_else(|| match works.first() {
        None => "Call boxd_ensure with a short work id to start a work.".into(),
        Some(w) => format!("Call boxd_job for work '{}' to see how its run is going.", w["work"].as_str().unwrap_or("")),
    });

    let mut answer = json!({
        "boxd": { "cli": cli, "reason": cli_reason, "connection": connection, "calls": boxd.calls },
        "access": opts.access.as_str(),
        "snapshot": snapshot,
        "guest": match &laptop_opencode {
            Some(v) => json!({ "opencode": v, "note": "machines must boot an image whose OpenCode is this version" }),
            None => json!({ "opencode": Value::Null, "note": "the laptop's OpenCode version is not known to this host" }),
        },
        "works": works,
        "spend": { "total": amount(total), "burnPerHour": amount(burn), "burnRateCeiling": opts.burn_rate_ceiling.map(amount) },
        "tools": tools,
        "host": { "name": ctx.host_name, "version": ctx.host_version, "testedOpenCode": format!(">={lo} <{hi}"), "tested": host_ok },
        "next": next,
    });
    // What only the OpenCode bridge knows appears only there (its rules, its skill copy).
    if bridge_facts.is_some() {
        answer["agentsWithoutRules"] = json!(bridge.agents_without_rules);
        answer["rulesAdded"] = json!(!bridge.rules_not_added);
        answer["skills"] = match &bridge.skills_invalid {
            Some(why) => json!({ "ok": false, "error": Code::SkillsInvalid.as_str(), "reason": why }),
            None => json!({ "ok": true }),
        };
    }
    Ok(answer)
}

/// A work's spend as boxd_status and boxd_job show it (in the price table's currency).
pub fn spend_json(w: &Work, ctx: &Context) -> Value {
    let o = &ctx.options;
    json!({
        "spent": amount(w.spend_micros(&o.prices, ctx.now_ms)),
        "burnPerHour": amount(w.burn_micros(&o.prices)),
        "runningHours": super::drop::hours(w.running_ms(ctx.now_ms)),
        "lifetimeHours": super::drop::hours(w.lifetime_ms(ctx.now_ms)),
        "ceiling": o.work_spend_ceiling.map(amount),
    })
}

/// The word boxd_job and boxd_status use for a machine state.
pub fn job_state(s: State) -> &'static str {
    match s {
        State::Running | State::Standby => "running",
        State::Asleep => "asleep",
        State::Starting => "starting",
        State::Stopped => "stopped",
        State::Failed => "failed",
        State::Gone => "gone",
    }
}
