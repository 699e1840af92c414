//! A machine's processes across power changes and idle bounds: background jobs started by
//! exec survive hibernate/pause (stopped, state T) and run on after wake/resume; stop,
//! reboot and remove kill them; idle bounds fire at the next invocation.

mod common;
use common::*;
use std::time::{Duration, Instant};

fn settles(counter: &std::path::Path) -> bool {
    let a = lines(counter);
    std::thread::sleep(Duration::from_millis(300));
    lines(counter) == a
}

#[test]
fn hibernated_processes_survive_wake() {
    let h = Home::new("hibernate");
    h.ok(&["machine", "new", "h"]);
    let (pid, counter) = start_counter(&h, "h");
    wait_for("ticks", 5, || lines(&counter) > 3);
    h.ok(&["machine", "hibernate", "h"]);
    wait_for("hibernate to stop the process", 5, || held(pid));
    assert!(settles(&counter), "a stopped counter does not count");
    assert_eq!(h.status("h"), "hibernated");

    h.ok(&["machine", "wake", "h"]);
    assert_ne!(proc_state(pid), Some('T'));
    assert!(proc_state(pid).is_some(), "the process survived");
    let n = lines(&counter);
    wait_for("the counter to run on", 5, || lines(&counter) > n + 3);

    h.ok(&["machine", "remove", "h", "-y"]);
    wait_for("remove to kill it", 5, || proc_state(pid).is_none());
}

#[test]
fn pause_and_resume_stop_and_continue() {
    let h = Home::new("pause");
    h.ok(&["machine", "new", "p"]);
    let (pid, counter) = start_counter(&h, "p");
    h.ok(&["machine", "pause", "p"]);
    wait_for("pause to stop the process", 5, || held(pid));
    assert!(settles(&counter));
    h.ok(&["machine", "resume", "p"]);
    let n = lines(&counter);
    wait_for("the counter to run on", 5, || lines(&counter) > n + 3);
}

#[test]
fn stop_and_reboot_kill_processes_but_keep_the_home() {
    let h = Home::new("stop");
    h.ok(&["machine", "new", "s"]);
    let (pid, counter) = start_counter(&h, "s");
    h.ok(&["machine", "stop", "s"]);
    wait_for("stop to kill it", 5, || proc_state(pid).is_none());
    assert!(counter.exists(), "the disk is kept");
    h.ok(&["machine", "start", "s"]);
    let (pid, _) = start_counter(&h, "s");
    h.ok(&["machine", "reboot", "s"]);
    wait_for("reboot to kill it", 5, || proc_state(pid).is_none());
    assert_eq!(h.status("s"), "running");
    // A hibernated (stopped) process dies on stop too.
    let (pid, _) = start_counter(&h, "s");
    h.ok(&["machine", "hibernate", "s"]);
    h.ok(&["machine", "stop", "s"]);
    wait_for("stop to kill a stopped process", 5, || proc_state(pid).is_none());
}

#[test]
fn remove_kills_processes_and_deletes_the_home() {
    let h = Home::new("remove");
    h.ok(&["machine", "new", "r"]);
    let home = h.machine_home("r");
    let (pid, _) = start_counter(&h, "r");
    // A nohup'd job (same process group as the exec) belongs to the machine too.
    h.ok(&["machine", "exec", "r", "--", "nohup sleep 300 >/dev/null 2>&1 & echo $! > nohup.pid"]);
    let nohup_pid: i32 = std::fs::read_to_string(home.join("nohup.pid")).unwrap().trim().parse().unwrap();
    assert!(proc_state(nohup_pid).is_some(), "nohup job outlives the exec");
    h.ok(&["machine", "remove", "r", "-y"]);
    assert!(proc_state(pid).is_none() && proc_state(nohup_pid).is_none());
    assert!(!home.exists());
}

