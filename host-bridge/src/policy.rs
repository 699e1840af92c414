//! The policy: which programs the component may run (name → absolute binary) and with
//! which arguments (policy.json's argument grants, args.rs), which folders it may touch
//! (the preopens), and what environment each program's child gets. Deny by default: a
//! grant exists only because `resolve` (or a builder call) made it, and `audit` prints the
//! programs with their grants, and the preopens. The OpenCode bridge resolves the same
//! request in lib/policy.js; tests/vectors/policy.json holds both to one outcome.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use serde::Deserialize;
use serde_json::{json, Value};

mod args;
mod grants;
pub use args::Grant;
pub use grants::{resolve, GrantRequest, Grants, HostProblem, AUDIT_LOG_OPTION, HOST_ONLY_OPTIONS};

/// The policy data every host shares (host-bridge/policy.json; the OpenCode bridge reads
/// the same file), so the programs, their grants and environments have one source.
pub const POLICY_JSON: &str = include_str!("../policy.json");

/// host-bridge/policy.json, typed. docs/architecture.md ("Policy") explains each key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PolicyFile {
    pub programs: Vec<ProgramPolicy>,
    /// program → the plugin option that must be true for a host to grant it.
    pub granted_only_with: BTreeMap<String, String>,
    /// Variables every program's child may inherit; each program adds its own `env`.
    pub child_env: Vec<String>,
    pub output_caps: OutputCaps,
    pub run_all: RunAll,
    pub after_exit: AfterExit,
    pub host_failed: HostError,
    pub options_invalid: HostError,
    pub ledger_failed: HostError,
}

/// One program the component may run: its own variables and the argument lists granted.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgramPolicy {
    pub name: String,
    pub env: Vec<String>,
    pub grants: Vec<Grant>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputCaps {
    pub stdout: u64,
    pub stderr: u64,
}

/// How many children one `run-all` may start at once; a larger batch runs none of them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RunAll {
    pub max_requests: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AfterExit {
    pub grace_ms: u64,
}

/// An error a host answers by itself (the component's errors.rs has the same code and next).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostError {
    pub code: String,
    pub next: String,
}

impl PolicyFile {
    /// Parse and check a policy document: every problem is named, nothing is skipped.
    pub fn parse(text: &str) -> Result<PolicyFile> {
        let file: PolicyFile = serde_json::from_str(text).context("policy.json does not have the policy's shape")?;
        file.validate()?;
        Ok(file)
    }

    /// The program called `name`, if the policy lists it.
    pub fn program(&self, name: &str) -> Option<&ProgramPolicy> {
        self.programs.iter().find(|p| p.name == name)
    }

    fn validate(&self) -> Result<()> {
        let word = |s: &str, extra: char| !s.is_empty() && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == extra);
        if self.programs.is_empty() {
            bail!("policy.json programs is empty");
        }
        let env_name = |name: &str| !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        for (i, p) in self.programs.iter().enumerate() {
            if !word(&p.name, '-') || self.programs[..i].iter().any(|o| o.name == p.name) {
                bail!("policy.json programs: '{}' is not a lowercase program name, or is listed twice", p.name);
            }
            if let Some(name) = p.env.iter().find(|n| !env_name(n)) {
                bail!("policy.json programs.{}.env: '{name}' is not an environment variable name", p.name);
            }
            if let Some(why) = args::invalid(&p.name, &p.grants) {
                bail!("policy.json {why}");
            }
        }
        for (program, option) in &self.granted_only_with {
            if !self.programs.iter().any(|p| &p.name == program) {
                bail!("policy.json grantedOnlyWith names '{program}', which programs does not list");
            }
            if option.is_empty() || !option.chars().all(|c| c.is_ascii_alphanumeric()) {
                bail!("policy.json grantedOnlyWith.{program}: '{option}' is not a plugin option name");
            }
        }
        for name in &self.child_env {
            if !env_name(name) {
                bail!("policy.json childEnv: '{name}' is not an environment variable name");
            }
        }
        if self.output_caps.stdout == 0 || self.output_caps.stderr == 0 {
            bail!("policy.json outputCaps must be positive byte counts");
        }
        if !(1..=16).contains(&self.run_all.max_requests) {
            bail!("policy.json runAll.maxRequests is {}; 1 to 16", self.run_all.max_requests);
        }
        if self.after_exit.grace_ms > 10_000 {
            bail!("policy.json afterExit.graceMs is {} ms; at most 10000", self.after_exit.grace_ms);
        }
        for (key, e, code) in [
            ("hostFailed", &self.host_failed, "HOST_FAILED"),
            ("optionsInvalid", &self.options_invalid, "OPTIONS_INVALID"),
            ("ledgerFailed", &self.ledger_failed, "LEDGER_FAILED"),
        ] {
            if e.code != code || e.next.trim().is_empty() {
                bail!("policy.json {key} must have code {code} and a next step");
            }
        }
        if !self.options_invalid.next.contains("{field}") {
            bail!("policy.json optionsInvalid.next must name the option as {{field}}");
        }
        Ok(())
    }
}

