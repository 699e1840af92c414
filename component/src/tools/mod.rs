//! Tool dispatch: the checks every call passes in the same order (tool known, arguments
//! match the schema, options valid, host version tested, access allows), then the tool's
//! `run` from the registry. Tools receive their capabilities in their `Env` and never
//! reach for a global; the checks they share on works and machines live here and in
//! `machine`.

use alloc::format;
use alloc::string::String;
use serde_json::Value;

use crate::caps::{Files, Programs};
use crate::errors::{Code, ToolError, ToolResult};
use crate::options::{self, AccessOption, Context};
use registry::ToolAccess;

pub mod account;
pub mod admission;
pub mod drop;
pub mod fork;
pub mod harvest;
pub mod image;
pub mod job;
pub mod landing;
pub mod lifecycle;
pub mod machine;
pub mod preflight;
pub mod registry;
pub mod status;
pub mod submit;

/// What a tool gets: the two capabilities and the call's context. The capabilities are
/// trait objects so one table of plain `fn`s (the registry) serves every host; a tool
/// lends them to the adapters as `&mut env.programs` / `&mut env.files`.
pub struct Env<'a> {
    pub programs: &'a mut dyn Programs,
    pub files: &'a mut dyn Files,
    pub ctx: &'a Context,
}

impl Env<'_> {
    pub fn now(&self) -> String {
        crate::ledger::iso8601(self.ctx.now_ms)
    }
}

/// The context as a host passes it (the WIT `context`), before the options are validated.
pub struct RawContext {
    pub host_name: String,
    pub host_version: String,
    pub options_json: String,
    pub project: String,
    pub ledger: String,
    pub now_ms: u64,
    pub entropy: alloc::vec::Vec<u8>,
    pub facts: options::HostFacts,
}

/// The call's context with its options validated (OPTIONS_INVALID names the field).
pub fn context(raw: RawContext) -> ToolResult<Context> {
    Ok(Context {
        options: options::Options::parse(&raw.options_json)?,
        facts: raw.facts,
        host_name: raw.host_name,
        host_version: raw.host_version,
        project: raw.project,
        ledger: raw.ledger,
        now_ms: raw.now_ms,
        entropy: raw.entropy,
    })
}

/// The checks every call passes before its tool runs, in order: the tool is known, the
/// arguments match its schema, the options are valid, the host is tested, the access
/// option allows a change at all. Approval is left to the caller.
fn admit(tool: &str, args_json: &str, raw: RawContext) -> ToolResult<(&'static registry::ToolSpec, Value, Context)> {
    let spec = registry::find(tool).ok_or_else(|| {
        let names: alloc::vec::Vec<&str> = registry::TOOLS.iter().map(|t| t.name).collect();
        ToolError::new(Code::ToolUnknown, format!("there is no tool '{tool}'; the tools are {}", names.join(", ")))
    })?;
    let args: Value = if args_json.trim().is_empty() {
        Value::Object(Default::default())
    } else {
        serde_json::from_str(args_json)
            .map_err(|e| ToolError::new(Code::ArgsInvalid, format!("the arguments are not valid JSON: {e}")))?
    };
    crate::schema::check(&(spec.schema)(), &args)?;
    let ctx = context(raw)?;
    if !spec.on_untested_host {
        host_gate(&ctx)?;
    }
    if spec.access == ToolAccess::Change {
        match ctx.options.access {
            AccessOption::All => {}
            AccessOption::ReadOnly => {
                return Err(ToolError::new(Code::AccessDenied, format!("{} changes a machine, and the plugin's access is \"read-only\"", spec.name)));
            }
            AccessOption::AskChanges => {}
        }
    }
    Ok((spec, args, ctx))
}

/// One tool call, as every host makes it.
pub fn call<P: Programs, F: Files>(programs: &mut P, files: &mut F, tool: &str, args_json: &str, raw: RawContext) -> ToolResult<Value> {
    let (spec, args, ctx) = admit(tool, args_json, raw)?;
    if spec.access == ToolAccess::Change && ctx.options.access == AccessOption::AskChanges && !ctx.facts.approved {
        return Err(ToolError::new(Code::ApprovalRequired, format!("{} changes a machine and needs the user's approval first", spec.name)));
    }
    let mut env = Env { programs, files, ctx: &ctx };
    (spec.run)(&mut env, &args)
}

