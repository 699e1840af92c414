//! boxd_harvest: export → import and verify → git → files, one phase function each. The
//! transcript comes home and is proven by reading the laptop's copy back; a failure at any
//! phase leaves the earlier ones recorded, and the next harvest resumes. Three boxd calls
//! however many files; the host streams their bytes into temp files beside their
//! destinations (docs/guest.md, "Frames"), which this tool renames into place.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::{json, Value};

use super::machine::running_state;
use super::{laptop_roots, work_arg, Env};
use crate::boxd::Boxd;
use crate::caps::{Kind, Programs, RunRequest, SpawnError, Streamed, Streams};
use crate::encode::sha256_hex;
use crate::errors::{Code, ToolError, ToolResult};
use crate::guest::{tail, Guest};
use crate::ledger::{FileRecord, Ledger, Proof, SessionProof, TempFile, Work};
use crate::opencode::Opencode;
use crate::paths;

/// One session as the guest exported it: `{info, messages}`.
struct Exported {
    id: String,
    parent: Option<String>,
    json: Value,
    messages: u64,
    digest: String,
}

fn invalid(why: String) -> ToolError {
    ToolError::new(Code::ExportInvalid, format!("the guest's export is not a whole transcript: {why}"))
}

/// The digest both copies are compared by: message and part ids, roles, part types,
/// texts and tool states, in id order. Not the project or directory, which import rewrites.
pub fn canonical_digest(messages: &[Value]) -> String {
    let mut canon: Vec<Value> = messages
        .iter()
        .map(|m| {
            let info = &m["info"];
            let mut parts: Vec<Value> = m["parts"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    json!({
                        "id": p["id"], "type": p["type"], "text": p.get("text").cloned().unwrap_or(Value::Null),
                        "tool": p.get("tool").cloned().unwrap_or(Value::Null),
                        "status": p.get("state").and_then(|s| s.get("status")).cloned().unwrap_or(Value::Null),
                    })
                })
                .collect();
            parts.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
            json!({ "id": info["id"], "role": info["role"], "parts": parts })
        })
        .collect();
    canon.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    sha256_hex(&serde_json::to_vec(&canon).expect("serialises"))
}

/// Check the export's shape and order it parents first.
fn parse_export(v: &Value) -> ToolResult<Vec<Exported>> {
    let sessions = v.get("sessions").and_then(Value::as_array).ok_or_else(|| invalid("no session list".into()))?;
    let mut all = Vec::new();
    for (i, s) in sessions.iter().enumerate() {
        let id = s["info"]["id"].as_str().filter(|id| !id.is_empty()).ok_or_else(|| invalid(format!("session {i} has no id")))?;
        let msgs = s["messages"].as_array().ok_or_else(|| invalid(format!("session {id} has no message list")))?;
        for (j, m) in msgs.iter().enumerate() {
            if m["info"]["id"].as_str().is_none() || !m["parts"].is_array() {
                return Err(invalid(format!("message {j} of session {id} is malformed")));
            }
        }
        all.push(Exported {
            id: id.to_string(),
            parent: s["info"]["parentID"].as_str().map(String::from),
            messages: msgs.len() as u64,
            digest: canonical_digest(msgs),
            json: json!({ "info": s["info"], "messages": msgs }),
        });
    }
    // Parents first: a session goes once its parent is placed (or it is the root).
    let ids: BTreeSet<String> = all.iter().map(|s| s.id.clone()).collect();
    if let Some(orphan) = all.iter().skip(1).find(|s| s.parent.as_ref().is_none_or(|p| !ids.contains(p))) {
        return Err(ToolError::new(Code::ParentMissing, format!("session {} names a parent that is not in the export", orphan.id)));
    }
    let mut placed: BTreeSet<String> = BTreeSet::new();
    let mut ordered = Vec::new();
    while !all.is_empty() {
        let before = all.len();
        let mut rest = Vec::new();
        for s in all {
            if ordered.is_empty() || s.parent.as_ref().is_some_and(|p| placed.contains(p)) {
                placed.insert(s.id.clone());
                ordered.push(s);
            } else {
                rest.push(s);
            }
        }
        if rest.len() == before {
            return Err(ToolError::new(Code::ParentMissing, "the export's sessions form no tree".to_string()));
        }
        all = rest;
    }
    Ok(ordered)
}

