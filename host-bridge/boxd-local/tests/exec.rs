//! `machine exec`: joined args run by sh, exit codes, stdin bytes, the session environment,
//! --timeout, --json, --tty, and what exec does in each power state.

mod common;
use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

#[test]
fn exit_codes_pass_through() {
    let h = Home::new("codes");
    h.ok(&["machine", "new", "e"]);
    assert_eq!(h.run(&["machine", "exec", "e", "--", "exit 42"]).code, 42);
    assert_eq!(h.run(&["machine", "exec", "e", "--", "no-such-command-xyz"]).code, 127);
    assert_eq!(h.run(&["exec", "e", "--", "true"]).code, 0);
    let r = h.run(&["machine", "exec", "e", "--", "echo out; echo err >&2; exit 3"]);
    assert_eq!((r.code, r.out.as_str(), r.err.as_str()), (3, "out\n", "err\n"), "streams kept apart");
}

#[test]
fn args_are_joined_and_run_by_sh() {
    let h = Home::new("quoting");
    h.ok(&["machine", "new", "q"]);
    // Joined with spaces, then word-split again by sh: the caller must quote.
    assert_eq!(h.ok(&["machine", "exec", "q", "--", "echo", "a   b"]).out, "a b\n");
    assert_eq!(h.ok(&["machine", "exec", "q", "--", "echo 'a   b'"]).out, "a   b\n");
    assert_eq!(h.ok(&["machine", "exec", "q", "--", "echo", "a", "&&", "echo", "b"]).out, "a\nb\n");
    assert_eq!(h.ok(&["machine", "exec", "q", "--", "echo $((6*7)) | tr 4 X"]).out, "X2\n");
    // Without `--`, the command starts after NAME; flags after `--` belong to it.
    assert_eq!(h.ok(&["exec", "q", "echo", "hi"]).out, "hi\n");
    assert_eq!(h.ok(&["machine", "exec", "q", "--", "echo", "--json"]).out, "--json\n");
}

#[test]
fn stdin_is_forwarded_byte_for_byte() {
    let h = Home::new("stdin");
    h.ok(&["machine", "new", "s"]);
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let r = h.run_in(&["machine", "exec", "s", "--", "cat"], &data);
    assert_eq!(r.code, 0);
    assert!(r.raw == data, "cat echoed {} bytes of {}", r.raw.len(), data.len());
    let r = h.run_in(&["machine", "exec", "s", "--", "cat > blob && wc -c < blob"], &data);
    assert_eq!(r.out.trim(), "300000");
    assert_eq!(std::fs::read(h.machine_home("s").join("blob")).unwrap(), data);
}

#[test]
fn session_environment() {
    let h = Home::new("env");
    h.ok(&["env", "set", "ACCOUNT_VAR", "acct"]);
    h.ok(&["env", "set", "SEALED", "shh", "--secret"]);
    h.ok(&["env", "set", "PROXIED", "real", "--secret", "--domains", "api.example.com"]);
    h.ok(&["env", "set", "OVERRIDE", "from-env"]);
    let m = h.json(&["machine", "new", "v"]);
    let home = h.machine_home("v");
    let r = h.ok(&["machine", "exec", "v", "-e", "OVERRIDE=from-e", "-e", "EXTRA=x=y", "--", "env"]);
    let env: std::collections::BTreeMap<&str, &str> = r.out.lines().filter_map(|l| l.split_once('=')).collect();
    assert_eq!(env["HOME"], home.to_str().unwrap());
    assert_eq!(env["USER"], "boxd");
    assert_eq!(env["LANG"], "C.UTF-8");
    // The machine's own /tmp: what its programs leave there goes with the machine.
    let tmp = home.parent().unwrap().join("tmp");
    assert_eq!(env["TMPDIR"], tmp.to_str().unwrap());
    assert!(tmp.is_dir());
    assert_eq!(env["BOXD_VM_NAME"], "v");
    assert_eq!(env["BOXD_VM_ID"], m["id"].as_str().unwrap());
    assert_eq!(env["BOXD_LOCAL_MACHINE"], m["id"].as_str().unwrap());
    assert!(env["PATH"].starts_with(&format!("{}/.local/bin:", home.display())));
    assert_eq!(env["ACCOUNT_VAR"], "acct");
    assert_eq!(env["SEALED"], "shh", "secrets reach sessions, sealed only in listings");
    assert!(env["PROXIED"].starts_with("bxds_") && env["PROXIED"].len() == 37, "{}", env["PROXIED"]);
    assert_eq!(env["OVERRIDE"], "from-e");
    assert_eq!(env["EXTRA"], "x=y");
    assert!(!env.contains_key("BOXD_LOCAL_HOME"), "clean environment");
    assert_eq!(h.ok(&["machine", "exec", "v", "--", "pwd"]).out.trim(), home.to_str().unwrap());
    assert!(h.fails(&["machine", "exec", "v", "-e", "NOEQUALS", "--", "true"]).contains("KEY=VALUE"));
}

#[test]
fn timeout_kills_and_exits_124() {
    let h = Home::new("timeout");
    h.ok(&["machine", "new", "t"]);
    let t0 = Instant::now();
    let r = h.run(&["machine", "exec", "t", "--timeout", "1", "--", "sleep 30; echo never"]);
    assert_eq!(r.code, 124, "{}", r.err);
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert!(r.err.contains("timed out"));
    assert!(!r.out.contains("never"));
    // The process group is gone, so nothing of the command is left running.
    h.ok(&["machine", "exec", "t", "--timeout", "0.5", "--", "true"]);
    let r = h.run(&["machine", "exec", "t", "--timeout", "0.3", "--json", "--", "echo started; sleep 30"]);
    assert_eq!(r.code, 124);
    let v: serde_json::Value = serde_json::from_str(&r.out).unwrap();
    assert_eq!((v["output"].as_str(), v["exit_code"].as_i64()), (Some("started\n"), Some(124)));
}

