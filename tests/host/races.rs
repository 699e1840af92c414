//! Two change calls at once on one work, each from its own `boxd-host call` process (a
//! script and an agent, two terminals): every pair of the change tools, on a work whose
//! transcript and file are home, so a drop could go through. Whatever order the two
//! land in, the world must hold: each answer is a success or exactly `{error, message,
//! next}` with a documented code; every ledger record reads and no lock or temp file is
//! left; a closed work has no machine and an open one exactly one; every prompt the ledger
//! calls admitted is on the guest and the guest holds none the ledger does not; a submit
//! that answered with a prompt id has it recorded; and the work can still be finished —
//! harvest, then drop — with a proof that covers every prompt.
//!
//! `cargo test` runs three pairs (`races_subset`); every pair:
//!   cargo test -p boxd-host --test host races_full -- --ignored --nocapture

use serde_json::{json, Value};

use crate::common::*;
use crate::faults_matrix::{documented_codes, ledger_problems};
use crate::kill_matrix::{guest_seen, ledger_record, machines_named, Tool};

const TOOLS: [Tool; 8] = [Tool::Submit, Tool::Harvest, Tool::Sleep, Tool::Resume, Tool::Image, Tool::Ensure, Tool::Fork, Tool::Drop];

/// A running work whose transcript is proven and whose one new file is home: nothing on
/// it is unaccounted for, so each tool of a pair has something to do.
fn setup(world: &World, work: &str) {
    let w = json!({ "work": work }).to_string();
    world.ok_call("boxd_ensure", &w);
    crate::harvest::run_on(world, work, &format!("write {}", crate::harvest::bash("echo result > out.txt")));
    world.ok_call("boxd_harvest", &json!({ "work": work, "files": ["out.txt"] }).to_string());
}

/// What one call answered, checked for its shape; the problems found.
fn shape(codes: &std::collections::BTreeSet<String>, tool: Tool, (code, v): &(i32, Value)) -> Vec<String> {
    let at = tool.name();
    match (code, v["error"].as_str()) {
        (0, None) if v.is_object() => Vec::new(),
        (1, Some(e)) => {
            let mut p = Vec::new();
            if !codes.contains(e) {
                p.push(format!("{at}: {e} is not documented in docs/configuration.md"));
            }
            if v.as_object().map(|o| o.len()) != Some(3) || !["message", "next"].iter().all(|k| v[*k].as_str().is_some_and(|s| !s.trim().is_empty())) {
                p.push(format!("{at}: the error is not exactly {{error, message, next}}: {v}"));
            }
            p
        }
        _ => vec![format!("{at}: exit {code} with {v}")],
    }
}

