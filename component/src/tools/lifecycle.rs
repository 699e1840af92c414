//! The lifecycle of a work's machine: ensure (create or adopt), sleep, resume, image and
//! drop. Every create and remove is recorded in the ledger before it runs, every machine
//! is checked to be the ledger's before it is touched, and drop destroys nothing the
//! laptop cannot account for.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::{json, Value};

use super::{work_arg, Env};
use crate::boxd::{Boxd, Failure, State};
use crate::caps::{Files, Kind, Programs};
use crate::errors::{Code, ToolError, ToolResult};
use crate::opencode::Opencode;
use crate::ledger::{Ledger, Sleep, Work, WorkState};
use crate::paths;

fn idle_seconds(env: &Env) -> u32 {
    env.ctx.options.idle_minutes * 60
}

/// Make the guest side ready: the helper in place, the work tree a git repository, the
/// OpenCode server (same version as the laptop's) with the work's password, and the pump.
/// One exec (two the first time, when the helper is uploaded). Only ever called after the
/// machine's id was checked against the ledger: the password goes to no other machine.
fn prepare_guest<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, w: &Work, entropy: &[u8], version: Option<&str>) -> ToolResult<Value> {
    if entropy.len() < 16 {
        return Err(ToolError::new(Code::StatusUnavailable, "the host gave no random bytes for the server password"));
    }
    let password = ledger.password_or_create(&w.work, &crate::encode::hex(entropy))?;
    let mut flags: Vec<&str> = Vec::new();
    if let Some(v) = version {
        flags.extend(["--opencode-version", v]);
    }
    let mut stdin = password.into_bytes();
    stdin.push(b'\n');
    let answer = crate::guest::Guest::new(boxd, &w.machine, &w.work).call("prepare", &flags, Some(stdin))?;
    let sha = crate::encode::sha256_hex(crate::guest::HELPER);
    ledger.update(&w.work, |w| w.helper_sha256 = Some(sha))?;
    Ok(answer)
}

fn work_json(w: &Work, state: &str) -> Value {
    json!({ "work": w.work, "machine": w.machine, "machineId": w.machine_id, "directory": w.directory, "state": state })
}

/// The work's laptop folder: inside a granted root, an existing directory, reached through
/// no symlink. Checked before anything is created.
fn work_directory(env: &mut Env, args: &Value) -> ToolResult<String> {
    let ctx = env.ctx;
    let roots = super::laptop_roots(ctx);
    let Some(d) = args.get("directory").and_then(Value::as_str) else { return Ok(ctx.project.clone()) };
    let dir = paths::laptop_path(d, &ctx.project, &roots)?;
    let refused = |why: &str| ToolError::new(Code::PathRefused, format!("directory '{d}' {why}; no machine was created"));
    match env.files.stat(&dir) {
        Ok(Some(m)) if m.kind == Kind::Dir => Ok(dir),
        Ok(Some(m)) if m.kind == Kind::Symlink => Err(refused("is a symlink (or leads through one), which is never followed")),
        Ok(Some(_)) => Err(refused("is not a folder")),
        Ok(None) => Err(refused("does not exist")),
        Err(_) => Err(refused("cannot be checked")),
    }
}

