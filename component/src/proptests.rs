//! Property tests: hostile input never panics the component (a panic in the wasm build is
//! a trap), and every failure is a documented `{error, message, next}`.
//!
//! Inputs: tool arguments (any JSON, any string) through `tools::call` with generated boxd,
//! guest and opencode answers; work ids and paths; the boxd JSON parsers; the guest
//! helper's replies; the ledger reader; and deeply nested JSON everywhere JSON comes in.
//! `cargo test -p boxd-component proptests` runs 256 cases a property (proptest's default);
//! `PROPTEST_CASES=5000 cargo test --release -p boxd-component proptests` runs a longer
//! search (docs/testing.md).

use std::collections::{BTreeMap, BTreeSet};
use std::string::{String, ToString};
use std::vec::Vec;
use std::{format, vec};

use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{json, Value};

use crate::boxd::{first_json, sh_quote, Boxd};
use crate::caps::{Files, Programs, RunOutput, RunRequest, SpawnError};
use crate::errors::{Code, ToolError};
use crate::guest::Guest;
use crate::ledger::{GitRecord, Ledger, Proof, Prompt, SessionProof, Work, WorkState};
use crate::paths;
use crate::testing::{MemFiles, Scripted};
use crate::tools::{call, RawContext};

// ---------------------------------------------------------------------------------------
// Generators

const KEYS: &[&str] = &[
    "work", "prompt", "files", "from", "to", "name", "directory", "state", "outcome", "lastText", "pending", "failure",
    "kind", "message", "error", "sessions", "info", "id", "parentID", "messages", "parts", "repo", "head", "branch",
    "status", "untracked", "ignored", "dirty", "patch", "patchEncoding", "path", "data", "sha256", "admitted",
    "queued", "schema", "machine", "machineId", "createdAt", "prompts", "proofs", "sharing", "isolated", "boot",
    "version", "text", "type", "role",
];

const WORDS: &[&str] = &[
    "", " ", "w1", "w2", "oc-w1", "m-1", "../x", "a/../../b", "/etc/passwd", "~/x", ".", "a.txt", "dir", "link",
    "missing", "opencode-golden", "running", "hibernated", "standby", "starting", "gone", "failed", "busy", "idle",
    "completed", "auth", "base64", "GUEST_FAILED", "SESSION_BUSY", "NOT_A_CODE", "private", "shared", "yes", "timeout",
    "ses_1", "msg_1", "é", "a\nb", "a\u{0}b", "\u{202e}rtl", "password=hunter2",
];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => select(WORDS).prop_map(String::from),
        2 => any::<String>(),
        1 => "[a-z0-9./-]{0,12}",
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![4 => select(KEYS).prop_map(String::from), 1 => any::<String>()]
}

/// Any JSON value (no floats, so a value round-trips exactly).
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// JSON nested `depth` levels deep: arrays, objects, or both.
fn nested(depth: usize, kind: u8) -> String {
    let (open, close) = match kind % 3 {
        0 => ("[", "]"),
        1 => ("{\"a\":", "}"),
        _ => ("[{\"a\":", "}]"),
    };
    format!("{}1{}", open.repeat(depth), close.repeat(depth))
}

fn tool_names() -> Vec<&'static str> {
    crate::tools::registry::TOOLS.iter().map(|t| t.name).collect()
}

/// Arguments shaped like the tools' (so calls get past the schema), with hostile values.
fn structured_args() -> impl Strategy<Value = Value> {
    let submit_file = (text(), text(), proptest::option::of(json_value())).prop_map(|(from, to, extra)| {
        let mut o = json!({ "from": from, "to": to });
        if let Some(x) = extra {
            o["x"] = x;
        }
        o
    });
    let files = prop_oneof![
        prop::collection::vec(submit_file, 0..4).prop_map(Value::from),
        prop::collection::vec(text().prop_map(Value::String), 0..4).prop_map(Value::from),
        json_value(),
    ];
    let work = prop_oneof![6 => Just(json!("w1")), 1 => Just(json!("w2")), 2 => text().prop_map(Value::String), 1 => json_value()];
    (
        work,
        proptest::option::of(prop_oneof![3 => Just(json!("do the task")), 2 => text().prop_map(Value::String), 1 => json_value()]),
        proptest::option::of(files),
        proptest::option::of(prop_oneof![text().prop_map(Value::String), json_value()]),
        proptest::option::of(prop_oneof![2 => Just(json!("snap-1")), 1 => text().prop_map(Value::String)]),
        proptest::option::of(text().prop_map(Value::String)),
        proptest::option::weighted(0.1, (key(), json_value())),
    )
        .prop_map(|(work, prompt, files, to, name, directory, extra)| {
            let mut o = serde_json::Map::new();
            o.insert("work".into(), work);
            for (k, v) in [("prompt", prompt), ("files", files), ("to", to), ("name", name), ("directory", directory)] {
                if let Some(v) = v {
                    o.insert(k.into(), v);
                }
            }
            if let Some((k, v)) = extra {
                o.insert(k, v);
            }
            Value::Object(o)
        })
}

/// Values that match a tool's JSON Schema (the shapes `schema::check` knows), with
/// hostile strings; `work` is mostly the healthy work.
fn from_schema(key: &str, schema: &Value) -> BoxedStrategy<Value> {
    match schema["type"].as_str() {
        Some("object") => {
            let required: Vec<String> = schema["required"].as_array().into_iter().flatten().filter_map(|r| r.as_str().map(String::from)).collect();
            let mut fields: Vec<BoxedStrategy<Option<(String, Value)>>> = Vec::new();
            for (k, sub) in schema["properties"].as_object().into_iter().flatten() {
                let (k2, value) = (k.clone(), from_schema(k, sub));
                let pair = value.prop_map(move |v| (k2.clone(), v));
                fields.push(if required.contains(k) { pair.prop_map(Some).boxed() } else { proptest::option::weighted(0.7, pair).boxed() });
            }
            fields.prop_map(|kv| Value::Object(kv.into_iter().flatten().collect())).boxed()
        }
        Some("array") => prop::collection::vec(from_schema("", &schema["items"]), 0..4).prop_map(Value::Array).boxed(),
        Some("string") if key == "work" => prop_oneof![8 => Just(json!("w1")), 1 => text().prop_map(Value::String)].boxed(),
        Some("string") if key == "prompt" => prop_oneof![3 => Just(json!("do the task")), 1 => text().prop_map(Value::String)].boxed(),
        Some("string") if key == "from" => prop_oneof![3 => select(&["a.txt", "/p/a.txt", "dir/b.bin", "/srv/x/y"][..]).prop_map(|s| json!(s)), 1 => text().prop_map(Value::String)].boxed(),
        Some("string") => text().prop_map(Value::String).boxed(),
        _ => json_value().boxed(),
    }
}

