//! Admission: before any create, wake or fork, the caps on machines running at once and
//! the spend ceilings. One `machine list` gives what is running on the account; the
//! ledger gives which of those are this laptop's works, their folders and their spend.
//!
//! The listing is not a lock, so every admission first writes its claim (ledger/claims.rs)
//! and only then reads the claims, the listing and the records: of two calls at once, the
//! one that reads last sees the other's claim (at worst both see each other and both
//! refuse). A claim counts as a running machine until its own call releases it, once the
//! machine is counted another way (boxd lists it; a wake's run is recorded) or nothing was
//! made; a machine that may still come (a create or fork that never answered) keeps it,
//! and a claim counts for at most CLAIM_MS, so a killed host's never holds a slot for ever.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::boxd::{Boxd, Failure, State};
use crate::caps::{Files, Programs};
use crate::errors::{Code, ToolError, ToolResult};
use crate::ledger::{amount, Claim, Held, Ledger, Work, MACHINE_SIZE};
use crate::options::Context;
use crate::paths;

/// A running work of this ledger, as admission sees it.
struct Running {
    work: String,
    in_project: bool,
    rate: u64,
    /// Counted from another call's claim: being started at this moment.
    starting: bool,
}

impl Running {
    /// A work of this ledger counted as running, at the rate of its machine's size.
    fn of(ctx: &Context, w: Work) -> Running {
        let rate = ctx.options.prices.running_rate(w.runs.last().map_or(MACHINE_SIZE, |r| r.size.as_str()));
        Running { in_project: in_project(ctx, &w.directory), work: w.work, rate, starting: false }
    }

    /// The work as a refusal names it.
    fn label(&self) -> String {
        if self.starting {
            format!("{} (being started by another call)", self.work)
        } else {
            self.work.clone()
        }
    }
}

/// What is running now, against which one more machine is admitted (or refused).
pub struct Headroom {
    /// `oc-` machines on the account that are running, starting or on standby.
    account: Vec<String>,
    ledger: Vec<Running>,
    /// The status the listing shows for the work's own machine, when it shows one.
    pub own: Option<String>,
}

/// A status word this plugin does not know counts as up: a cap is never passed on a guess.
fn machine_is_up(status: &str) -> bool {
    !matches!(State::from_status(status), Some(State::Asleep | State::Stopped | State::Failed | State::Gone))
}

/// Whether a laptop folder lies in the call's project.
fn in_project(ctx: &Context, directory: &str) -> bool {
    let p = ctx.project.trim_end_matches('/');
    directory == p || directory.strip_prefix(p).is_some_and(|rest| rest.starts_with('/'))
}

/// When `w`'s newest run began (None when it never ran); a closed work as if after every
/// claim.
fn last_started(w: &Work) -> (String, Option<u64>) {
    let at = if w.is_closed() { Some(u64::MAX) } else { w.runs.last().map(|r| r.from_ms) };
    (w.work.clone(), at)
}

/// Read what is running, leaving `work` itself out (its own machine never counts against
/// its wake). The claims are read before the listing: a claim released since was released
/// once boxd listed its machine, so one of the two reads shows it.
pub fn headroom<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, ctx: &Context, work: &str) -> ToolResult<Headroom> {
    let claims = ledger.claims(ctx.now_ms)?;
    let own = paths::machine_name(work);
    let listing = boxd.list().map_err(Failure::into_error)?;
    let account: Vec<String> = listing.iter().filter(|m| paths::plugin_machine(&m.name) && m.name != own && machine_is_up(&m.status)).map(|m| m.name.clone()).collect();
    let listed: Vec<String> = listing.iter().map(|m| m.name.clone()).collect();
    let own = listing.iter().find(|m| m.name == own).map(|m| m.status.clone());
    let (mut running, mut started) = (Vec::new(), Vec::new());
    for id in ledger.ids()? {
        // An unreadable record is that work's problem; it cannot be counted, but it is
        // still on the account's count if it runs.
        let Ok(Some(w)) = ledger.read(&id) else { continue };
        started.push(last_started(&w));
        // A work whose name a tool saw holding another machine, or whose create was
        // withdrawn, is not running: the machine under its name is someone else's (it
        // stays on the account's count).
        if w.work != work && !w.is_closed() && !w.name_not_ours() && account.contains(&w.machine) {
            running.push(Running::of(ctx, w));
        }
    }
    let mut room = Headroom { account, ledger: running, own };
    room.claimed(ctx, work, claims, Some(&listed), &started);
    Ok(room)
}