pub fn ensure(env: &mut Env, args: &Value) -> ToolResult<Value> {
    let (work, machine) = work_arg(args)?;
    let directory = work_directory(env, args)?;
    let ctx = env.ctx;
    let now = env.now();
    let idle = idle_seconds(env);
    let snapshot = ctx.options.snapshot.clone();
    let version = Opencode::new(&mut env.programs).version(env.ctx);
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    let mut record = ledger.read(&work)?;
    if let Some(w) = &record {
        if w.is_closed() {
            // A dropped work's id may be used again; keep the old record beside the new one.
            let old = serde_json::to_vec_pretty(w).expect("serialises");
            let stamp: String = w.created_at.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '-' }).collect();
            ledger.put_blob(&work, &format!("closed-{stamp}.json"), &old)?;
            record = None;
        }
    }
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    // One read that carries the id: the machine is ours, or it is refused untouched.
    if let Some(info) = boxd.get(&machine).map_err(Failure::into_error)? {
        let Some(w) = record else {
            return Err(ToolError::with_next(
                Code::NotOurs,
                format!("a machine named {machine} exists, but this laptop's ledger did not create it"),
                format!("Pick another work id, or remove {machine} yourself if it is yours ('boxd machine remove {machine} -y')."),
            ));
        };
        // A create whose answer never came is adopted: the ledger recorded it first.
        let adopted = w.machine_id.is_none() || w.state == WorkState::Creating;
        if w.machine_id.is_none() && w.state != WorkState::Creating {
            return Err(ToolError::new(Code::NotOurs, format!("{machine} exists, but the ledger recorded no create for work '{work}'")));
        }
        if info.id.is_empty() {
            return Err(ToolError::new(Code::NotOurs, format!("boxd gave no id for {machine}, so it cannot be checked against the ledger")));
        }
        let mut owned = w.clone();
        owned.machine_id.get_or_insert_with(|| info.id.clone());
        super::check_machine(&owned, &info)?;
        let st = State::from_status(&info.status);
        let id = owned.machine_id.clone();
        let w = ledger.update(&work, |w| {
            w.machine_id = id;
            if st != State::Starting {
                w.state = WorkState::Open;
            }
        })?;
        if st == State::Starting {
            return Err(ToolError::new(Code::MachineStarting, format!("{machine} is still starting")));
        }
        let guest = if matches!(st, State::Running | State::Standby) {
            prepare_guest(&mut boxd, &mut ledger, &w, &ctx.entropy, version.as_deref())?
        } else {
            Value::Null
        };
        let mut out = work_json(&w, super::status::job_state(st));
        out["guest"] = guest;
        out["adopted"] = json!(adopted);
        out["created"] = json!(false);
        out["next"] = json!(match st {
            State::Asleep | State::Stopped => format!("Call boxd_resume for work '{work}' to wake its machine."),
            _ => format!("Call boxd_submit for work '{work}' with the task."),
        });
        return Ok(out);
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
    let snapshots = boxd.snapshots().map_err(Failure::into_error)?;
    if !snapshots.iter().any(|s| s.name == snapshot) {
        return Err(ToolError::new(Code::SnapshotMissing, format!("the golden snapshot '{snapshot}' does not exist, so no machine was created")));
    }
    // Intent before effect: a create that lands after boxd stops answering is then adopted
    // by the next ensure instead of becoming a second machine.
    let dir = directory.clone();
    ledger.upsert(&work, |cur| {
        let mut w = match cur.filter(|w| !w.is_closed()) {
            Some(w) => w,
            None => Work::new(&work, &dir, &now),
        };
        w.state = WorkState::Creating;
        w.machine_id = None;
        w.directory = dir;
        Ok(Some(w))
    })?;
    match boxd.create(&machine, &snapshot, idle) {
        Ok(created) => {
            // Open only with an id to check later; without one the next ensure adopts it.
            let boot_timeout = created.boot_timeout || created.id.is_none();
            let w = ledger.update(&work, |w| {
                w.machine_id = created.id;
                if !boot_timeout {
                    w.state = WorkState::Open;
                }
            })?;
            if boot_timeout {
                return Err(ToolError::new(Code::CreateUncertain, format!("boxd created {machine} but its boot timed out or its answer carried no id; it may still come up")));
            }
            let guest = prepare_guest(&mut boxd, &mut ledger, &w, &ctx.entropy, version.as_deref())?;
            let mut out = work_json(&w, "running");
            out["guest"] = guest;
            out["adopted"] = json!(false);
            out["created"] = json!(true);
            out["next"] = json!(format!("Call boxd_submit for work '{work}' with the task."));
            Ok(out)
        }
        Err(Failure::Timeout(m)) => Err(ToolError::new(Code::CreateUncertain, format!("boxd machine new did not answer ({m}); the machine may still appear"))),
        Err(Failure::Other(m)) if m.contains("already exists") => {
            Err(ToolError::new(Code::CreateUncertain, format!("boxd says {machine} already exists but did not show it a moment ago")))
        }
        Err(e) => Err(e.into_error()),
    }
}

