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
        Some(id) if info.id.is_empty() => {
            return Err(ToolError::new(Code::NotOurs, format!("boxd gave no id for {}, so it cannot be checked against the {id} the ledger recorded for work '{}'", info.name, w.work)));
        }
        Some(id) => {
            return Err(ToolError::with_next(
                Code::NotOurs,
                format!("{} has id {}, but the ledger recorded {id} for work '{}': it is another machine under the same name, and this work's own machine is gone", info.name, crate::redact::cut(&info.id, 400), w.work),
                format!("Leave {} alone (no tool acts on another's machine); call boxd_drop for work '{}' to close its record: it names what was not recovered, and what the work harvested stays on this laptop.", info.name, w.work),
            ));
        }
        // Likely the work's own (a create, or a rebuild, whose answer never came): only
        // boxd_ensure takes such a machine up, once it is shown to be this create's.
        None if w.state == WorkState::Creating => {
            return Err(ToolError::with_next(
                Code::CreateUncertain,
                format!("{} exists, but the ledger has no machine id for work '{}' (its create never answered)", info.name, w.work),
                format!("Call boxd_ensure for work '{}': it takes up the machine its own create made, once it shows it is that one.", w.work),
            ));
        }
        None => {
            return Err(ToolError::with_next(
                Code::NotOurs,
                format!("{} exists, but the ledger recorded no create of it for work '{}'", info.name, w.work),
                format!("Leave {} alone: no create of this ledger made it. Call boxd_drop for work '{}' to close its record (nothing of it runs on boxd), and use another work id for this task.", info.name, w.work),
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

/// Whether the work's name now holds another machine than the one the ledger recorded (an
/// id given, and not ours): boxd names are unique, so the work's own machine is gone.
pub fn taken(w: &Work, info: &MachineInfo) -> bool {
    w.machine_id.as_ref().is_some_and(|id| !info.id.is_empty() && info.id != *id)
}

/// `check_machine`, and a name found `taken` is recorded first (`name_taken_by`, the run
/// ended as a gone machine's): boxd_status and admission see names only, and would
/// otherwise count someone else's machine as this work's running one. A record that
/// changed meanwhile (rebuilt, closed) is left as it is; a check (read-only files) records
/// nothing.
pub fn check_owned<F: Files>(ledger: &mut Ledger<F>, ctx: &Context, w: &Work, info: &MachineInfo) -> ToolResult<()> {
    if taken(w, info) {
        let _ = ledger.update(&w.work, |r| {
            if !r.is_closed() && r.machine_id == w.machine_id {
                r.name_taken_by = Some(info.id.clone());
                r.seen_not_running(ctx.now_ms, ctx.options.idle_ms(), true);
            }
        });
    } else if w.name_taken_by.is_some() && w.machine_id.as_deref() == Some(info.id.as_str()) {
        // Our id answers again: the other id was a wrong answer, not a replacement. The
        // mark goes, and the run it ended is open again while the machine runs, so status,
        // spend and the caps count it once more.
        let running = matches!(crate::boxd::known_state(info), Ok(State::Running | State::Standby | State::Starting));
        let _ = ledger.update(&w.work, |r| {
            if r.machine_id == w.machine_id && r.name_taken_by.is_some() {
                r.name_taken_by = None;
                if let Some(last) = r.runs.last_mut().filter(|l| running && l.ended_by.as_deref() == Some("seen gone")) {
                    (last.to_ms, last.ended_by) = (None, None);
                }
            }
        });
    }
    check_machine(w, info)
}

/// The work's machine, read once in a form that carries its id (`machine get`), and
/// checked to be the one the ledger created before anything touches it (`check_owned`).
/// Gone when boxd does not know the name.
pub fn owned_state<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, ctx: &Context, w: &Work) -> ToolResult<State> {
    refuse_unclaimed(w)?;
    owned_state_claiming(boxd, ledger, ctx, w)
}

/// A machine taken up by its name alone whose guest has not agreed yet (`Work::taken_by_name`):
/// nothing of the work goes to it, and nothing is done to it, before a prepare claims it.
pub fn refuse_unclaimed(w: &Work) -> ToolResult<()> {
    if !w.taken_by_name {
        return Ok(());
    }
    Err(ToolError::with_next(
        Code::CreateUncertain,
        format!("{} was taken up by its name only (work '{}''s create never answered) and its guest has not yet shown it is this create's", w.machine, w.work),
        format!("Call boxd_ensure for work '{}' (boxd_resume if its machine is asleep): it finishes taking the machine up, or says whose it is.", w.work),
    ))
}

/// `owned_state` for the calls that claim a machine taken up by its name (resume: it
/// prepares the guest it wakes).
pub fn owned_state_claiming<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, ctx: &Context, w: &Work) -> ToolResult<State> {
    match boxd.get(&w.machine).map_err(Failure::into_error)? {
        None => Ok(State::Gone),
        Some(info) => {
            check_owned(ledger, ctx, w, &info)?;
            crate::boxd::known_state(&info)
        }
    }
}

/// Who made the work's machine, for the gone checks (`same_account`): asked once its id is
/// recorded (a host killed, or an `auth` hanging, meanwhile leaves no machine unrecorded),
/// and kept only while the record still names that machine. A failure to tell keeps what
/// was known.
pub fn keep_account<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, w: Work) -> ToolResult<Work> {
    let Some(id) = w.machine_id.clone() else { return Ok(w) };
    let Ok(account) = boxd.account() else { return Ok(w) };
    ledger.update(&w.work, |r| {
        if r.machine_id.as_deref() == Some(id.as_str()) {
            r.account = Some(account);
        }
    })
}

