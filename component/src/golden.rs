//! Building the golden image (an operation hosts call for `boxd-host golden` and the tour,
//! never a model's tool): a machine with exactly the laptop's OpenCode, snapshotted, the
//! build machine removed whatever happens. It goes through the one boxd adapter, so every
//! spawn is granted by the host's policy and written to its audit log.
//!
//! The guest's OpenCode config is written first, so a failed download costs only the
//! binary; the download is retried a bounded number of times and fails loudly; the model
//! credential stays in `boxd env` (the config names it as `{env:NAME}`), never in an
//! argument list or a log.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::boxd::{sh_quote, version_number, Boxd, Capture, Failure, Made};
use crate::caps::{Files, Programs};
use crate::errors::{Code, ToolError, ToolResult};
use crate::ledger::{BuildMachine, Ledger};
use crate::options::Context;

/// Where OpenCode's release archives live; `{version}` and `{target}` are filled in.
pub const DEFAULT_URL: &str = "https://github.com/anomalyco/opencode/releases/download/v{version}/opencode-{target}.tar.gz";
/// The install script's own bound on the build machine (a slow download included).
const INSTALL_SECONDS: u32 = 1800;

/// What the host asks for (docs/golden-image.md); every field but `snapshot` has a default.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    #[serde(default = "default_snapshot")]
    pub snapshot: String,
    /// Default: the laptop's `opencode --version`.
    #[serde(default)]
    pub opencode_version: Option<String>,
    /// The guest's global opencode.json, as text. Default: a minimal config naming `model`.
    #[serde(default)]
    pub config: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default = "default_url")]
    pub url: String,
    #[serde(default = "default_attempts")]
    pub attempts: u32,
    #[serde(default = "default_retry_delay")]
    pub retry_delay_seconds: u32,
    /// boxd env names the config reads (`{env:NAME}`): checked present, never read.
    #[serde(default)]
    pub key_env: Vec<String>,
}

fn default_snapshot() -> String {
    "opencode-golden".into()
}
fn default_url() -> String {
    DEFAULT_URL.into()
}
fn default_attempts() -> u32 {
    3
}
fn default_retry_delay() -> u32 {
    5
}

fn spec_error(why: impl Into<String>) -> ToolError {
    ToolError::with_next(Code::ArgsInvalid, why, "Fix the golden image spec (boxd-host golden --help lists the flags), then run it again.")
}

impl Spec {
    pub fn parse(json: &str) -> ToolResult<Spec> {
        let spec: Spec = serde_json::from_str(json).map_err(|e| spec_error(format!("the golden image spec is not valid: {e}")))?;
        if !crate::paths::is_snapshot_name(&spec.snapshot) {
            return Err(ToolError::new(Code::NameInvalid, format!("snapshot name '{}' is not valid", spec.snapshot)));
        }
        if spec.attempts == 0 || spec.attempts > 20 {
            return Err(spec_error("attempts must be between 1 and 20"));
        }
        if let Some(bad) = spec.key_env.iter().find(|k| !is_env_name(k)) {
            return Err(spec_error(format!("'{bad}' is not a boxd env name ([A-Za-z_][A-Za-z0-9_]*)")));
        }
        if let Some(v) = &spec.opencode_version {
            if !is_version(v) {
                return Err(spec_error(format!("'{v}' is not an OpenCode version (digits and dots)")));
            }
        }
        if let Some(text) = &spec.config {
            check_config(text)?;
        }
        Ok(spec)
    }
}

fn is_env_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_') && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// A version goes into a shell script and a URL: digits, dots and a pre-release tail only.
fn is_version(s: &str) -> bool {
    !s.is_empty() && s.len() <= 40 && s.bytes().all(|c| c.is_ascii_alphanumeric() || b".-+".contains(&c)) && s.as_bytes()[0].is_ascii_digit()
}