pub fn sleep(env: &mut Env, args: &Value) -> ToolResult<Value> {
    let (work, machine) = work_arg(args)?;
    let now = env.now();
    let ctx = env.ctx;
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    let w = ledger.require(&work)?;
    super::require_open(&w)?;
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    let already = match super::owned_state(&mut boxd, &w)? {
        State::Asleep => true,
        State::Gone => return Err(ToolError::new(Code::MachineGone, format!("{machine} no longer exists"))),
        State::Starting => return Err(ToolError::new(Code::MachineStarting, format!("{machine} is still starting"))),
        _ => {
            boxd.hibernate(&machine).map_err(Failure::into_error)?;
            false
        }
    };
    let mut warning = None;
    let w = ledger.update(&work, |w| {
        if !w.prompts.is_empty() && !w.proven() {
            let text = format!("slept at {now} {}: the transcript on this laptop is behind the machine", super::harvest::UNHARVESTED_SLEEP);
            w.warnings.push(text.clone());
            warning = Some(text);
        }
        if !already {
            w.sleeps.push(Sleep { by: "boxd_sleep".into(), at: now.clone() });
            w.asleep_by_tool = true;
        }
    })?;
    let mut out = work_json(&w, "asleep");
    out["asleepBy"] = json!("boxd_sleep");
    out["sleptAt"] = json!(w.sleeps.last().map(|s| s.at.clone()));
    out["alreadyAsleep"] = json!(already);
    out["warning"] = json!(warning);
    out["next"] = json!(format!("Call boxd_resume for work '{work}' when you need it again."));
    Ok(out)
}

