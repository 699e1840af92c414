//! `fetchCommits`: a work's commits from the ledger's bundle into the project's repository
//! as `refs/boxd/<work>`. The ref is ours only while it is a plain ref whose commits the
//! work's HEAD still contains: git moves it forward and never back, and a symbolic ref of
//! that name (which git would follow into the branch it names) is left alone. Either way
//! nothing is lost: the ledger's bundle holds every commit.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::{json, Value};

use crate::caps::{Programs, RunOutput, RunRequest, SpawnError};
use crate::guest::tail;
use crate::ledger::Work;
use crate::paths;

const GIT_TIMEOUT_MS: u32 = 120_000;

/// Fetch HEAD of `bundle` into `refs/boxd/<work>`, in the work's folder. Not a repository,
/// no git, a ref that is not ours or holds commits the work no longer has: said in
/// `reason`, never a failure of the harvest.
pub(super) fn fetch_commits<P: Programs>(programs: &mut P, w: &Work, bundle: &str) -> Value {
    let refname = format!("refs/boxd/{}", w.work);
    // A symbolic ref here is not one the plugin made: a fetch would move the ref it names
    // (a branch of the user's) instead.
    match run(programs, w, &["symbolic-ref", "-q", &refname]) {
        Ok(out) if out.exit_code == Some(0) => {
            let target = String::from_utf8_lossy(&out.stdout).trim().to_string();
            return not_fetched(format!(
                "{refname} in {} is a symbolic ref to {target}, which the plugin did not make: it was left as it is and nothing was fetched; the commits are in the ledger's bundle ({bundle})",
                w.directory
            ));
        }
        Ok(out) if out.exit_code == Some(1) => {}
        Ok(out) => return not_fetched(format!("git symbolic-ref in {}: {}", w.directory, tail(&out.stderr))),
        Err(e) => return spawn_failed(e),
    }
    // The guest's objects are checked as they arrive (a tree naming `.git` or `..`, a
    // malformed commit) before any lands in the user's repository (git 2.46 and later
    // check a bundle's objects). No `+`: git refuses to move the ref anywhere but
    // forward. Nothing else of the repository is written: no tags, no FETCH_HEAD, no
    // fetch in its submodules (from their remotes, with the user's credentials), no gc.
    let into = format!("HEAD:{refname}");
    let fetch = ["-c", "fetch.fsckObjects=true", "fetch", "--no-tags", "--recurse-submodules=no", "--no-write-fetch-head", "--no-auto-gc", bundle, &into];
    match run(programs, w, &fetch) {
        Ok(out) if out.exit_code == Some(0) => json!({ "ref": refname }),
        Ok(out) if String::from_utf8_lossy(&out.stderr).contains("non-fast-forward") => {
            let kept = format!("boxd-kept-{}", w.work);
            not_fetched(format!(
                "{refname} in {} holds commits the work's HEAD does not contain (an earlier work of this name, a rebuilt machine, or history rewritten in the guest): it was left as it is and nothing was fetched; the work's commits are in the ledger's bundle ({bundle}). To keep the old commits on a branch and let the next harvest fetch: git branch {kept} {refname} && git update-ref -d {refname} {kept}",
                w.directory
            ))
        }
        Ok(out) => not_fetched(format!("git fetch into {}: {}", w.directory, tail(&out.stderr))),
        Err(e) => spawn_failed(e),
    }
}

fn run<P: Programs>(programs: &mut P, w: &Work, args: &[&str]) -> Result<RunOutput, SpawnError> {
    let req = RunRequest {
        program: "git".into(),
        args: args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        stdin: None,
        // git's messages in English whatever the laptop's locale: the reason reads them.
        env: alloc::vec![("LC_ALL".into(), "C".into())],
        cwd: Some(w.directory.clone()),
        timeout_ms: GIT_TIMEOUT_MS,
        ..Default::default()
    };
    programs.run(&req)
}

fn not_fetched(reason: String) -> Value {
    json!({ "ref": Value::Null, "reason": reason })
}

