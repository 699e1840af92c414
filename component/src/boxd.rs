//! The boxd CLI dialect, in one adapter: which argument lists we emit (the noun-verb
//! generation, `boxd machine …`), how we read its JSON through the CLI's noise, and how
//! its failures become our error codes. No tool builds a boxd argument list itself.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::Value;

use crate::caps::{Programs, RunOutput, RunRequest, SpawnError, Streams};
use crate::errors::{Code, ToolError, ToolResult};
use crate::redact::cut;

/// A boxd call's outcome as the adapter takes it: a spawn error or a non-zero exit becomes
/// a classified failure.
fn settle(request: &RunRequest, out: Result<RunOutput, SpawnError>) -> Result<RunOutput, Failure> {
    let what = verb(&request.args);
    let bound = format!("{} s (the bound set by the boxdTimeoutSeconds option)", request.timeout_ms / 1000);
    let out = out.map_err(|e| spawn_failure(e, &what, &bound))?;
    // An exit 0 that printed nothing but an error, or a JSON answer that is an error (a
    // remove that did not remove), is the failure it says it is: success is never taken
    // from the exit code alone.
    let said_error = out.stdout.iter().all(u8::is_ascii_whitespace) && error_line_in(&String::from_utf8_lossy(&out.stderr)).is_some();
    if out.exit_code == Some(0) && !said_error && json_error(&out.stdout).is_none() { Ok(out) } else { Err(classify(&out, &what)) }
}

/// The `error` of an answer whose first JSON document is an object carrying one
/// (`{"error":"internal: machine is busy"}`), cut to 400 characters. Only an object is
/// parsed: a listing (an array) is never read twice.
fn json_error(stdout: &[u8]) -> Option<String> {
    let first = stdout.split(|b| *b == b'\n').find(|l| l.starts_with(b"{") || l.starts_with(b"["))?;
    if !first.starts_with(b"{") {
        return None;
    }
    match first_json(stdout)?.get("error")? {
        Value::Null | Value::Bool(false) => None,
        Value::String(s) if s.trim().is_empty() => None,
        Value::String(s) => Some(cut(s.trim(), 400)),
        other => Some(cut(&other.to_string(), 400)),
    }
}

/// A spawn that gave no output, as a failure; `bound` words the deadline the host enforced.
fn spawn_failure(e: SpawnError, what: &str, bound: &str) -> Failure {
    match e {
        SpawnError::NotAllowed(n) if granted_but_refused(&n) => Failure::Refused(n),
        SpawnError::NotAllowed(n) | SpawnError::NotFound(n) => Failure::Missing(format!("no boxd CLI is available to this host ({n})")),
        SpawnError::TimedOut => Failure::Timeout(format!("boxd {what} did not answer within {bound}, so the host stopped it")),
        SpawnError::Failed(m) => Failure::Other(format!("could not run boxd {what}: {m}")),
    }
}

/// The first two words of a call ("machine list"), for messages.
fn verb(args: &[String]) -> String {
    args.iter().take(2).cloned().collect::<Vec<_>>().join(" ")
}

fn json_of(out: &RunOutput, what: &str) -> Result<Value, Failure> {
    first_json(&out.stdout).ok_or_else(|| no_json(out, what))
}

fn no_json(out: &RunOutput, what: &str) -> Failure {
    let said = error_line(out).map(|l| format!(": {l}")).unwrap_or_default();
    Failure::Other(format!("boxd {what} printed no JSON{said}"))
}

/// A listing's JSON, its bytes that are not UTF-8 read as U+FFFD. Such a name is never
/// one of ours (they are ASCII), and it keeps its row, where strict JSON lost the whole
/// listing to it: every tool failed over a stranger's machine.
fn listing_json(out: &RunOutput, what: &str) -> Result<Value, Failure> {
    first_json(String::from_utf8_lossy(&out.stdout).as_bytes()).ok_or_else(|| no_json(out, what))
}

