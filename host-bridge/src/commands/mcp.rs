//! `boxd-host mcp`: the component's tools over MCP on stdio, built on the official SDK
//! (`rmcp`). The same `session::Session` as `call` (same flags, policy and audit log); the tool
//! list is the component's `describe()`, and a tool call is one `Session::call`. Nothing of
//! the tools' behaviour lives here: this file only translates between MCP and the host.
//!
//! Results: the tool's JSON as pretty text and as `structuredContent`. Errors are tool
//! results with `isError: true` (not JSON-RPC errors, which clients show opaquely), whose
//! text is `{"error","message","next"}` so the model sees the code and the one next step.
//! Which tools are destructive or long-running comes from the manifest, never from here;
//! a run's `taskState` (boxd_job) is the component's own field, passed on as is.
//! Once the audit log has lost a line, every result says so (`with_audit_failed`); a
//! signal ends the server as crate::interrupt says (the call's line first).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context as _, Result};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, JsonObject, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt as _};
use serde_json::Value;

use crate::audit::AuditLog;
use crate::cli::Grants;
use crate::policy::HostProblem;
use crate::runtime::OnFirstSpawn;
use crate::session::Session;

/// The host name the component sees for MCP calls (boxd-host's `call` says `boxd-host`).
pub const HOST_NAME: &str = "boxd-host-mcp";

pub const INSTRUCTIONS: &str = "opencode-boxd runs OpenCode sessions on private boxd \
machines while the transcript comes home to this laptop. The workflow: boxd_status to see \
sign-in, the golden snapshot and the open works; boxd_ensure to create (or adopt) the \
machine for a work; boxd_submit to hand it a task, which returns as soon as the guest has \
admitted the prompt; boxd_job in later turns to see how the run is going (its \
taskState says working, completed, failed or cancelled); boxd_harvest when it is idle \
to bring the transcript and files home; then boxd_sleep to stop billing or boxd_drop to \
destroy the machine. Never wait or poll inside one call: do other work and check \
boxd_job in a later turn. Every error names its code and the one next step to take.";

/// Serve MCP on stdin/stdout until the client closes stdin. A grant the host cannot make (a
/// missing project, a `--boxd` that is not there) does not stop the server: it lists the
/// tools and answers every call with the problem, as `call` and the OpenCode bridge do, so
/// the user reads it in the client rather than a bare "failed to connect".
pub fn serve(grants: &Grants) -> Result<u8> {
    // `approved` stays true, as in `call`: MCP clients (Claude Code, Codex, Cursor) ask
    // the user before each tool call they forward, so a call that reaches us was approved.
    // docs/hosts.md says so, and says to use access "read-only" with a client that does not ask.
    let (host, described) = match Session::open(grants, HOST_NAME) {
        Ok(session) => {
            let described = session.runtime.describe()?;
            session.ready_next();
            (Host::Ready(Arc::new(tokio::sync::Mutex::new(session))), described)
        }
        Err(e) => match e.downcast::<HostProblem>() {
            Ok(problem) => {
                let audit = crate::session::refused_audit(grants).map(std::sync::Mutex::new);
                (Host::Refused(problem, audit), crate::session::ungranted_runtime(grants)?.describe()?)
            }
            Err(e) => return Err(e),
        },
    };
    let manifest: Value = serde_json::from_str(&described).context("the component's manifest is not JSON")?;
    let tools = tools_from_manifest(&manifest)?;
    let long_running = Arc::new(long_running_from_manifest(&manifest));
    let hung_up = Arc::new(AtomicBool::new(false));
    let audit_failed = Arc::default();
    let changes = Arc::new(change_tools_from_manifest(&manifest));
    let server = Server { host: Arc::new(host), tools: Arc::new(tools), long_running, changes, kept: Arc::default(), hung_up: hung_up.clone(), audit_failed };

    // One thread drives the protocol; tool calls run on tokio's blocking pool.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let (stdin, stdout) = rmcp::transport::stdio();
        // Every request line answered, whatever it holds (mcp_lines.rs).
        let in_flight = super::mcp_lines::InFlight::default();
        let transport = (super::mcp_lines::Lines::new(Watched { inner: stdin, hung_up }, in_flight.clone()), super::mcp_lines::Sent::new(stdout, in_flight));
        let running = server.serve(transport).await.context("the MCP handshake failed")?;
        running.waiting().await.context("the MCP session ended with an error")?;
        anyhow::Ok(())
    })?;
    // Dropping the runtime waits for a call still running in the blocking pool: a client
    // that hangs up mid-call must not leave the ledger or a boxd command half done. Calls
    // still queued behind it never start (Server::run).
    drop(runtime);
    Ok(0)
}