/// Call until the answer is not "later" (busy, starting, asleep), a few times.
fn settled_call(world: &World, tool: &str, args: &str) -> (i32, Value) {
    let mut last = (0, Value::Null);
    for _ in 0..6 {
        last = world.call(tool, args);
        match last.1["error"].as_str() {
            Some("SESSION_BUSY" | "MACHINE_STARTING" | "CREATE_UNCERTAIN") => {
                idle_with_nothing_pending(world, &tool_work(args));
            }
            Some("MACHINE_ASLEEP") => {
                world.call("boxd_resume", &json!({ "work": tool_work(args) }).to_string());
            }
            _ => return last,
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    last
}

/// boxd_job until the work is not busy and no prompt waits (bounded).
fn idle_with_nothing_pending(world: &World, work: &str) {
    for _ in 0..120 {
        let v = world.job_until_idle(work);
        if v["pending"].as_u64().unwrap_or(0) == 0 && v["state"] != "busy" {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

fn tool_work(args: &str) -> String {
    serde_json::from_str::<Value>(args).unwrap()["work"].as_str().unwrap().to_string()
}

/// The pair at once, then the checks; a word for the table (what each answered).
fn race(world: &World, codes: &std::collections::BTreeSet<String>, a: Tool, b: Tool, cell: usize) -> String {
    let work = format!("r{cell}");
    setup(world, &work);
    let (args_a, args_b) = (a.args(&work, cell), b.args(&work, cell + 100));
    let answers: Vec<(i32, Value)> = std::thread::scope(|s| {
        let ha = s.spawn(|| world.call(a.name(), &args_a));
        let hb = s.spawn(|| world.call(b.name(), &args_b));
        vec![ha.join().unwrap(), hb.join().unwrap()]
    });
    let word = |(code, v): &(i32, Value)| if *code == 0 { "ok".to_string() } else { v["error"].as_str().unwrap_or("?").to_string() };
    let shown = format!("{} / {}", word(&answers[0]), word(&answers[1]));
    eprintln!("{} ∥ {} answered:\n{}\n{}", a.name(), b.name(), answers[0].1, answers[1].1);
    let ctx = format!("{} ∥ {}: {:#} / {:#}", a.name(), b.name(), answers[0].1, answers[1].1);
    let mut problems: Vec<String> = shape(codes, a, &answers[0]).into_iter().chain(shape(codes, b, &answers[1])).collect();
    problems.extend(ledger_problems(&world.laptop.ledger));
    let left: Vec<String> = std::fs::read_dir(world.laptop.ledger.join(format!("works/{work}")))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("lock") || n.ends_with(".boxd-tmp"))
        .collect();
    if !left.is_empty() {
        problems.push(format!("left in the ledger: {left:?}"));
    }
    assert!(problems.is_empty(), "{ctx}\n{problems:#?}");

    if a == Tool::Fork || b == Tool::Fork {
        fork_agrees(world, &work, &ctx);
    }

    // The machine and the record agree.
    let record = ledger_record(world, &work);
    let machine = format!("oc-{work}");
    let closed = record["state"] == "closed";
    assert_eq!(machines_named(world, &machine), usize::from(!closed), "{ctx}\nrecord {record:#}");
    for (tool, (code, v)) in [(a, &answers[0]), (b, &answers[1])] {
        if tool == Tool::Submit && *code == 0 {
            let id = v["promptId"].as_str().unwrap();
            assert!(record["prompts"].as_array().unwrap().iter().any(|p| p["id"] == id), "an answered prompt is recorded: {ctx}\nrecord {record:#}");
        }
    }
    let prompts = |r: &Value| -> Vec<String> { r["prompts"].as_array().into_iter().flatten().map(|p| p["id"].as_str().unwrap().to_string()).collect() };
    if a == Tool::Drop && b == Tool::Drop {
        assert!(answers.iter().all(|(code, _)| *code == 0) && closed, "two drops at once both end with the work dropped: {ctx}");
    }
    if closed {
        // Dropped in the race: the proof it dropped on covers every prompt the laptop sent.
        let covered = record["proofs"].as_array().and_then(|p| p.last()).map_or(0, |p| p["prompts"].as_u64().unwrap_or(0));
        assert_eq!(covered as usize, prompts(&record).len(), "a drop destroyed a prompt's run it never proved: {ctx}\nrecord {record:#}");
        return shown;
    }
    if world.call("boxd_job", &json!({ "work": work }).to_string()).1["state"] == "asleep" {
        world.ok_call("boxd_resume", &json!({ "work": work }).to_string());
    }
    // A prompt whose submit failed stays in the ledger as not admitted (intent before
    // effect) until a later call learns whether it arrived. Every admitted one must be on
    // the guest, and the guest must hold none the ledger does not (its list has each id
    // once by construction: a duplicate submit is answered, not admitted again).
    let mut seen = guest_seen(world, &work);
    let record = ledger_record(world, &work);
    let mut admitted: Vec<String> = record["prompts"].as_array().into_iter().flatten().filter(|p| p["admitted"] == true).map(|p| p["id"].as_str().unwrap().to_string()).collect();
    let all = prompts(&record);
    seen.sort();
    admitted.sort();
    assert!(seen.iter().all(|s| all.contains(s)) && admitted.iter().all(|a| seen.contains(a)), "the guest admitted each prompt the ledger calls admitted, and none it does not hold: {ctx}\nseen {seen:?}\nrecord {record:#}");

    // The work can still be finished, and then nothing of it is left on boxd.
    idle_with_nothing_pending(world, &work);
    let harvest = settled_call(world, "boxd_harvest", &json!({ "work": work, "files": ["out.txt"] }).to_string());
    assert_eq!(harvest.0, 0, "the work harvests after the race: {ctx}\n{:#}", harvest.1);
    let dropped = settled_call(world, "boxd_drop", &json!({ "work": work }).to_string());
    let record = ledger_record(world, &work);
    let unresolved: Vec<&str> = record["prompts"].as_array().into_iter().flatten().filter(|p| p["admitted"] != true).filter_map(|p| p["id"].as_str()).collect();
    if dropped.0 == 1 && !unresolved.is_empty() {
        // A submit that failed in the race (its exec found the machine asleep, or froze
        // with it) left its prompt recorded and not admitted: the guest never had it, and the
        // ledger calls it lost only once no exec can still be carrying it (ledger.rs
        // IN_FLIGHT_MS, 10 min). The drop names it and that wait.
        let message = dropped.1["message"].as_str().unwrap_or_default();
        assert!([(a, &answers[0]), (b, &answers[1])].iter().any(|(tool, (code, _))| *tool == Tool::Submit && *code == 1), "only a failed submit leaves a prompt unresolved: {ctx}\nrecord {record:#}");
        assert!(unresolved.iter().all(|id| !seen.iter().any(|s| s == id)) && message.contains(unresolved[0]), "{ctx}\n{:#}", dropped.1);
        return format!("{shown}; then the drop waits on the failed submit's prompt {}", unresolved[0]);
    }
    assert_eq!(dropped.1["dropped"], true, "the work drops after the race: {ctx}\n{:#}", dropped.1);
    let record = ledger_record(world, &work);
    let covered = record["proofs"].as_array().and_then(|p| p.last()).map_or(0, |p| p["prompts"].as_u64().unwrap_or(0));
    assert_eq!(covered as usize, prompts(&record).len(), "{ctx}\nrecord {record:#}");
    assert_eq!(machines_named(world, &machine), 0, "{ctx}");
    shown
}

/// The fork a race made (or was refused) agrees with its machine, and goes with a drop:
/// no record means no machine; a queued or closed fork has none, an open one exactly the
/// one its record names, a creating one at most one (the next boxd_fork adopts it).
fn fork_agrees(world: &World, work: &str, ctx: &str) {
    let fork = Tool::fork_of(work);
    let machine = format!("oc-{fork}");
    let n = machines_named(world, &machine);
    if !world.laptop.ledger.join(format!("works/{fork}/work.json")).exists() {
        assert_eq!(n, 0, "a fork the ledger never recorded has no machine: {ctx}");
        return;
    }
    let record = ledger_record(world, &fork);
    let state = record["state"].as_str().unwrap_or_default().to_string();
    match state.as_str() {
        "open" => {
            assert_eq!(n, 1, "an open fork has its machine: {ctx}\nfork {record:#}");
            let listed = world.laptop.boxd(&["machine", "get", &machine, "--json"]);
            let id = serde_json::from_slice::<Value>(&listed.stdout).unwrap()["id"].clone();
            assert_eq!(record["machineId"], id, "the fork's record names its machine: {ctx}\nfork {record:#}");
        }
        "creating" => assert!(n <= 1, "{ctx}"),
        _ => assert_eq!(n, 0, "a {state} fork has no machine: {ctx}\nfork {record:#}"),
    }
    // Finished: an open fork harvests (its tree becomes a record), then every fork drops.
    let f = json!({ "work": fork }).to_string();
    if state == "creating" && ledger_record(world, work)["state"] == "open" {
        settled_call(world, "boxd_fork", &Tool::Fork.args(work, 0));
    }
    if ledger_record(world, &fork)["state"] == "open" {
        // The parent's out.txt came with the copied tree: the fork harvests it too.
        let h = settled_call(world, "boxd_harvest", &json!({ "work": fork, "files": ["out.txt"] }).to_string());
        assert_eq!(h.0, 0, "the fork harvests after the race: {ctx}\n{:#}", h.1);
    }
    let dropped = settled_call(world, "boxd_drop", &f);
    assert_eq!(dropped.0, 0, "the fork drops after the race: {ctx}\n{:#}", dropped.1);
    assert_eq!(ledger_record(world, &fork)["state"], "closed", "{ctx}");
    assert_eq!(machines_named(world, &machine), 0, "{ctx}");
}

/// Each pair on a fresh work; a table row per pair, a failed check being its row.
fn matrix(world: &World, pairs: &[(Tool, Tool)]) -> Vec<String> {
    let codes = documented_codes();
    let mut rows = Vec::new();
    for (cell, (a, b)) in pairs.iter().enumerate() {
        let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| race(world, &codes, *a, *b, cell)));
        for m in [format!("oc-r{cell}"), format!("oc-r{cell}f")] {
            let _ = world.laptop.boxd(&["machine", "remove", &m, "-y"]);
        }
        let name = format!("{} ∥ {}", a.name(), b.name());
        rows.push(match checked {
            Ok(shown) => format!("{name:<28} held ({shown})"),
            Err(e) => {
                let why = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
                format!("{name:<28} BROKEN: {}", why.lines().take(3).collect::<Vec<_>>().join(" "))
            }
        });
    }
    eprintln!("\nraces: {} pairs", rows.len());
    for r in &rows {
        eprintln!("  {r}");
    }
    rows
}

/// Two submits (the guest may admit them in the other order than the ledger records
/// them: the proof must still cover both), a drop against a submit (a prompt admitted
/// while the machine is sealed), and two drops (both end with the work dropped, whichever
/// seal loses the machine to the other).
#[test]
fn races_subset() {
    let world = World::new("races-subset");
    let rows = matrix(&world, &[(Tool::Submit, Tool::Submit), (Tool::Drop, Tool::Submit), (Tool::Drop, Tool::Drop)]);
    assert!(rows.iter().all(|r| r.contains(" held (")), "{rows:#?}");
}

/// A work with nothing unaccounted for (ensured, harvested) whose next `machine remove`
/// takes 4 s; its arguments.
fn with_a_slow_remove(world: &World, work: &str) -> String {
    let w = json!({ "work": work }).to_string();
    world.ok_call("boxd_ensure", &w);
    world.ok_call("boxd_harvest", &w);
    world.faults(r#"[{"verb":"machine remove","times":1,"action":"delay","ms":4000}]"#);
    w
}

/// Two drops both pass their seal and checks; the other removes the machine while this
/// one's own remove is under way, and is killed before it closes the record. This one's
/// remove then finds no machine: what went is what it checked, so it closes the work.
#[test]
fn a_drop_whose_machine_another_drop_removed_first_closes_the_work() {
    let world = World::new("races-remove");
    let (work, machine) = ("rr", "oc-rr");
    let w = with_a_slow_remove(&world, work);
    std::thread::scope(|s| {
        let first = s.spawn(|| world.call("boxd_drop", &w));
        until_running(&["machine", "remove", machine]);
        // get, seal, remove: killed after the remove, before the close.
        assert!(world.killed_at("after-spawn:3", "boxd_drop", &w), "the second drop was killed after its remove");
        assert_eq!(machines_named(&world, machine), 0, "the second drop removed the machine");
        assert_eq!(ledger_record(&world, work)["state"], "dropping", "and never closed the work");
        let (code, v) = first.join().unwrap();
        assert_eq!((code, &v["dropped"]), (0, &json!(true)), "{v:#}");
        assert!(v.get("unrecovered").is_none(), "everything was checked before the machine went: {v:#}");
    });
    let record = ledger_record(&world, work);
    assert_eq!(record["state"], "closed", "{record:#}");
    assert_eq!(record["unrecovered"].as_array().map_or(0, Vec::len), 0, "{record:#}");
    assert!(ledger_problems(&world.laptop.ledger).is_empty());
}

/// A drop's remove is slow, and an ensure comes meanwhile (as a busy submit's next step
/// suggests): it is refused, since reopening the work would let a prompt run on the
/// machine the drop is removing, and the drop closes the work as checked.
#[test]
fn an_ensure_during_a_drops_slow_remove_leaves_the_drop_to_finish() {
    let world = World::new("races-reopen");
    let (work, machine) = ("ro", "oc-ro");
    let w = with_a_slow_remove(&world, work);
    let (code, v) = std::thread::scope(|s| {
        let drop = s.spawn(|| world.call("boxd_drop", &w));
        until_running(&["machine", "remove", machine]);
        let (code, ensured) = world.call("boxd_ensure", &w);
        assert_eq!((code, ensured["error"].as_str()), (1, Some("SESSION_BUSY")), "{ensured:#}");
        assert!(ensured["next"].as_str().unwrap().contains("boxd_drop"), "{ensured:#}");
        assert_eq!(ledger_record(&world, work)["state"], "dropping", "not reopened under the drop");
        drop.join().unwrap()
    });
    assert_eq!((code, &v["dropped"]), (0, &json!(true)), "{v:#}");
    assert!(v.get("machineWasGone").is_none(), "closed as checked: {v:#}");
    assert_eq!(ledger_record(&world, work)["state"], "closed");
    assert_eq!(machines_named(&world, machine), 0);
}

/// Two ensures of a new work at once. The first one's `machine new` is slow; the second's
/// lands at once but never answers (boxd stops answering). The first's create then finds
/// the name taken, by a machine made the way this plugin makes one: it may be this work's
/// own, so the work stays creating (not withdrawn as someone else's), and the next ensure
/// adopts the one machine.
#[test]
fn two_ensures_of_a_new_work_at_once_leave_the_machine_one_of_them_made_to_adopt() {
    let world = World::new("races-new");
    let (w, machine) = (json!({ "work": "rn" }).to_string(), "oc-rn");
    world.faults(
        r#"[{"verb":"machine new","times":1,"action":"delay","ms":5000},
            {"verb":"machine new","times":1,"action":"hang","ms":9000,"land":true}]"#,
    );
    let answers: Vec<(i32, Value)> = std::thread::scope(|s| {
        let first = s.spawn(|| world.call("boxd_ensure", &w));
        until_running(&["machine", "new", machine]);
        let second = world.call("boxd_ensure", &w);
        vec![first.join().unwrap(), second]
    });
    let ctx = format!("{:#} / {:#}", answers[0].1, answers[1].1);
    for (code, v) in &answers {
        assert_eq!((*code, v["error"].as_str()), (1, Some("CREATE_UNCERTAIN")), "{ctx}");
    }
    assert_eq!(ledger_record(&world, "rn")["state"], "creating", "{ctx}");
    let v = world.ok_call("boxd_ensure", &w);
    assert_eq!(v["adopted"], true, "{v:#}");
    assert_eq!(machines_named(&world, machine), 1, "{ctx}");
    let record = ledger_record(&world, "rn");
    assert_eq!(record["machineId"], stdout_json(&world.laptop.boxd(&["machine", "get", machine, "--json"]))["id"], "{record:#}");
    assert_eq!(world.ok_call("boxd_job", &w)["state"], "idle");
}

/// A submit's exec waits while a sleep puts the machine to sleep: boxd then fails the exec
/// on a hibernated machine, and the submit says the machine is asleep (boxd_resume next)
/// rather than passing on boxd's failure. After the resume, the same submit is the same
/// prompt: admitted once, under the id it was recorded with.
#[test]
fn a_submit_whose_machine_is_put_to_sleep_under_it_answers_machine_asleep_and_loses_nothing() {
    let world = World::new("races-asleep");
    let (work, machine) = ("ra", "oc-ra");
    let w = json!({ "work": work }).to_string();
    world.ok_call("boxd_ensure", &w);
    world.faults(r#"[{"verb":"machine exec","times":1,"action":"delay","ms":3000}]"#);
    let args = json!({ "work": work, "prompt": "a prompt the sleep overtakes" }).to_string();
    let (code, v) = std::thread::scope(|s| {
        let submit = s.spawn(|| world.call("boxd_submit", &args));
        until_running(&["machine", "exec", machine]);
        world.ok_call("boxd_sleep", &w);
        submit.join().unwrap()
    });
    assert_eq!((code, v["error"].as_str()), (1, Some("MACHINE_ASLEEP")), "{v:#}");
    assert!(v["next"].as_str().unwrap().contains("boxd_resume"), "{v:#}");
    let recorded = ledger_record(&world, work)["prompts"].clone();
    assert_eq!(recorded.as_array().map(Vec::len), Some(1), "the prompt is recorded, not lost: {recorded:#}");
    assert_eq!(recorded[0]["admitted"], false, "{recorded:#}");
    world.ok_call("boxd_resume", &w);
    let again = world.ok_call("boxd_submit", &args);
    assert_eq!(again["promptId"], recorded[0]["id"], "the same prompt, sent again: {again:#}");
    let prompts = ledger_record(&world, work)["prompts"].clone();
    assert_eq!(prompts.as_array().map(Vec::len), Some(1), "{prompts:#}");
    assert_eq!(prompts[0]["admitted"], true, "{prompts:#}");
    let id = recorded[0]["id"].as_str().unwrap().to_string();
    assert_eq!(guest_seen(&world, work).iter().filter(|s| **s == id).count(), 1);
    assert!(ledger_problems(&world.laptop.ledger).is_empty());
}

/// F1: two hosts submit the same words to one work at the same moment (two sessions, two
/// terminals). Both read the record before either records its prompt (`machine get` held
/// back); the second to take the ledger's lock carries the first's id, so the guest admits
/// the prompt once and runs it once; both answers name that id. Before, each recorded its
/// own prompt and the guest ran the text twice.
#[test]
fn two_submits_of_the_same_words_at_once_run_them_once() {
    let world = World::new("races-same-words");
    let (work, machine) = ("rs", "oc-rs");
    let w = json!({ "work": work }).to_string();
    world.ok_call("boxd_ensure", &w);
    world.faults(r#"[{"verb":"machine get","times":2,"action":"delay","ms":1500}]"#);
    let args = json!({ "work": work, "prompt": "the same words from two places" }).to_string();
    let answers: Vec<(i32, Value)> = std::thread::scope(|s| {
        let a = s.spawn(|| world.call("boxd_submit", &args));
        let b = s.spawn(|| world.call("boxd_submit", &args));
        vec![a.join().unwrap(), b.join().unwrap()]
    });
    let ctx = format!("{:#} / {:#}", answers[0].1, answers[1].1);
    assert!(answers.iter().all(|(code, _)| *code == 0), "{ctx}");
    assert_eq!(answers[0].1["promptId"], answers[1].1["promptId"], "{ctx}");
    let prompts = ledger_record(&world, work)["prompts"].clone();
    assert_eq!(prompts.as_array().map(Vec::len), Some(1), "{ctx}\n{prompts:#}");
    assert_eq!(prompts[0]["admitted"], true, "{prompts:#}");
    world.job_until_idle(work);
    let out = world.on_machine(machine, &format!("cat .boxd-helper/works/{work}/state.json"));
    let st: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(st["runs"], 1, "the words ran once: {st:#}");
    assert_eq!(guest_seen(&world, work), vec![prompts[0]["id"].as_str().unwrap().to_string()]);
}

/// F2: the file a submit sends vanishes, or is swapped for a symlink to a file outside the
/// project, after the component checked it and before the host opens it (while `machine
/// get` is held back). The host refuses it and starts no child: PATH_REFUSED naming the
/// file and what to do, no exec run, and the prompt the call recorded leaves the record,
/// so the work harvests and drops at once. Before: BOXD_FAILED ("read the boxd CLI's own
/// message", though boxd never ran) and a prompt that kept image and drop at NOT_PROVEN
/// for ten minutes.
#[test]
fn a_file_gone_or_swapped_mid_submit_is_path_refused_and_records_no_prompt() {
    let world = World::new("races-file-gone");
    let (work, machine) = ("rg", "oc-rg");
    let w = json!({ "work": work }).to_string();
    world.ok_call("boxd_ensure", &w);
    let file = world.laptop.project.join("f.txt");
    let outside = world.laptop.scratch.path("outside").join("secret.txt");
    std::fs::write(&outside, "not the project's").unwrap();
    for case in ["gone", "symlink"] {
        std::fs::write(&file, "inside").unwrap();
        world.faults(r#"[{"verb":"machine get","times":1,"action":"delay","ms":2000}]"#);
        let execs = world.calls_starting(&["machine", "exec"]);
        let args = json!({ "work": work, "prompt": format!("send it {case}"), "files": [{ "from": "f.txt", "to": "f.txt" }] }).to_string();
        let (code, v) = std::thread::scope(|s| {
            let submit = s.spawn(|| world.call("boxd_submit", &args));
            until_running(&["machine", "get", machine]);
            std::fs::remove_file(&file).unwrap();
            if case == "symlink" {
                std::os::unix::fs::symlink(&outside, &file).unwrap();
            }
            submit.join().unwrap()
        });
        assert_eq!((code, v["error"].as_str()), (1, Some("PATH_REFUSED")), "{case}: {v:#}");
        assert!(v["message"].as_str().unwrap().contains("cannot be streamed"), "{case}: {v:#}");
        assert!(v["next"].as_str().unwrap().contains("f.txt") && v["next"].as_str().unwrap().contains("boxd_submit"), "{case}: {v:#}");
        assert_eq!(world.calls_starting(&["machine", "exec"]), execs, "{case}: boxd never ran");
        let prompts = ledger_record(&world, work)["prompts"].clone();
        assert_eq!(prompts, json!([]), "{case}: {prompts:#}");
        let _ = std::fs::remove_file(&file);
    }
    assert_eq!(world.ok_call("boxd_harvest", &w)["proven"], true);
    let d = world.ok_call("boxd_drop", &w);
    assert_eq!(d["dropped"], true, "{d:#}");
    assert!(ledger_problems(&world.laptop.ledger).is_empty());
}

/// Two boxd_fork calls of one parent with the same fork at once: the first one's `machine
/// fork` is slow, so the second finds the fork recorded with no machine yet, makes it and
/// readies it; the first's fork then finds the name taken by that machine. Neither may put
/// the fork back in the queue or call its machine someone else's.
#[test]
fn two_forks_of_one_name_at_once_make_one_machine_and_both_answer_it() {
    two_forks_at_once("rf", r#"[{"verb":"machine fork","times":1,"action":"delay","ms":3000}]"#);
}

/// The same, with boxd holding the name from the first fork's start (it lands at once and
/// answers late): the second finds the machine and adopts it, and the first's late answer
/// leaves the fork to it.
#[test]
fn a_fork_whose_machine_fork_answers_late_is_adopted_by_a_second_call_not_made_twice() {
    two_forks_at_once("rl", r#"[{"verb":"machine fork","times":1,"action":"delay","ms":3000,"land":true}]"#);
}

fn two_forks_at_once(parent: &str, faults: &str) {
    let world = World::new(&format!("races-fork-{parent}"));
    setup(&world, parent);
    let fork = Tool::fork_of(parent);
    let args = Tool::Fork.args(parent, 0);
    world.faults(faults);
    let answers: Vec<(i32, Value)> = std::thread::scope(|s| {
        let first = s.spawn(|| world.call("boxd_fork", &args));
        until_running(&["machine", "fork", &format!("oc-{parent}")]);
        let second = world.call("boxd_fork", &args);
        vec![first.join().unwrap(), second]
    });
    let ctx = format!("{:#} / {:#}", answers[0].1, answers[1].1);
    for (code, v) in &answers {
        assert_eq!(*code, 0, "{ctx}");
        let row = v["forks"].as_array().unwrap().iter().find(|r| r["work"] == fork.as_str()).cloned().unwrap_or_default();
        assert!(row["state"] == "running" || row["state"] == "creating", "each answer lists the fork as made or being made: {ctx}");
    }
    let record = ledger_record(&world, &fork);
    assert_eq!(record["state"], "open", "{ctx}\nfork {record:#}");
    assert_eq!(machines_named(&world, &format!("oc-{fork}")), 1, "{ctx}");
    // One copy of the parent's tree, not one inside the other.
    let tree = world.on_machine(&format!("oc-{fork}"), &format!("ls -A work/{fork}"));
    let names = String::from_utf8_lossy(&tree.stdout).into_owned();
    assert!(names.lines().all(|n| !n.contains("fork-tmp")) && names.contains("out.txt"), "{names}");
    fork_agrees(&world, parent, &ctx);
}

#[test]
#[ignore = "every pair takes several minutes; run it with --ignored"]
fn races_full() {
    let world = World::new("races-full");
    let mut pairs = Vec::new();
    for (i, a) in TOOLS.iter().enumerate() {
        for b in &TOOLS[i..] {
            pairs.push((*a, *b));
        }
    }
    // BOXD_RACE_PAIRS=drop:drop,sleep:ensure runs only those pairs.
    if let Ok(only) = std::env::var("BOXD_RACE_PAIRS") {
        let short = |t: &Tool| t.name().trim_start_matches("boxd_").to_string();
        pairs.retain(|(a, b)| only.split(',').any(|p| p == format!("{}:{}", short(a), short(b))));
    }
    let rows = matrix(&world, &pairs);
    assert!(rows.iter().all(|r| r.contains(" held (")), "{rows:#?}");
}

fn images_of(world: &World, work: &str) -> (Value, Value) {
    let r = ledger_record(world, work);
    (r["images"].clone(), r["imagesPending"].clone())
}

/// Someone else saves a snapshot under the name boxd_image was asked for, after its look
/// at the name and before its save (boxd-local's faults: the image's listing lists at once
/// and answers 3 s late). boxd has no save that refuses a taken name, so the
/// image's save becomes v2 of their snapshot: the answer is SNAPSHOT_EXISTS naming the
/// version it added, and the name is not recorded as this work's, nor as under way.
/// Before: answered success and recorded their snapshot as this work's.
#[test]
fn an_image_whose_name_is_taken_before_its_save_is_refused_and_says_what_it_added() {
    let world = World::new("races-image-name");
    let w = json!({ "work": "ri" }).to_string();
    world.ok_call("boxd_ensure", &w);
    world.ok_call("boxd_harvest", &w);
    assert!(world.laptop.boxd(&["machine", "new", "someone-else", "--json"]).status.success());
    world.faults(r#"[{"verb":"snapshots list","times":1,"action":"delay","ms":3000,"land":true}]"#);
    let (code, v) = std::thread::scope(|s| {
        let image = s.spawn(|| world.call("boxd_image", r#"{"work":"ri","name":"shared-img"}"#));
        // Its look at the name has listed (it does at once) and now waits before answering.
        until_running_in(&world.laptop.boxd_home, &["snapshots", "list"]);
        std::thread::sleep(std::time::Duration::from_millis(300));
        let theirs = world.laptop.boxd(&["snapshots", "save", "someone-else", "shared-img"]);
        assert!(theirs.status.success(), "{}", String::from_utf8_lossy(&theirs.stderr));
        image.join().unwrap()
    });
    world.faults("[]");
    assert_eq!((code, v["error"].as_str()), (1, Some("SNAPSHOT_EXISTS")), "{v:#}");
    let message = v["message"].as_str().unwrap();
    assert!(message.contains("version v2") && message.contains("someone else") && message.contains("not recorded as this work's"), "{v:#}");
    assert!(v["next"].as_str().unwrap().contains("another name"), "{v:#}");
    assert_eq!(images_of(&world, "ri"), (Value::Null, Value::Null), "neither made nor under way");
    let list: Value = serde_json::from_slice(&world.laptop.boxd(&["snapshots", "list", "--json"]).stdout).unwrap();
    let row = list.as_array().unwrap().iter().find(|s| s["name"] == "shared-img").cloned().unwrap_or_default();
    assert_eq!(row["version"], "v2", "what the answer says was added: {list}");
}

/// Two works save under one name at the same moment: one of them makes it, the other is
/// refused (it saw the name at its look, or its save added v2 and it says so), and
/// only the maker's record holds it. Before: both answered saved, and both ledgers
/// claimed the name (v1 one work's tree, v2 the other's).
#[test]
fn two_images_of_one_name_at_once_are_one_works_only() {
    let world = World::new("races-image-two");
    for work in ["ia", "ib"] {
        let w = json!({ "work": work }).to_string();
        world.ok_call("boxd_ensure", &w);
        world.ok_call("boxd_harvest", &w);
    }
    let answers: Vec<(i32, Value)> = std::thread::scope(|s| {
        let a = s.spawn(|| world.call("boxd_image", r#"{"work":"ia","name":"img"}"#));
        let b = s.spawn(|| world.call("boxd_image", r#"{"work":"ib","name":"img"}"#));
        vec![a.join().unwrap(), b.join().unwrap()]
    });
    let ctx = format!("{:#} / {:#}", answers[0].1, answers[1].1);
    let made: Vec<usize> = (0..2).filter(|i| answers[*i].0 == 0).collect();
    assert_eq!(made.len(), 1, "exactly one made it: {ctx}");
    let other = 1 - made[0];
    assert_eq!(answers[other].1["error"], "SNAPSHOT_EXISTS", "{ctx}");
    for (i, work) in ["ia", "ib"].iter().enumerate() {
        let want = if i == made[0] { json!(["img"]) } else { Value::Null };
        assert_eq!(images_of(&world, work), (want, Value::Null), "{work}: {ctx}");
    }
}

/// A boxd_submit that lands while boxd_image is between its plan and its save (the
/// image's `machine get` answers 6 s late): the image saves nothing, since the machine
/// now runs a prompt the laptop has not seen (NOT_PROVEN). Before: it saved, and recorded
/// `imagesAt` counting the prompt.
#[test]
fn an_image_planned_before_a_submit_saves_nothing_the_laptop_has_not_seen() {
    let world = World::new("races-image-submit");
    let w = json!({ "work": "rs" }).to_string();
    world.ok_call("boxd_ensure", &w);
    world.ok_call("boxd_harvest", &w);
    world.faults(r#"[{"verb":"machine get","machine":"oc-rs","times":1,"action":"delay","ms":6000}]"#);
    world.forget_calls();
    let (image, submitted) = std::thread::scope(|s| {
        let image = s.spawn(|| world.call("boxd_image", r#"{"work":"rs","name":"img-rs"}"#));
        until_running(&["machine", "get", "oc-rs"]);
        let submitted = world.ok_call("boxd_submit", r#"{"work":"rs","prompt":"write a file please"}"#);
        (image.join().unwrap(), submitted)
    });
    world.faults("[]");
    assert_eq!(submitted["admitted"], true, "{submitted:#}");
    assert_eq!((image.0, image.1["error"].as_str()), (1, Some("NOT_PROVEN")), "{:#}", image.1);
    assert_eq!(world.calls_starting(&["snapshots", "save"]), 0, "nothing saved");
    assert_eq!(images_of(&world, "rs"), (Value::Null, Value::Null));
    world.job_until_idle("rs");
}
