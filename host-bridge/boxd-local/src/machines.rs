//! Machines as records: names, creation (blank or from a snapshot), fork, the list/get views,
//! removal and the idle-bound config. A machine is the folder `machines/<id>/home` plus the
//! processes carrying its marker — not a VM.

use crate::app::Ctx;
use crate::cli::Invocation;
use crate::fail::{Fail, Res};
use crate::store::{Locked, Machine};
use crate::{fstree, procs, snapshots, util};
use serde::Serialize;
use std::time::{Duration, Instant};

/// 0.2.x defaults: auto-suspend off, auto-hibernate after 4 h.
pub const DEFAULT_AUTO_HIBERNATE_S: u64 = 14400;

/// How a create lands: at once, or (fault injection) invisible for a while, then `starting`.
#[derive(Clone, Copy)]
pub enum Landing {
    Normal,
    Late { appear_after_ms: u64, starting_ms: u64 },
}

/// Lowercase DNS label starting with a letter: `[a-z][a-z0-9-]*`, at most 63, no trailing `-`.
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && !name.ends_with('-')
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

fn check_name(name: &str) -> Res<()> {
    if valid_name(name) {
        return Ok(());
    }
    Err(Fail::new(format!(
        "invalid machine name '{name}' — use lowercase letters, digits and '-', start with a letter, \
         end with a letter or digit, at most 63 characters"
    )))
}

#[derive(Serialize)]
struct Created<'a> {
    name: &'a str,
    id: &'a str,
    url: String,
    source: &'a str,
    boot: String,
}

#[derive(Serialize)]
struct Listed<'a> {
    name: &'a str,
    status: &'a str,
    url: String,
    source: &'a str,
    sharing: &'a str,
}

/// `machine get --json`: every value a string, as the real CLI prints it.
#[derive(Serialize)]
struct Details {
    name: String,
    id: String,
    status: String,
    url: String,
    ssh: String,
    public_ip: String,
    domains: String,
    source: String,
    auto_suspend: String,
    auto_hibernate: String,
    sharing: String,
    networks: String,
    isolated: String,
}

#[derive(Serialize)]
struct NameStatus<'a> {
    name: &'a str,
    status: &'a str,
}

/// Idle bounds given on the command line (None = inherit or default).
struct Bounds {
    suspend: Option<u64>,
    hibernate: Option<u64>,
    destroy: Option<u64>,
}

fn bounds(inv: &Invocation) -> Res<Bounds> {
    let get = |f: &str| inv.value(f).map(|v| util::parse_secs(f, v)).transpose();
    Ok(Bounds {
        suspend: get("--auto-suspend-timeout")?,
        hibernate: get("--auto-hibernate-timeout")?,
        destroy: get("--auto-destroy-timeout")?,
    })
}

/// The one name from a positional or `--name` (flat `new --name=N`, `fork SRC --name=NEW`).
fn name_from(inv: &Invocation, positional: Option<&String>) -> Res<Option<String>> {
    match (positional, inv.value("--name")) {
        (Some(a), Some(b)) if a != b => Err(Fail::usage(
            format!("two names given: '{a}' and --name '{b}'"),
            crate::cli::usage_hint(inv.verb),
        )),
        (Some(a), _) => Ok(Some(a.clone())),
        (None, b) => Ok(b.map(str::to_string)),
    }
}

fn new_id() -> Res<String> {
    Ok(format!("vm_{}", util::random_hex(8)?))
}

fn boot_secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64().max(0.1))
}

