//! The lifecycle of a work's machine: ensure (create or adopt), sleep, resume, image and
//! drop. Every create is recorded in the ledger before it runs, and drop destroys
//! nothing the laptop cannot account for.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::{json, Value};

use super::{listed_state, work_arg, Env};
use crate::boxd::{Boxd, Failure, MachineInfo, State};
use crate::caps::{Files, Programs};
use crate::errors::{Code, ToolError, ToolResult};
use crate::ledger::{Ledger, Sleep, Work};
use crate::paths;

fn idle_seconds<P: Programs, F: Files>(env: &Env<P, F>) -> u32 {
    env.ctx.options.idle_minutes * 60
}

/// Refuse a machine we must not drive: shared, isolated, or not the one we created.
fn check_machine(w: &Work, info: &MachineInfo) -> ToolResult<()> {
    if let Some(id) = &w.machine_id {
        if !info.id.is_empty() && &info.id != id {
            return Err(ToolError::new(
                Code::NotOurs,
                format!("machine {} has id {}, but the ledger recorded {} for work '{}'", info.name, info.id, id, w.work),
            ));
        }
    }
    if info.sharing == "shared" {
        return Err(ToolError::new(Code::MachineShared, format!("machine {} is shared with the organisation", info.name)));
    }
    if info.isolated {
        return Err(ToolError::new(Code::MachineIsolated, format!("machine {} was created with --isolated", info.name)));
    }
    Ok(())
}

/// The laptop's OpenCode version: what the host told us, else `opencode --version`.
pub fn laptop_opencode<P: Programs, F: Files>(env: &mut Env<P, F>) -> Option<String> {
    if let Some(v) = &env.ctx.facts.opencode_version {
        return Some(v.clone());
    }
    if env.ctx.host_name == "opencode" {
        return Some(env.ctx.host_version.clone());
    }
    let req = crate::caps::RunRequest { program: "opencode".into(), args: alloc::vec!["--version".into()], timeout_ms: 60_000, ..Default::default() };
    let out = env.programs.run(&req).ok().filter(|o| o.exit_code == Some(0))?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!v.is_empty()).then_some(v)
}

/// Make the guest side ready: the helper in place, the work tree, the OpenCode server
/// (same version as the laptop's) with the work's password, and the pump. One exec
/// (two the first time, when the helper is uploaded).
fn prepare_guest<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, w: &mut Work, entropy: &[u8], version: Option<&str>) -> ToolResult<Value> {
    let password = match ledger.password(&w.work)? {
        Some(p) if !p.is_empty() => p,
        _ => {
            if entropy.len() < 16 {
                return Err(ToolError::new(Code::StatusUnavailable, "the host gave no random bytes for the server password"));
            }
            let p = crate::encode::hex(entropy);
            ledger.put_blob(&w.work, "password", p.as_bytes())?;
            p
        }
    };
    let mut flags: Vec<&str> = Vec::new();
    if let Some(v) = version {
        flags.extend(["--opencode-version", v]);
    }
    let mut stdin = password.into_bytes();
    stdin.push(b'\n');
    let answer = crate::guest::Guest::new(boxd, &w.machine, &w.work).call("prepare", &flags, Some(stdin))?;
    w.helper_sha256 = Some(crate::encode::sha256_hex(crate::guest::HELPER));
    Ok(answer)
}

fn work_json(w: &Work, state: &str) -> Value {
    json!({ "work": w.work, "machine": w.machine, "machineId": w.machine_id, "directory": w.directory, "state": state })
}

