//! Where a harvest's files land on the laptop: each in a temp file beside its
//! destination (recorded in the ledger before the host makes it), every one checked before
//! any is placed, and placed so that nothing the user or another work put there since the
//! check is replaced (docs/architecture.md, "How a harvested file is placed"). What a
//! killed harvest left behind is swept or put back by the next harvest or drop.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::{json, Value};

use super::Env;
use crate::caps::{Files, Kind, Streamed};
use crate::encode::sha256_hex;
use crate::errors::{Code, ToolError, ToolResult};
use crate::ledger::{FileRecord, Ledger, TempFile, Work};
use crate::paths;

/// Where one wanted file lands: its work-tree path, its laptop destination, and the new
/// temp file beside it that the host streams its bytes into.
pub(super) struct Landing {
    pub(super) rel: String,
    pub(super) dest: String,
    pub(super) temp: String,
}

/// Each wanted file's laptop path is one a harvest may write (`user_path`, no symlink or
/// file among its folders), checked before anything is recorded or made.
pub(super) fn check_destinations(env: &mut Env, wanted: &[String], dest_dir: &str) -> ToolResult<()> {
    for want in wanted {
        let rel = paths::guest_relative(want)?;
        let dest = super::user_path(env.ctx, &rel, dest_dir)?;
        super::real_folders_on_the_way(env.files, env.ctx, paths::parent(&dest), want)?;
    }
    Ok(())
}

/// The landing of every wanted file, its folder created: the host writes only into an
/// existing folder. The temp names carry this call's mark (from the host's entropy) and
/// are recorded in the ledger before the host creates them.
pub(super) fn landing(env: &mut Env, w: Work, wanted: &[String], dest_dir: &str) -> ToolResult<(Work, Vec<Landing>)> {
    let mark = &sha256_hex(&[env.ctx.entropy.as_slice(), b"harvest-files"].concat())[..12];
    let mut out = Vec::new();
    for (i, want) in wanted.iter().enumerate() {
        let rel = paths::guest_relative(want)?;
        let dest = super::user_path(env.ctx, &rel, dest_dir)?;
        let parent = paths::parent(&dest).to_string();
        super::real_folders_on_the_way(env.files, env.ctx, &parent, want)?;
        env.files.create_dir_all(&parent).map_err(|_| ToolError::new(Code::PathRefused, format!("cannot create {parent}")))?;
        // Beside its destination, named after it; a name too long for that (most file
        // systems allow 255 bytes) gets a short temp name in the same folder instead.
        let name = dest[parent.len()..].trim_start_matches('/');
        let temp = if name.len() + mark.len() + 32 <= 255 { format!("{dest}.{mark}-{i}.boxd-tmp") } else { format!("{parent}/.{mark}-{i}.boxd-tmp") };
        out.push(Landing { temp, rel, dest });
    }
    if out.is_empty() {
        return Ok((w, out));
    }
    let at_ms = env.ctx.now_ms;
    let temps: Vec<TempFile> = out.iter().map(|l| TempFile { path: l.temp.clone(), at_ms, dest: Some(l.dest.clone()), guest: Some(l.rel.clone()), sha256: None, ..Default::default() }).collect();
    let w = Ledger::for_call(&mut env.files, env.ctx).update(&w.work, |w| w.temps.extend(temps))?;
    Ok((w, out))
}

