//! Running one granted program: argument list (no shell), a clean environment, its own
//! process group, stdin written by a thread, stdout into a file and stderr read by a thread, up to the caps
//! of host-bridge/policy.json, and the child reaped by a thread blocked in wait(2) (no
//! polling). Files can be streamed in (framed onto stdin after its bytes) and out (framed
//! on stdout after the first line, demultiplexed into files once the child exited); see
//! runtime/frames.rs. One place decides how the run ends, from the first of these events:
//!
//! - a stream passes its cap: the whole process group is killed, and the spawn fails
//!   naming the stream and the cap (the component answers e.g. BOXD_FAILED);
//! - the deadline passes: the group is killed, and the spawn times out;
//! - the child exits: stdout went to a file (see `stdout_file`), stderr is read to its
//!   end; a background process that keeps stderr open (a daemon the child started) gets
//!   `afterExit.graceMs` of silence, then the answer is what the child printed, and that
//!   process is left alone.
//!
//! On Linux each child also gets PR_SET_PDEATHSIG(SIGKILL): if the host itself is killed,
//! the child dies with it rather than running on as an orphan.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::runtime::frames::{self, Outgoing, Streamed};

pub struct Output {
    pub exit_code: Option<i32>,
    /// With `Streams::stdout_files`, the first line only.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The stdin files sent, then the stdout files received.
    pub files: Vec<Streamed>,
}

/// The files one run streams, already checked (frames::open_outgoing, check_incoming).
#[derive(Default)]
pub struct Streams<'a> {
    pub stdin_files: Vec<Outgoing>,
    pub stdout_files: &'a [String],
}

#[derive(Debug, PartialEq, Eq)]
pub enum SpawnFailure {
    NotFound(String),
    TimedOut,
    Failed(String),
}

/// The bounds every spawn runs under (host-bridge/policy.json).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub stdout_cap: usize,
    pub stderr_cap: usize,
    /// How long the pipes are still read once the direct child has exited.
    pub after_exit: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        crate::policy::bounds()
    }
}

pub struct Spawn<'a> {
    /// The program's policy name ("boxd"), for messages.
    pub name: &'a str,
    pub binary: &'a Path,
    pub args: &'a [String],
    pub env: &'a [(String, String)],
    pub cwd: Option<&'a Path>,
    pub stdin: Option<&'a [u8]>,
    pub timeout: Duration,
    pub bounds: Bounds,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stream {
    Stdout,
    Stderr,
}

enum Event {
    Exited(std::io::Result<ExitStatus>),
    /// Bytes arrived: after the child's exit, the grace counts from the last of these.
    Data,
    Eof,
    OverCap(Stream),
}

/// "64 MiB", "1 MiB", "1536 bytes".
pub fn human(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes % (1 << 10) == 0 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} bytes")
    }
}

/// Read `r` into `buf` until EOF or until more than `cap` bytes arrive.
fn reader(mut r: impl Read + Send + 'static, buf: Arc<Mutex<Vec<u8>>>, cap: usize, which: Stream, tx: mpsc::Sender<Event>) {
    thread::spawn(move || {
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            match r.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    let mut b = buf.lock().unwrap_or_else(|e| e.into_inner());
                    if b.len() + n > cap {
                        let room = cap - b.len();
                        b.extend_from_slice(&chunk[..room]);
                        drop(b);
                        if tx.send(Event::OverCap(which)).is_ok() {
                            // Stop reading: the child blocks on a full pipe until it is killed.
                            return;
                        }
                        // The call was already answered: what still writes is a process
                        // the child left running. Drain and drop, so it neither blocks
                        // nor dies of SIGPIPE.
                        while !matches!(r.read(&mut chunk), Ok(0) | Err(_)) {}
                        return;
                    }
                    b.extend_from_slice(&chunk[..n]);
                    drop(b);
                    let _ = tx.send(Event::Data);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let _ = tx.send(Event::Eof);
    });
}

