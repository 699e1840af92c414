//! boxd_image: save a work's machine as a new named snapshot, only once a harvest has
//! proven the transcript since the last prompt. The save is recorded before it runs, so a
//! save whose answer was lost is recognised by the next call.

use alloc::format;
use alloc::string::{String, ToString};
use serde_json::{json, Value};

use super::machine::{owned_state, work_json};
use super::{require_proven, work_arg, Env};
use crate::boxd::{version_number, Boxd, Capture, Failure, Made, State};
use crate::errors::{Code, ToolError, ToolResult};
use crate::ledger::{Ledger, Work, WorkState};
use crate::paths;

/// What an image will do, decided from reads only (the ledger, the snapshot list, one
/// `machine get`): every refusal comes from here, so `check` gives it before anyone is asked.
enum Plan {
    /// This work's own save whose answer was lost (recorded before it ran).
    AlreadyMade(Work),
    /// This work's own save whose answer was lost, and boxd's listing shows it is not a
    /// snapshot of this work's (held as `failed`, at a version after v1, or at none we can
    /// read): `run` clears the name from `imagesPending` and answers the error. Not a
    /// refusal in `check`, which changes nothing: the call must reach `run` to settle it.
    Settle(ToolError),
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
    // The one state read first (it carries the id: a machine not ours is refused untouched);
    // what its state means waits for the name's look, so a rerun of a save whose answer was
    // lost is answered as made whatever the machine does now. The name is looked at last,
    // just before the save (`run` writes only its intent in between): boxd has no save that
    // refuses an existing name, so the window in which someone else can take it is that.
    let state = owned_state(&mut boxd, &mut Ledger::for_call(&mut env.files, ctx), ctx, &w)?;
    if let Some(listed) = boxd.snapshots().map_err(Failure::into_error)?.into_iter().find(|s| s.name == name) {
        // A rerun of this work's own save (its answer lost) is answered as made once boxd
        // holds it ready; the same name asked for after a later prompt would be a new save,
        // which an existing snapshot cannot take (snapshots are immutable).
        let prompts = w.prompts.len() as u64;
        let made_at = w.images.iter().any(|n| n == name).then(|| w.images_at.get(name).copied());
        match made_at {
            _ if w.images_pending.iter().any(|n| n == name) => {
                return match listed.capture() {
                    // Only v1 is this work's own: a later version means more than one save
                    // went into the name (someone's made after our look, or after ours).
                    Capture::Ready => match version_number(&listed.version) {
                        Some(1) => Ok(Plan::AlreadyMade(w)),
                        v => Ok(Plan::Settle(not_ours(work, name, v.map_or(Made::Unknown { why: format!("boxd lists it at version {:?}", crate::redact::redact(&listed.version, 40)), retry: false }, Made::Shared)))),
                    },
                    Capture::Failed => Ok(Plan::Settle(ToolError::with_next(
                        Code::SnapshotExists,
                        format!("boxd holds a failed save under the name '{name}' (this work's own, whose answer was lost): no snapshot was made, and the name is no longer recorded as under way"),
                        "Call boxd_image again with another name: boxd still holds the failed save under this one.",
                    ))),
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
    match state {
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

/// A save of `work`'s that is not a snapshot of its own: `made` is not `v1`. boxd has no
/// command to delete one version of a snapshot (and the host grants this plugin no snapshot
/// removal), so the answer says exactly what was added where; nothing is recorded as made.
fn not_ours(work: &str, name: &str, made: Made) -> ToolError {
    let next = format!("Call boxd_image again for work '{work}' with another name.");
    let what = match made {
        Made::Later(n) => format!("a snapshot named '{name}' was made by someone else between this call's look at the name and its save, and boxd added this save as its version v{n}"),
        Made::Shared(n) => format!("boxd lists snapshot '{name}' at version v{n}: more than one save went into the name (someone else's made after this work's look), and which version is this work's boxd did not say"),
        Made::Unknown { why, .. } => {
            return ToolError::with_next(
                Code::BoxdFailed,
                format!("snapshot '{name}' was saved from work '{work}', but which version that save made is not known ({why}): a name someone made meanwhile would have been given a version, so it is not recorded as this work's, nor as under way"),
                next,
            );
        }
        Made::First => String::new(),
    };
    ToolError::with_next(
        Code::SnapshotExists,
        format!("{what}. Machines booted from '{name}' get its newest version, which may be this work's capture rather than theirs; boxd has no command to remove one version, so tell whoever made '{name}' (saving their machine under it again makes theirs the newest). '{name}' is not recorded as this work's"),
        next,
    )
}

/// SESSION_BUSY while a save of the work is recorded as under way (boxd_submit): a prompt
/// run now would change the machine under the capture, and the snapshot would hold a run
/// the laptop has not seen.
pub fn require_not_saving(w: &Work) -> ToolResult<()> {
    let Some(name) = w.images_pending.first() else { return Ok(()) };
    Err(ToolError::with_next(
        Code::SessionBusy,
        format!("work '{}': boxd_image is saving snapshot '{name}' of {} (or its save never answered); a prompt now would run under the capture, so nothing was sent", w.work, w.machine),
        format!("Call boxd_image for work '{}' with name '{name}' again (it answers made, still saving, or failed and cleared), then boxd_submit.", w.work),
    ))
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
        Plan::Settle(e) => {
            let n = name.clone();
            ledger.update(&work, |w| w.images_pending.retain(|p| p != &n))?;
            return Err(e);
        }
        Plan::Save(w) => w,
    };
    // The intent, checked against the record as it is now, not as `plan` read it: not
    // while a drop is under way (its machine may be removed under the capture), nor once a
    // prompt submitted since has made the work unproven (the capture would hold a run the
    // laptop has not seen). The prompt count is taken here: boxd_submit refuses while the
    // name is recorded as under way, so it is the count the snapshot holds.
    let (n, mut refused, mut at) = (name.clone(), None, 0);
    ledger.update(&work, |w| {
        refused = if w.state == WorkState::Dropping {
            Some(ToolError::with_next(
                Code::SessionBusy,
                format!("work '{work}' is being dropped; no snapshot was saved"),
                format!("Call boxd_status; if work '{work}' is still open, call boxd_image again."),
            ))
        } else {
            require_proven(w).err()
        };
        at = w.prompts.len() as u64;
        if refused.is_none() && !w.images_pending.contains(&n) {
            w.images_pending.push(n);
        }
    })?;
    if let Some(e) = refused {
        return Err(e);
    }
    let withdraw = |ledger: &mut Ledger<'_, _>| {
        let n = name.clone();
        ledger.update(&work, |w| w.images_pending.retain(|p| p != &n)).map(drop)
    };
    let answered = match boxd.snapshot_save(&machine, &name) {
        Ok(v) => v,
        Err(f) => {
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
    };
    match boxd.made(&name, answered) {
        Made::First => {}
        // A failed listing may tell later: the name stays under way, for boxd_image to settle.
        Made::Unknown { why, retry: true } => {
            return Err(ToolError::with_next(
                Code::BoxdFailed,
                format!("snapshot '{name}' was saved, but which version this save made is not known yet ({why}); it is not recorded as this work's, and stays recorded as under way"),
                format!("Call boxd_image again for work '{work}' with name '{name}' in a later turn: it is answered made only if boxd lists '{name}' at v1."),
            ));
        }
        made => {
            withdraw(&mut ledger)?;
            return Err(not_ours(&work, &name, made));
        }
    }
    let n = name.clone();
    ledger.update(&work, |w| {
        w.images_pending.retain(|p| p != &n);
        w.images_at.insert(n.clone(), at);
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
        p.push_exit(0, OURS, "");
        p.push_exit(0, "[]", "");
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
            p.push_exit(0, OURS, "");
            p.push_exit(0, "[]", "");
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
    /// CLI lists it, with no status) at v1: one still pending is SESSION_BUSY and stays
    /// recorded as under way; one boxd holds as failed is refused and its name cleared.
    #[test]
    fn a_lost_save_is_made_only_once_boxd_holds_it_ready() {
        for listed in [r#"[{"name":"img","version":"v1","status":"ready"}]"#, r#"[{"name":"img","version":"v1"}]"#] {
            let mut fs = pending_img();
            let mut p = Scripted::default();
            p.push_exit(0, OURS, "");
            p.push_exit(0, listed, "");
            let v = call(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")).unwrap();
            assert_eq!(v["alreadyMade"], true, "{listed}");
            let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
            assert!(w.images_pending.is_empty() && w.images == ["img"], "{w:?}");
        }

        let mut fs = pending_img();
        let mut p = Scripted::default();
        p.push_exit(0, OURS, "");
        p.push_exit(0, r#"[{"name":"img","version":"v1","status":"pending"}]"#, "");
        let e = call(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")).unwrap_err();
        assert!(e.code == Code::SessionBusy && e.message.contains("still saving") && e.next.contains("boxd_image again for work 'w1' with name 'img' in a minute"), "{e:?}");
        let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        assert!(w.images_pending == ["img"] && w.images.is_empty(), "{w:?}");
        assert_eq!(p.commands(), ["machine get oc-w1 --json", "snapshots list --json"], "nothing saved");

        let mut fs = pending_img();
        let mut p = Scripted::default();
        for _ in 0..2 {
            p.push_exit(0, OURS, "");
            p.push_exit(0, r#"[{"name":"img","version":"v1","status":"failed"}]"#, "");
        }
        assert_eq!(crate::tools::check(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")), Ok(()), "the call must reach run to clear the name");
        let e = call(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")).unwrap_err();
        assert!(e.code == Code::SnapshotExists && e.message.contains("failed save") && e.next.contains("another name"), "{e:?}");
        let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        assert!(w.images_pending.is_empty() && w.images.is_empty(), "{w:?}");

        let mut fs = pending_img();
        let mut p = Scripted::default();
        p.push_exit(0, OURS, "");
        p.push_exit(0, r#"[{"name":"img","status":"archiving-ish"}]"#, "");
        let e = call(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")).unwrap_err();
        assert_eq!(e.code, Code::BoxdFailed, "{e:?}");
        assert_eq!(Ledger::new(&mut fs, "/l").require("w1").unwrap().images_pending, ["img"]);
    }

    /// A lost save's rerun that finds the name at a later version than v1, or at none boxd
    /// names, cannot tell the snapshot is this work's: it is refused, not recorded as made,
    /// and no longer as under way (before: answered alreadyMade and recorded as this work's,
    /// though a save made after this work's look, or after its save, went into the name).
    #[test]
    fn a_lost_saves_rerun_is_made_only_at_v1() {
        for (listed, code) in [
            (r#"[{"name":"img","version":"v2","status":"ready"}]"#, Code::SnapshotExists),
            (r#"[{"name":"img","status":"ready"}]"#, Code::BoxdFailed),
            (r#"[{"name":"img"}]"#, Code::BoxdFailed),
        ] {
            let mut fs = pending_img();
            let mut p = Scripted::default();
            for _ in 0..2 {
                p.push_exit(0, OURS, "");
                p.push_exit(0, listed, "");
            }
            assert_eq!(crate::tools::check(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")), Ok(()), "the call must reach run to clear the name");
            let e = call(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")).unwrap_err();
            assert_eq!(e.code, code, "{listed}: {e:?}");
            assert!(e.message.contains("not recorded as this work's") && e.next.contains("another name"), "{e:?}");
            let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
            assert!(w.images_pending.is_empty() && w.images.is_empty(), "{listed}: {w:?}");
        }
    }

    /// The save's answer names the version it made. v1 is recorded; a later version means
    /// someone made the name between this call's looks and its save: SNAPSHOT_EXISTS naming
    /// the version added, nothing recorded as made or under way. With no version in the
    /// answer, one listing decides; a failed listing keeps the name under way (a rerun
    /// settles it). Before: every save that exited 0 was recorded as this work's.
    #[test]
    fn only_a_save_that_made_v1_is_recorded_as_this_works() {
        let save = |answer: &str, after: &[(i32, &str)]| {
            let mut fs = open_work(None);
            let mut p = Scripted::default();
            p.push_exit(0, OURS, "");
            p.push_exit(0, "[]", "");
            p.push_exit(0, answer, "");
            for (code, text) in after {
                if *code == 0 { p.push_exit(0, text, "") } else { p.push_fail(*code, text) }
            }
            let r = call(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}"));
            assert!(p.commands()[2] == "snapshots save oc-w1 img --json", "{:?}", p.commands());
            (r, Ledger::new(&mut fs, "/l").require("w1").unwrap())
        };
        let (r, w) = save(r#"{"name":"img","version":"v1","status":"ready"}"#, &[]);
        assert_eq!(r.unwrap()["snapshot"], "img");
        assert!(w.images == ["img"] && w.images_pending.is_empty(), "{w:?}");

        let (r, w) = save(r#"{"name":"img","version":"v2","status":"ready"}"#, &[]);
        let e = r.unwrap_err();
        assert!(e.code == Code::SnapshotExists && e.message.contains("version v2") && e.message.contains("someone else") && e.next.contains("another name"), "{e:?}");
        assert!(w.images.is_empty() && w.images_pending.is_empty(), "{w:?}");

        // Garbage or nothing for an answer: the listing after it decides.
        let (r, w) = save("upstream connect error", &[(0, r#"[{"name":"img","version":"v1","status":"ready"}]"#)]);
        assert!(r.is_ok() && w.images == ["img"], "{r:?}");
        let (r, w) = save("", &[(0, r#"[{"name":"img","version":"v3","status":"ready"}]"#)]);
        assert!(r.unwrap_err().code == Code::SnapshotExists && w.images.is_empty() && w.images_pending.is_empty());
        let (r, w) = save("", &[(0, r#"[{"name":"img","status":"ready"}]"#)]);
        assert!(r.unwrap_err().code == Code::BoxdFailed && w.images.is_empty() && w.images_pending.is_empty());
        let (r, w) = save("", &[(1, "error: cannot connect to https://boxd.sh:9443: dns error")]);
        let e = r.unwrap_err();
        assert!(e.code == Code::BoxdFailed && e.next.contains("boxd_image again for work 'w1' with name 'img'"), "{e:?}");
        assert!(w.images.is_empty() && w.images_pending == ["img"], "{w:?}");
    }

    /// The name is the last thing looked at before the save (after the machine's state
    /// read; only the intent is written in between), so the window in which someone else
    /// can take it is as short as the calls allow, in three round trips; a name taken by
    /// then is refused with nothing saved and nothing left under way.
    #[test]
    fn the_names_look_is_the_last_call_before_the_save() {
        let mut fs = open_work(None);
        let mut p = Scripted::default();
        p.push_exit(0, OURS, "");
        p.push_exit(0, "[]", "");
        p.push_exit(0, r#"{"name":"img","version":"v1","status":"ready"}"#, "");
        call(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")).unwrap();
        assert_eq!(p.commands(), ["machine get oc-w1 --json", "snapshots list --json", "snapshots save oc-w1 img --json"]);
        for second in [Ok(r#"[{"name":"img","version":"v1","status":"ready"}]"#), Err("error: cannot connect to https://boxd.sh:9443: dns error")] {
            let mut fs = open_work(None);
            let mut p = Scripted::default();
            p.push_exit(0, OURS, "");
            match second {
                Ok(l) => p.push_exit(0, l, ""),
                Err(m) => p.push_fail(1, m),
            }
            let e = call(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")).unwrap_err();
            assert_eq!(e.code, if second.is_ok() { Code::SnapshotExists } else { Code::BoxdFailed }, "{e:?}");
            assert!(!p.commands().iter().any(|c| c.starts_with("snapshots save")), "{:?}", p.commands());
            assert!(Ledger::new(&mut fs, "/l").require("w1").unwrap().images_pending.is_empty());
        }
    }

    /// The intent is checked against the record as it is when it is written: a prompt
    /// recorded after the plan read the record (a boxd_submit in between) makes the work
    /// unproven, and nothing is saved. Before: the save ran, and imagesAt counted the
    /// prompt the snapshot may not hold.
    #[test]
    fn a_prompt_recorded_after_the_plan_stops_the_save() {
        use crate::testing::Shared;
        /// Scripted boxd; a boxd_submit records its prompt while boxd answers the plan's
        /// `machine get`.
        struct SubmitDuringTheGet(Scripted, alloc::rc::Rc<core::cell::RefCell<crate::testing::MemFiles>>);
        impl crate::caps::Programs for SubmitDuringTheGet {
            fn run(&mut self, r: &crate::caps::RunRequest) -> Result<crate::caps::RunOutput, crate::caps::SpawnError> {
                if r.args.iter().take(2).map(String::as_str).eq(["machine", "get"]) {
                    let late = crate::ledger::Prompt { id: "p-late".into(), ..Default::default() };
                    Ledger::new(&mut *self.1.borrow_mut(), "/l").update("w1", |w| w.prompts.push(late)).unwrap();
                }
                self.0.run(r)
            }
        }
        let shared = alloc::rc::Rc::new(core::cell::RefCell::new(open_work(None)));
        let mut p = SubmitDuringTheGet(Scripted::default(), shared.clone());
        p.0.push_exit(0, OURS, "");
        p.0.push_exit(0, "[]", "");
        let e = call(&mut p, &mut Shared(shared.clone()), "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")).unwrap_err();
        assert_eq!(e.code, Code::NotProven, "{e:?}");
        assert_eq!(p.0.commands(), ["machine get oc-w1 --json", "snapshots list --json"], "nothing saved");
        let w = Ledger::new(&mut *shared.borrow_mut(), "/l").require("w1").unwrap();
        assert!(w.images_pending.is_empty() && w.images.is_empty(), "{w:?}");
    }

    /// A save is not started on a work a drop has marked: its remove would abort the capture.
    #[test]
    fn no_save_starts_while_the_work_is_being_dropped() {
        let mut fs = open_work(None);
        let mut w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        w.state = crate::ledger::WorkState::Dropping;
        Ledger::new(&mut fs, "/l").write(&w).unwrap();
        let mut p = Scripted::default();
        p.push_exit(0, OURS, "");
        p.push_exit(0, "[]", "");
        let e = call(&mut p, &mut fs, "boxd_image", r#"{"work":"w1","name":"img"}"#, raw_context("{}", "{}")).unwrap_err();
        assert_eq!(e.code, Code::SessionBusy, "{e:?}");
        assert!(!p.commands().iter().any(|c| c.starts_with("snapshots save")), "{:?}", p.commands());
        assert!(Ledger::new(&mut fs, "/l").require("w1").unwrap().images_pending.is_empty());
    }
}
