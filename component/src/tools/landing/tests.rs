//! The landing's tests: placements raced by the user or another harvest, and what a
//! killed harvest left behind.

use super::*;

/// MemFiles where `hook(files, op, from, to)` runs just before each rename and place_new
/// (`op` names which): what the user or another call does at that moment.
struct Hooked<H: FnMut(&mut crate::testing::MemFiles, &str, &str, &str)> {
    inner: crate::testing::MemFiles,
    hook: H,
}

impl<H: FnMut(&mut crate::testing::MemFiles, &str, &str, &str)> crate::caps::Files for Hooked<H> {
    fn read(&mut self, p: &str) -> Result<Option<Vec<u8>>, crate::caps::FsError> { self.inner.read(p) }
    fn write_atomic(&mut self, p: &str, b: &[u8]) -> Result<(), crate::caps::FsError> { self.inner.write_atomic(p, b) }
    fn create_dir_all(&mut self, p: &str) -> Result<(), crate::caps::FsError> { self.inner.create_dir_all(p) }
    fn list(&mut self, d: &str) -> Result<Vec<String>, crate::caps::FsError> { self.inner.list(d) }
    fn stat(&mut self, p: &str) -> Result<Option<crate::caps::Meta>, crate::caps::FsError> { self.inner.stat(p) }
    fn remove_file(&mut self, p: &str) -> Result<(), crate::caps::FsError> { self.inner.remove_file(p) }
    fn create_new(&mut self, p: &str, b: &[u8]) -> Result<bool, crate::caps::FsError> { self.inner.create_new(p, b) }
    fn rename(&mut self, f: &str, t: &str) -> Result<bool, crate::caps::FsError> {
        (self.hook)(&mut self.inner, "rename", f, t);
        self.inner.rename(f, t)
    }
    fn place_new(&mut self, f: &str, t: &str) -> Result<bool, crate::caps::FsError> {
        (self.hook)(&mut self.inner, "place_new", f, t);
        self.inner.place_new(f, t)
    }
}

/// MemFiles where another harvest (or the user) lands `lands` at `dest` just before this
/// one places its file there (after the check found nothing), or just before the replace
/// path moves `dest` aside: two works harvesting one path at once, or a save.
fn lands_first(dest: &'static str, lands: &'static [u8]) -> Hooked<impl FnMut(&mut crate::testing::MemFiles, &str, &str, &str)> {
    let hook = move |m: &mut crate::testing::MemFiles, op: &str, f: &str, t: &str| {
        let before_place = op == "place_new" && t == dest && m.files.get(t).is_none() && !f.ends_with(".kept");
        if (op == "rename" && f == dest) || before_place {
            m.put(dest, lands);
        }
    };
    Hooked { inner: crate::testing::MemFiles::new(&["/p", "/l"]), hook }
}

/// /p/a.txt's landing, its temp holding `bytes` as the host streamed them.
fn a_txt_arrived(files: &mut crate::testing::MemFiles, bytes: &[u8]) -> (Vec<Landing>, Vec<Streamed>) {
    let landing = vec![Landing { rel: "a.txt".into(), dest: "/p/a.txt".into(), temp: "/p/a.txt.x-0.boxd-tmp".into() }];
    files.put(&landing[0].temp, bytes);
    let arrived = vec![Streamed { path: landing[0].temp.clone(), size: bytes.len() as u64, sha256: crate::encode::sha256_hex(bytes) }];
    (landing, arrived)
}

/// The harvest of a.txt over /p/a.txt, which this work brought home as "v1" last, with the
/// guest's "v2" arrived for it; `mem` reaches the MemFiles inside `files`. Its error.
fn land_v2_over_v1<F: crate::caps::Files>(files: &mut F, mem: fn(&mut F) -> &mut crate::testing::MemFiles) -> ToolError {
    let ctx = crate::tools::context(crate::testing::raw_context("{}", "{}")).unwrap();
    let mut w = Work { work: "w1".into(), machine: "oc-w1".into(), schema: crate::ledger::SCHEMA, ..Default::default() };
    w.owed = vec!["a.txt".into()];
    mem(files).put("/p/a.txt", b"v1");
    w.files_out.push(crate::ledger::FileRecord { guest: "a.txt".into(), laptop: "/p/a.txt".into(), size: 2, sha256: crate::encode::sha256_hex(b"v1"), at: String::new(), ..Default::default() });
    let (landing, arrived) = a_txt_arrived(mem(files), b"v2");
    Ledger::new(&mut *files, "/l").write(&w).unwrap();
    let git = json!({ "files": [{ "path": "a.txt" }] });
    let mut programs = crate::testing::Scripted::default();
    let mut env = Env { programs: &mut programs, files, ctx: &ctx };
    bring_files(&mut env, w, &git, &landing, arrived).unwrap_err()
}

