//! boxd-local's `machine remove` of a machine the plugin made (the real guest helper, its
//! pump and the real OpenCode server started by a real boxd_ensure, and a package cache
//! the size OpenCode makes) takes about as long as the remove of a blank machine, and no
//! process of the machine survives it.

use std::time::{Duration, Instant};

use crate::common::*;

/// Pids whose environment carries boxd-local's marker for machine `id`.
fn processes_of(id: &str) -> Vec<u32> {
    let marker = format!("BOXD_LOCAL_MACHINE={id}");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == marker.as_bytes())))
        .collect()
}

#[test]
fn removing_a_machine_the_plugin_made_is_as_fast_as_any_and_leaves_no_process() {
    let world = World::new("rmspeed");
    world.ok_call("boxd_ensure", r#"{"work":"w1"}"#);
    let id = stdout_json(&world.laptop.boxd(&["machine", "get", "oc-w1", "--json"]))["id"].as_str().unwrap().to_string();
    // OpenCode's package cache: thousands of files (a real one holds its providers' npm packages).
    let cache = "mkdir -p .cache/opencode/node_modules && cd .cache/opencode/node_modules && seq 1 30000 | xargs touch";
    assert!(world.on_machine("oc-w1", cache).status.success());
    let running = processes_of(&id);
    assert!(running.len() >= 2, "the guest's OpenCode server and pump run: {running:?}");
    assert!(world.laptop.boxd(&["machine", "new", "blank", "--json"]).status.success());

    let timed = |name: &str| {
        let t = Instant::now();
        let out = world.laptop.boxd(&["machine", "remove", name, "-y", "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        t.elapsed()
    };
    let (blank, plugin) = (timed("blank"), timed("oc-w1"));
    assert!(plugin < blank + Duration::from_secs(1), "the plugin's machine took {plugin:?}, a blank one {blank:?}");
    assert_eq!(processes_of(&id), Vec::<u32>::new(), "no process of the machine survives its remove");
    assert!(!world.laptop.boxd_home.join("machines").join(&id).exists());
}

/// A killed process leaves boxd-local's scan as soon as its memory is let go, but it keeps
/// its working folder until its exit ends, and freeing 2 GiB takes a tenth of a second or
/// more. A remove that answered then moved the folder from under a process still in it (a
/// guest's OpenCode server was seen so after a failed tour, on a loaded machine): the
/// remove answers only once every process it killed has exited.
#[test]
fn a_remove_answers_only_once_every_process_it_killed_has_exited() {
    let laptop = Laptop::new("rmexit");
    assert!(laptop.boxd(&["machine", "new", "hog", "--json"]).status.success());
    let hog = laptop.scratch.0.join("hog.py");
    let program = "import os, time\nb = bytearray(b'x') * (2 << 30)\nopen('pid.tmp', 'w').write(str(os.getpid()))\nos.rename('pid.tmp', 'pid')\ntime.sleep(600)\n";
    std::fs::write(&hog, program).unwrap();
    let script = format!("setsid nohup python3 {} >/dev/null 2>&1 & while [ ! -e pid ]; do sleep 0.05; done; cat pid", hog.display());
    let out = laptop.boxd(&["machine", "exec", "hog", "--", "sh", "-c", &format!("'{script}'")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let out = laptop.boxd(&["machine", "remove", "hog", "-y", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Gone, or a zombie (whose folder and files are already let go) its reaper has not reaped.
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|s| s.rsplit(") ").next().and_then(|r| r.chars().next()));
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).map(|c| c.display().to_string()).unwrap_or_default();
    assert!(matches!(state, None | Some('Z' | 'X')), "the remove answered while its process {pid} was still exiting (state {state:?}) in {cwd}");
}