/// The shared policy data, parsed and checked once.
pub fn file() -> &'static PolicyFile {
    static FILE: std::sync::OnceLock<PolicyFile> = std::sync::OnceLock::new();
    FILE.get_or_init(|| PolicyFile::parse(POLICY_JSON).unwrap_or_else(|e| panic!("host-bridge/policy.json is built in and invalid: {e:#}")))
}

/// The caps on a child's output and the grace after it exits, from policy.json.
pub fn bounds() -> crate::spawn::Bounds {
    let f = file();
    crate::spawn::Bounds {
        stdout_cap: f.output_caps.stdout as usize,
        stderr_cap: f.output_caps.stderr as usize,
        after_exit: std::time::Duration::from_millis(f.after_exit.grace_ms),
    }
}

/// The most requests one `run-all` may hold (policy.json `runAll.maxRequests`).
pub fn run_all_max() -> usize {
    file().run_all.max_requests as usize
}

/// HOST_FAILED's one next step (policy.json `hostFailed.next`, equal to the component's
/// errors.rs): what every host answers when the component traps.
pub fn host_failed_next() -> &'static str {
    &file().host_failed.next
}

/// A host failure (a trap, a runtime error) in the tools' own error shape; every Rust
/// host (`call`, MCP) answers with this, and the OpenCode bridge with the same text.
pub fn host_failed(tool: &str, message: impl std::fmt::Display) -> Value {
    json!({
        "error": file().host_failed.code,
        "message": format!("the component stopped while running {tool}: {message}"),
        "next": host_failed_next(),
    })
}

/// The programs a host grants only when the named plugin option is true (policy.json
/// `grantedOnlyWith`): program → option.
pub fn opt_in_programs() -> &'static BTreeMap<String, String> {
    &file().granted_only_with
}

/// The program names the component may ask for. Any other name is refused.
pub fn program_names() -> Vec<&'static str> {
    file().programs.iter().map(|p| p.name.as_str()).collect()
}

/// The variables `program`'s child may inherit from the host's environment, and nothing
/// else: the shared `childEnv` (where a program finds its own config and data) and its
/// own `env` (boxd's credentials for boxd only, OpenCode's for opencode only).
pub fn child_env_names(program: &str) -> Vec<&'static str> {
    let f = file();
    f.child_env.iter().chain(f.program(program).into_iter().flat_map(|p| &p.env)).map(String::as_str).collect()
}

