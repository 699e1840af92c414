//! One invocation, start to finish: parse, fault rules, noise, idle sweep, sign-in check,
//! dispatch, call log. The only place that prints failures and picks the exit code.

use crate::calllog::{self, Line};
use crate::cli::{self, Invocation, Parsed};
use crate::fail::{Fail, Res};
use crate::faults::{self, Action, Rule};
use crate::machines::{self, Landing};
use crate::output::{Out, UPDATE_NOTICE};
use crate::store::Home;
use crate::{auth, copy, envvars, exec, power, snapshots, util};
use std::io::Write;
use std::time::{Duration, Instant};

/// What a command gets: where state lives, what was asked, how to print.
pub struct Ctx<'a> {
    pub home: &'a Home,
    pub inv: &'a Invocation,
    pub out: &'a Out,
    pub landing: Landing,
}

/// Facts about the invocation that the call log records.
#[derive(Default)]
struct Note {
    fault: Option<&'static str>,
    logged: bool,
}

pub fn run(argv: Vec<String>) -> i32 {
    let started = Instant::now();
    let t = util::now_ms();
    let home = match Home::locate() {
        Ok(h) => h,
        Err(f) => return report(&f),
    };
    let mut note = Note::default();
    let code = match invoke(&home, &argv, &mut note, t) {
        Ok(c) => c,
        Err(f) => report(&f),
    };
    let _ = std::io::stdout().flush();
    if !note.logged {
        let duration_ms = Some(started.elapsed().as_millis() as u64);
        calllog::append(&home, &Line { t, argv: &argv, exit_code: code, duration_ms, fault: note.fault });
    }
    code
}

fn report(f: &Fail) -> i32 {
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "error: {}", f.message);
    if let Some(h) = &f.hint {
        let _ = writeln!(e, "{h}");
    }
    f.code
}

