//! The newcomer's path: `boxd-host tour` end to end, and the golden-image builder's
//! download retries against boxd-local.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::common::*;
use crate::guest::sha256;

#[test]
fn the_tour_runs_every_step_and_brings_summary_home() {
    // The tour as an installed boxd-host runs it: a copy beside boxd-local, away from the
    // source tree, with the plugin from its npm tarball.
    let s = Scratch::new("tour");
    let host = crate::install::relocated(&s.0);
    let tarball = crate::install::packed_plugin(&s.path("pack"));
    let keep = s.0.join("kept");
    let out = crate::install::away_from_the_source(&host, &s.path("elsewhere"))
        .args(["--opencode", opencode_bin().to_str().unwrap(), "tour", "--keep", keep.to_str().unwrap(), "--plugin", tarball.to_str().unwrap()])
        .env("BOXD_HOST_CACHE", cache_dir())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["tour"], "ok");
    let steps: Vec<&str> = last["steps"].as_array().unwrap().iter().map(|s| s["step"].as_str().unwrap()).collect();
    assert_eq!(steps, ["golden", "boxd_status", "boxd_ensure", "boxd_submit", "boxd_job", "boxd_harvest", "boxd_drop"]);
    assert!(last["steps"].as_array().unwrap().iter().all(|s| s["ok"] == true));
    assert_eq!(last["work"], "tour");
    assert_eq!(last["machine"], "oc-tour");
    // What the tour's guest writes for host-bridge/tour/bookmarks.json, spelled out here.
    let summary = "# Bookmarks\n\n- boxd <https://boxd.sh>\n- OpenCode <https://opencode.ai>\n- WASI <https://wasi.dev>\n";
    let expected = sha256(summary.as_bytes());
    assert_eq!(last["files"][0]["path"], "SUMMARY.md");
    assert_eq!(last["files"][0]["sha256"], expected.as_str());
    assert_eq!(std::fs::read_to_string(keep.join("project/SUMMARY.md")).unwrap(), summary);
    // The machine is gone at the end, and the audit was printed.
    let list = std::process::Command::new(boxd_local()).args(["machine", "list", "--json"]).env("BOXD_LOCAL_HOME", keep.join("boxd-local")).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&list.stdout).trim(), "[]");
    assert!(stdout.contains("boxd:plugin/spawn@0.1.0") && stdout.contains("programs it may run"));
    assert!(keep.join("audit.jsonl").exists() && keep.join("ledger/works/tour/work.json").exists());
    assert!(stdout.contains(&format!("audit log: {}", keep.join("audit.jsonl").display())), "the kept audit log is named");

    // The one command it printed opens OpenCode in the kept project: run it as printed,
    // with `run` for one non-interactive prompt the scripted model turns into boxd_status.
    let lines: Vec<&str> = stdout.lines().collect();
    let at = lines.iter().position(|l| l.starts_with("Open OpenCode there")).expect("the tour prints how to open OpenCode");
    let command = lines[at + 1];
    let answer = opencode_run(&s.path("elsewhere"), &format!("{command} run --format json '@@tool:boxd_status:{{}}@@'"));
    assert_eq!(answer["boxd"]["cli"], "signed in", "{answer}");
    assert_eq!(answer["host"]["name"], "opencode", "{answer}");
    // The tour's golden image, in the kept boxd-local: this OpenCode talks to that project's boxd.
    assert_eq!((answer["snapshot"]["name"].as_str(), answer["snapshot"]["present"].as_bool()), (Some("opencode-golden"), Some(true)), "{answer}");
    // The plugin OpenCode loaded is the tarball's copy in the kept folder, installed into its own cache.
    let spec = format!("opencode-boxd@file:{}", keep.join(tarball.file_name().unwrap()).display());
    assert!(keep.join("laptop/cache/opencode/packages").join(spec).join("node_modules/opencode-boxd/dist/worker.js").exists());
    // Its temporary folder is the kept folder's too (OpenCode leaves files there).
    assert!(keep.join("laptop/tmp").is_dir());
}

