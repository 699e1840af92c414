//! boxd_image: save a work's machine as a new named snapshot, only once a harvest has
//! proven the transcript since the last prompt. The save is recorded before it runs, so a
//! save whose answer was lost is recognised by the next call.

use alloc::format;
use alloc::string::ToString;
use serde_json::{json, Value};

use super::machine::{owned_state, work_json};
use super::{require_proven, work_arg, Env};
use crate::boxd::{Boxd, Capture, Failure, State};
use crate::errors::{Code, ToolError, ToolResult};
use crate::ledger::{Ledger, Work, WorkState};
use crate::paths;

/// What an image will do, decided from reads only (the ledger, the snapshot list, one
/// `machine get`): every refusal comes from here, so `check` gives it before anyone is asked.
enum Plan {
    /// This work's own save whose answer was lost (recorded before it ran).
    AlreadyMade(Work),
    /// This work's own save whose answer was lost, and boxd holds it as `failed`: `run`
    /// clears the name from `imagesPending` and refuses. Not a refusal in `check`, which
    /// changes nothing: the call must reach `run` to settle the name.
    Failed,
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
    if let Some(listed) = boxd.snapshots().map_err(Failure::into_error)?.into_iter().find(|s| s.name == name) {
        // A rerun of this work's own save (its answer lost) is answered as made once boxd
        // holds it ready; the same name asked for after a later prompt would be a new save,
        // which an existing snapshot cannot take (snapshots are immutable).
        let prompts = w.prompts.len() as u64;
        let made_at = w.images.iter().any(|n| n == name).then(|| w.images_at.get(name).copied());
        match made_at {
            _ if w.images_pending.iter().any(|n| n == name) => {
                return match listed.capture() {
                    Capture::Ready => Ok(Plan::AlreadyMade(w)),
                    Capture::Failed => Ok(Plan::Failed),
                    Capture::Unknown => Err(listed.unknown_status()),
                    // The CLI blocks until the capture lands, so a save whose answer was
                    // lost (a timeout) may still be landing.
                    Capture::Pending => Err(ToolError::with_next(
                        Code::SessionBusy,
                        format!("work '{work}': boxd is still saving snapshot '{name}' (its status is pending); the save stays recorded as under way"),
                        format!("Call boxd_image again for work '{work}' with name '{name}' in a minute: it answers the snapshot as made once boxd holds it ready."),
                    )),
                };
            }
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
    match owned_state(&mut boxd, &mut Ledger::for_call(&mut env.files, ctx), ctx, &w)? {
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

/// The refusals an image gives before it records the save (see `plan`; a failed save of
/// this work's own is refused by `run`, which clears its name).
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
        Plan::Failed => {
            let n = name.clone();
            ledger.update(&work, |w| w.images_pending.retain(|p| p != &n))?;
            return Err(ToolError::with_next(
                Code::SnapshotExists,
                format!("boxd holds a failed save under the name '{name}' (this work's own, whose answer was lost): no snapshot was made, and the name is no longer recorded as under way"),
                "Call boxd_image again with another name: boxd still holds the failed save under this one.",
            ));
        }
        Plan::Save(w) => w,
    };
    // Not while a drop is under way: its machine may be removed under the capture.
    let (n, mut dropping) = (name.clone(), false);
    ledger.update(&work, |w| {
        dropping = w.state == WorkState::Dropping;
        if !dropping && !w.images_pending.contains(&n) {
            w.images_pending.push(n);
        }
    })?;
    if dropping {
        return Err(ToolError::with_next(
            Code::SessionBusy,
            format!("work '{work}' is being dropped; no snapshot was saved"),
            format!("Call boxd_status; if work '{work}' is still open, call boxd_image again."),
        ));
    }
    if let Err(f) = boxd.snapshot_save(&machine, &name) {
        // A refusal, unlike a timeout or a lost connection (a save that may still land),
        // started nothing once boxd lists no snapshot by the name: it is no longer recorded
        // as under way, or every drop would wait on a save that never began. One listing,
        // on this failure path only.
        let refused = !matches!(f, Failure::Timeout(_) | Failure::Unreachable(_));
        let mut e = crate::guest::failed_on(&mut boxd, &machine, &work, f);
        if refused && boxd.snapshots().is_ok_and(|list| !list.iter().any(|s| s.name == name)) {
            let n = name.clone();
            if ledger.update(&work, |w| w.images_pending.retain(|p| p != &n)).is_ok() {
                e.message = format!("{}; boxd lists no snapshot '{name}', so no save of it is recorded as under way", e.message);
            }
        }
        return Err(e);
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
    /// boxd_sleep) is MACHINE_ASLEEP; the rerun after boxd_resume saves anew.
    #[test]
    fn a_save_the_machine_fell_asleep_under_is_machine_asleep() {
        let mut fs = open_work(None);
        let mut p = Scripted::default();
        p.push_exit(0, "[]", "");
        p.push_exit(0, OURS, "");
        p.push_fail(1, "error: VM 'oc-w1' is hibernated — run 'boxd machine wake oc-w1' first");
        p.push_exit(0, &OURS.replace("running", "hibernated"), "");
        p.push_exit(0, "[]", "");
        let e = call(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")).unwrap_err();
        assert!(e.code == Code::MachineAsleep && e.message.contains("is hibernated") && e.next.contains("boxd_resume for work 'w1'"), "{e:?}");
        assert!(Ledger::new(&mut fs, "/l").require("w1").unwrap().images_pending.is_empty());
    }

    /// A save boxd refused outright started nothing: once the listing shows no such name,
    /// it is not left under way (before, every drop then answered SESSION_BUSY "never
    /// answered"). A name boxd lists after the refusal, or a timeout, stays recorded.
    #[test]
    fn a_refused_save_boxd_lists_nothing_of_is_not_left_under_way() {
        let refusal = "error: snapshot quota exceeded for this organisation";
        for (fail, listed, pending) in [
            ((1, refusal), Some("[]"), false),
            ((1, refusal), Some(r#"[{"name":"img","status":"pending"}]"#), true),
            ((1, refusal), None, true),
            ((124, "timed out waiting for boxd.sh"), None, true),
        ] {
            let mut fs = open_work(None);
            let mut p = Scripted::default();
            p.push_exit(0, "[]", "");
            p.push_exit(0, OURS, "");
            p.push_fail(fail.0, fail.1);
            p.push_exit(0, OURS, "");
            match listed {
                Some(l) => p.push_exit(0, l, ""),
                None if fail.0 == 1 => p.push_fail(1, "error: cannot connect to https://boxd.sh:9443: dns error"),
                None => {}
            }
            let e = call(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")).unwrap_err();
            assert!(e.message.contains(fail.1), "{e:?}");
            assert_eq!(e.code, if fail.0 == 1 { Code::BoxdFailed } else { Code::Timeout });
            let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
            assert_eq!(w.images_pending.is_empty(), !pending, "{fail:?} {listed:?}");
            assert_eq!(e.message.contains("no save of it is recorded as under way"), !pending, "{e:?}");
        }
    }

    /// open_work with a save of "img" recorded as under way (its answer lost).
    fn pending_img() -> crate::testing::MemFiles {
        let mut fs = open_work(None);
        let mut w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        w.images_pending.push("img".into());
        Ledger::new(&mut fs, "/l").write(&w).unwrap();
        fs
    }

    /// A lost save's rerun is made only when boxd holds the snapshot ready (or, as an older
    /// CLI lists it, with no status): one still pending is SESSION_BUSY and stays recorded
    /// as under way; one boxd holds as failed is refused and its name cleared.
    #[test]
    fn a_lost_save_is_made_only_once_boxd_holds_it_ready() {
        for listed in [r#"[{"name":"img","version":"v1","status":"ready"}]"#, r#"[{"name":"img"}]"#] {
            let mut fs = pending_img();
            let mut p = Scripted::default();
            p.push_exit(0, listed, "");
            let v = call(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")).unwrap();
            assert_eq!(v["alreadyMade"], true, "{listed}");
            let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
            assert!(w.images_pending.is_empty() && w.images == ["img"], "{w:?}");
        }

        let mut fs = pending_img();
        let mut p = Scripted::default();
        p.push_exit(0, r#"[{"name":"img","version":"v1","status":"pending"}]"#, "");
        let e = call(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")).unwrap_err();
        assert!(e.code == Code::SessionBusy && e.message.contains("still saving") && e.next.contains("boxd_image again for work 'w1' with name 'img' in a minute"), "{e:?}");
        let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        assert!(w.images_pending == ["img"] && w.images.is_empty(), "{w:?}");
        assert_eq!(p.commands(), ["snapshots list --json"], "nothing saved");

        let mut fs = pending_img();
        let mut p = Scripted::default();
        p.push_exit(0, r#"[{"name":"img","version":"v1","status":"failed"}]"#, "");
        p.push_exit(0, r#"[{"name":"img","version":"v1","status":"failed"}]"#, "");
        assert_eq!(crate::tools::check(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")), Ok(()), "the call must reach run to clear the name");
        let e = call(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")).unwrap_err();
        assert!(e.code == Code::SnapshotExists && e.message.contains("failed save") && e.next.contains("another name"), "{e:?}");
        let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        assert!(w.images_pending.is_empty() && w.images.is_empty(), "{w:?}");

        let mut fs = pending_img();
        let mut p = Scripted::default();
        p.push_exit(0, r#"[{"name":"img","status":"archiving-ish"}]"#, "");
        let e = call(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")).unwrap_err();
        assert_eq!(e.code, Code::BoxdFailed, "{e:?}");
        assert_eq!(Ledger::new(&mut fs, "/l").require("w1").unwrap().images_pending, ["img"]);
    }

    /// A save is not started on a work a drop has marked: its remove would abort the capture.
    #[test]
    fn no_save_starts_while_the_work_is_being_dropped() {
        let mut fs = open_work(None);
        let mut w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        w.state = crate::ledger::WorkState::Dropping;
        Ledger::new(&mut fs, "/l").write(&w).unwrap();
        let mut p = Scripted::default();
        p.push_exit(0, "[]", "");
        p.push_exit(0, OURS, "");
        let e = call(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")).unwrap_err();
        assert_eq!(e.code, Code::SessionBusy, "{e:?}");
        assert!(!p.commands().iter().any(|c| c.starts_with("snapshots save")), "{:?}", p.commands());
        assert!(Ledger::new(&mut fs, "/l").require("w1").unwrap().images_pending.is_empty());
    }
}
