//! boxd_submit's unit tests: retries, duplicates, files, refusals.

use super::*;
use crate::caps::{RunOutput, SpawnError, Streamed};
use crate::ledger::{GitRecord, Work};
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

/// The ledger's files, with one change made by "another call" just before the `n`th time
/// a work's lock is taken (0 = the first): what a second host does between this call's
/// read and its locked update.
struct Between<'a> {
    fs: &'a mut MemFiles,
    n: usize,
    locks: usize,
    change: fn(&mut Work),
}

impl crate::caps::Files for Between<'_> {
    fn read(&mut self, p: &str) -> Result<Option<Vec<u8>>, crate::caps::FsError> {
        self.fs.read(p)
    }
    fn write_atomic(&mut self, p: &str, b: &[u8]) -> Result<(), crate::caps::FsError> {
        self.fs.write_atomic(p, b)
    }
    fn create_dir_all(&mut self, p: &str) -> Result<(), crate::caps::FsError> {
        self.fs.create_dir_all(p)
    }
    fn list(&mut self, p: &str) -> Result<Vec<String>, crate::caps::FsError> {
        self.fs.list(p)
    }
    fn stat(&mut self, p: &str) -> Result<Option<crate::caps::Meta>, crate::caps::FsError> {
        self.fs.stat(p)
    }
    fn remove_file(&mut self, p: &str) -> Result<(), crate::caps::FsError> {
        self.fs.remove_file(p)
    }
    fn create_new(&mut self, p: &str, b: &[u8]) -> Result<bool, crate::caps::FsError> {
        if p.ends_with("/lock") {
            if self.locks == self.n {
                Ledger::new(&mut *self.fs, "/l").update("w1", self.change).unwrap();
            }
            self.locks += 1;
        }
        self.fs.create_new(p, b)
    }
    fn rename(&mut self, a: &str, b: &str) -> Result<bool, crate::caps::FsError> {
        self.fs.rename(a, b)
    }
    fn place_new(&mut self, a: &str, b: &str) -> Result<bool, crate::caps::FsError> {
        self.fs.place_new(a, b)
    }
}

fn prompts(fs: &mut MemFiles) -> Vec<Prompt> {
    Ledger::new(fs, "/l").require("w1").unwrap().prompts
}