/// boxd answers for the account its CLI is signed in to now, and another org's machine is
/// not found there: a work is closed or rebuilt as gone only while the CLI is signed in as
/// the account that made its machine (asked once, on those paths only). A record that
/// keeps no account (made before it was kept) cannot be told, and is taken as before.
pub fn same_account<P: Programs>(boxd: &mut Boxd<P>, w: &Work, nothing: &str) -> ToolResult<()> {
    let Some(made) = &w.account else { return Ok(()) };
    let now = boxd.account().map_err(Failure::into_error)?;
    if &now == made {
        return Ok(());
    }
    Err(ToolError::with_next(
        Code::BoxdFailed,
        format!("the boxd CLI is signed in as {now}, but {} was made as {made}: boxd does not show it from this account, so it is not known to be gone; {nothing}", w.machine),
        format!("Sign the boxd CLI back in as the account that made it ('boxd auth switch', or the BOXD_TOKEN it used), then call the tool for work '{}' again.", w.work),
    ))
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
pub fn running_state<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, ctx: &Context, w: &Work) -> ToolResult<()> {
    let (machine, work) = (&w.machine, &w.work);
    match owned_state(boxd, ledger, ctx, w)? {
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
///
/// The admission's claim on a slot is released once the create is recorded, or when it
/// made nothing; a create that may still land (the work left `creating`) keeps it, so the
/// caps count that machine until boxd lists it (for at most CLAIM_MS).
pub fn create_machine<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, ctx: &Context, work: &str, build: Build) -> ToolResult<Work> {
    let machine = paths::machine_name(work);
    let directory = match build {
        Build::New { directory } => directory.to_string(),
        Build::Rebuild => ledger.read(work)?.map(|w| w.directory).unwrap_or_default(),
    };
    // Every create follows a `get` that found no machine. A listing that shows the name
    // contradicts it (a proxy's 404, or a machine made meanwhile): nothing is decided on
    // it — a rebuild would call the gone machine's prompts lost while it still runs.
    let (listed, held) = super::admission::admit(boxd, ledger, ctx, work, &directory)?;
    let created = match listed {
        Some(status) => Err(ToolError::with_next(
            Code::BoxdFailed,
            format!("boxd machine get said {machine} does not exist, but boxd machine list shows it ({status}); nothing was created"),
            format!("Call boxd_status, then boxd_ensure for work '{work}' again: another call may be creating its machine at this moment, and boxd may have answered one of the two wrongly."),
        )),
        None => require_golden(boxd, ctx, &machine, build).and_then(|()| create_admitted(boxd, ledger, ctx, work, build)),
    };
    let may_land = created.is_err() && matches!(ledger.read(work), Ok(Some(w)) if w.state == WorkState::Creating);
    if !may_land {
        ledger.release(held);
    }
    created
}

/// `create_machine` once admitted: the intent recorded, then the create.
fn create_admitted<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, ctx: &Context, work: &str, build: Build) -> ToolResult<Work> {
    let (machine, snapshot) = (paths::machine_name(work), &ctx.options.snapshot);
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
            // The rebuilt machine starts from a new work tree, and the next harvest records
            // that one: the gone tree's bundle and patch stay named, or only an unnamed file
            // in the ledger would hold its commits and changes.
            if let Some(g) = w.git.take().filter(|g| g.bundle.is_some() || g.patch.is_some()) {
                let kept: Vec<&str> = g.bundle.iter().chain(g.patch.iter()).map(|s| s.as_str()).collect();
                w.warnings.push(format!("{now}: {machine} was rebuilt with a new work tree; the commits and uncommitted changes the gone one held at the last harvest are in the ledger's {} (earlierGit in the work's record)", kept.join(" and ")));
                w.earlier_git.push(g);
            }
            // Files a harvest was asked for went with the gone tree: owed no more (the drop
            // refused over files no machine held, and status said they were still there).
            if !w.owed.is_empty() {
                let owed = core::mem::take(&mut w.owed);
                w.warnings.push(format!("{now}: files a harvest was asked for never came home from {machine}, which was gone when it was rebuilt, so they went with it: {}", owed.join(", ")));
            }
            if !lost.is_empty() {
                w.warnings.push(format!("{now}: prompt(s) {} ran on {machine} after the last harvest; that machine was gone when it was rebuilt, so their runs are lost (the rebuilt machine holds the transcript as of the last harvest)", lost.join(", ")));
                w.unrecovered.extend(lost);
            }
        }
        w.state = WorkState::Creating;
        w.machine_id = None;
        w.name_taken_by = None;
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
    let w = keep_account(boxd, ledger, w)?;
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
    let claim = crate::encode::sha256_hex(password.as_bytes());
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
    if w.taken_by_name {
        // One exec more, only here: the password goes to no machine before it is ours.
        match guest.call("claim", &["--sha256", &claim], None) {
            Err(e) if e.code == Code::NotOurs => return Err(withdraw_claim(ledger, w, e)?),
            claimed => claimed?,
        };
    }
    let answer = guest.call("prepare", &flags, Some(stdin))?;
    ledger.update(&w.work, |w| {
        w.helper_sha256 = Some(sha);
        w.taken_by_name = false;
    })?;
    Ok(answer)
}

