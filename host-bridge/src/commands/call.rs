//! `boxd-host call TOOL [ARGS_JSON]`: one tool call; the result or the error object on
//! stdout, exit 1 for a tool error, 2 when its audit line could not be written; on a
//! terminal, a spinner on stderr while a long tool runs. Ctrl-C (SIGTERM, SIGHUP) kills
//! its children, writes its audit line and ends the host by the signal (crate::interrupt).

use anyhow::{Context as _, Result};

use crate::cli::Grants;
use crate::session::Session;

pub fn run(grants: &Grants, tool: &str, mut args: String) -> Result<u8> {
    if args == "-" {
        // Large arguments (a long prompt) do not fit in argv: read them from stdin.
        args.clear();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut args).context("reading ARGS_JSON from stdin")?;
    }
    let mut session = match Session::open(grants, crate::session::HOST_NAME) {
        Ok(s) => s,
        // A grant the host cannot make (a relative ledgerDir, a missing allowed root) is
        // answered in the tools' own shape, as the OpenCode bridge answers every call.
        // Its audit line says so (the log is asked for apart from the other grants).
        Err(e) => match e.downcast_ref::<crate::policy::HostProblem>() {
            Some(p) => {
                let mut audit = crate::session::refused_audit(grants);
                if let Some(log) = audit.as_mut() {
                    crate::session::record_refused(log, tool, p);
                }
                crate::outln!("{}", serde_json::to_string_pretty(&serde_json::json!({ "error": p.code, "message": p.message, "next": p.next }))?);
                return Ok(if audit.is_some_and(|log| log.failed().is_some()) { 2 } else { 1 });
            }
            None => return Err(e),
        },
    };
    session.runtime.keep_spent();
    let spinner = progress(&session, tool, &args);
    let answer = session.call(tool, &args);
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    let (answer, code) = match answer? {
        Ok(v) => (v, 0),
        Err(e) => (e, 1),
    };
    crate::outln!("{}", crate::out::answer_text(&answer));
    // The call ran and its answer stands, but the record of it asked for is missing
    // (stderr said why): a host failure, not a success.
    let code = if session.audit.failed().is_some() { 2 } else { code };
    // The answer is out and the audit line written (each one write, nothing buffered):
    // the process ends now, and its exit frees the engine, the mapped component and the
    // call's store at once, where dropping them piece by piece only delays the exit.
    std::mem::forget(session);
    Ok(code)
}

/// On a terminal, a spinner with the manifest's progress title for a long-running tool
/// (scripts that read stdout see nothing of it: stderr only, and only on a TTY).
fn progress(session: &Session, tool: &str, args: &str) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let manifest: serde_json::Value = serde_json::from_str(&session.runtime.describe().ok()?).ok()?;
    let spec = manifest["tools"].as_array()?.iter().find(|t| t["name"] == tool)?;
    if spec["longRunning"] != true {
        return None;
    }
    let work = serde_json::from_str::<serde_json::Value>(args).ok().and_then(|a| a["work"].as_str().map(String::from)).unwrap_or_default();
    let title = spec["progress"].as_str().unwrap_or(tool).replace("{work}", &work);
    let bar = indicatif::ProgressBar::new_spinner().with_message(title);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    Some(bar)
}