/// Create the machine (record + home) without printing; `new` prints, a landed hang doesn't.
pub fn create(ctx: &Ctx) -> Res<(Machine, String)> {
    let inv = ctx.inv;
    let name = name_from(inv, inv.args.first())?.ok_or_else(|| {
        Fail::usage("a machine name is required", crate::cli::usage_hint(inv.verb))
    })?;
    check_name(&name)?;
    let b = bounds(inv)?;
    let vcpu = match inv.value("--vcpu") {
        Some(v) => Some(v.parse::<u32>().ok().filter(|n| [1, 2, 4, 8].contains(n)).ok_or_else(|| {
            Fail::new(format!("invalid --vcpu '{v}' — sizes are 1, 2, 4 or 8 vCPUs"))
        })?),
        None => None,
    };
    let memory = inv.value("--memory").map(str::to_string);
    let started = Instant::now();
    let mut lock = ctx.home.lock()?;
    if lock.state.taken(&name) {
        return Err(Fail::exists(&name));
    }
    let snap = match inv.value("--from-snapshot") {
        Some(s) => {
            if vcpu.is_some() || memory.is_some() {
                return Err(Fail::new("--vcpu and --memory cannot be used with --from-snapshot: a restore takes the snapshot's size"));
            }
            Some(snapshots::latest_ready(ctx.home, s).ok_or_else(|| Fail::new("snapshot not found"))?)
        }
        None => None,
    };
    let id = new_id()?;
    let home_dir = ctx.home.machine_home(&id);
    let made = match &snap {
        Some(s) => fstree::copy_tree(&s.home, &home_dir, false).map(|_| ()),
        None => std::fs::create_dir_all(&home_dir),
    };
    if let Err(e) = made {
        let _ = fstree::remove_tree(&ctx.home.machine_dir(&id));
        return Err(Fail::io(format!("creating the home of '{name}'"), e));
    }
    let now = util::now_ms();
    let mut m = Machine {
        name,
        id,
        status: "running".to_string(),
        source: match &snap {
            Some(s) => format!("snapshot/{}:{}", s.meta.name, s.meta.version),
            None => "standalone".to_string(),
        },
        shared: inv.has("--shared"),
        // One-way: a restore keeps the snapshot's isolation.
        isolated: inv.has("--isolated") || snap.as_ref().is_some_and(|s| s.meta.isolated),
        auto_suspend_s: b.suspend.unwrap_or(0),
        auto_hibernate_s: b.hibernate.unwrap_or(DEFAULT_AUTO_HIBERNATE_S),
        auto_destroy_s: b.destroy.unwrap_or(0),
        vcpu: vcpu.or(snap.as_ref().map(|s| s.meta.vcpu)).unwrap_or(2),
        memory: memory.or(snap.as_ref().map(|s| s.meta.memory.clone())).unwrap_or_else(|| "8G".to_string()),
        created_ms: now,
        last_activity_ms: now,
        visible_at_ms: None,
        ready_at_ms: None,
        sessions: Vec::new(),
    };
    let boot = match ctx.landing {
        Landing::Normal => boot_secs(started.elapsed()),
        Landing::Late { appear_after_ms, starting_ms } => {
            m.visible_at_ms = Some(now + appear_after_ms);
            m.ready_at_ms = Some(now + appear_after_ms + starting_ms);
            m.last_activity_ms = now + appear_after_ms + starting_ms;
            "timeout".to_string()
        }
    };
    lock.state.machines.push(m.clone());
    lock.save()?;
    Ok((m, boot))
}

pub fn new(ctx: &Ctx) -> Res<i32> {
    let (m, boot) = create(ctx)?;
    let doc = Created { name: &m.name, id: &m.id, url: m.url(), source: &m.source, boot: boot.clone() };
    ctx.out.either(&doc, || {
        format!("Created VM '{}' ({}) in {boot}\n  url: https://{}\n  ssh: ssh {}.boxd", m.name, m.id, m.url(), m.name)
    });
    Ok(0)
}