/// A machine taken up by its name alone that another ledger's server runs this work on
/// (the guest refused the claim): the id is forgotten and the create's intent withdrawn,
/// as for a machine not made like ours, so no later call takes it up again.
fn withdraw_claim<F: Files>(ledger: &mut Ledger<F>, w: &Work, refused: ToolError) -> ToolResult<ToolError> {
    ledger.update(&w.work, |r| {
        // Only a claim still open: a drop that marked or closed the work since keeps its id.
        if r.taken_by_name && r.machine_id == w.machine_id && matches!(r.state, WorkState::Open | WorkState::Creating) {
            r.machine_id = None;
            r.taken_by_name = false;
            r.helper_sha256 = None;
            r.state = WorkState::Open;
            // The run the adoption opened (the only open one: a create opens none before its
            // id) was someone else's machine's, never this work's: it bills nothing here.
            if r.runs.last().is_some_and(|run| run.to_ms.is_none()) {
                r.runs.pop();
            }
        }
    })?;
    let machine = &w.machine;
    Ok(ToolError::with_next(
        Code::NotOurs,
        format!("{}; {machine} was taken up by its name only (this ledger's create never answered with an id), so it is left alone and work '{}' holds no machine", refused.message, w.work),
        format!("Leave {machine} alone: it is another ledger's (another install of this plugin on the same account). Use another work id for this task (boxd_ensure); boxd_drop for work '{}' closes this one.", w.work),
    ))
}

/// `prepare_guest`, except that a rebuilt machine whose OpenCode differs from the laptop's
/// (the golden image changed between the build and the rebuild) is removed: it can never
/// serve, and it holds nothing but what the ledger restored onto it (no prompt reaches a
/// machine whose proven transcript is still pending). The work stays open, so the next
/// boxd_resume rebuilds it from the golden image as it is then; before, the machine stayed
/// and every tool answered GUEST_VERSION or sent the user back and forth.
pub fn prepare_rebuilt_guest<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, w: &Work, entropy: &[u8], version: Option<&str>) -> ToolResult<Value> {
    let e = match prepare_guest(boxd, ledger, w, entropy, version) {
        // Not one taken up by its name: two installs' creates that crossed may have left it
        // another's (the claim cannot tell before either prepares), and it is not removed.
        Err(e) if w.restore_pending && cannot_serve(&e) && !w.taken_by_name => e,
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
        Err(e) if e.code == Code::GuestVersion && w.prompts.is_empty() && !w.restore_pending && !w.taken_by_name => e,
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
mod tests;