/// Import the proven transcript into a rebuilt guest, parents first (the proof's order).
fn restore_transcript<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, w: &Work) -> ToolResult<usize> {
    let Some(proof) = w.proofs.last() else { return Ok(0) };
    let mut sessions = Vec::new();
    for s in &proof.sessions {
        let Some(file) = &s.file else { continue };
        let bytes = ledger.get_blob(&w.work, file)?.ok_or_else(|| {
            ToolError::new(Code::LedgerFailed, format!("the stored export {file} of session {} is missing from the ledger", s.id))
        })?;
        sessions.push(serde_json::from_slice::<Value>(&bytes).map_err(|e| ToolError::new(Code::LedgerFailed, format!("{file}: {e}")))?);
    }
    if sessions.is_empty() {
        return Ok(0);
    }
    let n = sessions.len();
    let payload = serde_json::to_vec(&json!({ "sessions": sessions })).expect("serialises");
    crate::guest::Guest::new(boxd, &w.machine, &w.work).call("import", &[], Some(payload))?;
    Ok(n)
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
    let idle = idle_seconds(env);
    let version = Opencode::new(&mut env.programs).version(env.ctx);
    let ctx = env.ctx;
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    let w = ledger.require(&work)?;
    if w.is_closed() {
        return Err(ToolError::with_next(Code::MachineGone, format!("work '{work}' was dropped"), format!("Call boxd_ensure for work '{work}' to start it again.")));
    }
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    let action = match super::owned_state(&mut boxd, &w)? {
        State::Asleep => {
            boxd.wake(&machine).map_err(Failure::into_error)?;
            Wake::Woken
        }
        State::Standby => {
            boxd.resume(&machine).map_err(Failure::into_error)?;
            Wake::Resumed
        }
        State::Stopped | State::Failed => {
            boxd.start(&machine).map_err(Failure::into_error)?;
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
            let snapshot = ctx.options.snapshot.clone();
            let snapshots = boxd.snapshots().map_err(Failure::into_error)?;
            if !snapshots.iter().any(|s| s.name == snapshot) {
                return Err(ToolError::new(Code::SnapshotMissing, format!("{machine} is gone and the golden snapshot '{snapshot}' does not exist to rebuild it")));
            }
            ledger.update(&work, |w| {
                w.state = WorkState::Creating;
                w.machine_id = None;
            })?;
            let created = match boxd.create(&machine, &snapshot, idle) {
                Ok(c) => c,
                Err(Failure::Timeout(m)) => return Err(ToolError::new(Code::CreateUncertain, format!("rebuilding {machine}: {m}"))),
                Err(e) => return Err(e.into_error()),
            };
            let boot_timeout = created.boot_timeout;
            let has_id = created.id.is_some();
            ledger.update(&work, |w| {
                w.machine_id = created.id;
                if !boot_timeout && has_id {
                    w.state = WorkState::Open;
                    w.helper_sha256 = None;
                }
            })?;
            if boot_timeout || !has_id {
                return Err(ToolError::new(Code::CreateUncertain, format!("boxd rebuilt {machine} but its boot timed out or its answer carried no id")));
            }
            Wake::Rebuilt
        }
    };
    if action != Wake::Rebuilt {
        // Waking restores boxd's default bound on some paths; ours is what limits billing.
        // Also when it is already running: a resume killed between its wake and this call
        // must not leave the default bound behind.
        boxd.set_idle(&machine, idle).map_err(Failure::into_error)?;
    }
    let w = ledger.update(&work, |w| w.asleep_by_tool = false)?;
    prepare_guest(&mut boxd, &mut ledger, &w, &ctx.entropy, version.as_deref())?;
    let mut restored = 0;
    if action == Wake::Rebuilt {
        restored = restore_transcript(&mut boxd, &mut ledger, &w)?;
    } else {
        // A server that died mid-run is reported once, here or by boxd_job.
        crate::guest::Guest::new(&mut boxd, &machine, &work).call("status", &[], None)?;
    }
    let mut out = work_json(&w, "running");
    out["action"] = json!(action.word());
    out["restoredSessions"] = json!(restored);
    out["next"] = json!(format!("Call boxd_job for work '{work}'."));
    Ok(out)
}

