//! `boxd-host golden`: build the golden image the plugin requires — a machine whose
//! OpenCode is exactly the laptop's version — snapshot it, and remove the build machine.
//!
//! The guest's OpenCode config is written first, so a failed download costs only the
//! binary; the download is retried a bounded number of times and fails loudly; the model
//! credential stays in `boxd env` (the config names it as `{env:NAME}`), never in an
//! argument list or a log. The build machine is removed whatever happens.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};

/// Where OpenCode's release archives live; `{version}` and `{target}` are filled in.
pub const DEFAULT_URL: &str = "https://github.com/anomalyco/opencode/releases/download/v{version}/opencode-{target}.tar.gz";

#[derive(Clone, Debug)]
pub struct Spec {
    pub snapshot: String,
    pub opencode_version: String,
    /// The guest's global opencode.json.
    pub config: String,
    pub url: String,
    pub attempts: u32,
    pub retry_delay_s: u32,
    /// boxd env names the config reads (`{env:NAME}`); checked present, never read.
    pub key_env: Vec<String>,
}

/// Runs the boxd CLI with a given environment (the policy's child environment).
pub struct Cli<'a> {
    pub boxd: &'a Path,
    pub env: &'a [(String, String)],
}

pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Cli<'_> {
    pub fn run(&self, args: &[&str], stdin: Option<&[u8]>) -> Result<Run> {
        let mut cmd = Command::new(self.boxd);
        cmd.args(args).env_clear().envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() }).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().with_context(|| format!("cannot run {}", self.boxd.display()))?;
        if let Some(bytes) = stdin {
            use std::io::Write;
            let mut pipe = child.stdin.take().expect("piped");
            pipe.write_all(bytes)?;
        }
        let out = child.wait_with_output()?;
        Ok(Run { code: out.status.code(), stdout: String::from_utf8_lossy(&out.stdout).into(), stderr: String::from_utf8_lossy(&out.stderr).into() })
    }

    fn ok(&self, args: &[&str], stdin: Option<&[u8]>) -> Result<Run> {
        let r = self.run(args, stdin)?;
        if r.code != Some(0) {
            bail!("boxd {} failed: {}", args[..2.min(args.len())].join(" "), r.stderr.trim());
        }
        Ok(r)
    }
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The install script the build machine runs (config on stdin).
pub fn script(spec: &Spec) -> String {
    let url = spec.url.replace("{version}", &spec.opencode_version);
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
[ "$v" = {version} ] || {{ echo "golden: installed OpenCode $v, wanted {version_plain}" >&2; exit 1; }}
echo "golden: OpenCode $v installed after $n attempt(s)"
"#,
        url = sh_quote(&url),
        attempts = spec.attempts.max(1),
        delay = spec.retry_delay_s,
        version = sh_quote(&spec.opencode_version),
        version_plain = spec.opencode_version,
    )
}

/// Build the image. Returns a JSON report of every step; the build machine is removed
/// even when a step fails, and no snapshot is saved unless every step succeeded.
pub fn build(cli: &Cli, spec: &Spec, say: &mut dyn FnMut(&str)) -> Result<Value> {
    if cli.ok(&["snapshots", "list", "--json"], None)?.stdout.contains(&format!("\"name\":\"{}\"", spec.snapshot)) {
        bail!("a snapshot named '{}' exists already; snapshots are immutable, pick another name with --name", spec.snapshot);
    }
    if !spec.key_env.is_empty() {
        let listed = cli.ok(&["env", "list", "--json"], None)?.stdout;
        for k in &spec.key_env {
            if !listed.contains(&format!("\"name\":\"{k}\"")) {
                bail!("boxd env has no {k}: set it with 'boxd env set {k} <value> --secret' (the plugin never reads it)");
            }
        }
    }
    let machine = format!("golden-build-{}", std::process::id());
    say(&format!("creating build machine {machine}"));
    cli.ok(&["machine", "new", &machine, "--json"], None)?;
    let result = (|| -> Result<String> {
        say(&format!("writing the OpenCode config, then installing OpenCode {}", spec.opencode_version));
        let r = cli.run(&["machine", "exec", &machine, "--timeout", "1800", "--", "sh", "-c", &sh_quote(&script(spec))], Some(spec.config.as_bytes()))?;
        if r.code != Some(0) {
            bail!("installing OpenCode on the build machine failed (exit {:?}): {}", r.code, r.stderr.trim());
        }
        say(&format!("saving snapshot {}", spec.snapshot));
        cli.ok(&["snapshots", "save", &machine, &spec.snapshot], None)?;
        Ok(r.stdout.trim().to_string())
    })();
    say(&format!("removing build machine {machine}"));
    let removed = cli.run(&["machine", "remove", &machine, "-y"], None).map(|r| r.code == Some(0)).unwrap_or(false);
    let installed = result?;
    Ok(json!({ "snapshot": spec.snapshot, "opencode": spec.opencode_version, "install": installed, "buildMachineRemoved": removed }))
}

