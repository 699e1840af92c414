//! `boxd-host tour`: the whole product on this machine, no account needed. boxd-local is
//! the provider and a scripted model answers on loopback; the tour builds a golden image
//! through the component, then runs host-bridge/tour/plan.json (ensure → submit with a
//! file → job until idle → harvest, SUMMARY.md comes back → drop) through the real
//! component, prints each step, the audit, and one JSON summary line last. With `--keep
//! DIR` everything stays in DIR, wired for OpenCode (tour/opencode.rs).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};

use crate::cli::Grants;
use crate::session::Session;

mod opencode;
use opencode::{Kept, Plugin};

/// The scripted model ships with the tour (it is product code: the tour cannot run
/// without it); the tests start the same file.
const MODEL_JS: &str = include_str!("../../tour/scripted-model.mjs");
/// The tour's tool calls, in order: data, so this host names no tool.
const PLAN: &str = include_str!("../../tour/plan.json");

/// The guest's OpenCode config: the scripted provider, its URL and key from boxd env.
const GUEST_CONFIG: &str = include_str!("../../tour/guest-opencode.json");
/// What the tour hands the guest to summarise.
const BOOKMARKS: &str = include_str!("../../tour/bookmarks.json");

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn need(cmd: &str, why: &str) -> Result<()> {
    if crate::policy::find_on_path(cmd, std::env::var("PATH").ok().as_deref()).is_none() {
        bail!("the tour needs {cmd} ({why}); install it and run the tour again");
    }
    Ok(())
}

/// Serve one file over loopback HTTP for the golden build's download; returns its URL.
fn serve_archive(file: PathBuf) -> Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut s = stream;
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let body = std::fs::read(&file).unwrap_or_default();
            let _ = write!(s, "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
            let _ = s.write_all(&body);
        }
    });
    Ok(format!("http://127.0.0.1:{port}/opencode-{{target}}.tar.gz"))
}

/// A stand-in release archive: an `opencode` that runs this laptop's OpenCode.
pub fn make_archive(dir: &Path, opencode: &Path) -> Result<PathBuf> {
    let stage = dir.join("release");
    std::fs::create_dir_all(&stage)?;
    let bin = stage.join("opencode");
    std::fs::write(&bin, format!("#!/bin/sh\nexec '{}' \"$@\"\n", opencode.display()))?;
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let archive = dir.join("opencode.tar.gz");
    let ok = Command::new("tar").arg("-czf").arg(&archive).arg("-C").arg(&stage).arg("opencode").status()?.success();
    if !ok {
        bail!("tar could not build the stand-in release archive");
    }
    Ok(archive)
}

fn start_model(dir: &Path) -> Result<(Killed, String)> {
    use std::io::BufRead;
    let js = dir.join("scripted-model.mjs");
    std::fs::write(&js, MODEL_JS)?;
    let mut child = Command::new("node").arg(&js).env("PORT", "0").env("MODEL_LOG", dir.join("model.jsonl")).stdout(Stdio::piped()).spawn().context("node runs the scripted model")?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    let url = line.split_whitespace().last().unwrap_or("").to_string();
    if !url.starts_with("http://127.0.0.1:") {
        bail!("the scripted model did not start: {line}");
    }
    Ok((Killed(child), url))
}

pub fn run(f: &Grants, keep: Option<PathBuf>, plugin: Option<String>) -> Result<u8> {
    let plugin = Plugin::parse(plugin.as_deref())?;
    if let Some(d) = &keep {
        refuse_unless_empty(d)?;
    }
    let path_var = std::env::var("PATH").ok();
    let boxd_local = match &f.boxd {
        Some(p) => p.clone(),
        None => find_boxd_local(path_var.as_deref())?,
    };
    if !boxd_local.exists() {
        bail!("--boxd {} does not exist", boxd_local.display());
    }
    let boxd_local = std::fs::canonicalize(&boxd_local)?;
    let opencode = match &f.opencode {
        Some(p) => p.clone(),
        None => crate::policy::find_on_path("opencode", path_var.as_deref()).context(
            "the tour needs OpenCode: run `bash tests/bootstrap.sh` (installs the pinned opencode-ai into tests/node_modules) and pass --opencode tests/node_modules/.bin/opencode, or `npm install -g opencode-ai@1.18.33`",
        )?,
    };
    let opencode = std::fs::canonicalize(&opencode).with_context(|| format!("{} does not exist", opencode.display()))?;
    for (cmd, why) in [("node", "it runs the scripted model"), ("python3", "the guest helper runs on it"), ("git", "the work tree is a repository"), ("curl", "the golden build downloads OpenCode"), ("tar", "the golden build unpacks OpenCode")] {
        need(cmd, why)?;
    }
    let dir = match &keep {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            std::fs::canonicalize(d)?
        }
        None => {
            let d = std::env::temp_dir().join(format!("boxd-tour-{}", std::process::id()));
            std::fs::create_dir_all(&d)?;
            d
        }
    };
    let result = tour(f, &dir, &boxd_local, &opencode, keep.is_some().then_some(&plugin));
    if keep.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