/// A call's checks without the call (the WIT `check`): everything `admit` checks, then
/// the tool's own refusals, through capabilities that allow reads only. Ok means the
/// call may go ahead; a host asks the user only then.
pub fn check<P: Programs, F: Files>(programs: &mut P, files: &mut F, tool: &str, args_json: &str, raw: RawContext) -> ToolResult<()> {
    let (spec, args, ctx) = admit(tool, args_json, raw)?;
    let Some(check) = spec.check else { return Ok(()) };
    let (mut programs, mut files) = (preflight::ReadsOnly(programs), preflight::ReadFiles(files));
    check(&mut Env { programs: &mut programs, files: &mut files, ctx: &ctx }, &args)
}

/// HOST_UNTESTED: OpenCode outside the range our own tests run.
pub fn host_gate(ctx: &Context) -> ToolResult<()> {
    if ctx.host_name == "opencode" && !ctx.options.allow_untested_host && !options::in_tested_range(&ctx.host_version) {
        let (lo, hi) = options::TESTED_OPENCODE;
        return Err(ToolError::with_next(
            Code::HostUntested,
            format!("OpenCode {} is outside the tested range >={lo} <{hi}", ctx.host_version),
            format!("Use OpenCode >={lo} <{hi}, or set \"allowUntestedHost\": true in the plugin options."),
        ));
    }
    Ok(())
}

/// The `work` argument, checked; returns (work id, machine name).
pub fn work_arg(args: &Value) -> ToolResult<(String, String)> {
    let work = args.get("work").and_then(Value::as_str).unwrap_or_default();
    let machine = crate::paths::work_id(work)?;
    Ok((work.into(), machine))
}

/// The laptop folders a tool may touch: the project, then each allowed root.
pub fn laptop_roots(ctx: &Context) -> alloc::vec::Vec<&str> {
    let mut roots = alloc::vec![ctx.project.as_str()];
    roots.extend(ctx.options.allowed_roots.iter().map(String::as_str));
    roots
}

/// The innermost folder this host opened (the project or an allowed root) that holds
/// `path` (clean and absolute), if any: the one rule for "may a tool touch it".
pub fn granted_root<'a>(ctx: &'a Context, path: &str) -> Option<&'a str> {
    laptop_roots(ctx).into_iter().filter(|r| crate::paths::is_within(path, r)).max_by_key(|r| r.len())
}

/// A laptop path a tool may read or write as the user's file: inside the project or an
/// allowed root, and never inside the ledger. A ledger record names a machine to act on,
/// so a file harvested into the ledger would become a work of this laptop (and another
/// project's machine could be adopted and destroyed through it). Nor inside a git
/// repository's own folder (`repository_folder`).
pub fn user_path(ctx: &Context, p: &str, base: &str) -> ToolResult<String> {
    let path = crate::paths::laptop_path(p, base, &laptop_roots(ctx))?;
    if crate::paths::is_within(&path, &ctx.ledger) {
        return Err(crate::errors::ToolError::with_next(
            crate::errors::Code::PathRefused,
            alloc::format!("laptop path '{p}' is inside the plugin's ledger ({}), which holds the plugin's own records, never a user's file", ctx.ledger),
            "Use a path in the project outside the ledger folder (harvest's 'to', submit's 'from', ensure's 'directory'), then try again.",
        ));
    }
    if let Some(at) = repository_folder(ctx, &path) {
        return Err(crate::errors::ToolError::with_next(
            crate::errors::Code::PathRefused,
            alloc::format!("laptop path '{p}' is inside {at}, a git repository's own folder (its refs, config, hooks and objects are git's, never a user's file): a harvest there could move a branch and lose commits, and a file sent from there could carry a remote's credentials"),
            "Use a path in the project outside any .git folder (harvest's 'to' and 'files', submit's 'from', ensure's 'directory'). A work's commits come home in the ledger's bundle; fetchCommits fetches them as refs/boxd/<work>.",
        ));
    }
    if let Some(at) = opencode_config(ctx, &path) {
        return Err(crate::errors::ToolError::with_next(
            crate::errors::Code::PathRefused,
            alloc::format!("laptop path '{p}' is {at}, the laptop OpenCode's own configuration or data (its plugins, tools, MCP servers, permission rules, provider keys and sessions): a file harvested there would run on this laptop as OpenCode's code or lift its permission rules, and one sent from there could carry its keys"),
            "Keep OpenCode's own folders out of the work: for a harvest, have the guest copy the file to another path (a boxd_submit prompt) and harvest that copy, then read it before you put it in place yourself; submit a copy kept elsewhere; start a work in a folder outside them.",
        ));
    }
    Ok(path)
}

