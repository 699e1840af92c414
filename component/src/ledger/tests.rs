//! The ledger's record format and its locked read-modify-write.

use super::*;
use alloc::collections::BTreeMap;
use crate::testing::MemFiles;

#[test]
fn iso_dates() {
    assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(iso8601(1_795_953_600_123), "2026-11-29T12:00:00.123Z");
}

#[test]
fn round_trip_and_listing() {
    let mut fs = MemFiles::new(&["/l"]);
    let mut l = Ledger::new(&mut fs, "/l");
    assert_eq!(l.read("w1").unwrap(), None);
    let w = Work::new("w1", "/p", "t0");
    l.write(&w).unwrap();
    assert_eq!(l.read("w1").unwrap().unwrap(), w);
    assert_eq!(l.ids().unwrap(), ["w1"]);
    assert_eq!(l.require("w2").unwrap_err().code, Code::WorkUnknown);
}

/// A record as ledgers written before the state became an enum hold it: it still
/// reads, and writes back byte for byte.
#[test]
fn an_existing_ledger_record_reads_and_writes_back_unchanged() {
    let old = r#"{
  "schema": 1,
  "work": "w1",
  "machine": "oc-w1",
  "machineId": "vm_1",
  "directory": "/p",
  "createdAt": "2026-01-01T00:00:00.000Z",
  "state": "dropping",
  "prompts": [
{
  "id": "p1",
  "at": "t",
  "sha256": "00",
  "bytes": 2,
  "admitted": true,
  "atMs": 5
}
  ],
  "filesIn": [],
  "filesOut": [],
  "proofs": [],
  "sleeps": [],
  "warnings": [],
  "git": null,
  "helperSha256": null,
  "asleepByTool": false,
  "owed": []
}
"#;
    let mut fs = MemFiles::new(&["/l"]);
    fs.put("/l/works/w1/work.json", old.as_bytes());
    let mut l = Ledger::new(&mut fs, "/l");
    let w = l.require("w1").unwrap();
    assert_eq!((w.state, w.prompts.len()), (WorkState::Dropping, 1));
    for (word, state) in [("creating", WorkState::Creating), ("open", WorkState::Open), ("closed", WorkState::Closed)] {
        let v: Work = serde_json::from_str(&old.replace("\"dropping\"", &format!("\"{word}\""))).unwrap();
        assert_eq!((v.state, v.state.as_str()), (state, word));
    }
    l.write(&w).unwrap();
    assert_eq!(fs.text("/l/works/w1/work.json").unwrap(), old);
}