pub fn ensure<P: Programs, F: Files>(env: &mut Env<P, F>, args: &Value) -> ToolResult<Value> {
    let (work, machine) = work_arg(args)?;
    let ctx = env.ctx;
    let now = env.now();
    let mut roots: Vec<&str> = alloc::vec![ctx.project.as_str()];
    roots.extend(ctx.options.allowed_roots.iter().map(String::as_str));
    let directory = match args.get("directory").and_then(Value::as_str) {
        Some(d) => paths::laptop_path(d, &ctx.project, &roots)?,
        None => ctx.project.clone(),
    };
    let idle = idle_seconds(env);
    let snapshot = ctx.options.snapshot.clone();
    let version = laptop_opencode(env);
    let mut ledger = Ledger::new(env.files, &ctx.ledger);
    let mut record = ledger.read(&work)?;
    if let Some(w) = &record {
        if w.is_closed() {
            // A dropped work's id may be used again; keep the old record beside the new one.
            let old = serde_json::to_vec_pretty(w).expect("serialises");
            ledger.put_blob(&work, &format!("closed-{}.json", w.created_at.replace(':', "-")), &old)?;
            record = None;
        }
    }
    let mut boxd = Boxd::new(env.programs, ctx.options.boxd_timeout_seconds);
    let state = listed_state(&mut boxd, &machine)?;

    if state != State::Gone {
        let Some(mut w) = record else {
            return Err(ToolError::with_next(
                Code::NotOurs,
                format!("a machine named {machine} exists, but this laptop's ledger did not create it"),
                format!("Pick another work id, or remove {machine} yourself if it is yours ('boxd machine remove {machine} -y')."),
            ));
        };
        let info = boxd.get(&machine).map_err(Failure::into_error)?.ok_or_else(|| {
            ToolError::new(Code::MachineGone, format!("{machine} vanished while it was being checked"))
        })?;
        check_machine(&w, &info)?;
        let adopted = w.machine_id.is_none() || w.state == "creating";
        if w.machine_id.is_none() && !info.id.is_empty() {
            w.machine_id = Some(info.id.clone());
        }
        let st = State::from_status(&info.status);
        if st == State::Starting {
            ledger.write(&w)?;
            return Err(ToolError::new(Code::MachineStarting, format!("{machine} is still starting")));
        }
        w.state = "open".into();
        ledger.write(&w)?;
        let guest = if matches!(st, State::Running | State::Standby) {
            let g = prepare_guest(&mut boxd, &mut ledger, &mut w, &ctx.entropy, version.as_deref())?;
            ledger.write(&w)?;
            g
        } else {
            Value::Null
        };
        let word = super::status::job_state(st);
        let mut out = work_json(&w, word);
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
        if w.state == "open" && w.machine_id.is_some() {
            return Err(ToolError::new(Code::MachineGone, format!("{machine}, recorded for work '{work}', no longer exists")));
        }
    }
    let snapshots = boxd.snapshots().map_err(Failure::into_error)?;
    if !snapshots.iter().any(|s| s.name == snapshot) {
        return Err(ToolError::new(Code::SnapshotMissing, format!("the golden snapshot '{snapshot}' does not exist, so no machine was created")));
    }
    // Recorded before the create runs: a create that lands after boxd stops answering is
    // then adopted by the next ensure instead of becoming a second machine.
    let mut w = record.unwrap_or_else(|| Work::new(&work, &directory, &now));
    w.state = "creating".into();
    w.directory = directory;
    ledger.write(&w)?;
    match boxd.create(&machine, &snapshot, idle) {
        Ok(created) => {
            w.machine_id = created.id;
            if created.boot_timeout {
                ledger.write(&w)?;
                return Err(ToolError::new(Code::CreateUncertain, format!("boxd created {machine} but its boot timed out; it may still come up")));
            }
            w.state = "open".into();
            ledger.write(&w)?;
            let guest = prepare_guest(&mut boxd, &mut ledger, &mut w, &ctx.entropy, version.as_deref())?;
            ledger.write(&w)?;
            let mut out = work_json(&w, "running");
            out["guest"] = guest;
            out["adopted"] = json!(false);
            out["created"] = json!(true);
            out["next"] = json!(format!("Call boxd_submit for work '{work}' with the task."));
            Ok(out)
        }
        Err(Failure::Timeout(m)) => Err(ToolError::new(Code::CreateUncertain, format!("boxd machine new did not answer ({m}); the machine may still appear"))),
        Err(Failure::Other(m)) if m.contains("already exists") => {
            Err(ToolError::new(Code::CreateUncertain, format!("boxd says {machine} already exists but does not list it yet")))
        }
        Err(e) => Err(e.into_error()),
    }
}

