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
}

/// Check every file before any boxd call: a refusal sends nothing. The host checks again
/// as it streams (a file that changed meanwhile fails the spawn).
fn check_files(env: &mut Env, args: &Value) -> ToolResult<Vec<Incoming>> {
    let ctx = env.ctx;
    let mut out = Vec::new();
    let mut total = 0u64;
    for (i, f) in args.get("files").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let from = f.get("from").and_then(Value::as_str).unwrap_or_default();
        let to = paths::guest_relative(f.get("to").and_then(Value::as_str).unwrap_or_default())?;
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
            }
        }
        out.push(Incoming { from: laptop, to });
    }
    Ok(out)
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
    w: crate::ledger::Work,
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
    let w = Ledger::for_call(&mut env.files, ctx).require(&work)?;
    super::require_open(&w)?;
    super::admission::check_lifetime(&w, ctx)?;
    running_state(&mut Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds), &w)?;
    Ok(Admitted { work, machine, prompt, files, w })
}

/// The refusals a submit gives before it records the prompt (see `admit`).
pub fn check(env: &mut Env, args: &Value) -> ToolResult<()> {
    admit(env, args).map(|_| ())
}

pub fn run(env: &mut Env, args: &Value) -> ToolResult<Value> {
    let Admitted { work, machine, prompt, files, w } = admit(env, args)?;
    let now = env.now();
    let ctx = env.ctx;
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);

    // A prompt recorded before its exec whose answer never came (the host was killed, boxd
    // timed out) is the same prompt when it is sent again: it keeps its id, and the guest,
    // which remembers the ids it admitted, does not admit it twice.
    let prompt_sha = sha256_hex(prompt.as_bytes());
    let retry = w.prompts.iter().find(|p| !p.admitted && p.sha256 == prompt_sha).map(|p| p.id.clone());
    let id = match &retry {
        Some(id) => id.clone(),
        None => format!("p{}", &sha256_hex(&[ctx.entropy.as_slice(), b"prompt-id"].concat())[..12]),
    };
    let sent = w.prompts.iter().find(|p| p.id == id).cloned().unwrap_or_else(|| Prompt {
        id: id.clone(),
        at: now.clone(),
        sha256: prompt_sha,
        bytes: prompt.len() as u64,
        admitted: false,
        at_ms: ctx.now_ms,
    });
    if retry.is_none() {
        // Intent before effect: a prompt whose fate is unknown still needs a harvest.
        let p = sent.clone();
        ledger.upsert(&work, |cur| {
            let mut w = cur.ok_or_else(|| ToolError::new(Code::WorkUnknown, format!("the ledger has no work '{work}'")))?;
            if w.state != WorkState::Open {
                return Err(ToolError::with_next(
                    Code::SessionBusy,
                    format!("work '{work}' is {}: a drop is under way or its machine is being created", w.state.as_str()),
                    format!("Call boxd_status in a later turn. A drop that was interrupted is finished by boxd_drop for work '{work}', or its work reopened by boxd_ensure once the drop is 10 minutes old."),
                ));
            }
            w.prompts.push(p);
            Ok(Some(w))
        })?;
    }
    let others: Vec<String> = w.unresolved().into_iter().filter(|p| p != &id).collect();

    // One line of JSON, then one frame per file in the same order.
    let payload = json!({
        "promptId": id,
        "prompt": prompt,
        "resolve": others,
        "files": files.iter().map(|f| json!({ "to": f.to })).collect::<Vec<_>>(),
    });
    let mut stdin = serde_json::to_vec(&payload).expect("serialises");
    stdin.push(b'\n');
    let streams = Streams { stdin_files: files.iter().map(|f| f.from.clone()).collect(), stdout_files: Vec::new() };
    let mut guest = Guest::new(&mut boxd, &machine, &work);
    let (answer, sent_files) = guest.call_streaming("submit", &[], Some(stdin), &streams)?;
    if sent_files.len() != files.len() {
        return Err(ToolError::new(Code::GuestFailed, format!("the host streamed {} of the {} files", sent_files.len(), files.len())));
    }

    let mut known = crate::guest::resolved(&answer);
    known.insert(id.clone(), answer.get("admitted").and_then(Value::as_bool).unwrap_or(true));
    ledger.update(&work, |w| {
        w.asleep_by_tool = false;
        // Whatever another call decided meanwhile, the guest has this prompt: it is ours.
        if !w.prompts.iter().any(|p| p.id == sent.id) {
            w.prompts.push(sent);
        }
        w.resolve_prompts(&known, &now, ctx.now_ms);
        for (f, s) in files.iter().zip(&sent_files) {
            w.files_in.push(FileRecord { guest: f.to.clone(), laptop: f.from.clone(), size: s.size, sha256: s.sha256.clone(), at: now.clone() });
        }
    })?;
    let queued = answer.get("queued").and_then(Value::as_bool).unwrap_or(false);
    Ok(json!({
        "work": work,
        "machine": machine,
        "promptId": id,
        "admitted": true,
        "duplicate": answer.get("duplicate").and_then(Value::as_bool).unwrap_or(false),
        "queued": queued,
        "pending": answer.get("pending").cloned().unwrap_or(json!(0)),
        "files": files.iter().zip(&sent_files).map(|(f, s)| json!({ "to": f.to, "size": s.size, "sha256": s.sha256 })).collect::<Vec<_>>(),
        "next": format!("Call boxd_job for work '{work}' in a later turn; do not wait inside this call."),
    }))
}
