//! `machine exec`: the command words joined with spaces into one line and run by `sh -c` in
//! the machine's home, with a clean environment that carries the machine marker. The state
//! lock is held only to check (and wake) the machine and to record the session — never while
//! the command runs, so execs run side by side.

use crate::app::Ctx;
use crate::envvars;
use crate::fail::{Fail, Res};
use crate::power;
use crate::procs::{self, MARKER};
use crate::util;
use serde::Serialize;
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[derive(Serialize)]
struct ExecDoc {
    output: String,
    exit_code: i32,
}

/// A signal delivered to boxd-local while the command runs, to pass on to it.
static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    PENDING_SIGNAL.store(sig, Ordering::SeqCst);
}

fn forward_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

fn parse_pairs(pairs: Vec<&str>) -> Res<Vec<(String, String)>> {
    pairs
        .into_iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if envvars::valid_name(k) => Ok((k.to_string(), v.to_string())),
            _ => Err(Fail::usage(format!("invalid -e '{p}': expected KEY=VALUE"), "hint: -e NAME=value, repeatable")),
        })
        .collect()
}

fn parse_timeout(raw: &str) -> Res<Duration> {
    raw.strip_suffix('s')
        .unwrap_or(raw)
        .parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0 && s.is_finite())
        .map(Duration::from_secs_f64)
        .ok_or_else(|| Fail::usage(format!("invalid --timeout '{raw}'"), "hint: --timeout SECS, e.g. --timeout 30"))
}

pub fn exec(ctx: &Ctx) -> Res<i32> {
    let inv = ctx.inv;
    let name = inv.args[0].as_str();
    let line = inv.command.join(" ");
    let timeout = inv.value("--timeout").map(parse_timeout).transpose()?;
    let pairs = parse_pairs(inv.values("-e"))?;
    let tty = inv.has("-t");
    let me = procs::self_session();

    let (id, vars) = {
        let mut lock = ctx.home.lock()?;
        let now = util::now_ms();
        let i = lock.state.visible(name, now)?;
        let m = &mut lock.state.machines[i];
        power::ready_for_session(m, now)?;
        m.last_activity_ms = now;
        m.sessions.push(me.clone());
        let id = m.id.clone();
        let vars = envvars::session_env(&lock.state.env);
        lock.save()?;
        (id, vars)
    };
    let result = run(ctx, name, &id, &line, vars, pairs, timeout, tty);
    power::end_session(ctx.home, &id, &me);
    result
}

/// The machine's temporary folder, made here rather than at create (machines made before
/// it had none), and only inside a machine folder that is still there: a machine removed
/// meanwhile is "not found", not half made again. Anything else at its place (the machine's
/// programs can reach it as `$TMPDIR/..`) is replaced, so `mktemp` never fails on it.
fn machine_tmp(ctx: &Ctx, name: &str, id: &str) -> Res<PathBuf> {
    let tmp = ctx.home.machine_tmp(id);
    let making = |e| Fail::io(format!("making the temporary folder of '{name}'"), e);
    match std::fs::symlink_metadata(&tmp) {
        Ok(m) if m.is_dir() => return Ok(tmp),
        Ok(_) => std::fs::remove_file(&tmp).map_err(making)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(making(e)),
    }
    match std::fs::create_dir(&tmp) {
        Ok(()) => Ok(tmp),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tmp.is_dir() => Ok(tmp),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Fail::not_found(name)),
        Err(e) => Err(making(e)),
    }
}

#[allow(clippy::too_many_arguments)]
fn run(
    ctx: &Ctx,
    name: &str,
    id: &str,
    line: &str,
    vars: Vec<(String, String)>,
    pairs: Vec<(String, String)>,
    timeout: Option<Duration>,
    tty: bool,
) -> Res<i32> {
    let home = ctx.home.machine_home(id);
    let tmp = machine_tmp(ctx, name, id)?;
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".to_string());
    let mut cmd = Command::new("/bin/sh");
    // --tty merges stderr into stdout, as a pty would.
    let script = if tty { format!("exec 2>&1\n{line}") } else { line.to_string() };
    cmd.arg("-c").arg(script).current_dir(&home).env_clear();
    cmd.env("PATH", format!("{}/.local/bin:{path}", home.display()))
        .env("HOME", &home)
        .env("USER", "boxd")
        .env("TMPDIR", &tmp)
        .env("BOXD_VM_NAME", name)
        .env("BOXD_VM_ID", id)
        .env("LANG", "C.UTF-8");
    if tty && let Ok(term) = std::env::var("TERM") {
        cmd.env("TERM", term);
    }
    cmd.envs(vars).envs(pairs);
    // Last, so neither `boxd env` nor -e can take a process out of its machine.
    cmd.env(MARKER, id);
    // Own process group (so --timeout kills the command's group) — except on a terminal,
    // where a background group reading the tty would be stopped by SIGTTIN.
    let own_group = !util::is_tty(0);
    if own_group {
        cmd.process_group(0);
    }
    cmd.stdin(Stdio::inherit()).stderr(Stdio::inherit());
    cmd.stdout(if ctx.out.json { Stdio::piped() } else { Stdio::inherit() });

    forward_signals();
    let mut child = cmd.spawn().map_err(|e| Fail::io(format!("starting sh in '{name}'"), e))?;
    let pid = child.id() as i32;
    let kill = move |sig: i32| {
        // SAFETY: plain kill(2) on our child or its group.
        unsafe {
            libc::kill(if own_group { -pid } else { pid }, sig);
        }
    };
    let output = child.stdout.take().map(|mut pipe| {
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || {
            let mut buf = [0u8; 64 * 1024];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        rx
    });
    let (tx, rx) = mpsc::channel::<std::io::Result<ExitStatus>>();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });

    let deadline = timeout.map(|t| Instant::now() + t);
    let mut term_sent: Option<Instant> = None;
    let status = loop {
        match rx.recv_timeout(Duration::from_millis(10)) {
            Ok(st) => break st.map_err(|e| Fail::io("waiting for the command", e))?,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err(Fail::new("lost the connection to the machine")),
        }
        let sig = PENDING_SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            kill(sig);
        }
        match (deadline, term_sent) {
            // The platform's way: TERM the group, then KILL it a second later.
            (Some(d), None) if Instant::now() >= d => {
                kill(libc::SIGTERM);
                term_sent = Some(Instant::now());
            }
            (_, Some(t)) if t.elapsed() >= Duration::from_secs(1) => kill(libc::SIGKILL),
            _ => {}
        }
    };
    let code = if term_sent.is_some() {
        124
    } else {
        status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
    };
    if let Some(t) = timeout
        && code == 124
        && term_sent.is_some()
    {
        eprintln!("error: command timed out after {}s", t.as_secs_f64());
    }
    if let Some(rx) = output {
        let mut bytes = Vec::new();
        // A background job may keep the pipe open forever: stop reading once it goes quiet.
        while let Ok(chunk) = rx.recv_timeout(Duration::from_millis(200)) {
            bytes.extend(chunk);
        }
        ctx.out.doc(&ExecDoc { output: String::from_utf8_lossy(&bytes).into_owned(), exit_code: code });
    }
    Ok(code)
}
