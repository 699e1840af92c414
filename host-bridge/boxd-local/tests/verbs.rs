//! Every verb's output shape and failure text: auth, version, machine lifecycle, fork,
//! config, env, aliases, usage errors, sign-in, noise, and the not-a-VM help.

mod common;
use common::*;
use serde_json::Value;

const S: &str = "string";

#[test]
fn help_says_it_is_not_a_vm() {
    let h = Home::new("help");
    let r = h.ok(&["--help"]);
    assert!(r.out.contains("NOT A VM"), "{}", r.out);
    assert!(r.out.contains("no isolation"));
    assert!(h.ok(&["machine", "exec", "--help"]).out.contains("sh -c"));
    let noun = h.ok(&["machine", "--help"]).out;
    assert!(noun.contains("Usage: boxd machine") && noun.contains("\n  new "), "{noun}");
    // Every command has its own help, and help never needs a sign-in or touches state.
    h.ok(&["auth", "logout"]);
    for verb in [&["machine", "new"][..], &["machine", "config", "set"], &["snapshots", "save"], &["env", "set"], &["auth", "login"], &["version"]] {
        let r = h.ok(&[verb, &["--help"]].concat());
        assert!(r.out.contains(&format!("Usage: boxd {}", verb.join(" "))), "{verb:?}: {}", r.out);
    }
    assert!(h.ok(&["help", "machine", "exec"]).out.contains("sh -c"));
    for verb in ["get", "remove", "fork"] {
        assert!(h.ok(&["machine", verb, "--help"]).out.contains("not a VM"), "machine {verb} --help says it");
    }
}

#[test]
fn typos_get_a_suggestion_and_shells_get_completions() {
    let h = Home::new("typos");
    let r = h.run(&["machine", "lsit"]);
    assert_eq!(r.code, 1);
    assert!(r.err.lines().nth(1).is_some_and(|l| l.starts_with("hint: ") && l.contains("'list'")), "{}", r.err);
    let r = h.run(&["machine", "get", "a", "--jsno"]);
    assert!(r.err.contains("--json"), "a flag typo names the flag: {}", r.err);
    for shell in ["bash", "zsh", "fish"] {
        let script = h.ok(&["completions", shell]).out;
        assert!(script.contains("boxd-local") && script.contains("snapshots"), "{shell}: {script}");
    }
    assert_eq!(h.run(&["completions", "tcsh"]).code, 1, "an unknown shell is a usage error");
    assert!(!h.dir.join("state.json").exists(), "help and completions touch no state");
}

#[test]
fn auth_version_and_sign_in() {
    let h = Home::new("auth");
    assert_eq!(h.ok(&["version"]).out, "boxd 0.2.20-local\n");
    let who = h.json(&["auth"]);
    assert_shape(&who, &[("user_id", S), ("active_org", "null")]);
    assert!(who["user_id"].as_str().unwrap().starts_with("usr_local"));
    assert_eq!(h.json(&["whoami"]), who, "whoami is an alias and the id is stable");
    assert_eq!(h.json(&["auth", "--org", "acme"])["active_org"], "acme");

    h.ok(&["auth", "logout"]);
    assert_eq!(h.fails(&["auth", "--json"]), "error: not logged in");
    assert_eq!(h.fails(&["machine", "list"]), "error: not logged in");
    assert_eq!(h.fails(&["env", "list"]), "error: not logged in");
    h.ok(&["version"]);
    h.ok(&["--help"]);
    // A token counts as signed in, by flag or env.
    h.ok(&["machine", "list", "--token", "bxd_x"]);
    let r = h.cmd(&["machine", "list"]).env("BOXD_TOKEN", "bxd_x").output().unwrap();
    assert!(r.status.success());
    h.ok(&["login"]);
    assert_eq!(h.json(&["auth"]), who);
}