/// The config must be JSON, and a literal key would end up in every snapshot: insist on
/// `{env:NAME}` for any `apiKey`.
pub fn check_config(text: &str) -> ToolResult<()> {
    let v: Value = serde_json::from_str(text).map_err(|e| spec_error(format!("the guest config is not JSON: {e}")))?;
    if let Some(path) = literal_key(&v, "") {
        return Err(ToolError::with_next(
            Code::ArgsInvalid,
            format!("the guest config holds a literal apiKey at {path}"),
            "Write \"{env:NAME}\" as the apiKey and keep the key in boxd env (boxd env set NAME … --secret), then run golden again.",
        ));
    }
    Ok(())
}

fn literal_key(v: &Value, at: &str) -> Option<String> {
    match v {
        Value::Object(m) => m.iter().find_map(|(k, x)| {
            let here = format!("{at}/{k}");
            match x {
                Value::String(s) if k == "apiKey" && !s.starts_with("{env:") => Some(here),
                _ => literal_key(x, &here),
            }
        }),
        Value::Array(a) => a.iter().enumerate().find_map(|(i, x)| literal_key(x, &format!("{at}/{i}"))),
        _ => None,
    }
}

/// A minimal guest config: the model (provider/model) and no auto-update or sharing.
pub fn default_config(model: Option<&str>) -> String {
    let mut v = json!({ "$schema": "https://opencode.ai/config.json", "autoupdate": false, "share": "disabled" });
    if let Some(m) = model {
        v["model"] = json!(m);
    }
    serde_json::to_string_pretty(&v).expect("a config serialises")
}

/// The install script the build machine runs (config on stdin).
pub fn script(spec: &Spec, version: &str) -> String {
    let url = spec.url.replace("{version}", version);
    format!(
        r#"set -eu
mkdir -p "$HOME/.config/opencode"
cat > "$HOME/.config/opencode/opencode.json"
case "$(uname -m)" in
  x86_64|amd64) target=linux-x64 ;;
  aarch64|arm64) target=linux-arm64 ;;
  *) echo "golden: unsupported architecture $(uname -m)" >&2; exit 1 ;;
esac
url=$(printf '%s' {url} | sed "s/{{target}}/$target/")
mkdir -p "$HOME/.opencode/bin" "$HOME/.local/bin"
archive=$(mktemp)
n=1
until curl -fsSL --connect-timeout 10 --max-time 600 -o "$archive" "$url"; do
  if [ "$n" -ge {attempts} ]; then
    echo "golden: the OpenCode download failed after $n attempts: $url" >&2
    rm -f "$archive"; exit 1
  fi
  echo "golden: download attempt $n failed; retrying" >&2
  sleep $((n * {delay}))
  n=$((n + 1))
done
tar -xzf "$archive" -C "$HOME/.opencode/bin"
rm -f "$archive"
chmod +x "$HOME/.opencode/bin/opencode"
# Relative, so the link still points home in a machine restored from the snapshot.
ln -sf ../../.opencode/bin/opencode "$HOME/.local/bin/opencode"
v=$("$HOME/.local/bin/opencode" --version)
[ "$v" = {version_q} ] || {{ echo "golden: installed OpenCode $v, wanted {version}" >&2; exit 1; }}
echo "golden: OpenCode $v installed after $n attempt(s)"
"#,
        url = sh_quote(&url),
        attempts = spec.attempts,
        delay = spec.retry_delay_seconds,
        version_q = sh_quote(version),
    )
}

