//! The command line end to end: `boxd-host call` against the boxd-local provider.

use crate::common::*;

#[test]
fn status_reports_sign_in_zero_works_and_a_next_step() {
    let laptop = Laptop::new("status");
    let out = laptop.host(&["call", "boxd_status", "{}"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v = stdout_json(&out);
    assert_eq!(v["boxd"]["cli"], "signed in");
    assert_eq!(v["works"].as_array().unwrap().len(), 0);
    assert_eq!(v["snapshot"]["present"], false);
    assert!(v["next"].as_str().unwrap().contains("golden"), "{}", v["next"]);
    // OpenCode's own facts (its permission rules, its copy of the skill) only in OpenCode.
    for key in ["agentsWithoutRules", "rulesAdded", "skills"] {
        assert!(v.get(key).is_none(), "{key} in a boxd-host answer: {v:#}");
    }
    // One listing and one snapshot listing: nothing else. They run side by side, so the
    // log has them in either order.
    let mut calls = laptop.boxd_calls();
    calls.sort();
    assert_eq!(calls, [["machine", "list", "--json"], ["snapshots", "list", "--json"]]);

    assert!(laptop.boxd(&["auth", "logout"]).status.success());
    let v = stdout_json(&laptop.host(&["call", "boxd_status"]));
    assert_eq!(v["boxd"]["cli"], "not signed in");
    assert!(v["boxd"]["reason"].as_str().unwrap().contains("not logged in"));
    assert_eq!(v["next"], "Run 'boxd auth login' on this laptop, then boxd_status again.");
}

#[test]
fn a_missing_boxd_cli_is_named_in_status() {
    let laptop = Laptop::new("nocli");
    let out = std::process::Command::new(boxd_host())
        .args(["--project", laptop.project.to_str().unwrap(), "--ledger", laptop.ledger.to_str().unwrap(), "call", "boxd_status"])
        .env("PATH", "/nonexistent")
        .env("XDG_CACHE_HOME", cache_dir())
        .output()
        .unwrap();
    let v = stdout_json(&out);
    assert_eq!(v["boxd"]["cli"], "not reachable");
    assert!(v["next"].as_str().unwrap().starts_with("Install the boxd CLI"));
}

#[test]
fn unknown_tools_and_bad_arguments_are_clear_errors() {
    let laptop = Laptop::new("badargs");
    let out = laptop.host(&["call", "boxd_teleport", "{}"]);
    assert_eq!(out.status.code(), Some(1));
    let v = stdout_json(&out);
    assert_eq!(v["error"], "TOOL_UNKNOWN");
    assert!(v["message"].as_str().unwrap().contains("boxd_status"));

    let v = stdout_json(&laptop.host(&["call", "boxd_ensure", r#"{"work": 42}"#]));
    assert_eq!(v["error"], "ARGS_INVALID");
    assert_eq!(v["message"], "argument 'work' must be a string");
    let v = stdout_json(&laptop.host(&["call", "boxd_ensure", r#"{"wrok": "w1"}"#]));
    assert_eq!(v["message"], "argument 'work' is required");
    let v = stdout_json(&laptop.host(&["call", "boxd_ensure", "not json"]));
    assert_eq!(v["error"], "ARGS_INVALID");
    let v = stdout_json(&laptop.host(&["--options", r#"{"access":"never"}"#, "call", "boxd_status"]));
    assert_eq!(v["error"], "OPTIONS_INVALID");
    assert!(v["message"].as_str().unwrap().contains("'access'"));
    // Nothing of the above reached boxd.
    assert!(laptop.boxd_calls().is_empty());
}

#[test]
fn usage_errors_exit_2_and_help_exits_0() {
    let out = std::process::Command::new(boxd_host()).arg("--bogus").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unexpected argument '--bogus'"));
    let out = std::process::Command::new(boxd_host()).arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("audit") && help.contains("--allow-root <DIR>") && help.contains("exit codes"), "{help}");
    let out = std::process::Command::new(boxd_host()).arg("--version").output().unwrap();
    assert_eq!((out.status.code(), String::from_utf8_lossy(&out.stdout).trim()), (Some(0), concat!("boxd-host ", env!("CARGO_PKG_VERSION"))));
    // A file that is no component: one line that says so, never a dump of its bytes.
    let junk = Scratch::new("junk");
    let path = junk.0.join("junk.wasm");
    std::fs::write(&path, vec![0x42u8; 4096]).unwrap();
    let out = std::process::Command::new(boxd_host()).args(["--component", path.to_str().unwrap(), "describe"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("not a WebAssembly component"), "{err}");
}

#[test]
fn the_audit_log_records_each_spawn_and_path() {
    let laptop = Laptop::new("auditlog");
    let log = laptop.scratch.0.join("audit.jsonl");
    let out = laptop.host(&["--audit-log", log.to_str().unwrap(), "call", "boxd_status"]);
    assert!(out.status.success());
    let line: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&log).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(line["tool"], "boxd_status");
    assert_eq!(line["result"], "ok");
    let spawns = line["spawns"].as_array().unwrap();
    assert_eq!(spawns.len(), 2);
    assert_eq!(spawns[0]["program"], "boxd");
    assert_eq!(spawns[0]["args"], serde_json::json!(["machine", "list", "--json"]));
    assert_eq!(spawns[0]["exit_code"], 0);
    let paths = line["paths"].as_array().unwrap();
    let works = format!("{}/works", laptop.ledger.display());
    assert!(paths.iter().any(|p| p["path"] == works.as_str()), "{paths:?}");
}

/// The plugin option `auditLog` (the OpenCode bridge's only way to ask for a log) asks
/// boxd-host for the same log when no `--audit-log` is given; either is created owner-only.
#[test]
fn the_audit_log_option_opens_the_log_without_the_flag_and_the_log_is_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let laptop = Laptop::new("auditopt");
    let log = laptop.scratch.0.join("audit.jsonl");
    let options = serde_json::json!({ "auditLog": log }).to_string();
    let out = laptop.host(&["--options", &options, "call", "boxd_status"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap()["tool"], "boxd_status");
    assert_eq!(std::fs::metadata(&log).unwrap().permissions().mode() & 0o777, 0o600);
}

/// The laptop OpenCode's version is asked once per binary (path, size, mtime, inode, ctime),
/// kept in the cache folder, passed to the component, and asked again when the binary changes.
#[test]
fn the_laptop_opencode_version_is_asked_once_per_binary() {
    let laptop = Laptop::new("ocversion");
    let (bin, log, cache) = (laptop.scratch.0.join("opencode"), laptop.scratch.0.join("asked.log"), laptop.scratch.path("cache"));
    let write_bin = |version: &str| {
        std::fs::write(&bin, format!("#!/bin/sh\necho \"$@\" >> '{}'\necho {version}\n", log.display())).unwrap();
        std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    };
    write_bin("1.18.33");
    let status = |laptop: &Laptop| {
        let out = laptop.host_with(&["--opencode", bin.to_str().unwrap(), "call", "boxd_status"], &[("BOXD_HOST_CACHE", cache.to_str().unwrap())]);
        stdout_json(&out)["guest"]["opencode"].clone()
    };
    let asked = || std::fs::read_to_string(&log).unwrap_or_default().lines().count();
    assert_eq!(status(&laptop), "1.18.33");
    assert_eq!(status(&laptop), "1.18.33");
    assert_eq!(asked(), 1, "two processes, one --version");
    std::thread::sleep(std::time::Duration::from_millis(20));
    write_bin("1.18.34");
    assert_eq!(status(&laptop), "1.18.34");
    assert_eq!(asked(), 2, "a changed binary is asked again");

    // Replaced by one of the same size with the old mtime put back (as `cp -p` or `touch -r`
    // leave it): the inode or ctime still differs, so it is asked again.
    let before = std::fs::metadata(&bin).unwrap();
    let new = laptop.scratch.0.join("opencode.new");
    std::fs::write(&new, std::fs::read_to_string(&bin).unwrap().replace("1.18.34", "1.18.35")).unwrap();
    std::fs::set_permissions(&new, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::File::options().write(true).open(&new).unwrap().set_modified(before.modified().unwrap()).unwrap();
    std::fs::rename(&new, &bin).unwrap();
    let after = std::fs::metadata(&bin).unwrap();
    assert_eq!((after.len(), after.modified().unwrap()), (before.len(), before.modified().unwrap()), "the same size and mtime as the one it replaced");
    assert_eq!(status(&laptop), "1.18.35");
    assert_eq!(asked(), 3, "a binary put back with the old size and mtime is asked again");
}

/// A grant the host cannot make is a tool-shaped answer, with its next step, not a crash.
#[test]
fn a_grant_the_host_cannot_make_is_answered_like_a_tool_error() {
    let laptop = Laptop::new("hostproblem");
    let out = laptop.host(&["--options", r#"{"allowedRoots":["/no/such/root"]}"#, "call", "boxd_status"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let v = stdout_json(&out);
    assert_eq!(v["error"], "OPTIONS_INVALID", "{v:#}");
    assert!(v["next"].as_str().unwrap().contains("allowedRoots"), "{v:#}");
    assert!(laptop.boxd_calls().is_empty(), "nothing ran");
}

/// On a terminal a long tool shows the manifest's progress title on stderr; piped (as every
/// other test runs it) stdout is the bare JSON and stderr stays empty.
#[test]
fn a_long_tool_shows_progress_only_on_a_terminal() {
    let laptop = Laptop::new("progress");
    let piped = laptop.host(&["call", "boxd_ensure", r#"{"work":"w1"}"#]);
    assert!(piped.stderr.is_empty(), "{}", String::from_utf8_lossy(&piped.stderr));
    assert_eq!(stdout_json(&piped)["error"], "SNAPSHOT_MISSING");
    if !std::path::Path::new("/usr/bin/script").exists() {
        return; // util-linux's script gives the child a terminal; without it only the piped half runs
    }
    let line = format!(
        "{} --project {} --ledger {} --boxd {} call boxd_ensure '{{\"work\":\"w1\"}}'",
        boxd_host().display(),
        laptop.project.display(),
        laptop.ledger.display(),
        boxd_local().display()
    );
    let tty = std::process::Command::new("/usr/bin/script").args(["-qec", &line, "/dev/null"]).env("BOXD_LOCAL_HOME", &laptop.boxd_home).env("BOXD_HOST_CACHE", cache_dir()).output().unwrap();
    let text = String::from_utf8_lossy(&tty.stdout);
    assert!(text.contains("ensuring machine oc-w1"), "{text}");
    assert!(text.contains("SNAPSHOT_MISSING"), "{text}");
}

/// A reader that goes away (`boxd-host describe | head -1`) ends the output, not the
/// program with a panic: the command finishes and exits with its own code.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    let mut child = std::process::Command::new(boxd_host())
        .arg("describe")
        .env("BOXD_HOST_CACHE", cache_dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader is gone before the first line
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{stderr}");
}

/// The compiled-component cache damaged on disk (bytes changed in place): the next start
/// does not run those bytes as code (every start died of SIGSEGV with no word, for ever);
/// it loads the component afresh and writes the cache again. A cache folder that others
/// can write is not used at all, and a relative one is never made in the current folder.
#[test]
fn a_damaged_compiled_cache_is_loaded_afresh_never_run_as_code() {
    use std::io::{Seek, Write};
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new("cache-damaged");
    let cache = s.path("cache");
    let (project, ledger) = (s.path("p"), s.path("l"));
    // A call runs the component's code (describe alone may not reach a damaged part).
    let describe = |dir: &std::path::Path| {
        std::process::Command::new(boxd_host())
            .args(["--project", project.to_str().unwrap(), "--ledger", ledger.to_str().unwrap(), "--boxd", boxd_local().to_str().unwrap(), "call", "boxd_job", r#"{"work":"w1"}"#])
            .env("BOXD_HOST_CACHE", dir)
            .env("XDG_CACHE_HOME", s.0.join("xdg"))
            .current_dir(&s.0)
            .output()
            .unwrap()
    };
    let answered = |out: &std::process::Output| out.status.code() == Some(1) && stdout_json(out)["error"] == "WORK_UNKNOWN";
    let cwasm = |dir: &std::path::Path| std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|x| x == "cwasm"));
    assert!(answered(&describe(&cache)));
    let file = cwasm(&cache).expect("the first start writes the cache");
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    let good = std::fs::read(&file).unwrap();
    let mut bytes = good.clone();
    // Across the compiled code, the header and wasmtime's metadata intact.
    let n = bytes.len();
    for i in (n / 4..n / 2).step_by(97) {
        bytes[i] ^= 0xff;
    }
    let mut f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.rewind().unwrap();
    f.write_all(&bytes).unwrap();
    drop(f);
    for _ in 0..2 {
        let out = describe(&cache);
        assert!(answered(&out), "{:?} {} {}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(std::fs::read(&file).unwrap(), good, "the cache is written again");
    // A folder others can write: nothing is read from it or written to it.
    let shared = s.path("shared");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(shared.join(file.file_name().unwrap()), &bytes).unwrap();
    assert!(answered(&describe(&shared)));
    assert_eq!(std::fs::read(shared.join(file.file_name().unwrap())).unwrap(), bytes);
    assert!(std::fs::read_dir(&shared).unwrap().count() == 1, "nothing written to a shared folder");
    // A relative cache folder is not made in the folder the host started in.
    assert!(answered(&describe(std::path::Path::new("rel-cache"))));
    assert!(!s.0.join("rel-cache").exists());
}
