//! A session: what every command builds once — the policy (programs, folders, child
//! environment) from the grants and the options, the runtime that loads the component
//! under it, the call context and the audit log — and the calls made through it.

use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result};
use serde_json::{json, Value};

use crate::audit::AuditLog;
use crate::cli::Grants;
use crate::opencode_version::OpencodeVersion;
use crate::runtime::{CallContext, OnFirstSpawn, Runtime, ToolError, Trace};

/// The host name the command line gives the component (MCP gives its own).
pub const HOST_NAME: &str = "boxd-host";

/// Where compiled components and the OpenCode version are kept: `BOXD_HOST_CACHE`, else
/// `$XDG_CACHE_HOME/opencode-boxd`, else `$HOME/.cache/opencode-boxd`. Only an absolute
/// value counts (a relative one would put the cache in whatever folder the host started
/// in, often the project); with none, nothing is cached.
fn cache_dir() -> Option<PathBuf> {
    let absolute = |k: &str| std::env::var_os(k).map(PathBuf::from).filter(|p| p.is_absolute());
    let dir = absolute("BOXD_HOST_CACHE")
        .or_else(|| absolute("XDG_CACHE_HOME").map(|d| d.join("opencode-boxd")))
        .or_else(|| absolute("HOME").map(|h| h.join(".cache/opencode-boxd")))?;
    private_dir(&dir).then_some(dir)
}

/// The cache folder, made owner-only when it is new; an existing one must belong to this
/// user and be writable by no one else. What is in it is run as native code (the compiled
/// component), so a folder others can write is not used at all.
fn private_dir(dir: &std::path::Path) -> bool {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let _ = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir);
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    std::fs::metadata(dir).is_ok_and(|m| m.is_dir() && m.uid() == me && m.mode() & 0o022 == 0)
}

/// Everything a command needs, built once: the policy inside the loaded runtime, the call
/// context, the audit log.
pub struct Session {
    pub runtime: Runtime,
    pub ctx: CallContext,
    pub audit: AuditLog,
    opencode: OpencodeVersion,
}

impl Session {
    /// A session for `host_name` ("boxd-host", "boxd-host-mcp") from the flags and this
    /// process's environment.
    pub fn open(f: &Grants, host_name: &str) -> Result<Session> {
        Self::open_env(f, host_name, std::env::vars().collect())
    }

    /// Open with an explicit environment: children inherit the policy's share of `vars`.
    pub fn open_env(f: &Grants, host_name: &str, vars: Vec<(String, String)>) -> Result<Session> {
        let request = crate::policy::GrantRequest {
            programs: [("boxd", &f.boxd), ("opencode", &f.opencode)].into_iter().filter_map(|(n, p)| Some((n.to_string(), p.clone()?))).collect(),
            project: f.project.clone().unwrap_or_default(),
            ledger: f.ledger.clone(),
            allow_roots: f.allow_roots.clone(),
            options: f.options.clone(),
            env: vars,
            cwd: std::env::current_dir().context("the current directory is gone")?,
        };
        let crate::policy::Grants { policy, project, ledger, component_options: options, audit_log } = crate::policy::resolve(&request)?;

        let cache = if f.no_cache { None } else { cache_dir() };
        let opencode = OpencodeVersion::new(&policy, cache.as_deref());
        let runtime = load(f, policy, cache.as_deref())?;
        let ctx = CallContext {
            host_name: host_name.into(),
            host_version: env!("CARGO_PKG_VERSION").into(),
            options_json: options.to_string(),
            project: project.display().to_string(),
            ledger: ledger.display().to_string(),
            now_ms: 0,
            entropy: Vec::new(),
            // The command line is the user's approval of the call it names; an MCP client
            // asks the user before each call it forwards (docs/hosts.md).
            approved: true,
            opencode_version: None,
        };
        let audit = match (&f.audit_log, &audit_log) {
            (Some(flag), _) => AuditLog::open(Some(flag))?,
            (None, option) => AuditLog::open_from(option.as_deref(), crate::policy::AUDIT_LOG_OPTION)?,
        };
        Ok(Session { runtime, ctx, audit, opencode })
    }

