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

/// What both hosts say when a file sent on stdin changed between its open and its last
/// byte (host-bridge/src/runtime/frames.rs, host-bridge/opencode/lib/frames.js): they
/// withhold its digest, so the guest refuses the cut frame and admits nothing.
pub const CHANGED_MARK: &str = "changed while it was sent";

/// A stream the host stopped because a file changed under it, as the caller's error.
fn changed_while_sent(e: ToolError, work: &str) -> ToolError {
    if !e.message.contains(CHANGED_MARK) {
        return e;
    }
    ToolError::with_next(
        Code::PathRefused,
        format!("{}; the guest admitted nothing and placed no file of this call", e.message),
        format!("Call boxd_submit for work '{work}' again once nothing is writing the file: it is read and sent afresh."),
    )
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
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    let w = ledger.require(&work)?;
    super::require_open(&w)?;
    super::image::require_not_saving(&w)?;
    super::admission::check_lifetime(&w, ctx)?;
    running_state(&mut Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds), &mut ledger, ctx, &w)?;
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
    // timed out) is the same prompt when it is sent again with the same files: it keeps its
    // id, and the guest, which remembers the ids it admitted, does not admit it twice. The
    // same text with another file list (a file edited, added or left out) is a new prompt.
    // A prompt recorded with no file key (none, or by a version before the key) matches any
    // list: taken for new, one the guest already ran would run twice, over the files it
    // changed; taken for a retry, the guest's duplicate answer says nothing was placed.
    let prompt_sha = sha256_hex(prompt.as_bytes());
    let files_sha = files_key(&files);
    let same_files = |p: &Prompt| p.files_sha256 == files_sha || p.files_sha256.is_empty();
    let retry = w.prompts.iter().find(|p| !p.admitted && p.sha256 == prompt_sha && same_files(p)).map(|p| p.id.clone());
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
        files_sha256: files_sha,
        ..Default::default()
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
            // Checked again under the ledger's lock: a boxd_image that recorded its save
            // since `admit` read the record is capturing the machine now.
            super::image::require_not_saving(&w)?;
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
    let (answer, sent_files) = guest.call_streaming("submit", &[], Some(stdin), &streams).map_err(|e| changed_while_sent(e, &work))?;
    if sent_files.len() != files.len() {
        return Err(ToolError::new(Code::GuestFailed, format!("the host streamed {} of the {} files", sent_files.len(), files.len())));
    }

    // A duplicate: the guest had admitted this prompt id already and discarded the frames,
    // so the files streamed now were not placed and are not recorded as sent.
    let duplicate = answer.get("duplicate").and_then(Value::as_bool).unwrap_or(false);
    let mut known = crate::guest::resolved(&answer);
    known.insert(id.clone(), answer.get("admitted").and_then(Value::as_bool).unwrap_or(true));
    ledger.update(&work, |w| {
        w.asleep_by_tool = false;
        // Whatever another call decided meanwhile, the guest has this prompt: it is ours.
        if !w.prompts.iter().any(|p| p.id == sent.id) {
            w.prompts.push(sent);
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
    let next = if duplicate {
        format!(
            "The guest had already admitted prompt {id} (an earlier submit of this text and file list whose answer was lost); nothing was admitted again and no file was placed now. Call boxd_job for work '{work}' in a later turn; to send changed files, submit with a changed prompt."
        )
    } else {
        format!("Call boxd_job for work '{work}' in a later turn; do not wait inside this call.")
    };
    Ok(json!({
        "work": work,
        "machine": machine,
        "promptId": id,
        "admitted": true,
        "duplicate": duplicate,
        "queued": queued,
        "pending": answer.get("pending").cloned().unwrap_or(json!(0)),
        "files": placed,
        "next": next,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::{RunOutput, SpawnError, Streamed};
    use crate::ledger::GitRecord;
    use crate::testing::{open_work, raw_context, MemFiles, Scripted, OURS};
    use crate::tools::{call, RawContext};
    use alloc::vec;

    const FACTS: &str = r#"{"opencodeVersion":"1.18.33"}"#;

    /// A call's context whose entropy (and so a new prompt id) is `seed`'s.
    fn raw(seed: u8) -> RawContext {
        RawContext { entropy: vec![seed; 32], ..raw_context("{}", FACTS) }
    }

    /// The guest's answer to a submit that streamed `files` (path, bytes) whole.
    fn answered(p: &mut Scripted, answer: &str, files: &[(&str, &[u8])]) {
        p.push_exit(0, OURS, "");
        p.answers.push_back(Ok(RunOutput {
            exit_code: Some(0),
            stdout: answer.as_bytes().to_vec(),
            stderr: Vec::new(),
            files: files.iter().map(|(path, b)| Streamed { path: path.to_string(), size: b.len() as u64, sha256: sha256_hex(b) }).collect(),
        }));
    }

    /// The promptId the last exec sent the guest.
    fn sent_id(p: &Scripted) -> String {
        let stdin = p.requests.iter().rev().find_map(|r| r.stdin.clone()).unwrap();
        let line = stdin.split(|b| *b == b'\n').next().unwrap();
        serde_json::from_slice::<Value>(line).unwrap()["promptId"].as_str().unwrap().to_string()
    }

    /// A submit whose answer was lost (boxd timed out): its prompt stays unanswered.
    fn lost(fs: &mut MemFiles, args: &str, seed: u8) -> String {
        let mut p = Scripted::default();
        p.push_exit(0, OURS, "");
        p.push_spawn_error(SpawnError::TimedOut);
        p.push_exit(0, OURS, "");
        let e = call(&mut p, fs, "boxd_submit", args, raw(seed)).unwrap_err();
        assert_eq!(e.code, Code::Timeout, "{e:?}");
        sent_id(&p)
    }

    const ARGS: &str = r#"{"work":"w1","prompt":"fix it","files":[{"from":"a.txt","to":"src/a.txt"}]}"#;
    const ADMITTED: &str = r#"{"ok":true,"admitted":true,"queued":false,"pending":0,"files":1}"#;

    /// No prompt reaches a machine boxd_image is saving (its save recorded as under way):
    /// SESSION_BUSY naming boxd_image for that name, before any boxd call, and also when the
    /// image records its save while this submit's `machine get` runs (checked again under
    /// the ledger's lock). Before: the prompt ran under the capture.
    #[test]
    fn no_prompt_is_sent_while_a_save_is_under_way() {
        use crate::testing::Shared;
        let mut fs = open_work(None);
        Ledger::new(&mut fs, "/l").update("w1", |w| w.images_pending.push("img".into())).unwrap();
        let mut p = Scripted::default();
        let e = call(&mut p, &mut fs, "boxd_submit", r#"{"work":"w1","prompt":"go"}"#, raw(1)).unwrap_err();
        assert!(e.code == Code::SessionBusy && e.message.contains("saving snapshot 'img'") && e.next.contains("boxd_image for work 'w1' with name 'img'"), "{e:?}");
        assert!(p.commands().is_empty(), "{:?}", p.commands());
        assert!(Ledger::new(&mut fs, "/l").require("w1").unwrap().prompts.is_empty());

        struct ImageDuringTheGet(Scripted, alloc::rc::Rc<core::cell::RefCell<MemFiles>>);
        impl crate::caps::Programs for ImageDuringTheGet {
            fn run(&mut self, r: &crate::caps::RunRequest) -> Result<RunOutput, SpawnError> {
                if r.args.iter().take(2).map(String::as_str).eq(["machine", "get"]) {
                    Ledger::new(&mut *self.1.borrow_mut(), "/l").update("w1", |w| w.images_pending.push("img".into())).unwrap();
                }
                self.0.run(r)
            }
        }
        let shared = alloc::rc::Rc::new(core::cell::RefCell::new(open_work(None)));
        let mut p = ImageDuringTheGet(Scripted::default(), shared.clone());
        p.0.push_exit(0, OURS, "");
        let e = call(&mut p, &mut Shared(shared.clone()), "boxd_submit", r#"{"work":"w1","prompt":"go"}"#, raw(1)).unwrap_err();
        assert_eq!(e.code, Code::SessionBusy, "{e:?}");
        assert_eq!(p.0.commands(), ["machine get oc-w1 --json"], "nothing sent");
        assert!(Ledger::new(&mut *shared.borrow_mut(), "/l").require("w1").unwrap().prompts.is_empty());
    }

    /// The same text with a file of another size is a new prompt, not the lost one's retry;
    /// the same text and files keep the lost prompt's id.
    #[test]
    fn a_retry_is_the_same_prompt_and_the_same_files() {
        let mut fs = open_work(Some(GitRecord::default()));
        fs.put("/p/a.txt", b"one");
        let first = lost(&mut fs, ARGS, 1);
        fs.put("/p/a.txt", b"one, edited");
        let mut p = Scripted::default();
        answered(&mut p, ADMITTED, &[("/p/a.txt", b"one, edited")]);
        let v = call(&mut p, &mut fs, "boxd_submit", ARGS, raw(2)).unwrap();
        assert_ne!(v["promptId"], first.as_str(), "a changed file list is a new prompt: {v:#}");
        assert_eq!(sent_id(&p), v["promptId"].as_str().unwrap());
        assert_eq!(v["duplicate"], false);
        // Sent again unchanged after another lost answer: the same id.
        let again = lost(&mut fs, ARGS, 3);
        let mut p = Scripted::default();
        answered(&mut p, ADMITTED, &[("/p/a.txt", b"one, edited")]);
        let v = call(&mut p, &mut fs, "boxd_submit", ARGS, raw(4)).unwrap();
        assert_eq!(v["promptId"], again.as_str(), "{v:#}");
        // And the same text without files is another prompt again.
        lost(&mut fs, r#"{"work":"w1","prompt":"fix it"}"#, 5);
        let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        assert_eq!(w.prompts.len(), 4, "{:?}", w.prompts);
        // A lost prompt an older version recorded (no file key) is retried by the same text
        // whatever its files: a new id would run it twice if the guest already had it.
        let older = lost(&mut fs, r#"{"work":"w1","prompt":"older","files":[{"from":"a.txt","to":"src/a.txt"}]}"#, 6);
        Ledger::new(&mut fs, "/l").update("w1", |w| w.prompts.iter_mut().for_each(|p| if p.id == older { p.files_sha256.clear() })).unwrap();
        let mut p = Scripted::default();
        answered(&mut p, ADMITTED, &[("/p/a.txt", b"one, edited")]);
        let v = call(&mut p, &mut fs, "boxd_submit", r#"{"work":"w1","prompt":"older","files":[{"from":"a.txt","to":"src/a.txt"}]}"#, raw(7)).unwrap();
        assert_eq!(v["promptId"], older.as_str(), "{v:#}");
    }

    /// A guest that answers duplicate discarded the frames: the answer places no file and
    /// the ledger records none.
    #[test]
    fn a_duplicate_places_and_records_no_file() {
        let mut fs = open_work(Some(GitRecord::default()));
        fs.put("/p/a.txt", b"one");
        let first = lost(&mut fs, ARGS, 1);
        let mut p = Scripted::default();
        answered(&mut p, r#"{"ok":true,"admitted":true,"duplicate":true,"queued":false,"pending":0,"files":1}"#, &[("/p/a.txt", b"two")]);
        let v = call(&mut p, &mut fs, "boxd_submit", ARGS, raw(2)).unwrap();
        assert_eq!((v["promptId"].as_str(), v["duplicate"].as_bool()), (Some(first.as_str()), Some(true)), "{v:#}");
        assert_eq!(v["files"], json!([]), "{v:#}");
        assert!(v["next"].as_str().unwrap().contains("no file was placed"), "{v:#}");
        let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
        assert!(w.files_in.is_empty(), "{:?}", w.files_in);
        assert!(w.prompts.iter().all(|p| p.admitted), "{:?}", w.prompts);
    }

    /// Targets the guest would refuse only after the bytes came are refused before any run.
    #[test]
    fn targets_that_clash_or_name_boxd_are_refused_before_anything_runs() {
        for files in [
            r#"[{"from":"a.txt","to":"n"},{"from":"b.txt","to":"n/b"}]"#,
            r#"[{"from":"a.txt","to":"n/b/c"},{"from":"b.txt","to":"n/b"}]"#,
            r#"[{"from":"a.txt","to":"./x//y"},{"from":"b.txt","to":"x/y"}]"#,
            r#"[{"from":"a.txt","to":"./.boxd/state.json"}]"#,
            r#"[{"from":"a.txt","to":".boxd"}]"#,
        ] {
            let mut fs = open_work(Some(GitRecord::default()));
            fs.put("/p/a.txt", b"a");
            fs.put("/p/b.txt", b"b");
            let mut p = Scripted::default();
            let args = format!(r#"{{"work":"w1","prompt":"go","files":{files}}}"#);
            let e = call(&mut p, &mut fs, "boxd_submit", &args, raw(1)).unwrap_err();
            assert_eq!(e.code, Code::NameInvalid, "{files}: {e:?}");
            assert!(p.requests.is_empty(), "{files}: {:?}", p.commands());
            assert!(Ledger::new(&mut fs, "/l").require("w1").unwrap().prompts.is_empty());
        }
        // Neighbours that only share a prefix of a name are fine.
        let mut fs = open_work(Some(GitRecord::default()));
        fs.put("/p/a.txt", b"a");
        fs.put("/p/b.txt", b"b");
        let mut p = Scripted::default();
        answered(&mut p, ADMITTED, &[("/p/a.txt", b"a"), ("/p/b.txt", b"b")]);
        let args = r#"{"work":"w1","prompt":"go","files":[{"from":"a.txt","to":"n"},{"from":"b.txt","to":"nb/x"}]}"#;
        call(&mut p, &mut fs, "boxd_submit", args, raw(1)).unwrap();
    }

    /// A file the host saw change while it streamed it: a clear refusal naming the next step.
    #[test]
    fn a_file_changed_while_it_was_sent_is_told_as_such() {
        let mut fs = open_work(Some(GitRecord::default()));
        fs.put("/p/a.txt", b"one");
        let mut p = Scripted::default();
        p.push_exit(0, OURS, "");
        p.push_spawn_error(SpawnError::Failed("/p/a.txt changed while it was sent (its size, mtime or ctime is not what it was when opened)".into()));
        p.push_exit(0, OURS, "");
        let e = call(&mut p, &mut fs, "boxd_submit", ARGS, raw(1)).unwrap_err();
        assert_eq!(e.code, Code::PathRefused, "{e:?}");
        assert!(e.message.contains("/p/a.txt changed while it was sent") && e.message.contains("admitted nothing"), "{e:?}");
        assert!(e.next.contains("boxd_submit") && e.next.contains("again"), "{e:?}");
    }
}
