//! boxd_submit: files in, then the prompt, in one exec; returns once the guest has
//! admitted the prompt (queued behind a busy run, or started). Every laptop path and
//! size is checked before anything is sent; the host streams the files' bytes onto the
//! exec's stdin (docs/guest.md, "Frames"), so they never pass through the component.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::{json, Value};

use super::machine::running_state;
use super::{work_arg, Env};
use crate::boxd::Boxd;
use crate::caps::{Kind, Streams};
use crate::encode::sha256_hex;
use crate::errors::{Code, ToolError, ToolResult};
use crate::guest::Guest;
use crate::ledger::{FileRecord, Ledger, Prompt, WorkState};
use crate::paths;

pub const FILE_CAP: u64 = 8 << 20;
pub const CALL_CAP: u64 = 32 << 20;
/// The largest prompt we send; documented in docs/configuration.md.
pub const PROMPT_CAP: usize = 4 << 20;

struct Incoming {
    /// The laptop path the host streams from.
    from: String,
    to: String,
    /// The size the component saw before streaming (part of a retry's key).
    size: u64,
}

/// Check every file before any boxd call: a refusal sends nothing. The host checks again
/// as it streams (a file that changed meanwhile fails the spawn).
fn check_files(env: &mut Env, args: &Value) -> ToolResult<Vec<Incoming>> {
    let ctx = env.ctx;
    let mut out: Vec<Incoming> = Vec::new();
    let mut total = 0u64;
    for (i, f) in args.get("files").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let from = f.get("from").and_then(Value::as_str).unwrap_or_default();
        let to = paths::guest_relative(f.get("to").and_then(Value::as_str).unwrap_or_default())?;
        // What the guest would refuse after the bytes were sent, refused before any is.
        let bad_to = |why: String| ToolError::new(Code::NameInvalid, format!("files[{i}].to '{to}' {why}"));
        if to.split('/').next() == Some(".boxd") {
            return Err(bad_to("is under .boxd, which holds the guest's own state".into()));
        }
        for (j, o) in out.iter().enumerate() {
            if o.to == to {
                return Err(bad_to(format!("is listed twice (files[{j}] names it too)")));
            }
            let under = |a: &str, b: &str| b.len() > a.len() && b.starts_with(a) && b.as_bytes()[a.len()] == b'/';
            if under(&o.to, &to) || under(&to, &o.to) {
                return Err(bad_to(format!("and files[{j}].to '{}' would be a file and a folder at once", o.to)));
            }
        }
        let laptop = super::user_path(ctx, from, &ctx.project)?;
        super::real_folders_on_the_way(env.files, ctx, crate::paths::parent(&laptop), from)?;
        let meta = env.files.stat(&laptop).map_err(|_| refused(from, "cannot be read"))?;
        match meta {
            None => return Err(refused(from, "does not exist")),
            Some(m) if m.kind == Kind::Symlink => return Err(refused(from, "is a symlink, which is never followed")),
            Some(m) if m.kind != Kind::File => return Err(refused(from, "is not a regular file")),
            Some(m) if m.size > FILE_CAP => {
                return Err(ToolError::new(Code::FileTooLarge, format!("files[{i}] {from} is {} bytes; the cap is 8 MiB a file", m.size)));
            }
            Some(m) => {
                total += m.size;
                if total > CALL_CAP {
                    return Err(ToolError::new(Code::FileTooLarge, format!("the files add up to more than 32 MiB (at files[{i}] {from})")));
                }
                out.push(Incoming { from: laptop, to, size: m.size });
            }
        }
    }
    Ok(out)
}

/// A retry's key beside the prompt's digest: each file's target, laptop path and size as
/// checked before streaming, in order; empty when there are none (as in ledgers written
/// before files were part of the key).
fn files_key(files: &[Incoming]) -> String {
    if files.is_empty() {
        return String::new();
    }
    let list: Vec<Value> = files.iter().map(|f| json!([f.to, f.from, f.size])).collect();
    sha256_hex(&serde_json::to_vec(&list).expect("serialises"))
}

/// The exec's failure when the host said for certain that no file of it reached the guest
/// whole (`boxd::UNSENT`): refused before boxd ran, or cut because it changed while it was
/// sent, so the guest admitted nothing. Names the file and its own next step; `fate` says
/// what became of the prompt's record.
fn unsent(e: ToolError, work: &str, files: &[Incoming], fate: &str) -> ToolError {
    let words = e.message.trim_start_matches(crate::boxd::UNSENT);
    let from = files.iter().find(|f| words.contains(f.from.as_str())).map_or("the file", |f| f.from.as_str());
    let message = format!("{words}; the guest admitted nothing and placed no file of this call{fate}");
    let next = if e.code == Code::FileTooLarge {
        String::from(Code::FileTooLarge.next())
    } else if words.contains(crate::boxd::CHANGED) {
        format!("Call boxd_submit for work '{work}' again once nothing is writing '{from}': it is read and sent afresh.")
    } else {
        format!("Put '{from}' back as a regular file (no symlink on the way) inside the project or an allowed root, then call boxd_submit for work '{work}' again.")
    };
    ToolError::with_next(e.code, message, next)
}

