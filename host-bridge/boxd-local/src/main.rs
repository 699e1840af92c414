//! boxd-local: a boxd-compatible CLI whose "machines" are folders and processes on this
//! computer. It is not a VM (see `--help` and docs/boxd-local.md). `main` only turns the
//! argument list into an exit code; `app` runs the invocation.

mod app;
mod auth;
mod calllog;
mod cli;
mod copy;
mod envvars;
mod exec;
mod fail;
mod faults;
mod fstree;
mod help;
mod machines;
mod output;
mod power;
mod procs;
mod snapshots;
mod store;
mod trash;
mod util;

fn main() {
    let argv: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if argv.first().map(String::as_str) == Some(trash::PURGE_ARG) {
        std::process::exit(trash::purge());
    }
    std::process::exit(app::run(argv));
}