/// What is running as this ledger knows it, with no boxd call: the works whose last run
/// interval is still open, and the other calls' claims. A wake uses this, so resume stays
/// within four round trips; the account count is then this ledger's (a lower bound:
/// create, fork and boxd_status read the account's listing). The claims are read before
/// the records: a wake releases its claim only once its run is recorded.
pub fn headroom_known<F: Files>(ledger: &mut Ledger<F>, ctx: &Context, work: &str) -> ToolResult<Headroom> {
    let claims = ledger.claims(ctx.now_ms)?;
    let (mut running, mut account, mut started) = (Vec::new(), Vec::new(), Vec::new());
    for id in ledger.ids()? {
        let Ok(Some(w)) = ledger.read(&id) else { continue };
        started.push(last_started(&w));
        if w.work != work && !w.is_closed() && !w.name_not_ours() && w.running_since().is_some() {
            account.push(w.machine.clone());
            running.push(Running::of(ctx, w));
        }
    }
    let mut room = Headroom { account, ledger: running, own: None };
    room.claimed(ctx, work, claims, None, &started);
    Ok(room)
}

impl Headroom {
    /// Count the claims of other works not already counted. A create's or fork's claim
    /// counts while the listing (when read) does not show its name: once boxd lists the
    /// machine, the listing says whether it runs. A wake's counts whatever the listing
    /// says (it lists the machine asleep until the wake is through). A claim is spent once
    /// its work's record shows a run that began at or after it (that call, or a later one,
    /// started the machine: the listing and the records count it from then), or
    /// the work is closed (a dropped work starts nothing): a host killed mid-call left it,
    /// and its work was recovered since (`last_started`).
    fn claimed(&mut self, ctx: &Context, work: &str, claims: Vec<Claim>, listed: Option<&[String]>, started: &[(String, Option<u64>)]) {
        let spent = |c: &Claim| started.iter().any(|(w, at)| *w == c.work && at.is_some_and(|at| at >= c.at_ms));
        for c in claims.into_iter().filter(|c| c.work != work && !spent(c)) {
            let machine = paths::machine_name(&c.work);
            if self.account.contains(&machine) || (!c.wake && listed.is_some_and(|l| l.contains(&machine))) {
                continue;
            }
            self.account.push(machine);
            let rate = ctx.options.prices.running_rate(&c.size);
            self.ledger.push(Running { in_project: in_project(ctx, &c.directory), work: c.work, rate, starting: true });
        }
    }

    /// Refuse one more running machine for `w` (a work in `directory`) past a cap or a
    /// ceiling; the message names what runs, so the next step can say what to sleep.
    pub fn check(&self, ctx: &Context, work: &str, directory: &str, spent: u64) -> ToolResult<()> {
        let o = &ctx.options;
        let names = |pick: &dyn Fn(&Running) -> bool| self.ledger.iter().filter(|r| pick(r)).map(Running::label).collect::<Vec<_>>().join(", ");
        let project: Vec<&Running> = self.ledger.iter().filter(|r| r.in_project).collect();
        let full = |what: &str, n: usize, cap: u32, running: String| {
            ToolError::with_next(
                Code::CapReached,
                format!("work '{work}' cannot start a machine: {n} {what} already run, and {} is at most {cap}", cap_option(what)),
                format!("Sleep (boxd_sleep) or drop (boxd_drop) one of these works, then call again: {running}."),
            )
        };
        if project.len() as u64 >= o.max_running.project as u64 && in_project(ctx, directory) {
            return Err(full("of this project's works", project.len(), o.max_running.project, names(&|r| r.in_project)));
        }
        if self.ledger.len() as u64 >= o.max_running.ledger as u64 {
            return Err(full("of this ledger's works", self.ledger.len(), o.max_running.ledger, names(&|_| true)));
        }
        if self.account.len() as u64 >= o.max_running.account as u64 {
            return Err(full("of the account's oc- machines", self.account.len(), o.max_running.account, self.account.join(", ")));
        }
        if let Some(spent) = past_ceiling(work, spent, ctx) {
            return Err(ToolError::with_next(
                Code::CeilingReached,
                spent,
                // A create, wake or fork checks it: the machine is not running, so it cannot
                // be harvested or dropped until the ceiling lets it wake.
                format!("Raise workSpendCeiling in the plugin options (or set it to null) and call again; an asleep work wakes only then (boxd_resume), for its harvest (boxd_harvest) and drop (boxd_drop)."),
            ));
        }
        let burn = self.ledger.iter().fold(o.prices.running_rate(MACHINE_SIZE), |sum, r| sum.saturating_add(r.rate));
        if let Some(ceiling) = o.burn_rate_ceiling.filter(|c| burn > *c) {
            return Err(ToolError::with_next(
                Code::CeilingReached,
                format!("starting work '{work}' would burn {:.4} an hour across the ledger, past burnRateCeiling {:.4}", amount(burn), amount(ceiling)),
                format!("Sleep one of these works (boxd_sleep), then call again: {}.", names(&|_| true)),
            ));
        }
        Ok(())
    }