/// A refusal the guest gave before it admitted the prompt. FILE_CONFLICT: a target holds
/// the agent's bytes that this laptop does not have, which the code's own next step (about
/// a laptop file) does not say how to keep.
fn guest_refused(e: ToolError, work: &str) -> ToolError {
    if e.code == Code::SessionBusy && e.message.contains("sealed for a drop") {
        // Not a run to wait for: a drop checked the machine and was refused moments ago.
        return ToolError::with_next(e.code, e.message, format!("Call boxd_ensure for work '{work}' (it reopens the work at once), then submit again; or submit again in a minute."));
    }
    if e.code != Code::FileConflict {
        return e;
    }
    ToolError::with_next(
        e.code,
        e.message,
        format!("Call boxd_harvest for work '{work}' with those files (use 'to' for another laptop folder) to bring the machine's copy home, then submit again; or send yours under another name ('to')."),
    )
}

/// A prompt id as the guest helper takes one (`PROMPT_ID_RE` in state.py).
pub(super) fn prompt_id_ok(id: &str) -> bool {
    let b = id.as_bytes();
    (1..=80).contains(&b.len()) && b[0].is_ascii_alphanumeric() && b.iter().all(|c| c.is_ascii_alphanumeric() || b"._-".contains(c))
}

fn refused(path: &str, why: &str) -> ToolError {
    ToolError::new(Code::PathRefused, format!("laptop file '{path}' {why}"))
}

/// What a submit needs before it records anything, read and checked: the prompt, the
/// files (every one before any boxd call), the open work whose machine runs.
struct Admitted {
    work: String,
    machine: String,
    prompt: String,
    files: Vec<Incoming>,
}

fn admit(env: &mut Env, args: &Value) -> ToolResult<Admitted> {
    let (work, machine) = work_arg(args)?;
    let prompt = args.get("prompt").and_then(Value::as_str).unwrap_or_default().to_string();
    if prompt.trim().is_empty() {
        return Err(ToolError::new(Code::ArgsInvalid, "argument 'prompt' is empty"));
    }
    if prompt.len() > PROMPT_CAP {
        return Err(ToolError::with_next(
            Code::FileTooLarge,
            format!("the prompt is {} bytes; the cap is 4 MiB", prompt.len()),
            "Put the bulk of the text in a file and send it with files, then refer to it in a short prompt.",
        ));
    }
    let files = check_files(env, args)?;
    let ctx = env.ctx;
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    let w = ledger.require(&work)?;
    super::require_open(&w)?;
    // A work started in another project (or a folder since moved) is that folder's: a
    // prompt from here went into its session and its files over its tree, and no harvest
    // from here could bring what it made home.
    super::harvest::work_folder_granted(ctx, &w)?;
    super::image::require_not_saving(&w)?;
    super::admission::check_lifetime(&w, ctx)?;
    super::admission::check_spend(&w, ctx)?;
    running_state(&mut Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds), &mut ledger, ctx, &w)?;
    Ok(Admitted { work, machine, prompt, files })
}

/// The refusals a submit gives before it records the prompt (see `admit`).
pub fn check(env: &mut Env, args: &Value) -> ToolResult<()> {
    admit(env, args).map(|_| ())
}

