//! Calls at once, as two hosts sharing one ledger make them: while one call's boxd command
//! is under way, another call runs from start to end against the same ledger and the same
//! boxd. Whatever the interleaving, the caps and the burn ceiling hold.

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::rc::Rc;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::cell::RefCell;

use crate::caps::{Files, FsError, Meta, Programs, RunOutput, RunRequest, SpawnError};
use crate::errors::Code;
use crate::ledger::{Ledger, Work, WorkState};
use crate::testing::{raw_context, MemFiles};
use crate::tools::RawContext;
use crate::tools::call;

/// One in-memory ledger the calls share.
#[derive(Clone)]
struct Shared(Rc<RefCell<MemFiles>>);

impl Files for Shared {
    fn read(&mut self, p: &str) -> Result<Option<Vec<u8>>, FsError> {
        self.0.borrow_mut().read(p)
    }
    fn write_atomic(&mut self, p: &str, b: &[u8]) -> Result<(), FsError> {
        self.0.borrow_mut().write_atomic(p, b)
    }
    fn create_dir_all(&mut self, p: &str) -> Result<(), FsError> {
        self.0.borrow_mut().create_dir_all(p)
    }
    fn list(&mut self, p: &str) -> Result<Vec<String>, FsError> {
        self.0.borrow_mut().list(p)
    }
    fn stat(&mut self, p: &str) -> Result<Option<Meta>, FsError> {
        self.0.borrow_mut().stat(p)
    }
    fn remove_file(&mut self, p: &str) -> Result<(), FsError> {
        self.0.borrow_mut().remove_file(p)
    }
    fn create_new(&mut self, p: &str, b: &[u8]) -> Result<bool, FsError> {
        self.0.borrow_mut().create_new(p, b)
    }
    fn rename(&mut self, a: &str, b: &str) -> Result<bool, FsError> {
        self.0.borrow_mut().rename(a, b)
    }
    fn place_new(&mut self, a: &str, b: &str) -> Result<bool, FsError> {
        self.0.borrow_mut().place_new(a, b)
    }
}

/// A small boxd: machines by name (id, status), answering the verbs these calls use.
#[derive(Default)]
struct Account {
    machines: BTreeMap<String, (String, String)>,
    /// Every command any call ran, in order.
    log: Vec<String>,
}