/// A row without a name is a listing we cannot read, not a row to skip: a drop takes a
/// name missing from the listing as boxd's word that the machine is gone.
///
/// Names are unique in an org, but a removed machine's row lingers a moment (`destroyed`)
/// and its name may be taken again at once: a gone row gives way to a live one of its name.
/// A name of ours (`oc-…`) listed live twice cannot say which row is there (a running
/// machine with a hibernated twin read as asleep): its rows become one whose status says
/// so, a status no tool acts on (BOXD_FAILED for that work alone; the others go on, and
/// the caps count it as billing). Another name listed twice is not ours to judge.
fn machines_of(v: &Value) -> Result<Vec<Machine>, Failure> {
    let rows = v.as_array().ok_or_else(|| Failure::Other("boxd machine list printed no JSON array".into()))?;
    let mut machines = rows
        .iter()
        .map(|r| match r.get("name").and_then(Value::as_str) {
            Some(name) if !name.is_empty() => Ok(Machine { name: name.to_string(), status: str_field(r, "status") }),
            _ => Err(Failure::Other(format!("boxd machine list printed a row without a name: {}", crate::redact::cut(&r.to_string(), 200)))),
        })
        .collect::<Result<Vec<Machine>, Failure>>()?;
    let gone = |m: &Machine| State::from_status(&m.status) == Some(State::Gone);
    let mut live: alloc::collections::BTreeMap<String, Vec<String>> = alloc::collections::BTreeMap::new();
    for m in machines.iter().filter(|m| !gone(m)) {
        live.entry(m.name.clone()).or_default().push(if m.status.is_empty() { "none".into() } else { cut(&m.status, 40) });
    }
    machines.retain(|m| !gone(m) || !live.contains_key(&m.name));
    let mut merged = alloc::collections::BTreeSet::new();
    machines.retain_mut(|m| match live.get(&m.name).filter(|s| s.len() > 1 && m.name.starts_with("oc-")) {
        Some(statuses) => {
            m.status = format!("listed {} times by boxd machine list ({})", statuses.len(), statuses.join(", "));
            merged.insert(m.name.clone())
        }
        None => true,
    });
    Ok(machines)
}

/// The same for snapshots: a skipped row would hide a snapshot that is someone else's, and
/// a save (boxd_image, the golden builder) would then take its name.
fn snapshots_of(v: &Value) -> Result<Vec<Snapshot>, Failure> {
    let rows = v.as_array().ok_or_else(|| Failure::Other("boxd snapshots list printed no JSON array".into()))?;
    rows.iter()
        .map(|r| match r.get("name").and_then(Value::as_str) {
            Some(name) if !name.is_empty() => Ok(Snapshot { name: name.to_string(), version: str_field(r, "version"), status: str_field(r, "status") }),
            _ => Err(Failure::Other(format!("boxd snapshots list printed a row without a name: {}", crate::redact::cut(&r.to_string(), 200)))),
        })
        .collect()
}

/// A refusal of arguments (the program is granted), as opposed to no boxd at all.
fn granted_but_refused(refusal: &str) -> bool {
    refusal.contains("no grant allows")
}

/// One row of `boxd machine list --json` (the listing has no id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    pub name: String,
    pub status: String,
}

/// The state words we act on, from boxd's status strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Running,
    Standby,
    Asleep,
    Starting,
    Stopped,
    Failed,
    Gone,
}

impl State {
    /// The state a boxd status word names; None for a word this plugin does not know (a
    /// newer boxd's): no tool may take that for gone, which would rebuild or close a work
    /// whose machine still holds it (`known_state`).
    pub fn from_status(s: &str) -> Option<State> {
        Some(match s {
            "running" => State::Running,
            "standby" | "suspended" | "paused" | "suspending" => State::Standby,
            "hibernated" | "hibernating" => State::Asleep,
            "pending" | "starting" | "booting" | "migrating" => State::Starting,
            "stopped" | "stopping" => State::Stopped,
            "failed" => State::Failed,
            "destroying" | "destroyed" | "deleted" => State::Gone,
            _ => return None,
        })
    }
}

/// A machine's state, or BOXD_FAILED for a status word this plugin does not know: nothing
/// is changed on a guess.
pub fn known_state(info: &MachineInfo) -> ToolResult<State> {
    State::from_status(&info.status).ok_or_else(|| {
        ToolError::with_next(
            Code::BoxdFailed,
            format!("boxd reports {} as {:?}, a state this plugin does not know; nothing was changed", info.name, crate::redact::redact(&info.status, 40)),
            format!("Call boxd_status in a later turn; if boxd keeps reporting it, look at the machine with 'boxd machine get {}'.", info.name),
        )
    })
}