pub fn run(env: &mut Env, args: &Value) -> ToolResult<Value> {
    let Admitted { work, machine, prompt, files } = admit(env, args)?;
    let now = env.now();
    let ctx = env.ctx;
    // Bytes the records say the laptop holds but whose every laptop copy is gone: the
    // machine has the only ones, so they are not `held` (the drop's rule, account.rs).
    let lost = match Ledger::for_call(&mut env.files, ctx).read(&work)? {
        Some(w) => super::account::laptop_lost(&mut env.files, &w),
        None => Default::default(),
    };
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);

    // A prompt recorded before its exec whose answer never came (the host was killed, boxd
    // timed out) is the same prompt when it is sent again with the same files: it keeps its
    // id, and the guest, which remembers the ids it admitted, does not admit it twice. The
    // same text with another file list (a file edited, added or left out) is a new prompt.
    // A prompt recorded with no file key (none, or by a version before the key) matches any
    // list: taken for new, one the guest already ran would run twice, over the files it
    // changed; taken for a retry, the guest's duplicate answer says nothing was placed.
    // Decided inside the locked update, so of two submits of one text at once the second
    // carries the first's id rather than recording a second prompt.
    let prompt_sha = sha256_hex(prompt.as_bytes());
    let files_sha = files_key(&files);
    let attempt = String::from(&sha256_hex(&[ctx.entropy.as_slice(), b"submit-attempt"].concat())[..12]);
    let fresh = Prompt {
        id: format!("p{}", &sha256_hex(&[ctx.entropy.as_slice(), b"prompt-id"].concat())[..12]),
        at: now.clone(),
        sha256: prompt_sha.clone(),
        bytes: prompt.len() as u64,
        admitted: false,
        at_ms: ctx.now_ms,
        files_sha256: files_sha.clone(),
        attempt: attempt.clone(),
        ..Default::default()
    };
    let mut chosen: Option<(Prompt, bool, Vec<String>, Vec<Vec<String>>)> = None;
    // A sleep's intent as this call read it, before its exec (`Work::seen_running`).
    let mut sleeping_then = None;
    let unknown = ledger.unknown(&work);
    ledger.upsert(&work, |cur| {
        let mut w = cur.ok_or(unknown)?;
        if w.state != WorkState::Open {
            return Err(ToolError::with_next(
                Code::SessionBusy,
                format!("work '{work}' is {}: a drop is under way or its machine is being created", w.state.as_str()),
                format!("Call boxd_status in a later turn. A drop that was interrupted is finished by boxd_drop for work '{work}', or its work reopened by boxd_ensure once the drop is 10 minutes old."),
            ));
        }
        // Checked again under the ledger's lock: a boxd_image that recorded its save since
        // `admit` read the record is capturing the machine now.
        super::image::require_not_saving(&w)?;
        sleeping_then = w.sleeping.clone();
        let same_files = |p: &Prompt| p.files_sha256 == files_sha || p.files_sha256.is_empty();
        let (sent, recorded) = match w.prompts.iter_mut().find(|p| !p.admitted && p.sha256 == prompt_sha && same_files(p)) {
            // A retry: this call carries it now, and its exec may take as long as any.
            Some(p) => {
                p.attempt = attempt.clone();
                p.at_ms = p.at_ms.max(ctx.now_ms);
                (p.clone(), false)
            }
            // Intent before effect: a prompt whose fate is unknown still needs a harvest.
            None => {
                w.prompts.push(fresh.clone());
                (fresh.clone(), true)
            }
        };
        let others = w.unresolved().into_iter().filter(|p| p != &sent.id).collect();
        // The bytes the laptop holds at each target (sent there, or brought home from
        // there): the guest replaces a file only when it holds one of these (or its
        // commit does), never the agent's output that no harvest brought home.
        let held = files
            .iter()
            .map(|f| {
                let records = w.files_in.iter().chain(w.files_out.iter()).filter(|r| r.guest == f.to);
                records.filter(|r| !lost.contains_key(&(r.guest.clone(), r.sha256.clone()))).map(|r| r.sha256.clone()).collect()
            })
            .collect();
        chosen = Some((sent, recorded, others, held));
        Ok(Some(w))
    })?;
    let (sent, recorded, others, held) = chosen.expect("the update chose the prompt");
    let id = sent.id.clone();

    // One line of JSON, then one frame per file in the same order. `samePending`: the guest
    // answers an identical prompt (text and files) still waiting or running as a duplicate
    // of that one (`duplicateOf`), so a retry whose first call ran on is not run twice.
    let payload = json!({
        "promptId": id,
        "prompt": prompt,
        "resolve": others,
        "files": files.iter().zip(&held).map(|(f, held)| json!({ "to": f.to, "held": held })).collect::<Vec<_>>(),
        "samePending": true,
    });
    let mut stdin = serde_json::to_vec(&payload).expect("serialises");
    stdin.push(b'\n');
    let streams = Streams { stdin_files: files.iter().map(|f| f.from.clone()).collect(), ..Default::default() };
    // The prompt this call recorded leaves the record, in one locked update, while this
    // call still carries it and nothing has said it arrived (a retry that took it over may
    // be delivering it). True when it left.
    let mut take_back = || {
        let mut taken = false;
        if recorded {
            let _ = ledger.update(&work, |w| {
                if w.prompts.iter().any(|p| p.id == id && !p.admitted && p.attempt == attempt) {
                    w.remove_prompts(core::slice::from_ref(&id));
                    taken = true;
                }
            });
        }
        taken
    };
    let mut guest = Guest::new(&mut boxd, &machine, &work);
    let (answer, sent_files) = match guest.call_streaming("submit", &[], Some(stdin), &streams) {
        Ok(v) => v,
        // The guest refused before admitting it (it says so): the prompt leaves the record
        // instead of holding the drop for ten minutes as a prompt whose fate is unknown.
        Err(e) if guest.refused.as_ref().is_some_and(|r| r.get("admitted") == Some(&Value::Bool(false))) => {
            take_back();
            return Err(guest_refused(e, &work));
        }
        // Nothing reached the guest whole.
        Err(e) if e.message.starts_with(crate::boxd::UNSENT) => {
            let fate = if take_back() {
                String::from(" (nothing of it is recorded)")
            } else {
                format!(" (prompt {id} stays recorded until the machine says whether an earlier or later submit of it arrived)")
            };
            return Err(unsent(e, &work, &files, &fate));
        }
        Err(e) => return Err(e),
    };
    if sent_files.len() != files.len() {
        return Err(ToolError::new(Code::GuestFailed, format!("the host streamed {} of the {} files", sent_files.len(), files.len())));
    }

    // A duplicate: the guest had admitted this prompt id already, or (`duplicateOf`) holds
    // an identical prompt still waiting or running under another id; either way it
    // discarded the frames, so the files streamed now were not placed nor recorded as sent.
    let twin = answer.get("duplicateOf").and_then(Value::as_str).filter(|t| *t != id && prompt_id_ok(t)).map(String::from);
    let duplicate = twin.is_some() || answer.get("duplicate").and_then(Value::as_bool).unwrap_or(false);
    let mut known = crate::guest::resolved(&answer);
    match &twin {
        Some(t) => known.insert(t.clone(), true),
        None => known.insert(id.clone(), answer.get("admitted").and_then(Value::as_bool).unwrap_or(true)),
    };
    ledger.update(&work, |w| {
        w.seen_running(&sleeping_then);
        let ours_carried = w.prompts.iter().any(|p| p.id == id && !p.admitted && p.attempt == attempt);
        match &twin {
            // The guest has the same prompt under its id and admitted nothing under ours.
            Some(t) => {
                if !w.prompts.iter().any(|p| &p.id == t) {
                    // Not in this record (cut back since, or sent by another ledger): it is
                    // the one that runs, so the record holds it.
                    w.prompts.push(Prompt { id: t.clone(), admitted: true, attempt: String::new(), ..sent.clone() });
                }
                if recorded && ours_carried {
                    w.remove_prompts(core::slice::from_ref(&id));
                }
            }
            // Whatever another call decided meanwhile, the guest has this prompt: it is ours.
            None if !w.prompts.iter().any(|p| p.id == id) => w.prompts.push(sent),
            None => {}
        }
        w.resolve_prompts(&known, &now, ctx.now_ms);
        if !duplicate {
            for (f, s) in files.iter().zip(&sent_files) {
                w.files_in.push(FileRecord { guest: f.to.clone(), laptop: f.from.clone(), size: s.size, sha256: s.sha256.clone(), at: now.clone(), ..Default::default() });
            }
        }
    })?;
    let queued = answer.get("queued").and_then(Value::as_bool).unwrap_or(false);
    let placed: Vec<Value> = if duplicate {
        Vec::new()
    } else {
        files.iter().zip(&sent_files).map(|(f, s)| json!({ "to": f.to, "size": s.size, "sha256": s.sha256 })).collect()
    };
    let next = match &twin {
        Some(t) => format!(
            "The guest already holds prompt {t}, with this text and these files, waiting or running (a submit whose answer was lost, or one sent at the same moment); nothing was admitted again and no file was placed now. Call boxd_job for work '{work}' in a later turn; once that run has ended, submit the same words again to run them once more."
        ),
        None if duplicate => format!(
            "The guest had already admitted prompt {id} (an earlier submit of this text and file list whose answer was lost); nothing was admitted again and no file was placed now. Call boxd_job for work '{work}' in a later turn; to send changed files, submit with a changed prompt."
        ),
        None => format!("Call boxd_job for work '{work}' in a later turn; do not wait inside this call."),
    };
    Ok(json!({
        "work": work,
        "machine": machine,
        "promptId": twin.as_deref().unwrap_or(&id),
        "admitted": true,
        "duplicate": duplicate,
        "queued": queued,
        "pending": answer.get("pending").cloned().unwrap_or(json!(0)),
        "files": placed,
        "next": next,
    }))
}

#[cfg(test)]
mod tests;