#[test]
fn a_file_the_user_saved_after_the_check_is_never_replaced() {
    let mut files = lands_first("/p/a.txt", b"the user's edit");
    let e = land_v2_over_v1(&mut files, |f| &mut f.inner);
    assert!(e.code == Code::FileConflict && e.message.contains("changed while this harvest landed"), "{e:?}");
    assert_eq!(files.inner.text("/p/a.txt").as_deref(), Some("the user's edit"), "the edit is back in place");
    assert!(files.inner.files.keys().all(|k| !k.ends_with(".kept")), "nothing left aside");
}

/// The user makes the file this work landed a folder (or a symlink) between the check
/// and the replace: it cannot be hashed once aside, so it is put back as changed.
#[test]
fn a_file_that_stopped_being_a_file_after_the_check_is_put_back_not_left_aside() {
    use crate::testing::MemFiles;
    struct NoLongerAFile(MemFiles);
    impl crate::caps::Files for NoLongerAFile {
        fn read(&mut self, p: &str) -> Result<Option<Vec<u8>>, crate::caps::FsError> { self.0.read(p) }
        fn sha256(&mut self, p: &str) -> Result<Option<String>, crate::caps::FsError> {
            if p.ends_with(".kept") { Err(crate::caps::FsError::Io(format!("{p} is not a regular file"))) } else { self.0.sha256(p) }
        }
        fn write_atomic(&mut self, p: &str, b: &[u8]) -> Result<(), crate::caps::FsError> { self.0.write_atomic(p, b) }
        fn create_dir_all(&mut self, p: &str) -> Result<(), crate::caps::FsError> { self.0.create_dir_all(p) }
        fn list(&mut self, d: &str) -> Result<Vec<String>, crate::caps::FsError> { self.0.list(d) }
        fn stat(&mut self, p: &str) -> Result<Option<crate::caps::Meta>, crate::caps::FsError> { self.0.stat(p) }
        fn remove_file(&mut self, p: &str) -> Result<(), crate::caps::FsError> { self.0.remove_file(p) }
        fn create_new(&mut self, p: &str, b: &[u8]) -> Result<bool, crate::caps::FsError> { self.0.create_new(p, b) }
        fn rename(&mut self, f: &str, t: &str) -> Result<bool, crate::caps::FsError> { self.0.rename(f, t) }
        fn place_new(&mut self, f: &str, t: &str) -> Result<bool, crate::caps::FsError> { self.0.place_new(f, t) }
    }
    let mut files = NoLongerAFile(MemFiles::new(&["/p", "/l"]));
    let e = land_v2_over_v1(&mut files, |f| &mut f.0);
    assert!(e.code == Code::FileConflict && e.message.contains("changed while this harvest landed"), "{e:?}");
    assert_eq!(files.0.text("/p/a.txt").as_deref(), Some("v1"), "what the user has there is back in place");
    assert!(files.0.files.keys().all(|k| !k.ends_with(".kept")), "nothing left aside");
}

