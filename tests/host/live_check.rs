//! `boxd-host live-check` against boxd-local: the same contract a user runs against real
//! boxd. Every check holds here; an injected fault makes one differ; a hang, Ctrl-C and a
//! killed host still end with nothing of the run's left (no machine, snapshot or env var).

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

struct Check {
    laptop: Laptop,
    state: std::path::PathBuf,
    audit: std::path::PathBuf,
}

impl Check {
    /// A laptop whose boxd-local has the golden image (and nothing else).
    fn new(name: &str) -> Check {
        let laptop = Laptop::new(name);
        for args in [&["machine", "new", "seed", "--json"][..], &["snapshots", "save", "seed", "opencode-golden"], &["machine", "remove", "seed", "-y"]] {
            let out = laptop.boxd(args);
            assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let state = laptop.scratch.path("state");
        let audit = laptop.scratch.0.join("audit.jsonl");
        Check { laptop, state, audit }
    }

    fn command(&self, flags: &[&str]) -> Command {
        let mut cmd = Command::new(boxd_host());
        cmd.arg("--project").arg(&self.laptop.project).arg("--ledger").arg(&self.laptop.ledger).arg("--boxd").arg(boxd_local());
        cmd.arg("--audit-log").arg(&self.audit).arg("live-check").args(flags);
        cmd.env("BOXD_LOCAL_HOME", &self.laptop.boxd_home).env("XDG_STATE_HOME", &self.state);
        cmd
    }

    fn run(&self, flags: &[&str]) -> (i32, String) {
        let out = self.command(flags).output().unwrap();
        (out.status.code().unwrap_or(-1), stdout(&out))
    }

    fn faults(&self, json: &str) {
        std::fs::write(self.laptop.boxd_home.join("faults.json"), json).unwrap();
    }

    fn listing(&self, args: &[&str]) -> serde_json::Value {
        stdout_json(&self.laptop.boxd(args))
    }

    /// Nothing of any live-check run is left: no machine, no snapshot but the golden
    /// image, no env var, no record of an unfinished run.
    fn assert_nothing_left(&self) {
        assert_eq!(self.listing(&["machine", "list", "--json"]), serde_json::json!([]));
        let snaps = self.listing(&["snapshots", "list", "--json"]);
        let names: Vec<&str> = snaps.as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
        assert_eq!(names, ["opencode-golden"]);
        assert_eq!(self.listing(&["env", "list", "--json"]), serde_json::json!([]));
        let records = std::fs::read_dir(self.state.join("opencode-boxd")).map(|d| d.count()).unwrap_or(0);
        assert_eq!(records, 0, "a run's record is left in {}", self.state.display());
    }

    /// Until the run `pid` has a boxd call starting with `prefix` running (a child of one of
    /// its threads). The call log cannot tell: boxd-local writes a call's line as it ends.
    fn wait_for_running(&self, run: &mut std::process::Child, prefix: &[&str]) {
        let pid = run.id();
        assert!(
            std::path::Path::new(&format!("/proc/{pid}/task/{pid}/children")).exists(),
            "this kernel does not list a thread's children (/proc/PID/task/TID/children): the test cannot tell when the call runs"
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        // A child's argv after its program starts with `prefix`.
        let runs_prefix = |child: &str| {
            let argv = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = argv.split(|b| *b == 0).skip(1).collect();
            args.len() >= prefix.len() && prefix.iter().zip(&args).all(|(p, a)| p.as_bytes() == *a)
        };
        let running = || {
            let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
            let children: String = tasks.filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok()).collect::<Vec<_>>().join(" ");
            children.split_whitespace().any(runs_prefix)
        };
        while !running() {
            assert!(run.try_wait().unwrap().is_none(), "live-check ended before it ran {prefix:?}");
            assert!(Instant::now() < deadline, "live-check never ran {prefix:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Until boxd-local logs a call of the run (not the golden image's) starting with `prefix`.
    fn wait_for_call(&self, prefix: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let of_the_run = |c: &Vec<String>| c.len() >= prefix.len() && c[..prefix.len()] == *prefix && c.iter().any(|a| a.starts_with("live-check-"));
        while !self.laptop.boxd_calls().iter().any(of_the_run) {
            assert!(Instant::now() < deadline, "live-check never reached {prefix:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The table's rows: (#, result, seen).
fn rows(table: &str) -> Vec<(u32, String, String)> {
    table
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.strip_prefix("| ")?.strip_suffix(" |")?.split(" | ").collect();
            let id = cells.first()?.parse().ok()?;
            Some((id, cells.get(2)?.to_string(), cells.get(4).unwrap_or(&"").to_string()))
        })
        .collect()
}

fn result_of(table: &str, id: u32) -> String {
    rows(table).into_iter().find(|r| r.0 == id).map(|r| r.1).unwrap_or_default()
}

#[test]
fn every_check_holds_against_boxd_local_and_nothing_is_left() {
    let c = Check::new("lc-held");
    let (code, table) = c.run(&["--sign-out"]);
    assert_eq!(code, 0, "{table}");
    assert!(table.contains("| # | behaviour | result | expected | seen |\n|---|---|---|---|---|\n"), "{table}");
    let rows = rows(&table);
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), (1..=16).collect::<Vec<_>>(), "{table}");
    assert!(rows.iter().all(|r| r.1 == "held"), "{table}");
    assert!(table.contains("16 checks: 16 held, 0 differ, 0 could not check"), "{table}");
    c.assert_nothing_left();
    let calls = c.laptop.boxd_calls().len() - 3 - 3; // the golden image's and assert_nothing_left's
    assert!(c.laptop.boxd(&["auth", "--json"]).status.success(), "live-check signs back in after the sign-out check");

    // Every call is in the audit log, under a live-check grant or named as the user's own.
    let audit = std::fs::read_to_string(&c.audit).unwrap();
    let grants: Vec<String> = audit.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["spawns"][0]["grant"].as_str().unwrap_or_default().to_string()).collect();
    assert!(grants.iter().any(|g| g == "boxd live-check-new") && grants.iter().any(|g| g == "boxd live-check-exec"), "{grants:?}");
    assert!(grants.iter().all(|g| g.starts_with("boxd ") || g.starts_with("host: live-check")), "{grants:?}");
    assert_eq!(audit.lines().count(), calls, "one audit line per boxd call of the run");
}

#[test]
fn the_real_clis_noise_before_json_does_not_break_the_contract() {
    let c = Check::new("lc-noise");
    let out = c.command(&[]).env("BOXD_LOCAL_NOISE", "1").output().unwrap();
    let table = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{table}");
    assert_eq!(result_of(&table, 2), "held", "{table}");
    c.assert_nothing_left();
}

#[test]
fn without_the_flag_the_sign_out_check_is_not_run() {
    let c = Check::new("lc-nosignout");
    let (code, table) = c.run(&[]);
    assert_eq!(code, 0, "{table}");
    let row = rows(&table).into_iter().find(|r| r.0 == 16).unwrap();
    assert_eq!((row.1.as_str(), row.2.contains("would sign you out")), ("could not check", true), "{table}");
    assert!(!c.laptop.boxd_calls().iter().any(|a| a.first().map(String::as_str) == Some("auth")), "no auth call at all");
    c.assert_nothing_left();
}

#[test]
fn a_fault_makes_its_check_differ_and_the_run_still_cleans_up() {
    let c = Check::new("lc-differs");
    // The first exec (check 6) answers like a broken CLI.
    c.faults(r#"[{"verb":"machine exec","times":1,"action":"fail","exit_code":3,"message":"boom"}]"#);
    let (code, table) = c.run(&[]);
    assert_eq!(code, 1, "{table}");
    assert_eq!(result_of(&table, 6), "differs", "{table}");
    assert!(table.contains("error: boom"), "what was seen is shown: {table}");
    assert_eq!(result_of(&table, 3), "held", "{table}");
    c.assert_nothing_left();
}

#[test]
fn a_hanging_cli_times_out_and_the_run_still_cleans_up() {
    let c = Check::new("lc-hang");
    c.faults(r#"[{"verb":"machine hibernate","action":"hang"}]"#);
    let started = Instant::now();
    let (code, table) = c.run(&["--call-timeout", "3"]);
    assert!(started.elapsed() < Duration::from_secs(60), "bounded by the call timeout");
    assert_eq!(result_of(&table, 9), "could not check", "{table}");
    assert!(table.contains("no answer within 3 s"), "{table}");
    assert_eq!(code, 0, "nothing differs: {table}");
    c.assert_nothing_left();
}

#[test]
fn a_signed_out_cli_could_not_start_and_nothing_is_made() {
    let c = Check::new("lc-signedout");
    assert!(c.laptop.boxd(&["auth", "logout"]).status.success());
    let out = c.command(&[]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("live-check could not start"), "{}", String::from_utf8_lossy(&out.stderr));
    let calls = c.laptop.boxd_calls();
    assert_eq!(calls.last().unwrap()[..2], ["machine", "get"], "only the absence check ran: {calls:?}");
    assert!(c.laptop.boxd(&["auth", "login"]).status.success());
    c.assert_nothing_left();
}

#[test]
fn a_name_that_answers_as_existing_is_refused_before_anything_is_made() {
    let c = Check::new("lc-taken");
    // `machine get` of the fresh name answers 0: as if a machine of that name existed.
    c.faults(r#"[{"verb":"machine get","times":1,"action":"garbage","output":"{}"}]"#);
    let out = c.command(&[]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists; live-check touches only what it makes"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(c.laptop.boxd_calls().len(), 3 + 1, "nothing but the absence check ran");
    c.assert_nothing_left();
}

#[test]
fn ctrl_c_ends_the_run_in_its_cleanup() {
    let c = Check::new("lc-sigint");
    c.faults(r#"[{"verb":"machine hibernate","times":1,"action":"delay","ms":3000}]"#);
    let mut child = c.command(&[]).stdout(Stdio::piped()).spawn().unwrap();
    // While the delayed call runs: its log line is written only as it ends, and by then the
    // rest of the run may be done before the signal lands.
    c.wait_for_running(&mut child, &["machine", "hibernate"]);
    assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
    let out = child.wait_with_output().unwrap();
    let table = stdout(&out);
    assert_eq!(out.status.code(), Some(130), "{table}");
    assert!(table.contains("interrupted"), "{table}");
    c.assert_nothing_left();
}

#[test]
fn a_killed_run_is_cleaned_up_by_the_next() {
    let c = Check::new("lc-killed");
    c.faults(r#"[{"verb":"snapshots save","times":1,"action":"hang"}]"#);
    let mut child = c.command(&[]).stdout(Stdio::null()).spawn().unwrap();
    c.wait_for_call(&["snapshots", "save"]);
    child.kill().unwrap(); // SIGKILL: no cleanup in this run
    child.wait().unwrap();
    let machines = c.listing(&["machine", "list", "--json"]);
    assert_eq!(machines.as_array().unwrap().len(), 1, "the killed run left its machine: {machines}");
    assert_eq!(c.listing(&["env", "list", "--json"]).as_array().unwrap().len(), 1, "and its env var");

    let (code, out) = c.run(&[]);
    assert_eq!(code, 0, "{out}");
    let left = machines[0]["name"].as_str().unwrap();
    assert!(out.contains(&format!("earlier run (machine {left}) did not finish")), "{out}");
    assert!(out.contains(&format!("cleanup: removed machine {left}")), "{out}");
    c.assert_nothing_left();
}

#[test]
fn docs_live_check_md_holds_the_contract_table() {
    let out = Command::new(boxd_host()).args(["live-check", "--contract"]).output().unwrap();
    assert!(out.status.success());
    let table = stdout(&out);
    assert_eq!(table.lines().count(), 18, "a header, a rule and 16 rows: {table}");
    let doc = std::fs::read_to_string(repo().join("docs/live-check.md")).unwrap();
    assert!(doc.contains(&table), "docs/live-check.md must hold `boxd-host live-check --contract` verbatim:\n{table}");
}