/// Build the image. The answer reports every step; the build machine is removed even when
/// a step fails (the error says whether it went), and no snapshot is saved unless every
/// step succeeded.
pub fn build<P: Programs, F: Files>(programs: &mut P, files: &mut F, ctx: &Context, spec_json: &str) -> ToolResult<Value> {
    let spec = Spec::parse(spec_json)?;
    let mut steps: Vec<String> = Vec::new();
    let version = match &spec.opencode_version {
        Some(v) => v.clone(),
        None => laptop_opencode(programs, ctx)?,
    };
    let config = spec.config.clone().unwrap_or_else(|| default_config(spec.model.as_deref()));
    let mut boxd = Boxd::new(programs, ctx.options.boxd_timeout_seconds);
    let mut ledger = Ledger::for_call(files, ctx);
    let earlier = remove_left_behind(&mut boxd, &mut ledger, ctx, &mut steps)?;
    if boxd.snapshots().map_err(|f| f.into_error())?.iter().any(|s| s.name == spec.snapshot) {
        return Err(ToolError::with_next(
            Code::SnapshotExists,
            format!("a snapshot named '{}' exists already", spec.snapshot),
            "Snapshots are immutable: pick another name with --name (and set the snapshot option to it).",
        ));
    }
    if !spec.key_env.is_empty() {
        let names = boxd.env_names().map_err(|f| f.into_error())?;
        if let Some(k) = spec.key_env.iter().find(|k| !names.contains(k)) {
            return Err(ToolError::with_next(
                Code::GoldenFailed,
                format!("boxd env has no {k}"),
                format!("Set it with 'boxd env set {k} <value> --secret' (the plugin never reads it), then run golden again."),
            ));
        }
    }
    let machine = format!("golden-build-{}", &crate::encode::hex(&ctx.entropy)[..12.min(ctx.entropy.len() * 2)]);
    steps.push(format!("creating build machine {machine}"));
    // Written down before boxd is asked, so a host killed from here on leaves a machine the
    // next build can find and remove (remove_left_behind).
    let mut record = BuildMachine { machine: machine.clone(), id: None, started_at_ms: ctx.now_ms, ended: false };
    ledger.note_build_machine(&record)?;
    record.id = match boxd.create_bare(&machine) {
        Ok(id) => id,
        Err(f) => return Err(create_failed(&mut boxd, &mut ledger, &record, f)),
    };
    if record.id.is_some() {
        ledger.note_build_machine(&record)?;
    }
    steps.push(format!("writing the OpenCode config, then installing OpenCode {version}"));
    let installed = install(&mut boxd, &machine, &spec, &version, &config, &mut steps);
    if let Err(Stop { error, landing: true }) = installed {
        // A capture may still be landing: removing the machine would abort it and leave the
        // name stuck pending. Its record stays as it is (not ended), so a later build removes
        // it once this build is certainly over (`abandoned_after_ms`).
        steps.push(format!("leaving build machine {machine}: its capture may still be landing"));
        return Err(error);
    }
    steps.push(format!("removing build machine {machine}"));
    let removed = boxd.remove(&machine).is_ok();
    // A record that stays is handled by the next build: found gone and forgotten, or removed.
    let _ = if removed { ledger.forget_build_machine(&machine) } else { ledger.note_build_machine(&BuildMachine { ended: true, ..record }) };
    let installed = installed.map_err(|Stop { mut error, .. }| {
        if !removed {
            error.message = format!("{}; the build machine {machine} could not be removed: remove it with 'boxd machine remove {machine} -y'", error.message);
        }
        error
    })?;
    Ok(json!({
        "snapshot": spec.snapshot,
        "opencode": version,
        "install": installed,
        "buildMachineRemoved": removed,
        "earlierBuildMachines": earlier,
        "steps": steps,
        "boxdCalls": boxd.calls,
    }))
}

/// How many times a save that timed out is looked for in the listing before the build
/// gives up on knowing how it ended.
const SAVE_LOOKS: u32 = 3;

/// A build's recorded machine is certainly abandoned once this long has passed: the sum of
/// the timeouts of a build's own calls (new and its `get`, the install, the second look at
/// the snapshot name, the save (five), the look at its version or failure and its looks,
/// remove), plus a margin for the host's own work. A younger one may belong to a build
/// still running.
fn abandoned_after_ms(ctx: &Context) -> u64 {
    let boxd = u64::from(ctx.options.boxd_timeout_seconds);
    (u64::from(INSTALL_SECONDS) + (10 + u64::from(SAVE_LOOKS)) * boxd + 600) * 1000
}