/// A harvest that stops after the files arrived removes their temp files: each stays owed.
/// (Their names stay recorded until the next harvest sweeps them: a record write here
/// could fail too, and removing an absent file is harmless.) A landing the host could not
/// make (`boxd::UNRECEIVED`, `boxd::LAPTOP_FULL`: the laptop's failure, not the boxd
/// CLI's) is said with the folders it writes into and what to do about them.
pub(super) fn discard(env: &mut Env, landing: &[Landing], e: ToolError) -> ToolError {
    for l in landing {
        let _ = env.files.remove_file(&l.temp);
    }
    if e.code != Code::PathRefused {
        return e;
    }
    let folders = folders_of(landing).join(", ");
    if let Some(said) = e.message.strip_prefix(crate::boxd::LAPTOP_FULL) {
        return ToolError::with_next(
            Code::PathRefused,
            format!("the laptop's disk is full: the harvested files could not be written into {folders} ({said}); none was placed, and they stay owed"),
            "Free space on the laptop's disk that holds those folders (or harvest with 'to' naming a folder on another disk), then call boxd_harvest again.",
        );
    }
    match e.message.strip_prefix(crate::boxd::UNRECEIVED) {
        Some(said) => ToolError::with_next(
            Code::PathRefused,
            format!("the harvested files could not be written into {folders} ({said}); none was placed, and they stay owed"),
            format!("A folder on the way changed after this harvest checked it (replaced by a symlink, moved, removed or made read-only): make {folders} a plain writable folder inside the project again, then call boxd_harvest again."),
        ),
        None => e,
    }
}

/// The folders the landing writes into, each once, in order.
fn folders_of(landing: &[Landing]) -> Vec<&str> {
    landing.iter().map(|l| paths::parent(&l.dest)).fold(Vec::new(), |mut v, f| {
        if !v.contains(&f) {
            v.push(f);
        }
        v
    })
}

/// How long a recorded temp file may belong to a harvest still running: its files arrive
/// within two helper execs of (120 + 30) s and an upload; ten minutes is past all of them.
const TEMP_LIVE_MS: u64 = 10 * 60 * 1000;

/// Remove the temp files an earlier harvest of this work recorded and did not clear (its
/// host was killed while the files streamed, or before they were renamed): they are this
/// plugin's own, named in the ledger before they were made, and nothing else is touched.
/// One may still belong to a harvest running now: that harvest's files are owed, so with
/// nothing owed every recorded temp is dead; otherwise only those older than TEMP_LIVE_MS.
/// What a killed harvest moved aside (`<temp>.kept`) goes back first (`put_back`); a
/// record whose aside copy stays is kept, so boxd_status goes on naming it. A dead record
/// whose arrived bytes its destination holds is what that harvest placed (`placed`).
pub(super) fn sweep_temps(env: &mut Env, w: Work) -> ToolResult<Work> {
    let now = env.ctx.now_ms;
    let kept: Vec<String> = w.temps.iter().filter(|t| is_ours(t) && put_back(env, t)).map(|t| t.path.clone()).collect();
    let dead: Vec<String> = w
        .temps
        .iter()
        .filter(|t| w.owed.is_empty() || crate::ledger::waited(t.at_ms, TEMP_LIVE_MS, now))
        .map(|t| t.path.clone())
        .collect();
    if dead.is_empty() {
        return Ok(w);
    }
    for t in w.temps.iter().filter(|t| is_ours(t) && dead.contains(&t.path)) {
        let temp = &t.path;
        if let Ok(Some(m)) = env.files.stat(temp) {
            if m.kind == Kind::File {
                let _ = env.files.remove_file(temp);
            }
        }
    }
    let gone: Vec<&String> = dead.iter().filter(|t| !kept.contains(t)).collect();
    let placed = placed(env, &w, &gone);
    Ledger::for_call(&mut env.files, env.ctx).update(&w.work, |w| {
        w.temps.retain(|t| !gone.contains(&&t.path));
        w.files_out.extend(placed);
    })
}

