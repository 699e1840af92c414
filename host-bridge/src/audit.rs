//! What the plugin can touch, read from the real component, and what each call did touch.
//!
//! `reach` lists the component's imports and exports (from its own type, not a
//! hard-coded list) beside the policy's programs (each with its argument grants and its
//! child's environment) and folders. `AuditLog` appends one JSON line per call with the
//! trace the runtime kept (runtime/trace.rs, each spawn naming the grant it matched);
//! audit only reads it.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::{json, Value};
use wasmtime::component::types::ComponentItem;

use crate::runtime::{Runtime, Trace};

/// The component's reach: imports and exports by interface, with their functions.
pub fn reach(rt: &Runtime) -> Value {
    let engine = rt.engine();
    let ty = rt.component().component_type();
    let list = |items: Vec<(String, ComponentItem)>| -> Vec<Value> {
        items
            .into_iter()
            .map(|(name, item)| {
                let funcs: Vec<String> = match &item {
                    ComponentItem::ComponentInstance(inst) => inst
                        .exports(engine)
                        .filter(|(_, i)| matches!(i.ty, ComponentItem::ComponentFunc(_)))
                        .map(|(n, _)| n.to_string())
                        .collect(),
                    _ => Vec::new(),
                };
                json!({ "name": name, "functions": funcs })
            })
            .collect()
    };
    let imports = list(ty.imports(engine).map(|(n, i)| (n.to_string(), i.ty)).collect());
    let exports = list(ty.exports(engine).map(|(n, i)| (n.to_string(), i.ty)).collect());
    let policy = rt.policy();
    json!({
        "component": { "sha256": rt.sha256, "bytes": rt.size },
        "imports": imports,
        "exports": exports,
        "programs": policy.programs().iter().map(|(k, v)| {
            let grants = crate::policy::file().program(k).map(|p| p.grants.as_slice()).unwrap_or_default();
            json!({
                "name": k,
                "path": v.display().to_string(),
                "grants": grants,
                // The variables its child may inherit (those the host has are passed on).
                "environment": crate::policy::child_env_names(k),
            })
        }).collect::<Vec<_>>(),
        "programsRefused": "every other name, every path, and every argument list no grant matches",
        "paths": policy.preopens().iter().map(|p| json!({ "path": p.path.display().to_string(), "why": p.why, "mode": "read-write" })).collect::<Vec<_>>(),
        "denied": ["environment variables", "arguments", "stdin/stdout/stderr", "clocks", "random", "sockets and network", "any folder not listed"],
    })
}

