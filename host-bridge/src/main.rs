//! boxd-host: parse, run, turn the result into an exit code (0 ok, 1 tool error, 2 usage
//! or host failure). Everything else is in the library.

use std::process::ExitCode;

fn main() -> ExitCode {
    let parsed = match boxd_host::cli::parse(std::env::args().skip(1)) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("boxd-host: {e:#}");
            return ExitCode::from(2);
        }
    };
    let flags = match parsed {
        boxd_host::cli::Parsed::Help => return print(boxd_host::cli::USAGE),
        boxd_host::cli::Parsed::Version => return print(&format!("boxd-host {}\n", env!("CARGO_PKG_VERSION"))),
        boxd_host::cli::Parsed::Run(f) => f,
    };
    match boxd_host::cli::run(flags) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("boxd-host: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn print(text: &str) -> ExitCode {
    use std::io::Write;
    // A closed pipe (boxd-host --help | head) is not a failure.
    let _ = std::io::stdout().write_all(text.as_bytes());
    ExitCode::SUCCESS
}
