//! A machine's processes. Every process an exec starts carries `BOXD_LOCAL_MACHINE=<id>`
//! and hands it on to its children, so scanning `/proc/*/environ` finds them all — including
//! `setsid`/`nohup` background jobs that outlive the exec, as they do on real boxd. A process
//! that wipes its own environment (`env -i …`) escapes the scan; this is not isolation.
//! Linux only: elsewhere the scan finds nothing (documented in docs/boxd-local.md).

use crate::store::Session;
use std::time::{Duration, Instant};

pub const MARKER: &str = "BOXD_LOCAL_MACHINE";

/// Pids whose initial environment holds this machine's marker (never our own pid).
#[cfg(target_os = "linux")]
pub fn pids_of(id: &str) -> Vec<i32> {
    let needle = format!("{MARKER}={id}").into_bytes();
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut pids = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        // Other users' processes and zombies read as errors or empty: not ours.
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        if env.split(|b| *b == 0).any(|kv| kv == needle.as_slice()) {
            pids.push(pid);
        }
    }
    pids
}

#[cfg(not(target_os = "linux"))]
pub fn pids_of(_id: &str) -> Vec<i32> {
    Vec::new()
}

/// (state letter, start time in clock ticks) from `/proc/PID/stat`.
#[cfg(target_os = "linux")]
fn stat(pid: i32) -> Option<(char, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: parse after the last ')'.
    let rest = s.get(s.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

#[cfg(not(target_os = "linux"))]
fn stat(pid: i32) -> Option<(char, u64)> {
    // SAFETY: signal 0 only checks that the pid exists.
    (unsafe { libc::kill(pid, 0) } == 0).then_some(('R', 0))
}

pub fn run_state(pid: i32) -> Option<char> {
    stat(pid).map(|(s, _)| s)
}

/// This invocation as an exec/cp session the idle sweep can check for liveness.
pub fn self_session() -> Session {
    let pid = std::process::id() as i32;
    Session { pid, start: stat(pid).map(|(_, t)| t).unwrap_or(0) }
}

pub fn session_alive(s: &Session) -> bool {
    matches!(stat(s.pid), Some((state, start)) if start == s.start && state != 'Z')
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: plain kill(2); a vanished pid just returns ESRCH.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// SIGKILL every process of the machine, rescanning until none is left (children forked
/// between scans are caught by the next one), and wait until each one signalled has exited.
/// A killed process leaves the scan the moment its memory is let go (its environ reads
/// empty), but it keeps its working folder and open files until its exit ends, and freeing
/// a few GiB takes a good part of a second: a remove that answered then would move the
/// folder from under a process still in it. Stopped processes die too. The bound is
/// generous: on a loaded 2-core machine one scan of /proc can take a good part of a second.
pub fn kill_all(id: &str) {
    kill_all_by(id, Instant::now() + Duration::from_secs(15));
}

/// `kill_all`, rescanning and waiting until `deadline`. As in `stop_all_by`, what a scan
/// finds is signalled even when the scan ends past the deadline; only the waiting stops.
fn kill_all_by(id: &str, deadline: Instant) {
    // (pid, start time): a pid reused after its reap is not waited for.
    let mut dying: Vec<(i32, u64)> = Vec::new();
    loop {
        let pids = pids_of(id);
        dying.retain(|&(pid, start)| still_exiting(pid, start));
        for &pid in &pids {
            if let Some((_, start)) = stat(pid) {
                if !dying.contains(&(pid, start)) {
                    dying.push((pid, start));
                }
            }
            signal(pid, libc::SIGKILL);
        }
        if (pids.is_empty() && dying.is_empty()) || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether the process `pid` (started at `start`) has a thread that has not exited: its
/// leader reads `Z` as soon as it has exited itself, while the other threads, which hold
/// its memory and working folder, may still be on their way out.
#[cfg(target_os = "linux")]
fn still_exiting(pid: i32, start: u64) -> bool {
    if !matches!(stat(pid), Some((_, t)) if t == start) {
        return false;
    }
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().any(|t| {
        let Ok(s) = std::fs::read_to_string(t.path().join("stat")) else { return false };
        let state = s.rfind(')').and_then(|i| s.get(i + 2..)).and_then(|r| r.chars().next());
        !matches!(state, Some('Z' | 'X') | None)
    })
}

#[cfg(not(target_os = "linux"))]
fn still_exiting(pid: i32, start: u64) -> bool {
    matches!(stat(pid), Some((state, t)) if t == start && state != 'Z')
}

/// SIGSTOP every process of the machine until all show state `T` (pause, hibernate).
pub fn stop_all(id: &str) {
    stop_all_by(id, Instant::now() + Duration::from_secs(2));
}

/// `stop_all`, rescanning until `deadline`. What a scan finds is signalled even when the
/// scan ends past the deadline: on a loaded machine one scan of /proc can take longer than
/// the whole bound, and a machine said to be hibernated had run on untouched.
fn stop_all_by(id: &str, deadline: Instant) {
    loop {
        let running: Vec<i32> = pids_of(id)
            .into_iter()
            .filter(|p| !matches!(run_state(*p), Some('T' | 't' | 'Z') | None))
            .collect();
        for pid in &running {
            signal(*pid, libc::SIGSTOP);
        }
        if running.is_empty() || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// SIGCONT every process of the machine (resume, wake). Stopped processes cannot fork,
/// so one pass reaches them all.
pub fn cont_all(id: &str) {
    for pid in pids_of(id) {
        signal(pid, libc::SIGCONT);
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    /// A `sleep 30` of machine `id`, once a scan finds it (it carries the marker once exec'd).
    fn machine_process(id: &str) -> std::process::Child {
        let child = std::process::Command::new("sleep").arg("30").env(MARKER, id).spawn().expect("sleep");
        let until = Instant::now() + Duration::from_secs(5);
        while !pids_of(id).contains(&(child.id() as i32)) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        child
    }

    /// A scan that ends past the bound still stops what it found (the bound only ends the
    /// rescans): a process of the machine is stopped by a stop whose deadline has passed.
    #[test]
    fn a_stop_past_its_deadline_still_stops_what_its_scan_found() {
        let id = format!("procs-stop-{}", std::process::id());
        let mut child = machine_process(&id);
        let pid = child.id() as i32;
        stop_all_by(&id, Instant::now() - Duration::from_secs(1));
        let until = Instant::now() + Duration::from_secs(5);
        while run_state(pid) != Some('T') && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        let state = run_state(pid);
        child.kill().ok();
        child.wait().ok();
        assert_eq!(state, Some('T'), "the process the scan found was not stopped");
    }

    /// The same for a kill (stop, reboot, remove, auto-destroy): a kill whose deadline has
    /// passed still kills what its scan found.
    #[test]
    fn a_kill_past_its_deadline_still_kills_what_its_scan_found() {
        let id = format!("procs-kill-{}", std::process::id());
        let mut child = machine_process(&id);
        kill_all_by(&id, Instant::now() - Duration::from_secs(1));
        let until = Instant::now() + Duration::from_secs(5);
        let mut status = None;
        while status.is_none() && Instant::now() < until {
            status = child.try_wait().expect("wait");
            std::thread::sleep(Duration::from_millis(5));
        }
        if status.is_none() {
            child.kill().ok();
            child.wait().ok();
        }
        assert_eq!(status.and_then(|s| s.signal()), Some(libc::SIGKILL), "the process the scan found was not killed");
    }
}
