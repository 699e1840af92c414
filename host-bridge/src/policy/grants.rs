//! Grants: a host's request (flags, plugin options, environment) resolved into the
//! policy, the preopens and the options the component is told — or the problem that
//! stops every call. The ledger folder is made owner-only here (WASI cannot set modes).

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::{file, opt_in_programs, Policy};

/// Plugin options only the host reads (an explicit binary per program); the component
/// refuses unknown keys, so they never reach it.
pub const HOST_ONLY_OPTIONS: [&str; 2] = ["boxd", "opencode"];

/// The plugin option naming the audit log (the OpenCode bridge's only way to ask for one;
/// boxd-host's `--audit-log` wins over it). Host-only, as HOST_ONLY_OPTIONS.
pub const AUDIT_LOG_OPTION: &str = "auditLog";

/// What a host is asked to grant: its flags, the plugin options, its environment.
#[derive(Debug, Default)]
pub struct GrantRequest {
    /// Programs given explicitly (boxd-host `--boxd`/`--opencode`); the options key of
    /// the same name is the fallback, then PATH.
    pub programs: Vec<(String, PathBuf)>,
    pub project: PathBuf,
    /// The ledger folder from a flag; else options `ledgerDir`; else the default.
    pub ledger: Option<PathBuf>,
    /// Allowed roots from flags; options `allowedRoots` are added.
    pub allow_roots: Vec<PathBuf>,
    /// The plugin options as JSON text (None: `{}`).
    pub options: Option<String>,
    /// The host's environment: PATH, the data folder and what children inherit.
    pub env: Vec<(String, String)>,
    /// Where relative flag paths are taken from (the host's working directory).
    pub cwd: PathBuf,
}

/// Everything one host grants, and what the component is told.
#[derive(Debug)]
pub struct Grants {
    pub policy: Policy,
    pub project: PathBuf,
    pub ledger: PathBuf,
    /// The options without host-only keys, allowed roots canonical (options_json).
    pub component_options: Value,
    /// Options `auditLog`: where one JSON line per call is appended.
    pub audit_log: Option<PathBuf>,
}

/// A grant the host cannot make, as the tools' error (code, message, next step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostProblem {
    pub code: String,
    pub message: String,
    pub next: String,
}

impl HostProblem {
    fn options(field: &str, why: impl std::fmt::Display) -> Self {
        let e = &file().options_invalid;
        HostProblem { code: e.code.clone(), message: format!("plugin option '{field}' {why}"), next: e.next.replace("{field}", field) }
    }

    fn ledger(dir: &Path, why: impl std::fmt::Display) -> Self {
        let e = &file().ledger_failed;
        HostProblem { code: e.code.clone(), message: format!("cannot create the ledger folder {}: {why}", dir.display()), next: e.next.clone() }
    }

    /// The tools' error shape: `{"error","message","next"}`.
    pub fn to_json(&self) -> Value {
        json!({ "error": self.code, "message": self.message, "next": self.next })
    }
}

impl std::fmt::Display for HostProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}. {}", self.code, self.message, self.next)
    }
}

impl std::error::Error for HostProblem {}

