//! A change's checks before anyone is asked (the WIT `check`): the refusals `call` would
//! give, reached through reads only. The capabilities a check gets refuse every write and
//! every program but the boxd reads, so a check cannot change anything even by mistake.
//! Tools whose module holds its own `check` (drop, image, submit, fork) share it with
//! their `run`; the rest are here, built from the same helpers their `run` calls.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use serde_json::Value;

use super::machine::owned_state;
use super::{require_open, work_arg, Env};
use crate::boxd::{Boxd, Failure};
use crate::caps::{Files, FsError, Meta, Programs, RunOutput, RunRequest, SpawnError};
use crate::errors::ToolResult;
use crate::ledger::Ledger;

/// The boxd verbs that change nothing: the only programs a check may run.
const BOXD_READS: &[[&str; 2]] = &[["machine", "get"], ["machine", "list"], ["snapshots", "list"]];

/// `Programs` for a check: the boxd reads pass, anything else is refused unrun.
pub struct ReadsOnly<'a>(pub &'a mut dyn Programs);

impl Programs for ReadsOnly<'_> {
    fn run(&mut self, r: &RunRequest) -> Result<RunOutput, SpawnError> {
        let verb = [r.args.first().map(String::as_str), r.args.get(1).map(String::as_str)];
        let read = r.program == "boxd" && BOXD_READS.iter().any(|[a, b]| verb == [Some(*a), Some(*b)]) && r.stdin_files.is_empty() && r.stdout_files.is_empty();
        if !read {
            return Err(SpawnError::Failed(format!("a check runs only boxd reads, not {} {}", r.program, r.args.join(" "))));
        }
        self.0.run(r)
    }
}

/// `Files` for a check: reads pass, every write is refused.
pub struct ReadFiles<'a>(pub &'a mut dyn Files);

fn no_write(path: &str) -> FsError {
    FsError::Refused(format!("a check writes nothing ({path})"))
}

impl Files for ReadFiles<'_> {
    fn read(&mut self, path: &str) -> Result<Option<Vec<u8>>, FsError> {
        self.0.read(path)
    }
    fn sha256(&mut self, path: &str) -> Result<Option<String>, FsError> {
        self.0.sha256(path)
    }
    fn list(&mut self, dir: &str) -> Result<Vec<String>, FsError> {
        self.0.list(dir)
    }
    fn stat(&mut self, path: &str) -> Result<Option<Meta>, FsError> {
        self.0.stat(path)
    }
    fn write_atomic(&mut self, path: &str, _: &[u8]) -> Result<(), FsError> {
        Err(no_write(path))
    }
    fn create_dir_all(&mut self, path: &str) -> Result<(), FsError> {
        Err(no_write(path))
    }
    fn remove_file(&mut self, path: &str) -> Result<(), FsError> {
        Err(no_write(path))
    }
    fn create_new(&mut self, path: &str, _: &[u8]) -> Result<bool, FsError> {
        Err(no_write(path))
    }
    fn rename(&mut self, from: &str, _: &str) -> Result<bool, FsError> {
        Err(no_write(from))
    }
    fn place_new(&mut self, from: &str, _: &str) -> Result<bool, FsError> {
        Err(no_write(from))
    }
}

/// boxd_ensure: the folder, then boxd itself (missing, signed out); a work that will need
/// a new machine needs the golden snapshot.
pub fn ensure(env: &mut Env, args: &Value) -> ToolResult<()> {
    let (work, machine) = work_arg(args)?;
    super::lifecycle::work_directory(env, args)?;
    let ctx = env.ctx;
    let open = Ledger::for_call(&mut env.files, ctx).read(&work)?.filter(|w| !w.is_closed());
    let mut boxd = Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds);
    if boxd.get(&machine).map_err(Failure::into_error)?.is_none() && open.is_none() {
        super::machine::require_golden(&mut boxd, ctx, &machine, super::machine::Build::New { directory: "" })?;
    }
    Ok(())
}

/// boxd_sleep, boxd_harvest: the work is known and open, and its machine (if any) is the
/// one the ledger recorded.
pub fn open_work(env: &mut Env, args: &Value) -> ToolResult<()> {
    owned(env, args, true)
}

/// boxd_resume: the work is known (resume names a dropped one itself), and its machine (if
/// any) is the one the ledger recorded.
pub fn known_work(env: &mut Env, args: &Value) -> ToolResult<()> {
    owned(env, args, false)
}