impl Account {
    fn answer(&mut self, r: &RunRequest) -> RunOutput {
        let a: Vec<&str> = r.args.iter().map(String::as_str).collect();
        self.log.push(a.join(" "));
        let ok = |s: String| RunOutput { exit_code: Some(0), stdout: s.into_bytes(), stderr: Vec::new(), files: Vec::new() };
        let made = |name: &str| format!(r#"{{"name":"{name}","id":"vm_{}","boot":"5ms"}}"#, &name[3..]);
        match a.as_slice() {
            ["--version"] => ok("1.18.33".into()),
            ["machine", "list", ..] => {
                let rows: Vec<String> = self.machines.iter().map(|(n, (_, st))| format!(r#"{{"name":"{n}","status":"{st}"}}"#)).collect();
                ok(format!("[{}]", rows.join(",")))
            }
            ["snapshots", "list", ..] => ok(r#"[{"name":"opencode-golden","version":"1","status":"ready"}]"#.into()),
            ["machine", "get", name, ..] => match self.machines.get(*name) {
                Some((id, st)) => ok(format!(r#"{{"name":"{name}","id":"{id}","status":"{st}","sharing":"private","isolated":"no"}}"#)),
                None => RunOutput { exit_code: Some(1), stdout: Vec::new(), stderr: format!("error: VM '{name}' not found").into_bytes(), files: Vec::new() },
            },
            ["machine", "new", name, ..] | ["machine", "fork", _, name, ..] => {
                self.machines.insert(name.to_string(), (format!("vm_{}", &name[3..]), "running".into()));
                ok(made(name))
            }
            ["machine", "wake" | "resume" | "start", name, ..] => {
                if let Some(m) = self.machines.get_mut(*name) {
                    m.1 = "running".into();
                }
                ok("{}".into())
            }
            ["machine", "exec", name, ..] if a.iter().any(|w| w.contains("prepare")) => ok(format!(r#"{{"ok":true,"work":"{}"}}"#, &name[3..])),
            _ => ok(String::new()),
        }
    }

    fn count(&self, prefix: &str) -> usize {
        self.log.iter().filter(|c| c.starts_with(prefix)).count()
    }

    fn running(&self) -> usize {
        self.machines.values().filter(|(_, st)| st == "running").count()
    }
}

/// One call's boxd: the shared account, and the other call, run whole just before this
/// call's first command starting with `at` reaches boxd.
struct AtOnce {
    account: Rc<RefCell<Account>>,
    at: &'static str,
    other: Option<Box<dyn FnOnce()>>,
}

impl Programs for AtOnce {
    fn run(&mut self, r: &RunRequest) -> Result<RunOutput, SpawnError> {
        if r.args.join(" ").starts_with(self.at) {
            if let Some(other) = self.other.take() {
                other();
            }
        }
        Ok(self.account.borrow_mut().answer(r))
    }
}

/// The calls' world: a ledger with work `a` running (in project /p), its machine on the
/// account, and works `w1`, `w2` asleep.
fn world() -> (Shared, Rc<RefCell<Account>>) {
    let mut fs = MemFiles::new(&["/p", "/l"]);
    let account = Rc::new(RefCell::new(Account::default()));
    for (id, up) in [("a", true), ("w1", false), ("w2", false)] {
        let mut w = Work::new(id, "/p", "t");
        (w.state, w.machine_id, w.created_ms) = (WorkState::Open, Some(format!("vm_{id}")), 1);
        w.proofs.push(crate::ledger::Proof { prompts: 0, ..Default::default() });
        w.helper_sha256 = Some(crate::encode::sha256_hex(crate::guest::HELPER));
        w.open_run(1);
        if !up {
            w.close_run(2, "boxd_sleep");
        }
        Ledger::new(&mut fs, "/l").write(&w).unwrap();
        account.borrow_mut().machines.insert(format!("oc-{id}"), (format!("vm_{id}"), (if up { "running" } else { "hibernated" }).into()));
    }
    (Shared(Rc::new(RefCell::new(fs))), account)
}

type Answer = Rc<RefCell<Option<Result<serde_json::Value, crate::errors::ToolError>>>>;

/// Both calls' clock: after the world's runs (at 1 and 2 ms), as a real clock is.
const NOW: u64 = 60_000;

/// Call `first`; while its first command starting with `at` is under way, `second` runs
/// whole. Returns both answers.
fn at_once(fs: &Shared, account: &Rc<RefCell<Account>>, options: &'static str, at: &'static str, first: (&str, &str), second: (&'static str, &'static str)) -> [Result<serde_json::Value, crate::errors::ToolError>; 2] {
    let answer: Answer = Rc::new(RefCell::new(None));
    let other = {
        let (fs, account, answer) = (fs.clone(), account.clone(), answer.clone());
        Box::new(move || {
            let mut p = AtOnce { account, at: "", other: None };
            let mut raw = raw_context(options, "{}");
            (raw.entropy, raw.now_ms) = (alloc::vec![2; 32], NOW);
            *answer.borrow_mut() = Some(call(&mut p, &mut fs.clone(), second.0, second.1, raw));
        })
    };
    let mut p = AtOnce { account: account.clone(), at, other: Some(other) };
    let r = call(&mut p, &mut fs.clone(), first.0, first.1, RawContext { now_ms: NOW, ..raw_context(options, "{}") });
    let second = answer.borrow_mut().take().expect("the second call ran");
    [r, second]
}

/// Two creates at once, with one slot left under maxRunningPerLedger (and, the same way,
/// under burnRateCeiling): one machine is made, the other create refused with CAP_REACHED
/// or CEILING_REACHED naming what to sleep, whichever boxd command the first call was at
/// when the second came (its listing: the second sees the first's claim; its create: the
/// first's machine is not listed yet). Before, both were admitted: 3 machines ran.
#[test]
fn two_creates_at_once_never_pass_a_cap_or_the_burn_ceiling() {
    for options in [r#"{"maxRunningPerLedger":2}"#, r#"{"burnRateCeiling":0.5}"#] {
        for at in ["machine list", "machine new"] {
            let (fs, account) = world();
            let answers = at_once(&fs, &account, options, at, ("boxd_ensure", r#"{"work":"c1"}"#), ("boxd_ensure", r#"{"work":"c2"}"#));
            let acc = account.borrow();
            assert_eq!((acc.count("machine new"), acc.running()), (1, 2), "{options} at {at}: {answers:?} {:?}", acc.log);
            let refused = answers.iter().find_map(|a| a.as_ref().err()).expect("one is refused");
            assert!(matches!(refused.code, Code::CapReached | Code::CeilingReached) && refused.next.contains("then call again"), "{refused:?}");
            // Nothing is left claimed: the next create has the slot the refused one found taken.
            let names = fs.0.borrow_mut().list("/l/admission").unwrap();
            assert!(names.is_empty(), "{names:?}");
        }
    }
}

/// Two wakes at once with one slot left: the second's count comes from the ledger (its
/// four boxd calls), where the first's wake is not recorded yet, and its check against the
/// listing still shows the first machine asleep. The first's claim is seen: one wakes.
#[test]
fn two_wakes_at_once_never_pass_the_cap() {
    let (fs, account) = world();
    let answers = at_once(&fs, &account, r#"{"maxRunningPerLedger":2}"#, "machine wake", ("boxd_resume", r#"{"work":"w1"}"#), ("boxd_resume", r#"{"work":"w2"}"#));
    let acc = account.borrow();
    assert_eq!((acc.count("machine wake"), acc.running()), (1, 2), "{answers:?} {:?}", acc.log);
    let e = answers[1].as_ref().unwrap_err();
    assert!(e.code == Code::CapReached && e.next.contains("w1 (being started by another call)"), "{e:?}");
}

/// A boxd_fork of two forks and an ensure at once, two slots left: the ensure comes while
/// the first fork is being made and takes the second slot, so the second fork waits
/// queued. Before, the fork call counted once for its whole fan-out: 4 machines ran.
#[test]
fn a_fork_fan_out_and_an_ensure_at_once_never_pass_the_cap() {
    let (fs, account) = world();
    let answers = at_once(&fs, &account, r#"{"maxRunningPerLedger":3}"#, "machine fork", ("boxd_fork", r#"{"work":"a","forks":["fa","fb"]}"#), ("boxd_ensure", r#"{"work":"e1"}"#));
    let acc = account.borrow();
    assert_eq!(acc.running(), 3, "{answers:?} {:?}", acc.log);
    let v = answers[0].as_ref().unwrap();
    assert_eq!((v["queued"].clone(), v["waiting"]["error"].as_str()), (serde_json::json!(["fb"]), Some("CAP_REACHED")), "{v:#}");
}

/// Two boxd_fork calls of one parent at once, each naming a new fork: each fork has its own
/// place in the queue (before, both read the queue before either wrote, and both took 1).
#[test]
fn two_fork_calls_at_once_number_their_forks_apart() {
    let (fs, account) = world();
    let answers = at_once(&fs, &account, r#"{"maxRunningPerLedger":1}"#, "--version", ("boxd_fork", r#"{"work":"a","forks":["fa"]}"#), ("boxd_fork", r#"{"work":"a","forks":["fb"]}"#));
    assert!(answers.iter().all(|a| a.is_ok()), "{answers:?}");
    let mut files = fs.clone();
    let mut l = Ledger::new(&mut files, "/l");
    let order = |w: Work| w.fork.map(|f| f.order);
    let (fa, fb) = (order(l.require("fa").unwrap()), order(l.require("fb").unwrap()));
    assert_eq!((fb, fa), (Some(1), Some(2)), "the second call recorded first");
}

/// A host killed between its claim and its create: the claim counts (the create may still
/// come) for at most CLAIM_MS, then no more, and the next reader removes it. The `creating`
/// record it left never counts on its own, so a killed create never holds a slot for ever.
#[test]
fn a_killed_calls_claim_counts_for_claim_ms_and_no_longer() {
    use crate::ledger::{Claim, CLAIM_MS};
    let now = 3 * CLAIM_MS;
    for (age, admitted) in [(CLAIM_MS - 1, false), (CLAIM_MS, true)] {
        let (fs, account) = world();
        let mut files = fs.clone();
        let mut killed = Work::new("k", "/p", "t");
        (killed.state, killed.created_ms) = (WorkState::Creating, now - age);
        Ledger::new(&mut files, "/l").write(&killed).unwrap();
        let claim = Claim { work: "k".into(), directory: "/p".into(), size: "2x8".into(), wake: false, at_ms: now - age };
        let _ = Ledger::new(&mut files, "/l").claim(&claim).unwrap();
        let mut p = AtOnce { account: account.clone(), at: "", other: None };
        let mut raw = raw_context(r#"{"maxRunningPerLedger":2}"#, "{}");
        raw.now_ms = now;
        let r = call(&mut p, &mut files, "boxd_ensure", r#"{"work":"c1"}"#, raw);
        assert_eq!(r.is_ok(), admitted, "claim {age} ms old: {r:?}");
        if let Err(e) = r {
            assert!(e.code == Code::CapReached && e.next.contains("k (being started by another call)"), "{e:?}");
        }
        let left = fs.0.borrow_mut().list("/l/admission").unwrap();
        assert_eq!(left.len(), usize::from(!admitted), "the old claim is removed: {left:?}");
    }
}

/// Whether c1's create is admitted at cap 2 (one work running) beside a claim a killed call
/// left for `killed`, made 1 s before now, with `killed`'s record as given.
fn admitted_beside_a_dead_claim(killed: Work, now: u64) -> crate::errors::ToolResult<serde_json::Value> {
    use crate::ledger::Claim;
    let (fs, account) = world();
    let mut files = fs.clone();
    Ledger::new(&mut files, "/l").write(&killed).unwrap();
    let claim = Claim { work: killed.work.clone(), directory: "/p".into(), size: "2x8".into(), wake: false, at_ms: now - 1000 };
    let _ = Ledger::new(&mut files, "/l").claim(&claim).unwrap();
    let mut p = AtOnce { account, at: "", other: None };
    let mut raw = raw_context(r#"{"maxRunningPerLedger":2}"#, "{}");
    raw.now_ms = now;
    call(&mut p, &mut files, "boxd_ensure", r#"{"work":"c1"}"#, raw)
}

/// A killed call's claim of a work the ledger holds closed since (the work was recovered
/// and dropped) counts for nothing, however young: a dropped work starts nothing. Before,
/// it held a slot for CLAIM_MS, so a run of killed-then-dropped works (the kill matrix)
/// kept every other create CAP_REACHED naming calls that were gone.
#[test]
fn a_claim_of_a_work_closed_since_counts_for_nothing() {
    let now = 3 * crate::ledger::CLAIM_MS;
    for (state, admitted) in [(WorkState::Creating, false), (WorkState::Closed, true)] {
        let mut killed = Work::new("k", "/p", "t");
        (killed.state, killed.created_ms) = (state, now - 1000);
        let r = admitted_beside_a_dead_claim(killed, now);
        assert_eq!(r.is_ok(), admitted, "{state:?}: {r:?}");
    }
}

/// A killed call's claim whose work was recovered since (a later call made its machine and
/// recorded its run) counts for nothing, even once that machine is gone again (removed by
/// hand, so no listing shows it): the claim's start happened. Before, it held a slot for
/// CLAIM_MS after every such kill.
#[test]
fn a_claim_whose_work_has_run_since_counts_for_nothing() {
    let now = 3 * crate::ledger::CLAIM_MS;
    // The killed call may have recorded the run itself (at its claim's time) and died
    // before it released the claim.
    for (ran_at, admitted) in [(None, false), (Some(now - 2000), false), (Some(now - 1000), true), (Some(now - 500), true)] {
        let mut killed = Work::new("k", "/p", "t");
        killed.state = WorkState::Open;
        killed.machine_id = Some("vm_k".into());
        if let Some(at) = ran_at {
            killed.open_run(at);
        }
        let r = admitted_beside_a_dead_claim(killed, now);
        assert_eq!(r.is_ok(), admitted, "run at {ran_at:?}: {r:?}");
    }
}