fn args_text() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => structured_args().prop_map(|v| v.to_string()),
        2 => json_value().prop_map(|v| v.to_string()),
        1 => any::<String>(),
        1 => "[\\[\\]{}\":,a-z0-9 \\\\]{0,40}",
        1 => (1usize..400, any::<u8>()).prop_map(|(d, k)| nested(d, k)),
    ]
}

fn out(code: Option<i32>, stdout: impl Into<Vec<u8>>, stderr: impl Into<Vec<u8>>) -> Result<RunOutput, SpawnError> {
    Ok(RunOutput { exit_code: code, stdout: stdout.into(), stderr: stderr.into(), files: Vec::new() })
}

const STDERR_LINES: &[&str] = &[
    "",
    "error: not logged in",
    "error: cannot connect to https://boxd.sh:9443: dns error: not found",
    "error: VM 'oc-w1' not found",
    "error: VM 'oc-w1' already exists",
    "error: timed out waiting for boxd.sh",
    "error: internal",
    "error: requires --vm",
    "Traceback (most recent call last):\n  boom",
];

fn stderr() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![3 => select(STDERR_LINES).prop_map(|s| s.as_bytes().to_vec()), 1 => prop::collection::vec(any::<u8>(), 0..64)]
}

fn stdout_of(good: &'static [&'static str]) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => select(good).prop_map(|s| s.as_bytes().to_vec()),
        1 => select(good).prop_map(|s| format!("(restarted client-utilities daemon)\n{s}\n").into_bytes()),
        1 => json_value().prop_map(|v| v.to_string().into_bytes()),
        1 => prop::collection::vec(any::<u8>(), 0..64),
        1 => (1usize..300, any::<u8>()).prop_map(|(d, k)| nested(d, k).into_bytes()),
    ]
}

/// One program's answer: mostly plausible, sometimes any exit, any bytes, or no run at all.
fn reply(good: &'static [&'static str]) -> impl Strategy<Value = Result<RunOutput, SpawnError>> {
    let code = prop_oneof![6 => Just(Some(0)), 1 => Just(Some(1)), 1 => Just(Some(3)), 1 => Just(Some(86)), 1 => Just(Some(124)), 1 => Just(Some(127)), 1 => Just(None), 1 => any::<i32>().prop_map(Some)];
    prop_oneof![
        10 => (code, stdout_of(good), stderr()).prop_map(|(c, o, e)| out(c, o, e)),
        1 => prop_oneof![
            Just(Err(SpawnError::TimedOut)),
            Just(Err(SpawnError::NotFound("boxd".into()))),
            Just(Err(SpawnError::NotAllowed("boxd".into()))),
            text().prop_map(|m| Err(SpawnError::Failed(m))),
        ],
    ]
}

