//! The contract run against one boxd CLI: the checks in order on one throwaway machine,
//! each ending in a verdict, and the cleanup of everything the run made. What was made is
//! noted *before* the call that makes it, so a call that times out (and may land later)
//! is still cleaned up.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::contract::{ROWS, SIGN_OUT_ROW};
use super::runner::{shorten, Boxd, Seen};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Held,
    Differs { expected: String, seen: String },
    CouldNot(String),
}

impl Verdict {
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Held => "held",
            Verdict::Differs { .. } => "differs",
            Verdict::CouldNot(_) => "could not check",
        }
    }
}

/// The names one run makes; fresh and random, checked absent before anything is made.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Names {
    pub machine: String,
    pub snapshot: String,
    pub var: String,
    pub value: String,
}

impl Names {
    pub fn fresh() -> Names {
        let hex: String = crate::session::entropy().iter().take(12).map(|b| format!("{b:02x}")).collect();
        let (id, value) = hex.split_at(12);
        Names {
            machine: format!("live-check-{id}"),
            snapshot: format!("live-check-{id}"),
            var: format!("LIVE_CHECK_{id}"),
            value: value.to_string(),
        }
    }
}

/// What this run may have made (set before the call that makes it).
#[derive(Debug, Default, Clone, Copy)]
pub struct Made {
    pub machine: bool,
    pub snapshot: bool,
    pub var: bool,
}

pub struct Checks<'r, 'a> {
    boxd: &'r mut Boxd<'a>,
    names: Names,
    golden: String,
    stop: &'r AtomicBool,
    pub verdicts: BTreeMap<u8, Verdict>,
    pub made: Made,
    /// Row 2: the first `--json` answer whose document did not start a line, if any.
    noise_breaks: Option<String>,
    golden_present: bool,
    /// Row 8's background process, checked again by row 9.
    pid: Option<u32>,
}

type Step = Result<(), ()>;

impl<'r, 'a> Checks<'r, 'a> {
    pub fn new(boxd: &'r mut Boxd<'a>, names: Names, golden: String, stop: &'r AtomicBool) -> Self {
        Checks { boxd, names, golden, stop, verdicts: BTreeMap::new(), made: Made::default(), noise_breaks: None, golden_present: false, pid: None }
    }

    pub fn names(&self) -> &Names {
        &self.names
    }

    /// The first verdict of a row stands.
    fn set(&mut self, id: u8, v: Verdict) {
        self.verdicts.entry(id).or_insert(v);
    }

    fn differs(&mut self, id: u8, expected: impl Into<String>, seen: impl Into<String>) {
        self.set(id, Verdict::Differs { expected: expected.into(), seen: seen.into() });
    }

    /// Record a verdict that ends the step (`Err`) or lets the run go on (`Ok`).
    fn stop_with(&mut self, id: u8, v: Verdict) -> Step {
        self.set(id, v);
        Err(())
    }

    fn go_on_with(&mut self, id: u8, v: Verdict) -> Step {
        self.set(id, v);
        Ok(())
    }

    fn differing(expected: &str, seen: String) -> Verdict {
        Verdict::Differs { expected: expected.into(), seen }
    }

    fn judge(&mut self, id: u8, ok: bool, expected: &str, seen: impl FnOnce() -> String) {
        if ok { self.set(id, Verdict::Held) } else { self.differs(id, expected, seen()) }
    }

    /// A `--json` call answered 0 with its document, or `Err` after setting `id`'s verdict.
    fn json(&mut self, id: u8, args: &[&str]) -> Result<(Seen, Value), ()> {
        match self.boxd.call(args) {
            Err(why) => {
                self.set(id, Verdict::CouldNot(format!("boxd {}: {why}", args.join(" "))));
                Err(())
            }
            Ok(seen) if !seen.ok() => {
                self.differs(id, format!("boxd {} answers exit 0", args.join(" ")), seen.brief());
                Err(())
            }
            Ok(seen) => match seen.json() {
                Some(v) => Ok((seen, v)),
                None => {
                    self.noise_breaks.get_or_insert_with(|| shorten(&seen.stdout, 160));
                    self.differs(id, "a JSON document", seen.brief());
                    Err(())
                }
            },
        }
    }