/// The laptop OpenCode's own files on the way to `path` below the folder granted for it: a
/// `.opencode` folder (OpenCode loads every one from its working folder up to the worktree
/// root: `plugins/*.js` run as its code), an `opencode.json(c)` or `tui.json(c)` (loaded
/// the same way: plugins, MCP server commands, permission rules), `.config/opencode` (its
/// global configuration), `.local/share/opencode` (its data: `auth.json` holds the
/// provider keys, and the sessions) and `.cache/opencode` (the npm plugins it installs
/// and runs). A guest's file must not land there: the transcript's
/// permission rules are cleaned for the same reason. The root's own folders count for the
/// context (an allowed `~/.config` still has `opencode` below it refused), but a root the
/// user put inside one is theirs, as for `.git`. Any case, as for `.git`.
fn opencode_config(ctx: &Context, path: &str) -> Option<String> {
    let root = granted_root(ctx, path)?.trim_end_matches('/');
    let lower = |p: &str| p.to_ascii_lowercase();
    let mut seen: alloc::vec::Vec<String> = root.split('/').filter(|s| !s.is_empty()).map(lower).collect();
    let mut at = String::from(root);
    for part in path[root.len().min(path.len())..].split('/').filter(|s| !s.is_empty()) {
        at.push('/');
        at.push_str(part);
        seen.push(lower(part));
        let tail = |t: &[&str]| seen.len() >= t.len() && seen[seen.len() - t.len()..].iter().zip(t).all(|(a, b)| a == b);
        let config_file = ["opencode.json", "opencode.jsonc", "tui.json", "tui.jsonc"].iter().any(|n| tail(&[n]));
        if config_file || tail(&[".opencode"]) || tail(&[".config", "opencode"]) || tail(&[".local", "share", "opencode"]) || tail(&[".cache", "opencode"]) {
            return Some(at);
        }
    }
    None
}

/// The `.git` folder (or file: a linked work tree's or a submodule's) on the way to `path`
/// below the folder granted for it, if any. `fetchCommits` is off by default because it
/// writes into the repository; a harvest's `to` or `files` must not reach it either. Any
/// case: on a case-insensitive file system (macOS's default) `.GIT` is the same folder.
/// Only below the granted folder: an allowed root the user put inside one is their choice.
fn repository_folder(ctx: &Context, path: &str) -> Option<String> {
    let root = granted_root(ctx, path)?.trim_end_matches('/');
    let mut at = String::from(root);
    for part in path[root.len().min(path.len())..].split('/').filter(|s| !s.is_empty()) {
        at.push('/');
        at.push_str(part);
        if part.eq_ignore_ascii_case(".git") {
            return Some(at);
        }
    }
    None
}

/// Every existing folder from the root that holds `folder` down to `folder` itself is a
/// real folder: not a symlink, not a file. The hosts open laptop files with no symlink on
/// the way, so one there would otherwise fail the call late, as a spawn failure that looks
/// like boxd's (and, for a submit, after the prompt was recorded).
pub fn real_folders_on_the_way(files: &mut dyn crate::caps::Files, ctx: &Context, folder: &str, asked: &str) -> ToolResult<()> {
    use crate::caps::Kind;
    let Some(root) = granted_root(ctx, folder) else { return Ok(()) };
    let mut at = String::from(root.trim_end_matches('/'));
    let rest = folder[root.len().min(folder.len())..].trim_start_matches('/');
    for part in rest.split('/').filter(|p| !p.is_empty()) {
        at.push('/');
        at.push_str(part);
        let why = match files.stat(&at) {
            Ok(None) => return Ok(()), // missing: it and all below are made as real folders
            Ok(Some(m)) if m.kind == Kind::Dir && is_git_folder(files, &at) => {
                "is a git repository's own folder (a bare repository or a separate git dir: HEAD, objects/, refs/), whose refs and config are git's, never a user's file"
            }
            Ok(Some(m)) if m.kind == Kind::Dir => continue,
            Ok(Some(m)) if m.kind == Kind::Symlink => "is a symlink, which is never followed",
            Ok(Some(_)) => "is not a folder",
            Err(_) => "cannot be read",
        };
        return Err(crate::errors::ToolError::with_next(
            crate::errors::Code::PathRefused,
            alloc::format!("laptop path '{asked}': {at} on the way {why}, so nothing goes through it"),
            "Use a path whose folders are real folders inside the project (no symlinks on the way), then try again.",
        ));
    }
    Ok(())
}

