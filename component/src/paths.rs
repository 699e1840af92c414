//! Names and paths: work ids, machine and snapshot names, laptop paths and guest paths.
//! Pure string rules (no I/O); the file capability enforces the preopens by construction,
//! these rules make the refusals readable and early.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::errors::{Code, ToolError, ToolResult};

/// Work ids become machine names `oc-<id>`, which must stay valid boxd names (a DNS
/// label of at most 63 characters), so a work id is at most 40 characters.
pub const WORK_ID_MAX: usize = 40;

fn is_label(s: &str, max: usize) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= max
        && b[0].is_ascii_lowercase()
        && !s.ends_with('-')
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

pub fn is_snapshot_name(s: &str) -> bool {
    is_label(s, 63)
}

/// Check a work id and return the machine name it maps to.
pub fn work_id(id: &str) -> ToolResult<String> {
    if is_label(id, WORK_ID_MAX) {
        Ok(machine_name(id))
    } else {
        Err(ToolError::new(
            Code::NameInvalid,
            format!("work id '{id}' is not a short lowercase id: use [a-z0-9-], start with a letter, end with a letter or digit, at most {WORK_ID_MAX} characters"),
        ))
    }
}

/// How every machine this plugin makes is named: `oc-` and the work id.
const MACHINE_PREFIX: &str = "oc-";

pub fn machine_name(work: &str) -> String {
    format!("{MACHINE_PREFIX}{work}")
}

/// Whether a machine's name is one this plugin gives (any ledger's, on this account).
pub fn plugin_machine(name: &str) -> bool {
    name.starts_with(MACHINE_PREFIX)
}

/// Normalise an absolute path: collapse `//` and `.`, refuse `..` and relative paths.
pub fn clean_absolute(p: &str) -> Option<String> {
    if !p.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => return None,
            s => parts.push(s),
        }
    }
    let mut out = String::from("/");
    out.push_str(&parts.join("/"));
    Some(out)
}

/// Whether `p` is already clean (`clean_absolute` would leave it as it is, but for
/// trailing slashes): the check each filesystem call makes, without building the clean
/// copy.
pub fn is_clean_absolute(p: &str) -> bool {
    if p == "/" {
        return true;
    }
    let Some(rest) = p.strip_prefix('/') else { return false };
    let rest = rest.trim_end_matches('/');
    !rest.is_empty() && rest.split('/').all(|s| !s.is_empty() && s != "." && s != "..")
}

/// A relative path inside the guest's work tree: no absolute form, no `..`, no empty or
/// control characters. Returns the normalised form.
pub fn guest_relative(p: &str) -> ToolResult<String> {
    let bad = |why: &str| {
        ToolError::new(Code::NameInvalid, format!("guest path '{p}' {why}; use a relative path inside the work tree"))
    };
    if p.is_empty() {
        return Err(bad("is empty"));
    }
    if p.starts_with('/') || p.starts_with('~') {
        return Err(bad("is absolute"));
    }
    if p.chars().any(|c| c.is_control()) {
        return Err(bad("has a control character"));
    }
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => return Err(bad("contains '..'")),
            s => parts.push(s),
        }
    }
    if parts.is_empty() {
        return Err(bad("names the work tree itself"));
    }
    // "./~/x" must not become "~/x", which a guest shell or `boxd machine cp` expands.
    if parts[0].starts_with('~') {
        return Err(bad("is absolute"));
    }
    Ok(parts.join("/"))
}

/// Whether `path` is `root` or below it (both already clean and absolute).
pub fn is_within(path: &str, root: &str) -> bool {
    root == "/" || path == root || (path.starts_with(root) && path.as_bytes().get(root.len()) == Some(&b'/'))
}

pub fn join(base: &str, rel: &str) -> String {
    if rel.is_empty() {
        return base.to_string();
    }
    if base.ends_with('/') { format!("{base}{rel}") } else { format!("{base}/{rel}") }
}

/// The parent folder of a clean absolute path.
pub fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) => "/",
        Some(i) => &path[..i],
        None => "",
    }
}

/// A laptop path the user named: resolved against `base` when relative, cleaned, and
/// required to lie inside one of `roots` (the project and the allowed roots).
pub fn laptop_path(p: &str, base: &str, roots: &[&str]) -> ToolResult<String> {
    let joined = if p.starts_with('/') { p.to_string() } else { join(base, p) };
    let refused = |why: &str| ToolError::new(Code::PathRefused, format!("laptop path '{p}' {why}"));
    let clean = clean_absolute(&joined).ok_or_else(|| refused("contains '..'"))?;
    if roots.iter().any(|r| is_within(&clean, r)) {
        Ok(clean)
    } else {
        Err(refused("is outside the project and the allowed roots"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_ids() {
        assert_eq!(work_id("w1").unwrap(), "oc-w1");
        assert_eq!(work_id("fix-login-42").unwrap(), "oc-fix-login-42");
        for bad in ["", "W1", "1w", "w_1", "w-", "a b", "w/1", &"a".repeat(41)] {
            assert_eq!(work_id(bad).unwrap_err().code, Code::NameInvalid, "{bad:?}");
        }
    }

    #[test]
    fn guest_paths() {
        assert_eq!(guest_relative("data/in.json").unwrap(), "data/in.json");
        assert_eq!(guest_relative("./a//b").unwrap(), "a/b");
        assert_eq!(guest_relative("naïve file.txt").unwrap(), "naïve file.txt");
        for bad in ["/etc/passwd", "../x", "a/../../b", "", ".", "~/x", "./~/x", ".//~", "a\nb"] {
            assert_eq!(guest_relative(bad).unwrap_err().code, Code::NameInvalid, "{bad:?}");
        }
    }

    #[test]
    fn laptop_paths_stay_in_roots() {
        let roots = ["/p", "/srv/work"];
        assert_eq!(laptop_path("a.txt", "/p", &roots).unwrap(), "/p/a.txt");
        assert_eq!(laptop_path("/srv/work/x", "/p", &roots).unwrap(), "/srv/work/x");
        assert_eq!(laptop_path("/srv/workshop/x", "/p", &roots).unwrap_err().code, Code::PathRefused);
        assert_eq!(laptop_path("../etc/passwd", "/p", &roots).unwrap_err().code, Code::PathRefused);
        assert_eq!(laptop_path("/etc/passwd", "/p", &roots).unwrap_err().code, Code::PathRefused);
    }

    #[test]
    fn clean_and_parent() {
        assert_eq!(clean_absolute("/a//b/./c").unwrap(), "/a/b/c");
        assert_eq!(clean_absolute("/a/../b"), None);
        assert_eq!(parent("/a/b"), "/a");
        assert_eq!(parent("/a"), "/");
    }
}