    fn exec(&mut self, words: &[&str], stdin: Option<&[u8]>, secs: u64) -> Result<Seen, String> {
        let t = secs.to_string();
        let mut args = vec!["machine", "exec", &self.names.machine, "--timeout", &t, "--"];
        args.extend_from_slice(words);
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let timeout = self.boxd.timeout.max(Duration::from_secs(secs + 30));
        self.boxd.call_with(&args, stdin, timeout)
    }

    /// An exec whose answer `id` judges; `Err` (verdict set) when it gave none.
    fn exec_for(&mut self, id: u8, words: &[&str], stdin: Option<&[u8]>) -> Result<Seen, ()> {
        self.exec(words, stdin, 60).map_err(|why| self.set(id, Verdict::CouldNot(format!("exec: {why}"))))
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Before anything is made: the names are free, the account answers. `Err` says why
    /// the run cannot start (nothing was made).
    pub fn preflight(&mut self) -> Result<(), String> {
        let m = self.names.machine.clone();
        let seen = self.boxd.call(&["machine", "get", &m, "--json"]).map_err(|why| format!("boxd machine get: {why}"))?;
        if seen.ok() {
            return Err(format!("a machine named {m} already exists; live-check touches only what it makes"));
        }
        let line = seen.error_line().unwrap_or_default().to_string();
        if !line.contains("not found") {
            return Err(format!("boxd machine get {m} --json: {}", seen.brief()));
        }
        let want = format!("error: VM '{m}' not found");
        self.judge(5, seen.code == Some(1) && line == want, &format!("exit 1, `{want}`"), || seen.brief());
        let (_, snaps) = self.json(11, &["snapshots", "list", "--json"]).map_err(|_| self.reason(11))?;
        if named(&snaps, &self.names.snapshot).is_some() {
            return Err(format!("a snapshot named {} already exists", self.names.snapshot));
        }
        self.golden_present = named(&snaps, &self.golden).is_some();
        let (_, vars) = self.json(13, &["env", "list", "--json"]).map_err(|_| self.reason(13))?;
        if named(&vars, &self.names.var).is_some() {
            return Err(format!("an env var named {} already exists", self.names.var));
        }
        Ok(())
    }

    fn reason(&self, id: u8) -> String {
        match self.verdicts.get(&id) {
            Some(Verdict::CouldNot(w)) => w.clone(),
            Some(Verdict::Differs { seen, .. }) => seen.clone(),
            _ => "no answer".into(),
        }
    }

    /// Every check but the sign-out one, in order; stops early on Ctrl-C or a missing machine.
    pub fn run(&mut self) {
        let steps: [fn(&mut Self) -> Step; 11] = [
            Self::create,
            Self::get,
            Self::list,
            Self::exec_basics,
            Self::env,
            Self::background,
            Self::hibernate,
            Self::config,
            Self::save,
            Self::remove,
            Self::noise,
        ];
        for step in steps {
            if self.stopped() {
                break;
            }
            if step(self).is_err() {
                break;
            }
        }
        let why = if self.stopped() { "interrupted" } else { "not reached: an earlier check failed" };
        for r in ROWS.iter().filter(|r| r.id != SIGN_OUT_ROW) {
            self.set(r.id, Verdict::CouldNot(why.into()));
        }
    }

    fn create(&mut self) -> Step {
        let m = self.names.machine.clone();
        let golden = self.golden.clone();
        let mut args = vec!["machine", "new", m.as_str()];
        if self.golden_present {
            args.extend(["--from-snapshot", golden.as_str()]);
        } else {
            self.set(3, Verdict::CouldNot(format!("no snapshot '{golden}': build it with `boxd-host golden`, or name one with --snapshot")));
        }
        args.extend(["--auto-hibernate-timeout", "1800", "--json"]);
        self.made.machine = true;
        let (_, v) = self.json(3, &args)?;
        let keys = ["name", "id", "url", "source", "boot"].iter().all(|k| v.get(k).is_some());
        self.judge(3, keys && v["name"] == m.as_str(), "`{name,id,url,source,boot}` naming $M", || shorten(&v.to_string(), 160));
        self.wait_running()
    }

    /// Until `get` shows the machine running (a `"boot":"timeout"` create lands later).
    fn wait_running(&mut self) -> Step {
        let deadline = Instant::now() + self.boxd.timeout;
        let m = self.names.machine.clone();
        loop {
            if let Ok(seen) = self.boxd.call(&["machine", "get", &m, "--json"])
                && seen.json().is_some_and(|v| v["status"] == "running")
            {
                return Ok(());
            }
            if Instant::now() > deadline || self.stopped() {
                self.set(4, Verdict::CouldNot(format!("{m} was not running within {} s", self.boxd.timeout.as_secs())));
                return Err(());
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    fn get(&mut self) -> Step {
        let m = self.names.machine.clone();
        let (_, v) = self.json(4, &["machine", "get", &m, "--json"])?;
        let id_ok = v["id"].as_str().is_some_and(|s| !s.is_empty());
        let want = [("status", "running"), ("sharing", "private"), ("isolated", "no"), ("auto_hibernate", "1800s")];
        let fields = want.iter().all(|(k, x)| v[*k] == *x);
        self.judge(4, id_ok && fields, row_expected(4), || shorten(&v.to_string(), 200));
        Ok(())
    }

    fn list(&mut self) -> Step {
        let (_, v) = self.json(1, &["machine", "list", "--json"])?;
        let keys = ["name", "status", "url", "source", "sharing"];
        let shaped = v.as_array().is_some_and(|a| a.iter().all(|e| keys.iter().all(|k| e[*k].is_string())));
        let holds = named(&v, &self.names.machine).is_some();
        self.judge(1, shaped && holds, row_expected(1), || shorten(&v.to_string(), 200));
        Ok(())
    }

    /// Rows 6, 7, 14 and 15: what one exec does.
    fn exec_basics(&mut self) -> Step {
        let s = self.exec_for(6, &["sh", "-c", "'cat; echo err >&2; exit 42'"], Some(b"a b"))?;
        let ok = s.stdout == "a b" && s.stderr.lines().any(|l| l == "err") && s.code == Some(42);
        self.judge(6, ok, row_expected(6), || format!("stdout {:?}, stderr {:?}, exit {:?}", s.stdout, shorten(&s.stderr, 80), s.code));
        match self.exec(&["sleep", "10"], None, 2) {
            Ok(s) => self.judge(7, s.code == Some(124), "exit 124", || s.brief()),
            Err(why) => self.set(7, Verdict::CouldNot(why)),
        }
        let s = self.exec_for(14, &["sh", "-c", "'pwd; echo \"$HOME\"; test -w . && echo writable'"], None)?;
        let lines: Vec<&str> = s.stdout.lines().collect();
        let ok = s.ok() && lines.len() == 3 && lines[0] == lines[1] && lines[2] == "writable";
        self.judge(14, ok, row_expected(14), || s.brief());
        let s = self.exec_for(15, &["sh", "-c", "'for c in python3 git curl tar sha256sum; do command -v $c >/dev/null || echo missing: $c; done'"], None)?;
        self.judge(15, s.ok() && s.stdout.trim().is_empty(), row_expected(15), || s.brief());
        Ok(())
    }

    fn env(&mut self) -> Step {
        let (var, value) = (self.names.var.clone(), self.names.value.clone());
        self.made.var = true;
        match self.boxd.call(&["env", "set", &var, &value, "--secret"]) {
            Err(why) => return self.stop_with(13, Verdict::CouldNot(why)),
            Ok(s) if !s.ok() => return self.stop_with(13, Self::differing("`env set` exits 0", s.brief())),
            Ok(_) => {}
        }
        let (_, list) = self.json(13, &["env", "list", "--json"])?;
        let sealed = named(&list, &var).is_some_and(|e| e["value"] == "(sealed)");
        if !sealed {
            self.differs(13, "the listing shows `(sealed)`", shorten(&list.to_string(), 200));
        }
        let s = self.exec_for(13, &["sh", "-c", &format!("'printf %s \"${var}\"'")], None)?;
        self.judge(13, s.ok() && s.stdout == value, "the exec prints VALUE", || s.brief());
        Ok(())
    }

    /// Row 8: a `setsid` job outlives its exec. The pid is kept for row 9.
    fn background(&mut self) -> Step {
        let s = self.exec_for(8, &["sh", "-c", "'setsid sleep 600 >/dev/null 2>&1 </dev/null & echo $!'"], None)?;
        let Some(pid) = s.stdout.trim().parse::<u32>().ok().filter(|_| s.ok()) else {
            return self.stop_with(8, Self::differing("a pid", s.brief()));
        };
        self.pid = Some(pid);
        // `$!` names the job as soon as it is forked; on a loaded machine the next exec can
        // find it still a shell or `setsid`, before it became `sleep`: look again a while.
        let deadline = Instant::now() + Duration::from_secs(5);
        let comm = loop {
            let comm = self.comm(8, pid)?;
            if comm.as_deref() == Some("sleep") || Instant::now() > deadline {
                break comm;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let seen = || comm.as_ref().map_or_else(|| format!("pid {pid} is gone"), |c| format!("pid {pid} is `{c}`, not `sleep`"));
        self.judge(8, comm.as_deref() == Some("sleep"), "`sleep`", seen);
        Ok(())
    }

    fn is_sleep(&mut self, id: u8, pid: u32) -> Result<bool, ()> {
        Ok(self.comm(id, pid)?.as_deref() == Some("sleep"))
    }

    /// The process's name on the machine, or None when it is gone.
    fn comm(&mut self, id: u8, pid: u32) -> Result<Option<String>, ()> {
        let s = self.exec_for(id, &["cat", &format!("/proc/{pid}/comm")], None)?;
        Ok(s.ok().then(|| s.stdout.trim().to_string()))
    }
    fn hibernate(&mut self) -> Step {
        let m = self.names.machine.clone();
        self.json(9, &["machine", "hibernate", &m, "--json"])?;
        let (_, list) = self.json(9, &["machine", "list", "--json"])?;
        let status = named(&list, &m).map(|e| e["status"].clone()).unwrap_or(Value::Null);
        if status != "hibernated" {
            self.differs(9, "status `hibernated`", format!("status {status}"));
        }
        self.json(9, &["machine", "wake", &m, "--json"])?;
        self.wait_running()?;
        let Some(pid) = self.pid else { return self.go_on_with(9, Verdict::CouldNot("no process from check 8".into())) };
        let alive = self.is_sleep(9, pid)?;
        self.judge(9, alive, "the same pid is `sleep`", || format!("pid {pid} is gone after the wake"));
        Ok(())
    }

    fn config(&mut self) -> Step {
        let m = self.names.machine.clone();
        match self.boxd.call(&["machine", "config", "set", &m, "auto-hibernate.timeout", "1900"]) {
            Err(why) => return self.go_on_with(10, Verdict::CouldNot(why)),
            Ok(s) if !s.ok() => return self.go_on_with(10, Self::differing("`config set` exits 0", s.brief())),
            Ok(_) => {}
        }
        let (_, v) = self.json(10, &["machine", "get", &m, "--json"])?;
        self.judge(10, v["auto_hibernate"] == "1900s", row_expected(10), || format!("auto_hibernate {}", v["auto_hibernate"]));
        Ok(())
    }

    fn save(&mut self) -> Step {
        let (m, snap) = (self.names.machine.clone(), self.names.snapshot.clone());
        self.made.snapshot = true;
        // A save copies the whole disk: it may take longer than other calls.
        match self.boxd.call_with(&["snapshots", "save", &m, &snap], None, self.boxd.timeout * 5) {
            Err(why) => return self.go_on_with(11, Verdict::CouldNot(why)),
            Ok(s) if !s.ok() => return self.go_on_with(11, Self::differing("`snapshots save` exits 0", s.brief())),
            Ok(_) => {}
        }
        let (_, list) = self.json(11, &["snapshots", "list", "--json"])?;
        let entry = named(&list, &snap).cloned().unwrap_or(Value::Null);
        let ok = entry["version"] == "v1" && entry["status"] == "ready";
        self.judge(11, ok, row_expected(11), || shorten(&entry.to_string(), 160));
        Ok(())
    }

    fn remove(&mut self) -> Step {
        let m = self.names.machine.clone();
        let (seen, _) = self.json(12, &["machine", "remove", &m, "-y", "--json"])?;
        let s = match self.boxd.call(&["machine", "get", &m, "--json"]) {
            Ok(s) => s,
            Err(why) => return self.go_on_with(12, Verdict::CouldNot(why)),
        };
        let gone = s.code == Some(1) && s.error_line() == Some(format!("error: VM '{m}' not found").as_str());
        if gone {
            self.made.machine = false;
        }
        self.judge(12, seen.ok() && gone, row_expected(12), || s.brief());
        Ok(())
    }

    /// Row 2, judged on every `--json` answer the run parsed.
    fn noise(&mut self) -> Step {
        match self.noise_breaks.clone() {
            None => self.set(2, Verdict::Held),
            Some(seen) => self.differs(2, row_expected(2), seen),
        }
        Ok(())
    }

    /// Remove whatever the run made (also after a failure, a timeout or Ctrl-C), and check
    /// it is gone. Each line says what was removed, or what is left and how to remove it.
    pub fn cleanup(&mut self) -> Vec<Cleaned> {
        let mut lines = Vec::new();
        let n = self.names.clone();
        if self.made.machine {
            lines.push(self.gone(&format!("machine {}", n.machine), &["machine", "get", &n.machine, "--json"], &["machine", "remove", &n.machine, "-y", "--json"], |s| {
                s.error_line().is_some_and(|l| l.contains("not found"))
            }));
        }
        if self.made.snapshot {
            lines.push(self.gone_from_list("snapshot", &n.snapshot, &["snapshots", "list", "--json"], &["snapshots", "remove", &n.snapshot, "-y", "--json"]));
        }
        if self.made.var {
            lines.push(self.gone_from_list("env var", &n.var, &["env", "list", "--json"], &["env", "rm", &n.var]));
        }
        lines
    }

    /// `what` is absent by `probe` (an `Ok` answer whose `absent` holds), else `remove` it
    /// and probe again.
    fn gone(&mut self, what: &str, probe: &[&str], remove: &[&str], absent: impl Fn(&Seen) -> bool) -> Cleaned {
        let mut removed = false;
        for attempt in 0..2 {
            match self.boxd.call(probe) {
                Ok(s) if absent(&s) => return Cleaned::Gone { what: what.into(), removed },
                Ok(s) if s.ok() && attempt == 0 => {}
                Ok(s) => return Cleaned::Left { what: what.into(), why: s.brief(), run: format!("boxd {}", remove.join(" ")) },
                Err(why) => return Cleaned::Left { what: what.into(), why, run: format!("boxd {}", remove.join(" ")) },
            }
            removed = true;
            if let Err(why) = self.boxd.call(remove) {
                return Cleaned::Left { what: what.into(), why, run: format!("boxd {}", remove.join(" ")) };
            }
        }
        unreachable!("the loop returns on its second probe")
    }

    fn gone_from_list(&mut self, kind: &str, name: &str, list: &[&str], remove: &[&str]) -> Cleaned {
        let name_owned = name.to_string();
        self.gone(&format!("{kind} {name}"), list, remove, move |s| s.ok() && s.json().is_some_and(|v| named(&v, &name_owned).is_none()))
    }

    /// Row 16, after the cleanup: sign out, see the listing fail, sign in again.
    pub fn sign_out(&mut self, allowed: bool, interrupted: bool) -> Option<String> {
        if interrupted {
            self.set(SIGN_OUT_ROW, Verdict::CouldNot("interrupted".into()));
            return None;
        }
        if !allowed {
            self.set(SIGN_OUT_ROW, Verdict::CouldNot("would sign you out; give --sign-out to run it".into()));
            return None;
        }
        match self.boxd.call(&["auth", "logout"]) {
            Err(why) => self.set(SIGN_OUT_ROW, Verdict::CouldNot(why)),
            Ok(s) if !s.ok() => self.differs(SIGN_OUT_ROW, "`auth logout` exits 0", s.brief()),
            Ok(_) => match self.boxd.call(&["machine", "list", "--json"]) {
                Err(why) => self.set(SIGN_OUT_ROW, Verdict::CouldNot(why)),
                Ok(s) => {
                    let line = s.error_line().unwrap_or_default().to_string();
                    let ok = s.code == Some(1) && (line.contains("not logged in") || line.contains("unauthenticated"));
                    self.judge(SIGN_OUT_ROW, ok, row_expected(SIGN_OUT_ROW), || s.brief());
                }
            },
        }
        match self.boxd.call(&["auth", "login"]) {
            Ok(s) if s.ok() => None,
            Ok(s) => Some(format!("you are signed out ({}): run `boxd auth login`", s.brief())),
            Err(why) => Some(format!("you are signed out ({why}): run `boxd auth login`")),
        }
    }
}

/// What the cleanup found for one thing the run made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cleaned {
    Gone { what: String, removed: bool },
    Left { what: String, why: String, run: String },
}

/// The element of a JSON array whose `name` is `name`.
fn named<'v>(list: &'v Value, name: &str) -> Option<&'v Value> {
    list.as_array()?.iter().find(|e| e["name"] == name)
}

pub fn row_expected(id: u8) -> &'static str {
    super::contract::row(id).expected
}
