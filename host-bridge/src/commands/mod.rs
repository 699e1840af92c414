//! One file per command; each takes its parsed arguments and returns the exit code
//! (0 ok, 1 the tool returned an error, 2 is `main`'s for usage and host failures).

mod audit;
mod call;
mod describe;
pub mod golden;
pub mod live_check;
pub mod mcp;
mod mcp_kept;
mod mcp_lines;
pub mod tour;

use anyhow::Result;

use crate::cli::{Cli, Command};

pub fn run(cli: Cli) -> Result<u8> {
    let grants = &cli.grants;
    // A file-size limit (ulimit -f) is a write that fails (EFBIG), said in the answer,
    // not a host killed by SIGXFSZ with nothing said (the stdout file is sized ahead).
    // SAFETY: signal(2) sets this signal's disposition; no handler runs.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    // The commands that make tool calls: a signal kills their children and writes the
    // call's audit line before the host ends (crate::interrupt). live-check handles the
    // signals its own way (it cleans up what it made).
    if matches!(cli.command, Command::Call { .. } | Command::Mcp | Command::Golden(_)) {
        crate::interrupt::install()?;
    }
    match cli.command {
        Command::Describe => describe::run(grants),
        Command::Call { tool, args } => call::run(grants, &tool, args),
        Command::Audit { json } => audit::run(grants, json),
        Command::Mcp => mcp::serve(grants),
        Command::Tour { keep, plugin } => tour::run(grants, keep, plugin),
        Command::Golden(args) => golden::run(grants, &args),
        Command::LiveCheck(args) => live_check::run(grants, &args),
    }
}
