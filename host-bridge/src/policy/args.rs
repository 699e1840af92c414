//! Argument grants: which argument lists the component may give each program. A grant is
//! a list of token patterns, matched one token to one argument:
//!
//! - a literal (`machine`, `--json`) matches itself;
//! - `PREFIX{class}` matches PREFIX followed by a non-empty value of the class (`oc-{name}`,
//!   `HEAD:refs/boxd/{name}`; the prefix may be empty);
//! - `{rest}`, only as the last token, matches every remaining argument (none included).
//!
//! The classes are `name` (a lowercase label, as machine and snapshot names are), `int`,
//! `hex`, `id` (letters and digits) and `path` (absolute, no `..`, and landing inside one
//! of the call's preopens once symlinks are followed: the caller's `confined`, else a
//! granted program could be pointed at any file on the laptop). The OpenCode bridge
//! implements the same matcher and refusal in lib/args.js; tests/vectors/policy.json
//! holds both to one outcome.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One grant of policy.json `programs[].grants`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    pub name: String,
    pub args: Vec<String>,
}

const CLASSES: [&str; 5] = ["name", "int", "hex", "id", "path"];

/// Whether `v` is a value of `class` (one of CLASSES).
fn in_class(class: &str, v: &str) -> bool {
    let b = v.as_bytes();
    let all = |f: fn(&u8) -> bool| !b.is_empty() && b.iter().all(f);
    match class {
        "name" => b.len() <= 63 && b.first().is_some_and(u8::is_ascii_lowercase) && !v.ends_with('-') && all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-'),
        "int" => b.len() <= 10 && all(u8::is_ascii_digit),
        "hex" => b.len() <= 64 && all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c)),
        "id" => b.len() <= 128 && all(u8::is_ascii_alphanumeric),
        "path" => v.starts_with('/') && b.len() <= 4096 && !v.split('/').any(|s| s == "..") && !b.iter().any(u8::is_ascii_control),
        _ => false,
    }
}

/// A token pattern split into (literal prefix, class); a plain literal has no class.
fn split(token: &str) -> (&str, Option<&str>) {
    match token.strip_suffix('}').and_then(|t| t.rsplit_once('{')) {
        Some((prefix, class)) => (prefix, Some(class)),
        None => (token, None),
    }
}

/// Whether a `{path}` value resolves inside the call's preopens (Policy::confined).
pub type Confined<'c> = &'c dyn Fn(&str) -> bool;

fn token_matches(token: &str, arg: &str, confined: Confined) -> bool {
    match split(token) {
        (literal, None) => literal == arg,
        (prefix, Some(class)) => arg.strip_prefix(prefix).is_some_and(|v| in_class(class, v) && (class != "path" || confined(v))),
    }
}

/// How many leading arguments the grant matches; `{rest}` matches all that remain.
fn matched(grant: &Grant, args: &[String], confined: Confined) -> (usize, bool) {
    for (i, token) in grant.args.iter().enumerate() {
        if token == "{rest}" {
            return (args.len(), true);
        }
        match args.get(i) {
            Some(a) if token_matches(token, a, confined) => {}
            _ => return (i, false),
        }
    }
    (grant.args.len(), args.len() == grant.args.len())
}

/// The first grant that allows `args`, or the refusal: the program and the refused
/// arguments, and the grant nearest to them (the one matching the longest leading run of
/// arguments; the first such in the file). A `{path}` outside the preopens is refused as
/// any other argument no grant takes.
pub fn check<'g>(program: &str, grants: &'g [Grant], args: &[String], confined: Confined) -> Result<&'g Grant, String> {
    let mut nearest: Option<(usize, &Grant)> = None;
    for g in grants {
        let (n, whole) = matched(g, args, confined);
        if whole {
            return Ok(g);
        }
        if n > 0 && nearest.is_none_or(|(best, _)| n > best) {
            nearest = Some((n, g));
        }
    }
    let asked = format!("{program}{}", args.iter().map(|a| format!(" {}", show(a))).collect::<String>());
    let names = grants.iter().map(|g| g.name.as_str()).collect::<Vec<_>>().join(", ");
    Err(match (nearest, args.first()) {
        (Some((_, g)), _) => format!("{asked}: no grant allows these arguments; the nearest, {program} {}, allows {program} {}", g.name, g.args.join(" ")),
        (None, Some(first)) => format!("{asked}: no grant of {program} starts with {}; its grants: {names}", show(first)),
        (None, None) => format!("{asked}: no grant of {program} takes no arguments; its grants: {names}"),
    })
}