    /// This call's context: the clock, fresh random bytes, the laptop OpenCode's version.
    fn fresh_ctx(&mut self) -> CallContext {
        let mut ctx = self.ctx.clone();
        ctx.opencode_version = self.opencode.get(self.runtime.policy(), &mut self.audit);
        ctx.now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        ctx.entropy = entropy();
        ctx
    }

    /// One tool call with the audit line written; the tool's JSON or its error object. A
    /// trap in the component (a panic, an out-of-memory) is answered as HOST_FAILED with
    /// the one next step every host gives (policy.json `hostFailed`), never as a backtrace.
    pub fn call(&mut self, tool: &str, args: &str) -> Result<std::result::Result<Value, Value>> {
        self.call_watched(tool, args, None)
    }

    /// As `call`, with a hook run just before the call's first spawn (the MCP server's
    /// progress starts there: runtime::OnFirstSpawn).
    ///
    /// A signal that stops the host meanwhile (crate::interrupt) ends it once the audit
    /// line is written, when `_in_flight` is dropped: this returns only when none came.
    pub fn call_watched(&mut self, tool: &str, args: &str, on_first_spawn: Option<OnFirstSpawn>) -> Result<std::result::Result<Value, Value>> {
        let _in_flight = crate::interrupt::in_flight();
        let ctx = self.fresh_ctx();
        let started = Instant::now();
        let (result, trace) = self.runtime.call_watched(tool, args, &ctx, on_first_spawn);
        Ok(self.answer(tool, started, result, trace))
    }

    /// For a long-lived host, once an answer is out: the next call's instance is made now
    /// and the last call's store dropped, off the next call's path (Runtime::ready_next).
    pub fn ready_next(&self) {
        self.runtime.ready_next();
    }

    /// The golden-image operation (`boxd-host golden`, the tour), granted, traced and
    /// audited like a tool call; `spec` is docs/golden-image.md's spec.
    pub fn build_golden(&mut self, spec: &Value) -> Result<std::result::Result<Value, Value>> {
        let _in_flight = crate::interrupt::in_flight();
        let ctx = self.fresh_ctx();
        let started = Instant::now();
        let (result, trace) = self.runtime.build_golden(&spec.to_string(), &ctx);
        Ok(self.answer("golden", started, result, trace))
    }

    /// The host's own use of a granted program (the tour sets boxd-local's env with it):
    /// the same binary, child environment, bounds and process runner as the component's
    /// spawns, and an audit line of its own. It is the host acting for the user, so the
    /// component's argument grants do not apply (docs/architecture.md, "Policy").
    pub fn run_granted(&mut self, program: &str, args: &[&str]) -> Result<crate::spawn::Output> {
        let policy = self.runtime.policy();
        let binary = policy.allows(program).map_err(|r| anyhow::anyhow!("{r:?}"))?.to_path_buf();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let spawn = crate::spawn::Spawn {
            name: program,
            binary: &binary,
            args: &args,
            env: &policy.child_env(program),
            cwd: None,
            stdin: None,
            timeout: std::time::Duration::from_secs(60),
            bounds: crate::policy::bounds(),
        };
        let grant = format!("host: {program} (the host's own call, not the component's)");
        host_call(&mut self.audit, &format!("host:{program}"), grant, spawn).map_err(|f| anyhow::anyhow!("{program} {}: {f:?}", args.join(" ")))
    }

    /// The answer as JSON (the result, or `{error, message, next}`), with the audit line
    /// written. A trap in the component (a panic, an out-of-memory) is answered as
    /// HOST_FAILED with the one next step every host gives (policy.json `hostFailed`),
    /// never as a backtrace.
    fn answer(&mut self, what: &str, started: Instant, result: Result<std::result::Result<String, ToolError>>, trace: Trace) -> std::result::Result<Value, Value> {
        let ms = started.elapsed().as_millis() as u64;
        let answer = match result {
            Ok(Ok(s)) => Ok(serde_json::from_str(&s).unwrap_or(Value::String(s))),
            Ok(Err(e)) => Err(json!({ "error": e.code, "message": e.message, "next": e.next })),
            Err(trap) => Err(crate::policy::host_failed(what, trap_message(&trap))),
        };
        let code = answer.as_ref().map(drop).map_err(|e| e["error"].as_str().unwrap_or_default().to_string());
        self.audit.record(what, ms, &code, &trace);
        answer
    }
}