fn noise_on(home: &Home) -> bool {
    match std::env::var("BOXD_LOCAL_NOISE") {
        Ok(v) if !v.is_empty() => matches!(v.as_str(), "1" | "true" | "yes" | "on"),
        _ => std::fs::read(home.path("config.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v.get("noise").and_then(|n| n.as_bool()))
            .unwrap_or(false),
    }
}

fn invoke(home: &Home, argv: &[String], note: &mut Note, t: u64) -> Res<i32> {
    let inv = match cli::parse(argv)? {
        Parsed::Run(inv) => inv,
        // Help and completions: printed before any rule, sweep or sign-in check.
        Parsed::Print(text) => {
            // A closed pipe (`| head`) is the reader's choice, not a failure.
            let _ = std::io::stdout().write_all(text.as_bytes());
            return Ok(0);
        }
    };
    let out = Out::new(inv.global.json, noise_on(home));
    if out.noise {
        eprintln!("{UPDATE_NOTICE}");
    }
    let target = inv.target_machine();
    let rule = faults::take(&mut home.lock()?, inv.verb, target.as_deref())?;
    let mut landing = Landing::Normal;
    let mut forced_out = false;
    if let Some(rule) = rule {
        note.fault = Some(rule.action.name());
        match before_command(home, &inv, &out, &rule, target.as_deref(), argv, note, t)? {
            Some(code) => return Ok(code),
            None => {
                forced_out = rule.action == Action::SignedOut;
                if rule.action == Action::BootTimeout {
                    landing = Landing::Late { appear_after_ms: rule.appear_after_ms, starting_ms: rule.starting_ms };
                }
            }
        }
    }
    {
        let mut lock = home.lock()?;
        if power::sweep(&mut lock, util::now_ms())? {
            lock.save()?;
        }
        let token = inv.global.token.as_deref().is_some_and(|s| !s.is_empty())
            || std::env::var("BOXD_TOKEN").is_ok_and(|s| !s.is_empty());
        let signed_in = !forced_out && (lock.state.signed_in || token);
        if !signed_in && !matches!(inv.verb, "version" | "auth login") {
            return Err(Fail::new("not logged in"));
        }
    }
    dispatch(&Ctx { home, inv: &inv, out: &out, landing })
}

/// Carry out a fired rule. `Some(code)` ends the invocation here; `None` runs the command.
#[allow(clippy::too_many_arguments)]
fn before_command(
    home: &Home,
    inv: &Invocation,
    out: &Out,
    rule: &Rule,
    target: Option<&str>,
    argv: &[String],
    note: &mut Note,
    t: u64,
) -> Res<Option<i32>> {
    let new = inv.verb == "machine new";
    match rule.action {
        Action::Hang => {
            if rule.land && new {
                // The create lands even though boxd stopped answering; a failed create
                // (say, the name is taken) still hangs.
                let late = Landing::Late { appear_after_ms: rule.appear_after_ms, starting_ms: 0 };
                let _ = machines::create(&Ctx { home, inv, out, landing: late });
            }
            // Logged now: the caller usually kills us before the sleep ends.
            calllog::append(home, &Line { t, argv, exit_code: 124, duration_ms: rule.ms, fault: note.fault });
            note.logged = true;
            match rule.ms {
                Some(ms) => std::thread::sleep(Duration::from_millis(ms)),
                None => loop {
                    std::thread::sleep(Duration::from_secs(3600));
                },
            }
            Err(Fail::with_code(124, "timed out waiting for boxd.sh"))
        }
        Action::Fail if rule.land => {
            // The command acts, then the CLI fails anyway: boxd failing after it made the
            // machine (or removed it). Its own output is never printed.
            let quiet = Out { json: out.json, noise: false, discard: true };
            let _ = dispatch(&Ctx { home, inv, out: &quiet, landing: Landing::Normal });
            Err(Fail::with_code(rule.exit_code.unwrap_or(1), rule.message.clone().unwrap_or_else(|| "internal".to_string())))
        }
        Action::Fail => Err(Fail::with_code(
            rule.exit_code.unwrap_or(1),
            rule.message.clone().unwrap_or_else(|| "internal".to_string()),
        )),
        Action::Network => Err(Fail::new("cannot connect to https://boxd.sh:9443: dns error: not found")),
        Action::Garbage => {
            let text = rule.output.clone().unwrap_or_else(|| {
                "upstream connect error or disconnect/reset before headers. reset reason: connection termination"
                    .to_string()
            });
            out.line(&text);
            Ok(Some(0))
        }
        Action::Flood => {
            flood(rule)?;
            Ok(Some(rule.exit_code.unwrap_or(0)))
        }
        Action::Delay if rule.land => {
            // The command acts at once and answers late: a slow fork that holds its name
            // from its start.
            let done = dispatch(&Ctx { home, inv, out, landing: Landing::Normal });
            std::thread::sleep(Duration::from_millis(rule.ms.unwrap_or(0)));
            done.map(Some)
        }
        Action::Delay => {
            std::thread::sleep(Duration::from_millis(rule.ms.unwrap_or(0)));
            Ok(None)
        }
        Action::BootTimeout if new => Ok(None),
        Action::BootTimeout => Err(Fail::new(format!(
            "fault rule: boot_timeout applies only to 'machine new', not '{}'",
            inv.verb
        ))),
        Action::LoseMachine => {
            if let Some(victim) = rule.machine.as_deref().or(target) {
                let mut lock = home.lock()?;
                machines::vanish(&mut lock, victim)?;
            }
            Ok(None)
        }
        Action::SignedOut => {
            let mut lock = home.lock()?;
            lock.state.signed_in = false;
            lock.save()?;
            Ok(None)
        }
    }
}

/// The `flood` fault: a CLI that will not stop talking (a proxy's error page on repeat, a
/// debug log left on). Lines of noise until `bytes` are out or the reader has gone.
fn flood(rule: &Rule) -> Res<()> {
    let line = b"upstream connect error or disconnect/reset before headers. reset reason: connection termination\n";
    let mut left = rule.bytes.unwrap_or(80 << 20);
    let chunk: Vec<u8> = line.iter().copied().cycle().take(64 * 1024).collect();
    let mut to: Box<dyn Write> = match rule.stream.as_deref() {
        None | Some("stdout") => Box::new(std::io::stdout().lock()),
        Some("stderr") => Box::new(std::io::stderr().lock()),
        Some(other) => return Err(Fail::new(format!("fault rule: flood's stream is stdout or stderr, not '{other}'"))),
    };
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        if to.write_all(&chunk[..n]).is_err() {
            break; // the reader stopped listening: that is the point
        }
        left -= n as u64;
    }
    let _ = to.flush();
    Ok(())
}

fn dispatch(ctx: &Ctx) -> Res<i32> {
    match ctx.inv.verb {
        "auth" => auth::whoami(ctx),
        "auth login" => auth::login(ctx),
        "auth logout" => auth::logout(ctx),
        "version" => auth::version(ctx),
        "machine new" => machines::new(ctx),
        "machine list" => machines::list(ctx),
        "machine get" => machines::get(ctx),
        "machine exec" => exec::exec(ctx),
        "machine cp" => copy::cp(ctx),
        "machine remove" => machines::remove(ctx),
        "machine fork" => machines::fork(ctx),
        "machine config set" => machines::config_set(ctx),
        "machine start" | "machine stop" | "machine reboot" | "machine pause" | "machine resume"
        | "machine hibernate" | "machine wake" => power::change(ctx),
        "snapshots save" => snapshots::save(ctx),
        "snapshots list" => snapshots::list(ctx),
        "snapshots remove" => snapshots::remove(ctx),
        "env set" => envvars::set(ctx),
        "env list" => envvars::list(ctx),
        "env rm" => envvars::rm(ctx),
        "env scope" => envvars::scope(ctx),
        other => Err(Fail::new(format!("'{other}' is not implemented by boxd-local"))),
    }
}