/// A `machine new` of the build machine that failed or timed out may have landed all the
/// same: one `get` of its name, and it is removed when it is there (the name is this
/// build's own `golden-build-<hex>`, made a moment ago). The error names the machine either
/// way; the record stays for the next build whenever the machine may still be there.
fn create_failed<P: Programs, F: Files>(boxd: &mut Boxd<'_, P>, ledger: &mut Ledger<'_, F>, record: &BuildMachine, f: Failure) -> ToolError {
    let machine = &record.machine;
    let timed_out = matches!(f, Failure::Timeout(_));
    let mut e = f.into_error();
    let fate = match boxd.get(machine) {
        Ok(Some(_)) if is_build_machine_name(machine) => match boxd.remove(machine) {
            Ok(()) => {
                let _ = ledger.forget_build_machine(machine);
                format!("build machine {machine} had been made all the same, and was removed")
            }
            Err(r) => {
                let _ = ledger.note_build_machine(&BuildMachine { ended: true, ..record.clone() });
                format!("build machine {machine} had been made all the same, and could not be removed ({}): remove it with 'boxd machine remove {machine} -y' (the next golden build tries too)", r.into_error().message)
            }
        },
        Ok(None) if !timed_out => {
            let _ = ledger.forget_build_machine(machine);
            format!("build machine {machine} was not made")
        }
        // A create that timed out may still land after the look.
        Ok(_) => {
            let _ = ledger.note_build_machine(&BuildMachine { ended: true, ..record.clone() });
            format!("build machine {machine} was not there yet and may still appear: the next golden build removes it, or remove it with 'boxd machine remove {machine} -y'")
        }
        Err(g) => {
            let _ = ledger.note_build_machine(&BuildMachine { ended: true, ..record.clone() });
            format!("whether build machine {machine} was made is not known ({}): the next golden build removes it, or remove it with 'boxd machine remove {machine} -y'", g.into_error().message)
        }
    };
    e.message = format!("creating the build machine failed: {}; {fate}", e.message);
    e
}

