//! The children running now, by process group, so a host stopped by a signal
//! (crate::interrupt) can kill every group at once, as its own timeout kills one.
//!
//! A child is listed from its start until just before it is reaped (child.rs): a pid can
//! be reused only once reaped, so a group killed from this list is always one of ours.
//! (With the fallback's reaper thread a child is reaped as it exits and unlisted when its
//! status is read, a moment later: the same window the timeout's kill has there.)

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// Room for more children than run at once: a call runs at most one batch of
/// `runAll.maxRequests` (16 at the most, policy.rs), and calls run one at a time. A child
/// that found no room (none has) would not be killed by a signal, only by its deadline.
const ROOM: usize = 64;

/// Lock-free, so a signal handler can read it: one pid a slot, 0 for none.
static RUNNING: [AtomicI32; ROOM] = [const { AtomicI32::new(0) }; ROOM];

/// Set while `kill_running` kills: a child is reaped (its pid freed) only once it is clear.
static KILLING: AtomicBool = AtomicBool::new(false);

/// A child started, the leader of its own process group `pid`.
pub(super) fn listed(pid: i32) {
    let _ = RUNNING.iter().find(|slot| slot.compare_exchange(0, pid, Ordering::SeqCst, Ordering::SeqCst).is_ok());
}

/// A child about to be reaped (or already reaped by the fallback's thread). Once it
/// returns, no kill from `kill_running` can still be on its way to this pid.
pub(super) fn unlisted(pid: i32) {
    if let Some(slot) = RUNNING.iter().find(|slot| slot.load(Ordering::SeqCst) == pid) {
        slot.store(0, Ordering::SeqCst);
    }
    // A kill that read the slot before it was cleared set KILLING first: wait it out (a
    // few system calls; a handler on this very thread has returned before we get here).
    while KILLING.load(Ordering::SeqCst) {
        std::hint::spin_loop();
    }
}

/// SIGKILL the process group of every child running. Async-signal-safe (the signal
/// handler calls it, crate::interrupt): no lock, no allocation; while it kills, no child
/// listed is reaped (see `unlisted`).
pub fn kill_running() {
    KILLING.store(true, Ordering::SeqCst);
    for slot in &RUNNING {
        match slot.load(Ordering::SeqCst) {
            0 => {}
            pid => kill_group(pid),
        }
    }
    KILLING.store(false, Ordering::SeqCst);
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