/// A home with many files (a guest OpenCode's package cache) is removed as fast as an
/// empty one: the folder goes to the trash at once and is deleted after the answer.
#[test]
fn remove_does_not_wait_for_a_big_home_to_be_deleted() {
    let h = Home::new("bigremove");
    h.ok(&["machine", "new", "small"]);
    h.ok(&["machine", "new", "big"]);
    h.ok(&["machine", "exec", "big", "--", "mkdir -p .cache/opencode/node_modules && cd .cache/opencode/node_modules && seq 1 30000 | xargs touch && chmod 555 ."]);
    let big_dir = h.machine_home("big").parent().unwrap().to_path_buf();
    let (pid, _) = start_counter(&h, "big");
    let timed = |name: &str| {
        let t = Instant::now();
        h.ok(&["machine", "remove", name, "-y"]);
        t.elapsed()
    };
    let (small, big) = (timed("small"), timed("big"));
    assert!(big < small + Duration::from_millis(500), "big {big:?} vs small {small:?}");
    assert!(proc_state(pid).is_none(), "its processes are gone when remove answers");
    assert!(!big_dir.exists(), "the folder left machines/ at once");
    wait_for("the trash to be emptied (a read-only folder too)", 30, || {
        std::fs::read_dir(h.dir.join("trash")).map(|d| d.count() == 0).unwrap_or(true)
    });
    assert!(!h.calls().iter().any(|c| c["argv"][0] == "--purge-trash"), "the purge is not a logged call");
}

#[test]
fn idle_bound_hibernates_at_the_next_invocation() {
    let h = Home::new("idle");
    h.ok(&["machine", "new", "i", "--auto-hibernate-timeout", "1"]);
    let (pid, counter) = start_counter(&h, "i");
    std::thread::sleep(Duration::from_millis(800));
    // A machine created (active) later is not idle yet when "i" is.
    h.ok(&["machine", "new", "busy", "--auto-hibernate-timeout", "1"]);
    std::thread::sleep(Duration::from_millis(700));
    let list = h.json(&["machine", "list"]);
    assert_eq!(list[0]["name"], "busy");
    assert_eq!(list[0]["status"], "running");
    assert_eq!(list[1]["status"], "hibernated");
    // Stopped, or about to be (common::held).
    wait_for("auto-hibernate to stop the processes", 5, || held(pid));
    assert!(settles(&counter));
    h.ok(&["machine", "wake", "i"]);
    assert_ne!(proc_state(pid), Some('T'));
}

#[test]
fn auto_suspend_and_auto_destroy() {
    let h = Home::new("bounds");
    h.ok(&["machine", "new", "s", "--auto-suspend-timeout", "1"]);
    h.ok(&["machine", "new", "d", "--auto-destroy-timeout", "1"]);
    h.ok(&["machine", "new", "keep", "--auto-hibernate-timeout", "0"]);
    let d_home = h.machine_home("d");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(h.status("s"), "standby");
    assert_eq!(h.fails(&["machine", "get", "d"]), "error: VM 'd' not found");
    assert!(!d_home.exists());
    assert_eq!(h.status("keep"), "running");
    assert_eq!(h.json(&["machine", "get", "keep"])["auto_hibernate"], "off");
}

#[test]
fn a_running_exec_keeps_its_machine_awake() {
    let h = Home::new("session");
    h.ok(&["machine", "new", "x", "--auto-hibernate-timeout", "1"]);
    let child = h.cmd(&["machine", "exec", "x", "--", "sleep 2.5; echo done"]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(1800));
    assert_eq!(h.status("x"), "running", "not idle while an exec runs");
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
}

/// A purge that starts after the home was deleted (it is detached, and may start late)
/// creates nothing: the deleted home stays deleted.
#[test]
fn a_late_purge_does_not_bring_a_deleted_home_back() {
    let h = Home::new("latepurge");
    h.ok(&["machine", "new", "gone"]);
    h.ok(&["machine", "remove", "gone", "-y"]);
    std::fs::remove_dir_all(&h.dir).ok();
    let status = h.cmd(&["--purge-trash"]).status().unwrap();
    assert!(status.success());
    assert!(!h.dir.exists(), "the purge created {}", h.dir.display());
}