pub fn list(ctx: &Ctx) -> Res<i32> {
    let lock = ctx.home.lock()?;
    let now = util::now_ms();
    let mut rows: Vec<(&Machine, &str)> =
        lock.state.machines.iter().filter_map(|m| m.status_at(now).map(|s| (m, s))).collect();
    rows.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    if ctx.out.json {
        let docs: Vec<Listed> = rows
            .iter()
            .map(|(m, s)| Listed { name: &m.name, status: s, url: m.url(), source: &m.source, sharing: m.sharing() })
            .collect();
        ctx.out.doc(&docs);
    } else {
        for (m, s) in rows {
            ctx.out.line(&format!("{}  {}  {}  {}  {}", m.name, s, m.url(), m.source, m.sharing()));
        }
    }
    Ok(0)
}

pub fn get(ctx: &Ctx) -> Res<i32> {
    let lock = ctx.home.lock()?;
    let now = util::now_ms();
    let m = &lock.state.machines[lock.state.visible(&ctx.inv.args[0], now)?];
    let d = Details {
        name: m.name.clone(),
        id: m.id.clone(),
        status: m.status_at(now).unwrap_or_default().to_string(),
        url: m.url(),
        ssh: format!("ssh {}.boxd", m.name),
        public_ip: "127.0.0.1".to_string(),
        domains: "-".to_string(),
        source: m.source.clone(),
        auto_suspend: util::secs_or_off(m.auto_suspend_s),
        auto_hibernate: util::secs_or_off(m.auto_hibernate_s),
        sharing: m.sharing().to_string(),
        networks: "-".to_string(),
        isolated: if m.isolated { "yes" } else { "no" }.to_string(),
    };
    if ctx.out.json {
        ctx.out.doc(&d);
    } else {
        let v = serde_json::to_value(&d).unwrap_or_default();
        let rows = [
            "name", "id", "status", "url", "ssh", "public_ip", "domains", "source", "auto_suspend",
            "auto_hibernate", "sharing", "networks", "isolated",
        ];
        for k in rows {
            ctx.out.line(&format!("{k}: {}", v[k].as_str().unwrap_or("")));
        }
    }
    Ok(0)
}

/// Copy a machine's home and settings (not its processes) into a new running machine.
pub fn fork(ctx: &Ctx) -> Res<i32> {
    let inv = ctx.inv;
    let src_name = inv.args[0].clone();
    let name = name_from(inv, inv.args.get(1))?.unwrap_or_else(|| format!("{src_name}-fork"));
    check_name(&name)?;
    let b = bounds(inv)?;
    let started = Instant::now();
    let mut lock = ctx.home.lock()?;
    let now = util::now_ms();
    let src = lock.state.machines[lock.state.visible(&src_name, now)?].clone();
    if src.status_at(now) == Some("starting") {
        return Err(Fail::new("vm is 'starting' — must be running to fork"));
    }
    if lock.state.taken(&name) {
        return Err(Fail::exists(&name));
    }
    let id = new_id()?;
    if let Err(e) = fstree::copy_tree(&ctx.home.machine_home(&src.id), &ctx.home.machine_home(&id), false) {
        let _ = fstree::remove_tree(&ctx.home.machine_dir(&id));
        return Err(Fail::io(format!("copying the home of '{src_name}'"), e));
    }
    let m = Machine {
        name,
        id,
        status: "running".to_string(),
        source: format!("fork/{src_name}"),
        // A fork is private unless asked; isolation is one-way and inherited.
        shared: inv.has("--shared"),
        isolated: src.isolated || inv.has("--isolated"),
        auto_suspend_s: b.suspend.unwrap_or(src.auto_suspend_s),
        auto_hibernate_s: b.hibernate.unwrap_or(src.auto_hibernate_s),
        auto_destroy_s: b.destroy.unwrap_or(src.auto_destroy_s),
        vcpu: src.vcpu,
        memory: src.memory.clone(),
        created_ms: now,
        last_activity_ms: now,
        visible_at_ms: None,
        ready_at_ms: None,
        sessions: Vec::new(),
    };
    lock.state.machines.push(m.clone());
    lock.save()?;
    let boot = format!("{}ms", started.elapsed().as_millis().max(1));
    let doc = Created { name: &m.name, id: &m.id, url: m.url(), source: &m.source, boot: boot.clone() };
    ctx.out.either(&doc, || format!("Forked '{src_name}' into '{}' ({}) in {boot}", m.name, m.id));
    Ok(0)
}