#[test]
fn json_and_tty_forms() {
    let h = Home::new("json");
    h.ok(&["machine", "new", "j"]);
    // (Not `h.json()`: it appends --json, which after the command words belongs to them.)
    let v: serde_json::Value = serde_json::from_str(&h.ok(&["machine", "exec", "--json", "j", "--", "echo hi"]).out).unwrap();
    assert_eq!(v, serde_json::json!({"output": "hi\n", "exit_code": 0}));
    // --json still exits with the remote code.
    let r = h.run(&["machine", "exec", "j", "--json", "--", "echo hi; echo err >&2; exit 5"]);
    assert_eq!(r.code, 5);
    let v: serde_json::Value = serde_json::from_str(&r.out).unwrap();
    assert_shape(&v, &[("output", "string"), ("exit_code", "number")]);
    assert_eq!((v["output"].as_str(), v["exit_code"].as_i64()), (Some("hi\n"), Some(5)));
    assert_eq!(r.err, "err\n", "stderr is not part of output");
    let r = h.ok(&["machine", "exec", "j", "--tty", "--", "echo a; echo b >&2"]);
    assert_eq!((r.out.as_str(), r.err.as_str()), ("a\nb\n", ""), "--tty merges stderr");
}

#[test]
fn exec_per_power_state() {
    let h = Home::new("states");
    h.ok(&["machine", "new", "w"]);
    h.ok(&["machine", "pause", "w"]);
    assert_eq!(h.ok(&["machine", "exec", "w", "--", "echo awake"]).out, "awake\n", "standby wakes");
    assert_eq!(h.status("w"), "running");
    h.ok(&["machine", "hibernate", "w"]);
    assert_eq!(
        h.fails(&["machine", "exec", "w", "--", "true"]),
        "error: VM 'w' is hibernated — run 'boxd machine wake w' first"
    );
    h.ok(&["machine", "stop", "w"]);
    assert_eq!(
        h.fails(&["machine", "exec", "w", "--", "true"]),
        "error: VM 'w' is stopped — run 'boxd machine start w' first"
    );
    assert_eq!(h.fails(&["machine", "exec", "gone", "--", "true"]), "error: VM 'gone' not found");
}

#[test]
fn concurrent_execs_run_side_by_side() {
    let h = Home::new("parallel-exec");
    h.ok(&["machine", "new", "c"]);
    let t0 = Instant::now();
    let children: Vec<_> = (0..4)
        .map(|i| {
            h.cmd(&["machine", "exec", "c", "--", &format!("sleep 1; echo {i}")])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (i, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{i}\n"));
    }
    assert!(t0.elapsed() < Duration::from_millis(3500), "execs were serialised: {:?}", t0.elapsed());
}

#[test]
fn a_machines_temporary_files_stay_in_it_and_go_with_it() {
    let h = Home::new("tmpdir");
    h.ok(&["machine", "new", "t"]);
    let machine = h.machine_home("t").parent().unwrap().to_path_buf();
    let r = h.ok(&["machine", "exec", "t", "--", "mktemp && python3 -c 'import tempfile; print(tempfile.gettempdir())'"]);
    let lines: Vec<&str> = r.out.lines().collect();
    assert!(lines[0].starts_with(machine.join("tmp/").to_str().unwrap()), "mktemp made {}", lines[0]);
    assert!(Path::new(lines[0]).is_file());
    assert_eq!(lines[1], machine.join("tmp").to_str().unwrap(), "Python's temp folder");
    // The machine's programs can reach its folder ($TMPDIR/..): whatever they leave in the
    // temporary folder's place is replaced by a folder, a symlink never followed.
    let outside = h.dir.join("outside");
    std::fs::create_dir(&outside).unwrap();
    for what in ["rm -rf \"$TMPDIR\" && touch \"$TMPDIR\"", &format!("rm -rf \"$TMPDIR\" && ln -s {} \"$TMPDIR\"", outside.display())] {
        h.ok(&["machine", "exec", "t", "--", what]);
        let made = h.ok(&["machine", "exec", "t", "--", "mktemp"]).out.trim().to_string();
        assert!(made.starts_with(machine.join("tmp/").to_str().unwrap()), "{what}: mktemp made {made}");
        assert!(std::fs::symlink_metadata(machine.join("tmp")).unwrap().is_dir(), "{what}");
    }
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing went through the symlink");
    // A power-off empties it, as a boot empties a real machine's /tmp; the home stays.
    for (verb, then) in [("reboot", None), ("stop", Some("start"))] {
        h.ok(&["machine", "exec", "t", "--", "touch \"$TMPDIR/left\" kept"]);
        h.ok(&["machine", verb, "t"]);
        if let Some(then) = then {
            h.ok(&["machine", then, "t"]);
        }
        assert!(!machine.join("tmp/left").exists(), "{verb} emptied the temporary folder");
        assert!(machine.join("home/kept").exists(), "{verb} kept the home");
        assert!(h.ok(&["machine", "exec", "t", "--", "mktemp"]).out.starts_with(machine.join("tmp/").to_str().unwrap()));
    }
    h.ok(&["machine", "remove", "t", "-y"]);
    assert!(!machine.exists() && !Path::new(lines[0]).exists(), "removed with the machine");
}