pub fn sleep<P: Programs, F: Files>(env: &mut Env<P, F>, args: &Value) -> ToolResult<Value> {
    let (work, machine) = work_arg(args)?;
    let now = env.now();
    let ctx = env.ctx;
    let mut ledger = Ledger::new(env.files, &ctx.ledger);
    let mut w = ledger.require(&work)?;
    let mut boxd = Boxd::new(env.programs, ctx.options.boxd_timeout_seconds);
    let state = listed_state(&mut boxd, &machine)?;
    let already = match state {
        State::Asleep => true,
        State::Gone => return Err(ToolError::new(Code::MachineGone, format!("{machine} no longer exists"))),
        State::Starting => return Err(ToolError::new(Code::MachineStarting, format!("{machine} is still starting"))),
        _ => {
            boxd.hibernate(&machine).map_err(Failure::into_error)?;
            false
        }
    };
    let mut warning = None;
    if !w.prompts.is_empty() && !w.proven() {
        let text = format!("slept at {now} before the newest prompt was harvested: the transcript on this laptop is behind the machine");
        w.warnings.push(text.clone());
        warning = Some(text);
    }
    if !already {
        w.sleeps.push(Sleep { by: "boxd_sleep".into(), at: now.clone() });
        w.asleep_by_tool = true;
    }
    ledger.write(&w)?;
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

pub fn resume<P: Programs, F: Files>(env: &mut Env<P, F>, args: &Value) -> ToolResult<Value> {
    let (work, machine) = work_arg(args)?;
    let idle = idle_seconds(env);
    let version = laptop_opencode(env);
    let ctx = env.ctx;
    let mut ledger = Ledger::new(env.files, &ctx.ledger);
    let mut w = ledger.require(&work)?;
    if w.is_closed() {
        return Err(ToolError::with_next(Code::MachineGone, format!("work '{work}' was dropped"), format!("Call boxd_ensure for work '{work}' to start it again.")));
    }
    let mut boxd = Boxd::new(env.programs, ctx.options.boxd_timeout_seconds);
    let state = listed_state(&mut boxd, &machine)?;
    let action = match state {
        State::Asleep => {
            boxd.wake(&machine).map_err(Failure::into_error)?;
            "woken"
        }
        State::Standby => {
            boxd.resume(&machine).map_err(Failure::into_error)?;
            "resumed"
        }
        State::Stopped | State::Failed => {
            boxd.start(&machine).map_err(Failure::into_error)?;
            "started"
        }
        State::Running => "already running",
        State::Starting => return Err(ToolError::new(Code::MachineStarting, format!("{machine} is still starting"))),
        State::Gone => {
            let snapshot = ctx.options.snapshot.clone();
            let snapshots = boxd.snapshots().map_err(Failure::into_error)?;
            if !snapshots.iter().any(|s| s.name == snapshot) {
                return Err(ToolError::new(Code::SnapshotMissing, format!("{machine} is gone and the golden snapshot '{snapshot}' does not exist to rebuild it")));
            }
            w.state = "creating".into();
            w.machine_id = None;
            ledger.write(&w)?;
            let created = match boxd.create(&machine, &snapshot, idle) {
                Ok(c) => c,
                Err(Failure::Timeout(m)) => return Err(ToolError::new(Code::CreateUncertain, format!("rebuilding {machine}: {m}"))),
                Err(e) => return Err(e.into_error()),
            };
            w.machine_id = created.id;
            if created.boot_timeout {
                ledger.write(&w)?;
                return Err(ToolError::new(Code::CreateUncertain, format!("boxd rebuilt {machine} but its boot timed out")));
            }
            w.state = "open".into();
            w.helper_sha256 = None;
            "rebuilt"
        }
    };
    if action != "rebuilt" && action != "already running" {
        // Waking restores boxd's default bound on some paths; ours is what limits billing.
        boxd.set_idle(&machine, idle).map_err(Failure::into_error)?;
    }
    w.asleep_by_tool = false;
    ledger.write(&w)?;
    prepare_guest(&mut boxd, &mut ledger, &mut w, &ctx.entropy, version.as_deref())?;
    let mut restored = 0;
    if action == "rebuilt" {
        restored = restore_transcript(&mut boxd, &mut ledger, &w)?;
    }
    ledger.write(&w)?;
    // A server that died mid-run is reported once, here or by boxd_job.
    if action != "rebuilt" {
        crate::guest::Guest::new(&mut boxd, &machine, &work).call("status", &[], None)?;
    }
    let mut out = work_json(&w, "running");
    out["action"] = json!(action);
    out["restoredSessions"] = json!(restored);
    out["next"] = json!(format!("Call boxd_job for work '{work}'."));
    Ok(out)
}

pub fn image<P: Programs, F: Files>(env: &mut Env<P, F>, args: &Value) -> ToolResult<Value> {
    let (work, machine) = work_arg(args)?;
    let name = args.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
    if !paths::is_snapshot_name(&name) {
        return Err(ToolError::new(Code::NameInvalid, format!("snapshot name '{name}' must be lowercase [a-z0-9-] starting with a letter")));
    }
    let ctx = env.ctx;
    let mut ledger = Ledger::new(env.files, &ctx.ledger);
    let w = ledger.require(&work)?;
    require_proven(&w)?;
    let mut boxd = Boxd::new(env.programs, ctx.options.boxd_timeout_seconds);
    if boxd.snapshots().map_err(Failure::into_error)?.iter().any(|s| s.name == name) {
        return Err(ToolError::new(Code::SnapshotExists, format!("a snapshot named '{name}' already exists")));
    }
    let state = listed_state(&mut boxd, &machine)?;
    match state {
        State::Running => {}
        State::Gone => return Err(ToolError::new(Code::MachineGone, format!("{machine} no longer exists"))),
        State::Starting => return Err(ToolError::new(Code::MachineStarting, format!("{machine} is still starting"))),
        _ => {
            return Err(ToolError::with_next(
                Code::BoxdFailed,
                format!("{machine} is {}; boxd snapshots only a running machine", super::status::job_state(state)),
                format!("Call boxd_resume for work '{work}', then boxd_image again."),
            ));
        }
    }
    boxd.snapshot_save(&machine, &name).map_err(Failure::into_error)?;
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

pub fn drop<P: Programs, F: Files>(env: &mut Env<P, F>, args: &Value) -> ToolResult<Value> {
    let (work, machine) = work_arg(args)?;
    let ctx = env.ctx;
    let mut ledger = Ledger::new(env.files, &ctx.ledger);
    let mut w = ledger.require(&work)?;
    if w.is_closed() {
        let mut out = work_json(&w, "gone");
        out["dropped"] = json!(false);
        out["next"] = json!("Nothing to do: this work was already dropped.");
        return Ok(out);
    }
    require_proven(&w)?;
    let git = w.git.clone().ok_or_else(|| {
        ToolError::new(Code::GitUnknown, format!("work '{work}': the last harvest found no git repository in the work tree"))
    })?;
    if git.prompts < w.prompts.len() as u64 {
        return Err(ToolError::with_next(Code::NotProven, format!("work '{work}': the git record predates the newest prompt"), format!("Call boxd_harvest for work '{work}' first.")));
    }
    let unrecovered: Vec<&str> = git
        .untracked
        .iter()
        .chain(git.ignored.iter())
        .filter(|e| !w.files_out.iter().any(|f| f.guest == e.path && f.sha256 == e.sha256))
        .map(|e| e.path.as_str())
        .collect();
    if !unrecovered.is_empty() {
        return Err(ToolError::new(
            Code::Untracked,
            format!("work '{work}' has paths no harvest brought back: {}", unrecovered.join(", ")),
        ));
    }
    if git.dirty && git.patch.is_none() {
        return Err(ToolError::new(Code::Dirty, format!("work '{work}' has uncommitted changes and no stored patch")));
    }
    let mut boxd = Boxd::new(env.programs, ctx.options.boxd_timeout_seconds);
    match boxd.get(&machine).map_err(Failure::into_error)? {
        None => {}
        Some(info) => {
            match &w.machine_id {
                Some(id) if &info.id == id => {}
                _ => {
                    return Err(ToolError::new(
                        Code::NotOurs,
                        format!("{machine} has id {}, which is not the machine the ledger recorded for work '{work}'", info.id),
                    ));
                }
            }
            boxd.remove(&machine).map_err(Failure::into_error)?;
        }
    }
    w.state = "closed".into();
    ledger.write(&w)?;
    let mut out = work_json(&w, "gone");
    out["dropped"] = json!(true);
    out["patch"] = json!(git.patch);
    out["next"] = json!("Done: the machine is destroyed and the work is closed in the ledger.");
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
        w.state = "open".into();
        w.machine_id = Some("vm_1".into());
        w.proofs.push(Proof { prompts: 0, ..Default::default() });
        w.git = git;
        Ledger::new(&mut fs, "/l").write(&w).unwrap();
        fs
    }

    #[test]
    fn drop_refuses_a_dirty_tree_without_a_stored_patch_before_any_boxd_call() {
        let mut fs = work_with(Some(GitRecord { dirty: true, patch: None, ..Default::default() }));
        let mut p = Scripted::default();
        let e = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap_err();
        assert_eq!(e.code, Code::Dirty);
        assert!(p.requests.is_empty());
    }

    #[test]
    fn drop_removes_only_the_machine_the_ledger_recorded() {
        let mut fs = work_with(Some(GitRecord::default()));
        let mut p = Scripted::default();
        p.push_exit(0, r#"{"name":"oc-w1","id":"vm_other","status":"running","sharing":"private","isolated":"no"}"#, "");
        let e = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap_err();
        assert_eq!(e.code, Code::NotOurs);
        assert_eq!(p.commands(), ["machine get oc-w1 --json"], "nothing was removed");
        p.push_exit(0, r#"{"name":"oc-w1","id":"vm_1","status":"running","sharing":"private","isolated":"no"}"#, "");
        p.push_exit(0, r#"{"name":"oc-w1","status":"destroyed"}"#, "");
        let v = call(&mut p, &mut fs, "boxd_drop", r#"{"work":"w1"}"#, raw()).unwrap();
        assert_eq!(v["dropped"], true);
        assert_eq!(p.commands().last().unwrap(), "machine remove oc-w1 -y --json");
    }
}