/// Import the sessions that changed since the last proof, then read each back. A session
/// whose digest equals the last proof's is already proven: no laptop OpenCode runs for it.
fn import_and_prove(env: &mut Env, w: &Work, sessions: &[Exported]) -> ToolResult<(Vec<SessionProof>, Vec<Value>)> {
    let last: BTreeMap<String, (String, Option<String>)> = w
        .proofs
        .last()
        .map(|p| p.sessions.iter().map(|s| (s.id.clone(), (s.digest.clone(), s.file.clone()))).collect())
        .unwrap_or_default();
    let mut report = Vec::new();
    let mut proofs = Vec::new();
    for s in sessions {
        let previous = last.get(&s.id).filter(|(d, f)| d == &s.digest && f.is_some());
        if let Some((_, file)) = previous {
            proofs.push(SessionProof { id: s.id.clone(), parent_id: s.parent.clone(), messages: s.messages, digest: s.digest.clone(), file: file.clone() });
            report.push(json!({ "id": s.id, "parentId": s.parent, "messages": s.messages, "digest": s.digest, "imported": false }));
            continue;
        }
        let bytes = serde_json::to_vec(&s.json).expect("serialises");
        let name = format!("export-{}.json", &sha256_hex(&bytes)[..16]);
        let mut ledger = Ledger::for_call(&mut env.files, env.ctx);
        ledger.put_blob(&w.work, &name, &bytes)?;
        let file = format!("{}/{name}", ledger.work_dir(&w.work));
        let mut opencode = Opencode::new(&mut env.programs);
        opencode.import(&file, &s.id, &w.directory)?;
        // The proof: the laptop's own copy, read back, matches the guest's.
        let back = opencode.export(&s.id, &w.directory)?;
        let msgs = back["messages"].as_array().cloned().unwrap_or_default();
        let digest = canonical_digest(&msgs);
        if msgs.len() as u64 != s.messages || digest != s.digest {
            return Err(ToolError::new(
                Code::ProofFailed,
                format!("session {}: the guest has {} messages, the laptop's copy {} (digests {} vs {})", s.id, s.messages, msgs.len(), &s.digest[..12], &digest[..12]),
            ));
        }
        if s.parent.is_some() && back["info"]["parentID"].as_str() != s.parent.as_deref() {
            return Err(ToolError::new(Code::ProofFailed, format!("session {} lost its parent on import", s.id)));
        }
        proofs.push(SessionProof { id: s.id.clone(), parent_id: s.parent.clone(), messages: s.messages, digest: s.digest.clone(), file: Some(name) });
        report.push(json!({ "id": s.id, "parentId": s.parent, "messages": s.messages, "digest": s.digest, "imported": true }));
    }
    Ok((proofs, report))
}

/// With `fetchCommits`: fetch the work's commits from the ledger's bundle into the
/// project's repository as `refs/boxd/<work>` (HEAD) — a ref of our own namespace, no
/// branch or work tree touched. Not a repository, or no git: said, not failed; the
/// bundle in the ledger already holds every commit.
fn fetch_commits<P: Programs>(programs: &mut P, w: &Work, bundle: &str) -> Value {
    let refname = format!("refs/boxd/{}", w.work);
    let req = RunRequest {
        program: "git".into(),
        args: ["fetch", "--quiet", "--no-tags", bundle, &format!("+HEAD:{refname}")].iter().map(|a| a.to_string()).collect(),
        stdin: None,
        env: Vec::new(),
        cwd: Some(w.directory.clone()),
        timeout_ms: 120_000,
        ..Default::default()
    };
    match programs.run(&req) {
        Ok(out) if out.exit_code == Some(0) => json!({ "ref": refname }),
        Ok(out) => json!({ "ref": Value::Null, "reason": format!("git fetch into {}: {}", w.directory, tail(&out.stderr)) }),
        Err(SpawnError::NotAllowed(m)) | Err(SpawnError::NotFound(m)) => json!({ "ref": Value::Null, "reason": format!("no git on this laptop for the host to grant ({m})") }),
        Err(SpawnError::TimedOut) => json!({ "ref": Value::Null, "reason": "git fetch did not finish within 120 s" }),
        Err(SpawnError::Failed(m)) => json!({ "ref": Value::Null, "reason": format!("could not run git: {m}") }),
    }
}

