//! A child's two outputs once the host has its answer. Something the child left running
//! (a background process still holding its stdout or stderr) may keep writing after the
//! answer, for as long as it lives, and after a one-shot host has exited. What it writes
//! there is bounded, and it is not killed for it (a CLI's own daemon is not ours to kill):
//! each stream takes up to `after` more bytes (the stderr cap, policy.json), then refuses.
//!
//! - stdout is a file of ours. Let go, it is emptied, its offset put back to the start,
//!   sized to `after` and sealed against growth, where it is a memfd: a write past that
//!   fails with EPERM (at once for a writer in append mode), and no more than `after`
//!   takes memory. (The fallback, a temporary file, is emptied but cannot be sealed.)
//! - stderr is a pipe. What is written into it after the answer is read and dropped, up
//!   to `after`; then the host closes its end, and the writer sees EPIPE, as it does once
//!   a one-shot host has exited. At most `MAX_DRAINS` pipes are drained at once (a
//!   long-lived host); past that a pipe is closed at once.

use std::fs::File;
use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

/// The child's stdout: an unnamed file of our own, not a pipe: a memfd (in memory, as a
/// tmpfs file; an O_TMPFILE in the temporary folder, on this project's ext4, cost ~0.04 ms
/// more a child to make and free), else an unlinked temporary file. A program that exits
/// right after a large write loses what a full pipe had not taken yet — the real
/// `opencode export` (a Bun binary) delivers exactly 64 KiB of a larger session through a
/// pipe, and all of it into a file — so a file is what every child writes to.
pub struct StdoutFile {
    file: File,
    /// What may still be written into it once it is let go.
    after: u64,
}

impl StdoutFile {
    pub fn new(after: usize) -> std::io::Result<StdoutFile> {
        let file = Self::make()?;
        Ok(StdoutFile { file, after: after as u64 })
    }

    fn make() -> std::io::Result<File> {
        use std::os::unix::fs::OpenOptionsExt;
        // In memory and never named, where the system can (Linux: memfd_create), and
        // sealable. Not executable, asked for where the kernel knows the flag (6.3): with
        // vm.memfd_noexec=2 a memfd that could be is refused.
        #[cfg(target_os = "linux")]
        for flags in [libc::MFD_NOEXEC_SEAL, 0] {
            // SAFETY: memfd_create takes a NUL-terminated name; the fd it returns is new
            // and owned by nothing else, so the File may own it.
            let fd = unsafe { libc::memfd_create(c"boxd-host-stdout".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | flags) };
            if fd >= 0 {
                return Ok(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) });
            }
        }
        let dir = std::env::temp_dir();
        // One call and never a name, where the file system can (Linux, O_TMPFILE).
        #[cfg(target_os = "linux")]
        if let Ok(f) = std::fs::OpenOptions::new().read(true).write(true).mode(0o600).custom_flags(libc::O_TMPFILE).open(&dir) {
            return Ok(f);
        }
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        loop {
            let n = N.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!(".boxd-host-{}-{n}.out", std::process::id()));
            match std::fs::OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path) {
                Ok(f) => {
                    let _ = std::fs::remove_file(&path);
                    return Ok(f);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The file the child is started with.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The bytes written so far.
    pub fn len(&self) -> u64 {
        self.file.metadata().map(|m| m.len()).unwrap_or(0)
    }

    /// A reader from its first byte that leaves the file's offset alone: the child's
    /// stdout is this same open file, so the offset is shared with whatever the child
    /// left running, and a seek would have its next write land over the answer.
    pub fn reader(&self) -> impl Read + '_ {
        struct At<'a>(&'a File, u64);
        impl Read for At<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = std::os::unix::fs::FileExt::read_at(self.0, buf, self.1)?;
                self.1 += n as u64;
                Ok(n)
            }
        }
        At(&self.file, 0)
    }
}

