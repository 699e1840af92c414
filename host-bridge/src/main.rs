//! boxd-host: parse, run, turn the result into an exit code (0 ok, 1 tool error, 2 usage
//! or host failure). Everything else is in the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = match boxd_host::cli::Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version print and exit 0; a usage error prints and exits 2.
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    match boxd_host::commands::run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("boxd-host: {e:#}");
            ExitCode::from(2)
        }
    }
}