/// Resolve a request into grants, or the problem that stops every call. Creates the
/// ledger folder owner-only (WASI cannot set modes, so the host does).
pub fn resolve(req: &GrantRequest) -> Result<Grants, HostProblem> {
    let var = |k: &str| req.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty());
    let absolute = |p: &Path| if p.is_absolute() { p.to_path_buf() } else { req.cwd.join(p) };
    let mut options = match req.options.as_deref() {
        None => json!({}),
        Some(text) => serde_json::from_str(text).map_err(|_| HostProblem::options("(options)", "is not valid JSON"))?,
    };
    let Some(opts) = options.as_object_mut() else { return Err(HostProblem::options("(options)", "must be a JSON object")) };
    // An absolute path in the options, or a problem naming the option.
    let option_path = |key: &str, why: &str| -> Result<Option<PathBuf>, HostProblem> {
        match opts.get(key) {
            None => Ok(None),
            Some(Value::String(s)) if s.starts_with('/') => Ok(Some(PathBuf::from(s))),
            Some(_) => Err(HostProblem::options(key, why)),
        }
    };

    let mut policy = Policy::new();
    let path_var = var("PATH");
    for name in HOST_ONLY_OPTIONS {
        let given = req.programs.iter().find(|(n, _)| n == name).map(|(_, p)| absolute(p));
        let explicit = match given {
            Some(p) => Some(p),
            None => option_path(name, "must be an absolute path to the program")?,
        };
        match explicit {
            Some(p) => {
                program_file(&p, name)?;
                policy.program(name, &p).map_err(|_| HostProblem::options(name, format!("names {}, which does not exist", p.display())))?
            }
            None => policy.program_from_path(name, name, path_var).map_err(|e| HostProblem::options(name, e))?,
        };
    }
    // Programs granted only when the user opted in (policy.json grantedOnlyWith).
    for (program, option) in opt_in_programs() {
        if opts.get(option) == Some(&Value::Bool(true)) {
            policy.program_from_path(program, program, path_var).map_err(|e| HostProblem::options(option, e))?;
        }
    }

    let ledger = match &req.ledger {
        Some(p) => absolute(p),
        None => match option_path("ledgerDir", "must be an absolute path")? {
            Some(p) => p,
            None => data_home(var("XDG_DATA_HOME"), var("HOME"))
                .ok_or_else(|| HostProblem::options("ledgerDir", "is needed here: neither XDG_DATA_HOME nor HOME is an absolute folder, so there is no default ledger folder (it was made under / or the current folder)"))?
                .join("opencode-boxd"),
        },
    };
    let ledger = ensure_private_dir(&ledger)?;
    let project = canonical_dir(&absolute(&req.project), "(project)")?;
    let mut roots: Vec<PathBuf> = req.allow_roots.iter().map(|r| canonical_dir(&absolute(r), "allowedRoots")).collect::<Result<_, _>>()?;
    match opts.get("allowedRoots") {
        None => {}
        Some(Value::Array(list)) => {
            for r in list {
                let Some(r) = r.as_str().filter(|r| r.starts_with('/')) else {
                    return Err(HostProblem::options("allowedRoots", "must hold absolute folder paths"));
                };
                roots.push(canonical_dir(Path::new(r), "allowedRoots")?);
            }
        }
        Some(_) => return Err(HostProblem::options("allowedRoots", "must be an array of absolute folder paths")),
    }
    policy.preopen(&ledger, "ledger").map_err(|e| HostProblem::ledger(&ledger, e))?;
    policy.preopen(&project, "project").map_err(|e| HostProblem::options("(project)", e))?;
    for r in &roots {
        policy.preopen(r, "allowed").map_err(|e| HostProblem::options("allowedRoots", e))?;
    }
    policy.child_env_from(req.env.iter().cloned());
    let audit_log = option_path(AUDIT_LOG_OPTION, "must be an absolute path to a file")?;

    // What the component gets: the options without host-only keys, roots canonical.
    opts.retain(|k, _| !HOST_ONLY_OPTIONS.contains(&k.as_str()) && k != AUDIT_LOG_OPTION);
    if !roots.is_empty() {
        opts.insert("allowedRoots".into(), json!(roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>()));
    }
    Ok(Grants { policy, project, ledger, component_options: options, audit_log })
}

/// $XDG_DATA_HOME, else $HOME/.local/share (an empty or relative value counts as unset);
/// None with neither.
fn data_home(xdg: Option<&str>, home: Option<&str>) -> Option<PathBuf> {
    match (xdg.filter(|x| x.starts_with('/')), home.filter(|h| h.starts_with('/'))) {
        (Some(x), _) => Some(PathBuf::from(x)),
        (None, Some(h)) => Some(PathBuf::from(h).join(".local/share")),
        (None, None) => None,
    }
}

/// A program the options name is an executable regular file: a folder or a file without
/// an execute bit failed at every call as the boxd CLI's own failure, whose next step
/// (read the CLI's message, run boxd_status) led back to the same failure.
fn program_file(p: &Path, field: &str) -> Result<(), HostProblem> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(p).map_err(|_| HostProblem::options(field, format!("names {}, which does not exist", p.display())))?;
    if !meta.is_file() {
        return Err(HostProblem::options(field, format!("names {}, which is not a program (a folder or a special file)", p.display())));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(HostProblem::options(field, format!("names {}, which is not executable", p.display())));
    }
    Ok(())
}

fn canonical_dir(p: &Path, field: &str) -> Result<PathBuf, HostProblem> {
    let real = std::fs::canonicalize(p).map_err(|_| HostProblem::options(field, format!("names {}, which does not exist", p.display())))?;
    if !real.is_dir() {
        return Err(HostProblem::options(field, format!("names {}, which is not a folder", p.display())));
    }
    Ok(real)
}

/// The ledger folder, created (or narrowed to) owner-only; its canonical path.
fn ensure_private_dir(dir: &Path) -> Result<PathBuf, HostProblem> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| HostProblem::ledger(dir, e))?;
    // Narrowed, not set: group and other lose their bits, the owner's stay as the user left them.
    let mode = std::fs::metadata(dir).map_err(|e| HostProblem::ledger(dir, e))?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & 0o7700)).map_err(|e| HostProblem::ledger(dir, e))?;
    }
    private_passwords(dir);
    std::fs::canonicalize(dir).map_err(|e| HostProblem::ledger(dir, e))
}

/// Every file the component creates in the ledger is made 0600 as it is created (audit.rs);
/// a ledger written before that kept each work's server password 0644: make those 0600.
/// Only in the ledger's own work folders: a name that is no work id, or a symlink (to
/// anywhere), is the user's, and nothing under it is touched.
fn private_passwords(ledger: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let works = ledger.join("works");
    if !std::fs::symlink_metadata(&works).is_ok_and(|m| m.is_dir()) {
        return;
    }
    for work in std::fs::read_dir(works).into_iter().flatten().flatten() {
        let id = work.file_name();
        // Work ids are [a-z0-9-] (the component's rule, narrower still).
        let is_work_id = id.to_str().is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
        if !is_work_id || !work.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let p = work.path().join("password");
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o077 != 0 => {
                let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600));
            }
            _ => {}
        }
    }
}
