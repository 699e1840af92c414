//! `machine cp SRC DST [-r]`: one side is `VM:path`, the other a local path or `-`
//! (stdin/stdout). A guest path maps into the machine home only: relative, `~/…` or
//! `/home/boxd/…`. Uploads are staged in `<target>.boxd-upload.tmp` and renamed, and
//! nothing follows a symlink out of the machine home.

use crate::app::Ctx;
use crate::fail::{Fail, Res};
use crate::fstree::{self, Stats};
use crate::store::Session;
use crate::{machines, power, procs, util};
use serde::Serialize;
use std::fs;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

#[derive(Serialize)]
struct CopyDoc {
    bytes: u64,
    files: u64,
}

/// `VM:path` → (VM, path), when the part before the first `:` is a machine name.
pub fn split_remote(arg: &str) -> Option<(&str, &str)> {
    let (vm, path) = arg.split_once(':')?;
    machines::valid_name(vm).then_some((vm, path))
}

pub fn cp(ctx: &Ctx) -> Res<i32> {
    let (src, dst) = (ctx.inv.args[0].as_str(), ctx.inv.args[1].as_str());
    let recursive = ctx.inv.has("--recursive");
    let (stats, to_stdout) = match (split_remote(src), split_remote(dst)) {
        (Some(_), Some(_)) => {
            return Err(Fail::new("copying between two machines is not supported — copy through a local file"));
        }
        (None, None) => {
            return Err(Fail::usage(
                "one side of cp must be VM:path",
                "hint: boxd machine cp ./file vm:path  or  boxd machine cp vm:path ./file",
            ));
        }
        (Some((vm, path)), None) => (download(ctx, vm, path, dst, recursive)?, dst == "-"),
        (None, Some((vm, path))) => (upload(ctx, src, vm, path, recursive)?, false),
    };
    // When stdout carries the file, it carries nothing else.
    if !to_stdout && ctx.out.json {
        ctx.out.doc(&CopyDoc { bytes: stats.bytes, files: stats.files });
    }
    Ok(0)
}

/// Check the machine can take a session (waking standby), register this copy as a session
/// so the idle sweep leaves the machine alone, and return its canonical home.
fn open_machine<'a>(ctx: &'a Ctx<'a>, vm: &str) -> Res<(PathBuf, Guard<'a>)> {
    let mut lock = ctx.home.lock()?;
    let now = util::now_ms();
    let i = lock.state.visible(vm, now)?;
    let m = &mut lock.state.machines[i];
    power::ready_for_session(m, now)?;
    m.last_activity_ms = now;
    let me = procs::self_session();
    m.sessions.push(me.clone());
    let guard = Guard { ctx, id: m.id.clone(), me };
    let home = ctx.home.machine_home(&m.id);
    lock.save()?;
    drop(lock); // the guard takes the lock again when it drops
    let home = home.canonicalize().map_err(|e| Fail::io(format!("opening the home of '{vm}'"), e))?;
    Ok((home, guard))
}

fn outside(raw: &str) -> Fail {
    Fail::new(format!(
        "'{raw}' is outside the machine home — boxd-local maps only /home/boxd (use a relative path)"
    ))
}

/// The guest path as a path relative to the home, with `.`/`..` resolved lexically.
fn guest_rel(raw: &str) -> Res<PathBuf> {
    let rest = if raw.is_empty() || raw == "~" || raw == "/home/boxd" {
        ""
    } else if let Some(r) = raw.strip_prefix("~/").or_else(|| raw.strip_prefix("/home/boxd/")) {
        r
    } else if raw.starts_with('/') {
        return Err(outside(raw));
    } else {
        raw
    };
    let mut rel = PathBuf::new();
    for c in Path::new(rest).components() {
        match c {
            Component::Normal(x) => rel.push(x),
            Component::CurDir => {}
            Component::ParentDir if rel.pop() => {}
            _ => return Err(outside(raw)),
        }
    }
    Ok(rel)
}

/// The deepest existing ancestor of `p`, with every symlink resolved, must be inside `home`.
fn confine(home: &Path, p: &Path, raw: &str) -> Res<()> {
    let mut probe = p.to_path_buf();
    loop {
        if let Ok(real) = probe.canonicalize() {
            return if real.starts_with(home) { Ok(()) } else { Err(escape(raw)) };
        }
        if !probe.pop() {
            return Err(escape(raw));
        }
    }
}