/// A folder git keeps a repository in whatever its name (`backup.git`, a separate git
/// dir): `.git` is refused by name (`repository_folder`); these by what they hold.
fn is_git_folder(files: &mut dyn crate::caps::Files, at: &str) -> bool {
    use crate::caps::Kind;
    let kind = |files: &mut dyn crate::caps::Files, name: &str| files.stat(&alloc::format!("{at}/{name}")).ok().flatten().map(|m| m.kind);
    kind(files, "HEAD") == Some(Kind::File) && kind(files, "objects") == Some(Kind::Dir) && kind(files, "refs") == Some(Kind::Dir)
}

/// A list argument of work-tree paths (harvest's `files`, drop's `discard`), each checked.
pub fn guest_paths_arg(args: &Value, key: &str) -> ToolResult<alloc::vec::Vec<String>> {
    args.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| crate::paths::guest_relative(p.as_str().unwrap_or_default()))
        .collect()
}

/// A work that was dropped cannot take prompts or reads until it is ensured again.
pub fn require_open(w: &crate::ledger::Work) -> ToolResult<()> {
    if w.is_closed() {
        return Err(ToolError::with_next(
            Code::WorkUnknown,
            format!("work '{}' was dropped", w.work),
            format!("Call boxd_ensure for work '{}' to start it again.", w.work),
        ));
    }
    if w.state == crate::ledger::WorkState::Queued {
        let parent = w.fork.as_ref().map_or("", |f| f.parent.as_str());
        return Err(ToolError::with_next(
            Code::CapReached,
            format!("work '{}' is a fork still queued for a free slot: it has no machine yet", w.work),
            format!("Sleep or drop a running work, then call boxd_fork for work '{parent}' to admit its queued forks; or call boxd_drop for work '{}' to give it up (the only way once '{parent}' was dropped).", w.work),
        ));
    }
    Ok(())
}