/// boxd-local next to this binary (a build or `cargo install` puts both in one folder), else
/// on PATH.
fn find_boxd_local(path_var: Option<&str>) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let beside = exe.parent().context("no exe folder")?.join("boxd-local");
    if beside.exists() {
        return Ok(beside);
    }
    crate::policy::find_on_path("boxd-local", path_var).with_context(|| {
        format!("the tour runs on boxd-local, which is neither next to boxd-host ({}) nor on PATH: cargo install --path host-bridge/boxd-local --locked (or cargo build -p boxd-local), or pass --boxd", beside.display())
    })
}

/// `--keep DIR`: a new folder or an empty one. The tour writes a whole project there, so
/// it refuses a folder that holds anything rather than overwrite someone's files.
fn refuse_unless_empty(d: &Path) -> Result<()> {
    let empty = match std::fs::read_dir(d) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(e).with_context(|| format!("--keep {}", d.display())),
    };
    if !empty {
        bail!("--keep {}: the folder is not empty; the tour writes a new project there and overwrites nothing, so name a new or empty folder", d.display());
    }
    Ok(())
}

fn tour(f: &Grants, dir: &Path, boxd_local: &Path, opencode: &Path, kept: Option<&Plugin>) -> Result<u8> {
    let sub = |n: &str| -> Result<PathBuf> {
        let p = dir.join(n);
        std::fs::create_dir_all(&p)?;
        Ok(p)
    };
    let (boxd_home, ledger, project, laptop) = (sub("boxd-local")?, sub("ledger")?, sub("project")?, sub("laptop")?);
    let audit_log = dir.join("audit.jsonl");
    let oc_version = String::from_utf8_lossy(&Command::new(opencode).arg("--version").output()?.stdout).trim().to_string();
    crate::outln!("tour: OpenCode {oc_version} · boxd-local (not a VM: machines are folders and processes on this computer) · scripted model");

    // The laptop: its own OpenCode data; boxd-local's state; the guests find OpenCode on PATH.
    let mut vars: Vec<(String, String)> = std::env::vars().filter(|(k, _)| !k.starts_with("XDG_") && k != "HOME").collect();
    let l = laptop.display().to_string();
    for (k, v) in [("HOME", l.clone()), ("XDG_DATA_HOME", format!("{l}/data")), ("XDG_CONFIG_HOME", format!("{l}/config")), ("XDG_CACHE_HOME", format!("{l}/cache")), ("XDG_STATE_HOME", format!("{l}/state"))] {
        vars.push((k.into(), v));
    }
    vars.push(("BOXD_LOCAL_HOME".into(), boxd_home.display().to_string()));
    vars.push(("OPENCODE_DISABLE_MODELS_FETCH".into(), "1".into()));
    vars.push(("OPENCODE_DISABLE_AUTOUPDATE".into(), "1".into()));
    std::fs::write(project.join("bookmarks.json"), BOOKMARKS)?;
    let grants = Grants {
        project: Some(project.clone()),
        ledger: Some(ledger.clone()),
        boxd: Some(boxd_local.to_path_buf()),
        opencode: Some(opencode.to_path_buf()),
        audit_log: Some(audit_log.clone()),
        no_cache: f.no_cache,
        ..Grants::default()
    };
    let mut host = Session::open_env(&grants, crate::session::HOST_NAME, vars.clone())?;

    let (_model, model_url) = start_model(dir)?;
    for args in [
        &["env", "set", "SCRIPTED_MODEL_URL", model_url.as_str()][..],
        &["env", "set", "OPENCODE_DISABLE_MODELS_FETCH", "1"],
        &["env", "set", "OPENCODE_DISABLE_AUTOUPDATE", "1"],
        &["env", "set", "SCRIPTED_MODEL_KEY", "tour-key", "--secret"],
    ] {
        host.run_granted("boxd", args)?;
    }

    let mut steps: Vec<Value> = Vec::new();
    let started = Instant::now();
    crate::outln!("\n1. golden image");
    let archive = make_archive(dir, opencode)?;
    let spec = json!({
        "snapshot": "opencode-golden",
        "opencodeVersion": oc_version,
        "config": GUEST_CONFIG,
        "url": serve_archive(archive)?,
        "retryDelaySeconds": 1,
        "keyEnv": ["SCRIPTED_MODEL_KEY"],
    });
    match host.build_golden(&spec)? {
        Ok(r) => {
            for step in r["steps"].as_array().into_iter().flatten() {
                crate::outln!("   {}", step.as_str().unwrap_or_default());
            }
            steps.push(json!({ "step": "golden", "ok": true, "snapshot": r["snapshot"] }));
        }
        Err(e) => {
            crate::outln!("   {}: {}\n   next: {}", e["error"].as_str().unwrap_or(""), e["message"].as_str().unwrap_or(""), e["next"].as_str().unwrap_or(""));
            steps.push(json!({ "step": "golden", "ok": false, "error": e["error"] }));
            return finish(&steps, "tour", &[], started, 1);
        }
    }

    let plan: Value = serde_json::from_str(PLAN).context("host-bridge/tour/plan.json is JSON")?;
    let plan = plan["steps"].as_array().context("the tour plan has steps")?;
    let mut harvested: Vec<Value> = Vec::new();
    for (i, step) in plan.iter().enumerate() {
        let tool = step["tool"].as_str().context("a tour step names its tool")?;
        let args = step["args"].to_string();
        crate::outln!("\n{}. {tool}", i + 2);
        let t0 = Instant::now();
        let mut result = host.call(tool, &args);
        // A step with "until" asks again in later "turns" while the field holds (bounded).
        while result.as_ref().is_ok_and(|r| step.get("until").is_some_and(|u| holds(u, r))) && t0.elapsed() < Duration::from_secs(180) {
            crate::outln!("   {}… asking again", result.as_ref().ok().and_then(|r| r.as_ref().ok()).map(|v| v["state"].to_string()).unwrap_or_default());
            std::thread::sleep(Duration::from_millis(700));
            result = host.call(tool, &args);
        }
        let result = match result {
            Ok(r) => r,
            Err(e) => {
                remove_machine(&mut host, kept.is_some());
                return Err(e);
            }
        };
        let ms = t0.elapsed().as_millis();
        match result {
            Ok(v) => {
                crate::outln!("   ok ({ms} ms): {}", summary_line(step, &v));
                let files: Vec<Value> = v["files"].as_array().into_iter().flatten().filter(|f| f.get("sha256").is_some()).cloned().collect();
                if !files.is_empty() {
                    harvested = files;
                }
                steps.push(json!({ "step": tool, "ok": true }));
            }
            Err(e) => {
                crate::outln!("   {} ({ms} ms): {}\n   next: {}", e["error"].as_str().unwrap_or(""), e["message"].as_str().unwrap_or(""), e["next"].as_str().unwrap_or(""));
                steps.push(json!({ "step": tool, "ok": false, "error": e["error"] }));
                break;
            }
        }
    }
    crate::outln!("\n{}. audit: what the plugin could touch", plan.len() + 2);
    for line in crate::audit::render(&crate::audit::reach(&host.runtime)).lines() {
        crate::outln!("   {line}");
    }
    let calls = std::fs::read_to_string(boxd_home.join("calls.jsonl")).map(|t| t.lines().count()).unwrap_or(0);
    // Without --keep the folder, audit log included, goes when the tour ends: name no path.
    let log = if kept.is_some() { format!("audit log: {}", audit_log.display()) } else { "the audit log goes with the tour's folder (keep both with --keep DIR)".into() };
    crate::outln!("\n   boxd calls made: {calls} (boxd-local's call log); {log}");
    let mut code = if steps.iter().all(|s| s["ok"] == true) { 0 } else { 1 };
    if code != 0 {
        remove_machine(&mut host, kept.is_some());
    }
    if let Some(plugin) = kept {
        crate::outln!("\nkept in {}.", dir.display());
        crate::outln!("   boxd-host there: export BOXD_LOCAL_HOME={} HOME={l} XDG_DATA_HOME={l}/data XDG_CONFIG_HOME={l}/config XDG_CACHE_HOME={l}/cache XDG_STATE_HOME={l}/state", boxd_home.display());
        crate::outln!("   boxd-host call boxd_status --project {} --ledger {} --boxd {} --opencode {}", project.display(), ledger.display(), boxd_local.display(), opencode.display());
        if code == 0 {
            let kept = Kept { dir, laptop: &laptop, project: &project, ledger: &ledger, boxd_home: &boxd_home, boxd_local, opencode, opencode_version: &oc_version, guest_config: GUEST_CONFIG };
            match opencode::wire(&kept, plugin) {
                Ok((spec, command)) => {
                    crate::outln!("   the project's opencode.json loads the plugin {spec}");
                    if let Plugin::Npm(_) = plugin {
                        crate::outln!("   (from npm; from a checkout, pass --plugin with the tarball `npm pack` makes in host-bridge/opencode)");
                    }
                    crate::outln!("\nOpen OpenCode there (its own data, the plugin, boxd-local, the scripted model) with:\n{command}");
                }
                Err(e) => {
                    crate::outln!("   not wired for OpenCode: {e:#}");
                    code = 1;
                }
            }
        } else {
            crate::outln!("   (not wired for OpenCode: a step failed)");
        }
    }
    finish(&steps, "tour", &harvested, started, code)
}