/// Human-readable form of `reach`.
pub fn render(reach: &Value) -> String {
    let mut s = String::new();
    let c = &reach["component"];
    s.push_str(&format!("component  sha256 {}  ({} bytes)\n", c["sha256"].as_str().unwrap_or(""), c["bytes"]));
    for (title, key) in [("imports", "imports"), ("exports", "exports")] {
        s.push_str(&format!("{title}:\n"));
        for i in reach[key].as_array().into_iter().flatten() {
            let funcs: Vec<&str> = i["functions"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            s.push_str(&format!("  {}\n", i["name"].as_str().unwrap_or("")));
            if !funcs.is_empty() {
                s.push_str(&format!("      {}\n", funcs.join(", ")));
            }
        }
    }
    s.push_str("programs it may run, only with these arguments (everything else is refused):\n");
    for p in reach["programs"].as_array().into_iter().flatten() {
        let name = p["name"].as_str().unwrap_or("");
        s.push_str(&format!("  {name:<9} -> {}\n", p["path"].as_str().unwrap_or("")));
        for g in p["grants"].as_array().into_iter().flatten() {
            let args: Vec<&str> = g["args"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            s.push_str(&format!("      {:<18} {name} {}\n", g["name"].as_str().unwrap_or(""), args.join(" ")));
        }
        let env: Vec<&str> = p["environment"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        s.push_str(&format!("      {:<18} {}\n", "(environment)", env.join(" ")));
    }
    s.push_str("folders it may touch (nothing else):\n");
    for p in reach["paths"].as_array().into_iter().flatten() {
        s.push_str(&format!("  {:<9} {} ({})\n", p["why"].as_str().unwrap_or(""), p["path"].as_str().unwrap_or(""), p["mode"].as_str().unwrap_or("")));
    }
    let denied: Vec<&str> = reach["denied"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    s.push_str(&format!("denied to the component: {}\n", denied.join(", ")));
    s
}

/// One JSON line per tool call, appended to `--audit-log FILE` (or the option `auditLog`).
///
/// Each line goes out whole in one `write` on an `O_APPEND` descriptor, so lines from hosts
/// writing at once (several `boxd-host call`s, an MCP server beside them) never interleave.
/// The path must name a regular file: it is opened without following a symbolic link and
/// without blocking (a FIFO there would block the open forever), and made owner-only.
/// Before each line the path is looked at again: a log deleted or rotated away is
/// reopened (created) by its path, so lines never go to an unlinked file. A line that cannot
/// be written (a part of it written is taken back: `append_whole`) is said on stderr and
/// remembered (`failed`, `lost`): `call` then exits 2, the MCP server says `auditFailed` in
/// every later result. A line written while a signal stops the host says `interrupted`.
pub struct AuditLog {
    /// The path and its open file.
    file: Option<(PathBuf, std::fs::File)>,
    /// What went wrong with the last line that could not be written.
    failed: Option<String>,
    /// How many lines could not be written since it was opened.
    lost: u32,
}

/// Open `path` for appending: create it 0600, never through a symbolic link, never
/// blocking; refuse anything but a regular file; narrow a file already there to 0600.
fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::PermissionsExt;
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => std::io::Error::other("it is a symbolic link"),
            Some(libc::ENXIO) => std::io::Error::other("it is a FIFO or socket, not a regular file"),
            _ => e,
        })?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::other("it is not a regular file"));
    }
    // A log made by an older host (or by hand) 0644 is narrowed: the lines name works,
    // sessions and paths.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

