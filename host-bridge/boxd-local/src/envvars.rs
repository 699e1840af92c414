//! Account env vars and secrets: `env set|list|rm|scope`. Every exec session gets them all.
//! Secrets are only sealed in listings; a secret set with `--domains` reaches the machine as
//! a `bxds_…` placeholder (37 chars), as on real boxd, where the platform swaps in the real
//! value for requests to those hosts (boxd-local has no such proxy: the placeholder stays).

use crate::app::Ctx;
use crate::fail::{Fail, Res};
use crate::store::EnvVar;
use crate::util;
use serde::Serialize;

const SCOPES: [&str; 3] = ["shared", "private", "all"];

/// `[A-Za-z_][A-Za-z0-9_]*`
pub fn valid_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

fn check_name(name: &str) -> Res<()> {
    if !valid_name(name) {
        return Err(Fail::new(format!("invalid env name '{name}' — use [A-Za-z_][A-Za-z0-9_]*")));
    }
    if name.starts_with("BOXD_") {
        return Err(Fail::new(format!("env name '{name}' is reserved: BOXD_* names belong to boxd")));
    }
    Ok(())
}

fn check_scope(scope: &str) -> Res<()> {
    if SCOPES.contains(&scope) {
        return Ok(());
    }
    Err(Fail::usage(format!("invalid scope '{scope}'"), "hint: scopes are shared, private and all"))
}

/// What an exec session sees: every var, secrets included, `--domains` secrets as placeholders.
pub fn session_env(vars: &[EnvVar]) -> Vec<(String, String)> {
    vars.iter()
        .map(|v| (v.name.clone(), v.placeholder.clone().unwrap_or_else(|| v.value.clone())))
        .collect()
}

#[derive(Serialize)]
struct SetDoc<'a> {
    name: &'a str,
    scope: &'a str,
    secret: bool,
}

#[derive(Serialize)]
struct Row<'a> {
    name: &'a str,
    value: &'a str,
    scope: &'a str,
}

#[derive(Serialize)]
struct Removed<'a> {
    name: &'a str,
    status: &'a str,
}

pub fn set(ctx: &Ctx) -> Res<i32> {
    let inv = ctx.inv;
    let (name, value) = (inv.args[0].as_str(), inv.args[1].as_str());
    check_name(name)?;
    if let Some(s) = inv.value("--scope") {
        check_scope(s)?;
    }
    let secret = inv.has("--secret");
    let domains = inv.value("--domains").map(str::to_string);
    let placeholder = match (&domains, secret) {
        (Some(_), true) => Some(format!("bxds_{}", util::random_hex(16)?)),
        _ => None,
    };
    let mut lock = ctx.home.lock()?;
    let env = &mut lock.state.env;
    // Re-setting keeps the old scope unless a new one is given.
    let old_scope = env.iter().find(|v| v.name == name).map(|v| v.scope.clone());
    let scope = inv.value("--scope").map(str::to_string).or(old_scope).unwrap_or_else(|| "all".to_string());
    env.retain(|v| v.name != name);
    env.push(EnvVar { name: name.to_string(), value: value.to_string(), secret, scope: scope.clone(), domains, placeholder });
    env.sort_by(|a, b| a.name.cmp(&b.name));
    lock.save()?;
    ctx.out.either(&SetDoc { name, scope: &scope, secret }, String::new);
    Ok(0)
}

pub fn list(ctx: &Ctx) -> Res<i32> {
    let lock = ctx.home.lock()?;
    let rows: Vec<Row> = lock
        .state
        .env
        .iter()
        .map(|v| Row { name: &v.name, value: if v.secret { "(sealed)" } else { &v.value }, scope: &v.scope })
        .collect();
    if ctx.out.json {
        ctx.out.doc(&rows);
    } else {
        for r in rows {
            ctx.out.line(&format!("{}={}  ({})", r.name, r.value, r.scope));
        }
    }
    Ok(0)
}

pub fn rm(ctx: &Ctx) -> Res<i32> {
    let name = ctx.inv.args[0].as_str();
    let mut lock = ctx.home.lock()?;
    let before = lock.state.env.len();
    lock.state.env.retain(|v| v.name != name);
    if lock.state.env.len() == before {
        return Err(Fail::new(format!("env var '{name}' not found")));
    }
    lock.save()?;
    ctx.out.either(&Removed { name, status: "removed" }, String::new);
    Ok(0)
}

pub fn scope(ctx: &Ctx) -> Res<i32> {
    let (name, scope) = (ctx.inv.args[0].as_str(), ctx.inv.args[1].as_str());
    check_scope(scope)?;
    let mut lock = ctx.home.lock()?;
    let Some(v) = lock.state.env.iter_mut().find(|v| v.name == name) else {
        return Err(Fail::new(format!("env var '{name}' not found")));
    };
    v.scope = scope.to_string();
    let secret = v.secret;
    lock.save()?;
    ctx.out.either(&SetDoc { name, scope, secret }, String::new);
    Ok(0)
}
