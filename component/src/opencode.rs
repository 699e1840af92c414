//! The laptop's OpenCode, in one adapter beside the boxd one: the version a guest must
//! match, and the `import`/`export` pair harvest proves a transcript with. No tool builds
//! an `opencode` argument list itself.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::Value;

use crate::boxd::first_json;
use crate::caps::{Programs, RunOutput, RunRequest, SpawnError};
use crate::errors::{Code, ToolError, ToolResult};
use crate::guest::tail;
use crate::options::Context;

/// One import or export of a session tree (a large one takes a while to write).
const SESSION_TIMEOUT_MS: u32 = 180_000;
const VERSION_TIMEOUT_MS: u32 = 60_000;

/// The laptop's OpenCode version when the host already knows it: told in its facts, or
/// the host is OpenCode itself. Runs nothing.
pub fn known_version(ctx: &Context) -> Option<String> {
    ctx.facts.opencode_version.clone().or_else(|| (ctx.host_name == "opencode").then(|| ctx.host_version.clone()))
}

/// Whether the laptop's OpenCode holds a session (`Opencode::held`).
#[derive(Debug)]
pub enum Held {
    Absent,
    Copy(Value),
    /// It answered but printed no session: held, contents unknown.
    Unreadable(String),
}

/// How many `opencode export` runs `held` starts side by side (the hosts' run-all bound).
const HELD_BATCH: usize = 4;

/// How many times an `import` or `export` is run while it fails without an answer of
/// OpenCode's own. Two opencode processes that open a data folder no opencode has opened yet
/// race to make its database: the loser fails ("database is locked", or "Failed query:
/// CREATE TABLE …" for a table the other just made), and a run a moment later finds it
/// made. Two harvests at once on a fresh laptop do exactly that.
pub(crate) const TRIES: usize = 3;

/// Drives the laptop's `opencode` CLI through the `Programs` capability.
pub struct Opencode<'a, P: Programs> {
    programs: &'a mut P,
}

/// What the laptop's opencode said went wrong: its first line that names an error, then
/// its last line (a failed query ends with its parameters, which alone say nothing); else
/// its last lines.
fn said(stderr: &[u8]) -> String {
    let text = without_colours(&String::from_utf8_lossy(stderr));
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let Some(i) = lines.iter().position(|l| l.to_ascii_lowercase().contains("error")) else { return tail(stderr) };
    let last = lines.len() - 1;
    let s = if i == last { lines[i].to_string() } else { format!("{} | … | {}", lines[i], lines[last]) };
    crate::redact::cut(&s, 400)
}

