//! Files stream (docs/architecture.md, "Files in and out"): 32 MiB in with boxd_submit and
//! out with boxd_harvest through `boxd-host call`, every byte intact, in submit's 2 and
//! harvest's 3 boxd round trips, with the host's peak RSS within 64 MiB.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::common::*;
use crate::guest::sha256;

/// The bound on the host's peak resident memory, whatever the size of the files.
const RSS_BOUND_KIB: u64 = 64 << 10;

/// `boxd-host call TOOL ARGS` as `world.call` runs it, sampling the process's VmHWM (its
/// peak RSS, which only grows) until it exits: (exit code, answer, peak KiB).
fn call_measured(world: &World, tool: &str, args: &str) -> (i32, serde_json::Value, u64) {
    let oc = opencode_bin();
    let path = format!("{}:{}", oc.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new(boxd_host());
    cmd.arg("--project").arg(&world.laptop.project).arg("--ledger").arg(&world.laptop.ledger).arg("--boxd").arg(boxd_local());
    cmd.args(["--opencode", oc.to_str().unwrap(), "call", tool, args]);
    cmd.env("BOXD_LOCAL_HOME", &world.laptop.boxd_home).env("BOXD_HOST_CACHE", cache_dir()).envs(world.laptop_env()).env("PATH", path);
    // Answers are small: a file, not a pipe, so the child never waits on us.
    let out = tempfile_in(&world.laptop.scratch.0, "answer");
    let mut child = cmd.stdin(Stdio::null()).stdout(std::fs::File::create(&out).unwrap()).stderr(Stdio::piped()).spawn().unwrap();
    let status = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    let code = loop {
        // A zombie has no memory left to report: the last sample before it stands.
        if let Some(hwm) = std::fs::read_to_string(&status).ok().and_then(|s| vm_hwm_kib(&s)) {
            peak = peak.max(hwm);
        }
        if let Some(st) = child.try_wait().unwrap() {
            break st.code().unwrap_or(-1);
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let text = std::fs::read_to_string(&out).unwrap();
    (code, serde_json::from_str(&text).unwrap_or(serde_json::Value::Null), peak)
}

fn tempfile_in(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    dir.join(format!("{name}-{}.json", std::process::id()))
}

fn vm_hwm_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// 3 × 8 MiB and 200 × 40 KiB (31.8 MiB, within the 32 MiB a call), each file its own bytes.
fn the_files() -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    for i in 0..3u8 {
        files.push((format!("big/b{i}.bin"), (0..8u32 << 20).map(|j| (j.wrapping_mul(31) as u8) ^ i).collect()));
    }
    for i in 0..200u32 {
        files.push((format!("small/s{i}.bin"), (0..40u32 << 10).map(|j| (j ^ i) as u8).collect()));
    }
    files
}

#[test]
fn thirty_two_mib_in_and_out_stream_in_constant_round_trips_and_bounded_memory() {
    let world = World::new("stream-32");
    world.ok_call("boxd_ensure", r#"{"work":"w1"}"#);
    let files = the_files();
    for (rel, bytes) in &files {
        let p = world.laptop.project.join("in").join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }

    // In: one submit, every file streamed onto the exec's stdin.
    let submit = json!({
        "work": "w1",
        "prompt": "files are there",
        "files": files.iter().map(|(rel, _)| json!({ "from": format!("in/{rel}"), "to": rel })).collect::<Vec<_>>(),
    });
    world.forget_calls();
    let (code, v, rss_in) = call_measured(&world, "boxd_submit", &submit.to_string());
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(world.laptop.boxd_calls().len(), 2, "submit is a get and an exec with any number of files: {:?}", world.laptop.boxd_calls());
    assert_eq!(v["files"].as_array().unwrap().len(), files.len());
    for ((rel, bytes), got) in files.iter().zip(v["files"].as_array().unwrap()) {
        assert_eq!((got["to"].as_str(), got["size"].as_u64(), got["sha256"].as_str()), (Some(rel.as_str()), Some(bytes.len() as u64), Some(sha256(bytes).as_str())));
    }
    // The guest has every byte: its own sha256sum of each, through boxd-local.
    let sums = world.on_machine("oc-w1", "cd work/w1 && find big small -type f | sort | xargs sha256sum");
    let sums = String::from_utf8_lossy(&sums.stdout).into_owned();
    for (rel, bytes) in &files {
        assert!(sums.contains(&format!("{}  {rel}", sha256(bytes))), "{rel} is not intact on the guest");
    }
    let v = world.job_until_idle("w1");
    assert_eq!(v["outcome"], "completed", "{v:#}");

    // Out: one harvest of the same files into a fresh folder.
    let harvest = json!({ "work": "w1", "files": files.iter().map(|(rel, _)| rel).collect::<Vec<_>>(), "to": "back" });
    world.forget_calls();
    let (code, v, rss_out) = call_measured(&world, "boxd_harvest", &harvest.to_string());
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(world.laptop.boxd_calls().len(), 3, "harvest is a get and two execs with any number of files: {:?}", world.laptop.boxd_calls());
    for (rel, bytes) in &files {
        assert!(std::fs::read(world.laptop.project.join("back").join(rel)).unwrap() == *bytes, "{rel} did not come home intact");
    }
    let left: Vec<_> = walk(&world.laptop.project.join("back")).into_iter().filter(|p| p.ends_with(".boxd-tmp")).collect();
    assert!(left.is_empty(), "temp files left behind: {left:?}");
    let ledger = std::fs::read_to_string(world.laptop.ledger.join("works/w1/work.json")).unwrap();
    let w: serde_json::Value = serde_json::from_str(&ledger).unwrap();
    assert_eq!((w["filesIn"].as_array().unwrap().len(), w["filesOut"].as_array().unwrap().len()), (files.len(), files.len()), "{ledger}");
    assert_eq!(w["owed"], json!([]));

    eprintln!("boxd-host peak RSS: 32 MiB in {} KiB, out {} KiB", rss_in, rss_out);
    for (what, kib) in [("in", rss_in), ("out", rss_out)] {
        assert!(kib > 0, "no VmHWM sample of the host ({what})");
        assert!(kib <= RSS_BOUND_KIB, "32 MiB {what}: the host peaked at {} MiB; the bound is 64 MiB", kib >> 10);
    }
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}