    /// Count one more machine as running for `directory` (a fork admitted in a batch).
    /// A machine the listing already showed up (a fork adopted, or another call's) was
    /// counted by `headroom`, and is not counted twice.
    pub fn take(&mut self, ctx: &Context, work: &str, directory: &str) {
        let machine = paths::machine_name(work);
        if self.account.contains(&machine) {
            return;
        }
        self.account.push(machine);
        self.ledger.push(Running { work: work.to_string(), in_project: in_project(ctx, directory), rate: ctx.options.prices.running_rate(MACHINE_SIZE), starting: false });
    }
}

fn cap_option(what: &str) -> &'static str {
    if what.contains("project") {
        "maxRunningPerProject"
    } else if what.contains("ledger") {
        "maxRunningPerLedger"
    } else {
        "maxRunningPerAccount"
    }
}

/// The record as a call that read the machine's state sees it: an interval the ledger
/// still has open ends when the machine is down (an idle bound after its last use), and
/// one opens when it runs. boxd_status applies it to its rows in place (`see`); the
/// others to a copy, so a read writes nothing; a change records the same when it writes.
pub fn seen_as(w: &Work, st: State, ctx: &Context) -> Work {
    let mut seen = w.clone();
    see(&mut seen, st, ctx);
    seen
}

/// `seen_as` in place, for a record that is never written back.
pub fn see(w: &mut Work, st: State, ctx: &Context) {
    match st {
        State::Running | State::Standby | State::Starting => w.open_run(ctx.now_ms),
        State::Asleep | State::Stopped => w.seen_not_running(ctx.now_ms, ctx.options.idle_ms(), false),
        State::Gone | State::Failed => w.seen_not_running(ctx.now_ms, ctx.options.idle_ms(), true),
    }
}

/// What `work` has spent as a call that found its machine in state `st` sees it (0 for a
/// work the ledger does not hold open).
fn spent_seen<F: Files>(ledger: &mut Ledger<F>, ctx: &Context, work: &str, st: State) -> ToolResult<u64> {
    Ok(ledger.read(work)?.filter(|w| !w.is_closed()).map_or(0, |w| seen_as(&w, st, ctx).spend_micros(&ctx.options.prices, ctx.now_ms)))
}

/// This call's claim on one more running machine for `work`, written before anything that
/// runs is read (see the module's note).
pub fn claim<F: Files>(ledger: &mut Ledger<F>, ctx: &Context, work: &str, directory: &str, size: &str, wake: bool) -> ToolResult<Held> {
    ledger.claim(&Claim { work: work.to_string(), directory: directory.to_string(), size: size.to_string(), wake, at_ms: ctx.now_ms })
}

/// The claim released when the admission refuses: a refused call holds no slot.
fn or_release<T, F: Files>(ledger: &mut Ledger<F>, held: Held, r: ToolResult<T>) -> ToolResult<(T, Held)> {
    match r {
        Ok(v) => Ok((v, held)),
        Err(e) => {
            ledger.release(held);
            Err(e)
        }
    }
}

