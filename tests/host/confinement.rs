//! Confinement through a real guest: the probe component (tests/probe) asks the host for
//! unlisted programs, for granted programs with arguments no grant allows, and for paths
//! outside its preopens, and every attempt is refused.

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
    assert_eq!(ask(&rt, "spawn", &argv(&["boxd", "machine", "list", "--json"])), "ok exit=Some(0)");
    for name in ["sh", "/bin/sh", "bash", "rm", "./boxd", "boxd/../sh", "BOXD"] {
        let answer = ask(&rt, "spawn", name);
        assert!(answer.starts_with("not-allowed: "), "{name}: {answer}");
    }
    // "opencode" is a plugin program, but this policy did not grant it.
    assert!(ask(&rt, "spawn", "opencode").contains("not found on this host"));
}
/// The probe's spawn argument for an argument list, program first.
fn argv(words: &[&str]) -> String {
    serde_json::json!({ "argv": words }).to_string()
}

/// The calls issue 18 names as dangerous, each refused by boxd-host, naming the program,
/// the arguments and the nearest grant; the granted calls still run, and the audit trace
/// names the grant each matched. tests/opencode/policy_vectors.test.js makes the same
/// calls through the OpenCode bridge.
#[test]
fn the_dangerous_calls_are_refused_and_the_granted_ones_run() {
    let s = Scratch::new("probe-grants");
    let mut policy = Policy::new();
    policy.program("boxd", Path::new("/bin/true")).unwrap().program("opencode", Path::new("/bin/true")).unwrap();
    policy.preopen(&s.0, "project").unwrap();
    let rt = probe(policy);
    for (call, says) in [
        (&["opencode", "run", "rm -rf ~"][..], r#"opencode run "rm -rf ~": no grant of opencode starts with run; its grants: version, import, export"#),
        (&["opencode", "auth", "logout"], "opencode auth logout: no grant of opencode starts with auth"),
        (&["boxd", "auth", "logout"], "boxd auth logout: no grant allows these arguments; the nearest, boxd account, allows boxd auth --json"),
        (&["boxd", "machine", "remove", "web", "-y", "--json"], "boxd machine remove web -y --json: no grant allows these arguments; the nearest, boxd machine-remove, allows boxd machine remove oc-{name} -y --json"),
        (&["boxd", "env", "set", "OPENAI_API_KEY", "sk-x"], "boxd env set OPENAI_API_KEY sk-x: no grant allows these arguments; the nearest, boxd env-list, allows boxd env list --json"),
        (&["boxd", "api-keys", "create"], "boxd api-keys create: no grant of boxd starts with api-keys"),
        (&["boxd", "machine", "exec", "oc-w1", "--timeout", "60", "sh"], "the nearest, boxd machine-exec"),
        (&["boxd"], "boxd: no grant of boxd takes no arguments"),
    ] {
        let answer = ask(&rt, "spawn", &argv(call));
        assert!(answer.starts_with("not-allowed: ") && answer.contains(says), "{call:?}: {answer}");
    }
    for call in [&["boxd", "machine", "list", "--json"][..], &["boxd", "machine", "exec", "oc-w1", "--timeout", "60", "--", "sh", "-c", "'x'"], &["opencode", "--version"]] {
        assert_eq!(ask(&rt, "spawn", &argv(call)), "ok exit=Some(0)", "{call:?}");
    }
    // The audit log's trace: the grant each spawn matched, none for a refused one.
    let trace = |call: &[&str]| rt.call("spawn", &argv(call), &boxd_host::runtime::CallContext::default()).unwrap().1.spawns.remove(0);
    let ran = trace(&["boxd", "machine", "get", "oc-w1", "--json"]);
    assert_eq!((ran.grant.as_deref(), ran.outcome.as_str()), (Some("boxd machine-get"), "exited"));
    let refused = trace(&["boxd", "machine", "get", "w1", "--json"]);
    assert_eq!((refused.grant, refused.outcome.as_str()), (None, "not-allowed"));
}

/// `boxd-host audit` (and `--json`) carries each granted program's argument grants and
/// the variables its child may inherit.
#[test]
fn the_audit_prints_each_programs_grants_and_environment() {
    let mut policy = Policy::new();
    policy.program("boxd", Path::new("/bin/true")).unwrap().program("opencode", Path::new("/bin/true")).unwrap();
    let rt = probe(policy);
    let reach = boxd_host::audit::reach(&rt);
    let programs = reach["programs"].as_array().unwrap();
    let opencode = programs.iter().find(|p| p["name"] == "opencode").unwrap();
    assert_eq!(opencode["grants"], serde_json::json!([
        { "name": "version", "args": ["--version"] },
        { "name": "import", "args": ["import", "{path}"] },
        { "name": "export", "args": ["export", "ses_{id}"] },
    ]));
    let env = |p: &serde_json::Value| p["environment"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect::<Vec<_>>();
    assert!(env(opencode).contains(&"OPENCODE_DB".into()) && !env(opencode).contains(&"BOXD_TOKEN".into()));
    let boxd = programs.iter().find(|p| p["name"] == "boxd").unwrap();
    assert!(env(boxd).contains(&"BOXD_TOKEN".into()) && !env(boxd).contains(&"OPENCODE_DB".into()));
    assert!(programs.iter().all(|p| p["name"] != "git"), "a program not granted on this host is not listed");
    let text = boxd_host::audit::render(&reach);
    assert!(text.contains("machine-remove     boxd machine remove oc-{name} -y --json"), "{text}");
    assert!(text.contains("export             opencode export ses_{id}"), "{text}");
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
