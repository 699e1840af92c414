//! What the laptop holds of a work's tree, against what the machine has: harvest records
//! it (the git state, a patch of uncommitted changes, every commit as a git bundle), and
//! drop compares the machine's live state with that record before anything is destroyed.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::Value;

use crate::caps::Files;
use crate::encode::{sha256_hex, unbase64};
use crate::errors::{Code, ToolError, ToolResult};
use crate::ledger::{GitEntry, GitRecord, Ledger, Work};

fn invalid(why: String) -> ToolError {
    ToolError::new(Code::ExportInvalid, format!("the guest's git answer is not usable: {why}"))
}

fn entries(v: &Value) -> Vec<GitEntry> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|e| GitEntry { path: e["path"].as_str().unwrap_or("").into(), sha256: e["sha256"].as_str().unwrap_or("").into(), unknown: BTreeMap::new() })
        .collect()
}

fn refs(v: &Value) -> BTreeMap<String, String> {
    v.as_object().map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect()).unwrap_or_default()
}

/// The refs a bundle's header lists (`<sha> <refname>`), or why it is not a whole bundle.
/// A bundle with prerequisites needs commits the laptop may not have, so it is refused.
pub fn bundle_refs(bytes: &[u8]) -> Result<BTreeMap<String, String>, String> {
    let end = bytes.windows(2).position(|w| w == b"\n\n").ok_or("no header end")?;
    let header = core::str::from_utf8(&bytes[..end]).map_err(|_| "the header is not text")?;
    let mut lines = header.lines();
    match lines.next() {
        Some("# v2 git bundle") | Some("# v3 git bundle") => {}
        other => return Err(format!("not a git bundle (first line {other:?})")),
    }
    let mut out = BTreeMap::new();
    for line in lines {
        if line.starts_with('@') {
            continue; // v3 capabilities
        }
        if line.starts_with('-') {
            return Err("it needs commits it does not carry (prerequisites)".into());
        }
        let (sha, name) = line.split_once(' ').ok_or("a malformed ref line")?;
        if sha.len() < 40 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("a malformed object id for {name}"));
        }
        out.insert(name.to_string(), sha.to_string());
    }
    Ok(out)
}