/// A prompt another call recorded (its exec still under way) between this call's read and
/// its locked update: this call carries the same id, so the guest admits it once. The old
/// code decided from the read before the lock and recorded a second prompt.
#[test]
fn two_submits_of_one_text_at_once_carry_one_id() {
    let mut fs = open_work(Some(GitRecord::default()));
    let mut p = Scripted::default();
    answered(&mut p, ADMITTED, &[]);
    let other = |w: &mut Work| w.prompts.push(Prompt { id: "pother".into(), sha256: sha256_hex(b"go"), bytes: 2, at_ms: 5, attempt: "theirs".into(), ..Default::default() });
    let mut files = Between { fs: &mut fs, n: 0, locks: 0, change: other };
    let v = call(&mut p, &mut files, "boxd_submit", r#"{"work":"w1","prompt":"go"}"#, raw(1)).unwrap();
    assert_eq!((v["promptId"].as_str(), sent_id(&p).as_str()), (Some("pother"), "pother"), "{v:#}");
    let ps = prompts(&mut fs);
    assert_eq!(ps.len(), 1, "{ps:?}");
    assert!(ps[0].admitted && ps[0].attempt != "theirs", "this call carried it: {ps:?}");
}

/// F1: the first submit ran on after its client gave up and admitted its prompt; the
/// client's retry gets a new id, and the guest (which holds the same text and files still
/// waiting or running) answers it as a duplicate of the first. The laptop records no second
/// prompt and answers with the first id. The payload asks the guest for that rule.
#[test]
fn a_retry_the_guest_holds_under_the_first_id_records_no_second_prompt() {
    let mut fs = open_work(Some(GitRecord::default()));
    fs.put("/p/a.txt", b"one");
    let mut p = Scripted::default();
    answered(&mut p, ADMITTED, &[("/p/a.txt", b"one")]);
    let first = call(&mut p, &mut fs, "boxd_submit", ARGS, raw(1)).unwrap()["promptId"].as_str().unwrap().to_string();
    let mut p = Scripted::default();
    let twin = format!(r#"{{"ok":true,"admitted":true,"duplicate":true,"duplicateOf":"{first}","queued":true,"pending":0,"files":1}}"#);
    answered(&mut p, &twin, &[("/p/a.txt", b"one")]);
    let v = call(&mut p, &mut fs, "boxd_submit", ARGS, raw(2)).unwrap();
    let stdin = p.requests.iter().rev().find_map(|r| r.stdin.clone()).unwrap();
    let line: Value = serde_json::from_slice(stdin.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(line["samePending"], true, "{line}");
    assert_ne!(sent_id(&p), first, "the retry went out under a new id");
    assert_eq!((v["promptId"].as_str(), v["duplicate"].as_bool(), &v["files"]), (Some(first.as_str()), Some(true), &json!([])), "{v:#}");
    assert!(v["next"].as_str().unwrap().contains("once that run has ended, submit the same words again"), "{v:#}");
    let ps = prompts(&mut fs);
    assert_eq!(ps.iter().map(|p| (p.id.as_str(), p.admitted)).collect::<Vec<_>>(), vec![(first.as_str(), true)]);
    assert_eq!(Ledger::new(&mut fs, "/l").require("w1").unwrap().files_in.len(), 1, "only the first placed its file");
}

/// The twin the guest names is not in this record (cut back, or another ledger sent it):
/// the record holds it, admitted, in place of the id the guest did not admit.
#[test]
fn a_twin_this_record_lacks_stands_in_for_ours() {
    let mut fs = open_work(Some(GitRecord::default()));
    let mut p = Scripted::default();
    answered(&mut p, r#"{"ok":true,"admitted":true,"duplicate":true,"duplicateOf":"pelsewhere","queued":true,"pending":1,"files":0}"#, &[]);
    let v = call(&mut p, &mut fs, "boxd_submit", r#"{"work":"w1","prompt":"go"}"#, raw(1)).unwrap();
    assert_eq!(v["promptId"], "pelsewhere", "{v:#}");
    let ps = prompts(&mut fs);
    assert_eq!(ps.iter().map(|p| (p.id.as_str(), p.admitted)).collect::<Vec<_>>(), vec![("pelsewhere", true)]);
}

/// F2: a laptop file the host refuses to stream (gone, or swapped for a symlink, after the
/// component's check) starts no child: PATH_REFUSED naming the file and its next step, no
/// `machine get` after it, and the prompt this call recorded leaves the record. The old
/// code answered BOXD_FAILED ("read the boxd CLI's own message") and left the prompt.
#[test]
fn a_file_the_host_refuses_to_stream_leaves_nothing_recorded() {
    for (words, code) in [
        ("/p/a.txt cannot be streamed: No such file or directory (os error 2)", Code::PathRefused),
        ("/p/a.txt cannot be streamed: a symlink is on the way, or it leads out of its preopened folder", Code::PathRefused),
        ("FILE_TOO_LARGE: /p/a.txt is 9000000 bytes; the cap is 8388608 bytes a file (protocol.json)", Code::FileTooLarge),
        ("boxd: /p/a.txt changed while it was sent (its size, mtime or ctime is not what it was when it was opened)", Code::PathRefused),
    ] {
        let mut fs = open_work(Some(GitRecord::default()));
        fs.put("/p/a.txt", b"one");
        let mut p = Scripted::default();
        p.push_exit(0, OURS, "");
        p.push_spawn_error(SpawnError::Failed(words.into()));
        let e = call(&mut p, &mut fs, "boxd_submit", ARGS, raw(1)).unwrap_err();
        assert_eq!(e.code, code, "{words}: {e:?}");
        assert!(e.message.contains(words.trim_start_matches("FILE_TOO_LARGE: ")) && e.message.contains("admitted nothing"), "{e:?}");
        assert!(e.message.contains("nothing of it is recorded"), "{e:?}");
        if code == Code::PathRefused {
            assert!(e.next.contains("'/p/a.txt'") && e.next.contains("boxd_submit"), "{e:?}");
        }
        assert_eq!(p.requests.len(), 2, "no look at the machine after a refusal: {:?}", p.commands());
        assert!(prompts(&mut fs).is_empty(), "{words}: {:?}", prompts(&mut fs));
    }
}

/// Only a prompt this call recorded and still carries leaves the record: the retry of a
/// lost prompt (the guest may have it from the first try), or one a later retry took over
/// meanwhile (it may be delivering it now), stays.
#[test]
fn a_refusal_never_takes_a_prompt_the_guest_may_have() {
    let mut fs = open_work(Some(GitRecord::default()));
    fs.put("/p/a.txt", b"one");
    let lost_id = lost(&mut fs, ARGS, 1);
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_spawn_error(SpawnError::Failed("/p/a.txt cannot be streamed: No such file or directory (os error 2)".into()));
    let e = call(&mut p, &mut fs, "boxd_submit", ARGS, raw(2)).unwrap_err();
    assert_eq!(e.code, Code::PathRefused, "{e:?}");
    assert!(e.message.contains(&format!("prompt {lost_id} stays recorded")), "{e:?}");
    assert_eq!(prompts(&mut fs).iter().map(|p| p.id.clone()).collect::<Vec<_>>(), vec![lost_id]);

    // Recorded here, then taken over by another call's retry before the refusal came back.
    let mut fs = open_work(Some(GitRecord::default()));
    fs.put("/p/a.txt", b"one");
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_spawn_error(SpawnError::Failed("/p/a.txt cannot be streamed: No such file or directory (os error 2)".into()));
    let took_over = |w: &mut Work| w.prompts.iter_mut().for_each(|p| p.attempt = "a retry".into());
    let mut files = Between { fs: &mut fs, n: 1, locks: 0, change: took_over };
    let e = call(&mut p, &mut files, "boxd_submit", ARGS, raw(3)).unwrap_err();
    assert_eq!(e.code, Code::PathRefused, "{e:?}");
    assert_eq!(prompts(&mut fs).len(), 1, "another call carries it now");
}

/// The guest refuses a submit whose target holds the agent's bytes the laptop lacks
/// (FILE_CONFLICT, `"admitted": false`): the prompt this call recorded leaves the record
/// (it held the drop ten minutes as a prompt whose fate was unknown), the next step says
/// how to keep those bytes, and the payload told the guest the bytes the laptop holds there.
#[test]
fn a_refusal_the_guest_says_admitted_nothing_takes_the_prompt_back() {
    let mut fs = open_work(Some(GitRecord::default()));
    fs.put("/p/a.txt", b"one");
    fs.put("/p/x", b"the agent's bytes, harvested");
    crate::ledger::Ledger::new(&mut fs, "/l")
        .update("w1", |w| w.files_out.push(crate::ledger::FileRecord { guest: "src/a.txt".into(), laptop: "/p/x".into(), sha256: "ab".into(), ..Default::default() }))
        .unwrap();
    let refusal = r#"{"ok":false,"error":"FILE_CONFLICT","message":"the work tree's src/a.txt holds bytes this laptop does not have","path":"src/a.txt","admitted":false}"#;
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_exit(3, refusal, "");
    let e = call(&mut p, &mut fs, "boxd_submit", ARGS, raw(1)).unwrap_err();
    assert_eq!(e.code, Code::FileConflict, "{e:?}");
    assert!(e.next.contains("boxd_harvest for work 'w1'") && e.next.contains("'to'"), "{}", e.next);
    assert!(prompts(&mut fs).is_empty(), "{:?}", prompts(&mut fs));
    let stdin = p.requests.iter().rev().find_map(|r| r.stdin.clone()).unwrap();
    let line: Value = serde_json::from_slice(stdin.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(line["files"], json!([{ "to": "src/a.txt", "held": ["ab"] }]));
    // A refusal that does not say so (an older helper) leaves the prompt for the guest's word.
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_exit(3, &refusal.replace(r#","admitted":false"#, ""), "");
    assert_eq!(call(&mut p, &mut fs, "boxd_submit", ARGS, raw(2)).unwrap_err().code, Code::FileConflict);
    assert_eq!(prompts(&mut fs).len(), 1);
    // The harvested copy deleted on the laptop since: the machine has the only bytes, so
    // the laptop no longer says it holds them (the drop's rule).
    crate::caps::Files::remove_file(&mut fs, "/p/x").unwrap();
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_exit(3, refusal, "");
    call(&mut p, &mut fs, "boxd_submit", ARGS, raw(3)).unwrap_err();
    let stdin = p.requests.iter().rev().find_map(|r| r.stdin.clone()).unwrap();
    let line: Value = serde_json::from_slice(stdin.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(line["files"], json!([{ "to": "src/a.txt", "held": [] }]));
    // Refused because a drop sealed the machine moments ago: no run to wait for.
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_exit(3, r#"{"ok":false,"error":"SESSION_BUSY","message":"work w1 was sealed for a drop moments ago; nothing was admitted","admitted":false}"#, "");
    let e = call(&mut p, &mut fs, "boxd_submit", ARGS, raw(4)).unwrap_err();
    assert!(e.code == Code::SessionBusy && e.next.contains("boxd_ensure for work 'w1'"), "{e:?}");
}

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

/// A sleep's intent recorded before this submit is spent by it (the machine ran the
/// prompt since); one a sleep records while the exec runs is that sleep's, and stays.
#[test]
fn a_submit_spends_an_earlier_sleeps_intent_but_not_one_under_way() {
    use crate::ledger::Sleep;
    let intent = |w: &mut Work| w.sleeping = Some(Sleep { by: "boxd_sleep".into(), at: "asked".into(), ..Default::default() });
    let mut fs = open_work(Some(GitRecord::default()));
    Ledger::new(&mut fs, "/l").update("w1", intent).unwrap();
    let mut p = Scripted::default();
    answered(&mut p, ADMITTED, &[]);
    call(&mut p, &mut fs, "boxd_submit", r#"{"work":"w1","prompt":"go"}"#, raw(1)).unwrap();
    assert_eq!(Ledger::new(&mut fs, "/l").require("w1").unwrap().sleeping, None, "spent");

    let mut fs = open_work(Some(GitRecord::default()));
    let mut p = Scripted::default();
    answered(&mut p, ADMITTED, &[]);
    let mut files = Between { fs: &mut fs, n: 1, locks: 0, change: intent };
    call(&mut p, &mut files, "boxd_submit", r#"{"work":"w1","prompt":"go"}"#, raw(1)).unwrap();
    assert!(Ledger::new(&mut fs, "/l").require("w1").unwrap().sleeping.is_some(), "the sleep under way keeps its intent");
}