/// Let go on every way out of a run (answered, failed, killed), once its answer is read.
impl Drop for StdoutFile {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            // Emptied, its shared offset put back to the start, and sized to the bound (a
            // hole) before the seal: whatever offset what is left running sets (a seek far
            // ahead before the host lets go, or its own open of the file at 0), it can fill
            // no more than the bound. Sized again after the seal in case something wrote
            // past it in between (shrinking stays allowed).
            let _ = std::io::Seek::seek(&mut &self.file, std::io::SeekFrom::Start(0));
            let _ = self.file.set_len(0);
            let _ = self.file.set_len(self.after);
            // SAFETY: fcntl on a descriptor we own; no memory is involved. It fails
            // (EINVAL) on a file that is not a sealable memfd.
            if unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_GROW | libc::F_SEAL_SEAL) } == 0 {
                let _ = self.file.set_len(self.after);
                return;
            }
        }
        let _ = self.file.set_len(0);
    }
}

/// How many pipes are drained after their answer at once, at most.
const MAX_DRAINS: usize = 64;
static DRAINS: AtomicUsize = AtomicUsize::new(0);

/// Read and drop what a process the child left running still writes on its stderr, up
/// to `after` bytes, then close the pipe.
pub fn drain_left_stderr(stderr: &File, after: usize) {
    let Ok(rest) = stderr.try_clone() else { return };
    if DRAINS.fetch_add(1, Ordering::Relaxed) >= MAX_DRAINS {
        DRAINS.fetch_sub(1, Ordering::Relaxed);
        return;
    }
    // A thread the system will not give us closes the pipe at once (`rest` is dropped).
    let drain = thread::Builder::new().name("stderr-drain".into()).spawn(move || {
        let mut chunk = vec![0u8; 16 * 1024];
        let mut left = after;
        let mut r = &rest;
        while left > 0 {
            let want = left.min(chunk.len());
            match r.read(&mut chunk[..want]) {
                Ok(0) => break,
                Ok(n) => left -= n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        drop(rest);
        DRAINS.fetch_sub(1, Ordering::Relaxed);
    });
    if drain.is_err() {
        DRAINS.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{each_start, SMALL};
    use super::super::Bounds;
    use std::path::Path;
    use std::time::{Duration, Instant};

    /// What a background process of the script wrote into `file`, once it did.
    fn line_in(file: &Path) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(s) = std::fs::read_to_string(file) {
                if s.ends_with('\n') {
                    return s.trim().to_string();
                }
            }
            assert!(Instant::now() < deadline, "nothing in {}", file.display());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The child answers, leaves a process that holds both outputs and runs `what` once
    /// the test has the answer (the file `go`), recording its exit status, runs `then`,
    /// and exits. The answer is the child's; the statuses are returned, by way of starting.
    fn left_running(name: &str, bounds: Bounds, what: &str, then: &str) -> Vec<(String, String)> {
        let dir = std::env::temp_dir().join(format!("spawn-left-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ended = Vec::new();
        each_start(|how, sh| {
            let (go, status) = (dir.join(format!("{how}.go")), dir.join(format!("{how}.status")));
            let script = format!(
                "echo '{{\"ok\":true}}'; (i=0; while [ ! -e {go} ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done; {what}; echo $? > {status}) & {then} exit 0",
                go = go.display(),
                status = status.display()
            );
            let (r, _) = sh(&script, Duration::from_secs(30), bounds);
            let o = r.unwrap();
            assert_eq!((o.exit_code, o.stdout.as_slice()), (Some(0), &b"{\"ok\":true}\n"[..]), "{how}");
            std::fs::write(&go, "").unwrap();
            ended.push((how.to_string(), line_in(&status)));
        });
        let _ = std::fs::remove_dir_all(&dir);
        ended
    }

    /// After the answer, what the child left running may write up to the stderr cap more
    /// into its stdout, and no further: 4 MiB would otherwise have gone into memory that
    /// nothing frees while it lives.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_process_left_running_writes_its_stdout_up_to_a_bound_after_the_answer() {
        let within = SMALL.stderr_cap / 2;
        for (how, status) in left_running("stdout-within", SMALL, &format!("head -c {within} /dev/zero"), "") {
            assert_eq!(status, "0", "{how}: {within} bytes on stdout after the answer were refused");
        }
        for (how, status) in left_running("stdout-past", SMALL, "head -c 4194304 /dev/zero 2>/dev/null", "") {
            assert_ne!(status, "0", "{how}: 4 MiB went into the stdout file after the answer");
        }
    }

    /// Its stderr is read and dropped up to the cap after the answer, then closed: four
    /// times the cap does not get through; half of it (past a pipe's 64 KiB, so only a
    /// drain lets it through) does.
    #[test]
    fn a_process_left_running_writes_its_stderr_up_to_a_bound_after_the_answer() {
        let bounds = Bounds { stderr_cap: 512 << 10, ..SMALL };
        let within = bounds.stderr_cap / 2;
        for (how, status) in left_running("stderr-within", bounds, &format!("head -c {within} /dev/zero >&2"), "") {
            assert_eq!(status, "0", "{how}: {within} bytes of stderr after the answer were refused");
        }
        let past = bounds.stderr_cap * 4;
        for (how, status) in left_running("stderr-past", bounds, &format!("head -c {past} /dev/zero >&2"), "") {
            assert_ne!(status, "0", "{how}: {past} bytes went through stderr after the answer");
        }
    }

    /// A process left running that moved the shared offset far ahead before the host let go
    /// (here 1 GiB), then writes through its own open of the file from its start, still
    /// gets no more than the bound.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_process_left_running_that_moved_the_offset_gets_no_more_than_the_bound() {
        let seek = "dd if=/dev/null bs=1M seek=1024 count=0 conv=notrunc 2>/dev/null;";
        for (how, status) in left_running("seeked", SMALL, "head -c 4194304 /dev/zero 1<>/proc/self/fd/1 2>/dev/null", seek) {
            assert_ne!(status, "0", "{how}: 4 MiB went into the stdout file after the answer");
        }
    }

    /// Pipes drained after their answer are bounded in number: past `MAX_DRAINS` a pipe is
    /// closed at once (its writer sees EPIPE) rather than given a thread of its own. (Other
    /// tests may hold drains meanwhile, so the counts are bounds.)
    #[test]
    fn at_most_so_many_stderr_pipes_are_drained_at_once() {
        use std::io::Write;
        let mut writers = Vec::new();
        for _ in 0..super::MAX_DRAINS + 6 {
            let (r, w) = super::super::child::pipe().unwrap();
            super::drain_left_stderr(&r, 1 << 20);
            writers.push(w);
        }
        let mut drained = 0;
        for w in &mut writers {
            match w.write_all(b"a line of log\n") {
                Ok(()) => drained += 1,
                Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe),
            }
        }
        assert!(drained >= 1 && drained <= super::MAX_DRAINS, "{drained} of {} pipes drained", writers.len());
    }

    /// A process the child left writing on its stdout does not write over the answer while
    /// the host reads it: the host reads without moving the offset they share.
    #[test]
    fn a_process_left_writing_stdout_does_not_write_over_the_answer() {
        let dir = std::env::temp_dir().join(format!("spawn-over-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        each_start(|how, sh| {
            for round in 0..200 {
                // The writer is killed once the answer is in (and stops by itself after a
                // while, should the test not get there): a spinning leftover would load
                // every test after it.
                let pid = dir.join(format!("{how}-{round}"));
                let script = format!("echo '{{\"ok\":true}}'; (i=0; while [ $i -lt 3000000 ]; do printf x; i=$((i+1)); done) 2>/dev/null & echo $! > {}; exit 0", pid.display());
                let (r, _) = sh(&script, Duration::from_secs(30), SMALL);
                let writer: i32 = std::fs::read_to_string(&pid).unwrap().trim().parse().unwrap();
                // SAFETY: kill(2) on the writer the script started; it is ours until init
                // reaps it, and a pid is not reused before that.
                unsafe { libc::kill(writer, libc::SIGKILL) };
                let o = r.unwrap();
                assert!(o.stdout.starts_with(b"{\"ok\":true}\n"), "{how}, round {round}: {:?}", String::from_utf8_lossy(&o.stdout[..o.stdout.len().min(40)]));
            }
        });
        let _ = std::fs::remove_dir_all(&dir);
    }
}