/// Store what the guest's `git` answer says about the tree: the patch and the bundle go
/// into the work's ledger folder (named by digest), the record says where. None when the
/// tree is not a git repository.
pub fn record<F: Files>(ledger: &mut Ledger<F>, w: &Work, git: &Value, now: &str) -> ToolResult<Option<GitRecord>> {
    if !git["repo"].as_bool().unwrap_or(false) {
        return Ok(None);
    }
    // A diff that is not UTF-8 travels as base64 (the helper says so).
    let patch_bytes = match (git["patch"].as_str().filter(|p| !p.is_empty()), git["patchEncoding"].as_str()) {
        (Some(p), Some("base64")) => Some(unbase64(p).ok_or_else(|| invalid("the patch is not base64".into()))?),
        (Some(p), _) => Some(p.as_bytes().to_vec()),
        (None, _) => None,
    };
    let (patch, patch_sha256) = match patch_bytes {
        Some(bytes) => {
            let sha = sha256_hex(&bytes);
            let name = format!("patch-{}.diff", &sha[..16]);
            ledger.put_blob(&w.work, &name, &bytes)?;
            (Some(name), Some(sha))
        }
        None => (None, None),
    };
    let live_refs = refs(&git["refs"]);
    let bundle = if live_refs.is_empty() {
        None
    } else if git["bundleUnchanged"].as_bool() == Some(true) {
        // The guest saw the refs we said we hold; our stored bundle still covers them.
        let prev = w.git.as_ref().filter(|g| g.refs == live_refs).and_then(|g| g.bundle.clone());
        Some(prev.ok_or_else(|| invalid("the guest says the commits are unchanged, but the ledger holds no bundle of them".into()))?)
    } else {
        let b = &git["bundle"];
        let bytes = unbase64(b["data"].as_str().unwrap_or_default()).ok_or_else(|| invalid("the bundle is not base64".into()))?;
        let sha = sha256_hex(&bytes);
        if b["sha256"].as_str() != Some(sha.as_str()) {
            return Err(invalid("the bundle arrived damaged (digest mismatch)".into()));
        }
        let listed = bundle_refs(&bytes).map_err(|why| invalid(format!("the bundle is not usable: {why}")))?;
        if let Some((name, want)) = live_refs.iter().find(|(name, sha)| listed.get(*name) != Some(*sha)) {
            return Err(invalid(format!("the bundle does not hold {name} at {want}")));
        }
        let name = format!("bundle-{}.bundle", &sha[..16]);
        ledger.put_blob(&w.work, &name, &bytes)?;
        Some(name)
    };
    // The guest's words become the record: a head that is no object name, or a branch name
    // past git's own bounds, is not a repository's answer.
    let head = git["head"].as_str().unwrap_or("");
    if head.len() > 64 || !head.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(invalid(format!("the head '{}' is not an object name", crate::redact::cut(head, 80))));
    }
    let branch = git["branch"].as_str().unwrap_or("");
    if branch.len() > 1024 {
        return Err(invalid(format!("the branch name is {} bytes long", branch.len())));
    }
    Ok(Some(GitRecord {
        at: now.to_string(),
        head: head.into(),
        branch: branch.into(),
        status: git["status"].as_array().into_iter().flatten().filter_map(|s| s.as_str().map(String::from)).collect(),
        untracked: entries(&git["untracked"]),
        ignored: entries(&git["ignored"]),
        dirty: git["dirty"].as_bool().unwrap_or(false),
        patch,
        patch_sha256,
        prompts: w.prompts.len() as u64,
        refs: live_refs,
        bundle,
        ..Default::default()
    }))
}

/// Whether the ledger still holds `name` (an export, a patch or a bundle, each named
/// `<kind>-<first 16 hex of its sha256>.<ext>`) with the bytes it was stored with, and, when
/// `sha256` is given, whether they hash to it. One deleted or damaged since must be stored
/// again from the machine, not trusted.
pub fn stored_intact<F: Files>(ledger: &mut Ledger<F>, work: &str, name: &str, sha256: Option<&str>) -> ToolResult<bool> {
    let Some(named) = name.split_once('-').and_then(|(_, rest)| rest.split_once('.')).map(|(d, _)| d).filter(|d| d.len() == 16) else { return Ok(false) };
    let Some(sha) = ledger.blob_sha256(work, name)? else { return Ok(false) };
    Ok(sha.starts_with(named) && sha256.is_none_or(|want| want == sha))
}

/// Before a drop destroys the machine: the bundle and the patch the record names are whole
/// in the ledger. The live check compares the machine with the record only, so a file
/// deleted or damaged since would take those commits or changes with the machine.
pub fn check_stored<F: Files>(ledger: &mut Ledger<F>, w: &Work) -> ToolResult<()> {
    let Some(g) = &w.git else { return Ok(()) };
    let bundle = g.bundle.as_deref().map(|b| (b, None));
    let patch = g.patch.as_deref().map(|p| (p, Some(g.patch_sha256.as_deref().unwrap_or(""))));
    for (name, sha256) in bundle.into_iter().chain(patch) {
        if !stored_intact(ledger, &w.work, name, sha256)? {
            return Err(ToolError::with_next(
                Code::NotProven,
                format!("work '{}': the ledger's {name} is missing or damaged, so the machine holds the only copy of what it held; nothing was destroyed", w.work),
                format!("Call boxd_harvest for work '{}' (it stores it again from the machine), then boxd_drop.", w.work),
            ));
        }
    }
    Ok(())
}

/// Whether a path the user discarded covers `path` (itself, or a folder above it).
fn discarded(path: &str, discard: &[String]) -> bool {
    let p = path.trim_end_matches('/');
    discard.iter().any(|d| {
        let d = d.trim_end_matches('/');
        p == d || p.strip_prefix(d).is_some_and(|rest| rest.starts_with('/'))
    })
}