/// `text` without terminal colour codes (`ESC [ … m`), which opencode puts around "Error:".
fn without_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("\u{1b}[") {
        out.push_str(&rest[..i]);
        let code = &rest[i + 2..];
        match code.find(|c: char| !(c.is_ascii_digit() || c == ';')) {
            Some(j) if code[j..].starts_with('m') => rest = &code[j + 1..],
            _ => {
                out.push('\u{1b}');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

impl<'a, P: Programs> Opencode<'a, P> {
    pub fn new(programs: &'a mut P) -> Self {
        Self { programs }
    }

    /// The version a guest must run: `known_version`, else `opencode --version`; None when
    /// neither answers.
    pub fn version(&mut self, ctx: &Context) -> Option<String> {
        if let Some(v) = known_version(ctx) {
            return Some(v);
        }
        let req = RunRequest { program: "opencode".into(), args: alloc::vec!["--version".into()], timeout_ms: VERSION_TIMEOUT_MS, ..Default::default() };
        let out = self.programs.run(&req).ok().filter(|o| o.exit_code == Some(0))?;
        let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (!v.is_empty()).then_some(v)
    }

    /// `opencode import FILE` in the work's folder (which names the project it lands in).
    pub fn import(&mut self, file: &str, session: &str, cwd: &str) -> ToolResult<()> {
        let out = self.run(&["import", file], cwd, |_| false)?;
        if out.exit_code != Some(0) {
            return Err(ToolError::new(Code::ImportFailed, format!("opencode import of session {session} failed: {}", said(&out.stderr))));
        }
        Ok(())
    }

    /// `opencode export SESSION`: the laptop's own copy, or PROOF_FAILED when it has none
    /// it can print.
    pub fn export(&mut self, session: &str, cwd: &str) -> ToolResult<Value> {
        let out = self.run(&["export", session], cwd, |o| not_found(&o.stderr, session))?;
        first_json(&out.stdout).filter(|_| out.exit_code == Some(0)).ok_or_else(|| {
            ToolError::new(Code::ProofFailed, format!("the laptop has no readable copy of session {session}: {}", said(&out.stderr)))
        })
    }

    /// Whether the laptop holds each session: `opencode export` of each, up to four side
    /// by side. Only OpenCode's own answer that it has no such session is an absence. Any
    /// other failure (a locked database, a crash, a signal) says nothing either way, and
    /// read as absent it would let the guest's messages be imported into a session the user
    /// holds: the export is run again (`TRIES`), and a failure that stays is IMPORT_FAILED,
    /// with nothing imported.
    pub fn held(&mut self, sessions: &[&str], cwd: &str) -> ToolResult<Vec<Held>> {
        let mut out = Vec::with_capacity(sessions.len());
        for batch in sessions.chunks(HELD_BATCH) {
            let requests: Vec<RunRequest> = batch.iter().map(|id| request(&["export", id], cwd)).collect();
            let first = self.programs.run_all(&requests);
            for ((id, req), r) in batch.iter().zip(&requests).zip(first) {
                let o = r.map_err(|e| spawn_error(e, "export"))?;
                let o = self.again(req, o, |o| not_found(&o.stderr, id))?;
                out.push(match (o.exit_code, first_json(&o.stdout)) {
                    (Some(0), Some(v)) => Held::Copy(v),
                    (Some(0), None) => Held::Unreadable(said(&o.stderr)),
                    (Some(_), _) if not_found(&o.stderr, id) => Held::Absent,
                    (code, _) => {
                        let ended = code.map_or_else(|| "killed by a signal".to_string(), |c| format!("with exit code {c}"));
                        let why = format!(
                            "could not tell whether this laptop's OpenCode already holds session {id}: opencode export ended {ended} without saying it has no such session, {TRIES} times ({}); nothing was imported",
                            said(&o.stderr)
                        );
                        return Err(ToolError::new(Code::ImportFailed, why));
                    }
                });
            }
        }
        Ok(out)
    }

    /// One `opencode` run, run again (`TRIES`) while it fails and `answered` says the
    /// failure is not OpenCode's own answer.
    fn run(&mut self, args: &[&str], cwd: &str, answered: impl Fn(&RunOutput) -> bool) -> ToolResult<RunOutput> {
        let req = request(args, cwd);
        let out = self.programs.run(&req).map_err(|e| spawn_error(e, args[0]))?;
        self.again(&req, out, answered)
    }

    /// `out`, or the output of `req` run again, up to `TRIES` runs in all, while it ended
    /// non-zero without `answered`, or by a signal. A timeout is not run again.
    fn again(&mut self, req: &RunRequest, mut out: RunOutput, answered: impl Fn(&RunOutput) -> bool) -> ToolResult<RunOutput> {
        for _ in 1..TRIES {
            if out.exit_code == Some(0) || (out.exit_code.is_some() && answered(&out)) {
                break;
            }
            out = self.programs.run(req).map_err(|e| spawn_error(e, &req.args[0]))?;
        }
        Ok(out)
    }
}

/// Whether `opencode export ID` said it has no session `id`: a stderr line that starts with
/// "Error:" and ends in "not found: ID" ("Error: Session not found: ID", in colour). Its
/// first line, "Exporting session: ID", names the id too, and the id is the guest's choice:
/// only OpenCode's error line counts.
fn not_found(stderr: &[u8], id: &str) -> bool {
    let text = without_colours(&String::from_utf8_lossy(stderr));
    text.lines().any(|l| {
        let l = l.trim();
        l.starts_with("Error:") && l.strip_suffix(id).is_some_and(|head| head.trim_end().to_ascii_lowercase().ends_with("not found:"))
    })
}

fn request(args: &[&str], cwd: &str) -> RunRequest {
    RunRequest {
        program: "opencode".into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        stdin: None,
        env: Vec::new(),
        cwd: Some(cwd.to_string()),
        timeout_ms: SESSION_TIMEOUT_MS,
        ..Default::default()
    }
}

fn spawn_error(e: SpawnError, verb: &str) -> ToolError {
    match e {
        SpawnError::NotAllowed(m) | SpawnError::NotFound(m) => ToolError::new(Code::OpencodeMissing, format!("the laptop's opencode is not available to this host ({m})")),
        SpawnError::TimedOut => ToolError::new(Code::Timeout, format!("opencode {verb} did not finish in time")),
        SpawnError::Failed(m) => ToolError::new(Code::ImportFailed, format!("could not run opencode {verb}: {m}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{HostFacts, Options};
    use crate::testing::Scripted;

    fn ctx(host: &str, facts_version: Option<&str>) -> Context {
        Context {
            host_name: host.into(),
            host_version: "1.18.40".into(),
            options: Options::default(),
            project: "/p".into(),
            ledger: "/l".into(),
            now_ms: 0,
            entropy: Vec::new(),
            facts: HostFacts { opencode_version: facts_version.map(String::from), ..Default::default() },
        }
    }

    #[test]
    fn the_version_is_asked_only_when_no_host_knows_it() {
        let mut p = Scripted::default();
        assert_eq!(Opencode::new(&mut p).version(&ctx("boxd-host", Some("1.18.33"))).as_deref(), Some("1.18.33"));
        assert_eq!(Opencode::new(&mut p).version(&ctx("opencode", None)).as_deref(), Some("1.18.40"));
        assert!(p.requests.is_empty());
        p.push_exit(0, "1.18.7\n", "");
        assert_eq!(Opencode::new(&mut p).version(&ctx("boxd-host", None)).as_deref(), Some("1.18.7"));
        p.push_spawn_error(SpawnError::NotFound("opencode".into()));
        assert_eq!(Opencode::new(&mut p).version(&ctx("boxd-host", None)), None);
        assert_eq!(p.requests[0].args, ["--version"]);
    }

    #[test]
    fn import_and_export_run_in_the_works_folder_and_name_their_failures() {
        let mut p = Scripted::default();
        p.push_exit(0, "Imported session ses_1", "");
        for _ in 0..TRIES {
            p.push_fail(1, "Error: bad file");
        }
        p.push_exit(0, "Exporting…\n{\"info\":{\"id\":\"ses_1\"},\"messages\":[]}\n", "");
        p.push_exit(1, "", "Error: Session not found: ses_1");
        p.push_spawn_error(SpawnError::NotAllowed("opencode".into()));
        let mut o = Opencode::new(&mut p);
        assert!(o.import("/l/x.json", "ses_1", "/p").is_ok());
        assert_eq!(o.import("/l/x.json", "ses_1", "/p").unwrap_err().code, Code::ImportFailed);
        assert_eq!(o.export("ses_1", "/p").unwrap()["info"]["id"], "ses_1");
        let e = o.export("ses_1", "/p").unwrap_err();
        assert!(e.code == Code::ProofFailed && e.message.contains("Session not found"), "{e:?}");
        assert_eq!(o.export("ses_1", "/p").unwrap_err().code, Code::OpencodeMissing);
        assert!(p.requests.iter().all(|r| r.program == "opencode" && r.cwd.as_deref() == Some("/p")));
        assert!(p.answers.is_empty(), "a failed import ran {TRIES} times, OpenCode's own not-found once");
    }

    #[test]
    fn a_run_that_fails_without_opencodes_own_answer_is_run_again() {
        // Two opencode processes opening a fresh data folder at once: the loser's words.
        let race = "\x1b[91m\x1b[1mError: \x1b[0mUnexpected error\n\nFailed query: \n        CREATE TABLE `workspace` (\n        );\n      \nparams: \n";
        let copy = "Exporting…\n{\"info\":{\"id\":\"ses_a\"},\"messages\":[]}\n";
        let mut p = Scripted::default();
        p.push_fail(1, race);
        p.push_fail(1, "Error: Unexpected error\n\ndatabase is locked\n");
        p.push_exit(0, copy, "");
        assert_eq!(Opencode::new(&mut p).export("ses_a", "/p").unwrap()["info"]["id"], "ses_a");
        p.push_fail(1, race);
        p.push_exit(0, "Imported session ses_a", "");
        assert!(Opencode::new(&mut p).import("/l/x.json", "ses_a", "/p").is_ok());
        // held: each of a batch is run again on its own, until it answers.
        p.push_fail(1, race);
        p.push_fail(1, "Error: Session not found: ses_b\n");
        p.push_fail(1, "Error: Unexpected error\n\ndatabase is locked\n");
        p.push_exit(0, copy, "");
        let held = Opencode::new(&mut p).held(&["ses_a", "ses_b"], "/p").unwrap();
        assert!(matches!(held[..], [Held::Copy(_), Held::Absent]), "{held:?}");
        assert_eq!(p.commands().iter().filter(|c| c.starts_with("export")).count(), 3 + 4);
        assert!(p.answers.is_empty());
    }

    #[test]
    fn a_session_is_absent_only_when_opencode_says_it_has_none() {
        let held = |exit: Option<i32>, stderr: &str| {
            let mut p = Scripted::default();
            for _ in 0..TRIES {
                match exit {
                    Some(c) => p.push_exit(c, "", stderr),
                    None => p.answers.push_back(Ok(RunOutput { exit_code: None, stdout: Vec::new(), stderr: stderr.as_bytes().to_vec(), files: Vec::new() })),
                }
            }
            let held = Opencode::new(&mut p).held(&["ses_a"], "/p").map(|h| matches!(h[..], [Held::Absent])).map_err(|e| (e.code, e.message));
            // OpenCode's own answer is taken at once; anything else is asked again.
            assert_eq!(p.answers.len(), if held == Ok(true) { TRIES - 1 } else { 0 }, "{stderr}");
            held
        };
        assert_eq!(held(Some(1), "Exporting session: ses_a\n\x1b[91m\x1b[1mError: \x1b[0mSession not found: ses_a\n"), Ok(true));
        // Anything else says nothing of whether the laptop holds it: nothing is imported.
        let locked = "Exporting session: ses_a\nError: database is locked\n";
        let said_by_guest = "Exporting session: ses_a\ntitle: Session not found: ses_a\n";
        let killed_saying_it = "Error: Session not found: ses_a\n";
        for (exit, stderr) in [(Some(1), locked), (Some(1), "Error: Session not found: ses_b\n"), (Some(1), "Error: Session not found: ses_a and more\n"), (Some(1), said_by_guest), (Some(134), ""), (None, ""), (None, killed_saying_it)] {
            let (code, message) = held(exit, stderr).unwrap_err();
            assert!(code == Code::ImportFailed && message.contains("ses_a") && message.contains("nothing was imported"), "{exit:?} {stderr}: {message}");
        }
    }

    #[test]
    fn what_opencode_said_leads_with_its_error_line() {
        let sql = b"INFO service=import\nerror: UNIQUE constraint failed: message.id\n    at run (db.ts:10)\ninsert into message values (?, ?\n); | params: \n";
        let s = said(sql);
        assert!(s.starts_with("error: UNIQUE constraint failed: message.id"), "{s}");
        assert_eq!(said(b"just one line\nand the last\n"), "just one line | and the last");
        assert!(said(&[b'e'; 2000]).chars().count() <= 401);
        assert_eq!(said(b"\x1b[91m\x1b[1mError: \x1b[0mUnexpected error\n"), "Error: Unexpected error", "no colour codes");
    }
}
