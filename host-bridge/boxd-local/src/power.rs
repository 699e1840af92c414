//! Power states and idle bounds: start/stop/reboot, pause/resume (standby), hibernate/wake,
//! the check exec/cp make before a session, and the sweep every invocation runs first.
//! Here standby and hibernated both mean "processes SIGSTOPped"; only the status differs.

use crate::app::Ctx;
use crate::fail::{Fail, Res};
use crate::store::{Home, Locked, Machine, Session};
use crate::{machines, procs, util};
use serde::Serialize;
use std::time::Instant;

#[derive(Serialize)]
struct NameStatus<'a> {
    name: &'a str,
    status: &'a str,
}

#[derive(Serialize)]
struct Suspended {
    suspend_us: u64,
}

#[derive(Serialize)]
struct Resumed {
    resume_us: u64,
}

fn wrong(status: &str, need: &str) -> Fail {
    Fail::new(format!("vm is '{status}' — {need}"))
}

/// exec and cp work on `running`, wake `standby` first (like inbound traffic on real boxd),
/// and refuse the rest with the command that would help.
pub fn ready_for_session(m: &mut Machine, now: u64) -> Res<()> {
    let name = m.name.clone();
    match m.status_at(now).unwrap_or_default() {
        "running" => Ok(()),
        "standby" => {
            procs::cont_all(&m.id);
            m.status = "running".to_string();
            Ok(())
        }
        "hibernated" => Err(Fail::new(format!(
            "VM '{name}' is hibernated — run 'boxd machine wake {name}' first"
        ))),
        "starting" => Err(Fail::new(format!("VM '{name}' is starting — try again shortly"))),
        other => Err(Fail::new(format!("VM '{name}' is {other} — run 'boxd machine start {name}' first"))),
    }
}

/// End an exec/cp session: forget it and count its end as activity. The machine may be
/// gone by now (removed, lost), which is fine.
pub fn end_session(home: &Home, id: &str, me: &Session) {
    if let Ok(mut lock) = home.lock()
        && let Some(m) = lock.state.machines.iter_mut().find(|m| m.id == id)
    {
        m.sessions.retain(|s| s != me);
        m.last_activity_ms = m.last_activity_ms.max(util::now_ms());
        let _ = lock.save();
    }
}

/// A machine powered off loses its temporary folder, as a boot empties a real one's /tmp
/// (its processes are gone, so nothing still uses it). Without this, each OpenCode server
/// start left a library there for as long as the machine lived.
fn empty_tmp(ctx: &Ctx, id: &str) {
    let _ = crate::fstree::remove_tree(&ctx.home.machine_tmp(id));
}

/// start / stop / reboot / pause / resume / hibernate / wake.
pub fn change(ctx: &Ctx) -> Res<i32> {
    let name = ctx.inv.args[0].as_str();
    let mut lock = ctx.home.lock()?;
    let now = util::now_ms();
    let i = lock.state.visible(name, now)?;
    let m = &mut lock.state.machines[i];
    let status = m.status_at(now).unwrap_or_default().to_string();
    let id = m.id.clone();
    let t0 = Instant::now();
    let (new_status, activity) = match (ctx.inv.verb, status.as_str()) {
        ("machine pause", "running") => {
            procs::stop_all(&id);
            ("standby", false)
        }
        ("machine pause", s) => return Err(wrong(s, "must be running to pause")),
        ("machine resume", "standby") => {
            procs::cont_all(&id);
            ("running", true)
        }
        ("machine resume", s) => return Err(wrong(s, "must be in standby to resume")),
        ("machine hibernate", "running" | "standby") => {
            procs::stop_all(&id);
            ("hibernated", false)
        }
        ("machine hibernate", "hibernated") => ("hibernated", false),
        ("machine hibernate", s) => return Err(wrong(s, "must be running to hibernate")),
        ("machine wake", "hibernated" | "standby") => {
            procs::cont_all(&id);
            ("running", true)
        }
        ("machine wake", "running") => ("running", false),
        ("machine wake", "starting") => return Err(wrong("starting", "try again shortly")),
        ("machine wake", s) => return Err(wrong(s, &format!("run 'boxd machine start {name}'"))),
        ("machine start", "stopped" | "failed") => ("running", true),
        ("machine start", "running" | "starting") => (status.as_str(), false),
        ("machine start", "standby") => return Err(wrong("standby", &format!("run 'boxd machine resume {name}'"))),
        ("machine start", s) => return Err(wrong(s, &format!("run 'boxd machine wake {name}'"))),
        ("machine stop", "stopped") => ("stopped", false),
        ("machine stop", _) => {
            procs::kill_all(&id);
            empty_tmp(ctx, &id);
            ("stopped", false)
        }
        ("machine reboot", "starting") => return Err(wrong("starting", "try again shortly")),
        // Reboot is a cold boot: processes die, the machine comes back running.
        (_, _) => {
            procs::kill_all(&id);
            empty_tmp(ctx, &id);
            ("running", true)
        }
    };
    let micros = t0.elapsed().as_micros() as u64;
    let new_status = new_status.to_string();
    m.status = new_status.clone();
    m.visible_at_ms = None;
    m.ready_at_ms = None;
    if activity {
        m.last_activity_ms = now;
    }
    lock.save()?;
    match ctx.inv.verb {
        "machine pause" => ctx.out.either(&Suspended { suspend_us: micros }, || {
            format!("{name}: standby (suspended in {micros}µs)")
        }),
        "machine resume" => ctx.out.either(&Resumed { resume_us: micros }, || {
            format!("{name}: running (resumed in {micros}µs)")
        }),
        _ => ctx.out.either(&NameStatus { name, status: &new_status }, || format!("{name}: {new_status}")),
    }
    Ok(0)
}

/// Run at every invocation, before the command: settle late landings, drop dead sessions,
/// and apply idle bounds — auto-destroy (any state), auto-hibernate (running/standby),
/// auto-suspend (running). A machine with a live exec/cp session is not idle.
/// Returns whether the state changed.
pub fn sweep(lock: &mut Locked, now: u64) -> Res<bool> {
    let mut changed = false;
    let mut doomed = Vec::new();
    for m in lock.state.machines.iter_mut() {
        if m.ready_at_ms.is_some_and(|t| now >= t) {
            m.visible_at_ms = None;
            m.ready_at_ms = None;
            changed = true;
        }
        if m.visible_at_ms.is_some() || m.ready_at_ms.is_some() {
            continue;
        }
        let before = m.sessions.len();
        m.sessions.retain(procs::session_alive);
        changed |= m.sessions.len() != before;
        if !m.sessions.is_empty() {
            continue;
        }
        let idle_ms = now.saturating_sub(m.last_activity_ms);
        let past = |secs: u64| secs > 0 && idle_ms > secs.saturating_mul(1000);
        if past(m.auto_destroy_s) {
            doomed.push(m.clone());
            continue;
        }
        let next = match m.status.as_str() {
            "running" if past(m.auto_hibernate_s) => "hibernated",
            "running" if past(m.auto_suspend_s) => "standby",
            "standby" if past(m.auto_hibernate_s) => "hibernated",
            _ => continue,
        };
        procs::stop_all(&m.id);
        m.status = next.to_string();
        changed = true;
    }
    for m in doomed {
        machines::destroy(lock, &m)?;
        changed = true;
    }
    Ok(changed)
}
