//! A child's two outputs once the host has its answer. Something the child left running
//! (a background process still holding its stdout or stderr) may keep writing after the
//! answer, for as long as it lives, and after a one-shot host has exited. Neither output
//! may grow without bound on its account, and that process is not killed for it (a CLI's
//! own daemon is not ours to kill):
//!
//! - stdout is a file of ours. Let go, it is sealed against growth and emptied, where it
//!   is a memfd: what is written into it after the answer fails (EPERM) and takes no
//!   memory. (The fallback, a temporary file on disk, is emptied but cannot be sealed.)
//! - stderr is a pipe. What is written into it after the answer is read and dropped, up
//!   to the stderr cap; past that the host closes its end, and the writer sees EPIPE, as
//!   it would once a one-shot host exited.

use std::fs::File;
use std::io::Read;
use std::thread;

/// The child's stdout: an unnamed file of our own, not a pipe: a memfd (in memory, as a
/// tmpfs file; an O_TMPFILE in the temporary folder, on this project's ext4, cost ~0.04 ms
/// more a child to make and free), else an unlinked temporary file. A program that exits
/// right after a large write loses what a full pipe had not taken yet — the real
/// `opencode export` (a Bun binary) delivers exactly 64 KiB of a larger session through a
/// pipe, and all of it into a file — so a file is what every child writes to.
pub struct StdoutFile(pub File);

impl StdoutFile {
    pub fn new() -> std::io::Result<StdoutFile> {
        use std::os::unix::fs::OpenOptionsExt;
        // In memory and never named, where the system can (Linux: memfd_create), and
        // sealable, so it can be closed to growth once the answer is read.
        #[cfg(target_os = "linux")]
        {
            // SAFETY: memfd_create takes a NUL-terminated name; the fd it returns is new
            // and owned by nothing else, so the File may own it.
            let fd = unsafe { libc::memfd_create(c"boxd-host-stdout".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
            if fd >= 0 {
                return Ok(StdoutFile(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) }));
            }
        }
        let dir = std::env::temp_dir();
        // One call and never a name, where the file system can (Linux, O_TMPFILE).
        #[cfg(target_os = "linux")]
        if let Ok(f) = std::fs::OpenOptions::new().read(true).write(true).mode(0o600).custom_flags(libc::O_TMPFILE).open(&dir) {
            return Ok(StdoutFile(f));
        }
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        loop {
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = dir.join(format!(".boxd-host-{}-{n}.out", std::process::id()));
            match std::fs::OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path) {
                Ok(f) => {
                    let _ = std::fs::remove_file(&path);
                    return Ok(StdoutFile(f));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Let go on every way out of a run (answered, failed, killed): sealed first, so nothing
/// written between the two calls outlives the emptying.
impl Drop for StdoutFile {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: fcntl on a descriptor we own; no memory is involved. It fails
            // harmlessly (EINVAL) on a file that is not a sealable memfd.
            unsafe { libc::fcntl(self.0.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_GROW | libc::F_SEAL_SEAL) };
        }
        let _ = self.0.set_len(0);
    }
}

/// Read and drop what a process the child left running still writes on its stderr, up
/// to `cap` bytes, then close the pipe.
pub fn drain_left_stderr(stderr: &File, cap: usize) {
    let Ok(rest) = stderr.try_clone() else { return };
    thread::spawn(move || {
        let mut chunk = vec![0u8; 16 * 1024];
        let mut taken = 0usize;
        let mut r = &rest;
        while taken <= cap {
            match r.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => taken += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::super::tests::{each_start, SMALL};
    use std::path::Path;
    use std::time::{Duration, Instant};

    /// The exit status a background process of the script wrote into `file`, once it did.
    fn status_in(file: &Path) -> String {
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

    /// The child answers and exits, leaving a process that holds both outputs and writes
    /// `what` into one of them once the test has the answer (the file `go`), recording
    /// how its write ended. The answer is the child's; the write's status is returned.
    fn left_writing(name: &str, what: &str) -> Vec<(String, String)> {
        let dir = std::env::temp_dir().join(format!("spawn-left-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ended = Vec::new();
        each_start(|how, sh| {
            let (go, status) = (dir.join(format!("{how}.go")), dir.join(format!("{how}.status")));
            let script = format!(
                "(while [ ! -e {go} ]; do sleep 0.01; done; {what}; echo $? > {status}) & echo '{{\"ok\":true}}'; exit 0",
                go = go.display(),
                status = status.display()
            );
            let (r, _) = sh(&script, Duration::from_secs(30), SMALL);
            let o = r.unwrap();
            assert_eq!((o.exit_code, o.stdout.as_slice()), (Some(0), &b"{\"ok\":true}\n"[..]), "{how}");
            std::fs::write(&go, "").unwrap();
            ended.push((how.to_string(), status_in(&status)));
        });
        let _ = std::fs::remove_dir_all(&dir);
        ended
    }

    /// What the child left running can write no more into its stdout once the answer is
    /// read: 4 MiB would otherwise have gone into memory that nothing frees while it lives.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_process_left_running_cannot_grow_the_stdout_file_after_the_answer() {
        for (how, status) in left_writing("stdout", "head -c 4194304 /dev/zero 2>/dev/null") {
            assert_ne!(status, "0", "{how}: 4 MiB went into the stdout file after the answer");
        }
    }

    /// Its stderr is read and dropped up to the cap after the answer, then closed: four
    /// times the cap does not get through.
    #[test]
    fn a_process_left_running_writing_stderr_past_the_cap_after_the_answer_finds_it_closed() {
        let past = SMALL.stderr_cap * 4;
        for (how, status) in left_writing("stderr", &format!("head -c {past} /dev/zero >&2")) {
            assert_ne!(status, "0", "{how}: {past} bytes went through stderr after the answer");
        }
        // Up to the cap is drained: a daemon's few lines of log neither block nor fail.
        let within = SMALL.stderr_cap / 2;
        for (how, status) in left_writing("stderr-within", &format!("head -c {within} /dev/zero >&2")) {
            assert_eq!(status, "0", "{how}: {within} bytes of stderr after the answer were refused");
        }
    }
}