/// Admit one create of `work` (its record, when the ledger has one, gives its spend so
/// far: a rebuild's gone machine stopped billing an idle bound after its last use), or
/// refuse it before boxd is asked.
/// Returns the status the listing shows for the work's own machine, if it shows one, and
/// the claim the caller releases once the machine is listed or nothing was made.
pub fn admit<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, ctx: &Context, work: &str, directory: &str) -> ToolResult<(Option<String>, Held)> {
    // Every create follows a `get` that found no machine under the name.
    let spent = spent_seen(ledger, ctx, work, State::Gone)?;
    let held = claim(ledger, ctx, work, directory, MACHINE_SIZE, false)?;
    let r = headroom(boxd, ledger, ctx, work).and_then(|room| room.check(ctx, work, directory, spent).map(|()| room.own));
    or_release(ledger, held, r)
}

/// Admit one wake of `work` from the ledger's own knowledge (see `headroom_known`). The
/// ledger can over-count (a machine removed outside the plugin still has an open run in
/// its record), so a refusal is checked once against the account's listing before it is
/// given: only what really runs refuses a wake. The usual wake makes no extra call.
/// `st` is the state the wake found the machine in: a machine boxd hibernated is judged
/// as boxd_status shows it, not billed as running until now. Returns the claim, which the
/// caller releases once the wake's run is recorded (or the wake failed for certain).
pub fn admit_wake<P: Programs, F: Files>(boxd: &mut Boxd<P>, ledger: &mut Ledger<F>, ctx: &Context, work: &str, directory: &str, st: State) -> ToolResult<Held> {
    let spent = spent_seen(ledger, ctx, work, st)?;
    let size = ledger.read(work)?.and_then(|w| w.runs.last().map(|r| r.size.clone())).unwrap_or_else(|| MACHINE_SIZE.to_string());
    let held = claim(ledger, ctx, work, directory, &size, true)?;
    let r = match headroom_known(ledger, ctx, work).and_then(|room| room.check(ctx, work, directory, spent)) {
        Err(e) if matches!(e.code, Code::CapReached | Code::CeilingReached) => headroom(boxd, ledger, ctx, work).and_then(|room| room.check(ctx, work, directory, spent)),
        known => known,
    };
    or_release(ledger, held, r).map(|((), held)| held)
}

/// A wake's (or resume's, or start's) answer, with its claim: a failure that leaves the
/// machine down releases it; one boxd may have acted on before it failed (a timeout, a lost
/// connection) keeps it, for at most CLAIM_MS.
pub fn woke<F: Files>(ledger: &mut Ledger<F>, held: &mut Option<Held>, r: Result<(), Failure>) -> ToolResult<()> {
    match r {
        Ok(()) => Ok(()),
        Err(f) => {
            if !matches!(f, Failure::Timeout(_) | Failure::Unreachable(_)) {
                if let Some(h) = held.take() {
                    ledger.release(h);
                }
            }
            Err(refused(f))
        }
    }
}

/// A boxd failure from a create, fork or wake: the account's quota refusing it has its
/// own code (the CLI says `quota exceeded`).
pub fn refused(f: Failure) -> ToolError {
    match f {
        Failure::Other(m) if m.to_ascii_lowercase().contains("quota") => ToolError::new(Code::QuotaReached, m),
        f => f.into_error(),
    }
}

/// A work past `maxLifetimeHours` takes no more prompts and forks nothing (a fork's
/// lifetime starts at its own create; boxd's auto-destroy is never used: it would lose
/// unharvested work).
pub fn check_lifetime(w: &Work, ctx: &Context) -> ToolResult<()> {
    let Some(hours) = ctx.options.max_lifetime_hours else { return Ok(()) };
    let age = w.lifetime_ms(ctx.now_ms);
    if w.created_ms != 0 && age >= hours as u64 * 3_600_000 {
        return Err(ToolError::with_next(
            Code::LifetimeReached,
            format!("work '{}' is {} h old, past maxLifetimeHours {hours}, so it takes no more prompts and forks nothing", w.work, age / 3_600_000),
            format!("Harvest work '{}' (boxd_harvest), then drop it (boxd_drop); start a new work for more prompts.", w.work),
        ));
    }
    Ok(())
}

