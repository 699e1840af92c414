//! The files a spawn streams (WIT `spawn.request` `stdin-files` / `stdout-files`): file
//! bytes travel between laptop files and a child's pipes as frames, never through the
//! component, JSON or base64. One frame is `<size>\n<size bytes><sha256 hex>\n`
//! (docs/guest.md, "Frames"); the sender computes the digest while it streams and the
//! receiver computes it again. Memory stays one chunk per stream whatever the size.
//!
//! The checks are the component's, made again where the bytes are: every path absolute,
//! inside a preopen, with no symlink on the way; regular files only; the protocol's limits
//! (component/guest/protocol.json: a file, a call).

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

const CHUNK: usize = 64 * 1024;
/// The longest size header a receiver reads: digits and the newline.
const HEADER_MAX: u64 = 21;

/// One file streamed: laptop path, size, sha256 (hex).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Streamed {
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

/// The protocol's limits on files: (a file, a call), in bytes.
pub fn limits() -> (u64, u64) {
    static LIMITS: OnceLock<(u64, u64)> = OnceLock::new();
    *LIMITS.get_or_init(|| {
        let doc: serde_json::Value = serde_json::from_str(include_str!("../../../component/guest/protocol.json")).expect("protocol.json is JSON");
        let max = |name: &str| doc["limits"][name]["max"].as_u64().unwrap_or_else(|| panic!("protocol.json names limits.{name}.max"));
        (max("file"), max("call"))
    })
}

/// How much more than its cap a child's stdout may hold when it frames `n` files.
pub fn stdout_allowance(n: usize) -> u64 {
    if n == 0 {
        0
    } else {
        limits().1 + n as u64 * (HEADER_MAX + 65)
    }
}

/// A laptop path the host streams: absolute, inside a preopen, nothing on the way a
/// symlink (its canonical form is itself). `what` is "file" for one read, "folder" for
/// the folder of one written.
fn confined(path: &Path, preopens: &[PathBuf], what: &str) -> Result<(), String> {
    let canonical = std::fs::canonicalize(path).map_err(|e| format!("{} cannot be streamed: {e}", path.display()))?;
    if canonical != path {
        return Err(format!("{} cannot be streamed: a symlink is on the way, or the path is not clean", path.display()));
    }
    if !preopens.iter().any(|p| canonical.starts_with(p)) {
        return Err(format!("{} cannot be streamed: the {what} is outside the preopened folders", path.display()));
    }
    Ok(())
}

/// Open `path` (absolute, inside one of `preopens`) resolved beneath its preopen in the
/// same system call that opens it (Linux `openat2`: no symlink, `..` escape or magic link
/// anywhere on the way), so a folder swapped for a symlink after `confined` looked cannot
/// send the open elsewhere. `flags` are open(2)'s (O_NOFOLLOW and O_CLOEXEC are added).
/// Where openat2 is missing (Linux before 5.6) it opens by path with `by_path`, after the
/// caller's `confined` check, which leaves that window open.
fn open_beneath(path: &Path, preopens: &[PathBuf], flags: i32, by_path: &OpenOptions) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let Some(root) = preopens.iter().filter(|p| path.starts_with(p)).max_by_key(|p| p.as_os_str().len()) else {
        return Err(io::Error::other("it is outside the preopened folders"));
    };
    let rel = path.strip_prefix(root).map_err(io::Error::other)?;
    if rel.as_os_str().is_empty() {
        return Err(io::Error::other("it names a preopened folder itself"));
    }
    let dir = File::open(root)?;
    let rel = std::ffi::CString::new(rel.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // openat2 refuses any flag but these two beside O_PATH (EINVAL).
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC | if flags & libc::O_PATH == 0 { libc::O_NOCTTY } else { 0 };
    let resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    match super::read_open::openat2(dir.as_raw_fd(), &rel, flags, resolve) {
        Ok(fd) => Ok(File::from(fd)),
        Err(e) => match e.raw_os_error() {
            Some(libc::ENOSYS) => by_path.open(path),
            Some(libc::ELOOP) | Some(libc::EXDEV) => Err(io::Error::other("a symlink is on the way, or it leads out of its preopened folder")),
            _ => Err(e),
        },
    }
}

