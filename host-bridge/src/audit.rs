//! What the plugin can touch, read from the real component, and what each call did touch.
//!
//! `reach` lists the component's imports and exports (from its own type, not a
//! hard-coded list) beside the policy's programs (each with its argument grants and its
//! child's environment) and folders. `AuditLog` appends one JSON line per call with the
//! trace the runtime kept (runtime/trace.rs, each spawn naming the grant it matched);
//! audit only reads it.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::io::Write;
use std::path::Path;

use anyhow::Result;
use serde_json::{json, Value};
use wasmtime::component::types::ComponentItem;

use crate::runtime::{Runtime, Trace};

/// The component's reach: imports and exports by interface, with their functions.
pub fn reach(rt: &Runtime) -> Value {
    let engine = rt.engine();
    let ty = rt.component().component_type();
    let list = |items: Vec<(String, ComponentItem)>| -> Vec<Value> {
        items
            .into_iter()
            .map(|(name, item)| {
                let funcs: Vec<String> = match &item {
                    ComponentItem::ComponentInstance(inst) => inst
                        .exports(engine)
                        .filter(|(_, i)| matches!(i.ty, ComponentItem::ComponentFunc(_)))
                        .map(|(n, _)| n.to_string())
                        .collect(),
                    _ => Vec::new(),
                };
                json!({ "name": name, "functions": funcs })
            })
            .collect()
    };
    let imports = list(ty.imports(engine).map(|(n, i)| (n.to_string(), i.ty)).collect());
    let exports = list(ty.exports(engine).map(|(n, i)| (n.to_string(), i.ty)).collect());
    let policy = rt.policy();
    json!({
        "component": { "sha256": rt.sha256, "bytes": rt.size },
        "imports": imports,
        "exports": exports,
        "programs": policy.programs().iter().map(|(k, v)| {
            let grants = crate::policy::file().program(k).map(|p| p.grants.as_slice()).unwrap_or_default();
            json!({
                "name": k,
                "path": v.display().to_string(),
                "grants": grants,
                // The variables its child may inherit (those the host has are passed on).
                "environment": crate::policy::child_env_names(k),
            })
        }).collect::<Vec<_>>(),
        "programsRefused": "every other name, every path, and every argument list no grant matches",
        "paths": policy.preopens().iter().map(|p| json!({ "path": p.path.display().to_string(), "why": p.why, "mode": "read-write" })).collect::<Vec<_>>(),
        "denied": ["environment variables", "arguments", "stdin/stdout/stderr", "clocks", "random", "sockets and network", "any folder not listed"],
    })
}

/// Human-readable form of `reach`.
pub fn render(reach: &Value) -> String {
    let mut s = String::new();
    let c = &reach["component"];
    s.push_str(&format!("component  sha256 {}  ({} bytes)\n", c["sha256"].as_str().unwrap_or(""), c["bytes"]));
    for (title, key) in [("imports", "imports"), ("exports", "exports")] {
        s.push_str(&format!("{title}:\n"));
        for i in reach[key].as_array().into_iter().flatten() {
            let funcs: Vec<&str> = i["functions"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            s.push_str(&format!("  {}\n", i["name"].as_str().unwrap_or("")));
            if !funcs.is_empty() {
                s.push_str(&format!("      {}\n", funcs.join(", ")));
            }
        }
    }
    s.push_str("programs it may run, only with these arguments (everything else is refused):\n");
    for p in reach["programs"].as_array().into_iter().flatten() {
        let name = p["name"].as_str().unwrap_or("");
        s.push_str(&format!("  {name:<9} -> {}\n", p["path"].as_str().unwrap_or("")));
        for g in p["grants"].as_array().into_iter().flatten() {
            let args: Vec<&str> = g["args"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            s.push_str(&format!("      {:<18} {name} {}\n", g["name"].as_str().unwrap_or(""), args.join(" ")));
        }
        let env: Vec<&str> = p["environment"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        s.push_str(&format!("      {:<18} {}\n", "(environment)", env.join(" ")));
    }
    s.push_str("folders it may touch (nothing else):\n");
    for p in reach["paths"].as_array().into_iter().flatten() {
        s.push_str(&format!("  {:<9} {} ({})\n", p["why"].as_str().unwrap_or(""), p["path"].as_str().unwrap_or(""), p["mode"].as_str().unwrap_or("")));
    }
    let denied: Vec<&str> = reach["denied"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    s.push_str(&format!("denied to the component: {}\n", denied.join(", ")));
    s
}

/// One JSON line per tool call, appended to `--audit-log FILE`.
pub struct AuditLog {
    file: Option<std::fs::File>,
}

impl AuditLog {
    pub fn open(path: Option<&Path>) -> Result<AuditLog> {
        let file = match path {
            // Owner-only, as the ledger: the lines name works, sessions and paths.
            Some(p) => Some(OpenOptions::new().create(true).append(true).mode(0o600).open(p)?),
            None => None,
        };
        Ok(AuditLog { file })
    }

    pub fn record(&mut self, tool: &str, duration_ms: u64, result: &std::result::Result<(), String>, trace: &Trace) {
        let Some(f) = &mut self.file else { return };
        let line = json!({
            "tool": tool,
            "duration_ms": duration_ms,
            "result": match result { Ok(()) => json!("ok"), Err(code) => json!({ "error": code }) },
            "spawns": trace.spawns,
            "paths": trace.paths,
        });
        let _ = writeln!(f, "{line}");
    }
}
