//! The lifecycle of a work against boxd-local with its fault injection: ensure (create,
//! adopt, refuse), sleep, resume, image and drop guards, access, and ledger recovery.

use serde_json::json;

use crate::common::*;

const W1: &str = r#"{"work":"w1"}"#;

#[test]
fn read_only_refuses_every_change_before_any_cli_call() {
    let world = World::new("readonly");
    let ro = ["--options", r#"{"access":"read-only"}"#];
    for (tool, args) in [
        ("boxd_ensure", W1),
        ("boxd_submit", r#"{"work":"w1","prompt":"hi"}"#),
        ("boxd_harvest", W1),
        ("boxd_sleep", W1),
        ("boxd_resume", W1),
        ("boxd_image", r#"{"work":"w1","name":"snap"}"#),
        ("boxd_drop", W1),
    ] {
        let (code, v) = world.call_with(&ro, tool, args);
        assert_eq!((code, v["error"].as_str()), (1, Some("ACCESS_DENIED")), "{tool}: {v:#}");
        assert!(v["next"].as_str().unwrap().contains("read-only"));
    }
    // The reads still run.
    let (code, v) = world.call_with(&ro, "boxd_status", "{}");
    assert_eq!(code, 0);
    assert_eq!(v["access"], "read-only");
    let before_status = world.laptop.boxd_calls().len();
    assert_eq!(before_status, 2, "only boxd_status reached boxd: {:?}", world.laptop.boxd_calls());
}

#[test]
fn snapshot_missing_creates_nothing() {
    let world = World::new("nosnap");
    assert!(world.laptop.boxd(&["snapshots", "remove", "opencode-golden", "-y"]).status.success());
    world.forget_calls();
    let v = world.err_call("boxd_ensure", W1, "SNAPSHOT_MISSING");
    assert!(v["next"].as_str().unwrap().contains("golden"));
    assert_eq!(world.calls_starting(&["machine", "new"]), 0);
}

#[test]
fn a_same_named_machine_made_outside_the_ledger_is_not_ours() {
    let world = World::new("notours");
    assert!(world.laptop.boxd(&["machine", "new", "oc-w1", "--json"]).status.success());
    // It may be the user's own work kept in another ledger: the answer names this one and
    // sends them there before it ever suggests removing the machine.
    let ledger = world.laptop.ledger.display().to_string();
    let v = world.err_call("boxd_ensure", W1, "NOT_OURS");
    assert!(v["message"].as_str().unwrap().contains(&ledger) && v["next"].as_str().unwrap().contains("another ledger"), "{v:#}");
    let v = world.err_call("boxd_drop", W1, "WORK_UNKNOWN");
    assert!(v["message"].as_str().unwrap().contains(&ledger), "{v:#}");
    assert_eq!(world.calls_starting(&["machine", "remove"]), 0);
}

#[test]
fn bad_work_ids_are_name_invalid() {
    let world = World::new("names");
    for id in ["W1", "1w", "w_1", "a-", ""] {
        world.err_call("boxd_ensure", &json!({ "work": id }).to_string(), "NAME_INVALID");
    }
    world.err_call("boxd_image", r#"{"work":"w1","name":"Bad Name"}"#, "NAME_INVALID");
    assert!(world.laptop.boxd_calls().is_empty());
}

#[test]
fn create_timeout_then_adoption_makes_exactly_one_machine() {
    let world = World::new("adopt");
    // boxd stops answering, but the create lands: the classic uncertain create.
    world.faults(r#"[{"verb":"machine new","times":1,"action":"hang","ms":20000,"land":true}]"#);
    let (code, v) = world.call_with(&["--options", r#"{"boxdTimeoutSeconds":5}"#], "boxd_ensure", W1);
    assert_eq!((code, v["error"].as_str()), (1, Some("CREATE_UNCERTAIN")), "{v:#}");
    let ledger: serde_json::Value = serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap()).unwrap();
    assert_eq!(ledger["state"], "creating", "the work was recorded before the create ran");
    let v = world.ok_call("boxd_ensure", W1);
    assert_eq!(v["adopted"], true);
    assert_eq!(v["created"], false);
    assert_eq!(world.calls_starting(&["machine", "new"]), 1, "never a second machine for one work");
    let v = world.ok_call("boxd_ensure", W1);
    assert_eq!(v["adopted"], false, "ensure on a healthy work is idempotent");
    assert_eq!(world.calls_starting(&["machine", "new"]), 1);
}

#[test]
fn boot_timeout_is_uncertain_until_the_machine_appears() {
    let world = World::new("boottimeout");
    world.faults(r#"[{"verb":"machine new","times":1,"action":"boot_timeout","appear_after_ms":1500}]"#);
    world.err_call("boxd_ensure", W1, "CREATE_UNCERTAIN");
    std::thread::sleep(std::time::Duration::from_millis(1800));
    let v = world.ok_call("boxd_ensure", W1);
    assert_eq!(v["adopted"], true);
    assert_eq!(world.calls_starting(&["machine", "new"]), 1);
}

#[test]
fn sleep_then_job_is_asleep_by_boxd_sleep_without_an_exec_and_resume_wakes() {
    let world = World::new("sleep");
    world.ok_call("boxd_ensure", W1);
    let v = world.ok_call("boxd_sleep", W1);
    assert_eq!(v["state"], "asleep");
    assert!(v["sleptAt"].as_str().is_some());
    let execs = world.calls_starting(&["machine", "exec"]);
    let v = world.ok_call("boxd_job", W1);
    assert_eq!(v["state"], "asleep");
    assert_eq!(v["asleepBy"], "boxd_sleep");
    assert!(v["next"].as_str().unwrap().contains("boxd_resume"));
    assert_eq!(world.calls_starting(&["machine", "exec"]), execs, "boxd_job ran an exec on a sleeping machine");
    let status = world.ok_call("boxd_status", "{}");
    assert_eq!(status["works"][0]["state"], "asleep");

    let v = world.ok_call("boxd_resume", W1);
    assert_eq!(v["action"], "woken");
    assert_eq!(world.calls_starting(&["machine", "config", "set", "oc-w1", "auto-hibernate.timeout", "1800"]), 1);
    let v = world.ok_call("boxd_job", W1);
    assert_eq!(v["state"], "idle");

    // Hibernated by the CLI (or the idle bound), not by us:
    assert!(world.laptop.boxd(&["machine", "hibernate", "oc-w1"]).status.success());
    assert_eq!(world.ok_call("boxd_job", W1)["asleepBy"], "idle_or_cli");
}

#[test]
fn drop_and_image_refuse_until_a_harvest_proves_the_work() {
    let world = World::new("guards");
    world.ok_call("boxd_ensure", W1);
    world.err_call("boxd_drop", W1, "NOT_PROVEN");
    world.err_call("boxd_image", r#"{"work":"w1","name":"w1-snap"}"#, "NOT_PROVEN");
    assert_eq!(world.calls_starting(&["machine", "remove"]), 0);
    assert_eq!(world.calls_starting(&["snapshots", "save"]), 0);
}

#[test]
fn a_gone_machine_is_rebuilt_by_resume() {
    let world = World::new("gone");
    world.ok_call("boxd_ensure", W1);
    assert!(world.laptop.boxd(&["machine", "remove", "oc-w1", "-y"]).status.success());
    assert_eq!(world.ok_call("boxd_job", W1)["state"], "gone");
    world.err_call("boxd_ensure", W1, "MACHINE_GONE");
    let v = world.ok_call("boxd_resume", W1);
    assert_eq!(v["action"], "rebuilt");
    assert_eq!(world.ok_call("boxd_job", W1)["state"], "idle");
}

#[test]
fn a_shared_or_isolated_machine_is_refused() {
    let world = World::new("shared");
    // Our create is uncertain; then a machine of that name shows up shared (made as our
    // create makes one: another source is someone else's, NOT_OURS, before this check).
    world.faults(r#"[{"verb":"machine new","times":1,"action":"fail","message":"internal"}]"#);
    world.err_call("boxd_ensure", W1, "BOXD_FAILED");
    let like_ours = ["machine", "new", "oc-w1", "--from-snapshot", "opencode-golden", "--auto-hibernate-timeout", "1800", "--json"];
    assert!(world.laptop.boxd(&[&like_ours[..], &["--shared"]].concat()).status.success());
    world.err_call("boxd_ensure", W1, "MACHINE_SHARED");
    assert!(world.laptop.boxd(&["machine", "remove", "oc-w1", "-y"]).status.success());
    assert!(world.laptop.boxd(&[&like_ours[..], &["--isolated"]].concat()).status.success());
    world.err_call("boxd_ensure", W1, "MACHINE_ISOLATED");
}

#[test]
fn boxd_failures_map_to_codes_with_next_steps() {
    let world = World::new("failures");
    world.ok_call("boxd_ensure", W1);
    world.faults(r#"[{"verb":"machine get","times":1,"action":"network"}]"#);
    let v = world.err_call("boxd_job", W1, "BOXD_FAILED");
    assert!(v["message"].as_str().unwrap().contains("dns error"), "{v:#}");
    world.faults(r#"[{"verb":"machine get","times":1,"action":"signed_out"}]"#);
    let v = world.err_call("boxd_sleep", W1, "BOXD_FAILED");
    assert!(v["next"].as_str().unwrap().contains("boxd auth login"));
    assert!(world.laptop.boxd(&["auth", "login"]).status.success());
    world.faults(r#"[{"verb":"machine get","times":1,"action":"garbage"}]"#);
    world.err_call("boxd_job", W1, "BOXD_FAILED");
    world.faults(r#"[{"verb":"machine get","times":1,"action":"hang","ms":20000}]"#);
    let (code, v) = world.call_with(&["--options", r#"{"boxdTimeoutSeconds":5}"#], "boxd_job", W1);
    assert_eq!((code, v["error"].as_str()), (1, Some("TIMEOUT")));
    world.faults(r#"[{"verb":"machine get","times":1,"action":"lose_machine","machine":"oc-w1"}]"#);
    assert_eq!(world.ok_call("boxd_job", W1)["state"], "gone");
    world.err_call("boxd_submit", r#"{"work":"w1","prompt":"hi"}"#, "MACHINE_GONE");
}

#[test]
fn an_interrupted_host_leaves_a_ledger_that_reads_and_the_next_call_recovers() {
    let world = World::new("crash");
    world.faults(r#"[{"verb":"machine new","times":1,"action":"hang","ms":3000}]"#);
    // Kill the host while boxd hangs inside the create: the record was written first.
    let oc = opencode_bin();
    let mut child = std::process::Command::new(boxd_host())
        .args(["--project", world.laptop.project.to_str().unwrap(), "--ledger", world.laptop.ledger.to_str().unwrap()])
        .args(["--boxd", boxd_local().to_str().unwrap(), "--opencode", oc.to_str().unwrap(), "call", "boxd_ensure", W1])
        .env("BOXD_LOCAL_HOME", &world.laptop.boxd_home)
        .env("BOXD_HOST_CACHE", cache_dir())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let record = world.laptop.ledger.join("works/w1/work.json");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while world.calls_starting(&["machine", "new"]) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // A torn temporary file from a write in flight must not matter either.
    std::fs::write(world.laptop.ledger.join("works/w1/work.json.boxd-tmp"), b"{\"schema\":1,\"wo").unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    assert_eq!(v["state"], "creating");
    // The orphaned boxd-local ends its hang by itself.
    std::thread::sleep(std::time::Duration::from_millis(3500));
    let status = world.ok_call("boxd_status", "{}");
    assert_eq!(status["works"][0]["work"], "w1");
    let v = world.ok_call("boxd_ensure", W1);
    assert_eq!(v["state"], "running");
}

#[test]
fn a_machine_still_starting_is_machine_starting_then_adopted() {
    let world = World::new("starting");
    world.faults(r#"[{"verb":"machine new","times":1,"action":"boot_timeout","appear_after_ms":0,"starting_ms":4000}]"#);
    world.err_call("boxd_ensure", W1, "CREATE_UNCERTAIN");
    let v = world.err_call("boxd_ensure", W1, "MACHINE_STARTING");
    assert!(v["next"].as_str().unwrap().contains("later turn"));
    std::thread::sleep(std::time::Duration::from_millis(4200));
    assert_eq!(world.ok_call("boxd_ensure", W1)["adopted"], true);
    assert_eq!(world.calls_starting(&["machine", "new"]), 1);
}

#[test]
fn no_boxd_cli_is_boxd_missing_for_a_change() {
    let laptop = Laptop::new("missing-cli");
    let out = std::process::Command::new(boxd_host())
        .args(["--project", laptop.project.to_str().unwrap(), "--ledger", laptop.ledger.to_str().unwrap(), "call", "boxd_ensure", W1])
        .env("PATH", "/nonexistent")
        .env("BOXD_HOST_CACHE", cache_dir())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v = stdout_json(&out);
    assert_eq!(v["error"], "BOXD_MISSING");
    assert!(v["next"].as_str().unwrap().contains("boxd auth login"));
}

/// The laptop runs another OpenCode than the golden image carries (as when
/// `allowUntestedHost` lets a newer one through): refused with GUEST_VERSION. The machine
/// ensure just created can never serve the work, so it is removed and the work closed
/// (nothing left billing), and once the versions agree a plain ensure starts afresh.
#[test]
fn a_guest_whose_opencode_differs_from_the_laptops_is_refused_and_leaves_no_machine() {
    let world = World::new("version");
    let fake = world.laptop.scratch.0.join("opencode-other");
    std::fs::write(&fake, format!("#!/bin/sh\n[ \"$1\" = --version ] && {{ echo 1.19.0; exit 0; }}\nexec '{}' \"$@\"\n", opencode_bin().display())).unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let flags = ["--opencode", fake.to_str().unwrap(), "--options", r#"{"allowUntestedHost":true}"#];
    let (code, v) = world.call_with(&flags, "boxd_ensure", W1);
    assert_eq!((code, v["error"].as_str()), (1, Some("GUEST_VERSION")), "{v:#}");
    let message = v["message"].as_str().unwrap();
    assert!(message.contains("1.19.0") && message.contains("1.18.33"), "names both versions: {message}");
    assert!(message.contains("oc-w1 was removed and work 'w1' closed"), "says what became of the machine: {message}");
    let list = world.laptop.boxd(&["machine", "list", "--json"]);
    assert!(!String::from_utf8_lossy(&list.stdout).contains("oc-w1"), "no machine left running");
    assert_eq!(world.calls_starting(&["machine", "remove", "oc-w1"]), 1);
    // The ledger recorded the machine before it was made, and closed the work after.
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap()).unwrap();
    assert_eq!(record["state"], "closed", "{record:#}");
    assert_eq!(world.ok_call("boxd_status", "{}")["works"].as_array().unwrap().len(), 0);

    let v = world.ok_call("boxd_ensure", W1);
    assert_eq!((v["created"].as_bool(), v["state"].as_str()), (Some(true), Some("running")), "{v:#}");
}

#[test]
fn status_reports_one_corrupt_record_as_that_works_problem_and_the_rest_as_usual() {
    let world = World::new("corrupt-one");
    world.ok_call("boxd_ensure", W1);
    world.ok_call("boxd_ensure", r#"{"work":"w2"}"#);
    std::fs::write(world.laptop.ledger.join("works/w1/work.json"), b"{\"schema\":1,\"wo").unwrap();
    let v = world.ok_call("boxd_status", "{}");
    let works = v["works"].as_array().unwrap();
    let bad = works.iter().find(|w| w["work"] == "w1").expect("the corrupt work is listed");
    assert_eq!(bad["error"], "LEDGER_FAILED", "{v:#}");
    assert!(bad["next"].as_str().is_some_and(|n| !n.is_empty()));
    let good = works.iter().find(|w| w["work"] == "w2").expect("the other work is listed");
    assert_eq!(good["state"], "running", "{v:#}");
    assert_eq!(std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap(), b"{\"schema\":1,\"wo", "left as it is");
}

/// A machine listed under the name of a work the ledger closed (here made by hand after
/// the drop; a fork or create that lands after a drop looked shows the same way) is named
/// by boxd_status with how to check and remove it, and no tool touches it.
#[test]
fn status_names_a_machine_listed_under_a_closed_works_name_and_nothing_touches_it() {
    let world = World::new("closed-listed");
    world.ok_call("boxd_ensure", W1);
    world.ok_call("boxd_harvest", W1);
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], true);
    assert!(world.ok_call("boxd_status", "{}").get("closedWorksMachines").is_none(), "nothing listed under the name yet");
    assert!(world.laptop.boxd(&["machine", "new", "oc-w1", "--json"]).status.success());
    world.forget_calls();
    let status = world.ok_call("boxd_status", "{}");
    assert_eq!(status["closedWorksMachines"]["machines"], json!([{ "work": "w1", "machine": "oc-w1", "status": "running" }]), "{status:#}");
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], false, "the closed work stays closed");
    assert_eq!(world.calls_starting(&["machine", "remove"]) + world.calls_starting(&["machine", "exec"]), 0, "nothing touched it");
    assert_eq!(stdout_json(&world.laptop.boxd(&["machine", "get", "oc-w1", "--json"]))["status"], "running");
}