fn spawn_failed(e: SpawnError) -> Value {
    not_fetched(match e {
        SpawnError::NotAllowed(m) | SpawnError::NotFound(m) => format!("no git on this laptop for the host to grant ({m})"),
        SpawnError::TimedOut => format!("git did not finish within {} s", GIT_TIMEOUT_MS / 1000),
        SpawnError::Failed(m) => format!("could not run git: {m}"),
    })
}

/// Whether git, run in `dir`, finds a repository whose top folder is inside the folders
/// this host opened: the first `.git` (a folder, or a file for a linked work tree or a
/// submodule) at or above `dir`, looked for while the folder is inside a granted one. Only then
/// does `fetchCommits` run git there, so it never writes into a repository above them.
pub(super) fn granted_repository<F: crate::caps::Files + ?Sized>(files: &mut F, ctx: &crate::options::Context, dir: &str) -> bool {
    let mut at = dir.to_string();
    while super::super::granted_root(ctx, &at).is_some() {
        match files.kind(&format!("{}/.git", at.trim_end_matches('/'))) {
            Ok(Some(crate::caps::Kind::Dir)) => return true,
            // git stops at this file: what it names is the repository.
            Ok(Some(crate::caps::Kind::File)) => return git_file_granted(files, ctx, at.trim_end_matches('/')),
            _ => {}
        }
        if at == "/" {
            break;
        }
        at = paths::parent(&at).to_string();
    }
    false
}

/// A `.git` file (a linked work tree's or a submodule's `gitdir: PATH`): the folder it names
/// and, for a work tree, the common folder that folder names (`commondir`), where git
/// writes refs and objects, must both be inside the granted folders. Both are read through
/// the confined filesystem, so one a symlink takes out of them reads as nothing.
fn git_file_granted<F: crate::caps::Files + ?Sized>(files: &mut F, ctx: &crate::options::Context, at: &str) -> bool {
    let first_line = |bytes: Vec<u8>| String::from_utf8(bytes).ok().and_then(|t| t.lines().next().map(|l| l.trim().to_string()));
    let named = |files: &mut F, path: &str| files.read_at_most(path, 4096).ok().flatten().and_then(first_line);
    let inside = |files: &mut F, d: &str| super::super::granted_root(ctx, d).is_some() && matches!(files.kind(&format!("{d}/HEAD")), Ok(Some(_)));
    let Some(gitdir) = named(files, &format!("{at}/.git")).and_then(|l| l.strip_prefix("gitdir:").map(|p| resolve(at, p.trim()))).flatten() else {
        return false;
    };
    if !inside(files, &gitdir) {
        return false;
    }
    match files.kind(&format!("{gitdir}/commondir")) {
        Ok(None) => true,
        Ok(Some(_)) => named(files, &format!("{gitdir}/commondir")).and_then(|c| resolve(&gitdir, &c)).is_some_and(|common| inside(files, &common)),
        Err(_) => false,
    }
}

