//! The manifest every host reads through `describe()`: each tool's name, description,
//! JSON Schema and whether it reads or changes; plus the argument check against that
//! schema, so a bad argument is refused the same way in every host.

use alloc::format;
use alloc::string::String;
use serde_json::{json, Map, Value};

use crate::errors::{Code, ToolError, ToolResult};

pub const PLUGIN_NAME: &str = "opencode-boxd";
pub const PLUGIN_VERSION: &str = env!("CARGO_PKG_VERSION");
/// The WIT package this component implements, read from wit/plugin.wit as it is built, so
/// the manifest cannot drift from the world the bindings were generated from.
pub fn wit_version() -> &'static str {
    const WIT: &str = include_str!("../../wit/plugin.wit");
    WIT.lines()
        .find_map(|l| l.trim().strip_prefix("package "))
        .map(|p| p.trim_end_matches(';').trim())
        .expect("wit/plugin.wit names its package")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Change,
}

pub struct ToolSpec {
    pub name: &'static str,
    pub access: Access,
    pub description: &'static str,
    /// Builds the JSON Schema of the arguments.
    pub schema: fn() -> Value,
}

fn work() -> Value {
    json!({ "type": "string", "description": "The work id: short, lowercase [a-z0-9-], starting with a letter. The machine is oc-<work>.", "maxLength": 40 })
}

fn only_work() -> Value {
    object(json!({ "work": work() }), &["work"])
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({ "type": "object", "properties": properties, "required": required, "additionalProperties": false })
}

pub const TOOLS: &[ToolSpec] = &[
    ToolSpec {
        name: "boxd_status",
        access: Access::Read,
        description: "Show the boxd CLI sign-in, the golden snapshot, every open work with its machine state and warnings, the tools, and one next step. Starts nothing.",
        schema: || object(json!({}), &[]),
    },
    ToolSpec {
        name: "boxd_job",
        access: Access::Read,
        description: "How a work's run is going: busy, idle, asleep, gone or starting; when idle the last outcome (completed, failed, aborted), the newest assistant text (redacted, at most 300 characters), the last activity time and the prompts waiting. Never wakes a machine.",
        schema: only_work,
    },
    ToolSpec {
        name: "boxd_ensure",
        access: Access::Change,
        description: "Create (or adopt) the private boxd machine oc-<work> for a work, from the golden snapshot, and record it in the ledger. Cheap and idempotent on a healthy work.",
        schema: || object(json!({
            "work": work(),
            "directory": { "type": "string", "description": "The laptop folder the work belongs to; defaults to the project." }
        }), &["work"]),
    },
    ToolSpec {
        name: "boxd_submit",
        access: Access::Change,
        description: "Send a task to a work's guest OpenCode session, optionally copying laptop files into the work tree first. Returns once the guest admitted the prompt (queued: true when a run was busy); call boxd_job in a later turn.",
        schema: || object(json!({
            "work": work(),
            "prompt": { "type": "string", "description": "The task, any text (up to 4 MiB)." },
            "files": {
                "type": "array",
                "maxItems": 1000,
                "description": "Laptop files to copy in first: from is a file inside the project or an allowed root, to a relative path in the work tree. At most 8 MiB a file and 32 MiB a call.",
                "items": object(json!({
                    "from": { "type": "string", "description": "Laptop path (relative to the project, or absolute inside an allowed root)." },
                    "to": { "type": "string", "description": "Relative path inside the work tree; no '..'." }
                }), &["from", "to"])
            }
        }), &["work", "prompt"]),
    },
    ToolSpec {
        name: "boxd_harvest",
        access: Access::Change,
        description: "Bring a work home: export the guest's session tree, import it into this laptop's OpenCode (parents first) and prove it by reading it back, record the guest's git state (storing uncommitted changes as a patch), then copy the named files back.",
        schema: || object(json!({
            "work": work(),
            "files": {
                "type": "array",
                "maxItems": 1000,
                "description": "Paths in the work tree to copy back (e.g. [\"SUMMARY.md\"]).",
                "items": { "type": "string" }
            },
            "to": { "type": "string", "description": "Laptop folder for the files; defaults to the work's directory. Inside the project or an allowed root." }
        }), &["work"]),
    },
    ToolSpec {
        name: "boxd_sleep",
        access: Access::Change,
        description: "Hibernate a work's machine. Destroys nothing and keeps the disk; always allowed. Records a warning when the newest prompt is not yet harvested.",
        schema: only_work,
    },
    ToolSpec {
        name: "boxd_resume",
        access: Access::Change,
        description: "Wake a hibernated work's machine (resetting its idle bound), or rebuild a gone one from the golden snapshot.",
        schema: only_work,
    },
    ToolSpec {
        name: "boxd_image",
        access: Access::Change,
        description: "Save a work's machine as a new named snapshot. Refuses until a harvest has proven the transcript since the last prompt.",
        schema: || object(json!({
            "work": work(),
            "name": { "type": "string", "description": "The new snapshot name: lowercase [a-z0-9-]. Snapshots are immutable.", "maxLength": 63 }
        }), &["work", "name"]),
    },
    ToolSpec {
        name: "boxd_drop",
        access: Access::Change,
        description: "Destroy a work's machine, only when the laptop can account for everything on it: the guest is stopped, then its live state is checked in the same call (proven transcript, every commit in the ledger's bundle, uncommitted changes in the stored patch, every new file harvested or sent from the laptop). A work whose machine is gone is closed, naming what could not be recovered.",
        schema: || object(json!({
            "work": work(),
            "discard": {
                "type": "array",
                "maxItems": 1000,
                "description": "Paths in the work tree the user explicitly accepts losing (owed harvest files, new or ignored files; a folder covers what is under it). Only when the user said so.",
                "items": { "type": "string" }
            }
        }), &["work"]),
    },
];

