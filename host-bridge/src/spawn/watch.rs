//! The run loop: one or more children started, then watched together from the calling
//! thread, one `poll` over every child's stderr and exit (a batch of `spawn.run-all` starts
//! no thread: a fresh process's first thread cost ~0.06 ms to start and more to end).
//!
//! Each child goes its own way through the same steps (module spawn says which end a run).
//! One that answered is finished at once (its stdout file read, its files received, its
//! stdin writer heard, at most STDIN_SETTLE), and its stdout file let go: what it left
//! running is bounded from then on (outputs.rs). Left to the end of the batch, such a
//! process could fill that file unwatched for as long as another child ran. The others
//! wait in the kernel meanwhile; their caps and deadlines are looked at right after.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::process::ExitStatus;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::{child, frames, human, kill_group, outputs, Output, Spawn, SpawnFailure, Streams};
use crate::runtime::frames::Streamed;

/// How a child is started (child.rs): the clone, or std's `Command` (tests run both).
pub(super) type StartChild = fn(&child::Start<'_>) -> std::io::Result<child::Child>;

/// How often a stdout file's size is checked against its cap while its child runs.
const CAP_WATCH: Duration = Duration::from_millis(50);

/// Once the child exited, stderr is read until a grace passes with nothing new, and for
/// this many graces at the most in all: a daemon it left logging a line every 100 ms
/// held every call until its deadline (each boxd call of a tool, minutes in all).
pub(super) const AFTER_EXIT_READS: u32 = 4;

/// How long the stdin writer may take to report once the child exited.
const STDIN_SETTLE: Duration = Duration::from_secs(1);

/// Run every spawn, side by side; each one's result with when it ended.
pub(super) fn run_all(spawns: Vec<(Spawn<'_>, Streams<'_>)>, start_child: StartChild) -> Vec<(Result<Output, SpawnFailure>, Instant)> {
    let mut ended: Vec<Option<(Result<Output, SpawnFailure>, Instant)>> = Vec::with_capacity(spawns.len());
    let mut running: Vec<Option<Run<'_>>> = Vec::with_capacity(spawns.len());
    for (s, streams) in spawns {
        match Run::start(s, streams, start_child) {
            Ok(run) => {
                running.push(Some(run));
                ended.push(None);
            }
            Err(why) => {
                running.push(None);
                ended.push(Some((Err(why), Instant::now())));
            }
        }
    }
    let mut fds = Vec::with_capacity(2 * running.len());
    let mut watched = Vec::with_capacity(running.len());
    loop {
        fds.clear();
        watched.clear();
        let mut until: Option<Instant> = None;
        for (i, slot) in running.iter_mut().enumerate() {
            let Some(run) = slot.as_mut() else { continue };
            match run.next() {
                Next::Wait(u) => {
                    until = Some(until.map_or(u, |t| t.min(u)));
                    fds.extend(run.fds().map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }));
                    watched.push(i);
                }
                Next::Over(how) => {
                    let run = slot.take().expect("a run is watched until it is over");
                    ended[i] = Some((how.and_then(|()| run.finish()), Instant::now()));
                }
            }
        }
        let Some(until) = until else { break };
        let waited = wait_ready(&mut fds, until.saturating_duration_since(Instant::now()).min(CAP_WATCH));
        for (k, &i) in watched.iter().enumerate() {
            let run = running[i].as_mut().expect("watched runs are running");
            let seen = |p: &libc::pollfd| p.fd >= 0 && p.revents != 0;
            let step = match &waited {
                Ok(()) => run.ready(seen(&fds[2 * k]), seen(&fds[2 * k + 1])),
                Err(e) => Err(run.end(SpawnFailure::Failed(format!("{}: waiting for it failed: {e}", run.s.name)))),
            };
            if let Err(why) = step {
                running[i] = None;
                ended[i] = Some((Err(why), Instant::now()));
            }
        }
    }
    ended.into_iter().map(|e| e.expect("every run ended")).collect()
}

/// Wait until one of `fds` has something (or its end) or `wait` passes. Readiness is
/// level-triggered: what is not handled now shows again. Interrupted, nothing is ready.
fn wait_ready(fds: &mut [libc::pollfd], wait: Duration) -> std::io::Result<()> {
    // Rounded up: a wait cut to 0 ms would spin until the deadline.
    let ms = wait.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    // SAFETY: poll over a slice of pollfds (a negative fd is skipped).
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
        fds.iter_mut().for_each(|p| p.revents = 0);
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
}