/// `path` (absolute, or relative to the folder `base`) with `.` and `..` taken lexically.
fn resolve(base: &str, path: &str) -> Option<String> {
    let full = if path.starts_with('/') { path.to_string() } else { paths::join(base, path) };
    let mut parts: Vec<&str> = Vec::new();
    for seg in full.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Scripted;

    fn work() -> Work {
        Work::new("w1", "/p", "t")
    }

    #[test]
    fn the_ref_is_fetched_forward_only_after_git_says_it_is_not_symbolic() {
        let mut git = Scripted::default();
        git.push_fail(1, "");
        git.push_exit(0, "", " * [new ref] HEAD -> refs/boxd/w1\n");
        assert_eq!(fetch_commits(&mut git, &work(), "/l/works/w1/b.bundle"), json!({ "ref": "refs/boxd/w1" }));
        assert_eq!(git.commands(), [
            "symbolic-ref -q refs/boxd/w1",
            "-c fetch.fsckObjects=true fetch --no-tags --recurse-submodules=no --no-write-fetch-head --no-auto-gc /l/works/w1/b.bundle HEAD:refs/boxd/w1"
        ]);
        let c_locale = [("LC_ALL".to_string(), "C".to_string())];
        assert!(git.requests.iter().all(|r| r.program == "git" && r.cwd.as_deref() == Some("/p") && r.env == c_locale));
    }

    /// A `.git` file (a linked work tree, a submodule) counts only when the folder it
    /// names, and a work tree's common folder, are inside the granted folders too.
    #[test]
    fn a_git_file_naming_a_repository_outside_the_granted_folders_is_not_one() {
        use crate::testing::MemFiles;
        let ctx = crate::tools::context(crate::testing::raw_context("{}", "{}")).unwrap();
        let cases: [(&str, &[(&str, &str)], bool); 5] = [
            ("gitdir: /elsewhere/.git/worktrees/p\n", &[], false),
            ("gitdir: ../p/.modules/m\n", &[("/p/.modules/m/HEAD", "ref: refs/heads/main\n")], true),
            ("gitdir: /p/.wt/x\n", &[("/p/.wt/x/HEAD", "x"), ("/p/.wt/x/commondir", "../../../elsewhere/.git\n")], false),
            ("gitdir: /p/.wt/x\n", &[("/p/.wt/x/HEAD", "x"), ("/p/.wt/x/commondir", "../../.main-git\n"), ("/p/.main-git/HEAD", "x")], true),
            ("not a gitdir line\n", &[], false),
        ];
        for (git_file, more, granted) in cases {
            let mut fs = MemFiles::new(&["/p", "/l"]);
            fs.files.insert("/p/.git".into(), git_file.as_bytes().to_vec());
            for (path, text) in more {
                fs.files.insert(path.to_string(), text.as_bytes().to_vec());
            }
            assert_eq!(granted_repository(&mut fs, &ctx, "/p"), granted, "{git_file} {more:?}");
        }
    }

    #[test]
    fn a_symbolic_ref_of_our_name_is_left_alone_and_nothing_is_fetched() {
        let mut git = Scripted::default();
        git.push_exit(0, "refs/heads/main\n", "");
        let v = fetch_commits(&mut git, &work(), "/l/b.bundle");
        assert_eq!(v["ref"], Value::Null);
        let reason = v["reason"].as_str().unwrap();
        assert!(reason.contains("symbolic ref to refs/heads/main") && reason.contains("/l/b.bundle"), "{reason}");
        assert_eq!(git.commands(), ["symbolic-ref -q refs/boxd/w1"], "no fetch ran");
    }

    #[test]
    fn a_ref_the_new_head_does_not_contain_is_kept_and_the_answer_says_how_to_bring_both() {
        let mut git = Scripted::default();
        git.push_fail(1, "");
        git.push_fail(1, "From /l/b.bundle\n ! [rejected]        HEAD       -> refs/boxd/w1  (non-fast-forward)\n");
        let v = fetch_commits(&mut git, &work(), "/l/b.bundle");
        assert_eq!(v["ref"], Value::Null);
        let reason = v["reason"].as_str().unwrap();
        assert!(reason.contains("left as it is") && reason.contains("/l/b.bundle"), "{reason}");
        assert!(reason.contains("git branch boxd-kept-w1 refs/boxd/w1 && git update-ref -d refs/boxd/w1 boxd-kept-w1"), "{reason}");
    }

    #[test]
    fn not_a_repository_or_no_git_is_said_not_failed() {
        let mut git = Scripted::default();
        git.push_fail(128, "fatal: not a git repository (or any of the parent directories): .git\n");
        let v = fetch_commits(&mut git, &work(), "/l/b.bundle");
        assert!(v["reason"].as_str().unwrap().contains("not a git repository"), "{v}");
        assert_eq!(git.commands().len(), 1);
        let mut git = Scripted::default();
        git.push_spawn_error(SpawnError::NotFound("git".into()));
        assert!(fetch_commits(&mut git, &work(), "/l/b.bundle")["reason"].as_str().unwrap().contains("no git on this laptop"));
    }
}