/// A file the host creates for a frame takes the read and write bits of the laptop file the
/// component names for it (`stdout-modes-from`: the file it may replace), always readable
/// by its owner (the host syncs it and the component hashes it), as an editor's save keeps
/// them: a file the user made private stays so once a harvest replaces it. Never an
/// execute, set-id or sticky bit: no file the host writes for the component can be run.
/// That file is looked at beneath its preopen and not followed; one that is absent or not
/// a regular file leaves the usual mode, and so does any failure here (the mode is not
/// worth a harvest).
fn keep_mode(mode_from: &str, preopens: &[PathBuf], out: &File) {
    use std::os::unix::fs::PermissionsExt;
    if mode_from.is_empty() {
        return;
    }
    let by_path = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).clone();
    let Ok(meta) = open_beneath(Path::new(mode_from), preopens, libc::O_PATH, &by_path).and_then(|f| f.metadata()) else { return };
    if meta.file_type().is_file() {
        let _ = out.set_permissions(std::fs::Permissions::from_mode(meta.permissions().mode() & 0o666 | 0o400));
    }
}

/// A laptop file ready to be sent, opened and checked before the child starts.
pub struct Outgoing {
    path: String,
    file: File,
    size: u64,
    /// What fstat said at the open: compared again after the last read.
    seen: Seen,
}

/// The words a stream stopped for a file that changed under it carries (the component
/// looks for them: component/src/tools/submit.rs CHANGED_MARK).
pub const CHANGED: &str = "changed while it was sent";

/// What tells a file rewritten in place: size, mtime and ctime, to the nanosecond the file
/// system keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Seen {
    fn of(meta: &std::fs::Metadata) -> Seen {
        use std::os::unix::fs::MetadataExt;
        Seen { size: meta.size(), mtime: (meta.mtime(), meta.mtime_nsec()), ctime: (meta.ctime(), meta.ctime_nsec()) }
    }
}

/// The error a stream stops with when `path` changed while it was read.
fn changed(path: &str) -> io::Error {
    io::Error::other(format!("{path} {CHANGED} (its size, mtime or ctime is not what it was when it was opened), so its frame was cut before its digest"))
}

/// True when `e` is the stream stopping for a file that changed under it.
pub fn is_changed(e: &io::Error) -> bool {
    e.to_string().contains(CHANGED)
}

/// Open every file to be sent on stdin, checking each (and their total) first: a refusal
/// starts no child.
pub fn open_outgoing(paths: &[String], preopens: &[PathBuf]) -> Result<Vec<Outgoing>, String> {
    let (file_max, call_max) = limits();
    let mut total = 0u64;
    let mut out = Vec::new();
    for p in paths {
        confined(Path::new(p), preopens, "file")?;
        // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
        let by_path = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).clone();
        let file = open_beneath(Path::new(p), preopens, libc::O_RDONLY | libc::O_NONBLOCK, &by_path).map_err(|e| format!("{p} cannot be streamed: {e}"))?;
        let meta = file.metadata().map_err(|e| format!("{p} cannot be streamed: {e}"))?;
        if !meta.is_file() {
            return Err(format!("{p} cannot be streamed: it is not a regular file"));
        }
        if meta.len() > file_max {
            return Err(format!("FILE_TOO_LARGE: {p} is {} bytes; the cap is {} bytes a file (protocol.json)", meta.len(), file_max));
        }
        total += meta.len();
        if total > call_max {
            return Err(format!("FILE_TOO_LARGE: the files add up to more than {call_max} bytes (protocol.json), at {p}"));
        }
        out.push(Outgoing { path: p.clone(), file, size: meta.len(), seen: Seen::of(&meta) });
    }
    Ok(out)
}