/// The audit log of a host whose grants could not be made (every call is refused with the
/// problem): `--audit-log`, else the plugin option `auditLog`, when it can be opened. None
/// when none was asked for, or when the log itself is the problem.
pub fn refused_audit(f: &Grants) -> Option<AuditLog> {
    let option = || -> Option<PathBuf> {
        let options: Value = serde_json::from_str(f.options.as_deref()?).ok()?;
        options.get(crate::policy::AUDIT_LOG_OPTION)?.as_str().filter(|p| p.starts_with('/')).map(PathBuf::from)
    };
    let log = match &f.audit_log {
        Some(flag) => AuditLog::open(Some(flag)),
        None => AuditLog::open_from(option().as_deref(), crate::policy::AUDIT_LOG_OPTION),
    };
    log.ok()
}

/// The audit line of a call refused for a grant problem: it ran nothing and touched no
/// path; its result is the problem's code.
pub fn record_refused(audit: &mut AuditLog, tool: &str, problem: &crate::policy::HostProblem) {
    audit.record(tool, 0, &Err(problem.code.clone()), &Trace::default());
}

/// The component the flags name (`--component`), else the one built in (its sha256
/// computed at build time), loaded under `policy`.
fn load(f: &Grants, policy: crate::policy::Policy, cache: Option<&std::path::Path>) -> Result<Runtime> {
    match &f.component {
        Some(p) => {
            let wasm = std::fs::read(p).with_context(|| format!("cannot read the component {}", p.display()))?;
            Runtime::load(&wasm, policy, cache)
        }
        None => Runtime::load_built_in(policy, cache),
    }
}

/// The component under a policy that grants nothing (no program, no folder): enough to
/// describe its tools when a grant cannot be made, so a server can still list them and
/// answer each call with the problem, as the OpenCode bridge does.
pub fn ungranted_runtime(f: &Grants) -> Result<Runtime> {
    load(f, crate::policy::Policy::new(), if f.no_cache { None } else { cache_dir() }.as_deref())
}

/// A trap in one line: wasmtime's own words ("wasm trap: wasm `unreachable` instruction
/// executed") without the wasm backtrace that follows them.
pub fn trap_message(e: &anyhow::Error) -> String {
    let trap = e.downcast_ref::<wasmtime::Trap>().map(|t| t.to_string());
    let first = format!("{e}");
    let text = trap.unwrap_or(first);
    let line = text.lines().next().unwrap_or("").trim();
    if e.chain().any(|c| c.to_string().contains("forcing trap when growing memory")) {
        return format!(
            "the component reached its memory limit ({} MiB): an answer from boxd or the guest was too large to read",
            crate::runtime::MEMORY_LIMIT >> 20
        );
    }
    if line.is_empty() { "the component failed".to_string() } else { line.to_string() }
}

/// 32 bytes from the OS's random source, for the secrets the component makes.
pub fn entropy() -> Vec<u8> {
    use std::io::Read;
    let mut buf = vec![0u8; 32];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)).expect("read /dev/urandom");
    buf
}

/// A call the host makes itself (not the component's): run by the one process runner and
/// written to the audit log as `what`, its spawn naming `grant` (why it may run).
pub fn host_call(audit: &mut AuditLog, what: &str, grant: String, spawn: crate::spawn::Spawn) -> std::result::Result<crate::spawn::Output, crate::spawn::SpawnFailure> {
    use crate::spawn::SpawnFailure;
    let (program, args) = (spawn.name, spawn.args);
    let started = Instant::now();
    let out = crate::spawn::run(spawn);
    let record = crate::runtime::SpawnRecord {
        program: program.into(),
        args: crate::runtime::mask_args(args),
        grant: Some(grant),
        exit_code: out.as_ref().ok().and_then(|o| o.exit_code),
        outcome: out.as_ref().err().map_or("exited", SpawnFailure::outcome).into(),
        duration_ms: started.elapsed().as_millis() as u64,
    };
    let code = match &out {
        Ok(o) if o.exit_code == Some(0) => Ok(()),
        _ => Err("HOST_CALL_FAILED".to_string()),
    };
    audit.record(what, record.duration_ms, &code, &Trace { spawns: vec![record], paths: Vec::new() });
    out
}
