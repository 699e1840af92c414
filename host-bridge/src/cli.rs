//! The `boxd-host` command line: flags → policy and context, then one command.
//! Exit codes: 0 ok, 1 the tool returned an error, 2 usage or host failure.

use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};

use crate::audit::{self, AuditLog};
use crate::runtime::{CallContext, Runtime};

pub const USAGE: &str = "\
boxd-host: run the opencode-boxd component outside OpenCode (unofficial; not affiliated with boxd)

usage: boxd-host [FLAGS] <command>

commands:
  describe                 the manifest (tools, schemas, read/change), as JSON
  call TOOL [ARGS_JSON]    one tool call; prints its JSON result; on a tool error prints
                           {\"error\",\"message\",\"next\"} and exits 1; ARGS_JSON '-' reads stdin
  audit [--json]           what the plugin can touch: the component's imports and exports,
                           the programs it may run and the folders it may open
  mcp                      serve every tool over MCP on stdio (for Claude Code, Codex, …)
  tour [--keep DIR]        the whole product on boxd-local with a scripted model: golden
                           image, ensure, submit (with a file), job, harvest, drop, audit
  golden [--name N] [--opencode-version V] [--config FILE] [--model P/M] [--key-env NAME]
         [--url TEMPLATE] [--attempts N] [--retry-delay S]
                           build the golden image: a machine with this laptop's OpenCode

flags:
  --component PATH   the component (default: the one built into this binary)
  --project DIR      the project folder (default: the current directory)
  --ledger DIR       the ledger folder (default: ~/.local/share/opencode-boxd)
  --boxd PATH        the boxd CLI (default: boxd on PATH)
  --opencode PATH    the laptop's opencode (default: opencode on PATH)
  --allow-root DIR   another folder the plugin may read and write (repeatable)
  --options JSON     plugin options, as in opencode.json (see docs/configuration.md)
  --audit-log FILE   append one JSON line per tool call: spawns and paths it touched
  --no-cache         do not use the compiled-component cache
  -h, --help         this text;  -V, --version  the version

exit codes: 0 ok, 1 the tool returned an error, 2 usage or host failure
";

#[derive(Debug, Default)]
pub struct Flags {
    pub component: Option<PathBuf>,
    pub project: Option<PathBuf>,
    pub ledger: Option<PathBuf>,
    pub boxd: Option<PathBuf>,
    pub opencode: Option<PathBuf>,
    pub allow_roots: Vec<PathBuf>,
    pub options: Option<String>,
    pub audit_log: Option<PathBuf>,
    pub no_cache: bool,
    pub command: Vec<String>,
}

pub enum Parsed {
    Help,
    Version,
    Run(Flags),
}

pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Parsed> {
    let mut f = Flags::default();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().with_context(|| format!("{name} needs a value"));
        match a.as_str() {
            "-h" | "--help" if f.command.is_empty() => return Ok(Parsed::Help),
            "-V" | "--version" if f.command.is_empty() => return Ok(Parsed::Version),
            "--component" => f.component = Some(value("--component")?.into()),
            "--project" => f.project = Some(value("--project")?.into()),
            "--ledger" => f.ledger = Some(value("--ledger")?.into()),
            "--boxd" => f.boxd = Some(value("--boxd")?.into()),
            "--opencode" => f.opencode = Some(value("--opencode")?.into()),
            "--allow-root" => f.allow_roots.push(value("--allow-root")?.into()),
            "--options" => f.options = Some(value("--options")?),
            "--audit-log" => f.audit_log = Some(value("--audit-log")?.into()),
            "--no-cache" => f.no_cache = true,
            s if s.starts_with("--") && f.command.is_empty() => bail!("unknown flag {s} (boxd-host --help lists them)"),
            _ => f.command.push(a),
        }
    }
    if f.command.is_empty() {
        bail!("no command given (boxd-host --help lists them)");
    }
    Ok(Parsed::Run(f))
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/"))
}

/// Where compiled components are kept (`BOXD_HOST_CACHE` overrides).
fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("BOXD_HOST_CACHE") {
        return PathBuf::from(dir);
    }
    std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| home().join(".cache")).join("opencode-boxd")
}

/// Everything a command needs: the loaded runtime and the call context.
pub struct Host {
    pub runtime: Runtime,
    pub ctx: CallContext,
    pub audit: AuditLog,
}

impl Host {
    pub fn open(f: &Flags) -> Result<Host> {
        Self::open_env(f, std::env::vars().collect())
    }