/// The files a killed harvest placed and did not record: a dead temp record's arrived
/// bytes (written only for a file the harvest was to write, never one it found there) that
/// its destination holds now. They become this work's `files_out`, so the next harvest
/// replaces them when the guest changed them, not a FILE_CONFLICT saying no harvest wrote
/// them. They stay owed until a harvest brings the guest's current bytes.
fn placed(env: &mut Env, w: &Work, gone: &[&String]) -> Vec<FileRecord> {
    let mut out: Vec<FileRecord> = Vec::new();
    for t in w.temps.iter().filter(|t| is_ours(t) && gone.contains(&&t.path)) {
        let (Some(dest), Some(sha)) = (t.dest.as_deref(), t.sha256.as_deref()) else { continue };
        let recorded = |r: &FileRecord| r.laptop == dest && r.sha256 == sha;
        if w.files_out.iter().rev().find(|r| r.laptop == dest && !r.found).is_some_and(recorded) || out.iter().any(recorded) {
            continue;
        }
        let Ok(Some(m)) = env.files.stat(dest) else { continue };
        if m.kind == Kind::File && holds(env, dest, sha) {
            let guest = t.guest.clone().unwrap_or_default();
            out.push(FileRecord { guest, laptop: dest.to_string(), size: m.size, sha256: sha.to_string(), at: crate::ledger::iso8601(t.at_ms), ..Default::default() });
        }
    }
    out
}

/// A temp record as `landing` writes it: a `.boxd-tmp` name in its destination's folder.
/// One that is not (a record damaged or edited by hand) is never acted on, so nothing but
/// the plugin's own temp files is ever removed or moved; the sweep drops its record.
fn is_ours(t: &TempFile) -> bool {
    t.path.ends_with(".boxd-tmp") && t.dest.as_deref().is_none_or(|d| paths::parent(d) == paths::parent(&t.path))
}

/// Whether the laptop file at `path` holds the bytes whose sha256 is `sha`.
fn holds(env: &mut Env, path: &str, sha: &str) -> bool {
    env.files.sha256(path).ok().flatten().as_deref() == Some(sha)
}

/// The aside copy a replacement makes of the laptop file (`replace_unchanged`).
fn aside_of(temp: &str) -> String {
    format!("{temp}.kept")
}

/// A harvest killed while it replaced a file leaves the file's bytes aside, as
/// `<temp>.kept`, and its destination empty: they go back where they were, so the laptop
/// is as it was before that harvest and the next one checks it as usual (a user's edit
/// among them is then a FILE_CONFLICT, never overwritten). An aside copy whose bytes the
/// destination already holds (the put-back was cut between its link and its unlink) is
/// removed. True while an aside copy stays: something else is at its destination now,
/// or it cannot be told where it goes.
fn put_back(env: &mut Env, t: &TempFile) -> bool {
    let aside = aside_of(&t.path);
    if !matches!(env.files.stat(&aside), Ok(Some(m)) if m.kind == Kind::File) {
        return false;
    }
    let Some(dest) = t.dest.as_deref() else { return true };
    match env.files.stat(dest) {
        Ok(None) => !matches!(env.files.place_new(&aside, dest), Ok(true)),
        Ok(Some(m)) if m.kind == Kind::File => {
            let same = match (env.files.sha256(&aside), env.files.sha256(dest)) {
                (Ok(Some(a)), Ok(Some(d))) => a == d,
                _ => false,
            };
            !(same && env.files.remove_file(&aside).is_ok())
        }
        _ => true,
    }
}

/// What an interrupted harvest left on the laptop, as boxd_status words it: the temp
/// files still there, and each aside copy with where it belongs.
pub(super) fn left_on_laptop(files: &mut dyn Files, temps: &[TempFile]) -> Vec<String> {
    let is_file = |files: &mut dyn Files, p: &str| matches!(files.stat(p), Ok(Some(m)) if m.kind == Kind::File);
    let mut out = Vec::new();
    let temps: Vec<&TempFile> = temps.iter().filter(|t| is_ours(t)).collect();
    let left: Vec<&str> = temps.iter().map(|t| t.path.as_str()).filter(|p| is_file(files, p)).collect();
    if !left.is_empty() {
        out.push(format!("an interrupted harvest left temp files on the laptop; the next harvest or drop removes them: {}", left.join(", ")));
    }
    for t in temps {
        let aside = aside_of(&t.path);
        if !is_file(files, &aside) {
            continue;
        }
        out.push(match t.dest.as_deref() {
            Some(dest) if !is_file(files, dest) => format!("an interrupted harvest moved {dest} aside to {aside}; the next harvest or drop puts it back"),
            Some(dest) => format!("an interrupted harvest moved {dest} aside to {aside}, and {dest} holds other bytes now: compare the two, keep what you want, and remove {aside}"),
            None => format!("an interrupted harvest moved a file aside to {aside}: it is the bytes that file held; put them back or remove it"),
        });
    }
    out
}