/// A minimal guest config: the model (provider/model) and no auto-update or sharing.
pub fn default_config(model: Option<&str>) -> String {
    let mut v = json!({ "$schema": "https://opencode.ai/config.json", "autoupdate": false, "share": "disabled" });
    if let Some(m) = model {
        v["model"] = json!(m);
    }
    serde_json::to_string_pretty(&v).expect("serialises")
}

pub fn read_config(path: &PathBuf) -> Result<String> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let v: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    // A literal key in the image would end up in every snapshot: insist on {env:NAME}.
    if text.contains("apiKey") && v.to_string().contains("\"apiKey\":\"") && !text.contains("{env:") {
        bail!("{} holds a literal apiKey; write \"{{env:NAME}}\" and keep the key in boxd env", path.display());
    }
    Ok(text)
}

/// `boxd-host golden …` against the boxd CLI the flags name.
pub fn command(f: &crate::cli::Flags) -> Result<u8> {
    let mut spec = Spec {
        snapshot: "opencode-golden".into(),
        opencode_version: String::new(),
        config: String::new(),
        url: DEFAULT_URL.into(),
        attempts: 3,
        retry_delay_s: 5,
        key_env: Vec::new(),
    };
    let (mut config_file, mut model) = (None, None);
    let mut it = f.command.iter().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--name" => spec.snapshot = value()?,
            "--opencode-version" => spec.opencode_version = value()?,
            "--config" => config_file = Some(PathBuf::from(value()?)),
            "--model" => model = Some(value()?),
            "--key-env" => spec.key_env.push(value()?),
            "--url" => spec.url = value()?,
            "--attempts" => spec.attempts = value()?.parse().context("--attempts takes a number")?,
            "--retry-delay" => spec.retry_delay_s = value()?.parse().context("--retry-delay takes seconds")?,
            other => bail!("golden: unknown argument {other} (boxd-host --help)"),
        }
    }
    let vars: Vec<(String, String)> = std::env::vars().collect();
    let path_var = std::env::var("PATH").ok();
    let boxd = match &f.boxd {
        Some(p) => p.clone(),
        None => crate::policy::find_on_path("boxd", path_var.as_deref()).context("no boxd CLI: install it and sign in, or give --boxd PATH")?,
    };
    if spec.opencode_version.is_empty() {
        let oc = match &f.opencode {
            Some(p) => p.clone(),
            None => crate::policy::find_on_path("opencode", path_var.as_deref()).context("no laptop opencode to take the version from: give --opencode-version V or --opencode PATH")?,
        };
        let out = Command::new(&oc).arg("--version").output().with_context(|| format!("cannot run {}", oc.display()))?;
        spec.opencode_version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    }
    spec.config = match config_file {
        Some(p) => read_config(&p)?,
        None => default_config(model.as_deref()),
    };
    let mut policy = crate::policy::Policy::new();
    policy.child_env_from(vars);
    let cli = Cli { boxd: &boxd, env: policy.child_env() };
    let report = build(&cli, &spec, &mut |s| eprintln!("golden: {s}"))?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}