/// Whether `file` is still the file at `path` (not deleted, not rotated away).
fn still_at(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.nlink() > 0 && a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

impl AuditLog {
    /// The log at `path` (none: nothing is audited). A path that cannot be opened is a
    /// grant problem (OPTIONS_INVALID naming the path and the flag or option it came from),
    /// answered on every call as the other grant problems are.
    pub fn open(path: Option<&Path>) -> Result<AuditLog> {
        Self::open_from(path, "--audit-log")
    }

    /// As `open`; `from` names where the path came from (`--audit-log`, or the plugin
    /// option `auditLog`), for the message.
    pub fn open_from(path: Option<&Path>, from: &str) -> Result<AuditLog> {
        let file = match path {
            Some(p) => Some((p.to_path_buf(), open_log(p).map_err(|e| problem(p, from, e))?)),
            None => None,
        };
        Ok(AuditLog { file, failed: None, lost: 0 })
    }

    /// What went wrong with the last line that could not be written, if one could not.
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// How many lines could not be written since the log was opened (each said on stderr).
    pub fn lost(&self) -> u32 {
        self.lost
    }

    pub fn record(&mut self, tool: &str, duration_ms: u64, result: &std::result::Result<(), String>, trace: &Trace) {
        let Some((path, f)) = &mut self.file else { return };
        let mut line = json!({
            "tool": tool,
            "duration_ms": duration_ms,
            "result": match result { Ok(()) => json!("ok"), Err(code) => json!({ "error": code }) },
            "spawns": trace.spawns,
            "paths": trace.paths,
        });
        // A signal is stopping the host (crate::interrupt): this call's children were
        // killed, or never started (their outcome says "interrupted").
        if let Some(sig) = crate::interrupt::received() {
            line["interrupted"] = json!(crate::interrupt::name(sig));
        }
        // The whole line, newline included, in one buffer and one write.
        let mut buf = line.to_string().into_bytes();
        buf.push(b'\n');
        let written = (|| {
            if !still_at(f, path) {
                *f = open_log(path)?;
            }
            append_whole(f, &buf)
        })();
        if let Err(e) = written {
            let why = format!("cannot write the audit log {}: {e}; the line for {tool} is lost", path.display());
            eprintln!("boxd-host: {why}");
            self.lost += 1;
            self.failed = Some(why);
        }
    }
}

/// Append `line` (newline included) in one `write`, or not at all. A write that lands only
/// in part (a full disk, a file-size limit) is taken back, so the log holds whole lines
/// only and the next line never lands glued to a fragment. It is never retried for the
/// rest: with `O_APPEND` a second write may land after another host's line.
///
/// Where the fragment lies comes from where this write ended (the descriptor's offset),
/// never from a length remembered before it: another host's line appended in between would
/// be cut. The fragment is cut off when it is still the end of the file; when another
/// host's line already follows it, cutting would lose that line, so the fragment is
/// overwritten with spaces instead: the two make one line that is still one JSON value
/// (leading whitespace is allowed), the other host's.
fn append_whole(f: &mut std::fs::File, line: &[u8]) -> std::io::Result<()> {
    use std::io::Seek;
    let n = f.write(line)?;
    if n == line.len() {
        return Ok(());
    }
    let short = format!("only {n} of the line's {} bytes could be written (is the disk full?)", line.len());
    let end = f.stream_position()?;
    let start = end - n as u64;
    let taken_back = if f.metadata()?.len() == end { f.set_len(start) } else { blank(f, start, n) };
    match taken_back {
        Ok(()) => Err(std::io::Error::other(format!("{short}; the part written was taken back"))),
        Err(e) => Err(std::io::Error::other(format!("{short}, and the part written could not be taken back ({e})"))),
    }
}

/// Overwrite `len` bytes at `at` with spaces. `O_APPEND` is cleared for the write (Linux
/// appends a positioned write on such a descriptor) and set again; the descriptor is this
/// log's own, used by one thread.
fn blank(f: &std::fs::File, at: u64, len: usize) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let fd = f.as_raw_fd();
    // SAFETY: fcntl(2) reads and sets the status flags of a descriptor we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_APPEND) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let blanked = f.write_all_at(&vec![b' '; len], at);
    // SAFETY: as above, restoring the flags read.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    blanked
}

/// An audit log that cannot be opened, as a grant problem: OPTIONS_INVALID, naming the
/// path and what to do.
fn problem(path: &Path, from: &str, e: std::io::Error) -> crate::policy::HostProblem {
    let invalid = &crate::policy::file().options_invalid;
    let (message, next) = if from == "--audit-log" {
        (
            format!("--audit-log {}: cannot open it for appending ({e})", path.display()),
            "Give --audit-log the path of a regular file (or of none yet) in a folder that exists and you can write, then run again.".to_string(),
        )
    } else {
        (format!("plugin option '{from}' names {}, which cannot be opened for appending ({e})", path.display()), invalid.next.replace("{field}", from))
    };
    crate::policy::HostProblem { code: invalid.code.clone(), message, next }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fragment with another host's line already after it is blanked in place, and the
    /// descriptor appends again afterwards.
    #[test]
    fn a_fragment_followed_by_another_line_is_blanked_and_appending_goes_on() {
        let path = std::env::temp_dir().join(format!("audit-blank-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut f = open_log(&path).unwrap();
        f.write_all(b"{\"a\":1}\n{\"torn\":{\"b\":2}\n").unwrap();
        blank(&f, 8, 8).unwrap();
        f.write_all(b"{\"c\":3}\n").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "{\"a\":1}\n        {\"b\":2}\n{\"c\":3}\n");
        for line in text.lines() {
            serde_json::from_str::<Value>(line).unwrap();
        }
        let _ = std::fs::remove_file(&path);
    }
}