/// What a run does next.
enum Next {
    /// Wait on its fds, until this at the latest.
    Wait(Instant),
    /// Over: answered (to be finished), or failed (its group killed, its child reaped).
    Over(Result<(), SpawnFailure>),
}

/// One child from its start to its answer.
struct Run<'a> {
    s: Spawn<'a>,
    streams: Streams<'a>,
    out_file: outputs::StdoutFile,
    child: child::Child,
    has_stdin: bool,
    /// The files sent, when every byte of stdin was (the writer's word, after the exit).
    sent: mpsc::Receiver<Result<Vec<Streamed>, String>>,
    stdout_cap: u64,
    deadline: Instant,
    stderr: Vec<u8>,
    status: Option<ExitStatus>,
    grace_until: Option<Instant>,
    exited_at: Option<Instant>,
    stderr_open: bool,
}

impl<'a> Run<'a> {
    fn start(s: Spawn<'a>, mut streams: Streams<'a>, start_child: StartChild) -> Result<Run<'a>, SpawnFailure> {
        let failed = |e: std::io::Error| SpawnFailure::Failed(format!("{}: {e}", s.name));
        // A host stopping (crate::interrupt) starts nothing more.
        if let Some(sig) = crate::interrupt::received() {
            return Err(SpawnFailure::Interrupted(sig));
        }
        // A missing working folder would otherwise read as a missing program (both are
        // ENOENT from the exec's side).
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
        let (sent_tx, sent) = mpsc::channel();
        if let Some(mut pipe) = child.stdin.take() {
            let bytes = s.stdin.unwrap_or_default().to_vec();
            let files = std::mem::take(&mut streams.stdin_files);
            // A child that exits without reading gives EPIPE; that is not our failure (it
            // answered without the files, and none is reported sent). A writer blocked by a
            // child that never reads ends when the group is killed. A file that changed
            // while it was sent cuts the stream short before its digest, which the child
            // sees and refuses; the spawn then fails saying which file changed.
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
        Ok(Run {
            deadline: started + s.timeout,
            s,
            streams,
            out_file,
            child,
            has_stdin,
            sent,
            stdout_cap,
            stderr: Vec::new(),
            status: None,
            grace_until: None,
            exited_at: None,
            stderr_open: true,
        })
    }

    /// The fds to wait on (-1: none): stderr while open, the exit until it came.
    fn fds(&self) -> [i32; 2] {
        [if self.stderr_open { self.child.stderr.as_raw_fd() } else { -1 }, if self.status.is_none() { self.child.exit_fd() } else { -1 }]
    }

    fn over_cap(&self, which: Stream) -> SpawnFailure {
        let (stream, cap) = match which {
            Stream::Stdout => ("stdout", self.s.bounds.stdout_cap),
            Stream::Stderr => ("stderr", self.s.bounds.stderr_cap),
        };
        SpawnFailure::Failed(format!(
            "{} printed more than {} on {stream}; the cap is {} (host-bridge/policy.json outputCaps.{stream}), so the host killed it",
            self.s.name,
            human(cap),
            human(cap)
        ))
    }

    /// Every early end kills the group first, then reaps the leader (once: it may have
    /// exited already, unreaped): until then its pid cannot name anyone else's process.
    fn end(&mut self, why: SpawnFailure) -> SpawnFailure {
        kill_group(self.child.pid);
        let _ = self.child.reap();
        why
    }

    fn next(&mut self) -> Next {
        // Checked first: a child killed by kill_running has exited by now, and a child
        // started just as the signal came was not listed yet when the groups were killed.
        if let Some(sig) = crate::interrupt::received() {
            return Next::Over(Err(self.end(SpawnFailure::Interrupted(sig))));
        }
        if self.status.is_some() && !self.stderr_open {
            return Next::Over(Ok(()));
        }
        if self.out_file.len() > self.stdout_cap {
            return Next::Over(Err(self.end(self.over_cap(Stream::Stdout))));
        }
        // The deadline holds after the exit too (as does AFTER_EXIT_READS): stderr that
        // keeps trickling from a process the child left behind never holds the answer.
        let until = self.grace_until.map_or(self.deadline, |g| g.min(self.deadline));
        if Instant::now() < until {
            return Next::Wait(until);
        }
        if self.status.is_none() {
            return Next::Over(Err(self.end(SpawnFailure::TimedOut)));
        }
        // The child exited and the grace is over: something it started still holds stderr.
        // Answer with what was written, and leave that process alone: a CLI's own daemon
        // is not ours to kill. A thread drains what it still writes, up to a bound
        // (outputs.rs), so it does not block on a full pipe at once.
        outputs::drain_left_stderr(&self.child.stderr, self.s.bounds.stderr_cap);
        Next::Over(Ok(()))
    }