fn is_program_name(name: &str) -> bool {
    file().program(name).is_some()
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preopen {
    /// Canonical host folder; the component sees it at the same path.
    pub path: PathBuf,
    pub why: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct Policy {
    programs: BTreeMap<String, PathBuf>,
    preopens: Vec<Preopen>,
    /// The host's variables any program's child may inherit; `child_env` picks per program.
    host_env: Vec<(String, String)>,
}

/// Why a spawn was refused, naming the grant that is missing.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    NotAllowed(String),
    CwdOutside(String),
}

impl Policy {
    pub fn new() -> Self {
        Self::default()
    }

    /// Grant `name` (one of the policy's program names) as the binary at `path`.
    pub fn program(&mut self, name: &str, path: &Path) -> Result<&mut Self> {
        if !is_program_name(name) {
            bail!("'{name}' is not a program the plugin uses (only {})", program_names().join(", "));
        }
        let abs = std::fs::canonicalize(path).with_context(|| format!("{name}: {} does not exist", path.display()))?;
        self.programs.insert(name.to_string(), abs);
        Ok(self)
    }

    /// Grant `name` as the first executable called `binary` on `path_var`, if there is one.
    pub fn program_from_path(&mut self, name: &str, binary: &str, path_var: Option<&str>) -> Result<&mut Self> {
        if let Some(found) = find_on_path(binary, path_var) {
            self.program(name, &found)?;
        }
        Ok(self)
    }

    /// Preopen a folder read-write at its own canonical path.
    pub fn preopen(&mut self, dir: &Path, why: &'static str) -> Result<&mut Self> {
        let abs = std::fs::canonicalize(dir).with_context(|| format!("{why} folder {} does not exist", dir.display()))?;
        if !abs.is_dir() {
            bail!("{why} {} is not a folder", abs.display());
        }
        if !self.preopens.iter().any(|p| p.path == abs) {
            self.preopens.push(Preopen { path: abs, why });
        }
        Ok(self)
    }

    /// Keep the variables of `vars` some program's child may inherit (policy.json
    /// `childEnv` and each program's `env`); `child_env` gives each program its own.
    pub fn child_env_from(&mut self, vars: impl IntoIterator<Item = (String, String)>) -> &mut Self {
        let f = file();
        let names: Vec<&String> = f.child_env.iter().chain(f.programs.iter().flat_map(|p| &p.env)).collect();
        self.host_env = vars.into_iter().filter(|(k, _)| names.contains(&k)).collect();
        self.host_env.sort();
        self
    }

    pub fn programs(&self) -> &BTreeMap<String, PathBuf> {
        &self.programs
    }

    pub fn preopens(&self) -> &[Preopen] {
        &self.preopens
    }

    /// What `program`'s child inherits from the host's environment.
    pub fn child_env(&self, program: &str) -> Vec<(String, String)> {
        let names = child_env_names(program);
        self.host_env.iter().filter(|(k, _)| names.contains(&k.as_str())).cloned().collect()
    }

    /// The binary and the grant for one call of the component's, or the refusal naming the
    /// program, the refused arguments and the grant nearest to them (policy.json `grants`).
    pub fn allows_call(&self, program: &str, args: &[String]) -> Result<(&Path, &'static Grant), Refusal> {
        let binary = self.allows(program)?;
        let grants = &file().program(program).expect("a granted program is in the policy").grants;
        let grant = args::check(program, grants, args, &|p| self.confined(p)).map_err(Refusal::NotAllowed)?;
        Ok((binary, grant))
    }

    /// Whether a `{path}` argument lands inside a preopen once every symlink on it is
    /// followed, as the program will open it: else a granted program reads any file.
    fn confined(&self, path: &str) -> bool {
        args::landing(Path::new(path)).is_some_and(|p| self.preopens.iter().any(|o| p.starts_with(&o.path)))
    }

    /// The binary for a program name, or the refusal naming the missing grant. Arguments
    /// are not looked at: `allows_call` is the check for the component's calls.
    pub fn allows(&self, program: &str) -> Result<&Path, Refusal> {
        match self.programs.get(program) {
            Some(p) => Ok(p),
            None => Err(Refusal::NotAllowed(if is_program_name(program) {
                format!("{program}: not found on this host (give --{program} PATH or put it on PATH)")
            } else {
                format!("{program}: not in the host's policy (allowed: {})", program_names().join(", "))
            })),
        }
    }

    /// The component may set only variables the policy would pass `program` anyway: no
    /// LD_PRELOAD, no endpoint of its choosing.
    pub fn allows_env(&self, program: &str, env: &[(String, String)]) -> Result<(), Refusal> {
        let names = child_env_names(program);
        match env.iter().find(|(k, _)| !names.contains(&k.as_str())) {
            None => Ok(()),
            Some((k, _)) => Err(Refusal::NotAllowed(format!(
                "{program} may not be given {k}: the component may set only the variables host-bridge/policy.json passes to {program} (childEnv and programs.{program}.env)"
            ))),
        }
    }

    /// A child's working directory must lie inside a preopen.
    pub fn allows_cwd(&self, cwd: &str) -> Result<PathBuf, Refusal> {
        let p = std::fs::canonicalize(cwd).map_err(|_| Refusal::CwdOutside(format!("{cwd} does not exist")))?;
        if self.preopens.iter().any(|o| p.starts_with(&o.path)) {
            Ok(p)
        } else {
            Err(Refusal::CwdOutside(format!("{cwd} is outside the preopened folders")))
        }
    }
}

/// The first executable regular file called `binary` in the absolute folders of `path_var`.
/// A relative entry ("", ".", "bin") is skipped: it would name a different program in
/// every working directory.
pub fn find_on_path(binary: &str, path_var: Option<&str>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    path_var?.split(':').filter(|d| d.starts_with('/')).map(|d| Path::new(d).join(binary)).find(|p| {
        p.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_table() {
        let dir = std::env::temp_dir();
        let mut p = Policy::new();
        p.program("boxd", Path::new("/bin/sh")).unwrap().preopen(&dir, "project").unwrap();
        assert!(p.allows("boxd").is_ok());
        for name in ["opencode", "sh", "/bin/sh", "boxd ", "BOXD", "../boxd", ""] {
            assert!(matches!(p.allows(name), Err(Refusal::NotAllowed(_))), "{name:?}");
        }
        assert!(p.program("sh", Path::new("/bin/sh")).is_err(), "only the plugin's program names can be granted");
        let call = |args: &[&str]| p.allows_call("boxd", &args.iter().map(|a| a.to_string()).collect::<Vec<_>>()).map(|(_, g)| g.name.as_str());
        assert_eq!(call(&["machine", "remove", "oc-w1", "-y", "--json"]), Ok("machine-remove"));
        assert_eq!(call(&["machine", "remove", "golden-build-0a1b", "-y", "--json"]), Ok("golden-remove"));
        for refused in [&["machine", "remove", "web", "-y", "--json"][..], &["auth", "logout"], &["env", "set", "K", "v"], &[]] {
            assert!(matches!(call(refused), Err(Refusal::NotAllowed(_))), "{refused:?}");
        }
        assert!(matches!(p.allows_call("opencode", &["--version".into()]), Err(Refusal::NotAllowed(m)) if m.contains("not found on this host")));
        assert!(p.allows_cwd(dir.to_str().unwrap()).is_ok());
        assert!(matches!(p.allows_cwd("/"), Err(Refusal::CwdOutside(_))));
    }

    #[test]
    fn the_component_sets_only_variables_the_program_would_get() {
        let p = Policy::new();
        let pair = |k: &str| vec![(k.to_string(), "x".to_string())];
        for name in child_env_names("boxd") {
            assert_eq!(p.allows_env("boxd", &pair(name)), Ok(()), "{name}");
        }
        for name in ["LD_PRELOAD", "LD_LIBRARY_PATH", "NODE_OPTIONS", "BASH_ENV"] {
            assert!(matches!(p.allows_env("boxd", &pair(name)), Err(Refusal::NotAllowed(m)) if m.contains(name) && m.contains("programs.boxd.env")), "{name}");
        }
        // One program's credentials are not another's to ask for.
        if let Some(own) = child_env_names("boxd").into_iter().find(|n| !child_env_names("opencode").contains(n)) {
            assert!(p.allows_env("opencode", &pair(own)).is_err(), "{own}");
        }
    }

    #[test]
    fn the_shared_policy_file_names_the_programs_and_variables() {
        assert_eq!(program_names(), ["boxd", "opencode", "git"]);
        assert_eq!(opt_in_programs().iter().collect::<Vec<_>>(), [(&"git".to_string(), &"fetchCommits".to_string())]);
        for must in ["PATH", "HOME", "XDG_DATA_HOME", "BOXD_TOKEN"] {
            assert!(child_env_names("boxd").contains(&must), "{must}");
        }
        // Each program's credentials go to that program only.
        assert!(child_env_names("opencode").contains(&"OPENCODE_DB") && !child_env_names("opencode").contains(&"BOXD_TOKEN"));
        assert!(!child_env_names("boxd").contains(&"OPENCODE_DB"));
        assert!(!child_env_names("git").iter().any(|n| n.starts_with("BOXD_") || n.starts_with("OPENCODE_")));
        for p in program_names() {
            assert!(!child_env_names(p).iter().any(|n| n.contains("SECRET")), "{p}");
        }
    }

    #[test]
    fn the_shared_policy_file_bounds_output_and_words_host_failed_as_the_component_does() {
        let b = bounds();
        assert_eq!((b.stdout_cap, b.stderr_cap), (64 << 20, 1 << 20));
        assert!(b.after_exit >= std::time::Duration::from_millis(50) && b.after_exit <= std::time::Duration::from_secs(1));
        // The component's own table (errors.rs) is the source of the text.
        let errors = include_str!("../../component/src/errors.rs");
        let line = errors.lines().find(|l| l.trim_start().starts_with("HostFailed = \"HOST_FAILED\"")).expect("errors.rs lists HOST_FAILED");
        assert!(line.contains(&format!("=> \"{}\";", host_failed_next())), "policy.json hostFailed.next differs from errors.rs: {line}");
    }

    #[test]
    fn host_made_errors_say_what_the_component_says() {
        let errors = include_str!("../../component/src/errors.rs");
        let ledger = errors.lines().find(|l| l.contains("LedgerFailed = \"LEDGER_FAILED\"")).expect("errors.rs lists LEDGER_FAILED");
        assert!(ledger.contains(&format!("=> \"{}\";", file().ledger_failed.next)), "policy.json ledgerFailed.next differs: {ledger}");
        // The component words its own OPTIONS_INVALID per field (options.rs `invalid`).
        let options = include_str!("../../component/src/options.rs");
        assert!(options.contains(&format!("format!(\"{}\")", file().options_invalid.next)), "policy.json optionsInvalid.next differs from options.rs");
    }

    #[test]
    fn a_policy_file_with_prose_unknown_keys_or_bad_values_is_refused() {
        let good: Value = serde_json::from_str(POLICY_JSON).unwrap();
        let with = |edit: &dyn Fn(&mut Value)| {
            let mut v = good.clone();
            edit(&mut v);
            PolicyFile::parse(&v.to_string()).map(drop).map_err(|e| format!("{e:#}"))
        };
        assert_eq!(with(&|_| {}), Ok(()));
        for (why, edit, says) in [
            ("prose key", &(|v: &mut Value| v["about"] = json!("text")) as &dyn Fn(&mut Value), "unknown field `about`"),
            ("prose inside a map of names", &|v: &mut Value| v["grantedOnlyWith"]["about"] = json!("text"), "'about', which programs does not list"),
            ("a missing key", &|v: &mut Value| drop(v.as_object_mut().unwrap().remove("childEnv")), "missing field `childEnv`"),
            ("a cap of the wrong type", &|v: &mut Value| v["outputCaps"]["stdout"] = json!("64 MiB"), "invalid type"),
            ("an unknown program opted in", &|v: &mut Value| v["grantedOnlyWith"]["sh"] = json!("x"), "'sh', which programs does not list"),
            ("a variable name", &|v: &mut Value| v["childEnv"][0] = json!("path"), "'path' is not an environment variable name"),
            ("a program's variable name", &|v: &mut Value| v["programs"][0]["env"][0] = json!("token"), "programs.boxd.env: 'token'"),
            ("a grant's unknown key", &|v: &mut Value| v["programs"][0]["grants"][0]["why"] = json!("text"), "unknown field `why`"),
            ("a grant's unknown class", &|v: &mut Value| v["programs"][0]["grants"][0]["args"][0] = json!("{any}"), "the first token must be a literal"),
            ("a grant without arguments", &|v: &mut Value| v["programs"][2]["grants"][0]["args"] = json!([]), "the first token must be a literal"),
            ("a code", &|v: &mut Value| v["hostFailed"]["code"] = json!("FAILED"), "hostFailed must have code HOST_FAILED"),
            ("a grace", &|v: &mut Value| v["afterExit"]["graceMs"] = json!(60000), "graceMs"),
            ("a batch bound", &|v: &mut Value| v["runAll"]["maxRequests"] = json!(0), "runAll.maxRequests is 0"),
        ] {
            let err = with(edit).expect_err(why);
            assert!(err.contains(says), "{why}: {err}");
        }
    }

    #[test]
    fn child_env_is_an_allow_list() {
        let mut p = Policy::new();
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        p.child_env_from([pair("PATH", "/bin"), pair("AWS_SECRET_ACCESS_KEY", "x"), pair("HOME", "/h"), pair("BOXD_TOKEN", "t"), pair("OPENCODE_DB", "/db")]);
        assert_eq!(p.child_env("boxd"), [pair("BOXD_TOKEN", "t"), pair("HOME", "/h"), pair("PATH", "/bin")]);
        assert_eq!(p.child_env("opencode"), [pair("HOME", "/h"), pair("OPENCODE_DB", "/db"), pair("PATH", "/bin")]);
        assert_eq!(p.child_env("git"), [pair("HOME", "/h"), pair("PATH", "/bin")]);
    }
}