/// The newest proof covers every prompt: image and drop need the transcript home first.
pub fn require_proven(w: &crate::ledger::Work) -> ToolResult<()> {
    if w.proven() {
        return Ok(());
    }
    let covered = w.proofs.last().map_or(0, |p| p.prompts);
    let why = if w.proofs.is_empty() {
        String::from("no harvest has proven its transcript on this laptop")
    } else {
        alloc::format!("the last proof covers {covered} of {} prompts", w.prompts.len())
    };
    // A prompt whose submit never heard back: a harvest cannot cover it until the machine
    // says it has it, or until no exec can still be carrying it (IN_FLIGHT_MS), when a
    // later call takes it off the record with a warning.
    if let Some(p) = w.prompts.iter().skip(covered as usize).find(|p| !p.admitted) {
        return Err(ToolError::with_next(
            Code::NotProven,
            format!("work '{}': {why}; prompt {} was recorded but its submit never heard that the machine has it", w.work, p.id),
            format!(
                "Call boxd_job for work '{}' in a later turn (it asks the machine; a prompt the machine never got leaves the record {} minutes after it was sent), then boxd_harvest.",
                w.work,
                crate::ledger::IN_FLIGHT_MS / 60_000
            ),
        ));
    }
    Err(ToolError::with_next(Code::NotProven, format!("work '{}': {why}", w.work), format!("Call boxd_harvest for work '{}' first.", w.work)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{raw_context as raw, MemFiles, Scripted};

    #[test]
    fn an_unproven_prompt_the_machine_never_confirmed_is_named_with_the_wait_not_a_harvest() {
        use crate::ledger::{Proof, Prompt, Work};
        let mut w = Work { work: "w1".into(), ..Default::default() };
        w.prompts = alloc::vec![Prompt { id: "p0".into(), admitted: true, ..Default::default() }, Prompt { id: "p1".into(), ..Default::default() }];
        w.proofs.push(Proof { prompts: 1, ..Default::default() });
        let e = require_proven(&w).unwrap_err();
        assert_eq!(e.code, Code::NotProven);
        assert!(e.message.contains("covers 1 of 2") && e.message.contains("p1"), "{}", e.message);
        assert!(e.next.contains("boxd_job") && e.next.contains("10 minutes"), "{}", e.next);
        w.prompts[1].admitted = true;
        assert_eq!(require_proven(&w).unwrap_err().next, "Call boxd_harvest for work 'w1' first.");
    }

    /// A harvest into `.git/refs/heads` replaced a branch's ref (its newest commit lost);
    /// reading `.git/config` for a submit could send a remote's token to a machine.
    #[test]
    fn no_laptop_path_reaches_into_a_repositorys_own_folder() {
        let ctx = context(raw(r#"{"allowedRoots":["/srv/r/.git/hooks"]}"#, "{}")).unwrap();
        for p in [".git/refs/heads", ".git", "sub/.git/config", "/p/.GIT/HEAD", "a/.Git"] {
            let e = user_path(&ctx, p, "/p").unwrap_err();
            assert!(e.code == Code::PathRefused && e.message.contains("git repository's own folder"), "{p}: {e:?}");
        }
        for p in ["a.git/x", ".github/x", ".gitignore", "sub/.gitmodules", "x.git"] {
            assert!(user_path(&ctx, p, "/p").is_ok(), "{p}");
        }
        // An allowed root the user put inside one is theirs to write.
        assert_eq!(user_path(&ctx, "/srv/r/.git/hooks/pre-commit", "/p").unwrap(), "/srv/r/.git/hooks/pre-commit");
    }

    /// Refused before anything runs or is recorded: `to`, and a file whose landing path
    /// goes through `.git` (the work's folder being the default destination).
    #[test]
    fn a_harvest_into_a_git_folder_runs_nothing_and_owes_nothing() {
        for args in [r#"{"work":"w1","files":["master"],"to":".git/refs/heads"}"#, r#"{"work":"w1","files":[".git/config"]}"#, r#"{"work":"w1","files":["a.txt",".GIT/HEAD"],"to":"out"}"#] {
            let fs = refused_harvest(args, "git repository's own folder");
            assert!(!fs.files.keys().chain(fs.dirs.iter()).any(|k| k.to_ascii_lowercase().contains(".git")), "{args}: nothing made");
        }
    }

    /// A harvest refused PATH_REFUSED with `words` in its message, before anything ran or
    /// was recorded; the laptop's files after it.
    fn refused_harvest(args: &str, words: &str) -> crate::testing::MemFiles {
        let mut fs = crate::testing::open_work(None);
        let before = crate::ledger::Ledger::new(&mut fs, "/l").require("w1").unwrap();
        let mut p = Scripted::default();
        let e = call(&mut p, &mut fs, "boxd_harvest", args, raw("{}", "{}")).unwrap_err();
        assert!(e.code == Code::PathRefused && e.message.contains(words), "{args}: {e:?}");
        assert!(p.requests.is_empty(), "{args}: nothing ran");
        assert_eq!(crate::ledger::Ledger::new(&mut fs, "/l").require("w1").unwrap(), before, "{args}: nothing recorded");
        fs
    }

    /// A guest's file harvested into `.opencode/plugin/` ran on the laptop as OpenCode's
    /// code the next time it started there, and an `opencode.json` lifted its permission
    /// rules to "allow": OpenCode's own configuration is refused as `.git` is, both ways.
    #[test]
    fn no_laptop_path_reaches_into_the_laptop_opencodes_configuration() {
        let ctx = context(raw(r#"{"allowedRoots":["/home/u","/home/v/.config","/home/w/.config/opencode"]}"#, "{}")).unwrap();
        for p in [".opencode/plugin/evil.js", ".opencode", "sub/.OpenCode/tools/t.ts", "opencode.json", "sub/OpenCode.JSONC", "/home/u/.config/opencode/plugins/x.js", "/home/u/.config/OpenCode", "/home/u/.local/share/opencode/auth.json", "/home/v/.config/opencode/opencode.json", "/home/v/.config/opencode", "tui.json", "sub/TUI.jsonc", "/home/u/.cache/opencode/packages/x/index.js"] {
            let e = user_path(&ctx, p, "/p").unwrap_err();
            assert!(e.code == Code::PathRefused && e.message.contains("OpenCode's own configuration"), "{p}: {e:?}");
            assert!(e.next.contains("boxd_submit prompt"), "{p}: {}", e.next);
        }
        for p in ["opencode-notes.md", "docs/opencode/x.md", ".opencodex/x", "my.opencode.json", "opencode.json.bak", "/home/u/.config/nvim/opencode", "/home/u/.local/opencode", "/home/v/.config/nvim/init.lua"] {
            assert!(user_path(&ctx, p, "/p").is_ok(), "{p}");
        }
        // A root the user put inside OpenCode's configuration is theirs, as for `.git`.
        assert!(user_path(&ctx, "/home/w/.config/opencode/themes/t.json", "/p").is_ok());
        for args in [r#"{"work":"w1","files":[".opencode/plugin/evil.js"]}"#, r#"{"work":"w1","files":["evil.js"],"to":".opencode/plugin"}"#, r#"{"work":"w1","files":["a.txt","opencode.json"],"to":"out"}"#] {
            refused_harvest(args, "OpenCode's own configuration");
        }
    }

    /// A repository's folder under another name (a bare `backup.git`, a separate git dir)
    /// is known by what it holds: refused as `.git` is, before anything runs; a folder
    /// holding only a file named HEAD is an ordinary one.
    #[test]
    fn a_git_folder_of_another_name_is_refused_by_what_it_holds() {
        for (tool, args) in [
            ("boxd_harvest", r#"{"work":"w1","files":["master"],"to":"backup.git/refs/heads"}"#),
            ("boxd_submit", r#"{"work":"w1","prompt":"p","files":[{"from":"backup.git/config","to":"config"}]}"#),
        ] {
            let mut fs = crate::testing::open_work(None);
            for f in ["HEAD", "config", "objects/info/packs", "refs/heads/main"] {
                fs.put(&alloc::format!("/p/backup.git/{f}"), b"x");
            }
            let before = crate::ledger::Ledger::new(&mut fs, "/l").require("w1").unwrap();
            let mut p = Scripted::default();
            let e = call(&mut p, &mut fs, tool, args, raw("{}", "{}")).unwrap_err();
            assert!(e.code == Code::PathRefused && e.message.contains("git repository's own folder"), "{tool}: {e:?}");
            assert!(p.requests.is_empty(), "{tool}: nothing ran");
            assert_eq!(crate::ledger::Ledger::new(&mut fs, "/l").require("w1").unwrap(), before, "{tool}: nothing recorded");
        }
        let mut fs = crate::testing::open_work(None);
        fs.put("/p/notes/HEAD", b"a file the user named HEAD");
        super::real_folders_on_the_way(&mut fs, &context(raw("{}", "{}")).unwrap(), "/p/notes", "notes/x").unwrap();
    }

    #[test]
    fn ask_changes_refuses_a_change_without_approval_before_any_program_runs() {
        let (mut p, mut f) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
        let e = call(&mut p, &mut f, "boxd_drop", r#"{"work":"w1"}"#, raw(r#"{"access":"ask-changes"}"#, "{}")).unwrap_err();
        assert_eq!(e.code, Code::ApprovalRequired);
        assert!(p.requests.is_empty());
        // Reads never need approval.
        p.push_exit(0, "[]", "");
        p.push_exit(0, "[]", "");
        assert!(call(&mut p, &mut f, "boxd_status", "{}", raw(r#"{"access":"ask-changes"}"#, "{}")).is_ok());
    }

    #[test]
    fn an_untested_opencode_is_refused_unless_allowed() {
        let (mut p, mut f) = (Scripted::default(), MemFiles::new(&["/p", "/l"]));
        let mut r = raw("{}", "{}");
        r.host_name = "opencode".into();
        r.host_version = "2.2.3".into();
        let e = call(&mut p, &mut f, "boxd_job", r#"{"work":"w1"}"#, r).unwrap_err();
        assert_eq!(e.code, Code::HostUntested);
        assert!(e.next.contains(">=1.18.0 <1.19.0"), "{}", e.next);
        let mut r = raw(r#"{"allowUntestedHost":true}"#, "{}");
        r.host_name = "opencode".into();
        r.host_version = "2.2.3".into();
        // Past the gate, the work is simply unknown.
        assert_eq!(call(&mut p, &mut f, "boxd_job", r#"{"work":"w1"}"#, r).unwrap_err().code, Code::WorkUnknown);
    }
}
