//! Shared test harness: a temporary `BOXD_LOCAL_HOME` per test, a runner for the built
//! binary, and cleanup that removes every machine (killing its processes) at the end.
#![allow(dead_code)]

use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_boxd-local");

static COUNTER: AtomicUsize = AtomicUsize::new(0);

pub struct Run {
    pub code: i32,
    pub raw: Vec<u8>,
    pub out: String,
    pub err: String,
}

pub struct Home {
    pub dir: PathBuf,
    pub env: Vec<(String, String)>,
}

impl Home {
    pub fn new(tag: &str) -> Home {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("boxd-local-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Home { dir, env: Vec::new() }
    }

    /// A command with a clean boxd environment: no token, faults or noise from outside.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("BOXD_LOCAL_HOME", &self.dir)
            .env_remove("BOXD_TOKEN")
            .env_remove("BOXD_LOCAL_FAULTS")
            .env_remove("BOXD_LOCAL_NOISE")
            .stdin(Stdio::null());
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    pub fn run(&self, args: &[&str]) -> Run {
        finish(self.cmd(args).output().expect("run boxd-local"))
    }

    pub fn run_in(&self, args: &[&str], stdin: &[u8]) -> Run {
        let mut child = self
            .cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        let data = stdin.to_vec();
        let writer = std::thread::spawn(move || {
            let _ = input.write_all(&data);
        });
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap();
        finish(out)
    }

    /// Run, insist on exit 0.
    pub fn ok(&self, args: &[&str]) -> Run {
        let r = self.run(args);
        assert_eq!(r.code, 0, "boxd {args:?} failed: stdout={} stderr={}", r.out, r.err);
        r
    }

    /// Run with --json, insist on exit 0, parse stdout.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.push("--json");
        let r = self.ok(&a);
        serde_json::from_str(&r.out).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {:?}", r.out))
    }

    /// Run, insist on exit 1 and a single `error:` line; return that line.
    pub fn fails(&self, args: &[&str]) -> String {
        let r = self.run(args);
        assert_eq!(r.code, 1, "boxd {args:?} should fail: stdout={} stderr={}", r.out, r.err);
        let first = r.err.lines().next().unwrap_or("").to_string();
        assert!(first.starts_with("error: "), "stderr: {}", r.err);
        first
    }

    pub fn status(&self, name: &str) -> String {
        self.json(&["machine", "get", name])["status"].as_str().unwrap().to_string()
    }

    /// The host folder that is the machine's /home/boxd.
    pub fn machine_home(&self, name: &str) -> PathBuf {
        let id = self.json(&["machine", "get", name])["id"].as_str().unwrap().to_string();
        self.dir.join("machines").join(id).join("home")
    }

    pub fn calls(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("calls.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("call log line is JSON"))
            .collect()
    }

    pub fn write_faults(&self, rules: Value) {
        std::fs::write(self.dir.join("faults.json"), rules.to_string()).unwrap();
    }

    pub fn faults(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.dir.join("faults.json")).unwrap()).unwrap()
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        // Remove every machine, so no test leaves processes behind.
        let _ = std::fs::remove_file(self.dir.join("faults.json"));
        let out = self.cmd(&["machine", "list", "--json", "--token", "t"]).output();
        if let Ok(out) = out
            && let Ok(Value::Array(list)) = serde_json::from_slice::<Value>(&out.stdout)
        {
            for m in list {
                let name = m["name"].as_str().unwrap_or_default();
                let _ = self.cmd(&["machine", "remove", name, "-y", "--token", "t"]).output();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn finish(out: std::process::Output) -> Run {
    Run {
        code: out.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
        raw: out.stdout,
    }
}

/// The process state letter from /proc/PID/stat (`T` = stopped), None once it is gone.
pub fn proc_state(pid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    rest.chars().next().filter(|c| *c != 'Z')
}

/// Held by a stop (hibernate, pause): stopped (`T`), or blocked in the kernel (`D`) with a
/// SIGSTOP pending, which it takes as it leaves. A shell that forked with vfork waits in `D`
/// until its child execs, and a stop that caught the child before its exec keeps it there
/// (seen under load: the counter's shell, its `sleep` stopped in between); it runs no more
/// than a stopped process until the machine is continued.
pub fn held(pid: i32) -> bool {
    match proc_state(pid) {
        Some('T') => true,
        Some('D') => {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let pending = |key: &str| status.lines().find_map(|l| l.strip_prefix(key)).and_then(|m| u64::from_str_radix(m.trim(), 16).ok()).unwrap_or(0);
            (pending("ShdPnd:") | pending("SigPnd:")) & (1 << (libc::SIGSTOP - 1)) != 0
        }
        _ => false,
    }
}

/// Poll until `f` holds or the named wait times out.
pub fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("timed out waiting for {what}");
}

/// Start a background counter in machine `name` via exec (setsid, so it outlives the exec);
/// returns its pid and the counter file on the host.
pub fn start_counter(h: &Home, name: &str) -> (i32, PathBuf) {
    h.ok(&[
        "machine", "exec", name, "--",
        "setsid sh -c 'echo $$ > counter.pid; while :; do echo tick >> counter; sleep 0.02; done' </dev/null >/dev/null 2>&1 &",
    ]);
    let home = h.machine_home(name);
    let pid_file = home.join("counter.pid");
    wait_for("the counter to start", 5, || {
        std::fs::read_to_string(&pid_file).is_ok_and(|s| s.ends_with('\n')) && home.join("counter").exists()
    });
    let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    (pid, home.join("counter"))
}

pub fn lines(p: &Path) -> usize {
    std::fs::read_to_string(p).map(|s| s.lines().count()).unwrap_or(0)
}

/// Field names and JSON types of an object, for shape assertions.
pub fn assert_shape(v: &Value, fields: &[(&str, &str)]) {
    let obj = v.as_object().unwrap_or_else(|| panic!("not an object: {v}"));
    let mut want: Vec<&str> = fields.iter().map(|(k, _)| *k).collect();
    let mut got: Vec<&str> = obj.keys().map(String::as_str).collect();
    want.sort();
    got.sort();
    assert_eq!(got, want, "fields of {v}");
    for (k, ty) in fields {
        let ok = match *ty {
            "string" => obj[*k].is_string(),
            "number" => obj[*k].is_u64() || obj[*k].is_i64(),
            "bool" => obj[*k].is_boolean(),
            "null" => obj[*k].is_null(),
            "array" => obj[*k].is_array(),
            _ => false,
        };
        assert!(ok, "{k} should be a {ty} in {v}");
    }
}
