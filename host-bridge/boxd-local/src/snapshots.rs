//! Snapshots: `snapshots save|list|remove`, and the lookup `machine new --from-snapshot`
//! uses. Each save is a new version `snapshots/<name>/vN/{home,meta.json}`, and a version's
//! files are never written again. A boxd-local snapshot is a copy of the home folder only:
//! no memory, no processes.

use crate::app::Ctx;
use crate::fail::{Fail, Res};
use crate::machines::confirm;
use crate::store::Home;
use crate::{fstree, util};
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::PathBuf;

#[derive(Serialize, Deserialize, Clone)]
pub struct Meta {
    pub name: String,
    pub version: String,
    pub status: String,
    pub size_bytes: u64,
    pub created_ms: u64,
    pub source_vm: String,
    pub vcpu: u32,
    pub memory: String,
    pub isolated: bool,
}

pub struct Version {
    pub home: PathBuf,
    pub meta: Meta,
}

/// Same shape as machine names, but a leading digit and `.`/`_` are allowed.
fn valid_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"-._".contains(c))
}

/// Version numbers present under `snapshots/<name>/`, ascending (ready or not).
fn versions(home: &Home, name: &str) -> Vec<u32> {
    let mut v: Vec<u32> = fs::read_dir(home.snapshots_dir().join(name))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.strip_prefix('v')?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

fn read_meta(home: &Home, name: &str, n: u32) -> Option<Meta> {
    let bytes = fs::read(home.snapshots_dir().join(name).join(format!("v{n}")).join("meta.json")).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The newest `ready` version of snapshot `name`.
pub fn latest_ready(home: &Home, name: &str) -> Option<Version> {
    if !valid_name(name) {
        return None;
    }
    versions(home, name).into_iter().rev().find_map(|n| {
        let meta = read_meta(home, name, n).filter(|m| m.status == "ready")?;
        Some(Version { home: home.snapshots_dir().join(name).join(format!("v{n}")).join("home"), meta })
    })
}

#[derive(Serialize)]
struct Row {
    name: String,
    version: String,
    status: String,
    size: String,
    used: String,
}

/// Save blocks until the copy is done, holding the state lock: the machine cannot change
/// state or vanish mid-capture, and version numbers are never handed out twice.
pub fn save(ctx: &Ctx) -> Res<i32> {
    let (vm, name) = (ctx.inv.args[0].as_str(), ctx.inv.args[1].as_str());
    if !valid_name(name) {
        return Err(Fail::new(format!(
            "invalid snapshot name '{name}' — use lowercase letters, digits, '-', '.' and '_', at most 63 characters"
        )));
    }
    let lock = ctx.home.lock()?;
    let now = util::now_ms();
    let m = lock.state.machines[lock.state.visible(vm, now)?].clone();
    let status = m.status_at(now).unwrap_or_default();
    if status != "running" {
        return Err(Fail::new(format!("vm is '{status}' — must be running to snapshot")));
    }
    let dir = ctx.home.snapshots_dir().join(name);
    fs::create_dir_all(&dir).map_err(|e| Fail::io(format!("creating {}", dir.display()), e))?;
    // An interrupted save leaves a folder without meta.json: its number is skipped, not reused.
    let n = versions(ctx.home, name).last().copied().unwrap_or(0) + 1;
    let vdir = dir.join(format!("v{n}"));
    fs::create_dir(&vdir).map_err(|e| Fail::io(format!("creating {}", vdir.display()), e))?;
    if let Err(e) = fstree::copy_tree(&ctx.home.machine_home(&m.id), &vdir.join("home"), false) {
        let _ = fstree::remove_tree(&vdir);
        return Err(Fail::io(format!("capturing '{vm}'"), e));
    }
    let meta = Meta {
        name: name.to_string(),
        version: format!("v{n}"),
        status: "ready".to_string(),
        size_bytes: fstree::tree_size(&vdir.join("home")),
        created_ms: now,
        source_vm: vm.to_string(),
        vcpu: m.vcpu,
        memory: m.memory.clone(),
        isolated: m.isolated,
    };
    let bytes = serde_json::to_vec_pretty(&meta).unwrap_or_default();
    util::write_atomic(&vdir.join("meta.json"), &bytes)?;
    drop(lock);
    // The real CLI prints nothing until the capture lands, then nothing either.
    ctx.out.either(&row(&meta, 0), String::new);
    Ok(0)
}

fn row(meta: &Meta, used: usize) -> Row {
    Row {
        name: meta.name.clone(),
        version: meta.version.clone(),
        status: meta.status.clone(),
        size: util::human_size(meta.size_bytes),
        used: used.to_string(),
    }
}

pub fn list(ctx: &Ctx) -> Res<i32> {
    let lock = ctx.home.lock()?; // saves hold it: never list a half-written version
    let mut names: Vec<String> = fs::read_dir(ctx.home.snapshots_dir())
        .map(|d| d.flatten().filter_map(|e| e.file_name().into_string().ok()).collect())
        .unwrap_or_default();
    names.sort();
    let mut rows = Vec::new();
    for name in names.iter().filter(|n| valid_name(n)) {
        let vs = versions(ctx.home, name);
        let Some(&newest) = vs.last() else { continue };
        let meta = latest_ready(ctx.home, name).map(|v| v.meta).unwrap_or_else(|| Meta {
            name: name.clone(),
            version: format!("v{newest}"),
            // Saves hold the lock this listing holds: a version with no meta.json now is a
            // save that was killed, not one under way (listed `pending`, it held a plugin's
            // image and drop of that work until the name was removed by hand).
            status: read_meta(ctx.home, name, newest).map(|m| m.status).unwrap_or_else(|| "failed".to_string()),
            size_bytes: 0,
            created_ms: 0,
            source_vm: String::new(),
            vcpu: 0,
            memory: String::new(),
            isolated: false,
        });
        let prefix = format!("snapshot/{name}:");
        let used = lock.state.machines.iter().filter(|m| m.source.starts_with(&prefix)).count();
        rows.push(row(&meta, used));
    }
    if ctx.out.json {
        ctx.out.doc(&rows);
    } else {
        for r in rows {
            ctx.out.line(&format!("{}  {}  {}  {}  used {}", r.name, r.version, r.status, r.size, r.used));
        }
    }
    Ok(0)
}

#[derive(Serialize)]
struct Removed<'a> {
    name: &'a str,
    status: &'a str,
}

pub fn remove(ctx: &Ctx) -> Res<i32> {
    let name = ctx.inv.args[0].as_str();
    confirm(ctx.inv, &format!("snapshot '{name}'"))?;
    let _lock = ctx.home.lock()?;
    let dir = ctx.home.snapshots_dir().join(name);
    if !valid_name(name) || !dir.is_dir() {
        return Err(Fail::new("snapshot not found"));
    }
    fstree::remove_tree(&dir).map_err(|e| Fail::io(format!("removing snapshot '{name}'"), e))?;
    ctx.out.either(&Removed { name, status: "removed" }, String::new);
    Ok(0)
}
