//! Every boxd call live-check makes: checked against the policy's argument grants, run by
//! the one process runner (spawn/) with the policy's child environment and a deadline,
//! and written to the audit log. A refusal, a timeout or a spawn failure is an answer too
//! (the check could not be made), never a panic.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::audit::AuditLog;
use crate::policy::{Policy, Refusal};
use crate::runtime::{mask_args, SpawnRecord, Trace};
use crate::spawn::{self, SpawnFailure};

/// What one boxd call printed and how it ended.
#[derive(Debug, Clone)]
pub struct Seen {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Seen {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// The JSON document after optional noise: the plugin parses from the first line that
    /// starts with `{` or `[` (docs/architecture.md, "boxd behaviours relied on").
    pub fn json(&self) -> Option<Value> {
        let start = self.stdout.lines().position(|l| l.starts_with('{') || l.starts_with('['))?;
        let doc: Vec<&str> = self.stdout.lines().skip(start).collect();
        serde_json::from_str(&doc.join("\n")).ok()
    }

    /// The first `error: …` line on stderr.
    pub fn error_line(&self) -> Option<&str> {
        self.stderr.lines().find(|l| l.starts_with("error:"))
    }

    /// One line for the table: the exit code and what came out, shortened.
    pub fn brief(&self) -> String {
        let code = self.code.map_or("killed by a signal".to_string(), |c| format!("exit {c}"));
        let text = self.error_line().map(str::to_string).unwrap_or_else(|| self.stdout.trim().to_string());
        format!("{code}, {}", shorten(&text, 160))
    }
}

pub fn shorten(s: &str, n: usize) -> String {
    let flat = s.replace('\n', "⏎");
    if flat.chars().count() <= n { flat } else { format!("{}…", flat.chars().take(n).collect::<String>()) }
}

/// The boxd CLI as the policy grants it.
pub struct Boxd<'a> {
    policy: &'a Policy,
    audit: &'a mut AuditLog,
    binary: PathBuf,
    pub timeout: Duration,
}

impl<'a> Boxd<'a> {
    /// `Err` when the policy has no boxd (not found on PATH and no `--boxd`).
    pub fn new(policy: &'a Policy, audit: &'a mut AuditLog, timeout: Duration) -> Result<Self, String> {
        let binary = policy.allows("boxd").map_err(refusal_text)?.to_path_buf();
        Ok(Boxd { policy, audit, binary, timeout })
    }

    pub fn binary(&self) -> &std::path::Path {
        &self.binary
    }

    pub fn call(&mut self, args: &[&str]) -> Result<Seen, String> {
        self.call_with(args, None, self.timeout)
    }

    /// One call the policy grants, or one of the user's own calls live-check makes for
    /// them (`user_call`); `Err` names why it gave no answer (refused, timed out, failed
    /// to start).
    pub fn call_with(&mut self, args: &[&str], stdin: Option<&[u8]>, timeout: Duration) -> Result<Seen, String> {
        let owned: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        match self.policy.allows_call("boxd", &owned) {
            Ok((_, grant)) => self.spawn(owned, stdin, timeout, format!("boxd {}", grant.name)),
            Err(_) if user_call(args) => {
                self.spawn(owned, stdin, timeout, "host: live-check (the user's own call, not the component's)".into())
            }
            Err(r) => {
                let why = format!("refused by the policy: {}", refusal_text(r));
                self.audit_refusal(owned);
                Err(why)
            }
        }
    }

    fn audit_refusal(&mut self, args: Vec<String>) {
        let record = SpawnRecord { program: "boxd".into(), args: mask_args(&args), grant: None, exit_code: None, outcome: "not-allowed".into(), duration_ms: 0 };
        self.audit.record("live-check", 0, &Err("NOT_ALLOWED".into()), &Trace { spawns: vec![record], paths: Vec::new() });
    }

    fn spawn(&mut self, args: Vec<String>, stdin: Option<&[u8]>, timeout: Duration, grant: String) -> Result<Seen, String> {
        let spawn = spawn::Spawn {
            name: "boxd",
            binary: &self.binary,
            args: &args,
            env: &self.policy.child_env("boxd"),
            cwd: None,
            stdin,
            timeout,
            bounds: crate::policy::bounds(),
        };
        match crate::session::host_call(self.audit, "live-check", grant, spawn) {
            Ok(o) => Ok(Seen {
                code: o.exit_code,
                stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            }),
            Err(SpawnFailure::TimedOut) => Err(format!("no answer within {} s", timeout.as_secs())),
            Err(SpawnFailure::NotFound(m) | SpawnFailure::Failed(m)) => Err(m),
            Err(SpawnFailure::Interrupted(sig)) => Err(SpawnFailure::interrupted_message("boxd", sig)),
        }
    }
}

fn refusal_text(r: Refusal) -> String {
    match r {
        Refusal::NotAllowed(m) | Refusal::CwdOutside(m) => m,
    }
}

/// The calls no grant allows, because the component must never make them, that
/// live-check makes as the user's own (as the tour sets boxd env through
/// `Session::run_granted`): signing out and in (only with `--sign-out`), and setting and
/// removing its own `LIVE_CHECK_<hex>` variable.
fn user_call(args: &[&str]) -> bool {
    let hex = |s: &str| !s.is_empty() && s.len() <= 64 && s.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c));
    let var = |s: &str| s.strip_prefix("LIVE_CHECK_").is_some_and(hex);
    match args {
        ["auth", "logout"] | ["auth", "login"] => true,
        ["env", "set", name, value, "--secret"] => var(name) && hex(value),
        ["env", "rm", name] => var(name),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::user_call;

    #[test]
    fn only_its_own_variable_and_the_sign_out_are_user_calls() {
        assert!(user_call(&["env", "set", "LIVE_CHECK_0a1b", "ff00", "--secret"]));
        assert!(user_call(&["env", "rm", "LIVE_CHECK_0a1b"]));
        assert!(user_call(&["auth", "logout"]));
        for refused in [
            &["env", "set", "OPENAI_API_KEY", "ff", "--secret"][..],
            &["env", "set", "LIVE_CHECK_0a1b", "v", "--secret"],
            &["env", "set", "LIVE_CHECK_", "ff", "--secret"],
            &["env", "rm", "LIVE_CHECK_XYZ"],
            &["env", "rm", "OPENAI_API_KEY"],
            &["machine", "remove", "web", "-y"],
            &["auth", "logout", "--all"],
        ] {
            assert!(!user_call(refused), "{refused:?}");
        }
    }
}
