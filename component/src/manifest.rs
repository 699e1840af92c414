//! The manifest every host reads through `describe()`: the plugin, the WIT version, and
//! each tool's row of the registry (`tools::registry`) with its JSON Schema, so hosts read
//! tool metadata here instead of naming tools themselves.

use alloc::string::String;
use serde_json::{json, Value};

use crate::tools::registry::TOOLS;

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

pub fn describe() -> String {
    let tools: alloc::vec::Vec<Value> = TOOLS
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "description": t.description,
                "access": t.access.as_str(),
                "destructive": t.destructive,
                "longRunning": t.long_running,
                "progress": t.progress,
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
            let mut keys: alloc::vec::Vec<&str> = t.as_object().unwrap().keys().map(String::as_str).collect();
            keys.sort_unstable();
            assert_eq!(keys, ["access", "description", "destructive", "inputSchema", "longRunning", "name", "progress"]);
        }
    }

    /// What hosts used to hard-code, now read from here: which tools run long (with the
    /// title shown meanwhile) and which one destroys.
    #[test]
    fn the_manifest_carries_each_tools_host_metadata() {
        let m: Value = serde_json::from_str(&describe()).unwrap();
        let tools = m["tools"].as_array().unwrap();
        let names = |key: &str| -> alloc::vec::Vec<&str> {
            tools.iter().filter(|t| t[key] == true).map(|t| t["name"].as_str().unwrap()).collect()
        };
        assert_eq!(names("longRunning"), ["boxd_ensure", "boxd_submit", "boxd_harvest", "boxd_resume", "boxd_fork"]);
        assert_eq!(names("destructive"), ["boxd_drop"]);
        let progress: alloc::vec::Vec<(&str, &Value)> = tools.iter().map(|t| (t["name"].as_str().unwrap(), &t["progress"])).collect();
        for (name, title) in progress {
            let want = match name {
                "boxd_ensure" => json!("ensuring machine oc-{work}…"),
                "boxd_submit" => json!("submitting to oc-{work}…"),
                "boxd_harvest" => json!("harvesting work {work}…"),
                "boxd_resume" => json!("waking oc-{work}…"),
                "boxd_fork" => json!("forking work {work}…"),
                _ => Value::Null,
            };
            assert_eq!(title, &want, "{name}");
        }
    }
}
