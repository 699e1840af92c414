//! boxd_status: one read of everything, starting nothing. One `machine list` for any
//! number of works and one `snapshots list`, run side by side; the ledger gives the works.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::{json, Value};

use super::Env;
use crate::boxd::{Boxd, Failure, State};
use crate::errors::{Code, ToolError, ToolResult};
use crate::ledger::{amount, Ledger, Work, WorkState};
use crate::options::{self, AccessOption, Context, ToolRule};
use super::registry::{ToolAccess, ToolSpec, TOOLS};

/// A work folder whose record is gone (removed by hand) while boxd still lists its
/// machine: the password file says this ledger prepared that machine, which bills and may
/// hold unharvested work that no tool can reach without the record. Said, not skipped.
fn record_missing(files: &mut dyn crate::caps::Files, root: &str, id: &str, states: &BTreeMap<String, String>) -> Option<Value> {
    let machine = crate::paths::machine_name(id);
    let status = states.get(&machine)?;
    let mut files = files;
    let mut ledger = Ledger::new(&mut files, root);
    if !ledger.record_removed(id) {
        return None;
    }
    let dir = ledger.work_dir(id);
    let e = ToolError::with_next(
        Code::LedgerFailed,
        format!("{dir} holds work '{id}' (its machine's password) but no record (work.json), and boxd lists {machine} ({status}): no tool can reach that machine or what it holds until the record is back"),
        ledger.put_record_back(id),
    );
    Some(json!({ "work": id, "machine": machine, "state": "unknown", "error": e.code.as_str(), "message": e.message, "next": e.next }))
}