#[test]
fn a_file_landed_by_another_harvest_after_the_check_is_never_replaced() {
    use crate::testing::{raw_context, Scripted};
    let mut files = lands_first("/p/b.txt", b"the other work's result");
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
fn the_same_bytes_landed_first_by_another_harvest_of_this_work_are_home() {
    use crate::testing::{raw_context, Scripted};
    let ctx = crate::tools::context(raw_context("{}", "{}")).unwrap();
    // Absent at the check, then the other harvest's copy; and, for a file brought home
    // before, replaced by the other harvest between the check and the move aside.
    for (before, lands) in [(None, b"a.txt" as &'static [u8]), (Some(b"v1" as &[u8]), b"a.txt")] {
        let mut files = lands_first("/p/a.txt", lands);
        let mut w = Work { work: "w1".into(), machine: "oc-w1".into(), schema: crate::ledger::SCHEMA, ..Default::default() };
        w.owed = vec!["a.txt".into()];
        if let Some(b) = before {
            files.inner.put("/p/a.txt", b);
            w.files_out.push(crate::ledger::FileRecord { guest: "a.txt".into(), laptop: "/p/a.txt".into(), size: 2, sha256: crate::encode::sha256_hex(b), at: String::new(), ..Default::default() });
        }
        let (landing, arrived) = a_txt_arrived(&mut files.inner, b"a.txt");
        Ledger::new(&mut files, "/l").write(&w).unwrap();
        let git = json!({ "files": [{ "path": "a.txt" }] });
        let mut programs = Scripted::default();
        let mut env = Env { programs: &mut programs, files: &mut files, ctx: &ctx };
        let (w, written) = bring_files(&mut env, w, &git, &landing, arrived).unwrap();
        assert_eq!(written.len(), 1);
        assert!(w.owed.is_empty(), "home, so not owed");
        assert_eq!(files.inner.text("/p/a.txt").as_deref(), Some("a.txt"));
        assert_eq!(files.inner.files.keys().filter(|k| k.contains("boxd-tmp")).count(), 0, "no temp or aside copy left");
    }
}

/// A work whose last harvest was killed while it replaced /p/a.txt: the file's bytes are
/// aside as `<temp>.kept`, recorded with where they go.
fn killed_mid_replace(files: &mut crate::testing::MemFiles, aside: &[u8]) -> Work {
    let temp = "/p/a.txt.x-0.boxd-tmp";
    let mut w = Work { work: "w1".into(), machine: "oc-w1".into(), schema: crate::ledger::SCHEMA, ..Default::default() };
    w.temps.push(TempFile { path: temp.into(), at_ms: 1, dest: Some("/p/a.txt".into()), sha256: None, ..Default::default() });
    files.put(temp, b"v2");
    files.put(&aside_of(temp), aside);
    Ledger::new(files, "/l").write(&w).unwrap();
    w
}

#[test]
fn what_a_killed_replacement_moved_aside_goes_back_before_anything_else() {
    use crate::testing::{raw_context, MemFiles, Scripted};
    let ctx = crate::tools::context(raw_context("{}", "{}")).unwrap();
    let aside = "/p/a.txt.x-0.boxd-tmp.kept";
    for (at_dest, left) in [(None, None), (Some("a file made since"), Some("the user's edit")), (Some("the user's edit"), None)] {
        let mut files = MemFiles::new(&["/p", "/l"]);
        let w = killed_mid_replace(&mut files, b"the user's edit");
        if let Some(text) = at_dest {
            files.put("/p/a.txt", text.as_bytes());
        }
        let mut programs = Scripted::default();
        let mut env = Env { programs: &mut programs, files: &mut files, ctx: &ctx };
        let w = sweep_temps(&mut env, w).unwrap();
        let said = left_on_laptop(&mut files, &w.temps);
        match (at_dest, left) {
            (None, _) => {
                assert_eq!(files.text("/p/a.txt").as_deref(), Some("the user's edit"), "put back where it was");
                assert!(said.iter().all(|s| !s.contains(".kept")), "{said:?}");
            }
            (Some(other), Some(kept)) => {
                assert_eq!(files.text("/p/a.txt").as_deref(), Some(other), "what is there now is never replaced");
                assert_eq!(files.text(aside).as_deref(), Some(kept), "and the aside copy is never removed");
                assert!(w.temps.iter().any(|t| t.dest.as_deref() == Some("/p/a.txt")), "its record stays");
                assert!(said.iter().any(|s| s.contains(aside) && s.contains("compare the two")), "{said:?}");
            }
            (Some(same), None) => {
                assert_eq!(files.text("/p/a.txt").as_deref(), Some(same));
                assert_eq!(files.text(aside), None, "a copy of what is at its destination is removed");
            }
        }
        assert_eq!(files.text("/p/a.txt.x-0.boxd-tmp"), None, "with nothing owed, the temp is dead and swept");
        assert_eq!(w.temps.is_empty(), left.is_none(), "a record stays only while its aside copy does");
    }
}

#[test]
fn a_temp_record_that_is_not_the_plugins_own_is_never_acted_on() {
    use crate::testing::{raw_context, MemFiles, Scripted};
    let ctx = crate::tools::context(raw_context("{}", "{}")).unwrap();
    let mut files = MemFiles::new(&["/p", "/l"]);
    files.put("/p/notes.md", b"the user's");
    files.put("/p/notes.md.kept", b"the user's too");
    files.put("/p/sub/x.boxd-tmp.kept", b"elsewhere");
    let mut w = Work { work: "w1".into(), machine: "oc-w1".into(), schema: crate::ledger::SCHEMA, ..Default::default() };
    w.temps.push(TempFile { path: "/p/notes.md".into(), at_ms: 1, dest: Some("/p/gone.md".into()), sha256: None, ..Default::default() });
    w.temps.push(TempFile { path: "/p/sub/x.boxd-tmp".into(), at_ms: 1, dest: Some("/p/gone.md".into()), sha256: None, ..Default::default() });
    Ledger::new(&mut files, "/l").write(&w).unwrap();
    let mut programs = Scripted::default();
    let mut env = Env { programs: &mut programs, files: &mut files, ctx: &ctx };
    let w = sweep_temps(&mut env, w).unwrap();
    assert!(w.temps.is_empty(), "the records go");
    assert_eq!(files.text("/p/notes.md").as_deref(), Some("the user's"), "a file not named like a temp is never removed");
    assert_eq!(files.text("/p/notes.md.kept").as_deref(), Some("the user's too"));
    assert_eq!(files.text("/p/sub/x.boxd-tmp.kept").as_deref(), Some("elsewhere"), "nothing is moved to another folder");
    assert_eq!(files.text("/p/gone.md"), None);
}

/// A laptop file that already held the guest's bytes was found, not written: it stays the
/// user's. Before, it was recorded as this work's, and the next harvest replaced it once
/// the guest changed it (the user's only copy gone), where a guest that changed it before
/// the first harvest met a FILE_CONFLICT. A file the user sent with boxd_submit is theirs
/// the same way (`files_in` never lets a harvest replace it).
#[test]
fn a_file_found_holding_the_guests_bytes_stays_the_users() {
    use crate::testing::{raw_context, MemFiles, Scripted};
    let ctx = crate::tools::context(raw_context("{}", "{}")).unwrap();
    for sent in [false, true] {
        let mut files = MemFiles::new(&["/p", "/l"]);
        files.put("/p/a.txt", b"same");
        let mut w = Work { work: "w1".into(), machine: "oc-w1".into(), schema: crate::ledger::SCHEMA, ..Default::default() };
        w.owed = vec!["a.txt".into()];
        if sent {
            w.files_in.push(FileRecord { guest: "a.txt".into(), laptop: "/p/a.txt".into(), size: 4, sha256: crate::encode::sha256_hex(b"same"), at: String::new(), ..Default::default() });
        }
        Ledger::new(&mut files, "/l").write(&w).unwrap();
        let git = json!({ "files": [{ "path": "a.txt" }] });
        let mut programs = Scripted::default();
        let (landing, arrived) = a_txt_arrived(&mut files, b"same");
        let mut env = Env { programs: &mut programs, files: &mut files, ctx: &ctx };
        let (w, written) = bring_files(&mut env, w, &git, &landing, arrived).unwrap();
        assert_eq!(written.len(), 1);
        assert!(w.owed.is_empty(), "home, so no longer owed");
        assert!(w.files_out.len() == 1 && w.files_out[0].found, "{:?}", w.files_out);
        // The guest changes it: the user's file is never replaced.
        let (landing, arrived) = a_txt_arrived(&mut files, b"guest v2");
        let mut env = Env { programs: &mut programs, files: &mut files, ctx: &ctx };
        let e = bring_files(&mut env, w, &git, &landing, arrived).unwrap_err();
        assert!(e.code == Code::FileConflict && e.message.contains("no harvest this ledger recorded wrote it"), "{e:?}");
        assert_eq!(files.text("/p/a.txt").as_deref(), Some("same"), "sent: {sent}");
    }
    // A record an older version wrote has no flag: it was written.
    let old: FileRecord = serde_json::from_str(r#"{"guest":"a","laptop":"/p/a","size":1,"sha256":"x","at":"t"}"#).unwrap();
    assert!(!old.found);
    assert!(!serde_json::to_string(&old).unwrap().contains("found"));
    assert!(serde_json::to_string(&FileRecord { found: true, ..old }).unwrap().contains(r#""found":true"#));
}

/// A harvest killed after it placed /p/a.txt (its arrived digest recorded) and before it
/// recorded it, swept once its temp record is past TEMP_LIVE_MS: the bytes there are the
/// ones it wrote, so they become this work's and the next harvest replaces them. Before,
/// the record was dropped and the next harvest was a FILE_CONFLICT ("no harvest ... wrote
/// it"). A record whose bytes are not there (the user edited it since), or that recorded no
/// digest (a file found there), makes nothing this work's.
#[test]
fn a_killed_harvests_placed_file_stays_this_works_after_the_sweep() {
    use crate::testing::{raw_context, MemFiles, Scripted};
    let mut raw = raw_context("{}", "{}");
    raw.now_ms = TEMP_LIVE_MS + 2;
    let ctx = crate::tools::context(raw).unwrap();
    for (at_dest, sha, replaced) in [(&b"v2"[..], Some(b"v2"), true), (b"the user's edit", Some(b"v2"), false), (b"v2", None, false)] {
        let mut files = MemFiles::new(&["/p", "/l"]);
        files.put("/p/a.txt", at_dest);
        let mut w = Work { work: "w1".into(), machine: "oc-w1".into(), schema: crate::ledger::SCHEMA, ..Default::default() };
        w.owed = vec!["a.txt".into()];
        let sha256 = sha.map(|b| crate::encode::sha256_hex(b));
        w.temps.push(TempFile { path: "/p/a.txt.k-0.boxd-tmp".into(), at_ms: 1, dest: Some("/p/a.txt".into()), guest: Some("a.txt".into()), sha256, ..Default::default() });
        Ledger::new(&mut files, "/l").write(&w).unwrap();
        let mut programs = Scripted::default();
        let mut env = Env { programs: &mut programs, files: &mut files, ctx: &ctx };
        let w = sweep_temps(&mut env, w).unwrap();
        assert!(w.temps.is_empty(), "the dead record goes");
        assert_eq!(w.owed, ["a.txt"], "still owed until a harvest brings the guest's bytes");
        assert_eq!(w.files_out.iter().map(|r| (r.guest.as_str(), r.laptop.as_str(), r.found)).collect::<Vec<_>>(), if replaced { vec![("a.txt", "/p/a.txt", false)] } else { vec![] });
        let (landing, arrived) = a_txt_arrived(&mut files, b"v3");
        let git = json!({ "files": [{ "path": "a.txt" }] });
        let mut env = Env { programs: &mut programs, files: &mut files, ctx: &ctx };
        match bring_files(&mut env, w, &git, &landing, arrived) {
            Ok(_) => assert!(replaced && files.text("/p/a.txt").as_deref() == Some("v3")),
            Err(e) => {
                assert!(!replaced && e.code == Code::FileConflict, "{e:?}");
                assert_eq!(files.files.get("/p/a.txt").map(Vec::as_slice), Some(at_dest), "never replaced");
            }
        }
    }
}

/// The laptop's disk filled while the host wrote the frames: that is said as the laptop's,
/// with what to free, where it was BOXD_FAILED "read the boxd CLI's own message". A full
/// disk boxd itself reports (the machine's) stays BOXD_FAILED.
/// What the harvest's exec, answered each way (`Ok`: the host's words as it failed to run
/// boxd; `Err`: boxd's own stderr as it exits 1), becomes once `discard` has it, after
/// a.txt's bytes arrived in its temp file; and whether that temp file is gone afterwards.
fn discarded(answers: &[Result<&str, &str>]) -> (Vec<ToolError>, bool) {
    use crate::caps::{SpawnError, Streams};
    use crate::testing::{raw_context, MemFiles, Scripted};
    let ctx = crate::tools::context(raw_context("{}", "{}")).unwrap();
    let mut files = MemFiles::new(&["/p", "/l"]);
    let (landing, _) = a_txt_arrived(&mut files, b"half");
    let mut programs = Scripted::default();
    for a in answers {
        match a {
            Ok(host) => programs.push_spawn_error(SpawnError::Failed((*host).into())),
            Err(boxd) => programs.push_fail(1, boxd),
        }
    }
    let streams = Streams { stdin_files: Vec::new(), stdout_files: landing.iter().map(|l| l.temp.clone()).collect(), ..Default::default() };
    let errors = answers
        .iter()
        .map(|_| {
            let e = crate::boxd::Boxd::new(&mut programs, 30).exec_streaming("oc-x", &["true"], None, &streams, 30).unwrap_err().into_error();
            let mut env = Env { programs: &mut Scripted::default(), files: &mut files, ctx: &ctx };
            discard(&mut env, &landing, e)
        })
        .collect();
    (errors, files.text("/p/a.txt.x-0.boxd-tmp").is_none())
}

#[test]
fn a_full_laptop_disk_is_the_laptops_failure_not_boxds() {
    let (errors, temp_gone) = discarded(&[
        Ok("boxd: the files framed on its stdout: cannot write /p/a.txt.x-0.boxd-tmp: No space left on device (os error 28)"),
        Ok("boxd: the files framed on its stdout: ENOSPC: no space left on device, write"),
        Err("error: No space left on device"),
    ]);
    for e in &errors[..2] {
        assert!(e.code == Code::PathRefused && e.message.starts_with("the laptop's disk is full") && e.message.contains("/p ") && e.next.contains("Free space on the laptop"), "{e:?}");
    }
    assert_eq!(errors[2].code, Code::BoxdFailed, "{:?}", errors[2]);
    assert!(temp_gone, "the temp file is removed");
}

/// A folder on the way changed after the harvest checked it, so the host refused to make
/// the temp files (a symlink now, gone, read-only): said as the laptop's, with the folder
/// to mend, where it was BOXD_FAILED "read the boxd CLI's own message". A guest frame that
/// arrived damaged stays the guest's (not a laptop path), as does boxd's own refusal.
#[test]
fn a_landing_the_host_refuses_names_the_laptop_folder_not_boxd() {
    let (errors, _) = discarded(&[
        Ok("/p cannot be streamed: a symlink is on the way, or the path is not clean"),
        Ok("/p/gone cannot be streamed: No such file or directory (os error 2)"),
        Ok("/p/ cannot be received: it names no file"),
        Ok("boxd: the files framed on its stdout: cannot create /p/a.txt.x-0.boxd-tmp: Permission denied (os error 13)"),
        Ok("boxd: the files framed on its stdout: /p/a.txt.x-0.boxd-tmp arrived damaged: its digest is 00, the sender's 11"),
        Err("error: cannot create /p: Permission denied"),
    ]);
    for e in &errors[..4] {
        assert!(
            e.code == Code::PathRefused && e.message.starts_with("the harvested files could not be written into /p (") && e.message.ends_with("they stay owed") && e.next.contains("make /p a plain writable folder"),
            "{e:?}"
        );
    }
    // A frame the guest damaged is the machine's helper's doing, not the CLI's; the CLI's
    // own error stays its own.
    assert_eq!((errors[4].code, errors[5].code), (Code::GuestFailed, Code::BoxdFailed), "{errors:?}");
}

/// Another call's sweep removes this harvest's temp file between its check and its
/// placement (a harvest that ran past the sweep's age bound): the file this work brought
/// home last goes back where it was, never leaving the destination empty.
#[test]
fn a_temp_swept_away_before_its_placement_leaves_the_old_bytes_in_place() {
    use crate::testing::MemFiles;
    let swept = |m: &mut MemFiles, op: &str, f: &str, _: &str| {
        if op == "rename" && f == "/p/a.txt" {
            m.remove_file("/p/a.txt.x-0.boxd-tmp").unwrap();
        }
    };
    let mut files = Hooked { inner: MemFiles::new(&["/p", "/l"]), hook: swept };
    let e = land_v2_over_v1(&mut files, |f| &mut f.inner);
    assert_eq!(e.code, Code::PathRefused, "{e:?}");
    assert_eq!(files.inner.text("/p/a.txt").as_deref(), Some("v1"), "the old bytes are back in place");
    assert!(files.inner.files.keys().all(|k| !k.ends_with(".kept")), "nothing left aside");
    let w = Ledger::new(&mut files, "/l").read("w1").unwrap().unwrap();
    assert_eq!(w.owed, ["a.txt"], "the file stays owed");
}