/// The child's stdout: an unlinked temporary file of our own, not a pipe. A program that
/// exits right after a large write loses what a full pipe had not taken yet — the real
/// `opencode export` (a Bun binary) delivers exactly 64 KiB of a larger session through a
/// pipe, and all of it into a file — so a file is what every child writes to.
fn stdout_file() -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = std::env::temp_dir();
    loop {
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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

/// How often the stdout file's size is checked against its cap while the child runs.
const CAP_WATCH: Duration = Duration::from_millis(50);

pub fn run(s: Spawn<'_>) -> Result<Output, SpawnFailure> {
    run_streaming(s, Streams::default())
}

/// As `run`, with files streamed in and out.
pub fn run_streaming(s: Spawn<'_>, streams: Streams<'_>) -> Result<Output, SpawnFailure> {
    let failed = |e: std::io::Error| SpawnFailure::Failed(format!("{}: {e}", s.name));
    let out_file = stdout_file().map_err(failed)?;
    let mut cmd = Command::new(s.binary);
    cmd.args(s.args).env_clear().envs(s.env.iter().map(|(k, v)| (k, v))).process_group(0);
    let has_stdin = s.stdin.is_some() || !streams.stdin_files.is_empty();
    cmd.stdin(if has_stdin { Stdio::piped() } else { Stdio::null() });
    cmd.stdout(Stdio::from(out_file.try_clone().map_err(failed)?)).stderr(Stdio::piped());
    if let Some(cwd) = s.cwd {
        cmd.current_dir(cwd);
    }
    die_with_host(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => SpawnFailure::NotFound(s.binary.display().to_string()),
        _ => SpawnFailure::Failed(format!("{}: {e}", s.binary.display())),
    })?;
    drop(cmd); // our copy of the child's stdout end
    let started = Instant::now();
    let pgid = child.id() as i32;
    let (tx, rx) = mpsc::channel();
    // The files sent, when every byte of stdin was (the writer's word, after the exit).
    let (sent_tx, sent_rx) = mpsc::channel();
    if has_stdin {
        let mut pipe = child.stdin.take().expect("stdin is piped");
        let bytes = s.stdin.unwrap_or_default().to_vec();
        let files = streams.stdin_files;
        // A child that exits without reading gives EPIPE; that is not our failure (it
        // answered without the files, and none is reported sent). A writer blocked by a
        // child that never reads ends when the group is killed; a file that changed
        // while it was sent cuts the stream short, which the child sees.
        thread::spawn(move || {
            let sent = pipe.write_all(&bytes).and_then(|()| frames::send(&mut pipe, files));
            drop(pipe);
            let _ = sent_tx.send(sent.unwrap_or_default());
        });
    }
    let stdout_cap = s.bounds.stdout_cap as u64 + frames::stdout_allowance(streams.stdout_files.len());
    let err = Arc::new(Mutex::new(Vec::new()));
    reader(child.stderr.take().expect("stderr is piped"), err.clone(), s.bounds.stderr_cap, Stream::Stderr, tx.clone());
    // The reaper blocks in wait(2); the child's pid stays ours (unreaped) until it returns.
    let reaper = {
        let tx = tx.clone();
        thread::spawn(move || {
            let _ = tx.send(Event::Exited(child.wait()));
        })
    };
    drop(tx);

    let over_cap = |which: Stream| {
        let (stream, cap) = match which {
            Stream::Stdout => ("stdout", s.bounds.stdout_cap),
            Stream::Stderr => ("stderr", s.bounds.stderr_cap),
        };
        SpawnFailure::Failed(format!(
            "{} printed more than {} on {stream}; the cap is {} (host-bridge/policy.json outputCaps.{stream}), so the host killed it",
            s.name,
            human(cap),
            human(cap)
        ))
    };
    let stdout_len = || out_file.metadata().map(|m| m.len()).unwrap_or(0);
    let deadline = started + s.timeout;
    let mut status: Option<ExitStatus> = None;
    let mut grace_until = None;
    let mut stderr_done = false;
    loop {
        if status.is_some() && stderr_done {
            break;
        }
        if stdout_len() > stdout_cap {
            kill_group(pgid);
            let _ = reaper.join();
            return Err(over_cap(Stream::Stdout));
        }
        // The deadline holds after the exit too: stderr that keeps trickling from a process
        // the child left behind never holds the answer past it.
        let until = grace_until.map_or(deadline, |g: Instant| g.min(deadline));
        let wait = until.saturating_duration_since(Instant::now()).min(CAP_WATCH);
        match rx.recv_timeout(wait) {
            Ok(Event::Exited(Ok(st))) => {
                status = Some(st);
                grace_until = Some(Instant::now() + s.bounds.after_exit);
            }
            Ok(Event::Exited(Err(e))) => {
                kill_group(pgid);
                return Err(SpawnFailure::Failed(format!("{}: waiting for it failed: {e}", s.name)));
            }
            Ok(Event::Eof) => stderr_done = true,
            // Still arriving (a loaded machine may schedule the reader late): the grace
            // is for silence, not a deadline on what the child already wrote.
            Ok(Event::Data) => {
                if grace_until.is_some() {
                    grace_until = Some(Instant::now() + s.bounds.after_exit);
                }
            }
            Ok(Event::OverCap(which)) => {
                kill_group(pgid);
                let _ = reaper.join();
                return Err(over_cap(which));
            }
            Err(RecvTimeoutError::Timeout) if Instant::now() < until => {}
            Err(RecvTimeoutError::Timeout) if status.is_none() => {
                kill_group(pgid);
                let _ = reaper.join();
                return Err(SpawnFailure::TimedOut);
            }
            // The child exited and the grace is over: something it started still holds
            // stderr. Answer with what was written, and leave that process alone: a CLI's
            // own daemon is not ours to kill. The reader drains it in the background.
            Err(RecvTimeoutError::Timeout) => break,
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    let _ = reaper.join();
    let status = status.expect("the loop ends with a status");
    // The writer has finished once the child read all of stdin; a child that stopped
    // reading (or a process it left holding the pipe) leaves it short, and nothing sent.
    let mut files = if has_stdin { sent_rx.recv_timeout(STDIN_SETTLE).unwrap_or_default() } else { Vec::new() };
    // Everything the child wrote is in the file; read at most the cap (a process it left
    // running may still be writing).
    let mut f = &out_file;
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0)).map_err(failed)?;
    let stdout = if streams.stdout_files.is_empty() {
        let mut stdout = Vec::new();
        f.take(s.bounds.stdout_cap as u64 + 1).read_to_end(&mut stdout).map_err(failed)?;
        if stdout.len() > s.bounds.stdout_cap {
            return Err(over_cap(Stream::Stdout));
        }
        stdout
    } else {
        let mut r = std::io::BufReader::with_capacity(64 * 1024, f.take(stdout_cap + 1));
        let line = frames::first_line(&mut r, s.bounds.stdout_cap).map_err(|_| over_cap(Stream::Stdout))?;
        match frames::receive(&mut r, streams.stdout_files) {
            Ok(received) => files.extend(received),
            // A child that failed says so in its answer; its files did not come.
            Err(_) if status.code() != Some(0) => {}
            Err(why) => return Err(SpawnFailure::Failed(format!("{}: the files framed on its stdout: {why}", s.name))),
        }
        line
    };
    let stderr = std::mem::take(&mut *err.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(Output { exit_code: status.code(), stdout, stderr, files })
}

/// How long the stdin writer may take to report once the child exited.
const STDIN_SETTLE: Duration = Duration::from_secs(1);

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
    #[cfg(target_os = "linux")]
    fn prctl(option: i32, ...) -> i32;
    #[cfg(target_os = "linux")]
    fn getppid() -> i32;
    #[cfg(target_os = "linux")]
    fn getpid() -> i32;
}