fn owned(env: &mut Env, args: &Value, open: bool) -> ToolResult<()> {
    let (work, _) = work_arg(args)?;
    let ctx = env.ctx;
    let mut ledger = Ledger::for_call(&mut env.files, ctx);
    let w = ledger.require(&work)?;
    if open {
        require_open(&w)?;
    } else if w.is_closed() {
        return Ok(());
    }
    owned_state(&mut Boxd::new(&mut env.programs, ctx.options.boxd_timeout_seconds), &mut ledger, ctx, &w).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::Code;
    use crate::testing::{open_work, raw_context as raw, MemFiles, Scripted, OURS};
    use crate::tools::{check, registry::TOOLS};

    #[test]
    fn a_check_runs_only_boxd_reads_and_writes_nothing() {
        let (mut p, mut f) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
        let mut r = ReadsOnly(&mut p);
        let exec = RunRequest { program: "boxd".into(), args: alloc::vec!["machine".into(), "exec".into()], ..Default::default() };
        assert!(matches!(r.run(&exec), Err(SpawnError::Failed(_))));
        let version = RunRequest { program: "opencode".into(), args: alloc::vec!["--version".into()], ..Default::default() };
        assert!(matches!(r.run(&version), Err(SpawnError::Failed(_))));
        assert!(p.requests.is_empty(), "refused unrun");
        let mut w = ReadFiles(&mut f);
        assert!(w.create_dir_all("/l/works").is_err() && w.write_atomic("/l/x", b"x").is_err());
        assert!(f.stat("/l/works").unwrap().is_none());
    }

    /// boxd as it is for `open_work`'s w1: its machine running, no snapshots, answered by
    /// verb whatever order a check asks in.
    #[derive(Default)]
    struct ByVerb {
        requests: Vec<RunRequest>,
    }

    impl Programs for ByVerb {
        fn run(&mut self, r: &RunRequest) -> Result<RunOutput, SpawnError> {
            self.requests.push(r.clone());
            let out = match (r.args[0].as_str(), r.args[1].as_str()) {
                ("machine", "get") => OURS.to_string(),
                ("machine", "list") => format!("[{OURS}]"),
                _ => "[]".to_string(),
            };
            Ok(RunOutput { exit_code: Some(0), stdout: out.into_bytes(), stderr: Vec::new(), files: Vec::new() })
        }
    }

    #[test]
    fn every_change_tool_checks_through_reads_only() {
        for t in TOOLS.iter().filter(|t| t.check.is_some()) {
            let mut f = open_work(None);
            let before = (f.files.clone(), f.dirs.clone());
            let mut p = ByVerb::default();
            let args = r#"{"work":"w1","prompt":"x","name":"snap-1","forks":["f1"]}"#;
            let args: Value = serde_json::from_str(args).unwrap();
            let only: serde_json::Map<String, Value> = args.as_object().unwrap().iter().filter(|(k, _)| (t.schema)()["properties"].get(k.as_str()).is_some()).map(|(k, v)| (k.clone(), v.clone())).collect();
            let checked = check(&mut p, &mut f, t.name, &serde_json::to_string(&only).unwrap(), raw("{}", "{}"));
            // An open, proven work on its own running machine: every change may go ahead, so
            // a refusal here would be a false one (a check that tried a write, or a read
            // the wrappers refuse).
            if let Err(e) = &checked {
                panic!("{}: a check refused a call that would succeed: {} {}", t.name, e.code.as_str(), e.message);
            }
            assert_eq!((f.files.clone(), f.dirs.clone()), before, "{} changed a file in its check", t.name);
            for r in &p.requests {
                assert!(r.program == "boxd" && BOXD_READS.iter().any(|v| r.args[..2] == v[..]), "{}: {:?}", t.name, r.args);
            }
        }
    }

    #[test]
    fn a_check_gives_the_refusal_the_call_would() {
        let (mut p, mut f) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
        let e = check(&mut p, &mut f, "boxd_drop", r#"{"work":"nope"}"#, raw("{}", "{}")).unwrap_err();
        assert_eq!(e.code, Code::WorkUnknown);
        let e = check(&mut p, &mut f, "boxd_ensure", r#"{"work":"w1"}"#, raw(r#"{"access":"read-only"}"#, "{}")).unwrap_err();
        assert_eq!(e.code, Code::AccessDenied);
        let e = check(&mut p, &mut f, "boxd_ensure", r#"{"work":"W!"}"#, raw("{}", "{}")).unwrap_err();
        assert_eq!(e.code, Code::NameInvalid);
        p.push_spawn_error(SpawnError::NotFound("boxd".into()));
        let e = check(&mut p, &mut f, "boxd_ensure", r#"{"work":"w1"}"#, raw("{}", "{}")).unwrap_err();
        assert_eq!(e.code, Code::BoxdMissing);
        p.push_fail(1, "error: VM 'oc-w1' not found");
        p.push_exit(0, "[]", "");
        let e = check(&mut p, &mut f, "boxd_ensure", r#"{"work":"w1"}"#, raw("{}", "{}")).unwrap_err();
        assert_eq!(e.code, Code::SnapshotMissing);
        // An unproven work's drop is refused before anyone is asked.
        let mut f = open_work(None);
        let mut w = Ledger::new(&mut f, "/l").require("w1").unwrap();
        w.prompts.push(crate::ledger::Prompt { id: "p1".into(), admitted: true, ..Default::default() });
        Ledger::new(&mut f, "/l").write(&w).unwrap();
        p.push_exit(0, OURS, "");
        assert_eq!(check(&mut p, &mut f, "boxd_drop", r#"{"work":"w1"}"#, raw("{}", "{}")).unwrap_err().code, Code::NotProven);
        // Without approval a check passes: approval is what the host asks for next.
        p.push_exit(0, OURS, "");
        assert!(check(&mut p, &mut f, "boxd_sleep", r#"{"work":"w1"}"#, raw(r#"{"access":"ask-changes"}"#, "{}")).is_ok());
    }
}