/// Check the files to be received: each a new name in an existing folder of a preopen.
pub fn check_incoming(paths: &[String], preopens: &[PathBuf]) -> Result<(), String> {
    for p in paths {
        let path = Path::new(p);
        let (Some(folder), Some(_)) = (path.parent(), path.file_name()) else {
            return Err(format!("{p} cannot be received: it names no file"));
        };
        confined(folder, preopens, "folder")?;
    }
    Ok(())
}

/// Write each file as one frame to `w`, reading it once. A file that changed between its
/// open and its last read (fstat again then: size, mtime or ctime differ; or it ended
/// early) fails the stream before its digest is written: the receiver sees the frame cut
/// short and keeps nothing, and the error says so (`is_changed`). Bytes rewritten in place
/// at the same size would otherwise arrive as a mix of old and new under a digest of that
/// mix. A rewrite within the file system's timestamp granularity that keeps the size is
/// beyond what fstat can tell.
pub fn send(w: &mut impl Write, files: Vec<Outgoing>) -> io::Result<Vec<Streamed>> {
    let mut sent = Vec::new();
    let mut chunk = vec![0u8; CHUNK];
    for Outgoing { path, file, size, seen } in files {
        w.write_all(format!("{size}\n").as_bytes())?;
        let mut digest = Sha256::new();
        let mut left = size;
        let mut r = (&file).take(size);
        while left > 0 {
            let n = r.read(&mut chunk)?;
            if n == 0 {
                return Err(changed(&path));
            }
            digest.update(&chunk[..n]);
            w.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        if Seen::of(&file.metadata()?) != seen {
            return Err(changed(&path));
        }
        let sha256 = super::hex(&digest.finalize());
        w.write_all(format!("{sha256}\n").as_bytes())?;
        sent.push(Streamed { path, size, sha256 });
    }
    w.flush()?;
    Ok(sent)
}

/// The first line of `r` (the child's JSON answer), at most `cap` bytes.
pub fn first_line(r: &mut impl BufRead, cap: usize) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    r.take(cap as u64 + 1).read_until(b'\n', &mut line)?;
    if line.len() > cap {
        return Err(io::Error::other(format!("its first line is longer than {cap} bytes")));
    }
    Ok(line)
}

/// Receive the frames that follow the first line into the files `paths` names, in order,
/// each created new, with the mode of the file `modes_from` names at its index (`keep_mode`).
/// Returns the files that arrived whole. A frame that is cut short,
/// damaged, past the limits, or more frames than paths is an error, and then no file of
/// this call is kept.
pub fn receive(r: &mut impl BufRead, paths: &[String], modes_from: &[String], preopens: &[PathBuf]) -> Result<Vec<Streamed>, String> {
    let mut received: Vec<Streamed> = Vec::new();
    let result = receive_into(r, paths, modes_from, preopens, &mut received).and_then(|()| durable(&received, preopens));
    if result.is_err() {
        for f in &received {
            let _ = std::fs::remove_file(&f.path);
        }
    }
    result.map(|()| received)
}