const SIGKILL: i32 = 9;

/// SIGKILL the child's process group (the child and everything it started that did not
/// leave the group).
pub fn kill_group(pgid: i32) {
    // SAFETY: kill(2) on a process group we created and on its leader, our child (which
    // may have left the group with setsid); no memory is involved.
    unsafe {
        kill(-pgid, SIGKILL);
        kill(pgid, SIGKILL);
    }
}

/// Kill this host at once, as `kill -9` would (the test-only kill points).
pub fn kill_self() -> ! {
    // SAFETY: kill(2) on our own pid.
    #[cfg(target_os = "linux")]
    unsafe {
        kill(getpid(), SIGKILL);
    }
    std::process::abort()
}

/// The child gets SIGKILL when the host dies (Linux: PR_SET_PDEATHSIG). macOS has no
/// equivalent; there an orphan runs on until it ends by itself.
fn die_with_host(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        const PR_SET_PDEATHSIG: i32 = 1;
        let parent = std::process::id() as i32;
        // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
        // functions (prctl, getppid); it allocates only on its error paths.
        unsafe {
            cmd.pre_exec(move || {
                if prctl(PR_SET_PDEATHSIG, SIGKILL as std::ffi::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The host died between fork and prctl: do not run as an orphan.
                if getppid() != parent {
                    return Err(std::io::Error::other("the host exited before the child started"));
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, timeout: Duration, bounds: Bounds) -> (Result<Output, SpawnFailure>, Duration) {
        let args = vec!["-c".to_string(), script.to_string()];
        let started = Instant::now();
        let r = run(Spawn { name: "sh", binary: Path::new("/bin/sh"), args: &args, env: &[], cwd: None, stdin: None, timeout, bounds });
        (r, started.elapsed())
    }

    const SMALL: Bounds = Bounds { stdout_cap: 1 << 20, stderr_cap: 64 << 10, after_exit: Duration::from_millis(150) };

    #[test]
    fn output_and_exit_code() {
        let (r, _) = sh("echo hi; echo oops >&2; exit 3", Duration::from_secs(10), SMALL);
        let o = r.unwrap();
        assert_eq!((o.exit_code, o.stdout.as_slice(), o.stderr.as_slice()), (Some(3), &b"hi\n"[..], &b"oops\n"[..]));
    }

    #[test]
    fn a_flood_past_the_cap_is_killed_and_named() {
        let (r, took) = sh("yes flood", Duration::from_secs(60), SMALL);
        let Err(SpawnFailure::Failed(m)) = r else { panic!("expected a failure") };
        assert!(m.contains("more than 1 MiB on stdout") && m.contains("outputCaps.stdout"), "{m}");
        assert!(took < Duration::from_secs(20), "{took:?}");
        let (r, _) = sh("yes flood >&2", Duration::from_secs(60), SMALL);
        let Err(SpawnFailure::Failed(m)) = r else { panic!("expected a failure") };
        assert!(m.contains("more than 64 KiB on stderr"), "{m}");
    }

    #[test]
    fn a_background_process_holding_the_pipe_does_not_lose_the_answer() {
        let (r, took) = sh("sleep 60 & echo '{\"ok\":true}'; exit 0", Duration::from_secs(30), SMALL);
        let o = r.unwrap();
        assert_eq!((o.exit_code, o.stdout.as_slice()), (Some(0), &b"{\"ok\":true}\n"[..]));
        assert!(took < Duration::from_secs(10), "{took:?}");
    }

    #[test]
    fn a_timeout_kills_the_group() {
        let (r, took) = sh("sleep 60 & sleep 60", Duration::from_millis(300), SMALL);
        assert!(matches!(r, Err(SpawnFailure::TimedOut)));
        assert!(took < Duration::from_secs(10), "{took:?}");
    }
}