/// `sh -c LINE` (an `opencode run --format json` through the tour's script), bounded;
/// the boxd_status answer among the events it printed.
fn opencode_run(cwd: &std::path::Path, line: &str) -> serde_json::Value {
    use std::os::unix::process::CommandExt;
    let mut child = std::process::Command::new("sh")
        .args(["-c", line])
        .current_dir(cwd)
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let read = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = r.read_to_string(&mut text);
            text
        })
    };
    let (out, err) = (read(Box::new(stdout)), read(Box::new(stderr)));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            // The whole group: the script, opencode and the scripted model it started.
            let _ = std::process::Command::new("kill").args(["-KILL", &format!("-{}", child.id())]).status();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    let part = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|e| e["type"] == "tool_use" && e["part"]["tool"] == "boxd_status")
        .unwrap_or_else(|| panic!("no boxd_status call in the output of {line}:\n{out}\n{err}"));
    assert_eq!(part["part"]["state"]["status"], "completed", "{part}");
    serde_json::from_str(part["part"]["state"]["output"].as_str().unwrap()).unwrap()
}

#[test]
fn the_tour_keeps_nothing_in_a_folder_that_is_not_empty() {
    let s = Scratch::new("tour-keep");
    let mine = s.path("mine");
    std::fs::write(mine.join("notes.md"), "mine\n").unwrap();
    let tour = |args: &[&str]| std::process::Command::new(boxd_host()).arg("tour").args(args).env("BOXD_HOST_CACHE", cache_dir()).output().unwrap();
    let out = tour(&["--keep", mine.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not empty"), "{}", String::from_utf8_lossy(&out.stderr));
    let left: Vec<_> = std::fs::read_dir(&mine).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["notes.md"]);
    assert_eq!(std::fs::read_to_string(mine.join("notes.md")).unwrap(), "mine\n");
    // A plugin path that is not there is refused before the tour starts, and nothing is made.
    let fresh = s.0.join("fresh");
    let out = tour(&["--keep", fresh.to_str().unwrap(), "--plugin", "/nowhere/opencode-boxd-0.1.0.tgz"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such file or folder"), "{}", String::from_utf8_lossy(&out.stderr));
    // So is a file that is not a tarball npm pack made.
    std::fs::write(s.0.join("notes.tgz"), "not gzip").unwrap();
    let out = tour(&["--keep", fresh.to_str().unwrap(), "--plugin", s.0.join("notes.tgz").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a tarball"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!fresh.exists());
}

/// A release server that fails `failures` times (503), then serves `body`.
fn flaky_server(failures: u32, body: Vec<u8>) -> (String, Arc<AtomicU32>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicU32::new(0));
    let counter = hits.clone();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let mut buf = [0u8; 2048];
            let _ = s.read(&mut buf);
            let n = counter.fetch_add(1, Ordering::SeqCst);
            if n < failures {
                let _ = s.write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            } else {
                let _ = write!(s, "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
                let _ = s.write_all(&body);
            }
        }
    });
    (format!("http://127.0.0.1:{port}/v{{version}}/opencode-{{target}}.tar.gz"), hits)
}

/// The tour's stand-in release archive: an `opencode` that runs the pinned one.
fn archive(dir: &std::path::Path) -> Vec<u8> {
    let oc = std::fs::canonicalize(opencode_bin()).unwrap();
    std::fs::read(boxd_host::commands::tour::make_archive(dir, &oc).unwrap()).unwrap()
}

/// `boxd-host golden` against boxd-local with the release at `url`; its JSON answer, its
/// stderr (the steps) and the audit log's lines.
fn golden(laptop: &Laptop, url: &str, extra: &[&str]) -> (Option<i32>, serde_json::Value, String, Vec<serde_json::Value>) {
    let audit = laptop.scratch.0.join("audit.jsonl");
    let mut args = vec!["--audit-log", audit.to_str().unwrap(), "golden", "--opencode-version", "1.18.33", "--model", "scripted/scripted-model", "--url", url, "--retry-delay", "0"];
    args.extend_from_slice(extra);
    let out = laptop.host(&args);
    let answer = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)));
    let log = std::fs::read_to_string(&audit).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    (out.status.code(), answer, String::from_utf8_lossy(&out.stderr).into(), log)
}

