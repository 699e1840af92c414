//! Confinement through a real guest: the probe component (tests/probe) asks the host for
//! unlisted programs and for paths outside its preopens, and every attempt is refused.

use std::os::unix::fs::symlink;
use std::path::Path;

use boxd_host::policy::Policy;

use crate::common::*;


#[test]
fn unlisted_programs_and_paths_are_refused_by_name() {
    let s = Scratch::new("probe-spawn");
    let mut policy = Policy::new();
    policy.program("boxd", Path::new("/bin/true")).unwrap();
    policy.preopen(&s.0, "project").unwrap();
    let rt = probe(policy);
    assert_eq!(ask(&rt, "spawn", "boxd"), "ok exit=Some(0)");
    for name in ["sh", "/bin/sh", "bash", "rm", "./boxd", "boxd/../sh", "BOXD"] {
        let answer = ask(&rt, "spawn", name);
        assert!(answer.starts_with("not-allowed: "), "{name}: {answer}");
    }
    // "opencode" is a plugin program, but this policy did not grant it.
    assert!(ask(&rt, "spawn", "opencode").contains("not found on this host"));
}

#[test]
fn paths_outside_the_preopens_are_refused() {
    let s = Scratch::new("probe-fs");
    let root = s.path("root");
    let outside = s.path("outside");
    std::fs::write(outside.join("secret.txt"), "secret").unwrap();
    std::fs::write(root.join("ok.txt"), "fine").unwrap();
    symlink(outside.join("secret.txt"), root.join("abs-link")).unwrap();
    symlink("../outside/secret.txt", root.join("rel-link")).unwrap();
    std::fs::create_dir(root.join("sub")).unwrap();
    symlink("../../outside", root.join("sub/dir-link")).unwrap();
    symlink(&outside, root.join("deep")).unwrap();

    let mut policy = Policy::new();
    policy.preopen(&root, "project").unwrap();
    let rt = probe(policy);
    let r = root.display().to_string();
    assert_eq!(ask(&rt, "preopens", ""), r, "exactly one preopen, at its own path");
    assert_eq!(ask(&rt, "read", &format!("{r}|ok.txt")), "ok 4 bytes");
    for path in [
        "../outside/secret.txt",
        "/etc/passwd",
        "abs-link",
        "rel-link",
        "sub/dir-link/secret.txt",
        "sub/../../outside/secret.txt",
    ] {
        let answer = ask(&rt, "read", &format!("{r}|{path}"));
        assert!(answer.starts_with("err "), "read {path}: {answer}");
    }
    // A symlink deep in a path that does not exist yet: the write must not land outside.
    for path in ["deep/new/file.txt", "deep/created.txt", "../outside/escape.txt"] {
        let answer = ask(&rt, "write", &format!("{r}|{path}"));
        assert!(answer.starts_with("err "), "write {path}: {answer}");
    }
    assert!(!outside.join("created.txt").exists() && !outside.join("escape.txt").exists());
    assert_eq!(std::fs::read_to_string(outside.join("secret.txt")).unwrap(), "secret");
    // A preopen the policy never granted does not exist for the guest.
    assert!(ask(&rt, "read", "/etc|passwd").starts_with("err no preopen"));
}

#[test]
fn spawn_timeout_kills_the_whole_process_group() {
    let s = Scratch::new("probe-timeout");
    let script = s.0.join("slow.sh");
    let marker = s.0.join("survivor");
    std::fs::write(&script, format!("#!/bin/sh\n(sleep 3; touch {}) &\nsleep 3\n", marker.display())).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let started = std::time::Instant::now();
    let out = boxd_host::spawn::run(boxd_host::spawn::Spawn {
        name: "slow.sh",
        binary: &script,
        args: &[],
        env: &[],
        cwd: None,
        stdin: None,
        timeout: std::time::Duration::from_millis(300),
        bounds: boxd_host::spawn::Bounds::default(),
    });
    assert!(matches!(out, Err(boxd_host::spawn::SpawnFailure::TimedOut)));
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    std::thread::sleep(std::time::Duration::from_millis(3300));
    assert!(!marker.exists(), "a grandchild survived the timeout");
}

/// A component built for another version of the world is refused at load, before
/// linking, with what to do about it (not "asks for an import this host does not grant").
#[test]
fn a_component_of_another_wit_version_is_refused_at_load_with_a_next_step() {
    let ours = boxd_host::runtime::wit_package();
    assert_eq!(ours, "boxd:plugin@0.1.0", "the host reads its version from wit/plugin.wit");
    // The same component, every name of the tools interface moved to 0.1.9 (same length,
    // so the binary stays valid).
    let mut wasm = std::fs::read(probe_wasm()).unwrap();
    let (from, to) = (b"boxd:plugin/tools@0.1.0", b"boxd:plugin/tools@0.1.9");
    let mut patched = 0;
    for i in 0..wasm.len().saturating_sub(from.len()) {
        if &wasm[i..i + from.len()] == from {
            wasm[i..i + to.len()].copy_from_slice(to);
            patched += 1;
        }
    }
    assert!(patched > 0);
    let err = boxd_host::runtime::Runtime::load(&wasm, boxd_host::policy::Policy::new(), None).err().expect("refused").to_string();
    assert!(err.contains("speaks boxd:plugin@0.1.9, this boxd-host speaks boxd:plugin@0.1.0"), "{err}");
    assert!(err.contains("leave out --component"), "{err}");
}