/// Compare the machine's live state (the helper's `seal` answer) with what the laptop
/// holds. Ok means everything on the machine is accounted for; otherwise the refusal
/// names the paths and the one next step.
pub fn check_live(w: &Work, live: &Value, discard: &[String]) -> ToolResult<()> {
    let work = &w.work;
    // Prompts: the guest's newest must be the one the last proof was exported at (a prompt
    // admitted after the export has a run the laptop lacks), and one the laptop sent unless
    // that proof covers it: a record put back from an older copy no longer lists the
    // prompts sent since, though their runs are in the proven transcript.
    if let Some(newest) = live["newestPrompt"].as_str() {
        let proven_at = w.proofs.last().and_then(|p| p.newest_prompt.as_deref());
        if !w.prompts.iter().any(|p| p.id == newest) && proven_at != Some(newest) {
            return Err(ToolError::with_next(
                Code::NotProven,
                format!("work '{work}': the machine holds prompt {newest}, which this laptop's ledger never sent"),
                format!("Call boxd_harvest for work '{work}' to bring its transcript home, then drop; or boxd_sleep, which keeps the disk."),
            ));
        }
        if proven_at != Some(newest) {
            return Err(ToolError::with_next(
                Code::NotProven,
                format!("work '{work}': prompt {newest} was admitted on the machine after the last harvest's export"),
                format!("Call boxd_harvest for work '{work}' first."),
            ));
        }
    }
    let owed: Vec<&str> = w.owed.iter().map(String::as_str).filter(|p| !discarded(p, discard)).collect();
    if !owed.is_empty() {
        return Err(ToolError::with_next(
            Code::Untracked,
            format!("work '{work}': files a harvest was asked for have not come home: {}", owed.join(", ")),
            format!("Call boxd_harvest for work '{work}' with those files (use 'to' for another folder on a conflict), or boxd_drop with \"discard\" naming them if they are not wanted."),
        ));
    }
    if live["untrackedTruncated"].as_bool() == Some(true) || live["ignoredTruncated"].as_bool() == Some(true) {
        return Err(ToolError::new(
            Code::Untracked,
            format!("work '{work}' has more new files on the machine than one listing holds (5000), so not all of them can be checked"),
        ));
    }
    // Folders the bundle and the patch cannot carry: refused unless given up by name.
    let folders = [
        ("nested", "holds other git repositories whose commits and files the laptop does not have", "Bring what matters home (harvest its files, or push it from the machine), then call boxd_drop for work '{work}' with \"discard\" naming those folders; or boxd_sleep, which keeps the disk."),
        ("worktrees", "has linked work trees (git worktree) with uncommitted changes that no harvest brings home", "Commit them on the machine (their branches travel in the bundle) and harvest, then call boxd_drop for work '{work}'; or call it with \"discard\" naming those folders to give them up."),
    ];
    for (key, what, next) in folders {
        let kept: Vec<&str> = live[key].as_array().into_iter().flatten().filter_map(Value::as_str).filter(|p| !discarded(p, discard)).collect();
        if !kept.is_empty() {
            return Err(ToolError::with_next(Code::Untracked, format!("work '{work}' {what}: {}", kept.join(", ")), next.replace("{work}", work)));
        }
    }
    if !live["repo"].as_bool().unwrap_or(false) {
        return Err(ToolError::new(Code::GitUnknown, format!("work '{work}': the work tree on the machine is not a git repository, so its contents cannot be accounted for")));
    }
    let git = w.git.as_ref().ok_or_else(|| {
        ToolError::with_next(Code::NotProven, format!("work '{work}': no harvest has recorded its git state"), format!("Call boxd_harvest for work '{work}' first."))
    })?;
    // Commits: every ref on the machine is in the bundle the ledger holds.
    let live_refs = refs(&live["refs"]);
    let missing: Vec<String> = live_refs
        .iter()
        .filter(|(name, sha)| git.bundle.is_none() || git.refs.get(*name) != Some(*sha))
        .map(|(name, sha)| format!("{name} at {}", &sha[..sha.len().min(12)]))
        .collect();
    if !missing.is_empty() {
        return Err(ToolError::with_next(
            Code::NotProven,
            format!("work '{work}': commits on the machine are not in the ledger's bundle: {}", missing.join(", ")),
            format!("Call boxd_harvest for work '{work}': it brings every commit home as a git bundle, then drop."),
        ));
    }
    // A version staged apart from its file is in no commit and no patch (`git diff HEAD`
    // holds the file's): a drop would lose it.
    let apart: Vec<&str> = live["stagedApart"].as_array().into_iter().flatten().filter_map(Value::as_str).filter(|p| !discarded(p, discard)).collect();
    if !apart.is_empty() {
        return Err(ToolError::with_next(
            Code::Dirty,
            format!("work '{work}' has staged versions that differ from their files on the machine (git add, then changed again; or a merge left unresolved), which no commit or patch holds: {}", apart.join(", ")),
            format!("Commit them on the machine (or stage the files again, or unstage them), harvest, then drop; or call boxd_drop for work '{work}' with \"discard\" naming them; or boxd_sleep, which keeps the disk."),
        ));
    }
    // Uncommitted changes: the live diff is the stored patch.
    if live["dirty"].as_bool().unwrap_or(false) {
        let live_sha = live["diffSha256"].as_str().unwrap_or("");
        if git.patch.is_none() || git.patch_sha256.as_deref() != Some(live_sha) {
            let paths: Vec<&str> = live["changed"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            return Err(ToolError::new(
                Code::Dirty,
                format!("work '{work}' has uncommitted changes the ledger's patch does not hold: {}", paths.join(", ")),
            ));
        }
    }
    // New files: each one came from the laptop or went home, with the same bytes.
    let unaccounted: Vec<String> = entries(&live["untracked"])
        .into_iter()
        .chain(entries(&live["ignored"]))
        .filter(|e| !discarded(&e.path, discard))
        .filter(|e| {
            e.sha256.is_empty()
                || !w.files_out.iter().chain(w.files_in.iter()).any(|f| f.guest == e.path && f.sha256 == e.sha256)
        })
        .map(|e| e.path)
        .collect();
    if !unaccounted.is_empty() {
        let message = format!("work '{work}' has paths on the machine that the laptop does not hold: {}", unaccounted.join(", "));
        // A name shown with U+FFFD (bytes that are not UTF-8 on the machine): no harvest can
        // name it, and a discard only by the shown form, which is not the file's own name.
        // One with a control character can be discarded by name, but no harvest brings it.
        let unnamable: Vec<&str> = unaccounted.iter().map(String::as_str).filter(|p| p.contains('\u{FFFD}')).collect();
        if !unnamable.is_empty() {
            return Err(ToolError::with_next(
                Code::Untracked,
                message,
                format!("No tool call can name {} (not UTF-8 on the machine): have the agent rename it there (boxd_submit for work '{work}'), then harvest it under its new name, or have it removed if it is not wanted; then call boxd_drop again.", unnamable.join(", ")),
            ));
        }
        let unharvestable: Vec<&str> = unaccounted.iter().map(String::as_str).filter(|p| p.chars().any(char::is_control)).collect();
        if !unharvestable.is_empty() {
            return Err(ToolError::with_next(
                Code::Untracked,
                message,
                format!("No harvest brings home {} (a control character in its name): have the agent rename it there (boxd_submit for work '{work}'), then harvest it under its new name; or call boxd_drop with \"discard\" naming it if it is not wanted.", unharvestable.join(", ")),
            ));
        }
        return Err(ToolError::new(Code::Untracked, message));
    }
    Ok(())
}

/// The new files a record says the laptop holds (guest path, digest) of which it holds no
/// copy any more: every record of them names a laptop path with nothing there now, or a
/// folder (deleted or moved since the harvest or the submit). A symlink the user put in
/// its place counts as held (it is never followed, and says where they keep it), as does a
/// path this host cannot look at (another project's) or cannot read: the drop there is not
/// this host's to refuse. Each laptop path is looked at once, by its kind (no read).
pub fn laptop_lost<F: Files>(files: &mut F, w: &Work) -> BTreeMap<(String, String), String> {
    use crate::caps::Kind;
    let mut kinds: BTreeMap<&str, bool> = BTreeMap::new();
    let (mut held, mut lost) = (Vec::new(), BTreeMap::new());
    for f in w.files_out.iter().chain(w.files_in.iter()) {
        let key = (f.guest.clone(), f.sha256.clone());
        let there = *kinds.entry(f.laptop.as_str()).or_insert_with(|| !matches!(files.kind(&f.laptop), Ok(None) | Ok(Some(Kind::Dir | Kind::Other))));
        if there {
            held.push(key);
        } else {
            lost.insert(key, f.laptop.clone());
        }
    }
    lost.retain(|k, _| !held.contains(k));
    lost
}

/// The machine's new files whose laptop copies are all gone (`lost`, from `laptop_lost`):
/// a harvested output counts as home only while the laptop holds it, since the machine
/// then has its only bytes and a drop would destroy them.
pub fn check_laptop_copies(w: &Work, live: &Value, discard: &[String], lost: &BTreeMap<(String, String), String>) -> ToolResult<()> {
    let gone: Vec<String> = entries(&live["untracked"])
        .into_iter()
        .chain(entries(&live["ignored"]))
        .filter(|e| !discarded(&e.path, discard))
        .filter_map(|e| lost.get(&(e.path.clone(), e.sha256.clone())).map(|laptop| format!("{} (was {laptop})", e.path)))
        .collect();
    if gone.is_empty() {
        return Ok(());
    }
    let work = &w.work;
    Err(ToolError::with_next(
        Code::Untracked,
        format!("work '{work}' has files on the machine that this laptop held once and holds no more (deleted or moved since they came home or were sent): {}; nothing was destroyed", gone.join(", ")),
        format!("Call boxd_harvest for work '{work}' with those files to bring them home again, or boxd_drop with \"discard\" naming them if they are not wanted."),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

    /// The guest's head and branch become the record as they are: one that is no object
    /// name, or a branch past any git bound, is refused before anything is stored.
    #[test]
    fn a_head_that_is_no_object_name_or_a_huge_branch_is_refused() {
        let mut fs = crate::testing::MemFiles::new(&["/l"]);
        let w = Work::new("w1", "/p", "t");
        Ledger::new(&mut fs, "/l").write(&w).unwrap();
        let mut ledger = Ledger::new(&mut fs, "/l");
        let answer = |head: &str, branch: &str| json!({ "repo": true, "head": head, "branch": branch, "refs": {} });
        assert!(record(&mut ledger, &w, &answer(SHA, "main"), "t").unwrap().is_some());
        for (head, branch) in [("x".repeat(20 << 20), String::from("main")), (String::from("not-a-sha"), String::from("main")), (String::from(SHA), "b".repeat(2000))] {
            let e = record(&mut ledger, &w, &answer(&head, &branch), "t").unwrap_err();
            assert_eq!(e.code, Code::ExportInvalid, "{e:?}");
            assert!(e.message.len() < 400, "the answer quotes a bounded piece: {} bytes", e.message.len());
        }
    }

    #[test]
    fn bundle_headers_are_read_and_thin_bundles_refused() {
        let b = format!("# v2 git bundle\n{SHA} refs/heads/main\n{SHA} HEAD\n\nPACK");
        let r = bundle_refs(b.as_bytes()).unwrap();
        assert_eq!(r.get("HEAD").map(String::as_str), Some(SHA));
        let thin = format!("# v2 git bundle\n-{SHA} x\n{SHA} HEAD\n\nPACK");
        assert!(bundle_refs(thin.as_bytes()).is_err());
        assert!(bundle_refs(b"PK\x03\x04 not a bundle\n\n").is_err());
        assert!(bundle_refs(b"# v2 git bundle\nno-end").is_err());
    }

    fn proven_work() -> Work {
        let mut w = Work::new("w1", "/p", "t");
        let mut refs = BTreeMap::new();
        refs.insert("HEAD".to_string(), SHA.to_string());
        w.git = Some(GitRecord { refs, bundle: Some("bundle-x.bundle".into()), ..Default::default() });
        w
    }

    #[test]
    fn a_live_file_the_laptop_does_not_hold_is_named() {
        let w = proven_work();
        let live = json!({ "repo": true, "refs": { "HEAD": SHA }, "dirty": false,
            "untracked": [{ "path": "results.csv", "sha256": "ab" }], "ignored": [] });
        let e = check_live(&w, &live, &[]).unwrap_err();
        assert_eq!(e.code, Code::Untracked);
        assert!(e.message.contains("results.csv"), "{}", e.message);
        assert!(check_live(&w, &live, &["results.csv".to_string()]).is_ok(), "discarding it by name lets the drop go on");
    }

    /// A harvested output counts as home only while the laptop holds a copy of it: once
    /// every copy is gone (deleted, moved, a folder in its place), the machine has its only
    /// bytes and the drop refuses, naming it, until it is harvested again or discarded.
    #[test]
    fn a_harvested_file_the_laptop_no_longer_holds_refuses_the_drop() {
        let mut w = proven_work();
        let rec = |guest: &str, laptop: &str| crate::ledger::FileRecord { guest: guest.into(), laptop: laptop.into(), sha256: "ab".into(), ..Default::default() };
        w.files_out.push(rec("RESULT.md", "/p/r2/RESULT.md"));
        w.files_out.push(rec("notes.md", "/p/notes.md"));
        w.files_out.push(rec("notes.md", "/p/copy/notes.md"));
        w.files_in.push(rec("data.csv", "/p/data.csv"));
        w.files_in.push(rec("elsewhere.txt", "/other/elsewhere.txt"));
        let live = json!({ "repo": true, "refs": { "HEAD": SHA }, "untracked": [
            { "path": "RESULT.md", "sha256": "ab" }, { "path": "notes.md", "sha256": "ab" },
            { "path": "data.csv", "sha256": "ab" }, { "path": "elsewhere.txt", "sha256": "ab" }], "ignored": [] });
        assert!(check_live(&w, &live, &[]).is_ok(), "the record accounts for each");
        let mut fs = crate::testing::MemFiles::new(&["/p"]);
        fs.put("/p/r2/RESULT.md", b"x");
        fs.put("/p/copy/notes.md", b"x");
        fs.put("/p/data.csv", b"x");
        assert!(laptop_lost(&mut fs, &w).is_empty(), "every file has a laptop copy (one of two, for notes.md; another project's is not looked at)");
        assert!(check_laptop_copies(&w, &live, &[], &laptop_lost(&mut fs, &w)).is_ok());
        fs.remove_file("/p/r2/RESULT.md").unwrap();
        fs.remove_file("/p/data.csv").unwrap();
        fs.create_dir_all("/p/data.csv").unwrap();
        w.files_out.push(rec("RESULT.md", "/p/r2/RESULT.md")); // harvested twice to one place: looked at once
        let lost = laptop_lost(&mut fs, &w);
        let e = check_laptop_copies(&w, &live, &[], &lost).unwrap_err();
        assert_eq!(e.code, Code::Untracked);
        assert!(e.message.contains("RESULT.md (was /p/r2/RESULT.md), data.csv (was /p/data.csv)") && !e.message.contains("notes.md"), "{}", e.message);
        assert!(e.next.contains("boxd_harvest") && e.next.contains("discard"), "{}", e.next);
        assert!(check_laptop_copies(&w, &live, &["RESULT.md".into(), "data.csv".into()], &lost).is_ok(), "given up by name");
        // A symlink the user put where the file was says where they keep it: held.
        fs.symlinks.insert("/p/r2/RESULT.md".into());
        assert!(!laptop_lost(&mut fs, &w).contains_key(&("RESULT.md".to_string(), "ab".to_string())));
        // The machine's copy changed since: not what the record held, so check_live names it.
        let live = json!({ "repo": true, "refs": { "HEAD": SHA }, "untracked": [{ "path": "RESULT.md", "sha256": "cd" }] });
        assert!(check_laptop_copies(&w, &live, &[], &lost).is_ok());
    }

    #[test]
    fn a_commit_not_in_the_bundle_and_a_changed_diff_refuse() {
        let w = proven_work();
        let other = "fedcba9876543210fedcba9876543210fedcba98";
        let e = check_live(&w, &json!({ "repo": true, "refs": { "HEAD": other } }), &[]).unwrap_err();
        assert_eq!(e.code, Code::NotProven);
        let e = check_live(&w, &json!({ "repo": true, "refs": { "HEAD": SHA }, "dirty": true, "diffSha256": "x", "changed": ["README.md"] }), &[]).unwrap_err();
        assert_eq!(e.code, Code::Dirty);
        assert!(e.message.contains("README.md"));
        // A version staged apart from its file: in no commit and no patch.
        let staged = json!({ "repo": true, "refs": { "HEAD": SHA }, "dirty": true, "stagedApart": ["f.txt"] });
        let e = check_live(&w, &staged, &[]).unwrap_err();
        assert!(e.code == Code::Dirty && e.message.contains("staged versions") && e.message.contains("f.txt"), "{e:?}");
        assert_ne!(check_live(&w, &staged, &["f.txt".to_string()]).map_err(|e| e.message).err().unwrap_or_default(), e.message, "discarded by name");
    }

    #[test]
    fn a_prompt_admitted_after_the_proofs_export_refuses() {
        let mut w = proven_work();
        for id in ["p1", "p2"] {
            w.prompts.push(crate::ledger::Prompt { id: id.into(), admitted: true, ..Default::default() });
        }
        w.proofs.push(crate::ledger::Proof { prompts: 2, newest_prompt: Some("p1".into()), ..Default::default() });
        let live = json!({ "repo": true, "refs": { "HEAD": SHA }, "newestPrompt": "p2" });
        let e = check_live(&w, &live, &[]).unwrap_err();
        assert_eq!(e.code, Code::NotProven);
        assert!(e.message.contains("p2"), "{}", e.message);
        let live = json!({ "repo": true, "refs": { "HEAD": SHA }, "newestPrompt": "p1" });
        assert!(check_live(&w, &live, &[]).is_ok());
        // The record put back from an older copy that lists neither: refused until a
        // harvest's proof covers the guest's newest, then it passes.
        w.prompts.truncate(0);
        let live = json!({ "repo": true, "refs": { "HEAD": SHA }, "newestPrompt": "p2" });
        let e = check_live(&w, &live, &[]).unwrap_err();
        assert!(e.code == Code::NotProven && e.message.contains("never sent") && e.next.contains("boxd_harvest"), "{e:?}");
        w.proofs.push(crate::ledger::Proof { prompts: 0, newest_prompt: Some("p2".into()), ..Default::default() });
        assert!(check_live(&w, &live, &[]).is_ok(), "the proof was exported at p2: its run is home");
    }

    /// A new file whose name no tool call can give (not UTF-8 on the machine) names the way
    /// out that works: have the agent rename or remove it. One with a control character can
    /// be discarded by name (JSON carries it), though no harvest brings it home.
    #[test]
    fn a_name_no_call_can_give_names_renaming_it_on_the_machine() {
        let w = proven_work();
        for (name, rename, discard) in [("x\u{FFFD}y.bin", true, false), ("a\tb.txt", true, true), ("plain.txt", false, false)] {
            let live = json!({ "repo": true, "refs": { "HEAD": SHA }, "untracked": [{ "path": name, "sha256": "ab" }], "ignored": [] });
            let e = check_live(&w, &live, &[]).unwrap_err();
            assert_eq!(e.code, Code::Untracked);
            assert_eq!((e.next.contains("have the agent rename it there"), e.next.contains("\"discard\" naming it")), (rename, discard), "{name}: {e:?}");
            if discard {
                assert!(check_live(&w, &live, &[name.to_string()]).is_ok(), "{name}: discarded by name");
            }
        }
    }

    #[test]
    fn nested_repositories_and_cut_listings_refuse() {
        let w = proven_work();
        let live = json!({ "repo": true, "refs": { "HEAD": SHA }, "nested": ["sub"] });
        let e = check_live(&w, &live, &[]).unwrap_err();
        assert_eq!(e.code, Code::Untracked);
        assert!(e.message.contains("sub"));
        assert!(check_live(&w, &live, &["sub".to_string()]).is_ok());
        let live = json!({ "repo": true, "refs": { "HEAD": SHA }, "untrackedTruncated": true });
        assert_eq!(check_live(&w, &live, &["x".to_string()]).unwrap_err().code, Code::Untracked);
        // A linked work tree with uncommitted changes: refused until given up by name.
        let live = json!({ "repo": true, "refs": { "HEAD": SHA }, "worktrees": ["/home/boxd/work/w1-feature"] });
        let e = check_live(&w, &live, &[]).unwrap_err();
        assert_eq!(e.code, Code::Untracked);
        assert!(e.message.contains("w1-feature"), "{}", e.message);
        assert!(check_live(&w, &live, &["/home/boxd/work/w1-feature".to_string()]).is_ok());
    }

    #[test]
    fn a_stored_file_is_intact_only_while_its_bytes_hash_to_its_name() {
        let mut fs = crate::testing::MemFiles::new(&["/l"]);
        fs.create_dir_all("/l/works/w1").unwrap();
        let mut ledger = Ledger::new(&mut fs, "/l");
        let sha = sha256_hex(b"PACK");
        let name = format!("bundle-{}.bundle", &sha[..16]);
        assert!(!stored_intact(&mut ledger, "w1", &name, None).unwrap(), "missing");
        ledger.put_blob("w1", &name, b"PACK").unwrap();
        assert!(stored_intact(&mut ledger, "w1", &name, None).unwrap());
        assert!(stored_intact(&mut ledger, "w1", &name, Some(&sha)).unwrap());
        assert!(!stored_intact(&mut ledger, "w1", &name, Some("0000")).unwrap(), "not the full digest recorded");
        ledger.put_blob("w1", &name, b"PACK, damaged").unwrap();
        assert!(!stored_intact(&mut ledger, "w1", &name, None).unwrap(), "damaged");
        ledger.put_blob("w1", "bundle-x.bundle", b"PACK").unwrap();
        assert!(!stored_intact(&mut ledger, "w1", "bundle-x.bundle", None).unwrap(), "a name that carries no digest");
        fs.remove_file(&format!("/l/works/w1/{name}")).unwrap();
        fs.symlinks.insert(format!("/l/works/w1/{name}"));
        assert!(!stored_intact(&mut Ledger::new(&mut fs, "/l"), "w1", &name, None).unwrap(), "a symlink where it was is no stored copy");
    }

    #[test]
    fn owed_files_refuse_until_discarded() {
        let mut w = proven_work();
        w.owed.push("out/SUMMARY.md".into());
        let live = json!({ "repo": true, "refs": { "HEAD": SHA } });
        assert_eq!(check_live(&w, &live, &[]).unwrap_err().code, Code::Untracked);
        assert!(check_live(&w, &live, &["out".to_string()]).is_ok());
    }
}
