//! SIGTERM, SIGINT and SIGHUP while a call runs: an MCP client shutting its server down
//! (most send SIGTERM, then SIGKILL after a grace), Ctrl-C on `boxd-host call`, a closed
//! terminal. Without a handler the host died at once: the call's audit line was never
//! written, and what its boxd CLI had started (its own children, in the child's process
//! group) ran on, since PR_SET_PDEATHSIG reaches only the direct child.
//!
//! With `install` (call, mcp, golden), a thread of signal-hook's waits for the signals; the
//! handler itself only wakes it. On the first one it
//!
//! 1. notes the signal (`received`): from then on no child starts (the process runner
//!    refuses it at once) and a running one is stopped where the runner waits on it;
//! 2. kills the process group of every child running (spawn::kill_running), as the host's
//!    own timeout does, so a child that ignores SIGTERM goes all the same;
//! 3. waits, at most `GRACE`, for the call in flight to end: the component sees its spawns
//!    fail and answers, and the call's audit line is written with the spawns so far and
//!    `"interrupted": "SIGTERM"` (audit.rs);
//! 4. ends the host by the same signal (its default action), so the parent sees it die of
//!    the signal it sent (a shell's 128 + N).
//!
//! A second signal during these steps changes nothing (they take milliseconds); SIGKILL,
//! which no process can catch, still ends the host at once (docs/architecture.md says
//! what stays then).

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// The signals that stop the host this way.
pub const SIGNALS: [i32; 3] = [SIGTERM, SIGINT, SIGHUP];

/// How long the call in flight has, once its children are killed, to answer and write its
/// audit line. It needs milliseconds (every spawn now fails at once); MCP clients give a
/// server a few seconds before SIGKILL.
pub const GRACE: Duration = Duration::from_secs(3);

/// The signal received, 0 before one.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// Calls in flight (at most one: `call` makes one, the MCP server runs them in turn).
static IN_FLIGHT: Mutex<u32> = Mutex::new(0);
static ENDED: Condvar = Condvar::new();

/// Handle SIGTERM, SIGINT and SIGHUP as the module says, from now on.
/// A signal the host was started with ignored (`nohup` ignores SIGHUP, a shell's
/// background job SIGINT) stays ignored, as its starter asked.
pub fn install() -> std::io::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new(SIGNALS.into_iter().filter(|&s| !ignored(s)))?;
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        if let Some(sig) = signals.forever().next() {
            stop(sig);
        }
    })?;
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

fn stop(sig: i32) {
    RECEIVED.store(sig, Ordering::SeqCst);
    crate::spawn::kill_running();
    let in_flight = IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner());
    let (in_flight, waited) = ENDED.wait_timeout_while(in_flight, GRACE, |n| *n > 0).unwrap_or_else(|e| e.into_inner());
    if waited.timed_out() {
        eprintln!("boxd-host: {}: the call in flight did not end within {} s; its audit line is lost", name(sig), GRACE.as_secs());
    }
    drop(in_flight);
    die(sig)
}

/// End the host by `sig`'s default action (terminate), as if no handler had been there.
fn die(sig: i32) -> ! {
    let _ = signal_hook::low_level::emulate_default_handler(sig);
    // Not reached (the default action of these signals ends the process).
    std::process::exit(128 + sig)
}

/// A call in flight, from before its first child to after its audit line. Dropped once
/// the line is written: if a signal came meanwhile, the host ends there, before the answer
/// goes anywhere (the one who sent it is not reading).
#[must_use]
pub struct InFlight(());

/// Mark a call in flight (see `InFlight`).
pub fn in_flight() -> InFlight {
    *IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    InFlight(())
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut n = IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner());
        *n -= 1;
        ENDED.notify_all();
        drop(n);
        if let Some(sig) = received() {
            die(sig);
        }
    }
}