/// A work that has spent its `workSpendCeiling` takes no more prompts and forks nothing (a
/// fork is a new work carrying its transcript, and would start spending from nothing):
/// what its machine made can still be harvested and the work dropped. The spend is the
/// ledger's, which a machine boxd hibernated on its own over-counts until a tool sees it.
pub fn check_spend(w: &Work, ctx: &Context) -> ToolResult<()> {
    let Some(spent) = past_ceiling(&w.work, w.spend_micros(&ctx.options.prices, ctx.now_ms), ctx) else { return Ok(()) };
    Err(ToolError::with_next(
        Code::CeilingReached,
        format!("{spent}, so it takes no more prompts and forks nothing"),
        format!("Harvest work '{}' (boxd_harvest), then drop it (boxd_drop); or raise workSpendCeiling in the plugin options (or set it to null) and call again.", w.work),
    ))
}

/// The one `workSpendCeiling` rule, for a start (`Headroom::check`) and for a prompt or a
/// fork (`check_spend`): what `work` has spent against it, once it has reached it.
fn past_ceiling(work: &str, spent: u64, ctx: &Context) -> Option<String> {
    let ceiling = ctx.options.work_spend_ceiling.filter(|c| spent >= *c)?;
    Some(format!("work '{work}' has spent {:.4} of its workSpendCeiling {:.4}", amount(spent), amount(ceiling)))
}

/// Lifetime as boxd_status shows it: None without a limit; "past" or "near" (the last
/// tenth of it) otherwise, with the hours left.
pub fn lifetime_note(w: &Work, ctx: &Context) -> Option<(&'static str, i64)> {
    let hours = ctx.options.max_lifetime_hours? as u64;
    if w.created_ms == 0 {
        return None;
    }
    let (age, max) = (w.lifetime_ms(ctx.now_ms), hours * 3_600_000);
    let left = (max as i64 - age as i64) / 3_600_000;
    if age >= max {
        Some(("past", left))
    } else if age * 10 >= max * 9 {
        Some(("near", left))
    } else {
        None
    }
}

