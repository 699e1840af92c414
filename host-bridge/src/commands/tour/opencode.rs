//! What `tour --keep DIR` leaves for OpenCode: the project's opencode.json (the plugin with
//! boxd-local and the tour's ledger, the scripted provider), OpenCode's config folders
//! seeded so it installs nothing at start, and `DIR/run-opencode`, the one command that
//! opens OpenCode there with this folder's own OpenCode data and the scripted model.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};

/// The package `npm pack` in host-bridge/opencode makes.
const PACKAGE: &str = "opencode-boxd";

/// The plugin the kept project loads, as the user named it.
pub enum Plugin {
    /// A tarball from `npm pack`: copied into DIR, so the project outlives the file.
    Tarball(PathBuf),
    /// A plugin folder (a checkout's host-bridge/opencode with its dist/ built).
    Folder(PathBuf),
    /// An npm spec OpenCode installs itself.
    Npm(String),
}

impl Plugin {
    /// `--plugin`, checked before the tour spends a minute: a path must exist.
    pub fn parse(spec: Option<&str>) -> Result<Plugin> {
        let Some(spec) = spec else { return Ok(Plugin::Npm(format!("{PACKAGE}@{}", env!("CARGO_PKG_VERSION")))) };
        let path = Path::new(spec);
        let looks_like_path = spec.starts_with(['.', '/', '~']) || spec.ends_with(".tgz");
        if !path.exists() {
            if looks_like_path {
                bail!("--plugin {spec}: no such file or folder (a tarball from `npm pack` in host-bridge/opencode, a plugin folder, or an npm spec)");
            }
            return Ok(Plugin::Npm(spec.to_string()));
        }
        let real = std::fs::canonicalize(path).with_context(|| format!("--plugin {spec}"))?;
        if real.is_dir() {
            if !real.join("package.json").exists() {
                bail!("--plugin {spec}: the folder has no package.json (name host-bridge/opencode, after npm run build)");
            }
            return Ok(Plugin::Folder(real));
        }
        // npm pack makes a gzip file; anything else would only fail inside OpenCode later.
        let mut magic = [0u8; 2];
        let gzip = std::fs::File::open(&real).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic)).is_ok() && magic == [0x1f, 0x8b];
        if !gzip {
            bail!("--plugin {spec}: not a tarball from `npm pack` (not gzip), nor a folder");
        }
        Ok(Plugin::Tarball(real))
    }
}

/// Where the tour keeps what OpenCode needs.
pub struct Kept<'a> {
    pub dir: &'a Path,
    pub laptop: &'a Path,
    pub project: &'a Path,
    pub ledger: &'a Path,
    pub boxd_home: &'a Path,
    pub boxd_local: &'a Path,
    pub opencode: &'a Path,
    pub opencode_version: &'a str,
    /// The guests' config: the laptop's OpenCode uses the same scripted provider.
    pub guest_config: &'a str,
}

/// Write the project's OpenCode wiring; returns the plugin spec it names and the command
/// that opens OpenCode there.
pub fn wire(k: &Kept, plugin: &Plugin) -> Result<(String, String)> {
    let spec = match plugin {
        Plugin::Tarball(file) => {
            let copy = k.dir.join(file.file_name().context("a tarball has a file name")?);
            if copy.exists() {
                bail!("{} exists already; the tarball is not copied over it", copy.display());
            }
            std::fs::copy(file, &copy).with_context(|| format!("copying {} into {}", file.display(), k.dir.display()))?;
            // An npm spec with a file: tarball: OpenCode 1.18 installs it into its cache.
            format!("{PACKAGE}@file:{}", copy.display())
        }
        Plugin::Folder(dir) => dir.display().to_string(),
        Plugin::Npm(spec) => spec.clone(),
    };
    let mut config: Value = serde_json::from_str(k.guest_config).context("host-bridge/tour/guest-opencode.json is JSON")?;
    config["plugin"] = json!([[spec, { "boxd": k.boxd_local, "ledgerDir": k.ledger }]]);
    write_new(&k.project.join("opencode.json"), &format!("{config:#}\n"))?;
    for dir in [k.laptop.join("config/opencode"), k.project.join(".opencode")] {
        seed_config_dir(&dir, k.opencode_version)?;
    }
    let script = k.dir.join("run-opencode");
    write_new(&script, &run_script(k))?;
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok((spec, sh_quote(&script.display().to_string())))
}