/// stdin, noting when the client hangs up (end of file or a read error), so a call still
/// queued then is not started for nobody (Server::run).
struct Watched {
    inner: tokio::io::Stdin,
    hung_up: Arc<AtomicBool>,
}

impl tokio::io::AsyncRead for Watched {
    fn poll_read(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &mut tokio::io::ReadBuf<'_>) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        let ended = match &polled {
            std::task::Poll::Ready(Ok(())) => buf.filled().len() == before && buf.remaining() > 0,
            std::task::Poll::Ready(Err(_)) => true,
            std::task::Poll::Pending => false,
        };
        if ended {
            self.hung_up.store(true, Ordering::SeqCst);
        }
        polled
    }
}

/// The MCP tool list from the component's manifest: name, description, the JSON Schema
/// as `inputSchema`, and annotations from the tool's access and `destructive`.
pub fn tools_from_manifest(manifest: &Value) -> Result<Vec<Tool>> {
    let list = manifest.get("tools").and_then(Value::as_array).context("the manifest has no tools")?;
    list.iter()
        .map(|t| {
            let name = t.get("name").and_then(Value::as_str).context("a manifest tool has no name")?.to_string();
            let description = t.get("description").and_then(Value::as_str).unwrap_or_default().to_string();
            let schema: JsonObject = match t.get("inputSchema") {
                Some(Value::Object(o)) => o.clone(),
                _ => anyhow::bail!("tool {name} has no inputSchema object"),
            };
            let read_only = t.get("access").and_then(Value::as_str) == Some("read");
            let annotations = ToolAnnotations::new().read_only(read_only).destructive(flag(t, "destructive"));
            Ok(Tool::new(name, description, Arc::new(schema)).with_annotations(annotations))
        })
        .collect()
}

/// The tools whose manifest entry says `longRunning`: the client gets a progress
/// notification when such a call makes its first spawn (it has passed its argument checks)
/// and one when it ends. The component runs a call to the end without yielding, so there
/// are no intermediate steps to report.
pub fn long_running_from_manifest(manifest: &Value) -> BTreeSet<String> {
    let tools = manifest.get("tools").and_then(Value::as_array).into_iter().flatten();
    tools.filter(|t| flag(t, "longRunning")).filter_map(|t| t.get("name").and_then(Value::as_str)).map(str::to_string).collect()
}

/// The tools whose access is not "read": a cancelled call of one keeps its answer (mcp_kept.rs).
fn change_tools_from_manifest(manifest: &Value) -> BTreeSet<String> {
    let tools = manifest.get("tools").and_then(Value::as_array).into_iter().flatten();
    tools.filter(|t| t.get("access").and_then(Value::as_str) != Some("read")).filter_map(|t| t.get("name").and_then(Value::as_str)).map(str::to_string).collect()
}