/// `boxd machine get --json`: every value is a string.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineInfo {
    pub name: String,
    pub id: String,
    pub status: String,
    pub sharing: String,
    pub isolated: bool,
    /// What it was made from (`snapshot/NAME:v1`, `fork/NAME`, `standalone`), and its
    /// auto-hibernate bound (`14400s`, `off`): empty when boxd does not say.
    pub source: String,
    pub auto_hibernate: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub name: String,
    pub version: String,
    pub status: String,
}

/// Where a listed snapshot's capture is, from its `status` (`pending|ready|failed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capture {
    /// `ready`, or no status at all (as an older CLI may list it).
    Ready,
    /// Still being captured: a machine removed now aborts it, and nothing boots from it yet.
    Pending,
    Failed,
    /// A status word this plugin does not know: nothing is decided on it.
    Unknown,
}

impl Snapshot {
    pub fn capture(&self) -> Capture {
        match self.status.as_str() {
            "" | "ready" => Capture::Ready,
            "pending" => Capture::Pending,
            "failed" => Capture::Failed,
            _ => Capture::Unknown,
        }
    }

    /// BOXD_FAILED for a status this plugin does not know; nothing was changed.
    pub fn unknown_status(&self) -> ToolError {
        ToolError::with_next(
            Code::BoxdFailed,
            format!("boxd lists snapshot '{}' as {:?}, a status this plugin does not know; nothing was changed", self.name, crate::redact::redact(&self.status, 40)),
            "Call again in a later turn; if boxd keeps reporting it, look at the snapshot with 'boxd snapshots list'.",
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created {
    pub id: Option<String>,
    /// boxd answered `"boot":"timeout"`: the machine may still come up later.
    pub boot_timeout: bool,
}

/// The answer of `machine new` or `machine fork` (the same shape). An empty id is no id:
/// recorded, it would make every later `get` of our own machine look like another's.
fn created(v: &Value) -> Created {
    Created {
        id: v.get("id").and_then(Value::as_str).filter(|id| !id.trim().is_empty()).map(String::from),
        boot_timeout: v.get("boot").and_then(Value::as_str) == Some("timeout"),
    }
}

/// Quote one argument for the guest's `sh -c`: boxd joins exec arguments into one
/// command line, so every argument we pass is single-quoted.
pub fn sh_quote(arg: &str) -> String {
    if !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:@%+,".contains(&b)) {
        return arg.to_string();
    }
    let mut out = String::with_capacity(arg.len() + 2);
    out.push('\'');
    for c in arg.chars() {
        if c == '\'' { out.push_str("'\\''") } else { out.push(c) }
    }
    out.push('\'');
    out
}

/// The first JSON document in `stdout`, skipping lines the CLI prints before it. A
/// document starts at the beginning of a line: an indented `{` is inside one, and taking
/// it would turn a cut-off answer into a wrong one.
pub fn first_json(stdout: &[u8]) -> Option<Value> {
    // By bytes: a noise line that is not UTF-8 does not hide the JSON after it.
    let mut offset = 0;
    for line in stdout.split_inclusive(|b| *b == b'\n') {
        if line.starts_with(b"{") || line.starts_with(b"[") {
            let start = offset;
            let mut it = serde_json::Deserializer::from_slice(&stdout[start..]).into_iter::<Value>();
            if let Some(Ok(v)) = it.next() {
                return Some(v);
            }
        }
        offset += line.len();
    }
    None
}

/// The first `error: …` line of a CLI's stderr: how boxd says a call failed, whatever its
/// exit code.
fn error_line_in(stderr: &str) -> Option<&str> {
    stderr.lines().map(str::trim).find(|l| l.get(..6).is_some_and(|p| p.eq_ignore_ascii_case("error:")))
}

/// The `error: …` line of stderr, if there is one, cut to 400 characters (a flood never
/// becomes an answer).
fn error_line(out: &RunOutput) -> Option<String> {
    error_line_in(&String::from_utf8_lossy(&out.stderr)).map(|l| cut(l, 400))
}

/// The `error: …` line of stderr, the `error` of a JSON answer, or stderr's last
/// non-empty line.
fn cli_message(out: &RunOutput) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    let line = error_line(out)
        .or_else(|| json_error(&out.stdout).map(|e| format!("error: {e}")))
        .or_else(|| err.lines().map(str::trim).filter(|l| !l.is_empty()).last().map(|l| cut(l, 400)))
        .unwrap_or_default();
    if line.is_empty() { format!("boxd {} and printed no message", crate::guest::exit_words(out.exit_code)) } else { line.to_string() }
}

fn classify(out: &RunOutput, what: &str) -> Failure {
    let msg = cli_message(out);
    let lower = msg.to_ascii_lowercase();
    if out.exit_code == Some(124) {
        Failure::Timeout(format!("boxd {what} exited with 124 (a timeout inside the boxd CLI): {msg}"))
    } else if lower.contains("not logged in") || lower.contains("unauthenticated") || lower.contains("auth login") {
        Failure::SignedOut(msg)
    } else if lower.contains("cannot connect") || lower.contains("dns error") || lower.contains("http2 error") || lower.contains("connection refused") || lower.contains("lost the connection") {
        Failure::Unreachable(msg)
    } else if lower.contains("not found") && (lower.contains("vm") || lower.contains("machine")) {
        Failure::NotFound(msg)
    } else if lower.contains("--vm") {
        Failure::Missing(format!("this is the boxd CLI that runs inside a machine ({msg}); the plugin drives the laptop CLI"))
    } else {
        Failure::Other(format!("boxd {what} failed: {msg}"))
    }
}

/// Drives the boxd CLI through the `Programs` capability.
pub struct Boxd<'a, P: Programs> {
    programs: &'a mut P,
    timeout_ms: u32,
    /// How many boxd calls this adapter made (for tests and the audit).
    pub calls: u32,
}