fn escape(raw: &str) -> Fail {
    Fail::new(format!("'{raw}' leads out of the machine home through a symlink — refused"))
}

fn download<'a>(ctx: &'a Ctx<'a>, vm: &str, raw: &str, dst: &str, recursive: bool) -> Res<Stats> {
    let (home, _session) = open_machine(ctx, vm)?;
    let src = home.join(guest_rel(raw)?);
    let real = src.canonicalize().map_err(|e| Fail::io(format!("{vm}:{raw}"), e))?;
    if !real.starts_with(&home) {
        return Err(escape(raw));
    }
    let meta = fs::metadata(&real).map_err(|e| Fail::io(format!("{vm}:{raw}"), e))?;
    let result = if dst == "-" {
        if meta.is_dir() {
            return Err(Fail::new(format!("'{vm}:{raw}' is a folder — '-' takes a single file")));
        }
        let mut out = std::io::stdout().lock();
        let copied = fs::File::open(&real).and_then(|mut f| std::io::copy(&mut f, &mut out));
        let _ = out.flush();
        copied.map(|bytes| Stats { bytes, files: 1 })
    } else {
        if meta.is_dir() && !recursive {
            return Err(Fail::new(format!("'{vm}:{raw}' is a folder (use -r)")));
        }
        let mut target = PathBuf::from(dst);
        if target.is_dir() {
            // The home itself is /home/boxd on the guest.
            target.push(real.strip_prefix(&home).ok().and_then(|r| r.file_name()).unwrap_or("boxd".as_ref()));
        }
        if meta.is_dir() {
            fstree::copy_tree(&real, &target, false)
        } else {
            fstree::copy_file(&real, &target, false).map(|bytes| Stats { bytes, files: 1 })
        }
    };
    result.map_err(|e| Fail::io(format!("copying {vm}:{raw} to {dst}"), e))
}

fn upload<'a>(ctx: &'a Ctx<'a>, src: &str, vm: &str, raw: &str, recursive: bool) -> Res<Stats> {
    let (home, _session) = open_machine(ctx, vm)?;
    let mut target = home.join(guest_rel(raw)?);
    confine(&home, &target, raw)?;
    let src_meta = if src == "-" {
        None
    } else {
        Some(fs::metadata(src).map_err(|e| Fail::io(src, e))?)
    };
    if target.is_dir() {
        let Some(base) = Path::new(src).file_name().filter(|_| src != "-") else {
            return Err(Fail::new(format!("'{vm}:{raw}' is a folder — name the file to write")));
        };
        target.push(base);
        confine(&home, &target, raw)?;
    }
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent).map_err(|e| Fail::io(format!("{vm}:{raw}"), e))?;
        confine(&home, parent, raw)?;
    }
    let result = match src_meta {
        None => fstree::stage_write(&target, std::io::stdin().lock(), 0o644).map(|bytes| Stats { bytes, files: 1 }),
        Some(m) if m.is_dir() => {
            if !recursive {
                return Err(Fail::new(format!("'{src}' is a folder (use -r)")));
            }
            fstree::copy_tree(Path::new(src), &target, true)
        }
        Some(_) => fstree::copy_file(Path::new(src), &target, true).map(|bytes| Stats { bytes, files: 1 }),
    };
    result.map_err(|e| Fail::io(format!("copying {src} to {vm}:{raw}"), e))
}

/// The copy's session: ended (counting as activity) when dropped, however the copy ends.
struct Guard<'a> {
    ctx: &'a Ctx<'a>,
    id: String,
    me: Session,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        power::end_session(self.ctx.home, &self.id, &self.me);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_paths_map_into_the_home() {
        assert_eq!(guest_rel("a/b").unwrap(), PathBuf::from("a/b"));
        assert_eq!(guest_rel("/home/boxd/x").unwrap(), PathBuf::from("x"));
        assert_eq!(guest_rel("~/x/../y").unwrap(), PathBuf::from("y"));
        assert_eq!(guest_rel("").unwrap(), PathBuf::new());
        assert!(guest_rel("/etc/passwd").is_err());
        assert!(guest_rel("../x").is_err());
        assert!(guest_rel("/home/boxdx").is_err());
    }

    #[test]
    fn remote_side() {
        assert_eq!(split_remote("vm:a"), Some(("vm", "a")));
        assert_eq!(split_remote("./vm:a"), None);
        assert_eq!(split_remote("-"), None);
    }
}