/// A failed tour's machine: removed when the tour's folder goes with it (a boxd-local
/// machine's processes would outlive its folder), else named so the user can remove it.
fn remove_machine(host: &mut Session, kept: bool) {
    if kept {
        crate::outln!("   the tour's machine oc-tour is left for you to look at; remove it with: boxd-local machine remove oc-tour -y");
        return;
    }
    match host.run_granted("boxd", &["machine", "remove", "oc-tour", "-y", "--json"]) {
        Ok(out) if out.exit_code == Some(0) || String::from_utf8_lossy(&out.stderr).contains("not found") => crate::outln!("   removed the tour's machine oc-tour"),
        Ok(out) => crate::outln!("   could not remove the tour's machine oc-tour: {}", String::from_utf8_lossy(&out.stderr).trim()),
        Err(e) => crate::outln!("   could not remove the tour's machine oc-tour: {e:#}"),
    }
}

/// Whether every field of a step's `until` still has its value in the answer.
fn holds(until: &Value, answer: &std::result::Result<Value, Value>) -> bool {
    let Ok(v) = answer else { return false };
    until.as_object().is_some_and(|m| m.iter().all(|(k, want)| v.get(k) == Some(want)))
}

/// The fields a step names in "show" (dotted paths), as `name value` pairs; a list of
/// files shows each path with its digest.
fn summary_line(step: &Value, v: &Value) -> String {
    let field = |path: &str| path.split('.').fold(v, |at, key| &at[key]);
    step["show"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|path| match field(path) {
            Value::Array(items) => {
                let shown: Vec<String> = items
                    .iter()
                    .map(|x| match (x["path"].as_str(), x["sha256"].as_str()) {
                        (Some(p), Some(d)) => format!("{p} sha256 {d}"),
                        _ => x.to_string(),
                    })
                    .collect();
                format!("{path} [{}]", shown.join(", "))
            }
            other => format!("{path} {other}"),
        })
        .collect::<Vec<_>>()
        .join(" · ")
}

fn finish(steps: &[Value], work: &str, harvested: &[Value], started: Instant, code: u8) -> Result<u8> {
    let files: Vec<Value> = harvested.iter().map(|f| json!({ "path": f["path"], "sha256": f["sha256"] })).collect();
    crate::outln!(
        "{}",
        json!({ "tour": if code == 0 { "ok" } else { "failed" }, "work": work, "machine": format!("oc-{work}"), "steps": steps, "files": files, "seconds": started.elapsed().as_secs() })
    );
    Ok(code)
}
