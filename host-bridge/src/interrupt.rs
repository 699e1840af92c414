//! SIGTERM, SIGINT and SIGHUP while a call runs: an MCP client shutting its server down
//! (most send SIGTERM, then SIGKILL after a grace), Ctrl-C on `boxd-host call`, a closed
//! terminal. Without a handler the host died at once: the call's audit line was never
//! written, and what its boxd CLI had started (its own children, in the child's process
//! group) ran on, since PR_SET_PDEATHSIG reaches only the direct child.
//!
//! With `install` (call, mcp, golden), a handler of these signals (signal-hook's
//! registry) does, on the first one, on whichever thread the signal lands, no thread
//! waiting for it (a one-shot call started and ended one for nothing: ~0.1 ms of ~4):
//!
//! 1. notes the signal (`received`): from then on no child starts (the process runner
//!    refuses it at once) and a running one is stopped where the runner waits on it;
//! 2. kills the process group of every child running (spawn::kill_running), as the host's
//!    own timeout does, so a child that ignores SIGTERM goes all the same;
//! 3. with no call in flight, ends the host by the same signal (its default action), so
//!    the parent sees it die of the signal it sent (a shell's 128 + N); with one, leaves
//!    it to the call, which sees its spawns fail and answers: its audit line is written
//!    with the spawns so far and `"interrupted": "SIGTERM"` (audit.rs), and the host ends
//!    by the signal there (`InFlight`). An alarm of `GRACE` ends it anyway if the call
//!    does not end by then.
//!
//! The handler makes only async-signal-safe calls: atomics, kill(2), alarm(2), write(2),
//! sigaction(2), raise(3) and _exit(2).
//! A second signal during these steps changes nothing (they take milliseconds); SIGKILL,
//! which no process can catch, still ends the host at once (docs/architecture.md says
//! what stays then).

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::time::Duration;

use signal_hook::consts::{SIGALRM, SIGHUP, SIGINT, SIGTERM};

/// The signals that stop the host this way.
pub const SIGNALS: [i32; 3] = [SIGTERM, SIGINT, SIGHUP];

/// How long the call in flight has, once its children are killed, to answer and write its
/// audit line. It needs milliseconds (every spawn now fails at once); MCP clients give a
/// server a few seconds before SIGKILL.
pub const GRACE: Duration = Duration::from_secs(3);

/// The signal received, 0 before one.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// Calls in flight (at most one: `call` makes one, the MCP server runs them in turn).
static IN_FLIGHT: AtomicU32 = AtomicU32::new(0);

/// Handle SIGTERM, SIGINT and SIGHUP as the module says, from now on.
/// A signal the host was started with ignored (`nohup` ignores SIGHUP, a shell's
/// background job SIGINT) stays ignored, as its starter asked.
pub fn install() -> std::io::Result<()> {
    for sig in SIGNALS.into_iter().filter(|&s| !ignored(s)) {
        // SAFETY: `stop` is async-signal-safe (the module says which calls it makes).
        unsafe { signal_hook::low_level::register(sig, move || stop(sig)) }?;
    }
    // SAFETY: as above; armed only by `stop`.
    unsafe { signal_hook::low_level::register(SIGALRM, grace_over) }?;
    Ok(())
}

/// Whether `sig` is ignored now (inherited from the starter: nothing here ignores one).
fn ignored(sig: i32) -> bool {
    // SAFETY: sigaction(2) with no new action only reads the disposition into a local.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// The signal that is stopping the host, if one came.
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}

/// The signal's name ("SIGTERM").
pub fn name(sig: i32) -> String {
    signal_hook::low_level::signal_name(sig).map_or_else(|| format!("signal {sig}"), str::to_string)
}

/// In the signal handler: only async-signal-safe calls from here on.
fn stop(sig: i32) {
    if RECEIVED.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst).is_err() {
        return;
    }
    crate::spawn::kill_running();
    // Read after `RECEIVED` is set, as `InFlight::drop` reads `RECEIVED` after its count
    // goes down: one of the two sees the other, so the host always ends.
    if IN_FLIGHT.load(Ordering::SeqCst) == 0 {
        die(sig);
    }
    // SAFETY: alarm(2) only arms the process's timer (SIGALRM: `grace_over`).
    unsafe { libc::alarm(GRACE.as_secs() as u32) };
}

/// In the signal handler (SIGALRM, armed by `stop`): the call did not end within `GRACE`.
fn grace_over() {
    let sig = RECEIVED.load(Ordering::SeqCst);
    if sig == 0 {
        return;
    }
    let name = signal_hook::low_level::signal_name(sig).unwrap_or("a signal");
    for part in ["boxd-host: ", name, ": the call in flight did not end within 3 s; its audit line is lost\n"] {
        // SAFETY: write(2) of a static string to stderr.
        unsafe { libc::write(2, part.as_ptr().cast(), part.len()) };
    }
    die(sig)
}
const _: () = assert!(GRACE.as_secs() == 3, "grace_over's message says 3 s");

/// End the host by `sig`'s default action (terminate), as if no handler had been there.
fn die(sig: i32) -> ! {
    let _ = signal_hook::low_level::emulate_default_handler(sig);
    // Not reached (the default action of these signals ends the process); _exit(2) is
    // async-signal-safe, where `exit` runs atexit handlers.
    // SAFETY: _exit ends the process at once.
    unsafe { libc::_exit(128 + sig) }
}

/// A call in flight, from before its first child to after its audit line. Dropped once
/// the line is written: if a signal came meanwhile, the host ends there, before the answer
/// goes anywhere (the one who sent it is not reading).
#[must_use]
pub struct InFlight(());

/// Mark a call in flight (see `InFlight`).
pub fn in_flight() -> InFlight {
    IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    InFlight(())
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let last = IN_FLIGHT.fetch_sub(1, Ordering::SeqCst) == 1;
        if let Some(sig) = received().filter(|_| last) {
            die(sig);
        }
    }
}