/// The warning boxd_sleep leaves when it puts down an unharvested work; a proof covering
/// every prompt resolves it.
pub const UNHARVESTED_SLEEP: &str = "before the newest prompt was harvested";

pub fn run(env: &mut Env, args: &Value) -> ToolResult<Value> {
    let (work, machine) = work_arg(args)?;
    let wanted = super::guest_paths_arg(args, "files")?;
    let w = Ledger::for_call(&mut env.files, env.ctx).require(&work)?;
    super::require_open(&w)?;
    let dest_dir = destination(env, args, &w)?;
    let w = sweep_temps(env, w)?;
    let (w, export, sessions) = export(env, w, &wanted)?;
    let (w, report) = prove(env, w, &export, &sessions)?;
    let (w, landing) = landing(env, w, &wanted, &dest_dir)?;
    let (w, git, fetched, arrived) = match record_git(env, w, &wanted, &landing) {
        Ok(r) => r,
        Err(e) => return Err(discard(env, &landing, e)),
    };
    let (w, written) = match bring_files(env, w, &git, &landing, arrived) {
        Ok(r) => r,
        Err(e) => return Err(discard(env, &landing, e)),
    };
    let mut git_json = match &w.git {
        Some(g) => json!({ "repo": true, "head": g.head, "branch": g.branch, "dirty": g.dirty, "patch": g.patch, "bundle": g.bundle,
            "untracked": g.untracked.iter().map(|e| e.path.clone()).collect::<Vec<_>>(),
            "ignored": g.ignored.iter().map(|e| e.path.clone()).collect::<Vec<_>>() }),
        None => json!({ "repo": false, "warning": "GIT_UNKNOWN: the work tree is not a git repository, so boxd_drop will refuse it" }),
    };
    if let Some(f) = fetched {
        git_json["fetched"] = f;
    }
    let mut answer = json!({
        "work": work,
        "machine": machine,
        "proven": w.proven(),
        "prompts": w.prompts.len(),
        "sessions": report,
        "git": git_json,
        "files": written,
        "owed": w.owed,
        "next": "The transcript is on this laptop. boxd_sleep keeps the machine; boxd_drop destroys it once everything is accounted for.",
    });
    // A fork's sessions are its own; this links them to where it came from: the parent
    // work, the prompt it forked at and the parent's sessions as proven then.
    if let Some(f) = &w.fork {
        answer["forkOf"] = json!({ "work": f.parent, "atPrompt": f.at_prompt, "parentSessions": f.inherited.keys().collect::<Vec<_>>() });
    }
    Ok(answer)
}

/// The laptop folder the files come home to: `to`, else the work's folder; inside the
/// project or an allowed root either way.
fn destination(env: &Env, args: &Value, w: &Work) -> ToolResult<String> {
    let ctx = env.ctx;
    let roots = laptop_roots(ctx);
    let dest_dir = match args.get("to").and_then(Value::as_str) {
        Some(t) => paths::laptop_path(t, &ctx.project, &roots)?,
        None => w.directory.clone(),
    };
    if !roots.iter().any(|r| paths::is_within(&dest_dir, r)) {
        return Err(ToolError::new(Code::PathRefused, format!("the work's folder {dest_dir} is outside the project and the allowed roots")));
    }
    Ok(dest_dir)
}

/// Phase 1: the machine is ours and up; the wanted files are owed from now; the guest
/// exports its session tree (one exec), which is checked and ordered parents first.
fn export(env: &mut Env, w: Work, wanted: &[String]) -> ToolResult<(Work, Value, Vec<Exported>)> {
    let (ctx, now) = (env.ctx, env.now());
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    running_state(&mut boxd, &w)?;
    if !wanted.is_empty() {
        // Owed from now until they are on the laptop: drop refuses while any is.
        Ledger::for_call(&mut env.files, ctx).update(&w.work, |w| {
            for f in wanted {
                if !w.owed.contains(f) {
                    w.owed.push(f.clone());
                }
            }
        })?;
    }
    let (export, known) = Guest::new(&mut boxd, &w.machine, &w.work).call_resolving("export", &w.unresolved())?;
    let w = if known.is_empty() { w } else { Ledger::for_call(&mut env.files, ctx).update(&w.work, |w| w.resolve_prompts(&known, &now, ctx.now_ms))? };
    let sessions = parse_export(&export)?;
    let admitted = w.prompts.iter().filter(|p| p.admitted).count();
    if admitted > 0 && sessions.first().is_none_or(|s| s.messages == 0) {
        return Err(invalid(format!("{admitted} prompts were admitted but the export holds no messages")));
    }
    Ok((w, export, sessions))
}