fn receive_into(r: &mut impl BufRead, paths: &[String], modes_from: &[String], preopens: &[PathBuf], received: &mut Vec<Streamed>) -> Result<(), String> {
    let (file_max, call_max) = limits();
    let mut total = 0u64;
    let mut chunk = vec![0u8; CHUNK];
    loop {
        let mut header = Vec::new();
        r.take(HEADER_MAX).read_until(b'\n', &mut header).map_err(|e| e.to_string())?;
        if header.is_empty() {
            return Ok(());
        }
        let path = paths.get(received.len()).ok_or_else(|| format!("the child sent more than the {} files asked for", paths.len()))?;
        let size: u64 = header
            .strip_suffix(b"\n")
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| h.parse().ok())
            .ok_or_else(|| format!("frame {} has no size header", received.len() + 1))?;
        total += size;
        if size > file_max || total > call_max {
            return Err(format!("FILE_TOO_LARGE: frame {} would pass the cap of {file_max} bytes a file, {call_max} a call (protocol.json)", received.len() + 1));
        }
        // Created where check_incoming looked, as the guest's bytes arrive: resolved beneath
        // the preopen in the same call, so a folder swapped meanwhile is refused.
        let by_path = OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_NOFOLLOW).clone();
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
        let mut out = open_beneath(Path::new(path), preopens, flags, &by_path).map_err(|e| format!("cannot create {path}: {e}"))?;
        // Recorded at once, so a failure below removes it too.
        received.push(Streamed { path: path.clone(), size, sha256: String::new() });
        keep_mode(modes_from.get(received.len() - 1).map_or("", String::as_str), preopens, &out);
        let mut digest = Sha256::new();
        let mut left = size;
        while left > 0 {
            let want = chunk.len().min(left as usize);
            let n = r.read(&mut chunk[..want]).map_err(|e| e.to_string())?;
            if n == 0 {
                return Err(format!("the frame for {path} ended after {} of {size} bytes", size - left));
            }
            digest.update(&chunk[..n]);
            out.write_all(&chunk[..n]).map_err(|e| format!("cannot write {path}: {e}"))?;
            left -= n as u64;
        }
        let sha256 = super::hex(&digest.finalize());
        let mut trailer = [0u8; 65];
        r.read_exact(&mut trailer).map_err(|_| format!("the frame for {path} has no digest"))?;
        if trailer[..64] != *sha256.as_bytes() || trailer[64] != b'\n' {
            return Err(format!("{path} arrived damaged: its digest is {sha256}, the sender's {}", String::from_utf8_lossy(&trailer[..64])));
        }
        received.last_mut().expect("pushed above").sha256 = sha256;
    }
}