impl<'a, P: Programs> Boxd<'a, P> {
    pub fn new(programs: &'a mut P, timeout_seconds: u32) -> Self {
        Self { programs, timeout_ms: timeout_seconds.saturating_mul(1000), calls: 0 }
    }

    /// Run `boxd ARGS…`; a non-zero exit becomes a classified failure.
    fn run(&mut self, args: Vec<String>, stdin: Option<Vec<u8>>, timeout_ms: u32) -> Result<RunOutput, Failure> {
        let request = RunRequest { program: "boxd".into(), args, stdin, timeout_ms, ..Default::default() };
        self.calls += 1;
        let out = self.programs.run(&request);
        settle(&request, out)
    }

    fn run_json(&mut self, args: Vec<String>) -> Result<Value, Failure> {
        let what = verb(&args);
        let out = self.run(args, None, self.timeout_ms)?;
        json_of(&out, &what)
    }

    pub fn list(&mut self) -> Result<Vec<Machine>, Failure> {
        let args = argv(&["machine", "list", "--json"]);
        let what = verb(&args);
        let out = self.run(args, None, self.timeout_ms)?;
        machines_of(&listing_json(&out, &what)?)
    }

    /// `list` and `snapshots` side by side (`Programs::run_all`): a read that needs both
    /// pays for the slower call, not the sum.
    pub fn list_and_snapshots(&mut self) -> (Result<Vec<Machine>, Failure>, Result<Vec<Snapshot>, Failure>) {
        let requests: Vec<RunRequest> = [argv(&["machine", "list", "--json"]), argv(&["snapshots", "list", "--json"])]
            .into_iter()
            .map(|args| RunRequest { program: "boxd".into(), args, timeout_ms: self.timeout_ms, ..Default::default() })
            .collect();
        self.calls += 2;
        let mut outs = self.programs.run_all(&requests).into_iter();
        let mut answer = |r: &RunRequest| {
            let out = outs.next().unwrap_or_else(|| Err(SpawnError::Failed("the host gave fewer results than requests".into())));
            settle(r, out).and_then(|o| listing_json(&o, &verb(&r.args)))
        };
        let machines = answer(&requests[0]).and_then(|v| machines_of(&v));
        let snapshots = answer(&requests[1]).and_then(|v| snapshots_of(&v));
        (machines, snapshots)
    }

