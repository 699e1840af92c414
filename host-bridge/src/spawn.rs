//! Running one granted program: argument list (no shell), a clean environment, stdin
//! written by a thread, stdout/stderr read by threads, and on timeout the whole process
//! group killed (killing only the child would leave grandchildren holding the pipes).

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

pub struct Output {
    pub exit_code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

pub enum SpawnFailure {
    NotFound(String),
    TimedOut,
    Failed(String),
}

pub struct Spawn<'a> {
    pub binary: &'a Path,
    pub args: &'a [String],
    pub env: &'a [(String, String)],
    pub cwd: Option<&'a Path>,
    pub stdin: Option<&'a [u8]>,
    pub timeout: Duration,
}

pub fn run(s: Spawn<'_>) -> Result<Output, SpawnFailure> {
    let mut cmd = Command::new(s.binary);
    cmd.args(s.args).env_clear().envs(s.env.iter().map(|(k, v)| (k, v))).process_group(0);
    cmd.stdin(if s.stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if let Some(cwd) = s.cwd {
        cmd.current_dir(cwd);
    }
    let mut child = cmd.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => SpawnFailure::NotFound(s.binary.display().to_string()),
        _ => SpawnFailure::Failed(format!("{}: {e}", s.binary.display())),
    })?;
    let pgid = child.id() as i32;
    let writer = s.stdin.map(|bytes| {
        let mut pipe = child.stdin.take().expect("stdin is piped");
        let bytes = bytes.to_vec();
        // A child that exits without reading gives EPIPE; that is not our failure.
        thread::spawn(move || drop(pipe.write_all(&bytes)))
    });
    let read_all = |mut r: Box<dyn Read + Send>| {
        let (tx, rx) = std::sync::mpsc::channel();
        thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
        rx
    };
    let out = read_all(Box::new(child.stdout.take().expect("stdout is piped")));
    let err = read_all(Box::new(child.stderr.take().expect("stderr is piped")));

    let start = Instant::now();
    let mut pause = Duration::from_micros(50);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if start.elapsed() >= s.timeout => break None,
            Ok(None) => {
                thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(5));
            }
            Err(e) => return Err(SpawnFailure::Failed(e.to_string())),
        }
    };
    let Some(status) = status else {
        // SAFETY: kill(2) on our own child's process group; no memory is involved.
        unsafe { kill_group(pgid) };
        let _ = child.kill();
        let _ = child.wait();
        return Err(SpawnFailure::TimedOut);
    };
    // A detached grandchild that kept our pipes would block the readers forever: give
    // them a short grace period after the child exits, then go on without them.
    let grace = Duration::from_secs(2);
    let stdout = out.recv_timeout(grace).unwrap_or_default();
    let stderr = err.recv_timeout(grace).unwrap_or_default();
    drop(writer);
    Ok(Output { exit_code: status.code(), stdout, stderr })
}

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

unsafe fn kill_group(pgid: i32) {
    const SIGKILL: i32 = 9;
    unsafe {
        kill(-pgid, SIGKILL);
    }
}
