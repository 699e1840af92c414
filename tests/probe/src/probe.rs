//! The probe's tools. `call(tool, arg)` runs one attempt and returns what the host said:
//!   spawn     arg = {"argv":[program, args…]}, or else the whole text is a program name
//!                                         → "ok exit=N" | "not-allowed: …" | …
//!   spawn-all arg = {"argvs":[[program, args…], …]}: one `run-all`; one answer line per
//!             request, in request order, each as `spawn` says it
//!   read      arg = "<preopen>|<path>"    → "ok N bytes" | "err <code>"
//!   write     arg = "<preopen>|<path>"    → "ok" | "err <code>"
//!   read-all  arg = "<preopen>|<path>|<chunk>": opened as `read-nofollow`, then read
//!             `chunk` bytes at a time until a read says it is the end or returns nothing
//!                                         → "ok N bytes in K reads, sum S" | "err <code>"
//!   list      arg = "<preopen>|<path>" ("" for the preopen itself): its listing, one
//!             "name type" line per entry in the order the host gives, "err <code>" for
//!             an entry the host answers with an error
//!   preopens  → the preopen names, one per line
//!   trap      → traps (the panic handler's `unreachable`), as a bug in a component would;
//!               `boxd_status` too (the conformance scenario's trap in the status tool)
//!   oom       → allocates until memory runs out (a trap), as hostile input might make it

extern crate alloc;

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

wit_bindgen::generate!({ world: "plugin", path: "../../wit", generate_all });

use boxd::plugin::spawn;
use exports::boxd::plugin::tools::{Context, Guest, ToolError};
use wasi::filesystem::preopens::get_directories;
use wasi::filesystem::types::{DescriptorFlags, OpenFlags, PathFlags};

struct Probe;

fn fail(m: String) -> ToolError {
    ToolError { code: "PROBE".into(), message: m, next: String::new() }
}

fn request(program: String, args: Vec<String>) -> spawn::Request {
    spawn::Request { program, args, stdin: None, env: Vec::new(), cwd: None, timeout_ms: 5000, stdin_files: Vec::new(), stdout_files: Vec::new(), stdout_modes_from: Vec::new() }
}

fn said(r: Result<spawn::Output, spawn::Error>) -> String {
    match r {
        Ok(o) => format!("ok exit={:?}", o.exit_code),
        Err(spawn::Error::NotAllowed(m)) => format!("not-allowed: {m}"),
        Err(spawn::Error::NotFound(m)) => format!("not-found: {m}"),
        Err(spawn::Error::TimedOut) => "timed-out".into(),
        Err(spawn::Error::Failed(m)) => format!("failed: {m}"),
    }
}

