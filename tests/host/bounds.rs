//! Bounded I/O, no hangs and no traps, through the real `boxd-host` binary: output floods
//! past the caps of host-bridge/policy.json, a daemon that keeps the pipe open, FIFOs where
//! a file should be, a component that traps, owner-only ledger files, and the test-only
//! kill points (BOXD_HOST_KILL_AT).

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use boxd_host::policy::Policy;
use serde_json::Value;

use crate::common::*;

/// A fake `boxd`: a shell script in the laptop's scratch folder.
fn fake_boxd(laptop: &Laptop, name: &str, body: &str) -> PathBuf {
    let p = laptop.scratch.0.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// What one boxd-host run did: its exit, stdout, stderr, peak RSS (KiB) and duration.
struct Run {
    code: Option<i32>,
    signal: Option<i32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    max_rss_kib: i64,
    took: Duration,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.stdout).unwrap_or_else(|e| {
            panic!("not JSON ({e}): stdout={} stderr={}", String::from_utf8_lossy(&self.stdout), String::from_utf8_lossy(&self.stderr))
        })
    }
}

#[repr(C)]
struct Rusage {
    utime: [i64; 2],
    stime: [i64; 2],
    maxrss: i64,
    rest: [i64; 13],
}

unsafe extern "C" {
    fn wait4(pid: i32, status: *mut i32, options: i32, rusage: *mut Rusage) -> i32;
}

/// boxd-host with the laptop's folders and `boxd`, waited with wait4 for its own peak RSS.
fn host(laptop: &Laptop, boxd: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(boxd_host());
    cmd.arg("--project").arg(&laptop.project).arg("--ledger").arg(&laptop.ledger).arg("--boxd").arg(boxd);
    cmd.args(args).env("BOXD_LOCAL_HOME", &laptop.boxd_home).env("BOXD_HOST_CACHE", cache_dir());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = r.read_to_end(&mut b);
            b
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let mut status = 0i32;
    let mut usage = Rusage { utime: [0; 2], stime: [0; 2], maxrss: 0, rest: [0; 13] };
    // SAFETY: wait4 on our own child, with valid out-pointers.
    let r = unsafe { wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(r, child.id() as i32, "wait4 failed");
    let took = started.elapsed();
    let st = std::process::ExitStatus::from_raw(status);
    Run { code: st.code(), signal: st.signal(), stdout: out.join().unwrap(), stderr: err.join().unwrap(), max_rss_kib: usage.maxrss, took }
}

fn no_trap(run: &Run) {
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!err.contains("wasm trap") && !err.contains("backtrace"), "a trap reached the user: {err}");
}

