//! The tool registry: one table of every tool the component offers, read by `describe`
//! (the manifest hosts show and read their tool metadata from) and by `call` (which runs
//! the spec's `run`). A tool exists by having a row here and nowhere else.

use serde_json::{json, Value};

use super::{drop, fork, harvest, image, job, lifecycle, preflight, status, submit, Env};
use crate::errors::ToolResult;

/// What a tool does to a machine, which decides whether the `access` option lets it run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolAccess {
    Read,
    Change,
}

impl ToolAccess {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolAccess::Read => "read",
            ToolAccess::Change => "change",
        }
    }
}

/// A tool's run: its checked arguments in, its JSON answer out.
pub type Run = fn(&mut Env, &Value) -> ToolResult<Value>;

/// A tool's own checks before anyone is asked: the refusal its `run` would give, or ok.
pub type Check = fn(&mut Env, &Value) -> ToolResult<()>;

pub struct ToolSpec {
    pub name: &'static str,
    pub access: ToolAccess,
    /// Destroys what the laptop cannot get back from boxd (hosts ask harder before it).
    pub destructive: bool,
    /// Can take minutes (creating a machine, uploads, imports): hosts report progress.
    pub long_running: bool,
    /// The title a host shows while it runs; `{work}` (the work argument) is its only
    /// placeholder.
    pub progress: Option<&'static str>,
    /// Answers on an OpenCode outside the tested range (HOST_UNTESTED stops every other
    /// tool): how the user finds out what is wrong.
    pub on_untested_host: bool,
    pub run: Run,
    /// The tool's refusals before its first change, through reads only (see `preflight`);
    /// None when only the common checks apply.
    pub check: Option<Check>,
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
        access: ToolAccess::Read,
        destructive: false,
        long_running: false,
        progress: None,
        on_untested_host: true,
        run: status::run,
        check: None,
        description: "Show the boxd CLI sign-in, the golden snapshot, every open work with its machine state and warnings, the tools, and one next step. Starts nothing.",
        schema: || object(json!({}), &[]),
    },
    ToolSpec {
        name: "boxd_job",
        access: ToolAccess::Read,
        destructive: false,
        long_running: false,
        progress: None,
        on_untested_host: false,
        run: job::run,
        check: None,
        description: "How a work's run is going: busy, idle, asleep, standby (paused by boxd; not woken to look), gone or starting; when idle the last outcome (completed, failed, aborted), the newest assistant text (redacted, at most 300 characters), the last activity time and the prompts waiting. Never wakes a machine.",
        schema: only_work,
    },
    ToolSpec {
        name: "boxd_ensure",
        access: ToolAccess::Change,
        destructive: false,
        long_running: true,
        progress: Some("ensuring machine oc-{work}…"),
        on_untested_host: false,
        run: lifecycle::ensure,
        check: Some(preflight::ensure),
        description: "Create (or adopt) the private boxd machine oc-<work> for a work, from the golden snapshot, and record it in the ledger. Cheap and idempotent on a healthy work.",
        schema: || object(json!({
            "work": work(),
            "directory": { "type": "string", "description": "The laptop folder the work belongs to; defaults to the project." }
        }), &["work"]),
    },
    ToolSpec {
        name: "boxd_submit",
        access: ToolAccess::Change,
        destructive: false,
        long_running: true,
        progress: Some("submitting to oc-{work}…"),
        on_untested_host: false,
        run: submit::run,
        check: Some(submit::check),
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
        access: ToolAccess::Change,
        destructive: false,
        long_running: true,
        progress: Some("harvesting work {work}…"),
        on_untested_host: false,
        run: harvest::run,
        check: Some(preflight::open_work),
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
        access: ToolAccess::Change,
        destructive: false,
        long_running: false,
        progress: None,
        on_untested_host: false,
        run: lifecycle::sleep,
        check: Some(preflight::open_work),
        description: "Hibernate a work's machine. Destroys nothing and keeps the disk; always allowed. Records a warning when the newest prompt is not yet harvested.",
        schema: only_work,
    },
    ToolSpec {
        name: "boxd_resume",
        access: ToolAccess::Change,
        destructive: false,
        long_running: true,
        progress: Some("waking oc-{work}…"),
        on_untested_host: false,
        run: lifecycle::resume,
        check: Some(preflight::known_work),
        description: "Wake a hibernated work's machine (resetting its idle bound), or rebuild a gone one from the golden snapshot.",
        schema: only_work,
    },
    ToolSpec {
        name: "boxd_image",
        access: ToolAccess::Change,
        destructive: false,
        long_running: false,
        progress: None,
        on_untested_host: false,
        run: image::run,
        check: Some(image::check),
        description: "Save a work's machine as a new named snapshot. Refuses until a harvest has proven the transcript since the last prompt.",
        schema: || object(json!({
            "work": work(),
            "name": { "type": "string", "description": "The new snapshot name: lowercase [a-z0-9-]. Snapshots are immutable.", "maxLength": 63 }
        }), &["work", "name"]),
    },
    ToolSpec {
        name: "boxd_fork",
        access: ToolAccess::Change,
        destructive: false,
        long_running: true,
        progress: Some("forking work {work}…"),
        on_untested_host: false,
        run: fork::run,
        check: Some(fork::check),
        description: "Fork a work whose transcript is proven into new works (one machine each, a copy of its work tree) to try several approaches: each fork is its own work, recorded with its parent, and takes its own prompts (boxd_submit) and harvest. Forks past a running-machine cap wait queued; calling again for the same work admits them in order once a slot frees.",
        schema: || object(json!({
            "work": work(),
            "forks": {
                "type": "array",
                "maxItems": fork::MAX_FORKS,
                "description": "New work ids, one per fork (e.g. [\"try-a\", \"try-b\"]). Leave out to admit forks already queued.",
                "items": work()
            }
        }), &["work"]),
    },
    ToolSpec {
        name: "boxd_drop",
        access: ToolAccess::Change,
        destructive: true,
        long_running: false,
        progress: None,
        on_untested_host: false,
        run: drop::run,
        check: Some(drop::check),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_titles_use_only_the_work_placeholder() {
        for t in TOOLS {
            let Some(title) = t.progress else { continue };
            let rest = title.replace("{work}", "");
            assert!(!rest.contains('{') && !rest.contains('}'), "{}: {title}", t.name);
            assert!(t.long_running, "{} shows progress but is not long-running", t.name);
        }
    }

    #[test]
    fn names_are_unique() {
        let names: alloc::collections::BTreeSet<&str> = TOOLS.iter().map(|t| t.name).collect();
        assert_eq!(names.len(), TOOLS.len());
    }
}