/// One file that arrived, checked: where it lands, and its size and sha256 as the host
/// computed them while streaming.
struct Incoming<'l> {
    landing: &'l Landing,
    size: u64,
    sha256: String,
}

/// Phase 5: the files the guest listed, in the order asked, arrived whole in their temp
/// files. Every one is checked, and every conflict found, before any is renamed into place.
pub(super) fn bring_files(env: &mut Env, w: Work, git: &Value, landing: &[Landing], arrived: Vec<Streamed>) -> ToolResult<(Work, Vec<Value>)> {
    let listed: Vec<&Value> = git["files"].as_array().into_iter().flatten().collect();
    if listed.len() != landing.len() || arrived.len() != landing.len() {
        return Err(crate::boxd::misframed(&format!("{} files were asked for; the guest listed {} and {} arrived", landing.len(), listed.len(), arrived.len())));
    }
    let mut incoming = Vec::new();
    for ((f, l), got) in listed.iter().zip(landing).zip(arrived) {
        let rel = paths::guest_relative(f["path"].as_str().unwrap_or_default())?;
        if rel != l.rel || got.path != l.temp {
            return Err(crate::boxd::misframed(&format!("the guest sent {rel} where {} was asked for", l.rel)));
        }
        incoming.push(Incoming { landing: l, size: got.size, sha256: got.sha256 });
    }
    let mut places = Vec::new();
    for file in &incoming {
        places.push(check_overwrite(env, &w, file)?);
    }
    // What will be written is recorded before anything is placed: a host killed among the
    // placements leaves files the next harvest knows as this work's (`check_overwrite`).
    // Not a file found holding these bytes already: this harvest writes nothing there.
    let arrived: Vec<(String, String)> = incoming.iter().zip(&places).filter(|(_, p)| **p != Place::Same).map(|(f, _)| (f.landing.temp.clone(), f.sha256.clone())).collect();
    let w = Ledger::for_call(&mut env.files, env.ctx).update(&w.work, |w| {
        for t in w.temps.iter_mut() {
            if let Some((_, sha)) = arrived.iter().find(|(temp, _)| *temp == t.path) {
                t.sha256 = Some(sha.clone());
            }
        }
    })?;
    let now = env.now();
    let mut written = Vec::new();
    let mut records = Vec::new();
    let mut stopped = None;
    for (Incoming { landing: Landing { rel, dest, temp }, size, sha256 }, place) in incoming.into_iter().zip(places) {
        // A destination that was absent at the check is placed only if it still is: another
        // harvest (another work's, at once) may have landed a file there since, and it is
        // never replaced. One that holds these bytes is left as it is (a mode the user set
        // stays); one this work brought there last is replaced only if it still holds
        // those bytes (the user may have saved an edit since the check).
        let placed = match &place {
            Place::New => env.files.place_new(temp, dest),
            Place::Same => env.files.remove_file(temp).map(|()| true),
            Place::Replace(last) => replace_unchanged(env, temp, dest, last),
        };
        match placed {
            Ok(true) => {}
            // Another harvest landed these very bytes there first (this work's, run twice at
            // once): they are home, and nothing of anyone's was set aside.
            Ok(false) if holds(env, dest, &sha256) && !matches!(env.files.stat(&aside_of(temp)), Ok(Some(_))) => {
                let _ = env.files.remove_file(temp);
            }
            Ok(false) => {
                let what = if place == Place::New { "appeared" } else { "changed" };
                stopped = Some(ToolError::with_next(
                    Code::FileConflict,
                    format!("{dest} (from {rel}) {what} while this harvest landed its files; it was not overwritten, and {rel} stays owed"),
                    format!("Move {dest} aside, or call boxd_harvest for work '{}' with \"to\" naming another folder.", w.work),
                ));
                break;
            }
            _ => {
                stopped = Some(ToolError::new(Code::PathRefused, format!("cannot write {dest}")));
                break;
            }
        }
        // Found there (the user's own copy, or a file sent with boxd_submit): it is home, so
        // no longer owed, but it stays the user's: `check_overwrite` never replaces it.
        let found = place == Place::Same;
        records.push(FileRecord { guest: rel.clone(), laptop: dest.clone(), size, sha256: sha256.clone(), at: now.clone(), found, ..Default::default() });
        written.push(json!({ "path": rel, "laptop": dest, "size": size, "sha256": sha256 }));
    }
    // What landed is recorded even when a later file stopped the harvest: those files are
    // home, and the rest stays owed.
    let landed: Vec<&String> = landing.iter().map(|l| &l.temp).collect();
    let done = stopped.is_none();
    let w = Ledger::for_call(&mut env.files, env.ctx).update(&w.work, |w| {
        w.owed.retain(|o| !records.iter().any(|r| &r.guest == o));
        w.files_out.extend(records);
        if done {
            w.temps.retain(|t| !landed.contains(&&t.path));
        }
    })?;
    match stopped {
        Some(e) => Err(e),
        None => Ok((w, written)),
    }
}