    /// `None` when boxd says the machine does not exist.
    pub fn get(&mut self, name: &str) -> Result<Option<MachineInfo>, Failure> {
        match self.run_json(argv(&["machine", "get", name, "--json"])) {
            // The id is what every ownership check compares: an answer without one, or
            // about another name, cannot tell ours from another's.
            Ok(v) if str_field(&v, "id").trim().is_empty() || str_field(&v, "name") != name => Err(Failure::Other(format!(
                "boxd machine get {name} answered without the machine's id and name: {}",
                crate::redact::cut(&v.to_string(), 200)
            ))),
            Ok(v) => Ok(Some(MachineInfo {
                name: str_field(&v, "name"),
                id: str_field(&v, "id"),
                status: str_field(&v, "status"),
                sharing: str_field(&v, "sharing"),
                isolated: matches!(str_field(&v, "isolated").as_str(), "yes" | "true"),
                source: str_field(&v, "source"),
                auto_hibernate: str_field(&v, "auto_hibernate"),
            })),
            Err(Failure::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Who the CLI is signed in as: `user_id/active_org` of `auth --json` (`-` for the
    /// personal account, `active_org` null).
    pub fn account(&mut self) -> Result<String, Failure> {
        let v = self.run_json(argv(&["auth", "--json"]))?;
        let user = v.get("user_id").and_then(Value::as_str).filter(|u| !u.trim().is_empty());
        let Some(user) = user else { return Err(Failure::Other("boxd auth answered no user_id".into())) };
        let org = v.get("active_org").and_then(Value::as_str).unwrap_or("-");
        Ok(format!("{}/{}", cut(user, 200), cut(org, 200)))
    }

    pub fn snapshots(&mut self) -> Result<Vec<Snapshot>, Failure> {
        let args = argv(&["snapshots", "list", "--json"]);
        let what = verb(&args);
        let out = self.run(args, None, self.timeout_ms)?;
        snapshots_of(&listing_json(&out, &what)?)
    }

    pub fn create(&mut self, name: &str, snapshot: &str, idle_seconds: u32) -> Result<Created, Failure> {
        let idle = idle_seconds.to_string();
        let v = self.run_json(argv(&[
            "machine", "new", name, "--from-snapshot", snapshot, "--auto-hibernate-timeout", &idle, "--json",
        ]))?;
        Ok(created(&v))
    }

    pub fn set_idle(&mut self, name: &str, idle_seconds: u32) -> Result<(), Failure> {
        let idle = idle_seconds.to_string();
        self.run(argv(&["machine", "config", "set", name, "auto-hibernate.timeout", &idle]), None, self.timeout_ms)
            .map(drop)
    }

    pub fn hibernate(&mut self, name: &str) -> Result<(), Failure> {
        self.run(argv(&["machine", "hibernate", name, "--json"]), None, self.timeout_ms).map(drop)
    }

    pub fn wake(&mut self, name: &str) -> Result<(), Failure> {
        self.run(argv(&["machine", "wake", name, "--json"]), None, self.timeout_ms).map(drop)
    }

    pub fn resume(&mut self, name: &str) -> Result<(), Failure> {
        self.run(argv(&["machine", "resume", name, "--json"]), None, self.timeout_ms).map(drop)
    }

    pub fn start(&mut self, name: &str) -> Result<(), Failure> {
        self.run(argv(&["machine", "start", name, "--json"]), None, self.timeout_ms).map(drop)
    }

    pub fn remove(&mut self, name: &str) -> Result<(), Failure> {
        self.run(argv(&["machine", "remove", name, "-y", "--json"]), None, self.timeout_ms).map(drop)
    }

    /// Copy `source`'s home (on boxd also its memory and processes) into a new machine
    /// `name`, with our idle bound (a fork inherits the source's otherwise).
    pub fn fork(&mut self, source: &str, name: &str, idle_seconds: u32) -> Result<Created, Failure> {
        let idle = idle_seconds.to_string();
        let v = self.run_json(argv(&["machine", "fork", source, name, "--auto-hibernate-timeout", &idle, "--json"]))?;
        Ok(created(&v))
    }

    /// A machine from boxd's stock image (the golden image's build machine); its id.
    pub fn create_bare(&mut self, name: &str) -> Result<Option<String>, Failure> {
        self.run_json(argv(&["machine", "new", name, "--json"])).map(|v| created(&v).id)
    }

    /// The names in `boxd env list` (values are never read).
    pub fn env_names(&mut self) -> Result<Vec<String>, Failure> {
        let v = self.run_json(argv(&["env", "list", "--json"]))?;
        let rows = v.as_array().ok_or_else(|| Failure::Other("boxd env list printed no JSON array".into()))?;
        Ok(rows.iter().filter_map(|r| Some(r.get("name")?.as_str()?.to_string())).collect())
    }

    /// Run a guest command line (each word quoted for the guest's `sh -c`). The remote exit
    /// code is returned, not treated as a failure: guest scripts speak through it.
    pub fn exec(&mut self, name: &str, words: &[&str], stdin: Option<Vec<u8>>, timeout_seconds: u32) -> Result<RunOutput, Failure> {
        self.exec_streaming(name, words, stdin, &Streams::default(), timeout_seconds)
    }

    /// As `exec`, with laptop files streamed onto the remote stdin after `stdin` and the
    /// remote's stdout frames written to new laptop files (docs/guest.md, "Frames").
    pub fn exec_streaming(&mut self, name: &str, words: &[&str], stdin: Option<Vec<u8>>, streams: &Streams, timeout_seconds: u32) -> Result<RunOutput, Failure> {
        let mut args = argv(&["machine", "exec", name, "--timeout", &timeout_seconds.to_string(), "--"]);
        args.extend(words.iter().map(|w| sh_quote(w)));
        // Our own deadline sits past boxd's, so boxd reports the remote timeout (124) first.
        let deadline = timeout_seconds.saturating_add(30).saturating_mul(1000);
        let request_what = "machine exec";
        self.calls += 1;
        let request = RunRequest {
            program: "boxd".into(),
            args,
            stdin,
            timeout_ms: deadline,
            stdin_files: streams.stdin_files.clone(),
            stdout_files: streams.stdout_files.clone(),
            stdout_modes_from: streams.stdout_modes_from.clone(),
            ..Default::default()
        };
        let bound = format!("{} s (its --timeout of {timeout_seconds} s plus 30 s)", deadline / 1000);
        let out = self.programs.run(&request).map_err(|e| match (unsent(&request, &e), unreceived(&request, &e)) {
            (Some(m), _) => Failure::Unsent(m),
            (None, Some((full, said))) => Failure::Unreceived { full, said },
            (None, None) => match e {
                SpawnError::Failed(m) if !request.stdout_files.is_empty() && m.contains(FRAMED_OUT) && MISFRAMED.iter().any(|w| m.contains(w)) => Failure::Misframed(m),
                e => spawn_failure(e, request_what, &bound),
            },
        })?;
        // Exit 1 with an `error:` line is the CLI failing, not the remote command.
        let err = String::from_utf8_lossy(&out.stderr);
        if out.exit_code == Some(1) && error_line_in(&err).is_some() {
            return Err(classify(&out, request_what));
        }
        // 124 is what boxd gives when its --timeout fires (it then says so on stderr, as in
        // "error: command timed out after 120s"), and also what a guest command may exit with
        // by itself: the message names which one happened.
        if out.exit_code == Some(124) {
            let fired = err.lines().any(|l| {
                let l = l.trim_start().to_ascii_lowercase();
                l.starts_with("error:") && l.contains("timed out")
            });
            return Err(Failure::Timeout(if fired {
                format!("boxd {request_what} stopped the guest command at its --timeout of {timeout_seconds} s (exit 124)")
            } else {
                format!("boxd {request_what} exited with 124: the guest command exited with 124 itself (the exec's --timeout of {timeout_seconds} s did not fire)")
            }));
        }
        Ok(out)
    }
}

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

fn str_field(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

mod failure;
pub use failure::*;
use failure::{unreceived, unsent, FRAMED_OUT, MISFRAMED};
mod saved;
pub use saved::{version_number, Made};

#[cfg(test)]
mod tests;