#[test]
fn new_list_get_remove_shapes() {
    let h = Home::new("shapes");
    let created = h.json(&["machine", "new", "box-1"]);
    assert_shape(&created, &[("name", S), ("id", S), ("url", S), ("source", S), ("boot", S)]);
    let id = created["id"].as_str().unwrap();
    assert!(id.starts_with("vm_") && id.len() == 19 && id[3..].chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    assert_eq!(created["url"], "box-1.boxd.sh");
    assert_eq!(created["source"], "standalone");
    assert!(created["boot"].as_str().unwrap().ends_with('s'));

    assert_eq!(h.fails(&["machine", "new", "box-1"]), "error: VM 'box-1' already exists");
    h.json(&["machine", "new", "box-2", "--shared", "--isolated", "--auto-suspend-timeout", "30"]);

    let list = h.json(&["machine", "list"]);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 2);
    for m in list {
        assert_shape(m, &[("name", S), ("status", S), ("url", S), ("source", S), ("sharing", S)]);
    }
    assert_eq!(list[0]["sharing"], "private");
    assert_eq!(list[1]["sharing"], "shared");
    let text = h.ok(&["machine", "list"]).out;
    let names: Vec<&str> = text.lines().map(|l| l.split_whitespace().next().unwrap()).collect();
    assert_eq!(names, ["box-1", "box-2"]);

    let got = h.json(&["machine", "get", "box-1"]);
    let fields = [
        "name", "id", "status", "url", "ssh", "public_ip", "domains", "source", "auto_suspend",
        "auto_hibernate", "sharing", "networks", "isolated",
    ];
    assert_shape(&got, &fields.map(|f| (f, S)));
    assert_eq!(got["id"], created["id"]);
    assert_eq!(got["status"], "running");
    assert_eq!(got["ssh"], "ssh box-1.boxd");
    assert_eq!(got["auto_suspend"], "off");
    assert_eq!(got["auto_hibernate"], "14400s");
    assert_eq!(got["isolated"], "no");
    let two = h.json(&["info", "box-2"]);
    assert_eq!((&two["isolated"], &two["sharing"], &two["auto_suspend"]), (&"yes".into(), &"shared".into(), &"30s".into()));

    assert_eq!(h.fails(&["machine", "get", "nope"]), "error: VM 'nope' not found");
    assert_eq!(
        h.fails(&["machine", "remove", "box-1"]),
        "error: refusing to remove 'box-1' without -y (non-interactive)"
    );
    let removed = h.json(&["machine", "remove", "box-1", "-y"]);
    assert_eq!(removed, serde_json::json!({"name": "box-1", "status": "destroyed"}));
    h.ok(&["rm", "box-2", "--confirm"]);
    assert_eq!(h.json(&["ls"]), Value::Array(vec![]));
    assert_eq!(h.fails(&["machine", "remove", "box-1", "-y"]), "error: VM 'box-1' not found");
    // A destroyed machine's name can be reused, with a new id.
    assert_ne!(h.json(&["new", "--name=box-1"])["id"], created["id"]);
}

#[test]
fn machine_names_are_dns_labels() {
    let h = Home::new("names");
    for bad in ["1box", "Box", "a_b", "-a", "a-", &"a".repeat(64), "a.b"] {
        let e = h.fails(&["machine", "new", "--", bad]);
        assert!(e.starts_with(&format!("error: invalid machine name '{bad}'")), "{e}");
    }
    h.ok(&["machine", "new", &"a".repeat(63)]);
    h.ok(&["machine", "new", "oc-w1-2"]);
}

#[test]
fn power_verbs() {
    let h = Home::new("power");
    h.ok(&["machine", "new", "p"]);
    let paused = h.json(&["machine", "pause", "p"]);
    assert_shape(&paused, &[("suspend_us", "number")]);
    assert_eq!(h.status("p"), "standby");
    assert_eq!(h.fails(&["pause", "p"]), "error: vm is 'standby' — must be running to pause");
    assert_shape(&h.json(&["resume", "p"]), &[("resume_us", "number")]);
    assert_eq!(h.fails(&["machine", "resume", "p"]), "error: vm is 'running' — must be in standby to resume");

    let hib = h.json(&["machine", "hibernate", "p"]);
    assert_eq!(hib, serde_json::json!({"name": "p", "status": "hibernated"}));
    assert!(h.fails(&["machine", "pause", "p"]).contains("'hibernated'"));
    assert_eq!(h.json(&["machine", "wake", "p"])["status"], "running");
    assert_eq!(h.json(&["machine", "stop", "p"]), serde_json::json!({"name": "p", "status": "stopped"}));
    assert!(h.fails(&["machine", "wake", "p"]).contains("machine start p"));
    assert_eq!(h.json(&["machine", "start", "p"])["status"], "running");
    assert_eq!(h.json(&["machine", "reboot", "p"])["status"], "running");
    assert_eq!(h.json(&["reboot", "p"])["status"], "running");
    assert_eq!(h.fails(&["machine", "start", "nope"]), "error: VM 'nope' not found");
}

#[test]
fn config_set_changes_idle_bounds() {
    let h = Home::new("config");
    h.ok(&["machine", "new", "c"]);
    h.ok(&["machine", "config", "set", "c", "auto-hibernate.timeout", "0"]);
    h.ok(&["machine", "config", "set", "c", "auto-suspend.timeout", "600"]);
    let got = h.json(&["machine", "get", "c"]);
    assert_eq!((got["auto_hibernate"].as_str(), got["auto_suspend"].as_str()), (Some("off"), Some("600s")));
    assert!(h.fails(&["machine", "config", "set", "c", "color", "3"]).contains("unknown config key"));
    assert!(h.fails(&["machine", "config", "set", "c", "auto-suspend.timeout", "soon"]).contains("invalid value"));
}