/// Make the received files durable before the component records them as home: one
/// syncfs(2) per file system on Linux (a flush per file costs ten times as much for many
/// small files), a flush per file elsewhere.
fn durable(received: &[Streamed], preopens: &[PathBuf]) -> Result<(), String> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        unsafe extern "C" {
            fn syncfs(fd: i32) -> i32;
        }
        let mut synced = std::collections::BTreeSet::new();
        for f in received {
            let file = open_beneath(Path::new(&f.path), preopens, libc::O_RDONLY, OpenOptions::new().read(true)).map_err(|e| format!("cannot sync {}: {e}", f.path))?;
            let dev = file.metadata().map_err(|e| format!("cannot sync {}: {e}", f.path))?.dev();
            // SAFETY: syncfs(2) on a descriptor we hold open; no memory is involved.
            if synced.insert(dev) && unsafe { syncfs(file.as_raw_fd()) } != 0 {
                return Err(format!("cannot sync {}: {}", f.path, io::Error::last_os_error()));
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    for f in received {
        File::open(&f.path).and_then(|file| file.sync_all()).map_err(|e| format!("cannot sync {}: {e}", f.path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Removes the test's folder when the test ends, passed or failed.
    struct Cleanup(PathBuf);

    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn dir(name: &str) -> (PathBuf, Cleanup) {
        let d = std::env::temp_dir().join(format!("boxd-frames-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let d = std::fs::canonicalize(d).unwrap();
        (d.clone(), Cleanup(d))
    }

    #[test]
    fn files_round_trip_through_frames_with_their_digests() {
        let (d, _cleanup) = dir("round");
        let a = d.join("a.bin");
        std::fs::write(&a, vec![7u8; 200_000]).unwrap();
        std::fs::write(d.join("b.txt"), b"").unwrap();
        let paths: Vec<String> = ["a.bin", "b.txt"].iter().map(|n| d.join(n).display().to_string()).collect();
        let mut wire = Vec::new();
        let sent = send(&mut wire, open_outgoing(&paths, std::slice::from_ref(&d)).unwrap()).unwrap();
        assert_eq!((sent[0].size, sent[1].size), (200_000, 0));
        assert_eq!(sent[1].sha256, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        let out: Vec<String> = ["a.out", "b.out"].iter().map(|n| d.join(n).display().to_string()).collect();
        let got = receive(&mut &wire[..], &out, &[], std::slice::from_ref(&d)).unwrap();
        assert_eq!(got.iter().map(|g| &g.sha256).collect::<Vec<_>>(), sent.iter().map(|s| &s.sha256).collect::<Vec<_>>());
        assert_eq!(std::fs::read(d.join("a.out")).unwrap(), std::fs::read(&a).unwrap());
    }

    /// A received file takes the read and write bits of the laptop file named for it (made
    /// private by the user, and executable: not carried); one named for a symlink, or for
    /// none, keeps the usual mode.
    #[test]
    fn a_temp_file_takes_the_mode_of_the_file_it_will_replace() {
        use std::os::unix::fs::PermissionsExt;
        let (d, _cleanup) = dir("mode");
        let dest = d.join("secret.env");
        std::fs::write(&dest, b"old").unwrap();
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o740)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.join("link.txt")).unwrap();
        let src = vec![dest.display().to_string(); 3];
        let mut wire = Vec::new();
        send(&mut wire, open_outgoing(&src, std::slice::from_ref(&d)).unwrap()).unwrap();
        let temps: Vec<String> = ["secret.env.0123456789ab-0.boxd-tmp", ".0123456789ab-1.boxd-tmp", "link.txt.0123456789ab-2.boxd-tmp"].iter().map(|n| d.join(n).display().to_string()).collect();
        let modes_from = [dest.display().to_string(), String::new(), d.join("link.txt").display().to_string()];
        receive(&mut &wire[..], &temps, &modes_from, std::slice::from_ref(&d)).unwrap();
        let usual = std::fs::metadata(&temps[1]).unwrap().permissions().mode() & 0o7777;
        let modes: Vec<u32> = temps.iter().map(|t| std::fs::metadata(t).unwrap().permissions().mode() & 0o7777).collect();
        assert_eq!(modes, [0o640, usual, usual], "its read and write bits, never an execute bit");
        assert_ne!(usual, 0o640);
    }

    /// A pipe that runs `meddle` once, when the first bytes of a file's frame went out
    /// (after its size header): the file changes between its open and its last read.
    struct Meddler<F: FnMut()> {
        wire: Vec<u8>,
        meddle: Option<F>,
    }

    impl<F: FnMut()> Write for Meddler<F> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let header = self.wire.is_empty();
            self.wire.extend_from_slice(buf);
            if !header {
                if let Some(mut m) = self.meddle.take() {
                    m();
                }
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A file rewritten in place at the same size while it is streamed (its mtime moved),
    /// or grown: the stream fails saying it changed, before the digest, so the receiver
    /// keeps nothing, never a mix of old and new bytes under a digest of the mix.
    #[test]
    fn a_file_changed_while_it_is_streamed_fails_the_stream_before_its_digest() {
        let (d, _cleanup) = dir("changed");
        let a = d.join("a.bin");
        let rewrite_in_place = |a: &Path| {
            let mut f = OpenOptions::new().write(true).open(a).unwrap();
            f.write_all(&vec![b'n'; 200_000]).unwrap();
            f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000)).unwrap();
        };
        let grow = |a: &Path| OpenOptions::new().append(true).open(a).unwrap().write_all(b"more").unwrap();
        for meddle in [&rewrite_in_place as &dyn Fn(&Path), &grow] {
            std::fs::write(&a, vec![b'o'; 200_000]).unwrap();
            let paths = vec![a.display().to_string()];
            let files = open_outgoing(&paths, std::slice::from_ref(&d)).unwrap();
            let mut pipe = Meddler { wire: Vec::new(), meddle: Some(|| meddle(&a)) };
            let e = send(&mut pipe, files).unwrap_err();
            assert!(is_changed(&e) && e.to_string().contains(&paths[0]), "{e}");
            let out = vec![d.join("a.out").display().to_string()];
            assert!(receive(&mut &pipe.wire[..], &out, &[], std::slice::from_ref(&d)).is_err());
            assert!(!d.join("a.out").exists());
        }
        // Untouched, the same file goes through whole.
        std::fs::write(&a, vec![b'o'; 200_000]).unwrap();
        let files = open_outgoing(&[a.display().to_string()], std::slice::from_ref(&d)).unwrap();
        let mut pipe = Meddler { wire: Vec::new(), meddle: None::<fn()> };
        assert_eq!(send(&mut pipe, files).unwrap()[0].size, 200_000);
    }

    #[test]
    fn a_damaged_or_short_stream_keeps_no_file() {
        let (d, _cleanup) = dir("damaged");
        let out = vec![d.join("x").display().to_string(), d.join("y").display().to_string()];
        let good = format!("2\nhi{}\n", super::super::hex(&Sha256::digest(b"hi")));
        for bad in [format!("{good}2\nho{}\n", "0".repeat(64)), format!("{good}5\nhi"), format!("{good}{good}{good}"), format!("{good}x\n")] {
            let e = receive(&mut bad.as_bytes(), &out, &[], std::slice::from_ref(&d)).unwrap_err();
            assert!(!d.join("x").exists() && !d.join("y").exists(), "{e}");
        }
        assert_eq!(receive(&mut good.as_bytes(), &out, &[], std::slice::from_ref(&d)).unwrap().len(), 1);
    }

    /// The landing folder checked, then swapped for a symlink to a folder outside every
    /// preopen before the bytes arrive (the user or another process moving folders while
    /// a harvest runs): the file is created beneath the preopen or not at all.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_landing_folder_swapped_for_a_symlink_after_the_check_is_refused() {
        let (d, _cleanup) = dir("swap");
        let (project, outside) = (d.join("project"), d.join("outside"));
        std::fs::create_dir_all(project.join("out")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let out = vec![project.join("out/report.txt").display().to_string()];
        let roots = [project.clone()];
        check_incoming(&out, &roots).unwrap();
        std::fs::rename(project.join("out"), d.join("moved")).unwrap();
        std::os::unix::fs::symlink(&outside, project.join("out")).unwrap();
        let frame = format!("2\nhi{}\n", super::super::hex(&Sha256::digest(b"hi")));
        let e = receive(&mut frame.as_bytes(), &out, &[], &roots).unwrap_err();
        assert!(e.contains("symlink"), "{e}");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing written outside the preopen");
        // A file to send, its folder swapped the same way after the check: not read.
        std::fs::write(outside.join("secret"), b"not the project's").unwrap();
        std::fs::remove_file(project.join("out")).unwrap();
        std::fs::create_dir_all(project.join("out")).unwrap();
        std::fs::write(project.join("out/secret"), b"mine").unwrap();
        let send = vec![project.join("out/secret").display().to_string()];
        confined(Path::new(&send[0]), &roots, "file").unwrap();
        std::fs::rename(project.join("out"), d.join("moved2")).unwrap();
        std::os::unix::fs::symlink(&outside, project.join("out")).unwrap();
        assert!(open_beneath(Path::new(&send[0]), &roots, libc::O_RDONLY, OpenOptions::new().read(true)).is_err());
    }

    #[test]
    fn symlinks_outside_paths_and_non_files_are_refused() {
        let (d, _cleanup) = dir("refused");
        std::fs::write(d.join("real"), b"x").unwrap();
        std::os::unix::fs::symlink(d.join("real"), d.join("link")).unwrap();
        let one = |p: &Path| vec![p.display().to_string()];
        assert!(open_outgoing(&one(&d.join("link")), std::slice::from_ref(&d)).is_err());
        assert!(open_outgoing(&one(&d), std::slice::from_ref(&d)).is_err());
        assert!(open_outgoing(&one(&d.join("real")), &[d.join("elsewhere")]).is_err());
        assert!(check_incoming(&one(&d.join("link/x")), std::slice::from_ref(&d)).is_err());
        assert!(check_incoming(&one(&d.join("new")), std::slice::from_ref(&d)).is_ok());
    }
}