impl Guest for Probe {
    fn describe() -> String {
        // Hosts that offer only described tools (the OpenCode bridge) need these; the
        // status tool's name traps, so every host's answer to a trap in it can be compared.
        // The world version, as the real component reports it: from wit/plugin.wit.
        let wit = include_str!("../../../wit/plugin.wit").lines().find_map(|l| l.trim().strip_prefix("package ")).unwrap_or("").trim_end_matches(';');
        format!(
            r#"{{"plugin":"boxd-probe","wit":"{wit}","tools":[
            {{"name":"spawn","access":"read","description":"spawn argv (program first), or the program named by the argument text","inputSchema":{{"type":"object"}}}},
            {{"name":"spawn-all","access":"read","description":"spawn each argv of argvs side by side (run-all)","inputSchema":{{"type":"object"}}}},
            {{"name":"boxd_status","access":"read","description":"traps","inputSchema":{{"type":"object"}}}}]}}"#
        )
    }

    fn call(tool: String, arg: String, _ctx: Context) -> Result<String, ToolError> {
        match tool.as_str() {
            "spawn" => {
                // {"argv":[…]} from a test; any other text (the conformance scenario's `{}`)
                // is one program name without arguments, as the probe always took it.
                let parsed = serde_json::from_str::<serde_json::Value>(&arg).ok();
                let argv = parsed.as_ref().and_then(|v| v.get("argv")?.as_array()?.iter().map(|a| a.as_str().map(String::from)).collect::<Option<Vec<String>>>());
                // {"failWith": CODE}: a child killed by a signal is that tool error, as the
                // real component answers a guest or boxd CLI that died under it.
                let fail_with = parsed.as_ref().and_then(|v| v.get("failWith")?.as_str().map(String::from));
                let (program, args) = match argv {
                    Some(mut argv) if !argv.is_empty() => (argv.remove(0), argv),
                    _ => (arg, Vec::new()),
                };
                match (spawn::run(&request(program, args)), fail_with) {
                    (Ok(o), Some(code)) if o.exit_code.is_none() => Err(ToolError { code, message: "the child was killed by a signal".into(), next: "probe".into() }),
                    (r, _) => Ok(said(r)),
                }
            }
            "spawn-all" => {
                let argvs = serde_json::from_str::<serde_json::Value>(&arg).ok().and_then(|v| {
                    v.get("argvs")?
                        .as_array()?
                        .iter()
                        .map(|a| a.as_array()?.iter().map(|w| w.as_str().map(String::from)).collect::<Option<Vec<String>>>())
                        .collect::<Option<Vec<Vec<String>>>>()
                });
                let Some(argvs) = argvs.filter(|a| a.iter().all(|argv| !argv.is_empty())) else {
                    return Err(fail("arg is {\"argvs\":[[program, args…], …]}".into()));
                };
                let requests: Vec<spawn::Request> = argvs.into_iter().map(|mut argv| { let p = argv.remove(0); request(p, argv) }).collect();
                Ok(spawn::run_all(&requests).into_iter().map(said).collect::<Vec<_>>().join("\n"))
            }
            // How many calls this instance has answered: 1 in a fresh instance.
            "calls" => {
                static CALLS: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);
                Ok(format!("{}", CALLS.fetch_add(1, core::sync::atomic::Ordering::Relaxed) + 1))
            }
            "preopens" => Ok(get_directories().into_iter().map(|(_, n)| n).collect::<Vec<_>>().join("\n")),
            "read" | "read-nofollow" | "write" => {
                let (root, path) = arg.split_once('|').ok_or_else(|| fail("arg is <preopen>|<path>".into()))?;
                let dirs = get_directories();
                let Some((dir, _)) = dirs.iter().find(|(_, n)| n == root) else {
                    return Ok(format!("err no preopen {root}"));
                };
                let (oflags, dflags) = if tool == "write" {
                    (OpenFlags::CREATE | OpenFlags::TRUNCATE, DescriptorFlags::WRITE)
                } else {
                    (OpenFlags::empty(), DescriptorFlags::READ)
                };
                // Follow symlinks here on purpose: the host must still keep us inside.
                // read-nofollow opens as the real component reads a file: no flag but READ.
                let follow = if tool == "read-nofollow" { PathFlags::empty() } else { PathFlags::SYMLINK_FOLLOW };
                match dir.open_at(follow, path, oflags, dflags) {
                    Ok(fd) if tool == "write" => match fd.write(b"probe", 0) {
                        Ok(_) => Ok("ok".to_string()),
                        Err(e) => Ok(format!("err {e:?}")),
                    },
                    Ok(fd) => match fd.read(1 << 16, 0) {
                        Ok((bytes, _)) => Ok(format!("ok {} bytes", bytes.len())),
                        Err(e) => Ok(format!("err {e:?}")),
                    },
                    Err(e) => Ok(format!("err {e:?}")),
                }
            }
            "read-all" | "list" => {
                let mut parts = arg.splitn(3, '|');
                let (root, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                let dirs = get_directories();
                let Some((dir, _)) = dirs.iter().find(|(_, n)| n == root) else {
                    return Ok(format!("err no preopen {root}"));
                };
                if tool == "list" {
                    let opened = if path.is_empty() { None } else { Some(dir.open_at(PathFlags::empty(), path, OpenFlags::DIRECTORY, DescriptorFlags::READ)) };
                    let d = match &opened {
                        None => dir,
                        Some(Ok(d)) => d,
                        Some(Err(e)) => return Ok(format!("err {e:?}")),
                    };
                    let stream = match d.read_directory() {
                        Ok(s) => s,
                        Err(e) => return Ok(format!("err {e:?}")),
                    };
                    let mut lines = Vec::new();
                    loop {
                        match stream.read_directory_entry() {
                            Ok(Some(e)) => lines.push(format!("{} {:?}", e.name, e.type_)),
                            Ok(None) => break,
                            Err(e) => lines.push(format!("err {e:?}")),
                        }
                    }
                    return Ok(lines.join("\n"));
                }
                let chunk: u64 = parts.next().and_then(|c| c.parse().ok()).ok_or_else(|| fail("arg is <preopen>|<path>|<chunk>".into()))?;
                let fd = match dir.open_at(PathFlags::empty(), path, OpenFlags::empty(), DescriptorFlags::READ) {
                    Ok(fd) => fd,
                    Err(e) => return Ok(format!("err {e:?}")),
                };
                let (mut total, mut reads, mut sum) = (0u64, 0u32, 0u64);
                loop {
                    let (bytes, end) = match fd.read(chunk, total) {
                        Ok(r) => r,
                        Err(e) => return Ok(format!("err {e:?}")),
                    };
                    reads += 1;
                    total += bytes.len() as u64;
                    sum = bytes.iter().fold(sum, |s, b| s.wrapping_mul(31).wrapping_add(*b as u64));
                    if end || bytes.is_empty() {
                        return Ok(format!("ok {total} bytes in {reads} reads, sum {sum}"));
                    }
                }
            }
            "trap" | "boxd_status" => panic!("the probe traps on purpose"),
            "oom" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(core::hint::black_box(Vec::with_capacity(64 << 20)));
                }
            }
            other => Err(fail(format!("unknown probe {other}"))),
        }
    }

    /// Every probe call may go ahead: the probe has no preconditions.
    fn check(_tool: String, _arg: String, _ctx: Context) -> Result<(), ToolError> {
        Ok(())
    }
}

/// The probe builds no image: it answers with the spec it was given, so a host's wiring of
/// the operation can be seen.
impl exports::boxd::plugin::operations::Guest for Probe {
    fn build_golden(spec_json: String, _ctx: Context) -> Result<String, ToolError> {
        Err(fail(format!("the probe builds no golden image ({spec_json})")))
    }
}

export!(Probe);

#[global_allocator]
static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    core::arch::wasm32::unreachable()
}

#[unsafe(no_mangle)]
unsafe extern "C" fn cabi_realloc(old: *mut u8, old_len: usize, align: usize, new_len: usize) -> *mut u8 {
    use alloc::alloc::{alloc, realloc, Layout};
    if new_len == 0 {
        return align as *mut u8;
    }
    unsafe {
        if old_len == 0 {
            alloc(Layout::from_size_align_unchecked(new_len, align))
        } else {
            realloc(old, Layout::from_size_align_unchecked(old_len, align), new_len)
        }
    }
}

#[unsafe(no_mangle)]
unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    for i in 0..n {
        let (x, y) = unsafe { (*a.add(i), *b.add(i)) };
        if x != y {
            return x as i32 - y as i32;
        }
    }
    0
}

#[unsafe(no_mangle)]
unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    unsafe { memcmp(a, b, n) }
}
