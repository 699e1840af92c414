//! A work's machine, seen from the tools: checked to be the one the ledger created before
//! anything touches it, created in one place (a new work's, or a gone one rebuilt), and
//! its guest prepared. Every create is recorded in the ledger before it runs.

use alloc::format;
use alloc::string::ToString;
use alloc::vec::Vec;
use serde_json::{json, Value};

use crate::boxd::{Boxd, Capture, Failure, MachineInfo, State};
use crate::caps::{Files, Programs};
use crate::errors::{Code, ToolError, ToolResult};
use crate::ledger::{iso8601, Ledger, Work, WorkState};
use crate::options::Context;
use crate::paths;

/// Refuse a machine we must not drive: not the one the ledger created, shared, isolated.
pub fn check_machine(w: &Work, info: &MachineInfo) -> ToolResult<()> {
    match &w.machine_id {
        Some(id) if &info.id == id => {}
        Some(id) => {
            return Err(ToolError::with_next(
                Code::NotOurs,
                format!("{} has id {}, but the ledger recorded {id} for work '{}': it is another machine under the same name", info.name, if info.id.is_empty() { "(none given)".into() } else { crate::redact::cut(&info.id, 400) }, w.work),
                format!("Leave that machine alone: this work's own machine is gone, and no tool acts on another's. What work '{}' harvested is on this laptop; start again under another work id (boxd_ensure).", w.work),
            ));
        }
        None if w.state == WorkState::Creating => {
            return Err(ToolError::with_next(
                Code::NotOurs,
                format!("{} exists, but the ledger has no machine id for work '{}' (its create never answered)", info.name, w.work),
                format!("Call boxd_ensure for work '{}': it adopts the machine its own create made.", w.work),
            ));
        }
        None => {
            return Err(ToolError::with_next(
                Code::NotOurs,
                format!("{} exists, but the ledger recorded no create of it for work '{}'", info.name, w.work),
                format!("Leave {} alone: no create of this ledger made it. Use another work id for this task (boxd_ensure).", info.name),
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

/// The work's machine, read once in a form that carries its id (`machine get`), and
/// checked to be the one the ledger created before anything touches it. Gone when boxd
/// does not know the name.
pub fn owned_state<P: Programs>(boxd: &mut Boxd<P>, w: &Work) -> ToolResult<State> {
    match boxd.get(&w.machine).map_err(Failure::into_error)? {
        None => Ok(State::Gone),
        Some(info) => {
            check_machine(w, &info)?;
            crate::boxd::known_state(&info)
        }
    }
}

/// A rebuilt machine that still owes the proven transcript (`restore_pending`) is refused
/// by every tool that would use or copy its guest (submit, harvest, image, fork): until
/// boxd_resume imports it, a prompt would start a second history and a copy would lack it.
pub fn require_restored(w: &Work) -> ToolResult<()> {
    if !w.restore_pending {
        return Ok(());
    }
    Err(ToolError::with_next(
        Code::MachineGone,
        format!("{} was rebuilt, but the proven transcript is not on it yet", w.machine),
        format!("Call boxd_resume for work '{}': it imports the proven transcript onto the rebuilt machine.", w.work),
    ))
}

/// The machine must be up for an exec: asleep, gone and starting are refused without one.
pub fn running_state<P: Programs>(boxd: &mut Boxd<P>, w: &Work) -> ToolResult<()> {
    let (machine, work) = (&w.machine, &w.work);
    match owned_state(boxd, w)? {
        State::Running | State::Standby => require_restored(w),
        State::Asleep | State::Stopped => Err(ToolError::with_next(
            Code::MachineAsleep,
            format!("{machine} is asleep"),
            format!("Call boxd_resume for work '{work}', then try again."),
        )),
        State::Starting => Err(ToolError::new(Code::MachineStarting, format!("{machine} is still starting"))),
        State::Gone | State::Failed => Err(ToolError::with_next(
            Code::MachineGone,
            format!("{machine} no longer exists"),
            format!("Call boxd_resume for work '{work}' to rebuild it from the proven transcript, or boxd_drop to close the work and see what could not be recovered."),
        )),
    }
}

/// Why a machine is made: a work's first (or a dropped id's fresh start) in its laptop
/// folder, or a gone machine rebuilt under its name.
#[derive(Clone, Copy)]
pub enum Build<'d> {
    New { directory: &'d str },
    Rebuild,
}

/// SNAPSHOT_MISSING unless the golden snapshot (the `snapshot` option) exists and boxd
/// holds it ready: nothing boots from a capture still `pending` or one that `failed`.
pub fn require_golden<P: Programs>(boxd: &mut Boxd<P>, ctx: &Context, machine: &str, build: Build) -> ToolResult<()> {
    let snapshot = &ctx.options.snapshot;
    let nothing = match build {
        Build::New { .. } => "so no machine was created".to_string(),
        Build::Rebuild => format!("so {machine}, which is gone, was not rebuilt"),
    };
    let listed = boxd.snapshots().map_err(Failure::into_error)?.into_iter().find(|s| &s.name == snapshot);
    let Some(listed) = listed else {
        return Err(ToolError::new(Code::SnapshotMissing, match build {
            Build::New { .. } => format!("the golden snapshot '{snapshot}' does not exist, so no machine was created"),
            Build::Rebuild => format!("{machine} is gone and the golden snapshot '{snapshot}' does not exist to rebuild it"),
        }));
    };
    match listed.capture() {
        Capture::Ready => Ok(()),
        Capture::Pending => Err(ToolError::with_next(
            Code::SnapshotMissing,
            format!("boxd is still saving the golden snapshot '{snapshot}' (its status is pending), {nothing}"),
            "Call again in a minute, once boxd_status shows the golden snapshot ready; if it stays pending, build the golden image again under another name (boxd-host golden --name) and set the snapshot option to it.",
        )),
        Capture::Failed => Err(ToolError::with_next(
            Code::SnapshotMissing,
            format!("boxd holds the golden snapshot '{snapshot}' as failed: its capture never landed, {nothing}"),
            "Build the golden image again under another name (boxd-host golden --name, see docs/golden-image.md), then set the snapshot option to it.",
        )),
        Capture::Unknown => Err(listed.unknown_status()),
    }
}

/// Create the work's machine from the golden snapshot. Intent before effect: the work is
/// recorded as creating (no id) first, so a create that lands after boxd stops answering
/// is adopted by the next ensure instead of becoming a second machine; it opens only with
/// an id to check later.
pub fn create_machine<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, ctx: &Context, work: &str, build: Build) -> ToolResult<Work> {
    let (machine, snapshot) = (paths::machine_name(work), &ctx.options.snapshot);
    let directory = match build {
        Build::New { directory } => directory.to_string(),
        Build::Rebuild => ledger.read(work)?.map(|w| w.directory).unwrap_or_default(),
    };
    // Every create follows a `get` that found no machine. A listing that shows the name
    // contradicts it (a proxy's 404, or a machine made meanwhile): nothing is decided on
    // it — a rebuild would call the gone machine's prompts lost while it still runs.
    if let Some(status) = super::admission::admit(boxd, ledger, ctx, work, &directory)? {
        return Err(ToolError::with_next(
            Code::BoxdFailed,
            format!("boxd machine get said {machine} does not exist, but boxd machine list shows it ({status}); nothing was created"),
            format!("Call boxd_status, then boxd_ensure for work '{work}' again: another call may be creating its machine at this moment, and boxd may have answered one of the two wrongly."),
        ));
    }
    require_golden(boxd, ctx, &machine, build)?;
    let now = iso8601(ctx.now_ms);
    // Whether this call's intent is the first: no create of this ledger was under way.
    let mut first = true;
    ledger.upsert(work, |cur| {
        first = !cur.as_ref().is_some_and(|w| !w.is_closed() && w.state == WorkState::Creating);
        let mut w = match (cur.filter(|w| !w.is_closed()), build) {
            (Some(w), _) => w,
            (None, Build::New { directory }) => Work::new(work, directory, &now),
            (None, Build::Rebuild) => return Err(ToolError::new(Code::WorkUnknown, format!("the ledger has no open work '{work}' to rebuild"))),
        };
        if let Build::New { directory } = build {
            w.directory = directory.to_string();
        }
        // A rebuild: the gone machine's interval ended an idle bound after its last use.
        w.seen_not_running(ctx.now_ms, ctx.options.idle_ms(), true);
        if let Build::Rebuild = build {
            // The prompts after the last proof ran only on the gone machine: their runs went
            // with it. Named here, in the same write as the rebuild's intent, so no later
            // harvest waits for a transcript that no machine holds (and drop does not either).
            let covered = w.proofs.last().map_or(0, |p| p.prompts as usize).min(w.prompts.len());
            let lost: Vec<alloc::string::String> = w.prompts.drain(covered..).map(|p| p.id).collect();
            w.restore_pending = !w.proofs.is_empty();
            if !lost.is_empty() {
                w.warnings.push(format!("{now}: prompt(s) {} ran on {machine} after the last harvest; that machine was gone when it was rebuilt, so their runs are lost (the rebuilt machine holds the transcript as of the last harvest)", lost.join(", ")));
                w.unrecovered.extend(lost);
            }
        }
        w.state = WorkState::Creating;
        w.machine_id = None;
        if w.created_ms == 0 {
            w.created_ms = ctx.now_ms;
        }
        w.snapshot = Some(snapshot.clone());
        Ok(Some(w))
    })?;
    let created = boxd.create(&machine, snapshot, ctx.options.idle_seconds()).map_err(|e| match e {
        Failure::Timeout(m) => ToolError::new(Code::CreateUncertain, match build {
            Build::New { .. } => format!("boxd machine new did not answer ({m}); the machine may still appear"),
            Build::Rebuild => format!("rebuilding {machine}: {m}"),
        }),
        Failure::Other(m) if m.contains("already exists") => {
            // The name was taken since the listing. When no create of this ledger was under
            // way before this one, one look tells whose it may be: a machine not made the
            // way this create makes one (from the golden snapshot, with this idle bound)
            // is someone else's, and the intent is withdrawn so no ensure adopts it. One
            // made like ours may be another call's create of this work at once, or boxd
            // retrying this very create: it stays creating, for ensure to adopt.
            let info = if first { boxd.get(&machine).ok().flatten() } else { None };
            match info.filter(|i| !made_like_ours(i, &format!("snapshot/{snapshot}"), ctx.options.idle_seconds())) {
                Some(i) => {
                    let _ = ledger.update(work, |w| {
                        if w.state == WorkState::Creating && w.machine_id.is_none() {
                            w.state = WorkState::Open;
                        }
                    });
                    ToolError::with_next(
                        Code::NotOurs,
                        format!(
                            "{machine} was made by someone else just before this create (source '{}', auto-hibernate '{}'; this create makes one from snapshot '{snapshot}' with {}s); boxd refused this create, so nothing was made",
                            i.source,
                            i.auto_hibernate,
                            ctx.options.idle_seconds()
                        ),
                        format!("Leave {machine} alone; use another work id for this task (boxd_ensure)."),
                    )
                }
                None => ToolError::new(Code::CreateUncertain, format!("boxd says {machine} already exists but did not show it a moment ago (another call creating this work's machine at once, or a create of this one boxd made before it answered)")),
            }
        }
        e => {
            // Any other failure leaves the create uncertain (boxd may have made the machine
            // before failing): the work stays creating for the next ensure to adopt. A
            // refusal that made nothing (quota, signed out, no CLI, the host's policy) is
            // withdrawn once one look confirms no machine is there, so a machine someone
            // else later makes under the name is refused, never adopted as this work's.
            let definite = matches!(e, Failure::SignedOut(_) | Failure::Missing(_) | Failure::Refused(_));
            let e = super::admission::refused(e);
            if (definite || e.code == Code::QuotaReached) && matches!(boxd.get(&machine), Ok(None)) {
                let _ = ledger.update(work, |w| {
                    if w.state == WorkState::Creating {
                        w.state = WorkState::Open;
                    }
                });
            }
            e
        }
    })?;
    let landed = !created.boot_timeout && created.id.is_some();
    let w = ledger.update(work, |w| {
        w.machine_id = created.id;
        if landed {
            w.state = WorkState::Open;
            // A new machine holds no helper yet.
            w.helper_sha256 = None;
            w.open_run(ctx.now_ms);
        }
    })?;
    if !landed {
        return Err(ToolError::new(Code::CreateUncertain, match build {
            Build::New { .. } => format!("boxd created {machine} but its boot timed out or its answer carried no id; it may still come up"),
            Build::Rebuild => format!("boxd rebuilt {machine} but its boot timed out or its answer carried no id"),
        }));
    }
    Ok(w)
}

/// Whether a machine looks made by this plugin: from `source` (`snapshot/<golden>` for a
/// create, any version of it; `fork/<parent's machine>` for a fork), with the idle bound it
/// sets. A field boxd does not give cannot tell against it.
pub(super) fn made_like_ours(info: &MachineInfo, source: &str, idle_seconds: u32) -> bool {
    let from_golden = info.source.is_empty() || info.source == source || info.source.strip_prefix(source).is_some_and(|v| v.starts_with(':'));
    // `14400s`, or `off` for a bound of 0; any other form says nothing either way.
    let bound = match info.auto_hibernate.as_str() {
        "off" => Some(0),
        a => a.strip_suffix('s').and_then(|n| n.parse::<u32>().ok()),
    };
    from_golden && bound.is_none_or(|b| b == idle_seconds)
}

/// Make the guest side ready: the helper in place, the work tree a git repository, the
/// OpenCode server (same version as the laptop's) with the work's password, and the pump.
/// One exec (two when the ledger has not seen this helper on the machine: it is uploaded
/// first). Only ever called after the machine's id was checked against the ledger: the password goes to no other machine.
pub fn prepare_guest<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, w: &Work, entropy: &[u8], version: Option<&str>) -> ToolResult<Value> {
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
    let sha = crate::encode::sha256_hex(crate::guest::HELPER);
    let mut guest = crate::guest::Guest::new(boxd, &w.machine, &w.work);
    if w.helper_sha256.as_deref() != Some(sha.as_str()) {
        // Not known to hold this helper (a new machine, or a new plugin): upload first
        // rather than learn it from a refused call and retry, one exec fewer.
        guest.upload()?;
    }
    let answer = guest.call("prepare", &flags, Some(stdin))?;
    ledger.update(&w.work, |w| w.helper_sha256 = Some(sha))?;
    Ok(answer)
}

/// `prepare_guest`, except that a rebuilt machine whose OpenCode differs from the laptop's
/// (the golden image changed between the build and the rebuild) is removed: it can never
/// serve, and it holds nothing but what the ledger restored onto it (no prompt reaches a
/// machine whose proven transcript is still pending). The work stays open, so the next
/// boxd_resume rebuilds it from the golden image as it is then; before, the machine stayed
/// and every tool answered GUEST_VERSION or sent the user back and forth.
pub fn prepare_rebuilt_guest<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, w: &Work, entropy: &[u8], version: Option<&str>) -> ToolResult<Value> {
    let e = match prepare_guest(boxd, ledger, w, entropy, version) {
        Err(e) if w.restore_pending && cannot_serve(&e) => e,
        other => return other,
    };
    let (machine, work) = (&w.machine, &w.work);
    Err(match boxd.remove(machine) {
        Ok(()) => ToolError::with_next(
            Code::GuestVersion,
            format!("{}; {machine} was rebuilt from that image and held nothing of the work yet, so it was removed", e.message),
            format!("Rebuild the golden image with this laptop's OpenCode (boxd-host golden), then call boxd_resume for work '{work}': it rebuilds the machine and restores the proven transcript."),
        ),
        Err(f) => ToolError::with_next(
            Code::GuestVersion,
            format!("{}; removing {machine}, a rebuild that cannot serve the work, failed too: {}", e.message, f.into_error().message),
            format!("Remove it with 'boxd machine remove {machine} -y' (a rebuild holding nothing of yours yet), rebuild the golden image, then call boxd_resume for work '{work}'."),
        ),
    })
}

/// GUEST_VERSION: the machine's OpenCode is another version, missing or broken, which is
/// final for its image. (The helper answers a `--version` that timed out on a busy machine
/// with GUEST_FAILED: the next call may well get it.)
fn cannot_serve(e: &ToolError) -> bool {
    e.code == Code::GuestVersion
}

/// Prepare the guest of a work no prompt has reached (ensure's). GUEST_VERSION is final for
/// this machine, which boots the golden image's OpenCode: left running it would bill and
/// never serve. It holds nothing of the user's, so it is removed and the work closed (the
/// ledger recorded it before it was made), and a later ensure of the id starts afresh. A
/// machine a prompt has reached may hold work, so it is left to the user.
pub fn prepare_fresh_guest<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, ctx: &Context, w: &Work, version: Option<&str>) -> ToolResult<Value> {
    let e = match prepare_rebuilt_guest(boxd, ledger, w, &ctx.entropy, version) {
        // (A rebuild pending its transcript was handled by prepare_rebuilt_guest, which keeps
        // the work open.)
        Err(e) if e.code == Code::GuestVersion && w.prompts.is_empty() && !w.restore_pending => e,
        other => return other,
    };
    let (machine, work) = (&w.machine, &w.work);
    // Intent before effect, as in a drop: one killed after the remove is closed by boxd_drop.
    ledger.update(work, |w| w.state = WorkState::Dropping)?;
    if let Err(f) = boxd.remove(machine) {
        return Err(ToolError::with_next(
            Code::GuestVersion,
            format!("{}; removing {machine}, which cannot serve the work, failed too: {}", e.message, f.into_error().message),
            format!("Remove it with 'boxd machine remove {machine} -y' (the plugin created it and it holds nothing of yours), then call boxd_drop for work '{work}' to close it."),
        ));
    }
    super::drop::close(ledger, work, ctx)?;
    Err(ToolError::new(Code::GuestVersion, format!("{}; {machine} was removed and work '{work}' closed, so nothing is left running", e.message)))
}

pub fn work_json(w: &Work, state: &str) -> Value {
    json!({ "work": w.work, "machine": w.machine, "machineId": w.machine_id, "directory": w.directory, "state": state })
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::GitRecord;
    use crate::testing::{open_work, raw_context, Scripted, OURS};
    use crate::tools::call;

    /// A golden snapshot boots a machine only once boxd holds it ready (or lists it with no
    /// status, as an older CLI may): a capture still pending or one that failed is
    /// SNAPSHOT_MISSING saying which, and a status this plugin does not know BOXD_FAILED.
    #[test]
    fn only_a_ready_golden_snapshot_boots_a_machine() {
        let ctx = crate::tools::context(raw_context("{}", "{}")).unwrap();
        let golden = |status: &str| {
            let mut p = Scripted::default();
            p.push_exit(0, &alloc::format!(r#"[{{"name":"opencode-golden","version":"v1"{status}}}]"#), "");
            let mut boxd = Boxd::new(&mut p, 10);
            require_golden(&mut boxd, &ctx, "oc-w1", Build::New { directory: "" })
        };
        assert_eq!(golden(r#","status":"ready""#), Ok(()));
        assert_eq!(golden(""), Ok(()));
        let e = golden(r#","status":"pending""#).unwrap_err();
        assert!(e.code == Code::SnapshotMissing && e.message.contains("still saving") && e.message.contains("no machine was created") && e.next.contains("in a minute"), "{e:?}");
        let e = golden(r#","status":"failed""#).unwrap_err();
        assert!(e.code == Code::SnapshotMissing && e.message.contains("as failed") && e.next.contains("another name"), "{e:?}");
        assert_eq!(golden(r#","status":"weird""#).unwrap_err().code, Code::BoxdFailed);
        let mut p = Scripted::default();
        p.push_exit(0, r#"[{"name":"opencode-golden","status":"pending"}]"#, "");
        let e = require_golden(&mut Boxd::new(&mut p, 10), &ctx, "oc-w1", Build::Rebuild).unwrap_err();
        assert!(e.message.contains("oc-w1, which is gone, was not rebuilt"), "{e:?}");
    }

    /// Every tool that acts on a work's machine, with arguments that pass their own checks.
    const MACHINE_TOOLS: [(&str, &str); 7] = [
        ("boxd_job", r#"{"work":"w1"}"#),
        ("boxd_submit", r#"{"work":"w1","prompt":"hi"}"#),
        ("boxd_harvest", r#"{"work":"w1"}"#),
        ("boxd_sleep", r#"{"work":"w1"}"#),
        ("boxd_resume", r#"{"work":"w1"}"#),
        ("boxd_drop", r#"{"work":"w1"}"#),
        ("boxd_ensure", r#"{"work":"w1"}"#),
    ];

    /// Each of MACHINE_TOOLS on the open work w1 (vm_1) whose `machine get` answers `got`:
    /// it must fail after that one read; its error and the record after it.
    fn each_refuses_after_one_read(got: &str) -> Vec<(&'static str, ToolError, Work)> {
        let mut out = Vec::new();
        for (tool, args) in MACHINE_TOOLS {
            let mut fs = open_work(Some(GitRecord::default()));
            let mut p = Scripted::default();
            p.push_exit(0, got, "");
            let e = call(&mut p, &mut fs, tool, args, raw_context("{}", r#"{"opencodeVersion":"1.18.33"}"#)).unwrap_err();
            assert_eq!(p.commands(), ["machine get oc-w1 --json"], "{tool} made one read and nothing else");
            out.push((tool, e, Ledger::new(&mut fs, "/l").require("w1").unwrap()));
        }
        out
    }

    #[test]
    fn every_tool_refuses_a_machine_with_another_id_before_touching_it() {
        for (tool, e, _) in each_refuses_after_one_read(r#"{"name":"oc-w1","id":"vm_new","status":"running","sharing":"private","isolated":"no"}"#) {
            assert_eq!(e.code, Code::NotOurs, "{tool}: {e:?}");
        }
    }

    /// A status word boxd may add later is not "gone": resume would rebuild a machine that
    /// still holds the work, drop would close it. Every tool refuses after its one read.
    #[test]
    fn every_tool_refuses_a_machine_in_a_state_it_does_not_know_before_touching_it() {
        for (tool, e, w) in each_refuses_after_one_read(r#"{"name":"oc-w1","id":"vm_1","status":"updating","sharing":"private","isolated":"no"}"#) {
            assert_eq!(e.code, Code::BoxdFailed, "{tool}: {e:?}");
            assert!(e.message.contains("\"updating\""), "{tool}: {}", e.message);
            assert_eq!((w.state, w.machine_id.as_deref()), (WorkState::Open, Some("vm_1")), "{tool}: the record is as it was");
        }
    }

    /// A gone machine is rebuilt through the one create: intent first, and a create whose
    /// answer carries no id leaves the work creating for ensure to adopt.
    #[test]
    fn a_rebuild_without_an_id_stays_creating_until_ensure_adopts_it() {
        let mut fs = open_work(Some(GitRecord::default()));
        let mut p = Scripted::default();
        p.push_exit(0, "1.18.33", "");
        p.push_fail(1, "error: VM 'oc-w1' not found");
        p.push_exit(0, "[]", "");
        p.push_exit(0, r#"[{"name":"opencode-golden","version":"1","status":"ready"}]"#, "");
        p.push_exit(0, r#"{"name":"oc-w1"}"#, "");
        let e = call(&mut p, &mut fs, "boxd_resume", r#"{"work":"w1"}"#, raw_context("{}", "{}")).unwrap_err();
        assert_eq!(e.code, Code::CreateUncertain, "{e:?}");
        assert!(e.message.contains("rebuilt oc-w1"), "{}", e.message);
        assert_eq!(p.commands()[2], "machine list --json", "admission reads what runs before the create");
        assert!(p.commands()[4].starts_with("machine new oc-w1 --from-snapshot opencode-golden"), "{:?}", p.commands());
        let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        assert_eq!((w.state, w.machine_id), (WorkState::Creating, None));
        p.push_exit(0, OURS, "");
        p.push_exit(0, "", "");
        p.push_exit(0, r#"{"ok":true}"#, "");
        let v = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, raw_context("{}", r#"{"opencodeVersion":"1.18.33"}"#)).unwrap();
        assert_eq!((v["adopted"].as_bool(), v["created"].as_bool(), v["machineId"].as_str()), (Some(true), Some(false), Some("vm_1")));
        // The adopted machine is not known to hold the helper: uploaded first, then one prepare.
        let c = p.commands();
        let last = &c[c.len() - 3..];
        assert!(last[0] == "machine get oc-w1 --json" && last[1].contains("upload.tmp") && last[2].contains("prepare --work w1"), "{last:?}");
    }

    /// A create boxd refused made nothing: the work does not stay "creating", so a machine
    /// someone else later makes under its name is refused, never adopted and prepared.
    #[test]
    fn a_refused_create_is_withdrawn_and_a_later_machine_under_the_name_is_not_adopted() {
        let mut fs = crate::testing::MemFiles::new(&["/p", "/l"]);
        let facts = r#"{"opencodeVersion":"1.18.33"}"#;
        let mut p = Scripted::default();
        p.push_fail(1, "error: VM 'oc-w1' not found");
        p.push_exit(0, "[]", "");
        p.push_exit(0, r#"[{"name":"opencode-golden","version":"1","status":"ready"}]"#, "");
        p.push_fail(1, "error: request failed: quota exceeded");
        p.push_fail(1, "error: VM 'oc-w1' not found");
        let e = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, raw_context("{}", facts)).unwrap_err();
        assert_eq!(e.code, Code::QuotaReached, "{e:?}");
        let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        assert_eq!((w.state, w.machine_id), (WorkState::Open, None), "the create's intent is withdrawn");
        let mut p = Scripted::default();
        p.push_exit(0, r#"{"name":"oc-w1","id":"vm_someone","status":"running","sharing":"private","isolated":"no"}"#, "");
        let e = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, raw_context("{}", facts)).unwrap_err();
        assert_eq!(e.code, Code::NotOurs, "{e:?}");
        assert_eq!(p.commands(), ["machine get oc-w1 --json"], "nothing uploaded, prepared or recorded");
        // Any other failure may have made it (boxd failing after the create): uncertain, so
        // the work stays creating for ensure to adopt, with no look spent.
        let mut fs = crate::testing::MemFiles::new(&["/p", "/l"]);
        let mut p = Scripted::default();
        p.push_fail(1, "error: VM 'oc-w1' not found");
        p.push_exit(0, "[]", "");
        p.push_exit(0, r#"[{"name":"opencode-golden","version":"1","status":"ready"}]"#, "");
        p.push_fail(1, "error: internal server error");
        call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, raw_context("{}", facts)).unwrap_err();
        assert_eq!(p.commands().len(), 4, "{:?}", p.commands());
        assert_eq!(Ledger::new(&mut fs, "/l").require("w1").unwrap().state, WorkState::Creating);
    }

    /// A rebuilt machine that still owes the proven transcript: every tool that would use
    /// or copy its guest refuses, naming boxd_resume, after its one state read.
    #[test]
    fn a_machine_owing_the_transcript_is_neither_used_nor_copied() {
        for (tool, args, answers) in [
            ("boxd_submit", r#"{"work":"w1","prompt":"hi"}"#, &[OURS][..]),
            ("boxd_harvest", r#"{"work":"w1"}"#, &[OURS]),
            ("boxd_image", r#"{"work":"w1","name":"snap-1"}"#, &["[]", OURS]),
            ("boxd_fork", r#"{"work":"w1","forks":["f1"]}"#, &[OURS]),
        ] {
            let mut fs = open_work(Some(GitRecord::default()));
            Ledger::new(&mut fs, "/l").update("w1", |w| w.restore_pending = true).unwrap();
            let mut p = Scripted::default();
            for a in answers {
                p.push_exit(0, a, "");
            }
            let e = call(&mut p, &mut fs, tool, args, raw_context("{}", r#"{"opencodeVersion":"1.18.33"}"#)).unwrap_err();
            assert_eq!(e.code, Code::MachineGone, "{tool}: {e:?}");
            assert!(e.message.contains("not on it yet") && e.next.contains("boxd_resume"), "{tool}: {e:?}");
            assert_eq!(p.commands().len(), answers.len(), "{tool}: {:?}", p.commands());
        }
    }

    /// A machine no prompt has reached that boots another OpenCode than the laptop's is
    /// removed and the work closed; one a prompt has reached is left for the user.
    #[test]
    fn a_guest_version_mismatch_removes_only_a_machine_no_prompt_reached() {
        const MISMATCH: &str = r#"{"ok":false,"error":"GUEST_VERSION","message":"the machine has OpenCode 1.18.33 but the laptop runs 1.19.0"}"#;
        for prompted in [false, true] {
            let mut fs = open_work(Some(GitRecord::default()));
            if prompted {
                let mut w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
                w.prompts.push(crate::ledger::Prompt { id: "p1".into(), admitted: true, ..Default::default() });
                Ledger::new(&mut fs, "/l").write(&w).unwrap();
            }
            let mut p = Scripted::default();
            p.push_exit(0, OURS, "");
            p.push_exit(0, "", "");
            p.push_exit(3, MISMATCH, "");
            p.push_exit(0, r#"{"name":"oc-w1","status":"destroyed"}"#, "");
            let e = call(&mut p, &mut fs, "boxd_ensure", r#"{"work":"w1"}"#, raw_context("{}", r#"{"opencodeVersion":"1.19.0"}"#)).unwrap_err();
            assert_eq!(e.code, Code::GuestVersion, "{e:?}");
            let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
            let removed = p.commands().last().map(String::as_str) == Some("machine remove oc-w1 -y --json");
            if prompted {
                assert!(!removed, "{:?}", p.commands());
                assert_eq!(w.state, WorkState::Open);
            } else {
                assert!(removed, "{:?}", p.commands());
                assert!(e.message.contains("1.19.0") && e.message.contains("oc-w1 was removed and work 'w1' closed"), "{}", e.message);
                assert_eq!(w.state, WorkState::Closed);
            }
        }
    }

    /// A rebuild whose OpenCode differs (the golden image changed since the work began)
    /// holds nothing of the work yet: it is removed and the work stays open, so the next
    /// resume rebuilds it; resume and ensure both.
    #[test]
    fn a_rebuild_that_boots_another_opencode_is_removed_and_the_work_stays_open() {
        const MISMATCH: &str = r#"{"ok":false,"error":"GUEST_VERSION","message":"the machine has OpenCode 1.18.99 but the laptop runs 1.18.33"}"#;
        for tool in ["boxd_ensure", "boxd_resume"] {
            let mut fs = open_work(Some(GitRecord::default()));
            let mut w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
            w.prompts.push(crate::ledger::Prompt { id: "p1".into(), admitted: true, ..Default::default() });
            w.restore_pending = true;
            Ledger::new(&mut fs, "/l").write(&w).unwrap();
            let mut p = Scripted::default();
            p.push_exit(0, OURS, "");
            p.push_exit(0, "", ""); // resume: set the idle bound; ensure: the helper's upload
            if tool == "boxd_resume" {
                p.push_exit(0, "", ""); // the helper's upload
            }
            p.push_exit(3, MISMATCH, "");
            p.push_exit(0, r#"{"name":"oc-w1","status":"destroyed"}"#, "");
            let e = call(&mut p, &mut fs, tool, r#"{"work":"w1"}"#, raw_context("{}", r#"{"opencodeVersion":"1.18.33"}"#)).unwrap_err();
            assert_eq!(e.code, Code::GuestVersion, "{tool}: {e:?}");
            assert_eq!(p.commands().last().map(String::as_str), Some("machine remove oc-w1 -y --json"), "{tool}: {:?}", p.commands());
            assert!(e.message.contains("was removed") && e.next.contains("boxd_resume"), "{tool}: {e:?}");
            let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
            assert_eq!(w.state, WorkState::Open, "{tool}");
            assert!(w.restore_pending, "{tool}: the transcript is still owed to the next rebuild");
        }
        // An OpenCode that could not be asked (a timeout on a busy machine) is not final:
        // the rebuild stays.
        let mut fs = open_work(Some(GitRecord::default()));
        let mut w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        w.restore_pending = true;
        Ledger::new(&mut fs, "/l").write(&w).unwrap();
        let mut p = Scripted::default();
        p.push_exit(0, OURS, "");
        p.push_exit(0, "", "");
        p.push_exit(0, "", "");
        p.push_exit(3, r#"{"ok":false,"error":"GUEST_FAILED","message":"opencode --version did not answer within 60 s"}"#, "");
        let e = call(&mut p, &mut fs, "boxd_resume", r#"{"work":"w1"}"#, raw_context("{}", r#"{"opencodeVersion":"1.18.33"}"#)).unwrap_err();
        assert_eq!(e.code, Code::GuestFailed, "{e:?}");
        assert!(!p.commands().iter().any(|c| c.starts_with("machine remove")), "{:?}", p.commands());
    }
}