#[test]
fn fork_copies_home_and_settings() {
    let h = Home::new("fork");
    h.ok(&["machine", "new", "src", "--isolated", "--auto-hibernate-timeout", "99"]);
    h.ok(&["machine", "exec", "src", "--", "mkdir -p work && echo hello > work/f"]);
    let f = h.json(&["machine", "fork", "src"]);
    assert_shape(&f, &[("name", S), ("id", S), ("url", S), ("source", S), ("boot", S)]);
    assert_eq!(f["name"], "src-fork");
    assert!(f["boot"].as_str().unwrap().ends_with("ms"));
    let got = h.json(&["machine", "get", "src-fork"]);
    assert_eq!(got["source"], "fork/src");
    assert_eq!(got["isolated"], "yes");
    assert_eq!(got["auto_hibernate"], "99s");
    assert_eq!(got["sharing"], "private");
    assert_eq!(h.ok(&["exec", "src-fork", "--", "cat work/f"]).out, "hello\n");
    assert_eq!(h.fails(&["machine", "fork", "src"]), "error: VM 'src-fork' already exists");
    h.ok(&["fork", "src", "--name=other", "--shared"]);
    assert_eq!(h.json(&["machine", "get", "other"])["sharing"], "shared");
    // The copy is independent of its source.
    h.ok(&["exec", "other", "--", "echo changed > work/f"]);
    assert_eq!(h.ok(&["exec", "src", "--", "cat work/f"]).out, "hello\n");
}

#[test]
fn env_vars() {
    let h = Home::new("env");
    h.ok(&["env", "set", "API_URL", "https://x"]);
    h.ok(&["env", "set", "TOKEN", "s3cret", "--secret", "--scope", "private"]);
    let list = h.json(&["env", "list"]);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 2);
    for row in list {
        assert_shape(row, &[("name", S), ("value", S), ("scope", S)]);
    }
    assert_eq!(list[0], serde_json::json!({"name": "API_URL", "value": "https://x", "scope": "all"}));
    assert_eq!(list[1], serde_json::json!({"name": "TOKEN", "value": "(sealed)", "scope": "private"}));
    assert!(!h.ok(&["env", "ls"]).out.contains("s3cret"));
    assert!(h.fails(&["env", "set", "BOXD_X", "1"]).contains("reserved"));
    assert!(h.fails(&["env", "set", "1X", "1"]).contains("invalid env name"));
    assert!(h.fails(&["env", "set", "X", "1", "--scope", "world"]).contains("invalid scope"));
    h.ok(&["env", "scope", "API_URL", "shared"]);
    assert_eq!(h.json(&["env", "list"])[0]["scope"], "shared");
    h.ok(&["env", "rm", "API_URL"]);
    h.ok(&["env", "remove", "TOKEN"]);
    assert_eq!(h.json(&["env", "list"]), Value::Array(vec![]));
    assert_eq!(h.fails(&["env", "rm", "API_URL"]), "error: env var 'API_URL' not found");
}

#[test]
fn usage_errors_exit_1_with_a_hint() {
    let h = Home::new("usage");
    for args in [
        &["machine", "new", "x", "--bogus"][..],
        &["machine", "get"],
        &["machine", "get", "a", "b"],
        &["machine", "exec", "a"],
        &["frobnicate"],
        &["machine"],
        &["machine", "frob"],
        &["--version"],
        &[],
    ] {
        let r = h.run(args);
        assert_eq!(r.code, 1, "{args:?}");
        let lines: Vec<&str> = r.err.lines().collect();
        assert!(lines[0].starts_with("error: "), "{args:?}: {}", r.err);
        assert!(lines.len() == 2 && lines[1].starts_with("hint: "), "{args:?}: {}", r.err);
    }
}

#[test]
fn global_flags_anywhere() {
    let h = Home::new("globals");
    h.ok(&["--json", "machine", "new", "g"]);
    let v: Value = serde_json::from_str(&h.ok(&["--org", "o", "machine", "--api-url", "u", "list", "--json"]).out).unwrap();
    assert_eq!(v[0]["name"], "g");
    let v: Value = serde_json::from_str(&h.ok(&["--json", "info", "g"]).out).unwrap();
    assert_eq!(v["name"], "g");
}

#[test]
fn noise_precedes_json_when_switched_on() {
    let h = Home::new("noise");
    let out = h.cmd(&["machine", "list", "--json"]).env("BOXD_LOCAL_NOISE", "1").output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(stderr.starts_with("A new version of boxd is available (v0.2.21). Update with:"), "{stderr}");
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("(restarted client-utilities daemon)"));
    assert_eq!(lines.next(), Some("[]"));
    // Also from config.json; the env var wins when set.
    std::fs::write(h.dir.join("config.json"), r#"{"noise": true}"#).unwrap();
    assert!(h.ok(&["version", "--json"]).out.starts_with("(restarted"));
    let quiet = h.cmd(&["version", "--json"]).env("BOXD_LOCAL_NOISE", "0").output().unwrap();
    assert!(String::from_utf8_lossy(&quiet.stdout).starts_with('{'));
}
