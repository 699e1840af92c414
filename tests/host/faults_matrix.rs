//! The fault matrix: boxd-local's faults × the nine tools, each cell one `boxd-host call`
//! against a work with a real guest. Every cell must answer JSON that is either a success
//! or `{error, message, next}` with a code docs/configuration.md documents; the host exits
//! 0 or 1 (never a trap); and every ledger record still parses. Exact codes are printed,
//! not asserted: they are the tools' business and change with them.
//!
//! `cargo test -p boxd-host --test host faults_matrix -- --nocapture` runs a representative
//! subset and prints it; the whole matrix (10 faults × 9 tools, several minutes) is
//! `cargo test -p boxd-host --test host faults_matrix_full -- --ignored --nocapture`.
//! A cell marked `·` is one where the fault never fired (the tool made no such call).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::*;

const W1: &str = r#"{"work":"w1"}"#;
/// Every cell runs with a short boxd bound, so a hang costs seconds (the minimum is 5).
const CELL_OPTIONS: &str = r#"{"boxdTimeoutSeconds":5}"#;

pub struct Fault {
    pub name: &'static str,
    pub rules: &'static str,
}

pub const FAULTS: &[Fault] = &[
    Fault { name: "hang", rules: r#"[{"verb":"*","times":1,"action":"hang","ms":8000}]"# },
    Fault { name: "fail", rules: r#"[{"verb":"*","times":1,"action":"fail","message":"internal"}]"# },
    Fault { name: "garbage", rules: r#"[{"verb":"*","times":1,"action":"garbage"}]"# },
    Fault { name: "signed_out", rules: r#"[{"verb":"*","times":1,"action":"signed_out"}]"# },
    Fault { name: "network", rules: r#"[{"verb":"*","times":1,"action":"network"}]"# },
    Fault { name: "vanished", rules: r#"[{"verb":"*","times":1,"action":"lose_machine","machine":"oc-w1"}]"# },
    // The create lands after boxd stopped answering (ensure of a new work; resume of a gone one).
    Fault { name: "late_create", rules: r#"[{"verb":"machine new","times":1,"action":"hang","ms":8000,"land":true}]"# },
    Fault { name: "exec_fail", rules: r#"[{"verb":"machine exec","times":1,"action":"fail","message":"internal"}]"# },
    Fault { name: "exec_garbage", rules: r#"[{"verb":"machine exec","times":1,"action":"garbage"}]"# },
    // boxd-local's own exec bound fires (exit 124) before the host's 150 s deadline would.
    Fault { name: "exec_hang", rules: r#"[{"verb":"machine exec","times":1,"action":"hang","ms":3000}]"# },
];

pub const TOOLS: &[&str] =
    &["boxd_status", "boxd_job", "boxd_submit", "boxd_harvest", "boxd_image", "boxd_sleep", "boxd_resume", "boxd_ensure", "boxd_fork", "boxd_drop"];

/// The codes docs/configuration.md documents (its error table).
pub fn documented_codes() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(repo().join("docs/configuration.md")).unwrap();
    doc.lines()
        .filter(|l| l.starts_with("| `") && l.matches('|').count() == 4)
        .filter_map(|l| l.split('`').nth(1))
        .filter(|c| c.chars().all(|ch| ch.is_ascii_uppercase() || ch == '_'))
        .map(String::from)
        .collect()
}

/// Every `works/*/work.json` parses as a record; the problems otherwise.
pub fn ledger_problems(ledger: &std::path::Path) -> Vec<String> {
    let mut problems = Vec::new();
    let Ok(dirs) = std::fs::read_dir(ledger.join("works")) else { return problems };
    for d in dirs.flatten() {
        let record = d.path().join("work.json");
        let Ok(bytes) = std::fs::read(&record) else { continue };
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) if v["work"].is_string() && v["schema"].is_u64() => {}
            Ok(v) => problems.push(format!("{} is not a record: {v}", record.display())),
            Err(e) => problems.push(format!("{} does not parse: {e}", record.display())),
        }
    }
    problems
}

struct Cell {
    fault: &'static str,
    tool: &'static str,
    shown: String,
    fired: bool,
    secs: f32,
}

struct Matrix {
    world: World,
    codes: BTreeSet<String>,
    cells: Vec<Cell>,
    problems: Vec<String>,
    n: u32,
}

impl Matrix {
    fn new(name: &str) -> Matrix {
        let world = World::new(name);
        let m = Matrix { world, codes: documented_codes(), cells: Vec::new(), problems: Vec::new(), n: 0 };
        m.world.ok_call("boxd_ensure", W1);
        m.heal();
        m
    }

    fn args(&self, tool: &str) -> String {
        match tool {
            "boxd_status" => "{}".into(),
            "boxd_submit" => json!({ "work": "w1", "prompt": format!("matrix cell {}", self.n) }).to_string(),
            "boxd_image" => json!({ "work": "w1", "name": format!("img-{}", self.n) }).to_string(),
            // A new work each time, so the create path runs.
            "boxd_ensure" => json!({ "work": format!("e{}", self.n) }).to_string(),
            // A new fork each time, so the fork path runs (a refusal is a documented code).
            "boxd_fork" => json!({ "work": "w1", "forks": [format!("f{}", self.n)] }).to_string(),
            _ => W1.into(),
        }
    }

    fn run(&mut self, fault: &Fault, tool: &'static str) {
        self.n += 1;
        if fault.name == "late_create" && tool == "boxd_resume" {
            // Resume creates only for a gone machine.
            assert!(self.world.laptop.boxd(&["machine", "remove", "oc-w1", "-y"]).status.success());
        }
        let args = self.args(tool);
        self.world.forget_calls();
        self.world.faults(fault.rules);
        let started = Instant::now();
        let out = self.world.call_output(&["--options", CELL_OPTIONS], tool, &args);
        let secs = started.elapsed().as_secs_f32();
        let fired = std::fs::read_to_string(self.world.laptop.boxd_home.join("calls.jsonl")).unwrap_or_default().contains("\"fault\":");
        let at = format!("{} × {tool}", fault.name);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        if !matches!(code, Some(0) | Some(1)) {
            self.problems.push(format!("{at}: the host exited {code:?}: {stderr}"));
        }
        if stderr.contains("wasm trap") || stderr.contains("panicked") {
            self.problems.push(format!("{at}: a trap reached the user: {stderr}"));
        }
        let shown = match serde_json::from_slice::<Value>(&out.stdout) {
            Err(e) => {
                self.problems.push(format!("{at}: the answer is not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
                "NOT JSON".to_string()
            }
            Ok(v) => match (code, v["error"].as_str()) {
                (Some(0), None) => "ok".to_string(),
                (Some(1), Some(e)) => {
                    if !self.codes.contains(e) {
                        self.problems.push(format!("{at}: {e} is not documented in docs/configuration.md"));
                    }
                    for key in ["message", "next"] {
                        if !v[key].as_str().is_some_and(|s| !s.trim().is_empty()) {
                            self.problems.push(format!("{at}: {e} has no {key}: {v}"));
                        }
                    }
                    if v.as_object().map(|o| o.len()) != Some(3) {
                        self.problems.push(format!("{at}: the error is not exactly {{error, message, next}}: {v}"));
                    }
                    e.to_string()
                }
                _ => {
                    self.problems.push(format!("{at}: exit {code:?} with {v}"));
                    "INCONSISTENT".to_string()
                }
            },
        };
        for p in ledger_problems(&self.world.laptop.ledger) {
            self.problems.push(format!("{at}: {p}"));
        }
        eprintln!("cell {at}: {shown}"); // with --nocapture, where a long run is
        self.cells.push(Cell { fault: fault.name, tool, shown, fired, secs });
        self.heal();
    }

    /// Back to the baseline with no fault: signed in, only oc-w1, running and idle, its
    /// work tree a clean git repository, and the work proven (so image and drop go deep).
    fn heal(&self) {
        let w = &self.world;
        let _ = std::fs::remove_file(w.laptop.boxd_home.join("faults.json"));
        assert!(w.laptop.boxd(&["auth", "login"]).status.success());
        let (code, status) = w.call("boxd_status", "{}");
        assert_eq!(code, 0, "boxd_status must read the ledger after every cell: {status:#}");
        for m in listed(w) {
            if m.0 != "oc-w1" {
                let _ = w.laptop.boxd(&["machine", "remove", &m.0, "-y"]);
            }
        }
        let record = || -> Value {
            std::fs::read(w.laptop.ledger.join("works/w1/work.json")).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or(Value::Null)
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        // A new or rebuilt machine has an empty work tree: its git state is harvested afresh.
        let mut fresh = false;
        loop {
            let rec = record();
            let state = listed(w).into_iter().find(|m| m.0 == "oc-w1").map(|m| m.1);
            match (rec["state"].as_str(), state.as_deref()) {
                (None | Some("closed") | Some("creating"), _) => {
                    fresh = true;
                    let (_, v) = w.call("boxd_ensure", W1);
                    if v["error"] == "MACHINE_STARTING" || v["error"] == "CREATE_UNCERTAIN" {
                        std::thread::sleep(Duration::from_millis(500));
                    }
                }
                (_, None) | (_, Some("hibernated" | "standby" | "stopped" | "failed")) => {
                    fresh |= state.is_none();
                    w.ok_call("boxd_resume", W1);
                }
                (_, Some("running")) => break,
                _ => std::thread::sleep(Duration::from_millis(500)),
            }
            assert!(Instant::now() < deadline, "the baseline did not come back: {:#}", record());
        }
        // The guest answers (a server killed by a fault is restarted by the first job).
        let mut v = w.job_until_idle("w1");
        for _ in 0..3 {
            if v["error"].is_null() {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
            v = w.job_until_idle("w1");
        }
        let out = w.on_machine("oc-w1", "cd work/w1 && { git rev-parse --git-dir >/dev/null 2>&1 || { git init -q && git -c user.email=t@t -c user.name=t commit -q --allow-empty -m init; }; }");
        assert!(out.status.success(), "git init on the guest: {}", String::from_utf8_lossy(&out.stderr));
        let rec = record();
        let prompts = rec["prompts"].as_array().map_or(0, Vec::len) as u64;
        let git = rec["git"]["prompts"].as_u64() >= Some(prompts) && rec["git"]["head"].as_str().is_some_and(|h| !h.is_empty());
        // Proven as the component judges it (boxd_status), not as this test would.
        let status = w.ok_call("boxd_status", "{}");
        let proven = status["works"].as_array().into_iter().flatten().any(|x| x["work"] == "w1" && x["proven"] == true);
        if fresh || !proven || !git {
            w.ok_call("boxd_harvest", W1);
        }
    }

    /// Print the matrix; then fail with every problem found.
    fn finish(self) {
        let faults: Vec<&str> = {
            let mut seen = Vec::new();
            for c in &self.cells {
                if !seen.contains(&c.fault) {
                    seen.push(c.fault);
                }
            }
            seen
        };
        let tools: Vec<&str> = TOOLS.iter().copied().filter(|t| self.cells.iter().any(|c| c.tool == *t)).collect();
        let mut table = format!("\nfault matrix ({} cells; · = the fault did not fire; time in s)\n{:<13}", self.cells.len(), "");
        for t in &tools {
            table.push_str(&format!("| {:<21}", t.trim_start_matches("boxd_")));
        }
        table.push('\n');
        for f in &faults {
            table.push_str(&format!("{f:<13}"));
            for t in &tools {
                let text = match self.cells.iter().find(|c| c.fault == *f && c.tool == *t) {
                    Some(c) => format!("{}{} {:.1}", c.shown, if c.fired { "" } else { " ·" }, c.secs),
                    None => String::new(),
                };
                table.push_str(&format!("| {text:<21}"));
            }
            table.push('\n');
        }
        println!("{table}");
        assert!(self.problems.is_empty(), "{} problems:\n{}", self.problems.len(), self.problems.join("\n"));
    }
}

/// (name, status) of every machine boxd-local lists.
fn listed(w: &World) -> Vec<(String, String)> {
    let out = w.laptop.boxd(&["machine", "list", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v.as_array()
        .into_iter()
        .flatten()
        .map(|m| (m["name"].as_str().unwrap_or("").to_string(), m["status"].as_str().unwrap_or("").to_string()))
        .collect()
}

fn fault(name: &str) -> &'static Fault {
    FAULTS.iter().find(|f| f.name == name).unwrap()
}

/// A representative subset: every fault at least once, every tool at least once.
#[test]
fn faults_matrix() {
    let mut m = Matrix::new("faults-subset");
    for (f, t) in [
        ("garbage", "boxd_status"),
        ("hang", "boxd_job"),
        ("network", "boxd_submit"),
        ("exec_hang", "boxd_harvest"),
        ("fail", "boxd_image"),
        ("signed_out", "boxd_sleep"),
        ("late_create", "boxd_resume"),
        ("fail", "boxd_ensure"),
        ("exec_fail", "boxd_submit"),
        ("exec_garbage", "boxd_job"),
        ("vanished", "boxd_harvest"),
        ("vanished", "boxd_drop"),
    ] {
        m.run(fault(f), t);
    }
    m.finish();
}

/// Every fault × every tool (several minutes).
#[test]
#[ignore = "the full fault matrix: cargo test -p boxd-host --test host faults_matrix_full -- --ignored --nocapture"]
fn faults_matrix_full() {
    let mut m = Matrix::new("faults-full");
    for f in FAULTS {
        for t in TOOLS {
            m.run(f, t);
        }
    }
    m.finish();
}
