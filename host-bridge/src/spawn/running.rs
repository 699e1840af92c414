//! The children running now, by process group, so a host stopped by a signal
//! (crate::interrupt) can kill every group at once, as its own timeout kills one.
//!
//! A child is listed from its start until just before it is reaped (child.rs): a pid can
//! be reused only once reaped, so a group killed from this list is always one of ours.
//! (With the fallback's reaper thread a child is reaped as it exits and unlisted when its
//! status is read, a moment later: the same window the timeout's kill has there.)

use std::sync::Mutex;

static RUNNING: Mutex<Vec<i32>> = Mutex::new(Vec::new());

fn list() -> std::sync::MutexGuard<'static, Vec<i32>> {
    RUNNING.lock().unwrap_or_else(|e| e.into_inner())
}

/// A child started, the leader of its own process group `pid`.
pub(super) fn listed(pid: i32) {
    list().push(pid);
}

/// A child about to be reaped (or already reaped by the fallback's thread).
pub(super) fn unlisted(pid: i32) {
    list().retain(|&p| p != pid);
}

/// SIGKILL the process group of every child running. The list stays locked while it
/// kills, so no child is reaped (and its pid freed) meanwhile.
pub fn kill_running() {
    let running = list();
    for &pid in running.iter() {
        kill_group(pid);
    }
}

/// SIGKILL the child's process group (the child and everything it started that did not
/// leave the group).
pub fn kill_group(pgid: i32) {
    // SAFETY: kill(2) on a process group we created and on its leader, our unreaped child
    // (which may have left the group with setsid); no memory is involved.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
        libc::kill(pgid, libc::SIGKILL);
    }
}

/// Kill this host at once, as `kill -9` would (the test-only kill points).
pub fn kill_self() -> ! {
    // SAFETY: kill(2) on our own pid.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}