/// Phases 2–3: import and verify, then record the proof (before git and files). It covers
/// the prompts up to the newest one the guest had admitted when it exported — not one a
/// concurrent submit recorded but had not delivered yet.
fn prove(env: &mut Env, w: Work, export: &Value, sessions: &[Exported]) -> ToolResult<(Work, Vec<Value>)> {
    let newest = export.get("newestPrompt").and_then(Value::as_str).map(String::from);
    // A guest that admitted none (a rebuilt machine holds the restored transcript) covers
    // what the last proof did.
    let before = w.proofs.last().map_or(0, |p| p.prompts);
    let covered = match newest.as_ref().and_then(|id| w.prompts.iter().position(|p| &p.id == id)) {
        Some(i) => (i as u64 + 1).max(before),
        None => before,
    };
    let (proofs, report) = import_and_prove(env, &w, sessions)?;
    let now = env.now();
    let w = Ledger::for_call(&mut env.files, env.ctx).update(&w.work, |w| {
        w.proofs.push(Proof { at: now, prompts: covered, sessions: proofs, newest_prompt: newest });
        if w.proven() {
            w.warnings.retain(|t| !t.contains(UNHARVESTED_SLEEP));
        }
    })?;
    Ok((w, report))
}

/// Where one wanted file lands: its work-tree path, its laptop destination, and the new
/// temp file beside it that the host streams its bytes into.
struct Landing {
    rel: String,
    dest: String,
    temp: String,
}