#[test]
fn a_newer_record_asks_for_an_update_even_with_words_this_plugin_lacks() {
    let mut fs = MemFiles::new(&["/l"]);
    fs.put("/l/works/w1/work.json", br#"{"schema":2,"work":"w1","state":"paused-by-org"}"#);
    let e = Ledger::new(&mut fs, "/l").read("w1").unwrap_err();
    assert_eq!(e.code, Code::LedgerFailed);
    assert!(e.message.contains("schema 2") && e.next.contains("Update the plugin"), "{e:?}");
}

#[test]
fn a_torn_record_is_reported_not_overwritten() {
    let mut fs = MemFiles::new(&["/l"]);
    fs.put("/l/works/w1/work.json", b"{\"schema\":1,\"wor");
    let mut l = Ledger::new(&mut fs, "/l");
    let e = l.read("w1").unwrap_err();
    assert_eq!(e.code, Code::LedgerFailed);
    // Its next step is about the record and the machine it named, not a writable folder
    // and a restart (which changed nothing, and left no way to close the work).
    assert!(e.next.contains("boxd machine get oc-w1") && e.next.contains("move /l/works/w1 out of the ledger"), "{}", e.next);
    assert_eq!(fs.text("/l/works/w1/work.json").unwrap(), "{\"schema\":1,\"wor");
}

#[test]
fn unwritable_ledger_is_ledger_failed() {
    let mut fs = MemFiles::new(&["/l"]);
    fs.broken.insert("/l".into());
    let mut l = Ledger::new(&mut fs, "/l");
    assert_eq!(l.write(&Work::new("w1", "/p", "t")).unwrap_err().code, Code::LedgerFailed);
}

#[test]
fn a_lost_prompt_moves_the_proof_counts_down_with_it() {
    let mut w = Work::new("w1", "/p", "t");
    for (id, admitted) in [("p1", false), ("p2", true), ("p3", true)] {
        w.prompts.push(Prompt { id: id.into(), admitted, ..Default::default() });
    }
    w.proofs.push(Proof { prompts: 2, ..Default::default() });
    let known: BTreeMap<String, bool> = [("p1".to_string(), false)].into_iter().collect();
    w.resolve_prompts(&known, "t", IN_FLIGHT_MS + 1);
    assert_eq!(w.prompts.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["p2", "p3"]);
    assert_eq!(w.proofs[0].prompts, 1, "the proof covered p1 and p2; it now covers p2 only");
    assert!(!w.proven(), "p3 is not proven");
}

/// A prompt the guest never saw leaves the record once no exec can still carry it; one
/// recorded by a clock a day ahead (set right since) did not leave for that day.
#[test]
fn a_prompt_recorded_by_a_clock_far_ahead_is_not_waited_on_for_as_long() {
    let now = 5 * IN_FLIGHT_MS;
    for (at, stays) in [(now - 60_000, true), (now - IN_FLIGHT_MS, false), (now + 60_000, true), (now + 30 * 60_000, true), (now + 86_400_000, false)] {
        let mut w = Work::new("w1", "/p", "t");
        w.prompts.push(Prompt { id: "p1".into(), at_ms: at, ..Default::default() });
        w.resolve_prompts(&[("p1".to_string(), false)].into_iter().collect(), "t", now);
        assert_eq!(w.prompts.len() == 1, stays, "recorded at {at}, now {now}");
    }
}

/// A harvest that proves what the newest proof proved moves its time; any difference (a
/// session grown, a prompt more, another newest prompt, a field a newer host wrote) is a
/// proof of its own, and an older proof equal to the new one is not the newest.
#[test]
fn a_proof_equal_to_the_newest_moves_its_time_instead_of_growing_the_record() {
    let session = |messages| SessionProof { id: "ses_1".into(), messages, digest: "d".into(), file: Some("export-1.json".into()), ..Default::default() };
    let proof = |at: &str, prompts, messages| Proof { at: at.into(), prompts, sessions: alloc::vec![session(messages)], newest_prompt: Some("p1".into()), ..Default::default() };
    let mut w = Work::new("w1", "/p", "t");
    w.record_proof(proof("t1", 1, 2));
    w.record_proof(proof("t2", 1, 2));
    assert_eq!(w.proofs, [proof("t2", 1, 2)]);
    w.record_proof(proof("t3", 1, 3));
    w.record_proof(proof("t4", 2, 3));
    w.record_proof(Proof { newest_prompt: Some("p2".into()), ..proof("t5", 2, 3) });
    assert_eq!(w.proofs.iter().map(|p| p.at.as_str()).collect::<alloc::vec::Vec<_>>(), ["t2", "t3", "t4", "t5"]);
    let mut newer = proof("t6", 1, 2);
    newer.unknown.insert("byNewerHost".into(), serde_json::json!(1));
    w.proofs = alloc::vec![proof("t1", 1, 2), newer.clone()];
    w.record_proof(proof("t7", 1, 2));
    assert_eq!(w.proofs, [proof("t1", 1, 2), newer, proof("t7", 1, 2)]);
}

#[test]
fn proof_must_cover_every_prompt() {
    let mut w = Work::new("w1", "/p", "t");
    assert!(!w.proven());
    w.proofs.push(Proof { prompts: 0, ..Default::default() });
    assert!(w.proven());
    w.prompts.push(Prompt::default());
    assert!(!w.proven());
}

/// The password goes into place whole or not at all: the first call's stands, a crash's
/// empty file (an older plugin's) is replaced, and no temp file is left either way.
#[test]
fn a_password_is_placed_whole_and_the_first_one_stands() {
    let mut fs = MemFiles::new(&["/l"]);
    let first = "a".repeat(32);
    assert_eq!(Ledger::new(&mut fs, "/l").password_or_create("w1", &first).unwrap(), first);
    assert_eq!(Ledger::new(&mut fs, "/l").password_or_create("w1", &"b".repeat(32)).unwrap(), first, "a second call takes the first's");
    fs.put("/l/works/w2/password", b"");
    assert_eq!(Ledger::new(&mut fs, "/l").password_or_create("w2", &"c".repeat(32)).unwrap(), "c".repeat(32), "a crash's empty file is replaced");
    assert!(fs.files.keys().all(|k| !k.contains("boxd-tmp")), "{:?}", fs.files.keys().collect::<Vec<_>>());
}

/// Files whose staged record write is slow enough that a waiter takes the holder's lock
/// for a dead one's, breaks it, and writes its own change in the meantime.
struct LockBrokenMidWrite(MemFiles);

impl crate::caps::Files for LockBrokenMidWrite {
    fn read(&mut self, path: &str) -> Result<Option<Vec<u8>>, FsError> {
        self.0.read(path)
    }
    fn write_atomic(&mut self, path: &str, bytes: &[u8]) -> Result<(), FsError> {
        self.0.write_atomic(path, bytes)?;
        if path.ends_with(".next") {
            self.0.remove_file("/l/works/w1/lock")?;
            let mut other = Ledger { files: &mut self.0, root: "/l".into(), owner: "test:the-waiter".into() };
            other.update("w1", |w| w.warnings.push("the waiter's change".into())).unwrap();
        }
        Ok(())
    }
    fn create_dir_all(&mut self, path: &str) -> Result<(), FsError> {
        self.0.create_dir_all(path)
    }
    fn list(&mut self, dir: &str) -> Result<Vec<String>, FsError> {
        self.0.list(dir)
    }
    fn stat(&mut self, path: &str) -> Result<Option<crate::caps::Meta>, FsError> {
        self.0.stat(path)
    }
    fn remove_file(&mut self, path: &str) -> Result<(), FsError> {
        self.0.remove_file(path)
    }
    fn create_new(&mut self, path: &str, bytes: &[u8]) -> Result<bool, FsError> {
        self.0.create_new(path, bytes)
    }
    fn rename(&mut self, from: &str, to: &str) -> Result<bool, FsError> {
        self.0.rename(from, to)
    }
    fn place_new(&mut self, from: &str, to: &str) -> Result<bool, FsError> {
        self.0.place_new(from, to)
    }
}

/// A holder whose lock was broken while it wrote (a slow sync taken for a dead call) does
/// not rename its record over the change the breaker wrote meanwhile: it fails as a host
/// killed before its write, and leaves no staged copy behind.
#[test]
fn a_write_whose_lock_was_broken_meanwhile_never_lands_over_the_breakers_change() {
    let mut fs = MemFiles::new(&["/l"]);
    Ledger::new(&mut fs, "/l").write(&Work::new("w1", "/p", "t")).unwrap();
    let mut slow = LockBrokenMidWrite(fs);
    let e = Ledger { files: &mut slow, root: "/l".into(), owner: "test:the-holder".into() }.update("w1", |w| w.warnings.push("the holder's change".into())).unwrap_err();
    assert!(e.code == Code::LedgerFailed && e.message.contains("not written"), "{e:?}");
    let mut fs = slow.0;
    assert_eq!(Ledger::new(&mut fs, "/l").require("w1").unwrap().warnings, ["the waiter's change"]);
    assert_eq!(fs.list("/l/works/w1").unwrap(), ["work.json"], "no staged copy or lock is left");
}

/// A record grown (or replaced) past RECORD_MAX is that work's LEDGER_FAILED, named, and
/// never read into memory whole; the other works still read.
#[test]
fn a_record_past_the_size_bound_is_that_works_error_alone() {
    let mut fs = MemFiles::new(&["/l"]);
    Ledger::new(&mut fs, "/l").write(&Work::new("w1", "/p", "t")).unwrap();
    let mut huge = b"{\"schema\":1,\"work\":\"w2\",\"x\":\"".to_vec();
    huge.resize(RECORD_MAX + 1, b'a');
    fs.put("/l/works/w2/work.json", &huge);
    let mut l = Ledger::new(&mut fs, "/l");
    let e = l.summary("w2").unwrap_err();
    assert!(e.code == Code::LedgerFailed && e.message.contains("/l/works/w2/work.json holds more than 64 MiB"), "{e:?}");
    assert!(l.read("w1").unwrap().is_some());
}

/// A record a newer host wrote, with fields this version does not know (at the top and in
/// a prompt, a proof, a temp, the git record and the fork origin): a change made here
/// writes them back as they were.
#[test]
fn fields_a_newer_host_wrote_survive_this_versions_change() {
    // Every record the ledger keeps, down to the smallest.
    const AT: [&str; 13] = ["/prompts/0", "/proofs/0", "/temps/0", "/git", "/fork", "/filesIn/0", "/filesOut/0",
        "/proofs/0/sessions/0", "/sleeps/0", "/git/untracked/0", "/git/ignored/0", "/runs/0", "/settled"];
    let mut fs = MemFiles::new(&["/l"]);
    let mut w = Work::new("w1", "/p", "t");
    w.prompts.push(Prompt { id: "p1".into(), ..Default::default() });
    w.proofs.push(Proof::default());
    w.temps.push(TempFile::default());
    w.git = Some(GitRecord::default());
    w.fork = Some(ForkOrigin::default());
    w.files_in.push(FileRecord::default());
    w.files_out.push(FileRecord::default());
    w.proofs[0].sessions.push(SessionProof::default());
    w.sleeps.push(Sleep::default());
    w.git.as_mut().unwrap().untracked.push(GitEntry::default());
    w.git.as_mut().unwrap().ignored.push(GitEntry::default());
    w.open_run(1);
    w.settled = Some(Default::default());
    let mut v = serde_json::to_value(&w).unwrap();
    v["futureTop"] = serde_json::json!({"kept": [1, 2]});
    for at in AT {
        v.pointer_mut(at).unwrap()["futureInner"] = serde_json::json!(at);
    }
    fs.put("/l/works/w1/work.json", &serde_json::to_vec(&v).unwrap());
    Ledger::new(&mut fs, "/l").update("w1", |w| w.warnings.push("changed here".into())).unwrap();
    let back: serde_json::Value = serde_json::from_slice(&fs.read("/l/works/w1/work.json").unwrap().unwrap()).unwrap();
    assert_eq!(back["futureTop"], serde_json::json!({"kept": [1, 2]}));
    for at in AT {
        assert_eq!(back.pointer(at).unwrap()["futureInner"], serde_json::json!(at), "{at}");
    }
    assert_eq!(back["warnings"], serde_json::json!(["changed here"]));
}

/// A host killed between staging a record and renaming it leaves the staged copy (or its
/// temp); the next writer of that work removes them, and nothing else in the folder.
#[test]
fn a_staged_record_a_killed_host_left_is_removed_by_the_next_write() {
    let mut fs = MemFiles::new(&["/l"]);
    Ledger::new(&mut fs, "/l").write(&Work::new("w1", "/p", "t")).unwrap();
    let left = ["/l/works/w1/work.json.host-dead.next", "/l/works/w1/work.json.host-dead.next.ab12-3.boxd-tmp"];
    let kept = ["/l/works/w1/export-ses_1.json", "/l/works/w1/work.json.bak", "/l/works/w1/notes.next"];
    for p in left.iter().chain(&kept) {
        fs.put(p, b"{}");
    }
    Ledger::new(&mut fs, "/l").update("w1", |w| w.warnings.push("x".into())).unwrap();
    for p in left {
        assert!(fs.read(p).unwrap().is_none(), "{p} stayed");
    }
    for p in kept {
        assert!(fs.read(p).unwrap().is_some(), "{p} was removed");
    }
    assert_eq!(Ledger::new(&mut fs, "/l").require("w1").unwrap().warnings, ["x"]);
}

/// A work folder copied by hand to another id (works/w1 → works/w2, someone else's oc-w2
/// running), or a record whose `machine` was edited: every tool on that id is its
/// LEDGER_FAILED before boxd is asked anything (before: sleep checked oc-w1 and hibernated
/// oc-w2), and status shows it as that row's error, not work 'w1' a second time.
#[test]
fn a_record_that_is_not_its_folders_work_is_ledger_failed_before_boxd_is_asked() {
    use crate::testing::{open_work, raw_context, Scripted};
    use crate::tools::call;
    let copied = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut fs = open_work(None);
        let mut v: serde_json::Value = serde_json::from_str(&fs.text("/l/works/w1/work.json").unwrap()).unwrap();
        edit(&mut v);
        fs.put("/l/works/w2/work.json", v.to_string().as_bytes());
        fs
    };
    let cases: [(&dyn Fn(&mut serde_json::Value), &str, &str); 2] = [
        (&|_| {}, "holds the record of work 'w1' (machine oc-w1), not of work 'w2'", "rename /l/works/w2 to /l/works/w1"),
        (&|v| (v["work"], v["machine"]) = ("w2".into(), "oc-w1".into()), "names machine oc-w1 for work 'w2'", "back to \"oc-w2\""),
    ];
    for (edit, said, next) in cases {
        for (tool, args) in [
            ("boxd_sleep", r#"{"work":"w2"}"#),
            ("boxd_job", r#"{"work":"w2"}"#),
            ("boxd_resume", r#"{"work":"w2"}"#),
            ("boxd_drop", r#"{"work":"w2"}"#),
            ("boxd_submit", r#"{"work":"w2","prompt":"hi"}"#),
            ("boxd_harvest", r#"{"work":"w2"}"#),
            ("boxd_image", r#"{"work":"w2","name":"s1"}"#),
            ("boxd_ensure", r#"{"work":"w2"}"#),
            ("boxd_fork", r#"{"work":"w2","forks":["f1"]}"#),
        ] {
            let mut fs = copied(edit);
            let mut p = Scripted::default();
            let e = call(&mut p, &mut fs, tool, args, raw_context("{}", r#"{"opencodeVersion":"1.18.33"}"#)).unwrap_err();
            assert!(e.code == Code::LedgerFailed && e.message.contains(said) && e.next.contains(next), "{tool}: {e:?}");
            assert!(!p.commands().iter().any(|c| c.starts_with("machine")), "{tool}: boxd was asked {:?}", p.commands());
        }
        let mut fs = copied(edit);
        let mut p = Scripted::default();
        p.push_exit(0, r#"[{"name":"oc-w1","status":"running"},{"name":"oc-w2","status":"running"}]"#, "");
        p.push_exit(0, "[]", "");
        let v = call(&mut p, &mut fs, "boxd_status", "{}", raw_context("{}", "{}")).unwrap();
        let rows = v["works"].as_array().unwrap();
        assert_eq!(rows.len(), 2, "{v:#}");
        assert!(rows[0]["work"] == "w1" && rows[0]["state"] == "running", "{v:#}");
        assert!(rows[1]["work"] == "w2" && rows[1]["error"] == "LEDGER_FAILED" && rows[1]["next"].as_str().unwrap().contains(next), "{v:#}");
    }
}

/// A change that would grow a record past RECORD_MAX is refused and the record stays as it
/// was: written, no call could read it again (a guest's 20 MiB `newestPrompt`, stored in
/// each proof, made every tool on the work LEDGER_FAILED for ever).
#[test]
fn a_record_past_the_bound_is_never_written_and_the_old_one_stays() {
    let mut fs = MemFiles::new(&["/l"]);
    Ledger::new(&mut fs, "/l").write(&Work::new("w1", "/p", "t")).unwrap();
    let huge = "x".repeat(RECORD_MAX);
    let e = Ledger::new(&mut fs, "/l").update("w1", |w| w.warnings.push(huge.clone())).unwrap_err();
    assert_eq!(e.code, Code::LedgerFailed, "{e:?}");
    assert!(e.message.contains("stays as it was") && e.next.contains("boxd_status"), "{e:?}");
    let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    assert!(w.warnings.is_empty());
    Ledger::new(&mut fs, "/l").update("w1", |w| w.warnings.push("small".into())).unwrap();
}

/// A full disk under the ledger says so, with a next step that helps (restarting did not).
#[test]
fn a_full_disk_under_the_ledger_names_freeing_space() {
    let e = ledger_error("write work.json", FsError::Io("insufficient-space: No space left on device".into()));
    assert!(e.code == Code::LedgerFailed && e.message.contains("is full") && e.next.starts_with("Free space"), "{e:?}");
    let e = ledger_error("write work.json", FsError::Io("io: /l/quota/works/w1/work.json".into()));
    assert!(!e.next.starts_with("Free space"), "{e:?}");
}

/// What the ledger's own contents refuse (a symlink, a FIFO, a permission, a file too large
/// to be a record) says so and what to put back: "check that the folder is writable, then
/// restart the host" changed nothing there. The filesystem's own refusal, which names no
/// path, reads as one (it read "not-permitted: … was refused: it is outside …").
#[test]
fn a_ledger_file_changed_from_outside_says_what_to_put_back() {
    let e = ledger_error("write the ledger", FsError::Refused("not-permitted: Operation not permitted".into()));
    assert!(e.message == "could not write the ledger: the laptop refused it (not-permitted: Operation not permitted)" && e.next.contains("Put the work's own file back"), "{e:?}");
    let e = ledger_error("read the ledger", FsError::Refused("/l/works/w1/work.json".into()));
    assert!(e.message.contains("/l/works/w1/work.json was refused") && e.next.contains("symbolic link"), "{e:?}");
    let e = ledger_error("read the ledger", crate::caps::too_large("/l/works/w1/work.json", RECORD_MAX));
    assert!(e.message.contains("holds more than 64 MiB") && e.next.starts_with("Move that file out of the ledger folder"), "{e:?}");
    let e = ledger_error("read the ledger", FsError::Io("io: Input/output error".into()));
    assert_eq!(e.next, Code::LedgerFailed.next(), "{e:?}");
}

/// A work folder that still holds its machine's password but no record: the record was
/// removed from outside. boxd_ensure would call that machine not this ledger's, so the
/// step is to put the record back (it was "call boxd_ensure", which answered NOT_OURS).
#[test]
fn a_record_removed_beside_its_password_says_to_put_it_back() {
    let mut fs = MemFiles::new(&["/l"]);
    let e = Ledger::new(&mut fs, "/l").require("w1").unwrap_err();
    assert_eq!((e.code, e.next.as_str()), (Code::WorkUnknown, Code::WorkUnknown.next()));
    fs.put("/l/works/w1/password", b"secret");
    let e = Ledger::new(&mut fs, "/l").require("w1").unwrap_err();
    assert!(e.code == Code::WorkUnknown && e.next.starts_with("Put /l/works/w1/work.json back"), "{e:?}");
}