/// OpenCode installs @opencode-ai/plugin into every config folder (a network step of 20 s
/// and more) unless it finds it listed; the plugin imports nothing, so an empty
/// node_modules is enough (seen with opencode-ai 1.18.33).
fn seed_config_dir(dir: &Path, version: &str) -> Result<()> {
    std::fs::create_dir_all(dir.join("node_modules"))?;
    let deps = json!({ "@opencode-ai/plugin": version });
    write_new(&dir.join("package.json"), &json!({ "dependencies": deps }).to_string())?;
    write_new(&dir.join("package-lock.json"), &json!({ "lockfileVersion": 3, "packages": { "": { "dependencies": deps } } }).to_string())
}

/// Create `file`; one that exists is never overwritten (the tour's folder was new or empty).
fn write_new(file: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(file).with_context(|| format!("creating {}", file.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The script: this folder's HOME and XDG folders, BOXD_LOCAL_HOME, the scripted model
/// started on a free port (its address in boxd env too, for the guests) and stopped when
/// OpenCode exits, then opencode in the project with the script's arguments.
fn run_script(k: &Kept) -> String {
    let q = |p: &Path| sh_quote(&p.display().to_string());
    format!(
        r#"#!/bin/sh
# Written by `boxd-host tour --keep`: OpenCode in ./project with the opencode-boxd plugin,
# boxd-local as the boxd CLI (the tour's golden image is in it) and the scripted model.
# Arguments go to opencode: `run "a prompt"`, `serve`, or `-m provider/model` for your own
# model (export its key first; the guests keep the scripted one).
set -eu
dir={dir}
export HOME="$dir/laptop" XDG_DATA_HOME="$dir/laptop/data" XDG_CONFIG_HOME="$dir/laptop/config"
export XDG_CACHE_HOME="$dir/laptop/cache" XDG_STATE_HOME="$dir/laptop/state"
# Its temporary files too: OpenCode leaves native libraries it unpacks there.
export TMPDIR="$dir/laptop/tmp"
mkdir -p "$TMPDIR"
export BOXD_LOCAL_HOME={boxd_home} OPENCODE_DISABLE_MODELS_FETCH=1 OPENCODE_DISABLE_AUTOUPDATE=1
log="$dir/model.out"
: > "$log"
PORT=0 MODEL_LOG="$dir/model.jsonl" node "$dir/scripted-model.mjs" > "$log" &
model=$!
trap 'kill "$model" 2>/dev/null || true' EXIT
trap 'exit 130' INT TERM HUP
i=0
until grep -q 'listening on' "$log"; do
  i=$((i + 1))
  if [ "$i" -gt 100 ]; then echo "run-opencode: the scripted model did not start (see $log)" >&2; exit 1; fi
  sleep 0.1
done
SCRIPTED_MODEL_URL=$(sed -n 's/.*listening on \(http[^ ]*\).*/\1/p' "$log" | head -n 1)
export SCRIPTED_MODEL_URL SCRIPTED_MODEL_KEY=tour-key
{boxd_local} env set SCRIPTED_MODEL_URL "$SCRIPTED_MODEL_URL" > /dev/null
cd "$dir/project"
{opencode} "$@"
"#,
        dir = q(k.dir),
        boxd_home = q(k.boxd_home),
        boxd_local = q(k.boxd_local),
        opencode = q(k.opencode),
    )
}