/// Only names a build makes: a record edited to name another machine is never acted on.
fn is_build_machine_name(name: &str) -> bool {
    name.strip_prefix("golden-build-").is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// Remove the build machines of earlier builds that were killed before their own cleanup.
/// One is removed only when the ledger recorded it, its build is certainly over, and boxd's
/// machine of that name is the one recorded (same id when the id was recorded). Returns
/// what happened to each, for the answer; a boxd failure here is reported, not fatal.
fn remove_left_behind<P: Programs, F: Files>(boxd: &mut Boxd<'_, P>, ledger: &mut Ledger<'_, F>, ctx: &Context, steps: &mut Vec<String>) -> ToolResult<Vec<Value>> {
    let mut out = Vec::new();
    for m in ledger.build_machines()? {
        if !is_build_machine_name(&m.machine) {
            continue;
        }
        let age = ctx.now_ms.saturating_sub(m.started_at_ms);
        let outcome = if !m.ended && age < abandoned_after_ms(ctx) {
            format!("left alone: its build started {} min ago and may still be running", age / 60_000)
        } else {
            match boxd.get(&m.machine) {
                Ok(None) => {
                    ledger.forget_build_machine(&m.machine)?;
                    "already gone".to_string()
                }
                Ok(Some(live)) if m.id.as_ref().is_some_and(|id| *id != live.id) => {
                    // The name was freed and taken again: that machine is not ours.
                    ledger.forget_build_machine(&m.machine)?;
                    format!("left alone: boxd's machine of that name has id {}, not the recorded {}", live.id, m.id.as_deref().unwrap_or_default())
                }
                Ok(Some(_)) => match boxd.remove(&m.machine) {
                    Ok(()) => {
                        ledger.forget_build_machine(&m.machine)?;
                        "removed".to_string()
                    }
                    Err(f) => format!("could not be removed ({}); the next build tries again", f.into_error().message),
                },
                Err(f) => format!("could not be checked ({}); the next build tries again", f.into_error().message),
            }
        };
        steps.push(format!("build machine {} of an interrupted build: {outcome}", m.machine));
        out.push(json!({ "machine": m.machine, "outcome": outcome }));
    }
    Ok(out)
}

/// The laptop's OpenCode version, from the laptop OpenCode adapter (the host's word, else
/// `opencode --version`), checked before it reaches the install script.
fn laptop_opencode<P: Programs>(programs: &mut P, ctx: &Context) -> ToolResult<String> {
    let v = crate::opencode::Opencode::new(programs).version(ctx);
    v.filter(|v| is_version(v)).ok_or_else(|| {
        ToolError::with_next(Code::OpencodeMissing, "no laptop OpenCode answered --version", "Give the version with --opencode-version, or the laptop's OpenCode with --opencode PATH.")
    })
}

/// Why the install (or its save) stopped; `landing`: the save's capture may still be
/// landing, so the build machine must not be removed yet.
struct Stop {
    error: ToolError,
    landing: bool,
}

impl From<ToolError> for Stop {
    fn from(error: ToolError) -> Self {
        Stop { error, landing: false }
    }
}

fn install<P: Programs>(boxd: &mut Boxd<'_, P>, machine: &str, spec: &Spec, version: &str, config: &str, steps: &mut Vec<String>) -> Result<String, Stop> {
    let run = boxd.exec(machine, &["sh", "-c", &script(spec, version)], Some(config.as_bytes().to_vec()), INSTALL_SECONDS).map_err(|f| f.into_error())?;
    if run.exit_code != Some(0) {
        let said = String::from_utf8_lossy(&run.stderr);
        return Err(ToolError::new(
            Code::GoldenFailed,
            format!("installing OpenCode on the build machine failed ({}): {}", crate::guest::exit_words(run.exit_code), crate::guest::tail(said.trim().as_bytes())),
        )
        .into());
    }
    let out = String::from_utf8_lossy(&run.stdout).trim().to_string();
    let name = &spec.snapshot;
    // A second look: the install took up to half an hour, and a save under a name someone
    // made meanwhile would become a new version of their snapshot.
    if boxd.snapshots().map_err(|f| f.into_error())?.iter().any(|s| s.name == *name) {
        return Err(ToolError::with_next(
            Code::SnapshotExists,
            format!("a snapshot named '{name}' appeared while OpenCode was installed on the build machine; nothing was saved"),
            "Snapshots are immutable: pick another name with --name (and set the snapshot option to it).",
        )
        .into());
    }
    steps.push(format!("saving snapshot {name}"));
    match boxd.snapshot_save(machine, name) {
        Ok(answered) => match boxd.made(name, answered) {
            Made::First => Ok(out),
            made => Err(not_ours(name, &made).into()),
        },
        Err(Failure::Timeout(m)) => save_ended_unsaid(boxd, machine, name, "timed out", m, steps).map(|()| out),
        Err(f) => save_failed(boxd, machine, name, f, steps).map(|()| out),
    }
}

/// A save whose version is not `v1` (or not known): the snapshot is not this build's own.
/// boxd has no command to delete one version of a snapshot (and the host grants this
/// plugin no snapshot removal), so the answer says exactly what was added where.
fn not_ours(name: &str, made: &Made) -> ToolError {
    let next = "Build again under another name with --name (and set the snapshot option to it).";
    let added = |what: String| {
        ToolError::with_next(
            Code::SnapshotExists,
            format!("a snapshot named '{name}' was made by someone else between this build's last look at the name and its save: {what}. Machines booted from '{name}' now get this build's capture, not theirs; boxd has no command to remove one version, so tell whoever made '{name}' (saving their machine under it again makes theirs the newest). This build does not count it as made"),
            next,
        )
    };
    let why = match made {
        Made::Later(n) => return added(format!("boxd added version v{n} of '{name}', this build's capture")),
        Made::Shared(n) => return added(format!("boxd lists '{name}' at version v{n}, and which version is this build's capture boxd did not say")),
        Made::Unknown { why, .. } => why.as_str(),
        Made::First => "",
    };
    ToolError::with_next(
        Code::BoxdFailed,
        format!("snapshot '{name}' was saved, but which version this build made is not known ({why}): a name someone made meanwhile would have been given a version, so the build does not count it as made"),
        format!("Look at 'boxd snapshots list': '{name}' at v1 is this build's capture; at any later version, build again under another name with --name."),
    )
}

/// A save boxd answered with a failure (not a timeout) may have landed all the same (boxd
/// failing after it acted): one look at the listing. Ready at `v1` (the name was free at
/// the look just before the save) is taken as this build's; pending is left to land as
/// after a timeout; anything else is the failure.
fn save_failed<P: Programs>(boxd: &mut Boxd<'_, P>, machine: &str, name: &str, f: Failure, steps: &mut Vec<String>) -> Result<(), Stop> {
    let e = f.into_error();
    let listed = boxd.snapshots().ok().and_then(|l| l.into_iter().find(|s| s.name == name));
    match listed {
        Some(s) if s.capture() == Capture::Ready && version_number(&s.version) == Some(1) => {
            steps.push(format!("the save answered a failure ({}), but boxd lists snapshot {name} ready at v1, and the name was free just before the save: it is this build's", e.message));
            Ok(())
        }
        Some(s) if s.capture() == Capture::Pending => save_ended_unsaid(boxd, machine, name, "failed", e.message, steps),
        Some(s) => {
            let mut e = e;
            e.message = format!("{}; boxd lists snapshot '{name}' as {:?} at version {:?}, which this build cannot tell is its own", e.message, crate::redact::redact(&s.status, 40), crate::redact::redact(&s.version, 40));
            Err(e.into())
        }
        None => Err(e.into()),
    }
}

/// A save that timed out (or failed while boxd lists its capture pending) may still be
/// landing: its snapshot is looked for in the listing (up to `SAVE_LOOKS` times, each
/// bounded by the boxd timeout) until boxd holds it ready (the build goes on, if at `v1`:
/// the name was free at the look just before the save) or failed (the build machine is
/// removed). Otherwise the machine is left for the capture, which removing it would abort.
fn save_ended_unsaid<P: Programs>(boxd: &mut Boxd<'_, P>, machine: &str, name: &str, how: &str, why: String, steps: &mut Vec<String>) -> Result<(), Stop> {
    let mut seen = String::from("no answer");
    for n in 1..=SAVE_LOOKS {
        steps.push(format!("the save {how} ({why}); looking for snapshot {name} in boxd's listing ({n} of {SAVE_LOOKS})"));
        match boxd.snapshots() {
            Ok(list) => match list.iter().find(|s| s.name == name) {
                Some(s) if s.capture() == Capture::Ready => {
                    return match version_number(&s.version) {
                        Some(1) => {
                            steps.push(format!("snapshot {name} is ready at v1"));
                            Ok(())
                        }
                        Some(v) => Err(not_ours(name, &Made::Shared(v)).into()),
                        None => Err(not_ours(name, &Made::Unknown { why: format!("boxd lists it ready at version {:?}", crate::redact::redact(&s.version, 40)), retry: false }).into()),
                    };
                }
                Some(s) if s.capture() == Capture::Failed => {
                    return Err(ToolError::with_next(
                        Code::GoldenFailed,
                        format!("saving snapshot '{name}' {how} ({why}), and boxd lists it as failed: no snapshot was saved"),
                        "Build again under another name (--name): boxd holds the failed save under this one.",
                    )
                    .into());
                }
                Some(s) => seen = format!("status {:?}", crate::redact::redact(&s.status, 40)),
                None => seen = "not listed".into(),
            },
            Err(f) => seen = format!("the listing failed: {}", f.into_error().message),
        }
    }
    Err(Stop {
        error: ToolError::with_next(
            Code::Timeout,
            format!("saving snapshot '{name}' {how} ({why}), and boxd's listing did not show it ready or failed ({seen}); the build machine {machine} was left running, since removing it would abort a capture still landing"),
            format!("Look at 'boxd snapshots list' in a few minutes: once '{name}' shows ready it is made (failed or absent: build again under another name). Then remove {machine} with 'boxd machine remove {machine} -y'; the next golden build removes it too, once this build is certainly over."),
        ),
        landing: true,
    })
}

#[cfg(test)]
mod tests;