/// An argument as a refusal shows it: plain when it is a plain word, else JSON-quoted.
fn show(arg: &str) -> String {
    let plain = !arg.is_empty() && arg.bytes().all(|c| c.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(&c));
    if plain {
        arg.to_string()
    } else {
        serde_json::to_string(arg).expect("a string serialises")
    }
}

/// Where `path` leads once every symlink on it is followed (lib/args.js `landing`). A path
/// not there yet leads where its nearest existing parent does, plus the missing names (a
/// missing bundle is then git's own error, not a refusal); a dangling or looping symlink,
/// or a name that cannot be looked at, leads nowhere (None).
pub fn landing(path: &Path) -> Option<PathBuf> {
    let mut missing = Vec::new();
    let mut at = path;
    loop {
        match std::fs::canonicalize(at) {
            Ok(real) => return Some(missing.into_iter().rev().fold(real, |p, name| p.join(name))),
            Err(_) if std::fs::symlink_metadata(at).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) => {
                missing.push(at.file_name()?);
                at = at.parent()?;
            }
            Err(_) => return None,
        }
    }
}

/// Why a program's grants are not a valid list (policy.json is checked at load).
pub fn invalid(program: &str, grants: &[Grant]) -> Option<String> {
    if grants.is_empty() {
        return Some(format!("programs.{program}.grants is empty"));
    }
    for (i, g) in grants.iter().enumerate() {
        let at = format!("programs.{program}.grants '{}'", g.name);
        let word = !g.name.is_empty() && g.name.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-');
        if !word || grants[..i].iter().any(|o| o.name == g.name) {
            return Some(format!("{at}: a grant name is a lowercase word, given once"));
        }
        match g.args.first().map(|t| split(t)) {
            Some((_, None)) => {}
            _ => return Some(format!("{at}: the first token must be a literal")),
        }
        for (j, t) in g.args.iter().enumerate() {
            if t == "{rest}" && j + 1 != g.args.len() {
                return Some(format!("{at}: {{rest}} may only be the last token"));
            }
            let (prefix, class) = split(t);
            if t != "{rest}" && (prefix.contains(['{', '}']) || class.is_some_and(|c| !CLASSES.contains(&c)) || t.is_empty()) {
                return Some(format!("{at}: '{t}' is not a literal, PREFIX{{class}} (class one of {}) or {{rest}}", CLASSES.join(", ")));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(name: &str, args: &[&str]) -> Grant {
        Grant { name: name.into(), args: args.iter().map(|a| a.to_string()).collect() }
    }

    const ANY: Confined = &|_| true;

    fn v(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn classes_take_exactly_their_values() {
        for (class, yes, no) in [
            ("name", &["w1", "fix-login-42", "a"][..], &["", "W1", "1w", "w-", "-w", "w_1", "w.1"][..]),
            ("int", &["0", "3600"], &["", "-1", "1.5", "12345678901", "1e3"]),
            ("hex", &["0af3", "deadbeef"], &["", "DEAD", "xyz"]),
            ("id", &["01JX4abc", "Z"], &["", "a_b", "a-b", "a b"]),
            ("path", &["/l/works/w1/export-0a.json", "/"], &["", "rel/x", "/a/../b", "/a/..", "/a\nb", "-x"]),
        ] {
            for y in yes {
                assert!(in_class(class, y), "{class} {y:?}");
            }
            for n in no {
                assert!(!in_class(class, n), "{class} {n:?}");
            }
        }
        assert!(!in_class("any", "x"), "an unknown class matches nothing");
    }

    #[test]
    fn a_grant_matches_token_for_token_and_rest_takes_the_tail() {
        let grants = [g("get", &["machine", "get", "oc-{name}", "--json"]), g("exec", &["machine", "exec", "oc-{name}", "--", "{rest}"])];
        assert_eq!(check("boxd", &grants, &v(&["machine", "get", "oc-w1", "--json"]), ANY).unwrap().name, "get");
        assert_eq!(check("boxd", &grants, &v(&["machine", "exec", "oc-w1", "--"]), ANY).unwrap().name, "exec");
        assert_eq!(check("boxd", &grants, &v(&["machine", "exec", "oc-w1", "--", "sh", "-c", "x y"]), ANY).unwrap().name, "exec");
        for refused in [&["machine", "get", "web", "--json"][..], &["machine", "get", "oc-w1"], &["machine", "get", "oc-w1", "--json", "-v"], &["machine", "get", "oc-", "--json"]] {
            assert!(check("boxd", &grants, &v(refused), ANY).is_err(), "{refused:?}");
        }
    }

    #[test]
    fn a_refusal_names_the_arguments_and_the_nearest_grant() {
        let grants = [g("list", &["machine", "list", "--json"]), g("remove", &["machine", "remove", "oc-{name}", "-y"])];
        assert_eq!(
            check("boxd", &grants, &v(&["machine", "remove", "web", "-y"]), ANY).unwrap_err(),
            "boxd machine remove web -y: no grant allows these arguments; the nearest, boxd remove, allows boxd machine remove oc-{name} -y"
        );
        assert_eq!(check("boxd", &grants, &v(&["auth", "logout"]), ANY).unwrap_err(), "boxd auth logout: no grant of boxd starts with auth; its grants: list, remove");
        assert_eq!(check("boxd", &grants, &[], ANY).unwrap_err(), "boxd: no grant of boxd takes no arguments; its grants: list, remove");
        assert_eq!(check("boxd", &grants, &v(&["a b", ""]), ANY).unwrap_err(), "boxd \"a b\" \"\": no grant of boxd starts with \"a b\"; its grants: list, remove");
    }

    #[test]
    fn a_path_outside_the_preopens_is_refused_as_any_argument_no_grant_takes() {
        let grants = [g("import", &["import", "{path}"])];
        let inside: Confined = &|p| p.starts_with("/l/");
        assert_eq!(check("opencode", &grants, &v(&["import", "/l/x.json"]), inside).unwrap().name, "import");
        assert_eq!(
            check("opencode", &grants, &v(&["import", "/etc/hostname"]), inside).unwrap_err(),
            "opencode import /etc/hostname: no grant allows these arguments; the nearest, opencode import, allows opencode import {path}"
        );
        // Other classes are never asked about.
        assert!(check("boxd", &[g("get", &["get", "{name}"])], &v(&["get", "w1"]), &|_| false).is_ok());
    }

    #[test]
    fn malformed_grants_are_named() {
        for (grants, says) in [
            (vec![], "is empty"),
            (vec![g("x", &["{name}"])], "first token must be a literal"),
            (vec![g("x", &["a", "{rest}", "b"])], "{rest} may only be the last"),
            (vec![g("x", &["a", "oc-{any}"])], "'oc-{any}' is not"),
            (vec![g("x", &["a", "{a}{name}"])], "'{a}{name}' is not"),
            (vec![g("x", &["a"]), g("x", &["b"])], "given once"),
            (vec![g("X", &["a"])], "given once"),
        ] {
            let why = invalid("boxd", &grants).expect(says);
            assert!(why.contains(says), "{why}");
        }
        assert_eq!(invalid("boxd", &[g("ok", &["a", "oc-{name}", "{rest}"])]), None);
    }
}
