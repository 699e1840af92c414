//! Standard output for the commands. `println!` panics when the reader has gone away
//! (`boxd-host describe | head`); here a closed pipe only drops the rest of the output and
//! the command goes on, so a tour still removes its machine and a call still exits with
//! its own code. Any other write error is said once on stderr.

use std::fmt::Arguments;
use std::io::{ErrorKind, Write};
use std::sync::atomic::{AtomicBool, Ordering};

static GONE: AtomicBool = AtomicBool::new(false);

/// One line (or text without its newline when `newline` is false) to stdout.
pub fn write(args: Arguments, newline: bool) {
    if GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut o = std::io::stdout().lock();
    let r = o.write_fmt(args).and_then(|_| if newline { o.write_all(b"\n") } else { Ok(()) }).and_then(|_| o.flush());
    if let Err(e) = r {
        GONE.store(true, Ordering::Relaxed);
        if e.kind() != ErrorKind::BrokenPipe {
            eprintln!("boxd-host: cannot write to stdout: {e}");
        }
    }
}

/// `println!` without the panic on a closed stdout.
#[macro_export]
macro_rules! outln {
    () => { $crate::out::write(format_args!(""), true) };
    ($($t:tt)*) => { $crate::out::write(format_args!($($t)*), true) };
}

/// `print!` without the panic on a closed stdout.
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::out::write(format_args!($($t)*), false) };
}
