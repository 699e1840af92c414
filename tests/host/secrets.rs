//! The secret scanner: through ensure → submit → job → harvest with the real guest, the
//! work's server password (`<ledger>/works/<id>/password`) appears nowhere but its own
//! file: not in the argv of any process on this computer (sampled from /proc during the
//! run, which covers boxd-local's machines too), the audit log, boxd-local's call log, the
//! host's stderr or stdout (lastText included), any other ledger file, or the laptop's
//! OpenCode data. By design it travels to the guest on stdin, which nothing here records.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::*;

const W1: &str = r#"{"work":"w1"}"#;

/// Samples every process's argv until stopped.
struct ArgvSampler {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<BTreeSet<String>>>,
    samples: Arc<Mutex<u64>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ArgvSampler {
    fn start() -> ArgvSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let samples = Arc::new(Mutex::new(0));
        let (s, n, c) = (stop.clone(), seen.clone(), samples.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let mut batch = Vec::new();
                if let Ok(dir) = std::fs::read_dir("/proc") {
                    for e in dir.flatten() {
                        if !e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
                            continue;
                        }
                        if let Ok(raw) = std::fs::read(e.path().join("cmdline")) {
                            if !raw.is_empty() {
                                batch.push(String::from_utf8_lossy(&raw).replace('\0', " "));
                            }
                        }
                    }
                }
                n.lock().unwrap().extend(batch);
                *c.lock().unwrap() += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        ArgvSampler { stop, seen, samples, thread: Some(thread) }
    }

    fn finish(mut self) -> (BTreeSet<String>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        let seen = std::mem::take(&mut *self.seen.lock().unwrap());
        let n = *self.samples.lock().unwrap();
        (seen, n)
    }
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            files_under(&e.path(), out);
        } else if t.is_file() && e.metadata().is_ok_and(|m| m.len() < 64 << 20) {
            out.push(e.path());
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn the_server_password_never_leaves_its_own_file() {
    let world = World::new("secrets");
    let audit = world.laptop.scratch.0.join("audit.jsonl");
    let flags = ["--audit-log", audit.to_str().unwrap()];
    let sampler = ArgvSampler::start();
    // Every byte the host printed, on either stream.
    let mut printed: Vec<(String, Vec<u8>)> = Vec::new();
    let mut call = |tool: &str, args: &str| -> serde_json::Value {
        let out = world.call_output(&flags, tool, args);
        printed.push((format!("{tool} stdout"), out.stdout.clone()));
        printed.push((format!("{tool} stderr"), out.stderr.clone()));
        assert_eq!(out.status.code(), Some(0), "{tool} {args}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        stdout_json(&out)
    };

    call("boxd_ensure", W1);
    std::fs::write(world.laptop.project.join("input.txt"), "some input\n").unwrap();
    let bash = json!({ "command": "cat input.txt > SUMMARY.md && echo done >> SUMMARY.md", "description": "summarise" });
    call("boxd_submit", &json!({ "work": "w1", "prompt": format!("summarise @@tool:bash:{bash}@@"), "files": [{ "from": "input.txt", "to": "input.txt" }] }).to_string());
    let deadline = Instant::now() + Duration::from_secs(120);
    let job = loop {
        let v = call("boxd_job", W1);
        if v["state"] != "busy" || Instant::now() > deadline {
            break v;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(job["outcome"], "completed", "{job:#}");
    assert!(job["lastText"].is_string(), "{job:#}");
    let v = call("boxd_harvest", &json!({ "work": "w1", "files": ["SUMMARY.md"] }).to_string());
    assert_eq!(v["proven"], true, "{v:#}");
    call("boxd_status", "{}");
    let (argv, samples) = sampler.finish();

    let password_file = world.laptop.ledger.join("works/w1/password");
    let password = std::fs::read_to_string(&password_file).unwrap().trim().to_string();
    assert!(password.len() >= 32, "a password of {} characters", password.len());
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&password_file).unwrap().permissions());
    assert_eq!(mode & 0o077, 0, "the password file is {:o}, readable beyond its owner", mode & 0o777);
    let pw = password.as_bytes();

    // The sampler saw the run (so its silence means something).
    assert!(samples > 10, "only {samples} samples of /proc");
    assert!(argv.iter().any(|a| a.contains("machine exec oc-w1")), "the sampler never saw a boxd exec: {} argv", argv.len());
    let leaked: Vec<&String> = argv.iter().filter(|a| a.contains(&password)).collect();
    assert!(leaked.is_empty(), "the password is in a process's argv: {leaked:?}");

    for (what, bytes) in &printed {
        assert!(!contains(bytes, pw), "the password is in the host's {what}");
    }
    let audit_text = std::fs::read(&audit).unwrap();
    assert!(!audit_text.is_empty(), "the audit log is empty");
    assert!(!contains(&audit_text, pw), "the password is in the audit log");
    let calls = std::fs::read(world.laptop.boxd_home.join("calls.jsonl")).unwrap();
    assert!(!calls.is_empty(), "boxd-local's call log is empty");
    assert!(!contains(&calls, pw), "the password is in boxd-local's call log");

    let mut files = Vec::new();
    files_under(&world.laptop.ledger, &mut files);
    files_under(&world.home, &mut files);
    files_under(&world.laptop.project, &mut files);
    assert!(files.len() > 3, "{files:?}");
    for f in &files {
        if *f == password_file {
            continue;
        }
        let bytes = std::fs::read(f).unwrap_or_default();
        assert!(!contains(&bytes, pw), "the password is in {}", f.display());
    }
}
