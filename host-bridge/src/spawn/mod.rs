//! Running one granted program: argument list (no shell), a clean environment, its own
//! process group, stdin written by a thread (when there is any), stdout into a file and
//! stderr read by the calling thread, up to the caps of host-bridge/policy.json. The
//! calling thread polls the child's stderr and a pidfd for its exit (child.rs): no
//! polling of the child itself, no thread per child. Files can be streamed in (framed
//! onto stdin after its bytes) and out (framed on stdout after the first line,
//! demultiplexed into files once the child exited); see runtime/frames.rs. One place
//! decides how the run ends, from the first of these events:
//!
//! - a stream passes its cap: the whole process group is killed, and the spawn fails
//!   naming the stream and the cap (the component answers e.g. BOXD_FAILED);
//! - the deadline passes: the group is killed, and the spawn times out;
//! - the child exits: stdout went to a file (see `outputs::StdoutFile`), stderr is read to its
//!   end; a background process that keeps stderr open (a daemon the child started) gets
//!   `afterExit.graceMs` of silence (`AFTER_EXIT_READS` graces at the most, however it
//!   trickles), then the answer is what the child printed, and that process is left
//!   alone (what it writes after the answer is bounded: outputs.rs).
//!
//! On Linux each child also gets PR_SET_PDEATHSIG(SIGKILL): if the host itself is killed,
//! the child dies with it rather than running on as an orphan. A host stopped by SIGTERM,
//! SIGINT or SIGHUP (crate::interrupt) kills every running child's group (running.rs),
//! and from then on a run starts nothing and ends any it waits on (`Interrupted`).

mod child;
mod outputs;
mod running;

pub use running::{kill_group, kill_running, kill_self};

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::mpsc;
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
    /// For each stdout file, the laptop file whose mode it takes ("": none).
    pub stdout_modes_from: &'a [String],
    /// The preopened folders the stdout files are created beneath.
    pub roots: &'a [PathBuf],
}

#[derive(Debug, PartialEq, Eq)]
pub enum SpawnFailure {
    NotFound(String),
    TimedOut,
    Failed(String),
    /// The host received this signal (crate::interrupt): the child was killed with its
    /// group, or never started.
    Interrupted(i32),
}

impl SpawnFailure {
    /// The audit's word for how the spawn ended (runtime/trace.rs `outcome`).
    pub fn outcome(&self) -> &'static str {
        match self {
            SpawnFailure::NotFound(_) => "not-found",
            SpawnFailure::TimedOut => "timed-out",
            SpawnFailure::Failed(_) => "failed",
            SpawnFailure::Interrupted(_) => "interrupted",
        }
    }

    /// What the component is told (the WIT `failed` variant) for `Interrupted`.
    pub fn interrupted_message(name: &str, sig: i32) -> String {
        format!("{name}: the host received {} and is stopping, so it killed this child (or did not start it)", crate::interrupt::name(sig))
    }
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

/// How often the stdout file's size is checked against its cap while the child runs.
const CAP_WATCH: Duration = Duration::from_millis(50);

/// Once the child exited, stderr is read until a grace passes with nothing new, and for
/// this many graces at the most in all: a daemon it left logging a line every 100 ms
/// held every call until its deadline (each boxd call of a tool, minutes in all).
const AFTER_EXIT_READS: u32 = 4;

pub fn run(s: Spawn<'_>) -> Result<Output, SpawnFailure> {
    run_streaming(s, Streams::default())
}

/// What one wait in the run loop saw.
struct Ready {
    stderr: bool,
    exited: bool,
}

/// Wait until the child's stderr has something (or its end), the child exits, or `wait`
/// passes. Readiness is level-triggered: what is not handled now shows again.
fn wait_ready(stderr: Option<&File>, exit: Option<i32>, wait: Duration) -> std::io::Result<Ready> {
    let mut fds = [stderr.map_or(-1, |f| f.as_raw_fd()), exit.unwrap_or(-1)]
        .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
    // Rounded up: a wait cut to 0 ms would spin until the deadline.
    let ms = wait.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    // SAFETY: poll over a local array of two pollfds (a negative fd is skipped).
    let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        return if e.kind() == std::io::ErrorKind::Interrupted { Ok(Ready { stderr: false, exited: false }) } else { Err(e) };
    }
    let seen = |p: &libc::pollfd| p.fd >= 0 && p.revents != 0;
    Ok(Ready { stderr: seen(&fds[0]), exited: seen(&fds[1]) })
}