#[cfg(test)]
mod at_once;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::WorkState;
    use crate::testing::{raw_context, MemFiles, Scripted};
    use crate::tools::context;

    fn running_work(fs: &mut MemFiles, id: &str, dir: &str) {
        let mut w = Work::new(id, dir, "t");
        w.state = WorkState::Open;
        w.machine_id = Some(format!("vm_{id}"));
        w.created_ms = 1;
        w.open_run(1);
        Ledger::new(fs, "/l").write(&w).unwrap();
    }

    fn listing(names: &[&str]) -> String {
        let rows: Vec<String> = names.iter().map(|n| format!(r#"{{"name":"{n}","status":"running"}}"#)).collect();
        format!("[{}]", rows.join(","))
    }

    fn try_admit(fs: &mut MemFiles, list: &str, options: &str, dir: &str) -> ToolResult<()> {
        try_admit_at(fs, list, options, dir, 0)
    }

    /// As `try_admit`, on a call whose clock reads `now_ms`.
    fn try_admit_at(fs: &mut MemFiles, list: &str, options: &str, dir: &str, now_ms: u64) -> ToolResult<()> {
        let ctx = context(crate::tools::RawContext { now_ms, ..raw_context(options, "{}") }).unwrap();
        let mut p = Scripted::default();
        p.push_exit(0, list, "");
        let mut boxd = Boxd::new(&mut p, 10);
        let mut ledger = Ledger::new(fs, "/l");
        admit(&mut boxd, &mut ledger, &ctx, "new", dir).map(|(_, held)| ledger.release(held))
    }

    #[test]
    fn each_cap_refuses_naming_what_runs_and_hibernated_machines_do_not_count() {
        let mut fs = MemFiles::new(&["/p", "/l", "/r"]);
        running_work(&mut fs, "a", "/p");
        running_work(&mut fs, "b", "/r");
        let up = listing(&["oc-a", "oc-b", "not-ours"]);
        let e = try_admit(&mut fs, &up, r#"{"maxRunningPerProject":1}"#, "/p/sub").unwrap_err();
        assert_eq!(e.code, Code::CapReached);
        assert!(e.message.contains("maxRunningPerProject is at most 1") && e.next.ends_with("works, then call again: a."), "{e:?}");
        assert!(try_admit(&mut fs, &up, r#"{"maxRunningPerProject":1}"#, "/r").is_ok(), "another folder is not this project");
        let e = try_admit(&mut fs, &up, r#"{"maxRunningPerLedger":2}"#, "/p").unwrap_err();
        assert!(e.message.contains("maxRunningPerLedger") && e.next.contains("a, b"), "{e:?}");
        let e = try_admit(&mut fs, &listing(&["oc-a", "oc-b", "oc-other"]), r#"{"maxRunningPerAccount":3}"#, "/r").unwrap_err();
        assert!(e.message.contains("maxRunningPerAccount") && e.next.contains("oc-other"), "{e:?}");
        let asleep = r#"[{"name":"oc-a","status":"hibernated"},{"name":"oc-b","status":"running"}]"#;
        assert!(try_admit(&mut fs, asleep, r#"{"maxRunningPerLedger":2}"#, "/p").is_ok(), "a hibernated machine frees its slot");
    }

    #[test]
    fn the_burn_rate_and_a_works_spend_have_ceilings() {
        let mut fs = MemFiles::new(&["/p", "/l"]);
        running_work(&mut fs, "a", "/p");
        let up = listing(&["oc-a"]);
        // Two default machines burn 0.436 an hour.
        let e = try_admit(&mut fs, &up, r#"{"burnRateCeiling":0.4}"#, "/p").unwrap_err();
        assert_eq!(e.code, Code::CeilingReached);
        assert!(e.message.contains("0.4360") && e.next.contains(": a."), "{e:?}");
        assert!(try_admit(&mut fs, &up, r#"{"burnRateCeiling":0.436}"#, "/p").is_ok());
        // A work that ran 10 hours, seen once they are over, has spent 2.18.
        let mut w = Work::new("new", "/p", "t");
        (w.state, w.created_ms) = (WorkState::Open, 1);
        w.open_run(1);
        w.close_run(1 + 36_000_000, "boxd_sleep");
        Ledger::new(&mut fs, "/l").write(&w).unwrap();
        let e = try_admit_at(&mut fs, &up, r#"{"workSpendCeiling":2}"#, "/p", 1 + 36_000_000).unwrap_err();
        assert!(e.code == Code::CeilingReached && e.message.contains("2.1800 of its workSpendCeiling 2.0000"), "{e:?}");
    }

    #[test]
    fn a_quota_refusal_has_its_own_code() {
        assert_eq!(refused(Failure::Other("boxd machine new failed: error: quota exceeded".into())).code, Code::QuotaReached);
        assert_eq!(refused(Failure::Other("boxd machine new failed: boom".into())).code, Code::BoxdFailed);
    }

    #[test]
    fn a_work_past_its_lifetime_is_refused_and_near_it_is_noted() {
        let ctx = |now: u64| {
            let mut r = raw_context(r#"{"maxLifetimeHours":10}"#, "{}");
            r.now_ms = now;
            context(r).unwrap()
        };
        let mut w = Work::new("w1", "/p", "t");
        w.created_ms = 1;
        assert!(check_lifetime(&w, &ctx(5 * 3_600_000)).is_ok());
        assert_eq!(lifetime_note(&w, &ctx(5 * 3_600_000)), None);
        assert_eq!(lifetime_note(&w, &ctx(9 * 3_600_000 + 2)), Some(("near", 0)));
        let e = check_lifetime(&w, &ctx(10 * 3_600_000 + 1)).unwrap_err();
        assert!(e.code == Code::LifetimeReached && e.next.contains("boxd_harvest") && e.next.contains("boxd_drop"), "{e:?}");
        assert_eq!(lifetime_note(&w, &ctx(10 * 3_600_000 + 1)).map(|n| n.0), Some("past"));
    }
}