#[test]
fn golden_retries_a_failing_download_then_snapshots() {
    let laptop = Laptop::new("golden-retry");
    let (url, hits) = flaky_server(2, archive(&laptop.scratch.0));
    let (code, report, steps, audit) = golden(&laptop, &url, &[]);
    assert_eq!(code, Some(0), "{report}\n{steps}");
    assert_eq!(hits.load(Ordering::SeqCst), 3, "two failures, then the download");
    assert_eq!(report["buildMachineRemoved"], true);
    assert!(report["install"].as_str().unwrap().contains("after 3 attempt(s)"));
    assert!(steps.contains("golden: saving snapshot opencode-golden"), "{steps}");
    let snaps = String::from_utf8(laptop.boxd(&["snapshots", "list", "--json"]).stdout).unwrap();
    assert!(snaps.contains("\"opencode-golden\""));
    // No side door: every boxd call of the build went through the policy into the audit log.
    assert_eq!(audit.len(), 1);
    let verbs: Vec<String> = audit[0]["spawns"].as_array().unwrap().iter().map(|s| format!("{} {} {}", s["program"].as_str().unwrap(), s["args"][0].as_str().unwrap(), s["args"][1].as_str().unwrap())).collect();
    // The name is looked at again just before the save: someone may have taken it during the install.
    assert_eq!(verbs, ["boxd snapshots list", "boxd machine new", "boxd machine exec", "boxd snapshots list", "boxd snapshots save", "boxd machine remove"]);
    assert_eq!(audit[0]["tool"], "golden");
    // The config was written into the image, and the binary answers with the version.
    let m = laptop.boxd(&["machine", "new", "check", "--from-snapshot", "opencode-golden", "--json"]);
    assert!(m.status.success());
    let v = laptop.boxd(&["machine", "exec", "check", "--", "sh", "-c", "'cat .config/opencode/opencode.json && .local/bin/opencode --version'"]);
    let text = String::from_utf8_lossy(&v.stdout);
    assert!(text.contains("scripted/scripted-model") && text.trim_end().ends_with("1.18.33"), "{text}");
    let _ = laptop.boxd(&["machine", "remove", "check", "-y"]);
    // Built once, the name is taken: a second build is refused before any machine is made.
    let (code, e, _, audit) = golden(&laptop, &url, &[]);
    assert_eq!((code, e["error"].as_str()), (Some(1), Some("SNAPSHOT_EXISTS")), "{e}");
    assert_eq!(audit[1]["spawns"].as_array().unwrap().len(), 1, "only the snapshot listing");
}

#[test]
fn golden_fails_loudly_with_no_snapshot_and_no_build_machine_left() {
    let laptop = Laptop::new("golden-fail");
    let (url, hits) = flaky_server(u32::MAX, vec![]);
    let (code, e, _, _) = golden(&laptop, &url, &[]);
    assert_eq!((code, e["error"].as_str()), (Some(1), Some("GOLDEN_FAILED")), "{e}");
    assert!(e["message"].as_str().unwrap().contains("download failed after 3 attempts"), "{e}");
    assert!(e["next"].as_str().unwrap().contains("no snapshot was saved"), "{e}");
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    assert_eq!(String::from_utf8_lossy(&laptop.boxd(&["snapshots", "list", "--json"]).stdout).trim(), "[]");
    assert_eq!(String::from_utf8_lossy(&laptop.boxd(&["machine", "list", "--json"]).stdout).trim(), "[]");
}

