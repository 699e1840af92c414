//! `cargo bench -p boxd-host`: issue 15's table in one run (docs/performance.md). Every
//! row is a measured value beside its baseline and the ratio. The baseline of a tool is
//! the same boxd CLI invocations with the same stdin, recorded by a capturing boxd and
//! replayed directly with boxd-local; a tool
//! that changes state is replayed as a pair that ends where it began (sleep + resume), or
//! has no baseline. Needs what the host tests need (tests/bootstrap.sh) and boxd-local in
//! the same profile (built here when missing). Not run by the tests.

#[allow(dead_code)]
#[path = "../../tests/host/common.rs"]
mod common;

/// What tests/host/common.rs asks of its crate.
mod guest {
    pub fn sha256(bytes: &[u8]) -> String {
        use sha2::Digest;
        sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
    }
}

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use boxd_host::cli::Grants;
use boxd_host::session::Session;
use common::*;
use serde_json::{json, Value};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn timed(n: usize, mut f: impl FnMut()) -> Duration {
    median((0..n).map(|_| {
        let t = Instant::now();
        f();
        t.elapsed()
    }).collect())
}

/// This process's CPU time, every thread's user and system time, children excluded
/// (getrusage RUSAGE_SELF): steadier than wall time on shared cores, and it leaves out the
/// boxd CLI the call runs.
fn cpu_time() -> Duration {
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Timeval {
        sec: i64,
        usec: i64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Rusage {
        utime: Timeval,
        stime: Timeval,
        rest: [i64; 14],
    }
    unsafe extern "C" {
        fn getrusage(who: i32, usage: *mut Rusage) -> i32;
    }
    let mut r = Rusage::default();
    // SAFETY: getrusage(RUSAGE_SELF = 0) fills the struct, laid out as Linux's rusage.
    assert_eq!(unsafe { getrusage(0, &mut r) }, 0, "getrusage");
    let tv = |t: Timeval| Duration::from_secs(t.sec as u64) + Duration::from_micros(t.usec as u64);
    tv(r.utime) + tv(r.stime)
}

/// The median CPU time (`cpu_time`) of `f` over `n` runs.
fn cpu_timed(n: usize, mut f: impl FnMut()) -> Duration {
    median((0..n).map(|_| {
        let t = cpu_time();
        f();
        cpu_time() - t
    }).collect())
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// One table row: what, measured, baseline, ratio, note.
fn row(what: &str, measured: &str, baseline: &str, ratio: Option<f64>, note: &str) {
    let r = ratio.map_or("".into(), |r| format!("{r:.2}×"));
    println!("| {what} | {measured} | {baseline} | {r} | {note} |");
}

fn ratio(a: Duration, b: Duration) -> Option<f64> {
    Some(a.as_secs_f64() / b.as_secs_f64())
}

/// boxd-local beside this bench (target/<profile>/), built when missing.
fn ensure_boxd_local() {
    if target_dir().join("boxd-local").exists() {
        return;
    }
    let release = target_dir().ends_with("release");
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cargo.args(["build", "--quiet", "-p", "boxd-local"]).current_dir(repo());
    if release {
        cargo.arg("--release");
    }
    assert!(cargo.status().unwrap().success(), "building boxd-local failed");
}

/// One boxd CLI invocation as the host made it: its arguments and the bytes it fed on stdin
/// (a `prepare` exec reads the work's server password there).
#[derive(Clone)]
struct Invocation {
    argv: Vec<String>,
    stdin: Vec<u8>,
}

/// Replay invocations directly with boxd-local, each with the stdin the host gave it: as
/// lean as a script would be (the environment the host gives its children, no stdin pipe
/// or feeder thread when there is no stdin), so the ratio is the host's cost, not the
/// replay's.
fn replay(world: &World, calls: &[Invocation]) {
    for call in calls {
        let mut cmd = Command::new(boxd_local());
        let oc = opencode_bin();
        let path = format!("{}:{}", oc.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
        cmd.args(&call.argv).env_clear().envs(world.laptop_env()).env("PATH", path).env("BOXD_LOCAL_HOME", &world.laptop.boxd_home);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        if call.stdin.is_empty() {
            cmd.stdin(Stdio::null()).output().unwrap();
            continue;
        }
        let mut child = cmd.stdin(Stdio::piped()).spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let bytes = call.stdin.clone();
        let feeder = std::thread::spawn(move || drop(std::io::Write::write_all(&mut stdin, &bytes)));
        child.wait_with_output().unwrap();
        feeder.join().unwrap();
    }
}

/// Replay invocations without stdin all at once, as a script with `&` and `wait` would:
/// the baseline for a tool that runs its calls side by side (boxd_status's two listings).
fn replay_at_once(world: &World, calls: &[Invocation]) {
    let oc = opencode_bin();
    let path = format!("{}:{}", oc.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let children: Vec<_> = calls
        .iter()
        .map(|call| {
            assert!(call.stdin.is_empty(), "side by side only without stdin");
            let mut cmd = Command::new(boxd_local());
            cmd.args(&call.argv).env_clear().envs(world.laptop_env()).env("PATH", &path).env("BOXD_LOCAL_HOME", &world.laptop.boxd_home);
            cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
        })
        .collect();
    for child in children {
        child.wait_with_output().unwrap();
    }
}

/// Invocations without stdin (status's listings, which read none).
fn argv_only(calls: &[&[&str]]) -> Vec<Invocation> {
    calls.iter().map(|a| Invocation { argv: a.iter().map(|s| s.to_string()).collect(), stdin: Vec::new() }).collect()
}

/// A boxd that records each invocation's arguments and stdin, then runs boxd-local: the
/// baseline replays exactly what the host sent, stdin included.
struct Capture {
    dir: std::path::PathBuf,
    boxd: std::path::PathBuf,
}

impl Capture {
    fn new(world: &World) -> Capture {
        let root = world.laptop.scratch.0.join("capture");
        let dir = root.join("calls");
        std::fs::create_dir_all(&dir).unwrap();
        let boxd = root.join("boxd");
        let script = format!(
            "#!/bin/sh\nn=$(date +%s%N)\nprintf '%s\\0' \"$@\" > '{d}'/$n.argv\ntee '{d}'/$n.stdin | '{b}' \"$@\"\n",
            d = dir.display(),
            b = boxd_local().display()
        );
        std::fs::write(&boxd, script).unwrap();
        std::fs::set_permissions(&boxd, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        Capture { dir, boxd }
    }

    /// Run `f` (tool calls through a session on this capturing boxd) and return what it sent.
    fn invocations(&self, f: impl FnOnce()) -> Vec<Invocation> {
        for e in std::fs::read_dir(&self.dir).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
        f();
        let mut names: Vec<String> = std::fs::read_dir(&self.dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).filter(|n| n.ends_with(".argv")).collect();
        names.sort();
        names
            .iter()
            .map(|n| {
                let argv = std::fs::read(self.dir.join(n)).unwrap();
                let argv = argv.strip_suffix(&[0]).unwrap_or(&argv).split(|b| *b == 0).map(|a| String::from_utf8(a.to_vec()).unwrap()).collect();
                let stdin = std::fs::read(self.dir.join(n.replace(".argv", ".stdin"))).unwrap_or_default();
                Invocation { argv, stdin }
            })
            .collect()
    }
}

/// The in-process session a long-lived host (MCP) keeps, on this world's laptop.
fn session(world: &World, ledger: &Path) -> Session {
    session_with(world, ledger, boxd_local())
}

/// As `session`, with another boxd (the capturing one).
fn session_with(world: &World, ledger: &Path, boxd: std::path::PathBuf) -> Session {
    let grants = Grants {
        project: Some(world.laptop.project.clone()),
        ledger: Some(ledger.to_path_buf()),
        boxd: Some(boxd),
        opencode: Some(opencode_bin()),
        ..Default::default()
    };
    // As World::call: the pinned opencode first on PATH, which the guests use too.
    let oc = opencode_bin();
    let path = format!("{}:{}", oc.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let mut vars: Vec<(String, String)> = std::env::vars().filter(|(k, _)| k != "PATH").collect();
    vars.push(("PATH".into(), path));
    vars.extend(world.laptop_env());
    vars.push(("BOXD_LOCAL_HOME".into(), world.laptop.boxd_home.display().to_string()));
    Session::open_env(&grants, "boxd-host-mcp", vars).unwrap()
}

struct Tool {
    trips: Vec<Vec<String>>,
    one_shot: Duration,
}

/// One call of a long-lived host, as the MCP server makes it: timed to its answer, then the
/// next call's instance made (Session::ready_next), which the server does while the answer
/// goes out. The host CPU rows count both.
fn served(s: &mut Session, tool: &str, args: &str) -> Duration {
    let t = Instant::now();
    s.call(tool, args).unwrap().unwrap();
    let answered = t.elapsed();
    s.ready_next();
    answered
}

/// The median of `n` calls made as `served` makes them.
fn served_n(n: usize, s: &mut Session, tool: &str, args: &str) -> Duration {
    median((0..n).map(|_| served(s, tool, args)).collect())
}

/// One one-shot `boxd-host call`; its time and the boxd invocations it made.
fn one_shot(world: &World, tool: &str, args: &str) -> Tool {
    world.forget_calls();
    let t = Instant::now();
    let (code, v) = world.call(tool, args);
    let one_shot = t.elapsed();
    assert_eq!(code, 0, "{tool}: {v:#}");
    Tool { trips: world.laptop.boxd_calls(), one_shot }
}

/// A read-like tool: one-shot and in-process times against the replay of its calls (with
/// the stdin the host gave each), and the process start (`--version`) timed in the same
/// rounds, so the one-shot baseline is measured beside the call it is set against, not at
/// another moment of a machine whose speed drifts. Returns its boxd round trips.
/// `at_once`: the tool runs its calls side by side (run-all), so it is also set beside its
/// calls replayed side by side: what the host itself costs.
fn read_tool(world: &World, s: &mut Session, cap: &mut (Capture, Session), what: &str, tool: &str, args: &str, at_once: bool) -> usize {
    let first = one_shot(world, tool, args);
    let calls = cap.0.invocations(|| drop(cap.1.call(tool, args).unwrap().unwrap()));
    // As sets: calls run side by side have no order between them.
    let (mut captured, mut logged) = (calls.iter().map(|c| c.argv.clone()).collect::<Vec<_>>(), first.trips.clone());
    captured.sort();
    logged.sort();
    assert_eq!(captured, logged, "{tool}: the captured calls are the logged ones");
    // Alternated, round by round, so a noisy moment falls on every side alike; tools of a
    // few milliseconds (status) get more rounds than those of hundreds.
    let n = if first.one_shot < Duration::from_millis(50) { 41 } else { 7 };
    let (mut shots, mut inprocs, mut directs, mut togethers, mut versions) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed()
    };
    for _ in 0..n {
        // As `one_shot` times it: the call and its answer's parse, not the call log's reset
        // and read around it, which the replay does not pay.
        shots.push(one_shot(world, tool, args).one_shot);
        versions.push(process(1, &["--version"], &[]));
        inprocs.push(served(s, tool, args));
        directs.push(time(&mut || replay(world, &calls)));
        if at_once {
            togethers.push(time(&mut || replay_at_once(world, &calls)));
        }
    }
    let (shot, inproc, direct, version) = (median(shots), median(inprocs), median(directs), median(versions));
    row(&format!("{what}, long-lived host"), &ms(inproc), &ms(direct), ratio(inproc, direct), &format!("{} boxd calls", first.trips.len()));
    row(&format!("{what}, one-shot call"), &ms(shot), &format!("{} + {}", ms(direct), ms(version)), ratio(shot, direct + version), "baseline: replay plus a process start (timed in the same rounds)");
    if at_once {
        let together = median(togethers);
        let note = "its calls run side by side; baseline: the same calls replayed side by side";
        row(&format!("{what}, long-lived host, vs side by side"), &ms(inproc), &ms(together), ratio(inproc, together), note);
        row(&format!("{what}, one-shot call, vs side by side"), &ms(shot), &format!("{} + {}", ms(together), ms(version)), ratio(shot, together + version), note);
    }
    first.trips.len()
}

/// One one-shot call, arguments on stdin: (wall time, boxd-host's own peak RSS in KiB,
/// sampled from /proc/<pid>/status VmHWM until it exits — the children it runs, such as
/// the laptop's OpenCode, are not the host's memory).
fn rss_call(world: &World, tool: &str, args: &str) -> (Duration, u64) {
    let mut env = world.laptop_env();
    let oc = opencode_bin();
    env.push(("PATH".into(), format!("{}:{}", oc.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default())));
    env.push(("BOXD_LOCAL_HOME".into(), world.laptop.boxd_home.display().to_string()));
    let answer = world.laptop.scratch.0.join("answer.json");
    let started = Instant::now();
    let mut child = Command::new(boxd_host())
        .arg("--opencode").arg(&oc).arg("--project").arg(&world.laptop.project).arg("--ledger").arg(&world.laptop.ledger).arg("--boxd").arg(boxd_local())
        .args(["call", tool, "-"])
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&answer).unwrap())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), args.as_bytes()).unwrap();
    let status = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    let code = loop {
        let hwm = std::fs::read_to_string(&status).ok().and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()));
        peak = peak.max(hwm.unwrap_or(0));
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let elapsed = started.elapsed();
    assert!(code.success(), "{tool}: {}", std::fs::read_to_string(&answer).unwrap_or_default());
    (elapsed, peak)
}

