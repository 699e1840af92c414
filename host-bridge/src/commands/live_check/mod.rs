//! `boxd-host live-check`: the contract the plugin relies on (contract.rs, docs/live-check.md)
//! run against the user's own boxd CLI with one throwaway machine, printed as a table of
//! held / differs / could not check. It always removes what it made: after a failed check,
//! a timeout, or Ctrl-C (SIGINT/SIGTERM end the current call's wait, then the cleanup
//! runs); a run that was killed leaves a record the next run cleans up first (records.rs).
//! It never touches a name it did not pick and find absent first.
//!
//! Exit codes: 0 every check held (or could not be made), 1 a check differs or something
//! is left, 2 the run could not start, 130 interrupted.

mod checks;
pub mod contract;
mod records;
mod runner;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;

use crate::audit::AuditLog;
use crate::cli::{Grants, LiveCheckArgs};
use checks::{Checks, Cleaned, Names, Verdict};
use runner::Boxd;

pub fn run(grants: &Grants, args: &LiveCheckArgs) -> Result<u8> {
    if args.contract {
        crate::out!("{}", contract::markdown());
        return Ok(0);
    }
    let request = crate::policy::GrantRequest {
        programs: grants.boxd.iter().map(|p| ("boxd".to_string(), p.clone())).collect(),
        project: grants.project.clone().unwrap_or_default(),
        ledger: grants.ledger.clone(),
        allow_roots: grants.allow_roots.clone(),
        options: grants.options.clone(),
        env: std::env::vars().collect(),
        cwd: std::env::current_dir()?,
    };
    let policy = match crate::policy::resolve(&request) {
        Ok(g) => g.policy,
        Err(problem) => return Ok(cannot_start(&problem.to_string())),
    };
    let mut audit = AuditLog::open(grants.audit_log.as_deref())?;
    let mut boxd = match Boxd::new(&policy, &mut audit, Duration::from_secs(args.call_timeout)) {
        Ok(b) => b,
        Err(why) => return Ok(cannot_start(&why)),
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    let dir = records::dir();
    let mut left_over = clean_earlier_runs(&mut boxd, &dir, &stop);

    let mut checks = Checks::new(&mut boxd, Names::fresh(), args.snapshot.clone(), &stop);
    if let Err(why) = checks.preflight() {
        return Ok(cannot_start(&why));
    }
    let binary = checks_binary(&policy);
    let started_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let record = match records::open(&dir, &records::Doc { boxd: binary.clone(), names: checks.names().clone(), started_ms }) {
        Ok(r) => r,
        // Without the record a killed run could not be cleaned up: make nothing.
        Err(e) => return Ok(cannot_start(&format!("{e:#}"))),
    };
    crate::outln!("live-check: {} with machine {}", binary.display(), checks.names().machine);
    checks.run();
    let cleaned = checks.cleanup();
    let interrupted = stop.load(std::sync::atomic::Ordering::SeqCst);
    let signed_out = checks.sign_out(args.sign_out, interrupted);

    print_table(&checks.verdicts);
    let mut everything_gone = true;
    for c in &cleaned {
        everything_gone &= matches!(c, Cleaned::Gone { .. });
        crate::outln!("{}", cleanup_line(c));
    }
    if everything_gone {
        record.done();
    } else {
        crate::outln!("cleanup: the record of this run stays in {}; the next live-check removes what is left", dir.display());
    }
    left_over |= !everything_gone;
    if let Some(note) = signed_out {
        crate::outln!("{note}");
    }
    let differs = checks.verdicts.values().any(|v| matches!(v, Verdict::Differs { .. }));
    Ok(if interrupted { 130 } else if differs || left_over { 1 } else { 0 })
}

fn checks_binary(policy: &crate::policy::Policy) -> std::path::PathBuf {
    policy.programs().get("boxd").cloned().unwrap_or_default()
}

fn cannot_start(why: &str) -> u8 {
    eprintln!("live-check could not start: {why}");
    2
}

/// Remove what killed runs left (their records say what), before this run makes anything.
/// True when something is still left.
fn clean_earlier_runs(boxd: &mut Boxd, dir: &std::path::Path, stop: &AtomicBool) -> bool {
    let (found, unreadable) = records::leftovers(dir);
    let mut left = false;
    for path in unreadable {
        crate::outln!("earlier run: {path} does not parse; remove it after checking by hand what it names");
        left = true;
    }
    for leftover in found {
        let doc = &leftover.doc;
        if doc.boxd != boxd.binary() {
            crate::outln!("earlier run with {}: {} is left; run live-check with --boxd {}", doc.boxd.display(), leftover.path.display(), doc.boxd.display());
            left = true;
            continue;
        }
        crate::outln!("earlier run (machine {}) did not finish: removing what it made", doc.names.machine);
        let mut checks = Checks::new(boxd, doc.names.clone(), String::new(), stop);
        checks.made = checks::Made { machine: true, snapshot: true, var: true };
        let cleaned = checks.cleanup();
        let gone = cleaned.iter().all(|c| matches!(c, Cleaned::Gone { .. }));
        for c in &cleaned {
            crate::outln!("{}", cleanup_line(c));
        }
        if gone {
            leftover.forget();
        } else {
            left = true;
        }
    }
    left
}

fn cleanup_line(c: &Cleaned) -> String {
    match c {
        Cleaned::Gone { what, removed: true } => format!("cleanup: removed {what}"),
        Cleaned::Gone { what, removed: false } => format!("cleanup: {what} was not there"),
        Cleaned::Left { what, why, run } => format!("cleanup: LEFT {what} ({why}); remove it with: {run}"),
    }
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

fn print_table(verdicts: &std::collections::BTreeMap<u8, Verdict>) {
    crate::outln!("| # | behaviour | result | expected | seen |");
    crate::outln!("|---|---|---|---|---|");
    let (mut held, mut differ, mut could_not) = (0, 0, 0);
    for row in contract::ROWS {
        let v = verdicts.get(&row.id).cloned().unwrap_or(Verdict::CouldNot("not reached".into()));
        let (expected, seen) = match &v {
            Verdict::Held => {
                held += 1;
                (String::new(), String::new())
            }
            Verdict::Differs { expected, seen } => {
                differ += 1;
                (expected.clone(), seen.clone())
            }
            Verdict::CouldNot(why) => {
                could_not += 1;
                (String::new(), why.clone())
            }
        };
        crate::outln!("| {} | {} | {} | {} | {} |", row.id, cell(row.behaviour), v.word(), cell(&expected), cell(&seen));
    }
    crate::outln!("{} checks: {held} held, {differ} differ, {could_not} could not check", contract::ROWS.len());
}