const LIST: &[&str] = &[
    r#"[{"name":"oc-w1","status":"running","sharing":"private"}]"#,
    r#"[{"name":"oc-w1","status":"hibernated","sharing":"private"}]"#,
    r#"[{"name":"oc-w1","status":"starting","sharing":"private"}]"#,
    r#"[{"name":"oc-w1","status":"standby","sharing":"private"},{"name":"oc-w2","status":"running","sharing":"private"}]"#,
    r#"[]"#,
];
const GET: &[&str] = &[
    r#"{"name":"oc-w1","id":"m-1","status":"running","sharing":"private","isolated":"no","source":"snapshot/opencode-golden"}"#,
    r#"{"name":"oc-w1","id":"m-other","status":"running","sharing":"private","isolated":"no"}"#,
    r#"{"name":"oc-w1","id":"m-1","status":"starting","sharing":"shared","isolated":"yes"}"#,
];
const SNAPSHOTS: &[&str] = &[r#"[{"name":"opencode-golden","version":"v1","status":"ready"}]"#, r#"[{"name":"snap-1","version":"v1","status":"ready"}]"#, "[]"];
const NEW: &[&str] = &[r#"{"name":"oc-w1","id":"m-1","boot":"0.1s"}"#, r#"{"name":"oc-w1","id":"m-1","boot":"timeout"}"#, r#"{"name":"oc-w1"}"#];
const EXEC: &[&str] = &[
    r#"{"ready":true,"server":"up"}"#,
    r#"{"state":"idle","outcome":"completed","lastText":"done sk-abcdefghijklmnop1234","pending":0}"#,
    r#"{"state":"busy","pending":2}"#,
    r#"{"state":"idle","outcome":"failed","failure":{"kind":"auth","message":"bad key"}}"#,
    r#"{"admitted":true,"queued":false,"pending":0}"#,
    r#"{"sessions":[{"info":{"id":"ses_1"},"messages":[{"info":{"id":"msg_1","role":"user"},"parts":[{"id":"prt_1","type":"text","text":"hi"}]}]}]}"#,
    r#"{"sessions":[{"info":{"id":"ses_1"},"messages":[]},{"info":{"id":"ses_2","parentID":"ses_9"},"messages":[]}]}"#,
    r#"{"sessions":[]}"#,
    r#"{"repo":true,"head":"abc","branch":"main","status":[" M a.txt"],"untracked":[{"path":"n.txt","sha256":"x"}],"ignored":[],"dirty":true,"patch":"ZGlmZgo=","patchEncoding":"base64","files":[{"path":"SUMMARY.md","data":"aGkK","sha256":"4a1e67f2fe1d1cc7b31d0ca2ec441da4778203a036a77da10344c85e24ff0f92"}]}"#,
    r#"{"repo":true,"head":"abc","branch":"main","status":[],"untracked":[],"ignored":[],"dirty":false,"files":[{"path":"../../etc/x","data":"!!","sha256":""}]}"#,
    r#"{"repo":false}"#,
    r#"{"error":"SESSION_BUSY","message":"busy"}"#,
    r#"{"error":"NOT_A_CODE"}"#,
];
const OPENCODE: &[&str] = &[
    "1.18.33",
    r#"{"info":{"id":"ses_1"},"messages":[{"info":{"id":"msg_1","role":"user"},"parts":[{"id":"prt_1","type":"text","text":"hi"}]}]}"#,
    r#"{"info":{"id":"ses_1"},"messages":[]}"#,
    "Imported session ses_1",
];
const OTHER: &[&str] = &[r#"{"name":"oc-w1","status":"hibernated"}"#, r#"{"name":"oc-w1","status":"destroyed"}"#, ""];

const EXPORT_ONE: &str = r#"{"sessions":[{"info":{"id":"ses_1"},"messages":[{"info":{"id":"msg_1","role":"user"},"parts":[{"id":"prt_1","type":"text","text":"hi"}]}]}]}"#;

/// Where a run is routed, and the plausible answers there (the first is the healthy one).
/// Guest helper commands are told apart inside the exec's script.
const ROUTES: &[(&str, &[&str])] = &[
    ("list", LIST),
    ("get", GET),
    ("snapshots", SNAPSHOTS),
    ("new", NEW),
    ("other", OTHER),
    ("exec:upload", &[""]),
    ("exec:prepare", &[r#"{"ok":true,"work":"w1","port":4096,"serverStarted":true}"#, r#"{"ok":true}"#]),
    ("exec:status", &[EXEC[1], EXEC[2], EXEC[3]]),
    ("exec:submit", &[EXEC[4], r#"{"admitted":false,"queued":true,"pending":"x"}"#]),
    ("exec:export", &[EXPORT_ONE, EXEC[6], EXEC[7]]),
    ("exec:git", &[EXEC[8], EXEC[9], EXEC[10]]),
    ("exec:other", EXEC),
    ("opencode:--version", &["1.18.33", "9.9.9"]),
    ("opencode:import", &["Imported session ses_1", ""]),
    ("opencode:export", &[OPENCODE[1], OPENCODE[2]]),
    ("opencode:other", OPENCODE),
];

/// Answers by what is asked (boxd verb, helper command, opencode subcommand), each route
/// from its own generated pool, cycling; never panics and gives up after `MAX_RUNS` runs
/// (a loop would show).
#[derive(Debug, Clone)]
struct World {
    routes: BTreeMap<&'static str, Vec<Result<RunOutput, SpawnError>>>,
}

const MAX_RUNS: usize = 200;

struct Answers {
    world: World,
    seen: BTreeMap<&'static str, usize>,
    requests: Vec<RunRequest>,
}

impl Answers {
    fn new(world: World) -> Answers {
        Answers { world, seen: BTreeMap::new(), requests: Vec::new() }
    }
}

fn route(r: &RunRequest) -> &'static str {
    if r.program == "opencode" {
        return match r.args.first().map(String::as_str) {
            Some("--version") => "opencode:--version",
            Some("import") => "opencode:import",
            Some("export") => "opencode:export",
            _ => "opencode:other",
        };
    }
    let verb = r.args.iter().take(2).map(String::as_str).collect::<Vec<_>>().join(" ");
    match verb.as_str() {
        "machine list" => "list",
        "machine get" => "get",
        "snapshots list" => "snapshots",
        "machine new" => "new",
        "machine exec" => {
            let script = r.args.last().map(String::as_str).unwrap_or("");
            if script.contains("upload.tmp") {
                return "exec:upload";
            }
            for (name, cmd) in [("exec:prepare", ".py prepare "), ("exec:status", ".py status "), ("exec:submit", ".py submit "), ("exec:export", ".py export "), ("exec:git", ".py git ")] {
                if script.contains(cmd) {
                    return name;
                }
            }
            "exec:other"
        }
        _ => "other",
    }
}

/// Every program answers its route's healthy reply.
fn healthy() -> World {
    World { routes: ROUTES.iter().map(|(name, good)| (*name, vec![out(Some(0), good[0], "")])).collect() }
}

impl Programs for Answers {
    fn run(&mut self, r: &RunRequest) -> Result<RunOutput, SpawnError> {
        self.requests.push(r.clone());
        if self.requests.len() > MAX_RUNS {
            return Err(SpawnError::TimedOut);
        }
        let name = route(r);
        let pool = &self.world.routes[name];
        let n = self.seen.entry(name).or_insert(0);
        let answer = pool[*n % pool.len()].clone();
        *n += 1;
        answer
    }
}

/// A world whose every route answers from a generated pool: the route's healthy reply with
/// weight `healthy`, else anything `reply` makes (plausible variants, any exit, any bytes).
fn world_with(healthy: u32) -> impl Strategy<Value = World> {
    let pools: Vec<_> = ROUTES
        .iter()
        .map(|(name, good)| {
            let one = prop_oneof![healthy.max(1) => Just(out(Some(0), good[0], "")), 10 => reply(good)];
            let one = if healthy == 0 { reply(good).boxed() } else { one.boxed() };
            prop::collection::vec(one, 1..4).prop_map(move |p| (*name, p))
        })
        .collect();
    pools.prop_map(|routes| World { routes: routes.into_iter().collect() })
}

fn world() -> impl Strategy<Value = World> {
    world_with(0)
}

/// What the ledger holds before the call.
#[derive(Debug, Clone)]
enum Before {
    Empty,
    Record(Work),
    Bytes(Vec<u8>),
}

fn good_work() -> impl Strategy<Value = Work> {
    (select(&[WorkState::Creating, WorkState::Open, WorkState::Open, WorkState::Closed][..]), any::<bool>(), 0usize..3, any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
        |(state, has_id, prompts, proven, git, dirty)| {
            let mut w = Work::new("w1", "/p", "2026-01-01T00:00:00.000Z");
            w.state = state;
            w.machine_id = has_id.then(|| "m-1".into());
            for i in 0..prompts {
                w.prompts.push(Prompt { id: format!("p{i}"), at: "t".into(), sha256: "0".repeat(64), bytes: 3, admitted: true, ..Default::default() });
            }
            if proven {
                let file = Some("export-1.json".to_string());
                let session = SessionProof { id: "ses_1".into(), parent_id: None, messages: 1, digest: "d".repeat(64), file, ..Default::default() };
                w.proofs.push(Proof { at: "t".into(), prompts: prompts as u64, sessions: vec![session], ..Default::default() });
            }
            if git {
                w.git = Some(GitRecord { head: "abc".into(), dirty, patch: dirty.then(|| "patch-1.diff".into()), prompts: prompts as u64, ..Default::default() });
            }
            w
        },
    )
}

fn before() -> impl Strategy<Value = Before> {
    prop_oneof![
        2 => Just(Before::Empty),
        6 => good_work().prop_map(Before::Record),
        1 => json_value().prop_map(|v| Before::Bytes(v.to_string().into_bytes())),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Before::Bytes),
        1 => (1usize..400, any::<u8>()).prop_map(|(d, k)| Before::Bytes(nested(d, k).into_bytes())),
    ]
}

fn laptop(before: &Before) -> MemFiles {
    let mut fs = MemFiles::new(&["/p", "/l", "/srv/x"]);
    fs.put("/p/a.txt", b"hello\n");
    fs.put("/p/dir/b.bin", &[0, 1, 2, 255]);
    fs.put("/p/SUMMARY.md", b"mine\n");
    fs.symlinks.insert("/p/link".into());
    fs.create_dir_all("/l/works").unwrap();
    match before {
        Before::Empty => {}
        Before::Record(w) => {
            Ledger::new(&mut fs, "/l").write(w).unwrap();
            let export = r#"{"info":{"id":"ses_1"},"messages":[{"info":{"id":"msg_1","role":"user"},"parts":[{"id":"prt_1","type":"text","text":"hi"}]}]}"#;
            fs.put("/l/works/w1/export-1.json", export.as_bytes());
        }
        Before::Bytes(b) => fs.put("/l/works/w1/work.json", b),
    }
    fs
}

fn options() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => Just("{}".to_string()),
        1 => Just(r#"{"access":"ask-changes"}"#.to_string()),
        1 => Just(r#"{"access":"read-only"}"#.to_string()),
        1 => Just(r#"{"allowedRoots":["/srv/x"],"boxdTimeoutSeconds":5,"snapshot":"snap-1"}"#.to_string()),
        1 => json_value().prop_map(|v| v.to_string()),
        1 => any::<String>(),
    ]
}

fn facts() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just(r#"{"approved":true}"#.to_string()),
        2 => Just("{}".to_string()),
        1 => Just(r#"{"approved":true,"opencodeVersion":"1.18.33","rulesNotAdded":true,"skillsInvalid":"x","agentsWithoutRules":["a"]}"#.to_string()),
        1 => json_value().prop_map(|v| v.to_string()),
        1 => any::<String>(),
    ]
}

fn raw(host: (&str, &str), options: &str, facts: &str, entropy: &[u8]) -> RawContext {
    RawContext {
        host_name: host.0.into(),
        host_version: host.1.into(),
        options_json: options.into(),
        project: "/p".into(),
        ledger: "/l".into(),
        now_ms: 1_795_953_600_000,
        entropy: entropy.to_vec(),
        facts: crate::options::HostFacts::from_json(facts),
    }
}

// ---------------------------------------------------------------------------------------
// Checks

/// The codes docs/configuration.md documents (its error table).
fn documented() -> BTreeSet<String> {
    let doc = include_str!("../../docs/configuration.md");
    doc.lines().filter(|l| l.starts_with("| `")).filter_map(|l| l.split('`').nth(1)).map(String::from).collect()
}

fn check_error(e: &ToolError) -> Result<(), TestCaseError> {
    let code = e.code.as_str();
    prop_assert!(documented().contains(code), "{code} is not documented in docs/configuration.md");
    prop_assert!(!e.message.trim().is_empty(), "{code} with an empty message");
    prop_assert!(!e.next.trim().is_empty(), "{code} with an empty next step");
    prop_assert!(!e.message.contains("ErrorCode {"), "{code} shows a debug struct: {}", e.message);
    Ok(())
}

/// Every record left in the ledger reads, and the password sits only in its own file.
fn check_ledger(fs: &mut MemFiles, password: &str) -> Result<(), TestCaseError> {
    let records: Vec<String> = fs.files.keys().filter(|k| k.starts_with("/l/works/") && k.ends_with("/work.json")).cloned().collect();
    for path in &records {
        let id = path.trim_start_matches("/l/works/").trim_end_matches("/work.json").to_string();
        let read = Ledger::new(fs, "/l").read(&id);
        prop_assert!(matches!(read, Ok(Some(_))), "{path} no longer reads: {read:?}");
    }
    for (path, bytes) in &fs.files {
        if !path.ends_with("/password") {
            prop_assert!(!String::from_utf8_lossy(bytes).contains(password), "the password leaked into {path}");
        }
    }
    Ok(())
}

fn run_tool(tool: &str, args: &str, before: &Before, world: &World, host: (&str, &str), options: &str, facts: &str, entropy: &[u8]) -> Result<(), TestCaseError> {
    let mut fs = laptop(before);
    let mut p = Answers::new(world.clone());
    let result = call(&mut p, &mut fs, tool, args, raw(host, options, facts, entropy));
    prop_assert!(p.requests.len() <= MAX_RUNS, "{tool} ran more than {MAX_RUNS} programs: {:?}", p.requests.iter().map(|r| r.args.join(" ")).collect::<Vec<_>>());
    // The password is made from the entropy (when there is enough of it).
    let password = if entropy.len() >= 16 { crate::encode::hex(entropy) } else { "(no password)".to_string() };
    match &result {
        Ok(v) => {
            prop_assert!(v.is_object(), "{tool} answered a non-object: {v}");
            let text = serde_json::to_string(v).unwrap();
            let back: Result<Value, _> = serde_json::from_str(&text);
            prop_assert!(back.is_ok(), "{tool}'s answer does not parse back (a host could not read it): {:?}", back.err());
            prop_assert!(!text.contains(&password), "{tool}'s answer shows the password");
        }
        Err(e) => {
            check_error(e)?;
            prop_assert!(e.code != Code::HostFailed, "the component never returns HOST_FAILED: {e:?}");
            prop_assert!(!e.message.contains(&password), "{tool}'s error shows the password");
        }
    }
    for r in &p.requests {
        prop_assert!(!r.args.iter().any(|a| a.contains(&password)), "the password is in argv: {:?}", r.args);
    }
    if !matches!(before, Before::Bytes(_)) {
        check_ledger(&mut fs, &password)?;
    }
    Ok(())
}

fn host() -> impl Strategy<Value = (String, String)> {
    prop_oneof![
        6 => Just(("boxd-host".to_string(), "0.1.0".to_string())),
        2 => Just(("opencode".to_string(), "1.18.33".to_string())),
        1 => ("opencode", text()).prop_map(|(h, v)| (h.to_string(), v)),
    ]
}

// ---------------------------------------------------------------------------------------
// Properties

proptest! {
    /// Any tool name, any arguments, any ledger, any boxd/guest/opencode answers: Ok, or a
    /// documented error; the ledger still reads; the password stays off argv and answers.
    #[test]
    fn tools_never_panic_and_fail_only_with_documented_codes(
        tool in prop_oneof![12 => select(tool_names()).prop_map(String::from), 1 => any::<String>()],
        args in args_text(),
        before in before(),
        world in world(),
        host in host(),
        options in options(),
        facts in facts(),
        entropy in prop_oneof![8 => prop::collection::vec(any::<u8>(), 32..=32), 1 => prop::collection::vec(any::<u8>(), 0..20)],
    ) {
        run_tool(&tool, &args, &before, &world, (&host.0, &host.1), &options, &facts, &entropy)?;
    }

    /// The same with a healthy work and arguments generated from the tool's own schema, so
    /// every tool goes deep (the guest's replies, imports, proofs, files) rather than
    /// stopping at a check.
    #[test]
    fn every_tool_on_a_healthy_work_never_panics(
        (tool, args) in select(tool_names()).prop_flat_map(|t| (Just(t), from_schema("", &(crate::tools::registry::find(t).unwrap().schema)()))),
        w in good_work(),
        world in world_with(90),
        entropy in prop::collection::vec(any::<u8>(), 32..=32),
    ) {
        run_tool(tool, &args.to_string(), &Before::Record(w), &world, ("boxd-host", "0.1.0"), "{}", r#"{"approved":true}"#, &entropy)?;
    }

    #[test]
    fn an_accepted_work_id_is_a_label_and_names_its_machine(id in prop_oneof![any::<String>(), "[a-z][a-z0-9-]{0,45}", text()]) {
        match paths::work_id(&id) {
            Ok(machine) => {
                prop_assert_eq!(&machine, &format!("oc-{id}"));
                prop_assert!(!id.is_empty() && id.len() <= paths::WORK_ID_MAX && machine.len() <= 63);
                prop_assert!(id.starts_with(|c: char| c.is_ascii_lowercase()) && !id.ends_with('-'));
                prop_assert!(id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
            }
            Err(e) => prop_assert_eq!(e.code, Code::NameInvalid),
        }
    }

    #[test]
    fn every_well_formed_work_id_is_accepted(id in "[a-z]([a-z0-9-]{0,38}[a-z0-9])?") {
        prop_assert_eq!(paths::work_id(&id).unwrap(), format!("oc-{id}"));
    }

    #[test]
    fn guest_relative_never_yields_dotdot_or_an_absolute_path(p in path_text()) {
        match paths::guest_relative(&p) {
            Ok(r) => {
                prop_assert!(!r.is_empty() && !r.starts_with('/') && !r.starts_with('~'), "{p:?} -> {r:?}");
                prop_assert!(r.split('/').all(|s| !s.is_empty() && s != "." && s != ".."), "{p:?} -> {r:?}");
                prop_assert!(!r.chars().any(char::is_control), "{p:?} -> {r:?}");
                prop_assert_eq!(paths::guest_relative(&r).unwrap(), r.clone(), "not idempotent");
            }
            Err(e) => prop_assert_eq!(e.code, Code::NameInvalid),
        }
    }

    #[test]
    fn an_accepted_laptop_path_is_clean_and_within_a_root(p in path_text(), base in root(), roots in prop::collection::vec(root(), 0..4)) {
        let roots: Vec<&str> = roots.iter().map(String::as_str).collect();
        match paths::laptop_path(&p, &base, &roots) {
            Ok(clean) => {
                prop_assert!(roots.iter().any(|r| paths::is_within(&clean, r)), "{p:?} -> {clean:?} outside {roots:?}");
                prop_assert_eq!(paths::clean_absolute(&clean), Some(clean.clone()), "not clean");
                prop_assert!(clean.split('/').all(|s| s != ".." && s != "."), "{clean:?}");
                // Within means below, not a sibling that shares a prefix.
                let below = roots.iter().any(|r| *r == "/" || clean == *r || clean.starts_with(&format!("{r}/")));
                prop_assert!(below, "{clean:?} is not below any of {roots:?}");
            }
            Err(e) => prop_assert_eq!(e.code, Code::PathRefused),
        }
    }

    #[test]
    fn is_within_is_a_path_prefix_never_a_string_prefix(root in root(), rel in path_text(), suffix in "[a-z.-]{1,4}") {
        if let Some(inside) = paths::clean_absolute(&paths::join(&root, &rel)) {
            // A clean path under a root is within it; a sibling sharing a prefix is not.
            prop_assert!(paths::is_within(&inside, &root) || rel.split('/').any(|s| s == ".."));
        }
        if root != "/" {
            let sibling = format!("{root}{suffix}");
            prop_assert!(!paths::is_within(&sibling, &root), "{sibling} is within {root}");
        }
    }

    #[test]
    fn clean_absolute_is_idempotent_and_clean(p in path_text()) {
        if let Some(c) = paths::clean_absolute(&p) {
            prop_assert!(c.starts_with('/') && !c.contains("//") && !c.contains("/./") && !c.ends_with("/.") && !c.split('/').any(|s| s == ".."));
            prop_assert!(c == "/" || !c.ends_with('/'));
            prop_assert_eq!(paths::clean_absolute(&c), Some(c.clone()));
        }
    }

    #[test]
    fn is_clean_absolute_says_what_clean_absolute_would(p in path_text(), trailing in 0usize..3) {
        let p = format!("{p}{}", "/".repeat(trailing));
        let by_cleaning = paths::clean_absolute(&p).is_some_and(|c| c == p.trim_end_matches('/') || c == p);
        prop_assert_eq!(paths::is_clean_absolute(&p), by_cleaning, "{:?}", p);
    }

    #[test]
    fn first_json_never_panics_on_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = first_json(&bytes);
    }

    #[test]
    fn first_json_finds_the_document_past_noise(noise in prop::collection::vec("[a-zA-Z(][^\n]{0,30}", 0..4), v in json_value(), trailing in "[^\n]{0,20}") {
        prop_assume!(v.is_object() || v.is_array());
        let mut text = String::new();
        for line in &noise {
            text.push_str(line);
            text.push('\n');
        }
        text.push_str(&serde_json::to_string_pretty(&v).unwrap());
        text.push('\n');
        text.push_str(&trailing);
        prop_assert_eq!(first_json(text.as_bytes()), Some(v));
    }

    /// Every parse of boxd output (list, get, snapshots, new, exec) on any answer: a value or
    /// a classified failure that maps to a documented code.
    #[test]
    fn boxd_parsers_never_panic(answers in prop::collection::vec(reply(LIST), 6..=6), value in json_value()) {
        let mut p = Scripted::default();
        for a in answers {
            p.answers.push_back(a);
        }
        // Then the same arbitrary JSON value as each parser's stdout.
        for _ in 0..5 {
            p.push_exit(0, &value.to_string(), "");
        }
        let mut b = Boxd::new(&mut p, 10);
        let mut failures = Vec::new();
        if let Err(f) = b.hibernate("oc-w1") { failures.push(f) }
        for _ in 0..2 {
            if let Err(f) = b.list() { failures.push(f) }
            if let Err(f) = b.get("oc-w1") { failures.push(f) }
            if let Err(f) = b.snapshots() { failures.push(f) }
            if let Err(f) = b.create("oc-w1", "opencode-golden", 60) { failures.push(f) }
            if let Err(f) = b.exec("oc-w1", &["true"], None, 5) { failures.push(f) }
        }
        prop_assert_eq!(b.calls, 11);
        for f in failures {
            check_error(&f.into_error())?;
        }
    }

    /// A listing reads only when every row has a name (a row without one is a failure, not
    /// a machine that is not there), and then it keeps every row, a name of ours listed
    /// live twice as one row (boxd/tests name the rules for twins).
    #[test]
    fn a_listing_reads_only_when_every_row_has_a_name(rows in prop::collection::vec(json_value(), 0..6), twice in any::<bool>()) {
        let mut rows = rows;
        let names: Option<Vec<String>> = rows.iter().map(|r| r.get("name")?.as_str().filter(|n| !n.is_empty()).map(String::from)).collect();
        prop_assume!(names.as_ref().is_none_or(|n| n.iter().collect::<BTreeSet<_>>().len() == n.len()));
        if twice {
            rows.extend([json!({ "name": "oc-twice", "status": "running" }), json!({ "name": "oc-twice", "status": "hibernated" })]);
        }
        let mut p = Scripted::default();
        p.push_exit(0, &Value::Array(rows.clone()).to_string(), "");
        let got = Boxd::new(&mut p, 10).list();
        match names {
            Some(mut want) => {
                if twice {
                    want.push("oc-twice".into());
                }
                let got = got.unwrap();
                prop_assert_eq!(got.iter().map(|m| m.name.clone()).collect::<Vec<_>>(), want);
                if twice {
                    prop_assert!(got.last().is_some_and(|m| m.status.starts_with("listed 2 times")));
                }
            }
            None => check_error(&got.unwrap_err().into_error())?,
        }
    }

    /// The guest helper's replies: any exit code, any stdout and stderr, on the call, the
    /// upload it may trigger, the retry, and the `machine get` a failed exec is followed by.
    #[test]
    fn guest_replies_never_panic(
        command in select(&["status", "submit", "export", "git", "prepare", "import"][..]),
        answers in prop::collection::vec(reply(EXEC), 4..=4),
    ) {
        let mut p = Scripted::default();
        for a in answers.iter().cloned() {
            p.answers.push_back(a);
        }
        let mut b = Boxd::new(&mut p, 10);
        let r = Guest::new(&mut b, "oc-w1", "w1").call(command, &["--flag", "it's"], Some(b"payload".to_vec()));
        match r {
            Ok(v) => {
                // Success only from a run that exited 0 and printed JSON.
                let ok = answers.iter().any(|a| matches!(a, Ok(o) if o.exit_code == Some(0) && first_json(&o.stdout).as_ref() == Some(&v)));
                prop_assert!(ok, "{v} came from no answer that exited 0");
            }
            Err(e) => check_error(&e)?,
        }
        prop_assert!(p.requests.len() <= 4);
        for r in &p.requests {
            prop_assert!(!r.args.iter().any(|a| a.contains("payload")), "a payload travelled in argv");
        }
    }

    /// The helper's own error names a documented code, or becomes GUEST_FAILED.
    #[test]
    fn a_guest_error_reply_maps_to_a_code(kind in prop_oneof![select(Code::ALL).prop_map(|c| c.as_str().to_string()), text()], message in text()) {
        let mut p = Scripted::default();
        p.push_exit(3, &json!({ "error": kind, "message": message }).to_string(), "");
        let mut b = Boxd::new(&mut p, 10);
        let e = Guest::new(&mut b, "oc-w1", "w1").call("status", &[], None).unwrap_err();
        check_error(&e)?;
        let want = Code::parse(&kind).filter(|c| crate::guest::GUEST_CODES.contains(c)).unwrap_or(Code::GuestFailed);
        prop_assert_eq!(e.code, want);
    }

    #[test]
    fn the_ledger_reader_never_panics_on_any_bytes(bytes in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        json_value().prop_map(|v| v.to_string().into_bytes()),
        (1usize..2000, any::<u8>()).prop_map(|(d, k)| nested(d, k).into_bytes()),
    ]) {
        let mut fs = MemFiles::new(&["/l"]);
        fs.put("/l/works/w1/work.json", &bytes);
        match Ledger::new(&mut fs, "/l").read("w1") {
            Ok(_) => {}
            Err(e) => {
                prop_assert_eq!(e.code, Code::LedgerFailed);
                check_error(&e)?;
            }
        }
    }

    /// A real record with one field replaced by any JSON: it reads or is LEDGER_FAILED.
    #[test]
    fn a_damaged_record_reads_or_is_ledger_failed(w in good_work(), field in key(), value in json_value()) {
        let mut record = serde_json::to_value(&w).unwrap();
        record[field.as_str()] = value;
        let mut fs = MemFiles::new(&["/l"]);
        fs.put("/l/works/w1/work.json", record.to_string().as_bytes());
        if let Err(e) = Ledger::new(&mut fs, "/l").read("w1") {
            prop_assert_eq!(e.code, Code::LedgerFailed);
        }
    }

    #[test]
    fn a_record_round_trips(w in good_work(), dir in any::<String>(), warning in any::<String>(), at in any::<String>()) {
        let mut w = w;
        w.directory = dir;
        w.warnings.push(warning);
        w.created_at = at;
        let mut fs = MemFiles::new(&["/l"]);
        Ledger::new(&mut fs, "/l").write(&w).unwrap();
        prop_assert_eq!(Ledger::new(&mut fs, "/l").read("w1").unwrap(), Some(w));
    }

    /// `sh_quote` survives the guest's `sh -c`: unquoting it gives the word back.
    #[test]
    fn sh_quote_round_trips(word in any::<String>()) {
        prop_assert_eq!(sh_unquote(&sh_quote(&word)), Some(word));
    }

    #[test]
    fn text_helpers_never_panic(s in any::<String>(), bytes in prop::collection::vec(any::<u8>(), 0..600), max in 1usize..400) {
        let r = crate::redact::redact(&s, max);
        prop_assert!(r.chars().count() <= max);
        let t = crate::guest::tail(&bytes);
        prop_assert!(t.chars().count() <= 401);
        let _ = crate::encode::unbase64(&s);
        prop_assert_eq!(crate::encode::unbase64(&crate::encode::base64(&bytes)), Some(bytes.clone()));
        let _ = crate::options::in_tested_range(&s);
        let _ = crate::options::Options::parse(&s);
    }
}

/// The helper reports its failures by code name; a hostile guest must not be able to claim
/// a laptop-side code whose next step misleads (HOST_UNTESTED: "set allowUntestedHost";
/// ACCESS_DENIED: "set access"; HOST_FAILED, which only hosts return). Ignored until
/// guest.rs keeps only the guest-family codes (reported to the lead).
#[test]
fn a_guest_cannot_claim_a_laptop_code() {
    for code in ["HOST_FAILED", "HOST_UNTESTED", "ACCESS_DENIED", "APPROVAL_REQUIRED", "OPTIONS_INVALID", "LEDGER_FAILED", "BOXD_MISSING"] {
        let mut p = Scripted::default();
        p.push_exit(3, &json!({ "error": code, "message": "x" }).to_string(), "");
        let mut b = Boxd::new(&mut p, 10);
        let e = Guest::new(&mut b, "oc-w1", "w1").call("status", &[], None).unwrap_err();
        assert_eq!(e.code, Code::GuestFailed, "the guest claimed {code}");
    }
}

/// Messages never show Rust's debug formatting (issue 13, item 4): an exit code is a
/// number or "a signal", never `Some(1)` or `None`. Ignored until boxd.rs (cli_message)
/// and guest.rs (the helper's exit) print it plainly (reported to the lead).
#[test]
fn messages_show_no_debug_formatting() {
    let mut p = Scripted::default();
    p.push_fail(1, "");
    p.answers.push_back(Ok(RunOutput { exit_code: None, ..Default::default() }));
    p.push_fail(5, "boom");
    let mut b = Boxd::new(&mut p, 10);
    let mut messages = vec![b.list().unwrap_err().into_error().message, b.list().unwrap_err().into_error().message];
    messages.push(Guest::new(&mut b, "oc-w1", "w1").call("status", &[], None).unwrap_err().message);
    for m in messages {
        assert!(!m.contains("Some(") && !m.contains("None"), "{m}");
    }
}

fn path_text() -> impl Strategy<Value = String> {
    let seg = prop_oneof![
        4 => select(&["a", "b", "ab", "..", ".", "", "~", "é", "a b", "x\ny", "\u{0}", "...", "a..b"][..]).prop_map(String::from),
        1 => "[^/]{0,4}",
    ];
    (any::<bool>(), prop::collection::vec(seg, 0..6)).prop_map(|(abs, segs)| {
        let s = segs.join("/");
        if abs { format!("/{s}") } else { s }
    })
}

fn root() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => Just("/".to_string()),
        6 => prop::collection::vec(select(&["a", "b", "ab", "p", "srv", "é"][..]), 1..4).prop_map(|s| format!("/{}", s.join("/"))),
    ]
}

/// POSIX sh single-word unquoting, for the quoting forms `sh_quote` emits.
fn sh_unquote(s: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = s.chars();
    let mut any = false;
    while let Some(c) = chars.next() {
        any = true;
        match c {
            '\'' => loop {
                match chars.next()? {
                    '\'' => break,
                    c => out.push(c),
                }
            },
            '\\' => out.push(chars.next()?),
            c if c.is_ascii_alphanumeric() || "-_./=:@%+,".contains(c) => out.push(c),
            _ => return None,
        }
    }
    any.then_some(out)
}

// ---------------------------------------------------------------------------------------
// Deep nesting: serde_json stops at depth 128, so hostile JSON is an error, not a stack
// overflow (a trap in the wasm build). Each entry point is checked at 100 000 levels.

const DEEP: usize = 100_000;

fn deep_raw(options: &str, facts: &str) -> RawContext {
    raw(("boxd-host", "0.1.0"), options, facts, &[7; 32])
}

#[test]
fn deeply_nested_arguments_are_args_invalid() {
    for kind in 0..3 {
        let mut fs = laptop(&Before::Empty);
        let mut p = Scripted::default();
        let e = call(&mut p, &mut fs, "boxd_job", &nested(DEEP, kind), deep_raw("{}", "{}")).unwrap_err();
        assert_eq!(e.code, Code::ArgsInvalid, "{}", e.message);
        assert!(p.requests.is_empty());
    }
    // Just inside the limit it parses, and is refused by the schema instead.
    let mut fs = laptop(&Before::Empty);
    let e = call(&mut Scripted::default(), &mut fs, "boxd_job", &format!("{{\"work\":{}}}", nested(120, 0)), deep_raw("{}", "{}")).unwrap_err();
    assert_eq!(e.code, Code::ArgsInvalid);
    assert!(e.message.contains("'work' must be a string"), "{}", e.message);
}

#[test]
fn deeply_nested_options_are_refused_and_approval_is_typed() {
    let mut fs = laptop(&Before::Empty);
    let e = call(&mut Scripted::default(), &mut fs, "boxd_job", r#"{"work":"w1"}"#, deep_raw(&nested(DEEP, 1), "{}")).unwrap_err();
    assert_eq!(e.code, Code::OptionsInvalid);
    // Without the typed approval a change asks first.
    let e = call(&mut Scripted::default(), &mut fs, "boxd_drop", r#"{"work":"w1"}"#, deep_raw(r#"{"access":"ask-changes"}"#, "{}")).unwrap_err();
    assert_eq!(e.code, Code::ApprovalRequired);
}

#[test]
fn deeply_nested_boxd_output_is_no_json() {
    for kind in 0..3 {
        let text = nested(DEEP, kind);
        assert_eq!(first_json(text.as_bytes()), None);
        let mut p = Scripted::default();
        p.push_exit(0, &text, "");
        let e = Boxd::new(&mut p, 10).list().unwrap_err().into_error();
        assert_eq!(e.code, Code::BoxdFailed, "{}", e.message);
    }
}

#[test]
fn a_deeply_nested_guest_reply_is_guest_failed_and_a_deep_but_legal_one_still_answers() {
    let mut p = Scripted::default();
    p.push_exit(0, &nested(DEEP, 0), "");
    let mut b = Boxd::new(&mut p, 10);
    let e = Guest::new(&mut b, "oc-w1", "w1").call("status", &[], None).unwrap_err();
    assert_eq!(e.code, Code::GuestFailed);
    let mut p = Scripted::default();
    p.push_exit(3, &format!("{{\"error\":{}}}", nested(DEEP, 1)), "");
    let mut b = Boxd::new(&mut p, 10);
    assert_eq!(Guest::new(&mut b, "oc-w1", "w1").call("status", &[], None).unwrap_err().code, Code::GuestFailed);

    // Through boxd_job: a status whose `pending` is as deep as serde_json allows. The answer
    // must still be JSON a host can read back (its own parser has the same limit).
    let mut w = Work::new("w1", "/p", "t");
    w.state = WorkState::Open;
    w.machine_id = Some("m-1".into());
    for depth in [125, 126, 127, 128, 200] {
        let mut fs = laptop(&Before::Record(w.clone()));
        let mut world = healthy();
        world.routes.insert("exec:status", vec![out(Some(0), format!("{{\"state\":\"idle\",\"outcome\":\"completed\",\"pending\":{}}}", nested(depth, 0)), "")]);
        let mut p = Answers::new(world);
        match call(&mut p, &mut fs, "boxd_job", r#"{"work":"w1"}"#, deep_raw("{}", "{}")) {
            Ok(v) => {
                let text = serde_json::to_string(&v).unwrap();
                assert!(serde_json::from_str::<Value>(&text).is_ok(), "depth {depth}: boxd_job's answer is too deep for a host to read back");
            }
            Err(e) => assert_eq!(e.code, Code::GuestFailed, "depth {depth}: {}", e.message),
        }
    }
}

#[test]
fn a_deeply_nested_ledger_record_is_ledger_failed() {
    for kind in 0..3 {
        let mut fs = MemFiles::new(&["/l"]);
        fs.put("/l/works/w1/work.json", nested(DEEP, kind).as_bytes());
        assert_eq!(Ledger::new(&mut fs, "/l").read("w1").unwrap_err().code, Code::LedgerFailed);
    }
    // Deep inside a real record (its warnings).
    let mut record = serde_json::to_value(Work::new("w1", "/p", "t")).unwrap();
    record["warnings"] = json!([]);
    let text = record.to_string().replace("\"warnings\":[]", &format!("\"warnings\":{}", nested(DEEP, 0)));
    let mut fs = MemFiles::new(&["/l"]);
    fs.put("/l/works/w1/work.json", text.as_bytes());
    assert_eq!(Ledger::new(&mut fs, "/l").read("w1").unwrap_err().code, Code::LedgerFailed);
    // And boxd_status reports it rather than trapping.
    let mut fs2 = laptop(&Before::Empty);
    fs2.put("/l/works/w1/work.json", text.as_bytes());
    let r = call(&mut Answers::new(healthy()), &mut fs2, "boxd_status", "{}", deep_raw("{}", "{}"));
    if let Err(e) = r {
        assert!([Code::StatusUnavailable, Code::LedgerFailed].contains(&e.code), "{e:?}");
    }
}
