//! Folder trees: copying (snapshots, forks, restores, `cp -r`), staged single-file writes,
//! sizing and removal. Symlinks inside a tree are copied as links, never followed; fifos,
//! sockets and devices are skipped.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Read};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

#[derive(Default, Clone, Copy)]
pub struct Stats {
    pub bytes: u64,
    pub files: u64,
}

/// Copy the folder `src` to `dst` (created, or merged into when it is already a folder).
/// `staged`: write each file through `<file>.boxd-upload.tmp` + rename, and refuse to
/// write through a symlink already at `dst` (uploads into a machine home).
pub fn copy_tree(src: &Path, dst: &Path, staged: bool) -> io::Result<Stats> {
    let mut stats = Stats::default();
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent)?;
    }
    copy_dir(src, dst, staged, &mut stats)?;
    Ok(stats)
}

fn copy_dir(src: &Path, dst: &Path, staged: bool, stats: &mut Stats) -> io::Result<()> {
    match fs::symlink_metadata(dst) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a folder", dst.display()),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir(dst)?,
        Err(e) => return Err(e),
    }
    let mode = fs::metadata(src)?.permissions();
    for entry in fs::read_dir(src)? {
        let entry = entry?;
        let kind = entry.file_type()?; // the entry itself, not what a link points at
        let (from, to) = (entry.path(), dst.join(entry.file_name()));
        if kind.is_dir() {
            copy_dir(&from, &to, staged, stats)?;
        } else if kind.is_file() {
            stats.bytes += copy_file(&from, &to, staged)?;
            stats.files += 1;
        } else if kind.is_symlink() {
            let target = fs::read_link(&from)?;
            if fs::symlink_metadata(&to).is_ok() {
                fs::remove_file(&to)?;
            }
            std::os::unix::fs::symlink(target, &to)?;
        }
    }
    // Last, so a read-only source folder does not stop us filling the copy.
    fs::set_permissions(dst, mode)
}

/// Copy one file, keeping its permission bits; never writes through a symlink at `to`.
pub fn copy_file(from: &Path, to: &Path, staged: bool) -> io::Result<u64> {
    if staged {
        let mode = fs::metadata(from)?.permissions().mode();
        return stage_write(to, File::open(from)?, mode);
    }
    if fs::symlink_metadata(to).is_ok_and(|m| m.file_type().is_symlink()) {
        fs::remove_file(to)?;
    }
    fs::copy(from, to)
}

pub fn staging_path(target: &Path) -> PathBuf {
    let mut s = target.as_os_str().to_owned();
    s.push(".boxd-upload.tmp");
    PathBuf::from(s)
}

/// Write `target` the way the real CLI does: into `<target>.boxd-upload.tmp`, then rename.
/// Readers see the old file or the new one; the rename replaces a symlink rather than
/// writing through it. Concurrent uploads to one target clobber each other, as on boxd.
pub fn stage_write(target: &Path, mut reader: impl Read, mode: u32) -> io::Result<u64> {
    let tmp = staging_path(target);
    if fs::symlink_metadata(&tmp).is_ok() {
        fs::remove_file(&tmp)?;
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o600)
        .open(&tmp)?;
    let written = io::copy(&mut reader, &mut f).and_then(|n| {
        f.set_permissions(Permissions::from_mode(mode & 0o7777))?;
        Ok(n)
    });
    drop(f);
    match written.and_then(|n| fs::rename(&tmp, target).map(|_| n)) {
        Ok(n) => Ok(n),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Bytes in regular files under `p` (links and folders count nothing).
pub fn tree_size(p: &Path) -> u64 {
    let Ok(m) = fs::symlink_metadata(p) else { return 0 };
    if m.is_file() {
        return m.len();
    }
    if !m.is_dir() {
        return 0;
    }
    fs::read_dir(p).map(|d| d.flatten().map(|e| tree_size(&e.path())).sum()).unwrap_or(0)
}

/// Delete a tree; a missing one is fine. A machine may have made folders read-only, so on
/// a permission error make every folder writable and try again.
pub fn remove_tree(p: &Path) -> io::Result<()> {
    match fs::remove_dir_all(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            make_writable(p);
            fs::remove_dir_all(p)
        }
        Err(e) => Err(e),
    }
}

fn make_writable(p: &Path) {
    let Ok(m) = fs::symlink_metadata(p) else { return };
    if !m.is_dir() {
        return;
    }
    let _ = fs::set_permissions(p, Permissions::from_mode(m.permissions().mode() | 0o700));
    if let Ok(d) = fs::read_dir(p) {
        for e in d.flatten() {
            make_writable(&e.path());
        }
    }
}