/// Ask on a terminal; refuse when nobody can answer (scripts must pass -y).
pub fn confirm(inv: &Invocation, what: &str) -> Res<()> {
    if inv.confirmed() {
        return Ok(());
    }
    if util::is_tty(0) && util::is_tty(2) {
        eprint!("Remove {what}? [y/N] ");
        let mut answer = String::new();
        let _ = std::io::stdin().read_line(&mut answer);
        if matches!(answer.trim(), "y" | "Y" | "yes") {
            return Ok(());
        }
        return Err(Fail::new("aborted"));
    }
    Err(Fail::new(format!("refusing to remove {what} without -y (non-interactive)")))
}

pub fn remove(ctx: &Ctx) -> Res<i32> {
    let name = &ctx.inv.args[0];
    confirm(ctx.inv, &format!("'{name}'"))?;
    let mut lock = ctx.home.lock()?;
    let i = lock.state.visible(name, util::now_ms())?;
    let m = lock.state.machines.remove(i);
    destroy(&mut lock, &m)?;
    ctx.out.either(&NameStatus { name, status: "destroyed" }, || format!("VM '{name}' destroyed"));
    Ok(0)
}

/// Kill the processes, forget the record, move the folder to the trash (in that order, so
/// nothing writes into a folder being deleted and a crash leaves at worst an orphan
/// folder). The trash is emptied after the answer (trash.rs), so a machine with many
/// files is removed as fast as any other.
pub fn destroy(lock: &mut Locked, m: &Machine) -> Res<()> {
    procs::kill_all(&m.id);
    lock.state.machines.retain(|x| x.id != m.id);
    lock.save()?;
    crate::trash::discard(lock.home, &lock.home.machine_dir(&m.id), &m.id)
        .map_err(|e| Fail::io(format!("deleting the home of '{}'", m.name), e))
}

/// Fault `lose_machine`: the machine is gone, visible or not, as if boxd lost it.
pub fn vanish(lock: &mut Locked, name: &str) -> Res<()> {
    if let Some(m) = lock.state.machines.iter().find(|m| m.name == name).cloned() {
        destroy(lock, &m)?;
    }
    Ok(())
}

#[derive(Serialize)]
struct Config<'a> {
    name: &'a str,
    auto_suspend: String,
    auto_hibernate: String,
}

pub fn config_set(ctx: &Ctx) -> Res<i32> {
    let (name, key, raw) = (&ctx.inv.args[0], ctx.inv.args[1].as_str(), &ctx.inv.args[2]);
    let secs = util::parse_secs(key, raw)?;
    let mut lock = ctx.home.lock()?;
    let i = lock.state.visible(name, util::now_ms())?;
    let m = &mut lock.state.machines[i];
    match key {
        "auto-suspend.timeout" => m.auto_suspend_s = secs,
        "auto-hibernate.timeout" => m.auto_hibernate_s = secs,
        "auto-destroy.timeout" => m.auto_destroy_s = secs,
        _ => {
            return Err(Fail::usage(
                format!("unknown config key '{key}'"),
                "hint: keys are auto-suspend.timeout, auto-hibernate.timeout and auto-destroy.timeout",
            ));
        }
    }
    let doc = Config {
        name,
        auto_suspend: util::secs_or_off(m.auto_suspend_s),
        auto_hibernate: util::secs_or_off(m.auto_hibernate_s),
    };
    lock.save()?;
    ctx.out.either(&doc, || format!("{name}: {key} = {}", util::secs_or_off(secs)));
    Ok(0)
}