pub fn image(env: &mut Env, args: &Value) -> ToolResult<Value> {
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
    match super::owned_state(&mut boxd, &w)? {
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

fn require_proven(w: &Work) -> ToolResult<()> {
    if w.proven() {
        return Ok(());
    }
    let why = if w.proofs.is_empty() {
        "no harvest has proven its transcript on this laptop".to_string()
    } else {
        format!("the last proof covers {} of {} prompts", w.proofs.last().map_or(0, |p| p.prompts), w.prompts.len())
    };
    Err(ToolError::with_next(Code::NotProven, format!("work '{}': {why}", w.work), format!("Call boxd_harvest for work '{}' first.", w.work)))
}

pub fn drop(env: &mut Env, args: &Value) -> ToolResult<Value> {
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
    let ctx = env.ctx;
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    let w = ledger.require(&work)?;
    if w.is_closed() {
        let mut out = work_json(&w, "gone");
        out["dropped"] = json!(false);
        out["next"] = json!("Nothing to do: this work was already dropped.");
        return Ok(out);
    }
    if w.state == WorkState::Creating {
        // Its create never answered: the machine may still appear, and closing the work now
        // would leave it billing with no record.
        return Err(ToolError::with_next(
            Code::CreateUncertain,
            format!("work '{work}': the create of {machine} never answered, so it may still appear"),
            format!("Call boxd_ensure for work '{work}' (it adopts the machine or makes one), then boxd_drop."),
        ));
    }
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    let Some(info) = boxd.get(&machine).map_err(Failure::into_error)? else {
        // Nothing left to destroy: close the work and say what could not be recovered.
        let covered = w.proofs.last().map_or(0, |p| p.prompts as usize);
        let lost: Vec<String> = w.prompts.iter().skip(covered).map(|p| p.id.clone()).chain(w.owed.iter().cloned()).collect();
        let w = ledger.update(&work, |w| {
            w.state = WorkState::Closed;
            w.unrecovered = lost.clone();
        })?;
        let mut out = work_json(&w, "gone");
        out["dropped"] = json!(true);
        out["machineWasGone"] = json!(true);
        out["unrecovered"] = json!({
            "prompts": w.prompts.iter().skip(covered).map(|p| p.id.clone()).collect::<Vec<_>>(),
            "files": w.owed,
        });
        out["next"] = json!("Done: the machine was already gone; the work is closed. The prompts listed as unrecovered never reached this laptop.");
        return Ok(out);
    };
    super::check_machine(&w, &info)?;
    match State::from_status(&info.status) {
        State::Running | State::Standby => {}
        State::Starting => return Err(ToolError::new(Code::MachineStarting, format!("{machine} is still starting"))),
        state => {
            return Err(ToolError::with_next(
                Code::MachineAsleep,
                format!("{machine} is {}: drop checks the live machine before destroying it, which needs it awake", super::status::job_state(state)),
                format!("Call boxd_resume for work '{work}', then boxd_drop again."),
            ));
        }
    }
    require_proven(&w)?;
    // Intent before effect: from here a submit is refused (the laptop side), and a drop
    // killed anywhere below is finished by the next one.
    ledger.update(&work, |w| w.state = WorkState::Dropping)?;
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
        super::account::check_live(&w, &live, &discard)
    })();
    if let Err(e) = checked {
        // Refused: the work is open again (the guest restarts on its next command).
        ledger.update(&work, |w| {
            if w.state == WorkState::Dropping {
                w.state = WorkState::Open;
            }
        })?;
        return Err(e);
    }
    boxd.remove(&machine).map_err(Failure::into_error)?;
    let w = ledger.update(&work, |w| w.state = WorkState::Closed)?;
    let mut out = work_json(&w, "gone");
    out["dropped"] = json!(true);
    if let Some(g) = &w.git {
        out["patch"] = json!(g.patch);
        out["bundle"] = json!(g.bundle);
        out["head"] = json!(g.head);
    }
    out["discarded"] = json!(discard);
    out["next"] = json!("Done: the machine is destroyed and the work is closed in the ledger. Its commits are in the ledger's bundle (git fetch <bundle>), its uncommitted changes in the stored patch.");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{GitRecord, Proof};
    use crate::testing::{MemFiles, Scripted};
    use crate::tools::{call, RawContext};

    fn raw() -> RawContext {
        RawContext {
            host_name: "test".into(),
            host_version: "1".into(),
            options_json: "{}".into(),
            project: "/p".into(),
            ledger: "/l".into(),
            session_id: None,
            now_ms: 0,
            entropy: alloc::vec![1; 32],
            host_facts_json: "{}".into(),
        }
    }

    /// A proven work whose git record is as given.
    fn work_with(git: Option<GitRecord>) -> MemFiles {
        let mut fs = MemFiles::new(&["/p", "/l"]);
        let mut w = Work::new("w1", "/p", "t");
        w.state = WorkState::Open;
        w.machine_id = Some("vm_1".into());
        w.proofs.push(Proof { prompts: 0, ..Default::default() });
        w.git = git;
        Ledger::new(&mut fs, "/l").write(&w).unwrap();
        fs
    }

    const OURS: &str = r#"{"name":"oc-w1","id":"vm_1","status":"running","sharing":"private","isolated":"no"}"#;

    #[test]
    fn drop_checks_the_live_tree_and_refuses_a_change_the_patch_does_not_hold() {
        let mut fs = work_with(Some(GitRecord { dirty: false, ..Default::default() }));
        let mut p = Scripted::default();
        p.push_exit(0, OURS, "");
        p.push_exit(0, r#"{"ok":true,"repo":true,"refs":{},"dirty":true,"diffSha256":"abc","changed":["README.md"],"untracked":[],"ignored":[]}"#, "");
        let e = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap_err();
        assert_eq!(e.code, Code::Dirty);
        assert!(e.message.contains("README.md"), "{}", e.message);
        assert_eq!(p.commands().len(), 2, "get and the sealing exec; nothing removed: {:?}", p.commands());
        assert!(p.commands()[1].contains("seal"), "{:?}", p.commands());
    }

    #[test]
    fn drop_removes_only_the_machine_the_ledger_recorded() {
        let mut fs = work_with(Some(GitRecord::default()));
        let mut p = Scripted::default();
        p.push_exit(0, r#"{"name":"oc-w1","id":"vm_other","status":"running","sharing":"private","isolated":"no"}"#, "");
        let e = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap_err();
        assert_eq!(e.code, Code::NotOurs);
        assert_eq!(p.commands(), ["machine get oc-w1 --json"], "nothing was sealed or removed");
        p.requests.clear();
        p.push_exit(0, OURS, "");
        p.push_exit(0, r#"{"ok":true,"repo":true,"refs":{},"dirty":false,"untracked":[],"ignored":[]}"#, "");
        p.push_exit(0, r#"{"name":"oc-w1","status":"destroyed"}"#, "");
        let v = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap();
        assert_eq!(v["dropped"], true);
        assert_eq!(p.commands().len(), 3, "at most three boxd calls for a drop");
        assert_eq!(p.commands().last().unwrap(), "machine remove oc-w1 -y --json");
    }

    #[test]
    fn a_gone_work_closes_naming_what_was_not_recovered() {
        let mut fs = work_with(None);
        let mut w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        w.prompts.push(crate::ledger::Prompt { id: "p1".into(), admitted: true, ..Default::default() });
        Ledger::new(&mut fs, "/l").write(&w).unwrap();
        let mut p = Scripted::default();
        p.push_fail(1, "error: VM 'oc-w1' not found");
        let v = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap();
        assert_eq!(v["dropped"], true);
        assert_eq!(v["unrecovered"]["prompts"], json!(["p1"]));
        assert!(Ledger::new(&mut fs, "/l").require("w1").unwrap().is_closed());
    }

    #[test]
    fn every_tool_refuses_a_machine_with_another_id_before_touching_it() {
        for (tool, args) in [
            ("boxd_job", r#"{"work":"w1"}"#),
            ("boxd_submit", r#"{"work":"w1","prompt":"hi"}"#),
            ("boxd_harvest", r#"{"work":"w1"}"#),
            ("boxd_sleep", r#"{"work":"w1"}"#),
            ("boxd_resume", r#"{"work":"w1"}"#),
            ("boxd_drop", r#"{"work":"w1"}"#),
            ("boxd_ensure", r#"{"work":"w1"}"#),
        ] {
            let mut fs = work_with(Some(GitRecord::default()));
            let mut p = Scripted::default();
            p.push_exit(0, "0.0.0", "");
            p.push_exit(0, r#"{"name":"oc-w1","id":"vm_new","status":"running","sharing":"private","isolated":"no"}"#, "");
            let mut r = raw();
            r.host_facts_json = r#"{"opencodeVersion":"1.18.33"}"#.into();
            p.answers.pop_front();
            let e = call(&mut p, &mut fs, tool, args, r).unwrap_err();
            assert_eq!(e.code, Code::NotOurs, "{tool}: {e:?}");
            assert_eq!(p.commands(), ["machine get oc-w1 --json"], "{tool} made one read and nothing else");
        }
    }
}