/// Replace `dest`, which held `last` at the check, with `temp` only if it still holds
/// `last`: it is moved aside first (one rename, so nothing can change it unseen after),
/// hashed, and then either dropped for `temp` or put back. False when it changed (then it
/// is back where it was, or, if a new file took its place meanwhile, left beside it as
/// `<temp>.kept`: never removed) or a new file appeared once it was aside. The aside copy
/// is removed only once `temp` is in place: a temp that is gone (a sweep of another call
/// took a harvest that ran past its age for dead) puts the old bytes back, never leaving
/// the destination empty.
fn replace_unchanged(env: &mut Env, temp: &str, dest: &str, last: &str) -> Result<bool, crate::caps::FsError> {
    let aside = aside_of(temp);
    if !env.files.rename(dest, &aside)? {
        return env.files.place_new(temp, dest);
    }
    // What cannot be hashed (the user made it a folder or a symlink just now) has changed
    // too: it goes back where it was, never left aside unnamed.
    if env.files.sha256(&aside).ok().flatten().as_deref() != Some(last) {
        let _ = env.files.place_new(&aside, dest);
        return Ok(false);
    }
    let placed = env.files.place_new(temp, dest);
    // Placed, or a new file appeared at the destination once it was aside (the user's,
    // kept): the aside copy is this work's own last bytes either way.
    let taken = matches!(placed, Ok(false)) && matches!(env.files.stat(dest), Ok(Some(_)));
    if matches!(placed, Ok(true)) || taken {
        env.files.remove_file(&aside)?;
        return placed;
    }
    // Not placed and nothing known there: the temp is gone. The old bytes go back (or, if
    // something is there after all, stay aside under the temp's record, which status names).
    let _ = env.files.place_new(&aside, dest);
    placed.and_then(|_| Err(crate::caps::FsError::Io(format!("{temp}, the file that arrived for {dest}, is gone"))))
}

/// How a checked file lands.
#[derive(Clone, PartialEq, Eq)]
enum Place {
    /// Nothing is there: placed only if that still holds.
    New,
    /// The laptop file holds these bytes already: left as it is (its mode, its inode).
    Same,
    /// What this work last brought home there (its sha256): replaced only if it still is.
    Replace(String),
}