#[test]
fn two_gigabytes_on_stdout_is_boxd_failed_naming_the_cap_with_bounded_memory() {
    let laptop = Laptop::new("flood-out");
    let boxd = fake_boxd(&laptop, "boxd", "head -c 2000000000 /dev/zero");
    let run = host(&laptop, &boxd, &["call", "boxd_ensure", r#"{"work":"w1"}"#], &[]);
    no_trap(&run);
    let v = run.json();
    assert_eq!((run.code, v["error"].as_str()), (Some(1), Some("BOXD_FAILED")), "{v:#}");
    let m = v["message"].as_str().unwrap();
    assert!(m.contains("more than 64 MiB on stdout") && m.contains("outputCaps"), "{m}");
    assert!(run.max_rss_kib < 1 << 20, "boxd-host peaked at {} MiB", run.max_rss_kib >> 10);
    assert!(run.took < Duration::from_secs(60), "{:?}", run.took);
}

#[test]
fn two_gigabytes_on_stderr_with_exit_1_is_a_json_error_not_a_trap() {
    let laptop = Laptop::new("flood-err");
    let boxd = fake_boxd(&laptop, "boxd", "head -c 2000000000 /dev/zero >&2\nexit 1");
    let run = host(&laptop, &boxd, &["call", "boxd_ensure", r#"{"work":"w1"}"#], &[]);
    no_trap(&run);
    let v = run.json();
    assert_eq!(run.code, Some(1), "{v:#}");
    assert!(v["next"].as_str().is_some_and(|n| !n.is_empty()), "{v:#}");
    assert!(v["message"].as_str().unwrap().contains("more than 1 MiB on stderr"), "{v:#}");
    assert!(run.max_rss_kib < 1 << 20, "boxd-host peaked at {} MiB", run.max_rss_kib >> 10);
}

/// Under the 64 MiB output cap, JSON of millions of tiny values takes gigabytes as values:
/// the component's memory limit stops it, with an answer and bounded memory.
#[test]
fn json_of_tiny_values_under_the_output_cap_is_host_failed_with_bounded_memory() {
    let laptop = Laptop::new("tiny-values");
    let boxd = fake_boxd(&laptop, "boxd", "printf '['; yes '{\"\":{}},' | head -n 7000000 | tr -d '\\n'; printf '{}]\\n'");
    let run = host(&laptop, &boxd, &["call", "boxd_status", "{}"], &[]);
    no_trap(&run);
    let v = run.json();
    eprintln!("boxd-host peaked at {} MiB: {v}", run.max_rss_kib >> 10);
    assert_eq!((run.code, v["error"].as_str()), (Some(1), Some("HOST_FAILED")), "{v:#}");
    assert!(v["message"].as_str().unwrap().contains("memory limit"), "{v:#}");
    assert!(run.max_rss_kib < 3 << 19, "boxd-host peaked at {} MiB", run.max_rss_kib >> 10);
}

/// Whether a process is gone (or a zombie nobody has reaped yet).
fn gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn a_daemon_holding_the_pipe_does_not_lose_the_answer_and_is_left_alone() {
    let laptop = Laptop::new("daemon");
    let pids = laptop.scratch.0.join("daemons");
    // Every boxd call leaves a background process holding stdout and stderr open, then
    // answers through boxd-local and exits 0.
    let boxd = fake_boxd(&laptop, "boxd", &format!("sleep 300 &\necho $! >> {}\nexec {} \"$@\"", pids.display(), boxd_local().display()));
    let plain = laptop.host(&["call", "boxd_status", "{}"]);
    let run = host(&laptop, &boxd, &["call", "boxd_status", "{}"], &[]);
    no_trap(&run);
    assert_eq!(run.code, Some(0), "{}", String::from_utf8_lossy(&run.stdout));
    let (a, b) = (run.json(), stdout_json(&plain));
    assert_eq!(a["boxd"], b["boxd"], "the answer is what boxd printed");
    assert_eq!(a["snapshot"], b["snapshot"]);
    assert!(run.took < Duration::from_secs(60), "{:?}", run.took);
    let started = std::fs::read_to_string(&pids).unwrap();
    assert!(!started.trim().is_empty(), "the fake boxd ran");
    // Not the host's to kill: a CLI's own daemon, or opencode finishing a write (killing
    // the group once lost an `opencode import`'s session).
    for pid in started.lines() {
        assert!(!gone(pid), "background process {pid} was killed");
        let _ = Command::new("kill").args(["-9", pid]).status();
    }
}

/// A daemon a boxd call left logging to stderr (a line every 50 ms) holds each call a few
/// graces at the most, not until boxdTimeoutSeconds: with two calls it held boxd_status
/// twice the timeout. The daemons are not the host's to kill.
#[test]
fn a_daemon_that_keeps_logging_holds_no_call_until_its_timeout() {
    let laptop = Laptop::new("trickle");
    let pids = laptop.scratch.0.join("daemons");
    let log = "while :; do echo 'daemon: still here' >&2; sleep 0.05; done";
    let boxd = fake_boxd(&laptop, "boxd", &format!("( {log} ) &\necho $! >> {}\nexec {} \"$@\"", pids.display(), boxd_local().display()));
    let run = host(&laptop, &boxd, &["--options", r#"{"boxdTimeoutSeconds": 20}"#, "call", "boxd_status", "{}"], &[]);
    let started = std::fs::read_to_string(&pids).unwrap_or_default();
    let alive: Vec<&str> = started.lines().filter(|pid| !gone(pid)).collect();
    for pid in started.lines() {
        let _ = Command::new("kill").args(["-9", pid]).status();
    }
    no_trap(&run);
    assert_eq!(run.code, Some(0), "{}", String::from_utf8_lossy(&run.stdout));
    assert_eq!(run.json()["boxd"]["calls"], 2, "{}", String::from_utf8_lossy(&run.stdout));
    assert_eq!(started.lines().count(), 2, "each boxd call left its daemon");
    assert_eq!(alive.len(), 2, "a daemon was killed");
    // Two calls side by side, each ending four graces (150 ms) after its exit at the most.
    assert!(run.took < Duration::from_secs(8), "{:?}", run.took);
}

/// What a boxd call left running writes on its stdout after the host answered (and here,
/// exited) is bounded: 512 KiB gets through, 4 MiB does not (it would otherwise have sat
/// in memory for as long as that process lived). Neither process is killed for it.
#[test]
fn what_a_boxd_call_left_running_writes_after_the_answer_is_bounded() {
    let laptop = Laptop::new("left-writing");
    let (go, ended) = (laptop.scratch.0.join("go"), laptop.scratch.0.join("ended"));
    // Within the bound first, then past it (the two share the file's offset and bound).
    let writer = format!(
        "(i=0; while [ ! -e {go} ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done; head -c {within} /dev/zero; echo within $? >> {ended}; head -c {past} /dev/zero 2>/dev/null; echo past $? >> {ended}) &",
        go = go.display(),
        ended = ended.display(),
        within = 512 << 10,
        past = 4 << 20
    );
    let body = format!("{writer}\nexec {} \"$@\"", boxd_local().display());
    let boxd = fake_boxd(&laptop, "boxd", &body);
    let run = host(&laptop, &boxd, &["call", "boxd_status", "{}"], &[]);
    no_trap(&run);
    assert_eq!(run.code, Some(0), "{}", String::from_utf8_lossy(&run.stdout));
    assert!(run.json()["boxd"].is_object(), "the answer is boxd's: {}", String::from_utf8_lossy(&run.stdout));
    std::fs::write(&go, "").unwrap();
    // boxd_status makes two boxd calls, each leaving a writer.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut lines = loop {
        let got = std::fs::read_to_string(&ended).unwrap_or_default();
        if got.lines().count() >= 4 {
            break got.lines().map(String::from).collect::<Vec<_>>();
        }
        assert!(Instant::now() < deadline, "the left writers did not end: {got:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    lines.sort();
    let [a, b, c, d] = &lines[..] else { panic!("{lines:?}") };
    assert_eq!((a.as_str(), b.as_str()), ("past 1", "past 1"), "4 MiB after the answer: {lines:?}");
    assert_eq!((c.as_str(), d.as_str()), ("within 0", "within 0"), "512 KiB after the answer: {lines:?}");
}

fn mkfifo(p: &Path) {
    let st = Command::new("mkfifo").arg(p).status().expect("mkfifo runs");
    assert!(st.success());
}

#[test]
fn a_fifo_given_as_a_submit_file_is_path_refused_at_once() {
    let laptop = Laptop::new("fifo-submit");
    mkfifo(&laptop.project.join("pipe"));
    let run = host(&laptop, &boxd_local(), &["call", "boxd_submit", r#"{"work":"w1","prompt":"hi","files":[{"from":"pipe","to":"pipe"}]}"#], &[]);
    let v = run.json();
    assert_eq!((run.code, v["error"].as_str()), (Some(1), Some("PATH_REFUSED")), "{v:#}");
    assert!(run.took < Duration::from_secs(30), "{:?}", run.took);
    assert!(laptop.boxd_calls().is_empty(), "nothing was sent");
}


#[test]
fn the_host_refuses_to_open_fifos_and_devices_before_any_blocking_open() {
    let s = Scratch::new("probe-fifo");
    let root = s.path("root");
    mkfifo(&root.join("pipe"));
    std::fs::write(root.join("file"), "fine").unwrap();
    let mut policy = Policy::new();
    policy.preopen(&root, "project").unwrap();
    let dev = Path::new("/dev");
    policy.preopen(dev, "allowed").unwrap();
    let rt = probe(policy);
    let r = root.display().to_string();
    let started = Instant::now();
    let refused = |what: &str, answer: String| assert!(answer.starts_with("err") && answer.contains("\"access\""), "{what}: {answer}");
    // Reading a FIFO (a harvest's check of its destination) and writing one (a write over it).
    refused("read a FIFO", ask(&rt, "read", &format!("{r}|pipe")));
    refused("write a FIFO", ask(&rt, "write", &format!("{r}|pipe")));
    // A device that never ends, and one that is not a file.
    refused("read /dev/zero", ask(&rt, "read", "/dev|zero"));
    refused("read /dev/null", ask(&rt, "read", "/dev|null"));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(ask(&rt, "read", &format!("{r}|file")), "ok 4 bytes", "regular files still open");
}

/// The component reads a file with no flag but READ, which the host opens in one confined
/// step (runtime/read_open.rs); what it refuses, and how, is what the general path with
/// its guard answers.
#[test]
fn a_read_as_the_component_reads_refuses_all_the_general_path_refuses() {
    let s = Scratch::new("probe-read-open");
    let root = s.path("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("file"), "fine").unwrap();
    std::fs::write(root.join("sub/inner"), "inside").unwrap();
    mkfifo(&root.join("pipe"));
    let _socket = std::os::unix::net::UnixListener::bind(root.join("socket")).unwrap();
    std::os::unix::fs::symlink(root.join("file"), root.join("link")).unwrap();
    std::os::unix::fs::symlink("/etc", root.join("out")).unwrap();
    std::os::unix::fs::symlink("sub", root.join("within")).unwrap();
    let mut policy = Policy::new();
    policy.preopen(&root, "project").unwrap();
    policy.preopen(Path::new("/dev"), "allowed").unwrap();
    let rt = probe(policy);
    let r = root.display().to_string();
    // "ok N bytes", or the WASI error's name ("err access").
    let answer = |root: &str, path: &str| {
        let a = ask(&rt, "read-nofollow", &format!("{root}|{path}"));
        match a.split_once("name: \"") {
            Some((_, rest)) => format!("err {}", rest.split('"').next().unwrap()),
            None => a,
        }
    };
    let read = |path: &str| answer(&r, path);
    let started = Instant::now();
    assert_eq!(read("file"), "ok 4 bytes");
    assert_eq!(read("sub/inner"), "ok 6 bytes");
    assert_eq!(read("within/inner"), "ok 6 bytes", "a symlinked folder inside the root is followed, as before");
    assert_eq!(read("missing"), "err no-entry");
    for (what, path) in [("a FIFO", "pipe"), ("a socket", "socket")] {
        assert_eq!(read(path), "err access", "{what}");
    }
    for dev in ["zero", "null"] {
        assert_eq!(answer("/dev", dev), "err access", "/dev/{dev}");
    }
    assert_eq!(read("link"), "err loop", "the last component is not followed");
    for escape in ["out/hostname", "../root/file", "/etc/hostname"] {
        assert_eq!(read(escape), "err not-permitted", "{escape} leaves the root");
    }
    assert!(read("sub").starts_with("err"), "a folder is opened but not read as a file");
    assert!(started.elapsed() < Duration::from_secs(10), "nothing blocked: {:?}", started.elapsed());
    // The general path (the guard's look, then wasmtime-wasi's open) answers every one of
    // these, and a few more, the same.
    std::os::unix::fs::symlink(root.join("pipe"), root.join("to-pipe")).unwrap();
    let paths = ["file", "sub/inner", "within/inner", "missing", "pipe", "socket", "link", "out/hostname", "../root/file", "/etc/hostname", "sub", "sub/", "", ".", "to-pipe", "sub/../file", "file/"];
    let answers = |rt: &boxd_host::runtime::Runtime| paths.iter().map(|p| (p.to_string(), ask(rt, "read-nofollow", &format!("{r}|{p}")))).collect::<Vec<_>>();
    let fast = answers(&rt);
    boxd_host::runtime::general_paths_only(true);
    let general = answers(&rt);
    boxd_host::runtime::general_paths_only(false);
    assert_eq!(fast, general);
}

/// A listing gives each entry's type as the folder gives it, and a short read of a regular
/// file says it reached the end (runtime/listing.rs, read_open.rs): the same entries,
/// types, errors and bytes as wasmtime-wasi's own path, with one read fewer where a file
/// ends inside a chunk, and none fewer where its size says nothing (/proc). (wasmtime-wasi
/// names a FIFO's and a socket's type `unknown`; so does the listing.)
#[test]
fn listings_and_reads_answer_as_wasmtime_wasi_does_with_one_read_fewer_at_a_files_end() {
    use std::os::unix::ffi::OsStrExt;
    let s = Scratch::new("probe-shortcuts");
    let root = s.path("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    let sizes = [("empty", 0usize), ("small", 4000), ("chunk", 16384), ("chunk-and-one", 16385), ("big", 100_000)];
    for (name, size) in sizes {
        std::fs::write(root.join(name), (0..size).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>()).unwrap();
    }
    mkfifo(&root.join("pipe"));
    let _socket = std::os::unix::net::UnixListener::bind(root.join("socket")).unwrap();
    std::os::unix::fs::symlink("small", root.join("link")).unwrap();
    std::fs::write(root.join(std::ffi::OsStr::from_bytes(b"not-utf8-\xff")), "x").unwrap();
    let mut policy = Policy::new();
    policy.preopen(&root, "project").unwrap();
    policy.preopen(Path::new("/proc"), "allowed").unwrap();
    let rt = probe(policy);
    let r = root.display().to_string();
    let lists = ["", "sub", "missing", "small"];
    let reads: Vec<String> = sizes.iter().map(|(n, _)| format!("{r}|{n}|16384")).chain(["/proc|version|16384".to_string(), "/proc|version|7".to_string()]).collect();
    let answers = |rt: &boxd_host::runtime::Runtime| {
        let listed: Vec<String> = lists.iter().map(|p| ask(rt, "list", &format!("{r}|{p}"))).collect();
        let read: Vec<String> = reads.iter().map(|a| ask(rt, "read-all", a)).collect();
        (listed, read)
    };
    let (fast_lists, fast_reads) = answers(&rt);
    boxd_host::runtime::general_paths_only(true);
    let (general_lists, general_reads) = answers(&rt);
    boxd_host::runtime::general_paths_only(false);

    assert_eq!(fast_lists, general_lists, "listings");
    let root_listing: Vec<&str> = fast_lists[0].lines().collect();
    assert_eq!(root_listing.len(), 10, "every entry, and no . or ..: {root_listing:?}");
    for (entry, kind) in [("small ", "RegularFile"), ("sub ", "Directory"), ("link ", "SymbolicLink"), ("pipe ", "Unknown"), ("socket ", "Unknown")] {
        assert!(root_listing.iter().any(|l| l.starts_with(entry) && l.contains(kind)), "{entry}{kind} in {root_listing:?}");
    }
    assert_eq!(root_listing.iter().filter(|l| l.starts_with("err") && l.contains("illegal-byte-sequence")).count(), 1, "the name that is not UTF-8, at its place: {root_listing:?}");
    assert!(fast_lists[2].starts_with("err") && fast_lists[3].starts_with("err"), "a missing folder, a file: {fast_lists:?}");

    // "ok N bytes in K reads, sum S": the same bytes; K one fewer where the end falls
    // inside a chunk of a regular file.
    let parse = |a: &str| -> (String, u32) {
        let (bytes, rest) = a.split_once(" in ").unwrap_or_else(|| panic!("{a}"));
        let (reads, sum) = rest.split_once(" reads, ").unwrap();
        (format!("{bytes}, {sum}"), reads.parse().unwrap())
    };
    for (i, arg) in reads.iter().enumerate() {
        let ((fast_bytes, fast_n), (general_bytes, general_n)) = (parse(&fast_reads[i]), parse(&general_reads[i]));
        assert_eq!(fast_bytes, general_bytes, "{arg}");
        let ends_inside_a_chunk = sizes.get(i).is_some_and(|(_, size)| size % 16384 != 0);
        assert_eq!(fast_n + u32::from(ends_inside_a_chunk), general_n, "{arg}: {} against {}", fast_reads[i], general_reads[i]);
    }
    assert!(!fast_reads[5].starts_with("ok 0 bytes"), "/proc/version has bytes though its size says 0: {}", fast_reads[5]);
}

#[test]
fn files_created_in_the_ledger_are_owner_only_and_project_files_are_not() {
    let s = Scratch::new("probe-modes");
    let ledger = s.path("ledger");
    let project = s.path("project");
    let mut policy = Policy::new();
    policy.preopen(&ledger, "ledger").unwrap().preopen(&project, "project").unwrap();
    let rt = probe(policy);
    assert_eq!(ask(&rt, "write", &format!("{}|password", ledger.display())), "ok");
    assert_eq!(ask(&rt, "write", &format!("{}|harvested.txt", project.display())), "ok");
    let mode = |p: PathBuf| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(ledger.join("password")), 0o600);
    assert_ne!(mode(project.join("harvested.txt")), 0o600, "a harvested project file keeps the usual mode");
}

#[test]
fn a_trap_is_host_failed_json_with_the_components_next_step() {
    let laptop = Laptop::new("trap");
    let next = boxd_host::policy::host_failed_next();
    for tool in ["trap", "oom"] {
        let run = host(&laptop, &boxd_local(), &["--component", probe_wasm().to_str().unwrap(), "call", tool, "x"], &[]);
        no_trap(&run);
        let v = run.json();
        assert_eq!((run.code, v["error"].as_str(), v["next"].as_str()), (Some(1), Some("HOST_FAILED"), Some(next)), "{tool}: {v:#}");
        assert!(v["message"].as_str().unwrap().contains(tool), "the message names the call: {v:#}");
    }
    // The component's table says the same (errors.rs; docs/configuration.md keeps it).
    let docs = std::fs::read_to_string(repo().join("docs/configuration.md")).unwrap();
    assert!(docs.lines().any(|l| l.starts_with("| `HOST_FAILED`") && l.contains(next)), "docs/configuration.md words HOST_FAILED's next step differently");
}

#[test]
fn kill_points_kill_the_host_exactly_before_or_after_the_nth_spawn() {
    let laptop = Laptop::new("killat");
    let run = host(&laptop, &boxd_local(), &["call", "boxd_status", "{}"], &[("BOXD_HOST_KILL_AT", "before-spawn:1")]);
    assert_eq!(run.signal, Some(9), "killed by SIGKILL: {}", String::from_utf8_lossy(&run.stderr));
    assert!(run.stdout.is_empty());
    assert_eq!(laptop.boxd_calls().len(), 0, "no boxd call ran: {:?}", laptop.boxd_calls());

    // boxd_status asks its two listings as one run-all batch: an after-spawn point of the
    // batch fires once both have ended (docs/architecture.md, "Kill points").
    let run = host(&laptop, &boxd_local(), &["call", "boxd_status", "{}"], &[("BOXD_HOST_KILL_AT", "after-spawn:1")]);
    assert_eq!(run.signal, Some(9));
    assert!(run.stdout.is_empty());
    assert_eq!(laptop.boxd_calls().len(), 2, "both calls of the batch ran, nothing after: {:?}", laptop.boxd_calls());

    // Without the variable the same call runs to the end.
    let _ = std::fs::remove_file(laptop.boxd_home.join("calls.jsonl"));
    let run = host(&laptop, &boxd_local(), &["call", "boxd_status", "{}"], &[]);
    assert_eq!(run.code, Some(0));
    assert!(laptop.boxd_calls().len() > 1, "boxd_status makes more than one boxd call");
}

#[test]
fn a_killed_host_takes_its_child_with_it() {
    let laptop = Laptop::new("pdeathsig");
    let pid_file = laptop.scratch.0.join("child");
    // The direct child (an `opencode import`, a `boxd machine exec`) runs long.
    let boxd = fake_boxd(&laptop, "boxd", &format!("echo $$ > {}\nexec sleep 300", pid_file.display()));
    let mut host = Command::new(boxd_host())
        .arg("--project").arg(&laptop.project).arg("--ledger").arg(&laptop.ledger).arg("--boxd").arg(&boxd)
        .args(["call", "boxd_status", "{}"])
        .env("BOXD_HOST_CACHE", cache_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let pid = loop {
        let text = std::fs::read_to_string(&pid_file).unwrap_or_default();
        if !text.trim().is_empty() {
            break text.trim().to_string();
        }
        assert!(Instant::now() < deadline, "the fake boxd never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!gone(&pid));
    host.kill().unwrap(); // SIGKILL: the host gets no chance to clean up
    host.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gone(&pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(gone(&pid), "the child {pid} outlived the killed host");
}

#[test]
fn an_old_ledgers_world_readable_passwords_are_made_owner_only() {
    let laptop = Laptop::new("old-ledger");
    let work = laptop.ledger.join("works/w1");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("password"), "pw").unwrap();
    std::fs::set_permissions(work.join("password"), std::fs::Permissions::from_mode(0o644)).unwrap();
    // Not the ledger's: a folder whose name is no work id, and a symlink to a folder outside.
    let outside = laptop.scratch.0.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, laptop.ledger.join("works/w2")).unwrap();
    std::fs::create_dir_all(laptop.ledger.join("works/my backup")).unwrap();
    for p in [outside.join("password"), laptop.ledger.join("works/my backup/password")] {
        std::fs::write(&p, "theirs").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    // The owner's own bits on the ledger folder are theirs; group and other lose theirs.
    std::fs::set_permissions(&laptop.ledger, std::fs::Permissions::from_mode(0o750)).unwrap();
    let out = laptop.host(&["audit", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&work.join("password")), 0o600);
    assert_eq!(mode(&outside.join("password")), 0o644, "a file outside the ledger, through a symlink, is untouched");
    assert_eq!(mode(&laptop.ledger.join("works/my backup/password")), 0o644, "a folder that is no work's is untouched");
    assert_eq!(mode(&laptop.ledger), 0o700);
}

/// A work.json grown (or replaced) past the 64 MiB a record may be, here a sparse 1 GiB
/// file: boxd_status answers that work's row LEDGER_FAILED, naming the file, and shows the
/// others; the component stops reading at the bound (its memory is capped).
#[test]
fn a_huge_record_is_its_own_works_error_and_status_shows_the_others() {
    let laptop = Laptop::new("huge-record");
    for work in ["w1", "whuge"] {
        std::fs::create_dir_all(laptop.ledger.join("works").join(work)).unwrap();
    }
    std::fs::write(laptop.ledger.join("works/w1/work.json"), r#"{"schema":1,"work":"w1","machine":"oc-w1","directory":"/nowhere","createdAt":"t","state":"open"}"#).unwrap();
    let huge = std::fs::File::create(laptop.ledger.join("works/whuge/work.json")).unwrap();
    huge.set_len(1 << 30).unwrap();
    let out = laptop.host(&["call", "boxd_status", "{}"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    assert!(out.status.success(), "{v:#}");
    let rows = v["works"].as_array().unwrap();
    let huge = rows.iter().find(|r| r["work"] == "whuge").unwrap_or_else(|| panic!("{v:#}"));
    assert_eq!(huge["error"], "LEDGER_FAILED", "{v:#}");
    assert!(huge["message"].as_str().unwrap().contains("holds more than 64 MiB"), "{v:#}");
    assert!(rows.iter().any(|r| r["work"] == "w1" && r.get("error").is_none()), "{v:#}");
}

/// Under a file-size limit (`ulimit -f`) below the size the host gives a child's stdout file
/// once it lets it go, a call still answers: the host ignores SIGXFSZ, so such a write fails
/// and is said, where it killed the host with nothing said (exit 153). Its children get the
/// signal back at its default (spawn tests).
#[test]
fn a_file_size_limit_leaves_a_call_answering() {
    use std::os::unix::process::CommandExt;
    let laptop = Laptop::new("fsize");
    let plain = laptop.host(&["call", "boxd_status", "{}"]);
    let mut cmd = Command::new(boxd_host());
    cmd.arg("--project").arg(&laptop.project).arg("--ledger").arg(&laptop.ledger).arg("--boxd").arg(boxd_local());
    cmd.args(["call", "boxd_status", "{}"]).env("BOXD_LOCAL_HOME", &laptop.boxd_home).env("BOXD_HOST_CACHE", cache_dir());
    // SAFETY: setrlimit(2) between fork and exec, on a local struct.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit { rlim_cur: 64 << 10, rlim_max: libc::RLIM_INFINITY };
            libc::setrlimit(libc::RLIMIT_FSIZE, &limit);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert_eq!((out.status.signal(), out.status.code()), (None, Some(0)), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout_json(&out)["boxd"], stdout_json(&plain)["boxd"]);
}