/// The landing of every wanted file, its folder created: the host writes only into an
/// existing folder. The temp names carry this call's mark (from the host's entropy) and
/// are recorded in the ledger before the host creates them.
fn landing(env: &mut Env, w: Work, wanted: &[String], dest_dir: &str) -> ToolResult<(Work, Vec<Landing>)> {
    let roots = laptop_roots(env.ctx);
    let mark = &sha256_hex(&[env.ctx.entropy.as_slice(), b"harvest-files"].concat())[..12];
    let mut out = Vec::new();
    for (i, want) in wanted.iter().enumerate() {
        let rel = paths::guest_relative(want)?;
        let dest = paths::laptop_path(&rel, dest_dir, &roots)?;
        let parent = paths::parent(&dest).to_string();
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
    let temps: Vec<TempFile> = out.iter().map(|l| TempFile { path: l.temp.clone(), at_ms }).collect();
    let w = Ledger::for_call(&mut env.files, env.ctx).update(&w.work, |w| w.temps.extend(temps))?;
    Ok((w, out))
}

/// A harvest that stops after the files arrived removes their temp files: each stays owed.
/// (Their names stay recorded until the next harvest sweeps them: a record write here
/// could fail too, and removing an absent file is harmless.)
fn discard(env: &mut Env, landing: &[Landing], e: ToolError) -> ToolError {
    for l in landing {
        let _ = env.files.remove_file(&l.temp);
    }
    e
}

/// How long a recorded temp file may belong to a harvest still running: its files arrive
/// within two helper execs of (120 + 30) s and an upload; ten minutes is past all of them.
const TEMP_LIVE_MS: u64 = 10 * 60 * 1000;

/// Remove the temp files an earlier harvest of this work recorded and did not clear (its
/// host was killed while the files streamed, or before they were renamed): they are this
/// plugin's own, named in the ledger before they were made, and nothing else is touched.
/// One may still belong to a harvest running now: that harvest's files are owed, so with
/// nothing owed every recorded temp is dead; otherwise only those older than TEMP_LIVE_MS.
pub fn sweep_temps(env: &mut Env, w: Work) -> ToolResult<Work> {
    let now = env.ctx.now_ms;
    let dead: Vec<String> = w
        .temps
        .iter()
        .filter(|t| w.owed.is_empty() || now.saturating_sub(t.at_ms) > TEMP_LIVE_MS)
        .map(|t| t.path.clone())
        .collect();
    if dead.is_empty() {
        return Ok(w);
    }
    for temp in &dead {
        if let Ok(Some(m)) = env.files.stat(temp) {
            if m.kind == Kind::File {
                let _ = env.files.remove_file(temp);
            }
        }
    }
    Ledger::for_call(&mut env.files, env.ctx).update(&w.work, |w| w.temps.retain(|t| !dead.contains(&t.path)))
}

/// Phase 4: the guest's git state and every commit (as a bundle), with the wanted files
/// streamed by the host in the same exec; recorded in the ledger, and fetched into the
/// project with `fetchCommits`. Returns the guest's answer (which lists the files), what
/// the fetch did, and the files that arrived.
fn record_git(env: &mut Env, w: Work, wanted: &[String], landing: &[Landing]) -> ToolResult<(Work, Value, Option<Value>, Vec<Streamed>)> {
    let (ctx, now) = (env.ctx, env.now());
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    let have = w.git.as_ref().filter(|g| g.bundle.is_some()).map(|g| g.refs.clone()).unwrap_or_default();
    let stdin = serde_json::to_vec(&json!({ "files": wanted, "haveRefs": have })).expect("serialises");
    let streams = Streams { stdin_files: Vec::new(), stdout_files: landing.iter().map(|l| l.temp.clone()).collect() };
    let (git, arrived) = Guest::new(&mut boxd, &w.machine, &w.work).call_streaming("git", &["--files-stdin"], Some(stdin), &streams)?;
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    let record = super::account::record(&mut ledger, &w, &git, &now)?;
    let w = ledger.update(&w.work, |w| w.git = record.clone())?;
    let fetched = match record.and_then(|r| r.bundle) {
        Some(bundle) if ctx.options.fetch_commits => Some(fetch_commits(&mut env.programs, &w, &format!("{}/{bundle}", ledger.work_dir(&w.work)))),
        _ => None,
    };
    Ok((w, git, fetched, arrived))
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
fn bring_files(env: &mut Env, w: Work, git: &Value, landing: &[Landing], arrived: Vec<Streamed>) -> ToolResult<(Work, Vec<Value>)> {
    let listed: Vec<&Value> = git["files"].as_array().into_iter().flatten().collect();
    if listed.len() != landing.len() || arrived.len() != landing.len() {
        return Err(invalid(format!("{} files were asked for; the guest listed {} and {} arrived", landing.len(), listed.len(), arrived.len())));
    }
    let mut incoming = Vec::new();
    for ((f, l), got) in listed.iter().zip(landing).zip(arrived) {
        let rel = paths::guest_relative(f["path"].as_str().unwrap_or_default())?;
        if rel != l.rel || got.path != l.temp {
            return Err(invalid(format!("the guest sent {rel} where {} was asked for", l.rel)));
        }
        incoming.push(Incoming { landing: l, size: got.size, sha256: got.sha256 });
    }
    let mut places = Vec::new();
    for file in &incoming {
        places.push(check_overwrite(env, &w, file)?);
    }
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
        records.push(FileRecord { guest: rel.clone(), laptop: dest.clone(), size, sha256: sha256.clone(), at: now.clone() });
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
/// `<temp>.kept`: never removed) or a new file appeared once it was aside.
fn replace_unchanged(env: &mut Env, temp: &str, dest: &str, last: &str) -> Result<bool, crate::caps::FsError> {
    let aside = format!("{temp}.kept");
    if !env.files.rename(dest, &aside)? {
        return env.files.place_new(temp, dest);
    }
    if env.files.sha256(&aside)?.as_deref() != Some(last) {
        let _ = env.files.place_new(&aside, dest);
        return Ok(false);
    }
    env.files.remove_file(&aside)?;
    env.files.place_new(temp, dest)
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
            let last = w.files_out.iter().rev().find(|r| &r.laptop == dest);
            // The laptop file is hashed (in pieces, never whole in the component) only when
            // its size could match the incoming bytes or the last ones brought there:
            // another size is a conflict.
            let may_match = m.size == file.size || last.is_some_and(|r| r.size == m.size);
            let current = if may_match { env.files.sha256(dest).ok().flatten().unwrap_or_default() } else { String::new() };
            let last = last.map(|r| r.sha256.clone());
            if &current != sha && last.as_deref() != Some(current.as_str()) {
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
    let newest = |records: &[FileRecord]| records.iter().filter(|r| r.laptop == dest).max_by(|a, b| a.at.cmp(&b.at)).cloned();
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
mod tests {
    use super::*;

    fn session(id: &str, parent: Option<&str>, n: usize) -> Value {
        let msgs: Vec<Value> = (0..n).map(|i| json!({ "info": { "id": format!("msg_{id}_{i}"), "role": "user" }, "parts": [{ "id": format!("prt_{i}"), "type": "text", "text": "hi" }] })).collect();
        json!({ "info": { "id": id, "parentID": parent }, "messages": msgs })
    }

    /// MemFiles where another harvest lands `dest` just before this one places its file
    /// there (after the check found nothing): two works harvesting one path at once.
    struct LandsFirst {
        inner: crate::testing::MemFiles,
        dest: &'static str,
    }

    impl crate::caps::Files for LandsFirst {
        fn read(&mut self, p: &str) -> Result<Option<Vec<u8>>, crate::caps::FsError> { self.inner.read(p) }
        fn write_atomic(&mut self, p: &str, b: &[u8]) -> Result<(), crate::caps::FsError> { self.inner.write_atomic(p, b) }
        fn create_dir_all(&mut self, p: &str) -> Result<(), crate::caps::FsError> { self.inner.create_dir_all(p) }
        fn list(&mut self, d: &str) -> Result<Vec<String>, crate::caps::FsError> { self.inner.list(d) }
        fn stat(&mut self, p: &str) -> Result<Option<crate::caps::Meta>, crate::caps::FsError> { self.inner.stat(p) }
        fn remove_file(&mut self, p: &str) -> Result<(), crate::caps::FsError> { self.inner.remove_file(p) }
        fn create_new(&mut self, p: &str, b: &[u8]) -> Result<bool, crate::caps::FsError> { self.inner.create_new(p, b) }
        fn rename(&mut self, f: &str, t: &str) -> Result<bool, crate::caps::FsError> {
            // The replace path moves the destination aside first: the user saves just before.
            if f == self.dest {
                self.inner.put(f, b"the user's edit");
            }
            self.inner.rename(f, t)
        }
        fn place_new(&mut self, f: &str, t: &str) -> Result<bool, crate::caps::FsError> {
            if t == self.dest && self.inner.files.get(t).is_none() && !f.ends_with(".kept") {
                self.inner.put(t, b"the other work's result");
            }
            self.inner.place_new(f, t)
        }
    }

    #[test]
    fn a_file_the_user_saved_after_the_check_is_never_replaced() {
        use crate::testing::{raw_context, MemFiles, Scripted};
        let mut files = LandsFirst { inner: MemFiles::new(&["/p", "/l"]), dest: "/p/a.txt" };
        let ctx = crate::tools::context(raw_context("{}", "{}")).unwrap();
        let mut w = Work { work: "w1".into(), machine: "oc-w1".into(), schema: crate::ledger::SCHEMA, ..Default::default() };
        w.owed = vec!["a.txt".into()];
        // This work brought "v1" home there last; the guest now has "v2".
        files.inner.put("/p/a.txt", b"v1");
        w.files_out.push(crate::ledger::FileRecord { guest: "a.txt".into(), laptop: "/p/a.txt".into(), size: 2, sha256: crate::encode::sha256_hex(b"v1"), at: String::new() });
        let landing = vec![Landing { rel: "a.txt".into(), dest: "/p/a.txt".into(), temp: "/p/a.txt.x-0.boxd-tmp".into() }];
        files.inner.put(&landing[0].temp, b"v2");
        let arrived = vec![Streamed { path: landing[0].temp.clone(), size: 2, sha256: crate::encode::sha256_hex(b"v2") }];
        Ledger::new(&mut files, "/l").write(&w).unwrap();
        let git = json!({ "files": [{ "path": "a.txt" }] });
        let mut programs = Scripted::default();
        let mut env = Env { programs: &mut programs, files: &mut files, ctx: &ctx };
        let e = bring_files(&mut env, w, &git, &landing, arrived).unwrap_err();
        assert!(e.code == Code::FileConflict && e.message.contains("changed while this harvest landed"), "{e:?}");
        assert_eq!(files.inner.text("/p/a.txt").as_deref(), Some("the user's edit"), "the edit is back in place");
        assert!(files.inner.files.keys().all(|k| !k.ends_with(".kept")), "nothing left aside");
    }

    #[test]
    fn a_file_landed_by_another_harvest_after_the_check_is_never_replaced() {
        use crate::testing::{raw_context, MemFiles, Scripted};
        let mut files = LandsFirst { inner: MemFiles::new(&["/p", "/l"]), dest: "/p/b.txt" };
        let ctx = crate::tools::context(raw_context("{}", "{}")).unwrap();
        let mut w = Work { work: "w1".into(), machine: "oc-w1".into(), schema: crate::ledger::SCHEMA, ..Default::default() };
        w.owed = vec!["a.txt".into(), "b.txt".into()];
        let landing: Vec<Landing> = ["a", "b"].iter().map(|n| Landing { rel: format!("{n}.txt"), dest: format!("/p/{n}.txt"), temp: format!("/p/{n}.txt.x-0.boxd-tmp") }).collect();
        let mut arrived = Vec::new();
        for l in &landing {
            files.inner.put(&l.temp, l.rel.as_bytes());
            arrived.push(Streamed { path: l.temp.clone(), size: l.rel.len() as u64, sha256: crate::encode::sha256_hex(l.rel.as_bytes()) });
        }
        Ledger::new(&mut files, "/l").write(&w).unwrap();
        let git = json!({ "files": [{ "path": "a.txt" }, { "path": "b.txt" }] });
        let mut programs = Scripted::default();
        let mut env = Env { programs: &mut programs, files: &mut files, ctx: &ctx };
        let e = bring_files(&mut env, w, &git, &landing, arrived).unwrap_err();
        assert_eq!(e.code, Code::FileConflict, "{e:?}");
        assert!(e.message.contains("appeared while this harvest landed"), "{}", e.message);
        assert_eq!(files.inner.text("/p/b.txt").as_deref(), Some("the other work's result"), "never replaced");
        assert_eq!(files.inner.text("/p/a.txt").as_deref(), Some("a.txt"), "the file before it landed");
        let w = Ledger::new(&mut files, "/l").require("w1").unwrap();
        assert_eq!(w.owed, ["b.txt"], "the one that did not land stays owed");
        assert_eq!(w.files_out.iter().map(|r| r.guest.as_str()).collect::<Vec<_>>(), ["a.txt"], "the one that landed is recorded");
    }

    #[test]
    fn export_is_ordered_parents_first() {
        let v = json!({ "sessions": [session("ses_root", None, 2), session("ses_grandchild", Some("ses_child"), 1), session("ses_child", Some("ses_root"), 3)] });
        let s = parse_export(&v).unwrap();
        let ids: Vec<&str> = s.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["ses_root", "ses_child", "ses_grandchild"]);
        assert_eq!(s[1].messages, 3);
    }

    #[test]
    fn orphans_and_malformed_exports_are_refused() {
        let v = json!({ "sessions": [session("ses_root", None, 1), session("ses_x", Some("ses_missing"), 1)] });
        assert_eq!(parse_export(&v).err().unwrap().code, Code::ParentMissing);
        let v = json!({ "sessions": [{ "info": { "id": "ses_a" }, "messages": [{ "info": {} }] }] });
        assert_eq!(parse_export(&v).err().unwrap().code, Code::ExportInvalid);
        assert_eq!(parse_export(&json!({ "nope": 1 })).err().unwrap().code, Code::ExportInvalid);
    }

    #[test]
    fn digest_ignores_key_order_and_rewritten_paths() {
        let a = json!([{ "info": { "id": "m1", "role": "user", "directory": "/guest" }, "parts": [{ "id": "p1", "type": "text", "text": "x" }] }]);
        let b = json!([{ "parts": [{ "text": "x", "type": "text", "id": "p1" }], "info": { "role": "user", "id": "m1", "directory": "/laptop" } }]);
        assert_eq!(canonical_digest(a.as_array().unwrap()), canonical_digest(b.as_array().unwrap()));
        let c = json!([{ "info": { "id": "m1", "role": "user" }, "parts": [{ "id": "p1", "type": "text", "text": "y" }] }]);
        assert_ne!(canonical_digest(a.as_array().unwrap()), canonical_digest(c.as_array().unwrap()));
    }
}