/// A host killed mid-build leaves its build machine (it bills until removed). The build
/// recorded it in the ledger before asking boxd, so a later build removes it once that
/// build is certainly over, and leaves alone one that may still be running.
#[test]
fn a_killed_golden_build_leaves_a_machine_the_next_build_removes() {
    let laptop = Laptop::new("golden-killed");
    let (url, _) = flaky_server(0, archive(&laptop.scratch.0));
    let machines = || -> Vec<String> {
        let v: serde_json::Value = serde_json::from_slice(&laptop.boxd(&["machine", "list", "--json"]).stdout).unwrap();
        v.as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap().to_string()).collect()
    };
    // Killed right after `machine new` answered (spawns: snapshots list, machine new).
    let args = ["golden", "--opencode-version", "1.18.33", "--url", url.as_str(), "--retry-delay", "0", "--name", "first"];
    let killed = laptop.host_with(&args, &[("BOXD_HOST_KILL_AT", "after-spawn:2")]);
    assert_eq!(killed.status.code(), None, "killed by the signal");
    let left = machines();
    assert!(left.len() == 1 && left[0].starts_with("golden-build-"), "{left:?}");
    let record = laptop.ledger.join("golden-builds").join(format!("{}.json", left[0]));
    assert!(record.exists());
    let status = |laptop: &Laptop| -> serde_json::Value { serde_json::from_slice(&laptop.host(&["call", "boxd_status", "{}"]).stdout).unwrap() };
    assert_eq!(status(&laptop)["buildMachinesLeft"]["machines"][0]["machine"], left[0].as_str(), "boxd_status shows what bills");

    // Moments later its build may, as far as anyone can tell, still be running: left alone.
    let (code, report, _, _) = golden(&laptop, &url, &["--name", "second"]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["earlierBuildMachines"][0]["machine"], left[0].as_str());
    assert!(report["earlierBuildMachines"][0]["outcome"].as_str().unwrap().starts_with("left alone"), "{report}");
    assert_eq!(machines(), left, "only the killed build's machine; the second build removed its own");

    // A day later (the record says so) the next build removes it, and forgets it.
    let text = std::fs::read_to_string(&record).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["startedAtMs"] = serde_json::json!(v["startedAtMs"].as_u64().unwrap() - 86_400_000);
    std::fs::write(&record, v.to_string()).unwrap();
    let (code, report, _, _) = golden(&laptop, &url, &["--name", "third"]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["earlierBuildMachines"][0]["outcome"], "removed", "{report}");
    assert!(machines().is_empty(), "{:?}", machines());
    assert!(!record.exists());
    assert!(status(&laptop).get("buildMachinesLeft").is_none());
    let snaps = String::from_utf8(laptop.boxd(&["snapshots", "list", "--json"]).stdout).unwrap();
    assert!(snaps.contains("\"second\"") && snaps.contains("\"third\"") && !snaps.contains("\"first\""), "{snaps}");
}

/// The names of the machines boxd-local holds.
fn machine_names(laptop: &Laptop) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_slice(&laptop.boxd(&["machine", "list", "--json"]).stdout).unwrap();
    v.as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap().to_string()).collect()
}

/// The version boxd-local lists for snapshot `name`.
fn listed_version(laptop: &Laptop, name: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_slice(&laptop.boxd(&["snapshots", "list", "--json"]).stdout).unwrap();
    v.as_array().unwrap().iter().find(|s| s["name"] == name).map(|s| s["version"].clone()).unwrap_or_default()
}