pub fn find(name: &str) -> Option<&'static ToolSpec> {
    TOOLS.iter().find(|t| t.name == name)
}

pub fn describe() -> String {
    let tools: alloc::vec::Vec<Value> = TOOLS
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "description": t.description,
                "access": match t.access { Access::Read => "read", Access::Change => "change" },
                "inputSchema": (t.schema)(),
            })
        })
        .collect();
    serde_json::to_string(&json!({
        "plugin": PLUGIN_NAME,
        "version": PLUGIN_VERSION,
        "wit": wit_version(),
        "tools": tools,
    }))
    .expect("the manifest serialises")
}

fn bad(field: &str, why: &str) -> ToolError {
    ToolError::with_next(
        Code::ArgsInvalid,
        format!("argument '{field}' {why}"),
        format!("Fix '{field}' to match the tool's JSON Schema (describe shows it), then call again."),
    )
}

/// Check `args` against a schema of the shapes our tools use (object, string, boolean,
/// integer, array of strings or of objects; required; additionalProperties false; maxLength).
pub fn check(schema: &Value, args: &Value) -> ToolResult<()> {
    check_at("", schema, args)
}

fn check_at(path: &str, schema: &Value, v: &Value) -> ToolResult<()> {
    let name = if path.is_empty() { "(arguments)" } else { path };
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let Value::Object(map) = v else { return Err(bad(name, "must be a JSON object")) };
            let empty = Map::new();
            let props = schema.get("properties").and_then(Value::as_object).unwrap_or(&empty);
            for req in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
                let req = req.as_str().unwrap_or("");
                if !map.contains_key(req) {
                    return Err(bad(&join(path, req), "is required"));
                }
            }
            for (k, val) in map {
                match props.get(k) {
                    Some(s) => check_at(&join(path, k), s, val)?,
                    None => return Err(bad(&join(path, k), "is not an argument of this tool")),
                }
            }
            Ok(())
        }
        Some("string") => {
            let s = v.as_str().ok_or_else(|| bad(name, "must be a string"))?;
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
                if s.chars().count() as u64 > max {
                    return Err(bad(name, &format!("is longer than {max} characters")));
                }
            }
            Ok(())
        }
        Some("boolean") => v.as_bool().map(drop).ok_or_else(|| bad(name, "must be true or false")),
        Some("integer") => v.as_u64().map(drop).ok_or_else(|| bad(name, "must be a whole number")),
        Some("array") => {
            let items = v.as_array().ok_or_else(|| bad(name, "must be an array"))?;
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64) {
                if items.len() as u64 > max {
                    return Err(bad(name, &format!("has more than {max} items")));
                }
            }
            let item_schema = schema.get("items").cloned().unwrap_or(Value::Null);
            for (i, item) in items.iter().enumerate() {
                check_at(&format!("{name}[{i}]"), &item_schema, item)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.into() } else { format!("{path}.{key}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_lists_tools_with_schemas() {
        let m: Value = serde_json::from_str(&describe()).unwrap();
        assert_eq!(m["plugin"], "opencode-boxd");
        assert_eq!(m["wit"], "boxd:plugin@0.1.0");
        let tools = m["tools"].as_array().unwrap();
        assert_eq!(tools.len(), TOOLS.len());
        for t in tools {
            assert_eq!(t["inputSchema"]["type"], "object", "{}", t["name"]);
            assert!(["read", "change"].contains(&t["access"].as_str().unwrap()));
        }
    }

    #[test]
    fn argument_errors_name_the_field() {
        let schema = (find("boxd_image").unwrap().schema)();
        let e = check(&schema, &json!({"work": "w1"})).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (Code::ArgsInvalid, "argument 'name' is required"));
        let e = check(&schema, &json!({"work": 7, "name": "x"})).unwrap_err();
        assert_eq!(e.message, "argument 'work' must be a string");
        let e = check(&schema, &json!({"work": "w", "name": "x", "force": true})).unwrap_err();
        assert_eq!(e.message, "argument 'force' is not an argument of this tool");
        assert!(check(&schema, &json!({"work": "w", "name": "x"})).is_ok());
    }
}
