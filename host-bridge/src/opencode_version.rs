//! The laptop OpenCode's version, looked up once per binary and passed to the component
//! in the call context, so a tool never pays for `opencode --version` (about a second)
//! per call. A binary is known by its canonical path, size, modification time, inode and
//! status-change time: a same-size file put back with its old mtime (`cp -p`, `touch -r`)
//! still has a new ctime, which no user tool sets back. The answers are kept in the cache
//! folder (`opencode-versions.json`), and a long-lived host (MCP) stats the binary before
//! each call, so an upgrade is seen at once. A launcher that picks the real binary itself
//! (a version manager's shim) is the one file whatever it runs: its version is the one
//! first asked (docs/architecture.md). A lookup is the host's own call, run by the one
//! process runner and written to the audit log as `host:opencode` (session::host_call).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use crate::audit::AuditLog;
use crate::policy::Policy;

/// What identifies one build of the binary.
fn key(binary: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(binary).ok()?;
    let mtime = m.modified().ok()?.duration_since(UNIX_EPOCH).ok()?.as_nanos();
    Some(format!("{}|{}|{mtime}|{}|{}.{:09}", binary.display(), m.len(), m.ino(), m.ctime(), m.ctime_nsec()))
}

pub struct OpencodeVersion {
    binary: Option<PathBuf>,
    cache_file: Option<PathBuf>,
    /// (key, version) of the last lookup in this process.
    known: Option<(String, String)>,
}

impl OpencodeVersion {
    /// For the `opencode` the policy grants (none granted: the version is never known).
    pub fn new(policy: &Policy, cache_dir: Option<&Path>) -> OpencodeVersion {
        let binary = policy.allows("opencode").ok().and_then(|p| std::fs::canonicalize(p).ok());
        OpencodeVersion { binary, cache_file: cache_dir.map(|d| d.join("opencode-versions.json")), known: None }
    }

    /// The version, or None when the binary does not answer with one (the component then
    /// says what it needs, e.g. OPENCODE_MISSING for harvest).
    pub fn get(&mut self, policy: &Policy, audit: &mut AuditLog) -> Option<String> {
        let binary = self.binary.clone()?;
        let key = key(&binary)?;
        if let Some((k, v)) = &self.known {
            if *k == key {
                return Some(v.clone());
            }
        }
        let mut cached = self.read_cache();
        let version = match cached.get(&key) {
            Some(v) => v.clone(),
            None => {
                let v = ask(&binary, policy, audit)?;
                cached.retain(|k, _| !k.starts_with(&format!("{}|", binary.display())));
                cached.insert(key.clone(), v.clone());
                self.write_cache(&cached);
                v
            }
        };
        self.known = Some((key, version.clone()));
        Some(version)
    }

    fn read_cache(&self) -> BTreeMap<String, String> {
        let text = self.cache_file.as_ref().and_then(|f| std::fs::read_to_string(f).ok());
        text.and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default()
    }

    /// Best effort: a cache that cannot be written only costs the next process a lookup.
    fn write_cache(&self, map: &BTreeMap<String, String>) {
        let Some(file) = &self.cache_file else { return };
        let _ = std::fs::create_dir_all(file.parent().unwrap_or(Path::new(".")));
        let tmp = file.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, serde_json::to_vec(map).unwrap_or_default()).is_ok() {
            let _ = std::fs::rename(&tmp, file);
        }
    }
}

/// `opencode --version` through the one process runner, with the policy's environment,
/// written to the audit log as the host's own call (`host:opencode`), as the tour's are.
fn ask(binary: &Path, policy: &Policy, audit: &mut AuditLog) -> Option<String> {
    let spawn = crate::spawn::Spawn {
        name: "opencode",
        binary,
        args: &["--version".to_string()],
        env: &policy.child_env("opencode"),
        cwd: None,
        stdin: None,
        timeout: Duration::from_secs(60),
        bounds: crate::policy::bounds(),
    };
    let grant = "host: opencode --version (the host's own call: the laptop OpenCode's version, for the call context)".to_string();
    let out = crate::session::host_call(audit, "host:opencode", grant, spawn).ok().filter(|o| o.exit_code == Some(0))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text.lines().next().unwrap_or("").trim();
    let plausible = !v.is_empty() && v.len() <= 40 && v.starts_with(|c: char| c.is_ascii_digit()) && v.bytes().all(|c| c.is_ascii_alphanumeric() || b".-+".contains(&c));
    plausible.then(|| v.to_string())
}