/// A save that lands and then answers a failure (boxd failing after it acted) is looked
/// for once: listed ready at v1 under a name that was free just before, it is the build's
/// snapshot, and the build machine is removed. Before: BOXD_FAILED, and a rebuild under
/// the name was SNAPSHOT_EXISTS.
#[test]
fn a_golden_save_that_landed_then_failed_is_the_builds_snapshot() {
    let laptop = Laptop::new("golden-save-failed");
    let (url, _) = flaky_server(0, archive(&laptop.scratch.0));
    std::fs::create_dir_all(&laptop.boxd_home).unwrap();
    std::fs::write(laptop.boxd_home.join("faults.json"), r#"[{"verb":"snapshots save","times":1,"action":"fail","land":true,"message":"internal"}]"#).unwrap();
    let (code, report, steps, _) = golden(&laptop, &url, &["--name", "gold3"]);
    assert_eq!(code, Some(0), "{report}\n{steps}");
    assert_eq!(report["buildMachineRemoved"], true, "{report}");
    assert!(report["steps"].to_string().contains("answered a failure"), "{report}");
    assert_eq!(listed_version(&laptop, "gold3"), "v1");
    assert!(machine_names(&laptop).is_empty(), "{:?}", machine_names(&laptop));
}

/// Someone saves a snapshot under the build's name after its second look at the name and
/// before its save (that look lists at once and answers 3 s late): the build's save becomes
/// v2 of their snapshot. The answer is SNAPSHOT_EXISTS naming the version added, the build
/// machine is removed. Before: the build answered success.
#[test]
fn a_golden_build_whose_name_is_taken_before_its_save_says_what_it_added() {
    let laptop = Laptop::new("golden-name-race");
    let (url, _) = flaky_server(0, archive(&laptop.scratch.0));
    assert!(laptop.boxd(&["machine", "new", "someone-else", "--json"]).status.success());
    std::fs::write(
        laptop.boxd_home.join("faults.json"),
        r#"[{"verb":"snapshots list","times":1,"action":"delay","ms":0},{"verb":"snapshots list","times":1,"action":"delay","ms":3000,"land":true}]"#,
    )
    .unwrap();
    let installed = || laptop.boxd_calls().iter().any(|c| c.first().is_some_and(|v| v == "machine") && c.get(1).is_some_and(|v| v == "exec"));
    let (code, e, steps, _) = std::thread::scope(|s| {
        let build = s.spawn(|| golden(&laptop, &url, &["--name", "gold"]));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while !installed() {
            assert!(std::time::Instant::now() < deadline, "the install never ended");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // Its second look has listed (it does at once) and now waits before answering.
        until_running_in(&laptop.boxd_home, &["snapshots", "list"]);
        std::thread::sleep(std::time::Duration::from_millis(300));
        let theirs = laptop.boxd(&["snapshots", "save", "someone-else", "gold"]);
        assert!(theirs.status.success(), "{}", String::from_utf8_lossy(&theirs.stderr));
        build.join().unwrap()
    });
    assert_eq!((code, e["error"].as_str()), (Some(1), Some("SNAPSHOT_EXISTS")), "{e}\n{steps}");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("added version v2") && message.contains("someone else"), "{e}");
    assert_eq!(listed_version(&laptop, "gold"), "v2");
    assert_eq!(machine_names(&laptop), ["someone-else"], "the build machine was removed");
}

#[test]
fn golden_refuses_a_literal_key_and_a_missing_env_name_before_any_machine() {
    let laptop = Laptop::new("golden-refuse");
    let config = laptop.scratch.0.join("guest.json");
    std::fs::write(&config, r#"{"provider":{"p":{"options":{"apiKey":"sk-live-123"}}}}"#).unwrap();
    let out = laptop.host(&["golden", "--opencode-version", "1.18.33", "--config", config.to_str().unwrap()]);
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((out.status.code(), e["error"].as_str()), (Some(1), Some("ARGS_INVALID")), "{e}");
    assert!(!e.to_string().contains("sk-live-123"), "the key is never echoed");
    let (code, e, _, _) = golden(&laptop, "http://127.0.0.1:9/x", &["--key-env", "NOT_SET_ANYWHERE"]);
    assert_eq!((code, e["error"].as_str()), (Some(1), Some("GOLDEN_FAILED")), "{e}");
    assert!(e["next"].as_str().unwrap().contains("boxd env set NOT_SET_ANYWHERE"), "{e}");
    assert_eq!(String::from_utf8_lossy(&laptop.boxd(&["machine", "list", "--json"]).stdout).trim(), "[]");
}

/// A tour whose submit fails (a boxd that refuses the guest's submit) removes its machine
/// before its folder goes: a boxd-local machine's processes (the guest's OpenCode server)
/// would outlive the folder, running with nothing left to reach them.
#[test]
fn a_failed_tour_removes_its_machine_and_leaves_no_process() {
    let s = Scratch::new("tour-fails");
    let tmp = s.path("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let boxd = s.0.join("boxd");
    std::fs::write(&boxd, format!("#!/bin/sh\ncase \"$*\" in *' submit --work'*) echo 'error: injected by the test' >&2; exit 1;; esac\nexec '{}' \"$@\"\n", boxd_local().display())).unwrap();
    std::fs::set_permissions(&boxd, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = std::process::Command::new(boxd_host())
        .args(["--opencode", opencode_bin().to_str().unwrap(), "--boxd", boxd.to_str().unwrap(), "tour"])
        .env("TMPDIR", &tmp)
        .env("BOXD_HOST_CACHE", cache_dir())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["tour"], "failed", "{stdout}");
    assert!(last["steps"].as_array().unwrap().iter().any(|s| s["step"] == "boxd_submit" && s["ok"] == false), "{last}");
    assert!(stdout.contains("removed the tour's machine oc-tour"), "{stdout}");
    assert!(stdout.contains("the audit log goes with the tour's folder") && !stdout.contains("audit.jsonl"), "no path that is gone is printed: {stdout}");
    // The tour's folder is gone, and no process runs from it.
    let left: Vec<String> = std::fs::read_dir(&tmp).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with("boxd-tour-")).collect();
    assert!(left.is_empty(), "the tour removed its folder: {left:?}");
    let tmp = tmp.display().to_string();
    for p in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = std::fs::read(p.path().join("cmdline")) else { continue };
        let cwd = std::fs::read_link(p.path().join("cwd")).map(|c| c.display().to_string()).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&cmd).contains(&tmp) && !cwd.starts_with(&tmp), "a process outlived the tour: {} {}", String::from_utf8_lossy(&cmd).replace('\0', " "), cwd);
    }
}