pub fn run(env: &mut Env, _args: &Value) -> ToolResult<Value> {
    let ctx = env.ctx;
    let opts = &ctx.options;
    let mut boxd = Boxd::new(&mut env.programs, opts.boxd_timeout_seconds);

    // The sign-in row is the machine listing: it is what every tool needs to work. The
    // snapshot listing runs beside it (a status costs the slower call, not both).
    let (listing, snapshots) = boxd.list_and_snapshots();
    let (cli, cli_reason, connection, mut next): (&str, String, &str, Option<String>) = match &listing {
        Ok(_) => ("signed in", String::new(), "ok", None),
        Err(Failure::Missing(m)) => ("not reachable", m.clone(), "no CLI", Some(Code::BoxdMissing.next().into())),
        Err(Failure::SignedOut(m)) => ("not signed in", m.clone(), "ok", Some("Run 'boxd auth login' on this laptop, then boxd_status again.".into())),
        Err(Failure::Unreachable(m)) => ("not reachable", m.clone(), "unreachable", Some("Check this laptop's network (a network failure looks like a sign-in failure from here), then 'boxd auth login' if it persists.".into())),
        Err(Failure::Timeout(m)) => ("not reachable", m.clone(), "timed out", Some(Code::Timeout.next().into())),
        Err(Failure::NotFound(m)) | Err(Failure::Other(m)) | Err(Failure::Unsent(m)) | Err(Failure::Unreceived { said: m, .. }) | Err(Failure::Misframed(m)) => ("not reachable", m.clone(), "error", Some(Code::BoxdFailed.next().into())),
        Err(Failure::Refused(m)) => ("refused by the host's policy", m.clone(), "refused", Some(Code::HostFailed.next().into())),
    };
    let states: BTreeMap<String, String> = listing
        .as_ref()
        .map(|ms| ms.iter().map(|m| (m.name.clone(), m.status.clone())).collect())
        .unwrap_or_default();

    let snapshot = if listing.is_ok() {
        match snapshots {
            Ok(list) => match list.iter().find(|s| s.name == opts.snapshot) {
                Some(s) => {
                    // Present, but nothing boots from it yet (or ever): say so in `next`.
                    match s.capture() {
                        crate::boxd::Capture::Pending => {
                            next.get_or_insert_with(|| "boxd is still saving the golden snapshot: call boxd_status again in a minute, before creating a machine.".into());
                        }
                        crate::boxd::Capture::Failed => {
                            next.get_or_insert_with(|| "The golden snapshot's capture failed: build the golden image again under another name (boxd-host golden --name), then set the snapshot option to it.".into());
                        }
                        _ => {}
                    }
                    json!({ "name": opts.snapshot, "present": true, "version": s.version, "status": s.status })
                }
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

    let ids = Ledger::new(&mut env.files, &ctx.ledger).ids().map_err(|e| ToolError::new(Code::StatusUnavailable, format!("the ledger could not be read: {}", e.message)))?;
    // Machines under this plugin's names that no record here names (below, unrecorded).
    let named: alloc::collections::BTreeSet<String> = ids.iter().map(|id| crate::paths::machine_name(id)).collect();
    let unrecorded: Vec<Value> = states.iter().filter(|(m, _)| crate::paths::plugin_machine(m) && !named.contains(*m)).map(|(m, st)| json!({ "machine": m, "status": st })).collect();
    let mut works = Vec::new();
    let mut closed_listed = Vec::new();
    let (mut total, mut burn) = (0u64, 0u64);
    for id in ids {
        // One unreadable record is that work's problem, reported in its row; the rest go on.
        let w = match Ledger::new(&mut env.files, &ctx.ledger).summary(&id) {
            Ok(Some(w)) => w,
            Ok(None) => {
                if let Some(row) = record_missing(env.files, &ctx.ledger, &id, &states) {
                    next.get_or_insert_with(|| row["next"].as_str().unwrap_or_default().to_string());
                    works.push(row);
                }
                continue;
            }
            Err(e) => {
                next.get_or_insert_with(|| e.next.clone());
                works.push(json!({ "work": id, "state": "unknown", "error": e.code.as_str(), "message": e.message, "next": e.next }));
                continue;
            }
        };
        if w.is_closed() {
            // A closed work's name still listed: a create or fork that landed after its
            // drop looked (it bills), or a machine someone made under the name since.
            if let Some(st) = states.get(&w.machine) {
                closed_listed.push(json!({ "work": w.work, "machine": w.machine, "status": st }));
            }
            continue;
        }
        let (state, machine) = match (&listing, states.get(&w.machine)) {
            _ if w.state == WorkState::Queued => ("queued", None),
            (Err(_), _) => ("unknown", None),
            (Ok(_), None) => ("gone", Some(State::Gone)),
            // A tool saw another machine under the name, or the work's create was withdrawn:
            // the one listed is not this work's.
            (Ok(_), Some(_)) if w.name_not_ours() => ("notOurs", Some(State::Gone)),
            (Ok(_), Some(s)) => State::from_status(s).map_or(("unknown", None), |st| (job_state(st), Some(st))),
        };
        let state = state.to_string();
        // What the listing shows, applied to the record as read, as every tool that reads a
        // machine's state applies it (never written back: status writes nothing). It changes
        // only the running intervals, which nothing below but the spend reads, so no copy.
        let mut seen = w;
        if let Some(st) = machine {
            super::admission::see(&mut seen, st, ctx);
        }
        let w = &seen;
        let mut spend = spend_json(w, ctx);
        total += w.spend_micros(&opts.prices, ctx.now_ms);
        let mut warnings = w.warnings.clone();
        if state == "notOurs" {
            // No machine of this work runs: nothing of it bills any more.
            spend["burnPerHour"] = json!(0.0);
            warnings.push(match &w.name_taken_by {
                Some(id) => format!("{} is now another machine (id {}): this work's own machine is gone; no tool touches that one", w.machine, crate::redact::cut(id, 100)),
                None => format!("{} is a machine this ledger did not create (this work's create was withdrawn, and no machine of its own was made); no tool touches it", w.machine),
            });
        } else {
            burn += w.burn_micros(&opts.prices);
        }
        let lifetime = super::admission::lifetime_note(w, ctx);
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
            warnings.extend(super::landing::left_on_laptop(env.files, &w.temps));
        }
        if let Some(f) = w.fork.as_ref().filter(|_| state == "queued") {
            warnings.push(format!("a fork of '{}' waiting for a free slot", f.parent));
        }
        let dropping = w.state == WorkState::Dropping;
        if dropping {
            warnings.push("a boxd_drop of this work is under way or was interrupted: no prompt reaches it, and boxd_sleep and boxd_resume wait for it".into());
        }
        if !warnings.is_empty() {
            next.get_or_insert_with(|| match state.as_str() {
                _ if dropping => format!("Call boxd_drop for work '{}' to finish its drop (or, to keep the work, boxd_ensure once the drop is 10 minutes old).", w.work),
                "queued" => queued_next(&mut env.files, ctx, listing.as_ref().ok().map(|_| &states), w),
                "asleep" | "stopped" => format!("Call boxd_resume for work '{}', then boxd_harvest to bring its transcript home.", w.work),
                "gone" => format!("Call boxd_resume for work '{}' to rebuild it, or boxd_drop to close it and see what could not be recovered.", w.work),
                "notOurs" => format!("Call boxd_drop for work '{}' to close its record (no machine of its own is left; it names what was not recovered).", w.work),
                _ => format!("Call boxd_harvest for work '{}' to bring its transcript home.", w.work),
            });
        }
        let mut row = json!({
            "work": w.work, "machine": w.machine, "state": state, "directory": w.directory,
            "prompts": w.prompts.len(), "proven": w.proven(), "warnings": warnings,
            "lifetime": lifetime.map(|(word, _)| word),
            "parent": w.fork.as_ref().map(|f| f.parent.clone()),
        });
        // Values already built are moved in: json! would copy them whole (to_value).
        row["spend"] = spend;
        works.push(row);
    }

    let bridge_facts = ctx.facts.opencode.clone();
    let bridge = bridge_facts.clone().unwrap_or_default();
    let tools: Vec<Value> = TOOLS.iter().map(|t| tool_row(t, opts.access, bridge.tool_rules.iter().find(|r| r.tool == t.name))).collect();
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
    // A running work's job first; an asleep work has no run going, so waking it is the step.
    let asleep = |w: &&Value| matches!(w["state"].as_str(), Some("asleep" | "stopped"));
    let next = next.unwrap_or_else(|| match (works.iter().find(|w| !asleep(w)), works.first()) {
        (None, None) => "Call boxd_ensure with a short work id to start a work.".into(),
        (Some(w), _) => format!("Call boxd_job for work '{}' to see how its run is going.", w["work"].as_str().unwrap_or("")),
        (None, Some(w)) => format!("Work '{0}' is asleep: call boxd_resume for work '{0}' to go on with it.", w["work"].as_str().unwrap_or("")),
    });

    // Build machines a killed `boxd-host golden` left behind (it records each before asking
    // for it) that boxd still lists: they bill until the next build or the user removes them.
    let builds_left: Vec<Value> = match Ledger::for_call(&mut env.files, ctx).build_machines() {
        Ok(left) => left.into_iter().filter_map(|m| states.get(&m.machine).map(|st| json!({ "machine": m.machine, "status": st }))).collect(),
        Err(_) => Vec::new(),
    };

    let mut answer = json!({
        "boxd": { "cli": cli, "reason": cli_reason, "connection": connection, "calls": boxd.calls },
        "access": opts.access.as_str(),
        "guest": match &laptop_opencode {
            Some(v) => json!({ "opencode": v, "note": "machines must boot an image whose OpenCode is this version" }),
            None => json!({ "opencode": Value::Null, "note": "the laptop's OpenCode version is not known to this host" }),
        },
        "spend": { "total": amount(total), "burnPerHour": amount(burn), "burnRateCeiling": opts.burn_rate_ceiling.map(amount) },
        "host": { "name": ctx.host_name, "version": ctx.host_version, "testedOpenCode": format!(">={lo} <{hi}"), "tested": host_ok },
        "next": next,
    });
    answer["snapshot"] = snapshot;
    answer["works"] = Value::Array(works);
    answer["tools"] = Value::Array(tools);
    if !builds_left.is_empty() {
        answer["buildMachinesLeft"] = json!({
            "machines": builds_left,
            "note": "left by a golden build that was stopped before removing them; the next boxd-host golden removes them, or remove each with 'boxd machine remove NAME -y'",
        });
    }
    if !closed_listed.is_empty() {
        answer["closedWorksMachines"] = json!({
            "machines": closed_listed,
            "note": "machines listed under the name of a work this ledger has closed: a create or fork that landed after the work was dropped (it bills), one someone made under the name since, or the work's own machine, which a drop took for gone when boxd showed another id under its name. No tool touches them; boxd_ensure for the work takes one up again when its id is the one the work recorded (then harvest it); check each with 'boxd machine get NAME', and remove one that is no one's to keep with 'boxd machine remove NAME -y'",
        });
    }
    if !unrecorded.is_empty() {
        answer["unrecordedMachines"] = json!({
            "machines": unrecorded,
            "note": "machines boxd lists under this plugin's names (oc-WORK) that no record in this ledger names: another ledger's (another laptop or user of this boxd account, or this laptop's ledger folder moved: point ledgerDir at it), or a work whose folder was removed from this ledger. They bill while running, and no tool here touches them; check each with 'boxd machine get NAME', and remove one that is no one's to keep with 'boxd machine remove NAME -y'",
        });
    }
    // What only the OpenCode bridge knows appears only there (its rules, its skill copy).
    if bridge_facts.is_some() {
        answer["agent"] = json!(bridge.agent);
        answer["agentsWithoutRules"] = json!(bridge.agents_without_rules);
        if let Some(paste) = rules_to_paste(&bridge.agents_without_rules, &bridge.default_rules_json) {
            answer["rulesToPaste"] = paste;
        }
        answer["rulesAdded"] = json!(!bridge.rules_not_added);
        answer["skills"] = match &bridge.skills_invalid {
            Some(why) => json!({ "ok": false, "error": Code::SkillsInvalid.as_str(), "reason": why }),
            None => json!({ "ok": true }),
        };
    }
    Ok(answer)
}

/// A tool's row: whether it runs, asks or is denied for the calling agent. The access
/// option decides first; the agent's own rule in OpenCode (when the bridge read it) can
/// only make that stricter: a deny hides the tool, an ask makes the bridge ask.
/// The next step for a fork queued for a slot. boxd_fork admits it only from a parent that
/// is open, up and proven, so the step says what the parent needs first; once the parent
/// is dropped (or its name holds another machine) the fork can never be made, and the one
/// step left is to drop it. `states`: the listing by name (None when it failed).
fn queued_next<F: crate::caps::Files>(files: &mut F, ctx: &Context, states: Option<&BTreeMap<String, String>>, fork: &Work) -> String {
    let Some(origin) = fork.fork.as_ref() else { return format!("Call boxd_drop for work '{}'.", fork.work) };
    let (p, f) = (origin.parent.as_str(), fork.work.as_str());
    let admit = format!("then boxd_fork for work '{p}' to admit its queued forks");
    let parent = Ledger::new(files, &ctx.ledger).read(p).ok().flatten();
    // The record the fork was queued from: a parent dropped and its id ensured again is
    // another work, whose boxd_fork never makes this fork.
    let same = |w: &Work| origin.parent_created.as_ref().is_none_or(|c| *c == w.created_at);
    let Some(parent) = parent.filter(|w| !w.is_closed() && w.state != WorkState::Dropping && same(w)) else {
        return format!("Work '{p}', the parent of fork '{f}', was dropped, so the fork can no longer be made: call boxd_drop for work '{f}' to close it.");
    };
    if parent.name_taken_by.is_some() {
        return format!("Work '{p}''s machine is gone (its name holds another machine), so fork '{f}' can no longer be made from it: call boxd_drop for work '{f}' to close it.");
    }
    let st = states.map(|s| s.get(&parent.machine).map_or(Some(State::Gone), |status| State::from_status(status)));
    match st {
        Some(Some(State::Asleep | State::Stopped)) => format!("Call boxd_resume for work '{p}' (a fork copies a machine that is up), {admit}."),
        Some(Some(State::Gone | State::Failed)) => format!("Call boxd_resume for work '{p}' to rebuild its machine (a fork copies a machine that is up), {admit}."),
        _ if !parent.proven() => format!("Call boxd_harvest for work '{p}' (a fork copies only a proven transcript), {admit}."),
        _ => format!("Sleep or drop a running work, {admit}."),
    }
}

fn tool_row(t: &ToolSpec, access: AccessOption, rule: Option<&ToolRule>) -> Value {
    let by_access = match (t.access, access) {
        (ToolAccess::Read, _) | (_, AccessOption::All) => "runs",
        (_, AccessOption::AskChanges) => "asks",
        (_, AccessOption::ReadOnly) => "denied",
    };
    let runs = match rule {
        Some(r) if r.hidden || r.action == "deny" => "denied",
        Some(r) if r.action == "ask" && by_access == "runs" => "asks",
        _ => by_access,
    };
    let mut row = json!({ "name": t.name, "access": t.access.as_str(), "runs": runs });
    if let Some(r) = rule {
        row["rule"] = json!(r.action);
        row["hidden"] = json!(r.hidden);
    }
    row
}

/// What to add to opencode.json for the agents without the default rules: each agent's
/// permission with the rules, to merge after the agent's own "*" rule (later keys win).
fn rules_to_paste(agents: &[String], rules_json: &str) -> Option<Value> {
    let rules: Value = serde_json::from_str(rules_json).ok().filter(Value::is_object)?;
    if agents.is_empty() {
        return None;
    }
    let agent: serde_json::Map<String, Value> = agents.iter().map(|a| (a.clone(), json!({ "permission": rules }))).collect();
    Some(json!({
        "config": { "agent": agent },
        "how": "Merge this into opencode.json: each agent's rules go into agent.<name>.permission after its \"*\" rule, so they win over it.",
    }))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{raw_context as raw, MemFiles, Scripted};
    use crate::tools::{call, RawContext};

    fn status(options: &str, facts: &str) -> Value {
        let (mut p, mut f) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
        p.push_exit(0, "[]", "");
        p.push_exit(0, "[]", "");
        call(&mut p, &mut f, "boxd_status", "{}", raw(options, facts)).unwrap()
    }

    fn row<'a>(v: &'a Value, tool: &str) -> &'a Value {
        v["tools"].as_array().unwrap().iter().find(|t| t["name"] == tool).unwrap()
    }

    #[test]
    fn a_tool_the_users_rule_denies_or_asks_is_not_said_to_run() {
        let facts = r#"{"agent":"build","toolRules":{"boxd_drop":"deny hidden","boxd_sleep":"ask","boxd_job":"allow"},"defaultRules":{"boxd_*":"allow"}}"#;
        let v = status("{}", facts);
        assert_eq!(v["agent"], "build");
        assert_eq!(row(&v, "boxd_drop")["runs"], "denied");
        assert_eq!(row(&v, "boxd_drop")["hidden"], true);
        assert_eq!(row(&v, "boxd_sleep")["runs"], "asks");
        assert_eq!(row(&v, "boxd_job")["runs"], "runs");
        assert_eq!(row(&v, "boxd_job")["rule"], "allow");
        // A rule never loosens the access option.
        let v = status(r#"{"access":"read-only"}"#, r#"{"toolRules":{"boxd_ensure":"allow"}}"#);
        assert_eq!(row(&v, "boxd_ensure")["runs"], "denied");
    }

    /// A work folder whose record was removed by hand, while boxd lists the machine this
    /// ledger prepared (its password file): a row naming it and what to put back, not
    /// silence. A folder without that file (a create refused before anything was made) or
    /// without a listed machine says nothing.
    #[test]
    fn a_work_whose_record_was_removed_while_its_machine_runs_is_named() {
        let listed = |fs: &mut MemFiles| {
            let mut p = Scripted::default();
            p.push_exit(0, r#"[{"name":"oc-w1","status":"running"}]"#, "");
            p.push_exit(0, r#"[{"name":"opencode-golden","version":"v1","status":"ready"}]"#, "");
            call(&mut p, fs, "boxd_status", "{}", raw("{}", "{}")).unwrap()
        };
        let mut f = MemFiles::new(&["/p", "/l"]);
        crate::caps::Files::create_dir_all(&mut f, "/l/works/w1").unwrap();
        assert_eq!(listed(&mut f)["works"], json!([]), "an empty folder is no work");
        f.put("/l/works/w1/password", b"secret");
        let v = listed(&mut f);
        let w = &v["works"][0];
        assert_eq!((w["work"].as_str(), w["state"].as_str(), w["error"].as_str()), (Some("w1"), Some("unknown"), Some("LEDGER_FAILED")), "{v:#}");
        assert!(w["message"].as_str().unwrap().contains("no record") && w["next"].as_str().unwrap().contains("/l/works/w1/work.json back"), "{w:#}");
        assert_eq!(v["next"], w["next"]);
    }

    /// A fork queued for a slot: the next step is one its parent allows (boxd_resume while
    /// the parent sleeps, boxd_harvest while it is unproven, boxd_drop of the fork once the
    /// parent is dropped), not a boxd_fork that cannot admit it then.
    #[test]
    fn a_queued_forks_next_step_is_one_its_parent_allows() {
        use crate::ledger::{ForkOrigin, Ledger, Prompt, WorkState};
        let cases = [
            ("running", "", "Sleep or drop a running work, then"),
            ("hibernated", "", "Call boxd_resume for work 'w1' (a fork copies a machine that is up), then boxd_fork for work 'w1'"),
            ("running", "unproven", "Call boxd_harvest for work 'w1'"),
            ("running", "dropped", "the fork can no longer be made: call boxd_drop for work 'fa'"),
            ("running", "ensured again", "the fork can no longer be made: call boxd_drop for work 'fa'"),
        ];
        for (listed, parent, want) in cases {
            let mut f = crate::testing::open_work(None);
            let created = Ledger::new(&mut f, "/l").require("w1").unwrap().created_at;
            let mut fa = Work::new("fa", "/p", "t");
            fa.state = WorkState::Queued;
            fa.fork = Some(ForkOrigin { parent: "w1".into(), parent_created: Some(created), order: 1, ..Default::default() });
            Ledger::new(&mut f, "/l").write(&fa).unwrap();
            Ledger::new(&mut f, "/l")
                .update("w1", |w| match parent {
                    "dropped" => w.state = WorkState::Closed,
                    "ensured again" => w.created_at = "2026-12-02T00:00:00Z".into(),
                    "unproven" => w.prompts.push(Prompt { id: "p1".into(), admitted: true, ..Default::default() }),
                    _ => {}
                })
                .unwrap();
            let mut p = Scripted::default();
            p.push_exit(0, &format!(r#"[{{"name":"oc-w1","status":"{listed}"}}]"#), "");
            p.push_exit(0, r#"[{"name":"opencode-golden","version":"v1","status":"ready"}]"#, "");
            let v = call(&mut p, &mut f, "boxd_status", "{}", raw("{}", "{}")).unwrap();
            assert!(v["next"].as_str().unwrap().contains(want), "{listed} {parent}: {v:#}");
        }
    }

    /// A machine listed under the name of a work the ledger has closed (a fork or create
    /// that landed after the drop looked, or someone's since) is named with how to check
    /// and remove it by hand; a closed work whose name is not listed is not, and status
    /// asks boxd nothing more for either.
    #[test]
    fn a_machine_listed_under_a_closed_works_name_is_named_and_left_alone() {
        use crate::ledger::{Ledger, WorkState};
        let (mut p, mut f) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
        for id in ["w1", "w2"] {
            let mut w = Work::new(id, "/p", "t");
            w.state = WorkState::Closed;
            Ledger::new(&mut f, "/l").write(&w).unwrap();
        }
        p.push_exit(0, r#"[{"name":"oc-w1","status":"running"}]"#, "");
        p.push_exit(0, "[]", "");
        let v = call(&mut p, &mut f, "boxd_status", "{}", raw("{}", "")).unwrap();
        assert_eq!(v["works"], json!([]), "closed works have no row");
        assert_eq!(v["closedWorksMachines"]["machines"], json!([{ "work": "w1", "machine": "oc-w1", "status": "running" }]));
        assert!(v["closedWorksMachines"]["note"].as_str().unwrap().contains("'boxd machine remove NAME -y'"), "{v:#}");
        assert_eq!(p.requests.len(), 2, "the two listings only");
        assert!(status("{}", "").get("closedWorksMachines").is_none());
    }

    /// A machine under the plugin's names that no record of this ledger names (a work folder
    /// removed, a ledger moved, another ledger's) is listed, so a billing machine is not
    /// left unseen; the ledger's own works' machines and other names are not.
    #[test]
    fn a_machine_under_our_names_that_no_record_names_is_listed() {
        let (mut p, mut f) = (Scripted::default(), crate::testing::open_work(None));
        p.push_exit(0, r#"[{"name":"oc-w1","status":"running"},{"name":"oc-w9","status":"running"},{"name":"golden-build","status":"running"},{"name":"mine","status":"running"}]"#, "");
        p.push_exit(0, "[]", "");
        let v = call(&mut p, &mut f, "boxd_status", "{}", raw("{}", "")).unwrap();
        assert_eq!(v["unrecordedMachines"]["machines"], json!([{ "machine": "oc-w9", "status": "running" }]), "{v:#}");
        assert!(status("{}", "").get("unrecordedMachines").is_none());
    }

    /// An asleep work has no run going: the step is to wake it, not to ask its job.
    #[test]
    fn an_asleep_work_is_woken_not_asked_about_its_run() {
        let (mut p, mut f) = (Scripted::default(), crate::testing::open_work(None));
        p.push_exit(0, r#"[{"name":"oc-w1","status":"hibernated"}]"#, "");
        p.push_exit(0, r#"[{"name":"opencode-golden","version":"1","status":"ready"}]"#, "");
        let v = call(&mut p, &mut f, "boxd_status", "{}", raw("{}", "")).unwrap();
        assert_eq!(v["works"][0]["state"], "asleep", "{v:#}");
        assert!(v["next"].as_str().unwrap().contains("call boxd_resume for work 'w1'"), "{v:#}");
    }

    /// A work whose record grew (every run and sleep kept for the spend, many prompts and
    /// proofs) shows the spend its whole record gives, from the summary status reads.
    #[test]
    fn a_record_with_a_huge_runs_list_gives_the_same_status() {
        use crate::ledger::{Ledger, Proof, Prompt, WorkState};
        let (mut p, mut f) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
        let mut w = Work::new("w1", "/p", "t");
        w.state = WorkState::Open;
        w.created_ms = 1;
        for i in 0..20_000u64 {
            w.open_run(i * 10);
            w.close_run(i * 10 + 7, "boxd_sleep");
        }
        w.open_run(300_000);
        for i in 0..200u64 {
            w.prompts.push(Prompt { id: format!("p{i}"), at: "t".into(), sha256: "0".repeat(64), bytes: 3, admitted: true, at_ms: 300_000 + i, ..Default::default() });
            w.proofs.push(Proof { at: "t".into(), prompts: i + 1, ..Default::default() });
        }
        Ledger::new(&mut f, "/l").write(&w).unwrap();
        p.push_exit(0, "[]", "");
        p.push_exit(0, "[]", "");
        let at_nine = || RawContext { now_ms: 9_000_000, ..raw("{}", "") };
        let ctx = crate::tools::context(at_nine()).unwrap();
        let v = call(&mut p, &mut f, "boxd_status", "{}", at_nine()).unwrap();
        // The listing does not show oc-w1: status sees it gone, as the whole record would.
        let mut seen = w.clone();
        seen.seen_not_running(ctx.now_ms, ctx.options.idle_ms(), true);
        let row = &v["works"][0];
        assert_eq!((row["state"].as_str(), row["prompts"].as_u64(), row["proven"].as_bool()), (Some("gone"), Some(200), Some(true)));
        assert_eq!(row["spend"], spend_json(&seen, &ctx));
        assert_eq!(v["spend"]["total"], json!(amount(seen.spend_micros(&ctx.options.prices, ctx.now_ms))));
        assert!(seen.spend_micros(&ctx.options.prices, ctx.now_ms) > 0);
    }

    /// The two listings go to the host as one batch (it runs them side by side). A failed
    /// machine listing still decides the sign-in row, and the snapshot row says why it has
    /// no answer, whatever the snapshot listing said.
    #[test]
    fn the_two_listings_run_side_by_side_and_a_failed_listing_still_decides() {
        let (mut p, mut f) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
        p.push_exit(0, "[]", "");
        p.push_exit(0, r#"[{"name":"opencode-golden","version":"v2","status":"ready"}]"#, "");
        let v = call(&mut p, &mut f, "boxd_status", "{}", raw("{}", "")).unwrap();
        assert_eq!(p.batches, [2]);
        let asked: Vec<String> = p.requests.iter().map(|r| r.args.join(" ")).collect();
        assert_eq!(asked, ["machine list --json", "snapshots list --json"]);
        assert_eq!((v["boxd"]["cli"].as_str(), v["snapshot"]["present"].as_bool(), v["snapshot"]["version"].as_str()), (Some("signed in"), Some(true), Some("v2")));

        let (mut p, mut f) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
        p.push_exit(1, "", "error: not logged in; run 'boxd auth login'");
        p.push_exit(0, "[]", "");
        let v = call(&mut p, &mut f, "boxd_status", "{}", raw("{}", "")).unwrap();
        assert_eq!(p.batches, [2]);
        assert_eq!(v["boxd"]["cli"], "not signed in", "{v}");
        assert_eq!(v["snapshot"]["present"], Value::Null);
        assert_eq!(v["snapshot"]["reason"], "the boxd CLI did not answer");
    }

    #[test]
    fn every_agent_without_the_rules_gets_them_to_paste() {
        let v = status("{}", r#"{"agentsWithoutRules":["careful","explore"],"defaultRules":{"boxd_*":"allow","boxd_drop":"ask"}}"#);
        assert_eq!(v["agentsWithoutRules"], json!(["careful", "explore"]));
        let agents = &v["rulesToPaste"]["config"]["agent"];
        assert_eq!(agents["careful"]["permission"], json!({ "boxd_*": "allow", "boxd_drop": "ask" }));
        assert_eq!(agents["explore"]["permission"]["boxd_drop"], "ask");
        assert!(v["rulesToPaste"]["how"].as_str().unwrap().contains("after its \"*\" rule"));
        assert!(status("{}", r#"{"agentsWithoutRules":[],"defaultRules":{}}"#).get("rulesToPaste").is_none());
    }
}