/// A manifest tool's boolean field; absent is false.
fn flag(tool: &Value, key: &str) -> bool {
    tool.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// A host failure (a trap, a policy or runtime error) in the tools' own error shape, with
/// the next step every host gives (policy.json `hostFailed`).
pub fn host_failed(tool: &str, message: impl std::fmt::Display) -> Value {
    crate::policy::host_failed(tool, message)
}

/// The answer to a call that was cancelled, or whose client hung up, before its turn came:
/// it never ran. No client reads it (rmcp drops the answer to a cancelled request).
fn not_started(tool: &str) -> Value {
    host_failed(tool, "the call was cancelled (or its client went away) before it started; it did not run")
}

/// Once the audit log has lost a line (a full disk, a removed folder), every later result
/// says so in `auditFailed` beside the tool's own fields: the calls still run and their
/// answers stand (the call whose line was lost did run), but the log the user asked for is
/// missing calls. It stays until the server is restarted, since those lines stay lost.
/// (`boxd-host call` exits 2 instead; docs/hosts.md.)
pub fn with_audit_failed(answer: std::result::Result<Value, Value>, lost: Option<(u32, String)>) -> std::result::Result<Value, Value> {
    let Some((lost, why)) = lost else { return answer };
    let note = serde_json::json!({
        "error": "AUDIT_FAILED",
        "message": format!("{lost} audit line(s) of this server could not be written, so the audit log is missing calls; the last: {why}"),
        "next": "The calls ran and their answers stand. Tell the user: make the audit log writable again (free space, or restore its folder), then restart this MCP server; the server's stderr names each lost line.",
    });
    let add = |mut v: Value| {
        if let Some(o) = v.as_object_mut() {
            o.insert("auditFailed".into(), note.clone());
        }
        v
    };
    answer.map(add).map_err(add)
}

/// The answer to a line mcp_lines.rs refused: the JSON-RPC error it names, or the tool
/// error (FILE_TOO_LARGE).
fn refused_line(arguments: JsonObject) -> Result<CallToolResponse, ErrorData> {
    if let Some(error) = arguments.get("toolError") {
        return Ok(to_result(Err(error.clone())).into());
    }
    let code = arguments.get("code").and_then(Value::as_i64).unwrap_or(-32600) as i32;
    let message = arguments.get("message").and_then(Value::as_str).unwrap_or("the request was refused").to_string();
    Err(ErrorData::new(rmcp::model::ErrorCode(code), message, None))
}

/// The MCP result for one answer: pretty JSON text plus the same value structured.
pub fn to_result(answer: std::result::Result<Value, Value>) -> CallToolResult {
    let (value, is_error) = match answer {
        Ok(v) => (v, false),
        Err(e) => (e, true),
    };
    let text = crate::out::answer_text(&value);
    let mut result = if is_error { CallToolResult::error(vec![ContentBlock::text(text)]) } else { CallToolResult::success(vec![ContentBlock::text(text)]) };
    // Only objects go in structuredContent: older protocol versions allow nothing else.
    if value.is_object() {
        result.structured_content = Some(value);
    }
    result
}

/// What answers the tool calls: the session, or the grant problem that refuses every one.
enum Host {
    /// Calls run one at a time, in the order they came: one agent's calls on one work
    /// (submit, then drop) must not interleave; the ledger's per-work lock keeps each
    /// write whole, not their order. tokio's mutex is fair (first come, first served),
    /// and it is taken before the call goes to the blocking pool, so pipelined calls run
    /// in the order the client sent them.
    Ready(Arc<tokio::sync::Mutex<Session>>),
    /// Each call is answered with the problem, and audited (when the log could be opened).
    Refused(HostProblem, Option<std::sync::Mutex<AuditLog>>),
}

#[derive(Clone)]
struct Server {
    host: Arc<Host>,
    tools: Arc<Vec<Tool>>,
    long_running: Arc<BTreeSet<String>>,
    /// Tools that change something, and the answer of the last one its client cancelled.
    changes: Arc<BTreeSet<String>>,
    kept: Arc<super::mcp_kept::Kept>,
    /// The client closed stdin (Watched).
    hung_up: Arc<AtomicBool>,
    /// Once the audit log has lost a line: how many, and the last failure (AuditLog).
    audit_failed: Arc<std::sync::Mutex<Option<(u32, String)>>>,
}

impl Server {
    /// Remember that the audit log has lost lines, if it has (every later result says so).
    fn note_audit(&self, audit: &AuditLog) {
        if let Some(why) = audit.failed() {
            *self.audit_failed.lock().unwrap_or_else(|e| e.into_inner()) = Some((audit.lost(), why.to_string()));
        }
    }

    async fn progress(&self, ctx: &RequestContext<RoleServer>, tool: &str, done: bool) {
        let Some(token) = ctx.meta.get_progress_token() else { return };
        let (progress, message) = if done { (1.0, format!("{tool} finished")) } else { (0.0, format!("{tool} started")) };
        // A client that went away is not our failure: the call's result still matters.
        let _ = ctx.peer.notify_progress(ProgressNotificationParam::new(token, progress).with_total(1.0).with_message(message)).await;
    }

    /// One call on the blocking pool (the wasmtime call is synchronous and may run for
    /// minutes). Progress starts at the call's first spawn, which comes only after the
    /// component's argument, option and access checks: a refused call reports none.
    ///
    /// A call waits its turn for the session; when its turn comes it starts only if the
    /// client still wants it: one cancelled meanwhile (notifications/cancelled) or whose
    /// client hung up is answered without running (nobody reads that answer). A call that
    /// has started runs to its end whatever the client does (serve says why).
    async fn run(&self, ctx: &RequestContext<RoleServer>, tool: &str, args: String) -> std::result::Result<Value, Value> {
        let session = match self.host.as_ref() {
            Host::Refused(problem, audit) => {
                if let Some(audit) = audit {
                    let mut audit = audit.lock().unwrap_or_else(|e| e.into_inner());
                    crate::session::record_refused(&mut audit, tool, problem);
                    self.note_audit(&audit);
                }
                return Err(problem.to_json());
            }
            Host::Ready(session) => session.clone(),
        };
        let watched = self.long_running.contains(tool) && ctx.meta.get_progress_token().is_some();
        let (spawned, first_spawn) = tokio::sync::oneshot::channel::<()>();
        let hook: Option<OnFirstSpawn> = watched.then(|| Box::new(move || {
            // The receiver is gone only if the client's request was dropped: nothing to tell.
            let _ = spawned.send(());
        }) as OnFirstSpawn);
        let name = tool.to_string();
        let mut session = tokio::select! {
            session = session.lock_owned() => session,
            () = ctx.ct.cancelled() => return Err(not_started(tool)),
        };
        if ctx.ct.is_cancelled() || self.hung_up.load(Ordering::SeqCst) || crate::interrupt::received().is_some() {
            return Err(not_started(tool));
        }
        let change = self.changes.contains(tool);
        if change {
            // The client asks again what it cancelled (mcp_kept.rs): that run's answer.
            if let Some(answer) = self.kept.take(tool, &args) {
                session.audit.record(tool, 0, &Ok(()), &Default::default());
                self.note_audit(&session.audit);
                return Ok(answer);
            }
        }
        let (answered, answer) = tokio::sync::oneshot::channel();
        let (noted, ct) = (self.clone(), ctx.ct.clone());
        let call = tokio::task::spawn_blocking(move || {
            let answer = session.call_watched(&name, &args, hook);
            if let (true, true, Ok(Ok(v))) = (change, ct.is_cancelled(), &answer) {
                noted.kept.keep(&name, &args, v);
            }
            noted.note_audit(&session.audit);
            let _ = answered.send(answer);
            // While the answer goes out: the next call's instance (Session::ready_next).
            session.ready_next();
        });
        // The sender goes with the hook: dropped unfired, the call ended without a spawn.
        let started = first_spawn.await.is_ok();
        if started {
            self.progress(ctx, tool, false).await;
        }
        let answer = match answer.await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => Err(host_failed(tool, format!("{e:#}"))),
            // No answer sent: the call panicked, which its task says.
            Err(_) => Err(host_failed(tool, match call.await {
                Err(e) => format!("the call panicked ({e})"),
                Ok(()) => "the call ended without an answer".to_string(),
            })),
        };
        if started {
            self.progress(ctx, tool, true).await;
        }
        answer
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("opencode-boxd", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(&self, _request: Option<PaginatedRequestParams>, _ctx: RequestContext<RoleServer>) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.as_ref().clone()))
    }

    // `get_tool` stays at its default (None) so rmcp does not check arguments itself: the
    // component's check gives ARGS_INVALID with a next step, the same as `boxd-host call`.

    async fn call_tool(&self, request: CallToolRequestParams, ctx: RequestContext<RoleServer>) -> Result<CallToolResponse, ErrorData> {
        if request.name == super::mcp_lines::REFUSE {
            return refused_line(request.arguments.unwrap_or_default());
        }
        // Arguments that were not an object reach the component as they came (mcp_lines.rs).
        let args = match request.arguments {
            Some(mut a) if a.len() == 1 && a.contains_key(super::mcp_lines::RAW_ARGUMENTS) => a.remove(super::mcp_lines::RAW_ARGUMENTS).unwrap_or_default().to_string(),
            other => Value::Object(other.unwrap_or_default()).to_string(),
        };
        let answer = self.run(&ctx, &request.name, args).await;
        let lost = self.audit_failed.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Ok(to_result(with_audit_failed(answer, lost)).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn annotations_and_progress_follow_the_manifest() {
        let manifest = json!({ "tools": [
            { "name": "look", "access": "read", "description": "d", "inputSchema": { "type": "object" } },
            { "name": "wreck", "access": "change", "destructive": true, "description": "d", "inputSchema": { "type": "object" } },
            { "name": "build", "access": "change", "longRunning": true, "progress": "building {work}…", "description": "d", "inputSchema": { "type": "object" } },
        ]});
        let tools = tools_from_manifest(&manifest).unwrap();
        let hints: Vec<_> = tools.iter().map(|t| t.annotations.clone().map(|a| (a.read_only_hint, a.destructive_hint))).collect();
        assert_eq!(hints, [Some((Some(true), Some(false))), Some((Some(false), Some(true))), Some((Some(false), Some(false)))]);
        assert_eq!(long_running_from_manifest(&manifest).into_iter().collect::<Vec<_>>(), ["build"]);
    }

    #[test]
    fn errors_are_tool_results_with_the_error_json() {
        let r = to_result(Err(host_failed("look", "trap")));
        assert_eq!(r.is_error, Some(true));
        let v = r.structured_content.unwrap();
        assert_eq!(v["error"], "HOST_FAILED");
        assert_eq!(v["next"], crate::policy::host_failed_next());
    }
}