    /// Open with an explicit environment: children inherit the policy's share of `vars`.
    pub fn open_env(f: &Flags, vars: Vec<(String, String)>) -> Result<Host> {
        let request = crate::policy::GrantRequest {
            programs: [("boxd", &f.boxd), ("opencode", &f.opencode)].into_iter().filter_map(|(n, p)| Some((n.to_string(), p.clone()?))).collect(),
            project: f.project.clone().unwrap_or_default(),
            ledger: f.ledger.clone(),
            allow_roots: f.allow_roots.clone(),
            options: f.options.clone(),
            env: vars,
            cwd: std::env::current_dir().context("the current directory is gone")?,
        };
        let crate::policy::Grants { policy, project, ledger, component_options: options } = crate::policy::resolve(&request)?;

        let wasm = match &f.component {
            Some(p) => std::fs::read(p).with_context(|| format!("cannot read the component {}", p.display()))?,
            None => crate::COMPONENT.to_vec(),
        };
        let cache = (!f.no_cache).then(cache_dir);
        let runtime = Runtime::load(&wasm, policy, cache.as_deref())?;
        let ctx = CallContext {
            host_name: "boxd-host".into(),
            host_version: env!("CARGO_PKG_VERSION").into(),
            options_json: options.to_string(),
            project: project.display().to_string(),
            ledger: ledger.display().to_string(),
            session_id: None,
            now_ms: 0,
            entropy: Vec::new(),
            // The command line is the user's approval of the call it names.
            host_facts_json: json!({ "approved": true }).to_string(),
        };
        Ok(Host { runtime, ctx, audit: AuditLog::open(f.audit_log.as_deref())? })
    }

    /// One tool call with the audit line written; the tool's JSON or its error object. A
    /// trap in the component (a panic, an out-of-memory) is answered as HOST_FAILED with
    /// the one next step every host gives (policy.json `hostFailed`), never as a backtrace.
    pub fn call(&mut self, tool: &str, args: &str) -> Result<std::result::Result<Value, Value>> {
        let mut ctx = self.ctx.clone();
        ctx.now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        ctx.entropy = entropy();
        let started = Instant::now();
        let (result, trace) = self.runtime.call_traced(tool, args, &ctx);
        let ms = started.elapsed().as_millis() as u64;
        let answer = match result {
            Ok(Ok(s)) => Ok(serde_json::from_str(&s).unwrap_or(Value::String(s))),
            Ok(Err(e)) => Err(json!({ "error": e.code, "message": e.message, "next": e.next })),
            Err(trap) => Err(crate::policy::host_failed(tool, trap_message(&trap))),
        };
        let code = answer.as_ref().map(drop).map_err(|e| e["error"].as_str().unwrap_or_default().to_string());
        self.audit.record(tool, ms, &code, &trace);
        Ok(answer)
    }
}

/// A trap in one line: wasmtime's own words ("wasm trap: wasm `unreachable` instruction
/// executed") without the wasm backtrace that follows them.
pub fn trap_message(e: &anyhow::Error) -> String {
    let trap = e.downcast_ref::<wasmtime::Trap>().map(|t| t.to_string());
    let first = format!("{e}");
    let text = trap.unwrap_or(first);
    let line = text.lines().next().unwrap_or("").trim();
    if line.is_empty() { "the component failed".to_string() } else { line.to_string() }
}

/// 32 bytes from the OS's random source, for the secrets the component makes.
pub fn entropy() -> Vec<u8> {
    use std::io::Read;
    let mut buf = vec![0u8; 32];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)).expect("read /dev/urandom");
    buf
}

/// Run a parsed command; returns the process exit code.
pub fn run(f: Flags) -> Result<u8> {
    let cmd = f.command[0].as_str();
    match cmd {
        "describe" => {
            let host = Host::open(&f)?;
            println!("{}", host.runtime.describe()?);
            Ok(0)
        }
        "call" => {
            let tool = f.command.get(1).context("call needs a tool name: boxd-host call boxd_status '{}'")?.clone();
            let mut args = f.command.get(2).cloned().unwrap_or_else(|| "{}".into());
            if args == "-" {
                // Large arguments (a long prompt) do not fit in argv: read them from stdin.
                args.clear();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut args).context("reading ARGS_JSON from stdin")?;
            }
            if f.command.len() > 3 {
                bail!("call takes TOOL and one ARGS_JSON; quote the JSON as one argument");
            }
            let mut host = Host::open(&f)?;
            match host.call(&tool, &args)? {
                Ok(v) => {
                    println!("{}", serde_json::to_string_pretty(&v)?);
                    Ok(0)
                }
                Err(e) => {
                    println!("{}", serde_json::to_string_pretty(&e)?);
                    Ok(1)
                }
            }
        }
        "audit" => {
            let host = Host::open(&f)?;
            let reach = audit::reach(&host.runtime);
            if f.command.iter().any(|a| a == "--json") {
                println!("{}", serde_json::to_string_pretty(&reach)?);
            } else {
                print!("{}", audit::render(&reach));
            }
            Ok(0)
        }
        "mcp" => crate::mcp::serve(&f),
        "tour" => crate::tour::run(&f),
        "golden" => crate::golden::command(&f),
        other => bail!("unknown command '{other}' (boxd-host --help lists them)"),
    }
}
