//! Spend through the tools, on hand-computed timelines at the default prices (2x8 at
//! 0.218/h running, 10 GB at 0.0001/GB-h asleep = 0.001/h) and the default 30-minute idle
//! bound: what a wake, a rebuild, boxd_job and boxd_sleep see and record.

use super::*;
use crate::ledger::Prompt;
use crate::testing::{open_work, raw_context, MemFiles, Scripted, OURS};
use crate::tools::{call, RawContext};

const H: u64 = 3_600_000;
const T0: u64 = 1_000;
const GOLDEN: &str = r#"[{"name":"opencode-golden","version":"1","status":"ready"}]"#;

fn at(now_ms: u64, options: &str) -> RawContext {
    RawContext { now_ms, ..raw_context(options, "{}") }
}

/// `machine get oc-w1` for our machine in `status`.
fn ours(status: &str) -> String {
    OURS.replace(r#""running""#, &format!(r#""{status}""#))
}

/// w1, created at T0 with its machine running since, then as `f` leaves it.
fn running_since_t0(f: impl FnOnce(&mut Work)) -> MemFiles {
    let mut fs = open_work(None);
    Ledger::new(&mut fs, "/l").update("w1", |w| {
        w.created_ms = T0;
        w.open_run(T0);
        f(w);
    }).unwrap();
    fs
}

fn record(fs: &mut MemFiles) -> Work {
    Ledger::new(fs, "/l").require("w1").unwrap()
}

/// A resume's calls once the machine is woken (or made): the idle bound set, the helper
/// uploaded, the guest prepared.
fn guest_ready(p: &mut Scripted) {
    for _ in 0..3 {
        p.push_exit(0, r#"{"ok":true,"work":"w1"}"#, "");
    }
}

/// Created and running at T0, hibernated by boxd's idle bound at T0 + 30 min, resumed at
/// T0 + 100 h: it ran 0.5 h (0.109) and slept 99.5 h (0.0995), so it has spent 0.2085,
/// which boxd_status and boxd_job show and the ceiling judges. Before, the wake billed the
/// whole 100 h as running (21.8) and a ceiling of 1 refused it.
#[test]
fn a_machine_boxd_hibernated_is_woken_on_the_spend_status_shows() {
    let now = T0 + 100 * H;
    let mut fs = running_since_t0(|_| {});
    let mut p = Scripted::default();
    p.push_exit(0, r#"[{"name":"oc-w1","status":"hibernated"}]"#, "");
    p.push_exit(0, "[]", "");
    let v = call(&mut p, &mut fs, "boxd_status", "{}", at(now, "{}")).unwrap();
    assert_eq!(v["works"][0]["spend"]["spent"], 0.2085, "{v:#}");
    let mut p = Scripted::default();
    p.push_exit(0, &ours("hibernated"), "");
    let v = call(&mut p, &mut fs, "boxd_job", r#"{"work":"w1"}"#, at(now, "{}")).unwrap();
    assert_eq!((v["state"].as_str(), v["spend"]["spent"].as_f64(), v["spend"]["burnPerHour"].as_f64(), v["spend"]["runningHours"].as_f64()), (Some("asleep"), Some(0.2085), Some(0.001), Some(0.5)), "{v:#}");

    // A ceiling below what it spent still refuses, naming the figure status shows.
    let before = record(&mut fs);
    let mut p = Scripted::default();
    p.push_exit(0, "1.18.33", "");
    p.push_exit(0, &ours("hibernated"), "");
    p.push_exit(0, "[]", "");
    let e = call(&mut p, &mut fs, "boxd_resume", r#"{"work":"w1"}"#, at(now, r#"{"workSpendCeiling":0.2}"#)).unwrap_err();
    assert!(e.code == Code::CeilingReached && e.message.contains("has spent 0.2085"), "{e:?}");
    assert_eq!(record(&mut fs), before, "a refused wake writes nothing");

    let mut p = Scripted::default();
    p.push_exit(0, "1.18.33", "");
    p.push_exit(0, &ours("hibernated"), "");
    p.push_exit(0, "", "");
    guest_ready(&mut p);
    let v = call(&mut p, &mut fs, "boxd_resume", r#"{"work":"w1"}"#, at(now, r#"{"workSpendCeiling":1}"#)).unwrap();
    assert_eq!(v["action"], "woken", "{v:#}");
    let w = record(&mut fs);
    assert_eq!((w.runs[0].to_ms, w.runs[0].ended_by.as_deref()), (Some(T0 + H / 2), Some("seen asleep")), "the wake records where the run ended");
    assert_eq!((w.runs.len(), w.runs[1].from_ms, w.runs[1].to_ms), (2, now, None));
}

/// The same for a machine found gone: the rebuild is admitted on the 0.5 h it ran, and
/// the create's write records that end.
#[test]
fn a_gone_machine_is_rebuilt_on_the_spend_status_shows() {
    let now = T0 + 100 * H;
    let mut fs = running_since_t0(|_| {});
    let mut p = Scripted::default();
    p.push_exit(0, "1.18.33", "");
    p.push_fail(1, "error: VM 'oc-w1' not found");
    p.push_exit(0, "[]", "");
    p.push_exit(0, GOLDEN, "");
    p.push_exit(0, r#"{"name":"oc-w1","id":"vm_2","boot":"0.1s"}"#, "");
    p.push_exit(0, r#"{"user_id":"usr_1","active_org":null}"#, "");
    p.push_exit(0, "", "");
    p.push_exit(0, r#"{"ok":true,"work":"w1"}"#, "");
    let v = call(&mut p, &mut fs, "boxd_resume", r#"{"work":"w1"}"#, at(now, r#"{"workSpendCeiling":1}"#)).unwrap();
    assert_eq!(v["action"], "rebuilt", "{v:#} {:?}", p.commands());
    let w = record(&mut fs);
    assert_eq!((w.runs[0].to_ms, w.runs[0].ended_by.as_deref()), (Some(T0 + H / 2), Some("seen gone")));
    assert_eq!((w.runs[1].from_ms, w.machine_id.as_deref()), (now, Some("vm_2")));
    assert_eq!(w.account.as_deref(), Some("usr_1/-"), "the account that made it is kept");
}

/// A prompt at T0 runs for three hours, boxd_job watching; boxd hibernates the machine
/// 30 min after the last job (its exec is traffic). Seen at T0 + 9 h, the run ended at
/// T0 + 3.5 h, not at the prompt's T0 + 0.5 h: 3.5 h running (0.763) + 5.5 h asleep
/// (0.0055). Before, job recorded nothing and the spend was 0.109 + 0.0085.
#[test]
fn a_long_run_boxd_job_watched_is_billed_to_its_last_use() {
    let mut fs = running_since_t0(|w| w.prompts.push(Prompt { id: "p1".into(), admitted: true, at_ms: T0, ..Default::default() }));
    let busy = r#"{"state":"busy","running":{"promptId":"p1"},"pending":0}"#;
    for (now, written) in [(T0 + 30_000, false), (T0 + 3 * H, true), (T0 + 3 * H + 30_000, false)] {
        let before = record(&mut fs);
        let mut p = Scripted::default();
        p.push_exit(0, OURS, "");
        p.push_exit(0, busy, "");
        assert_eq!(call(&mut p, &mut fs, "boxd_job", r#"{"work":"w1"}"#, at(now, "{}")).unwrap()["state"], "busy");
        // A use less than a minute after the last one recorded is not worth a write.
        assert_eq!(record(&mut fs) != before, written, "job at {now}");
    }
    assert_eq!(record(&mut fs).runs[0].active_ms, Some(T0 + 3 * H));
    let now = T0 + 9 * H;
    let mut p = Scripted::default();
    p.push_exit(0, &ours("hibernated"), "");
    let v = call(&mut p, &mut fs, "boxd_job", r#"{"work":"w1"}"#, at(now, "{}")).unwrap();
    assert_eq!((v["spend"]["runningHours"].as_f64(), v["spend"]["spent"].as_f64()), (Some(3.5), Some(0.7685)), "{v:#}");
    let mut p = Scripted::default();
    p.push_exit(0, "1.18.33", "");
    p.push_exit(0, &ours("hibernated"), "");
    p.push_exit(0, "", "");
    guest_ready(&mut p);
    call(&mut p, &mut fs, "boxd_resume", r#"{"work":"w1"}"#, at(now, "{}")).unwrap();
    assert_eq!(record(&mut fs).runs[0].to_ms, Some(T0 + 3 * H + H / 2));
}

/// Slept by boxd_sleep at T0 + 1 h, woken by hand, found running by boxd_job at T0 + 5 h:
/// the job opens the run (the ledger cannot know the hours before), so when boxd
/// hibernates it again it is billed from there (1 h + 0.5 h). Before, nothing recorded it
/// and only the first hour counted.
#[test]
fn a_machine_woken_by_hand_is_billed_from_the_first_job_that_finds_it_running() {
    let mut fs = running_since_t0(|w| {
        w.close_run(T0 + H, "boxd_sleep");
        w.asleep_by_tool = true;
    });
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_exit(0, r#"{"state":"idle","pending":0}"#, "");
    call(&mut p, &mut fs, "boxd_job", r#"{"work":"w1"}"#, at(T0 + 5 * H, "{}")).unwrap();
    let w = record(&mut fs);
    assert_eq!((w.runs.len(), w.runs[1].from_ms, w.runs[1].to_ms), (2, T0 + 5 * H, None), "{:?}", w.runs);
    let mut p = Scripted::default();
    p.push_exit(0, &ours("hibernated"), "");
    let v = call(&mut p, &mut fs, "boxd_job", r#"{"work":"w1"}"#, at(T0 + 9 * H, "{}")).unwrap();
    assert_eq!(v["spend"]["runningHours"], 1.5, "{v:#}");
}

/// boxd_sleep on a machine stopped by hand: it is down already, so the sleep is done,
/// answered as it is (stopped, not by boxd_sleep), with no hibernate asked and the run
/// closed an idle bound after its start. Before: BOXD_FAILED from the hibernate.
#[test]
fn sleep_on_a_stopped_machine_closes_its_run_and_says_so() {
    let mut fs = running_since_t0(|_| {});
    let mut p = Scripted::default();
    p.push_exit(0, &ours("stopped"), "");
    let v = call(&mut p, &mut fs, "boxd_sleep", r#"{"work":"w1"}"#, at(T0 + 5 * H, "{}")).unwrap();
    assert_eq!((v["state"].as_str(), v["alreadyAsleep"].as_bool(), v["asleepBy"].as_str()), (Some("stopped"), Some(true), Some("idle_or_cli")), "{v:#}");
    assert_eq!(p.commands(), ["machine get oc-w1 --json"], "no hibernate asked");
    let w = record(&mut fs);
    assert_eq!((w.runs[0].to_ms, w.runs[0].ended_by.as_deref(), w.sleeps.len()), (Some(T0 + H / 2), Some("seen asleep"), 0));
}

/// Files on which another call's change lands just before the job's own write takes the
/// lock (a boxd_sleep or boxd_drop that ran while the job's status exec did).
struct ChangedMeanwhile<C: FnMut(&mut Work)>(MemFiles, Option<C>);

impl<C: FnMut(&mut Work)> crate::caps::Files for ChangedMeanwhile<C> {
    fn read(&mut self, p: &str) -> Result<Option<Vec<u8>>, crate::caps::FsError> { self.0.read(p) }
    fn write_atomic(&mut self, p: &str, b: &[u8]) -> Result<(), crate::caps::FsError> { self.0.write_atomic(p, b) }
    fn create_dir_all(&mut self, p: &str) -> Result<(), crate::caps::FsError> { self.0.create_dir_all(p) }
    fn list(&mut self, d: &str) -> Result<Vec<String>, crate::caps::FsError> { self.0.list(d) }
    fn stat(&mut self, p: &str) -> Result<Option<crate::caps::Meta>, crate::caps::FsError> { self.0.stat(p) }
    fn remove_file(&mut self, p: &str) -> Result<(), crate::caps::FsError> { self.0.remove_file(p) }
    fn create_new(&mut self, p: &str, b: &[u8]) -> Result<bool, crate::caps::FsError> {
        if let Some(mut change) = self.1.take().filter(|_| p.ends_with("/lock")) {
            Ledger::new(&mut self.0, "/l").update("w1", |w| change(w)).unwrap();
        }
        self.0.create_new(p, b)
    }
    fn rename(&mut self, f: &str, t: &str) -> Result<bool, crate::caps::FsError> { self.0.rename(f, t) }
    fn place_new(&mut self, f: &str, t: &str) -> Result<bool, crate::caps::FsError> { self.0.place_new(f, t) }
}

/// boxd_job records a use only over the run it read: a sleep (or a drop) that wrote while
/// its status exec ran keeps its closed run and its mark, and no run is reopened under it
/// (before: the job reopened a run on a slept or dropped work, billing what never ran,
/// and cleared the sleep's asleepByTool).
#[test]
fn a_job_never_reopens_a_run_a_sleep_or_drop_closed_while_it_looked() {
    let slept = |w: &mut Work| {
        w.close_run(T0 + 2 * H, "boxd_sleep");
        w.asleep_by_tool = true;
    };
    let dropped = |w: &mut Work| {
        w.close_run(T0 + 2 * H, "boxd_drop");
        w.state = crate::ledger::WorkState::Closed;
    };
    for (name, change) in [("sleep", &slept as &dyn Fn(&mut Work)), ("drop", &dropped)] {
        let mut fs = ChangedMeanwhile(running_since_t0(|_| {}), Some(|w: &mut Work| change(w)));
        let mut p = Scripted::default();
        p.push_exit(0, OURS, "");
        p.push_exit(0, r#"{"state":"idle","pending":0}"#, "");
        call(&mut p, &mut fs, "boxd_job", r#"{"work":"w1"}"#, at(T0 + 2 * H + 1_000, "{}")).unwrap();
        let w = record(&mut fs.0);
        assert_eq!((w.runs.len(), w.runs[0].to_ms, w.running_since()), (1, Some(T0 + 2 * H), None), "{name}: {:?}", w.runs);
        assert_eq!(w.asleep_by_tool, name == "sleep", "{name}");
    }
}

/// A hibernate that landed though boxd answered it failed: the sleep recorded its intent
/// before the hibernate, so the next boxd_sleep, finding the machine down, says it was
/// this plugin's sleep (when it was asked), where it said the idle bound or the CLI did.
/// Its run still ends as a machine seen down does (never under-counted).
#[test]
fn a_hibernate_that_landed_though_it_failed_is_the_sleeps_not_the_idle_bounds() {
    let mut fs = running_since_t0(|_| {});
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_fail(1, "error: internal server error");
    let e = call(&mut p, &mut fs, "boxd_sleep", r#"{"work":"w1"}"#, at(T0 + H, "{}")).unwrap_err();
    assert_eq!(e.code, Code::BoxdFailed, "{e:?}");
    let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    let asked_at = w.sleeping.as_ref().map(|s| s.at.clone()).expect("the intent stays while the hibernate's fate is unknown");
    let mut p = Scripted::default();
    p.push_exit(0, &ours("hibernated"), "");
    let v = call(&mut p, &mut fs, "boxd_sleep", r#"{"work":"w1"}"#, at(T0 + 5 * H, "{}")).unwrap();
    assert_eq!((v["alreadyAsleep"].as_bool(), v["asleepBy"].as_str(), v["sleptAt"].as_str()), (Some(true), Some("boxd_sleep"), Some(asked_at.as_str())), "{v:#}");
    assert_eq!(p.commands().len(), 1, "no second hibernate");
    let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    assert!(w.sleeping.is_none() && w.asleep_by_tool && w.sleeps.len() == 1, "{w:?}");
    assert_eq!((w.runs[0].to_ms, w.runs[0].ended_by.as_deref()), (Some(T0 + H / 2), Some("seen asleep")), "ended as a machine seen down");
}

/// A sleep whose hibernate did not land, then the machine seen running by boxd_job: the
/// intent is spent, so a later idle hibernate is not taken for that sleep.
#[test]
fn a_machine_seen_running_after_a_failed_sleep_is_not_that_sleeps_later() {
    let mut fs = running_since_t0(|_| {});
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_fail(1, "error: internal server error");
    call(&mut p, &mut fs, "boxd_sleep", r#"{"work":"w1"}"#, at(T0 + H, "{}")).unwrap_err();
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_exit(0, r#"{"ok":true,"state":"idle","pending":0}"#, "");
    call(&mut p, &mut fs, "boxd_job", r#"{"work":"w1"}"#, at(T0 + 2 * H, "{}")).unwrap();
    assert!(Ledger::new(&mut fs, "/l").require("w1").unwrap().sleeping.is_none(), "seen running: the intent is spent");
    let mut p = Scripted::default();
    p.push_exit(0, &ours("hibernated"), "");
    let v = call(&mut p, &mut fs, "boxd_sleep", r#"{"work":"w1"}"#, at(T0 + 5 * H, "{}")).unwrap();
    assert_eq!(v["asleepBy"].as_str(), Some("idle_or_cli"), "{v:#}");
}

/// A ledger that takes no write refuses the sleep before the machine is touched: the
/// intent is its first write, so nothing acts that the record could not then say.
#[test]
fn a_ledger_that_cannot_be_written_refuses_the_sleep_before_the_hibernate() {
    struct ReadOnly(MemFiles);
    impl crate::caps::Files for ReadOnly {
        fn read(&mut self, p: &str) -> Result<Option<Vec<u8>>, crate::caps::FsError> { self.0.read(p) }
        fn write_atomic(&mut self, _: &str, _: &[u8]) -> Result<(), crate::caps::FsError> { Err(crate::caps::FsError::Io("read-only".into())) }
        fn create_dir_all(&mut self, p: &str) -> Result<(), crate::caps::FsError> { self.0.create_dir_all(p) }
        fn list(&mut self, d: &str) -> Result<Vec<String>, crate::caps::FsError> { self.0.list(d) }
        fn stat(&mut self, p: &str) -> Result<Option<crate::caps::Meta>, crate::caps::FsError> { self.0.stat(p) }
        fn remove_file(&mut self, _: &str) -> Result<(), crate::caps::FsError> { Err(crate::caps::FsError::Io("read-only".into())) }
        fn create_new(&mut self, _: &str, _: &[u8]) -> Result<bool, crate::caps::FsError> { Err(crate::caps::FsError::Io("read-only".into())) }
        fn rename(&mut self, _: &str, _: &str) -> Result<bool, crate::caps::FsError> { Err(crate::caps::FsError::Io("read-only".into())) }
        fn place_new(&mut self, _: &str, _: &str) -> Result<bool, crate::caps::FsError> { Err(crate::caps::FsError::Io("read-only".into())) }
    }
    let mut fs = ReadOnly(running_since_t0(|_| {}));
    let mut p = Scripted::default();
    p.push_exit(0, OURS, "");
    p.push_exit(0, "", "");
    let e = call(&mut p, &mut fs, "boxd_sleep", r#"{"work":"w1"}"#, at(T0 + H, "{}")).unwrap_err();
    assert_eq!(e.code, Code::LedgerFailed, "{e:?}");
    assert!(p.commands().iter().all(|c| !c.contains("hibernate")), "nothing hibernated: {:?}", p.commands());
}

/// Two sleeps at once: one hibernates and records it, the other wrote its intent after
/// and failed on the machine already going down. The next sleep finds the record saying
/// boxd_sleep put it down: the leftover intent adds no second sleep.
#[test]
fn a_leftover_intent_of_a_raced_sleep_adds_no_second_sleep() {
    let mut fs = running_since_t0(|w| {
        w.close_run(T0 + H, "boxd_sleep");
        w.asleep_by_tool = true;
        w.sleeps.push(Sleep { by: "boxd_sleep".into(), at: "first".into(), ..Default::default() });
        w.sleeping = Some(Sleep { by: "boxd_sleep".into(), at: "second".into(), ..Default::default() });
    });
    let mut p = Scripted::default();
    p.push_exit(0, &ours("hibernated"), "");
    let v = call(&mut p, &mut fs, "boxd_sleep", r#"{"work":"w1"}"#, at(T0 + 2 * H, "{}")).unwrap();
    assert_eq!((v["asleepBy"].as_str(), v["sleptAt"].as_str()), (Some("boxd_sleep"), Some("first")), "{v:#}");
    let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    assert!(w.sleeping.is_none() && w.sleeps.len() == 1, "{w:?}");
}

/// A sleep's intent left recorded, then the machine found stopped (by hand: a hibernate
/// does not stop a machine): not taken for that sleep.
#[test]
fn a_machine_found_stopped_is_not_a_leftover_intents_sleep() {
    let mut fs = running_since_t0(|w| w.sleeping = Some(Sleep { by: "boxd_sleep".into(), at: "asked".into(), ..Default::default() }));
    let mut p = Scripted::default();
    p.push_exit(0, &ours("stopped"), "");
    let v = call(&mut p, &mut fs, "boxd_sleep", r#"{"work":"w1"}"#, at(T0 + 2 * H, "{}")).unwrap();
    assert_eq!((v["state"].as_str(), v["asleepBy"].as_str()), (Some("stopped"), Some("idle_or_cli")), "{v:#}");
    let w = Ledger::new(&mut fs, "/l").require("w1").unwrap();
    assert!(w.sleeping.is_none() && w.sleeps.is_empty(), "{w:?}");
}