    /// Handle what the wait saw; a failure has killed the group and reaped the child.
    fn ready(&mut self, stderr: bool, exited: bool) -> Result<(), SpawnFailure> {
        if stderr {
            let mut chunk = [0u8; 16 * 1024];
            match self.child.stderr.read(&mut chunk) {
                Ok(0) => self.stderr_open = false,
                Ok(n) if self.stderr.len() + n > self.s.bounds.stderr_cap => return Err(self.end(self.over_cap(Stream::Stderr))),
                Ok(n) => {
                    self.stderr.extend_from_slice(&chunk[..n]);
                    // Still arriving (a loaded machine may schedule us late): the grace is
                    // for silence, up to AFTER_EXIT_READS graces after the exit.
                    if let Some(exited) = self.exited_at {
                        let after = self.s.bounds.after_exit;
                        self.grace_until = Some((Instant::now() + after).min(exited + after * AFTER_EXIT_READS));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => self.stderr_open = false,
            }
        }
        if exited {
            match self.child.exit_status() {
                Ok(st) => {
                    self.status = Some(st);
                    self.exited_at = Some(Instant::now());
                    self.grace_until = Some(Instant::now() + self.s.bounds.after_exit);
                }
                Err(e) => return Err(self.end(SpawnFailure::Failed(format!("{}: waiting for it failed: {e}", self.s.name)))),
            }
        }
        Ok(())
    }

    /// The answer of a child that exited: its stdout (and the files framed on it), its
    /// stderr, the files sent.
    fn finish(mut self) -> Result<Output, SpawnFailure> {
        let name = self.s.name;
        let status = self.status.expect("a run is over with a status");
        // The writer has finished once the child read all of stdin; a child that stopped
        // reading (or a process it left holding the pipe) leaves it short, and nothing sent.
        let mut files = match self.has_stdin.then(|| self.sent.recv_timeout(STDIN_SETTLE)) {
            Some(Ok(Ok(files))) => files,
            Some(Ok(Err(changed))) => {
                // The child saw the frame cut short; its answer is not the call's.
                let _ = self.child.reap();
                return Err(SpawnFailure::Failed(format!("{name}: {changed}")));
            }
            _ => Vec::new(),
        };
        // Everything the child wrote is in the file; read at most the cap (a process it
        // left running may still be writing). Past a cap only now, that process is killed
        // with the group, as for any child past a cap.
        let failed = |e: std::io::Error| SpawnFailure::Failed(format!("{name}: {e}"));
        let mut capped = false;
        let stdout = (|| {
            let f = self.out_file.reader();
            let cap = self.s.bounds.stdout_cap;
            if self.streams.stdout_files.is_empty() {
                let mut stdout = Vec::new();
                f.take(cap as u64 + 1).read_to_end(&mut stdout).map_err(failed)?;
                capped = stdout.len() > cap;
                return if capped { Err(self.over_cap(Stream::Stdout)) } else { Ok(stdout) };
            }
            let mut r = std::io::BufReader::with_capacity(64 * 1024, f.take(self.stdout_cap + 1));
            let line = frames::first_line(&mut r, cap).map_err(|_| {
                capped = true;
                self.over_cap(Stream::Stdout)
            })?;
            match frames::receive(&mut r, self.streams.stdout_files, self.streams.stdout_modes_from, self.streams.roots) {
                Ok(received) => files.extend(received),
                // A child that failed says so in its answer; its files did not come.
                Err(_) if status.code() != Some(0) => {}
                Err(why) => return Err(SpawnFailure::Failed(format!("{name}: the files framed on its stdout: {why}"))),
            }
            Ok(line)
        })();
        if capped {
            kill_group(self.child.pid);
        }
        // Reaped only now: until here its pid and group were certainly still ours.
        let _ = self.child.reap();
        Ok(Output { exit_code: status.code(), stdout: stdout?, stderr: std::mem::take(&mut self.stderr), files })
    }
}
