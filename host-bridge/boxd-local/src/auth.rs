//! Identity and version: `auth [--json]`, `auth login|logout`, `version`. A local provider
//! has no account: a fresh state folder is signed in, login opens no browser, and
//! `BOXD_TOKEN` or `--token` counts as signed in (checked in `app`).

use crate::app::Ctx;
use crate::fail::Res;
use serde::Serialize;

pub const VERSION: &str = "0.2.20-local";

#[derive(Serialize)]
struct Who<'a> {
    user_id: &'a str,
    active_org: Option<&'a str>,
}

#[derive(Serialize)]
struct Status<'a> {
    status: &'a str,
}

#[derive(Serialize)]
struct Version<'a> {
    version: &'a str,
}

pub fn whoami(ctx: &Ctx) -> Res<i32> {
    let lock = ctx.home.lock()?;
    let org = ctx.inv.global.org.as_deref();
    let who = Who { user_id: &lock.state.user_id, active_org: org };
    ctx.out.either(&who, || {
        format!("user: {} (boxd-local: no account)\norg: {}", who.user_id, org.unwrap_or("personal"))
    });
    Ok(0)
}

pub fn login(ctx: &Ctx) -> Res<i32> {
    let mut lock = ctx.home.lock()?;
    lock.state.signed_in = true;
    lock.save()?;
    let org = ctx.inv.global.org.as_deref();
    let who = Who { user_id: &lock.state.user_id, active_org: org };
    ctx.out.either(&who, || format!("Logged in as {} (boxd-local: no account, no browser)", who.user_id));
    Ok(0)
}

pub fn logout(ctx: &Ctx) -> Res<i32> {
    let mut lock = ctx.home.lock()?;
    lock.state.signed_in = false;
    lock.save()?;
    ctx.out.either(&Status { status: "logged_out" }, || "Logged out".to_string());
    Ok(0)
}

pub fn version(ctx: &Ctx) -> Res<i32> {
    ctx.out.either(&Version { version: VERSION }, || format!("boxd {VERSION}"));
    Ok(0)
}
