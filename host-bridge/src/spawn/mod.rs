//! Running one granted program: argument list (no shell), a clean environment, its own
//! process group, stdin written by a thread (when there is any), stdout into a file and
//! stderr read by the calling thread, up to the caps of host-bridge/policy.json. The
//! calling thread polls the child's stderr and a pidfd for its exit (child.rs), for every
//! child of a batch at once (watch.rs): no polling of the child itself, no thread per
//! child. Files can be streamed in (framed
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
mod watch;

pub use running::{kill_group, kill_running, kill_self};
use watch::StartChild;

use std::path::{Path, PathBuf};
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

pub fn run(s: Spawn<'_>) -> Result<Output, SpawnFailure> {
    run_started_by(s, Streams::default(), child::start)
}

/// Run every spawn side by side, watched from the calling thread (watch.rs); each one's
/// result, with when it ended.
pub fn run_all(spawns: Vec<(Spawn<'_>, Streams<'_>)>) -> Vec<(Result<Output, SpawnFailure>, Instant)> {
    watch::run_all(spawns, child::start)
}

fn run_started_by(s: Spawn<'_>, streams: Streams<'_>, start_child: StartChild) -> Result<Output, SpawnFailure> {
    watch::run_all(vec![(s, streams)], start_child).pop().expect("one result a spawn").0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::fd::AsRawFd;
    use std::thread;

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

    fn sh_spawn(args: &[String], timeout: Duration) -> Spawn<'_> {
        Spawn { name: "sh", binary: Path::new("/bin/sh"), args, env: &[], cwd: None, stdin: None, timeout, bounds: SMALL }
    }

    /// A batch is watched as one: a flood in one child is cut at its cap and another ends at
    /// its own deadline while a third runs on to its answer.
    #[test]
    fn a_batch_watches_each_child_by_its_own_bounds() {
        for (how, start) in STARTS {
            let sh = |s: &str| vec!["-c".to_string(), s.to_string()];
            let (slow, flood, late) = (sh("sleep 1; echo slow"), sh("yes flood"), sh("sleep 30"));
            let started = Instant::now();
            let out = watch::run_all(
                vec![
                    (sh_spawn(&slow, Duration::from_secs(20)), Streams::default()),
                    (sh_spawn(&flood, Duration::from_secs(20)), Streams::default()),
                    (sh_spawn(&late, Duration::from_millis(300)), Streams::default()),
                ],
                start,
            );
            assert_eq!(out[0].0.as_ref().map(|o| o.stdout.as_slice()).ok(), Some(&b"slow\n"[..]), "{how}");
            assert!(matches!(&out[1].0, Err(SpawnFailure::Failed(m)) if m.contains("more than 1 MiB on stdout")), "{how}");
            assert!(matches!(out[2].0, Err(SpawnFailure::TimedOut)), "{how}");
            assert!(out[1].1 < out[0].1 && out[2].1 < out[0].1, "{how}: the flood and the deadline ended before the slow answer");
            assert!(started.elapsed() < Duration::from_secs(10), "{how}: {:?}", started.elapsed());
        }
    }

    /// A child of a batch that answered is let go at once: a process it left writing into its
    /// stdout is cut off (outputs.rs) while another child of the batch still runs, not left
    /// to fill the file until the batch ends.
    #[test]
    fn a_batch_lets_go_of_an_answered_child_while_another_runs() {
        let dir = std::env::temp_dir().join(format!("spawn-batch-left-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (how, start) in STARTS {
            let pid = dir.join(how);
            let sh = |s: String| vec!["-c".to_string(), s];
            let (answers, waits) = (
                // 8 KiB every 10 ms: under the cap until the answer, then cut off within 64 KiB.
                sh(format!("echo answer; (while head -c 8192 /dev/zero; do sleep 0.01; done) 2>/dev/null & echo $! > {}", pid.display())),
                // (A zombie nobody reaped counts as ended.)
                sh(format!("sleep 1.5; s=$(cut -d' ' -f3 /proc/$(cat {})/stat 2>/dev/null); if [ -n \"$s\" ] && [ \"$s\" != Z ]; then echo alive; else echo cut; fi", pid.display())),
            );
            let out = watch::run_all(vec![(sh_spawn(&answers, Duration::from_secs(20)), Streams::default()), (sh_spawn(&waits, Duration::from_secs(20)), Streams::default())], start);
            assert!(out[0].0.as_ref().is_ok_and(|o| o.stdout.starts_with(b"answer\n")), "{how}: {:?}", out[0].0.as_ref().map(|o| String::from_utf8_lossy(&o.stdout[..o.stdout.len().min(200)]).into_owned()));
            assert_eq!(out[1].0.as_ref().map(|o| o.stdout.as_slice()).ok(), Some(&b"cut\n"[..]), "{how}: the process left writing ran on while the batch did");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

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
        // As the host ignores it (commands::run).
        // SAFETY: signal(2) sets a disposition; no handler runs.
        unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
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
            assert_eq!(u64::from_str_radix(ign, 16).unwrap() & (1 << (libc::SIGXFSZ - 1)), 0, "{how}: SIGXFSZ ignored: {out}");
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