/// A laptop file may be replaced only by the same bytes or when it is what this work last
/// brought home there; a symlink or a folder never.
fn check_overwrite(env: &mut Env, w: &Work, file: &Incoming) -> ToolResult<Place> {
    let (Landing { rel, dest, .. }, sha) = (file.landing, &file.sha256);
    match env.files.stat(dest).map_err(|_| ToolError::new(Code::PathRefused, format!("{dest} cannot be checked")))? {
        None => Ok(Place::New),
        Some(m) if m.kind == Kind::Symlink => Err(ToolError::new(Code::PathRefused, format!("{dest} is a symlink on the laptop, which is never followed"))),
        Some(m) if m.kind != Kind::File => Err(ToolError::new(Code::PathRefused, format!("{dest} exists and is not a file"))),
        Some(m) => {
            // What this work wrote there last; bytes it only found there are the user's.
            let last = w.files_out.iter().rev().find(|r| &r.laptop == dest && !r.found);
            // The laptop file is hashed (in pieces, never whole in the component) only when
            // its size could match the incoming bytes or the last ones brought there:
            // another size is a conflict.
            // A harvest killed among its placements recorded what arrived but not what it
            // placed: bytes one of its temps held for this destination are this work's too.
            let arrived_here = |sha: &str| w.temps.iter().any(|t| t.dest.as_deref() == Some(dest.as_str()) && t.sha256.as_deref() == Some(sha));
            let may_match = m.size == file.size || last.is_some_and(|r| r.size == m.size) || w.temps.iter().any(|t| t.dest.as_deref() == Some(dest.as_str()) && t.sha256.is_some());
            let current = match may_match.then(|| env.files.sha256(dest)) {
                Some(Ok(Some(h))) => h,
                // Gone between the look and the hash (another harvest of this work moved it
                // aside to replace it): absent, so placed only if it still is.
                Some(Ok(None)) => return Ok(Place::New),
                _ => String::new(),
            };
            let last = last.map(|r| r.sha256.clone());
            if &current != sha && last.as_deref() != Some(current.as_str()) && !arrived_here(&current) {
                let cause = conflict_cause(env, w, dest, m.size, current);
                return Err(ToolError::with_next(
                    Code::FileConflict,
                    format!("{dest} (from {rel}) {cause}; it was not overwritten, and {rel} stays owed"),
                    format!("Move {dest} aside, or call boxd_harvest for work '{}' with \"to\" naming another folder.", w.work),
                ));
            }
            Ok(if &current == sha { Place::Same } else { Place::Replace(current) })
        }
    }
}

/// How a conflicting laptop file came to be, as far as the ledger knows: the newest harvest
/// of any work that wrote `dest`, and whether the file still holds those bytes (`current`
/// is its sha256 when already hashed, else empty). Read only on a conflict.
fn conflict_cause(env: &mut Env, w: &Work, dest: &str, size: u64, mut current: String) -> String {
    let newest = |records: &[FileRecord]| records.iter().filter(|r| r.laptop == dest && !r.found).max_by(|a, b| a.at.cmp(&b.at)).cloned();
    let mut writer = newest(&w.files_out).map(|r| (w.work.clone(), r));
    let mut ledger = Ledger::for_call(&mut env.files, env.ctx);
    for id in ledger.ids().unwrap_or_default().into_iter().filter(|id| *id != w.work) {
        let Some(r) = ledger.read(&id).ok().flatten().and_then(|other| newest(&other.files_out)) else { continue };
        if writer.as_ref().is_none_or(|(_, mine)| r.at > mine.at) {
            writer = Some((id, r));
        }
    }
    let Some((by, r)) = writer else {
        return String::from("was already on the laptop: no harvest this ledger recorded wrote it");
    };
    if by == w.work {
        return format!("has changed on the laptop since this work's harvest brought it home ({})", r.at);
    }
    if current.is_empty() && r.size == size {
        current = env.files.sha256(dest).ok().flatten().unwrap_or_default();
    }
    if r.size == size && current == r.sha256 {
        format!("was written by work '{by}''s harvest ({}), not by this work's", r.at)
    } else {
        format!("was written by work '{by}''s harvest ({}) and has changed on the laptop since", r.at)
    }
}

#[cfg(test)]
mod tests;