/// As `run`, with files streamed in and out.
pub fn run_streaming(s: Spawn<'_>, streams: Streams<'_>) -> Result<Output, SpawnFailure> {
    run_started_by(s, streams, child::start)
}

/// How a child is started (child.rs): the clone, or std's `Command` (tests run both).
type StartChild = fn(&child::Start<'_>) -> std::io::Result<child::Child>;

fn run_started_by(s: Spawn<'_>, streams: Streams<'_>, start_child: StartChild) -> Result<Output, SpawnFailure> {
    let failed = |e: std::io::Error| SpawnFailure::Failed(format!("{}: {e}", s.name));
    // A host stopping (crate::interrupt) starts nothing more.
    if let Some(sig) = crate::interrupt::received() {
        return Err(SpawnFailure::Interrupted(sig));
    }
    // A missing working folder would otherwise read as a missing program (both are ENOENT
    // from the exec's side).
    if let Some(cwd) = s.cwd.filter(|c| !c.is_dir()) {
        return Err(SpawnFailure::Failed(format!("{}: its working folder {} does not exist", s.name, cwd.display())));
    }
    let out_file = outputs::StdoutFile::new(s.bounds.stderr_cap).map_err(failed)?;
    let has_stdin = s.stdin.is_some() || !streams.stdin_files.is_empty();
    let start = child::Start { binary: s.binary, args: s.args, env: s.env, cwd: s.cwd, stdin_piped: has_stdin, stdout: out_file.file() };
    let mut child = start_child(&start).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => SpawnFailure::NotFound(s.binary.display().to_string()),
        _ => SpawnFailure::Failed(format!("{}: {e}", s.binary.display())),
    })?;
    let started = Instant::now();
    let pgid = child.pid;
    // The files sent, when every byte of stdin was (the writer's word, after the exit).
    let (sent_tx, sent_rx) = mpsc::channel();
    if let Some(mut pipe) = child.stdin.take() {
        let bytes = s.stdin.unwrap_or_default().to_vec();
        let files = streams.stdin_files;
        // A child that exits without reading gives EPIPE; that is not our failure (it
        // answered without the files, and none is reported sent). A writer blocked by a
        // child that never reads ends when the group is killed. A file that changed while
        // it was sent cuts the stream short before its digest, which the child sees and
        // refuses; the spawn then fails saying which file changed.
        thread::spawn(move || {
            let sent = pipe.write_all(&bytes).and_then(|()| frames::send(&mut pipe, files));
            drop(pipe);
            let _ = sent_tx.send(match sent {
                Ok(files) => Ok(files),
                Err(e) if frames::is_changed(&e) => Err(e.to_string()),
                Err(_) => Ok(Vec::new()),
            });
        });
    }
    let stdout_cap = s.bounds.stdout_cap as u64 + frames::stdout_allowance(streams.stdout_files.len());
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
    // Every early end kills the group first, then reaps the leader (once: it may have
    // exited already, unreaped): until then its pid cannot name anyone else's process.
    let end = |child: &mut child::Child, why: SpawnFailure| {
        kill_group(pgid);
        let _ = child.reap();
        Err(why)
    };
    let stdout_len = || out_file.len();
    let deadline = started + s.timeout;
    let mut stderr = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let mut status: Option<ExitStatus> = None;
    let mut grace_until = None;
    let mut exited_at: Option<Instant> = None;
    let mut stderr_open = true;
    loop {
        // Checked first: a child killed by kill_running has exited by now, and a child
        // started just as the signal came was not listed yet when the groups were killed.
        if let Some(sig) = crate::interrupt::received() {
            return end(&mut child, SpawnFailure::Interrupted(sig));
        }
        if status.is_some() && !stderr_open {
            break;
        }
        if stdout_len() > stdout_cap {
            return end(&mut child, over_cap(Stream::Stdout));
        }
        // The deadline holds after the exit too (as does AFTER_EXIT_READS): stderr that
        // keeps trickling from a process the child left behind never holds the answer.
        let until = grace_until.map_or(deadline, |g: Instant| g.min(deadline));
        let now = Instant::now();
        if now >= until {
            if status.is_none() {
                return end(&mut child, SpawnFailure::TimedOut);
            }
            // The child exited and the grace is over: something it started still holds
            // stderr. Answer with what was written, and leave that process alone: a CLI's
            // own daemon is not ours to kill. A thread drains what it still writes, up
            // to a bound (outputs.rs), so it does not block on a full pipe at once.
            outputs::drain_left_stderr(&child.stderr, s.bounds.stderr_cap);
            break;
        }
        let ready = match wait_ready(stderr_open.then_some(&child.stderr), status.is_none().then(|| child.exit_fd()), (until - now).min(CAP_WATCH)) {
            Ok(r) => r,
            Err(e) => return end(&mut child, SpawnFailure::Failed(format!("{}: waiting for it failed: {e}", s.name))),
        };
        if ready.stderr {
            match child.stderr.read(&mut chunk) {
                Ok(0) => stderr_open = false,
                Ok(n) if stderr.len() + n > s.bounds.stderr_cap => return end(&mut child, over_cap(Stream::Stderr)),
                Ok(n) => {
                    stderr.extend_from_slice(&chunk[..n]);
                    // Still arriving (a loaded machine may schedule us late): the grace is
                    // for silence, up to AFTER_EXIT_READS graces after the exit.
                    if let Some(exited) = exited_at {
                        grace_until = Some((Instant::now() + s.bounds.after_exit).min(exited + s.bounds.after_exit * AFTER_EXIT_READS));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => stderr_open = false,
            }
        }
        if ready.exited {
            match child.exit_status() {
                Ok(st) => {
                    status = Some(st);
                    exited_at = Some(Instant::now());
                    grace_until = Some(Instant::now() + s.bounds.after_exit);
                }
                Err(e) => return end(&mut child, SpawnFailure::Failed(format!("{}: waiting for it failed: {e}", s.name))),
            }
        }
    }
    let status = status.expect("the loop ends with a status");
    // The writer has finished once the child read all of stdin; a child that stopped
    // reading (or a process it left holding the pipe) leaves it short, and nothing sent.
    let mut files = match has_stdin.then(|| sent_rx.recv_timeout(STDIN_SETTLE)) {
        Some(Ok(Ok(files))) => files,
        Some(Ok(Err(changed))) => {
            // The child saw the frame cut short; its answer is not the call's.
            let _ = child.reap();
            return Err(SpawnFailure::Failed(format!("{}: {changed}", s.name)));
        }
        _ => Vec::new(),
    };
    // Everything the child wrote is in the file; read at most the cap (a process it left
    // running may still be writing). Past a cap only now, that process is killed with the
    // group, as for any child past a cap.
    let mut capped = false;
    let stdout = (|| {
        let f = out_file.reader();
        if streams.stdout_files.is_empty() {
            let mut stdout = Vec::new();
            f.take(s.bounds.stdout_cap as u64 + 1).read_to_end(&mut stdout).map_err(failed)?;
            capped = stdout.len() > s.bounds.stdout_cap;
            return if capped { Err(over_cap(Stream::Stdout)) } else { Ok(stdout) };
        }
        let mut r = std::io::BufReader::with_capacity(64 * 1024, f.take(stdout_cap + 1));
        let line = frames::first_line(&mut r, s.bounds.stdout_cap).map_err(|_| {
            capped = true;
            over_cap(Stream::Stdout)
        })?;
        match frames::receive(&mut r, streams.stdout_files, streams.stdout_modes_from, streams.roots) {
            Ok(received) => files.extend(received),
            // A child that failed says so in its answer; its files did not come.
            Err(_) if status.code() != Some(0) => {}
            Err(why) => return Err(SpawnFailure::Failed(format!("{}: the files framed on its stdout: {why}", s.name))),
        }
        Ok(line)
    })();
    if capped {
        kill_group(pgid);
    }
    // Reaped only now: until here its pid and group were certainly still ours.
    let _ = child.reap();
    Ok(Output { exit_code: status.code(), stdout: stdout?, stderr, files })
}

/// How long the stdin writer may take to report once the child exited.
const STDIN_SETTLE: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ways a child starts: the clone (Linux) and std's `Command` (the fallback).
    const STARTS: [(&str, StartChild); 2] = [("clone", child::start), ("command", child::start_with_command)];

    fn sh_with(start: StartChild, script: &str, timeout: Duration, bounds: Bounds) -> (Result<Output, SpawnFailure>, Duration) {
        let args = vec!["-c".to_string(), script.to_string()];
        let started = Instant::now();
        let s = Spawn { name: "sh", binary: Path::new("/bin/sh"), args: &args, env: &[], cwd: None, stdin: None, timeout, bounds };
        let r = run_started_by(s, Streams::default(), start);
        (r, started.elapsed())
    }

    pub(super) fn each_start(mut f: impl FnMut(&str, &dyn Fn(&str, Duration, Bounds) -> (Result<Output, SpawnFailure>, Duration))) {
        for (how, start) in STARTS {
            f(how, &|script, timeout, bounds| sh_with(start, script, timeout, bounds));
        }
    }

    pub(super) const SMALL: Bounds = Bounds { stdout_cap: 1 << 20, stderr_cap: 64 << 10, after_exit: Duration::from_millis(150) };

    #[test]
    fn output_and_exit_code() {
        each_start(|how, sh| {
            let (r, _) = sh("echo hi; echo oops >&2; exit 3", Duration::from_secs(10), SMALL);
            let o = r.unwrap();
            assert_eq!((o.exit_code, o.stdout.as_slice(), o.stderr.as_slice()), (Some(3), &b"hi\n"[..], &b"oops\n"[..]), "{how}");
        });
    }

    #[test]
    fn a_flood_past_the_cap_is_killed_and_named() {
        each_start(|how, sh| {
            let (r, took) = sh("yes flood", Duration::from_secs(60), SMALL);
            let Err(SpawnFailure::Failed(m)) = r else { panic!("{how}: expected a failure") };
            assert!(m.contains("more than 1 MiB on stdout") && m.contains("outputCaps.stdout"), "{how}: {m}");
            assert!(took < Duration::from_secs(20), "{how}: {took:?}");
            let (r, _) = sh("yes flood >&2", Duration::from_secs(60), SMALL);
            let Err(SpawnFailure::Failed(m)) = r else { panic!("{how}: expected a failure") };
            assert!(m.contains("more than 64 KiB on stderr"), "{how}: {m}");
        });
    }

    fn alive(pid: i32) -> bool {
        // SAFETY: signal 0 only asks whether the process exists.
        unsafe { libc::kill(pid, 0) == 0 }
    }

    fn pid_in(file: &Path) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(pid) = std::fs::read_to_string(file).ok().and_then(|s| s.trim().parse().ok()) {
                return pid;
            }
            assert!(Instant::now() < deadline, "no pid in {}", file.display());
            thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_background_process_holding_the_pipe_does_not_lose_the_answer_and_is_left_alone() {
        let dir = std::env::temp_dir().join(format!("spawn-daemon-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        each_start(|how, sh| {
            let file = dir.join(how);
            let (r, took) = sh(&format!("sleep 60 & echo $! > {}; echo '{{\"ok\":true}}'; exit 0", file.display()), Duration::from_secs(30), SMALL);
            let o = r.unwrap();
            assert_eq!((o.exit_code, o.stdout.as_slice()), (Some(0), &b"{\"ok\":true}\n"[..]), "{how}");
            assert!(took < Duration::from_secs(10), "{how}: {took:?}");
            let daemon = pid_in(&file);
            assert!(alive(daemon), "{how}: the daemon was killed");
            kill_group(daemon);
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A daemon the child left logging to stderr does not hold the answer until the
    /// deadline (it did: every boxd call of a tool took its whole timeout).
    #[test]
    fn a_daemon_that_keeps_logging_holds_the_answer_a_few_graces_at_the_most() {
        let dir = std::env::temp_dir().join(format!("spawn-trickle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        each_start(|how, sh| {
            let file = dir.join(how);
            let script = format!("(while :; do echo log >&2; sleep 0.05; done) & echo $! > {}; echo answer; exit 0", file.display());
            let (r, took) = sh(&script, Duration::from_secs(30), SMALL);
            let daemon = pid_in(&file);
            let o = r.unwrap();
            assert_eq!((o.exit_code, o.stdout.as_slice()), (Some(0), &b"answer\n"[..]), "{how}");
            // Four graces of 150 ms after the exit, where the deadline is 30 s.
            assert!(took < Duration::from_secs(5), "{how}: {took:?}");
            assert!(alive(daemon), "{how}: the daemon was killed");
            kill_group(daemon);
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A first line past the cap is found only when it is read, after the exit (with a file
    /// to receive, the watch allows more in all): the group is killed as for any cap.
    #[test]
    fn a_cap_found_after_the_exit_kills_the_group() {
        let dir = std::env::temp_dir().join(format!("spawn-late-cap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let roots = [dir.clone()];
        for (how, start) in STARTS {
            let file = dir.join(how);
            let script = format!("sleep 60 </dev/null >/dev/null 2>&1 & echo $! > {}; head -c {} /dev/zero; exit 0", file.display(), SMALL.stdout_cap + 1);
            let args = vec!["-c".to_string(), script];
            let got = [dir.join("got").display().to_string()];
            let s = Spawn { name: "sh", binary: Path::new("/bin/sh"), args: &args, env: &[], cwd: None, stdin: None, timeout: Duration::from_secs(30), bounds: SMALL };
            let r = run_started_by(s, Streams { stdout_files: &got, roots: &roots, ..Default::default() }, start);
            let Err(SpawnFailure::Failed(m)) = r else { panic!("{how}: expected a failure, got {:?}", r.err()) };
            assert!(m.contains("more than 1 MiB on stdout"), "{how}: {m}");
            let left = pid_in(&file);
            let deadline = Instant::now() + Duration::from_secs(5);
            while alive(left) && std::fs::read_to_string(format!("/proc/{left}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
                if Instant::now() >= deadline {
                    kill_group(left);
                    panic!("{how}: the group's sleep {left} outlived the cap");
                }
                thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A file that grows while it is sent: the child reads the frame's first bytes, then
    /// appends to the file; the writer, held back by the full pipe, still has most of the
    /// 4 MiB to read, so the change is always before its last read. The spawn fails saying
    /// which file changed, whatever the child answered.
    #[test]
    fn a_file_changed_while_it_is_sent_fails_the_spawn_saying_so() {
        let dir = std::env::temp_dir().join(format!("spawn-changed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dir = std::fs::canonicalize(dir).unwrap();
        let roots = [dir.clone()];
        for (how, start) in STARTS {
            let file = dir.join(format!("{how}.bin"));
            std::fs::write(&file, vec![b'o'; 4 << 20]).unwrap();
            let paths = [file.display().to_string()];
            let files = frames::open_outgoing(&paths, &roots).unwrap();
            let script = format!("head -c 100 >/dev/null; printf more >> {}; cat >/dev/null; echo '{{}}'", file.display());
            let args = vec!["-c".to_string(), script];
            let s = Spawn { name: "sh", binary: Path::new("/bin/sh"), args: &args, env: &[], cwd: None, stdin: None, timeout: Duration::from_secs(30), bounds: SMALL };
            let r = run_started_by(s, Streams { stdin_files: files, roots: &roots, ..Default::default() }, start);
            let Err(SpawnFailure::Failed(m)) = r else { panic!("{how}: expected a failure, got {:?}", r.err()) };
            assert!(m.contains(&format!("{} {}", paths[0], frames::CHANGED)), "{how}: {m}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_timeout_kills_the_group() {
        let dir = std::env::temp_dir().join(format!("spawn-timeout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        each_start(|how, sh| {
            let file = dir.join(how);
            let (r, took) = sh(&format!("sleep 60 & echo $! > {}; sleep 60", file.display()), Duration::from_millis(300), SMALL);
            assert!(matches!(r, Err(SpawnFailure::TimedOut)), "{how}");
            assert!(took < Duration::from_secs(10), "{how}: {took:?}");
            // The grandchild went with the group (it is init's to reap: give it a moment).
            let grandchild = pid_in(&file);
            let deadline = Instant::now() + Duration::from_secs(5);
            while alive(grandchild) && std::fs::read_to_string(format!("/proc/{grandchild}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
                assert!(Instant::now() < deadline, "{how}: the group's sleep {grandchild} outlived the timeout");
                thread::sleep(Duration::from_millis(10));
            }
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_name_given_twice_reaches_the_child_once_the_last_winning() {
        for (how, start) in STARTS {
            let args = vec!["-c".to_string(), "env | grep '^TWICE='".to_string()];
            let env = [("TWICE".to_string(), "first".to_string()), ("TWICE".to_string(), "last".to_string())];
            let s = Spawn { name: "sh", binary: Path::new("/bin/sh"), args: &args, env: &env, cwd: None, stdin: None, timeout: Duration::from_secs(10), bounds: SMALL };
            let o = run_started_by(s, Streams::default(), start).unwrap();
            assert_eq!(String::from_utf8(o.stdout).unwrap(), "TWICE=last\n", "{how}");
        }
    }

    /// The child starts clean whichever way: its own process group, only the given
    /// environment, no blocked signals, SIGPIPE at its default (Rust ignores it in the
    /// host), the given folder, and no fd the host opened.
    #[test]
    fn the_child_starts_clean() {
        let dir = std::env::temp_dir();
        let script = "echo pg=$(($(cut -d' ' -f5 /proc/self/stat) == $$)); echo env=$(env | grep -v '^PWD=' | sort | tr '\\n' ,); \
                      echo cwd=$(pwd); test -e /proc/self/fd/$HOST_FD && echo leaked";
        // A file the host holds open (close-on-exec, as everything the host opens).
        let held = File::open("/dev/null").unwrap();
        for (how, start) in STARTS {
            let args = vec!["-c".to_string(), script.replace("$HOST_FD", &held.as_raw_fd().to_string())];
            let env = [("ONLY".to_string(), "this".to_string())];
            let s = Spawn { name: "sh", binary: Path::new("/bin/sh"), args: &args, env: &env, cwd: Some(&dir), stdin: None, timeout: Duration::from_secs(10), bounds: SMALL };
            let o = run_started_by(s, Streams::default(), start).unwrap();
            let mut out = String::from_utf8(o.stdout).unwrap();
            // The signal state as the exec left it (a shell may change its own).
            let args = ["-E".to_string(), "^Sig(Blk|Ign)".to_string(), "/proc/self/status".to_string()];
            let s = Spawn { name: "grep", binary: Path::new("/bin/grep"), args: &args, env: &[], cwd: None, stdin: None, timeout: Duration::from_secs(10), bounds: SMALL };
            out += &String::from_utf8(run_started_by(s, Streams::default(), start).unwrap().stdout).unwrap();
            assert!(out.contains("pg=1\n"), "{how}: not its own group leader: {out}");
            assert!(out.contains("env=ONLY=this,SHLVL=1,\n") || out.contains("env=ONLY=this,\n"), "{how}: {out}");
            assert!(out.contains("SigBlk:\t0000000000000000\n"), "{how}: {out}");
            let ign = out.lines().find_map(|l| l.strip_prefix("SigIgn:\t")).unwrap();
            assert_eq!(u64::from_str_radix(ign, 16).unwrap() & (1 << (libc::SIGPIPE - 1)), 0, "{how}: SIGPIPE ignored: {out}");
            assert!(out.contains(&format!("cwd={}\n", dir.display())), "{how}: {out}");
            assert!(!out.contains("leaked"), "{how}: the host's fd {} reached the child", held.as_raw_fd());
        }
    }

    #[test]
    fn a_missing_program_or_folder_is_named() {
        for (how, start) in STARTS {
            let s = Spawn { name: "x", binary: Path::new("/nonexistent/boxd"), args: &[], env: &[], cwd: None, stdin: None, timeout: Duration::from_secs(10), bounds: SMALL };
            assert_eq!(run_started_by(s, Streams::default(), start).err(), Some(SpawnFailure::NotFound("/nonexistent/boxd".into())), "{how}");
            let s = Spawn { name: "x", binary: Path::new("/bin/true"), args: &[], env: &[], cwd: Some(Path::new("/nonexistent")), stdin: None, timeout: Duration::from_secs(10), bounds: SMALL };
            assert_eq!(run_started_by(s, Streams::default(), start).err(), Some(SpawnFailure::Failed("x: its working folder /nonexistent does not exist".into())), "{how}");
        }
    }

    /// PR_SET_PDEATHSIG holds: a child outlives neither the host nor (as Linux defines the
    /// parent) the thread that started it, which the test can end where it cannot kill
    /// itself.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_child_dies_with_its_starter() {
        for (how, start) in STARTS {
            let out = outputs::StdoutFile::new(0).unwrap();
            let mut child = thread::spawn(move || {
                let args = vec!["30".to_string()];
                start(&child::Start { binary: Path::new("/bin/sleep"), args: &args, env: &[], cwd: None, stdin_piped: false, stdout: out.file() }).unwrap()
            })
            .join()
            .unwrap();
            let status = child.reap().unwrap();
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(libc::SIGKILL), "{how}: {status:?}");
        }
    }
}