/// 32 MiB in (submit) and out (harvest): 3 × 8 MiB + 200 × 40 KiB, time and peak RSS,
/// beside one `machine cp -r` of the same folder and a sha256sum over it.
fn files_32mib(world: &World) {
    let src = world.laptop.project.join("big");
    std::fs::create_dir_all(&src).unwrap();
    let mut files = Vec::new();
    let mut names = Vec::new();
    for (i, size) in (0..3).map(|i| (i, 8 << 20)).chain((3..203).map(|i| (i, 40 << 10))) {
        let name = format!("f{i:03}.bin");
        std::fs::write(src.join(&name), vec![(i % 251) as u8; size]).unwrap();
        files.push(json!({ "from": format!("big/{name}"), "to": format!("big/{name}") }));
        names.push(format!("big/{name}"));
    }
    // What the files cost: the same call with them minus without them.
    let (t0_in, _) = rss_call(world, "boxd_submit", &json!({ "work": "w1", "prompt": "no files" }).to_string());
    world.job_until_idle("w1");
    let (t_in, rss_in) = rss_call(world, "boxd_submit", &json!({ "work": "w1", "prompt": "files", "files": files }).to_string());
    world.job_until_idle("w1");
    // A submit without files on each side of it: the smaller is the call's own cost.
    let (t0_after, _) = rss_call(world, "boxd_submit", &json!({ "work": "w1", "prompt": "no files again" }).to_string());
    world.job_until_idle("w1");
    let t_in = t_in.saturating_sub(t0_in.min(t0_after));
    world.ok_call("boxd_harvest", r#"{"work":"w1"}"#); // proves both prompts: what follows has nothing new
    let (t_out, rss_out) = rss_call(world, "boxd_harvest", &json!({ "work": "w1", "files": names, "to": "back" }).to_string());
    let (t0_out, _) = rss_call(world, "boxd_harvest", r#"{"work":"w1"}"#);
    let t_out = t_out.saturating_sub(t0_out);
    // The issue's baseline, both ways: one `machine cp -r` and a sha256sum over the files.
    let cp_in = timed(3, || {
        let ok = world.laptop.boxd(&["machine", "cp", "-r", src.to_str().unwrap(), "oc-w1:copy-in"]).status.success();
        assert!(ok, "machine cp -r");
        assert!(Command::new("sh").arg("-c").arg(format!("find {} -type f -exec sha256sum {{}} + >/dev/null", src.display())).status().unwrap().success());
    });
    let dest = world.laptop.scratch.0.join("copy-out");
    let cp_out = timed(3, || {
        let _ = std::fs::remove_dir_all(&dest);
        assert!(world.laptop.boxd(&["machine", "cp", "-r", "oc-w1:copy-in", dest.to_str().unwrap()]).status.success());
        assert!(Command::new("sh").arg("-c").arg(format!("find {} -type f -exec sha256sum {{}} + >/dev/null", dest.display())).status().unwrap().success());
    });
    row("32 MiB in (submit: with the files minus without)", &ms(t_in), &format!("{} (cp -r + sha256sum)", ms(cp_in)), ratio(t_in, cp_in), &format!("boxd-host peak RSS {} MiB (goal ≤ 64)", rss_in / 1024));
    row("32 MiB out (harvest: with the files minus without)", &ms(t_out), &format!("{} (cp -r + sha256sum)", ms(cp_out)), ratio(t_out, cp_out), &format!("boxd-host peak RSS {} MiB (goal ≤ 64)", rss_out / 1024));
}

/// boxd_status with `n` works in a ledger of their own (copies of w1's record): its time,
/// its two CLI calls replayed (one after the other, and side by side, as status runs
/// them), and the host's own CPU time a call.
fn status_at(world: &World, n: usize) -> (Duration, Duration, Duration, Duration) {
    let ledger = world.laptop.scratch.0.join(format!("ledger-{n}"));
    let record: Value = serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap()).unwrap();
    for i in 0..n {
        let dir = ledger.join(format!("works/s{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut w = record.clone();
        w["work"] = json!(format!("s{i}"));
        w["machine"] = json!(format!("oc-s{i}"));
        std::fs::write(dir.join("work.json"), serde_json::to_vec(&w).unwrap()).unwrap();
    }
    let mut s = session(world, &ledger);
    served(&mut s, "boxd_status", "{}");
    let took = served_n(7, &mut s, "boxd_status", "{}");
    let listings = argv_only(&[&["machine", "list", "--json"], &["snapshots", "list", "--json"]]);
    let direct = timed(7, || replay(world, &listings));
    let together = timed(7, || replay_at_once(world, &listings));
    let cpu = cpu_timed(7, || {
        served(&mut s, "boxd_status", "{}");
    });
    (took, direct, together, cpu)
}

/// The median of `n` runs of boxd-host with `args`.
fn process(n: usize, args: &[&str], env: &[(&str, &Path)]) -> Duration {
    timed(n, || {
        let out = Command::new(boxd_host()).args(args).envs(env.iter().copied()).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    })
}

fn bridge(world: &World) {
    let bridge = repo().join("host-bridge/opencode");
    if !bridge.join("dist/worker.js").exists() {
        return row("OpenCode bridge, boxd_status", "n/a", "", None, "run npm run build in host-bridge/opencode");
    }
    // Under Node, and under Bun as OpenCode itself runs plugins (the opencode binary is Bun
    // when BUN_BE_BUN=1): there the worker runs its children with Bun.spawnSync
    // (docs/architecture.md).
    let opencode = repo().join("tests/node_modules/.bin/opencode");
    let runtimes: [(&str, Command); 2] = [("Node", Command::new("node")), ("Bun in opencode", {
        let mut c = Command::new(&opencode);
        c.env("BUN_BE_BUN", "1");
        c
    })];
    for (name, mut cmd) in runtimes {
        if name != "Node" && !opencode.exists() {
            row(&format!("OpenCode bridge under {name}, boxd_status"), "n/a", "", None, "run bash tests/bootstrap.sh (installs opencode-ai)");
            continue;
        }
        let dir = world.laptop.scratch.0.join(format!("bridge-{}", name.len()));
        let out = cmd.arg(repo().join("host-bridge/benches/bridge.mjs")).arg(boxd_local()).arg(&dir).arg("60").output().unwrap();
        assert!(out.status.success(), "bridge.mjs under {name}: {}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let (b, d, t) = (v["bridgeMs"].as_f64().unwrap(), v["directMs"].as_f64().unwrap(), v["atOnceMs"].as_f64().unwrap());
        row(&format!("OpenCode bridge under {name}, boxd_status (goal ≤ 1.15×)"), &format!("{b:.2} ms"), &format!("{d:.2} ms"), Some(b / d), "jco in a worker, a ready instance per call");
        row(&format!("OpenCode bridge under {name}, vs side by side"), &format!("{b:.2} ms"), &format!("{t:.2} ms"), Some(b / t), "baseline: the two calls replayed side by side");
    }
}

/// The process runner's cost a child: `/bin/true` through spawn::run (its own group,
/// PDEATHSIG, caps, stdout into a file) beside std's `Command::output()` of the same.
fn runner() {
    let bin = std::path::Path::new("/bin/true");
    let runner = timed(200, || {
        let s = boxd_host::spawn::Spawn { name: "true", binary: bin, args: &[], env: &[], cwd: None, stdin: None, timeout: Duration::from_secs(10), bounds: Default::default() };
        assert_eq!(boxd_host::spawn::run(s).ok().and_then(|o| o.exit_code), Some(0));
    });
    let std = timed(200, || assert!(Command::new(bin).env_clear().output().unwrap().status.success()));
    row("process runner, one child (`/bin/true`)", &ms(runner), &format!("{} (std `output()`)", ms(std)), ratio(runner, std), "own group, PDEATHSIG, caps, stdout into a file");
}

/// The table's sections; `cargo bench -p boxd-host -- SECTION…` prints only those named
/// (the process start is always measured: other rows use it as their baseline).
const SECTIONS: [&str; 7] = ["start", "reads", "tools", "works", "bridge", "files", "drop"];

/// Whether this run prints `section`: every section when none is named on the command line.
fn wants(section: &str) -> bool {
    let named: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    for n in &named {
        assert!(SECTIONS.contains(&n.as_str()), "unknown section {n}; the sections are {}", SECTIONS.join(", "));
    }
    named.is_empty() || named.iter().any(|n| n == section)
}

/// boxd-host as `cargo install` leaves it: a copy of the linked file (`std::fs::copy`, as
/// cargo install copies it), and no compiled copy of the component in the cache until its
/// first start writes one, as after an install. The linker writes target/…/boxd-host in
/// small pieces and the page cache keeps that file in 4 KiB pages, where a copy is kept in
/// 64 KiB ones; a one-shot call faults in a few hundred pages of code, and from the linked
/// file it took ~0.3 ms longer (docs/performance.md). Points BOXD_HOST_BIN at the copy.
fn installed(bin: &Scratch) {
    let copy = bin.0.join("boxd-host");
    std::fs::create_dir_all(&bin.0).unwrap();
    std::fs::copy(boxd_host(), &copy).unwrap();
    let prefix = &boxd_host::COMPONENT_SHA256[..16];
    for e in std::fs::read_dir(cache_dir()).unwrap() {
        let path = e.unwrap().path();
        if path.file_name().unwrap().to_string_lossy().starts_with(prefix) {
            // Another run may have removed it first: either way it is gone.
            let _ = std::fs::remove_file(&path);
        }
    }
    // SAFETY: the bench's first step, before it starts any thread.
    unsafe { std::env::set_var("BOXD_HOST_BIN", &copy) };
}

fn main() {
    ensure_boxd_local();
    let bin = Scratch::new("bench-bin");
    installed(&bin);
    let started = Instant::now();
    let world = World::new("bench");
    println!("component: {} bytes; boxd-host: {} (a copy, as installed); boxd-local: {}", boxd_host::COMPONENT.len(), boxd_host().display(), boxd_local().display());
    println!();
    println!("| what | measured | baseline | ratio | note |");
    println!("|---|---|---|---|---|");

    // Process start and describe: cold (an empty compiled cache: the built-in component
    // comes compiled by build.rs) and warm; at the end, the same component given as a file,
    // which is compiled at its first start (the cost build.rs takes off the built-in one).
    let version = process(9, &["--version"], &[]);
    row("`boxd-host --version` (process start)", &ms(version), "", None, "");
    let cold = wants("start").then(|| start(&world));
    world.ok_call("boxd_ensure", r#"{"work":"w1"}"#);
    let mut s = session(&world, &world.laptop.ledger);
    let capture = Capture::new(&world);
    let capture_session = session_with(&world, &world.laptop.ledger, capture.boxd.clone());
    let mut cap = (capture, capture_session);
    let mut trips = Vec::new();
    if wants("reads") {
        trips.extend([
            ("status", read_tool(&world, &mut s, &mut cap, "boxd_status", "boxd_status", "{}", true)),
            ("ensure-adopt", read_tool(&world, &mut s, &mut cap, "boxd_ensure (adopt)", "boxd_ensure", r#"{"work":"w1"}"#, false)),
            ("job", read_tool(&world, &mut s, &mut cap, "boxd_job", "boxd_job", r#"{"work":"w1"}"#, false)),
        ]);
    }
    // A prompt submitted and harvested: the record status_at copies is a used work's.
    if wants("tools") || wants("works") || wants("drop") {
        tools(&world, &mut s, &mut cap, &mut trips);
    }
    if wants("works") {
        for n in [1, 50, 500] {
            let (took, direct, together, cpu) = status_at(&world, n);
            let note = format!("{} beyond its two CLI calls side by side ({}); host CPU {} a call", ms(took.saturating_sub(together)), ms(together), ms(cpu));
            row(&format!("boxd_status at {n} works, long-lived host"), &ms(took), &ms(direct), ratio(took, direct), &note);
        }
    }
    if wants("bridge") {
        bridge(&world);
    }
    if wants("files") {
        files_32mib(&world);
    }
    if wants("drop") {
        world.ok_call("boxd_harvest", r#"{"work":"w1"}"#);
        world.forget_calls();
        let t = Instant::now();
        let (_, v) = world.call("boxd_drop", r#"{"work":"w1"}"#);
        let answer = v["error"].as_str().map_or("dropped".to_string(), |e| format!("answered {e}"));
        row("boxd_drop, one-shot", &ms(t.elapsed()), "", None, &format!("{} boxd calls; {answer}", world.laptop.boxd_calls().len()));
        trips.push(("drop", world.laptop.boxd_calls().len()));
    }
    if let Some(cold) = cold {
        compiled_start(&world, cold);
    }
    println!();
    let trips: Vec<String> = trips.iter().map(|(t, n)| format!("{t} {n}")).collect();
    println!("boxd round trips per tool: {}", trips.join(", "));
    println!("whole run: {:.0} s", started.elapsed().as_secs_f64());
}

/// Describe, cold (an empty compiled cache: the built-in component comes compiled by
/// build.rs) and warm; the same component given as a file, which is compiled at its first
/// start (the cost build.rs takes off the built-in one); the process runner.
/// Returns the cold describe, which the compiled start (`compiled_start`) is set against.
fn start(world: &World) -> Duration {
    let cold = cold_describe(world, &[]);
    let warm = process(9, &["describe"], &[("BOXD_HOST_CACHE", cache_dir())]);
    row("describe, cold / warm cache", &format!("{} / {}", ms(cold), ms(warm)), "", ratio(cold, warm), "the built-in component is compiled at build time");
    runner();
    cold
}

/// `describe` with an empty compiled cache (the median of 3).
fn cold_describe(world: &World, extra: &[&str]) -> Duration {
    let empty = world.laptop.scratch.0.join("empty-cache");
    timed(3, || {
        let _ = std::fs::remove_dir_all(&empty);
        let out = Command::new(boxd_host()).args(extra).arg("describe").env("BOXD_HOST_CACHE", &empty).output().unwrap();
        assert!(out.status.success());
    })
}

/// The component given as a file, compiled at its first start. Measured last: Cranelift's
/// ~0.35 s over hundreds of MB made the one-shot calls measured right after it read
/// 0.04-0.36 ms slower on the project machine, a VM (docs/performance.md).
fn compiled_start(world: &World, cold: Duration) {
    let file = world.laptop.scratch.0.join("component.wasm");
    std::fs::write(&file, boxd_host::COMPONENT).unwrap();
    let compiled = cold_describe(world, &["--component", file.to_str().unwrap()]);
    row("describe --component (compiled at its first start)", &ms(compiled), &ms(cold), ratio(compiled, cold), "Cranelift; the built-in one skips this; measured last");
}

/// Submit, harvest, sleep + resume and image, in that order (each needs the one before).
fn tools(world: &World, s: &mut Session, cap: &mut (Capture, Session), trips: &mut Vec<(&'static str, usize)>) {
    std::fs::write(world.laptop.project.join("a.txt"), "a").unwrap();
    let submit = one_shot(world, "boxd_submit", r#"{"work":"w1","prompt":"hello","files":[{"from":"a.txt","to":"a.txt"}]}"#);
    world.job_until_idle("w1");
    row("boxd_submit, one-shot", &ms(submit.one_shot), "", None, &format!("{} boxd calls; no replay (it queues a prompt)", submit.trips.len()));
    let harvest = one_shot(world, "boxd_harvest", r#"{"work":"w1"}"#);
    row("boxd_harvest (a new prompt), one-shot", &ms(harvest.one_shot), "", None, &format!("{} boxd calls; imports and proves on the laptop", harvest.trips.len()));
    trips.push(("harvest", read_tool(world, s, cap, "boxd_harvest, nothing new", "boxd_harvest", r#"{"work":"w1"}"#, false)));

    // Sleep and resume as a pair that ends where it began, against their calls replayed.
    let pair = |world: &World| -> (Tool, Tool) { (one_shot(world, "boxd_sleep", r#"{"work":"w1"}"#), one_shot(world, "boxd_resume", r#"{"work":"w1"}"#)) };
    let (sleep, resume) = pair(world);
    // Each call as `one_shot` times it (not the call log's reset and read around it), with a
    // process start timed in each round (as read_tool does).
    let mut versions = Vec::new();
    let shot = median((0..5).map(|_| {
        let (sleep, resume) = pair(world);
        versions.push(process(1, &["--version"], &[]));
        sleep.one_shot + resume.one_shot
    }).collect());
    let version = median(versions);
    let inproc = median((0..5).map(|_| served(s, "boxd_sleep", r#"{"work":"w1"}"#) + served(s, "boxd_resume", r#"{"work":"w1"}"#)).collect());
    let calls = cap.0.invocations(|| {
        cap.1.call("boxd_sleep", r#"{"work":"w1"}"#).unwrap().unwrap();
        cap.1.call("boxd_resume", r#"{"work":"w1"}"#).unwrap().unwrap();
    });
    assert_eq!(calls.len(), sleep.trips.len() + resume.trips.len(), "the captured pair is the logged one");
    let direct = timed(5, || replay(world, &calls));
    let note = format!("{} + {} boxd calls", sleep.trips.len(), resume.trips.len());
    row("boxd_sleep + boxd_resume, long-lived host", &ms(inproc), &ms(direct), ratio(inproc, direct), &note);
    row("boxd_sleep + boxd_resume, one-shot", &ms(shot), &format!("{} + 2 × {}", ms(direct), ms(version)), ratio(shot, direct + version * 2), &note);

    let image = one_shot(world, "boxd_image", r#"{"work":"w1","name":"bench-image"}"#);
    row("boxd_image, one-shot", &ms(image.one_shot), "", None, &format!("{} boxd calls", image.trips.len()));

    trips.extend([("submit", submit.trips.len()), ("sleep", sleep.trips.len()), ("resume (wake)", resume.trips.len()), ("image", image.trips.len())]);
}
