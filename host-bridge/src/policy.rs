//! The policy: which programs the component may run (name → absolute binary), which
//! folders it may touch (the preopens), and what environment a child gets. Built once,
//! deny by default, shared by every Rust host (and mirrored by the JS bridge). A grant
//! exists only because a builder call made it; `audit` prints every one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};

/// The policy data every host shares (host-bridge/policy.json; the OpenCode bridge reads
/// the same file), so the program names and the child-environment allow-list have one source.
pub const POLICY_JSON: &str = include_str!("../policy.json");

struct Shared {
    programs: Vec<String>,
    /// program → the plugin option that must be true for a host to grant it.
    opt_in: Vec<(String, String)>,
    child_env: Vec<String>,
    bounds: crate::spawn::Bounds,
    host_failed_next: String,
}

fn shared() -> &'static Shared {
    static SHARED: std::sync::OnceLock<Shared> = std::sync::OnceLock::new();
    SHARED.get_or_init(|| {
        let v: serde_json::Value = serde_json::from_str(POLICY_JSON).expect("policy.json is JSON");
        let list = |k: &str| -> Vec<String> {
            v[k].as_array().expect("policy.json lists it").iter().map(|s| s.as_str().expect("a string").to_string()).collect()
        };
        let bytes = |k: &str| v["outputCaps"][k].as_u64().expect("policy.json outputCaps has it") as usize;
        let bounds = crate::spawn::Bounds {
            stdout_cap: bytes("stdout"),
            stderr_cap: bytes("stderr"),
            after_exit: std::time::Duration::from_millis(v["afterExit"]["graceMs"].as_u64().expect("policy.json afterExit.graceMs")),
        };
        let host_failed_next = v["hostFailed"]["next"].as_str().expect("policy.json hostFailed.next").to_string();
        let opt_in = v["grantedOnlyWith"]
            .as_object()
            .expect("policy.json grantedOnlyWith")
            .iter()
            .filter(|(program, _)| program.as_str() != "about")
            .filter_map(|(program, option)| Some((program.clone(), option.as_str()?.to_string())))
            .collect();
        Shared { programs: list("programs"), opt_in, child_env: list("childEnv"), bounds, host_failed_next }
    })
}

/// The caps on a child's output and the grace after it exits, from policy.json.
pub fn bounds() -> crate::spawn::Bounds {
    shared().bounds
}

/// HOST_FAILED's one next step (policy.json `hostFailed.next`, equal to the component's
/// errors.rs): what every host answers when the component traps.
pub fn host_failed_next() -> &'static str {
    &shared().host_failed_next
}

/// A host failure (a trap, a runtime error) in the tools' own error shape; every Rust
/// host (`call`, MCP) answers with this, and the OpenCode bridge with the same text.
pub fn host_failed(tool: &str, message: impl std::fmt::Display) -> serde_json::Value {
    serde_json::json!({
        "error": "HOST_FAILED",
        "message": format!("the component stopped while running {tool}: {message}"),
        "next": host_failed_next(),
    })
}

/// The programs a host grants only when the named plugin option is true (policy.json
/// `grantedOnlyWith`): (program, option).
pub fn opt_in_programs() -> &'static [(String, String)] {
    &shared().opt_in
}

/// The program names the component may ask for. Any other name is refused.
pub fn program_names() -> &'static [String] {
    &shared().programs
}

/// Variables a child may inherit from the host's environment, and nothing else: what the
/// boxd CLI and OpenCode need to find their own config and data.
pub fn child_env_names() -> &'static [String] {
    &shared().child_env
}

fn is_program_name(name: &str) -> bool {
    program_names().iter().any(|p| p == name)
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
    child_env: Vec<(String, String)>,
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

    /// Pass the allow-listed variables of `vars` to children.
    pub fn child_env_from(&mut self, vars: impl IntoIterator<Item = (String, String)>) -> &mut Self {
        self.child_env = vars.into_iter().filter(|(k, _)| child_env_names().iter().any(|n| n == k)).collect();
        self.child_env.sort();
        self
    }

    pub fn programs(&self) -> &BTreeMap<String, PathBuf> {
        &self.programs
    }

    pub fn preopens(&self) -> &[Preopen] {
        &self.preopens
    }

    pub fn child_env(&self) -> &[(String, String)] {
        &self.child_env
    }

    /// The binary for a program name, or the refusal naming the missing grant.
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

pub fn find_on_path(binary: &str, path_var: Option<&str>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    path_var?.split(':').filter(|d| !d.is_empty()).map(|d| Path::new(d).join(binary)).find(|p| {
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
        assert!(p.allows_cwd(dir.to_str().unwrap()).is_ok());
        assert!(matches!(p.allows_cwd("/"), Err(Refusal::CwdOutside(_))));
    }

    #[test]
    fn the_shared_policy_file_names_the_programs_and_variables() {
        assert_eq!(program_names(), ["boxd", "opencode", "git"]);
        assert_eq!(opt_in_programs(), [("git".to_string(), "fetchCommits".to_string())]);
        for must in ["PATH", "HOME", "XDG_DATA_HOME", "BOXD_TOKEN"] {
            assert!(child_env_names().iter().any(|n| n == must), "{must}");
        }
        assert!(!child_env_names().iter().any(|n| n.contains("SECRET") || n == "AWS_SECRET_ACCESS_KEY"));
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
    fn child_env_is_an_allow_list() {
        let mut p = Policy::new();
        p.child_env_from([("PATH".into(), "/bin".into()), ("AWS_SECRET_ACCESS_KEY".into(), "x".into()), ("HOME".into(), "/h".into())]);
        assert_eq!(p.child_env(), [("HOME".to_string(), "/h".to_string()), ("PATH".to_string(), "/bin".to_string())]);
    }
}
